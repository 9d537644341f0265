//! A workload control plane that runs workloads ([`cso_testenv::workloads`]): kube-apiserver with
//! kube-controller-manager, kube-scheduler and kwok's simulated nodes, all real processes. Deployments become
//! Available on the simulated nodes, a pod no node fits stays Pending and Unschedulable, a DaemonSet covers every
//! node and follows a deleted one, a Job completes, a CRD is Established, and nothing listens beyond loopback.
//!
//! The tests share one workload cluster ([`shared_workload_cluster`], three nodes) and a namespace each; the
//! DaemonSet test adds a node of its own, tainted so that only its DaemonSet's pods (which tolerate every
//! taint, as CNI DaemonSets do) go there, and deletes it again.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use cso_testenv::{
    NodeSpec,
    usage::Usage,
    workloads::{Component, KWOK_NODE_ANNOTATION, SHARED_NODES, shared_workload_cluster},
};
use k8s_openapi::{
    api::{
        apps::v1::{DaemonSet, Deployment},
        batch::v1::Job,
        core::v1::{Node, Pod},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;

/// Every wait's bound. The node lifecycle controller and the scheduler act within seconds; pod GC removes a
/// deleted node's pods after a quarantine of 40 s.
const TIMEOUT: Duration = Duration::from_secs(120);

async fn client_and_namespace(prefix: &str) -> (kube::Client, String) {
    let client = shared_workload_cluster()
        .control_plane
        .client()
        .await
        .expect("a client for the workload cluster");
    let ns = cso_testenv::namespace(&client, prefix)
        .await
        .expect("a test namespace");
    (client, ns)
}

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).expect("the test object has the type's shape")
}

fn deployment(name: &str, replicas: i32, node_selector: Option<serde_json::Value>) -> Deployment {
    object(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": node_selector,
                    // kwok pulls nothing: any image name does.
                    "containers": [{"name": "app", "image": "registry.invalid/cso/app:1"}],
                },
            },
        },
    }))
}

fn deployment_condition(deployment: &Deployment, type_: &str) -> Option<(String, String)> {
    deployment
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

fn pod_summary(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let scheduled = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
        .map(|c| format!("{}/{}", c.status, c.reason.as_deref().unwrap_or("")));
    format!(
        "{} phase={:?} node={:?} ip={:?} scheduled={scheduled:?}",
        pod.metadata.name.as_deref().unwrap_or("?"),
        status.and_then(|s| s.phase.as_deref()),
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        status.and_then(|s| s.pod_ip.as_deref()),
    )
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The names of the nodes kwok manages.
async fn simulated_nodes(client: &kube::Client) -> BTreeSet<String> {
    Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|n| {
            n.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(KWOK_NODE_ANNOTATION))
        })
        .filter_map(|n| n.metadata.name)
        .collect()
}

#[tokio::test]
async fn a_deployment_becomes_available_with_its_pods_running_on_the_simulated_nodes() {
    let (client, ns) = client_and_namespace("deploy").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deployments
        .create(&PostParams::default(), &deployment("web", 2, None))
        .await
        .unwrap();

    let available = cso_testenv::eventually(
        "Deployment web Available with 2 updated replicas",
        TIMEOUT,
        || {
            let deployments = deployments.clone();
            async move {
                let d = deployments.get("web").await.map_err(|e| e.to_string())?;
                let status = d.status.clone().unwrap_or_default();
                let available = deployment_condition(&d, "Available");
                if available.as_ref().map(|(s, _)| s.as_str()) == Some("True")
                    && status.updated_replicas == Some(2)
                    && status.ready_replicas == Some(2)
                    && status.available_replicas == Some(2)
                {
                    Ok(d)
                } else {
                    Err(format!("Available={available:?} status={status:?}"))
                }
            }
        },
    )
    .await;
    assert_eq!(available.status.unwrap().replicas, Some(2));

    let nodes = simulated_nodes(&client).await;
    let pods = Api::<Pod>::namespaced(client, &ns)
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items;
    let seen: Vec<String> = pods.iter().map(pod_summary).collect();
    assert_eq!(pods.len(), 2, "{seen:?}");
    for pod in &pods {
        let status = pod.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"), "{seen:?}");
        assert!(pod_ready(pod), "{seen:?}");
        let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap_or_default();
        assert!(
            nodes.contains(&node),
            "pod on {node}, not a simulated node ({nodes:?})"
        );
        assert!(
            status
                .pod_ip
                .as_deref()
                .is_some_and(|ip| ip.starts_with("10.244.")),
            "a pod IP from its node's pod CIDR: {seen:?}"
        );
        let container = &status.container_statuses.as_ref().unwrap()[0];
        assert!(container.ready, "{container:?}");
        assert!(
            container.state.as_ref().unwrap().running.is_some(),
            "{container:?}"
        );
    }
}

