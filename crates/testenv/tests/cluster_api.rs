//! Cluster API itself against the stacks' ClusterClasses (issue 13, "Done when" (a)): the managers of the
//! release `make tools` built (v1.14.x) run on a control plane of their own, with the release's CRDs (v1beta1
//! and v1beta2 served, conversion webhooks wired to the managers) and admission webhooks, plus the CRDs of
//! Cluster API Provider OpenStack v0.14.7 (no CAPO manager: its webhooks are absent). The ClusterClasses of
//! ferrol (v1beta1), docker scs 1.34 (v1beta1, the 2026 build), docker scs 1.35 (v1beta2) and openstack scs
//! 1.35 (a v1beta2 class with CAPO's v1beta1 OpenStack templates) are rendered as the operator renders them
//! and applied server-side; Cluster API must accept every object, reconcile the ClusterClass, accept a
//! Cluster built from it and report `TopologyReconciled=True`.
//!
//! The kubeadm and Docker providers run for their webhooks and conversions only (there are no machines here):
//! `TopologyReconciled=True` needs no provider controller, because Cluster API v1.14 creates the whole
//! topology (infrastructure cluster, control plane, MachineDeployments) in its first reconcile and reports
//! it reconciled while the control plane has not reported a version yet (MachineDeployments are held back
//! only when they are added to a provisioning or upgrading control plane).
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use cso_testenv::{
    capi::{Provider, TopologyCluster, shared_management_with_cluster_api},
    usage::Usage,
};
use kube::{
    Api,
    api::{DynamicObject, Patch, PatchParams, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(90);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `helm template RELEASE CHART --namespace NS`, as the operator renders a cluster-class chart.
fn render(chart: &Path, release: &str, namespace: &str) -> Vec<Value> {
    cso_testenv::Tools::discover()
        .unwrap()
        .helm_template(chart, release, namespace)
        .unwrap()
}

async fn api_for(
    client: &kube::Client,
    api_version: &str,
    kind: &str,
    namespace: &str,
) -> Api<DynamicObject> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, _) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("{api_version} {kind} is not served: {e}"));
    Api::namespaced_with(client.clone(), namespace, &resource)
}

/// The newest version of a kind that the server serves (`apiGroup` + `kind` references).
async fn api_for_group_kind(
    client: &kube::Client,
    group: &str,
    kind: &str,
    namespace: &str,
) -> Api<DynamicObject> {
    let group_info = kube::discovery::group(client, group).await.unwrap();
    let (resource, _): (ApiResource, _) = group_info
        .recommended_kind(kind)
        .unwrap_or_else(|| panic!("{group} {kind} is not served"));
    Api::namespaced_with(client.clone(), namespace, &resource)
}

/// Applies every rendered object server-side into `namespace`; the messages of the objects Cluster API
/// refused.
async fn apply_all(client: &kube::Client, namespace: &str, docs: &[Value]) -> Vec<String> {
    let params = PatchParams::apply("cso-test").force();
    let mut refused = Vec::new();
    for doc in docs {
        let mut doc = doc.clone();
        doc["metadata"]["namespace"] = json!(namespace);
        let api_version = doc["apiVersion"].as_str().unwrap().to_owned();
        let kind = doc["kind"].as_str().unwrap().to_owned();
        let name = doc["metadata"]["name"].as_str().unwrap().to_owned();
        let api = api_for(client, &api_version, &kind, namespace).await;
        if let Err(e) = api.patch(&name, &params, &Patch::Apply(&doc)).await {
            refused.push(format!("{api_version} {kind} {name}: {e}"));
        }
    }
    refused
}

fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn describe_conditions(object: &Value) -> String {
    object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{}={} ({}) {}",
                c["type"].as_str().unwrap_or_default(),
                c["status"].as_str().unwrap_or_default(),
                c["reason"].as_str().unwrap_or_default(),
                c["message"].as_str().unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("\n  ")
}

async fn get(api: &Api<DynamicObject>, name: &str) -> Option<Value> {
    api.get_opt(name)
        .await
        .unwrap()
        .map(|o| serde_json::to_value(o).unwrap())
}

/// How long `TopologyReconciled=True` must hold, with every object of the topology in place, to count: the
/// topology controller reconciles again on the events of the objects it created.
const STABLE: Duration = Duration::from_secs(3);

