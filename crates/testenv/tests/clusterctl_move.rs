//! `clusterctl move` (Cluster API v1.14's, the release of the managers) between two management control planes,
//! each with Cluster API's four managers running as `cso_testenv::capi` starts them: the source on loopback, the
//! target in a network namespace of its own (the Docker/Dev provider binds port 19000 on every interface, so a
//! second one needs a network of its own), both prepared as `clusterctl init` would have left them
//! (`cso_testenv::clusterctl::prepare`), with Kubernetes' garbage collector (kube-controller-manager with that
//! controller alone: Cluster API leaves it a dangling owner reference on every new Cluster's infrastructure
//! cluster and control plane, and move moves nothing with an owner it cannot find), a provider stand-in on each,
//! and one workload API server both planes' managers reach.
//!
//! A topology Cluster of ferrol's v1beta1 ClusterClass (as `tests/cluster_api.rs` renders and applies it; no
//! workers, so no Machine: with the stand-in no Machine would ever get the `nodeRef` move wants) is refused
//! while it provisions, and moved once it is provisioned and its control plane initialised: afterwards the
//! Cluster, its class and the class's templates, the topology's objects and the kubeconfig Secret are on the
//! target (new UIDs, unpaused) and gone from the source, and on the target the Cluster is provisioned and its
//! control plane initialised again (the move copies no status: the target's stand-in wrote it there, once the
//! move had unpaused the Cluster), with its topology reconciled by the target's Cluster API.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use cso_testenv::{
    Tools,
    capi::{ClusterApiTools, Options, TopologyCluster},
    clusterctl::Clusterctl,
    eventually,
    stand_in::StandIn,
};
use kube::{
    Api, ResourceExt,
    api::{DynamicObject, ListParams, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(60);
const CLASS: &str = "docker-ferrol-1-27-v1";
const VERSION: &str = "v1.27.3";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `helm template docker-ferrol-1-27 <ferrol v1's cluster-class chart> --namespace NS`, as the operator renders it.
fn render_ferrol_class(tools: &Tools, namespace: &str) -> Vec<Value> {
    let chart =
        repo().join("tests/fixtures/releases/docker-ferrol-1-27-v1/docker-ferrol-1-27-cluster-class-v1.tgz");
    tools
        .helm_template(&chart, "docker-ferrol-1-27", namespace)
        .unwrap()
}

async fn api(client: &kube::Client, api_version: &str, kind: &str, namespace: &str) -> Api<DynamicObject> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let (resource, _) = kube::discovery::pinned_kind(client, &GroupVersionKind::gvk(group, version, kind))
        .await
        .unwrap_or_else(|e| panic!("{api_version} {kind} is not served: {e}"));
    Api::namespaced_with(client.clone(), namespace, &resource)
}

/// The object, or `None` when there is none.
async fn get(client: &kube::Client, object: &ObjectRef, namespace: &str) -> Option<Value> {
    api(client, &object.api_version, &object.kind, namespace)
        .await
        .get_opt(&object.name)
        .await
        .unwrap()
        .map(|o| serde_json::to_value(o).unwrap())
}

/// An object the move must carry over.
#[derive(Clone, Debug)]
struct ObjectRef {
    api_version: String,
    kind: String,
    name: String,
}

impl ObjectRef {
    fn new(api_version: &str, kind: &str, name: &str) -> Self {
        ObjectRef {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
        }
    }

    /// From a v1beta2 reference: `{apiVersion, kind, name}` (a template) or `{apiGroup, kind, name}` (a Cluster's
    /// control plane or infrastructure), the latter read in `version`.
    fn from_reference(reference: &Value, version: &str) -> Self {
        let api_version = match reference.get("apiVersion").and_then(Value::as_str) {
            Some(api_version) => api_version.to_owned(),
            None => format!("{}/{version}", reference["apiGroup"].as_str().unwrap()),
        };
        ObjectRef::new(
            &api_version,
            reference["kind"].as_str().unwrap(),
            reference["name"].as_str().unwrap(),
        )
    }
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} {}", self.api_version, self.kind, self.name)
    }
}

fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn is_true(object: &Value, type_: &str) -> bool {
    condition(object, type_).is_some_and(|c| c["status"] == "True")
}

