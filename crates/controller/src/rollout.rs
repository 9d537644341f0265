//! The ClusterStackRollout controller: moves the Clusters of a ClusterStack to one of its releases, wave by
//! wave, each Cluster only after the preflight of its class move passes.
//!
//! Observe: the rollout as the API server has it (its status is the rollout's memory: what it moved, when,
//! and what the preflight refused), its ClusterStack, the target ClusterStackRelease, and from the watch
//! caches every Cluster whose class is in the rollout's namespace with its ClusterAddon (no request per
//! Cluster). Decide: [`cso_api::rules::rollout::assess`] (pure) says how each Cluster is doing and which to
//! move now; [`conclude`] (pure) turns the assessment and what the moves did into the status, the conditions
//! and the events. Act: for each Cluster to move, [`crate::preflight::preflight`] (a server-side dry run of
//! the change, explained by the two classes); a refused Cluster is recorded and skipped, never retried until
//! it changes; an accepted one is moved by one JSON patch of its class (and Kubernetes version when the
//! release's differs), guarded by a test of the class it was seen on, with the field manager [`FIELD_MANAGER`]:
//! a Cluster moved by someone else meanwhile is left as it is. Cluster API then rolls the machines and calls
//! cso's hooks as for a move by hand.
//!
//! Runs in the default shard only (where the ClusterStacks are reconciled) and sees the Clusters of every
//! shard; it writes Clusters, never ClusterAddons. Deleting a rollout stops it and changes nothing (it has no
//! finalizer).

use std::{collections::HashMap, sync::Arc, time::Duration};

use futures::StreamExt;

use cso_api::{
    ClusterAddon, ClusterStack, ClusterStackRelease, ClusterStackRollout, ClusterStackRolloutStatus,
    capi::Cluster,
    cluster_addon::cluster_addon_name,
    cluster_stack_rollout::{ClusterMove, outcome, phase},
    conditions::{ConditionsExt, Severity},
    names::{condition, event, reason},
    rules::{
        StackSpec,
        class_move::Verdict,
        move_variables::VariableRules,
        rollout::{self, Assessment, Candidate, Hold, Plan},
    },
};
use kube::{
    Api, Resource, ResourceExt,
    api::{DynamicObject, ListParams, Patch, PatchParams},
    runtime::controller::Action,
};
use serde_json::json;

use crate::{
    Context, Error,
    context::{ControllerContext, object_key},
    events::{Events, Kind},
};

/// The field manager of the moves (the Cluster's class and version).
pub const FIELD_MANAGER: &str = "cso-rollout";

/// How often a rollout in progress is looked at without an event (Cluster and ClusterAddon changes wake it).
const RESYNC: Duration = Duration::from_secs(60);
/// How long a rollout waiting for its release or ClusterStack waits before looking again.
const WAIT: Duration = Duration::from_secs(30);

/// The rollout controller's context: the shared one, the moves that could not be made lately, and the
/// ClusterClass cache the preflight reads the classes from.
pub type RolloutContext = ControllerContext<RolloutMemory>;

/// What the rollout controller keeps across its reconciles.
#[derive(Default)]
pub struct RolloutMemory {
    retries: Retries,
    classes: Option<crate::fleet_status::ClassCache>,
    /// The ClusterStacks as the ClusterStack controller's watch has them.
    stacks: Option<crate::stores::Listed<ClusterStack>>,
}

impl std::fmt::Debug for RolloutMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RolloutMemory")
            .field("retries", &self.retries)
            .finish_non_exhaustive()
    }
}

/// The rollout controller's context, reading ClusterClasses from `classes` (the release controller's watch)
/// and ClusterStacks from `stacks` (the ClusterStack controller's): a rollout woken every second by a busy
/// fleet asks the API server for neither.
pub(crate) fn context(
    shared: Arc<Context>,
    classes: crate::fleet_status::ClassCache,
    stacks: crate::stores::Listed<ClusterStack>,
) -> Arc<RolloutContext> {
    ControllerContext::with(
        shared,
        RolloutMemory {
            retries: Retries::default(),
            classes: Some(classes),
            stacks: Some(stacks),
        },
    )
}

