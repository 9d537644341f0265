//! GitHub releases as a release source (github.com, GitHub Enterprise, or a stand-in on loopback).
//!
//! Lists every page of releases by `tag_name` (the Go operator reads the first 30 titles), with one ETag
//! per page so that polling an unchanged repository costs only `304`s. Assets are fetched through the asset
//! API; the redirect to the storage host is followed by hand, without the token unless it stays on the API's
//! own origin. Rate limits (`Retry-After`, `X-RateLimit-Reset`) become [`SourceError::RateLimited`].
//!
//! GitHub releases are protected by TLS only: the stacks publish no checksum or signature asset (their
//! `hashes.json` holds source hashes, not asset digests), so there is nothing to verify against. When the
//! operator is told to verify signatures (`--verify-key`), every GitHub release is therefore refused as
//! unsigned rather than applied unchecked, and a digest pin (an OCI manifest digest) is refused as a
//! configuration error.

use std::{
    collections::HashMap,
    path::Path,
    sync::{
        Mutex,
        atomic::{AtomicI64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use futures::{StreamExt, future::BoxFuture};
use reqwest::{StatusCode, header};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use url::Url;

use super::{Provenance, Refusal, ReleaseSource, SourceError};

/// The public GitHub API.
pub const DEFAULT_API_URL: &str = "https://api.github.com";
const PAGE_SIZE: u32 = 100;
const MAX_PAGES: usize = 100;
const MAX_REDIRECTS: usize = 5;
const USER_AGENT: &str = "cluster-stack-operator";

/// Where the releases are and how to authenticate.
#[derive(Clone)]
pub struct GithubConfig {
    pub api_url: Url,
    pub org: String,
    pub repo: String,
    pub token: Option<String>,
}

impl std::fmt::Debug for GithubConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GithubConfig")
            .field("api_url", &self.api_url.as_str())
            .field("org", &self.org)
            .field("repo", &self.repo)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl GithubConfig {
    /// From the Go operator's variables (`GIT_PROVIDER=github`, `GIT_ORG_NAME`, `GIT_REPOSITORY_NAME`,
    /// optional `GIT_ACCESS_TOKEN`, trailing newlines trimmed) and `api_url`.
    pub fn from_env(api_url: &str) -> Result<Self, SourceError> {
        Self::from_lookup(api_url, |key| std::env::var(key).ok())
    }

    pub fn from_lookup(api_url: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<Self, SourceError> {
        let env = super::Env(lookup);
        let provider = env.required("GIT_PROVIDER")?;
        if provider != "github" {
            return Err(SourceError::Config(format!(
                "only github is supported as GIT_PROVIDER, not {provider:?}"
            )));
        }
        let api_url = Url::parse(api_url.trim_end_matches('/'))
            .map_err(|e| SourceError::Config(format!("GitHub API URL {api_url:?}: {e}")))?;
        Ok(GithubConfig {
            api_url,
            org: env.required("GIT_ORG_NAME")?,
            repo: env.required("GIT_REPOSITORY_NAME")?,
            token: env.get("GIT_ACCESS_TOKEN"),
        })
    }
}

/// One listing page as last seen, for conditional requests.
#[derive(Clone, Debug)]
struct CachedPage {
    etag: String,
    tags: Vec<String>,
    next: Option<Url>,
}

#[derive(Debug)]
pub struct GithubSource {
    config: GithubConfig,
    client: reqwest::Client,
    pages: Mutex<HashMap<String, CachedPage>>,
    rate_limit_remaining: AtomicI64,
    /// `--verify-key` was given: nothing here can be verified (see the module doc).
    requires_signatures: bool,
}

#[derive(Deserialize)]
struct ReleaseJson {
    tag_name: Option<String>,
    #[serde(default)]
    assets: Vec<AssetJson>,
}

#[derive(Deserialize)]
struct AssetJson {
    id: u64,
    name: String,
    #[serde(default)]
    size: u64,
}

impl GithubSource {
    pub fn new(config: GithubConfig) -> Result<Self, SourceError> {
        crate::source::install_crypto_provider();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(USER_AGENT)
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(300))
            .build()
            .map_err(|e| SourceError::Config(format!("failed to build the HTTP client: {e}")))?;
        Ok(GithubSource {
            config,
            client,
            pages: Mutex::default(),
            rate_limit_remaining: AtomicI64::new(-1),
            requires_signatures: false,
        })
    }

    /// Refuses every release as unsigned when `required` (see the module doc).
    pub fn requiring_signatures(mut self, required: bool) -> Self {
        self.requires_signatures = required;
        self
    }

    fn repo_url(&self, rest: &str) -> Result<Url, SourceError> {
        let base = self.config.api_url.as_str().trim_end_matches('/');
        let url = format!("{base}/repos/{}/{}/{rest}", self.config.org, self.config.repo);
        Url::parse(&url).map_err(|e| SourceError::Config(format!("{url}: {e}")))
    }

    fn api_request(&self, url: Url) -> reqwest::RequestBuilder {
        let request = self
            .client
            .get(url)
            .header(header::ACCEPT, "application/vnd.github+json")
            .header("X-GitHub-Api-Version", "2022-11-28");
        self.authorize(request)
    }

    fn authorize(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.config.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        url: &Url,
    ) -> Result<reqwest::Response, SourceError> {
        let response = request.send().await.map_err(|e| SourceError::Network {
            url: url.to_string(),
            message: error_chain(&e),
        })?;
        if let Some(remaining) = header_i64(&response, "x-ratelimit-remaining") {
            self.rate_limit_remaining.store(remaining, Ordering::Relaxed);
        }
        Ok(response)
    }

    async fn fetch_page(&self, url: &Url) -> Result<CachedPage, SourceError> {
        let cached = self
            .pages
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(url.as_str())
            .cloned();
        let mut request = self.api_request(url.clone());
        if let Some(page) = &cached {
            request = request.header(header::IF_NONE_MATCH, &page.etag);
        }
        let response = self.send(request, url).await?;
        if response.status() == StatusCode::NOT_MODIFIED
            && let Some(page) = cached
        {
            return Ok(page);
        }
        let response = check_status(response, url).await?;
        let etag = response
            .headers()
            .get(header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let next = next_link(&response, url);
        let releases: Vec<ReleaseJson> = response.json().await.map_err(|e| SourceError::Network {
            url: url.to_string(),
            message: format!("unexpected answer: {e}"),
        })?;
        let page = CachedPage {
            etag: etag.clone().unwrap_or_default(),
            tags: releases.into_iter().filter_map(|r| r.tag_name).collect(),
            next,
        };
        if etag.is_some() {
            self.pages
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(url.to_string(), page.clone());
        }
        Ok(page)
    }

    async fn download_asset(&self, asset: &AssetJson, dest: &Path) -> Result<(), SourceError> {
        let name = &asset.name;
        if name.is_empty() || name.starts_with('.') || name.contains(['/', '\\']) {
            return Err(SourceError::Integrity(format!(
                "release asset name {name:?} is not a plain file name"
            )));
        }
        let mut url = self.repo_url(&format!("releases/assets/{}", asset.id))?;
        let mut response = None;
        for _ in 0..=MAX_REDIRECTS {
            // The token goes only to the API's own origin, never to the storage host a redirect names.
            let same_origin = url.origin() == self.config.api_url.origin();
            let mut request = self
                .client
                .get(url.clone())
                .header(header::ACCEPT, "application/octet-stream");
            if same_origin {
                request = self.authorize(request);
            }
            let answer = self.send(request, &url).await?;
            if answer.status().is_redirection() {
                let location = answer
                    .headers()
                    .get(header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| SourceError::Network {
                        url: url.to_string(),
                        message: "redirect without Location".into(),
                    })?;
                url = url.join(location).map_err(|e| SourceError::Network {
                    url: url.to_string(),
                    message: format!("bad redirect: {e}"),
                })?;
                continue;
            }
            response = Some(check_status(answer, &url).await?);
            break;
        }
        let response = response.ok_or_else(|| SourceError::Network {
            url: url.to_string(),
            message: format!("more than {MAX_REDIRECTS} redirects"),
        })?;

        let path = dest.join(name);
        let io_err = |source| SourceError::Io {
            path: path.clone(),
            source,
        };
        let mut file = tokio::fs::File::create(&path).await.map_err(io_err)?;
        let mut written = 0u64;
        let mut body = response.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| SourceError::Network {
                url: url.to_string(),
                message: error_chain(&e),
            })?;
            written += chunk.len() as u64;
            file.write_all(&chunk).await.map_err(io_err)?;
        }
        file.flush().await.map_err(io_err)?;
        if asset.size > 0 && written != asset.size {
            return Err(SourceError::Integrity(format!(
                "asset {name}: got {written} bytes, the release says {}",
                asset.size
            )));
        }
        Ok(())
    }
}

impl ReleaseSource for GithubSource {
    fn rate_limit_remaining(&self) -> Option<i64> {
        let remaining = self.rate_limit_remaining.load(Ordering::Relaxed);
        (remaining >= 0).then_some(remaining)
    }

    fn kind(&self) -> &'static str {
        "github"
    }

    fn list_tags(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>> {
        Box::pin(async move {
            let mut url = Some(self.repo_url(&format!("releases?per_page={PAGE_SIZE}"))?);
            let mut tags = Vec::new();
            let mut pages = 0;
            while let Some(current) = url.take() {
                pages += 1;
                if pages > MAX_PAGES {
                    tracing::warn!(
                        max = MAX_PAGES,
                        "stopping the release listing after too many pages"
                    );
                    break;
                }
                let page = self.fetch_page(&current).await?;
                tags.extend(page.tags);
                url = page.next;
            }
            Ok(tags)
        })
    }

    fn verifies(&self) -> bool {
        self.requires_signatures
    }

    fn accepts(&self, _provenance: Option<&Provenance>) -> bool {
        !self.requires_signatures
    }

    fn download<'a>(
        &'a self,
        tag: &'a str,
        dest: &'a Path,
        pin: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Provenance, SourceError>> {
        Box::pin(async move {
            if let Some(pin) = pin {
                return Err(SourceError::Config(format!(
                    "release {tag} is pinned to {pin}, an OCI manifest digest: GitHub releases cannot be pinned"
                )));
            }
            if self.requires_signatures {
                return Err(SourceError::Refused {
                    refusal: Refusal::Unsigned,
                    digest: String::new(),
                    message: format!(
                        "GitHub release {tag} carries no signature (GitHub releases are verified by TLS only); \
                         signed releases need the OCI source"
                    ),
                });
            }
            let url = self.repo_url(&format!("releases/tags/{tag}"))?;
            let response = self.send(self.api_request(url.clone()), &url).await?;
            if response.status() == StatusCode::NOT_FOUND {
                return Err(SourceError::NotFound {
                    what: format!("GitHub release {tag}"),
                });
            }
            let release: ReleaseJson =
                check_status(response, &url)
                    .await?
                    .json()
                    .await
                    .map_err(|e| SourceError::Network {
                        url: url.to_string(),
                        message: format!("unexpected answer: {e}"),
                    })?;
            for asset in &release.assets {
                self.download_asset(asset, dest).await?;
            }
            Ok(Provenance::of_kind(Provenance::GITHUB))
        })
    }
}

/// Maps error statuses to errors; rate limits become [`SourceError::RateLimited`].
async fn check_status(response: reqwest::Response, url: &Url) -> Result<reqwest::Response, SourceError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let limited = status == StatusCode::TOO_MANY_REQUESTS
        || (status == StatusCode::FORBIDDEN
            && (response.headers().contains_key(header::RETRY_AFTER)
                || header_i64(&response, "x-ratelimit-remaining") == Some(0)));
    if limited {
        let retry_after = header_i64(&response, header::RETRY_AFTER.as_str())
            .map(|s| Duration::from_secs(s.max(0) as u64))
            .or_else(|| {
                let reset = header_i64(&response, "x-ratelimit-reset")?;
                let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs() as i64;
                Some(Duration::from_secs((reset - now).max(1) as u64))
            });
        return Err(SourceError::RateLimited {
            url: url.to_string(),
            retry_after,
        });
    }
    let body = clipped(response.text().await.unwrap_or_default(), 300);
    Err(SourceError::Http {
        url: url.to_string(),
        status: status.as_u16(),
        body,
    })
}

fn header_i64(response: &reqwest::Response, name: &str) -> Option<i64> {
    response.headers().get(name)?.to_str().ok()?.trim().parse().ok()
}

/// The `rel="next"` target of a `Link` header.
fn next_link(response: &reqwest::Response, base: &Url) -> Option<Url> {
    let link = response.headers().get(header::LINK)?.to_str().ok()?;
    link.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        params.split(';').any(|p| p.trim() == r#"rel="next""#).then(|| {
            let target = target.trim().trim_start_matches('<').trim_end_matches('>');
            base.join(target).ok()
        })?
    })
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// At most `max` bytes of `text`, cut at a character boundary (`String::truncate` panics inside a multi-byte
/// character, and an error page may be in any language).
fn clipped(mut text: String, max: usize) -> String {
    let cut = (0..=text.len().min(max))
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0);
    text.truncate(cut);
    text
}

