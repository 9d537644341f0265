//! Charts rendered by one long-lived process on Helm's own engine (`cso-renderer`, `hack/renderer`), so that no
//! render starts a `helm` process.
//!
//! [`Engine`] starts the program at its first request and keeps it: requests go to its stdin as JSON lines,
//! each with an id, and its answers come back on stdout in any order, matched by id, so any number of renders
//! run at once. The program answers what `helm template` (Helm 3) prints for the same inputs, byte for byte,
//! with `lookup` against the target cluster for a request with a `target_kubeconfig` (as `--dry-run=server`),
//! and errors worded as helm's stderr; it keeps loaded charts and cluster clients in memory.
//!
//! Failure handling:
//! - a request that takes longer than the timeout is answered with [`RenderError::Timeout`]. Helm's engine
//!   cannot stop a template that runs on, so the process that held it is retired: new requests go to a new
//!   process, and the old one is killed as soon as its other requests are answered or have timed out;
//! - when the process dies, every request waiting on it fails with [`RenderError::Engine`] (with the end of
//!   its stderr), and the next request starts a new one;
//! - an answer over the output limit ([`MAX_OUTPUT_BYTES`] by default) is refused by the program itself
//!   ([`RenderError::OutputTooLarge`]); a line from it longer than any answer may be ends the process.
//!
//! An [`Engine`] is a cheap handle: clones share the process (one for the chart renderer, one for
//! [`ValuesTemplater::with_engine`](crate::ValuesTemplater::with_engine)).

use std::{
    collections::{BTreeSet, HashMap},
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader},
    process::ChildStdin,
    sync::oneshot,
};

use crate::{ChartRenderer, RenderError, RenderRequest, helm::MAX_OUTPUT_BYTES};

/// How much of the program's stderr is kept for the message when it dies.
const STDERR_TAIL_BYTES: usize = 16 << 10;
/// The chart named in errors of values templating (the helper chart inside the program).
const VALUES_CHART: &str = "cluster-addon-values";

/// The long-lived renderer on Helm's engine. Implements [`ChartRenderer`]; see the module documentation.
#[derive(Clone, Debug)]
pub struct Engine {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    binary: PathBuf,
    timeout: Duration,
    output_limit: usize,
    next_id: AtomicU64,
    /// The process new requests go to; `None` before the first request and after one died or was retired.
    current: tokio::sync::Mutex<Option<Arc<Process>>>,
    /// The process ids of every program started by this handle that has not exited yet: the current one and
    /// any retired one still finishing its requests (what the operator's memory metrics add up).
    running: Arc<Mutex<BTreeSet<u32>>>,
}

/// One running program.
#[derive(Debug)]
struct Process {
    pid: Option<u32>,
    stdin: tokio::sync::Mutex<ChildStdin>,
    shared: Arc<Shared>,
}

/// What the process's reader task and the requests share.
#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    stderr_tail: Mutex<Vec<u8>>,
    /// Tells the task that owns the child to kill it.
    kill: Mutex<Option<oneshot::Sender<()>>>,
}

#[derive(Debug, Default)]
struct State {
    waiting: HashMap<u64, oneshot::Sender<Result<Answer, String>>>,
    /// Why the process can take no more requests (it died or its output could not be read).
    closed: Option<String>,
    /// No new requests; killed once `waiting` is empty.
    retired: bool,
}

#[derive(Serialize)]
struct Request<'a> {
    id: u64,
    kind: &'static str,
    #[serde(skip_serializing_if = "str::is_empty")]
    chart: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    release_name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    namespace: &'a str,
    values: Option<&'a str>,
    kube_version: Option<&'a str>,
    api_versions: &'a [String],
    include_crds: bool,
    kubeconfig: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    template: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a serde_json::Value>,
    max_output: usize,
    timeout_ms: u64,
}

#[derive(Debug, Deserialize)]
struct Answer {
    id: u64,
    #[serde(default)]
    output: String,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    too_large: bool,
}

