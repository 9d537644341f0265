//! The ClusterStackRelease's decisions (pure): which step comes next, given what the reconcile has seen and
//! done so far ([`next_step`]), and what that means for the status, the events and the retry
//! ([`conclude`]). The driver in the parent module carries out the steps.

use std::time::Duration;

use cso_api::{
    ClusterStackRelease, ClusterStackReleaseStatus, ReleaseId,
    cluster_stack_release::ReleaseProvenance,
    conditions::{ConditionsExt, Severity},
    inventory::Inventory,
    names::{condition, event, reason},
};
use cso_apply::ApplyReport;
use cso_release::{CacheError, SourceError, deps::FailureKind, source::Refusal};

use crate::events::{Events, FalseCondition, Kind};

/// What the reconcile knows, filled in step by step.
#[derive(Clone, Debug)]
pub(crate) struct Progress {
    /// The release, parsed from the object's name.
    pub(crate) id: Result<ReleaseId, String>,
    pub(crate) deleting: bool,
    /// Whether the release is checked on its way in: a source that verifies signatures, or a pin
    /// (`spec.digest`). Then `ReleaseVerified` says how it went.
    pub(crate) checked: bool,
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
            checked: false,
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
    /// In the cache; `downloaded_now` when this reconcile fetched them; where they came from.
    Ready {
        kubernetes: String,
        downloaded_now: bool,
        source: ReleaseProvenance,
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
            // Refused by verification: not downloaded either, for the summary; what was applied stays, and so
            // does `status.source`, which names what it was applied from.
            if failure.condition == condition::RELEASE_VERIFIED {
                release.mark_false(
                    condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
                    reason::RELEASE_NOT_VERIFIED,
                    failure.severity,
                    "the release was refused (see ReleaseVerified)",
                );
            }
            return match failure.retry_after {
                // Rate limited: come back when the source allows it, not earlier.
                Some(delay) => Outcome::Requeue(Some(delay)),
                None => Outcome::Retry(message.clone()),
            };
        }
        Files::Ready {
            kubernetes,
            downloaded_now,
            source,
        } => {
            if *downloaded_now {
                release.mark_true(condition::ASSETS_CLIENT_API_AVAILABLE);
            }
            release.mark_true(condition::CLUSTER_STACK_RELEASE_DOWNLOADED);
            record_verification(release, progress.checked, source, *downloaded_now, events);
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
    let failed = match report.held {
        Some(_) => (
            (
                condition::HELM_CHART_APPLIED,
                reason::PRUNE_HELD,
                Severity::Warning,
            ),
            event::PRUNE_HELD,
        ),
        // The API server refuses them for good (a terminating namespace, a schema, RBAC): not "ongoing".
        None if report.refused_for_good() => (
            (
                condition::HELM_CHART_APPLIED,
                reason::OBJECTS_REFUSED,
                Severity::Error,
            ),
            event::FAILED_TO_APPLY_OBJECTS,
        ),
        None => (
            (
                condition::HELM_CHART_APPLIED,
                reason::OBJECTS_APPLYING_ONGOING,
                Severity::Warning,
            ),
            event::FAILED_TO_APPLY_OBJECTS,
        ),
    };
    if let Some(message) = record(release, report, failed, events) {
        return Outcome::Retry(message);
    }
    release.mark_true(condition::HELM_CHART_APPLIED);
    let status = status_of(release);
    status.ready = true;
    // What the applied objects came from: recorded once they are applied, not when the files were fetched.
    if let Files::Ready { source, .. } = &progress.files {
        status.source = Some(source.clone());
    }
    Outcome::Requeue(Some(resync))
}

/// `ReleaseVerified` for files the cache handed out: they passed every check there is (the cache hands out
/// nothing else), so True when something was checked, and absent when nothing was. A fresh download with a
/// verified signature is announced.
fn record_verification(
    release: &mut ClusterStackRelease,
    checked: bool,
    source: &ReleaseProvenance,
    downloaded_now: bool,
    events: &mut Events,
) {
    if !checked {
        release.delete_condition(condition::RELEASE_VERIFIED);
        return;
    }
    release.mark_true(condition::RELEASE_VERIFIED);
    if downloaded_now && let Some(signer) = &source.signer {
        events.normal(
            event::RELEASE_VERIFIED,
            format!(
                "manifest {} signed by {signer} ({})",
                source.digest.as_deref().unwrap_or("?"),
                source.layout.as_deref().unwrap_or("?")
            ),
        );
    }
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
    let failed = (
        (
            condition::HELM_CHART_DELETED,
            reason::FAILED_TO_DELETE_OBJECTS,
            Severity::Warning,
        ),
        event::FAILED_TO_DELETE_OBJECTS,
    );
    if let Some(message) = record(release, report, failed, events) {
        return Outcome::Retry(message);
    }
    Outcome::Deleted
}

/// Records what `report` left in the cluster as the inventory; when an object failed, marks the `failed`
/// condition False (announced by its event) and returns why.
fn record(
    release: &mut ClusterStackRelease,
    report: &ApplyReport,
    (condition, event_reason): (FalseCondition<'_>, &'static str),
    events: &mut Events,
) -> Option<String> {
    status_of(release).resources = Inventory::of(&report.resources);
    if report.is_complete() {
        return None;
    }
    let message = report.failure_summary();
    events.report_false(release, condition, &message, (Kind::Warning, event_reason));
    Some(message)
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
                error: SourceError::Refused { refusal, .. },
                ..
            } => FetchFailure {
                condition: condition::RELEASE_VERIFIED,
                reason: refusal.reason(),
                // The registry failing to answer is worth a retry; the other refusals need a signature or a pin
                // changed.
                severity: match refusal {
                    Refusal::VerificationFailed => Severity::Warning,
                    _ => Severity::Error,
                },
                event: event::RELEASE_REFUSED,
                retry_after: None,
            },
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
            // Retried with backoff whatever the kind: a mirror is filled, a repository fixed, without a
            // change to any object. Wrong content (a digest mismatch, not a chart) is an Error.
            CacheError::Dependency { error, .. } => downloaded(
                reason::CHART_DEPENDENCY_UNAVAILABLE,
                match error.kind {
                    FailureKind::Unreachable | FailureKind::NotFound => Severity::Warning,
                    FailureKind::Integrity | FailureKind::Invalid | FailureKind::Io => Severity::Error,
                },
                event::CHART_DEPENDENCY_UNAVAILABLE,
            ),
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use cso_api::{
        common::Resource,
        conditions::{ConditionStatus, READY},
    };
    use cso_apply::{Failure, ObjectKey};
    use cso_release::deps::DependencyError;

