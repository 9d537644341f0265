//! A real OCI registry on loopback (the CNCF distribution registry, Debian's `docker-registry`), and pushing
//! releases into it the way the stack tooling does: one tag per release, one layer per file titled with
//! `org.opencontainers.image.title`.
//!
//! Two ways to push: [`Registry::push_release_dir`] through `oci-client` (artifact type
//! `application/vnd.scs.cluster-stacks.v1`, the older tooling), and [`push_like_oras`], which makes the very
//! requests and manifest that `oras push --artifact-type application/vnd.clusterstack.release` makes (the
//! cluster-stacks' `build.sh` since 2026), by hand on the distribution API, so that no client library's
//! habits slip in.
//!
//! Debian's registry (distribution 2.8) ignores `n` and `last` on the tag list and always answers with every
//! tag; distribution 3, Harbor, GHCR and Docker Hub page it. [`PagingFront`] stands in front of the real
//! registry, passes every request through, and pages the real tag list as the distribution spec says (`?n=`,
//! `?last=`, `Link: <...>; rel="next"`), so that a client's paging is tested against real data.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    body::Body,
    extract::{Request, State},
    http::{HeaderName, HeaderValue},
    response::{IntoResponse, Response},
};

use oci_client::{
    Client, Reference,
    client::{ClientConfig, ClientProtocol, Config, ImageLayer},
    manifest::OciImageManifest,
    secrets::RegistryAuth,
};

use reqwest::{StatusCode, Url};
use sha2::{Digest, Sha256};

use crate::{Error, Tools, process::Supervised};

/// The artifact type of a cluster-stack release.
pub const ARTIFACT_TYPE: &str = "application/vnd.scs.cluster-stacks.v1";
/// The layer media type of a release file (ORAS's default for files).
pub const FILE_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
const TITLE_ANNOTATION: &str = "org.opencontainers.image.title";

/// A running registry. Dropping it stops the registry and removes its storage.
#[derive(Debug)]
pub struct Registry {
    host: String,
    auth: RegistryAuth,
    storage: PathBuf,
    _process: Supervised,
    _dir: tempfile::TempDir,
}

impl Registry {
    /// A registry that anyone may read and write.
    pub async fn start(tools: &Tools) -> Result<Self, Error> {
        Self::start_with(tools, None).await
    }

    /// A registry that requires HTTP basic authentication (htpasswd) for every request.
    pub async fn start_with_basic_auth(tools: &Tools, user: &str, password: &str) -> Result<Self, Error> {
        Self::start_with(tools, Some((user, password))).await
    }

