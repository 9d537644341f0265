//! The rules of a `ClusterStackRollout`, pure: which Clusters take part and in which wave, how each is doing,
//! which Clusters to move next, when a wave is done and baked, and when the rollout pauses, goes on or is
//! complete. The rollout controller observes (the Cluster and ClusterAddon caches), calls [`assess`], acts
//! (the preflight and the move of each Cluster [`Assessment::to_move`] names) and writes the status that
//! [`assess`] gives for what happened.
//!
//! - **Who takes part**: Clusters whose class is a release of the ClusterStack's provider and stack name (any
//!   Kubernetes minor) in the rollout's namespace, matching `spec.clusterSelector`, that are on an older
//!   release than the target or on the target itself (moved by the rollout or by hand), or that the rollout
//!   moved and someone moved elsewhere since. A Cluster belongs to the first wave whose selector matches it.
//! - **How a Cluster is doing** ([`State`]): waiting for its wave; moved and in progress; *done* when its
//!   ClusterAddon is ready with the release's addons and Cluster API reports the topology reconciled and its
//!   machines up to date ([`health`]); *failing* when it is not done `waveTimeout` after it was moved;
//!   *refused* by the preflight (not asked again until the Cluster changes); *moved away* (the rollout moved
//!   it and someone moved it to another release since: left alone, never fought).
//! - **Waves**: Clusters are moved in the first wave that is not done and baked, at most `maxInProgress` at a
//!   time; a wave is *finished* when each of its Clusters is done, refused or moved away, and *baked*
//!   `bakeTime` after that (a wave that moved nothing needs no bake).
//! - **Pause**: a failing Cluster anywhere pauses the rollout (no Cluster is moved) until it is done or no
//!   longer takes part (a person excludes it with a label); `spec.paused` holds it too.

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::{
    ClusterAddon, ReleaseId,
    cluster_stack_rollout::RolloutVariables,
    cluster_stack_rollout::{
        ClusterMove, ClusterStackRolloutSpec, FailingCluster, LabelSelector, WaveStatus, outcome, phase,
    },
    conditions::{ConditionStatus, ConditionsExt},
    names::condition::ADDONS_HEALTHY,
    rules::{
        FieldError, StackSpec,
        move_variables::{Declared, VariableRules},
    },
    version::Version,
};

/// The wave of a rollout without waves.
pub const DEFAULT_WAVE: &str = "all";
/// `waveTimeout` when unset.
pub const DEFAULT_WAVE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How many failing Clusters a wave's status names.
pub const FAILING_NAMED: usize = 5;

/// A rollout's spec, checked: the release the Clusters move to and the waves.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub target: ReleaseId,
    pub selector: Option<LabelSelector>,
    pub waves: Vec<WavePlan>,
    pub bake_time: Duration,
    pub wave_timeout: Duration,
    pub paused: bool,
    /// `spec.variables`: what the moves do to the Clusters' variables.
    pub variables: VariableRules,
    /// The rollout's `metadata.generation` (set by its controller): refusals made under another are asked
    /// again.
    pub spec_generation: Option<i64>,
}

/// One wave of a [`Plan`].
#[derive(Clone, Debug, PartialEq)]
pub struct WavePlan {
    pub name: String,
    pub selector: Option<LabelSelector>,
    pub max_in_progress: Option<u32>,
}

