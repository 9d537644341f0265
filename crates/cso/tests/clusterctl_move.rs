//! Moving the management cluster with `clusterctl move` (issue 41), with `cso run` on both management
//! clusters: Cluster API v1.14's managers on each (the target in a network namespace of its own, see
//! `cso_testenv::capi::start_second_management_with_cluster_api`), clusterctl of the same release, both planes
//! prepared as `clusterctl init` leaves them, Kubernetes' garbage collector and a provider stand-in on each, one
//! workload API server both reach.
//!
//! A Cluster of the test stack (`docker-capi-1-33`) gets its addons and one finished upgrade (v1 → v2, with
//! stages at `BeforeClusterUpgrade` and `AfterClusterUpgrade`) by a ClusterStackRollout, which stays in
//! progress (its second wave bakes for an hour); then `clusterctl move --namespace <ns>`:
//! - on the target, the ClusterStack, its releases (with their provenance), their ClusterClasses, the Cluster,
//!   its ClusterAddon and the rollout; the ClusterAddon with the same spec, inventory, stages and readiness,
//!   the rollout with the same moves and waves (both statuses recorded on the source once the Cluster was
//!   paused, adopted by the copies), both blocking moves again;
//! - every addon object in the workload cluster unchanged (uid and resourceVersion) across the move and the
//!   target's periodic passes, nothing pruned, and no hook answered nor stage started by either operator
//!   meanwhile;
//! - on the source nothing left in the namespace;
//! - an upgrade on the target (v2 → v3, by hand) then runs its stages as before the move.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{collections::BTreeMap, path::Path, time::Duration};

use cso_api::{
    ClusterAddon, ClusterStack, ClusterStackRelease, ClusterStackRollout, MOVED_STATUS_ANNOTATION,
    capi::BLOCK_MOVE_ANNOTATION, cluster_addon::STAGE_INVENTORY_ANNOTATION,
};
use cso_testenv::{
    ControlPlane, Tools,
    capi::{ClusterApi, ClusterApiTools, Options},
    clusterctl::Clusterctl,
    stand_in::StandIn,
};
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

mod support;

use support::{capi_stack::*, *};

/// How long Cluster API and the operators get for one phase.
const PHASE: Duration = Duration::from_secs(180);
const STACK: &str = "capi-1-33";

/// v1 → v2 → v3 of `docker-capi-1-33`: each installs metrics-server; each upgrade applies it again before
/// the control plane moves, and ngnix after.
fn releases() -> Vec<Release> {
    let stages = format!(
        "{HEADER}  AfterControlPlaneInitialized:\n    - name: metrics-server\n      action: apply\n  \
         BeforeClusterUpgrade:\n    - name: metrics-server\n      action: apply\n  \
         AfterClusterUpgrade:\n    - name: ngnix\n      action: apply\n"
    );
    [("v1", "v1.33.4"), ("v2", "v1.33.5"), ("v3", "v1.33.6")]
        .into_iter()
        .map(|(version, kubernetes)| Release {
            minor: 33,
            version,
            kubernetes,
            kubernetes_versions: &[],
            clusteraddon_yaml: stages.clone(),
        })
        .collect()
}

/// One operator on one management plane: its hook server registered with that plane's Cluster API for `ns`.
struct Operator {
    process: KillOnDrop,
    log: std::path::PathBuf,
    metrics_port: u16,
}

