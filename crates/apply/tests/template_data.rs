//! The data values templates see, read from a real API server: the whole Cluster (every field, not the
//! operator's typed view; the object that view was read from, or a fresh read for a Cluster built in code)
//! with its ControlPlane and InfraCluster, a missing reference named in the error,
//! and `ClusterDiscovery::get_object` for both reference shapes (`apiVersion`, and `apiGroup` read in the
//! version the server prefers).
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::time::Duration;

use cso_api::capi::Cluster;
use cso_apply::{
    ClusterDiscovery, DiscoveryError,
    discovery::{ApiRef, GetObjectError},
    template_data::{TemplateDataError, template_data},
};
use cso_render::{Helm, ValuesTemplater};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Client,
    api::{DynamicObject, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
};
use serde_json::{Value, json};

async fn setup(prefix: &str) -> (Client, String) {
    let client = cso_testenv::shared_management().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, prefix).await.unwrap();
    (client, ns)
}

/// Creates `object` (any kind the server serves) in `namespace`; returns the dynamic API it lives in.
async fn create(client: &Client, namespace: &str, object: Value) -> Api<DynamicObject> {
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    let gvk = GroupVersionKind::try_from(object.types.as_ref().unwrap()).unwrap();
    let (resource, _) = kube::discovery::pinned_kind(client, &gvk).await.unwrap();
    let api = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource);
    api.create(&PostParams::default(), &object).await.unwrap();
    api
}

/// A Cluster with fields the typed view does not keep (labels, clusterNetwork, topology variables, status)
/// and both references, with the objects they name.
async fn cluster_with_references(client: &Client, ns: &str) -> (Api<DynamicObject>, Cluster) {
    create(
        client,
        ns,
        json!({"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerCluster",
               "metadata": {"name": "c1"},
               "spec": {"controlPlaneEndpoint": {"host": "172.18.0.5", "port": 6443}}}),
    )
    .await;
    create(
        client,
        ns,
        json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "KubeadmControlPlane",
               "metadata": {"name": "c1-cp"},
               "spec": {"version": "v1.27.3", "replicas": 3, "kubeadmConfigSpec": {},
                        "machineTemplate": {"infrastructureRef": {
                            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                            "kind": "DockerMachineTemplate", "name": "c1-cp"}}}}),
    )
    .await;
    let clusters = create(
        client,
        ns,
        json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
               "metadata": {"name": "c1", "labels": {"team": "a"}},
               "spec": {
                   "clusterNetwork": {"pods": {"cidrBlocks": ["10.244.0.0/16", "fd10:244::/104"]},
                                      "serviceDomain": "c1.local"},
                   "topology": {"class": "docker-ferrol-1-27-v1", "version": "v1.27.3",
                                "variables": [{"name": "region", "value": "eu-north"}]},
                   "controlPlaneEndpoint": {"host": "10.0.0.1", "port": 6443},
                   "controlPlaneRef": {"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
                                       "kind": "KubeadmControlPlane", "name": "c1-cp"},
                   "infrastructureRef": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                                         "kind": "DockerCluster", "name": "c1"}}}),
    )
    .await;
    clusters
        .patch_status(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Provisioned"}})),
        )
        .await
        .unwrap();
    (clusters, read_cluster(client, ns).await)
}

/// The Cluster `c1` as the controllers hold it: the typed view, and the object it was read from.
async fn read_cluster(client: &Client, ns: &str) -> Cluster {
    Api::<Cluster>::namespaced_with(client.clone(), ns, &Cluster::v1beta1_resource())
        .get("c1")
        .await
        .unwrap()
}

/// The Cluster `c1` as built in code: only which Cluster.
fn named_cluster(ns: &str) -> Cluster {
    let mut cluster = Cluster::default();
    cluster.metadata.name = Some("c1".into());
    cluster.metadata.namespace = Some(ns.into());
    cluster
}

