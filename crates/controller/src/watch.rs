//! How every watch of the operator comes back after the API server went away: each watch retries on its own
//! bounded, jittered backoff ([`RETRY_FIRST`] doubling to [`RETRY_MAX`], each wait between half and all of
//! that), so all of them are back within a few seconds of the API server answering again, and resumes from the
//! last resourceVersion it saw, or lists again when the server no longer has that version: no change made in
//! the meantime is missed.
//!
//! kube-runtime's default backoff grows to 30 s (and starts over only after two minutes without an error), and
//! a `Controller` built with `new`/`watches` has one backoff for all its watches: a failing watch pauses the
//! others, and their errors are taken one per backoff period. After a 30 s outage, edits waited 29-132 s for a
//! controller's watches to come back (issue 19). Here every watch has its own backoff, and its errors are
//! logged and left out of the controller's stream, so one watch never waits for another.
//!
//! Each kind is watched once ([`SharedWatch`]): one store that reconcilers read instead of asking the API
//! server, and every controller that reacts to the kind subscribes to the same events.

use std::{collections::HashMap, fmt::Debug, sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use kube::{
    Api, Resource, ResourceExt,
    runtime::{Controller, WatchStreamExt, reflector, utils::Backoff, watcher},
};
use serde::de::DeserializeOwned;

/// The first wait after a watch fails.
pub(crate) const RETRY_FIRST: Duration = Duration::from_millis(250);
/// The longest wait between two attempts of one watch: how late at most a watch notices that the API server
/// answers again.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(2);

/// The backoff of one watch: [`RETRY_FIRST`] doubling up to [`RETRY_MAX`], with equal jitter; reset by any
/// event that gets through.
#[derive(Clone, Debug, Default)]
pub(crate) struct WatchBackoff {
    failures: u32,
}

/// A new [`WatchBackoff`].
pub(crate) fn backoff() -> WatchBackoff {
    WatchBackoff::default()
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let ceiling = RETRY_FIRST
            .saturating_mul(1 << self.failures.min(16))
            .min(RETRY_MAX);
        self.failures = self.failures.saturating_add(1);
        // Between half and all of the ceiling: watches cut at the same moment do not retry in lockstep.
        Some(ceiling.mul_f64(0.5 + 0.5 * random_fraction()))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.failures = 0;
    }
}

/// A number in [0, 1): the standard library's randomly keyed hasher over the clock (jitter needs no more).
fn random_fraction() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    #[allow(clippy::cast_precision_loss, reason = "53 random bits fit a float exactly")]
    let fraction = (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64;
    fraction
}

/// One watch of a kind, shared by everything that needs it: it fills one store (the cache reconcilers read
/// from) and hands every event (deletions too) to each subscriber after the store has it, so that a
/// reconcile triggered by an event reads a store at least as new as that event. One watch and one copy of
/// each object per kind, however many controllers look at it.
pub(crate) struct SharedWatch<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    kind: String,
    store: reflector::Store<K>,
    /// Set once the store has its first list ([`Listed`]).
    listed: tokio::sync::watch::Sender<bool>,
    events: futures::stream::BoxStream<'static, watcher::Event<K>>,
    /// Each event goes to every subscriber as one shared copy ([`shared`]).
    subscribers: Vec<tokio::sync::mpsc::UnboundedSender<watcher::Event<Arc<K>>>>,
}

/// Whether a [`SharedWatch`]'s store has had its first list, asked without waiting: a reconcile reads a store
/// that has it, else the API server.
///
/// Not `Store::wait_until_ready`: kube-runtime's readiness is a oneshot receiver that keeps the waker of the
/// last future that polled it only, so of two futures waiting at once (a controller's runner and a reconcile,
/// or two reconciles) all but the last are never woken. Reconciles waiting that way hung for good, silently
/// (no ClusterStackRelease was ever created), and a controller's runner that lost its waker would never start.
/// Only each controller's own runner waits on its store that way; nothing else may even poll it.
#[derive(Clone, Debug)]
pub(crate) struct Listed(tokio::sync::watch::Receiver<bool>);

impl Listed {
    /// Whether the store has had its first list, now (never waits, never disturbs a waiter).
    pub(crate) fn now(&self) -> bool {
        *self.0.borrow()
    }
}

