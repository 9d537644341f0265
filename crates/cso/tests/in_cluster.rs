//! The operator the way a site runs it: the image (`hack/image.sh`: static `cso`, `cso-renderer` and `helm` on
//! `scratch`, user 65532, read-only root) started by the chart's Deployment on a real node
//! ([`cso_testenv::node`]): `helm install` with the image and otherwise the chart's defaults, two replicas.
//! Both pods become Ready through their probes with the ServiceAccount's token (no kubeconfig), one of them holds
//! the Lease `clusterstack.x-k8s.io`, the API server calls the admission webhook through its Service (a
//! ClusterStack with a bad version is refused with the webhook's message), `/metrics` answers through the
//! metrics Service, and deleting the leader's pod stops it within its grace period and hands the Lease to a
//! replica that runs (the other one, or the one started in its place).
//!
//! The image archive is built once per run by `make image-test` (`make test` does it first); the test fails
//! with that line when it is missing.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use cso_testenv::{Tools, node::RealCluster};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Pod, Service},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;

const NAMESPACE: &str = "cso-system";
const LEASE: &str = "clusterstack.x-k8s.io";
const TIMEOUT: Duration = Duration::from_secs(120);

fn image_archive() -> PathBuf {
    std::env::var_os("CSO_IMAGE_ARCHIVE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/image/cso-image.tar"))
}

fn helm(tools: &Tools, kubeconfig: &Path, args: &[&str]) -> String {
    let output = Command::new(tools.helm.as_ref().expect("helm: run `make tools`"))
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "helm {args:?}: {text}");
    text
}

