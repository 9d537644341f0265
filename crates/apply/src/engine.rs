//! The apply engine: server-side apply of rendered objects with a dedicated field manager, in dependency
//! order (CRDs, awaited until Established; then Namespaces; then the rest), each object labelled as the
//! operator's; an inventory of the result; and pruning of what the previous inventory has and the new
//! render does not, never touching an object that does not carry the operator's label.
//!
//! What is forced (decisions.md, "What the operator forces and what it leaves"): each object is applied
//! first without force; on a conflict, the fields another manager last wrote through a subresource (an
//! autoscaler's `spec.replicas`, written through `scale`) are left out of this and later applies of the
//! object, and the rest is applied with force, taking every other field back.
//!
//! Objects keep their own `metadata.namespace`; only namespaced objects without one get the default (the
//! release) namespace. Server-side apply of unchanged content is a no-op on the server: re-applying the
//! same render changes no `resourceVersion`, except for a kind served through a conversion that does not
//! round-trip; the management cluster's engine therefore reads each object first and leaves it unwritten
//! when it is as the apply of the same content left it (`ApplyEngine::for_management`). Pod templates of the workload kinds carry the operator's label
//! too, as the Go operator sets it, so that taking over from it changes no pod template.
//!
//! What a prune may take is bounded (decisions.md, "What a prune may delete"): a render with fewer than half
//! the objects of the last apply is held, not applied, and a prune never deletes a Namespace or a
//! CustomResourceDefinition (their deletion takes everything in them); only [`ApplyEngine::delete`], asked
//! by name, does. Namespaces are shared, so they follow stricter rules still: a Namespace that exists when the
//! engine applies it and does not carry the operator's label, and the system namespaces, are applied without
//! the operator's labels and never deleted; a Namespace the engine created is deleted only when it holds no
//! object the operator does not own. A deletion the API server refuses (403, 405, 409) is reported in
//! [`ApplyReport::refused`] and dropped from the inventory instead of failing every later apply.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use cso_api::{
    APPLIED_DIGEST_ANNOTATION, OWNED_LABEL,
    atom::Atom,
    common::{Resource, ResourceStatus},
    manifest::Manifest,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PropagationPolicy},
    core::GroupVersionKind,
    discovery::{Discovery, Scope, verbs},
};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::{
    ClusterDiscovery,
    discovery::{DiscoveryError, ResolvedKind},
    inventory::{self, ObjectKey, to_prune},
    managed_fields::FieldOwners,
};

/// The field manager of the operator's server-side applies.
pub const DEFAULT_FIELD_MANAGER: &str = "cluster-stack-operator";
const CRD_ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(30);
/// Whether the objects this engine has not applied yet (in this process) are read before their first apply:
/// to take them over from another field manager ([`ApplyEngine::taking_over_from`]) and to leave unwritten
/// what an apply of the same content left as it is ([`ApplyEngine::would_leave_unwritten`]), whichever
/// process (this one before a restart, an operator on the management cluster a Cluster moved from) made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TakeOver {
    Check,
    /// Every object is read, those applied in this process too ([`ApplyEngine::apply_checking`]).
    CheckAll,
    /// Nobody applied anything for this owner before ([`ApplyEngine::apply_first`]): nothing to read.
    Skip,
}

/// What the read before an apply found ([`ApplyEngine::read_first`]).
enum ReadFirst {
    /// As an apply of the same content left it: not written; its metadata as read.
    Unchanged(Box<kube::api::ObjectMeta>),
    /// To be written: read and not as applied, gone, unreadable (the apply will tell), or not read at all.
    Write,
    /// The take-over the read was for failed: the object is not applied.
    Failed(String),
}

/// Objects of one apply phase sent at once (the client's rate limit still applies).
const APPLIES_AT_ONCE: usize = 8;

/// One object that could not be applied or pruned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub key: ObjectKey,
    pub error: String,
    /// The API server refused it in a way that trying again does not change ([`refused_for_good`]): only a
    /// change of the object or of the cluster (its namespace, a policy, permissions) will.
    pub lasting: bool,
}

/// Whether an API server's answer to a write refuses it for good: 400 Bad Request, 403 Forbidden (a
/// namespace being deleted, RBAC, an admission policy), 422 Invalid (a schema or a webhook's refusal).
/// Conflicts, timeouts, throttling, unknown kinds and missing namespaces may clear by themselves.
pub fn refused_for_good(error: &kube::Error) -> bool {
    // A quota's 403 clears when other objects go.
    matches!(error, kube::Error::Api(status)
        if matches!(status.code, 400 | 403 | 422) && !status.message.contains("exceeded quota"))
}

/// What applying a render did.
#[derive(Clone, Debug, Default)]
pub struct ApplyReport {
    /// The new inventory (for `status.resources`): every rendered object, synced or not, plus pruning
    /// failures, which stay recorded until they succeed.
    pub resources: Vec<Resource>,
    /// Rendered objects applied without failure, written or left unwritten (`unchanged`).
    pub applied: usize,
    pub pruned: Vec<ObjectKey>,
    /// Objects in the old inventory that are gone or no longer carry the operator's label, and Namespaces
    /// that are not the operator's to delete (see the module): dropped from the inventory without deleting
    /// anything.
    pub released: Vec<ObjectKey>,
    pub failures: Vec<Failure>,
    /// Stale objects whose deletion the API server refused for good (403 Forbidden, 405 Method Not Allowed,
    /// 409 Conflict: a protected namespace, an admission policy, missing permissions). They are dropped from
    /// the inventory (the operator will not try again) and do not make the apply incomplete: a refusal must
    /// not hold up the rest of a release for ever. Logged as warnings.
    pub refused: Vec<Failure>,
    /// Objects this engine had applied before and found recreated (another uid) or with a spec someone else
    /// changed (another generation): drift this apply corrected.
    pub drift_corrected: Vec<ObjectKey>,
    /// Objects of `applied` left unwritten because they were as an apply of the same content left them
    /// (read before applying: see `TakeOver`).
    pub unchanged: usize,
    /// How long the apply (with pruning) took.
    pub duration: Duration,
    /// Why the render was not applied at all ([`inventory::shrink_held`]); `resources` is then the previous
    /// inventory.
    pub held: Option<String>,
}

impl ApplyReport {
    pub fn is_complete(&self) -> bool {
        self.failures.is_empty() && self.held.is_none()
    }

    /// Whether the apply failed and every failure is a refusal for good ([`Failure::lasting`]): waiting will
    /// not make it complete.
    pub fn refused_for_good(&self) -> bool {
        self.held.is_none() && !self.failures.is_empty() && self.failures.iter().all(|f| f.lasting)
    }

    /// A one-line summary of why the apply is not complete (held, failures), for conditions and events.
    pub fn failure_summary(&self) -> String {
        self.held
            .iter()
            .cloned()
            .chain(self.failures.iter().map(|f| format!("{}: {}", f.key, f.error)))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Applies renders to one cluster.
#[derive(Clone, Debug)]
pub struct ApplyEngine {
    discovery: Arc<ClusterDiscovery>,
    /// Shared by the clones (each drift watch of a cluster holds one).
    pub(crate) field_manager: Arc<str>,
    take_over_from: Arc<[String]>,
    /// Read each object before applying it and leave it unwritten when it is as our last apply of the same
    /// content left it (see `ApplyEngine::writing_only_changes`).
    write_only_changes: bool,
    /// uid and generation of each object as our last apply left it, to tell drift from no change.
    observed: Arc<Mutex<Records>>,
    /// The objects this engine is writing now, until their write is recorded in `observed` ([`Writing`]).
    writing: Arc<Mutex<HashMap<ObjectKey, tokio::sync::watch::Sender<bool>>>>,
}

/// An object being written, from before its write is sent until after it is recorded (or failed): a watch
/// event of it meanwhile may be the write's own, come before the record ([`ApplyEngine::written`]). Dropped
/// when the apply ends, however it ends.
struct Writing<'a> {
    engine: &'a ApplyEngine,
    key: ObjectKey,
    done: tokio::sync::watch::Sender<bool>,
}

impl<'a> Writing<'a> {
    fn begin(engine: &'a ApplyEngine, key: &ObjectKey) -> Self {
        let done = tokio::sync::watch::channel(false).0;
        engine
            .writing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), done.clone());
        Writing {
            engine,
            key: key.clone(),
            done,
        }
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut writing = self.engine.writing.lock().unwrap_or_else(|p| p.into_inner());
        if writing.get(&self.key).is_some_and(|w| w.same_channel(&self.done)) {
            writing.remove(&self.key);
            // Between passes nothing is written: the table's room goes back (an engine is kept per cluster).
            if writing.is_empty() {
                writing.shrink_to_fit();
            }
        }
        self.done.send_replace(true);
    }
}

/// The engine's records of the objects it applied, sorted by key. An engine is kept for every workload
/// cluster, with a record per addon object: in a vector they take their own size, where a hash table kept
/// twice their room for growth (7.5 KiB per Cluster of ferrol's fifteen objects at 1000 Clusters).
#[derive(Debug, Default)]
struct Records(Vec<(ObjectKey, Observed)>);

