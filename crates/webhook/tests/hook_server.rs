//! The hook server over HTTPS, called as Cluster API calls it: discovery, the three hooks, many concurrent
//! calls answered from the ClusterAddons' state, Clusters that are not ours never held up, and a rotated
//! certificate picked up without a restart.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

use std::time::Duration;

use cso_api::{ClusterAddon, conditions::ConditionsExt, names::condition};
use cso_webhook::{TlsServer, hook_router};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

const PREFIX: &str = "/hooks.runtime.cluster.x-k8s.io/v1alpha1";

fn https_client(ca_pem: &str) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Posts `body` as Cluster API's runtime client does: JSON without a `Content-Type` header.
async fn call(client: &reqwest::Client, server: &TlsServer, path: &str, body: Value) -> Value {
    client
        .post(format!(
            "https://127.0.0.1:{}{PREFIX}/{path}",
            server.local_addr.port()
        ))
        .body(serde_json::to_vec(&body).unwrap())
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn before_upgrade_request(namespace: &str, cluster: &str, class: &str) -> Value {
    json!({
        "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "BeforeClusterUpgradeRequest",
        "cluster": {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
                    "metadata": {"name": cluster, "namespace": namespace},
                    "spec": {"topology": {"class": class, "version": "v1.27.3"}}},
        "fromKubernetesVersion": "v1.27.3", "toKubernetesVersion": "v1.27.4",
    })
}

async fn create_addon(client: &Client, namespace: &str, cluster: &str, applied: &str) {
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), namespace);
    let mut addon = ClusterAddon::new(&format!("cluster-addon-{cluster}"), Default::default());
    addon.spec.cluster_ref.name = Some(cluster.into());
    addon.spec.cluster_stack = applied.into();
    addons.create(&PostParams::default(), &addon).await.unwrap();
}

/// What the ClusterAddon controller records when it applied `class` completely.
async fn mark_applied(client: &Client, namespace: &str, cluster: &str, class: &str) {
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), namespace);
    let name = format!("cluster-addon-{cluster}");
    addons
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"clusterStack": class, "hook": ""}})),
        )
        .await
        .unwrap();
    let mut addon = addons.get(&name).await.unwrap();
    addon.mark_true(condition::HELM_CHART_APPLIED);
    let status = addon.status.as_mut().unwrap();
    status.ready = true;
    addons
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap();
}

/// `BeforeClusterUpgrade` to v2 for every cluster, `calls_each` times per cluster, all at once.
async fn upgrade_all(
    https: &reqwest::Client,
    server: &TlsServer,
    ns: &str,
    clusters: &[String],
    calls_each: usize,
) -> Vec<(String, Value)> {
    let calls = clusters
        .iter()
        .flat_map(|c| std::iter::repeat_n(c.clone(), calls_each))
        .map(|cluster| async move {
            let request = before_upgrade_request(ns, &cluster, "docker-ferrol-1-27-v2");
            let answer = call(
                https,
                server,
                "beforeclusterupgrade/before-cluster-upgrade",
                request,
            )
            .await;
            (cluster, answer)
        });
    futures::future::join_all(calls).await
}

