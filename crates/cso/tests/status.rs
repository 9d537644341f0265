//! `cso status` as a process against a real API server: 20 ClusterAddons over two releases, two of them
//! failing, are counted per release, the failing Clusters named.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

use std::process::Command;

use cso_api::{
    ClusterAddon,
    cluster_addon::{ClusterAddonSpec, ClusterAddonStatus},
    conditions::{ConditionsExt, Severity},
};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

#[tokio::test]
async fn the_fleet_is_counted_per_release_with_the_failing_clusters_named() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "status").await.unwrap();
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    for i in 0..20 {
        let (class, failing) = match i {
            0..12 => ("docker-ferrol-1-27-v1", false),
            12..18 => ("docker-ferrol-1-27-v2", false),
            _ => ("docker-ferrol-1-27-v2", true),
        };
        let name = format!("cluster-addon-c{i:02}");
        let addon = ClusterAddon::new(
            &name,
            ClusterAddonSpec {
                cluster_stack: class.into(),
                ..Default::default()
            },
        );
        addons.create(&PostParams::default(), &addon).await.unwrap();
        let mut status = ClusterAddon::new(&name, Default::default());
        status.status = Some(ClusterAddonStatus {
            ready: !failing,
            ..Default::default()
        });
        if failing {
            status.mark_false(
                "HelmChartApplied",
                "FailedToApplyObjects",
                Severity::Warning,
                "admission webhook denied",
            );
        }
        addons
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status.status})),
            )
            .await
            .unwrap();
    }

    let output = Command::new(env!("CARGO_BIN_EXE_cso"))
        .args([
            "status",
            "--kubeconfig",
            plane.kubeconfig_path().to_str().unwrap(),
            "-n",
            &ns,
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "cso status failed: {stderr}");
    let table = String::from_utf8(output.stdout).unwrap();
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|line| {
            line.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect()
        })
        .collect();
    assert_eq!(
        rows,
        [
            vec![
                "RELEASE",
                "CLUSTERS",
                "READY",
                "PROGRESSING",
                "FAILING",
                "FAILING CLUSTERS"
            ],
            vec!["docker-ferrol-1-27-v1", "12", "12", "0", "0"],
            vec![
                "docker-ferrol-1-27-v2",
                "8",
                "6",
                "0",
                "2",
                &format!("{ns}/c18, {ns}/c19"),
            ],
        ],
        "{table}"
    );
}
