//! Table tests of the rollout's rules: wave assignment, the next step, pause and resume, Clusters moved by
//! hand or refused, a Cluster's health, and the spec's checks.

use std::collections::BTreeMap;

use chrono::TimeZone;
use rstest::rstest;
use serde_json::json;

use super::*;
use crate::{
    ClusterAddonSpec, ClusterAddonStatus, ClusterStack, ClusterStackSpec, Version,
    cluster_stack_rollout::{LabelSelectorRequirement, VariableField, VariableValue, Wave},
    common::ObjectReference,
    conditions::{Condition, Severity},
};

fn t(seconds: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000 + seconds, 0).unwrap()
}

fn release(version: &str) -> ReleaseId {
    ReleaseId::parse_tag(&format!("docker-ferrol-1-27-{version}")).unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn selector(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
    Some(LabelSelector {
        match_labels: labels(pairs),
        ..LabelSelector::default()
    })
}

/// A Cluster `ns/<name>` on `version` with `ring` as its ring label (none when empty), not done.
fn cluster(name: &str, version: &str, ring: &str) -> Candidate {
    Candidate {
        name: format!("ns/{name}"),
        labels: if ring.is_empty() {
            labels(&[])
        } else {
            labels(&[("ring", ring)])
        },
        release: release(version),
        generation: Some(1),
        health: Err("its addons are not ready".to_owned()),
    }
}

fn done(mut c: Candidate) -> Candidate {
    c.health = Ok(());
    c
}

fn stack() -> StackSpec {
    let stack = ClusterStack::new(
        "ferrol",
        ClusterStackSpec {
            provider: "docker".into(),
            name: "ferrol".into(),
            kubernetes_version: "1.27".into(),
            channel: Default::default(),
            versions: vec!["v1".into(), "v2".into()],
            version_digests: BTreeMap::new(),
            auto_subscribe: false,
            no_provider: true,
            provider_ref: None,
        },
    );
    StackSpec::parse(&stack).unwrap()
}

/// canary (ring=canary), early (ring=early, maxInProgress 2), late (the rest); bake 10 min, timeout 5 min.
fn three_waves() -> Plan {
    let spec = ClusterStackRolloutSpec {
        waves: vec![
            Wave {
                name: "canary".into(),
                cluster_selector: selector(&[("ring", "canary")]),
                max_in_progress: None,
            },
            Wave {
                name: "early".into(),
                cluster_selector: selector(&[("ring", "early")]),
                max_in_progress: Some(2),
            },
            Wave {
                name: "late".into(),
                cluster_selector: None,
                max_in_progress: None,
            },
        ],
        bake_time: Some("10m".into()),
        wave_timeout: Some("5m".into()),
        ..ClusterStackRolloutSpec::to("ferrol", "v2")
    };
    Plan::of(&spec, &stack()).unwrap()
}

fn moved(name: &str, wave: &str, at: i64) -> ClusterMove {
    ClusterMove {
        cluster: format!("ns/{name}"),
        wave: wave.into(),
        outcome: outcome::MOVED.into(),
        from: "docker-ferrol-1-27-v1".into(),
        at: t(at),
        generation: None,
        reasons: Vec::new(),
        variables_dropped: Vec::new(),
        variables_changed: Vec::new(),
        rollout_generation: None,
    }
}

fn refused(name: &str, generation: i64) -> ClusterMove {
    ClusterMove {
        cluster: format!("ns/{name}"),
        wave: "early".into(),
        outcome: outcome::REFUSED.into(),
        from: "docker-ferrol-1-27-v1".into(),
        at: t(0),
        generation: Some(generation),
        reasons: vec!["variable imageRepository: the new schema refuses its value".into()],
        variables_dropped: Vec::new(),
        variables_changed: Vec::new(),
        rollout_generation: None,
    }
}

fn finished(name: &str, at: i64) -> WaveStatus {
    WaveStatus {
        name: name.into(),
        finished_at: Some(t(at)),
        ..WaveStatus::default()
    }
}

fn state_of<'a>(a: &'a Assessment, name: &str) -> Option<&'a State> {
    a.states
        .iter()
        .find(|(n, _, _)| n == &format!("ns/{name}"))
        .map(|(_, _, s)| s)
}

