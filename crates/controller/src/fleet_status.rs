//! The fleet status writer: the Clusters on each release, counted from the ClusterAddons by
//! [`cso_api::fleet`] (the rule of `cso status` and the `cso_clusters` gauge), written into `status.clusters`
//! of every ClusterStackRelease (its own counts) and ClusterStack (its totals and one entry per release).
//!
//! Not a reconcile of the ClusterStack: that one asks the release source (`list_tags`, GitHub or OCI) on
//! every run with auto-subscribe, and a fleet of Clusters changes all the time. Instead one loop reads the
//! watch caches the controllers already fill (ClusterAddons, ClusterStackReleases, ClusterStacks, Clusters:
//! no LIST of its own), and after a change waits [`DEBOUNCE`] so that a burst (1000 ClusterAddons going
//! ready) is one round, not 1000; each round writes only the counts that differ from what the caches show.
//!
//! It writes with its own field manager ([`FIELD_MANAGER`]), applying `status.clusters` alone to the status
//! subresource; the controllers' status writes leave that field out (`crate::patch::ControllerStatus`), so
//! neither drops nor takes over the other's fields. The controllers wake on changes beyond the status only
//! (`crate::watch::beyond_status`), and the ClusterStack's wake-up by its releases ignores these counts
//! ([`apart_from_counts`]): a count written here never runs a reconcile. It runs where the controllers run,
//! so only the leader writes.
//!
//! Beside its counts, each ClusterStackRelease gets `status.moves`: how many Clusters of its stack on other
//! releases could move to its class and which could not and why ([`desired_moves`], by
//! `cso_api::rules::class_move::release_moves`: the two classes' verdict without a dry run, from the Cluster
//! cache and the ClusterClass cache of the release controller's watch; no request per Cluster). A release
//! whose ClusterClass is not in that cache yet has none.
//!
//! Shape: [`desired`] (pure: the caches' contents → the counts of every ClusterStack and ClusterStackRelease)
//! and [`changed`] (pure: which of them differ from what the objects show), with table tests beside them;
//! [`FleetStatusWriter`] waits for changes and makes the writes.
//!
//! A ClusterAddon is on the release its `spec.clusterStack` names, in the namespace of its Cluster's
//! ClusterClass (a Cluster may use a class of another namespace), else its own. Clusters are counted, not
//! ClusterAddons ([`cso_api::fleet`]): one whose addons are on no release yet counts on the release its class
//! names, one whose Cluster is gone counts for nothing; the first round waits for the Clusters' first list.
//! A ClusterStack lists every ClusterStackRelease of its stack (zero counts when no Cluster is on it) and
//! every other release of the stack a Cluster is on (its ClusterStackRelease deleted, say); which releases
//! are a ClusterStack's is the ownership rule (provider, name, Kubernetes minor and a channel it admits:
//! `StackKey::owns`). Paused objects are not written.

use std::{
    collections::{BTreeMap, HashMap},
    future::Future,
    pin::pin,
    sync::Arc,
    time::Duration,
};

