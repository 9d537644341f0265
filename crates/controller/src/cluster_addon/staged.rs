//! Multi-stage releases (`clusteraddon.yaml`): the driver of the stage machine of [`super::stages`]. Each
//! stage of a lifecycle hook has its chart directory, its `overwrite.yaml` values, `apply` or `delete`, and
//! CEL conditions to wait for before and after. The driver asks the machine for the next step, carries it
//! out (a CEL evaluation, a render and an apply or delete through [`crate::applier`]) and persists the
//! progress (`status.stages`) and what each stage applied (an annotation) after every step, so a restarted
//! operator resumes where it stopped and an upgrade prunes from that record, not by rendering the old
//! release. A failed stage is never counted as done: it is reported and retried, and moving the Cluster to
//! a fixed release starts over with that release.

use std::path::{Path, PathBuf};

use cso_api::{
    ClusterAddon, ClusterAddonStatus,
    capi::Cluster,
    cluster_addon::{STAGE_ANNOTATION, STAGE_INVENTORY_ANNOTATION, StageAction},
    common::Resource,
    conditions::{ConditionsExt, Severity},
    names::{condition, event, reason},
    rules::{HookRuns, StageClock, hook_runs::STAGE_CLOCK_ANNOTATION},
};
use cso_apply::{
    WorkloadCluster,
    cel::{self, CelOutcome},
};
use cso_release::{AddonConfig, Hook, Release, Stage, addon_config::WaitCondition, archive::UnpackLimits};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;

use super::{
    decide::{Conclusion, Intervals, Outcome, Progress, SpecUpdate, set_ready},
    decision::Decision,
    inputs, render_templated,
    stages::{self, Check, Finished, Flow, HookChoice, StageInventory, StageStep, StageWork},
};
use crate::{
    Context, Error,
    applier::{Target, Work},
    events::Events,
    patch,
    rendering::{self, ADDON_NAMESPACE},
};

/// How often an unmet CEL condition is evaluated again.
const CEL_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

pub(super) struct StagedRun<'a> {
    pub(super) ctx: &'a Context,
    pub(super) api: &'a Api<ClusterAddon>,
    pub(super) cluster: &'a Cluster,
    pub(super) release: &'a Release,
    pub(super) workload: &'a WorkloadCluster,
    pub(super) config: &'a AddonConfig,
    /// What the reconcile found before the stages: the digest of the values it templated (none while a hook
    /// is under way), the health of the applied objects.
    pub(super) progress: &'a Progress,
    pub(super) intervals: Intervals,
}

/// How a staged reconcile ended, and the status it last wrote (the final write compares with it).
pub(super) struct StagedEnd {
    pub(super) conclusion: Conclusion,
    pub(super) persisted: Option<ClusterAddonStatus>,
    /// The progress annotations as last written (to write only what changed).
    written_annotations: std::collections::BTreeMap<String, String>,
}

