//! `cso-dev up` and `cso-dev status` end to end: the binary starts two real control planes with Cluster API
//! v1.14 on the management one, reports `ready` with both kubeconfigs, serves our CRDs and Cluster API's, has
//! registered an `ExtensionConfig` that Cluster API uses to discover a hook server serving with the
//! certificates of `DIR/hook-certs` on `--hook-port` (as `cso run --hook-cert-dir DIR/hook-certs` does), and
//! stops every process it started on SIGTERM. Without an operator on the hook port it keeps running: Cluster
//! API's core manager, which exits when its warm-up cannot discover the hook server, is started again with
//! back-off (counted in `cso-dev status`), and discovers and calls `cso run` once that starts late.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use kube::{
    Api,
    api::{DynamicObject, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use serde_json::{Value, json};

/// One `cso-dev up` with Cluster API at a time: the Docker provider's manager always listens on port 19000 (see
/// `cso_testenv::capi`), so two at once would fail each other.
static CLUSTER_API_ON_THIS_MACHINE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    let _one_at_a_time = CLUSTER_API_ON_THIS_MACHINE.lock().await;
    let dir = tempfile::Builder::new()
        .prefix("cso-dev-up-test")
        .tempdir()
        .unwrap();
    let hook_port = free_port();
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

fn free_port() -> u16 {
    cso_testenv::free_port().unwrap()
}

/// The last `lines` lines of a log file, for panic messages.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// What cargo sets for a test it runs (`CARGO_PKG_NAME=cso-dev`, `CARGO_MANIFEST_DIR`, ...). Build scripts
/// (ring's) ask to be run again when these change, so a cargo started with them would rebuild the TLS stack and
/// everything on it, and the next build without them all over again.
const SET_FOR_THIS_TEST: [&str; 7] = [
    "CARGO_PKG_",
    "CARGO_MANIFEST_",
    "CARGO_CRATE_",
    "CARGO_BIN_",
    "CARGO_PRIMARY_PACKAGE",
    "CARGO_TARGET_TMPDIR",
    "OUT_DIR",
];

/// The `cso` binary of this workspace, built by cargo (up to date if it already is): a test of `cso-dev` cannot
/// name another package's binary (`CARGO_BIN_EXE_*` names only its own).
fn cso_binary() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if SET_FOR_THIS_TEST.iter().any(|prefix| key.starts_with(prefix)) {
            build.env_remove(&*key);
        }
    }
    let output = build
        .args(["build", "-p", "cso", "--bin", "cso", "--message-format=json"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(output.status.success(), "`cargo build -p cso` failed");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact" && message["target"]["name"] == "cso")
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .expect("cargo names the cso executable it built")
}

/// The restart count `cso-dev status` shows for a Cluster API manager (`  core: running, restarts: 2, ...`).
fn restarts_in_status(status: &str, manager: &str) -> Option<u32> {
    let line = status
        .lines()
        .find(|line| line.trim_start().starts_with(&format!("{manager}: ")))?;
    let count = line.split("restarts: ").nth(1)?;
    count.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// Whether `cso run`'s JSON log has an answer to `hook` for `cluster` (`namespace/name`).
fn answered(log: &Path, hook: &str, cluster: &str) -> bool {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .any(|line| {
            line["message"] == "answered a lifecycle hook call"
                && line["hook"] == hook
                && line["cluster"] == cluster
        })
}

/// Polls `check` every second until it gives a value; panics with `what` and `context()` after `limit`.
async fn eventually<T, F, Fut>(what: &str, limit: Duration, context: impl Fn() -> String, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}\n{}",
            context()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// How long `cso-dev up` runs with nothing on its hook port: three times the core manager's warm-up (a minute).
const WITHOUT_OPERATOR: Duration = Duration::from_secs(180);

#[tokio::test]
async fn dev_up_restarts_cluster_api_until_a_late_operator_is_discovered_and_called() {
    let _one_at_a_time = CLUSTER_API_ON_THIS_MACHINE.lock().await;
    let cso = cso_binary();
    let work = tempfile::Builder::new()
        .prefix("cso-dev-up-test")
        .tempdir()
        .unwrap();
    let dir = work.path().join("state");
    let up_log = work.path().join("cso-dev-up.log");
    let hook_port = free_port();
    let mut up = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_cso-dev"))
            .args(["up", "--hook-port", &hook_port.to_string(), "--dir"])
            .arg(&dir)
            // An error it stops with is said in a few lines, without a backtrace.
            .env("RUST_BACKTRACE", "0")
            .env("RUST_LIB_BACKTRACE", "0")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&up_log).unwrap())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(up.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.starts_with("ready "),
        "first line: {line:?}\n{}",
        tail(&up_log, 40)
    );
    let dir = dir.canonicalize().unwrap();

    // Nothing serves the hook port for three minutes: the core manager gives up its warm-up after a minute and
    // is started again, and `up` runs on.
    let alone_until = Instant::now() + WITHOUT_OPERATOR;
    while Instant::now() < alone_until {
        if let Some(exit) = up.0.try_wait().unwrap() {
            panic!(
                "cso-dev up stopped ({exit}) without an operator on its hook port:\n{}",
                tail(&up_log, 60)
            );
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let output = Command::new(env!("CARGO_BIN_EXE_cso-dev"))
        .args(["status", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let status = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "status answers while up runs: {status}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let core_restarts = restarts_in_status(&status, "core");
    assert!(
        core_restarts.is_some_and(|n| n >= 1),
        "the core manager was started again at least once (restarts: {core_restarts:?}):\n{status}\n{}",
        tail(&up_log, 60)
    );
    for manager in ["kubeadm-bootstrap", "kubeadm-control-plane", "docker"] {
        assert!(
            restarts_in_status(&status, manager).is_some(),
            "{manager} is listed:\n{status}"
        );
    }
    let reported = std::fs::read_to_string(&up_log).unwrap();
    assert!(
        reported.contains("cluster-api core exited (exit status: ")
            && reported.contains("cluster-api core started again"),
        "each exit and restart is reported on stderr:\n{reported}"
    );
    assert!(
        reported.contains("ExtensionConfig registry warmup timed out")
            && reported.contains("is discovered at the next start"),
        "the core manager's reason (the end of its log) and what to do about it are said:\n{reported}"
    );
    assert!(up.0.try_wait().unwrap().is_none(), "cso-dev up still runs");

    // The operator starts late, on the port and with the certificates `up` registered.
    let releases = work.path().join("releases");
    let tag = "docker-ferrol-1-27-v1";
    cso_release::release::copy_release_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/releases")
            .join(tag),
        &releases.join("cluster-stacks").join(tag),
    )
    .unwrap();
    let kubeconfig = dir.join("management.kubeconfig");
    let certs = dir.join("hook-certs");
    let operator_log = work.path().join("cso-run.log");
    let tools = cso_testenv::Tools::discover().unwrap();
    let mut operator = KillOnDrop(
        Command::new(&cso)
            .arg("run")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["--leader-elect=false", "--local=true", "--log-format=json"])
            // The ferrol addons' metrics-server APIService never becomes Available on simulated nodes.
            .arg("--addon-health-checks=false")
            .arg(format!("--release-dir={}", releases.display()))
            .arg(format!("--hook-cert-dir={}", certs.display()))
            .arg(format!("--hook-port={hook_port}"))
            .arg(format!("--webhook-cert-dir={}", certs.display()))
            .arg(format!("--webhook-port={}", free_port()))
            .arg(format!("--metrics-bind-address=127.0.0.1:{}", free_port()))
            .arg(format!("--health-probe-bind-address=127.0.0.1:{}", free_port()))
            .env(
                "CSO_RENDERER",
                tools.renderer.expect("cso-renderer: run `make tools`"),
            )
            .env("TMPDIR", work.path())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&operator_log).unwrap())
            .spawn()
            .unwrap(),
    );
    let client = cso_testenv::client_from_yaml(&std::fs::read_to_string(&kubeconfig).unwrap())
        .await
        .unwrap();
    let context = || {
        format!(
            "cso-dev up:\n{}\ncso run:\n{}\ncore manager:\n{}",
            tail(&up_log, 40),
            tail(&operator_log, 20),
            tail(&dir.join("management/cluster-api/core.log"), 20)
        )
    };
    // Discovered at the core manager's next warm-up at the latest (its back-off is under 3 minutes here).
    let hooks = cso_testenv::capi::discovered_hooks(&client, "cso", Duration::from_secs(360))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", context()));
    assert!(
        hooks.iter().any(|h| h == "AfterControlPlaneInitialized"),
        "{hooks:?}"
    );

    // A ClusterStack and a Cluster with a topology of its class, as the demo creates them: Cluster API builds
    // the Cluster and calls the late operator's hook.
    let namespace = "late";
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap(),
        )
        .await
        .unwrap();
    let stack: cso_api::ClusterStack = serde_json::from_value(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
        "metadata": {"name": "ferrol", "namespace": namespace},
        "spec": {"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27", "channel": "stable",
                 "autoSubscribe": false, "noProvider": true, "versions": ["v1"]},
    }))
    .unwrap();
    Api::<cso_api::ClusterStack>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &stack)
        .await
        .unwrap();
    let releases_api: Api<cso_api::ClusterStackRelease> = Api::namespaced(client.clone(), namespace);
    eventually(
        "the ClusterStackRelease to be ready",
        Duration::from_secs(180),
        context,
        || async {
            let release = releases_api.get_opt(tag).await.ok().flatten()?;
            release.status.is_some_and(|s| s.ready).then_some(())
        },
    )
    .await;
    let cluster: DynamicObject = serde_json::from_value(
        cso_testenv::capi::TopologyCluster {
            namespace,
            name: "c1",
            api_version: "cluster.x-k8s.io/v1beta2",
            class: tag,
            class_namespace: None,
            version: "v1.27.3",
            worker_class: "workeramd64",
            worker_replicas: 0,
            image_repository: Some("registry.k8s.io"),
        }
        .to_json(),
    )
    .unwrap();
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster"),
            "clusters",
        ),
    );
    // Cluster API's webhooks are served by its core manager, which may be between two runs.
    eventually(
        "Cluster API to accept the Cluster",
        Duration::from_secs(360),
        context,
        || async {
            clusters
                .create(&PostParams::default(), &cluster)
                .await
                .ok()
                .map(|_| ())
        },
    )
    .await;
    eventually(
        "Cluster API to call AfterControlPlaneInitialized on the late operator",
        Duration::from_secs(300),
        context,
        || async { answered(&operator_log, "AfterControlPlaneInitialized", "late/c1").then_some(()) },
    )
    .await;

    let exit = terminate(&mut operator);
    assert!(exit.success(), "cso run exits cleanly on SIGTERM: {exit}");
    let pid = up.0.id();
    let exit = terminate(&mut up);
    assert!(exit.success(), "cso-dev up exits cleanly on SIGTERM: {exit}");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !descendants_alive(pid).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        descendants_alive(pid),
        Vec::<u32>::new(),
        "every started process is gone, the restarted managers too"
    );
}

/// Sends SIGTERM and waits (at most a minute) for the process to exit.
fn terminate(process: &mut KillOnDrop) -> std::process::ExitStatus {
    Command::new("kill")
        .args(["-TERM", &process.0.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = process.0.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "did not stop within a minute of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
