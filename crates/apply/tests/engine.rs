//! The apply engine against a real API server, with real `helm` renders of the fixture releases.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use cso_apply::{ApplyEngine, ClusterDiscovery, DEFAULT_FIELD_MANAGER};
use cso_render::{ChartRenderer, Helm, RenderRequest, parse_manifests};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube::{
    Api,
    api::{DynamicObject, PostParams},
    core::{ApiResource, GroupVersionKind},
};

fn fixture(path: &str) -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/releases")
        .join(path)
}

fn helm() -> Helm {
    let helm = cso_testenv::Tools::discover()
        .unwrap()
        .helm
        .expect("helm: run `make tools`");
    Helm::new(helm, Duration::from_secs(60)).unwrap()
}

async fn setup(prefix: &str) -> (kube::Client, String, ApplyEngine) {
    let client = cso_testenv::shared_management().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, prefix).await.unwrap();
    let engine = ApplyEngine::new(
        Arc::new(ClusterDiscovery::new(client.clone())),
        DEFAULT_FIELD_MANAGER,
    );
    (client, ns, engine)
}

fn release_label(tag: &str) -> BTreeMap<String, String> {
    [(cso_api::names::RELEASE_LABEL.to_owned(), tag.to_owned())].into()
}

fn capi(client: &kube::Client, ns: &str, group: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(group, "v1beta1", kind);
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, plural),
    )
}