impl Records {
    fn position(&self, key: &ObjectKey) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.cmp(key))
    }

    fn get(&self, key: &ObjectKey) -> Option<&Observed> {
        self.position(key).ok().map(|at| &self.0[at].1)
    }

    fn contains_key(&self, key: &ObjectKey) -> bool {
        self.position(key).is_ok()
    }

    /// Records `observed` for `key`; the record it replaces, if any.
    fn insert(&mut self, key: ObjectKey, observed: Observed) -> Option<Observed> {
        match self.position(&key) {
            Ok(at) => Some(std::mem::replace(&mut self.0[at].1, observed)),
            Err(at) => {
                // Grown by an eighth, not doubled: records are added once per object, at its first apply.
                if self.0.len() == self.0.capacity() {
                    self.0.reserve_exact((self.0.len() / 8).max(4));
                }
                self.0.insert(at, (key, observed));
                None
            }
        }
    }

    fn remove(&mut self, key: &ObjectKey) -> Option<Observed> {
        self.position(key).ok().map(|at| self.0.remove(at).1)
    }

    fn iter(&self) -> impl Iterator<Item = (&ObjectKey, &Observed)> {
        self.0.iter().map(|(k, o)| (k, o))
    }

    fn keys(&self) -> impl Iterator<Item = &ObjectKey> {
        self.0.iter().map(|(k, _)| k)
    }
}

/// A resourceVersion as [`Observed`] keeps it: the number, when it is one.
fn numeric_version(version: Option<&str>) -> Option<u64> {
    version?.parse().ok()
}

/// A 128-bit digest (SHA-256, cut): records keep digests, and only ever compare them.
type Digest128 = [u8; 16];

fn digest128(bytes: impl AsRef<[u8]>) -> Digest128 {
    let full: [u8; 32] = Sha256::digest(bytes).into();
    let mut cut = [0; 16];
    cut.copy_from_slice(&full[..16]);
    cut
}

/// An object's `metadata.uid`, kept as a digest of it: the engine and the drift watches only compare uids (the
/// same object, or one deleted and made again), and keep one per object they applied: 16 bytes, where the
/// text took 24 and an allocation of 36 more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Uid(Digest128);

impl From<&str> for Uid {
    fn from(uid: &str) -> Self {
        Uid(digest128(uid))
    }
}

/// The record of one applied object: digests and numbers only (a thousand Clusters of fifteen objects keep
/// fifteen thousand of them).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Observed {
    /// Digest of what we applied.
    content: Digest128,
    uid: Option<Uid>,
    generation: Option<i64>,
    /// See [`LiveMeta::writes`].
    writes: u64,
    /// See [`LiveMeta::ours`].
    ours: u64,
    /// The object's resourceVersion as our apply (or read) left it, when it is a number (an etcd revision, as
    /// every kube-apiserver's): only as a number is it compared with others; an opaque one is as good as none.
    resource_version: Option<u64>,
    /// Fields of the render left out of our applies of the object: another manager last wrote them through a
    /// subresource (`.spec.replicas` through `scale`: an autoscaler's), so they are its (see
    /// [`ApplyEngine::apply`]). The spec's generation then moves without drift; its other writers tell.
    left_out: Vec<String>,
}

impl Observed {
    /// The record of applying `content`, the object being as `metadata` (the apply's answer, or the read that
    /// found it as an apply of `content` left it) shows it.
    fn of(content: &Value, metadata: kube::api::ObjectMeta, left_out: Vec<String>) -> Self {
        let seen = LiveMeta::of(&metadata);
        Observed {
            content: digest128(content.to_string()),
            writes: seen.writes,
            ours: seen.ours,
            resource_version: numeric_version(metadata.resource_version.as_deref()),
            uid: seen.uid,
            generation: metadata.generation,
            left_out,
        }
    }
}

/// What a watch (or a read) shows of an object: which object it is, the version of its spec, and who wrote
/// its other fields when.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveMeta {
    pub uid: Option<Uid>,
    pub generation: Option<i64>,
    /// A fingerprint of the object's `managedFields` entries, those of subresources (`status`, `scale`) aside:
    /// each write outside them by any manager changes the entry's time or fields.
    pub writes: u64,
    /// A fingerprint of the operator's own apply entry ([`DEFAULT_FIELD_MANAGER`]): it changes when another
    /// manager takes or removes a field the operator set (any change of such a field moves its ownership),
    /// or something else applies with the operator's field manager; never by writes of other fields.
    pub ours: u64,
}

impl LiveMeta {
    pub fn of(meta: &kube::api::ObjectMeta) -> Self {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        let mut ours = std::collections::hash_map::DefaultHasher::new();
        for entry in meta.managed_fields.iter().flatten() {
            if entry.subresource.as_deref().is_some_and(|s| !s.is_empty()) {
                continue;
            }
            let hash = |hasher: &mut std::collections::hash_map::DefaultHasher| {
                entry.manager.hash(hasher);
                entry.operation.hash(hasher);
                entry.api_version.hash(hasher);
                entry.time.as_ref().map(|t| t.0.to_string()).hash(hasher);
                entry.fields_v1.as_ref().map(|f| f.0.to_string()).hash(hasher);
            };
            hash(&mut hasher);
            if entry.manager.as_deref() == Some(DEFAULT_FIELD_MANAGER)
                && entry.operation.as_deref() == Some("Apply")
            {
                hash(&mut ours);
            }
        }
        LiveMeta {
            ours: ours.finish(),
            uid: meta.uid.as_deref().map(Uid::from),
            generation: meta.generation,
            writes: hasher.finish(),
        }
    }
}

/// Whether `live` is as the apply recorded in `observed` left it: the same object (uid) with the same spec
/// (generation: status and metadata writes of controllers do not count); for kinds without a generation
/// (ConfigMaps, Secrets, RBAC, APIServices, ...) not written since outside its status (see
/// [`LiveMeta::writes`]: an aggregator or load balancer controller writing the status is no drift). An
/// object with fields left to a subresource's writer (`Observed::left_out`: an autoscaler's replicas) moves
/// its generation at each of their writes: not written since outside the subresources, then.
///
/// Whatever the kind, a change of the operator's own apply entry ([`LiveMeta::ours`]) is drift: someone took
/// a field it set (a label of a Deployment, which moves no generation) or applied with its field manager.
fn left_as(observed: &Observed, live: &LiveMeta) -> bool {
    observed.uid == live.uid
        && observed.ours == live.ours
        && match observed.generation {
            Some(_) if observed.left_out.is_empty() => observed.generation == live.generation,
            Some(_) => observed.generation == live.generation || observed.writes == live.writes,
            None => observed.writes == live.writes,
        }
}

/// Whether an apply of unchanged content (`before` is what our last apply left, `now` what this one did)
/// undid someone's change: the object was deleted and made again (another uid), or its spec was edited in
/// between (the generation moved by two or more: the edit, then our apply putting it back). One step alone is
/// no edit: applying the same content to a kind served through a conversion webhook that does not round-trip
/// (Cluster API's `v1beta1` ClusterClass on 1.11+, whose conversion data carries the status) moves the
/// generation at every apply.
/// With fields left to a subresource's writer, their writes move the generation too: written outside the
/// subresources in between, then. Whatever the kind, our own apply entry changed in between (a field taken
/// and taken back, our field manager applying other values elsewhere: a label, which moves no generation).
fn undid_a_change(before: &Observed, now: &Observed) -> bool {
    let moved = match (before.generation, now.generation) {
        _ if !now.left_out.is_empty() => before.writes != now.writes,
        (Some(before), Some(now)) => now - before >= 2 || now < before,
        (before, now) => before != now,
    };
    before.uid != now.uid || moved || before.ours != now.ours
}

/// See [`ApplyEngine::applied_since`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedSince {
    /// The earliest resourceVersion among `objects`.
    pub resource_version: String,
    pub objects: Vec<(ObjectKey, LiveMeta)>,
}

/// [`ApplyEngine::applied_since`] over the records `observed`.
fn applied_since<'a>(observed: impl Iterator<Item = (&'a ObjectKey, &'a Observed)>) -> Option<AppliedSince> {
    let mut earliest: Option<u64> = None;
    let mut objects = Vec::new();
    for (key, o) in observed {
        let number = o.resource_version?;
        if earliest.is_none_or(|e| number < e) {
            earliest = Some(number);
        }
        objects.push((
            key.clone(),
            LiveMeta {
                uid: o.uid,
                generation: o.generation,
                writes: o.writes,
                ours: o.ours,
            },
        ));
    }
    earliest.map(|version| AppliedSince {
        resource_version: version.to_string(),
        objects,
    })
}

/// What [`ApplyEngine::send`] did.
struct Sent {
    /// The object as applied.
    applied: DynamicObject,
    /// Fields left to the managers that write them through a subresource.
    left_out: Vec<String>,
    /// Fields another manager had taken were taken back (with force).
    took_back: bool,
}

/// A rendered object made ready to apply.
pub(crate) struct Prepared {
    pub(crate) key: ObjectKey,
    version: String,
    pub(crate) kind: Option<ResolvedKind>,
    pub(crate) object: Value,
    pub(crate) error: Option<String>,
    /// The error is a refusal for good ([`refused_for_good`]).
    lasting: bool,
    drift_corrected: bool,
    /// Left unwritten: as our last apply of the same content left it.
    unchanged: bool,
}

