//! Drift found by watching: per workload cluster, one metadata-only watch per kind the operator applied
//! there, selected by the operator's label. An event that shows an object of ours not as our last apply left
//! it (another uid, another spec generation, or for kinds without one any write), or its deletion (or the
//! loss of the label, which takes it out of the selection), tells the owner of that cluster's addons
//! ([`DriftNotifier`]) at once; so does a (re)list that finds such an object. The watches' caches answer
//! [`DriftWatch::verdict`]: whether every object of an inventory is as applied, so that a periodic pass
//! writes nothing when nothing drifted, and whether that can be told at all (a kind not watched or not
//! listed yet: the pass re-applies, as before). Who changed a drifted object, and which fields, is kept from
//! the event's `managedFields` before our next apply takes them back ([`DriftWatch::take_cause`]). An event that
//! comes while the engine is writing its object is judged once the write is recorded
//! ([`ApplyEngine::written`]): the write's own event often comes before its answer, and is no drift.
//!
//! The watches share one [`DirectClient`] of the workload cluster: one lean HTTP/2 connection, which the
//! passes' requests ride too (`lean_http2.rs`), without a kube client or hyper's connection state held for
//! them (`connection.rs`: its timeout bounds the start of each response, never a quiet watch; the API server
//! ends each watch after its own timeout and the watcher resumes from the last
//! resourceVersion). They stop when the [`DriftWatch`] is dropped, which happens when the workload cluster's
//! client is rebuilt or forgotten.
//!
//! A watch that fails is tried again after a delay that grows to a minute; while the watches of a cluster
//! fail, one probe ([`Reach`]) asks its API server for `/version`, after 1 s and then at most every
//! [`PROBE_MAX`], and wakes them all when it answers after it had not: after an outage the watches (and
//! what changed behind it) are back within seconds of the server, not up to a minute later, for one request
//! per cluster and [`PROBE_MAX`] while it lasts.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use cso_api::{atom::Atom, common::Resource};
use http_body_util::BodyExt;
use kube::{
    Resource as _,
    api::{DynamicObject, ListParams, ObjectList, WatchEvent, WatchParams},
    client::DynBody,
    core::{GroupVersionKind, PartialObjectMeta},
};

use crate::{
    ApplyEngine, ClusterDiscovery,
    engine::LiveMeta,
    inventory::ObjectKey,
    managed_fields::{Writer, last_writer},
    rate_limit::DirectClient,
};

/// How long one watch request lasts before the watcher resumes with another. kube's default (290 s) is
/// sized for a client whose read timeout ends quiet connections; these watches ride a connection kept alive
/// by HTTP/2 pings, and each new request costs both sides a little: with ten kinds in each of a thousand
/// workload clusters, 290 s meant about 35 new watch requests a second from an idle operator.
const WATCH_TIMEOUT_SECONDS: u32 = 1800;

/// Told `(namespace, cluster, object)` when an object the operator applied to that Cluster's workload
/// cluster drifted.
pub type DriftNotifier = Arc<dyn Fn(&str, &str, &ObjectKey) + Send + Sync>;

/// What the watch saw of an object's last drift.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriftCause {
    /// Changed; by this writer, as its `managedFields` tell.
    Written(Writer),
    /// Deleted, or its label taken away.
    Gone,
}

impl std::fmt::Display for DriftCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DriftCause::Written(writer) => write!(f, "changed by {writer}"),
            DriftCause::Gone => write!(f, "deleted or unlabelled"),
        }
    }
}

/// The last drift cause of each drifted object of a workload cluster, until a pass corrects the object.
type Causes = Mutex<HashMap<ObjectKey, DriftCause>>;

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
    /// These objects are gone or were changed by someone else, and others cannot be told (their kind's watch
    /// is listing again after an outage, say): the drift seen must not wait for them.
    DriftedInPart(Vec<ObjectKey>),
}

/// The longest watch event accepted: a broken or hostile server cannot grow a watch's buffer without bound
/// (the watch is then listed again).
const MAX_EVENT_BYTES: usize = 4 << 20;

/// A watch's line buffer is given back when it is empty and has grown past this (one large event must not
/// keep its memory for the watch's life).
const KEPT_BUFFER_BYTES: usize = 4 << 10;

