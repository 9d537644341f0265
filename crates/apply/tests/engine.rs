//! The apply engine against a real API server, with real `helm` renders of the fixture releases.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use cso_apply::{ApplyEngine, ClusterDiscovery, DEFAULT_FIELD_MANAGER};
use cso_render::{ChartRenderer, Helm, RenderRequest, parse_manifests};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube::{
    Api, ResourceExt,
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

/// The ferrol v1 ClusterClass and its templates, rendered by `helm` for `namespace`.
async fn ferrol_class(namespace: &str) -> Vec<cso_render::Manifest> {
    let rendered = helm()
        .render(RenderRequest {
            chart: fixture("docker-ferrol-1-27-v1/docker-ferrol-1-27-cluster-class-v1.tgz"),
            release_name: "docker-ferrol-1-27".into(),
            namespace: namespace.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
    parse_manifests(&rendered).unwrap()
}

#[tokio::test]
async fn the_ferrol_cluster_class_lands_in_its_namespace_and_reapplying_changes_nothing() {
    let (client, ns, engine) = setup("cluster-class").await;
    let manifests = ferrol_class(&ns).await;
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

#[tokio::test]
async fn the_management_engine_writes_only_what_changed_also_after_a_restart() {
    let client = cso_testenv::shared_management().client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "only-changes").await.unwrap();
    let management = || ApplyEngine::for_management(Arc::new(ClusterDiscovery::new(client.clone())));
    let manifests = ferrol_class(&ns).await;
    let labels = release_label("docker-ferrol-1-27-v1");
    let classes = capi(&client, &ns, "cluster.x-k8s.io", "ClusterClass", "clusterclasses");
    let class_version = || async {
        classes
            .get("docker-ferrol-1-27-v1")
            .await
            .unwrap()
            .metadata
            .resource_version
    };

    let engine = management();
    let first = engine.apply(&manifests, &ns, &labels, &[]).await;
    assert!(first.is_complete(), "{}", first.failure_summary());
    assert_eq!(
        (first.applied, first.unchanged),
        (5, 0),
        "all five written at first"
    );
    let class = classes.get("docker-ferrol-1-27-v1").await.unwrap();
    let digest = class
        .annotations()
        .get(cso_api::APPLIED_DIGEST_ANNOTATION)
        .cloned();
    assert!(
        digest.as_deref().is_some_and(|d| d.starts_with("sha256:")),
        "{digest:?}"
    );
    let written = class.metadata.resource_version;

    let again = engine.apply(&manifests, &ns, &labels, &first.resources).await;
    assert_eq!((again.applied, again.unchanged), (5, 5), "nothing written again");
    let restarted = management()
        .apply(&manifests, &ns, &labels, &first.resources)
        .await;
    assert_eq!(
        (restarted.applied, restarted.unchanged),
        (5, 5),
        "nor by a new process"
    );
    assert_eq!(class_version().await, written);

    // Someone else changes a label the engine sets: that object, and only it, is written back.
    let edit = serde_json::json!({"metadata": {"labels": {cso_api::names::RELEASE_LABEL: "edited"}}});
    classes
        .patch(
            "docker-ferrol-1-27-v1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&edit),
        )
        .await
        .unwrap();
    let restored = management()
        .apply(&manifests, &ns, &labels, &first.resources)
        .await;
    assert_eq!(
        (restored.applied, restored.unchanged),
        (5, 4),
        "the edited class is written"
    );
    let class = classes.get("docker-ferrol-1-27-v1").await.unwrap();
    assert_eq!(
        class
            .labels()
            .get(cso_api::names::RELEASE_LABEL)
            .map(String::as_str),
        Some("docker-ferrol-1-27-v1")
    );

    // Other content (another release's labels): every object is written, with another digest.
    let other = engine
        .apply(
            &manifests,
            &ns,
            &release_label("docker-ferrol-1-27-v2"),
            &first.resources,
        )
        .await;
    assert_eq!((other.applied, other.unchanged), (5, 0), "new content is written");
    let class = classes.get("docker-ferrol-1-27-v1").await.unwrap();
    assert_ne!(
        class.annotations().get(cso_api::APPLIED_DIGEST_ANNOTATION),
        digest.as_ref()
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
async fn a_checking_apply_writes_only_what_someone_changed() {
    let (client, ns, engine) = setup("checking").await;
    let labels = release_label("docker-ferrol-1-27-v1");
    let v1 = render_ferrol_addon("docker-ferrol-1-27-v1", "v1", &ns, "v1").await;
    let first = engine.apply(&v1, &ns, &labels, &[]).await;
    assert!(first.is_complete(), "{}", first.failure_summary());

    let again = engine.apply_checking(&v1, &ns, &labels, &first.resources).await;
    assert!(again.is_complete(), "{}", again.failure_summary());
    assert_eq!(
        (again.unchanged, again.applied),
        (v1.len(), v1.len()),
        "every object is as the apply left it: read, none written"
    );

    // Someone edits one object and deletes another.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deployments
        .patch(
            "metrics-server",
            &kube::api::PatchParams::apply("someone").force(),
            &kube::api::Patch::Apply(serde_json::json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "metrics-server", "labels": {"clusterAddonVersion": "edited"}},
            })),
        )
        .await
        .unwrap();
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), &ns);
    accounts
        .delete("metrics-server", &Default::default())
        .await
        .unwrap();

    let checked = engine.apply_checking(&v1, &ns, &labels, &again.resources).await;
    assert!(checked.is_complete(), "{}", checked.failure_summary());
    assert_eq!(
        checked.unchanged,
        v1.len() - 2,
        "only the two changed objects are written"
    );
    let label = deployments
        .get("metrics-server")
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap();
    assert_eq!(label.get("clusterAddonVersion").map(String::as_str), Some("v1"));
    accounts
        .get("metrics-server")
        .await
        .expect("the deleted ServiceAccount is back");
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
        namespace: ns.clone().into(),
        name: name.into(),
        ..Default::default()
    }));
    // The next render has `here` and a new object. The plan checks each entry as the prune will: the
    // operator's object would go, the foreign one stays, the missing one needs nothing.
    let next = parse_manifests("---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: here\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: new\n").unwrap();
    let planned = engine.plan(&next, &ns, &BTreeMap::new(), &inventory).await;
    let planned_as = |change: cso_apply::Change| -> Vec<String> {
        let mut names: Vec<String> = planned
            .iter()
            .filter(|p| std::mem::discriminant(&p.change) == std::mem::discriminant(&change))
            .map(|p| p.key.name.to_string())
            .collect();
        names.sort();
        names
    };
    assert_eq!(planned_as(cso_apply::Change::Prune), ["elsewhere"]);
    assert_eq!(planned_as(cso_apply::Change::Keep(String::new())), ["foreign"]);
    assert_eq!(planned_as(cso_apply::Change::Absent), ["never-there"]);
    assert_eq!(planned.len(), 5);
    let applied = engine.apply(&next, &ns, &BTreeMap::new(), &inventory).await;
    assert!(applied.is_complete(), "{}", applied.failure_summary());
    let mut pruned: Vec<String> = applied.pruned.iter().map(|k| k.name.to_string()).collect();
    pruned.sort();
    assert_eq!(
        pruned,
        planned_as(cso_apply::Change::Prune),
        "the plan predicted the prune"
    );
    assert_eq!(
        applied.pruned.len(),
        1,
        "the operator's own object the render no longer has is pruned: {:?}",
        applied.pruned
    );
    assert!(applied.released.iter().any(|k| k.name == "foreign"));
    config_maps(&ns)
        .get("foreign")
        .await
        .expect("an object the operator did not apply is never deleted");
    assert!(config_maps(&other).get_opt("elsewhere").await.unwrap().is_none());
    config_maps(&ns).get("here").await.expect("still rendered");
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

