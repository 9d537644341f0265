//! The OCI source against a real registry (Debian's CNCF distribution registry on loopback), with the
//! fixture releases pushed the way the stack tooling pushes them: through `oci-client` as the older tooling
//! did, and request for request as `oras push` does it today (`cso_testenv::registry::push_like_oras`).
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{path::Path, sync::Arc};

use cso_api::ReleaseId;
use cso_release::{
    AddonStyle, CacheError, ChartMirrors, DependencyResolver, ReleaseCache, ReleaseSource, SourceError,
    archive::UnpackLimits,
    source::oci::{OciConfig, OciSource},
};
use cso_testenv::{
    Tools,
    registry::{PagingFront, Registry, push_like_oras},
};

const REPOSITORY: &str = "kaas/cluster-stacks";

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases")
}

/// A real release as `build.sh` builds and `oras push`es it (see /tests/fixtures/releases-2026).
const ORAS_TAG: &str = "docker-scs-1-35-v1";

fn oras_release() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases-2026/docker-scs-1-35-v1")
}

async fn registry_with_fixtures() -> (Registry, Vec<String>) {
    let registry = Registry::start(&Tools::discover().unwrap()).await.unwrap();
    let mut tags = Vec::new();
    for entry in std::fs::read_dir(fixtures()).unwrap() {
        let tag = entry.unwrap().file_name().into_string().unwrap();
        registry
            .push_release_dir(REPOSITORY, &tag, &fixtures().join(&tag))
            .await
            .unwrap();
        tags.push(tag);
    }
    tags.sort();
    (registry, tags)
}

fn source(registry: &Registry) -> OciSource {
    source_at(registry.host())
}

fn source_at(host: &str) -> OciSource {
    let host = host.to_owned();
    OciSource::new(
        OciConfig::from_lookup(|key| match key {
            "OCI_REGISTRY" => Some(host.clone()),
            "OCI_REPOSITORY" => Some(format!("{host}/{REPOSITORY}")),
            "OCI_PLAIN_HTTP" => Some("true".into()),
            _ => None,
        })
        .unwrap(),
    )
}

#[tokio::test]
async fn every_fixture_lists_and_downloads_from_a_real_registry() {
    let (registry, tags) = registry_with_fixtures().await;
    let source = Arc::new(source(&registry));
    let mut listed = source.list_tags().await.unwrap();
    listed.sort();
    assert_eq!(listed, tags);

    let dir = tempfile::tempdir().unwrap();
    let cache = ReleaseCache::new(dir.path(), source, UnpackLimits::default()).unwrap();
    for tag in &tags {
        let release = cache
            .get(&ReleaseId::parse_tag(tag).unwrap())
            .await
            .unwrap_or_else(|e| panic!("{tag}: {e}"));
        for file in std::fs::read_dir(fixtures().join(tag)).unwrap() {
            let file = file.unwrap();
            let got = std::fs::read(release.dir.join(file.file_name())).unwrap();
            assert_eq!(
                got,
                std::fs::read(file.path()).unwrap(),
                "{tag}/{:?} is byte-identical",
                file.file_name()
            );
        }
        if tag == "docker-ferrol-1-27-v0-sha-hipstsw" {
            assert!(matches!(release.addons, AddonStyle::Staged { .. }));
        }
    }
}

#[tokio::test]
async fn a_blob_with_the_wrong_digest_is_refused() {
    let (registry, _) = registry_with_fixtures().await;
    // Corrupt every stored copy of the v1 cluster-class chart: the registry serves it, the digest check refuses it.
    let chart =
        std::fs::read(fixtures().join("docker-ferrol-1-27-v1/docker-ferrol-1-27-cluster-class-v1.tgz"))
            .unwrap();
    let mut corrupted = 0;
    for entry in walk(&registry.storage().join("docker/registry/v2/blobs")) {
        if entry.file_name().is_some_and(|n| n == "data") && std::fs::read(&entry).unwrap() == chart {
            let mut bytes = chart.clone();
            bytes[100] ^= 0xff;
            std::fs::write(&entry, bytes).unwrap();
            corrupted += 1;
        }
    }
    assert_eq!(corrupted, 1, "the chart blob was found in the registry's storage");

    let dir = tempfile::tempdir().unwrap();
    let cache = ReleaseCache::new(dir.path(), Arc::new(source(&registry)), UnpackLimits::default()).unwrap();
    let err = cache
        .get(&ReleaseId::parse_tag("docker-ferrol-1-27-v1").unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            CacheError::Source {
                error: SourceError::Integrity(_),
                ..
            }
        ),
        "{err}"
    );
    assert!(cache.cached_tags().is_empty(), "nothing was published");

    let missing = cache
        .get(&ReleaseId::parse_tag("docker-ferrol-1-27-v9").unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(
            missing,
            CacheError::Source {
                error: SourceError::NotFound { .. },
                ..
            }
        ),
        "{missing}"
    );
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path))
        } else {
            out.push(path)
        }
    }
    out
}

