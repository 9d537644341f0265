//! Taking over from the Go operator, end to end: the objects of a ferrol release applied to a management and
//! a workload cluster the way the Go operator applies them, its ClusterStackRelease and ClusterAddon with the
//! status it writes (inventories with `namespace: ""` for objects rendered without a namespace), then cso
//! started on the same clusters, as `cso run` starts by default (taking over the field manager `kubectl`).
//! Nothing may be deleted and no pod template may change (a changed pod template rolls every addon pod).
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod support;

use std::{collections::BTreeMap, time::Duration};

use cso_api::{
    ClusterAddon, ClusterStackRelease, ReleaseId,
    cluster_addon::{CLUSTER_ADDON_FINALIZER, STAGE_ANNOTATION},
    cluster_stack_release::CLUSTER_STACK_RELEASE_FINALIZER,
    conditions::{ConditionsExt, READY},
    names::{RELEASE_LABEL, condition},
};
use cso_release::{AddonStyle, Release};
use cso_render::{Helm, Manifest, ValuesTemplater};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
};
use serde_json::{Value, json};
use support::*;

const TAG: &str = "docker-ferrol-1-27-v1";

/// One object the Go operator applied: where it is and what it was right after.
struct Applied {
    /// `Kind namespace/name`, for messages.
    name: String,
    gvk: GroupVersionKind,
    namespace: Option<String>,
    uid: String,
    /// Its spec (`null` for kinds without one).
    spec: Value,
}

/// The status entry the Go operator records for a rendered object: the namespace as rendered (empty when
/// the chart names none, although the object went to the client's namespace), status `synced`.
fn go_entry(manifest: &Manifest) -> Value {
    let (group, version) = manifest.group_version();
    json!({
        "group": group, "version": version, "kind": manifest.kind(),
        "namespace": manifest.namespace().unwrap_or_default(), "name": manifest.name(), "status": "synced",
    })
}

fn go_conditions(types: &[&str]) -> Value {
    let now = "2026-01-01T00:00:00Z";
    Value::Array(
        types
            .iter()
            .map(|t| json!({"type": t, "status": "True", "lastTransitionTime": now}))
            .collect(),
    )
}

/// Applies `manifests` as the Go operator does and remembers each object's uid and spec.
async fn go_apply_all(client: &Client, namespace: &str, manifests: &[Manifest]) -> Vec<Applied> {
    let mut applied = Vec::new();
    for manifest in manifests {
        let object = go_operator_apply(client, namespace, manifest.object.clone()).await;
        let (group, version) = manifest.group_version();
        applied.push(Applied {
            name: format!(
                "{} {}/{}",
                manifest.kind(),
                object.metadata.namespace.clone().unwrap_or_default(),
                manifest.name()
            ),
            gvk: GroupVersionKind::gvk(group, version, manifest.kind()),
            namespace: object.metadata.namespace.clone(),
            uid: object.metadata.uid.clone().unwrap(),
            spec: object.data["spec"].clone(),
        });
    }
    applied
}

/// The live object of `applied`, if it exists and is not being deleted.
async fn live(client: &Client, applied: &Applied) -> Option<DynamicObject> {
    let (resource, _) = kube::discovery::pinned_kind(client, &applied.gvk).await.unwrap();
    let api: Api<DynamicObject> = match &applied.namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    api.get_opt(applied.name.rsplit('/').next().unwrap())
        .await
        .unwrap()
        .filter(|o| o.metadata.deletion_timestamp.is_none())
}

/// What changed since the Go operator applied: objects deleted (gone, or recreated with another uid), and
/// objects whose spec changed (for a Deployment or DaemonSet, its pod template among it).
async fn changes(client: &Client, objects: &[Applied]) -> (Vec<String>, Vec<String>) {
    let (mut deleted, mut changed) = (Vec::new(), Vec::new());
    for applied in objects {
        match live(client, applied).await {
            Some(object) if object.metadata.uid.as_deref() == Some(applied.uid.as_str()) => {
                // (Not by its generation: a Deployment counts changes of its annotations too, and the operator
                // adds its digest.)
                if object.data["spec"] != applied.spec {
                    changed.push(format!(
                        "{} (spec {} -> {})",
                        applied.name, applied.spec, object.data["spec"]
                    ));
                }
            }
            _ => deleted.push(applied.name.clone()),
        }
    }
    (deleted, changed)
}

