//! Chart dependencies resolved once, when a release enters the cache: the real `docker-scs-1-35-v1` release
//! (addon stages `cni` → cilium 1.19.1 from `https://helm.cilium.io/`, `metrics-server` → metrics-server 3.13.0,
//! not vendored), published on the GitHub stand-in, its dependencies taken from a loopback HTTP chart
//! repository or the test environment's real OCI registry (charts pushed with the real `helm push`) acting as
//! `--chart-mirror`; then rendered with the real helm while the mirror is down. Failures (mirror unreachable,
//! version missing, digest wrong) name the chart, version and repository, cache nothing, and the release caches
//! once the mirror is right.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use cso_api::ReleaseId;
use cso_release::{
    CacheError, ChartMirrors, DependencyResolver, ReleaseCache,
    archive::UnpackLimits,
    deps::{ChartCredentials, FailureKind},
    source::github::{GithubConfig, GithubSource},
};
use cso_render::{ChartRenderer, Helm, RenderRequest};
use cso_testenv::{chart_repo::ChartRepo, github::FakeGithub, registry::Registry};

const TAG: &str = "docker-scs-1-35-v1";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn charts() -> PathBuf {
    repo_root().join("tests/fixtures/charts")
}

async fn published() -> FakeGithub {
    let fake = FakeGithub::start(100).await.unwrap();
    fake.publish_dir(TAG, &repo_root().join("tests/fixtures/releases-2026").join(TAG))
        .unwrap();
    fake
}

fn cache(dir: &Path, fake: &FakeGithub, mirrors: ChartMirrors) -> ReleaseCache {
    let source = GithubSource::new(GithubConfig {
        api_url: fake.api_url().parse().unwrap(),
        org: "SovereignCloudStack".into(),
        repo: "cluster-stacks".into(),
        token: None,
    })
    .unwrap();
    ReleaseCache::new(dir, Arc::new(source), UnpackLimits::default())
        .unwrap()
        .with_dependencies(DependencyResolver::new(mirrors))
}

fn id() -> ReleaseId {
    ReleaseId::parse_tag(TAG).unwrap()
}

