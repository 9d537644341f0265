//! What the conditions of the watched objects say, counted at scrape time for alerts: the ClusterAddons and
//! ClusterStackReleases whose conditions are False, per kind, condition, reason and severity
//! (`cso_condition_false`), and the ClusterAddons whose `spec.hook` names a lifecycle hook still running
//! (`cso_hooks_in_progress`; a blocking hook holds its Cluster meanwhile). Both are read from the objects the
//! controllers wrote, so the one place a state is decided (the condition, `spec.hook`) is also the one the
//! metric shows: a Cluster whose workload API server does not answer is `ClusterReady` False with reason
//! `ControlPlaneNotReady`, a release whose chart dependency cannot be fetched is `ClusterStackReleaseDownloaded`
//! False with reason `ChartDependencyUnavailable` (docs/conditions.md).

use std::collections::BTreeMap;

use cso_api::{
    ClusterAddon,
    conditions::{Condition, ConditionStatus},
};

/// One row of `cso_condition_false`: condition type, reason and severity (empty when unset).
pub type FalseCondition = (String, String, String);

/// The False conditions of `objects` (the conditions of each object), counted per type, reason and
/// severity; an object counts once per False condition.
pub fn false_conditions<'a>(
    objects: impl IntoIterator<Item = &'a [Condition]>,
) -> BTreeMap<FalseCondition, usize> {
    let mut counts = BTreeMap::new();
    for conditions in objects {
        for condition in conditions.iter().filter(|c| c.status == ConditionStatus::False) {
            let severity = condition
                .severity
                .as_ref()
                .map(|s| format!("{s:?}"))
                .unwrap_or_default();
            let key = (
                condition.type_.clone(),
                condition.reason.clone().unwrap_or_default(),
                severity,
            );
            *counts.entry(key).or_default() += 1;
        }
    }
    counts
}

/// The ClusterAddons of `addons` with a hook run in progress (`spec.hook` set), per hook.
pub fn hooks_in_progress<'a>(addons: impl IntoIterator<Item = &'a ClusterAddon>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for addon in addons {
        if !addon.spec.hook.is_empty() {
            *counts.entry(addon.spec.hook.clone()).or_default() += 1;
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use cso_api::conditions::{ConditionsExt, Severity};

    use super::*;

    #[test]
    fn false_conditions_are_counted_per_type_reason_and_severity_and_hooks_per_hook() {
        let mut unreachable = ClusterAddon::new("cluster-addon-a", Default::default());
        unreachable.status = Some(Default::default());
        let conditions = &mut unreachable.status.as_mut().unwrap().conditions;
        conditions.mark_false(
            "ClusterReady",
            "ControlPlaneNotReady",
            Severity::Info,
            "no answer",
        );
        conditions.mark_true("HelmChartApplied");
        let mut held = unreachable.clone();
        held.spec.hook = "BeforeClusterUpgrade".into();
        let healthy = ClusterAddon::new("cluster-addon-c", Default::default());

        let addons = [unreachable, held, healthy];
        let counts = false_conditions(addons.iter().map(|a| {
            a.status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default()
        }));
        assert_eq!(
            counts,
            BTreeMap::from([(
                (
                    "ClusterReady".to_owned(),
                    "ControlPlaneNotReady".to_owned(),
                    "Info".to_owned()
                ),
                2
            )])
        );
        assert_eq!(
            hooks_in_progress(&addons),
            BTreeMap::from([("BeforeClusterUpgrade".to_owned(), 1)])
        );
    }
}
