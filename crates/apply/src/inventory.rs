//! The inventory of applied objects, keyed by group, kind, namespace and name (the Go operator keys by
//! namespace and name only, so metrics-server's ServiceAccount, Service and Deployment collide).

use std::collections::BTreeSet;

use cso_api::common::Resource;

/// The identity of an object in a cluster (group, kind, namespace, name), shared with the whole operator.
pub use cso_api::common::ObjectKey;

/// The inventory entry naming a rendered object (as it was written: an empty namespace means the release's).
/// A delete stage removes the objects so named as the prune removes stale entries.
pub fn resource_of(manifest: &cso_api::manifest::Manifest) -> Resource {
    let (group, version) = manifest.group_version();
    Resource {
        group: group.to_owned(),
        version: version.to_owned(),
        kind: manifest.kind().to_owned(),
        namespace: manifest.namespace().unwrap_or_default().to_owned(),
        name: manifest.name().to_owned(),
        ..Default::default()
    }
}

/// What the previous inventory has and the new one does not: the objects to prune.
pub fn to_prune<'a>(previous: &'a [Resource], current: &BTreeSet<ObjectKey>) -> Vec<&'a Resource> {
    let mut seen = BTreeSet::new();
    previous
        .iter()
        .filter(|r| !current.contains(&ObjectKey::of(r)))
        .filter(|r| seen.insert(ObjectKey::of(r)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(group: &str, kind: &str, namespace: &str, name: &str) -> Resource {
        Resource {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn same_name_different_kinds_are_different_objects() {
        let previous = vec![
            resource("", "ServiceAccount", "kube-system", "metrics-server"),
            resource("", "Service", "kube-system", "metrics-server"),
            resource("apps", "Deployment", "kube-system", "metrics-server"),
            resource("apps", "Deployment", "kube-system", "web"),
        ];
        let current: BTreeSet<ObjectKey> = previous[..3].iter().map(ObjectKey::of).collect();
        let pruned: Vec<String> = to_prune(&previous, &current)
            .iter()
            .map(|r| ObjectKey::of(r).to_string())
            .collect();
        assert_eq!(pruned, ["Deployment.apps kube-system/web"]);
    }

    #[test]
    fn the_version_does_not_make_another_object() {
        let mut old = resource("apps", "Deployment", "kube-system", "x");
        old.version = "v1beta2".into();
        let current: BTreeSet<ObjectKey> =
            [ObjectKey::of(&resource("apps", "Deployment", "kube-system", "x"))].into();
        assert!(to_prune(&[old], &current).is_empty());
    }
}
