//! The few Cluster API objects the operator reads, as tolerant views.
//!
//! The `Cluster` view understands both `v1beta1` (`spec.topology.class`, optional `classNamespace`) and
//! `v1beta2` (`spec.topology.classRef {name, namespace}`) and both reference shapes (`apiVersion` or `apiGroup`).
//! Fields the operator does not need are ignored, so newer Cluster API releases do not break parsing.
//!
//! Which version Clusters are read in is not fixed by the type: Cluster API 1.11 stores `v1beta2` and will stop
//! serving `v1beta1`, older releases serve `v1beta1` only. So `Cluster` is a [`Resource`] whose dynamic type is
//! the [`ApiResource`] of the version chosen at start-up ([`read_version`] over what the API server serves),
//! and every `Api<Cluster>` is made with it (`Api::namespaced_with`, `Api::all_with`).

use std::{borrow::Cow, sync::Arc};

use kube::core::{ApiResource, DynamicResourceScope, ObjectMeta, Resource, TypeMeta};
use serde::{Deserialize, Serialize};

/// The Cluster API group.
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";
/// Label that marks objects a `--watch-filter` operator instance handles.
pub const WATCH_FILTER_LABEL: &str = "cluster.x-k8s.io/watch-filter";
/// Annotation that pauses reconciliation of an object.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";
/// Annotation that holds `clusterctl move` back (any value) until the object's controller has stopped acting
/// on it: Cluster API's move contract asks providers to set it on what cannot pause at once and to remove it
/// once the object is paused.
pub const BLOCK_MOVE_ANNOTATION: &str = "clusterctl.cluster.x-k8s.io/block-move";
/// Annotation `clusterctl move` sets on each object it deletes from the source after copying it to the target.
pub const DELETE_FOR_MOVE_ANNOTATION: &str = "clusterctl.cluster.x-k8s.io/delete-for-move";

/// The versions of `Cluster` the view is written for, newest first.
pub const CLUSTER_VERSIONS: [&str; 2] = ["v1beta2", "v1beta1"];
/// The version Clusters are read in when the API server does not say which it serves (Cluster API is not
/// installed yet, or discovery failed): the one every Cluster API release so far serves.
pub const FALLBACK_CLUSTER_VERSION: &str = "v1beta1";

/// The version to read Clusters in, given the versions the API server serves them in (`served`, its
/// preferred version first, as discovery lists them):
///
/// - the newest the view is written for ([`CLUSTER_VERSIONS`]): `v1beta2` on Cluster API 1.11 and later,
///   `v1beta1` before;
/// - when it serves neither (a Cluster API much newer or much older than this operator), its preferred one:
///   the view is tolerant, and asking for a version that is not served would read as "no Clusters at all";
/// - when it serves none (the group or the kind is not there), [`FALLBACK_CLUSTER_VERSION`].
pub fn read_version(served: &[String]) -> &str {
    CLUSTER_VERSIONS
        .into_iter()
        .find(|known| served.iter().any(|v| v == known))
        .or_else(|| served.first().map(String::as_str))
        .unwrap_or(FALLBACK_CLUSTER_VERSION)
}

/// A Cluster API `Cluster`, the parts the operator reads. A [`Resource`] of any Cluster API version: its
/// dynamic type is the [`ApiResource`] of the version it is read in ([`Cluster::resource`]).
///
/// A Cluster read from JSON (the API server, a watch, an admission review) also keeps the whole object as it
/// came, in [`Cluster::object`]: values templates see every field of the Cluster, and a Cluster from the watch
/// cache can serve them without another read. Only what the typed view names is written back out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "serde_json::Value")]
pub struct Cluster {
    /// `apiVersion` and `kind`, as the object came (kept so that a Cluster made from a manifest, in tests,
    /// is created in the version the manifest names).
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub types: Option<TypeMeta>,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ClusterSpec,
    /// The whole object as read, without `metadata.managedFields` ([`remove_managed_fields`]); `None` for a
    /// Cluster built in code.
    #[serde(skip)]
    pub object: Option<WholeObject>,
}

/// A Cluster's whole object as it was read, kept as its JSON text deflated against the first Cluster this
/// process read ([`crate::deflated`]): the Clusters of a site are alike (one class, one network, the same
/// conditions), so each keeps about a tenth of its text, where a parsed tree takes three times the text. Only a
/// values template, a preflight and the fleet status's count of moves read it, and inflate it when they do.
#[derive(Clone, PartialEq, Eq)]
pub struct WholeObject(Arc<[u8]>);