    use super::*;

    const RESYNC: Duration = Duration::from_secs(300);
    const TAG: &str = "docker-ferrol-1-27-v1";
    const DIGEST: &str = "sha256:0f2d1a7e3bd1bb4d6a3ba3b1b8e3b0c1d0a0e3f4f5a6b7c8d9e0f1a2b3c4d5e6";

    fn release() -> ClusterStackRelease {
        ClusterStackRelease::new(TAG, Default::default())
    }

    fn progress() -> Progress {
        Progress::new(Ok(ReleaseId::parse_tag(TAG).unwrap()), false, false)
    }

    fn ready_files() -> Files {
        Files::Ready {
            kubernetes: "v1.27.3".into(),
            downloaded_now: false,
            source: ReleaseProvenance {
                kind: ReleaseProvenance::OCI.into(),
                digest: Some(DIGEST.into()),
                ..Default::default()
            },
        }
    }

    fn report(failures: &[&str]) -> ApplyReport {
        ApplyReport {
            resources: vec![Resource {
                group: "cluster.x-k8s.io".into(),
                version: "v1beta1".into(),
                kind: "ClusterClass".into(),
                namespace: "ns".into(),
                name: "docker-ferrol-1-27-v1".into(),
                ..Default::default()
            }],
            applied: 1,
            failures: failures
                .iter()
                .map(|e| Failure {
                    key: ObjectKey {
                        group: Default::default(),
                        kind: "ConfigMap".into(),
                        namespace: "ns".into(),
                        name: "x".into(),
                    },
                    error: (*e).into(),
                    lasting: false,
                })
                .collect(),
            ..Default::default()
        }
    }

