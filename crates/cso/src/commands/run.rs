//! `cso run`: the operator process. Builds the release source, cache, renderer and client from the flags,
//! serves metrics, probes, the admission webhooks and the lifecycle-hook server on every replica, runs the
//! controllers on the elected leader, and stops gracefully on SIGTERM or SIGINT (reconciles in flight
//! finish first, then the lease is released).

use std::{path::PathBuf, sync::Arc};

use anyhow::Context;
use cso_controller::{Operator, Settings};
use cso_release::{
    ChartMirrors, DependencyResolver, ReleaseCache,
    archive::UnpackLimits,
    source::{self, SourceKind, SourceSettings, UnavailableSource},
};
use cso_render::{
    CachingRenderer, ChartRenderer, Engine, Helm, ValuesTemplater, cache::DEFAULT_CAPACITY_BYTES,
};
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::watch,
};

use crate::{
    cli::RunArgs,
    leader::{self, LeaseSettings},
    renderer_binary::{self, RendererProgram},
};

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    tracing::info!(version = env!("CARGO_PKG_VERSION"), "starting manager");
    let limits = cso_apply::ClientLimits {
        qps: args.qps,
        burst: args.burst,
    };
    let metrics = Arc::new(cso_controller::Metrics::default());
    let client = super::observed_kube_client(
        args.kubeconfig.as_deref(),
        limits,
        Some(metrics.kube_request_observer()),
    )
    .await?;
    // Before anything serves or leads: without a renderer that answers, every release would fail later, after
    // the process said ready.
    let renderer_binary = checked_renderer_binary(&args).await?;
    // An API-server outage is said in the log (readiness does not follow it: see `endpoints`).
    tokio::spawn(crate::endpoints::watch_api_server(
        client.clone(),
        crate::endpoints::API_PROBE_INTERVAL,
    ));

    // Decided once, here: the controllers and the admission webhooks read Clusters in the same version.
    let cluster_resource = cso_apply::cluster_resource(&client).await;

    // A shard's replicas, and the default shard, know a shard runs only by its Lease.
    anyhow::ensure!(
        args.shard == cso_api::shard::Shard::Default || args.leader_elect,
        "--shard={} needs leader election (--leader-elect=true): each shard elects its leader with its own Lease",
        args.shard
    );
    let kind: SourceKind = args.source.parse()?;
    let verify_keys = args
        .verify_key
        .iter()
        .map(|path| cso_release::source::verify::TrustedKey::from_file(path))
        .collect::<Result<Vec<_>, _>>()?;
    for key in &verify_keys {
        tracing::info!(
            key = key.id(),
            "releases must be signed by this key, among others given"
        );
    }
    if !verify_keys.is_empty() && args.local {
        tracing::warn!(
            "--verify-key with --local: the local release directory is the operator's input and is not verified"
        );
    } else if !verify_keys.is_empty() && kind == SourceKind::Github {
        tracing::warn!("--verify-key with GitHub releases: they carry no signature, so every one is refused");
    }
    let settings = SourceSettings {
        kind,
        local: args.local,
        release_dir: args.release_dir.clone(),
        github_api_url: args.github_api_url.clone(),
        verify_keys,
    };
    let release_source = source::from_settings(&settings).unwrap_or_else(|error| {
        // Reported on the objects (AssetsClientAPIAvailable) as the Go operator does; cached releases keep
        // working. A corrected configuration takes effect at the next start.
        tracing::error!(%error, "the release source is not usable; releases that are not cached cannot be fetched");
        Arc::new(UnavailableSource::new(kind, &error))
    });
    let release_source = Arc::new(cso_controller::MeteredSource::new(
        release_source,
        metrics.clone(),
    ));
    // A wrong mirror is a configuration error: refused at start rather than reported on every release.
    let mirrors = ChartMirrors::parse(&args.chart_mirror).map_err(anyhow::Error::msg)?;
    let dependencies = DependencyResolver::new(mirrors);
    if let Some(secret) = &args.chart_mirror_credentials {
        // Read before the controllers start, then followed (see `chart_credentials`).
        crate::chart_credentials::follow(client.clone(), secret, dependencies.clone()).await?;
    }
    let mut cache = ReleaseCache::new(&args.release_dir, release_source, UnpackLimits::default())
        .with_context(|| {
            format!(
                "failed to open the release cache in {}",
                args.release_dir.display()
            )
        })?
        .with_dependencies(dependencies);
    if let Some(dir) = &args.local_cache_dir {
        cache = cache.with_local_cache(dir);
    }
    let releases = Arc::new(cache);
    let (renderer, values): (Arc<dyn ChartRenderer>, Arc<ValuesTemplater>) = match args.renderer.as_str() {
        "helm" => {
            let helm = || Helm::new(&renderer_binary, args.helm_timeout).context("failed to prepare helm");
            (
                Arc::new(CachingRenderer::new(helm()?, DEFAULT_CAPACITY_BYTES)),
                Arc::new(ValuesTemplater::new(helm()?).context("failed to prepare the values templater")?),
            )
        }
        _ => {
            // One process renders charts and values templates alike.
            let engine = Engine::new(&renderer_binary, args.helm_timeout);
            metrics.watch_renderer(engine.clone());
            (
                Arc::new(CachingRenderer::new(engine.clone(), DEFAULT_CAPACITY_BYTES)),
                Arc::new(ValuesTemplater::with_engine(engine)),
            )
        }
    };

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

    let lease_namespace = match non_empty(&args.leader_elect_namespace) {
        Some(namespace) => namespace,
        None => client.default_namespace().to_owned(),
    };
    let operator = Operator {
        client,
        releases,
        renderer,
        values,
        metrics: metrics.clone(),
        cluster_resource: cluster_resource.clone(),
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
            client_limits: limits,
            reconcile_timeout: args.reconcile_timeout,
            stage_timeout: args.stage_timeout,
            addon_health_checks: args.addon_health_checks,
            drift_watches: args.drift_watches,
            addon_settle_time: args.addon_settle_time,
            shard: args.shard.clone(),
            shard_grace: args.shard_grace,
            lease_namespace: args.leader_elect.then(|| lease_namespace.clone()),
            ..Settings::default()
        },
    };
    let stop = stop_signal()?;
    // Every replica serves the webhooks and the hook server; each waits for its certificate without holding
    // up anything else.
    let webhooks = spawn_tls_server(
        "admission webhooks",
        cso_webhook::admission_router(operator.client.clone(), cluster_resource),
        args.webhook_port,
        args.webhook_cert_dir.clone(),
    );
    let hooks = spawn_tls_server(
        "hook server",
        cso_webhook::hook_router(operator.client.clone(), {
            let metrics = metrics.clone();
            Arc::new(move |hook, outcome: &cso_webhook::hooks::Outcome, took| {
                metrics.hook_answered(hook.as_str(), outcome.result_label(), took)
            })
        }),
        args.hook_port,
        args.hook_cert_dir.clone(),
    );

    let leadership = if args.leader_elect {
        let settings = LeaseSettings {
            name: args.shard.lease_name(),
            namespace: lease_namespace,
            duration: args.leader_elect_lease_duration,
            identity: LeaseSettings::identity(),
        };
        match leader::acquire(
            operator.client.clone(),
            &settings,
            metrics.clone(),
            stopped(stop.clone()),
        )
        .await?
        {
            Some(leadership) => Some(leadership),
            None => {
                stop_tls_servers([webhooks, hooks]).await;
                return Ok(());
            }
        }
    } else {
        None
    };

    tracing::info!("starting controllers");
    let controllers = cso_controller::run(operator, stopped(stop));
    if let Some(mut leadership) = leadership {
        tokio::select! {
            () = controllers => leadership.release().await,
            reason = leadership.lost() => {
                // Fail-stop: the controllers are dropped mid-flight and the process ends, before another
                // replica can hold the lease.
                tracing::error!(%reason, "leader election lost");
                anyhow::bail!("leader election lost: {reason}");
            }
        }
    } else {
        controllers.await;
    }
    stop_tls_servers([webhooks, hooks]).await;
    Ok(())
}