/// The sample every Cluster's object is deflated against: the first one kept. Deflate is deterministic, so
/// two Clusters' equal objects are equal bytes.
static CLUSTER_SAMPLE: std::sync::OnceLock<crate::deflated::Dictionary> = std::sync::OnceLock::new();

impl WholeObject {
    /// Keeps `object`.
    pub fn of(object: &serde_json::Value) -> Self {
        // A `Value` always serializes (its keys are strings).
        let text = serde_json::to_vec(object).unwrap_or_default();
        let sample = CLUSTER_SAMPLE.get_or_init(|| crate::deflated::Dictionary::from_sample(&text));
        WholeObject(crate::deflated::deflate(&text, Some(sample)).into())
    }

    /// The object's JSON text.
    fn text(&self) -> Vec<u8> {
        // Kept by `of` against the one sample: it always inflates.
        crate::deflated::inflate(&self.0, CLUSTER_SAMPLE.get()).unwrap_or_default()
    }

    /// The object, parsed.
    pub fn value(&self) -> serde_json::Value {
        // The text is a `Value` serialized: it always parses.
        serde_json::from_slice(&self.text()).unwrap_or_default()
    }

    /// The object with only its name, namespace and `spec.topology`, what a class move reads: the rest of
    /// the text (Cluster API's status, most of it) is skipped, not parsed into a tree.
    pub fn topology_view(&self) -> serde_json::Value {
        #[derive(Deserialize)]
        struct View {
            #[serde(default)]
            metadata: NameView,
            #[serde(default)]
            spec: SpecView,
        }
        #[derive(Default, Deserialize, Serialize)]
        struct NameView {
            #[serde(default, skip_serializing_if = "Option::is_none")]
            name: Option<String>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            namespace: Option<String>,
        }
        #[derive(Default, Deserialize)]
        struct SpecView {
            #[serde(default)]
            topology: Option<serde_json::Value>,
        }
        let Ok(view) = serde_json::from_slice::<View>(&self.text()) else {
            return serde_json::Value::Null;
        };
        let mut spec = serde_json::Map::new();
        if let Some(topology) = view.spec.topology {
            spec.insert("topology".to_owned(), topology);
        }
        serde_json::json!({"metadata": view.metadata, "spec": spec})
    }
}

impl std::fmt::Debug for WholeObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WholeObject({} bytes deflated)", self.0.len())
    }
}

/// Leaves `metadata.managedFields` out of `object`: the API server's record of which manager owns which field,
/// not the object's state. It holds timestamps that change with every write by any controller and is often
/// larger than the rest of the object; neither the operator nor a values template reads it.
pub fn remove_managed_fields(object: &mut serde_json::Value) {
    if let Some(metadata) = object
        .get_mut("metadata")
        .and_then(serde_json::Value::as_object_mut)
    {
        metadata.remove("managedFields");
    }
}

/// The typed parts of a [`Cluster`], read from the same JSON as the whole.
#[derive(Deserialize)]
struct ClusterParts {
    #[serde(flatten, default)]
    types: Option<TypeMeta>,
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: ClusterSpec,
}

impl TryFrom<serde_json::Value> for Cluster {
    type Error = serde_json::Error;

    fn try_from(mut object: serde_json::Value) -> Result<Self, Self::Error> {
        remove_managed_fields(&mut object);
        let parts = ClusterParts::deserialize(&object)?;
        Ok(Cluster {
            types: parts.types,
            metadata: parts.metadata,
            spec: parts.spec,
            object: Some(WholeObject::of(&object)),
        })
    }
}

impl Cluster {
    /// The API resource of Clusters in `version` (`v1beta1`, `v1beta2`).
    pub fn resource(version: &str) -> ApiResource {
        ApiResource {
            group: CAPI_GROUP.to_owned(),
            version: version.to_owned(),
            api_version: format!("{CAPI_GROUP}/{version}"),
            kind: "Cluster".to_owned(),
            plural: "clusters".to_owned(),
        }
    }

    /// The API resource of `v1beta1` Clusters ([`FALLBACK_CLUSTER_VERSION`]).
    pub fn v1beta1_resource() -> ApiResource {
        Cluster::resource(FALLBACK_CLUSTER_VERSION)
    }
}

impl Resource for Cluster {
    type DynamicType = ApiResource;
    // Namespaced; the dynamic scope is what lets `Api::namespaced_with` build an `Api<Cluster>` of a version
    // chosen at run time.
    type Scope = DynamicResourceScope;

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The parts of a Cluster API `Cluster`'s spec the operator reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
    /// `spec.paused`: Cluster API's controllers (and this operator) leave the Cluster alone; `clusterctl
    /// move` sets it for the time of a move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
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
    /// The whole object: as read, or, for a Cluster built in code, its typed view.
    pub fn whole_value(&self) -> serde_json::Value {
        self.object
            .as_ref()
            .map(WholeObject::value)
            .unwrap_or_else(|| serde_json::to_value(self).unwrap_or_default())
    }

