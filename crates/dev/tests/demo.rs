//! `cso-dev demo` end to end: local management and workload control planes, the bundled stack, a ClusterStack,
//! both ClusterClasses with their templates, a Cluster whose addons land in the workload cluster, a summary,
//! and nothing left running.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::process::Command;

#[test]
fn demo_applies_the_bundled_stack_and_reports_it() {
    let dir = tempfile::Builder::new()
        .prefix("cso-demo-test")
        .tempdir()
        .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_cso-dev"))
        .args(["demo", "--dir"])
        .arg(dir.path().join("state"))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for line in [
        "ClusterStackRelease docker-ferrol-1-27-v1 (ready)",
        "ClusterStackRelease docker-ferrol-1-27-v2 (ready)",
        "ClusterClass docker-ferrol-1-27-v2",
        "KubeadmControlPlaneTemplate docker-ferrol-1-27-v1-control-plane",
        "ClusterStack to ready ClusterClasses",
        "Cluster to addons running",
        "ClusterAddon cluster-addon-c1 (ready)",
        "Deployment kube-system/metrics-server",
        "DaemonSet kube-system/kindnet",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
    // The control planes are stopped: no etcd or kube-apiserver names the demo's directory any more.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let marker = dir.path().to_string_lossy().to_string();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read_to_string(entry.path().join("cmdline")).unwrap_or_default();
        assert!(!cmdline.contains(&marker), "left running: {cmdline}");
    }
}
