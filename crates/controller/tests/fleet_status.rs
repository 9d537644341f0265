//! The fleet status writer on a real API server, with the operator's controllers running: 20 ClusterAddons
//! over two releases, two of them failing, are counted into the ClusterStack's status (in all and per
//! release) and into each ClusterStackRelease's; the counts follow the addons, survive the controllers' own
//! status writes, and a burst of changes is written in a round or two, without waking a reconcile. Clusters are
//! counted, not ClusterAddons: one that failed before its first install counts as failing on the release its
//! class names (statuses and `cso_clusters`), and the ClusterAddon of a deleted Cluster counts for nothing.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod support;

use std::{fmt::Debug, future::Future, sync::Arc, time::Duration};

use cso_api::{
    ClusterAddon, ClusterStack, ClusterStackRelease,
    cluster_addon::{ClusterAddonSpec, ClusterAddonStatus},
    cluster_stack::{ReleaseClusters, StackClusters},
    cluster_stack_release::ClusterCounts,
    conditions::{ConditionsExt, Severity},
};
use cso_release::source::local::LocalSource;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use support::*;

const V1: &str = "docker-ferrol-1-27-v1";
const V2: &str = "docker-ferrol-1-27-v2";

/// How long counts may take to show: the writer's 2 s debounce and a round of writes, with room to spare.
const SHOWN: Duration = Duration::from_secs(30);

fn counts(clusters: i32, ready: i32, progressing: i32, failing: &[String]) -> ClusterCounts {
    ClusterCounts {
        clusters,
        ready,
        progressing,
        failing: i32::try_from(failing.len()).unwrap(),
        failing_clusters: failing.to_vec(),
    }
}

/// Polls `read` until it returns `expected`, for at most [`SHOWN`]; panics with what it last saw.
async fn until_shown<T, F, Fut>(what: &str, expected: &T, mut read: F)
where
    T: PartialEq + Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    let deadline = tokio::time::Instant::now() + SHOWN;
    loop {
        let seen = read().await;
        if seen == *expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not shown within {SHOWN:?}\nexpected: {expected:#?}\nlast seen: {seen:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn stack_counts(stacks: &Api<ClusterStack>) -> Option<StackClusters> {
    stacks.get("ferrol").await.unwrap().status?.clusters
}

async fn release_counts(releases: &Api<ClusterStackRelease>, name: &str) -> Option<ClusterCounts> {
    releases.get(name).await.unwrap().status?.clusters
}

/// Sets the status of ClusterAddon `name`: ready, failing (a Warning condition) or progressing.
async fn set_state(addons: &Api<ClusterAddon>, name: &str, ready: bool, failing: bool) {
    let mut shown = ClusterAddon::new(name, Default::default());
    shown.status = Some(ClusterAddonStatus {
        ready,
        ..Default::default()
    });
    if failing {
        shown.mark_false(
            "HelmChartApplied",
            "FailedToApplyObjects",
            Severity::Warning,
            "admission webhook denied",
        );
    }
    let conditions = shown
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    addons
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": ready, "conditions": conditions}})),
        )
        .await
        .unwrap();
}

/// The value of the metric line that starts with `series` (summed over lines that do), 0 if none.
fn metric(text: &str, series: &str) -> u64 {
    text.lines()
        .filter(|line| line.starts_with(series))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Which field managers own `status.clusters` of `object`.
fn owners_of_counts(object: &impl ResourceExt) -> Vec<String> {
    object
        .managed_fields()
        .iter()
        .filter(|entry| {
            entry
                .fields_v1
                .as_ref()
                .and_then(|f| f.0.pointer("/f:status/f:clusters"))
                .is_some()
        })
        .filter_map(|entry| entry.manager.clone())
        .collect()
}

/// Changes label `touched` of `api`'s object `name` (a change beyond the status: its controller reconciles).
async fn touch<K>(api: &Api<K>, name: &str, value: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + Debug,
{
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"touched": value}}})),
    )
    .await
    .unwrap();
}

async fn reconciles(metrics: &cso_controller::Metrics) -> (u64, u64) {
    let text = metrics.encode();
    (
        metric(
            &text,
            r#"controller_runtime_reconcile_total{controller="clusterstack","#,
        ),
        metric(
            &text,
            r#"controller_runtime_reconcile_total{controller="clusterstackrelease","#,
        ),
    )
}

