//! Multi-stage releases (`clusteraddon.yaml`): the stages of a lifecycle hook, in order, each with its chart
//! directory, its `overwrite.yaml` values, `apply` or `delete`, and CEL conditions to wait for before and
//! after. Progress is written to `status.stages` after every step, so a restarted operator resumes where it
//! stopped; what each stage applied is recorded in an annotation, so an upgrade prunes from that record, not
//! by rendering the old release.
//!
//! Which hook runs: the one in `spec.hook` (set when a hook starts, so an interrupted hook resumes, and by the
//! hook server); otherwise `AfterControlPlaneInitialized` for a cluster that never got its addons, as soon as
//! its control plane answers, and `BeforeClusterUpgrade` when the Cluster moves to a class with other addons.
//! A failed stage is never counted as done: it is reported and retried, and moving the Cluster to a fixed
//! release starts over with that release.

use std::collections::{BTreeMap, BTreeSet};

use cso_api::{
    ClusterAddon,
    capi::Cluster,
    cluster_addon::{STAGE_ANNOTATION, STAGE_INVENTORY_ANNOTATION, StageAction, StagePhase, StageStatus},
    common::Resource,
    conditions::{ConditionsExt, Severity},
    names::{condition, event, reason},
};
use cso_apply::{
    WorkloadCluster,
    cel::{self, CelOutcome},
};
use cso_release::{AddonConfig, Hook, Release, Stage, addon_config::WaitCondition, archive::UnpackLimits};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{controller::Action, events::EventType},
};
use serde_json::json;

use super::{SpecUpdate, decision::Decision, render, status_of};
use crate::metrics::TargetCluster;
use crate::rendering::{self, ADDON_NAMESPACE};
use crate::{Context, Error, context::object_key, patch};

/// How often an unmet CEL condition is evaluated again.
const CEL_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// What each stage applied: stage name -> inventory.
type StageInventory = BTreeMap<String, Vec<Resource>>;

pub(super) struct StagedRun<'a> {
    pub(super) ctx: &'a Context,
    pub(super) api: &'a Api<ClusterAddon>,
    pub(super) cluster: &'a Cluster,
    pub(super) release: &'a Release,
    pub(super) workload: &'a WorkloadCluster,
    pub(super) config: &'a AddonConfig,
}

/// Why a stage did not finish in this pass.
enum Halt {
    /// A CEL condition does not hold yet: come back soon.
    Waiting,
    /// Reported in the conditions; retried with backoff.
    Failed(String),
}

