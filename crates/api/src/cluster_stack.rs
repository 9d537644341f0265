//! `ClusterStack`: which releases of one cluster stack a namespace wants (versions, auto-subscribe).
#![allow(
    clippy::duplicated_attributes,
    reason = "kube-derive takes one printcolumn(...) per column; clippy reads the repeated keys as duplicates"
)]

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    cluster_stack_release::{ClusterCounts, MANIFEST_DIGEST_PATTERN},
    common::ObjectReference,
    conditions::{Condition, HasConditions},
    version::Channel,
};

/// The desired releases of one cluster stack for one Kubernetes minor.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "clusterstack.x-k8s.io",
    version = "v1alpha1",
    kind = "ClusterStack",
    namespaced,
    status = "ClusterStackStatus",
    shortname = "csk",
    label("cluster.x-k8s.io/v1beta1", "v1beta1"),
    // `clusterctl move` moves every ClusterStack with what it owns: its releases and their ClusterClasses.
    label("clusterctl.cluster.x-k8s.io", ""),
    label("clusterctl.cluster.x-k8s.io/move-hierarchy", ""),
    printcolumn(name = "Provider", type_ = "string", json_path = ".spec.provider"),
    printcolumn(name = "ClusterStack", type_ = "string", json_path = ".spec.name"),
    printcolumn(name = "K8s", type_ = "string", json_path = ".spec.kubernetesVersion"),
    printcolumn(name = "Channel", type_ = "string", json_path = ".spec.channel"),
    printcolumn(name = "Autosubscribe", type_ = "string", json_path = ".spec.autoSubscribe"),
    printcolumn(name = "Usable", type_ = "string", json_path = ".status.usableVersions"),
    printcolumn(name = "Latest", type_ = "string", json_path = ".status.latestRelease"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time duration since creation of ClusterStack"
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
        description = "Clusters whose addons are on a release of this ClusterStack"
    ),
    printcolumn(
        name = "Failing",
        type_ = "integer",
        json_path = ".status.clusters.failing",
        description = "Clusters on a release of this ClusterStack whose addons are failing"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStackSpec {
    /// Name of the provider, e.g. `docker` or `openstack`. Immutable.
    #[schemars(length(min = 1))]
    pub provider: String,
    /// Name of the cluster stack, e.g. `ferrol`, `scs` or `hosted-control-plane`. Immutable.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Kubernetes minor version in the form `1.27`; a patch version such as `1.34.6` (as the stacks'
    /// generator writes it) means its minor, `1.34`. Immutable.
    // Wider than the Go CRD's `^\d\.\d+$`, which refuses what the stacks' generator writes (decisions.md).
    #[schemars(regex(pattern = r"^\d\.\d+(\.\d+)?$"))]
    pub kubernetes_version: String,
    /// Release channel: `stable` (v1, v2, ...), `custom` (pre-release and hash builds, ttl builds included)
    /// or `ttl` (development builds `v0-ttl.<unix timestamp>` only, newest by time). Immutable.
    #[serde(default)]
    pub channel: Channel,
    /// Versions to keep available, in dot form: `v1`, `v1-alpha.1`, `v0-sha.hipstsw`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<String>,
    /// Pins: a version as written in `versions` (e.g. `v2`) -> the OCI manifest digest its release must have,
    /// `sha256:<64 lowercase hex>`. A pinned release is fetched by its tag, checked against the digest, and
    /// refused when the tag points elsewhere. Versions without a pin are fetched by tag alone. The Go
    /// operator ignores the field.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("additionalProperties" = {"type": "string", "pattern": MANIFEST_DIGEST_PATTERN}))]
    pub version_digests: BTreeMap<String, String>,
    /// Follow the newest release of the channel.
    #[serde(default = "default_true")]
    pub auto_subscribe: bool,
    /// Releases need no provider-specific object.
    #[serde(default)]
    pub no_provider: bool,
    /// The provider's `...ClusterStackReleaseTemplate`, required unless `noProvider` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<ObjectReference>,
}

fn default_true() -> bool {
    true
}

/// What the operator last observed of a ClusterStack.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStackStatus {
    /// The newest ready release and its Kubernetes version: `docker-ferrol-1-27-v2 | v1.27.3`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub latest_release: String,
    /// One entry per release that should exist, sorted by version.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub summary: Vec<ClusterStackReleaseSummary>,
    /// Ready versions in dot form joined by `, `.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub usable_versions: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The Clusters on the stack's releases, in all and per release. Written by the fleet status writer
    /// (field manager `cso-fleet`), never by the ClusterStack's controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusters: Option<StackClusters>,
}

/// The Clusters on the releases of a ClusterStack: the totals over its releases (the first failing
/// Clusters of all of them named), then one entry per release.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StackClusters {
    #[serde(flatten)]
    pub total: ClusterCounts,
    /// Every ClusterStackRelease of the stack (zero counts when no Cluster is on it), and every other release
    /// of the stack a Cluster is on, sorted by version.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub releases: Vec<ReleaseClusters>,
}

/// The Clusters on one release of a ClusterStack.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseClusters {
    /// The release tag, e.g. `docker-ferrol-1-27-v2` (the name of its ClusterStackRelease).
    pub release: String,
    #[serde(flatten)]
    pub counts: ClusterCounts,
}

/// The state of one ClusterStackRelease, as shown on its ClusterStack.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStackReleaseSummary {
    /// The version in dash form, e.g. `v1` or `v0-sha-hipstsw`.
    pub name: String,
    pub ready: bool,
    /// `""`, `downloading release assets`, `provider-specific work`, `applying objects` or `done`.
    #[schemars(with = "String")]
    pub phase: ReleasePhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// How far a ClusterStackRelease has come.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReleasePhase {
    #[default]
    #[serde(rename = "")]
    None,
    #[serde(rename = "downloading release assets")]
    DownloadingAssets,
    #[serde(rename = "provider-specific work")]
    ProviderSpecificWork,
    #[serde(rename = "applying objects")]
    ApplyingObjects,
    #[serde(rename = "done")]
    Done,
}

impl HasConditions for ClusterStack {
    fn conditions(&self) -> &[Condition] {
        self.status.as_ref().map_or(&[], |s| &s.conditions)
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.status.get_or_insert_with(Default::default).conditions
    }
}