impl<K> SharedWatch<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Debug + Unpin + Send + Sync,
{
    /// The watch of `api` (with `config`), on its own backoff; nothing happens until [`SharedWatch::run`].
    pub(crate) fn new(api: Api<K>, config: watcher::Config, dyntype: K::DynamicType) -> Self {
        let kind = K::kind(&dyntype).into_owned();
        let writer = reflector::store::Writer::new(dyntype);
        let store = writer.as_reader();
        let logged_kind = kind.clone();
        let events = watcher(api, config)
            .backoff(backoff())
            // Nothing reads who owns which field of these objects; the list of it is often the largest part of
            // an object's metadata, and the store keeps every object of the kind.
            .modify(|object| object.meta_mut().managed_fields = None)
            .reflect(writer)
            .filter_map(move |event| {
                std::future::ready(match event {
                    Ok(event) => Some(event),
                    Err(e) => {
                        tracing::debug!(kind = %logged_kind, error = %e, "watch interrupted; retrying");
                        None
                    }
                })
            })
            .boxed();
        SharedWatch {
            kind,
            store,
            listed: tokio::sync::watch::Sender::new(false),
            events,
            subscribers: Vec::new(),
        }
    }

    /// The store the watch fills.
    pub(crate) fn store(&self) -> reflector::Store<K> {
        self.store.clone()
    }

    /// The store with whether it has had its first list (ask that of [`Listed`], never of the store), as the
    /// reconcilers read it.
    pub(crate) fn cache(&self) -> crate::stores::Listed<K> {
        crate::stores::Listed {
            store: self.store(),
            listed: Listed(self.listed.subscribe()),
        }
    }

    /// Every event of the watch from now on, each after the store has it.
    pub(crate) fn subscribe(&mut self) -> impl Stream<Item = watcher::Event<Arc<K>>> + Send + 'static {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        self.subscribers.push(sender);
        futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|event| (event, receiver))
        })
    }

    /// The objects created, changed or deleted (for `Controller::watches_shared_stream`).
    pub(crate) fn touched(&mut self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        self.subscribe().filter_map(|event| {
            std::future::ready(match event {
                watcher::Event::Apply(object)
                | watcher::Event::InitApply(object)
                | watcher::Event::Delete(object) => Some(object),
                watcher::Event::Init | watcher::Event::InitDone => None,
            })
        })
    }

    /// A controller of `K` on this watch and its store, woken by the objects created or changed in anything
    /// but their status ([`beyond_status`]).
    ///
    /// The status of each of our kinds is written by its own controller alone (Cluster API writes a Cluster's),
    /// at the end of a reconcile that has already chosen when to come back. Woken by its own write, a
    /// controller ran again at once, ahead of its backoff: a failure whose message changes between attempts
    /// (a connection reset one time, closed the next) made a burst of a dozen attempts in 100 ms, and each
    /// failure doubled the delay, so the object then waited the longest backoff once fixed.
    pub(crate) fn controller(&mut self, dyntype: K::DynamicType) -> Controller<K> {
        let changed = applied_changes_of(self.subscribe(), beyond_status);
        Controller::for_shared_stream_with(changed, self.store(), dyntype).trigger_backoff(backoff())
    }

    /// Drives the watch, handing each event to every subscriber, until no subscriber is left.
    pub(crate) async fn run(self) {
        let SharedWatch {
            kind,
            listed,
            mut events,
            mut subscribers,
            ..
        } = self;
        while let Some(event) = events.next().await {
            if matches!(event, watcher::Event::InitDone) {
                // The store has swapped the list in (the reflector applies each event before handing it on).
                listed.send_replace(true);
            }
            let event = shared(event);
            subscribers.retain(|subscriber| subscriber.send(event.clone()).is_ok());
            if subscribers.is_empty() {
                break;
            }
        }
        tracing::debug!(%kind, "shared watch stopped");
    }
}

/// What an object is apart from its status: its identity, spec (its generation) and metadata. Two versions
/// of an object with the same value differ in their status (or resourceVersion, managedFields) only.
pub(crate) fn beyond_status<K: Resource>(object: &K) -> u64 {
    use std::hash::{Hash, Hasher};
    let meta = object.meta();
    let mut hasher = std::hash::DefaultHasher::new();
    meta.uid.hash(&mut hasher);
    meta.generation.hash(&mut hasher);
    meta.labels.hash(&mut hasher);
    meta.annotations.hash(&mut hasher);
    meta.finalizers.hash(&mut hasher);
    meta.deletion_timestamp.is_some().hash(&mut hasher);
    for owner in meta.owner_references.iter().flatten() {
        (&owner.api_version, &owner.kind, &owner.name, &owner.uid).hash(&mut hasher);
        (owner.controller, owner.block_owner_deletion).hash(&mut hasher);
    }
    hasher.finish()
}

