//! The OCI source against a real registry (Debian's CNCF distribution registry on loopback), with the
//! fixture releases pushed the way the stack tooling pushes them.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{path::Path, sync::Arc};

use cso_api::ReleaseId;
use cso_release::{
    AddonStyle, CacheError, ReleaseCache, ReleaseSource, SourceError,
    archive::UnpackLimits,
    source::oci::{OciConfig, OciSource},
};
use cso_testenv::{Tools, registry::Registry};

const REPOSITORY: &str = "kaas/cluster-stacks";

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases")
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
    let host = registry.host().to_owned();
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
