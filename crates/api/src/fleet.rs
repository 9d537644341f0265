//! The fleet view: which release the addons of each Cluster are on and how they are doing, counted per
//! release. One rule for `cso status`, the `cso_clusters` gauge and the status counts.
//!
//! The counts count Clusters, through their ClusterAddons ([`Member`]): a ClusterAddon whose Cluster is gone
//! counts for nothing (whether or not a garbage collector has removed it yet), and one that is on no release
//! yet (its first install has not finished, or failed) counts on the release its Cluster's class names, where
//! it is heading, so that a Cluster that fails before its first install is counted as failing on its stack.
//! Where the Cluster is not known (no Cluster cache, a watch filter, a list not done yet), the ClusterAddon
//! counts alone, as it says.
//!
//! A ClusterAddon is on the release its `spec.clusterStack` names (what was last applied completely; an
//! upgrade under way still counts for the release it leaves). It is *ready* when its status says so,
//! *failing* when not ready and one of its conditions is False with severity Warning or Error (a render or
//! apply that failed, an unreadable kubeconfig, a broken release, a stage that failed or timed out, a held
//! prune), and *progressing* otherwise (waiting for its control plane, stages running).
//!
//! The operator writes the same counts into the status of each ClusterStackRelease and ClusterStack
//! ([`ClusterCounts`], from [`ReleaseCounts`]; `cso_controller`'s fleet status writer).

use std::collections::{BTreeMap, HashMap};

use kube::ResourceExt;

use crate::{
    ClusterAddon, ReleaseId,
    capi::Cluster,
    cluster_stack_release::ClusterCounts,
    conditions::{ConditionStatus, ConditionsExt, Severity},
};

/// How many failing Clusters a release's counts name.
pub const FAILING_NAMED: usize = 3;

/// How a ClusterAddon is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddonState {
    Ready,
    Progressing,
    Failing,
}

impl AddonState {
    /// The state of `addon` (see the module).
    pub fn of(addon: &ClusterAddon) -> Self {
        let Some(status) = &addon.status else {
            return AddonState::Progressing;
        };
        if status.ready {
            return AddonState::Ready;
        }
        let failed = status.conditions.iter().any(|c| {
            c.status == ConditionStatus::False
                && matches!(c.severity, Some(Severity::Warning | Severity::Error))
        });
        if failed {
            AddonState::Failing
        } else {
            AddonState::Progressing
        }
    }

    /// `ready`, `progressing` or `failing`: the gauge's `state` label.
    pub fn as_str(self) -> &'static str {
        match self {
            AddonState::Ready => "ready",
            AddonState::Progressing => "progressing",
            AddonState::Failing => "failing",
        }
    }

    pub const ALL: [AddonState; 3] = [AddonState::Ready, AddonState::Progressing, AddonState::Failing];
}

/// The Clusters on one release.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReleaseCounts {
    /// `docker-ferrol-1-27`: the stack and Kubernetes minor; empty for Clusters on no release yet.
    pub stack: String,
    /// The release tag (`docker-ferrol-1-27-v2`); empty for Clusters on no release yet. A `spec.clusterStack`
    /// that names no release is kept as it is.
    pub release: String,
    pub clusters: usize,
    pub ready: usize,
    pub progressing: usize,
    pub failing: usize,
    /// The first [`FAILING_NAMED`] failing Clusters (`namespace/name` of their ClusterAddons' Clusters), in
    /// name order.
    pub failing_clusters: Vec<String>,
}

impl ReleaseCounts {
    /// How many of its Clusters are in `state`.
    pub fn in_state(&self, state: AddonState) -> usize {
        match state {
            AddonState::Ready => self.ready,
            AddonState::Progressing => self.progressing,
            AddonState::Failing => self.failing,
        }
    }
}

impl From<&ReleaseCounts> for ClusterCounts {
    fn from(counts: &ReleaseCounts) -> Self {
        ClusterCounts {
            clusters: saturating_i32(counts.clusters),
            ready: saturating_i32(counts.ready),
            progressing: saturating_i32(counts.progressing),
            failing: saturating_i32(counts.failing),
            failing_clusters: counts.failing_clusters.clone(),
        }
    }
}