    /// Whether the Cluster is paused, by `spec.paused` (as `clusterctl move` pauses it) or by the
    /// `cluster.x-k8s.io/paused` annotation.
    pub fn is_paused(&self) -> bool {
        self.spec.paused == Some(true)
            || self
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(PAUSED_ANNOTATION))
    }

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
    fn keeps_the_whole_object_as_read_without_managed_fields() {
        let read = serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": "team", "managedFields": [{"manager": "capi"}]},
            "spec": {"topology": {"classRef": {"name": "docker-ferrol-1-27-v1"}, "version": "v1.27.3",
                                  "variables": [{"name": "flavor", "value": {"cpus": 4, "zones": ["a", "b"]}}]}},
            "status": {"conditions": [{"type": "Available", "status": "True"}]}
        });
        let cluster = parse(read.clone());
        let mut expected = read;
        expected["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        assert_eq!(cluster.object.as_ref().map(WholeObject::value), Some(expected));
        assert_eq!(
            parse(serde_json::json!({})).object.map(|o| o.value()),
            Some(serde_json::json!({}))
        );
        assert_eq!(
            Cluster::default().object,
            None,
            "a Cluster built in code has none"
        );
        assert_eq!(
            cluster.object.unwrap().topology_view(),
            serde_json::json!({
                "metadata": {"name": "c1", "namespace": "team"},
                "spec": {"topology": {"classRef": {"name": "docker-ferrol-1-27-v1"}, "version": "v1.27.3",
                                      "variables": [{"name": "flavor", "value": {"cpus": 4, "zones": ["a", "b"]}}]}}
            }),
            "a move's view: name, namespace and the topology"
        );
        assert_eq!(
            parse(serde_json::json!({"metadata": {"name": "bare"}}))
                .object
                .unwrap()
                .topology_view(),
            serde_json::json!({"metadata": {"name": "bare"}, "spec": {}})
        );
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

    fn served(versions: &[&str]) -> Vec<String> {
        versions.iter().map(|v| (*v).to_owned()).collect()
    }

    #[test]
    fn clusters_are_read_in_the_newest_version_served_that_the_view_knows() {
        // Cluster API 1.11+: both served, v1beta2 preferred (and stored).
        assert_eq!(read_version(&served(&["v1beta2", "v1beta1"])), "v1beta2");
        // Whatever the server prefers: v1beta2 is read when it is served at all.
        assert_eq!(read_version(&served(&["v1beta1", "v1beta2"])), "v1beta2");
        // After v1beta1 is removed (announced for 2027).
        assert_eq!(read_version(&served(&["v1beta2"])), "v1beta2");
        // Cluster API 1.10 and older.
        assert_eq!(read_version(&served(&["v1beta1", "v1alpha4"])), "v1beta1");
        // A version the view is not written for beside a known one: the known one.
        assert_eq!(read_version(&served(&["v1", "v1beta2"])), "v1beta2");
        // Neither known version: the server's preferred one, which at least is served.
        assert_eq!(read_version(&served(&["v1", "v1alpha9"])), "v1");
        // Nothing served (no Cluster API, or discovery failed): v1beta1.
        assert_eq!(read_version(&[]), "v1beta1");
    }

    #[test]
    fn the_resource_of_a_version_names_clusters_in_it() {
        let resource = Cluster::resource("v1beta2");
        assert_eq!(Cluster::api_version(&resource), "cluster.x-k8s.io/v1beta2");
        assert_eq!(Cluster::kind(&resource), "Cluster");
        assert_eq!(
            Cluster::url_path(&resource, Some("team")),
            "/apis/cluster.x-k8s.io/v1beta2/namespaces/team/clusters"
        );
        assert_eq!(
            Cluster::v1beta1_resource().api_version,
            "cluster.x-k8s.io/v1beta1"
        );
        let cluster = parse(serde_json::json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": "c1", "namespace": "team", "uid": "u1"}, "spec": {}
        }));
        let reference = cluster.object_ref(&resource);
        assert_eq!(
            (reference.api_version.as_deref(), reference.kind.as_deref()),
            (Some("cluster.x-k8s.io/v1beta2"), Some("Cluster"))
        );
        // A manifest's apiVersion and kind are kept, so a Cluster created from one is created as written.
        assert_eq!(
            serde_json::to_value(&cluster).unwrap()["apiVersion"],
            "cluster.x-k8s.io/v1beta2"
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