/// Checks a rollout's spec on its own (what the admission webhook refuses): the version, the durations,
/// the wave names (unique, not empty) and the selectors. Every error is returned, each naming its field.
pub fn validate(spec: &ClusterStackRolloutSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if spec.cluster_stack.is_empty() {
        errors.push(FieldError::new("spec.clusterStack", "must name a ClusterStack"));
    }
    if let Err(e) = Version::parse_dot(&spec.version) {
        errors.push(FieldError::new(
            "spec.version",
            format!("invalid version {:?}: {e}", spec.version),
        ));
    }
    for (field, value) in [
        ("spec.bakeTime", &spec.bake_time),
        ("spec.waveTimeout", &spec.wave_timeout),
    ] {
        if let Some(Err(e)) = value.as_deref().map(crate::duration::parse) {
            errors.push(FieldError::new(field, e));
        }
    }
    if let Some(selector) = &spec.cluster_selector {
        errors.extend(selector_errors(selector, "spec.clusterSelector"));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, wave) in spec.waves.iter().enumerate() {
        if wave.name.is_empty() {
            errors.push(FieldError::new(
                format!("spec.waves[{i}].name"),
                "must not be empty",
            ));
        } else if !seen.insert(wave.name.as_str()) {
            errors.push(FieldError::new(
                format!("spec.waves[{i}].name"),
                format!("wave {:?} is named twice", wave.name),
            ));
        }
        if wave.max_in_progress == Some(0) {
            errors.push(FieldError::new(
                format!("spec.waves[{i}].maxInProgress"),
                "must be at least 1 (leave it out for no limit)",
            ));
        }
        if let Some(selector) = &wave.cluster_selector {
            errors.extend(selector_errors(
                selector,
                &format!("spec.waves[{i}].clusterSelector"),
            ));
        }
    }
    if let Some(variables) = &spec.variables {
        errors.extend(variable_errors(variables));
    }
    errors
}

/// The changes of `spec.variables.set` and `remove`, each with the field it is named at: `name` and the
/// keys of `field`.
fn named_changes(variables: &RolloutVariables) -> Vec<(String, Declared)> {
    let keys = |field: &Option<String>| -> Vec<String> {
        field
            .as_deref()
            .map(|f| f.split('.').map(str::to_owned).collect())
            .unwrap_or_default()
    };
    let set = variables.set.iter().enumerate().map(|(i, v)| {
        (
            format!("spec.variables.set[{i}]"),
            Declared {
                name: v.name.clone(),
                field: keys(&v.field),
                value: Some(v.value.clone()),
            },
        )
    });
    let remove = variables.remove.iter().enumerate().map(|(i, v)| {
        (
            format!("spec.variables.remove[{i}]"),
            Declared {
                name: v.name.clone(),
                field: keys(&v.field),
                value: None,
            },
        )
    });
    set.chain(remove).collect()
}

/// What is wrong with `spec.variables`: a change without a variable's name, a field with an empty key, two
/// changes of the same value or of a value and a field inside it (which one wins would be a guess).
fn variable_errors(variables: &RolloutVariables) -> Vec<FieldError> {
    let changes = named_changes(variables);
    let mut errors = Vec::new();
    for (i, (at, change)) in changes.iter().enumerate() {
        if change.name.is_empty() {
            errors.push(FieldError::new(format!("{at}.name"), "must name a variable"));
        }
        if change.field.iter().any(String::is_empty) {
            errors.push(FieldError::new(
                format!("{at}.field"),
                "keys joined by dots, none of them empty (leave it out for the whole variable)",
            ));
        }
        let path = |c: &Declared| -> Vec<String> {
            std::iter::once(c.name.clone())
                .chain(c.field.iter().cloned())
                .collect()
        };
        let this = path(change);
        if let Some((other, _)) = changes[..i].iter().find(|(_, earlier)| {
            let earlier = path(earlier);
            earlier.starts_with(&this) || this.starts_with(&earlier)
        }) {
            errors.push(FieldError::new(
                at.clone(),
                format!("{} is changed by {other} already", change.path()),
            ));
        }
    }
    errors
}

/// What the moves do to the variables, from `spec.variables` (checked by [`validate`]).
pub fn variable_rules(variables: Option<&RolloutVariables>) -> VariableRules {
    variables.map_or_else(VariableRules::default, |v| VariableRules {
        follow_class_defaults: v.follow_class_defaults,
        declared: named_changes(v).into_iter().map(|(_, change)| change).collect(),
    })
}

fn selector_errors(selector: &LabelSelector, field: &str) -> Vec<FieldError> {
    selector
        .match_expressions
        .iter()
        .enumerate()
        .filter_map(|(i, e)| {
            let why = match (e.operator.as_str(), e.values.is_empty()) {
                ("In" | "NotIn", true) => "needs values",
                ("Exists" | "DoesNotExist", false) => "takes no values",
                ("In" | "NotIn" | "Exists" | "DoesNotExist", _) => return None,
                _ => "operator must be In, NotIn, Exists or DoesNotExist",
            };
            Some(FieldError::new(
                format!("{field}.matchExpressions[{i}]"),
                format!("{} {}: {why}", e.key, e.operator),
            ))
        })
        .collect()
}