/// A watch that ends sooner than this is retried after a delay, growing while they keep ending so.
const BRIEF_WATCH: Duration = Duration::from_secs(10);

/// The longest wait before a failed list or watch is tried again.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(60);

/// The longest wait between two probes of an API server the watches cannot reach ([`Reach`]).
const PROBE_MAX: Duration = Duration::from_secs(10);

/// How long a probe waits for its answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether a workload cluster's API server answers, for the watches of that cluster: while they fail, one
/// probe asks `/version` with a back-off (1 s doubling to [`PROBE_MAX`]) until it answers; when it answers
/// after it had not, every watch waiting to try again is woken ([`Reach::returns`]). A probe whose first
/// question is answered wakes nobody: the server is there and the watches failed for their own reasons
/// (forbidden, say), so their own back-off stands.
struct Reach {
    client: DirectClient,
    /// Counts the times the probe found the server answering again.
    returns: tokio::sync::watch::Sender<u64>,
    probing: AtomicBool,
}

impl Reach {
    fn new(client: DirectClient) -> Arc<Self> {
        Arc::new(Reach {
            client,
            returns: tokio::sync::watch::channel(0).0,
            probing: AtomicBool::new(false),
        })
    }

    /// A watch failed: starts the probe unless it runs. It holds the `Reach` only weakly, so that it ends
    /// (at its next question) once the watches are gone.
    fn failed(self: &Arc<Self>) {
        if self.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let reach = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut delay = Duration::from_secs(1);
            let mut unanswered = false;
            loop {
                tokio::time::sleep(delay).await;
                let Some(reach) = reach.upgrade() else { return };
                // Any HTTP answer is an answer (a hardened server may refuse `/version` with a 403).
                let answered = tokio::time::timeout(PROBE_TIMEOUT, reach.client.apiserver_version())
                    .await
                    .is_ok_and(|version| matches!(version, Ok(_) | Err(kube::Error::Api(_))));
                if answered {
                    // Done before the wake-up: a watch failing after it starts a new probe.
                    reach.probing.store(false, Ordering::Release);
                    if unanswered {
                        tracing::debug!("the workload API server answers again: its drift watches resume");
                        reach.returns.send_modify(|returns| *returns += 1);
                    }
                    return;
                }
                unanswered = true;
                delay = (delay * 2).min(PROBE_MAX);
            }
        });
    }

    /// Waits `delay`, or less when the probe finds the server answering again meanwhile (one the watch
    /// failing now started or found running): whether it did (the watch's back-off then starts over: a
    /// server that answers `/version` may refuse lists for a moment after a restart).
    async fn pause(self: &Arc<Self>, delay: Duration) -> bool {
        let mut returns = self.returns.subscribe();
        self.failed();
        tokio::select! {
            () = tokio::time::sleep(delay) => false,
            _ = returns.changed() => true,
        }
    }
}

/// The objects of one kind, as the watch shows them.
#[derive(Default)]
struct KindCache {
    objects: Mutex<HashMap<(Atom, Atom), LiveMeta>>,
    /// `objects` holds every object of ours of the kind, and a watch keeps it so: set by a list, or once a
    /// watch from the version of the cache (the earliest of this engine's applies, or the last event seen) is
    /// answered; cleared when a watch fails or its version is gone, until that holds again. A kind whose
    /// watch cannot be had (forbidden, not served) is never vouched for: the periodic pass re-applies it.
    known: AtomicBool,
    /// A watch request of the kind is open: the API server answered it and its stream has not ended.
    streaming: AtomicBool,
}

/// Marks a kind's watch as streaming for as long as it lives (a watch request that ends, fails or is
/// aborted clears it).
struct Streaming<'a>(&'a AtomicBool);

impl<'a> Streaming<'a> {
    fn begin(flag: &'a AtomicBool) -> Self {
        flag.store(true, Ordering::Release);
        Streaming(flag)
    }
}

impl Drop for Streaming<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl KindCache {
    fn objects(&self) -> std::sync::MutexGuard<'_, HashMap<(Atom, Atom), LiveMeta>> {
        self.objects.lock().unwrap_or_else(|p| p.into_inner())
    }
}

struct KindWatch {
    cache: Arc<KindCache>,
    task: tokio::task::AbortHandle,
}

