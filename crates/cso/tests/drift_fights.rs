//! Drift fights as a new user met them (issue 33): 50 Clusters whose kubeconfig Secrets point at ONE workload
//! API server, each rendering metrics-server with its own `domain` label (the ferrol v1 addon values take it
//! from `.Cluster.spec.controlPlaneEndpoint.host`), `cso run --resync-interval=20s --addon-health-checks=false`.
//! Every ClusterAddon is reconciled and ready within a bound; the fight over the shared objects is reported;
//! a minute later the operator's CPU and the API server's write rate are back near idle.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::time::{Duration, Instant};

use cso_api::{
    ClusterAddon, ClusterStack,
    conditions::ConditionsExt,
    names::{condition, reason},
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::{DynamicObject, ListParams, PostParams},
    core::GroupVersionKind,
    discovery::ApiResource,
};
use serde_json::json;

mod support;

use support::*;

const CLUSTERS: usize = 50;
const V1: &str = "docker-ferrol-1-27-v1";
/// Every ClusterAddon reconciled (a status, ready) this soon after the Clusters were made: the bound.
const ALL_RECONCILED: Duration = Duration::from_secs(120);
const LIMIT: Duration = Duration::from_secs(180);

/// CPU seconds `pid` used so far (user and system), from `/proc/<pid>/stat`.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command (which may hold spaces) start after its closing parenthesis.
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // In clock ticks of 100 Hz (USER_HZ on Linux).
    ticks / 100.0
}

/// The workload API server's resourceVersion (its etcd revision): it moves by one per write.
async fn revision(workload: &Client) -> f64 {
    let list = Api::<ConfigMap>::all(workload.clone())
        .list_metadata(&ListParams::default().limit(1))
        .await
        .unwrap();
    list.metadata.resource_version.unwrap().parse().unwrap()
}

/// Over `window`: the operator's CPU (a share of one core), the workload API server's writes a second and
/// the operator's ClusterAddon reconciles a second.
async fn rates(pid: u32, workload: &Client, metrics_port: u16, window: Duration) -> (f64, f64, f64) {
    let reconciles = |text: &str| {
        metric_sum(
            text,
            "controller_runtime_reconcile_total",
            &["controller=\"clusteraddon\""],
        )
    };
    let (cpu, rv, done, started) = (
        cpu_seconds(pid),
        revision(workload).await,
        reconciles(&metrics_text(metrics_port).await),
        Instant::now(),
    );
    tokio::time::sleep(window).await;
    let took = started.elapsed().as_secs_f64();
    (
        (cpu_seconds(pid) - cpu) / took,
        (revision(workload).await - rv) / took,
        (reconciles(&metrics_text(metrics_port).await) - done) / took,
    )
}

/// [`wait_for`] at a pace that leaves the API servers and the operator alone (a list of 50 ClusterAddons
/// every 20 ms would be a load of its own).
async fn poll<T, F, Fut>(what: &str, limit: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    wait_for_every(what, limit, Duration::from_millis(500), check).await
}

