//! A release whose charts do not vendor their dependencies (`docker-scs-1-34-v1` as the stacks publish it in
//! 2026: stage `cni` needs cilium 1.19.1, stage `metrics-server` metrics-server 3.13.0), published on the
//! GitHub stand-in, its dependencies taken from a loopback chart repository as `--chart-mirror`, through the
//! real controllers on a real API server with real helm. A mirror that is down and a mirror that lacks the
//! version are each reported on the ClusterStackRelease (a False `ClusterStackReleaseDownloaded` with reason
//! `ChartDependencyUnavailable` naming the chart, the dependency's version and the mirror, a Warning event),
//! retried with backoff (the attempts at the mirror are counted over a window), nothing is cached meanwhile,
//! and the release becomes ready once the mirror is fixed, without any change to an object.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod support;

use std::{path::Path, sync::Arc, time::Duration};

use cso_api::{
    ClusterStackRelease,
    conditions::{ConditionsExt, Severity},
    names::{condition, event, reason},
};
use cso_release::{
    ChartMirrors, DependencyResolver, ReleaseCache,
    archive::UnpackLimits,
    source::github::{GithubConfig, GithubSource},
};
use cso_testenv::{
    chart_repo::{ChartRepo, HUNG_UP},
    github::FakeGithub,
};
use k8s_openapi::api::events::v1::Event;
use kube::{Api, Client};
use serde_json::json;
use support::*;

const TAG: &str = "docker-scs-1-34-v1";
/// How long the attempts at a broken mirror are counted. The controllers' backoff (5 s, doubling) allows
/// about three attempts in it; a hot loop would make hundreds.
const WINDOW: Duration = Duration::from_secs(30);
/// Attempts allowed in [`WINDOW`]: the backoff's three, and a few that a watch event may add.
const MOST_ATTEMPTS: usize = 6;
/// How long a release may take to recover once its mirror is fixed: the next retry comes after the current
/// backoff delay. The attempts come 5, 10, 20 s apart, so when the mirror comes back (about 31 s after the
/// first failure) the next one is at most 40 s away. A failure that doubled the delay more often (as its
/// own status writes once did, bursting a dozen attempts in 100 ms and leaving 300 s to wait) fails here.
const RECOVERY: Duration = Duration::from_secs(100);

fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn charts() -> std::path::PathBuf {
    repo_root().join("tests/fixtures/charts")
}

/// The operator for `ns`, its releases from `fake`, every chart dependency from `mirror`.
async fn operator_with_mirror(
    client: &Client,
    ns: &str,
    release_dir: &Path,
    fake: &FakeGithub,
    mirror: &str,
) -> (RunningOperator, Arc<ReleaseCache>) {
    let source = Arc::new(
        GithubSource::new(GithubConfig {
            api_url: fake.api_url().parse().unwrap(),
            org: "SovereignCloudStack".into(),
            repo: "cluster-stacks".into(),
            token: None,
        })
        .unwrap(),
    );
    let (mut operator, renderer) = operator(client, ns, release_dir, source.clone(), |_| {});
    let releases = Arc::new(
        ReleaseCache::new(release_dir, source, UnpackLimits::default())
            .unwrap()
            .with_dependencies(DependencyResolver::new(ChartMirrors::all(mirror))),
    );
    operator.releases = releases.clone();
    (RunningOperator::run(operator, renderer).await, releases)
}

async fn published() -> FakeGithub {
    let fake = FakeGithub::start(100).await.unwrap();
    fake.publish_dir(TAG, &repo_root().join("tests/fixtures/releases-2026").join(TAG))
        .unwrap();
    fake
}

async fn create_scs_stack(client: &Client, ns: &str) {
    create_stack(
        client,
        ns,
        "scs",
        json!({
            "provider": "docker", "name": "scs", "kubernetesVersion": "1.34",
            "channel": "stable", "autoSubscribe": false, "noProvider": true, "versions": ["v1"],
        }),
    )
    .await;
}

/// Waits for the dependency failure on the release; checks its condition and that a Warning event says it.
async fn reported(client: &Client, ns: &str) -> String {
    let message = wait_condition::<ClusterStackRelease>(
        client,
        ns,
        TAG,
        condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
        reason::CHART_DEPENDENCY_UNAVAILABLE,
    )
    .await;
    let release: ClusterStackRelease = Api::namespaced(client.clone(), ns).get(TAG).await.unwrap();
    let downloaded = release
        .get_condition(condition::CLUSTER_STACK_RELEASE_DOWNLOADED)
        .unwrap();
    assert_eq!(downloaded.severity, Some(Severity::Warning));
    assert!(!release.status.as_ref().is_some_and(|s| s.ready));
    assert!(
        !release.is_condition_true(cso_api::conditions::READY),
        "not Ready while a dependency is missing"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let warning = eventually(
        "a Warning event ChartDependencyUnavailable on the release",
        CONVERGE,
        || async {
            events
                .list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some(event::CHART_DEPENDENCY_UNAVAILABLE)
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(TAG)
                })
        },
    )
    .await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    let note = warning.note.unwrap_or_default();
    assert!(note.contains("cilium 1.19.1 of chart cni"), "{note}");
    message
}

