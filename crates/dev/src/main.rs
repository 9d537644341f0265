//! `cso-dev`: local control planes for development and the quick start (`up`, `status`) and the demo of
//! the operator's main job (`demo`). It links the test environment (etcd + kube-apiserver, Cluster API
//! CRDs), which is why it is a binary of its own: the operator (`cso`) and its image do not carry it.

mod demo;
mod dev;
mod real;
mod restarts;
mod workload;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "cso-dev",
    version,
    about = "Local control planes and the demo for the cluster stack operator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start a management and a workload control plane (etcd + kube-apiserver on loopback) and keep them
    /// running until SIGINT or SIGTERM.
    ///
    /// If etcd, a kube-apiserver or a workload process (kube-controller-manager, kube-scheduler, kwok) stops
    /// on its own (killed, crashed), both control planes are stopped and `up` exits non-zero: such a process
    /// is not restarted (the test environment starts a control plane only as a whole, and the next `up` starts
    /// afresh, without the old state). For fault tests, cut the connection with a proxy in front of the API
    /// server instead of killing it.
    ///
    /// By default Cluster API v1.14 (built by `make tools`) runs on the management control plane: its managers,
    /// a stand-in for the machine providers (every Cluster's control plane is reported initialised and at its
    /// version, with the workload control plane as its API server), certificates for the hook server in
    /// `DIR/hook-certs` and an `ExtensionConfig` `cso` for `https://127.0.0.1:<hook-port>`.
    ///
    /// A Cluster API manager that exits is started again, as a Deployment restarts its pod: after 10 s, then
    /// twice as long after each exit up to 5 minutes, back to 10 s after a run of 10 minutes. Each exit is
    /// reported on stderr with its status and the end of the manager's log (`DIR/management/cluster-api/`);
    /// `cso-dev status` shows the restart counts. The core manager exits a minute after each start while
    /// nothing serves the hook port (its ExtensionConfig warm-up gives up): start `cso run` and it is
    /// discovered at its next start at the latest.
    Up {
        /// Where to keep their files; `management.kubeconfig` and `workload.kubeconfig` are written here.
        #[arg(long)]
        dir: PathBuf,
        /// Leave Cluster API out (the management plane gets Cluster API v1.10's `v1beta1` CRDs only).
        #[arg(long)]
        without_cluster_api: bool,
        /// The port of `cso run --hook-port` the ExtensionConfig points at.
        #[arg(long, default_value_t = 9442)]
        hook_port: u16,
        /// The workload cluster's nodes: simulated (kwok), real (two nodes with containerd, kubelet and
        /// kube-proxy; root and `make tools`: the stack's addons really run, with its CNI as their network), or
        /// real where the machine can run them.
        #[arg(long, value_enum, default_value_t = workload::NodeChoice::Simulated)]
        workload_nodes: workload::NodeChoice,
        /// The management cluster the way a site runs it: a real node (needs root), Cluster API beside its API
        /// server, and the operator installed by its chart from the image (`--image`) as pods, found by Cluster
        /// API through the chart's ExtensionConfig; the bundled releases on a GitHub stand-in. See
        /// `kubectl --kubeconfig DIR/management.kubeconfig logs -n cso-system deploy/cso-controller-manager`.
        #[arg(long, conflicts_with_all = ["without_cluster_api", "hook_port"])]
        real_nodes: bool,
        /// With `--real-nodes`: the image archive to install (default: what `make image-test` writes,
        /// target/image/cso-image.tar).
        #[arg(long, requires = "real_nodes")]
        image: Option<PathBuf>,
    },
    /// Start a cluster with real nodes (containerd + runc + kubelet + kube-proxy in network namespaces of their
    /// own, the control plane in the first node's, as kind runs it) and keep it until SIGINT or SIGTERM; then
    /// remove everything it put on the machine (a watchdog does the same if `cso-dev` is killed). Needs root.
    /// Writes `DIR/kubeconfig`; imports the OCI image archives given with `--image` into every node.
    Nodes {
        /// Where to keep the cluster's files (cleaned first).
        #[arg(long)]
        dir: PathBuf,
        /// How many nodes.
        #[arg(long, default_value_t = 1)]
        nodes: usize,
        /// OCI image archives (`hack/oci-archive.py`, `hack/image.sh`) to import into every node.
        #[arg(long = "image")]
        images: Vec<PathBuf>,
    },
    /// Show what the control planes started by `cso-dev up --dir DIR` serve (version and CRDs) and the Cluster
    /// API managers with their restart counts.
    Status {
        #[arg(long)]
        dir: PathBuf,
    },
    /// The operator's main job on an embedded default: local management and workload control planes, the
    /// bundled ferrol stack, a ClusterStack, its ClusterClasses, a Cluster and its addons; prints what was
    /// created and stops.
    Demo {
        /// Where to keep the control planes' files (cleaned first).
        #[arg(long)]
        dir: PathBuf,
        /// Where the example releases are (default: the ones bundled in the repository).
        #[arg(long)]
        releases: Option<PathBuf>,
        /// The workload cluster's nodes: real ones (containerd, kubelet, kube-proxy; root, and the addon
        /// images of `make tools`), whose pods really run the stack's addons; simulated ones (kwok); or real
        /// where the machine can run them.
        #[arg(long, value_enum, default_value_t = workload::NodeChoice::Auto)]
        nodes: workload::NodeChoice,
    },
}

/// The kube client logs every failed request at ERROR before returning the error to its caller, which
/// reports it; waiting for a control plane to answer would flood the log.
const LOG_FILTER: &str = "info,kube_client::client::builder=off";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| LOG_FILTER.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Up {
            dir,
            real_nodes: true,
            image,
            ..
        } => real::up_real_nodes(&dir, &real::image_or_default(image)).await,
        Command::Up {
            dir,
            without_cluster_api,
            hook_port,
            workload_nodes,
            ..
        } => {
            dev::up(
                &dir,
                &dev::UpOptions {
                    without_cluster_api,
                    hook_port,
                    workload_nodes,
                },
            )
            .await
        }
        Command::Status { dir } => dev::status(&dir).await,
        Command::Nodes { dir, nodes, images } => dev::real_nodes(&dir, nodes, &images).await,
        Command::Demo { dir, releases, nodes } => demo::demo(&dir, releases.as_deref(), nodes).await,
    }
}

/// Tells whoever started a long-running command (`up`, `nodes`) that it is ready, on stdout. A reader that
/// reads only that line and closes the pipe must not stop the clusters: `println!` would panic on the closed
/// pipe at the next write, so errors are ignored here, and the whole text goes out in one write.
pub(crate) fn announce(text: &str) {
    use std::io::Write as _;
    let mut line = String::with_capacity(text.len() + 1);
    line.push_str(text);
    line.push('\n');
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(line.as_bytes());
    let _ = stdout.flush();
}
