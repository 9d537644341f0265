//! The Cluster API runtime extension (Runtime SDK, `hooks.runtime.cluster.x-k8s.io/v1alpha1`): discovery and
//! a handler for every lifecycle hook of Cluster API 1.12+.
//!
//! All state lives in the ClusterAddon: a hook call that starts stages sets `spec.hook` and records its run
//! ([`HookRuns`]: the class and the Kubernetes version of the step) in one write guarded by the object's
//! resourceVersion, so concurrent calls cannot overwrite each other; the ClusterAddon controller runs the
//! stages and clears `spec.hook`. Any replica can answer any call, and a restart loses nothing.
//!
//! Blocking hooks are answered from that state, never by waiting in the call: `retryAfterSeconds`
//! ([`RETRY_AFTER_SECONDS`]) while the stages of the call's run are not done, success once they are (or once
//! the controller gave up a stage after its timeout, with a Warning on the ClusterAddon). Clusters whose
//! class is not a cluster stack's are never held up. Messages name only the hook, the ClusterAddon and the
//! class (no times, no error text that changes between calls), because Cluster API 1.14 copies them into the
//! Cluster's conditions and a message that changes at every call would make the Cluster reconcile forever.
//!
//! The answer of a call ([`decide`]) is a pure function of the ClusterAddon and the call ([`Call`]); the
//! router reads the ClusterAddon, writes what the decision starts, and records every answer in the hook
//! metrics ([`HookObserver`]).

use std::{sync::Arc, time::Instant};

use axum::{Json, Router, body::Bytes, extract::State, routing::post};
use cso_api::{
    ClusterAddon, ReleaseId,
    capi::Cluster,
    rules::{AppliedAddons, Hook, HookRun, HookRuns, HookStages, hook_runs::HOOK_RUNS_ANNOTATION},
};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use serde::{Deserialize, Serialize};
use serde_json::json;

pub const API_VERSION: &str = "hooks.runtime.cluster.x-k8s.io/v1alpha1";
const PREFIX: &str = "/hooks.runtime.cluster.x-k8s.io/v1alpha1";
/// How long Cluster API waits before calling a blocking hook again while its stages run. Cluster API 1.12+
/// caches the answer for that long, so it is the granularity of every held step: small.
pub const RETRY_AFTER_SECONDS: i32 = 5;
/// How long Cluster API may wait for one call (discovery's `timeoutSeconds`): calls only read and write the
/// ClusterAddon.
const HANDLER_TIMEOUT_SECONDS: i32 = 10;

/// The handlers this extension offers: (handler name, hook). Their paths are
/// `{PREFIX}/<hook's path segment>/<handler name>`. The first three are the Go operator's names, so existing
/// `ExtensionConfig`s and Cluster API's recorded handler names stay valid.
const HANDLERS: [(&str, Hook); 9] = [
    ("before-cluster-upgrade", Hook::BeforeClusterUpgrade),
    (
        "after-control-plane-initialized",
        Hook::AfterControlPlaneInitialized,
    ),
    ("after-cluster-upgrade", Hook::AfterClusterUpgrade),
    ("before-cluster-create", Hook::BeforeClusterCreate),
    ("before-control-plane-upgrade", Hook::BeforeControlPlaneUpgrade),
    ("after-control-plane-upgrade", Hook::AfterControlPlaneUpgrade),
    ("before-workers-upgrade", Hook::BeforeWorkersUpgrade),
    ("after-workers-upgrade", Hook::AfterWorkersUpgrade),
    ("before-cluster-delete", Hook::BeforeClusterDelete),
];

/// The part of a hook request the handlers read. The Cluster may come as `v1beta1` (Cluster API before
/// 1.13) or `v1beta2`; unknown fields are ignored.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookRequest {
    #[serde(default)]
    pub cluster: Option<Cluster>,
    /// `BeforeClusterUpgrade`, `BeforeControlPlaneUpgrade`, `BeforeWorkersUpgrade`: the step's target.
    #[serde(default)]
    pub to_kubernetes_version: Option<String>,
    /// `AfterControlPlaneUpgrade`, `AfterWorkersUpgrade`, `AfterClusterUpgrade`: the version reached.
    #[serde(default)]
    pub kubernetes_version: Option<String>,
}

