//! Whether a ClusterAddon has to render and apply (pure).
//!
//! The addons of a release are its stack's addon chart at `components.clusterAddon`, rendered for its
//! Kubernetes version. Moving a Cluster to a class with the same addons (same stack, addon version and
//! Kubernetes minor) changes nothing and renders nothing; anything else is an upgrade. A re-apply (drift
//! found, or a periodic pass the watches cannot vouch for) corrects drift; an incomplete apply is retried.

use cso_api::{ReleaseId, rules::AppliedAddons};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Record the class as applied; render and apply nothing.
    RecordOnly,
    /// Render and apply the target's addons; `upgrade` when they differ from what is applied.
    Apply { upgrade: bool },
}

/// Decides for the `target` release with addon version `target_addons`. `complete`: the last apply
/// succeeded; `due`: a re-apply is due (see `Progress::reapply_due`).
pub fn decide(
    applied: &AppliedAddons,
    target: &ReleaseId,
    target_addons: &str,
    complete: bool,
    due: bool,
) -> Decision {
    if applied.class.is_none() {
        return Decision::Apply { upgrade: false };
    }
    let same_addons = applied.same_addons(target, target_addons);
    if same_addons && complete && !due {
        Decision::RecordOnly
    } else {
        Decision::Apply {
            upgrade: !same_addons,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(tag: &str) -> ReleaseId {
        ReleaseId::parse_tag(tag).unwrap()
    }

    #[test]
    fn first_install_applies() {
        let fresh = AppliedAddons::recorded("", "");
        assert_eq!(
            decide(&fresh, &id("docker-ferrol-1-27-v1"), "v1", false, true),
            Decision::Apply { upgrade: false }
        );
    }

    #[test]
    fn same_addons_on_another_class_change_nothing_until_the_resync() {
        let v2 = AppliedAddons::recorded("docker-ferrol-1-27-v2", "v2");
        assert_eq!(
            decide(&v2, &id("docker-ferrol-1-27-v3"), "v2", true, false),
            Decision::RecordOnly
        );
        assert_eq!(
            decide(&v2, &id("docker-ferrol-1-27-v2"), "v2", true, false),
            Decision::RecordOnly
        );
        assert_eq!(
            decide(&v2, &id("docker-ferrol-1-27-v3"), "v2", true, true),
            Decision::Apply { upgrade: false },
            "the periodic re-apply corrects drift"
        );
        assert_eq!(
            decide(&v2, &id("docker-ferrol-1-27-v2"), "v2", false, false),
            Decision::Apply { upgrade: false },
            "an incomplete apply is retried"
        );
    }

    #[test]
    fn another_addon_version_kubernetes_minor_or_stack_is_an_upgrade() {
        let v1 = AppliedAddons::recorded("docker-ferrol-1-27-v1", "v1");
        let upgrade = Decision::Apply { upgrade: true };
        assert_eq!(
            decide(&v1, &id("docker-ferrol-1-27-v2"), "v2", true, false),
            upgrade
        );
        // The Go operator compares the addon version only and skips this one.
        assert_eq!(
            decide(&v1, &id("docker-ferrol-1-28-v1"), "v1", true, false),
            upgrade
        );
        assert_eq!(decide(&v1, &id("docker-scs-1-27-v1"), "v1", true, false), upgrade);
        // Hash versions in dot form, as spec.clusterStack holds them.
        let custom = AppliedAddons::recorded("docker-ferrol-1-27-v0-sha.hipstsw", "v0-sha-hipstsw");
        assert_eq!(
            decide(
                &custom,
                &id("docker-ferrol-1-27-v0-sha-hipstsw"),
                "v0-sha-hipstsw",
                true,
                false
            ),
            Decision::RecordOnly
        );
    }
}
