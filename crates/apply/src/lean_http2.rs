//! A lean HTTP/2 client for a workload cluster's requests: its drift watches (and their reach probe), which
//! stay open for minutes, and the passes' requests beside them. hyper's client holds, per connection, buffers
//! sized for throughput and kept for the connection's life (a 16 KiB write buffer, a read buffer grown to the
//! largest frame, queues and slabs) and a request channel of 32 slots: about 80 KiB per workload cluster whose
//! watches stay open, most of what such a cluster costs. This client keeps nothing it does not need between
//! frames: a frame is read into a buffer on the stack of the task that reads it, and only the rest of a frame
//! split between two reads is kept; bytes to send are kept only until written; the server is asked for no
//! HPACK table; each open stream holds the response data its reader has not taken yet, bounded by its
//! flow-control window.
//!
//! It speaks only what these requests need: requests whose body is in memory, sent whole as their stream
//! opens when the server's windows take it (else through `fallback`, so that nothing here waits for a
//! window), their responses, flow control of what is received, SETTINGS, PING (answered, and sent every
//! [`KEEP_ALIVE_INTERVAL`] to find a dead peer), RST_STREAM and GOAWAY. `fallback` is hyper's client of the
//! same connector; it also takes every request to a server that does not offer HTTP/2 (no ALPN `h2`, plain
//! HTTP) and bodies that stream.
//! The connection is made on the first request, over the connector of the cluster's other clients (its TLS
//! config, server name, timeouts, TCP keep-alive), made again after it fails or the server sends GOAWAY, and
//! closed when the last handle to it and its last stream are gone.

use std::{
    collections::VecDeque,
    future::Future,
    pin::Pin,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll, Waker},
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::client::{Body, DynBody};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::{Instant, Sleep},
};
use tower::{BoxError, ServiceExt, util::BoxCloneSyncService};

/// A connected byte stream (TLS over TCP).
pub(crate) trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// A connection as the connector made it, and whether HTTP/2 was agreed on it (ALPN `h2`).
pub(crate) type Connected = (Box<dyn Io>, bool);
/// Connects to the server of a URI.
pub(crate) type Connect =
    Arc<dyn Fn(http::Uri) -> Pin<Box<dyn Future<Output = Result<Connected, BoxError>> + Send>> + Send + Sync>;
/// The service requests go through when this client does not carry them.
pub(crate) type Fallback = BoxCloneSyncService<Request<Body>, Response<Box<DynBody>>, BoxError>;

/// How often a PING is sent on a connection, and how long its answer may take before the connection is given
/// up (as the cluster's other clients do: a silent peer is found within 15 s).
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// The flow-control window of each stream: response data the server may send before the reader takes it. A
/// watch's events are small and taken at once; a list of large objects streams at this much per round trip.
const STREAM_WINDOW: u32 = 256 * 1024;
/// The window of the whole connection (the spec's default is 64 KiB), given back as data arrives: the streams'
/// windows are what bound the memory.
const CONNECTION_WINDOW: u32 = 1024 * 1024;
/// The flow-control window of a connection and of its streams until the peer's SETTINGS or WINDOW_UPDATE
/// say otherwise (the spec's), and the largest a window may grow to.
const DEFAULT_WINDOW: u32 = 65_535;
const MAX_WINDOW: u32 = 0x7fff_ffff;
/// Request bodies waiting to be written beyond which another goes through `fallback`: a PING queued behind them
/// must still be written well within [`KEEP_ALIVE_TIMEOUT`], and the driver stops reading while
/// [`MAX_UNSENT`] wait.
const MAX_QUEUED_BODIES: usize = 256 * 1024;
/// The largest frame the server may send: the spec's default, not raised.
const MAX_FRAME: usize = 16 * 1024;
/// The largest header block (a HEADERS frame and its CONTINUATIONs) taken, and the most bytes its headers
/// may decode to: a server's answer has a few hundred.
const MAX_HEADER_BLOCK: usize = 64 * 1024;
const MAX_DECODED_HEADERS: usize = 256 * 1024;
/// The HPACK table a server may use before it has our SETTINGS (which ask for none): the spec's default.
const DEFAULT_HEADER_TABLE: usize = 4096;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

mod frame {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PUSH_PROMISE: u8 = 0x5;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;

    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;

    pub const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
    pub const SETTINGS_ENABLE_PUSH: u16 = 0x2;
    pub const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
    pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
    pub const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;

    pub const NO_ERROR: u32 = 0x0;
    pub const PROTOCOL_ERROR: u32 = 0x1;
    pub const FLOW_CONTROL_ERROR: u32 = 0x3;
    pub const FRAME_SIZE_ERROR: u32 = 0x6;
    pub const CANCEL: u32 = 0x8;
    pub const COMPRESSION_ERROR: u32 = 0x9;
}

/// An error of this client, told as text.
#[derive(Debug, Clone)]
pub(crate) struct LeanError(Arc<str>);

impl std::fmt::Display for LeanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LeanError {}

fn error(text: impl Into<String>) -> LeanError {
    LeanError(text.into().into())
}

/// The client: cheap to clone, every clone sharing the connection.
#[derive(Clone)]
pub(crate) struct LeanHttp2 {
    endpoint: Arc<Endpoint>,
}

struct Endpoint {
    connect: Connect,
    fallback: Fallback,
    /// The connection new requests open their streams on; made under this lock, so that requests that come
    /// together make one.
    current: tokio::sync::Mutex<Option<Arc<Connection>>>,
    /// The server offers no HTTP/2: every request goes through `fallback`.
    without_http2: AtomicBool,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(connection) = self.current.get_mut().take() {
            connection.let_go();
        }
    }
}

impl LeanHttp2 {
    pub(crate) fn new(connect: Connect, fallback: Fallback) -> Self {
        LeanHttp2 {
            endpoint: Arc::new(Endpoint {
                connect,
                fallback,
                current: tokio::sync::Mutex::new(None),
                without_http2: AtomicBool::new(false),
            }),
        }
    }

    /// Sends `request` and answers as the response starts; its body streams.
    pub(crate) async fn send(&self, request: Request<Body>) -> Result<Response<Box<DynBody>>, BoxError> {
        let endpoint = &self.endpoint;
        let size = http_body::Body::size_hint(request.body()).exact();
        let fits = size.is_some_and(|size| size <= MAX_QUEUED_BODIES as u64);
        if endpoint.without_http2.load(Ordering::Acquire) || !fits {
            return endpoint.fallback.clone().oneshot(request).await;
        }
        let (mut parts, body) = request.into_parts();
        // Sized: an encoded object in memory (kube's requests have nothing else), taken at once.
        let body = body.collect().await?.to_bytes();
        if !body.is_empty() {
            parts
                .headers
                .entry(http::header::CONTENT_LENGTH)
                .or_insert_with(|| HeaderValue::from(body.len()));
        }
        let block = request_header_block(&parts)?;
        // A connection that went away between two requests is made again once.
        for _ in 0..2 {
            let opened = match endpoint.connection(&parts.uri).await? {
                Some(connection) => (connection.open(&block, &body), connection),
                None => break,
            };
            match opened {
                (Opened::Stream(id), connection) => {
                    let head = ResponseHead {
                        connection: Some(connection),
                        id,
                    };
                    return Ok(head.await?);
                }
                (Opened::NotTaken, connection) => endpoint.forget(&connection).await,
                (Opened::NotNow, _) => break,
            }
        }
        let request = Request::from_parts(parts, Body::from(body));
        endpoint.fallback.clone().oneshot(request).await
    }
}