impl HookRequest {
    /// The Kubernetes version of the call's step: the target of a `Before*Upgrade` hook, the version reached
    /// of an `After*Upgrade` hook, else the Cluster's topology version.
    fn step_version(&self) -> String {
        self.to_kubernetes_version
            .clone()
            .or_else(|| self.kubernetes_version.clone())
            .or_else(|| {
                self.cluster
                    .as_ref()
                    .and_then(|c| c.topology_version().map(str::to_owned))
            })
            .unwrap_or_default()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookResponse {
    pub api_version: String,
    pub kind: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_seconds: Option<i32>,
}

impl HookResponse {
    fn new(hook: Hook, outcome: &Outcome) -> Self {
        let (status, message, retry) = match outcome {
            Outcome::Done => ("Success", String::new(), None),
            Outcome::Retry(message) => ("Success", message.clone(), Some(RETRY_AFTER_SECONDS)),
            Outcome::Failure(message) => ("Failure", message.clone(), None),
        };
        HookResponse {
            api_version: API_VERSION.into(),
            kind: format!("{hook}Response"),
            status: status.into(),
            message,
            retry_after_seconds: retry,
        }
    }
}

/// How a hook call is answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Blocking hooks only: not yet, ask again.
    Retry(String),
    Failure(String),
}

impl Outcome {
    /// The `result` label of `cso_hook_requests_total`: `success`, `retry` or `failure`.
    pub fn result_label(&self) -> &'static str {
        match self {
            Outcome::Done => "success",
            Outcome::Retry(_) => "retry",
            Outcome::Failure(_) => "failure",
        }
    }
}

/// Records every answered call: the hook, the outcome and how long the answer took.
pub type HookObserver = Arc<dyn Fn(Hook, &Outcome, std::time::Duration) + Send + Sync>;

/// An observer that records nothing (tests that do not look at the metrics).
pub fn unobserved() -> HookObserver {
    Arc::new(|_, _, _| {})
}

/// One hook call, as the decision sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub hook: Hook,
    /// The Cluster's class.
    pub class: ReleaseId,
    /// The Kubernetes version of the call's step.
    pub kubernetes_version: String,
}

impl Call {
    fn run(&self) -> HookRun {
        HookRun::new(self.class.cluster_class_name(), self.kubernetes_version.clone())
    }
}

/// What a hook call does to the ClusterAddon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do: answer with the outcome.
    Answer(Outcome),
    /// Set `spec.hook` to the call's hook and record its run, then answer with the outcome.
    Start(Outcome),
}

