//! `cso`: the cluster stack operator and its tools.

mod cli;
mod commands;

use clap::Parser;

/// The kube client logs every failed request at ERROR before returning the error to its caller, which
/// reports it; readiness polling would flood the log.
const DEFAULT_LOG_FILTER: &str = "info,kube_client::client::builder=off";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| DEFAULT_LOG_FILTER.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    commands::run(cli.command).await
}