fn wave_of(a: &Assessment, name: &str) -> Option<String> {
    a.states
        .iter()
        .find(|(n, _, _)| n == &format!("ns/{name}"))
        .map(|(_, w, _)| a.waves[*w].name.clone())
}

fn fleet() -> Vec<Candidate> {
    vec![
        cluster("a", "v1", "canary"),
        cluster("b", "v1", "early"),
        cluster("c", "v1", "early"),
        cluster("d", "v1", "early"),
        cluster("e", "v1", ""),
        cluster("f", "v1", "late"),
    ]
}

#[rstest]
#[case::a_label_of_the_first_wave("a", Some("canary"))]
#[case::a_label_of_the_second_wave("b", Some("early"))]
#[case::no_label_goes_to_the_wave_without_a_selector("e", Some("late"))]
#[case::a_label_no_wave_names_too("f", Some("late"))]
fn a_cluster_belongs_to_the_first_wave_whose_selector_matches(
    #[case] name: &str,
    #[case] wave: Option<&str>,
) {
    let a = assess(&three_waves(), &fleet(), &[], &[], t(0));
    assert_eq!(wave_of(&a, name).as_deref(), wave);
}

#[test]
fn who_takes_part() {
    let mut plan = three_waves();
    plan.selector = Some(LabelSelector {
        match_expressions: vec![LabelSelectorRequirement {
            key: "env".into(),
            operator: "NotIn".into(),
            values: vec!["prod".into()],
        }],
        ..LabelSelector::default()
    });
    let mut prod = cluster("prod", "v1", "canary");
    prod.labels.insert("env".into(), "prod".into());
    let other_stack = Candidate {
        release: ReleaseId::parse_tag("docker-scs-1-27-v1").unwrap(),
        ..cluster("scs", "v1", "canary")
    };
    let older_minor = Candidate {
        release: ReleaseId::parse_tag("docker-ferrol-1-26-v5").unwrap(),
        ..cluster("old-minor", "v1", "canary")
    };
    let clusters = vec![
        cluster("a", "v1", "canary"),
        cluster("newer", "v3", "canary"),
        prod,
        other_stack,
        older_minor,
    ];
    let a = assess(&plan, &clusters, &[], &[], t(0));
    let names: Vec<&str> = a.states.iter().map(|(n, _, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["ns/a", "ns/old-minor"],
        "older releases of the same provider and stack (any minor), within the rollout's selector"
    );

    // Without a wave for them, Clusters on older releases are counted as unassigned.
    plan.waves.truncate(1);
    let a = assess(&plan, &fleet(), &[], &[], t(0));
    assert_eq!((a.states.len(), a.unassigned), (1, 5));
}

#[test]
fn the_first_wave_moves_first_and_the_next_waits_for_it_to_be_done_and_baked() {
    let plan = three_waves();
    // Nothing moved yet: the canary.
    let a = assess(&plan, &fleet(), &[], &[], t(0));
    assert_eq!(
        (a.phase, a.current_wave, a.to_move.clone()),
        (phase::PROGRESSING, Some(0), vec!["ns/a".to_owned()])
    );

    // The canary moved, in progress: nothing else moves; the timeout is the next check.
    let mut clusters = fleet();
    clusters[0] = cluster("a", "v2", "canary");
    let moves = [moved("a", "canary", 0)];
    let a = assess(&plan, &clusters, &moves, &[], t(60));
    assert_eq!(state_of(&a, "a"), Some(&State::InProgress));
    assert!(a.to_move.is_empty());
    assert_eq!(a.next_check, Some(Duration::from_secs(241)));

    // Done: the wave is finished now and bakes for 10 minutes; the bake's end is the next check.
    clusters[0] = done(cluster("a", "v2", "canary"));
    let a = assess(&plan, &clusters, &moves, &[], t(120));
    assert_eq!(a.waves[0].finished_at, Some(t(120)));
    assert_eq!((a.current_wave, a.to_move.len()), (Some(0), 0));
    assert_eq!(a.next_check, Some(Duration::from_secs(600)));

    // Still baking a minute later (the finish time is kept from the status).
    let a = assess(&plan, &clusters, &moves, &[finished("canary", 120)], t(180));
    assert_eq!(a.waves[0].finished_at, Some(t(120)));
    assert!(a.to_move.is_empty());

    // Baked: the second wave starts, at most 2 at a time.
    let a = assess(&plan, &clusters, &moves, &[finished("canary", 120)], t(720));
    assert_eq!(a.current_wave, Some(1));
    assert_eq!(a.to_move, ["ns/b", "ns/c"]);

    // One of them in progress: room for one more.
    clusters[1] = cluster("b", "v2", "early");
    let moves = [moved("a", "canary", 0), moved("b", "early", 720)];
    let a = assess(&plan, &clusters, &moves, &[finished("canary", 120)], t(730));
    assert_eq!(a.to_move, ["ns/c"]);
    assert_eq!(
        (a.waves[1].clusters, a.waves[1].moved, a.waves[1].done),
        (3, 1, 0)
    );
}

#[test]
fn a_finished_wave_keeps_its_bake_through_a_cluster_briefly_not_done_and_starts_it_again_after_a_failure() {
    let plan = three_waves();
    let mut clusters = fleet();
    let moves = [moved("a", "canary", 100)];
    let baking = [finished("canary", 120)];
    // Baking since 120; the canary in progress again (Cluster API catching up after a `clusterctl move`):
    // the bake keeps its start, and the next wave does not start meanwhile.
    clusters[0] = cluster("a", "v2", "canary");
    let a = assess(&plan, &clusters, &moves, &baking, t(200));
    assert_eq!(state_of(&a, "a"), Some(&State::InProgress));
    assert_eq!(a.waves[0].finished_at, Some(t(120)));
    assert_eq!((a.current_wave, a.to_move.len()), (Some(0), 0));
    // Done again: the bake ends when it would have (120 + 10 minutes).
    clusters[0] = done(cluster("a", "v2", "canary"));
    let a = assess(&plan, &clusters, &moves, &baking, t(720));
    assert_eq!(a.current_wave, Some(1));
    // Not done past its deadline (100 + 5 minutes): failing, and the bake starts over once it is done.
    clusters[0] = cluster("a", "v2", "canary");
    let a = assess(&plan, &clusters, &moves, &baking, t(500));
    assert!(matches!(state_of(&a, "a"), Some(State::Failing(_))));
    assert_eq!(a.waves[0].finished_at, None);
    clusters[0] = done(cluster("a", "v2", "canary"));
    let a = assess(&plan, &clusters, &moves, &a.waves, t(600));
    assert_eq!(a.waves[0].finished_at, Some(t(600)));
}

#[test]
fn a_wave_that_moved_nothing_needs_no_bake_and_the_last_wave_done_completes() {
    let plan = three_waves();
    // No canary at all: the first wave is empty, finished at once, and the second starts.
    let clusters = vec![cluster("b", "v1", "early"), cluster("e", "v1", "")];
    let a = assess(&plan, &clusters, &[], &[], t(0));
    assert_eq!(
        (a.current_wave, a.to_move.clone()),
        (Some(1), vec!["ns/b".to_owned()])
    );

    // Everything done: completed, even before the last wave's bake (there is no next wave to wait for).
    let clusters = vec![done(cluster("b", "v2", "early")), done(cluster("e", "v2", ""))];
    let moves = [moved("b", "early", 0), moved("e", "late", 100)];
    let previous = [finished("canary", 0), finished("early", 50)];
    let a = assess(&plan, &clusters, &moves, &previous, t(700));
    assert_eq!(a.waves[2].finished_at, Some(t(700)));
    assert_eq!(a.current_wave, Some(2), "the last wave still bakes");
    let a = assess(
        &plan,
        &clusters,
        &moves,
        &[finished("canary", 0), finished("early", 50), finished("late", 0)],
        t(700),
    );
    assert_eq!((a.phase, a.current_wave), (phase::COMPLETED, None));
}

#[test]
fn a_cluster_not_done_in_time_pauses_the_rollout_until_it_recovers_or_is_excluded() {
    let plan = three_waves();
    let mut clusters = fleet();
    clusters[0] = done(cluster("a", "v2", "canary"));
    clusters[1] = {
        let mut b = cluster("b", "v2", "early");
        b.health = Err("its addons are not ready: ClusterReady: the workload cluster is unreachable".into());
        b
    };
    let moves = [moved("a", "canary", 0), moved("b", "early", 700)];
    let previous = [finished("canary", 60)];
    // 4 minutes after the move: in progress, c goes on.
    let a = assess(&plan, &clusters, &moves, &previous, t(940));
    assert_eq!(
        (a.phase, a.to_move.clone()),
        (phase::PROGRESSING, vec!["ns/c".to_owned()])
    );
    // After the 5 minutes: failing, paused, nothing moves, the wave names it and why.
    let a = assess(&plan, &clusters, &moves, &previous, t(1001));
    assert_eq!(a.phase, phase::PAUSED);
    assert!(a.to_move.is_empty());
    let failing = vec![FailingCluster {
        cluster: "ns/b".into(),
        reason: "its addons are not ready: ClusterReady: the workload cluster is unreachable".into(),
    }];
    assert_eq!(a.hold, Some(Hold::Failing(failing.clone())));
    assert_eq!((a.waves[1].failing, &a.waves[1].failing_clusters), (1, &failing));
    assert_eq!(a.current_wave, Some(1), "later waves are not touched");

    // It recovers: the rollout goes on.
    clusters[1] = done(cluster("b", "v2", "early"));
    let a = assess(&plan, &clusters, &moves, &previous, t(1100));
    assert_eq!(
        (a.phase, a.to_move.clone()),
        (phase::PROGRESSING, vec!["ns/c".to_owned(), "ns/d".to_owned()])
    );

    // Or a person excludes it from the rollout with a label: the same.
    let mut plan = plan;
    plan.selector = selector(&[("rollout", "yes")]);
    let mut clusters = fleet();
    for c in &mut clusters {
        c.labels.insert("rollout".into(), "yes".into());
    }
    clusters[0] = done(Candidate {
        labels: labels(&[("ring", "canary"), ("rollout", "yes")]),
        ..cluster("a", "v2", "canary")
    });
    clusters[1] = cluster("b", "v2", "early");
    clusters[1].labels.insert("rollout".into(), "yes".into());
    let a = assess(&plan, &clusters, &moves, &previous, t(1100));
    assert_eq!(a.phase, phase::PAUSED);
    clusters[1].labels.remove("rollout");
    let a = assess(&plan, &clusters, &moves, &previous, t(1100));
    assert_eq!(
        (a.phase, a.to_move.clone()),
        (phase::PROGRESSING, vec!["ns/c".to_owned(), "ns/d".to_owned()])
    );
}

#[test]
fn spec_paused_holds_the_moves_and_reports_the_rest() {
    let mut plan = three_waves();
    plan.paused = true;
    let a = assess(&plan, &fleet(), &[], &[], t(0));
    assert_eq!(
        (a.phase, a.hold.clone(), a.to_move.len()),
        (phase::PAUSED, Some(Hold::BySpec), 0)
    );
    assert_eq!(a.waves.iter().map(|w| w.clusters).sum::<i32>(), 6);
}

#[test]
fn clusters_moved_by_hand_are_counted_and_never_fought() {
    let plan = three_waves();
    let mut clusters = fleet();
    // e (wave late) moved to v2 by hand: found, counted as moved in its wave, not moved again.
    clusters[4] = cluster("e", "v2", "");
    let a = assess(&plan, &clusters, &[], &[], t(0));
    assert_eq!(state_of(&a, "e"), Some(&State::InProgress));
    let found = a.moves.iter().find(|m| m.cluster == "ns/e").unwrap();
    assert_eq!(
        (found.outcome.as_str(), found.at, found.wave.as_str()),
        (outcome::FOUND, t(0), "late")
    );
    assert_eq!(a.waves[2].moved, 1);

    // a, moved by the rollout, was moved back to v1 (or on to v3) by someone: left alone, and its wave
    // finishes without it; moved back, it is skipped (not on the release), moved on it is not.
    for (elsewhere, state, skipped) in [("v1", State::MovedAway, 1), ("v3", State::MovedOn, 0)] {
        clusters[0] = cluster("a", elsewhere, "canary");
        let a = assess(&plan, &clusters, &[moved("a", "canary", 0)], &[], t(60));
        assert_eq!(state_of(&a, "a"), Some(&state), "{elsewhere}");
        assert!(!a.to_move.contains(&"ns/a".to_owned()));
        assert_eq!(
            (a.waves[0].skipped, a.waves[0].finished_at),
            (skipped, Some(t(60)))
        );
        assert_eq!(a.current_wave, Some(1));
    }
}

#[test]
fn a_refused_cluster_is_skipped_until_it_changes() {
    let plan = three_waves();
    let mut clusters = fleet();
    clusters[0] = done(cluster("a", "v2", "canary"));
    let previous = [finished("canary", 0)];
    let moves = [moved("a", "canary", 0), refused("b", 1)];
    let a = assess(&plan, &clusters, &moves, &previous, t(700));
    assert_eq!(state_of(&a, "b"), Some(&State::Refused));
    assert_eq!(a.to_move, ["ns/c", "ns/d"]);
    assert_eq!(a.waves[1].skipped, 1);
    assert!(a.moves.iter().any(|m| m.cluster == "ns/b"), "the refusal is kept");

    // The rollout's spec changed (spec.variables.followClassDefaults turned on, say): asked again.
    let mut changed = plan.clone();
    changed.spec_generation = Some(2);
    let a = assess(&changed, &clusters, &moves, &previous, t(700));
    assert_eq!(state_of(&a, "b"), Some(&State::Waiting));

    // The Cluster changed (a new generation: its variables edited): asked again.
    clusters[1].generation = Some(2);
    let a = assess(&plan, &clusters, &moves, &previous, t(700));
    assert_eq!(state_of(&a, "b"), Some(&State::Waiting));
    assert_eq!(a.to_move, ["ns/b", "ns/c"]);
    assert!(
        !a.moves.iter().any(|m| m.cluster == "ns/b"),
        "the stale refusal is dropped"
    );
}

#[test]
fn every_wave_through_with_a_cluster_skipped_is_incomplete_until_it_moves() {
    let plan = three_waves();
    let every_wave_baked = [finished("canary", 0), finished("early", 0), finished("late", 0)];
    // a and e moved and done; b (early) refused and still on v1.
    let mut clusters = vec![
        done(cluster("a", "v2", "canary")),
        cluster("b", "v1", "early"),
        done(cluster("e", "v2", "")),
    ];
    let moves = [moved("a", "canary", 0), refused("b", 1), moved("e", "late", 0)];
    let a = assess(&plan, &clusters, &moves, &every_wave_baked, t(2000));
    assert_eq!((a.phase, a.current_wave), (phase::INCOMPLETE, None));
    assert_eq!(a.count(State::skipped), 1);

    // Its owner fixed it and moved it by hand: on the release and done, the rollout is complete.
    clusters[1] = done(cluster("b", "v2", "early"));
    clusters[1].generation = Some(2);
    let a = assess(&plan, &clusters, &moves, &every_wave_baked, t(2000));
    assert_eq!((a.phase, a.count(State::skipped)), (phase::COMPLETED, 0));

    // Moved back to v1 after the rollout moved it: skipped again.
    let moves = [
        moved("a", "canary", 0),
        moved("b", "early", 0),
        moved("e", "late", 0),
    ];
    clusters[1] = cluster("b", "v1", "early");
    let a = assess(&plan, &clusters, &moves, &every_wave_baked, t(2000));
    assert_eq!(state_of(&a, "b"), Some(&State::MovedAway));
    assert_eq!(a.phase, phase::INCOMPLETE);

    // Moved on to a newer release (the next rollout): nothing left behind.
    clusters[1] = done(cluster("b", "v3", "early"));
    let a = assess(&plan, &clusters, &moves, &every_wave_baked, t(2000));
    assert_eq!(state_of(&a, "b"), Some(&State::MovedOn));
    assert_eq!((a.phase, a.count(State::skipped)), (phase::COMPLETED, 0));
}

fn addon(class: &str, ready: bool, conditions: Vec<Condition>) -> ClusterAddon {
    let mut addon = ClusterAddon::new(
        "cluster-addon-a",
        ClusterAddonSpec {
            cluster_stack: class.into(),
            version: String::new(),
            hook: String::new(),
            cluster_ref: ObjectReference::default(),
        },
    );
    addon.status = Some(ClusterAddonStatus {
        ready,
        conditions,
        ..ClusterAddonStatus::default()
    });
    addon
}

fn condition(type_: &str, status: ConditionStatus, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status,
        severity: (status == ConditionStatus::False).then_some(Severity::Warning),
        last_transition_time: t(0),
        reason: Some("Reason".into()),
        message: Some(message.into()),
    }
}

