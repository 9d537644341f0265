//! Issue 14, "Done when", end to end: the releases as the stacks publish them since 2026
//! (`tests/fixtures/releases-2026/`), pushed `oras push`-style to a loopback OCI registry, are installed by
//! `cso run --source=oci` on the real Cluster API management plane, and a Cluster of each lands its addons
//! in a real workload kube-apiserver of its own; their subcharts are not vendored (resolved from a loopback
//! `--chart-mirror`).
//!
//! One test, because each Cluster API phase costs a minute: three ClusterStacks (docker scs 1.35 with a
//! `v1beta2` ClusterClass, docker scs 1.34 with a `v1beta1` one, openstack scs 1.35 with CAPO's templates),
//! three Clusters (a `v1beta2` Cluster of each 1.35 class, a `v1beta1` Cluster of the 1.34 class) created from
//! a topology, so Cluster API builds them; [`StandIn`] plays the kubeadm control-plane provider and each
//! Cluster's infrastructure provider (DockerCluster, OpenStackCluster) with one workload kube-apiserver per
//! Cluster. Checked: Cilium and metrics-server in all three, and for OpenStack the cloud controller manager
//! and Cinder CSI with the values they take from the Cluster (its name, its endpoint) and the `clouds-yaml`
//! Secret they mount (a site's OpenStack helper puts it into the workload cluster; the test does).
//!
//! Then stability ("Done when", second bullet): once everything has settled, the operator is restarted twice
//! with `--resync-interval=2s`, every release and every ClusterAddon is reconciled at least ten times (counted
//! on the operator's metrics endpoint, not one object written to either cluster), and no object of any workload
//! cluster (every listable kind but Events and Leases, Cilium's `cilium-ca` and `hubble-server-certs`
//! included) and none of the management cluster's ClusterStacks, ClusterStackReleases, ClusterAddons,
//! ClusterClasses and their templates has changed its resourceVersion.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use cso_api::{ClusterAddon, ClusterStack};
use cso_testenv::{
    ControlPlane,
    capi::{TopologyCluster, shared_management_with_cluster_api},
    registry::{Registry, push_like_oras},
    stand_in::{StandIn, Workload},
};
use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment},
    core::v1::Secret,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, ListParams, PostParams},
    core::{ApiResource, GroupVersionKind},
};
use serde_json::{Value, json};

mod support;

use support::*;

const REPOSITORY: &str = "kaas/cluster-stacks";
const PHASE: Duration = Duration::from_secs(180);
/// How long everything gets to settle before the stability baseline is taken.
const SETTLE: Duration = Duration::from_secs(120);
/// The resync interval of the stability phase: every ClusterStackRelease and ClusterAddon is reconciled
/// (and re-applies what it owns) this often.
const RESYNC: &str = "--resync-interval=2s";
/// Reconciles of every release and every ClusterAddon the stability phase waits for, in all.
const RECONCILES: f64 = 10.0;

/// One release of the test, its ClusterStack and the Cluster made of it.
struct Case {
    tag: &'static str,
    provider: &'static str,
    minor: u32,
    cluster: &'static str,
    api_version: &'static str,
    version: &'static str,
    image_repository: Option<&'static str>,
    /// The stages' workloads the Cluster must get: (kind, name).
    addons: &'static [(&'static str, &'static str)],
}

const DOCKER_ADDONS: &[(&str, &str)] = &[
    ("DaemonSet", "cilium"),
    ("Deployment", "cilium-operator"),
    ("Deployment", "metrics-server"),
];