/// How the call `call` is answered, given the ClusterAddon of its Cluster.
pub fn decide(addon: &ClusterAddon, call: &Call) -> Step {
    let runs = HookRuns::of(addon);
    let running = Hook::parse(&addon.spec.hook);
    let installed = !addon.spec.cluster_stack.is_empty();
    let name = addon.name_any();
    match call.hook {
        // There is no workload cluster yet: nothing of ours can run.
        Hook::BeforeClusterCreate => Step::Answer(Outcome::Done),
        // Not blocking: start the install unless it ran or runs.
        Hook::AfterControlPlaneInitialized => {
            if addon.spec.hook.is_empty() && !installed {
                Step::Start(Outcome::Done)
            } else {
                Step::Answer(Outcome::Done)
            }
        }
        // Held until the addons of the new class are applied ([`AppliedAddons::done_for`]).
        Hook::BeforeClusterUpgrade => {
            let applied = AppliedAddons::of(addon);
            if applied.done_for(&call.class) {
                return Step::Answer(Outcome::Done);
            }
            if addon.spec.hook.is_empty()
                && applied.class.as_ref() == Some(&call.class)
                && let Some(why) = cso_api::rules::addons::health_waiting(addon)
            {
                // Applied for this class, waited for to run: nothing to start (starting the hook again would
                // only make the controller end it again).
                return Step::Answer(Outcome::Retry(format!(
                    "waiting for the addons of {} in ClusterAddon {name} to run: {why}",
                    call.class.cluster_class_name()
                )));
            }
            let waiting = Outcome::Retry(format!(
                "waiting for the addons of {} in ClusterAddon {name}",
                call.class.cluster_class_name()
            ));
            if addon.spec.hook.is_empty() {
                Step::Start(waiting)
            } else {
                Step::Answer(waiting)
            }
        }
        hook => {
            let this_run = call.run();
            if running == Some(hook) {
                return Step::Answer(Outcome::Retry(format!(
                    "running the {hook} stages of {} in ClusterAddon {name}",
                    runs.get(hook).unwrap_or(&this_run).describe()
                )));
            }
            if runs.get(hook) == Some(&this_run) {
                // Started for this very step, and the controller has cleared `spec.hook`: done.
                return Step::Answer(Outcome::Done);
            }
            if !installed {
                // Addons never installed (yet): nothing to run at this hook, and a Cluster is never held
                // for it; the ClusterAddon's conditions say what is wrong.
                return Step::Answer(Outcome::Done);
            }
            if hook == Hook::AfterClusterUpgrade
                && let Some(why) = cso_api::rules::addons::health_waiting(addon)
            {
                // The upgraded Cluster's addons were applied and do not run yet: held until they do, or until
                // waiting for them is given up (`--stage-timeout`).
                return Step::Answer(Outcome::Retry(format!(
                    "waiting for the addons in ClusterAddon {name} to run: {why}"
                )));
            }
            if HookStages::of(addon).is_some_and(|s| s.nothing_to_run(&this_run.class, hook)) {
                // The release of this class has no stages for this hook: nothing to wait for.
                return Step::Answer(Outcome::Done);
            }
            if let Some(other) = running {
                return Step::Answer(Outcome::Retry(format!(
                    "waiting for the {other} stages in ClusterAddon {name} to finish"
                )));
            }
            if !addon.spec.hook.is_empty() {
                // `spec.hook` names something that is no hook: the controller reports it; do not wait on it.
                return Step::Answer(Outcome::Done);
            }
            Step::Start(Outcome::Retry(format!(
                "started the {hook} stages of {} in ClusterAddon {name}",
                this_run.describe()
            )))
        }
    }
}

/// The routes of the hook server; `observe` sees every answered call. Requests are read as JSON whatever
/// their `Content-Type`: Cluster API's runtime client sends none.
pub fn router(client: Client, observe: HookObserver) -> Router {
    let mut router = Router::new().route(&format!("{PREFIX}/discovery"), post(discovery));
    for (name, hook) in HANDLERS {
        let path = format!("{PREFIX}/{}/{name}", hook.path_segment());
        let observe = observe.clone();
        router = router.route(
            &path,
            post(move |State(client): State<Client>, body: Bytes| async move {
                let started = Instant::now();
                let outcome = match serde_json::from_slice::<HookRequest>(&body) {
                    Ok(request) => handle(&client, hook, request).await,
                    Err(e) => Outcome::Failure(format!("the {hook} request is not valid JSON: {e}")),
                };
                observe(hook, &outcome, started.elapsed());
                Json(HookResponse::new(hook, &outcome))
            }),
        );
    }
    router.with_state(client)
}

/// The discovery response: every handler, blocking ones with `failurePolicy: Fail` (a Cluster is not
/// upgraded or deleted past addons that could not be asked), `AfterControlPlaneInitialized` with `Ignore`
/// (Cluster API does not wait for it, and the controller installs without the call too).
pub fn discovery_response() -> serde_json::Value {
    let handlers: Vec<serde_json::Value> = HANDLERS
        .iter()
        .map(|(name, hook)| {
            json!({
                "name": name,
                "requestHook": {"apiVersion": API_VERSION, "hook": hook.as_str()},
                "timeoutSeconds": HANDLER_TIMEOUT_SECONDS,
                "failurePolicy": if hook.is_blocking() { "Fail" } else { "Ignore" },
            })
        })
        .collect();
    json!({"apiVersion": API_VERSION, "kind": "DiscoveryResponse", "status": "Success", "handlers": handlers})
}

async fn discovery() -> Json<serde_json::Value> {
    Json(discovery_response())
}