impl StagedRun<'_> {
    pub(super) async fn sync(
        &self,
        addon: &mut ClusterAddon,
        spec_update: &mut SpecUpdate,
        decision: Decision,
    ) -> Result<Action, Error> {
        let installed = !addon.spec.cluster_stack.is_empty();
        let hook = if addon.spec.hook.is_empty() {
            match decision {
                Decision::RecordOnly => {
                    spec_update.cluster_stack = Some(self.release.id.cluster_class_name());
                    status_of(addon).ready = true;
                    return Ok(Action::requeue(self.ctx.settings.resync_interval));
                }
                Decision::Apply { upgrade: false } if installed => {
                    return self.reapply(addon, spec_update).await;
                }
                Decision::Apply { upgrade: false } => Hook::AfterControlPlaneInitialized,
                Decision::Apply { upgrade: true } => Hook::BeforeClusterUpgrade,
            }
        } else {
            match Hook::parse(&addon.spec.hook) {
                Some(hook) => hook,
                None => {
                    addon.mark_false(
                        condition::HOOK_SERVER_READY,
                        reason::UNKNOWN_HOOK,
                        Severity::Error,
                        format!("spec.hook names an unknown hook {:?}", addon.spec.hook),
                    );
                    return Ok(Action::await_change());
                }
            }
        };
        addon.mark_true(condition::HOOK_SERVER_READY);
        let stages = self.config.stages(hook);
        self.start(addon, hook, stages).await?;
        spec_update.status_written = true;

        let charts = self.charts(addon)?;
        let mut inventory = inventory_of(addon);
        for (index, stage) in stages.iter().enumerate() {
            match self.run_stage(addon, index, stage, &charts, &mut inventory).await {
                Ok(()) => {}
                Err(Halt::Waiting) => return Ok(Action::requeue(CEL_RETRY)),
                Err(Halt::Failed(message)) => return Err(Error::Reported(message)),
            }
        }

        // Charts the release no longer has at all: their objects go.
        let remaining: BTreeSet<&str> = self.config.chart_names();
        let gone: Vec<String> = inventory
            .keys()
            .filter(|s| !remaining.contains(s.as_str()))
            .cloned()
            .collect();
        for stage in gone {
            let records = inventory.get(&stage).cloned().unwrap_or_default();
            let report = self
                .workload
                .engine
                .apply(&[], ADDON_NAMESPACE, &self.labels(), &records)
                .await;
            self.ctx.metrics.applied(TargetCluster::Workload, &report);
            if !report.is_complete() {
                let message = format!("stage {stage} of the old release: {}", report.failure_summary());
                self.ctx
                    .report_false(
                        addon,
                        (
                            condition::HELM_CHART_DELETED,
                            reason::FAILED_TO_DELETE_OBJECTS,
                            Severity::Warning,
                        ),
                        &message,
                        (EventType::Warning, event::FAILED_TO_DELETE_OBJECTS),
                    )
                    .await;
                self.persist(addon, &inventory).await?;
                return Err(Error::Reported(message));
            }
            inventory.remove(&stage);
        }
        addon.delete_condition(condition::HELM_CHART_DELETED);

        addon.mark_true(condition::HELM_CHART_APPLIED);
        let status = status_of(addon);
        status.resources = inventory.values().flatten().cloned().collect();
        status.stages.clear();
        status.ready = true;
        self.persist(addon, &inventory).await?;
        self.ctx
            .event(
                addon,
                EventType::Normal,
                event::CLUSTER_ADDON_APPLIED,
                format!(
                    "ran the {} stages of {}",
                    hook.as_str(),
                    self.release.id.cluster_class_name()
                ),
            )
            .await;
        self.ctx.addon_applied(&object_key(&*addon));
        spec_update.cluster_stack = Some(self.release.id.cluster_class_name());
        spec_update.version = Some(self.release.metadata.cluster_addon.to_dash());
        spec_update.hook = Some(String::new());
        spec_update.stage = Some(match hook {
            Hook::AfterControlPlaneInitialized => "created",
            _ => "upgraded",
        });
        Ok(Action::requeue(self.ctx.settings.resync_interval))
    }

    /// Starts `hook` unless it is running: `spec.hook` is written at once (so a restart resumes it) and every
    /// stage is pending.
    async fn start(&self, addon: &mut ClusterAddon, hook: Hook, stages: &[Stage]) -> Result<(), Error> {
        let planned: Vec<StageStatus> = stages
            .iter()
            .map(|s| StageStatus {
                name: s.name.clone(),
                action: Some(s.action),
                phase: StagePhase::Pending,
            })
            .collect();
        let running = addon.spec.hook == hook.as_str()
            && status_of(addon).stages.len() == planned.len()
            && status_of(addon)
                .stages
                .iter()
                .zip(&planned)
                .all(|(a, b)| a.name == b.name && a.action == b.action);
        if running {
            return Ok(());
        }
        tracing::info!(cluster_addon = %addon.name_any(), hook = hook.as_str(), "starting the stages of a hook");
        status_of(addon).stages = planned;
        status_of(addon).ready = false;
        addon.delete_condition(condition::HELM_CHART_APPLIED);
        if addon.spec.hook != hook.as_str() {
            self.api
                .patch(
                    &addon.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"hook": hook.as_str()}})),
                )
                .await
                .map_err(|e| Error::kube(format!("set the hook of {}", addon.name_any()), e))?;
            addon.spec.hook = hook.as_str().to_owned();
        }
        self.persist(addon, &inventory_of(addon)).await
    }

    /// The release's stage charts, unpacked.
    fn charts(&self, addon: &mut ClusterAddon) -> Result<std::path::PathBuf, Error> {
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

    /// Takes stage `index` as far as it goes, writing every step.
    async fn run_stage(
        &self,
        addon: &mut ClusterAddon,
        index: usize,
        stage: &Stage,
        charts: &std::path::Path,
        inventory: &mut StageInventory,
    ) -> Result<(), Halt> {
        loop {
            let phase = status_of(addon)
                .stages
                .get(index)
                .map(|s| s.phase)
                .unwrap_or_default();
            let next = match phase {
                StagePhase::Done => return Ok(()),
                StagePhase::None | StagePhase::Pending | StagePhase::WaitingForPreCondition => {
                    self.wait(addon, index, stage.wait_for_pre_condition.as_ref(), true)
                        .await?;
                    StagePhase::ApplyingOrDeleting
                }
                StagePhase::ApplyingOrDeleting => {
                    let result = self.apply_or_delete(addon, stage, charts, inventory).await;
                    if let Err(Halt::Failed(message)) = &result {
                        self.ctx
                            .event(
                                addon,
                                EventType::Warning,
                                event::STAGE_FAILED,
                                format!("stage {}: {message}", stage.name),
                            )
                            .await;
                    }
                    self.persist(addon, inventory)
                        .await
                        .map_err(|e| Halt::Failed(e.to_string()))?;
                    result?;
                    StagePhase::WaitingForPostCondition
                }
                StagePhase::WaitingForPostCondition => {
                    self.wait(addon, index, stage.wait_for_post_condition.as_ref(), false)
                        .await?;
                    StagePhase::Done
                }
            };
            if let Some(entry) = status_of(addon).stages.get_mut(index) {
                entry.phase = next;
            }
            self.persist(addon, inventory)
                .await
                .map_err(|e| Halt::Failed(e.to_string()))?;
        }
    }

    /// Evaluates a pre- or post-condition; `Ok` when there is none or it holds.
    async fn wait(
        &self,
        addon: &mut ClusterAddon,
        index: usize,
        wait_for: Option<&WaitCondition>,
        pre: bool,
    ) -> Result<(), Halt> {
        let Some(wait) = wait_for else {
            // No condition (any more: the Cluster may have moved to a fixed release).
            addon.delete_condition(condition::EVALUATED_CEL);
            return Ok(());
        };
        let (failed_reason, which, waiting_phase) = if pre {
            (
                reason::FAILED_TO_EVALUATE_PRE_CONDITION,
                "pre",
                StagePhase::WaitingForPreCondition,
            )
        } else {
            (
                reason::FAILED_TO_EVALUATE_POST_CONDITION,
                "post",
                StagePhase::WaitingForPostCondition,
            )
        };
        let name = status_of(addon)
            .stages
            .get(index)
            .map(|s| s.name.clone())
            .unwrap_or_default();
        let outcome = match cel::compile(wait) {
            Ok(compiled) => compiled.evaluate(&self.workload.discovery).await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(CelOutcome::Satisfied) => {
                addon.delete_condition(condition::EVALUATED_CEL);
                Ok(())
            }
            Ok(CelOutcome::Waiting(why)) => {
                addon.mark_false(
                    condition::EVALUATED_CEL,
                    failed_reason,
                    Severity::Info,
                    format!("failed to successfully evaluate {which} condition: {name:?}: {why}"),
                );
                if let Some(entry) = status_of(addon).stages.get_mut(index) {
                    entry.phase = waiting_phase;
                }
                Err(Halt::Waiting)
            }
            Err(e) => {
                let message = format!("{which} condition of stage {name:?}: {e}");
                self.ctx
                    .report_false(
                        addon,
                        (condition::EVALUATED_CEL, failed_reason, Severity::Error),
                        &message,
                        (EventType::Warning, event::STAGE_FAILED),
                    )
                    .await;
                Err(Halt::Failed(message))
            }
        }
    }

    async fn apply_or_delete(
        &self,
        addon: &mut ClusterAddon,
        stage: &Stage,
        charts: &std::path::Path,
        inventory: &mut StageInventory,
    ) -> Result<(), Halt> {
        let (chart, values) = rendering::stage_chart(charts, stage);
        if !chart.is_dir() {
            let message = format!(
                "helm chart name doesn't exists in the cluster addon helm chart: {:?}",
                stage.name
            );
            addon.mark_false(
                condition::HELM_CHART_FOUND,
                reason::HELM_CHART_MISSING,
                Severity::Error,
                message.clone(),
            );
            return Err(Halt::Failed(message));
        }
        addon.delete_condition(condition::HELM_CHART_FOUND);
        let manifests = match render(
            self.ctx,
            self.cluster,
            self.workload,
            self.release,
            &chart,
            values.as_deref(),
        )
        .await
        {
            Ok(manifests) => manifests,
            Err((reason, message)) => {
                let message = format!("stage {}: {message}", stage.name);
                addon.mark_false(
                    condition::HELM_CHART_TEMPLATED,
                    reason,
                    Severity::Error,
                    message.clone(),
                );
                return Err(Halt::Failed(message));
            }
        };
        addon.delete_condition(condition::HELM_CHART_TEMPLATED);
        let previous = inventory.get(&stage.name).cloned().unwrap_or_default();
        match stage.action {
            StageAction::Apply => {
                let report = self
                    .workload
                    .engine
                    .apply(&manifests, ADDON_NAMESPACE, &self.labels(), &previous)
                    .await;
                self.ctx.metrics.applied(TargetCluster::Workload, &report);
                inventory.insert(stage.name.clone(), report.resources.clone());
                status_of(addon).resources = inventory.values().flatten().cloned().collect();
                if !report.is_complete() {
                    let message = format!(
                        "failed to successfully apply helm chart: {:?}: {}",
                        stage.name,
                        report.failure_summary()
                    );
                    addon.mark_false(
                        condition::HELM_CHART_APPLIED,
                        reason::FAILED_TO_APPLY_OBJECTS,
                        Severity::Warning,
                        message.clone(),
                    );
                    return Err(Halt::Failed(message));
                }
            }
            StageAction::Delete => {
                let targets: Vec<Resource> = manifests.iter().map(cso_apply::resource_of).collect();
                let report = self
                    .workload
                    .engine
                    .apply(&[], ADDON_NAMESPACE, &self.labels(), &targets)
                    .await;
                self.ctx.metrics.applied(TargetCluster::Workload, &report);
                if !report.is_complete() {
                    let message = format!(
                        "failed to successfully delete helm chart: {:?}: {}",
                        stage.name,
                        report.failure_summary()
                    );
                    addon.mark_false(
                        condition::HELM_CHART_DELETED,
                        reason::FAILED_TO_DELETE_OBJECTS,
                        Severity::Warning,
                        message.clone(),
                    );
                    return Err(Halt::Failed(message));
                }
                let deleted: BTreeSet<(String, String, String)> = targets
                    .iter()
                    .map(|t| (t.group.clone(), t.kind.clone(), t.name.clone()))
                    .collect();
                for records in inventory.values_mut() {
                    records.retain(|r| !deleted.contains(&(r.group.clone(), r.kind.clone(), r.name.clone())));
                }
                inventory.retain(|_, records| !records.is_empty());
                status_of(addon).resources = inventory.values().flatten().cloned().collect();
                addon.delete_condition(condition::HELM_CHART_DELETED);
            }
        }
        Ok(())
    }

    /// Drift correction: the apply stages of the hook that ran last, again, without waiting on conditions.
    async fn reapply(&self, addon: &mut ClusterAddon, spec_update: &mut SpecUpdate) -> Result<Action, Error> {
        let hook = match addon.annotations().get(STAGE_ANNOTATION).map(String::as_str) {
            Some("upgraded") => Hook::BeforeClusterUpgrade,
            _ => Hook::AfterControlPlaneInitialized,
        };
        let charts = self.charts(addon)?;
        let mut inventory = inventory_of(addon);
        for stage in self
            .config
            .stages(hook)
            .iter()
            .filter(|s| s.action == StageAction::Apply)
        {
            if let Err(Halt::Failed(message)) =
                self.apply_or_delete(addon, stage, &charts, &mut inventory).await
            {
                self.persist(addon, &inventory).await?;
                spec_update.status_written = true;
                return Err(Error::Reported(message));
            }
        }
        self.persist(addon, &inventory).await?;
        spec_update.status_written = true;
        status_of(addon).ready = true;
        self.ctx.addon_applied(&object_key(&*addon));
        Ok(Action::requeue(self.ctx.settings.resync_interval))
    }

    fn labels(&self) -> BTreeMap<String, String> {
        rendering::release_labels(self.release.id.tag())
    }

    /// Writes the status and the stage inventory now.
    async fn persist(&self, addon: &mut ClusterAddon, inventory: &StageInventory) -> Result<(), Error> {
        let encoded = serde_json::to_string(inventory).map_err(|e| Error::Internal(e.to_string()))?;
        if addon.annotations().get(STAGE_INVENTORY_ANNOTATION) != Some(&encoded) {
            self.api
                .patch(
                    &addon.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"annotations": {STAGE_INVENTORY_ANNOTATION: encoded}}}),
                    ),
                )
                .await
                .map_err(|e| Error::kube(format!("record the stage inventory of {}", addon.name_any()), e))?;
            addon
                .annotations_mut()
                .insert(STAGE_INVENTORY_ANNOTATION.to_owned(), encoded);
        }
        let mut shown = addon.clone();
        shown.set_summary();
        let status = shown.status.clone().unwrap_or_default();
        patch::status(self.api, &shown, None, &status).await
    }
}

/// The recorded stage inventory; an unreadable record counts as empty (nothing is pruned by mistake).
fn inventory_of(addon: &ClusterAddon) -> StageInventory {
    addon
        .annotations()
        .get(STAGE_INVENTORY_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default()
}
