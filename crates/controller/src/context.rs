//! What every reconciler shares, assembled from the operator's parts: the management client, the release
//! cache, the chart renderer, the apply engine, the event recorder, the settings, the version Clusters are
//! read in, and a per-object retry backoff. State that only one controller keeps (the ClusterAddon's resync
//! clock, the ClusterStackRelease's provider-object watches) lives in that controller's own context, beside a
//! shared `Context`.

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use cso_api::{ClusterAddon, ClusterStack, ClusterStackRelease, ClusterStackRollout, capi::Cluster};
use cso_apply::{ApplyEngine, ApplyReport, ClusterDiscovery, WorkloadClients};
use cso_release::ReleaseCache;
use cso_render::{ChartRenderer, ValuesTemplater};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{Api, Client, Resource, ResourceExt, discovery::ApiResource, runtime::controller::Action};

use crate::Operator;
use crate::events::Kind;
use crate::metrics::{MeteredRenderer, TargetCluster};

/// Connecting to a workload cluster may take this long; an unreachable one costs no more.
const WORKLOAD_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const WORKLOAD_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The event reporter, named as the Go operator names its recorder.
pub const EVENT_REPORTER: &str = "clusterstack-controller";

/// How the controllers run (the `cso run` flags).
#[derive(Clone, Debug)]
pub struct Settings {
    /// `--namespace`: watch only this namespace.
    pub namespace: Option<String>,
    /// `--watch-filter`: only objects with label `cluster.x-k8s.io/watch-filter=<value>`.
    pub watch_filter: Option<String>,
    /// `--clusterstack-concurrency`
    pub cluster_stack_concurrency: u16,
    /// `--clusterstackrelease-concurrency`
    pub cluster_stack_release_concurrency: u16,
    /// `--clusteraddon-concurrency`
    pub cluster_addon_concurrency: u16,
    /// How often a ClusterStack with `autoSubscribe` asks its source for new releases.
    pub poll_interval: Duration,
    /// How often applied objects are checked even when nothing announced a change: a workload cluster's
    /// objects against its drift watches (re-applied only when those cannot vouch for them), the management
    /// cluster's by a read before each apply (a deleted ClusterClass or addon object is noticed at once).
    pub resync_interval: Duration,
    /// How often a ClusterAddon asks again whether its workload cluster answers (`/readyz`). A new or
    /// changed kubeconfig Secret is noticed at once (watched).
    pub workload_retry_interval: Duration,
    /// `--qps` and `--burst` for the clients of workload clusters.
    pub client_limits: cso_apply::ClientLimits,
    /// `--reconcile-timeout`: a reconcile still running after this long is stopped and retried, so no
    /// object waits forever on a request or a process that hangs.
    pub reconcile_timeout: Duration,
    /// `--stage-timeout`: a stage of a lifecycle hook that has not finished after this long (its condition
    /// never holds, its objects cannot be applied) is given up with a Warning, so that Cluster API is not held
    /// forever.
    pub stage_timeout: Duration,
    /// `--addon-health-checks`: applied addons count as ready only once what they applied runs (Deployments
    /// available, DaemonSets rolled out, Jobs complete, CRDs established, ...), waited for up to
    /// `stage_timeout`, checked again at every periodic pass. Off: ready when applied, as the Go operator has it.
    pub addon_health_checks: bool,
    /// `--addon-settle-time`: while applied addons are waited for, how long every container of a running
    /// workload's pods must have been up for the workload to count as running ([`cso_apply::health::unsettled`]).
    pub addon_settle_time: Duration,
    /// `--drift-watches`: each workload cluster's applied objects are watched for drift; off, the periodic pass
    /// alone finds it.
    pub drift_watches: bool,
    /// `--shard`: the Clusters this replica handles (see [`cso_api::shard`]). A named shard runs only the
    /// ClusterAddonCreate and ClusterAddon controllers, over the Clusters and ClusterAddons labelled with its
    /// name (its watches select them, so it neither lists nor caches others); the default shard runs every
    /// controller, watches every Cluster and ClusterAddon, and reconciles the addons of unlabelled Clusters.
    pub shard: cso_api::shard::Shard,
    /// `--shard-grace`: how long a named shard may go without a replica holding its Lease before the default
    /// shard reports its Clusters (see `crate::unattended`).
    pub shard_grace: Duration,
    /// Where the shards' leader-election Leases are (`--leader-elect-namespace`); `None`: no leader election,
    /// and no shard is reported.
    pub lease_namespace: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            namespace: None,
            watch_filter: None,
            cluster_stack_concurrency: 1,
            cluster_stack_release_concurrency: 1,
            cluster_addon_concurrency: 1,
            poll_interval: Duration::from_secs(300),
            resync_interval: Duration::from_secs(300),
            workload_retry_interval: Duration::from_secs(10),
            client_limits: cso_apply::ClientLimits::UNLIMITED,
            reconcile_timeout: Duration::from_secs(600),
            stage_timeout: Duration::from_secs(600),
            addon_health_checks: true,
            addon_settle_time: Duration::from_secs(15),
            drift_watches: true,
            shard: cso_api::shard::Shard::Default,
            shard_grace: Duration::from_secs(120),
            lease_namespace: None,
        }
    }
}

