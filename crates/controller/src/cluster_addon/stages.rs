//! The stage machine of multi-stage releases (pure): which hook runs ([`choose_hook`]), which step of which
//! stage comes next given the progress recorded in `status.stages` ([`next_step`]), and what the result of a
//! step does to the progress and the conditions ([`after_check`], [`after_stage_work`]). The driver in
//! [`super::staged`] carries out each step and persists after it, so a restart between any two steps resumes
//! at the step it stopped.

use std::collections::BTreeMap;

use cso_api::{
    ClusterAddon, ClusterAddonStatus,
    cluster_addon::{StageAction, StagePhase, StageStatus},
    common::Resource,
    conditions::{ConditionsExt, Severity},
    names::{condition, event, reason},
};
use cso_release::{Hook, Stage};

use super::decision::Decision;
use crate::events::{Events, Kind};

/// What each stage applied: stage name -> inventory.
pub(crate) type StageInventory = BTreeMap<String, Vec<Resource>>;

/// What the reconcile does with the stages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HookChoice {
    /// Same addons as applied: record the class, run nothing.
    RecordOnly,
    /// Drift correction: the apply stages of this hook again, without waiting on conditions.
    Reapply(Hook),
    /// Run (or resume) the stages of this hook.
    Run(Hook),
    /// `spec.hook` names no hook we know.
    Unknown(String),
}

/// The hook to run: the one in `spec.hook` (set when a hook starts, so an interrupted hook resumes, and by
/// the hook server); otherwise `AfterControlPlaneInitialized` for a cluster that never got its addons, and
/// `BeforeClusterUpgrade` when the Cluster moved to a class with other addons. `last_stage` is the
/// `ClusterAddonStage` annotation (which hook ran last: `upgraded` means the upgrade's).
pub(crate) fn choose_hook(addon: &ClusterAddon, decision: Decision, last_stage: Option<&str>) -> HookChoice {
    if !addon.spec.hook.is_empty() {
        // Only hooks a release can name stages for run stages (others are not hooks of ours).
        return match Hook::parse(&addon.spec.hook).filter(|hook| hook.has_addon_stages()) {
            Some(hook) => HookChoice::Run(hook),
            None => HookChoice::Unknown(addon.spec.hook.clone()),
        };
    }
    let installed = !addon.spec.cluster_stack.is_empty();
    match decision {
        Decision::RecordOnly => HookChoice::RecordOnly,
        Decision::Apply { upgrade: false } if installed => HookChoice::Reapply(match last_stage {
            Some("upgraded") => Hook::BeforeClusterUpgrade,
            _ => Hook::AfterControlPlaneInitialized,
        }),
        Decision::Apply { upgrade: false } => HookChoice::Run(Hook::AfterControlPlaneInitialized),
        Decision::Apply { upgrade: true } => HookChoice::Run(Hook::BeforeClusterUpgrade),
    }
}

/// The progress of `stages` before any of them ran.
pub(crate) fn planned(stages: &[Stage]) -> Vec<StageStatus> {
    stages
        .iter()
        .map(|s| StageStatus {
            name: s.name.clone(),
            action: Some(s.action),
            phase: StagePhase::Pending,
        })
        .collect()
}

/// The next step of the stages of `hook`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StageStep {
    /// The hook is not running (or ran with other stages): record it in `spec.hook`, every stage pending.
    Start,
    /// Evaluate the pre-condition of stage `i`.
    CheckPre(usize),
    /// Apply or delete the objects of stage `i`.
    Work(usize),
    /// Evaluate the post-condition of stage `i`.
    CheckPost(usize),
    /// Every stage is done.
    Finished,
}

pub(crate) fn next_step(addon: &ClusterAddon, hook: Hook, stages: &[Stage]) -> StageStep {
    let recorded = addon
        .status
        .as_ref()
        .map(|s| s.stages.as_slice())
        .unwrap_or_default();
    let planned = planned(stages);
    let running = addon.spec.hook == hook.as_str()
        && recorded.len() == planned.len()
        && recorded
            .iter()
            .zip(&planned)
            .all(|(a, b)| a.name == b.name && a.action == b.action);
    if !running {
        return StageStep::Start;
    }
    match recorded.iter().position(|s| s.phase != StagePhase::Done) {
        None => StageStep::Finished,
        Some(i) => match recorded[i].phase {
            StagePhase::None | StagePhase::Pending | StagePhase::WaitingForPreCondition => {
                StageStep::CheckPre(i)
            }
            StagePhase::ApplyingOrDeleting => StageStep::Work(i),
            StagePhase::WaitingForPostCondition => StageStep::CheckPost(i),
            StagePhase::Done => StageStep::Finished,
        },
    }
}

fn status_of(addon: &mut ClusterAddon) -> &mut ClusterAddonStatus {
    addon.status.get_or_insert_with(Default::default)
}

/// Records that `hook` starts: every stage pending, not ready, no stage given up yet, nothing known of
/// what its stages will run.
pub(crate) fn start(addon: &mut ClusterAddon, hook: Hook, stages: &[Stage]) {
    let status = status_of(addon);
    status.stages = planned(stages);
    status.ready = false;
    addon.delete_condition(condition::HELM_CHART_APPLIED);
    addon.delete_condition(condition::HOOK_STAGES_COMPLETED);
    addon.delete_condition(condition::ADDONS_HEALTHY);
    addon.spec.hook = hook.as_str().to_owned();
}

/// How the stage machine goes on after a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Persist and take the next step.
    Continue,
    /// A condition does not hold yet: persist and come back soon.
    Wait,
    /// Reported in the conditions: persist and retry with backoff.
    Fail(String),
}

/// What evaluating a stage's CEL condition gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// It holds, or there is none.
    Holds,
    /// Not yet: why.
    Waiting(String),
    /// It cannot be evaluated (does not compile, is not a boolean): why.
    Broken(String),
}

