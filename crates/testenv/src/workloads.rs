//! A workload control plane that runs workloads: kube-controller-manager, kube-scheduler and kwok beside a
//! [`ControlPlane`]'s API server, with simulated nodes, so that Deployments, DaemonSets, StatefulSets and Jobs
//! get a real status.
//!
//! - **kube-controller-manager** runs every controller that is on by default (`--controllers=*`: Deployments,
//!   ReplicaSets, DaemonSets, StatefulSets, Jobs, garbage collection through owner references, namespace
//!   deletion, service accounts and their tokens, endpoints, the node lifecycle, pod GC, ...), with the
//!   control plane's service-account key and CA. Controllers that need a cloud provider or flags we do not
//!   pass (node IPAM, service load balancers, routes, CSR signing) skip themselves. The node lifecycle
//!   controller is what lifts the `node.kubernetes.io/not-ready` taint the API server's `TaintNodesByCondition`
//!   admission puts on every new node; it would evict pods only after a node's Lease went unrenewed for the
//!   grace period (50 s) and the pods' tolerations (300 s) ran out, which kwok's Lease renewals prevent.
//! - **kube-scheduler** binds pods to the nodes as in a real cluster: a pod that fits no node stays `Pending`
//!   with `PodScheduled=False`, reason `Unschedulable`.
//! - **kwok** (the controller of `sigs.k8s.io/kwok`, not kwokctl) manages the nodes annotated
//!   `kwok.x-k8s.io/node: fake` ([`KWOK_NODE_ANNOTATION`]) and the pods bound to them, with kwok's default
//!   Stages (`kwok_stages.yaml`, as kwokctl configures them): a node goes `Ready` and keeps a renewed Lease; a pod
//!   bound to it goes `Running` and `Ready` at once, its containers ready (no image is pulled: any image name
//!   does); a Running pod owned by a Job goes `Succeeded` (so Jobs complete); a pod being deleted is deleted at
//!   once.
//!
//! Nodes are created by [`WorkloadRuntime::start`] and [`WorkloadRuntime::add_nodes`] from [`NodeSpec`]s, with the
//! labels a kubelet sets (`kubernetes.io/hostname`, `kubernetes.io/os: linux`, `kubernetes.io/arch: amd64`) plus
//! the caller's, no taint unless asked for, a pod CIDR of their own (`10.244.<n>.0/24`) and an `InternalIP`
//! (`172.18.0.<n + 2>`); both return once every node is `Ready` and without the not-ready taint. Deleting a node
//! is up to the caller, and behaves as in a real cluster: pod GC deletes the pods bound to it after a quarantine
//! of 40 s, and a DaemonSet's status keeps counting the node until then (its controller does not watch node
//! deletions). One runtime per control plane.
//!
//! Everything binds to loopback: kube-controller-manager and kube-scheduler serve their health endpoints on
//! `127.0.0.1` (free ports), kwok serves nothing. Their logs are in the control plane's directory
//! (`kube-controller-manager.log`, `kube-scheduler.log`, `kwok.log`). Dropping a [`WorkloadRuntime`] stops the
//! three; dropping a [`WorkloadCluster`] stops them, then the API server and etcd.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::{Node, Taint},
    apimachinery::pkg::api::resource::Quantity,
};
use kube::{Api, api::PostParams};
use serde_json::json;

use crate::{ControlPlane, Error, Tools, control_plane::free_port, process::Supervised};

/// The annotation (with the value [`KWOK_NODE_ANNOTATION_VALUE`]) that makes kwok manage a node.
pub const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
/// See [`KWOK_NODE_ANNOTATION`].
pub const KWOK_NODE_ANNOTATION_VALUE: &str = "fake";
/// The taint the API server puts on every new node until the node lifecycle controller sees it Ready.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
/// kube-controller-manager's `--controllers`.
pub const CONTROLLERS: &str = "*";
/// The nodes of [`shared_workload_cluster`].
pub const SHARED_NODES: usize = 3;