/// Answers one call and logs it (`answered a lifecycle hook call`, with the Cluster, the step's version and
/// the result): the record of what Cluster API called, in order.
async fn handle(client: &Client, hook: Hook, request: HookRequest) -> Outcome {
    let cluster = request
        .cluster
        .as_ref()
        .map(|c| format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()))
        .unwrap_or_default();
    let kubernetes_version = request.step_version();
    let outcome = match answer(client, hook, request).await {
        Ok(outcome) => outcome,
        Err(message) => {
            tracing::warn!(%hook, %message, "hook call failed");
            // Hold blocking hooks rather than let a Cluster go on without its addons; the message is
            // deterministic, so Cluster API's condition settles.
            if hook.is_blocking() {
                Outcome::Retry(message)
            } else {
                Outcome::Failure(message)
            }
        }
    };
    tracing::info!(
        %hook,
        %cluster,
        %kubernetes_version,
        result = outcome.result_label(),
        "answered a lifecycle hook call"
    );
    outcome
}

async fn answer(client: &Client, hook: Hook, request: HookRequest) -> Result<Outcome, String> {
    if hook == Hook::BeforeClusterCreate {
        return Ok(Outcome::Done);
    }
    let kubernetes_version = request.step_version();
    let cluster = request.cluster.ok_or("the request names no cluster")?;
    let namespace = cluster.namespace().ok_or("the cluster has no namespace")?;
    let cluster_name = cluster.name_any();
    // Clusters of other classes are none of our business: never hold them up.
    let Some((class, _)) = cluster.stack_release() else {
        return Ok(Outcome::Done);
    };
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &namespace);
    let name = cso_api::cluster_addon::cluster_addon_name(&cluster_name);
    let call = Call {
        hook,
        class,
        kubernetes_version,
    };
    // The final attempt always returns; the loop only goes round on a conflict.
    let mut attempt = 0;
    loop {
        attempt += 1;
        let addon = match addons.get_opt(&name).await {
            Ok(Some(addon)) => addon,
            Ok(None) if hook == Hook::BeforeClusterDelete => return Ok(Outcome::Done),
            Ok(None) => return Err(format!("ClusterAddon {namespace}/{name} does not exist yet")),
            Err(e) => {
                return Err(format!(
                    "failed to read ClusterAddon {namespace}/{name}: {}",
                    reason_of(&e)
                ));
            }
        };
        return match decide(&addon, &call) {
            Step::Answer(outcome) => Ok(outcome),
            Step::Start(outcome) => {
                let runs = HookRuns::of(&addon).with(hook, call.run());
                // Guarded by the resourceVersion: a concurrent call or the controller wins, and we answer from
                // what it did on the next call.
                let patch = json!({
                    "metadata": {
                        "resourceVersion": addon.resource_version(),
                        "annotations": {HOOK_RUNS_ANNOTATION: runs.encode()},
                    },
                    "spec": {"hook": hook.as_str()},
                });
                match addons
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {
                        tracing::info!(cluster_addon = %name, %namespace, %hook, run = %call.run().describe(), "hook started");
                        Ok(outcome)
                    }
                    // The controller wrote meanwhile: decide again from what it wrote.
                    Err(kube::Error::Api(s)) if s.code == 409 && attempt < CONFLICT_ATTEMPTS => continue,
                    Err(kube::Error::Api(s)) if s.code == 409 => Err(format!(
                        "ClusterAddon {namespace}/{name} changed meanwhile; ask again"
                    )),
                    Err(e) => Err(format!(
                        "failed to set the hook of ClusterAddon {namespace}/{name}: {}",
                        reason_of(&e)
                    )),
                }
            }
        };
    }
}

/// How often a hook call reads, decides and writes its ClusterAddon when the write conflicts with one of the
/// controller's before it answers "ask again".
const CONFLICT_ATTEMPTS: u32 = 3;

