//! Shards of Clusters across `cso run` processes (issue 18), as they run in production: the default shard, two
//! replicas of shard `a` and one of shard `b`, all electing leaders (each shard its own Lease), 30 Clusters
//! labelled `a`, `b` and none. Every Cluster's addons become ready and each leader counts only its own
//! Clusters; the leader of `a` is killed and its standby takes over and converges an upgrade of an `a` Cluster;
//! a Cluster relabelled from `a` to `b` is upgraded by `b`; with no replica of `b` left, its Clusters are
//! reported by the default shard.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{path::PathBuf, time::Duration};

use cso_api::{
    ClusterAddon, ClusterStack,
    conditions::{ConditionStatus, ConditionsExt},
    names::{condition, reason},
    shard::SHARD_LABEL,
};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

mod support;

use support::*;

const V1: &str = "docker-ferrol-1-27-v1";
const V2: &str = "docker-ferrol-1-27-v2";
const CLUSTERS: usize = 30;
const PHASE: Duration = Duration::from_secs(180);

/// The shard of the `i`th Cluster: `a`, `b` and the default shard in turn.
fn shard_of(i: usize) -> Option<&'static str> {
    [Some("a"), Some("b"), None][i % 3]
}

/// One `cso run` process of a shard (`None`: the default shard), with its log and metrics port.
struct Replica {
    process: KillOnDrop,
    log: PathBuf,
    metrics_port: u16,
    hook_port: u16,
}