    fn condition_of(release: &ClusterStackRelease, type_: &str) -> (ConditionStatus, Option<String>) {
        let c = release.get_condition(type_).expect(type_);
        (c.status, c.reason.clone())
    }

    fn failed(status: ConditionStatus, reason: &str) -> (ConditionStatus, Option<String>) {
        (status, Some(reason.to_owned()))
    }

    #[test]
    fn next_step_walks_fetch_provider_render_apply() {
        let announced = {
            let mut r = release();
            r.mark_false(
                condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
                reason::RELEASE_ASSETS_NOT_DOWNLOADED_YET,
                Severity::Info,
                "x",
            );
            r
        };
        let fresh = release();
        let with = |f: &dyn Fn(&mut Progress)| {
            let mut p = progress();
            f(&mut p);
            p
        };
        let cases: Vec<(&str, Progress, &ClusterStackRelease, Step)> = vec![
            (
                "a name that does not parse",
                with(&|p| p.id = Err("bad".into())),
                &announced,
                Step::Conclude,
            ),
            ("nothing known yet", progress(), &announced, Step::LookInCache),
            (
                "missing, not announced yet",
                with(&|p| p.files = Files::Missing),
                &fresh,
                Step::Conclude,
            ),
            (
                "missing, announced",
                with(&|p| p.files = Files::Missing),
                &announced,
                Step::Download,
            ),
            (
                "fetch failed",
                with(&|p| {
                    p.files = Files::Failed {
                        failure: FetchFailure::of(&io_error()),
                        message: "x".into(),
                    }
                }),
                &announced,
                Step::Conclude,
            ),
            (
                "files here, provider not checked",
                with(&|p| {
                    p.files = ready_files();
                    p.has_provider = true;
                }),
                &announced,
                Step::CheckProvider,
            ),
            (
                "provider not ready",
                with(&|p| {
                    p.files = ready_files();
                    p.has_provider = true;
                    p.provider = Some(Ok(false));
                }),
                &announced,
                Step::Conclude,
            ),
            (
                "provider ready",
                with(&|p| {
                    p.files = ready_files();
                    p.has_provider = true;
                    p.provider = Some(Ok(true));
                }),
                &announced,
                Step::Render,
            ),
            (
                "no provider mode",
                with(&|p| p.files = ready_files()),
                &announced,
                Step::Render,
            ),
            (
                "rendered",
                with(&|p| {
                    p.files = ready_files();
                    p.rendered = Some(Ok(3));
                }),
                &announced,
                Step::Apply,
            ),
            (
                "render failed",
                with(&|p| {
                    p.files = ready_files();
                    p.rendered = Some(Err("x".into()));
                }),
                &announced,
                Step::Conclude,
            ),
            (
                "applied",
                with(&|p| {
                    p.files = ready_files();
                    p.rendered = Some(Ok(3));
                    p.applied = Some(report(&[]));
                }),
                &announced,
                Step::Conclude,
            ),
        ];
        for (name, progress, release, expected) in cases {
            assert_eq!(next_step(&progress, release), expected, "{name}");
        }
    }

    fn io_error() -> CacheError {
        CacheError::Io {
            path: PathBuf::from("/x"),
            source: std::io::Error::other("disk"),
        }
    }