use cso_api::{
    ClusterAddon, ClusterStack, ClusterStackRelease, ReleaseId,
    capi::Cluster,
    cluster_stack::{ReleaseClusters, StackClusters},
    cluster_stack_release::{ClusterCounts, ReleaseMoves},
    fleet::{self, AddonState, ClusterSeen},
    rules::{
        StackKey,
        class_move::{self, ClassView},
    },
};
use futures::{Stream, StreamExt};
use kube::{
    Api, Resource, ResourceExt,
    api::{DynamicObject, Patch, PatchParams},
    core::ApiResource,
    runtime::{
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use serde_json::json;

use crate::{
    Context,
    filter::is_paused,
    patch::ControllerStatus,
    stores,
    watch::{SharedWatch, beyond_status, digest},
};

/// The field manager of the counts: not the controllers' (`cluster-stack-operator`), so that each owns its
/// own fields.
pub(crate) const FIELD_MANAGER: &str = "cso-fleet";

/// How long after a change the counts are written: changes within it are written together.
pub(crate) const DEBOUNCE: Duration = Duration::from_secs(2);

/// How long after a failed write the round is tried again when nothing else changes meanwhile.
const RETRY: Duration = Duration::from_secs(10);

/// `(namespace, name)` of an object.
type Key = (String, String);

fn key_of(object: &impl ResourceExt) -> Key {
    (object.namespace().unwrap_or_default(), object.name_any())
}

/// The counts every ClusterStack and ClusterStackRelease should show, by namespace and name.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Desired {
    pub(crate) stacks: BTreeMap<Key, StackClusters>,
    pub(crate) releases: BTreeMap<Key, ClusterCounts>,
    /// `status.moves` of the releases whose ClusterClass is known ([`desired_moves`]).
    pub(crate) moves: BTreeMap<Key, ReleaseMoves>,
}

/// The counts of `stacks` and `releases` from `addons` (see the module). `cluster_of` tells what is known of
/// an addon's Cluster, and the namespace of its ClusterClass when known.
pub(crate) fn desired(
    stacks: &[Arc<ClusterStack>],
    releases: &[Arc<ClusterStackRelease>],
    addons: &[Arc<ClusterAddon>],
    cluster_of: impl Fn(&ClusterAddon) -> (ClusterSeen, Option<String>),
) -> Desired {
    // The addons by the namespace of their release, then counted per release by the one rule.
    let mut by_namespace: BTreeMap<String, Vec<(&ClusterAddon, ClusterSeen)>> = BTreeMap::new();
    for addon in addons {
        let (seen, class_namespace) = cluster_of(addon);
        let namespace = class_namespace.unwrap_or_else(|| addon.namespace().unwrap_or_default());
        by_namespace
            .entry(namespace)
            .or_default()
            .push((addon.as_ref(), seen));
    }
    let mut counted: BTreeMap<Key, ClusterCounts> = BTreeMap::new();
    for (namespace, addons) in by_namespace {
        let members = addons
            .iter()
            .map(|(addon, cluster)| fleet::Member { addon, cluster });
        for counts in fleet::fleet(members) {
            if !counts.release.is_empty() {
                counted.insert((namespace.clone(), counts.release.clone()), (&counts).into());
            }
        }
    }
    let counts_of = |key: &Key| counted.get(key).cloned().unwrap_or_default();

    let releases_out: BTreeMap<Key, ClusterCounts> = releases
        .iter()
        .map(|release| {
            let key = key_of(release.as_ref());
            let counts = counts_of(&key);
            (key, counts)
        })
        .collect();

    let mut stacks_out = BTreeMap::new();
    for stack in stacks {
        // A stack without an identity owns no release (its spec is refused and reported by its controller).
        let Ok(stack_key) = StackKey::of(stack) else {
            continue;
        };
        let namespace = stack.namespace().unwrap_or_default();
        let owned = |tag: &str| {
            ReleaseId::parse_tag(tag)
                .ok()
                .filter(|id| stack_key.owns(stack.spec.channel, id))
        };
        let existing = releases
            .iter()
            .filter(|r| r.namespace().as_deref() == Some(namespace.as_str()))
            .map(|r| r.name_any());
        let with_clusters = counted
            .keys()
            .filter(|(ns, _)| *ns == namespace)
            .map(|(_, tag)| tag.clone());
        let mut per_release: BTreeMap<ReleaseId, ReleaseClusters> = BTreeMap::new();
        for tag in existing.chain(with_clusters) {
            let Some(id) = owned(&tag) else { continue };
            per_release.entry(id).or_insert_with(|| ReleaseClusters {
                counts: counts_of(&(namespace.clone(), tag.clone())),
                release: tag,
            });
        }
        let releases: Vec<ReleaseClusters> = per_release.into_values().collect();
        let total = fleet::total(releases.iter().map(|r| &r.counts));
        stacks_out.insert(key_of(stack.as_ref()), StackClusters { total, releases });
    }
    Desired {
        stacks: stacks_out,
        releases: releases_out,
        moves: BTreeMap::new(),
    }
}

/// `status.moves` of each of `releases` whose ClusterClass `class_of` knows (by namespace and name) and whose
/// Kubernetes version its status says: the Clusters of its stack among `clusters` that could move to it.
pub(crate) fn desired_moves(
    releases: &[Arc<ClusterStackRelease>],
    clusters: &[Arc<Cluster>],
    class_of: impl Fn(&str, &str) -> Option<ClassView>,
) -> BTreeMap<Key, ReleaseMoves> {
    let mut moves = BTreeMap::new();
    for release in releases {
        let key = key_of(release.as_ref());
        let Ok(id) = ReleaseId::parse_tag(&key.1) else {
            continue;
        };
        let to_version = release
            .status
            .as_ref()
            .map(|s| s.kubernetes_version.as_str())
            .unwrap_or_default();
        if to_version.is_empty() {
            continue;
        }
        let Some(class) = class_of(&key.0, &id.cluster_class_name()) else {
            continue;
        };
        let counted = class_move::release_moves(
            &id,
            &key.0,
            &class,
            to_version,
            clusters.iter().map(AsRef::as_ref),
            &class_of,
        );
        moves.insert(key, counted);
    }
    moves
}

/// One write of a round.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Write {
    Stack(Key, StackClusters),
    Release(Key, ClusterCounts, Option<ReleaseMoves>),
}