/// Stage `index`'s pre- (`pre`) or post-condition gave `check`.
pub(crate) fn after_check(
    addon: &mut ClusterAddon,
    index: usize,
    pre: bool,
    check: Check,
    events: &mut Events,
) -> Flow {
    let (failed_reason, which, waiting_phase, next_phase) = if pre {
        (
            reason::FAILED_TO_EVALUATE_PRE_CONDITION,
            "pre",
            StagePhase::WaitingForPreCondition,
            StagePhase::ApplyingOrDeleting,
        )
    } else {
        (
            reason::FAILED_TO_EVALUATE_POST_CONDITION,
            "post",
            StagePhase::WaitingForPostCondition,
            StagePhase::Done,
        )
    };
    let name = stage_name(addon, index);
    match check {
        Check::Holds => {
            addon.delete_condition(condition::EVALUATED_CEL);
            set_phase(addon, index, next_phase);
            Flow::Continue
        }
        Check::Waiting(why) => {
            addon.mark_false(
                condition::EVALUATED_CEL,
                failed_reason,
                Severity::Info,
                format!("failed to successfully evaluate {which} condition: {name:?}: {why}"),
            );
            set_phase(addon, index, waiting_phase);
            Flow::Wait
        }
        Check::Broken(error) => {
            let message = format!("{which} condition of stage {name:?}: {error}");
            events.report_false(
                addon,
                (condition::EVALUATED_CEL, failed_reason, Severity::Error),
                &message,
                (Kind::Warning, event::STAGE_FAILED),
            );
            Flow::Fail(message)
        }
    }
}

/// The stage a step works on, if any.
pub(crate) fn stage_of(step: StageStep) -> Option<usize> {
    match step {
        StageStep::CheckPre(i) | StageStep::Work(i) | StageStep::CheckPost(i) => Some(i),
        StageStep::Start | StageStep::Finished => None,
    }
}

/// Stage `index`'s post-condition held and the health check of what it applied found `found` (health
/// gates on): the stage is done when its objects run; until then it waits, and `AddonsHealthy` says for what
/// (unless an earlier stage of this run was given up on because its objects did not run: that stays
/// recorded, so the run does not end ready).
pub(crate) fn after_health(
    addon: &mut ClusterAddon,
    index: usize,
    found: &super::health::Found,
    events: &mut Events,
) -> Flow {
    match found {
        super::health::Found::Running => {
            let waited = addon
                .get_condition(condition::ADDONS_HEALTHY)
                .is_some_and(|c| c.reason.as_deref() == Some(reason::WAITING_FOR_HEALTH));
            if waited {
                addon.delete_condition(condition::ADDONS_HEALTHY);
            }
            after_check(addon, index, false, Check::Holds, events)
        }
        super::health::Found::NotRunning(summary) | super::health::Found::Unreadable(summary) => {
            let name = stage_name(addon, index);
            addon.delete_condition(condition::EVALUATED_CEL);
            let given_up_before = addon
                .get_condition(condition::ADDONS_HEALTHY)
                .is_some_and(|c| c.reason.as_deref() == Some(reason::NOT_HEALTHY_IN_TIME));
            if !given_up_before {
                addon.mark_false(
                    condition::ADDONS_HEALTHY,
                    reason::WAITING_FOR_HEALTH,
                    Severity::Info,
                    format!("{}{summary}", stage_not_running_yet(&name)),
                );
            }
            set_phase(addon, index, StagePhase::WaitingForPostCondition);
            Flow::Wait
        }
    }
}

/// Stage `index` did not finish within `timeout`: it is given up (counted as done, so the hook's other
/// stages run and Cluster API can go on) and reported: `HookStagesCompleted` False with the stage's last
/// problem, and a Warning event. The message names no time, so it reads the same at every hook call. A stage
/// that waited for its objects to run also marks `AddonsHealthy` False (`NotHealthyInTime`) with them.
pub(crate) fn give_up(
    addon: &mut ClusterAddon,
    hook: Hook,
    index: usize,
    timeout: std::time::Duration,
    events: &mut Events,
) -> Flow {
    let name = stage_name(addon, index);
    let phase = addon
        .status
        .as_ref()
        .and_then(|s| s.stages.get(index))
        .map(|s| s.phase)
        .unwrap_or_default();
    let not_running = addon
        .get_condition(condition::ADDONS_HEALTHY)
        .filter(|c| c.reason.as_deref() == Some(reason::WAITING_FOR_HEALTH))
        .and_then(|c| c.message.clone());
    let waiting_for = match (phase, &not_running) {
        (StagePhase::WaitingForPostCondition, Some(message)) => {
            // The objects [`after_health`] named, without its words before them.
            let what = message
                .strip_prefix(&stage_not_running_yet(&name))
                .unwrap_or(message);
            format!("its objects to run: {what}")
        }
        (StagePhase::WaitingForPreCondition | StagePhase::Pending | StagePhase::None, _) => {
            "its pre-condition".to_owned()
        }
        (StagePhase::ApplyingOrDeleting, _) => "its objects to be applied or deleted".to_owned(),
        (StagePhase::WaitingForPostCondition | StagePhase::Done, _) => "its post-condition".to_owned(),
    };
    let message = format!(
        "stage {name:?} of {hook} did not finish within {} (waiting for {waiting_for}); given up so that the \
         Cluster can go on",
        go_duration(timeout)
    );
    if not_running.is_some() && phase == StagePhase::WaitingForPostCondition {
        addon.mark_false(
            condition::ADDONS_HEALTHY,
            reason::NOT_HEALTHY_IN_TIME,
            Severity::Warning,
            message.clone(),
        );
        events.warning(event::ADDONS_NOT_HEALTHY, message.clone());
    }
    addon.mark_false(
        condition::HOOK_STAGES_COMPLETED,
        reason::STAGE_TIMED_OUT,
        Severity::Warning,
        message.clone(),
    );
    events.warning(event::STAGE_TIMED_OUT, message);
    set_phase(addon, index, StagePhase::Done);
    Flow::Continue
}

/// `timeout` as the flags spell durations (`10m`, `1h30m`, `45s`).
fn go_duration(timeout: std::time::Duration) -> String {
    cso_api::duration::format(timeout)
}

