//! `ClusterAddon`: the core addons of one workload cluster, applied into that cluster.
#![allow(
    clippy::duplicated_attributes,
    reason = "kube-derive takes one printcolumn(...) per column; clippy reads the repeated keys as duplicates"
)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    common::ObjectReference,
    conditions::{Condition, HasConditions},
    inventory::Inventory,
};

/// Finalizer of a ClusterAddon.
pub const CLUSTER_ADDON_FINALIZER: &str = "clusteraddon.clusterstack.x-k8s.io";
/// Annotation (unqualified key, as the Go operator writes it): `created` after the first install,
/// `upgraded` after an upgrade.
pub const STAGE_ANNOTATION: &str = "ClusterAddonStage";
/// Annotation with what each stage of a multi-stage release applied (JSON: stage name -> inventory), so
/// that an upgrade prunes from this record instead of re-rendering the old release.
pub const STAGE_INVENTORY_ANNOTATION: &str = "clusterstack.x-k8s.io/stage-inventory";
/// Annotation with a digest of the values the applied addons were rendered from (`sha256:<hex>` of every
/// templated values file of the release): when the Cluster's data templates into other values, the addons
/// are rendered and applied again.
pub const APPLIED_INPUTS_ANNOTATION: &str = "clusterstack.x-k8s.io/applied-inputs";

/// What the name of a Cluster's ClusterAddon begins with (the Go operator's convention).
const NAME_PREFIX: &str = "cluster-addon-";

/// The name of the ClusterAddon of Cluster `cluster` (the Go operator's convention).
pub fn cluster_addon_name(cluster: &str) -> String {
    format!("{NAME_PREFIX}{cluster}")
}

impl ClusterAddon {
    /// The name of its Cluster (in its namespace): `spec.clusterRef.name`, else its own name after
    /// `cluster-addon-` (once: [`cluster_addon_name`] put it there once).
    pub fn cluster_name(&self) -> String {
        self.spec.cluster_ref.name.clone().unwrap_or_else(|| {
            let own = self.metadata.name.as_deref().unwrap_or_default();
            own.strip_prefix(NAME_PREFIX).unwrap_or(own).to_owned()
        })
    }
}

/// The addons of the Cluster `X`, named `cluster-addon-X`.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "clusterstack.x-k8s.io",
    version = "v1alpha1",
    kind = "ClusterAddon",
    namespaced,
    status = "ClusterAddonStatus",
    shortname = "caddon",
    label("cluster.x-k8s.io/v1beta1", "v1beta1"),
    // `clusterctl move` moves it with its Cluster (its owner).
    label("clusterctl.cluster.x-k8s.io", ""),
    printcolumn(
        name = "Cluster",
        type_ = "string",
        json_path = ".metadata.ownerReferences[?(@.kind==\"Cluster\")].name"
    ),
    printcolumn(
        name = "Hook",
        type_ = "string",
        json_path = ".spec.hook",
        description = "Present running hook"
    ),
    printcolumn(name = "Ready", type_ = "boolean", json_path = ".status.ready"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time duration since creation of Cluster Addon"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].reason"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].message"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterAddonSpec {
    /// The ClusterClass whose addons were last applied completely; empty before the first install.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cluster_stack: String,
    /// The cluster-addon version last applied, in dash form.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// The lifecycle hook being processed: `AfterControlPlaneInitialized`, `BeforeClusterUpgrade`, ... or empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hook: String,
    /// The Cluster these addons belong to.
    pub cluster_ref: ObjectReference,
}

/// What the operator last observed of a ClusterAddon.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterAddonStatus {
    /// Inventory of the objects applied into the workload cluster.
    #[serde(default, skip_serializing_if = "<[_]>::is_empty")]
    pub resources: Inventory,
    /// Progress of the stages of the running hook.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<StageStatus>,
    /// The addons are applied.
    #[serde(default)]
    pub ready: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Progress of one stage of a hook.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageStatus {
    /// The chart (sub-directory of the addon archive) of the stage.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// `apply` or `delete`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub action: Option<StageAction>,
    #[serde(default, skip_serializing_if = "StagePhase::is_none")]
    #[schemars(with = "String")]
    pub phase: StagePhase,
}

/// What a stage does with its chart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StageAction {
    Apply,
    Delete,
}

/// Where a stage is; the spelling (capital `Pending`) is the Go operator's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StagePhase {
    #[default]
    #[serde(rename = "")]
    None,
    #[serde(rename = "Pending")]
    Pending,
    #[serde(rename = "waitingForPreCondition")]
    WaitingForPreCondition,
    #[serde(rename = "applyingOrDeleting")]
    ApplyingOrDeleting,
    #[serde(rename = "waitingForPostCondition")]
    WaitingForPostCondition,
    #[serde(rename = "done")]
    Done,
}

impl StagePhase {
    pub fn is_none(&self) -> bool {
        *self == StagePhase::None
    }
}

impl HasConditions for ClusterAddon {
    fn conditions(&self) -> &[Condition] {
        self.status.as_ref().map_or(&[], |s| &s.conditions)
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.status.get_or_insert_with(Default::default).conditions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_of_a_cluster_addon_is_its_reference_else_its_name_after_the_prefix_once() {
        let mut addon = ClusterAddon::new(&cluster_addon_name("cluster-addon-x"), Default::default());
        assert_eq!(
            addon.cluster_name(),
            "cluster-addon-x",
            "the prefix is taken off once"
        );
        addon.spec.cluster_ref.name = Some("c1".into());
        assert_eq!(addon.cluster_name(), "c1");
        let other = ClusterAddon::new("addons-of-c2", Default::default());
        assert_eq!(other.cluster_name(), "addons-of-c2");
    }
}
