//! A stand-in for the three GitHub endpoints the operator uses, on loopback: list releases (paginated, with
//! `Link` and `ETag`), get a release by tag, and download an asset (answered, as GitHub does, by a redirect
//! to a storage host, here a second server on another port). Failures can be injected and every request is
//! recorded, so tests can check pagination, conditional requests and where the token went.

use std::{
    collections::VecDeque,
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
};

use axum::{
    Router,
    extract::{Path as UrlPath, Query, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use sha2::{Digest, Sha256};

use crate::Error;

/// A failure the stand-in answers the next API request with.
#[derive(Clone, Debug)]
pub enum Failure {
    /// `403` with `X-RateLimit-Remaining: 0` and `X-RateLimit-Reset` this many seconds ahead.
    RateLimited { reset_in_secs: u64 },
    /// Any status, e.g. `500`.
    Status(u16),
}

/// One request as the stand-in saw it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub host: &'static str,
    pub path: String,
    pub authorization: Option<String>,
    pub if_none_match: Option<String>,
    pub status: u16,
}

#[derive(Clone, Debug)]
struct Asset {
    id: u64,
    name: String,
    data: Arc<Vec<u8>>,
}

#[derive(Clone, Debug)]
struct Release {
    tag: String,
    assets: Vec<Asset>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Newest first, as GitHub lists them.
    releases: Vec<Release>,
    next_asset_id: u64,
    failures: VecDeque<Failure>,
    requests: Vec<Recorded>,
    max_page_size: usize,
    storage_url: String,
    /// Assets of these releases are served only after this delay.
    slow: std::collections::HashMap<String, std::time::Duration>,
}

#[derive(Clone, Debug, Default)]
struct Shared(Arc<Mutex<Inner>>);

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The running stand-in. Its servers stop when it is dropped.
#[derive(Debug)]
pub struct FakeGithub {
    state: Shared,
    api_url: String,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for FakeGithub {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl FakeGithub {
    /// Starts the API and the storage server on loopback ports. Pages hold at most `max_page_size`
    /// releases whatever `per_page` asks (GitHub's own cap is 100).
    pub async fn start(max_page_size: usize) -> Result<Self, Error> {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST.into(), max_page_size).await
    }

    /// [`FakeGithub::start`] on `address` (an address of this machine's that the operator reaches: loopback, or
    /// a real-node cluster's [`crate::node::RealCluster::host_address`] for an operator in a pod).
    pub async fn start_on(address: std::net::IpAddr, max_page_size: usize) -> Result<Self, Error> {
        let state = Shared::default();
        let (api_addr, api_task) = serve(address, api_router(state.clone())).await?;
        let (storage_addr, storage_task) = serve(address, storage_router(state.clone())).await?;
        {
            let mut inner = state.lock();
            inner.max_page_size = max_page_size.max(1);
            inner.storage_url = format!("http://{storage_addr}");
        }
        Ok(FakeGithub {
            state,
            api_url: format!("http://{api_addr}"),
            tasks: vec![api_task, storage_task],
        })
    }

    /// The API base URL to configure the operator with.
    pub fn api_url(&self) -> &str {
        &self.api_url
    }

    /// Publishes a release (it becomes the newest) with the given assets.
    pub fn publish(&self, tag: &str, assets: Vec<(String, Vec<u8>)>) {
        let mut inner = self.state.lock();
        let mut release = Release {
            tag: tag.to_owned(),
            assets: Vec::new(),
        };
        for (name, data) in assets {
            inner.next_asset_id += 1;
            release.assets.push(Asset {
                id: inner.next_asset_id,
                name,
                data: Arc::new(data),
            });
        }
        inner.releases.insert(0, release);
    }

    /// Publishes a release whose assets are the regular files of `dir`.
    pub fn publish_dir(&self, tag: &str, dir: &Path) -> Result<(), Error> {
        let mut assets = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_file()) {
                let data = std::fs::read(entry.path()).map_err(|e| Error::io(&entry.path(), e))?;
                assets.push((entry.file_name().to_string_lossy().into_owned(), data));
            }
        }
        assets.sort();
        self.publish(tag, assets);
        Ok(())
    }

    /// Answers the next API request with `failure`.
    pub fn fail_next(&self, failure: Failure) {
        self.state.lock().failures.push_back(failure);
    }

    /// Serves the assets of release `tag` only after `delay` (a download that takes a while, to stop an
    /// operator in the middle of one); `Duration::ZERO` makes them fast again.
    pub fn slow_down(&self, tag: &str, delay: std::time::Duration) {
        self.state.lock().slow.insert(tag.to_owned(), delay);
    }

    /// The ids of release `tag`'s assets (as they appear in `/releases/assets/{id}`).
    pub fn asset_ids(&self, tag: &str) -> Vec<u64> {
        self.state
            .lock()
            .releases
            .iter()
            .filter(|r| r.tag == tag)
            .flat_map(|r| r.assets.iter().map(|a| a.id))
            .collect()
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().requests.clone()
    }
}

