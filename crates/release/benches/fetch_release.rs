//! Benchmark: fetch, verify and unpack `docker-scs-1-30-v1` from each source (local directory, the GitHub
//! stand-in, a real OCI registry). Each source runs in a child process of its own, so that the reported
//! peak resident memory (VmHWM) is that source's alone; the servers run in the parent.
//!
//! `cargo bench -p cso-release --bench fetch_release` (results are written up in docs/benchmarks.md).
#![allow(clippy::unwrap_used, reason = "a benchmark: a failed unwrap is a failed run")]

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use cso_api::ReleaseId;
use cso_release::{
    AddonStyle, ReleaseCache, ReleaseSource,
    archive::{self, UnpackLimits},
    source::{
        github::{GithubConfig, GithubSource},
        local::LocalSource,
        oci::{OciConfig, OciSource},
    },
};

const TAG: &str = "docker-scs-1-30-v1";
const ITERATIONS: usize = 20;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases")
}

/// One fetch + verify + unpack into a fresh cache; returns the time it took.
async fn fetch_once(source: Arc<dyn ReleaseSource>, local_root: Option<&Path>) -> Duration {
    let work = tempfile::tempdir().unwrap();
    let release_dir = match local_root {
        Some(root) => root.to_path_buf(),
        None => work.path().join("releases"),
    };
    let started = Instant::now();
    let cache = ReleaseCache::new(&release_dir, source, UnpackLimits::default()).unwrap();
    let release = cache.get(&ReleaseId::parse_tag(TAG).unwrap()).await.unwrap();
    release.verify_archives(UnpackLimits::default()).unwrap();
    archive::unpack(
        &release.cluster_class_chart,
        &work.path().join("class"),
        UnpackLimits::default(),
    )
    .unwrap();
    let addons = archive::unpack(
        &release.cluster_addon_archive,
        &work.path().join("addons"),
        UnpackLimits::default(),
    )
    .unwrap();
    assert!(matches!(release.addons, AddonStyle::Staged { .. }) && addons.top_level.len() == 2);
    started.elapsed()
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmHWM:")
                .map(|v| v.trim().trim_end_matches("kB").trim().parse().unwrap())
        })
        .unwrap()
}

/// The child: fetch ITERATIONS times from one source and print `median_ms p90_ms peak_kib`.
async fn child(kind: &str, endpoint: &str) {
    let local = tempfile::tempdir().unwrap();
    let (source, local_root): (Arc<dyn ReleaseSource>, Option<PathBuf>) = match kind {
        "local" => {
            let stacks = local.path().join("cluster-stacks");
            std::fs::create_dir(&stacks).unwrap();
            std::os::unix::fs::symlink(fixtures().join(TAG), stacks.join(TAG)).unwrap();
            (
                Arc::new(LocalSource::new(stacks)),
                Some(local.path().to_path_buf()),
            )
        }
        "github" => (
            Arc::new(
                GithubSource::new(GithubConfig {
                    api_url: endpoint.parse().unwrap(),
                    org: "o".into(),
                    repo: "r".into(),
                    token: None,
                })
                .unwrap(),
            ),
            None,
        ),
        "oci" => {
            let host = endpoint.to_owned();
            let config = OciConfig::from_lookup(|k| match k {
                "OCI_REGISTRY" => Some(host.clone()),
                "OCI_REPOSITORY" => Some(format!("{host}/kaas/cluster-stacks")),
                "OCI_PLAIN_HTTP" => Some("true".into()),
                _ => None,
            })
            .unwrap();
            (Arc::new(OciSource::new(config)), None)
        }
        other => panic!("unknown source {other}"),
    };
    let mut times: Vec<Duration> = Vec::new();
    for _ in 0..ITERATIONS {
        times.push(fetch_once(source.clone(), local_root.as_deref()).await);
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{:.2} {:.2} {}",
        ms(times[ITERATIONS / 2]),
        ms(times[ITERATIONS * 9 / 10]),
        peak_rss_kib()
    );
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--child") {
        return child(&args[i + 1], &args[i + 2]).await;
    }
    let fake = cso_testenv::github::FakeGithub::start(100).await.unwrap();
    fake.publish_dir(TAG, &fixtures().join(TAG)).unwrap();
    let registry = cso_testenv::registry::Registry::start(&cso_testenv::Tools::discover().unwrap())
        .await
        .unwrap();
    registry
        .push_release_dir("kaas/cluster-stacks", TAG, &fixtures().join(TAG))
        .await
        .unwrap();
    let size: u64 = std::fs::read_dir(fixtures().join(TAG))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();

    println!(
        "fetch + verify + unpack {TAG} ({} KiB of assets), {ITERATIONS} runs per source",
        size / 1024
    );
    println!(
        "{:<8} {:>10} {:>10} {:>14}",
        "source", "median ms", "p90 ms", "peak RSS MiB"
    );
    for (kind, endpoint) in [
        ("local", "-".to_owned()),
        ("github", fake.api_url().to_owned()),
        ("oci", registry.host().to_owned()),
    ] {
        let me = std::env::current_exe().unwrap();
        let output = tokio::task::spawn_blocking(move || {
            Command::new(me)
                .args(["--child", kind, &endpoint])
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        assert!(
            output.status.success(),
            "{kind}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let line = String::from_utf8(output.stdout).unwrap();
        let fields: Vec<&str> = line.split_whitespace().collect();
        let peak_mib = fields[2].parse::<f64>().unwrap() / 1024.0;
        println!("{kind:<8} {:>10} {:>10} {peak_mib:>14.1}", fields[0], fields[1]);
    }
}
