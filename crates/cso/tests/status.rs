//! `cso status` as a process against a real API server: 20 Clusters over two releases, two of them failing,
//! are counted per release, the failing Clusters named; a Cluster whose first install failed counts as failing
//! on the release of its class, and the ClusterAddon of a Cluster that is gone counts for nothing.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

use std::process::Command;

use cso_api::{
    ClusterAddon,
    cluster_addon::{ClusterAddonSpec, ClusterAddonStatus},
    conditions::{ConditionsExt, Severity},
};
use kube::{
    Api,
    api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
};
use serde_json::json;

#[tokio::test]
async fn the_fleet_is_counted_per_release_with_the_failing_clusters_named() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "status").await.unwrap();
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta1", "Cluster")),
    );
    // c20: its first install failed (on no release yet); c21: its Cluster is gone.
    for i in 0..22 {
        let (class, failing) = match i {
            0..12 | 21 => ("docker-ferrol-1-27-v1", false),
            12..18 => ("docker-ferrol-1-27-v2", false),
            _ => ("docker-ferrol-1-27-v2", true),
        };
        if i != 21 {
            let cluster: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
                "metadata": {"name": format!("c{i:02}"), "namespace": &ns},
                "spec": {"topology": {"class": class, "version": "v1.27.3"}},
            }))
            .unwrap();
            clusters.create(&PostParams::default(), &cluster).await.unwrap();
        }
        let name = format!("cluster-addon-c{i:02}");
        let addon = ClusterAddon::new(
            &name,
            ClusterAddonSpec {
                cluster_stack: if i == 20 { String::new() } else { class.into() },
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
                "9",
                "6",
                "0",
                "3",
                &format!("{ns}/c18, {ns}/c19, {ns}/c20"),
            ],
        ],
        "{table}"
    );
}