impl Plan {
    /// The plan of `spec` for the ClusterStack `stack`; the errors of [`validate`] otherwise.
    pub fn of(spec: &ClusterStackRolloutSpec, stack: &StackSpec) -> Result<Plan, Vec<FieldError>> {
        let errors = validate(spec);
        if !errors.is_empty() {
            return Err(errors);
        }
        let duration = |text: &Option<String>, default: Duration| {
            text.as_deref()
                .and_then(|t| crate::duration::parse(t).ok())
                .unwrap_or(default)
        };
        let version = Version::parse_dot(&spec.version)
            .map_err(|e| vec![FieldError::new("spec.version", e.to_string())])?;
        let target = stack.release(&version).ok_or_else(|| {
            vec![FieldError::new(
                "spec.version",
                format!(
                    "{} is not a release name of the ClusterStack's stack",
                    spec.version
                ),
            )]
        })?;
        if !stack.channel.admits(target.channel()) {
            return Err(vec![FieldError::new(
                "spec.version",
                format!(
                    "version {} belongs to channel {}, but the ClusterStack follows channel {}",
                    spec.version,
                    target.channel(),
                    stack.channel
                ),
            )]);
        }
        let waves = if spec.waves.is_empty() {
            vec![WavePlan {
                name: DEFAULT_WAVE.to_owned(),
                selector: None,
                max_in_progress: None,
            }]
        } else {
            spec.waves
                .iter()
                .map(|w| WavePlan {
                    name: w.name.clone(),
                    selector: w.cluster_selector.clone(),
                    max_in_progress: w.max_in_progress,
                })
                .collect()
        };
        Ok(Plan {
            target,
            selector: spec.cluster_selector.clone(),
            waves,
            bake_time: duration(&spec.bake_time, Duration::ZERO),
            wave_timeout: duration(&spec.wave_timeout, DEFAULT_WAVE_TIMEOUT),
            paused: spec.paused,
            variables: variable_rules(spec.variables.as_ref()),
            spec_generation: None,
        })
    }
}

/// Whether `labels` satisfy `selector` (`metav1.LabelSelector` semantics; an empty selector matches all).
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    selector
        .match_labels
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
        && selector.match_expressions.iter().all(|e| {
            let value = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| e.values.contains(v)),
                "NotIn" => value.is_none_or(|v| !e.values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

/// One Cluster as the rollout sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// `namespace/name`.
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// The release whose class it is on.
    pub release: ReleaseId,
    pub generation: Option<i64>,
    /// Whether it is done on the target ([`health`]); only read when it is on the target.
    pub health: Result<(), String>,
}

/// How a Cluster taking part is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// On an older release, its wave not reached yet (or the rollout held).
    Waiting,
    /// Refused by the preflight for its current generation.
    Refused,
    /// On the target, not done yet, within the wave timeout.
    InProgress,
    /// On the target, not done `waveTimeout` after the move: why.
    Failing(String),
    Done,
    /// The rollout moved it (or found it on the target) and it is on an older release now (moved back).
    MovedAway,
    /// The rollout moved it (or found it on the target) and it is on a newer release now (a later rollout, or
    /// by hand): nothing left behind.
    MovedOn,
}

impl State {
    /// Whether the wave need not wait for it.
    fn finished(&self) -> bool {
        matches!(
            self,
            State::Done | State::Refused | State::MovedAway | State::MovedOn
        )
    }

    /// Whether the rollout left it behind: finished, and not on the release.
    pub fn skipped(&self) -> bool {
        matches!(self, State::Refused | State::MovedAway)
    }
}

/// Why a rollout holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// `spec.paused`.
    BySpec,
    /// These Clusters (`namespace/name`, why) are failing.
    Failing(Vec<FailingCluster>),
}