/// kwok's default Stages (see the file's header).
const KWOK_STAGES: &str = include_str!("kwok_stages.yaml");
/// Until kube-controller-manager and kube-scheduler answer their health endpoints.
const SERVING_TIMEOUT: Duration = Duration::from_secs(120);
/// Until created nodes are Ready and untainted.
const NODES_READY_TIMEOUT: Duration = Duration::from_secs(90);
/// Starts of a component before a lost race for its port fails it (as in [`ControlPlane::start`]).
const PORT_RACE_ATTEMPTS: u32 = 3;
/// kwok's `--node-lease-duration-seconds` (kwokctl's default): kwok renews each node's Lease well within it.
const NODE_LEASE_SECONDS: u32 = 40;
/// Node `n` gets the pod CIDR `10.244.n.0/24` and the address `172.18.0.(n + 2)`.
const MAX_NODES: usize = 250;

/// One simulated node.
#[derive(Clone, Debug, Default)]
pub struct NodeSpec {
    pub name: String,
    /// Labels beside the kubelet's (`kubernetes.io/hostname`, `kubernetes.io/os: linux`,
    /// `kubernetes.io/arch: amd64`); these win over those.
    pub labels: BTreeMap<String, String>,
    /// None by default, so that charts without tolerations schedule.
    pub taints: Vec<Taint>,
    /// Capacity, also set as allocatable (`cpu`, `memory`, `pods`, ...); empty: kwok's (cpu 1k, memory 1Ti,
    /// pods 1M).
    pub capacity: BTreeMap<String, Quantity>,
}

impl NodeSpec {
    pub fn new(name: impl Into<String>) -> Self {
        NodeSpec {
            name: name.into(),
            ..Default::default()
        }
    }

    /// `count` nodes named `<prefix>-0`, `<prefix>-1`, ...
    pub fn numbered(prefix: &str, count: usize) -> Vec<NodeSpec> {
        (0..count)
            .map(|n| NodeSpec::new(format!("{prefix}-{n}")))
            .collect()
    }

    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    pub fn taint(mut self, key: &str, value: Option<&str>, effect: &str) -> Self {
        self.taints.push(Taint {
            key: key.to_owned(),
            value: value.map(str::to_owned),
            effect: effect.to_owned(),
            time_added: None,
        });
        self
    }

    pub fn capacity(mut self, resource: &str, quantity: &str) -> Self {
        self.capacity
            .insert(resource.to_owned(), Quantity(quantity.to_owned()));
        self
    }

    /// The Node object: kwok's annotation, the kubelet's labels, the `index`th pod CIDR and address.
    fn object(&self, index: usize) -> Result<Node, Error> {
        if index >= MAX_NODES {
            return Err(Error::Kube(format!(
                "node {}: at most {MAX_NODES} simulated nodes per workload runtime",
                self.name
            )));
        }
        let mut labels: BTreeMap<String, String> = [
            ("kubernetes.io/hostname", self.name.as_str()),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", "amd64"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        labels.extend(self.labels.clone());
        let pod_cidr = crate::node::pod_cidr(index);
        let mut status = json!({
            "addresses": [
                {"type": "InternalIP", "address": format!("172.18.0.{}", index + 2)},
                {"type": "Hostname", "address": self.name},
            ],
        });
        if !self.capacity.is_empty() {
            status["capacity"] = json!(self.capacity);
            status["allocatable"] = json!(self.capacity);
        }
        // Nodes take their status on create (the API server keeps it), so kwok finds the addresses and the
        // capacity in place and keeps them.
        serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.name,
                "labels": labels,
                "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE},
            },
            "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr], "taints": self.taints},
            "status": status,
        }))
        .map_err(|e| Error::Kube(format!("node {}: {e}", self.name)))
    }
}

/// The three processes of a [`WorkloadRuntime`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Component {
    ControllerManager,
    Scheduler,
    Kwok,
}

impl Component {
    pub const ALL: [Component; 3] = [
        Component::ControllerManager,
        Component::Scheduler,
        Component::Kwok,
    ];

    /// The binary's name, also the name of its log file (`<name>.log` in the control plane's directory).
    pub fn name(self) -> &'static str {
        match self {
            Component::ControllerManager => "kube-controller-manager",
            Component::Scheduler => "kube-scheduler",
            Component::Kwok => "kwok",
        }
    }
}