    async fn start_with(tools: &Tools, basic_auth: Option<(&str, &str)>) -> Result<Self, Error> {
        let binary = tools.registry.clone().ok_or_else(|| {
            Error::Tools("docker-registry not found: run `make tools` or set CSO_REGISTRY".into())
        })?;
        let dir = tempfile::Builder::new()
            .prefix("cso-registry-")
            .tempdir()
            .map_err(|e| Error::io(Path::new("/tmp"), e))?;
        let port = crate::free_port()?;
        let storage = dir.path().join("data");
        let config = dir.path().join("config.yml");
        let text = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            storage.display()
        );
        let (text, auth) = match basic_auth {
            None => (text, RegistryAuth::Anonymous),
            Some((user, password)) => {
                let hash = bcrypt::hash_with_result(password, 5)
                    .map_err(|e| Error::Tools(format!("bcrypt: {e}")))?
                    .format_for_version(bcrypt::Version::TwoA);
                let htpasswd = dir.path().join("htpasswd");
                std::fs::write(&htpasswd, format!("{user}:{hash}\n")).map_err(|e| Error::io(&htpasswd, e))?;
                let auth_config = format!(
                    "auth:\n  htpasswd:\n    realm: cso-test\n    path: {}\n",
                    htpasswd.display()
                );
                (
                    text + &auth_config,
                    RegistryAuth::Basic(user.to_owned(), password.to_owned()),
                )
            }
        };
        std::fs::write(&config, text).map_err(|e| Error::io(&config, e))?;
        let mut command = Command::new(binary);
        command.arg("serve").arg(&config);
        let mut process = Supervised::spawn(
            "docker-registry",
            command,
            &dir.path().join("registry.log"),
            Some(dir.path()),
        )?;
        let host = format!("127.0.0.1:{port}");
        let listening = || async {
            matches!(
                tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(&host)).await,
                Ok(Ok(_))
            )
        };
        process
            .wait_ready(Duration::from_secs(30), Duration::from_millis(50), listening)
            .await?;
        Ok(Registry {
            host,
            auth,
            storage,
            _process: process,
            _dir: dir,
        })
    }

    /// `127.0.0.1:<port>`
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The release source's variables (`OCI_REGISTRY`, `OCI_REPOSITORY`, `OCI_PLAIN_HTTP`) for `repository` of
    /// this registry, as a lookup for the OCI source's configuration (`OciConfig::from_lookup`).
    pub fn oci_variables(&self, repository: &str) -> impl Fn(&str) -> Option<String> + use<> {
        let (host, repository) = (self.host.clone(), format!("{}/{repository}", self.host));
        move |key| match key {
            "OCI_REGISTRY" => Some(host.clone()),
            "OCI_REPOSITORY" => Some(repository.clone()),
            "OCI_PLAIN_HTTP" => Some("true".into()),
            _ => None,
        }
    }

    /// Where the registry keeps blobs (for tests that tamper with them).
    pub fn storage(&self) -> &Path {
        &self.storage
    }

    fn client(&self) -> Client {
        Client::new(ClientConfig {
            protocol: ClientProtocol::Http,
            ..Default::default()
        })
    }

    /// Pushes the regular files of `dir` as release `tag` of `repository` (e.g. `kaas/cluster-stacks`).
    pub async fn push_release_dir(&self, repository: &str, tag: &str, dir: &Path) -> Result<String, Error> {
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_file()) {
                let data = std::fs::read(entry.path()).map_err(|e| Error::io(&entry.path(), e))?;
                files.push((entry.file_name().to_string_lossy().into_owned(), data));
            }
        }
        files.sort();
        self.push_files(repository, tag, files).await
    }

    /// Pushes `files` as one release artifact; returns the manifest digest.
    pub async fn push_files(
        &self,
        repository: &str,
        tag: &str,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<String, Error> {
        crate::install_crypto_provider();
        let reference: Reference = format!("{}/{repository}:{tag}", self.host)
            .parse()
            .map_err(|e| Error::Kube(format!("reference: {e}")))?;
        let layers: Vec<ImageLayer> = files
            .into_iter()
            .map(|(name, data)| {
                ImageLayer::new(
                    data,
                    FILE_MEDIA_TYPE.to_owned(),
                    Some(BTreeMap::from([(TITLE_ANNOTATION.to_owned(), name)])),
                )
            })
            .collect();
        let config = Config::new(
            b"{}".to_vec(),
            "application/vnd.oci.empty.v1+json".to_owned(),
            None,
        );
        let mut manifest = OciImageManifest::build(&layers, &config, None);
        manifest.artifact_type = Some(ARTIFACT_TYPE.to_owned());
        let pushed = self
            .client()
            .push(&reference, &layers, config, &self.auth, Some(manifest))
            .await
            .map_err(|e| Error::Kube(format!("push {reference}: {e}")))?;
        Ok(pushed.manifest_url)
    }
}

/// The artifact type the cluster-stacks' `build.sh` gives `oras push`.
pub const ORAS_ARTIFACT_TYPE: &str = "application/vnd.clusterstack.release";
/// The OCI image manifest, which `oras push` writes (image-spec 1.1: `artifactType`, empty config).
pub const IMAGE_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// The OCI image index (the referrers tag schema's tag holds one).
pub const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// The empty config of an artifact (image-spec 1.1), the two bytes `{}`.
pub const EMPTY_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";