/// The sum of `counts` (several releases), naming the first [`FAILING_NAMED`] failing Clusters of them all.
/// Each release names its first failing Clusters, so the first of them all are among those.
pub fn total<'a>(counts: impl IntoIterator<Item = &'a ClusterCounts>) -> ClusterCounts {
    let mut total = ClusterCounts::default();
    for counts in counts {
        total.clusters = total.clusters.saturating_add(counts.clusters);
        total.ready = total.ready.saturating_add(counts.ready);
        total.progressing = total.progressing.saturating_add(counts.progressing);
        total.failing = total.failing.saturating_add(counts.failing);
        total
            .failing_clusters
            .extend(counts.failing_clusters.iter().cloned());
    }
    total.failing_clusters.sort();
    total.failing_clusters.truncate(FAILING_NAMED);
    total
}

fn saturating_i32(count: usize) -> i32 {
    i32::try_from(count).unwrap_or(i32::MAX)
}

/// What the counts know of the Cluster of a ClusterAddon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterSeen {
    /// Not known here: the ClusterAddon counts alone.
    Unknown,
    /// The Cluster is gone: its ClusterAddon counts for nothing.
    Gone,
    /// The Cluster exists; the release tag its class names, when a cluster stack's.
    Exists { class_release: Option<String> },
}

impl ClusterSeen {
    /// What `cluster` tells: `None` is a Cluster that is gone.
    pub fn of(cluster: Option<&Cluster>) -> Self {
        match cluster {
            None => ClusterSeen::Gone,
            Some(cluster) => ClusterSeen::Exists {
                class_release: cluster.stack_release().map(|(id, _)| id.tag()),
            },
        }
    }
}

/// One Cluster as the counts see it: its ClusterAddon and what is known of the Cluster.
#[derive(Clone, Copy, Debug)]
pub struct Member<'a> {
    pub addon: &'a ClusterAddon,
    pub cluster: &'a ClusterSeen,
}

impl Member<'_> {
    /// Whether it is counted at all: not when its Cluster is gone.
    fn counts(&self) -> bool {
        *self.cluster != ClusterSeen::Gone
    }

    /// The stack (`docker-ferrol-1-27`) and release tag it is counted on (see the module); a name that is
    /// no release's is kept as it is, with no stack; empty on none.
    pub fn release(&self) -> (String, String) {
        let applied = self.addon.spec.cluster_stack.as_str();
        let on = match self.cluster {
            ClusterSeen::Exists {
                class_release: Some(heading),
            } if applied.is_empty() => heading.as_str(),
            _ => applied,
        };
        match ReleaseId::parse_any(on) {
            Ok(id) => (id.stack_prefix(), id.tag()),
            Err(_) => (String::new(), on.to_owned()),
        }
    }
}

/// The ClusterAddons whose addons do not run, per release (see [`Member::release`]) and `AddonsHealthy`
/// reason (`WaitingForHealth`, `NotHealthyInTime`, `Degraded`): `(stack, release, reason) -> count`.
pub fn not_running<'a>(
    members: impl IntoIterator<Item = Member<'a>>,
) -> BTreeMap<(String, String, String), usize> {
    let mut counts = BTreeMap::new();
    for member in members.into_iter().filter(Member::counts) {
        let Some(condition) = member
            .addon
            .get_condition(crate::names::condition::ADDONS_HEALTHY)
            .filter(|c| c.status == ConditionStatus::False)
        else {
            continue;
        };
        let (stack, release) = member.release();
        let reason = condition.reason.clone().unwrap_or_default();
        *counts.entry((stack, release, reason)).or_default() += 1;
    }
    counts
}

/// The counts per release of the Clusters of `members`, in release order (Clusters on no release first).
pub fn fleet<'a>(members: impl IntoIterator<Item = Member<'a>>) -> Vec<ReleaseCounts> {
    let mut by_release: BTreeMap<String, (ReleaseCounts, Vec<String>)> = BTreeMap::new();
    for member in members.into_iter().filter(Member::counts) {
        let addon = member.addon;
        let (stack, release) = member.release();
        let (counts, failing) = by_release.entry(release.clone()).or_insert_with(|| {
            let counts = ReleaseCounts {
                stack,
                release,
                ..ReleaseCounts::default()
            };
            (counts, Vec::new())
        });
        counts.clusters += 1;
        match AddonState::of(addon) {
            AddonState::Ready => counts.ready += 1,
            AddonState::Progressing => counts.progressing += 1,
            AddonState::Failing => {
                counts.failing += 1;
                failing.push(cluster_of(addon));
            }
        }
    }
    by_release
        .into_values()
        .map(|(mut counts, mut failing)| {
            failing.sort();
            failing.truncate(FAILING_NAMED);
            counts.failing_clusters = failing;
            counts
        })
        .collect()
}