const CASES: [Case; 3] = [
    Case {
        tag: "docker-scs-1-35-v1",
        provider: "docker",
        minor: 35,
        cluster: "c35",
        api_version: "cluster.x-k8s.io/v1beta2",
        version: "v1.35.1",
        image_repository: Some("registry.k8s.io"),
        addons: DOCKER_ADDONS,
    },
    Case {
        tag: "docker-scs-1-34-v1",
        provider: "docker",
        minor: 34,
        cluster: "c34",
        api_version: "cluster.x-k8s.io/v1beta1",
        version: "v1.34.3",
        // The 1-34 class's KubeadmControlPlane is refused without it (tests/fixtures/releases-2026/README.md).
        image_repository: Some("registry.k8s.io"),
        addons: DOCKER_ADDONS,
    },
    Case {
        tag: "openstack-scs-1-35-v1",
        provider: "openstack",
        minor: 35,
        cluster: "o35",
        api_version: "cluster.x-k8s.io/v1beta2",
        version: "v1.35.3",
        image_repository: None,
        addons: &[
            ("DaemonSet", "cilium"),
            ("Deployment", "cilium-operator"),
            ("Deployment", "metrics-server"),
            ("DaemonSet", "openstack-cloud-controller-manager"),
            ("Deployment", "openstack-cinder-csi-controllerplugin"),
            ("DaemonSet", "openstack-cinder-csi-nodeplugin"),
        ],
    },
];

fn releases_2026() -> PathBuf {
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

fn stack(namespace: &str, case: &Case) -> ClusterStack {
    serde_json::from_value(json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
        "metadata": {"name": format!("{}-scs-1-{}", case.provider, case.minor), "namespace": namespace},
        "spec": {"provider": case.provider, "name": "scs", "kubernetesVersion": format!("1.{}", case.minor),
                 "channel": "stable", "autoSubscribe": false, "noProvider": true, "versions": ["v1"]},
    }))
    .unwrap()
}

/// The last lines of the operator's log that are its own (not the HTTP and TLS libraries' chatter).
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            !["\"logger\":\"hyper", "\"logger\":\"tower", "\"logger\":\"log\""]
                .iter()
                .any(|noise| l.contains(noise))
        })
        .collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The operator's own metrics (reconciles, requests, applies), for failure messages.
async fn operator_metrics(port: u16) -> String {
    let text = match reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(e) => return format!("(not available: {e})"),
    };
    text.lines()
        .filter(|l| {
            !l.starts_with('#')
                && (l.starts_with("controller_runtime_reconcile_total") || l.starts_with("cso_"))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The values of the environment variable `name` in the containers of a pod template.
fn env_values(workload: &Value, name: &str) -> Vec<String> {
    workload
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|c| c["env"].as_array().cloned().unwrap_or_default())
        .filter(|e| e["name"] == name)
        .filter_map(|e| e["value"].as_str().map(str::to_owned))
        .collect()
}

/// The Secrets a pod template mounts.
fn secret_volumes(workload: &Value) -> BTreeSet<String> {
    workload
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.pointer("/secret/secretName").and_then(Value::as_str))
        .map(str::to_owned)
        .collect()
}

/// `Kind group/version namespace/name` → resourceVersion.
type Versions = BTreeMap<String, String>;

