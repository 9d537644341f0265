//! Chart dependencies, resolved once, when a release enters the cache.
//!
//! The stacks publish addon stages (and may publish charts) whose `Chart.yaml` lists `dependencies` on remote
//! repositories without vendoring them (no `charts/`, no `Chart.lock`). cso renders with `helm template`
//! offline, so the dependencies are fetched here, while the release is still in its staging directory:
//! every chart directory at the top of the release's archives (the cluster-class chart, the addon chart or
//! every stage of the addon archive) whose dependency has no `charts/<name>-<version>.tgz` (nor
//! `charts/<name>/`; any version counts, as in Helm's own check) gets one. The
//! archive is rewritten with the fetched charts added under `<chart>/charts/`, so the cached release is
//! self-contained: it is read through and verified like any other at every start, unpacked for rendering as
//! before, and never needs the network again. The Go operator instead runs `helm template
//! --dependency-update` at every render, which needs the repositories on every reconcile.
//!
//! Sources: HTTP(S) chart repositories (`<repo>/index.yaml`; the highest version matching the constraint, as
//! Helm picks it; the archive's sha256 checked against the index's `digest`, which is therefore required;
//! `urls[0]` resolved relative to the repository) and `oci://` registries (`<prefix>/<name>:<version>`, the
//! layer `application/vnd.cncf.helm.chart.content.v1.tar+gzip`, its digest checked). [`ChartMirrors`]
//! (`--chart-mirror`) sends every dependency, or those of one repository, to a mirror instead. Basic
//! credentials, first found wins: the repository's or mirror's URL (`https://user:password@host/...`);
//! [`ChartCredentials`] by host (`--chart-mirror-credentials`: a `kubernetes.io/dockerconfigjson` Secret,
//! for HTTP(S) repositories and OCI registries alike); for OCI registries, the usual registry config files
//! ([`default_registry_configs`]: `REGISTRY_AUTH_FILE`, `docker login`, `helm registry login`). Credentials
//! are never written into errors, logs or `Debug` output, and are sent only to the host they are for.
//!
//! Any dependency that cannot be had fails the whole release with an error naming the chart, the
//! version, the repository and the reason; the cache then drops the staging directory, so nothing is
//! half-cached, and the controllers retry with backoff.

use std::{
    collections::{BTreeMap, HashMap},
    fs::File,
    io::{BufReader, BufWriter, Read},
    path::{Component, Path, PathBuf},
    sync::{Arc, RwLock},
    time::Duration,
};

use flate2::{Compression, read::GzDecoder, write::GzEncoder};
use oci_client::{
    Client, Reference,
    client::{ClientConfig, ClientProtocol},
    secrets::RegistryAuth,
};
use sha2::{Digest, Sha256};
use url::Url;

use crate::{
    Release,
    archive::{self, UnpackLimits},
};

/// The layer media type of a Helm chart pushed to an OCI registry.
pub const HELM_CHART_LAYER_MEDIA_TYPE: &str = "application/vnd.cncf.helm.chart.content.v1.tar+gzip";
/// The largest `index.yaml` read (Cilium's real index is a few MiB).
const MAX_INDEX_BYTES: usize = 64 << 20;
/// The largest chart archive fetched.
const MAX_CHART_BYTES: usize = 32 << 20;

/// Where dependencies come from instead of the repositories their `Chart.yaml` names (`--chart-mirror`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChartMirrors {
    /// `--chart-mirror=URL`: every repository not mapped below.
    all: Option<String>,
    /// `--chart-mirror=FROM=URL`: (FROM as written in `Chart.yaml`, URL).
    by_repository: Vec<(String, String)>,
}

impl ChartMirrors {
    /// Reads `--chart-mirror` values: `URL` (an HTTP(S) chart repository or an `oci://` prefix) or
    /// `FROM=URL`. A value is a mapping when both sides of its first `=` are URLs, so a mirror URL with a
    /// `=` in its query still works as a plain mirror.
    pub fn parse<S: AsRef<str>>(values: &[S]) -> Result<Self, String> {
        let mut mirrors = ChartMirrors::default();
        for value in values {
            let value = value.as_ref().trim();
            let (from, to) = match value.split_once('=') {
                Some((from, to)) if from.contains("://") && to.contains("://") => (Some(from), to),
                _ => (None, value),
            };
            check_repository_url(to).map_err(|e| format!("--chart-mirror {:?}: {e}", redact(value)))?;
            match from {
                Some(from) => mirrors.by_repository.push((from.to_owned(), to.to_owned())),
                None if mirrors.all.is_some() => {
                    return Err(
                        "--chart-mirror=URL given twice: one mirror for all, FROM=URL for the others".into(),
                    );
                }
                None => mirrors.all = Some(to.to_owned()),
            }
        }
        Ok(mirrors)
    }

    /// Every dependency from `url`.
    pub fn all(url: impl Into<String>) -> Self {
        ChartMirrors {
            all: Some(url.into()),
            by_repository: Vec::new(),
        }
    }

    /// Where to fetch from for `repository` (as written in `Chart.yaml`). Mappings are compared without a
    /// trailing slash, as `https://helm.cilium.io` and `https://helm.cilium.io/` are the same repository.
    pub fn repository_for<'a>(&'a self, repository: &'a str) -> &'a str {
        let norm = |s: &str| s.trim_end_matches('/').to_owned();
        self.by_repository
            .iter()
            .find(|(from, _)| norm(from) == norm(repository))
            .map(|(_, to)| to.as_str())
            .or(self.all.as_deref())
            .unwrap_or(repository)
    }
}

fn check_repository_url(text: &str) -> Result<(), String> {
    let url = Url::parse(text).map_err(|e| format!("not a URL: {e}"))?;
    match url.scheme() {
        "http" | "https" | "oci" if url.host_str().is_some() => Ok(()),
        other => Err(format!(
            "a chart repository is http://, https:// or oci://host/..., not {other}:"
        )),
    }
}

/// `text` with the password of a URL in it hidden.
fn redact(text: &str) -> String {
    match Url::parse(text) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("***"));
            url.to_string()
        }
        _ => text.to_owned(),
    }
}