#[tokio::test]
async fn a_first_apply_reads_nothing_to_take_over() {
    let (_, ns, _) = setup("first-apply").await;
    let tally = Arc::new(cso_apply::RequestTally::default());
    let config = cso_testenv::config_from_yaml(cso_testenv::shared_management().kubeconfig_yaml())
        .await
        .unwrap();
    let client =
        cso_apply::observed_client(config, cso_apply::ClientLimits::UNLIMITED, Some(tally.observer()))
            .unwrap();
    let engine = || {
        ApplyEngine::new(
            Arc::new(ClusterDiscovery::new(client.clone())),
            DEFAULT_FIELD_MANAGER,
        )
        .taking_over_from(["kubectl".to_owned()])
    };
    let config_maps = |prefix: &str| {
        let yaml: Vec<String> = (0..3)
            .map(|i| format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {prefix}-{i}\n"))
            .collect();
        parse_manifests(&yaml.join("---\n")).unwrap()
    };
    let reads = || {
        tally
            .counts()
            .iter()
            .filter(|(k, _)| k.verb == "get" && k.resource == "configmaps")
            .map(|(_, n)| *n)
            .sum::<u64>()
    };

    // An owner nothing was applied for: no read before the applies.
    let report = engine()
        .apply_first(&config_maps("first"), &ns, &BTreeMap::new())
        .await;
    assert!(report.is_complete(), "{}", report.failure_summary());
    assert_eq!(reads(), 0);
    // Any other apply reads each object once, before this engine's first apply of it.
    let report = engine()
        .apply(&config_maps("later"), &ns, &BTreeMap::new(), &[])
        .await;
    assert!(report.is_complete(), "{}", report.failure_summary());
    assert_eq!(reads(), 3);
}

// ---------------------------------------------------------------------------------------------------------
// Taking over from the Go operator, pod templates, shared namespaces, refused prunes.

fn owned(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels
        .and_then(|l| l.get(cso_api::OWNED_LABEL.0))
        .is_some_and(|v| v == cso_api::OWNED_LABEL.1)
}

async fn go_apply(client: &kube::Client, namespace: &str, object: serde_json::Value) -> DynamicObject {
    cso_testenv::go_operator::apply(client, namespace, object)
        .await
        .unwrap()
}

/// The inventory entry the Go operator records for a rendered object: the namespace as rendered (empty
/// when the chart names none), status `synced`.
fn go_entry(
    group: &str,
    version: &str,
    kind: &str,
    namespace: &str,
    name: &str,
) -> cso_api::common::Resource {
    cso_api::common::Resource {
        group: group.into(),
        version: version.into(),
        kind: kind.into(),
        namespace: namespace.into(),
        name: name.into(),
        status: Some(cso_api::common::ResourceStatus::Synced),
        error: String::new(),
    }
}

#[tokio::test]
async fn a_go_operator_inventory_with_empty_namespaces_prunes_nothing_the_render_still_has() {
    let (client, ns, engine) = setup("go-inventory").await;
    let engine = engine.taking_over_from(["kubectl".to_owned()]);
    let role = format!("{ns}-reader");
    let web = serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "nginx", "image": "nginx"}]}}}});
    let settings = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"a": "1"}});
    let old = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "old"}, "data": {"a": "1"}});
    // Charts often give cluster-scoped objects a namespace; the Go operator records it as rendered.
    let reader = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": role, "namespace": ns}, "rules": []});
    let mut uids = BTreeMap::new();
    for object in [&web, &settings, &old, &reader] {
        let applied = go_apply(&client, &ns, object.clone()).await;
        uids.insert(
            applied.metadata.name.clone().unwrap(),
            applied.metadata.uid.clone().unwrap(),
        );
    }
    let go_inventory = vec![
        go_entry("apps", "v1", "Deployment", "", "web"),
        go_entry("", "v1", "ConfigMap", "", "settings"),
        go_entry("", "v1", "ConfigMap", "", "old"),
        go_entry("rbac.authorization.k8s.io", "v1", "ClusterRole", &ns, &role),
    ];
    // The new release still renders web, settings and the ClusterRole; `old` is gone from it.
    let render: Vec<cso_render::Manifest> = parse_manifests(
        &[&web, &settings, &reader]
            .iter()
            .map(|o| format!("---\n{}\n", serde_json::to_string(o).unwrap()))
            .collect::<String>(),
    )
    .unwrap();
    let labels = release_label("docker-ferrol-1-27-v1");

    let planned = engine.plan(&render, &ns, &labels, &go_inventory).await;
    let predicted: Vec<String> = planned
        .iter()
        .filter(|p| p.change == cso_apply::Change::Prune)
        .map(|p| p.key.to_string())
        .collect();
    assert_eq!(predicted, [format!("ConfigMap {ns}/old")], "{planned:?}");

    let report = engine.apply(&render, &ns, &labels, &go_inventory).await;
    assert!(report.is_complete(), "{}", report.failure_summary());
    let pruned: Vec<String> = report.pruned.iter().map(ToString::to_string).collect();
    assert_eq!(
        pruned,
        [format!("ConfigMap {ns}/old")],
        "only what the render dropped is pruned"
    );
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(client.clone());
    let live = [
        (
            "web",
            deployments.get_opt("web").await.unwrap().map(|o| o.metadata),
        ),
        (
            "settings",
            config_maps.get_opt("settings").await.unwrap().map(|o| o.metadata),
        ),
        (
            role.as_str(),
            roles.get_opt(&role).await.unwrap().map(|o| o.metadata),
        ),
    ];
    for (name, metadata) in live {
        let metadata = metadata.unwrap_or_else(|| panic!("{name} was deleted"));
        assert_eq!(
            metadata.uid.as_ref(),
            uids.get(name),
            "{name} was deleted and recreated"
        );
        assert!(metadata.deletion_timestamp.is_none(), "{name} is being deleted");
    }
    assert!(config_maps.get_opt("old").await.unwrap().is_none());
    // The new inventory names the objects where they are.
    for (kind, namespace, name) in [
        ("Deployment", ns.as_str(), "web"),
        ("ConfigMap", ns.as_str(), "settings"),
        ("ClusterRole", "", role.as_str()),
    ] {
        assert_eq!(
            report
                .resources
                .iter()
                .filter(|r| r.kind == kind && r.name == name)
                .map(|r| r.namespace.as_str())
                .collect::<Vec<_>>(),
            [namespace],
            "{kind} {name}: {:?}",
            report.resources
        );
    }
}