#[tokio::test]
async fn basic_authentication_is_sent_to_the_registry() {
    let registry = Registry::start_with_basic_auth(&Tools::discover().unwrap(), "robot", "pa55word")
        .await
        .unwrap();
    let tag = "docker-ferrol-1-27-v2";
    registry
        .push_release_dir(REPOSITORY, tag, &fixtures().join(tag))
        .await
        .unwrap();
    let host = registry.host().to_owned();
    let config = |user: &'static str, password: &'static str| {
        let host = host.clone();
        OciConfig::from_lookup(move |key| match key {
            "OCI_REGISTRY" => Some(host.clone()),
            "OCI_REPOSITORY" => Some(format!("{host}/{REPOSITORY}")),
            "OCI_PLAIN_HTTP" => Some("true".into()),
            "OCI_USERNAME" => Some(user.into()),
            "OCI_PASSWORD" => Some(password.into()),
            _ => None,
        })
        .unwrap()
    };

    let denied = OciSource::new(config("robot", "wrong"))
        .list_tags()
        .await
        .unwrap_err();
    assert!(
        !matches!(denied, SourceError::NotFound { .. }),
        "a wrong password is not 'not found': {denied}"
    );
    let anonymous = source(&registry).list_tags().await;
    assert!(anonymous.is_err(), "the registry requires authentication");

    let allowed = Arc::new(OciSource::new(config("robot", "pa55word")));
    assert_eq!(allowed.list_tags().await.unwrap(), [tag]);
    let dir = tempfile::tempdir().unwrap();
    let cache = ReleaseCache::new(dir.path(), allowed, UnpackLimits::default()).unwrap();
    let release = cache.get(&ReleaseId::parse_tag(tag).unwrap()).await.unwrap();
    assert_eq!(release.metadata.cluster_addon.to_dot(), "v2");
}

#[tokio::test]
async fn a_release_pushed_like_oras_lists_and_downloads_byte_identical() {
    let registry = Registry::start(&Tools::discover().unwrap()).await.unwrap();
    push_like_oras(&registry, REPOSITORY, ORAS_TAG, &oras_release())
        .await
        .unwrap();
    let source = Arc::new(source(&registry));
    assert_eq!(source.list_tags().await.unwrap(), [ORAS_TAG]);

    let dir = tempfile::tempdir().unwrap();
    source.download(ORAS_TAG, dir.path(), None).await.unwrap();
    let mut names = Vec::new();
    for file in std::fs::read_dir(oras_release()).unwrap() {
        let file = file.unwrap();
        let got = std::fs::read(dir.path().join(file.file_name())).unwrap();
        assert!(
            got == std::fs::read(file.path()).unwrap(),
            "{:?} is byte-identical",
            file.file_name()
        );
        names.push(file.file_name());
    }
    assert_eq!(
        names.len(),
        6,
        "metadata, hashes, csctl, clusteraddon and the two archives"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        6,
        "nothing else was written (the empty config is not a file)"
    );

    // And the operator's path: the cache downloads, verifies and reads it as a release, its unvendored
    // chart dependencies from a loopback mirror (the tests have no network).
    let charts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/charts");
    let mirror = cso_testenv::chart_repo::ChartRepo::start(&charts).await.unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = ReleaseCache::new(cache_dir.path(), source, UnpackLimits::default())
        .unwrap()
        .with_dependencies(DependencyResolver::new(ChartMirrors::all(mirror.url())));
    let release = cache.get(&ReleaseId::parse_tag(ORAS_TAG).unwrap()).await.unwrap();
    assert_eq!(release.metadata.cluster_addon.to_dot(), "v1");
    assert!(matches!(release.addons, AddonStyle::Staged { .. }));
}

/// Debian's registry does not page tag lists, so the source lists through `PagingFront`, which pages the real
/// registry's list as distribution 3 (and GHCR, Harbor, Docker Hub) do.
#[tokio::test]
async fn tags_are_listed_across_pages() {
    let registry = Registry::start(&Tools::discover().unwrap()).await.unwrap();
    let mut tags: Vec<String> = (1..=7).map(|v| format!("docker-scs-1-35-v{v}")).collect();
    for tag in &tags {
        push_like_oras(&registry, REPOSITORY, tag, &oras_release())
            .await
            .unwrap();
    }
    tags.sort();
    let front = PagingFront::start(&registry).await.unwrap();

    let mut served = 0;
    for (per_page, pages) in [(3, 3), (1, 7), (7, 1), (1000, 1)] {
        let mut listed = source_at(front.host())
            .with_tags_per_page(per_page)
            .list_tags()
            .await
            .unwrap();
        listed.sort();
        assert_eq!(listed, tags, "{per_page} per page");
        served += pages;
        assert_eq!(front.pages_served(), served, "{per_page} per page: {pages} pages");
    }
    // A registry that does not page at all is read in one go.
    let mut listed = source(&registry).with_tags_per_page(3).list_tags().await.unwrap();
    listed.sort();
    assert_eq!(listed, tags);

    // And a release is downloaded through the front as well (it passes everything else through).
    let dir = tempfile::tempdir().unwrap();
    source_at(front.host())
        .download("docker-scs-1-35-v7", dir.path(), None)
        .await
        .unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 6);
}

#[tokio::test]
async fn a_corrupted_blob_of_an_oras_release_is_refused_by_name() {
    let registry = Registry::start(&Tools::discover().unwrap()).await.unwrap();
    push_like_oras(&registry, REPOSITORY, ORAS_TAG, &oras_release())
        .await
        .unwrap();
    let name = "docker-scs-1-35-cluster-class-v1.tgz";
    let chart = std::fs::read(oras_release().join(name)).unwrap();
    let mut corrupted = 0;
    for entry in walk(&registry.storage().join("docker/registry/v2/blobs")) {
        if entry.file_name().is_some_and(|n| n == "data") && std::fs::read(&entry).unwrap() == chart {
            let mut bytes = chart.clone();
            bytes[100] ^= 0xff;
            std::fs::write(&entry, bytes).unwrap();
            corrupted += 1;
        }
    }
    assert_eq!(corrupted, 1, "the chart blob was found in the registry's storage");

    let dir = tempfile::tempdir().unwrap();
    let err = source(&registry)
        .download(ORAS_TAG, dir.path(), None)
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::Integrity(_)), "{err}");
    assert!(err.to_string().contains(name), "the error names the file: {err}");
}