#[tokio::test]
async fn templates_see_the_whole_cluster_and_its_references() {
    let (client, ns) = setup("template-data").await;
    let (_, cluster) = cluster_with_references(&client, &ns).await;
    let typed = serde_json::to_value(&cluster).unwrap();
    assert!(
        typed["spec"].get("clusterNetwork").is_none(),
        "the typed view drops it, so the data must come from elsewhere"
    );

    let discovery = ClusterDiscovery::new(client.clone());
    let data = template_data(&discovery, &cluster).await.unwrap();
    // A Cluster built in code (no object behind it) is read from the API server: the same data.
    assert_eq!(
        template_data(&discovery, &named_cluster(&ns)).await.unwrap(),
        data
    );
    let full = &data["Cluster"];
    assert_eq!(full["apiVersion"], "cluster.x-k8s.io/v1beta1");
    assert_eq!(full["kind"], "Cluster");
    assert_eq!(full["metadata"]["name"], "c1");
    assert_eq!(full["metadata"]["namespace"], ns.as_str());
    assert_eq!(full["metadata"]["labels"], json!({"team": "a"}));
    assert!(full["metadata"].get("uid").is_some());
    assert!(
        full["metadata"].get("managedFields").is_none(),
        "left out: {full}"
    );
    assert_eq!(
        full["spec"]["clusterNetwork"]["pods"]["cidrBlocks"],
        json!(["10.244.0.0/16", "fd10:244::/104"])
    );
    assert_eq!(full["spec"]["clusterNetwork"]["serviceDomain"], "c1.local");
    assert_eq!(
        full["spec"]["topology"]["variables"],
        json!([{"name": "region", "value": "eu-north"}])
    );
    assert_eq!(full["status"]["phase"], "Provisioned");
    assert_eq!(data["ControlPlane"]["kind"], "KubeadmControlPlane");
    assert_eq!(data["ControlPlane"]["spec"]["replicas"], 3);
    assert_eq!(
        data["InfraCluster"]["spec"]["controlPlaneEndpoint"]["host"],
        "172.18.0.5"
    );
    assert!(data["InfraCluster"]["metadata"].get("managedFields").is_none());

    // The expressions real stacks use render from it.
    let helm = Helm::new(
        cso_testenv::Tools::discover().unwrap().helm.unwrap(),
        Duration::from_secs(60),
    )
    .unwrap();
    let template = "values: |\n  name: {{ .Cluster.metadata.name }}\n  \
                    pods: {{ index .Cluster.spec.clusterNetwork.pods.cidrBlocks 0 }}\n  \
                    port: {{ .Cluster.spec.controlPlaneEndpoint.port }}\n  \
                    region: {{ (index .Cluster.spec.topology.variables 0).value }}\n  \
                    replicas: {{ .ControlPlane.spec.replicas }}\n  \
                    infra: {{ .InfraCluster.spec.controlPlaneEndpoint.host }}\n";
    let values = ValuesTemplater::new(helm)
        .unwrap()
        .render(std::path::Path::new("overwrite.yaml"), template, &data)
        .await
        .unwrap();
    assert_eq!(
        values,
        "name: c1\npods: 10.244.0.0/16\nport: 6443\nregion: eu-north\nreplicas: 3\ninfra: 172.18.0.5\n"
    );
}

#[tokio::test]
async fn a_missing_reference_or_cluster_is_named() {
    let (client, ns) = setup("template-missing").await;
    let (clusters, before) = cluster_with_references(&client, &ns).await;
    let discovery = ClusterDiscovery::new(client.clone());

    // The references are those of the Cluster as given (the watch cache's copy in the controllers), and the
    // objects they name are read live.
    clusters
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"controlPlaneRef": {"name": "absent"}}})),
        )
        .await
        .unwrap();
    let as_given = template_data(&discovery, &before).await.unwrap();
    assert_eq!(as_given["Cluster"]["spec"]["controlPlaneRef"]["name"], "c1-cp");
    assert_eq!(as_given["ControlPlane"]["metadata"]["name"], "c1-cp");
    let cluster = read_cluster(&client, &ns).await;
    let err = template_data(&discovery, &cluster).await.unwrap_err();
    match &err {
        TemplateDataError::Missing {
            kind,
            namespace,
            name,
            ..
        } => assert_eq!(
            (kind.as_str(), namespace.as_str(), name.as_str()),
            ("KubeadmControlPlane", ns.as_str(), "absent")
        ),
        other => panic!("expected Missing, got {other:?}"),
    }
    assert!(
        err.to_string().contains(&format!(
            "control plane (KubeadmControlPlane {ns}/absent) was not found"
        )),
        "{err}"
    );

    // A reference to a kind the cluster does not serve is a read error that says so.
    clusters
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"controlPlaneRef": {
                "apiVersion": "controlplane.example.test/v1", "kind": "NoSuchControlPlane", "name": "c1"}}})),
        )
        .await
        .unwrap();
    let cluster = read_cluster(&client, &ns).await;
    let err = template_data(&discovery, &cluster).await.unwrap_err();
    assert!(
        matches!(&err, TemplateDataError::Read { .. })
            && err.to_string().contains("does not serve NoSuchControlPlane"),
        "{err}"
    );

    // A Cluster with no object behind it is read, and one that is gone is named.
    clusters.delete("c1", &Default::default()).await.unwrap();
    let err = template_data(&discovery, &named_cluster(&ns)).await.unwrap_err();
    assert!(
        matches!(&err, TemplateDataError::Missing { kind, name, .. } if kind == "Cluster" && name == "c1"),
        "{err:?}"
    );
}

/// A CRD of group `preferred.cso.test` served in `v1beta1` (stored) and `v1beta2`, without conversion.
fn two_version_crd() -> CustomResourceDefinition {
    let version = |name: &str, storage: bool| {
        json!({"name": name, "served": true, "storage": storage,
               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}})
    };
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.preferred.cso.test"},
        "spec": {"group": "preferred.cso.test", "scope": "Namespaced",
                 "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                 "versions": [version("v1beta1", true), version("v1beta2", false)]},
    }))
    .unwrap()
}