#[tokio::test]
async fn pod_templates_carry_the_owned_label_as_the_go_operator_sets_it() {
    let (client, ns, engine) = setup("pod-templates").await;
    let template = |app: &str| {
        serde_json::json!({"metadata": {"labels": {"app": app}},
            "spec": {"restartPolicy": if app == "job" { "Never" } else { "Always" },
                     "containers": [{"name": "c", "image": "busybox"}]}})
    };
    let selector = |app: &str| serde_json::json!({"matchLabels": {"app": app}});
    let objects = [
        serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "deployment"},
            "spec": {"selector": selector("deployment"), "template": template("deployment")}}),
        serde_json::json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "statefulset"},
            "spec": {"serviceName": "s", "selector": selector("statefulset"), "template": template("statefulset")}}),
        serde_json::json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "daemonset"},
            "spec": {"selector": selector("daemonset"), "template": template("daemonset")}}),
        serde_json::json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "replicaset"},
            "spec": {"selector": selector("replicaset"), "template": template("replicaset")}}),
        serde_json::json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "job"},
            "spec": {"template": template("job")}}),
    ];
    let render = |objects: &[serde_json::Value]| {
        parse_manifests(
            &objects
                .iter()
                .map(|o| format!("---\n{}\n", serde_json::to_string(o).unwrap()))
                .collect::<String>(),
        )
        .unwrap()
    };
    let labels = release_label("docker-ferrol-1-27-v1");
    let report = engine.apply(&render(&objects), &ns, &labels, &[]).await;
    assert!(report.is_complete(), "{}", report.failure_summary());
    for (group, kind, plural, name) in [
        ("apps", "Deployment", "deployments", "deployment"),
        ("apps", "StatefulSet", "statefulsets", "statefulset"),
        ("apps", "DaemonSet", "daemonsets", "daemonset"),
        ("apps", "ReplicaSet", "replicasets", "replicaset"),
        ("batch", "Job", "jobs", "job"),
    ] {
        let gvk = GroupVersionKind::gvk(group, "v1", kind);
        let api: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &ns,
            &ApiResource::from_gvk_with_plural(&gvk, plural),
        );
        let live = api.get(name).await.unwrap();
        let template_labels: BTreeMap<String, String> =
            serde_json::from_value(live.data["spec"]["template"]["metadata"]["labels"].clone()).unwrap();
        assert!(owned(Some(&template_labels)), "{kind}: {template_labels:?}");
        assert!(
            !template_labels.contains_key(cso_api::names::RELEASE_LABEL),
            "{kind}: the release label stays off pod templates, so an upgrade does not roll pods"
        );
        assert_eq!(template_labels.get("app").map(String::as_str), Some(name));
    }

    // A Deployment the Go operator applied is taken over without a change of its pod template.
    let go_web = serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "go-web"},
        "spec": {"selector": selector("go-web"), "template": template("go-web")}});
    let before = go_apply(&client, &ns, go_web.clone()).await;
    let report = engine
        .clone()
        .taking_over_from(["kubectl".to_owned()])
        .apply(&render(&[go_web]), &ns, &labels, &[])
        .await;
    assert!(report.is_complete(), "{}", report.failure_summary());
    let after = Api::<Deployment>::namespaced(client.clone(), &ns)
        .get("go-web")
        .await
        .unwrap();
    // (Its generation moves: a Deployment counts changes of its annotations too, and the digest is one.)
    assert_eq!(
        after.spec.map(|spec| spec.template),
        serde_json::from_value::<Deployment>(serde_json::to_value(before).unwrap())
            .unwrap()
            .spec
            .map(|spec| spec.template),
        "the pod template did not change"
    );
}

