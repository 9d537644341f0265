//! Client-side request rate limiting, as client-go's `--qps` and `--burst`: a token bucket that refills at
//! `qps` tokens a second up to `burst`; each request takes one token, waiting when none is left. Applied to
//! the management client and to every workload-cluster client (the Go operator sets the flags too late for
//! its own manager; here they take effect). The operator's clients are built here, with their limits and their
//! request tally: one for good ([`limited_client`], [`observed_client`]), or again and again over one
//! connection pool ([`ClientMaker`]), each client with a bucket of its own, over a lean connection
//! (`lean_http2.rs`) when the maker has one; and a [`DirectClient`] for requests that stay open while kube's
//! clients come and go (the drift watches).

use std::{
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll, ready},
    time::Duration,
};

use http_body_util::BodyExt;
use kube::client::{Body, DynBody};
use tokio::time::{Instant, Sleep};
use tower::{BoxError, Layer, Service, ServiceExt};

use crate::{Connections, IdleConnection};

/// `--qps` and `--burst`. A `qps` of zero or less means no limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClientLimits {
    pub qps: f64,
    pub burst: u32,
}

impl ClientLimits {
    pub const UNLIMITED: ClientLimits = ClientLimits { qps: 0.0, burst: 0 };

    fn enabled(&self) -> bool {
        self.qps > 0.0 && self.qps.is_finite()
    }
}

/// Builds a client for `config` whose requests are limited by `limits` and whose connection is kept or
/// released when idle as `idle` says.
pub fn limited_client(
    config: kube::Config,
    limits: ClientLimits,
    idle: IdleConnection,
) -> Result<kube::Client, kube::Error> {
    client_with(config, limits, None, idle)
}

/// Builds a client for `config` whose requests are limited by `limits` and, when given, told to `observer`
/// as they are sent (after waiting for the rate limit). Its connection is kept while idle: such a client
/// carries watches.
pub fn observed_client(
    config: kube::Config,
    limits: ClientLimits,
    observer: Option<crate::RequestObserver>,
) -> Result<kube::Client, kube::Error> {
    client_with(config, limits, observer, IdleConnection::Kept)
}

fn client_with(
    config: kube::Config,
    limits: ClientLimits,
    observer: Option<crate::RequestObserver>,
    idle: IdleConnection,
) -> Result<kube::Client, kube::Error> {
    Ok(ClientMaker::new(config, limits, observer, idle, Connections::Pooled)?.make())
}

/// Makes clients for one config, each with its own rate limit and request channel, all sharing one connection
/// pool: a client that is not needed for a while can be dropped (its channel and the task serving it with it)
/// and another made when it is ([`crate::ClusterDiscovery::on_demand`]). For a config with a proxy (kube's own
/// builder, whose service cannot be shared) it hands out clones of one client.
pub struct ClientMaker {
    source: Source,
    limits: ClientLimits,
    observer: Option<crate::RequestObserver>,
}

enum Source {
    Shared {
        service: crate::connection::SharedService,
        /// The lean connection's service (falling back to `service`), when asked for: every client's.
        lean: Option<Arc<crate::connection::SharedService>>,
        default_namespace: String,
    },
    One(kube::Client),
}

impl std::fmt::Debug for ClientMaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientMaker")
            .field("shared", &matches!(self.source, Source::Shared { .. }))
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl ClientMaker {
    /// Clients for `config` limited by `limits`, their requests told to `observer` when given, their
    /// connections kept or released when idle as `idle` says, lean or pooled as `connections` says.
    pub fn new(
        config: kube::Config,
        limits: ClientLimits,
        observer: Option<crate::RequestObserver>,
        idle: IdleConnection,
        connections: Connections,
    ) -> Result<Self, kube::Error> {
        let source = match crate::connection::stack(config, idle, connections)? {
            crate::connection::Stack::Ours {
                service,
                lean,
                default_namespace,
            } => Source::Shared {
                service,
                lean: lean.map(Arc::new),
                default_namespace,
            },
            crate::connection::Stack::Kube(builder) => {
                Source::One(with_layers(builder, limits, observer.clone()))
            }
        };
        Ok(ClientMaker {
            source,
            limits,
            observer,
        })
    }

    /// A client: a new one over the shared connections (the lean one when there is one: the drift watches'
    /// connection carries the passes' requests too, its body-less requests and those its windows take), or a
    /// clone of the one.
    pub fn make(&self) -> kube::Client {
        match &self.source {
            Source::Shared {
                service,
                lean,
                default_namespace,
            } => with_layers(
                kube::client::ClientBuilder::new(
                    tower::util::BoxService::new(lean.as_deref().unwrap_or(service).clone()),
                    default_namespace.clone(),
                ),
                self.limits,
                self.observer.clone(),
            ),
            Source::One(client) => client.clone(),
        }
    }

    /// A [`DirectClient`] over the lean connection of these clients when they were made with one (else over
    /// their shared connection), with a bucket of its own, shared by its clones; or over the one client.
    pub fn direct(&self) -> DirectClient {
        let route = match &self.source {
            Source::Shared { service, lean, .. } => DirectRoute::Shared {
                service: lean.clone().unwrap_or_else(|| Arc::new(service.clone())),
                bucket: self
                    .limits
                    .enabled()
                    .then(|| Arc::new(Mutex::new(TokenBucket::new(self.limits, Instant::now())))),
                observer: self.observer.clone(),
            },
            Source::One(client) => DirectRoute::Kube(client.clone()),
        };
        DirectClient { route }
    }
}

