//! Drift found by watching: per workload cluster, one metadata-only watch per kind the operator applied
//! there, selected by the operator's label. An event that shows an object of ours not as our last apply left
//! it (another uid, another spec generation, or for kinds without one any write), or its deletion (or the
//! loss of the label, which takes it out of the selection), tells the owner of that cluster's addons
//! ([`DriftNotifier`]) at once; so does a (re)list that finds such an object. The watches' caches answer
//! [`DriftWatch::verdict`]: whether every object of an inventory is as applied, so that a periodic pass
//! writes nothing when nothing drifted, and whether that can be told at all (a kind not watched or not
//! listed yet: the pass re-applies, as before).
//!
//! The watches use the workload cluster's own client, over its one HTTP/2 connection (`connection.rs`: its
//! timeout bounds the start of each response, never a quiet watch; the API server ends each watch after its
//! own timeout and the watcher resumes from the last resourceVersion). They stop when
//! the [`DriftWatch`] is dropped, which happens when the workload cluster's client is rebuilt or forgotten.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use cso_api::{OWNED_LABEL, common::Resource};
use futures::StreamExt;
use kube::{
    Api,
    api::DynamicObject,
    core::{GroupVersionKind, PartialObjectMeta},
    runtime::{WatchStreamExt, watcher},
};

use crate::{ApplyEngine, ClusterDiscovery, engine::LiveMeta, inventory::ObjectKey};

/// How long one watch request lasts before the watcher resumes with another. kube's default (290 s) is
/// sized for a client whose read timeout ends quiet connections; these watches ride a connection kept alive
/// by HTTP/2 pings, and each new request costs both sides a little: with ten kinds in each of a thousand
/// workload clusters, 290 s meant about 35 new watch requests a second from an idle operator.
const WATCH_TIMEOUT_SECONDS: u32 = 1800;

/// Told `(namespace, cluster)` when an object the operator applied to that Cluster's workload cluster
/// drifted.
pub type DriftNotifier = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// What the watches tell about an inventory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every object is there, as our last apply left it.
    AsApplied,
    /// These objects are gone or were changed by someone else.
    Drifted(Vec<ObjectKey>),
    /// Cannot be told: a kind is not watched or not listed yet, or an object was not applied by this
    /// process (after a restart).
    Unknown,
}

/// The objects of one kind, as the watch shows them.
#[derive(Default)]
struct KindCache {
    objects: Mutex<HashMap<(String, String), LiveMeta>>,
    listed: AtomicBool,
}

struct KindWatch {
    cache: Arc<KindCache>,
    task: tokio::task::AbortHandle,
}

/// The drift watches of one workload cluster.
pub struct DriftWatch {
    /// `(namespace, cluster)` of the Cluster, for the notifier.
    owner: (String, String),
    /// The workload cluster's discovery; its client is the one the watches use.
    discovery: Arc<ClusterDiscovery>,
    engine: ApplyEngine,
    notify: DriftNotifier,
    /// By `(group, kind)`.
    kinds: Mutex<HashMap<(String, String), KindWatch>>,
}

impl std::fmt::Debug for DriftWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds = self.kinds.lock().map(|k| k.len()).unwrap_or_default();
        f.debug_struct("DriftWatch")
            .field("owner", &self.owner)
            .field("kinds", &kinds)
            .finish_non_exhaustive()
    }
}

impl Drop for DriftWatch {
    fn drop(&mut self) {
        for watch in self.kinds.lock().unwrap_or_else(|p| p.into_inner()).values() {
            watch.task.abort();
        }
    }
}

impl DriftWatch {
    /// Watches for the Cluster `owner` (`(namespace, name)`) through `client` (one without a read timeout),
    /// telling drift of what `engine` applied to `notify`.
    pub fn new(
        owner: (String, String),
        discovery: Arc<ClusterDiscovery>,
        engine: ApplyEngine,
        notify: DriftNotifier,
    ) -> Self {
        DriftWatch {
            owner,
            discovery,
            engine,
            notify,
            kinds: Mutex::default(),
        }
    }