/// What the watches of one workload cluster share: each watch's task holds a pointer to it beside its kind's
/// own path and cache (a task's future is kept for the watch's life, nine per cluster).
struct ClusterWatches {
    /// The client of every watch and of the probe (one rate limit for all of them).
    client: DirectClient,
    engine: ApplyEngine,
    teller: Teller,
    reach: Arc<Reach>,
}

/// The drift watches of one workload cluster.
pub struct DriftWatch {
    /// The workload cluster's discovery.
    discovery: Arc<ClusterDiscovery>,
    cluster: Arc<ClusterWatches>,
    /// By `(group, kind)`.
    kinds: Mutex<HashMap<(Atom, Atom), KindWatch>>,
}

impl std::fmt::Debug for DriftWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds = self.kinds.lock().map(|k| k.len()).unwrap_or_default();
        f.debug_struct("DriftWatch")
            .field("owner", &self.cluster.teller.owner)
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
    /// Watches for the Cluster `owner` (`(namespace, name)`) through a direct client of `discovery`
    /// ([`ClusterDiscovery::direct_client`]), telling drift of what `engine` applied to `notify`.
    pub fn new(
        owner: (String, String),
        discovery: Arc<ClusterDiscovery>,
        engine: ApplyEngine,
        notify: DriftNotifier,
    ) -> Self {
        let client = discovery.direct_client();
        let cluster = Arc::new(ClusterWatches {
            reach: Reach::new(client.clone()),
            client,
            engine,
            teller: Teller {
                owner,
                notify,
                causes: Causes::default(),
            },
        });
        DriftWatch {
            discovery,
            cluster,
            kinds: Mutex::default(),
        }
    }

    /// What the watch saw of `key`'s last drift (who changed it and which fields, or that it went), taken
    /// by the pass that corrected it: a cause is kept only until then, not for as long as the watches last.
    pub fn take_cause(&self, key: &ObjectKey) -> Option<DriftCause> {
        let mut causes = self
            .cluster
            .teller
            .causes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let cause = causes.remove(key);
        if causes.is_empty() {
            *causes = HashMap::new();
        }
        cause
    }

    /// Starts watching the kinds of `resources` not watched yet (a kind the cluster does not serve is
    /// skipped: its objects were not applied either). A kind this engine applied objects of is watched from
    /// the earliest of those applies, with what they left as its cache: no list. Any other kind is listed
    /// first.
    pub async fn watch(&self, resources: &[Resource]) {
        let wanted: BTreeSet<(&Atom, &Atom, &Atom)> = resources
            .iter()
            .map(|r| (&r.group, &r.version, &r.kind))
            .collect();
        for (group, version, kind) in wanted {
            let id = (group.clone(), kind.clone());
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
            let since = self.cluster.engine.applied_since(group, kind);
            let from = since.map(|since| {
                *cache.objects() = since
                    .objects
                    .into_iter()
                    .map(|(key, live)| ((key.namespace, key.name), live))
                    .collect();
                since.resource_version
            });
            let follower = KindFollower {
                cluster: self.cluster.clone(),
                path: DynamicObject::url_path(&resolved.resource, None),
                group: group.to_owned(),
                kind: kind.to_owned(),
                cache: cache.clone(),
            };
            let task = tokio::spawn(Box::new(follower).follow(from));
            kinds.insert(
                id,
                KindWatch {
                    cache,
                    task: task.abort_handle(),
                },
            );
        }
    }

    /// Whether a watch request of every kind watched is open right now: the workload cluster's API server is
    /// serving this client (its connection is checked by HTTP/2 pings), which tells as much as a `/readyz`.
    /// `false` before anything is watched.
    pub fn streaming(&self) -> bool {
        let kinds = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        !kinds.is_empty()
            && kinds
                .values()
                .all(|watch| watch.cache.streaming.load(Ordering::Acquire))
    }

    /// Whether the objects of `inventory` (synced entries only) are as this process's applies left them
    /// ([`verdict_of`]).
    pub fn verdict(&self, inventory: &[Resource]) -> Verdict {
        let kinds = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        verdict_of(inventory.iter().map(|resource| {
            let key = ObjectKey::of(resource);
            let watch = kinds.get(&(key.group.clone(), key.kind.clone()))?;
            if !watch.cache.known.load(Ordering::Acquire) || !self.cluster.engine.has_applied(&key) {
                return None;
            }
            let as_applied = watch
                .cache
                .objects()
                .get(&(key.namespace.clone(), key.name.clone()))
                .is_some_and(|live| self.cluster.engine.left_as_applied(&key, live));
            Some((key, as_applied))
        }))
    }
}

