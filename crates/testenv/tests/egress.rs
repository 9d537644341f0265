//! Nothing the test environment starts sends a packet off this machine ([`cso_testenv::egress`]).
//!
//! A workload cluster of the environment (kube-apiserver, kube-controller-manager, kube-scheduler, kwok's
//! simulated nodes) is made to dial every kind of address it invents: an `APIService` whose Service has a
//! ClusterIP and a simulated pod behind it (the aggregator checks it), an admission webhook called through a
//! Service, and the logs of a simulated pod (the API server dials the node's kubelet at its `InternalIP`). Each
//! dial fails at once on this machine ("no route to host"), and the guard's counters on the machine's uplink
//! stay at zero. A datagram to the guard's canary shows that those counters do count what reaches the uplink
//! (the chain drops it: it does not leave either).
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::time::Duration;

use cso_testenv::{egress, workloads::shared_workload_cluster};
use k8s_openapi::{
    api::{
        admissionregistration::v1::ValidatingWebhookConfiguration,
        apps::v1::Deployment,
        core::v1::{ConfigMap, Pod, Service},
    },
    kube_aggregator::pkg::apis::apiregistration::v1::APIService,
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, LogParams, PostParams},
};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(120);
/// What a dial into a guarded range answers here: the `unreachable` route, at once.
const NO_ROUTE: &str = "no route to host";

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_the_simulated_clusters_dial_leaves_the_machine() {
    let plane = &shared_workload_cluster().control_plane;
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "egress").await.unwrap();
    let before = egress::counters().expect("the egress guard is in place while an environment runs");

    // A backend: one simulated pod, and a Service with a ClusterIP in front of it.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deployments
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "backend"},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {"app": "backend"}},
                    "template": {
                        "metadata": {"labels": {"app": "backend"}},
                        "spec": {"containers": [{"name": "app", "image": "registry.invalid/cso/app:1",
                                                 "ports": [{"containerPort": 8443}]}]},
                    },
                },
            })),
        )
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let service = services
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "backend"},
                "spec": {"selector": {"app": "backend"}, "ports": [{"port": 443, "targetPort": 8443}]},
            })),
        )
        .await
        .unwrap();
    let cluster_ip = service.spec.unwrap().cluster_ip.unwrap();
    let service_range: ipnet::IpNet = egress::SERVICE_CIDR.parse().unwrap();
    assert!(
        service_range.contains(&cluster_ip.parse::<std::net::IpAddr>().unwrap()),
        "the ClusterIP {cluster_ip} is in the guarded service range {service_range}"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = cso_testenv::eventually("the backend pod running with an IP", TIMEOUT, || async {
        let list = pods
            .list(&ListParams::default().labels("app=backend"))
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .into_iter()
            .find(|p| {
                p.status
                    .as_ref()
                    .is_some_and(|s| s.phase.as_deref() == Some("Running") && s.pod_ip.is_some())
            })
            .ok_or_else(|| "no running pod yet".to_owned())
    })
    .await;

    // 1. An APIService: the aggregator dials the Service's ClusterIP.
    let group = format!("{ns}.egress.cso.test");
    let api_services: Api<APIService> = Api::all(client.clone());
    let api_service_name = format!("v1.{group}");
    api_services
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                "metadata": {"name": api_service_name},
                "spec": {
                    "group": group, "version": "v1",
                    "groupPriorityMinimum": 100, "versionPriority": 100,
                    "insecureSkipTLSVerify": true,
                    "service": {"name": "backend", "namespace": ns, "port": 443},
                },
            })),
        )
        .await
        .unwrap();
    let not_available =
        cso_testenv::eventually("the APIService checked and not Available", TIMEOUT, || async {
            let api_service = api_services
                .get(&api_service_name)
                .await
                .map_err(|e| e.to_string())?;
            let condition = api_service
                .status
                .and_then(|s| s.conditions)
                .into_iter()
                .flatten()
                .find(|c| c.type_ == "Available");
            match condition {
                Some(c) if c.status == "False" && c.reason.as_deref() == Some("FailedDiscoveryCheck") => {
                    Ok(c.message.unwrap_or_default())
                }
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    assert!(
        not_available.contains(&cluster_ip) && not_available.contains(NO_ROUTE),
        "the aggregator's dial of {cluster_ip} fails on this machine: {not_available}"
    );
    api_services
        .delete(&api_service_name, &DeleteParams::default())
        .await
        .unwrap();

    // 2. An admission webhook called through its Service.
    let webhooks: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let webhook_name = format!("egress-{ns}");
    webhooks
        .create(
            &PostParams::default(),
            &object(json!({
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": webhook_name},
                "webhooks": [{
                    "name": "configmaps.egress.cso.test",
                    "clientConfig": {"service": {"name": "backend", "namespace": ns, "port": 443}},
                    "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                               "resources": ["configmaps"]}],
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                    "failurePolicy": "Fail", "sideEffects": "None", "timeoutSeconds": 10,
                    "admissionReviewVersions": ["v1"],
                }],
            })),
        )
        .await
        .unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let refused = cso_testenv::eventually(
        "the webhook called (and failing) on a ConfigMap's creation",
        TIMEOUT,
        || async {
            let config_map: ConfigMap = object(json!({"apiVersion": "v1", "kind": "ConfigMap",
                                                  "metadata": {"generateName": "checked-"}}));
            match config_maps.create(&PostParams::default(), &config_map).await {
                Err(kube::Error::Api(status)) if status.message.contains("failed calling webhook") => {
                    Ok(status.message)
                }
                other => {
                    if let Ok(created) = other.as_ref() {
                        let _ = config_maps
                            .delete(&created.name_any(), &DeleteParams::default())
                            .await;
                    }
                    Err(format!("{other:?}"))
                }
            }
        },
    )
    .await;
    assert!(
        refused.contains(NO_ROUTE),
        "the webhook's dial fails on this machine: {refused}"
    );
    webhooks
        .delete(&webhook_name, &DeleteParams::default())
        .await
        .unwrap();

    // 3. The logs of a simulated pod: the API server dials the node's kubelet at its InternalIP.
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
    let logs = tokio::time::timeout(
        Duration::from_secs(30),
        pods.logs(&pod.name_any(), &LogParams::default()),
    )
    .await
    .expect("the logs request ends at once, not after a timeout");
    let failure = logs.expect_err("a simulated node serves no logs").to_string();
    assert!(
        failure.contains(NO_ROUTE) && failure.contains("172.18."),
        "the kubelet of {node} is dialled at its InternalIP and that fails on this machine: {failure}"
    );

    // Nothing reached the uplink...
    let after = egress::counters().unwrap();
    assert_eq!(
        after.leaked(),
        0,
        "packets to the simulated clusters' addresses reached the machine's uplink: {:?}",
        after.guarded
    );
    assert!(
        !after.guarded.is_empty(),
        "the guard counts on at least one uplink"
    );

    // ... and the counters do see what would: a datagram to the canary reaches the uplink's path and is dropped.
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    let sent = socket.send_to(b"cso-testenv canary", (egress::CANARY, 9));
    let error = sent.expect_err("the guard drops the canary datagram");
    assert_eq!(error.kind(), std::io::ErrorKind::PermissionDenied, "{error}");
    let canary = egress::counters().unwrap();
    assert!(
        canary.canary > before.canary.max(after.canary),
        "the canary was counted: {before:?} -> {canary:?}"
    );
    assert_eq!(canary.leaked(), 0);
}
