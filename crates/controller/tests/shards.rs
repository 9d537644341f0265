//! Shards (issue 18, first step) on a real API server: two replicas in one namespace, the default shard and
//! shard `a`. Each makes and keeps the addons of its own Clusters only: the ClusterAddon carries its Cluster's
//! shard label, shard `a`'s watches select only what is labelled `a`, and with `a` stopped the default shard
//! leaves `a`'s addons alone (a deleted addon object stays deleted) until `a` is back. A Cluster relabelled
//! from `a` to the default shard is taken over: its ClusterAddon is relabelled and the default shard upgrades it.
//! Shards whose Lease no replica holds are reported by the default shard after the grace period (a gauge, and
//! the condition `ShardReconciling` on their ClusterAddons), and no longer once a replica is back.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod support;

use std::{sync::Arc, time::Duration};

use cso_api::{
    ClusterAddon,
    conditions::{ConditionStatus, ConditionsExt, READY},
    names::{condition, reason},
    shard::{SHARD_LABEL, Shard},
};
use cso_release::source::local::LocalSource;
use k8s_openapi::api::{apps::v1::Deployment, coordination::v1::Lease};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
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
    create_labelled_cluster(client, namespace, name, class, labels).await;
}

/// An operator in this process for `shard`, on the local releases in `release_dir`; shards' Leases in
/// `namespace`, reported after 1 s without a holder. Its metrics, to read.
async fn replica(
    client: &Client,
    namespace: &str,
    release_dir: &std::path::Path,
    shard: Shard,
) -> (RunningOperator, Arc<cso_controller::Metrics>) {
    let source = Arc::new(LocalSource::new(release_dir.join("cluster-stacks")));
    let lease_namespace = namespace.to_owned();
    let (operator, renderer) = operator(client, namespace, release_dir, source, move |settings| {
        settings.shard = shard;
        settings.shard_grace = Duration::from_secs(1);
        settings.lease_namespace = Some(lease_namespace);
    });
    let metrics = operator.metrics.clone();
    (RunningOperator::run(operator, renderer).await, metrics)
}

/// Shard `shard`'s Lease as a replica holding it writes it (the in-process replicas elect no leader).
async fn hold_lease(client: &Client, namespace: &str, shard: &str) {
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": Shard::Named(shard.into()).lease_name()},
        "spec": {"holderIdentity": format!("test-{shard}"), "leaseDurationSeconds": 3600,
                 "renewTime": k8s_openapi::jiff::Timestamp::now().to_string()},
    }))
    .unwrap();
    Api::<Lease>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
}

fn unattended(metrics: &cso_controller::Metrics, shard: &str) -> f64 {
    counter(
        &metrics.encode(),
        "cso_unattended_clusters",
        &[&format!("shard=\"{shard}\"")],
    )
}

fn shard_reconciling(addon: &ClusterAddon) -> Option<(ConditionStatus, Option<String>)> {
    addon
        .get_condition(condition::SHARD_RECONCILING)
        .map(|c| (c.status, c.reason.clone()))
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
    hold_lease(&client, &ns, "a").await;
    let (default_shard, metrics) = replica(&client, &ns, dir.path(), Shard::Default).await;
    let (shard_a, _) = replica(&client, &ns, dir.path(), Shard::Named("a".into())).await;
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

    // A Cluster of shard `c`, which has no replica: the default shard makes nothing for it and reports it.
    create_sharded_cluster(&client, &ns, "in-c", V1, Some("c")).await;
    eventually("shard c reported", CONVERGE, || async {
        (unattended(&metrics, "c") == 1.0).then_some(())
    })
    .await;
    assert!(addons.get_opt("cluster-addon-in-c").await.unwrap().is_none());
    assert_eq!(unattended(&metrics, "a"), 0.0, "a holds its Lease");

    // Shard `a` stops and its Lease goes: the default shard leaves its addons alone, also when one of their
    // objects goes, and reports them.
    shard_a.stop().await;
    Api::<Lease>::namespaced(client.clone(), &ns)
        .delete(&Shard::Named("a".into()).lease_name(), &DeleteParams::default())
        .await
        .unwrap();
    let reported = addon_where(&addons, "in-a", "in-a reported as unattended", CONVERGE, |a| {
        shard_reconciling(a).is_some_and(|(status, _)| status == ConditionStatus::False)
    })
    .await;
    assert_eq!(
        shard_reconciling(&reported).unwrap().1.as_deref(),
        Some(reason::NO_SHARD_REPLICA)
    );
    assert!(
        !reported.is_condition_true(READY),
        "an unattended ClusterAddon is not Ready"
    );
    assert_eq!(unattended(&metrics, "a"), 1.0);
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

    // Back: shard `a` puts its object back, and it is no longer reported.
    hold_lease(&client, &ns, "a").await;
    let (shard_a, _) = replica(&client, &ns, dir.path(), Shard::Named("a".into())).await;
    eventually("shard a puts back its own", CONVERGE, || async {
        a_deployments.get_opt("metrics-server").await.unwrap().map(drop)
    })
    .await;
    addon_where(&addons, "in-a", "in-a reconciled by a again", CONVERGE, |a| {
        shard_reconciling(a).is_none() && a.is_condition_true(READY)
    })
    .await;
    eventually("shard a no longer reported", CONVERGE, || async {
        (unattended(&metrics, "a") == 0.0).then_some(())
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
