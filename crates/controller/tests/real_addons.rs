//! Health gates on real nodes (containerd, kubelet, kube-proxy: `cso_testenv::node`): an addon whose pods cannot
//! run is reported with the pod and the kubelet's reason, and is not ready while it cannot; it recovers by itself
//! once what it lacked is there. A container that keeps exiting is never taken for running, even in the moments
//! after each start when its pod is Ready (`--addon-settle-time`). The ferrol
//! stack's addons run from the images `make tools` builds; kindnet is the workload cluster's pod network, as in a
//! cluster Cluster API built.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod support;

use std::time::Duration;

use cso_api::{ClusterAddon, conditions::ConditionStatus, names::reason};
use cso_testenv::node::{PodNetwork, RealCluster, archive_image_name, substitute_image};
use kube::Api;
use serde_json::json;
use support::*;

/// A workload cluster of `nodes` real nodes with the pod network `network`, the `images` imported.
async fn real_workload(
    name: &str,
    nodes: usize,
    network: PodNetwork,
    images: &[&std::path::Path],
) -> RealCluster {
    let tools = cso_testenv::Tools::discover().unwrap();
    if let Err(why) = RealCluster::support(&tools) {
        panic!("real nodes cannot run on this machine: {why}");
    }
    let cluster = RealCluster::start_with(&tools, name, None, nodes, network)
        .await
        .unwrap();
    for image in images {
        cluster.import_image(image).unwrap();
    }
    cluster
}