/// What applying or deleting a stage's objects gave.
#[derive(Clone, Debug)]
pub(crate) enum StageWork {
    /// The stage's chart directory is not in the release.
    ChartMissing,
    /// Rendering failed: the `HelmChartTemplated` reason and the message.
    NotRendered(&'static str, String),
    /// Applied: the stage's new inventory, and the failures if any.
    Applied {
        resources: Vec<Resource>,
        failures: Option<String>,
    },
    /// Not applied: the render would have pruned most of the stage's objects (`ApplyReport::held`, why);
    /// the stage's inventory stays `resources`.
    Held { resources: Vec<Resource>, why: String },
    /// Deleted: the objects named by the render (as written), and the failures if any.
    Deleted {
        targets: Vec<Resource>,
        failures: Option<String>,
    },
}

/// Stage `index` (`stage`) did `work`: its inventory and the conditions follow. `default_namespace` is where
/// objects rendered without a namespace went. With `advance` (running a hook), a stage that succeeded moves
/// on to its post-condition and one that failed is announced by a `StageFailed` event; a re-apply for drift
/// correction moves no stage.
#[allow(
    clippy::too_many_arguments,
    reason = "one step's inputs; each is named at the call"
)]
pub(crate) fn after_stage_work(
    addon: &mut ClusterAddon,
    index: usize,
    stage: &Stage,
    work: StageWork,
    inventory: &mut StageInventory,
    default_namespace: &str,
    advance: bool,
    events: &mut Events,
) -> Flow {
    let flow = stage_work_flow(addon, stage, work, inventory, default_namespace);
    if let Flow::Fail(message) = &flow
        && advance
    {
        events.warning(event::STAGE_FAILED, format!("stage {}: {message}", stage.name));
    }
    if flow == Flow::Continue && advance {
        set_phase(addon, index, StagePhase::WaitingForPostCondition);
    }
    flow
}

fn stage_work_flow(
    addon: &mut ClusterAddon,
    stage: &Stage,
    work: StageWork,
    inventory: &mut StageInventory,
    default_namespace: &str,
) -> Flow {
    let flow = match work {
        StageWork::ChartMissing => {
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
            return Flow::Fail(message);
        }
        StageWork::NotRendered(reason, message) => {
            addon.delete_condition(condition::HELM_CHART_FOUND);
            let message = format!("stage {}: {message}", stage.name);
            addon.mark_false(
                condition::HELM_CHART_TEMPLATED,
                reason,
                Severity::Error,
                message.clone(),
            );
            return Flow::Fail(message);
        }
        StageWork::Applied { resources, failures } => {
            inventory.insert(stage.name.clone(), resources);
            match failures {
                Some(summary) => {
                    let message = format!(
                        "failed to successfully apply helm chart: {:?}: {summary}",
                        stage.name
                    );
                    addon.mark_false(
                        condition::HELM_CHART_APPLIED,
                        reason::FAILED_TO_APPLY_OBJECTS,
                        Severity::Warning,
                        message.clone(),
                    );
                    Flow::Fail(message)
                }
                None => Flow::Continue,
            }
        }
        StageWork::Held { resources, why } => {
            inventory.insert(stage.name.clone(), resources);
            let message = format!("stage {}: {why}", stage.name);
            addon.mark_false(
                condition::HELM_CHART_APPLIED,
                reason::PRUNE_HELD,
                Severity::Warning,
                message.clone(),
            );
            return Flow::Fail(message);
        }
        StageWork::Deleted { targets, failures } => match failures {
            Some(summary) => {
                let message = format!(
                    "failed to successfully delete helm chart: {:?}: {summary}",
                    stage.name
                );
                addon.mark_false(
                    condition::HELM_CHART_DELETED,
                    reason::FAILED_TO_DELETE_OBJECTS,
                    Severity::Warning,
                    message.clone(),
                );
                Flow::Fail(message)
            }
            None => {
                for records in inventory.values_mut() {
                    records.retain(|r| !targets.iter().any(|t| names_same_object(t, r, default_namespace)));
                }
                inventory.retain(|_, records| !records.is_empty());
                addon.delete_condition(condition::HELM_CHART_DELETED);
                Flow::Continue
            }
        },
    };
    addon.delete_condition(condition::HELM_CHART_FOUND);
    addon.delete_condition(condition::HELM_CHART_TEMPLATED);
    status_of(addon).resources = inventory.values().flatten().cloned().collect();
    flow
}

/// Whether `target` (as a chart renders it: no namespace may mean the default one, or a cluster-scoped
/// object) names the object `record` (as applied: its real namespace).
pub(crate) fn names_same_object(target: &Resource, record: &Resource, default_namespace: &str) -> bool {
    target.group == record.group
        && target.kind == record.kind
        && target.name == record.name
        && (target.namespace == record.namespace
            || (target.namespace.is_empty() && record.namespace == default_namespace))
}

/// The charts `inventory` holds objects of that the release no longer has at all (their objects go).
pub(crate) fn charts_gone<'a>(
    inventory: &'a StageInventory,
    remaining: &std::collections::BTreeSet<&str>,
) -> Vec<&'a str> {
    inventory
        .keys()
        .map(String::as_str)
        .filter(|stage| !remaining.contains(stage))
        .collect()
}

/// The objects of `stage`, a chart the release no longer has, to delete: those of its inventory that no other
/// stage's inventory holds. A chart that was renamed, or an object that moved to another chart, stays where
/// the release applies it now.
pub(crate) fn gone_chart_objects(
    inventory: &StageInventory,
    stage: &str,
    default_namespace: &str,
) -> Vec<Resource> {
    let elsewhere: Vec<&Resource> = inventory
        .iter()
        .filter(|(name, _)| name.as_str() != stage)
        .flat_map(|(_, records)| records)
        .collect();
    inventory
        .get(stage)
        .into_iter()
        .flatten()
        .filter(|record| {
            !elsewhere.iter().any(|other| {
                names_same_object(record, other, default_namespace)
                    || names_same_object(other, record, default_namespace)
            })
        })
        .cloned()
        .collect()
}