/// How many Clusters of a wave are checked and moved at once.
const MOVES_AT_ONCE: usize = 8;

/// The first wait before a Cluster whose move could not be made is tried again; it doubles up to
/// [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_secs(5);
const RETRY_MAX: Duration = Duration::from_secs(300);

/// The Clusters (`namespace/name`) whose move could not be made now (the dry run or the patch failed), with
/// how often in a row and when they may be tried again: a Cluster that cannot be moved is not tried at every
/// wake-up (any Cluster's change wakes the rollout), and its `MoveFailed` event is published once per
/// problem, not once per attempt. In memory: a restart tries again at once.
#[derive(Debug, Default)]
pub struct Retries(std::sync::Mutex<HashMap<String, Retry>>);

#[derive(Clone, Debug, PartialEq, Eq)]
struct Retry {
    failures: u32,
    not_before: std::time::Instant,
    why: String,
}

impl Retries {
    /// Whether `cluster` may be tried now.
    fn may_try(&self, cluster: &str, now: std::time::Instant) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(cluster)
            .is_none_or(|r| now >= r.not_before)
    }

    /// How long until the first Cluster in back-off may be tried again.
    fn next_try(&self, now: std::time::Instant) -> Option<Duration> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|r| r.not_before > now)
            .map(|r| r.not_before - now)
            .min()
    }

    /// The Clusters whose last move could not be made, with why, by name.
    fn failing(&self) -> Vec<(String, String)> {
        let mut failing: Vec<(String, String)> = self
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(cluster, retry)| (cluster.clone(), retry.why.clone()))
            .collect();
        failing.sort();
        failing
    }

    /// Records what the move of `cluster` gave; returns whether a failure is news (first, or another reason).
    fn record(&self, cluster: &str, result: &MoveResult, now: std::time::Instant) -> bool {
        let mut retries = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let MoveResult::NotNow(why) = result else {
            retries.remove(cluster);
            return false;
        };
        let previous = retries.get(cluster).cloned();
        let failures = previous.as_ref().map_or(0, |r| r.failures).saturating_add(1);
        let wait = RETRY_FIRST
            .saturating_mul(2u32.saturating_pow(failures.saturating_sub(1).min(16)))
            .min(RETRY_MAX);
        retries.insert(
            cluster.to_owned(),
            Retry {
                failures,
                not_before: now + wait,
                why: why.clone(),
            },
        );
        previous.is_none_or(|p| p.why != *why)
    }
}

/// Reconciles one ClusterStackRollout (recorded in the reconcile metrics as `clusterstackrollout`).
pub async fn reconcile(rollout: Arc<ClusterStackRollout>, ctx: Arc<RolloutContext>) -> Result<Action, Error> {
    ctx.bounded("clusterstackrollout", rollout, reconcile_object)
        .await
}

pub fn error_policy(rollout: Arc<ClusterStackRollout>, error: &Error, ctx: Arc<RolloutContext>) -> Action {
    let delay = ctx.retry_delay(&object_key(rollout.as_ref()));
    tracing::warn!(rollout = %rollout.name_any(), namespace = ?rollout.namespace(), %error, retry_in = ?delay,
        "the rollout failed");
    Action::requeue(delay)
}

/// What the act step did to one Cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum MoveResult {
    /// Moved; the Cluster's generation after the move, the values left out of its variables to follow the
    /// new class's defaults, and the declared changes it made (with the values they replaced).
    Moved {
        from: String,
        generation: Option<i64>,
        dropped: Vec<String>,
        changed: Vec<String>,
    },
    /// The preflight refused it, with why, at the Cluster's generation.
    Refused {
        from: String,
        reasons: Vec<String>,
        generation: Option<i64>,
    },
    /// Not moved now (the dry run could not be made, the patch failed or the Cluster changed meanwhile): why.
    NotNow(String),
}

/// Why the rollout cannot start: a condition reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Blocked {
    pub(crate) reason: &'static str,
    pub(crate) severity: Severity,
    pub(crate) message: String,
}

