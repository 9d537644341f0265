//! Which releases of a ClusterStack must exist (pure).
//!
//! Wanted = the releases of `spec.versions` ∪ the newest remote release of the channel (with auto-subscribe)
//! ∪ the newest ready release ∪ every release a Cluster uses that exists or can be had. Missing wanted
//! releases are created; existing ones nobody wants are deleted, so a release in use or the newest ready one
//! is never deleted. Everything is compared as [`ReleaseId`]s, so dot-form ClusterClass names and dash-form
//! release names of custom (hash) versions match (the Go operator compares strings and deletes in-use custom
//! releases). Output is sorted, so the status does not churn between reconciles.
//!
//! A release that only a Cluster asks for (not listed, not the newest, not existing) is created only if it
//! can be had: the source lists it or the cache holds it, or the source could not be asked. Otherwise the
//! Cluster names a version the stack does not have (`docker-ferrol-1-27-v8` for `v2`): a typo, reported on
//! the Cluster ([`Plan::unavailable_in_use`]), not turned into a release that can only fail.

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
    /// Releases of the stack that Clusters use but that do not exist and cannot be had (neither at the source
    /// nor in the cache), sorted: not created; their Clusters are told.
    pub unavailable_in_use: Vec<ReleaseId>,
}

/// Which releases of the stack's channel can be had, at the source or in the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Available {
    /// Not known (not asked, or the source did not answer): a release a Cluster uses is created, and its own
    /// conditions say whether it can be had.
    Unknown,
    /// These, and no others.
    Only(BTreeSet<ReleaseId>),
}

impl Available {
    fn may_have(&self, id: &ReleaseId) -> bool {
        match self {
            Available::Unknown => true,
            Available::Only(ids) => ids.contains(id),
        }
    }
}

/// Plans the releases of `spec`. `latest_remote` is the newest release of the channel at the source (already
/// filtered to this stack and channel); `in_use` are the classes Clusters use (any stack or channel: only
/// those the stack owns count); `available` what the source and the cache have.
pub fn plan(
    spec: &StackSpec,
    existing: &[ExistingRelease],
    latest_remote: Option<&ReleaseId>,
    in_use: &BTreeSet<ReleaseId>,
    available: &Available,
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

    let existing_ids: BTreeSet<&ReleaseId> = existing.iter().map(|r| &r.id).collect();
    let mut unavailable_in_use = Vec::new();
    for id in in_use.iter().filter(|id| spec.owns(id)) {
        if wanted.contains(id) || existing_ids.contains(id) || available.may_have(id) {
            wanted.insert(id.clone());
        } else {
            unavailable_in_use.push(id.clone());
        }
    }
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
        unavailable_in_use,
    }
}