impl tower::Service<Request<Body>> for LeanHttp2 {
    type Response = Response<Box<DynBody>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let client = self.clone();
        Box::pin(async move { client.send(request).await })
    }
}

impl Endpoint {
    /// The connection to open a stream on: the current one while it takes new streams, else a new one;
    /// `None` when the server offers no HTTP/2.
    async fn connection(&self, uri: &http::Uri) -> Result<Option<Arc<Connection>>, BoxError> {
        let mut current = self.current.lock().await;
        if let Some(connection) = current.as_ref().filter(|c| c.lock().takes_streams()) {
            return Ok(Some(connection.clone()));
        }
        let (io, http2) = (self.connect)(uri.clone()).await?;
        if !http2 {
            self.without_http2.store(true, Ordering::Release);
            return Ok(None);
        }
        let connection = Connection::start(io);
        if let Some(replaced) = current.replace(connection.clone()) {
            replaced.let_go();
        }
        Ok(Some(connection))
    }

    /// Forgets `connection` if it is still the current one.
    async fn forget(&self, connection: &Arc<Connection>) {
        let mut current = self.current.lock().await;
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, connection)) {
            *current = None;
            connection.let_go();
        }
    }
}

/// One HTTP/2 connection: its state, shared by the task that drives it and the streams' handles.
struct Connection {
    state: Mutex<State>,
}

struct State {
    streams: Vec<Stream>,
    next_id: u32,
    /// Bytes to send, taken by the driver.
    out: Vec<u8>,
    driver: Option<Waker>,
    /// Why the connection ended: it takes no streams and every open one fails.
    closed: Option<LeanError>,
    /// The server's GOAWAY: no new streams; the open ones up to its last id finish.
    going_away: bool,
    /// No handle to the connection is left: it closes once its streams are done.
    unused: bool,
    peer_max_frame: usize,
    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS: a connection with as many open takes no more.
    peer_max_streams: usize,
    decoder: loona_hpack::Decoder<'static>,
    /// A header block of `block_stream` whose CONTINUATION is awaited (0: none).
    block: Vec<u8>,
    block_stream: u32,
    block_ends_stream: bool,
    /// Connection-level: data received and not yet given back (the window left is the rest of
    /// [`CONNECTION_WINDOW`]: it is given back as data arrives).
    connection_received: u32,
    /// What the server lets us send: on the connection (its window, given back by its WINDOW_UPDATEs), and on
    /// a new stream (its SETTINGS_INITIAL_WINDOW_SIZE). A request's body is sent whole when it opens its
    /// stream, or not on this connection, so that nothing waits for a window here.
    send_window: u32,
    peer_stream_window: u32,
    ping_sent: Option<Instant>,
}

struct Stream {
    id: u32,
    head: Head,
    data: VecDeque<Bytes>,
    ended: bool,
    failed: Option<LeanError>,
    waker: Option<Waker>,
    /// Data taken by the reader and not yet given back to the server, and the window left.
    taken: u32,
    window: u32,
}

impl Stream {
    /// A stream just opened, its whole window open.
    fn new(id: u32) -> Self {
        Stream {
            id,
            head: Head::Waiting,
            data: VecDeque::new(),
            ended: false,
            failed: None,
            waker: None,
            taken: 0,
            window: STREAM_WINDOW,
        }
    }
}

enum Head {
    Waiting,
    /// Boxed: a stream lives as long as its watch, its answer's head only until the reader takes it.
    Ready(Box<(StatusCode, HeaderMap)>),
    Taken,
}

impl State {
    /// A new connection's state, `out` what it sends first.
    fn new(out: Vec<u8>) -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(DEFAULT_HEADER_TABLE);
        State {
            streams: Vec::new(),
            next_id: 1,
            out,
            driver: None,
            closed: None,
            going_away: false,
            unused: false,
            peer_max_frame: MAX_FRAME,
            peer_max_streams: usize::MAX,
            decoder,
            block: Vec::new(),
            block_stream: 0,
            block_ends_stream: false,
            connection_received: 0,
            send_window: DEFAULT_WINDOW,
            peer_stream_window: DEFAULT_WINDOW,
            ping_sent: None,
        }
    }

    fn takes_streams(&self) -> bool {
        self.closed.is_none()
            && !self.going_away
            && self.next_id < i32::MAX as u32
            && self.streams.len() < self.peer_max_streams
    }

    fn stream(&mut self, id: u32) -> Option<&mut Stream> {
        self.streams.iter_mut().find(|s| s.id == id)
    }

    fn push_frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        push_frame(&mut self.out, kind, flags, stream, payload);
    }

    /// Gives stream `id`'s window back once half of it was taken (or was padding) and the server may still
    /// send; says whether it did.
    fn give_back(&mut self, id: u32) -> bool {
        let Some(stream) = self.stream(id) else {
            return false;
        };
        if stream.ended || stream.taken < STREAM_WINDOW / 2 {
            return false;
        }
        let increment = std::mem::take(&mut stream.taken);
        stream.window += increment;
        self.push_frame(frame::WINDOW_UPDATE, 0, id, &increment.to_be_bytes());
        true
    }

    /// Queues a GOAWAY with `code`: no stream of the server's was taken (it opens none).
    fn go_away(&mut self, code: u32) {
        let mut payload = [0u8; 8];
        payload[4..].copy_from_slice(&code.to_be_bytes());
        self.push_frame(frame::GOAWAY, 0, 0, &payload);
    }

    fn reset(&mut self, id: u32, code: u32) {
        self.push_frame(frame::RST_STREAM, 0, id, &code.to_be_bytes());
    }

    /// Ends the connection for `why` (unless it ended already): every stream fails, and is woken to see it.
    fn close(&mut self, why: LeanError) {
        if self.closed.is_none() {
            self.closed = Some(why);
        }
        for waker in self.streams.iter_mut().filter_map(|s| s.waker.take()) {
            waker.wake();
        }
    }

    /// A stream's handle is gone: it is forgotten, and reset if the server may still send on it.
    fn drop_stream(&mut self, id: u32) {
        let Some(index) = self.streams.iter().position(|s| s.id == id) else {
            return;
        };
        let stream = self.streams.swap_remove(index);
        if !stream.ended && stream.failed.is_none() && self.closed.is_none() {
            self.reset(id, frame::CANCEL);
        }
        if self.streams.is_empty() {
            self.streams = Vec::new();
        }
    }
}

/// Lets go of `state` and wakes the driver to act on what was changed (frames queued, the connection let go).
fn unlock_and_wake_driver(state: MutexGuard<'_, State>) {
    let driver = state.driver.clone();
    drop(state);
    if let Some(driver) = driver {
        driver.wake();
    }
}

