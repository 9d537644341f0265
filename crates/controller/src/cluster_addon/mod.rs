//! The ClusterAddon controller: the core addons of a workload cluster. It waits for the workload cluster
//! (its kubeconfig Secret and `/readyz`), templates the release's values over the Cluster, renders the addon
//! chart against the workload cluster, applies it there with an inventory, and prunes what an upgrade no
//! longer has. A class change that keeps the addon version and the Kubernetes minor changes nothing; the
//! objects are watched (`cso_apply::drift`): a deleted, edited or unlabelled addon object wakes its ClusterAddon
//! and comes back; the periodic pass re-applies only what the watches cannot vouch for. An object put back
//! again and again is held with back-off and reported (`fights`).
//!
//! While its Cluster is paused nothing is done to the workload cluster; `moving` takes a ClusterAddon through
//! `clusterctl move` (blocks moves while the Cluster runs, records its status once paused, and a copy on the
//! target adopts it).
//!
//! Shape: the reconcile reads its object, `decide::next_step` (pure) names the next step and the driver
//! here carries it out (read the Cluster, connect to the workload cluster, fetch the release, render, apply
//! through `crate::applier`) until nothing is left; `decide::conclude` (pure) turns what happened into
//! the status, the recorded spec fields, the events and the retry. Releases with one addon chart
//! (`cluster-addon-values.yaml`) end there; multi-stage releases (`clusteraddon.yaml`, stages per lifecycle
//! hook) continue in `staged`, driven by the pure stage machine of `stages`.

pub(crate) mod decide;
pub mod decision;
mod fights;
mod health;
mod inputs;
mod staged;
pub(crate) mod stages;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use cso_api::{
    ClusterAddon,
    capi::Cluster,
    cluster_addon::{APPLIED_INPUTS_ANNOTATION, CLUSTER_ADDON_FINALIZER, STAGE_ANNOTATION},
    common::{Resource as InventoryEntry, ResourceStatus},
    conditions::ConditionsExt,
    names::reason,
    rules::{Hook, HookStages, hook_runs::HOOK_STAGES_ANNOTATION},
};
use cso_apply::{Verdict, WorkloadCluster, template_data::template_data, workload::kubeconfig_secret_name};
use cso_release::{AddonStyle, Release};
use cso_render::Manifest;
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::controller::Action,
};
use serde_json::json;

use self::decide::{
    ClusterState, Conclusion, Drift, Intervals, Outcome, Progress, ReleaseState, SpecUpdate, Step,
    WorkloadState, conclude, conclude_prefix, next_step,
};
use self::inputs::Inputs;
use crate::{
    Context, Error,
    applier::{Target, Work},
    cluster_stack_release::FetchFailure,
    context::ControllerContext,
    context::object_key,
    filter::is_paused,
    patch, rendering,
};

/// The ClusterAddon controller's context: the shared one and its own memory.
pub type AddonContext = ControllerContext<AddonMemory>;

/// What the ClusterAddon controller keeps across its reconciles: the resync clock, and the corrections of
/// drifted objects (`fights`), which its drift notification throttle consults too ([`AddonMemory::fights`]).
#[derive(Debug, Default)]
pub struct AddonMemory {
    clock: ResyncClock,
    fights: Arc<fights::Fights>,
}

impl AddonMemory {
    /// The drift notification throttle of the ClusterAddon controller (see `fights`): the ClusterAddons to
    /// reconcile for drift the workload clusters' watches told (`told`), each held addon woken once, when its
    /// hold ends.
    pub(crate) fn drift_wakes(
        &self,
        told: impl futures::Stream<Item = crate::context::DriftTold> + Send + 'static,
    ) -> impl futures::Stream<Item = kube::runtime::reflector::ObjectRef<ClusterAddon>> + Send + 'static {
        fights::drift_wakes(self.fights.clone(), told)
    }
}

/// When each object last applied everything it has; a full re-apply is due a resync interval later.
#[derive(Debug, Default)]
pub struct ResyncClock(Mutex<HashMap<String, Instant>>);