    #[test]
    fn next_step_of_a_deletion_waits_for_users_then_deletes() {
        let deleting = |id: Result<ReleaseId, String>, users: Option<Vec<&str>>, deleted: bool| {
            let mut p = Progress::new(id, true, false);
            p.users = users.map(|u| u.iter().map(|s| (*s).to_owned()).collect());
            p.deleted = deleted.then(|| report(&[]));
            p
        };
        let id = || Ok(ReleaseId::parse_tag(TAG).unwrap());
        let cases = [
            ("users not read yet", deleting(id(), None, false), Step::FindUsers),
            (
                "in use",
                deleting(id(), Some(vec!["ns/c1"]), false),
                Step::Conclude,
            ),
            ("unused", deleting(id(), Some(vec![]), false), Step::Delete),
            ("deleted", deleting(id(), Some(vec![]), true), Step::Conclude),
            (
                "a name that does not parse has no users",
                deleting(Err("bad".into()), None, false),
                Step::Delete,
            ),
        ];
        for (name, progress, expected) in cases {
            assert_eq!(next_step(&progress, &release()), expected, "{name}");
        }
    }

    #[test]
    fn a_name_that_does_not_parse_waits_for_a_change() {
        let mut r = release();
        let mut p = progress();
        p.id = Err("not a release name".into());
        let (events, outcome) = conclude(&p, &mut r, RESYNC);
        assert_eq!(outcome, Outcome::Requeue(None));
        assert!(events.0.is_empty());
        assert_eq!(
            condition_of(&r, condition::CLUSTER_STACK_RELEASE_DOWNLOADED),
            failed(ConditionStatus::False, reason::ISSUE_WITH_RELEASE_ASSETS)
        );
    }

    #[test]
    fn a_missing_release_is_announced_once_and_fetched_at_once() {
        let mut r = release();
        let mut p = progress();
        p.files = Files::Missing;
        let (_, outcome) = conclude(&p, &mut r, RESYNC);
        assert_eq!(outcome, Outcome::Requeue(Some(Duration::ZERO)));
        assert_eq!(
            condition_of(&r, condition::CLUSTER_STACK_RELEASE_DOWNLOADED),
            failed(ConditionStatus::False, reason::RELEASE_ASSETS_NOT_DOWNLOADED_YET)
        );
        assert_eq!(
            next_step(&p, &r),
            Step::Download,
            "announced: the next pass downloads"
        );
    }

    #[test]
    fn fetch_failures_are_reported_once_and_rate_limits_honoured() {
        let not_found = CacheError::Source {
            tag: TAG.into(),
            source_kind: "github",
            error: SourceError::NotFound {
                what: "release".into(),
            },
        };
        let mut r = release();
        let mut p = progress();
        p.files = Files::Failed {
            failure: FetchFailure::of(&not_found),
            message: not_found.to_string(),
        };
        let (events, outcome) = conclude(&p, &mut r, RESYNC);
        assert!(matches!(outcome, Outcome::Retry(_)));
        assert_eq!(events.reasons(), [event::RELEASE_DOWNLOAD_FAILED]);
        assert_eq!(
            condition_of(&r, condition::CLUSTER_STACK_RELEASE_DOWNLOADED),
            failed(ConditionStatus::False, reason::RELEASE_NOT_FOUND)
        );
        let (again, _) = conclude(&p, &mut r, RESYNC);
        assert!(again.0.is_empty(), "the same failure again: no second event");

        let limited = CacheError::Source {
            tag: TAG.into(),
            source_kind: "github",
            error: SourceError::RateLimited {
                url: "u".into(),
                retry_after: Some(Duration::from_secs(42)),
            },
        };
        p.files = Files::Failed {
            failure: FetchFailure::of(&limited),
            message: limited.to_string(),
        };
        let (_, outcome) = conclude(&p, &mut release(), RESYNC);
        assert_eq!(
            outcome,
            Outcome::Requeue(Some(Duration::from_secs(42))),
            "no backoff: the source's time"
        );
    }

