//! Health gates against a real API server. It runs no controllers: the tests write the statuses the
//! Deployment and Job controllers would write, through the status subresource; the API server's own
//! controllers establish CustomResourceDefinitions.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::time::{Duration, Instant};

use cso_api::common::Resource;
use cso_apply::{
    ClusterDiscovery, Health,
    health::{self, HealthReport},
};
use k8s_openapi::{
    api::{
        apps::v1::{DaemonSet, Deployment},
        batch::v1::Job,
        core::v1::ConfigMap,
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

async fn setup(prefix: &str) -> (Client, String, ClusterDiscovery) {
    let client = cso_testenv::shared_workload().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, prefix).await.unwrap();
    let discovery = ClusterDiscovery::new(client.clone());
    (client, ns, discovery)
}

fn entry(group: &str, version: &str, kind: &str, namespace: &str, name: &str) -> Resource {
    Resource {
        group: group.into(),
        version: version.into(),
        kind: kind.into(),
        namespace: namespace.into(),
        name: name.into(),
        ..Default::default()
    }
}

fn labels() -> Value {
    json!({"app": "web"})
}

fn pod_template() -> Value {
    json!({"metadata": {"labels": labels()},
           "spec": {"containers": [{"name": "web", "image": "registry.k8s.io/pause:3.10"}]}})
}

async fn create<K>(api: &Api<K>, object: Value) -> K
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let object: K = serde_json::from_value(object).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap()
}

async fn write_status<K>(api: &Api<K>, name: &str, status: Value)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .unwrap();
}

/// The one object of `report` that is not healthy.
fn only_unhealthy(report: &HealthReport) -> &Health {
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.unhealthy.len(), 1, "{report:?}");
    &report.unhealthy[0].health
}

#[tokio::test]
async fn a_deployment_is_progressing_until_its_status_says_it_is_available_and_not_found_once_deleted() {
    let (client, ns, discovery) = setup("health-deployment").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let daemon_sets: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    create(
        &deployments,
        json!({"metadata": {"name": "web"},
               "spec": {"replicas": 2, "selector": {"matchLabels": labels()}, "template": pod_template()}}),
    )
    .await;
    create(
        &daemon_sets,
        json!({"metadata": {"name": "agent"},
               "spec": {"selector": {"matchLabels": labels()}, "template": pod_template()}}),
    )
    .await;
    create(&config_maps, json!({"metadata": {"name": "web"}})).await;
    let inventory = [
        entry("", "v1", "ConfigMap", &ns, "web"),
        entry("apps", "v1", "Deployment", &ns, "web"),
        entry("apps", "v1", "DaemonSet", &ns, "agent"),
    ];

    // As created: no controller has written a status.
    let report = health::check(&discovery, &inventory, std::time::Duration::ZERO).await;
    assert_eq!(report.checked, 2, "the ConfigMap has no rule");
    assert!(!report.is_healthy() && !report.has_failed(), "{report:?}");
    assert_eq!(
        report.summary(1),
        format!("Deployment {ns}/web: no status yet; and 1 more")
    );

    // What the deployment controller writes while no pod is available.
    write_status(
        &deployments,
        "web",
        json!({"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "unavailableReplicas": 2,
               "conditions": [
                   {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
                    "message": "Deployment does not have minimum availability.",
                    "lastUpdateTime": "2026-11-02T10:00:00Z", "lastTransitionTime": "2026-11-02T10:00:00Z"},
                   {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
                    "message": "ReplicaSet \"web-6d94bc8694\" is progressing.",
                    "lastUpdateTime": "2026-11-02T10:00:00Z", "lastTransitionTime": "2026-11-02T10:00:00Z"}]}),
    )
    .await;
    write_status(
        &daemon_sets,
        "agent",
        json!({"observedGeneration": 1, "currentNumberScheduled": 3, "desiredNumberScheduled": 3,
               "numberMisscheduled": 0, "numberReady": 1, "numberAvailable": 1, "numberUnavailable": 2,
               "updatedNumberScheduled": 3}),
    )
    .await;
    let report = health::check(&discovery, &inventory, std::time::Duration::ZERO).await;
    assert_eq!(
        report.summary(5),
        format!(
            "Deployment {ns}/web: 0 of 2 replicas available (MinimumReplicasUnavailable: Deployment does \
             not have minimum availability.); DaemonSet {ns}/agent: 1 of 3 pods available"
        )
    );

    // Available.
    write_status(
        &deployments,
        "web",
        json!({"readyReplicas": 2, "availableReplicas": 2, "unavailableReplicas": null,
               "conditions": [
                   {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                    "message": "Deployment has minimum availability.",
                    "lastUpdateTime": "2026-11-02T10:01:00Z", "lastTransitionTime": "2026-11-02T10:01:00Z"},
                   {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                    "message": "ReplicaSet \"web-6d94bc8694\" has successfully progressed.",
                    "lastUpdateTime": "2026-11-02T10:01:00Z", "lastTransitionTime": "2026-11-02T10:00:00Z"}]}),
    )
    .await;
    write_status(
        &daemon_sets,
        "agent",
        json!({"numberReady": 3, "numberAvailable": 3, "numberUnavailable": null}),
    )
    .await;
    let report = health::check(&discovery, &inventory, std::time::Duration::ZERO).await;
    assert!(report.is_healthy(), "{}", report.summary(5));
    assert_eq!(report.checked, 2);

    // A new spec the controller has not observed: progressing again.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    let report = health::check(&discovery, &inventory, std::time::Duration::ZERO).await;
    assert_eq!(
        only_unhealthy(&report),
        &Health::Progressing("generation 2 not observed by its controller yet (observed 1)".into())
    );

    // Deleted (no garbage collector runs here, nothing holds it back).
    deployments.delete("web", &DeleteParams::default()).await.unwrap();
    let report = health::check(&discovery, &inventory, std::time::Duration::ZERO).await;
    assert_eq!(only_unhealthy(&report), &Health::Progressing("not found".into()));
    assert_eq!(report.summary(3), format!("Deployment {ns}/web: not found"));
}