/// A workload object that drifted, as its Cluster's drift watch told, and when it told: the throttle reads
/// notifications later, and one read after a correction may be of drift told before it, which that
/// correction put back.
#[derive(Clone, Debug)]
pub(crate) struct DriftTold {
    pub(crate) namespace: String,
    pub(crate) cluster: String,
    pub(crate) object: cso_apply::ObjectKey,
    pub(crate) at: std::time::Instant,
}

/// The parts every reconciler shares (nothing of one controller alone).
pub struct Context {
    pub(crate) client: Client,
    pub(crate) releases: Arc<ReleaseCache>,
    pub(crate) renderer: Arc<dyn ChartRenderer>,
    /// Applies to the management cluster.
    pub(crate) engine: ApplyEngine,
    pub(crate) discovery: Arc<ClusterDiscovery>,
    /// Clients (and apply engines and drift watches) of workload clusters.
    pub(crate) workloads: WorkloadClients,
    /// Each workload object that drifted, as its Cluster's drift watches tell; taken by the ClusterAddon
    /// controller's throttle ([`crate::run`]).
    pub(crate) drifted: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<DriftTold>>>,
    /// Renders values templates over the Cluster.
    pub(crate) values: Arc<ValuesTemplater>,
    pub(crate) metrics: Arc<crate::Metrics>,
    pub(crate) settings: Settings,
    /// The version Clusters are read, listed and watched in (`cso_apply::cluster_resource`).
    pub(crate) cluster_resource: ApiResource,
    /// The versions our last writes made (see [`crate::stores`]).
    pub(crate) written: crate::stores::Written,
    /// The watch caches, once the controllers run ([`crate::run`]); a context used without them reads
    /// from the API server.
    stores: std::sync::OnceLock<crate::stores::Stores>,
    recorder: crate::recorder::Recorder,
    backoff: Backoff,
    in_flight: InFlight,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("releases", &self.releases)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// The context of `operator`'s parts.
    pub(crate) fn assemble(operator: Operator) -> std::io::Result<Self> {
        let Operator {
            client,
            releases,
            renderer,
            values,
            metrics,
            take_over_from,
            settings,
            cluster_resource,
        } = operator;
        let discovery = Arc::new(ClusterDiscovery::new(client.clone()));
        let engine = ApplyEngine::for_management(discovery.clone()).taking_over_from(take_over_from.clone());
        let (drift_sender, drifted) = tokio::sync::mpsc::unbounded_channel();
        let mut workloads =
            WorkloadClients::new(client.clone(), WORKLOAD_CONNECT_TIMEOUT, WORKLOAD_REQUEST_TIMEOUT)?
                .taking_over_from(take_over_from)
                .with_limits(settings.client_limits);
        if settings.drift_watches {
            workloads = workloads.watching_drift(Arc::new(
                move |namespace: &str, cluster: &str, object: &cso_apply::ObjectKey| {
                    let _ = drift_sender.send(DriftTold {
                        namespace: namespace.to_owned(),
                        cluster: cluster.to_owned(),
                        object: object.clone(),
                        at: std::time::Instant::now(),
                    });
                },
            ));
        }
        metrics.watch_cache(releases.clone());
        let renderer: Arc<dyn ChartRenderer> = Arc::new(MeteredRenderer::new(renderer, metrics.clone()));
        let ctx = Context {
            recorder: crate::recorder::Recorder::new(
                client.clone(),
                EVENT_REPORTER,
                std::env::var("POD_NAME").ok(),
            ),
            client,
            releases,
            renderer,
            engine,
            discovery,
            workloads,
            drifted: Mutex::new(Some(drifted)),
            values,
            metrics,
            settings,
            cluster_resource,
            written: Default::default(),
            stores: Default::default(),
            backoff: Backoff::default(),
            in_flight: InFlight::default(),
        };
        Ok(ctx)
    }

