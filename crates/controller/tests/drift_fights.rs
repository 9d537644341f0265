//! Drift fights (issue 33) on real API servers with real helm: a second writer with its own field manager
//! keeps changing a field the addons set, and the operator puts it back with back-off (far fewer corrections
//! than writes), reports the fight on the ClusterAddon naming the manager and the field, leaves other objects
//! and another Cluster alone, and, once the writer stops, puts it back once and clears the report; a deletion
//! of the object well after that last correction, while its hold still lasts, is put back at once (no writer
//! answers so late: the fight is over). Replicas an
//! autoscaler sets through the `scale` subresource are left to it: no fight at all.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use cso_api::{
    ClusterAddon,
    conditions::ConditionsExt,
    names::{condition, event, reason},
};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Service};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
};
use serde_json::json;
use support::*;

const V1: &str = "docker-ferrol-1-27-v1";
/// Short, so that the longest hold (and the quiet window that ends a fight) is short.
const RESYNC: Duration = Duration::from_secs(20);

/// An operator on `V1` in its own namespace with a 20 s resync interval, and its metrics.
async fn operator_on_v1(
    client: &Client,
    ns: &str,
    dir: &std::path::Path,
) -> (RunningOperator, Arc<cso_controller::Metrics>) {
    local_releases(dir, &[V1]);
    let source = Arc::new(cso_release::source::local::LocalSource::new(
        dir.join("cluster-stacks"),
    ));
    let (operator, renderer) = support::operator(client, ns, dir, source, |settings| {
        settings.resync_interval = RESYNC;
    });
    let metrics = operator.metrics.clone();
    let running = RunningOperator::run(operator, renderer).await;
    create_stack(client, ns, "ferrol", ferrol_spec(&["v1"])).await;
    ready_release(client, ns, V1).await;
    (running, metrics)
}

/// Cluster `name` of `V1` whose workload cluster is `plane`, once its addons are ready.
async fn ready_cluster(
    client: &Client,
    ns: &str,
    name: &str,
    plane: &cso_testenv::ControlPlane,
) -> ClusterAddon {
    cso_testenv::kubeconfig_secret(client, ns, name, plane.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(client, ns, name, V1).await;
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), ns);
    addon_where(&addons, name, &format!("{name}'s addons ready"), CONVERGE, |a| {
        a.spec.cluster_stack == V1 && a.status.as_ref().is_some_and(|s| s.ready)
    })
    .await
}

fn corrections(metrics: &cso_controller::Metrics) -> f64 {
    counter(
        &metrics.encode(),
        "cso_objects_drift_corrected_total",
        &["target=\"workload\""],
    )
}