/// kube-controller-manager, kube-scheduler and kwok running against one control plane. Dropping it stops them
/// (kwok first); the nodes stay in the control plane.
#[derive(Debug)]
pub struct WorkloadRuntime {
    // Field order is drop order.
    kwok: Supervised,
    scheduler: Supervised,
    controller_manager: Supervised,
    controller_manager_port: u16,
    scheduler_port: u16,
    /// The index of the next node (its pod CIDR and address).
    next_node: AtomicUsize,
    started_in: Duration,
}

impl WorkloadRuntime {
    /// Starts kube-controller-manager, kube-scheduler and kwok against `plane` (its admin kubeconfig), creates
    /// `nodes` and returns once both components answer their health endpoints and every node is Ready and
    /// schedulable.
    pub async fn start(tools: &Tools, plane: &ControlPlane, nodes: &[NodeSpec]) -> Result<Self, Error> {
        let started = Instant::now();
        let binary = |path: &Option<PathBuf>, name: &str, key: &str| -> Result<PathBuf, Error> {
            let path = path
                .clone()
                .ok_or_else(|| Error::Tools(format!("{name} not found: run `make tools` or set {key}")))?;
            if !path.is_file() {
                return Err(Error::Tools(format!(
                    "{} does not exist: run `make tools`",
                    path.display()
                )));
            }
            Ok(path)
        };
        let kcm = binary(
            &tools.kube_controller_manager,
            "kube-controller-manager",
            "CSO_KUBE_CONTROLLER_MANAGER",
        )?;
        let scheduler = binary(&tools.kube_scheduler, "kube-scheduler", "CSO_KUBE_SCHEDULER")?;
        let kwok = binary(&tools.kwok, "kwok", "CSO_KWOK")?;

        let dir = plane.dir();
        let kwok_dir = dir.join("kwok");
        std::fs::create_dir_all(&kwok_dir).map_err(|e| Error::io(&kwok_dir, e))?;
        let stages = kwok_dir.join("stages.yaml");
        std::fs::write(&stages, KWOK_STAGES).map_err(|e| Error::io(&stages, e))?;
        let kubeconfig = plane.kubeconfig_path().display().to_string();

        let mut command = Command::new(&kwok);
        command
            .args([
                format!("--kubeconfig={kubeconfig}"),
                format!("--config={}", stages.display()),
                "--manage-all-nodes=false".into(),
                format!("--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={KWOK_NODE_ANNOTATION_VALUE}"),
                format!("--node-lease-duration-seconds={NODE_LEASE_SECONDS}"),
                // Pods on a managed node without a pod CIDR (one not created here) take their IPs from this.
                format!("--cidr={}", crate::egress::KWOK_POD_CIDR),
            ])
            // Its work directory: kwok reads `<workdir>/kwok.yaml` when it exists (`~/.kwok` by default).
            .env("KWOK_WORKDIR", &kwok_dir);
        let kwok = Supervised::spawn(Component::Kwok.name(), command, &dir.join("kwok.log"), None)?;

        let index = AtomicUsize::new(0);
        let client = plane.client().await?;
        let names = create_nodes(&client, nodes, &index).await?;

        let kcm_command = |port: u16| {
            let mut command = serving_command(&kcm, &kubeconfig, port);
            command.args([
                format!("--controllers={CONTROLLERS}"),
                format!(
                    "--service-account-private-key-file={}",
                    plane.service_account_key_path().display()
                ),
                format!("--root-ca-file={}", plane.ca_cert_path().display()),
                "--kube-api-qps=100".into(),
                "--kube-api-burst=200".into(),
                "--profiling=false".into(),
            ]);
            command
        };
        let scheduler_command = |port: u16| serving_command(&scheduler, &kubeconfig, port);
        let ((controller_manager, controller_manager_port), (scheduler, scheduler_port)) = tokio::try_join!(
            start_serving(Component::ControllerManager, dir, "/healthz", kcm_command),
            start_serving(Component::Scheduler, dir, "/readyz", scheduler_command),
        )?;

        let mut runtime = WorkloadRuntime {
            kwok,
            scheduler,
            controller_manager,
            controller_manager_port,
            scheduler_port,
            next_node: index,
            started_in: Duration::ZERO,
        };
        wait_schedulable(&client, &names, || runtime.check_running())
            .await
            .map_err(|e| runtime.with_logs(e))?;
        runtime.started_in = started.elapsed();
        Ok(runtime)
    }

