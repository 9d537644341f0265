//! How the operator's clients reach an API server: over HTTP/2 when the server offers it (ALPN `h2`, as every
//! kube-apiserver does), so that every request and every watch of one client shares one TCP and TLS
//! connection. kube's default client speaks HTTP/1.1 only, where each request in flight and each open watch
//! holds a connection of its own; an operator that watches what it applied in a thousand workload clusters
//! would hold tens of thousands of them.
//!
//! The service around the connection is the one kube builds (base URI, authentication, the config's extra
//! headers, its retry policy when the config asks for it, its connect and write timeouts), assembled here
//! from the config's own parts, with two differences: the connector, and the config's read timeout, which
//! bounds the wait for each response (its headers; a watch's come at once) instead of every read of the
//! connection. A read timeout on a connection that carries watches would end it whenever they are quiet;
//! this way one client serves requests and watches alike. A config with a proxy is left to kube's builder.
//! HTTP/2 keep-alive pings find a dead peer of a quiet connection (a watch can stay quiet for minutes). Whether a
//! connection no request is using stays open is the caller's choice ([`IdleConnection`]), and with it whether
//! TLS sessions are kept for resuming (a few, see [`TLS_SESSIONS_KEPT`], for a kept connection only). Beside
//! hyper's client, the same connector and layers serve a lean HTTP/2 client ([`crate::lean_http2`]) when asked
//! for ([`Connections::Lean`]): one connection kept while it is used, for the drift watches and the passes'
//! requests beside them, hyper's pool taking only what it cannot carry.

use std::time::Duration;

use http::{Request, Response};
use http_body_util::BodyExt;
use hyper_timeout::TimeoutConnector;
use hyper_util::{
    client::legacy::connect::HttpConnector,
    rt::{TokioExecutor, TokioTimer},
};
use kube::client::{Body, ClientBuilder, ConfigExt, DynBody, retry::RetryPolicy};
use tower::{
    BoxError, ServiceBuilder, ServiceExt,
    retry::RetryLayer,
    timeout::TimeoutLayer,
    util::{BoxCloneSyncService, BoxService},
};

/// The service type of kube's own builder.
pub(crate) type Service = BoxService<Request<Body>, Response<Box<DynBody>>, BoxError>;
/// This module's service: a clone shares its connection pool, so that clients made from it again and again
/// (see [`crate::rate_limit::ClientMaker`]) share their connections.
pub(crate) type SharedService = BoxCloneSyncService<Request<Body>, Response<Box<DynBody>>, BoxError>;

/// The service under a client: this module's (shared by every client made from it), or, for a config with a
/// proxy, kube's own builder.
pub(crate) enum Stack {
    Ours {
        service: SharedService,
        /// The same layers over the lean client ([`crate::lean_http2`]) of the same connector, falling back to
        /// `service`: a connection kept while it is used. Made only when asked for ([`Connections::Lean`]).
        lean: Option<SharedService>,
        default_namespace: String,
    },
    Kube(ClientBuilder<Service>),
}

/// Interval of HTTP/2 keep-alive pings, and how long an answer may take before the connection is dropped: a
/// connection that went silent (a partition: no reset, no FIN) is given up within 15 s, so its watches
/// resume within seconds of the partition's end. A ping is a 17-byte frame the server's HTTP/2 layer answers
/// without a handler: every 10 s on each of a thousand workload connections is 100 small frames a second.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// TLS sessions a client whose connection is kept keeps for resuming it after a fault. rustls keeps up to 256 by
/// default and allocates room for all of them with each client's TLS config (about 75 KiB); the operator has a
/// client per workload cluster, talking to one server over one long-lived connection. A store shared by all
/// clients would be smaller still, but a resumed TLS 1.3 session carries the client certificate of the session
/// it resumes: clients of different identities must not share one.
const TLS_SESSIONS_KEPT: usize = 4;

/// TCP keep-alive: probes after this much quiet, every [`TCP_KEEPALIVE_INTERVAL`], the connection given up
/// after [`TCP_KEEPALIVE_RETRIES`] unanswered (a dead peer is found within about a minute).
const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const TCP_KEEPALIVE_RETRIES: u32 = 3;

/// What becomes of a client's connection while no request uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleConnection {
    /// Kept for as long as it stays open, for a client whose watches ride it. A connection pool forgets an
    /// HTTP/2 connection some time after its last new request, however long the watches on it last (hyper's
    /// default: 90 s), and the next request then opens a second connection beside it: a client whose watches
    /// last half an hour and whose other requests come every few minutes would hold two or three.
    Kept,
    /// Closed once no new request has come for this long (it is checked as often), opened again by the next:
    /// for a client without watches, such as a workload cluster's when drift watches are off, whose
    /// connection would otherwise sit idle between passes.
    ReleasedAfter(Duration),
}

impl IdleConnection {
    /// How long the connection pool keeps a connection after its last new request (`None`: for ever).
    fn pool_timeout(self) -> Option<Duration> {
        match self {
            IdleConnection::Kept => None,
            IdleConnection::ReleasedAfter(quiet) => Some(quiet),
        }
    }

    /// Which TLS sessions the client keeps for resuming: a few for a kept connection (reopened only after a
    /// fault); none for one released when idle. That one is reopened at each pass, minutes apart, by a client
    /// per Cluster that holds nothing else between passes: its store of sessions (room for them and the
    /// tickets, about 2.9 KiB per Cluster at 1000) would be most of what an idle Cluster's client keeps, to
    /// save a handshake every few minutes.
    fn tls_resumption(self) -> rustls::client::Resumption {
        match self {
            IdleConnection::Kept => rustls::client::Resumption::in_memory_sessions(TLS_SESSIONS_KEPT),
            IdleConnection::ReleasedAfter(_) => rustls::client::Resumption::disabled(),
        }
    }
}

