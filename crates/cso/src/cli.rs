//! The command line: `cso crds`, `cso dev up|status`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "cso",
    version,
    about = "Cluster stack operator: cluster stacks for Cluster API, in Rust"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the CustomResourceDefinitions as YAML.
    Crds,
    /// Local control planes for development and the quick start.
    #[command(subcommand)]
    Dev(DevCommand),
}

#[derive(Debug, Subcommand)]
pub enum DevCommand {
    /// Start a management and a workload control plane (etcd + kube-apiserver on loopback) and keep them
    /// running until SIGINT or SIGTERM.
    Up {
        /// Where to keep their files; `management.kubeconfig` and `workload.kubeconfig` are written here.
        #[arg(long)]
        dir: PathBuf,
    },
    /// Show what the control planes started by `cso dev up --dir DIR` serve: version and CRDs.
    Status {
        #[arg(long)]
        dir: PathBuf,
    },
}