/// Waits until Cluster API has set the Cluster's control-plane and infrastructure references, created a
/// MachineDeployment for it, and `TopologyReconciled` has been True for [`STABLE`] since. Returns the
/// Cluster (v1beta2) and every state `TopologyReconciled` went through.
async fn topology_reconciled(client: &kube::Client, ns: &str, name: &str) -> (Value, Vec<String>) {
    let env = shared_management_with_cluster_api();
    let clusters = api_for(client, "cluster.x-k8s.io/v1beta2", "Cluster", ns).await;
    let deployments = api_for(client, "cluster.x-k8s.io/v1beta2", "MachineDeployment", ns).await;
    let deadline = Instant::now() + TIMEOUT;
    let mut transitions: Vec<String> = Vec::new();
    let mut true_since: Option<Instant> = None;
    loop {
        let cluster = get(&clusters, name).await.expect("the Cluster exists");
        let topology = condition(&cluster, "TopologyReconciled");
        if let Some(c) = topology {
            let seen = format!(
                "{} ({}) {}",
                c["status"].as_str().unwrap_or_default(),
                c["reason"].as_str().unwrap_or_default(),
                c["message"].as_str().unwrap_or_default()
            );
            if transitions.last() != Some(&seen) {
                transitions.push(seen);
            }
        }
        let has_refs = ["/spec/controlPlaneRef/name", "/spec/infrastructureRef/name"]
            .iter()
            .all(|p| cluster.pointer(p).is_some());
        let label = format!("cluster.x-k8s.io/cluster-name={name}");
        let has_deployment = !deployments
            .list(&kube::api::ListParams::default().labels(&label))
            .await
            .unwrap()
            .items
            .is_empty();
        if has_refs && has_deployment && topology.is_some_and(|c| c["status"] == "True") {
            let since = *true_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= STABLE {
                return (cluster, transitions);
            }
        } else {
            true_since = None;
        }
        assert!(
            Instant::now() < deadline,
            "Cluster {ns}/{name}: no TopologyReconciled=True with its objects after {TIMEOUT:?} (references set: \
             {has_refs}, MachineDeployment: {has_deployment}); TopologyReconciled went\n  {}\nconditions:\n  {}\n\
             core manager:\n{}",
            transitions.join("\n  "),
            describe_conditions(&cluster),
            env.cluster_api.log_tail(Provider::Core)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

struct Stack {
    /// The cluster-class chart (`.tgz`).
    chart: PathBuf,
    /// The Helm release name the operator renders it with (`ReleaseId::stack_prefix`).
    release: &'static str,
    /// The ClusterClass it renders.
    class: &'static str,
    /// The kind of the infrastructure cluster the topology creates.
    infrastructure: &'static str,
    /// The Cluster's `topology.version`: what the control plane and the MachineDeployment get.
    version: &'static str,
    /// The Cluster, from its namespace and name.
    cluster: fn(&str, &str) -> Value,
}

fn ferrol() -> Stack {
    Stack {
        chart: repo()
            .join("tests/fixtures/releases/docker-ferrol-1-27-v1/docker-ferrol-1-27-cluster-class-v1.tgz"),
        release: "docker-ferrol-1-27",
        class: "docker-ferrol-1-27-v1",
        infrastructure: "DockerCluster",
        version: "v1.27.3",
        cluster: |ns, name| ferrol_cluster(ns, name, "registry.k8s.io"),
    }
}

/// tests/fixtures/releases/docker-ferrol-1-27-v1/topology-docker.yaml in the test's namespace, with the value
/// of the class's required variable `imageRepository` (the example sets `""`).
fn ferrol_cluster(ns: &str, name: &str, image_repository: &str) -> Value {
    TopologyCluster {
        namespace: ns,
        name,
        api_version: "cluster.x-k8s.io/v1beta1",
        class: "docker-ferrol-1-27-v1",
        class_namespace: None,
        version: "v1.27.3",
        worker_class: "workeramd64",
        worker_replicas: 1,
        image_repository: Some(image_repository),
    }
    .to_json()
}

/// In a new namespace: renders and applies the stack's ClusterClass (every object must be accepted) and
/// waits until Cluster API has reconciled it. Returns a client and the namespace.
async fn install_class(stack: &Stack, prefix: &str) -> (kube::Client, String) {
    let env = shared_management_with_cluster_api();
    let client = env.control_plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, prefix).await.unwrap();
    let core_log = || env.cluster_api.log_tail(Provider::Core);

    // 1. The rendered ClusterClass and templates, accepted by the webhooks (and converted to v1beta2).
    let docs = render(&stack.chart, stack.release, &ns);
    assert!(docs.len() >= 5, "the chart renders a class and its templates");
    let refused = apply_all(&client, &ns, &docs).await;
    assert!(
        refused.is_empty(),
        "Cluster API refused objects of {}:\n{}",
        stack.class,
        refused.join("\n")
    );

    // 2. The ClusterClass is reconciled: read in v1beta2, whatever version it was written in.
    let classes = api_for(&client, "cluster.x-k8s.io/v1beta2", "ClusterClass", &ns).await;
    let deadline = Instant::now() + TIMEOUT;
    let class = loop {
        let class = get(&classes, stack.class).await.expect("the ClusterClass exists");
        let reconciled = class.pointer("/status/observedGeneration") == class.pointer("/metadata/generation")
            && condition(&class, "VariablesReady").is_some_and(|c| c["status"] == "True");
        if reconciled {
            break class;
        }
        assert!(
            Instant::now() < deadline,
            "ClusterClass {} not reconciled after {TIMEOUT:?}:\n  {}\ncore manager:\n{}",
            stack.class,
            describe_conditions(&class),
            core_log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!(
        "ClusterClass {} (v1beta2 view):\n  {}\n  refs: {}",
        stack.class,
        describe_conditions(&class),
        serde_json::to_string(&class["spec"]["infrastructure"]).unwrap()
    );
    (client, ns)
}

/// Creates a Cluster from the value `make` builds (the webhooks must accept it).
async fn create_cluster(client: &kube::Client, ns: &str, cluster: Value, class: &str) {
    let api_version = cluster["apiVersion"].as_str().unwrap().to_owned();
    let api = api_for(client, &api_version, "Cluster", ns).await;
    let object: DynamicObject = serde_json::from_value(cluster).unwrap();
    if let Err(e) = api.create(&PostParams::default(), &object).await {
        panic!("Cluster API refused a {api_version} Cluster of class {class}: {e}");
    }
}

/// Renders and applies the stack's ClusterClass, waits until Cluster API has reconciled it, creates a
/// Cluster from it and waits for `TopologyReconciled=True`, standing in for the control-plane provider.
async fn class_is_accepted_and_topology_reconciled(stack: Stack, prefix: &str) {
    let env = shared_management_with_cluster_api();
    let (client, ns) = install_class(&stack, prefix).await;

    // 3. A Cluster from the class, accepted by the webhooks.
    let name = "c1";
    create_cluster(&client, &ns, (stack.cluster)(&ns, name), stack.class).await;

    // 4. Cluster API creates the topology and reports it reconciled.
    let (cluster, transitions) = topology_reconciled(&client, &ns, name).await;
    eprintln!(
        "Cluster {ns}/{name} of class {}: TopologyReconciled went\n  {}\nconditions:\n  {}",
        stack.class,
        transitions.join("\n  "),
        describe_conditions(&cluster)
    );
    assert!(
        transitions.iter().all(|t| t.starts_with("True")),
        "TopologyReconciled was not always True: {transitions:?}"
    );

    // 5. What the topology made: the infrastructure cluster and a MachineDeployment of the class's worker class.
    let infra = cluster
        .pointer("/spec/infrastructureRef")
        .expect("an infrastructure reference");
    assert_eq!(infra["kind"], stack.infrastructure);
    let control_plane = cluster.pointer("/spec/controlPlaneRef").unwrap();
    assert_eq!(control_plane["kind"], "KubeadmControlPlane");
    let control_planes = api_for_group_kind(
        &client,
        control_plane["apiGroup"].as_str().unwrap(),
        "KubeadmControlPlane",
        &ns,
    )
    .await;
    let control_plane = get(&control_planes, control_plane["name"].as_str().unwrap())
        .await
        .expect("the KubeadmControlPlane exists");
    assert_eq!(control_plane["spec"]["version"], stack.version);
    let deployments = api_for(&client, "cluster.x-k8s.io/v1beta2", "MachineDeployment", &ns).await;
    let list = deployments.list(&Default::default()).await.unwrap();
    assert_eq!(list.items.len(), 1, "one MachineDeployment (md-0)");
    let deployment = serde_json::to_value(&list.items[0]).unwrap();
    assert_eq!(deployment["spec"]["template"]["spec"]["version"], stack.version);

    let usage: Vec<String> = env
        .cluster_api
        .pids()
        .into_iter()
        .map(|(provider, pid)| {
            let usage = Usage::of(Some(pid)).unwrap_or_default();
            format!(
                "{}: {} MiB (peak {} MiB), {:?} CPU",
                provider.name(),
                usage.rss_kib / 1024,
                usage.peak_rss_kib / 1024,
                usage.cpu
            )
        })
        .collect();
    eprintln!(
        "Cluster API {} started in {:?}; managers: {}",
        env.cluster_api.version(),
        env.cluster_api.started_in(),
        usage.join("; ")
    );
}

#[tokio::test]
async fn ferrol_v1beta1_class_is_accepted_and_its_cluster_topology_reconciled() {
    class_is_accepted_and_topology_reconciled(ferrol(), "capi-ferrol").await;
}

/// Ferrol's own example topology sets the required variable `imageRepository` to `""`, and the class's patch
/// (`enabledIf: 'true'`) copies it into the KubeadmControlPlane, whose schema wants at least one character
/// (`minLength: 1` in v1.14's v1beta1 and v1beta2 and already in v1.10's v1beta1): Cluster API accepts the
/// Cluster but cannot create its control plane, and says so in `TopologyReconciled`.
#[tokio::test]
async fn ferrol_example_topology_with_an_empty_image_repository_is_refused_at_the_control_plane() {
    empty_image_repository_is_refused_at_the_control_plane(ferrol(), "capi-ferrol-empty", |ns| {
        ferrol_cluster(ns, "c0", "")
    })
    .await;
}

/// Installs the stack's class, creates the Cluster `c0` (from its namespace) whose `imageRepository` ends up
/// `""`, and expects Cluster API to accept the Cluster but fail to create its KubeadmControlPlane.
async fn empty_image_repository_is_refused_at_the_control_plane(
    stack: Stack,
    prefix: &str,
    cluster: fn(&str) -> Value,
) {
    let (client, ns) = install_class(&stack, prefix).await;
    create_cluster(&client, &ns, cluster(&ns), stack.class).await;
    let clusters = api_for(&client, "cluster.x-k8s.io/v1beta2", "Cluster", &ns).await;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let cluster = get(&clusters, "c0").await.unwrap();
        if let Some(c) = condition(&cluster, "TopologyReconciled")
            && c["reason"] == "ReconcileFailed"
        {
            let message = c["message"].as_str().unwrap();
            eprintln!(
                "Cluster {ns}/c0 of {} with imageRepository \"\": {message}",
                stack.class
            );
            assert_eq!(c["status"], "False");
            assert!(
                message.contains("failed to create KubeadmControlPlane")
                    && message.contains(
                        "spec.kubeadmConfigSpec.clusterConfiguration.imageRepository in body should be at least 1 chars long"
                    ),
                "{message}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no ReconcileFailed for the empty imageRepository:\n  {}",
            describe_conditions(&cluster)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn scs_1_35_v1beta2_class_is_accepted_and_its_cluster_topology_reconciled() {
    class_is_accepted_and_topology_reconciled(
        Stack {
            chart: repo()
                .join("tests/fixtures/releases-2026/docker-scs-1-35-v1/docker-scs-1-35-cluster-class-v1.tgz"),
            release: "docker-scs-1-35",
            class: "docker-scs-1-35-v1",
            infrastructure: "DockerCluster",
            version: "v1.35.1",
            cluster: |ns, name| {
                TopologyCluster {
                    namespace: ns,
                    name,
                    api_version: "cluster.x-k8s.io/v1beta2",
                    class: "docker-scs-1-35-v1",
                    class_namespace: None,
                    version: "v1.35.1",
                    worker_class: "default-worker",
                    worker_replicas: 1,
                    image_repository: None,
                }
                .to_json()
            },
        },
        "capi-scs",
    )
    .await;
}

/// The 2026 build of docker scs 1.34: every object `v1beta1`, rendered with `namespace: <release namespace>`
/// (its references carry the namespace too), beside the `v1beta2` 1.35 class.
///
/// The class defaults `imageRepository` to `""` and its patch `imageRepository` is `enabledIf: 'true'` (1.35
/// only enables it when the value is not empty), so a Cluster that leaves the default meets ferrol's refusal
/// (`imageRepository` must be at least 1 character in the KubeadmControlPlane): this Cluster sets the
/// variable's `example`, `registry.k8s.io`.
#[tokio::test]
async fn scs_1_34_v1beta1_class_is_accepted_and_its_cluster_topology_reconciled() {
    class_is_accepted_and_topology_reconciled(scs_1_34(), "capi-scs-1-34").await;
}

/// A Cluster of docker-scs-1-34-v1 that leaves `imageRepository` to the class's default `""`.
#[tokio::test]
async fn scs_1_34_default_image_repository_is_refused_at_the_control_plane() {
    empty_image_repository_is_refused_at_the_control_plane(scs_1_34(), "capi-scs-1-34-default", |ns| {
        scs_1_34_cluster(ns, "c0", None)
    })
    .await;
}

fn scs_1_34() -> Stack {
    Stack {
        chart: repo()
            .join("tests/fixtures/releases-2026/docker-scs-1-34-v1/docker-scs-1-34-cluster-class-v1.tgz"),
        release: "docker-scs-1-34",
        class: "docker-scs-1-34-v1",
        infrastructure: "DockerCluster",
        version: "v1.34.3",
        cluster: |ns, name| scs_1_34_cluster(ns, name, Some("registry.k8s.io")),
    }
}

/// A v1beta1 Cluster of docker-scs-1-34-v1 with `imageRepository` set, or left to the class's default.
fn scs_1_34_cluster(ns: &str, name: &str, image_repository: Option<&str>) -> Value {
    TopologyCluster {
        namespace: ns,
        name,
        api_version: "cluster.x-k8s.io/v1beta1",
        class: "docker-scs-1-34-v1",
        class_namespace: None,
        version: "v1.34.3",
        worker_class: "default-worker",
        worker_replicas: 1,
        image_repository,
    }
    .to_json()
}

/// The 2026 OpenStack stack: a `v1beta2` ClusterClass whose infrastructure templates are CAPO's `v1beta1`
/// OpenStackClusterTemplate and OpenStackMachineTemplates, rendered without a namespace. CAPO's CRDs are
/// installed with its contract label but no CAPO manager runs, so its templates pass the CRD schemas alone.
/// The topology controller only needs the templates to exist: a Cluster that sets no variable (every one has
/// a default or is optional) gets its OpenStackCluster, KubeadmControlPlane and MachineDeployment.
#[tokio::test]
async fn openstack_scs_1_35_class_with_capo_templates_is_accepted_and_its_cluster_topology_reconciled() {
    class_is_accepted_and_topology_reconciled(
        Stack {
            chart: repo().join(
                "tests/fixtures/releases-2026/openstack-scs-1-35-v1/openstack-scs-1-35-cluster-class-v1.tgz",
            ),
            release: "openstack-scs-1-35",
            class: "openstack-scs-1-35-v1",
            infrastructure: "OpenStackCluster",
            version: "v1.35.3",
            cluster: |ns, name| {
                TopologyCluster {
                    namespace: ns,
                    name,
                    api_version: "cluster.x-k8s.io/v1beta2",
                    class: "openstack-scs-1-35-v1",
                    class_namespace: None,
                    version: "v1.35.3",
                    worker_class: "default-worker",
                    worker_replicas: 1,
                    image_repository: None,
                }
                .to_json()
            },
        },
        "capi-openstack",
    )
    .await;
}

/// The admission webhooks are Cluster API's own, reached over loopback: a Cluster whose topology version is
/// not a semantic version passes the CRD schema, is defaulted by the core manager's mutating webhook (`1.35`
/// becomes `v1.35`) and denied by its validating webhook.
#[tokio::test]
async fn cluster_api_admission_webhooks_answer() {
    let env = shared_management_with_cluster_api();
    let client = env.control_plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "capi-webhooks").await.unwrap();
    let api = api_for(&client, "cluster.x-k8s.io/v1beta2", "Cluster", &ns).await;
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "bad-version", "namespace": ns},
        "spec": {"topology": {
            "classRef": {"name": "docker-scs-1-35-v1"},
            "version": "1.35",
            "controlPlane": {"replicas": 1}
        }}
    }))
    .unwrap();
    let error = api
        .create(&PostParams::default(), &cluster)
        .await
        .expect_err("a Cluster with version 1.35 is denied");
    let message = error.to_string();
    eprintln!("{message}");
    assert!(
        message.contains("admission webhook \"validation.cluster.cluster.x-k8s.io\" denied the request")
            && message.contains("Invalid value: \"v1.35\": version must be a valid semantic version"),
        "{message}"
    );
}