impl Engine {
    /// The program at `binary` (a path, or a name looked up on `PATH`); each request may take `timeout`. Nothing
    /// starts until the first request.
    pub fn new(binary: impl Into<PathBuf>, timeout: Duration) -> Self {
        Engine {
            inner: Arc::new(Inner {
                binary: binary.into(),
                timeout,
                output_limit: MAX_OUTPUT_BYTES,
                next_id: AtomicU64::new(1),
                current: tokio::sync::Mutex::new(None),
                running: Arc::default(),
            }),
        }
    }

    /// The same program with another limit on one answer's output (default [`MAX_OUTPUT_BYTES`]). Call it
    /// before cloning: clones made earlier keep the old limit (and a process of their own).
    pub fn with_output_limit(self, bytes: usize) -> Self {
        let inner = &self.inner;
        Engine {
            inner: Arc::new(Inner {
                binary: inner.binary.clone(),
                timeout: inner.timeout,
                output_limit: bytes,
                next_id: AtomicU64::new(1),
                current: tokio::sync::Mutex::new(None),
                running: Arc::default(),
            }),
        }
    }

    /// The most output one answer may carry.
    pub fn output_limit(&self) -> usize {
        self.inner.output_limit
    }

    /// The process id of the running program, if one runs (for tests and diagnostics).
    pub async fn process_id(&self) -> Option<u32> {
        let current = self.inner.current.lock().await;
        current
            .as_ref()
            .filter(|p| p.shared.is_open())
            .and_then(|p| p.pid)
    }

    /// The process ids of the programs running now: the current one and any retired one still finishing its
    /// requests. Cheap and not async, for scrape-time metrics.
    pub fn process_ids(&self) -> Vec<u32> {
        let running = self.inner.running.lock().unwrap_or_else(|p| p.into_inner());
        running.iter().copied().collect()
    }

    /// What `helm template` prints for cso's values helper chart (crates/render/src/values.rs) with the values
    /// `{"template": template, "data": data}`, at most `output_limit` bytes of it.
    pub async fn template_values(
        &self,
        template: &str,
        data: &serde_json::Value,
        output_limit: usize,
    ) -> Result<String, RenderError> {
        let request = Request {
            kind: "values",
            template: Some(template),
            data: Some(data),
            max_output: output_limit,
            ..Request::empty()
        };
        self.call(request, Path::new(VALUES_CHART), output_limit).await
    }

    async fn call(
        &self,
        mut request: Request<'_>,
        chart: &Path,
        limit: usize,
    ) -> Result<String, RenderError> {
        request.id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        request.timeout_ms = u64::try_from(self.inner.timeout.as_millis()).unwrap_or(u64::MAX);
        let mut line = serde_json::to_vec(&request).map_err(|e| self.failed(chart, e.to_string()))?;
        line.push(b'\n');
        let timeout = self.inner.timeout;
        let asked = tokio::time::Instant::now();
        // A process that died before it took the request: once more with a new one.
        for attempt in 0..2 {
            let process = self.process().await?;
            let (sender, answer) = oneshot::channel();
            if let Err(why) = process.shared.wait_for(request.id, sender) {
                if attempt == 0 {
                    continue;
                }
                return Err(self.failed(chart, why));
            }
            let _pending = Pending {
                shared: process.shared.clone(),
                id: request.id,
            };
            let exchange = async {
                let written = {
                    let mut stdin = process.stdin.lock().await;
                    match stdin.write_all(&line).await {
                        Ok(()) => stdin.flush().await,
                        Err(e) => Err(e),
                    }
                };
                if let Err(e) = written {
                    // Its reader fails every waiting request when the process is gone; this one is failed here,
                    // in case the pipe broke first.
                    process.shared.close(format!("writing to it failed: {e}"));
                }
                answer.await
            };
            return match tokio::time::timeout_at(asked + timeout, exchange).await {
                Ok(Ok(Ok(answer))) => self.answer(answer, chart, limit),
                Ok(Ok(Err(why))) => Err(self.failed(chart, why)),
                Ok(Err(_)) => Err(self.failed(chart, "it stopped answering".into())),
                Err(_) => {
                    self.retire(&process).await;
                    Err(RenderError::Timeout {
                        chart: chart.to_path_buf(),
                        timeout,
                    })
                }
            };
        }
        Err(self.failed(chart, "it could not be started".into()))
    }