    /// Creates more simulated nodes and returns once they are Ready and schedulable.
    pub async fn add_nodes(&self, client: &kube::Client, nodes: &[NodeSpec]) -> Result<(), Error> {
        let names = create_nodes(client, nodes, &self.next_node).await?;
        wait_schedulable(client, &names, || Ok(()))
            .await
            .map_err(|e| self.with_logs(e))
    }

    /// `error` with the ends of kwok's and kube-controller-manager's logs (who make nodes Ready and untainted).
    fn with_logs(&self, error: Error) -> Error {
        Error::Process(format!(
            "{error}\nkwok's log:\n{}\nkube-controller-manager's log:\n{}",
            self.kwok.log_tail(),
            self.controller_manager.log_tail()
        ))
    }

    /// From the call of [`WorkloadRuntime::start`] until the components and the nodes were ready.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Process ids, for measuring memory.
    pub fn pids(&self) -> [(Component, u32); 3] {
        Component::ALL.map(|c| (c, self.process(c).pid()))
    }

    /// `https://127.0.0.1:<port>` of kube-controller-manager's or kube-scheduler's health endpoints (a
    /// self-signed certificate; `/healthz`, `/readyz`, `/livez` need no credentials); `None` for kwok, which
    /// serves nothing.
    pub fn health_url(&self, component: Component) -> Option<String> {
        match component {
            Component::ControllerManager => {
                Some(format!("https://127.0.0.1:{}", self.controller_manager_port))
            }
            Component::Scheduler => Some(format!("https://127.0.0.1:{}", self.scheduler_port)),
            Component::Kwok => None,
        }
    }

    /// The end of a component's log, for failure messages.
    pub fn log_tail(&self, component: Component) -> String {
        self.process(component).log_tail()
    }

    /// An error describing the first component that has exited, if any.
    pub fn check_running(&mut self) -> Result<(), Error> {
        let exited = self
            .kwok
            .exited()
            .or_else(|| self.scheduler.exited())
            .or_else(|| self.controller_manager.exited());
        match exited {
            Some(exit) => Err(Error::Process(exit)),
            None => Ok(()),
        }
    }

    /// Stops kwok, kube-scheduler and kube-controller-manager.
    pub fn stop(mut self) {
        for process in [&mut self.kwok, &mut self.scheduler, &mut self.controller_manager] {
            process.stop(Duration::from_secs(10));
        }
    }

    fn process(&self, component: Component) -> &Supervised {
        match component {
            Component::ControllerManager => &self.controller_manager,
            Component::Scheduler => &self.scheduler,
            Component::Kwok => &self.kwok,
        }
    }
}

/// A command for Kubernetes' controller manager or scheduler at `binary` against the plane of `kubeconfig`, without
/// leader election, serving its health and metrics on loopback `port`.
fn serving_command(binary: &Path, kubeconfig: &str, port: u16) -> Command {
    let mut command = Command::new(binary);
    command.args([
        format!("--kubeconfig={kubeconfig}"),
        "--leader-elect=false".into(),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
    ]);
    command
}

/// kube-controller-manager with the garbage collector alone (`--controllers=garbagecollector`) against a control
/// plane that runs no [`WorkloadRuntime`]: a management plane with Cluster API ([`crate::capi`]), where what
/// Cluster API leaves to Kubernetes' garbage collection must happen. Cluster API's topology controller gives a
/// new Cluster's infrastructure cluster and control plane a second, temporary owner (the Secret
/// `<cluster>-shim`), deletes the shim once the Cluster owns both, and leaves the dangling owner reference to
/// the garbage collector; `clusterctl move` moves no object with an owner it cannot find, so without this it
/// leaves both (and the kubeconfig Secret the control plane owns) behind ([`crate::clusterctl`]).
///
/// Its health endpoint is on a free loopback port (`/healthz`), its log `kube-controller-manager.log` in the
/// plane's directory. Dropping it stops it.
#[derive(Debug)]
pub struct GarbageCollector {
    process: Supervised,
    port: u16,
}

