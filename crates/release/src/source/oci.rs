//! An OCI registry as a release source: one tag per release; the release's files are the manifest's layers
//! titled with `org.opencontainers.image.title` (untitled layers are skipped, as the Go operator does).
//!
//! A file is found by its title alone: the artifact type, the config and the layer media types are whatever
//! the publisher chose (`oras push --artifact-type application/vnd.clusterstack.release` gives an empty config
//! and `application/vnd.oci.image.layer.v1.tar` layers; older tooling used other types), so none of them is
//! checked. Every blob's digest is verified while it is written; a mismatch names the file.
//!
//! Tags are listed page by page as the distribution spec says: `?n=` asks for a page, and the registry's
//! `Link: <...>; rel="next"` header says where the next one is (no header: that was the last page). The
//! listing is done with plain HTTP requests because `oci-client` does not show the response headers.
//!
//! A download resolves the tag once, to the manifest's bytes and their digest; everything after that is read
//! by that digest, never by the tag again: the pin is compared with it, the signatures are looked up for it
//! ([`super::verify`], when keys are configured), and the layers are pulled from the manifest that was
//! checked. A tag moved in between cannot slip another release in. The tags that signatures add
//! (`sha256-<hex>`, `sha256-<hex>.sig`) are listed with the others and dropped by `releases_of`, as they are no
//! release names.

use std::{
    collections::{BTreeSet, HashSet},
    path::Path,
    time::Duration,
};

use futures::future::BoxFuture;
use oci_client::{
    Client, Reference,
    client::{ClientConfig, ClientProtocol},
    errors::OciErrorCode,
    manifest::{
        IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE, OciDescriptor,
        OciImageManifest,
    },
    secrets::RegistryAuth,
};
use reqwest::{StatusCode, Url, header};
use sha2::{Digest, Sha256};

use super::{
    Provenance, Refusal, ReleaseSource, SourceError,
    verify::{self, Finding, TrustedKey, Verdict, Verified},
};

const TITLE_ANNOTATION: &str = "org.opencontainers.image.title";
/// The page size asked for; registries may answer with fewer tags per page (and say so with `Link`).
const TAGS_PER_PAGE: usize = 1000;
/// A registry whose `Link`s never end is broken (or hostile): give up after this many pages.
const MAX_TAG_PAGES: usize = 10_000;
/// Signature documents read per release and layout, at most (a release has one or a few).
const MAX_SIGNATURES: usize = 32;
/// A signature document larger than this is not read (cosign's are a few KiB).
const MAX_SIGNATURE_BYTES: usize = 1 << 20;

/// Where the releases are and how to authenticate.
#[derive(Clone)]
pub struct OciConfig {
    /// The registry host, e.g. `registry.scs.community`; credentials are sent to it alone.
    pub registry: String,
    /// The repository with its host, e.g. `registry.scs.community/kaas/cluster-stacks`.
    pub repository: String,
    pub auth: RegistryAuth,
    /// Plain HTTP, allowed for loopback registries only (tests and local mirrors).
    pub plain_http: bool,
}

impl std::fmt::Debug for OciConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let auth = match self.auth {
            RegistryAuth::Anonymous => "anonymous",
            RegistryAuth::Basic(..) => "basic",
            RegistryAuth::Bearer(_) => "token",
        };
        f.debug_struct("OciConfig")
            .field("registry", &self.registry)
            .field("repository", &self.repository)
            .field("auth", &auth)
            .field("plain_http", &self.plain_http)
            .finish()
    }
}

