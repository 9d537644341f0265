//! The provider side of Cluster API's contract, where a real provider would need machines: a stand-in for
//! the kubeadm control-plane provider and the infrastructure provider of each Cluster (Docker, OpenStack, or
//! any other: the kind is read from the Cluster's `spec.infrastructureRef`), so that the real Cluster API
//! core manager drives a Cluster through creation, control plane initialisation and (chained) upgrades and
//! calls every lifecycle hook, while the addons go to a real workload kube-apiserver.
//!
//! Each Cluster is backed by one workload kube-apiserver: the one given to [`StandIn::start`], or the one
//! [`StandIn::assign`]ed to that Cluster (assign before creating the Cluster: the kubeconfig Secret is written
//! once), so one stand-in serves several Clusters with a workload cluster each.
//!
//! It writes only what those providers write and Cluster API reads (`docs/cluster-api-contract.md`):
//!
//! - on a `KubeadmControlPlane` (v1beta2 contract): the Secret `<cluster>-kubeconfig` (type
//!   `cluster.x-k8s.io/secret`, label `cluster.x-k8s.io/cluster-name`, key `value`, owned by the control
//!   plane), pointing at the Cluster's workload kube-apiserver; then the status: `initialization.
//!   controlPlaneInitialized`, `version` (the `spec.version` it reaches, after [`StandIn::step_time`], which is
//!   how long an upgrade step of the control plane takes), and the replica counts;
//! - on the infrastructure cluster a Cluster's `spec.infrastructureRef` names (`DockerCluster`,
//!   `OpenStackCluster`, ..., read in its group's preferred version when that serves the kind, else in the
//!   newest that does: CAPO's kinds are `v1beta1` only): `spec.controlPlaneEndpoint` (the workload API
//!   server's host and port) and the provisioned status of the contract its API version speaks:
//!   `status.initialization.provisioned` for a `v1beta2` API (Docker), `status.ready` for a `v1beta1` API
//!   (CAPO v0.14's `OpenStackCluster`; it also writes `status.initialization.provisioned`, and so does the
//!   stand-in, where the schema has it).
//!
//! It never touches a Cluster, a MachineDeployment or anything else Cluster API itself writes, so what Cluster
//! API does next (conditions, hook calls, the next upgrade step) is Cluster API's own doing. Workers: use
//! MachineDeployments with `replicas: 0` (no Machine exists, so a worker upgrade completes when Cluster API
//! moves their version; with replicas the never-provisioned Machines would hold it forever, and `clusterctl
//! move` refuses a Machine without a `status.nodeRef`).
//!
//! Like a real provider, it leaves a paused Cluster alone (`spec.paused`, or the `cluster.x-k8s.io/paused`
//! annotation on the Cluster or on the object), and the objects of a Cluster that does not exist (yet). That
//! is what `clusterctl move` relies on: it pauses the Cluster on the source, copies the objects to the target
//! without their status (a status subresource is not written by a create) with the Cluster still paused,
//! deletes them from the source and only then unpauses the copy. A stand-in on each management cluster
//! (started on the target's client, before or after the move: it works from what it finds, so Clusters that
//! were there before it are served like new ones) therefore does nothing on either side during the move, and
//! on the target, once the Cluster runs, writes again what the providers would report there: the
//! infrastructure cluster provisioned and the control plane initialised (logged `initialized ns/cluster at
//! v1.33.4` again). The kubeconfig Secret moves with its control plane and is kept.
//!
//! What it did is kept in order ([`StandIn::log`]): `initialized ns/cluster at v1.33.4`, `upgraded ns/cluster
//! to v1.34.2`, so tests can check the sequence of control-plane steps against the hook calls.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
    core::ApiResource,
};
use serde_json::{Value, json};

const CLUSTER_NAME_LABEL: &str = "cluster.x-k8s.io/cluster-name";
const FIELD_MANAGER: &str = "cso-testenv-stand-in";
const POLL: Duration = Duration::from_millis(200);

/// The provider stand-in, running until dropped.
#[derive(Debug)]
pub struct StandIn {
    log: Arc<Mutex<Vec<String>>>,
    last_error: Arc<Mutex<Option<String>>>,
    workloads: Arc<Workloads>,
    task: tokio::task::JoinHandle<()>,
}

/// A workload cluster: where a Cluster's kubeconfig Secret and control-plane endpoint point.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The kubeconfig (YAML) of the workload kube-apiserver.
    pub kubeconfig: String,
    /// Its URL, `https://127.0.0.1:PORT`: the control-plane endpoint written into the infrastructure cluster.
    pub server_url: String,
}

impl StandIn {
    /// How long an upgrade step of the control plane takes (between `spec.version` changing and the status
    /// reaching it), so that "upgrading" is a state Cluster API sees.
    pub fn step_time() -> Duration {
        Duration::from_millis(500)
    }