fn conditions(object: &Value) -> String {
    object
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| format!("{}={} ({})", c["type"], c["status"], c["reason"]))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Waits until the Cluster is provisioned, its control plane initialised and its topology reconciled (as move's
/// `checkProvisioningCompleted` wants it); returns it.
async fn provisioned(client: &kube::Client, namespace: &str, what: &str) -> Value {
    let clusters = api(client, "cluster.x-k8s.io/v1beta2", "Cluster", namespace).await;
    eventually(what, TIMEOUT, || async {
        let cluster = clusters
            .get_opt("c1")
            .await
            .map_err(|e| e.to_string())?
            .map(|c| serde_json::to_value(c).unwrap())
            .ok_or("no Cluster c1")?;
        let done = cluster.pointer("/status/initialization/infrastructureProvisioned") == Some(&json!(true))
            && cluster.pointer("/status/initialization/controlPlaneInitialized") == Some(&json!(true))
            && is_true(&cluster, "ControlPlaneInitialized")
            && is_true(&cluster, "TopologyReconciled");
        if done {
            Ok(cluster)
        } else {
            Err(format!(
                "status.initialization {}; conditions: {}",
                cluster.pointer("/status/initialization").unwrap_or(&Value::Null),
                conditions(&cluster)
            ))
        }
    })
    .await
}

#[tokio::test]
async fn clusterctl_moves_a_topology_cluster_with_its_class_to_a_second_management_cluster() {
    let started = Instant::now();
    let tools = Tools::discover().unwrap();
    let capi = ClusterApiTools::discover().unwrap();
    let mut clusterctl = Clusterctl::discover().unwrap();
    // For a closer look: CSO_TEST_CLUSTERCTL_V=5 lists every object moved.
    if let Some(level) = std::env::var("CSO_TEST_CLUSTERCTL_V")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        clusterctl.set_verbosity(level);
    }
    assert_eq!(
        clusterctl.version().await.unwrap(),
        capi.version,
        "clusterctl and the managers are one release"
    );

    // Two management planes with Cluster API, started side by side; a workload API server on the namespace's
    // bridge, which the managers of both reach.
    let planes = cso_testenv::clusterctl::MovePlanes::start(&tools, &capi, &Options::default())
        .await
        .unwrap();
    let (source, target, workload_plane) = (&planes.source, &planes.target, &planes.workload);
    let workload = planes.workload();
    eprintln!(
        "planes up in {:?}: source {} (Cluster API in {:?}), target {} in slot {} (Cluster API in {:?}), workload {}",
        started.elapsed(),
        source.control_plane.server_url(),
        source.cluster_api.started_in(),
        target.control_plane.server_url(),
        target.network.slot(),
        target.cluster_api.started_in(),
        workload_plane.server_url()
    );
    let from = source.control_plane.client().await.unwrap();
    let to = target.control_plane.client().await.unwrap();
    let source_gc = &planes.source_gc;

    // What `clusterctl init` would have left, on both.
    let prepared = &planes.prepared;
    for crd in [
        "clusters.cluster.x-k8s.io",
        "clusterclasses.cluster.x-k8s.io",
        "kubeadmconfigtemplates.bootstrap.cluster.x-k8s.io",
        "kubeadmcontrolplanes.controlplane.cluster.x-k8s.io",
        "dockerclusters.infrastructure.cluster.x-k8s.io",
    ] {
        assert!(
            prepared.labelled_crds.iter().any(|c| c == crd),
            "{crd}: {prepared:?}"
        );
    }
    assert!(
        !prepared
            .labelled_crds
            .iter()
            .any(|c| c.ends_with(".clusterstack.x-k8s.io") || c.starts_with("openstack")),
        "only the four providers' CRDs are labelled here: {:?}",
        prepared.labelled_crds
    );
    let (from_kubeconfig, to_kubeconfig) = (&planes.source_kubeconfig, &planes.target_kubeconfig);

    // ferrol's class in a namespace of the source, reconciled, and a Cluster of it.
    let ns = cso_testenv::namespace(&from, "move").await.unwrap();
    let params = PatchParams::apply("cso-test").force();
    for mut doc in render_ferrol_class(&tools, &ns) {
        doc["metadata"]["namespace"] = json!(ns);
        let api = api(
            &from,
            doc["apiVersion"].as_str().unwrap(),
            doc["kind"].as_str().unwrap(),
            &ns,
        )
        .await;
        api.patch(
            doc["metadata"]["name"].as_str().unwrap(),
            &params,
            &Patch::Apply(&doc),
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "Cluster API refused {} {}: {e}",
                doc["kind"], doc["metadata"]["name"]
            )
        });
    }
    let source_classes = api(&from, "cluster.x-k8s.io/v1beta2", "ClusterClass", &ns).await;
    let class = eventually("the ClusterClass reconciled on the source", TIMEOUT, || async {
        let class =
            serde_json::to_value(source_classes.get(CLASS).await.map_err(|e| e.to_string())?).unwrap();
        (class.pointer("/status/observedGeneration") == class.pointer("/metadata/generation")
            && is_true(&class, "VariablesReady"))
        .then_some(class.clone())
        .ok_or_else(|| conditions(&class))
    })
    .await;
    let cluster = TopologyCluster {
        namespace: &ns,
        name: "c1",
        api_version: "cluster.x-k8s.io/v1beta1",
        class: CLASS,
        class_namespace: None,
        version: VERSION,
        worker_class: "workeramd64",
        worker_replicas: 0,
        image_repository: Some("registry.k8s.io"),
    }
    .to_json();
    api(&from, "cluster.x-k8s.io/v1beta1", "Cluster", &ns)
        .await
        .create(&PostParams::default(), &serde_json::from_value(cluster).unwrap())
        .await
        .unwrap_or_else(|e| panic!("Cluster API refused the Cluster: {e}"));

    // Without a provider (no stand-in yet) nothing is provisioned, and move refuses before it changes anything.
    let refused = clusterctl
        .move_clusters(from_kubeconfig, to_kubeconfig, Some(&ns))
        .await
        .expect_err("move refuses a Cluster whose infrastructure is provisioning");
    eprintln!("refused while provisioning:\n{refused}");
    assert!(
        refused
            .to_string()
            .contains("is still provisioning the infrastructure"),
        "{refused}"
    );
    let source_clusters = api(&from, "cluster.x-k8s.io/v1beta2", "Cluster", &ns).await;
    let c1 = serde_json::to_value(source_clusters.get("c1").await.unwrap()).unwrap();
    assert!(
        c1.pointer("/spec/paused").is_none(),
        "a refused move pauses nothing: {c1}"
    );

    // The stand-in provisions it on the source; the target's stand-in runs from now on, for what arrives there.
    let source_stand_in = StandIn::start(from.clone(), workload.clone());
    let target_stand_in = StandIn::start(to.clone(), workload.clone());
    let cluster = provisioned(&from, &ns, "the Cluster provisioned on the source").await;
    let provisioned_at = Instant::now();
    // Cluster API gave the infrastructure cluster and the control plane a second owner while it created them
    // (the Secret `c1-shim`), deleted it once the Cluster owned both, and left the owner references to the
    // garbage collector: move moves nothing whose owner it cannot find (it would leave both, and the
    // kubeconfig Secret, behind).
    for reference in ["/spec/controlPlaneRef", "/spec/infrastructureRef"] {
        let object = ObjectRef::from_reference(cluster.pointer(reference).unwrap(), "v1beta2");
        eventually(
            &format!("{object} owned by the Cluster alone"),
            TIMEOUT,
            || async {
                let found = get(&from, &object, &ns).await.ok_or("gone")?;
                let owners = &found["metadata"]["ownerReferences"];
                let kinds: Vec<&str> = owners
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|o| o["kind"].as_str())
                    .collect();
                (kinds == ["Cluster"]).then_some(()).ok_or_else(|| {
                    format!(
                        "owners {owners}; the garbage collector's log:\n{}",
                        source_gc.log_tail()
                    )
                })
            },
        )
        .await;
    }
    assert_eq!(
        source_stand_in.log(),
        [format!("initialized {ns}/c1 at {VERSION}")]
    );

    // What must move: the class, its templates, the Cluster, its topology's objects and the kubeconfig Secret.
    let spec = &class["spec"];
    let mut moved = vec![
        ObjectRef::new("cluster.x-k8s.io/v1beta2", "ClusterClass", CLASS),
        ObjectRef::new("cluster.x-k8s.io/v1beta2", "Cluster", "c1"),
        ObjectRef::new("v1", "Secret", "c1-kubeconfig"),
    ];
    for pointer in [
        "/infrastructure/templateRef",
        "/controlPlane/templateRef",
        "/controlPlane/machineInfrastructure/templateRef",
    ] {
        moved.push(ObjectRef::from_reference(spec.pointer(pointer).unwrap(), ""));
    }
    for worker in spec["workers"]["machineDeployments"].as_array().unwrap() {
        moved.push(ObjectRef::from_reference(&worker["bootstrap"]["templateRef"], ""));
        moved.push(ObjectRef::from_reference(
            &worker["infrastructure"]["templateRef"],
            "",
        ));
    }
    moved.push(ObjectRef::from_reference(
        &cluster["spec"]["controlPlaneRef"],
        "v1beta2",
    ));
    moved.push(ObjectRef::from_reference(
        &cluster["spec"]["infrastructureRef"],
        "v1beta2",
    ));
    let deployments = api(&from, "cluster.x-k8s.io/v1beta2", "MachineDeployment", &ns).await;
    for deployment in deployments
        .list(&ListParams::default().labels("cluster.x-k8s.io/cluster-name=c1"))
        .await
        .unwrap()
    {
        moved.push(ObjectRef::new(
            "cluster.x-k8s.io/v1beta2",
            "MachineDeployment",
            &deployment.name_any(),
        ));
    }
    // The class's templates may be shared (one machine template for the control plane and the workers).
    let mut seen = std::collections::BTreeSet::new();
    moved.retain(|o| seen.insert((o.kind.clone(), o.name.clone())));
    let mut kinds: Vec<&str> = moved.iter().map(|o| o.kind.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    assert_eq!(
        kinds,
        [
            "Cluster",
            "ClusterClass",
            "DockerCluster",
            "DockerClusterTemplate",
            "DockerMachineTemplate",
            "KubeadmConfigTemplate",
            "KubeadmControlPlane",
            "KubeadmControlPlaneTemplate",
            "MachineDeployment",
            "Secret"
        ],
        "{moved:?}"
    );
    let mut source_uids = Vec::new();
    for object in &moved {
        let found = get(&from, object, &ns).await;
        source_uids
            .push(found.unwrap_or_else(|| panic!("{object} on the source"))["metadata"]["uid"].clone());
    }

    // The move.
    let move_started = Instant::now();
    let output = clusterctl
        .move_clusters(from_kubeconfig, to_kubeconfig, Some(&ns))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let move_took = move_started.elapsed();
    eprintln!("clusterctl move in {move_took:?}:\n{output}");
    assert!(output.contains("Moving Cluster API objects"), "{output}");

    // Everything on the target, new objects; nothing left on the source.
    for (object, source_uid) in moved.iter().zip(&source_uids) {
        let on_target = get(&to, object, &ns)
            .await
            .unwrap_or_else(|| panic!("{object} is not on the target"));
        assert_ne!(
            &on_target["metadata"]["uid"], source_uid,
            "{object} on the target is a new object"
        );
        assert!(
            get(&from, object, &ns).await.is_none(),
            "{object} is still on the source"
        );
    }
    let target_cluster = get(&to, &moved[1], &ns).await.unwrap();
    assert!(
        target_cluster.pointer("/spec/paused").is_none_or(|p| p == false),
        "the moved Cluster runs: {}",
        target_cluster["spec"]
    );
    let target_class = get(&to, &moved[0], &ns).await.unwrap();
    assert!(
        target_class
            .pointer("/metadata/annotations/cluster.x-k8s.io~1paused")
            .is_none(),
        "the moved ClusterClass is not paused: {}",
        target_class["metadata"]
    );
    assert_eq!(target_cluster["spec"]["topology"]["classRef"]["name"], CLASS);

    // On the target the Cluster is provisioned and initialised again: no status moved, the target's stand-in
    // wrote its providers' part once the Cluster ran, and the target's Cluster API took it from there.
    let again = provisioned(&to, &ns, "the moved Cluster provisioned on the target").await;
    let reinitialized = move_started.elapsed();
    assert_eq!(
        target_stand_in.log(),
        [format!("initialized {ns}/c1 at {VERSION}")],
        "the target's stand-in initialised the moved control plane (its status did not move); last error: {:?}",
        target_stand_in.last_error()
    );
    assert_eq!(
        source_stand_in.log(),
        [format!("initialized {ns}/c1 at {VERSION}")],
        "the source's stand-in did nothing more"
    );
    let control_plane = moved.iter().find(|o| o.kind == "KubeadmControlPlane").unwrap();
    let control_plane = get(&to, control_plane, &ns).await.unwrap();
    assert_eq!(control_plane["status"]["version"], VERSION);
    assert_eq!(again["spec"]["topology"]["version"], VERSION);
    // The source still has the namespace (move does not delete namespaces), and no Cluster anywhere else.
    assert!(
        api(&from, "cluster.x-k8s.io/v1beta2", "Cluster", &ns)
            .await
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    eprintln!(
        "provisioned on the source {:?} after the start; moved in {move_took:?}; provisioned again on the target \
         {reinitialized:?} after the move began ({:?} after the source had it); all in {:?}",
        provisioned_at.duration_since(started),
        provisioned_at.elapsed(),
        started.elapsed()
    );
    drop((source_stand_in, target_stand_in));
    drop(planes);
}