/// What [`assess`] finds.
#[derive(Clone, Debug, PartialEq)]
pub struct Assessment {
    /// `Progressing`, `Paused`, `Completed` or `Incomplete`.
    pub phase: &'static str,
    pub hold: Option<Hold>,
    /// The wave Clusters are moved in now (index into the plan's waves); `None` when every wave is done.
    pub current_wave: Option<usize>,
    pub waves: Vec<WaveStatus>,
    /// Each Cluster taking part, with its wave and state, in name order.
    pub states: Vec<(String, usize, State)>,
    /// The Clusters to move now, in name order (within the current wave's `maxInProgress`).
    pub to_move: Vec<String>,
    /// The records to keep: those of Clusters still taking part, and a `Found` one for every Cluster found
    /// on the target without a record.
    pub moves: Vec<ClusterMove>,
    /// Clusters of the stack on an older release that no wave's selector matches.
    pub unassigned: usize,
    /// When time alone changes the assessment (a timeout runs out, a bake ends), from now.
    pub next_check: Option<Duration>,
}

impl Assessment {
    pub fn count(&self, wanted: impl Fn(&State) -> bool) -> usize {
        self.states.iter().filter(|(_, _, s)| wanted(s)).count()
    }
}

/// Assesses the rollout of `plan` over `clusters` (those whose class is in the rollout's namespace; any
/// order), given what it did so far (`moves`, from the status) and the waves' previous status (for the time
/// each finished), at `now`.
pub fn assess(
    plan: &Plan,
    clusters: &[Candidate],
    moves: &[ClusterMove],
    previous_waves: &[WaveStatus],
    now: DateTime<Utc>,
) -> Assessment {
    let records: HashMap<&str, &ClusterMove> = moves.iter().map(|m| (m.cluster.as_str(), m)).collect();
    let mut sorted: Vec<&Candidate> = clusters.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let timeout = chrono::Duration::from_std(plan.wave_timeout).unwrap_or(chrono::Duration::MAX);
    let mut states = Vec::new();
    let mut kept = Vec::new();
    let mut unassigned = 0;
    let mut next_check: Option<chrono::Duration> = None;
    let mut sooner = |at: chrono::Duration| {
        let at = at.max(chrono::Duration::zero());
        next_check = Some(next_check.map_or(at, |n| n.min(at)));
    };
    for cluster in sorted {
        let of_stack =
            cluster.release.provider == plan.target.provider && cluster.release.name == plan.target.name;
        if !of_stack || !plan.selector.as_ref().is_none_or(|s| matches(s, &cluster.labels)) {
            continue;
        }
        let record = records.get(cluster.name.as_str()).copied();
        let moved_by_us = record.is_some_and(|r| r.outcome != outcome::REFUSED);
        // Moved by us, but the cache still shows the Cluster from before the move (the generation the move
        // made is newer than the one seen): on the target.
        let seen_before_move = moved_by_us
            && record.and_then(|r| r.generation).is_some_and(|moved| {
                record.is_some_and(|r| r.outcome == outcome::MOVED)
                    && cluster.generation.is_some_and(|seen| seen < moved)
            });
        let on_target = cluster.release == plan.target || seen_before_move;
        let older = cluster.release < plan.target;
        if !on_target && !older && !moved_by_us {
            continue;
        }
        let Some(wave) = plan
            .waves
            .iter()
            .position(|w| w.selector.as_ref().is_none_or(|s| matches(s, &cluster.labels)))
        else {
            if older {
                unassigned += 1;
            }
            continue;
        };
        let wave_name = &plan.waves[wave].name;
        let state = if on_target {
            let record = match record.filter(|r| r.outcome != outcome::REFUSED) {
                Some(record) => record.clone(),
                None => ClusterMove {
                    cluster: cluster.name.clone(),
                    wave: wave_name.clone(),
                    outcome: outcome::FOUND.to_owned(),
                    at: now,
                    ..ClusterMove::default()
                },
            };
            let deadline = record.at + timeout;
            let state = match &cluster.health {
                Ok(()) => State::Done,
                Err(why) if now > deadline => State::Failing(why.clone()),
                Err(_) => {
                    sooner(deadline - now + chrono::Duration::seconds(1));
                    State::InProgress
                }
            };
            kept.push(record);
            state
        } else if moved_by_us {
            kept.extend(record.cloned());
            if older { State::MovedAway } else { State::MovedOn }
        } else {
            match record {
                Some(r)
                    if r.outcome == outcome::REFUSED
                        && r.generation == cluster.generation
                        && r.rollout_generation == plan.spec_generation =>
                {
                    kept.push(r.clone());
                    State::Refused
                }
                _ => State::Waiting,
            }
        };
        states.push((cluster.name.clone(), wave, state));
    }

    let mut waves = Vec::new();
    let mut current_wave = None;
    for (index, wave) in plan.waves.iter().enumerate() {
        let members: Vec<&(String, usize, State)> = states.iter().filter(|(_, w, _)| *w == index).collect();
        let count = |wanted: &dyn Fn(&State) -> bool| {
            i32::try_from(members.iter().filter(|(_, _, s)| wanted(s)).count()).unwrap_or(i32::MAX)
        };
        let moved = count(&|s| matches!(s, State::InProgress | State::Failing(_) | State::Done));
        let finished = members.iter().all(|(_, _, s)| s.finished());
        let finished_before = previous_waves
            .iter()
            .find(|w| w.name == wave.name)
            .and_then(|w| w.finished_at);
        // A wave finished before keeps its bake's start while a Cluster of it is only not done for now (in
        // progress: its addons re-applied, Cluster API catching up after a `clusterctl move`); the bake ends only
        // with every Cluster done, and starts again after one failed.
        let failing_now = members.iter().any(|(_, _, s)| matches!(s, State::Failing(_)));
        let finished_at = match (finished, finished_before) {
            (true, before) => Some(before.unwrap_or(now)),
            (false, Some(before)) if !failing_now => Some(before),
            (false, _) => None,
        };
        let baked = match finished_at {
            None => false,
            Some(_) if !finished => false,
            Some(_) if moved == 0 || plan.bake_time.is_zero() => true,
            Some(at) => {
                let bake_end =
                    at + chrono::Duration::from_std(plan.bake_time).unwrap_or(chrono::Duration::MAX);
                if now < bake_end && current_wave.is_none() {
                    sooner(bake_end - now);
                }
                now >= bake_end
            }
        };
        if !(finished && baked) && current_wave.is_none() {
            current_wave = Some(index);
        }
        let failing_clusters: Vec<FailingCluster> = members
            .iter()
            .filter_map(|(name, _, s)| match s {
                State::Failing(why) => Some(FailingCluster {
                    cluster: name.clone(),
                    reason: why.clone(),
                }),
                _ => None,
            })
            .collect();
        waves.push(WaveStatus {
            name: wave.name.clone(),
            clusters: i32::try_from(members.len()).unwrap_or(i32::MAX),
            moved,
            done: count(&|s| matches!(s, State::Done)),
            failing: count(&|s| matches!(s, State::Failing(_))),
            skipped: count(&State::skipped),
            failing_clusters,
            finished_at,
        });
    }

    let failing: Vec<FailingCluster> = waves.iter().flat_map(|w| w.failing_clusters.clone()).collect();
    for wave in &mut waves {
        wave.failing_clusters.truncate(FAILING_NAMED);
    }
    let hold = if plan.paused {
        Some(Hold::BySpec)
    } else if !failing.is_empty() {
        Some(Hold::Failing(failing))
    } else {
        None
    };
    let skipped = states.iter().any(|(_, _, s)| s.skipped());
    let phase = match (&hold, current_wave) {
        (Some(_), _) => phase::PAUSED,
        (None, None) if skipped => phase::INCOMPLETE,
        (None, None) => phase::COMPLETED,
        (None, Some(_)) => phase::PROGRESSING,
    };
    let to_move = match (&hold, current_wave) {
        (None, Some(index)) => {
            let in_wave = states.iter().filter(|(_, w, _)| *w == index);
            let busy = in_wave
                .clone()
                .filter(|(_, _, s)| matches!(s, State::InProgress | State::Failing(_)))
                .count();
            let room = plan.waves[index].max_in_progress.map_or(usize::MAX, |max| {
                usize::try_from(max).unwrap_or(usize::MAX).saturating_sub(busy)
            });
            in_wave
                .filter(|(_, _, s)| matches!(s, State::Waiting))
                .map(|(name, _, _)| name.clone())
                .take(room)
                .collect()
        }
        _ => Vec::new(),
    };
    Assessment {
        phase,
        hold,
        current_wave,
        waves,
        states,
        to_move,
        moves: kept,
        unassigned,
        next_check: next_check.and_then(|d| d.to_std().ok()),
    }
}

