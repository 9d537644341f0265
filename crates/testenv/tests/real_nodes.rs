//! A real node ([`cso_testenv::node`]): containerd + runc + kubelet + kube-proxy in a network namespace of their
//! own, joined to a control plane in that namespace. The node goes `Ready`; a pod of an image built here (Debian's
//! static busybox, `cso.test/busybox`) runs and its logs are served by the kubelet through the API server; a
//! second pod reaches the first by its Service's name (cluster DNS) and ClusterIP (kube-proxy), and a name outside
//! the cluster does not resolve; and once the cluster stops, nothing
//! of it is left on the machine: no process, mount, namespace, link, cgroup or changed sysctl.
//!
//! Where the machine cannot run a node, the test fails with the one line that says why (it is never skipped).
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    path::Path,
    time::{Duration, Instant},
};

use cso_testenv::{Tools, node::RealCluster};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::{
    Api,
    api::{ListParams, LogParams, PostParams},
};
use serde_json::json;

const IMAGE: &str = "cso.test/busybox:debian-12";
const TIMEOUT: Duration = Duration::from_secs(90);

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).unwrap()
}

fn pod(name: &str, labels: serde_json::Value, script: &str) -> Pod {
    object(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                            "command": ["/bin/sh", "-c", script]}],
        },
    }))
}

fn sysctls() -> Vec<String> {
    ["kernel/panic", "kernel/panic_on_oops", "vm/overcommit_memory"]
        .iter()
        .map(|key| {
            std::fs::read_to_string(Path::new("/proc/sys").join(key))
                .unwrap()
                .trim()
                .to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_node_runs_pods_serves_their_logs_routes_services_and_leaves_nothing_behind() {
    let tools = Tools::discover().unwrap();
    if let Err(why) = RealCluster::support(&tools) {
        panic!("this machine cannot run real nodes: {why}");
    }
    let sysctls_before = sysctls();
    let started = Instant::now();
    let cluster = RealCluster::start(&tools, "real", None, 1).await.unwrap();
    let node_ready = started.elapsed();
    let (slot, dir) = (cluster.slot(), cluster.dir().to_path_buf());
    cluster
        .import_image(
            tools
                .busybox_image
                .as_ref()
                .expect("the busybox test image: run `make tools`"),
        )
        .unwrap();
    let client = cluster.control_plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "real").await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // The ServiceAccount admission needs the namespace's `default` ServiceAccount (kube-controller-manager).
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), &ns);
    cso_testenv::eventually("the default ServiceAccount", TIMEOUT, || async {
        accounts
            .get_opt("default")
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "not yet".to_owned())
    })
    .await;

    // A server: writes a line to its log, then serves a page on 8080.
    let created = Instant::now();
    pods.create(
        &PostParams::default(),
        &pod(
            "server",
            json!({"app": "server"}),
            "echo 'hello from a real pod'; echo served-by-a-real-node > /www/index.html; exec httpd -f -p 8080 -h /www",
        ),
    )
    .await
    .unwrap();
    let running = cso_testenv::eventually("the server pod Running with an IP", TIMEOUT, || async {
        let pod = pods.get("server").await.map_err(|e| e.to_string())?;
        let status = pod.status.clone().unwrap_or_default();
        match (status.phase.as_deref(), status.pod_ip.as_deref()) {
            (Some("Running"), Some(ip)) => Ok(ip.to_owned()),
            _ => Err(format!("{:?}", status)),
        }
    })
    .await;
    let pod_running = created.elapsed();
    assert!(
        running.starts_with("10.244.0."),
        "the pod's IP is in its node's pod CIDR: {running}"
    );

    // Its log, served by the kubelet through the API server.
    let log = cso_testenv::eventually("the server's log", TIMEOUT, || async {
        let log = pods
            .logs("server", &LogParams::default())
            .await
            .map_err(|e| e.to_string())?;
        log.contains("hello from a real pod")
            .then_some(log.clone())
            .ok_or(log)
    })
    .await;
    assert!(log.contains("hello from a real pod"), "{log}");

    // A Service in front of it, and a client that fetches the page through the ClusterIP (kube-proxy).
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let service = services
        .create(
            &PostParams::default(),
            &object(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "server"},
                           "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": 8080}]}})),
        )
        .await
        .unwrap();
    let cluster_ip = service.spec.unwrap().cluster_ip.unwrap();
    pods.create(
        &PostParams::default(),
        &pod(
            "client",
            json!({"app": "client"}),
            // By the Service's name (cluster DNS, the pod's search path), then a name outside the cluster,
            // which must not resolve: nothing is forwarded off the machine.
            // The same lookup tool answers for a cluster name first, so a refusal is the server's.
            &format!(
                "for i in $(seq 1 60); do if wget -q -O - http://server/; then \
                   nslookup server.{ns}.svc.cluster.local >/dev/null 2>&1 || {{ echo nslookup failed; exit 3; }}; \
                   out=$(nslookup example.org 2>&1); \
                   case \"$out\" in *REFUSED*|*NXDOMAIN*) exit 0;; *) echo \"example.org: $out\"; exit 2;; esac; \
                 fi; sleep 1; done; exit 1"
            ),
        ),
    )
    .await
    .unwrap();
    let fetched = cso_testenv::eventually(
        "the client's fetch through the Service's name and ClusterIP",
        TIMEOUT,
        || async {
            let pod = pods.get("client").await.map_err(|e| e.to_string())?;
            let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
            if phase == "Succeeded" || phase == "Failed" {
                let log = pods
                    .logs("client", &LogParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                return Ok((phase, log));
            }
            Err(phase)
        },
    )
    .await;
    // Earlier tries may fail until kube-proxy has the Service's endpoint; the last one got the page.
    assert!(
        fetched.0 == "Succeeded" && fetched.1.ends_with("served-by-a-real-node\n"),
        "the page came through server ({cluster_ip}): {fetched:?}"
    );
    let listed = pods.list(&ListParams::default()).await.unwrap();
    assert!(
        listed
            .items
            .iter()
            .all(|p| p.spec.as_ref().unwrap().node_name.as_deref() == Some("real-node-0"))
    );
    eprintln!(
        "real node: Ready {node_ready:.1?} after the start; a pod Running {pod_running:.1?} after its creation"
    );

    // Everything goes when the cluster stops.
    assert!(
        !cso_testenv::node::left_on_the_machine(slot, &dir).is_empty(),
        "the check sees a running node"
    );
    cluster.stop();
    let left = cso_testenv::node::left_on_the_machine(slot, &dir);
    assert!(left.is_empty(), "left on the machine: {left:#?}");
    assert_eq!(sysctls(), sysctls_before, "the kubelet's sysctls are put back");
}