impl GarbageCollector {
    /// Starts it against `plane` (its admin kubeconfig) and returns once it answers `/healthz`.
    pub async fn start(tools: &Tools, plane: &ControlPlane) -> Result<Self, Error> {
        let kcm = tools.kube_controller_manager.clone().ok_or_else(|| {
            Error::Tools(
                "kube-controller-manager not found: run `make tools` or set CSO_KUBE_CONTROLLER_MANAGER"
                    .into(),
            )
        })?;
        if !kcm.is_file() {
            return Err(Error::Tools(format!(
                "{} does not exist: run `make tools`",
                kcm.display()
            )));
        }
        let kubeconfig = plane.kubeconfig_path().display().to_string();
        let command = |port: u16| {
            let mut command = serving_command(&kcm, &kubeconfig, port);
            command.args(["--controllers=garbagecollector", "--profiling=false"]);
            command
        };
        let (process, port) =
            start_serving(Component::ControllerManager, plane.dir(), "/healthz", command).await?;
        Ok(GarbageCollector { process, port })
    }

    /// `https://127.0.0.1:<port>` of its health endpoints.
    pub fn health_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The end of its log, for failure messages.
    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }

    /// An error when it has exited.
    pub fn check_running(&mut self) -> Result<(), Error> {
        self.process
            .exited()
            .map_or(Ok(()), |exit| Err(Error::Process(exit)))
    }
}

/// A control plane with a [`WorkloadRuntime`]. Field order is drop order: the runtime stops before the API
/// server and etcd.
#[derive(Debug)]
pub struct WorkloadCluster {
    pub runtime: WorkloadRuntime,
    pub control_plane: ControlPlane,
}

impl WorkloadCluster {
    /// Stops the runtime, then the control plane.
    pub fn stop(self) {
        self.runtime.stop();
        self.control_plane.stop();
    }
}

impl ControlPlane {
    /// Starts a control plane as [`ControlPlane::start`] does, then a [`WorkloadRuntime`] with `nodes` on it.
    pub async fn start_with_workloads(
        tools: &Tools,
        name: &str,
        dir: Option<&Path>,
        nodes: &[NodeSpec],
    ) -> Result<WorkloadCluster, Error> {
        let control_plane = ControlPlane::start(tools, name, dir).await?;
        let runtime = WorkloadRuntime::start(tools, &control_plane, nodes).await?;
        Ok(WorkloadCluster {
            runtime,
            control_plane,
        })
    }
}

/// A workload cluster with [`SHARED_NODES`] nodes (`kwok-node-0`, ...) shared by all tests of this test binary,
/// started on first use on a thread of its own; it lives until the test binary exits, when the process
/// watchdogs stop it. Panics with the reason when it cannot start. Tests isolate themselves by namespace; one
/// that adds or deletes nodes changes what the others see.
pub fn shared_workload_cluster() -> &'static WorkloadCluster {
    static SHARED: OnceLock<WorkloadCluster> = OnceLock::new();
    SHARED.get_or_init(|| {
        crate::start_shared(|tools| {
            Box::pin(async move {
                let nodes = NodeSpec::numbered("kwok-node", SHARED_NODES);
                ControlPlane::start_with_workloads(tools, "workload", None, &nodes).await
            })
        })
    })
}

/// Creates the nodes (each taking the next index) and returns their names.
async fn create_nodes(
    client: &kube::Client,
    nodes: &[NodeSpec],
    next: &AtomicUsize,
) -> Result<Vec<String>, Error> {
    let api: Api<Node> = Api::all(client.clone());
    let mut names = Vec::new();
    for spec in nodes {
        let node = spec.object(next.fetch_add(1, Ordering::Relaxed))?;
        api.create(&PostParams::default(), &node)
            .await
            .map_err(|e| Error::Kube(format!("creating node {}: {e}", spec.name)))?;
        names.push(spec.name.clone());
    }
    Ok(names)
}

