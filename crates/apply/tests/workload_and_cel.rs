//! Workload-cluster clients from `<cluster>-kubeconfig` Secrets, and CEL wait conditions, on a real API server.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use cso_apply::{
    WorkloadClients, WorkloadError,
    cel::{self, CelError, CelOutcome},
};
use cso_release::addon_config::{WaitCondition, WaitObject};
use k8s_openapi::{
    ByteString,
    api::{apps::v1::Deployment, core::v1::Secret},
};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

async fn setup(prefix: &str) -> (kube::Client, String) {
    let client = cso_testenv::shared_management().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, prefix).await.unwrap();
    (client, ns)
}

fn kubeconfig_secret(cluster: &str, data: Option<&str>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(format!("{cluster}-kubeconfig")),
            ..Default::default()
        },
        data: data.map(|d| BTreeMap::from([("value".to_owned(), ByteString(d.as_bytes().to_vec()))])),
        type_: Some("cluster.x-k8s.io/secret".into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn clients_come_from_the_kubeconfig_secret_and_follow_its_changes() {
    let (client, ns) = setup("workload").await;
    let clients =
        WorkloadClients::new(client.clone(), Duration::from_secs(2), Duration::from_secs(5)).unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);

    assert!(matches!(
        clients.get(&ns, "c1").await,
        Err(WorkloadError::SecretMissing { .. })
    ));
    secrets
        .create(&PostParams::default(), &kubeconfig_secret("c1", None))
        .await
        .unwrap();
    let err = clients.get(&ns, "c1").await.unwrap_err();
    assert!(
        matches!(&err, WorkloadError::SecretInvalid { reason, .. } if reason.contains("no key \"value\"")),
        "{err}"
    );

    secrets
        .create(
            &PostParams::default(),
            &kubeconfig_secret("c2", Some("this: is not [a kubeconfig")),
        )
        .await
        .unwrap();
    assert!(matches!(
        clients.get(&ns, "c2").await,
        Err(WorkloadError::SecretInvalid { .. })
    ));

    // A cluster whose API server does not answer: a clear error within the timeouts, not a hang.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let unreachable = cso_testenv::shared_management().kubeconfig_yaml().replace(
        cso_testenv::shared_management().server_url(),
        &format!("https://127.0.0.1:{closed}"),
    );
    secrets
        .create(
            &PostParams::default(),
            &kubeconfig_secret("down", Some(&unreachable)),
        )
        .await
        .unwrap();
    let down = clients.get(&ns, "down").await.unwrap();
    let started = Instant::now();
    let err = clients.ready(&down).await.unwrap_err();
    assert!(matches!(err, WorkloadError::NotReady { .. }), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "bounded by the timeouts"
    );

    let good = cso_testenv::shared_management().kubeconfig_yaml();
    secrets
        .create(&PostParams::default(), &kubeconfig_secret("up", Some(good)))
        .await
        .unwrap();
    let up = clients.get(&ns, "up").await.unwrap();
    clients.ready(&up).await.unwrap();
    let again = clients.get(&ns, "up").await.unwrap();
    assert!(
        Arc::ptr_eq(&up.discovery, &again.discovery),
        "an unchanged Secret reuses the client"
    );
    let patch = json!({"metadata": {"annotations": {"rotated": "yes"}}});
    secrets
        .patch("up-kubeconfig", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let rebuilt = clients.get(&ns, "up").await.unwrap();
    assert!(
        !Arc::ptr_eq(&up.discovery, &rebuilt.discovery),
        "a changed Secret rebuilds the client"
    );
}

fn deployment(name: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    }))
    .unwrap()
}

#[tokio::test]
async fn cel_conditions_wait_for_objects_and_hold_when_true() {
    let (client, ns) = setup("cel").await;
    let clients =
        WorkloadClients::new(client.clone(), Duration::from_secs(2), Duration::from_secs(5)).unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    secrets
        .create(
            &PostParams::default(),
            &kubeconfig_secret("w", Some(cso_testenv::shared_management().kubeconfig_yaml())),
        )
        .await
        .unwrap();
    let workload = clients.get(&ns, "w").await.unwrap();

    let object = |key: &str, name: &str| WaitObject {
        key: key.into(),
        api_version: "apps/v1".into(),
        kind: "Deployment".into(),
        name: name.into(),
        namespace: ns.clone(),
    };
    let condition = WaitCondition {
        objects: vec![
            object("msdeployment", "metrics-server"),
            object("ngnix", "cluster-addon-ngnix"),
        ],
        conditions: "msdeployment.spec.replicas == ngnix.spec.replicas".into(),
    };
    let compiled = cel::compile(&condition).unwrap();
    let outcome = compiled.evaluate(&workload.discovery).await.unwrap();
    assert!(
        matches!(&outcome, CelOutcome::Waiting(why) if why.contains("metrics-server")),
        "a missing object means not yet: {outcome:?}"
    );

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deployments
        .create(&PostParams::default(), &deployment("metrics-server", 2))
        .await
        .unwrap();
    deployments
        .create(&PostParams::default(), &deployment("cluster-addon-ngnix", 1))
        .await
        .unwrap();
    assert!(
        matches!(
            compiled.evaluate(&workload.discovery).await.unwrap(),
            CelOutcome::Waiting(_)
        ),
        "false means not yet"
    );
    deployments
        .patch(
            "cluster-addon-ngnix",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(
        compiled.evaluate(&workload.discovery).await.unwrap(),
        CelOutcome::Satisfied
    );

    let unserved = WaitCondition {
        objects: vec![WaitObject {
            key: "x".into(),
            api_version: "nowhere.example.com/v1".into(),
            kind: "Thing".into(),
            name: "t".into(),
            namespace: ns.clone(),
        }],
        conditions: "x.spec.ready".into(),
    };
    assert!(matches!(
        cel::compile(&unserved)
            .unwrap()
            .evaluate(&workload.discovery)
            .await
            .unwrap(),
        CelOutcome::Waiting(_)
    ));
    let broken = WaitCondition {
        objects: condition.objects.clone(),
        conditions: "msdeployment.spec.replicas ==".into(),
    };
    assert!(matches!(cel::compile(&broken), Err(CelError::Compile { .. })));
}