fn capi_cluster(generation: i64, observed: i64, conditions: serde_json::Value) -> serde_json::Value {
    json!({"metadata": {"name": "a", "generation": generation},
           "status": {"observedGeneration": observed, "conditions": conditions}})
}

fn reconciled() -> serde_json::Value {
    json!([{"type": "TopologyReconciled", "status": "True"},
           {"type": "ControlPlaneMachinesUpToDate", "status": "True"}])
}

const V2: &str = "docker-ferrol-1-27-v2";

#[rstest]
#[case::done(Some(addon(V2, true, vec![])), capi_cluster(3, 3, reconciled()), None)]
#[case::no_addon(None, capi_cluster(3, 3, reconciled()), Some("no ClusterAddon"))]
#[case::addons_of_the_old_release(Some(addon("docker-ferrol-1-27-v1", true, vec![])), capi_cluster(3, 3, reconciled()), Some("not on docker-ferrol-1-27-v2 yet (on docker-ferrol-1-27-v1)"))]
#[case::addons_not_ready_says_why(Some(addon(V2, false, vec![condition("ClusterReady", ConditionStatus::False, "unreachable")])), capi_cluster(3, 3, reconciled()), Some("not ready: ClusterReady: unreachable"))]
#[case::addons_not_running(Some(addon(V2, true, vec![condition("AddonsHealthy", ConditionStatus::False, "cilium 0/1")])), capi_cluster(3, 3, reconciled()), Some("do not run: cilium 0/1"))]
#[case::cluster_api_behind(Some(addon(V2, true, vec![])), capi_cluster(4, 3, reconciled()), Some("has not reconciled the move"))]
#[case::topology_not_reconciled(Some(addon(V2, true, vec![])), capi_cluster(3, 3, json!([{"type": "TopologyReconciled", "status": "False", "reason": "ClusterUpgrading", "message": "Control plane rollout"}])), Some("TopologyReconciled is False: ClusterUpgrading: Control plane rollout"))]
#[case::no_topology_condition(Some(addon(V2, true, vec![])), capi_cluster(3, 3, json!([])), Some("not reported TopologyReconciled"))]
#[case::workers_out_of_date(Some(addon(V2, true, vec![])), capi_cluster(3, 3, json!([{"type": "TopologyReconciled", "status": "True"}, {"type": "WorkerMachinesUpToDate", "status": "False", "message": "2 Machines not up to date"}])), Some("WorkerMachinesUpToDate is False: 2 Machines"))]
#[case::v1beta1_cluster_with_v1beta2_conditions(Some(addon(V2, true, vec![])), json!({"metadata": {"generation": 2}, "status": {"observedGeneration": 2, "conditions": [{"type": "Ready", "status": "True"}], "v1beta2": {"conditions": [{"type": "TopologyReconciled", "status": "True"}]}}}), None)]
fn a_cluster_is_done_when_its_addons_run_the_release_and_cluster_api_is_up_to_date(
    #[case] addon: Option<ClusterAddon>,
    #[case] cluster: serde_json::Value,
    #[case] why_not: Option<&str>,
) {
    let health = health(&cluster, addon.as_ref(), V2);
    match why_not {
        None => assert_eq!(health, Ok(())),
        Some(part) => assert!(
            health.as_ref().is_err_and(|why| why.contains(part)),
            "{health:?} should say {part:?}"
        ),
    }
}