impl OciConfig {
    /// From the Go operator's variables: `OCI_REGISTRY`, `OCI_REPOSITORY`, and `OCI_ACCESS_TOKEN` or
    /// `OCI_USERNAME` + `OCI_PASSWORD` (trailing newlines trimmed), plus `OCI_PLAIN_HTTP=true` for loopback.
    /// As in the Go operator, the access token is sent base64-encoded, so existing secrets keep working.
    pub fn from_env() -> Result<Self, SourceError> {
        Self::from_lookup(|key| std::env::var(key).ok())
    }

    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, SourceError> {
        use base64::Engine;
        let env = super::Env(lookup);
        let registry = env.required("OCI_REGISTRY")?;
        let repository = env.required("OCI_REPOSITORY")?;
        if !repository.starts_with(&format!("{registry}/")) {
            return Err(SourceError::Config(format!(
                "OCI_REPOSITORY {repository:?} is not a repository of OCI_REGISTRY {registry:?}"
            )));
        }
        let auth = match (
            env.get("OCI_ACCESS_TOKEN"),
            env.get("OCI_USERNAME"),
            env.get("OCI_PASSWORD"),
        ) {
            (Some(token), _, _) => {
                RegistryAuth::Bearer(base64::engine::general_purpose::STANDARD.encode(token))
            }
            (None, Some(user), Some(password)) => RegistryAuth::Basic(user, password),
            (None, Some(_), None) | (None, None, Some(_)) => {
                return Err(SourceError::Config(
                    "OCI_USERNAME and OCI_PASSWORD go together".into(),
                ));
            }
            (None, None, None) => RegistryAuth::Anonymous,
        };
        let plain_http = env.get("OCI_PLAIN_HTTP").is_some_and(|v| v == "true");
        let host = registry.rsplit_once(':').map_or(registry.as_str(), |(h, _)| h);
        if plain_http && !matches!(host, "127.0.0.1" | "localhost" | "[::1]") {
            return Err(SourceError::Config(format!(
                "OCI_PLAIN_HTTP is only allowed for loopback registries, not {registry}"
            )));
        }
        Ok(OciConfig {
            registry,
            repository,
            auth,
            plain_http,
        })
    }
}

pub struct OciSource {
    config: OciConfig,
    client: Client,
    /// For the tag list (see the module doc). Building it can only fail when TLS cannot be set up; that is
    /// reported by the first listing rather than making `new` fallible.
    http: Result<reqwest::Client, String>,
    tags_per_page: usize,
    /// `--verify-key`: with any, every release must carry a signature by one of them.
    keys: Vec<TrustedKey>,
}

