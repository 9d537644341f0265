//! The workload cluster of `cso-dev demo` and `cso-dev up`: two real nodes whose pod network is the stack's own
//! kindnet where the machine can run nodes and the stack's addon images are built (`make tools`), simulated
//! nodes (kwok) otherwise; and
//! what is read from it to show that the addons run: the pods with their readiness and node, the APIService of
//! metrics-server, and the nodes' usage as `kubectl top nodes` shows it.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use cso_testenv::{
    ControlPlane, NodeSpec, Tools, WorkloadCluster,
    node::{PodNetwork, RealCluster, archive_image_name, substitute_image},
};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

/// How many nodes the workload cluster has.
pub const NODES: usize = 2;

/// Which nodes the workload cluster gets (`cso-dev demo --nodes`, `cso-dev up --workload-nodes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NodeChoice {
    /// Real nodes where the machine can run them and the addon images are built, simulated ones otherwise.
    Auto,
    /// Real nodes, or an error saying why not.
    Real,
    /// Simulated nodes (kwok): the pods are marked Running, nothing runs.
    Simulated,
}

/// The addon images of the ferrol stack, built here, and this project's stand-in for nginx.
struct AddonImages {
    kindnetd: PathBuf,
    metrics_server: PathBuf,
    web: PathBuf,
}

impl AddonImages {
    /// The images, or one line saying why real nodes cannot run the stack's addons on this machine.
    fn find(tools: &Tools) -> Result<Self, String> {
        RealCluster::support(tools)?;
        let need = cso_testenv::tools::built;
        Ok(AddonImages {
            kindnetd: need(&tools.kindnetd_image, "the kindnetd image")?,
            metrics_server: need(&tools.metrics_server_image, "the metrics-server image")?,
            web: need(&tools.web_image, "the cso.test/web image")?,
        })
    }
}

/// The running workload cluster.
pub enum LocalWorkload {
    Real(RealCluster),
    Simulated(WorkloadCluster),
}

impl LocalWorkload {
    /// Starts the workload cluster `choice` asks for, in `dir`. Returns it with a line saying which it is and,
    /// for `Auto` on a machine that cannot run real nodes, why.
    pub async fn start(tools: &Tools, dir: &Path, choice: NodeChoice) -> anyhow::Result<(Self, String)> {
        let images = match choice {
            NodeChoice::Simulated => Err("simulated nodes were asked for (--nodes simulated)".to_owned()),
            NodeChoice::Auto | NodeChoice::Real => AddonImages::find(tools),
        };
        match images {
            Ok(images) => {
                let cluster =
                    RealCluster::start_with(tools, "workload", Some(dir), NODES, PodNetwork::Addon).await?;
                for image in [&images.kindnetd, &images.metrics_server, &images.web] {
                    cluster.import_image(image)?;
                }
                // The ferrol stack's `web` Deployment asks for nginx, which cannot be built here: its pods run
                // this project's static web server under its own name.
                let client = cluster.control_plane.client().await?;
                substitute_image(
                    &client,
                    "web-for-nginx",
                    &["nginx"],
                    &archive_image_name(&images.web)?,
                )
                .await?;
                let line = format!(
                    "{NODES} real nodes (containerd, kubelet, kube-proxy); their pod network is the stack's kindnet"
                );
                Ok((LocalWorkload::Real(cluster), line))
            }
            Err(why) if choice == NodeChoice::Real => bail!("real nodes cannot run here: {why}"),
            Err(why) => {
                let nodes = NodeSpec::numbered("node", NODES);
                let cluster =
                    ControlPlane::start_with_workloads(tools, "workload", Some(dir), &nodes).await?;
                Ok((
                    LocalWorkload::Simulated(cluster),
                    format!("{NODES} simulated nodes (kwok): {why}"),
                ))
            }
        }
    }

    pub fn control_plane(&self) -> &ControlPlane {
        match self {
            LocalWorkload::Real(cluster) => &cluster.control_plane,
            LocalWorkload::Simulated(cluster) => &cluster.control_plane,
        }
    }

    /// An error naming the first of the cluster's processes that has exited.
    pub fn check_running(&mut self) -> Result<(), cso_testenv::Error> {
        match self {
            LocalWorkload::Real(cluster) => cluster.check_running(),
            LocalWorkload::Simulated(cluster) => {
                cluster.control_plane.check_running()?;
                cluster.runtime.check_running()
            }
        }
    }

    pub fn is_real(&self) -> bool {
        matches!(self, LocalWorkload::Real(_))
    }

    pub fn stop(self) {
        match self {
            LocalWorkload::Real(cluster) => cluster.stop(),
            LocalWorkload::Simulated(cluster) => cluster.stop(),
        }
    }
}

/// One pod as the demo shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodLine {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub phase: String,
    pub ready: bool,
    pub restarts: i32,
    pub node: String,
    pub image: String,
}