    /// The watch caches, when the controllers run.
    pub(crate) fn stores(&self) -> Option<&crate::stores::Stores> {
        self.stores.get()
    }

    /// Hands the context the watch caches (once; [`crate::run`] does).
    pub(crate) fn use_stores(&self, stores: crate::stores::Stores) {
        let _ = self.stores.set(stores);
    }

    /// ClusterStackRelease `name` in `namespace`: from the watch cache when the controllers run (a release
    /// that appears triggers what waits for it), else read.
    pub(crate) async fn cluster_stack_release(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<std::sync::Arc<cso_api::ClusterStackRelease>>, crate::Error> {
        if let Some(store) = self.stores().and_then(|s| s.releases()) {
            return Ok(store.get(&kube::runtime::reflector::ObjectRef::new(name).within(namespace)));
        }
        Api::<cso_api::ClusterStackRelease>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map(|found| found.map(std::sync::Arc::new))
            .map_err(|e| crate::Error::kube(format!("read ClusterStackRelease {name}"), e))
    }

    /// The Clusters in `namespace` (in every namespace with `None`), in the version they are read in.
    pub(crate) fn clusters(&self, namespace: Option<&str>) -> Api<Cluster> {
        match namespace {
            Some(namespace) => Api::namespaced_with(self.client.clone(), namespace, &self.cluster_resource),
            None => Api::all_with(self.client.clone(), &self.cluster_resource),
        }
    }

    /// Runs `reconcile` of `object` for `controller`: recorded in the metrics, and stopped after the reconcile
    /// timeout with an error (retried with backoff) and a `ReconcileTimedOut` event. A reconcile cut short is
    /// redone from the object's state, like one cut short by a stop. Success forgets the object's failures.
    pub(crate) async fn bounded<K, Reconcile, Running>(
        controller: &str,
        object: Arc<K>,
        ctx: Arc<Context>,
        reconcile: Reconcile,
    ) -> Result<Action, crate::Error>
    where
        K: Subject,
        Reconcile: FnOnce(Arc<K>, Arc<Context>) -> Running,
        Running: Future<Output = Result<Action, crate::Error>>,
    {
        let limit = ctx.settings.reconcile_timeout;
        let key = object_key(object.as_ref());
        let _running_now = ctx.in_flight.enter(&key);

        let running = reconcile(object.clone(), ctx.clone());
        let bounded = async {
            match tokio::time::timeout(limit, running).await {
                Ok(result) => result,
                Err(_) => Err(crate::Error::TimedOut(limit)),
            }
        };
        let result = ctx.metrics.reconcile(controller, bounded).await;
        if result.is_ok() {
            ctx.backoff.reset(&key);
        }
        if let Err(error @ crate::Error::TimedOut(_)) = &result {
            tracing::error!(object = %key, %error, "a reconcile timed out");
            ctx.event(
                object.as_ref(),
                Kind::Warning,
                cso_api::names::event::RECONCILE_TIMED_OUT,
                error.to_string(),
            )
            .await;
        }
        result
    }

    /// The objects whose reconcile is running now (`Kind/namespace/name`), sorted.
    pub(crate) fn reconciling(&self) -> Vec<String> {
        self.in_flight.keys()
    }

    /// Publishes an event about `object`. A failure to publish is logged, never fatal.
    pub(crate) async fn event<K>(&self, object: &K, kind: Kind, reason: &str, note: impl Into<String>)
    where
        K: Subject,
    {
        let published = self
            .recorder
            .publish(&object.reference(self), kind, reason, &note.into())
            .await;
        if let Err(e) = published {
            tracing::warn!(object = %object.name_any(), reason, error = %e, "failed to publish an event");
        }
    }

    /// Publishes the events a reconcile decided on, in order.
    pub(crate) async fn publish<K>(&self, object: &K, events: crate::events::Events)
    where
        K: Subject,
    {
        for pending in events.0 {
            self.event(object, pending.kind, pending.reason, pending.note)
                .await;
        }
    }

    /// Publishes a `DriftCorrected` event on `object` when `report` put back objects someone had deleted or
    /// changed in the `target` cluster.
    pub(crate) async fn report_drift<K>(&self, object: &K, target: TargetCluster, report: &ApplyReport)
    where
        K: Subject,
    {
        if report.drift_corrected.is_empty() {
            return;
        }
        let objects: Vec<String> = report.drift_corrected.iter().map(ToString::to_string).collect();
        tracing::info!(object = %object.name_any(), target = target.as_str(), objects = ?objects,
            "re-applied objects that had been changed or deleted");
        let place = if target == TargetCluster::Workload {
            " in the workload cluster"
        } else {
            ""
        };
        self.event(
            object,
            Kind::Normal,
            cso_api::names::event::DRIFT_CORRECTED,
            format!("re-applied {}{place}", objects.join(", ")),
        )
        .await;
    }

    /// The delay before retrying `key` after its `n`-th failure in a row: 5 s doubling up to 5 minutes.
    pub(crate) fn retry_delay(&self, key: &str) -> Duration {
        self.backoff.next(key)
    }
}

/// One controller's context: the shared [`Context`] (reached through `Deref`) and what only that controller
/// keeps across its reconciles (`own`: the ClusterAddon's resync clock, the ClusterStackRelease's provider
/// watches, the once-per-problem memory of the controllers that tell Clusters about problems).
#[derive(Debug)]
pub struct ControllerContext<S> {
    shared: Arc<Context>,
    pub(crate) own: S,
}

impl<S> ControllerContext<S> {
    pub(crate) fn with(shared: Arc<Context>, own: S) -> Arc<Self> {
        Arc::new(ControllerContext { shared, own })
    }