impl ApplyEngine {
    pub fn new(discovery: Arc<ClusterDiscovery>, field_manager: impl Into<String>) -> Self {
        ApplyEngine {
            discovery,
            field_manager: Arc::from(field_manager.into()),
            take_over_from: Arc::from([]),
            write_only_changes: false,
            observed: Arc::default(),
            writing: Arc::default(),
        }
    }

    /// The engine for the management cluster, where the operator applies ClusterClasses and their templates:
    /// the operator's field manager, `ApplyEngine::writing_only_changes`.
    pub fn for_management(discovery: Arc<ClusterDiscovery>) -> Self {
        ApplyEngine::new(discovery, DEFAULT_FIELD_MANAGER).writing_only_changes()
    }

    /// Every object is read before each apply, not only before this engine's first ([`TakeOver`]): when the
    /// live object carries the digest of the same content (`clusterstack.x-k8s.io/applied-digest`, which every
    /// engine annotates its objects with) and still holds every field the apply sets
    /// ([`ApplyEngine::would_leave_unwritten`]), it is not written. A server-side apply of unchanged content is
    /// a no-op for most kinds, but not for one served through a conversion that does not round-trip (Cluster
    /// API 1.14's `v1beta1` ClusterClass: each apply moves its generation and resourceVersion). It costs a
    /// read per object and apply, so the management cluster's engine uses it (a release's class and
    /// templates, per resync); the workload clusters' engines, applying many more objects of kinds that
    /// round-trip, read only before their first apply of an object.
    fn writing_only_changes(mut self) -> Self {
        self.write_only_changes = true;
        self
    }

    /// Applies `manifests`, labelled with the operator's label and `labels`, and prunes what `previous`
    /// has and this render does not. Per-object failures are reported, not returned as an error.
    ///
    /// A render that has fewer than half the objects of `previous` (none at all, say) is not applied: the
    /// report says it is held ([`inventory::shrink_held`]), and `previous` stays the inventory. Namespaces and
    /// CustomResourceDefinitions are never pruned ([`inventory::is_never_pruned`]): left in place and
    /// released from the inventory. [`ApplyEngine::delete`] deletes what is asked for by name.
    pub async fn apply(
        &self,
        manifests: &[Manifest],
        default_namespace: &str,
        labels: &BTreeMap<String, String>,
        previous: &[Resource],
    ) -> ApplyReport {
        self.apply_unless_held(manifests, default_namespace, labels, previous, TakeOver::Check)
            .await
    }

    /// [`ApplyEngine::apply`] that reads every object first, those this engine applied before too, and writes
    /// only those an apply of the same content did not leave as they are ([`ApplyEngine::would_leave_unwritten`]):
    /// for a pass that looks for changes nobody told of (a periodic pass the drift watches cannot vouch for).
    /// An object someone else changed or deleted is written as by `apply`; one as applied costs a read and no
    /// write.
    pub async fn apply_checking(
        &self,
        manifests: &[Manifest],
        default_namespace: &str,
        labels: &BTreeMap<String, String>,
        previous: &[Resource],
    ) -> ApplyReport {
        self.apply_unless_held(manifests, default_namespace, labels, previous, TakeOver::CheckAll)
            .await
    }

    async fn apply_unless_held(
        &self,
        manifests: &[Manifest],
        default_namespace: &str,
        labels: &BTreeMap<String, String>,
        previous: &[Resource],
        take_over: TakeOver,
    ) -> ApplyReport {
        // Normalising only merges entries, so only an inventory the raw count would hold is normalised (the
        // Go operator may name one object twice); the common apply reads no discovery for it here.
        let held = match inventory::shrink_held(previous, manifests.len()) {
            Some(_) => {
                let normalised = self.normalised(previous, default_namespace).await;
                inventory::shrink_held(&normalised, manifests.len())
            }
            None => None,
        };
        if let Some(why) = held {
            tracing::warn!(%why, "a render that would prune most of what was applied is held");
            return ApplyReport {
                resources: previous.to_vec(),
                held: Some(why),
                ..ApplyReport::default()
            };
        }
        self.apply_as(
            manifests,
            default_namespace,
            labels,
            previous,
            Removal::Prune(take_over),
        )
        .await
    }

    /// Deletes `objects` (an inventory, or the objects of a delete stage), Namespaces after their contents and
    /// only those that hold nothing the operator does not own; objects without the operator's label are left
    /// alone and released. What is not deleted yet stays in the report's inventory.
    pub async fn delete(&self, objects: &[Resource], default_namespace: &str) -> ApplyReport {
        self.apply_as(&[], default_namespace, &BTreeMap::new(), objects, Removal::Delete)
            .await
    }

