//! The apply engine: server-side apply of rendered objects with a dedicated field manager, in dependency
//! order (CRDs, awaited until Established; then Namespaces; then the rest), each object labelled as the
//! operator's; an inventory of the result; and pruning of what the previous inventory has and the new
//! render does not, never touching an object that does not carry the operator's label.
//!
//! Objects keep their own `metadata.namespace`; only namespaced objects without one get the default (the
//! release) namespace. Server-side apply of unchanged content is a no-op on the server: re-applying the
//! same render changes no `resourceVersion`.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use cso_api::{
    OWNED_LABEL,
    common::{Resource, ResourceStatus},
    manifest::Manifest,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api,
    api::{DeleteParams, DynamicObject, Patch, PatchParams, PropagationPolicy},
    core::GroupVersionKind,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{
    ClusterDiscovery,
    discovery::{DiscoveryError, ResolvedKind},
    inventory::{ObjectKey, to_prune},
};

/// The field manager of the operator's server-side applies.
pub const DEFAULT_FIELD_MANAGER: &str = "cluster-stack-operator";
const CRD_ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(30);

/// One object that could not be applied or pruned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub key: ObjectKey,
    pub error: String,
}

/// What applying a render did.
#[derive(Clone, Debug, Default)]
pub struct ApplyReport {
    /// The new inventory (for `status.resources`): every rendered object, synced or not, plus pruning
    /// failures, which stay recorded until they succeed.
    pub resources: Vec<Resource>,
    pub applied: usize,
    pub pruned: Vec<ObjectKey>,
    /// Objects in the old inventory that are gone or no longer carry the operator's label: dropped from
    /// the inventory without deleting anything.
    pub released: Vec<ObjectKey>,
    pub failures: Vec<Failure>,
    /// Objects this engine had applied before and found recreated (another uid) or with a spec someone else
    /// changed (another generation): drift this apply corrected.
    pub drift_corrected: Vec<ObjectKey>,
    /// How long the apply (with pruning) took.
    pub duration: Duration,
}

impl ApplyReport {
    pub fn is_complete(&self) -> bool {
        self.failures.is_empty()
    }