async fn reconcile_object(
    rollout: Arc<ClusterStackRollout>,
    ctx: Arc<RolloutContext>,
) -> Result<Action, Error> {
    let namespace = rollout.namespace().unwrap_or_default();
    let api: Api<ClusterStackRollout> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(rollout) = crate::patch::current(&ctx, &api, rollout.as_ref()).await? else {
        return Ok(Action::await_change());
    };
    // Before anything else, `clusterctl move` (see `crate::moving`): a rollout blocks moves while the Clusters of
    // its namespace run (a namespace without Clusters blocks none), and does nothing once they are all paused
    // nor while its move is under way (on the target, its Clusters may not be there yet).
    let clusters = clusters_of(&ctx, &namespace).await?;
    let all_paused = clusters.iter().all(|c| c.is_paused());
    let rollout = crate::moving::take_part(&ctx.written, &api, &rollout, all_paused).await?;
    if (all_paused && !clusters.is_empty()) || crate::moving::under_way(&rollout) {
        return Ok(Action::await_change());
    }
    let before = rollout.status.clone();
    let now = chrono::Utc::now();

    let ready = match plan_of(&ctx, &rollout).await? {
        Ok((plan, stack)) => match release_not_ready(&ctx, &namespace, &plan.target.tag()).await? {
            None => Ok((plan, stack)),
            Some(blocked) => Err(blocked),
        },
        Err(blocked) => Err(blocked),
    };
    let (plan, stack) = match ready {
        Ok(ready) => ready,
        Err(blocked) => {
            let (status, events) = conclude_blocked(&rollout, &blocked);
            ctx.publish(&rollout, events).await;
            crate::patch::status(&ctx.written, &api, &rollout, before.as_ref(), &status).await?;
            return Ok(Action::requeue(WAIT));
        }
    };
    let target_class = plan.target.cluster_class_name();

    let addons = addons_of(&ctx).await?;
    let candidates: Vec<Candidate> = clusters
        .iter()
        .filter_map(|cluster| candidate(cluster, &addons, &target_class))
        .collect();
    let previous = rollout.status.clone().unwrap_or_default();
    let assessment = rollout::assess(&plan, &candidates, &previous.moves, &previous.waves, now);

    // Act: the preflight and the move of each Cluster the assessment names.
    let mut results = Vec::new();
    if !assessment.to_move.is_empty() {
        let release = match ctx
            .releases
            .get_pinned(&plan.target, stack.pin(&plan.target))
            .await
        {
            Ok(release) => Some(release),
            Err(e) => {
                tracing::warn!(rollout = %rollout.name_any(), error = %e, "the release to move to is not at hand");
                None
            }
        };
        let tried_at = std::time::Instant::now();
        let mut moves = Vec::new();
        for name in &assessment.to_move {
            if !ctx.own.retries.may_try(name, tried_at) {
                continue;
            }
            if let Some(cluster) = clusters.iter().find(|c| cluster_name(c) == *name) {
                moves.push(try_move(&ctx, cluster, release.as_deref(), &plan, tried_at));
            }
        }
        results = futures::stream::iter(moves)
            .buffer_unordered(MOVES_AT_ONCE)
            .collect()
            .await;
        results.sort_by(|a, b| a.0.cmp(&b.0));
    }
    let results: Vec<(String, MoveResult)> = results
        .into_iter()
        // A failure already announced is not announced again; the Cluster waits for its next try.
        .filter(|(_, result, news)| *news || !matches!(result, MoveResult::NotNow(_)))
        .map(|(name, result, _)| (name, result))
        .collect();
    // The Clusters just moved are on the target now, whatever the cache shows yet.
    let moved_now: Vec<&String> = results
        .iter()
        .filter(|(_, r)| matches!(r, MoveResult::Moved { .. }))
        .map(|(name, _)| name)
        .collect();
    let records = records_after(&plan, &assessment, &results, now);
    let after = if results.is_empty() {
        assessment.clone()
    } else {
        let candidates: Vec<Candidate> = candidates
            .into_iter()
            .map(|mut c| {
                if moved_now.contains(&&c.name) {
                    c.release = plan.target.clone();
                }
                c
            })
            .collect();
        rollout::assess(&plan, &candidates, &records, &previous.waves, now)
    };
    let not_moved = ctx.own.retries.failing();
    let (status, events) = conclude(&rollout, &plan, &after, &results, &not_moved);
    ctx.publish(&rollout, events).await;
    crate::patch::status(&ctx.written, &api, &rollout, before.as_ref(), &status).await?;
    let next = [
        after.next_check,
        ctx.own.retries.next_try(std::time::Instant::now()),
    ]
    .into_iter()
    .flatten()
    .fold(RESYNC, Duration::min);
    Ok(Action::requeue(next.max(Duration::from_secs(1))))
}