/// A CRD of kind `Gadget` in the same group as [`two_version_crd`], served in `v1beta1` only: the group
/// prefers `v1beta2` (the Widget's newest), as `infrastructure.cluster.x-k8s.io` prefers CAPD's `v1beta2`
/// while CAPO's `OpenStackCluster` is served in `v1beta1` only.
fn older_kind_of_the_group_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.preferred.cso.test"},
        "spec": {"group": "preferred.cso.test", "scope": "Namespaced",
                 "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
                 "versions": [{"name": "v1beta1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": true}}}]},
    }))
    .unwrap()
}

#[tokio::test]
async fn a_kind_named_by_group_is_read_in_the_newest_version_that_serves_it() {
    let (client, ns) = setup("get-object-shared-group").await;
    cso_testenv::crds::install(&client, &[two_version_crd(), older_kind_of_the_group_crd()])
        .await
        .unwrap();
    create(
        &client,
        &ns,
        json!({"apiVersion": "preferred.cso.test/v1beta1", "kind": "Gadget",
               "metadata": {"name": "g1"}, "spec": {"size": 5}}),
    )
    .await;
    let discovery = ClusterDiscovery::new(client.clone());
    assert_eq!(
        discovery
            .preferred_version("preferred.cso.test", "Gadget")
            .await
            .unwrap(),
        "v1beta2"
    );
    // Twice: the second read comes from what the first found.
    for _ in 0..2 {
        let gadget = discovery
            .get_object(ApiRef::Group("preferred.cso.test"), "Gadget", Some(&ns), "g1")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            gadget.types.as_ref().unwrap().api_version,
            "preferred.cso.test/v1beta1"
        );
        assert_eq!(gadget.data["spec"]["size"], 5);
    }
    // The group's other kind is still read in the preferred version.
    assert_eq!(
        discovery
            .version_of_kind("preferred.cso.test", "Widget")
            .await
            .unwrap(),
        "v1beta2"
    );
    // A kind no version of the group serves is still UnknownKind.
    let err = discovery
        .get_object(ApiRef::Group("preferred.cso.test"), "Gizmo", Some(&ns), "g1")
        .await
        .unwrap_err();
    assert!(
        matches!(err, GetObjectError::Discovery(DiscoveryError::UnknownKind(_))),
        "{err:?}"
    );
}

#[tokio::test]
async fn get_object_reads_by_api_version_or_by_group_in_the_preferred_version() {
    let (client, ns) = setup("get-object").await;
    cso_testenv::crds::install(&client, &[two_version_crd()])
        .await
        .unwrap();
    create(
        &client,
        &ns,
        json!({"apiVersion": "preferred.cso.test/v1beta1", "kind": "Widget",
               "metadata": {"name": "w1"}, "spec": {"size": 3}}),
    )
    .await;
    let discovery = ClusterDiscovery::new(client.clone());

    // By group: the version the server prefers, the newer one, not the one the object was written in.
    assert_eq!(
        discovery
            .preferred_version("preferred.cso.test", "Widget")
            .await
            .unwrap(),
        "v1beta2"
    );
    let widget = discovery
        .get_object(ApiRef::Group("preferred.cso.test"), "Widget", Some(&ns), "w1")
        .await
        .unwrap()
        .unwrap();
    let types = widget.types.as_ref().unwrap();
    assert_eq!(types.api_version, "preferred.cso.test/v1beta2");
    assert_eq!(widget.data["spec"]["size"], 3);
    // By apiVersion: that version.
    let widget = discovery
        .get_object(
            ApiRef::Version("preferred.cso.test/v1beta1"),
            "Widget",
            Some(&ns),
            "w1",
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        widget.types.as_ref().unwrap().api_version,
        "preferred.cso.test/v1beta1"
    );

    // The core group, a cluster-scoped kind (the namespace is ignored), and a missing object.
    let namespace = discovery
        .get_object(ApiRef::Version("v1"), "Namespace", Some("ignored"), &ns)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(namespace.metadata.name.as_deref(), Some(ns.as_str()));
    assert!(
        discovery
            .get_object(ApiRef::Group(""), "ConfigMap", Some(&ns), "absent")
            .await
            .unwrap()
            .is_none()
    );
    // Cluster API's group on this server (Cluster API 1.10) prefers v1beta1.
    assert_eq!(
        discovery
            .preferred_version("cluster.x-k8s.io", "Cluster")
            .await
            .unwrap(),
        "v1beta1"
    );

    // A group or a kind the cluster does not serve: UnknownKind, so callers can wait for a CRD.
    for api in [
        ApiRef::Group("nothing.cso.test"),
        ApiRef::Version("nothing.cso.test/v1"),
        ApiRef::Version("preferred.cso.test/v9"),
    ] {
        let err = discovery
            .get_object(api, "Widget", Some(&ns), "w1")
            .await
            .unwrap_err();
        assert!(
            matches!(err, GetObjectError::Discovery(DiscoveryError::UnknownKind(_))),
            "{api:?}: {err:?}"
        );
    }
}
