//! Process-level scale benchmark (issue 15, point 4): `cso run` as its own process against a real management
//! control plane and several workload kube-apiservers (etcd + kube-apiserver processes of `cso_testenv`).
//!
//! For each size N, in a fresh environment with a fresh operator:
//!
//! 1. the ferrol ClusterStack (v1) is created and its release made ready;
//! 2. N Clusters of class `docker-ferrol-1-27-v1` (each with its `<name>-kubeconfig` Secret pointing at one of
//!    the workload API servers, round robin; each with the spec and, from the stand-in below, the status of a
//!    site's provisioned Cluster, about 4.3 KB of JSON) are created at once; measured: the time until every ClusterAddon
//!    is ready;
//! 3. upgrade: the ClusterStack gets v2, then every Cluster is moved to class `docker-ferrol-1-27-v2` at once
//!    (v2 changes the metrics-server labels and prunes the Deployment `web`); measured: the time until every
//!    ClusterAddon is ready on v2;
//! 4. optionally an idle phase: write requests to every API server and the operator's CPU over a window that
//!    spans two resyncs, then one applied object deleted in a workload cluster and the time until it is back.
//!
//! For every phase: CPU (utime + stime from `/proc/<pid>/stat`) and peak RSS (`VmHWM`) of the `cso` process and,
//! separately, of its child processes (`cso-renderer`); the operator's requests to the management API server
//! (its metrics endpoint, `cso_kube_requests_total{verb,resource}`); the requests the workload API servers
//! received (their `apiserver_request_total`); CPU of the API servers (kube-apiserver + etcd). And, once per
//! run, the time of 50 sequential plain `helm template` runs of the ferrol v1 addon chart as a reference.
//!
//! Run it with:
//!
//! ```sh
//! make tools                                   # kube-apiserver, helm, cso-renderer into ~/.cache/cso
//! CSO_BENCH_N=1,50 cargo bench -p cso --bench scale
//! ```
//!
//! `cargo bench` builds the `cso` binary with the release settings (the `bench` profile inherits `release`;
//! several minutes on 2 cores the first time) and this benchmark runs that binary. Settings, all optional:
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `CSO_BENCH_N` | sizes, comma-separated | `1,50` |
//! | `CSO_BENCH_WORKLOADS` | workload API servers | `3` |
//! | `CSO_BENCH_TIMEOUT` | how long a phase waits for readiness before it reports how many were ready | `900s` |
//! | `CSO_BENCH_IDLE` | length of the idle window (`600s`, `10m`); no idle phase without it | off |
//! | `CSO_BENCH_RESYNC` | `--resync-interval` when idle is on | 2/5 of the idle window |
//! | `CSO_BENCH_HOSTS` | `server`: a Cluster's control-plane host is its workload API server's (`w1.example.test`), so the Clusters sharing a server apply identical objects, as if each had a cluster of its own; `cluster`: each Cluster's host is its own (`c7.example.test`), so every Cluster renders its own values (see below) | `server` |
//! | `CSO_BENCH_ARGS` | more flags for `cso run`, space-separated (e.g. `--clusteraddon-concurrency=1`) | none |
//! | `CSO_BENCH_HELM_RUNS` | sequential `helm template` runs of the reference | `50` |
//! | `CSO_BENCH_BINARY` | another `cso` binary to run (e.g. a release build of an older commit, to compare) | this package's |
//! | `CSO_BENCH_MOVE` | `all`: the upgrade patches every Cluster's class at once; `rollout`: a ClusterStackRollout moves them in 3 waves (the Clusters labelled `wave=w0,w1,w2` round robin), each started when the one before is done; measured until it is `Completed` (issue 30) | `all` |
//! | `CSO_BENCH_ADDRESSES` | `cluster`: each Cluster's kubeconfig names an address of its own, a loopback port forwarded to its workload API server (`cso_testenv::proxy::ApiProxy`), as at a site, where no two Clusters share a server and so no connection can be shared; `server`: the kubeconfigs name the workload API servers themselves (the rows before issue 42) | `cluster` |
//! | `CSO_BENCH_SHARDS` | `1`: one `cso run` as above; `3`: three (the default shard, `--shard=a`, `--shard=b`, each with `--leader-elect=true`, its own ports, release directory and log), the Clusters labelled `clusterstack.x-k8s.io/shard` round robin none/a/b at creation, and the cost reported per process and summed (issue 18) | `1` |
//!
//! With `CSO_BENCH_HOSTS=cluster` and more Clusters than workload API servers, Clusters sharing a server write
//! different labels into the same objects (the addons go to fixed names in `kube-system`), so each apply
//! changes what another Cluster applied: an operator that watches its objects for drift fights itself there.
//! With `server` (the default) the chart renders are shared by the Clusters of one server (the render cache
//! hits); the values are still templated once per Cluster.
//!
//! There is no Cluster API here: a rollout counts a Cluster done only once Cluster API reports its topology
//! reconciled, so a stand-in of that part of Cluster API's contract runs beside it (both modes): for every
//! Cluster whose `metadata.generation` is newer than its `status.observedGeneration`, it writes
//! `status.observedGeneration` and `TopologyReconciled=True` (`capi_status_stand_in`); its writes go to the
//! management API server, not through the operator.
//!
//! No assertions on times: it reports numbers. Everything it starts (API servers, `cso`, temporary
//! directories) is stopped and removed at the end, on failure and on Ctrl-C.
#![allow(clippy::unwrap_used, reason = "a benchmark: a failed unwrap is a failed run")]

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use cso_api::{ClusterAddon, ClusterStack, ClusterStackRelease};
use cso_testenv::{ControlPlane, Tools, process::Supervised, usage::Usage};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
    core::GroupVersionKind,
    discovery::ApiResource,
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const V1: &str = "docker-ferrol-1-27-v1";
const V2: &str = "docker-ferrol-1-27-v2";
/// Objects created or patched at the same time.
const IN_FLIGHT: usize = 16;

// ---------------------------------------------------------------------------------------------------------
// Settings

#[derive(Clone, Debug)]
struct Settings {
    sizes: Vec<usize>,
    workloads: usize,
    timeout: Duration,
    idle: Option<Duration>,
    resync: Option<Duration>,
    shared_hosts: bool,
    extra_args: Vec<String>,
    helm_runs: usize,
    /// The `cso` binary: this package's, or `CSO_BENCH_BINARY` (another build, to compare).
    binary: PathBuf,
    /// `CSO_BENCH_SHARDS`: 1 or 3 `cso run` processes.
    shards: usize,
    /// `CSO_BENCH_ADDRESSES=cluster`: each Cluster's kubeconfig names a loopback port of its own.
    own_addresses: bool,
    /// `CSO_BENCH_MOVE=rollout`: the upgrade moves the Clusters by a ClusterStackRollout in 3 waves instead of
    /// patching every Cluster at once.
    rollout: bool,
}

/// The shard label of Cluster `i`: with 3 shards round robin none (the default shard), `a`, `b`.
fn shard_of(settings: &Settings, i: usize) -> Option<&'static str> {
    if settings.shards == 3 {
        [None, Some("a"), Some("b")][i % 3]
    } else {
        None
    }
}

/// `600s`, `10m`, `1h`, `500ms` or plain seconds.
fn parse_duration(text: &str) -> Duration {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let number: f64 = number
        .parse()
        .unwrap_or_else(|_| panic!("not a duration: {text}"));
    let seconds = match unit {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        "h" => number * 3600.0,
        _ => panic!("not a duration: {text} (units: ms, s, m, h)"),
    };
    Duration::from_secs_f64(seconds)
}

