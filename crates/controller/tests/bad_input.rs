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
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    eventually(&format!("a {reason} event"), CONVERGE, || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reason))
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