impl ResyncClock {
    fn due(&self, key: &str, interval: Duration) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .is_none_or(|at| at.elapsed() >= interval)
    }

    /// Whether `key` applied everything it has in this process (a multi-stage release: every stage of its
    /// last hook). Only then can the drift watches vouch for it: before, its stages are still under way.
    fn ever_applied(&self, key: &str) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).contains_key(key)
    }

    fn applied(&self, key: &str) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_owned(), Instant::now());
    }
}

/// Reconciles one ClusterAddon (recorded in the reconcile metrics as `clusteraddon`, bounded by
/// the reconcile timeout).
pub async fn reconcile(addon: Arc<ClusterAddon>, ctx: Arc<AddonContext>) -> Result<Action, Error> {
    // Acted on only where its Cluster's shard and its own label agree (so never by two shards at once: a moved
    // Cluster's ClusterAddon waits for its label to move); otherwise not counted as a reconcile here, and
    // handed over if it is labelled for this shard.
    let owner = crate::shard::owner_of(&addon, &ctx).await?;
    let labelled_here = ctx.settings.shard.owns(addon.meta().labels.as_ref());
    match (owner == ctx.settings.shard, labelled_here) {
        (true, true) => ctx.bounded("clusteraddon", addon, reconcile_object).await,
        (false, true) => {
            let namespace = addon.namespace().unwrap_or_default();
            crate::shard::label(&ctx, &namespace, &addon.name_any(), &owner).await?;
            ctx.workloads.forget(&namespace, &addon.cluster_name());
            Ok(Action::await_change())
        }
        (_, false) => Ok(Action::await_change()),
    }
}

async fn reconcile_object(queued: Arc<ClusterAddon>, ctx: Arc<AddonContext>) -> Result<Action, Error> {
    let api: Api<ClusterAddon> = Api::namespaced(ctx.client.clone(), &queued.namespace().unwrap_or_default());
    let Some(addon) = patch::current(&ctx, &api, queued.as_ref()).await? else {
        return Ok(Action::await_change());
    };
    if is_paused(&addon) {
        return Ok(Action::await_change());
    }
    if addon.meta().deletion_timestamp.is_some() {
        // Deleting never waits: the addons live in the workload cluster and go with it. The Go operator's
        // finalizer (kept only while its Cluster exists) is removed so a Cluster deletion cannot deadlock.
        patch::remove_finalizer(&ctx.written, &api, &addon, CLUSTER_ADDON_FINALIZER).await?;
        ctx.workloads
            .forget(&addon.namespace().unwrap_or_default(), &addon.cluster_name());
        ctx.own
            .fights
            .forget(&(addon.namespace().unwrap_or_default(), addon.cluster_name()));
        return Ok(Action::await_change());
    }
    // `clusterctl move`: while the Cluster is paused nothing is done to the workload cluster; a copy the move
    // made takes the status recorded on the source (see `moving`).
    let cluster = read_cluster(
        &ctx,
        &addon.namespace().unwrap_or_default(),
        &addon.cluster_name(),
    )
    .await?;
    let cluster_paused = cluster.as_ref().is_some_and(Cluster::is_paused);
    let addon = crate::moving::take_part(&ctx.written, &api, &addon, cluster_paused).await?;
    if cluster_paused {
        return Ok(Action::await_change());
    }

    let key = object_key(&addon);
    let mut progress = Progress {
        resync_due: ctx.own.clock.due(&key, ctx.settings.resync_interval),
        health_gates: ctx.settings.addon_health_checks,
        now: chrono::Utc::now(),
        ..Progress::default()
    };
    let mut driver = Driver {
        ctx: &ctx,
        addon: &addon,
        cluster: None,
        workload: None,
        release: None,
        values: None,
        manifests: Vec::new(),
        // While a hook's stages are under way, they decide what is applied: drift waits for them.
        vouch: ctx.own.clock.ever_applied(&key) && addon.spec.hook.is_empty(),
        fights: &ctx.own.fights,
        drifted: None,
        applying_since: None,
    };
    // Read once above, for the pause.
    driver.observe_cluster(cluster, &mut progress);
    let intervals = Intervals {
        workload_retry: ctx.settings.workload_retry_interval,
        resync: ctx.settings.resync_interval,
        health_timeout: ctx.settings.stage_timeout,
    };
    let mut working = addon.clone();
    let mut before = addon.status.clone();
    let conclusion = loop {
        match next_step(&progress, &addon) {
            Step::Conclude => break conclude(&progress, &mut working, intervals),
            Step::RunStages(decision) => {
                if let Some(conclusion) = conclude_prefix(&progress, &mut working, intervals) {
                    break conclusion;
                }
                let end = driver
                    .stages(&api, &mut working, decision, &progress, intervals)
                    .await?;
                if end.persisted.is_some() {
                    before = end.persisted;
                }
                break end.conclusion;
            }
            step => driver.run(step, &mut progress).await?,
        }
    };
    let Conclusion {
        mut events,
        spec,
        mut outcome,
        applied_all,
    } = conclusion;
    tracing::debug!(cluster_addon = %addon.name_any(), resync_due = progress.resync_due, vouch = driver.vouch,
        drift = ?progress.drift, inputs = ?progress.inputs, applied = progress.applied.as_ref().map(|r| r.applied),
        health = ?progress.health, applied_all, outcome = ?outcome, "pass concluded");
    if applied_all {
        ctx.own.clock.applied(&key);
    }
    driver.fights_into(&progress, &mut working, &mut events, &mut outcome);
    // Reconciled by its shard: whatever the default shard said about an unattended shard is over.
    working.delete_condition(cso_api::names::condition::SHARD_RECONCILING);
    working.set_summary();
    let status = working.status.clone().unwrap_or_default();
    patch::status(&ctx.written, &api, &working, before.as_ref(), &status).await?;
    ctx.publish(&working, events).await;
    let hook_stages = driver.release.as_deref().map(hook_stages_of);
    write_spec(&ctx.written, &api, &working, spec, hook_stages).await?;
    match outcome {
        Outcome::Requeue(Some(delay)) => Ok(Action::requeue(delay)),
        Outcome::Requeue(None) => Ok(Action::await_change()),
        Outcome::Retry(message) => Err(Error::Reported(message)),
    }
}

