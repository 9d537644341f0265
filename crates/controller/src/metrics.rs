//! Prometheus metrics: controller-runtime's reconcile metrics (same names and labels, so dashboards made for
//! the Go operator work) and the operator's own: objects applied, pruned and put back, render and apply
//! durations per target cluster; requests to the release source and its rate-limit budget; the signature and
//! pin checks of downloads (`cso_release_verifications`); releases cached;
//! Clusters per release and state (`cso_clusters`, counted from the ClusterAddon watch at scrape time), those
//! whose addons do not run (`cso_addons_not_running`, the same way) and the
//! writes of those counts into the statuses (`cso_fleet_status_writes`); the False conditions of ClusterAddons
//! and ClusterStackReleases and the hook runs in progress ([`conditions`], the same way); and
//! the waves of ClusterStackRollouts and their pauses (`cso_rollout_clusters`, `cso_rollout_paused`, the
//! same way) and their moves; leader election (client-go's `leader_election_master_status`, plus failed renewals); the process's own
//! memory, CPU and file descriptors under Prometheus' `process_*` names, and the renderer processes' memory
//! ([`process`], read from `/proc` at scrape time).
//! [`MeteredSource`] and [`MeteredRenderer`] record around the real source and renderer.

use std::{
    future::Future,
    path::Path,
    sync::{Arc, Mutex, OnceLock},
    time::Instant,
};

use cso_api::{ClusterAddon, ClusterStackRelease, fleet::AddonState};
use cso_apply::ApplyReport;
use cso_release::{ReleaseCache, ReleaseSource, SourceError, source::Provenance};
use cso_render::{ChartRenderer, RenderError, RenderRequest};
use futures::{FutureExt, future::BoxFuture};
use kube::runtime::{controller::Action, reflector};
use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, text::encode},
    metrics::{MetricType, counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::Error;

pub mod conditions;
pub mod process;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    controller: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

/// The cluster an apply or render is for; the `target` label of the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetCluster {
    Management,
    Workload,
}