/// What the watches tell of each object of an inventory (`None`: cannot tell; else whether it is as applied)
/// makes the verdict: drifted when any object that can be told is, in part when others cannot be told (a
/// kind whose watch is still listing after an outage must not hide a deletion another kind's watch saw);
/// else unknown when any cannot be told.
fn verdict_of(objects: impl Iterator<Item = Option<(ObjectKey, bool)>>) -> Verdict {
    let mut drifted = Vec::new();
    let mut unknown = false;
    for object in objects {
        match object {
            None => unknown = true,
            Some((key, false)) => drifted.push(key),
            Some((_, true)) => {}
        }
    }
    match (drifted.is_empty(), unknown) {
        (false, false) => Verdict::Drifted(drifted),
        (false, true) => Verdict::DriftedInPart(drifted),
        (true, true) => Verdict::Unknown,
        (true, false) => Verdict::AsApplied,
    }
}

/// How one watch request ended.
#[derive(Debug)]
enum WatchEnd {
    /// The server ended it (its timeout) or the stream closed: resume from the last version seen.
    Closed,
    /// The version to resume from is no longer served (410): list again.
    Gone,
    /// The request failed or an event could not be read: resume after a delay.
    Failed(String),
}

/// Tells the notifier of drift of one workload cluster's objects, keeping each one's cause.
struct Teller {
    /// `(namespace, cluster)` of the Cluster.
    owner: (String, String),
    notify: DriftNotifier,
    causes: Causes,
}

impl Teller {
    fn tell(&self, why: &str, key: &ObjectKey, cause: Option<DriftCause>) {
        // Debug: in a drift fight every write of the object comes here, for each Cluster on its API server;
        // what is put back is logged by the applier, a fight reported on the ClusterAddon.
        tracing::debug!(cluster = %self.owner.1, namespace = %self.owner.0, object = %key,
            cause = cause.as_ref().map(tracing::field::display), "{why}: drift");
        if let Some(cause) = cause {
            let mut causes = self.causes.lock().unwrap_or_else(|p| p.into_inner());
            // A write with our field manager (another ClusterAddon's apply, on an API server two Clusters
            // share) must not hide another manager who changed the object before.
            let ours = |c: &DriftCause| matches!(c, DriftCause::Written(w) if w.ours);
            if !ours(&cause) || causes.get(key).is_none_or(ours) {
                causes.insert(key.clone(), cause);
            }
        }
        (self.notify)(&self.owner.0, &self.owner.1, key);
    }
}

/// Follows one kind of one workload cluster until aborted: a metadata-only watch of the objects carrying
/// the operator's label, kept in the kind's cache, drift told to the notifier. Written here rather than with
/// kube's watcher so that a watch begins without a list when the engine's applies tell where to begin, asks
/// for no bookmarks (the API server sends one per watch and minute: 150 a second for an idle operator of a
/// thousand Clusters), and holds a buffer only as large as the event being read.
struct KindFollower {
    cluster: Arc<ClusterWatches>,
    /// The path of the kind's objects (in every namespace).
    path: String,
    group: Atom,
    kind: Atom,
    cache: Arc<KindCache>,
}

