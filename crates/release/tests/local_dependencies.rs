//! `--local` releases whose charts do not vendor their dependencies (the real `docker-scs-1-35-v1` as the
//! stacks' 2026 build leaves it: stage `cni` needs cilium 1.19.1, stage `metrics-server` metrics-server
//! 3.13.0), resolved through the cache's download path from a loopback chart repository acting as
//! `--chart-mirror`: into a copy in the local cache named by the digest of the release's files, never into the
//! release directory. The copy is found again (by the same process and after a restart) without asking the
//! mirror; a rebuilt release gets a copy of its own and the old one goes; a mirror that is down fails with the
//! chart, version and repository named and leaves nothing behind.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use cso_api::ReleaseId;
use cso_release::{
    CacheError, ChartMirrors, DependencyResolver, ReleaseCache, archive::UnpackLimits,
    cache::CLUSTER_STACKS_DIR, release::files_digest, source::local::LocalSource,
};
use cso_testenv::chart_repo::ChartRepo;
use sha2::{Digest, Sha256};

const TAG: &str = "docker-scs-1-35-v1";
const ADDON_ARCHIVE: &str = "docker-scs-1-35-cluster-addon-v1.tgz";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn id() -> ReleaseId {
    ReleaseId::parse_tag(TAG).unwrap()
}

/// A `--release-dir` holding the fixture as a stack author's build leaves it: `cluster-stacks/<tag>/`.
fn release_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    cso_release::release::copy_release_dir(
        &repo_root().join("tests/fixtures/releases-2026").join(TAG),
        &dir.path().join(CLUSTER_STACKS_DIR).join(TAG),
    )
    .unwrap();
    dir
}

fn local_cache(release_dir: &Path, local_cache: &Path, mirror: &str) -> ReleaseCache {
    let source = LocalSource::new(release_dir.join(CLUSTER_STACKS_DIR));
    ReleaseCache::new(release_dir, Arc::new(source), UnpackLimits::default())
        .unwrap()
        .with_dependencies(DependencyResolver::new(ChartMirrors::all(mirror)))
        .with_local_cache(local_cache)
}

