//! Health gates on workload clusters that run workloads (kube-apiserver, kube-controller-manager,
//! kube-scheduler and kwok's simulated nodes and pods): a ClusterAddon is ready once what it applied runs, not
//! once it was applied; a stage whose Deployment can never be scheduled holds the next stage and the upgrade
//! until the per-stage timeout and says which object does not run and why; addons that stop running are
//! reported at the next periodic pass.
//!
//! The simulated pods have no network: an APIService served by one of them can never become Available (the
//! API server's dial of its Service fails on this machine: `cso_testenv::egress`). The ferrol release keeps
//! metrics-server's APIService as released: where a test needs the addons ready, the APIService is annotated
//! not to be judged (`clusterstack.x-k8s.io/skip-health-check`, through the chart's own
//! `apiService.annotations`) and the test checks that it was applied and found not Available; in the upgrade
//! test it is judged, reported by the health gate beside the Deployment, and the wait ends at the timeout.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod support;

use std::time::Duration;

use cso_api::{
    ClusterAddon,
    conditions::{ConditionStatus, ConditionsExt},
    names::{condition, reason},
};
use k8s_openapi::{
    api::{
        apps::v1::{DaemonSet, Deployment},
        core::v1::{ConfigMap, Pod},
    },
    kube_aggregator::pkg::apis::apiregistration::v1::APIService,
};
use kube::{Api, ResourceExt, api::ListParams};
use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferrol_addons_are_ready_once_they_run_and_degraded_when_a_node_stops() {
    let client = cso_testenv::shared_management().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "health-ferrol").await.unwrap();
    let own = running_workload_plane("health-ferrol", 2).await;
    let workload = own.control_plane.client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    ferrol_v1_with_values(
        dir.path(),
        r#"values: |
  metrics-server:
    apiService:
      annotations:
        clusterstack.x-k8s.io/skip-health-check: "true"
    commonLabels:
      domain: "{{ .Cluster.spec.controlPlaneEndpoint.host }}"
      clusterAddonVersion: "v1"
"#,
    );
    let operator = RunningOperator::local_with(&client, &ns, dir.path(), |s| {
        s.addon_health_checks = true;
        s.resync_interval = Duration::from_secs(5);
    })
    .await;
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1"])).await;
    ready_release(&client, &ns, "docker-ferrol-1-27-v1").await;
    cso_testenv::kubeconfig_secret(&client, &ns, "c1", own.control_plane.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(&client, &ns, "c1", "docker-ferrol-1-27-v1").await;
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    let installed = addon_where(&addons, "c1", "cluster-addon-c1 ready", CONVERGE, ready).await;

    // Ready means running: what the addons applied runs as their ready status is seen.
    let deployments: Api<Deployment> = Api::namespaced(workload.clone(), "kube-system");
    let metrics_server = deployments.get("metrics-server").await.unwrap();
    let status = metrics_server.status.clone().unwrap_or_default();
    let available = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Available" && c.status == "True");
    assert!(
        available,
        "metrics-server is Available when its ClusterAddon is ready: {status:?}"
    );
    assert_eq!(status.updated_replicas, metrics_server.spec.unwrap().replicas);
    let daemon_sets: Api<DaemonSet> = Api::namespaced(workload.clone(), "kube-system");
    let kindnet = daemon_sets.get("kindnet").await.unwrap().status.unwrap();
    assert_eq!(
        (kindnet.desired_number_scheduled, kindnet.number_ready),
        (2, 2),
        "{kindnet:?}"
    );
    let pods: Api<Pod> = Api::namespaced(workload.clone(), "kube-system");
    let running: Vec<(String, String)> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .map(|p| (p.name_any(), p.spec.and_then(|s| s.node_name).unwrap_or_default()))
        .collect();
    assert!(
        running
            .iter()
            .any(|(pod, node)| pod.starts_with("metrics-server-") && node.starts_with("health-ferrol-node-")),
        "metrics-server runs on a simulated node: {running:?}"
    );
    assert_eq!(
        health_of(&installed).map(|(status, ..)| status),
        Some(ConditionStatus::True)
    );
    // ... and it was found running only once it did: not before the Deployment became Available.
    let became_available = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Available")
        .and_then(|c| c.last_transition_time.clone())
        .unwrap()
        .0;
    let found_running = installed
        .get_condition(condition::ADDONS_HEALTHY)
        .unwrap()
        .last_transition_time;
    assert!(
        found_running.timestamp() >= became_available.as_second(),
        "AddonsHealthy True at {found_running}, metrics-server Available at {became_available}"
    );
    // metrics-server's APIService was applied as released; the API server's check of it fails on this machine.
    let api_service = eventually(
        "the APIService checked by the workload API server",
        Duration::from_secs(60),
        || async {
            let api_services: Api<APIService> = Api::all(workload.clone());
            let checked = api_services.get("v1beta1.metrics.k8s.io").await.ok()?;
            let available = checked
                .status
                .and_then(|s| s.conditions)
                .into_iter()
                .flatten()
                .find(|c| c.type_ == "Available")?;
            (available.reason.as_deref() == Some("FailedDiscoveryCheck")).then_some(available)
        },
    )
    .await;
    assert_eq!(api_service.status, "False");
    assert!(
        api_service
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("no route to host"),
        "{api_service:?}"
    );

    // The simulated kubelets stop (kwok is paused: no node Lease is renewed, and after the node monitor's
    // grace period kube-controller-manager marks the nodes and their pods not ready): the next periodic pass
    // finds the addons degraded.
    let (_, kwok) = own
        .runtime
        .pids()
        .into_iter()
        .find(|(component, _)| *component == cso_testenv::workloads::Component::Kwok)
        .unwrap();
    let paused = std::process::Command::new("kill")
        .args(["-STOP", &kwok.to_string()])
        .status()
        .unwrap();
    assert!(paused.success());
    eventually(
        "kindnet's pods on the stopped nodes are no longer ready",
        Duration::from_secs(120),
        || async {
            let status = daemon_sets.get("kindnet").await.unwrap().status.unwrap();
            (status.number_ready < 2).then_some(status)
        },
    )
    .await;
    let degraded = addon_where(
        &addons,
        "c1",
        "cluster-addon-c1 degraded",
        Duration::from_secs(120),
        |a| health_of(a).is_some_and(|(_, why, _)| why == reason::DEGRADED),
    )
    .await;
    assert!(!ready(&degraded), "degraded addons are not ready");
    let (_, _, message) = health_of(&degraded).unwrap();
    assert!(
        message.contains("DaemonSet kube-system/kindnet") || message.contains("Deployment kube-system/"),
        "the message names what no longer runs: {message}"
    );
    assert!(
        !events_with(&client, &ns, "AddonsDegraded").await.is_empty(),
        "an AddonsDegraded event"
    );
    operator.stop().await;
    own.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_that_cannot_be_scheduled_holds_the_next_stage_and_the_upgrade_until_the_timeout() {
    let client = cso_testenv::shared_management().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "health-stages").await.unwrap();
    let own = running_workload_plane("health-stages", 1).await;
    let workload = own.control_plane.client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let base = chart("base");
    let web = chart("web");
    let after = chart("after");
    let config_map =
        |name: &str| format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata: {{}}\n");
    let base_cm = config_map("base");
    let after_cm = config_map("after-web");
    let unschedulable = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 1\n  \
        selector:\n    matchLabels: {app: web}\n  template:\n    metadata:\n      labels: {app: web}\n    spec:\n      \
        nodeSelector: {cso.test/pool: nowhere}\n      containers:\n      - {name: web, image: nginx}\n";
    let files = [
        (base.0.as_str(), base.1.as_str()),
        ("base/templates/cm.yaml", base_cm.as_str()),
        (web.0.as_str(), web.1.as_str()),
        ("web/templates/deployment.yaml", unschedulable),
        (after.0.as_str(), after.1.as_str()),
        ("after/templates/cm.yaml", after_cm.as_str()),
    ];
    let acpi = "  AfterControlPlaneInitialized:\n    - {name: base, action: apply}\n";
    staged_release_of(
        dir.path(),
        "v1",
        &format!("apiVersion: clusteraddonconfig.x-k8s.io/v1alpha1\naddonStages:\n{acpi}"),
        &files,
    );
    staged_release_of(
        dir.path(),
        "v2",
        &format!(
            "apiVersion: clusteraddonconfig.x-k8s.io/v1alpha1\naddonStages:\n{acpi}  BeforeClusterUpgrade:\n    - {{name: web, action: apply}}\n    - {{name: after, action: apply}}\n"
        ),
        &files,
    );
    let stage_timeout = Duration::from_secs(40);
    let operator = RunningOperator::local_with(&client, &ns, dir.path(), |s| {
        s.addon_health_checks = true;
        s.stage_timeout = stage_timeout;
    })
    .await;
    let mut spec = ferrol_spec(&["v1", "v2"]);
    spec["name"] = json!("staged");
    create_stack(&client, &ns, "staged", spec).await;
    cso_testenv::kubeconfig_secret(&client, &ns, "c2", own.control_plane.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(&client, &ns, "c2", "docker-staged-1-27-v1").await;
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    addon_where(&addons, "c2", "v1 installed and ready", CONVERGE, |a| {
        ready(a) && a.spec.cluster_stack == "docker-staged-1-27-v1"
    })
    .await;

    // The upgrade: its first stage applies a Deployment no node can take.
    move_cluster(&client, &ns, "c2", "docker-staged-1-27-v2").await;
    let started = std::time::Instant::now();
    let waiting = addon_where(
        &addons,
        "c2",
        "the web stage waits for its Deployment and says why, from its status",
        CONVERGE,
        // (Its first look may find the Deployment not yet observed by its controller: then it says that.)
        |a| {
            health_of(a).is_some_and(|(_, why, message)| {
                why == reason::WAITING_FOR_HEALTH && message.contains("Deployment kube-system/web: 0 of 1")
            })
        },
    )
    .await;
    let (_, _, message) = health_of(&waiting).unwrap();
    assert!(message.contains("Deployment kube-system/web"), "{message}");
    assert!(
        message.contains("0 of 1"),
        "the reason, from the Deployment's status: {message}"
    );
    assert!(!ready(&waiting));
    let pods: Api<Pod> = Api::namespaced(workload.clone(), "kube-system");
    let web_pod = eventually("the web pod is found unschedulable", CONVERGE, || async {
        pods.list(&ListParams::default().labels("app=web"))
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| {
                        c.iter().any(|c| {
                            c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable")
                        })
                    })
            })
    })
    .await;
    assert_eq!(web_pod.status.unwrap().phase.as_deref(), Some("Pending"));

    // Until the stage timeout: the next stage never starts and the upgrade is held.
    let config_maps: Api<ConfigMap> = Api::namespaced(workload.clone(), "kube-system");
    let hold = cso_webhook::hooks::Call {
        hook: cso_api::rules::Hook::BeforeClusterUpgrade,
        class: cso_api::ReleaseId::parse_cluster_class("docker-staged-1-27-v2").unwrap(),
        kubernetes_version: "v1.27.7".into(),
    };
    while started.elapsed() < stage_timeout - Duration::from_secs(10) {
        assert!(
            config_maps.get_opt("after-web").await.unwrap().is_none(),
            "the stage after web started while web does not run"
        );
        let addon = addons.get("cluster-addon-c2").await.unwrap();
        let answer = cso_webhook::hooks::decide(&addon, &hold);
        assert!(
            !matches!(
                answer,
                cso_webhook::hooks::Step::Answer(cso_webhook::hooks::Outcome::Done)
            ),
            "BeforeClusterUpgrade is held while web does not run: {answer:?}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    // Given up at the timeout: reported with the objects, the next stage runs and the upgrade goes on; the
    // addons are not ready, for they do not run.
    let given_up = addon_where(
        &addons,
        "c2",
        "the upgrade given up on web",
        Duration::from_secs(90),
        |a| a.spec.cluster_stack == "docker-staged-1-27-v2" && a.spec.hook.is_empty(),
    )
    .await;
    assert!(
        config_maps.get_opt("after-web").await.unwrap().is_some(),
        "the next stage ran"
    );
    let (status, why, message) = health_of(&given_up).unwrap();
    assert_eq!(
        (status, why.as_str()),
        (ConditionStatus::False, reason::NOT_HEALTHY_IN_TIME)
    );
    assert!(message.contains("Deployment kube-system/web"), "{message}");
    assert!(!ready(&given_up), "ready means running");
    assert_eq!(
        cso_webhook::hooks::decide(&given_up, &hold),
        cso_webhook::hooks::Step::Answer(cso_webhook::hooks::Outcome::Done),
        "the upgrade goes on once web was given up"
    );
    for expected in ["AddonsNotHealthy", "StageTimedOut"] {
        assert!(
            !events_with(&client, &ns, expected).await.is_empty(),
            "a {expected} event"
        );
    }
    operator.stop().await;
    own.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_chart_upgrade_that_does_not_run_holds_before_cluster_upgrade_until_the_timeout() {
    let client = cso_testenv::shared_management().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "health-upgrade").await.unwrap();
    let own = running_workload_plane("health-upgrade", 1).await;
    let dir = tempfile::tempdir().unwrap();
    local_releases(dir.path(), &["docker-ferrol-1-27-v1", "docker-ferrol-1-27-v2"]);
    // v1 runs (its APIService, never Available on simulated pods, is not judged); v2's metrics-server can be
    // scheduled nowhere and its APIService is judged.
    let not_judged =
        "\n    apiService:\n      annotations:\n        clusterstack.x-k8s.io/skip-health-check: \"true\"";
    for (version, extra) in [
        ("v1", not_judged),
        ("v2", "\n    nodeSelector:\n      cso.test/pool: nowhere"),
    ] {
        std::fs::write(
            dir.path()
                .join(format!("cluster-stacks/docker-ferrol-1-27-{version}/cluster-addon-values.yaml")),
            format!(
                "values: |\n  metrics-server:{extra}\n    commonLabels:\n      clusterAddonVersion: \"{version}\"\n"
            ),
        )
        .unwrap();
    }
    let stage_timeout = Duration::from_secs(30);
    let operator = RunningOperator::local_with(&client, &ns, dir.path(), |s| {
        s.addon_health_checks = true;
        s.stage_timeout = stage_timeout;
    })
    .await;
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1", "v2"])).await;
    cso_testenv::kubeconfig_secret(&client, &ns, "c3", own.control_plane.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(&client, &ns, "c3", "docker-ferrol-1-27-v1").await;
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    addon_where(&addons, "c3", "v1 ready", CONVERGE, |a| {
        ready(a) && a.spec.cluster_stack == "docker-ferrol-1-27-v1"
    })
    .await;

    move_cluster(&client, &ns, "c3", "docker-ferrol-1-27-v2").await;
    let before_upgrade = cso_webhook::hooks::Call {
        hook: cso_api::rules::Hook::BeforeClusterUpgrade,
        class: cso_api::ReleaseId::parse_cluster_class("docker-ferrol-1-27-v2").unwrap(),
        kubernetes_version: "v1.27.3".into(),
    };
    let waiting = addon_where(&addons, "c3", "v2 applied and waited for", CONVERGE, |a| {
        a.spec.cluster_stack == "docker-ferrol-1-27-v2"
            && health_of(a).is_some_and(|(_, why, _)| why == reason::WAITING_FOR_HEALTH)
    })
    .await;
    let started = std::time::Instant::now();
    let (_, _, message) = health_of(&waiting).unwrap();
    assert!(
        message.contains("Deployment kube-system/metrics-server"),
        "{message}"
    );
    eventually(
        "the health gate names the APIService too",
        Duration::from_secs(60),
        || async {
            let addon = addons.get("cluster-addon-c3").await.ok()?;
            let (_, _, message) = health_of(&addon)?;
            message
                .contains("APIService v1beta1.metrics.k8s.io")
                .then_some(message)
        },
    )
    .await;
    while started.elapsed() < stage_timeout - Duration::from_secs(8) {
        let addon = addons.get("cluster-addon-c3").await.unwrap();
        match cso_webhook::hooks::decide(&addon, &before_upgrade) {
            cso_webhook::hooks::Step::Answer(cso_webhook::hooks::Outcome::Retry(why)) => {
                assert!(why.contains("metrics-server"), "{why}");
            }
            other => {
                panic!(
                    "BeforeClusterUpgrade is held, starting nothing, while v2 does not run: {other:?} ({:?}, {:?})",
                    addon.spec, addon.status
                )
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let given_up = addon_where(&addons, "c3", "waiting given up", Duration::from_secs(60), |a| {
        health_of(a).is_some_and(|(_, why, _)| why == reason::NOT_HEALTHY_IN_TIME)
    })
    .await;
    assert!(!ready(&given_up));
    assert_eq!(
        cso_webhook::hooks::decide(&given_up, &before_upgrade),
        cso_webhook::hooks::Step::Answer(cso_webhook::hooks::Outcome::Done),
        "the upgrade goes on once waiting was given up"
    );
    assert!(!events_with(&client, &ns, "AddonsNotHealthy").await.is_empty());
    operator.stop().await;
    own.stop();
}

/// The truth after a fault: the addons' metrics-server Deployment deleted and put back seven times (its hold
/// grown to 64 s), then, a moment later, the workload API server cut off for 30 s with the Deployment deleted
/// behind the cut. Once the server answers again, the deletion is put back at once (it came long after the
/// last correction: no fighting writer answers that late) and the ClusterAddon is ready again within seconds,
/// with the resync at its default (5 minutes). (Before: the object waited for the end of its hold, 64 s after
/// the last correction.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_corrections_and_a_cut_the_addons_are_ready_again_within_seconds() {
    let client = cso_testenv::shared_management().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "health-cut").await.unwrap();
    let own = running_workload_plane("health-cut", 1).await;
    let workload = own.control_plane.client().await.unwrap();
    let mut proxy = cso_testenv::proxy::ApiProxy::start(own.control_plane.server_url())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    ferrol_v1_with_values(
        dir.path(),
        r#"values: |
  metrics-server:
    apiService:
      annotations:
        clusterstack.x-k8s.io/skip-health-check: "true"
"#,
    );
    let operator = RunningOperator::local_with(&client, &ns, dir.path(), |s| {
        s.addon_health_checks = true;
    })
    .await;
    assert_eq!(
        cso_controller::Settings::default().resync_interval,
        Duration::from_secs(300),
        "the default resync, which the recovery must not wait for"
    );
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1"])).await;
    ready_release(&client, &ns, "docker-ferrol-1-27-v1").await;
    let proxied = own
        .control_plane
        .kubeconfig_yaml()
        .replace(own.control_plane.server_url(), &proxy.url());
    cso_testenv::kubeconfig_secret(&client, &ns, "c1", &proxied)
        .await
        .unwrap();
    create_cluster(&client, &ns, "c1", "docker-ferrol-1-27-v1").await;
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    addon_where(&addons, "c1", "cluster-addon-c1 ready", CONVERGE, ready).await;

    // A history of corrections: deleted as soon as it is back, seven times (holds of 1, 2, 4, ... 64 s).
    let deployments: Api<Deployment> = Api::namespaced(workload.clone(), "kube-system");
    let back = |uid: String| {
        let deployments = deployments.clone();
        async move {
            eventually("metrics-server put back", Duration::from_secs(90), || async {
                deployments
                    .get_opt("metrics-server")
                    .await
                    .unwrap()
                    .filter(|d| d.uid().as_deref() != Some(uid.as_str()))
            })
            .await
        }
    };
    let mut current = deployments.get("metrics-server").await.unwrap();
    for _ in 0..7 {
        deployments
            .delete("metrics-server", &Default::default())
            .await
            .unwrap();
        current = back(current.uid().unwrap()).await;
    }
    // The fight as its condition says it (written after the correction it counts).
    addon_where(
        &addons,
        "c1",
        "the corrections made a fight with a 64 s hold",
        Duration::from_secs(20),
        |a| {
            a.get_condition(condition::DRIFT_SETTLED).is_some_and(|c| {
                c.message
                    .as_deref()
                    .is_some_and(|m| m.contains("put back 7 times, now at most every 64s"))
            })
        },
    )
    .await;

    // A moment later: cut off for 30 s, the Deployment deleted behind the cut.
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.cut();
    deployments
        .delete("metrics-server", &Default::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    proxy.restore().await.unwrap();
    let restored = std::time::Instant::now();
    back(current.uid().unwrap()).await;
    let put_back = restored.elapsed();
    addon_where(
        &addons,
        "c1",
        "ready again after the cut",
        Duration::from_secs(60),
        |a| ready(a) && a.is_condition_true(condition::ADDONS_HEALTHY),
    )
    .await;
    let ready_again = restored.elapsed();
    println!("after the cut: put back after {put_back:?}, ready after {ready_again:?}");
    assert!(
        put_back < Duration::from_secs(15),
        "put back within seconds of the restore, not at its hold's end (64 s after the last correction): {put_back:?}"
    );
    assert!(
        ready_again < Duration::from_secs(30),
        "ready again within seconds of the restore, not at the resync: {ready_again:?}"
    );
    operator.stop().await;
    own.stop();
}
