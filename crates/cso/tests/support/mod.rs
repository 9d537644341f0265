//! What the process tests share: starting `cso run` as a process with Go-style flags, waiting, stopping.
#![allow(dead_code, reason = "each test binary uses a part")]

pub mod capi_stack;

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use cso_api::{ClusterStack, ClusterStackRelease};
use kube::{Api, Client};
use serde_json::json;

pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases")
}

/// One `cso run` replica: where it serves, with which certificates, and whether it elects a leader.
pub struct Instance<'a> {
    pub cert_dir: &'a Path,
    pub hook_port: u16,
    pub webhook_port: u16,
    pub metrics_port: u16,
    pub health_port: u16,
    pub leader_elect: bool,
    pub lease_seconds: u64,
}

impl<'a> Instance<'a> {
    pub fn new(cert_dir: &'a Path, leader_elect: bool) -> Self {
        Instance {
            cert_dir,
            hook_port: free_port(),
            webhook_port: free_port(),
            metrics_port: free_port(),
            health_port: free_port(),
            leader_elect,
            lease_seconds: LEASE_SECONDS,
        }
    }
}

/// The lease duration the replicas of these tests use unless they say otherwise (production default: 15 s).
pub const LEASE_SECONDS: u64 = 6;

pub fn free_port() -> u16 {
    cso_testenv::free_port().unwrap()
}

pub fn start_operator(
    kubeconfig: &Path,
    release_dir: &Path,
    namespace: &str,
    github: &str,
    log: &Path,
    instance: &Instance<'_>,
) -> KillOnDrop {
    start_operator_with(
        kubeconfig,
        release_dir,
        Some(namespace),
        &Source::Github(github),
        log,
        instance,
        &[],
    )
}

/// Where `cso run` gets its releases.
pub enum Source<'a> {
    /// The GitHub API at this URL (the stand-in), repository `SovereignCloudStack/cluster-stacks`.
    Github(&'a str),
    /// The OCI registry `registry` (`host:port`, plain HTTP on loopback), repository `repository` in it.
    Oci { registry: &'a str, repository: &'a str },
}

/// `cso run` watching `namespace` (every namespace when `None`), with releases from `source` and `extra`
/// flags.
pub fn start_operator_with(
    kubeconfig: &Path,
    release_dir: &Path,
    namespace: Option<&str>,
    source: &Source<'_>,
    log: &Path,
    instance: &Instance<'_>,
    extra: &[&str],
) -> KillOnDrop {
    let mut command = operator_command(
        Path::new(env!("CARGO_BIN_EXE_cso")),
        kubeconfig,
        release_dir,
        namespace,
        source,
        log,
        instance,
        extra,
    );
    KillOnDrop(command.spawn().unwrap())
}

/// The command [`start_operator_with`] spawns, running the `cso` binary at `program`: a test may change its
/// environment first (`CSO_RENDERER` and `CSO_HELM` are set to the tools of `make tools`).
#[allow(
    clippy::too_many_arguments,
    reason = "the same arguments as start_operator_with, and the binary"
)]
pub fn operator_command(
    program: &Path,
    kubeconfig: &Path,
    release_dir: &Path,
    namespace: Option<&str>,
    source: &Source<'_>,
    log: &Path,
    instance: &Instance<'_>,
    extra: &[&str],
) -> Command {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut command = Command::new(program);
    command
        .arg("run")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--leader-elect={}", instance.leader_elect))
        // The workload clusters here are bare API servers: nothing they hold ever runs.
        .arg("--addon-health-checks=false")
        .arg(format!(
            "--leader-elect-lease-duration={}s",
            instance.lease_seconds
        ));
    if let Some(namespace) = namespace {
        command
            .arg(format!("--leader-elect-namespace={namespace}"))
            .arg("-namespace")
            .arg(namespace);
    }
    match source {
        Source::Github(url) => {
            command
                .arg("--source=github")
                .arg(format!("--github-api-url={url}"))
                .env("GIT_PROVIDER", "github")
                .env("GIT_ORG_NAME", "SovereignCloudStack")
                .env("GIT_REPOSITORY_NAME", "cluster-stacks\n");
        }
        Source::Oci { registry, repository } => {
            command
                .arg("--source=oci")
                .env("OCI_REGISTRY", registry)
                .env("OCI_REPOSITORY", format!("{registry}/{repository}"))
                .env("OCI_PLAIN_HTTP", "true");
        }
    }
    command
        .arg(format!("--release-dir={}", release_dir.display()))
        .arg("--clusterstackrelease-concurrency=2")
        .arg(format!("--hook-port={}", instance.hook_port))
        .arg(format!("--hook-cert-dir={}", instance.cert_dir.display()))
        .arg(format!("--webhook-port={}", instance.webhook_port))
        .arg(format!("--webhook-cert-dir={}", instance.cert_dir.display()))
        .arg(format!(
            "--metrics-bind-address=127.0.0.1:{}",
            instance.metrics_port
        ))
        .arg(format!(
            "--health-probe-bind-address=127.0.0.1:{}",
            instance.health_port
        ))
        .args(["--log-level=debug", "--log-format=json"])
        .args(extra)
        .env("CSO_HELM", cso_testenv::Tools::discover().unwrap().helm.unwrap())
        .env(
            "CSO_RENDERER",
            cso_testenv::Tools::discover().unwrap().renderer.unwrap(),
        )
        // Its scratch directories (helm's home, kubeconfigs) go with the test's, even after a SIGKILL.
        .env("TMPDIR", release_dir)
        .stdout(Stdio::null())
        .stderr(log);
    command
}

pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    wait_for_every(what, limit, Duration::from_millis(20), check).await
}

/// [`wait_for`], looking every `interval`.
pub async fn wait_for_every<T, F, Fut>(what: &str, limit: Duration, interval: Duration, mut check: F) -> T
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
        tokio::time::sleep(interval).await;
    }
}

/// Stops `operator` (SIGTERM, a clean exit) and asserts its log has no request the RBAC refused.
pub fn stop_and_assert_nothing_forbidden(operator: &mut KillOnDrop, log: &Path, rbac: &str) {
    assert!(terminate(operator).success());
    let log = std::fs::read_to_string(log).unwrap();
    let forbidden: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("forbidden") || l.contains("Forbidden"))
        .collect();
    assert!(
        forbidden.is_empty(),
        "requests {rbac} does not allow: {forbidden:#?}"
    );
}

/// Sends SIGTERM and waits (at most 30 s) for the process to exit.
pub fn terminate(operator: &mut KillOnDrop) -> std::process::ExitStatus {
    let pid = operator.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let stopped = Instant::now();
    loop {
        if let Some(status) = operator.0.try_wait().unwrap() {
            return status;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(30),
            "cso run did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn ferrol_stack(namespace: &str, versions: &[&str]) -> ClusterStack {
    serde_json::from_value(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
        "metadata": {"name": "ferrol", "namespace": namespace},
        "spec": {"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27", "channel": "stable",
                 "autoSubscribe": false, "noProvider": true, "versions": versions},
    }))
    .unwrap()
}

pub async fn ready(client: &Client, namespace: &str) -> Vec<String> {
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

/// A GitHub stand-in that has ferrol v1 and v2 of the bundled releases.
pub async fn github_with_ferrol() -> cso_testenv::github::FakeGithub {
    let fake = cso_testenv::github::FakeGithub::start(30).await.unwrap();
    for tag in ["docker-ferrol-1-27-v1", "docker-ferrol-1-27-v2"] {
        fake.publish_dir(tag, &fixtures().join(tag)).unwrap();
    }
    fake
}

/// The Prometheus text of the metrics endpoint of `cso run` listening on `port`.
pub async fn metrics_text(port: u16) -> String {
    reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The sum of the samples of `name` (with its `_total` suffix, if any) whose labels contain every one of
/// `labels` (`controller="clusteraddon"`): a counter over the label values not named.
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            (metric == name && labels.iter().all(|l| rest.contains(l)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// The JSON lines of a `cso run` log.
pub fn log_lines(log: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The first line of a `cso run` log with `message`.
pub fn logged(log: &Path, message: &str) -> Option<serde_json::Value> {
    log_lines(log).into_iter().find(|l| l["message"] == message)
}

/// The Clusters of `namespace`, as Cluster API `v1beta1` serves them (the tests without Cluster API's manager
/// create them so).
pub fn v1beta1_clusters(client: &Client, namespace: &str) -> Api<kube::api::DynamicObject> {
    let resource = kube::discovery::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "cluster.x-k8s.io",
        "v1beta1",
        "Cluster",
    ));
    Api::namespaced_with(client.clone(), namespace, &resource)
}

/// Cluster `name` of `class` with `labels`, its control plane at `shared.example.test`: the addons of Clusters
/// that share a workload cluster then render and apply the same objects there.
pub fn shared_endpoint_cluster(
    namespace: &str,
    name: &str,
    class: &str,
    labels: serde_json::Value,
) -> kube::api::DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "topology": {"class": class, "version": "v1.27.3"},
            "controlPlaneEndpoint": {"host": "shared.example.test", "port": 6443},
        },
    }))
    .unwrap()
}

/// The ClusterAddons of `addons` that are ready on `class`.
pub async fn addons_ready_on(addons: &Api<cso_api::ClusterAddon>, class: &str) -> Vec<cso_api::ClusterAddon> {
    addons
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|a| a.spec.cluster_stack == class && a.status.as_ref().is_some_and(|s| s.ready))
        .collect()
}

/// How many of the ClusterAddons of `addons` are ready on `class`.
pub async fn ready_addons(addons: &Api<cso_api::ClusterAddon>, class: &str) -> usize {
    addons_ready_on(addons, class).await.len()
}
