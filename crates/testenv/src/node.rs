//! Real nodes: containerd + runc + kubelet + kube-proxy, joined to a control plane of the environment, as kind
//! runs them.
//!
//! A [`RealCluster`] takes a *slot* `c` of this machine (1 to 250, shared with every other process through
//! `/run/cso-testenv/nodes`) and a bridge `cso<c>br` with `172.18.<c>.1/24` on this machine. Each node `i` is a
//! network namespace `cso-<c>-<i>` on that bridge with the address `172.18.<c>.<i + 2>` and no default route,
//! so that nothing in it can reach beyond the bridge. As in kind, the first node also holds the control plane:
//! etcd and kube-apiserver run in its namespace and listen on its address, so that the API server reaches
//! Services, pods and webhooks the way a control-plane node does; kube-controller-manager and kube-scheduler
//! run on this machine and reach it over the bridge, and so do the tests.
//!
//! Each node's processes run in its network namespace and in a mount namespace of its own (entered with
//! `nsenter --net --mount`, [`make_mount_namespace`]): none of its mounts go out of it, `/etc` and `/run` are
//! overlays on the machine's whose writes stay in the node's directory, as a kind node has them, and
//! `/etc/cni/net.d` is a directory of the node's own. So what a pod
//! writes through a `hostPath` there (a CNI addon's `/etc/cni/net.d`, its IPAM state in `/run`) is the node's,
//! and the kubelet's and containerd's mounts are seen by both and nobody else. In it: a containerd of its own
//! (root, state and socket in the node's directory, CRI with CNI from `/etc/cni/net.d`;
//! `restrict_oom_score_adj`, which root here needs), a kubelet (cgroup v1 with the `cgroupfs` driver under the
//! cgroup `/cso-<c>-<i>`, client certificate `system:node:<name>`, a serving certificate for its address,
//! webhook authentication and authorization) and kube-proxy (iptables mode, in the namespace only; it leaves
//! the machine's conntrack settings alone). Each node gets the pod CIDR `10.244.<i>.0/24` in its `spec.podCIDR`.
//! The pods' network ([`PodNetwork`]) is either the environment's (a CNI `bridge` on `cni0` in that CIDR,
//! routes only to the environment's ranges, no masquerade) or the cluster's own CNI addon (a stack's kindnet
//! writes its configuration and routes the other nodes' CIDRs). Pods reach this machine's address on the bridge
//! ([`RealCluster::host_address`], where a test serves what pods must reach) masqueraded as their node; the
//! environment masquerades nothing else (a CNI addon may: kindnet's agent does, for what leaves the pod
//! network); a node has no default route. Images come from archives imported into the node's
//! containerd ([`RealCluster::import_image`]); the sandbox image is the `pause` that `make tools` builds.
//! Cluster DNS ([`crate::cluster_dns`]) also answers the nodes' names. The API server serves the aggregation
//! layer (a front-proxy client certificate and the request headers, as kubeadm sets them up, but signed by the
//! cluster's CA rather than a CA of its own) and mutating admission policies ([`substitute_image`]).
//!
//! Stopping (or dropping) the cluster, or the death of the process that started it, runs the slot's teardown
//! script: every process in the nodes' cgroups and every shim of their containerds is killed, the mounts under
//! the nodes' directories are undone, the namespaces, the bridge and the cgroups are removed, and the sysctls
//! the kubelet sets (`kernel.panic`, `kernel.panic_on_oops`, `vm.overcommit_memory`) are put back once no other
//! real-node cluster runs. [`RealCluster::support`] says in one line why a machine cannot run nodes.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::ListParams};

use crate::{
    ControlPlane, Error, Tools, control_plane::Placement, egress::run, process::Supervised,
    workloads::WorkloadRuntime,
};

/// Where slots, their teardown scripts and the saved sysctls live.
pub const STATE_DIR: &str = "/run/cso-testenv/nodes";
/// The sysctls the kubelet sets, put back when the last real-node cluster stops.
const KUBELET_SYSCTLS: [&str; 3] = ["kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory"];
/// How long a node may take from its kubelet's start to `Ready`.
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Seconds the slot's watchdog waits after its process is gone, so that the node processes' own watchdogs have
/// stopped them (they give 3 s of grace).
const TEARDOWN_DELAY_SECS: u32 = 5;
/// The cluster DNS address handed to pods (the tenth Service IP, as kubeadm picks it).
pub const CLUSTER_DNS: &str = "10.0.0.10";

/// The executables a real node runs, found by `make tools` (environment file) or on `PATH`.
#[derive(Debug, Clone)]
pub struct NodeTools {
    pub kubelet: PathBuf,
    pub kube_proxy: PathBuf,
    pub containerd: PathBuf,
    pub cni_bin_dir: PathBuf,
    pub pause_image: PathBuf,
    pub coredns_image: PathBuf,
}

impl NodeTools {
    /// The node tools, or one line saying what is missing (and how to get it).
    pub fn find(tools: &Tools) -> Result<Self, String> {
        let need = crate::tools::built;
        Ok(NodeTools {
            kubelet: need(&tools.kubelet, "kubelet")?,
            kube_proxy: need(&tools.kube_proxy, "kube-proxy")?,
            containerd: need(&tools.containerd, "containerd (Debian's package)")?,
            cni_bin_dir: need(
                &tools.cni_bin_dir,
                "the CNI plugins (Debian's containernetworking-plugins)",
            )?,
            pause_image: need(&tools.pause_image, "the pause image")?,
            coredns_image: need(&tools.coredns_image, "the cluster DNS image (coredns)")?,
        })
    }
}

/// What gives the pods of a [`RealCluster`] their network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodNetwork {
    /// The environment: each node starts with a CNI `bridge` configuration (pods reach each other on their node,
    /// Services, and this machine's host address). The cluster is returned with every node `Ready`.
    Environment,
    /// The cluster's own CNI addon (a stack's kindnet, as a workload cluster of Cluster API has it): the nodes
    /// start with an empty `/etc/cni/net.d` and stay `NotReady` until a DaemonSet writes a configuration there.
    /// The cluster is returned once every node has registered and has its pod CIDR.
    Addon,
}

/// A control plane in its first node's network namespace, kube-controller-manager and kube-scheduler, and real
/// nodes. Dropping it stops everything and leaves nothing behind.
#[derive(Debug)]
pub struct RealCluster {
    // Field order is drop order: the nodes, then the control plane, then the slot's teardown.
    nodes: Vec<RealNode>,
    pub runtime: WorkloadRuntime,
    pub control_plane: ControlPlane,
    slot: Slot,
    dir: PathBuf,
    _tempdir: Option<tempfile::TempDir>,
}

/// A pod's memory in bytes ([`RealCluster::pod_memory`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodMemory {
    /// The cgroup's usage less its inactive file pages.
    pub working_set: u64,
    /// The sum of its processes' resident sets (`VmRSS`).
    pub resident: u64,
}

/// One node's processes and where its files are.
#[derive(Debug)]
pub struct RealNode {
    // Field order is drop order.
    kube_proxy: Supervised,
    kubelet: Supervised,
    containerd: Supervised,
    pub name: String,
    pub address: Ipv4Addr,
    pub dir: PathBuf,
    socket: PathBuf,
}

