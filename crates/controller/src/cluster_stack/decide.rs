//! The ClusterStack's decisions (pure): what to create, update and delete ([`actions`], from the release
//! plan of [`super::plan`]) and, from what the act step reports, the status, the events and the retry
//! ([`conclude`]). `status.usableVersions` and the summary come from the releases that exist after the act
//! step, not from what was planned.

use std::{collections::BTreeSet, time::Duration};

use cso_api::{
    ClusterStack, ClusterStackRelease, ClusterStackStatus, ReleaseId,
    common::ObjectReference,
    conditions::{ConditionsExt, Severity},
    names::{condition, event, reason},
};
use kube::ResourceExt;

use super::{
    plan::{ExistingRelease, Plan, StackSpec, plan},
    summary::release_summary,
};
use crate::events::{Events, Kind};

/// Everything the ClusterStack's decision is made from.
#[derive(Clone, Debug)]
pub(crate) struct Observed {
    pub(crate) spec: StackSpec,
    /// The ClusterStackReleases the stack owns.
    pub(crate) releases: Vec<ClusterStackRelease>,
    pub(crate) source: SourceListing,
    /// The releases Clusters use (any stack: others are ignored).
    pub(crate) in_use: BTreeSet<ReleaseId>,
}

/// What the source said about the stack's releases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SourceListing {
    /// Auto-subscribe is off: the source was not asked.
    NotAsked,
    /// The newest release of the channel at the source, if any.
    Latest(Option<ReleaseId>),
    /// The source cannot be configured (missing credentials): an error only a change can fix.
    Unconfigured(String),
    /// Listing failed; `retry_after` when the source set a rate limit.
    Failed {
        message: String,
        retry_after: Option<Duration>,
    },
}

/// The writes the act step makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Actions {
    pub(crate) plan: Plan,
    /// Releases to delete (names).
    pub(crate) delete: Vec<String>,
    /// Releases that must exist, with their provider reference as it is now (`None`: not created yet).
    pub(crate) ensure: Vec<Ensure>,
    /// Provider mode: each ensured release gets its provider object first.
    pub(crate) provider_objects: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Ensure {
    pub(crate) name: String,
    /// `Some(reference)` when the release exists, with its `spec.providerRef`.
    pub(crate) existing: Option<Option<ObjectReference>>,
}

/// Decides the writes for `observed`; `no_provider` is the stack's `spec.noProvider`.
pub(crate) fn actions(observed: &Observed, no_provider: bool) -> Actions {
    let existing = existing_releases(&observed.releases);
    let latest_remote = match &observed.source {
        SourceListing::Latest(latest) => latest.as_ref(),
        _ => None,
    };
    let plan = plan(&observed.spec, &existing, latest_remote, &observed.in_use);
    let ensure = plan
        .wanted
        .iter()
        .map(|id| {
            let name = id.tag();
            let existing = observed
                .releases
                .iter()
                .find(|r| r.name_any() == name)
                .map(|r| r.spec.provider_ref.clone());
            Ensure { name, existing }
        })
        .collect();
    Actions {
        delete: plan.delete.iter().map(ReleaseId::tag).collect(),
        ensure,
        provider_objects: !no_provider,
        plan,
    }
}

fn existing_releases(releases: &[ClusterStackRelease]) -> Vec<ExistingRelease> {
    releases
        .iter()
        .filter_map(|r| match ReleaseId::parse_tag(&r.name_any()) {
            Ok(id) => Some(ExistingRelease {
                id,
                ready: r.status.as_ref().is_some_and(|s| s.ready),
            }),
            Err(e) => {
                tracing::debug!(release = %r.name_any(), error = %e, "ignoring a ClusterStackRelease whose name does not parse");
                None
            }
        })
        .collect()
}

/// What the act step did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Done {
    /// Releases deleted (or already gone).
    pub(crate) deleted: Vec<String>,
    /// Releases that could not be deleted, with why.
    pub(crate) not_deleted: Vec<(String, String)>,
    /// Provider objects created or updated (names).
    pub(crate) provider_created: Vec<String>,
    pub(crate) provider_updated: Vec<String>,
    /// Provider objects that could not be made: (the template was not found, message).
    pub(crate) provider_failed: Vec<(bool, String)>,
    /// Releases that could not be created or updated, with why.
    pub(crate) not_ensured: Vec<(String, String)>,
}

/// How the reconcile ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Requeue(Option<Duration>),
    /// Reported in the conditions; try again with backoff.
    Retry(String),
}

/// A spec that is not valid: said in the conditions; only a change of the spec can help.
pub(crate) fn conclude_invalid(stack: &mut ClusterStack, message: &str) -> Outcome {
    stack.mark_false(
        condition::CLUSTER_STACK_RELEASES_SYNCED,
        reason::INVALID_SPEC,
        Severity::Error,
        message,
    );
    Outcome::Requeue(None)
}