/// Nothing of the release in the cache: neither the release nor a staging directory.
fn nothing_cached(dir: &Path) {
    let entries: Vec<String> = std::fs::read_dir(dir.join("cluster-stacks"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(entries.is_empty(), "left in the cache: {entries:?}");
}

/// Renders both stages with the real helm, offline, and checks for Cilium's and metrics-server's objects.
async fn renders_offline(cache: &ReleaseCache) {
    let release = cache.get(&id()).await.unwrap();
    let stages = release.addon_charts(UnpackLimits::default()).unwrap();
    for stage in ["cni", "metrics-server"] {
        assert!(
            stages.join(stage).join("charts").is_dir(),
            "{stage}: no charts/ in the unpacked stage"
        );
    }
    let tools = cso_testenv::Tools::discover().unwrap();
    let helm = Helm::new(tools.helm.unwrap(), Duration::from_secs(120)).unwrap();
    let render = |stage: &str| {
        helm.render(RenderRequest {
            chart: stages.join(stage),
            release_name: "cluster-addon".into(),
            namespace: "kube-system".into(),
            kube_version: Some("v1.35.1".into()),
            include_crds: true,
            ..Default::default()
        })
    };
    let cni = render("cni").await.unwrap();
    assert!(
        cni.contains("kind: DaemonSet") && cni.contains("name: cilium\n"),
        "cilium:\n{}",
        &cni[..2000.min(cni.len())]
    );
    assert!(cni.contains("name: cilium-operator"));
    let metrics = render("metrics-server").await.unwrap();
    assert!(metrics.contains("kind: Deployment") && metrics.contains("name: metrics-server"));
    assert!(metrics.contains("kind: APIService"));
}

#[tokio::test]
async fn dependencies_from_an_http_mirror_then_rendered_offline() {
    let fake = published().await;
    let mut repo = ChartRepo::start(&charts()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path(), &fake, ChartMirrors::parse(&[repo.url()]).unwrap());
    let before = cso_testenv::disk_size(&repo_root().join("tests/fixtures/releases-2026").join(TAG));

    let started = Instant::now();
    let release = cache.get(&id()).await.unwrap();
    let took = started.elapsed();
    let size = cso_testenv::disk_size(&release.dir);
    eprintln!(
        "FIGURES http mirror: {TAG} downloaded and its dependencies resolved in {took:?}; release {before} bytes as published, {size} bytes cached"
    );
    let requests = repo.requests();
    assert_eq!(
        requests.iter().filter(|r| *r == "/index.yaml").count(),
        1,
        "one index per repository per release: {requests:?}"
    );
    assert!(
        requests.contains(&"/cilium-1.19.1.tgz".to_owned())
            && requests.contains(&"/metrics-server-3.13.0.tgz".to_owned())
    );

    // Offline from here: the mirror is gone, the release renders, and a new process (a new cache on the
    // same directory) finds it complete, reading its rewritten archives through.
    repo.stop().await;
    renders_offline(&cache).await;
    let later = self::cache(dir.path(), &fake, ChartMirrors::default());
    let again = later.cached(&id()).unwrap().expect("still cached");
    again.verify_archives(UnpackLimits::default()).unwrap();
}

#[tokio::test]
async fn dependencies_from_an_oci_mirror_then_rendered_offline() {
    let tools = cso_testenv::Tools::discover().unwrap();
    let registry = Registry::start(&tools).await.unwrap();
    let helm_home = tempfile::tempdir().unwrap();
    let prefix = format!("oci://{}/mirror/charts", registry.host());
    let started = Instant::now();
    for chart in ["cilium-1.19.1.tgz", "metrics-server-3.13.0.tgz"] {
        // The real `helm push`, as a site fills its mirror.
        let output = std::process::Command::new(tools.helm.as_ref().unwrap())
            .arg("push")
            .arg(charts().join(chart))
            .arg(&prefix)
            .arg("--plain-http")
            .env("HELM_CONFIG_HOME", helm_home.path().join("config"))
            .env("HELM_CACHE_HOME", helm_home.path().join("cache"))
            .env("HELM_DATA_HOME", helm_home.path().join("data"))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "helm push {chart}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    eprintln!("helm push of both charts: {:?}", started.elapsed());

    let fake = published().await;
    let dir = tempfile::tempdir().unwrap();
    // One mapping per repository, as written in the stages' Chart.yaml.
    let mirrors = ChartMirrors::parse(&[
        format!("https://helm.cilium.io/={prefix}"),
        format!("https://kubernetes-sigs.github.io/metrics-server/={prefix}"),
    ])
    .unwrap();
    let cache = cache(dir.path(), &fake, mirrors);
    let started = Instant::now();
    let release = cache.get(&id()).await.unwrap();
    eprintln!(
        "FIGURES oci mirror: {TAG} downloaded and its dependencies resolved in {:?}; {} bytes cached",
        started.elapsed(),
        cso_testenv::disk_size(&release.dir)
    );
    drop(registry);
    renders_offline(&cache).await;
}

#[tokio::test]
async fn an_unreachable_mirror_caches_nothing_until_it_is_back() {
    let fake = published().await;
    let mut repo = ChartRepo::start(&charts()).await.unwrap();
    repo.stop().await;
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path(), &fake, ChartMirrors::parse(&[repo.url()]).unwrap());
    let error = cache.get(&id()).await.unwrap_err();
    let text = error.to_string();
    assert!(
        matches!(
            &error,
            CacheError::Dependency { error, .. } if error.kind == FailureKind::Unreachable
        ),
        "{error:?}"
    );
    assert!(
        text.contains("cilium") && text.contains("1.19.1") && text.contains(&repo.url()),
        "{text}"
    );
    nothing_cached(dir.path());
    assert!(cache.cached(&id()).unwrap().is_none());

    repo.restart().await.unwrap();
    cache.get(&id()).await.unwrap();
    assert_eq!(cache.cached_tags(), vec![TAG.to_owned()]);
}

#[tokio::test]
async fn a_missing_version_caches_nothing_until_the_mirror_has_it() {
    let fake = published().await;
    let mirror = tempfile::tempdir().unwrap();
    for chart in ["cilium-1.19.2.tgz", "metrics-server-3.13.0.tgz"] {
        std::fs::copy(charts().join(chart), mirror.path().join(chart)).unwrap();
    }
    let repo = ChartRepo::start(mirror.path()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path(), &fake, ChartMirrors::parse(&[repo.url()]).unwrap());
    let error = cache.get(&id()).await.unwrap_err().to_string();
    assert!(
        error.contains("dependency cilium 1.19.1 of chart cni")
            && error.contains("no version matches (the index has 1.19.2)")
            && error.contains(&repo.url()),
        "{error}"
    );
    nothing_cached(dir.path());

    std::fs::copy(
        charts().join("cilium-1.19.1.tgz"),
        mirror.path().join("cilium-1.19.1.tgz"),
    )
    .unwrap();
    let release = cache.get(&id()).await.unwrap();
    assert!(release.dir.is_dir());
}

#[tokio::test]
async fn a_digest_mismatch_is_refused() {
    let fake = published().await;
    let repo = ChartRepo::start(&charts()).await.unwrap();
    repo.publish_wrong_digest("metrics-server-3.13.0.tgz", &"0".repeat(64));
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path(), &fake, ChartMirrors::parse(&[repo.url()]).unwrap());
    let error = cache.get(&id()).await.unwrap_err();
    assert!(
        matches!(
            &error,
            CacheError::Dependency { error, .. } if error.kind == FailureKind::Integrity
        ),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(
        text.contains("dependency metrics-server 3.13.0 of chart metrics-server")
            && text.contains("the index says 0000"),
        "{text}"
    );
    nothing_cached(dir.path());
}

/// The release with its `cni` stage asking for `~1.19.0` instead of exactly 1.19.1.
fn with_a_version_range(dir: &Path) {
    let published = repo_root().join("tests/fixtures/releases-2026").join(TAG);
    for entry in std::fs::read_dir(&published).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    let archive = dir.join("docker-scs-1-35-cluster-addon-v1.tgz");
    let unpacked = tempfile::tempdir().unwrap();
    tar::Archive::new(flate2::read::GzDecoder::new(
        std::fs::File::open(&archive).unwrap(),
    ))
    .unpack(unpacked.path())
    .unwrap();
    let chart = unpacked.path().join("cni/Chart.yaml");
    let text = std::fs::read_to_string(&chart).unwrap();
    assert!(text.contains("version: 1.19.1"), "{text}");
    std::fs::write(&chart, text.replace("version: 1.19.1", "version: \"~1.19.0\"")).unwrap();
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        std::fs::File::create(&archive).unwrap(),
        flate2::Compression::default(),
    ));
    for stage in ["cni", "metrics-server"] {
        builder
            .append_dir_all(stage, unpacked.path().join(stage))
            .unwrap();
    }
    builder.into_inner().unwrap().finish().unwrap();
}

