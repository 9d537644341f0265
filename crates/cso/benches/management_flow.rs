//! Benchmark: `cso run` (release build, local source) against a fresh kube-apiserver. For each of RUNS
//! fresh namespaces, the time from creating the ferrol ClusterStack (versions v1, v2) to both ClusterClasses
//! existing; then the operator's resident memory while idle, its peak, and the CPU it used.
//!
//! `cargo bench -p cso --bench management_flow` (results in docs/benchmarks.md).
#![allow(clippy::unwrap_used, reason = "a benchmark: a failed unwrap is a failed run")]

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use cso_api::ClusterStack;
use cso_testenv::usage::Usage;
use kube::{
    Api,
    api::{DynamicObject, PostParams},
    core::GroupVersionKind,
    discovery::ApiResource,
};
use serde_json::json;

const RUNS: usize = 10;

fn copy_release(release_dir: &Path, tag: &str) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/releases")
        .join(tag);
    let to = release_dir.join("cluster-stacks").join(tag);
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[tokio::main]
async fn main() {
    let tools = cso_testenv::Tools::discover().unwrap();
    let plane = cso_testenv::start_management(&tools, None).await.unwrap();
    let client = plane.client().await.unwrap();
    let release_dir = tempfile::tempdir().unwrap();
    for tag in ["docker-ferrol-1-27-v1", "docker-ferrol-1-27-v2"] {
        copy_release(release_dir.path(), tag);
    }
    let mut operator = Command::new(env!("CARGO_BIN_EXE_cso"))
        .arg("run")
        .arg(format!("--kubeconfig={}", plane.kubeconfig_path().display()))
        .arg("--leader-elect=false")
        .arg("--addon-health-checks=false")
        .arg("--local=true")
        .arg(format!("--release-dir={}", release_dir.path().display()))
        .arg("--log-level=error")
        .env("CSO_HELM", tools.helm.clone().unwrap())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = operator.id();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_started = Usage::of(Some(pid)).unwrap().rss_kib;

    let class_resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "cluster.x-k8s.io",
        "v1beta1",
        "ClusterClass",
    ));
    let mut times = Vec::new();
    for run in 0..RUNS {
        let ns = cso_testenv::namespace(&client, "bench").await.unwrap();
        let stack: ClusterStack = serde_json::from_value(json!({
            "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
            "metadata": {"name": "ferrol", "namespace": ns},
            "spec": {"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27", "channel": "stable",
                     "autoSubscribe": false, "noProvider": true, "versions": ["v1", "v2"]},
        }))
        .unwrap();
        let classes: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &class_resource);
        let started = Instant::now();
        Api::<ClusterStack>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &stack)
            .await
            .unwrap();
        loop {
            let found = classes.list(&Default::default()).await.unwrap().items.len();
            if found == 2 {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "run {run}: no ClusterClasses"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        times.push(started.elapsed());
    }
    tokio::time::sleep(Duration::from_secs(15)).await;
    let Usage {
        cpu,
        rss_kib: rss_idle,
        peak_rss_kib: rss_peak,
        ..
    } = Usage::of(Some(pid)).unwrap();
    operator.kill().unwrap();
    operator.wait().unwrap();

    let mut sorted = times.clone();
    sorted.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!("management flow: ClusterStack (ferrol v1, v2) -> both ClusterClasses, {RUNS} namespaces");
    println!("  first run (cold helm):      {:>7.1} ms", ms(times[0]));
    println!(
        "  median / max:               {:>7.1} / {:.1} ms",
        ms(sorted[RUNS / 2]),
        ms(sorted[RUNS - 1])
    );
    println!("  operator RSS after start:   {:>7.1} MiB", mib(rss_started));
    println!(
        "  operator RSS idle after:    {:>7.1} MiB ({RUNS} stacks, {} releases, {} ClusterClasses)",
        mib(rss_idle),
        2 * RUNS,
        2 * RUNS
    );
    println!("  operator peak RSS:          {:>7.1} MiB", mib(rss_peak));
    println!("  operator CPU (user+system): {:>7.0} ms", ms(cpu));
}
