//! Benchmark: N Clusters (N = 10, 100) of the same stack (ferrol v1, one addon chart), spread over three
//! workload API servers. Measures the time from creating the Clusters until every ClusterAddon is ready, the
//! helm runs (addon renders and values templates), and this process's CPU and peak memory: the operator runs
//! in-process here so its render count can be read; the API servers are separate processes.
//!
//! `cargo bench -p cso-controller --bench addons_at_scale` (results in docs/benchmarks.md).
#![allow(clippy::unwrap_used, reason = "a benchmark: a failed unwrap is a failed run")]

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use cso_api::{ClusterAddon, ClusterStack};
use cso_controller::{Operator, Settings};
use cso_release::{ReleaseCache, archive::UnpackLimits, source::local::LocalSource};
use cso_render::{CachingRenderer, Helm, ValuesTemplater, cache::DEFAULT_CAPACITY_BYTES};
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

async fn run(n: usize, client: &Client, workloads: &[String], helm: &Path) {
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
    let renderer = Arc::new(CachingRenderer::new(
        Helm::new(helm, Duration::from_secs(60)).unwrap(),
        DEFAULT_CAPACITY_BYTES,
    ));
    let operator = Operator {
        client: client.clone(),
        releases: Arc::new(
            ReleaseCache::new(
                dir.path(),
                Arc::new(LocalSource::new(dir.path().join("cluster-stacks"))),
                UnpackLimits::default(),
            )
            .unwrap(),
        ),
        renderer: renderer.clone(),
        values: Arc::new(ValuesTemplater::new(Helm::new(helm, Duration::from_secs(60)).unwrap()).unwrap()),
        metrics: Default::default(),
        take_over_from: Vec::new(),
        settings: Settings {
            namespace: Some(ns.clone()),
            cluster_addon_concurrency: CONCURRENCY,
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
    let started = Instant::now();
    for i in 0..n {
        let name = format!("c{i}");
        create(
            client,
            &ns,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{name}-kubeconfig")},
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
    let (hits, misses) = renderer.stats();
    println!(
        "N = {n:>3}: all ClusterAddons ready in {:>6.1} s; addon chart: {misses} helm runs ({hits} cache hits), values: {n} helm runs; operator CPU {:>5.1} s; peak RSS so far {:.1} MiB",
        took.as_secs_f64(),
        (cpu_after - cpu_before).as_secs_f64(),
        peak as f64 / 1024.0
    );
    let _ = stop.send(());
    let _ = task.await;
}

#[tokio::main]
async fn main() {
    let tools = cso_testenv::Tools::discover().unwrap();
    let helm = tools.helm.clone().unwrap();
    let management = cso_testenv::start_management(&tools, None).await.unwrap();
    let client = management.client().await.unwrap();
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
    for n in [10, 100] {
        run(n, &client, &kubeconfigs, &helm).await;
    }
}