#[tokio::test]
async fn a_deployment_no_node_fits_stays_unavailable_with_its_pods_unschedulable() {
    let (client, ns) = client_and_namespace("unschedulable").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let selector = json!({"cso.test/pool": "nowhere"});
    deployments
        .create(&PostParams::default(), &deployment("stuck", 2, Some(selector)))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, &ns);

    cso_testenv::eventually(
        "both pods of Deployment stuck Pending and Unschedulable",
        TIMEOUT,
        || {
            let pods = pods.clone();
            async move {
                let list = pods
                    .list(&ListParams::default().labels("app=stuck"))
                    .await
                    .map_err(|e| e.to_string())?
                    .items;
                let unschedulable = list.iter().filter(|pod| {
                    let status = pod.status.as_ref();
                    let scheduled = status
                        .and_then(|s| s.conditions.as_ref())
                        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
                    status.and_then(|s| s.phase.as_deref()) == Some("Pending")
                        && scheduled.is_some_and(|c| {
                            c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
                        })
                });
                if list.len() == 2 && unschedulable.count() == 2 {
                    Ok(())
                } else {
                    Err(format!("{:?}", list.iter().map(pod_summary).collect::<Vec<_>>()))
                }
            }
        },
    )
    .await;

    // Give the controllers time to act on anything they would act on, then look again.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let d = deployments.get("stuck").await.unwrap();
    let available = deployment_condition(&d, "Available");
    assert_eq!(
        available,
        Some(("False".to_owned(), "MinimumReplicasUnavailable".to_owned())),
        "status: {:?}",
        d.status
    );
    let status = d.status.unwrap();
    assert_eq!(status.available_replicas, None, "{status:?}");
    assert_eq!(status.ready_replicas, None, "{status:?}");
    let list = pods
        .list(&ListParams::default().labels("app=stuck"))
        .await
        .unwrap()
        .items;
    for pod in &list {
        assert_eq!(pod.spec.as_ref().unwrap().node_name, None, "{}", pod_summary(pod));
        let message = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
            .and_then(|c| c.message.clone())
            .unwrap_or_default();
        assert!(
            message.contains("node affinity/selector"),
            "scheduler's message: {message}"
        );
    }
}

/// What a DaemonSet reports, and where its ready pods run.
#[derive(Clone, Debug, PartialEq, Eq)]
struct DaemonSetView {
    desired: i32,
    current: i32,
    ready: i32,
    available: i32,
    updated: i32,
    misscheduled: i32,
    /// Ready pods per node.
    ready_pods: BTreeMap<String, usize>,
    /// Pods of any phase.
    pods: usize,
}

async fn daemonset_view(
    daemonsets: &Api<DaemonSet>,
    pods: &Api<Pod>,
    name: &str,
) -> Result<DaemonSetView, String> {
    let ds = daemonsets.get(name).await.map_err(|e| e.to_string())?;
    let status = ds.status.unwrap_or_default();
    let list = pods
        .list(&ListParams::default().labels(&format!("app={name}")))
        .await
        .map_err(|e| e.to_string())?
        .items;
    let mut ready_pods: BTreeMap<String, usize> = BTreeMap::new();
    for pod in list.iter().filter(|p| pod_ready(p)) {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        *ready_pods.entry(node).or_default() += 1;
    }
    Ok(DaemonSetView {
        desired: status.desired_number_scheduled,
        current: status.current_number_scheduled,
        ready: status.number_ready,
        available: status.number_available.unwrap_or(0),
        updated: status.updated_number_scheduled.unwrap_or(0),
        misscheduled: status.number_misscheduled,
        ready_pods,
        pods: list.len(),
    })
}

async fn node_names(client: &kube::Client) -> BTreeSet<String> {
    Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect()
}

/// The DaemonSet's status counts every node, and each node runs exactly one ready pod of it.
fn covers(view: &DaemonSetView, nodes: &BTreeSet<String>) -> bool {
    let n = i32::try_from(nodes.len()).unwrap();
    [
        view.desired,
        view.current,
        view.ready,
        view.available,
        view.updated,
    ] == [n; 5]
        && view.misscheduled == 0
        && view.pods == nodes.len()
        && view.ready_pods.keys().eq(nodes.iter())
        && view.ready_pods.values().all(|count| *count == 1)
}

