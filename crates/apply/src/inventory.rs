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
        group: group.into(),
        version: version.into(),
        kind: manifest.kind().into(),
        namespace: manifest.namespace().unwrap_or_default().into(),
        name: manifest.name().into(),
        ..Default::default()
    }
}

/// `resource` as the engine keys it, given whether its kind is namespaced (`None`: unknown, left as it is).
///
/// Inventories may name an object otherwise than the engine does: the Go operator records the namespace as
/// rendered, so `""` for a namespaced object the chart gave no namespace (it lives in the default one), and
/// the chart's namespace for a cluster-scoped object that was given one (it has none). Compared as recorded,
/// such entries do not match the render and the live object would be pruned although the render still has
/// it.
pub fn normalised(resource: &Resource, default_namespace: &str, namespaced: Option<bool>) -> Resource {
    let mut resource = resource.clone();
    match namespaced {
        Some(true) if resource.namespace.is_empty() => resource.namespace = default_namespace.into(),
        Some(false) => resource.namespace = Default::default(),
        _ => {}
    }
    resource
}

/// Whether an inventory entry names a Namespace.
pub fn is_namespace(resource: &Resource) -> bool {
    resource.group.is_empty() && resource.kind == "Namespace"
}

/// Whether an inventory entry names a CustomResourceDefinition.
pub fn is_crd(resource: &Resource) -> bool {
    resource.group == "apiextensions.k8s.io" && resource.kind == "CustomResourceDefinition"
}

/// Whether a prune leaves the object in place whatever the render says: Namespaces and
/// CustomResourceDefinitions, whose deletion takes everything in them (every custom object of the kind, in
/// every namespace) with it. Only a deletion asked for by name deletes them (a delete stage, a chart the
/// release no longer has, the owner being deleted).
pub fn is_never_pruned(resource: &Resource) -> bool {
    is_namespace(resource) || is_crd(resource)
}

/// Why a render may not be applied over the inventory `previous` (normalised) without being asked by name:
/// it has no objects where the last apply left some, or fewer than half as many. A render that broke (a
/// values file that switched everything off, a chart that lost its templates) looks like that, and applying
/// it would prune what runs the workload cluster. A release that really removes that much says so: a delete
/// stage, or a chart it no longer has.
pub fn shrink_held(previous: &[Resource], rendered: usize) -> Option<String> {
    let before: BTreeSet<ObjectKey> = previous.iter().map(ObjectKey::of).collect();
    let before = before.len();
    if before == 0 || rendered * 2 >= before {
        return None;
    }
    let what = if rendered == 0 {
        "no objects".to_owned()
    } else {
        format!("{rendered} objects")
    };
    Some(format!(
        "held: the render has {what} where the last apply left {before}; nothing was applied or pruned \
         (a release that removes more than half of the objects says so in a delete stage)"
    ))
}

/// What the previous inventory has and the new one does not: the objects to prune, Namespaces last (their
/// contents go first). `previous` must be [`normalised`].
pub fn to_prune<'a>(previous: &'a [Resource], current: &BTreeSet<ObjectKey>) -> Vec<&'a Resource> {
    let mut seen = BTreeSet::new();
    let mut stale: Vec<&Resource> = previous
        .iter()
        .filter(|r| !current.contains(&ObjectKey::of(r)))
        .filter(|r| seen.insert(ObjectKey::of(r)))
        .collect();
    // A stable sort: otherwise the inventory's order.
    stale.sort_by_key(|r| is_namespace(r));
    stale
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
    fn go_operator_entries_are_keyed_where_the_objects_live() {
        let web = resource("apps", "Deployment", "", "web");
        assert_eq!(
            normalised(&web, "kube-system", Some(true)).namespace,
            "kube-system"
        );
        let elsewhere = resource("apps", "Deployment", "monitoring", "web");
        assert_eq!(
            normalised(&elsewhere, "kube-system", Some(true)).namespace,
            "monitoring"
        );
        let role = resource(
            "rbac.authorization.k8s.io",
            "ClusterRole",
            "kube-system",
            "reader",
        );
        assert_eq!(normalised(&role, "kube-system", Some(false)).namespace, "");
        assert_eq!(
            normalised(&web, "kube-system", None),
            web,
            "an unknown kind stays as it is"
        );

        // The Go operator's inventory of a release the render still has: nothing to prune.
        let previous: Vec<Resource> = [web, role]
            .iter()
            .zip([Some(true), Some(false)])
            .map(|(r, scope)| normalised(r, "kube-system", scope))
            .collect();
        let current: BTreeSet<ObjectKey> = [
            ObjectKey::of(&resource("apps", "Deployment", "kube-system", "web")),
            ObjectKey::of(&resource(
                "rbac.authorization.k8s.io",
                "ClusterRole",
                "",
                "reader",
            )),
        ]
        .into();
        assert!(to_prune(&previous, &current).is_empty());
    }

    #[test]
    fn namespaces_are_pruned_after_their_contents() {
        let previous = vec![
            resource("", "Namespace", "", "made"),
            resource("", "ConfigMap", "made", "a"),
            resource("apps", "Deployment", "made", "b"),
        ];
        let names: Vec<&str> = to_prune(&previous, &BTreeSet::new())
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(names, ["a", "b", "made"]);
    }

    #[rstest::rstest]
    #[case::first_apply(0, 0, false)]
    #[case::first_apply_of_a_chart(0, 5, false)]
    #[case::the_same(15, 15, false)]
    #[case::one_fewer(15, 14, false)]
    #[case::half(10, 5, false)]
    #[case::fewer_than_half(10, 4, true)]
    #[case::empty(15, 0, true)]
    #[case::one_gone(1, 0, true)]
    fn a_render_that_lost_half_of_the_objects_is_held(
        #[case] before: usize,
        #[case] rendered: usize,
        #[case] held: bool,
    ) {
        let previous: Vec<Resource> = (0..before)
            .map(|i| resource("", "ConfigMap", "kube-system", &format!("c{i}")))
            .collect();
        let verdict = shrink_held(&previous, rendered);
        assert_eq!(verdict.is_some(), held, "{verdict:?}");
        if let Some(message) = verdict {
            assert!(
                message.contains(&format!("the last apply left {before}")),
                "{message}"
            );
        }
    }

    #[test]
    fn an_inventory_that_names_an_object_twice_counts_it_once() {
        let twice = vec![
            resource("apps", "Deployment", "kube-system", "x"),
            resource("apps", "Deployment", "kube-system", "x"),
        ];
        assert!(shrink_held(&twice, 1).is_none());
    }

    #[rstest::rstest]
    #[case::namespace("", "Namespace", true)]
    #[case::crd("apiextensions.k8s.io", "CustomResourceDefinition", true)]
    #[case::a_kind_named_namespace_elsewhere("example.com", "Namespace", false)]
    #[case::deployment("apps", "Deployment", false)]
    fn namespaces_and_crds_are_never_pruned(#[case] group: &str, #[case] kind: &str, #[case] spared: bool) {
        assert_eq!(is_never_pruned(&resource(group, kind, "", "x")), spared);
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