/// The writes that bring `stacks` and `releases` (as the caches show them) to `desired`: the counts that
/// differ, of objects that are not paused.
pub(crate) fn changed(
    desired: Desired,
    stacks: &[Arc<ClusterStack>],
    releases: &[Arc<ClusterStackRelease>],
) -> Vec<Write> {
    let stacks: HashMap<Key, &ClusterStack> =
        stacks.iter().map(|s| (key_of(s.as_ref()), s.as_ref())).collect();
    let releases: HashMap<Key, &ClusterStackRelease> = releases
        .iter()
        .map(|r| (key_of(r.as_ref()), r.as_ref()))
        .collect();
    let mut writes = Vec::new();
    for (key, counts) in desired.stacks {
        let Some(stack) = stacks.get(&key).filter(|s| !is_paused(**s)) else {
            continue;
        };
        if stack.status.as_ref().and_then(|s| s.clusters.as_ref()) != Some(&counts) {
            writes.push(Write::Stack(key, counts));
        }
    }
    let mut moves = desired.moves;
    for (key, counts) in desired.releases {
        let Some(release) = releases.get(&key).filter(|r| !is_paused(**r)) else {
            continue;
        };
        let release_moves = moves.remove(&key);
        let status = release.status.as_ref();
        if status.and_then(|s| s.clusters.as_ref()) != Some(&counts)
            || status.and_then(|s| s.moves.as_ref()) != release_moves.as_ref()
        {
            writes.push(Write::Release(key, counts, release_moves));
        }
    }
    writes
}

/// What a ClusterStackRelease is apart from its Cluster counts: what its ClusterStack reacts to (a count
/// written here must not run the ClusterStack's reconcile, which asks the release source).
/// A release without a status and one whose status has only counts are the same.
pub(crate) fn apart_from_counts(release: &ClusterStackRelease) -> (u64, String) {
    let status = release.status.clone().unwrap_or_default();
    // A status always serializes (string keys), in its fields' order: equal statuses are equal texts.
    let text = serde_json::to_string(&status.controllers_part()).unwrap_or_default();
    (beyond_status(release), text)
}

/// `()` for each event of `events` that may change the counts: an object whose `state` changed, one
/// deleted, and the end of a (re)list, after which the store holds the new list (objects deleted while the
/// watch was down leave it then, with no event of their own).
fn news<K, S>(
    events: impl Stream<Item = watcher::Event<Arc<K>>> + Send + 'static,
    state: impl Fn(&K) -> S + Send + 'static,
) -> impl Stream<Item = ()> + Send + 'static
where
    K: Resource + Send + 'static,
    S: PartialEq + Send + 'static,
{
    let mut last_seen: HashMap<Key, S> = HashMap::new();
    events.filter_map(move |event| {
        let news = match event {
            watcher::Event::Init => {
                last_seen.clear();
                false
            }
            watcher::Event::InitApply(object) => {
                last_seen.insert(key_of(object.as_ref()), state(&object));
                false
            }
            watcher::Event::InitDone => true,
            watcher::Event::Apply(object) => {
                let (key, now) = (key_of(object.as_ref()), state(&object));
                let news = last_seen.get(&key) != Some(&now);
                last_seen.insert(key, now);
                news
            }
            watcher::Event::Delete(object) => {
                last_seen.remove(&key_of(object.as_ref()));
                true
            }
        };
        std::future::ready(news.then_some(()))
    })
}

/// The writer of the counts, on the caches of the controllers' watches.
pub(crate) struct FleetStatusWriter {
    ctx: Arc<Context>,
    stacks: stores::Listed<ClusterStack>,
    classes: ClassCache,
}

/// The releases' ClusterClasses as the release controller's ClusterClass watch caches them, and a wake-up
/// for each of its events.
#[derive(Clone)]
pub(crate) struct ClassCache {
    pub(crate) store: Store<DynamicObject>,
    pub(crate) resource: ApiResource,
    pub(crate) changed: Arc<tokio::sync::Notify>,
}

impl ClassCache {
    fn class(&self, namespace: &str, name: &str) -> Option<ClassView> {
        Some(ClassView::from_object(&self.object(namespace, name)?))
    }

