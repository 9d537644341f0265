//! Shards (issue 18, first step) on a real API server: two replicas in one namespace, the default shard and
//! shard `a`. Each makes and keeps the addons of its own Clusters only: the ClusterAddon carries its Cluster's
//! shard label, shard `a`'s watches select only what is labelled `a`, and with `a` stopped the default shard
//! leaves `a`'s addons alone (a deleted addon object stays deleted) until `a` is back. A Cluster relabelled
//! from `a` to the default shard is taken over: its ClusterAddon is relabelled and the default shard upgrades it.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod support;

use std::{sync::Arc, time::Duration};

use cso_api::{ClusterAddon, shard::SHARD_LABEL, shard::Shard};
use cso_release::source::local::LocalSource;
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::json;
use support::*;

const V1: &str = "docker-ferrol-1-27-v1";
const V2: &str = "docker-ferrol-1-27-v2";

/// Creates Cluster `name` of class `class`, labelled for `shard` (`None`: the default shard).
async fn create_sharded_cluster(
    client: &Client,
    namespace: &str,
    name: &str,
    class: &str,
    shard: Option<&str>,
) {
    let labels = shard.map(|s| json!({SHARD_LABEL: s})).unwrap_or(json!({}));
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "topology": {"class": class, "version": "v1.27.3"},
            "controlPlaneEndpoint": {"host": format!("{name}.example.test"), "port": 6443},
        },
    }))
    .unwrap();
    dynamic(client, namespace, &capi("Cluster"))
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
}

/// An operator in this process for `shard`, on the local releases in `release_dir`.
async fn replica(
    client: &Client,
    namespace: &str,
    release_dir: &std::path::Path,
    shard: Shard,
) -> RunningOperator {
    let source = Arc::new(LocalSource::new(release_dir.join("cluster-stacks")));
    RunningOperator::start(client, namespace, release_dir, source, move |settings| {
        settings.shard = shard
    })
    .await
}

fn ready_on(addon: &ClusterAddon, class: &str) -> bool {
    addon.spec.cluster_stack == class && addon.status.as_ref().is_some_and(|s| s.ready)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shard_keeps_its_own_and_a_moved_cluster_is_taken_over() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "shards").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    local_releases(dir.path(), &[V1, V2]);
    let default_shard = replica(&client, &ns, dir.path(), Shard::Default).await;
    let shard_a = replica(&client, &ns, dir.path(), Shard::Named("a".into())).await;
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1", "v2"])).await;
    ready_release(&client, &ns, V1).await;
    ready_release(&client, &ns, V2).await;

    // One workload cluster each: their addons carry their own Cluster's endpoint.
    let (plain_plane, a_plane) = (
        workload_plane("shards-plain").await,
        workload_plane("shards-a").await,
    );
    for (cluster, workload, shard) in [("plain", &plain_plane, None), ("in-a", &a_plane, Some("a"))] {
        cso_testenv::kubeconfig_secret(&client, &ns, cluster, workload.kubeconfig_yaml())
            .await
            .unwrap();
        create_sharded_cluster(&client, &ns, cluster, V1, shard).await;
    }
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    let plain = addon_where(&addons, "plain", "plain ready", CONVERGE, |a| ready_on(a, V1)).await;
    let in_a = addon_where(&addons, "in-a", "in-a ready", CONVERGE, |a| ready_on(a, V1)).await;
    assert_eq!(plain.labels().get(SHARD_LABEL), None);
    assert_eq!(
        in_a.labels().get(SHARD_LABEL).map(String::as_str),
        Some("a"),
        "the ClusterAddon carries its Cluster's shard"
    );

    // Shard `a` stops: the default shard leaves its addons alone, also when one of their objects goes.
    shard_a.stop().await;
    let a_deployments: Api<Deployment> = Api::namespaced(a_plane.client().await.unwrap(), "kube-system");
    a_deployments
        .delete("metrics-server", &DeleteParams::default())
        .await
        .unwrap();
    let plain_deployments: Api<Deployment> =
        Api::namespaced(plain_plane.client().await.unwrap(), "kube-system");
    plain_deployments
        .delete("metrics-server", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the default shard puts back its own", CONVERGE, || async {
        plain_deployments
            .get_opt("metrics-server")
            .await
            .unwrap()
            .map(drop)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        a_deployments.get_opt("metrics-server").await.unwrap().is_none(),
        "the default shard does not touch shard a's addons"
    );

    // Back: shard `a` puts its object back.
    let shard_a = replica(&client, &ns, dir.path(), Shard::Named("a".into())).await;
    eventually("shard a puts back its own", CONVERGE, || async {
        a_deployments.get_opt("metrics-server").await.unwrap().map(drop)
    })
    .await;

    // The Cluster moves to the default shard (its label goes) and to v2: the default shard takes the
    // ClusterAddon over and upgrades it.
    dynamic(&client, &ns, &capi("Cluster"))
        .patch(
            "in-a",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {SHARD_LABEL: null}}, "spec": {"topology": {"class": V2}}}),
            ),
        )
        .await
        .unwrap();
    let moved = addon_where(
        &addons,
        "in-a",
        "in-a upgraded by the default shard",
        CONVERGE,
        |a| ready_on(a, V2) && a.labels().get(SHARD_LABEL).is_none(),
    )
    .await;
    assert_eq!(moved.spec.version, "v2");
    shard_a.stop().await;
    default_shard.stop().await;
}
