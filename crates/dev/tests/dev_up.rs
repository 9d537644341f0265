//! `cso-dev up` and `cso-dev status` end to end: the binary starts two real control planes with Cluster API
//! v1.14 on the management one, reports `ready` with both kubeconfigs, serves our CRDs and Cluster API's, has
//! registered an `ExtensionConfig` that Cluster API uses to discover a hook server serving with the
//! certificates of `DIR/hook-certs` on `--hook-port` (as `cso run --hook-cert-dir DIR/hook-certs` does), and
//! stops every process it started on SIGTERM.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// Kills `cso-dev up` if the test fails half-way, so that a failure leaves nothing running.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn descendants_alive(root: u32) -> Vec<u32> {
    // Any etcd or kube-apiserver whose command line names our directory counts.
    let mut alive = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc is readable").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if pid != root && cmdline.contains("cso-dev-up-test") {
            alive.push(pid);
        }
    }
    alive
}

#[tokio::test]
async fn dev_up_reaches_ready_serves_the_crds_and_stops_cleanly() {
    let dir = tempfile::Builder::new()
        .prefix("cso-dev-up-test")
        .tempdir()
        .unwrap();
    let hook_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_cso-dev"))
            .args(["up", "--hook-port", &hook_port.to_string(), "--dir"])
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("ready "), "first line: {line:?}");
    let management = dir.path().canonicalize().unwrap().join("management.kubeconfig");
    let workload = dir.path().canonicalize().unwrap().join("workload.kubeconfig");
    assert!(
        line.contains(&*management.to_string_lossy()) && line.contains(&*workload.to_string_lossy()),
        "{line}"
    );

    let output = Command::new(env!("CARGO_BIN_EXE_cso-dev"))
        .args(["status", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let status = String::from_utf8(output.stdout).unwrap();
    assert!(output.status.success(), "{status}");
    for crd in [
        "clusterstacks.clusterstack.x-k8s.io",
        "clusterstackreleases.clusterstack.x-k8s.io",
        "clusteraddons.clusterstack.x-k8s.io",
        "clusters.cluster.x-k8s.io",
        "extensionconfigs.runtime.cluster.x-k8s.io",
        "clusterclasses.cluster.x-k8s.io",
        "kubeadmcontrolplanetemplates.controlplane.cluster.x-k8s.io",
        "kubeadmconfigtemplates.bootstrap.cluster.x-k8s.io",
        "dockerclustertemplates.infrastructure.cluster.x-k8s.io",
        "dockermachinetemplates.infrastructure.cluster.x-k8s.io",
    ] {
        assert!(status.contains(crd), "{crd} missing from:\n{status}");
    }
    assert!(status.contains("management: Kubernetes v1.35."), "{status}");
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("workload: Kubernetes v1.35.") && l.ends_with("(0 CRDs)")),
        "the workload control plane is bare:\n{status}"
    );

    // The hook server, serving with DIR/hook-certs on the port the ExtensionConfig names, is discovered.
    let management_client = cso_testenv::client_from_yaml(&std::fs::read_to_string(&management).unwrap())
        .await
        .unwrap();
    let certs = dir.path().canonicalize().unwrap().join("hook-certs");
    let server = cso_webhook::TlsServer::start(
        cso_webhook::hook_router(management_client.clone(), cso_webhook::hooks::unobserved()),
        format!("127.0.0.1:{hook_port}").parse().unwrap(),
        &certs,
    )
    .await
    .unwrap();
    let hooks = cso_testenv::capi::discovered_hooks(&management_client, "cso", Duration::from_secs(60))
        .await
        .unwrap();
    let mut every_hook: Vec<String> = cso_api::rules::Hook::ALL
        .iter()
        .map(|h| h.as_str().to_owned())
        .collect();
    every_hook.sort();
    assert_eq!(
        hooks, every_hook,
        "Cluster API lists a handler of ours for every lifecycle hook"
    );
    server.shutdown(Duration::from_secs(1)).await;

    let workload_client = cso_testenv::client_from_yaml(&std::fs::read_to_string(&workload).unwrap())
        .await
        .unwrap();
    workload_client
        .apiserver_version()
        .await
        .expect("the workload control plane answers");

    let pid = child.0.id();
    assert!(
        !descendants_alive(pid).is_empty(),
        "control plane processes run while up"
    );
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let exit = child.0.wait().unwrap();
    assert!(exit.success(), "cso-dev up exits cleanly on SIGTERM: {exit}");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !descendants_alive(pid).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        descendants_alive(pid),
        Vec::<u32>::new(),
        "every started process is gone"
    );
}