impl KindFollower {
    /// Watches from `from` (the cache already holds what was there then), or lists first when `None`; lists
    /// again whenever the version to resume from is gone.
    // Not an `async fn`: its arguments would be kept twice in the future (as given and as moved in), which is
    // held for the watch's whole life.
    #[expect(clippy::manual_async_fn, reason = "an async fn keeps its arguments twice")]
    fn follow(self: Box<Self>, mut from: Option<String>) -> impl Future<Output = ()> + Send {
        async move {
            let mut failures: u32 = 0;
            loop {
                let version = match from.take() {
                    Some(version) => version,
                    // Boxed for the same reason as the watch's request (see `watch_from`).
                    None => match Box::pin(self.relist()).await {
                        Ok(version) => version,
                        Err(error) => {
                            failures = failures.saturating_add(1);
                            tracing::debug!(cluster = %self.cluster.teller.owner.1, kind = %self.kind, %error, "drift list failed");
                            if self.pause(failures).await {
                                failures = 0;
                            }
                            continue;
                        }
                    },
                };
                let mut last = version;
                let began = tokio::time::Instant::now();
                let end = self.watch_from(&mut last).await;
                // A watch that ends at once, however it ends, is retried after a delay: a server or proxy that
                // closes every watch straight away must not make this a hot loop.
                let brief = began.elapsed() < BRIEF_WATCH;
                match end {
                    WatchEnd::Closed => {
                        from = Some(last);
                    }
                    WatchEnd::Gone => {
                        self.cache.known.store(false, Ordering::Release);
                        tracing::debug!(cluster = %self.cluster.teller.owner.1, kind = %self.kind, "drift watch expired: listing again");
                    }
                    WatchEnd::Failed(error) => {
                        self.cache.known.store(false, Ordering::Release);
                        tracing::debug!(cluster = %self.cluster.teller.owner.1, kind = %self.kind, %error, "drift watch interrupted");
                        from = Some(last);
                    }
                }
                if brief {
                    failures = failures.saturating_add(1);
                    if self.pause(failures).await {
                        failures = 0;
                    }
                } else {
                    failures = 0;
                }
            }
        }
    }

    /// Waits before the `failures`-th try in a row ([`Reach::pause`]); boxed, so that the wait's timer is
    /// held only while the watch waits, not for the whole life of its task.
    async fn pause(&self, failures: u32) -> bool {
        Box::pin(self.cluster.reach.pause(retry_delay(failures))).await
    }

    fn request(&self) -> kube::core::Request {
        kube::core::Request::new(&self.path)
    }

    fn key_of(&self, meta: &kube::api::ObjectMeta) -> ObjectKey {
        ObjectKey {
            group: self.group.clone(),
            kind: self.kind.clone(),
            namespace: meta.namespace.as_deref().unwrap_or_default().into(),
            name: meta.name.as_deref().unwrap_or_default().into(),
        }
    }

    /// Who last wrote `meta`'s object, other than us if anyone.
    fn writer(&self, meta: &kube::api::ObjectMeta) -> Option<DriftCause> {
        let entries = meta.managed_fields.as_deref().unwrap_or_default();
        last_writer(entries, &self.cluster.engine.field_manager).map(DriftCause::Written)
    }

    /// The watch request of the kind's objects of ours (metadata only, no bookmarks) from `last`.
    fn watch_request(
        &self,
        last: &str,
    ) -> Result<http::Request<kube::client::Body>, kube::core::request::Error> {
        let params = WatchParams::default()
            .labels(&cso_api::owned_selector())
            .timeout(WATCH_TIMEOUT_SECONDS)
            .disable_bookmarks();
        let mut request = self.request().watch_metadata(&params, last)?;
        request.headers_mut().insert(
            http::header::ACCEPT_ENCODING,
            http::HeaderValue::from_static("identity"),
        );
        Ok(request.map(kube::client::Body::from))
    }

    /// Lists the kind's objects of ours (metadata only) into the cache, tells what changed while no watch
    /// ran (each object this engine applied that the list shows missing or changed), and returns the list's
    /// version.
    async fn relist(&self) -> Result<String, String> {
        let request = self
            .request()
            .list_metadata(&ListParams::default().labels(&cso_api::owned_selector()))
            .map_err(|e| e.to_string())?;
        let list: ObjectList<PartialObjectMeta<DynamicObject>> = self
            .cluster
            .client
            .request(request)
            .await
            .map_err(|e| e.to_string())?;
        let listed: HashMap<(Atom, Atom), LiveMeta> = list
            .items
            .iter()
            .map(|object| {
                let key = self.key_of(&object.metadata);
                ((key.namespace, key.name), LiveMeta::of(&object.metadata))
            })
            .collect();
        let changed: Option<ObjectKey> = self
            .cluster
            .engine
            .applied_of_kind(&self.group, &self.kind)
            .into_iter()
            .find(|key| {
                listed
                    .get(&(key.namespace.clone(), key.name.clone()))
                    .is_none_or(|live| !self.cluster.engine.left_as_applied(key, live))
            });
        *self.cache.objects() = listed;
        self.cache.known.store(true, Ordering::Release);
        if let Some(key) = changed {
            let cause = match list.items.iter().find(|o| self.key_of(&o.metadata) == key) {
                Some(object) => self.writer(&object.metadata),
                None => Some(DriftCause::Gone),
            };
            self.cluster.teller.tell("listed changed or missing", &key, cause);
        }
        list.metadata
            .resource_version
            .ok_or_else(|| "a list without a resourceVersion".to_owned())
    }

