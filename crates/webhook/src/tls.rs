//! Serving HTTPS from a certificate directory (`tls.crt`, `tls.key`, as cert-manager and the Go operator's
//! manifests lay it out). The files are watched and reloaded when they change, so rotated certificates are
//! used without a restart; until they exist the server waits and says so.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use axum_server::{Handle, tls_rustls::RustlsConfig};

const CERT_FILE: &str = "tls.crt";
const KEY_FILE: &str = "tls.key";
/// How often the certificate files are checked for changes (and for existence before the first start).
const CERT_POLL: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("failed to load the certificate from {dir}: {source}")]
    Certificate { dir: PathBuf, source: std::io::Error },
    #[error("failed to serve on {addr}: {source}")]
    Serve {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// An HTTPS server that runs until dropped or shut down.
#[derive(Debug)]
pub struct TlsServer {
    pub local_addr: SocketAddr,
    handle: Handle<SocketAddr>,
    task: tokio::task::JoinHandle<()>,
    reloader: tokio::task::JoinHandle<()>,
}

impl TlsServer {
    /// Serves `router` on `addr` with the certificate in `cert_dir`, waiting for the files to appear.
    pub async fn start(router: axum::Router, addr: SocketAddr, cert_dir: &Path) -> Result<Self, ServeError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (cert, key) = (cert_dir.join(CERT_FILE), cert_dir.join(KEY_FILE));
        let mut warned = false;
        while !(cert.is_file() && key.is_file()) {
            if !warned {
                tracing::warn!(dir = %cert_dir.display(), "waiting for {CERT_FILE} and {KEY_FILE}");
                warned = true;
            }
            tokio::time::sleep(CERT_POLL).await;
        }
        let certificate_error = |source| ServeError::Certificate {
            dir: cert_dir.to_path_buf(),
            source,
        };
        let config = RustlsConfig::from_pem_file(&cert, &key)
            .await
            .map_err(certificate_error)?;
        let handle = Handle::new();
        let server = axum_server::bind_rustls(addr, config.clone()).handle(handle.clone());
        let task = tokio::spawn(async move {
            if let Err(e) = server.serve(router.into_make_service()).await {
                tracing::error!(%addr, error = %e, "HTTPS server stopped");
            }
        });
        let local_addr = handle.listening().await.ok_or(ServeError::Serve {
            addr,
            source: std::io::Error::other("the server did not start listening"),
        })?;
        let reloader = tokio::spawn(reload_on_change(config, cert, key));
        tracing::info!(%local_addr, dir = %cert_dir.display(), "serving HTTPS");
        Ok(TlsServer {
            local_addr,
            handle,
            task,
            reloader,
        })
    }

    /// Stops accepting, lets requests in flight finish (for up to `grace`), and waits.
    pub async fn shutdown(mut self, grace: Duration) {
        self.handle.graceful_shutdown(Some(grace));
        self.reloader.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        self.handle.shutdown();
        self.reloader.abort();
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

async fn reload_on_change(config: RustlsConfig, cert: PathBuf, key: PathBuf) {
    let mut seen = (modified(&cert), modified(&key));
    loop {
        tokio::time::sleep(CERT_POLL).await;
        let now = (modified(&cert), modified(&key));
        if now == seen {
            continue;
        }
        match config.reload_from_pem_file(&cert, &key).await {
            Ok(()) => {
                tracing::info!(cert = %cert.display(), "reloaded the serving certificate");
                seen = now;
            }
            // Half-written (cert without its key, say): try again at the next tick.
            Err(e) => {
                tracing::warn!(cert = %cert.display(), error = %e, "cannot reload the serving certificate yet")
            }
        }
    }
}
