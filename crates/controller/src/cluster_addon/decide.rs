//! The ClusterAddon's decisions (pure): which step comes next, given what the reconcile has seen and done
//! so far ([`next_step`]), and what that means for the status, the spec fields we record, the events and
//! the retry ([`conclude`]). Multi-stage releases continue in [`super::stages`] after the common prefix
//! (Cluster, workload cluster, release).

use std::time::Duration;

use cso_api::{
    ClusterAddon, ClusterAddonStatus, ReleaseId,
    cluster_addon::STAGE_ANNOTATION,
    conditions::{ConditionsExt, Severity},
    names::{condition, event, reason},
};
use cso_apply::ApplyReport;
use kube::ResourceExt;

use super::decision::{Applied, Decision, decide};
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
    /// The periodic re-apply (drift correction) is due.
    pub(crate) resync_due: bool,
    /// How many objects the addon chart rendered, or the `HelmChartTemplated` reason and message.
    pub(crate) rendered: Option<Result<usize, (&'static str, String)>>,
    pub(crate) applied: Option<ApplyReport>,
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
    /// No (usable) kubeconfig Secret yet.
    NoKubeconfig(String),
    /// The API server does not answer `/readyz` yet.
    NotReady(String),
    Ready,
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
    Render,
    Apply,
    /// A multi-stage release: the stage machine takes over with this decision.
    RunStages(Decision),
    Conclude,
}

/// Whether the addons of `target` (addon version `addon_version`) must be rendered and applied.
pub(crate) fn decision(
    addon: &ClusterAddon,
    target: &ReleaseId,
    addon_version: &str,
    resync_due: bool,
) -> Decision {
    let applied = Applied::of(&addon.spec.cluster_stack, &addon.spec.version);
    let complete = addon.is_condition_true(condition::HELM_CHART_APPLIED);
    decide(&applied, target, addon_version, complete, resync_due)
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
        WorkloadState::NoKubeconfig(_) | WorkloadState::NotReady(_) => return Step::Conclude,
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
    let decision = decision(addon, target, addon_version, progress.resync_due);
    if staged {
        return Step::RunStages(decision);
    }
    match (decision, &progress.rendered, &progress.applied) {
        (Decision::RecordOnly, _, _) => Step::Conclude,
        (Decision::Apply { .. }, None, _) => Step::Render,
        (Decision::Apply { .. }, Some(Ok(_)), None) => Step::Apply,
        _ => Step::Conclude,
    }
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

/// How long to wait: for the workload cluster to answer, and between re-applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Intervals {
    pub(crate) workload_retry: Duration,
    pub(crate) resync: Duration,
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
            addon.mark_false(
                condition::CLUSTER_READY,
                reason::CONTROL_PLANE_NOT_READY,
                Severity::Info,
                format!("control plane not ready yet: {error}"),
            );
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
            None
        }
    }
}

/// Single-chart releases: the whole reconcile, into `addon`'s status and conditions.
pub(crate) fn conclude(progress: &Progress, addon: &mut ClusterAddon, intervals: Intervals) -> Conclusion {
    if let Some(conclusion) = conclude_prefix(progress, addon, intervals) {
        return conclusion;
    }
    let (ClusterState::Uses(target), ReleaseState::Ready { addon_version, .. }) =
        (&progress.cluster, &progress.release)
    else {
        return Conclusion::new(Outcome::Retry("the release is not known".into()));
    };
    let resynced = Outcome::Requeue(Some(intervals.resync));
    let upgrade = match decision(addon, target, addon_version, progress.resync_due) {
        Decision::RecordOnly => {
            // Same addons as applied: a class switch is recorded, nothing is rendered or applied. A hook set by
            // the hook server is done too (the Go operator never finishes it: upgrades hang).
            let mut conclusion = Conclusion::new(resynced);
            conclusion.spec.cluster_stack = Some(target.cluster_class_name());
            conclusion.spec.hook = Some(String::new());
            status_of(addon).ready = true;
            return conclusion;
        }
        Decision::Apply { upgrade } => upgrade,
    };
    if upgrade {
        status_of(addon).ready = false;
    }
    match &progress.rendered {
        None => return Conclusion::new(Outcome::Retry("the addon chart was not rendered".into())),
        Some(Err((reason, message))) => {
            let mut conclusion = Conclusion::new(Outcome::Retry(message.clone()));
            conclusion.events.report_false(
                addon,
                (condition::HELM_CHART_TEMPLATED, reason, Severity::Error),
                message,
                (Kind::Warning, reason),
            );
            return conclusion;
        }
        Some(Ok(_)) => addon.delete_condition(condition::HELM_CHART_TEMPLATED),
    }
    let Some(report) = &progress.applied else {
        return Conclusion::new(Outcome::Retry("the addons were not applied".into()));
    };
    status_of(addon).resources = report.resources.clone();
    if !report.is_complete() {
        let message = report.failure_summary();
        let mut conclusion = Conclusion::new(Outcome::Retry(message.clone()));
        conclusion.events.report_false(
            addon,
            (
                condition::HELM_CHART_APPLIED,
                reason::FAILED_TO_APPLY_OBJECTS,
                Severity::Warning,
            ),
            &message,
            (Kind::Warning, event::FAILED_TO_APPLY_OBJECTS),
        );
        return conclusion;
    }
    let mut conclusion = Conclusion::new(resynced);
    conclusion.applied_all = true;
    let first = !addon.is_condition_true(condition::HELM_CHART_APPLIED);
    addon.mark_true(condition::HELM_CHART_APPLIED);
    status_of(addon).ready = true;
    if first || upgrade {
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
    };
    conclusion
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