/// A Namespace that existed before: the Go operator or an earlier cso may have labelled it as owned.
async fn label_owned(client: &kube::Client, namespace: &str) {
    go_apply(
        client,
        "",
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
    )
    .await;
}

fn namespace_manifest(name: &str) -> String {
    format!("---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n")
}

fn config_map_manifest(namespace: &str, name: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {namespace}\ndata: {{a: b}}\n"
    )
}

async fn foreign_config_map(client: &kube::Client, namespace: &str, name: &str) {
    let foreign = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
}

async fn live_namespace(client: &kube::Client, name: &str) -> Option<k8s_openapi::api::core::v1::Namespace> {
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .get_opt(name)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_release_that_stops_rendering_kube_system_upgrades_cleanly() {
    let (client, ns, engine) = setup("kube-system").await;
    let engine = engine.taking_over_from(["kubectl".to_owned()]);
    // As Cilium renders it; the Go operator (or an earlier cso) labelled it as owned.
    label_owned(&client, "kube-system").await;
    let labels = release_label("docker-scs-1-35-v1");
    let v1 =
        parse_manifests(&(namespace_manifest("kube-system") + &config_map_manifest(&ns, "cilium-config")))
            .unwrap();
    let first = engine.apply(&v1, &ns, &labels, &[]).await;
    assert!(first.is_complete(), "{}", first.failure_summary());
    let kube_system = live_namespace(&client, "kube-system").await.unwrap();
    assert!(
        !owned(kube_system.metadata.labels.as_ref()),
        "kube-system is never claimed: {:?}",
        kube_system.metadata.labels
    );

    // The next release no longer renders it.
    let v2 = parse_manifests(&config_map_manifest(&ns, "cilium-config")).unwrap();
    let mut previous = first.resources.clone();
    // Also as the inventory of an earlier operator records it.
    previous.push(go_entry("", "v1", "Namespace", "", "kube-system"));
    let planned = engine.plan(&v2, &ns, &labels, &previous).await;
    assert!(
        planned.iter().all(|p| p.change != cso_apply::Change::Prune),
        "--diff predicts no prune of kube-system: {planned:?}"
    );
    let second = engine.apply(&v2, &ns, &labels, &previous).await;
    assert!(second.is_complete(), "{}", second.failure_summary());
    assert!(second.pruned.is_empty(), "{:?}", second.pruned);
    assert!(
        !second.resources.iter().any(|r| r.kind == "Namespace"),
        "kube-system left the inventory: {:?}",
        second.resources
    );
    assert!(
        live_namespace(&client, "kube-system")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );
}

#[tokio::test]
async fn a_namespace_that_existed_before_is_never_claimed_nor_deleted() {
    let (client, ns, engine) = setup("shared-ns").await;
    // `monitoring`: created before the release, holding someone else's workload.
    let monitoring = cso_testenv::namespace(&client, "monitoring").await.unwrap();
    foreign_config_map(&client, &monitoring, "grafana").await;
    // `legacy`: as the Go operator left it (labelled as owned), also holding someone else's object.
    let legacy = cso_testenv::namespace(&client, "legacy").await.unwrap();
    label_owned(&client, &legacy).await;
    foreign_config_map(&client, &legacy, "theirs").await;

    let labels = release_label("docker-ferrol-1-27-v1");
    let v1 =
        parse_manifests(&(namespace_manifest(&monitoring) + &config_map_manifest(&monitoring, "dashboards")))
            .unwrap();
    let first = engine.apply(&v1, &ns, &labels, &[]).await;
    assert!(first.is_complete(), "{}", first.failure_summary());
    let live = live_namespace(&client, &monitoring).await.unwrap();
    assert!(
        !owned(live.metadata.labels.as_ref()),
        "a namespace that existed before is not claimed: {:?}",
        live.metadata.labels
    );

    // Release 2 renders neither (but two objects of its own); the inventory also lists `legacy`, as the Go
    // operator recorded it.
    let mut previous = first.resources.clone();
    previous.push(go_entry("", "v1", "Namespace", "", &legacy));
    let v2 = parse_manifests(&(config_map_manifest(&ns, "one") + &config_map_manifest(&ns, "two"))).unwrap();
    let planned = engine.plan(&v2, &ns, &labels, &previous).await;
    let change_of = |name: &str| {
        planned
            .iter()
            .find(|p| p.key.name == name)
            .map(|p| p.change.clone())
    };
    assert!(
        matches!(change_of(&monitoring), Some(cso_apply::Change::Keep(_))),
        "{planned:?}"
    );
    assert!(
        matches!(change_of(&legacy), Some(cso_apply::Change::Keep(_))),
        "{planned:?}"
    );
    assert_eq!(
        change_of("dashboards"),
        Some(cso_apply::Change::Prune),
        "{planned:?}"
    );
    let second = engine.apply(&v2, &ns, &labels, &previous).await;
    assert!(second.is_complete(), "{}", second.failure_summary());
    let pruned: Vec<&str> = second.pruned.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(pruned, ["dashboards"]);
    // Deleting them by name (the addon is deleted) does not delete them either: they hold others' objects.
    let namespaces: Vec<cso_api::common::Resource> = previous
        .iter()
        .filter(|r| r.kind == "Namespace")
        .cloned()
        .collect();
    let deleted = engine.delete(&namespaces, &ns).await;
    assert!(deleted.is_complete(), "{}", deleted.failure_summary());
    assert!(deleted.pruned.is_empty(), "{:?}", deleted.pruned);
    assert!(deleted.resources.is_empty(), "{:?}", deleted.resources);
    for (namespace, foreign) in [(&monitoring, "grafana"), (&legacy, "theirs")] {
        let live = live_namespace(&client, namespace).await.unwrap();
        assert!(
            live.metadata.deletion_timestamp.is_none(),
            "{namespace} is being deleted"
        );
        Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .get(foreign)
            .await
            .unwrap();
    }
    assert!(
        !second.resources.iter().any(|r| r.kind == "Namespace"),
        "both released: {:?}",
        second.resources
    );
}

#[tokio::test]
async fn a_prune_never_deletes_a_namespace_or_a_crd_a_deletion_by_name_does() {
    let (client, ns, engine) = setup("own-ns").await;
    let made = format!("{ns}-made");
    let group = format!("{ns}.spared.example.com");
    let crd = format!("gadgets.{group}");
    let crd_manifest = format!(
        "---\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: {crd}\nspec:\n  group: {group}\n  scope: Namespaced\n  names: {{kind: Gadget, plural: gadgets, singular: gadget, listKind: GadgetList}}\n  versions:\n  - name: v1\n    served: true\n    storage: true\n    schema:\n      openAPIV3Schema:\n        type: object\n        x-kubernetes-preserve-unknown-fields: true\n"
    );
    let labels = release_label("docker-ferrol-1-27-v1");
    let v1 = parse_manifests(
        &(namespace_manifest(&made)
            + &config_map_manifest(&made, "a")
            + &crd_manifest
            + &config_map_manifest(&ns, "b")),
    )
    .unwrap();
    let first = engine.apply(&v1, &ns, &labels, &[]).await;
    assert!(first.is_complete(), "{}", first.failure_summary());
    let live = live_namespace(&client, &made).await.unwrap();
    assert!(
        owned(live.metadata.labels.as_ref()),
        "{made} was created, so claimed"
    );

    // Release 2 drops the Namespace with its contents and the CRD: the contents go, the Namespace and the
    // CRD stay (released from the inventory), and the plan says so.
    let v2 = parse_manifests(&(config_map_manifest(&ns, "b") + &config_map_manifest(&ns, "c"))).unwrap();
    let planned = engine.plan(&v2, &ns, &labels, &first.resources).await;
    for spared in [&made, &crd] {
        let change = planned
            .iter()
            .find(|p| &p.key.name == spared)
            .map(|p| p.change.clone());
        assert!(
            matches!(&change, Some(cso_apply::Change::Keep(why)) if why.contains("never pruned")),
            "{spared}: {change:?}"
        );
    }
    let second = engine.apply(&v2, &ns, &labels, &first.resources).await;
    assert!(second.is_complete(), "{}", second.failure_summary());
    let pruned: Vec<String> = second.pruned.iter().map(ToString::to_string).collect();
    assert_eq!(pruned, [format!("ConfigMap {made}/a")]);
    assert!(
        live_namespace(&client, &made)
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none(),
        "{made} is never pruned"
    );
    let crds: Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = Api::all(client.clone());
    assert!(
        crds.get(&crd)
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none(),
        "{crd} is never pruned"
    );
    assert!(
        !second
            .resources
            .iter()
            .any(|r| r.kind == "Namespace" || r.kind == "CustomResourceDefinition"),
        "released from the inventory: {:?}",
        second.resources
    );

    // Asked for by name (a delete stage, the addon deleted), both go: the Namespace holds nothing else now.
    let by_name: Vec<cso_api::common::Resource> = first
        .resources
        .iter()
        .filter(|r| r.kind == "Namespace" || r.kind == "CustomResourceDefinition")
        .cloned()
        .collect();
    let deleted = engine.delete(&by_name, &ns).await;
    assert!(deleted.is_complete(), "{}", deleted.failure_summary());
    assert_eq!(deleted.pruned.len(), 2, "{:?}", deleted.pruned);
    assert!(
        live_namespace(&client, &made)
            .await
            .is_none_or(|n| n.metadata.deletion_timestamp.is_some()),
        "{made} is deleted"
    );
    assert!(
        crds.get_opt(&crd)
            .await
            .unwrap()
            .is_none_or(|c| c.metadata.deletion_timestamp.is_some()),
        "{crd} is deleted"
    );
}

#[tokio::test]
async fn a_render_that_lost_most_of_the_objects_is_held_not_applied() {
    let (client, ns, engine) = setup("held").await;
    let labels = release_label("docker-ferrol-1-27-v1");
    let names = ["a", "b", "c", "d", "e"];
    let v1 = parse_manifests(
        &names
            .iter()
            .map(|n| config_map_manifest(&ns, n))
            .collect::<String>(),
    )
    .unwrap();
    let first = engine.apply(&v1, &ns, &labels, &[]).await;
    assert!(first.is_complete(), "{}", first.failure_summary());
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);

    for (render, what) in [
        (String::new(), "no objects"),
        (config_map_manifest(&ns, "z"), "1 objects"),
    ] {
        let next = parse_manifests(&render).unwrap();
        let planned = engine.plan(&next, &ns, &labels, &first.resources).await;
        assert_eq!(planned.len(), 5 + next.len(), "{planned:?}");
        assert!(
            planned
                .iter()
                .all(|p| matches!(&p.change, cso_apply::Change::Keep(why) if why.starts_with("held"))),
            "nothing would be applied or pruned: {planned:?}"
        );
        let held = engine.apply(&next, &ns, &labels, &first.resources).await;
        assert!(!held.is_complete());
        let why = held.held.clone().unwrap_or_default();
        assert!(
            why.contains(&format!("the render has {what} where the last apply left 5")),
            "{why}"
        );
        assert_eq!(held.failure_summary(), why);
        assert!(held.pruned.is_empty() && held.applied == 0, "{held:?}");
        assert_eq!(held.resources, first.resources, "the inventory is kept");
        for name in names {
            config_maps.get(name).await.expect("nothing pruned");
        }
        assert!(
            config_maps.get_opt("z").await.unwrap().is_none(),
            "nothing applied"
        );
    }

    // Half of them is a release that dropped some objects: applied, and the rest pruned.
    let half = parse_manifests(
        &(config_map_manifest(&ns, "a") + &config_map_manifest(&ns, "b") + &config_map_manifest(&ns, "c")),
    )
    .unwrap();
    let applied = engine.apply(&half, &ns, &labels, &first.resources).await;
    assert!(applied.is_complete(), "{}", applied.failure_summary());
    assert_eq!(applied.pruned.len(), 2, "{:?}", applied.pruned);
}

