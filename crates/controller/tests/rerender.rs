//! Re-rendering when the inputs of the values templates change, on real API servers with real helm: a
//! changed Cluster endpoint reaches the addon objects at the reconcile its change starts (the periodic pass
//! is an hour away), reconciles whose inputs template into the same values write nothing, and addons
//! applied before the digest was recorded adopt it without a render.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod support;

use std::time::Duration;

use cso_api::{
    ClusterAddon, cluster_addon::APPLIED_INPUTS_ANNOTATION, conditions::ConditionsExt, names::condition,
};
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;
use support::*;

const ENDPOINT_ANNOTATION: &str = "cso.test/endpoint";

fn endpoint_of(deployment: &Deployment) -> String {
    deployment
        .annotations()
        .get(ENDPOINT_ANNOTATION)
        .cloned()
        .unwrap_or_default()
}

fn reconciles(metrics: &cso_controller::metrics::Metrics) -> f64 {
    counter(
        &metrics.encode(),
        "controller_runtime_reconcile_total",
        &["controller=\"clusteraddon\""],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_endpoint_re_renders_at_once_and_unchanged_inputs_write_nothing() {
    let client = cso_testenv::shared_management().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "rerender").await.unwrap();
    let own = workload_plane("rerender").await;
    let workload = own.client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    ferrol_v1_with_values(
        dir.path(),
        &format!(
            r#"values: |
  metrics-server:
    commonLabels:
      clusterAddonVersion: "v1"
    deploymentAnnotations:
      {ENDPOINT_ANNOTATION}: '{{{{ .Cluster.spec.controlPlaneEndpoint.host }}}}'
"#
        ),
    );
    // No periodic pass for an hour: whatever is rendered again below, a change of the inputs started.
    let source = std::sync::Arc::new(cso_release::source::local::LocalSource::new(
        dir.path().join("cluster-stacks"),
    ));
    let (parts, renderer) = support::operator(&client, &ns, dir.path(), source, |s| {
        s.resync_interval = Duration::from_secs(3600)
    });
    let metrics = parts.metrics.clone();
    let operator = RunningOperator::run(parts, renderer).await;
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1"])).await;
    ready_release(&client, &ns, "docker-ferrol-1-27-v1").await;
    cso_testenv::kubeconfig_secret(&client, &ns, "c1", own.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(&client, &ns, "c1", "docker-ferrol-1-27-v1").await;
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    let installed = addon_where(
        &addons,
        "c1",
        "the addons installed, their inputs recorded",
        CONVERGE,
        |a| {
            a.status.as_ref().is_some_and(|s| s.ready)
                && a.annotations().contains_key(APPLIED_INPUTS_ANNOTATION)
        },
    )
    .await;
    let deployments: Api<Deployment> = Api::namespaced(workload.clone(), "kube-system");
    let metrics_server = deployments.get("metrics-server").await.unwrap();
    assert_eq!(endpoint_of(&metrics_server), "c1.example.test");
    let digest = installed.annotations()[APPLIED_INPUTS_ANNOTATION].clone();
    assert!(digest.starts_with("sha256:"), "{digest}");

    // Ten reconciles whose inputs template into the same values (a Cluster label the templates do not read):
    // nothing is rendered into the workload cluster, nothing recorded.
    let settled = addons.get("cluster-addon-c1").await.unwrap();
    let writes = workload_writes(&workload).await;
    let before = reconciles(&metrics);
    let clusters = dynamic(&client, &ns, &capi("Cluster"));
    for touch in 1..=10 {
        clusters
            .patch(
                "c1",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"cso.test/touch": touch.to_string()}}})),
            )
            .await
            .unwrap();
        let want = before + f64::from(touch);
        eventually(
            &format!("reconcile {touch} after a Cluster label change"),
            CONVERGE,
            || async { (reconciles(&metrics) >= want).then_some(()) },
        )
        .await;
    }
    assert_eq!(
        workload_writes(&workload).await,
        writes,
        "no write to the workload cluster"
    );
    assert_eq!(
        deployments
            .get("metrics-server")
            .await
            .unwrap()
            .resource_version(),
        metrics_server.resource_version()
    );
    assert_eq!(
        addons.get("cluster-addon-c1").await.unwrap().resource_version(),
        settled.resource_version(),
        "the ClusterAddon is not written either"
    );

    // The endpoint moves: the reconcile this change starts renders and applies the addons again.
    clusters
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"controlPlaneEndpoint": {"host": "moved.example.test"}}})),
        )
        .await
        .unwrap();
    eventually(
        "the addon objects carry the new endpoint",
        Duration::from_secs(60),
        || async {
            let deployment = deployments.get("metrics-server").await.unwrap();
            (endpoint_of(&deployment) == "moved.example.test").then_some(())
        },
    )
    .await;
    let moved = addon_where(&addons, "c1", "the new inputs recorded", CONVERGE, |a| {
        a.annotations().get(APPLIED_INPUTS_ANNOTATION) != Some(&digest)
    })
    .await;
    assert!(moved.status.as_ref().unwrap().ready);
    assert!(moved.is_condition_true(condition::HELM_CHART_APPLIED));
    assert_eq!(
        moved.spec.cluster_stack, "docker-ferrol-1-27-v1",
        "the same release"
    );

    // Addons applied before the digest was recorded (by the Go operator, or an older cso) adopt it: no render.
    let writes = workload_writes(&workload).await;
    let recorded = moved.annotations()[APPLIED_INPUTS_ANNOTATION].clone();
    addons
        .patch(
            "cluster-addon-c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {APPLIED_INPUTS_ANNOTATION: null}}})),
        )
        .await
        .unwrap();
    addon_where(&addons, "c1", "the digest adopted", CONVERGE, |a| {
        a.annotations().get(APPLIED_INPUTS_ANNOTATION) == Some(&recorded)
    })
    .await;
    assert_eq!(
        workload_writes(&workload).await,
        writes,
        "adopting the digest writes nothing to the workload cluster"
    );
    operator.stop().await;
    own.stop();
}
