//! Objects as the Go Cluster Stack Operator leaves them, for take-over tests: it server-side applies with field
//! manager `kubectl` and puts its label on the object and on the pod templates of the workload kinds
//! (upstream-behaviour.md §5.5, `setLabel`).

use kube::{Client, api::DynamicObject, core::GroupVersionKind, discovery::Scope};
use serde_json::{Value, json};

use crate::Error;

/// The label the Go operator (and cso) puts on every object it applies.
const OWNED_LABEL: (&str, &str) = ("clusterstack.x-k8s.io/instance", "owned");

/// Applies `object` as the Go operator does: its label on the object and, for Deployments, ReplicaSets,
/// StatefulSets, DaemonSets and Jobs, on the pod template; namespaced objects into `namespace`; server-side
/// apply with field manager `kubectl`, forced. Returns the object as applied.
pub async fn apply(client: &Client, namespace: &str, mut object: Value) -> Result<DynamicObject, Error> {
    let api_version = object["apiVersion"].as_str().unwrap_or_default().to_owned();
    let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    let label = |at: &mut Value| {
        if !at["labels"].is_object() {
            at["labels"] = json!({});
        }
        at["labels"][OWNED_LABEL.0] = json!(OWNED_LABEL.1);
    };
    label(&mut object["metadata"]);
    let template_kinds = ["Deployment", "ReplicaSet", "StatefulSet", "DaemonSet"];
    if (group == "apps" && template_kinds.contains(&kind.as_str())) || (group == "batch" && kind == "Job") {
        label(&mut object["spec"]["template"]["metadata"]);
    }
    let gvk = GroupVersionKind::gvk(group, version, &kind);
    let (_, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .map_err(|e| Error::Kube(e.to_string()))?;
    if caps.scope == Scope::Namespaced {
        object["metadata"]["namespace"] = json!(namespace);
    }
    crate::apply_object(client, &object, "kubectl").await
}
