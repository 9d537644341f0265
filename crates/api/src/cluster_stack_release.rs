//! `ClusterStackRelease`: one release of a cluster stack, applied to the management cluster.
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

/// Finalizer that keeps a release until its objects are removed.
pub const CLUSTER_STACK_RELEASE_FINALIZER: &str = "clusterstackrelease.clusterstack.x-k8s.io";

/// The form of an OCI manifest digest as the CRDs pin and record it: `sha256:` and 64 lowercase hex digits.
pub const MANIFEST_DIGEST_PATTERN: &str = "^sha256:[0-9a-f]{64}$";

/// Whether `text` is a manifest digest of the form [`MANIFEST_DIGEST_PATTERN`] describes.
pub fn is_manifest_digest(text: &str) -> bool {
    text.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// One release; the object name is the release tag in dash form, e.g. `docker-ferrol-1-27-v1`.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "clusterstack.x-k8s.io",
    version = "v1alpha1",
    kind = "ClusterStackRelease",
    namespaced,
    status = "ClusterStackReleaseStatus",
    shortname = "cskr",
    label("cluster.x-k8s.io/v1beta1", "v1beta1"),
    // `clusterctl move` moves it with its ClusterStack (its owner).
    label("clusterctl.cluster.x-k8s.io", ""),
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
    /// The OCI manifest digest (`sha256:<64 lowercase hex>`) the release must have: its tag is refused when it
    /// points elsewhere. Copied by the ClusterStack controller from its ClusterStack's `spec.versionDigests`;
    /// absent for a version that is not pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = MANIFEST_DIGEST_PATTERN))]
    pub digest: Option<String>,
}

/// What the operator last observed of a ClusterStackRelease.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStackReleaseStatus {
    /// Inventory of the objects applied from the cluster-class chart.
    #[serde(default, skip_serializing_if = "<[_]>::is_empty")]
    pub resources: Inventory,
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
    /// The Clusters of this release's stack (same provider and stack name, any Kubernetes minor) on other
    /// releases in this namespace, and whether Cluster API would accept moving each to this release's class,
    /// judged from the two classes without a dry run (`cso_api::rules::class_move`). Written by the fleet
    /// status writer (field manager `cso-fleet`) once the release's ClusterClass is in the management
    /// cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moves: Option<ReleaseMoves>,
    /// Where the release in use was fetched from, its digest, and whether its signature was verified.
    /// Written by the release's controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ReleaseProvenance>,
}

/// Where a release was fetched from and what was checked of it: its digest and, when keys are configured,
/// its signature.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseProvenance {
    /// The kind of source: `oci`, `github` or `local`.
    pub kind: String,
    /// OCI: the manifest digest, `sha256:<hex>`. GitHub: the sha256 of the signed checksum file, when the
    /// release has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// A signature was checked against a configured key.
    #[serde(default)]
    pub verified: bool,
    /// Who signed it, e.g. `key:SHA256:<base64 of the sha256 of the key's SPKI DER>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<String>,
    /// The signature layout that verified: `bundle-v0.3` or `legacy-sig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
}

impl ReleaseProvenance {
    /// `kind` of a release from an OCI registry.
    pub const OCI: &str = "oci";
    /// `kind` of a release from GitHub releases.
    pub const GITHUB: &str = "github";
    /// `kind` of a release from a local directory (`--local`).
    pub const LOCAL: &str = "local";
    /// `layout` of a cosign v0.3 bundle (an OCI referrer, or `sign-blob --bundle`).
    pub const BUNDLE_V0_3: &str = "bundle-v0.3";
    /// `layout` of a legacy cosign signature (the `sha256-<hex>.sig` tag).
    pub const LEGACY_SIG: &str = "legacy-sig";

    /// A release with nothing known of it but the kind of its source.
    pub fn of_kind(kind: &str) -> Self {
        ReleaseProvenance {
            kind: kind.to_owned(),
            ..Default::default()
        }
    }
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

/// Which Clusters of a stack could move to a release ([`ClusterStackReleaseStatus::moves`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseMoves {
    /// How many Clusters of the stack are on other releases.
    #[serde(default)]
    pub clusters: i32,
    /// How many of them could move to this release.
    #[serde(default)]
    pub movable: i32,
    /// How many could not as they are, but could with the values their old class defaulted left to this
    /// release's class (what a `ClusterStackRollout` with `spec.variables.followClassDefaults` does).
    #[serde(default)]
    pub movable_with_defaults: i32,
    /// How many could not.
    #[serde(default)]
    pub refused: i32,
    /// The first Clusters that could not (at most three, in name order), and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused_clusters: Vec<RefusedMove>,
}

/// A Cluster that could not move to a release, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefusedMove {
    /// `namespace/name`.
    pub cluster: String,
    /// Each reason, in terms of the two classes (a variable value the new schema refuses, a variable removed
    /// or newly required, a Kubernetes step Cluster API refuses).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
}

impl HasConditions for ClusterStackRelease {
    fn conditions(&self) -> &[Condition] {
        self.status.as_ref().map_or(&[], |s| &s.conditions)
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.status.get_or_insert_with(Default::default).conditions
    }
}