#[test]
fn a_hook_running_is_not_done() {
    let mut a = addon(V2, true, vec![]);
    a.spec.hook = "AfterClusterUpgrade".into();
    assert!(
        health(&capi_cluster(1, 1, reconciled()), Some(&a), V2)
            .unwrap_err()
            .contains("AfterClusterUpgrade")
    );
}

#[rstest]
#[case::fine(|_: &mut ClusterStackRolloutSpec| {}, &[])]
#[case::bad_version(|s: &mut ClusterStackRolloutSpec| s.version = "2".into(), &["spec.version"])]
#[case::bad_durations(|s: &mut ClusterStackRolloutSpec| { s.bake_time = Some("10 minutes".into()); s.wave_timeout = Some("5x".into()); }, &["spec.bakeTime", "spec.waveTimeout"])]
#[case::waves_named_twice_or_not_at_all(|s: &mut ClusterStackRolloutSpec| { s.waves[1].name = "canary".into(); s.waves[2].name = String::new(); }, &["spec.waves[1].name", "spec.waves[2].name"])]
#[case::zero_in_progress(|s: &mut ClusterStackRolloutSpec| s.waves[0].max_in_progress = Some(0), &["spec.waves[0].maxInProgress"])]
#[case::selector_expressions(|s: &mut ClusterStackRolloutSpec| s.cluster_selector = Some(LabelSelector { match_expressions: vec![
    LabelSelectorRequirement { key: "a".into(), operator: "In".into(), values: vec![] },
    LabelSelectorRequirement { key: "b".into(), operator: "Exists".into(), values: vec!["x".into()] },
    LabelSelectorRequirement { key: "c".into(), operator: "Near".into(), values: vec![] },
], ..LabelSelector::default() }), &["spec.clusterSelector.matchExpressions[0]", "spec.clusterSelector.matchExpressions[1]", "spec.clusterSelector.matchExpressions[2]"])]
#[case::variable_changes(|s: &mut ClusterStackRolloutSpec| s.variables = Some(RolloutVariables {
    follow_class_defaults: true,
    set: vec![
        VariableValue { name: "oidcConfig".into(), field: Some("groupsPrefix".into()), value: json!("x") },
        VariableValue { name: String::new(), field: None, value: json!(1) },
        VariableValue { name: "claims".into(), field: Some("user..name".into()), value: json!(1) },
    ],
    remove: vec![
        VariableField { name: "oidcConfig".into(), field: None },
        VariableField { name: "imageRepository".into(), field: None },
    ],
}), &["spec.variables.set[1].name", "spec.variables.set[2].field", "spec.variables.remove[0]"])]
fn the_spec_is_checked_field_by_field(
    #[case] change: fn(&mut ClusterStackRolloutSpec),
    #[case] fields: &[&str],
) {
    let mut spec = ClusterStackRolloutSpec {
        waves: ["canary", "early", "late"]
            .map(|name| Wave {
                name: name.into(),
                ..Wave::default()
            })
            .to_vec(),
        ..ClusterStackRolloutSpec::to("ferrol", "v2")
    };
    change(&mut spec);
    let errors: Vec<String> = validate(&spec).iter().map(|e| e.field.to_string()).collect();
    assert_eq!(errors, fields);
}

