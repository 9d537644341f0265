//! The ClusterStack's decisions (pure): what to create, update and delete ([`actions`], from the release
//! plan of [`super::plan`]) and, from what the act step reports, the status, the events and the retry
//! ([`conclude`]). `status.usableVersions` and the summary come from the releases that exist after the act
//! step, not from what was planned.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use cso_api::{
    ClusterStack, ClusterStackRelease, ClusterStackReleaseSpec, ClusterStackStatus, ReleaseId,
    conditions::{ConditionsExt, Severity},
    names::{condition, event, reason},
    rules::StackSpec,
};
use kube::ResourceExt;

use super::{
    plan::{Available, ExistingRelease, Plan, plan},
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
    /// The Clusters (`namespace/name`) using each release, for telling them about a release that cannot be had.
    pub(crate) users: BTreeMap<ReleaseId, BTreeSet<String>>,
    /// Which releases of the stack's channel the source or the cache has; asked only when a Cluster uses a
    /// release that nothing else wants ([`super::plan::needs_availability`]).
    pub(crate) available: Available,
}

/// Something to say on a Cluster (not on the ClusterStack being reconciled).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ClusterReport {
    /// `namespace/name` of the Cluster.
    pub(crate) cluster: String,
    /// What it is about (the release): a Cluster is told once per release while it lasts.
    pub(crate) about: String,
    pub(crate) reason: &'static str,
    pub(crate) note: String,
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
    /// The spec of the release when it exists (its `providerRef` and `digest`).
    pub(crate) existing: Option<ClusterStackReleaseSpec>,
    /// The manifest digest the release is pinned to (`spec.versionDigests`): its `spec.digest`.
    pub(crate) pin: Option<String>,
}

