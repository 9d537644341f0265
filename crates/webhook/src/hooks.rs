//! The Cluster API runtime extension (Runtime SDK, `hooks.runtime.cluster.x-k8s.io/v1alpha1`): discovery and
//! the handlers of `AfterControlPlaneInitialized`, `BeforeClusterUpgrade` and `AfterClusterUpgrade`.
//!
//! All state lives in the ClusterAddon: a hook call sets `spec.hook` (with the object's resourceVersion, so
//! concurrent calls cannot overwrite each other) and the ClusterAddon controller runs the stages. Any
//! replica can answer any call, and a restart loses nothing. `BeforeClusterUpgrade` answers with
//! `retryAfterSeconds` until the ClusterAddon has applied the addons of the Cluster's new class; Clusters whose
//! class is not a cluster stack's are never held up.

use axum::{Json, Router, extract::State, routing::post};
use cso_api::{
    ClusterAddon, ReleaseId,
    capi::Cluster,
    rules::{AppliedAddons, Hook},
};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use serde::{Deserialize, Serialize};
use serde_json::json;

pub const API_VERSION: &str = "hooks.runtime.cluster.x-k8s.io/v1alpha1";
const PREFIX: &str = "/hooks.runtime.cluster.x-k8s.io/v1alpha1";
/// How long Cluster API waits before asking `BeforeClusterUpgrade` again while the addons are not done.
pub const RETRY_AFTER_SECONDS: i32 = 10;

/// The handlers this extension offers: (handler name, hook). Their paths are
/// `{PREFIX}/<hook's path segment>/<handler name>`; the names are the Go operator's, so existing
/// `ExtensionConfig`s and Cluster API's recorded handler names stay valid.
const HANDLERS: [(&str, Hook); 3] = [
    ("before-cluster-upgrade", Hook::BeforeClusterUpgrade),
    (
        "after-control-plane-initialized",
        Hook::AfterControlPlaneInitialized,
    ),
    ("after-cluster-upgrade", Hook::AfterClusterUpgrade),
];

