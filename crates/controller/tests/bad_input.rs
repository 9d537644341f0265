//! Bad input on the management flow: a chart that does not render, a release the source does not have, a
//! source that cannot be reached, rate-limits or never answers, a spec that does not parse, a source that is
//! not configured. Each ends in a condition (or an event) that says so, and none is retried in a hot loop.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod support;

use std::{path::Path, sync::Arc, time::Duration};

use cso_api::{
    ClusterStack, ClusterStackRelease,
    names::{condition, reason},
};
use cso_release::source::{
    SourceError, SourceKind, UnavailableSource,
    github::{GithubConfig, GithubSource},
};
use cso_testenv::github::{Failure, FakeGithub};
use k8s_openapi::api::events::v1::Event;
use kube::{Api, Client};
use serde_json::json;
use support::*;

fn github_at(api_url: &str) -> Arc<GithubSource> {
    Arc::new(
        GithubSource::new(GithubConfig {
            api_url: api_url.parse().unwrap(),
            org: "SovereignCloudStack".into(),
            repo: "cluster-stacks".into(),
            token: None,
        })
        .unwrap(),
    )
}

/// A release `docker-broken-1-27-v1` whose cluster-class chart fails to render.
fn broken_release(release_dir: &Path) {
    let dir = release_dir.join("cluster-stacks/docker-broken-1-27-v1");
    std::fs::create_dir_all(&dir).unwrap();
    let ferrol = fixtures().join("docker-ferrol-1-27-v1");
    for file in ["metadata.yaml", "cluster-addon-values.yaml"] {
        std::fs::copy(ferrol.join(file), dir.join(file)).unwrap();
    }
    std::fs::copy(
        ferrol.join("docker-ferrol-1-27-cluster-addon-v1.tgz"),
        dir.join("docker-broken-1-27-cluster-addon-v1.tgz"),
    )
    .unwrap();
    let chart = tgz(&[
        (
            "docker-broken-1-27-cluster-class/Chart.yaml",
            "apiVersion: v2\nname: docker-broken-1-27-cluster-class\nversion: v1\n",
        ),
        (
            "docker-broken-1-27-cluster-class/templates/class.yaml",
            "{{ fail \"broken on purpose\" }}\n",
        ),
    ]);
    std::fs::write(dir.join("docker-broken-1-27-cluster-class-v1.tgz"), chart).unwrap();
}

/// Waits for the first event with `reason` in `namespace`.
async fn event(client: &Client, namespace: &str, reason: &str) -> Event {
    eventually(&format!("a {reason} event"), CONVERGE, || async {
        events_with(client, namespace, reason).await.into_iter().next()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chart_that_does_not_render_is_reported() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "broken-chart").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    broken_release(dir.path());
    let operator = RunningOperator::local(&client, &ns, dir.path()).await;
    let mut spec = ferrol_spec(&["v1"]);
    spec["name"] = json!("broken");
    create_stack(&client, &ns, "broken", spec).await;

    let message = wait_condition::<ClusterStackRelease>(
        &client,
        &ns,
        "docker-broken-1-27-v1",
        condition::HELM_CHART_APPLIED,
        reason::FAILED_TO_RENDER_CHART,
    )
    .await;
    assert!(message.contains("broken on purpose"), "{message}");
    let release = wait_condition::<ClusterStackRelease>(
        &client,
        &ns,
        "docker-broken-1-27-v1",
        cso_api::conditions::READY,
        reason::FAILED_TO_RENDER_CHART,
    )
    .await;
    assert!(
        release.contains("broken on purpose"),
        "Ready summarises the failure: {release}"
    );
    event(&client, &ns, "FailedToRenderChart").await;
    assert!(cluster_classes(&client, &ns).await.is_empty());
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_release_is_reported_and_retried_with_backoff() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "missing").await.unwrap();
    let fake = FakeGithub::start(30).await.unwrap();
    fake.publish_dir("docker-ferrol-1-27-v1", &fixtures().join("docker-ferrol-1-27-v1"))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let operator = RunningOperator::start(&client, &ns, dir.path(), github_at(fake.api_url()), |_| {}).await;
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v9"])).await;

    let message = wait_condition::<ClusterStackRelease>(
        &client,
        &ns,
        "docker-ferrol-1-27-v9",
        condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
        reason::RELEASE_NOT_FOUND,
    )
    .await;
    assert!(message.contains("docker-ferrol-1-27-v9"), "{message}");
    event(&client, &ns, "ReleaseDownloadFailed").await;

    // Retries back off (5 s, 10 s, 20 s ...): in 12 s at most a few attempts, not hundreds.
    let before = fake.requests().len();
    tokio::time::sleep(Duration::from_secs(12)).await;
    let attempts = fake.requests().len() - before;
    assert!(attempts <= 4, "{attempts} requests to the source in 12 s");
    operator.stop().await;
}