    /// Starts standing in for the control-plane and infrastructure providers of every Cluster of the
    /// management cluster of `client`, each backed by `workload` unless [`Self::assign`]ed another.
    pub fn start(client: Client, workload: Workload) -> Self {
        let log = Arc::new(Mutex::new(Vec::new()));
        let workloads = Arc::new(Workloads {
            default: workload,
            assigned: Mutex::default(),
        });
        let last_error = Arc::new(Mutex::new(None));
        let task = tokio::spawn(run(client, workloads.clone(), log.clone(), last_error.clone()));
        StandIn {
            log,
            last_error,
            workloads,
            task,
        }
    }

    /// Backs the Cluster `namespace/cluster` by `workload` instead of the default one. Call it before the
    /// Cluster is created: its kubeconfig Secret is written once.
    pub fn assign(&self, namespace: &str, cluster: &str, workload: Workload) {
        self.workloads
            .assigned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(format!("{namespace}/{cluster}"), workload);
    }

    /// Why its last pass over the Clusters failed (it tries again), if it did: for a test's failure message.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// What it did, in order.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The default workload cluster and the ones assigned to single Clusters (`namespace/name`).
#[derive(Debug)]
struct Workloads {
    default: Workload,
    assigned: Mutex<HashMap<String, Workload>>,
}

impl Workloads {
    /// The workload cluster of the Cluster `key` (`namespace/name`).
    fn of(&self, key: &str) -> Workload {
        self.assigned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .unwrap_or(&self.default)
            .clone()
    }
}

async fn run(
    client: Client,
    workloads: Arc<Workloads>,
    log: Arc<Mutex<Vec<String>>>,
    last_error: Arc<Mutex<Option<String>>>,
) {
    let mut upgrading: HashMap<String, (String, tokio::time::Instant)> = Default::default();
    let mut resources: HashMap<(String, String), ApiResource> = Default::default();
    loop {
        let result = pass(&client, &workloads, &log, &mut upgrading, &mut resources).await;
        *last_error.lock().unwrap_or_else(|p| p.into_inner()) =
            result.as_ref().err().map(ToString::to_string);
        if let Err(e) = result {
            tracing::debug!(error = %e, "stand-in pass failed; trying again");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The served version of `group`'s `kind` Cluster API picks: the group's preferred version when it serves
/// the kind, else the first (newest) that does (CAPO's kinds are `v1beta1` only, in a group whose preferred
/// version is Docker's `v1beta2`); asked once per kind.
async fn resource(
    client: &Client,
    known: &mut HashMap<(String, String), ApiResource>,
    group: &str,
    kind: &str,
) -> Result<ApiResource, kube::Error> {
    let key = (group.to_owned(), kind.to_owned());
    if let Some(resource) = known.get(&key) {
        return Ok(resource.clone());
    }
    let discovered = kube::discovery::group(client, group).await?;
    let preferred = discovered.preferred_version_or_latest().to_owned();
    let resource = std::iter::once(preferred.as_str())
        .chain(discovered.versions())
        .find_map(|version| {
            discovered
                .versioned_resources(version)
                .into_iter()
                .find(|(resource, _)| resource.kind == kind)
        })
        .map(|(resource, _)| resource)
        .ok_or_else(|| kube::Error::Discovery(kube::error::DiscoveryError::MissingKind(kind.to_owned())))?;
    known.insert(key, resource.clone());
    Ok(resource)
}

/// The annotation that pauses Cluster API's reconciliation of one object (or of a whole Cluster).
const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";

/// Whether Cluster API's providers leave this object alone: the annotation on it (a Cluster's `spec.paused` is
/// read with [`cluster_paused`]).
fn annotated_paused(object: &DynamicObject) -> bool {
    object.annotations().contains_key(PAUSED_ANNOTATION)
}

/// Whether a Cluster is paused: `spec.paused` (as `clusterctl move` pauses it) or the annotation.
fn cluster_paused(cluster: &DynamicObject) -> bool {
    cluster.data.pointer("/spec/paused") == Some(&json!(true)) || annotated_paused(cluster)
}

/// The group and kind of a Cluster's `spec.infrastructureRef`: `apiGroup` (v1beta2) or the group of
/// `apiVersion` (v1beta1).
fn infrastructure_ref(cluster: &Value) -> Option<(String, String, String)> {
    let reference = cluster.pointer("/spec/infrastructureRef")?;
    let group = match reference.get("apiGroup").and_then(Value::as_str) {
        Some(group) => group.to_owned(),
        None => reference
            .get("apiVersion")
            .and_then(Value::as_str)?
            .rsplit_once('/')
            .map_or("", |(group, _)| group)
            .to_owned(),
    };
    let kind = reference.get("kind").and_then(Value::as_str)?.to_owned();
    let name = reference.get("name").and_then(Value::as_str)?.to_owned();
    Some((group, kind, name))
}

/// The provisioned status of an infrastructure cluster served in `version`, and where Cluster API reads it:
/// the v1beta2 contract's `initialization.provisioned`, or the v1beta1 contract's `ready` (with
/// `initialization.provisioned` beside it, as CAPO v0.14 writes; pruned where the schema lacks it).
fn provisioned_status(version: &str) -> (&'static str, Value) {
    if version == "v1beta1" {
        (
            "/status/ready",
            json!({"ready": true, "initialization": {"provisioned": true}}),
        )
    } else {
        (
            "/status/initialization/provisioned",
            json!({"initialization": {"provisioned": true}}),
        )
    }
}

async fn pass(
    client: &Client,
    workloads: &Workloads,
    log: &Mutex<Vec<String>>,
    upgrading: &mut HashMap<String, (String, tokio::time::Instant)>,
    resources: &mut HashMap<(String, String), ApiResource>,
) -> Result<(), kube::Error> {
    let record = |line: String| log.lock().unwrap_or_else(|p| p.into_inner()).push(line);

    // Infrastructure: each Cluster's infrastructure cluster provisioned, with its workload API server as the
    // control-plane endpoint.
    // One Cluster whose infrastructure cannot be served does not hold the others up.
    let clusters = resource(client, resources, "cluster.x-k8s.io", "Cluster").await?;
    let mut failed = None;
    // The running Clusters (`namespace/name`): a paused one, and the objects of one that does not exist, are
    // left alone, as a provider leaves them.
    let mut running = std::collections::HashSet::new();
    for cluster in Api::<DynamicObject>::all_with(client.clone(), &clusters)
        .list(&ListParams::default())
        .await?
    {
        if cluster_paused(&cluster) {
            continue;
        }
        running.insert(format!(
            "{}/{}",
            cluster.namespace().unwrap_or_default(),
            cluster.name_any()
        ));
        if let Err(e) = provision(client, workloads, resources, &cluster).await {
            failed.get_or_insert(e);
        }
    }

    // Control planes: kubeconfig Secret, initialised, and at their spec.version after a step's time.
    let control_plane = resource(
        client,
        resources,
        "controlplane.cluster.x-k8s.io",
        "KubeadmControlPlane",
    )
    .await?;
    for kcp in Api::<DynamicObject>::all_with(client.clone(), &control_plane)
        .list(&ListParams::default())
        .await?
    {
        let namespace = kcp.namespace().unwrap_or_default();
        let namespace = namespace.as_str();
        let control_planes: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &control_plane);
        let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let value = serde_json::to_value(&kcp).unwrap_or_default();
        let Some(cluster) = kcp.labels().get(CLUSTER_NAME_LABEL).cloned() else {
            continue;
        };
        let Some(wanted) = value
            .pointer("/spec/version")
            .and_then(Value::as_str)
            .map(str::to_owned)
        else {
            continue;
        };
        let key = format!("{namespace}/{cluster}");
        if !running.contains(&key) || annotated_paused(&kcp) {
            continue;
        }
        let secret_name = format!("{cluster}-kubeconfig");
        if secrets.get_opt(&secret_name).await?.is_none() {
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(secret_name.clone()),
                    namespace: Some(namespace.to_owned()),
                    labels: Some([(CLUSTER_NAME_LABEL.to_owned(), cluster.clone())].into()),
                    owner_references: Some(vec![
                        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                            api_version: control_plane.api_version.clone(),
                            kind: control_plane.kind.clone(),
                            name: kcp.name_any(),
                            uid: kcp.uid().unwrap_or_default(),
                            controller: Some(true),
                            block_owner_deletion: Some(true),
                        },
                    ]),
                    ..Default::default()
                },
                type_: Some("cluster.x-k8s.io/secret".into()),
                string_data: Some([("value".to_owned(), workloads.of(&key).kubeconfig)].into()),
                ..Default::default()
            };
            match secrets.create(&PostParams::default(), &secret).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        let initialized =
            value.pointer("/status/initialization/controlPlaneInitialized") == Some(&json!(true));
        let reached = value.pointer("/status/version").and_then(Value::as_str);
        if initialized && reached == Some(wanted.as_str()) {
            upgrading.remove(&key);
            continue;
        }
        if initialized {
            // An upgrade step: it takes a step's time.
            let started = upgrading
                .entry(key.clone())
                .or_insert_with(|| (wanted.clone(), tokio::time::Instant::now()));
            if started.0 != wanted {
                *started = (wanted.clone(), tokio::time::Instant::now());
            }
            if started.1.elapsed() < StandIn::step_time() {
                continue;
            }
        }
        let replicas = value
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .unwrap_or(1);
        let status = json!({"status": {
            "initialization": {"controlPlaneInitialized": true},
            "version": wanted,
            "replicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
            "upToDateReplicas": replicas,
            "selector": format!("{CLUSTER_NAME_LABEL}={cluster},cluster.x-k8s.io/control-plane"),
        }});
        control_planes
            .patch_status(
                &kcp.name_any(),
                &PatchParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..Default::default()
                },
                &Patch::Merge(status),
            )
            .await?;
        upgrading.remove(&key);
        record(if initialized {
            format!("upgraded {key} to {wanted}")
        } else {
            format!("initialized {key} at {wanted}")
        });
    }
    failed.map_or(Ok(()), Err)
}