fn push_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let length = payload.len() as u32;
    out.extend_from_slice(&length.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

impl Connection {
    /// Starts the connection over `io`: the preface and our settings are sent, and the driver spawned.
    fn start(io: Box<dyn Io>) -> Arc<Connection> {
        let mut out = PREFACE.to_vec();
        let mut settings = Vec::with_capacity(18);
        for (id, value) in [
            (frame::SETTINGS_HEADER_TABLE_SIZE, 0),
            (frame::SETTINGS_ENABLE_PUSH, 0),
            (frame::SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
        ] {
            settings.extend_from_slice(&id.to_be_bytes());
            settings.extend_from_slice(&value.to_be_bytes());
        }
        push_frame(&mut out, frame::SETTINGS, 0, 0, &settings);
        let raise = CONNECTION_WINDOW - 65_535;
        push_frame(&mut out, frame::WINDOW_UPDATE, 0, 0, &raise.to_be_bytes());
        let connection = Arc::new(Connection {
            state: Mutex::new(State::new(out)),
        });
        tokio::spawn(Driver {
            io,
            connection: connection.clone(),
            partial: Vec::new(),
            writing: Vec::new(),
            written: 0,
            unflushed: false,
            keep_alive: Box::pin(tokio::time::sleep(KEEP_ALIVE_INTERVAL)),
        });
        connection
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// No new stream will be opened here: the connection closes once its streams are done.
    fn let_go(&self) {
        let mut state = self.lock();
        state.unused = true;
        unlock_and_wake_driver(state);
    }

    /// Opens a stream with the request header block `block` and sends `body` on it whole, when the
    /// connection takes new streams and the server's windows take the body.
    fn open(&self, block: &[u8], body: &[u8]) -> Opened {
        let mut state = self.lock();
        if !state.takes_streams() {
            return Opened::NotTaken;
        }
        let length = u32::try_from(body.len()).unwrap_or(u32::MAX);
        if length > state.send_window.min(state.peer_stream_window)
            || (!body.is_empty() && state.out.len() + body.len() > MAX_QUEUED_BODIES)
        {
            return Opened::NotNow;
        }
        state.send_window -= length;
        let id = state.next_id;
        state.next_id += 2;
        let max = state.peer_max_frame;
        let mut chunks = block.chunks(max).peekable();
        let mut first = true;
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            let (kind, mut flags) = match (first, body.is_empty()) {
                (true, true) => (frame::HEADERS, frame::END_STREAM),
                (true, false) => (frame::HEADERS, 0),
                (false, _) => (frame::CONTINUATION, 0),
            };
            if last {
                flags |= frame::END_HEADERS;
            }
            state.push_frame(kind, flags, id, chunk);
            first = false;
        }
        let mut chunks = body.chunks(max).peekable();
        while let Some(chunk) = chunks.next() {
            let flags = if chunks.peek().is_none() {
                frame::END_STREAM
            } else {
                0
            };
            state.push_frame(frame::DATA, flags, id, chunk);
        }
        state.streams.push(Stream::new(id));
        unlock_and_wake_driver(state);
        Opened::Stream(id)
    }

    fn poll_head(&self, id: u32, cx: &mut Context<'_>) -> Poll<Result<(StatusCode, HeaderMap), LeanError>> {
        let mut state = self.lock();
        let closed = state.closed.clone();
        let Some(stream) = state.stream(id) else {
            return Poll::Ready(Err(error("the stream was forgotten")));
        };
        if let Head::Ready(..) = stream.head {
            let Head::Ready(head) = std::mem::replace(&mut stream.head, Head::Taken) else {
                unreachable!("matched above")
            };
            return Poll::Ready(Ok(*head));
        }
        if let Some(failed) = stream.failed.clone().or(closed) {
            return Poll::Ready(Err(failed));
        }
        if stream.ended {
            return Poll::Ready(Err(error("the server ended the stream without a response")));
        }
        stream.waker = Some(cx.waker().clone());
        Poll::Pending
    }

    fn poll_data(&self, id: u32, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, LeanError>>> {
        let mut state = self.lock();
        let closed = state.closed.clone();
        let Some(stream) = state.stream(id) else {
            return Poll::Ready(None);
        };
        if let Some(data) = stream.data.pop_front() {
            if stream.data.is_empty() {
                stream.data = VecDeque::new();
            }
            stream.taken += data.len() as u32;
            if state.give_back(id) {
                unlock_and_wake_driver(state);
            }
            return Poll::Ready(Some(Ok(data)));
        }
        if stream.ended {
            return Poll::Ready(None);
        }
        if let Some(failed) = stream.failed.clone().or(closed) {
            return Poll::Ready(Some(Err(failed)));
        }
        stream.waker = Some(cx.waker().clone());
        Poll::Pending
    }

    fn forget_stream(&self, id: u32) {
        let mut state = self.lock();
        state.drop_stream(id);
        unlock_and_wake_driver(state);
    }
}

/// What became of a request offered to a connection.
#[derive(Debug, PartialEq, Eq)]
enum Opened {
    /// Sent on this stream.
    Stream(u32),
    /// The connection takes no new streams (closed, going away, or as many open as the server allows).
    NotTaken,
    /// Its body is larger than what the server lets us send now, or than this connection queues.
    NotNow,
}

/// A response on its way: its stream is reset and forgotten if this is dropped before it comes.
struct ResponseHead {
    connection: Option<Arc<Connection>>,
    id: u32,
}

impl Future for ResponseHead {
    type Output = Result<Response<Box<DynBody>>, LeanError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let id = self.id;
        let Some(connection) = self.connection.as_ref() else {
            return Poll::Ready(Err(error("polled after its answer")));
        };
        let (status, headers) = match std::task::ready!(connection.poll_head(id, cx)) {
            Ok(head) => head,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let connection = self.connection.take().expect("checked above");
        let mut response = Response::new(Box::new(LeanBody { connection, id }) as Box<DynBody>);
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        *response.version_mut() = http::Version::HTTP_2;
        Poll::Ready(Ok(response))
    }
}

impl Drop for ResponseHead {
    fn drop(&mut self) {
        if let Some(connection) = self.connection.take() {
            connection.forget_stream(self.id);
        }
    }
}

/// A response's body: the stream's data as it comes; the stream is reset and forgotten when this is dropped
/// before its end.
struct LeanBody {
    connection: Arc<Connection>,
    id: u32,
}

impl http_body::Body for LeanBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        self.connection
            .poll_data(self.id, cx)
            .map(|data| data.map(|data| data.map(http_body::Frame::data).map_err(BoxError::from)))
    }
}

impl Drop for LeanBody {
    fn drop(&mut self) {
        self.connection.forget_stream(self.id);
    }
}

/// The task that reads and writes the connection.
struct Driver {
    io: Box<dyn Io>,
    connection: Arc<Connection>,
    /// The start of a frame whose rest has not been read yet.
    partial: Vec<u8>,
    /// Bytes being written, of which `written` are.
    writing: Vec<u8>,
    written: usize,
    /// Written and not yet flushed.
    unflushed: bool,
    keep_alive: Pin<Box<Sleep>>,
}

/// What a read buffer on the driver's stack holds: a whole frame of the largest size, with its header.
const READ_CHUNK: usize = MAX_FRAME + 9;

impl Future for Driver {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        {
            let mut state = this.connection.lock();
            if !state.driver.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                state.driver = Some(cx.waker().clone());
            }
        }
        let mut wake = Vec::new();
        let mut buffer = [0u8; READ_CHUNK];
        let outcome = loop {
            // Read what is there, unless the server does not take what we have to send (answers to its PINGs
            // and SETTINGS, window updates): those would pile up.
            let unsent = this.connection.lock().out.len() + (this.writing.len() - this.written);
            if unsent < MAX_UNSENT {
                let mut read = ReadBuf::new(&mut buffer);
                match Pin::new(&mut this.io).poll_read(cx, &mut read) {
                    Poll::Ready(Ok(())) if read.filled().is_empty() => {
                        break Err(error("the workload API server closed the connection"));
                    }
                    Poll::Ready(Ok(())) => {
                        let filled = read.filled().len();
                        if let Err(e) = this.take_in(&buffer[..filled], &mut wake) {
                            break Err(e);
                        }
                        continue;
                    }
                    Poll::Ready(Err(e)) => break Err(error(format!("reading the connection failed: {e}"))),
                    Poll::Pending => {}
                }
            }
            // Write what is to be sent.
            if this.writing.is_empty() {
                this.writing = std::mem::take(&mut this.connection.lock().out);
                this.written = 0;
            }
            let mut wrote = false;
            let mut write_failed = None;
            while this.written < this.writing.len() {
                match Pin::new(&mut this.io).poll_write(cx, &this.writing[this.written..]) {
                    Poll::Ready(Ok(0)) => {
                        write_failed = Some(error("the connection takes no more bytes"));
                        break;
                    }
                    Poll::Ready(Ok(n)) => {
                        this.written += n;
                        wrote = true;
                    }
                    Poll::Ready(Err(e)) => {
                        write_failed = Some(error(format!("writing the connection failed: {e}")));
                        break;
                    }
                    Poll::Pending => break,
                }
            }
            if let Some(failed) = write_failed {
                break Err(failed);
            }
            if !this.writing.is_empty() && this.written == this.writing.len() {
                this.writing = Vec::new();
                this.written = 0;
            }
            if wrote {
                this.unflushed = true;
            }
            // A TLS stream may keep what was written until flushed.
            if this.unflushed {
                match Pin::new(&mut this.io).poll_flush(cx) {
                    Poll::Ready(Ok(())) => this.unflushed = false,
                    Poll::Ready(Err(e)) => break Err(error(format!("writing the connection failed: {e}"))),
                    Poll::Pending => {}
                }
            }
            if wrote {
                // More may have been queued meanwhile.
                continue;
            }
            // Keep-alive: a PING every interval, its answer awaited for the timeout.
            if this.keep_alive.as_mut().poll(cx).is_ready() {
                let now = Instant::now();
                let mut state = this.connection.lock();
                match state.ping_sent {
                    Some(sent) if now.duration_since(sent) >= KEEP_ALIVE_TIMEOUT => {
                        break Err(error(format!(
                            "the workload API server did not answer a keep-alive ping within {}s",
                            KEEP_ALIVE_TIMEOUT.as_secs()
                        )));
                    }
                    Some(sent) => this.keep_alive.as_mut().reset(sent + KEEP_ALIVE_TIMEOUT),
                    None => {
                        state.ping_sent = Some(now);
                        // Ahead of what waits (a frame boundary: the driver takes `out` whole), so that bodies
                        // queued before it do not count against its answer's time.
                        let mut ping = Vec::with_capacity(17);
                        push_frame(&mut ping, frame::PING, 0, 0, &[0; 8]);
                        state.out.splice(0..0, ping);
                        this.keep_alive.as_mut().reset(now + KEEP_ALIVE_TIMEOUT);
                    }
                }
                continue;
            }
            let mut state = this.connection.lock();
            if state.closed.is_none() && state.unused && state.streams.is_empty() {
                // No handle and no stream left: the server is told, and the connection closed once it is.
                state.go_away(frame::NO_ERROR);
                state.closed = Some(error("the connection is no longer used"));
                continue;
            }
            if state.closed.is_some() && state.out.is_empty() && this.writing.is_empty() && !this.unflushed {
                break Ok(true);
            }
            break Ok(false);
        };
        for waker in wake.drain(..) {
            waker.wake();
        }
        match outcome {
            Ok(false) => Poll::Pending,
            Ok(true) => {
                // Best effort: TLS's close.
                let _ = Pin::new(&mut this.io).poll_shutdown(cx);
                Poll::Ready(())
            }
            Err(why) => {
                this.end(why, cx);
                Poll::Ready(())
            }
        }
    }
}

