//! Table tests of the rollout's conclusion: the status, conditions and events from an assessment and what
//! the moves did.

use chrono::TimeZone;
use cso_api::{
    ClusterStack, ClusterStackRolloutSpec, ReleaseId,
    cluster_stack_rollout::Wave,
    conditions::ConditionStatus,
    rules::rollout::{Candidate, assess},
};

use super::*;

fn t(seconds: i64) -> chrono::DateTime<chrono::Utc> {
    chrono::Utc.timestamp_opt(1_800_000_000 + seconds, 0).unwrap()
}

/// ferrol v2 in two waves: `first` (ring=1), `rest`; timeout 1 minute.
fn plan() -> Plan {
    let stack: ClusterStack = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "ferrol"},
        "spec": {"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27", "versions": ["v1", "v2"],
                 "autoSubscribe": false, "noProvider": true}
    }))
    .unwrap();
    let spec = ClusterStackRolloutSpec {
        waves: vec![
            Wave {
                name: "first".into(),
                cluster_selector: Some(cso_api::cluster_stack_rollout::LabelSelector {
                    match_labels: [("ring".to_owned(), "1".to_owned())].into(),
                    ..Default::default()
                }),
                max_in_progress: None,
            },
            Wave {
                name: "rest".into(),
                ..Wave::default()
            },
        ],
        wave_timeout: Some("1m".into()),
        ..ClusterStackRolloutSpec::to("ferrol", "v2")
    };
    Plan::of(&spec, &StackSpec::parse(&stack).unwrap()).unwrap()
}

fn cluster(name: &str, version: &str, ring: &str, done: bool) -> Candidate {
    Candidate {
        name: format!("ns/{name}"),
        labels: [("ring".to_owned(), ring.to_owned())].into(),
        release: ReleaseId::parse_tag(&format!("docker-ferrol-1-27-{version}")).unwrap(),
        generation: Some(1),
        health: if done {
            Ok(())
        } else {
            Err("its addons are not ready".into())
        },
    }
}

fn rollout_with(status: Option<ClusterStackRolloutStatus>) -> ClusterStackRollout {
    let mut rollout = ClusterStackRollout::new("to-v2", ClusterStackRolloutSpec::to("ferrol", "v2"));
    rollout.metadata.generation = Some(3);
    rollout.status = status;
    rollout
}

fn reasons(events: &Events) -> Vec<&'static str> {
    events.0.iter().map(|e| e.reason).collect()
}

#[test]
fn moves_and_refusals_are_recorded_announced_and_counted() {
    let plan = plan();
    let clusters = vec![
        cluster("a", "v1", "1", false),
        cluster("b", "v1", "1", false),
        cluster("c", "v1", "2", false),
    ];
    let before = assess(&plan, &clusters, &[], &[], t(0));
    assert_eq!(before.to_move, ["ns/a", "ns/b"]);
    let results = vec![
        (
            "ns/a".to_owned(),
            MoveResult::Moved {
                from: "docker-ferrol-1-27-v1".into(),
                generation: Some(2),
                dropped: vec!["oidcConfig.groupsPrefix".into()],
                changed: vec!["removed imageRepository (was \"registry.k8s.io\")".into()],
            },
        ),
        (
            "ns/b".to_owned(),
            MoveResult::Refused {
                from: "docker-ferrol-1-27-v1".into(),
                reasons: vec!["variable identityRef: \"type\" is not in the new schema".into()],
                generation: Some(1),
            },
        ),
    ];
    let records = records_after(&plan, &before, &results, t(0));
    assert_eq!(
        records
            .iter()
            .map(|r| (r.cluster.as_str(), r.outcome.as_str(), r.wave.as_str()))
            .collect::<Vec<_>>(),
        [
            ("ns/a", outcome::MOVED, "first"),
            ("ns/b", outcome::REFUSED, "first")
        ]
    );
    let mut moved = clusters.clone();
    moved[0].release = plan.target.clone();
    let after = assess(&plan, &moved, &records, &[], t(0));
    let (status, events) = conclude(&rollout_with(None), &plan, &after, &results, &[]);
    assert_eq!(
        reasons(&events),
        [event::CLUSTER_MOVED, event::MOVE_REFUSED, event::WAVE_STARTED]
    );
    assert!(
        events.0[0].note.ends_with(
            "(left out, as the old class's defaults: oidcConfig.groupsPrefix); as the rollout declares: \
                 removed imageRepository (was \"registry.k8s.io\")"
        ),
        "{}",
        events.0[0].note
    );
    assert_eq!(records[0].variables_dropped, ["oidcConfig.groupsPrefix"]);
    assert_eq!(
        records[0].variables_changed,
        ["removed imageRepository (was \"registry.k8s.io\")"]
    );
    assert_eq!(
        (status.phase.as_str(), status.current_wave.as_str()),
        (phase::PROGRESSING, "first")
    );
    assert_eq!((status.clusters, status.done, status.failing), (3, 0, 0));
    assert_eq!((status.waves[0].moved, status.waves[0].skipped), (1, 1));
    assert_eq!(status.target_class, "docker-ferrol-1-27-v2");
    assert_eq!(status.observed_generation, Some(3));
    let preflight = status.get_condition(condition::PREFLIGHT_PASSED).unwrap();
    assert_eq!(preflight.status, ConditionStatus::False);
    assert!(
        preflight
            .message
            .as_deref()
            .unwrap()
            .contains("ns/b: variable identityRef")
    );
    assert!(status.is_condition_true(condition::CLUSTERS_HEALTHY));
    // A move that could not be made now is announced and not recorded.
    let failed = vec![("ns/a".to_owned(), MoveResult::NotNow("the patch failed".into()))];
    assert!(records_after(&plan, &before, &failed, t(0)).is_empty());
    let not_moved = [("ns/a".to_owned(), "the patch failed".to_owned())];
    let (status, events) = conclude(&rollout_with(None), &plan, &before, &failed, &not_moved);
    assert_eq!(reasons(&events)[0], event::MOVE_FAILED);
    // ... and said in the status while it is tried again: which Cluster, and why.
    let moves = status.get_condition(condition::MOVES_MADE).unwrap();
    assert_eq!(
        (moves.status, moves.reason.as_deref()),
        (ConditionStatus::False, Some(reason::MOVE_FAILED))
    );
    assert_eq!(
        moves.message.as_deref(),
        Some("1 Cluster could not be moved now and is tried again: ns/a: the patch failed")
    );
    // A Cluster no longer waiting for its move (another rollout's, or moved since) is not named.
    let (status, _) = conclude(&rollout_with(None), &plan, &after, &[], &not_moved);
    assert!(status.is_condition_true(condition::MOVES_MADE));
}