impl Settings {
    fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let idle = var("CSO_BENCH_IDLE").map(|v| parse_duration(&v));
        let resync = idle.map(|idle| {
            var("CSO_BENCH_RESYNC").map_or_else(
                || Duration::from_secs((idle.as_secs() * 2 / 5).max(1)),
                |v| parse_duration(&v),
            )
        });
        Settings {
            sizes: var("CSO_BENCH_N")
                .unwrap_or_else(|| "1,50".to_owned())
                .split(',')
                .filter_map(|n| n.trim().parse().ok())
                .collect(),
            workloads: var("CSO_BENCH_WORKLOADS").map_or(3, |v| v.parse().unwrap()),
            timeout: var("CSO_BENCH_TIMEOUT").map_or(Duration::from_secs(900), |v| parse_duration(&v)),
            idle,
            resync,
            shared_hosts: match var("CSO_BENCH_HOSTS").as_deref() {
                Some("cluster") => false,
                None | Some("server") => true,
                Some(other) => panic!("CSO_BENCH_HOSTS={other}: `cluster` or `server`"),
            },
            extra_args: var("CSO_BENCH_ARGS")
                .map(|v| v.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default(),
            helm_runs: var("CSO_BENCH_HELM_RUNS").map_or(50, |v| v.parse().unwrap()),
            binary: var("CSO_BENCH_BINARY")
                .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_cso")), PathBuf::from),
            shards: match var("CSO_BENCH_SHARDS").as_deref() {
                None | Some("1") => 1,
                Some("3") => 3,
                Some(other) => panic!("CSO_BENCH_SHARDS={other}: `1` or `3`"),
            },
            own_addresses: match var("CSO_BENCH_ADDRESSES").as_deref() {
                None | Some("cluster") => true,
                Some("server") => false,
                Some(other) => panic!("CSO_BENCH_ADDRESSES={other}: `cluster` or `server`"),
            },
            rollout: match var("CSO_BENCH_MOVE").as_deref() {
                None | Some("all") => false,
                Some("rollout") => true,
                Some(other) => panic!("CSO_BENCH_MOVE={other}: `all` or `rollout`"),
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Processes: CPU and memory from /proc

/// CPU (user + system) of the reaped children of `pid` (`cutime + cstime`).
fn reaped_children_cpu(pid: &str) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default()
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // Field 3 (state) is index 0: cutime is field 16, cstime 17. Clock ticks are 100 Hz.
    let ticks = fields.get(13).copied().unwrap_or(0) + fields.get(14).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// The direct children of `pid`: (pid, command name).
fn children(pid: u32) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        if rest.split_whitespace().nth(1).and_then(|p| p.parse().ok()) == Some(pid) {
            let name = head
                .split_once('(')
                .map(|(_, n)| n.to_owned())
                .unwrap_or_default();
            found.push((child, name));
        }
    }
    found
}

// ---------------------------------------------------------------------------------------------------------
// Metrics (Prometheus text format)

#[derive(Clone, Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// The samples of the metrics named in `wanted` (with their `_total` suffix).
fn parse_metrics(text: &str, wanted: &[&str]) -> Vec<Sample> {
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (name, rest) = match line.find(['{', ' ']) {
            Some(at) => line.split_at(at),
            None => continue,
        };
        if !wanted.contains(&name) {
            continue;
        }
        let mut labels = BTreeMap::new();
        let mut rest = rest;
        if let Some(inner) = rest.strip_prefix('{') {
            // key="value",key="value"} value
            let mut chars = inner.char_indices().peekable();
            let mut end = inner.len();
            while let Some(&(start, c)) = chars.peek() {
                if c == '}' {
                    end = start + 1;
                    break;
                }
                if c == ',' {
                    chars.next();
                    continue;
                }
                let eq = inner[start..].find('=').map_or(inner.len(), |i| start + i);
                let key = inner[start..eq].to_owned();
                while chars.peek().is_some_and(|&(i, _)| i <= eq) {
                    chars.next();
                }
                chars.next(); // the opening quote
                let mut value = String::new();
                while let Some((_, c)) = chars.next() {
                    match c {
                        '\\' => {
                            if let Some((_, escaped)) = chars.next() {
                                value.push(if escaped == 'n' { '\n' } else { escaped });
                            }
                        }
                        '"' => break,
                        c => value.push(c),
                    }
                }
                labels.insert(key, value);
            }
            rest = &inner[end.min(inner.len())..];
        }
        let Some(value) = rest.split_whitespace().next().and_then(|v| v.parse().ok()) else {
            continue;
        };
        samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    samples
}

/// Sums the samples of `name` by the key `key` makes of their labels.
fn sum_by(
    samples: &[Sample],
    name: &str,
    key: impl Fn(&BTreeMap<String, String>) -> String,
) -> BTreeMap<String, f64> {
    let mut sums = BTreeMap::new();
    for sample in samples.iter().filter(|s| s.name == name) {
        *sums.entry(key(&sample.labels)).or_default() += sample.value;
    }
    sums
}

fn label<'a>(labels: &'a BTreeMap<String, String>, name: &str) -> &'a str {
    labels.get(name).map_or("", String::as_str)
}

/// `VERB resource[/subresource]` of an `apiserver_request_total` sample.
fn apiserver_key(labels: &BTreeMap<String, String>) -> String {
    let subresource = label(labels, "subresource");
    format!(
        "{} {}{}{}",
        label(labels, "verb"),
        label(labels, "resource"),
        if subresource.is_empty() { "" } else { "/" },
        subresource
    )
}

