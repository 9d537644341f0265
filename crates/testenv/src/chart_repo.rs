//! A Helm chart repository on loopback: serves the `<name>-<version>.tgz` archives of a directory and an
//! `index.yaml` generated from them (name, version, sha256 `digest`, a relative URL), as `helm repo index`
//! writes one. It can be stopped and started again on the same address (an unreachable repository, then a
//! repository that is back), hang up on every connection while still counting them (a repository that is
//! down, seen from its clients, whose attempts a test counts), require HTTP basic authentication (a private
//! mirror), and be told to publish a wrong digest for one archive.
//!
//! Name and version come from the file name (`metrics-server-3.13.0.tgz`: the name ends at the first `-`
//! followed by a digit), which is how the charts of a repository are named. Every answer carries
//! `Connection: close`, so that a client's pooled connection does not outlive a stop.

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use axum::{
    Router,
    extract::{Path as UrlPath, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use sha2::{Digest, Sha256};

use crate::Error;

#[derive(Debug, Default)]
struct Inner {
    /// Digests published instead of the real ones, by file name.
    wrong_digests: HashMap<String, String>,
    /// Requests served, by path; connections hung up on as [`HUNG_UP`].
    requests: Vec<String>,
}

/// How [`ChartRepo::requests`] lists a connection the repository hung up on.
pub const HUNG_UP: &str = "(hung up)";

#[derive(Clone, Debug)]
struct Shared {
    dir: PathBuf,
    inner: Arc<Mutex<Inner>>,
    /// `Authorization` every request must carry, when the repository is private.
    authorization: Option<String>,
}

impl Shared {
    fn record(&self, request: String) {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .requests
            .push(request);
    }

    /// `None` when the request may be served, else the answer: 401 with a challenge, as a private repository
    /// answers.
    fn refuse(&self, headers: &header::HeaderMap) -> Option<Response> {
        let wanted = self.authorization.as_deref()?;
        let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        (given != Some(wanted)).then(|| {
            close((
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Basic realm=\"charts\"")],
                "unauthorized",
            ))
        })
    }
}