    /// Runs `reconcile` of `object` for `controller` through [`Context::bounded`] (metrics, timeout, backoff
    /// reset), handing it this context.
    pub(crate) async fn bounded<K, Reconcile, Running>(
        self: Arc<Self>,
        controller: &str,
        object: Arc<K>,
        reconcile: Reconcile,
    ) -> Result<Action, crate::Error>
    where
        K: Subject,
        Reconcile: FnOnce(Arc<K>, Arc<Self>) -> Running,
        Running: Future<Output = Result<Action, crate::Error>>,
    {
        let shared = self.shared.clone();
        Context::bounded(controller, object, shared, move |object, _| {
            reconcile(object, self)
        })
        .await
    }
}

impl<S: Default> ControllerContext<S> {
    /// The context of a controller whose own state starts empty.
    pub fn new(shared: Arc<Context>) -> Arc<Self> {
        Self::with(shared, S::default())
    }
}

impl<S> std::ops::Deref for ControllerContext<S> {
    type Target = Context;

    fn deref(&self) -> &Context {
        &self.shared
    }
}

/// Exponential per-object backoff, so that a broken object neither loops hot nor waits long once fixed.
#[derive(Debug, Default)]
struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

const BACKOFF_BASE: Duration = Duration::from_secs(5);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

impl Backoff {
    fn next(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = failures.entry(key.to_owned()).or_default();
        let delay = BACKOFF_BASE.saturating_mul(1 << (*n).min(10)).min(BACKOFF_MAX);
        *n = n.saturating_add(1);
        delay
    }

