//! `--local` mode with a release whose charts do not vendor their dependencies (`docker-scs-1-34-v1` as the
//! stacks' 2026 build leaves it: stage `cni` needs cilium 1.19.1, stage `metrics-server` metrics-server
//! 3.13.0), in the release directory as a stack author builds it, through the real controllers on a real API
//! server with real helm, dependencies from a loopback chart repository as `--chart-mirror`. While the mirror
//! lacks cilium 1.19.1, the ClusterStackRelease and the Cluster's ClusterAddon both say so (a False
//! `ClusterStackReleaseDownloaded` with reason `ChartDependencyUnavailable` naming the chart, the version and
//! the mirror), nothing is copied, and the mirror is asked again with backoff, not in a loop. Once the mirror
//! has the version, the release is resolved into a copy in the local cache, its ClusterClass applied and
//! Cilium and metrics-server land in the workload cluster; the release directory keeps every byte.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod support;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use cso_api::{
    ClusterAddon, ClusterStackRelease,
    conditions::{ConditionsExt, Severity},
    names::{condition, reason},
};
use cso_release::{
    ChartMirrors, DependencyResolver, ReleaseCache, archive::UnpackLimits, source::local::LocalSource,
};
use cso_testenv::chart_repo::ChartRepo;
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::Api;
use serde_json::json;
use sha2::{Digest, Sha256};
use support::*;

const TAG: &str = "docker-scs-1-34-v1";
/// How long the attempts at the mirror are counted while it lacks the version.
const WINDOW: Duration = Duration::from_secs(20);
/// Index reads allowed in [`WINDOW`]: two controllers (the release's and the ClusterAddon's) retrying with
/// backoff (5 s, doubling) make about three each, and a watch event may add one; a hot loop makes hundreds.
const MOST_ATTEMPTS: usize = 10;

fn repo_root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

fn charts() -> PathBuf {
    repo_root().join("tests/fixtures/charts")
}

/// Every file below `dir`, by path and bytes: the same digest means the same files with the same bytes.
fn tree_digest(dir: &Path) -> String {
    fn walk(dir: &Path, root: &Path, hasher: &mut Sha256) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            hasher.update(format!("{}\0", path.strip_prefix(root).unwrap().display()).as_bytes());
            if path.is_dir() {
                walk(&path, root, hasher);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                hasher.update((bytes.len() as u64).to_le_bytes());
                hasher.update(&bytes);
            }
        }
    }
    let mut hasher = Sha256::new();
    walk(dir, dir, &mut hasher);
    hex::encode(hasher.finalize())
}

/// The resolved copies of the release in the local cache.
fn copies(local_cache: &Path) -> Vec<String> {
    std::fs::read_dir(local_cache)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|name| name.starts_with(&format!("{TAG}@")))
                .collect()
        })
        .unwrap_or_default()
}