/// A DaemonSet that tolerates every taint (as CNI DaemonSets do) rolls out to every node; when a node is deleted,
/// its status and pods follow. As observed (Kubernetes v1.35): the DaemonSet controller does not watch node
/// deletions, so its status keeps counting the deleted node until pod GC deletes the pod still bound to it
/// (after a quarantine of 40 s, checked every 20 s) and that deletion makes it sync; the test prints the
/// timeline and asserts the end state: one pod per remaining node, counted as such, none replacing the lost one.
#[tokio::test]
async fn a_daemonset_covers_every_node_and_follows_a_deleted_one() {
    let (client, ns) = client_and_namespace("daemonset").await;
    let cluster = shared_workload_cluster();
    // A node of this test's own, which only pods that tolerate its taint (this DaemonSet's) go to.
    let extra = format!("{ns}-node");
    cluster
        .runtime
        .add_nodes(
            &client,
            &[NodeSpec::new(&extra).taint("cso.test/dedicated", Some(&ns), "NoSchedule")],
        )
        .await
        .unwrap();
    let simulated = simulated_nodes(&client).await;
    assert!(
        simulated.contains(&extra) && simulated.len() > SHARED_NODES,
        "{simulated:?}"
    );
    let nodes = node_names(&client).await;

    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
    let ds: DaemonSet = object(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "agent", "image": "registry.invalid/cso/agent:1"}],
                },
            },
        },
    }));
    daemonsets.create(&PostParams::default(), &ds).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    cso_testenv::eventually(
        &format!("DaemonSet agent ready on all {} nodes, one pod each", nodes.len()),
        TIMEOUT,
        || async {
            let view = daemonset_view(&daemonsets, &pods, "agent").await?;
            if covers(&view, &nodes) {
                Ok(())
            } else {
                Err(format!("{view:?}"))
            }
        },
    )
    .await;

    let deleted_at = Instant::now();
    Api::<Node>::all(client.clone())
        .delete(&extra, &DeleteParams::default())
        .await
        .unwrap();
    let remaining: BTreeSet<String> = nodes.iter().filter(|n| **n != extra).cloned().collect();
    let mut timeline: Vec<(Duration, DaemonSetView)> = Vec::new();
    let end = loop {
        let view = daemonset_view(&daemonsets, &pods, "agent").await.unwrap();
        if timeline.last().is_none_or(|(_, last)| *last != view) {
            timeline.push((deleted_at.elapsed(), view.clone()));
        }
        if covers(&view, &remaining) {
            break view;
        }
        assert!(
            deleted_at.elapsed() < TIMEOUT,
            "DaemonSet agent not down to the {} remaining nodes {TIMEOUT:?} after deleting {extra}; timeline: {timeline:#?}",
            remaining.len()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    eprintln!("DaemonSet agent after deleting node {extra}:");
    for (at, view) in &timeline {
        eprintln!(
            "  {:>5.1} s: desired {} current {} ready {} available {}; {} pods, ready on {:?}",
            at.as_secs_f64(),
            view.desired,
            view.current,
            view.ready,
            view.available,
            view.pods,
            view.ready_pods.keys().collect::<Vec<_>>()
        );
    }
    assert!(!end.ready_pods.contains_key(&extra), "{end:?}");

    // Nothing replaces the lost pod: a few seconds later it is still one pod per remaining node.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later = daemonset_view(&daemonsets, &pods, "agent").await.unwrap();
    assert!(covers(&later, &remaining), "{later:?}");
}

#[tokio::test]
async fn a_job_runs_to_completion() {
    let (client, ns) = client_and_namespace("job").await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let job: Job = object(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "migrate"},
        "spec": {
            "completions": 3,
            "parallelism": 2,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "migrate", "image": "registry.invalid/cso/migrate:1"}],
                },
            },
        },
    }));
    jobs.create(&PostParams::default(), &job).await.unwrap();

    let status = cso_testenv::eventually("Job migrate Complete with 3 succeeded", TIMEOUT, || {
        let jobs = jobs.clone();
        async move {
            let job = jobs.get("migrate").await.map_err(|e| e.to_string())?;
            let status = job.status.unwrap_or_default();
            let complete = status
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Complete" && c.status == "True");
            if complete && status.succeeded == Some(3) {
                Ok(status)
            } else {
                Err(format!("{status:?}"))
            }
        }
    })
    .await;
    assert_eq!(status.failed.unwrap_or(0), 0, "{status:?}");
    assert!(status.completion_time.is_some(), "{status:?}");

    let pods = Api::<Pod>::namespaced(client, &ns)
        .list(&ListParams::default().labels("job-name=migrate"))
        .await
        .unwrap()
        .items;
    let seen: Vec<String> = pods.iter().map(pod_summary).collect();
    assert_eq!(pods.len(), 3, "{seen:?}");
    for pod in &pods {
        let status = pod.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Succeeded"), "{seen:?}");
        let terminated = status.container_statuses.as_ref().unwrap()[0]
            .state
            .as_ref()
            .and_then(|s| s.terminated.clone())
            .unwrap();
        assert_eq!(terminated.exit_code, 0);
        assert_eq!(terminated.reason.as_deref(), Some("Completed"));
    }
}

