//! Our CRDs and the Cluster API CRDs on a real kube-apiserver: installed, Established, defaulted, validated.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use cso_api::{ClusterAddon, ClusterStack, ClusterStackRelease, capi::Cluster};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api,
    api::{DynamicObject, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use serde_json::json;

async fn client_and_namespace(prefix: &str) -> (kube::Client, String) {
    let client = cso_testenv::shared_management()
        .client()
        .await
        .expect("a client for the test control plane");
    let ns = cso_testenv::namespace(&client, prefix)
        .await
        .expect("a test namespace");
    (client, ns)
}

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("the test object has the type's shape")
}

#[tokio::test]
async fn our_crds_are_established_with_short_names() {
    let client = cso_testenv::shared_management().client().await.unwrap();
    let api: Api<CustomResourceDefinition> = Api::all(client);
    for (name, short) in [
        ("clusterstacks.clusterstack.x-k8s.io", "csk"),
        ("clusterstackreleases.clusterstack.x-k8s.io", "cskr"),
        ("clusteraddons.clusterstack.x-k8s.io", "caddon"),
        ("clusterstackrollouts.clusterstack.x-k8s.io", "csro"),
    ] {
        let crd = api.get(name).await.unwrap();
        let conditions = crd.status.unwrap().conditions.unwrap();
        assert!(
            conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True"),
            "{name}"
        );
        assert_eq!(crd.spec.names.short_names, Some(vec![short.to_owned()]));
    }
}

#[tokio::test]
async fn a_cluster_stack_with_only_required_fields_reads_back_with_defaults() {
    let (client, ns) = client_and_namespace("defaults").await;
    let api: Api<ClusterStack> = Api::namespaced(client, &ns);
    let stack: ClusterStack = object(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
        "metadata": {"name": "ferrol"},
        "spec": {"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27"}
    }));
    api.create(&PostParams::default(), &stack).await.unwrap();
    // Read it back raw, so that the defaults come from the API server and not from serde.
    let raw: serde_json::Value = Api::<DynamicObject>::namespaced_with(
        api.clone().into_client(),
        &ns,
        &ApiResource::erase::<ClusterStack>(&()),
    )
    .get("ferrol")
    .await
    .map(|o| serde_json::to_value(o).unwrap())
    .unwrap();
    assert_eq!(raw["spec"]["channel"], "stable");
    assert_eq!(raw["spec"]["autoSubscribe"], true);
    assert_eq!(raw["spec"]["noProvider"], false);
}

#[tokio::test]
async fn the_schema_rejects_bad_cluster_stacks() {
    let (client, ns) = client_and_namespace("rejects").await;
    let api: Api<DynamicObject> = Api::namespaced_with(client, &ns, &ApiResource::erase::<ClusterStack>(&()));
    let spec = |patch: serde_json::Value| {
        let mut spec = json!({"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27"});
        for (k, v) in patch.as_object().unwrap() {
            spec[k] = v.clone();
        }
        spec
    };
    for (case, bad_spec, field) in [
        (
            "kubernetes-version",
            spec(json!({"kubernetesVersion": "1.x"})),
            "spec.kubernetesVersion",
        ),
        ("channel", spec(json!({"channel": "beta"})), "spec.channel"),
        ("provider", spec(json!({"provider": ""})), "spec.provider"),
    ] {
        let obj: DynamicObject = object(json!({
            "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
            "metadata": {"name": case}, "spec": bad_spec
        }));
        let err = api.create(&PostParams::default(), &obj).await.expect_err(case);
        let kube::Error::Api(status) = err else {
            panic!("{case}: unexpected error {err}")
        };
        assert_eq!(status.code, 422, "{case}: {}", status.message);
        assert!(status.message.contains(field), "{case}: {}", status.message);
    }
}

#[tokio::test]
async fn release_and_addon_objects_round_trip_through_the_api_server() {
    let (client, ns) = client_and_namespace("roundtrip").await;
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), &ns);
    let release: ClusterStackRelease = object(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStackRelease",
        "metadata": {"name": "docker-ferrol-1-27-v0-sha-hipstsw"}, "spec": {}
    }));
    let created = releases.create(&PostParams::default(), &release).await.unwrap();
    assert_eq!(created.spec.provider_ref, None);

    let addons: Api<ClusterAddon> = Api::namespaced(client, &ns);
    let addon: ClusterAddon = object(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterAddon",
        "metadata": {"name": "cluster-addon-c1"},
        "spec": {"clusterRef": {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster", "name": "c1", "namespace": ns}}
    }));
    let created = addons.create(&PostParams::default(), &addon).await.unwrap();
    assert_eq!(created.spec.cluster_ref.name.as_deref(), Some("c1"));
    assert_eq!(created.spec.hook, "");
}

#[tokio::test]
async fn cluster_api_v1beta1_kinds_are_served() {
    let (client, ns) = client_and_namespace("capi").await;
    let gvk = GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta1", "ClusterClass");
    let classes: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::from_gvk_with_plural(&gvk, "clusterclasses"),
    );
    let class: DynamicObject = object(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "ClusterClass",
        "metadata": {"name": "docker-ferrol-1-27-v1"},
        "spec": {
            "controlPlane": {"ref": {"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "KubeadmControlPlaneTemplate", "name": "cp"}},
            "infrastructure": {"ref": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerClusterTemplate", "name": "infra"}}
        }
    }));
    classes.create(&PostParams::default(), &class).await.unwrap();

    let clusters: Api<Cluster> = Api::namespaced_with(client, &ns, &Cluster::v1beta1_resource());
    let cluster: Cluster = object(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"name": "c1"},
        "spec": {"topology": {"class": "docker-ferrol-1-27-v1", "version": "v1.27.3"}}
    }));
    let created = clusters.create(&PostParams::default(), &cluster).await.unwrap();
    assert_eq!(
        created.class().map(|c| c.name).as_deref(),
        Some("docker-ferrol-1-27-v1")
    );
    assert_eq!(created.topology_version(), Some("v1.27.3"));
}
