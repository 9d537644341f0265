//! Which Clusters use which cluster-stack release: a Cluster uses the release whose ClusterClass its topology
//! names (`v1beta1` `class` + `classNamespace`, or `v1beta2` `classRef`), in the class's namespace, which may
//! be another namespace than the Cluster's own. Releases are compared as [`ReleaseId`]s, so the dot form of a
//! ClusterClass name (`...-v0-sha.hipstsw`) and the dash form of a release name (`...-v0-sha-hipstsw`) match.
//! Clusters whose class is not named like a cluster stack's use no release.
//!
//! Users are named `namespace/name`, sorted, so messages and statuses do not change between calls.

use std::{
    borrow::Borrow,
    collections::{BTreeMap, BTreeSet},
};

use crate::{ClusterStack, ReleaseId, capi::Cluster, rules::StackKey};

/// The releases used by `clusters` whose class lives in `namespace`, each with its Clusters (`ns/name`).
pub fn releases_in_use(
    clusters: &[impl Borrow<Cluster>],
    namespace: &str,
) -> BTreeMap<ReleaseId, BTreeSet<String>> {
    let mut used: BTreeMap<ReleaseId, BTreeSet<String>> = BTreeMap::new();
    for (id, user) in uses(clusters, namespace) {
        used.entry(id).or_default().insert(user);
    }
    used
}

/// The Clusters (`ns/name`, sorted) using `release`, whose ClusterStackRelease lives in `namespace`.
pub fn release_users(clusters: &[impl Borrow<Cluster>], namespace: &str, release: &ReleaseId) -> Vec<String> {
    sorted(
        uses(clusters, namespace)
            .filter(|(id, _)| id == release)
            .map(|(_, user)| user),
    )
}

/// The Clusters (`ns/name`, sorted) using any release `stack` owns (see [`crate::rules::StackSpec::owns`]:
/// its stack, Kubernetes minor and channel, so hash builds count for a `custom` ClusterStack). Only the
/// stack's identity is read, so a ClusterStack with invalid `spec.versions` still has its users; one without
/// a valid identity owns nothing.
pub fn stack_users(clusters: &[impl Borrow<Cluster>], stack: &ClusterStack) -> Vec<String> {
    let Ok(key) = StackKey::of(stack) else {
        return Vec::new();
    };
    let namespace = stack.metadata.namespace.as_deref().unwrap_or_default();
    sorted(
        uses(clusters, namespace)
            .filter(|(id, _)| key.owns(stack.spec.channel, id))
            .map(|(_, user)| user),
    )
}

/// Each Cluster whose class is a cluster stack's in `namespace`, with its release and its `ns/name`.
fn uses<'a>(
    clusters: &'a [impl Borrow<Cluster>],
    namespace: &'a str,
) -> impl Iterator<Item = (ReleaseId, String)> + 'a {
    clusters.iter().filter_map(move |cluster| {
        let cluster: &Cluster = cluster.borrow();
        let (id, class_namespace) = cluster.stack_release()?;
        (class_namespace == namespace).then(|| {
            let meta = &cluster.metadata;
            let user = format!(
                "{}/{}",
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default()
            );
            (id, user)
        })
    })
}

