//! A test stack for the tests with Cluster API itself: releases of `docker-capi-1-<minor>` built from ferrol's
//! real ClusterClass and the hash fixture's stage charts, v1beta2 Clusters of it, and reading what the
//! operator answered Cluster API's hook calls.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use cso_api::ClusterStack;
use cso_testenv::{
    archive::{files_of, tgz},
    capi::{ClusterApi, Provider, TopologyCluster},
};
use kube::{
    Api, Client,
    api::DynamicObject,
    core::{ApiResource, GroupVersionKind},
};
use serde_json::{Value, json};

use super::fixtures;

/// How long [`upgrade_finished`] waits for Cluster API.
pub const UPGRADE_LIMIT: Duration = Duration::from_secs(180);

/// The cluster-class chart of ferrol v1 (a real Cluster API ClusterClass with its templates), renamed to
/// `<stack>-cluster-class` at `version`, with `spec.kubernetesVersions` when given.
pub fn cluster_class_chart(stack: &str, version: &str, kubernetes_versions: &[&str]) -> Vec<u8> {
    let source = fixtures().join("docker-ferrol-1-27-v1/docker-ferrol-1-27-cluster-class-v1.tgz");
    let files: Vec<(String, String)> = files_of(&source)
        .unwrap()
        .into_iter()
        .map(|(path, content)| {
            let text = String::from_utf8(content).unwrap();
            let relative = path.split_once('/').unwrap().1.to_owned();
            let text = match relative.as_str() {
                "Chart.yaml" => text
                    .replace(
                        "name: docker-ferrol-1-27-cluster-class",
                        &format!("name: {stack}-cluster-class"),
                    )
                    .replace("version: v1", &format!("version: {version}")),
                "templates/cluster-class.yaml" if !kubernetes_versions.is_empty() => text.replacen(
                    "spec:\n",
                    &format!(
                        "spec:\n  kubernetesVersions: [{}]\n",
                        kubernetes_versions.join(", ")
                    ),
                    1,
                ),
                _ => text,
            };
            (format!("{stack}-cluster-class/{relative}"), text)
        })
        .collect();
    tgz(&files)
}

/// The stage charts of the hash fixture (`metrics-server`, `ngnix`) and a `probe` chart whose ConfigMap
/// records the Kubernetes version it was rendered for.
pub fn addon_charts() -> Vec<u8> {
    let source = fixtures()
        .join("docker-ferrol-1-27-v0-sha-hipstsw/docker-ferrol-1-27-cluster-addon-v0-sha.hipstsw.tgz");
    let mut files = files_of(&source).unwrap();
    files.push((
        "probe/Chart.yaml".into(),
        b"apiVersion: v2\nname: probe\nversion: v1\n".to_vec(),
    ));
    files.push((
        "probe/templates/step.yaml".into(),
        b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: step-version\ndata:\n  version: {{ .Capabilities.KubeVersion.Version | quote }}\n"
            .to_vec(),
    ));
    tgz(&files)
}

/// One release of the test stack `docker-capi-1-<minor>`, published as a GitHub release would be.
pub struct Release {
    pub minor: u32,
    pub version: &'static str,
    pub kubernetes: &'static str,
    pub kubernetes_versions: &'static [&'static str],
    pub clusteraddon_yaml: String,
}

impl Release {
    pub fn stack(&self) -> String {
        format!("docker-capi-1-{}", self.minor)
    }

    pub fn tag(&self) -> String {
        format!("{}-{}", self.stack(), self.version)
    }

    pub fn write(&self, root: &Path) -> PathBuf {
        let dir = root.join(self.tag());
        std::fs::create_dir_all(&dir).unwrap();
        let (stack, version) = (self.stack(), self.version);
        std::fs::write(
            dir.join("metadata.yaml"),
            format!(
                "apiVersion: metadata.clusterstack.x-k8s.io/v1alpha1\nversions:\n  clusterStack: {version}\n  \
                 kubernetes: {}\n  components:\n    clusterAddon: {version}\n    nodeImage: {version}\n",
                self.kubernetes
            ),
        )
        .unwrap();
        std::fs::write(dir.join("clusteraddon.yaml"), &self.clusteraddon_yaml).unwrap();
        std::fs::write(
            dir.join(format!("{stack}-cluster-class-{version}.tgz")),
            cluster_class_chart(&stack, version, self.kubernetes_versions),
        )
        .unwrap();
        std::fs::write(
            dir.join(format!("{stack}-cluster-addon-{version}.tgz")),
            addon_charts(),
        )
        .unwrap();
        dir
    }
}

pub const HEADER: &str = "apiVersion: clusteraddonconfig.x-k8s.io/v1alpha1\nclusterAddonVersion: clusteraddons.clusterstack.x-k8s.io/v1alpha1\naddonStages:\n";

