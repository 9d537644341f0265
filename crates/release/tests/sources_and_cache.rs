//! Release sources and the cache: every fixture through the local source and the GitHub stand-in;
//! pagination, conditional requests, redirects without the token, rate limits and server errors; crash
//! safety and one download per tag.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use cso_api::{Channel, KubernetesVersion, ReleaseId};
use cso_release::{
    AddonStyle, CacheError, Hook, ReleaseCache, ReleaseSource, SourceError, StackKey,
    archive::UnpackLimits,
    source::{
        Provenance,
        github::{GithubConfig, GithubSource},
        local::LocalSource,
        releases_of,
    },
};
use cso_testenv::github::{Failure, FakeGithub};
use futures::future::BoxFuture;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases")
}

fn fixture_tags() -> Vec<String> {
    let mut tags: Vec<String> = std::fs::read_dir(fixtures())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    tags.sort();
    tags
}

fn github(fake: &FakeGithub, token: Option<&str>) -> GithubSource {
    GithubSource::new(GithubConfig {
        api_url: fake.api_url().parse().unwrap(),
        org: "SovereignCloudStack".into(),
        repo: "cluster-stacks".into(),
        token: token.map(str::to_owned),
    })
    .unwrap()
}

fn ferrol() -> StackKey {
    StackKey {
        provider: "docker".into(),
        name: "ferrol".into(),
        kubernetes: KubernetesVersion { major: 1, minor: 27 },
    }
}

fn check_fixture(release: &cso_release::Release) {
    let tag = release.id.tag();
    match tag.as_str() {
        "docker-ferrol-1-27-v3" => {
            assert_eq!(release.metadata.cluster_addon.to_dot(), "v2", "v3 ships addon v2");
            assert!(
                release
                    .cluster_addon_archive
                    .ends_with("docker-ferrol-1-27-cluster-addon-v2.tgz")
            );
        }
        "docker-ferrol-1-27-v0-sha-hipstsw" => {
            assert_eq!(release.id.channel(), Channel::Custom);
            let AddonStyle::Staged { config } = &release.addons else {
                panic!("{tag} is staged")
            };
            assert_eq!(config.stages(Hook::BeforeClusterUpgrade)[0].name, "ngnix");
        }
        "docker-scs-1-30-v1" => assert!(release.is_staged()),
        _ => assert!(
            matches!(release.addons, AddonStyle::Single { .. }),
            "{tag} is old style"
        ),
    }
}

