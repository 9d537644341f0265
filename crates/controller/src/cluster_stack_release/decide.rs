//! The ClusterStackRelease's decisions (pure): which step comes next, given what the reconcile has seen and
//! done so far ([`next_step`]), and what that means for the status, the events and the retry
//! ([`conclude`]). The driver in the parent module carries out the steps.

use std::time::Duration;

use cso_api::{
    ClusterStackRelease, ClusterStackReleaseStatus, ReleaseId,
    conditions::{ConditionsExt, Severity},
    names::{condition, event, reason},
};
use cso_apply::ApplyReport;
use cso_release::{CacheError, SourceError};

use crate::events::{Events, Kind};

/// What the reconcile knows, filled in step by step.
#[derive(Clone, Debug)]
pub(crate) struct Progress {
    /// The release, parsed from the object's name.
    pub(crate) id: Result<ReleaseId, String>,
    pub(crate) deleting: bool,
    pub(crate) files: Files,
    /// Whether the release names a provider object (`spec.providerRef`).
    pub(crate) has_provider: bool,
    pub(crate) provider: Option<Result<bool, String>>,
    /// How many objects the cluster-class chart rendered, or why it did not.
    pub(crate) rendered: Option<Result<usize, String>>,
    pub(crate) applied: Option<ApplyReport>,
    /// The Clusters that use the class (`namespace/name`), read when deleting.
    pub(crate) users: Option<Vec<String>>,
    pub(crate) deleted: Option<ApplyReport>,
}

impl Progress {
    pub(crate) fn new(id: Result<ReleaseId, String>, deleting: bool, has_provider: bool) -> Self {
        Progress {
            id,
            deleting,
            files: Files::Unknown,
            has_provider,
            provider: None,
            rendered: None,
            applied: None,
            users: None,
            deleted: None,
        }
    }
}

/// The release's files.
#[derive(Clone, Debug)]
pub(crate) enum Files {
    /// Not looked for yet.
    Unknown,
    /// Not in the cache.
    Missing,
    /// In the cache; `downloaded_now` when this reconcile fetched them.
    Ready {
        kubernetes: String,
        downloaded_now: bool,
    },
    /// Cannot be had now.
    Failed { failure: FetchFailure, message: String },
}

/// What the driver does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    LookInCache,
    Download,
    CheckProvider,
    Render,
    Apply,
    FindUsers,
    Delete,
    /// Nothing more to do in this reconcile: conclude.
    Conclude,
}

/// The next step, from what is known so far.
pub(crate) fn next_step(progress: &Progress, release: &ClusterStackRelease) -> Step {
    if progress.deleting {
        return match (&progress.id, &progress.users, &progress.deleted) {
            (Ok(_), None, _) => Step::FindUsers,
            (Ok(_), Some(users), _) if !users.is_empty() => Step::Conclude,
            (_, _, None) => Step::Delete,
            (_, _, Some(_)) => Step::Conclude,
        };
    }
    if progress.id.is_err() {
        return Step::Conclude;
    }
    match &progress.files {
        Files::Unknown => return Step::LookInCache,
        // Say "downloading" before the first attempt (the conclusion writes it and comes back at once);
        // after a failure the condition keeps saying why, and a status that flipped back and forth would
        // trigger reconcile after reconcile.
        Files::Missing if !release.is_condition_false(condition::CLUSTER_STACK_RELEASE_DOWNLOADED) => {
            return Step::Conclude;
        }
        Files::Missing => return Step::Download,
        Files::Failed { .. } => return Step::Conclude,
        Files::Ready { .. } => {}
    }
    if progress.has_provider {
        match &progress.provider {
            None => return Step::CheckProvider,
            Some(Ok(true)) => {}
            Some(_) => return Step::Conclude,
        }
    }
    match (&progress.rendered, &progress.applied) {
        (None, _) => Step::Render,
        (Some(Ok(_)), None) => Step::Apply,
        _ => Step::Conclude,
    }
}