/// The infrastructure cluster of `cluster` provisioned, with its workload API server as the control-plane
/// endpoint.
async fn provision(
    client: &Client,
    workloads: &Workloads,
    resources: &mut HashMap<(String, String), ApiResource>,
    cluster: &DynamicObject,
) -> Result<(), kube::Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let Some((group, kind, name)) = infrastructure_ref(&serde_json::to_value(cluster).unwrap_or_default())
    else {
        return Ok(());
    };
    let infra = resource(client, resources, &group, &kind).await?;
    let infra_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &infra);
    let Some(object) = infra_api.get_opt(&name).await? else {
        return Ok(());
    };
    if annotated_paused(&object) {
        return Ok(());
    }
    let workload = workloads.of(&format!("{namespace}/{}", cluster.name_any()));
    let (host, port) = endpoint(&workload.server_url);
    let value = serde_json::to_value(&object).unwrap_or_default();
    if value.pointer("/spec/controlPlaneEndpoint") != Some(&json!({"host": host, "port": port})) {
        infra_api
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"controlPlaneEndpoint": {"host": host, "port": port}}})),
            )
            .await?;
    }
    let (path, status) = provisioned_status(&infra.version);
    if value.pointer(path) != Some(&json!(true)) {
        infra_api
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await?;
    }
    Ok(())
}