impl std::fmt::Debug for OciSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OciSource")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl OciSource {
    pub fn new(config: OciConfig) -> Self {
        crate::source::install_crypto_provider();
        let protocol = if config.plain_http {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        };
        let client = Client::new(ClientConfig {
            protocol,
            // A registry that stops sending is given up on (and retried) rather than waited for until the
            // reconcile timeout; a read is one chunk, so large layers are not cut short.
            read_timeout: Some(Duration::from_secs(60)),
            connect_timeout: Some(Duration::from_secs(10)),
            ..Default::default()
        });
        let http = reqwest::Client::builder()
            .user_agent(concat!("cso/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| e.to_string());
        OciSource {
            config,
            client,
            http,
            tags_per_page: TAGS_PER_PAGE,
            keys: Vec::new(),
        }
    }

    /// Verifies every release against `keys` (none: verifies nothing).
    pub fn verifying(mut self, keys: Vec<TrustedKey>) -> Self {
        self.keys = keys;
        self
    }

    /// Asks for `n` tags per page (at least 1) instead of 1000: for registries with a smaller limit, and tests.
    pub fn with_tags_per_page(mut self, n: usize) -> Self {
        self.tags_per_page = n.max(1);
        self
    }

    fn reference(&self, tag: Option<&str>) -> Result<Reference, SourceError> {
        let text = match tag {
            Some(tag) => format!("{}:{tag}", self.config.repository),
            None => self.config.repository.clone(),
        };
        text.parse()
            .map_err(|e| SourceError::Config(format!("OCI reference {text:?}: {e}")))
    }

    fn error(&self, reference: &Reference, error: oci_client::errors::OciDistributionError) -> SourceError {
        use oci_client::errors::OciDistributionError as E;
        let url = reference.whole();
        match error {
            E::ImageManifestNotFoundError(_) => SourceError::NotFound {
                what: format!("OCI artifact {url}"),
            },
            E::ServerError {
                code: 404, message, ..
            } => SourceError::NotFound {
                what: format!("OCI artifact {url}: {message}"),
            },
            E::ServerError { code: 429, .. } => SourceError::RateLimited {
                url,
                retry_after: None,
            },
            E::ServerError { code, message, .. } => SourceError::Http {
                url,
                status: code,
                body: message,
            },
            E::RegistryError { envelope, .. }
                if envelope.errors.iter().any(|e| {
                    matches!(
                        e.code,
                        OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown | OciErrorCode::BlobUnknown
                    )
                }) =>
            {
                SourceError::NotFound {
                    what: format!("OCI artifact {url}: {envelope}"),
                }
            }
            E::RegistryError { envelope, .. }
                if envelope
                    .errors
                    .iter()
                    .any(|e| matches!(e.code, OciErrorCode::Toomanyrequests)) =>
            {
                SourceError::RateLimited {
                    url,
                    retry_after: None,
                }
            }
            E::DigestError(e) => SourceError::Integrity(format!("{url}: {e}")),
            // The token service refused the credentials: like a 401, not a network failure.
            E::AuthenticationFailure(message) => SourceError::Http {
                url,
                status: 401,
                body: message,
            },
            other => SourceError::Network {
                url,
                message: other.to_string(),
            },
        }
    }
}

impl ReleaseSource for OciSource {
    fn kind(&self) -> &'static str {
        "oci"
    }

    fn list_tags(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>> {
        Box::pin(async move {
            let reference = self.reference(Some("latest"))?;
            let http = self
                .http
                .as_ref()
                .map_err(|e| SourceError::Config(format!("failed to build the HTTP client: {e}")))?;
            let credentials = self.credentials(&reference).await?;
            let scheme = if self.config.plain_http { "http" } else { "https" };
            let origin = format!("{scheme}://{}/", reference.resolve_registry());
            let mut url = Url::parse(&origin)
                .and_then(|base| base.join(&format!("v2/{}/tags/list", reference.repository())))
                .map_err(|e| SourceError::Config(format!("OCI tag list URL for {origin}: {e}")))?;
            url.query_pairs_mut()
                .append_pair("n", &self.tags_per_page.to_string());
            let origin = url.origin();

            let mut tags = Vec::new();
            let mut visited = HashSet::new();
            loop {
                if visited.len() >= MAX_TAG_PAGES || !visited.insert(url.clone()) {
                    return Err(SourceError::Network {
                        url: url.to_string(),
                        message: "the registry's tag list does not end (its next-page links go round)".into(),
                    });
                }
                let response = credentials
                    .apply(http.get(url.clone()))
                    .send()
                    .await
                    .map_err(|e| SourceError::Network {
                        url: url.to_string(),
                        message: e.to_string(),
                    })?;
                let response = check_status(response, &url).await?;
                let next = next_link(response.headers());
                let page: TagPage = response.json().await.map_err(|e| SourceError::Network {
                    url: url.to_string(),
                    message: format!("not a tag list: {e}"),
                })?;
                tags.extend(page.tags.unwrap_or_default());
                let Some(next) = next else { break };
                let next = url.join(&next).map_err(|e| SourceError::Network {
                    url: url.to_string(),
                    message: format!("next-page link {next:?}: {e}"),
                })?;
                // The credentials go with every page: a link elsewhere must not receive them.
                if next.origin() != origin {
                    return Err(SourceError::Network {
                        url: url.to_string(),
                        message: format!("next-page link {next} leaves the registry"),
                    });
                }
                url = next;
            }
            Ok(tags)
        })
    }

    fn verifies(&self) -> bool {
        !self.keys.is_empty()
    }

    fn accepts(&self, provenance: Option<&Provenance>) -> bool {
        self.keys.is_empty()
            || provenance
                .filter(|p| p.verified)
                .and_then(|p| p.signer.as_deref())
                .is_some_and(|signer| self.keys.iter().any(|key| key.id() == signer))
    }

    fn download<'a>(
        &'a self,
        tag: &'a str,
        dest: &'a Path,
        pin: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Provenance, SourceError>> {
        Box::pin(async move {
            let reference = self.reference(Some(tag))?;
            let (body, _) = self
                .client
                .pull_manifest_raw(
                    &reference,
                    &self.config.auth,
                    &[OCI_IMAGE_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE],
                )
                .await
                .map_err(|e| self.error(&reference, e))?;
            // Of the bytes received (oci-client checked them against the registry's digest header, if any).
            let digest = format!("sha256:{}", hex::encode(Sha256::digest(&body)));
            if let Some(pin) = pin
                && pin != digest
            {
                return Err(SourceError::Refused {
                    refusal: Refusal::TagMoved,
                    digest: digest.clone(),
                    message: format!(
                        "{} points to {digest}, but the version is pinned to {pin}",
                        reference.whole()
                    ),
                });
            }
            let verified = if self.keys.is_empty() {
                None
            } else {
                Some(self.verify(&reference, &digest).await?)
            };
            let manifest: OciImageManifest = serde_json::from_slice(&body).map_err(|e| {
                SourceError::Integrity(format!("{}: not an image manifest: {e}", reference.whole()))
            })?;
            let pinned = reference.clone_with_digest(digest.clone());
            self.pull_files(&pinned, &manifest, dest).await?;
            if let Some(verified) = &verified {
                tracing::info!(%tag, %digest, signer = %verified.signer, layout = verified.layout.as_str(), "release signature verified");
            }
            Ok(Provenance {
                kind: Provenance::OCI.into(),
                digest: Some(digest),
                verified: verified.is_some(),
                signer: verified.as_ref().map(|v| v.signer.clone()),
                layout: verified.map(|v| v.layout.as_str().to_owned()),
            })
        })
    }
}

impl OciSource {
    /// Writes the titled layers of `manifest` (read through `reference`, by digest) into `dest`.
    async fn pull_files(
        &self,
        reference: &Reference,
        manifest: &OciImageManifest,
        dest: &Path,
    ) -> Result<(), SourceError> {
        let mut written = BTreeSet::new();
        for layer in &manifest.layers {
            let Some(title) = layer.annotations.as_ref().and_then(|a| a.get(TITLE_ANNOTATION)) else {
                continue;
            };
            if title.is_empty()
                || title.starts_with('.')
                || title.contains(['/', '\\'])
                || !written.insert(title.clone())
            {
                return Err(SourceError::Integrity(format!(
                    "{}: layer title {title:?} is not a plain, unique file name",
                    reference.whole()
                )));
            }
            let path = dest.join(title);
            let file = tokio::fs::File::create(&path)
                .await
                .map_err(|source| SourceError::Io {
                    path: path.clone(),
                    source,
                })?;
            self.client.pull_blob(reference, layer, file).await.map_err(|e| {
                match self.error(reference, e) {
                    SourceError::Integrity(message) => {
                        SourceError::Integrity(format!("file {title:?} (layer {}): {message}", layer.digest))
                    }
                    other => other,
                }
            })?;
        }
        if written.is_empty() {
            return Err(SourceError::Integrity(format!(
                "{}: the artifact has no titled files",
                reference.whole()
            )));
        }
        Ok(())
    }

    /// Finds the cosign signatures of manifest `digest` in both layouts and weighs them
    /// ([`verify::verdict`]): the first signature by a trusted key ends the search. A signature document
    /// that cannot be read (the registry failed) does not stop the others from being tried; only when none
    /// verified does it make the refusal `VerificationFailed` (worth a retry) instead of a verdict on what was
    /// read. A referrer listed but gone (a stale tag-schema entry) counts as an invalid signature.
    async fn verify(&self, reference: &Reference, digest: &str) -> Result<Verified, SourceError> {
        let subject = reference.clone_with_digest(digest.to_owned());
        let mut findings: Vec<(String, Finding)> = Vec::new();
        let mut unreadable: Vec<String> = Vec::new();
        let verified = |findings: &[(String, Finding)]| {
            findings.iter().find_map(|(_, finding)| match finding {
                Finding::Verified(verified) => Some(verified.clone()),
                _ => None,
            })
        };

        match self.bundle_referrers(&subject).await {
            Err(error) => unreadable.push(format!("bundle referrers: {error}")),
            Ok(entries) => {
                for entry in entries {
                    let place = format!("bundle {entry}");
                    let bundle_manifest = reference.clone_with_digest(entry);
                    match self
                        .client
                        .pull_image_manifest(&bundle_manifest, &self.config.auth)
                        .await
                    {
                        Ok((manifest, _)) => {
                            let finding = match manifest
                                .layers
                                .iter()
                                .find(|layer| layer.media_type == verify::BUNDLE_MEDIA_TYPE)
                            {
                                Some(layer) => match self.signature_blob(reference, layer).await {
                                    Ok(bundle) => verify::check_bundle(&bundle, digest, &self.keys),
                                    Err(message) => Finding::Invalid(message),
                                },
                                None => Finding::Invalid("the referrer holds no bundle layer".into()),
                            };
                            findings.push((place, finding));
                        }
                        Err(e) => match self.error(&bundle_manifest, e) {
                            SourceError::NotFound { .. } => findings
                                .push((place, Finding::Invalid("listed, but not in the registry".into()))),
                            other => unreadable.push(format!("{place}: {other}")),
                        },
                    }
                    if let Some(verified) = verified(&findings) {
                        return Ok(verified);
                    }
                }
            }
        }

        let legacy_tag = format!("{}.sig", digest.replace(':', "-"));
        let legacy = self.reference(Some(&legacy_tag))?;
        match self.client.pull_image_manifest(&legacy, &self.config.auth).await {
            Ok((manifest, _)) => {
                let layers = manifest
                    .layers
                    .iter()
                    .filter(|layer| layer.media_type == verify::SIMPLE_SIGNING_MEDIA_TYPE)
                    .take(MAX_SIGNATURES);
                for (index, layer) in layers.enumerate() {
                    let place = format!("{legacy_tag} layer {index}");
                    let signature = layer
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(verify::LEGACY_SIGNATURE_ANNOTATION));
                    let finding = match (signature, self.signature_blob(reference, layer).await) {
                        (None, _) => {
                            Finding::Invalid(format!("no {} annotation", verify::LEGACY_SIGNATURE_ANNOTATION))
                        }
                        (_, Err(message)) => Finding::Invalid(message),
                        (Some(signature), Ok(payload)) => {
                            verify::check_legacy(&payload, signature, digest, &self.keys)
                        }
                    };
                    findings.push((place, finding));
                    if let Some(verified) = verified(&findings) {
                        return Ok(verified);
                    }
                }
            }
            Err(e) => match self.error(&legacy, e) {
                SourceError::NotFound { .. } => {}
                other => unreadable.push(format!("{legacy_tag}: {other}")),
            },
        }

        let refused = |refusal: Refusal, found: String| SourceError::Refused {
            refusal,
            digest: digest.to_owned(),
            message: format!("{} (manifest {digest}): {found}", reference.whole()),
        };
        if !unreadable.is_empty() {
            let mut what = unreadable;
            what.extend(
                findings
                    .into_iter()
                    .map(|(place, finding)| format!("{place}: {finding}")),
            );
            return Err(refused(
                Refusal::VerificationFailed,
                format!(
                    "no signature verified, and some could not be read: {}",
                    what.join("; ")
                ),
            ));
        }
        match verify::verdict(findings) {
            Verdict::Verified(verified) => Ok(verified),
            Verdict::Unsigned => Err(refused(
                Refusal::Unsigned,
                format!("no cosign signature (looked for bundle referrers and the {legacy_tag} tag)"),
            )),
            Verdict::SignatureMismatch(found) => Err(refused(
                Refusal::SignatureMismatch,
                format!(
                    "signed, but by none of the {} trusted key(s): {found}",
                    self.keys.len()
                ),
            )),
            Verdict::InvalidSignature(found) => Err(refused(Refusal::InvalidSignature, found)),
        }
    }

    /// The manifest digests of the bundle referrers of `subject`, at most [`MAX_SIGNATURES`]: from the
    /// registry's referrers API, else from the referrers tag schema (`sha256-<hex>`). Entries of other
    /// artifact types are dropped before counting (a registry may ignore the filter asked for). oci-client
    /// reads a tag-schema tag that cannot be had as "no referrers", whatever the reason: an empty answer is
    /// therefore checked by asking for the tag once more, so that a registry that refuses (401, 403, 429) is
    /// a failure to verify, not an unsigned release.
    async fn bundle_referrers(&self, subject: &Reference) -> Result<Vec<String>, SourceError> {
        let index = self
            .client
            .pull_referrers(subject, Some(verify::BUNDLE_MEDIA_TYPE))
            .await
            .map_err(|e| self.error(subject, e))?;
        let entries: Vec<String> = index
            .manifests
            .into_iter()
            .filter(|entry| entry.artifact_type.as_deref() == Some(verify::BUNDLE_MEDIA_TYPE))
            .take(MAX_SIGNATURES)
            .map(|entry| entry.digest)
            .collect();
        if entries.is_empty() {
            let digest = subject.digest().unwrap_or_default();
            let tag_schema = self.reference(Some(&digest.replace(':', "-")))?;
            match self
                .client
                .pull_manifest_raw(&tag_schema, &self.config.auth, &[OCI_IMAGE_INDEX_MEDIA_TYPE])
                .await
            {
                Ok(_) => {}
                Err(e) => match self.error(&tag_schema, e) {
                    SourceError::NotFound { .. } => {}
                    other => return Err(other),
                },
            }
        }
        Ok(entries)
    }

    /// A signature document, read up to [`MAX_SIGNATURE_BYTES`] (and checked against its digest).
    async fn signature_blob(&self, reference: &Reference, layer: &OciDescriptor) -> Result<Vec<u8>, String> {
        if usize::try_from(layer.size).map_or(true, |size| size > MAX_SIGNATURE_BYTES) {
            return Err(format!(
                "a signature document of {} bytes is larger than allowed",
                layer.size
            ));
        }
        let mut buffer = CappedBuffer::default();
        self.client
            .pull_blob(reference, layer, &mut buffer)
            .await
            .map_err(|e| format!("layer {}: {}", layer.digest, self.error(reference, e)))?;
        Ok(buffer.bytes)
    }
}