/// `event` with its object shared: every subscriber gets the same copy (each got a clone of its own, and an
/// install of a thousand Clusters queued thousands of them while the subscribers caught up).
pub(crate) fn shared<K>(event: watcher::Event<K>) -> watcher::Event<Arc<K>> {
    match event {
        watcher::Event::Apply(object) => watcher::Event::Apply(Arc::new(object)),
        watcher::Event::Delete(object) => watcher::Event::Delete(Arc::new(object)),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(object) => watcher::Event::InitApply(Arc::new(object)),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// A 64-bit digest of `state`, what a stream keeps of each object's state to tell a change: two different
/// states alike in it are as likely as with [`beyond_status`].
pub(crate) fn digest(state: &impl std::hash::Hash) -> u64 {
    use std::hash::Hasher;
    let mut hasher = std::hash::DefaultHasher::new();
    state.hash(&mut hasher);
    hasher.finish()
}

/// How an object of a watch changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    /// Created, or changed in the state asked about.
    Changed,
    Deleted,
}

/// The objects of `events` whose `state` changed since the watch last showed them (the first sight of an
/// object counts as a change), and those deleted; other events are left out. Each object's state is kept as
/// a digest: a stream per subscriber remembers every object of the kind (a thousand Clusters' labels and
/// annotations, several times over, before).
fn tracked_changes<K, S>(
    events: impl Stream<Item = watcher::Event<Arc<K>>> + Send + 'static,
    state: impl Fn(&K) -> S + Send + 'static,
) -> impl Stream<Item = (Arc<K>, Change)> + Send + 'static
where
    K: Resource + Send + Sync + 'static,
    S: std::hash::Hash + Send + 'static,
{
    let mut last_seen: HashMap<(String, String), u64> = HashMap::new();
    events.filter_map(move |event| {
        let change = match event {
            watcher::Event::Apply(object) | watcher::Event::InitApply(object) => {
                let key = (object.namespace().unwrap_or_default(), object.name_any());
                let now = digest(&state(&object));
                let news = last_seen.get(&key) != Some(&now);
                last_seen.insert(key, now);
                news.then_some((object, Change::Changed))
            }
            watcher::Event::Delete(object) => {
                last_seen.remove(&(object.namespace().unwrap_or_default(), object.name_any()));
                Some((object, Change::Deleted))
            }
            watcher::Event::Init | watcher::Event::InitDone => None,
        };
        std::future::ready(change)
    })
}

/// The objects of `events` whose `state` changed since the watch last showed them, and those deleted. The
/// first sight of an object counts as a change.
pub(crate) fn changes_of<K, S>(
    events: impl Stream<Item = watcher::Event<Arc<K>>> + Send + 'static,
    state: impl Fn(&K) -> S + Send + 'static,
) -> impl Stream<Item = Arc<K>> + Send + 'static
where
    K: Resource + Send + Sync + 'static,
    S: std::hash::Hash + Send + 'static,
{
    tracked_changes(events, state).map(|(object, _)| object)
}

/// [`changes_of`] without the deletions (a controller of `K` learns of a deletion of its objects from their
/// deletionTimestamp, a change).
fn applied_changes_of<K, S>(
    events: impl Stream<Item = watcher::Event<Arc<K>>> + Send + 'static,
    state: impl Fn(&K) -> S + Send + 'static,
) -> impl Stream<Item = Arc<K>> + Send + 'static
where
    K: Resource + Send + Sync + 'static,
    S: std::hash::Hash + Send + 'static,
{
    tracked_changes(events, state)
        .filter_map(|(object, change)| std::future::ready((change == Change::Changed).then_some(object)))
}

/// At most one item of `ticks` per `every`, never starved: the first item passes at once; one that comes
/// sooner than `every` after the last passed waits until then, and whatever else came meanwhile is folded
/// into it. Unlike a debounce (kube-runtime's restarts its wait at every new request), a steady stream of
/// changes still lets one through every `every`: a rollout woken by every Cluster of a busy fleet looks at
/// least once a second, and at most.
pub(crate) fn throttled(
    ticks: impl Stream<Item = ()> + Send + 'static,
    every: Duration,
) -> impl Stream<Item = ()> + Send + 'static {
    use futures::FutureExt as _;
    futures::stream::unfold(
        (ticks.fuse().boxed(), None::<tokio::time::Instant>),
        move |(mut ticks, last)| async move {
            ticks.next().await?;
            if let Some(last) = last {
                tokio::time::sleep_until(last + every).await;
            }
            // Fold in what came while waiting (without waiting for more).
            while let Some(Some(())) = ticks.next().now_or_never() {}
            Some(((), (ticks, Some(tokio::time::Instant::now()))))
        },
    )
    .fuse()
}

