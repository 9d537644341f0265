//! A TCP proxy on loopback in front of an API server, for tests of outages as the operator sees them: cut off
//! (connections dropped, new ones refused) or silenced (a partition), then restored on the same port.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

/// A TCP proxy on loopback in front of an API server that a test can cut off (open connections dropped, new
/// ones refused) or silence (a network partition: open connections stay open and carry nothing, new ones are
/// accepted and carry nothing) and restore on the same port: an API outage as the operator sees it.
#[derive(Debug)]
pub struct ApiProxy {
    port: u16,
    upstream: String,
    serving: Option<tokio::task::JoinHandle<()>>,
    /// True while silenced: nothing is forwarded either way.
    silent: tokio::sync::watch::Sender<bool>,
    /// Counts the cuts. A connection forwards nothing once a cut came after it was opened: aborting its task
    /// takes effect only at its next pause, and bytes it read after the cut (an event of a change made behind
    /// the cut, say) must not reach the other side.
    cuts: Arc<AtomicU64>,
    /// The connections being forwarded now.
    forwarding: Arc<AtomicUsize>,
}

impl ApiProxy {
    /// Proxies to the server of `server_url` (`https://127.0.0.1:<port>`).
    pub async fn start(server_url: &str) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let upstream = server_url.trim_start_matches("https://").to_owned();
        let (silent, _) = tokio::sync::watch::channel(false);
        let cuts = Arc::new(AtomicU64::new(0));
        let forwarding = Arc::new(AtomicUsize::new(0));
        Ok(ApiProxy {
            port: listener.local_addr()?.port(),
            serving: Some(Self::serve(
                listener,
                upstream.clone(),
                silent.clone(),
                cuts.clone(),
                forwarding.clone(),
            )),
            upstream,
            silent,
            cuts,
            forwarding,
        })
    }

    /// The client connections open through the proxy now.
    pub fn open_connections(&self) -> usize {
        self.forwarding.load(Ordering::SeqCst)
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Drops every open connection and stops listening: connections are refused until [`Self::restore`].
    /// Nothing read after it returns is forwarded.
    pub fn cut(&mut self) {
        self.cuts.fetch_add(1, Ordering::SeqCst);
        if let Some(serving) = self.serving.take() {
            serving.abort();
        }
    }

    /// Forwards nothing until [`Self::restore`], closing nothing: what was sent waits, as packets of a
    /// partition wait for TCP's retransmissions.
    pub fn silence(&self) {
        self.silent.send_replace(true);
    }

    /// Forwards again; listens again on the same port after a [`Self::cut`].
    pub async fn restore(&mut self) -> std::io::Result<()> {
        self.silent.send_replace(false);
        if self.serving.is_some() {
            return Ok(());
        }
        // The port may take a moment to be free again.
        let mut attempts = 0;
        let listener = loop {
            match tokio::net::TcpListener::bind(("127.0.0.1", self.port)).await {
                Ok(listener) => break listener,
                Err(e) if attempts >= 50 => return Err(e),
                Err(_) => {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        self.serving = Some(Self::serve(
            listener,
            self.upstream.clone(),
            self.silent.clone(),
            self.cuts.clone(),
            self.forwarding.clone(),
        ));
        Ok(())
    }

    fn serve(
        listener: tokio::net::TcpListener,
        upstream: String,
        silent: tokio::sync::watch::Sender<bool>,
        cuts: Arc<AtomicU64>,
        forwarding: Arc<AtomicUsize>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            // Dropped with the task when it is aborted: that closes every connection.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    // Out of descriptors, say: not a busy loop.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let upstream = upstream.clone();
                let silent = silent.subscribe();
                let counted = Forwarding::begin(forwarding.clone());
                let open = Open {
                    cuts: cuts.clone(),
                    at: cuts.load(Ordering::SeqCst),
                };
                connections.spawn(async move {
                    let _counted = counted;
                    let mut quiet = silent.clone();
                    if quiet.wait_for(|silent| !silent).await.is_err() {
                        return;
                    }
                    if let Ok(outbound) = tokio::net::TcpStream::connect(&upstream).await {
                        let (from_client, to_client) = inbound.into_split();
                        let (from_server, to_server) = outbound.into_split();
                        tokio::select! {
                            () = forward(from_client, to_server, silent.clone(), &open) => {}
                            () = forward(from_server, to_client, silent, &open) => {}
                        }
                    }
                });
                while connections.try_join_next().is_some() {}
            }
        })
    }
}

/// Counts a connection as forwarded until dropped (with its task: it ends, or the proxy is cut).
struct Forwarding(Arc<AtomicUsize>);

impl Forwarding {
    fn begin(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Forwarding(count)
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether a connection is still open: no cut since it was.
struct Open {
    cuts: Arc<AtomicU64>,
    at: u64,
}

impl Open {
    fn still(&self) -> bool {
        self.cuts.load(Ordering::SeqCst) == self.at
    }
}

/// Copies `from` to `to` until either ends or the connection is cut, holding whatever it reads while `silent`
/// says so.
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut silent: tokio::sync::watch::Receiver<bool>,
    open: &Open,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        if silent.wait_for(|silent| !silent).await.is_err() {
            return;
        }
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        if silent.wait_for(|silent| !silent).await.is_err() || !open.still() {
            return;
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

impl Drop for ApiProxy {
    fn drop(&mut self) {
        self.cut();
    }
}