/// Every object of every kind the server of `client` lists whose kind `keep` accepts (in `namespace`
/// when given), with its resourceVersion. Groups served by an aggregated API's backend (metrics-server's
/// `metrics.k8s.io`, whose pods do not run here) are skipped.
async fn versions(client: &Client, namespace: Option<&str>, keep: impl Fn(&ApiResource) -> bool) -> Versions {
    let mut resources: Vec<ApiResource> = Vec::new();
    // Groups an APIService hands to a backend of the cluster (metrics-server's `metrics.k8s.io`): no pod
    // runs here, and the API server waits for the backend before it fails the request.
    let api_services = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService"),
        "apiservices",
    );
    let aggregated: BTreeSet<String> = Api::<DynamicObject>::all_with(client.clone(), &api_services)
        .list(&ListParams::default())
        .await
        .unwrap()
        .into_iter()
        .filter(|s| !s.data.pointer("/spec/service").is_none_or(Value::is_null))
        .filter_map(|s| {
            s.data
                .pointer("/spec/group")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect();
    let core = client.list_core_api_resources("v1").await.unwrap();
    let mut lists = vec![("".to_owned(), "v1".to_owned(), core)];
    for group in client.list_api_groups().await.unwrap().groups {
        if aggregated.contains(&group.name) {
            continue;
        }
        let Some(preferred) = group
            .preferred_version
            .or_else(|| group.versions.first().cloned())
        else {
            continue;
        };
        if let Ok(list) = client.list_api_group_resources(&preferred.group_version).await {
            lists.push((group.name, preferred.version, list));
        }
    }
    for (group, version, list) in lists {
        for resource in list.resources {
            if resource.name.contains('/') || !resource.verbs.iter().any(|v| v == "list") {
                continue;
            }
            if namespace.is_some() && !resource.namespaced {
                continue;
            }
            let api_resource = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(&group, &version, &resource.kind),
                &resource.name,
            );
            if keep(&api_resource) {
                resources.push(api_resource);
            }
        }
    }
    let mut versions = Versions::new();
    for resource in resources {
        let api: Api<DynamicObject> = match namespace {
            Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let params = ListParams::default();
        let listing = tokio::time::timeout(Duration::from_secs(30), api.list(&params));
        let Ok(list) = listing.await.unwrap_or_else(|_| {
            panic!(
                "listing {} {} took over 30 s",
                resource.kind, resource.api_version
            )
        }) else {
            continue;
        };
        for object in list {
            versions.insert(
                format!(
                    "{} {} {}/{}",
                    resource.kind,
                    resource.api_version,
                    object.namespace().unwrap_or_default(),
                    object.name_any()
                ),
                object.resource_version().unwrap_or_default(),
            );
        }
    }
    versions
}

/// A workload cluster's objects: all of them but Events and the kube-apiserver's own Leases (its identity
/// heartbeat), which change with time whoever applies what.
async fn workload_versions(client: &Client) -> Versions {
    versions(client, None, |r| !matches!(r.kind.as_str(), "Event" | "Lease")).await
}

/// The management cluster's objects of ours and of the releases: ClusterStacks, ClusterStackReleases and
/// ClusterAddons, the ClusterClasses and their templates (named after the release; not the templates
/// Cluster API clones from them for each Cluster).
async fn management_versions(client: &Client, namespace: &str) -> Versions {
    let mut versions = versions(client, Some(namespace), |r| {
        r.group == "clusterstack.x-k8s.io"
            || r.kind == "ClusterClass"
            || (r.kind.ends_with("Template") && r.group.ends_with("cluster.x-k8s.io"))
    })
    .await;
    versions.retain(|key, _| {
        let name = key.rsplit_once('/').map_or("", |(_, name)| name);
        !key.split(' ').next().unwrap_or_default().ends_with("Template")
            || CASES.iter().any(|case| name.starts_with(case.tag))
    });
    versions
}

/// What changed from `before` to `after`: `key: before → after` (`-` when absent).
fn changes(before: &Versions, after: &Versions) -> Vec<String> {
    let keys: BTreeSet<&String> = before.keys().chain(after.keys()).collect();
    keys.into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| {
            format!(
                "{k}: {} → {}",
                before.get(k).map_or("-", String::as_str),
                after.get(k).map_or("-", String::as_str)
            )
        })
        .collect()
}

/// Everything the stability check watches: the management namespace's objects and each workload cluster's,
/// the `v1beta1` ClusterClass included (Cluster API 1.14's conversion of it does not round-trip, so only the
/// management engine's reading before writing keeps it unwritten).
async fn snapshot(management: &Client, namespace: &str, workloads: &[(&str, Client)]) -> Versions {
    let mut all: Versions = management_versions(management, namespace)
        .await
        .into_iter()
        .map(|(k, v)| (format!("management {k}"), v))
        .collect();
    for (cluster, client) in workloads {
        all.extend(
            workload_versions(client)
                .await
                .into_iter()
                .map(|(k, v)| (format!("workload {cluster}: {k}"), v)),
        );
    }
    all
}