/// Whether a Cluster uses a release of the stack that neither exists nor is wanted for another reason: only
/// then is it worth asking the source what it has.
pub fn needs_availability(
    spec: &StackSpec,
    existing: &[ExistingRelease],
    latest_remote: Option<&ReleaseId>,
    in_use: &BTreeSet<ReleaseId>,
) -> bool {
    let nothing = Available::Only(BTreeSet::new());
    !plan(spec, existing, latest_remote, in_use, &nothing)
        .unavailable_in_use
        .is_empty()
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
            pins: Default::default(),
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
            &Available::Unknown,
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
            &Available::Unknown,
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
        let newest_ready_kept = plan(&s, &ex, None, &BTreeSet::new(), &Available::Unknown);
        assert!(
            newest_ready_kept.delete.is_empty(),
            "v1 is the newest ready release: kept until v2 is ready"
        );

        let ex = existing(&[("docker-ferrol-1-27-v1", true), ("docker-ferrol-1-27-v2", true)]);
        assert_eq!(
            tags(&plan(&s, &ex, None, &BTreeSet::new(), &Available::Unknown).delete),
            ["docker-ferrol-1-27-v1"]
        );
        let used = plan(
            &s,
            &ex,
            None,
            &[id("docker-ferrol-1-27-v1")].into(),
            &Available::Unknown,
        );
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
        let p = plan(&s, &ex, Some(&remote), &in_use, &Available::Unknown);
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
        let p = plan(
            &s,
            &[],
            Some(&id("docker-ferrol-1-27-v0-sha-abcdef1")),
            &in_use,
            &Available::Unknown,
        );
        assert_eq!(tags(&p.wanted), ["docker-ferrol-1-27-v1"]);
    }

    #[rstest::rstest]
    // A typo: the source has v1-v3, the Cluster names v8.
    #[case::a_typo_is_not_created(&[], &[], &["v1", "v2", "v3"], &[], &["v8"])]
    // Published but not listed in the spec (the Go operator's case): created for its Cluster.
    #[case::at_the_source(&[], &[], &["v1", "v2", "v8"], &["v8"], &[])]
    // The source could not be asked: created, its own conditions tell.
    #[case::source_unknown(&[], &[], &[], &["v8"], &[])]
    // Exists already (made by hand, or the source dropped it since): kept, never reported.
    #[case::existing(&[], &["v8"], &["v1"], &[], &[])]
    // Listed in the spec: created whatever the source says (the release reports ReleaseNotFound itself).
    #[case::in_the_spec(&["v8"], &[], &["v1"], &["v8"], &[])]
    fn releases_clusters_ask_for(
        #[case] versions: &[&str],
        #[case] existing_versions: &[&str],
        #[case] at_source: &[&str],
        #[case] created: &[&str],
        #[case] reported: &[&str],
    ) {
        let tag = |v: &&str| format!("docker-ferrol-1-27-{v}");
        let s = spec(versions, Channel::Stable, false);
        let ex: Vec<ExistingRelease> = existing_versions
            .iter()
            .map(|v| ExistingRelease {
                id: id(&tag(v)),
                ready: false,
            })
            .collect();
        let available = if at_source.is_empty() {
            Available::Unknown
        } else {
            Available::Only(at_source.iter().map(|v| id(&tag(v))).collect())
        };
        let in_use = [id("docker-ferrol-1-27-v8")].into();
        let p = plan(&s, &ex, None, &in_use, &available);
        assert_eq!(tags(&p.create), created.iter().map(tag).collect::<Vec<_>>());
        assert_eq!(
            tags(&p.unavailable_in_use),
            reported.iter().map(tag).collect::<Vec<_>>()
        );
        assert!(p.delete.is_empty());
        assert_eq!(
            needs_availability(&s, &ex, None, &in_use),
            versions.is_empty() && existing_versions.is_empty(),
            "the source is asked only for a release nothing else wants"
        );
    }

    fn arbitrary_case() -> impl Strategy<
        Value = (
            StackSpec,
            Vec<ExistingRelease>,
            Option<ReleaseId>,
            BTreeSet<ReleaseId>,
            Available,
        ),
    > {
        let tag = (1u64..8).prop_map(|v| id(&format!("docker-ferrol-1-27-v{v}")));
        (
            proptest::collection::vec(1u64..8, 0..4),
            any::<bool>(),
            proptest::collection::vec((tag.clone(), any::<bool>()), 0..6),
            proptest::option::of(tag.clone()),
            proptest::collection::btree_set(tag.clone(), 0..3),
            proptest::option::of(proptest::collection::btree_set(tag, 0..5)),
        )
            .prop_map(|(versions, auto, existing, remote, in_use, available)| {
                let versions: Vec<String> = versions.iter().map(|v| format!("v{v}")).collect();
                let refs: Vec<&str> = versions.iter().map(String::as_str).collect();
                let mut seen = BTreeSet::new();
                let existing = existing
                    .into_iter()
                    .filter(|(id, _)| seen.insert(id.clone()))
                    .map(|(id, ready)| ExistingRelease { id, ready })
                    .collect();
                let available = available.map_or(Available::Unknown, Available::Only);
                (
                    spec(&refs, Channel::Stable, auto),
                    existing,
                    remote,
                    in_use,
                    available,
                )
            })
    }

    proptest! {
        #[test]
        fn never_deletes_what_is_used_listed_or_newest_ready((s, ex, remote, in_use, available) in arbitrary_case()) {
            let p = plan(&s, &ex, remote.as_ref(), &in_use, &available);
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
            prop_assert_eq!(plan(&s, &ex, remote.as_ref(), &in_use, &available), p, "deterministic");
        }

        #[test]
        fn a_release_only_clusters_ask_for_is_created_only_if_it_can_be_had((s, ex, remote, in_use, available) in arbitrary_case()) {
            let p = plan(&s, &ex, remote.as_ref(), &in_use, &available);
            for id in &in_use {
                // Every release in use is either wanted or reported, never both.
                prop_assert!(p.wanted.contains(id) ^ p.unavailable_in_use.contains(id));
            }
            for id in &p.unavailable_in_use {
                prop_assert!(!available.may_have(id));
                prop_assert!(!ex.iter().any(|e| &e.id == id), "an existing release in use is kept");
            }
            prop_assert_eq!(
                needs_availability(&s, &ex, remote.as_ref(), &in_use),
                !plan(&s, &ex, remote.as_ref(), &in_use, &Available::Only(BTreeSet::new())).unavailable_in_use.is_empty()
            );
        }
    }
}