/// An auto-subscribing ferrol ClusterStack (with `versions`) in a new namespace, its operator using
/// `source`; returns the namespace, once `ReleasesSynced` says `FailedToSync`, with that message.
async fn failing_to_sync(
    client: &Client,
    prefix: &str,
    source: Arc<GithubSource>,
    versions: &[&str],
) -> (String, String, RunningOperator, tempfile::TempDir) {
    let ns = cso_testenv::namespace(client, prefix).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let operator = RunningOperator::start(client, &ns, dir.path(), source, |_| {}).await;
    let mut spec = ferrol_spec(versions);
    spec["autoSubscribe"] = json!(true);
    create_stack(client, &ns, "ferrol", spec).await;
    let message = wait_condition::<ClusterStack>(
        client,
        &ns,
        "ferrol",
        condition::RELEASES_SYNCED,
        reason::FAILED_TO_SYNC,
    )
    .await;
    (ns, message, operator, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_or_rate_limiting_source_is_reported() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();

    // Nothing listens on this port.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let source = github_at(&format!("http://127.0.0.1:{port}"));
    let (ns, message, operator, _dir) = failing_to_sync(&client, "unreachable", source, &["v1"]).await;
    assert!(message.contains("127.0.0.1"), "{message}");
    let message = wait_condition::<ClusterStackRelease>(
        &client,
        &ns,
        "docker-ferrol-1-27-v1",
        condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
        reason::RELEASE_ASSETS_NOT_DOWNLOADED_YET,
    )
    .await;
    assert!(
        message.contains("127.0.0.1"),
        "the network error is in the message: {message}"
    );
    operator.stop().await;

    // GitHub's rate limit (403 with X-RateLimit-Remaining: 0) on the listing.
    let fake = FakeGithub::start(30).await.unwrap();
    fake.publish_dir("docker-ferrol-1-27-v1", &fixtures().join("docker-ferrol-1-27-v1"))
        .unwrap();
    for _ in 0..3 {
        fake.fail_next(Failure::RateLimited { reset_in_secs: 3600 });
    }
    let (_, message, operator, _dir) =
        failing_to_sync(&client, "rate-limited", github_at(fake.api_url()), &[]).await;
    assert!(message.contains("rate limited"), "{message}");
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_spec_and_an_unconfigured_source_are_reported() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "invalid").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let unconfigured = Arc::new(UnavailableSource::new(
        SourceKind::Github,
        &SourceError::Config("environment variable GIT_ORG_NAME is not set".into()),
    ));
    let operator = RunningOperator::start(&client, &ns, dir.path(), unconfigured, |_| {}).await;

    create_stack(&client, &ns, "bad-version", ferrol_spec(&["version-one"])).await;
    let message = wait_condition::<ClusterStack>(
        &client,
        &ns,
        "bad-version",
        condition::CLUSTER_STACK_RELEASES_SYNCED,
        reason::INVALID_SPEC,
    )
    .await;
    assert!(message.contains("version-one"), "{message}");

    let mut spec = ferrol_spec(&["v1"]);
    spec["autoSubscribe"] = json!(true);
    create_stack(&client, &ns, "no-source", spec).await;
    let message = wait_condition::<ClusterStack>(
        &client,
        &ns,
        "no-source",
        condition::ASSETS_CLIENT_API_AVAILABLE,
        reason::FAILED_CREATE_ASSETS_CLIENT,
    )
    .await;
    assert!(message.contains("GIT_ORG_NAME"), "{message}");
    let message = wait_condition::<ClusterStackRelease>(
        &client,
        &ns,
        "docker-ferrol-1-27-v1",
        condition::ASSETS_CLIENT_API_AVAILABLE,
        reason::FAILED_CREATE_ASSETS_CLIENT,
    )
    .await;
    assert!(message.contains("GIT_ORG_NAME"), "{message}");
    operator.stop().await;
}