/// Nothing of the release in the cache: no release directory (a download in progress has only its
/// `.download-*` staging directory), and the cache does not know it.
fn nothing_cached(release_dir: &Path, cache: &ReleaseCache) {
    let left: Vec<String> = std::fs::read_dir(release_dir.join("cluster-stacks"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| !name.starts_with(".download-"))
        .collect();
    assert!(left.is_empty(), "half-cached: {left:?}");
    let id = cso_api::ReleaseId::parse_tag(TAG).unwrap();
    assert!(cache.cached(&id).unwrap().is_none());
}

/// How many times `count` grows over [`WINDOW`].
async fn attempts_over_window(count: impl Fn() -> usize) -> usize {
    let before = count();
    tokio::time::sleep(WINDOW).await;
    count() - before
}

/// The release, ready, with both dependencies in its cached addon archive and its ClusterClass applied.
async fn ready_with_dependencies(client: &Client, ns: &str, cache: &ReleaseCache) {
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), ns);
    let release = eventually("the release ready once its mirror is fixed", RECOVERY, || async {
        releases
            .get_opt(TAG)
            .await
            .unwrap()
            .filter(|r| r.status.as_ref().is_some_and(|s| s.ready))
    })
    .await;
    assert!(release.is_condition_true(condition::CLUSTER_STACK_RELEASE_DOWNLOADED));
    assert_eq!(cluster_classes(client, ns).await, [TAG]);
    let cached = cache
        .cached(&cso_api::ReleaseId::parse_tag(TAG).unwrap())
        .unwrap()
        .expect("cached once ready");
    let stages = cached.addon_charts(UnpackLimits::default()).unwrap();
    assert!(stages.join("cni/charts/cilium-1.19.1.tgz").is_file());
    assert!(
        stages
            .join("metrics-server/charts/metrics-server-3.13.0.tgz")
            .is_file()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_that_is_down_is_reported_retried_with_backoff_and_recovers() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "deps-down").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let fake = published().await;
    let mut mirror = ChartRepo::start(&charts()).await.unwrap();
    // Down: every connection is accepted and closed without an answer, and counted.
    mirror.hang_up().await.unwrap();
    let (operator, cache) = operator_with_mirror(&client, &ns, dir.path(), &fake, &mirror.url()).await;
    create_scs_stack(&client, &ns).await;

    let message = reported(&client, &ns).await;
    assert!(
        message.contains("cilium 1.19.1 of chart cni") && message.contains(&mirror.url()),
        "the condition names the chart, the dependency's version and the repository: {message}"
    );
    nothing_cached(dir.path(), &cache);

    let hung_up = || mirror.requests().iter().filter(|r| r.as_str() == HUNG_UP).count();
    let attempts = attempts_over_window(hung_up).await;
    eprintln!("attempts at the mirror that is down, over {WINDOW:?}: {attempts}");
    assert!(
        (1..=MOST_ATTEMPTS).contains(&attempts),
        "retried, with backoff: {attempts} attempts in {WINDOW:?}"
    );
    nothing_cached(dir.path(), &cache);

    // The mirror comes back: the next retry caches the release, and it becomes ready.
    mirror.restart().await.unwrap();
    ready_with_dependencies(&client, &ns, &cache).await;
    operator.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_without_the_version_is_reported_and_recovers_once_it_has_it() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "deps-missing").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let fake = published().await;
    // The mirror has cilium 1.19.2 only; the release wants exactly 1.19.1.
    let content = tempfile::tempdir().unwrap();
    for chart in ["cilium-1.19.2.tgz", "metrics-server-3.13.0.tgz"] {
        std::fs::copy(charts().join(chart), content.path().join(chart)).unwrap();
    }
    let mirror = ChartRepo::start(content.path()).await.unwrap();
    let (operator, cache) = operator_with_mirror(&client, &ns, dir.path(), &fake, &mirror.url()).await;
    create_scs_stack(&client, &ns).await;

    let message = reported(&client, &ns).await;
    assert!(
        message.contains("cilium 1.19.1 of chart cni")
            && message.contains(&mirror.url())
            && message.contains("no version matches (the index has 1.19.2)"),
        "{message}"
    );
    nothing_cached(dir.path(), &cache);

    let index_reads = || {
        mirror
            .requests()
            .iter()
            .filter(|r| r.as_str() == "/index.yaml")
            .count()
    };
    let attempts = attempts_over_window(index_reads).await;
    eprintln!("index reads at the mirror without the version, over {WINDOW:?}: {attempts}");
    assert!(
        (1..=MOST_ATTEMPTS).contains(&attempts),
        "retried, with backoff: {attempts} attempts in {WINDOW:?}"
    );
    assert!(
        !mirror.requests().iter().any(|r| r.starts_with("/cilium")),
        "no chart of the wrong version fetched"
    );
    nothing_cached(dir.path(), &cache);

    // The site mirrors the version: the release becomes ready without any change to an object.
    std::fs::copy(
        charts().join("cilium-1.19.1.tgz"),
        content.path().join("cilium-1.19.1.tgz"),
    )
    .unwrap();
    ready_with_dependencies(&client, &ns, &cache).await;
    operator.stop().await;
}