async fn serve(
    address: std::net::IpAddr,
    router: Router,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), Error> {
    let where_ = format!("{address}:0");
    let listener = tokio::net::TcpListener::bind((address, 0))
        .await
        .map_err(|e| Error::io(Path::new(&where_), e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io(Path::new(&where_), e))?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok((addr, task))
}

fn api_router(state: Shared) -> Router {
    Router::new()
        .route("/repos/{org}/{repo}/releases", get(list_releases))
        .route("/repos/{org}/{repo}/releases/tags/{tag}", get(release_by_tag))
        .route("/repos/{org}/{repo}/releases/assets/{id}", get(asset))
        .with_state(state)
}

fn storage_router(state: Shared) -> Router {
    Router::new().route("/blobs/{id}", get(blob)).with_state(state)
}

fn record(state: &Shared, host: &'static str, path: String, headers: &HeaderMap, status: StatusCode) {
    let text = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    state.lock().requests.push(Recorded {
        host,
        path,
        authorization: text(header::AUTHORIZATION),
        if_none_match: text(header::IF_NONE_MATCH),
        status: status.as_u16(),
    });
}

/// GitHub's rate-limit budget for authenticated API calls.
const RATE_LIMIT: usize = 5000;

/// Adds the rate-limit headers GitHub sends with every API answer (an injected rate-limit failure has its
/// own): the budget shrinks with each API request served.
fn with_rate_limit(state: &Shared, mut response: Response) -> Response {
    if response.headers().contains_key("x-ratelimit-remaining") {
        return response;
    }
    let used = state.lock().requests.iter().filter(|r| r.host == "api").count() + 1;
    let remaining = RATE_LIMIT.saturating_sub(used);
    let headers = response.headers_mut();
    headers.insert("x-ratelimit-limit", HeaderValue::from(RATE_LIMIT));
    headers.insert("x-ratelimit-remaining", HeaderValue::from(remaining));
    response
}

/// The injected failure for this request, if any.
fn injected_failure(state: &Shared) -> Option<Response> {
    let failure = state.lock().failures.pop_front()?;
    Some(match failure {
        Failure::RateLimited { reset_in_secs } => {
            let reset = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() + reset_in_secs)
                .unwrap_or_default();
            (
                StatusCode::FORBIDDEN,
                [
                    ("x-ratelimit-remaining", "0".to_owned()),
                    ("x-ratelimit-reset", reset.to_string()),
                ],
                r#"{"message":"API rate limit exceeded"}"#,
            )
                .into_response()
        }
        Failure::Status(code) => (
            StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            "injected failure",
        )
            .into_response(),
    })
}

#[derive(serde::Deserialize)]
struct PageQuery {
    per_page: Option<usize>,
    page: Option<usize>,
}