impl std::fmt::Display for PodLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}: {}{} on {} ({}, {} restarts)",
            self.namespace,
            self.name,
            self.phase,
            if self.ready { ", ready" } else { ", not ready" },
            self.node,
            self.image,
            self.restarts
        )
    }
}

/// The workload cluster's pods, sorted by namespace and name.
pub async fn pods(workload: &kube::Client) -> anyhow::Result<Vec<PodLine>> {
    let pods: Api<Pod> = Api::all(workload.clone());
    let mut lines: Vec<PodLine> = pods
        .list(&Default::default())
        .await
        .context("failed to list the workload cluster's pods")?
        .items
        .into_iter()
        .map(|pod| {
            let status = pod.status.unwrap_or_default();
            let containers = status.container_statuses.unwrap_or_default();
            PodLine {
                namespace: pod.metadata.namespace.unwrap_or_default(),
                name: pod.metadata.name.unwrap_or_default(),
                uid: pod.metadata.uid.unwrap_or_default(),
                phase: status.phase.unwrap_or_else(|| "Unknown".into()),
                ready: status
                    .conditions
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True"),
                restarts: containers.iter().map(|c| c.restart_count).sum(),
                node: pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_else(|| "no node".into()),
                image: pod
                    .spec
                    .map(|s| {
                        s.containers
                            .into_iter()
                            .map(|c| c.image.unwrap_or_default())
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default()
                    .join(","),
            }
        })
        .collect();
    lines.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(lines)
}

/// The nodes' usage from metrics-server through its APIService, as `kubectl top nodes` prints it (a header, then
/// `NAME CPU(cores) MEMORY(bytes)` per node). metrics-server has a node's usage once it scraped its kubelet
/// twice; waits up to `limit` for every node.
pub async fn top_nodes(workload: &kube::Client, limit: Duration) -> anyhow::Result<Vec<String>> {
    let deadline = Instant::now() + limit;
    loop {
        let answer = async {
            let request = http::Request::get("/apis/metrics.k8s.io/v1beta1/nodes").body(Vec::new())?;
            anyhow::Ok(workload.request::<serde_json::Value>(request).await?)
        }
        .await;
        let mut lines = Vec::new();
        if let Ok(list) = &answer {
            for item in list["items"].as_array().into_iter().flatten() {
                lines.push(format!(
                    "{:<20} {:<12} {}",
                    item["metadata"]["name"].as_str().unwrap_or_default(),
                    cpu_cores(item["usage"]["cpu"].as_str().unwrap_or_default()),
                    memory_bytes(item["usage"]["memory"].as_str().unwrap_or_default()),
                ));
            }
        }
        if lines.len() >= NODES {
            lines.sort();
            lines.insert(
                0,
                format!("{:<20} {:<12} {}", "NAME", "CPU(cores)", "MEMORY(bytes)"),
            );
            return Ok(lines);
        }
        if Instant::now() > deadline {
            bail!("metrics-server had no usage of every node within {limit:?}: {answer:?}");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// A CPU quantity as `kubectl top` shows it: millicores (`123m`).
fn cpu_cores(quantity: &str) -> String {
    let nanos = |digits: &str, scale: f64| digits.parse::<f64>().ok().map(|n| n * scale);
    let cores = if let Some(n) = quantity.strip_suffix('n') {
        nanos(n, 1e-9)
    } else if let Some(n) = quantity.strip_suffix('u') {
        nanos(n, 1e-6)
    } else if let Some(n) = quantity.strip_suffix('m') {
        nanos(n, 1e-3)
    } else {
        nanos(quantity, 1.0)
    };
    cores.map_or_else(|| quantity.to_owned(), |c| format!("{}m", (c * 1000.0).round()))
}

/// A memory quantity as `kubectl top` shows it: mebibytes (`123Mi`).
fn memory_bytes(quantity: &str) -> String {
    let units = [
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
    ];
    let bytes = units
        .iter()
        .find_map(|(suffix, scale)| Some(quantity.strip_suffix(suffix)?.parse::<f64>().ok()? * scale))
        .or_else(|| quantity.parse::<f64>().ok());
    bytes.map_or_else(
        || quantity.to_owned(),
        |b| format!("{}Mi", (b / 1024.0 / 1024.0).round()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_shown_as_kubectl_top_shows_it() {
        assert_eq!(cpu_cores("123456789n"), "123m");
        assert_eq!(cpu_cores("1500u"), "2m");
        assert_eq!(cpu_cores("250m"), "250m");
        assert_eq!(cpu_cores("2"), "2000m");
        assert_eq!(memory_bytes("2097152Ki"), "2048Mi");
        assert_eq!(memory_bytes("512Mi"), "512Mi");
        assert_eq!(memory_bytes("1048576"), "1Mi");
        assert_eq!(memory_bytes("garbage"), "garbage");
    }
}
