//! Which releases of a ClusterStack must exist (pure).
//!
//! Wanted = the releases of `spec.versions` ∪ the newest remote release of the channel (with auto-subscribe)
//! ∪ the newest ready release ∪ every release a Cluster uses. Missing wanted releases are created; existing
//! ones nobody wants are deleted, so a release in use or the newest ready one is never deleted. Everything is
//! compared as [`ReleaseId`]s, so dot-form ClusterClass names and dash-form release names of custom (hash)
//! versions match (the Go operator compares strings and deletes in-use custom releases). Output is sorted,
//! so the status does not churn between reconciles.

use std::collections::BTreeSet;

use cso_api::{ReleaseId, rules::StackSpec};

/// A ClusterStackRelease that exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExistingRelease {
    pub id: ReleaseId,
    pub ready: bool,
}

/// What to do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Every release that must exist, sorted.
    pub wanted: Vec<ReleaseId>,
    pub create: Vec<ReleaseId>,
    pub delete: Vec<ReleaseId>,
    /// The newest ready release of the stack's channel, kept whatever else happens.
    pub latest_ready: Option<ReleaseId>,
}

/// Plans the releases of `spec`. `latest_remote` is the newest release of the channel at the source (already
/// filtered to this stack and channel); `in_use` are the classes Clusters use (any stack or channel: only those the stack owns count).
pub fn plan(
    spec: &StackSpec,
    existing: &[ExistingRelease],
    latest_remote: Option<&ReleaseId>,
    in_use: &BTreeSet<ReleaseId>,
) -> Plan {
    let latest_ready = existing
        .iter()
        .filter(|r| r.ready && spec.owns(&r.id))
        .map(|r| r.id.clone())
        .max();
    let mut wanted: BTreeSet<ReleaseId> = spec.versions.iter().filter_map(|v| spec.release(v)).collect();
    if spec.auto_subscribe
        && let Some(remote) = latest_remote.filter(|r| spec.owns(r))
    {
        wanted.insert(remote.clone());
    }
    wanted.extend(latest_ready.clone());
    wanted.extend(in_use.iter().filter(|id| spec.owns(id)).cloned());

    let existing_ids: BTreeSet<&ReleaseId> = existing.iter().map(|r| &r.id).collect();
    let create = wanted
        .iter()
        .filter(|id| !existing_ids.contains(id))
        .cloned()
        .collect();
    let delete = existing_ids
        .iter()
        .filter(|id| !wanted.contains(**id))
        .map(|id| (*id).clone())
        .collect();
    Plan {
        wanted: wanted.into_iter().collect(),
        create,
        delete,
        latest_ready,
    }
}

#[cfg(test)]
mod tests {
    use cso_api::{Channel, Version, rules::StackKey};
    use proptest::prelude::*;

    use super::*;

    fn id(tag: &str) -> ReleaseId {
        ReleaseId::parse_any(tag).unwrap()
    }

    fn spec(versions: &[&str], channel: Channel, auto_subscribe: bool) -> StackSpec {
        StackSpec {
            stack: StackKey {
                provider: "docker".into(),
                name: "ferrol".into(),
                kubernetes: cso_api::KubernetesVersion { major: 1, minor: 27 },
            },
            channel,
            versions: versions.iter().map(|v| Version::parse_dot(v).unwrap()).collect(),
            auto_subscribe,
        }
    }

    fn existing(tags: &[(&str, bool)]) -> Vec<ExistingRelease> {
        tags.iter()
            .map(|(t, ready)| ExistingRelease {
                id: id(t),
                ready: *ready,
            })
            .collect()
    }

    fn tags(ids: &[ReleaseId]) -> Vec<String> {
        ids.iter().map(ReleaseId::tag).collect()
    }

    #[test]
    fn the_upstream_scenarios() {
        // latest != latest ready, latest ready in use, a new spec entry.
        let p = plan(
            &spec(&["v4"], Channel::Stable, true),
            &existing(&[("docker-ferrol-1-27-v1", true), ("docker-ferrol-1-27-v2", true)]),
            Some(&id("docker-ferrol-1-27-v3")),
            &[id("docker-ferrol-1-27-v2")].into(),
        );
        assert_eq!(
            tags(&p.create),
            ["docker-ferrol-1-27-v3", "docker-ferrol-1-27-v4"]
        );
        assert_eq!(tags(&p.delete), ["docker-ferrol-1-27-v1"]);
        assert_eq!(p.latest_ready, Some(id("docker-ferrol-1-27-v2")));

        // Latest = latest ready = v4, v3 in use, nothing in spec.
        let p = plan(
            &spec(&[], Channel::Stable, true),
            &existing(&[
                ("docker-ferrol-1-27-v1", true),
                ("docker-ferrol-1-27-v2", true),
                ("docker-ferrol-1-27-v3", true),
                ("docker-ferrol-1-27-v4", true),
            ]),
            Some(&id("docker-ferrol-1-27-v4")),
            &[id("docker-ferrol-1-27-v3")].into(),
        );
        assert_eq!(
            tags(&p.wanted),
            ["docker-ferrol-1-27-v3", "docker-ferrol-1-27-v4"]
        );
        assert_eq!(
            tags(&p.delete),
            ["docker-ferrol-1-27-v1", "docker-ferrol-1-27-v2"]
        );
    }