impl RealNode {
    /// The node's containerd socket.
    pub fn containerd_socket(&self) -> &Path {
        &self.socket
    }

    /// Process ids of containerd, the kubelet and kube-proxy (for measuring their memory).
    pub fn pids(&self) -> [u32; 3] {
        [self.containerd.pid(), self.kubelet.pid(), self.kube_proxy.pid()]
    }

    fn check_running(&mut self) -> Result<(), Error> {
        for (what, process) in [
            ("containerd", &mut self.containerd),
            ("kubelet", &mut self.kubelet),
            ("kube-proxy", &mut self.kube_proxy),
        ] {
            if let Some(exit) = process.exited() {
                return Err(Error::Process(format!(
                    "node {}: {what} {exit}\n{}",
                    self.name,
                    process.log_tail()
                )));
            }
        }
        Ok(())
    }
}

impl RealCluster {
    /// Why this machine cannot run real nodes, in one line; `Ok` when it can.
    pub fn support(tools: &Tools) -> Result<NodeTools, String> {
        if !crate::egress::is_root() {
            return Err("real nodes need root (network namespaces, cgroups, mounts): run as root".into());
        }
        if !Path::new("/sys/fs/cgroup/memory").is_dir()
            && !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
        {
            return Err("real nodes need cgroups: /sys/fs/cgroup has neither v1 hierarchies nor v2".into());
        }
        for tool in ["nsenter", "unshare", "mount", "ip", "iptables"] {
            if crate::egress::which(tool).is_none() {
                return Err(format!("real nodes need `{tool}`: run `make tools`"));
            }
        }
        NodeTools::find(tools)
    }

    /// Starts a control plane in the first node's namespace, kube-controller-manager and kube-scheduler, and
    /// `nodes` real nodes (`<name>-node-<i>`); returns once every node is `Ready`. Files live in `dir`, or in a
    /// temporary directory removed on drop.
    pub async fn start(tools: &Tools, name: &str, dir: Option<&Path>, nodes: usize) -> Result<Self, Error> {
        Self::start_with(tools, name, dir, nodes, PodNetwork::Environment).await
    }

    /// [`RealCluster::start`], with the pods' network given by `network`.
    pub async fn start_with(
        tools: &Tools,
        name: &str,
        dir: Option<&Path>,
        nodes: usize,
        network: PodNetwork,
    ) -> Result<Self, Error> {
        let node_tools = Self::support(tools).map_err(Error::Tools)?;
        if nodes == 0 {
            return Err(Error::Process("a real cluster needs at least one node".into()));
        }
        crate::egress::ensure()?;
        let (tempdir, dir) = match dir {
            Some(dir) => (None, dir.to_path_buf()),
            None => {
                let tmp = tempfile::Builder::new()
                    .prefix(&format!("cso-{name}-"))
                    .tempdir_in("/var/tmp")
                    .map_err(|e| Error::io(Path::new("/var/tmp"), e))?;
                let path = tmp.path().to_path_buf();
                (Some(tmp), path)
            }
        };
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        // Absolute (the nodes' processes start in `/`) and fit for overlay options.
        let dir = dir.canonicalize().map_err(|e| Error::io(&dir, e))?;
        usable_dir(&dir).map_err(Error::Process)?;
        let slot = Slot::take(&dir, nodes)?;
        for i in 0..nodes {
            slot.make_namespace(i)?;
        }
        let placement = Placement {
            address: IpAddr::V4(slot.node_address(0)),
            netns: Some(slot.netns(0)),
        };
        let control_plane =
            ControlPlane::start_placed(tools, name, Some(&dir.join("control-plane")), &placement).await?;
        let runtime = WorkloadRuntime::start(tools, &control_plane, &[]).await?;
        let mut cluster = RealCluster {
            nodes: Vec::new(),
            runtime,
            control_plane,
            slot,
            dir,
            _tempdir: tempdir,
        };
        for i in 0..nodes {
            let node = cluster.start_node(&node_tools, name, i, network)?;
            cluster.nodes.push(node);
        }
        cluster.assign_pod_cidrs().await?;
        if network == PodNetwork::Environment {
            cluster.wait_ready().await?;
        }
        cluster.import_image(&node_tools.coredns_image)?;
        let client = cluster.control_plane.client().await?;
        let hosts: Vec<(String, IpAddr)> = cluster
            .nodes
            .iter()
            .map(|node| (node.name.clone(), IpAddr::V4(node.address)))
            .collect();
        let image = archive_image_name(&node_tools.coredns_image)?;
        match network {
            PodNetwork::Environment => crate::cluster_dns::deploy(&client, &image, &hosts).await?,
            PodNetwork::Addon => crate::cluster_dns::deploy_without_waiting(&client, &image, &hosts).await?,
        }
        Ok(cluster)
    }

    /// An error naming the first process of the cluster (control plane, runtime, a node's) that has exited.
    pub fn check_running(&mut self) -> Result<(), Error> {
        self.control_plane.check_running()?;
        self.runtime.check_running()?;
        for node in &mut self.nodes {
            node.check_running()?;
        }
        Ok(())
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RealNode] {
        &self.nodes
    }

    /// The cluster's directory (control plane and nodes).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// This machine's address on the slot's bridge: what the nodes and their pods reach this machine at. A
    /// server a test starts for the pods (a release source, a workload cluster's API server) listens here.
    pub fn host_address(&self) -> IpAddr {
        IpAddr::V4(self.slot.host_address())
    }