/// How the reconcile ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Come back after this long, or on a change.
    Requeue(Option<Duration>),
    /// The objects are deleted: the finalizer may go.
    Deleted,
    /// Reported in the conditions; try again with backoff.
    Retry(String),
}

/// Writes what the steps found into `release`'s status and conditions; the events to publish and how the
/// reconcile ends. `resync` is the re-apply interval.
pub(crate) fn conclude(
    progress: &Progress,
    release: &mut ClusterStackRelease,
    resync: Duration,
) -> (Events, Outcome) {
    let mut events = Events::default();
    let outcome = if progress.deleting {
        conclude_deletion(progress, release, &mut events, resync)
    } else {
        conclude_sync(progress, release, &mut events, resync)
    };
    (events, outcome)
}

fn status_of(release: &mut ClusterStackRelease) -> &mut ClusterStackReleaseStatus {
    release.status.get_or_insert_with(Default::default)
}

fn conclude_sync(
    progress: &Progress,
    release: &mut ClusterStackRelease,
    events: &mut Events,
    resync: Duration,
) -> Outcome {
    let id = match &progress.id {
        Ok(id) => id,
        Err(message) => {
            release.mark_false(
                condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
                reason::ISSUE_WITH_RELEASE_ASSETS,
                Severity::Error,
                message,
            );
            // The name never changes: nothing to retry.
            return Outcome::Requeue(None);
        }
    };
    match &progress.files {
        Files::Unknown => return Outcome::Retry(format!("the files of {} were not looked for", id.tag())),
        Files::Missing => {
            release.mark_false(
                condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
                reason::RELEASE_ASSETS_NOT_DOWNLOADED_YET,
                Severity::Info,
                "assets not downloaded yet",
            );
            // Shown; the download follows at once.
            return Outcome::Requeue(Some(Duration::ZERO));
        }
        Files::Failed { failure, message } => {
            events.report_false(
                release,
                (failure.condition, failure.reason, failure.severity),
                message,
                (Kind::Warning, failure.event),
            );
            return match failure.retry_after {
                // Rate limited: come back when the source allows it, not earlier.
                Some(delay) => Outcome::Requeue(Some(delay)),
                None => Outcome::Retry(message.clone()),
            };
        }
        Files::Ready {
            kubernetes,
            downloaded_now,
        } => {
            if *downloaded_now {
                release.mark_true(condition::ASSETS_CLIENT_API_AVAILABLE);
            }
            release.mark_true(condition::CLUSTER_STACK_RELEASE_DOWNLOADED);
            status_of(release).kubernetes_version = kubernetes.clone();
        }
    }
    match &progress.provider {
        Some(Ok(false)) => {
            release.mark_false(
                condition::PROVIDER_CLUSTER_STACK_RELEASE_READY,
                reason::PROCESS_ONGOING,
                Severity::Info,
                "providerClusterStackRelease not ready yet",
            );
            // The provider-object watch brings us back when it changes; the resync is a safety net.
            return Outcome::Requeue(Some(resync));
        }
        Some(Err(message)) => {
            release.mark_false(
                condition::PROVIDER_CLUSTER_STACK_RELEASE_READY,
                reason::PROVIDER_OBJECT_NOT_FOUND,
                Severity::Warning,
                message,
            );
            return Outcome::Retry(message.clone());
        }
        Some(Ok(true)) | None => release.mark_true(condition::PROVIDER_CLUSTER_STACK_RELEASE_READY),
    }
    match &progress.rendered {
        None => return Outcome::Retry("the cluster-class chart was not rendered".into()),
        Some(Err(message)) => {
            events.report_false(
                release,
                (
                    condition::HELM_CHART_APPLIED,
                    reason::FAILED_TO_RENDER_CHART,
                    Severity::Error,
                ),
                message,
                (Kind::Warning, event::FAILED_TO_RENDER_CHART),
            );
            return Outcome::Retry(message.clone());
        }
        Some(Ok(_)) => {}
    }
    let Some(report) = &progress.applied else {
        return Outcome::Retry("the cluster-class objects were not applied".into());
    };
    status_of(release).resources = report.resources.clone();
    if !report.is_complete() {
        let message = report.failure_summary();
        events.report_false(
            release,
            (
                condition::HELM_CHART_APPLIED,
                reason::OBJECTS_APPLYING_ONGOING,
                Severity::Warning,
            ),
            &message,
            (Kind::Warning, event::FAILED_TO_APPLY_OBJECTS),
        );
        return Outcome::Retry(message);
    }
    release.mark_true(condition::HELM_CHART_APPLIED);
    status_of(release).ready = true;
    Outcome::Requeue(Some(resync))
}