async fn list_releases(
    State(state): State<Shared>,
    UrlPath((org, repo)): UrlPath<(String, String)>,
    Query(query): Query<PageQuery>,
    headers: HeaderMap,
) -> Response {
    let path = format!("/repos/{org}/{repo}/releases?page={}", query.page.unwrap_or(1));
    let response = match injected_failure(&state) {
        Some(failure) => failure,
        None => {
            let (body, total, size) = {
                let inner = state.lock();
                let size = query.per_page.unwrap_or(30).clamp(1, inner.max_page_size);
                let page = query.page.unwrap_or(1).max(1);
                let items: Vec<serde_json::Value> = inner
                    .releases
                    .iter()
                    .skip((page - 1) * size)
                    .take(size)
                    .map(|r| serde_json::json!({"tag_name": r.tag, "name": format!("Release {}", r.tag), "assets": []}))
                    .collect();
                (
                    serde_json::Value::Array(items).to_string(),
                    inner.releases.len(),
                    size,
                )
            };
            let etag = format!("\"{}\"", hex::encode(&Sha256::digest(body.as_bytes())[..8]));
            if headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) == Some(etag.as_str()) {
                (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response()
            } else {
                let page = query.page.unwrap_or(1).max(1);
                let mut response = (StatusCode::OK, [(header::ETAG, etag)], body).into_response();
                response
                    .headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                if page * size < total {
                    let host = headers
                        .get(header::HOST)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("127.0.0.1");
                    let next = format!(
                        "<http://{host}/repos/{org}/{repo}/releases?per_page={size}&page={}>; rel=\"next\"",
                        page + 1
                    );
                    if let Ok(value) = HeaderValue::from_str(&next) {
                        response.headers_mut().insert(header::LINK, value);
                    }
                }
                response
            }
        }
    };
    let response = with_rate_limit(&state, response);
    record(&state, "api", path, &headers, response.status());
    response
}

async fn release_by_tag(
    State(state): State<Shared>,
    UrlPath((org, repo, tag)): UrlPath<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let response = injected_failure(&state).unwrap_or_else(|| {
        let inner = state.lock();
        match inner.releases.iter().find(|r| r.tag == tag) {
            None => (StatusCode::NOT_FOUND, r#"{"message":"Not Found"}"#).into_response(),
            Some(release) => {
                let assets: Vec<serde_json::Value> = release
                    .assets
                    .iter()
                    .map(|a| {
                        serde_json::json!({"id": a.id, "name": a.name, "size": a.data.len(),
                        "url": format!("/repos/{org}/{repo}/releases/assets/{}", a.id)})
                    })
                    .collect();
                axum::Json(serde_json::json!({"tag_name": release.tag, "assets": assets})).into_response()
            }
        }
    });
    let response = with_rate_limit(&state, response);
    record(
        &state,
        "api",
        format!("/repos/{org}/{repo}/releases/tags/{tag}"),
        &headers,
        response.status(),
    );
    response
}

async fn asset(
    State(state): State<Shared>,
    UrlPath((org, repo, id)): UrlPath<(String, String, u64)>,
    headers: HeaderMap,
) -> Response {
    let wants_bytes =
        headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) == Some("application/octet-stream");
    let response = injected_failure(&state).unwrap_or_else(|| {
        if !wants_bytes {
            return (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "this stand-in serves asset bytes only",
            )
                .into_response();
        }
        let storage = state.lock().storage_url.clone();
        (
            StatusCode::FOUND,
            [(header::LOCATION, format!("{storage}/blobs/{id}"))],
        )
            .into_response()
    });
    record(
        &state,
        "api",
        format!("/repos/{org}/{repo}/releases/assets/{id}"),
        &headers,
        response.status(),
    );
    response
}

async fn blob(State(state): State<Shared>, UrlPath(id): UrlPath<u64>, headers: HeaderMap) -> Response {
    let (data, delay) = {
        let inner = state.lock();
        let found = inner.releases.iter().find_map(|r| {
            r.assets
                .iter()
                .find(|a| a.id == id)
                .map(|a| (r.tag.clone(), a.data.clone()))
        });
        match found {
            Some((tag, data)) => (Some(data), inner.slow.get(&tag).copied().unwrap_or_default()),
            None => (None, std::time::Duration::ZERO),
        }
    };
    tokio::time::sleep(delay).await;
    let response = match data {
        Some(data) => (StatusCode::OK, data.as_ref().clone()).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    };
    record(
        &state,
        "storage",
        format!("/blobs/{id}"),
        &headers,
        response.status(),
    );
    response
}