/// A dependency that could not be had: names the chart that needs it, the dependency, its version and the
/// repository it was asked from.
#[derive(Debug, thiserror::Error)]
#[error("dependency {name} {version} of chart {chart} from {repository}: {reason}")]
pub struct DependencyError {
    /// The chart directory that declares the dependency (`cni`, or the chart in an archive).
    pub chart: String,
    pub name: String,
    pub version: String,
    /// The repository asked (a mirror, when one applies; its password hidden).
    pub repository: String,
    pub reason: String,
    pub kind: FailureKind,
}

/// What kind of failure, for the cache's error kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The repository could not be reached or answered with an error.
    Unreachable,
    /// The repository has no such chart or no version matching the constraint.
    NotFound,
    /// The archive does not match its digest, or is not a chart.
    Integrity,
    /// The dependency itself cannot be fetched as written (no repository, a `file://` path, a bad constraint).
    Invalid,
    /// Reading or rewriting the release's files.
    Io,
}

/// What resolving a release's dependencies did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// (chart directory, `<name>-<version>.tgz`) added.
    pub added: Vec<(String, String)>,
    /// Bytes of chart archives fetched.
    pub bytes: u64,
}

/// Basic credentials for chart repositories and registries, by host (`host` or `host:port`, as in a Docker
/// config's `auths`). `Debug` shows the hosts only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ChartCredentials {
    by_host: BTreeMap<String, (String, String)>,
}

impl std::fmt::Debug for ChartCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChartCredentials")
            .field("hosts", &self.hosts())
            .finish()
    }
}

impl ChartCredentials {
    /// Reads a Docker config (`.dockerconfigjson` of a `kubernetes.io/dockerconfigjson` Secret,
    /// `~/.docker/config.json`): every `auths` entry with `auth` (base64 `user:password`) or
    /// `username`/`password`. Keys may be `host`, `host:port` or a URL (`https://host/v1/`); entries without
    /// inline credentials (credential helpers) are skipped. Errors never quote the text.
    pub fn from_docker_config(text: &[u8]) -> Result<Self, String> {
        let config: serde_json::Value = serde_json::from_slice(text)
            .map_err(|e| format!("not a Docker config (JSON): line {}", e.line()))?;
        let auths = config
            .get("auths")
            .and_then(|a| a.as_object())
            .ok_or("not a Docker config: no \"auths\" map")?;
        let mut credentials = ChartCredentials::default();
        for (key, entry) in auths {
            if let Some((user, password)) = basic_of_entry(entry) {
                credentials.insert(key, user, password);
            }
        }
        Ok(credentials)
    }

    /// Adds credentials for `host` (`host`, `host:port` or a URL; compared without scheme, path and case).
    pub fn insert(&mut self, host: &str, user: impl Into<String>, password: impl Into<String>) {
        self.by_host
            .insert(host_of_key(host), (user.into(), password.into()));
    }

    /// The credentials for `host` (`host` or `host:port`).
    pub fn for_host(&self, host: &str) -> Option<(&str, &str)> {
        self.by_host
            .get(&host.to_ascii_lowercase())
            .map(|(u, p)| (u.as_str(), p.as_str()))
    }

    /// The hosts credentials are known for (what may be logged).
    pub fn hosts(&self) -> Vec<&str> {
        self.by_host.keys().map(String::as_str).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.by_host.is_empty()
    }
}

/// A Docker config key as a host: `https://Registry.example:5000/v1/` → `registry.example:5000`.
fn host_of_key(key: &str) -> String {
    let key = key.trim();
    let without_scheme = key.split_once("://").map_or(key, |(_, rest)| rest);
    without_scheme
        .split('/')
        .next()
        .unwrap_or_default()
        .rsplit('@')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase()
}

/// `host` or `host:port` of `url`, as credentials are keyed (the port only when the URL names one).
fn host_of_url(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
    match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host,
    }
}