fn conclude_deletion(
    progress: &Progress,
    release: &mut ClusterStackRelease,
    events: &mut Events,
    resync: Duration,
) -> Outcome {
    if let (Ok(id), Some(users)) = (&progress.id, &progress.users)
        && !users.is_empty()
    {
        let message = format!(
            "ClusterClass {} is used by Cluster(s) {}; deletion waits until they move on",
            id.cluster_class_name(),
            users.join(", ")
        );
        events.report_false(
            release,
            (
                condition::CLUSTER_CLASS_UNUSED,
                reason::CLUSTER_CLASS_IN_USE,
                Severity::Info,
            ),
            &message,
            (Kind::Normal, event::CLUSTER_CLASS_IN_USE),
        );
        // The Cluster watch brings us back when a Cluster moves on; the resync is a safety net.
        return Outcome::Requeue(Some(resync));
    }
    release.mark_true(condition::CLUSTER_CLASS_UNUSED);
    let Some(report) = &progress.deleted else {
        return Outcome::Retry("the objects of the release were not deleted".into());
    };
    status_of(release).resources = report.resources.clone();
    if !report.is_complete() {
        let message = report.failure_summary();
        events.report_false(
            release,
            (
                condition::HELM_CHART_DELETED,
                reason::FAILED_TO_DELETE_OBJECTS,
                Severity::Warning,
            ),
            &message,
            (Kind::Warning, event::FAILED_TO_DELETE_OBJECTS),
        );
        return Outcome::Retry(message);
    }
    Outcome::Deleted
}

/// How a release that cannot be had is reported, on a ClusterStackRelease or a ClusterAddon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FetchFailure {
    pub(crate) condition: &'static str,
    pub(crate) reason: &'static str,
    pub(crate) severity: Severity,
    pub(crate) event: &'static str,
    /// How long the source asked us to wait.
    pub(crate) retry_after: Option<Duration>,
}

impl FetchFailure {
    pub(crate) fn of(error: &CacheError) -> Self {
        let downloaded = |reason, severity, event| FetchFailure {
            condition: condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
            reason,
            severity,
            event,
            retry_after: None,
        };
        match error {
            CacheError::Source {
                error: SourceError::Config(_),
                ..
            } => FetchFailure {
                condition: condition::ASSETS_CLIENT_API_AVAILABLE,
                reason: reason::FAILED_CREATE_ASSETS_CLIENT,
                severity: Severity::Error,
                event: event::FAILED_CREATE_ASSETS_CLIENT,
                retry_after: None,
            },
            CacheError::Source {
                error: SourceError::NotFound { .. },
                ..
            } => downloaded(
                reason::RELEASE_NOT_FOUND,
                Severity::Error,
                event::RELEASE_DOWNLOAD_FAILED,
            ),
            CacheError::Source {
                error: source_error, ..
            } => FetchFailure {
                retry_after: source_error.retry_after(),
                ..downloaded(
                    reason::RELEASE_ASSETS_NOT_DOWNLOADED_YET,
                    Severity::Warning,
                    event::RELEASE_DOWNLOAD_FAILED,
                )
            },
            CacheError::Release { .. } => downloaded(
                reason::ISSUE_WITH_RELEASE_ASSETS,
                Severity::Error,
                event::VALIDATE_HELM_CHART_FAILED,
            ),
            CacheError::Io { .. } => downloaded(
                reason::ISSUE_WITH_RELEASE_ASSETS,
                Severity::Error,
                event::RELEASE_DOWNLOAD_FAILED,
            ),
        }
    }
}