/// Waits until no ClusterStack or ClusterStackRelease reconcile has run for 3 s.
async fn settled(metrics: &cso_controller::Metrics) -> (u64, u64) {
    let mut last = reconciles(metrics).await;
    let mut quiet = 0;
    for _ in 0..120 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = reconciles(metrics).await;
        quiet = if now == last { quiet + 1 } else { 0 };
        last = now;
        if quiet == 6 {
            return last;
        }
    }
    panic!("the reconciles never settled: {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_counts_are_written_into_the_stack_and_release_statuses() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "fleet-status").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    local_releases(dir.path(), &[V1, V2]);
    let source = Arc::new(LocalSource::new(dir.path().join("cluster-stacks")));
    let (operator, renderer) = operator(&client, &ns, dir.path(), source, |_| {});
    let metrics = operator.metrics.clone();
    let running = RunningOperator::run(operator, renderer).await;

    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1", "v2"])).await;
    ready_release(&client, &ns, V1).await;
    ready_release(&client, &ns, V2).await;
    let stacks: Api<ClusterStack> = Api::namespaced(client.clone(), &ns);
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), &ns);
    // Releases no Cluster is on show zeros.
    until_shown("zero counts on v1", &Some(counts(0, 0, 0, &[])), || {
        release_counts(&releases, V1)
    })
    .await;

    let addons = create_addons(&client, &ns).await;
    let failing = |names: &[&str]| -> Vec<String> { names.iter().map(|n| format!("{ns}/{n}")).collect() };
    let v1 = counts(12, 12, 0, &[]);
    let v2 = counts(8, 6, 0, &failing(&["c18", "c19"]));
    let expected = StackClusters {
        total: counts(20, 18, 0, &failing(&["c18", "c19"])),
        releases: vec![
            ReleaseClusters {
                release: V1.into(),
                counts: v1.clone(),
            },
            ReleaseClusters {
                release: V2.into(),
                counts: v2.clone(),
            },
        ],
    };
    until_shown("the ClusterStack's counts", &Some(expected), || {
        stack_counts(&stacks)
    })
    .await;
    until_shown("v1's counts", &Some(v1.clone()), || release_counts(&releases, V1)).await;
    until_shown("v2's counts", &Some(v2), || release_counts(&releases, V2)).await;

    // One failing Cluster's addons become ready: the counts follow.
    set_state(&addons, "cluster-addon-c18", true, false).await;
    let v2 = counts(8, 7, 0, &failing(&["c19"]));
    let expected = StackClusters {
        total: counts(20, 19, 0, &failing(&["c19"])),
        releases: vec![
            ReleaseClusters {
                release: V1.into(),
                counts: v1.clone(),
            },
            ReleaseClusters {
                release: V2.into(),
                counts: v2.clone(),
            },
        ],
    };
    until_shown(
        "the ClusterStack's counts after c18 recovered",
        &Some(expected.clone()),
        || stack_counts(&stacks),
    )
    .await;
    until_shown("v2's counts after c18 recovered", &Some(v2.clone()), || {
        release_counts(&releases, V2)
    })
    .await;

    // The controllers' own status writes neither drop the counts nor take them over. Each writes only a
    // status that differs from its decision: spoil a field of each, then wake each by a label.
    for (field, name) in [("latestRelease", "ferrol"), ("kubernetesVersion", V2)] {
        let patch = Patch::Merge(json!({"status": {field: "spoilt"}}));
        if name == "ferrol" {
            stacks
                .patch_status(name, &PatchParams::default(), &patch)
                .await
                .unwrap();
            touch(&stacks, name, "1").await;
        } else {
            releases
                .patch_status(name, &PatchParams::default(), &patch)
                .await
                .unwrap();
            touch(&releases, name, "1").await;
        }
    }
    let stack = eventually(
        "the ClusterStack's controller rewrote its status",
        SHOWN,
        || async {
            let stack = stacks.get("ferrol").await.unwrap();
            (stack.status.as_ref()?.latest_release != "spoilt").then_some(stack)
        },
    )
    .await;
    assert_eq!(stack.status.as_ref().unwrap().clusters.as_ref(), Some(&expected));
    assert_eq!(owners_of_counts(&stack), ["cso-fleet"]);
    let release = eventually("v2's controller rewrote its status", SHOWN, || async {
        let release = releases.get(V2).await.unwrap();
        (release.status.as_ref()?.kubernetes_version != "spoilt").then_some(release)
    })
    .await;
    assert_eq!(release.status.as_ref().unwrap().clusters.as_ref(), Some(&v2));
    assert_eq!(owners_of_counts(&release), ["cso-fleet"]);

    // A burst of 20 changes (every Cluster's addons progressing again) is written in a round or two, and
    // the writes wake no reconcile of a ClusterStack or ClusterStackRelease.
    let before = settled(&metrics).await;
    let writes = |kind: &str| {
        metric(
            &metrics.encode(),
            &format!(r#"cso_fleet_status_writes_total{{kind="{kind}"}}"#),
        )
    };
    let (stack_writes, release_writes) = (writes("ClusterStack"), writes("ClusterStackRelease"));
    for i in 0..20 {
        set_state(&addons, &format!("cluster-addon-c{i:02}"), false, false).await;
    }
    let expected = StackClusters {
        total: counts(20, 0, 20, &[]),
        releases: vec![
            ReleaseClusters {
                release: V1.into(),
                counts: counts(12, 0, 12, &[]),
            },
            ReleaseClusters {
                release: V2.into(),
                counts: counts(8, 0, 8, &[]),
            },
        ],
    };
    until_shown(
        "the ClusterStack's counts after the burst",
        &Some(expected),
        || stack_counts(&stacks),
    )
    .await;
    // Whatever round was still to come has come.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (stack_writes, release_writes) = (
        writes("ClusterStack") - stack_writes,
        writes("ClusterStackRelease") - release_writes,
    );
    assert!(
        (1..=3).contains(&stack_writes),
        "the ClusterStack's counts were written {stack_writes} times for a burst of 20 changes"
    );
    assert!(
        (2..=6).contains(&release_writes),
        "two ClusterStackReleases' counts were written {release_writes} times for a burst of 20 changes"
    );
    assert_eq!(
        reconciles(&metrics).await,
        before,
        "(ClusterStack, ClusterStackRelease) reconciles: the counts' writes woke a controller"
    );

    // A Cluster whose first install failed (its ClusterAddon on no release yet, a Warning condition) counts
    // as failing on the release its class names; the ClusterAddon of a deleted Cluster counts for nothing,
    // although it is still there (no garbage collector runs here).
    create_paused_cluster(&client, &ns, "c20", V2).await;
    let mut broken = ClusterAddon::new("cluster-addon-c20", ClusterAddonSpec::default());
    broken
        .annotations_mut()
        .insert("cluster.x-k8s.io/paused".into(), String::new());
    addons.create(&PostParams::default(), &broken).await.unwrap();
    set_state(&addons, "cluster-addon-c20", false, true).await;
    dynamic(&client, &ns, &capi("Cluster"))
        .delete("c00", &Default::default())
        .await
        .unwrap();
    let v1 = counts(11, 0, 11, &[]);
    let v2 = counts(9, 0, 8, &failing(&["c20"]));
    until_shown("v1's counts without the deleted Cluster", &Some(v1), || {
        release_counts(&releases, V1)
    })
    .await;
    until_shown("v2's counts with the failed first install", &Some(v2), || {
        release_counts(&releases, V2)
    })
    .await;
    until_shown(
        "the ClusterStack's total",
        &Some(counts(20, 0, 19, &failing(&["c20"]))),
        || async { stack_counts(&stacks).await.map(|s| s.total) },
    )
    .await;
    assert!(addons.get_opt("cluster-addon-c00").await.unwrap().is_some());
    let text = metrics.encode();
    let gauge = |release: &str, state: &str| {
        metric(
            &text,
            &format!(r#"cso_clusters{{stack="docker-ferrol-1-27",release="{release}",state="{state}"}}"#),
        )
    };
    assert_eq!(gauge(V2, "failing"), 1, "{text}");
    assert_eq!(gauge(V1, "progressing"), 11, "{text}");
    running.stop().await;
}

