//! The ClusterAddon's decisions (pure): which step comes next, given what the reconcile has seen and done
//! so far ([`next_step`]), and what that means for the status, the spec fields we record, the events and
//! the retry ([`conclude`]). Multi-stage releases continue in [`super::stages`] after the common prefix
//! (Cluster, workload cluster, release).

use std::time::Duration;

use cso_api::{
    ClusterAddon, ClusterAddonStatus, ReleaseId,
    cluster_addon::STAGE_ANNOTATION,
    conditions::{ConditionsExt, Severity},
    inventory::Inventory,
    names::{condition, event, reason},
};
use cso_apply::ApplyReport;
use kube::ResourceExt;

use super::{
    decision::{Decision, decide},
    health::{self, Found},
    inputs::Inputs,
};
use crate::{
    cluster_stack_release::FetchFailure,
    events::{Events, Kind},
};

/// What the reconcile knows, filled in step by step.
#[derive(Clone, Debug, Default)]
pub(crate) struct Progress {
    pub(crate) cluster: ClusterState,
    pub(crate) workload: WorkloadState,
    pub(crate) release: ReleaseState,
    /// The periodic pass is due.
    pub(crate) resync_due: bool,
    /// What the workload cluster's drift watches tell about the applied objects.
    pub(crate) drift: Drift,
    /// Every drifted object is held: put back too often lately (see [`super::fights`]), not yet again.
    pub(crate) drift_held: bool,
    /// What the values templates give now, against what the applied addons were rendered from.
    pub(crate) inputs: Inputs,
    /// How many objects the addon chart rendered, or the `HelmChartTemplated` reason and message.
    pub(crate) rendered: Option<Result<usize, (&'static str, String)>>,
    pub(crate) applied: Option<ApplyReport>,
    /// Health gates are on (`--addon-health-checks`): ready means running, not only applied.
    pub(crate) health_gates: bool,
    /// What the health check of the applied objects found, if one ran.
    pub(crate) health: Option<Found>,
    /// When the reconcile started.
    pub(crate) now: chrono::DateTime<chrono::Utc>,
}

/// What the drift watches of the workload cluster tell about the objects of the inventory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Drift {
    /// Cannot be told (no watch yet, not listed yet, or not applied by this process).
    #[default]
    Unknown,
    /// Every object is as our last apply left it.
    None,
    /// An object is gone or was changed by someone else.
    Found,
    /// An object is gone or was changed by someone else, and others cannot be told.
    FoundInPart,
}

impl Progress {
    /// Whether the applied addons are to be rendered and applied again: the values templates give other
    /// values than they were rendered from, drift was found (and not every drifted object is held by its
    /// back-off, see [`super::fights`]), or the periodic pass is due and the watches cannot vouch for the
    /// objects. With the watches vouching, the periodic pass writes nothing.
    pub(crate) fn reapply_due(&self) -> bool {
        if self.inputs.changed() {
            return true;
        }
        match self.drift {
            Drift::Found => !self.drift_held,
            // What cannot be told is re-applied at the periodic pass, held drift or not.
            Drift::FoundInPart => !self.drift_held || self.resync_due,
            Drift::None => false,
            Drift::Unknown => self.resync_due,
        }
    }

    /// Whether a re-apply is due only because the periodic pass is: the values give what the addons were
    /// rendered from and the drift watches cannot tell whether anything changed (not applied in this process
    /// yet, after a restart or a `clusterctl move`; a watch not listed yet). Such a pass reads each object
    /// and writes only what an apply would change (`ApplyEngine::apply_checking`): nothing, when the objects
    /// are as applied.
    pub(crate) fn only_the_clock(&self) -> bool {
        self.resync_due && !self.inputs.changed() && self.drift == Drift::Unknown
    }
}

/// The Cluster of the ClusterAddon.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum ClusterState {
    #[default]
    Unknown,
    /// Gone: its ClusterAddon goes with it (owner reference).
    Gone,
    /// Its class is not a cluster stack's.
    NotOurs { cluster: String },
    /// It uses the class of this release.
    Uses(ReleaseId),
}

/// The workload cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum WorkloadState {
    #[default]
    Unknown,
    /// Cluster API has not set the Cluster's `spec.controlPlaneEndpoint` yet: normal in a new Cluster's first
    /// seconds. There is no control plane to reach before it, and values templates read it
    /// (`.Cluster.spec.controlPlaneEndpoint.host`), so nothing is templated until it is there.
    NoEndpoint,
    /// No (usable) kubeconfig Secret yet.
    NoKubeconfig(String),
    /// The API server does not answer `/readyz` yet.
    NotReady(String),
    Ready,
}

/// Whether Cluster API has set the Cluster's control-plane endpoint (a host; the port may be defaulted).
pub(crate) fn has_control_plane_endpoint(cluster: &cso_api::capi::Cluster) -> bool {
    cluster
        .spec
        .control_plane_endpoint
        .as_ref()
        .is_some_and(|endpoint| !endpoint.host.is_empty())
}

/// The release of the Cluster's class.
#[derive(Clone, Debug, Default)]
pub(crate) enum ReleaseState {
    #[default]
    Unknown,
    Failed {
        failure: FetchFailure,
        message: String,
    },
    /// Its addon version (dash form), and whether it has stages (`clusteraddon.yaml`).
    Ready {
        addon_version: String,
        staged: bool,
    },
}

/// What the driver does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    ReadCluster,
    ConnectWorkload,
    FetchRelease,
    /// Template the release's values files over the Cluster's data (see [`super::inputs`]).
    TemplateValues,
    Render,
    /// Apply the render; `checking`: the pass only looks for drift nobody told of
    /// ([`Progress::only_the_clock`]), so each object is read first and only what differs is written.
    Apply {
        checking: bool,
    },
    /// Read the applied objects with a health rule (see [`super::health`]); `settle`: running workloads count
    /// only once their containers have stayed up (`--addon-settle-time`, [`health::settling`]).
    CheckHealth {
        settle: bool,
    },
    /// A multi-stage release: the stage machine takes over with this decision.
    RunStages(Decision),
    Conclude,
}

/// Whether the addons of `target` (addon version `addon_version`) must be rendered and applied.
pub(crate) fn decision(
    addon: &ClusterAddon,
    target: &ReleaseId,
    addon_version: &str,
    reapply_due: bool,
) -> Decision {
    let applied = cso_api::rules::AppliedAddons::recorded(&addon.spec.cluster_stack, &addon.spec.version);
    let complete = addon.is_condition_true(condition::HELM_CHART_APPLIED);
    decide(&applied, target, addon_version, complete, reapply_due)
}

