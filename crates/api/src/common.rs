//! Types shared by the three CRDs: object references, the per-object inventory entry and the identity of an
//! applied object ([`ObjectKey`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::atom::Atom;

/// A reference to another object (the shape of `corev1.ObjectReference`, treated as one atomic value).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct ObjectReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field_path: Option<String>,
}

/// Whether the last apply or delete of an inventory entry succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ResourceStatus {
    #[serde(rename = "synced")]
    Synced,
    #[serde(rename = "not-synced")]
    NotSynced,
}

/// One object the operator applied (an entry of `status.resources`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resource {
    #[serde(default, skip_serializing_if = "Atom::is_empty")]
    pub group: Atom,
    #[serde(default, skip_serializing_if = "Atom::is_empty")]
    pub version: Atom,
    #[serde(default, skip_serializing_if = "Atom::is_empty")]
    pub kind: Atom,
    /// The namespace the object really lives in (empty for cluster-scoped objects).
    #[serde(default, skip_serializing_if = "Atom::is_empty")]
    pub namespace: Atom,
    #[serde(default, skip_serializing_if = "Atom::is_empty")]
    pub name: Atom,
    /// `synced` or `not-synced`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub status: Option<ResourceStatus>,
    /// The error of the last apply or delete, if it failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

impl Resource {
    /// The identity of the object: group, kind, namespace and name (the version may change between releases).
    pub fn key(&self) -> (&str, &str, &str, &str) {
        (&self.group, &self.kind, &self.namespace, &self.name)
    }
}

/// The identity of an object in a cluster: group, kind, namespace and name. The kind is part of it because
/// charts name objects of different kinds alike (metrics-server's ServiceAccount, Service and Deployment are
/// all `kube-system/metrics-server`); the version is not, because a release may move an object to another
/// version of its API and it is still the same object.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// Empty for the core group.
    pub group: Atom,
    pub kind: Atom,
    /// Empty for cluster-scoped objects.
    pub namespace: Atom,
    pub name: Atom,
}

impl ObjectKey {
    /// The identity of the object an inventory entry names.
    pub fn of(resource: &Resource) -> Self {
        ObjectKey {
            group: resource.group.clone(),
            kind: resource.kind.clone(),
            namespace: resource.namespace.clone(),
            name: resource.name.clone(),
        }
    }
}

/// `Deployment.apps kube-system/web`, `ClusterRole.rbac.authorization.k8s.io cso`, `Service default/x`:
/// kubectl's `kind.group` spelling, so a key in a log can be pasted into `kubectl get`.
impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.kind)?;
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        match self.namespace.as_str() {
            "" => write!(f, " {}", self.name),
            ns => write!(f, " {ns}/{}", self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(group: &str, version: &str, kind: &str, namespace: &str, name: &str) -> Resource {
        Resource {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn object_keys_print_as_kubectl_names_them() {
        for (resource, printed) in [
            (
                resource("apps", "v1", "Deployment", "kube-system", "web"),
                "Deployment.apps kube-system/web",
            ),
            (resource("", "v1", "Service", "default", "x"), "Service default/x"),
            (
                resource("rbac.authorization.k8s.io", "v1", "ClusterRole", "", "cso"),
                "ClusterRole.rbac.authorization.k8s.io cso",
            ),
            (resource("", "v1", "Namespace", "", "team"), "Namespace team"),
        ] {
            assert_eq!(ObjectKey::of(&resource).to_string(), printed);
        }
    }

    #[test]
    fn the_kind_makes_another_object_and_the_version_does_not() {
        let account = ObjectKey::of(&resource(
            "",
            "v1",
            "ServiceAccount",
            "kube-system",
            "metrics-server",
        ));
        let service = ObjectKey::of(&resource("", "v1", "Service", "kube-system", "metrics-server"));
        assert_ne!(account, service);
        assert_eq!(
            ObjectKey::of(&resource("apps", "v1beta2", "Deployment", "ns", "x")),
            ObjectKey::of(&resource("apps", "v1", "Deployment", "ns", "x"))
        );
    }

    #[test]
    fn object_keys_sort_by_group_kind_namespace_name() {
        let mut keys: Vec<ObjectKey> = [
            resource("apps", "v1", "Deployment", "b", "x"),
            resource("", "v1", "Service", "a", "x"),
            resource("apps", "v1", "Deployment", "a", "y"),
            resource("", "v1", "ConfigMap", "z", "x"),
        ]
        .iter()
        .map(ObjectKey::of)
        .collect();
        keys.sort();
        let printed: Vec<String> = keys.iter().map(ToString::to_string).collect();
        assert_eq!(
            printed,
            [
                "ConfigMap z/x",
                "Service a/x",
                "Deployment.apps a/y",
                "Deployment.apps b/x"
            ]
        );
    }
}