fn sorted(users: impl Iterator<Item = String>) -> Vec<String> {
    let users: BTreeSet<String> = users.collect();
    users.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn cluster(ns: &str, name: &str, topology: Value) -> Cluster {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"topology": topology},
        }))
        .unwrap()
    }

    fn v1beta1(ns: &str, name: &str, class: &str) -> Cluster {
        cluster(ns, name, json!({"class": class, "version": "v1.27.3"}))
    }

    fn plain(ns: &str, name: &str) -> Cluster {
        serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"name": name, "namespace": ns}, "spec": {},
        }))
        .unwrap()
    }

    fn id(name: &str) -> ReleaseId {
        ReleaseId::parse_any(name).unwrap()
    }

    fn stack(ns: &str, channel: &str, versions: Value) -> ClusterStack {
        serde_json::from_value(json!({
            "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
            "metadata": {"name": "ferrol", "namespace": ns},
            "spec": {"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27",
                     "channel": channel, "noProvider": true, "versions": versions},
        }))
        .unwrap()
    }

    /// Clusters of every shape, with classes in namespace `a` unless they say otherwise.
    fn fleet() -> Vec<Cluster> {
        vec![
            v1beta1("a", "c1", "docker-ferrol-1-27-v1"),
            // The dot form of a hash build's class.
            v1beta1("a", "hash", "docker-ferrol-1-27-v0-sha.hipstsw"),
            // v1beta2, class in another namespace.
            cluster(
                "b",
                "c3",
                json!({"classRef": {"name": "docker-ferrol-1-27-v1", "namespace": "a"}}),
            ),
            // v1beta1 with classNamespace (Cluster API >= 1.9).
            cluster(
                "c",
                "c4",
                json!({"class": "docker-ferrol-1-27-v2", "classNamespace": "a"}),
            ),
            // A class in its own namespace b: not a user of a's releases.
            v1beta1("b", "c5", "docker-ferrol-1-27-v2"),
            v1beta1("a", "minor", "docker-ferrol-1-28-v1"),
            v1beta1("a", "other-stack", "docker-scs-1-27-v1"),
            v1beta1("a", "own-class", "my-own-class"),
            v1beta1("a", "alpha", "docker-ferrol-1-27-v1-alpha.0"),
            plain("a", "no-topology"),
        ]
    }

    #[test]
    fn releases_in_use_by_namespace_of_the_class() {
        let used = releases_in_use(&fleet(), "a");
        let summary: Vec<(String, Vec<&str>)> = used
            .iter()
            .map(|(id, users)| (id.tag(), users.iter().map(String::as_str).collect()))
            .collect();
        assert_eq!(
            summary,
            [
                ("docker-ferrol-1-27-v0-sha-hipstsw".to_owned(), vec!["a/hash"]),
                ("docker-ferrol-1-27-v1-alpha-0".to_owned(), vec!["a/alpha"]),
                ("docker-ferrol-1-27-v1".to_owned(), vec!["a/c1", "b/c3"]),
                ("docker-ferrol-1-27-v2".to_owned(), vec!["c/c4"]),
                ("docker-ferrol-1-28-v1".to_owned(), vec!["a/minor"]),
                ("docker-scs-1-27-v1".to_owned(), vec!["a/other-stack"]),
            ]
        );
        let in_b = releases_in_use(&fleet(), "b");
        assert_eq!(in_b.len(), 1);
        assert_eq!(
            in_b[&id("docker-ferrol-1-27-v2")],
            BTreeSet::from(["b/c5".to_owned()])
        );
        assert!(releases_in_use(&fleet(), "elsewhere").is_empty());
        assert!(releases_in_use(&[] as &[Cluster], "a").is_empty());
    }

    #[test]
    fn release_users_match_either_form_of_the_name() {
        for (namespace, release, expected) in [
            ("a", "docker-ferrol-1-27-v1", vec!["a/c1", "b/c3"]),
            ("a", "docker-ferrol-1-27-v0-sha-hipstsw", vec!["a/hash"]),
            ("a", "docker-ferrol-1-27-v0-sha.hipstsw", vec!["a/hash"]),
            ("a", "docker-ferrol-1-27-v2", vec!["c/c4"]),
            ("b", "docker-ferrol-1-27-v2", vec!["b/c5"]),
            ("b", "docker-ferrol-1-27-v1", vec![]),
            ("a", "docker-ferrol-1-27-v3", vec![]),
        ] {
            assert_eq!(
                release_users(&fleet(), namespace, &id(release)),
                expected,
                "{namespace}/{release}"
            );
        }
    }

    #[test]
    fn stack_users_are_clusters_of_any_release_of_the_stack_and_channel() {
        for (stack, expected) in [
            (stack("a", "stable", json!(["v1"])), vec!["a/c1", "b/c3", "c/c4"]),
            // Hash builds and other pre-releases are the custom channel's.
            (stack("a", "custom", json!([])), vec!["a/alpha", "a/hash"]),
            (stack("b", "stable", json!([])), vec!["b/c5"]),
            // Invalid versions do not switch off the protection: the identity is enough.
            (stack("a", "stable", json!(["one"])), vec!["a/c1", "b/c3", "c/c4"]),
            (stack("elsewhere", "stable", json!([])), vec![]),
        ] {
            assert_eq!(stack_users(&fleet(), &stack), expected, "{:?}", stack.spec);
        }
        let mut no_identity = stack("a", "stable", json!([]));
        no_identity.spec.kubernetes_version = "127".into();
        assert!(stack_users(&fleet(), &no_identity).is_empty());
    }

    #[test]
    fn users_are_sorted_and_unique() {
        let clusters = [
            v1beta1("z", "c", "docker-ferrol-1-27-v1"),
            v1beta1("a", "b", "docker-ferrol-1-27-v1"),
            v1beta1("a", "b", "docker-ferrol-1-27-v1"),
        ];
        let by_namespace_of_class = |ns: &str| {
            clusters
                .iter()
                .filter(|c| c.metadata.namespace.as_deref() == Some(ns))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(
            release_users(&by_namespace_of_class("a"), "a", &id("docker-ferrol-1-27-v1")),
            ["a/b"]
        );
        let cross: Vec<Cluster> = clusters
            .iter()
            .map(|c| {
                let mut c = c.clone();
                if let Some(t) = c.spec.topology.as_mut() {
                    t.class_namespace = Some("stacks".into());
                }
                c
            })
            .collect();
        assert_eq!(
            release_users(&cross, "stacks", &id("docker-ferrol-1-27-v1")),
            ["a/b", "z/c"]
        );
    }
}