/// Cluster `name` in `namespace`, `None` when it is gone. Nothing of ours writes Clusters: the store's copy
/// is as new as any we know.
async fn read_cluster(ctx: &Context, namespace: &str, name: &str) -> Result<Option<Cluster>, Error> {
    match ctx.stores().and_then(|s| s.cluster(namespace, name)) {
        Some(cluster) => Ok(cluster.map(|c| c.as_ref().clone())),
        None => ctx
            .clusters(Some(namespace))
            .get_opt(name)
            .await
            .map_err(|e| Error::kube(format!("read Cluster {name}"), e)),
    }
}

/// The objects the ClusterAddon's applies left in place (synced entries of its inventory and of its stage
/// inventory): what the drift watches vouch for.
fn applied_objects(addon: &ClusterAddon) -> Vec<InventoryEntry> {
    let inventory = addon.status.iter().flat_map(|s| s.resources.iter());
    let stages = staged::inventory_of(addon);
    inventory
        .chain(stages.values().flatten())
        .filter(|r| r.status == Some(ResourceStatus::Synced))
        .cloned()
        .collect()
}

/// Whether no operator ever applied anything for `addon`: no object in its inventories, no stage, not
/// ready, no `HelmChartApplied` condition (the Go operator records each of its applies in one of them, in the
/// same reconcile). Its objects then cannot carry another operator's fields.
fn nothing_applied_yet(addon: &ClusterAddon) -> bool {
    let recorded = addon
        .status
        .as_ref()
        .is_some_and(|status| !status.resources.is_empty() || !status.stages.is_empty() || status.ready);
    !recorded
        && addon
            .get_condition(cso_api::names::condition::HELM_CHART_APPLIED)
            .is_none()
        && staged::inventory_of(addon).values().all(Vec::is_empty)
}