/// Bytes to send beyond which the driver stops reading until they are written.
const MAX_UNSENT: usize = 256 * 1024;

impl Drop for Driver {
    /// A driver gone before its connection ended (its runtime shut down) leaves no stream waiting for it.
    fn drop(&mut self) {
        let mut state = self.connection.lock();
        state.close(error("the connection's task ended"));
        state.driver = None;
    }
}

impl Driver {
    /// Ends the connection for `why`, waking every stream; what is left to send (a GOAWAY saying why) is
    /// written if the connection takes it at once, and TLS closed, without waiting.
    fn end(&mut self, why: LeanError, cx: &mut Context<'_>) {
        let last = {
            let mut state = self.connection.lock();
            state.close(why);
            std::mem::take(&mut state.out)
        };
        let mut rest = self.writing.split_off(self.written.min(self.writing.len()));
        rest.extend_from_slice(&last);
        if !rest.is_empty() {
            let _ = Pin::new(&mut self.io).poll_write(cx, &rest);
            let _ = Pin::new(&mut self.io).poll_flush(cx);
        }
        let _ = Pin::new(&mut self.io).poll_shutdown(cx);
    }

    /// Takes in `bytes` read from the connection: every whole frame is handled, the rest kept.
    fn take_in(&mut self, bytes: &[u8], wake: &mut Vec<Waker>) -> Result<(), LeanError> {
        let mut state = self.connection.lock();
        if self.partial.is_empty() {
            let used = handle_frames(&mut state, bytes, wake)?;
            self.partial.extend_from_slice(&bytes[used..]);
        } else {
            self.partial.extend_from_slice(bytes);
            let used = handle_frames(&mut state, &self.partial, wake)?;
            self.partial.drain(..used);
            if self.partial.is_empty() {
                self.partial = Vec::new();
            }
        }
        if state.ping_sent.is_none() && self.keep_alive.deadline() < Instant::now() + KEEP_ALIVE_TIMEOUT {
            // The PING was answered: the next is due an interval from now.
            self.keep_alive
                .as_mut()
                .reset(Instant::now() + KEEP_ALIVE_INTERVAL);
        }
        Ok(())
    }
}

/// Handles every whole frame at the start of `bytes`; answers how many bytes they took.
fn handle_frames(state: &mut State, bytes: &[u8], wake: &mut Vec<Waker>) -> Result<usize, LeanError> {
    let mut used = 0;
    while bytes.len() - used >= 9 {
        let header = &bytes[used..used + 9];
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        if length > MAX_FRAME {
            return Err(protocol_failure(
                state,
                frame::FRAME_SIZE_ERROR,
                format!("the server sent a frame of {length} bytes, more than the {MAX_FRAME} agreed"),
            ));
        }
        if bytes.len() - used < 9 + length {
            break;
        }
        let (kind, flags) = (header[3], header[4]);
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        let payload = &bytes[used + 9..used + 9 + length];
        used += 9 + length;
        handle_frame(state, kind, flags, stream, payload, wake)?;
    }
    Ok(used)
}

