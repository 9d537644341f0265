//! The workload-cluster flow on two real API servers with real helm: a ClusterAddon for each Cluster of a
//! cluster-stack class, addons templated from the Cluster and applied into the workload cluster, upgrades that
//! prune, class changes with the same addons that touch nothing, drift put back, and workload clusters that are
//! missing, broken or unreachable reported and recovered from.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod support;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use cso_api::{
    ClusterAddon,
    cluster_addon::STAGE_ANNOTATION,
    conditions::{ConditionsExt, READY},
    names::{condition, reason},
};
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
};
use serde_json::json;
use support::*;

const RELEASES: [&str; 3] = [
    "docker-ferrol-1-27-v1",
    "docker-ferrol-1-27-v2",
    "docker-ferrol-1-27-v3",
];

async fn ready_addon(client: &Client, namespace: &str, cluster: &str, class: &str) -> ClusterAddon {
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), namespace);
    let name = format!("cluster-addon-{cluster}");
    eventually(&format!("{name} ready with {class}"), CONVERGE, || async {
        addons
            .get_opt(&name)
            .await
            .unwrap()
            .filter(|a| a.spec.cluster_stack == class && a.status.as_ref().is_some_and(|s| s.ready))
    })
    .await
}

/// An operator on the multi-stage fixture release (`v0-sha.hipstsw`, channel `custom`) in `release_dir`,
/// and ClusterStack `custom` for it.
async fn custom_stack(client: &Client, namespace: &str, release_dir: &std::path::Path) -> RunningOperator {
    local_releases(release_dir, &["docker-ferrol-1-27-v0-sha-hipstsw"]);
    let operator = RunningOperator::local(client, namespace, release_dir).await;
    let mut spec = ferrol_spec(&["v0-sha.hipstsw"]);
    spec["channel"] = json!("custom");
    create_stack(client, namespace, "custom", spec).await;
    operator
}

