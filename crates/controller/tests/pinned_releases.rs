//! Digest pins with releases from a real registry: a pinned release serves a Cluster; after its tag moves, an
//! operator started with an empty cache refuses the tag everywhere, in the ClusterStackRelease and in the
//! ClusterAddon alike (the ClusterAddon fetches at its release's pin, so it cannot cache and apply what the
//! ClusterStackRelease refuses), and the addons applied from the pinned release stay as they are.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod support;

use std::sync::Arc;

use cso_api::{
    ClusterAddon, ClusterStackRelease,
    conditions::{ConditionStatus, ConditionsExt},
    names::{condition, reason},
};
use cso_release::source::oci::{OciConfig, OciSource};
use cso_testenv::registry::{Registry, push_like_oras, push_like_oras_changed};
use k8s_openapi::api::apps::v1::Deployment;
use kube::{Api, ResourceExt};
use serde_json::json;
use support::*;

const REPOSITORY: &str = "kaas/cluster-stacks";
const V1: &str = "docker-ferrol-1-27-v1";

fn oci(registry: &Registry) -> Arc<OciSource> {
    Arc::new(OciSource::new(
        OciConfig::from_lookup(registry.oci_variables(REPOSITORY)).unwrap(),
    ))
}

fn refused_as_moved<K: ConditionsExt>(object: &K) -> bool {
    object
        .get_condition(condition::RELEASE_VERIFIED)
        .is_some_and(|c| c.status == ConditionStatus::False && c.reason.as_deref() == Some(reason::TAG_MOVED))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_pinned_tag_is_refused_by_the_release_and_the_addons_alike() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let workload_plane = cso_testenv::shared_workload();
    let workload = workload_plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "pinned").await.unwrap();
    let registry = Registry::start(&cso_testenv::Tools::discover().unwrap())
        .await
        .unwrap();
    let pinned = push_like_oras(&registry, REPOSITORY, V1, &fixtures().join(V1))
        .await
        .unwrap();

    let first_cache = tempfile::tempdir().unwrap();
    let operator = RunningOperator::start(&client, &ns, first_cache.path(), oci(&registry), |_| {}).await;
    let mut spec = ferrol_spec(&["v1"]);
    spec["versionDigests"] = json!({"v1": pinned});
    create_stack(&client, &ns, "ferrol", spec).await;
    let release = ready_release(&client, &ns, V1).await;
    assert_eq!(release.spec.digest.as_deref(), Some(pinned.as_str()));
    assert!(
        release.is_condition_true(condition::RELEASE_VERIFIED),
        "the pin was checked"
    );
    cso_testenv::kubeconfig_secret(&client, &ns, "c1", workload_plane.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(&client, &ns, "c1", V1).await;
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    addon_where(
        &addons,
        "c1",
        "addons applied from the pinned release",
        CONVERGE,
        |a| a.status.as_ref().is_some_and(|s| s.ready),
    )
    .await;
    let deployments: Api<Deployment> = Api::namespaced(workload.clone(), "kube-system");
    let applied = deployments
        .get("metrics-server")
        .await
        .unwrap()
        .resource_version();
    operator.stop().await;

    // The tag moves; the operator comes back with an empty cache.
    let change = (
        "cluster-addon-values.yaml",
        b"\n# pushed again after the pin\n".as_slice(),
    );
    let moved = push_like_oras_changed(&registry, REPOSITORY, V1, &fixtures().join(V1), change)
        .await
        .unwrap();
    assert_ne!(moved, pinned);
    let second_cache = tempfile::tempdir().unwrap();
    let _operator = RunningOperator::start(&client, &ns, second_cache.path(), oci(&registry), |_| {}).await;
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), &ns);
    let refused = eventually("the release refuses the moved tag", CONVERGE, || async {
        releases.get_opt(V1).await.unwrap().filter(refused_as_moved)
    })
    .await;
    let message = refused
        .get_condition(condition::RELEASE_VERIFIED)
        .unwrap()
        .message
        .clone()
        .unwrap();
    assert!(message.contains(&pinned) && message.contains(&moved), "{message}");
    let addon = addon_where(
        &addons,
        "c1",
        "the addons refuse the moved tag",
        CONVERGE,
        refused_as_moved,
    )
    .await;
    assert_eq!(addon.spec.cluster_stack, V1);
    assert!(
        !second_cache.path().join("cluster-stacks").join(V1).exists(),
        "nothing of the moved tag was cached, by either controller"
    );
    assert_eq!(
        deployments
            .get("metrics-server")
            .await
            .unwrap()
            .resource_version(),
        applied,
        "the addons applied from the pinned release are left as they are"
    );
}
