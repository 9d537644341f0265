//! Benchmark: render + apply the `docker-scs-1-30-v1` addons (Cilium, metrics-server) into a fresh API
//! server, then the no-op re-apply (identical inputs, cached render). Reports wall time, the operator
//! side's CPU time and peak RSS (this process; etcd and kube-apiserver excluded), and objects per second.
//!
//! `cargo bench -p cso-apply --bench apply_addons` (results in docs/benchmarks.md).
#![allow(clippy::unwrap_used, reason = "a benchmark: a failed unwrap is a failed run")]

use std::{
    collections::BTreeMap,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use cso_apply::{ApplyEngine, ClusterDiscovery, DEFAULT_FIELD_MANAGER};
use cso_render::{CachingRenderer, ChartRenderer, Helm, RenderRequest, parse_manifests};

const REAPPLY_RUNS: usize = 10;

async fn render(
    renderer: &impl ChartRenderer,
    addons: &Path,
    kubeconfig: &Path,
) -> Vec<cso_render::Manifest> {
    let mut manifests = Vec::new();
    for stage in ["cni", "metrics-server"] {
        let rendered = renderer
            .render(RenderRequest {
                chart: addons.join(stage),
                release_name: "cluster-addon".into(),
                namespace: "kube-system".into(),
                kube_version: Some("v1.30.10".into()),
                include_crds: true,
                target_kubeconfig: Some(kubeconfig.to_path_buf()),
                ..Default::default()
            })
            .await
            .unwrap();
        manifests.extend(parse_manifests(&rendered).unwrap());
    }
    manifests
}

#[tokio::main]
async fn main() {
    let tools = cso_testenv::Tools::discover().unwrap();
    let plane = cso_testenv::ControlPlane::start(&tools, "bench-workload", None)
        .await
        .unwrap();
    let addons = tempfile::tempdir().unwrap();
    let archive = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/releases/docker-scs-1-30-v1/docker-scs-1-30-cluster-addon-v1.tgz");
    let addons = addons.path().join("addons");
    cso_release::archive::unpack(&archive, &addons, Default::default()).unwrap();
    let renderer = CachingRenderer::new(
        Helm::new(tools.helm.clone().unwrap(), Duration::from_secs(60)).unwrap(),
        64 << 20,
    );
    let engine = ApplyEngine::new(
        Arc::new(ClusterDiscovery::new(plane.client().await.unwrap())),
        DEFAULT_FIELD_MANAGER,
    );
    let labels = BTreeMap::from([(
        cso_api::names::RELEASE_LABEL.to_owned(),
        "docker-scs-1-30-v1".to_owned(),
    )]);

    let cpu0 = cso_testenv::usage::Usage::of(None).unwrap().cpu;
    let started = Instant::now();
    let manifests = render(&renderer, &addons, plane.kubeconfig_path()).await;
    let rendered = started.elapsed();
    let report = engine.apply(&manifests, "kube-system", &labels, &[]).await;
    let total = started.elapsed();
    assert!(report.is_complete(), "{}", report.failure_summary());
    let cpu1 = cso_testenv::usage::Usage::of(None).unwrap().cpu;

    let mut reapply = Vec::new();
    for _ in 0..REAPPLY_RUNS {
        let started = Instant::now();
        let manifests = render(&renderer, &addons, plane.kubeconfig_path()).await;
        let again = engine
            .apply(&manifests, "kube-system", &labels, &report.resources)
            .await;
        assert!(again.is_complete() && again.pruned.is_empty());
        reapply.push(started.elapsed());
    }
    reapply.sort();
    let cso_testenv::usage::Usage {
        cpu: cpu2,
        peak_rss_kib: peak,
        ..
    } = cso_testenv::usage::Usage::of(None).unwrap();
    let objects = report.resources.len();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "render + apply docker-scs-1-30-v1 addons ({objects} objects) into a fresh kube-apiserver v1.35"
    );
    println!(
        "first install: render {:.0} ms (helm, 2 charts), apply {:.0} ms, total {:.0} ms, {:.0} objects/s applied, operator CPU {:.0} ms",
        ms(rendered),
        ms(total - rendered),
        ms(total),
        objects as f64 / (total - rendered).as_secs_f64(),
        ms(cpu1 - cpu0)
    );
    println!(
        "no-op re-apply (cached render), {REAPPLY_RUNS} runs: median {:.0} ms, max {:.0} ms, {:.0} objects/s, operator CPU {:.1} ms per run",
        ms(reapply[REAPPLY_RUNS / 2]),
        ms(reapply[REAPPLY_RUNS - 1]),
        objects as f64 / reapply[REAPPLY_RUNS / 2].as_secs_f64(),
        ms(cpu2 - cpu1) / REAPPLY_RUNS as f64
    );
    println!(
        "operator peak RSS: {:.1} MiB; helm renders: {:?} (hits, misses)",
        peak as f64 / 1024.0,
        renderer.stats()
    );
}