/// A tool of `make tools`, or a failed test saying which is missing.
fn built(image: &Option<std::path::PathBuf>, what: &str) -> std::path::PathBuf {
    cso_testenv::tools::built(image, what).unwrap_or_else(|why| panic!("{why}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_addon_whose_image_is_missing_is_named_with_its_pod_and_reason_and_recovers_once_it_is_there() {
    let tools = cso_testenv::Tools::discover().unwrap();
    let kindnetd = built(&tools.kindnetd_image, "the kindnetd image");
    let metrics_server = built(&tools.metrics_server_image, "the metrics-server image");
    let web = built(&tools.web_image, "the cso.test/web image");
    // Everything of ferrol v1 but metrics-server's image.
    let own = real_workload("missing-image", 1, PodNetwork::Addon, &[&kindnetd, &web]).await;
    let workload = own.control_plane.client().await.unwrap();
    substitute_image(
        &workload,
        "web-for-nginx",
        &["nginx"],
        &archive_image_name(&web).unwrap(),
    )
    .await
    .unwrap();
    let client = cso_testenv::shared_management().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "real-missing").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    local_releases(dir.path(), &["docker-ferrol-1-27-v1"]);
    let stage_timeout = Duration::from_secs(45);
    let source = std::sync::Arc::new(cso_release::source::local::LocalSource::new(
        dir.path().join("cluster-stacks"),
    ));
    let (operator, renderer) = support::operator(&client, &ns, dir.path(), source, |s| {
        s.addon_health_checks = true;
        s.resync_interval = Duration::from_secs(5);
        s.stage_timeout = stage_timeout;
    });
    let metrics = operator.metrics.clone();
    let operator = RunningOperator::run(operator, renderer).await;
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1"])).await;
    ready_release(&client, &ns, "docker-ferrol-1-27-v1").await;
    cso_testenv::kubeconfig_secret(&client, &ns, "c1", own.control_plane.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(&client, &ns, "c1", "docker-ferrol-1-27-v1").await;
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);

    // The kubelet cannot pull metrics-server's image (no registry is reachable): the ClusterAddon names the pod
    // and the kubelet's reason, and is not ready.
    let pulling = addon_where(
        &addons,
        "c1",
        "the health gate names metrics-server's pod and why it does not run",
        Duration::from_secs(180),
        |a| {
            health_of(a).is_some_and(|(_, _, message)| {
                message.contains("pod kube-system/metrics-server-")
                    && (message.contains("ImagePullBackOff") || message.contains("ErrImagePull"))
            })
        },
    )
    .await;
    let (status, why, message) = health_of(&pulling).unwrap();
    assert_eq!(status, ConditionStatus::False, "{message}");
    assert!(
        why == reason::WAITING_FOR_HEALTH || why == reason::NOT_HEALTHY_IN_TIME,
        "{why}: {message}"
    );
    assert!(
        message.contains("Deployment kube-system/metrics-server"),
        "{message}"
    );
    assert!(message.contains("container metrics-server"), "{message}");
    assert!(!ready(&pulling));
    // Past the stage timeout it is given up on (NotHealthyInTime), and the series the CsoAddonsNotRunning
    // alert sums says so.
    let given_up = addon_where(&addons, "c1", "waiting given up", Duration::from_secs(120), |a| {
        health_of(a).is_some_and(|(_, why, _)| why == reason::NOT_HEALTHY_IN_TIME)
    })
    .await;
    assert!(!ready(&given_up));
    eventually(
        "the alert's series counts the Cluster",
        Duration::from_secs(30),
        || async {
            let text = metrics.encode();
            (counter(
                &text,
                "cso_addons_not_running",
                &["release=\"docker-ferrol-1-27-v1\"", "reason=\"NotHealthyInTime\""],
            ) == 1.0)
                .then_some(())
        },
    )
    .await;

    // The image arrives: the kubelet's next try pulls nothing and starts it; the ClusterAddon becomes ready
    // without anyone touching it, with the APIService served from the pod Available.
    eprintln!("missing image: {message}");
    own.import_image(&metrics_server).unwrap();
    let imported = std::time::Instant::now();
    let recovered = addon_where(
        &addons,
        "c1",
        "cluster-addon-c1 ready once metrics-server runs",
        Duration::from_secs(420),
        ready,
    )
    .await;
    assert_eq!(
        health_of(&recovered).map(|(status, ..)| status),
        Some(ConditionStatus::True)
    );
    let api_services: Api<k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService> =
        Api::all(workload.clone());
    let available = api_services
        .get("v1beta1.metrics.k8s.io")
        .await
        .unwrap()
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Available" && c.status == "True");
    assert!(available, "ready means metrics-server's APIService is served");
    eprintln!("missing image: ready {:.1?} after the import", imported.elapsed());
    operator.stop().await;
    own.stop();
}

/// A Deployment `agent` of one busybox pod that runs `script`.
fn agent(image: &str, script: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: agent\nspec:\n  replicas: 1\n  \
         selector:\n    matchLabels: {{app: agent}}\n  template:\n    metadata:\n      labels: {{app: agent}}\n    \
         spec:\n      terminationGracePeriodSeconds: 1\n      containers:\n      - name: agent\n        \
         image: {image}\n        imagePullPolicy: IfNotPresent\n        command: [sh, -c, {script:?}]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_whose_container_exits_is_named_with_its_restarts_and_never_ready() {
    let tools = cso_testenv::Tools::discover().unwrap();
    let busybox = built(&tools.busybox_image, "the busybox test image");
    let own = real_workload("crash-loop", 1, PodNetwork::Environment, &[&busybox]).await;
    let image = archive_image_name(&busybox).unwrap();
    let client = cso_testenv::shared_management().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "real-crash").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (chart_file, chart_text) = chart("agent");
    let runs = agent(&image, "echo running; exec sleep 3600");
    let exits = agent(
        &image,
        "echo the new version runs a moment, then fails; sleep 4; exit 1",
    );
    let acpi = "  AfterControlPlaneInitialized:\n    - {name: agent, action: apply}\n";
    staged_release_of(
        dir.path(),
        "v1",
        &format!("apiVersion: clusteraddonconfig.x-k8s.io/v1alpha1\naddonStages:\n{acpi}"),
        &[
            (&chart_file, &chart_text),
            ("agent/templates/deployment.yaml", &runs),
        ],
    );
    staged_release_of(
        dir.path(),
        "v2",
        &format!(
            "apiVersion: clusteraddonconfig.x-k8s.io/v1alpha1\naddonStages:\n{acpi}  BeforeClusterUpgrade:\n    - {{name: agent, action: apply}}\n"
        ),
        &[
            (&chart_file, &chart_text),
            ("agent/templates/deployment.yaml", &exits),
        ],
    );
    let operator = RunningOperator::local_with(&client, &ns, dir.path(), |s| {
        s.addon_health_checks = true;
        s.addon_settle_time = cso_controller::Settings::default().addon_settle_time;
        s.resync_interval = Duration::from_secs(5);
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
    addon_where(
        &addons,
        "c2",
        "v1 runs and is ready",
        Duration::from_secs(180),
        |a| ready(a) && a.spec.cluster_stack == "docker-staged-1-27-v1",
    )
    .await;

    // v2's container runs 4 s, then exits 1: the kubelet restarts it with a growing back-off, and after each
    // start the pod is Ready for those seconds (no readiness probe), long enough for its Deployment to be
    // available and the old pod to go. The ClusterAddon names the pod, the reason and the restarts, and is
    // never taken for ready on v2: watched through three restarts. (With `--addon-settle-time=0s` it was
    // ready on v2 within 31 s.)
    move_cluster(&client, &ns, "c2", "docker-staged-1-27-v2").await;
    let crash_seen = std::sync::atomic::AtomicBool::new(false);
    let watched = std::time::Instant::now();
    let restarts = eventually(
        "three restarts of the crash-looping container, never ready",
        Duration::from_secs(240),
        || async {
            let addon = addons
                .get(&cso_api::cluster_addon::cluster_addon_name("c2"))
                .await
                .unwrap();
            assert!(
                !(ready(&addon) && addon.spec.cluster_stack == "docker-staged-1-27-v2"),
                "a release whose container keeps exiting was taken for ready: {:?}",
                health_of(&addon)
            );
            if let Some((status, _, message)) = health_of(&addon)
                && status == ConditionStatus::False
                && message.contains("pod kube-system/agent-")
                && message.contains("restart")
            {
                crash_seen.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            let pods: Api<k8s_openapi::api::core::v1::Pod> =
                Api::namespaced(own.control_plane.client().await.unwrap(), "kube-system");
            let restarts: i32 = pods
                .list(&kube::api::ListParams::default().labels("app=agent"))
                .await
                .unwrap()
                .items
                .iter()
                .flat_map(|p| {
                    p.status
                        .iter()
                        .flat_map(|s| s.container_statuses.iter().flatten())
                })
                .map(|c| c.restart_count)
                .max()
                .unwrap_or(0);
            (restarts >= 3 && watched.elapsed() >= Duration::from_secs(60)).then_some(restarts)
        },
    )
    .await;
    assert!(
        crash_seen.load(std::sync::atomic::Ordering::Relaxed),
        "the health gate named the crash-looping pod with its restarts"
    );
    eprintln!(
        "crash loop: {restarts} restarts in {:?}, never ready",
        watched.elapsed()
    );
    operator.stop().await;
    own.stop();
}