fn has_release_label(object: &DynamicObject) -> bool {
    object.labels().get(RELEASE_LABEL).is_some_and(|v| v == TAG)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taking_over_from_the_go_operator_deletes_nothing_and_rolls_no_pod() {
    let client = cso_testenv::shared_management().client().await.unwrap();
    let own = workload_plane("workload-takeover").await;
    let workload = own.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "takeover").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    local_releases(dir.path(), &[TAG]);

    // What the Go operator's ClusterStack and ClusterAddonCreate left: a ClusterStack, a Cluster of its
    // class (with its kubeconfig Secret).
    let stack = create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1"])).await;
    cso_testenv::kubeconfig_secret(&client, &ns, "c1", own.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(&client, &ns, "c1", TAG).await;
    let mut cluster = dynamic(&client, &ns, &capi("Cluster")).get("c1").await.unwrap();
    cluster.metadata.managed_fields = None;

    // The release rendered as the Go operator renders it: the same charts, the values templated over the
    // Cluster.
    let release = Release::load(
        &dir.path().join("cluster-stacks").join(TAG),
        &ReleaseId::parse_tag(TAG).unwrap(),
    )
    .unwrap();
    let tools = cso_testenv::Tools::discover().unwrap();
    let helm_path = tools.helm.expect("helm (make tools)");
    let helm = Helm::new(&helm_path, Duration::from_secs(60)).unwrap();
    let templater = ValuesTemplater::new(Helm::new(&helm_path, Duration::from_secs(60)).unwrap()).unwrap();
    let class_objects = cso_controller::rendering::render(
        &helm,
        cso_controller::rendering::cluster_class_request(&release, &ns),
    )
    .await
    .unwrap();
    let AddonStyle::Single { values_file } = &release.addons else {
        panic!("{TAG} is a single-chart release");
    };
    let data = json!({"Cluster": serde_json::to_value(&cluster).unwrap()});
    let addon_objects = cso_controller::rendering::render_addon_chart(
        &helm,
        &templater,
        &release,
        &release.cluster_addon_archive,
        Some((values_file, &data)),
        None,
        None,
    )
    .await
    .unwrap();
    assert!(
        addon_objects
            .iter()
            .any(|m| m.kind() == "Deployment" && m.name() == "web" && m.namespace().is_none()),
        "the fixture renders Deployment web without a namespace"
    );

    // Applied as the Go operator applies: cluster-class objects into the release's namespace, addons into
    // the workload cluster's kube-system.
    let mut management_objects = go_apply_all(&client, &ns, &class_objects).await;
    let workload_objects = go_apply_all(&workload, "kube-system", &addon_objects).await;

    // Its ClusterStackRelease, with the status it writes.
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), &ns);
    let csr: ClusterStackRelease = serde_json::from_value(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStackRelease",
        "metadata": {
            "name": TAG, "namespace": ns, "finalizers": [CLUSTER_STACK_RELEASE_FINALIZER],
            "ownerReferences": [{"apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
                                 "name": "ferrol", "uid": stack.uid().unwrap()}],
        },
        "spec": {},
    }))
    .unwrap();
    releases.create(&PostParams::default(), &csr).await.unwrap();
    releases
        .patch_status(
            TAG,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "kubernetesVersion": "v1.27.3", "ready": true,
                "resources": class_objects.iter().map(go_entry).collect::<Vec<_>>(),
                "conditions": go_conditions(&[READY, condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
                    condition::HELM_CHART_APPLIED]),
            }})),
        )
        .await
        .unwrap();

    // Its ClusterAddon, with the spec and status it writes.
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    let cluster_ref = json!({"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster", "name": "c1",
                             "namespace": ns, "uid": cluster.uid().unwrap()});
    let addon: ClusterAddon = serde_json::from_value(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterAddon",
        "metadata": {
            "name": "cluster-addon-c1", "namespace": ns, "finalizers": [CLUSTER_ADDON_FINALIZER],
            "annotations": {STAGE_ANNOTATION: "created"},
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster", "name": "c1",
                                 "uid": cluster.uid().unwrap()}],
        },
        "spec": {"clusterRef": cluster_ref, "clusterStack": TAG, "version": "v1", "hook": ""},
    }))
    .unwrap();
    addons.create(&PostParams::default(), &addon).await.unwrap();
    let go_resources: Vec<Value> = addon_objects.iter().map(go_entry).collect();
    assert!(
        go_resources
            .iter()
            .any(|r| r["name"] == "web" && r["namespace"] == ""),
        "the Go operator's inventory has web without a namespace"
    );
    addons
        .patch_status(
            "cluster-addon-c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "ready": true, "resources": go_resources,
                "conditions": go_conditions(&[READY, condition::CLUSTER_READY, condition::HELM_CHART_APPLIED]),
            }})),
        )
        .await
        .unwrap();

    // cso takes over.
    let operator = RunningOperator::local_taking_over(&client, &ns, dir.path(), &["kubectl"]).await;

    // The ClusterStackRelease: cso applied the ClusterClass (its release label) and the release is ready.
    let class = management_objects
        .iter()
        .position(|a| a.gvk.kind == "ClusterClass")
        .unwrap();
    let class = management_objects.swap_remove(class);
    eventually("cso applied the ClusterClass", CONVERGE, || async {
        live(&client, &class).await.filter(has_release_label).map(|_| ())
    })
    .await;
    management_objects.push(class);
    ready_release(&client, &ns, TAG).await;

    // The ClusterAddon: cso applied the addons (their release label; its inventory names web where it
    // lives, which only cso writes) and the addon is ready.
    let web = workload_objects
        .iter()
        .find(|a| a.name.ends_with("/web"))
        .unwrap();
    let metrics = workload_objects
        .iter()
        .find(|a| a.gvk.kind == "Deployment" && a.name.ends_with("/metrics-server"))
        .unwrap();
    let addon = eventually("cso applied the addons", CONVERGE, || async {
        live(&workload, metrics).await.filter(has_release_label)?;
        let addon = addons.get("cluster-addon-c1").await.unwrap();
        let status = addon.status.as_ref()?;
        let recorded = status
            .resources
            .iter()
            .any(|r| r.kind == "Deployment" && r.name == "web" && r.namespace == "kube-system");
        (recorded && status.ready && addon.is_condition_true(condition::HELM_CHART_APPLIED)).then_some(addon)
    })
    .await;
    assert!(addon.is_condition_true(READY), "{:?}", addon.status);
    assert_eq!(addon.spec.cluster_stack, TAG);
    assert_eq!(addon.spec.version, "v1");
    // Anything a prune would do happens in the same apply; give it a moment more anyway.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let (deleted_workload, changed_workload) = changes(&workload, &workload_objects).await;
    let (deleted_management, changed_management) = changes(&client, &management_objects).await;
    let templates_changed: Vec<&String> = changed_workload
        .iter()
        .filter(|c| c.starts_with("Deployment ") || c.starts_with("DaemonSet "))
        .collect();
    println!(
        "take-over: {} workload and {} management objects; deleted: {} + {}; pod templates changed: {}",
        workload_objects.len(),
        management_objects.len(),
        deleted_workload.len(),
        deleted_management.len(),
        templates_changed.len()
    );
    assert!(
        deleted_workload.is_empty() && deleted_management.is_empty(),
        "objects deleted during the take-over: {deleted_workload:?} {deleted_management:?}"
    );
    assert!(
        templates_changed.is_empty(),
        "pod templates changed (every pod rolls): {templates_changed:?}"
    );
    assert!(
        changed_workload.is_empty() && changed_management.is_empty(),
        "specs changed: {changed_workload:?} {changed_management:?}"
    );
    assert!(
        live(&workload, web).await.is_some_and(|o| has_release_label(&o)),
        "Deployment kube-system/web is cso's now"
    );
    let pods_labelled: BTreeMap<String, bool> = {
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(workload.clone(), "kube-system");
        let mut labelled = BTreeMap::new();
        for deployment in deployments.list(&Default::default()).await.unwrap() {
            let template_labels = deployment
                .spec
                .as_ref()
                .and_then(|s| s.template.metadata.as_ref())
                .and_then(|m| m.labels.clone())
                .unwrap_or_default();
            labelled.insert(
                deployment.name_any(),
                template_labels
                    .get(cso_api::OWNED_LABEL.0)
                    .is_some_and(|v| v == cso_api::OWNED_LABEL.1),
            );
        }
        labelled
    };
    assert!(
        pods_labelled.values().all(|l| *l),
        "pod templates keep the Go operator's label: {pods_labelled:?}"
    );
    operator.stop().await;
    own.stop();
}