/// The rollout's plan and its ClusterStack's spec; why it cannot start otherwise.
async fn plan_of(
    ctx: &RolloutContext,
    rollout: &ClusterStackRollout,
) -> Result<Result<(Plan, StackSpec), Blocked>, Error> {
    let namespace = rollout.namespace().unwrap_or_default();
    let name = &rollout.spec.cluster_stack;
    let cached = ctx.own.stacks.as_ref().and_then(|s| s.get(&namespace, name));
    let stack = match cached {
        Some(cached) => cached.map(|s| s.as_ref().clone()),
        None => Api::<ClusterStack>::namespaced(ctx.client.clone(), &namespace)
            .get_opt(name)
            .await
            .map_err(|e| Error::kube(format!("read ClusterStack {namespace}/{name}"), e))?,
    };
    let Some(stack) = stack else {
        return Ok(Err(Blocked {
            reason: reason::CLUSTER_STACK_NOT_FOUND,
            severity: Severity::Warning,
            message: format!("ClusterStack {namespace}/{name} does not exist"),
        }));
    };
    let stack = match StackSpec::parse(&stack) {
        Ok(spec) => spec,
        Err(e) => {
            return Ok(Err(Blocked {
                reason: reason::INVALID_SPEC,
                severity: Severity::Error,
                message: format!("ClusterStack {namespace}/{name} is invalid: {e}"),
            }));
        }
    };
    Ok(match Plan::of(&rollout.spec, &stack) {
        Ok(mut plan) => {
            plan.spec_generation = rollout.metadata.generation;
            Ok((plan, stack))
        }
        Err(errors) => Err(Blocked {
            reason: reason::INVALID_SPEC,
            severity: Severity::Error,
            message: errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        }),
    })
}

/// Why the release `tag` cannot be moved to yet: its ClusterStackRelease missing or not ready.
async fn release_not_ready(ctx: &Context, namespace: &str, tag: &str) -> Result<Option<Blocked>, Error> {
    let release = match ctx.stores().and_then(|s| s.releases()) {
        Some(store) => store
            .get(&kube::runtime::reflector::ObjectRef::new(tag).within(namespace))
            .map(|r| r.as_ref().clone()),
        None => Api::<ClusterStackRelease>::namespaced(ctx.client.clone(), namespace)
            .get_opt(tag)
            .await
            .map_err(|e| Error::kube(format!("read ClusterStackRelease {namespace}/{tag}"), e))?,
    };
    Ok(match release {
        None => Some(Blocked {
            reason: reason::RELEASE_NOT_READY,
            severity: Severity::Info,
            message: format!(
                "ClusterStackRelease {namespace}/{tag} does not exist (is the version in the ClusterStack's spec.versions?)"
            ),
        }),
        Some(release) if !release.status.as_ref().is_some_and(|s| s.ready) => Some(Blocked {
            reason: reason::RELEASE_NOT_READY,
            severity: Severity::Info,
            message: format!("ClusterStackRelease {namespace}/{tag} is not ready yet"),
        }),
        Some(_) => None,
    })
}

/// The Clusters whose class is in `namespace` (any Cluster namespace), not being deleted.
async fn clusters_of(ctx: &Context, namespace: &str) -> Result<Vec<Arc<Cluster>>, Error> {
    let all = match ctx.stores().and_then(crate::stores::Stores::all_clusters) {
        Some(all) => all,
        None => {
            let api: Api<Cluster> = Api::all_with(ctx.client.clone(), &ctx.cluster_resource);
            api.list(&ListParams::default())
                .await
                .map_err(|e| Error::kube("list Clusters", e))?
                .items
                .into_iter()
                .map(Arc::new)
                .collect()
        }
    };
    Ok(all
        .into_iter()
        .filter(|c| c.meta().deletion_timestamp.is_none())
        .filter(|c| c.class().is_some_and(|class| class.namespace == namespace))
        .collect())
}