impl TargetCluster {
    pub fn as_str(self) -> &'static str {
        match self {
            TargetCluster::Management => "management",
            TargetCluster::Workload => "workload",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    /// `management` or `workload`.
    target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    /// `github`, `oci` or `local`.
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LeaseLabels {
    /// The lease's name.
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookLabels {
    /// The lifecycle hook, as Cluster API names it (`BeforeClusterUpgrade`, ...).
    hook: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookResultLabels {
    hook: String,
    /// `success`, `retry` (a blocking hook holds the Cluster) or `failure`.
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KubeRequestLabels {
    /// The Kubernetes verb: `get`, `list`, `watch`, `create`, `patch`, ...
    verb: String,
    /// The resource (`clusteraddons`, `clusteraddons/status`, `secrets`, ...).
    resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceRequestLabels {
    source: String,
    /// `list` or `download`.
    operation: String,
    /// `success`, `rate_limited` or `error`.
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShardLabels {
    shard: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VerificationLabels {
    source: String,
    /// `bundle-v0.3` or `legacy-sig` for a verified release; empty for a refused one.
    layout: String,
    /// `verified` (a signature, and the pin if any), `pinned` (at its pin, no signature checked), or the
    /// refusal: `unsigned`, `signature_mismatch`, `invalid_signature`, `tag_moved`, `error`.
    outcome: String,
}

/// The operator's metrics, shared by all controllers.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    reconciles: Family<ReconcileLabels, Counter>,
    errors: Family<ControllerLabels, Counter>,
    durations: Family<ControllerLabels, Histogram>,
    applied: Family<TargetLabels, Counter>,
    pruned: Family<TargetLabels, Counter>,
    drift_corrected: Family<TargetLabels, Counter>,
    drift_fights: Gauge,
    render_durations: Family<TargetLabels, Histogram>,
    apply_durations: Family<TargetLabels, Histogram>,
    source_requests: Family<SourceRequestLabels, Counter>,
    release_verifications: Family<VerificationLabels, Counter>,
    rate_limit_remaining: Family<SourceLabels, Gauge>,
    releases_cached: Gauge,
    leader: Family<LeaseLabels, Gauge>,
    renewal_failures: Family<LeaseLabels, Counter>,
    hook_requests: Family<HookResultLabels, Counter>,
    hook_durations: Family<HookLabels, Histogram>,
    kube_requests: Family<KubeRequestLabels, Counter>,
    /// The release cache whose size `releases_cached` shows, read at scrape time.
    cache: OnceLock<Arc<ReleaseCache>>,
    clusters: Family<FleetLabels, Gauge>,
    not_running: Family<NotRunningLabels, Gauge>,
    unattended: Family<ShardLabels, Gauge>,
    /// Clusters this replica's shard handles, counted from its Cluster watch at scrape time.
    shard_clusters: Family<ShardLabels, Gauge>,
    shard_store: OnceLock<(reflector::Store<cso_api::capi::Cluster>, cso_api::shard::Shard)>,
    /// Every Cluster (no watch filter, the default shard): the fleet gauges count Clusters, not ClusterAddons
    /// ([`cso_api::fleet`]). Unset: each ClusterAddon counts alone.
    fleet_clusters: OnceLock<crate::stores::Listed<cso_api::capi::Cluster>>,
    /// The ClusterAddons whose counts `clusters` shows ([`cso_api::fleet`]), read at scrape time.
    addons: OnceLock<reflector::Store<ClusterAddon>>,
    fleet_status_writes: Family<KindLabels, Counter>,
    /// The ClusterStackReleases whose False conditions `condition_false` counts, read at scrape time.
    releases: OnceLock<reflector::Store<ClusterStackRelease>>,
    condition_false: Family<ConditionLabels, Gauge>,
    hooks_in_progress: Family<HookLabels, Gauge>,
    /// The ClusterStackRollouts whose Clusters `rollout_clusters` and `rollout_paused` show, read at scrape time.
    rollouts: OnceLock<reflector::Store<cso_api::ClusterStackRollout>>,
    rollout_clusters: Family<RolloutClusterLabels, Gauge>,
    rollout_paused: Family<RolloutLabels, Gauge>,
    rollout_moves: Family<ResultLabels, Counter>,
    /// The long-lived renderer whose processes' memory `cso_renderer_resident_memory_bytes` shows.
    renderer: Arc<OnceLock<cso_render::Engine>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    /// `ClusterStack` or `ClusterStackRelease`.
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConditionLabels {
    /// `ClusterAddon` or `ClusterStackRelease`.
    kind: String,
    /// The condition type (`ClusterReady`, `ClusterStackReleaseDownloaded`, ...).
    condition: String,
    reason: String,
    /// `Error`, `Warning`, `Info`, or empty.
    severity: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutLabels {
    /// `namespace/name` (a `namespace` label would clash with the scrape target's).
    rollout: String,
    /// Why it is paused: `WaveFailing` or `PausedBySpec`.
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RolloutClusterLabels {
    /// `namespace/name`.
    rollout: String,
    wave: String,
    /// `clusters`, `moved`, `done`, `failing` or `skipped` (the wave's counts).
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    /// `moved`, `refused` or `failed`.
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NotRunningLabels {
    stack: String,
    release: String,
    /// The `AddonsHealthy` reason.
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FleetLabels {
    /// `docker-ferrol-1-27`; empty for Clusters on no release yet.
    stack: String,
    /// The release tag; empty for Clusters on no release yet.
    release: String,
    /// `ready`, `progressing` or `failing`.
    state: String,
}

fn reconcile_buckets() -> Histogram {
    // controller-runtime's buckets: 5 ms to about 40 s.
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
        1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0,
        40.0, 50.0, 60.0,
    ])
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Described(Registry::default());
        let metrics = Metrics {
            registry: Mutex::default(),
            reconciles: Family::default(),
            errors: Family::default(),
            durations: Family::new_with_constructor(reconcile_buckets),
            applied: Family::default(),
            pruned: Family::default(),
            drift_corrected: Family::default(),
            drift_fights: Gauge::default(),
            render_durations: Family::new_with_constructor(reconcile_buckets),
            apply_durations: Family::new_with_constructor(reconcile_buckets),
            source_requests: Family::default(),
            release_verifications: Family::default(),
            rate_limit_remaining: Family::default(),
            releases_cached: Gauge::default(),
            leader: Family::default(),
            renewal_failures: Family::default(),
            hook_requests: Family::default(),
            hook_durations: Family::new_with_constructor(reconcile_buckets),
            kube_requests: Family::default(),
            cache: OnceLock::new(),
            clusters: Family::default(),
            not_running: Family::default(),
            unattended: Family::default(),
            shard_clusters: Family::default(),
            shard_store: OnceLock::new(),
            fleet_clusters: OnceLock::new(),
            addons: OnceLock::new(),
            fleet_status_writes: Family::default(),
            releases: OnceLock::new(),
            condition_false: Family::default(),
            hooks_in_progress: Family::default(),
            rollouts: OnceLock::new(),
            rollout_clusters: Family::default(),
            rollout_paused: Family::default(),
            rollout_moves: Family::default(),
            renderer: Arc::default(),
        };
        registry.0.register_collector(Box::new(process::ProcessCollector {
            renderer: metrics.renderer.clone(),
        }));
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            metrics.reconciles.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            metrics.errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            metrics.durations.clone(),
        );
        registry.register(
            "cso_objects_applied",
            "Objects server-side applied, per target cluster",
            metrics.applied.clone(),
        );
        registry.register(
            "cso_objects_pruned",
            "Objects deleted because a release no longer has them, per target cluster",
            metrics.pruned.clone(),
        );
        registry.register(
            "cso_objects_drift_corrected",
            "Objects put back after someone deleted or changed them, per target cluster",
            metrics.drift_corrected.clone(),
        );
        registry.register(
            "cso_drift_fights",
            "Workload objects in a drift fight: put back again and again, each soon after the last, now with back-off",
            metrics.drift_fights.clone(),
        );
        registry.register(
            "cso_render_duration_seconds",
            "Length of time per chart render (helm template, or a cache hit), per target cluster",
            metrics.render_durations.clone(),
        );
        registry.register(
            "cso_apply_duration_seconds",
            "Length of time per apply of a render (with pruning), per target cluster",
            metrics.apply_durations.clone(),
        );
        registry.register(
            "cso_source_requests",
            "Requests to the release source, per operation and result",
            metrics.source_requests.clone(),
        );
        registry.register(
            "cso_release_verifications",
            "Signature and digest-pin checks of downloaded releases, per layout and outcome (verified, pinned or the refusal)",
            metrics.release_verifications.clone(),
        );
        registry.register(
            "cso_source_rate_limit_remaining",
            "Requests left in the release source's rate-limit window, as it last said",
            metrics.rate_limit_remaining.clone(),
        );
        registry.register(
            "cso_clusters",
            "Clusters per release their addons are on, by state (ready, progressing, failing)",
            metrics.clusters.clone(),
        );
        registry.register(
            "cso_shard_clusters",
            "Clusters whose addons this replica's shard handles (labelled for it; the default shard: unlabelled)",
            metrics.shard_clusters.clone(),
        );
        registry.register(
            "cso_unattended_clusters",
            "Clusters labelled for a shard that no replica has reconciled for --shard-grace (default shard only)",
            metrics.unattended.clone(),
        );
        registry.register(
            "cso_addons_not_running",
            "Clusters whose applied addons do not run, per release and AddonsHealthy reason (WaitingForHealth, \
             NotHealthyInTime, Degraded)",
            metrics.not_running.clone(),
        );
        registry.register(
            "cso_condition_false",
            "ClusterAddons and ClusterStackReleases whose condition is False, per kind, condition, reason and \
             severity (default shard only)",
            metrics.condition_false.clone(),
        );
        registry.register(
            "cso_hooks_in_progress",
            "ClusterAddons whose spec.hook names a lifecycle hook still running (a blocking hook holds its \
             Cluster meanwhile), per hook (default shard only)",
            metrics.hooks_in_progress.clone(),
        );
        registry.register(
            "cso_rollout_clusters",
            "Clusters of each wave of each ClusterStackRollout, by state: clusters (in the wave), moved, done, \
             failing (not done within waveTimeout), skipped (refused by the preflight or moved elsewhere)",
            metrics.rollout_clusters.clone(),
        );
        registry.register(
            "cso_rollout_paused",
            "ClusterStackRollouts that are paused (1), by reason: WaveFailing (a moved Cluster not done in time) or \
             PausedBySpec",
            metrics.rollout_paused.clone(),
        );
        registry.register(
            "cso_rollout_moves",
            "Moves of Clusters by ClusterStackRollouts, by result: moved, refused (by the preflight) or failed (tried \
             again)",
            metrics.rollout_moves.clone(),
        );
        registry.register(
            "cso_fleet_status_writes",
            "Writes of the Cluster counts into the status of ClusterStacks and ClusterStackReleases, per kind",
            metrics.fleet_status_writes.clone(),
        );
        registry.register(
            "cso_releases_cached",
            "Releases in the local release cache",
            metrics.releases_cached.clone(),
        );
        registry.register(
            "leader_election_master_status",
            "Whether this replica holds the lease: 1 leads, 0 stands by",
            metrics.leader.clone(),
        );
        registry.register(
            "cso_leader_election_renewal_failures",
            "Failed attempts to renew the held lease (retried until shortly before it expires)",
            metrics.renewal_failures.clone(),
        );
        registry.register(
            "cso_hook_requests",
            "Lifecycle hook calls from Cluster API answered, per hook and result",
            metrics.hook_requests.clone(),
        );
        registry.register(
            "cso_hook_duration_seconds",
            "Length of time to answer a lifecycle hook call, per hook",
            metrics.hook_durations.clone(),
        );
        registry.register(
            "cso_kube_requests",
            "Requests to the management cluster's API server, per verb and resource",
            metrics.kube_requests.clone(),
        );
        *metrics.registry.lock().unwrap_or_else(|p| p.into_inner()) = registry.0;
        metrics
    }
}

/// A registry whose families write their `# HELP` and `# TYPE` lines always, even before their first sample
/// (prometheus-client leaves out a family without samples, as Go's client does): every name the operator
/// exports is on /metrics from the start, so alert rules and dashboards can be checked against it.
struct Described(Registry);

impl Described {
    fn register(
        &mut self,
        name: &str,
        help: &str,
        metric: impl EncodeMetric + Send + Sync + std::fmt::Debug + 'static,
    ) {
        self.0.register(name, help, AlwaysDescribed(metric));
    }
}

/// A metric that counts as never empty for the encoder, so its descriptor is written without samples.
#[derive(Debug)]
struct AlwaysDescribed<M>(M);

impl<M: EncodeMetric> EncodeMetric for AlwaysDescribed<M> {
    fn encode(&self, encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

impl Metrics {
    /// Counts the management client's requests (`cso_kube_requests_total{verb, resource}`): give it to
    /// `cso_apply::observed_client`.
    pub fn kube_request_observer(&self) -> cso_apply::RequestObserver {
        let family = self.kube_requests.clone();
        Arc::new(move |kind: &cso_apply::RequestKind| {
            family
                .get_or_create(&KubeRequestLabels {
                    verb: kind.verb.to_owned(),
                    resource: kind.resource.clone(),
                })
                .inc();
        })
    }

    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        if let Some(cache) = self.cache.get() {
            self.releases_cached.set(cache.cached_tags().len() as i64);
        }
        if let Some((clusters, shard)) = self.shard_store.get() {
            let own = clusters
                .state()
                .iter()
                .filter(|c| shard.owns(kube::Resource::meta(c.as_ref()).labels.as_ref()))
                .count();
            self.shard_clusters
                .get_or_create(&ShardLabels {
                    shard: shard.name().to_owned(),
                })
                .set(i64::try_from(own).unwrap_or(i64::MAX));
        }
        if let Some(addons) = self.addons.get() {
            let addons = addons.state();
            let seen = self.clusters_seen(&addons);
            let members = || {
                addons
                    .iter()
                    .zip(&seen)
                    .map(|(addon, cluster)| cso_api::fleet::Member { addon, cluster })
            };
            // Releases no Cluster is on any more leave the gauge.
            self.clusters.clear();
            for counts in cso_api::fleet::fleet(members()) {
                for state in AddonState::ALL {
                    let labels = FleetLabels {
                        stack: counts.stack.clone(),
                        release: counts.release.clone(),
                        state: state.as_str().to_owned(),
                    };
                    #[allow(clippy::cast_possible_wrap, reason = "a count of Clusters")]
                    self.clusters
                        .get_or_create(&labels)
                        .set(counts.in_state(state) as i64);
                }
            }
            self.not_running.clear();
            let not_running = cso_api::fleet::not_running(members());
            for ((stack, release, reason), count) in not_running {
                #[allow(clippy::cast_possible_wrap, reason = "a count of Clusters")]
                self.not_running
                    .get_or_create(&NotRunningLabels {
                        stack,
                        release,
                        reason,
                    })
                    .set(count as i64);
            }
        }
        self.count_conditions();
        self.count_rollouts();
        let mut text = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &registry);
        text
    }

    /// Counts the rollouts of `store` at every scrape (`cso_rollout_clusters`, `cso_rollout_paused`).
    pub(crate) fn watch_rollouts(&self, store: reflector::Store<cso_api::ClusterStackRollout>) {
        let _ = self.rollouts.set(store);
    }

    /// Records a move of a ClusterStackRollout: `moved`, `refused` or `failed`.
    pub(crate) fn rollout_move(&self, result: &str) {
        self.rollout_moves
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    /// Sets `cso_rollout_clusters` and `cso_rollout_paused` from the watched rollouts' statuses.
    fn count_rollouts(&self) {
        let Some(store) = self.rollouts.get() else {
            return;
        };
        self.rollout_clusters.clear();
        self.rollout_paused.clear();
        for rollout in store.state() {
            let Some(status) = &rollout.status else {
                continue;
            };
            let name = format!(
                "{}/{}",
                rollout.metadata.namespace.as_deref().unwrap_or_default(),
                rollout.metadata.name.as_deref().unwrap_or_default()
            );
            for wave in &status.waves {
                for (state, count) in [
                    ("clusters", wave.clusters),
                    ("moved", wave.moved),
                    ("done", wave.done),
                    ("failing", wave.failing),
                    ("skipped", wave.skipped),
                ] {
                    self.rollout_clusters
                        .get_or_create(&RolloutClusterLabels {
                            rollout: name.clone(),
                            wave: wave.name.clone(),
                            state: state.to_owned(),
                        })
                        .set(i64::from(count));
                }
            }
            if status.phase == cso_api::cluster_stack_rollout::phase::PAUSED {
                use cso_api::conditions::ConditionsExt;
                let reason = if status.is_condition_false(cso_api::names::condition::CLUSTERS_HEALTHY) {
                    cso_api::names::reason::WAVE_FAILING
                } else {
                    cso_api::names::reason::PAUSED_BY_SPEC
                };
                self.rollout_paused
                    .get_or_create(&RolloutLabels {
                        rollout: name,
                        reason: reason.to_owned(),
                    })
                    .set(1);
            }
        }
    }

    /// Sets `cso_condition_false` and `cso_hooks_in_progress` from the watched objects (when watched).
    fn count_conditions(&self) {
        if self.addons.get().is_none() && self.releases.get().is_none() {
            return;
        }
        let addons = self.addons.get().map(reflector::Store::state).unwrap_or_default();
        let releases = self
            .releases
            .get()
            .map(reflector::Store::state)
            .unwrap_or_default();
        let kinds = [
            (
                "ClusterAddon",
                conditions::false_conditions(addons.iter().map(|a| {
                    a.status
                        .as_ref()
                        .map(|s| s.conditions.as_slice())
                        .unwrap_or_default()
                })),
            ),
            (
                "ClusterStackRelease",
                conditions::false_conditions(releases.iter().map(|r| {
                    r.status
                        .as_ref()
                        .map(|s| s.conditions.as_slice())
                        .unwrap_or_default()
                })),
            ),
        ];
        // Conditions no object has False any more leave the gauge.
        self.condition_false.clear();
        for (kind, counts) in kinds {
            for ((condition, reason, severity), count) in counts {
                self.condition_false
                    .get_or_create(&ConditionLabels {
                        kind: kind.to_owned(),
                        condition,
                        reason,
                        severity,
                    })
                    .set(i64::try_from(count).unwrap_or(i64::MAX));
            }
        }
        self.hooks_in_progress.clear();
        for (hook, count) in conditions::hooks_in_progress(addons.iter().map(AsRef::as_ref)) {
            self.hooks_in_progress
                .get_or_create(&HookLabels { hook })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// Runs one reconcile of `controller` and records it.
    pub(crate) async fn reconcile(
        &self,
        controller: &str,
        reconcile: impl Future<Output = Result<Action, Error>>,
    ) -> Result<Action, Error> {
        let started = Instant::now();
        let result = reconcile.await;
        let controller_label = ControllerLabels {
            controller: controller.to_owned(),
        };
        self.durations
            .get_or_create(&controller_label)
            .observe(started.elapsed().as_secs_f64());
        let outcome = if result.is_ok() { "success" } else { "error" };
        self.reconciles
            .get_or_create(&ReconcileLabels {
                controller: controller.to_owned(),
                result: outcome.to_owned(),
            })
            .inc();
        if result.is_err() {
            self.errors.get_or_create(&controller_label).inc();
        }
        result
    }

    /// Records what an apply did on `target` (`management` or `workload`).
    pub(crate) fn applied(&self, target: TargetCluster, report: &ApplyReport) {
        let labels = TargetLabels {
            target: target.as_str().to_owned(),
        };
        self.applied
            .get_or_create(&labels)
            .inc_by(report.applied.saturating_sub(report.unchanged) as u64);
        self.pruned
            .get_or_create(&labels)
            .inc_by(report.pruned.len() as u64);
        self.drift_corrected
            .get_or_create(&labels)
            .inc_by(report.drift_corrected.len() as u64);
        self.apply_durations
            .get_or_create(&labels)
            .observe(report.duration.as_secs_f64());
    }

    /// Sets the number of workload objects in a drift fight (`cso_drift_fights`).
    pub(crate) fn drift_fights(&self, objects: usize) {
        self.drift_fights.set(i64::try_from(objects).unwrap_or(i64::MAX));
    }

    /// Counts one write of the Cluster counts into the status of an object of `kind`.
    pub(crate) fn fleet_status_written(&self, kind: &str) {
        self.fleet_status_writes
            .get_or_create(&KindLabels {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// Records whether this replica holds the lease `lease`.
    pub fn set_leading(&self, lease: &str, leading: bool) {
        self.leader
            .get_or_create(&LeaseLabels {
                name: lease.to_owned(),
            })
            .set(i64::from(leading));
    }

    /// Counts one failed renewal of the lease `lease`.
    pub fn renewal_failed(&self, lease: &str) {
        self.renewal_failures
            .get_or_create(&LeaseLabels {
                name: lease.to_owned(),
            })
            .inc();
    }

    /// Records one answered lifecycle hook call: `cso_hook_requests_total{hook, result}` and
    /// `cso_hook_duration_seconds{hook}`.
    pub fn hook_answered(&self, hook: &str, result: &str, duration: std::time::Duration) {
        self.hook_requests
            .get_or_create(&HookResultLabels {
                hook: hook.to_owned(),
                result: result.to_owned(),
            })
            .inc();
        self.hook_durations
            .get_or_create(&HookLabels {
                hook: hook.to_owned(),
            })
            .observe(duration.as_secs_f64());
    }

    /// Shows the size of `cache` as `cso_releases_cached` (the first cache given wins).
    pub fn watch_cache(&self, cache: Arc<ReleaseCache>) {
        let _ = self.cache.set(cache);
    }

    /// Shows the resident memory of `engine`'s processes as `cso_renderer_resident_memory_bytes` (the first
    /// renderer given wins; without one, with `--renderer=helm`, the metric is left out).
    pub fn watch_renderer(&self, engine: cso_render::Engine) {
        let _ = self.renderer.set(engine);
    }

    /// Counts the Clusters of `shard` in `clusters` (the watch's store) at scrape time as `cso_shard_clusters`.
    pub(crate) fn watch_shard_clusters(
        &self,
        clusters: reflector::Store<cso_api::capi::Cluster>,
        shard: cso_api::shard::Shard,
    ) {
        let _ = self.shard_store.set((clusters, shard));
    }

    /// How many Clusters of `shard` no replica reconciles (see `crate::unattended`).
    pub(crate) fn set_unattended(&self, shard: &str, clusters: usize) {
        self.unattended
            .get_or_create(&ShardLabels {
                shard: shard.to_owned(),
            })
            .set(i64::try_from(clusters).unwrap_or(i64::MAX));
    }

    /// Counts the False conditions of the ClusterStackReleases in `releases` (the watch's store) in
    /// `cso_condition_false`.
    pub(crate) fn watch_releases(&self, releases: reflector::Store<ClusterStackRelease>) {
        let _ = self.releases.set(releases);
    }

    /// What the fleet gauges know of the Cluster of each of `addons`, in order.
    fn clusters_seen(&self, addons: &[Arc<ClusterAddon>]) -> Vec<cso_api::fleet::ClusterSeen> {
        let clusters = self
            .fleet_clusters
            .get()
            .filter(|clusters| clusters.listed.now())
            .map(|clusters| clusters.store.state());
        cso_api::fleet::clusters_seen(
            addons.iter().map(AsRef::as_ref),
            clusters
                .as_ref()
                .map(|clusters| clusters.iter().map(AsRef::as_ref)),
        )
    }

    /// The Clusters the fleet gauges count (every Cluster: no watch filter, the default shard).
    pub(crate) fn watch_fleet_clusters(&self, clusters: crate::stores::Listed<cso_api::capi::Cluster>) {
        let _ = self.fleet_clusters.set(clusters);
    }

    /// Shows the counts of the ClusterAddons in `addons` (the watch's store) as `cso_clusters`.
    pub(crate) fn watch_addons(&self, addons: reflector::Store<ClusterAddon>) {
        let _ = self.addons.set(addons);
    }

    /// Counts the signature and pin checks of a download: only where something was checked (a source that
    /// verifies, or a pin), and only for the checks' own outcomes (a network failure before them is not one).
    fn release_checked(
        &self,
        source: &dyn ReleaseSource,
        pinned: bool,
        result: &Result<Provenance, SourceError>,
    ) {
        let (layout, outcome) = match result {
            Ok(provenance) if provenance.verified => {
                (provenance.layout.clone().unwrap_or_default(), "verified")
            }
            Ok(_) if pinned => (String::new(), "pinned"),
            Err(SourceError::Refused { refusal, .. }) => (String::new(), refusal.outcome()),
            _ => return,
        };
        self.release_verifications
            .get_or_create(&VerificationLabels {
                source: source.kind().to_owned(),
                layout,
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    fn source_request(&self, source: &dyn ReleaseSource, operation: &str, result: &Result<(), &SourceError>) {
        let result = match result {
            Ok(()) => "success",
            Err(SourceError::RateLimited { .. }) => "rate_limited",
            Err(_) => "error",
        };
        self.source_requests
            .get_or_create(&SourceRequestLabels {
                source: source.kind().to_owned(),
                operation: operation.to_owned(),
                result: result.to_owned(),
            })
            .inc();
        if let Some(remaining) = source.rate_limit_remaining() {
            self.rate_limit_remaining
                .get_or_create(&SourceLabels {
                    source: source.kind().to_owned(),
                })
                .set(remaining);
        }
    }
}

/// A release source whose requests are counted in [`Metrics`].
#[derive(Debug)]
pub struct MeteredSource {
    inner: Arc<dyn ReleaseSource>,
    metrics: Arc<Metrics>,
}

impl MeteredSource {
    pub fn new(inner: Arc<dyn ReleaseSource>, metrics: Arc<Metrics>) -> Self {
        MeteredSource { inner, metrics }
    }
}

impl ReleaseSource for MeteredSource {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn list_tags(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>> {
        self.inner
            .list_tags()
            .map(|result| {
                self.metrics
                    .source_request(self.inner.as_ref(), "list", &result.as_ref().map(|_| ()));
                result
            })
            .boxed()
    }

    fn download<'a>(
        &'a self,
        tag: &'a str,
        dest: &'a Path,
        pin: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Provenance, SourceError>> {
        let pinned = pin.is_some();
        self.inner
            .download(tag, dest, pin)
            .map(move |result| {
                self.metrics
                    .source_request(self.inner.as_ref(), "download", &result.as_ref().map(|_| ()));
                self.metrics.release_checked(self.inner.as_ref(), pinned, &result);
                result
            })
            .boxed()
    }

    fn accepts(&self, provenance: Option<&Provenance>) -> bool {
        self.inner.accepts(provenance)
    }

    fn verifies(&self) -> bool {
        self.inner.verifies()
    }

    fn rate_limit_remaining(&self) -> Option<i64> {
        self.inner.rate_limit_remaining()
    }
}

/// A chart renderer whose renders are timed in [`Metrics`], by target: `workload` when the request renders
/// against a workload cluster, else `management`.
#[derive(Debug)]
pub struct MeteredRenderer {
    inner: Arc<dyn ChartRenderer>,
    metrics: Arc<Metrics>,
}

impl MeteredRenderer {
    pub fn new(inner: Arc<dyn ChartRenderer>, metrics: Arc<Metrics>) -> Self {
        MeteredRenderer { inner, metrics }
    }
}

impl ChartRenderer for MeteredRenderer {
    fn render(&self, request: RenderRequest) -> BoxFuture<'_, Result<String, RenderError>> {
        let target = if request.target_kubeconfig.is_some() {
            TargetCluster::Workload
        } else {
            TargetCluster::Management
        };
        let started = Instant::now();
        self.inner
            .render(request)
            .map(move |result| {
                self.metrics
                    .render_durations
                    .get_or_create(&TargetLabels {
                        target: target.as_str().to_owned(),
                    })
                    .observe(started.elapsed().as_secs_f64());
                result
            })
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addon(name: &str, class: &str, ready: bool) -> ClusterAddon {
        let mut addon = ClusterAddon::new(
            name,
            cso_api::cluster_addon::ClusterAddonSpec {
                cluster_stack: class.into(),
                ..Default::default()
            },
        );
        addon.metadata.namespace = Some("fleet".into());
        addon.status = Some(cso_api::cluster_addon::ClusterAddonStatus {
            ready,
            ..Default::default()
        });
        addon
    }

    /// `cso_clusters` counts the ClusterAddons of the watch's store when scraped: a release no Cluster is on
    /// any more leaves the gauge.
    #[test]
    fn clusters_are_counted_per_release_and_state_at_scrape_time() {
        use cso_api::conditions::{ConditionsExt, Severity};
        let mut writer = reflector::store::Writer::<ClusterAddon>::default();
        let metrics = Metrics::default();
        metrics.watch_addons(writer.as_reader());
        let mut failing = addon("c", "docker-ferrol-1-27-v2", false);
        failing.mark_false(
            "HelmChartApplied",
            "FailedToApplyObjects",
            Severity::Warning,
            "denied",
        );
        failing.mark_false(
            "AddonsHealthy",
            "NotHealthyInTime",
            Severity::Warning,
            "Deployment kube-system/web: 0 of 1 replicas available",
        );
        for object in [
            addon("a", "docker-ferrol-1-27-v1", true),
            addon("b", "docker-ferrol-1-27-v2", true),
            failing,
        ] {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(object));
        }
        let text = metrics.encode();
        for line in [
            r#"cso_clusters{stack="docker-ferrol-1-27",release="docker-ferrol-1-27-v1",state="ready"} 1"#,
            r#"cso_clusters{stack="docker-ferrol-1-27",release="docker-ferrol-1-27-v1",state="failing"} 0"#,
            r#"cso_clusters{stack="docker-ferrol-1-27",release="docker-ferrol-1-27-v2",state="ready"} 1"#,
            r#"cso_clusters{stack="docker-ferrol-1-27",release="docker-ferrol-1-27-v2",state="failing"} 1"#,
            r#"cso_addons_not_running{stack="docker-ferrol-1-27",release="docker-ferrol-1-27-v2",reason="NotHealthyInTime"} 1"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }

        writer.apply_watcher_event(&kube::runtime::watcher::Event::Delete(addon(
            "a",
            "docker-ferrol-1-27-v1",
            true,
        )));
        let text = metrics.encode();
        assert!(!text.contains(r#"release="docker-ferrol-1-27-v1""#), "{text}");
    }

    /// Every family is described from the start, before its first sample, so rules and dashboards can be
    /// checked against the names; a family without samples has no sample lines.
    #[test]
    fn every_family_is_described_before_its_first_sample() {
        let text = Metrics::default().encode();
        for (name, kind) in [
            ("cso_clusters", "gauge"),
            ("cso_addons_not_running", "gauge"),
            ("cso_condition_false", "gauge"),
            ("cso_hooks_in_progress", "gauge"),
            ("cso_unattended_clusters", "gauge"),
            ("cso_hook_requests", "counter"),
            ("cso_hook_duration_seconds", "histogram"),
            ("controller_runtime_reconcile_errors", "counter"),
        ] {
            assert!(
                text.contains(&format!("\n# TYPE {name} {kind}\n")),
                "{name} in {text}"
            );
            assert!(text.contains(&format!("\n# HELP {name} ")), "{name} in {text}");
        }
        assert!(!text.contains("\ncso_clusters{"), "{text}");
        assert!(!text.contains("\ncso_hook_requests_total{"), "{text}");
    }

    #[tokio::test]
    async fn reconciles_are_counted_and_timed_by_controller_and_result() {
        let metrics = Metrics::default();
        let _ = metrics
            .reconcile("clusterstack", async { Ok(Action::await_change()) })
            .await;
        let _ = metrics
            .reconcile("clusterstack", async { Err(Error::Reported("x".into())) })
            .await;
        let text = metrics.encode();
        assert!(
            text.contains(
                r#"controller_runtime_reconcile_total{controller="clusterstack",result="success"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"controller_runtime_reconcile_total{controller="clusterstack",result="error"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"controller_runtime_reconcile_errors_total{controller="clusterstack"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"controller_runtime_reconcile_time_seconds_count{controller="clusterstack"} 2"#),
            "{text}"
        );
    }
}