/// A connection error: a GOAWAY with `code` is queued, and the error to end the connection with returned.
fn protocol_failure(state: &mut State, code: u32, why: String) -> LeanError {
    state.go_away(code);
    error(format!("HTTP/2 protocol error: {why}"))
}

fn handle_frame(
    state: &mut State,
    kind: u8,
    flags: u8,
    stream: u32,
    payload: &[u8],
    wake: &mut Vec<Waker>,
) -> Result<(), LeanError> {
    if state.block_stream != 0 && (kind != frame::CONTINUATION || stream != state.block_stream) {
        return Err(protocol_failure(
            state,
            frame::PROTOCOL_ERROR,
            "a header block was interrupted".into(),
        ));
    }
    match kind {
        frame::DATA => {
            let length = payload.len() as u32;
            if length > CONNECTION_WINDOW - state.connection_received {
                return Err(protocol_failure(
                    state,
                    frame::FLOW_CONTROL_ERROR,
                    "the server sent more than the connection's window".into(),
                ));
            }
            state.connection_received += length;
            if state.connection_received >= CONNECTION_WINDOW / 2 {
                let increment = std::mem::take(&mut state.connection_received);
                state.push_frame(frame::WINDOW_UPDATE, 0, 0, &increment.to_be_bytes());
            }
            let data = unpadded(flags, payload).ok_or_else(|| {
                protocol_failure(
                    state,
                    frame::PROTOCOL_ERROR,
                    "a DATA frame with bad padding".into(),
                )
            })?;
            let padding = length - data.len() as u32;
            let mut reset = None;
            if let Some(open) = state.stream(stream) {
                if length > open.window {
                    open.failed = Some(error("the server sent more than the stream's window"));
                    reset = Some(frame::FLOW_CONTROL_ERROR);
                } else {
                    open.window -= length;
                    // Padding is never taken by the reader: it is given back with the next data taken.
                    open.taken += padding;
                    if !data.is_empty() {
                        open.data.push_back(Bytes::copy_from_slice(data));
                    }
                    open.ended |= flags & frame::END_STREAM != 0;
                }
                wake.extend(open.waker.take());
            }
            match reset {
                Some(code) => state.reset(stream, code),
                None => {
                    state.give_back(stream);
                }
            }
        }
        frame::HEADERS => {
            let fragment = headers_fragment(flags, payload).ok_or_else(|| {
                protocol_failure(
                    state,
                    frame::PROTOCOL_ERROR,
                    "a HEADERS frame with bad padding".into(),
                )
            })?;
            state.block.clear();
            state.block.extend_from_slice(fragment);
            state.block_ends_stream = flags & frame::END_STREAM != 0;
            if flags & frame::END_HEADERS == 0 {
                state.block_stream = stream;
            } else {
                header_block_done(state, stream, wake)?;
            }
        }
        frame::CONTINUATION => {
            if state.block_stream == 0 {
                return Err(protocol_failure(
                    state,
                    frame::PROTOCOL_ERROR,
                    "a CONTINUATION without a header block".into(),
                ));
            }
            if state.block.len() + payload.len() > MAX_HEADER_BLOCK {
                return Err(protocol_failure(
                    state,
                    frame::PROTOCOL_ERROR,
                    format!("a header block of more than {MAX_HEADER_BLOCK} bytes"),
                ));
            }
            state.block.extend_from_slice(payload);
            if flags & frame::END_HEADERS != 0 {
                state.block_stream = 0;
                header_block_done(state, stream, wake)?;
            }
        }
        frame::RST_STREAM => {
            let code = payload.try_into().map(u32::from_be_bytes).map_err(|_| {
                protocol_failure(state, frame::FRAME_SIZE_ERROR, "a RST_STREAM of bad size".into())
            })?;
            if let Some(open) = state.stream(stream) {
                if !open.ended {
                    open.failed = Some(error(format!(
                        "the server reset the stream (HTTP/2 error code {code})"
                    )));
                }
                wake.extend(open.waker.take());
            }
        }
        frame::SETTINGS if flags & frame::ACK != 0 => {}
        frame::SETTINGS => {
            if !payload.len().is_multiple_of(6) {
                return Err(protocol_failure(
                    state,
                    frame::FRAME_SIZE_ERROR,
                    "a SETTINGS frame of bad size".into(),
                ));
            }
            for setting in payload.chunks_exact(6) {
                let id = u16::from_be_bytes([setting[0], setting[1]]);
                let value = u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
                match id {
                    // Only ever raised from the spec's floor; our header blocks are small either way.
                    frame::SETTINGS_MAX_FRAME_SIZE => {
                        state.peer_max_frame = (value as usize).clamp(MAX_FRAME, (1 << 24) - 1)
                    }
                    frame::SETTINGS_MAX_CONCURRENT_STREAMS => state.peer_max_streams = value as usize,
                    // For streams opened from now on: an open one's body was sent whole as it opened.
                    frame::SETTINGS_INITIAL_WINDOW_SIZE if value > MAX_WINDOW => {
                        return Err(protocol_failure(
                            state,
                            frame::FLOW_CONTROL_ERROR,
                            format!("a stream window of {value} bytes"),
                        ));
                    }
                    frame::SETTINGS_INITIAL_WINDOW_SIZE => state.peer_stream_window = value,
                    _ => {}
                }
            }
            state.push_frame(frame::SETTINGS, frame::ACK, 0, &[]);
        }
        frame::PING if payload.len() != 8 => {
            return Err(protocol_failure(
                state,
                frame::FRAME_SIZE_ERROR,
                "a PING of bad size".into(),
            ));
        }
        frame::PING if flags & frame::ACK != 0 => state.ping_sent = None,
        frame::PING => state.push_frame(frame::PING, frame::ACK, 0, payload),
        frame::GOAWAY => {
            if payload.len() < 8 {
                return Err(protocol_failure(
                    state,
                    frame::FRAME_SIZE_ERROR,
                    "a GOAWAY of bad size".into(),
                ));
            }
            let last = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
            let code = u32::from_be_bytes([payload[4], payload[5], payload[6], payload[7]]);
            state.going_away = true;
            for open in state.streams.iter_mut().filter(|s| s.id > last) {
                open.failed = Some(error(format!(
                    "the server is going away (HTTP/2 error code {code}) before taking the stream"
                )));
                wake.extend(open.waker.take());
            }
        }
        frame::PUSH_PROMISE => {
            return Err(protocol_failure(
                state,
                frame::PROTOCOL_ERROR,
                "a PUSH_PROMISE, though push was turned off".into(),
            ));
        }
        frame::WINDOW_UPDATE => {
            let increment = payload
                .try_into()
                .map(|bytes| u32::from_be_bytes(bytes) & MAX_WINDOW)
                .map_err(|_| {
                    protocol_failure(
                        state,
                        frame::FRAME_SIZE_ERROR,
                        "a WINDOW_UPDATE of bad size".into(),
                    )
                })?;
            // A stream's: nothing more is sent on it (its body went whole as it opened).
            if stream == 0 {
                if increment == 0 {
                    return Err(protocol_failure(
                        state,
                        frame::PROTOCOL_ERROR,
                        "a WINDOW_UPDATE of nothing".into(),
                    ));
                }
                state.send_window = state
                    .send_window
                    .checked_add(increment)
                    .filter(|window| *window <= MAX_WINDOW)
                    .ok_or_else(|| {
                        protocol_failure(
                            state,
                            frame::FLOW_CONTROL_ERROR,
                            "the connection's window grew past 2^31 - 1".into(),
                        )
                    })?;
            }
        }
        // PRIORITY and unknown kinds.
        _ => {}
    }
    Ok(())
}