/// resourceVersion of every object of the inventory, read from the workload cluster.
async fn versions(workload: &Client, addon: &ClusterAddon) -> BTreeMap<String, String> {
    let mut versions = BTreeMap::new();
    for entry in &addon.status.as_ref().unwrap().resources {
        let gvk = kube::core::GroupVersionKind::gvk(&entry.group, &entry.version, &entry.kind);
        let (resource, caps) = kube::discovery::pinned_kind(workload, &gvk).await.unwrap();
        let api: Api<kube::api::DynamicObject> = if caps.scope == kube::discovery::Scope::Namespaced {
            Api::namespaced_with(workload.clone(), &entry.namespace, &resource)
        } else {
            Api::all_with(workload.clone(), &resource)
        };
        let object = api.get(&entry.name).await.unwrap();
        versions.insert(
            format!("{}/{}/{}", entry.kind, entry.namespace, entry.name),
            object.resource_version().unwrap(),
        );
    }
    versions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addons_install_upgrade_prune_and_come_back() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let workload_plane = cso_testenv::shared_workload();
    let workload = workload_plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "addons").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    local_releases(dir.path(), &RELEASES);
    let operator = RunningOperator::local(&client, &ns, dir.path()).await;
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1", "v2", "v3"])).await;
    for release in RELEASES {
        ready_release(&client, &ns, release).await;
    }
    cso_testenv::kubeconfig_secret(&client, &ns, "c1", workload_plane.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(&client, &ns, "c1", "docker-ferrol-1-27-v1").await;

    // v1: installed, with the label templated from the Cluster's control-plane host.
    let addon = ready_addon(&client, &ns, "c1", "docker-ferrol-1-27-v1").await;
    assert_eq!(addon.owner_references()[0].kind, "Cluster");
    assert_eq!(addon.spec.version, "v1");
    assert_eq!(
        addon.annotations().get(STAGE_ANNOTATION).map(String::as_str),
        Some("created")
    );
    assert!(addon.is_condition_true(READY));
    assert!(addon.is_condition_true(condition::CLUSTER_READY));
    let deployments: Api<Deployment> = Api::namespaced(workload.clone(), "kube-system");
    let metrics = deployments.get("metrics-server").await.unwrap();
    assert_eq!(
        metrics.labels().get("domain").map(String::as_str),
        Some("c1.example.test")
    );
    assert_eq!(
        metrics.labels().get("clusterAddonVersion").map(String::as_str),
        Some("v1")
    );
    assert!(
        deployments.get_opt("web").await.unwrap().is_some(),
        "v1 has the Deployment web"
    );

    // v1 -> v2: changed objects updated, web pruned.
    move_cluster(&client, &ns, "c1", "docker-ferrol-1-27-v2").await;
    let addon = ready_addon(&client, &ns, "c1", "docker-ferrol-1-27-v2").await;
    assert_eq!(addon.spec.version, "v2");
    assert_eq!(
        addon.annotations().get(STAGE_ANNOTATION).map(String::as_str),
        Some("upgraded")
    );
    let metrics = deployments.get("metrics-server").await.unwrap();
    assert_eq!(
        metrics.labels().get("clusterAddonVersion").map(String::as_str),
        Some("v2")
    );
    assert!(
        deployments.get_opt("web").await.unwrap().is_none(),
        "web is not in v2: pruned"
    );
    assert!(
        addon
            .status
            .as_ref()
            .unwrap()
            .resources
            .iter()
            .all(|r| r.name != "web")
    );

    // v2 -> v3, the same addon version: nothing rendered, nothing written.
    let before = versions(&workload, &addon).await;
    let (_, renders_before) = operator.renderer.stats();
    move_cluster(&client, &ns, "c1", "docker-ferrol-1-27-v3").await;
    let addon = ready_addon(&client, &ns, "c1", "docker-ferrol-1-27-v3").await;
    assert_eq!(addon.spec.version, "v2");
    let (_, renders_after) = operator.renderer.stats();
    assert_eq!(
        renders_after, renders_before,
        "no helm run for a class with the same addons"
    );
    assert_eq!(versions(&workload, &addon).await, before, "no object changed");
    operator.stop().await;

    // With a short resync, an addon object deleted in the workload cluster comes back.
    let operator = RunningOperator::start(
        &client,
        &ns,
        dir.path(),
        std::sync::Arc::new(cso_release::source::local::LocalSource::new(
            dir.path().join("cluster-stacks"),
        )),
        |s| s.resync_interval = Duration::from_secs(2),
    )
    .await;
    deleted_and_made_again(
        &deployments,
        "metrics-server",
        "metrics-server is restored in the workload cluster",
    )
    .await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_addons_only_for_stack_classes_and_recreated_when_deleted() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "addon-create").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    local_releases(dir.path(), &["docker-ferrol-1-27-v1"]);
    // Workload clusters are asked again only hourly: every step below that follows a kubeconfig Secret
    // change happens because the Secret is watched.
    let operator = RunningOperator::local_with(&client, &ns, dir.path(), |settings| {
        settings.workload_retry_interval = Duration::from_secs(3600)
    })
    .await;

    // Created before its stack exists: the ClusterAddon follows once the release does.
    create_cluster(&client, &ns, "early", "docker-ferrol-1-27-v1").await;
    create_cluster(&client, &ns, "foreign", "my-own-class").await;
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1"])).await;
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    let addon = eventually("cluster-addon-early", CONVERGE, || async {
        addons.get_opt("cluster-addon-early").await.unwrap()
    })
    .await;
    assert_eq!(addon.spec.cluster_ref.name.as_deref(), Some("early"));
    deleted_and_made_again(&addons, "cluster-addon-early", "cluster-addon-early is recreated").await;
    assert!(
        addons.get_opt("cluster-addon-foreign").await.unwrap().is_none(),
        "a Cluster of a class that is not a cluster stack's gets no ClusterAddon"
    );

    // A ClusterAddon that carries the Go operator's finalizer never blocks its deletion.
    let other = ClusterAddon::new(
        "cluster-addon-migrated",
        serde_json::from_value(
            json!({"clusterRef": {"kind": "Cluster", "name": "migrated", "namespace": ns}}),
        )
        .unwrap(),
    );
    let mut other = other;
    other.metadata.finalizers = Some(vec![cso_api::cluster_addon::CLUSTER_ADDON_FINALIZER.to_owned()]);
    addons.create(&Default::default(), &other).await.unwrap();
    addons
        .delete("cluster-addon-migrated", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the migrated ClusterAddon is gone", CONVERGE, || async {
        addons
            .get_opt("cluster-addon-migrated")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;

    // No kubeconfig Secret: reported, and retried without a hot loop.
    let message = wait_condition::<ClusterAddon>(
        &client,
        &ns,
        "cluster-addon-early",
        condition::CLUSTER_READY,
        reason::CONTROL_PLANE_NOT_READY,
    )
    .await;
    assert!(message.contains("early-kubeconfig"), "{message}");

    // A broken Secret, then one that points at nothing.
    cso_testenv::kubeconfig_secret(&client, &ns, "early", "this is not a kubeconfig")
        .await
        .unwrap();
    eventually("the broken kubeconfig is reported", CONVERGE, || async {
        let addon = addons.get("cluster-addon-early").await.unwrap();
        let message = addon.get_condition(condition::CLUSTER_READY)?.message.clone()?;
        message.contains("unusable").then_some(())
    })
    .await;
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let unreachable = cso_testenv::shared_workload().kubeconfig_yaml().replace(
        &cso_testenv::shared_workload().server_url().to_string(),
        &format!("https://127.0.0.1:{port}"),
    );
    cso_testenv::kubeconfig_secret(&client, &ns, "early", &unreachable)
        .await
        .unwrap();
    eventually(
        "the unreachable workload cluster is reported",
        CONVERGE,
        || async {
            let addon = addons.get("cluster-addon-early").await.unwrap();
            let condition = addon.get_condition(condition::CLUSTER_READY)?;
            condition
                .message
                .as_deref()?
                .contains("control plane not ready yet")
                .then_some(())
        },
    )
    .await;

    // Fixing the Secret recovers without anything else, at once (a workload cluster of its own, so as not to
    // meet the other test's addons).
    let own = workload_plane("workload-recovery").await;
    cso_testenv::kubeconfig_secret(&client, &ns, "early", own.kubeconfig_yaml())
        .await
        .unwrap();
    let addon = ready_addon(&client, &ns, "early", "docker-ferrol-1-27-v1").await;
    assert!(addon.is_condition_true(condition::CLUSTER_READY));
    let deployments: Api<Deployment> = kube_system(&own).await;
    assert!(deployments.get_opt("metrics-server").await.unwrap().is_some());
    operator.stop().await;
    own.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_release_runs_its_hooks_and_resumes_after_a_restart() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let own = workload_plane("workload-staged").await;
    let workload = own.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "staged").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let operator = custom_stack(&client, &ns, dir.path()).await;
    ready_release(&client, &ns, "docker-ferrol-1-27-v0-sha-hipstsw").await;
    cso_testenv::kubeconfig_secret(&client, &ns, "staged", own.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(&client, &ns, "staged", "docker-ferrol-1-27-v0-sha.hipstsw").await;

    // No hook call arrives: once the control plane answers, the AfterControlPlaneInitialized stages run.
    let addon = ready_addon(&client, &ns, "staged", "docker-ferrol-1-27-v0-sha.hipstsw").await;
    assert_eq!(addon.spec.hook, "");
    assert_eq!(
        addon.annotations().get(STAGE_ANNOTATION).map(String::as_str),
        Some("created")
    );
    assert!(addon.is_condition_true(condition::HELM_CHART_APPLIED));
    let deployments: Api<Deployment> = Api::namespaced(workload.clone(), "kube-system");
    assert!(deployments.get_opt("metrics-server").await.unwrap().is_some());

    // BeforeClusterUpgrade (as the hook server sets it): the ngnix stage waits until its post-condition
    // (metrics-server replicas == ngnix replicas) holds. Make it not hold first, while the operator is down (a
    // running one puts back a field of its objects someone else changed: drift).
    operator.stop().await;
    set_replicas(&deployments, "metrics-server", 3).await;
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    addons
        .patch(
            "cluster-addon-staged",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hook": "BeforeClusterUpgrade"}})),
        )
        .await
        .unwrap();
    let operator = RunningOperator::local(&client, &ns, dir.path()).await;
    let message = wait_condition::<ClusterAddon>(
        &client,
        &ns,
        "cluster-addon-staged",
        condition::EVALUATED_CEL,
        reason::FAILED_TO_EVALUATE_POST_CONDITION,
    )
    .await;
    assert!(message.contains("ngnix"), "{message}");
    let waiting = addons.get("cluster-addon-staged").await.unwrap();
    let status = waiting.status.as_ref().unwrap();
    assert!(!status.ready);
    assert!(
        !waiting.is_condition_true(condition::HELM_CHART_APPLIED),
        "the upgrade stays blocked"
    );
    assert_eq!(
        status
            .stages
            .iter()
            .map(|s| (s.name.as_str(), s.phase))
            .collect::<Vec<_>>(),
        [(
            "ngnix",
            cso_api::cluster_addon::StagePhase::WaitingForPostCondition
        )]
    );

    // A restart resumes at the stage's post-condition: ngnix is not applied again.
    let ngnix_version = deployments
        .get("cluster-addon-ngnix")
        .await
        .unwrap()
        .resource_version();
    operator.kill().await;
    let operator = RunningOperator::local(&client, &ns, dir.path()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let resumed = addons.get("cluster-addon-staged").await.unwrap();
    assert_eq!(resumed.spec.hook, "BeforeClusterUpgrade");
    assert_eq!(
        resumed.status.as_ref().unwrap().stages[0].phase,
        cso_api::cluster_addon::StagePhase::WaitingForPostCondition
    );
    assert_eq!(
        deployments
            .get("cluster-addon-ngnix")
            .await
            .unwrap()
            .resource_version(),
        ngnix_version
    );

    // The condition holds: the stage is done, the hook completes, HelmChartApplied is True.
    let ngnix_replicas = replicas(&deployments, "cluster-addon-ngnix").await;
    set_replicas(&deployments, "metrics-server", ngnix_replicas).await;
    let done = eventually("the BeforeClusterUpgrade stages complete", CONVERGE, || async {
        done(addons.get("cluster-addon-staged").await.unwrap())
    })
    .await;
    assert_eq!(
        done.annotations().get(STAGE_ANNOTATION).map(String::as_str),
        Some("upgraded")
    );
    assert!(done.status.as_ref().unwrap().stages.is_empty());
    operator.stop().await;
    own.stop();
}

/// The controller's store can hand a reconcile a copy older than the last pass's writes (seen in CI: the
/// AfterControlPlaneInitialized stages ran again right after they had finished, and re-applied metrics-server
/// over a change made since). A reconcile reads the ClusterAddon itself, so an old copy changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_handed_an_old_copy_does_not_run_finished_stages_again() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let own = workload_plane("workload-stale").await;
    let ns = cso_testenv::namespace(&client, "stale").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let operator = custom_stack(&client, &ns, dir.path()).await;
    let class = "docker-ferrol-1-27-v0-sha.hipstsw";
    create_cluster(&client, &ns, "stale", class).await;
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    let name = "cluster-addon-stale";
    // The copy as first created: nothing installed, no hook.
    let old = eventually(name, CONVERGE, || async { addons.get_opt(name).await.unwrap() }).await;
    assert!(old.spec.cluster_stack.is_empty() && old.spec.hook.is_empty());
    cso_testenv::kubeconfig_secret(&client, &ns, "stale", own.kubeconfig_yaml())
        .await
        .unwrap();
    ready_addon(&client, &ns, "stale", class).await;
    operator.stop().await;

    // Only this reconcile writes from here on; every version it writes is looked at.
    let before = addons.get(name).await.unwrap();
    let source = Arc::new(cso_release::source::local::LocalSource::new(
        dir.path().join("cluster-stacks"),
    ));
    let (parts, _) = support::operator(&client, &ns, dir.path(), source, |_| {});
    let ctx = cso_controller::cluster_addon::AddonContext::new(parts.context().unwrap());
    cso_controller::cluster_addon::reconcile(Arc::new(old), ctx)
        .await
        .unwrap();
    let after = addons.get(name).await.unwrap();
    let written = support::versions_between(&addons, name, &before, &after).await;
    for version in &written {
        assert!(
            version.spec.hook.is_empty(),
            "no hook started again: {:?}",
            version.spec
        );
        assert!(
            version
                .status
                .as_ref()
                .is_some_and(|s| s.ready && s.stages.is_empty()),
            "no stage ran again: {:?}",
            version.status
        );
    }
    assert_eq!(after.spec.cluster_stack, class);
    assert_eq!(
        after.annotations().get(STAGE_ANNOTATION).map(String::as_str),
        Some("created")
    );
    assert!(after.is_condition_true(condition::HELM_CHART_APPLIED));
    own.stop();
}

