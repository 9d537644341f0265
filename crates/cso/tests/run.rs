//! `cso run` as a process, as it runs in production: Go-style flags, the GitHub source configured by the Go
//! operator's variables, killed (SIGKILL) in the middle of its work and started again with an empty release
//! cache, then stopped with SIGTERM.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use cso_api::{ClusterStack, ClusterStackRelease};
use cso_testenv::github::FakeGithub;
use kube::{
    Api, Client,
    api::{DynamicObject, PostParams},
    core::GroupVersionKind,
    discovery::ApiResource,
};
use serde_json::json;

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases")
}

/// Where `cso run` serves in this test.
struct Endpoints<'a> {
    hook_port: u16,
    hook_cert_dir: &'a Path,
    metrics_port: u16,
    health_port: u16,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_operator(
    kubeconfig: &Path,
    release_dir: &Path,
    namespace: &str,
    github: &str,
    log: &Path,
    endpoints: &Endpoints<'_>,
) -> KillOnDrop {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_cso"))
            .arg("run")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--leader-elect=false")
            .arg("-namespace")
            .arg(namespace)
            .arg(format!("--release-dir={}", release_dir.display()))
            .arg("--source=github")
            .arg(format!("--github-api-url={github}"))
            .arg("--clusterstackrelease-concurrency=2")
            .arg(format!("--hook-port={}", endpoints.hook_port))
            .arg(format!("--hook-cert-dir={}", endpoints.hook_cert_dir.display()))
            .arg(format!(
                "--metrics-bind-address=127.0.0.1:{}",
                endpoints.metrics_port
            ))
            .arg(format!(
                "--health-probe-bind-address=127.0.0.1:{}",
                endpoints.health_port
            ))
            .args(["--log-level=debug", "--log-format=json"])
            .env("GIT_PROVIDER", "github")
            .env("GIT_ORG_NAME", "SovereignCloudStack")
            .env("GIT_REPOSITORY_NAME", "cluster-stacks\n")
            .env("CSO_HELM", cso_testenv::Tools::discover().unwrap().helm.unwrap())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
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
            "timed out after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn ready(client: &Client, namespace: &str) -> Vec<String> {
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), namespace);
    let mut names: Vec<String> = releases
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|r| r.status.as_ref().is_some_and(|s| s.ready))
        .filter_map(|r| r.metadata.name)
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_work_and_restarted_with_an_empty_cache_it_converges() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "restart").await.unwrap();
    let fake = FakeGithub::start(30).await.unwrap();
    for tag in ["docker-ferrol-1-27-v1", "docker-ferrol-1-27-v2"] {
        fake.publish_dir(tag, &fixtures().join(tag)).unwrap();
    }
    fake.slow_down("docker-ferrol-1-27-v2", Duration::from_secs(30));
    let release_dir = tempfile::tempdir().unwrap();
    let log = release_dir.path().join("operator.log");
    let hook_certs = tempfile::tempdir().unwrap();
    let pki = cso_testenv::pki::Pki::generate(hook_certs.path()).unwrap();
    std::fs::copy(&pki.serving_cert, hook_certs.path().join("tls.crt")).unwrap();
    std::fs::copy(&pki.serving_key, hook_certs.path().join("tls.key")).unwrap();
    let hook_port = free_port();
    let endpoints = Endpoints {
        hook_port,
        hook_cert_dir: hook_certs.path(),
        metrics_port: free_port(),
        health_port: free_port(),
    };
    let start = || {
        start_operator(
            plane.kubeconfig_path(),
            release_dir.path(),
            &ns,
            fake.api_url(),
            &log,
            &endpoints,
        )
    };
    let mut operator = start();

    let stack: ClusterStack = serde_json::from_value(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
        "metadata": {"name": "ferrol", "namespace": ns},
        "spec": {"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27", "channel": "stable",
                 "autoSubscribe": false, "noProvider": true, "versions": ["v1", "v2"]},
    }))
    .unwrap();
    Api::<ClusterStack>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &stack)
        .await
        .unwrap();

    // Kill while v2 is being downloaded (its assets come slowly) and v1 is done.
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), &ns);
    wait_for("v1 ready while v2 downloads", Duration::from_secs(60), || async {
        (ready(&client, &ns).await == ["docker-ferrol-1-27-v1"]).then_some(())
    })
    .await;
    operator.0.kill().unwrap();
    operator.0.wait().unwrap();
    let v2 = releases.get("docker-ferrol-1-27-v2").await.unwrap();
    assert!(
        !v2.status.as_ref().is_some_and(|s| s.ready),
        "killed in the middle: v2 was not done"
    );
    assert!(
        !release_dir
            .path()
            .join("cluster-stacks/docker-ferrol-1-27-v2")
            .exists(),
        "a download cut short leaves nothing in the cache"
    );
    fake.slow_down("docker-ferrol-1-27-v2", Duration::ZERO);

    // Start again with an empty release cache: it downloads again and converges.
    std::fs::remove_dir_all(release_dir.path().join("cluster-stacks")).ok();
    let downloads_before = fake
        .requests()
        .iter()
        .filter(|r| r.path.contains("/assets/"))
        .count();
    let operator = start();
    wait_for(
        "both releases ready after the restart",
        Duration::from_secs(120),
        || async { (ready(&client, &ns).await.len() == 2).then_some(()) },
    )
    .await;
    let downloads_after = fake
        .requests()
        .iter()
        .filter(|r| r.path.contains("/assets/"))
        .count();
    assert!(
        downloads_after > downloads_before,
        "the empty cache was filled again from the source"
    );
    for tag in ["docker-ferrol-1-27-v1", "docker-ferrol-1-27-v2"] {
        assert!(
            release_dir
                .path()
                .join("cluster-stacks")
                .join(tag)
                .join("metadata.yaml")
                .is_file()
        );
    }
    let classes: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "cluster.x-k8s.io",
            "v1beta1",
            "ClusterClass",
        )),
    );
    for class in ["docker-ferrol-1-27-v1", "docker-ferrol-1-27-v2"] {
        assert!(classes.get_opt(class).await.unwrap().is_some(), "{class}");
    }
    for release in releases.list(&Default::default()).await.unwrap().items {
        let inventory = release.status.unwrap().resources;
        assert_eq!(
            inventory.len(),
            5,
            "one inventory entry per object, none twice: {inventory:?}"
        );
    }

    // The lifecycle-hook server answers Cluster API's discovery over HTTPS.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let https = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(pki.ca_pem.as_bytes()).unwrap())
        .build()
        .unwrap();
    let discovery: serde_json::Value = https
        .post(format!(
            "https://127.0.0.1:{hook_port}/hooks.runtime.cluster.x-k8s.io/v1alpha1/discovery"
        ))
        .json(&json!({"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "DiscoveryRequest"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(discovery["handlers"].as_array().unwrap().len(), 3, "{discovery}");

    // Metrics with controller-runtime's names, and the probes.
    let plain = reqwest::Client::new();
    let metrics = plain
        .get(format!("http://127.0.0.1:{}/metrics", endpoints.metrics_port))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            r#"controller_runtime_reconcile_total{controller="clusterstackrelease",result="success"}"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"cso_objects_applied_total{target="management"}"#),
        "{metrics}"
    );
    for probe in ["healthz", "readyz"] {
        let answer = plain
            .get(format!("http://127.0.0.1:{}/{probe}", endpoints.health_port))
            .send()
            .await
            .unwrap();
        assert!(answer.status().is_success(), "{probe}");
    }

    // SIGTERM: a clean, prompt exit.
    let mut operator = operator;
    let pid = operator.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let stopped = Instant::now();
    let status = loop {
        if let Some(status) = operator.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(30),
            "cso run did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status}");
    let log = std::fs::read_to_string(&log).unwrap();
    let first = log.lines().next().unwrap();
    let parsed: serde_json::Value = serde_json::from_str(first).unwrap_or_else(|e| panic!("{e}: {first}"));
    assert_eq!(parsed["message"], "starting manager", "JSON log lines: {first}");
    assert_eq!(
        parsed["level"], "INFO",
        "keys as the Go operator writes them: {first}"
    );
    assert!(
        parsed["time"].is_string() && parsed["logger"].is_string(),
        "{first}"
    );
    let in_reconcile = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| {
            l["context"]
                .as_str()
                .is_some_and(|c| c.contains("ClusterStackRelease"))
        })
        .expect("lines logged inside a reconcile name the object");
    assert!(
        in_reconcile["context"].as_str().unwrap().contains(&ns),
        "{in_reconcile}"
    );
}
