//! `cso-dev demo` end to end: local management and workload control planes, the bundled stack, a ClusterStack,
//! both ClusterClasses with their templates, a Cluster whose addons land in the workload cluster, an upgrade, a
//! summary, and nothing left running; once on simulated nodes and once on real nodes, where the stack's addons
//! really run.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{process::Command, sync::Mutex};

/// One demo at a time: Cluster API's Docker provider serves a fixed port.
static ONE_DEMO: Mutex<()> = Mutex::new(());

/// Runs `cso-dev demo --nodes <nodes>`, asserts it succeeded and left no process naming its directory, and
/// returns its standard output.
fn demo(nodes: &str) -> String {
    let _one = ONE_DEMO.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::Builder::new()
        .prefix("cso-demo-test")
        .tempdir_in("/var/tmp")
        .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_cso-dev"))
        .args(["demo", "--nodes", nodes, "--dir"])
        .arg(dir.path().join("state"))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The control planes and nodes are stopped: no process names the demo's directory any more.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let marker = dir.path().to_string_lossy().to_string();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read_to_string(entry.path().join("cmdline")).unwrap_or_default();
        assert!(!cmdline.contains(&marker), "left running: {cmdline}");
    }
    stdout
}

/// The lines of `stdout` after the line that starts with `heading`, up to the next line that is not indented.
fn section<'a>(stdout: &'a str, heading: &str) -> Vec<&'a str> {
    stdout
        .lines()
        .skip_while(|line| !line.starts_with(heading))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .map(str::trim)
        .collect()
}

#[test]
fn demo_applies_the_bundled_stack_and_reports_it() {
    let stdout = demo("simulated");
    for line in [
        "workload cluster: 2 simulated nodes (kwok)",
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
}

#[test]
fn on_real_nodes_the_stacks_addons_run_and_the_clusteraddon_is_ready_only_once_they_do() {
    let stdout = demo("real");
    assert!(stdout.contains("workload cluster: 2 real nodes"), "{stdout}");
    // When the ClusterAddon was ready: kindnet on both nodes, metrics-server and web, every pod running and
    // ready; web runs this project's stand-in for nginx.
    let running = section(
        &stdout,
        "running in the workload cluster when cluster-addon-c1 was ready",
    );
    for node in ["workload-node-0", "workload-node-1"] {
        assert!(
            running
                .iter()
                .any(|l| l.starts_with("kube-system/kindnet-")
                    && l.contains(&format!("Running, ready on {node}"))),
            "no ready kindnet pod on {node}:\n{stdout}"
        );
    }
    assert!(
        running
            .iter()
            .any(|l| l.starts_with("kube-system/metrics-server-") && l.contains("Running, ready")),
        "{stdout}"
    );
    let web: Vec<&&str> = running
        .iter()
        .filter(|l| l.starts_with("kube-system/web-"))
        .collect();
    assert_eq!(web.len(), 2, "{stdout}");
    assert!(
        web.iter()
            .all(|l| l.contains("Running, ready") && l.contains("cso.test/web:v1")),
        "{stdout}"
    );
    assert!(
        running
            .iter()
            .filter(|l| l.starts_with("kube-system/"))
            .all(|l| l.contains("Running, ready")),
        "{stdout}"
    );
    assert!(
        running.contains(&"APIService v1beta1.metrics.k8s.io: Available=True (Passed: all checks passed)"),
        "{stdout}"
    );
    // It waited for them: metrics-server's APIService was named while it was not available.
    let waited = section(&stdout, "the ClusterAddon was not ready while it waited for:");
    assert!(
        waited
            .iter()
            .any(|l| l.contains("APIService v1beta1.metrics.k8s.io: not available")),
        "{stdout}"
    );
    // `kubectl top nodes` answers for both nodes.
    let top = section(&stdout, "kubectl top nodes");
    assert_eq!(
        top.first().map(|l| l.split_whitespace().collect::<Vec<_>>()),
        Some(vec!["NAME", "CPU(cores)", "MEMORY(bytes)"]),
        "{stdout}"
    );
    for node in ["workload-node-0", "workload-node-1"] {
        let line = top
            .iter()
            .find(|l| l.starts_with(node))
            .unwrap_or_else(|| panic!("{node}:\n{stdout}"));
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert!(fields[1].ends_with('m') && fields[2].ends_with("Mi"), "{line}");
    }
    // The upgrade to v2: web pruned with its pods, kindnet's pods kept (its spec did not change): the same pods,
    // not restarted by the upgrade (as many restarts as before it; ferrol's kindnet restarts on its own every few
    // minutes, docs/test-environment.md).
    let after = section(&stdout, "running after the upgrade:");
    assert!(
        !after.iter().any(|l| l.starts_with("kube-system/web-")),
        "{stdout}"
    );
    let kindnet: Vec<&&str> = after
        .iter()
        .filter(|l| l.starts_with("kube-system/kindnet-"))
        .collect();
    assert_eq!(kindnet.len(), 2, "{stdout}");
    let restarts = |line: &str| {
        line.rsplit_once(" restarts)")
            .map(|(head, _)| head.rsplit(' ').next().unwrap_or_default().to_owned())
    };
    for line in kindnet {
        assert!(line.ends_with("(kept)"), "{line}");
        let pod = line.split(':').next().unwrap();
        let before = running
            .iter()
            .find(|l| l.starts_with(&format!("{pod}:")))
            .unwrap_or_else(|| panic!("{pod} before the upgrade:\n{stdout}"));
        assert!(restarts(line).is_some(), "{line}");
        assert_eq!(
            restarts(line),
            restarts(before),
            "{pod} restarted by the upgrade:\n{stdout}"
        );
    }
    let gone = section(&stdout, "gone after the upgrade:");
    assert_eq!(gone.len(), 2, "{stdout}");
    assert!(gone.iter().all(|l| l.starts_with("kube-system/web-")), "{stdout}");
}