    /// [`ApplyEngine::apply`] for an owner that no operator has applied anything for yet (no inventory, no
    /// stage, no applied condition, by this operator or the one it replaces): its objects cannot carry
    /// another operator's fields, so the take-over read before each first apply is skipped.
    pub async fn apply_first(
        &self,
        manifests: &[Manifest],
        default_namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> ApplyReport {
        self.apply_as(
            manifests,
            default_namespace,
            labels,
            &[],
            Removal::Prune(TakeOver::Skip),
        )
        .await
    }

    async fn apply_as(
        &self,
        manifests: &[Manifest],
        default_namespace: &str,
        labels: &BTreeMap<String, String>,
        previous: &[Resource],
        removal: Removal,
    ) -> ApplyReport {
        let take_over = match removal {
            Removal::Prune(take_over) => take_over,
            Removal::Delete => TakeOver::Skip,
        };
        let started = Instant::now();
        let mut report = ApplyReport::default();
        let (crds, rest): (Vec<&Manifest>, Vec<&Manifest>) = manifests.iter().partition(|m| {
            m.kind() == "CustomResourceDefinition" && m.group_version().0 == "apiextensions.k8s.io"
        });
        let (namespaces, rest): (Vec<&Manifest>, Vec<&Manifest>) = rest
            .into_iter()
            .partition(|m| m.kind() == "Namespace" && m.group_version().0.is_empty());

        let mut prepared = Vec::new();
        // Kinds the CRDs of this render define.
        let mut new_kinds = BTreeSet::new();
        for phase in [crds, namespaces, rest] {
            // Within a phase order does not matter (the API server takes a RoleBinding before its Role, a
            // Deployment before its ServiceAccount): a few objects go at once, in the render's order.
            let pending: Vec<_> = phase
                .into_iter()
                .map(|manifest| {
                    self.prepare_and_apply(manifest, &new_kinds, default_namespace, labels, take_over)
                })
                .collect();
            let applied: Vec<Prepared> = futures::stream::iter(pending)
                .buffered(APPLIES_AT_ONCE)
                .collect()
                .await;
            let mut applied_crds = Vec::new();
            for item in applied {
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
            if item.unchanged {
                report.unchanged += 1;
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
                        lasting: item.lasting,
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

        let previous = self.normalised(previous, default_namespace).await;
        for stale in to_prune(&previous, &current) {
            let key = ObjectKey::of(stale);
            match self.prune(stale, default_namespace, &current, removal).await {
                Ok(Pruned::Deleted) => {
                    self.observed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove(&key);
                    report.pruned.push(key)
                }
                Ok(Pruned::Released) => report.released.push(key),
                Ok(Pruned::Refused(error)) => {
                    tracing::warn!(object = %key, %error,
                        "the API server refused to delete a stale object; dropped from the inventory, left in place");
                    report.refused.push(Failure {
                        key,
                        error,
                        lasting: true,
                    });
                }
                Err(error) => {
                    report.failures.push(Failure {
                        key: key.clone(),
                        error: error.clone(),
                        lasting: false,
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

    /// One object of a phase: waits until its kind is served when a CRD of this render defines it
    /// (`new_kinds`: discovery may lag behind Established), then prepares and applies it.
    async fn prepare_and_apply(
        &self,
        manifest: &Manifest,
        new_kinds: &BTreeSet<(String, String)>,
        default_namespace: &str,
        labels: &BTreeMap<String, String>,
        take_over: TakeOver,
    ) -> Prepared {
        let (group, version) = manifest.group_version();
        if new_kinds.contains(&(group.to_owned(), manifest.kind().to_owned())) {
            self.await_served(&GroupVersionKind::gvk(group, version, manifest.kind()))
                .await;
        }
        let item = self.prepare(manifest, default_namespace, labels).await;
        self.apply_one(item, take_over).await
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
            group: group.into(),
            kind: manifest.kind().into(),
            namespace: manifest.namespace().unwrap_or_default().into(),
            name: manifest.name().into(),
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
                    lasting: false,
                    drift_corrected: false,
                    unchanged: false,
                };
            }
        };
        let metadata = object["metadata"]
            .as_object_mut()
            .expect("parse_manifests checked metadata.name");
        if kind.namespaced {
            if key.namespace.is_empty() {
                key.namespace = default_namespace.into();
            }
            metadata.insert("namespace".into(), Value::String(key.namespace.to_string()));
        } else {
            key.namespace = Atom::default();
            metadata.remove("namespace");
        }
        let claim = if is_namespace_kind(&key.group, &key.kind) {
            match self.claims_namespace(&key.name).await {
                Ok(claim) => claim,
                Err(error) => {
                    return Prepared {
                        key,
                        version: version.to_owned(),
                        kind: Some(kind),
                        object,
                        error: Some(error),
                        lasting: false,
                        drift_corrected: false,
                        unchanged: false,
                    };
                }
            }
        } else {
            true
        };
        if claim {
            let object_labels = metadata
                .entry("labels")
                .or_insert_with(|| Value::Object(Default::default()));
            if let Some(object_labels) = object_labels.as_object_mut() {
                object_labels.insert(OWNED_LABEL.0.into(), Value::String(OWNED_LABEL.1.into()));
                for (k, v) in labels {
                    object_labels.insert(k.clone(), Value::String(v.clone()));
                }
            }
        } else if let Some(object_labels) = metadata.get_mut("labels").and_then(Value::as_object_mut) {
            // A shared namespace: applied as rendered (a chart may need its labels, e.g. for pod
            // security), but never marked as the operator's.
            object_labels.remove(OWNED_LABEL.0);
        }
        if has_pod_template(&key.group, &key.kind) {
            label_pod_template(&mut object);
        }
        annotate_digest(&mut object);
        Prepared {
            key,
            version: version.to_owned(),
            kind: Some(kind),
            object,
            error: None,
            lasting: false,
            drift_corrected: false,
            unchanged: false,
        }
    }

    /// Whether the engine may mark Namespace `name` as the operator's: not a system namespace, and either
    /// not there yet (this apply creates it) or already carrying the operator's label (created by the
    /// operator, this one or the Go one). A Namespace someone else made is shared and never claimed.
    /// Between this read and the apply someone could create it: the window is one request wide, and the
    /// worst outcome is a namespace the operator will prune only once it holds nothing of anyone else.
    async fn claims_namespace(&self, name: &str) -> Result<bool, String> {
        if SYSTEM_NAMESPACES.contains(&name) {
            return Ok(false);
        }
        let namespaces: Api<Namespace> = Api::all(self.discovery.client());
        match namespaces.get_opt(name).await {
            Ok(None) => Ok(true),
            Ok(Some(live)) => Ok(is_owned(live.metadata.labels.as_ref())),
            Err(e) => Err(format!(
                "failed to read the namespace to tell whether it existed before: {}",
                api_error(&e)
            )),
        }
    }

    /// `previous` keyed as the engine keys objects ([`inventory::normalised`]): an entry's scope comes from
    /// discovery; entries of kinds the cluster does not serve stay as they are.
    pub(crate) async fn normalised(&self, previous: &[Resource], default_namespace: &str) -> Vec<Resource> {
        let mut normalised = Vec::with_capacity(previous.len());
        for entry in previous {
            let gvk = GroupVersionKind::gvk(&entry.group, &entry.version, &entry.kind);
            let namespaced = self.discovery.resolve(&gvk).await.ok().map(|k| k.namespaced);
            normalised.push(inventory::normalised(entry, default_namespace, namespaced));
        }
        normalised
    }

    /// The first object in `namespace` that the operator does not own ([`counts_as_foreign`]), as
    /// `Kind name`; `None` when there is none. Lists every namespaced kind that can be listed and deleted
    /// (what deleting the namespace would delete) without the operator's label. A kind the operator may not
    /// list counts as foreign (it cannot tell); a kind that vanished meanwhile is skipped.
    async fn foreign_object_in(&self, namespace: &str) -> Result<Option<String>, String> {
        let client = self.discovery.client();
        let discovery = match Discovery::new(client.clone()).run_aggregated().await {
            Ok(discovery) => discovery,
            Err(_) => Discovery::new(client.clone())
                .run()
                .await
                .map_err(|e| format!("discovery failed: {}", api_error(&e)))?,
        };
        let not_ours = format!("{}!={}", OWNED_LABEL.0, OWNED_LABEL.1);
        for group in discovery.groups() {
            for (resource, capabilities) in group.resources_by_stability() {
                if capabilities.scope != Scope::Namespaced
                    || !capabilities.supports_operation(verbs::LIST)
                    || !capabilities.supports_operation(verbs::DELETE)
                {
                    continue;
                }
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
                let mut params = ListParams::default().labels(&not_ours).limit(100);
                loop {
                    let page = match api.list_metadata(&params).await {
                        Ok(page) => page,
                        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 405 => break,
                        Err(kube::Error::Api(s)) if s.code == 403 => {
                            return Ok(Some(format!(
                                "{} (which the operator may not list)",
                                resource.plural
                            )));
                        }
                        Err(e) => {
                            return Err(format!("failed to list {}: {}", resource.plural, api_error(&e)));
                        }
                    };
                    let foreign = page.items.iter().find(|object| {
                        counts_as_foreign(
                            &resource.group,
                            &resource.kind,
                            object.metadata.name.as_deref().unwrap_or_default(),
                            object
                                .metadata
                                .owner_references
                                .as_ref()
                                .is_some_and(|o| !o.is_empty()),
                        )
                    });
                    if let Some(object) = foreign {
                        return Ok(Some(format!(
                            "{} {}",
                            resource.kind,
                            object.metadata.name.as_deref().unwrap_or_default()
                        )));
                    }
                    match page.metadata.continue_.filter(|c| !c.is_empty()) {
                        Some(token) => params = params.continue_token(&token),
                        None => break,
                    }
                }
            }
        }
        Ok(None)
    }

    /// Takes over objects that other field managers applied (the Go operator applied with `kubectl`):
    /// before our first apply of such an object, their `Apply` entry in `managedFields` is renamed to ours,
    /// so that fields a later release no longer renders are removed instead of staying owned by them.
    /// Costs one read per object the first time this engine applies it, unless its owner never had anything
    /// applied ([`ApplyEngine::apply_first`]).
    pub fn taking_over_from(mut self, managers: impl IntoIterator<Item = String>) -> Self {
        self.take_over_from = managers.into_iter().collect();
        self
    }

    /// Renames the Apply entry of a manager in `take_over_from` on `live` to ours, unless ours is there.
    async fn take_over(&self, api: &Api<DynamicObject>, live: DynamicObject) -> Result<(), kube::Error> {
        let name = kube::ResourceExt::name_any(&live);
        let entries = live.metadata.managed_fields.unwrap_or_default();
        let is_apply = |e: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry| {
            e.operation.as_deref() == Some("Apply")
        };
        if entries
            .iter()
            .any(|e| is_apply(e) && e.manager.as_deref() == Some(&*self.field_manager))
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
                ops.push(serde_json::json!({"op": "replace", "path": format!("/metadata/managedFields/{index}/manager"), "value": &*self.field_manager}));
                // One Apply entry per manager: the first found becomes ours.
                break;
            }
        }
        if ops.len() == 1 {
            return Ok(());
        }
        let patch: json_patch::Patch =
            serde_json::from_value(Value::Array(ops)).map_err(kube::Error::SerdeError)?;
        api.patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await?;
        tracing::info!(object = %name, from = ?self.take_over_from, "took over field ownership");
        Ok(())
    }

    async fn apply_one(&self, mut item: Prepared, take_over: TakeOver) -> Prepared {
        let Some(kind) = &item.kind else { return item };
        let api = self.api(kind, &item.key.namespace);
        match self.read_first(&api, &item, take_over).await {
            ReadFirst::Unchanged(metadata) => {
                tracing::debug!(object = %item.key, "as an apply of this content left it: not written");
                self.observed.lock().unwrap_or_else(|p| p.into_inner()).insert(
                    item.key.clone(),
                    Observed::of(&item.object, *metadata, Vec::new()),
                );
                item.unchanged = true;
                return item;
            }
            ReadFirst::Failed(error) => {
                item.error = Some(error);
                return item;
            }
            ReadFirst::Write => {}
        }
        let known = self
            .observed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&item.key)
            .map(|o| o.left_out.clone())
            .unwrap_or_default();
        let _writing = Writing::begin(self, &item.key);
        match self.send(&api, &item, known.clone()).await {
            Ok(Sent {
                applied,
                left_out,
                took_back,
            }) => {
                tracing::debug!(object = %item.key, "applied");
                let learned = left_out.len() > known.len();
                let now = Observed::of(&item.object, applied.metadata, left_out);
                let before = self
                    .observed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(item.key.clone(), now.clone());
                // Taking fields back from another manager is a correction; finding a field another manager took
                // through a subresource is none: it is left to it.
                item.drift_corrected = before.is_some_and(|b| {
                    b.content == now.content && (took_back || (!learned && undid_a_change(&b, &now)))
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
                item.lasting = refused_for_good(&e);
                item.error = Some(api_error(&e));
            }
        }
        item
    }

    /// The read before an apply, when one is due: of every object for an engine that writes only changes
    /// ([`ApplyEngine::writing_only_changes`]) and for [`TakeOver::CheckAll`], else of an object this engine
    /// has not applied in this process ([`TakeOver::Check`]), where it also takes the object over from the
    /// managers the engine replaces. [`ReadFirst::Write`] also when no read was due.
    async fn read_first(&self, api: &Api<DynamicObject>, item: &Prepared, take_over: TakeOver) -> ReadFirst {
        // Once applied by this engine, the object is as `observed` says: no further read needed.
        let applied_before = self
            .observed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&item.key);
        let first_here = take_over != TakeOver::Skip && !applied_before;
        if !(self.write_only_changes || take_over == TakeOver::CheckAll || first_here) {
            return ReadFirst::Write;
        }
        let live = match api.get_opt(&item.key.name).await {
            Ok(live) => live,
            Err(e) if first_here && !self.take_over_from.is_empty() => {
                return ReadFirst::Failed(format!("failed to take over field ownership: {}", api_error(&e)));
            }
            Err(e) => {
                tracing::debug!(object = %item.key, error = %api_error(&e), "not read before applying");
                None
            }
        };
        let Some(live) = live else {
            return ReadFirst::Write;
        };
        if self.would_leave_unwritten(&live, item) {
            return ReadFirst::Unchanged(Box::new(live.metadata));
        }
        if first_here
            && !self.take_over_from.is_empty()
            && let Err(e) = self.take_over(api, live).await
        {
            return ReadFirst::Failed(format!("failed to take over field ownership: {}", api_error(&e)));
        }
        ReadFirst::Write
    }

    /// Server-side applies `item` without the fields `left_out` (see [`Observed::left_out`]), first without
    /// force: when that conflicts, the fields another manager last wrote through a subresource (`scale`) are
    /// added to `left_out` and the rest is applied with force, taking every other field back.
    async fn send(
        &self,
        api: &Api<DynamicObject>,
        item: &Prepared,
        mut left_out: Vec<String>,
    ) -> Result<Sent, kube::Error> {
        let mut object = item.object.clone();
        left_out.retain(|path| crate::managed_fields::remove_path(&mut object, path));
        let params = PatchParams::apply(&self.field_manager);
        let conflict = match api.patch(&item.key.name, &params, &Patch::Apply(&object)).await {
            Ok(applied) => {
                return Ok(Sent {
                    applied,
                    left_out,
                    took_back: false,
                });
            }
            Err(kube::Error::Api(status)) if status.code == 409 => status,
            Err(e) => return Err(e),
        };
        let mut took_back = false;
        for found in crate::managed_fields::conflicts(&conflict) {
            if found.subresource.is_some()
                && !left_out.contains(&found.field)
                && crate::managed_fields::remove_path(&mut object, &found.field)
            {
                tracing::info!(object = %item.key, field = %found.field, manager = %found.manager,
                    subresource = ?found.subresource, "left to the manager that writes it through a subresource");
                left_out.push(found.field);
            } else {
                took_back = true;
            }
        }
        let applied = api
            .patch(&item.key.name, &params.force(), &Patch::Apply(&object))
            .await?;
        Ok(Sent {
            applied,
            left_out,
            took_back,
        })
    }

    /// Whether `item` is left unwritten, `live` being the object as it is: an apply of the same content (the
    /// digest `item` is annotated with) with this engine's field manager left it, and it still holds every
    /// field of it ([`first_unheld`]). The rule the apply (of an object read before it, see [`TakeOver`] and
    /// `ApplyEngine::writing_only_changes`) and the plan share.
    pub(crate) fn would_leave_unwritten(&self, live: &DynamicObject, item: &Prepared) -> bool {
        let entries = live.metadata.managed_fields.as_deref().unwrap_or_default();
        let owners = FieldOwners::of(entries, &self.field_manager);
        // The digest first, and strictly: only an apply of this very content can have given the fields it
        // owns alone other values than this content has.
        let applied_digest = item.object["metadata"]["annotations"][APPLIED_DIGEST_ANNOTATION].as_str();
        let live_digest = live
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(APPLIED_DIGEST_ANNOTATION))
            .map(String::as_str);
        if !owners.has_ours() || applied_digest.is_none() || live_digest != applied_digest {
            return false;
        }
        let Ok(live) = serde_json::to_value(live) else {
            return false;
        };
        let stored = as_stored(&item.key, &item.object);
        match first_unheld(&live, stored.as_ref().unwrap_or(&item.object), &owners) {
            None => true,
            Some(field) => {
                tracing::debug!(object = %item.key, field = %field, "not as an apply of this content left it");
                false
            }
        }
    }

    /// Whether `key`, as `live` shows it (a watch event), is as this engine's last apply of it left it (see
    /// [`left_as`]): only its status or metadata changed since (controllers write both), or the event is our
    /// own apply's. `false` for an object this engine never applied. Watches use it to tell drift from the
    /// writes that are not, so an apply never triggers the next one.
    pub fn left_as_applied(&self, key: &ObjectKey, live: &LiveMeta) -> bool {
        self.observed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .is_some_and(|o| left_as(o, live))
    }

    /// Waits until this engine's write of `key` in flight, if any, is recorded (or failed): a watch event that
    /// shows the object not as the last apply left it, while it is being written, may be that write's own,
    /// come before its record; judged after it, it is not drift.
    pub fn written(&self, key: &ObjectKey) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let mut done = self
            .writing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)?
            .subscribe();
        Some(async move {
            let _ = done.wait_for(|done| *done).await;
        })
    }

    /// Whether this engine's record of `key` is of a later version than `resource_version` (numbers, as the
    /// API server gives them): an event of that version is history the record covers.
    pub fn recorded_later_than(&self, key: &ObjectKey, resource_version: &str) -> bool {
        matches!((self.recorded_version(key), resource_version.parse::<u64>()), (Some(recorded), Ok(version)) if version < recorded)
    }

    /// The resourceVersion of this engine's record of `key`, as a number.
    fn recorded_version(&self, key: &ObjectKey) -> Option<u64> {
        let observed = self.observed.lock().unwrap_or_else(|p| p.into_inner());
        observed.get(key)?.resource_version
    }

    /// Whether this engine's record of `key` is of `resource_version` or later: an event of that version shows
    /// the object as it was before (or at) the recorded write. `false` when either version is not the decimal
    /// number every kube-apiserver gives, so that they cannot be ordered.
    pub fn recorded_since(&self, key: &ObjectKey, resource_version: &str) -> bool {
        matches!((self.recorded_version(key), resource_version.parse::<u64>()), (Some(recorded), Ok(version)) if version <= recorded)
    }

    /// Whether this engine applied `key` (and has not pruned it since).
    pub fn has_applied(&self, key: &ObjectKey) -> bool {
        self.observed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(key)
    }

    /// The objects of `group` and `kind` this engine applied (and has not pruned since).
    pub fn applied_of_kind(&self, group: &str, kind: &str) -> Vec<ObjectKey> {
        self.observed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .filter(|k| k.group == group && k.kind == kind)
            .cloned()
            .collect()
    }

    /// What this engine's applies left of the objects of `group` and `kind`, and the resourceVersion of the
    /// earliest of them: a watch of the kind started from that version sees every later change of each, so
    /// it needs no list to begin with. `None` when nothing of the kind was applied, or a version is not the
    /// decimal number every kube-apiserver gives (its etcd revision), so that they cannot be ordered.
    pub fn applied_since(&self, group: &str, kind: &str) -> Option<AppliedSince> {
        let observed = self.observed.lock().unwrap_or_else(|p| p.into_inner());
        applied_since(
            observed
                .iter()
                .filter(|(k, _)| k.group == group && k.kind == kind),
        )
    }

    pub(crate) fn api(&self, kind: &ResolvedKind, namespace: &str) -> Api<DynamicObject> {
        let client = self.discovery.client();
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
        let api: Api<CustomResourceDefinition> = Api::all(self.discovery.client());
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

    async fn prune(
        &self,
        stale: &Resource,
        default_namespace: &str,
        current: &BTreeSet<ObjectKey>,
        removal: Removal,
    ) -> Result<Pruned, String> {
        let api = match self
            .prune_target(stale, default_namespace, current, removal)
            .await?
        {
            PruneTarget::Delete(api) => api,
            PruneTarget::Absent => return Ok(Pruned::Released),
            PruneTarget::NotOurs => {
                tracing::warn!(object = %ObjectKey::of(stale), "not pruning an object without the operator's label");
                return Ok(Pruned::Released);
            }
            PruneTarget::Shared(why) => {
                tracing::info!(object = %ObjectKey::of(stale), reason = %why,
                    "not pruning a shared namespace; released from the inventory");
                return Ok(Pruned::Released);
            }
            PruneTarget::Spared => {
                tracing::info!(object = %ObjectKey::of(stale),
                    "Namespaces and CustomResourceDefinitions are never pruned; left in place, released from the inventory");
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
            Err(e @ kube::Error::Api(_)) if is_refusal(&e) => Ok(Pruned::Refused(api_error(&e))),
            Err(e) => Err(api_error(&e)),
        }
    }

    /// What removing `stale` comes to: only a live object carrying the operator's label is deleted; a prune
    /// never deletes a Namespace or a CustomResourceDefinition, and a deletion deletes a Namespace only when it
    /// is not a system one and holds nothing the operator does not own.
    pub(crate) async fn prune_target(
        &self,
        stale: &Resource,
        default_namespace: &str,
        current: &BTreeSet<ObjectKey>,
        removal: Removal,
    ) -> Result<PruneTarget, String> {
        if matches!(removal, Removal::Prune(_)) && inventory::is_never_pruned(stale) {
            return Ok(PruneTarget::Spared);
        }
        let namespace_kind = is_namespace_kind(&stale.group, &stale.kind);
        if namespace_kind && SYSTEM_NAMESPACES.contains(&stale.name.as_str()) {
            return Ok(PruneTarget::Shared("a system namespace".into()));
        }
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
        // Inventories are normalised before they are compared with the render, but discovery may have
        // failed then: the render still having the object, named otherwise, leaves nothing to prune.
        let effective = ObjectKey {
            group: stale.group.clone(),
            kind: stale.kind.clone(),
            namespace: if kind.namespaced {
                namespace.into()
            } else {
                Atom::default()
            },
            name: stale.name.clone(),
        };
        if current.contains(&effective) {
            return Ok(PruneTarget::Absent);
        }
        let api = self.api(&kind, namespace);
        let live = match api.get_opt(&stale.name).await {
            // Being deleted already: nothing left to do.
            Ok(Some(live)) if live.metadata.deletion_timestamp.is_some() => return Ok(PruneTarget::Absent),
            Ok(Some(live)) => live,
            Ok(None) => return Ok(PruneTarget::Absent),
            Err(e) => return Err(api_error(&e)),
        };
        if !is_owned(live.metadata.labels.as_ref()) {
            return Ok(PruneTarget::NotOurs);
        }
        if namespace_kind && let Some(foreign) = self.foreign_object_in(&stale.name).await? {
            return Ok(PruneTarget::Shared(format!(
                "it holds {foreign}, not the operator's"
            )));
        }
        Ok(PruneTarget::Delete(Box::new(api)))
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
    /// A Namespace that is not the operator's to delete although labelled so (a system namespace, or one
    /// holding objects the operator does not own; the reason): left alone, dropped from the inventory.
    Shared(String),
    /// A Namespace or CustomResourceDefinition the render no longer has: never pruned
    /// ([`inventory::is_never_pruned`]); left alone, dropped from the inventory.
    Spared,
}

/// How the objects of the inventory that are not in the render are removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Removal {
    /// [`ApplyEngine::apply`]: the render replaces the inventory; Namespaces and CRDs stay.
    Prune(TakeOver),
    /// [`ApplyEngine::delete`]: every object named goes.
    Delete,
}

enum Pruned {
    Deleted,
    Released,
    /// The API server refused the deletion (the error).
    Refused(String),
}

/// Namespaces every cluster has; never the operator's, whatever their labels say.
const SYSTEM_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

/// Puts a digest of `object` (without the annotation itself) into its `applied-digest` annotation.
/// An object without annotations is digested without the (empty or null) field.
fn annotate_digest(object: &mut Value) {
    let metadata = object["metadata"]
        .as_object_mut()
        .expect("parse_manifests checked metadata");
    if let Some(annotations) = metadata.get_mut("annotations").and_then(Value::as_object_mut) {
        annotations.remove(APPLIED_DIGEST_ANNOTATION);
    }
    if metadata
        .get("annotations")
        .is_some_and(|a| a.is_null() || a.as_object().is_some_and(|a| a.is_empty()))
    {
        metadata.remove("annotations");
    }
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(object.to_string())));
    let metadata = object["metadata"]
        .as_object_mut()
        .expect("parse_manifests checked metadata");
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Default::default()));
    if !annotations.is_object() {
        *annotations = Value::Object(Default::default());
    }
    annotations[APPLIED_DIGEST_ANNOTATION] = Value::String(digest);
}

