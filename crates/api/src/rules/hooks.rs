//! The Cluster API lifecycle hooks (Runtime SDK, `hooks.runtime.cluster.x-k8s.io/v1alpha1`) by name: what
//! the hook server serves, what `clusteraddon.yaml` stages belong to and what `ClusterAddon.spec.hook`
//! records.
//!
//! Facts from Cluster API's hook catalog (`api/runtime/hooks/v1alpha1/lifecyclehooks_types.go`, v1.12): a
//! hook is blocking when its response carries `retryAfterSeconds`; every lifecycle hook is, except
//! `AfterControlPlaneInitialized`. `BeforeControlPlaneUpgrade`, `BeforeWorkersUpgrade` and
//! `AfterWorkersUpgrade` (chained upgrades) are new in 1.12 (1.11 has none of them), and
//! `AfterClusterUpgrade` blocks only since 1.12.

use std::fmt;

/// A Cluster API lifecycle hook, in the order of a Cluster's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Hook {
    BeforeClusterCreate,
    AfterControlPlaneInitialized,
    BeforeClusterUpgrade,
    BeforeControlPlaneUpgrade,
    AfterControlPlaneUpgrade,
    BeforeWorkersUpgrade,
    AfterWorkersUpgrade,
    AfterClusterUpgrade,
    BeforeClusterDelete,
}

impl Hook {
    /// Every lifecycle hook of Cluster API 1.12.
    pub const ALL: [Hook; 9] = [
        Hook::BeforeClusterCreate,
        Hook::AfterControlPlaneInitialized,
        Hook::BeforeClusterUpgrade,
        Hook::BeforeControlPlaneUpgrade,
        Hook::AfterControlPlaneUpgrade,
        Hook::BeforeWorkersUpgrade,
        Hook::AfterWorkersUpgrade,
        Hook::AfterClusterUpgrade,
        Hook::BeforeClusterDelete,
    ];

    /// The hooks `clusteraddon.yaml` may list stages for: every hook at which the workload cluster exists.
    /// `BeforeClusterCreate` comes before there is a workload cluster to apply anything to, so stages under
    /// it are reported, not accepted.
    pub const ADDON_STAGES: [Hook; 8] = [
        Hook::AfterControlPlaneInitialized,
        Hook::BeforeClusterUpgrade,
        Hook::BeforeControlPlaneUpgrade,
        Hook::AfterControlPlaneUpgrade,
        Hook::BeforeWorkersUpgrade,
        Hook::AfterWorkersUpgrade,
        Hook::AfterClusterUpgrade,
        Hook::BeforeClusterDelete,
    ];