/// Pushes the regular files of `dir` as `tag` of `repository` the way `oras push --artifact-type
/// application/vnd.clusterstack.release <ref> <files>` does; returns the manifest digest. See
/// [`push_files_like_oras`].
pub async fn push_like_oras(
    registry: &Registry,
    repository: &str,
    tag: &str,
    dir: &Path,
) -> Result<String, Error> {
    let files = release_files(dir)?;
    push_files_like_oras(registry, repository, tag, &files).await
}

/// [`push_like_oras`] with `appended` added to the end of file `file`: the same release with other content
/// (and so another manifest digest), as a tag pushed again after it was signed or pinned.
pub async fn push_like_oras_changed(
    registry: &Registry,
    repository: &str,
    tag: &str,
    dir: &Path,
    (file, appended): (&str, &[u8]),
) -> Result<String, Error> {
    let mut files = release_files(dir)?;
    let changed = files.iter_mut().find(|(name, _)| name == file);
    changed
        .ok_or_else(|| Error::Kube(format!("{} has no file {file}", dir.display())))?
        .1
        .extend_from_slice(appended);
    push_files_like_oras(registry, repository, tag, &files).await
}

/// The regular files of release directory `dir`, in the order `build.sh` hands them to oras.
fn release_files(dir: &Path) -> Result<Vec<(String, Vec<u8>)>, Error> {
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            let data = std::fs::read(entry.path()).map_err(|e| Error::io(&entry.path(), e))?;
            files.push((entry.file_name().to_string_lossy().into_owned(), data));
        }
    }
    files.sort_by_cached_key(|(name, _)| (build_sh_rank(name), name.clone()));
    Ok(files)
}

/// Where `build.sh` puts a file on its `oras push` command line (`metadata.yaml hashes.json csctl.yaml
/// clusteraddon.yaml <class>.tgz <addon>.tgz`): oras keeps that order in the layers.
fn build_sh_rank(name: &str) -> usize {
    match name {
        "metadata.yaml" => 0,
        "hashes.json" => 1,
        "csctl.yaml" => 2,
        "clusteraddon.yaml" => 3,
        _ if name.contains("-cluster-class-") => 4,
        _ if name.contains("-cluster-addon-") => 5,
        _ => 6,
    }
}

/// Pushes `files` (name, content; layers in this order) as `tag` of `repository` with the distribution API
/// calls `oras push` makes: for each blob a `HEAD` (already there: skipped), else `POST .../blobs/uploads/`
/// and a monolithic `PUT <location>?digest=`; the empty config the same way; then `PUT .../manifests/<tag>`
/// with an OCI image manifest that has `artifactType`, the empty config descriptor (with its inline `data`, as
/// oras writes it), `application/vnd.oci.image.layer.v1.tar` layers titled with the file name, and no manifest
/// annotations. Returns the manifest digest.
pub async fn push_files_like_oras(
    registry: &Registry,
    repository: &str,
    tag: &str,
    files: &[(String, Vec<u8>)],
) -> Result<String, Error> {
    let basic = match &registry.auth {
        RegistryAuth::Basic(user, password) => Some((user.clone(), password.clone())),
        _ => None,
    };
    let client = RepositoryClient::new(&registry.host, repository, basic)?;
    let mut layers = Vec::new();
    for (name, data) in files {
        layers.push(serde_json::json!({
            "mediaType": FILE_MEDIA_TYPE,
            "digest": client.push_blob(data).await?,
            "size": data.len(),
            "annotations": { TITLE_ANNOTATION: name },
        }));
    }
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": IMAGE_MANIFEST_MEDIA_TYPE,
        "artifactType": ORAS_ARTIFACT_TYPE,
        "config": {
            "mediaType": EMPTY_MEDIA_TYPE,
            "digest": client.push_blob(b"{}").await?,
            "size": 2,
            "data": "e30=",
        },
        "layers": layers,
    });
    let body = serde_json::to_vec(&manifest)
        .map_err(|e| Error::Kube(format!("manifest of {repository}:{tag}: {e}")))?;
    client.put_manifest(tag, IMAGE_MANIFEST_MEDIA_TYPE, &body).await?;
    Ok(sha256_digest(&body))
}

