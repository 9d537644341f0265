//! The management-cluster flow end to end on a real API server with real helm: ClusterStacks become
//! ClusterStackReleases, releases become ClusterClasses, and both follow spec, source and Clusters.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod support;

use std::{sync::Arc, time::Duration};

use cso_api::{
    ClusterStack, ClusterStackRelease,
    conditions::{ConditionsExt, READY},
    names::{condition, reason},
};
use cso_release::source::github::{GithubConfig, GithubSource};
use cso_testenv::github::FakeGithub;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams},
};
use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_become_cluster_classes_and_unused_ones_go_away() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "versions").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    local_releases(dir.path(), &["docker-ferrol-1-27-v1", "docker-ferrol-1-27-v2"]);
    let operator = RunningOperator::local(&client, &ns, dir.path()).await;

    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1", "v2"])).await;
    let v1 = ready_release(&client, &ns, "docker-ferrol-1-27-v1").await;
    let v2 = ready_release(&client, &ns, "docker-ferrol-1-27-v2").await;
    assert_eq!(v2.status.as_ref().unwrap().kubernetes_version, "v1.27.3");
    assert_eq!(v1.owner_references()[0].kind, "ClusterStack");
    assert_eq!(v1.owner_references()[0].name, "ferrol");
    for release in [&v1, &v2] {
        let inventory = &release.status.as_ref().unwrap().resources;
        let kinds: Vec<&str> = inventory.iter().map(|r| r.kind.as_str()).collect();
        assert_eq!(inventory.len(), 5, "ClusterClass and four templates: {kinds:?}");
        assert!(kinds.contains(&"ClusterClass"));
        for entry in inventory {
            assert!(inventory_object_exists(&client, entry).await, "{entry:?}");
        }
        assert!(release.is_condition_true(READY));
        assert!(release.is_condition_true(condition::HELM_CHART_APPLIED));
    }
    assert_eq!(
        cluster_classes(&client, &ns).await,
        ["docker-ferrol-1-27-v1", "docker-ferrol-1-27-v2"]
    );

    let stacks: Api<ClusterStack> = Api::namespaced(client.clone(), &ns);
    let stack = eventually(
        "ClusterStack status lists both releases as usable",
        CONVERGE,
        || async {
            let stack = stacks.get("ferrol").await.unwrap();
            (stack.status.as_ref()?.usable_versions == "v1, v2").then_some(stack)
        },
    )
    .await;
    let status = stack.status.as_ref().unwrap();
    assert_eq!(status.latest_release, "docker-ferrol-1-27-v2 | v1.27.3");
    let summary: Vec<(&str, bool)> = status
        .summary
        .iter()
        .map(|s| (s.name.as_str(), s.ready))
        .collect();
    assert_eq!(summary, [("v1", true), ("v2", true)]);
    assert!(stack.is_condition_true(condition::CLUSTER_STACK_RELEASES_SYNCED));
    assert!(stack.is_condition_true(condition::CLUSTER_STACK_RELEASE_AVAILABLE));
    assert!(stack.is_condition_true(READY));

    // A Cluster uses v1: removing v1 from the spec keeps it.
    create_cluster(&client, &ns, "uses-v1", "docker-ferrol-1-27-v1").await;
    stacks
        .patch(
            "ferrol",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"versions": ["v2"]}})),
        )
        .await
        .unwrap();
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), &ns);
    // The ClusterStack reconciles the spec change at once; give it a few passes to do something wrong.
    eventually("the ClusterStack saw the new spec", CONVERGE, || async {
        let stack = stacks.get("ferrol").await.unwrap();
        (stack.status.as_ref()?.summary.len() == 2 && stack.metadata.generation == Some(2)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let kept = releases.get("docker-ferrol-1-27-v1").await.unwrap();
    assert!(
        kept.metadata.deletion_timestamp.is_none(),
        "a release in use is not deleted"
    );
    assert_eq!(cluster_classes(&client, &ns).await.len(), 2);

    // The release files are gone (a new pod with an empty cache); deletion must not need them.
    std::fs::remove_dir_all(dir.path().join("cluster-stacks/docker-ferrol-1-27-v1")).unwrap();

    // The Cluster moves to v2: v1, its ClusterClass and its four templates go.
    dynamic(&client, &ns, &capi("Cluster"))
        .patch(
            "uses-v1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"topology": {"class": "docker-ferrol-1-27-v2"}}})),
        )
        .await
        .unwrap();
    eventually("ClusterStackRelease v1 deleted", CONVERGE, || async {
        releases
            .get_opt("docker-ferrol-1-27-v1")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    for entry in &v1.status.as_ref().unwrap().resources {
        assert!(
            !inventory_object_exists(&client, entry).await,
            "{entry:?} was deleted with its release"
        );
    }
    assert_eq!(cluster_classes(&client, &ns).await, ["docker-ferrol-1-27-v2"]);
    let stack = eventually("usable versions follow", CONVERGE, || async {
        let stack = stacks.get("ferrol").await.unwrap();
        (stack.status.as_ref()?.usable_versions == "v2").then_some(stack)
    })
    .await;
    assert_eq!(stack.status.unwrap().summary.len(), 1);
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_or_edited_cluster_class_comes_back() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "drift").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    local_releases(dir.path(), &["docker-ferrol-1-27-v1"]);
    let operator = RunningOperator::local(&client, &ns, dir.path()).await;
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1"])).await;
    ready_release(&client, &ns, "docker-ferrol-1-27-v1").await;

    let classes = dynamic(&client, &ns, &capi("ClusterClass"));
    let before = classes.get("docker-ferrol-1-27-v1").await.unwrap();
    classes
        .delete("docker-ferrol-1-27-v1", &DeleteParams::default())
        .await
        .unwrap();
    let recreated = eventually("the ClusterClass is recreated", CONVERGE, || async {
        classes
            .get_opt("docker-ferrol-1-27-v1")
            .await
            .unwrap()
            .filter(|c| c.metadata.uid != before.metadata.uid)
    })
    .await;
    assert_eq!(
        recreated.spec_field("infrastructure"),
        before.spec_field("infrastructure")
    );

    // An edit of a field we own is undone.
    classes
        .patch(
            "docker-ferrol-1-27-v1",
            &PatchParams::apply("someone-else").force(),
            &Patch::Apply(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "ClusterClass",
                "spec": {"infrastructure": {"ref": {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerClusterTemplate", "name": "edited"}}},
            })),
        )
        .await
        .unwrap();
    eventually("the edit is undone", CONVERGE, || async {
        let class = classes.get("docker-ferrol-1-27-v1").await.unwrap();
        (class.spec_field("infrastructure") == before.spec_field("infrastructure")).then_some(())
    })
    .await;
    operator.stop().await;
}

trait SpecField {
    fn spec_field(&self, name: &str) -> serde_json::Value;
}

impl SpecField for kube::api::DynamicObject {
    fn spec_field(&self, name: &str) -> serde_json::Value {
        self.data["spec"][name].clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_channel_releases_work_and_are_not_deleted_while_used() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "custom").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    local_releases(
        dir.path(),
        &["docker-ferrol-1-27-v0-sha-hipstsw", "docker-ferrol-1-27-v1"],
    );
    let operator = RunningOperator::local(&client, &ns, dir.path()).await;
    let mut spec = ferrol_spec(&["v0-sha.hipstsw"]);
    spec["channel"] = json!("custom");
    create_stack(&client, &ns, "custom", spec).await;
    ready_release(&client, &ns, "docker-ferrol-1-27-v0-sha-hipstsw").await;
    assert_eq!(
        cluster_classes(&client, &ns).await,
        ["docker-ferrol-1-27-v0-sha.hipstsw"]
    );
    let stacks: Api<ClusterStack> = Api::namespaced(client.clone(), &ns);
    let stack = eventually("status of the custom stack", CONVERGE, || async {
        let stack = stacks.get("custom").await.unwrap();
        (!stack.status.as_ref()?.latest_release.is_empty()).then_some(stack)
    })
    .await;
    assert_eq!(
        stack.status.as_ref().unwrap().latest_release,
        "docker-ferrol-1-27-v0-sha.hipstsw | v1.27.7"
    );
    assert_eq!(stack.status.as_ref().unwrap().usable_versions, "v0-sha.hipstsw");

    // A Cluster names the class in dot form; deleting the release (dash form) waits while it is in use
    // (the Go operator compares the two forms as strings, finds no user, and deletes it).
    create_cluster(&client, &ns, "custom-user", "docker-ferrol-1-27-v0-sha.hipstsw").await;
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), &ns);
    releases
        .delete("docker-ferrol-1-27-v0-sha-hipstsw", &DeleteParams::default())
        .await
        .unwrap();
    let message = wait_condition::<ClusterStackRelease>(
        &client,
        &ns,
        "docker-ferrol-1-27-v0-sha-hipstsw",
        condition::CLUSTER_CLASS_UNUSED,
        reason::CLUSTER_CLASS_IN_USE,
    )
    .await;
    assert!(message.contains("custom-user"), "{message}");
    assert_eq!(
        cluster_classes(&client, &ns).await,
        ["docker-ferrol-1-27-v0-sha.hipstsw"]
    );

    // The spec no longer lists it and the Cluster goes: so do the release and its ClusterClass.
    Api::<ClusterStack>::namespaced(client.clone(), &ns)
        .patch(
            "custom",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"versions": null}})),
        )
        .await
        .unwrap();
    dynamic(&client, &ns, &capi("Cluster"))
        .delete("custom-user", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the custom release is deleted", CONVERGE, || async {
        releases
            .get_opt("docker-ferrol-1-27-v0-sha-hipstsw")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(cluster_classes(&client, &ns).await.is_empty());
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_subscribe_follows_the_newest_release_of_its_stack() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "subscribe").await.unwrap();
    let fake = FakeGithub::start(30).await.unwrap();
    // 40 releases of several stacks and Kubernetes minors; ferrol 1.27's newest stable is v2.
    for tag in ["docker-ferrol-1-27-v1", "docker-ferrol-1-27-v2"] {
        fake.publish_dir(tag, &fixtures().join(tag)).unwrap();
    }
    let mut others = Vec::new();
    for i in 1..=12 {
        others.push(format!("docker-ferrol-1-28-v{i}"));
        others.push(format!("docker-scs-1-27-v{i}"));
        others.push(format!("openstack-ferrol-1-27-v{i}"));
    }
    others.extend([
        "docker-ferrol-1-27-v9-sha-abc".into(),
        "docker-ferrol-1-26-v30".into(),
    ]);
    for tag in &others {
        fake.publish(tag, Vec::new());
    }
    assert_eq!(others.len() + 2, 40);
    let source = Arc::new(github(&fake));
    let dir = tempfile::tempdir().unwrap();
    let operator = RunningOperator::start(&client, &ns, dir.path(), source, |_| {}).await;

    let mut spec = ferrol_spec(&[]);
    spec["autoSubscribe"] = json!(true);
    create_stack(&client, &ns, "ferrol", spec).await;
    ready_release(&client, &ns, "docker-ferrol-1-27-v2").await;
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), &ns);
    let names: Vec<String> = releases
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|r| r.name_any())
        .collect();
    assert_eq!(
        names,
        ["docker-ferrol-1-27-v2"],
        "only the newest release of the stack's channel and minor"
    );

    // v3 is published: the next poll picks it up; v2 goes once v3 is ready (not in spec, not in use).
    fake.publish_dir("docker-ferrol-1-27-v3", &fixtures().join("docker-ferrol-1-27-v3"))
        .unwrap();
    ready_release(&client, &ns, "docker-ferrol-1-27-v3").await;
    eventually("v2 is deleted after v3 is ready", CONVERGE, || async {
        releases
            .get_opt("docker-ferrol-1-27-v2")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let stacks: Api<ClusterStack> = Api::namespaced(client.clone(), &ns);
    let stack = eventually("latest release v3", CONVERGE, || async {
        let stack = stacks.get("ferrol").await.unwrap();
        stack
            .status
            .as_ref()?
            .latest_release
            .starts_with("docker-ferrol-1-27-v3")
            .then_some(stack)
    })
    .await;
    assert!(stack.is_condition_true(condition::RELEASES_SYNCED));
    assert!(stack.is_condition_true(condition::ASSETS_CLIENT_API_AVAILABLE));
    operator.stop().await;
}

fn github(fake: &FakeGithub) -> GithubSource {
    GithubSource::new(GithubConfig {
        api_url: fake.api_url().parse().unwrap(),
        org: "SovereignCloudStack".into(),
        repo: "cluster-stacks".into(),
        token: None,
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_mode_waits_for_the_provider_object() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let crds: Vec<_> = serde_saphyr::from_multiple(include_str!("fixtures/provider-crds.yaml")).unwrap();
    cso_testenv::crds::install(&client, &crds).await.unwrap();
    let ns = cso_testenv::namespace(&client, "provider").await.unwrap();
    let template_kind = kube::discovery::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "infrastructure.clusterstack.x-k8s.io",
        "v1alpha1",
        "TestInfrastructureProviderClusterStackReleaseTemplate",
    ));
    let template: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "infrastructure.clusterstack.x-k8s.io/v1alpha1",
        "kind": "TestInfrastructureProviderClusterStackReleaseTemplate",
        "metadata": {"name": "provider-test1", "namespace": ns},
        "spec": {"template": {"spec": {"nodeImages": ["controlplaneamd64provider", "workeramd64provider"]}}},
    }))
    .unwrap();
    dynamic(&client, &ns, &template_kind)
        .create(&Default::default(), &template)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    local_releases(dir.path(), &["docker-ferrol-1-27-v1"]);
    let operator = RunningOperator::local(&client, &ns, dir.path()).await;

    let mut spec = ferrol_spec(&["v1"]);
    spec["noProvider"] = json!(false);
    spec["providerRef"] = json!({
        "apiVersion": "infrastructure.clusterstack.x-k8s.io/v1alpha1",
        "kind": "TestInfrastructureProviderClusterStackReleaseTemplate",
        "name": "provider-test1",
    });
    create_stack(&client, &ns, "ferrol", spec).await;

    let provider_kind = kube::discovery::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "infrastructure.clusterstack.x-k8s.io",
        "v1alpha1",
        "TestInfrastructureProviderClusterStackRelease",
    ));
    let providers = dynamic(&client, &ns, &provider_kind);
    let provider = eventually(
        "the provider object is created from its template",
        CONVERGE,
        || async { providers.get_opt("docker-ferrol-1-27-v1").await.unwrap() },
    )
    .await;
    assert_eq!(
        provider.data["spec"]["nodeImages"],
        json!(["controlplaneamd64provider", "workeramd64provider"])
    );
    wait_condition::<ClusterStackRelease>(
        &client,
        &ns,
        "docker-ferrol-1-27-v1",
        condition::PROVIDER_CLUSTER_STACK_RELEASE_READY,
        reason::PROCESS_ONGOING,
    )
    .await;
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), &ns);
    let release = releases.get("docker-ferrol-1-27-v1").await.unwrap();
    assert!(
        !release.status.as_ref().unwrap().ready,
        "not ready before the provider object is"
    );
    assert_eq!(
        release.spec.provider_ref.as_ref().unwrap().name.as_deref(),
        Some("docker-ferrol-1-27-v1")
    );
    assert!(
        cluster_classes(&client, &ns).await.is_empty(),
        "nothing applied before the provider is ready"
    );
    let owned = eventually("the release owns the provider object", CONVERGE, || async {
        let provider = providers.get("docker-ferrol-1-27-v1").await.unwrap();
        provider
            .owner_references()
            .iter()
            .any(|o| o.kind == "ClusterStackRelease" && o.controller == Some(true))
            .then_some(provider)
    })
    .await;
    assert_eq!(owned.owner_references()[0].uid, release.uid().unwrap());

    providers
        .patch_status(
            "docker-ferrol-1-27-v1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": true}})),
        )
        .await
        .unwrap();
    ready_release(&client, &ns, "docker-ferrol-1-27-v1").await;
    assert_eq!(cluster_classes(&client, &ns).await, ["docker-ferrol-1-27-v1"]);
    let stack: ClusterStack = Api::namespaced(client.clone(), &ns).get("ferrol").await.unwrap();
    assert!(stack.is_condition_true(condition::PROVIDER_CLUSTER_STACK_RELEASES_SYNCED));
    operator.stop().await;
}