/// Whether `cluster` (the whole object) is done on the class `target_class`: its ClusterAddon `addon` has
/// the class's addons applied and ready (no hook running, `AddonsHealthy` not False), and Cluster API has
/// seen the change (`status.observedGeneration`), reconciled the topology (`TopologyReconciled` True) and
/// reports no machines out of date (`ControlPlaneMachinesUpToDate`, `WorkerMachinesUpToDate` not False).
/// Otherwise, why not.
pub fn health(cluster: &Value, addon: Option<&ClusterAddon>, target_class: &str) -> Result<(), String> {
    let Some(addon) = addon else {
        return Err("it has no ClusterAddon yet".to_owned());
    };
    if addon.spec.cluster_stack != target_class {
        let on = if addon.spec.cluster_stack.is_empty() {
            "none".to_owned()
        } else {
            addon.spec.cluster_stack.clone()
        };
        return Err(format!(
            "its addons are not on {target_class} yet (on {on}){}",
            first_false(addon).map(|c| format!(": {c}")).unwrap_or_default()
        ));
    }
    if !addon.spec.hook.is_empty() {
        return Err(format!("its addons' {} stages are running", addon.spec.hook));
    }
    if !addon.status.as_ref().is_some_and(|s| s.ready) {
        return Err(format!(
            "its addons are not ready{}",
            first_false(addon).map(|c| format!(": {c}")).unwrap_or_default()
        ));
    }
    if let Some(c) = addon
        .get_condition(ADDONS_HEALTHY)
        .filter(|c| c.status == ConditionStatus::False)
    {
        return Err(format!(
            "its addons do not run: {}",
            c.message.clone().unwrap_or_default()
        ));
    }
    let generation = cluster.pointer("/metadata/generation").and_then(Value::as_i64);
    let observed = cluster
        .pointer("/status/observedGeneration")
        .and_then(Value::as_i64);
    if let (Some(generation), Some(observed)) = (generation, observed)
        && observed < generation
    {
        return Err("Cluster API has not reconciled the move yet".to_owned());
    }
    match capi_condition(cluster, "TopologyReconciled") {
        None => return Err("Cluster API has not reported TopologyReconciled yet".to_owned()),
        Some((status, _)) if status == "True" => {}
        Some((status, message)) => {
            return Err(format!("Cluster API: TopologyReconciled is {status}: {message}"));
        }
    }
    for condition in ["ControlPlaneMachinesUpToDate", "WorkerMachinesUpToDate"] {
        if let Some((status, message)) = capi_condition(cluster, condition)
            && status == "False"
        {
            return Err(format!("Cluster API: {condition} is False: {message}"));
        }
    }
    Ok(())
}