/// `applied` as the API server stores it, where that differs: a Secret's write-only `stringData` goes into
/// its `data`, base64-encoded (and wins over `data` for the same key).
fn as_stored(key: &ObjectKey, applied: &Value) -> Option<Value> {
    use base64::Engine;
    let string_data = applied.get("stringData")?.as_object()?;
    if !(key.group.is_empty() && key.kind == "Secret") {
        return None;
    }
    let mut stored = applied.clone();
    let object = stored.as_object_mut()?;
    object.remove("stringData");
    let data = object
        .entry("data")
        .or_insert_with(|| Value::Object(Default::default()));
    if !data.is_object() {
        *data = Value::Object(Default::default());
    }
    for (name, value) in string_data {
        let encoded = base64::engine::general_purpose::STANDARD.encode(value.as_str().unwrap_or_default());
        data[name.as_str()] = Value::String(encoded);
    }
    Some(stored)
}

/// Whether the API server leaves `value` out of the objects it stores when it is set (Kubernetes' own kinds
/// omit empty fields: `readOnly: false`, `initialDelaySeconds: 0`, `resources: {}`): `null`, `false`, `0`,
/// `""`, `{}` and `[]`.
fn is_zero(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// The first field (`.spec.replicas`, `.spec.ports[0].port`) where `live` does not hold what `applied` sets;
/// `None` when `live` holds every field `applied` sets, with the same value: objects key by key, lists item
/// by item (the same length), scalars equal (numbers by value). What the server added (defaults, status,
/// `metadata.uid`, other managers' fields) does not count; a field the apply sets to an empty value
/// ([`is_zero`]) holds when the live object lacks it, and a field with another value holds when the
/// operator's apply owns it alone (`owners`, see [`FieldOwners::ours_alone`]). Applied with the digest
/// annotation, it tells that the live object is as the apply of that very content left it: no one changed a
/// field the apply owns since.
fn first_unheld(live: &Value, applied: &Value, owners: &FieldOwners) -> Option<String> {
    match (live, applied) {
        (Value::Object(live), Value::Object(applied)) => applied.iter().find_map(|(key, value)| {
            let at = |inner: String| format!(".{key}{inner}");
            if key == "creationTimestamp" && value.is_null() {
                // Set by the API server whatever the apply says (charts render it as `null`).
                return None;
            }
            match live.get(key) {
                Some(live) => first_unheld(live, value, &owners.field(key)).map(at),
                None => (!is_zero(value)).then(|| at(String::new())),
            }
        }),
        (Value::Array(live), Value::Array(applied)) if live.len() == applied.len() => {
            live.iter().zip(applied).enumerate().find_map(|(index, (l, a))| {
                first_unheld(l, a, &owners.item(l, index)).map(|inner| format!("[{index}]{inner}"))
            })
        }
        (Value::Number(live), Value::Number(applied)) if live.as_f64() == applied.as_f64() => None,
        (live, applied) if live == applied => None,
        // Another value than applied, which the API server gave it: applying again gives it again.
        _ if owners.ours_alone() => None,
        _ => Some(String::new()),
    }
}

fn is_namespace_kind(group: &str, kind: &str) -> bool {
    group.is_empty() && kind == "Namespace"
}

fn is_owned(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels
        .and_then(|l| l.get(OWNED_LABEL.0))
        .is_some_and(|v| v == OWNED_LABEL.1)
}

/// Whether the Go operator's `setLabel` labels the pod template of this kind too: Deployments,
/// ReplicaSets, StatefulSets and DaemonSets (`apps`, and the long-gone `extensions`), and Jobs.
fn has_pod_template(group: &str, kind: &str) -> bool {
    match group {
        "apps" | "extensions" => matches!(kind, "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet"),
        "batch" => kind == "Job",
        _ => false,
    }
}

/// Puts the operator's label (only that one: the release label would change every pod template at every
/// upgrade) on `spec.template.metadata.labels`, as the Go operator does.
fn label_pod_template(object: &mut Value) {
    let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let mut at = spec
        .entry("template")
        .or_insert_with(|| Value::Object(Default::default()));
    for field in ["metadata", "labels"] {
        let Some(map) = at.as_object_mut() else { return };
        at = map
            .entry(field)
            .or_insert_with(|| Value::Object(Default::default()));
        if at.is_null() {
            *at = Value::Object(Default::default());
        }
    }
    if let Some(labels) = at.as_object_mut() {
        labels.insert(OWNED_LABEL.0.into(), Value::String(OWNED_LABEL.1.into()));
    }
}

/// Whether an object without the operator's label in a Namespace the operator would prune keeps that
/// Namespace: anything but what the cluster makes by itself in every namespace or from other objects —
/// Events, the `kube-root-ca.crt` ConfigMap and the `default` ServiceAccount — and objects with owner
/// references (Pods of ReplicaSets, EndpointSlices of Services, ...), which go with their owners; an owner
/// that is not the operator's counts itself.
fn counts_as_foreign(group: &str, kind: &str, name: &str, has_owners: bool) -> bool {
    let generated = match (group, kind) {
        ("" | "events.k8s.io", "Event") => true,
        ("", "ConfigMap") => name == "kube-root-ca.crt",
        ("", "ServiceAccount") => name == "default",
        _ => false,
    };
    !generated && !has_owners
}

/// A refusal the API server will repeat: forbidden (by RBAC or admission, e.g. deleting `kube-system`),
/// not allowed for the kind, or in conflict with the object's state.
fn is_refusal(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if matches!(s.code, 403 | 405 | 409))
}