/// The part of a hook request the handlers read.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookRequest {
    #[serde(default)]
    pub cluster: Option<Cluster>,
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
    fn new(hook: Hook, outcome: Outcome) -> Self {
        let (status, message, retry) = match outcome {
            Outcome::Done => ("Success", String::new(), None),
            Outcome::Retry(message) => ("Success", message, Some(RETRY_AFTER_SECONDS)),
            Outcome::Failure(message) => ("Failure", message, None),
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

/// What a hook call does to the ClusterAddon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do: answer with the outcome.
    Answer(Outcome),
    /// Set `spec.hook` to this hook, then answer with the outcome.
    Start(Outcome),
}

/// `AfterControlPlaneInitialized`: start the install unless it ran or runs.
pub fn after_control_plane_initialized(addon: &ClusterAddon) -> Step {
    if addon.spec.hook.is_empty() && addon.spec.cluster_stack.is_empty() {
        Step::Start(Outcome::Done)
    } else {
        Step::Answer(Outcome::Done)
    }
}

/// `BeforeClusterUpgrade` to `target` (the Cluster's new class): done once the addons of that class are
/// ([`AppliedAddons::done_for`]); otherwise start the upgrade stages (unless a hook runs) and ask Cluster API
/// to wait.
pub fn before_cluster_upgrade(addon: &ClusterAddon, target: &ReleaseId) -> Step {
    if AppliedAddons::of(addon).done_for(target) {
        return Step::Answer(Outcome::Done);
    }
    let waiting = Outcome::Retry(format!(
        "waiting for the addons of {} in ClusterAddon {}",
        target.cluster_class_name(),
        addon.name_any()
    ));
    if addon.spec.hook.is_empty() {
        Step::Start(waiting)
    } else {
        Step::Answer(waiting)
    }
}

/// `AfterClusterUpgrade`: run its stages once the cluster is installed and no other hook runs.
pub fn after_cluster_upgrade(addon: &ClusterAddon) -> Step {
    if addon.spec.hook.is_empty() && !addon.spec.cluster_stack.is_empty() {
        Step::Start(Outcome::Done)
    } else {
        Step::Answer(Outcome::Done)
    }
}

/// The routes of the hook server.
pub fn router(client: Client) -> Router {
    let mut router = Router::new().route(&format!("{PREFIX}/discovery"), post(discovery));
    for (name, hook) in HANDLERS {
        let path = format!("{PREFIX}/{}/{name}", hook.path_segment());
        router = router.route(
            &path,
            post(
                move |State(client): State<Client>, Json(request): Json<HookRequest>| async move {
                    Json(handle(&client, hook, request).await)
                },
            ),
        );
    }
    router.with_state(client)
}

async fn discovery() -> Json<serde_json::Value> {
    let handlers: Vec<serde_json::Value> = HANDLERS
        .iter()
        .map(|(name, hook)| {
            json!({
                "name": name,
                "requestHook": {"apiVersion": API_VERSION, "hook": hook.as_str()},
                "timeoutSeconds": 10,
                "failurePolicy": "Fail",
            })
        })
        .collect();
    Json(
        json!({"apiVersion": API_VERSION, "kind": "DiscoveryResponse", "status": "Success", "handlers": handlers}),
    )
}

async fn handle(client: &Client, hook: Hook, request: HookRequest) -> HookResponse {
    let outcome = match answer(client, hook, request).await {
        Ok(outcome) => outcome,
        Err(message) => {
            tracing::warn!(%hook, %message, "hook call failed");
            // Hold the upgrade rather than let it run without its addons. `AfterClusterUpgrade` blocks only
            // since Cluster API 1.12 (before, a retry would be ignored), so it still answers with a failure.
            if hook == Hook::BeforeClusterUpgrade {
                Outcome::Retry(message)
            } else {
                Outcome::Failure(message)
            }
        }
    };
    HookResponse::new(hook, outcome)
}

async fn answer(client: &Client, hook: Hook, request: HookRequest) -> Result<Outcome, String> {
    let cluster = request.cluster.ok_or("the request names no cluster")?;
    let namespace = cluster.namespace().ok_or("the cluster has no namespace")?;
    let cluster_name = cluster.name_any();
    // Clusters of other classes are none of our business: never hold them up.
    let Some((target, _)) = cluster.stack_release() else {
        return Ok(Outcome::Done);
    };
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &namespace);
    let name = cso_api::cluster_addon::cluster_addon_name(&cluster_name);
    let Some(addon) = addons
        .get_opt(&name)
        .await
        .map_err(|e| format!("failed to read ClusterAddon {name}: {e}"))?
    else {
        return Err(format!("ClusterAddon {namespace}/{name} does not exist yet"));
    };
    let step = match hook {
        Hook::AfterControlPlaneInitialized => after_control_plane_initialized(&addon),
        Hook::BeforeClusterUpgrade => before_cluster_upgrade(&addon, &target),
        Hook::AfterClusterUpgrade => after_cluster_upgrade(&addon),
        // Only the handlers above are routed.
        other => return Err(format!("hook {other} is not served")),
    };
    match step {
        Step::Answer(outcome) => Ok(outcome),
        Step::Start(outcome) => {
            // Guarded by the resourceVersion: a concurrent call or the controller wins, and we answer from
            // what it did on the next call.
            let patch = json!({
                "metadata": {"resourceVersion": addon.resource_version()},
                "spec": {"hook": hook.as_str()},
            });
            match addons
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    tracing::info!(cluster_addon = %name, %namespace, %hook, "hook started");
                    Ok(outcome)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    Err(format!("ClusterAddon {name} changed meanwhile; ask again"))
                }
                Err(e) => Err(format!("failed to set the hook of ClusterAddon {name}: {e}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use cso_api::{ClusterAddonStatus, conditions::ConditionsExt, names::condition};

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

    fn id(class: &str) -> ReleaseId {
        ReleaseId::parse_cluster_class(class).unwrap()
    }

    #[test]
    fn before_cluster_upgrade_holds_until_the_new_class_is_applied() {
        let v2 = id("docker-ferrol-1-27-v2");
        assert!(matches!(
            before_cluster_upgrade(&addon("docker-ferrol-1-27-v1", "", true), &v2),
            Step::Start(Outcome::Retry(_))
        ));
        assert!(matches!(
            before_cluster_upgrade(
                &addon("docker-ferrol-1-27-v1", "BeforeClusterUpgrade", false),
                &v2
            ),
            Step::Answer(Outcome::Retry(_))
        ));
        assert_eq!(
            before_cluster_upgrade(&addon("docker-ferrol-1-27-v2", "", true), &v2),
            Step::Answer(Outcome::Done)
        );
        assert!(
            matches!(
                before_cluster_upgrade(&addon("docker-ferrol-1-27-v2", "", false), &v2),
                Step::Start(Outcome::Retry(_))
            ),
            "applied but not complete: run the stages again"
        );
        // Hash versions: spec.clusterStack and the class are both dot form.
        let custom = id("docker-ferrol-1-27-v0-sha.hipstsw");
        assert_eq!(
            before_cluster_upgrade(&addon("docker-ferrol-1-27-v0-sha.hipstsw", "", true), &custom),
            Step::Answer(Outcome::Done)
        );
    }

    #[test]
    fn after_control_plane_initialized_starts_only_a_fresh_install() {
        assert_eq!(
            after_control_plane_initialized(&addon("", "", false)),
            Step::Start(Outcome::Done)
        );
        assert_eq!(
            after_control_plane_initialized(&addon("", "AfterControlPlaneInitialized", false)),
            Step::Answer(Outcome::Done)
        );
        assert_eq!(
            after_control_plane_initialized(&addon("docker-ferrol-1-27-v1", "", true)),
            Step::Answer(Outcome::Done)
        );
    }

    #[test]
    fn handlers_keep_the_go_operators_names_and_paths() {
        let served: Vec<(String, &str)> = HANDLERS
            .iter()
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
    }

    #[test]
    fn responses_have_the_runtime_sdk_shape() {
        let response = serde_json::to_value(HookResponse::new(
            Hook::BeforeClusterUpgrade,
            Outcome::Retry("not yet".into()),
        ))
        .unwrap();
        assert_eq!(
            response,
            json!({"apiVersion": API_VERSION, "kind": "BeforeClusterUpgradeResponse", "status": "Success",
                   "message": "not yet", "retryAfterSeconds": 10})
        );
        let failure = serde_json::to_value(HookResponse::new(
            Hook::AfterClusterUpgrade,
            Outcome::Failure("x".into()),
        ))
        .unwrap();
        assert_eq!(failure["status"], "Failure");
        assert!(failure.get("retryAfterSeconds").is_none());
    }
}
