//! One module per subcommand.

mod crds;
mod render;
mod rollout;
mod run;
mod status;

use crate::cli::Command;

pub async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => run::run(*args).await,
        Command::Crds => crds::print(),
        Command::Render(args) => render::render(args).await,
        Command::Status(args) => status::print(args).await,
        Command::Rollout(crate::cli::RolloutCommand::Status(args)) => rollout::print(args).await,
    }
}

/// The management cluster's client: `kubeconfig` if given, else `KUBECONFIG`, else in-cluster; its requests
/// limited by `limits`.
pub(crate) async fn kube_client(
    kubeconfig: Option<&std::path::Path>,
    limits: cso_apply::ClientLimits,
) -> anyhow::Result<kube::Client> {
    observed_kube_client(kubeconfig, limits, None).await
}

/// [`kube_client`], each request told to `observer` (the operator's request metrics).
pub(crate) async fn observed_kube_client(
    kubeconfig: Option<&std::path::Path>,
    limits: cso_apply::ClientLimits,
    observer: Option<cso_apply::RequestObserver>,
) -> anyhow::Result<kube::Client> {
    use anyhow::Context;
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("failed to read the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig: pass --kubeconfig, set KUBECONFIG or run in a cluster")?,
    };
    cso_apply::observed_client(config, limits, observer).context("failed to build the Kubernetes client")
}