/// A frame's data without its padding (`None`: padding longer than the frame).
fn unpadded(flags: u8, payload: &[u8]) -> Option<&[u8]> {
    if flags & frame::PADDED == 0 {
        return Some(payload);
    }
    let (&padding, rest) = payload.split_first()?;
    rest.len().checked_sub(padding as usize).map(|end| &rest[..end])
}

/// A HEADERS frame's header block fragment, without padding and priority.
fn headers_fragment(flags: u8, payload: &[u8]) -> Option<&[u8]> {
    let data = unpadded(flags, payload)?;
    if flags & frame::PRIORITY != 0 {
        data.get(5..)
    } else {
        Some(data)
    }
}

/// A whole header block of `stream` is in: decoded (always, to keep the table in step), and given to the
/// stream as its response head unless it has one (trailers, ignored) or is an interim one (1xx).
fn header_block_done(state: &mut State, stream: u32, wake: &mut Vec<Waker>) -> Result<(), LeanError> {
    let block = std::mem::take(&mut state.block);
    let decoded = decode_head(&mut state.decoder, &block);
    state.block = Vec::new();
    let (status, headers) = decoded.map_err(|why| protocol_failure(state, frame::COMPRESSION_ERROR, why))?;
    let ends = state.block_ends_stream;
    if let Some(open) = state.stream(stream) {
        if matches!(open.head, Head::Waiting) {
            match status {
                Some(status) if status.is_informational() => {}
                Some(status) => open.head = Head::Ready(Box::new((status, headers))),
                None => open.failed = Some(error("a response without a :status")),
            }
        }
        open.ended |= ends;
        wake.extend(open.waker.take());
    }
    Ok(())
}

/// The status and headers of a header block.
fn decode_head(
    decoder: &mut loona_hpack::Decoder<'static>,
    block: &[u8],
) -> Result<(Option<StatusCode>, HeaderMap), String> {
    let mut status = None;
    let mut headers = HeaderMap::new();
    let mut size = 0;
    let mut too_large = false;
    decoder
        .decode_with_cb(block, |name, value| {
            size += name.len() + value.len() + 32;
            if size > MAX_DECODED_HEADERS {
                too_large = true;
                return;
            }
            if &*name == b":status" {
                status = StatusCode::from_bytes(&value).ok();
            } else if !name.starts_with(b":")
                && let (Ok(name), Ok(value)) =
                    (HeaderName::from_bytes(&name), HeaderValue::from_bytes(&value))
            {
                headers.append(name, value);
            }
        })
        .map_err(|e| format!("a header block that does not decode: {e:?}"))?;
    if too_large {
        return Err(format!("headers of more than {MAX_DECODED_HEADERS} bytes"));
    }
    Ok((status, headers))
}

