//! `cso-dev up --real-nodes`: the management cluster as a site runs it. The operator's pod (installed by the
//! chart from the image) leads and logs as on a site; a ClusterStack gets its ClusterClass, Cluster API builds a
//! Cluster of it and calls the pod's hooks through the chart's ExtensionConfig, and the Cluster's addons land in
//! the workload control plane. SIGINT stops everything, and nothing is left on the machine.
//!
//! Needs the image archive `make image-test` writes (`make test` builds it first).
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};
use kube::{
    Api,
    api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, LogParams, PostParams},
};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(180);

/// `cso-dev up --real-nodes` as a child: when the test fails, its stderr is printed and it is stopped (SIGINT,
/// then SIGKILL after 60 s), so that a failed test leaves no cluster running.
struct CsoDev {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl Drop for CsoDev {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "cso-dev's stderr:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-INT", &self.child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(60);
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(200));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn up_with_real_nodes_runs_the_operator_from_its_chart_and_cluster_api_calls_it() {
    let tools = cso_testenv::Tools::discover().unwrap();
    if let Err(why) = cso_testenv::node::RealCluster::support(&tools) {
        panic!("this machine cannot run real nodes: {why}");
    }
    let image = cso_testenv::node::operator_image_archive();
    assert!(
        image.is_file(),
        "{} is missing: run `make image-test`",
        image.display()
    );
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("up");
    let started = Instant::now();
    let log = work.path().join("cso-dev.log");
    let child = Command::new(env!("CARGO_BIN_EXE_cso-dev"))
        .args(["up", "--real-nodes"])
        .arg(format!("--dir={}", dir.display()))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut cso_dev = CsoDev { child, log };
    // Its first line, within the time it may take; a cso-dev that hangs before it fails the test.
    let stdout = cso_dev.child.stdout.take().unwrap();
    let (line_tx, line_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let _ = reader.read_line(&mut line);
        let _ = line_tx.send(line);
        // The pipe stays open for whatever else cso-dev prints: a closed stdout must not be what stops it.
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
    });
    let ready = line_rx.recv_timeout(TIMEOUT).unwrap_or_default();
    assert!(
        ready.starts_with("ready in "),
        "cso-dev up --real-nodes: {ready:?}"
    );
    let up_in = started.elapsed();
    let slot: u8 = ready
        .split("slot ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap()
        .parse()
        .unwrap();
    let dir = dir.canonicalize().unwrap();

    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let management = std::fs::read_to_string(dir.join("management.kubeconfig")).unwrap();
        let client = cso_testenv::client_from_yaml(&management).await.unwrap();
        let workload = std::fs::read_to_string(dir.join("workload.kubeconfig")).unwrap();
        let workload = cso_testenv::client_from_yaml(&workload).await.unwrap();

        // The operator's pod logs as on a site (`kubectl logs -n cso-system deploy/cso-controller-manager`).
        let pods: Api<Pod> = Api::namespaced(client.clone(), "cso-system");
        cso_testenv::eventually("the operator's pod logs that it leads", TIMEOUT, || async {
            let list = pods
                .list(&ListParams::default().labels("app.kubernetes.io/component=controller-manager"))
                .await
                .map_err(|e| e.to_string())?;
            let pod = list
                .items
                .first()
                .and_then(|p| p.metadata.name.clone())
                .ok_or("no pod")?;
            let log = pods
                .logs(&pod, &LogParams::default())
                .await
                .map_err(|e| e.to_string())?;
            if log.contains("became the leader") {
                Ok(())
            } else {
                Err(log)
            }
        })
        .await;

        // A ClusterStack and a Cluster of its class, built by Cluster API.
        let ns = cso_testenv::namespace(&client, "tenant").await.unwrap();
        let stacks: Api<cso_api::ClusterStack> = Api::namespaced(client.clone(), &ns);
        let stack: cso_api::ClusterStack = serde_json::from_value(json!({
            "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
            "metadata": {"name": "ferrol"},
            "spec": {"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27", "channel": "stable",
                     "autoSubscribe": false, "noProvider": true, "versions": ["v1"]},
        }))
        .unwrap();
        cso_testenv::eventually("the ClusterStack admitted", TIMEOUT, || async {
            stacks
                .create(&PostParams::default(), &stack)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await;
        let classes: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &ns,
            &ApiResource::from_gvk(&GroupVersionKind::gvk(
                "cluster.x-k8s.io",
                "v1beta2",
                "ClusterClass",
            )),
        );
        cso_testenv::eventually("the ClusterClass", TIMEOUT, || async {
            match classes
                .get_opt("docker-ferrol-1-27-v1")
                .await
                .map_err(|e| e.to_string())?
            {
                Some(_) => Ok(()),
                None => Err("not yet".to_owned()),
            }
        })
        .await;
        let clusters: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &ns,
            &ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster")),
        );
        let cluster = cso_testenv::capi::TopologyCluster {
            namespace: &ns,
            name: "c1",
            api_version: "cluster.x-k8s.io/v1beta2",
            class: "docker-ferrol-1-27-v1",
            class_namespace: None,
            version: "v1.27.3",
            worker_class: "workeramd64",
            worker_replicas: 0,
            image_repository: Some("registry.k8s.io"),
        }
        .to_json();
        cso_testenv::eventually("the Cluster accepted by Cluster API", TIMEOUT, || async {
            let object: DynamicObject = serde_json::from_value(cluster.clone()).map_err(|e| e.to_string())?;
            clusters
                .create(&PostParams::default(), &object)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .await;
        let deployments: Api<Deployment> = Api::namespaced(workload, "kube-system");
        let addons: Api<cso_api::ClusterAddon> = Api::namespaced(client.clone(), &ns);
        cso_testenv::eventually(
            "the Cluster's addons in the workload cluster",
            TIMEOUT,
            || async {
                let ready = addons
                    .get_opt("cluster-addon-c1")
                    .await
                    .map_err(|e| e.to_string())?
                    .and_then(|a| a.status)
                    .is_some_and(|s| s.ready);
                let applied = deployments
                    .get_opt("metrics-server")
                    .await
                    .map_err(|e| e.to_string())?
                    .is_some();
                if ready && applied {
                    Ok(())
                } else {
                    Err(format!("ready={ready} applied={applied}"))
                }
            },
        )
        .await;
        // Cluster API answered by the pod: the hook's answer is in the operator's log.
        let list = pods
            .list(&ListParams::default().labels("app.kubernetes.io/component=controller-manager"))
            .await
            .unwrap();
        let pod = list.items[0].metadata.name.clone().unwrap();
        cso_testenv::eventually(
            "AfterControlPlaneInitialized in the pod's log",
            TIMEOUT,
            || async {
                let log = pods
                    .logs(&pod, &LogParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                if log.contains("AfterControlPlaneInitialized") {
                    Ok(())
                } else {
                    Err("not yet".to_owned())
                }
            },
        )
        .await;
    });

    // SIGINT: everything stops and is removed: the node's slot, and every process of the directory (the workload
    // control plane and its simulated nodes, Cluster API's managers) too.
    let stopping = Instant::now();
    Command::new("kill")
        .args(["-INT", &cso_dev.child.id().to_string()])
        .status()
        .unwrap();
    let status = cso_dev.child.wait().unwrap();
    assert!(status.success(), "cso-dev up --real-nodes after SIGINT: {status}");
    let stopped_in = stopping.elapsed();
    let mut left = cso_testenv::node::left_on_the_machine(slot, &dir.join("management"));
    let processes = Command::new("pgrep")
        .args(["-af", &dir.display().to_string()])
        .output()
        .unwrap();
    left.extend(
        String::from_utf8_lossy(&processes.stdout)
            .lines()
            .map(|p| format!("process {p}")),
    );
    assert!(left.is_empty(), "left on the machine: {left:#?}");
    eprintln!(
        "cso-dev up --real-nodes: ready {up_in:.1?} after its start; stopped {stopped_in:.1?} after SIGINT"
    );
}
