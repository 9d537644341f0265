//! The validating webhooks as the real API server calls them: a `ValidatingWebhookConfiguration` (the Go
//! operator's webhooks, paths and rules) points at the webhook server on loopback, and every case below is a
//! real create, update or delete whose `AdmissionReview` goes through kube-apiserver. Each test scopes its
//! configuration to its own namespace, so the tests run side by side.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

use std::time::Duration;

use cso_api::{ClusterAddon, ClusterStack, ClusterStackRelease, ClusterStackRollout, capi::Cluster};
use cso_webhook::{TlsServer, admission, admission_router};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// A webhook server for `ns` and its configuration in the API server; removed when dropped.
struct Webhooks {
    server: TlsServer,
    _certs: tempfile::TempDir,
}

fn webhook(name: &str, path: &str, port: u16, ca: &str, ns: &str, rule: Value) -> Value {
    use base64::Engine;
    json!({
        "name": name,
        "clientConfig": {
            "url": format!("https://127.0.0.1:{port}{path}"),
            "caBundle": base64::engine::general_purpose::STANDARD.encode(ca),
        },
        "rules": [rule],
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 10,
    })
}

/// A namespace named from `prefix` with the webhooks active for it: (client, namespace, webhooks).
async fn namespace_with_webhooks(prefix: &str) -> (Client, String, Webhooks) {
    let client = cso_testenv::shared_management().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, prefix).await.unwrap();
    let webhooks = start_webhooks(&client, &ns).await;
    (client, ns, webhooks)
}

async fn start_webhooks(client: &Client, ns: &str) -> Webhooks {
    let certs = tempfile::tempdir().unwrap();
    let ca = cso_testenv::pki::write_serving_certificate(certs.path()).unwrap();
    let server = TlsServer::start(
        admission_router(client.clone(), Cluster::v1beta1_resource()),
        "127.0.0.1:0".parse().unwrap(),
        certs.path(),
    )
    .await
    .unwrap();
    let port = server.local_addr.port();
    let ours = |resource: &str, operations: Value| {
        json!({"apiGroups": ["clusterstack.x-k8s.io"], "apiVersions": ["v1alpha1"],
               "resources": [resource], "operations": operations})
    };
    let configuration: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": format!("cso-{ns}")},
        "webhooks": [
            webhook("validation.cluster.cluster.x-k8s.io", admission::CLUSTER_PATH, port, &ca, ns,
                json!({"apiGroups": ["cluster.x-k8s.io"], "apiVersions": ["v1beta1", "v1beta2"], "resources": ["clusters"],
                       "operations": ["CREATE", "UPDATE"]})),
            webhook("validation.clusteraddon.clusterstack.x-k8s.io", admission::CLUSTER_ADDON_PATH, port, &ca, ns,
                ours("clusteraddons", json!(["CREATE", "UPDATE"]))),
            webhook("validation.clusterstack.clusterstack.x-k8s.io", admission::CLUSTER_STACK_PATH, port, &ca, ns,
                ours("clusterstacks", json!(["CREATE", "UPDATE", "DELETE"]))),
            webhook("validation.clusterstackrelease.clusterstack.x-k8s.io", admission::CLUSTER_STACK_RELEASE_PATH,
                port, &ca, ns, ours("clusterstackreleases", json!(["DELETE"]))),
            webhook("validation.clusterstackrollout.clusterstack.x-k8s.io", admission::CLUSTER_STACK_ROLLOUT_PATH,
                port, &ca, ns, ours("clusterstackrollouts", json!(["CREATE", "UPDATE"]))),
        ],
    }))
    .unwrap();
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &configuration)
        .await
        .unwrap();
    // The API server picks configurations up asynchronously: wait until an invalid object is refused.
    let stacks: Api<ClusterStack> = Api::namespaced(client.clone(), ns);
    let probe = stack("probe", json!({"versions": ["not-a-version"]}));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match stacks.create(&PostParams::default(), &probe).await {
            Err(_) => break,
            Ok(_) => {
                stacks.delete("probe", &DeleteParams::default()).await.unwrap();
                assert!(
                    std::time::Instant::now() < deadline,
                    "the webhooks never became active"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    Webhooks {
        server,
        _certs: certs,
    }
}

impl Webhooks {
    async fn stop(self, client: &Client, ns: &str) {
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .delete(&format!("cso-{ns}"), &DeleteParams::default())
            .await
            .unwrap();
        self.server.shutdown(Duration::from_secs(1)).await;
    }
}

fn parse<K: DeserializeOwned>(value: Value) -> K {
    serde_json::from_value(value).unwrap()
}

/// A ferrol 1.27 ClusterStack without provider, with `overrides` merged into its spec.
fn stack(name: &str, overrides: Value) -> ClusterStack {
    let mut spec = json!({"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27",
                          "autoSubscribe": false, "noProvider": true, "versions": ["v1"]});
    for (key, value) in overrides.as_object().unwrap() {
        spec[key] = value.clone();
    }
    parse(
        json!({"apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
                 "metadata": {"name": name}, "spec": spec}),
    )
}

fn cluster(name: &str, topology: Option<(&str, &str)>) -> Cluster {
    let spec = match topology {
        Some((class, version)) => json!({"topology": {"class": class, "version": version}}),
        None => json!({}),
    };
    parse(
        json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
                 "metadata": {"name": name}, "spec": spec}),
    )
}