/// Plain-HTTP access to one repository of a registry (with basic credentials, or anonymous), speaking the
/// distribution API as `oras` and cosign do: what the pushes of these tests are made of.
pub(crate) struct RepositoryClient {
    pub(crate) http: reqwest::Client,
    base: Url,
    repository: String,
    basic: Option<(String, String)>,
}

impl RepositoryClient {
    pub(crate) fn new(host: &str, repository: &str, basic: Option<(String, String)>) -> Result<Self, Error> {
        crate::install_crypto_provider();
        let http = reqwest::Client::builder()
            .build()
            .map_err(|e| Error::Kube(format!("HTTP client: {e}")))?;
        let base = Url::parse(&format!("http://{host}/v2/{repository}/"))
            .map_err(|e| Error::Kube(format!("registry URL: {e}")))?;
        Ok(RepositoryClient {
            http,
            base,
            repository: repository.to_owned(),
            basic,
        })
    }

    /// `path` below `/v2/<repository>/`; a location the registry answered (relative, possibly with a query)
    /// resolves the same way.
    pub(crate) fn url(&self, path: &str) -> Result<Url, Error> {
        self.base
            .join(path)
            .map_err(|e| Error::Kube(format!("registry URL {path}: {e}")))
    }

    fn authorize(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.basic {
            Some((user, password)) => request.basic_auth(user, Some(password)),
            None => request,
        }
    }

    /// Pushes `data` as a blob unless the registry has it (`HEAD`), with `POST .../blobs/uploads/` and a
    /// monolithic `PUT <location>?digest=`; its digest.
    pub(crate) async fn push_blob(&self, data: &[u8]) -> Result<String, Error> {
        let digest = sha256_digest(data);
        let fail = |what: String| Error::Kube(format!("push blob {digest} to {}: {what}", self.repository));
        let head = self
            .authorize(self.http.head(self.url(&format!("blobs/{digest}"))?))
            .send()
            .await
            .map_err(|e| fail(e.to_string()))?;
        if head.status() == StatusCode::OK {
            return Ok(digest);
        }
        let started = self
            .authorize(self.http.post(self.url("blobs/uploads/")?))
            .header(reqwest::header::CONTENT_LENGTH, "0")
            .send()
            .await
            .map_err(|e| fail(e.to_string()))?;
        if started.status() != StatusCode::ACCEPTED {
            return Err(fail(format!("start upload answered {}", started.status())));
        }
        let location = started
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|l| l.to_str().ok())
            .ok_or_else(|| fail("the upload has no Location".into()))?;
        let mut upload = self.url(location)?;
        upload.query_pairs_mut().append_pair("digest", &digest);
        let put = self
            .authorize(self.http.put(upload))
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(data.to_vec())
            .send()
            .await
            .map_err(|e| fail(e.to_string()))?;
        created(put, fail).await?;
        Ok(digest)
    }

    /// `PUT .../manifests/<reference>` of `body` as `media_type`.
    pub(crate) async fn put_manifest(
        &self,
        reference: &str,
        media_type: &str,
        body: &[u8],
    ) -> Result<(), Error> {
        let fail =
            |what: String| Error::Kube(format!("put manifest {}:{reference}: {what}", self.repository));
        let put = self
            .authorize(self.http.put(self.url(&format!("manifests/{reference}"))?))
            .header(reqwest::header::CONTENT_TYPE, media_type)
            .body(body.to_vec())
            .send()
            .await
            .map_err(|e| fail(e.to_string()))?;
        created(put, fail).await
    }
    /// The manifest (or index) at `reference`; `None` when the registry has none.
    pub(crate) async fn get_manifest(&self, reference: &str) -> Result<Option<Vec<u8>>, Error> {
        let fail =
            |what: String| Error::Kube(format!("get manifest {}:{reference}: {what}", self.repository));
        let response = self
            .authorize(self.http.get(self.url(&format!("manifests/{reference}"))?))
            .header(
                reqwest::header::ACCEPT,
                format!("{IMAGE_MANIFEST_MEDIA_TYPE}, {INDEX_MEDIA_TYPE}"),
            )
            .send()
            .await
            .map_err(|e| fail(e.to_string()))?;
        match response.status() {
            StatusCode::NOT_FOUND => Ok(None),
            StatusCode::OK => Ok(Some(
                response.bytes().await.map_err(|e| fail(e.to_string()))?.to_vec(),
            )),
            status => Err(fail(format!("{status}"))),
        }
    }

    /// Whether `GET /v2/<repository>/referrers/<digest>` answers with an index (distribution 3, most hosted
    /// registries) rather than 404 (distribution 2.8).
    pub(crate) async fn answers_referrers(&self, digest: &str) -> Result<bool, Error> {
        let response = self
            .authorize(self.http.get(self.url(&format!("referrers/{digest}"))?))
            .header(reqwest::header::ACCEPT, INDEX_MEDIA_TYPE)
            .send()
            .await
            .map_err(|e| Error::Kube(format!("referrers of {digest}: {e}")))?;
        Ok(response.status() == StatusCode::OK)
    }
}

