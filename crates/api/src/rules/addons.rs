//! What a ClusterAddon records as applied (`spec.clusterStack`, `spec.version`, `spec.hook`, readiness),
//! and the two questions asked of it: are the addons of a class done (the hook server holds
//! `BeforeClusterUpgrade` until they are), and would a class bring the same addons (the controller then
//! renders nothing).

use crate::{
    ClusterAddon, ReleaseId,
    conditions::{ConditionStatus, ConditionsExt},
    names::{condition, reason},
};

/// The addons a ClusterAddon last applied, and whether that apply is complete.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AppliedAddons {
    /// The class (`spec.clusterStack`, dot form) whose addons were last applied completely; `None` before the
    /// first install (or when the name is not a cluster stack's).
    pub class: Option<ReleaseId>,
    /// Their addon version (`spec.version`, dash form).
    pub version: String,
    /// `HelmChartApplied` True and `status.ready` (applied and running), or running given up on: the last
    /// apply succeeded and its health was waited for (see [`health_settled`]).
    pub complete: bool,
    /// `spec.hook` is set: a hook's stages are running.
    pub hook_running: bool,
}

impl AppliedAddons {
    /// What `addon` records.
    pub fn of(addon: &ClusterAddon) -> Self {
        AppliedAddons {
            complete: addon.is_condition_true(condition::HELM_CHART_APPLIED) && health_settled(addon),
            hook_running: !addon.spec.hook.is_empty(),
            ..Self::recorded(&addon.spec.cluster_stack, &addon.spec.version)
        }
    }

    /// The class and addon version alone (`spec.clusterStack`, `spec.version`), neither complete nor running.
    pub fn recorded(cluster_stack: &str, version: &str) -> Self {
        AppliedAddons {
            class: ReleaseId::parse_cluster_class(cluster_stack).ok(),
            version: version.to_owned(),
            complete: false,
            hook_running: false,
        }
    }

    /// Whether the addons of class `target` are done: they were applied for exactly that class, the apply is
    /// complete and no hook is running (a running hook may be replacing them).
    pub fn done_for(&self, target: &ReleaseId) -> bool {
        !self.hook_running && self.complete && self.class.as_ref() == Some(target)
    }

    /// Whether `target`, whose addon version is `target_addon_version` (dash form), brings the addons already
    /// applied: same stack, same Kubernetes minor (addons are rendered for it) and same addon version. Before
    /// the first install nothing is the same.
    pub fn same_addons(&self, target: &ReleaseId, target_addon_version: &str) -> bool {
        self.class.as_ref().is_some_and(|class| {
            class.same_stack(target)
                && class.kubernetes == target.kubernetes
                && self.version == target_addon_version
        })
    }
}

/// Whether what the addons' health has to say is said: they run (`status.ready`), or waiting for them to run
/// was given up after `--stage-timeout`, or they ran and no longer do. A hook holding a Cluster for its
/// addons goes on then; `AddonsHealthy` and the events tell that they do not run.
pub fn health_settled(addon: &ClusterAddon) -> bool {
    addon.status.as_ref().is_some_and(|s| s.ready)
        || addon.get_condition(condition::ADDONS_HEALTHY).is_some_and(|c| {
            c.status == ConditionStatus::False
                && matches!(
                    c.reason.as_deref(),
                    Some(reason::NOT_HEALTHY_IN_TIME | reason::DEGRADED)
                )
        })
}

