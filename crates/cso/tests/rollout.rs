//! A ClusterStackRollout end to end (issue 30): `cso run` as a process, the real Cluster API v1.14 with the
//! providers' stand-in, six Clusters of ferrol v1 whose addons go to a real workload kube-apiserver, moved to
//! v2 in three waves (canary: 1, early: 2 at a time, late: the rest).
//!
//! One Cluster of the second wave reaches its workload cluster through a proxy that is cut before the
//! rollout starts: its addons cannot be applied, so it is not done within the wave timeout, and the rollout
//! pauses with a condition (and the `cso_rollout_paused` metric) naming it; the third wave stays on v1. When
//! the proxy is restored, its addons land, the wave bakes, the third wave moves and the rollout completes.
//! Deleted, the rollout is gone at once and leaves every Cluster where it is.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{collections::BTreeMap, process::Command, time::Duration};

use cso_api::{
    ClusterAddon, ClusterStack, ClusterStackRollout,
    cluster_stack_rollout::phase,
    conditions::{ConditionStatus, ConditionsExt},
    names::{condition, reason},
};
use cso_testenv::{
    capi::{TopologyCluster, shared_management_with_cluster_api},
    stand_in::{StandIn, Workload},
};
use kube::{
    Api, Client,
    api::{DynamicObject, PostParams},
    core::ApiResource,
};
use serde_json::json;

mod support;

use cso_testenv::proxy::ApiProxy;
use support::*;

const LIMIT: Duration = Duration::from_secs(240);
const V1: &str = "docker-ferrol-1-27-v1";
const V2: &str = "docker-ferrol-1-27-v2";
/// The Clusters and their rings; `c3` is the one whose workload cluster becomes unreachable.
const CLUSTERS: [(&str, &str); 6] = [
    ("c1", "canary"),
    ("c2", "early"),
    ("c3", "early"),
    ("c4", ""),
    ("c5", ""),
    ("c6", ""),
];

fn clusters_api(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        namespace,
        &ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
            "cluster.x-k8s.io",
            "v1beta2",
            "Cluster",
        )),
    )
}

/// The class each Cluster is on, by name.
async fn classes(client: &Client, namespace: &str) -> BTreeMap<String, String> {
    clusters_api(client, namespace)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|c| {
            let class = c
                .data
                .pointer("/spec/topology/classRef/name")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_owned();
            (c.metadata.name.unwrap_or_default(), class)
        })
        .collect()
}

/// The Clusters whose ClusterAddon is ready with the addons of `class`.
async fn addons_on(client: &Client, namespace: &str, class: &str) -> Vec<String> {
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), namespace);
    let mut names: Vec<String> = addons_ready_on(&addons, class)
        .await
        .into_iter()
        .map(|a| a.spec.cluster_ref.name.unwrap_or_default())
        .collect();
    names.sort();
    names
}

async fn rollout(client: &Client, namespace: &str) -> ClusterStackRollout {
    Api::<ClusterStackRollout>::namespaced(client.clone(), namespace)
        .get("ferrol-v2")
        .await
        .unwrap()
}

/// What `cso ARGS --kubeconfig=KUBECONFIG` prints; it must succeed.
fn cso(args: &[&str], kubeconfig: &std::path::Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_cso"))
        .args(args)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "cso {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    eprintln!("{text}");
    text
}