const RETRY: i32 = cso_webhook::hooks::RETRY_AFTER_SECONDS;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_answer_from_the_cluster_addons_under_concurrent_calls() {
    let plane = cso_testenv::shared_management();
    let kube = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&kube, "hooks").await.unwrap();
    let certs = tempfile::tempdir().unwrap();
    let ca = cso_testenv::pki::write_serving_certificate(certs.path()).unwrap();
    let server = TlsServer::start(
        hook_router(kube.clone(), cso_webhook::hooks::unobserved()),
        "127.0.0.1:0".parse().unwrap(),
        certs.path(),
    )
    .await
    .unwrap();
    let https = https_client(&ca);

    let discovery = call(
        &https,
        &server,
        "discovery",
        json!({"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "DiscoveryRequest"}),
    )
    .await;
    assert_eq!(discovery["kind"], "DiscoveryResponse");
    let mut hooks: Vec<&str> = discovery["handlers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["requestHook"]["hook"].as_str().unwrap())
        .collect();
    hooks.sort();
    let mut every_hook: Vec<&str> = cso_api::rules::Hook::ALL.iter().map(|h| h.as_str()).collect();
    every_hook.sort();
    assert_eq!(hooks, every_hook);

    // AfterControlPlaneInitialized starts the install of a fresh cluster.
    create_addon(&kube, &ns, "fresh", "").await;
    let mut request = before_upgrade_request(&ns, "fresh", "docker-ferrol-1-27-v1");
    request["kind"] = json!("AfterControlPlaneInitializedRequest");
    let answer = call(
        &https,
        &server,
        "aftercontrolplaneinitialized/after-control-plane-initialized",
        request,
    )
    .await;
    assert_eq!(answer["status"], "Success");
    assert_eq!(answer["kind"], "AfterControlPlaneInitializedResponse");
    let addons: Api<ClusterAddon> = Api::namespaced(kube.clone(), &ns);
    assert_eq!(
        addons.get("cluster-addon-fresh").await.unwrap().spec.hook,
        "AfterControlPlaneInitialized"
    );

    // 20 clusters upgrade from v1 to v2 at once, two calls each at the same time.
    let clusters: Vec<String> = (0..20).map(|i| format!("c{i}")).collect();
    for cluster in &clusters {
        create_addon(&kube, &ns, cluster, "docker-ferrol-1-27-v1").await;
    }
    let answers = upgrade_all(&https, &server, &ns, &clusters, 2).await;
    for (cluster, answer) in answers {
        assert_eq!(answer["status"], "Success", "{cluster}: {answer}");
        assert_eq!(
            answer["retryAfterSeconds"], RETRY,
            "{cluster}: the upgrade waits for its addons: {answer}"
        );
    }
    for cluster in &clusters {
        let addon = addons.get(&format!("cluster-addon-{cluster}")).await.unwrap();
        assert_eq!(addon.spec.hook, "BeforeClusterUpgrade", "{cluster}");
    }

    // Half of them finish; the others keep waiting.
    for cluster in clusters.iter().step_by(2) {
        mark_applied(&kube, &ns, cluster, "docker-ferrol-1-27-v2").await;
    }
    let answers = upgrade_all(&https, &server, &ns, &clusters, 1).await;
    for (index, (cluster, answer)) in answers.into_iter().enumerate() {
        if index % 2 == 0 {
            assert!(
                answer.get("retryAfterSeconds").is_none(),
                "{cluster} is done: {answer}"
            );
        } else {
            assert_eq!(
                answer["retryAfterSeconds"], RETRY,
                "{cluster} is not done: {answer}"
            );
        }
    }

    // A Cluster whose class is not a cluster stack's is never held up; one whose ClusterAddon does not exist
    // yet is held by blocking hooks (AfterClusterUpgrade blocks since Cluster API 1.12), with a message that
    // is the same at every call.
    let foreign = call(
        &https,
        &server,
        "beforeclusterupgrade/before-cluster-upgrade",
        before_upgrade_request(&ns, "foreign", "my-own-class"),
    )
    .await;
    assert!(foreign.get("retryAfterSeconds").is_none(), "{foreign}");
    let unknown = call(
        &https,
        &server,
        "beforeclusterupgrade/before-cluster-upgrade",
        before_upgrade_request(&ns, "nobody", "docker-ferrol-1-27-v2"),
    )
    .await;
    assert_eq!(unknown["retryAfterSeconds"], RETRY, "{unknown}");
    let mut request = before_upgrade_request(&ns, "nobody", "docker-ferrol-1-27-v2");
    request["kind"] = json!("AfterClusterUpgradeRequest");
    let failed = call(
        &https,
        &server,
        "afterclusterupgrade/after-cluster-upgrade",
        request,
    )
    .await;
    assert_eq!(failed["status"], "Success", "{failed}");
    assert_eq!(failed["retryAfterSeconds"], RETRY, "{failed}");
    assert_eq!(
        failed["message"],
        format!("ClusterAddon {ns}/cluster-addon-nobody does not exist yet"),
        "{failed}"
    );
    server.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let plane = cso_testenv::shared_management();
    let kube = plane.client().await.unwrap();
    let certs = tempfile::tempdir().unwrap();
    let first_ca = cso_testenv::pki::write_serving_certificate(certs.path()).unwrap();
    let server = TlsServer::start(
        hook_router(kube, cso_webhook::hooks::unobserved()),
        "127.0.0.1:0".parse().unwrap(),
        certs.path(),
    )
    .await
    .unwrap();
    let discovery =
        json!({"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "DiscoveryRequest"});
    assert_eq!(
        call(&https_client(&first_ca), &server, "discovery", discovery.clone()).await["status"],
        "Success"
    );

    let second_ca = cso_testenv::pki::write_serving_certificate(certs.path()).unwrap();
    let trusting_second = https_client(&second_ca);
    let url = format!("https://127.0.0.1:{}{PREFIX}/discovery", server.local_addr.port());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match trusting_second.post(&url).json(&discovery).send().await {
            Ok(response) if response.status().is_success() => break,
            _ => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the new certificate was not served within 30 s"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
    assert!(
        https_client(&first_ca)
            .post(&url)
            .json(&discovery)
            .send()
            .await
            .is_err(),
        "the old certificate is no longer served"
    );
    server.shutdown(Duration::from_secs(1)).await;
}