/// The next step, from what is known so far.
pub(crate) fn next_step(progress: &Progress, addon: &ClusterAddon) -> Step {
    let target = match &progress.cluster {
        ClusterState::Unknown => return Step::ReadCluster,
        ClusterState::Gone | ClusterState::NotOurs { .. } => return Step::Conclude,
        ClusterState::Uses(target) => target,
    };
    match &progress.workload {
        WorkloadState::Unknown => return Step::ConnectWorkload,
        WorkloadState::NoEndpoint | WorkloadState::NoKubeconfig(_) | WorkloadState::NotReady(_) => {
            return Step::Conclude;
        }
        WorkloadState::Ready => {}
    }
    let (addon_version, staged) = match &progress.release {
        ReleaseState::Unknown => return Step::FetchRelease,
        ReleaseState::Failed { .. } => return Step::Conclude,
        ReleaseState::Ready {
            addon_version,
            staged,
        } => (addon_version, *staged),
    };
    // A hook's stages under way render their own values; otherwise the values tell whether the inputs changed.
    let hook_running = staged && !addon.spec.hook.is_empty();
    if progress.inputs == Inputs::Unknown && !hook_running {
        return Step::TemplateValues;
    }
    let decision = decision(addon, target, addon_version, progress.reapply_due());
    if matches!(progress.inputs, Inputs::Failed { .. }) && decision != Decision::RecordOnly {
        // Nothing can be rendered; settled addons stay as they are (a Cluster being deleted loses its
        // infrastructure cluster first).
        return Step::Conclude;
    }
    let check_settled = decision == Decision::RecordOnly
        && progress.health.is_none()
        && !hook_running
        && health::due_when_settled(addon, progress.health_gates, progress.resync_due);
    if check_settled {
        return Step::CheckHealth {
            settle: health::settling(addon, false),
        };
    }
    if staged {
        return Step::RunStages(decision);
    }
    match (decision, &progress.rendered, &progress.applied) {
        (Decision::RecordOnly, _, _) => Step::Conclude,
        (Decision::Apply { .. }, None, _) => Step::Render,
        (Decision::Apply { upgrade }, Some(Ok(_)), None) => Step::Apply {
            checking: !upgrade && progress.only_the_clock(),
        },
        (Decision::Apply { upgrade }, Some(Ok(_)), Some(report))
            if report.is_complete() && progress.health_gates && progress.health.is_none() =>
        {
            Step::CheckHealth {
                settle: health::settling(addon, applies_anew(addon, upgrade)),
            }
        }
        _ => Step::Conclude,
    }
}

/// Whether a complete apply installs or upgrades the addons, so that a wait for them to run starts: the first
/// complete apply, or other addons than those applied (a re-apply of the same addons, a drift correction, a
/// class switch with the same addons starts none).
fn applies_anew(addon: &ClusterAddon, upgrade: bool) -> bool {
    upgrade || !addon.is_condition_true(condition::HELM_CHART_APPLIED)
}

/// The spec fields and the stage annotation a reconcile records (the Go operator's fields, written after
/// the fact). `None` leaves a field as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SpecUpdate {
    pub(crate) cluster_stack: Option<String>,
    pub(crate) version: Option<String>,
    /// `Some("")` clears `spec.hook`.
    pub(crate) hook: Option<String>,
    pub(crate) stage: Option<&'static str>,
    /// The digest of the values the addons found applied were rendered from (see [`super::inputs`]).
    pub(crate) inputs: Option<String>,
}

/// How the reconcile ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Requeue(Option<Duration>),
    /// Reported in the conditions; try again with backoff.
    Retry(String),
}

/// What a reconcile concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Conclusion {
    pub(crate) events: Events,
    pub(crate) spec: SpecUpdate,
    pub(crate) outcome: Outcome,
    /// Every object of the release was applied now: the next full re-apply is a resync interval away.
    pub(crate) applied_all: bool,
}

impl Conclusion {
    fn new(outcome: Outcome) -> Self {
        Conclusion {
            events: Events::default(),
            spec: SpecUpdate::default(),
            outcome,
            applied_all: false,
        }
    }
}

/// How long a workload control plane may not answer before its Cluster counts as failing (`ControlPlaneNotReady`
/// turns from Info to Warning): longer than a machine takes to be made, on bare metal too.
pub(crate) const CONTROL_PLANE_FAILING_AFTER: Duration = Duration::from_secs(30 * 60);

/// How long to wait: for the workload cluster to answer, and between re-applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Intervals {
    pub(crate) workload_retry: Duration,
    pub(crate) resync: Duration,
    /// How long applied addons are waited for to run (`--stage-timeout`).
    pub(crate) health_timeout: Duration,
}

fn status_of(addon: &mut ClusterAddon) -> &mut ClusterAddonStatus {
    addon.status.get_or_insert_with(Default::default)
}

/// The common prefix (Cluster, workload cluster, release) into `addon`'s conditions: the conclusion when
/// the reconcile ends there, `None` when it goes on.
pub(crate) fn conclude_prefix(
    progress: &Progress,
    addon: &mut ClusterAddon,
    intervals: Intervals,
) -> Option<Conclusion> {
    match &progress.cluster {
        ClusterState::Unknown | ClusterState::Gone => return Some(Conclusion::new(Outcome::Requeue(None))),
        ClusterState::NotOurs { cluster } => {
            addon.mark_false(
                condition::CLUSTER_READY,
                reason::NO_CLUSTER_STACK_CLASS,
                Severity::Warning,
                format!("Cluster {cluster} has no ClusterClass of a cluster stack"),
            );
            return Some(Conclusion::new(Outcome::Requeue(None)));
        }
        ClusterState::Uses(_) => {}
    }
    let waiting = Outcome::Requeue(Some(intervals.workload_retry));
    match &progress.workload {
        WorkloadState::Unknown => return Some(Conclusion::new(waiting)),
        WorkloadState::NoEndpoint => {
            // Not a failure (no Warning, no event): Cluster API sets it once the infrastructure is provisioned.
            addon.mark_false(
                condition::CLUSTER_READY,
                reason::CONTROL_PLANE_NOT_READY,
                Severity::Info,
                "waiting for Cluster API to set the Cluster's control-plane endpoint (spec.controlPlaneEndpoint)",
            );
            return Some(Conclusion::new(waiting));
        }
        WorkloadState::NoKubeconfig(error) => {
            addon.mark_false(
                condition::CLUSTER_READY,
                reason::CONTROL_PLANE_NOT_READY,
                Severity::Warning,
                format!("kubeconfig not there (yet): {error}"),
            );
            return Some(Conclusion::new(waiting));
        }
        WorkloadState::NotReady(error) => {
            // A control plane being made does not answer for a while (bare metal: half an hour); one that has
            // not answered for longer than that is failing, and counted so. Timed from when it first did not
            // answer, whatever the errors said since.
            let since = addon.reason_since(condition::CLUSTER_READY, reason::CONTROL_PLANE_NOT_READY);
            let silent_for = since.and_then(|since| (progress.now - since).to_std().ok());
            let (severity, message) = match silent_for {
                Some(long) if long >= CONTROL_PLANE_FAILING_AFTER => (
                    Severity::Warning,
                    format!(
                        "control plane not ready for more than {} minutes: {error}",
                        CONTROL_PLANE_FAILING_AFTER.as_secs() / 60
                    ),
                ),
                _ => (Severity::Info, format!("control plane not ready yet: {error}")),
            };
            addon.mark_false(
                condition::CLUSTER_READY,
                reason::CONTROL_PLANE_NOT_READY,
                severity,
                message,
            );
            if let Some(since) = since {
                addon.keep_transition(condition::CLUSTER_READY, since);
            }
            return Some(Conclusion::new(waiting));
        }
        WorkloadState::Ready => addon.mark_true(condition::CLUSTER_READY),
    }
    match &progress.release {
        ReleaseState::Unknown => Some(Conclusion::new(Outcome::Retry(
            "the release was not fetched".into(),
        ))),
        ReleaseState::Failed { failure, message } => {
            let mut conclusion = Conclusion::new(match failure.retry_after {
                Some(delay) => Outcome::Requeue(Some(delay)),
                None => Outcome::Retry(message.clone()),
            });
            conclusion.events.report_false(
                addon,
                (failure.condition, failure.reason, failure.severity),
                message,
                (Kind::Warning, failure.event),
            );
            Some(conclusion)
        }
        ReleaseState::Ready { .. } => {
            addon.mark_true(condition::CLUSTER_STACK_RELEASE_DOWNLOADED);
            // A refusal seen on the way is over (its ClusterStackRelease keeps the verification's record).
            addon.delete_condition(condition::RELEASE_VERIFIED);
            None
        }
    }
}

