//! The operator's API: the four `clusterstack.x-k8s.io/v1alpha1` CRDs, their conditions and constants, the
//! Cluster API objects it reads, the names and versions of releases, and the domain rules every part of the
//! operator shares ([`rules`]) (pure, no I/O).

pub mod atom;
pub mod capi;
pub mod cluster_addon;
pub mod cluster_stack;
pub mod cluster_stack_release;
pub mod cluster_stack_rollout;
pub mod common;
pub mod conditions;
pub mod crd;
pub mod deflated;
pub mod duration;
pub mod fleet;
mod interner;
pub mod inventory;
pub mod manifest;
pub mod names;
pub mod release_id;
pub mod rules;
pub mod shard;
pub mod version;
pub mod wait;

pub use cluster_addon::{ClusterAddon, ClusterAddonSpec, ClusterAddonStatus};
pub use cluster_stack::{ClusterStack, ClusterStackSpec, ClusterStackStatus};
pub use cluster_stack_release::{ClusterStackRelease, ClusterStackReleaseSpec, ClusterStackReleaseStatus};
pub use cluster_stack_rollout::{ClusterStackRollout, ClusterStackRolloutSpec, ClusterStackRolloutStatus};
pub use common::ObjectKey;
pub use release_id::ReleaseId;
pub use version::{Channel, KubernetesVersion, Version};

/// The API group of the three CRDs.
pub const GROUP: &str = "clusterstack.x-k8s.io";
/// Label on every object the operator applied.
pub const OWNED_LABEL: (&str, &str) = ("clusterstack.x-k8s.io/instance", "owned");

/// The label selector of the objects carrying [`OWNED_LABEL`].
pub fn owned_selector() -> String {
    format!("{}={}", OWNED_LABEL.0, OWNED_LABEL.1)
}

/// Annotation on every object the operator applies (management and workload clusters): a digest of the
/// content applied, so that an unchanged object is not written again, also after a restart or a move.
pub const APPLIED_DIGEST_ANNOTATION: &str = "clusterstack.x-k8s.io/applied-digest";

/// Annotation with the status of an object (a ClusterAddon, a ClusterStackRollout) whose Clusters are paused
/// for `clusterctl move` (JSON: the object's `uid` and its `status`): the move copies metadata and spec but
/// not the status, so the copy on the target management cluster (another UID) takes its status from here.
pub const MOVED_STATUS_ANNOTATION: &str = "clusterstack.x-k8s.io/moved-status";