/// A client whose requests go to the lean HTTP/2 connection of a [`ClientMaker`] (`lean_http2.rs`: the one its
/// kube clients ride too, without hyper's per-connection buffers and request channel),
/// through the same limit and tally, without kube's request channel in front: that channel (a tokio block of
/// 32 requests, 11 KiB, two or three once used) and the task serving it are what a kube client holds for as
/// long as it lives. For requests that stay open for minutes (the drift watches of a workload cluster), while
/// the kube clients of that cluster are made for a pass and dropped after it
/// ([`crate::ClusterDiscovery::on_demand`]). Errors are kube's, as its client
/// reports them.
#[derive(Clone)]
pub struct DirectClient {
    route: DirectRoute,
}

#[derive(Clone)]
enum DirectRoute {
    Shared {
        /// Shared by the clones: a clone of the service is a copy of its whole stack (hyper's client, the
        /// config's layers; about 600 bytes), made for each request only while it is sent.
        service: Arc<crate::connection::SharedService>,
        bucket: Option<Arc<Mutex<TokenBucket>>>,
        observer: Option<crate::RequestObserver>,
    },
    /// A config with a proxy: its one kube client.
    Kube(kube::Client),
}

impl std::fmt::Debug for DirectClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectClient")
            .field("shared", &matches!(self.route, DirectRoute::Shared { .. }))
            .finish_non_exhaustive()
    }
}

impl From<kube::Client> for DirectClient {
    /// Requests through `client` (and its channel).
    fn from(client: kube::Client) -> Self {
        DirectClient {
            route: DirectRoute::Kube(client),
        }
    }
}

impl DirectClient {
    /// Sends `request` once a token is there, and returns the response as it starts (its body streams).
    pub async fn send(
        &self,
        request: http::Request<Body>,
    ) -> Result<http::Response<Box<DynBody>>, kube::Error> {
        match &self.route {
            DirectRoute::Kube(client) => client
                .send(request)
                .await
                .map(|response| response.map(|body| Box::new(body.map_err(BoxError::from)) as Box<DynBody>)),
            DirectRoute::Shared {
                service,
                bucket,
                observer,
            } => {
                if let Some(bucket) = bucket {
                    wait_for_token(bucket).await;
                }
                if let Some(observer) = observer {
                    observer(&crate::request_tally::classify(request.method(), request.uri()));
                }
                crate::connection::SharedService::clone(service)
                    .oneshot(request)
                    .await
                    .map_err(kube_error)
            }
        }
    }

    /// Sends `request` and reads its answer as JSON; an answer of 4xx or 5xx is `kube::Error::Api`, with the
    /// server's `Status` or, when the body is not one, a status made of its text and code (as kube's client).
    pub async fn request<T: serde::de::DeserializeOwned>(
        &self,
        request: http::Request<Vec<u8>>,
    ) -> Result<T, kube::Error> {
        let response = self.send(request.map(Body::from)).await?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(kube::Error::Service)?
            .to_bytes();
        if status.is_client_error() || status.is_server_error() {
            return Err(kube::Error::Api(api_status(status, &bytes).boxed()));
        }
        serde_json::from_slice(&bytes).map_err(kube::Error::SerdeError)
    }

    /// The API server's `/version`.
    pub async fn apiserver_version(
        &self,
    ) -> Result<k8s_openapi::apimachinery::pkg::version::Info, kube::Error> {
        let request = http::Request::get("/version")
            .body(Vec::new())
            .map_err(kube::Error::HttpError)?;
        self.request(request).await
    }
}

/// Waits until `bucket` hands out a token.
async fn wait_for_token(bucket: &Mutex<TokenBucket>) {
    loop {
        let taken = bucket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(Instant::now());
        match taken {
            Ok(()) => return,
            Err(wait) => tokio::time::sleep(wait).await,
        }
    }
}

/// The error of a failed request as kube's client reports it: kube's own when a layer raised one, hyper's
/// when the connection failed, any other as a service error.
fn kube_error(error: BoxError) -> kube::Error {
    error
        .downcast::<kube::Error>()
        .map(|e| *e)
        .or_else(|error| {
            error
                .downcast::<hyper::Error>()
                .map(|e| kube::Error::HyperError(*e))
        })
        .unwrap_or_else(kube::Error::Service)
}

/// The `Status` of an answer of code `code` whose body is `body`.
fn api_status(code: http::StatusCode, body: &[u8]) -> kube::core::Status {
    serde_json::from_slice(body).unwrap_or_else(|_| {
        kube::core::Status::failure(String::from_utf8_lossy(body).trim(), "Failed to parse error data")
            .with_code(code.as_u16())
    })
}