#[test]
fn the_plan_of_a_spec_without_waves_is_one_wave_and_the_defaults() {
    let spec = ClusterStackRolloutSpec::to("ferrol", "v2");
    let plan = Plan::of(&spec, &stack()).unwrap();
    assert_eq!(plan.target, release("v2"));
    assert_eq!(
        plan.waves.iter().map(|w| w.name.as_str()).collect::<Vec<_>>(),
        [DEFAULT_WAVE]
    );
    assert_eq!(
        (plan.bake_time, plan.wave_timeout),
        (Duration::ZERO, DEFAULT_WAVE_TIMEOUT)
    );
    // A version of another channel than the ClusterStack's is refused.
    let custom = ClusterStackRolloutSpec {
        version: "v0-sha.abcdef".into(),
        ..spec
    };
    assert!(Plan::of(&custom, &stack()).is_err());
    let _ = Version::parse_dot("v2").unwrap();
}

#[test]
fn the_plan_carries_the_declared_variable_changes_in_order_sets_first() {
    let spec = ClusterStackRolloutSpec {
        variables: Some(RolloutVariables {
            follow_class_defaults: false,
            set: vec![VariableValue {
                name: "oidcConfig".into(),
                field: Some("claims.user".into()),
                value: json!("email"),
            }],
            remove: vec![VariableField {
                name: "imageRepository".into(),
                field: None,
            }],
        }),
        ..ClusterStackRolloutSpec::to("ferrol", "v2")
    };
    let plan = Plan::of(&spec, &stack()).unwrap();
    assert!(!plan.variables.follow_class_defaults);
    assert_eq!(
        plan.variables.declared,
        [
            Declared {
                name: "oidcConfig".into(),
                field: vec!["claims".into(), "user".into()],
                value: Some(json!("email")),
            },
            Declared {
                name: "imageRepository".into(),
                field: vec![],
                value: None,
            },
        ]
    );
    assert_eq!(
        Plan::of(&ClusterStackRolloutSpec::to("ferrol", "v2"), &stack())
            .unwrap()
            .variables,
        VariableRules::default()
    );
}