    fn reset(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

/// The reconciles running now, each counted from its start until its future completes or is dropped.
#[derive(Debug, Default)]
struct InFlight {
    running: Arc<Mutex<HashMap<String, usize>>>,
}

/// Counts one running reconcile until dropped.
struct Running {
    running: Arc<Mutex<HashMap<String, usize>>>,
    key: String,
}

impl InFlight {
    fn enter(&self, key: &str) -> Running {
        *self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.to_owned())
            .or_default() += 1;
        Running {
            running: self.running.clone(),
            key: key.to_owned(),
        }
    }

    fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect();
        keys.sort();
        keys
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = running.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                running.remove(&self.key);
            }
        }
    }
}

/// An object reconciles are run for and events are published about: how it is named in events and retry
/// keys. Our kinds name their version in their type; a Cluster's is the one it is read in
/// ([`Context::cluster_resource`]), so the reference comes from the context.
pub(crate) trait Subject: Resource {
    /// The kind, e.g. `ClusterStack`.
    const KIND: &'static str;

    /// The reference to this object that events name.
    fn reference(&self, ctx: &Context) -> ObjectReference;
}

/// [`Subject`] for kinds whose type names their version.
macro_rules! typed_subject {
    ($($kind:ty),*) => {$(
        impl Subject for $kind {
            const KIND: &'static str = stringify!($kind);

            fn reference(&self, _: &Context) -> ObjectReference {
                self.object_ref(&())
            }
        }
    )*};
}

typed_subject!(
    ClusterStack,
    ClusterStackRelease,
    ClusterAddon,
    ClusterStackRollout
);

impl Subject for Cluster {
    const KIND: &'static str = "Cluster";

    fn reference(&self, ctx: &Context) -> ObjectReference {
        self.object_ref(&ctx.cluster_resource)
    }
}

/// The backoff key of an object.
pub(crate) fn object_key<K: Subject>(object: &K) -> String {
    format!(
        "{}/{}/{}",
        K::KIND,
        object.meta().namespace.as_deref().unwrap_or_default(),
        object.meta().name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_keyed_by_their_kind() {
        assert_eq!(ClusterStack::KIND, ClusterStack::kind(&()));
        assert_eq!(ClusterStackRelease::KIND, ClusterStackRelease::kind(&()));
        assert_eq!(ClusterAddon::KIND, ClusterAddon::kind(&()));
        for version in cso_api::capi::CLUSTER_VERSIONS {
            assert_eq!(Cluster::KIND, Cluster::kind(&Cluster::resource(version)));
        }
    }

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let backoff = Backoff::default();
        let delays: Vec<u64> = (0..9).map(|_| backoff.next("a").as_secs()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
        assert_eq!(backoff.next("b").as_secs(), 5, "keys are independent");
        backoff.reset("a");
        assert_eq!(backoff.next("a").as_secs(), 5);
    }

    #[test]
    fn in_flight_counts_until_dropped() {
        let in_flight = InFlight::default();
        let first = in_flight.enter("ClusterAddon/ns/b");
        let second = in_flight.enter("ClusterAddon/ns/b");
        let other = in_flight.enter("ClusterAddon/ns/a");
        assert_eq!(in_flight.keys(), ["ClusterAddon/ns/a", "ClusterAddon/ns/b"]);
        drop(first);
        assert_eq!(
            in_flight.keys(),
            ["ClusterAddon/ns/a", "ClusterAddon/ns/b"],
            "b still runs once"
        );
        drop(second);
        drop(other);
        assert!(in_flight.keys().is_empty());
    }

    #[tokio::test]
    async fn a_dropped_reconcile_leaves_the_in_flight_set() {
        let in_flight = Arc::new(InFlight::default());
        let hanging = {
            let in_flight = in_flight.clone();
            async move {
                let _running = in_flight.enter("ClusterStackRelease/ns/r");
                std::future::pending::<()>().await;
            }
        };
        let timed_out = tokio::time::timeout(Duration::from_millis(10), hanging).await;
        assert!(timed_out.is_err());
        assert!(in_flight.keys().is_empty(), "{:?}", in_flight.keys());
    }
}