/// The refusal the API server returned: (HTTP code, message).
fn refusal<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message),
        other => panic!("expected the API server to refuse, got {other:?}"),
    }
}

async fn merge<K>(api: &Api<K>, name: &str, patch: Value) -> Result<K, kube::Error>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_stacks_are_validated_on_create_update_and_delete() {
    let (client, ns, webhooks) = namespace_with_webhooks("adm-stack").await;
    let stacks: Api<ClusterStack> = Api::namespaced(client.clone(), &ns);
    let create = |s: ClusterStack| {
        let stacks = stacks.clone();
        async move { stacks.create(&PostParams::default(), &s).await }
    };

    create(stack("ferrol", json!({"versions": ["v1", "v2"]})))
        .await
        .unwrap();
    let (code, message) = refusal(create(stack("alpha", json!({"versions": ["v1-alpha"]}))).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("spec.versions") && message.contains("v1-alpha"),
        "{message}"
    );
    let (code, message) = refusal(create(stack("noref", json!({"noProvider": false}))).await);
    assert_eq!(code, 422);
    assert!(message.contains("empty provider ref"), "{message}");
    let (_, message) = refusal(create(stack("mixed", json!({"versions": ["v0-sha.hipstsw"]}))).await);
    assert!(message.contains("channel custom"), "{message}");
    create(stack(
        "hash",
        json!({"channel": "custom", "versions": ["v0-sha.hipstsw"]}),
    ))
    .await
    .unwrap();

    // Update: the identity is immutable, and new versions are validated too (the Go operator does not).
    let (code, message) =
        refusal(merge(&stacks, "ferrol", json!({"spec": {"kubernetesVersion": "1.28"}})).await);
    assert_eq!(code, 422);
    assert!(
        message.contains("spec.kubernetesVersion: field is immutable"),
        "{message}"
    );
    let (_, message) = refusal(merge(&stacks, "ferrol", json!({"spec": {"channel": "custom"}})).await);
    assert!(message.contains("spec.channel: field is immutable"), "{message}");
    let (_, message) = refusal(merge(&stacks, "ferrol", json!({"spec": {"versions": ["v1", "3"]}})).await);
    assert!(message.contains("invalid version \"3\""), "{message}");
    merge(
        &stacks,
        "ferrol",
        json!({"spec": {"versions": ["v1", "v2", "v3"]}}),
    )
    .await
    .unwrap();

    // Delete: refused while a Cluster uses any version of the stack and channel, hash builds included.
    let clusters: Api<Cluster> = Api::namespaced_with(client.clone(), &ns, &Cluster::v1beta1_resource());
    let user = cluster("c1", Some(("docker-ferrol-1-27-v6", "v1.27.3")));
    clusters.create(&PostParams::default(), &user).await.unwrap();
    let odd = cluster("odd", Some(("test-cluster-class", "v1.27.3")));
    clusters.create(&PostParams::default(), &odd).await.unwrap();
    let (code, message) = refusal(stacks.delete("ferrol", &DeleteParams::default()).await);
    assert_eq!(code, 400);
    assert!(message.contains(&format!("[{ns}/c1]")), "{message}");
    let hash_user = cluster("c2", Some(("docker-ferrol-1-27-v0-sha.hipstsw", "v1.27.7")));
    clusters.create(&PostParams::default(), &hash_user).await.unwrap();
    let (_, message) = refusal(stacks.delete("hash", &DeleteParams::default()).await);
    assert!(message.contains("c2") && !message.contains("c1"), "{message}");

    clusters.delete("c1", &DeleteParams::default()).await.unwrap();
    stacks.delete("ferrol", &DeleteParams::default()).await.unwrap();
    webhooks.stop(&client, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_in_use_are_protected_even_beside_non_conforming_clusters_but_not_from_clusterctl_move() {
    let (client, ns, webhooks) = namespace_with_webhooks("adm-release").await;
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), &ns);
    for name in ["docker-ferrol-1-27-v1", "docker-ferrol-1-27-v2"] {
        let release: ClusterStackRelease = parse(json!({
            "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStackRelease",
            "metadata": {"name": name}, "spec": {}}));
        releases.create(&PostParams::default(), &release).await.unwrap();
    }
    let clusters: Api<Cluster> = Api::namespaced_with(client.clone(), &ns, &Cluster::v1beta1_resource());
    // With the Go operator this one Cluster switches the protection off for the whole namespace.
    let odd = cluster("odd", Some(("test-cluster-class", "v1.27.3")));
    clusters.create(&PostParams::default(), &odd).await.unwrap();
    let user = cluster("c1", Some(("docker-ferrol-1-27-v1", "v1.27.3")));
    clusters.create(&PostParams::default(), &user).await.unwrap();

    let (code, message) = refusal(
        releases
            .delete("docker-ferrol-1-27-v1", &DeleteParams::default())
            .await,
    );
    assert_eq!(code, 400);
    assert!(
        message.contains("can't delete ClusterStackRelease as there are clusters using it")
            && message.contains("c1"),
        "{message}"
    );
    // `clusterctl move` deletes what it copied with its annotation: the Cluster lives on in the target.
    releases
        .patch(
            "docker-ferrol-1-27-v2",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"clusterctl.cluster.x-k8s.io/delete-for-move": ""}}}),
            ),
        )
        .await
        .unwrap();
    let moved = cluster("c2", Some(("docker-ferrol-1-27-v2", "v1.27.3")));
    clusters.create(&PostParams::default(), &moved).await.unwrap();
    releases
        .delete("docker-ferrol-1-27-v2", &DeleteParams::default())
        .await
        .unwrap();
    clusters.delete("c1", &DeleteParams::default()).await.unwrap();
    clusters.delete("c2", &DeleteParams::default()).await.unwrap();
    releases
        .delete("docker-ferrol-1-27-v1", &DeleteParams::default())
        .await
        .unwrap();
    webhooks.stop(&client, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_addons_must_reference_their_own_cluster() {
    let (client, ns, webhooks) = namespace_with_webhooks("adm-addon").await;
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    let addon = |name: &str, reference: Value| -> ClusterAddon {
        parse(
            json!({"apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterAddon",
                     "metadata": {"name": name}, "spec": {"clusterRef": reference}}),
        )
    };

    let (code, message) = refusal(
        addons
            .create(
                &PostParams::default(),
                &addon("machine", json!({"kind": "Machine", "name": "c1"})),
            )
            .await,
    );
    assert_eq!(code, 422);
    assert!(message.contains("spec.clusterRef.kind"), "{message}");
    let (_, message) = refusal(
        addons
            .create(
                &PostParams::default(),
                &addon(
                    "elsewhere",
                    json!({"kind": "Cluster", "name": "c1", "namespace": "other"}),
                ),
            )
            .await,
    );
    assert!(message.contains("same namespace"), "{message}");

    // Without a namespace in the reference (the Go operator refuses every later update of such an object).
    let created = addon("cluster-addon-c1", json!({"kind": "Cluster", "name": "c1"}));
    addons.create(&PostParams::default(), &created).await.unwrap();
    merge(
        &addons,
        "cluster-addon-c1",
        json!({"spec": {"hook": "BeforeClusterUpgrade"}}),
    )
    .await
    .unwrap();
    let (code, message) = refusal(
        merge(
            &addons,
            "cluster-addon-c1",
            json!({"spec": {"clusterRef": {"name": "c2"}}}),
        )
        .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("spec.clusterRef.name: field is immutable"),
        "{message}"
    );
    webhooks.stop(&client, &ns).await;
}

#[tokio::test]
async fn rollouts_are_refused_with_each_bad_field_named() {
    let (client, ns, webhooks) = namespace_with_webhooks("adm-rollout").await;
    let rollouts: Api<ClusterStackRollout> = Api::namespaced(client.clone(), &ns);
    let rollout = |name: &str, spec: Value| -> ClusterStackRollout {
        parse(
            json!({"apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStackRollout",
                     "metadata": {"name": name}, "spec": spec}),
        )
    };
    let (code, message) = refusal(
        rollouts
            .create(
                &PostParams::default(),
                &rollout(
                    "bad",
                    json!({"clusterStack": "ferrol", "version": "2", "bakeTime": "ten minutes",
                           "waves": [{"name": "canary"}, {"name": "canary"}]}),
                ),
            )
            .await,
    );
    assert_eq!(code, 422);
    for field in ["spec.version", "spec.bakeTime", "spec.waves[1].name"] {
        assert!(message.contains(field), "{field} named: {message}");
    }
    // A valid one is created; an update that breaks it is refused.
    rollouts
        .create(
            &PostParams::default(),
            &rollout(
                "good",
                json!({"clusterStack": "ferrol", "version": "v2", "waves": [{"name": "all"}]}),
            ),
        )
        .await
        .unwrap();
    let (code, message) = refusal(merge(&rollouts, "good", json!({"spec": {"waveTimeout": "soon"}})).await);
    assert_eq!(code, 422);
    assert!(message.contains("spec.waveTimeout"), "{message}");
    // Declared variable changes: any JSON value is kept as written; a value changed twice is refused.
    merge(
        &rollouts,
        "good",
        json!({"spec": {"variables": {"set": [{"name": "ports", "value": {"min": 1, "list": [2, "x"]}}]}}}),
    )
    .await
    .unwrap();
    let stored = rollouts.get("good").await.unwrap();
    assert_eq!(
        stored.spec.variables.unwrap().set[0].value,
        json!({"min": 1, "list": [2, "x"]}),
        "the value is kept whole, not pruned"
    );
    let (code, message) = refusal(
        merge(
            &rollouts,
            "good",
            json!({"spec": {"variables": {"remove": [{"name": "ports", "field": "min"}]}}}),
        )
        .await,
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("spec.variables.remove[0]") && message.contains("changed by spec.variables.set[0]"),
        "{message}"
    );
    webhooks.stop(&client, &ns).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusters_of_cluster_stacks_get_the_releases_kubernetes_version_and_one_minor_upgrades() {
    let (client, ns, webhooks) = namespace_with_webhooks("adm-cluster").await;
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), &ns);
    let release: ClusterStackRelease = parse(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStackRelease",
        "metadata": {"name": "docker-ferrol-1-27-v1"}, "spec": {}}));
    releases.create(&PostParams::default(), &release).await.unwrap();
    releases
        .patch_status(
            "docker-ferrol-1-27-v1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"kubernetesVersion": "v1.27.3"}})),
        )
        .await
        .unwrap();
    let clusters: Api<Cluster> = Api::namespaced_with(client.clone(), &ns, &Cluster::v1beta1_resource());
    let create = |c: Cluster| {
        let clusters = clusters.clone();
        async move { clusters.create(&PostParams::default(), &c).await }
    };

    // Not ours: no topology, or a class that is not a cluster stack's (the Go operator refuses the first).
    create(cluster("plain", None)).await.unwrap();
    create(cluster("odd", Some(("test-cluster-class", "v1.99.0"))))
        .await
        .unwrap();
    merge(
        &clusters,
        "plain",
        json!({"metadata": {"labels": {"touched": "yes"}}}),
    )
    .await
    .unwrap();

    let (code, message) = refusal(create(cluster("wrong", Some(("docker-ferrol-1-27-v1", "v1.27.4")))).await);
    assert_eq!(code, 422);
    assert!(
        message.contains("expects Kubernetes version v1.27.3, but got v1.27.4"),
        "{message}"
    );
    create(cluster("c1", Some(("docker-ferrol-1-27-v1", "v1.27.3"))))
        .await
        .unwrap();
    // A release that does not exist yet: allowed (with a warning), since the class may come later.
    create(cluster("early", Some(("docker-ferrol-1-27-v9", "v1.27.3"))))
        .await
        .unwrap();

    // Upgrades keep the stack and go up at most one minor, checked even though the v1.29 release is missing.
    for (class, expected) in [
        (
            "docker-ferrol-1-29-v1",
            "kubernetes version must be the same or higher by one",
        ),
        ("openstack-ferrol-1-27-v1", "provider name must not change"),
        ("docker-scs-1-27-v1", "cluster stack name must not change"),
        ("my-own-class", "its class must stay one of that stack's"),
    ] {
        let (code, message) = refusal(
            merge(
                &clusters,
                "early",
                json!({"spec": {"topology": {"class": class}}}),
            )
            .await,
        );
        assert_eq!(code, 422, "{class}: {message}");
        assert!(message.contains(expected), "{class}: {message}");
    }
    merge(
        &clusters,
        "early",
        json!({"spec": {"topology": {"class": "docker-ferrol-1-28-v1", "version": "v1.28.2"}}}),
    )
    .await
    .unwrap();
    webhooks.stop(&client, &ns).await;
}