    /// Sends the watch request from `last`: the body of its answer, or how the watch ends when it fails or
    /// is refused.
    async fn open(&self, last: &str) -> Result<Box<DynBody>, WatchEnd> {
        let failed = |e: &dyn std::fmt::Display| WatchEnd::Failed(e.to_string());
        let request = self.watch_request(last).map_err(|e| failed(&e))?;
        let response = self.cluster.client.send(request).await.map_err(|e| failed(&e))?;
        match response.status() {
            status if status == http::StatusCode::GONE => Err(WatchEnd::Gone),
            status if !status.is_success() => Err(WatchEnd::Failed(format!("watch answered {status}"))),
            _ => Ok(response.into_body()),
        }
    }

    /// One watch request from `last`, which follows the events.
    async fn watch_from(&self, last: &mut String) -> WatchEnd {
        // Boxed, and so freed once answered: the request's future is several times the size of what the
        // stream needs, and a task's future keeps the size of its largest state for as long as the watch lasts
        // (nine watches per workload cluster).
        let mut body = match Box::pin(self.open(last)).await {
            Ok(body) => body,
            Err(end) => return end,
        };
        let _streaming = Streaming::begin(&self.cache.streaming);
        // Every change after `last` comes on this stream: the cache, as of `last`, is kept whole from here.
        self.cache.known.store(true, Ordering::Release);
        let mut lines = LineBuffer::default();
        while let Some(frame) = body.frame().await {
            let data = match frame {
                Ok(frame) => match frame.into_data() {
                    Ok(data) => data,
                    Err(_) => continue,
                },
                Err(e) => return WatchEnd::Failed(e.to_string()),
            };
            let mut end = None;
            let pushed = lines.push(&data, |line| {
                if end.is_none() {
                    end = self.event(line, last);
                }
            });
            if let Err(error) = pushed {
                return WatchEnd::Failed(error);
            }
            if let Some(end) = end {
                return end;
            }
        }
        WatchEnd::Closed
    }

    /// Whether an event of `key` at `version` is history the engine's record of the object already covers (a
    /// version before the record's): a watch resumes from the earliest record of its kind, so it replays what
    /// happened to objects recorded later (after a restart, the reads of the first pass) up to their records,
    /// changes put back since among it. The event of the recorded version itself is taken in.
    fn stale(&self, key: &ObjectKey, version: Option<&str>) -> bool {
        version.is_some_and(|version| self.cluster.engine.recorded_later_than(key, version))
    }

    /// Takes in one event line; `Some` ends the watch.
    fn event(&self, line: &[u8], last: &mut String) -> Option<WatchEnd> {
        let event = match parse_event(line) {
            Ok(event) => event,
            Err(end) => return Some(end),
        };
        match event {
            WatchEvent::Added(object) | WatchEvent::Modified(object) => {
                let key = self.key_of(&object.metadata);
                let live = LiveMeta::of(&object.metadata);
                let version = object.metadata.resource_version.clone();
                if let Some(version) = &version {
                    last.clone_from(version);
                }
                if self.stale(&key, version.as_deref()) {
                    return None;
                }
                // Asked before the judgement: `None` then means any write of the object is recorded already.
                let written = self.cluster.engine.written(&key);
                let drifted = self.cluster.engine.has_applied(&key)
                    && !self.cluster.engine.left_as_applied(&key, &live);
                let cause = if drifted {
                    self.writer(&object.metadata)
                } else {
                    None
                };
                self.cache
                    .objects()
                    .insert((key.namespace.clone(), key.name.clone()), live.clone());
                if drifted {
                    match written {
                        // Written by this engine now: the event may be the write's own, come before its record,
                        // or of a change the write put back. Judged once it is recorded, neither is drift (told,
                        // they would look like a writer answering each correction at once).
                        Some(written) => {
                            let cluster = self.cluster.clone();
                            tokio::spawn(async move {
                                written.await;
                                let before_the_write = version
                                    .as_deref()
                                    .is_some_and(|version| cluster.engine.recorded_since(&key, version));
                                if !before_the_write && !cluster.engine.left_as_applied(&key, &live) {
                                    cluster.teller.tell("changed", &key, cause);
                                }
                            });
                        }
                        None => self.cluster.teller.tell("changed", &key, cause),
                    }
                }
            }
            WatchEvent::Deleted(object) => {
                let key = self.key_of(&object.metadata);
                let stale = self.stale(&key, object.metadata.resource_version.as_deref());
                if let Some(version) = object.metadata.resource_version {
                    *last = version;
                }
                if stale {
                    return None;
                }
                self.cache
                    .objects()
                    .remove(&(key.namespace.clone(), key.name.clone()));
                if self.cluster.engine.has_applied(&key) {
                    self.cluster
                        .teller
                        .tell("deleted or unlabelled", &key, Some(DriftCause::Gone));
                }
            }
            WatchEvent::Bookmark(bookmark) => *last = bookmark.metadata.resource_version,
            WatchEvent::Error(_) => {}
        }
        None
    }
}