/// Writes what happened into `stack`'s status and conditions; the events and how the reconcile ends.
pub(crate) fn conclude(
    stack: &mut ClusterStack,
    observed: &Observed,
    actions: &Actions,
    done: &Done,
    poll_interval: Duration,
) -> (Events, Outcome) {
    let mut events = Events::default();
    let mut failed: Vec<String> = Vec::new();
    let mut next_poll = poll_interval;
    match &observed.source {
        SourceListing::NotAsked => {
            // Not asked: say nothing about the source rather than something stale.
            stack.delete_condition(condition::RELEASES_SYNCED);
            stack.delete_condition(condition::ASSETS_CLIENT_API_AVAILABLE);
        }
        SourceListing::Latest(_) => {
            stack.mark_true(condition::ASSETS_CLIENT_API_AVAILABLE);
            stack.mark_true(condition::RELEASES_SYNCED);
        }
        SourceListing::Unconfigured(message) => {
            events.report_false(
                stack,
                (
                    condition::ASSETS_CLIENT_API_AVAILABLE,
                    reason::FAILED_CREATE_ASSETS_CLIENT,
                    Severity::Error,
                ),
                message,
                (Kind::Warning, event::FAILED_CREATE_ASSETS_CLIENT),
            );
            failed.push(message.clone());
        }
        SourceListing::Failed { message, retry_after } => {
            events.report_false(
                stack,
                (
                    condition::RELEASES_SYNCED,
                    reason::FAILED_TO_SYNC,
                    Severity::Warning,
                ),
                message,
                (Kind::Warning, event::FAILED_TO_SYNC),
            );
            match retry_after {
                // Rate limited: come back when the source allows it, not earlier.
                Some(delay) => next_poll = (*delay).max(Duration::from_secs(1)),
                None => failed.push(message.clone()),
            }
        }
    }

    for name in &done.deleted {
        events.normal(event::CLUSTER_STACK_RELEASE_DELETED, format!("deleted {name}"));
    }
    let mut release_errors: Vec<String> = Vec::new();
    for (name, error) in &done.not_deleted {
        let message = format!("failed to delete {name}: {error}");
        events.warning(event::FAILED_TO_DELETE_CLUSTER_STACK_RELEASE, message.clone());
        release_errors.push(message);
    }
    for name in &done.provider_created {
        events.normal(
            event::CREATE_PROVIDER_STACK_RELEASE,
            format!("created the provider object {name}"),
        );
    }
    for name in &done.provider_updated {
        events.normal(
            event::UPDATE_PROVIDER_STACK_RELEASE,
            format!("updated the provider object {name}"),
        );
    }
    for (name, error) in &done.not_ensured {
        release_errors.push(format!("failed to create or update {name}: {error}"));
    }

    if release_errors.is_empty() {
        stack.mark_true(condition::CLUSTER_STACK_RELEASES_SYNCED);
    } else {
        stack.mark_false(
            condition::CLUSTER_STACK_RELEASES_SYNCED,
            reason::FAILED_TO_CREATE_OR_UPDATE,
            Severity::Warning,
            release_errors.join("; "),
        );
        failed.extend(release_errors);
    }
    if !actions.provider_objects {
        stack.delete_condition(condition::PROVIDER_CLUSTER_STACK_RELEASES_SYNCED);
    } else if let Some((not_found, _)) = done.provider_failed.first() {
        let message = done
            .provider_failed
            .iter()
            .map(|(_, m)| m.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        let (reason, severity) = if *not_found {
            (reason::PROVIDER_TEMPLATE_NOT_FOUND, Severity::Error)
        } else {
            (reason::FAILED_TO_CREATE_OR_UPDATE, Severity::Warning)
        };
        stack.mark_false(
            condition::PROVIDER_CLUSTER_STACK_RELEASES_SYNCED,
            reason,
            severity,
            message.clone(),
        );
        failed.push(message);
    } else {
        stack.mark_true(condition::PROVIDER_CLUSTER_STACK_RELEASES_SYNCED);
    }

    // Status from what exists now: the releases observed less those deleted (one created in this pass has
    // no status yet).
    let remaining: Vec<&ClusterStackRelease> = observed
        .releases
        .iter()
        .filter(|r| !done.deleted.contains(&r.name_any()))
        .collect();
    let status = stack.status.get_or_insert_with(ClusterStackStatus::default);
    status.summary = actions
        .plan
        .wanted
        .iter()
        .map(|id| release_summary(id, remaining.iter().copied().find(|r| r.name_any() == id.tag())))
        .collect();
    let mut usable: Vec<ReleaseId> = remaining
        .iter()
        .filter(|r| r.status.as_ref().is_some_and(|s| s.ready))
        .filter_map(|r| ReleaseId::parse_tag(&r.name_any()).ok())
        .collect();
    usable.sort();
    status.usable_versions = usable
        .iter()
        .map(|id| id.version.to_dot())
        .collect::<Vec<_>>()
        .join(", ");
    match &actions.plan.latest_ready {
        Some(latest) => {
            let kubernetes = remaining
                .iter()
                .find(|r| r.name_any() == latest.tag())
                .and_then(|r| r.status.as_ref())
                .map(|s| s.kubernetes_version.clone())
                .unwrap_or_default();
            status.latest_release = format!("{} | {kubernetes}", latest.cluster_class_name());
            stack.mark_true(condition::CLUSTER_STACK_RELEASE_AVAILABLE);
        }
        None => {
            status.latest_release.clear();
            stack.mark_false(
                condition::CLUSTER_STACK_RELEASE_AVAILABLE,
                reason::NO_READY_RELEASE,
                Severity::Info,
                "no release of the cluster stack is ready yet",
            );
        }
    }

    let outcome = if !failed.is_empty() {
        Outcome::Retry(failed.join("; "))
    } else if observed.spec.auto_subscribe {
        Outcome::Requeue(Some(next_poll))
    } else {
        Outcome::Requeue(None)
    };
    (events, outcome)
}