#[tokio::test]
async fn every_fixture_loads_from_the_local_source() {
    // Local mode reads `<release-dir>/cluster-stacks/<tag>/`, the Go operator's layout.
    let release_dir = tempfile::tempdir().unwrap();
    let cluster_stacks = release_dir.path().join("cluster-stacks");
    std::os::unix::fs::symlink(fixtures(), &cluster_stacks).unwrap();
    let cache = ReleaseCache::new(
        release_dir.path(),
        Arc::new(LocalSource::new(&cluster_stacks)),
        UnpackLimits::default(),
    )
    .unwrap();
    let tags = cache.source().list_tags().await.unwrap();
    assert_eq!(tags, fixture_tags());
    for tag in &tags {
        let id = ReleaseId::parse_tag(tag).unwrap();
        let release = cache.get(&id).await.unwrap_or_else(|e| panic!("{tag}: {e}"));
        release.verify_archives(UnpackLimits::default()).unwrap();
        check_fixture(&release);
    }
    let missing = ReleaseId::parse_tag("docker-ferrol-1-27-v9").unwrap();
    let err = cache.get(&missing).await.unwrap_err();
    assert!(
        matches!(
            err,
            CacheError::Source {
                error: SourceError::NotFound { .. },
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn every_fixture_downloads_from_the_github_stand_in() {
    let fake = FakeGithub::start(100).await.unwrap();
    for tag in fixture_tags() {
        fake.publish_dir(&tag, &fixtures().join(&tag)).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = ReleaseCache::new(
        dir.path(),
        Arc::new(github(&fake, Some("s3cret"))),
        UnpackLimits::default(),
    )
    .unwrap();
    for tag in fixture_tags() {
        let release = cache
            .get(&ReleaseId::parse_tag(&tag).unwrap())
            .await
            .unwrap_or_else(|e| panic!("{tag}: {e}"));
        check_fixture(&release);
        assert_eq!(
            release.dir,
            dir.path().join("cluster-stacks").join(&tag),
            "the Go operator's layout"
        );
    }

    let requests = fake.requests();
    let api: Vec<_> = requests.iter().filter(|r| r.host == "api").collect();
    let storage: Vec<_> = requests.iter().filter(|r| r.host == "storage").collect();
    assert!(!storage.is_empty(), "assets come through the redirect");
    assert!(
        api.iter()
            .all(|r| r.authorization.as_deref() == Some("Bearer s3cret")),
        "the API gets the token"
    );
    assert!(
        storage.iter().all(|r| r.authorization.is_none()),
        "the token never goes to the storage host"
    );
    assert!(
        api.iter()
            .any(|r| r.path.contains("/releases/assets/") && r.status == 302)
    );
}

#[tokio::test]
async fn listing_reads_every_page_and_skips_foreign_and_malformed_tags() {
    let fake = FakeGithub::start(30).await.unwrap();
    fake.publish_dir("docker-ferrol-1-27-v1", &fixtures().join("docker-ferrol-1-27-v1"))
        .unwrap();
    for i in 0..35 {
        fake.publish(&format!("openstack-scs-1-{}-v{i}", 28 + i % 3), vec![]);
    }
    fake.publish("docker-ferrol-1-27-garbage", vec![]);
    fake.publish("v2.0.0", vec![]);
    fake.publish("docker-ferrol-1-28-v7", vec![]);
    let source = github(&fake, None);
    let tags = source.list_tags().await.unwrap();
    assert_eq!(tags.len(), 39, "all pages were read");
    let pages: Vec<String> = fake
        .requests()
        .iter()
        .filter(|r| r.path.contains("/releases?"))
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(pages.len(), 2, "{pages:?}");
    let releases = releases_of(&tags, &ferrol(), Channel::Stable);
    assert_eq!(
        releases,
        [ReleaseId::parse_tag("docker-ferrol-1-27-v1").unwrap()],
        "the wanted one is on page 2"
    );
}

#[tokio::test]
async fn an_unchanged_listing_costs_only_not_modified_answers() {
    let fake = FakeGithub::start(30).await.unwrap();
    for i in 0..40 {
        fake.publish(&format!("docker-ferrol-1-27-v{i}"), vec![]);
    }
    let source = github(&fake, None);
    let first = source.list_tags().await.unwrap();
    let second = source.list_tags().await.unwrap();
    assert_eq!(first, second);
    let listing: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/releases?"))
        .collect();
    assert_eq!(listing.len(), 4);
    assert!(
        listing[..2]
            .iter()
            .all(|r| r.status == 200 && r.if_none_match.is_none())
    );
    assert!(
        listing[2..]
            .iter()
            .all(|r| r.status == 304 && r.if_none_match.is_some()),
        "{listing:?}"
    );

    fake.publish("docker-ferrol-1-27-v40", vec![]);
    let third = source.list_tags().await.unwrap();
    assert_eq!(third.len(), 41, "a new release is seen despite the cached pages");
    assert_eq!(third[0], "docker-ferrol-1-27-v40");
}

#[tokio::test]
async fn rate_limits_and_server_errors_are_typed() {
    let fake = FakeGithub::start(30).await.unwrap();
    fake.publish("docker-ferrol-1-27-v1", vec![]);
    let source = github(&fake, None);

    fake.fail_next(Failure::RateLimited { reset_in_secs: 120 });
    let err = source.list_tags().await.unwrap_err();
    let retry = err.retry_after().expect("a rate limit says when to retry");
    assert!(matches!(err, SourceError::RateLimited { .. }), "{err}");
    assert!(
        (Duration::from_secs(100)..=Duration::from_secs(121)).contains(&retry),
        "{retry:?}"
    );
    assert_eq!(source.rate_limit_remaining(), Some(0));

    fake.fail_next(Failure::Status(500));
    let err = source.list_tags().await.unwrap_err();
    assert!(matches!(err, SourceError::Http { status: 500, .. }), "{err}");

    fake.fail_next(Failure::Status(500));
    let dir = tempfile::tempdir().unwrap();
    let err = source
        .download("docker-ferrol-1-27-v1", dir.path(), None)
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::Http { status: 500, .. }), "{err}");

    let err = source
        .download("docker-ferrol-1-27-v9", dir.path(), None)
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::NotFound { .. }), "{err}");

    assert_eq!(
        source.list_tags().await.unwrap(),
        ["docker-ferrol-1-27-v1"],
        "it recovers"
    );
}

/// A source that serves a fixture release slowly, counting downloads, and can stop half-way for ever.
#[derive(Debug)]
struct SlowSource {
    downloads: AtomicUsize,
    hang_after_first_file: bool,
}

impl ReleaseSource for SlowSource {
    fn kind(&self) -> &'static str {
        "slow"
    }
    fn list_tags(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>> {
        Box::pin(async { Ok(fixture_tags()) })
    }
    fn download<'a>(
        &'a self,
        tag: &'a str,
        dest: &'a Path,
        _pin: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Provenance, SourceError>> {
        Box::pin(async move {
            self.downloads.fetch_add(1, Ordering::SeqCst);
            for (i, entry) in std::fs::read_dir(fixtures().join(tag)).unwrap().enumerate() {
                let entry = entry.unwrap();
                std::fs::copy(entry.path(), dest.join(entry.file_name())).unwrap();
                if i == 0 && self.hang_after_first_file {
                    futures::future::pending::<()>().await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(Provenance::of_kind("slow"))
        })
    }
}

#[tokio::test]
async fn a_download_stopped_half_way_leaves_nothing_and_a_retry_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let id = ReleaseId::parse_tag("docker-ferrol-1-27-v2").unwrap();
    let hanging = Arc::new(SlowSource {
        downloads: AtomicUsize::new(0),
        hang_after_first_file: true,
    });
    let cache = ReleaseCache::new(dir.path(), hanging, UnpackLimits::default()).unwrap();
    let stopped = tokio::time::timeout(Duration::from_millis(300), cache.get(&id)).await;
    assert!(stopped.is_err(), "the download hangs half-way and is dropped");
    assert_eq!(cache.cached(&id).unwrap(), None, "no release is visible");
    assert!(cache.cached_tags().is_empty());
    let root = dir.path().join("cluster-stacks");
    assert_eq!(
        std::fs::read_dir(&root).unwrap().count(),
        0,
        "the staging directory went with the dropped download"
    );

    // A process killed half-way leaves its staging directory behind: the next start removes it.
    let leftover = root.join(".download-docker-ferrol-1-27-v2-crashed");
    std::fs::create_dir(&leftover).unwrap();
    std::fs::copy(
        fixtures().join("docker-ferrol-1-27-v2/metadata.yaml"),
        leftover.join("metadata.yaml"),
    )
    .unwrap();
    let good = Arc::new(SlowSource {
        downloads: AtomicUsize::new(0),
        hang_after_first_file: false,
    });
    let cache = ReleaseCache::new(dir.path(), good.clone(), UnpackLimits::default()).unwrap();
    assert!(!leftover.exists(), "what a crash left is removed at start");
    let release = cache.get(&id).await.unwrap();
    assert_eq!(release.metadata.cluster_addon.to_dot(), "v2");
    assert_eq!(cache.cached_tags(), ["docker-ferrol-1-27-v2"]);
}

#[tokio::test]
async fn concurrent_requests_for_one_tag_download_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let source = Arc::new(SlowSource {
        downloads: AtomicUsize::new(0),
        hang_after_first_file: false,
    });
    let cache = Arc::new(ReleaseCache::new(dir.path(), source.clone(), UnpackLimits::default()).unwrap());
    let id = ReleaseId::parse_tag("docker-scs-1-30-v1").unwrap();
    let gets: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn({
                let (cache, id) = (cache.clone(), id.clone());
                async move { cache.get(&id).await.map(|r| r.id.tag()) }
            })
        })
        .collect();
    for get in gets {
        assert_eq!(get.await.unwrap().unwrap(), "docker-scs-1-30-v1");
    }
    assert_eq!(
        source.downloads.load(Ordering::SeqCst),
        1,
        "one download for eight callers"
    );
}