fn fights_gauge(metrics: &cso_controller::Metrics) -> f64 {
    metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix("cso_drift_fights ")?.parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_another_manager_keeps_changing_is_put_back_with_back_off_and_reported() {
    let client = cso_testenv::shared_management().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "fights").await.unwrap();
    let (fought, calm) = (workload_plane("fights-a").await, workload_plane("fights-b").await);
    let dir = tempfile::tempdir().unwrap();
    let (_operator, metrics) = operator_on_v1(&client, &ns, dir.path()).await;
    ready_cluster(&client, &ns, "fought", &fought).await;
    ready_cluster(&client, &ns, "calm", &calm).await;
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);

    let fought_deployments: Api<Deployment> = Api::namespaced(fought.client().await.unwrap(), "kube-system");
    let fought_services: Api<Service> = Api::namespaced(fought.client().await.unwrap(), "kube-system");
    let calm_deployments: Api<Deployment> = Api::namespaced(calm.client().await.unwrap(), "kube-system");
    let version = |d: Deployment| d.resource_version().unwrap();
    let calm_before = version(calm_deployments.get("metrics-server").await.unwrap());
    let service_before = fought_services
        .get("metrics-server")
        .await
        .unwrap()
        .resource_version();
    let corrected_before = corrections(&metrics);

    // The second writer: its own field manager, a label the addons set (`domain`), every 200 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicUsize::new(0));
    let writer = tokio::spawn({
        let (deployments, stop, writes) = (fought_deployments.clone(), stop.clone(), writes.clone());
        async move {
            let params = PatchParams {
                field_manager: Some("fighter".into()),
                ..PatchParams::default()
            };
            while !stop.load(Ordering::SeqCst) {
                let n = writes.load(Ordering::SeqCst);
                let label = json!({"metadata": {"labels": {"domain": format!("fighter-{n}")}}});
                deployments
                    .patch("metrics-server", &params, &Patch::Merge(&label))
                    .await
                    .unwrap();
                writes.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });

    // Reported, naming the object, the manager and the field.
    let reported = addon_where(&addons, "fought", "the fight reported", CONVERGE, |a| {
        a.get_condition(condition::DRIFT_SETTLED)
            .is_some_and(|c| c.reason.as_deref() == Some(reason::DRIFT_FIGHT))
    })
    .await;
    let message = reported
        .get_condition(condition::DRIFT_SETTLED)
        .unwrap()
        .message
        .clone()
        .unwrap();
    for part in [
        "Deployment.apps kube-system/metrics-server",
        "\"fighter\" (Update)",
        ".metadata.labels.domain",
        "put back 3 times",
    ] {
        assert!(message.contains(part), "{part:?} in {message:?}");
    }
    assert_eq!(fights_gauge(&metrics), 1.0, "one object in a fight");
    // The writer goes on for a while: the corrections back off.
    tokio::time::sleep(Duration::from_secs(20)).await;
    stop.store(true, Ordering::SeqCst);
    writer.await.unwrap();
    let written = writes.load(Ordering::SeqCst);
    let corrected = corrections(&metrics) - corrected_before;
    println!("fighter writes: {written}, corrections: {corrected}");
    assert!(
        corrected >= 3.0,
        "put back at least the rounds that make a fight: {corrected}"
    );
    assert!(
        corrected * 10.0 <= written as f64,
        "far fewer corrections ({corrected}) than the writer's writes ({written})"
    );

    // Put back once, then the report clears.
    let stopped_at = corrections(&metrics);
    let ours = "fought.example.test";
    eventually("the label put back", CONVERGE, || async {
        let d = fought_deployments.get("metrics-server").await.unwrap();
        (d.labels().get("domain").map(String::as_str) == Some(ours)).then_some(())
    })
    .await;
    let after_stop = corrections(&metrics) - stopped_at;

    // 12 s after that correction its hold (the cap, 20 s) still lasts; a person deletes the Deployment. The
    // writer answered within a fraction of a second: this is no answer of it, and it is put back at once.
    tokio::time::sleep(Duration::from_secs(12)).await;
    fought_deployments
        .delete("metrics-server", &DeleteParams::default())
        .await
        .unwrap();
    let deleted = std::time::Instant::now();
    eventually("the deleted Deployment put back", CONVERGE, || async {
        fought_deployments
            .get_opt("metrics-server")
            .await
            .unwrap()
            .filter(|d| d.metadata.deletion_timestamp.is_none())
            .map(|_| ())
    })
    .await;
    let put_back = deleted.elapsed();
    println!("a deletion 12 s after the fight's last correction was put back after {put_back:?}");
    assert!(
        put_back < Duration::from_secs(4),
        "put back at once, not at the hold's end (8 s later): {put_back:?}"
    );
    let cleared = addon_where(&addons, "fought", "the fight's report cleared", CONVERGE, |a| {
        a.get_condition(condition::DRIFT_SETTLED).is_none()
    })
    .await;
    assert!(cleared.status.as_ref().unwrap().ready);
    assert!(
        (0.0..=2.0).contains(&after_stop),
        "put back once after the writer stopped (one more if a correction was under way): {after_stop}"
    );
    assert_eq!(fights_gauge(&metrics), 0.0);
    let fights = events_with(&client, &ns, event::DRIFT_FIGHT).await;
    assert_eq!(fights.len(), 1, "one event for the fight: {fights:?}");
    assert!(fights[0].note.as_deref().is_some_and(|n| n.contains("fighter")));

    // The other objects of the fought addons and the other Cluster were left alone.
    assert_eq!(
        fought_services
            .get("metrics-server")
            .await
            .unwrap()
            .resource_version(),
        service_before,
        "another object of the same addons was not written"
    );
    assert_eq!(
        version(calm_deployments.get("metrics-server").await.unwrap()),
        calm_before,
        "the other Cluster's objects were not written"
    );
    let calm_addon = addons.get("cluster-addon-calm").await.unwrap();
    assert!(calm_addon.status.as_ref().unwrap().ready);
    assert!(calm_addon.get_condition(condition::DRIFT_SETTLED).is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_an_autoscaler_sets_through_the_scale_subresource_are_left_to_it() {
    let client = cso_testenv::shared_management().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "scaled").await.unwrap();
    let plane = workload_plane("scaled").await;
    let dir = tempfile::tempdir().unwrap();
    let (_operator, metrics) = operator_on_v1(&client, &ns, dir.path()).await;
    ready_cluster(&client, &ns, "scaled", &plane).await;
    let workload = plane.client().await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(workload.clone(), "kube-system");
    let replicas = |d: Deployment| d.spec.unwrap().replicas.unwrap();
    assert_eq!(
        replicas(deployments.get("metrics-server").await.unwrap()),
        1,
        "the chart's"
    );
    let corrected_before = corrections(&metrics);

    // Scaled as the HPA scales: the scale subresource, its own field manager; twice.
    let hpa = PatchParams {
        field_manager: Some("horizontal-pod-autoscaler".into()),
        ..PatchParams::default()
    };
    for count in [3, 4] {
        deployments
            .patch_scale(
                "metrics-server",
                &hpa,
                &Patch::Merge(json!({"spec": {"replicas": count}})),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            replicas(deployments.get("metrics-server").await.unwrap()),
            count,
            "the autoscaler's replicas stay"
        );
    }
    // Another object's drift re-applies the addons: the Deployment with them, without its replicas.
    let services: Api<Service> = Api::namespaced(workload, "kube-system");
    services
        .delete("metrics-server", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the deleted Service made again", CONVERGE, || async {
        services.get_opt("metrics-server").await.unwrap().map(drop)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(replicas(deployments.get("metrics-server").await.unwrap()), 4);
    assert_eq!(
        corrections(&metrics) - corrected_before,
        1.0,
        "only the deleted Service was put back"
    );
    let addon: ClusterAddon = Api::namespaced(client.clone(), &ns)
        .get("cluster-addon-scaled")
        .await
        .unwrap();
    assert!(addon.get_condition(condition::DRIFT_SETTLED).is_none());
    assert!(events_with(&client, &ns, event::DRIFT_FIGHT).await.is_empty());
    assert_eq!(fights_gauge(&metrics), 0.0);
}