/// The answer when it is `201 Created`; else the error `fail` makes of its status and body.
async fn created(response: reqwest::Response, fail: impl Fn(String) -> Error) -> Result<(), Error> {
    if response.status() == StatusCode::CREATED {
        return Ok(());
    }
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    Err(fail(format!("{status}: {body}")))
}

/// A front for a [`Registry`] that pages the tag list as the distribution spec says (see the module doc).
/// Every other request is passed through as it is, credentials included. Stops when dropped.
#[derive(Debug)]
pub struct PagingFront {
    host: String,
    pages: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PagingFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Front {
    upstream: String,
    http: reqwest::Client,
    pages: Arc<AtomicUsize>,
}

impl PagingFront {
    pub async fn start(registry: &Registry) -> Result<Self, Error> {
        crate::install_crypto_provider();
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Kube(format!("paging front: HTTP client: {e}")))?;
        let pages = Arc::new(AtomicUsize::new(0));
        let front = Front {
            upstream: registry.host.clone(),
            http,
            pages: pages.clone(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| Error::io(Path::new("127.0.0.1:0"), e))?;
        let addr: SocketAddr = listener
            .local_addr()
            .map_err(|e| Error::io(Path::new("127.0.0.1:0"), e))?;
        let router = axum::Router::new().fallback(pass).with_state(front);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(PagingFront {
            host: addr.to_string(),
            pages,
            task,
        })
    }