    /// The hook's name, as Cluster API spells it in discovery and as `spec.hook` records it.
    pub fn as_str(self) -> &'static str {
        match self {
            Hook::BeforeClusterCreate => "BeforeClusterCreate",
            Hook::AfterControlPlaneInitialized => "AfterControlPlaneInitialized",
            Hook::BeforeClusterUpgrade => "BeforeClusterUpgrade",
            Hook::BeforeControlPlaneUpgrade => "BeforeControlPlaneUpgrade",
            Hook::AfterControlPlaneUpgrade => "AfterControlPlaneUpgrade",
            Hook::BeforeWorkersUpgrade => "BeforeWorkersUpgrade",
            Hook::AfterWorkersUpgrade => "AfterWorkersUpgrade",
            Hook::AfterClusterUpgrade => "AfterClusterUpgrade",
            Hook::BeforeClusterDelete => "BeforeClusterDelete",
        }
    }

    /// The segment of the hook in a handler's path
    /// (`/hooks.runtime.cluster.x-k8s.io/v1alpha1/<segment>/<handler>`): Cluster API lower-cases the name.
    pub fn path_segment(self) -> &'static str {
        match self {
            Hook::BeforeClusterCreate => "beforeclustercreate",
            Hook::AfterControlPlaneInitialized => "aftercontrolplaneinitialized",
            Hook::BeforeClusterUpgrade => "beforeclusterupgrade",
            Hook::BeforeControlPlaneUpgrade => "beforecontrolplaneupgrade",
            Hook::AfterControlPlaneUpgrade => "aftercontrolplaneupgrade",
            Hook::BeforeWorkersUpgrade => "beforeworkersupgrade",
            Hook::AfterWorkersUpgrade => "afterworkersupgrade",
            Hook::AfterClusterUpgrade => "afterclusterupgrade",
            Hook::BeforeClusterDelete => "beforeclusterdelete",
        }
    }

    /// Whether Cluster API 1.12+ waits for this hook: its response may ask to retry (`retryAfterSeconds`).
    /// Before 1.12 `AfterClusterUpgrade` did not block.
    pub fn is_blocking(self) -> bool {
        self != Hook::AfterControlPlaneInitialized
    }

    /// Whether `clusteraddon.yaml` may list stages for this hook (see [`Hook::ADDON_STAGES`]).
    pub fn has_addon_stages(self) -> bool {
        Hook::ADDON_STAGES.contains(&self)
    }

    /// The hook named `name` (exact spelling), if Cluster API has one.
    pub fn parse(name: &str) -> Option<Hook> {
        Hook::ALL.into_iter().find(|h| h.as_str() == name)
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_path_segments_and_blocking_as_in_cluster_api() {
        for (hook, name, segment, blocking) in [
            (
                Hook::BeforeClusterCreate,
                "BeforeClusterCreate",
                "beforeclustercreate",
                true,
            ),
            (
                Hook::AfterControlPlaneInitialized,
                "AfterControlPlaneInitialized",
                "aftercontrolplaneinitialized",
                false,
            ),
            (
                Hook::BeforeClusterUpgrade,
                "BeforeClusterUpgrade",
                "beforeclusterupgrade",
                true,
            ),
            (
                Hook::BeforeControlPlaneUpgrade,
                "BeforeControlPlaneUpgrade",
                "beforecontrolplaneupgrade",
                true,
            ),
            (
                Hook::AfterControlPlaneUpgrade,
                "AfterControlPlaneUpgrade",
                "aftercontrolplaneupgrade",
                true,
            ),
            (
                Hook::BeforeWorkersUpgrade,
                "BeforeWorkersUpgrade",
                "beforeworkersupgrade",
                true,
            ),
            (
                Hook::AfterWorkersUpgrade,
                "AfterWorkersUpgrade",
                "afterworkersupgrade",
                true,
            ),
            (
                Hook::AfterClusterUpgrade,
                "AfterClusterUpgrade",
                "afterclusterupgrade",
                true,
            ),
            (
                Hook::BeforeClusterDelete,
                "BeforeClusterDelete",
                "beforeclusterdelete",
                true,
            ),
        ] {
            assert_eq!(hook.as_str(), name);
            assert_eq!(hook.to_string(), name);
            assert_eq!(Hook::parse(name), Some(hook));
            assert_eq!(hook.path_segment(), segment, "{name}");
            assert_eq!(segment, name.to_lowercase(), "Cluster API lower-cases the name");
            assert_eq!(hook.is_blocking(), blocking, "{name}");
        }
    }

    #[test]
    fn all_lists_every_hook_once_in_lifecycle_order() {
        let mut sorted = Hook::ALL;
        sorted.sort();
        assert_eq!(sorted, Hook::ALL);
        let names: std::collections::BTreeSet<&str> = Hook::ALL.iter().map(|h| h.as_str()).collect();
        assert_eq!(names.len(), Hook::ALL.len());
    }

    #[test]
    fn every_hook_with_a_workload_cluster_can_have_addon_stages() {
        let staged: Vec<Hook> = Hook::ALL.into_iter().filter(|h| h.has_addon_stages()).collect();
        assert_eq!(staged, Hook::ADDON_STAGES);
        assert!(!Hook::BeforeClusterCreate.has_addon_stages());
        assert_eq!(staged.len(), Hook::ALL.len() - 1);
    }

    #[test]
    fn unknown_and_misspelled_names_are_not_hooks() {
        for name in [
            "",
            "name",
            "beforeclusterupgrade",
            "BeforeClusterUpgradeResponse",
            " AfterClusterUpgrade",
        ] {
            assert_eq!(Hook::parse(name), None, "{name:?}");
        }
    }
}