/// The objects of a chart the release no longer has could not all be deleted.
pub(crate) fn after_gone_chart_failed(
    addon: &mut ClusterAddon,
    stage: &str,
    summary: &str,
    events: &mut Events,
) -> Flow {
    let message = format!("stage {stage} of the old release: {summary}");
    events.report_false(
        addon,
        (
            condition::HELM_CHART_DELETED,
            reason::FAILED_TO_DELETE_OBJECTS,
            Severity::Warning,
        ),
        &message,
        (Kind::Warning, event::FAILED_TO_DELETE_OBJECTS),
    );
    Flow::Fail(message)
}

/// What finishing the stages of a hook came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Finished {
    /// The addons are applied; the `ClusterAddonStage` annotation to record (`created` after the install,
    /// `upgraded` after any upgrade hook; a deletion changes nothing).
    Applied(Option<&'static str>),
    /// A stage's render was held (`PruneHeld`, see `ApplyEngine::apply`) and given up at its timeout: the
    /// hook is over, so that the Cluster can go on, but the addons are not on the new release.
    Held,
}

/// Every stage of `hook` is done and what the release no longer has is deleted: the addons are applied,
/// unless a stage's render was held; with `health_gates`, each stage waited for its objects to run, or was
/// given up on.
pub(crate) fn finish(
    addon: &mut ClusterAddon,
    hook: Hook,
    inventory: &StageInventory,
    health_gates: bool,
) -> Finished {
    addon.delete_condition(condition::HELM_CHART_DELETED);
    let held = addon
        .get_condition(condition::HELM_CHART_APPLIED)
        .is_some_and(|c| !c.is_true() && c.reason.as_deref() == Some(reason::PRUNE_HELD));
    if !held {
        addon.mark_true(condition::HELM_CHART_APPLIED);
    }
    // Ready means running: a stage whose objects did not run in time leaves the addons not ready (the
    // hook still ends, so that the Cluster goes on); otherwise every stage's objects ran.
    let not_running = addon.is_condition_false(condition::ADDONS_HEALTHY);
    if health_gates && !not_running && !held {
        addon.mark_true(condition::ADDONS_HEALTHY);
    }
    let status = status_of(addon);
    status.resources = inventory.values().flatten().cloned().collect();
    status.stages.clear();
    status.ready = !held && !not_running;
    if held {
        return Finished::Held;
    }
    Finished::Applied(match hook {
        Hook::AfterControlPlaneInitialized => Some("created"),
        Hook::BeforeClusterCreate | Hook::BeforeClusterDelete => None,
        _ => Some("upgraded"),
    })
}

/// How `AddonsHealthy` begins while stage `name`'s objects are waited for to run (the objects follow).
fn stage_not_running_yet(name: &str) -> String {
    format!("stage {name:?} applied, not running yet: ")
}

fn stage_name(addon: &ClusterAddon, index: usize) -> String {
    addon
        .status
        .as_ref()
        .and_then(|s| s.stages.get(index))
        .map(|s| s.name.clone())
        .unwrap_or_default()
}

fn set_phase(addon: &mut ClusterAddon, index: usize, phase: StagePhase) {
    if let Some(entry) = status_of(addon).stages.get_mut(index) {
        entry.phase = phase;
    }
}