/// Decides the writes for `observed`; `no_provider` is the stack's `spec.noProvider`.
pub(crate) fn actions(observed: &Observed, no_provider: bool) -> Actions {
    let existing = existing_releases(&observed.releases);
    let latest_remote = match &observed.source {
        SourceListing::Latest(latest) => latest.as_ref(),
        _ => None,
    };
    let plan = plan(
        &observed.spec,
        &existing,
        latest_remote,
        &observed.in_use,
        &observed.available,
    );
    let ensure = plan
        .wanted
        .iter()
        .map(|id| {
            let name = id.tag();
            let existing = observed
                .releases
                .iter()
                .find(|r| r.name_any() == name)
                .map(|r| r.spec.clone());
            let pin = observed.spec.pin(id).map(str::to_owned);
            Ensure { name, existing, pin }
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
    } else if observed.spec.auto_subscribe || !actions.plan.unavailable_in_use.is_empty() {
        // A release a Cluster asks for may be published later: asked again at the next poll.
        Outcome::Requeue(Some(next_poll))
    } else {
        Outcome::Requeue(None)
    };
    (events, outcome)
}

/// What to tell Clusters: each Cluster using a release of the stack that does not exist and cannot be had
/// gets a Warning naming the versions there are. `source` names where releases come from (`github`, ...).
pub(crate) fn cluster_reports(
    stack: &str,
    observed: &Observed,
    actions: &Actions,
    source: &str,
) -> Vec<ClusterReport> {
    let there_are = match &observed.available {
        Available::Only(ids) if !ids.is_empty() => {
            let versions: Vec<String> = ids.iter().map(|id| id.version.to_dot()).collect();
            format!("; it has {}", versions.join(", "))
        }
        _ => String::new(),
    };
    let mut reports = Vec::new();
    for id in &actions.plan.unavailable_in_use {
        for cluster in observed.users.get(id).into_iter().flatten() {
            reports.push(ClusterReport {
                cluster: cluster.clone(),
                about: id.tag(),
                reason: cso_api::names::event::UNKNOWN_CLUSTER_STACK_RELEASE,
                note: format!(
                    "class {} names release {} of ClusterStack {stack}, which neither the source ({source}) nor \
                     the cache has{there_are}; no release is created for it (a typo in the class?)",
                    id.cluster_class_name(),
                    id.tag(),
                ),
            });
        }
    }
    reports
}

#[cfg(test)]
mod tests {
    use cso_api::rules::StackKey;
    use cso_api::{
        Channel, ClusterStackReleaseStatus, KubernetesVersion, Version, conditions::ConditionStatus,
    };
    use rstest::rstest;

    use super::*;

    const POLL: Duration = Duration::from_secs(300);

    fn spec(versions: &[&str], auto_subscribe: bool) -> StackSpec {
        StackSpec {
            stack: StackKey {
                provider: "docker".into(),
                name: "ferrol".into(),
                kubernetes: KubernetesVersion { major: 1, minor: 27 },
            },
            channel: Channel::Stable,
            versions: versions.iter().map(|v| Version::parse_dot(v).unwrap()).collect(),
            auto_subscribe,
            pins: Default::default(),
        }
    }

    fn release(version: &str, ready: bool) -> ClusterStackRelease {
        let mut release =
            ClusterStackRelease::new(&format!("docker-ferrol-1-27-{version}"), Default::default());
        release.status = Some(ClusterStackReleaseStatus {
            ready,
            kubernetes_version: "v1.27.3".into(),
            ..Default::default()
        });
        if ready {
            release.mark_true(condition::HELM_CHART_APPLIED);
        } else {
            release.mark_false(
                condition::HELM_CHART_APPLIED,
                "Rendering",
                Severity::Info,
                "not yet",
            );
        }
        release.set_summary();
        release
    }

    fn id(version: &str) -> ReleaseId {
        ReleaseId::parse_tag(&format!("docker-ferrol-1-27-{version}")).unwrap()
    }

    fn observed(versions: &[&str], releases: Vec<ClusterStackRelease>, source: SourceListing) -> Observed {
        Observed {
            spec: spec(versions, !matches!(source, SourceListing::NotAsked)),
            releases,
            source,
            in_use: BTreeSet::new(),
            users: BTreeMap::new(),
            available: Available::Unknown,
        }
    }

    fn stack() -> ClusterStack {
        ClusterStack::new(
            "ferrol",
            cso_api::ClusterStackSpec {
                provider: "docker".into(),
                name: "ferrol".into(),
                kubernetes_version: "1.27".into(),
                channel: Channel::Stable,
                versions: Vec::new(),
                version_digests: Default::default(),
                auto_subscribe: false,
                no_provider: true,
                provider_ref: None,
            },
        )
    }

    fn condition_of(stack: &ClusterStack, type_: &str) -> Option<(ConditionStatus, Option<String>)> {
        stack.get_condition(type_).map(|c| (c.status, c.reason.clone()))
    }

    const PIN: &str = "sha256:0f2d1a7e3bd1bb4d6a3ba3b1b8e3b0c1d0a0e3f4f5a6b7c8d9e0f1a2b3c4d5e6";

    #[test]
    fn actions_create_the_missing_update_the_existing_and_delete_the_rest() {
        let mut o = observed(
            &["v2", "v3"],
            vec![release("v1", false), release("v2", true)],
            SourceListing::NotAsked,
        );
        // v3 is pinned: the release is made with its digest.
        o.spec.pins.insert(Version::parse_dot("v3").unwrap(), PIN.into());
        let a = actions(&o, false);
        assert_eq!(
            a.delete,
            ["docker-ferrol-1-27-v1"],
            "v1 is not ready, not in use, not listed"
        );
        assert_eq!(
            a.ensure,
            [
                Ensure {
                    name: "docker-ferrol-1-27-v2".into(),
                    existing: Some(Default::default()),
                    pin: None,
                },
                Ensure {
                    name: "docker-ferrol-1-27-v3".into(),
                    existing: None,
                    pin: Some(PIN.into()),
                },
            ]
        );
        assert!(a.provider_objects);
        assert!(!actions(&o, true).provider_objects);
    }

    #[rstest]
    #[case::listed(SourceListing::Latest(Some(id("v4"))), true)]
    #[case::failed(SourceListing::Failed { message: "down".into(), retry_after: None }, false)]
    #[case::unconfigured(SourceListing::Unconfigured("no token".into()), false)]
    fn only_a_listed_remote_release_is_subscribed(#[case] source: SourceListing, #[case] wanted: bool) {
        let a = actions(&observed(&[], vec![release("v1", true)], source), true);
        assert_eq!(a.ensure.iter().any(|e| e.name == "docker-ferrol-1-27-v4"), wanted);
        assert!(
            a.delete.is_empty(),
            "the newest ready release stays whatever the source says"
        );
    }

    #[rstest]
    #[case::not_asked(SourceListing::NotAsked, None, None, Outcome::Requeue(None))]
    #[case::listed(
        SourceListing::Latest(None),
        Some((ConditionStatus::True, None)),
        Some((ConditionStatus::True, None)),
        Outcome::Requeue(Some(POLL))
    )]
    #[case::unconfigured(
        SourceListing::Unconfigured("GIT_ACCESS_TOKEN is not set".into()),
        Some((ConditionStatus::False, Some(reason::FAILED_CREATE_ASSETS_CLIENT.to_owned()))),
        None,
        Outcome::Retry("GIT_ACCESS_TOKEN is not set".into())
    )]
    #[case::failed(
        SourceListing::Failed { message: "503".into(), retry_after: None },
        None,
        Some((ConditionStatus::False, Some(reason::FAILED_TO_SYNC.to_owned()))),
        Outcome::Retry("503".into())
    )]
    #[case::rate_limited(
        SourceListing::Failed { message: "rate limited".into(), retry_after: Some(Duration::from_millis(10)) },
        None,
        Some((ConditionStatus::False, Some(reason::FAILED_TO_SYNC.to_owned()))),
        Outcome::Requeue(Some(Duration::from_secs(1)))
    )]
    fn the_source_listing_sets_its_conditions_and_the_next_poll(
        #[case] source: SourceListing,
        #[case] assets_client: Option<(ConditionStatus, Option<String>)>,
        #[case] releases_synced: Option<(ConditionStatus, Option<String>)>,
        #[case] outcome: Outcome,
    ) {
        let o = observed(&["v1"], vec![release("v1", true)], source);
        let a = actions(&o, true);
        let mut s = stack();
        let (events, got) = conclude(&mut s, &o, &a, &Done::default(), POLL);
        assert_eq!(got, outcome);
        assert_eq!(
            condition_of(&s, condition::ASSETS_CLIENT_API_AVAILABLE),
            assets_client
        );
        assert_eq!(condition_of(&s, condition::RELEASES_SYNCED), releases_synced);
        let failures = [assets_client, releases_synced]
            .iter()
            .filter(|c| matches!(c, Some((ConditionStatus::False, _))))
            .count();
        assert_eq!(events.0.len(), failures, "one event per failing source condition");
    }

    #[test]
    fn usable_versions_and_the_summary_come_from_what_exists_after_the_act_step() {
        let o = observed(
            &["v3"],
            vec![release("v1", true), release("v2", true), release("v3", true)],
            SourceListing::NotAsked,
        );
        let a = actions(&o, true);
        assert_eq!(a.delete, ["docker-ferrol-1-27-v1", "docker-ferrol-1-27-v2"]);
        let done = Done {
            deleted: vec!["docker-ferrol-1-27-v1".into()],
            not_deleted: vec![("docker-ferrol-1-27-v2".into(), "forbidden".into())],
            ..Default::default()
        };
        let mut s = stack();
        let (events, outcome) = conclude(&mut s, &o, &a, &done, POLL);
        let status = s.status.clone().unwrap();
        assert_eq!(
            status.usable_versions, "v2, v3",
            "v2 could not be deleted: it still exists and is ready"
        );
        assert_eq!(status.latest_release, "docker-ferrol-1-27-v3 | v1.27.3");
        assert_eq!(
            events.reasons(),
            [
                event::CLUSTER_STACK_RELEASE_DELETED,
                event::FAILED_TO_DELETE_CLUSTER_STACK_RELEASE
            ]
        );
        assert!(matches!(outcome, Outcome::Retry(m) if m.contains("failed to delete docker-ferrol-1-27-v2")));
        assert_eq!(
            condition_of(&s, condition::CLUSTER_STACK_RELEASES_SYNCED),
            Some((
                ConditionStatus::False,
                Some(reason::FAILED_TO_CREATE_OR_UPDATE.to_owned())
            ))
        );
        assert!(s.is_condition_true(condition::CLUSTER_STACK_RELEASE_AVAILABLE));
    }

    #[test]
    fn a_release_created_in_this_pass_is_summarised_without_a_status() {
        let o = observed(&["v1", "v2"], vec![release("v1", true)], SourceListing::NotAsked);
        let a = actions(&o, true);
        let mut s = stack();
        let (_, outcome) = conclude(&mut s, &o, &a, &Done::default(), POLL);
        assert_eq!(outcome, Outcome::Requeue(None));
        let summary = &s.status.as_ref().unwrap().summary;
        assert_eq!(
            summary
                .iter()
                .map(|e| (e.name.as_str(), e.ready))
                .collect::<Vec<_>>(),
            [("v1", true), ("v2", false)]
        );
        assert!(s.is_condition_true(condition::CLUSTER_STACK_RELEASES_SYNCED));
        assert_eq!(
            condition_of(&s, condition::PROVIDER_CLUSTER_STACK_RELEASES_SYNCED),
            None,
            "noProvider"
        );
    }

    #[test]
    fn no_ready_release_is_said() {
        let o = observed(&["v1"], vec![release("v1", false)], SourceListing::NotAsked);
        let mut s = stack();
        conclude(&mut s, &o, &actions(&o, true), &Done::default(), POLL);
        assert_eq!(s.status.as_ref().unwrap().latest_release, "");
        assert_eq!(
            condition_of(&s, condition::CLUSTER_STACK_RELEASE_AVAILABLE),
            Some((ConditionStatus::False, Some(reason::NO_READY_RELEASE.to_owned())))
        );
    }

    #[rstest]
    #[case::created(Done { provider_created: vec!["r".into()], ..Default::default() }, Some((ConditionStatus::True, None)), vec![event::CREATE_PROVIDER_STACK_RELEASE])]
    #[case::updated(Done { provider_updated: vec!["r".into()], ..Default::default() }, Some((ConditionStatus::True, None)), vec![event::UPDATE_PROVIDER_STACK_RELEASE])]
    #[case::template_missing(
        Done { provider_failed: vec![(true, "template not found".into())], ..Default::default() },
        Some((ConditionStatus::False, Some(reason::PROVIDER_TEMPLATE_NOT_FOUND.to_owned()))),
        vec![]
    )]
    #[case::write_failed(
        Done { provider_failed: vec![(false, "conflict".into())], ..Default::default() },
        Some((ConditionStatus::False, Some(reason::FAILED_TO_CREATE_OR_UPDATE.to_owned()))),
        vec![]
    )]
    fn provider_objects_are_reported(
        #[case] done: Done,
        #[case] expected: Option<(ConditionStatus, Option<String>)>,
        #[case] events: Vec<&str>,
    ) {
        let o = observed(&["v1"], vec![release("v1", true)], SourceListing::NotAsked);
        let mut s = stack();
        let (got, outcome) = conclude(&mut s, &o, &actions(&o, false), &done, POLL);
        assert_eq!(
            condition_of(&s, condition::PROVIDER_CLUSTER_STACK_RELEASES_SYNCED),
            expected
        );
        assert_eq!(got.reasons(), events);
        assert_eq!(
            matches!(outcome, Outcome::Retry(_)),
            !done.provider_failed.is_empty()
        );
    }

    #[test]
    fn a_release_that_cannot_be_created_is_retried() {
        let o = observed(&["v1"], vec![], SourceListing::NotAsked);
        let done = Done {
            not_ensured: vec![("docker-ferrol-1-27-v1".into(), "quota".into())],
            ..Default::default()
        };
        let mut s = stack();
        let (_, outcome) = conclude(&mut s, &o, &actions(&o, true), &done, POLL);
        assert!(
            matches!(outcome, Outcome::Retry(m) if m == "failed to create or update docker-ferrol-1-27-v1: quota")
        );
    }

    #[test]
    fn an_invalid_spec_waits_for_a_change() {
        let mut s = stack();
        assert_eq!(
            conclude_invalid(&mut s, "spec.versions: \"x\": bad"),
            Outcome::Requeue(None)
        );
        assert_eq!(
            condition_of(&s, condition::CLUSTER_STACK_RELEASES_SYNCED),
            Some((ConditionStatus::False, Some(reason::INVALID_SPEC.to_owned())))
        );
    }

    #[test]
    fn releases_in_use_are_kept_and_created() {
        let mut o = observed(
            &["v2"],
            vec![release("v1", false), release("v2", true)],
            SourceListing::NotAsked,
        );
        o.in_use = [id("v1"), id("v5")].into();
        let a = actions(&o, true);
        assert!(a.delete.is_empty(), "v1 is used by a Cluster");
        assert!(
            a.ensure
                .iter()
                .any(|e| e.name == "docker-ferrol-1-27-v5" && e.existing.is_none())
        );
    }

    #[rstest]
    // The source has v1 and v2; a Cluster names v8: not created, its Clusters told, asked again at the poll.
    #[case::a_typo(&["v1", "v2"], false, Outcome::Requeue(Some(POLL)), 2)]
    // The source has v8: created for its Clusters, nobody told.
    #[case::published(&["v1", "v8"], true, Outcome::Requeue(None), 0)]
    fn a_release_a_cluster_names_is_created_only_if_it_can_be_had(
        #[case] at_source: &[&str],
        #[case] created: bool,
        #[case] outcome: Outcome,
        #[case] told: usize,
    ) {
        let mut o = observed(&["v1"], vec![release("v1", true)], SourceListing::NotAsked);
        o.in_use = [id("v8")].into();
        o.users = [(id("v8"), ["ns/c1".to_owned(), "ns/c2".to_owned()].into())].into();
        o.available = Available::Only(at_source.iter().map(|v| id(v)).collect());
        let a = actions(&o, true);
        assert_eq!(
            a.ensure.iter().any(|e| e.name == "docker-ferrol-1-27-v8"),
            created
        );
        let mut s = stack();
        let (_, got) = conclude(&mut s, &o, &a, &Done::default(), POLL);
        assert_eq!(got, outcome);
        let reports = cluster_reports("ferrol", &o, &a, "github");
        assert_eq!(reports.len(), told);
        if let Some(first) = reports.first() {
            assert_eq!(first.cluster, "ns/c1");
            assert_eq!(first.reason, cso_api::names::event::UNKNOWN_CLUSTER_STACK_RELEASE);
            assert!(
                first.note.contains("docker-ferrol-1-27-v8") && first.note.contains("it has v1, v2"),
                "{}",
                first.note
            );
        }
        assert!(
            s.is_condition_true(condition::CLUSTER_STACK_RELEASES_SYNCED),
            "a Cluster's typo is not the ClusterStack's failure"
        );
    }
}
