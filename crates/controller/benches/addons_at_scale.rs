//! Benchmark: N Clusters (N = 10, 100) of the same stack (ferrol v1, one addon chart), spread over three
//! workload API servers. Measures the time from creating the Clusters until every ClusterAddon is ready, the
//! helm runs (addon renders and values templates), and this process's CPU and peak memory: the operator runs
//! in-process here so its render count can be read; the API servers are separate processes.
//!
//! It also counts the operator's requests to the management API server, by verb and resource.
//!
//! `cargo bench -p cso-controller --bench addons_at_scale` (results in docs/benchmarks.md); `CSO_BENCH_N=50`
//! picks the sizes (default `10,100`).
#![allow(clippy::unwrap_used, reason = "a benchmark: a failed unwrap is a failed run")]

use std::{
    collections::BTreeMap,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use cso_api::{ClusterAddon, ClusterStack};
use cso_apply::{RequestKind, RequestTally};
use cso_controller::{Operator, Settings};
use cso_release::{ReleaseCache, archive::UnpackLimits, source::local::LocalSource};
use cso_render::{
    CachingRenderer, ChartRenderer, Engine, Helm, ValuesTemplater, cache::DEFAULT_CAPACITY_BYTES,
};
use cso_testenv::usage::Usage;
use kube::{
    Api, Client,
    api::{DynamicObject, PostParams},
    core::GroupVersionKind,
    discovery::ApiResource,
};
use serde_json::json;

const WORKLOADS: usize = 3;
const CONCURRENCY: u16 = 10;

async fn create(client: &Client, namespace: &str, object: serde_json::Value, resource: &ApiResource) {
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    Api::<DynamicObject>::namespaced_with(client.clone(), namespace, resource)
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
}

/// The requests counted by `tally` since `before`, by kind, and their total.
fn requests_since(
    tally: &RequestTally,
    before: &BTreeMap<RequestKind, u64>,
) -> (u64, Vec<(RequestKind, u64)>) {
    let mut made: Vec<(RequestKind, u64)> = tally
        .counts()
        .into_iter()
        .map(|(kind, count)| {
            let earlier = before.get(&kind).copied().unwrap_or_default();
            (kind, count - earlier)
        })
        .filter(|(_, count)| *count > 0)
        .collect();
    made.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    (made.iter().map(|(_, c)| c).sum(), made)
}

/// The chart renderer, the values templater and how to read the render cache's (hits, misses).
type Renderers = (
    Arc<dyn ChartRenderer>,
    ValuesTemplater,
    Box<dyn Fn() -> (u64, u64)>,
);

async fn run(
    n: usize,
    client: &Client,
    operator_client: &Client,
    tally: &RequestTally,
    workloads: &[String],
    helm: &Path,
    engine: Option<&Path>,
) {
    let ns = cso_testenv::namespace(client, &format!("scale-{n}"))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let to = dir.path().join("cluster-stacks/docker-ferrol-1-27-v1");
    std::fs::create_dir_all(&to).unwrap();
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases/docker-ferrol-1-27-v1");
    for entry in std::fs::read_dir(fixture).unwrap().flatten() {
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    // The engine (what `cso run` renders with by default), or helm processes with
    // `CSO_BENCH_RENDER_WITH=helm`.
    let (renderer, values, stats): Renderers =
        match (std::env::var("CSO_BENCH_RENDER_WITH").as_deref(), engine) {
            (Ok("helm"), _) | (_, None) => {
                let caching = Arc::new(CachingRenderer::new(
                    Helm::new(helm, Duration::from_secs(60)).unwrap(),
                    DEFAULT_CAPACITY_BYTES,
                ));
                let counted = caching.clone();
                (
                    caching,
                    ValuesTemplater::new(Helm::new(helm, Duration::from_secs(60)).unwrap()).unwrap(),
                    Box::new(move || counted.stats()),
                )
            }
            (_, Some(binary)) => {
                let engine = Engine::new(binary, Duration::from_secs(60));
                let caching = Arc::new(CachingRenderer::new(engine.clone(), DEFAULT_CAPACITY_BYTES));
                let counted = caching.clone();
                (
                    caching,
                    ValuesTemplater::with_engine(engine),
                    Box::new(move || counted.stats()),
                )
            }
        };
    let operator = Operator {
        client: operator_client.clone(),
        releases: Arc::new(
            ReleaseCache::new(
                dir.path(),
                Arc::new(LocalSource::new(dir.path().join("cluster-stacks"))),
                UnpackLimits::default(),
            )
            .unwrap(),
        ),
        renderer,
        values: Arc::new(values),
        metrics: Default::default(),
        take_over_from: Vec::new(),
        settings: Settings {
            namespace: Some(ns.clone()),
            cluster_addon_concurrency: CONCURRENCY,
            // The workload clusters are bare API servers: nothing they hold ever runs.
            addon_health_checks: false,
            ..Settings::default()
        },
        cluster_resource: cso_controller::cluster_resource(client).await,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(cso_controller::run(operator, async move {
        let _ = stopped.await;
    }));
    let stack: ClusterStack = serde_json::from_value(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
        "metadata": {"name": "ferrol", "namespace": ns},
        "spec": {"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27", "channel": "stable",
                 "autoSubscribe": false, "noProvider": true, "versions": ["v1"]},
    }))
    .unwrap();
    Api::<ClusterStack>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &stack)
        .await
        .unwrap();
    let secret = ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "Secret"));
    let cluster = ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta1", "Cluster"));
    let cpu_before = Usage::of(None).unwrap().cpu;
    let requests_before = tally.counts();
    let started = Instant::now();
    for i in 0..n {
        let name = format!("c{i}");
        create(
            client,
            &ns,
            json!({"apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
                   "metadata": {"name": format!("{name}-kubeconfig"),
                                "labels": {"cluster.x-k8s.io/cluster-name": name}},
                   "stringData": {"value": workloads[i % workloads.len()]}}),
            &secret,
        )
        .await;
        create(
            client,
            &ns,
            json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster", "metadata": {"name": name},
                   "spec": {"topology": {"class": "docker-ferrol-1-27-v1", "version": "v1.27.3"},
                            "controlPlaneEndpoint": {"host": format!("{name}.example.test"), "port": 6443}}}),
            &cluster,
        )
        .await;
    }
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    loop {
        let ready = addons
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|a| a.status.as_ref().is_some_and(|s| s.ready))
            .count();
        if ready == n {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "{ready}/{n} ready after 30 min"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = started.elapsed();
    let Usage {
        cpu: cpu_after,
        peak_rss_kib: peak,
        ..
    } = Usage::of(None).unwrap();
    let (hits, misses) = stats();
    let (requests, by_kind) = requests_since(tally, &requests_before);
    println!(
        "N = {n:>3}: all ClusterAddons ready in {:>6.1} s; addon chart: {misses} renders ({hits} cache hits), values: {n} templatings; operator CPU {:>5.1} s; peak RSS so far {:.1} MiB",
        took.as_secs_f64(),
        (cpu_after - cpu_before).as_secs_f64(),
        peak as f64 / 1024.0
    );
    println!(
        "        management requests: {requests} ({:.1} per Cluster): {}",
        requests as f64 / n as f64,
        by_kind
            .iter()
            .map(|(kind, count)| format!("{} {} {count}", kind.verb, kind.resource))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = stop.send(());
    let _ = task.await;
}

#[tokio::main]
async fn main() {
    // `RUST_LOG=cso_controller=debug` shows what the operator does.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .init();
    }
    let tools = cso_testenv::Tools::discover().unwrap();
    let helm = tools.helm.clone().unwrap();
    let management = cso_testenv::start_management(&tools, None).await.unwrap();
    let client = management.client().await.unwrap();
    // The operator's own client counts its requests.
    let tally = Arc::new(RequestTally::default());
    let config = cso_testenv::config_from_yaml(management.kubeconfig_yaml())
        .await
        .unwrap();
    let operator_client =
        cso_apply::observed_client(config, cso_apply::ClientLimits::UNLIMITED, Some(tally.observer()))
            .unwrap();
    let mut planes = Vec::new();
    for i in 0..WORKLOADS {
        planes.push(
            cso_testenv::ControlPlane::start(&tools, &format!("workload-{i}"), None)
                .await
                .unwrap(),
        );
    }
    let kubeconfigs: Vec<String> = planes.iter().map(|p| p.kubeconfig_yaml().to_owned()).collect();
    println!(
        "addons at scale: ferrol v1 addons, {WORKLOADS} workload API servers, --clusteraddon-concurrency={CONCURRENCY}"
    );
    // `CSO_BENCH_N=10,50` picks the sizes.
    let sizes: Vec<usize> = std::env::var("CSO_BENCH_N")
        .unwrap_or_else(|_| "10,100".to_owned())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    for n in sizes {
        run(
            n,
            &client,
            &operator_client,
            &tally,
            &kubeconfigs,
            &helm,
            tools.renderer.as_deref(),
        )
        .await;
    }
}