/// `builder`'s client, its requests told to `observer` and limited by `limits`.
fn with_layers(
    builder: kube::client::ClientBuilder<crate::connection::Service>,
    limits: ClientLimits,
    observer: Option<crate::RequestObserver>,
) -> kube::Client {
    match (limits.enabled(), observer) {
        (true, Some(observer)) => builder
            .with_layer(&crate::request_tally::TallyLayer(observer))
            .with_layer(&RateLimitLayer(limits))
            .build(),
        (true, None) => builder.with_layer(&RateLimitLayer(limits)).build(),
        (false, Some(observer)) => builder
            .with_layer(&crate::request_tally::TallyLayer(observer))
            .build(),
        (false, None) => builder.build(),
    }
}

/// The bucket itself, pure: how many tokens there are at a given instant.
#[derive(Clone, Debug)]
struct TokenBucket {
    per_second: f64,
    capacity: f64,
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    /// Starts full, as client-go's limiter does.
    fn new(limits: ClientLimits, now: Instant) -> Self {
        let capacity = f64::from(limits.burst.max(1));
        TokenBucket {
            per_second: limits.qps,
            capacity,
            tokens: capacity,
            updated: now,
        }
    }

    /// Takes a token at `now`, or says how long until one is there.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.capacity);
        self.updated = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.per_second))
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct RateLimitLayer(ClientLimits);

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            bucket: TokenBucket::new(self.0, Instant::now()),
            sleep: None,
            has_token: false,
        }
    }
}

/// Waits for a token in `poll_ready`; kube's client serialises readiness and calls through its buffer, so
/// every request of the client passes here one at a time.
struct RateLimit<S> {
    inner: S,
    bucket: TokenBucket,
    sleep: Option<Pin<Box<Sleep>>>,
    has_token: bool,
}

impl<S, R> Service<R> for RateLimit<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        while !self.has_token {
            if let Some(sleep) = self.sleep.as_mut() {
                ready!(sleep.as_mut().poll(cx));
                self.sleep = None;
            }
            match self.bucket.take(Instant::now()) {
                Ok(()) => self.has_token = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> Self::Future {
        self.has_token = false;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(qps: f64, burst: u32) -> ClientLimits {
        ClientLimits { qps, burst }
    }

    #[test]
    fn a_full_bucket_allows_a_burst_then_refills_at_qps() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(limits(10.0, 3), start);
        for _ in 0..3 {
            assert_eq!(bucket.take(start), Ok(()));
        }
        let wait = bucket.take(start).unwrap_err();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-9, "{wait:?}");
        assert_eq!(bucket.take(start + Duration::from_millis(100)), Ok(()));
        // Refilling never goes beyond the burst.
        let later = start + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(bucket.take(later), Ok(()));
        }
        assert!(bucket.take(later).is_err());
    }

    #[test]
    fn zero_qps_is_no_limit_and_zero_burst_still_lets_one_through() {
        assert!(!limits(0.0, 100).enabled());
        assert!(!limits(-1.0, 100).enabled());
        let start = Instant::now();
        let mut bucket = TokenBucket::new(limits(5.0, 0), start);
        assert_eq!(bucket.take(start), Ok(()));
        assert!(bucket.take(start).is_err());
    }

    /// The service waits for tokens: with paused time, 1 + 4 calls at 2 qps and burst 1 take 2 virtual
    /// seconds, and none is let through early.
    #[tokio::test(start_paused = true)]
    async fn the_service_waits_for_tokens() {
        use tower::ServiceExt;
        let started = Instant::now();
        let mut service = RateLimitLayer(limits(2.0, 1)).layer(tower::service_fn(|_: ()| async {
            Ok::<_, std::convert::Infallible>(Instant::now())
        }));
        let mut times = Vec::new();
        for _ in 0..5 {
            times.push(service.ready().await.unwrap().call(()).await.unwrap() - started);
        }
        let expected: Vec<Duration> = (0..5).map(|i| Duration::from_millis(500 * i)).collect();
        assert_eq!(times, expected);
    }

    /// A direct client's bucket is waited on as the service's is.
    #[tokio::test(start_paused = true)]
    async fn a_direct_client_waits_for_tokens_of_its_bucket() {
        let started = Instant::now();
        let bucket = Mutex::new(TokenBucket::new(limits(2.0, 1), started));
        let mut times = Vec::new();
        for _ in 0..3 {
            wait_for_token(&bucket).await;
            times.push(Instant::now() - started);
        }
        let expected: Vec<Duration> = (0..3).map(|i| Duration::from_millis(500 * i)).collect();
        assert_eq!(times, expected);
    }

    #[test]
    fn an_error_answer_is_the_servers_status_or_one_made_of_its_text() {
        let status = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"configmaps \"x\" not found","reason":"NotFound","code":404}"#;
        let parsed = api_status(http::StatusCode::NOT_FOUND, status.as_bytes());
        assert_eq!((parsed.code, parsed.reason.as_str()), (404, "NotFound"));
        assert_eq!(parsed.message, "configmaps \"x\" not found");

        let made = api_status(http::StatusCode::BAD_GATEWAY, b"  upstream unreachable\n");
        assert_eq!(made.code, 502);
        assert_eq!(made.message, "upstream unreachable");
    }
}