/// Headers that belong to an HTTP/1.1 connection and must not be sent on HTTP/2.
const CONNECTION_HEADERS: [&str; 6] = [
    "connection",
    "host",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

/// The HPACK block of a request's headers: every field a literal, never added to the server's table (ours
/// keeps none either); credentials marked never to be indexed by anything on the way.
fn request_header_block(parts: &http::request::Parts) -> Result<Vec<u8>, LeanError> {
    let uri = &parts.uri;
    let scheme = uri
        .scheme_str()
        .ok_or_else(|| error("a request without a scheme"))?;
    let authority = uri
        .authority()
        .ok_or_else(|| error("a request without an authority"))?;
    // Without userinfo, which HTTP/2 does not carry there.
    let authority = match authority.port_u16() {
        Some(port) => format!("{}:{port}", authority.host()),
        None => authority.host().to_owned(),
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut block = Vec::with_capacity(256);
    for (name, value) in [
        (":method", parts.method.as_str()),
        (":scheme", scheme),
        (":authority", &authority),
        (":path", path),
    ] {
        literal(&mut block, name.as_bytes(), value.as_bytes(), false);
    }
    for (name, value) in &parts.headers {
        if CONNECTION_HEADERS.contains(&name.as_str()) {
            continue;
        }
        if name == http::header::TE && value != "trailers" {
            continue;
        }
        let sensitive =
            name == http::header::AUTHORIZATION || name == http::header::COOKIE || value.is_sensitive();
        literal(&mut block, name.as_str().as_bytes(), value.as_bytes(), sensitive);
    }
    Ok(block)
}

/// A literal header field with a new name, not indexed (or never indexed when `sensitive`), strings raw.
fn literal(block: &mut Vec<u8>, name: &[u8], value: &[u8], sensitive: bool) {
    block.push(if sensitive { 0x10 } else { 0x00 });
    for string in [name, value] {
        integer(block, string.len(), 7, 0x00);
        block.extend_from_slice(string);
    }
}

/// An HPACK integer of `prefix` bits, its first byte's other bits `flags`.
fn integer(block: &mut Vec<u8>, value: usize, prefix: u32, flags: u8) {
    let max = (1usize << prefix) - 1;
    if value < max {
        block.push(flags | value as u8);
        return;
    }
    block.push(flags | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        block.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    block.push(rest as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        State::new(Vec::new())
    }

    fn open(state: &mut State, id: u32) {
        state.streams.push(Stream::new(id));
    }

    fn framed(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        push_frame(&mut out, kind, flags, stream, payload);
        out
    }

    /// A response head as a server encodes it: `:status` from the static table (index 8 is 200), a header
    /// with a literal name.
    fn ok_head() -> Vec<u8> {
        let mut block = vec![0x88];
        literal(&mut block, b"content-type", b"application/json", false);
        block
    }

    #[test]
    fn hpack_integers_follow_the_spec_examples() {
        // RFC 7541, C.1: 10 in a 5-bit prefix, 1337 in a 5-bit prefix, 42 at an octet boundary.
        let mut out = Vec::new();
        integer(&mut out, 10, 5, 0);
        integer(&mut out, 1337, 5, 0);
        integer(&mut out, 42, 8, 0);
        assert_eq!(out, [0x0a, 0x1f, 0x9a, 0x0a, 0x2a]);
    }

    #[test]
    fn a_request_block_decodes_to_its_fields_without_connection_headers() {
        let request = Request::get("https://10.0.0.1:6443/api/v1/pods?watch=true")
            .header("authorization", "Bearer secret")
            .header("connection", "keep-alive")
            .header("accept", "application/json")
            .body(())
            .unwrap();
        let (parts, ()) = request.into_parts();
        let block = request_header_block(&parts).unwrap();
        let fields = loona_hpack::Decoder::new().decode(&block).unwrap();
        let text: Vec<(String, String)> = fields
            .into_iter()
            .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
            .collect();
        let expected = [
            (":method", "GET"),
            (":scheme", "https"),
            (":authority", "10.0.0.1:6443"),
            (":path", "/api/v1/pods?watch=true"),
            ("authorization", "Bearer secret"),
            ("accept", "application/json"),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        assert_eq!(text, expected);
        // The credential is a never-indexed literal.
        let authorization = block.windows(14).position(|w| w == b"\x0dauthorization").unwrap();
        assert_eq!(block[authorization - 1], 0x10);
    }

    #[test]
    fn a_long_header_is_split_into_continuations() {
        let connection = Connection {
            state: Mutex::new(state()),
        };
        let token = "x".repeat(40_000);
        let request = Request::get("https://server/version")
            .header("authorization", format!("Bearer {token}"))
            .body(())
            .unwrap();
        let block = request_header_block(&request.into_parts().0).unwrap();
        assert_eq!(connection.open(&block, &[]), Opened::Stream(1));
        let frames = frames_of(&std::mem::take(&mut connection.lock().out));
        let kinds: Vec<(u8, u8)> = frames.iter().map(|f| (f.0, f.1)).collect();
        assert_eq!(
            kinds,
            [
                (frame::HEADERS, frame::END_STREAM),
                (frame::CONTINUATION, 0),
                (frame::CONTINUATION, frame::END_HEADERS)
            ]
        );
        assert!(frames.iter().all(|f| f.3 <= MAX_FRAME));
        assert_eq!(frames.iter().map(|f| f.3).sum::<usize>(), block.len());
        assert_eq!(connection.lock().next_id, 3);
    }

    #[test]
    fn a_response_head_and_data_reach_the_stream_and_frames_split_between_reads_wait() {
        let mut state = state();
        open(&mut state, 1);
        let mut bytes = framed(frame::HEADERS, frame::END_HEADERS, 1, &ok_head());
        bytes.extend(framed(frame::DATA, frame::PADDED, 1, b"\x03{\"a\":1}\n\0\0\0"));
        bytes.extend(framed(frame::DATA, frame::END_STREAM, 1, b"done"));
        let mut wake = Vec::new();
        // All but the last byte: the last frame waits for it.
        let used = handle_frames(&mut state, &bytes[..bytes.len() - 1], &mut wake).unwrap();
        assert_eq!(used, bytes.len() - 9 - 4);
        let stream = state.stream(1).unwrap();
        assert!(matches!(&stream.head, Head::Ready(head)
            if head.0 == StatusCode::OK && head.1["content-type"] == "application/json"));
        assert_eq!(stream.data, [Bytes::from_static(b"{\"a\":1}\n")]);
        assert_eq!(
            (stream.ended, stream.taken),
            (false, 4),
            "the padding is given back"
        );
        handle_frames(&mut state, &bytes[used..], &mut wake).unwrap();
        let stream = state.stream(1).unwrap();
        assert_eq!(stream.data.len(), 2);
        assert!(stream.ended);
    }

    #[test]
    fn the_server_is_answered_and_bounded() {
        let mut state = state();
        let mut wake = Vec::new();
        // SETTINGS acknowledged, PING answered with its payload.
        let mut bytes = settings(&[(frame::SETTINGS_MAX_FRAME_SIZE, 32_768)]);
        bytes.extend(framed(frame::PING, 0, 0, b"12345678"));
        handle_frames(&mut state, &bytes, &mut wake).unwrap();
        let mut expected = framed(frame::SETTINGS, frame::ACK, 0, &[]);
        expected.extend(framed(frame::PING, frame::ACK, 0, b"12345678"));
        assert_eq!(state.out, expected);
        assert_eq!(state.peer_max_frame, 32 * 1024);

        // A frame larger than agreed ends the connection, with a GOAWAY.
        state.out.clear();
        let mut header = framed(frame::DATA, 0, 1, &[]);
        header[..3].copy_from_slice(&[0, 0x40, 1]);
        let failed = handle_frames(&mut state, &header, &mut wake).unwrap_err();
        assert!(
            failed.to_string().contains("more than the 16384 agreed"),
            "{failed}"
        );
        assert_eq!(state.out[3], frame::GOAWAY);

        // Data beyond a stream's window fails that stream and resets it.
        let mut state = self::state();
        open(&mut state, 3);
        state.stream(3).unwrap().window = 4;
        handle_frames(&mut state, &framed(frame::DATA, 0, 3, b"12345"), &mut wake).unwrap();
        assert!(state.stream(3).unwrap().failed.is_some());
        assert_eq!(
            state.out,
            framed(frame::RST_STREAM, 0, 3, &frame::FLOW_CONTROL_ERROR.to_be_bytes())
        );

        // A push promise is refused: push was turned off.
        assert!(
            handle_frames(
                &mut state,
                &framed(frame::PUSH_PROMISE, frame::END_HEADERS, 3, &[0; 4]),
                &mut wake
            )
            .is_err()
        );
    }

    #[test]
    fn goaway_fails_the_streams_it_did_not_take_and_stops_new_ones() {
        let mut state = state();
        open(&mut state, 1);
        open(&mut state, 3);
        let mut payload = 1u32.to_be_bytes().to_vec();
        payload.extend(frame::NO_ERROR.to_be_bytes());
        handle_frames(
            &mut state,
            &framed(frame::GOAWAY, 0, 0, &payload),
            &mut Vec::new(),
        )
        .unwrap();
        assert!(state.stream(1).unwrap().failed.is_none());
        assert!(state.stream(3).unwrap().failed.is_some());
        assert!(!state.takes_streams());
    }

    #[test]
    fn taking_data_gives_the_window_back_at_half() {
        let connection = Connection {
            state: Mutex::new(state()),
        };
        {
            let mut state = connection.lock();
            open(&mut state, 1);
            let chunk = vec![b'x'; MAX_FRAME];
            let mut bytes = Vec::new();
            for _ in 0..(STREAM_WINDOW as usize / 2 / MAX_FRAME) {
                bytes.extend(framed(frame::DATA, 0, 1, &chunk));
            }
            handle_frames(&mut state, &bytes, &mut Vec::new()).unwrap();
            state.out.clear();
        }
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        while let Poll::Ready(Some(Ok(_))) = connection.poll_data(1, &mut cx) {}
        let state = connection.lock();
        let increment = STREAM_WINDOW / 2;
        assert_eq!(
            state.out,
            framed(frame::WINDOW_UPDATE, 0, 1, &increment.to_be_bytes())
        );
        assert_eq!(state.streams[0].window, STREAM_WINDOW);
    }

    /// Padding is never taken by a reader: once it fills half a stream's window, the window is given back
    /// as it arrives, so that a padded stream cannot run dry.
    #[test]
    fn padding_gives_the_window_back_as_it_arrives() {
        let mut state = state();
        open(&mut state, 1);
        let padding = 255usize;
        let mut payload = vec![padding as u8];
        payload.resize(1 + padding, 0);
        let frame = framed(frame::DATA, frame::PADDED, 1, &payload);
        let frames = (STREAM_WINDOW as usize / 2).div_ceil(payload.len());
        handle_frames(&mut state, &frame.repeat(frames), &mut Vec::new()).unwrap();
        let given: Vec<&[u8]> = state
            .out
            .chunks(13)
            .filter(|f| f[3] == frame::WINDOW_UPDATE && f[8] == 1)
            .map(|f| &f[9..])
            .collect();
        assert_eq!(given.len(), 1, "one update of the stream's window");
        let increment = u32::from_be_bytes(given[0].try_into().unwrap());
        assert!(increment >= STREAM_WINDOW / 2, "{increment}");
        assert_eq!(state.stream(1).unwrap().window, STREAM_WINDOW);
        assert!(state.stream(1).unwrap().data.is_empty());
    }

    /// The connection's window is given back at half as data arrives, whoever takes it; data beyond it is a
    /// breach of flow control.
    #[test]
    fn the_connections_window_is_given_back_at_half_and_held_to() {
        let mut state = state();
        let chunk = framed(frame::DATA, 0, 9, &vec![0; MAX_FRAME]);
        let half = CONNECTION_WINDOW as usize / 2 / MAX_FRAME;
        handle_frames(&mut state, &chunk.repeat(half - 1), &mut Vec::new()).unwrap();
        assert!(state.out.is_empty());
        handle_frames(&mut state, &chunk, &mut Vec::new()).unwrap();
        let increment = CONNECTION_WINDOW / 2;
        assert_eq!(
            state.out,
            framed(frame::WINDOW_UPDATE, 0, 0, &increment.to_be_bytes())
        );

        state.connection_received = CONNECTION_WINDOW - 10;
        let failed =
            handle_frames(&mut state, &framed(frame::DATA, 0, 9, &[0; 11]), &mut Vec::new()).unwrap_err();
        assert!(failed.to_string().contains("connection's window"), "{failed}");
    }

    #[test]
    fn a_hostile_header_block_is_refused() {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(DEFAULT_HEADER_TABLE);
        // A table size update beyond what the spec's default allows.
        let mut block = Vec::new();
        integer(&mut block, 1 << 20, 5, 0x20);
        block.push(0x88);
        assert!(decode_head(&mut decoder, &block).is_err());
        let mut allowed = Vec::new();
        integer(&mut allowed, 0, 5, 0x20);
        allowed.push(0x88);
        assert_eq!(
            decode_head(&mut decoder, &allowed).unwrap().0,
            Some(StatusCode::OK)
        );
        // An index past both tables.
        assert!(decode_head(&mut loona_hpack::Decoder::new(), &[0xff, 0x7f]).is_err());
    }

    /// The frames of `out` as (kind, flags, stream, payload length).
    fn frames_of(out: &[u8]) -> Vec<(u8, u8, u32, usize)> {
        let mut frames = Vec::new();
        let mut rest = out;
        while rest.len() >= 9 {
            let length = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
            let stream = u32::from_be_bytes([rest[5], rest[6], rest[7], rest[8]]);
            frames.push((rest[3], rest[4], stream, length));
            rest = &rest[9 + length..];
        }
        frames
    }

    fn settings(pairs: &[(u16, u32)]) -> Vec<u8> {
        let payload: Vec<u8> = pairs
            .iter()
            .flat_map(|(id, value)| id.to_be_bytes().into_iter().chain(value.to_be_bytes()))
            .collect();
        framed(frame::SETTINGS, 0, 0, &payload)
    }

    /// A connection without a driver, as the server's `frames` left it, nothing left to send.
    fn connection_after(frames: &[u8]) -> Connection {
        let mut state = state();
        let mut wake = Vec::new();
        assert_eq!(
            handle_frames(&mut state, frames, &mut wake).unwrap(),
            frames.len()
        );
        state.out.clear();
        Connection {
            state: Mutex::new(state),
        }
    }

    #[test]
    fn a_body_is_sent_whole_as_its_stream_opens_while_the_servers_windows_take_it() {
        let mut from_server = settings(&[(frame::SETTINGS_INITIAL_WINDOW_SIZE, 40_000)]);
        from_server.extend(framed(frame::WINDOW_UPDATE, 0, 0, &10_000u32.to_be_bytes()));
        let connection = connection_after(&from_server);
        let block = [0x82u8; 10];

        assert_eq!(connection.open(&block, &[7; 40_000]), Opened::Stream(1));
        let sent = std::mem::take(&mut connection.lock().out);
        assert_eq!(
            frames_of(&sent),
            [
                (frame::HEADERS, frame::END_HEADERS, 1, 10),
                (frame::DATA, 0, 1, MAX_FRAME),
                (frame::DATA, 0, 1, MAX_FRAME),
                (frame::DATA, frame::END_STREAM, 1, 40_000 - 2 * MAX_FRAME),
            ],
            "the headers, then the body in frames of the largest size, the last ending the stream"
        );
        assert_eq!(connection.lock().send_window, 65_535 + 10_000 - 40_000);

        // Over a new stream's window: not sent here, and nothing spent.
        assert_eq!(connection.open(&block, &[7; 40_001]), Opened::NotNow);
        // Within a stream's window, over what is left of the connection's.
        assert_eq!(connection.open(&block, &[7; 40_000]), Opened::NotNow);
        assert!(connection.lock().out.is_empty());
        // The server gives the connection's window back: it is sent.
        let mut wake = Vec::new();
        let update = framed(frame::WINDOW_UPDATE, 0, 0, &40_000u32.to_be_bytes());
        handle_frames(&mut connection.lock(), &update, &mut wake).unwrap();
        assert_eq!(connection.open(&block, &[7; 40_000]), Opened::Stream(3));
        connection.lock().out.clear();

        // Bodies that wait to be written are bounded: another goes elsewhere until they are.
        let mut roomy = settings(&[(frame::SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20)]);
        roomy.extend(framed(frame::WINDOW_UPDATE, 0, 0, &(4u32 << 20).to_be_bytes()));
        handle_frames(&mut connection.lock(), &roomy, &mut wake).unwrap();
        connection.lock().out.clear();
        assert_eq!(connection.open(&block, &[7; 200 << 10]), Opened::Stream(5));
        assert_eq!(connection.open(&block, &[7; 100 << 10]), Opened::NotNow);
        connection.lock().out.clear();
        assert_eq!(connection.open(&block, &[7; 100 << 10]), Opened::Stream(7));
        connection.lock().out.clear();

        // Without a body: the headers end the stream.
        assert_eq!(connection.open(&block, &[]), Opened::Stream(9));
        assert_eq!(
            frames_of(&connection.lock().out),
            [(frame::HEADERS, frame::END_HEADERS | frame::END_STREAM, 9, 10)]
        );
    }

    #[test]
    fn windows_the_spec_forbids_end_the_connection_and_a_streams_update_changes_nothing() {
        let mut wake = Vec::new();
        for (frames, why) in [
            (
                framed(frame::WINDOW_UPDATE, 0, 0, &0u32.to_be_bytes()),
                "a WINDOW_UPDATE of nothing",
            ),
            (
                framed(frame::WINDOW_UPDATE, 0, 0, &MAX_WINDOW.to_be_bytes()),
                "grew past",
            ),
            (
                settings(&[(frame::SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW + 1)]),
                "a stream window of",
            ),
            (framed(frame::WINDOW_UPDATE, 0, 0, &[0; 3]), "bad size"),
        ] {
            let mut state = state();
            let failed = handle_frames(&mut state, &frames, &mut wake).unwrap_err();
            assert!(failed.to_string().contains(why), "{failed}");
            assert!(
                frames_of(&state.out).iter().any(|f| f.0 == frame::GOAWAY),
                "{why}: a GOAWAY"
            );
        }
        let mut state = state();
        open(&mut state, 1);
        let update = framed(frame::WINDOW_UPDATE, 0, 1, &1_000u32.to_be_bytes());
        handle_frames(&mut state, &update, &mut wake).unwrap();
        assert_eq!(state.send_window, DEFAULT_WINDOW);
        assert!(state.out.is_empty());
    }
}