/// One watch event line; an `ERROR` event, or a line that is none, as how it ends the watch: 410 (the
/// version to resume from was compacted away, or fell out of the API server's watch cache) means list again.
fn parse_event(line: &[u8]) -> Result<WatchEvent<PartialObjectMeta<DynamicObject>>, WatchEnd> {
    match serde_json::from_slice(line) {
        Ok(WatchEvent::Error(error)) if error.code == 410 => Err(WatchEnd::Gone),
        Ok(WatchEvent::Error(error)) => Err(WatchEnd::Failed(error.message)),
        Ok(event) => Ok(event),
        Err(e) => Err(WatchEnd::Failed(format!("unreadable watch event: {e}"))),
    }
}

/// The wait before the `failures`-th try in a row: 1 s, doubling to a minute, with a little spread so that
/// the watches of many clusters that failed together do not come back together.
fn retry_delay(failures: u32) -> Duration {
    let base = Duration::from_secs(1u64 << failures.saturating_sub(1).min(6)).min(MAX_RETRY_DELAY);
    let spread = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_millis() % 250)
        .unwrap_or_default();
    base + Duration::from_millis(u64::from(spread))
}

/// Splits a watch body into its lines (one event each), keeping only the part of a line not yet complete.
#[derive(Default)]
struct LineBuffer {
    partial: Vec<u8>,
}