/// The `AddonsHealthy` message while applied addons are waited for to run (within `--stage-timeout`).
pub fn health_waiting(addon: &ClusterAddon) -> Option<&str> {
    addon
        .get_condition(condition::ADDONS_HEALTHY)
        .filter(|c| {
            c.status == ConditionStatus::False && c.reason.as_deref() == Some(reason::WAITING_FOR_HEALTH)
        })
        .map(|c| c.message.as_deref().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ClusterAddonStatus;

    fn addon(cluster_stack: &str, version: &str, hook: &str, ready: bool, applied: bool) -> ClusterAddon {
        let mut addon = ClusterAddon::new("cluster-addon-c", Default::default());
        addon.spec.cluster_stack = cluster_stack.into();
        addon.spec.version = version.into();
        addon.spec.hook = hook.into();
        addon.status = Some(ClusterAddonStatus {
            ready,
            ..Default::default()
        });
        if applied {
            addon.mark_true(condition::HELM_CHART_APPLIED);
        }
        addon
    }

    fn id(name: &str) -> ReleaseId {
        ReleaseId::parse_any(name).unwrap()
    }

    #[test]
    fn reads_what_the_cluster_addon_records() {
        let applied = AppliedAddons::of(&addon(
            "docker-ferrol-1-27-v0-sha.hipstsw",
            "v0-sha-hipstsw",
            "",
            true,
            true,
        ));
        assert_eq!(
            applied,
            AppliedAddons {
                class: Some(id("docker-ferrol-1-27-v0-sha-hipstsw")),
                version: "v0-sha-hipstsw".into(),
                complete: true,
                hook_running: false,
            }
        );
        let fresh = AppliedAddons::of(&ClusterAddon::new("cluster-addon-c", Default::default()));
        assert_eq!(fresh, AppliedAddons::default());
        assert_eq!(AppliedAddons::recorded("", ""), AppliedAddons::default());
        assert_eq!(AppliedAddons::recorded("my-own-class", "v1").class, None);
    }

    #[test]
    fn health_is_settled_when_running_or_given_up_on_never_while_waiting() {
        use crate::conditions::Severity;
        let cases = [
            (true, None, true),
            (false, None, false),
            (false, Some((reason::WAITING_FOR_HEALTH, Severity::Info)), false),
            (
                false,
                Some((reason::NOT_HEALTHY_IN_TIME, Severity::Warning)),
                true,
            ),
            (false, Some((reason::DEGRADED, Severity::Warning)), true),
        ];
        for (ready, health, settled) in cases {
            let mut a = addon("docker-ferrol-1-27-v2", "v2", "", ready, true);
            if let Some((why, severity)) = health {
                a.mark_false(
                    condition::ADDONS_HEALTHY,
                    why,
                    severity,
                    "Deployment kube-system/x: 0 of 1",
                );
            }
            assert_eq!(health_settled(&a), settled, "ready {ready}, {health:?}");
            assert_eq!(AppliedAddons::of(&a).complete, settled);
        }
    }

    #[test]
    fn done_for_the_class_applied_completely_with_no_hook_running() {
        let v2 = id("docker-ferrol-1-27-v2");
        for (cluster_stack, hook, ready, applied, target, done) in [
            ("docker-ferrol-1-27-v2", "", true, true, &v2, true),
            ("docker-ferrol-1-27-v1", "", true, true, &v2, false),
            (
                "docker-ferrol-1-27-v2",
                "BeforeClusterUpgrade",
                true,
                true,
                &v2,
                false,
            ),
            // Applied but not complete: the stages have to run again.
            ("docker-ferrol-1-27-v2", "", false, true, &v2, false),
            ("docker-ferrol-1-27-v2", "", true, false, &v2, false),
            ("", "", true, true, &v2, false),
            // Hash builds: spec.clusterStack and the class are both dot form, the target may be either.
            (
                "docker-ferrol-1-27-v0-sha.hipstsw",
                "",
                true,
                true,
                &id("docker-ferrol-1-27-v0-sha-hipstsw"),
                true,
            ),
        ] {
            let applied = AppliedAddons::of(&addon(cluster_stack, "v2", hook, ready, applied));
            assert_eq!(applied.done_for(target), done, "{applied:?} for {target}");
        }
    }

    #[test]
    fn same_addons_means_same_stack_minor_and_addon_version() {
        for (cluster_stack, version, target, target_addons, same) in [
            // Another class of the stack with the same addons.
            ("docker-ferrol-1-27-v2", "v2", "docker-ferrol-1-27-v3", "v2", true),
            ("docker-ferrol-1-27-v2", "v2", "docker-ferrol-1-27-v2", "v2", true),
            (
                "docker-ferrol-1-27-v1",
                "v1",
                "docker-ferrol-1-27-v2",
                "v2",
                false,
            ),
            // The Go operator compares the addon version only and skips this one.
            (
                "docker-ferrol-1-27-v1",
                "v1",
                "docker-ferrol-1-28-v1",
                "v1",
                false,
            ),
            ("docker-ferrol-1-27-v1", "v1", "docker-scs-1-27-v1", "v1", false),
            (
                "docker-ferrol-1-27-v1",
                "v1",
                "openstack-ferrol-1-27-v1",
                "v1",
                false,
            ),
            // Hash versions in dot form, as spec.clusterStack holds them.
            (
                "docker-ferrol-1-27-v0-sha.hipstsw",
                "v0-sha-hipstsw",
                "docker-ferrol-1-27-v0-sha-hipstsw",
                "v0-sha-hipstsw",
                true,
            ),
            // Before the first install.
            ("", "", "docker-ferrol-1-27-v1", "v1", false),
            ("", "v1", "docker-ferrol-1-27-v1", "v1", false),
        ] {
            let applied = AppliedAddons::recorded(cluster_stack, version);
            assert_eq!(
                applied.same_addons(&id(target), target_addons),
                same,
                "{cluster_stack} {version} -> {target} {target_addons}"
            );
        }
    }

    #[test]
    fn same_addons_ignores_readiness_and_hooks() {
        let running = AppliedAddons::of(&addon(
            "docker-ferrol-1-27-v1",
            "v1",
            "BeforeClusterUpgrade",
            false,
            false,
        ));
        assert!(running.same_addons(&id("docker-ferrol-1-27-v2"), "v1"));
        assert!(!running.done_for(&id("docker-ferrol-1-27-v1")));
    }
}