#[test]
fn a_failing_cluster_pauses_once_names_it_and_its_recovery_resumes_and_completes() {
    let plan = plan();
    let records = vec![ClusterMove {
        cluster: "ns/a".into(),
        wave: "first".into(),
        outcome: outcome::MOVED.into(),
        from: "docker-ferrol-1-27-v1".into(),
        at: t(0),
        generation: Some(2),
        reasons: Vec::new(),
        variables_dropped: Vec::new(),
        variables_changed: Vec::new(),
        rollout_generation: None,
    }];
    let failing = vec![cluster("a", "v2", "1", false), cluster("c", "v1", "2", false)];
    let after = assess(&plan, &failing, &records, &[], t(120));
    let (paused, events) = conclude(&rollout_with(None), &plan, &after, &[], &[]);
    assert_eq!(paused.phase, phase::PAUSED);
    assert_eq!(reasons(&events), [event::WAVE_STARTED, event::ROLLOUT_PAUSED]);
    let healthy = paused.get_condition(condition::CLUSTERS_HEALTHY).unwrap();
    assert_eq!(
        (healthy.status, healthy.reason.as_deref()),
        (ConditionStatus::False, Some(reason::WAVE_FAILING))
    );
    assert!(
        healthy
            .message
            .as_deref()
            .unwrap()
            .contains("ns/a: its addons are not ready"),
        "{healthy:?}"
    );
    assert_eq!(
        paused.get_condition(cso_api::conditions::READY).unwrap().status,
        ConditionStatus::False
    );

    // Still failing at the next look: no second event.
    let (_, events) = conclude(&rollout_with(Some(paused.clone())), &plan, &after, &[], &[]);
    assert!(events.0.is_empty(), "{events:?}");

    // It recovers: resumed, the next wave starts.
    let recovered = vec![cluster("a", "v2", "1", true), cluster("c", "v1", "2", false)];
    let after = assess(&plan, &recovered, &records, &paused.waves, t(130));
    let (going, events) = conclude(&rollout_with(Some(paused)), &plan, &after, &[], &[]);
    assert_eq!(going.phase, phase::PROGRESSING);
    assert_eq!(reasons(&events), [event::WAVE_STARTED, event::ROLLOUT_RESUMED]);
    assert_eq!(going.current_wave, "rest");

    // Everything done: completed, announced once.
    let done = vec![cluster("a", "v2", "1", true), cluster("c", "v2", "2", true)];
    let after = assess(&plan, &done, &records, &going.waves, t(200));
    let (completed, events) = conclude(&rollout_with(Some(going)), &plan, &after, &[], &[]);
    assert_eq!((completed.phase.as_str(), completed.done), (phase::COMPLETED, 2));
    assert_eq!(reasons(&events), [event::ROLLOUT_COMPLETED]);
    assert!(completed.is_condition_true(cso_api::conditions::READY));
    let (_, events) = conclude(&rollout_with(Some(completed)), &plan, &after, &[], &[]);
    assert!(events.0.is_empty());
}