#[tokio::test]
async fn a_job_that_failed_has_failed() {
    let (client, ns, discovery) = setup("health-job").await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    create(
        &jobs,
        json!({"metadata": {"name": "migrate"},
               "spec": {"backoffLimit": 0, "template": {
                   "spec": {"restartPolicy": "Never",
                            "containers": [{"name": "migrate", "image": "registry.k8s.io/pause:3.10"}]}}}}),
    )
    .await;
    let inventory = [entry("batch", "v1", "Job", &ns, "migrate")];

    write_status(
        &jobs,
        "migrate",
        json!({"startTime": "2026-11-02T10:00:00Z", "active": 1}),
    )
    .await;
    let report = health::check(&discovery, &inventory, std::time::Duration::ZERO).await;
    assert_eq!(
        only_unhealthy(&report),
        &Health::Progressing("0 of 1 completions (1 active)".into())
    );
    assert!(!report.has_failed());

    // What the job controller writes when the pod failed: the failure target first, then, once the pod
    // is gone, Failed (the API server refuses Failed without FailureTarget).
    let condition = |kind: &str| {
        json!({"type": kind, "status": "True", "reason": "BackoffLimitExceeded",
               "message": "Job has reached the specified backoff limit",
               "lastProbeTime": "2026-11-02T10:01:00Z", "lastTransitionTime": "2026-11-02T10:01:00Z"})
    };
    write_status(
        &jobs,
        "migrate",
        json!({"active": null, "failed": 1, "conditions": [condition("FailureTarget"), condition("Failed")]}),
    )
    .await;
    let report = health::check(&discovery, &inventory, std::time::Duration::ZERO).await;
    assert!(report.has_failed(), "{report:?}");
    assert_eq!(
        report.summary(3),
        format!("Job {ns}/migrate: BackoffLimitExceeded: Job has reached the specified backoff limit")
    );
}

#[tokio::test]
async fn a_custom_resource_definition_is_established_by_the_api_server() {
    let (client, ns, discovery) = setup("health-crd").await;
    let group = format!("{ns}.example.com");
    let name = format!("widgets.{group}");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    create(
        &crds,
        json!({"metadata": {"name": name},
               "spec": {"group": group, "scope": "Namespaced",
                        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget",
                                  "listKind": "WidgetList"},
                        "versions": [{"name": "v1", "served": true, "storage": true,
                                      "schema": {"openAPIV3Schema": {
                                          "type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}}),
    )
    .await;
    let inventory = [
        entry(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "",
            &name,
        ),
        // A custom object has no rule: not read.
        entry(&group, "v1", "Widget", &ns, "w1"),
    ];

    let deadline = Instant::now() + Duration::from_secs(30);
    let report = loop {
        let report = health::check(&discovery, &inventory, std::time::Duration::ZERO).await;
        if report.is_healthy() || Instant::now() > deadline {
            break report;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(report.is_healthy(), "{}", report.summary(3));
    assert_eq!(report.checked, 1);
}

#[tokio::test]
async fn kinds_not_served_are_progressing_and_objects_named_twice_are_read_once() {
    let (client, ns, discovery) = setup("health-kinds").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    create(
        &deployments,
        json!({"metadata": {"name": "web"},
               "spec": {"replicas": 0, "selector": {"matchLabels": labels()}, "template": pod_template()}}),
    )
    .await;
    write_status(&deployments, "web", json!({"observedGeneration": 1})).await;
    let inventory = [
        entry("apps", "v9", "Deployment", &ns, "old"),
        entry("apps", "v1", "Deployment", &ns, "web"),
        entry("apps", "v1", "Deployment", &ns, "web"),
        // Without a version (a hand-written entry): read in the group's preferred version.
        entry("apps", "", "Deployment", &ns, "web"),
        entry("", "v1", "Pod", &ns, "missing"),
    ];
    let report = health::check(&discovery, &inventory, std::time::Duration::ZERO).await;
    assert_eq!(report.checked, 3, "{report:?}");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let found: Vec<(usize, String)> = report
        .unhealthy
        .iter()
        .map(|object| (object.position, object.to_string()))
        .collect();
    assert_eq!(
        found,
        [(
            0,
            format!("Deployment {ns}/old: the cluster does not serve apps/v9/Deployment")
        ),],
        "a missing Pod (or Job) ran and was cleaned up: it counts as running"
    );
}
