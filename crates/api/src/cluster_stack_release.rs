//! `ClusterStackRelease`: one release of a cluster stack, applied to the management cluster.
#![allow(
    clippy::duplicated_attributes,
    reason = "kube-derive takes one printcolumn(...) per column; clippy reads the repeated keys as duplicates"
)]

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    common::{ObjectReference, Resource},
    conditions::{Condition, HasConditions},
};

/// Finalizer that keeps a release until its objects are removed.
pub const CLUSTER_STACK_RELEASE_FINALIZER: &str = "clusterstackrelease.clusterstack.x-k8s.io";

/// One release; the object name is the release tag in dash form, e.g. `docker-ferrol-1-27-v1`.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "clusterstack.x-k8s.io",
    version = "v1alpha1",
    kind = "ClusterStackRelease",
    namespaced,
    status = "ClusterStackReleaseStatus",
    shortname = "cskr",
    label("cluster.x-k8s.io/v1beta1", "v1beta1"),
    printcolumn(
        name = "K8s Version",
        type_ = "string",
        json_path = ".status.kubernetesVersion"
    ),
    printcolumn(name = "Ready", type_ = "boolean", json_path = ".status.ready"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time duration since creation of ClusterStackRelease"
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
    ),
    // New columns go after the Go operator's, which stay as they are (`crates/api/tests/crd_compat.rs`).
    printcolumn(
        name = "Clusters",
        type_ = "integer",
        json_path = ".status.clusters.clusters",
        description = "Clusters whose addons are on this release"
    ),
    printcolumn(
        name = "Failing",
        type_ = "integer",
        json_path = ".status.clusters.failing",
        description = "Clusters on this release whose addons are failing"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStackReleaseSpec {
    /// The provider object of this release; absent in noProvider mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<ObjectReference>,
}

/// What the operator last observed of a ClusterStackRelease.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStackReleaseStatus {
    /// Inventory of the objects applied from the cluster-class chart.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<Resource>,
    /// The full Kubernetes version of the release (`metadata.yaml`), e.g. `v1.27.3`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kubernetes_version: String,
    /// The cluster class is applied.
    #[serde(default)]
    pub ready: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The Clusters whose addons are on this release, and how they are doing. Written by the fleet status
    /// writer (field manager `cso-fleet`), never by the release's controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusters: Option<ClusterCounts>,
}

/// How many Clusters are on a release (their ClusterAddons' `spec.clusterStack` names it) and how they are
/// doing, counted by [`crate::fleet`]: the rule of `cso status` and the `cso_clusters` gauge.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCounts {
    /// How many Clusters.
    #[serde(default)]
    pub clusters: i32,
    /// How many of them have their addons ready.
    #[serde(default)]
    pub ready: i32,
    /// How many are neither ready nor failing (waiting for their control plane, stages running).
    #[serde(default)]
    pub progressing: i32,
    /// How many are not ready with a condition False of severity Warning or Error.
    #[serde(default)]
    pub failing: i32,
    /// The first failing Clusters (`namespace/name`, at most three), in name order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failing_clusters: Vec<String>,
}

impl HasConditions for ClusterStackRelease {
    fn conditions(&self) -> &[Condition] {
        self.status.as_ref().map_or(&[], |s| &s.conditions)
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.status.get_or_insert_with(Default::default).conditions
    }
}