    /// A one-line summary of the failures, for conditions and events.
    pub fn failure_summary(&self) -> String {
        self.failures
            .iter()
            .map(|f| format!("{}: {}", f.key, f.error))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Applies renders to one cluster.
#[derive(Clone, Debug)]
pub struct ApplyEngine {
    discovery: Arc<ClusterDiscovery>,
    pub(crate) field_manager: String,
    take_over_from: Vec<String>,
    /// uid and generation of each object as our last apply left it, to tell drift from no change.
    observed: Arc<Mutex<HashMap<ObjectKey, Observed>>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Observed {
    /// Digest of what we applied.
    content: [u8; 32],
    uid: Option<String>,
    generation: Option<i64>,
}

/// A rendered object made ready to apply.
pub(crate) struct Prepared {
    pub(crate) key: ObjectKey,
    version: String,
    pub(crate) kind: Option<ResolvedKind>,
    pub(crate) object: Value,
    pub(crate) error: Option<String>,
    drift_corrected: bool,
}

impl ApplyEngine {
    pub fn new(discovery: Arc<ClusterDiscovery>, field_manager: impl Into<String>) -> Self {
        ApplyEngine {
            discovery,
            field_manager: field_manager.into(),
            take_over_from: Vec::new(),
            observed: Arc::default(),
        }
    }

    /// Applies `manifests`, labelled with the operator's label and `labels`, and prunes what `previous`
    /// has and this render does not. Per-object failures are reported, not returned as an error.
    pub async fn apply(
        &self,
        manifests: &[Manifest],
        default_namespace: &str,
        labels: &BTreeMap<String, String>,
        previous: &[Resource],
    ) -> ApplyReport {
        let started = Instant::now();
        let mut report = ApplyReport::default();
        let (crds, rest): (Vec<&Manifest>, Vec<&Manifest>) = manifests.iter().partition(|m| {
            m.kind() == "CustomResourceDefinition" && m.group_version().0 == "apiextensions.k8s.io"
        });
        let (namespaces, rest): (Vec<&Manifest>, Vec<&Manifest>) = rest
            .into_iter()
            .partition(|m| m.kind() == "Namespace" && m.group_version().0.is_empty());

        let mut prepared = Vec::new();
        // Kinds the CRDs of this render define: discovery may lag behind Established, so they are waited for.
        let mut new_kinds = BTreeSet::new();
        for phase in [crds, namespaces, rest] {
            let mut applied_crds = Vec::new();
            for manifest in phase {
                let (group, version) = manifest.group_version();
                if new_kinds.contains(&(group.to_owned(), manifest.kind().to_owned())) {
                    self.await_served(&GroupVersionKind::gvk(group, version, manifest.kind()))
                        .await;
                }
                let item = self.prepare(manifest, default_namespace, labels).await;
                let item = self.apply_one(item).await;
                if item.error.is_none() && item.key.kind == "CustomResourceDefinition" {
                    applied_crds.push(item.key.name.clone());
                    let spec = &item.object["spec"];
                    if let (Some(group), Some(kind)) =
                        (spec["group"].as_str(), spec["names"]["kind"].as_str())
                    {
                        new_kinds.insert((group.to_owned(), kind.to_owned()));
                    }
                }
                prepared.push(item);
            }
            for name in applied_crds {
                if let Err(e) = self.wait_established(&name).await
                    && let Some(item) = prepared
                        .iter_mut()
                        .find(|p| p.key.kind == "CustomResourceDefinition" && p.key.name == name)
                {
                    item.error = Some(e);
                }
            }
        }

        let current: BTreeSet<ObjectKey> = prepared.iter().map(|p| p.key.clone()).collect();
        for item in prepared {
            if item.drift_corrected {
                report.drift_corrected.push(item.key.clone());
            }
            let status = match &item.error {
                None => {
                    report.applied += 1;
                    ResourceStatus::Synced
                }
                Some(error) => {
                    report.failures.push(Failure {
                        key: item.key.clone(),
                        error: error.clone(),
                    });
                    ResourceStatus::NotSynced
                }
            };
            report.resources.push(resource(
                &item.key,
                &item.version,
                status,
                item.error.unwrap_or_default(),
            ));
        }

        for stale in to_prune(previous, &current) {
            let key = ObjectKey::of(stale);
            match self.prune(stale, default_namespace).await {
                Ok(Pruned::Deleted) => report.pruned.push(key),
                Ok(Pruned::Released) => report.released.push(key),
                Err(error) => {
                    report.failures.push(Failure {
                        key: key.clone(),
                        error: error.clone(),
                    });
                    report
                        .resources
                        .push(resource(&key, &stale.version, ResourceStatus::NotSynced, error));
                }
            }
        }
        report.duration = started.elapsed();
        report
    }

    pub(crate) async fn prepare(
        &self,
        manifest: &Manifest,
        default_namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Prepared {
        let (group, version) = manifest.group_version();
        let gvk = GroupVersionKind::gvk(group, version, manifest.kind());
        let mut object = manifest.object.clone();
        let mut key = ObjectKey {
            group: group.to_owned(),
            kind: manifest.kind().to_owned(),
            namespace: manifest.namespace().unwrap_or_default().to_owned(),
            name: manifest.name().to_owned(),
        };
        let kind = match self.discovery.resolve(&gvk).await {
            Ok(kind) => kind,
            Err(e) => {
                return Prepared {
                    key,
                    version: version.to_owned(),
                    kind: None,
                    object,
                    error: Some(e.to_string()),
                    drift_corrected: false,
                };
            }
        };
        let metadata = object["metadata"]
            .as_object_mut()
            .expect("parse_manifests checked metadata.name");
        if kind.namespaced {
            if key.namespace.is_empty() {
                key.namespace = default_namespace.to_owned();
            }
            metadata.insert("namespace".into(), Value::String(key.namespace.clone()));
        } else {
            key.namespace.clear();
            metadata.remove("namespace");
        }
        let object_labels = metadata
            .entry("labels")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(object_labels) = object_labels.as_object_mut() {
            object_labels.insert(OWNED_LABEL.0.into(), Value::String(OWNED_LABEL.1.into()));
            for (k, v) in labels {
                object_labels.insert(k.clone(), Value::String(v.clone()));
            }
        }
        Prepared {
            key,
            version: version.to_owned(),
            kind: Some(kind),
            object,
            error: None,
            drift_corrected: false,
        }
    }

    /// Takes over objects that other field managers applied (the Go operator applied with `kubectl`):
    /// before our first apply of such an object, their `Apply` entry in `managedFields` is renamed to ours,
    /// so that fields a later release no longer renders are removed instead of staying owned by them.
    /// Costs one read per object the first time this engine applies it.
    pub fn taking_over_from(mut self, managers: impl IntoIterator<Item = String>) -> Self {
        self.take_over_from = managers.into_iter().collect();
        self
    }

    async fn take_over(&self, api: &Api<DynamicObject>, name: &str) -> Result<(), kube::Error> {
        let Some(live) = api.get_opt(name).await? else {
            return Ok(());
        };
        let entries = live.metadata.managed_fields.unwrap_or_default();
        let is_apply = |e: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry| {
            e.operation.as_deref() == Some("Apply")
        };
        if entries
            .iter()
            .any(|e| is_apply(e) && e.manager.as_deref() == Some(self.field_manager.as_str()))
        {
            return Ok(());
        }
        let mut ops = vec![
            serde_json::json!({"op": "test", "path": "/metadata/resourceVersion", "value": live.metadata.resource_version}),
        ];
        for (index, entry) in entries.iter().enumerate() {
            if is_apply(entry)
                && entry
                    .manager
                    .as_ref()
                    .is_some_and(|m| self.take_over_from.contains(m))
            {
                ops.push(serde_json::json!({"op": "replace", "path": format!("/metadata/managedFields/{index}/manager"), "value": self.field_manager}));
                // One Apply entry per manager: the first found becomes ours.
                break;
            }
        }
        if ops.len() == 1 {
            return Ok(());
        }
        let patch: json_patch::Patch =
            serde_json::from_value(Value::Array(ops)).map_err(kube::Error::SerdeError)?;
        api.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await?;
        tracing::info!(object = name, from = ?self.take_over_from, "took over field ownership");
        Ok(())
    }

    async fn apply_one(&self, mut item: Prepared) -> Prepared {
        let Some(kind) = &item.kind else { return item };
        let api = self.api(kind, &item.key.namespace);
        // Once applied by this engine, the object's Apply entry is ours: no further read needed.
        let applied_before = self
            .observed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&item.key);
        if !self.take_over_from.is_empty()
            && !applied_before
            && let Err(e) = self.take_over(&api, &item.key.name).await
        {
            item.error = Some(format!("failed to take over field ownership: {}", api_error(&e)));
            return item;
        }
        let params = PatchParams::apply(&self.field_manager).force();
        match api
            .patch(&item.key.name, &params, &Patch::Apply(&item.object))
            .await
        {
            Ok(applied) => {
                tracing::debug!(object = %item.key, "applied");
                let now = Observed {
                    content: Sha256::digest(item.object.to_string()).into(),
                    uid: applied.metadata.uid,
                    generation: applied.metadata.generation,
                };
                let before = self
                    .observed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(item.key.clone(), now.clone());
                // Applying what we applied last time changes nothing, so a new uid (the object was
                // deleted) or a new generation (its spec was edited) means we just undid someone's change.
                item.drift_corrected = before.is_some_and(|b| {
                    b.content == now.content && (b.uid != now.uid || b.generation != now.generation)
                });
            }
            Err(e) => {
                if matches!(&e, kube::Error::Api(s) if s.code == 404) {
                    self.discovery.forget(&GroupVersionKind::gvk(
                        &item.key.group,
                        &item.version,
                        &item.key.kind,
                    ));
                }
                item.error = Some(api_error(&e));
            }
        }
        item
    }

    pub(crate) fn api(&self, kind: &ResolvedKind, namespace: &str) -> Api<DynamicObject> {
        let client = self.discovery.client().clone();
        if kind.namespaced {
            Api::namespaced_with(client, namespace, &kind.resource)
        } else {
            Api::all_with(client, &kind.resource)
        }
    }

    /// Waits (up to the CRD timeout) until discovery serves `gvk`, which a CRD of this render defines; if it
    /// never does, preparing the object reports it.
    async fn await_served(&self, gvk: &GroupVersionKind) {
        let deadline = Instant::now() + CRD_ESTABLISHED_TIMEOUT;
        while let Err(DiscoveryError::UnknownKind(_)) = self.discovery.resolve(gvk).await {
            if Instant::now() > deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_established(&self, name: &str) -> Result<(), String> {
        let api: Api<CustomResourceDefinition> = Api::all(self.discovery.client().clone());
        let deadline = Instant::now() + CRD_ESTABLISHED_TIMEOUT;
        loop {
            let crd = api.get(name).await.map_err(|e| api_error(&e))?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("CRD not Established after {CRD_ESTABLISHED_TIMEOUT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn prune(&self, stale: &Resource, default_namespace: &str) -> Result<Pruned, String> {
        let api = match self.prune_target(stale, default_namespace).await? {
            PruneTarget::Delete(api) => api,
            PruneTarget::Absent => return Ok(Pruned::Released),
            PruneTarget::NotOurs => {
                tracing::warn!(object = %ObjectKey::of(stale), "not pruning an object without the operator's label");
                return Ok(Pruned::Released);
            }
        };
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        match api.delete(&stale.name, &params).await {
            Ok(_) => Ok(Pruned::Deleted),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(Pruned::Released),
            Err(e) => Err(api_error(&e)),
        }
    }

    /// What pruning `stale` comes to: only a live object carrying the operator's label is deleted.
    pub(crate) async fn prune_target(
        &self,
        stale: &Resource,
        default_namespace: &str,
    ) -> Result<PruneTarget, String> {
        let gvk = GroupVersionKind::gvk(&stale.group, &stale.version, &stale.kind);
        let kind = match self.discovery.resolve(&gvk).await {
            Ok(kind) => kind,
            // The kind is gone from the cluster, so is the object.
            Err(DiscoveryError::UnknownKind(_)) => return Ok(PruneTarget::Absent),
            Err(e) => return Err(e.to_string()),
        };
        // Inventories written by the Go operator may hold "" for namespaced objects of the release namespace.
        let namespace = if kind.namespaced && stale.namespace.is_empty() {
            default_namespace
        } else {
            stale.namespace.as_str()
        };
        let api = self.api(&kind, namespace);
        let live = match api.get_opt(&stale.name).await {
            Ok(Some(live)) => live,
            Ok(None) => return Ok(PruneTarget::Absent),
            Err(e) => return Err(api_error(&e)),
        };
        let ours = live
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(OWNED_LABEL.0))
            .is_some_and(|v| v == OWNED_LABEL.1);
        Ok(if ours {
            PruneTarget::Delete(Box::new(api))
        } else {
            PruneTarget::NotOurs
        })
    }
}

/// What pruning one inventory entry comes to.
pub(crate) enum PruneTarget {
    /// It exists and is the operator's: deleted through this API.
    Delete(Box<Api<DynamicObject>>),
    /// Not there (nor its kind): dropped from the inventory.
    Absent,
    /// It exists without the operator's label: left alone, dropped from the inventory.
    NotOurs,
}

enum Pruned {
    Deleted,
    Released,
}

fn resource(key: &ObjectKey, version: &str, status: ResourceStatus, error: String) -> Resource {
    Resource {
        group: key.group.clone(),
        version: version.to_owned(),
        kind: key.kind.clone(),
        namespace: key.namespace.clone(),
        name: key.name.clone(),
        status: Some(status),
        error,
    }
}

pub(crate) fn api_error(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}