/// The answer of the hook server on `port` to `BeforeClusterUpgrade` for Cluster `cluster`, staying on
/// `class` (nothing to wait for once its addons are applied).
async fn before_upgrade(
    https: &reqwest::Client,
    port: u16,
    namespace: &str,
    cluster: &str,
    class: &str,
) -> serde_json::Value {
    https
        .post(format!(
            "https://127.0.0.1:{port}/hooks.runtime.cluster.x-k8s.io/v1alpha1/beforeclusterupgrade/before-cluster-upgrade"
        ))
        .json(&json!({
            "apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": "BeforeClusterUpgradeRequest",
            "cluster": {"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
                        "metadata": {"name": cluster, "namespace": namespace},
                        "spec": {"topology": {"class": class, "version": "v1.27.3"}}},
            "fromKubernetesVersion": "v1.27.3", "toKubernetesVersion": "v1.27.4",
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_split_the_fleet_fail_over_hand_over_and_report_a_shard_without_replicas() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "shards").await.unwrap();
    let fake = github_with_ferrol().await;
    let scratch = tempfile::Builder::new().prefix("cso-shards").tempdir().unwrap();
    let certs = scratch.path().join("certs");
    let ca = cso_testenv::pki::write_serving_certificate(&certs).unwrap();
    let tools = cso_testenv::Tools::discover().unwrap();
    // Every Cluster's addons carry the same endpoint, so the Clusters that share a workload cluster apply the
    // same objects there; the two that are upgraded have one of their own.
    let shared = cso_testenv::shared_workload();
    let upgraded = [
        cso_testenv::ControlPlane::start(&tools, "shards-a-0", None)
            .await
            .unwrap(),
        cso_testenv::ControlPlane::start(&tools, "shards-a-1", None)
            .await
            .unwrap(),
    ];

    let start = |name: &str, shard: Option<&str>| {
        let instance = Instance::new(&certs, true);
        let release_dir = scratch.path().join(name).join("releases");
        std::fs::create_dir_all(&release_dir).unwrap();
        let log = scratch.path().join(format!("{name}.log"));
        let shard_flag = shard.map(|s| format!("--shard={s}"));
        let mut flags = vec!["--shard-grace=3s"];
        flags.extend(shard_flag.as_deref());
        let process = start_operator_with(
            plane.kubeconfig_path(),
            &release_dir,
            Some(&ns),
            &Source::Github(fake.api_url()),
            &log,
            &instance,
            &flags,
        );
        Replica {
            process,
            log,
            metrics_port: instance.metrics_port,
            hook_port: instance.hook_port,
        }
    };
    let default_shard = start("default", None);
    let mut a_first = start("a-first", Some("a"));
    let mut a_second = start("a-second", Some("a"));
    let mut b = start("b", Some("b"));
    for (replica, what) in [(&default_shard, "the default shard leads"), (&b, "shard b leads")] {
        wait_for(what, PHASE, || async {
            logged(&replica.log, "became the leader").map(drop)
        })
        .await;
    }
    let (a_leader, a_standby) = wait_for("shard a leads", PHASE, || async {
        match (
            logged(&a_first.log, "became the leader"),
            logged(&a_second.log, "became the leader"),
        ) {
            (Some(_), _) => Some((0, 1)),
            (_, Some(_)) => Some((1, 0)),
            _ => None,
        }
    })
    .await;

    Api::<ClusterStack>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &ferrol_stack(&ns, &["v1", "v2"]))
        .await
        .unwrap();
    wait_for("both releases ready", PHASE, || async {
        (ready(&client, &ns).await.len() == 2).then_some(())
    })
    .await;

    let clusters = v1beta1_clusters(&client, &ns);
    for i in 0..CLUSTERS {
        let name = format!("c-{i}");
        let workload = match i {
            0 => &upgraded[0],
            3 => &upgraded[1],
            _ => shared,
        };
        cso_testenv::kubeconfig_secret(&client, &ns, &name, workload.kubeconfig_yaml())
            .await
            .unwrap();
        let labels = shard_of(i).map(|s| json!({SHARD_LABEL: s})).unwrap_or(json!({}));
        let cluster = shared_endpoint_cluster(&ns, &name, V1, labels);
        clusters.create(&PostParams::default(), &cluster).await.unwrap();
    }

    // All ready, each ClusterAddon labelled as its Cluster, each leader with its own ten.
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    wait_for("every Cluster's addons ready", PHASE, || async {
        (ready_addons(&addons, V1).await == CLUSTERS).then_some(())
    })
    .await;
    for addon in addons.list(&ListParams::default()).await.unwrap().items {
        let cluster = addon.cluster_name();
        let i: usize = cluster.trim_start_matches("c-").parse().unwrap();
        assert_eq!(
            addon.labels().get(SHARD_LABEL).map(String::as_str),
            shard_of(i),
            "{cluster}'s ClusterAddon carries its shard"
        );
    }
    let a_logs = [a_first.log.clone(), a_second.log.clone()];
    let a_metrics = [a_first.metrics_port, a_second.metrics_port];
    for (port, shard) in [
        (default_shard.metrics_port, "default"),
        (a_metrics[a_leader], "a"),
        (b.metrics_port, "b"),
    ] {
        let metrics = metrics_text(port).await;
        assert_eq!(
            metric_sum(&metrics, "cso_shard_clusters", &[&format!("shard=\"{shard}\"")]),
            10.0,
            "{shard}: {metrics}"
        );
        assert!(
            metric_sum(
                &metrics,
                "controller_runtime_reconcile_total",
                &["controller=\"clusteraddon\""]
            ) > 0.0,
            "{shard} reconciles"
        );
    }
    assert!(
        logged(&a_logs[a_standby], "controllers started").is_none(),
        "a standby runs no controllers"
    );
    assert!(
        logged(&b.log, "controllers started").is_some(),
        "the log line the standby check relies on is there"
    );

    // A hook about an `a` Cluster gets the same answer from every replica of every shard: it comes from the
    // ClusterAddon, read from the API server, not from a shard's caches.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let https = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
        .build()
        .unwrap();
    let a_hooks = [a_first.hook_port, a_second.hook_port];
    let from_owner = before_upgrade(&https, a_hooks[a_leader], &ns, "c-6", V1).await;
    assert_eq!(from_owner["status"], "Success", "{from_owner}");
    for port in [b.hook_port, a_hooks[a_standby], default_shard.hook_port] {
        assert_eq!(before_upgrade(&https, port, &ns, "c-6", V1).await, from_owner);
    }

    // The leader of `a` dies; its standby takes over and converges an upgrade of an `a` Cluster.
    let leader = if a_leader == 0 {
        &mut a_first
    } else {
        &mut a_second
    };
    leader.process.0.kill().unwrap();
    leader.process.0.wait().unwrap();
    clusters
        .patch(
            "c-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"topology": {"class": V2}}})),
        )
        .await
        .unwrap();
    wait_for(
        "the standby of a leads",
        Duration::from_secs(LEASE_SECONDS * 2 + 10),
        || async { logged(&a_logs[a_standby], "became the leader").map(drop) },
    )
    .await;
    wait_for("c-0 upgraded under a's new leader", PHASE, || async {
        addons
            .get_opt("cluster-addon-c-0")
            .await
            .unwrap()
            .filter(|a| a.spec.cluster_stack == V2 && a.status.as_ref().is_some_and(|s| s.ready))
    })
    .await;

    // c-3 moves from `a` to `b` and to v2: `b` upgrades it, and its ClusterAddon is `b`'s.
    clusters
        .patch(
            "c-3",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {SHARD_LABEL: "b"}}, "spec": {"topology": {"class": V2}}}),
            ),
        )
        .await
        .unwrap();
    wait_for("c-3 upgraded by b", PHASE, || async {
        addons.get_opt("cluster-addon-c-3").await.unwrap().filter(|a| {
            a.spec.cluster_stack == V2
                && a.status.as_ref().is_some_and(|s| s.ready)
                && a.labels().get(SHARD_LABEL).map(String::as_str) == Some("b")
        })
    })
    .await;
    let mentions_c3 = |l: &serde_json::Value| {
        l["context"]
            .as_str()
            .is_some_and(|c| c.contains("cluster-addon-c-3"))
    };
    assert!(log_lines(&b.log).iter().any(mentions_c3), "b reconciled c-3");
    // `a` (alive) handed it over from its own reconcile, and did nothing else to it after that. A reconcile
    // queued while the hand-over ran may start before `a`'s watch has seen the new label: it finds the Cluster
    // in `b` again and writes the same label (a no-op), which is all it may do. Its requests log at debug
    // from the HTTP client's crates (tower, hyper); what the operator itself does logs from its own (`cso_*`:
    // every pass of a ClusterAddon ends with "pass concluded").
    let a_lines = log_lines(&a_logs[a_standby]);
    let operators_own = |l: &serde_json::Value| l["logger"].as_str().is_some_and(|g| g.starts_with("cso"));
    let hands_over_c3 = |l: &serde_json::Value| {
        l["message"] == "ClusterAddon moved to the shard of its Cluster"
            && l["cluster_addon"] == "cluster-addon-c-3"
    };
    let handed_over = a_lines.iter().position(hands_over_c3).expect("a handed c-3 over");
    let after: Vec<_> = a_lines[handed_over + 1..]
        .iter()
        .filter(|l| mentions_c3(l) && operators_own(l) && !hands_over_c3(l))
        .collect();
    assert!(after.is_empty(), "a touched c-3 after handing it over: {after:?}");

    // No replica of `b` any more: after the grace period, the default shard reports its eleven Clusters.
    assert_eq!(terminate(&mut b.process).code(), Some(0));
    let unattended = wait_for("b reported by the default shard", PHASE, || async {
        let metrics = metrics_text(default_shard.metrics_port).await;
        let count = metric_sum(&metrics, "cso_unattended_clusters", &["shard=\"b\""]);
        (count == 11.0).then_some(count)
    })
    .await;
    assert_eq!(unattended, 11.0);
    wait_for("b's ClusterAddons marked", PHASE, || async {
        let marked = addons
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|a| a.labels().get(SHARD_LABEL).map(String::as_str) == Some("b"))
            .filter(|a| {
                a.get_condition(condition::SHARD_RECONCILING).is_some_and(|c| {
                    c.status == ConditionStatus::False
                        && c.reason.as_deref() == Some(reason::NO_SHARD_REPLICA)
                })
            })
            .count();
        (marked == 11).then_some(())
    })
    .await;
    drop((default_shard, a_first, a_second));
}