/// A release whose cluster-class chart has an object of a kind no CRD defines yet (as when a provider is not
/// installed) fails with backoff; once the CRD is created and Established, the release goes on at once (the
/// operator watches CRDs: 0.3 s) instead of at its next backoff (36 s later without the watch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_waiting_for_a_crd_goes_on_as_soon_as_the_crd_is_there() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "crd-wait").await.unwrap();
    // CRDs are cluster-wide: a group of this test's own.
    let group = format!("{ns}.cso.test");
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("cluster-stacks/docker-crdwait-1-27-v1");
    std::fs::create_dir_all(&release).unwrap();
    let ferrol = fixtures().join("docker-ferrol-1-27-v1");
    for file in ["metadata.yaml", "cluster-addon-values.yaml"] {
        std::fs::copy(ferrol.join(file), release.join(file)).unwrap();
    }
    std::fs::copy(
        ferrol.join("docker-ferrol-1-27-cluster-addon-v1.tgz"),
        release.join("docker-crdwait-1-27-cluster-addon-v1.tgz"),
    )
    .unwrap();
    let widget = format!("apiVersion: {group}/v1\nkind: Widget\nmetadata:\n  name: w1\nspec:\n  size: 3\n");
    let chart = tgz(&[
        (
            "docker-crdwait-1-27-cluster-class/Chart.yaml",
            "apiVersion: v2\nname: docker-crdwait-1-27-cluster-class\nversion: v1\n",
        ),
        ("docker-crdwait-1-27-cluster-class/templates/widget.yaml", &widget),
    ]);
    std::fs::write(release.join("docker-crdwait-1-27-cluster-class-v1.tgz"), chart).unwrap();
    let operator = RunningOperator::local(&client, &ns, dir.path()).await;
    let mut spec = ferrol_spec(&["v1"]);
    spec["name"] = json!("crdwait");
    create_stack(&client, &ns, "crdwait", spec).await;

    let message = wait_condition::<ClusterStackRelease>(
        &client,
        &ns,
        "docker-crdwait-1-27-v1",
        condition::HELM_CHART_APPLIED,
        reason::OBJECTS_APPLYING_ONGOING,
    )
    .await;
    assert!(message.contains("Widget"), "{message}");
    // The backoff grows (5, 10, 20, 40 s): 25 s in, the next attempt is at least 10 s away (at 35 s when
    // the first failure was the only quick one; at about 60 s as seen, after three quick ones).
    tokio::time::sleep(Duration::from_secs(25)).await;

    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group, "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    }))
    .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&Default::default(), &crd).await.unwrap();
    let created = std::time::Instant::now();
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), &ns);
    eventually(
        "the release is ready within 6 s of its CRD",
        Duration::from_secs(6),
        || async {
            releases
                .get_opt("docker-crdwait-1-27-v1")
                .await
                .unwrap()
                .filter(|r| r.status.as_ref().is_some_and(|s| s.ready))
        },
    )
    .await;
    eprintln!("ready {:?} after the CRD was created", created.elapsed());
    operator.stop().await;
    crds.delete(&format!("widgets.{group}"), &DeleteParams::default())
        .await
        .unwrap();
}