/// The addon if its hook is done and its charts are applied.
fn done(addon: ClusterAddon) -> Option<ClusterAddon> {
    (addon.spec.hook.is_empty()
        && addon.is_condition_true(condition::HELM_CHART_APPLIED)
        && addon.status.as_ref().is_some_and(|s| s.ready))
    .then_some(addon)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_stage_or_a_missing_stage_chart_is_reported_and_a_fixed_release_recovers() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let own = workload_plane("workload-broken-stage").await;
    let ns = cso_testenv::namespace(&client, "broken-stage").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // v1: the first stage's pre-condition is not CEL; v2 is fixed.
    staged_release(
        dir.path(),
        "v1",
        "apiVersion: clusteraddonconfig.x-k8s.io/v1alpha1\naddonStages:\n  AfterControlPlaneInitialized:\n    - name: metrics-server\n      action: apply\n      waitForPreCondition:\n        objects: []\n        conditions: \"this is (not CEL\"\n",
    );
    staged_release(
        dir.path(),
        "v2",
        "apiVersion: clusteraddonconfig.x-k8s.io/v1alpha1\naddonStages:\n  AfterControlPlaneInitialized:\n    - name: metrics-server\n      action: apply\n",
    );
    // v3: a stage whose chart the release does not have.
    staged_release(
        dir.path(),
        "v3",
        "apiVersion: clusteraddonconfig.x-k8s.io/v1alpha1\naddonStages:\n  AfterControlPlaneInitialized:\n    - name: missing-chart\n      action: apply\n",
    );
    let operator = RunningOperator::local(&client, &ns, dir.path()).await;
    let mut spec = ferrol_spec(&["v1", "v2", "v3"]);
    spec["name"] = json!("staged");
    create_stack(&client, &ns, "staged", spec).await;
    cso_testenv::kubeconfig_secret(&client, &ns, "broken", own.kubeconfig_yaml())
        .await
        .unwrap();
    cso_testenv::kubeconfig_secret(&client, &ns, "no-chart", own.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(&client, &ns, "no-chart", "docker-staged-1-27-v3").await;
    // The release is checked before its first use (its archives read through, every stage's chart present),
    // so the missing chart is reported as a broken release, before any stage runs.
    let message = wait_condition::<ClusterAddon>(
        &client,
        &ns,
        "cluster-addon-no-chart",
        condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
        reason::ISSUE_WITH_RELEASE_ASSETS,
    )
    .await;
    assert!(message.contains("missing-chart"), "{message}");
    move_cluster(&client, &ns, "no-chart", "docker-staged-1-27-v2").await;
    ready_addon(&client, &ns, "no-chart", "docker-staged-1-27-v2").await;
    create_cluster(&client, &ns, "broken", "docker-staged-1-27-v1").await;

    let message = wait_condition::<ClusterAddon>(
        &client,
        &ns,
        "cluster-addon-broken",
        condition::EVALUATED_CEL,
        reason::FAILED_TO_EVALUATE_PRE_CONDITION,
    )
    .await;
    assert!(message.contains("does not compile"), "{message}");
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    let stuck = addons.get("cluster-addon-broken").await.unwrap();
    assert!(!stuck.status.as_ref().unwrap().ready);
    assert_ne!(
        stuck.status.as_ref().unwrap().stages[0].phase,
        cso_api::cluster_addon::StagePhase::Done,
        "a failed stage is never counted as done"
    );
    assert!(stuck.get_condition(READY).is_some_and(|c| !c.is_true()));

    // Moving the Cluster to the fixed release recovers, with no manual cleanup.
    move_cluster(&client, &ns, "broken", "docker-staged-1-27-v2").await;
    let addon = ready_addon(&client, &ns, "broken", "docker-staged-1-27-v2").await;
    assert!(addon.get_condition(condition::EVALUATED_CEL).is_none());
    let deployments: Api<Deployment> = kube_system(&own).await;
    assert!(deployments.get_opt("metrics-server").await.unwrap().is_some());
    operator.stop().await;
    own.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scs_addons_install_into_a_workload_cluster() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let own = workload_plane("workload-scs").await;
    let ns = cso_testenv::namespace(&client, "scs").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    local_releases(dir.path(), &["docker-scs-1-30-v1"]);
    let operator = RunningOperator::local(&client, &ns, dir.path()).await;
    let mut spec = ferrol_spec(&["v1"]);
    spec["name"] = json!("scs");
    spec["kubernetesVersion"] = json!("1.30");
    create_stack(&client, &ns, "scs", spec).await;
    cso_testenv::kubeconfig_secret(&client, &ns, "scs", own.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(&client, &ns, "scs", "docker-scs-1-30-v1").await;

    let addon = ready_addon(&client, &ns, "scs", "docker-scs-1-30-v1").await;
    let workload = own.client().await.unwrap();
    let daemonsets: Api<k8s_openapi::api::apps::v1::DaemonSet> =
        Api::namespaced(workload.clone(), "kube-system");
    assert!(
        daemonsets.get_opt("cilium").await.unwrap().is_some(),
        "Cilium's agent"
    );
    let deployments: Api<Deployment> = Api::namespaced(workload, "kube-system");
    assert!(deployments.get_opt("metrics-server").await.unwrap().is_some());
    let inventory = &addon.status.as_ref().unwrap().resources;
    assert!(
        inventory.len() >= 20,
        "both stages recorded: {} objects",
        inventory.len()
    );
    operator.stop().await;
    own.stop();
}

/// Calls a hook of the server at `port` as Cluster API does; returns the response.
async fn call_hook(
    https: &reqwest::Client,
    port: u16,
    path: &str,
    kind: &str,
    cluster: serde_json::Value,
) -> serde_json::Value {
    https
        .post(format!("https://127.0.0.1:{port}/hooks.runtime.cluster.x-k8s.io/v1alpha1/{path}"))
        .json(&json!({"apiVersion": "hooks.runtime.cluster.x-k8s.io/v1alpha1", "kind": kind, "cluster": cluster}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_hooks_drive_the_stages_and_hold_the_upgrade_until_they_are_done() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let own = workload_plane("workload-hooks").await;
    let ns = cso_testenv::namespace(&client, "hooks").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let acpi = "  AfterControlPlaneInitialized:\n    - name: metrics-server\n      action: apply\n";
    staged_release(
        dir.path(),
        "v1",
        &format!("apiVersion: clusteraddonconfig.x-k8s.io/v1alpha1\naddonStages:\n{acpi}"),
    );
    staged_release(
        dir.path(),
        "v2",
        &format!(
            "apiVersion: clusteraddonconfig.x-k8s.io/v1alpha1\naddonStages:\n{acpi}  BeforeClusterUpgrade:\n    - name: ngnix\n      action: apply\n      waitForPostCondition:\n        objects:\n          - {{key: gate, apiVersion: v1, kind: ConfigMap, name: upgrade-gate, namespace: kube-system}}\n        conditions: gate.data.state == 'open'\n"
        ),
    );
    let operator = RunningOperator::local(&client, &ns, dir.path()).await;
    let certs = tempfile::tempdir().unwrap();
    let ca = cso_testenv::pki::write_serving_certificate(certs.path()).unwrap();
    let server = cso_webhook::TlsServer::start(
        cso_webhook::hook_router(client.clone(), cso_webhook::hooks::unobserved()),
        "127.0.0.1:0".parse().unwrap(),
        certs.path(),
    )
    .await
    .unwrap();
    let port = server.local_addr.port();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let https = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
        .build()
        .unwrap();

    let mut spec = ferrol_spec(&["v1", "v2"]);
    spec["name"] = json!("staged");
    create_stack(&client, &ns, "staged", spec).await;
    create_cluster(&client, &ns, "hooked", "docker-staged-1-27-v1").await;
    let clusters = dynamic(&client, &ns, &capi("Cluster"));
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    eventually("cluster-addon-hooked", CONVERGE, || async {
        addons.get_opt("cluster-addon-hooked").await.unwrap()
    })
    .await;

    // AfterControlPlaneInitialized arrives before the workload cluster can be reached: the hook is recorded,
    // and its stages run once the kubeconfig is there.
    let cluster = serde_json::to_value(clusters.get("hooked").await.unwrap()).unwrap();
    let answer = call_hook(
        &https,
        port,
        "aftercontrolplaneinitialized/after-control-plane-initialized",
        "AfterControlPlaneInitializedRequest",
        cluster,
    )
    .await;
    assert_eq!(answer["status"], "Success", "{answer}");
    assert_eq!(
        addons.get("cluster-addon-hooked").await.unwrap().spec.hook,
        "AfterControlPlaneInitialized"
    );
    cso_testenv::kubeconfig_secret(&client, &ns, "hooked", own.kubeconfig_yaml())
        .await
        .unwrap();
    ready_addon(&client, &ns, "hooked", "docker-staged-1-27-v1").await;

    // The user moves the Cluster to v2; Cluster API calls BeforeClusterUpgrade, which holds the upgrade
    // while the ngnix stage waits for its post-condition: a gate someone else keeps (a ConfigMap that is not
    // the operator's; a field of the operator's own objects would be put back as drift).
    let gates: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(own.client().await.unwrap(), "kube-system");
    set_gate(&gates, "closed").await;
    move_cluster(&client, &ns, "hooked", "docker-staged-1-27-v2").await;
    let before_upgrade = || async {
        let cluster = serde_json::to_value(clusters.get("hooked").await.unwrap()).unwrap();
        call_hook(
            &https,
            port,
            "beforeclusterupgrade/before-cluster-upgrade",
            "BeforeClusterUpgradeRequest",
            cluster,
        )
        .await
    };
    let answer = before_upgrade().await;
    assert_eq!(
        answer["retryAfterSeconds"],
        cso_webhook::hooks::RETRY_AFTER_SECONDS,
        "{answer}"
    );
    wait_condition::<ClusterAddon>(
        &client,
        &ns,
        "cluster-addon-hooked",
        condition::EVALUATED_CEL,
        reason::FAILED_TO_EVALUATE_POST_CONDITION,
    )
    .await;
    let answer = before_upgrade().await;
    assert_eq!(
        answer["retryAfterSeconds"],
        cso_webhook::hooks::RETRY_AFTER_SECONDS,
        "still held while the condition does not hold: {answer}"
    );

    // The condition holds: the stage and the hook finish, and the upgrade may go on.
    set_gate(&gates, "open").await;
    let released = eventually(
        "BeforeClusterUpgrade lets the upgrade go on",
        CONVERGE,
        || async {
            let answer = before_upgrade().await;
            answer.get("retryAfterSeconds").is_none().then_some(answer)
        },
    )
    .await;
    assert_eq!(released["status"], "Success");
    let addon = addons.get("cluster-addon-hooked").await.unwrap();
    assert_eq!(addon.spec.cluster_stack, "docker-staged-1-27-v2");
    assert_eq!(
        addon.annotations().get(STAGE_ANNOTATION).map(String::as_str),
        Some("upgraded")
    );

    // AfterClusterUpgrade (blocking since Cluster API 1.12): this release has no stages for it, which the
    // ClusterAddon records, so it is answered at once and nothing is started.
    let cluster = serde_json::to_value(clusters.get("hooked").await.unwrap()).unwrap();
    let answer = call_hook(
        &https,
        port,
        "afterclusterupgrade/after-cluster-upgrade",
        "AfterClusterUpgradeRequest",
        cluster,
    )
    .await;
    assert_eq!(answer["status"], "Success", "{answer}");
    assert!(
        answer.get("retryAfterSeconds").is_none(),
        "nothing to wait for: {answer}"
    );
    assert_eq!(addons.get("cluster-addon-hooked").await.unwrap().spec.hook, "");
    eventually(
        "the ClusterAddon settles after AfterClusterUpgrade",
        CONVERGE,
        || async { done(addons.get("cluster-addon-hooked").await.unwrap()) },
    )
    .await;
    server.shutdown(Duration::from_secs(1)).await;
    operator.stop().await;
    own.stop();
}

/// Sets the replicas of Deployment `name`, as someone else than the operator would.
/// Sets the ConfigMap `kube-system/upgrade-gate` (someone else's) to `state`.
async fn set_gate(gates: &Api<k8s_openapi::api::core::v1::ConfigMap>, state: &str) {
    let gate = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "upgrade-gate"}, "data": {"state": state}});
    gates
        .patch(
            "upgrade-gate",
            &PatchParams::apply("someone-else").force(),
            &Patch::Apply(&gate),
        )
        .await
        .unwrap();
}

async fn set_replicas(deployments: &Api<Deployment>, name: &str, replicas: impl serde::Serialize) {
    deployments
        .patch(
            name,
            &PatchParams::apply("someone-else").force(),
            &Patch::Apply(
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": replicas}}),
            ),
        )
        .await
        .unwrap();
}

async fn replicas(deployments: &Api<Deployment>, name: &str) -> Option<i32> {
    deployments.get(name).await.unwrap().spec.unwrap().replicas
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_stages_and_dropped_charts_remove_their_objects_and_an_empty_render_removes_nothing() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let own = workload_plane("workload-delete-stage").await;
    let ns = cso_testenv::namespace(&client, "delete-stage").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let header = "apiVersion: clusteraddonconfig.x-k8s.io/v1alpha1\naddonStages:\n";
    // v1 installs both charts; v2's upgrade deletes ngnix with a delete stage; v3 no longer names ngnix.
    staged_release(
        dir.path(),
        "v1",
        &format!(
            "{header}  AfterControlPlaneInitialized:\n    - {{name: metrics-server, action: apply}}\n    - {{name: ngnix, action: apply}}\n"
        ),
    );
    staged_release(
        dir.path(),
        "v2",
        &format!(
            "{header}  AfterControlPlaneInitialized:\n    - {{name: metrics-server, action: apply}}\n  BeforeClusterUpgrade:\n    - {{name: ngnix, action: delete}}\n    - {{name: metrics-server, action: apply}}\n"
        ),
    );
    staged_release(
        dir.path(),
        "v3",
        &format!(
            "{header}  AfterControlPlaneInitialized:\n    - {{name: metrics-server, action: apply}}\n  BeforeClusterUpgrade:\n    - {{name: metrics-server, action: apply}}\n"
        ),
    );
    // v4: as v3, but its metrics-server chart lost its templates (a broken release): it renders nothing.
    staged_release_with_empty(
        dir.path(),
        "v4",
        &format!(
            "{header}  AfterControlPlaneInitialized:\n    - {{name: metrics-server, action: apply}}\n  BeforeClusterUpgrade:\n    - {{name: metrics-server, action: apply}}\n"
        ),
        Some("metrics-server"),
    );
    let operator = RunningOperator::local(&client, &ns, dir.path()).await;
    let mut spec = ferrol_spec(&["v1", "v2", "v3", "v4"]);
    spec["name"] = json!("staged");
    create_stack(&client, &ns, "staged", spec).await;
    cso_testenv::kubeconfig_secret(&client, &ns, "del", own.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(&client, &ns, "del", "docker-staged-1-27-v1").await;
    let addon = ready_addon(&client, &ns, "del", "docker-staged-1-27-v1").await;
    let deployments: Api<Deployment> = kube_system(&own).await;
    assert!(
        deployments
            .get_opt("cluster-addon-ngnix")
            .await
            .unwrap()
            .is_some()
    );
    let inventory = |addon: &ClusterAddon| -> Vec<String> {
        addon
            .status
            .as_ref()
            .unwrap()
            .resources
            .iter()
            .map(|r| format!("{}/{}", r.kind, r.name))
            .collect()
    };
    assert!(inventory(&addon).contains(&"Deployment/cluster-addon-ngnix".to_owned()));

    move_cluster(&client, &ns, "del", "docker-staged-1-27-v2").await;
    let addon = ready_addon(&client, &ns, "del", "docker-staged-1-27-v2").await;
    assert!(
        deployments
            .get_opt("cluster-addon-ngnix")
            .await
            .unwrap()
            .is_none(),
        "deleted by the delete stage"
    );
    assert!(deployments.get_opt("metrics-server").await.unwrap().is_some());
    assert!(
        !inventory(&addon).iter().any(|o| o.contains("ngnix")),
        "{:?}",
        inventory(&addon)
    );

    // Another cluster on v1 (ngnix installed again), moved to v3, which has no ngnix stage at all: its
    // objects are removed too.
    cso_testenv::kubeconfig_secret(&client, &ns, "drop", own.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(&client, &ns, "drop", "docker-staged-1-27-v1").await;
    ready_addon(&client, &ns, "drop", "docker-staged-1-27-v1").await;
    assert!(
        deployments
            .get_opt("cluster-addon-ngnix")
            .await
            .unwrap()
            .is_some()
    );
    move_cluster(&client, &ns, "drop", "docker-staged-1-27-v3").await;
    let addon = ready_addon(&client, &ns, "drop", "docker-staged-1-27-v3").await;
    assert!(
        deployments
            .get_opt("cluster-addon-ngnix")
            .await
            .unwrap()
            .is_none(),
        "a dropped chart's objects go"
    );
    assert!(
        !inventory(&addon).iter().any(|o| o.contains("ngnix")),
        "{:?}",
        inventory(&addon)
    );

    // v4's stage renders no objects: held, not taken as "the release has none". Nothing is pruned, the
    // addon is not ready and says why.
    let before = inventory(&addon);
    move_cluster(&client, &ns, "drop", "docker-staged-1-27-v4").await;
    let message = wait_condition::<ClusterAddon>(
        &client,
        &ns,
        "cluster-addon-drop",
        condition::HELM_CHART_APPLIED,
        reason::PRUNE_HELD,
    )
    .await;
    assert!(
        message.contains("stage metrics-server") && message.contains("the render has no objects"),
        "{message}"
    );
    assert!(
        deployments.get_opt("metrics-server").await.unwrap().is_some(),
        "nothing pruned"
    );
    let held = Api::<ClusterAddon>::namespaced(client.clone(), &ns)
        .get("cluster-addon-drop")
        .await
        .unwrap();
    assert!(!held.status.as_ref().unwrap().ready);
    assert_eq!(inventory(&held), before, "the inventory is kept");
    operator.stop().await;
    own.stop();
}

/// Values templates see the whole Cluster as the management cluster has it (labels, networks, topology
/// variables), and its control plane, not the operator's typed view: the Go operator passes the full objects
/// and real stacks template such fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addon_values_see_the_whole_cluster_and_its_control_plane() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let own = workload_plane("workload-whole-cluster").await;
    let ns = cso_testenv::namespace(&client, "whole-cluster").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    ferrol_v1_with_values(
        dir.path(),
        r#"values: |
  metrics-server:
    commonLabels:
      clusterAddonVersion: "v1"
    deploymentAnnotations:
      cso.test/name: '{{ .Cluster.metadata.name }}'
      cso.test/team: '{{ .Cluster.metadata.labels.team }}'
      cso.test/pod-cidrs: '{{ join "," .Cluster.spec.clusterNetwork.pods.cidrBlocks }}'
      cso.test/variables: '{{ toJson .Cluster.spec.topology.variables }}'
      cso.test/control-plane-replicas: '{{ .ControlPlane.spec.replicas }}'
"#,
    );
    let operator = RunningOperator::local(&client, &ns, dir.path()).await;
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1"])).await;
    ready_release(&client, &ns, "docker-ferrol-1-27-v1").await;
    cso_testenv::kubeconfig_secret(&client, &ns, "c9", own.kubeconfig_yaml())
        .await
        .unwrap();

    let control_plane = kube::discovery::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "controlplane.cluster.x-k8s.io",
        "v1beta1",
        "KubeadmControlPlane",
    ));
    let create = |resource: kube::discovery::ApiResource, object: serde_json::Value| {
        let client = client.clone();
        let ns = ns.clone();
        async move {
            let object: kube::api::DynamicObject = serde_json::from_value(object).unwrap();
            dynamic(&client, &ns, &resource)
                .create(&Default::default(), &object)
                .await
                .unwrap();
        }
    };
    create(
        control_plane,
        json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1", "kind": "KubeadmControlPlane",
               "metadata": {"name": "c9-cp"},
               "spec": {"version": "v1.27.3", "replicas": 3, "kubeadmConfigSpec": {},
                        "machineTemplate": {"infrastructureRef": {
                            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
                            "kind": "DockerMachineTemplate", "name": "c9-cp"}}}}),
    )
    .await;
    create(
        capi("Cluster"),
        json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
               "metadata": {"name": "c9", "labels": {"team": "blue"}},
               "spec": {
                   "clusterNetwork": {"pods": {"cidrBlocks": ["10.244.0.0/16", "fd10:244::/104"]}},
                   "topology": {"class": "docker-ferrol-1-27-v1", "version": "v1.27.3",
                                "variables": [{"name": "region", "value": "eu-north"}]},
                   "controlPlaneEndpoint": {"host": "c9.example.test", "port": 6443},
                   "controlPlaneRef": {"apiVersion": "controlplane.cluster.x-k8s.io/v1beta1",
                                       "kind": "KubeadmControlPlane", "name": "c9-cp"}}}),
    )
    .await;

    ready_addon(&client, &ns, "c9", "docker-ferrol-1-27-v1").await;
    let metrics = kube_system(&own).await.get("metrics-server").await.unwrap();
    let annotation = |key: &str| metrics.annotations().get(key).cloned().unwrap_or_default();
    assert_eq!(annotation("cso.test/name"), "c9", "{:?}", metrics.annotations());
    assert_eq!(annotation("cso.test/team"), "blue");
    assert_eq!(annotation("cso.test/pod-cidrs"), "10.244.0.0/16,fd10:244::/104");
    assert_eq!(
        annotation("cso.test/variables"),
        r#"[{"name":"region","value":"eu-north"}]"#
    );
    assert_eq!(annotation("cso.test/control-plane-replicas"), "3");
    operator.stop().await;
    own.stop();
}

