//! The plain-HTTP endpoints of `cso run`: `/metrics` (Prometheus text format) and the probes `/healthz` and
//! `/readyz`, on the addresses of `--metrics-bind-address` and `--health-probe-bind-address`; and the log
//! lines that say when the API server stops and starts answering again.
//!
//! `/readyz` means "this process serves": it answers 200 as soon as the endpoints are up and does not
//! depend on the API server. A replica that cannot reach the API server gains nothing by turning unready:
//! readiness only decides whether the webhook Service sends it admission requests, and those come from the
//! API server; in an outage every replica would turn unready at once and the webhooks would fail even for
//! the API servers that can still reach them. Liveness (`/healthz`) must not depend on it either: a restart
//! cannot end an outage and throws the watch caches away. An outage is said in the log instead
//! ([`watch_api_server`]).

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

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

/// How often [`watch_api_server`] asks the API server whether it answers.
pub const API_PROBE_INTERVAL: Duration = Duration::from_secs(10);
/// How long one such question may take.
const API_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Asks the API server for its version; the error says why it did not answer.
pub async fn probe_api_server(client: &kube::Client, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, client.apiserver_version()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

/// Whether the API server answered, as the probes saw it.
#[derive(Debug, Default)]
pub struct Reachability {
    /// `None` before the first probe; `Some(None)` while it answers; `Some(Some(since))` while it does not.
    state: Option<Option<Instant>>,
}

/// A change worth a log line.
#[derive(Debug, PartialEq, Eq)]
pub enum ReachabilityChange {
    /// It stopped answering (or did not answer the first probe).
    Lost(String),
    /// It answers again after not answering for this long.
    Regained(Duration),
}

impl Reachability {
    /// Records one probe `result` made at `now`; returns what changed, if anything. A first probe that
    /// succeeds is no news.
    pub fn observe(&mut self, result: Result<(), String>, now: Instant) -> Option<ReachabilityChange> {
        let (next, change) = match (self.state, result) {
            (Some(Some(since)), Ok(())) => (None, Some(ReachabilityChange::Regained(now - since))),
            (_, Ok(())) => (None, None),
            (Some(Some(since)), Err(_)) => (Some(since), None),
            (_, Err(error)) => (Some(now), Some(ReachabilityChange::Lost(error))),
        };
        self.state = Some(next);
        change
    }
}

/// Probes the API server every `every` for as long as the process runs and logs when it stops answering
/// (warning, with the error) and when it answers again (with how long it did not). Readiness does not
/// follow it (see the module documentation).
pub async fn watch_api_server(client: kube::Client, every: Duration) {
    let mut reachability = Reachability::default();
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let result = probe_api_server(&client, API_PROBE_TIMEOUT.min(every)).await;
        match reachability.observe(result, Instant::now()) {
            Some(ReachabilityChange::Lost(error)) => tracing::warn!(%error,
                "the API server does not answer; the controllers wait and retry, the probes stay ready"),
            Some(ReachabilityChange::Regained(after)) => {
                tracing::info!(unreachable_for = ?after, "the API server answers again")
            }
            None => {}
        }
    }
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
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn an_outage_is_said_when_it_starts_and_when_it_ends() {
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        let mut r = Reachability::default();
        assert_eq!(r.observe(Ok(()), at(0)), None, "a first good probe is no news");
        assert_eq!(r.observe(Ok(()), at(10)), None);
        assert_eq!(
            r.observe(Err("connection refused".into()), at(20)),
            Some(ReachabilityChange::Lost("connection refused".into()))
        );
        assert_eq!(
            r.observe(Err("timed out".into()), at(30)),
            None,
            "said once per outage"
        );
        assert_eq!(
            r.observe(Ok(()), at(45)),
            Some(ReachabilityChange::Regained(Duration::from_secs(25)))
        );
        assert_eq!(r.observe(Ok(()), at(55)), None);

        let mut from_start = Reachability::default();
        assert_eq!(
            from_start.observe(Err("refused".into()), at(0)),
            Some(ReachabilityChange::Lost("refused".into())),
            "unreachable from the start is said at once"
        );
    }

    #[tokio::test]
    async fn a_probe_of_an_api_server_that_is_not_there_fails_with_the_reason() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let error = probe_api_server(&client, Duration::from_secs(5))
            .await
            .unwrap_err();
        assert!(!error.is_empty());
    }

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
