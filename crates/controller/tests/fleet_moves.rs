//! Across the fleet (issue 30): with the operator's controllers running, each ClusterStackRelease reports in
//! `status.moves` how many Clusters of its stack on other releases could move to its class, and which could
//! not and why, judged from the watch caches (the two classes, no dry run): ferrol v1 and v2 are applied;
//! three Clusters of v1 set variables, one of which v2's class refuses (a number for the string
//! `imageRepository`) and one it does not define; the counts follow when a Cluster's variable is mended.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod support;

use std::{sync::Arc, time::Duration};

use cso_api::{
    ClusterStackRelease,
    cluster_stack_release::{RefusedMove, ReleaseMoves},
};
use cso_release::source::local::LocalSource;
use kube::{
    Api,
    api::{DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use support::*;

const V1: &str = "docker-ferrol-1-27-v1";
const V2: &str = "docker-ferrol-1-27-v2";

/// The writer's 2 s debounce and a round of writes, with room to spare.
const SHOWN: Duration = Duration::from_secs(30);

async fn create(client: &kube::Client, ns: &str, name: &str, variables: Value) {
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "topology": {"class": V1, "version": "v1.27.3", "variables": variables},
            "controlPlaneEndpoint": {"host": format!("{name}.example.test"), "port": 6443},
        },
    }))
    .unwrap();
    dynamic(client, ns, &capi("Cluster"))
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
}

async fn moves_shown(releases: &Api<ClusterStackRelease>, name: &str, expected: &ReleaseMoves) {
    let mut last = None;
    let shown = tokio::time::timeout(SHOWN, async {
        loop {
            let release = releases.get(name).await.unwrap();
            last = release.status.and_then(|s| s.moves);
            if last.as_ref() == Some(expected) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    assert!(
        shown.is_ok(),
        "{name}'s moves: expected {expected:?}, last shown {last:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_release_reports_which_clusters_of_its_stack_could_move_to_it_and_why_not() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "fleet-moves").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    local_releases(dir.path(), &[V1, V2]);
    let source = Arc::new(LocalSource::new(dir.path().join("cluster-stacks")));
    let (operator, renderer) = operator(&client, &ns, dir.path(), source, |_| {});
    let running = RunningOperator::run(operator, renderer).await;

    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1", "v2"])).await;
    ready_release(&client, &ns, V1).await;
    ready_release(&client, &ns, V2).await;
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), &ns);
    // No Cluster yet: nothing to move.
    moves_shown(&releases, V2, &ReleaseMoves::default()).await;

    create(
        &client,
        &ns,
        "m1",
        json!([{"name": "imageRepository", "value": "registry.k8s.io"}]),
    )
    .await;
    create(
        &client,
        &ns,
        "m2",
        json!([{"name": "imageRepository", "value": 5}]),
    )
    .await;
    create(
        &client,
        &ns,
        "m3",
        json!([{"name": "imageRepository", "value": "r"}, {"name": "oidc", "value": {}}]),
    )
    .await;
    let refused_m2 = RefusedMove {
        cluster: format!("{ns}/m2"),
        reasons: vec!["variable imageRepository: must be of type string, not integer".into()],
    };
    let refused_m3 = RefusedMove {
        cluster: format!("{ns}/m3"),
        reasons: vec!["variable oidc: set by the Cluster, not defined by the new class".into()],
    };
    moves_shown(
        &releases,
        V2,
        &ReleaseMoves {
            clusters: 3,
            movable: 1,
            movable_with_defaults: 0,
            refused: 2,
            refused_clusters: vec![refused_m2, refused_m3.clone()],
        },
    )
    .await;
    // The Clusters are on v1 already: none of its stack to move there.
    moves_shown(&releases, V1, &ReleaseMoves::default()).await;

    // m2's value mended: it could move now.
    dynamic(&client, &ns, &capi("Cluster"))
        .patch(
            "m2",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"topology": {"variables": [
                {"name": "imageRepository", "value": "registry.k8s.io"}]}}})),
        )
        .await
        .unwrap();
    moves_shown(
        &releases,
        V2,
        &ReleaseMoves {
            clusters: 3,
            movable: 2,
            movable_with_defaults: 0,
            refused: 1,
            refused_clusters: vec![refused_m3],
        },
    )
    .await;
    running.stop().await;
}