fn fighting(addon: &ClusterAddon) -> bool {
    addon
        .get_condition(condition::DRIFT_SETTLED)
        .is_some_and(|c| c.reason.as_deref() == Some(reason::DRIFT_FIGHT))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_clusters_on_one_api_server_are_all_reconciled_and_their_fight_settles_near_idle() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "fights").await.unwrap();
    let fake = github_with_ferrol().await;
    let scratch = tempfile::Builder::new().prefix("cso-fights").tempdir().unwrap();
    let certs = scratch.path().join("certs");
    cso_testenv::pki::write_serving_certificate(&certs).unwrap();
    let tools = cso_testenv::Tools::discover().unwrap();
    let shared = cso_testenv::ControlPlane::start(&tools, "fights-one", None)
        .await
        .unwrap();
    let workload = shared.client().await.unwrap();
    let release_dir = scratch.path().join("releases");
    std::fs::create_dir_all(&release_dir).unwrap();
    let log = scratch.path().join("cso.log");
    let instance = Instance::new(&certs, false);
    let operator = start_operator_with(
        plane.kubeconfig_path(),
        &release_dir,
        Some(&ns),
        &Source::Github(fake.api_url()),
        &log,
        &instance,
        &["--resync-interval=20s", "--addon-health-checks=false"],
    );
    let pid = operator.0.id();

    Api::<ClusterStack>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &ferrol_stack(&ns, &["v1"]))
        .await
        .unwrap();
    poll("the release ready", LIMIT, || async {
        (ready(&client, &ns).await.len() == 1).then_some(())
    })
    .await;

    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta1", "Cluster")),
    );
    let made = Instant::now();
    for i in 0..CLUSTERS {
        let name = format!("c-{i}");
        cso_testenv::kubeconfig_secret(&client, &ns, &name, shared.kubeconfig_yaml())
            .await
            .unwrap();
        let cluster: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
            "metadata": {"name": name, "namespace": ns},
            "spec": {
                "topology": {"class": V1, "version": "v1.27.3"},
                "controlPlaneEndpoint": {"host": format!("{name}.example.test"), "port": 6443},
            },
        }))
        .unwrap();
        clusters.create(&PostParams::default(), &cluster).await.unwrap();
    }

    // Fairness: every ClusterAddon reconciled and ready (applied; with the fight reported or not), none left
    // behind by the others' fight.
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    let (reconciled, ready) = loop {
        let items = addons.list(&ListParams::default()).await.unwrap().items;
        let ready = items
            .iter()
            .filter(|a| a.status.as_ref().is_some_and(|s| s.ready))
            .count();
        if ready == CLUSTERS || made.elapsed() > ALL_RECONCILED {
            break (made.elapsed(), ready);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!(
        "{ready} of {CLUSTERS} ClusterAddons reconciled and ready {reconciled:?} after the Clusters were made"
    );

    // The fight is reported; the objects in it are counted.
    let reported = poll("the fight reported", LIMIT, || async {
        let gauge = metric_sum(
            &metrics_text(instance.metrics_port).await,
            "cso_drift_fights",
            &[],
        );
        let items = addons.list(&ListParams::default()).await.unwrap().items;
        (gauge > 0.0 && items.iter().any(fighting))
            .then(|| (gauge, items.iter().filter(|a| fighting(a)).count()))
    })
    .await;
    let reported_at = made.elapsed();
    println!(
        "reported {reported_at:?} after the Clusters were made: {} objects in a fight, on {} ClusterAddons",
        reported.0, reported.1
    );
    let fight = rates(pid, &workload, instance.metrics_port, Duration::from_secs(10)).await;
    println!(
        "right after: operator CPU {:.3}, workload writes/s {:.1}, reconciles/s {:.1}",
        fight.0, fight.1, fight.2
    );

    // A minute after the report: near idle.
    tokio::time::sleep(Duration::from_secs(45)).await;
    let settled = rates(pid, &workload, instance.metrics_port, Duration::from_secs(20)).await;
    println!(
        "a minute after: operator CPU {:.3}, workload writes/s {:.1}, reconciles/s {:.1}",
        settled.0, settled.1, settled.2
    );
    let text = metrics_text(instance.metrics_port).await;
    println!(
        "corrections {}, objects in a fight {}, ClusterAddon reconciles {}",
        metric_sum(
            &text,
            "cso_objects_drift_corrected_total",
            &["target=\"workload\""]
        ),
        metric_sum(&text, "cso_drift_fights", &[]),
        metric_sum(
            &text,
            "controller_runtime_reconcile_total",
            &["controller=\"clusteraddon\""]
        ),
    );
    assert_eq!(
        ready, CLUSTERS,
        "every ClusterAddon reconciled and ready within {ALL_RECONCILED:?}"
    );
    assert!(
        settled.1 < 5.0,
        "the fight's writes settle near idle (each fought object put back once per hold of 20 s): {:.1}/s",
        settled.1
    );
    assert!(
        settled.0 < 0.25,
        "the operator's CPU settles near idle: {:.3} of a core",
        settled.0
    );
    let items = addons.list(&ListParams::default()).await.unwrap().items;
    assert!(items.iter().all(|a| a.status.as_ref().is_some_and(|s| s.ready)));
    let message = items
        .iter()
        .find_map(|a| a.get_condition(condition::DRIFT_SETTLED)?.message.clone())
        .unwrap();
    assert!(
        message.contains("cluster-stack-operator") && message.contains("same API server"),
        "names the shared API server as the likely cause: {message}"
    );
    drop(operator);
    shared.stop();
}