    fn answer(&self, answer: Answer, chart: &Path, limit: usize) -> Result<String, RenderError> {
        if answer.too_large {
            return Err(RenderError::OutputTooLarge {
                chart: chart.to_path_buf(),
                limit,
            });
        }
        match answer.error {
            Some(stderr) => Err(RenderError::Failed {
                chart: chart.to_path_buf(),
                stderr,
            }),
            None => Ok(answer.output),
        }
    }

    fn failed(&self, chart: &Path, message: String) -> RenderError {
        RenderError::Engine {
            binary: self.inner.binary.clone(),
            chart: chart.to_path_buf(),
            message,
        }
    }

    /// The running process, or a new one.
    async fn process(&self) -> Result<Arc<Process>, RenderError> {
        let mut current = self.inner.current.lock().await;
        if let Some(process) = current.as_ref().filter(|p| p.shared.is_open()) {
            return Ok(process.clone());
        }
        let process = Arc::new(self.spawn()?);
        *current = Some(process.clone());
        Ok(process)
    }

    /// No new requests for `process`; it is killed once the requests it holds are over.
    async fn retire(&self, process: &Arc<Process>) {
        let mut current = self.inner.current.lock().await;
        if current.as_ref().is_some_and(|p| Arc::ptr_eq(p, process)) {
            *current = None;
        }
        drop(current);
        let pid = process.pid;
        tracing::warn!(?pid, "a render timed out: the renderer process is replaced");
        process.shared.retire();
    }

    fn spawn(&self) -> Result<Process, RenderError> {
        let spawn_error = |source| RenderError::Spawn {
            program: "cso-renderer",
            binary: self.inner.binary.clone(),
            source,
        };
        let mut child = tokio::process::Command::new(&self.inner.binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(spawn_error)?;
        let missing = || spawn_error(std::io::Error::other("a pipe to the renderer is missing"));
        let stdin = child.stdin.take().ok_or_else(missing)?;
        let stdout = child.stdout.take().ok_or_else(missing)?;
        let stderr = child.stderr.take().ok_or_else(missing)?;
        let pid = child.id();
        tracing::debug!(?pid, binary = %self.inner.binary.display(), "renderer started");

        let (kill, killed) = oneshot::channel::<()>();
        let shared = Arc::new(Shared {
            kill: Mutex::new(Some(kill)),
            ..Shared::default()
        });
        let (exited_tx, exited) = oneshot::channel();
        let running = self.inner.running.clone();
        if let Some(pid) = pid {
            running.lock().unwrap_or_else(|p| p.into_inner()).insert(pid);
        }
        tokio::spawn(async move {
            // Killed when told to, or when every handle is gone (the sender dropped).
            let told = tokio::select! {
                _ = killed => true,
                _ = child.wait() => false,
            };
            if told {
                let _ = child.start_kill();
            }
            let status = child.wait().await;
            if let Some(pid) = pid {
                running.lock().unwrap_or_else(|p| p.into_inner()).remove(&pid);
            }
            let _ = exited_tx.send(status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()));
        });
        let stderr_done = tokio::spawn(keep_tail(stderr, shared.clone()));
        // An answer is JSON: escaping may make a line up to six times its output, and the rest is small.
        let max_line = self.inner.output_limit.saturating_mul(6).saturating_add(64 << 10);
        tokio::spawn(read_answers(
            stdout,
            shared.clone(),
            max_line,
            stderr_done,
            exited,
        ));
        Ok(Process {
            pid,
            stdin: tokio::sync::Mutex::new(stdin),
            shared,
        })
    }
}

impl Request<'_> {
    fn empty() -> Self {
        Request {
            id: 0,
            kind: "render",
            chart: "",
            release_name: "",
            namespace: "",
            values: None,
            kube_version: None,
            api_versions: &[],
            include_crds: false,
            kubeconfig: None,
            template: None,
            data: None,
            max_output: 0,
            timeout_ms: 0,
        }
    }
}