#[cfg(test)]
mod tests {
    #[test]
    fn error_bodies_are_clipped_at_a_character_boundary() {
        assert_eq!(super::clipped("abc".into(), 300), "abc");
        assert_eq!(
            super::clipped("ab€".into(), 3),
            "ab",
            "the euro sign's 3 bytes are not cut"
        );
        assert_eq!(super::clipped("€€".into(), 4), "€");
        assert_eq!(super::clipped("x".repeat(400), 300).len(), 300);
    }

    use super::*;

    #[test]
    fn configuration_from_the_go_operators_variables() {
        let env: HashMap<&str, &str> = [
            ("GIT_PROVIDER", "github\n"),
            ("GIT_ORG_NAME", "SovereignCloudStack\n"),
            ("GIT_REPOSITORY_NAME", "cluster-stacks"),
            ("GIT_ACCESS_TOKEN", "secret\r\n"),
        ]
        .into();
        let config =
            GithubConfig::from_lookup(DEFAULT_API_URL, |k| env.get(k).map(|v| v.to_string())).unwrap();
        assert_eq!(
            (config.org.as_str(), config.repo.as_str()),
            ("SovereignCloudStack", "cluster-stacks")
        );
        assert_eq!(config.token.as_deref(), Some("secret"));
        assert!(
            !format!("{config:?}").contains("secret"),
            "the token never shows in debug output"
        );

        let missing = GithubConfig::from_lookup(DEFAULT_API_URL, |k| {
            (k == "GIT_PROVIDER").then(|| "github".into())
        });
        assert!(
            missing
                .unwrap_err()
                .to_string()
                .contains("GIT_ORG_NAME is not set")
        );
        let gitlab = GithubConfig::from_lookup(DEFAULT_API_URL, |_| Some("gitlab".into()));
        assert!(gitlab.unwrap_err().to_string().contains("only github"));
    }
}