/// Applies `manifests` of `addon` through `work`, pruning what `previous` has and they do not; without the
/// take-over reads when nothing was ever applied for it ([`nothing_applied_yet`]); `checking`: reading every
/// object first and writing only what differs (a pass that only looks for drift, see
/// [`decide::Progress::only_the_clock`]).
pub(crate) async fn apply_addon_objects(
    work: &Work<'_, ClusterAddon>,
    ctx: &Context,
    addon: &ClusterAddon,
    manifests: &[Manifest],
    previous: &[cso_api::common::Resource],
    checking: bool,
) -> cso_apply::ApplyReport {
    if nothing_applied_yet(addon) {
        work.apply_first(ctx, manifests).await
    } else {
        work.apply(ctx, manifests, previous, checking).await
    }
}

pub fn error_policy(addon: Arc<ClusterAddon>, error: &Error, ctx: Arc<AddonContext>) -> Action {
    let delay = ctx.retry_delay(&object_key(addon.as_ref()));
    tracing::warn!(cluster_addon = %addon.name_any(), namespace = ?addon.namespace(), %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Carries out the steps; keeps what they produce that the decisions do not need (the Cluster, the
/// workload client, the release's files, the rendered objects).
struct Driver<'a> {
    ctx: &'a Context,
    addon: &'a ClusterAddon,
    cluster: Option<Cluster>,
    workload: Option<WorkloadCluster>,
    release: Option<Arc<Release>>,
    /// The templated values of a single-chart release (rendered with them).
    values: Option<String>,
    manifests: Vec<Manifest>,
    /// Ask the drift watches: the addon applied everything it has in this process (see
    /// `ResyncClock::ever_applied`) and no hook is under way.
    vouch: bool,
    fights: &'a fights::Fights,
    /// The objects the drift watches found drifted, when they could tell.
    drifted: Option<Vec<cso_apply::ObjectKey>>,
    /// When this reconcile's apply began: what it put back was written no earlier.
    applying_since: Option<Instant>,
}

impl Driver<'_> {
    /// Takes the ClusterAddon's Cluster as read (`None`: gone) into what the decisions know.
    fn observe_cluster(&mut self, cluster: Option<Cluster>, progress: &mut Progress) {
        let namespace = self.addon.namespace().unwrap_or_default();
        let cluster_name = self.addon.cluster_name();
        progress.cluster = match &cluster {
            None => {
                // The Cluster is gone; its ClusterAddon goes with it (owner reference), and so does its client.
                self.ctx.workloads.forget(&namespace, &cluster_name);
                ClusterState::Gone
            }
            Some(cluster) => match cluster.stack_release() {
                Some((id, _)) => ClusterState::Uses(id),
                None => ClusterState::NotOurs {
                    cluster: cluster_name,
                },
            },
        };
        self.cluster = cluster;
    }

    async fn run(&mut self, step: Step, progress: &mut Progress) -> Result<(), Error> {
        let namespace = self.addon.namespace().unwrap_or_default();
        let cluster_name = self.addon.cluster_name();
        match step {
            Step::ReadCluster => {
                let cluster = read_cluster(self.ctx, &namespace, &cluster_name).await?;
                self.observe_cluster(cluster, progress);
            }
            Step::ConnectWorkload => {
                // Cluster API sets the endpoint once the infrastructure is provisioned; the control plane, its
                // kubeconfig and values templates reading the endpoint come after it.
                if !self
                    .cluster
                    .as_ref()
                    .is_some_and(decide::has_control_plane_endpoint)
                {
                    progress.workload = WorkloadState::NoEndpoint;
                    return Ok(());
                }
                let known_secret = self.ctx.stores().and_then(|stores| {
                    stores.capi_secret_version(&namespace, &kubeconfig_secret_name(&cluster_name))
                });
                progress.workload = match self
                    .ctx
                    .workloads
                    .get_known(&namespace, &cluster_name, known_secret.as_deref())
                    .await
                {
                    Err(e) => WorkloadState::NoKubeconfig(e.to_string()),
                    Ok(workload) => match self.ctx.workloads.ready(&workload).await {
                        Err(e) => WorkloadState::NotReady(e.to_string()),
                        Ok(()) => {
                            if let Some(watch) = workload.drift.as_ref().filter(|_| self.vouch) {
                                let applied = applied_objects(self.addon);
                                watch.watch(&applied).await;
                                let verdict = watch.verdict(&applied);
                                let in_part = matches!(verdict, Verdict::DriftedInPart(_));
                                progress.drift = match verdict {
                                    Verdict::AsApplied => {
                                        self.drifted = Some(Vec::new());
                                        Drift::None
                                    }
                                    Verdict::Drifted(drifted) | Verdict::DriftedInPart(drifted) => {
                                        let owner = (namespace.clone(), cluster_name.clone());
                                        progress.drift_held = self.fights.claim(
                                            &owner,
                                            &workload.server,
                                            &drifted,
                                            Instant::now(),
                                            self.ctx.settings.resync_interval,
                                        );
                                        if in_part {
                                            // The others cannot be told: no fight is judged over on them.
                                            self.drifted = None;
                                            Drift::FoundInPart
                                        } else {
                                            self.drifted = Some(drifted);
                                            Drift::Found
                                        }
                                    }
                                    Verdict::Unknown => Drift::Unknown,
                                };
                            }
                            self.workload = Some(workload);
                            WorkloadState::Ready
                        }
                    },
                };
            }
            Step::FetchRelease => {
                let ClusterState::Uses(id) = &progress.cluster else {
                    return Err(Error::Internal("fetch before the Cluster was read".into()));
                };
                let pin = self.release_pin(id).await?;
                progress.release = match self.ctx.releases.get_pinned(id, pin.as_deref()).await {
                    Ok(release) => {
                        let state = ReleaseState::Ready {
                            addon_version: release.metadata.cluster_addon.to_dash(),
                            staged: matches!(release.addons, AddonStyle::Staged { .. }),
                        };
                        self.release = Some(release);
                        state
                    }
                    Err(error) => ReleaseState::Failed {
                        failure: FetchFailure::of(&error),
                        message: error.to_string(),
                    },
                };
            }
            Step::TemplateValues => {
                let (cluster, _, release) = self.parts()?;
                let recorded = self.addon.annotations().get(APPLIED_INPUTS_ANNOTATION);
                let single_values;
                (progress.inputs, single_values) = match release_values(self.ctx, cluster, release).await {
                    Ok((Some(digest), values)) => {
                        (Inputs::templated(recorded.map(String::as_str), digest), values)
                    }
                    Ok((None, values)) => (Inputs::Unavailable, values),
                    Err((reason, message)) => (Inputs::Failed { reason, message }, None),
                };
                if progress.inputs.changed() {
                    // Other values than applied: templated once more, so that a template that gives other values
                    // at every look (`randAlphaNum`, `now`) does not render and apply at every reconcile.
                    let again = release_values(self.ctx, cluster, release).await;
                    if again.ok().and_then(|(digest, _)| digest).as_deref() != progress.inputs.digest() {
                        tracing::warn!(
                            cluster_addon = %self.addon.name_any(),
                            "the values templates give other values at every look: changes of the Cluster are not \
                             followed for these addons"
                        );
                        progress.inputs = Inputs::Unavailable;
                    }
                }
                self.values = single_values;
            }
            Step::Render => {
                let (_, workload, release) = self.parts()?;
                let rendered = render_templated(
                    self.ctx,
                    workload,
                    release,
                    &release.cluster_addon_archive,
                    self.values.clone(),
                    None,
                )
                .await;
                progress.rendered = Some(rendered.map(|manifests| {
                    let count = manifests.len();
                    self.manifests = manifests;
                    count
                }));
            }
            Step::Apply { checking } => {
                self.applying_since = Some(Instant::now());
                let (_, workload, release) = self.parts()?;
                let previous = self
                    .addon
                    .status
                    .as_ref()
                    .map(|s| s.resources.clone())
                    .unwrap_or_default();
                let work = Work {
                    about: self.addon,
                    owner: release.id.tag(),
                    target: Target::Workload(workload),
                };
                let report =
                    apply_addon_objects(&work, self.ctx, self.addon, &self.manifests, &previous, checking)
                        .await;
                if let Some(watch) = &workload.drift {
                    watch.watch(&report.resources).await;
                }
                progress.applied = Some(report);
            }
            Step::CheckHealth { settle } => {
                let Some(workload) = &self.workload else {
                    return Err(Error::Internal(
                        "a health check before the workload cluster was known".into(),
                    ));
                };
                // What this reconcile applied, else what the last applies left in place.
                let objects = match &progress.applied {
                    Some(report) => report.resources.clone(),
                    None => applied_objects(self.addon),
                };
                let settle = if settle {
                    self.ctx.settings.addon_settle_time
                } else {
                    Duration::ZERO
                };
                let report = cso_apply::health::check(&workload.discovery, &objects, settle).await;
                progress.health = Some(health::Found::of(&report));
            }
            Step::RunStages(_) | Step::Conclude => {}
        }
        Ok(())
    }

    /// Records what this reconcile saw and corrected in the fights' memory and reports the fights: condition
    /// `DriftSettled` on `addon`, an event when an object entered a fight, the next look in `outcome` (see
    /// [`fights`]), the gauge.
    fn fights_into(
        &self,
        progress: &Progress,
        addon: &mut ClusterAddon,
        events: &mut crate::events::Events,
        outcome: &mut Outcome,
    ) {
        let owner = (addon.namespace().unwrap_or_default(), addon.cluster_name());
        let watch = self.workload.as_ref().and_then(|w| w.drift.as_ref());
        let corrected: Vec<_> = progress
            .applied
            .iter()
            .flat_map(|report| report.drift_corrected.iter())
            .map(|key| (key.clone(), watch.and_then(|w| w.take_cause(key))))
            .collect();
        let now = Instant::now();
        let report = self.fights.reconciled(
            &owner,
            self.workload.as_ref().map(|w| w.server.as_str()),
            self.drifted.as_deref(),
            &corrected,
            self.applying_since.unwrap_or(now),
            now,
            self.ctx.settings.resync_interval,
        );
        self.ctx.metrics.drift_fights(self.fights.in_fight());
        match &report.message {
            Some(message) => addon.mark_false(
                cso_api::names::condition::DRIFT_SETTLED,
                reason::DRIFT_FIGHT,
                cso_api::conditions::Severity::Warning,
                message,
            ),
            None => addon.delete_condition(cso_api::names::condition::DRIFT_SETTLED),
        }
        if let Some(note) = report.announce {
            events.warning(cso_api::names::event::DRIFT_FIGHT, note);
        }
        if let (Some(look), Outcome::Requeue(delay)) = (report.next_look, outcome) {
            *delay = Some(delay.map_or(look, |d| d.min(look)));
        }
    }

    /// The manifest digest the Cluster's release is pinned to: its ClusterStackRelease's `spec.digest` (its
    /// ClusterStack's pin). Fetched with it, addons are never rendered from a release that its
    /// ClusterStackRelease refuses (a restarted operator with an empty cache would otherwise download the
    /// moved tag here).
    async fn release_pin(&self, id: &cso_api::ReleaseId) -> Result<Option<String>, Error> {
        let Some((_, namespace)) = self.cluster.as_ref().and_then(Cluster::stack_release) else {
            return Ok(None);
        };
        let release = self.ctx.cluster_stack_release(&namespace, &id.tag()).await?;
        Ok(release.and_then(|release| release.spec.digest.clone()))
    }

    fn parts(&self) -> Result<(&Cluster, &WorkloadCluster, &Release), Error> {
        match (&self.cluster, &self.workload, &self.release) {
            (Some(cluster), Some(workload), Some(release)) => Ok((cluster, workload, release)),
            _ => Err(Error::Internal(
                "a step ran before the Cluster, workload cluster and release were known".into(),
            )),
        }
    }

    async fn stages(
        &self,
        api: &Api<ClusterAddon>,
        addon: &mut ClusterAddon,
        decision: decision::Decision,
        progress: &Progress,
        intervals: Intervals,
    ) -> Result<staged::StagedEnd, Error> {
        let (cluster, workload, release) = self.parts()?;
        let AddonStyle::Staged { config } = &release.addons else {
            return Err(Error::Internal("stages of a single-chart release".into()));
        };
        let run = staged::StagedRun {
            ctx: self.ctx,
            api,
            cluster,
            release,
            workload,
            config,
            progress,
            intervals,
        };
        run.sync(addon, decision).await
    }
}

/// Templates the values of `release` over the Cluster: their digest (see [`inputs`]; `None` when the stage
/// charts do not unpack) and, for a single-chart release, the values it renders with. On failure, the
/// `HelmChartTemplated` reason and a message.
async fn release_values(
    ctx: &Context,
    cluster: &Cluster,
    release: &Release,
) -> Result<(Option<String>, Option<String>), (&'static str, String)> {
    match &release.addons {
        AddonStyle::Single { values_file } => {
            let values = template_values(ctx, cluster, values_file).await?;
            Ok((Some(inputs::digest([("", values.as_str())])), Some(values)))
        }
        AddonStyle::Staged { config } => {
            Ok((staged::values_digest(ctx, cluster, release, config).await?, None))
        }
    }
}

/// Templates `values_file` over the Cluster and the objects it references. On failure, the
/// `HelmChartTemplated` reason and a message.
pub(crate) async fn template_values(
    ctx: &Context,
    cluster: &Cluster,
    values_file: &std::path::Path,
) -> Result<String, (&'static str, String)> {
    let data = cluster_data(ctx, cluster).await?;
    template_over(ctx, &data, values_file).await
}

/// The data values templates see (see [`template_data`]), or the `HelmChartTemplated` reason and a message.
pub(crate) async fn cluster_data(
    ctx: &Context,
    cluster: &Cluster,
) -> Result<serde_json::Value, (&'static str, String)> {
    template_data(&ctx.discovery, cluster)
        .await
        .map_err(|e| (reason::TEMPLATE_NEW_CLUSTER_STACK_OVERWRITE_FAILED, e.to_string()))
}

/// Templates `values_file` over `data`, or the `HelmChartTemplated` reason and a message.
pub(crate) async fn template_over(
    ctx: &Context,
    data: &serde_json::Value,
    values_file: &std::path::Path,
) -> Result<String, (&'static str, String)> {
    rendering::addon_values(&ctx.values, values_file, data)
        .await
        .map_err(|message| (reason::TEMPLATE_NEW_CLUSTER_STACK_OVERWRITE_FAILED, message))
}

/// Renders `chart` with the templated `values` against the workload cluster, for `kube_version` (the
/// release's when `None`). On failure, the `HelmChartTemplated` reason and a message.
pub(crate) async fn render_templated(
    ctx: &Context,
    workload: &WorkloadCluster,
    release: &Release,
    chart: &std::path::Path,
    values: Option<String>,
    kube_version: Option<&str>,
) -> Result<Vec<Manifest>, (&'static str, String)> {
    rendering::render_templated_addon_chart(
        ctx.renderer.as_ref(),
        release,
        chart,
        values,
        Some(workload.kubeconfig_path.clone()),
        kube_version,
    )
    .await
    .map_err(|message| (reason::TEMPLATE_NEW_CLUSTER_STACK_FAILED, message))
}

/// Which hooks the release of the Cluster's class has stages for (recorded in the annotation
/// [`HOOK_STAGES_ANNOTATION`], so the hook server answers hooks with nothing to run at once).
fn hook_stages_of(release: &Release) -> HookStages {
    let hooks: Vec<Hook> = match &release.addons {
        AddonStyle::Staged { config } => Hook::ADDON_STAGES
            .into_iter()
            .filter(|hook| !config.stages(*hook).is_empty())
            .collect(),
        AddonStyle::Single { .. } => Vec::new(),
    };
    HookStages::new(release.id.cluster_class_name(), hooks)
}

/// Writes the spec fields, the stage annotation and the hook stages that changed, in one merge patch on
/// fields we own.
async fn write_spec(
    written: &crate::stores::Written,
    api: &Api<ClusterAddon>,
    addon: &ClusterAddon,
    update: SpecUpdate,
    hook_stages: Option<HookStages>,
) -> Result<(), Error> {
    let mut spec = serde_json::Map::new();
    if let Some(cluster_stack) = update.cluster_stack.filter(|c| *c != addon.spec.cluster_stack) {
        spec.insert("clusterStack".into(), cluster_stack.into());
    }
    if let Some(version) = update.version.filter(|v| *v != addon.spec.version) {
        spec.insert("version".into(), version.into());
    }
    if let Some(hook) = update.hook.filter(|h| *h != addon.spec.hook) {
        spec.insert("hook".into(), hook.into());
    }
    let mut annotations = serde_json::Map::new();
    if let Some(stage) = update
        .stage
        .filter(|s| addon.annotations().get(STAGE_ANNOTATION).map(String::as_str) != Some(*s))
    {
        annotations.insert(STAGE_ANNOTATION.into(), stage.into());
    }
    if let Some(digest) = update
        .inputs
        .filter(|d| addon.annotations().get(APPLIED_INPUTS_ANNOTATION) != Some(d))
    {
        annotations.insert(APPLIED_INPUTS_ANNOTATION.into(), digest.into());
    }
    if let Some(stages) = hook_stages.filter(|stages| HookStages::of(addon).as_ref() != Some(stages)) {
        annotations.insert(HOOK_STAGES_ANNOTATION.into(), stages.encode().into());
    }
    if spec.is_empty() && annotations.is_empty() {
        return Ok(());
    }
    let mut body = json!({});
    if !spec.is_empty() {
        body["spec"] = spec.into();
    }
    if !annotations.is_empty() {
        body["metadata"] = json!({ "annotations": annotations });
    }
    let updated = api
        .patch(&addon.name_any(), &PatchParams::default(), &Patch::Merge(&body))
        .await
        .map_err(|e| Error::kube(format!("update ClusterAddon {}", addon.name_any()), e))?;
    written.record(&updated);
    Ok(())
}

#[cfg(test)]
mod tests {
    use cso_api::{
        ClusterAddonStatus,
        cluster_addon::{STAGE_INVENTORY_ANNOTATION, StageStatus},
        common::Resource,
        conditions::ConditionsExt,
        names::condition,
    };
    use rstest::rstest;

    use super::*;

    #[rstest]
    #[case::new_and_without_status(None, false, true)]
    #[case::a_status_with_nothing_applied(Some(ClusterAddonStatus::default()), false, true)]
    #[case::an_inventory(Some(ClusterAddonStatus { resources: vec![Resource::default()].into(), ..Default::default() }), false, false)]
    #[case::a_stage(Some(ClusterAddonStatus { stages: vec![StageStatus::default()], ..Default::default() }), false, false)]
    #[case::ready(Some(ClusterAddonStatus { ready: true, ..Default::default() }), false, false)]
    #[case::a_stage_inventory(None, true, false)]
    fn nothing_is_applied_yet_until_some_record_says_otherwise(
        #[case] status: Option<ClusterAddonStatus>,
        #[case] stage_inventory: bool,
        #[case] expected: bool,
    ) {
        let mut addon = ClusterAddon::new("cluster-addon-c1", Default::default());
        addon.status = status;
        if stage_inventory {
            addon.annotations_mut().insert(
                STAGE_INVENTORY_ANNOTATION.into(),
                r#"{"cni":[{"group":"","version":"v1","kind":"ConfigMap","namespace":"kube-system","name":"a","status":"synced"}]}"#.into(),
            );
        }
        assert_eq!(nothing_applied_yet(&addon), expected);
    }

    #[test]
    fn an_applied_condition_counts_as_applied() {
        let mut addon = ClusterAddon::new("cluster-addon-c1", Default::default());
        addon.mark_true(condition::HELM_CHART_APPLIED);
        assert!(!nothing_applied_yet(&addon));
    }
}