/// Every ClusterAddon, by `namespace/name`.
async fn addons_of(ctx: &Context) -> Result<HashMap<String, Arc<ClusterAddon>>, Error> {
    let addons: Vec<Arc<ClusterAddon>> = match ctx.stores().and_then(|s| s.addons()) {
        Some(store) => store.state(),
        None => Api::<ClusterAddon>::all(ctx.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| Error::kube("list ClusterAddons", e))?
            .items
            .into_iter()
            .map(Arc::new)
            .collect(),
    };
    Ok(addons
        .into_iter()
        .map(|a| {
            (
                format!("{}/{}", a.namespace().unwrap_or_default(), a.name_any()),
                a,
            )
        })
        .collect())
}

fn cluster_name(cluster: &Cluster) -> String {
    format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    )
}

/// The rollout's view of `cluster`, if its class is a cluster stack's.
fn candidate(
    cluster: &Cluster,
    addons: &HashMap<String, Arc<ClusterAddon>>,
    target_class: &str,
) -> Option<Candidate> {
    let (release, _) = cluster.stack_release()?;
    let namespace = cluster.namespace().unwrap_or_default();
    let addon = addons.get(&format!(
        "{namespace}/{}",
        cluster_addon_name(&cluster.name_any())
    ));
    let whole = cluster.whole_value();
    Some(Candidate {
        name: cluster_name(cluster),
        labels: cluster.labels().clone(),
        release,
        generation: cluster.meta().generation,
        health: rollout::health(&whole, addon.map(AsRef::as_ref), target_class),
    })
}

/// [`move_cluster`] to `release` (`None`: the release `target` is not at hand), recorded in the metrics and
/// the retries; with whether a failure is news.
async fn try_move(
    ctx: &RolloutContext,
    cluster: &Cluster,
    release: Option<&cso_release::Release>,
    plan: &Plan,
    tried_at: std::time::Instant,
) -> (String, MoveResult, bool) {
    let name = cluster_name(cluster);
    let result = match release {
        // Cluster API leaves a paused Cluster alone, and so does a rollout: `clusterctl move` pauses the
        // Clusters it copies, and a class changed between its copy and its delete would be lost.
        _ if cluster.is_paused() => MoveResult::NotNow("the Cluster is paused".to_owned()),
        None => MoveResult::NotNow(format!("release {} is not at hand", plan.target.tag())),
        Some(release) => move_cluster(ctx, cluster, release, &plan.variables).await,
    };
    ctx.metrics.rollout_move(match &result {
        MoveResult::Moved { .. } => "moved",
        MoveResult::Refused { .. } => "refused",
        MoveResult::NotNow(_) => "failed",
    });
    let news = ctx.own.retries.record(&name, &result, tried_at);
    (name, result, news)
}