/// A Cluster `name` of the class `class`, paused (no controller acts on it).
async fn create_paused_cluster(client: &Client, ns: &str, name: &str, class: &str) {
    let cluster: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"name": name, "namespace": ns, "annotations": {"cluster.x-k8s.io/paused": ""}},
        "spec": {"topology": {"class": class, "version": "v1.27.3"}},
    }))
    .unwrap();
    dynamic(client, ns, &capi("Cluster"))
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
}

/// 20 Clusters and their ClusterAddons, paused (their controllers leave them alone): `c00`..`c11` on v1
/// and ready, `c12`..`c17` on v2 and ready, `c18` and `c19` on v2 and failing.
async fn create_addons(client: &Client, ns: &str) -> Api<ClusterAddon> {
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), ns);
    for i in 0..20 {
        let (release, failing) = match i {
            0..12 => (V1, false),
            12..18 => (V2, false),
            _ => (V2, true),
        };
        create_paused_cluster(client, ns, &format!("c{i:02}"), release).await;
        let name = format!("cluster-addon-c{i:02}");
        let mut addon = ClusterAddon::new(
            &name,
            ClusterAddonSpec {
                cluster_stack: release.into(),
                ..Default::default()
            },
        );
        addon
            .annotations_mut()
            .insert("cluster.x-k8s.io/paused".into(), String::new());
        addons.create(&PostParams::default(), &addon).await.unwrap();
        set_state(&addons, &name, !failing, failing).await;
    }
    addons
}