/// The host and port of `https://HOST:PORT`.
fn endpoint(server_url: &str) -> (String, i64) {
    let rest = server_url
        .trim_start_matches("https://")
        .trim_start_matches("http://")
        .trim_end_matches('/');
    match rest.rsplit_once(':') {
        Some((host, port)) => (host.to_owned(), port.parse().unwrap_or(443)),
        None => (rest.to_owned(), 443),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_read_from_server_urls() {
        assert_eq!(endpoint("https://127.0.0.1:6443"), ("127.0.0.1".into(), 6443));
        assert_eq!(endpoint("https://127.0.0.1:31000/"), ("127.0.0.1".into(), 31000));
        assert_eq!(endpoint("https://example.org"), ("example.org".into(), 443));
    }

    #[test]
    fn infrastructure_refs_are_read_in_both_cluster_api_versions() {
        let v1beta2 = json!({"spec": {"infrastructureRef": {
            "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "OpenStackCluster", "name": "c-x1"}}});
        assert_eq!(
            infrastructure_ref(&v1beta2),
            Some((
                "infrastructure.cluster.x-k8s.io".into(),
                "OpenStackCluster".into(),
                "c-x1".into()
            ))
        );
        let v1beta1 = json!({"spec": {"infrastructureRef": {
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerCluster", "name": "c-y2",
            "namespace": "ns"}}});
        assert_eq!(
            infrastructure_ref(&v1beta1),
            Some((
                "infrastructure.cluster.x-k8s.io".into(),
                "DockerCluster".into(),
                "c-y2".into()
            ))
        );
        assert_eq!(infrastructure_ref(&json!({"spec": {}})), None);
    }

    #[test]
    fn a_cluster_is_paused_by_its_spec_or_the_annotation() {
        let cluster = |value: Value| -> DynamicObject { serde_json::from_value(value).unwrap() };
        let base = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": "ns"}, "spec": {}});
        assert!(!cluster_paused(&cluster(base.clone())));
        let mut by_move = base.clone();
        by_move["spec"]["paused"] = json!(true);
        assert!(cluster_paused(&cluster(by_move.clone())));
        by_move["spec"]["paused"] = json!(false);
        assert!(!cluster_paused(&cluster(by_move)));
        let mut annotated = base;
        annotated["metadata"]["annotations"] = json!({PAUSED_ANNOTATION: ""});
        assert!(cluster_paused(&cluster(annotated.clone())));
        assert!(annotated_paused(&cluster(annotated)));
    }

    #[test]
    fn the_provisioned_status_follows_the_contract_of_the_api_version() {
        assert_eq!(provisioned_status("v1beta1").0, "/status/ready");
        assert_eq!(
            provisioned_status("v1beta2"),
            (
                "/status/initialization/provisioned",
                json!({"initialization": {"provisioned": true}})
            )
        );
    }
}