    #[test]
    fn fetch_failures_map_to_conditions() {
        let source = |error| CacheError::Source {
            tag: TAG.into(),
            source_kind: "oci",
            error,
        };
        let cases = [
            (
                source(SourceError::Config("OCI_REGISTRY is not set".into())),
                (
                    condition::ASSETS_CLIENT_API_AVAILABLE,
                    reason::FAILED_CREATE_ASSETS_CLIENT,
                    event::FAILED_CREATE_ASSETS_CLIENT,
                ),
            ),
            (
                source(SourceError::NotFound { what: "tag".into() }),
                (
                    condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
                    reason::RELEASE_NOT_FOUND,
                    event::RELEASE_DOWNLOAD_FAILED,
                ),
            ),
            (
                source(SourceError::Network {
                    url: "u".into(),
                    message: "refused".into(),
                }),
                (
                    condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
                    reason::RELEASE_ASSETS_NOT_DOWNLOADED_YET,
                    event::RELEASE_DOWNLOAD_FAILED,
                ),
            ),
            (
                io_error(),
                (
                    condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
                    reason::ISSUE_WITH_RELEASE_ASSETS,
                    event::RELEASE_DOWNLOAD_FAILED,
                ),
            ),
            (
                dependency(FailureKind::Unreachable),
                (
                    condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
                    reason::CHART_DEPENDENCY_UNAVAILABLE,
                    event::CHART_DEPENDENCY_UNAVAILABLE,
                ),
            ),
            (
                dependency(FailureKind::NotFound),
                (
                    condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
                    reason::CHART_DEPENDENCY_UNAVAILABLE,
                    event::CHART_DEPENDENCY_UNAVAILABLE,
                ),
            ),
            (
                dependency(FailureKind::Integrity),
                (
                    condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
                    reason::CHART_DEPENDENCY_UNAVAILABLE,
                    event::CHART_DEPENDENCY_UNAVAILABLE,
                ),
            ),
        ];
        for (error, (condition, reason, event)) in cases {
            let failure = FetchFailure::of(&error);
            assert_eq!(
                (failure.condition, failure.reason, failure.event),
                (condition, reason, event),
                "{error}"
            );
            assert_eq!(failure.retry_after, None);
        }
    }