impl StagedRun<'_> {
    pub(super) async fn sync(
        &self,
        addon: &mut ClusterAddon,
        decision: Decision,
    ) -> Result<StagedEnd, Error> {
        let mut end = StagedEnd {
            conclusion: Conclusion {
                events: Events::default(),
                spec: SpecUpdate::default(),
                outcome: Outcome::Requeue(Some(self.ctx.settings.resync_interval)),
                applied_all: false,
            },
            persisted: None,
            written_annotations: [STAGE_INVENTORY_ANNOTATION, STAGE_CLOCK_ANNOTATION]
                .into_iter()
                .filter_map(|key| Some((key.to_owned(), addon.annotations().get(key)?.clone())))
                .collect(),
        };
        let last_stage = addon.annotations().get(STAGE_ANNOTATION).cloned();
        let hook = match stages::choose_hook(addon, decision, last_stage.as_deref()) {
            HookChoice::RecordOnly => {
                end.conclusion.spec.cluster_stack = Some(self.release.id.cluster_class_name());
                // Addons applied before digests were recorded adopt the current one (see `super::inputs`).
                end.conclusion.spec.inputs = self.progress.inputs.digest().map(str::to_owned);
                set_ready(self.progress, addon, false, self.intervals, &mut end.conclusion);
                return Ok(end);
            }
            HookChoice::Unknown(name) => {
                addon.mark_false(
                    condition::HOOK_SERVER_READY,
                    reason::UNKNOWN_HOOK,
                    Severity::Error,
                    format!("spec.hook names an unknown hook {name:?}"),
                );
                end.conclusion.outcome = Outcome::Requeue(None);
                return Ok(end);
            }
            HookChoice::Reapply(hook) => {
                self.reapply(addon, hook, &mut end).await?;
                return Ok(end);
            }
            HookChoice::Run(hook) => hook,
        };
        addon.mark_true(condition::HOOK_SERVER_READY);
        let stages = self.config.stages(hook);
        let mut inventory = inventory_of(addon);
        if stages::next_step(addon, hook, stages) == StageStep::Start {
            tracing::info!(cluster_addon = %addon.name_any(), hook = hook.as_str(), "starting the stages of a hook");
            let hook_changes = addon.spec.hook != hook.as_str();
            stages::start(addon, hook, stages);
            // A new run: its stages' clocks start when they do.
            addon.annotations_mut().remove(STAGE_CLOCK_ANNOTATION);
            if hook_changes {
                // Written at once, so a restart resumes this hook.
                let updated = self
                    .api
                    .patch(
                        &addon.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(json!({"spec": {"hook": hook.as_str()}})),
                    )
                    .await
                    .map_err(|e| Error::kube(format!("set the hook of {}", addon.name_any()), e))?;
                self.ctx.written.record(&updated);
            }
            self.persist(addon, &inventory, &mut end).await?;
        }
        let charts = self.charts(addon)?;
        let kube_version = self.step_version(addon, hook);

        loop {
            let step = stages::next_step(addon, hook, stages);
            if let Some(index) = stages::stage_of(step) {
                let now = chrono::Utc::now();
                let clock = StageClock::for_stage(StageClock::of(addon).as_ref(), hook, index, now);
                if clock.expired(self.ctx.settings.stage_timeout, now) {
                    let timeout = self.ctx.settings.stage_timeout;
                    stages::give_up(addon, hook, index, timeout, &mut end.conclusion.events);
                    self.persist(addon, &inventory, &mut end).await?;
                    continue;
                }
                addon
                    .annotations_mut()
                    .insert(STAGE_CLOCK_ANNOTATION.to_owned(), clock.encode());
            }
            let flow = match step {
                StageStep::Start => {
                    Flow::Fail(format!("the stages of {} changed while they ran", hook.as_str()))
                }
                StageStep::CheckPre(i) => {
                    let check = self.check(stages[i].wait_for_pre_condition.as_ref()).await;
                    stages::after_check(addon, i, true, check, &mut end.conclusion.events)
                }
                StageStep::CheckPost(i) => {
                    let check = self.check(stages[i].wait_for_post_condition.as_ref()).await;
                    if check == Check::Holds && self.progress.health_gates && stages::applies(&stages[i]) {
                        let objects = inventory.get(&stages[i].name).cloned().unwrap_or_default();
                        let report = cso_apply::health::check(
                            &self.workload.discovery,
                            &objects,
                            self.ctx.settings.addon_settle_time,
                        )
                        .await;
                        let found = super::health::Found::of(&report);
                        stages::after_health(addon, i, &found, &mut end.conclusion.events)
                    } else {
                        stages::after_check(addon, i, false, check, &mut end.conclusion.events)
                    }
                }
                StageStep::Work(i) => {
                    let work = self
                        .work(
                            addon,
                            &stages[i],
                            &charts,
                            &inventory,
                            kube_version.as_deref(),
                            false,
                        )
                        .await;
                    stages::after_stage_work(
                        addon,
                        i,
                        &stages[i],
                        work,
                        &mut inventory,
                        ADDON_NAMESPACE,
                        true,
                        &mut end.conclusion.events,
                    )
                }
                StageStep::Finished => break,
            };
            self.persist(addon, &inventory, &mut end).await?;
            match flow {
                Flow::Continue => {}
                Flow::Wait => {
                    end.conclusion.outcome = Outcome::Requeue(Some(CEL_RETRY));
                    return Ok(end);
                }
                Flow::Fail(message) => {
                    end.conclusion.outcome = Outcome::Retry(message);
                    return Ok(end);
                }
            }
        }

        // Charts the release no longer has at all: their objects go, but for those another chart applies now.
        let remaining = self.config.chart_names();
        let gone: Vec<String> = stages::charts_gone(&inventory, &remaining)
            .into_iter()
            .map(str::to_owned)
            .collect();
        for stage in gone {
            let records = stages::gone_chart_objects(&inventory, &stage, ADDON_NAMESPACE);
            let report = self.target(addon).delete(self.ctx, &records).await;
            if !report.is_complete() {
                let flow = stages::after_gone_chart_failed(
                    addon,
                    &stage,
                    &report.failure_summary(),
                    &mut end.conclusion.events,
                );
                self.persist(addon, &inventory, &mut end).await?;
                if let Flow::Fail(message) = flow {
                    end.conclusion.outcome = Outcome::Retry(message);
                }
                return Ok(end);
            }
            inventory.remove(&stage);
        }

        addon.annotations_mut().remove(STAGE_CLOCK_ANNOTATION);
        let finished = stages::finish(addon, hook, &inventory, self.progress.health_gates);
        self.persist(addon, &inventory, &mut end).await?;
        let class = self.release.id.cluster_class_name();
        let stage = match finished {
            Finished::Applied(stage) => stage,
            Finished::Held => {
                // The hook is answered (the Cluster goes on); the addons stay recorded on the release they
                // were on, so the next reconcile tries this one again.
                let message = format!(
                    "the {} stages of {class} ended with a render held: the addons are not on {class}",
                    hook.as_str()
                );
                end.conclusion.events.warning(event::PRUNE_HELD, message.clone());
                end.conclusion.spec = SpecUpdate {
                    hook: Some(String::new()),
                    ..SpecUpdate::default()
                };
                end.conclusion.outcome = Outcome::Retry(message);
                return Ok(end);
            }
        };
        end.conclusion.events.normal(
            event::CLUSTER_ADDON_APPLIED,
            format!("ran the {} stages of {class}", hook.as_str()),
        );
        end.conclusion.applied_all = true;
        end.conclusion.spec = SpecUpdate {
            cluster_stack: Some(class),
            version: Some(self.release.metadata.cluster_addon.to_dash()),
            hook: Some(String::new()),
            stage,
            inputs: self.applied_inputs().await,
        };
        Ok(end)
    }

    /// Drift correction: the apply stages of `hook` (the one that ran last) again, without waiting on
    /// conditions.
    async fn reapply(&self, addon: &mut ClusterAddon, hook: Hook, end: &mut StagedEnd) -> Result<(), Error> {
        let charts = self.charts(addon)?;
        let mut inventory = inventory_of(addon);
        let checking = self.progress.only_the_clock();
        for (index, stage) in self
            .config
            .stages(hook)
            .iter()
            .enumerate()
            .filter(|(_, s)| stages::applies(s))
        {
            let work = self.work(addon, stage, &charts, &inventory, None, checking).await;
            let flow = stages::after_stage_work(
                addon,
                index,
                stage,
                work,
                &mut inventory,
                ADDON_NAMESPACE,
                false,
                &mut end.conclusion.events,
            );
            if let Flow::Fail(message) = flow {
                self.persist(addon, &inventory, end).await?;
                end.conclusion.outcome = Outcome::Retry(message);
                return Ok(());
            }
        }
        // The same objects again: they run as the last check found.
        set_ready(self.progress, addon, false, self.intervals, &mut end.conclusion);
        self.persist(addon, &inventory, end).await?;
        end.conclusion.applied_all = true;
        end.conclusion.spec.inputs = self.applied_inputs().await;
        Ok(())
    }

    /// The digest to record with a hook's stages that ended now: the one templated before they started in
    /// this reconcile, else (a hook that ran over several reconciles) the values' digest now. A change of the
    /// inputs while such a hook ran is then taken as applied; the hook's last stages rendered with it.
    async fn applied_inputs(&self) -> Option<String> {
        if let Some(digest) = self.progress.inputs.digest() {
            return Some(digest.to_owned());
        }
        values_digest(self.ctx, self.cluster, self.release, self.config)
            .await
            .ok()
            .flatten()
    }

    /// The release's stage charts, unpacked.
    fn charts(&self, addon: &mut ClusterAddon) -> Result<PathBuf, Error> {
        match self.release.addon_charts(UnpackLimits::default()) {
            Ok(dir) => {
                addon.mark_true(condition::CLUSTER_ADDON_CONFIG_VALIDATED);
                Ok(dir)
            }
            Err(e) => {
                let message = format!("cluster addon config (clusteraddon.yaml) is wrong: {e}");
                addon.mark_false(
                    condition::CLUSTER_ADDON_CONFIG_VALIDATED,
                    reason::PARSING_CLUSTER_ADDON_CONFIG_FAILED,
                    Severity::Error,
                    message.clone(),
                );
                Err(Error::Reported(message))
            }
        }
    }

    /// Evaluates a pre- or post-condition in the workload cluster.
    async fn check(&self, wait_for: Option<&WaitCondition>) -> Check {
        let Some(wait) = wait_for else {
            // No condition (any more: the Cluster may have moved to a fixed release).
            return Check::Holds;
        };
        let outcome = match cel::compile(wait) {
            Ok(compiled) => compiled.evaluate(&self.workload.discovery).await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(CelOutcome::Satisfied) => Check::Holds,
            Ok(CelOutcome::Waiting(why)) => Check::Waiting(why),
            Err(e) => Check::Broken(e.to_string()),
        }
    }

    /// The Kubernetes version the stages of `hook` render with: the one of the step the hook server recorded
    /// for this hook's run of this class (an upgrade step's target or the version reached), else the
    /// release's.
    fn step_version(&self, addon: &ClusterAddon, hook: Hook) -> Option<String> {
        let runs = HookRuns::of(addon);
        let run = runs.get(hook)?;
        (run.class == self.release.id.cluster_class_name() && !run.kubernetes_version.is_empty())
            .then(|| run.kubernetes_version.clone())
    }

    /// Renders stage `stage` (for `kube_version`, the release's when `None`) and applies or deletes its
    /// objects (`checking`: reading each first, see [`super::apply_addon_objects`]).
    async fn work(
        &self,
        addon: &ClusterAddon,
        stage: &Stage,
        charts: &Path,
        inventory: &StageInventory,
        kube_version: Option<&str>,
        checking: bool,
    ) -> StageWork {
        let (chart, values) = rendering::stage_chart(charts, stage);
        if !chart.is_dir() {
            return StageWork::ChartMissing;
        }
        let values = match values {
            Some(file) => match super::template_values(self.ctx, self.cluster, &file).await {
                Ok(values) => Some(values),
                Err((reason, message)) => return StageWork::NotRendered(reason, message),
            },
            None => None,
        };
        let manifests = match render_templated(
            self.ctx,
            self.workload,
            self.release,
            &chart,
            values,
            kube_version,
        )
        .await
        {
            Ok(manifests) => manifests,
            Err((reason, message)) => return StageWork::NotRendered(reason, message),
        };
        match stage.action {
            StageAction::Apply => {
                let previous = inventory.get(&stage.name).cloned().unwrap_or_default();
                let report = super::apply_addon_objects(
                    &self.target(addon),
                    self.ctx,
                    addon,
                    &manifests,
                    &previous,
                    checking,
                )
                .await;
                if let Some(watch) = &self.workload.drift {
                    watch.watch(&report.resources).await;
                }
                match report.held {
                    Some(why) => StageWork::Held {
                        resources: report.resources,
                        why,
                    },
                    None => StageWork::Applied {
                        failures: (!report.is_complete()).then(|| report.failure_summary()),
                        resources: report.resources,
                    },
                }
            }
            StageAction::Delete => {
                let targets: Vec<Resource> = manifests.iter().map(cso_apply::resource_of).collect();
                let report = self.target(addon).delete(self.ctx, &targets).await;
                StageWork::Deleted {
                    failures: (!report.is_complete()).then(|| report.failure_summary()),
                    targets,
                }
            }
        }
    }

    fn target<'w>(&'w self, addon: &'w ClusterAddon) -> Work<'w, ClusterAddon> {
        Work {
            about: addon,
            owner: self.release.id.tag(),
            target: Target::Workload(self.workload),
        }
    }

    /// Writes the stage inventory and the stage clock (annotations, in one patch when either changed), the
    /// status and the events so far, now.
    async fn persist(
        &self,
        addon: &mut ClusterAddon,
        inventory: &StageInventory,
        end: &mut StagedEnd,
    ) -> Result<(), Error> {
        let encoded = serde_json::to_string(inventory).map_err(|e| Error::Internal(e.to_string()))?;
        addon
            .annotations_mut()
            .insert(STAGE_INVENTORY_ANNOTATION.to_owned(), encoded);
        let mut changed = serde_json::Map::new();
        for key in [STAGE_INVENTORY_ANNOTATION, STAGE_CLOCK_ANNOTATION] {
            let value = addon.annotations().get(key);
            if value != end.written_annotations.get(key) {
                changed.insert(key.to_owned(), value.cloned().into());
            }
        }
        if !changed.is_empty() {
            let updated = self
                .api
                .patch(
                    &addon.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": changed}})),
                )
                .await
                .map_err(|e| Error::kube(format!("record the stage progress of {}", addon.name_any()), e))?;
            self.ctx.written.record(&updated);
            for key in changed.keys() {
                match addon.annotations().get(key) {
                    Some(value) => end.written_annotations.insert(key.clone(), value.clone()),
                    None => end.written_annotations.remove(key),
                };
            }
        }
        let mut shown = addon.clone();
        shown.set_summary();
        let status = shown.status.clone().unwrap_or_default();
        patch::status(
            &self.ctx.written,
            self.api,
            &shown,
            end.persisted.as_ref(),
            &status,
        )
        .await?;
        end.persisted = Some(status);
        self.ctx
            .publish(&*addon, std::mem::take(&mut end.conclusion.events))
            .await;
        Ok(())
    }
}