#[test]
fn a_rollout_that_cannot_start_says_why_once() {
    let blocked = Blocked {
        reason: reason::RELEASE_NOT_READY,
        severity: Severity::Info,
        message: "ClusterStackRelease ns/docker-ferrol-1-27-v2 is not ready yet".into(),
    };
    let (status, events) = conclude_blocked(&rollout_with(None), &blocked);
    assert_eq!(status.phase, phase::PENDING);
    assert!(status.is_condition_false(condition::RELEASE_READY));
    assert_eq!(reasons(&events), [reason::RELEASE_NOT_READY]);
    let (_, events) = conclude_blocked(&rollout_with(Some(status)), &blocked);
    assert!(events.0.is_empty());
    let invalid = Blocked {
        reason: reason::INVALID_SPEC,
        severity: Severity::Error,
        message: "spec.version: invalid".into(),
    };
    let (status, _) = conclude_blocked(&rollout_with(None), &invalid);
    assert!(status.is_condition_false(condition::ROLLOUT_SPEC_VALID));
}

#[test]
fn a_move_that_cannot_be_made_waits_doubling_and_is_announced_once_per_reason() {
    let retries = Retries::default();
    let start = std::time::Instant::now();
    let failed = |why: &str| MoveResult::NotNow(why.into());
    assert!(retries.may_try("ns/a", start));
    assert!(
        retries.record("ns/a", &failed("the dry run could not be made"), start),
        "news"
    );
    assert!(!retries.may_try("ns/a", start));
    assert!(retries.may_try("ns/b", start), "others go on");
    assert_eq!(retries.next_try(start), Some(Duration::from_secs(5)));
    let later = start + Duration::from_secs(5);
    assert!(retries.may_try("ns/a", later));
    assert!(
        !retries.record("ns/a", &failed("the dry run could not be made"), later),
        "the same: quiet"
    );
    assert_eq!(retries.next_try(later), Some(Duration::from_secs(10)), "doubled");
    assert!(
        retries.record("ns/a", &failed("Cluster API refused the move"), later),
        "another reason: news"
    );
    assert_eq!(
        retries.next_try(later + Duration::from_secs(3600)),
        None,
        "nothing waits once due"
    );
    // Moved at last: forgotten.
    let moved = MoveResult::Moved {
        from: "docker-ferrol-1-27-v1".into(),
        generation: Some(2),
        dropped: Vec::new(),
        changed: Vec::new(),
    };
    assert!(!retries.record("ns/a", &moved, later));
    assert!(retries.may_try("ns/a", later));
    assert_eq!(retries.next_try(later), None);
}

#[test]
fn every_wave_through_with_a_refused_cluster_is_incomplete_and_says_how_many() {
    let plan = plan();
    let refused = ClusterMove {
        cluster: "ns/b".into(),
        wave: "first".into(),
        outcome: outcome::REFUSED.into(),
        from: "docker-ferrol-1-27-v1".into(),
        at: t(0),
        generation: Some(1),
        reasons: vec!["variable identityRef: \"type\" is not in the new schema".into()],
        variables_dropped: Vec::new(),
        variables_changed: Vec::new(),
        rollout_generation: None,
    };
    let records = vec![refused];
    let clusters = vec![
        cluster("a", "v2", "1", true),
        cluster("b", "v1", "1", false),
        cluster("c", "v2", "2", true),
    ];
    let after = assess(&plan, &clusters, &records, &[], t(200));
    let going = ClusterStackRolloutStatus {
        phase: phase::PROGRESSING.into(),
        ..Default::default()
    };
    let (status, events) = conclude(&rollout_with(Some(going)), &plan, &after, &[], &[]);
    assert_eq!(
        (status.phase.as_str(), status.done, status.skipped),
        (phase::INCOMPLETE, 2, 1)
    );
    assert_eq!(reasons(&events), [event::ROLLOUT_INCOMPLETE]);
    let note = &events.0[0].note;
    assert!(note.contains("1 skipped, not on it: ns/b"), "{note}");
    assert!(
        !status.is_condition_true(cso_api::conditions::READY),
        "not ready while a Cluster is left behind"
    );
    // Announced once.
    let (_, events) = conclude(&rollout_with(Some(status)), &plan, &after, &[], &[]);
    assert!(events.0.is_empty(), "{events:?}");
}
