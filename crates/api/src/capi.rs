//! The few Cluster API objects the operator reads, as tolerant views.
//!
//! The `Cluster` view understands both `v1beta1` (`spec.topology.class`, optional `classNamespace`) and
//! `v1beta2` (`spec.topology.classRef {name, namespace}`) and both reference shapes (`apiVersion` or `apiGroup`).
//! Fields the operator does not need are ignored, so newer Cluster API releases do not break parsing.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// The Cluster API group.
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";
/// Label that marks objects a `--watch-filter` operator instance handles.
pub const WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";
/// Annotation that pauses reconciliation of an object.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";

/// The parts of a Cluster API `Cluster` the operator reads.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "cluster.x-k8s.io",
    version = "v1beta1",
    kind = "Cluster",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_ref: Option<CapiReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure_ref: Option<CapiReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<ApiEndpoint>,
}

/// `spec.topology` of either API version.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Topology {
    /// `v1beta1`: the ClusterClass name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// `v1beta1` (CAPI >= 1.9): the ClusterClass namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_namespace: Option<String>,
    /// `v1beta2`: the ClusterClass reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_ref: Option<ClassRef>,
    /// The Kubernetes version, e.g. `v1.27.3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// `spec.topology.classRef` (`v1beta2`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClassRef {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A reference to a control plane or infrastructure object, in the `v1beta1` (`apiVersion`) or
/// `v1beta2` (`apiGroup`) shape.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapiReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `spec.controlPlaneEndpoint`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ApiEndpoint {
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub port: i32,
}

/// The ClusterClass a Cluster is built from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClassName {
    pub name: String,
    /// The class's namespace: the Cluster's own unless the topology names another.
    pub namespace: String,
}

impl Cluster {
    /// The ClusterClass of this Cluster, if it has a topology that names one.
    pub fn class(&self) -> Option<ClassName> {
        let own_namespace = self.metadata.namespace.clone().unwrap_or_default();
        let topology = self.spec.topology.as_ref()?;
        let (name, namespace) = match (&topology.class_ref, &topology.class) {
            (Some(class_ref), _) => (class_ref.name.clone(), class_ref.namespace.clone()),
            (None, Some(class)) => (class.clone(), topology.class_namespace.clone()),
            (None, None) => return None,
        };
        let namespace = namespace.filter(|ns| !ns.is_empty()).unwrap_or(own_namespace);
        (!name.is_empty()).then_some(ClassName { name, namespace })
    }

    /// The cluster-stack release whose ClusterClass this Cluster uses, with the class's namespace; `None`
    /// without a class or for a class that is not named like a cluster stack's.
    pub fn stack_release(&self) -> Option<(crate::ReleaseId, String)> {
        let class = self.class()?;
        let id = crate::ReleaseId::parse_cluster_class(&class.name).ok()?;
        Some((id, class.namespace))
    }

    /// The Kubernetes version of the topology, e.g. `v1.27.3`.
    pub fn topology_version(&self) -> Option<&str> {
        self.spec
            .topology
            .as_ref()?
            .version
            .as_deref()
            .filter(|v| !v.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: serde_json::Value) -> Cluster {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn reads_a_v1beta1_cluster() {
        let cluster = parse(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": "team"},
            "spec": {
                "topology": {"class": "docker-ferrol-1-27-v1", "version": "v1.27.3", "workers": {}},
                "controlPlaneRef": {"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "KubeadmControlPlane", "name": "c1-cp"},
                "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerCluster", "name": "c1"},
                "controlPlaneEndpoint": {"host": "10.0.0.1", "port": 6443},
                "clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]}}
            },
            "status": {"phase": "Provisioned"}
        }));
        assert_eq!(
            cluster.class(),
            Some(ClassName {
                name: "docker-ferrol-1-27-v1".into(),
                namespace: "team".into()
            })
        );
        assert_eq!(cluster.topology_version(), Some("v1.27.3"));
        let (release, class_namespace) = cluster.stack_release().unwrap();
        assert_eq!(
            (release.tag().as_str(), class_namespace.as_str()),
            ("docker-ferrol-1-27-v1", "team")
        );
        assert_eq!(cluster.spec.control_plane_endpoint.unwrap().host, "10.0.0.1");
        assert_eq!(
            cluster.spec.control_plane_ref.unwrap().kind,
            "KubeadmControlPlane"
        );
    }

    #[test]
    fn reads_a_v1beta2_cluster_with_a_class_in_another_namespace() {
        let cluster = parse(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c2", "namespace": "team"},
            "spec": {
                "topology": {"classRef": {"name": "docker-ferrol-1-27-v2", "namespace": "stacks"}, "version": "v1.27.3"},
                "controlPlaneRef": {"apiGroup": "controlplane.cluster.x-k8s.io", "kind": "KubeadmControlPlane", "name": "c2-cp"}
            }
        }));
        assert_eq!(
            cluster.class(),
            Some(ClassName {
                name: "docker-ferrol-1-27-v2".into(),
                namespace: "stacks".into()
            })
        );
        assert_eq!(
            cluster.spec.control_plane_ref.unwrap().api_group.as_deref(),
            Some("controlplane.cluster.x-k8s.io")
        );
    }

    #[test]
    fn a_cluster_without_topology_has_no_class() {
        let cluster = parse(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"name": "legacy", "namespace": "team"}, "spec": {}
        }));
        assert_eq!(cluster.class(), None);
        let empty = parse(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"name": "x", "namespace": "team"}, "spec": {"topology": {"class": ""}}
        }));
        assert_eq!(empty.class(), None);
    }
}