/// Checks the failure `message` of `what` and that its condition is a Warning.
fn names_the_dependency(what: &str, message: &str, mirror: &str) {
    assert!(
        message.contains("cilium 1.19.1 of chart cni")
            && message.contains(mirror)
            && message.contains("no version matches (the index has 1.19.2)"),
        "{what} names the chart, the version and the mirror: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_release_waits_for_its_dependencies_says_why_and_installs_once_the_mirror_has_them() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "local-deps").await.unwrap();
    let own = workload_plane("workload-local-deps").await;
    let release_dir = tempfile::tempdir().unwrap();
    cso_release::release::copy_release_dir(
        &repo_root().join("tests/fixtures/releases-2026").join(TAG),
        &release_dir.path().join("cluster-stacks").join(TAG),
    )
    .unwrap();
    let as_built = tree_digest(release_dir.path());
    let local_cache = tempfile::tempdir().unwrap();
    // The mirror has cilium 1.19.2 only; the release wants exactly 1.19.1.
    let content = tempfile::tempdir().unwrap();
    for chart in ["cilium-1.19.2.tgz", "metrics-server-3.13.0.tgz"] {
        std::fs::copy(charts().join(chart), content.path().join(chart)).unwrap();
    }
    let mirror = ChartRepo::start(content.path()).await.unwrap();

    let source = Arc::new(LocalSource::new(release_dir.path().join("cluster-stacks")));
    let (mut operator, renderer) = operator(&client, &ns, release_dir.path(), source.clone(), |_| {});
    operator.releases = Arc::new(
        ReleaseCache::new(release_dir.path(), source, UnpackLimits::default())
            .unwrap()
            .with_dependencies(DependencyResolver::new(ChartMirrors::all(mirror.url())))
            .with_local_cache(local_cache.path()),
    );
    let operator = RunningOperator::run(operator, renderer).await;
    create_stack(
        &client,
        &ns,
        "scs",
        json!({
            "provider": "docker", "name": "scs", "kubernetesVersion": "1.34",
            "channel": "stable", "autoSubscribe": false, "noProvider": true, "versions": ["v1"],
        }),
    )
    .await;
    cso_testenv::kubeconfig_secret(&client, &ns, "local", own.kubeconfig_yaml())
        .await
        .unwrap();
    create_cluster(&client, &ns, "local", TAG).await;

    // Both say why nothing happens.
    let message = wait_condition::<ClusterStackRelease>(
        &client,
        &ns,
        TAG,
        condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
        reason::CHART_DEPENDENCY_UNAVAILABLE,
    )
    .await;
    names_the_dependency("the ClusterStackRelease", &message, &mirror.url());
    let addon = "cluster-addon-local";
    let message = wait_condition::<ClusterAddon>(
        &client,
        &ns,
        addon,
        condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
        reason::CHART_DEPENDENCY_UNAVAILABLE,
    )
    .await;
    names_the_dependency("the ClusterAddon", &message, &mirror.url());
    let waiting: ClusterAddon = Api::namespaced(client.clone(), &ns).get(addon).await.unwrap();
    assert_eq!(
        waiting
            .get_condition(condition::CLUSTER_STACK_RELEASE_DOWNLOADED)
            .unwrap()
            .severity,
        Some(Severity::Warning),
        "a mirror without the version is worth retrying"
    );
    assert!(copies(local_cache.path()).is_empty(), "nothing copied");

    // Asked again with backoff, not in a loop.
    let index_reads = || {
        mirror
            .requests()
            .iter()
            .filter(|r| r.as_str() == "/index.yaml")
            .count()
    };
    let before = index_reads();
    tokio::time::sleep(WINDOW).await;
    let attempts = index_reads() - before;
    eprintln!("index reads at the mirror without the version, over {WINDOW:?}: {attempts}");
    assert!(
        attempts <= MOST_ATTEMPTS,
        "retried with backoff: {attempts} index reads in {WINDOW:?}"
    );

    // The mirror gets the version: resolved once into the local cache, installed, the release directory
    // untouched.
    std::fs::copy(
        charts().join("cilium-1.19.1.tgz"),
        content.path().join("cilium-1.19.1.tgz"),
    )
    .unwrap();
    let release = ready_release(&client, &ns, TAG).await;
    assert!(release.is_condition_true(condition::CLUSTER_STACK_RELEASE_DOWNLOADED));
    assert_eq!(cluster_classes(&client, &ns).await, [TAG]);
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    let ready = addon_where(&addons, "local", "the addons ready", CONVERGE, |a| {
        a.spec.cluster_stack == TAG && a.status.as_ref().is_some_and(|s| s.ready)
    })
    .await;
    assert!(ready.is_condition_true(condition::CLUSTER_STACK_RELEASE_DOWNLOADED));
    let workload = own.client().await.unwrap();
    let daemonsets: Api<DaemonSet> = Api::namespaced(workload, "kube-system");
    assert!(
        daemonsets.get_opt("cilium").await.unwrap().is_some(),
        "Cilium's agent"
    );
    assert!(
        kube_system(&own)
            .await
            .get_opt("metrics-server")
            .await
            .unwrap()
            .is_some(),
        "metrics-server"
    );
    assert_eq!(copies(local_cache.path()).len(), 1, "one resolved copy");
    assert_eq!(
        tree_digest(release_dir.path()),
        as_built,
        "the release directory keeps every byte"
    );
    operator.stop().await;
    own.stop();
}