/// The preflight of moving `cluster` to `release`'s class (with the variable changes `rules` declare, and its
/// variables following the old class's defaults where the move is refused without and
/// `rules.follow_class_defaults`), then the move if it passes: one JSON patch of the class, the version and
/// the variable lists, guarded by a test of the class and of each list it was seen with.
async fn move_cluster(
    ctx: &RolloutContext,
    cluster: &Cluster,
    release: &cso_release::Release,
    rules: &VariableRules,
) -> MoveResult {
    let from = cluster.class().map(|c| c.name).unwrap_or_default();
    // The two classes from the release controller's ClusterClass cache where it has them (not two reads per
    // Cluster); the dry run is made for each.
    let cached = ctx
        .own
        .classes
        .as_ref()
        .map(|classes| move |namespace: &str, name: &str| classes.object(namespace, name));
    let lookup = cached.as_ref().map(|f| f as crate::preflight::CachedClasses<'_>);
    let preflight = crate::preflight::preflight_with(
        &ctx.client,
        &ctx.cluster_resource,
        cluster,
        release,
        None,
        lookup,
        rules,
    )
    .await;
    match preflight.verdict {
        Verdict::Refused => {
            return MoveResult::Refused {
                from,
                reasons: preflight.reasons.iter().map(ToString::to_string).collect(),
                generation: cluster.meta().generation,
            };
        }
        _ if preflight.dry_run_failed.is_some() => {
            return MoveResult::NotNow(format!(
                "the preflight could not be made: {}",
                preflight.dry_run_failed.unwrap_or_default()
            ));
        }
        Verdict::Accepted | Verdict::Likely => {}
    }
    let to = release.id.cluster_class_name();
    let version = release.metadata.kubernetes.as_str();
    let class_path = if ctx.cluster_resource.version == "v1beta1" {
        "/spec/topology/class"
    } else {
        "/spec/topology/classRef/name"
    };
    let mut ops = vec![
        json!({"op": "test", "path": class_path, "value": from}),
        json!({"op": "replace", "path": class_path, "value": to}),
    ];
    if cluster.topology_version() != Some(version) {
        ops.push(json!({"op": "replace", "path": "/spec/topology/version", "value": version}));
    }
    let (dropped, changed) = match &preflight.variables {
        Some(variables) => {
            ops.extend(variables.json_patch());
            (variables.dropped.clone(), variables.changed.clone())
        }
        None => (Vec::new(), Vec::new()),
    };
    let patch: json_patch::Patch = match serde_json::from_value(serde_json::Value::Array(ops)) {
        Ok(patch) => patch,
        Err(e) => return MoveResult::NotNow(format!("internal error: a JSON patch: {e}")),
    };
    let namespace = cluster.namespace().unwrap_or_default();
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &namespace, &ctx.cluster_resource);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    match api
        .patch(&cluster.name_any(), &params, &Patch::<()>::Json(patch))
        .await
    {
        Ok(moved) => MoveResult::Moved {
            from,
            generation: moved.metadata.generation,
            dropped,
            changed,
        },
        Err(kube::Error::Api(status)) => MoveResult::NotNow(format!(
            "Cluster API refused the move ({} {}): {}",
            status.code, status.reason, status.message
        )),
        Err(e) => MoveResult::NotNow(format!("the move could not be made: {e}")),
    }
}

/// The records after the moves: the assessment's, with one per Cluster moved or refused now.
pub(crate) fn records_after(
    plan: &Plan,
    assessment: &Assessment,
    results: &[(String, MoveResult)],
    now: chrono::DateTime<chrono::Utc>,
) -> Vec<ClusterMove> {
    let wave_of = |name: &str| {
        assessment
            .states
            .iter()
            .find(|(n, _, _)| n == name)
            .and_then(|(_, w, _)| assessment.waves.get(*w))
            .map(|w| w.name.clone())
            .unwrap_or_default()
    };
    let mut records: Vec<ClusterMove> = assessment
        .moves
        .iter()
        .filter(|m| !results.iter().any(|(name, _)| *name == m.cluster))
        .cloned()
        .collect();
    for (name, result) in results {
        let record = match result {
            MoveResult::Moved {
                from,
                generation,
                dropped,
                changed,
            } => ClusterMove {
                cluster: name.clone(),
                wave: wave_of(name),
                outcome: outcome::MOVED.to_owned(),
                from: from.clone(),
                at: now,
                generation: *generation,
                reasons: Vec::new(),
                variables_dropped: dropped.clone(),
                variables_changed: changed.clone(),
                rollout_generation: None,
            },
            MoveResult::Refused {
                from,
                reasons,
                generation,
            } => ClusterMove {
                cluster: name.clone(),
                wave: wave_of(name),
                outcome: outcome::REFUSED.to_owned(),
                from: from.clone(),
                at: now,
                generation: *generation,
                reasons: reasons.clone(),
                variables_dropped: Vec::new(),
                variables_changed: Vec::new(),
                rollout_generation: plan.spec_generation,
            },
            MoveResult::NotNow(_) => continue,
        };
        records.push(record);
    }
    records.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    records
}

/// `1 Cluster` or `N Clusters`.
fn clusters(count: usize) -> String {
    format!("{count} Cluster{}", if count == 1 { "" } else { "s" })
}