/// An in-memory writer that refuses to grow past [`MAX_SIGNATURE_BYTES`]: a registry that sends more than
/// the descriptor said is cut off instead of filling memory.
#[derive(Default)]
struct CappedBuffer {
    bytes: Vec<u8>,
}

impl tokio::io::AsyncWrite for CappedBuffer {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.bytes.len() + buf.len() > MAX_SIGNATURE_BYTES {
            return std::task::Poll::Ready(Err(std::io::Error::other("signature document too large")));
        }
        self.bytes.extend_from_slice(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

impl OciSource {
    /// What to send with the tag-list requests: `oci-client` does the registry's token dance (a bearer
    /// challenge, or the configured access token) and keeps the token; a registry that asks for basic
    /// authentication gets the configured user and password; an open registry gets nothing.
    async fn credentials(&self, reference: &Reference) -> Result<Credentials, SourceError> {
        let token = self
            .client
            .auth(reference, &self.config.auth, oci_client::RegistryOperation::Pull)
            .await
            .map_err(|e| self.error(reference, e))?;
        Ok(match (token, &self.config.auth) {
            (Some(token), _) => Credentials::Bearer(token),
            (None, RegistryAuth::Basic(user, password)) => Credentials::Basic(user.clone(), password.clone()),
            (None, _) => Credentials::None,
        })
    }
}

enum Credentials {
    None,
    Bearer(String),
    Basic(String, String),
}

impl Credentials {
    fn apply(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match self {
            Credentials::None => request,
            Credentials::Bearer(token) => request.bearer_auth(token),
            Credentials::Basic(user, password) => request.basic_auth(user, Some(password)),
        }
    }
}

/// One page of `GET /v2/<name>/tags/list`; `tags` is `null` in some registries when there are none.
#[derive(serde::Deserialize)]
struct TagPage {
    #[serde(default)]
    tags: Option<Vec<String>>,
}

/// Maps error statuses as the `oci-client` errors are mapped: 404 is not found, 429 a rate limit.
async fn check_status(response: reqwest::Response, url: &Url) -> Result<reqwest::Response, SourceError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let url = url.to_string();
    if status == StatusCode::TOO_MANY_REQUESTS {
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        return Err(SourceError::RateLimited { url, retry_after });
    }
    let mut body = response.text().await.unwrap_or_default();
    // At a character boundary: `truncate` panics inside a multi-byte character.
    let cut = (0..=body.len().min(300))
        .rev()
        .find(|&i| body.is_char_boundary(i))
        .unwrap_or(0);
    body.truncate(cut);
    if status == StatusCode::NOT_FOUND {
        return Err(SourceError::NotFound {
            what: format!("OCI repository {url}: {body}"),
        });
    }
    Err(SourceError::Http {
        url,
        status: status.as_u16(),
        body,
    })
}

/// The target of the `rel="next"` link among the `Link` headers (RFC 8288: `<target>; rel="next"`, several
/// links per header separated by commas, `rel` possibly unquoted or holding several relation types).
fn next_link(headers: &header::HeaderMap) -> Option<String> {
    for value in headers.get_all(header::LINK) {
        let Ok(mut rest) = value.to_str() else { continue };
        while let Some(start) = rest.find('<') {
            let after = &rest[start + 1..];
            let Some(end) = after.find('>') else { break };
            let target = &after[..end];
            let remainder = &after[end + 1..];
            let params = &remainder[..remainder.find('<').unwrap_or(remainder.len())];
            let is_next = params.split(';').any(|param| {
                let Some((name, value)) = param.split_once('=') else {
                    return false;
                };
                name.trim().eq_ignore_ascii_case("rel")
                    && value
                        .trim()
                        .trim_matches('"')
                        .split_ascii_whitespace()
                        .any(|rel| rel.eq_ignore_ascii_case("next"))
            });
            if is_next {
                return Some(target.to_owned());
            }
            rest = remainder;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config(pairs: &[(&str, &str)]) -> Result<OciConfig, SourceError> {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        OciConfig::from_lookup(|k| env.get(k).cloned())
    }

    #[test]
    fn configuration_from_the_go_operators_variables() {
        let base = [
            ("OCI_REGISTRY", "registry.scs.community\n"),
            ("OCI_REPOSITORY", "registry.scs.community/kaas/cluster-stacks\n"),
        ];
        assert!(matches!(config(&base).unwrap().auth, RegistryAuth::Anonymous));
        let token = config(&[base[0], base[1], ("OCI_ACCESS_TOKEN", "abc\n")]).unwrap();
        assert!(
            matches!(&token.auth, RegistryAuth::Bearer(t) if t == "YWJj"),
            "base64 as the Go operator sends it"
        );
        assert!(!format!("{token:?}").contains("YWJj"));
        let basic = config(&[base[0], base[1], ("OCI_USERNAME", "u"), ("OCI_PASSWORD", "p")]).unwrap();
        assert!(matches!(basic.auth, RegistryAuth::Basic(..)));
        assert!(config(&[base[0], base[1], ("OCI_USERNAME", "u")]).is_err());
        assert!(
            config(&[base[0]])
                .unwrap_err()
                .to_string()
                .contains("OCI_REPOSITORY is not set")
        );
        assert!(config(&[base[0], ("OCI_REPOSITORY", "elsewhere.io/x")]).is_err());
        let plain = config(&[base[0], base[1], ("OCI_PLAIN_HTTP", "true")]).unwrap_err();
        assert!(plain.to_string().contains("only allowed for loopback"));
        let local = config(&[
            ("OCI_REGISTRY", "127.0.0.1:5000"),
            ("OCI_REPOSITORY", "127.0.0.1:5000/stacks"),
            ("OCI_PLAIN_HTTP", "true"),
        ]);
        assert!(local.unwrap().plain_http);
    }

    #[test]
    fn the_next_page_link() {
        let link = |values: &[&str]| {
            let mut headers = header::HeaderMap::new();
            for v in values {
                headers.append(header::LINK, v.parse().unwrap());
            }
            next_link(&headers)
        };
        assert_eq!(
            link(&[r#"</v2/kaas/cluster-stacks/tags/list?last=b&n=2>; rel="next""#]).as_deref(),
            Some("/v2/kaas/cluster-stacks/tags/list?last=b&n=2"),
            "the distribution registry's form"
        );
        assert_eq!(
            link(&[r#"<https://r.io/a?x=1>; rel="prev", <https://r.io/b?last=c>; rel=next"#]).as_deref(),
            Some("https://r.io/b?last=c"),
            "several links, unquoted rel"
        );
        assert_eq!(
            link(&[r#"<a>; rel="prev""#, r#"<b>; title="x"; REL="first next""#]).as_deref(),
            Some("b"),
            "several headers, several relation types"
        );
        assert_eq!(link(&[r#"<a>; rel="prev""#]), None);
        assert_eq!(link(&[]), None);
        assert_eq!(link(&["<broken; rel=next"]), None);
    }

    /// A registry stand-in whose tag list links to `link` from every page.
    async fn linking_registry(link: &'static str) -> String {
        let app = axum::Router::new().fallback(async move |uri: axum::http::Uri| {
            use axum::response::IntoResponse;
            if uri.path() == "/v2/" {
                return "{}".into_response();
            }
            let next = format!("<{}>; rel=\"next\"", link);
            ([("link", next)], r#"{"name":"stacks","tags":["a"]}"#).into_response()
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let host = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await });
        host
    }

    fn local(host: &str) -> OciSource {
        OciSource::new(
            config(&[
                ("OCI_REGISTRY", host),
                ("OCI_REPOSITORY", &format!("{host}/stacks")),
                ("OCI_PLAIN_HTTP", "true"),
            ])
            .unwrap(),
        )
    }

    #[tokio::test]
    async fn a_next_page_elsewhere_is_not_followed() {
        let host = linking_registry("http://203.0.113.1/v2/stacks/tags/list?last=a").await;
        let err = local(&host).list_tags().await.unwrap_err();
        assert!(err.to_string().contains("leaves the registry"), "{err}");
    }

    #[tokio::test]
    async fn a_tag_list_that_goes_round_is_given_up() {
        let host = linking_registry("/v2/stacks/tags/list?n=1000").await;
        let err = local(&host).list_tags().await.unwrap_err();
        assert!(err.to_string().contains("does not end"), "{err}");
    }
}