#[tokio::test]
async fn a_broken_release_is_refused_and_never_published() {
    let fake = FakeGithub::start(30).await.unwrap();
    let v1 = fixtures().join("docker-ferrol-1-27-v1");
    let read = |name: &str| std::fs::read(v1.join(name)).unwrap();
    // The cluster-class chart named for v10: an exact lookup does not take it for v1.
    fake.publish(
        "docker-ferrol-1-27-v1",
        vec![
            ("metadata.yaml".into(), read("metadata.yaml")),
            (
                "cluster-addon-values.yaml".into(),
                read("cluster-addon-values.yaml"),
            ),
            (
                "docker-ferrol-1-27-cluster-class-v10.tgz".into(),
                read("docker-ferrol-1-27-cluster-class-v1.tgz"),
            ),
            (
                "docker-ferrol-1-27-cluster-addon-v1.tgz".into(),
                read("docker-ferrol-1-27-cluster-addon-v1.tgz"),
            ),
        ],
    );
    // A truncated addon archive.
    let addon = read("docker-ferrol-1-27-cluster-addon-v1.tgz");
    fake.publish(
        "docker-ferrol-1-27-v2",
        vec![
            (
                "metadata.yaml".into(),
                b"versions: {clusterStack: v2, kubernetes: v1.27.3, components: {clusterAddon: v1}}".to_vec(),
            ),
            (
                "cluster-addon-values.yaml".into(),
                read("cluster-addon-values.yaml"),
            ),
            (
                "docker-ferrol-1-27-cluster-class-v2.tgz".into(),
                read("docker-ferrol-1-27-cluster-class-v1.tgz"),
            ),
            (
                "docker-ferrol-1-27-cluster-addon-v1.tgz".into(),
                addon[..addon.len() / 2].to_vec(),
            ),
        ],
    );
    // Metadata that is not YAML.
    fake.publish(
        "docker-ferrol-1-27-v3",
        vec![("metadata.yaml".into(), b"versions: [".to_vec())],
    );
    // No metadata at all.
    fake.publish(
        "docker-ferrol-1-27-v4",
        vec![(
            "cluster-addon-values.yaml".into(),
            read("cluster-addon-values.yaml"),
        )],
    );

    let dir = tempfile::tempdir().unwrap();
    let cache =
        ReleaseCache::new(dir.path(), Arc::new(github(&fake, None)), UnpackLimits::default()).unwrap();
    for (tag, expected) in [
        ("docker-ferrol-1-27-v1", "missing cluster-class chart"),
        ("docker-ferrol-1-27-v2", "corrupt or truncated"),
        ("docker-ferrol-1-27-v3", "not valid metadata YAML"),
        ("docker-ferrol-1-27-v4", "metadata.yaml: missing release metadata"),
    ] {
        let err = cache.get(&ReleaseId::parse_tag(tag).unwrap()).await.unwrap_err();
        assert!(matches!(err, CacheError::Release { .. }), "{tag}: {err}");
        assert!(err.to_string().contains(expected), "{tag}: {err}");
    }
    assert!(cache.cached_tags().is_empty(), "nothing broken was published");
    assert_eq!(
        std::fs::read_dir(dir.path().join("cluster-stacks"))
            .unwrap()
            .count(),
        0,
        "no staging left behind"
    );
}