/// The program of `--renderer`, found as `renderer_binary` says and checked to run; the error says where it was
/// looked for and how to point at it.
async fn checked_renderer_binary(args: &RunArgs) -> anyhow::Result<PathBuf> {
    let (program, explicit) = match args.renderer.as_str() {
        "helm" => (RendererProgram::Helm, args.helm.as_deref()),
        _ => (RendererProgram::Engine, args.renderer_binary.as_deref()),
    };
    let found = renderer_binary::locate_here(program, explicit)?;
    match program {
        RendererProgram::Engine => {
            renderer_binary::check_engine_answers(&found.path, renderer_binary::START_CHECK_TIMEOUT).await?
        }
        RendererProgram::Helm => {
            renderer_binary::check_helm_runs(&found.path, renderer_binary::START_CHECK_TIMEOUT).await?
        }
    }
    tracing::info!(
        program = program.file_name(),
        path = %found.path.display(),
        found = %found.origin,
        "renderer checked: it answers"
    );
    Ok(found.path)
}

/// Becomes `true` on SIGTERM or SIGINT.
fn stop_signal() -> anyhow::Result<watch::Receiver<bool>> {
    let mut terminate = signal(SignalKind::terminate())?;
    let (sender, receiver) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        }
        let _ = sender.send(true);
    });
    Ok(receiver)
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

type TlsTask = tokio::task::JoinHandle<Option<cso_webhook::TlsServer>>;

fn spawn_tls_server(what: &'static str, router: axum::Router, port: u16, cert_dir: PathBuf) -> TlsTask {
    let addr = std::net::SocketAddr::from(([0, 0, 0, 0], port));
    tokio::spawn(async move {
        match cso_webhook::TlsServer::start(router, addr, &cert_dir).await {
            Ok(server) => Some(server),
            Err(e) => {
                tracing::error!(error = %e, "the {what} cannot start");
                None
            }
        }
    })
}

async fn stop_tls_servers(servers: [TlsTask; 2]) {
    for task in servers {
        if !task.is_finished() {
            // Still waiting for its certificate: nothing to drain.
            task.abort();
        } else if let Ok(Some(server)) = task.await {
            server.shutdown(std::time::Duration::from_secs(5)).await;
        }
    }
}

fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}