/// A Cluster API condition of `cluster` (status, message): in `status.conditions` (`v1beta2`, or `v1beta1`'s
/// own), else in `status.v1beta2.conditions` (a `v1beta1` Cluster of Cluster API 1.9+).
fn capi_condition(cluster: &Value, type_: &str) -> Option<(String, String)> {
    ["/status/conditions", "/status/v1beta2/conditions"]
        .iter()
        .filter_map(|path| cluster.pointer(path).and_then(Value::as_array))
        .flatten()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
        .map(|c| {
            let text = |key: &str| c.get(key).and_then(Value::as_str).unwrap_or_default().to_owned();
            let message = match (text("reason"), text("message")) {
                (reason, message) if message.is_empty() => reason,
                (reason, message) if reason.is_empty() => message,
                (reason, message) => format!("{reason}: {message}"),
            };
            (text("status"), message)
        })
}

/// The first False condition of `addon` other than `Ready`, as `Type: message`.
fn first_false(addon: &ClusterAddon) -> Option<String> {
    addon
        .status
        .as_ref()?
        .conditions
        .iter()
        .filter(|c| c.type_ != crate::conditions::READY && c.status == ConditionStatus::False)
        .map(|c| format!("{}: {}", c.type_, c.message.clone().unwrap_or_default()))
        .next()
}

#[cfg(test)]
mod tests;