impl ChartRenderer for Engine {
    fn render(&self, request: RenderRequest) -> BoxFuture<'_, Result<String, RenderError>> {
        Box::pin(async move {
            let chart = request.chart.to_string_lossy();
            let kubeconfig = request
                .target_kubeconfig
                .as_ref()
                .map(|path| path.to_string_lossy());
            let limit = self.inner.output_limit;
            let call = Request {
                kind: "render",
                chart: &chart,
                release_name: &request.release_name,
                namespace: &request.namespace,
                values: request.values.as_deref(),
                kube_version: request.kube_version.as_deref(),
                api_versions: &request.api_versions,
                include_crds: request.include_crds,
                kubeconfig: kubeconfig.as_deref(),
                max_output: limit,
                ..Request::empty()
            };
            self.call(call, &request.chart, limit).await
        })
    }
}

impl Shared {
    fn is_open(&self) -> bool {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.closed.is_none() && !state.retired
    }

    /// Registers a request; refused when the process can take no more.
    fn wait_for(&self, id: u64, sender: oneshot::Sender<Result<Answer, String>>) -> Result<(), String> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(why) = &state.closed {
            return Err(why.clone());
        }
        state.waiting.insert(id, sender);
        Ok(())
    }

    fn deliver(&self, answer: Answer) {
        let sender = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.waiting.remove(&answer.id)
        };
        // No one waiting: the request timed out or its caller gave up.
        if let Some(sender) = sender {
            let _ = sender.send(Ok(answer));
        }
    }

    /// The process is gone or unusable: every waiting request fails with `why`, and it is killed.
    fn close(&self, why: String) {
        let waiting = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if state.closed.is_none() {
                state.closed = Some(why.clone());
            }
            std::mem::take(&mut state.waiting)
        };
        for (_, sender) in waiting {
            let _ = sender.send(Err(why.clone()));
        }
        self.kill();
    }

    fn retire(&self) {
        let idle = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.retired = true;
            state.waiting.is_empty()
        };
        if idle {
            self.kill();
        }
    }

    /// A request is over (answered, failed, timed out or dropped by its caller).
    fn forget(&self, id: u64) {
        let retired_and_idle = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.waiting.remove(&id);
            state.retired && state.waiting.is_empty()
        };
        if retired_and_idle {
            self.kill();
        }
    }

    /// Whether [`Self::kill`] was called.
    fn kill_requested(&self) -> bool {
        self.kill.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }

    fn kill(&self) {
        let kill = self.kill.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(kill) = kill {
            let _ = kill.send(());
        }
    }

    fn stderr_tail(&self) -> String {
        let tail = self.stderr_tail.lock().unwrap_or_else(|p| p.into_inner());
        String::from_utf8_lossy(&tail).trim().to_owned()
    }
}

impl Drop for Process {
    /// No handle left: nothing will read its answers.
    fn drop(&mut self) {
        self.shared.kill();
    }
}

/// Removes a request from the waiting list however its future ends.
struct Pending {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.shared.forget(self.id);
    }
}

/// Reads answers until the process's stdout ends, then fails whatever still waits.
async fn read_answers(
    stdout: impl AsyncRead + Unpin,
    shared: Arc<Shared>,
    max_line: usize,
    stderr_done: tokio::task::JoinHandle<()>,
    exited: oneshot::Receiver<String>,
) {
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    let why = loop {
        line.clear();
        let cap = u64::try_from(max_line).unwrap_or(u64::MAX).saturating_add(1);
        match (&mut reader).take(cap).read_until(b'\n', &mut line).await {
            Ok(0) => break "it exited".to_owned(),
            Ok(_) if line.last() != Some(&b'\n') => {
                if line.len() > max_line {
                    break format!("it wrote an answer over {max_line} bytes");
                }
                break "it exited in the middle of an answer".to_owned();
            }
            Ok(_) => match serde_json::from_slice::<Answer>(&line) {
                Ok(answer) => shared.deliver(answer),
                Err(e) => break format!("it wrote an unreadable answer: {e}"),
            },
            Err(e) => break format!("reading its answers failed: {e}"),
        }
    };
    // Ended on purpose (every handle gone, as after the start-up check of `cso run`, or retired after a timeout,
    // which is warned about there): not news.
    let ended_on_purpose = shared.kill_requested();
    // Not waiting for an exit that is not coming: the reasons above but the first leave it running.
    shared.kill();
    let status = tokio::time::timeout(Duration::from_secs(5), exited)
        .await
        .ok()
        .and_then(Result::ok);
    let _ = tokio::time::timeout(Duration::from_secs(1), stderr_done).await;
    let mut message = format!("the renderer process stopped: {why}");
    if let Some(status) = status {
        message.push_str(&format!(" ({status})"));
    }
    let tail = shared.stderr_tail();
    if !tail.is_empty() {
        message.push_str(&format!("; its stderr ends with: {tail}"));
    }
    if ended_on_purpose {
        tracing::debug!(%message, "renderer process ended");
    } else {
        tracing::warn!(%message, "renderer process ended");
    }
    shared.close(message);
}

