//! Benchmark: a 2026 release (unvendored charts) entering the cache, for each of the three fixture releases
//! (`docker-scs-1-34-v1`, `docker-scs-1-35-v1`, `openstack-scs-1-35-v1`): download from the GitHub stand-in,
//! verify, fetch every missing chart dependency from a mirror, write it into the archives, verify again and
//! rename into place. Mirrors: the loopback HTTP chart repository (`index.yaml` + archives) and the test
//! environment's real OCI registry (charts pushed with the real `helm push`). Reported per release and mirror:
//! the median and slowest of the runs, the dependencies added, and the size of the release as published and as
//! cached.
//!
//! `cargo bench -p cso-release --bench resolve_dependencies` (needs `make tools`; results are written up in
//! docs/benchmarks.md).
#![allow(clippy::unwrap_used, reason = "a benchmark: a failed unwrap is a failed run")]

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use cso_api::ReleaseId;
use cso_release::{
    ChartMirrors, DependencyResolver, ReleaseCache,
    archive::UnpackLimits,
    source::github::{GithubConfig, GithubSource},
};
use cso_testenv::{chart_repo::ChartRepo, github::FakeGithub, registry::Registry};

const TAGS: [&str; 3] = [
    "docker-scs-1-34-v1",
    "docker-scs-1-35-v1",
    "openstack-scs-1-35-v1",
];
const RUNS: usize = 7;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// Pushes every fixture chart to `prefix` with the real `helm push`, as a site fills its mirror.
fn helm_push_all(helm: &Path, prefix: &str) {
    let home = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixtures().join("charts")).unwrap() {
        let chart = entry.unwrap().path();
        if chart.extension().is_none_or(|e| e != "tgz") {
            continue;
        }
        let output = std::process::Command::new(helm)
            .arg("push")
            .arg(&chart)
            .arg(prefix)
            .arg("--plain-http")
            .env("HELM_CONFIG_HOME", home.path().join("config"))
            .env("HELM_CACHE_HOME", home.path().join("cache"))
            .env("HELM_DATA_HOME", home.path().join("data"))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "helm push {}: {}",
            chart.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// One release into a fresh cache; returns the time, the dependencies added and the cached size.
async fn cache_once(fake: &FakeGithub, tag: &str, mirror: &str) -> (Duration, usize, u64) {
    let dir = tempfile::tempdir().unwrap();
    let source = GithubSource::new(GithubConfig {
        api_url: fake.api_url().parse().unwrap(),
        org: "SovereignCloudStack".into(),
        repo: "cluster-stacks".into(),
        token: None,
    })
    .unwrap();
    let cache = ReleaseCache::new(dir.path(), Arc::new(source), UnpackLimits::default())
        .unwrap()
        .with_dependencies(DependencyResolver::new(ChartMirrors::all(mirror)));
    let started = Instant::now();
    let release = cache.get(&ReleaseId::parse_tag(tag).unwrap()).await.unwrap();
    let elapsed = started.elapsed();
    let missing_after = cso_release::deps::missing(&release).unwrap();
    assert!(missing_after.is_empty(), "{tag}: still missing {missing_after:?}");
    let added = count_vendored(&release.cluster_addon_archive) + count_vendored(&release.cluster_class_chart);
    (elapsed, added, cso_testenv::disk_size(&release.dir))
}

/// How many `charts/<name>-<version>.tgz` entries an archive holds.
fn count_vendored(archive: &Path) -> usize {
    let file = std::fs::File::open(archive).unwrap();
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
    tar.entries()
        .unwrap()
        .filter(|e| {
            let path = e.as_ref().unwrap().path().unwrap().into_owned();
            let parent = path.parent().and_then(|p| p.file_name());
            parent.is_some_and(|p| p == "charts") && path.extension().is_some_and(|x| x == "tgz")
        })
        .count()
}

#[tokio::main]
async fn main() {
    let tools = cso_testenv::Tools::discover().unwrap();
    let fake = FakeGithub::start(100).await.unwrap();
    for tag in TAGS {
        fake.publish_dir(tag, &fixtures().join("releases-2026").join(tag))
            .unwrap();
    }
    let repo = ChartRepo::start(&fixtures().join("charts")).await.unwrap();
    let registry = Registry::start(&tools).await.unwrap();
    let oci = format!("oci://{}/mirror/charts", registry.host());
    helm_push_all(tools.helm.as_ref().expect("helm: run `make tools`"), &oci);

    println!(
        "a release entering the cache with its chart dependencies, {RUNS} runs each (fresh cache per run)"
    );
    println!(
        "{:<22} {:<5} {:>10} {:>10} {:>6} {:>14} {:>12}",
        "release", "mirror", "median ms", "max ms", "deps", "published KiB", "cached KiB"
    );
    for tag in TAGS {
        let published = cso_testenv::disk_size(&fixtures().join("releases-2026").join(tag));
        for (kind, mirror) in [("http", repo.url()), ("oci", oci.clone())] {
            let mut times = Vec::with_capacity(RUNS);
            let mut last = (0, 0);
            for _ in 0..RUNS {
                let (elapsed, added, cached) = cache_once(&fake, tag, &mirror).await;
                times.push(elapsed);
                last = (added, cached);
            }
            times.sort();
            let ms = |d: Duration| d.as_secs_f64() * 1000.0;
            println!(
                "{tag:<22} {kind:<5} {:>10.1} {:>10.1} {:>6} {:>14} {:>12}",
                ms(times[RUNS / 2]),
                ms(times[RUNS - 1]),
                last.0,
                published / 1024,
                last.1 / 1024
            );
        }
    }
}