/// Starts `cso run` on `plane` for namespace `ns`, its hook server reached by that plane's managers at
/// `address`, and registers it there.
async fn start_operator(
    plane: &ControlPlane,
    address: &str,
    ns: &str,
    github: &str,
    work: &Path,
    name: &str,
) -> Operator {
    let dir = work.join(name);
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let ca = cso_testenv::pki::write_serving_certificate_for(&certs, &[address.to_owned()]).unwrap();
    let instance = Instance::new(&certs, false);
    let log = dir.join("operator.log");
    let releases = dir.join("releases");
    std::fs::create_dir_all(&releases).unwrap();
    eprintln!("{name}'s log: {}", log.display());
    let process = start_operator_with(
        plane.kubeconfig_path(),
        &releases,
        Some(ns),
        &Source::Github(github),
        &log,
        &instance,
        &["--stage-timeout=30s", "--resync-interval=5s"],
    );
    let client = plane.client().await.unwrap();
    let extension = format!("cso-{name}");
    cso_testenv::capi::register_extension(
        &client,
        &extension,
        &format!("https://{address}:{}", instance.hook_port),
        &ca,
        &[ns.to_owned()],
    )
    .await
    .unwrap();
    cso_testenv::capi::discovered_hooks(&client, &extension, Duration::from_secs(60))
        .await
        .unwrap();
    Operator {
        process,
        log,
        metrics_port: instance.metrics_port,
    }
}

/// The messages of `log` that mean work on a hook: a hook call answered by starting something, a hook's
/// stages started.
fn hook_work(log: &Path) -> Vec<Value> {
    log_lines(log)
        .into_iter()
        .filter(|l| l["message"] == "starting the stages of a hook" || l["message"] == "hook started")
        .collect()
}

/// What the move must keep of a ClusterAddon: spec, the status but its conditions' times, and the
/// annotations the operator records its applies in.
fn kept(addon: &ClusterAddon) -> Value {
    let mut status = serde_json::to_value(addon.status.clone().unwrap_or_default()).unwrap();
    for condition in status["conditions"].as_array_mut().into_iter().flatten() {
        condition.as_object_mut().unwrap().remove("lastTransitionTime");
    }
    let annotations = addon.annotations();
    json!({
        "spec": addon.spec,
        "status": status,
        "stageInventory": annotations.get(STAGE_INVENTORY_ANNOTATION),
        "stage": annotations.get(cso_api::cluster_addon::STAGE_ANNOTATION),
    })
}

async fn cluster_addon(client: &Client, ns: &str) -> Option<ClusterAddon> {
    Api::<ClusterAddon>::namespaced(client.clone(), ns)
        .get_opt("cluster-addon-c1")
        .await
        .unwrap()
}

/// The rollout of c1 to v2 ([`baking_rollout`]), if it is there.
async fn rollout(client: &Client, ns: &str) -> Option<ClusterStackRollout> {
    Api::<ClusterStackRollout>::namespaced(client.clone(), ns)
        .get_opt("to-v2")
        .await
        .unwrap()
}

/// The release statuses by name: readiness and provenance.
async fn releases_kept(client: &Client, ns: &str) -> BTreeMap<String, Value> {
    Api::<ClusterStackRelease>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|r| {
            let status = r.status.clone().unwrap_or_default();
            (
                r.name_any(),
                json!({"ready": status.ready, "source": status.source, "kubernetesVersion": status.kubernetes_version}),
            )
        })
        .collect()
}

/// How many objects `api` lists; `None` when it cannot list them now.
async fn count<K>(api: Api<K>) -> Option<usize>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Some(api.list(&ListParams::default()).await.ok()?.items.len())
}

/// The uid and resourceVersion of every object in `addon`'s inventories (of its last apply and of its stages)
/// as the workload cluster has them, by `kind namespace/name`.
async fn versions_of(workload: &Client, addon: &ClusterAddon) -> BTreeMap<String, (String, String)> {
    let stages: BTreeMap<String, Vec<cso_api::common::Resource>> = addon
        .annotations()
        .get(STAGE_INVENTORY_ANNOTATION)
        .map(|text| serde_json::from_str(text).unwrap())
        .unwrap_or_default();
    let inventory = addon.status.iter().flat_map(|s| s.resources.iter());
    let mut versions = BTreeMap::new();
    for resource in inventory.chain(stages.values().flatten()) {
        let gvk = kube::core::GroupVersionKind::gvk(&resource.group, &resource.version, &resource.kind);
        let (api_resource, _) = kube::discovery::pinned_kind(workload, &gvk).await.unwrap();
        let api: Api<kube::api::DynamicObject> = if resource.namespace.is_empty() {
            Api::all_with(workload.clone(), &api_resource)
        } else {
            Api::namespaced_with(workload.clone(), &resource.namespace, &api_resource)
        };
        let object = api.get(&resource.name).await.unwrap();
        versions.insert(
            format!("{} {}/{}", resource.kind, resource.namespace, resource.name),
            (
                object.uid().unwrap_or_default(),
                object.resource_version().unwrap_or_default(),
            ),
        );
    }
    versions
}