/// Waits until every named node is Ready and has neither the not-ready nor the unreachable taint; `check`
/// fails the wait early (a component that exited).
async fn wait_schedulable(
    client: &kube::Client,
    names: &[String],
    mut check: impl FnMut() -> Result<(), Error>,
) -> Result<(), Error> {
    let api: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + NODES_READY_TIMEOUT;
    loop {
        check()?;
        let mut waiting = Vec::new();
        for name in names {
            match api.get_opt(name).await {
                Ok(Some(node)) => {
                    if let Some(why) = unschedulable(&node) {
                        waiting.push(format!("{name}: {why}"));
                    }
                }
                Ok(None) => waiting.push(format!("{name}: not found")),
                Err(e) => waiting.push(format!("{name}: {e}")),
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Process(format!(
                "simulated nodes not schedulable after {NODES_READY_TIMEOUT:?}: {}",
                waiting.join("; ")
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Why pods could not be scheduled to `node` yet: not Ready, or a taint of an unready node.
fn unschedulable(node: &Node) -> Option<String> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.as_str());
    if ready != Some("True") {
        return Some(format!("Ready is {}", ready.unwrap_or("missing")));
    }
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
    taints
        .into_iter()
        .flatten()
        .find(|t| t.key == NOT_READY_TAINT || t.key == "node.kubernetes.io/unreachable")
        .map(|t| format!("tainted {}:{}", t.key, t.effect))
}

/// Starts a component that serves HTTPS health endpoints on a free loopback port and waits until `path`
/// answers 200; a start that lost its port to another process is tried again on another.
async fn start_serving(
    component: Component,
    dir: &Path,
    path: &'static str,
    command: impl Fn(u16) -> Command,
) -> Result<(Supervised, u16), Error> {
    crate::install_crypto_provider();
    // The components serve a self-signed certificate of their own; this only asks loopback whether they are up.
    let http = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| Error::Process(format!("HTTP client: {e}")))?;
    let log = dir.join(format!("{}.log", component.name()));
    let mut attempt = 1;
    loop {
        let port = free_port()?;
        let mut process = Supervised::spawn(component.name(), command(port), &log, None)?;
        let url = format!("https://127.0.0.1:{port}{path}");
        let probe = || {
            let (http, url) = (http.clone(), url.clone());
            async move { matches!(http.get(&url).send().await, Ok(response) if response.status().is_success()) }
        };
        match process
            .wait_ready(SERVING_TIMEOUT, Duration::from_millis(200), probe)
            .await
        {
            Ok(()) => return Ok((process, port)),
            Err(Error::Process(message))
                if message.contains("address already in use") && attempt < PORT_RACE_ATTEMPTS =>
            {
                eprintln!(
                    "{}: port {port} was taken meanwhile; starting again on another",
                    component.name()
                );
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn a_node_carries_the_kwok_annotation_the_kubelet_labels_and_its_own_network() {
        let node = NodeSpec::new("n1")
            .label("kubernetes.io/os", "windows")
            .label("tier", "edge")
            .capacity("pods", "10")
            .object(3)
            .unwrap();
        let meta = &node.metadata;
        assert_eq!(
            meta.annotations.as_ref().unwrap()[KWOK_NODE_ANNOTATION],
            KWOK_NODE_ANNOTATION_VALUE
        );
        let labels = meta.labels.as_ref().unwrap();
        assert_eq!(labels["kubernetes.io/hostname"], "n1");
        assert_eq!(labels["kubernetes.io/os"], "windows", "the caller's labels win");
        assert_eq!(labels["tier"], "edge");
        let spec = node.spec.as_ref().unwrap();
        assert_eq!(spec.pod_cidr.as_deref(), Some("10.244.3.0/24"));
        assert_eq!(spec.taints.as_deref(), Some(&[][..]));
        let status = node.status.as_ref().unwrap();
        assert_eq!(status.addresses.as_ref().unwrap()[0].address, "172.18.0.5");
        assert_eq!(
            status.allocatable.as_ref().unwrap()["pods"],
            Quantity("10".into())
        );
        assert!(NodeSpec::new("too-many").object(MAX_NODES).is_err());
    }

    #[test]
    fn the_stages_are_the_five_kwokctl_configures() {
        let names: Vec<&str> = KWOK_STAGES
            .lines()
            .filter_map(|l| l.strip_prefix("  name: "))
            .collect();
        assert_eq!(
            names,
            [
                "node-initialize",
                "node-heartbeat-with-lease",
                "pod-ready",
                "pod-complete",
                "pod-delete"
            ]
        );
    }
}