/// Keeps the last [`STDERR_TAIL_BYTES`] of the process's stderr (helm's warnings, a Go panic).
async fn keep_tail(stderr: impl AsyncRead + Unpin, shared: Arc<Shared>) {
    let mut stderr = stderr;
    let mut chunk = vec![0_u8; 8 << 10];
    loop {
        match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let mut tail = shared.stderr_tail.lock().unwrap_or_else(|p| p.into_inner());
                tail.extend_from_slice(chunk.get(..n).unwrap_or_default());
                let excess = tail.len().saturating_sub(STDERR_TAIL_BYTES);
                tail.drain(..excess);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    /// A stand-in for the program: a shell script running `body` (a probe run only checks that it starts).
    fn fake(dir: &Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("renderer");
        std::fs::write(
            &path,
            format!("#!/bin/sh\n[ \"$FAKE_RENDERER_PROBE\" = 1 ] && exit 0\n{body}\n"),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Another test's fork may hold the file open for writing until it execs (ETXTBSY): wait until it runs.
        for _ in 0..100 {
            match std::process::Command::new(&path)
                .env("FAKE_RENDERER_PROBE", "1")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
            {
                Err(e) if e.raw_os_error() == Some(26) => std::thread::sleep(Duration::from_millis(20)),
                _ => break,
            }
        }
        path
    }

    fn request() -> RenderRequest {
        RenderRequest {
            chart: "/charts/c".into(),
            release_name: "r".into(),
            namespace: "ns".into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_process_that_writes_garbage_fails_the_request_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::new(
            fake(
                dir.path(),
                "read line; echo oops >&2; echo 'not json'; exec sleep 30",
            ),
            Duration::from_secs(30),
        );
        let err = engine.render(request()).await.unwrap_err();
        let RenderError::Engine { message, .. } = &err else {
            panic!("{err}")
        };
        assert!(message.contains("unreadable answer"), "{message}");
        assert!(message.contains("oops"), "names its stderr: {message}");
    }

    #[tokio::test]
    async fn an_answer_over_the_line_limit_ends_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::new(
            fake(dir.path(), "read line; head -c 200000 /dev/zero | tr '\\0' a"),
            Duration::from_secs(30),
        )
        .with_output_limit(1 << 10);
        let err = engine.render(request()).await.unwrap_err();
        assert!(err.to_string().contains("an answer over"), "{err}");
    }

    #[tokio::test]
    async fn the_running_programs_are_listed_until_they_exit() {
        let dir = tempfile::tempdir().unwrap();
        // Answers every request with "ok" under its id (the id is the first field of a request).
        let answering = r#"while read line; do
  id=$(printf '%s' "$line" | sed 's/^{"id":\([0-9]*\).*/\1/')
  echo "{\"id\":$id,\"output\":\"ok\"}"
done"#;
        let engine = Engine::new(fake(dir.path(), answering), Duration::from_secs(30));
        assert!(
            engine.process_ids().is_empty(),
            "nothing starts before the first request"
        );
        assert_eq!(engine.render(request()).await.unwrap(), "ok");
        let pid = engine.process_id().await.unwrap();
        assert_eq!(engine.process_ids(), [pid]);

        let running = engine.inner.running.clone();
        drop(engine);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !running.lock().unwrap().is_empty() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{pid} still listed after its engine is gone"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn a_program_that_cannot_start_is_a_spawn_error() {
        let engine = Engine::new("/nonexistent/cso-renderer", Duration::from_secs(5));
        let err = engine.render(request()).await.unwrap_err();
        assert!(matches!(err, RenderError::Spawn { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("failed to run cso-renderer (/nonexistent/cso-renderer): "),
            "names the renderer, not helm: {err}"
        );
    }
}