/// The addons could not be rendered (`reason`: why, the `HelmChartTemplated` reason): reported, retried
/// with backoff; what is applied stays as it is.
fn not_templated(addon: &mut ClusterAddon, reason: &'static str, message: &str) -> Conclusion {
    let mut conclusion = Conclusion::new(Outcome::Retry(message.to_owned()));
    conclusion.events.report_false(
        addon,
        (condition::HELM_CHART_TEMPLATED, reason, Severity::Error),
        message,
        (Kind::Warning, reason),
    );
    conclusion
}

/// Single-chart releases: the whole reconcile, into `addon`'s status and conditions; for multi-stage
/// releases, a values file that does not template before any stage runs.
pub(crate) fn conclude(progress: &Progress, addon: &mut ClusterAddon, intervals: Intervals) -> Conclusion {
    if let Some(conclusion) = conclude_prefix(progress, addon, intervals) {
        return conclusion;
    }
    let (ClusterState::Uses(target), ReleaseState::Ready { addon_version, .. }) =
        (&progress.cluster, &progress.release)
    else {
        return Conclusion::new(Outcome::Retry("the release is not known".into()));
    };
    let decided = decision(addon, target, addon_version, progress.reapply_due());
    if let Inputs::Failed { reason, message } = &progress.inputs
        && decided != Decision::RecordOnly
    {
        return not_templated(addon, reason, message);
    }
    let resynced = Outcome::Requeue(Some(intervals.resync));
    let upgrade = match decided {
        Decision::RecordOnly => {
            // Same addons as applied: a class switch is recorded, nothing is rendered or applied. A hook set by
            // the hook server is done too (the Go operator never finishes it: upgrades hang).
            let mut conclusion = Conclusion::new(resynced);
            conclusion.spec.cluster_stack = Some(target.cluster_class_name());
            conclusion.spec.hook = Some(String::new());
            // Addons applied before digests were recorded adopt the current one (see `super::inputs`).
            conclusion.spec.inputs = progress.inputs.digest().map(str::to_owned);
            set_ready(progress, addon, false, intervals, &mut conclusion);
            return conclusion;
        }
        Decision::Apply { upgrade } => upgrade,
    };
    if upgrade {
        status_of(addon).ready = false;
    }
    match &progress.rendered {
        None => return Conclusion::new(Outcome::Retry("the addon chart was not rendered".into())),
        Some(Err((reason, message))) => return not_templated(addon, reason, message),
        Some(Ok(_)) => addon.delete_condition(condition::HELM_CHART_TEMPLATED),
    }
    let Some(report) = &progress.applied else {
        return Conclusion::new(Outcome::Retry("the addons were not applied".into()));
    };
    status_of(addon).resources = Inventory::of(&report.resources);
    if !report.is_complete() {
        let message = report.failure_summary();
        let (reason, event) = match report.held {
            Some(_) => (reason::PRUNE_HELD, event::PRUNE_HELD),
            None => (reason::FAILED_TO_APPLY_OBJECTS, event::FAILED_TO_APPLY_OBJECTS),
        };
        let mut conclusion = Conclusion::new(Outcome::Retry(message.clone()));
        conclusion.events.report_false(
            addon,
            (condition::HELM_CHART_APPLIED, reason, Severity::Warning),
            &message,
            (Kind::Warning, event),
        );
        return conclusion;
    }
    let mut conclusion = Conclusion::new(resynced);
    conclusion.applied_all = true;
    let anew = applies_anew(addon, upgrade);
    addon.mark_true(condition::HELM_CHART_APPLIED);
    set_ready(progress, addon, anew, intervals, &mut conclusion);
    if anew {
        conclusion.events.normal(
            event::CLUSTER_ADDON_APPLIED,
            format!(
                "applied the addons of {} ({} objects, {} pruned)",
                target.cluster_class_name(),
                report.applied,
                report.pruned.len()
            ),
        );
    }
    // Recorded once the work is done (the Go operator records intent before it).
    let installed = !addon.spec.cluster_stack.is_empty();
    conclusion.spec = SpecUpdate {
        cluster_stack: Some(target.cluster_class_name()),
        version: Some(addon_version.clone()),
        hook: Some(String::new()),
        stage: stage_after_apply(addon, installed, upgrade),
        inputs: progress.inputs.digest().map(str::to_owned),
    };
    conclusion
}

/// Sets `status.ready` of applied addons: whether they run, as far as this reconcile can tell, recorded in
/// `AddonsHealthy`; the conclusion comes back sooner while they do not. Without health gates, applied is
/// running. Not checked now (a settled addon between its periodic passes): as the last check found.
pub(crate) fn set_ready(
    progress: &Progress,
    addon: &mut ClusterAddon,
    applied_anew: bool,
    intervals: Intervals,
    conclusion: &mut Conclusion,
) {
    let running = running(progress, addon, applied_anew, intervals, conclusion);
    status_of(addon).ready = running;
}

fn running(
    progress: &Progress,
    addon: &mut ClusterAddon,
    applied_anew: bool,
    intervals: Intervals,
    conclusion: &mut Conclusion,
) -> bool {
    if !progress.health_gates {
        addon.delete_condition(condition::ADDONS_HEALTHY);
        return true;
    }
    let Some(found) = &progress.health else {
        return addon.is_condition_true(condition::ADDONS_HEALTHY);
    };
    let verdict = health::record(
        addon,
        found,
        applied_anew,
        progress.now,
        intervals.health_timeout,
        &mut conclusion.events,
    );
    if let (Some(again), Outcome::Requeue(Some(later))) = (verdict.again, &mut conclusion.outcome) {
        *later = (*later).min(again);
    }
    verdict.running
}