#[cfg(test)]
mod tests {
    use std::{
        pin::pin,
        sync::{
            Arc,
            atomic::{AtomicUsize, Ordering},
        },
        task::{Context, Wake, Waker},
    };

    use cso_api::{
        ClusterStackRelease,
        cluster_stack_release::ClusterStackReleaseStatus,
        conditions::{ConditionsExt, Severity},
    };
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    use super::*;

    /// A waker that counts its wakes.
    #[derive(Default)]
    struct Woken(AtomicUsize);

    impl Wake for Woken {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn waker() -> (Arc<Woken>, Waker) {
        let woken = Arc::new(Woken::default());
        (woken.clone(), Waker::from(woken))
    }

    fn config_map(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Why [`Listed`] exists: of two futures waiting on kube-runtime's store readiness at once, only the one
    /// that polled last is woken when the store is ready; the other waits for good.
    #[test]
    fn a_kube_store_wakes_only_the_last_of_two_waiters() {
        let mut writer = reflector::store::Writer::<ConfigMap>::default();
        let store = writer.as_reader();
        let (first_woken, first_waker) = waker();
        let (second_woken, second_waker) = waker();
        let mut first = pin!(store.wait_until_ready());
        let mut second = pin!(store.wait_until_ready());
        assert!(
            first
                .as_mut()
                .poll(&mut Context::from_waker(&first_waker))
                .is_pending()
        );
        assert!(
            second
                .as_mut()
                .poll(&mut Context::from_waker(&second_waker))
                .is_pending()
        );
        writer.apply_watcher_event(&watcher::Event::InitDone);
        assert_eq!(second_woken.0.load(Ordering::SeqCst), 1);
        assert_eq!(
            first_woken.0.load(Ordering::SeqCst),
            0,
            "kube-runtime wakes every waiter now: Listed could go"
        );
    }

    #[tokio::test]
    async fn a_store_is_said_listed_once_it_has_its_first_list() {
        let writer = reflector::store::Writer::<ConfigMap>::default();
        let store = writer.as_reader();
        let (feed, events) = futures::channel::mpsc::unbounded();
        let shared = SharedWatch {
            kind: "ConfigMap".to_owned(),
            store: store.clone(),
            listed: tokio::sync::watch::Sender::new(false),
            events: events
                .map(Ok)
                .reflect(writer)
                .filter_map(|event: Result<_, watcher::Error>| std::future::ready(event.ok()))
                .boxed(),
            subscribers: Vec::new(),
        };
        let mut shared = shared;
        let mut subscriber = Box::pin(shared.subscribe());
        let listed = shared.cache().listed;
        assert!(!listed.now(), "nothing listed yet");
        let running = tokio::spawn(shared.run());

        feed.unbounded_send(watcher::Event::Init).unwrap();
        feed.unbounded_send(watcher::Event::InitApply(config_map("a")))
            .unwrap();
        feed.unbounded_send(watcher::Event::InitDone).unwrap();
        // The subscriber sees the end of the list after the store has it, and by then it is said listed.
        loop {
            match subscriber.next().await {
                Some(watcher::Event::InitDone) => break,
                Some(_) => continue,
                None => panic!("the watch stopped"),
            }
        }
        assert_eq!(store.state().len(), 1);
        assert!(listed.now());
        drop(subscriber);
        drop(feed);
        running.await.unwrap();
    }

    #[test]
    fn waits_grow_to_a_bound_with_jitter_and_start_over_after_a_reset() {
        let mut backoff = backoff();
        let waits: Vec<Duration> = backoff.by_ref().take(12).collect();
        for (i, wait) in waits.iter().enumerate() {
            let ceiling = RETRY_FIRST.saturating_mul(1 << i).min(RETRY_MAX);
            assert!(*wait >= ceiling / 2 && *wait <= ceiling, "wait {i}: {wait:?}");
        }
        assert!(waits.iter().all(|w| *w <= RETRY_MAX));
        assert!(waits.windows(2).any(|w| w[0] != w[1]), "jittered: {waits:?}");
        backoff.reset();
        assert!(backoff.next().is_some_and(|w| w <= RETRY_FIRST));
    }

    /// A ClusterStackRelease as a watch shows it, changed by `edit`.
    fn release(edit: impl FnOnce(&mut ClusterStackRelease)) -> ClusterStackRelease {
        let mut release = ClusterStackRelease::new("docker-scs-1-34-v1", Default::default());
        release.metadata.namespace = Some("ns".into());
        release.metadata.uid = Some("uid-1".into());
        release.metadata.generation = Some(1);
        release.metadata.resource_version = Some("10".into());
        edit(&mut release);
        release
    }

    #[rstest::rstest]
    #[case::a_status_write(false, |r: &mut ClusterStackRelease| {
        r.status = Some(ClusterStackReleaseStatus { ready: true, ..Default::default() });
        r.metadata.resource_version = Some("11".into());
    })]
    #[case::a_new_message_of_the_same_failure(false, |r: &mut ClusterStackRelease| {
        r.mark_false("Downloaded", "Failed", Severity::Warning, "connection reset by peer");
    })]
    #[case::managed_fields(false, |r: &mut ClusterStackRelease| {
        r.metadata.managed_fields = Some(vec![Default::default()]);
    })]
    #[case::the_spec(true, |r: &mut ClusterStackRelease| r.metadata.generation = Some(2))]
    #[case::a_label(true, |r: &mut ClusterStackRelease| {
        r.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into());
    })]
    #[case::an_annotation(true, |r: &mut ClusterStackRelease| {
        r.metadata.annotations = Some([("cluster.x-k8s.io/paused".to_owned(), String::new())].into());
    })]
    #[case::a_finalizer(true, |r: &mut ClusterStackRelease| r.metadata.finalizers = Some(vec!["f".into()]))]
    #[case::an_owner(true, |r: &mut ClusterStackRelease| {
        r.metadata.owner_references = Some(vec![Default::default()]);
    })]
    #[case::deleting(true, |r: &mut ClusterStackRelease| {
        r.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    })]
    #[case::made_again(true, |r: &mut ClusterStackRelease| r.metadata.uid = Some("uid-2".into()))]
    fn what_counts_beyond_the_status(#[case] changed: bool, #[case] edit: fn(&mut ClusterStackRelease)) {
        let before = release(|_| {});
        let after = release(edit);
        assert_eq!(beyond_status(&before) != beyond_status(&after), changed);
    }

    /// A controller's trigger: created, changed beyond the status, made again after a deletion; not its own
    /// status writes, not the deletion, not the same object listed again.
    #[tokio::test]
    async fn a_controller_is_woken_by_changes_beyond_the_status_only() {
        use watcher::Event;
        let first = release(|_| {});
        let status_written = release(|r| {
            r.mark_false("Downloaded", "Failed", Severity::Warning, "connection closed");
        });
        let labelled = release(|r| r.metadata.labels = Some([("a".to_owned(), "b".to_owned())].into()));
        let relisted = labelled.clone();
        let made_again = release(|r| r.metadata.uid = Some("uid-2".into()));
        let events = vec![
            Event::Init,
            Event::InitApply(first),
            Event::InitDone,
            Event::Apply(status_written),
            Event::Apply(labelled),
            Event::Init,
            Event::InitApply(relisted),
            Event::InitDone,
            Event::Delete(release(|_| {})),
            Event::Apply(made_again),
        ];
        let woken: Vec<(Option<String>, Option<String>)> = applied_changes_of(
            futures::stream::iter(events.into_iter().map(shared)),
            beyond_status,
        )
        .map(|object| (object.uid(), object.labels().get("a").cloned()))
        .collect()
        .await;
        assert_eq!(
            woken,
            [
                (Some("uid-1".into()), None),
                (Some("uid-1".into()), Some("b".into())),
                (Some("uid-2".into()), None),
            ]
        );
    }

    #[tokio::test]
    async fn a_steady_stream_passes_once_per_period_and_never_starves() {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel::<()>();
        let ticks =
            futures::stream::unfold(receiver, |mut r| async move { r.recv().await.map(|()| ((), r)) });
        let mut passed = pin!(throttled(ticks, Duration::from_millis(100)));
        // A change every 10 ms for 600 ms, then none.
        let feeding = tokio::spawn(async move {
            for _ in 0..60 {
                let _ = sender.send(());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        let mut while_feeding = 0;
        while !feeding.is_finished() {
            tokio::select! {
                Some(()) = passed.next() => while_feeding += 1,
                () = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
        // A debounce would let nothing through while changes keep coming; unthrottled, all 60 would pass.
        assert!(
            (3..=8).contains(&while_feeding),
            "about one per 100 ms while changes keep coming: {while_feeding}"
        );
        // What came last is folded into one more, and then nothing.
        let after = tokio::time::timeout(Duration::from_millis(300), async {
            let mut n = 0;
            while let Ok(Some(())) = tokio::time::timeout(Duration::from_millis(150), passed.next()).await {
                n += 1;
            }
            n
        })
        .await
        .unwrap_or(0);
        assert!(after <= 1, "{after}");
    }
}