/// `N Clusters <what> and are <then>: <named>`, as a condition names the Clusters it is about.
fn clusters_that(count: usize, what: &str, then: &str, named: &[String]) -> String {
    format!(
        "{} {what} and {} {then}: {}",
        clusters(count),
        if count == 1 { "is" } else { "are" },
        named.join("; ")
    )
}

/// The status and events of a rollout that cannot start.
pub(crate) fn conclude_blocked(
    rollout: &ClusterStackRollout,
    blocked: &Blocked,
) -> (ClusterStackRolloutStatus, Events) {
    let mut status = rollout.status.clone().unwrap_or_default();
    let mut events = Events::default();
    let condition_type = if blocked.reason == reason::RELEASE_NOT_READY {
        condition::RELEASE_READY
    } else {
        condition::ROLLOUT_SPEC_VALID
    };
    let kind = if blocked.severity == Severity::Info {
        Kind::Normal
    } else {
        Kind::Warning
    };
    events.report_false(
        &mut status,
        (condition_type, blocked.reason, blocked.severity),
        &blocked.message,
        (kind, blocked.reason),
    );
    if condition_type == condition::RELEASE_READY {
        status.mark_true(condition::ROLLOUT_SPEC_VALID);
    }
    status.phase = phase::PENDING.to_owned();
    status.observed_generation = rollout.metadata.generation;
    status.set_summary();
    (status, events)
}