/// The `ClusterAddonStage` annotation after a complete apply: `created` after the first install, `upgraded`
/// after an upgrade; a re-apply of the same addons (drift correction) leaves it as it is (it once flipped
/// an `upgraded` back to `created` at the first resync after an upgrade).
pub(crate) fn stage_after_apply(
    addon: &ClusterAddon,
    installed: bool,
    upgrade: bool,
) -> Option<&'static str> {
    match (installed, upgrade) {
        (true, true) => Some("upgraded"),
        (false, _) => Some("created"),
        (true, false) if addon.annotations().contains_key(STAGE_ANNOTATION) => None,
        (true, false) => Some("created"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use cso_api::{common::Resource, conditions::ConditionStatus};
    use cso_apply::{Failure, ObjectKey};
    use rstest::rstest;
    use serde_json::json;

    use super::*;
    use crate::cluster_addon::decision::Decision;

    const INTERVALS: Intervals = Intervals {
        workload_retry: Duration::from_secs(10),
        resync: Duration::from_secs(300),
        health_timeout: Duration::from_secs(600),
    };

    fn id(tag: &str) -> ReleaseId {
        ReleaseId::parse_tag(tag).unwrap()
    }

    /// A ClusterAddon that applied `class` (dot form) with addon version `version` (empty: never installed).
    fn addon(class: &str, version: &str, complete: bool) -> ClusterAddon {
        let mut addon = ClusterAddon::new("cluster-addon-c1", Default::default());
        addon.spec.cluster_stack = class.into();
        addon.spec.version = version.into();
        if complete {
            addon.mark_true(condition::HELM_CHART_APPLIED);
        }
        addon
    }

    /// `addon` with its addons found running.
    fn running(mut addon: ClusterAddon) -> ClusterAddon {
        addon.mark_true(condition::ADDONS_HEALTHY);
        addon
    }

    /// The digest of the values the progress of [`ready`] templated.
    const DIGEST: &str = "sha256:0d";

    /// Progress up to a release `tag` with addon version `version`, its values templated as applied.
    fn ready(tag: &str, version: &str, staged: bool) -> Progress {
        Progress {
            cluster: ClusterState::Uses(id(tag)),
            workload: WorkloadState::Ready,
            release: ReleaseState::Ready {
                addon_version: version.into(),
                staged,
            },
            inputs: Inputs::templated(None, DIGEST.into()),
            ..Progress::default()
        }
    }

    fn report(failures: &[&str]) -> ApplyReport {
        ApplyReport {
            resources: vec![Resource {
                group: "apps".into(),
                version: "v1".into(),
                kind: "Deployment".into(),
                namespace: "kube-system".into(),
                name: "metrics-server".into(),
                ..Default::default()
            }],
            applied: 3,
            pruned: vec![ObjectKey {
                group: Default::default(),
                kind: "ConfigMap".into(),
                namespace: "kube-system".into(),
                name: "old".into(),
            }],
            failures: failures
                .iter()
                .map(|e| Failure {
                    key: ObjectKey {
                        group: "apps".into(),
                        kind: "Deployment".into(),
                        namespace: "kube-system".into(),
                        name: "web".into(),
                    },
                    error: (*e).into(),
                    lasting: false,
                })
                .collect(),
            ..Default::default()
        }
    }

    fn condition_of(addon: &ClusterAddon, type_: &str) -> Option<(ConditionStatus, Option<String>)> {
        addon.get_condition(type_).map(|c| (c.status, c.reason.clone()))
    }

    fn with(mut progress: Progress, f: impl FnOnce(&mut Progress)) -> Progress {
        f(&mut progress);
        progress
    }

    #[rstest]
    #[case::nothing_due(false, Drift::Unknown, false)]
    #[case::due_and_not_vouched_for(true, Drift::Unknown, true)]
    #[case::due_but_all_as_applied(true, Drift::None, false)]
    #[case::drift_before_the_pass(false, Drift::Found, true)]
    #[case::drift_and_due(true, Drift::Found, true)]
    #[case::drift_in_part(false, Drift::FoundInPart, true)]
    fn the_periodic_pass_reapplies_only_what_the_watches_cannot_vouch_for(
        #[case] resync_due: bool,
        #[case] drift: Drift,
        #[case] reapply: bool,
    ) {
        let progress = with(ready("docker-ferrol-1-27-v2", "v2", false), |p| {
            p.resync_due = resync_due;
            p.drift = drift;
        });
        assert_eq!(progress.reapply_due(), reapply);
        let expected = if reapply { Step::Render } else { Step::Conclude };
        assert_eq!(
            next_step(&progress, &addon("docker-ferrol-1-27-v2", "v2", true)),
            expected
        );
    }

    #[rstest]
    #[case::held_drift_waits(false, false, true, false)]
    #[case::held_drift_waits_for_the_pass_too(true, false, true, false)]
    #[case::drift_not_held(false, false, false, true)]
    #[case::other_values_while_held(false, true, true, true)]
    fn drift_of_objects_held_by_their_back_off_is_not_put_back_yet(
        #[case] resync_due: bool,
        #[case] values_changed: bool,
        #[case] held: bool,
        #[case] reapply: bool,
    ) {
        let progress = with(ready("docker-ferrol-1-27-v2", "v2", false), |p| {
            p.resync_due = resync_due;
            p.drift = Drift::Found;
            p.drift_held = held;
            if values_changed {
                p.inputs = Inputs::templated(Some("old"), "new".into());
            }
        });
        assert_eq!(progress.reapply_due(), reapply);
    }

    #[rstest]
    #[case::only_the_periodic_pass("v2", Drift::Unknown, false, true)]
    #[case::drift_told_of("v2", Drift::Found, false, false)]
    #[case::drift_told_of_in_part("v2", Drift::FoundInPart, false, false)]
    #[case::values_changed("v2", Drift::Unknown, true, false)]
    #[case::an_upgrade("v3", Drift::Unknown, false, false)]
    fn a_pass_only_the_clock_asked_for_reads_before_it_writes(
        #[case] addon_version: &str,
        #[case] drift: Drift,
        #[case] values_changed: bool,
        #[case] checking: bool,
    ) {
        let progress = with(ready("docker-ferrol-1-27-v3", addon_version, false), |p| {
            p.resync_due = true;
            p.drift = drift;
            p.rendered = Some(Ok(2));
            p.inputs = Inputs::Templated {
                digest: DIGEST.into(),
                changed: values_changed,
            };
        });
        assert_eq!(
            progress.only_the_clock(),
            !values_changed && drift == Drift::Unknown
        );
        assert_eq!(
            next_step(&progress, &addon("docker-ferrol-1-27-v2", "v2", true)),
            Step::Apply { checking }
        );
    }

    #[rstest]
    #[case::nothing_known(Progress::default(), Step::ReadCluster)]
    #[case::cluster_gone(Progress { cluster: ClusterState::Gone, ..Progress::default() }, Step::Conclude)]
    #[case::not_a_stack_class(
        Progress { cluster: ClusterState::NotOurs { cluster: "c1".into() }, ..Progress::default() },
        Step::Conclude
    )]
    #[case::workload_unknown(with(ready("docker-ferrol-1-27-v1", "v1", false), |p| p.workload = WorkloadState::Unknown), Step::ConnectWorkload)]
    #[case::no_endpoint_yet(
        with(ready("docker-ferrol-1-27-v1", "v1", false), |p| p.workload = WorkloadState::NoEndpoint),
        Step::Conclude
    )]
    #[case::no_kubeconfig(
        with(ready("docker-ferrol-1-27-v1", "v1", false), |p| p.workload = WorkloadState::NoKubeconfig("no Secret".into())),
        Step::Conclude
    )]
    #[case::not_ready(
        with(ready("docker-ferrol-1-27-v1", "v1", false), |p| p.workload = WorkloadState::NotReady("503".into())),
        Step::Conclude
    )]
    #[case::release_unknown(with(ready("docker-ferrol-1-27-v1", "v1", false), |p| p.release = ReleaseState::Unknown), Step::FetchRelease)]
    #[case::first_install_renders(ready("docker-ferrol-1-27-v1", "v1", false), Step::Render)]
    #[case::rendered_applies(with(ready("docker-ferrol-1-27-v1", "v1", false), |p| p.rendered = Some(Ok(2))), Step::Apply { checking: false })]
    #[case::render_failed(
        with(ready("docker-ferrol-1-27-v1", "v1", false), |p| p.rendered = Some(Err((reason::TEMPLATE_NEW_CLUSTER_STACK_FAILED, "x".into())))),
        Step::Conclude
    )]
    #[case::applied(
        with(ready("docker-ferrol-1-27-v1", "v1", false), |p| { p.rendered = Some(Ok(2)); p.applied = Some(report(&[])) }),
        Step::Conclude
    )]
    #[case::staged_first_install(ready("docker-ferrol-1-27-v1", "v1", true), Step::RunStages(Decision::Apply { upgrade: false }))]
    #[case::values_first(with(ready("docker-ferrol-1-27-v1", "v1", false), |p| p.inputs = Inputs::Unknown), Step::TemplateValues)]
    #[case::staged_values_first(with(ready("docker-ferrol-1-27-v1", "v1", true), |p| p.inputs = Inputs::Unknown), Step::TemplateValues)]
    #[case::values_failed(
        with(ready("docker-ferrol-1-27-v1", "v1", true), |p| p.inputs = Inputs::Failed { reason: reason::TEMPLATE_NEW_CLUSTER_STACK_OVERWRITE_FAILED, message: "x".into() }),
        Step::Conclude
    )]
    #[case::stage_charts_unavailable(
        with(ready("docker-ferrol-1-27-v1", "v1", true), |p| p.inputs = Inputs::Unavailable),
        Step::RunStages(Decision::Apply { upgrade: false })
    )]
    fn next_step_of_a_first_install(#[case] progress: Progress, #[case] expected: Step) {
        assert_eq!(next_step(&progress, &addon("", "", false)), expected);
    }

    #[rstest]
    #[case::same_addons_other_class("docker-ferrol-1-27-v3", "v2", false, Step::Conclude)]
    #[case::same_addons_resync_due("docker-ferrol-1-27-v3", "v2", true, Step::Render)]
    #[case::new_addon_version("docker-ferrol-1-27-v3", "v3", false, Step::Render)]
    #[case::new_kubernetes_minor("docker-ferrol-1-28-v1", "v2", false, Step::Render)]
    fn next_step_after_an_install(
        #[case] tag: &str,
        #[case] version: &str,
        #[case] due: bool,
        #[case] expected: Step,
    ) {
        let installed = addon("docker-ferrol-1-27-v2", "v2", true);
        let progress = with(ready(tag, version, false), |p| p.resync_due = due);
        assert_eq!(next_step(&progress, &installed), expected);
    }

    #[rstest]
    #[case::same_values(false, Step::Conclude, Step::RunStages(Decision::RecordOnly))]
    #[case::other_values(true, Step::Render, Step::RunStages(Decision::Apply { upgrade: false }))]
    fn changed_values_render_and_apply_the_same_release_again(
        #[case] changed: bool,
        #[case] single: Step,
        #[case] staged: Step,
    ) {
        let installed = addon("docker-ferrol-1-27-v2", "v2", true);
        for (is_staged, expected) in [(false, single), (true, staged)] {
            let progress = with(ready("docker-ferrol-1-27-v2", "v2", is_staged), |p| {
                p.drift = Drift::None;
                p.inputs = Inputs::Templated {
                    digest: DIGEST.into(),
                    changed,
                };
            });
            assert_eq!(progress.reapply_due(), changed);
            assert_eq!(next_step(&progress, &installed), expected);
        }
    }

    #[test]
    fn a_hook_under_way_renders_its_stages_own_values() {
        let mut running = addon("docker-ferrol-1-27-v2", "v2", true);
        running.spec.hook = "BeforeClusterUpgrade".into();
        let progress = with(ready("docker-ferrol-1-27-v3", "v3", true), |p| {
            p.inputs = Inputs::Unknown
        });
        assert_eq!(
            next_step(&progress, &running),
            Step::RunStages(Decision::Apply { upgrade: true })
        );
    }

    #[test]
    fn values_that_do_not_template_stop_an_upgrade_and_leave_settled_addons_alone() {
        let failed = |p: &mut Progress| {
            p.drift = Drift::None;
            p.inputs = Inputs::Failed {
                reason: reason::TEMPLATE_NEW_CLUSTER_STACK_OVERWRITE_FAILED,
                message: "the Cluster's infrastructure cluster (DockerCluster ns/c1) was not found".into(),
            };
        };
        // An upgrade cannot render: reported, retried, nothing recorded.
        let mut upgrading = addon("docker-ferrol-1-27-v1", "v1", true);
        let progress = with(ready("docker-ferrol-1-27-v2", "v2", false), failed);
        assert_eq!(next_step(&progress, &upgrading), Step::Conclude);
        let conclusion = conclude(&progress, &mut upgrading, INTERVALS);
        assert!(matches!(conclusion.outcome, Outcome::Retry(_)));
        assert_eq!(conclusion.spec, SpecUpdate::default());
        assert_eq!(
            condition_of(&upgrading, condition::HELM_CHART_TEMPLATED),
            Some((
                ConditionStatus::False,
                Some(reason::TEMPLATE_NEW_CLUSTER_STACK_OVERWRITE_FAILED.into())
            ))
        );
        // Settled addons (a Cluster being deleted loses its infrastructure cluster first): nothing to render,
        // nothing reported, their health still checked.
        let mut settled = addon("docker-ferrol-1-27-v2", "v2", true);
        settled.status.get_or_insert_with(Default::default).ready = true;
        let progress = with(gated("docker-ferrol-1-27-v2", "v2", false), failed);
        assert_eq!(next_step(&progress, &settled), Step::CheckHealth { settle: true });
        let progress = with(progress, |p| p.health = Some(Found::Running));
        let conclusion = conclude(&progress, &mut settled, INTERVALS);
        assert_eq!(conclusion.outcome, Outcome::Requeue(Some(INTERVALS.resync)));
        assert_eq!(settled.get_condition(condition::HELM_CHART_TEMPLATED), None);
        assert!(settled.status.as_ref().unwrap().ready);
        assert_eq!(conclusion.spec.inputs, None, "no digest recorded");
    }

    /// [`ready`] with health gates on.
    fn gated(tag: &str, version: &str, staged: bool) -> Progress {
        with(ready(tag, version, staged), |p| p.health_gates = true)
    }

    #[rstest]
    #[case::after_a_complete_apply(
        with(gated("docker-ferrol-1-27-v1", "v1", false), |p| { p.rendered = Some(Ok(2)); p.applied = Some(report(&[])) }),
        addon("", "", false),
        Step::CheckHealth { settle: true }
    )]
    #[case::not_after_a_failed_apply(
        with(gated("docker-ferrol-1-27-v1", "v1", false), |p| { p.rendered = Some(Ok(2)); p.applied = Some(report(&["x"])) }),
        addon("", "", false),
        Step::Conclude
    )]
    #[case::checked(
        with(gated("docker-ferrol-1-27-v1", "v1", false), |p| { p.rendered = Some(Ok(2)); p.applied = Some(report(&[])); p.health = Some(Found::Running) }),
        addon("", "", false),
        Step::Conclude
    )]
    #[case::settled_never_checked(
        with(gated("docker-ferrol-1-27-v1", "v1", false), |p| p.drift = Drift::None),
        addon("docker-ferrol-1-27-v1", "v1", true),
        Step::CheckHealth { settle: true }
    )]
    #[case::settled_staged_never_checked(
        with(gated("docker-ferrol-1-27-v1", "v1", true), |p| p.drift = Drift::None),
        addon("docker-ferrol-1-27-v1", "v1", true),
        Step::CheckHealth { settle: true }
    )]
    #[case::settled_without_gates(
        with(ready("docker-ferrol-1-27-v1", "v1", false), |p| p.drift = Drift::None),
        addon("docker-ferrol-1-27-v1", "v1", true),
        Step::Conclude
    )]
    // Running addons put back (drift found): no wait starts, so nothing settles.
    #[case::a_drift_correction_of_running_addons(
        with(gated("docker-ferrol-1-27-v1", "v1", false), |p| { p.drift = Drift::Found; p.rendered = Some(Ok(2)); p.applied = Some(report(&[])) }),
        running(addon("docker-ferrol-1-27-v1", "v1", true)),
        Step::CheckHealth { settle: false }
    )]
    // Running addons upgraded: the new ones are waited for and settle.
    #[case::an_upgrade_of_running_addons(
        with(gated("docker-ferrol-1-27-v2", "v2", false), |p| { p.rendered = Some(Ok(2)); p.applied = Some(report(&[])) }),
        running(addon("docker-ferrol-1-27-v1", "v1", true)),
        Step::CheckHealth { settle: true }
    )]
    fn health_is_checked_after_a_complete_apply_and_when_settled_addons_are_due(
        #[case] progress: Progress,
        #[case] addon: ClusterAddon,
        #[case] expected: Step,
    ) {
        assert_eq!(next_step(&progress, &addon), expected);
    }

    #[test]
    fn applied_addons_that_do_not_run_are_not_ready_and_looked_at_again_soon() {
        let mut a = addon("", "", false);
        let progress = with(gated("docker-ferrol-1-27-v1", "v1", false), |p| {
            p.rendered = Some(Ok(2));
            p.applied = Some(report(&[]));
            p.health = Some(Found::NotRunning(
                "Deployment kube-system/metrics-server: 0 of 1 replicas available".into(),
            ));
        });
        let conclusion = conclude(&progress, &mut a, INTERVALS);
        assert!(!a.status.as_ref().unwrap().ready);
        assert!(
            a.is_condition_true(condition::HELM_CHART_APPLIED),
            "applied all the same"
        );
        assert_eq!(
            condition_of(&a, condition::ADDONS_HEALTHY),
            Some((ConditionStatus::False, Some(reason::WAITING_FOR_HEALTH.into())))
        );
        assert_eq!(conclusion.outcome, Outcome::Requeue(Some(health::WAITING_POLL)));
        assert_eq!(
            conclusion.spec.cluster_stack.as_deref(),
            Some("docker-ferrol-1-27-v1")
        );

        // Found running at the next look: ready, and back to the periodic pass.
        let progress = with(gated("docker-ferrol-1-27-v1", "v1", false), |p| {
            p.drift = Drift::None;
            p.health = Some(Found::Running);
        });
        let mut installed = a.clone();
        installed.spec.cluster_stack = "docker-ferrol-1-27-v1".into();
        installed.spec.version = "v1".into();
        let conclusion = conclude(&progress, &mut installed, INTERVALS);
        assert!(installed.status.as_ref().unwrap().ready);
        assert!(installed.is_condition_true(condition::ADDONS_HEALTHY));
        assert_eq!(conclusion.outcome, Outcome::Requeue(Some(INTERVALS.resync)));
    }

    #[test]
    fn without_health_gates_applied_is_ready() {
        let mut a = addon("", "", false);
        a.mark_false(
            condition::ADDONS_HEALTHY,
            reason::DEGRADED,
            Severity::Warning,
            "x",
        );
        let progress = with(ready("docker-ferrol-1-27-v1", "v1", false), |p| {
            p.rendered = Some(Ok(2));
            p.applied = Some(report(&[]));
        });
        conclude(&progress, &mut a, INTERVALS);
        assert!(a.status.as_ref().unwrap().ready);
        assert_eq!(
            a.get_condition(condition::ADDONS_HEALTHY),
            None,
            "a left-over condition goes"
        );
    }

    #[rstest]
    #[case::adopted_without_a_render(None)]
    #[case::kept(Some(DIGEST))]
    fn settled_addons_record_the_digest_of_their_values(#[case] recorded: Option<&str>) {
        let a = addon("docker-ferrol-1-27-v2", "v2", true);
        let progress = with(ready("docker-ferrol-1-27-v2", "v2", false), |p| {
            p.drift = Drift::None;
            p.inputs = Inputs::templated(recorded, DIGEST.into());
        });
        assert_eq!(next_step(&progress, &a), Step::Conclude, "nothing is rendered");
        let conclusion = conclude(&progress, &mut a.clone(), INTERVALS);
        assert_eq!(conclusion.spec.inputs.as_deref(), Some(DIGEST));
    }

    #[test]
    fn a_control_plane_that_does_not_answer_for_half_an_hour_is_failing_and_stays_so() {
        let progress = with(ready("docker-ferrol-1-27-v1", "v1", false), |p| {
            p.workload = WorkloadState::NotReady("connection refused".into());
        });
        let mut a = addon("", "", false);
        conclude(&progress, &mut a, INTERVALS);
        let ready_condition = |a: &ClusterAddon| a.get_condition(condition::CLUSTER_READY).unwrap().clone();
        assert_eq!(
            ready_condition(&a).severity,
            Some(Severity::Info),
            "not answering yet: being made"
        );
        // (The condition's transition is timed by the clock; the decision by the progress' own time.)
        a.keep_transition(condition::CLUSTER_READY, progress.now);
        let later = |seconds, error: &str| {
            let mut p = progress.clone();
            p.now = progress.now + chrono::TimeDelta::seconds(seconds);
            p.workload = WorkloadState::NotReady(error.into());
            p
        };
        conclude(&later(1799, "connection refused"), &mut a, INTERVALS);
        assert_eq!(ready_condition(&a).severity, Some(Severity::Info));
        // Other errors meanwhile do not restart the clock; once failing, it stays failing.
        conclude(&later(1800, "i/o timeout"), &mut a, INTERVALS);
        assert_eq!(ready_condition(&a).severity, Some(Severity::Warning));
        conclude(&later(1815, "connection refused"), &mut a, INTERVALS);
        let condition = ready_condition(&a);
        assert_eq!(condition.severity, Some(Severity::Warning));
        assert_eq!(condition.last_transition_time, progress.now);
        assert!(
            condition
                .message
                .as_deref()
                .unwrap()
                .contains("not ready for more than 30 minutes"),
            "{condition:?}"
        );
        assert_eq!(
            cso_api::fleet::AddonState::of(&a),
            cso_api::fleet::AddonState::Failing
        );
    }

    #[rstest]
    #[case::not_ours(
        Progress { cluster: ClusterState::NotOurs { cluster: "c1".into() }, ..Progress::default() },
        (ConditionStatus::False, reason::NO_CLUSTER_STACK_CLASS),
        Outcome::Requeue(None)
    )]
    #[case::no_endpoint_yet(
        with(ready("docker-ferrol-1-27-v1", "v1", false), |p| p.workload = WorkloadState::NoEndpoint),
        (ConditionStatus::False, reason::CONTROL_PLANE_NOT_READY),
        Outcome::Requeue(Some(INTERVALS.workload_retry))
    )]
    #[case::no_kubeconfig(
        with(ready("docker-ferrol-1-27-v1", "v1", false), |p| p.workload = WorkloadState::NoKubeconfig("no Secret".into())),
        (ConditionStatus::False, reason::CONTROL_PLANE_NOT_READY),
        Outcome::Requeue(Some(INTERVALS.workload_retry))
    )]
    #[case::not_ready(
        with(ready("docker-ferrol-1-27-v1", "v1", false), |p| p.workload = WorkloadState::NotReady("503".into())),
        (ConditionStatus::False, reason::CONTROL_PLANE_NOT_READY),
        Outcome::Requeue(Some(INTERVALS.workload_retry))
    )]
    fn waiting_for_the_cluster_says_why(
        #[case] progress: Progress,
        #[case] (status, expected_reason): (ConditionStatus, &str),
        #[case] outcome: Outcome,
    ) {
        let mut a = addon("", "", false);
        let conclusion = conclude(&progress, &mut a, INTERVALS);
        assert_eq!(conclusion.outcome, outcome);
        assert_eq!(
            condition_of(&a, condition::CLUSTER_READY),
            Some((status, Some(expected_reason.to_owned())))
        );
        assert!(conclusion.events.0.is_empty());
        assert_eq!(conclusion.spec, SpecUpdate::default(), "nothing recorded");
    }

    #[test]
    fn a_cluster_without_its_endpoint_yet_is_waited_for_not_reported_as_a_failure() {
        let progress = with(ready("docker-ferrol-1-27-v1", "v1", false), |p| {
            p.workload = WorkloadState::NoEndpoint;
        });
        let mut a = addon("", "", false);
        let conclusion = conclude(&progress, &mut a, INTERVALS);
        assert!(
            !matches!(conclusion.outcome, Outcome::Retry(_)),
            "no retry with backoff (logged as a failed reconcile): {:?}",
            conclusion.outcome
        );
        let ready = a.get_condition(condition::CLUSTER_READY).unwrap();
        assert_eq!(ready.severity, Some(Severity::Info));
        assert!(
            ready
                .message
                .as_deref()
                .is_some_and(|m| m.contains("spec.controlPlaneEndpoint")),
            "{ready:?}"
        );
        assert!(
            a.get_condition(condition::HELM_CHART_TEMPLATED).is_none(),
            "nothing was templated"
        );
    }

    #[rstest]
    #[case::none(json!({}), false)]
    #[case::empty_host(json!({"controlPlaneEndpoint": {"host": "", "port": 0}}), false)]
    #[case::set(json!({"controlPlaneEndpoint": {"host": "10.0.0.1", "port": 6443}}), true)]
    #[case::host_without_port(json!({"controlPlaneEndpoint": {"host": "api.example.test"}}), true)]
    fn the_endpoint_is_there_once_it_has_a_host(#[case] spec: serde_json::Value, #[case] expected: bool) {
        let cluster: cso_api::capi::Cluster = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": "ns"}, "spec": spec,
        }))
        .unwrap();
        assert_eq!(has_control_plane_endpoint(&cluster), expected);
    }

    #[test]
    fn a_release_that_cannot_be_fetched_is_reported_on_the_cluster_addon() {
        let error = cso_release::CacheError::Source {
            tag: "docker-ferrol-1-27-v9".into(),
            source_kind: "github",
            error: cso_release::SourceError::NotFound {
                what: "release".into(),
            },
        };
        let progress = with(ready("docker-ferrol-1-27-v9", "v1", false), |p| {
            p.release = ReleaseState::Failed {
                failure: FetchFailure::of(&error),
                message: error.to_string(),
            }
        });
        let mut a = addon("", "", false);
        let conclusion = conclude(&progress, &mut a, INTERVALS);
        assert!(matches!(conclusion.outcome, Outcome::Retry(_)));
        assert_eq!(conclusion.events.reasons(), [event::RELEASE_DOWNLOAD_FAILED]);
        assert!(a.is_condition_true(condition::CLUSTER_READY));
        assert_eq!(
            condition_of(&a, condition::CLUSTER_STACK_RELEASE_DOWNLOADED),
            Some((ConditionStatus::False, Some(reason::RELEASE_NOT_FOUND.to_owned())))
        );
    }

    /// A release refused by verification is reported on the ClusterAddon (`ReleaseVerified` False) and the
    /// report goes once the release can be had, so that the addons' `Ready` does not stay False.
    #[test]
    fn a_refused_release_is_reported_until_it_can_be_had() {
        let error = cso_release::CacheError::Source {
            tag: "docker-ferrol-1-27-v9".into(),
            source_kind: "oci",
            error: cso_release::SourceError::Refused {
                refusal: cso_release::source::Refusal::Unsigned,
                digest: DIGEST.into(),
                message: "no cosign signature".into(),
            },
        };
        let refused = with(ready("docker-ferrol-1-27-v9", "v1", false), |p| {
            p.release = ReleaseState::Failed {
                failure: FetchFailure::of(&error),
                message: error.to_string(),
            }
        });
        let mut a = addon("", "", false);
        let conclusion = conclude(&refused, &mut a, INTERVALS);
        assert_eq!(conclusion.events.reasons(), [event::RELEASE_REFUSED]);
        assert_eq!(
            condition_of(&a, condition::RELEASE_VERIFIED),
            Some((ConditionStatus::False, Some(reason::UNSIGNED.to_owned())))
        );
        conclude(&ready("docker-ferrol-1-27-v9", "v1", false), &mut a, INTERVALS);
        assert_eq!(condition_of(&a, condition::RELEASE_VERIFIED), None);
    }

    #[test]
    fn the_same_addons_on_another_class_are_recorded_without_a_render() {
        let mut a = addon("docker-ferrol-1-27-v2", "v2", true);
        a.spec.hook = "BeforeClusterUpgrade".into();
        let conclusion = conclude(&ready("docker-ferrol-1-27-v3", "v2", false), &mut a, INTERVALS);
        assert_eq!(conclusion.outcome, Outcome::Requeue(Some(INTERVALS.resync)));
        assert_eq!(
            conclusion.spec,
            SpecUpdate {
                cluster_stack: Some("docker-ferrol-1-27-v3".into()),
                hook: Some(String::new()),
                inputs: Some(DIGEST.into()),
                ..Default::default()
            },
            "the class is recorded and the hook set by the hook server is done"
        );
        assert!(a.status.as_ref().unwrap().ready);
        assert!(
            !conclusion.applied_all,
            "nothing was applied: the resync clock keeps running"
        );
    }

    #[test]
    fn a_render_failure_is_reported_and_an_upgrade_is_not_ready() {
        let progress = with(ready("docker-ferrol-1-27-v3", "v3", false), |p| {
            p.rendered = Some(Err((
                reason::TEMPLATE_NEW_CLUSTER_STACK_OVERWRITE_FAILED,
                "no .Cluster.spec".into(),
            )))
        });
        let mut a = addon("docker-ferrol-1-27-v2", "v2", true);
        a.status.get_or_insert_with(Default::default).ready = true;
        let conclusion = conclude(&progress, &mut a, INTERVALS);
        assert!(matches!(conclusion.outcome, Outcome::Retry(_)));
        assert_eq!(
            conclusion.events.reasons(),
            [reason::TEMPLATE_NEW_CLUSTER_STACK_OVERWRITE_FAILED]
        );
        assert_eq!(
            condition_of(&a, condition::HELM_CHART_TEMPLATED),
            Some((
                ConditionStatus::False,
                Some(reason::TEMPLATE_NEW_CLUSTER_STACK_OVERWRITE_FAILED.to_owned())
            ))
        );
        assert!(
            !a.status.as_ref().unwrap().ready,
            "an upgrade that did not happen is not ready"
        );
        assert_eq!(
            conclusion.spec,
            SpecUpdate::default(),
            "nothing recorded as applied"
        );
    }

    #[test]
    fn a_partial_apply_keeps_its_inventory_and_is_retried() {
        let progress = with(ready("docker-ferrol-1-27-v1", "v1", false), |p| {
            p.rendered = Some(Ok(4));
            p.applied = Some(report(&["admission webhook denied"]));
        });
        let mut a = addon("", "", false);
        let conclusion = conclude(&progress, &mut a, INTERVALS);
        assert!(matches!(&conclusion.outcome, Outcome::Retry(m) if m.contains("denied")));
        assert_eq!(conclusion.events.reasons(), [event::FAILED_TO_APPLY_OBJECTS]);
        assert_eq!(a.status.as_ref().unwrap().resources.len(), 1);
        assert_eq!(conclusion.spec, SpecUpdate::default());
        assert!(!conclusion.applied_all);
    }

    #[test]
    fn a_held_render_is_reported_as_held_and_nothing_is_recorded_as_applied() {
        let held =
            "held: the render has no objects where the last apply left 15; nothing was applied or pruned";
        let progress = with(ready("docker-ferrol-1-27-v2", "v2", false), |p| {
            p.rendered = Some(Ok(0));
            p.applied = Some(ApplyReport {
                resources: vec![Resource::default(); 15],
                held: Some(held.into()),
                ..Default::default()
            });
        });
        let mut a = addon("docker-ferrol-1-27-v1", "v1", true);
        let conclusion = conclude(&progress, &mut a, INTERVALS);
        assert!(matches!(&conclusion.outcome, Outcome::Retry(m) if m == held));
        assert_eq!(conclusion.events.reasons(), [event::PRUNE_HELD]);
        let applied = a.get_condition(condition::HELM_CHART_APPLIED).unwrap();
        assert_eq!(applied.reason.as_deref(), Some(reason::PRUNE_HELD));
        assert_eq!(
            a.status.as_ref().unwrap().resources.len(),
            15,
            "the inventory is kept"
        );
        assert!(!a.status.as_ref().unwrap().ready);
        assert_eq!(conclusion.spec, SpecUpdate::default(), "still on v1");
        assert!(!conclusion.applied_all);
    }

    #[rstest]
    #[case::first_install("", "", None, Some("created"), true)]
    #[case::upgrade("docker-ferrol-1-27-v1", "v1", Some("created"), Some("upgraded"), true)]
    #[case::resync_after_upgrade("docker-ferrol-1-27-v2", "v2", Some("upgraded"), None, false)]
    #[case::resync_of_an_unannotated_install("docker-ferrol-1-27-v2", "v2", None, Some("created"), false)]
    fn a_complete_apply_records_what_was_applied(
        #[case] class: &str,
        #[case] version: &str,
        #[case] annotation: Option<&str>,
        #[case] stage: Option<&str>,
        #[case] announced: bool,
    ) {
        let mut a = addon(class, version, !class.is_empty());
        if let Some(annotation) = annotation {
            a.metadata.annotations = Some(BTreeMap::from([(
                STAGE_ANNOTATION.to_owned(),
                annotation.to_owned(),
            )]));
        }
        let progress = with(ready("docker-ferrol-1-27-v2", "v2", false), |p| {
            p.resync_due = true;
            p.rendered = Some(Ok(4));
            p.applied = Some(report(&[]));
        });
        let conclusion = conclude(&progress, &mut a, INTERVALS);
        assert_eq!(conclusion.outcome, Outcome::Requeue(Some(INTERVALS.resync)));
        assert!(conclusion.applied_all);
        assert_eq!(
            conclusion.spec,
            SpecUpdate {
                cluster_stack: Some("docker-ferrol-1-27-v2".into()),
                version: Some("v2".into()),
                hook: Some(String::new()),
                stage: stage.map(|s| match s {
                    "created" => "created",
                    _ => "upgraded",
                }),
                inputs: Some(DIGEST.into()),
            }
        );
        assert_eq!(
            conclusion
                .events
                .reasons()
                .contains(&event::CLUSTER_ADDON_APPLIED),
            announced,
            "installs and upgrades are announced, drift corrections are not"
        );
        assert!(a.is_condition_true(condition::HELM_CHART_APPLIED));
        assert!(a.status.as_ref().unwrap().ready);
    }
}