/// Every file below `dir`, by path, name and bytes: the same digest means the same files with the same bytes.
fn tree_digest(dir: &Path) -> String {
    fn walk(dir: &Path, root: &Path, hasher: &mut Sha256) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let relative = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            hasher.update(format!("{relative}\0").as_bytes());
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

/// The names in the local cache.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Rebuilds the release's addon archive with metrics-server's `values.yaml` changed, as a stack author's
/// build does after an edit.
fn rebuild_addons(release: &Path) {
    let archive = release.join(ADDON_ARCHIVE);
    let files: Vec<(String, Vec<u8>)> = cso_testenv::archive::files_of(&archive)
        .unwrap()
        .into_iter()
        .map(|(path, content)| match path.as_str() {
            "metrics-server/values.yaml" => {
                let values = String::from_utf8(content).unwrap().replace(
                    "fullnameOverride: metrics-server",
                    "fullnameOverride: metrics-server\n  podAnnotations:\n    cso.test/build: rebuilt",
                );
                (path, values.into_bytes())
            }
            _ => (path, content),
        })
        .collect();
    std::fs::write(&archive, cso_testenv::archive::tgz(&files)).unwrap();
}

#[tokio::test]
async fn a_local_release_is_resolved_into_a_copy_once_per_build_and_its_directory_left_alone() {
    let mut mirror = ChartRepo::start(&repo_root().join("tests/fixtures/charts"))
        .await
        .unwrap();
    let dir = release_dir();
    let release = dir.path().join(CLUSTER_STACKS_DIR).join(TAG);
    let copies = tempfile::tempdir().unwrap();
    let before = tree_digest(dir.path());
    let cache = local_cache(dir.path(), copies.path(), &mirror.url());

    assert!(
        cache.cached(&id()).unwrap().is_none(),
        "not usable until its dependencies are resolved"
    );
    let resolved = cache.get(&id()).await.unwrap();
    let digest = files_digest(&release).unwrap();
    let copy = copies
        .path()
        .join(format!("{TAG}@{}", &digest["sha256:".len()..][..16]));
    assert_eq!(
        resolved.dir, copy,
        "resolved into the local cache, named by the files' digest"
    );
    assert_eq!(
        resolved.provenance.as_ref().and_then(|p| p.digest.as_deref()),
        Some(digest.as_str()),
        "the digest of the files is the copy's provenance"
    );
    assert!(cso_release::deps::missing(&resolved).unwrap().is_empty());
    let stages = resolved.addon_charts(UnpackLimits::default()).unwrap();
    assert!(
        stages.starts_with(&copy),
        "unpacked in the copy: {}",
        stages.display()
    );
    for (stage, chart) in [
        ("cni", "cilium-1.19.1.tgz"),
        ("metrics-server", "metrics-server-3.13.0.tgz"),
    ] {
        assert!(
            stages.join(stage).join("charts").join(chart).is_file(),
            "{stage}: {chart}"
        );
    }
    assert_eq!(
        entries(copies.path()),
        [copy_name(&copy)],
        "one copy, no staging left"
    );
    assert_eq!(
        tree_digest(dir.path()),
        before,
        "the release directory is as built"
    );

    // Found again by this process and by the next one, without the mirror.
    let asked = mirror.requests().len();
    assert_eq!(cache.cached(&id()).unwrap().unwrap().dir, copy);
    let restarted = local_cache(dir.path(), copies.path(), &mirror.url());
    assert_eq!(restarted.get(&id()).await.unwrap().dir, copy);
    assert_eq!(mirror.requests().len(), asked, "nothing fetched again");

    // Rebuilt: resolved again into a copy of its own; the copy it replaces is removed.
    rebuild_addons(&release);
    let rebuilt_tree = tree_digest(dir.path());
    assert!(
        restarted.cached(&id()).unwrap().is_none(),
        "the rebuilt release is not resolved yet"
    );
    let rebuilt = restarted.get(&id()).await.unwrap();
    assert_ne!(rebuilt.dir, copy);
    assert!(
        rebuilt
            .dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(&format!("{TAG}@")),
        "{}",
        rebuilt.dir.display()
    );
    assert!(
        mirror.requests().len() > asked,
        "the rebuilt release's dependencies were fetched"
    );
    let stages = rebuilt.addon_charts(UnpackLimits::default()).unwrap();
    let values = std::fs::read_to_string(stages.join("metrics-server/values.yaml")).unwrap();
    assert!(
        values.contains("cso.test/build: rebuilt"),
        "the rebuilt values: {values}"
    );
    assert_eq!(
        entries(copies.path()),
        [copy_name(&rebuilt.dir)],
        "the old copy is gone"
    );
    assert_eq!(
        tree_digest(dir.path()),
        rebuilt_tree,
        "the release directory is as rebuilt"
    );
    mirror.stop().await;
}

fn copy_name(dir: &Path) -> String {
    dir.file_name().unwrap().to_string_lossy().into_owned()
}

#[tokio::test]
async fn a_mirror_that_is_down_names_the_dependency_and_leaves_nothing_behind() {
    let mut mirror = ChartRepo::start(&repo_root().join("tests/fixtures/charts"))
        .await
        .unwrap();
    let url = mirror.url();
    mirror.stop().await;
    let dir = release_dir();
    let copies = tempfile::tempdir().unwrap();
    let before = tree_digest(dir.path());
    let cache = local_cache(dir.path(), copies.path(), &url);

    let error = cache.get(&id()).await.unwrap_err();
    let CacheError::Dependency {
        error: dependency, ..
    } = &error
    else {
        panic!("not a dependency failure: {error}");
    };
    assert_eq!(
        (
            dependency.name.as_str(),
            dependency.version.as_str(),
            dependency.chart.as_str()
        ),
        ("cilium", "1.19.1", "cni"),
        "{error}"
    );
    assert_eq!(dependency.repository, url, "{error}");
    assert!(
        entries(copies.path()).is_empty(),
        "left in the local cache: {:?}",
        entries(copies.path())
    );
    assert!(cache.cached(&id()).unwrap().is_none());
    assert_eq!(
        tree_digest(dir.path()),
        before,
        "the release directory is as built"
    );
}