    /// A release refused by verification: `ReleaseVerified` False with the refusal's reason and message (an
    /// Error, but a Warning when the registry could not be read), `ClusterStackReleaseDownloaded` False
    /// `ReleaseNotVerified`, event `ReleaseRefused`, retried; `status.source` and `ready` are left as they were
    /// (what was applied keeps serving). Files that passed: True when something was checked, with an event for
    /// a signature verified on download; absent when nothing is checked; `status.source` recorded.
    #[test]
    fn verification_is_reported_from_what_the_cache_said() {
        let refused = |refusal: Refusal| CacheError::Source {
            tag: TAG.into(),
            source_kind: "oci",
            error: SourceError::Refused {
                refusal,
                digest: DIGEST.into(),
                message: format!("release refused: manifest {DIGEST} pinned elsewhere"),
            },
        };
        for (refusal, reason, severity) in [
            (Refusal::Unsigned, reason::UNSIGNED, Severity::Error),
            (
                Refusal::SignatureMismatch,
                reason::SIGNATURE_MISMATCH,
                Severity::Error,
            ),
            (
                Refusal::InvalidSignature,
                reason::INVALID_SIGNATURE,
                Severity::Error,
            ),
            (Refusal::TagMoved, reason::TAG_MOVED, Severity::Error),
            (
                Refusal::VerificationFailed,
                reason::VERIFICATION_FAILED,
                Severity::Warning,
            ),
        ] {
            let error = refused(refusal);
            let mut p = progress();
            p.checked = true;
            p.files = Files::Failed {
                failure: FetchFailure::of(&error),
                message: error.to_string(),
            };
            let mut r = release();
            let applied_before = ClusterStackReleaseStatus {
                ready: true,
                source: Some(ReleaseProvenance {
                    kind: "oci".into(),
                    digest: Some("sha256:old".into()),
                    ..Default::default()
                }),
                ..Default::default()
            };
            r.status = Some(applied_before.clone());
            let (events, outcome) = conclude(&p, &mut r, RESYNC);
            assert!(
                matches!(outcome, Outcome::Retry(m) if m.contains(DIGEST)),
                "{refusal:?}"
            );
            assert_eq!(events.reasons(), [event::RELEASE_REFUSED]);
            let verified = r.get_condition(condition::RELEASE_VERIFIED).unwrap();
            assert_eq!(
                (verified.status, verified.reason.as_deref(), verified.severity),
                (ConditionStatus::False, Some(reason), Some(severity))
            );
            assert!(verified.message.as_deref().unwrap().contains(DIGEST));
            assert_eq!(
                condition_of(&r, condition::CLUSTER_STACK_RELEASE_DOWNLOADED),
                (ConditionStatus::False, Some(reason::RELEASE_NOT_VERIFIED.into()))
            );
            let status = r.status.clone().unwrap();
            assert_eq!((status.ready, status.source), (true, applied_before.source));
        }

        let signed = ReleaseProvenance {
            kind: "oci".into(),
            digest: Some(DIGEST.into()),
            verified: true,
            signer: Some("key:SHA256:abc".into()),
            layout: Some("bundle-v0.3".into()),
        };
        for (checked, downloaded_now, condition_status, events_expected) in [
            (
                true,
                true,
                Some(ConditionStatus::True),
                vec![event::RELEASE_VERIFIED],
            ),
            (true, false, Some(ConditionStatus::True), vec![]),
            (false, true, None, vec![]),
        ] {
            let mut p = progress();
            p.checked = checked;
            p.files = Files::Ready {
                kubernetes: "v1.27.3".into(),
                downloaded_now,
                source: signed.clone(),
            };
            let mut r = release();
            r.mark_false(
                condition::RELEASE_VERIFIED,
                reason::UNSIGNED,
                Severity::Error,
                "before",
            );
            // Not applied (the render failed): the status does not name what was fetched.
            p.rendered = Some(Err("broken".into()));
            conclude(&p, &mut r, RESYNC);
            assert_eq!(
                r.status.clone().unwrap().source,
                None,
                "not applied, not recorded"
            );
            p.rendered = Some(Ok(1));
            p.applied = Some(report(&[]));
            let (events, _) = conclude(&p, &mut r, RESYNC);
            assert_eq!(
                r.get_condition(condition::RELEASE_VERIFIED).map(|c| c.status),
                condition_status,
                "checked {checked}"
            );
            assert_eq!(
                events.reasons(),
                events_expected,
                "checked {checked}, downloaded {downloaded_now}"
            );
            assert_eq!(r.status.clone().unwrap().source, Some(signed.clone()));
        }
    }

    fn dependency(kind: FailureKind) -> CacheError {
        CacheError::Dependency {
            tag: TAG.into(),
            error: Box::new(DependencyError {
                chart: "cni".into(),
                name: "cilium".into(),
                version: "1.19.1".into(),
                repository: "https://mirror.example/charts/".into(),
                reason: "connection refused".into(),
                kind,
            }),
        }
    }