    /// The ClusterClass `namespace/name` as the watch last saw it, if it has.
    pub(crate) fn object(&self, namespace: &str, name: &str) -> Option<serde_json::Value> {
        let object = self
            .store
            .get(&ObjectRef::new_with(name, self.resource.clone()).within(namespace))?;
        serde_json::to_value(object.as_ref()).ok()
    }
}

/// The fleet status writer on the shared watches, until `shutdown` completes. Subscribes to each watch now
/// (before the watches run).
pub(crate) fn writer(
    ctx: Arc<Context>,
    stack_watch: &mut SharedWatch<ClusterStack>,
    release_watch: &mut SharedWatch<ClusterStackRelease>,
    addon_watch: &mut SharedWatch<ClusterAddon>,
    cluster_watch: &mut SharedWatch<Cluster>,
    classes: ClassCache,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let changes = futures::stream::select_all([
        news(stack_watch.subscribe(), |s: &ClusterStack| {
            (
                s.spec.clone(),
                is_paused(s),
                s.status.as_ref().and_then(|s| s.clusters.clone()),
            )
        })
        .boxed(),
        news(release_watch.subscribe(), |r: &ClusterStackRelease| {
            (is_paused(r), r.status.as_ref().and_then(|s| s.clusters.clone()))
        })
        .boxed(),
        // One per Cluster: kept as digests.
        news(addon_watch.subscribe(), |a: &ClusterAddon| {
            digest(&(&a.spec.cluster_stack, AddonState::of(a), a.cluster_name()))
        })
        .boxed(),
        // Only a Cluster's class, version and variables matter here (Cluster API rewrites a Cluster's status
        // all the time).
        news(cluster_watch.subscribe(), |c: &Cluster| {
            let variables = c.object.as_ref().map(|o| {
                o.topology_view()
                    .pointer("/spec/topology/variables")
                    .map(serde_json::Value::to_string)
            });
            digest(&(c.class(), c.topology_version(), variables))
        })
        .boxed(),
        futures::stream::unfold(classes.changed.clone(), |changed| async move {
            changed.notified().await;
            Some(((), changed))
        })
        .boxed(),
    ]);
    let writer = FleetStatusWriter {
        ctx,
        stacks: stack_watch.cache(),
        classes,
    };
    writer.run(changes, shutdown)
}

impl FleetStatusWriter {
    /// Writes the counts [`DEBOUNCE`] after each change (every change meanwhile included) until `shutdown`
    /// completes; a round that failed to write is tried again after [`RETRY`].
    async fn run(self, changes: impl Stream<Item = ()> + Send, shutdown: impl Future<Output = ()> + Send) {
        let mut changes = pin!(changes);
        let mut shutdown = pin!(shutdown);
        let mut retry: Option<tokio::time::Instant> = None;
        loop {
            let retry_at = retry.unwrap_or_else(tokio::time::Instant::now);
            tokio::select! {
                () = &mut shutdown => return,
                change = changes.next() => if change.is_none() { return },
                () = tokio::time::sleep_until(retry_at), if retry.is_some() => {}
            }
            let settled = tokio::time::sleep(DEBOUNCE);
            let mut settled = pin!(settled);
            loop {
                tokio::select! {
                    () = &mut shutdown => return,
                    () = &mut settled => break,
                    change = changes.next() => if change.is_none() { return },
                }
            }
            retry = (!self.round().await).then(|| tokio::time::Instant::now() + RETRY);
        }
    }

    /// Computes the counts from the caches and writes those that changed; whether every write succeeded.
    /// Nothing is written before every cache has its first list (an empty cache would say zero).
    async fn round(&self) -> bool {
        let Some(caches) = self.ctx.stores() else {
            return true;
        };
        let (Some(release_store), Some(addon_store)) = (caches.releases(), caches.addons()) else {
            return true;
        };
        // Clusters are counted, not ClusterAddons: not before the Clusters are listed, where they all are.
        if !caches.clusters_listed() {
            return true;
        }
        if !self.stacks.listed.now() {
            return true;
        }
        let (stacks, releases, addons) = (
            self.stacks.store.state(),
            release_store.state(),
            addon_store.state(),
        );
        let cluster_of = |addon: &ClusterAddon| {
            caches.cluster_seen(&addon.namespace().unwrap_or_default(), &addon.cluster_name())
        };
        let mut wanted = desired(&stacks, &releases, &addons, cluster_of);
        if let Some(clusters) = caches.all_clusters() {
            wanted.moves = desired_moves(&releases, &clusters, |namespace, name| {
                self.classes.class(namespace, name)
            });
        }
        let writes = changed(wanted, &stacks, &releases);
        let mut all_written = true;
        for write in writes {
            all_written &= self.write(write).await;
        }
        all_written
    }