#[tokio::test]
async fn a_refused_prune_is_reported_and_blocks_nothing() {
    let (client, ns, engine) = setup("refused").await;
    // An admission policy that refuses deleting ConfigMap `protected` in this namespace (403).
    let policy_name = format!("{ns}-protect");
    let policies: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicy"),
            "validatingadmissionpolicies",
        ),
    );
    let bindings: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingAdmissionPolicyBinding",
            ),
            "validatingadmissionpolicybindings",
        ),
    );
    let policy: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": policy_name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["DELETE"], "resources": ["configmaps"], "resourceNames": ["protected"]}]},
            "validations": [{"expression": "false", "message": "protected", "reason": "Forbidden"}],
        },
    }))
    .unwrap();
    policies.create(&PostParams::default(), &policy).await.unwrap();
    let binding: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy_name},
        "spec": {
            "policyName": policy_name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
        },
    }))
    .unwrap();
    bindings.create(&PostParams::default(), &binding).await.unwrap();

    let labels = release_label("docker-ferrol-1-27-v1");
    let v1 = parse_manifests(&(config_map_manifest(&ns, "protected") + &config_map_manifest(&ns, "other")))
        .unwrap();
    let first = engine.apply(&v1, &ns, &labels, &[]).await;
    assert!(first.is_complete(), "{}", first.failure_summary());
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    // The policy takes effect within a moment.
    let dry_run = kube::api::DeleteParams {
        dry_run: true,
        ..Default::default()
    };
    for _ in 0..100 {
        if config_maps.delete("protected", &dry_run).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let second = engine.delete(&first.resources, &ns).await;
    assert!(
        second.is_complete(),
        "a refused deletion does not fail it: {}",
        second.failure_summary()
    );
    let pruned: Vec<&str> = second.pruned.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(pruned, ["other"], "the rest is pruned");
    assert!(
        second.resources.is_empty(),
        "the refused object left the inventory: {:?}",
        second.resources
    );
    let refused: Vec<(&str, &str)> = second
        .refused
        .iter()
        .map(|f| (f.key.name.as_str(), f.error.as_str()))
        .collect();
    assert!(
        matches!(refused.as_slice(), [("protected", error)] if error.contains("(403)")),
        "the refusal is reported per object: {refused:?}"
    );
    config_maps.get("protected").await.unwrap();
    let _ = bindings.delete(&policy_name, &Default::default()).await;
    let _ = policies.delete(&policy_name, &Default::default()).await;
}

#[tokio::test]
async fn a_plan_creates_objects_in_a_namespace_the_same_render_creates() {
    let (_client, ns, engine) = setup("plan-new-namespace").await;
    let fresh = format!("{ns}-fresh");
    let render =
        parse_manifests(&(namespace_manifest(&fresh) + &config_map_manifest(&fresh, "settings"))).unwrap();
    let planned = engine.plan(&render, &ns, &BTreeMap::new(), &[]).await;
    let changes: Vec<(&str, bool)> = planned
        .iter()
        .map(|p| {
            (
                p.key.name.as_str(),
                matches!(p.change, cso_apply::Change::Create { .. }),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [(fresh.as_str(), true), ("settings", true)],
        "no false 'refused' for an object whose namespace comes with it: {planned:?}"
    );
}