/// The names of the operator's pods that are Ready, and all of them with their phase and readiness.
async fn operator_pods(pods: &Api<Pod>) -> Result<(Vec<String>, String), String> {
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=controller-manager"))
        .await
        .map_err(|e| e.to_string())?;
    let ready: Vec<String> = list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let seen = list
        .items
        .iter()
        .map(|p| {
            let status = p.status.clone().unwrap_or_default();
            let waiting: Vec<String> = status
                .container_statuses
                .iter()
                .flatten()
                .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
                .collect();
            format!(
                "{} {:?} {waiting:?}",
                p.metadata.name.clone().unwrap_or_default(),
                status.phase
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    Ok((ready, seen))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_runs_the_image_on_a_real_node_with_two_replicas_one_leader_and_its_webhooks() {
    let tools = Tools::discover().unwrap();
    if let Err(why) = RealCluster::support(&tools) {
        panic!("this machine cannot run real nodes: {why}");
    }
    let archive = image_archive();
    assert!(
        archive.is_file(),
        "{} is missing: run `make image-test` (or `bash hack/image.sh`)",
        archive.display()
    );
    let cluster = RealCluster::start(&tools, "site", None, 1).await.unwrap();
    cluster.import_image(&archive).unwrap();
    let client = cluster.control_plane.client().await.unwrap();
    // Cluster API's CRDs, which the operator watches (Cluster API itself is not needed for this test).
    let capi_crds = cso_testenv::crds::read_dirs(&tools.capi_crd_dirs).unwrap();
    cso_testenv::crds::install(&client, &capi_crds).await.unwrap();

    let kubeconfig = cluster.control_plane.kubeconfig_path().to_path_buf();
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/cluster-stack-operator");
    let installed = Instant::now();
    helm(
        &tools,
        &kubeconfig,
        &[
            "install",
            "cso",
            chart.to_str().unwrap(),
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "--set",
            "image.repository=docker.io/library/cso",
            "--set",
            "image.tag=latest",
            "--set",
            "image.pullPolicy=Never",
            "--set",
            "replicas=2",
        ],
    );

    // Two replicas Ready through their probes.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let ready = cso_testenv::eventually("both replicas Ready", TIMEOUT, || async {
        let (ready, seen) = operator_pods(&pods).await?;
        if ready.len() == 2 { Ok(ready) } else { Err(seen) }
    })
    .await;
    let both_ready = installed.elapsed();

    // One holds the Lease.
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let leader = cso_testenv::eventually("the Lease held by one of them", TIMEOUT, || async {
        let lease = leases
            .get_opt(LEASE)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no Lease yet")?;
        let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
        ready
            .iter()
            .find(|pod| holder.starts_with(pod.as_str()))
            .cloned()
            .ok_or(format!("held by {holder:?}"))
    })
    .await;

    // The API server calls the webhook through its Service: a bad version is refused with its message.
    let stacks: Api<cso_api::ClusterStack> = Api::namespaced(client.clone(), "default");
    let stack: cso_api::ClusterStack = serde_json::from_value(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
        "metadata": {"name": "ferrol"},
        "spec": {"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27", "channel": "stable",
                 "autoSubscribe": false, "noProvider": true, "versions": ["v1-alpha"]},
    }))
    .unwrap();
    let refused = cso_testenv::eventually("the webhook's refusal", TIMEOUT, || async {
        match stacks.create(&PostParams::default(), &stack).await {
            Err(kube::Error::Api(status)) if status.message.contains("v1-alpha") => Ok(status.message),
            other => {
                let _ = stacks.delete("ferrol", &DeleteParams::default()).await;
                Err(format!("{other:?}"))
            }
        }
    })
    .await;
    assert!(refused.contains("spec.versions"), "{refused}");

    // /metrics through the metrics Service (the API server's service proxy).
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    let metrics_service = services
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .find(|name| name.contains("metrics"))
        .expect("a metrics Service");
    let metrics = cso_testenv::eventually("/metrics through the metrics Service", TIMEOUT, || async {
        let request = http::Request::get(format!(
            "/api/v1/namespaces/{NAMESPACE}/services/https:{metrics_service}:metrics/proxy/metrics"
        ))
        .body(Vec::new())
        .unwrap();
        let plain = http::Request::get(format!(
            "/api/v1/namespaces/{NAMESPACE}/services/{metrics_service}:metrics/proxy/metrics"
        ))
        .body(Vec::new())
        .unwrap();
        match client.request_text(plain).await {
            Ok(text) if text.contains("cso_") => Ok(text),
            first => match client.request_text(request).await {
                Ok(text) if text.contains("cso_") => Ok(text),
                second => Err(format!("{first:?} / {second:?}")),
            },
        }
    })
    .await;
    assert!(metrics.contains("process_resident_memory_bytes"));

    // The leader's pod deleted (SIGTERM): it stops within its grace period (the kubelet removes the pod once its
    // container has exited; one that ignored SIGTERM would be killed after the 30 s), and the other replica
    // takes the Lease.
    let handover = Instant::now();
    pods.delete(&leader, &DeleteParams::default()).await.unwrap();
    let grace = Duration::from_secs(30);
    cso_testenv::eventually(
        "the deleted leader's pod gone within its grace period",
        grace,
        || async {
            match pods.get_opt(&leader).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(pod) => Err(format!("{:?}", pod.status.and_then(|s| s.container_statuses))),
            }
        },
    )
    .await;
    let stopped = handover.elapsed();
    // The other replica, or the one the Deployment started in the leader's place, whichever asks first.
    let successor = cso_testenv::eventually("the Lease held by a replica that runs", TIMEOUT, || async {
        let lease = leases
            .get_opt(LEASE)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no Lease")?;
        let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
        let (running, _) = operator_pods(&pods).await?;
        running
            .into_iter()
            .find(|pod| *pod != leader && holder.starts_with(pod.as_str()))
            .ok_or(format!("held by {holder:?}"))
    })
    .await;
    assert_ne!(successor, leader);
    eprintln!(
        "in cluster: both replicas Ready {both_ready:.1?} after helm install; the deleted leader's pod gone after \
         {stopped:.1?}, the Lease handed over {:.1?} after the deletion",
        handover.elapsed()
    );
    cluster.stop();
}
