//! The plain-HTTP endpoints of `cso run`: `/metrics` (Prometheus text format) and the probes `/healthz` and
//! `/readyz`, on the addresses of `--metrics-bind-address` and `--health-probe-bind-address`.

use std::{net::SocketAddr, sync::Arc};

use axum::{Router, http::header, response::IntoResponse, routing::get};
use cso_controller::Metrics;

/// A Go-style listen address: `:8080` is every interface; `0` turns the endpoint off (as in
/// controller-runtime).
pub fn bind_address(flag: &str) -> Result<Option<SocketAddr>, String> {
    if flag == "0" {
        return Ok(None);
    }
    let full = if flag.starts_with(':') {
        format!("0.0.0.0{flag}")
    } else {
        flag.to_owned()
    };
    full.parse()
        .map(Some)
        .map_err(|e| format!("invalid listen address {flag:?}: {e}"))
}

pub fn metrics_router(metrics: Arc<Metrics>) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let metrics = metrics.clone();
            async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    metrics.encode(),
                )
                    .into_response()
            }
        }),
    )
}

pub fn probes_router() -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
}

/// Serves `router` on `addr` until the process ends.
pub async fn serve(addr: SocketAddr, router: Router) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving HTTP");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(%addr, error = %e, "HTTP endpoint stopped");
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_addresses() {
        assert_eq!(
            bind_address(":8080").unwrap(),
            Some("0.0.0.0:8080".parse().unwrap())
        );
        assert_eq!(
            bind_address("127.0.0.1:9440").unwrap(),
            Some("127.0.0.1:9440".parse().unwrap())
        );
        assert_eq!(bind_address("0").unwrap(), None);
        assert!(bind_address("localhost").is_err());
    }
}