/// Whether a stage applies (as opposed to deletes).
pub(crate) fn applies(stage: &Stage) -> bool {
    stage.action == StageAction::Apply
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use cso_api::conditions::ConditionStatus;
    use rstest::rstest;

    use super::*;

    #[test]
    fn a_stage_whose_objects_do_not_run_waits_and_is_given_up_naming_them() {
        use super::super::health::Found;
        let stages = [stage("metrics-server", StageAction::Apply)];
        let mut addon = ClusterAddon::new("cluster-addon-c1", Default::default());
        start(&mut addon, Hook::AfterControlPlaneInitialized, &stages);
        let mut events = Events::default();
        let summary = "Deployment kube-system/metrics-server: 0 of 1 replicas available";
        let flow = after_health(&mut addon, 0, &Found::NotRunning(summary.into()), &mut events);
        assert_eq!(flow, Flow::Wait);
        assert_eq!(
            next_step(&addon, Hook::AfterControlPlaneInitialized, &stages),
            StageStep::CheckPost(0),
            "the next stage does not start"
        );
        let healthy = addon.get_condition(condition::ADDONS_HEALTHY).unwrap();
        assert_eq!(healthy.reason.as_deref(), Some(reason::WAITING_FOR_HEALTH));
        assert!(healthy.message.as_deref().unwrap().contains(summary));

        give_up(
            &mut addon,
            Hook::AfterControlPlaneInitialized,
            0,
            std::time::Duration::from_secs(600),
            &mut events,
        );
        assert_eq!(
            events.reasons(),
            [event::ADDONS_NOT_HEALTHY, event::STAGE_TIMED_OUT]
        );
        let healthy = addon.get_condition(condition::ADDONS_HEALTHY).unwrap();
        assert_eq!(healthy.reason.as_deref(), Some(reason::NOT_HEALTHY_IN_TIME));
        let timed_out = addon.get_condition(condition::HOOK_STAGES_COMPLETED).unwrap();
        assert!(
            timed_out.message.as_deref().unwrap().contains(summary),
            "{timed_out:?}"
        );
        finish(
            &mut addon,
            Hook::AfterControlPlaneInitialized,
            &StageInventory::new(),
            true,
        );
        assert!(!addon.status.as_ref().unwrap().ready, "ready means running");
        assert!(cso_api::rules::addons::health_settled(&addon), "the hook goes on");
    }

    #[test]
    fn a_stage_given_up_on_stays_recorded_through_the_stages_after_it() {
        use super::super::health::Found;
        let stages = [stage("web", StageAction::Apply), stage("cni", StageAction::Apply)];
        let mut addon = ClusterAddon::new("cluster-addon-c1", Default::default());
        start(&mut addon, Hook::BeforeClusterUpgrade, &stages);
        let mut events = Events::default();
        let not_running = |what: &str| Found::NotRunning(format!("Deployment kube-system/{what}: 0 of 1"));
        after_health(&mut addon, 0, &not_running("web"), &mut events);
        give_up(
            &mut addon,
            Hook::BeforeClusterUpgrade,
            0,
            std::time::Duration::from_secs(600),
            &mut events,
        );
        // The next stage's objects do not run at the first look, then do.
        assert_eq!(
            after_health(&mut addon, 1, &not_running("cni"), &mut events),
            Flow::Wait
        );
        assert_eq!(
            after_health(&mut addon, 1, &Found::Running, &mut events),
            Flow::Continue
        );
        let healthy = addon.get_condition(condition::ADDONS_HEALTHY).unwrap();
        assert_eq!(healthy.reason.as_deref(), Some(reason::NOT_HEALTHY_IN_TIME));
        assert!(healthy.message.as_deref().unwrap().contains("web"), "{healthy:?}");
        finish(
            &mut addon,
            Hook::BeforeClusterUpgrade,
            &StageInventory::new(),
            true,
        );
        assert!(!addon.status.as_ref().unwrap().ready, "web still does not run");
    }

    #[test]
    fn a_stage_whose_objects_run_is_done() {
        use super::super::health::Found;
        let stages = [stage("cni", StageAction::Apply)];
        let mut addon = ClusterAddon::new("cluster-addon-c1", Default::default());
        start(&mut addon, Hook::AfterControlPlaneInitialized, &stages);
        let mut events = Events::default();
        after_health(
            &mut addon,
            0,
            &Found::NotRunning("DaemonSet kube-system/cni: 0 of 3".into()),
            &mut events,
        );
        assert_eq!(
            after_health(&mut addon, 0, &Found::Running, &mut events),
            Flow::Continue
        );
        assert_eq!(
            next_step(&addon, Hook::AfterControlPlaneInitialized, &stages),
            StageStep::Finished
        );
        assert_eq!(addon.get_condition(condition::ADDONS_HEALTHY), None);
        finish(
            &mut addon,
            Hook::AfterControlPlaneInitialized,
            &StageInventory::new(),
            true,
        );
        assert!(addon.status.as_ref().unwrap().ready);
        assert!(
            addon.is_condition_true(condition::ADDONS_HEALTHY),
            "every stage's objects ran"
        );
    }

    fn stage(name: &str, action: StageAction) -> Stage {
        Stage {
            name: name.into(),
            action,
            wait_for_pre_condition: None,
            wait_for_post_condition: None,
        }
    }

    fn two_stages() -> Vec<Stage> {
        vec![
            stage("ngnix", StageAction::Apply),
            stage("metrics-server", StageAction::Apply),
        ]
    }

    fn addon(hook: &str, class: &str, phases: &[StagePhase]) -> ClusterAddon {
        let mut addon = ClusterAddon::new("cluster-addon-c1", Default::default());
        addon.spec.hook = hook.into();
        addon.spec.cluster_stack = class.into();
        let stages = two_stages();
        addon.status = Some(ClusterAddonStatus {
            stages: phases
                .iter()
                .zip(&stages)
                .map(|(phase, s)| StageStatus {
                    name: s.name.clone(),
                    action: Some(s.action),
                    phase: *phase,
                })
                .collect(),
            ..Default::default()
        });
        addon
    }

    /// Stage 0 (`stage`) of `a` did `work`; objects without a namespace went to `kube-system`.
    fn work_on_first_stage(
        a: &mut ClusterAddon,
        stage: &Stage,
        work: StageWork,
        inventory: &mut StageInventory,
        advance: bool,
        events: &mut Events,
    ) -> Flow {
        after_stage_work(a, 0, stage, work, inventory, "kube-system", advance, events)
    }

    fn resource(kind: &str, namespace: &str, name: &str) -> Resource {
        Resource {
            group: Default::default(),
            version: "v1".into(),
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
            ..Default::default()
        }
    }

    #[rstest]
    #[case::hook_given(
        "BeforeClusterUpgrade",
        "docker-ferrol-1-27-v1",
        Decision::RecordOnly,
        None,
        HookChoice::Run(Hook::BeforeClusterUpgrade)
    )]
    #[case::unknown_hook("BeforeEverything", "", Decision::RecordOnly, None, HookChoice::Unknown("BeforeEverything".into()))]
    #[case::hook_without_stages("BeforeClusterCreate", "", Decision::RecordOnly, None, HookChoice::Unknown("BeforeClusterCreate".into()))]
    #[case::chained_upgrade_step(
        "AfterControlPlaneUpgrade",
        "docker-scs-1-35-v1",
        Decision::RecordOnly,
        Some("upgraded"),
        HookChoice::Run(Hook::AfterControlPlaneUpgrade)
    )]
    #[case::same_addons(
        "",
        "docker-ferrol-1-27-v1",
        Decision::RecordOnly,
        None,
        HookChoice::RecordOnly
    )]
    #[case::first_install("", "", Decision::Apply { upgrade: false }, None, HookChoice::Run(Hook::AfterControlPlaneInitialized))]
    #[case::upgrade("", "docker-ferrol-1-27-v1", Decision::Apply { upgrade: true }, Some("created"), HookChoice::Run(Hook::BeforeClusterUpgrade))]
    #[case::resync_after_install("", "docker-ferrol-1-27-v1", Decision::Apply { upgrade: false }, Some("created"), HookChoice::Reapply(Hook::AfterControlPlaneInitialized))]
    #[case::resync_after_upgrade("", "docker-ferrol-1-27-v1", Decision::Apply { upgrade: false }, Some("upgraded"), HookChoice::Reapply(Hook::BeforeClusterUpgrade))]
    fn the_hook_to_run(
        #[case] hook: &str,
        #[case] class: &str,
        #[case] decision: Decision,
        #[case] last_stage: Option<&str>,
        #[case] expected: HookChoice,
    ) {
        assert_eq!(
            choose_hook(&addon(hook, class, &[]), decision, last_stage),
            expected
        );
    }

    #[rstest]
    #[case::not_started("", &[], StageStep::Start)]
    #[case::other_hook_recorded("AfterClusterUpgrade", &[StagePhase::Done, StagePhase::Done], StageStep::Start)]
    #[case::stages_changed("AfterControlPlaneInitialized", &[StagePhase::Pending], StageStep::Start)]
    #[case::pending("AfterControlPlaneInitialized", &[StagePhase::Pending, StagePhase::Pending], StageStep::CheckPre(0))]
    #[case::waiting_before("AfterControlPlaneInitialized", &[StagePhase::WaitingForPreCondition, StagePhase::Pending], StageStep::CheckPre(0))]
    #[case::interrupted_apply("AfterControlPlaneInitialized", &[StagePhase::ApplyingOrDeleting, StagePhase::Pending], StageStep::Work(0))]
    #[case::waiting_after("AfterControlPlaneInitialized", &[StagePhase::WaitingForPostCondition, StagePhase::Pending], StageStep::CheckPost(0))]
    #[case::second_stage("AfterControlPlaneInitialized", &[StagePhase::Done, StagePhase::ApplyingOrDeleting], StageStep::Work(1))]
    #[case::all_done("AfterControlPlaneInitialized", &[StagePhase::Done, StagePhase::Done], StageStep::Finished)]
    fn the_next_stage_step_resumes_where_the_record_stopped(
        #[case] hook: &str,
        #[case] phases: &[StagePhase],
        #[case] expected: StageStep,
    ) {
        let a = addon(hook, "", phases);
        assert_eq!(
            next_step(&a, Hook::AfterControlPlaneInitialized, &two_stages()),
            expected
        );
    }

    #[test]
    fn starting_a_hook_makes_every_stage_pending_and_not_ready() {
        let mut a = addon("", "docker-ferrol-1-27-v1", &[StagePhase::Done, StagePhase::Done]);
        a.mark_true(condition::HELM_CHART_APPLIED);
        a.status.as_mut().unwrap().ready = true;
        start(&mut a, Hook::BeforeClusterUpgrade, &two_stages());
        assert_eq!(a.spec.hook, "BeforeClusterUpgrade");
        let status = a.status.clone().unwrap();
        assert!(!status.ready);
        assert!(status.stages.iter().all(|s| s.phase == StagePhase::Pending));
        assert!(a.get_condition(condition::HELM_CHART_APPLIED).is_none());
        assert_eq!(
            next_step(&a, Hook::BeforeClusterUpgrade, &two_stages()),
            StageStep::CheckPre(0)
        );
    }

    #[rstest]
    #[case::pre_holds(true, Check::Holds, StagePhase::ApplyingOrDeleting, Flow::Continue, None)]
    #[case::post_holds(false, Check::Holds, StagePhase::Done, Flow::Continue, None)]
    #[case::pre_waits(
        true,
        Check::Waiting("no object".into()),
        StagePhase::WaitingForPreCondition,
        Flow::Wait,
        Some(reason::FAILED_TO_EVALUATE_PRE_CONDITION)
    )]
    #[case::post_waits(
        false,
        Check::Waiting("false".into()),
        StagePhase::WaitingForPostCondition,
        Flow::Wait,
        Some(reason::FAILED_TO_EVALUATE_POST_CONDITION)
    )]
    fn a_condition_moves_the_stage_on_or_holds_it(
        #[case] pre: bool,
        #[case] check: Check,
        #[case] phase: StagePhase,
        #[case] flow: Flow,
        #[case] condition_reason: Option<&str>,
    ) {
        let before = if pre {
            StagePhase::Pending
        } else {
            StagePhase::WaitingForPostCondition
        };
        let mut a = addon("AfterControlPlaneInitialized", "", &[before, StagePhase::Pending]);
        let mut events = Events::default();
        assert_eq!(after_check(&mut a, 0, pre, check, &mut events), flow);
        assert_eq!(a.status.as_ref().unwrap().stages[0].phase, phase);
        assert_eq!(
            a.get_condition(condition::EVALUATED_CEL)
                .and_then(|c| c.reason.as_deref()),
            condition_reason
        );
        assert!(events.0.is_empty(), "waiting is not news");
    }

    #[test]
    fn a_condition_that_cannot_be_evaluated_fails_the_stage_once() {
        let mut a = addon(
            "AfterControlPlaneInitialized",
            "",
            &[StagePhase::Pending, StagePhase::Pending],
        );
        let mut events = Events::default();
        let broken = || Check::Broken("undeclared reference to 'x'".into());
        assert!(
            matches!(after_check(&mut a, 0, true, broken(), &mut events), Flow::Fail(m) if m.contains("pre condition of stage \"ngnix\""))
        );
        after_check(&mut a, 0, true, broken(), &mut events);
        assert_eq!(
            events.reasons(),
            [event::STAGE_FAILED],
            "one event for the same problem"
        );
        assert_eq!(
            a.status.as_ref().unwrap().stages[0].phase,
            StagePhase::Pending,
            "never counted as done"
        );
        let cel = a.get_condition(condition::EVALUATED_CEL).unwrap();
        assert_eq!(
            (cel.status, cel.severity),
            (ConditionStatus::False, Some(Severity::Error))
        );
    }

    #[rstest]
    #[case::chart_missing(
        StageWork::ChartMissing,
        condition::HELM_CHART_FOUND,
        reason::HELM_CHART_MISSING
    )]
    #[case::not_rendered(
        StageWork::NotRendered(reason::TEMPLATE_NEW_CLUSTER_STACK_FAILED, "parse error".into()),
        condition::HELM_CHART_TEMPLATED,
        reason::TEMPLATE_NEW_CLUSTER_STACK_FAILED
    )]
    #[case::apply_failed(
        StageWork::Applied { resources: vec![resource("ConfigMap", "kube-system", "a")], failures: Some("denied".into()) },
        condition::HELM_CHART_APPLIED,
        reason::FAILED_TO_APPLY_OBJECTS
    )]
    #[case::held(
        StageWork::Held { resources: vec![resource("ConfigMap", "kube-system", "a")], why: "held: the render has no objects".into() },
        condition::HELM_CHART_APPLIED,
        reason::PRUNE_HELD
    )]
    #[case::delete_failed(
        StageWork::Deleted { targets: vec![], failures: Some("forbidden".into()) },
        condition::HELM_CHART_DELETED,
        reason::FAILED_TO_DELETE_OBJECTS
    )]
    fn a_failing_stage_is_reported_and_stays_where_it_was(
        #[case] work: StageWork,
        #[case] condition_type: &str,
        #[case] expected_reason: &str,
    ) {
        let mut a = addon(
            "AfterControlPlaneInitialized",
            "",
            &[StagePhase::ApplyingOrDeleting, StagePhase::Pending],
        );
        let mut inventory = StageInventory::new();
        let mut events = Events::default();
        let flow = work_on_first_stage(&mut a, &two_stages()[0], work, &mut inventory, true, &mut events);
        assert!(matches!(flow, Flow::Fail(_)));
        assert_eq!(
            a.get_condition(condition_type).and_then(|c| c.reason.as_deref()),
            Some(expected_reason)
        );
        assert_eq!(events.reasons(), [event::STAGE_FAILED]);
        assert_eq!(
            a.status.as_ref().unwrap().stages[0].phase,
            StagePhase::ApplyingOrDeleting
        );
    }

    #[test]
    fn an_applied_stage_records_its_inventory_and_waits_for_its_post_condition() {
        let mut a = addon(
            "AfterControlPlaneInitialized",
            "",
            &[StagePhase::ApplyingOrDeleting, StagePhase::Pending],
        );
        a.mark_false(
            condition::HELM_CHART_TEMPLATED,
            "x",
            Severity::Error,
            "old failure",
        );
        let mut inventory =
            StageInventory::from([("other".to_owned(), vec![resource("Secret", "kube-system", "s")])]);
        let mut events = Events::default();
        let work = StageWork::Applied {
            resources: vec![resource("ConfigMap", "kube-system", "a")],
            failures: None,
        };
        let flow = work_on_first_stage(&mut a, &two_stages()[0], work, &mut inventory, true, &mut events);
        assert_eq!(flow, Flow::Continue);
        assert_eq!(
            a.status.as_ref().unwrap().stages[0].phase,
            StagePhase::WaitingForPostCondition
        );
        assert_eq!(
            a.status.as_ref().unwrap().resources.len(),
            2,
            "every stage's objects"
        );
        assert!(
            a.get_condition(condition::HELM_CHART_TEMPLATED).is_none(),
            "the old failure is over"
        );
        assert!(events.0.is_empty());
    }

    #[test]
    fn a_reapply_moves_no_stage_and_announces_no_failure() {
        let mut a = addon("", "docker-ferrol-1-27-v1", &[]);
        let mut inventory = StageInventory::new();
        let mut events = Events::default();
        let work = StageWork::Applied {
            resources: vec![],
            failures: Some("denied".into()),
        };
        let flow = work_on_first_stage(&mut a, &two_stages()[0], work, &mut inventory, false, &mut events);
        assert!(matches!(flow, Flow::Fail(_)));
        assert!(events.0.is_empty());
    }

    /// A chart renamed (`csi` to `csi-v2`) or an object moved to another chart: the release still applies
    /// them, so the gone chart's deletion leaves them.
    #[test]
    fn a_gone_chart_deletes_only_what_no_other_chart_applies() {
        let inventory = StageInventory::from([
            (
                "csi".to_owned(),
                vec![
                    resource("Deployment", "kube-system", "csi-controller"),
                    resource("ConfigMap", "", "csi-config"),
                    resource("Secret", "kube-system", "old-only"),
                ],
            ),
            (
                "csi-v2".to_owned(),
                vec![
                    resource("Deployment", "kube-system", "csi-controller"),
                    resource("ConfigMap", "kube-system", "csi-config"),
                ],
            ),
        ]);
        let names: Vec<cso_api::atom::Atom> = gone_chart_objects(&inventory, "csi", "kube-system")
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, ["old-only"]);
        assert!(gone_chart_objects(&inventory, "not-there", "kube-system").is_empty());
    }

    #[test]
    fn a_delete_stage_drops_the_deleted_objects_from_every_stage_record() {
        let mut a = addon(
            "BeforeClusterUpgrade",
            "",
            &[StagePhase::ApplyingOrDeleting, StagePhase::Pending],
        );
        let mut inventory = StageInventory::from([
            (
                "ngnix".to_owned(),
                vec![
                    resource("Deployment", "kube-system", "web"),
                    resource("Service", "kube-system", "web"),
                ],
            ),
            (
                "metrics-server".to_owned(),
                vec![resource("Deployment", "monitoring", "web")],
            ),
        ]);
        let mut events = Events::default();
        // The chart renders the Deployment without a namespace: the default one is meant.
        let work = StageWork::Deleted {
            targets: vec![resource("Deployment", "", "web")],
            failures: None,
        };
        let delete = stage("ngnix", StageAction::Delete);
        let flow = work_on_first_stage(&mut a, &delete, work, &mut inventory, true, &mut events);
        assert_eq!(flow, Flow::Continue);
        assert_eq!(inventory["ngnix"], [resource("Service", "kube-system", "web")]);
        assert_eq!(
            inventory["metrics-server"],
            [resource("Deployment", "monitoring", "web")],
            "a same-named object of another namespace is not the one deleted"
        );
    }

    #[rstest]
    #[case::same(
        resource("Secret", "kube-system", "s"),
        resource("Secret", "kube-system", "s"),
        true
    )]
    #[case::default_namespace(resource("Secret", "", "s"), resource("Secret", "kube-system", "s"), true)]
    #[case::cluster_scoped(resource("ClusterRole", "", "r"), resource("ClusterRole", "", "r"), true)]
    #[case::other_namespace(resource("Secret", "", "s"), resource("Secret", "monitoring", "s"), false)]
    #[case::other_kind(
        resource("ConfigMap", "kube-system", "s"),
        resource("Secret", "kube-system", "s"),
        false
    )]
    #[case::other_name(
        resource("Secret", "kube-system", "t"),
        resource("Secret", "kube-system", "s"),
        false
    )]
    fn object_identity_of_a_rendered_target(
        #[case] target: Resource,
        #[case] record: Resource,
        #[case] same: bool,
    ) {
        assert_eq!(names_same_object(&target, &record, "kube-system"), same);
    }

    #[test]
    fn charts_the_release_no_longer_has_are_found_and_their_failure_reported() {
        let inventory = StageInventory::from([
            ("ngnix".to_owned(), vec![resource("Secret", "kube-system", "s")]),
            ("old-csi".to_owned(), vec![resource("Secret", "kube-system", "t")]),
        ]);
        let remaining: BTreeSet<&str> = ["ngnix", "metrics-server"].into();
        assert_eq!(charts_gone(&inventory, &remaining), ["old-csi"]);
        let mut a = addon("", "", &[]);
        let mut events = Events::default();
        assert!(
            matches!(after_gone_chart_failed(&mut a, "old-csi", "forbidden", &mut events), Flow::Fail(m) if m == "stage old-csi of the old release: forbidden")
        );
        assert_eq!(events.reasons(), [event::FAILED_TO_DELETE_OBJECTS]);
    }

    #[rstest]
    #[case::install(Hook::AfterControlPlaneInitialized, Some("created"))]
    #[case::upgrade(Hook::BeforeClusterUpgrade, Some("upgraded"))]
    #[case::upgrade_step(Hook::AfterControlPlaneUpgrade, Some("upgraded"))]
    #[case::after_upgrade(Hook::AfterClusterUpgrade, Some("upgraded"))]
    #[case::deletion(Hook::BeforeClusterDelete, None)]
    fn a_finished_hook_is_ready_and_recorded(#[case] hook: Hook, #[case] stage: Option<&'static str>) {
        let mut a = addon(hook.as_str(), "", &[StagePhase::Done, StagePhase::Done]);
        a.mark_false(condition::HELM_CHART_DELETED, "x", Severity::Warning, "old");
        let inventory =
            StageInventory::from([("ngnix".to_owned(), vec![resource("Secret", "kube-system", "s")])]);
        assert_eq!(finish(&mut a, hook, &inventory, false), Finished::Applied(stage));
        let status = a.status.clone().unwrap();
        assert!(status.ready && status.stages.is_empty());
        assert_eq!(status.resources.len(), 1);
        assert!(a.is_condition_true(condition::HELM_CHART_APPLIED));
        assert!(a.get_condition(condition::HELM_CHART_DELETED).is_none());
    }

    /// A stage held and given up at its timeout ends the hook, but the addons are not applied.
    #[test]
    fn a_hook_whose_stage_was_held_finishes_not_ready() {
        let hook = Hook::BeforeClusterUpgrade;
        let mut a = addon(hook.as_str(), "", &[StagePhase::Done, StagePhase::Done]);
        a.mark_false(
            condition::HELM_CHART_APPLIED,
            reason::PRUNE_HELD,
            Severity::Warning,
            "held",
        );
        let inventory =
            StageInventory::from([("ngnix".to_owned(), vec![resource("Secret", "kube-system", "s")])]);
        assert_eq!(finish(&mut a, hook, &inventory, false), Finished::Held);
        let status = a.status.clone().unwrap();
        assert!(!status.ready && status.stages.is_empty());
        assert_eq!(status.resources.len(), 1, "the inventory is kept");
        assert_eq!(
            a.get_condition(condition::HELM_CHART_APPLIED)
                .and_then(|c| c.reason.clone()),
            Some(reason::PRUNE_HELD.to_owned())
        );
    }

    #[rstest]
    #[case::pre_condition(StagePhase::WaitingForPreCondition, "its pre-condition")]
    #[case::apply(StagePhase::ApplyingOrDeleting, "its objects to be applied or deleted")]
    #[case::post_condition(StagePhase::WaitingForPostCondition, "its post-condition")]
    fn a_stage_past_its_timeout_is_given_up_with_a_warning_and_the_hook_goes_on(
        #[case] phase: StagePhase,
        #[case] waiting_for: &str,
    ) {
        let mut a = addon(
            "AfterClusterUpgrade",
            "docker-ferrol-1-27-v1",
            &[phase, StagePhase::Pending],
        );
        let mut events = Events::default();
        let flow = give_up(
            &mut a,
            Hook::AfterClusterUpgrade,
            0,
            std::time::Duration::from_secs(90),
            &mut events,
        );
        assert_eq!(flow, Flow::Continue);
        let message = format!(
            "stage \"ngnix\" of AfterClusterUpgrade did not finish within 1m30s (waiting for {waiting_for}); \
             given up so that the Cluster can go on"
        );
        let condition = a.get_condition(condition::HOOK_STAGES_COMPLETED).unwrap();
        assert_eq!(condition.status, ConditionStatus::False);
        assert_eq!(condition.reason.as_deref(), Some(reason::STAGE_TIMED_OUT));
        assert_eq!(condition.message.as_deref(), Some(message.as_str()));
        assert_eq!(
            events.0,
            [crate::events::Pending {
                kind: Kind::Warning,
                reason: event::STAGE_TIMED_OUT,
                note: message.clone(),
            }]
        );
        // The stage counts as done: the next step is the next stage's pre-condition.
        assert_eq!(
            next_step(&a, Hook::AfterClusterUpgrade, &two_stages()),
            StageStep::CheckPre(1)
        );
        // A new run of the hook starts without the warning.
        start(&mut a, Hook::AfterClusterUpgrade, &two_stages());
        assert!(a.get_condition(condition::HOOK_STAGES_COMPLETED).is_none());
    }
}
