//! `cso-dev nodes`: a cluster of real nodes held until a signal. Killed with SIGKILL (no clean-up of its own),
//! its watchdogs still remove everything it put on the machine: namespaces, links, cgroups, mounts, processes
//! (the containers' too), the kubelet's sysctls, and the egress guard's routes and chains (when no other process
//! holds them).
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

fn sysctls() -> Vec<String> {
    ["kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory"]
        .iter()
        .map(|key| {
            std::fs::read_to_string(format!("/proc/sys/{key}"))
                .unwrap()
                .trim()
                .to_owned()
        })
        .collect()
}

#[test]
fn a_killed_cso_dev_nodes_leaves_nothing_on_the_machine() {
    let tools = cso_testenv::Tools::discover().unwrap();
    if let Err(why) = cso_testenv::node::RealCluster::support(&tools) {
        panic!("this machine cannot run real nodes: {why}");
    }
    let before = sysctls();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("nodes");
    let mut child = Command::new(env!("CARGO_BIN_EXE_cso-dev"))
        .arg("nodes")
        .arg(format!("--dir={}", dir.display()))
        .arg(format!(
            "--image={}",
            tools
                .busybox_image
                .clone()
                .expect("the busybox test image: run `make tools`")
                .display()
        ))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert!(ready.starts_with("ready in "), "cso-dev nodes: {ready:?}");
    let slot: u8 = ready
        .split("slot ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap()
        .parse()
        .unwrap();
    let dir = dir.canonicalize().unwrap();
    // A pod runs on the node (a containerd shim and a container beside the node's processes).
    let kubeconfig = std::fs::read_to_string(dir.join("kubeconfig")).unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let client = cso_testenv::client_from_yaml(&kubeconfig).await.unwrap();
        let ns = cso_testenv::namespace(&client, "killed").await.unwrap();
        let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client.clone(), &ns);
        let accounts: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
            kube::Api::namespaced(client, &ns);
        let pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper"},
            "spec": {"automountServiceAccountToken": false, "containers": [{"name": "main",
                     "image": "cso.test/busybox:debian-12", "imagePullPolicy": "Never",
                     "command": ["/bin/sleep", "3600"]}]},
        }))
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(Instant::now() < deadline, "the sleeper pod Running within 60 s");
            if accounts.get_opt("default").await.unwrap().is_some() {
                let _ = pods.create(&Default::default(), &pod).await;
            }
            let phase = pods
                .get_opt("sleeper")
                .await
                .unwrap()
                .and_then(|p| p.status?.phase);
            if phase.as_deref() == Some("Running") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
    let sleepers = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(Result::ok)
            .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == b"/bin/sleep\x003600\x00"))
            .count()
    };
    assert_eq!(sleepers(), 1, "the pod's container runs on this machine");
    assert!(
        !cso_testenv::node::left_on_the_machine(slot, &dir).is_empty(),
        "a running cluster is seen"
    );

    child.kill().unwrap();
    child.wait().unwrap();
    // The watchdog checks every second, waits 5 s for the processes' own watchdogs, then tears down.
    let deadline = Instant::now() + Duration::from_secs(30);
    // The teardown puts the sysctls back last: wait for that too.
    let mut left = cso_testenv::node::left_on_the_machine(slot, &dir);
    while (!left.is_empty() || sysctls() != before) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        left = cso_testenv::node::left_on_the_machine(slot, &dir);
    }
    assert!(
        left.is_empty(),
        "left on the machine 30 s after the kill: {left:#?}"
    );
    assert_eq!(sleepers(), 0, "the pod's container is gone too");
    assert_eq!(sysctls(), before, "the kubelet's sysctls are put back");
    // The egress guard cso-dev held goes too, once no other process holds it.
    let mut guard = cso_testenv::egress::left_on_the_machine();
    while !guard.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        guard = cso_testenv::egress::left_on_the_machine();
    }
    if cso_testenv::egress::live_holders().is_empty() {
        assert!(
            guard.is_empty(),
            "the egress guard left on the machine: {guard:?}"
        );
    }
}