#[rstest]
#[case::in_(LabelSelectorRequirement { key: "ring".into(), operator: "In".into(), values: vec!["canary".into()] }, true, false)]
#[case::not_in(LabelSelectorRequirement { key: "ring".into(), operator: "NotIn".into(), values: vec!["canary".into()] }, false, true)]
#[case::exists(LabelSelectorRequirement { key: "ring".into(), operator: "Exists".into(), values: vec![] }, true, false)]
#[case::does_not_exist(LabelSelectorRequirement { key: "ring".into(), operator: "DoesNotExist".into(), values: vec![] }, false, true)]
fn selectors_match_as_kubernetes_matches_them(
    #[case] expression: LabelSelectorRequirement,
    #[case] canary: bool,
    #[case] unlabelled: bool,
) {
    let selector = LabelSelector {
        match_expressions: vec![expression],
        ..LabelSelector::default()
    };
    assert_eq!(matches(&selector, &labels(&[("ring", "canary")])), canary);
    assert_eq!(matches(&selector, &labels(&[])), unlabelled);
    assert!(matches(&LabelSelector::default(), &labels(&[])));
}

#[test]
fn a_cluster_just_moved_counts_as_moved_while_the_cache_shows_it_from_before() {
    let plan = three_waves();
    let mut clusters = fleet();
    // The cache's copy of a: generation 1, on v1; the move made generation 2.
    let mut record = moved("a", "canary", 0);
    record.generation = Some(2);
    let a = assess(&plan, &clusters, std::slice::from_ref(&record), &[], t(1));
    assert_eq!(state_of(&a, "a"), Some(&State::InProgress));
    assert!(a.to_move.is_empty(), "not moved again");
    // Seen at the move's generation on v1 (someone moved it back without changing anything else is
    // impossible without a new generation, so a newer generation on v1 is a move back): moved away.
    clusters[0].generation = Some(3);
    let a = assess(&plan, &clusters, &[record], &[], t(1));
    assert_eq!(state_of(&a, "a"), Some(&State::MovedAway));
}