#[tokio::test]
async fn a_version_range_from_a_private_oci_mirror() {
    let tools = cso_testenv::Tools::discover().unwrap();
    let registry = Registry::start_with_basic_auth(&tools, "mirror", "s3cret")
        .await
        .unwrap();
    let helm_home = tempfile::tempdir().unwrap();
    let prefix = format!("{}/mirror/charts", registry.host());
    for chart in [
        "cilium-1.19.1.tgz",
        "cilium-1.19.2.tgz",
        "metrics-server-3.13.0.tgz",
    ] {
        let output = std::process::Command::new(tools.helm.as_ref().unwrap())
            .arg("push")
            .arg(charts().join(chart))
            .arg(format!("oci://{prefix}"))
            .args(["--plain-http", "--username=mirror", "--password=s3cret"])
            .env("HELM_CONFIG_HOME", helm_home.path().join("config"))
            .env("HELM_CACHE_HOME", helm_home.path().join("cache"))
            .env("HELM_DATA_HOME", helm_home.path().join("data"))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "helm push {chart}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let release = tempfile::tempdir().unwrap();
    with_a_version_range(release.path());
    let fake = FakeGithub::start(100).await.unwrap();
    fake.publish_dir(TAG, release.path()).unwrap();

    // A wrong password: refused, named, and the password is not in the message.
    let dir = tempfile::tempdir().unwrap();
    let wrong = cache(
        dir.path(),
        &fake,
        ChartMirrors::all(format!("oci://mirror:wrong@{prefix}")),
    );
    let error = wrong.get(&id()).await.unwrap_err().to_string();
    assert!(
        error.contains("dependency cilium ~1.19.0 of chart cni"),
        "{error}"
    );
    assert!(!error.contains("wrong"), "the password leaked: {error}");
    nothing_cached(dir.path());

    // The right one: the highest 1.19 patch, as Helm picks it.
    let right = cache(
        dir.path(),
        &fake,
        ChartMirrors::all(format!("oci://mirror:s3cret@{prefix}")),
    );
    let cached = right.get(&id()).await.unwrap();
    let stages = cached.addon_charts(UnpackLimits::default()).unwrap();
    assert!(stages.join("cni/charts/cilium-1.19.2.tgz").is_file());
    assert!(
        stages
            .join("metrics-server/charts/metrics-server-3.13.0.tgz")
            .is_file()
    );
}

#[tokio::test]
async fn a_release_cached_without_its_dependencies_is_fetched_again() {
    // What a cso that did not resolve dependencies left: the release as published, its addon archive
    // unpacked beside it for a render that failed.
    let fake = published().await;
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("cluster-stacks").join(TAG);
    cso_release::release::copy_release_dir(&repo_root().join("tests/fixtures/releases-2026").join(TAG), &old)
        .unwrap();
    let repo = ChartRepo::start(&charts()).await.unwrap();
    let cache = cache(dir.path(), &fake, ChartMirrors::all(repo.url()));
    let stale = cache.cached(&id()).unwrap();
    assert!(
        stale.is_none(),
        "a release without its dependencies is not taken from the cache"
    );
    let release = cache.get(&id()).await.unwrap();
    let stages = release.addon_charts(UnpackLimits::default()).unwrap();
    assert!(stages.join("cni/charts/cilium-1.19.1.tgz").is_file());
    assert!(cache.cached(&id()).unwrap().is_some());
    let left: Vec<String> = std::fs::read_dir(dir.path().join("cluster-stacks"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, vec![TAG.to_owned()], "the replaced copy is gone");
}

/// A Docker config (`docker login`, a `kubernetes.io/dockerconfigjson` Secret) with basic credentials for
/// `host`.
fn docker_config(host: &str, user: &str, password: &str) -> String {
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    serde_json::json!({"auths": {host: {"auth": auth}}}).to_string()
}

#[tokio::test]
async fn a_private_oci_mirror_with_credentials_from_a_registry_config_file() {
    let tools = cso_testenv::Tools::discover().unwrap();
    let registry = Registry::start_with_basic_auth(&tools, "mirror", "c0nfig-pass")
        .await
        .unwrap();
    let helm_home = tempfile::tempdir().unwrap();
    let prefix = format!("oci://{}/private/charts", registry.host());
    for chart in ["cilium-1.19.1.tgz", "metrics-server-3.13.0.tgz"] {
        let output = std::process::Command::new(tools.helm.as_ref().unwrap())
            .arg("push")
            .arg(charts().join(chart))
            .arg(&prefix)
            .args(["--plain-http", "--username=mirror", "--password=c0nfig-pass"])
            .env("HELM_CONFIG_HOME", helm_home.path().join("config"))
            .env("HELM_CACHE_HOME", helm_home.path().join("cache"))
            .env("HELM_DATA_HOME", helm_home.path().join("data"))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "helm push {chart}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let fake = published().await;
    let configs = tempfile::tempdir().unwrap();
    // `REGISTRY_AUTH_FILE` (podman's) names no entry for the mirror; `docker login` wrote the wrong password
    // in a later file; the first file with an entry for the host wins, as in the tools.
    let auth_file = configs.path().join("auth.json");
    std::fs::write(&auth_file, docker_config("other.example", "u", "p")).unwrap();
    let docker = configs.path().join("docker-config.json");
    std::fs::write(&docker, docker_config(registry.host(), "mirror", "wr0ng-pass")).unwrap();
    let helm = configs.path().join("helm-registry-config.json");
    std::fs::write(&helm, docker_config(registry.host(), "mirror", "c0nfig-pass")).unwrap();
    let resolver = |files: Vec<std::path::PathBuf>| {
        DependencyResolver::new(ChartMirrors::all(prefix.clone())).with_registry_configs(files)
    };

    let dir = tempfile::tempdir().unwrap();
    let wrong = cache(dir.path(), &fake, ChartMirrors::default()).with_dependencies(resolver(vec![
        auth_file.clone(),
        docker.clone(),
        helm.clone(),
    ]));
    let error = wrong.get(&id()).await.unwrap_err().to_string();
    assert!(error.contains("dependency cilium 1.19.1 of chart cni"), "{error}");
    assert!(
        !error.contains("wr0ng-pass") && !error.contains("c0nfig-pass"),
        "a password leaked: {error}"
    );
    nothing_cached(dir.path());

    let right =
        cache(dir.path(), &fake, ChartMirrors::default()).with_dependencies(resolver(vec![auth_file, helm]));
    let release = right.get(&id()).await.unwrap();
    let stages = release.addon_charts(UnpackLimits::default()).unwrap();
    assert!(stages.join("cni/charts/cilium-1.19.1.tgz").is_file());
}

#[tokio::test]
async fn a_private_http_mirror_with_credentials_by_host() {
    let mut repo = ChartRepo::start_with_basic_auth(&charts(), "mirror", "s3cret-http")
        .await
        .unwrap();
    let fake = published().await;
    let host = repo
        .url()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let dir = tempfile::tempdir().unwrap();

    // No credentials: 401, named, nothing cached.
    let resolver = DependencyResolver::new(ChartMirrors::all(repo.url()));
    let anonymous = cache(dir.path(), &fake, ChartMirrors::default()).with_dependencies(resolver.clone());
    let error = anonymous.get(&id()).await.unwrap_err().to_string();
    assert!(
        error.contains("dependency cilium 1.19.1 of chart cni") && error.contains("401"),
        "{error}"
    );
    nothing_cached(dir.path());

    // A wrong password from a dockerconfigjson (as in a Secret): refused, and not in the message.
    let wrong = ChartCredentials::from_docker_config(docker_config(&host, "mirror", "wr0ng-http").as_bytes())
        .unwrap();
    resolver.set_credentials(wrong);
    let error = anonymous.get(&id()).await.unwrap_err().to_string();
    assert!(error.contains("401"), "{error}");
    assert!(!error.contains("wr0ng-http"), "the password leaked: {error}");
    nothing_cached(dir.path());

    // The right one, set on the resolver the cache already holds (a Secret that changed): cached, and the
    // credentials went to the mirror with every request (the index and both charts).
    let right = ChartCredentials::from_docker_config(
        docker_config(&format!("http://{host}/"), "mirror", "s3cret-http").as_bytes(),
    )
    .unwrap();
    resolver.set_credentials(right);
    let release = anonymous.get(&id()).await.unwrap();
    let stages = release.addon_charts(UnpackLimits::default()).unwrap();
    assert!(
        stages
            .join("metrics-server/charts/metrics-server-3.13.0.tgz")
            .is_file()
    );
    repo.stop().await;
}