/// Which connections a config's clients (kube's and direct ones) use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connections {
    /// One lean HTTP/2 connection ([`crate::lean_http2`]), kept while a request or a handle to it is left,
    /// carrying the watches and every request it can; what it cannot (a body larger than the server's windows
    /// take at once, a server without HTTP/2) goes through hyper's pool, released as `IdleConnection` says.
    /// For a workload cluster with drift watches: the passes' requests ride the watches' connection, without
    /// a second connection and TLS handshake of their own.
    Lean,
    /// hyper's pool only (the lean client and its layers are not made): for clients without watches that last.
    Pooled,
}

/// The service for `config`, whose connections speak HTTP/2 where the server offers it, and are kept or
/// released when idle as `idle` says, lean or pooled as `connections` says.
pub(crate) fn stack(
    config: kube::Config,
    idle: IdleConnection,
    connections: Connections,
) -> Result<Stack, kube::Error> {
    if config.proxy_url.is_some() {
        return ClientBuilder::try_from(config).map(Stack::Kube);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    // A peer gone silent is found by TCP too, not only by HTTP/2 pings: a server (or a proxy) that offers no
    // h2 gets no pings, and its open watches would look alive for ever.
    http.set_keepalive(Some(TCP_KEEPALIVE_IDLE));
    http.set_keepalive_interval(Some(TCP_KEEPALIVE_INTERVAL));
    http.set_keepalive_retries(Some(TCP_KEEPALIVE_RETRIES));
    let mut tls = config.rustls_client_config()?;
    tls.resumption = idle.tls_resumption();
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(server_name) = &config.tls_server_name {
        let name = server_name
            .clone()
            .try_into()
            .map_err(|e| kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(e)))?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let mut connector = TimeoutConnector::new(https.enable_all_versions().wrap_connector(http));
    connector.set_connect_timeout(config.connect_timeout);
    // Not a read timeout on the connection: it would end a quiet connection, and with it every watch on it.
    // The config's read timeout bounds the wait for each response instead (below).
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let lean_connector = connector.clone();
    let client: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .http2_keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            // No dynamic table for the headers the server sends: HPACK's table would keep up to 4 KiB per
            // connection (one per workload cluster) to save a few hundred bytes of each response's headers.
            .http2_header_table_size(0)
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(idle.pool_timeout())
            .build(connector);
    let hyper_client: crate::lean_http2::Fallback =
        BoxCloneSyncService::new(client.map_err(BoxError::from).map_response(
            |response: Response<hyper::body::Incoming>| {
                response.map(|body| Box::new(body.map_err(BoxError::from)) as Box<DynBody>)
            },
        ));
    let layers = ConfigLayers::of(&config)?;
    let lean = (connections == Connections::Lean).then(|| {
        layers.over(BoxCloneSyncService::new(lean_client(
            lean_connector,
            hyper_client.clone(),
        )))
    });
    let service = layers.over(hyper_client);
    Ok(Stack::Ours {
        service,
        lean,
        default_namespace: config.default_namespace,
    })
}

/// The connector of a config's connections: TCP (keep-alive set), TLS when the URL asks for it, timeouts.
type Connector = TimeoutConnector<hyper_rustls::HttpsConnector<HttpConnector>>;

/// The lean HTTP/2 client over `connector`, asking servers without HTTP/2 (and bodies it does not send at
/// once) through `fallback`.
fn lean_client(connector: Connector, fallback: crate::lean_http2::Fallback) -> crate::lean_http2::LeanHttp2 {
    let connect: crate::lean_http2::Connect = std::sync::Arc::new(move |uri| {
        let connector = connector.clone();
        Box::pin(async move {
            use hyper_util::client::legacy::connect::Connection;
            let stream = connector.oneshot(uri).await?;
            let http2 = stream.connected().is_negotiated_h2();
            Ok((
                Box::new(hyper_util::rt::TokioIo::new(stream)) as Box<dyn crate::lean_http2::Io>,
                http2,
            ))
        })
    });
    crate::lean_http2::LeanHttp2::new(connect, fallback)
}

/// The config's layers: base URI, retries when the config asks for them, authentication, extra headers, and
/// the read timeout bounding the wait for each response. Made once and put under both of a config's services,
/// so that they share one token (an exec plugin's or a token file's, refreshed once for both).
struct ConfigLayers {
    base_uri: kube::client::middleware::BaseUriLayer,
    retry: Option<RetryLayer<RetryPolicy>>,
    auth: Option<kube::client::middleware::AuthLayer>,
    extra_headers: kube::client::middleware::ExtraHeadersLayer,
    read_timeout: Option<TimeoutLayer>,
}

impl ConfigLayers {
    fn of(config: &kube::Config) -> Result<Self, kube::Error> {
        Ok(ConfigLayers {
            base_uri: config.base_uri_layer(),
            retry: config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
            auth: config.auth_layer()?,
            extra_headers: config.extra_headers_layer()?,
            read_timeout: config.read_timeout.map(TimeoutLayer::new),
        })
    }

    /// `inner` under these layers.
    fn over(&self, inner: crate::lean_http2::Fallback) -> SharedService {
        BoxCloneSyncService::new(
            ServiceBuilder::new()
                .layer(&self.base_uri)
                .option_layer(self.retry.as_ref())
                .option_layer(self.auth.as_ref())
                .layer(&self.extra_headers)
                .option_layer(self.read_timeout.as_ref())
                .map_err(BoxError::from)
                .service(inner),
        )
    }
}