    #[test]
    fn removing_a_version_deletes_it_unless_a_cluster_uses_it() {
        let s = spec(&["v2"], Channel::Stable, false);
        let ex = existing(&[("docker-ferrol-1-27-v1", true), ("docker-ferrol-1-27-v2", false)]);
        let newest_ready_kept = plan(&s, &ex, None, &BTreeSet::new());
        assert!(
            newest_ready_kept.delete.is_empty(),
            "v1 is the newest ready release: kept until v2 is ready"
        );

        let ex = existing(&[("docker-ferrol-1-27-v1", true), ("docker-ferrol-1-27-v2", true)]);
        assert_eq!(
            tags(&plan(&s, &ex, None, &BTreeSet::new()).delete),
            ["docker-ferrol-1-27-v1"]
        );
        let used = plan(&s, &ex, None, &[id("docker-ferrol-1-27-v1")].into());
        assert!(
            used.delete.is_empty(),
            "a release a Cluster uses is never deleted"
        );
    }

    #[test]
    fn custom_channel_releases_match_their_cluster_class_names() {
        let s = spec(&[], Channel::Custom, true);
        let ex = existing(&[
            ("docker-ferrol-1-27-v0-sha-hipstsw", true),
            ("docker-ferrol-1-27-v0-sha-abcdef1", true),
        ]);
        // The Cluster names the class in dot form; the release is named in dash form: the same release.
        let in_use = [id("docker-ferrol-1-27-v0-sha.hipstsw")].into();
        let remote = id("docker-ferrol-1-27-v0-sha-zzzzzzz");
        let p = plan(&s, &ex, Some(&remote), &in_use);
        assert!(
            !p.delete.contains(&id("docker-ferrol-1-27-v0-sha-hipstsw")),
            "in use: kept"
        );
        assert_eq!(
            tags(&p.create),
            ["docker-ferrol-1-27-v0-sha-zzzzzzz"],
            "auto-subscribe works on the custom channel"
        );
        assert_eq!(
            p.latest_ready.as_ref().map(ReleaseId::tag).as_deref(),
            Some("docker-ferrol-1-27-v0-sha-hipstsw")
        );
    }

    #[test]
    fn other_stacks_and_channels_are_ignored() {
        let s = spec(&["v1"], Channel::Stable, true);
        let in_use = [id("docker-scs-1-27-v9"), id("docker-ferrol-1-28-v9")].into();
        let p = plan(&s, &[], Some(&id("docker-ferrol-1-27-v0-sha-abcdef1")), &in_use);
        assert_eq!(tags(&p.wanted), ["docker-ferrol-1-27-v1"]);
    }

    fn arbitrary_case() -> impl Strategy<
        Value = (
            StackSpec,
            Vec<ExistingRelease>,
            Option<ReleaseId>,
            BTreeSet<ReleaseId>,
        ),
    > {
        let tag = (1u64..8).prop_map(|v| id(&format!("docker-ferrol-1-27-v{v}")));
        (
            proptest::collection::vec(1u64..8, 0..4),
            any::<bool>(),
            proptest::collection::vec((tag.clone(), any::<bool>()), 0..6),
            proptest::option::of(tag.clone()),
            proptest::collection::btree_set(tag, 0..3),
        )
            .prop_map(|(versions, auto, existing, remote, in_use)| {
                let versions: Vec<String> = versions.iter().map(|v| format!("v{v}")).collect();
                let refs: Vec<&str> = versions.iter().map(String::as_str).collect();
                let mut seen = BTreeSet::new();
                let existing = existing
                    .into_iter()
                    .filter(|(id, _)| seen.insert(id.clone()))
                    .map(|(id, ready)| ExistingRelease { id, ready })
                    .collect();
                (spec(&refs, Channel::Stable, auto), existing, remote, in_use)
            })
    }

    proptest! {
        #[test]
        fn never_deletes_what_is_used_listed_or_newest_ready((s, ex, remote, in_use) in arbitrary_case()) {
            let p = plan(&s, &ex, remote.as_ref(), &in_use);
            for deleted in &p.delete {
                prop_assert!(!in_use.contains(deleted));
                prop_assert!(!s.versions.contains(&deleted.version));
                prop_assert!(Some(deleted) != p.latest_ready.as_ref());
                prop_assert!(!p.create.contains(deleted));
            }
            for id in &p.wanted {
                prop_assert!(p.create.contains(id) ^ ex.iter().any(|e| &e.id == id));
            }
            prop_assert!(p.wanted.windows(2).all(|w| w[0] < w[1]), "sorted");
            prop_assert_eq!(plan(&s, &ex, remote.as_ref(), &in_use), p, "deterministic");
        }
    }
}