/// A source that accepts connections and never answers: the release's reconcile hangs in its download. It
/// is stopped after the reconcile timeout with a `ReconcileTimedOut` event and tried again, and the operator
/// still stops promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_that_hangs_is_stopped_reported_and_retried() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "hangs").await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let source = github_at(&format!("http://{}", listener.local_addr().unwrap()));
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let silent = {
        let accepted = accepted.clone();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((connection, _)) = listener.accept().await {
                accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                held.push(connection);
            }
        })
    };
    let dir = tempfile::tempdir().unwrap();
    let operator = RunningOperator::start(&client, &ns, dir.path(), source, |settings| {
        settings.reconcile_timeout = Duration::from_secs(2);
    })
    .await;
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1"])).await;

    let timed_out = event(&client, &ns, "ReconcileTimedOut").await;
    assert_eq!(
        timed_out.regarding.unwrap().kind.as_deref(),
        Some("ClusterStackRelease")
    );
    assert!(
        timed_out.note.as_deref().unwrap_or_default().contains("2s"),
        "{:?}",
        timed_out.note
    );
    // Each attempt is a new connection: the stopped one is dropped with its reconcile.
    eventually("the download is tried again", CONVERGE, || async {
        (accepted.load(std::sync::atomic::Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    operator.stop().await;
    silent.abort();
}

/// Labels Cluster `name`, so every controller watching Clusters looks at it again.
async fn touch_cluster(client: &Client, namespace: &str, name: &str, value: &str) {
    dynamic(client, namespace, &capi("Cluster"))
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"labels": {"touched": value}}})),
        )
        .await
        .unwrap();
}

/// A values file over the limit (1 MiB) is refused before it is templated, with a condition on the
/// ClusterAddon that names the file and the limit; nothing reaches the workload cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_values_file_over_the_limit_is_refused_with_a_condition() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let workload_plane = cso_testenv::shared_workload();
    let ns = cso_testenv::namespace(&client, "big-values").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    local_releases(dir.path(), &["docker-ferrol-1-27-v1"]);
    let values = dir
        .path()
        .join("cluster-stacks/docker-ferrol-1-27-v1/cluster-addon-values.yaml");
    let mut text = std::fs::read_to_string(&values).unwrap();
    let padding = format!("# {}\n", "x".repeat(97));
    while text.len() <= 1 << 20 {
        text.push_str(&padding);
    }
    std::fs::write(&values, &text).unwrap();
    let operator = RunningOperator::local(&client, &ns, dir.path()).await;
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1"])).await;
    ready_release(&client, &ns, "docker-ferrol-1-27-v1").await;
    cso_testenv::kubeconfig_secret(&client, &ns, "big", workload_plane.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(&client, &ns, "big", "docker-ferrol-1-27-v1").await;

    let message = wait_condition::<cso_api::ClusterAddon>(
        &client,
        &ns,
        "cluster-addon-big",
        condition::HELM_CHART_TEMPLATED,
        reason::TEMPLATE_NEW_CLUSTER_STACK_OVERWRITE_FAILED,
    )
    .await;
    assert!(
        message.contains("cluster-addon-values.yaml") && message.contains("1048576 bytes (1 MiB)"),
        "names the file and the limit: {message}"
    );
    assert!(
        message.contains(&text.len().to_string()),
        "and the size: {message}"
    );
    let addon: cso_api::ClusterAddon = Api::namespaced(client.clone(), &ns)
        .get("cluster-addon-big")
        .await
        .unwrap();
    assert!(!addon.status.unwrap_or_default().ready);
    operator.stop().await;
}

/// A Cluster whose class names a version its stack does not have (`v8`, a typo) gets a Warning event
/// saying so, once, and the ClusterStack creates no release for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_naming_a_version_that_does_not_exist_is_told_and_gets_no_release() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "typo").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    local_releases(dir.path(), &["docker-ferrol-1-27-v1"]);
    let operator = RunningOperator::local(&client, &ns, dir.path()).await;
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1"])).await;
    ready_release(&client, &ns, "docker-ferrol-1-27-v1").await;
    create_cluster(&client, &ns, "c1", "docker-ferrol-1-27-v8").await;

    let told = event(&client, &ns, "UnknownClusterStackRelease").await;
    let regarding = told.regarding.unwrap();
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("Cluster"), Some("c1"))
    );
    assert_eq!(told.type_.as_deref(), Some("Warning"));
    let note = told.note.unwrap_or_default();
    assert!(
        note.contains("docker-ferrol-1-27-v8") && note.contains("it has v1"),
        "{note}"
    );
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), &ns);
    assert!(
        releases.get_opt("docker-ferrol-1-27-v8").await.unwrap().is_none(),
        "a typo does not become a release"
    );

    // The ClusterStack looks again (the Cluster changed): said once, not at every reconcile.
    touch_cluster(&client, &ns, "c1", "1").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let events = events_with(&client, &ns, "UnknownClusterStackRelease").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].series.is_none(), "not repeated: {:?}", events[0].series);
    assert!(releases.get_opt("docker-ferrol-1-27-v8").await.unwrap().is_none());
    operator.stop().await;
}