fn names(of: &[&str]) -> Vec<String> {
    of.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_clusters_move_in_three_waves_pausing_on_an_unreachable_one_until_it_recovers() {
    let env = shared_management_with_cluster_api();
    let client = env.control_plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "rollout").await.unwrap();
    let tools = cso_testenv::Tools::discover().unwrap();
    let workload_plane = cso_testenv::ControlPlane::start(&tools, "rollout-workload", None)
        .await
        .unwrap();
    let mut proxy = ApiProxy::start(workload_plane.server_url()).await.unwrap();
    let direct = Workload {
        kubeconfig: workload_plane.kubeconfig_yaml().to_owned(),
        server_url: workload_plane.server_url().to_owned(),
    };
    let through_proxy = Workload {
        kubeconfig: direct
            .kubeconfig
            .replace(workload_plane.server_url(), &proxy.url()),
        server_url: proxy.url(),
    };
    let stand_in = StandIn::start(client.clone(), direct);
    stand_in.assign(&ns, "c3", through_proxy);

    let github = github_with_ferrol().await;
    let work = tempfile::Builder::new().prefix("cso-rollout").tempdir().unwrap();
    let certs = work.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    cso_testenv::pki::write_serving_certificate(&certs).unwrap();
    let instance = Instance::new(&certs, false);
    let log = work.path().join("operator.log");
    eprintln!("operator log: {}", log.display());
    let release_dir = work.path().join("releases");
    std::fs::create_dir_all(&release_dir).unwrap();
    let _operator = start_operator_with(
        env.control_plane.kubeconfig_path(),
        &release_dir,
        Some(&ns),
        &Source::Github(github.api_url()),
        &log,
        &instance,
        &[],
    );

    Api::<ClusterStack>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &ferrol_stack(&ns, &["v1", "v2"]))
        .await
        .unwrap();
    wait_for_every(
        "ferrol v1 and v2 ready",
        LIMIT,
        Duration::from_millis(500),
        || async { (ready(&client, &ns).await == [V1, V2]).then_some(()) },
    )
    .await;

    // Six Clusters of v1, built by Cluster API, their addons applied (c3's through the proxy).
    for (name, ring) in CLUSTERS {
        let mut cluster = TopologyCluster {
            namespace: &ns,
            name,
            api_version: "cluster.x-k8s.io/v1beta2",
            class: V1,
            class_namespace: None,
            version: "v1.27.3",
            worker_class: "workeramd64",
            worker_replicas: 0,
            image_repository: Some("registry.k8s.io"),
        }
        .to_json();
        if !ring.is_empty() {
            cluster["metadata"]["labels"] = json!({"ring": ring});
        }
        clusters_api(&client, &ns)
            .create(&PostParams::default(), &serde_json::from_value(cluster).unwrap())
            .await
            .unwrap_or_else(|e| panic!("Cluster API refused Cluster {name}: {e}"));
    }
    let all = names(&["c1", "c2", "c3", "c4", "c5", "c6"]);
    wait_for_every(
        "the addons of v1 ready on all six Clusters",
        LIMIT,
        Duration::from_millis(500),
        || async { (addons_on(&client, &ns, V1).await == all).then_some(()) },
    )
    .await;

    // c3's workload cluster becomes unreachable; then the rollout.
    proxy.cut();
    let rollout_object: ClusterStackRollout = serde_json::from_value(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStackRollout",
        "metadata": {"name": "ferrol-v2", "namespace": ns},
        "spec": {
            "clusterStack": "ferrol", "version": "v2",
            "waves": [
                {"name": "canary", "clusterSelector": {"matchLabels": {"ring": "canary"}}},
                {"name": "early", "clusterSelector": {"matchLabels": {"ring": "early"}}, "maxInProgress": 2},
                {"name": "late"}
            ],
            "bakeTime": "3s", "waveTimeout": "20s"
        }
    }))
    .unwrap();
    Api::<ClusterStackRollout>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &rollout_object)
        .await
        .unwrap();

    // Paused on c3, named with why; the canary and c2 moved and done; the late wave untouched.
    let paused = wait_for_every(
        "the rollout paused on c3",
        LIMIT,
        Duration::from_millis(500),
        || async {
            let r = rollout(&client, &ns).await;
            let status = r.status.clone()?;
            (status.phase == phase::PAUSED).then_some(r)
        },
    )
    .await;
    let status = paused.status.clone().unwrap();
    eprintln!("paused: {}", serde_json::to_string_pretty(&status).unwrap());
    let healthy = status.get_condition(condition::CLUSTERS_HEALTHY).unwrap();
    assert_eq!(healthy.status, ConditionStatus::False);
    assert_eq!(healthy.reason.as_deref(), Some(reason::WAVE_FAILING));
    let message = healthy.message.clone().unwrap_or_default();
    assert!(message.contains(&format!("{ns}/c3: ")), "{message}");
    assert_eq!(status.current_wave, "early");
    let early = &status.waves[1];
    assert_eq!(
        (early.clusters, early.moved, early.done, early.failing),
        (2, 2, 1, 1),
        "{early:?}"
    );
    assert_eq!(early.failing_clusters[0].cluster, format!("{ns}/c3"));
    assert_eq!((status.waves[2].clusters, status.waves[2].moved), (3, 0));
    let metrics = metrics_text(instance.metrics_port).await;
    assert_eq!(
        metric_sum(
            &metrics,
            "cso_rollout_paused",
            &["reason=\"WaveFailing\"", &format!("rollout=\"{ns}/ferrol-v2\"")]
        ),
        1.0,
        "{metrics}"
    );
    let on = classes(&client, &ns).await;
    assert_eq!(
        on.values().map(String::as_str).collect::<Vec<_>>(),
        [V2, V2, V2, V1, V1, V1],
        "the late wave stays on v1: {on:?}"
    );
    assert_eq!(addons_on(&client, &ns, V2).await, names(&["c1", "c2"]));
    // Still paused a while later: nothing of the late wave moves.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let on = classes(&client, &ns).await;
    assert_eq!(on["c4"], V1);
    assert_eq!(rollout(&client, &ns).await.status.unwrap().phase, phase::PAUSED);
    // `cso rollout status` says the same.
    let text = cso(
        &["rollout", "status", "ferrol-v2", "-n", &ns],
        env.control_plane.kubeconfig_path(),
    );
    assert!(text.contains("Paused, wave early"), "{text}");
    assert!(text.contains(&format!("  {ns}/c3 (wave early): ")), "{text}");

    // c3 recovers: the rollout goes on and completes.
    proxy.restore().await.unwrap();
    let completed = wait_for_every(
        "the rollout completed",
        LIMIT,
        Duration::from_millis(500),
        || async {
            let r = rollout(&client, &ns).await;
            (r.status.as_ref()?.phase == phase::COMPLETED).then_some(r)
        },
    )
    .await;
    let status = completed.status.unwrap();
    eprintln!("completed: {}", serde_json::to_string_pretty(&status).unwrap());
    assert_eq!((status.clusters, status.done, status.failing), (6, 6, 0));
    assert!(status.is_condition_true(condition::CLUSTERS_HEALTHY));
    assert_eq!(addons_on(&client, &ns, V2).await, all);
    assert!(classes(&client, &ns).await.values().all(|c| c == V2));
    let text = metrics_text(instance.metrics_port).await;
    assert_eq!(metric_sum(&text, "cso_rollout_paused", &[]), 0.0);
    assert_eq!(
        metric_sum(&text, "cso_rollout_moves_total", &["result=\"moved\""]),
        6.0,
        "{text}"
    );
    // `cso status` ends with the rollout.
    let text = cso(&["status", "-n", &ns], env.control_plane.kubeconfig_path());
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("{ns}/ferrol-v2")))
        .unwrap_or_else(|| panic!("no rollout line in cso status: {text}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cells[1..], [V2, "Completed", "6/6", "0"], "{line}");

    // Deleting the rollout stops it and changes nothing: gone at once (no finalizer), every Cluster where it was.
    let rollouts: Api<ClusterStackRollout> = Api::namespaced(client.clone(), &ns);
    rollouts.delete("ferrol-v2", &Default::default()).await.unwrap();
    assert!(rollouts.get_opt("ferrol-v2").await.unwrap().is_none());
    assert!(classes(&client, &ns).await.values().all(|c| c == V2));
    drop(stand_in);
}