/// The stable part of an API error (its reason and code), never the text that may carry times or
/// addresses.
fn reason_of(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} ({})", status.reason, status.code),
        _ => "the API server could not be reached".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use cso_api::{ClusterAddonStatus, conditions::ConditionsExt, names::condition};
    use rstest::rstest;

    use super::*;

    fn addon(cluster_stack: &str, hook: &str, ready: bool) -> ClusterAddon {
        let mut addon = ClusterAddon::new("cluster-addon-c", Default::default());
        addon.spec.cluster_stack = cluster_stack.into();
        addon.spec.hook = hook.into();
        addon.status = Some(ClusterAddonStatus {
            ready,
            ..Default::default()
        });
        if ready {
            addon.mark_true(condition::HELM_CHART_APPLIED);
        }
        addon
    }

    fn with_run(mut addon: ClusterAddon, hook: Hook, class: &str, version: &str) -> ClusterAddon {
        let runs = HookRuns::of(&addon).with(hook, HookRun::new(class, version));
        addon
            .annotations_mut()
            .insert(HOOK_RUNS_ANNOTATION.into(), runs.encode());
        addon
    }

    fn id(class: &str) -> ReleaseId {
        ReleaseId::parse_cluster_class(class).unwrap()
    }

    fn call(hook: Hook, class: &str, version: &str) -> Call {
        Call {
            hook,
            class: id(class),
            kubernetes_version: version.into(),
        }
    }

    const V2: &str = "docker-ferrol-1-27-v2";

    #[test]
    fn before_cluster_upgrade_holds_until_the_new_class_is_applied() {
        let upgrade = call(Hook::BeforeClusterUpgrade, V2, "v1.27.3");
        assert!(matches!(
            decide(&addon("docker-ferrol-1-27-v1", "", true), &upgrade),
            Step::Start(Outcome::Retry(_))
        ));
        assert!(matches!(
            decide(
                &addon("docker-ferrol-1-27-v1", "BeforeClusterUpgrade", false),
                &upgrade
            ),
            Step::Answer(Outcome::Retry(_))
        ));
        assert_eq!(
            decide(&addon(V2, "", true), &upgrade),
            Step::Answer(Outcome::Done)
        );
        assert!(
            matches!(
                decide(&addon(V2, "", false), &upgrade),
                Step::Start(Outcome::Retry(_))
            ),
            "applied but not complete: run the stages again"
        );
        // Hash versions: spec.clusterStack and the class are both dot form.
        let custom = "docker-ferrol-1-27-v0-sha.hipstsw";
        assert_eq!(
            decide(
                &addon(custom, "", true),
                &call(Hook::BeforeClusterUpgrade, custom, "v1.27.3")
            ),
            Step::Answer(Outcome::Done)
        );
    }

    #[test]
    fn after_control_plane_initialized_starts_only_a_fresh_install_and_never_blocks() {
        let initialized = call(Hook::AfterControlPlaneInitialized, V2, "v1.27.3");
        assert_eq!(
            decide(&addon("", "", false), &initialized),
            Step::Start(Outcome::Done)
        );
        assert_eq!(
            decide(&addon("", "AfterControlPlaneInitialized", false), &initialized),
            Step::Answer(Outcome::Done)
        );
        assert_eq!(
            decide(&addon(V2, "", true), &initialized),
            Step::Answer(Outcome::Done)
        );
    }

    #[test]
    fn before_cluster_create_is_answered_without_a_cluster_addon() {
        assert_eq!(
            decide(
                &addon("", "", false),
                &call(Hook::BeforeClusterCreate, V2, "v1.27.3")
            ),
            Step::Answer(Outcome::Done)
        );
    }

    /// The blocking staged hooks (all but the three above): start, hold while running, done once the run of
    /// this very step was started and the controller cleared `spec.hook`.
    #[rstest]
    #[case::before_control_plane_upgrade(Hook::BeforeControlPlaneUpgrade)]
    #[case::after_control_plane_upgrade(Hook::AfterControlPlaneUpgrade)]
    #[case::before_workers_upgrade(Hook::BeforeWorkersUpgrade)]
    #[case::after_workers_upgrade(Hook::AfterWorkersUpgrade)]
    #[case::after_cluster_upgrade(Hook::AfterClusterUpgrade)]
    #[case::before_cluster_delete(Hook::BeforeClusterDelete)]
    fn blocking_hooks_hold_while_their_run_is_not_done(#[case] hook: Hook) {
        let this = call(hook, V2, "v1.28.0");
        // Installed, nothing running, never run: start and hold.
        let Step::Start(Outcome::Retry(started)) = decide(&addon(V2, "", true), &this) else {
            panic!("{hook}: a fresh call starts its stages and holds");
        };
        assert_eq!(
            started,
            format!(
                "started the {hook} stages of docker-ferrol-1-27-v2 at v1.28.0 in ClusterAddon cluster-addon-c"
            )
        );
        // Running this run: hold, with the same message at every call.
        let running = with_run(addon(V2, hook.as_str(), false), hook, V2, "v1.28.0");
        let first = decide(&running, &this);
        assert!(matches!(first, Step::Answer(Outcome::Retry(_))), "{hook}");
        assert_eq!(decide(&running, &this), first, "deterministic");
        // Done: the run of this step is recorded and the hook cleared.
        let done = with_run(addon(V2, "", true), hook, V2, "v1.28.0");
        assert_eq!(decide(&done, &this), Step::Answer(Outcome::Done), "{hook}");
        // The next step of a chained upgrade is a new run.
        assert!(matches!(
            decide(&done, &call(hook, V2, "v1.29.0")),
            Step::Start(Outcome::Retry(_))
        ));
        // Another hook's stages run: wait for them, start nothing.
        let other = if hook == Hook::AfterClusterUpgrade {
            Hook::BeforeClusterUpgrade
        } else {
            Hook::AfterClusterUpgrade
        };
        assert_eq!(
            decide(&addon(V2, other.as_str(), false), &this),
            Step::Answer(Outcome::Retry(format!(
                "waiting for the {other} stages in ClusterAddon cluster-addon-c to finish"
            )))
        );
        // Addons never installed: nothing to run, never hold the Cluster.
        assert_eq!(decide(&addon("", "", false), &this), Step::Answer(Outcome::Done));
        // The release of the class has no stages for this hook: done at once, nothing started.
        let mut without_stages = addon(V2, "", true);
        without_stages.annotations_mut().insert(
            cso_api::rules::hook_runs::HOOK_STAGES_ANNOTATION.into(),
            HookStages::new(V2, [Hook::AfterControlPlaneInitialized]).encode(),
        );
        assert_eq!(decide(&without_stages, &this), Step::Answer(Outcome::Done));
        // ... which is known only for that class.
        assert!(matches!(
            decide(&without_stages, &call(hook, "docker-ferrol-1-27-v3", "v1.28.0")),
            Step::Start(Outcome::Retry(_))
        ));
    }

    #[test]
    fn the_upgraded_clusters_hooks_follow_the_health_of_its_addons() {
        use cso_api::{conditions::Severity, names::reason};
        let waiting = |why: &str, severity| {
            let mut a = addon(V2, "", false);
            a.mark_true(condition::HELM_CHART_APPLIED);
            a.mark_false(
                condition::ADDONS_HEALTHY,
                why,
                severity,
                "applied, not running yet: Deployment kube-system/metrics-server: 0 of 1 replicas available",
            );
            a
        };
        // BeforeClusterUpgrade: applied but not running holds (without starting the hook again); running, or
        // given up on, goes on.
        let before = call(Hook::BeforeClusterUpgrade, V2, "v1.28.0");
        let not_running = waiting(reason::WAITING_FOR_HEALTH, Severity::Info);
        let Step::Answer(Outcome::Retry(held)) = decide(&not_running, &before) else {
            panic!("BeforeClusterUpgrade holds while the addons of its class do not run, and starts nothing");
        };
        assert!(held.contains("Deployment kube-system/metrics-server"), "{held}");

        assert_eq!(decide(&addon(V2, "", true), &before), Step::Answer(Outcome::Done));
        let given_up = waiting(reason::NOT_HEALTHY_IN_TIME, Severity::Warning);
        assert_eq!(decide(&given_up, &before), Step::Answer(Outcome::Done));
        // AfterClusterUpgrade of a release without stages for it: held while the addons are waited for.
        let after = call(Hook::AfterClusterUpgrade, V2, "v1.28.0");
        let without_stages = |mut a: ClusterAddon| {
            a.annotations_mut().insert(
                cso_api::rules::hook_runs::HOOK_STAGES_ANNOTATION.into(),
                HookStages::new(V2, []).encode(),
            );
            a
        };
        let Step::Answer(Outcome::Retry(message)) = decide(&without_stages(not_running), &after) else {
            panic!("AfterClusterUpgrade holds while the addons do not run");
        };
        assert!(
            message.contains("Deployment kube-system/metrics-server"),
            "{message}"
        );
        assert_eq!(
            decide(&without_stages(given_up), &after),
            Step::Answer(Outcome::Done)
        );
        assert_eq!(
            decide(&without_stages(addon(V2, "", true)), &after),
            Step::Answer(Outcome::Done)
        );
    }

    #[test]
    fn step_versions_come_from_the_request_of_each_hook() {
        let request = |body: serde_json::Value| -> HookRequest { serde_json::from_value(body).unwrap() };
        let cluster = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c", "namespace": "tenant-a"},
            "spec": {"topology": {"classRef": {"name": "docker-scs-1-35-v1", "namespace": "stacks"},
                                  "version": "v1.35.1"}},
            "status": {"initialization": {"controlPlaneInitialized": true}, "unknownField": 1}});
        let before = request(
            json!({"apiVersion": API_VERSION, "kind": "BeforeControlPlaneUpgradeRequest",
            "cluster": cluster, "fromKubernetesVersion": "v1.33.4", "toKubernetesVersion": "v1.34.2",
            "controlPlaneUpgrades": [{"version": "v1.34.2"}, {"version": "v1.35.1"}]}),
        );
        assert_eq!(before.step_version(), "v1.34.2");
        let after = request(json!({"cluster": cluster, "kubernetesVersion": "v1.34.2"}));
        assert_eq!(after.step_version(), "v1.34.2");
        let initialized = request(json!({"cluster": cluster}));
        assert_eq!(initialized.step_version(), "v1.35.1");
        let (class, _) = initialized.cluster.unwrap().stack_release().unwrap();
        assert_eq!(class.cluster_class_name(), "docker-scs-1-35-v1");
    }

    #[test]
    fn handlers_keep_the_go_operators_names_and_paths_and_serve_every_hook() {
        let served: Vec<(String, &str)> = HANDLERS
            .iter()
            .take(3)
            .map(|(name, hook)| (format!("{PREFIX}/{}/{name}", hook.path_segment()), hook.as_str()))
            .collect();
        assert_eq!(
            served,
            [
                (
                    "/hooks.runtime.cluster.x-k8s.io/v1alpha1/beforeclusterupgrade/before-cluster-upgrade".into(),
                    "BeforeClusterUpgrade"
                ),
                (
                    "/hooks.runtime.cluster.x-k8s.io/v1alpha1/aftercontrolplaneinitialized/after-control-plane-initialized"
                        .into(),
                    "AfterControlPlaneInitialized"
                ),
                (
                    "/hooks.runtime.cluster.x-k8s.io/v1alpha1/afterclusterupgrade/after-cluster-upgrade".into(),
                    "AfterClusterUpgrade"
                ),
            ]
        );
        let mut hooks: Vec<Hook> = HANDLERS.iter().map(|(_, hook)| *hook).collect();
        hooks.sort();
        assert_eq!(hooks, Hook::ALL);
        let discovery = discovery_response();
        let handlers = discovery["handlers"].as_array().unwrap();
        assert_eq!(handlers.len(), Hook::ALL.len());
        for handler in handlers {
            let hook = Hook::parse(handler["requestHook"]["hook"].as_str().unwrap()).unwrap();
            let expected = if hook.is_blocking() { "Fail" } else { "Ignore" };
            assert_eq!(handler["failurePolicy"], expected, "{hook}");
        }
    }

    #[test]
    fn responses_have_the_runtime_sdk_shape() {
        let response = serde_json::to_value(HookResponse::new(
            Hook::BeforeClusterUpgrade,
            &Outcome::Retry("not yet".into()),
        ))
        .unwrap();
        assert_eq!(
            response,
            json!({"apiVersion": API_VERSION, "kind": "BeforeClusterUpgradeResponse", "status": "Success",
                   "message": "not yet", "retryAfterSeconds": RETRY_AFTER_SECONDS})
        );
        let failure = serde_json::to_value(HookResponse::new(
            Hook::AfterClusterUpgrade,
            &Outcome::Failure("x".into()),
        ))
        .unwrap();
        assert_eq!(failure["status"], "Failure");
        assert!(failure.get("retryAfterSeconds").is_none());
    }
}