/// `object` with the labels `labels`.
fn labelled(mut object: Value, labels: Value) -> Value {
    object["metadata"]["labels"] = labels;
    object
}

/// How Cluster `c1` is moved to another class.
enum Move {
    /// By hand: a patch of its class and version.
    ByHand,
    /// By a ClusterStackRollout of stack `capi-1-33`: its first wave takes `c1` (labelled `ring: 1`), and
    /// its second wave, empty, starts only after an hour's bake, so the rollout stays in progress.
    ByRollout,
}

/// The rollout of [`Move::ByRollout`] to `version` of the stack.
fn baking_rollout(ns: &str, version: &str) -> ClusterStackRollout {
    serde_json::from_value(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStackRollout",
        "metadata": {"name": format!("to-{version}"), "namespace": ns},
        "spec": {
            "clusterStack": "capi-1-33", "version": version,
            "waves": [{"name": "first", "clusterSelector": {"matchLabels": {"ring": "1"}}}, {"name": "rest"}],
            "bakeTime": "1h"
        }
    }))
    .unwrap()
}

/// Moves Cluster `c1` in `ns` to `class` (release `version` of the stack) at Kubernetes `kubernetes` and
/// waits until Cluster API has finished the upgrade (the hook answers in the operator's `log`).
async fn upgrade(
    client: &Client,
    ns: &str,
    (class, version, kubernetes): (&str, &str, &str),
    how: Move,
    log: &Path,
    cluster_api: &ClusterApi,
) {
    let clusters = api(
        client,
        "cluster.x-k8s.io",
        "v1beta2",
        "Cluster",
        "clusters",
        Some(ns),
    );
    match how {
        Move::ByHand => {
            clusters
                .patch(
                    "c1",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"topology": {
                        "classRef": {"name": class, "namespace": ns}, "version": kubernetes}}})),
                )
                .await
                .unwrap();
        }
        Move::ByRollout => {
            Api::<ClusterStackRollout>::namespaced(client.clone(), ns)
                .create(&PostParams::default(), &baking_rollout(ns, version))
                .await
                .unwrap();
        }
    }
    let control_planes = api(
        client,
        "controlplane.cluster.x-k8s.io",
        "v1beta2",
        "KubeadmControlPlane",
        "kubeadmcontrolplanes",
        Some(ns),
    );
    upgrade_finished(
        &clusters,
        &control_planes,
        &format!("{ns}/c1"),
        kubernetes,
        log,
        &format!("the upgrade to {class}"),
        cluster_api,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clusterctl_move_takes_stacks_releases_and_addons_along_and_applies_nothing_twice() {
    let tools = Tools::discover().unwrap();
    let capi = ClusterApiTools::discover().unwrap();
    let clusterctl = Clusterctl::discover().unwrap();
    let planes = cso_testenv::clusterctl::MovePlanes::start(&tools, &capi, &Options::default())
        .await
        .unwrap();
    let (source, target) = (&planes.source, &planes.target);
    let target_address = target.network.host_address().to_string();
    let workload_client = planes.workload.client().await.unwrap();
    let workload = planes.workload();
    let from = source.control_plane.client().await.unwrap();
    let to = target.control_plane.client().await.unwrap();
    let work = tempfile::Builder::new().prefix("cso-move").tempdir().unwrap();
    let work = if std::env::var_os("CSO_KEEP_TEST_DIRS").is_some() {
        work.keep()
    } else {
        work.path().to_path_buf()
    };
    let (from_kubeconfig, to_kubeconfig) = (&planes.source_kubeconfig, &planes.target_kubeconfig);

    let published = tempfile::tempdir().unwrap();
    let github = cso_testenv::github::FakeGithub::start(30).await.unwrap();
    for release in releases() {
        let dir = release.write(published.path());
        github.publish_dir(&release.tag(), &dir).unwrap();
    }
    let ns = cso_testenv::namespace(&from, "move").await.unwrap();
    let a = start_operator(
        &source.control_plane,
        "127.0.0.1",
        &ns,
        github.api_url(),
        &work,
        "a",
    )
    .await;

    // On the source: the stack, a Cluster with its addons, one finished upgrade.
    Api::<ClusterStack>::namespaced(from.clone(), &ns)
        .create(
            &PostParams::default(),
            &cluster_stack(&ns, 33, &["v1", "v2", "v3"]),
        )
        .await
        .unwrap();
    let _source_stand_in = StandIn::start(from.clone(), workload.clone());
    let source_clusters = api(
        &from,
        "cluster.x-k8s.io",
        "v1beta2",
        "Cluster",
        "clusters",
        Some(&ns),
    );
    wait_for("the three releases ready on the source", PHASE, || async {
        let releases = releases_kept(&from, &ns).await;
        (releases.len() == 3 && releases.values().all(|r| r["ready"] == true)).then_some(())
    })
    .await;
    source_clusters
        .create(
            &PostParams::default(),
            &serde_json::from_value(labelled(
                cluster(&ns, "c1", "docker-capi-1-33-v1", &ns, "v1.33.4"),
                json!({"ring": "1"}),
            ))
            .unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("Cluster API refused the Cluster: {e}"));
    wait_for("the addons of v1 on the source", PHASE, || async {
        let addon = cluster_addon(&from, &ns).await?;
        (addon.status.as_ref().is_some_and(|s| s.ready) && addon.spec.cluster_stack == "docker-capi-1-33-v1")
            .then_some(())
    })
    .await;
    upgrade(
        &from,
        &ns,
        ("docker-capi-1-33-v2", "v2", "v1.33.5"),
        Move::ByRollout,
        &a.log,
        &source.cluster_api,
    )
    .await;
    let workload_deployments: Api<Deployment> = Api::namespaced(workload_client.clone(), "kube-system");
    let before = wait_for("the upgrade's stages done on the source", PHASE, || async {
        let addon = cluster_addon(&from, &ns).await?;
        let done = addon.status.as_ref().is_some_and(|s| s.ready)
            && addon.spec.cluster_stack == "docker-capi-1-33-v2"
            && addon.spec.hook.is_empty()
            && workload_deployments
                .get_opt("cluster-addon-ngnix")
                .await
                .ok()?
                .is_some();
        done.then_some(addon)
    })
    .await;
    assert!(
        before.annotations().contains_key(BLOCK_MOVE_ANNOTATION),
        "a ClusterAddon blocks moves while its Cluster runs"
    );
    let source_releases = releases_kept(&from, &ns).await;
    let rollout_before = wait_for(
        "the rollout baking on the source (c1 moved, its wave finished) and blocking moves",
        PHASE,
        || async {
            let rollout = rollout(&from, &ns).await?;
            let status = rollout.status.as_ref()?;
            (status
                .moves
                .iter()
                .any(|m| m.cluster == format!("{ns}/c1") && m.outcome == "Moved")
                && status.waves.first()?.finished_at.is_some()
                && rollout.annotations().contains_key(BLOCK_MOVE_ANNOTATION))
            .then_some(rollout)
        },
    )
    .await;
    let rollout_status_before = rollout_before.status.clone().unwrap();
    assert_eq!(
        rollout_status_before.phase, "Progressing",
        "{rollout_status_before:?}"
    );

    // The target's operator and stand-in run before the move, as a site would have them.
    let b = start_operator(
        &target.control_plane,
        &target_address,
        &ns,
        github.api_url(),
        &work,
        "b",
    )
    .await;
    let _target_stand_in = StandIn::start(to.clone(), workload.clone());
    let writes_before = cso_testenv::control_plane::api_server_writes(&workload_client)
        .await
        .unwrap();
    let objects_before = versions_of(&workload_client, &before).await;
    assert!(objects_before.len() >= 10, "{objects_before:?}");
    let (a_hook_work, b_hook_work) = (hook_work(&a.log).len(), hook_work(&b.log).len());

    let output = clusterctl
        .move_clusters(from_kubeconfig, to_kubeconfig, Some(&ns))
        .await
        .unwrap_or_else(|e| panic!("clusterctl move failed: {e}"));
    eprintln!("clusterctl move:\n{output}");
    for kind in ["ClusterAddon", "ClusterStackRollout"] {
        assert!(
            log_lines(&a.log)
                .iter()
                .any(|l| l["message"] == "its Clusters paused: ready to be moved" && l["kind"] == kind),
            "the source's operator released the {kind} once the Cluster was paused"
        );
    }

    // On the target: everything, the ClusterAddon as it was, blocking moves again.
    let after = wait_for(
        "the ClusterAddon adopted and blocking moves on the target",
        PHASE,
        || async {
            let addon = cluster_addon(&to, &ns).await?;
            let annotations = addon.annotations();
            (annotations.contains_key(BLOCK_MOVE_ANNOTATION)
                && !annotations.contains_key(MOVED_STATUS_ANNOTATION))
            .then_some(addon)
        },
    )
    .await;
    assert_ne!(after.uid(), before.uid(), "a copy");
    assert_eq!(
        kept(&after),
        kept(&before),
        "the ClusterAddon kept its spec, status and records"
    );
    let target_clusters = api(
        &to,
        "cluster.x-k8s.io",
        "v1beta2",
        "Cluster",
        "clusters",
        Some(&ns),
    );
    let moved = serde_json::to_value(target_clusters.get("c1").await.unwrap()).unwrap();
    assert_ne!(
        moved.pointer("/spec/paused"),
        Some(&json!(true)),
        "unpaused on the target"
    );
    wait_for(
        "the releases ready on the target, from the same sources",
        PHASE,
        || async {
            let releases = releases_kept(&to, &ns).await;
            (releases == source_releases).then_some(())
        },
    )
    .await;
    let stack = wait_for("the ClusterStack ready on the target", PHASE, || async {
        let stack = Api::<ClusterStack>::namespaced(to.clone(), &ns)
            .get_opt(STACK)
            .await
            .ok()??;
        let summary = &stack.status.as_ref()?.summary;
        (summary.len() == 3 && summary.iter().all(|s| s.ready)).then_some(stack)
    })
    .await;
    assert_eq!(stack.spec.versions, ["v1", "v2", "v3"]);
    // The rollout goes on where it was: its memory of c1's move kept (the Clusters' generations are the
    // source's, so they are dropped), its first wave finished at the same time, the second one still baking.
    let mut expected_moves = rollout_status_before.moves.clone();
    for record in &mut expected_moves {
        record.generation = None;
    }
    let rollout_after = wait_for(
        "the rollout adopted on the target, blocking moves, where it was on the source",
        PHASE,
        || async {
            let rollout = rollout(&to, &ns).await?;
            let annotations = rollout.annotations();
            let status = rollout.status.as_ref()?;
            (annotations.contains_key(BLOCK_MOVE_ANNOTATION)
                && !annotations.contains_key(MOVED_STATUS_ANNOTATION)
                && status.moves == expected_moves
                && status.waves == rollout_status_before.waves)
                .then_some(rollout)
        },
    )
    .await;
    assert_ne!(rollout_after.uid(), rollout_before.uid(), "a copy");
    let rollout_status_after = rollout_after.status.clone().unwrap();
    assert_eq!(
        (&rollout_status_after.phase, &rollout_status_after.current_wave),
        (&rollout_status_before.phase, &rollout_status_before.current_wave),
    );

    // Nothing written to the workload cluster, across the move and the target's periodic passes.
    let passes = |port: u16| async move {
        metric_sum(
            &metrics_text(port).await,
            "controller_runtime_reconcile_total",
            &["controller=\"clusteraddon\""],
        )
    };
    let passes_before = passes(b.metrics_port).await;
    wait_for("two periodic passes on the target", PHASE, || async {
        (passes(b.metrics_port).await >= passes_before + 2.0).then_some(())
    })
    .await;
    let writes_after = cso_testenv::control_plane::api_server_writes(&workload_client)
        .await
        .unwrap();
    assert_eq!(
        versions_of(&workload_client, &after).await,
        objects_before,
        "every addon object in the workload cluster as it was: same uid, same resourceVersion"
    );
    // (The API server's own bookkeeping aside: its leases, and its ServiceCIDR's status.)
    let ours = |writes: &BTreeMap<String, f64>| -> BTreeMap<String, f64> {
        writes
            .iter()
            .filter(|(request, _)| !request.ends_with(" leases") && !request.ends_with(" servicecidrs"))
            .map(|(request, count)| (request.clone(), *count))
            .collect()
    };
    let (before_move, after_move) = (ours(&writes_before), ours(&writes_after));
    let deletes = |writes: &BTreeMap<String, f64>| -> f64 {
        writes
            .iter()
            .filter(|(request, _)| request.starts_with("DELETE"))
            .map(|(_, count)| count)
            .sum()
    };
    assert_eq!(deletes(&after_move), deletes(&before_move), "nothing pruned");
    // The target's first pass reads what its process has not applied and finds it as the source's last apply
    // of the same content left it; a periodic pass before its drift watches vouch reads again: nothing is
    // written to the workload cluster.
    eprintln!("workload write requests across the move: {before_move:?} -> {after_move:?}");
    assert_eq!(
        after_move, before_move,
        "no write to the workload cluster across the move and two passes"
    );
    assert_eq!(hook_work(&a.log).len(), a_hook_work, "no hook work on the source");
    assert_eq!(hook_work(&b.log).len(), b_hook_work, "no hook work on the target");

    // On the source, nothing left in the namespace; the workload cluster's addons are still there.
    wait_for("nothing left on the source", PHASE, || async {
        let left = count(Api::<ClusterStack>::namespaced(from.clone(), &ns)).await?
            + count(Api::<ClusterStackRelease>::namespaced(from.clone(), &ns)).await?
            + count(Api::<ClusterAddon>::namespaced(from.clone(), &ns)).await?
            + count(Api::<ClusterStackRollout>::namespaced(from.clone(), &ns)).await?
            + count(source_clusters.clone()).await?
            + count(api(
                &from,
                "cluster.x-k8s.io",
                "v1beta2",
                "ClusterClass",
                "clusterclasses",
                Some(&ns),
            ))
            .await?;
        (left == 0).then_some(())
    })
    .await;
    assert!(
        workload_deployments
            .get_opt("metrics-server")
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        workload_deployments
            .get_opt("cluster-addon-ngnix")
            .await
            .unwrap()
            .is_some()
    );

    // An upgrade on the target runs as before the move.
    upgrade(
        &to,
        &ns,
        ("docker-capi-1-33-v3", "v3", "v1.33.6"),
        Move::ByHand,
        &b.log,
        &target.cluster_api,
    )
    .await;
    wait_for("the upgrade's stages done on the target", PHASE, || async {
        let addon = cluster_addon(&to, &ns).await?;
        (addon.status.as_ref().is_some_and(|s| s.ready)
            && addon.spec.cluster_stack == "docker-capi-1-33-v3"
            && addon.spec.hook.is_empty())
        .then_some(())
    })
    .await;
    let upgrade_work: Vec<String> = hook_work(&b.log)[b_hook_work..]
        .iter()
        .filter(|l| l["message"] == "starting the stages of a hook")
        .map(|l| l["hook"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        upgrade_work,
        ["BeforeClusterUpgrade", "AfterClusterUpgrade"],
        "the upgrade's stages, each once, on the target"
    );
    drop(a.process);
    drop(b.process);
}