/// Reconciles (of `controller`) and applies (to `target`) counted by one operator process; none before
/// it serves its metrics (just after a start).
async fn counts(port: u16) -> BTreeMap<&'static str, f64> {
    let text = match reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    let mut counts = BTreeMap::new();
    for controller in ["clusterstackrelease", "clusteraddon"] {
        counts.insert(
            controller,
            metric_sum(
                &text,
                "controller_runtime_reconcile_total",
                &[&format!("controller=\"{controller}\"")],
            ),
        );
    }
    for target in ["management", "workload"] {
        counts.insert(
            target,
            metric_sum(
                &text,
                "cso_objects_applied_total",
                &[&format!("target=\"{target}\"")],
            ),
        );
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_of_2026_from_oci_install_classes_and_addons_that_stay_put() {
    let started = Instant::now();
    let env = shared_management_with_cluster_api();
    let client = env.control_plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "scs2026").await.unwrap();
    let tools = cso_testenv::Tools::discover().unwrap();

    // The releases, pushed as build.sh pushes them.
    let registry = Registry::start(&tools).await.unwrap();
    for case in &CASES {
        push_like_oras(&registry, REPOSITORY, case.tag, &releases_2026().join(case.tag))
            .await
            .unwrap_or_else(|e| panic!("push {}: {e}", case.tag));
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
    let log = work.join("operator.log");
    eprintln!("operator log: {}", log.display());
    let release_dir = work.join("releases");
    std::fs::create_dir_all(&release_dir).unwrap();
    let chart_mirror = format!("--chart-mirror={}", charts.url());
    let source = Source::Oci {
        registry: registry.host(),
        repository: REPOSITORY,
    };
    let start = |instance: &Instance<'_>, extra: &[&str]| {
        let mut flags = vec![chart_mirror.as_str()];
        flags.extend_from_slice(extra);
        start_operator_with(
            env.control_plane.kubeconfig_path(),
            &release_dir,
            Some(&ns),
            &source,
            &log,
            instance,
            &flags,
        )
    };
    let instance = Instance::new(&certs, false);
    let mut operator = start(&instance, &[]);

    // The ClusterStacks → the three ClusterClasses, v1beta2 beside v1beta1, reconciled by Cluster API.
    let stacks: Api<ClusterStack> = Api::namespaced(client.clone(), &ns);
    for case in &CASES {
        stacks
            .create(&PostParams::default(), &stack(&ns, case))
            .await
            .unwrap_or_else(|e| panic!("the ClusterStack of {} was refused: {e}", case.tag));
    }
    let classes = api(
        &client,
        "cluster.x-k8s.io",
        "v1beta2",
        "ClusterClass",
        "clusterclasses",
        &ns,
    );
    let expected: BTreeSet<String> = CASES.iter().map(|c| c.tag.to_owned()).collect();
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
            "the ClusterClasses were not applied and reconciled (have {reconciled:?}); operator log:\n{}\n\
             operator metrics:\n{}",
            log_tail(&log),
            operator_metrics(instance.metrics_port).await
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
    for (tag, version) in [
        ("docker-scs-1-35-v1", "cluster.x-k8s.io/v1beta2"),
        ("docker-scs-1-34-v1", "cluster.x-k8s.io/v1beta1"),
        ("openstack-scs-1-35-v1", "cluster.x-k8s.io/v1beta2"),
    ] {
        let class = serde_json::to_value(classes.get(tag).await.unwrap()).unwrap();
        assert!(applied_as(&class, version), "{tag} applied in {version}: {class}");
    }

    // A Cluster of each class, each with a workload kube-apiserver of its own; the stand-in plays the
    // control-plane and infrastructure providers (DockerCluster, OpenStackCluster).
    let mut planes: Vec<ControlPlane> = Vec::new();
    for case in &CASES {
        planes.push(
            ControlPlane::start(&tools, &format!("scs-2026-{}", case.cluster), None)
                .await
                .unwrap(),
        );
    }
    let workload_of = |plane: &ControlPlane| Workload {
        kubeconfig: plane.kubeconfig_yaml().to_owned(),
        server_url: plane.server_url().to_owned(),
    };
    let stand_in = StandIn::start(client.clone(), workload_of(&planes[0]));
    let mut workloads: Vec<(&str, Client)> = Vec::new();
    for (case, plane) in CASES.iter().zip(&planes) {
        stand_in.assign(&ns, case.cluster, workload_of(plane));
        workloads.push((case.cluster, plane.client().await.unwrap()));
    }
    // The OpenStack CCM and Cinder CSI read the cloud's credentials from the Secret `clouds-yaml` in
    // kube-system (their values mount it), which a site's OpenStack helper puts into the workload cluster.
    let clouds_yaml: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "clouds-yaml", "namespace": "kube-system"},
        "stringData": {"clouds.yaml": "clouds:\n  openstack:\n    auth:\n      auth_url: https://keystone.example:5000/v3\n      application_credential_id: id\n      application_credential_secret: secret\n    region_name: RegionOne\n    interface: public\n    identity_api_version: 3\n    auth_type: v3applicationcredential\n"},
    }))
    .unwrap();
    Api::<Secret>::namespaced(workloads[2].1.clone(), "kube-system")
        .create(&PostParams::default(), &clouds_yaml)
        .await
        .unwrap();
    for case in &CASES {
        let cluster = TopologyCluster {
            namespace: &ns,
            name: case.cluster,
            api_version: case.api_version,
            class: case.tag,
            class_namespace: None,
            version: case.version,
            worker_class: "default-worker",
            worker_replicas: 0,
            image_repository: case.image_repository,
        }
        .to_json();
        let version = case.api_version.rsplit_once('/').unwrap().1;
        api(&client, "cluster.x-k8s.io", version, "Cluster", "clusters", &ns)
            .create(&PostParams::default(), &serde_json::from_value(cluster).unwrap())
            .await
            .unwrap_or_else(|e| panic!("Cluster API refused the {version} Cluster {}: {e}", case.cluster));
    }

    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + PHASE;
    for (case, (_, workload)) in CASES.iter().zip(&workloads) {
        let deployments: Api<Deployment> = Api::namespaced(workload.clone(), "kube-system");
        let daemonsets: Api<DaemonSet> = Api::namespaced(workload.clone(), "kube-system");
        let addon = loop {
            let addon = addons
                .get_opt(&format!("cluster-addon-{}", case.cluster))
                .await
                .ok()
                .flatten();
            let ready = addon.as_ref().is_some_and(|a| {
                a.status.as_ref().is_some_and(|s| s.ready) && a.spec.cluster_stack == case.tag
            });
            let mut missing = Vec::new();
            for (kind, name) in case.addons {
                let there = match *kind {
                    "DaemonSet" => daemonsets.get_opt(name).await.ok().flatten().is_some(),
                    _ => deployments.get_opt(name).await.ok().flatten().is_some(),
                };
                if !there {
                    missing.push(format!("{kind} {name}"));
                }
            }
            if ready && missing.is_empty() {
                break addon.unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "the addons of {} did not land (ready {ready}, missing {missing:?}); ClusterAddon: {}\n\
                 stand-in: {:?} (last error: {:?})\noperator log:\n{}",
                case.cluster,
                serde_json::to_string(&addon).unwrap(),
                stand_in.log(),
                stand_in.last_error(),
                log_tail(&log)
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        let status = serde_json::to_value(addon.status.as_ref().unwrap()).unwrap();
        let listed = status["resources"].to_string();
        for (_, name) in case.addons {
            assert!(
                listed.contains(&format!("\"{name}\"")),
                "status.resources of {} lists {name}: {listed}",
                case.cluster
            );
        }
    }

    // The OpenStack stages got the values they take from the Cluster.
    let (_, openstack) = &workloads[2];
    let plane = &planes[2];
    let port = plane.server_url().rsplit_once(':').unwrap().1.to_owned();
    let get = |kind: &'static str, name: &'static str| {
        let workload = openstack.clone();
        async move {
            let value = match kind {
                "DaemonSet" => serde_json::to_value(
                    Api::<DaemonSet>::namespaced(workload, "kube-system")
                        .get(name)
                        .await
                        .unwrap(),
                ),
                _ => serde_json::to_value(
                    Api::<Deployment>::namespaced(workload, "kube-system")
                        .get(name)
                        .await
                        .unwrap(),
                ),
            };
            value.unwrap()
        }
    };
    let ccm = get("DaemonSet", "openstack-cloud-controller-manager").await;
    assert_eq!(
        env_values(&ccm, "CLUSTER_NAME"),
        ["o35"],
        "the CCM's cluster name"
    );
    assert!(
        secret_volumes(&ccm).contains("clouds-yaml"),
        "the CCM mounts clouds-yaml: {:?}",
        secret_volumes(&ccm)
    );
    let csi = get("Deployment", "openstack-cinder-csi-controllerplugin").await;
    assert_eq!(
        env_values(&csi, "CLUSTER_NAME"),
        ["o35"],
        "Cinder CSI's cluster ID"
    );
    let mounted = secret_volumes(&csi);
    assert!(
        mounted.contains("clouds-yaml") && mounted.contains("csi-cloud-config"),
        "Cinder CSI mounts clouds-yaml and its cloud.conf: {mounted:?}"
    );
    let cilium = get("DaemonSet", "cilium").await;
    assert_eq!(
        env_values(&cilium, "KUBERNETES_SERVICE_PORT").first(),
        Some(&port),
        "Cilium talks to the Cluster's endpoint"
    );
    let secrets: Api<Secret> = Api::namespaced(openstack.clone(), "kube-system");
    let ccm_config = secrets.get("ccm-cloud-config").await.unwrap();
    let cloud_conf = String::from_utf8(ccm_config.data.unwrap()["cloud.conf"].0.clone()).unwrap();
    assert!(
        cloud_conf.contains("use-clouds"),
        "the CCM's cloud.conf: {cloud_conf}"
    );
    let csi_config = secrets.get("csi-cloud-config").await.unwrap();
    let cloud_conf = String::from_utf8(csi_config.data.unwrap()["cloud.conf"].0.clone()).unwrap();
    assert!(
        cloud_conf.contains("clouds-file = /etc/openstack/clouds.yaml"),
        "Cinder CSI's cloud.conf: {cloud_conf}"
    );
    eprintln!("installed in {:?}", started.elapsed());

    // Stability: wait until nothing moves, then restart twice with a short resync; nothing may move again.
    let settled_at = Instant::now();
    let mut baseline = snapshot(&client, &ns, &workloads).await;
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let now = snapshot(&client, &ns, &workloads).await;
        let moved = changes(&baseline, &now);
        if !moved.is_empty() {
            assert!(
                settled_at.elapsed() < SETTLE,
                "the clusters never settled; still changing:\n{}",
                moved.join("\n")
            );
            baseline = now;
            quiet_since = Instant::now();
        }
    }
    for secret in ["cilium-ca", "hubble-server-certs"] {
        for (cluster, _) in &workloads {
            assert!(
                baseline.contains_key(&format!("workload {cluster}: Secret v1 kube-system/{secret}")),
                "{cluster} has the Secret {secret}"
            );
        }
    }
    eprintln!(
        "settled in {:?}; watching {} objects",
        settled_at.elapsed(),
        baseline.len()
    );
    let mut totals: BTreeMap<&str, f64> = BTreeMap::new();
    for restart in 1..=2 {
        terminate(&mut operator);
        let instance = Instance::new(&certs, false);
        operator = start(&instance, &[RESYNC]);
        // Each process reconciles every release and ClusterAddon at least half the reconciles (after its
        // first, which renders anew against the workload clusters).
        let per_process = (RECONCILES / 2.0).ceil() + 1.0;
        let deadline = Instant::now() + PHASE;
        let counted = loop {
            let counted = counts(instance.metrics_port).await;
            if counted["clusterstackrelease"] >= per_process * CASES.len() as f64
                && counted["clusteraddon"] >= per_process * CASES.len() as f64
            {
                break counted;
            }
            assert!(
                Instant::now() < deadline,
                "restart {restart}: too few reconciles: {counted:?}; operator log:\n{}",
                log_tail(&log)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        // Each process reads what it has not applied itself and finds it as the last apply of the same content
        // left it.
        assert!(
            counted["management"] == 0.0 && counted["workload"] == 0.0,
            "restart {restart}: the reconciles wrote nothing to either cluster: {counted:?}"
        );
        for (key, value) in &counted {
            *totals.entry(key).or_default() += value;
        }
        let now = snapshot(&client, &ns, &workloads).await;
        let moved = changes(&baseline, &now);
        assert!(
            moved.is_empty(),
            "restart {restart}, after {counted:?}: objects changed:\n{}",
            moved.join("\n")
        );
    }
    assert!(
        totals["clusterstackrelease"] >= RECONCILES * CASES.len() as f64
            && totals["clusteraddon"] >= RECONCILES * CASES.len() as f64,
        "every release and ClusterAddon reconciled {RECONCILES} times: {totals:?}"
    );
    eprintln!("stable over two restarts: {totals:?}");

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
    drop(stand_in);
    for plane in planes {
        plane.stop();
    }
}