pub fn cluster_stack(namespace: &str, minor: u32, versions: &[&str]) -> ClusterStack {
    serde_json::from_value(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
        "metadata": {"name": format!("capi-1-{minor}"), "namespace": namespace},
        "spec": {"provider": "docker", "name": "capi", "kubernetesVersion": format!("1.{minor}"),
                 "channel": "stable", "autoSubscribe": false, "noProvider": true, "versions": versions},
    }))
    .unwrap()
}

/// A v1beta2 Cluster in `namespace` of the class `class` in `class_namespace`, with one control-plane replica
/// and a MachineDeployment with no machines (so worker upgrades complete without machines).
pub fn cluster(namespace: &str, name: &str, class: &str, class_namespace: &str, version: &str) -> Value {
    TopologyCluster {
        namespace,
        name,
        api_version: "cluster.x-k8s.io/v1beta2",
        class,
        class_namespace: Some(class_namespace),
        version,
        worker_class: "workeramd64",
        worker_replicas: 0,
        image_repository: Some("registry.k8s.io"),
    }
    .to_json()
}

pub fn api(
    client: &Client,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

/// One answered hook call, from the operator's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub hook: String,
    pub version: String,
    pub result: String,
}

/// The hook calls for `cluster` (`ns/name`) the operator answered, in order.
pub fn answers(log: &Path, cluster: &str) -> Vec<Answer> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["message"] == "answered a lifecycle hook call" && line["cluster"] == cluster)
        .map(|line| Answer {
            hook: line["hook"].as_str().unwrap_or_default().to_owned(),
            version: line["kubernetes_version"].as_str().unwrap_or_default().to_owned(),
            result: line["result"].as_str().unwrap_or_default().to_owned(),
        })
        .collect()
}

/// The calls of a phase after a Cluster's creation, without repeats of AfterControlPlaneInitialized.
///
/// Cluster API may call that hook again later: it tracks the call in a pending-hooks annotation it patches
/// without a resourceVersion, so marking an upgrade hook pending from a stale cached Cluster writes the
/// already-called hook back (the Runtime SDK asks extensions to be idempotent for this reason). A repeat is
/// not part of the upgrade's order, but it must be let through: the operator never holds it.
pub fn after_creation(phase: &[Answer]) -> Vec<Answer> {
    let (repeats, rest): (Vec<Answer>, Vec<Answer>) = phase
        .iter()
        .cloned()
        .partition(|a| a.hook == "AfterControlPlaneInitialized");
    assert!(
        repeats.iter().all(|a| a.result == "success"),
        "a repeated AfterControlPlaneInitialized is let through: {repeats:?}"
    );
    rest
}

/// The hooks that were let through (answered `success`), each (hook, version) once, in the order of their
/// first success.
pub fn passed(answers: &[Answer]) -> Vec<(String, String)> {
    let mut seen = Vec::new();
    for answer in answers.iter().filter(|a| a.result == "success") {
        let key = (answer.hook.clone(), answer.version.clone());
        if !seen.contains(&key) {
            seen.push(key);
        }
    }
    seen
}

pub fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(h, v)| ((*h).to_owned(), (*v).to_owned()))
        .collect()
}

/// Waits until Cluster API has finished the upgrade of `name` to `version`: no hook pending, the control plane
/// at the version, `TopologyReconciled` True.
pub async fn upgrade_finished(
    clusters: &Api<DynamicObject>,
    control_planes: &Api<DynamicObject>,
    key: &str,
    version: &str,
    log: &Path,
    what: &str,
    cluster_api: &ClusterApi,
) {
    let limit = UPGRADE_LIMIT;
    let name = key.split_once('/').unwrap().1;
    let deadline = std::time::Instant::now() + limit;
    loop {
        let cluster = serde_json::to_value(clusters.get(name).await.unwrap()).unwrap();
        let pending = cluster
            .pointer("/metadata/annotations/runtime.cluster.x-k8s.io~1pending-hooks")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let kcp_name = cluster
            .pointer("/spec/controlPlaneRef/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let kcp = control_planes
            .get_opt(kcp_name)
            .await
            .unwrap()
            .map(|k| serde_json::to_value(k).unwrap());
        let reached = kcp
            .as_ref()
            .and_then(|k| k.pointer("/status/version"))
            .and_then(Value::as_str)
            == Some(version);
        let reconciled = cluster
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "TopologyReconciled" && c["status"] == "True");
        if pending.is_empty() && reached && reconciled {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not finished after {limit:?} (pending hooks {pending:?}, control plane at {version}: {reached}, \
             TopologyReconciled: {reconciled}); hook answers: {:?}\nconditions: {}\ncore manager:\n{}",
            answers(log, key),
            cluster.pointer("/status/conditions").cloned().unwrap_or_default(),
            cluster_api.log_tail(Provider::Core)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
