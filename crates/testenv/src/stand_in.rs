//! The provider side of Cluster API's contract, where a real provider would need machines: a stand-in for
//! the kubeadm control-plane provider and the Docker infrastructure provider, so that the real Cluster API
//! core manager drives a Cluster through creation, control plane initialisation and (chained) upgrades and
//! calls every lifecycle hook, while the addons go to a real workload kube-apiserver.
//!
//! It writes only what those providers write and Cluster API reads (`docs/cluster-api-contract.md`):
//!
//! - on a `KubeadmControlPlane` (v1beta2 contract): the Secret `<cluster>-kubeconfig` (type
//!   `cluster.x-k8s.io/secret`, label `cluster.x-k8s.io/cluster-name`, key `value`, owned by the control
//!   plane), pointing at the workload kube-apiserver it was given; then the status: `initialization.
//!   controlPlaneInitialized`, `version` (the `spec.version` it reaches, after [`StandIn::step_time`], which is
//!   how long an upgrade step of the control plane takes), and the replica counts;
//! - on a `DockerCluster`: `spec.controlPlaneEndpoint` (the workload API server's host and port) and
//!   `status.initialization.provisioned` (`status.ready` in v1beta1).
//!
//! It never touches a Cluster, a MachineDeployment or anything else Cluster API itself writes, so what Cluster
//! API does next (conditions, hook calls, the next upgrade step) is Cluster API's own doing. Workers: use
//! MachineDeployments with `replicas: 0` (no Machine exists, so a worker upgrade completes when Cluster API
//! moves their version; with replicas the never-provisioned Machines would hold it forever).
//!
//! What it did is kept in order ([`StandIn::log`]): `initialized ns/cluster at v1.33.4`, `upgraded ns/cluster
//! to v1.34.2`, so tests can check the sequence of control-plane steps against the hook calls.

use std::{
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
    task: tokio::task::JoinHandle<()>,
}

/// The workload cluster every Cluster's kubeconfig Secret points at.
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
    /// management cluster of `client`.
    pub fn start(client: Client, workload: Workload) -> Self {
        let log = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn(run(client, workload, log.clone()));
        StandIn { log, task }
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

async fn run(client: Client, workload: Workload, log: Arc<Mutex<Vec<String>>>) {
    let mut upgrading: std::collections::HashMap<String, (String, tokio::time::Instant)> = Default::default();
    loop {
        if let Err(e) = pass(&client, &workload, &log, &mut upgrading).await {
            tracing::debug!(error = %e, "stand-in pass failed; trying again");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The served version of `group`'s `kind` Cluster API picks (the newest).
async fn resource(client: &Client, group: &str, kind: &str) -> Result<ApiResource, kube::Error> {
    let group = kube::discovery::group(client, group).await?;
    group
        .recommended_kind(kind)
        .map(|(resource, _)| resource)
        .ok_or_else(|| kube::Error::Discovery(kube::error::DiscoveryError::MissingKind(kind.to_owned())))
}

async fn pass(
    client: &Client,
    workload: &Workload,
    log: &Mutex<Vec<String>>,
    upgrading: &mut std::collections::HashMap<String, (String, tokio::time::Instant)>,
) -> Result<(), kube::Error> {
    let record = |line: String| log.lock().unwrap_or_else(|p| p.into_inner()).push(line);

    // Infrastructure: provisioned, with the workload API server as the control-plane endpoint.
    let infra = resource(client, "infrastructure.cluster.x-k8s.io", "DockerCluster").await?;
    let (host, port) = endpoint(&workload.server_url);
    for cluster in Api::<DynamicObject>::all_with(client.clone(), &infra)
        .list(&ListParams::default())
        .await?
    {
        let name = cluster.name_any();
        let infra_api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &cluster.namespace().unwrap_or_default(), &infra);
        let value = serde_json::to_value(&cluster).unwrap_or_default();
        if value
            .pointer("/spec/controlPlaneEndpoint/host")
            .and_then(Value::as_str)
            != Some(host.as_str())
        {
            infra_api
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"controlPlaneEndpoint": {"host": host, "port": port}}})),
                )
                .await?;
        }
        let (path, status) = if infra.version == "v1beta1" {
            ("/status/ready", json!({"ready": true}))
        } else {
            (
                "/status/initialization/provisioned",
                json!({"initialization": {"provisioned": true}}),
            )
        };
        if value.pointer(path) != Some(&json!(true)) {
            infra_api
                .patch_status(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": status})),
                )
                .await?;
        }
    }

    // Control planes: kubeconfig Secret, initialised, and at their spec.version after a step's time.
    let control_plane = resource(client, "controlplane.cluster.x-k8s.io", "KubeadmControlPlane").await?;
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
                string_data: Some([("value".to_owned(), workload.kubeconfig.clone())].into()),
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
}