    /// Starts watching the kinds of `resources` not watched yet (a kind the cluster does not serve is
    /// skipped: its objects were not applied either).
    pub async fn watch(&self, resources: &[Resource]) {
        let wanted: BTreeSet<(&str, &str, &str)> = resources
            .iter()
            .map(|r| (r.group.as_str(), r.version.as_str(), r.kind.as_str()))
            .collect();
        for (group, version, kind) in wanted {
            let id = (group.to_owned(), kind.to_owned());
            if self
                .kinds
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(&id)
            {
                continue;
            }
            let Ok(resolved) = self
                .discovery
                .resolve(&GroupVersionKind::gvk(group, version, kind))
                .await
            else {
                continue;
            };
            let mut kinds = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
            if kinds.contains_key(&id) {
                continue;
            }
            let cache = Arc::new(KindCache::default());
            let api: Api<PartialObjectMeta<DynamicObject>> =
                Api::all_with(self.discovery.client().clone(), &resolved.resource);
            let task = tokio::spawn(follow(
                api,
                id.clone(),
                cache.clone(),
                self.engine.clone(),
                self.owner.clone(),
                self.notify.clone(),
            ));
            kinds.insert(
                id,
                KindWatch {
                    cache,
                    task: task.abort_handle(),
                },
            );
        }
    }

    /// Whether the objects of `inventory` (synced entries only) are as this process's applies left them.
    pub fn verdict(&self, inventory: &[Resource]) -> Verdict {
        let kinds = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        let mut drifted = Vec::new();
        for resource in inventory {
            let key = ObjectKey::of(resource);
            let Some(watch) = kinds.get(&(key.group.clone(), key.kind.clone())) else {
                return Verdict::Unknown;
            };
            if !watch.cache.listed.load(Ordering::Acquire) || !self.engine.has_applied(&key) {
                return Verdict::Unknown;
            }
            let as_applied = watch
                .cache
                .objects
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&(key.namespace.clone(), key.name.clone()))
                .is_some_and(|live| self.engine.left_as_applied(&key, live));
            if !as_applied {
                drifted.push(key);
            }
        }
        if drifted.is_empty() {
            Verdict::AsApplied
        } else {
            Verdict::Drifted(drifted)
        }
    }
}

/// Follows one kind until aborted: keeps `cache` as the watch shows it and tells `notify` of drift.
async fn follow(
    api: Api<PartialObjectMeta<DynamicObject>>,
    (group, kind): (String, String),
    cache: Arc<KindCache>,
    engine: ApplyEngine,
    owner: (String, String),
    notify: DriftNotifier,
) {
    let selector = format!("{}={}", OWNED_LABEL.0, OWNED_LABEL.1);
    let config = watcher::Config::default()
        .labels(&selector)
        .timeout(WATCH_TIMEOUT_SECONDS);
    let key_of = |object: &PartialObjectMeta<DynamicObject>| ObjectKey {
        group: group.clone(),
        kind: kind.clone(),
        namespace: object.metadata.namespace.clone().unwrap_or_default(),
        name: object.metadata.name.clone().unwrap_or_default(),
    };
    let tell = |why: &str, key: &ObjectKey| {
        tracing::info!(cluster = %owner.1, namespace = %owner.0, object = %key, "{why}: drift");
        notify(&owner.0, &owner.1);
    };
    let mut listing: HashMap<(String, String), LiveMeta> = HashMap::new();
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listing.clear(),
            Ok(watcher::Event::InitApply(object)) => {
                let key = key_of(&object);
                listing.insert((key.namespace, key.name), LiveMeta::of(&object.metadata));
            }
            Ok(watcher::Event::InitDone) => {
                let listed = std::mem::take(&mut listing);
                // What changed while no watch ran (before the first list, or while it was down): each
                // object this engine applied that the list shows missing or changed.
                let changed = engine.applied_of_kind(&group, &kind).into_iter().find(|key| {
                    listed
                        .get(&(key.namespace.clone(), key.name.clone()))
                        .is_none_or(|live| !engine.left_as_applied(key, live))
                });
                *cache.objects.lock().unwrap_or_else(|p| p.into_inner()) = listed;
                cache.listed.store(true, Ordering::Release);
                if let Some(key) = changed {
                    tell("listed changed or missing", &key);
                }
            }
            Ok(watcher::Event::Apply(object)) => {
                let key = key_of(&object);
                let live = LiveMeta::of(&object.metadata);
                let drifted = engine.has_applied(&key) && !engine.left_as_applied(&key, &live);
                cache
                    .objects
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert((key.namespace.clone(), key.name.clone()), live);
                if drifted {
                    tell("changed", &key);
                }
            }
            Ok(watcher::Event::Delete(object)) => {
                let key = key_of(&object);
                cache
                    .objects
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&(key.namespace.clone(), key.name.clone()));
                if engine.has_applied(&key) {
                    tell("deleted or unlabelled", &key);
                }
            }
            Err(error) => {
                tracing::debug!(cluster = %owner.1, %group, %kind, %error, "drift watch interrupted");
            }
        }
    }
}