#[tokio::test]
async fn the_ferrol_cluster_class_lands_in_its_namespace_and_reapplying_changes_nothing() {
    let (client, ns, engine) = setup("cluster-class").await;
    let rendered = helm()
        .render(RenderRequest {
            chart: fixture("docker-ferrol-1-27-v1/docker-ferrol-1-27-cluster-class-v1.tgz"),
            release_name: "docker-ferrol-1-27".into(),
            namespace: ns.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let manifests = parse_manifests(&rendered).unwrap();
    let report = engine
        .apply(&manifests, &ns, &release_label("docker-ferrol-1-27-v1"), &[])
        .await;
    assert!(report.is_complete(), "{}", report.failure_summary());
    assert_eq!(report.resources.len(), 5);

    let class = capi(&client, &ns, "cluster.x-k8s.io", "ClusterClass", "clusterclasses")
        .get("docker-ferrol-1-27-v1")
        .await
        .unwrap();
    let labels = class.metadata.labels.clone().unwrap();
    assert_eq!(
        labels.get("clusterstack.x-k8s.io/instance").map(String::as_str),
        Some("owned")
    );
    assert_eq!(
        labels.get(cso_api::names::RELEASE_LABEL).map(String::as_str),
        Some("docker-ferrol-1-27-v1")
    );
    let templates = [
        (
            "controlplane.cluster.x-k8s.io",
            "KubeadmControlPlaneTemplate",
            "kubeadmcontrolplanetemplates",
        ),
        (
            "infrastructure.cluster.x-k8s.io",
            "DockerClusterTemplate",
            "dockerclustertemplates",
        ),
        (
            "infrastructure.cluster.x-k8s.io",
            "DockerMachineTemplate",
            "dockermachinetemplates",
        ),
        (
            "bootstrap.cluster.x-k8s.io",
            "KubeadmConfigTemplate",
            "kubeadmconfigtemplates",
        ),
    ];
    let mut versions = vec![class.metadata.resource_version.clone()];
    for (group, kind, plural) in templates {
        let list = capi(&client, &ns, group, kind, plural)
            .list(&Default::default())
            .await
            .unwrap();
        assert_eq!(list.items.len(), 1, "{kind} in {ns}");
        versions.push(list.items[0].metadata.resource_version.clone());
    }

    let again = engine
        .apply(
            &manifests,
            &ns,
            &release_label("docker-ferrol-1-27-v1"),
            &report.resources,
        )
        .await;
    assert!(
        again.is_complete() && again.pruned.is_empty(),
        "{}",
        again.failure_summary()
    );
    let mut after = vec![
        capi(&client, &ns, "cluster.x-k8s.io", "ClusterClass", "clusterclasses")
            .get("docker-ferrol-1-27-v1")
            .await
            .unwrap()
            .metadata
            .resource_version,
    ];
    for (group, kind, plural) in templates {
        after.push(
            capi(&client, &ns, group, kind, plural)
                .list(&Default::default())
                .await
                .unwrap()
                .items[0]
                .metadata
                .resource_version
                .clone(),
        );
    }
    assert_eq!(
        versions, after,
        "re-applying an unchanged render changes no resourceVersion"
    );
}

async fn render_ferrol_addon(
    release: &str,
    addon: &str,
    ns: &str,
    version_label: &str,
) -> Vec<cso_render::Manifest> {
    let rendered = helm()
        .render(RenderRequest {
            chart: fixture(&format!("{release}/docker-ferrol-1-27-cluster-addon-{addon}.tgz")),
            release_name: "cluster-addon".into(),
            namespace: ns.into(),
            values: Some(format!(
                "metrics-server:\n  commonLabels:\n    clusterAddonVersion: \"{version_label}\"\n"
            )),
            kube_version: Some("v1.27.3".into()),
            include_crds: true,
            ..Default::default()
        })
        .await
        .unwrap();
    parse_manifests(&rendered).unwrap()
}

#[tokio::test]
async fn an_addon_upgrade_updates_changed_objects_and_prunes_removed_ones() {
    let (client, ns, engine) = setup("addon-upgrade").await;
    let v1 = render_ferrol_addon("docker-ferrol-1-27-v1", "v1", &ns, "v1").await;
    let first = engine
        .apply(&v1, &ns, &release_label("docker-ferrol-1-27-v1"), &[])
        .await;
    assert!(first.is_complete(), "{}", first.failure_summary());
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deployments
        .get("web")
        .await
        .expect("Deployment web, rendered without a namespace, lands in the release namespace");
    let same_name: Vec<&str> = first
        .resources
        .iter()
        .filter(|r| r.name == "metrics-server" && r.namespace == ns)
        .map(|r| r.kind.as_str())
        .collect();
    for kind in ["ServiceAccount", "Service", "Deployment"] {
        assert!(
            same_name.contains(&kind),
            "{kind} metrics-server is tracked beside the others: {same_name:?}"
        );
    }

    let v2 = render_ferrol_addon("docker-ferrol-1-27-v2", "v2", &ns, "v2").await;
    let second = engine
        .apply(
            &v2,
            &ns,
            &release_label("docker-ferrol-1-27-v2"),
            &first.resources,
        )
        .await;
    assert!(second.is_complete(), "{}", second.failure_summary());
    assert!(
        second
            .pruned
            .iter()
            .any(|k| k.kind == "Deployment" && k.name == "web"),
        "{:?}",
        second.pruned
    );
    assert!(
        deployments.get_opt("web").await.unwrap().is_none(),
        "Deployment web is pruned"
    );
    let metrics = deployments.get("metrics-server").await.unwrap();
    assert_eq!(
        metrics
            .metadata
            .labels
            .unwrap()
            .get("clusterAddonVersion")
            .map(String::as_str),
        Some("v2")
    );
    assert!(
        !second.resources.iter().any(|r| r.name == "web"),
        "web left the inventory"
    );
}

#[tokio::test]
async fn own_namespaces_are_kept_and_foreign_objects_are_never_deleted() {
    let (client, ns, engine) = setup("namespaces").await;
    let other = cso_testenv::namespace(&client, "other").await.unwrap();
    let manifests = parse_manifests(&format!(
        "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: elsewhere\n  namespace: {other}\ndata: {{a: b}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: here\n"
    ))
    .unwrap();
    let report = engine.apply(&manifests, &ns, &BTreeMap::new(), &[]).await;
    assert!(report.is_complete(), "{}", report.failure_summary());
    let config_maps = |namespace: &str| Api::<ConfigMap>::namespaced(client.clone(), namespace);
    config_maps(&other)
        .get("elsewhere")
        .await
        .expect("an object's own namespace wins");
    config_maps(&ns)
        .get("here")
        .await
        .expect("objects without one get the release namespace");
    assert!(
        report
            .resources
            .iter()
            .any(|r| r.name == "elsewhere" && r.namespace == other),
        "the effective namespace is recorded"
    );

    // A ConfigMap someone else created, listed in an (old or tampered) inventory: never deleted.
    let foreign = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("foreign".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    config_maps(&ns)
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    let mut inventory = report.resources.clone();
    inventory.extend(["foreign", "never-there"].map(|name| cso_api::common::Resource {
        version: "v1".into(),
        kind: "ConfigMap".into(),
        namespace: ns.clone(),
        name: name.into(),
        ..Default::default()
    }));
    // The plan checks each entry as the prune will: the operator's objects would go, the foreign one stays,
    // the missing one needs nothing.
    let planned = engine.plan(&[], &ns, &BTreeMap::new(), &inventory).await;
    let planned_as = |change: cso_apply::Change| -> Vec<String> {
        let mut names: Vec<String> = planned
            .iter()
            .filter(|p| p.change == change)
            .map(|p| p.key.name.clone())
            .collect();
        names.sort();
        names
    };
    assert_eq!(planned_as(cso_apply::Change::Prune), ["elsewhere", "here"]);
    assert_eq!(planned_as(cso_apply::Change::Keep), ["foreign"]);
    assert_eq!(planned_as(cso_apply::Change::Absent), ["never-there"]);
    assert_eq!(planned.len(), 4);
    let empty = engine.apply(&[], &ns, &BTreeMap::new(), &inventory).await;
    assert!(empty.is_complete(), "{}", empty.failure_summary());
    let mut pruned: Vec<String> = empty.pruned.iter().map(|k| k.name.clone()).collect();
    pruned.sort();
    assert_eq!(
        pruned,
        planned_as(cso_apply::Change::Prune),
        "the plan predicted the prune"
    );
    assert_eq!(
        empty.pruned.len(),
        2,
        "the operator's own objects are pruned: {:?}",
        empty.pruned
    );
    assert!(empty.released.iter().any(|k| k.name == "foreign"));
    config_maps(&ns)
        .get("foreign")
        .await
        .expect("an object the operator did not apply is never deleted");
    assert!(config_maps(&ns).get_opt("here").await.unwrap().is_none());
}

#[tokio::test]
async fn crds_come_first_and_failures_are_listed_per_object() {
    let (client, ns, engine) = setup("crd-order").await;
    let suffix = ns.rsplit('-').next().unwrap().to_owned();
    let group = format!("t{suffix}.example.com");
    let rendered = format!(
        "---\napiVersion: {group}/v1\nkind: Widget\nmetadata:\n  name: w1\nspec: {{size: 3}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fine\n---\napiVersion: nowhere.example.com/v1\nkind: Ghost\nmetadata:\n  name: g\n---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: widgets.{group}\nspec:\n  group: {group}\n  scope: Namespaced\n  names: {{kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        type: object\n        x-kubernetes-preserve-unknown-fields: true\n"
    );
    let report = engine
        .apply(&parse_manifests(&rendered).unwrap(), &ns, &BTreeMap::new(), &[])
        .await;
    assert_eq!(report.failures.len(), 1, "{}", report.failure_summary());
    assert_eq!(report.failures[0].key.kind, "Ghost");
    assert!(
        report.failures[0].error.contains("does not serve"),
        "{}",
        report.failures[0].error
    );
    let widget = GroupVersionKind::gvk(&group, "v1", "Widget");
    let widgets: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::from_gvk_with_plural(&widget, "widgets"),
    );
    widgets
        .get("w1")
        .await
        .expect("the custom resource is applied after its CRD, in the same render");
    Api::<ConfigMap>::namespaced(client, &ns)
        .get("fine")
        .await
        .unwrap();
    let ghost = report.resources.iter().find(|r| r.kind == "Ghost").unwrap();
    assert_eq!(ghost.status, Some(cso_api::common::ResourceStatus::NotSynced));
}

/// Renders both stages of `docker-scs-1-30-v1` (Cilium, metrics-server) against the target cluster.
async fn render_scs_addons(renderer: &impl ChartRenderer, ns: &str) -> Vec<cso_render::Manifest> {
    let unpacked = tempfile::tempdir().unwrap();
    let addons = unpacked.path().join("addons");
    let archive = fixture("docker-scs-1-30-v1/docker-scs-1-30-cluster-addon-v1.tgz");
    cso_release::archive::unpack(&archive, &addons, Default::default()).unwrap();
    let mut manifests = Vec::new();
    for stage in ["cni", "metrics-server"] {
        let rendered = renderer
            .render(RenderRequest {
                chart: addons.join(stage),
                release_name: "cluster-addon".into(),
                namespace: ns.into(),
                kube_version: Some("v1.30.10".into()),
                include_crds: true,
                target_kubeconfig: Some(cso_testenv::shared_management().kubeconfig_path().to_path_buf()),
                ..Default::default()
            })
            .await
            .unwrap();
        manifests.extend(parse_manifests(&rendered).unwrap());
    }
    manifests
}

#[tokio::test]
async fn scs_addons_with_minted_certificates_are_stable_across_renders() {
    let (client, ns, engine) = setup("scs-addons").await;
    let renderer = cso_render::CachingRenderer::new(helm(), cso_render::cache::DEFAULT_CAPACITY_BYTES);
    let first = engine
        .apply(
            &render_scs_addons(&renderer, &ns).await,
            &ns,
            &release_label("docker-scs-1-30-v1"),
            &[],
        )
        .await;
    assert!(first.is_complete(), "{}", first.failure_summary());
    assert!(
        first
            .resources
            .iter()
            .any(|r| r.kind == "DaemonSet" && r.name == "cilium")
    );
    assert!(
        first
            .resources
            .iter()
            .any(|r| r.kind == "Deployment" && r.name == "metrics-server")
    );

    let versions = |client: kube::Client, ns: String| async move {
        let mut all = BTreeMap::new();
        for (group, version, kind, plural) in [
            ("", "v1", "Secret", "secrets"),
            ("", "v1", "ConfigMap", "configmaps"),
            ("apps", "v1", "DaemonSet", "daemonsets"),
            ("apps", "v1", "Deployment", "deployments"),
        ] {
            let gvk = GroupVersionKind::gvk(group, version, kind);
            let api: Api<DynamicObject> = Api::namespaced_with(
                client.clone(),
                &ns,
                &ApiResource::from_gvk_with_plural(&gvk, plural),
            );
            for object in api.list(&Default::default()).await.unwrap() {
                all.insert(
                    format!("{kind}/{}", object.metadata.name.unwrap()),
                    object.metadata.resource_version.unwrap(),
                );
            }
        }
        all
    };
    let before = versions(client.clone(), ns.clone()).await;
    assert!(before.contains_key("Secret/cilium-ca"), "{before:?}");

    // Identical inputs render once: the second reconcile re-applies the same output and nothing changes.
    let second = engine
        .apply(
            &render_scs_addons(&renderer, &ns).await,
            &ns,
            &release_label("docker-scs-1-30-v1"),
            &first.resources,
        )
        .await;
    assert!(
        second.is_complete() && second.pruned.is_empty(),
        "{}",
        second.failure_summary()
    );
    assert_eq!(
        versions(client.clone(), ns.clone()).await,
        before,
        "no object changed, no certificate was rotated"
    );
    assert_eq!(renderer.stats(), (2, 2), "each stage rendered once");

    // Without the cache (an operator restart): `lookup` finds the CA, so the CA stays; Cilium's chart
    // mints the Hubble server certificate on every render by design, signed by that same CA.
    let fresh = engine
        .apply(
            &render_scs_addons(&helm(), &ns).await,
            &ns,
            &release_label("docker-scs-1-30-v1"),
            &second.resources,
        )
        .await;
    assert!(fresh.is_complete(), "{}", fresh.failure_summary());
    let after_restart = versions(client, ns).await;
    assert_eq!(
        after_restart["Secret/cilium-ca"], before["Secret/cilium-ca"],
        "the CA survives a render without the cache"
    );
}

#[tokio::test]
async fn objects_the_go_operator_applied_are_taken_over() {
    let (client, ns, engine) = setup("takeover").await;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    for name in ["kept", "taken"] {
        let old = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "1", "dropped": "x"}});
        config_maps
            .patch(
                name,
                &kube::api::PatchParams::apply("kubectl").force(),
                &kube::api::Patch::Apply(&old),
            )
            .await
            .unwrap();
    }
    let newer = |name: &str| {
        parse_manifests(&format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  a: \"2\"\n"
        ))
        .unwrap()
    };

    // Without taking over, the field the new release dropped stays, owned by `kubectl`.
    let report = engine.apply(&newer("kept"), &ns, &BTreeMap::new(), &[]).await;
    assert!(report.is_complete(), "{}", report.failure_summary());
    let kept = config_maps.get("kept").await.unwrap().data.unwrap();
    assert_eq!(
        (kept.get("a").map(String::as_str), kept.contains_key("dropped")),
        (Some("2"), true)
    );

    let taking_over = engine.clone().taking_over_from(["kubectl".to_owned()]);
    let report = taking_over
        .apply(&newer("taken"), &ns, &BTreeMap::new(), &[])
        .await;
    assert!(report.is_complete(), "{}", report.failure_summary());
    let taken = config_maps.get("taken").await.unwrap();
    let data = taken.data.unwrap();
    assert_eq!(
        (data.get("a").map(String::as_str), data.contains_key("dropped")),
        (Some("2"), false),
        "the dropped field is gone"
    );
    let managers: Vec<String> = taken
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .filter_map(|e| e.manager)
        .collect();
    assert!(
        managers.contains(&DEFAULT_FIELD_MANAGER.to_owned()) && !managers.contains(&"kubectl".to_owned()),
        "{managers:?}"
    );
}