    /// The memory of a pod, from its cgroup `pod<uid>` under a node's cgroup root: the working set (usage less
    /// inactive file pages, what the kubelet judges against the limit) and the resident memory of its processes.
    /// `None` when no node has that pod.
    pub fn pod_memory(&self, pod_uid: &str) -> Option<PodMemory> {
        let name = format!("pod{pod_uid}");
        (0..self.nodes.len()).find_map(|node| {
            let root =
                Path::new("/sys/fs/cgroup/memory").join(self.slot.cgroup(node).trim_start_matches('/'));
            let dir = find_dir(&root, &name, 3)?;
            let read = |file: &str| std::fs::read_to_string(dir.join(file)).ok();
            let usage: u64 = read("memory.usage_in_bytes")?.trim().parse().ok()?;
            let inactive_file: u64 = read("memory.stat")?
                .lines()
                .find_map(|line| line.strip_prefix("total_inactive_file "))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0);
            let resident = processes_under(&dir)
                .iter()
                .filter_map(|pid| {
                    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
                    let kib: u64 = status
                        .lines()
                        .find_map(|line| line.strip_prefix("VmRSS:"))?
                        .trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse()
                        .ok()?;
                    Some(kib * 1024)
                })
                .sum();
            Some(PodMemory {
                working_set: usage.saturating_sub(inactive_file),
                resident,
            })
        })
    }

    /// Where a process of this machine's runs as if on node `node`: in its network namespace at its address
    /// ([`ControlPlane::start_placed`], [`crate::capi::Options::placement`]); started with `ip netns exec`, its
    /// resolver is the cluster's DNS.
    pub fn placement(&self, node: usize) -> Placement {
        Placement {
            address: IpAddr::V4(self.slot.node_address(node)),
            netns: Some(self.slot.netns(node)),
        }
    }

    /// The machine-wide slot this cluster holds (its bridge `cso<slot>br`, namespaces `cso-<slot>-<i>`).
    pub fn slot(&self) -> u8 {
        self.slot.index
    }

    /// Imports an OCI image archive (`hack/oci-archive.py`) into every node's containerd, under the name it
    /// carries (fully qualified: the CRI plugin finds no image imported under a short name).
    pub fn import_image(&self, archive: &Path) -> Result<(), Error> {
        for node in &self.nodes {
            import(&node.socket, archive)?;
        }
        Ok(())
    }

    /// Stops the nodes, the runtime and the control plane, then removes what the nodes left on the machine.
    pub fn stop(self) {
        drop(self);
    }

    fn start_node(
        &self,
        node_tools: &NodeTools,
        cluster: &str,
        index: usize,
        network: PodNetwork,
    ) -> Result<RealNode, Error> {
        let name = format!("{cluster}-node-{index}");
        let address = self.slot.node_address(index);
        let dir = self.dir.join("nodes").join(&name);
        // A node's own /etc, /run and CNI configuration start empty (a directory reused from an earlier run
        // would hand an addon's old configuration and IP reservations to the new node).
        for layer in ["etc", "run", "cni-conf"] {
            let path = dir.join(layer);
            if path.exists() {
                std::fs::remove_dir_all(&path).map_err(|e| Error::io(&path, e))?;
            }
        }
        for sub in [
            "containerd/root",
            "containerd/state",
            "etc/upper/cni/net.d",
            "etc/work",
            "run/upper",
            "run/work",
            "cni-conf",
            "mount-namespace",
            "cni/ipam",
            "kubelet",
            "pod-logs",
            "certs.d/_default",
        ] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(|e| Error::io(&path, e))?;
        }
        if network == PodNetwork::Environment {
            // The node's /etc/cni/net.d (before the namespace mounts it), where a CNI addon would write.
            let path = dir.join("cni-conf/10-cso.conflist");
            std::fs::write(&path, cni_config(index, &dir.join("cni/ipam")))
                .map_err(|e| Error::io(&path, e))?;
        }
        let placement = NodePlacement {
            netns: self.slot.netns(index),
            mounts: make_mount_namespace(&dir)?,
        };
        let pki = self.control_plane.pki();
        let cgroup = self.slot.cgroup(index);
        make_cgroup(&cgroup)?;

        // containerd, its CRI plugin and CNI.
        let socket = dir.join("containerd.sock");
        let write = |file: &str, contents: String| -> Result<PathBuf, Error> {
            let path = dir.join(file);
            std::fs::write(&path, contents).map_err(|e| Error::io(&path, e))?;
            Ok(path)
        };
        // No registry outside this machine: every host resolves to nothing, and a missing image fails at once.
        write(
            "certs.d/_default/hosts.toml",
            "# cso_testenv::node: no registry beyond this machine; images are imported.\n\
             server = \"http://127.0.0.1:9\"\n[host.\"http://127.0.0.1:9\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
                .to_owned(),
        )?;
        let containerd_config = write(
            "containerd.toml",
            containerd_config(&dir, &socket, &node_tools.cni_bin_dir),
        )?;
        let mut command = placement.command(&node_tools.containerd);
        command.arg("--config").arg(&containerd_config);
        let containerd = Supervised::spawn("containerd", command, &dir.join("containerd.log"), None)?;
        // Its shims (and so the containers) start in its cgroup: the teardown finds them there.
        join_cgroup(&cgroup, containerd.pid())?;
        wait_for_socket(&socket, Duration::from_secs(30))?;
        import(&socket, &node_tools.pause_image)?;

        // The kubelet.
        let (client_cert, client_key) = pki.sign(
            &dir,
            "kubelet-client",
            &format!("system:node:{name}"),
            Some("system:nodes"),
            &[],
        )?;
        let (serving_cert, serving_key) = pki.sign(
            &dir,
            "kubelet-serving",
            &name,
            None,
            &[address.to_string(), name.clone()],
        )?;
        let kubelet_kubeconfig = write(
            "kubelet.kubeconfig",
            kubeconfig_with_cert(
                self.control_plane.server_url(),
                &pki.ca_pem,
                &client_cert,
                &client_key,
            )?,
        )?;
        write(
            "resolv.conf",
            "# cso_testenv::node: no resolver beyond the cluster's DNS\n".to_owned(),
        )?;
        let kubelet_config = write(
            "kubelet.yaml",
            kubelet_config(
                &dir,
                &socket,
                &pki.ca_cert,
                &serving_cert,
                &serving_key,
                address,
                &cgroup,
            ),
        )?;
        let mut command = placement.command(&node_tools.kubelet);
        command
            .arg(format!("--config={}", kubelet_config.display()))
            .arg(format!("--kubeconfig={}", kubelet_kubeconfig.display()))
            .arg(format!("--root-dir={}", dir.join("kubelet").display()))
            .arg(format!("--hostname-override={name}"))
            .arg(format!("--node-ip={address}"))
            .arg("--v=1");
        let kubelet = Supervised::spawn("kubelet", command, &dir.join("kubelet.log"), None)?;

        // kube-proxy, with the admin's kubeconfig.
        let proxy_config = write(
            "kube-proxy.yaml",
            kube_proxy_config(&self.control_plane.kubeconfig_path().display().to_string(), &name),
        )?;
        let mut command = placement.command(&node_tools.kube_proxy);
        command.arg(format!("--config={}", proxy_config.display()));
        let kube_proxy = Supervised::spawn("kube-proxy", command, &dir.join("kube-proxy.log"), None)?;

        Ok(RealNode {
            kube_proxy,
            kubelet,
            containerd,
            name,
            address,
            dir,
            socket,
        })
    }

    /// Gives every node its pod CIDR (`spec.podCIDR`, [`pod_cidr`]) once it has registered, as
    /// kube-controller-manager's range allocator would: a CNI addon reads it there.
    async fn assign_pod_cidrs(&mut self) -> Result<(), Error> {
        let client = self.control_plane.client().await?;
        let nodes: Api<Node> = Api::all(client);
        let deadline = Instant::now() + NODE_READY_TIMEOUT;
        for (index, node) in self.nodes.iter_mut().enumerate() {
            loop {
                node.check_running()?;
                match nodes.get_opt(&node.name).await {
                    Ok(Some(registered)) => {
                        let cidr = pod_cidr(index);
                        if registered.spec.as_ref().and_then(|s| s.pod_cidr.as_deref()) != Some(cidr.as_str())
                        {
                            let patch = serde_json::json!({"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}});
                            nodes
                                .patch(
                                    &node.name,
                                    &kube::api::PatchParams::default(),
                                    &kube::api::Patch::Merge(patch),
                                )
                                .await
                                .map_err(|e| Error::Kube(format!("pod CIDR of {}: {e}", node.name)))?;
                        }
                        break;
                    }
                    // Not registered yet, or the API server not reachable for a moment; a refusal is final.
                    Ok(None) | Err(kube::Error::HyperError(_) | kube::Error::Service(_))
                        if Instant::now() < deadline =>
                    {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    other => {
                        return Err(Error::Process(format!(
                            "{}: no pod CIDR given: not registered within {NODE_READY_TIMEOUT:?}, or refused ({other:?}); its kubelet:\n{}",
                            node.name,
                            node.kubelet.log_tail()
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    async fn wait_ready(&mut self) -> Result<(), Error> {
        let client = self.control_plane.client().await?;
        let nodes: Api<Node> = Api::all(client);
        let deadline = Instant::now() + NODE_READY_TIMEOUT;
        loop {
            for node in &mut self.nodes {
                node.check_running()?;
            }
            let list = nodes
                .list(&ListParams::default())
                .await
                .map_err(|e| Error::Kube(e.to_string()))?;
            let ready: Vec<String> = list
                .items
                .iter()
                .filter(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .filter_map(|n| n.metadata.name.clone())
                .collect();
            if self.nodes.iter().all(|n| ready.contains(&n.name)) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let tails: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|n| format!("{}'s kubelet:\n{}", n.name, n.kubelet.log_tail()))
                    .collect();
                return Err(Error::Process(format!(
                    "nodes not Ready after {NODE_READY_TIMEOUT:?} (ready: {ready:?})\n{}",
                    tails.join("\n")
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Has the API server run `image` (a name the nodes' containerd has, with `imagePullPolicy: IfNotPresent`) in
/// every pod container whose image is exactly one of `asked`: a `MutatingAdmissionPolicy` (with its binding)
/// named `cso-testenv-<name>`. For an image a stack's addon names that cannot be built here (nginx): the
/// workload object keeps the image its chart gives (so what the operator applies and compares is the
/// release's), and the pod runs this project's stand-in, under its own name. Returns once the API server
/// applies it (a dry-run pod comes back with `image`; at most [`POLICY_TIMEOUT`]): a pod created earlier would
/// keep the image it asked for.
pub async fn substitute_image(
    client: &kube::Client,
    name: &str,
    asked: &[&str],
    image: &str,
) -> Result<(), Error> {
    let policy = format!("cso-testenv-{name}");
    let asked_list = serde_json::to_string(asked).map_err(|e| Error::Process(e.to_string()))?;
    let image_literal = serde_json::to_string(image).map_err(|e| Error::Process(e.to_string()))?;
    let wants = format!("has(c.image) && c.image in {asked_list}");
    let mutation = format!(
        "Object{{spec: Object.spec{{containers: object.spec.containers.filter(c, {wants}).map(c, \
         Object.spec.containers{{name: c.name, image: {image_literal}, imagePullPolicy: 'IfNotPresent'}})}}}}"
    );
    let objects = [
        serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1beta1", "kind": "MutatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
                }]},
                "matchConditions": [{
                    "name": "asks-for-a-substituted-image",
                    "expression": format!("object.spec.containers.exists(c, {wants})"),
                }],
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": mutation}}],
            },
        }),
        serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1beta1", "kind": "MutatingAdmissionPolicyBinding",
            "metadata": {"name": policy},
            "spec": {"policyName": policy},
        }),
    ];
    for object in &objects {
        crate::apply_object(client, object, "cso-testenv").await?;
    }
    // In effect once a pod that asks for the first image comes back from a dry run with the substitute.
    let Some(first) = asked.first() else {
        return Ok(());
    };
    let probe: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"generateName": "cso-testenv-substitution-probe-"},
        "spec": {"automountServiceAccountToken": false, "containers": [{"name": "probe", "image": first}]},
    }))
    .map_err(|e| Error::Process(e.to_string()))?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "default");
    let dry_run = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    let deadline = Instant::now() + POLICY_TIMEOUT;
    loop {
        let seen = match pods.create(&dry_run, &probe).await {
            Ok(pod) => pod
                .spec
                .and_then(|s| s.containers.first().and_then(|c| c.image.clone())),
            Err(e) => Some(e.to_string()),
        };
        if seen.as_deref() == Some(image) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Process(format!(
                "the image substitution {policy} not in effect after {POLICY_TIMEOUT:?}: a dry-run pod got {seen:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// How long a new admission policy may take to be applied by the API server.
const POLICY_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a node's own processes (containerd, kubelet, kube-proxy) run: its network namespace and its mount
/// namespace ([`make_mount_namespace`]).
struct NodePlacement {
    netns: String,
    mounts: PathBuf,
}

impl NodePlacement {
    fn command(&self, program: &Path) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net=/run/netns/{}", self.netns))
            .arg(format!("--mount={}", self.mounts.display()))
            .arg("--")
            .arg(program);
        command
    }
}

/// A mount namespace for the node whose files are in `dir`, kept in `dir/mount-namespace/mnt`. It starts as a
/// copy of the machine's, and the machine's mounts made later propagate into it where the machine's root is
/// shared (none go out of it). `/etc` and `/run` there are overlays on the machine's whose writes land in
/// `dir/etc` and `dir/run`, and `/etc/cni/net.d` is the node's own directory `dir/cni-conf` (never the
/// machine's files, if it has any). So what a node's pods write through a `hostPath` there (kindnet's
/// `/etc/cni/net.d`, its IPAM state in `/run`) and the mounts of its kubelet and containerd stay the node's, as
/// in a kind node; the namespace ends when its processes are gone and the teardown unmounts the file. Inside,
/// the root is shared again (as kind makes it), so pods may ask for `Bidirectional` mount propagation. Other
/// paths (`/opt`, `/var/lib`) are the machine's: an addon's `hostPath` there would write to the machine.
fn make_mount_namespace(dir: &Path) -> Result<PathBuf, Error> {
    let holder = dir.join("mount-namespace");
    let file = holder.join("mnt");
    std::fs::write(&file, "").map_err(|e| Error::io(&file, e))?;
    let path = |p: &Path| p.display().to_string();
    // A namespace is kept by binding it to a file on a mount that does not propagate.
    run("mount", &["--bind", &path(&holder), &path(&holder)])?;
    run("mount", &["--make-private", &path(&holder)])?;
    run(
        "unshare",
        &[
            &format!("--mount={}", file.display()),
            "--propagation",
            "slave",
            "true",
        ],
    )?;
    let inside = |args: &[&str]| {
        run(
            "nsenter",
            &[&[format!("--mount={}", file.display()).as_str(), "--"][..], args].concat(),
        )
    };
    for layer in ["etc", "run"] {
        let target = format!("/{layer}");
        let options = format!(
            "lowerdir={target},upperdir={},workdir={}",
            path(&dir.join(layer).join("upper")),
            path(&dir.join(layer).join("work"))
        );
        inside(&[
            "mount",
            "-t",
            "overlay",
            &format!("cso-node-{layer}"),
            "-o",
            &options,
            &target,
        ])?;
    }
    inside(&["mount", "--bind", &path(&dir.join("cni-conf")), "/etc/cni/net.d"])?;
    inside(&["mount", "--make-rshared", "/"])?;
    Ok(file)
}

/// Whether the nodes' files can live in `dir` (absolute): its path goes into overlay mount options, which a
/// `,` `:` or `\` would break, and its layers must not lie in the `/etc` or `/run` they overlay.
fn usable_dir(dir: &Path) -> Result<(), String> {
    let text = dir.display().to_string();
    if text.contains([',', ':', '\\']) || text.chars().any(char::is_whitespace) {
        return Err(format!(
            "{text}: a real cluster's directory may not contain `,` `:` `\\` or spaces"
        ));
    }
    if dir.starts_with("/etc") || dir.starts_with("/run") {
        return Err(format!(
            "{text}: a real cluster's directory may not be under /etc or /run (its nodes overlay them)"
        ));
    }
    Ok(())
}

/// A network namespace of its own with nothing started in it: a slot with one namespace `cso-<c>-0` at
/// `172.18.<c>.2` on the bridge `cso<c>br` (this machine at `172.18.<c>.1`), made as a real node's is, but no
/// node runs there. For a second set of servers beside the environment's on loopback where a server binds a
/// fixed port on every interface: Cluster API's Docker/Dev provider always listens on port 19000, so a second
/// management control plane with Cluster API runs in here
/// ([`crate::capi::start_second_management_with_cluster_api`]).
///
/// Needs root, `ip`, `nsenter` and `iptables`, as real nodes do. Dropping it (or the death of this process) runs
/// the slot's teardown: processes with the directory given to [`NetworkNamespace::take`] on their command line
/// are killed, the namespace and the bridge removed.
#[derive(Debug)]
pub struct NetworkNamespace {
    slot: Slot,
}

impl NetworkNamespace {
    /// Takes a free slot of this machine and makes its one namespace; `dir` is where the servers placed in it keep
    /// their files (the teardown kills what has it on its command line).
    pub fn take(dir: &Path) -> Result<Self, Error> {
        if !crate::egress::is_root() {
            return Err(Error::Tools(
                "a network namespace of its own needs root: run as root".into(),
            ));
        }
        for tool in ["nsenter", "ip", "iptables"] {
            if crate::egress::which(tool).is_none() {
                return Err(Error::Tools(format!(
                    "a network namespace of its own needs `{tool}`: run `make tools`"
                )));
            }
        }
        crate::egress::ensure()?;
        let slot = Slot::take(dir, 1)?;
        slot.make_namespace(0)?;
        Ok(NetworkNamespace { slot })
    }

    /// Where a server runs in the namespace: at `172.18.<c>.2`, started with `ip netns exec` (or `nsenter`)
    /// ([`ControlPlane::start_placed`], [`crate::capi::Options::placement`]). A control plane placed here serves
    /// real nodes' requests as a [`RealCluster`]'s does ([`Placement::serves_real_nodes`]).
    pub fn placement(&self) -> Placement {
        Placement {
            address: IpAddr::V4(self.slot.node_address(0)),
            netns: Some(self.slot.netns(0)),
        }
    }

    /// This machine's address on the slot's bridge, `172.18.<c>.1`: a server of this machine that listens here is
    /// reached both from loopback's side and from inside the namespace (a workload cluster that the managers on
    /// both sides dial).
    pub fn host_address(&self) -> IpAddr {
        IpAddr::V4(self.slot.host_address())
    }

    /// The machine-wide slot it holds.
    pub fn slot(&self) -> u8 {
        self.slot.index
    }
}

/// A slot of this machine: its index, the bridge, the namespaces and cgroups of its nodes, and the teardown
/// script that removes them (run on drop, and by a watchdog when the process dies).
#[derive(Debug)]
struct Slot {
    index: u8,
    nodes: usize,
    teardown: PathBuf,
    lock: PathBuf,
}

impl Slot {
    /// Takes the first free slot (none held by a live process), after tearing down what a dead holder left.
    fn take(dir: &Path, nodes: usize) -> Result<Self, Error> {
        let state = Path::new(STATE_DIR);
        let slots = state.join("slots");
        std::fs::create_dir_all(&slots).map_err(|e| Error::io(&slots, e))?;
        let lock_path = state.join("lock");
        let lock = std::fs::File::create(&lock_path).map_err(|e| Error::io(&lock_path, e))?;
        lock.lock().map_err(|e| Error::io(&lock_path, e))?;
        // Every dead holder's leftovers go first (its teardown script, then the slot is free), so that the
        // sysctls are saved from a machine no slot has changed.
        let mut live = std::collections::BTreeSet::new();
        for index in 1..=250u8 {
            let holder = slots.join(index.to_string());
            let Ok(pid) = std::fs::read_to_string(&holder) else {
                continue;
            };
            if alive(pid.trim()) {
                live.insert(index);
                continue;
            }
            let script = slots.join(format!("{index}.teardown"));
            if script.exists() {
                let _ = Command::new("sh")
                    .arg(&script)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
            let _ = std::fs::remove_file(&holder);
        }
        let index = (1..=250u8)
            .find(|index| !live.contains(index))
            .ok_or_else(|| Error::Process("all 250 real-node slots of this machine are taken".into()))?;
        // The sysctls the kubelet changes, saved by the first slot taken while no other runs.
        let saved = state.join("sysctls");
        let others = !live.is_empty();
        if !others || !saved.exists() {
            let values: Vec<String> = KUBELET_SYSCTLS
                .iter()
                .filter_map(|key| {
                    let value = std::fs::read_to_string(Path::new("/proc/sys").join(key)).ok()?;
                    Some(format!("{key}={}", value.trim()))
                })
                .collect();
            std::fs::write(&saved, values.join("\n") + "\n").map_err(|e| Error::io(&saved, e))?;
        }
        let slot = Slot {
            index,
            nodes,
            teardown: slots.join(format!("{index}.teardown")),
            lock: lock_path.clone(),
        };
        std::fs::write(&slot.teardown, slot.teardown_script(dir))
            .map_err(|e| Error::io(&slot.teardown, e))?;
        let holder = slots.join(index.to_string());
        std::fs::write(&holder, std::process::id().to_string()).map_err(|e| Error::io(&holder, e))?;
        slot.spawn_watchdog()
            .map_err(|e| Error::Process(format!("the real nodes' watchdog: {e}")))?;
        // The bridge of the slot, with this machine's address on it (one left by a teardown that could not
        // finish goes first).
        let bridge = slot.bridge();
        let _ = run("ip", &["link", "del", &bridge]);
        for node in 0..nodes {
            let _ = run("ip", &["netns", "del", &slot.netns(node)]);
        }
        run("ip", &["link", "add", &bridge, "type", "bridge"])?;
        run(
            "ip",
            &[
                "addr",
                "add",
                &format!("{}/24", slot.host_address()),
                "dev",
                &bridge,
            ],
        )?;
        run("ip", &["link", "set", &bridge, "up"])?;
        drop(lock);
        Ok(slot)
    }

    fn bridge(&self) -> String {
        format!("cso{}br", self.index)
    }

    fn host_address(&self) -> Ipv4Addr {
        Ipv4Addr::new(172, 18, self.index, 1)
    }

    fn node_address(&self, node: usize) -> Ipv4Addr {
        Ipv4Addr::new(172, 18, self.index, u8::try_from(node + 2).unwrap_or(u8::MAX))
    }

    fn netns(&self, node: usize) -> String {
        format!("cso-{}-{node}", self.index)
    }

    fn cgroup(&self, node: usize) -> String {
        format!("/cso-{}-{node}", self.index)
    }

    /// The namespace of node `node`: its end of a veth pair on the slot's bridge, its address, loopback, and
    /// forwarding inside it (pods to Services), a route for the Service range; no default route.
    fn make_namespace(&self, node: usize) -> Result<(), Error> {
        let netns = self.netns(node);
        let host_end = format!("cso{}n{node}", self.index);
        run("ip", &["netns", "add", &netns])?;
        run(
            "ip",
            &[
                "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", &netns,
            ],
        )?;
        run("ip", &["link", "set", &host_end, "master", &self.bridge(), "up"])?;
        let inside = |args: &[&str]| run("ip", &[&["-n", netns.as_str()][..], args].concat());
        inside(&[
            "addr",
            "add",
            &format!("{}/24", self.node_address(node)),
            "dev",
            "eth0",
        ])?;
        inside(&["link", "set", "eth0", "up"])?;
        // The resolver of processes started in the namespace with `ip netns exec` (Cluster API's managers,
        // crate::capi): the cluster's DNS, with a cluster's search path.
        let etc = Path::new("/etc/netns").join(&netns);
        std::fs::create_dir_all(&etc).map_err(|e| Error::io(&etc, e))?;
        std::fs::write(
            etc.join("resolv.conf"),
            format!("nameserver {CLUSTER_DNS}\nsearch svc.cluster.local cluster.local\noptions ndots:5\n"),
        )
        .map_err(|e| Error::io(&etc, e))?;
        inside(&["link", "set", "lo", "up"])?;
        // A route for the Service range, so that the node's own processes (the API server calling a webhook)
        // get as far as kube-proxy's DNAT; what no Service catches goes to the bridge, where this machine does
        // not forward it.
        inside(&["route", "add", crate::egress::SERVICE_CIDR, "dev", "eth0"])?;
        // Pods reach this machine's end of the bridge (a server a test runs there) with the node's address, as
        // kind's nodes masquerade what leaves the pod network: this machine has no route to the pod CIDRs, which
        // every slot reuses. Only that one address: nothing else is masqueraded.
        run(
            "nsenter",
            &[
                &format!("--net=/run/netns/{netns}"),
                "--",
                "iptables",
                "-t",
                "nat",
                "-A",
                "POSTROUTING",
                "-s",
                crate::egress::NODE_POD_CIDRS,
                "-d",
                &format!("{}/32", self.host_address()),
                "-o",
                "eth0",
                "-j",
                "MASQUERADE",
            ],
        )?;
        run(
            "nsenter",
            &[
                &format!("--net=/run/netns/{netns}"),
                "--",
                "sh",
                "-c",
                "echo 1 > /proc/sys/net/ipv4/ip_forward",
            ],
        )?;
        Ok(())
    }

    /// The shell script that removes everything of this slot (idempotent; each step may find nothing).
    fn teardown_script(&self, dir: &Path) -> String {
        let slots = Path::new(STATE_DIR).join("slots");
        let mut script = format!(
            "#!/bin/sh\n# Written by cso_testenv::node: removes real-node slot {index} ({dir}).\n",
            index = self.index,
            dir = dir.display()
        );
        // Processes: whatever is in the nodes' cgroups (containerd's shims, containers), then anything of the
        // nodes that is still around (by its files' paths on the command line).
        for node in 0..self.nodes {
            let cgroup = self.cgroup(node);
            script.push_str(&format!(
                "for procs in $(find /sys/fs/cgroup/pids{cgroup} /sys/fs/cgroup/memory{cgroup} -name cgroup.procs 2>/dev/null); do\n  \
                 for pid in $(cat \"$procs\"); do kill -KILL \"$pid\" 2>/dev/null; done\ndone\n"
            ));
        }
        script.push_str(&format!(
            "pkill -KILL -f -- '{dir}/' 2>/dev/null\nsleep 1\n",
            dir = dir.display()
        ));
        // Mounts below the cluster's directory, deepest first.
        script.push_str(&format!(
            "for m in $(awk '{{print $5}}' /proc/self/mountinfo | grep -F -- '{dir}/' | sort -r); do umount -l \"$m\" 2>/dev/null; done\n",
            dir = dir.display()
        ));
        for node in 0..self.nodes {
            script.push_str(&format!(
                "ip netns del {netns} 2>/dev/null\nrm -rf /etc/netns/{netns}\nip link del cso{}n{node} 2>/dev/null\n",
                self.index,
                netns = self.netns(node),
            ));
            let cgroup = self.cgroup(node);
            script.push_str(&format!(
                "for h in /sys/fs/cgroup/*; do [ -d \"$h{cgroup}\" ] && find \"$h{cgroup}\" -depth -type d -exec rmdir {{}} \\; 2>/dev/null; done\n"
            ));
        }
        script.push_str(&format!("ip link del {} 2>/dev/null\n", self.bridge()));
        script.push_str(&format!(
            "rm -f {slots}/{index} \"$0\"\n\
             # The kubelet's sysctls, back as they were once no other slot is held.\n\
             for held in {slots}/*; do\n  case \"$held\" in *.teardown) continue;; esac\n  \
             [ -e \"$held\" ] && kill -0 \"$(cat \"$held\")\" 2>/dev/null && exit 0\ndone\n\
             if [ -f {state}/sysctls ]; then\n  while IFS='=' read -r key value; do\n    \
             [ -n \"$key\" ] && echo \"$value\" > \"/proc/sys/$key\"\n  done < {state}/sysctls\n  rm -f {state}/sysctls\nfi\n\
             exit 0\n",
            slots = slots.display(),
            index = self.index,
            state = STATE_DIR,
        ));
        script
    }

    /// Runs the teardown once this process is gone ([`TEARDOWN_DELAY_SECS`] later), in a process group of its
    /// own so that killing the test's group leaves it running; only while the slot is still this process's,
    /// checked under the slots' lock (a slot freed by a clean stop may have been taken by another process).
    fn spawn_watchdog(&self) -> std::io::Result<()> {
        let pid = std::process::id();
        let body = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; sleep {TEARDOWN_DELAY_SECS}; \
             exec flock \"$1\" sh -c 'if [ \"$(cat \"$2\" 2>/dev/null)\" = {pid} ]; then sh \"$1\"; fi' \
             cso-nodes-teardown \"$2\" \"$3\""
        );
        let holder = Path::new(STATE_DIR).join("slots").join(self.index.to_string());
        let mut command = Command::new("sh");
        command
            .args(["-c", &body, "cso-nodes-watchdog"])
            .arg(&self.lock)
            .arg(&self.teardown)
            .arg(holder)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        command.spawn().map(drop)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let _ = Command::new("flock")
            .arg(&self.lock)
            .arg("sh")
            .arg(&self.teardown)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// What the machine still holds of real-node slot `slot` whose files were in `dir`: its namespaces (and any pod
/// namespace `cni-*` outside a node's directory), their resolver configurations, links, cgroups, mounts below `dir` and processes with `dir` on
/// their command line. Empty once a cluster has stopped.
pub fn left_on_the_machine(slot: u8, dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let dir = dir.display().to_string();
    let netns = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    for line in String::from_utf8_lossy(&netns).lines() {
        // The node's, and the pods' (containerd's `cni-<uuid>`, which belong under the node's state directory).
        if line.starts_with(&format!("cso-{slot}-")) || line.starts_with("cni-") {
            found.push(format!("namespace {line}"));
        }
    }
    // A namespace's resolver configuration (`/etc/netns/<namespace>`).
    for entry in std::fs::read_dir("/etc/netns")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&format!("cso-{slot}-")) {
            found.push(format!("resolver configuration /etc/netns/{name}"));
        }
    }
    let links = Command::new("ip")
        .args(["-o", "link"])
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    for line in String::from_utf8_lossy(&links).lines() {
        let name = line
            .split(':')
            .nth(1)
            .unwrap_or_default()
            .trim()
            .split('@')
            .next()
            .unwrap_or_default();
        if name == format!("cso{slot}br") || name.starts_with(&format!("cso{slot}n")) {
            found.push(format!("link {name}"));
        }
    }
    for entry in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
    {
        for sub in std::fs::read_dir(entry.path())
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
        {
            if sub
                .file_name()
                .to_string_lossy()
                .starts_with(&format!("cso-{slot}-"))
            {
                found.push(format!("cgroup {}", sub.path().display()));
            }
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    found.extend(
        mounts
            .lines()
            .filter(|l| l.contains(&dir))
            .map(|l| format!("mount {l}")),
    );
    for entry in std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
    {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&dir) {
            found.push(format!(
                "process {}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
        // A node's mount namespace kept alive by any process (its overlays have their layers below `dir`):
        // the machine's own mount table does not show it.
        let namespace_mounts = std::fs::read_to_string(entry.path().join("mountinfo")).unwrap_or_default();
        if let Some(line) = namespace_mounts
            .lines()
            .find(|l| l.contains("cso-node-") && l.contains(&format!("upperdir={dir}/")))
        {
            found.push(format!(
                "a node's mount namespace, held by process {}: {line}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}

fn alive(pid: &str) -> bool {
    !pid.is_empty() && Path::new("/proc").join(pid).exists()
}

/// The operator's image archive for real nodes: `CSO_IMAGE_ARCHIVE`, or what `make image-test` writes
/// (`target/image/cso-image.tar` of this repository).
pub fn operator_image_archive() -> PathBuf {
    std::env::var_os("CSO_IMAGE_ARCHIVE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/image/cso-image.tar"))
}

/// The chart values (`--set`) that run the image of `archive` as it was imported (never pulled).
pub fn chart_image_settings(archive: &Path) -> Result<Vec<String>, Error> {
    let name = archive_image_name(archive)?;
    let (repository, tag) = name
        .rsplit_once(':')
        .filter(|(_, tag)| !tag.contains('/'))
        .ok_or_else(|| Error::Process(format!("{}: the image {name} has no tag", archive.display())))?;
    Ok(vec![
        format!("image.repository={repository}"),
        format!("image.tag={tag}"),
        "image.pullPolicy=Never".to_owned(),
    ])
}

/// The name an OCI archive of `hack/oci-archive.py` carries (`org.opencontainers.image.ref.name` of its index).
pub fn archive_image_name(archive: &Path) -> Result<String, Error> {
    let file = std::fs::File::open(archive).map_err(|e| Error::io(archive, e))?;
    let mut entries = tar::Archive::new(file);
    for entry in entries.entries().map_err(|e| Error::io(archive, e))? {
        let mut entry = entry.map_err(|e| Error::io(archive, e))?;
        if entry.path().ok().is_some_and(|p| p == Path::new("index.json")) {
            let index: serde_json::Value = serde_json::from_reader(&mut entry)
                .map_err(|e| Error::Kube(format!("{}: {e}", archive.display())))?;
            return index
                .pointer("/manifests/0/annotations/org.opencontainers.image.ref.name")
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| {
                    Error::Process(format!("{}: no image name in index.json", archive.display()))
                });
        }
    }
    Err(Error::Process(format!("{}: no index.json", archive.display())))
}

/// The processes in the cgroup `dir` and every cgroup below it.
fn processes_under(dir: &Path) -> Vec<String> {
    let mut pids: Vec<String> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    for entry in std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
    {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            pids.extend(processes_under(&entry.path()));
        }
    }
    pids
}

/// The directory `name` at most `depth` levels below `root`.
fn find_dir(root: &Path, name: &str, depth: usize) -> Option<PathBuf> {
    let entries = std::fs::read_dir(root).ok()?;
    let dirs: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect();
    if let Some(found) = dirs.iter().find(|d| d.file_name().is_some_and(|n| n == name)) {
        return Some(found.clone());
    }
    if depth == 0 {
        return None;
    }
    dirs.iter().find_map(|d| find_dir(d, name, depth - 1))
}

/// The mounted cgroup v1 hierarchies (`/sys/fs/cgroup/<controller>`).
fn v1_hierarchies() -> Result<Vec<PathBuf>, Error> {
    let root = Path::new("/sys/fs/cgroup");
    Ok(std::fs::read_dir(root)
        .map_err(|e| Error::io(root, e))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|h| h.file_name().is_some_and(|n| n != "unified") && h.join("cgroup.procs").exists())
        .collect())
}

/// Creates the cgroup in every v1 hierarchy (the cpuset one with its parent's CPUs and memory nodes).
fn make_cgroup(cgroup: &str) -> Result<(), Error> {
    for hierarchy in v1_hierarchies()? {
        let path = hierarchy.join(cgroup.trim_start_matches('/'));
        std::fs::create_dir_all(&path).map_err(|e| Error::io(&path, e))?;
        if hierarchy.file_name().is_some_and(|n| n == "cpuset") {
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let value = std::fs::read_to_string(hierarchy.join(file)).unwrap_or_default();
                let _ = std::fs::write(path.join(file), value.trim());
            }
        }
    }
    Ok(())
}

/// Moves `pid` into the cgroup in every v1 hierarchy.
fn join_cgroup(cgroup: &str, pid: u32) -> Result<(), Error> {
    for hierarchy in v1_hierarchies()? {
        let procs = hierarchy
            .join(cgroup.trim_start_matches('/'))
            .join("cgroup.procs");
        std::fs::write(&procs, pid.to_string()).map_err(|e| Error::io(&procs, e))?;
    }
    Ok(())
}

fn wait_for_socket(socket: &Path, timeout: Duration) -> Result<(), Error> {
    let deadline = Instant::now() + timeout;
    while !socket.exists() {
        if Instant::now() > deadline {
            return Err(Error::Process(format!(
                "{} did not appear within {timeout:?}",
                socket.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// `ctr images import` of an OCI archive into the node's `k8s.io` namespace (the CRI plugin's).
fn import(socket: &Path, archive: &Path) -> Result<(), Error> {
    let output = Command::new("ctr")
        .arg("--address")
        .arg(socket)
        .args(["--namespace", "k8s.io", "images", "import", "--no-unpack"])
        .arg(archive)
        .output()
        .map_err(|e| Error::Process(format!("ctr: {e}")))?;
    if !output.status.success() {
        return Err(Error::Process(format!(
            "ctr images import {}: {}",
            archive.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}

fn kubeconfig_with_cert(server: &str, ca_pem: &str, cert: &Path, key: &Path) -> Result<String, Error> {
    use base64::{Engine, engine::general_purpose::STANDARD};
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| Error::io(p, e));
    Ok(format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    \
         certificate-authority-data: {ca}\nusers:\n- name: u\n  user:\n    client-certificate-data: {cert}\n    \
         client-key-data: {key}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
        ca = STANDARD.encode(ca_pem),
        cert = STANDARD.encode(read(cert)?),
        key = STANDARD.encode(read(key)?),
    ))
}

/// The pod CIDR of node `index`.
pub fn pod_cidr(index: usize) -> String {
    format!("10.244.{index}.0/24")
}

/// CNI: a bridge `cni0` in the node's namespace, the node's pod CIDR, routes only to the environment's ranges
/// (no default route, no masquerade).
fn cni_config(index: usize, ipam_dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "cso",
        "plugins": [
            {
                "type": "bridge", "bridge": "cni0", "isGateway": true, "isDefaultGateway": false,
                "ipMasq": false, "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": ipam_dir,
                    "ranges": [[{"subnet": pod_cidr(index)}]],
                    "routes": [
                        {"dst": crate::egress::NODE_POD_CIDRS},
                        {"dst": crate::egress::SERVICE_CIDR},
                        {"dst": crate::egress::NODE_ADDRESSES},
                    ],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
    .to_string()
}

fn containerd_config(dir: &Path, socket: &Path, cni_bin_dir: &Path) -> String {
    let d = dir.display();
    format!(
        "version = 2\nroot = \"{d}/containerd/root\"\nstate = \"{d}/containerd/state\"\n\
         [grpc]\n  address = \"{socket}\"\n[ttrpc]\n  address = \"{socket}.ttrpc\"\n\
         [plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"registry.k8s.io/pause:3.10.1\"\n  \
         restrict_oom_score_adj = true\n  netns_mounts_under_state_dir = true\n  \
         [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n    snapshotter = \"overlayfs\"\n    \
         default_runtime_name = \"runc\"\n    \
         [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n      runtime_type = \"io.containerd.runc.v2\"\n  \
         [plugins.\"io.containerd.grpc.v1.cri\".cni]\n    bin_dir = \"{cni}\"\n    conf_dir = \"/etc/cni/net.d\"\n  \
         [plugins.\"io.containerd.grpc.v1.cri\".registry]\n    config_path = \"{d}/certs.d\"\n",
        socket = socket.display(),
        cni = cni_bin_dir.display(),
    )
}

#[allow(clippy::too_many_arguments, reason = "one configuration file, its fields")]
fn kubelet_config(
    dir: &Path,
    socket: &Path,
    client_ca: &Path,
    serving_cert: &Path,
    serving_key: &Path,
    address: Ipv4Addr,
    cgroup: &str,
) -> String {
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         # cgroup v1 on these machines, which 1.35 refuses unless told otherwise.\n\
         failCgroupV1: false\ncgroupDriver: cgroupfs\ncgroupRoot: {cgroup}\nfailSwapOn: false\n\
         containerRuntimeEndpoint: unix://{socket}\n\
         address: {address}\nport: 10250\nreadOnlyPort: 0\nhealthzBindAddress: 127.0.0.1\nhealthzPort: 10248\n\
         tlsCertFile: {serving_cert}\ntlsPrivateKeyFile: {serving_key}\n\
         authentication:\n  anonymous: {{enabled: false}}\n  webhook: {{enabled: true}}\n  x509: {{clientCAFile: {client_ca}}}\n\
         authorization: {{mode: Webhook}}\n\
         clusterDomain: cluster.local\nclusterDNS: [{CLUSTER_DNS}]\nresolvConf: {d}/resolv.conf\n\
         podLogsDir: {d}/pod-logs\n\
         staticPodPath: \"\"\nrotateCertificates: false\nserverTLSBootstrap: false\n\
         imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n\
         evictionHard: {{memory.available: 50Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}}\n\
         nodeStatusReportFrequency: 10s\nnodeStatusUpdateFrequency: 5s\nsyncFrequency: 10s\n\
         maxPods: 60\n",
        socket = socket.display(),
        client_ca = client_ca.display(),
        serving_cert = serving_cert.display(),
        serving_key = serving_key.display(),
        d = dir.display(),
    )
}

fn kube_proxy_config(kubeconfig: &str, node: &str) -> String {
    format!(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
         clientConnection: {{kubeconfig: {kubeconfig}}}\nmode: iptables\nclusterCIDR: {pods}\n\
         hostnameOverride: {node}\nhealthzBindAddress: 127.0.0.1:10256\nmetricsBindAddress: 127.0.0.1:10249\n\
         # The machine's conntrack settings are not the node's to change.\n\
         conntrack: {{maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}\n",
        pods = crate::egress::NODE_POD_CIDRS,
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    fn slot() -> Slot {
        Slot {
            index: 7,
            nodes: 2,
            teardown: PathBuf::from("/run/x/7.teardown"),
            lock: PathBuf::from("/run/x/lock"),
        }
    }

    #[test]
    fn a_slot_names_its_bridge_namespaces_addresses_and_cgroups() {
        let slot = slot();
        assert_eq!(slot.bridge(), "cso7br");
        assert_eq!(slot.host_address(), Ipv4Addr::new(172, 18, 7, 1));
        assert_eq!(slot.node_address(1), Ipv4Addr::new(172, 18, 7, 3));
        assert_eq!(slot.netns(1), "cso-7-1");
        assert_eq!(slot.cgroup(0), "/cso-7-0");
        let guarded: ipnet::IpNet = crate::egress::NODE_ADDRESSES.parse().unwrap();
        assert!(guarded.contains(&IpAddr::V4(slot.node_address(0))));
    }

    #[test]
    fn the_teardown_removes_every_namespace_link_cgroup_and_the_bridge() {
        let script = slot().teardown_script(Path::new("/var/tmp/cso-real-x"));
        for part in [
            "ip netns del cso-7-0",
            "ip netns del cso-7-1",
            "ip link del cso7n1",
            "ip link del cso7br",
            "/sys/fs/cgroup/pids/cso-7-1",
            "pkill -KILL -f -- '/var/tmp/cso-real-x/'",
            "grep -F -- '/var/tmp/cso-real-x/'",
            "rm -f /run/cso-testenv/nodes/slots/7",
        ] {
            assert!(script.contains(part), "{part} in:\n{script}");
        }
    }

    #[test]
    fn a_directory_that_overlay_options_or_the_overlays_cannot_take_is_refused() {
        assert!(usable_dir(Path::new("/var/tmp/cso-a-1")).is_ok());
        for bad in [
            "/var/tmp/a b",
            "/var/tmp/a,b",
            "/var/tmp/a:b",
            "/run/cso",
            "/etc/cso/x",
        ] {
            assert!(usable_dir(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn pods_get_routes_to_the_environment_only() {
        let config: serde_json::Value = serde_json::from_str(&cni_config(3, Path::new("/x"))).unwrap();
        let bridge = &config["plugins"][0];
        assert_eq!(bridge["isDefaultGateway"], false);
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(bridge["ipam"]["ranges"][0][0]["subnet"], "10.244.3.0/24");
        let routes: Vec<&str> = bridge["ipam"]["routes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["dst"].as_str().unwrap())
            .collect();
        assert!(!routes.contains(&"0.0.0.0/0"), "{routes:?}");
    }
}
