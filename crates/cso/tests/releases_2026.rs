//! Issue 14, "Done when", first bullet, end to end: the releases as the stacks publish them since 2026
//! (`tests/fixtures/releases-2026/`), pushed `oras push`-style to a loopback OCI registry, are installed by
//! `cso run --source=oci` on the real Cluster API management plane, and the addons of a Cluster of the
//! v1beta2 class, whose subcharts are not vendored (resolved from a loopback `--chart-mirror`), land in a real
//! workload kube-apiserver.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    collections::BTreeSet,
    path::Path,
    time::{Duration, Instant},
};

use cso_api::{ClusterAddon, ClusterStack};
use cso_testenv::{
    capi::shared_management_with_cluster_api,
    registry::{Registry, push_like_oras},
    stand_in::{StandIn, Workload},
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, ListParams, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use serde_json::{Value, json};

mod support;

use support::*;

const REPOSITORY: &str = "kaas/cluster-stacks";
const PHASE: Duration = Duration::from_secs(150);

fn releases_2026() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases-2026")
}

fn api(
    client: &Client,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
    namespace: &str,
) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    Api::namespaced_with(client.clone(), namespace, &resource)
}

fn scs_stack(namespace: &str, minor: u32) -> ClusterStack {
    serde_json::from_value(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
        "metadata": {"name": format!("scs-1-{minor}"), "namespace": namespace},
        "spec": {"provider": "docker", "name": "scs", "kubernetesVersion": format!("1.{minor}"),
                 "channel": "stable", "autoSubscribe": false, "noProvider": true, "versions": ["v1"]},
    }))
    .unwrap()
}

fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_of_2026_from_oci_install_classes_and_addons() {
    let started = Instant::now();
    let env = shared_management_with_cluster_api();
    let client = env.control_plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "scs2026").await.unwrap();
    let tools = cso_testenv::Tools::discover().unwrap();

    // The releases, pushed as build.sh pushes them.
    let registry = Registry::start(&tools).await.unwrap();
    for tag in ["docker-scs-1-35-v1", "docker-scs-1-34-v1"] {
        push_like_oras(&registry, REPOSITORY, tag, &releases_2026().join(tag))
            .await
            .unwrap_or_else(|e| panic!("push {tag}: {e}"));
    }
    let charts = cso_testenv::chart_repo::ChartRepo::start(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/charts"),
    )
    .await
    .unwrap();

    let work_dir = tempfile::Builder::new().prefix("cso-2026").tempdir().unwrap();
    let (work, _cleanup) = if std::env::var_os("CSO_KEEP_TEST_DIRS").is_some() {
        (work_dir.keep(), None)
    } else {
        (work_dir.path().to_path_buf(), Some(work_dir))
    };
    let certs = work.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    cso_testenv::pki::write_serving_certificate(&certs).unwrap();
    let instance = Instance::new(&certs, false);
    let log = work.join("operator.log");
    eprintln!("operator log: {}", log.display());
    let release_dir = work.join("releases");
    std::fs::create_dir_all(&release_dir).unwrap();
    let chart_mirror = format!("--chart-mirror={}", charts.url());
    let _operator = start_operator_with(
        env.control_plane.kubeconfig_path(),
        &release_dir,
        Some(&ns),
        &Source::Oci {
            registry: registry.host(),
            repository: REPOSITORY,
        },
        &log,
        &instance,
        &[&chart_mirror],
    );

    // The ClusterStacks → both ClusterClasses, v1beta2 beside v1beta1, reconciled by Cluster API.
    let stacks: Api<ClusterStack> = Api::namespaced(client.clone(), &ns);
    for minor in [35, 34] {
        stacks
            .create(&PostParams::default(), &scs_stack(&ns, minor))
            .await
            .unwrap_or_else(|e| panic!("the ClusterStack 1.{minor} was refused: {e}"));
    }
    let classes = api(
        &client,
        "cluster.x-k8s.io",
        "v1beta2",
        "ClusterClass",
        "clusterclasses",
        &ns,
    );
    let expected: BTreeSet<String> = ["docker-scs-1-34-v1", "docker-scs-1-35-v1"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    let deadline = Instant::now() + PHASE;
    loop {
        let reconciled: BTreeSet<String> = classes
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .iter()
            .filter(|c| {
                serde_json::to_value(c)
                    .unwrap()
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|x| x["type"] == "VariablesReady" && x["status"] == "True")
                    })
            })
            .map(|c| c.name_any())
            .collect();
        if reconciled == expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the ClusterClasses were not applied and reconciled (have {reconciled:?}); operator log:\n{}",
            log_tail(&log)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let applied_as = |class: &Value, version: &str| {
        class
            .pointer("/metadata/managedFields")
            .and_then(Value::as_array)
            .unwrap()
            .iter()
            .any(|f| f["apiVersion"] == version && f["operation"] == "Apply")
    };
    let class_35 = serde_json::to_value(classes.get("docker-scs-1-35-v1").await.unwrap()).unwrap();
    assert!(
        applied_as(&class_35, "cluster.x-k8s.io/v1beta2"),
        "1-35 applied in v1beta2: {class_35}"
    );
    let class_34 = serde_json::to_value(classes.get("docker-scs-1-34-v1").await.unwrap()).unwrap();
    assert!(
        applied_as(&class_34, "cluster.x-k8s.io/v1beta1"),
        "1-34 applied in v1beta1: {class_34}"
    );

    // A Cluster of the v1beta2 class; the stand-in plays the providers, the addons go to a real workload
    // kube-apiserver.
    let workload_plane = cso_testenv::ControlPlane::start(&tools, "scs-2026-workload", None)
        .await
        .unwrap();
    let workload = workload_plane.client().await.unwrap();
    let _stand_in = StandIn::start(
        client.clone(),
        Workload {
            kubeconfig: workload_plane.kubeconfig_yaml().to_owned(),
            server_url: workload_plane.server_url().to_owned(),
        },
    );
    let (host, port) = workload_plane
        .server_url()
        .trim_start_matches("https://")
        .rsplit_once(':')
        .unwrap();
    let port: u16 = port.parse().unwrap();
    let clusters = api(&client, "cluster.x-k8s.io", "v1beta2", "Cluster", "clusters", &ns);
    let cluster = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": {"name": "c35", "namespace": ns},
        "spec": {
            "controlPlaneEndpoint": {"host": host, "port": port},
            "clusterNetwork": {
                "services": {"cidrBlocks": ["10.128.0.0/12"]},
                "pods": {"cidrBlocks": ["192.168.0.0/16"]},
                "serviceDomain": "cluster.local"
            },
            "topology": {
                "classRef": {"name": "docker-scs-1-35-v1"},
                "version": "v1.35.1",
                "controlPlane": {"replicas": 1},
                "variables": [{"name": "imageRepository", "value": "registry.k8s.io"}]
            }
        }
    });
    clusters
        .create(&PostParams::default(), &serde_json::from_value(cluster).unwrap())
        .await
        .unwrap_or_else(|e| panic!("Cluster API refused the v1beta2 Cluster: {e}"));
    // The v1beta1 Cluster of the v1beta1 class is accepted too (dry run: one workload plane, one Cluster).
    let clusters_v1beta1 = api(&client, "cluster.x-k8s.io", "v1beta1", "Cluster", "clusters", &ns);
    let cluster_34 = json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"name": "c34", "namespace": ns},
        "spec": {
            "controlPlaneEndpoint": {"host": host, "port": port},
            "clusterNetwork": {
                "services": {"cidrBlocks": ["10.128.0.0/12"]},
                "pods": {"cidrBlocks": ["192.168.0.0/16"]},
                "serviceDomain": "cluster.local"
            },
            "topology": {
                "class": "docker-scs-1-34-v1",
                "version": "v1.34.3",
                "controlPlane": {"replicas": 1},
                "variables": [{"name": "imageRepository", "value": "registry.k8s.io"}]
            }
        }
    });
    clusters_v1beta1
        .create(
            &PostParams {
                dry_run: true,
                ..Default::default()
            },
            &serde_json::from_value(cluster_34).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("Cluster API refused the v1beta1 Cluster: {e}"));

    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    let deployments: Api<Deployment> = Api::namespaced(workload.clone(), "kube-system");
    let daemonsets: Api<DaemonSet> = Api::namespaced(workload.clone(), "kube-system");
    let deadline = Instant::now() + PHASE;
    let addon = loop {
        let addon = addons.get_opt("cluster-addon-c35").await.ok().flatten();
        let ready = addon.as_ref().is_some_and(|a| {
            a.status.as_ref().is_some_and(|s| s.ready) && a.spec.cluster_stack == "docker-scs-1-35-v1"
        });
        let landed = daemonsets.get_opt("cilium").await.ok().flatten().is_some()
            && deployments
                .get_opt("cilium-operator")
                .await
                .ok()
                .flatten()
                .is_some()
            && deployments
                .get_opt("metrics-server")
                .await
                .ok()
                .flatten()
                .is_some();
        if ready && landed {
            break addon.unwrap();
        }
        assert!(
            Instant::now() < deadline,
            "the addons did not land (ready {ready}, landed {landed}); ClusterAddon: {}\noperator log:\n{}",
            serde_json::to_string(&addon).unwrap(),
            log_tail(&log)
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let status = serde_json::to_value(addon.status.as_ref().unwrap()).unwrap();
    let listed = status["resources"].to_string();
    for name in ["cilium", "cilium-operator", "metrics-server"] {
        assert!(
            listed.contains(&format!("\"{name}\"")),
            "status.resources lists {name}: {listed}"
        );
    }
    let operator_log = std::fs::read_to_string(&log).unwrap();
    assert!(
        !operator_log.contains("\"level\":\"ERROR\""),
        "no errors in the operator's log:\n{}",
        operator_log
            .lines()
            .filter(|l| l.contains("\"level\":\"ERROR\""))
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!("took {:?}", started.elapsed());
    workload_plane.stop();
}