/// A running chart repository. Dropping it stops it.
#[derive(Debug)]
pub struct ChartRepo {
    shared: Shared,
    addr: SocketAddr,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for ChartRepo {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl ChartRepo {
    /// Serves the chart archives of `dir` on a free loopback port.
    pub async fn start(dir: &Path) -> Result<Self, Error> {
        Self::start_with(dir, None).await
    }

    /// A private repository: every request needs HTTP basic authentication as `user:password`, else 401.
    pub async fn start_with_basic_auth(dir: &Path, user: &str, password: &str) -> Result<Self, Error> {
        use base64::Engine as _;
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        Self::start_with(dir, Some(format!("Basic {token}"))).await
    }

    async fn start_with(dir: &Path, authorization: Option<String>) -> Result<Self, Error> {
        let shared = Shared {
            dir: dir.to_path_buf(),
            inner: Arc::default(),
            authorization,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| Error::io(Path::new("127.0.0.1:0"), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io(Path::new("127.0.0.1:0"), e))?;
        let mut repo = ChartRepo {
            shared,
            addr,
            task: None,
        };
        repo.serve(listener);
        Ok(repo)
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let router = Router::new()
            .route("/index.yaml", get(index))
            .route("/{file}", get(archive))
            .with_state(self.shared.clone());
        self.task = Some(tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        }));
    }

    /// `http://127.0.0.1:<port>/`, the repository URL.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Stops serving: connections to the address are refused until [`ChartRepo::restart`].
    pub async fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Stops serving HTTP and, in its place, accepts every connection and closes it at once, without an
    /// answer: the repository is down as its clients see it, and each attempt is counted in
    /// [`ChartRepo::requests`] as [`HUNG_UP`]. [`ChartRepo::restart`] serves again.
    pub async fn hang_up(&mut self) -> Result<(), Error> {
        self.stop().await;
        let listener = tokio::net::TcpListener::bind(self.addr)
            .await
            .map_err(|e| Error::io(Path::new(&self.addr.to_string()), e))?;
        let shared = self.shared.clone();
        self.task = Some(tokio::spawn(async move {
            while let Ok((connection, _)) = listener.accept().await {
                shared.record(HUNG_UP.to_owned());
                drop(connection);
            }
        }));
        Ok(())
    }

    /// Serves again on the same address.
    pub async fn restart(&mut self) -> Result<(), Error> {
        self.stop().await;
        let listener = tokio::net::TcpListener::bind(self.addr)
            .await
            .map_err(|e| Error::io(Path::new(&self.addr.to_string()), e))?;
        self.serve(listener);
        Ok(())
    }

    /// Publishes `digest` for the archive `file` in the index instead of its real sha256.
    pub fn publish_wrong_digest(&self, file: &str, digest: &str) {
        self.lock()
            .wrong_digests
            .insert(file.to_owned(), digest.to_owned());
    }

    /// Paths requested so far.
    pub fn requests(&self) -> Vec<String> {
        self.lock().requests.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// `metrics-server-3.13.0.tgz` → (`metrics-server`, `3.13.0`).
pub fn name_and_version(file: &str) -> Option<(&str, &str)> {
    let stem = file.strip_suffix(".tgz")?;
    let split = stem
        .char_indices()
        .find(|&(i, c)| c == '-' && stem[i + 1..].starts_with(|d: char| d.is_ascii_digit()))?
        .0;
    Some((&stem[..split], &stem[split + 1..]))
}

fn close(response: impl IntoResponse) -> Response {
    let mut response = response.into_response();
    response
        .headers_mut()
        .insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    response
}

async fn index(State(shared): State<Shared>, headers: header::HeaderMap) -> Response {
    shared.record("/index.yaml".into());
    if let Some(refused) = shared.refuse(&headers) {
        return refused;
    }
    let mut files: Vec<String> = match std::fs::read_dir(&shared.dir) {
        Ok(entries) => entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| n.ends_with(".tgz"))
            .collect(),
        Err(e) => return close((StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    };
    files.sort();
    let wrong = shared
        .inner
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .wrong_digests
        .clone();
    let mut entries: std::collections::BTreeMap<String, Vec<serde_json::Value>> = Default::default();
    for file in &files {
        let Some((name, version)) = name_and_version(file) else {
            continue;
        };
        let digest = match wrong.get(file) {
            Some(digest) => digest.clone(),
            None => match std::fs::read(shared.dir.join(file)) {
                Ok(data) => hex::encode(Sha256::digest(&data)),
                Err(e) => return close((StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
            },
        };
        entries
            .entry(name.to_owned())
            .or_default()
            .push(serde_json::json!({
                "apiVersion": "v2",
                "name": name,
                "version": version,
                "digest": digest,
                "urls": [file],
            }));
    }
    // JSON is YAML: what `helm repo index` writes, without its formatting.
    let body = serde_json::json!({"apiVersion": "v1", "entries": entries}).to_string();
    close(([(header::CONTENT_TYPE, "application/x-yaml")], body))
}

async fn archive(
    State(shared): State<Shared>,
    UrlPath(file): UrlPath<String>,
    headers: header::HeaderMap,
) -> Response {
    shared.record(format!("/{file}"));
    if let Some(refused) = shared.refuse(&headers) {
        return refused;
    }
    if file.contains(['/', '\\']) || file.starts_with('.') || !file.ends_with(".tgz") {
        return close(StatusCode::NOT_FOUND);
    }
    match std::fs::read(shared.dir.join(&file)) {
        Ok(data) => close(([(header::CONTENT_TYPE, "application/gzip")], data)),
        Err(_) => close(StatusCode::NOT_FOUND),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test: a failed unwrap is a failed test")]

    use super::*;

    #[test]
    fn names_and_versions_from_file_names() {
        assert_eq!(
            name_and_version("metrics-server-3.13.0.tgz"),
            Some(("metrics-server", "3.13.0"))
        );
        assert_eq!(
            name_and_version("openstack-cloud-controller-manager-2.35.0.tgz"),
            Some(("openstack-cloud-controller-manager", "2.35.0"))
        );
        assert_eq!(
            name_and_version("cilium-1.19.1-rc.1.tgz"),
            Some(("cilium", "1.19.1-rc.1"))
        );
        assert_eq!(name_and_version("README.md"), None);
    }

    #[tokio::test]
    async fn serves_an_index_and_stops() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("demo-1.2.3.tgz"), b"not really a chart").unwrap();
        let mut repo = ChartRepo::start(dir.path()).await.unwrap();
        crate::install_crypto_provider();
        let client = reqwest::Client::new();
        let index = client
            .get(format!("{}index.yaml", repo.url()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let index: serde_json::Value = serde_json::from_str(&index).unwrap();
        assert_eq!(
            index["entries"]["demo"][0]["digest"],
            hex::encode(Sha256::digest(b"not really a chart"))
        );
        let data = client
            .get(format!("{}demo-1.2.3.tgz", repo.url()))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(&data[..], b"not really a chart");
        repo.stop().await;
        assert!(
            client
                .get(format!("{}index.yaml", repo.url()))
                .send()
                .await
                .is_err()
        );
        repo.restart().await.unwrap();
        assert!(
            client
                .get(format!("{}index.yaml", repo.url()))
                .send()
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn private_and_hung_up() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("demo-1.2.3.tgz"), b"chart").unwrap();
        let mut repo = ChartRepo::start_with_basic_auth(dir.path(), "u", "p")
            .await
            .unwrap();
        crate::install_crypto_provider();
        let client = reqwest::Client::new();
        let index = format!("{}index.yaml", repo.url());
        let status = |r: reqwest::Response| r.status().as_u16();
        assert_eq!(status(client.get(&index).send().await.unwrap()), 401);
        let wrong = client
            .get(&index)
            .basic_auth("u", Some("x"))
            .send()
            .await
            .unwrap();
        assert_eq!(status(wrong), 401);
        let right = client
            .get(&index)
            .basic_auth("u", Some("p"))
            .send()
            .await
            .unwrap();
        assert_eq!(status(right), 200);

        repo.hang_up().await.unwrap();
        assert!(client.get(&index).send().await.is_err());
        assert_eq!(
            repo.requests().iter().filter(|r| *r == HUNG_UP).count(),
            1,
            "{:?}",
            repo.requests()
        );
        repo.restart().await.unwrap();
        let back = client
            .get(&index)
            .basic_auth("u", Some("p"))
            .send()
            .await
            .unwrap();
        assert_eq!(status(back), 200);
    }
}