    /// `127.0.0.1:<port>`, to use in place of the registry's host.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// How many pages of tag lists were served so far.
    pub fn pages_served(&self) -> usize {
        self.pages.load(Ordering::SeqCst)
    }
}

async fn pass(State(front): State<Front>, request: Request) -> Response {
    match forward(&front, request).await {
        Ok(response) => response,
        Err(message) => (axum::http::StatusCode::BAD_GATEWAY, message).into_response(),
    }
}

async fn forward(front: &Front, request: Request) -> Result<Response, String> {
    let (parts, body) = request.into_parts();
    let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let url = Url::parse(&format!("http://{}{path_and_query}", front.upstream)).map_err(|e| e.to_string())?;
    let tag_list = url.path().starts_with("/v2/") && url.path().ends_with("/tags/list");
    let mut upstream_url = url.clone();
    if tag_list {
        // The whole list from the registry; this front does the paging.
        upstream_url.set_query(None);
    }
    let body = axum::body::to_bytes(body, 64 << 20)
        .await
        .map_err(|e| e.to_string())?;
    let method = reqwest::Method::from_bytes(parts.method.as_str().as_bytes()).map_err(|e| e.to_string())?;
    let mut upstream = front.http.request(method, upstream_url);
    for (name, value) in &parts.headers {
        // Hop-by-hop and framing headers are the client's own business; reqwest sets them anew.
        if !matches!(
            name.as_str(),
            "host" | "content-length" | "transfer-encoding" | "connection"
        ) {
            upstream = upstream.header(name.as_str(), value.as_bytes());
        }
    }
    let answer = upstream.body(body).send().await.map_err(|e| e.to_string())?;
    let status = axum::http::StatusCode::from_u16(answer.status().as_u16()).map_err(|e| e.to_string())?;
    let mut headers = axum::http::HeaderMap::new();
    for (name, value) in answer.headers() {
        if matches!(name.as_str(), "transfer-encoding" | "connection") {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_str().as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            headers.append(name, value);
        }
    }
    let bytes = answer.bytes().await.map_err(|e| e.to_string())?;
    if !(tag_list && status.is_success()) {
        return Ok((status, headers, Body::from(bytes)).into_response());
    }

    // Distribution 3's paging: tags in lexical order, those after `last`, at most `n`; `Link` while more remain.
    front.pages.fetch_add(1, Ordering::SeqCst);
    let mut list: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    let mut tags: Vec<String> = serde_json::from_value(list["tags"].take()).unwrap_or_default();
    tags.sort();
    let query: BTreeMap<String, String> = url.query_pairs().into_owned().collect();
    if let Some(last) = query.get("last") {
        tags.retain(|t| t > last);
    }
    let mut link = None;
    if let Some(n) = query.get("n").and_then(|n| n.parse::<usize>().ok())
        && tags.len() > n
    {
        tags.truncate(n);
        let mut next = Url::parse("http://next").map_err(|e| e.to_string())?;
        next.set_path(url.path());
        next.query_pairs_mut()
            .append_pair("last", tags.last().map_or("", String::as_str))
            .append_pair("n", &n.to_string());
        link = Some(format!(
            "<{}?{}>; rel=\"next\"",
            next.path(),
            next.query().unwrap_or("")
        ));
    }
    list["tags"] = tags.into();
    let mut response = axum::Json(list).into_response();
    if let Some(link) = link.and_then(|l| HeaderValue::from_str(&l).ok()) {
        response.headers_mut().insert(axum::http::header::LINK, link);
    }
    Ok(response)
}

/// `sha256:<hex>` of `data`: a blob's or a manifest's digest.
pub(crate) fn sha256_digest(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test: a failed unwrap is a failed test")]

    use super::*;

    #[test]
    fn files_are_ordered_as_build_sh_hands_them_to_oras() {
        let mut names = vec![
            "docker-scs-1-35-cluster-addon-v1.tgz",
            "metadata.yaml",
            "clusteraddon.yaml",
            "docker-scs-1-35-cluster-class-v1.tgz",
            "csctl.yaml",
            "hashes.json",
        ];
        names.sort_by_key(|n| (build_sh_rank(n), *n));
        assert_eq!(
            names,
            [
                "metadata.yaml",
                "hashes.json",
                "csctl.yaml",
                "clusteraddon.yaml",
                "docker-scs-1-35-cluster-class-v1.tgz",
                "docker-scs-1-35-cluster-addon-v1.tgz",
            ]
        );
    }

    /// The manifest in the registry is the one `oras push` makes, byte for byte in its fields.
    #[tokio::test]
    async fn an_oras_style_push_stores_what_oras_stores() {
        let registry = Registry::start(&Tools::discover().unwrap()).await.unwrap();
        let files = vec![
            ("metadata.yaml".to_owned(), b"apiVersion: x\n".to_vec()),
            ("hashes.json".to_owned(), b"{}".to_vec()),
        ];
        let digest = push_files_like_oras(&registry, "kaas/stacks", "v1", &files)
            .await
            .unwrap();
        // Again: every blob is there already, only the manifest is written.
        assert_eq!(
            push_files_like_oras(&registry, "kaas/stacks", "v2", &files)
                .await
                .unwrap(),
            digest
        );

        let url = format!("http://{}/v2/kaas/stacks/manifests/v1", registry.host());
        let response = reqwest::Client::new()
            .get(url)
            .header(reqwest::header::ACCEPT, IMAGE_MANIFEST_MEDIA_TYPE)
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.headers()["docker-content-digest"].to_str().unwrap(),
            digest
        );
        let manifest: serde_json::Value = response.json().await.unwrap();
        assert_eq!(manifest["mediaType"], IMAGE_MANIFEST_MEDIA_TYPE);
        assert_eq!(manifest["artifactType"], ORAS_ARTIFACT_TYPE);
        assert_eq!(manifest["config"]["mediaType"], EMPTY_MEDIA_TYPE);
        assert_eq!(manifest["config"]["size"], 2);
        assert!(manifest.get("annotations").is_none());
        let layers = manifest["layers"].as_array().unwrap();
        assert_eq!(layers.len(), 2);
        for (layer, (name, data)) in layers.iter().zip(&files) {
            assert_eq!(layer["mediaType"], FILE_MEDIA_TYPE);
            assert_eq!(layer["annotations"][TITLE_ANNOTATION], name.as_str());
            assert_eq!(layer["digest"], sha256_digest(data));
        }
    }