    /// A chart dependency that cannot be had: the condition names the chart, the dependency's version and
    /// repository; a mirror that is down or lacks the version is a Warning, a wrong digest an Error; both are
    /// retried with backoff (a mirror gets fixed without any change to the object).
    #[test]
    fn a_chart_dependency_that_cannot_be_had_is_named_and_retried() {
        for (kind, severity) in [
            (FailureKind::Unreachable, Severity::Warning),
            (FailureKind::NotFound, Severity::Warning),
            (FailureKind::Integrity, Severity::Error),
        ] {
            let error = dependency(kind);
            let mut p = progress();
            p.files = Files::Failed {
                failure: FetchFailure::of(&error),
                message: error.to_string(),
            };
            let mut release = release();
            let (events, outcome) = conclude(&p, &mut release, RESYNC);
            assert_eq!(events.reasons(), [event::CHART_DEPENDENCY_UNAVAILABLE]);
            let downloaded = release
                .get_condition(condition::CLUSTER_STACK_RELEASE_DOWNLOADED)
                .unwrap();
            assert_eq!(
                (
                    downloaded.status,
                    downloaded.reason.as_deref(),
                    downloaded.severity
                ),
                (
                    ConditionStatus::False,
                    Some(reason::CHART_DEPENDENCY_UNAVAILABLE),
                    Some(severity)
                )
            );
            let message = downloaded.message.clone().unwrap_or_default();
            assert!(
                message.contains("cilium 1.19.1 of chart cni from https://mirror.example/charts/"),
                "{message}"
            );
            assert!(matches!(outcome, Outcome::Retry(_)), "{outcome:?}");
        }
    }

    #[test]
    fn a_provider_object_that_is_not_ready_or_missing_stops_before_rendering() {
        let mut p = progress();
        p.files = ready_files();
        p.has_provider = true;
        p.provider = Some(Ok(false));
        let mut r = release();
        let (events, outcome) = conclude(&p, &mut r, RESYNC);
        assert_eq!(
            outcome,
            Outcome::Requeue(Some(RESYNC)),
            "the provider watch brings it back sooner"
        );
        assert!(events.0.is_empty());
        assert_eq!(
            condition_of(&r, condition::PROVIDER_CLUSTER_STACK_RELEASE_READY),
            failed(ConditionStatus::False, reason::PROCESS_ONGOING)
        );
        assert!(r.is_condition_true(condition::CLUSTER_STACK_RELEASE_DOWNLOADED));

        p.provider = Some(Err("the provider object X ns/x does not exist".into()));
        let mut r = release();
        let (_, outcome) = conclude(&p, &mut r, RESYNC);
        assert!(matches!(outcome, Outcome::Retry(m) if m.contains("does not exist")));
        assert_eq!(
            condition_of(&r, condition::PROVIDER_CLUSTER_STACK_RELEASE_READY),
            failed(ConditionStatus::False, reason::PROVIDER_OBJECT_NOT_FOUND)
        );
    }

    #[test]
    fn a_render_failure_is_reported_with_an_event() {
        let mut p = progress();
        p.files = ready_files();
        p.rendered = Some(Err("the cluster-class chart rendered no objects".into()));
        let mut r = release();
        let (events, outcome) = conclude(&p, &mut r, RESYNC);
        assert!(matches!(outcome, Outcome::Retry(_)));
        assert_eq!(events.reasons(), [event::FAILED_TO_RENDER_CHART]);
        assert_eq!(
            condition_of(&r, condition::HELM_CHART_APPLIED),
            failed(ConditionStatus::False, reason::FAILED_TO_RENDER_CHART)
        );
        assert!(!r.status.as_ref().unwrap().ready);
    }