/// What changed from `before` to `after`, largest first, zeros left out.
fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> Vec<(String, f64)> {
    let mut changed: Vec<(String, f64)> = after
        .iter()
        .map(|(key, value)| (key.clone(), value - before.get(key).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect();
    changed.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    changed
}

fn total(changes: &[(String, f64)]) -> f64 {
    // `+ 0.0`: an empty float sum is -0.0.
    changes.iter().map(|(_, v)| v).sum::<f64>() + 0.0
}

fn breakdown(changes: &[(String, f64)], limit: usize) -> String {
    let mut text = changes
        .iter()
        .take(limit)
        .map(|(key, value)| format!("{key} {value:.0}"))
        .collect::<Vec<_>>()
        .join(", ");
    if changes.len() > limit {
        let rest: f64 = changes[limit..].iter().map(|(_, v)| v).sum();
        let _ = write!(text, ", {} more kinds {rest:.0}", changes.len() - limit);
    }
    text
}

/// Write verbs in `apiserver_request_total` (server-side apply is `APPLY`).
fn is_write(key: &str) -> bool {
    let verb = key.split(' ').next().unwrap_or_default();
    matches!(
        verb,
        "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE" | "DELETECOLLECTION" | "CREATE" | "UPDATE"
    )
}

async fn apiserver_metrics(client: &Client) -> Vec<Sample> {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    match client.request_text(request).await {
        Ok(text) => parse_metrics(&text, &["apiserver_request_total", "etcd_requests_total"]),
        Err(e) => {
            println!("    (could not read an API server's /metrics: {e})");
            Vec::new()
        }
    }
}

/// GET over plain HTTP/1.0 (the operator's metrics endpoint).
async fn http_get(addr: &str, path: &str) -> Option<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.").then_some(())?;
    head.split_whitespace()
        .nth(1)
        .is_some_and(|code| code == "200")
        .then(|| body.to_owned())
}

// ---------------------------------------------------------------------------------------------------------
// The environment and the operator process

struct Environment {
    management: ControlPlane,
    workloads: Vec<ControlPlane>,
    client: Client,
    workload_clients: Vec<Client>,
}

impl Environment {
    async fn start(tools: &Tools, workloads: usize) -> Self {
        let names: Vec<String> = (0..workloads).map(|i| format!("workload-{i}")).collect();
        let (management, workloads) = tokio::join!(
            start_plane(tools, "management"),
            futures::future::join_all(names.iter().map(|name| start_plane(tools, name)))
        );
        let client = management.client().await.unwrap();
        let mut workload_clients = Vec::new();
        for plane in &workloads {
            workload_clients.push(plane.client().await.unwrap());
        }
        Environment {
            management,
            workloads,
            client,
            workload_clients,
        }
    }

    /// kube-apiserver + etcd CPU of the management plane and of all workload planes together.
    fn api_cpu(&self) -> (Duration, Duration) {
        let cpu = |plane: &ControlPlane| -> Duration {
            plane
                .pids()
                .iter()
                .filter_map(|pid| Usage::of(Some(*pid)))
                .map(|u| u.cpu)
                .sum()
        };
        (cpu(&self.management), self.workloads.iter().map(cpu).sum())
    }
}

/// A control plane (the management one with the CRDs), started again when it fails to start: the test
/// environment picks free ports before its processes bind them, so another process on the machine can take
/// one in between ("address already in use").
async fn start_plane(tools: &Tools, name: &str) -> ControlPlane {
    let mut attempt = 1;
    loop {
        let started = if name == "management" {
            cso_testenv::start_management(tools, None).await
        } else {
            ControlPlane::start(tools, name, None).await
        };
        match started {
            Ok(plane) => return plane,
            Err(e) if attempt < 3 => {
                let last = e.to_string().lines().last().unwrap_or_default().to_owned();
                println!("  {name} did not start (attempt {attempt}): {last}; again");
                attempt += 1;
            }
            Err(e) => panic!("{name} did not start: {e}"),
        }
    }
}

struct Operator {
    process: Supervised,
    pid: u32,
    /// Set when the process has exited: the reason and where its log was kept.
    exit: Option<String>,
    /// Its usage as last read while it ran (what is left to report once it has exited).
    last_usage: Usage,
    metrics_addr: String,
    log: PathBuf,
    /// Its name in the report: `cso`, or with 3 shards `default`, `a`, `b`.
    name: String,
}

fn free_port() -> u16 {
    cso_testenv::free_port().unwrap()
}

fn copy_release(release_dir: &Path, tag: &str) {
    let from = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/releases")
        .join(tag);
    let to = release_dir.join("cluster-stacks").join(tag);
    std::fs::create_dir_all(&to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

impl Operator {
    /// `cso run` with its default flags, except what this environment needs: the kubeconfig, the local
    /// releases, loopback ports for metrics and probes, free ports and an empty certificate directory for the
    /// webhook and hook servers (they wait for certificates that never come: nothing here calls them).
    ///
    /// `shard`: `None` for the single process (as before shards); with 3 shards `Some("")` for the default
    /// shard and `Some(name)` for `--shard=name`, each with leader election on (its Lease in `default`) and a
    /// directory of its own under `dir`.
    async fn start(
        tools: &Tools,
        kubeconfig: &Path,
        dir: &Path,
        settings: &Settings,
        shard: Option<&str>,
    ) -> Self {
        let name = match shard {
            None => "cso".to_owned(),
            Some("") => "default".to_owned(),
            Some(name) => name.to_owned(),
        };
        let dir = &match shard {
            None => dir.to_path_buf(),
            Some(_) => dir.join(format!("shard-{name}")),
        };
        std::fs::create_dir_all(dir).unwrap();
        let release_dir = dir.join("releases");
        for tag in [V1, V2] {
            copy_release(&release_dir, tag);
        }
        let certs = dir.join("no-certs");
        std::fs::create_dir_all(&certs).unwrap();
        let metrics_addr = format!("127.0.0.1:{}", free_port());
        let mut args = vec![
            "run".to_owned(),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--local=true".to_owned(),
            format!("--release-dir={}", release_dir.display()),
            format!("--metrics-bind-address={metrics_addr}"),
            format!("--health-probe-bind-address=127.0.0.1:{}", free_port()),
            format!("--webhook-port={}", free_port()),
            format!("--webhook-cert-dir={}", certs.display()),
            format!("--hook-port={}", free_port()),
            format!("--hook-cert-dir={}", certs.display()),
            // The workload clusters are bare API servers: nothing they hold ever runs.
            "--addon-health-checks=false".to_owned(),
        ];
        if let Some(shard) = shard {
            args.push("--leader-elect=true".to_owned());
            args.push("--leader-elect-namespace=default".to_owned());
            if !shard.is_empty() {
                args.push(format!("--shard={shard}"));
            }
        }
        if let Some(resync) = settings.resync {
            args.push(format!("--resync-interval={}s", resync.as_secs()));
        }
        args.extend(settings.extra_args.iter().cloned());
        let binary = settings.binary.clone();
        let renderer = tools
            .renderer
            .clone()
            .expect("cso-renderer not found: run `make tools`");
        println!("  operator {name}: {} {}", binary.display(), args.join(" "));
        println!(
            "            CSO_RENDERER={}, everything else at its default (leader election on, \
             --clusteraddon-concurrency=10, --qps=200, --burst=400, --resync-interval=5m unless given above)",
            renderer.display()
        );
        let mut command = Command::new(binary);
        command
            .args(&args)
            .env("CSO_RENDERER", &renderer)
            .env("CSO_HELM", tools.helm.clone().unwrap_or_else(|| "helm".into()))
            // Its scratch files go with the benchmark's directory.
            .env("TMPDIR", dir)
            // As the image's environment has it (Dockerfile): the image's binary (musl, mimalloc) gives freed
            // memory back at once. Other builds do not read it.
            .env("MIMALLOC_PURGE_DELAY", "0");
        let log = dir.join("cso.log");
        let mut process = Supervised::spawn("cso", command, &log, None).unwrap();
        let pid = process.pid();
        let started = Instant::now();
        let addr = metrics_addr.clone();
        process
            .wait_ready(Duration::from_secs(60), Duration::from_millis(50), || {
                let addr = addr.clone();
                async move { http_get(&addr, "/metrics").await.is_some() }
            })
            .await
            .unwrap();
        println!(
            "  operator serving metrics {:.2} s after start (pid {pid})",
            started.elapsed().as_secs_f64()
        );
        Operator {
            process,
            pid,
            exit: None,
            last_usage: Usage::default(),
            metrics_addr,
            log,
            name,
        }
    }

    /// Why the operator exited, once it has; its log is then kept (the temporary directory is not).
    fn exited(&mut self) -> Option<String> {
        if let Some(usage) = Usage::of(Some(self.pid)) {
            self.last_usage = usage;
        }
        if self.exit.is_none()
            && let Some(exit) = self.process.exited()
        {
            let kept = std::env::temp_dir().join(format!("cso-scale-{}.log", self.pid));
            let _ = std::fs::copy(&self.log, &kept);
            self.exit = Some(format!("{exit}\n  (its log: {})", kept.display()));
        }
        self.exit.clone()
    }

    fn check_running(&mut self) {
        if let Some(exit) = self.exited() {
            panic!("the operator stopped: {exit}");
        }
    }

    /// How many lines of each level the log has, and the first distinct error and warning messages.
    fn log_summary(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut levels: BTreeMap<String, usize> = BTreeMap::new();
        let mut messages: BTreeMap<String, usize> = BTreeMap::new();
        for line in text.lines() {
            let Ok(entry) = serde_json::from_str::<serde_json::Value>(line) else {
                *levels.entry("(not JSON)".into()).or_default() += 1;
                continue;
            };
            let level = entry["level"].as_str().unwrap_or("?").to_owned();
            if level == "ERROR" || level == "WARN" {
                let message = entry["fields"]["message"]
                    .as_str()
                    .or_else(|| entry["message"].as_str())
                    .or_else(|| entry["msg"].as_str())
                    .unwrap_or("?");
                *messages.entry(format!("{level}: {message}")).or_default() += 1;
            }
            *levels.entry(level).or_default() += 1;
        }
        let mut summary = format!(
            "{} lines ({})",
            text.lines().count(),
            levels
                .iter()
                .map(|(l, c)| format!("{l} {c}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for (message, count) in messages.iter().take(8) {
            let _ = write!(summary, "\n      {count} x {message}");
        }
        summary
    }
}

// ---------------------------------------------------------------------------------------------------------
// Snapshots and phases

struct Snapshot {
    at: Instant,
    cso: Usage,
    reaped: Duration,
    children: BTreeMap<u32, (String, Usage)>,
    operator: Vec<Sample>,
    management: Vec<Sample>,
    workloads: Vec<Vec<Sample>>,
    api_cpu: (Duration, Duration),
}

async fn snapshot(env: &Environment, operator: &Operator) -> Snapshot {
    let operator_metrics = http_get(&operator.metrics_addr, "/metrics")
        .await
        .map(|text| {
            parse_metrics(
                &text,
                &[
                    "cso_kube_requests_total",
                    "controller_runtime_reconcile_total",
                    "cso_objects_applied_total",
                    "cso_objects_pruned_total",
                    "cso_objects_drift_corrected_total",
                    "cso_shard_clusters",
                ],
            )
        })
        .unwrap_or_default();
    let management = apiserver_metrics(&env.client).await;
    let mut workloads = Vec::new();
    for client in &env.workload_clients {
        workloads.push(apiserver_metrics(client).await);
    }
    Snapshot {
        at: Instant::now(),
        cso: Usage::of(Some(operator.pid)).unwrap_or(operator.last_usage),
        reaped: reaped_children_cpu(&operator.pid.to_string()),
        children: children(operator.pid)
            .into_iter()
            .filter_map(|(pid, name)| Some((pid, (name, Usage::of(Some(pid))?))))
            .collect(),
        operator: operator_metrics,
        management,
        workloads,
        api_cpu: env.api_cpu(),
    }
}

/// What a phase cost, from two snapshots.
#[derive(Clone, Debug, Default)]
struct Cost {
    cso_cpu: Duration,
    children_cpu: Duration,
    cso_peak_kib: u64,
    /// What of the operator's resident memory maps its program's file at the end (`RssFile`).
    cso_file_kib: u64,
    children_peak_kib: u64,
    children_file_kib: u64,
    children_names: Vec<String>,
    /// The operator's requests to the management API server (its own counter).
    operator_requests: Vec<(String, f64)>,
    /// Whether the operator's metrics could be read at the end (not once it has exited).
    operator_metrics: bool,
    /// Requests the management API server received from anyone (the benchmark's too).
    management_requests: Vec<(String, f64)>,
    /// Requests the workload API servers received (only the operator talks to them), all servers together.
    workload_requests: Vec<(String, f64)>,
    /// Per workload server.
    workload_requests_each: Vec<Vec<(String, f64)>>,
    management_etcd: Vec<(String, f64)>,
    workload_etcd: Vec<(String, f64)>,
    reconciles: Vec<(String, f64)>,
    objects: Vec<(String, f64)>,
    api_cpu: (Duration, Duration),
}

fn cost(before: &Snapshot, after: &Snapshot) -> Cost {
    let children_cpu: Duration = after
        .children
        .iter()
        .map(|(pid, (_, usage))| {
            let earlier = before.children.get(pid).map_or(Duration::ZERO, |(_, u)| u.cpu);
            usage.cpu.saturating_sub(earlier)
        })
        .sum::<Duration>()
        + after.reaped.saturating_sub(before.reaped);
    let operator_key =
        |l: &BTreeMap<String, String>| format!("{} {}", label(l, "verb"), label(l, "resource"));
    let etcd_key = |l: &BTreeMap<String, String>| format!("{} {}", label(l, "operation"), label(l, "type"));
    let summed = |samples: &[Sample], name: &str, key: &dyn Fn(&BTreeMap<String, String>) -> String| {
        sum_by(samples, name, key)
    };
    let merge = |sides: &[Vec<Sample>], name: &str, key: &dyn Fn(&BTreeMap<String, String>) -> String| {
        let mut sums: BTreeMap<String, f64> = BTreeMap::new();
        for side in sides {
            for (k, v) in sum_by(side, name, key) {
                *sums.entry(k).or_default() += v;
            }
        }
        sums
    };
    let objects_key = |l: &BTreeMap<String, String>| label(l, "target").to_owned();
    let mut objects = Vec::new();
    for (metric, what) in [
        ("cso_objects_applied_total", "applied"),
        ("cso_objects_pruned_total", "pruned"),
        ("cso_objects_drift_corrected_total", "drift corrected"),
    ] {
        for (target, count) in delta(
            &summed(&before.operator, metric, &objects_key),
            &summed(&after.operator, metric, &objects_key),
        ) {
            objects.push((format!("{what} ({target})"), count));
        }
    }
    Cost {
        cso_cpu: after.cso.cpu.saturating_sub(before.cso.cpu),
        children_cpu,
        cso_peak_kib: after.cso.peak_rss_kib,
        cso_file_kib: after.cso.file_rss_kib,
        children_peak_kib: after
            .children
            .values()
            .map(|(_, u)| u.peak_rss_kib)
            .max()
            .unwrap_or(0),
        children_file_kib: after
            .children
            .values()
            .map(|(_, u)| u.file_rss_kib)
            .max()
            .unwrap_or(0),
        children_names: after.children.values().map(|(n, _)| n.clone()).collect(),
        operator_requests: delta(
            &summed(&before.operator, "cso_kube_requests_total", &operator_key),
            &summed(&after.operator, "cso_kube_requests_total", &operator_key),
        ),
        operator_metrics: !after.operator.is_empty(),
        management_requests: delta(
            &summed(&before.management, "apiserver_request_total", &apiserver_key),
            &summed(&after.management, "apiserver_request_total", &apiserver_key),
        ),
        workload_requests: delta(
            &merge(&before.workloads, "apiserver_request_total", &apiserver_key),
            &merge(&after.workloads, "apiserver_request_total", &apiserver_key),
        ),
        workload_requests_each: before
            .workloads
            .iter()
            .zip(&after.workloads)
            .map(|(b, a)| {
                delta(
                    &sum_by(b, "apiserver_request_total", apiserver_key),
                    &sum_by(a, "apiserver_request_total", apiserver_key),
                )
            })
            .collect(),
        management_etcd: delta(
            &summed(&before.management, "etcd_requests_total", &etcd_key),
            &summed(&after.management, "etcd_requests_total", &etcd_key),
        ),
        workload_etcd: delta(
            &merge(&before.workloads, "etcd_requests_total", &etcd_key),
            &merge(&after.workloads, "etcd_requests_total", &etcd_key),
        ),
        reconciles: delta(
            &summed(&before.operator, "controller_runtime_reconcile_total", &|l| {
                format!("{} {}", label(l, "controller"), label(l, "result"))
            }),
            &summed(&after.operator, "controller_runtime_reconcile_total", &|l| {
                format!("{} {}", label(l, "controller"), label(l, "result"))
            }),
        ),
        objects,
        api_cpu: (
            after.api_cpu.0.saturating_sub(before.api_cpu.0),
            after.api_cpu.1.saturating_sub(before.api_cpu.1),
        ),
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn print_cost(n: usize, cost: &Cost, wall: Duration) {
    let per = |changes: &[(String, f64)]| total(changes) / n.max(1) as f64;
    println!(
        "    cso: CPU {:.2} s, peak RSS {:.1} MiB; children ({}): CPU {:.2} s, peak RSS {:.1} MiB; wall {:.1} s",
        cost.cso_cpu.as_secs_f64(),
        mib(cost.cso_peak_kib),
        if cost.children_names.is_empty() {
            "none alive".to_owned()
        } else {
            cost.children_names.join(", ")
        },
        cost.children_cpu.as_secs_f64(),
        mib(cost.children_peak_kib),
        wall.as_secs_f64()
    );
    println!(
        "    of the resident memory, the programs' files (RssFile) at the end: cso {:.1} MiB, children {:.1} MiB",
        mib(cost.cso_file_kib),
        mib(cost.children_file_kib)
    );
    println!(
        "    API servers' CPU (kube-apiserver + etcd): management {:.2} s, workloads {:.2} s",
        cost.api_cpu.0.as_secs_f64(),
        cost.api_cpu.1.as_secs_f64()
    );
    if cost.operator_metrics {
        println!(
            "    operator -> management API: {:.0} requests ({:.1} per Cluster): {}",
            total(&cost.operator_requests),
            per(&cost.operator_requests),
            breakdown(&cost.operator_requests, 14)
        );
    } else {
        println!("    operator -> management API: its metrics endpoint did not answer");
    }
    println!(
        "    management API server received (benchmark included): {:.0}: {}",
        total(&cost.management_requests),
        breakdown(&cost.management_requests, 8)
    );
    println!(
        "    workload API servers received: {:.0} ({:.1} per Cluster): {}",
        total(&cost.workload_requests),
        per(&cost.workload_requests),
        breakdown(&cost.workload_requests, 12)
    );
    println!(
        "    etcd requests: management {:.0} ({}); workloads {:.0} ({})",
        total(&cost.management_etcd),
        breakdown(&cost.management_etcd, 5),
        total(&cost.workload_etcd),
        breakdown(&cost.workload_etcd, 5)
    );
    println!(
        "    reconciles: {}; objects: {}",
        breakdown(&cost.reconciles, 8),
        breakdown(&cost.objects, 6)
    );
}

// ---------------------------------------------------------------------------------------------------------
// Waiting

/// Waits until `count()` reaches `n` or `timeout` passes; prints progress every 30 s. Returns how many were
/// reached and, when all were, how long it took.
async fn wait_for_count(
    what: &str,
    n: usize,
    started: Instant,
    timeout: Duration,
    operator: &mut Operator,
    count: impl Fn() -> usize,
) -> (usize, Option<Duration>, Duration) {
    let mut next_report = Duration::from_secs(30);
    loop {
        let done = count();
        if done >= n {
            return (done, Some(started.elapsed()), started.elapsed());
        }
        let elapsed = started.elapsed();
        if elapsed >= timeout {
            println!(
                "    {what}: {done} of {n} after {:.0} s: giving up",
                elapsed.as_secs_f64()
            );
            return (done, None, elapsed);
        }
        if elapsed >= next_report {
            println!("    {what}: {done} of {n} after {:.0} s", elapsed.as_secs_f64());
            next_report += Duration::from_secs(30);
        }
        if let Some(exit) = operator.exited() {
            println!(
                "    {what}: {done} of {n} when the operator exited, {:.1} s in: {exit}",
                elapsed.as_secs_f64()
            );
            return (done, None, elapsed);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn wait_release_ready(client: &Client, ns: &str, tag: &str, operator: &mut Operator) -> Duration {
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), ns);
    let started = Instant::now();
    loop {
        let ready = releases
            .get_opt(tag)
            .await
            .unwrap()
            .is_some_and(|r| r.status.as_ref().is_some_and(|s| s.ready));
        if ready {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "release {tag} not ready after 300 s"
        );
        operator.check_running();
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

// ---------------------------------------------------------------------------------------------------------
// One size

#[derive(Clone, Debug, Default)]
struct Row {
    n: usize,
    created: Duration,
    stack_ready: Duration,
    /// Ready, the time when all were, how long it waited.
    install: (usize, Option<Duration>, Duration),
    install_cost: Cost,
    v2_ready: Option<Duration>,
    upgrade: Option<(usize, Option<Duration>, Duration)>,
    upgrade_cost: Option<Cost>,
    pruned: String,
    idle: Option<IdleResult>,
    /// The operator exited: why.
    failure: Option<String>,
}

#[derive(Clone, Debug, Default)]
struct IdleResult {
    window: Duration,
    /// Connections open to the Clusters' own addresses at the window's end (none without them).
    connections: Option<usize>,
    /// The operator's resident memory at the window's end.
    resident_kib: u64,
    cost: Cost,
    management_writes: f64,
    workload_writes: f64,
    operator_writes: f64,
    restored: Option<Duration>,
}

fn host(settings: &Settings, i: usize) -> String {
    if settings.shared_hosts {
        format!("w{}.example.test", i % settings.workloads)
    } else {
        format!("c{i}.example.test")
    }
}

/// Cluster API's kubeconfig Secret of Cluster `name` (type and label as Cluster API writes them).
fn kubeconfig_secret(name: &str, kubeconfig: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "type": "cluster.x-k8s.io/secret",
        "metadata": {"name": format!("{name}-kubeconfig"),
                     "labels": {"cluster.x-k8s.io/cluster-name": name}},
        "stringData": {"value": kubeconfig}}))
    .unwrap()
}

/// A Cluster of the ferrol v1 class whose control plane is at `host`, labelled with its shard and its rollout
/// wave (`wave=w0`, `w1`, `w2`).
fn cluster_object(name: &str, host: &str, shard: Option<&str>, wave: usize) -> DynamicObject {
    let mut labels = json!({"wave": format!("w{}", wave % 3)});
    if let Some(shard) = shard {
        labels["clusterstack.x-k8s.io/shard"] = json!(shard);
    }
    let metadata = json!({"name": name, "labels": labels, "finalizers": ["cluster.cluster.x-k8s.io"]});
    // As a site's Cluster reads: its network and a topology with workers and the class's variable (the ferrol
    // class declares one). No references: no control plane object would be there for a values template to
    // read. Cluster API's status comes from `capi_status_stand_in` (`provisioned_status`).
    let variables = json!([{"name": "imageRepository", "value": "registry.example.test/kubernetes"}]);
    serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster", "metadata": metadata,
        "spec": {
            "clusterNetwork": {"pods": {"cidrBlocks": ["192.168.0.0/16"]}, "services": {"cidrBlocks": ["10.96.0.0/12"]},
                               "serviceDomain": "cluster.local"},
            "controlPlaneEndpoint": {"host": host, "port": 6443},
            "topology": {"class": V1, "version": "v1.27.3", "controlPlane": {"replicas": 3},
                         "workers": {"machineDeployments": [{"class": "workeramd64", "name": "md-0", "replicas": 3}]},
                         "variables": variables}}}))
    .unwrap()
}

/// The status Cluster API writes on a provisioned Cluster (`v1beta1` and its `v1beta2` conditions), with
/// `observedGeneration` `generation`: the bulk of a site's Cluster object, which the operator's caches hold.
fn provisioned_status(generation: i64) -> serde_json::Value {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let v1beta1 = |kind: &str| json!({"type": kind, "status": "True", "lastTransitionTime": now});
    let v1beta2 = |kind: &str, reason: &str| {
        // `NotScalingUp`, `NotDeleting`, ...: those conditions are False on a settled Cluster.
        let status = if reason.starts_with("Not") {
            "False"
        } else {
            "True"
        };
        json!({"type": kind, "status": status, "reason": reason, "message": "", "observedGeneration": generation,
               "lastTransitionTime": now})
    };
    let v1beta1_conditions = [
        "Ready",
        "ControlPlaneInitialized",
        "ControlPlaneReady",
        "InfrastructureReady",
        "TopologyReconciled",
    ]
    .map(v1beta1);
    json!({"status": {
    "observedGeneration": generation, "phase": "Provisioned", "infrastructureReady": true, "controlPlaneReady": true,
    "failureDomains": {"fd1": {"controlPlane": true}, "fd2": {"controlPlane": true}, "fd3": {"controlPlane": true}},
    "conditions": v1beta1_conditions,
    "v1beta2": {
        "controlPlane": {"desiredReplicas": 3, "replicas": 3, "readyReplicas": 3, "availableReplicas": 3,
                         "upToDateReplicas": 3},
        "workers": {"desiredReplicas": 3, "replicas": 3, "readyReplicas": 3, "availableReplicas": 3,
                    "upToDateReplicas": 3},
        "conditions": [
            v1beta2("Available", "Available"), v1beta2("InfrastructureReady", "Ready"),
            v1beta2("ControlPlaneInitialized", "Initialized"), v1beta2("ControlPlaneAvailable", "Available"),
            v1beta2("WorkersAvailable", "Available"), v1beta2("MachinesReady", "Ready"),
            v1beta2("MachinesUpToDate", "UpToDate"), v1beta2("RemoteConnectionProbe", "ProbeSucceeded"),
            v1beta2("TopologyReconciled", "ReconcileSucceeded"), v1beta2("ControlPlaneMachinesReady", "Ready"),
            v1beta2("WorkerMachinesReady", "Ready"), v1beta2("ControlPlaneMachinesUpToDate", "UpToDate"),
            v1beta2("WorkerMachinesUpToDate", "UpToDate"), v1beta2("RollingOut", "NotRollingOut"),
            v1beta2("ScalingUp", "NotScalingUp"), v1beta2("ScalingDown", "NotScalingDown"),
            v1beta2("Remediating", "NotRemediating"), v1beta2("Deleting", "NotDeleting"),
        ]}}})
}

async fn run_size(n: usize, tools: &Tools, settings: &Settings) -> Row {
    println!();
    println!(
        "=== N = {n}: {} workload API servers, {} cso process(es), hosts per {} ===",
        settings.workloads,
        settings.shards,
        if settings.shared_hosts {
            "workload server"
        } else {
            "Cluster"
        }
    );
    let started = Instant::now();
    let env = Environment::start(tools, settings.workloads).await;
    println!(
        "  environment (management + {} workload control planes, CRDs) up in {:.1} s",
        settings.workloads,
        started.elapsed().as_secs_f64()
    );
    if !settings.shared_hosts && n > settings.workloads {
        println!(
            "  note: {n} Clusters with hosts of their own share {} workload API servers and overwrite each \
             other's labels in the same objects (CSO_BENCH_HOSTS=server avoids it)",
            settings.workloads
        );
    }
    let dir = tempfile::Builder::new().prefix("cso-scale-").tempdir().unwrap();
    let kubeconfig = env.management.kubeconfig_path();
    let (mut operator, mut others) = if settings.shards == 3 {
        let default = Operator::start(tools, kubeconfig, dir.path(), settings, Some("")).await;
        let mut others = Vec::new();
        for shard in ["a", "b"] {
            others.push(Operator::start(tools, kubeconfig, dir.path(), settings, Some(shard)).await);
        }
        (default, others)
    } else {
        (
            Operator::start(tools, kubeconfig, dir.path(), settings, None).await,
            Vec::new(),
        )
    };
    let row = measure(n, &env, &mut operator, &mut others, settings).await;
    println!("  operator {} log: {}", operator.name, operator.log_summary());
    for other in &others {
        println!("  operator {} log: {}", other.name, other.log_summary());
    }
    operator.process.stop(Duration::from_secs(10));
    for other in &mut others {
        other.process.stop(Duration::from_secs(10));
    }
    row
}

/// With 3 shards: the cost of each process, the shard processes' own lines, then their sums.
fn print_shards(n: usize, operators: &[&Operator], before: &[Snapshot], after: &[Snapshot]) {
    if operators.len() < 2 {
        return;
    }
    let (mut cpu, mut children_cpu, mut rss, mut children_rss, mut requests, mut reconciles) =
        (0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for ((operator, before), after) in operators.iter().zip(before).zip(after) {
        let cost = cost(before, after);
        let owned = after
            .operator
            .iter()
            .filter(|s| s.name == "cso_shard_clusters")
            .map(|s| format!("{}={:.0}", label(&s.labels, "shard"), s.value))
            .collect::<Vec<_>>()
            .join(" ");
        println!(
            "    shard {}: cso_shard_clusters {{{owned}}}; cso CPU {:.2} s, peak RSS {:.1} MiB; renderer CPU {:.2} s, \
             peak RSS {:.1} MiB; management requests {:.0}; reconciles {:.0} ({})",
            operator.name,
            cost.cso_cpu.as_secs_f64(),
            mib(cost.cso_peak_kib),
            cost.children_cpu.as_secs_f64(),
            mib(cost.children_peak_kib),
            total(&cost.operator_requests),
            total(&cost.reconciles),
            breakdown(&cost.reconciles, 6)
        );
        cpu += cost.cso_cpu.as_secs_f64();
        children_cpu += cost.children_cpu.as_secs_f64();
        rss += mib(cost.cso_peak_kib);
        children_rss += mib(cost.children_peak_kib);
        requests += total(&cost.operator_requests);
        reconciles += total(&cost.reconciles);
    }
    println!(
        "    shards summed: cso CPU {cpu:.2} s, peak RSS {rss:.1} MiB; renderer CPU {children_cpu:.2} s, peak RSS \
         {children_rss:.1} MiB; management requests {requests:.0} ({:.1} per Cluster); reconciles {reconciles:.0}",
        requests / n.max(1) as f64
    );
}

async fn snapshots(env: &Environment, operators: &[&Operator]) -> Vec<Snapshot> {
    let mut all = Vec::new();
    for operator in operators {
        all.push(snapshot(env, operator).await);
    }
    all
}

async fn measure(
    n: usize,
    env: &Environment,
    operator: &mut Operator,
    others: &mut [Operator],
    settings: &Settings,
) -> Row {
    let client = &env.client;
    let mut row = Row { n, ..Row::default() };
    let ns = cso_testenv::namespace(client, "scale").await.unwrap();

    // The benchmark follows the ClusterAddons with a watch (cheaper for the API server than listing).
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    let (store, writer) = reflector::store::<ClusterAddon>();
    let watch = tokio::spawn(
        reflector(writer, watcher(addons, watcher::Config::default()))
            .default_backoff()
            .applied_objects()
            .for_each(|_| futures::future::ready(())),
    );
    store.wait_until_ready().await.unwrap();
    let ready_on = |class: &'static str| {
        let store = store.clone();
        move || {
            store
                .state()
                .iter()
                .filter(|a| a.spec.cluster_stack == class && a.status.as_ref().is_some_and(|s| s.ready))
                .count()
        }
    };

    // The stack, v1.
    let stacks: Api<ClusterStack> = Api::namespaced(client.clone(), &ns);
    let stack: ClusterStack = serde_json::from_value(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
        "metadata": {"name": "ferrol", "namespace": ns},
        "spec": {"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27", "channel": "stable",
                 "autoSubscribe": false, "noProvider": true, "versions": ["v1"]},
    }))
    .unwrap();
    stacks.create(&PostParams::default(), &stack).await.unwrap();
    row.stack_ready = wait_release_ready(client, &ns, V1, operator).await;
    println!(
        "  ClusterStack created -> release {V1} ready: {:.2} s",
        row.stack_ready.as_secs_f64()
    );

    // Install: N Clusters at once.
    let secret = ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "Secret"));
    let cluster = ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta1", "Cluster"));
    let secrets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &secret);
    let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &cluster);
    let stand_in = tokio::spawn(capi_status_stand_in(clusters.clone()));
    let servers: Vec<String> = env
        .workloads
        .iter()
        .map(|p| p.kubeconfig_yaml().to_owned())
        .collect();
    // Kept until the run ends: they carry every connection to the workload servers.
    let (kubeconfigs, addresses) = if settings.own_addresses {
        let mut proxies = Vec::with_capacity(n);
        let mut kubeconfigs = Vec::with_capacity(n);
        for i in 0..n {
            let server = &env.workloads[i % env.workloads.len()];
            let proxy = cso_testenv::proxy::ApiProxy::start(server.server_url())
                .await
                .unwrap();
            kubeconfigs.push(
                server
                    .kubeconfig_yaml()
                    .replace(server.server_url(), &proxy.url()),
            );
            proxies.push(proxy);
        }
        (kubeconfigs, proxies)
    } else {
        let kubeconfigs = (0..n).map(|i| servers[i % servers.len()].clone()).collect();
        (kubeconfigs, Vec::new())
    };
    // A fresh API server prepares a kind's write path (field management for its schema) at its first write,
    // which took 2 s for the Cluster CRD here: one dry-run create of each beforehand, outside the timing.
    let warm = Instant::now();
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    secrets
        .create(&dry_run, &kubeconfig_secret("warm-up", &servers[0]))
        .await
        .unwrap();
    clusters
        .create(
            &dry_run,
            &cluster_object("warm-up", "warm-up.example.test", None, 0),
        )
        .await
        .unwrap();
    println!(
        "  dry-run create of a Secret and a Cluster (warm-up, not timed): {:.2} s",
        warm.elapsed().as_secs_f64()
    );
    let before = snapshot(env, operator).await;
    let before_all = snapshots(env, &all_operators(operator, others)).await;
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let shard = shard_of(settings, i);
            let (secrets, clusters, kubeconfigs) = (&secrets, &clusters, &kubeconfigs);
            let name = format!("c{i}");
            let host = host(settings, i);
            async move {
                let secret = kubeconfig_secret(&name, &kubeconfigs[i]);
                secrets.create(&PostParams::default(), &secret).await?;
                clusters
                    .create(&PostParams::default(), &cluster_object(&name, &host, shard, i))
                    .await?;
                Ok::<_, kube::Error>(())
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<Vec<_>>()
        .await
        .unwrap();
    row.created = started.elapsed();
    println!(
        "  {n} Clusters and kubeconfig Secrets created in {:.2} s",
        row.created.as_secs_f64()
    );
    row.install = wait_for_count(
        "ClusterAddons ready on v1",
        n,
        started,
        settings.timeout,
        operator,
        ready_on(V1),
    )
    .await;
    let after = snapshot(env, operator).await;
    let after_all = snapshots(env, &all_operators(operator, others)).await;
    row.install_cost = cost(&before, &after);
    match row.install.1 {
        Some(took) => println!(
            "  install: all {n} ClusterAddons ready {:.2} s after the first create",
            took.as_secs_f64()
        ),
        None => println!(
            "  install: {} of {n} ClusterAddons ready after {:.0} s",
            row.install.0,
            row.install.2.as_secs_f64()
        ),
    }
    print_cost(n, &row.install_cost, after.at - before.at);
    print_shards(n, &all_operators(operator, others), &before_all, &after_all);
    if row.install.1.is_none() {
        watch.abort();
        row.failure = operator.exited();
        return row;
    }

    // Upgrade: v2 into the stack, then every Cluster moved to it at once.
    let started_v2 = Instant::now();
    stacks
        .patch(
            "ferrol",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"versions": ["v1", "v2"]}})),
        )
        .await
        .unwrap();
    row.v2_ready = Some(wait_release_ready(client, &ns, V2, operator).await);
    println!(
        "  ClusterStack given v2 -> release {V2} ready: {:.2} s",
        started_v2.elapsed().as_secs_f64()
    );
    let before = snapshot(env, operator).await;
    let before_all = snapshots(env, &all_operators(operator, others)).await;
    let started = Instant::now();
    let rollouts: Api<cso_api::ClusterStackRollout> = Api::namespaced(client.clone(), &ns);
    if settings.rollout {
        let rollout: cso_api::ClusterStackRollout = serde_json::from_value(json!({
            "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStackRollout",
            "metadata": {"name": "ferrol-v2", "namespace": ns},
            "spec": {"clusterStack": "ferrol", "version": "v2", "waves": [
                {"name": "w0", "clusterSelector": {"matchLabels": {"wave": "w0"}}},
                {"name": "w1", "clusterSelector": {"matchLabels": {"wave": "w1"}}},
                {"name": "w2"}]}
        }))
        .unwrap();
        rollouts.create(&PostParams::default(), &rollout).await.unwrap();
        println!("  ClusterStackRollout to {V2} in 3 waves created");
    } else {
        futures::stream::iter(0..n)
            .map(|i| {
                let clusters = &clusters;
                async move {
                    clusters
                        .patch(
                            &format!("c{i}"),
                            &PatchParams::default(),
                            &Patch::Merge(json!({"spec": {"topology": {"class": V2}}})),
                        )
                        .await
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .try_collect::<Vec<_>>()
            .await
            .unwrap();
        println!(
            "  {n} Clusters moved to {V2} in {:.2} s",
            started.elapsed().as_secs_f64()
        );
    }
    let upgrade = wait_for_count(
        "ClusterAddons ready on v2",
        n,
        started,
        settings.timeout,
        operator,
        ready_on(V2),
    )
    .await;
    if settings.rollout {
        // Done means Cluster API's part too; the rollout says Completed once the last wave is.
        let deadline = Instant::now() + settings.timeout;
        loop {
            let phase = rollouts
                .get("ferrol-v2")
                .await
                .ok()
                .and_then(|r| r.status)
                .map(|s| (s.phase, s.done))
                .unwrap_or_default();
            if phase.0 == "Completed" || Instant::now() > deadline {
                println!(
                    "  rollout {} ({} done) {:.2} s after it was created",
                    phase.0,
                    phase.1,
                    started.elapsed().as_secs_f64()
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    let after = snapshot(env, operator).await;
    let after_all = snapshots(env, &all_operators(operator, others)).await;
    let upgrade_cost = cost(&before, &after);
    match upgrade.1 {
        Some(took) => println!(
            "  upgrade: all {n} ClusterAddons ready on v2 {:.2} s after the first patch",
            took.as_secs_f64()
        ),
        None => println!(
            "  upgrade: {} of {n} ClusterAddons ready on v2 after {:.0} s",
            upgrade.0,
            upgrade.2.as_secs_f64()
        ),
    }
    print_cost(n, &upgrade_cost, after.at - before.at);
    print_shards(n, &all_operators(operator, others), &before_all, &after_all);
    // What v2 left in the workload clusters: `web` pruned, metrics-server labelled v2.
    let mut pruned = 0;
    let mut labelled = 0;
    let used = n.min(env.workloads.len());
    for workload in env.workload_clients.iter().take(used) {
        let deployments: Api<Deployment> = Api::namespaced(workload.clone(), "kube-system");
        if deployments.get_opt("web").await.unwrap().is_none() {
            pruned += 1;
        }
        if deployments
            .get_opt("metrics-server")
            .await
            .unwrap()
            .is_some_and(|d| d.labels().get("clusterAddonVersion").map(String::as_str) == Some("v2"))
        {
            labelled += 1;
        }
    }
    row.pruned =
        format!("web pruned on {pruned} of {used} workload servers, metrics-server on v2 on {labelled}");
    println!("  {}", row.pruned);
    row.upgrade = Some(upgrade);
    row.upgrade_cost = Some(upgrade_cost);

    if let Some(window) = settings.idle
        && operator.exited().is_none()
    {
        row.idle = Some(idle(n, env, operator, settings, window, &addresses).await);
    }
    watch.abort();
    stand_in.abort();
    row.failure = operator.exited();
    row
}

/// Cluster API's report of a reconciled topology, where no Cluster API runs: every Cluster of `clusters` whose
/// generation is newer than its `status.observedGeneration` gets both, with `TopologyReconciled=True`, in the
/// status of a provisioned Cluster ([`provisioned_status`]).
async fn capi_status_stand_in(clusters: Api<DynamicObject>) {
    let mut seen: BTreeMap<String, i64> = BTreeMap::new();
    loop {
        if let Ok(list) = clusters.list(&Default::default()).await {
            for cluster in list {
                let name = cluster.name_any();
                let generation = cluster.metadata.generation.unwrap_or_default();
                let observed = cluster
                    .data
                    .pointer("/status/observedGeneration")
                    .and_then(serde_json::Value::as_i64)
                    .unwrap_or_default();
                if observed >= generation || seen.get(&name) == Some(&generation) {
                    continue;
                }
                let status = provisioned_status(generation);
                if clusters
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .is_ok()
                {
                    seen.insert(name, generation);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The operator and, with 3 shards, the shard processes `a` and `b`.
fn all_operators<'a>(operator: &'a Operator, others: &'a [Operator]) -> Vec<&'a Operator> {
    std::iter::once(operator).chain(others).collect()
}

async fn idle(
    n: usize,
    env: &Environment,
    operator: &mut Operator,
    settings: &Settings,
    window: Duration,
    addresses: &[cso_testenv::proxy::ApiProxy],
) -> IdleResult {
    let resync = settings.resync.unwrap_or_default();
    // Let the last status writes and events of the upgrade land first.
    tokio::time::sleep(Duration::from_secs(5)).await;
    println!(
        "  idle: {:.0} s window, --resync-interval={}s; the benchmark sends nothing meanwhile",
        window.as_secs_f64(),
        resync.as_secs()
    );
    let before = snapshot(env, operator).await;
    tokio::time::sleep(window).await;
    operator.check_running();
    let after = snapshot(env, operator).await;
    let cost = cost(&before, &after);
    // What the operator holds at the end of the window: connections to the Clusters' addresses (with an address
    // per Cluster) and resident memory now, against the peak so far.
    let connections = (!addresses.is_empty()).then(|| {
        addresses
            .iter()
            .map(cso_testenv::proxy::ApiProxy::open_connections)
            .sum::<usize>()
    });
    let resident_kib = after.cso.rss_kib;
    println!(
        "    at the end: {} connections to the Clusters' addresses; cso resident {:.1} MiB (peak so far {:.1} MiB)",
        connections.map_or_else(|| "-".to_owned(), |c| c.to_string()),
        resident_kib as f64 / 1024.0,
        after.cso.peak_rss_kib as f64 / 1024.0
    );
    let writes = |changes: &[(String, f64)]| -> Vec<(String, f64)> {
        changes.iter().filter(|(k, _)| is_write(k)).cloned().collect()
    };
    let operator_writes: Vec<(String, f64)> = cost
        .operator_requests
        .iter()
        .filter(|(k, _)| {
            let verb = k.split(' ').next().unwrap_or_default().to_ascii_uppercase();
            !matches!(verb.as_str(), "GET" | "LIST" | "WATCH")
        })
        .cloned()
        .collect();
    let management_writes = writes(&cost.management_requests);
    let workload_writes = writes(&cost.workload_requests);
    println!(
        "    writes to the management API server: {:.0} ({}); the operator's own by its counter: {:.0} ({})",
        total(&management_writes),
        breakdown(&management_writes, 10),
        total(&operator_writes),
        breakdown(&operator_writes, 10)
    );
    println!(
        "    writes to the workload API servers: {:.0} ({:.1} per Cluster): {}",
        total(&workload_writes),
        total(&workload_writes) / n.max(1) as f64,
        breakdown(&workload_writes, 10)
    );
    for (i, each) in cost.workload_requests_each.iter().enumerate() {
        let w = writes(each);
        println!(
            "      workload-{i}: {:.0} writes ({})",
            total(&w),
            breakdown(&w, 6)
        );
    }
    let etcd_writes = |changes: &[(String, f64)]| -> f64 {
        changes
            .iter()
            .filter(|(k, _)| {
                let op = k.split(' ').next().unwrap_or_default();
                matches!(op, "create" | "update" | "delete" | "GuaranteedUpdate")
            })
            .map(|(_, v)| v)
            .sum()
    };
    println!(
        "    etcd writes (create/update/delete): management {:.0}, workloads {:.0}",
        etcd_writes(&cost.management_etcd),
        etcd_writes(&cost.workload_etcd)
    );
    print_cost(n, &cost, after.at - before.at);

    // Drift: one applied object deleted in a workload cluster.
    let deployments: Api<Deployment> = Api::namespaced(env.workload_clients[0].clone(), "kube-system");
    let uid = deployments.get("metrics-server").await.unwrap().uid();
    deployments
        .delete("metrics-server", &DeleteParams::default())
        .await
        .unwrap();
    let deleted = Instant::now();
    let limit = resync + Duration::from_secs(120);
    let restored = loop {
        if let Some(d) = deployments.get_opt("metrics-server").await.unwrap()
            && d.uid() != uid
        {
            break Some(deleted.elapsed());
        }
        if deleted.elapsed() > limit {
            break None;
        }
        operator.check_running();
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    match restored {
        Some(took) => println!(
            "    metrics-server deleted in workload-0 ({} Clusters point at it): back after {:.2} s",
            n.div_ceil(env.workloads.len()).min(n),
            took.as_secs_f64()
        ),
        None => println!(
            "    metrics-server deleted in workload-0: not back after {:.0} s",
            limit.as_secs_f64()
        ),
    }
    IdleResult {
        window,
        connections,
        resident_kib,
        management_writes: total(&management_writes),
        workload_writes: total(&workload_writes),
        operator_writes: total(&operator_writes),
        cost,
        restored,
    }
}

// ---------------------------------------------------------------------------------------------------------
// The reference: plain helm template runs

/// `runs` sequential `helm template` runs of the ferrol v1 addon chart with its values templated for one
/// Cluster: (wall time, helm CPU).
fn helm_reference(helm: &Path, runs: usize) -> (Duration, Duration) {
    let release = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/releases")
        .join(V1);
    let values_file: BTreeMap<String, String> =
        serde_saphyr::from_str(&std::fs::read_to_string(release.join("cluster-addon-values.yaml")).unwrap())
            .unwrap();
    let values =
        values_file["values"].replace("{{ .Cluster.spec.controlPlaneEndpoint.host }}", "c0.example.test");
    let dir = tempfile::tempdir().unwrap();
    let values_path = dir.path().join("values.yaml");
    std::fs::write(&values_path, values).unwrap();
    let chart = release.join("docker-ferrol-1-27-cluster-addon-v1.tgz");
    let cpu_before = reaped_children_cpu("self");
    let started = Instant::now();
    for _ in 0..runs {
        let output = Command::new(helm)
            .args(["template", "cluster-addon"])
            .arg(&chart)
            .args([
                "--namespace",
                "kube-system",
                "--kube-version",
                "v1.27.3",
                "--include-crds",
                "-f",
            ])
            .arg(&values_path)
            .env("HELM_CACHE_HOME", dir.path().join("cache"))
            .env("HELM_CONFIG_HOME", dir.path().join("config"))
            .env("HELM_DATA_HOME", dir.path().join("data"))
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "helm template failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    (
        started.elapsed(),
        reaped_children_cpu("self").saturating_sub(cpu_before),
    )
}

// ---------------------------------------------------------------------------------------------------------

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "—".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()))
}

fn summary(rows: &[Row], helm: (Duration, Duration), settings: &Settings) -> String {
    let mut out = String::new();
    let per = |changes: &[(String, f64)], n: usize| total(changes) / n.max(1) as f64;
    let _ = writeln!(
        out,
        "| N | Clusters created | install: all ready | v2 release ready | upgrade: all ready on v2 | cso CPU install / upgrade | cso-renderer CPU install / upgrade | cso peak RSS | cso-renderer peak RSS | management requests per Cluster install / upgrade | workload requests per Cluster install / upgrade |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        let install = match row.install.1 {
            Some(d) => format!("{:.1} s", d.as_secs_f64()),
            None => format!(
                "{} of {} ready after {:.0} s{}",
                row.install.0,
                row.n,
                row.install.2.as_secs_f64(),
                if row.failure.is_some() {
                    " (the operator exited)"
                } else {
                    ""
                }
            ),
        };
        let upgrade = match &row.upgrade {
            Some((_, Some(d), _)) => format!("{:.1} s", d.as_secs_f64()),
            Some((ready, None, waited)) => format!(
                "{ready} of {} ready after {:.0} s{}",
                row.n,
                waited.as_secs_f64(),
                if row.failure.is_some() {
                    " (the operator exited)"
                } else {
                    ""
                }
            ),
            None => "—".to_owned(),
        };
        let last = row.upgrade_cost.as_ref().unwrap_or(&row.install_cost);
        let up = row.upgrade_cost.as_ref();
        let _ = writeln!(
            out,
            "| {} | {:.1} s | {install} | {} | {upgrade} | {:.2} / {} s | {:.2} / {} s | {:.1} MiB | {:.1} MiB | {:.1} / {} | {:.1} / {} |",
            row.n,
            row.created.as_secs_f64(),
            secs(row.v2_ready),
            row.install_cost.cso_cpu.as_secs_f64(),
            up.map_or("—".to_owned(), |c| format!("{:.2}", c.cso_cpu.as_secs_f64())),
            row.install_cost.children_cpu.as_secs_f64(),
            up.map_or("—".to_owned(), |c| format!(
                "{:.2}",
                c.children_cpu.as_secs_f64()
            )),
            mib(last.cso_peak_kib),
            mib(last.children_peak_kib),
            per(&row.install_cost.operator_requests, row.n),
            up.map_or("—".to_owned(), |c| format!(
                "{:.1}",
                per(&c.operator_requests, row.n)
            )),
            per(&row.install_cost.workload_requests, row.n),
            up.map_or("—".to_owned(), |c| format!(
                "{:.1}",
                per(&c.workload_requests, row.n)
            )),
        );
    }
    if rows.iter().any(|r| r.idle.is_some()) {
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "| N | idle window | writes to management (operator's own) | writes to workloads (per Cluster) | cso CPU | cso-renderer CPU | deleted object back after | connections held at the end | cso resident at the end |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
        for row in rows {
            if let Some(idle) = &row.idle {
                let _ = writeln!(
                    out,
                    "| {} | {:.0} s (resync {} s) | {:.0} ({:.0}) | {:.0} ({:.1}) | {:.2} s | {:.2} s | {} | {} | {:.1} MiB |",
                    row.n,
                    idle.window.as_secs_f64(),
                    settings.resync.unwrap_or_default().as_secs(),
                    idle.management_writes,
                    idle.operator_writes,
                    idle.workload_writes,
                    idle.workload_writes / row.n.max(1) as f64,
                    idle.cost.cso_cpu.as_secs_f64(),
                    idle.cost.children_cpu.as_secs_f64(),
                    secs(idle.restored),
                    idle.connections.map_or_else(|| "-".to_owned(), |c| c.to_string()),
                    idle.resident_kib as f64 / 1024.0
                );
            }
        }
    }
    for row in rows {
        if let Some(failure) = &row.failure {
            let _ = writeln!(out, "\nN = {}: the operator exited: {failure}", row.n);
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Reference: {} sequential `helm template` runs of the ferrol v1 addon chart: {:.2} s wall, {:.2} s helm CPU.",
        settings.helm_runs,
        helm.0.as_secs_f64(),
        helm.1.as_secs_f64()
    );
    out
}

async fn bench() {
    let settings = Settings::from_env();
    let tools = Tools::discover().unwrap();
    let helm = tools.helm.clone().expect("helm not found: run `make tools`");
    println!(
        "scale: cso run as a process; sizes {:?}, {} workload API servers, phase timeout {:.0} s{}",
        settings.sizes,
        settings.workloads,
        settings.timeout.as_secs_f64(),
        settings
            .idle
            .map_or_else(String::new, |w| format!(", idle window {:.0} s", w.as_secs_f64()))
    );
    let (load, _) = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_once(' ')
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .unwrap_or_default();
    println!(
        "machine: {} cores, load average {load}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let reference = helm_reference(&helm, settings.helm_runs);
    println!(
        "reference: {} sequential `helm template` runs of the ferrol v1 addon chart ({}): {:.2} s wall, {:.2} s CPU",
        settings.helm_runs,
        helm.display(),
        reference.0.as_secs_f64(),
        reference.1.as_secs_f64()
    );
    let mut rows = Vec::new();
    for &n in &settings.sizes {
        rows.push(run_size(n, &tools, &settings).await);
    }
    println!();
    println!("{}", summary(&rows, reference, &settings));
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read from the command line.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        tokio::select! {
            () = bench() => {}
            _ = tokio::signal::ctrl_c() => println!("interrupted: stopping everything"),
        }
    });
}