fn resource(key: &ObjectKey, version: &str, status: ResourceStatus, error: String) -> Resource {
    Resource {
        group: key.group.clone(),
        version: version.into(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_live_object_holds_what_was_applied_when_each_applied_field_is_there_unchanged() {
        let applied = json!({
            "metadata": {"name": "c", "creationTimestamp": null, "labels": {"a": "1"}, "annotations": {"d": "x"}},
            "spec": {"replicas": 2, "ports": [{"port": 80}], "gone": null,
                     "readOnly": false, "delay": 0, "prefix": "", "resources": {}, "args": []},
        });
        let live = json!({
            "metadata": {"name": "c", "uid": "u", "creationTimestamp": "2026-11-29T12:00:00Z",
                         "labels": {"a": "1", "other": "2"}, "annotations": {"d": "x"}},
            "spec": {"replicas": 2.0, "ports": [{"port": 80, "protocol": "TCP"}], "defaulted": true},
            "status": {"ready": true},
        });
        assert_eq!(
            first_unheld(&live, &applied, &FieldOwners::default()),
            None,
            "defaults, status and others' fields added; empty values the API server does not store left out; \
             the creation time set"
        );
        let cases = [
            (
                "/metadata/labels/a",
                json!("2"),
                ".metadata.labels.a",
                "a label we set changed",
            ),
            (
                "/metadata/annotations/d",
                json!("y"),
                ".metadata.annotations.d",
                "the digest changed",
            ),
            (
                "/spec/replicas",
                json!(3),
                ".spec.replicas",
                "a spec field we set changed",
            ),
            (
                "/spec/ports",
                json!([{"port": 80}, {"port": 81}]),
                ".spec.ports",
                "a list grew",
            ),
            (
                "/spec/ports/0/port",
                json!("80"),
                ".spec.ports[0].port",
                "a number turned string",
            ),
            ("/spec/gone", json!(1), ".spec.gone", "a field we clear came back"),
            (
                "/spec/readOnly",
                json!(true),
                ".spec.readOnly",
                "an empty value we set, set by another",
            ),
        ];
        for (pointer, value, field, why) in cases {
            let mut changed = live.clone();
            let (parent, field_name) = pointer.rsplit_once('/').unwrap();
            changed.pointer_mut(parent).unwrap()[field_name] = value;
            assert_eq!(
                first_unheld(&changed, &applied, &FieldOwners::default()).as_deref(),
                Some(field),
                "{why}"
            );
        }
        let mut removed = live.clone();
        removed["metadata"]["labels"].as_object_mut().unwrap().remove("a");
        assert_eq!(
            first_unheld(&removed, &applied, &FieldOwners::default()).as_deref(),
            Some(".metadata.labels.a"),
            "a label we set removed"
        );
    }

    #[test]
    fn a_value_the_api_server_gave_a_field_only_the_operators_apply_owns_holds() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
        let entry = |manager: &str, operation: &str, fields: Value| ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            fields_v1: Some(FieldsV1(fields)),
            ..ManagedFieldsEntry::default()
        };
        let ours = json!({"f:spec": {"f:schedulerName": {}, "f:args": {},
            "f:containers": {"k:{\"name\":\"app\"}": {".": {}, "f:name": {}, "f:cpu": {}}}}});
        let applied = json!({"spec": {"schedulerName": "", "args": ["-v"],
            "containers": [{"name": "app", "cpu": "1000m"}]}});
        // Defaulted and normalised by the API server.
        let live = json!({"spec": {"schedulerName": "default-scheduler", "args": ["-v"],
            "containers": [{"name": "app", "cpu": "1"}]}});
        let alone = [entry(DEFAULT_FIELD_MANAGER, "Apply", ours.clone())];
        assert_eq!(
            first_unheld(&live, &applied, &FieldOwners::of(&alone, DEFAULT_FIELD_MANAGER)),
            None
        );
        assert_eq!(
            first_unheld(&live, &applied, &FieldOwners::default()).as_deref(),
            Some(".spec.containers[0].cpu"),
            "without the operator's entry another value never holds"
        );
        let cases = [
            (
                json!({"f:spec": {"f:schedulerName": {}}}),
                ".spec.schedulerName",
                "a scheduler set by kubectl",
            ),
            (
                json!({"f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {"f:cpu": {}}}}}),
                ".spec.containers[0].cpu",
                "a container's field another manager took",
            ),
        ];
        for (theirs, field, why) in cases {
            let shared = [
                entry(DEFAULT_FIELD_MANAGER, "Apply", ours.clone()),
                entry("kubectl", "Update", theirs),
            ];
            assert_eq!(
                first_unheld(&live, &applied, &FieldOwners::of(&shared, DEFAULT_FIELD_MANAGER)).as_deref(),
                Some(field),
                "{why}"
            );
        }
        let mut edited = live.clone();
        edited["spec"]["args"] = json!(["-v", "-x"]);
        let atomic = [
            entry(DEFAULT_FIELD_MANAGER, "Apply", ours.clone()),
            entry("kubectl", "Update", json!({"f:spec": {"f:args": {}}})),
        ];
        assert_eq!(
            first_unheld(
                &edited,
                &applied,
                &FieldOwners::of(&atomic, DEFAULT_FIELD_MANAGER)
            )
            .as_deref(),
            Some(".spec.args"),
            "an atomic list another manager replaced"
        );
    }

    #[test]
    fn a_secrets_string_data_is_held_by_its_data() {
        let key = |kind: &str| ObjectKey {
            group: Default::default(),
            kind: kind.into(),
            namespace: "kube-system".into(),
            name: "cloud-config".into(),
        };
        let applied = json!({"metadata": {"name": "cloud-config"}, "stringData": {"cloud.conf": "[Global]"}});
        let live = json!({"metadata": {"name": "cloud-config"}, "data": {"cloud.conf": "W0dsb2JhbF0="}});
        let stored = as_stored(&key("Secret"), &applied).unwrap();
        assert_eq!(first_unheld(&live, &stored, &FieldOwners::default()), None);
        let mut edited = live.clone();
        edited["data"]["cloud.conf"] = json!("e30=");
        assert_eq!(
            first_unheld(&edited, &stored, &FieldOwners::default()).as_deref(),
            Some(".data.cloud.conf")
        );
        assert_eq!(as_stored(&key("ConfigMap"), &applied), None, "only a Secret's");
    }

    #[test]
    fn the_digest_covers_the_content_and_not_itself() {
        let mut first = json!({"metadata": {"name": "c"}, "spec": {"x": 1}});
        annotate_digest(&mut first);
        let digest = first["metadata"]["annotations"][APPLIED_DIGEST_ANNOTATION].clone();
        assert!(digest.as_str().unwrap().starts_with("sha256:"));
        let mut again = first.clone();
        annotate_digest(&mut again);
        assert_eq!(again, first, "annotating an annotated object changes nothing");
        let mut other = json!({"metadata": {"name": "c", "annotations": null}, "spec": {"x": 2}});
        annotate_digest(&mut other);
        assert_ne!(
            other["metadata"]["annotations"][APPLIED_DIGEST_ANNOTATION],
            digest
        );
    }

    #[test]
    fn writes_to_the_status_leave_the_fingerprint_and_other_writes_move_it() {
        let meta = |entries: serde_json::Value| -> kube::api::ObjectMeta {
            serde_json::from_value(json!({"name": "x", "managedFields": entries})).unwrap()
        };
        let ours = json!({"manager": "cluster-stack-operator", "operation": "Apply", "apiVersion": "v1",
            "time": "2026-11-23T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {}}});
        let status = |time: &str| {
            json!({"manager": "kube-apiserver", "operation": "Update", "apiVersion": "v1",
            "time": time, "subresource": "status", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}})
        };
        let edit = |time: &str| {
            json!({"manager": "kubectl-edit", "operation": "Update", "apiVersion": "v1",
            "time": time, "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:x": {}}}})
        };
        let applied = LiveMeta::of(&meta(json!([ours])));
        let after_status = LiveMeta::of(&meta(json!([ours, status("2026-11-23T10:05:00Z")])));
        assert_eq!(applied.writes, after_status.writes, "a status write");
        let edited = LiveMeta::of(&meta(json!([ours, edit("2026-11-23T10:06:00Z")])));
        assert_ne!(applied.writes, edited.writes, "another manager's write");
        let edited_again = LiveMeta::of(&meta(json!([ours, edit("2026-11-23T10:07:00Z")])));
        assert_ne!(
            edited.writes, edited_again.writes,
            "the same manager writing again"
        );
        assert_eq!(
            applied.ours, edited.ours,
            "another manager's write of its own field leaves our entry"
        );
        let mut taken = ours.clone();
        taken["fieldsV1"] = json!({});
        let took = LiveMeta::of(&meta(json!([taken, edit("2026-11-23T10:06:00Z")])));
        assert_ne!(
            applied.ours, took.ours,
            "a field of ours taken by another manager"
        );
        let mut reapplied = ours;
        reapplied["time"] = json!("2026-11-23T10:08:00Z");
        assert_ne!(
            applied.ours,
            LiveMeta::of(&meta(json!([reapplied]))).ours,
            "applied again with our field manager (by something else)"
        );
    }

    #[test]
    fn a_watched_object_is_as_applied_when_neither_its_identity_nor_its_spec_moved() {
        let applied = |generation: Option<i64>| Observed {
            content: [0; 16],
            uid: Some("a".into()),
            generation,
            writes: 10,
            ours: 1,
            resource_version: None,
            left_out: Vec::new(),
        };
        let scaled = Observed {
            left_out: vec![".spec.replicas".into()],
            ..applied(Some(2))
        };
        let live = |uid: &str, generation: Option<i64>, writes: u64| LiveMeta {
            uid: Some(uid.into()),
            generation,
            writes,
            ours: 1,
        };
        let taken = |generation: Option<i64>| LiveMeta {
            ours: 2,
            ..live("a", generation, 11)
        };
        for (observed, seen, as_applied, why) in [
            (
                applied(Some(2)),
                live("a", Some(2), 10),
                true,
                "our own apply's event",
            ),
            (
                applied(Some(2)),
                live("a", Some(2), 11),
                true,
                "a status or metadata write of a kind with a generation",
            ),
            (
                applied(Some(2)),
                live("a", Some(3), 12),
                false,
                "someone edited the spec",
            ),
            (
                applied(Some(2)),
                live("b", Some(1), 13),
                false,
                "deleted and made again",
            ),
            (
                scaled.clone(),
                live("a", Some(4), 10),
                true,
                "an autoscaler's replicas (through the scale subresource) moved the generation",
            ),
            (
                scaled,
                live("a", Some(5), 12),
                false,
                "a Deployment whose replicas an autoscaler sets, edited by someone else too",
            ),
            (
                applied(Some(2)),
                taken(Some(2)),
                false,
                "a label we set taken by another manager (no generation moves)",
            ),
            (applied(None), taken(None), false, "a ConfigMap's field taken"),
            (applied(None), live("a", None, 10), true, "a ConfigMap as applied"),
            (
                applied(None),
                live("a", None, 11),
                false,
                "a ConfigMap written since (outside its status)",
            ),
        ] {
            assert_eq!(left_as(&observed, &seen), as_applied, "{why}");
        }
    }

    #[test]
    fn a_watch_can_start_from_the_earliest_apply_only_when_every_version_is_a_number() {
        let key = |name: &str| ObjectKey {
            group: "apps".into(),
            kind: "Deployment".into(),
            namespace: "kube-system".into(),
            name: name.into(),
        };
        let at = |version: Option<&str>| Observed {
            content: [0; 16],
            uid: Some("u".into()),
            generation: Some(1),
            writes: 7,
            ours: 3,
            resource_version: numeric_version(version),
            left_out: Vec::new(),
        };
        let (a, b, c) = (key("a"), key("b"), key("c"));
        let (ten, nine, hundred) = (at(Some("10")), at(Some("9")), at(Some("100")));
        let since =
            applied_since([(&a, &ten), (&b, &hundred), (&c, &nine)].into_iter()).expect("numbers order");
        assert_eq!(since.resource_version, "9", "numerically, not as text");
        assert_eq!(since.objects.len(), 3);
        assert_eq!(
            since.objects[0].1,
            LiveMeta {
                uid: Some("u".into()),
                generation: Some(1),
                writes: 7,
                ours: 3,
            }
        );
        let opaque = at(Some("a1b2"));
        let missing = at(None);
        for (records, why) in [
            (vec![], "nothing applied"),
            (vec![(&a, &ten), (&b, &opaque)], "a version that is no number"),
            (vec![(&a, &missing)], "no version recorded"),
        ] {
            assert_eq!(applied_since(records.into_iter()), None, "{why}");
        }
    }

    #[test]
    fn records_are_found_replaced_and_removed_by_key_and_kept_in_key_order() {
        let key = |kind: &str, name: &str| ObjectKey {
            group: Default::default(),
            kind: kind.into(),
            namespace: "kube-system".into(),
            name: name.into(),
        };
        let at = |writes: u64| Observed {
            content: [0; 16],
            uid: None,
            generation: None,
            writes,
            ours: 1,
            resource_version: None,
            left_out: Vec::new(),
        };
        let mut records = Records::default();
        for (i, name) in ["m", "c", "x", "a", "k"].into_iter().enumerate() {
            assert_eq!(records.insert(key("Service", name), at(i as u64)), None);
        }
        assert_eq!(
            records.insert(key("ConfigMap", "m"), at(9)),
            None,
            "another kind, the same name"
        );
        assert_eq!(
            records.insert(key("Service", "c"), at(7)),
            Some(at(1)),
            "replaced"
        );
        assert_eq!(records.get(&key("Service", "c")), Some(&at(7)));
        assert_eq!(records.get(&key("ConfigMap", "m")), Some(&at(9)));
        assert!(records.contains_key(&key("Service", "x")) && !records.contains_key(&key("Service", "y")));
        assert_eq!(records.remove(&key("Service", "x")), Some(at(2)));
        assert_eq!(records.remove(&key("Service", "x")), None);
        let names: Vec<String> = records.keys().map(|k| format!("{}/{}", k.kind, k.name)).collect();
        assert_eq!(
            names,
            ["ConfigMap/m", "Service/a", "Service/c", "Service/k", "Service/m"]
        );
        assert_eq!(records.iter().count(), 5);
        assert!(
            records.0.capacity() < 2 * 6 + 4,
            "no room doubled: {}",
            records.0.capacity()
        );
    }

    #[test]
    fn only_a_delete_or_an_edit_between_two_applies_is_drift() {
        let at = |uid: &str, generation: i64| Observed {
            content: [0; 16],
            uid: Some(uid.into()),
            generation: Some(generation),
            writes: 0,
            ours: 0,
            resource_version: None,
            left_out: Vec::new(),
        };
        let scaled = |generation: i64, writes: u64| Observed {
            writes,
            left_out: vec![".spec.replicas".into()],
            ..at("a", generation)
        };
        for (before, now, drift, why) in [
            (at("a", 3), at("a", 3), false, "nothing changed"),
            (
                at("a", 3),
                at("a", 4),
                false,
                "a conversion that does not round-trip moves it once per apply",
            ),
            (at("a", 3), at("a", 5), true, "edited, then put back"),
            (at("a", 3), at("b", 1), true, "deleted and made again"),
            (
                at("a", 3),
                at("b", 4),
                true,
                "deleted and made again, any generation",
            ),
            (
                scaled(3, 0),
                scaled(6, 0),
                false,
                "an autoscaler scaled three times, nobody else wrote",
            ),
            (
                scaled(3, 0),
                scaled(5, 1),
                true,
                "someone else wrote, then put back",
            ),
            (
                at("a", 3),
                Observed {
                    ours: 1,
                    ..at("a", 3)
                },
                true,
                "a label of ours changed and put back (no generation moves)",
            ),
        ] {
            assert_eq!(undid_a_change(&before, &now), drift, "{why}");
        }
    }

    #[test]
    fn pod_templates_of_the_go_operators_kinds_get_the_label() {
        for (group, kind) in [
            ("apps", "Deployment"),
            ("apps", "ReplicaSet"),
            ("apps", "StatefulSet"),
            ("apps", "DaemonSet"),
            ("extensions", "Deployment"),
            ("batch", "Job"),
        ] {
            assert!(has_pod_template(group, kind), "{group}/{kind}");
        }
        for (group, kind) in [("batch", "CronJob"), ("", "Pod"), ("", "ReplicationController")] {
            assert!(
                !has_pod_template(group, kind),
                "{group}/{kind}: the Go operator leaves it"
            );
        }

        let mut deployment =
            json!({"spec": {"template": {"metadata": {"labels": {"app": "web"}}, "spec": {}}}});
        label_pod_template(&mut deployment);
        assert_eq!(
            deployment["spec"]["template"]["metadata"]["labels"],
            json!({"app": "web", "clusterstack.x-k8s.io/instance": "owned"})
        );
        let mut bare = json!({"spec": {"template": {"metadata": {"labels": null}}}});
        label_pod_template(&mut bare);
        assert_eq!(
            bare["spec"]["template"]["metadata"]["labels"],
            json!({"clusterstack.x-k8s.io/instance": "owned"})
        );
        let mut no_spec = json!({"metadata": {"name": "x"}});
        label_pod_template(&mut no_spec);
        assert_eq!(no_spec, json!({"metadata": {"name": "x"}}), "nothing invented");
    }

    #[test]
    fn what_the_cluster_makes_in_every_namespace_is_not_foreign() {
        assert!(!counts_as_foreign("", "Event", "x.123", false));
        assert!(!counts_as_foreign("events.k8s.io", "Event", "x.123", false));
        assert!(!counts_as_foreign("", "ConfigMap", "kube-root-ca.crt", false));
        assert!(!counts_as_foreign("", "ServiceAccount", "default", false));
        assert!(
            !counts_as_foreign("", "Pod", "web-5d9c-abcde", true),
            "owned by a ReplicaSet"
        );
        assert!(counts_as_foreign("", "ConfigMap", "grafana", false));
        assert!(counts_as_foreign("", "ServiceAccount", "grafana", false));
        assert!(counts_as_foreign("coordination.k8s.io", "Lease", "leader", false));
    }

    #[test]
    fn refusals_are_told_from_passing_failures() {
        let status = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("no", "Forbidden")
                    .with_code(code)
                    .boxed(),
            )
        };
        for code in [403, 405, 409] {
            assert!(is_refusal(&status(code)), "{code}");
        }
        for code in [404, 429, 500, 503] {
            assert!(!is_refusal(&status(code)), "{code}");
        }
    }
}