#[tokio::test]
async fn a_crd_becomes_established() {
    let client = shared_workload_cluster().control_plane.client().await.unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let crd: CustomResourceDefinition = object(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.workloads.cso.example.com"},
        "spec": {
            "group": "workloads.cso.example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            }],
        },
    }));
    crds.create(&PostParams::default(), &crd).await.unwrap();
    cso_testenv::eventually("CRD widgets Established", TIMEOUT, || {
        let crds = crds.clone();
        async move {
            let crd = crds
                .get("widgets.workloads.cso.example.com")
                .await
                .map_err(|e| e.to_string())?;
            let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
            if conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
            {
                Ok(())
            } else {
                Err(format!("{conditions:?}"))
            }
        }
    })
    .await;
}

/// The inodes of the TCP sockets `pid` listens on, with their local addresses (hex, as in /proc/net/tcp*).
fn listening_addresses(pid: u32) -> Vec<String> {
    let inodes: BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(target.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let mut addresses = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address, state (0A: LISTEN), inode
            if fields.len() > 9 && fields[3] == "0A" && inodes.contains(fields[9]) {
                addresses.push(fields[1].to_owned());
            }
        }
    }
    addresses
}

#[tokio::test]
async fn the_runtime_listens_on_loopback_only_and_reports_its_memory() {
    let cluster = shared_workload_cluster();
    let runtime = &cluster.runtime;
    let mut report = Vec::new();
    for (component, pid) in runtime.pids() {
        let addresses = listening_addresses(pid);
        for address in &addresses {
            // 127.0.0.1 in /proc/net/tcp's byte order; ::1 or ::ffff:127.0.0.1 in tcp6.
            assert!(
                address.starts_with("0100007F:")
                    || address.starts_with("00000000000000000000000001000000:")
                    || address.starts_with("0000000000000000FFFF00000100007F:"),
                "{} listens on {address}, not loopback",
                component.name()
            );
        }
        let expected_listeners = usize::from(component != Component::Kwok);
        assert_eq!(
            addresses.len(),
            expected_listeners,
            "{}: {addresses:?}",
            component.name()
        );
        let usage = Usage::of(Some(pid)).unwrap();
        report.push(format!("{} {} MiB", component.name(), usage.rss_kib / 1024));
    }
    eprintln!(
        "workload runtime started in {:?}; RSS: {}",
        runtime.started_in(),
        report.join(", ")
    );

    for component in [Component::ControllerManager, Component::Scheduler] {
        let url = format!("{}/healthz", runtime.health_url(component).unwrap());
        let addr = url
            .trim_start_matches("https://")
            .split('/')
            .next()
            .unwrap()
            .to_owned();
        assert!(addr.starts_with("127.0.0.1:"), "{url}");
        assert!(
            std::net::TcpStream::connect(&addr).is_ok(),
            "{} does not answer on {addr}",
            component.name()
        );
    }
    assert!(runtime.health_url(Component::Kwok).is_none());
}

/// A workload cluster of its own: started with one node, idle for a while (its memory is reported), then
/// dropped: every process is gone afterwards, the runtime's before the API server's.
#[tokio::test]
async fn a_dropped_workload_cluster_leaves_no_process_behind() {
    let tools = cso_testenv::Tools::discover().unwrap();
    let started = Instant::now();
    let cluster = cso_testenv::ControlPlane::start_with_workloads(
        &tools,
        "workload-own",
        None,
        &[NodeSpec::new("solo").label("tier", "edge")],
    )
    .await
    .unwrap();
    let started_in = started.elapsed();
    let client = cluster.control_plane.client().await.unwrap();
    let node = Api::<Node>::all(client).get("solo").await.unwrap();
    assert_eq!(node.metadata.labels.as_ref().unwrap()["tier"], "edge");

    tokio::time::sleep(Duration::from_secs(10)).await;
    let mut rss = Vec::new();
    for (component, pid) in cluster.runtime.pids() {
        let usage = Usage::of(Some(pid)).unwrap();
        rss.push((component.name(), usage.rss_kib / 1024));
    }
    let total: u64 = rss.iter().map(|(_, mib)| mib).sum();
    eprintln!(
        "workload cluster (1 node) started in {started_in:?} (runtime: {:?}); idle RSS after 10 s: {rss:?}, {total} MiB together",
        cluster.runtime.started_in()
    );

    let pids: Vec<u32> = cluster
        .runtime
        .pids()
        .iter()
        .map(|(_, pid)| *pid)
        .chain(cluster.control_plane.pids())
        .collect();
    let stopping = Instant::now();
    drop(cluster);
    eprintln!("stopped in {:?}", stopping.elapsed());
    for pid in pids {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        // A reaped process has no /proc entry; one not yet reaped would be a zombie.
        assert!(
            status.is_empty() || status.contains("State:\tZ"),
            "process {pid} still runs: {}",
            status.lines().next().unwrap_or("")
        );
    }
}