    #[test]
    fn the_status_follows_what_the_apply_reported() {
        let mut p = progress();
        p.files = match ready_files() {
            Files::Ready {
                kubernetes, source, ..
            } => Files::Ready {
                kubernetes,
                downloaded_now: true,
                source,
            },
            other => other,
        };
        p.rendered = Some(Ok(1));
        p.applied = Some(report(&["forbidden"]));
        let mut r = release();
        let (events, outcome) = conclude(&p, &mut r, RESYNC);
        assert!(matches!(outcome, Outcome::Retry(m) if m.contains("forbidden")));
        assert_eq!(events.reasons(), [event::FAILED_TO_APPLY_OBJECTS]);
        let status = r.status.clone().unwrap();
        assert_eq!(
            status.resources.len(),
            1,
            "the inventory is kept even when an object failed"
        );
        assert!(!status.ready);
        assert_eq!(
            condition_of(&r, condition::HELM_CHART_APPLIED),
            failed(ConditionStatus::False, reason::OBJECTS_APPLYING_ONGOING)
        );

        // Refused for good: a reason that does not promise progress.
        let mut refused = report(&["namespace stacks is being terminated (403)"]);
        refused.failures[0].lasting = true;
        p.applied = Some(refused);
        let (events, outcome) = conclude(&p, &mut r, RESYNC);
        assert!(matches!(outcome, Outcome::Retry(m) if m.contains("being terminated")));
        assert_eq!(events.reasons(), [event::FAILED_TO_APPLY_OBJECTS]);
        assert_eq!(
            condition_of(&r, condition::HELM_CHART_APPLIED),
            failed(ConditionStatus::False, reason::OBJECTS_REFUSED)
        );

        let mut held = report(&[]);
        held.held = Some("held: the render has 1 objects where the last apply left 4".into());
        p.applied = Some(held);
        let (events, outcome) = conclude(&p, &mut r, RESYNC);
        assert!(matches!(outcome, Outcome::Retry(m) if m.starts_with("held")));
        assert_eq!(events.reasons(), [event::PRUNE_HELD]);
        assert!(!r.status.as_ref().unwrap().ready);
        assert_eq!(
            condition_of(&r, condition::HELM_CHART_APPLIED),
            failed(ConditionStatus::False, reason::PRUNE_HELD)
        );

        p.applied = Some(report(&[]));
        let (events, outcome) = conclude(&p, &mut r, RESYNC);
        assert_eq!(outcome, Outcome::Requeue(Some(RESYNC)));
        assert!(events.0.is_empty());
        let status = r.status.clone().unwrap();
        assert!(status.ready);
        assert_eq!(status.kubernetes_version, "v1.27.3");
        for c in [
            condition::HELM_CHART_APPLIED,
            condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
            condition::PROVIDER_CLUSTER_STACK_RELEASE_READY,
            condition::ASSETS_CLIENT_API_AVAILABLE,
        ] {
            assert!(r.is_condition_true(c), "{c}");
        }
        r.set_summary();
        assert!(r.is_condition_true(READY));
    }

    #[test]
    fn deletion_waits_while_clusters_use_the_class() {
        let mut p = Progress::new(Ok(ReleaseId::parse_tag(TAG).unwrap()), true, false);
        p.users = Some(vec!["team/c1".into(), "team/c2".into()]);
        let mut r = release();
        let (events, outcome) = conclude(&p, &mut r, RESYNC);
        assert_eq!(outcome, Outcome::Requeue(Some(RESYNC)));
        assert_eq!(events.0.len(), 1);
        assert_eq!(events.0[0].kind, Kind::Normal);
        assert!(
            events.0[0].note.contains("team/c1, team/c2"),
            "{}",
            events.0[0].note
        );
        assert_eq!(
            condition_of(&r, condition::CLUSTER_CLASS_UNUSED),
            failed(ConditionStatus::False, reason::CLUSTER_CLASS_IN_USE)
        );
    }

    #[test]
    fn deletion_removes_the_finalizer_only_when_every_object_is_gone() {
        let mut p = Progress::new(Ok(ReleaseId::parse_tag(TAG).unwrap()), true, false);
        p.users = Some(Vec::new());
        p.deleted = Some(report(&["conflict"]));
        let mut r = release();
        let (events, outcome) = conclude(&p, &mut r, RESYNC);
        assert!(matches!(outcome, Outcome::Retry(_)));
        assert_eq!(events.reasons(), [event::FAILED_TO_DELETE_OBJECTS]);
        assert!(r.is_condition_true(condition::CLUSTER_CLASS_UNUSED));
        assert_eq!(
            r.status.as_ref().unwrap().resources.len(),
            1,
            "what is left stays recorded"
        );

        p.deleted = Some(ApplyReport::default());
        let (_, outcome) = conclude(&p, &mut r, RESYNC);
        assert_eq!(outcome, Outcome::Deleted);
        assert!(r.status.as_ref().unwrap().resources.is_empty());
    }
}