    /// Applies one object's counts to its status subresource; whether it was written (or is gone).
    async fn write(&self, write: Write) -> bool {
        let (kind, (namespace, name), result) = match write {
            Write::Stack(key, clusters) => (
                "ClusterStack",
                key.clone(),
                apply_counts::<ClusterStack>(&self.ctx, &key, json!(clusters), None).await,
            ),
            Write::Release(key, clusters, moves) => (
                "ClusterStackRelease",
                key.clone(),
                apply_counts::<ClusterStackRelease>(&self.ctx, &key, json!(clusters), moves).await,
            ),
        };
        match result {
            Ok(()) => {
                self.ctx.metrics.fleet_status_written(kind);
                true
            }
            // Deleted meanwhile: its event comes, and nothing is left to write.
            Err(kube::Error::Api(s)) if s.code == 404 => true,
            Err(error) => {
                tracing::warn!(
                    kind, %namespace, %name, %error, retry_in = ?RETRY,
                    "failed to write the Cluster counts"
                );
                false
            }
        }
    }
}

/// Applies `clusters` as `status.clusters` (and `moves` as `status.moves`; left out, it is removed) of `K`
/// `key` with [`FIELD_MANAGER`]. Forced: the fields are ours alone, and a hand edit of them is put right. The written version is not recorded for the controllers
/// (`crate::stores::Written`): they ignore these fields, so a copy without the write serves them as well,
/// and a record here could race with theirs and make a copy older than their own write look current.
async fn apply_counts<K>(
    ctx: &Context,
    (namespace, name): &Key,
    clusters: serde_json::Value,
    moves: Option<ReleaseMoves>,
) -> Result<(), kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    let mut patch = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": {"clusters": clusters},
    });
    if let Some(moves) = moves {
        patch["status"]["moves"] = json!(moves);
    }
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use cso_api::{
        cluster_addon::{ClusterAddonSpec, ClusterAddonStatus},
        conditions::{ConditionsExt, Severity},
    };
    use serde_json::json;

    use super::*;

    fn stack(namespace: &str, name: &str, channel: &str) -> Arc<ClusterStack> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27",
                         "channel": channel, "autoSubscribe": false, "noProvider": true},
            }))
            .unwrap(),
        )
    }

    fn release(namespace: &str, tag: &str) -> Arc<ClusterStackRelease> {
        let mut release = ClusterStackRelease::new(tag, Default::default());
        release.metadata.namespace = Some(namespace.into());
        Arc::new(release)
    }

    #[derive(Clone, Copy)]
    enum State {
        Ready,
        Progressing,
        Failing,
    }

    fn addon(namespace: &str, cluster: &str, tag: &str, state: State) -> Arc<ClusterAddon> {
        let mut addon = ClusterAddon::new(
            &format!("cluster-addon-{cluster}"),
            ClusterAddonSpec {
                cluster_stack: tag.into(),
                ..Default::default()
            },
        );
        addon.metadata.namespace = Some(namespace.into());
        addon.status = Some(ClusterAddonStatus {
            ready: matches!(state, State::Ready),
            ..Default::default()
        });
        if matches!(state, State::Failing) {
            addon.mark_false(
                "HelmChartApplied",
                "FailedToApplyObjects",
                Severity::Warning,
                "denied",
            );
        }
        Arc::new(addon)
    }

    fn counts(clusters: i32, ready: i32, progressing: i32, failing: &[&str]) -> ClusterCounts {
        ClusterCounts {
            clusters,
            ready,
            progressing,
            failing: i32::try_from(failing.len()).unwrap(),
            failing_clusters: failing.iter().map(|c| (*c).to_owned()).collect(),
        }
    }

    fn per_release(tag: &str, counts: ClusterCounts) -> ReleaseClusters {
        ReleaseClusters {
            release: tag.into(),
            counts,
        }
    }

    fn key(namespace: &str, name: &str) -> Key {
        (namespace.into(), name.into())
    }

    /// No Cluster has moved to another namespace's class.
    /// Nothing known of the addons' Clusters: each counts alone, in its own namespace.
    fn own_namespace(_: &ClusterAddon) -> (ClusterSeen, Option<String>) {
        (ClusterSeen::Unknown, None)
    }

    #[test]
    fn counts_per_release_and_in_all_on_the_stack() {
        let stacks = [stack("ns", "ferrol", "stable")];
        let releases = [
            release("ns", "docker-ferrol-1-27-v1"),
            release("ns", "docker-ferrol-1-27-v2"),
            release("ns", "docker-ferrol-1-27-v3"),
        ];
        let addons = [
            addon("ns", "a", "docker-ferrol-1-27-v1", State::Ready),
            addon("ns", "b", "docker-ferrol-1-27-v1", State::Ready),
            addon("ns", "c", "docker-ferrol-1-27-v2", State::Failing),
            addon("ns", "d", "docker-ferrol-1-27-v2", State::Progressing),
            // On no release yet: counted on none.
            addon("ns", "e", "", State::Progressing),
        ];
        let desired = desired(&stacks, &releases, &addons, own_namespace);
        let v1 = counts(2, 2, 0, &[]);
        let v2 = counts(2, 0, 1, &["ns/c"]);
        // A release no Cluster is on shows zeros.
        let v3 = counts(0, 0, 0, &[]);
        assert_eq!(
            desired.releases,
            BTreeMap::from([
                (key("ns", "docker-ferrol-1-27-v1"), v1.clone()),
                (key("ns", "docker-ferrol-1-27-v2"), v2.clone()),
                (key("ns", "docker-ferrol-1-27-v3"), v3.clone()),
            ])
        );
        assert_eq!(
            desired.stacks,
            BTreeMap::from([(
                key("ns", "ferrol"),
                StackClusters {
                    total: counts(4, 2, 1, &["ns/c"]),
                    releases: vec![
                        per_release("docker-ferrol-1-27-v1", v1),
                        per_release("docker-ferrol-1-27-v2", v2),
                        per_release("docker-ferrol-1-27-v3", v3),
                    ],
                }
            )])
        );
    }

    #[test]
    fn clusters_are_counted_a_failed_first_install_on_its_class_and_a_gone_cluster_not_at_all() {
        let stacks = [stack("ns", "ferrol", "stable")];
        let releases = [release("ns", "docker-ferrol-1-27-v1")];
        let addons = [
            addon("ns", "fine", "docker-ferrol-1-27-v1", State::Ready),
            // Its kubeconfig cannot be read: failing before anything was applied.
            addon("ns", "broken", "", State::Failing),
            // Its Cluster was deleted; no garbage collector removed the ClusterAddon (yet).
            addon("ns", "deleted", "docker-ferrol-1-27-v1", State::Ready),
        ];
        let seen = |addon: &ClusterAddon| match addon.cluster_name().as_str() {
            "deleted" => (ClusterSeen::Gone, None),
            _ => (
                ClusterSeen::Exists {
                    class_release: Some("docker-ferrol-1-27-v1".into()),
                },
                Some("ns".into()),
            ),
        };
        let desired = desired(&stacks, &releases, &addons, seen);
        let v1 = counts(2, 1, 0, &["ns/broken"]);
        assert_eq!(desired.releases[&key("ns", "docker-ferrol-1-27-v1")], v1);
        assert_eq!(desired.stacks[&key("ns", "ferrol")].total, v1);
    }

    #[test]
    fn a_release_without_its_cluster_stack_release_still_counts_on_its_stack() {
        let stacks = [stack("ns", "ferrol", "stable")];
        let releases = [release("ns", "docker-ferrol-1-27-v2")];
        let addons = [
            addon("ns", "old", "docker-ferrol-1-27-v1", State::Ready),
            addon("ns", "new", "docker-ferrol-1-27-v2", State::Ready),
        ];
        let desired = desired(&stacks, &releases, &addons, own_namespace);
        let on_stack = &desired.stacks[&key("ns", "ferrol")];
        assert_eq!(
            on_stack.releases,
            [
                per_release("docker-ferrol-1-27-v1", counts(1, 1, 0, &[])),
                per_release("docker-ferrol-1-27-v2", counts(1, 1, 0, &[])),
            ]
        );
        assert_eq!(on_stack.total, counts(2, 2, 0, &[]));
        assert_eq!(
            desired.releases.len(),
            1,
            "no ClusterStackRelease is written that does not exist"
        );
    }

    #[rstest::rstest]
    // Another stack, another minor, another namespace: not this stack's.
    #[case::another_stack("ns", "docker-scs-1-27-v1", None, 0)]
    #[case::another_minor("ns", "docker-ferrol-1-28-v1", None, 0)]
    #[case::another_namespace("other", "docker-ferrol-1-27-v1", None, 0)]
    // A Cluster in another namespace whose class is in the stack's namespace counts here.
    #[case::a_class_in_the_stacks_namespace("other", "docker-ferrol-1-27-v1", Some("ns"), 1)]
    #[case::a_class_in_another_namespace("ns", "docker-ferrol-1-27-v1", Some("other"), 0)]
    // A hash build is on the custom channel: not a stable stack's.
    #[case::another_channel("ns", "docker-ferrol-1-27-v0-sha-hipstsw", None, 0)]
    #[case::its_own("ns", "docker-ferrol-1-27-v1", None, 1)]
    fn which_clusters_count_on_a_stack(
        #[case] addon_namespace: &str,
        #[case] tag: &str,
        #[case] class_namespace: Option<&str>,
        #[case] clusters: i32,
    ) {
        let stacks = [stack("ns", "ferrol", "stable")];
        let addons = [addon(addon_namespace, "c", tag, State::Ready)];
        let class_namespace = class_namespace.map(str::to_owned);
        let desired = desired(&stacks, &[], &addons, |_| {
            (ClusterSeen::Unknown, class_namespace.clone())
        });
        assert_eq!(desired.stacks[&key("ns", "ferrol")].total.clusters, clusters);
    }

    #[test]
    fn a_custom_stack_counts_its_hash_builds_and_a_stack_with_a_bad_identity_is_left_alone() {
        let mut bad = (*stack("ns", "bad", "stable")).clone();
        bad.spec.provider = "Docker".into();
        let stacks = [stack("ns", "custom", "custom"), Arc::new(bad)];
        let addons = [addon(
            "ns",
            "c",
            "docker-ferrol-1-27-v0-sha.hipstsw",
            State::Ready,
        )];
        let desired = desired(&stacks, &[], &addons, own_namespace);
        assert_eq!(
            desired.stacks[&key("ns", "custom")].releases,
            [per_release(
                "docker-ferrol-1-27-v0-sha-hipstsw",
                counts(1, 1, 0, &[])
            )]
        );
        assert!(!desired.stacks.contains_key(&key("ns", "bad")));
    }

    #[test]
    fn only_counts_that_differ_from_the_objects_are_written_and_paused_objects_never() {
        let mut shown = (*stack("ns", "ferrol", "stable")).clone();
        let mut paused = (*release("ns", "docker-ferrol-1-27-v2")).clone();
        paused
            .annotations_mut()
            .insert("cluster.x-k8s.io/paused".into(), String::new());
        let releases = [release("ns", "docker-ferrol-1-27-v1"), Arc::new(paused)];
        let addons = [addon("ns", "a", "docker-ferrol-1-27-v1", State::Ready)];
        let first = desired(&[Arc::new(shown.clone())], &releases, &addons, own_namespace);
        let stack_counts = first.stacks[&key("ns", "ferrol")].clone();
        let writes = changed(first.clone(), &[Arc::new(shown.clone())], &releases);
        assert_eq!(
            writes,
            [
                Write::Stack(key("ns", "ferrol"), stack_counts.clone()),
                Write::Release(key("ns", "docker-ferrol-1-27-v1"), counts(1, 1, 0, &[]), None),
            ]
        );
        // Once the stack shows its counts, only the release is left to write.
        shown.status.get_or_insert_default().clusters = Some(stack_counts);
        assert_eq!(
            changed(first, &[Arc::new(shown)], &releases),
            [Write::Release(
                key("ns", "docker-ferrol-1-27-v1"),
                counts(1, 1, 0, &[]),
                None
            )]
        );
    }

    #[test]
    fn releases_whose_class_is_known_get_the_moves_of_their_stack_and_they_are_written_when_they_differ() {
        let with_version = |tag: &str| {
            let mut release = (*release("ns", tag)).clone();
            release.status.get_or_insert_default().kubernetes_version = "v1.27.3".into();
            Arc::new(release)
        };
        // v2's class no longer defines imageRepository; v3's class is not in the cache.
        let releases = [
            with_version("docker-ferrol-1-27-v1"),
            with_version("docker-ferrol-1-27-v2"),
            with_version("docker-ferrol-1-27-v3"),
            release("ns", "docker-ferrol-1-27-v4"),
        ];
        let cluster = |name: &str, class: &str, variables: serde_json::Value| -> Cluster {
            serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
                "metadata": {"namespace": "ns", "name": name},
                "spec": {"topology": {"class": class, "version": "v1.27.3", "variables": variables}},
            }))
            .unwrap()
        };
        let clusters = [
            cluster(
                "a",
                "docker-ferrol-1-27-v1",
                json!([{"name": "imageRepository", "value": "r"}]),
            ),
            cluster("b", "docker-ferrol-1-27-v1", json!([])),
        ];
        let class_of = |namespace: &str, name: &str| {
            let variables = match name {
                "docker-ferrol-1-27-v1" => {
                    json!([{"name": "imageRepository", "schema": {"openAPIV3Schema": {"type": "string"}}}])
                }
                "docker-ferrol-1-27-v2" | "docker-ferrol-1-27-v4" => json!([]),
                _ => return None,
            };
            (namespace == "ns").then(|| {
                ClassView::from_object(&json!({"metadata": {"name": name}, "spec": {"variables": variables}}))
            })
        };
        let moves = desired_moves(&releases, &clusters.map(Arc::new), class_of);
        assert_eq!(
            moves.keys().map(|(_, name)| name.as_str()).collect::<Vec<_>>(),
            ["docker-ferrol-1-27-v1", "docker-ferrol-1-27-v2"],
            "v3: no class in the cache; v4: no Kubernetes version in its status yet"
        );
        // Already on v1: none to move.
        assert_eq!(
            moves[&key("ns", "docker-ferrol-1-27-v1")],
            ReleaseMoves::default()
        );
        let v2 = &moves[&key("ns", "docker-ferrol-1-27-v2")];
        assert_eq!((v2.clusters, v2.movable, v2.refused), (2, 1, 1));
        assert_eq!(v2.refused_clusters[0].cluster, "ns/a");
        assert_eq!(
            v2.refused_clusters[0].reasons,
            ["variable imageRepository: set by the Cluster, not defined by the new class"]
        );

        // Written with the counts, and again only when the moves differ from what the release shows.
        let mut wanted = desired(&[], &releases[1..2], &[], own_namespace);
        wanted.moves = moves.clone();
        let counts = wanted.releases[&key("ns", "docker-ferrol-1-27-v2")].clone();
        assert_eq!(
            changed(wanted.clone(), &[], &releases[1..2]),
            [Write::Release(
                key("ns", "docker-ferrol-1-27-v2"),
                counts.clone(),
                Some(v2.clone())
            )]
        );
        let mut shown = (*releases[1]).clone();
        let status = shown.status.get_or_insert_default();
        status.clusters = Some(counts);
        status.moves = Some(v2.clone());
        assert_eq!(changed(wanted, &[], &[Arc::new(shown)]), []);
    }

    #[tokio::test]
    async fn news_are_changes_of_the_state_deletions_and_the_end_of_a_list() {
        use watcher::Event;
        let at = |tag: &str| addon("ns", "a", tag, State::Ready).as_ref().clone();
        let mut failing = at("docker-ferrol-1-27-v1");
        failing.status.get_or_insert_default().ready = false;
        failing.mark_false("HelmChartApplied", "FailedToApplyObjects", Severity::Error, "x");
        let mut other_message = failing.clone();
        other_message.mark_false("HelmChartApplied", "FailedToApplyObjects", Severity::Error, "y");
        let events = vec![
            Event::Init,
            Event::InitApply(at("docker-ferrol-1-27-v1")),
            Event::InitDone,
            // Applied again as it was: no news.
            Event::Apply(at("docker-ferrol-1-27-v1")),
            Event::Apply(failing),
            // Another message of the same failure: the same state.
            Event::Apply(other_message),
            Event::Apply(at("docker-ferrol-1-27-v2")),
            Event::Delete(at("docker-ferrol-1-27-v2")),
        ];
        let count = news(
            futures::stream::iter(events.into_iter().map(crate::watch::shared)),
            |a: &ClusterAddon| (a.spec.cluster_stack.clone(), AddonState::of(a)),
        )
        .count()
        .await;
        // The end of the list, the failure, the move to v2, the deletion.
        assert_eq!(count, 4);
    }

    #[test]
    fn a_release_apart_from_its_counts_ignores_the_counts_only() {
        let plain = release("ns", "docker-ferrol-1-27-v1").as_ref().clone();
        let mut counted = plain.clone();
        counted.status.get_or_insert_default().clusters = Some(counts(3, 3, 0, &[]));
        assert_eq!(apart_from_counts(&plain), apart_from_counts(&counted));
        let mut ready = counted.clone();
        ready.status.get_or_insert_default().ready = true;
        assert_ne!(apart_from_counts(&counted), apart_from_counts(&ready));
    }
}