/// A Cluster whose name leaves no room for `cluster-addon-<name>` (253 characters at most) gets no
/// ClusterAddon and a Warning event saying why, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_name_is_too_long_for_its_cluster_addon_is_told_once() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "long-name").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    local_releases(dir.path(), &["docker-ferrol-1-27-v1"]);
    let operator = RunningOperator::local(&client, &ns, dir.path()).await;
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1"])).await;
    ready_release(&client, &ns, "docker-ferrol-1-27-v1").await;
    let name = "c".repeat(245);
    create_cluster(&client, &ns, &name, "docker-ferrol-1-27-v1").await;

    let told = event(&client, &ns, "ClusterAddonNotCreated").await;
    let regarding = told.regarding.unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("Cluster"));
    assert_eq!(regarding.name.as_deref(), Some(name.as_str()));
    let note = told.note.unwrap_or_default();
    assert!(note.contains("259 characters") && note.contains("253"), "{note}");

    touch_cluster(&client, &ns, &name, "1").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let events = events_with(&client, &ns, "ClusterAddonNotCreated").await;
    assert_eq!(events.len(), 1, "once: {events:?}");
    let addons: Api<cso_api::ClusterAddon> = Api::namespaced(client.clone(), &ns);
    assert!(addons.list(&Default::default()).await.unwrap().items.is_empty());
    operator.stop().await;
}

/// ClusterAddonCreate reads the Cluster fresh: handed the watch cache's copy of a Cluster that is gone, or
/// being deleted, it creates nothing (the start-up race: a ClusterAddon for a Cluster deleted 0.1 s before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_deleted_after_it_was_seen_gets_no_cluster_addon() {
    use cso_api::capi::Cluster;
    use cso_controller::cluster_addon_create::{CreateContext, reconcile};

    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "deleted-cluster").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Only the release object matters to ClusterAddonCreate; no operator runs.
    let release: ClusterStackRelease = serde_json::from_value(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStackRelease",
        "metadata": {"name": "docker-ferrol-1-27-v1", "namespace": ns},
        "spec": {},
    }))
    .unwrap();
    Api::<ClusterStackRelease>::namespaced(client.clone(), &ns)
        .create(&Default::default(), &release)
        .await
        .unwrap();
    let source = Arc::new(cso_release::source::local::LocalSource::new(
        dir.path().join("cluster-stacks"),
    ));
    let (parts, _) = operator(&client, &ns, dir.path(), source, |_| {});
    let ctx = CreateContext::new(parts.context().unwrap());
    let clusters: Api<Cluster> = Api::namespaced_with(client.clone(), &ns, &Cluster::v1beta1_resource());
    let addons: Api<cso_api::ClusterAddon> = Api::namespaced(client.clone(), &ns);

    // Gone: deleted after the cache saw it.
    create_cluster(&client, &ns, "gone", "docker-ferrol-1-27-v1").await;
    let seen = clusters.get("gone").await.unwrap();
    clusters
        .delete("gone", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    reconcile(Arc::new(seen), ctx.clone()).await.unwrap();
    assert!(addons.get_opt("cluster-addon-gone").await.unwrap().is_none());

    // Being deleted (a finalizer holds it): the cache's copy has no deletionTimestamp yet.
    create_cluster(&client, &ns, "leaving", "docker-ferrol-1-27-v1").await;
    clusters
        .patch(
            "leaving",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"finalizers": ["cso.test/hold"]}})),
        )
        .await
        .unwrap();
    let seen = clusters.get("leaving").await.unwrap();
    clusters
        .delete("leaving", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    reconcile(Arc::new(seen), ctx.clone()).await.unwrap();
    assert!(addons.get_opt("cluster-addon-leaving").await.unwrap().is_none());
    clusters
        .patch(
            "leaving",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();

    // A live Cluster gets its ClusterAddon from the same call.
    create_cluster(&client, &ns, "live", "docker-ferrol-1-27-v1").await;
    let seen = clusters.get("live").await.unwrap();
    reconcile(Arc::new(seen), ctx).await.unwrap();
    assert!(addons.get_opt("cluster-addon-live").await.unwrap().is_some());
}