/// The registry config files read for the credentials of OCI registries, in order (the first that has an
/// entry for the host wins): `$REGISTRY_AUTH_FILE` (podman, skopeo, buildah), `$DOCKER_CONFIG/config.json`,
/// `~/.docker/config.json` (`docker login`), `$HELM_REGISTRY_CONFIG`, else Helm's
/// `$XDG_CONFIG_HOME/helm/registry/config.json` or `~/.config/helm/registry/config.json` (`helm registry
/// login`). In a pod, a `kubernetes.io/dockerconfigjson` Secret can be mounted at one of them.
pub fn default_registry_configs() -> Vec<PathBuf> {
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let home = var("HOME");
    let helm = var("HELM_REGISTRY_CONFIG").or_else(|| {
        var("XDG_CONFIG_HOME")
            .or_else(|| home.as_ref().map(|h| h.join(".config")))
            .map(|c| c.join("helm/registry/config.json"))
    });
    [
        var("REGISTRY_AUTH_FILE"),
        var("DOCKER_CONFIG").map(|d| d.join("config.json")),
        home.as_ref().map(|h| h.join(".docker/config.json")),
        helm,
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Fetches chart dependencies. Cheap to clone; clones share their [`ChartCredentials`].
#[derive(Clone, Debug)]
pub struct DependencyResolver {
    mirrors: ChartMirrors,
    http: reqwest::Client,
    /// From `--chart-mirror-credentials`, replaced when its Secret changes.
    credentials: Arc<RwLock<ChartCredentials>>,
    /// Registry config files for OCI credentials (read at each fetch, so a later `docker login` counts).
    registry_configs: Vec<PathBuf>,
}

/// One `dependencies` entry of a `Chart.yaml`.
#[derive(Clone, Debug, serde::Deserialize)]
struct Dependency {
    name: String,
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    repository: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
struct ChartFile {
    #[serde(default)]
    dependencies: Option<Vec<Dependency>>,
}

/// What one archive needs: per top-level chart directory, the dependencies missing from its `charts/`.
#[derive(Debug, Default)]
struct Needs {
    /// (chart directory, dependency)
    missing: Vec<(String, Dependency)>,
    /// Chart directories that already have a `charts/` directory entry.
    has_charts_dir: Vec<String>,
}

#[derive(Debug, serde::Deserialize)]
struct Index {
    #[serde(default)]
    entries: HashMap<String, Vec<IndexEntry>>,
}

#[derive(Clone, Debug, serde::Deserialize)]
struct IndexEntry {
    version: String,
    #[serde(default)]
    digest: Option<String>,
    #[serde(default)]
    urls: Vec<String>,
}

/// A fetched chart: its file name under `charts/` and its bytes.
struct Fetched {
    file: String,
    data: Vec<u8>,
}

impl Default for DependencyResolver {
    fn default() -> Self {
        Self::new(ChartMirrors::default())
    }
}

impl DependencyResolver {
    pub fn new(mirrors: ChartMirrors) -> Self {
        crate::source::install_crypto_provider();
        let http = reqwest::Client::builder()
            .user_agent(concat!("cso/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap_or_default();
        DependencyResolver {
            mirrors,
            http,
            credentials: Arc::default(),
            registry_configs: default_registry_configs(),
        }
    }

    pub fn mirrors(&self) -> &ChartMirrors {
        &self.mirrors
    }

    /// Reads OCI credentials from `files` instead of [`default_registry_configs`].
    pub fn with_registry_configs(mut self, files: Vec<PathBuf>) -> Self {
        self.registry_configs = files;
        self
    }

    /// Uses `credentials` from now on, in this resolver and all its clones (the cache's included).
    pub fn set_credentials(&self, credentials: ChartCredentials) {
        *self.credentials.write().unwrap_or_else(|p| p.into_inner()) = credentials;
    }

    fn credentials_for(&self, host: &str) -> Option<(String, String)> {
        self.credentials
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .for_host(host)
            .map(|(u, p)| (u.to_owned(), p.to_owned()))
    }

    /// Adds every missing dependency to the archives of `release` (in its directory, which must be the
    /// staging directory: the archives are rewritten). The archives must have been verified already. On
    /// error the archives may be half-rewritten: the caller throws the directory away.
    pub async fn resolve(
        &self,
        release: &Release,
        limits: UnpackLimits,
    ) -> Result<Resolved, DependencyError> {
        let mut resolved = Resolved::default();
        // One index per repository per release: the stages of a release share repositories.
        let mut indexes: HashMap<String, Index> = HashMap::new();
        for archive_path in [&release.cluster_class_chart, &release.cluster_addon_archive] {
            let path = archive_path.clone();
            let needs = tokio::task::spawn_blocking(move || scan(&path))
                .await
                .map_err(|e| io_error(archive_path, std::io::Error::other(e)))?
                .map_err(|e| io_error(archive_path, e))?;
            if needs.missing.is_empty() {
                continue;
            }
            let mut additions: Vec<(String, Fetched)> = Vec::new();
            for (chart, dependency) in &needs.missing {
                let fetched = self.fetch(chart, dependency, &mut indexes, limits).await?;
                resolved.bytes += fetched.data.len() as u64;
                resolved.added.push((chart.clone(), fetched.file.clone()));
                tracing::info!(chart = %chart, dependency = %fetched.file, "chart dependency fetched");
                additions.push((chart.clone(), fetched));
            }
            let path = archive_path.clone();
            let has_charts_dir = needs.has_charts_dir;
            tokio::task::spawn_blocking(move || rewrite(&path, &additions, &has_charts_dir))
                .await
                .map_err(|e| io_error(archive_path, std::io::Error::other(e)))?
                .map_err(|e| io_error(archive_path, e))?;
        }
        Ok(resolved)
    }

    async fn fetch(
        &self,
        chart: &str,
        dependency: &Dependency,
        indexes: &mut HashMap<String, Index>,
        limits: UnpackLimits,
    ) -> Result<Fetched, DependencyError> {
        let written = dependency.repository.clone().unwrap_or_default();
        let version = dependency.version.clone().unwrap_or_else(|| "*".to_owned());
        let repository = if written.is_empty() {
            // No repository: Helm expects the chart in charts/ already; a mirror for all can still serve it.
            self.mirrors.all.clone().unwrap_or_default()
        } else {
            self.mirrors.repository_for(&written).to_owned()
        };
        let fail = |kind, reason: String| DependencyError {
            chart: chart.to_owned(),
            name: dependency.name.clone(),
            version: version.clone(),
            repository: redact(if repository.is_empty() {
                &written
            } else {
                &repository
            }),
            reason,
            kind,
        };
        let constraint = Constraint::parse(&version).map_err(|e| fail(FailureKind::Invalid, e))?;
        if repository.is_empty() {
            return Err(fail(
                FailureKind::Invalid,
                "no repository, and the chart is not in charts/".into(),
            ));
        }
        let fetched = if let Some(rest) = repository.strip_prefix("oci://") {
            self.fetch_oci(rest, &dependency.name, &constraint, &fail).await?
        } else if repository.starts_with("http://") || repository.starts_with("https://") {
            self.fetch_http(&repository, &dependency.name, &constraint, indexes, &fail)
                .await?
        } else {
            return Err(fail(
                FailureKind::Invalid,
                "only http(s):// and oci:// repositories can be fetched (file:// and repository aliases must be vendored in charts/, or mirrored)".into(),
            ));
        };
        check_chart_archive(&fetched.data, limits).map_err(|e| fail(FailureKind::Integrity, e))?;
        Ok(fetched)
    }

    async fn fetch_http(
        &self,
        repository: &str,
        name: &str,
        constraint: &Constraint,
        indexes: &mut HashMap<String, Index>,
        fail: &impl Fn(FailureKind, String) -> DependencyError,
    ) -> Result<Fetched, DependencyError> {
        // `index.yaml` and relative chart URLs are below the repository, trailing slash or not.
        let base = Url::parse(&format!("{}/", repository.trim_end_matches('/')))
            .map_err(|e| fail(FailureKind::Invalid, format!("not a URL: {e}")))?;
        if !indexes.contains_key(repository) {
            let url = base
                .join("index.yaml")
                .map_err(|e| fail(FailureKind::Invalid, e.to_string()))?;
            let text = self
                .get(&url, MAX_INDEX_BYTES)
                .await
                .map_err(|(kind, e)| fail(kind, e))?;
            let index: Index = serde_saphyr::from_slice(&text).map_err(|e| {
                fail(
                    FailureKind::Unreachable,
                    format!("index.yaml is not a chart index: {e}"),
                )
            })?;
            indexes.insert(repository.to_owned(), index);
        }
        let entries = indexes
            .get(repository)
            .and_then(|index| index.entries.get(name))
            .ok_or_else(|| {
                fail(
                    FailureKind::NotFound,
                    "the repository's index.yaml has no such chart".into(),
                )
            })?;
        let (version, entry) = best_match(
            entries
                .iter()
                .filter_map(|e| Some((Version::parse(&e.version).ok()?, e))),
            constraint,
        )
        .ok_or_else(|| {
            let mut available: Vec<&str> = entries.iter().map(|e| e.version.as_str()).collect();
            available.truncate(10);
            fail(
                FailureKind::NotFound,
                format!("no version matches (the index has {})", available.join(", ")),
            )
        })?;
        let digest = entry.digest.as_deref().filter(|d| !d.is_empty()).ok_or_else(|| {
            fail(
                FailureKind::Integrity,
                format!(
                    "the index has no digest for version {}, so it cannot be verified",
                    entry.version
                ),
            )
        })?;
        let first = entry.urls.first().ok_or_else(|| {
            fail(
                FailureKind::NotFound,
                format!("the index has no URL for version {}", entry.version),
            )
        })?;
        let url = base
            .join(first)
            .map_err(|e| fail(FailureKind::Invalid, format!("chart URL {first:?}: {e}")))?;
        let data = self
            .get(&url, MAX_CHART_BYTES)
            .await
            .map_err(|(kind, e)| fail(kind, e))?;
        let actual = hex::encode(Sha256::digest(&data));
        let wanted = digest.trim_start_matches("sha256:").to_ascii_lowercase();
        if actual != wanted {
            return Err(fail(
                FailureKind::Integrity,
                format!(
                    "{} has sha256 {actual}, the index says {wanted}",
                    redact(url.as_str())
                ),
            ));
        }
        Ok(Fetched {
            file: format!("{name}-{version}.tgz"),
            data,
        })
    }

    /// GET `url`, at most `limit` bytes; basic credentials from the URL's userinfo, else those of its host.
    async fn get(&self, url: &Url, limit: usize) -> Result<Vec<u8>, (FailureKind, String)> {
        let shown = redact(url.as_str());
        let mut plain = url.clone();
        let _ = plain.set_username("");
        let _ = plain.set_password(None);
        let mut request = self.http.get(plain);
        if !url.username().is_empty() {
            let password = url.password().map(percent_decode);
            request = request.basic_auth(percent_decode(url.username()), password);
        } else if let Some((user, password)) = self.credentials_for(&host_of_url(url)) {
            request = request.basic_auth(user, Some(password));
        }
        let mut response = request
            .send()
            .await
            .map_err(|e| (FailureKind::Unreachable, format!("{shown}: {}", error_chain(&e))))?;
        let status = response.status();
        if !status.is_success() {
            let kind = if status == reqwest::StatusCode::NOT_FOUND {
                FailureKind::NotFound
            } else {
                FailureKind::Unreachable
            };
            return Err((kind, format!("{shown} answered {status}")));
        }
        let mut data = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| (FailureKind::Unreachable, format!("{shown}: {}", error_chain(&e))))?
        {
            if data.len() + chunk.len() > limit {
                return Err((
                    FailureKind::Integrity,
                    format!("{shown} is larger than {limit} bytes"),
                ));
            }
            data.extend_from_slice(&chunk);
        }
        Ok(data)
    }

    async fn fetch_oci(
        &self,
        prefix: &str,
        name: &str,
        constraint: &Constraint,
        fail: &impl Fn(FailureKind, String) -> DependencyError,
    ) -> Result<Fetched, DependencyError> {
        // `oci://user:password@host/path`: the userinfo is the registry's basic credentials.
        let url = Url::parse(&format!("oci://{prefix}"))
            .map_err(|e| fail(FailureKind::Invalid, format!("not a URL: {e}")))?;
        let host = host_of_url(&url);
        let auth = if !url.username().is_empty() {
            RegistryAuth::Basic(
                percent_decode(url.username()),
                url.password().map(percent_decode).unwrap_or_default(),
            )
        } else if let Some((user, password)) = self.credentials_for(&host) {
            RegistryAuth::Basic(user, password)
        } else {
            registry_config_auth(&self.registry_configs, &host).unwrap_or(RegistryAuth::Anonymous)
        };
        let path = url.path().trim_matches('/');
        let repository = if path.is_empty() {
            format!("{host}/{name}")
        } else {
            format!("{host}/{path}/{name}")
        };
        // Registries on loopback speak plain HTTP, as Docker and Helm assume for localhost.
        let loopback = matches!(url.host_str(), Some("localhost" | "[::1]" | "::1"))
            || url.host_str().is_some_and(|h| h.starts_with("127."));
        let client = Client::new(ClientConfig {
            protocol: if loopback {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            ..Default::default()
        });
        let oci_error = |e: oci_client::errors::OciDistributionError| {
            use oci_client::errors::OciDistributionError as E;
            match &e {
                E::ImageManifestNotFoundError(_) | E::ServerError { code: 404, .. } => {
                    (FailureKind::NotFound, e.to_string())
                }
                E::RegistryError { envelope, .. }
                    if envelope.errors.iter().any(|x| {
                        matches!(
                            x.code,
                            oci_client::errors::OciErrorCode::ManifestUnknown
                                | oci_client::errors::OciErrorCode::NameUnknown
                        )
                    }) =>
                {
                    (FailureKind::NotFound, e.to_string())
                }
                E::DigestError(_) | E::SpecViolationError(_) => (FailureKind::Integrity, e.to_string()),
                _ => (FailureKind::Unreachable, e.to_string()),
            }
        };
        let tag = match constraint.exact() {
            Some(version) => version,
            None => {
                let reference: Reference = repository
                    .parse()
                    .map_err(|e| fail(FailureKind::Invalid, format!("OCI reference {repository:?}: {e}")))?;
                let tags = client
                    .list_tags(&reference, &auth, None, None)
                    .await
                    .map_err(|e| {
                        let (kind, reason) = oci_error(e);
                        fail(kind, reason)
                    })?;
                // Helm writes `+` of a version as `_` in a tag.
                let (version, _) = best_match(
                    tags.tags
                        .iter()
                        .filter_map(|t| Some((Version::parse(&t.replace('_', "+")).ok()?, t))),
                    constraint,
                )
                .ok_or_else(|| fail(FailureKind::NotFound, format!("no tag of {repository} matches")))?;
                version.to_string()
            }
        };
        let reference: Reference = format!("{repository}:{}", tag.replace('+', "_"))
            .parse()
            .map_err(|e| fail(FailureKind::Invalid, format!("OCI reference: {e}")))?;
        let (manifest, _) = client.pull_image_manifest(&reference, &auth).await.map_err(|e| {
            let (kind, reason) = oci_error(e);
            fail(kind, reason)
        })?;
        let layer = manifest
            .layers
            .iter()
            .find(|l| l.media_type == HELM_CHART_LAYER_MEDIA_TYPE)
            .ok_or_else(|| {
                fail(
                    FailureKind::Integrity,
                    format!("{} has no {HELM_CHART_LAYER_MEDIA_TYPE} layer", reference.whole()),
                )
            })?;
        if layer.size < 0 || layer.size as usize > MAX_CHART_BYTES {
            return Err(fail(
                FailureKind::Integrity,
                format!("the chart layer of {} has size {}", reference.whole(), layer.size),
            ));
        }
        let mut data = Vec::new();
        client
            .pull_blob(&reference, layer, &mut data)
            .await
            .map_err(|e| {
                let (kind, reason) = oci_error(e);
                fail(kind, reason)
            })?;
        // Checked here too, whatever the client library does: the digest is what makes a mirror trustworthy.
        let actual = format!("sha256:{}", hex::encode(Sha256::digest(&data)));
        if actual != layer.digest {
            return Err(fail(
                FailureKind::Integrity,
                format!(
                    "the chart layer of {} has digest {actual}, the manifest says {}",
                    reference.whole(),
                    layer.digest
                ),
            ));
        }
        Ok(Fetched {
            file: format!("{name}-{tag}.tgz"),
            data,
        })
    }
}

/// The dependencies the charts of `release` declare and do not carry, as (chart directory, dependency
/// name): what [`DependencyResolver::resolve`] would fetch. Blocking: reads the archives.
pub fn missing(release: &Release) -> std::io::Result<Vec<(String, String)>> {
    let mut missing = Vec::new();
    for archive in [&release.cluster_class_chart, &release.cluster_addon_archive] {
        for (chart, dependency) in scan(archive)?.missing {
            missing.push((chart, dependency.name));
        }
    }
    Ok(missing)
}

/// Basic credentials for `host` from the first of `files` that has them (see [`default_registry_configs`]).
/// Only inline `auths` entries; credential helpers (`credsStore`) are not run.
fn registry_config_auth(files: &[PathBuf], host: &str) -> Option<RegistryAuth> {
    files
        .iter()
        .filter_map(|file| std::fs::read_to_string(file).ok())
        .find_map(|text| auth_from_config(&text, host))
}

fn auth_from_config(text: &str, host: &str) -> Option<RegistryAuth> {
    let credentials = ChartCredentials::from_docker_config(text.as_bytes()).ok()?;
    let (user, password) = credentials.for_host(host)?;
    Some(RegistryAuth::Basic(user.to_owned(), password.to_owned()))
}

/// The inline credentials of one `auths` entry: `auth` (base64 `user:password`), else `username` and
/// `password`.
fn basic_of_entry(entry: &serde_json::Value) -> Option<(String, String)> {
    use base64::Engine as _;
    if let Some(auth) = entry
        .get("auth")
        .and_then(|a| a.as_str())
        .filter(|a| !a.is_empty())
    {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .ok()?;
        let text = String::from_utf8(decoded).ok()?;
        let (user, password) = text.split_once(':')?;
        return Some((user.to_owned(), password.to_owned()));
    }
    let user = entry.get("username")?.as_str()?;
    let password = entry.get("password")?.as_str()?;
    Some((user.to_owned(), password.to_owned()))
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&text[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

fn io_error(path: &Path, error: std::io::Error) -> DependencyError {
    DependencyError {
        chart: path.display().to_string(),
        name: String::new(),
        version: String::new(),
        repository: String::new(),
        reason: error.to_string(),
        kind: FailureKind::Io,
    }
}

/// A fetched archive must be one chart directory, within the unpack limits, like any chart of a release.
fn check_chart_archive(data: &[u8], limits: UnpackLimits) -> Result<(), String> {
    let mut file = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
    std::io::Write::write_all(&mut file, data).map_err(|e| e.to_string())?;
    let unpacked =
        archive::inspect(file.path(), limits).map_err(|e| format!("not a usable chart archive: {e}"))?;
    if unpacked.top_level.len() != 1 {
        return Err(format!(
            "a chart archive holds one chart directory, this one {:?}",
            unpacked.top_level
        ));
    }
    Ok(())
}

/// Reads an (already verified) archive: the `Chart.yaml` and `charts/` of every top-level directory.
fn scan(archive: &Path) -> std::io::Result<Needs> {
    let mut charts: BTreeMap<String, (Option<ChartFile>, Vec<String>, bool)> = BTreeMap::new();
    let mut tar = tar::Archive::new(GzDecoder::new(BufReader::new(File::open(archive)?)));
    for entry in tar.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let parts: Vec<String> = path
            .components()
            .filter_map(|c| match c {
                Component::Normal(p) => Some(p.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        match parts.as_slice() {
            [top, file] if file == "Chart.yaml" => {
                let mut text = String::new();
                entry.read_to_string(&mut text)?;
                let chart: ChartFile = serde_saphyr::from_str(&text).map_err(|e| {
                    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{top}/Chart.yaml: {e}"))
                })?;
                charts.entry(top.clone()).or_default().0 = Some(chart);
            }
            [top, dir] if dir == "charts" => charts.entry(top.clone()).or_default().2 = true,
            [top, dir, file, ..] if dir == "charts" => {
                let slot = charts.entry(top.clone()).or_default();
                slot.2 = true;
                slot.1.push(file.clone());
            }
            _ => {}
        }
    }
    let mut needs = Needs::default();
    for (top, (chart, present, has_dir)) in charts {
        if has_dir {
            needs.has_charts_dir.push(top.clone());
        }
        let Some(chart) = chart else { continue };
        for dependency in chart.dependencies.unwrap_or_default() {
            // Vendored as Helm checks it, by name: `charts/<name>/` or `charts/<name>-<version>.tgz`, whatever the
            // version. A release that renders offline today is left alone, and a second version of the same
            // chart beside a vendored one would make Helm load both.
            let vendored = present.iter().any(|file| {
                file == &dependency.name
                    || file
                        .strip_prefix(&format!("{}-", dependency.name))
                        .and_then(|rest| rest.strip_suffix(".tgz"))
                        .is_some_and(|v| Version::parse(v).is_ok())
            });
            if vendored
                && let Some(constraint) = dependency.version.as_deref()
                && !present.iter().any(|file| {
                    file.strip_prefix(&format!("{}-", dependency.name))
                        .and_then(|rest| rest.strip_suffix(".tgz"))
                        .and_then(|v| Version::parse(v).ok())
                        .is_some_and(|v| Constraint::parse(constraint).is_ok_and(|c| c.matches(&v)))
                })
            {
                // Info, not a warning: the release renders exactly as Helm renders it, and nothing about it is
                // the operator's to fix (the bundled ferrol releases are so, and `make demo` showed it as a WARN).
                tracing::info!(
                    archive = %archive.display(),
                    chart = %top,
                    dependency = %dependency.name,
                    constraint,
                    "the vendored chart's version does not match Chart.yaml; rendered as vendored, as Helm does"
                );
            }
            if !vendored {
                needs.missing.push((top.clone(), dependency));
            }
        }
    }
    Ok(needs)
}

/// Rewrites `archive` with `additions` as `<chart>/charts/<file>`: every entry copied as it is, then the
/// new files; written beside it and renamed over it.
fn rewrite(
    archive: &Path,
    additions: &[(String, Fetched)],
    has_charts_dir: &[String],
) -> std::io::Result<()> {
    let dir = archive.parent().unwrap_or(Path::new("."));
    let out = tempfile::Builder::new().prefix(".rewrite-").tempfile_in(dir)?;
    {
        let mut builder = tar::Builder::new(GzEncoder::new(
            BufWriter::new(out.as_file()),
            Compression::default(),
        ));
        builder.follow_symlinks(false);
        let mut tar = tar::Archive::new(GzDecoder::new(BufReader::new(File::open(archive)?)));
        for entry in tar.entries()? {
            let mut entry = entry?;
            let mut header = entry.header().clone();
            let path: PathBuf = entry.path()?.into_owned();
            match header.entry_type() {
                tar::EntryType::Symlink | tar::EntryType::Link => {
                    let target = entry.link_name()?.map(|t| t.into_owned()).unwrap_or_default();
                    builder.append_link(&mut header, &path, &target)?;
                }
                _ => builder.append_data(&mut header, &path, &mut entry)?,
            }
        }
        let mtime = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut dirs_done: Vec<&str> = has_charts_dir.iter().map(String::as_str).collect();
        for (chart, fetched) in additions {
            if !dirs_done.contains(&chart.as_str()) {
                let mut header = tar::Header::new_gnu();
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
                header.set_mtime(mtime);
                builder.append_data(&mut header, format!("{chart}/charts/"), std::io::empty())?;
                dirs_done.push(chart);
            }
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(0o644);
            header.set_size(fetched.data.len() as u64);
            header.set_mtime(mtime);
            builder.append_data(
                &mut header,
                format!("{chart}/charts/{}", fetched.file),
                fetched.data.as_slice(),
            )?;
        }
        builder
            .into_inner()?
            .finish()?
            .into_inner()
            .map_err(|e| e.into_error())?;
    }
    out.as_file().sync_all()?;
    out.persist(archive).map_err(|e| e.error)?;
    Ok(())
}

/// The highest version that matches, as Helm picks from an index or a tag list.
fn best_match<'a, T>(
    candidates: impl Iterator<Item = (Version, &'a T)>,
    constraint: &Constraint,
) -> Option<(Version, &'a T)> {
    candidates
        .filter(|(v, _)| constraint.matches(v))
        .max_by(|(a, _), (b, _)| a.cmp(b))
}

/// A semantic version as Helm (Masterminds semver) reads one: `v` allowed, minor and patch optional, build
/// metadata ignored in comparisons.
#[derive(Clone, Debug)]
pub struct Version {
    major: u64,
    minor: u64,
    patch: u64,
    pre: Vec<String>,
    text: String,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl Version {
    /// Parses `1.19.1`, `v1.2`, `1.0.0-rc.1+build`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let partial = Partial::parse(text, false)?;
        Ok(Version {
            major: partial.major.unwrap_or(0),
            minor: partial.minor.unwrap_or(0),
            patch: partial.patch.unwrap_or(0),
            pre: partial.pre,
            text: text.trim().to_owned(),
        })
    }

    fn core(major: u64, minor: u64, patch: u64) -> Self {
        Version {
            major,
            minor,
            patch,
            pre: Vec::new(),
            text: format!("{major}.{minor}.{patch}"),
        }
    }
}

/// Equal by precedence, as semver compares: `v1.2.3`, `1.2.3` and `1.2.3+build` are one version.
impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for Version {}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => {
                    for (a, b) in self.pre.iter().zip(&other.pre) {
                        let order = match (a.parse::<u64>(), b.parse::<u64>()) {
                            (Ok(x), Ok(y)) => x.cmp(&y),
                            (Ok(_), Err(_)) => Ordering::Less,
                            (Err(_), Ok(_)) => Ordering::Greater,
                            (Err(_), Err(_)) => a.cmp(b),
                        };
                        if order != Ordering::Equal {
                            return order;
                        }
                    }
                    self.pre.len().cmp(&other.pre.len())
                }
            })
    }
}

/// A version in a constraint: a missing or `x`/`X`/`*` part is a wildcard.
#[derive(Clone, Debug, Default)]
struct Partial {
    major: Option<u64>,
    minor: Option<u64>,
    patch: Option<u64>,
    pre: Vec<String>,
}

impl Partial {
    fn parse(text: &str, wildcards: bool) -> Result<Self, String> {
        let bad = || format!("{text:?} is not a version");
        let text = text.trim();
        let text = text.strip_prefix(['v', 'V']).unwrap_or(text);
        let text = text.split_once('+').map_or(text, |(core, _)| core);
        let (core, pre) = match text.split_once('-') {
            Some((core, pre)) => (core, pre.split('.').map(str::to_owned).collect()),
            None => (text, Vec::new()),
        };
        if core.is_empty() {
            return Err(bad());
        }
        let mut parts = [None, None, None];
        for (i, part) in core.split('.').enumerate() {
            if i >= 3 {
                return Err(bad());
            }
            parts[i] = match part {
                "x" | "X" | "*" if wildcards => None,
                _ => Some(part.parse::<u64>().map_err(|_| bad())?),
            };
        }
        // After a wildcard everything is a wildcard (`1.x.3` means `1.x`).
        if let Some(first) = parts.iter().position(Option::is_none) {
            parts[first..].iter_mut().for_each(|p| *p = None);
        }
        Ok(Partial {
            major: parts[0],
            minor: parts[1],
            patch: parts[2],
            pre,
        })
    }

    fn is_exact(&self) -> bool {
        self.patch.is_some()
    }

    fn floor(&self) -> Version {
        let mut v = Version::core(
            self.major.unwrap_or(0),
            self.minor.unwrap_or(0),
            self.patch.unwrap_or(0),
        );
        v.pre = self.pre.clone();
        v
    }

    /// The first version above the wildcard range (`1.2` → `1.3.0`), or `None` when it is unbounded.
    fn ceiling(&self) -> Option<Version> {
        match (self.major, self.minor, self.patch) {
            (None, _, _) => None,
            (Some(major), None, _) => Some(Version::core(major + 1, 0, 0)),
            (Some(major), Some(minor), None) => Some(Version::core(major, minor + 1, 0)),
            (Some(_), Some(_), Some(_)) => Some(self.floor()),
        }
    }
}

/// A version constraint as Helm reads `dependencies[].version`: `1.19.1` (exactly), `=`, `!=`, `>`, `>=`,
/// `<`, `<=`, `~`/`~>` (patch updates), `^` (no change of the first non-zero part), wildcards (`1.2.x`, `*`),
/// hyphen ranges (`1.2 - 1.4.5`), terms joined by `,` or spaces (and) and `||` (or). A pre-release only
/// matches a group that names a pre-release, as in Masterminds semver.
#[derive(Clone, Debug)]
pub struct Constraint {
    groups: Vec<Vec<(String, Partial)>>,
    text: String,
}

impl Constraint {
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: String| format!("version constraint {text:?}: {why}");
        let mut groups = Vec::new();
        for alternative in text.split("||") {
            let mut terms = Vec::new();
            let tokens: Vec<&str> = alternative
                .split([',', ' ', '\t'])
                .filter(|t| !t.is_empty())
                .collect();
            let mut i = 0;
            while i < tokens.len() {
                // `a - b`: a hyphen range.
                if tokens.get(i + 1) == Some(&"-") && i + 2 < tokens.len() {
                    terms.push((">=".to_owned(), Partial::parse(tokens[i], true).map_err(bad)?));
                    terms.push(("<=".to_owned(), Partial::parse(tokens[i + 2], true).map_err(bad)?));
                    i += 3;
                    continue;
                }
                let token = tokens[i];
                let op_len = token
                    .find(|c: char| !matches!(c, '=' | '!' | '<' | '>' | '~' | '^'))
                    .unwrap_or(token.len());
                let (op, mut version) = (token[..op_len].to_owned(), token[op_len..].to_owned());
                // An operator written apart from its version (`>= 1.2`).
                if version.is_empty() {
                    i += 1;
                    version = tokens
                        .get(i)
                        .ok_or_else(|| bad(format!("{op} without a version")))?
                        .to_string();
                }
                if !matches!(
                    op.as_str(),
                    "" | "=" | "!=" | ">" | ">=" | "<" | "<=" | "~" | "~>" | "^"
                ) {
                    return Err(bad(format!("unknown operator {op:?}")));
                }
                terms.push((op, Partial::parse(&version, true).map_err(bad)?));
                i += 1;
            }
            if terms.is_empty() {
                return Err(bad("empty".into()));
            }
            groups.push(terms);
        }
        Ok(Constraint {
            groups,
            text: text.trim().to_owned(),
        })
    }

    /// The version itself, when the constraint is one exact version (no fetch of a tag list needed).
    pub fn exact(&self) -> Option<String> {
        match self.groups.as_slice() {
            [group] => match group.as_slice() {
                [(op, partial)] if (op.is_empty() || op == "=") && partial.is_exact() => {
                    Some(self.text.trim_start_matches('=').trim().to_owned())
                }
                _ => None,
            },
            _ => None,
        }
    }

    pub fn matches(&self, version: &Version) -> bool {
        self.groups.iter().any(|group| {
            let names_pre = group.iter().any(|(_, p)| !p.pre.is_empty());
            (version.pre.is_empty() || names_pre) && group.iter().all(|(op, p)| term_matches(op, p, version))
        })
    }
}

fn term_matches(op: &str, p: &Partial, v: &Version) -> bool {
    let floor = p.floor();
    let in_range = |v: &Version| {
        *v >= floor
            && p.ceiling()
                .is_none_or(|c| if p.is_exact() { *v == c } else { *v < c })
    };
    match op {
        "" | "=" => in_range(v),
        "!=" => !in_range(v),
        ">" => match p.ceiling() {
            Some(c) if p.is_exact() => *v > c,
            Some(c) => *v >= c,
            None => false,
        },
        ">=" => *v >= floor,
        "<" => *v < floor,
        "<=" => match p.ceiling() {
            Some(c) if p.is_exact() => *v <= c,
            Some(c) => *v < c,
            None => true,
        },
        "~" | "~>" => {
            *v >= floor
                && match (p.major, p.minor) {
                    (None, _) => true,
                    (Some(major), None) => *v < Version::core(major + 1, 0, 0),
                    (Some(major), Some(minor)) => *v < Version::core(major, minor + 1, 0),
                }
        }
        "^" => {
            let ceiling = match (p.major, p.minor, p.patch) {
                (None, _, _) => None,
                (Some(major), _, _) if major > 0 => Some(Version::core(major + 1, 0, 0)),
                (Some(_), None, _) => Some(Version::core(1, 0, 0)),
                (Some(_), Some(minor), _) if minor > 0 => Some(Version::core(0, minor + 1, 0)),
                (Some(_), Some(_), None) => Some(Version::core(0, 1, 0)),
                (Some(_), Some(_), Some(patch)) => Some(Version::core(0, 0, patch + 1)),
            };
            *v >= floor && ceiling.is_none_or(|c| *v < c)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test: a failed unwrap is a failed test")]

    use super::*;

    fn m(constraint: &str, version: &str) -> bool {
        Constraint::parse(constraint)
            .unwrap()
            .matches(&Version::parse(version).unwrap())
    }

    #[test]
    fn constraints_as_helm_reads_them() {
        assert!(m("1.19.1", "1.19.1"));
        assert!(!m("1.19.1", "1.19.2"));
        assert!(m("\"3.13.0\"".trim_matches('"'), "3.13.0"));
        assert!(m("~1.19.0", "1.19.2") && !m("~1.19.0", "1.20.0"));
        assert!(m("^1.2.3", "1.9.0") && !m("^1.2.3", "2.0.0") && !m("^1.2.3", "1.2.2"));
        assert!(m("^0.2.3", "0.2.9") && !m("^0.2.3", "0.3.0"));
        assert!(m("^0.0.3", "0.0.3") && !m("^0.0.3", "0.0.4"));
        assert!(m("1.19.x", "1.19.7") && !m("1.19.x", "1.20.0"));
        assert!(m("*", "3.0.0") && !m("*", "3.0.0-rc.1"));
        assert!(m(">=1.2, <2", "1.9.9") && !m(">=1.2 <2", "2.0.0"));
        assert!(m(">= 1.2 < 2", "1.5.0"));
        assert!(m("1.2 - 1.4.5", "1.4.5") && !m("1.2 - 1.4.5", "1.4.6"));
        assert!(m("<1 || >=3", "3.1.0") && !m("<1 || >=3", "2.0.0"));
        assert!(m(">1.2", "1.3.0") && !m(">1.2", "1.2.9"));
        assert!(m("<=1.2", "1.2.9") && !m("<=1.2", "1.3.0"));
        assert!(m("!=1.2.3", "1.2.4") && !m("!=1.2.3", "1.2.3"));
        assert!(m(">=1.0.0-0", "1.1.0-rc.1"));
        assert!(m("v1.2.3", "1.2.3") && m("1.2.3", "v1.2.3+build"));
        assert!(Constraint::parse(">>1").is_err() && Constraint::parse("1.a").is_err());
        assert_eq!(
            Constraint::parse("1.19.1").unwrap().exact().as_deref(),
            Some("1.19.1")
        );
        assert_eq!(Constraint::parse("^1.19.1").unwrap().exact(), None);
    }

    #[test]
    fn the_highest_matching_version_wins() {
        let versions = ["1.18.0", "1.19.1", "1.19.2", "1.20.0-rc.1", "2.0.0"];
        let pick = |c: &str| {
            best_match(
                versions.iter().map(|v| (Version::parse(v).unwrap(), v)),
                &Constraint::parse(c).unwrap(),
            )
            .map(|(v, _)| v.to_string())
        };
        assert_eq!(pick("~1.19").as_deref(), Some("1.19.2"));
        assert_eq!(pick("^1").as_deref(), Some("1.19.2"));
        assert_eq!(pick(">=1").as_deref(), Some("2.0.0"));
        assert_eq!(pick("3"), None);
        assert!(Version::parse("1.0.0-rc.10").unwrap() > Version::parse("1.0.0-rc.2").unwrap());
    }

    #[test]
    fn credentials_from_a_registry_config() {
        let basic = |auth: Option<RegistryAuth>| match auth {
            Some(RegistryAuth::Basic(user, password)) => Some((user, password)),
            _ => None,
        };
        let config = r#"{"auths": {
            "https://registry.example:5000": {"auth": "bWlycm9yOnMzY3JldA=="},
            "other.example": {"username": "u", "password": "p"}
        }}"#;
        assert_eq!(
            basic(auth_from_config(config, "registry.example:5000")),
            Some(("mirror".into(), "s3cret".into()))
        );
        assert_eq!(
            basic(auth_from_config(config, "other.example")),
            Some(("u".into(), "p".into()))
        );
        assert!(auth_from_config(config, "registry.example").is_none());
        assert!(auth_from_config("{\"credsStore\": \"desktop\"}", "other.example").is_none());

        let credentials = ChartCredentials::from_docker_config(config.as_bytes()).unwrap();
        assert_eq!(credentials.hosts(), ["other.example", "registry.example:5000"]);
        assert_eq!(
            credentials.for_host("registry.example:5000"),
            Some(("mirror", "s3cret"))
        );
        assert!(!format!("{credentials:?}").contains("s3cret"));
        let error = ChartCredentials::from_docker_config(b"{\"s3cret\": 1").unwrap_err();
        assert!(!error.contains("s3cret"), "{error}");
        assert!(ChartCredentials::from_docker_config(b"{}").is_err());
        assert_eq!(
            host_of_key("HTTPS://Charts.Example:8443/v1/"),
            "charts.example:8443"
        );
        assert_eq!(
            host_of_url(&Url::parse("https://charts.example/x/index.yaml").unwrap()),
            "charts.example"
        );
    }

    #[test]
    fn mirrors_from_the_flags() {
        let mirrors = ChartMirrors::parse(&[
            "https://helm.cilium.io=oci://mirror.example/cilium",
            "https://charts.example/all",
        ])
        .unwrap();
        assert_eq!(
            mirrors.repository_for("https://helm.cilium.io/"),
            "oci://mirror.example/cilium"
        );
        assert_eq!(
            mirrors.repository_for("https://other/"),
            "https://charts.example/all"
        );
        let none = ChartMirrors::parse::<&str>(&[]).unwrap();
        assert_eq!(none.repository_for("https://other/"), "https://other/");
        assert!(ChartMirrors::parse(&["ftp://x"]).is_err());
        assert!(ChartMirrors::parse(&["https://a", "https://b"]).is_err());
        let error = ChartMirrors::parse(&["file:///x?password=1"]).unwrap_err();
        assert!(error.contains("file"), "{error}");
        assert_eq!(redact("https://u:secret@host/x"), "https://u:***@host/x");
    }
}