/// The status and events of the rollout from the assessment after the moves and what the moves did.
pub(crate) fn conclude(
    rollout: &ClusterStackRollout,
    plan: &Plan,
    after: &Assessment,
    results: &[(String, MoveResult)],
    not_moved: &[(String, String)],
) -> (ClusterStackRolloutStatus, Events) {
    let before = rollout.status.clone().unwrap_or_default();
    let mut status = before.clone();
    let mut events = Events::default();
    let target = plan.target.cluster_class_name();
    for (name, result) in results {
        match result {
            MoveResult::Moved {
                from,
                dropped,
                changed,
                ..
            } => {
                let followed = if dropped.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", its variables following the new class's defaults (left out, as the old class's \
                         defaults: {})",
                        dropped.join(", ")
                    )
                };
                let declared = if changed.is_empty() {
                    String::new()
                } else {
                    format!("; as the rollout declares: {}", changed.join("; "))
                };
                events.normal(
                    event::CLUSTER_MOVED,
                    format!("moved Cluster {name} from {from} to {target}{followed}{declared}"),
                );
            }
            MoveResult::Refused { reasons, .. } => events.warning(
                event::MOVE_REFUSED,
                format!("Cluster {name} cannot move to {target}: {}", reasons.join("; ")),
            ),
            MoveResult::NotNow(why) => {
                events.warning(event::MOVE_FAILED, format!("Cluster {name} was not moved: {why}"));
            }
        }
    }
    let wave_name = |index: Option<usize>| index.and_then(|i| plan.waves.get(i)).map(|w| w.name.clone());
    let current = wave_name(after.current_wave).unwrap_or_default();
    if !current.is_empty() && current != before.current_wave {
        events.normal(event::WAVE_STARTED, format!("wave {current} started"));
    }
    let count = |wanted: fn(&rollout::State) -> bool| i32::try_from(after.count(wanted)).unwrap_or(i32::MAX);
    status.phase = after.phase.to_owned();
    status.current_wave = current;
    status.target_class = target.clone();
    status.clusters = i32::try_from(after.states.len()).unwrap_or(i32::MAX);
    status.done = count(|s| matches!(s, rollout::State::Done));
    status.failing = count(|s| matches!(s, rollout::State::Failing(_)));
    status.skipped = count(rollout::State::skipped);
    status.unassigned = i32::try_from(after.unassigned).unwrap_or(i32::MAX);
    status.waves = after.waves.clone();
    status.moves = after.moves.clone();
    status.observed_generation = rollout.metadata.generation;

    status.mark_true(condition::ROLLOUT_SPEC_VALID);
    status.mark_true(condition::RELEASE_READY);
    match &after.hold {
        Some(Hold::Failing(failing)) => {
            let named: Vec<String> = failing
                .iter()
                .take(rollout::FAILING_NAMED)
                .map(|f| format!("{}: {}", f.cluster, f.reason))
                .collect();
            let more = failing.len().saturating_sub(rollout::FAILING_NAMED);
            let message = format!(
                "{} not done within {}, the rollout is paused: {}{}",
                clusters(failing.len()),
                cso_api::duration::format(plan.wave_timeout),
                named.join("; "),
                if more > 0 {
                    format!(" (and {more} more)")
                } else {
                    String::new()
                }
            );
            events.report_false(
                &mut status,
                (
                    condition::CLUSTERS_HEALTHY,
                    reason::WAVE_FAILING,
                    Severity::Warning,
                ),
                &message,
                (Kind::Warning, event::ROLLOUT_PAUSED),
            );
        }
        _ => status.mark_true(condition::CLUSTERS_HEALTHY),
    }
    let refused: Vec<&ClusterMove> = after
        .moves
        .iter()
        .filter(|m| m.outcome == outcome::REFUSED)
        .collect();
    if refused.is_empty() {
        status.mark_true(condition::PREFLIGHT_PASSED);
    } else {
        let named: Vec<String> = refused
            .iter()
            .take(rollout::FAILING_NAMED)
            .map(|m| format!("{}: {}", m.cluster, m.reasons.join(", ")))
            .collect();
        status.mark_false(
            condition::PREFLIGHT_PASSED,
            reason::MOVE_REFUSED,
            Severity::Warning,
            clusters_that(
                refused.len(),
                &format!("cannot move to {target}"),
                "skipped",
                &named,
            ),
        );
    }
    // Moves that could not be made (tried again with back-off), of this rollout's Clusters still to move.
    let failed: Vec<&(String, String)> = not_moved
        .iter()
        .filter(|(cluster, _)| {
            after
                .states
                .iter()
                .any(|(name, _, state)| name == cluster && matches!(state, rollout::State::Waiting))
        })
        .collect();
    if failed.is_empty() {
        status.mark_true(condition::MOVES_MADE);
    } else {
        let named: Vec<String> = failed
            .iter()
            .take(rollout::FAILING_NAMED)
            .map(|(cluster, why)| format!("{cluster}: {why}"))
            .collect();
        status.mark_false(
            condition::MOVES_MADE,
            reason::MOVE_FAILED,
            Severity::Warning,
            clusters_that(failed.len(), "could not be moved now", "tried again", &named),
        );
    }
    match &after.hold {
        Some(Hold::BySpec) => status.mark_false(
            condition::ROLLOUT_ACTIVE,
            reason::PAUSED_BY_SPEC,
            Severity::Info,
            "spec.paused holds the rollout: no Cluster is moved",
        ),
        _ => status.mark_true(condition::ROLLOUT_ACTIVE),
    }
    let was_paused = before.phase == phase::PAUSED;
    if was_paused && status.phase != phase::PAUSED {
        events.normal(event::ROLLOUT_RESUMED, "the rollout goes on");
    }
    if matches!(after.hold, Some(Hold::BySpec)) && !was_paused {
        events.normal(event::ROLLOUT_PAUSED, "paused by spec.paused");
    }
    if status.phase == phase::COMPLETED && before.phase != phase::COMPLETED {
        events.normal(
            event::ROLLOUT_COMPLETED,
            format!("every wave is done: {} Clusters on {target}", status.done),
        );
    }
    if status.phase == phase::INCOMPLETE && before.phase != phase::INCOMPLETE {
        let skipped: Vec<&str> = after
            .states
            .iter()
            .filter(|(_, _, s)| s.skipped())
            .map(|(name, _, _)| name.as_str())
            .collect();
        let more = skipped.len().saturating_sub(rollout::FAILING_NAMED);
        events.warning(
            event::ROLLOUT_INCOMPLETE,
            format!(
                "every wave is through, {} Clusters on {target}; {} skipped, not on it: {}{}",
                status.done,
                skipped.len(),
                skipped[..skipped.len().min(rollout::FAILING_NAMED)].join(", "),
                if more > 0 {
                    format!(" (and {more} more)")
                } else {
                    String::new()
                }
            ),
        );
    }
    status.set_summary();
    (status, events)
}

#[cfg(test)]
mod tests;