/// Deletes `name` and waits until it is there again, as another object (another uid).
async fn deleted_and_made_again<K>(api: &Api<K>, name: &str, what: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let uid = api.get(name).await.unwrap().uid();
    api.delete(name, &DeleteParams::default()).await.unwrap();
    eventually(what, CONVERGE, || async {
        api.get_opt(name).await.unwrap().filter(|o| o.uid() != uid)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_is_found_by_watching_and_an_idle_operator_writes_nothing() {
    let client = cso_testenv::shared_management().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "drift-watch").await.unwrap();
    let workload_plane = workload_plane("drift-watch").await;
    let workload = workload_plane.client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    local_releases(dir.path(), &["docker-ferrol-1-27-v1"]);
    // No periodic pass for an hour: whatever is put back below, the watches found.
    let operator = RunningOperator::local_with(&client, &ns, dir.path(), |s| {
        s.resync_interval = Duration::from_secs(3600)
    })
    .await;
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1"])).await;
    ready_release(&client, &ns, "docker-ferrol-1-27-v1").await;
    cso_testenv::kubeconfig_secret(&client, &ns, "c1", workload_plane.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(&client, &ns, "c1", "docker-ferrol-1-27-v1").await;
    ready_addon(&client, &ns, "c1", "docker-ferrol-1-27-v1").await;

    // Deleted: made again.
    let deployments: Api<Deployment> = Api::namespaced(workload.clone(), "kube-system");
    deleted_and_made_again(
        &deployments,
        "metrics-server",
        "the deleted metrics-server is made again",
    )
    .await;
    // A field we set, edited by someone else (the spec's generation moves): put back.
    let owned = cso_api::OWNED_LABEL;
    let edit = json!({"spec": {"template": {"metadata": {"labels": {owned.0: "edited"}}}}});
    deployments
        .patch("metrics-server", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    eventually("the edited pod template label is put back", CONVERGE, || async {
        let d = deployments.get("metrics-server").await.unwrap();
        let labels = d.spec?.template.metadata?.labels?;
        (labels.get(owned.0).map(String::as_str) == Some(owned.1)).then_some(())
    })
    .await;
    // The operator's label taken away (the object leaves the watches' selection): put back.
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(workload.clone());
    let role = roles
        .list(&kube::api::ListParams::default().labels(&format!("{}={}", owned.0, owned.1)))
        .await
        .unwrap()
        .items
        .into_iter()
        .next()
        .expect("the addons have a ClusterRole")
        .name_any();
    let unlabel = json!({"metadata": {"labels": {owned.0: null}}});
    roles
        .patch(&role, &PatchParams::default(), &Patch::Merge(&unlabel))
        .await
        .unwrap();
    eventually("the ClusterRole gets its label back", CONVERGE, || async {
        let role = roles.get(&role).await.unwrap();
        (role.labels().get(owned.0).map(String::as_str) == Some(owned.1)).then_some(())
    })
    .await;
    operator.stop().await;
    // While no operator runs, the ClusterRole loses the operator's label once more.
    roles
        .patch(&role, &PatchParams::default(), &Patch::Merge(&unlabel))
        .await
        .unwrap();
    let writes_before_restart = workload_writes(&workload).await;
    let readyz_asked = |metrics: String| {
        counter(
            &metrics,
            "apiserver_request_total",
            &["subresource=\"/readyz\"", "verb=\"GET\""],
        )
    };
    let readyz_before_restart = readyz_asked(workload_metrics(&workload).await);

    // Restarted with a periodic pass every 2 s: the first pass reads each object it has not applied in this
    // process and writes only the one that is not as an apply of the same content left it (the ClusterRole);
    // from then on every pass finds all as applied and writes nothing.
    let source = Arc::new(cso_release::source::local::LocalSource::new(
        dir.path().join("cluster-stacks"),
    ));
    let (parts, renderer) = support::operator(&client, &ns, dir.path(), source, |s| {
        s.resync_interval = Duration::from_secs(2)
    });
    let metrics = parts.metrics.clone();
    let operator = RunningOperator::run(parts, renderer).await;
    eventually(
        "the first pass put the ClusterRole's label back",
        CONVERGE,
        || async {
            let role = roles.get(&role).await.unwrap();
            (role.labels().get(owned.0).map(String::as_str) == Some(owned.1)).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let writes = workload_writes(&workload).await;
    let written: BTreeMap<&String, f64> = writes
        .iter()
        .map(|(request, count)| {
            (
                request,
                count - writes_before_restart.get(request).copied().unwrap_or(0.0),
            )
        })
        .filter(|(_, count)| *count > 0.0)
        .collect();
    assert_eq!(
        written,
        BTreeMap::from([(&"APPLY clusterroles".to_owned(), 1.0)]),
        "the restarted operator wrote only the object changed while it was away"
    );
    assert_eq!(
        counter(&metrics.encode(), "cso_objects_applied_total", &[]),
        1.0,
        "the metric counts the one object written"
    );
    let readyz = readyz_asked(workload_metrics(&workload).await);
    assert!(
        readyz > readyz_before_restart,
        "the restarted operator asked /readyz before its watches streamed"
    );
    let passes = counter(
        &metrics.encode(),
        "controller_runtime_reconcile_total",
        &["controller=\"clusteraddon\""],
    );
    tokio::time::sleep(Duration::from_secs(8)).await;
    let passes_after = counter(
        &metrics.encode(),
        "controller_runtime_reconcile_total",
        &["controller=\"clusteraddon\""],
    );
    assert!(
        passes_after >= passes + 2.0,
        "the periodic pass ran ({passes} → {passes_after} ClusterAddon reconciles)"
    );
    assert_eq!(
        workload_writes(&workload).await,
        writes,
        "no write to the workload cluster across {} periodic passes",
        passes_after - passes
    );
    assert_eq!(
        readyz_asked(workload_metrics(&workload).await),
        readyz,
        "no /readyz asked while the drift watches stream"
    );
    operator.stop().await;
}

/// `--drift-watches=false` (the Go operator's profile): no watch is opened in the workload cluster; the periodic
/// pass reads each object and writes nothing while all is as applied, and puts back what was deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_drift_watches_the_periodic_pass_finds_drift_and_writes_only_it() {
    let client = cso_testenv::shared_management().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "no-watch").await.unwrap();
    let workload_plane = workload_plane("no-watch").await;
    let workload = workload_plane.client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    local_releases(dir.path(), &["docker-ferrol-1-27-v1"]);
    let source = Arc::new(cso_release::source::local::LocalSource::new(
        dir.path().join("cluster-stacks"),
    ));
    let (parts, renderer) = support::operator(&client, &ns, dir.path(), source, |s| {
        s.resync_interval = Duration::from_secs(2);
        s.drift_watches = false;
    });
    let metrics = parts.metrics.clone();
    let operator = RunningOperator::run(parts, renderer).await;
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1"])).await;
    ready_release(&client, &ns, "docker-ferrol-1-27-v1").await;
    cso_testenv::kubeconfig_secret(&client, &ns, "c1", workload_plane.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(&client, &ns, "c1", "docker-ferrol-1-27-v1").await;
    ready_addon(&client, &ns, "c1", "docker-ferrol-1-27-v1").await;

    let passes = || {
        counter(
            &metrics.encode(),
            "controller_runtime_reconcile_total",
            &["controller=\"clusteraddon\""],
        )
    };
    let writes = workload_writes(&workload).await;
    let before = passes();
    eventually("two periodic passes", CONVERGE, || async {
        (passes() >= before + 2.0).then_some(())
    })
    .await;
    assert_eq!(
        workload_writes(&workload).await,
        writes,
        "periodic passes over objects as applied write nothing"
    );
    let watches = counter(
        &workload_metrics(&workload).await,
        "apiserver_longrunning_requests",
        &["verb=\"WATCH\"", "resource=\"deployments\""],
    );
    assert_eq!(watches, 0.0, "no watch of the applied kinds");

    let deployments: Api<Deployment> = Api::namespaced(workload.clone(), "kube-system");
    deleted_and_made_again(
        &deployments,
        "metrics-server",
        "the deleted metrics-server is made again by a periodic pass",
    )
    .await;
    operator.stop().await;
}