impl LineBuffer {
    /// Hands each complete line of what came so far to `line`; an error when an unfinished line grows past
    /// [`MAX_EVENT_BYTES`].
    fn push(&mut self, mut data: &[u8], mut line: impl FnMut(&[u8])) -> Result<(), String> {
        while let Some(end) = data.iter().position(|b| *b == b'\n') {
            let (head, rest) = (&data[..end], &data[end + 1..]);
            data = rest;
            if self.partial.is_empty() {
                if !head.is_empty() {
                    line(head);
                }
            } else {
                self.partial.extend_from_slice(head);
                line(&self.partial);
                self.partial.clear();
            }
        }
        if self.partial.len() + data.len() > MAX_EVENT_BYTES {
            return Err(format!("a watch event longer than {MAX_EVENT_BYTES} bytes"));
        }
        self.partial.extend_from_slice(data);
        if self.partial.is_empty() && self.partial.capacity() > KEPT_BUFFER_BYTES {
            self.partial = Vec::new();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_map(name: &str) -> ObjectKey {
        ObjectKey {
            group: Atom::default(),
            kind: "ConfigMap".into(),
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    #[rstest::rstest]
    #[case::all_as_applied(&[Some(true), Some(true)], Verdict::AsApplied)]
    #[case::one_cannot_be_told(&[Some(true), None], Verdict::Unknown)]
    #[case::drifted_beside_one_that_cannot_be_told(&[None, Some(false)], Verdict::DriftedInPart(vec![config_map("1")]))]
    #[case::drifted(&[Some(false), Some(true)], Verdict::Drifted(vec![config_map("0")]))]
    #[case::nothing(&[], Verdict::AsApplied)]
    fn drift_seen_is_drift_even_beside_objects_that_cannot_be_told(
        #[case] told: &[Option<bool>],
        #[case] expected: Verdict,
    ) {
        let objects = told
            .iter()
            .enumerate()
            .map(|(i, t)| t.map(|as_applied| (config_map(&i.to_string()), as_applied)));
        assert_eq!(verdict_of(objects), expected);
    }

    fn lines_of(chunks: &[&[u8]]) -> (Vec<String>, LineBuffer) {
        let mut buffer = LineBuffer::default();
        let mut seen = Vec::new();
        for chunk in chunks {
            buffer
                .push(chunk, |line| {
                    seen.push(String::from_utf8_lossy(line).into_owned())
                })
                .unwrap();
        }
        (seen, buffer)
    }

    #[test]
    fn events_are_split_at_newlines_wherever_the_chunks_break() {
        for (chunks, expected, why) in [
            (vec![&b"{a}\n{b}\n"[..]], vec!["{a}", "{b}"], "two in one chunk"),
            (
                vec![&b"{a"[..], &b"}\n{b"[..], &b"}\n"[..]],
                vec!["{a}", "{b}"],
                "split inside events",
            ),
            (vec![&b"{a}"[..], &b"\n"[..]], vec!["{a}"], "the newline alone"),
            (vec![&b"{a}\n\n"[..]], vec!["{a}"], "an empty line is no event"),
            (vec![&b"{a}\n{b"[..]], vec!["{a}"], "an unfinished event waits"),
        ] {
            assert_eq!(lines_of(&chunks).0, expected, "{why}");
        }
    }

    #[test]
    fn a_large_event_does_not_keep_its_buffer_and_an_endless_one_is_refused() {
        let big = vec![b'x'; 64 << 10];
        let (seen, buffer) = lines_of(&[&big, b"\n"]);
        assert_eq!(seen.len(), 1);
        assert_eq!(buffer.partial.capacity(), 0, "given back once the event is read");
        let mut buffer = LineBuffer::default();
        let chunk = vec![b'x'; 1 << 20];
        let refused = (0..8).find_map(|_| buffer.push(&chunk, |_| {}).err());
        assert!(refused.is_some_and(|e| e.contains("longer than")));
    }

    #[test]
    fn an_expired_version_means_list_again_and_other_errors_retry() {
        let added = br#"{"type":"ADDED","object":{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":{"name":"a","namespace":"n","resourceVersion":"7"}}}"#;
        assert!(
            matches!(parse_event(added), Ok(WatchEvent::Added(o)) if o.metadata.name.as_deref() == Some("a"))
        );
        let gone = br#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old resource version: 1 (40)","reason":"Expired","code":410}}"#;
        assert!(matches!(parse_event(gone), Err(WatchEnd::Gone)));
        let other = br#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"internal error","reason":"InternalError","code":500}}"#;
        assert!(matches!(parse_event(other), Err(WatchEnd::Failed(m)) if m == "internal error"));
        assert!(matches!(parse_event(b"<html>"), Err(WatchEnd::Failed(m)) if m.starts_with("unreadable")));
    }

    #[test]
    fn retries_wait_longer_each_time_up_to_a_minute() {
        let delays: Vec<u64> = [1, 2, 3, 7, 30].map(|n| retry_delay(n).as_secs()).into();
        assert_eq!(delays, [1, 2, 4, 60, 60]);
    }

    /// The size of what `f` returns, without calling it.
    fn size_of_output<A, B, R>(_: impl Fn(A, B) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    #[test]
    fn the_task_of_a_kinds_watch_stays_small() {
        // Kept for the watch's life, nine per workload cluster, in a tokio task cell aligned to 128 bytes with
        // about 100 of its own: at most 288 keeps the cell at 384 bytes (the future was 1104 bytes before the
        // cluster's shared parts went behind one pointer and the request and the wait were boxed).
        let follow = size_of_output(KindFollower::follow);
        assert!(follow <= 288, "a kind's watch future takes {follow} bytes");
        let streaming =
            size_of_output(|follower: &KindFollower, last: &mut String| follower.watch_from(last));
        assert!(
            streaming <= 128,
            "a watch request's future takes {streaming} bytes"
        );
    }
}