/// The digest of every stage chart's templated `overwrite.yaml` (in chart name order; a chart without one
/// counts with empty values); `None` when the stage charts do not unpack (the stages report that).
pub(super) async fn values_digest(
    ctx: &Context,
    cluster: &Cluster,
    release: &Release,
    config: &AddonConfig,
) -> Result<Option<String>, (&'static str, String)> {
    let Ok(charts) = release.addon_charts(UnpackLimits::default()) else {
        return Ok(None);
    };
    let mut data = None;
    let mut values = Vec::new();
    for chart in config.chart_names() {
        let text = match rendering::stage_values_file(&charts, chart) {
            Some(file) => {
                let data = match &data {
                    Some(data) => data,
                    None => data.insert(super::cluster_data(ctx, cluster).await?),
                };
                super::template_over(ctx, data, &file).await?
            }
            None => String::new(),
        };
        values.push((chart, text));
    }
    Ok(Some(inputs::digest(
        values.iter().map(|(chart, text)| (*chart, text.as_str())),
    )))
}

/// The recorded stage inventory; an unreadable record counts as empty (nothing is pruned by mistake).
pub(super) fn inventory_of(addon: &ClusterAddon) -> StageInventory {
    addon
        .annotations()
        .get(STAGE_INVENTORY_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}