    /// The front pages the real registry's tag list as distribution 3 does; the registry itself does not.
    #[tokio::test]
    async fn the_paging_front_pages_the_tag_list() {
        let registry = Registry::start(&Tools::discover().unwrap()).await.unwrap();
        let files = vec![("metadata.yaml".to_owned(), b"x".to_vec())];
        for tag in ["a", "b", "c", "d", "e"] {
            push_files_like_oras(&registry, "kaas/stacks", tag, &files)
                .await
                .unwrap();
        }
        let get = async |host: &str, query: &str| {
            let response = reqwest::get(format!("http://{host}/v2/kaas/stacks/tags/list{query}"))
                .await
                .unwrap();
            let link = response
                .headers()
                .get("link")
                .map(|l| l.to_str().unwrap().to_owned());
            let list: serde_json::Value = response.json().await.unwrap();
            (list["tags"].clone(), link)
        };
        let (all, link) = get(registry.host(), "?n=2").await;
        assert_eq!(all.as_array().unwrap().len(), 5, "distribution 2.8 does not page");
        assert_eq!(link, None);

        let front = PagingFront::start(&registry).await.unwrap();
        let (page, link) = get(front.host(), "?n=2").await;
        assert_eq!(page, serde_json::json!(["a", "b"]));
        let link = link.unwrap();
        assert_eq!(link, r#"</v2/kaas/stacks/tags/list?last=b&n=2>; rel="next""#);
        let (page, link) = get(front.host(), "?last=d&n=2").await;
        assert_eq!(page, serde_json::json!(["e"]));
        assert_eq!(link, None, "the last page");
        let (page, _) = get(front.host(), "").await;
        assert_eq!(page.as_array().unwrap().len(), 5, "no n: everything");
        assert_eq!(front.pages_served(), 3);
        // Everything else passes through (distribution 2.8 hides OCI manifests from clients that do not
        // accept them).
        let manifest = reqwest::Client::new()
            .get(format!("http://{}/v2/kaas/stacks/manifests/a", front.host()))
            .header(reqwest::header::ACCEPT, IMAGE_MANIFEST_MEDIA_TYPE)
            .send()
            .await
            .unwrap();
        assert_eq!(manifest.status(), StatusCode::OK);
    }
}
