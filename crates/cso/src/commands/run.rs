//! `cso run`: the operator process. Builds the release source, cache, renderer and client from the flags,
//! runs the controllers and the lifecycle-hook server, and stops gracefully on SIGTERM or SIGINT
//! (reconciles in flight finish first).

use std::sync::Arc;

use anyhow::Context;
use cso_controller::{Operator, Settings};
use cso_release::{
    ReleaseCache,
    archive::UnpackLimits,
    source::{self, SourceKind, SourceSettings, UnavailableSource},
};
use cso_render::{CachingRenderer, Helm, ValuesTemplater, cache::DEFAULT_CAPACITY_BYTES};
use tokio::signal::unix::{SignalKind, signal};

use crate::cli::RunArgs;

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    tracing::info!(version = env!("CARGO_PKG_VERSION"), "starting manager");
    if args.leader_elect {
        tracing::warn!("leader election is not available yet: run a single replica (--leader-elect=false)");
    }
    let client = client(&args).await?;

    let kind: SourceKind = args.source.parse()?;
    let settings = SourceSettings {
        kind,
        local: args.local,
        release_dir: args.release_dir.clone(),
        github_api_url: args.github_api_url.clone(),
    };
    let release_source = source::from_settings(&settings).unwrap_or_else(|error| {
        // Reported on the objects (AssetsClientAPIAvailable) as the Go operator does; cached releases keep
        // working. A corrected configuration takes effect at the next start.
        tracing::error!(%error, "the release source is not usable; releases that are not cached cannot be fetched");
        Arc::new(UnavailableSource::new(kind, &error))
    });
    let releases = Arc::new(
        ReleaseCache::new(&args.release_dir, release_source, UnpackLimits::default()).with_context(|| {
            format!(
                "failed to open the release cache in {}",
                args.release_dir.display()
            )
        })?,
    );
    let helm = Helm::new(&args.helm, args.helm_timeout).context("failed to prepare helm")?;
    let renderer = Arc::new(CachingRenderer::new(helm, DEFAULT_CAPACITY_BYTES));

    let metrics = Arc::new(cso_controller::Metrics::default());
    for (flag, router) in [
        (
            &args.metrics_bind_address,
            crate::endpoints::metrics_router(metrics.clone()),
        ),
        (&args.health_probe_bind_address, crate::endpoints::probes_router()),
    ] {
        if let Some(addr) = crate::endpoints::bind_address(flag).map_err(anyhow::Error::msg)? {
            crate::endpoints::serve(addr, router)
                .await
                .with_context(|| format!("failed to listen on {addr}"))?;
        }
    }

    let operator = Operator {
        client,
        releases,
        renderer,
        values: Arc::new(
            ValuesTemplater::new(Helm::new(&args.helm, args.helm_timeout).context("failed to prepare helm")?)
                .context("failed to prepare the values templater")?,
        ),
        metrics: metrics.clone(),
        take_over_from: args
            .take_over_field_managers
            .iter()
            .filter(|m| !m.is_empty())
            .cloned()
            .collect(),
        settings: Settings {
            namespace: non_empty(&args.namespace),
            watch_filter: non_empty(&args.watch_filter),
            cluster_stack_concurrency: args.clusterstack_concurrency,
            cluster_stack_release_concurrency: args.clusterstackrelease_concurrency,
            cluster_addon_concurrency: args.clusteraddon_concurrency,
            poll_interval: args.poll_interval,
            resync_interval: args.resync_interval,
        },
    };
    let mut terminate = signal(SignalKind::terminate())?;
    let shutdown = async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        }
    };
    // The hook server runs beside the controllers (on every replica, once leader election exists); it waits
    // for its certificate without holding up the controllers.
    let hook_addr = std::net::SocketAddr::from(([0, 0, 0, 0], args.hook_port));
    let hook_router = cso_webhook::hook_router(operator.client.clone());
    let hook_cert_dir = args.hook_cert_dir.clone();
    let hook_server = tokio::spawn(async move {
        match cso_webhook::TlsServer::start(hook_router, hook_addr, &hook_cert_dir).await {
            Ok(server) => Some(server),
            Err(e) => {
                tracing::error!(error = %e, "the hook server cannot start; lifecycle hooks will fail");
                None
            }
        }
    });
    cso_controller::run(operator, shutdown).await;
    if !hook_server.is_finished() {
        // Still waiting for its certificate: nothing to drain.
        hook_server.abort();
    } else if let Ok(Some(server)) = hook_server.await {
        server.shutdown(std::time::Duration::from_secs(5)).await;
    }
    Ok(())
}

fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

async fn client(args: &RunArgs) -> anyhow::Result<kube::Client> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("failed to read the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig: pass --kubeconfig, set KUBECONFIG or run in a cluster")?,
    };
    kube::Client::try_from(config).context("failed to build the Kubernetes client")
}