/// What `clusters` (every Cluster where the addons are; `None` when they are not known) tell of the Cluster of
/// each of `addons`, in order.
pub fn clusters_seen<'a, 'b>(
    addons: impl IntoIterator<Item = &'a ClusterAddon>,
    clusters: Option<impl IntoIterator<Item = &'b Cluster>>,
) -> Vec<ClusterSeen> {
    let by_name: Option<HashMap<(String, String), &Cluster>> = clusters.map(|clusters| {
        clusters
            .into_iter()
            .map(|c| ((c.namespace().unwrap_or_default(), c.name_any()), c))
            .collect()
    });
    addons
        .into_iter()
        .map(|addon| match &by_name {
            None => ClusterSeen::Unknown,
            Some(by_name) => {
                let key = (addon.namespace().unwrap_or_default(), addon.cluster_name());
                ClusterSeen::of(by_name.get(&key).copied())
            }
        })
        .collect()
}

/// `namespace/name` of the Cluster of `addon`.
fn cluster_of(addon: &ClusterAddon) -> String {
    let namespace = addon.metadata.namespace.as_deref().unwrap_or_default();
    format!("{namespace}/{}", addon.cluster_name())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        cluster_addon::{ClusterAddonSpec, ClusterAddonStatus},
        conditions::ConditionsExt,
    };

    fn addon(name: &str, class: &str, ready: bool, failed: Option<Severity>) -> ClusterAddon {
        let mut addon = ClusterAddon::new(
            &format!("cluster-addon-{name}"),
            ClusterAddonSpec {
                cluster_stack: class.into(),
                ..Default::default()
            },
        );
        addon.metadata.namespace = Some("fleet".into());
        addon.status = Some(ClusterAddonStatus {
            ready,
            ..Default::default()
        });
        if let Some(severity) = failed {
            addon.mark_false("HelmChartApplied", "FailedToApplyObjects", severity, "denied");
        }
        addon
    }

    #[rstest::rstest]
    #[case::ready(true, None, AddonState::Ready)]
    #[case::waiting(false, Some(Severity::Info), AddonState::Progressing)]
    #[case::nothing_said(false, None, AddonState::Progressing)]
    #[case::warning(false, Some(Severity::Warning), AddonState::Failing)]
    #[case::error(false, Some(Severity::Error), AddonState::Failing)]
    fn the_state_of_an_addon(
        #[case] ready: bool,
        #[case] failed: Option<Severity>,
        #[case] state: AddonState,
    ) {
        assert_eq!(
            AddonState::of(&addon("a", "docker-ferrol-1-27-v1", ready, failed)),
            state
        );
    }

    #[test]
    fn an_addon_without_a_status_is_progressing() {
        let mut fresh = addon("a", "", false, None);
        fresh.status = None;
        assert_eq!(AddonState::of(&fresh), AddonState::Progressing);
    }

    #[test]
    fn counts_per_release_name_the_first_failing_clusters() {
        let mut addons = Vec::new();
        for i in 0..6 {
            addons.push(addon(&format!("v1-{i}"), "docker-ferrol-1-27-v1", true, None));
        }
        for i in 0..5 {
            let failed = (i < 4).then_some(Severity::Warning);
            addons.push(addon(&format!("v2-{i}"), "docker-ferrol-1-27-v2", false, failed));
        }
        addons.push(addon(
            "hash",
            "docker-ferrol-1-27-v0-sha.hipstsw",
            false,
            Some(Severity::Info),
        ));
        addons.push(addon("new", "", false, None));
        // Clusters not known: each ClusterAddon counts alone.
        let seen = clusters_seen(&addons, None::<&[Cluster]>);
        let fleet = fleet(
            addons
                .iter()
                .zip(&seen)
                .map(|(addon, cluster)| Member { addon, cluster }),
        );
        let summary: Vec<(&str, &str, usize, usize, usize, usize)> = fleet
            .iter()
            .map(|c| {
                (
                    c.stack.as_str(),
                    c.release.as_str(),
                    c.clusters,
                    c.ready,
                    c.progressing,
                    c.failing,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("", "", 1, 0, 1, 0),
                (
                    "docker-ferrol-1-27",
                    "docker-ferrol-1-27-v0-sha-hipstsw",
                    1,
                    0,
                    1,
                    0
                ),
                ("docker-ferrol-1-27", "docker-ferrol-1-27-v1", 6, 6, 0, 0),
                ("docker-ferrol-1-27", "docker-ferrol-1-27-v2", 5, 0, 1, 4),
            ]
        );
        assert_eq!(
            fleet[3].failing_clusters,
            ["fleet/v2-0", "fleet/v2-1", "fleet/v2-2"]
        );
        assert_eq!(fleet[3].in_state(AddonState::Failing), 4);
    }

    #[test]
    fn what_the_clusters_tell_of_each_cluster_addon() {
        let on_v2 = addon("c1", "docker-ferrol-1-27-v2", true, None);
        let orphan = addon("c2", "docker-ferrol-1-27-v1", true, None);
        let cluster: Cluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": "fleet"},
            "spec": {"topology": {"class": "docker-ferrol-1-27-v2", "version": "v1.27.3"}},
        }))
        .unwrap();
        assert_eq!(
            clusters_seen([&on_v2, &orphan], Some([&cluster])),
            [
                ClusterSeen::Exists {
                    class_release: Some("docker-ferrol-1-27-v2".into())
                },
                ClusterSeen::Gone
            ]
        );
        assert_eq!(
            clusters_seen([&on_v2], None::<&[Cluster]>),
            [ClusterSeen::Unknown]
        );
    }

    #[test]
    fn clusters_are_counted_not_cluster_addons() {
        let ready = addon("ready", "docker-ferrol-1-27-v1", true, None);
        // Failed before its first install: on no release yet.
        let broken = addon("broken", "", false, Some(Severity::Warning));
        let orphan = addon("orphan", "docker-ferrol-1-27-v1", true, None);
        let unknown = addon("unknown", "", false, None);
        let on_v1 = ClusterSeen::Exists {
            class_release: Some("docker-ferrol-1-27-v1".into()),
        };
        let heading_to_v2 = ClusterSeen::Exists {
            class_release: Some("docker-ferrol-1-27-v2".into()),
        };
        let members = [
            Member {
                addon: &ready,
                cluster: &on_v1,
            },
            Member {
                addon: &broken,
                cluster: &heading_to_v2,
            },
            Member {
                addon: &orphan,
                cluster: &ClusterSeen::Gone,
            },
            Member {
                addon: &unknown,
                cluster: &ClusterSeen::Unknown,
            },
        ];
        let summary: Vec<(String, usize, usize, usize, Vec<String>)> = fleet(members)
            .into_iter()
            .map(|c| (c.release, c.clusters, c.ready, c.failing, c.failing_clusters))
            .collect();
        assert_eq!(
            summary,
            [
                (String::new(), 1, 0, 0, vec![]),
                ("docker-ferrol-1-27-v1".into(), 1, 1, 0, vec![]),
                (
                    "docker-ferrol-1-27-v2".into(),
                    1,
                    0,
                    1,
                    vec!["fleet/broken".into()]
                ),
            ]
        );
        let mut gone = addon("gone", "docker-ferrol-1-27-v1", false, None);
        gone.mark_false(
            crate::names::condition::ADDONS_HEALTHY,
            "Degraded",
            Severity::Warning,
            "x",
        );
        assert!(
            not_running([Member {
                addon: &gone,
                cluster: &ClusterSeen::Gone
            }])
            .is_empty()
        );
        assert_eq!(
            not_running([Member {
                addon: &gone,
                cluster: &on_v1
            }])
            .into_iter()
            .collect::<Vec<_>>(),
            [(
                (
                    "docker-ferrol-1-27".into(),
                    "docker-ferrol-1-27-v1".into(),
                    "Degraded".into()
                ),
                1
            )]
        );
    }

    #[test]
    fn totals_add_up_and_name_the_first_failing_clusters_of_all() {
        let counts = |clusters, ready, failing, names: &[&str]| ClusterCounts {
            clusters,
            ready,
            progressing: clusters - ready - failing,
            failing,
            failing_clusters: names.iter().map(|n| (*n).to_owned()).collect(),
        };
        let v1 = counts(5, 1, 4, &["ns/b", "ns/d", "ns/f"]);
        let v2 = counts(3, 1, 2, &["ns/a", "ns/c"]);
        assert_eq!(total([&v1, &v2]), counts(8, 2, 6, &["ns/a", "ns/b", "ns/c"]));
        assert_eq!(total([]), ClusterCounts::default());
        let release = ReleaseCounts {
            clusters: 2,
            ready: 1,
            failing: 1,
            failing_clusters: vec!["ns/x".into()],
            ..Default::default()
        };
        assert_eq!(ClusterCounts::from(&release), counts(2, 1, 1, &["ns/x"]));
    }
}
