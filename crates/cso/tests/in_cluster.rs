//! The operator the way a site runs it: the image (`hack/image.sh`: static `cso`, `cso-renderer` and `helm` on
//! `scratch`, user 65532, read-only root) started by the chart's Deployment on a real node
//! ([`cso_testenv::node`]): `helm install` with the image and otherwise the chart's defaults, two replicas.
//! Both pods become Ready through their probes with the ServiceAccount's token (no kubeconfig), one of them holds
//! the Lease `clusterstack.x-k8s.io`, the API server calls the admission webhook through its Service (a
//! ClusterStack with a bad version is refused with the webhook's message), `/metrics` answers through the
//! metrics Service, and deleting the leader's pod stops it within its grace period and hands the Lease to a
//! replica that runs (the other one, or the one started in its place).
//!
//! The main job from pods: releases fetched from a GitHub stand-in and a workload cluster's API server, both
//! where a site has them (off the node, here on this machine's address on the nodes' bridge), a ClusterStack's
//! ClusterClass applied, a Cluster's addons applied into its workload cluster, and an upgrade of that Cluster
//! finished by the other replica after the leader's pod is deleted in the middle of it: every object written
//! once for the change, the removed one pruned, nothing lost.
//!
//! Memory for real: under a limit too small for it the operator is `OOMKilled` by the kernel and restarted by
//! the kubelet; given the chart's default limit back it converges. The pods' memory is read from their memory
//! cgroups on the node ([`cso_testenv::node::RealCluster::pod_memory`]).
//!
//! The image archive is built once per run by `make image-test` (`make test` does it first); the test fails
//! with that line when it is missing.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use cso_testenv::{Tools, node::RealCluster};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Pod, Service},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;

mod support;

use support::ferrol_stack;

const NAMESPACE: &str = "cso-system";
const LEASE: &str = "clusterstack.x-k8s.io";
const TIMEOUT: Duration = Duration::from_secs(120);

fn helm(tools: &Tools, kubeconfig: &Path, args: &[&str]) -> String {
    let output = Command::new(tools.helm.as_ref().expect("helm: run `make tools`"))
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "helm {args:?}: {text}");
    text
}

/// The names of the operator's pods that are Ready, and all of them with their phase and readiness.
async fn operator_pods(pods: &Api<Pod>) -> Result<(Vec<String>, String), String> {
    let list = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=controller-manager"))
        .await
        .map_err(|e| e.to_string())?;
    let ready: Vec<String> = list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let seen = list
        .items
        .iter()
        .map(|p| {
            let status = p.status.clone().unwrap_or_default();
            let waiting: Vec<String> = status
                .container_statuses
                .iter()
                .flatten()
                .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
                .collect();
            format!(
                "{} {:?} {waiting:?}",
                p.metadata.name.clone().unwrap_or_default(),
                status.phase
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    Ok((ready, seen))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_runs_the_image_on_a_real_node_with_two_replicas_one_leader_and_its_webhooks() {
    let tools = Tools::discover().unwrap();
    let cluster = cluster_for_the_operator(&tools, "site").await;
    let client = cluster.control_plane.client().await.unwrap();
    let installed = Instant::now();
    install_chart(&tools, &cluster, &["replicas=2".into()]);

    // Two replicas Ready through their probes.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let ready = cso_testenv::eventually("both replicas Ready", TIMEOUT, || async {
        let (ready, seen) = operator_pods(&pods).await?;
        if ready.len() == 2 { Ok(ready) } else { Err(seen) }
    })
    .await;
    let both_ready = installed.elapsed();

    // One holds the Lease.
    let leader = leader(&client).await;
    assert!(ready.contains(&leader));

    // The API server calls the webhook through its Service: a bad version is refused with its message.
    let stacks: Api<cso_api::ClusterStack> = Api::namespaced(client.clone(), "default");
    let stack = ferrol_stack("default", &["v1-alpha"]);
    let refused = cso_testenv::eventually("the webhook's refusal", TIMEOUT, || async {
        match stacks.create(&PostParams::default(), &stack).await {
            Err(kube::Error::Api(status)) if status.message.contains("v1-alpha") => Ok(status.message),
            other => {
                let _ = stacks.delete("ferrol", &DeleteParams::default()).await;
                Err(format!("{other:?}"))
            }
        }
    })
    .await;
    assert!(refused.contains("spec.versions"), "{refused}");

    // /metrics through the metrics Service (the API server's service proxy).
    let metrics = cso_testenv::eventually("/metrics through the metrics Service", TIMEOUT, || {
        operator_metrics(&client)
    })
    .await;
    assert!(metrics.contains("process_resident_memory_bytes"));

    // The leader's pod deleted (SIGTERM): it stops within its grace period (the kubelet removes the pod once its
    // container has exited; one that ignored SIGTERM would be killed after the 30 s), and the other replica
    // takes the Lease.
    // Until when the leader's lease is valid by the renewal the Lease shows now (a later renewal only moves it on).
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let held = leases.get(LEASE).await.unwrap().spec.unwrap();
    let valid_until = held
        .renew_time
        .unwrap()
        .0
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(i64::from(
            held.lease_duration_seconds.unwrap(),
        )))
        .unwrap();
    let handover = Instant::now();
    pods.delete(&leader, &DeleteParams::default()).await.unwrap();
    let grace = Duration::from_secs(30);
    cso_testenv::eventually(
        "the deleted leader's pod gone within its grace period",
        grace,
        || async {
            match pods.get_opt(&leader).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(pod) => Err(format!("{:?}", pod.status.and_then(|s| s.container_statuses))),
            }
        },
    )
    .await;
    let stopped = handover.elapsed();
    // The other replica, or the one the Deployment started in the leader's place, whichever asks first.
    let successor = leader_other_than(&client, Some(&leader)).await;
    assert_ne!(successor, leader);
    // Released on SIGTERM and asked for at once: taken while the leader's last lease was still valid, not after
    // it expired.
    let taken = leases
        .get(LEASE)
        .await
        .unwrap()
        .spec
        .unwrap()
        .acquire_time
        .unwrap()
        .0;
    assert!(
        taken < valid_until,
        "the Lease was taken at {taken}, after the released one would have expired ({valid_until}): the successor \
         waited for the expiry"
    );
    eprintln!(
        "in cluster: both replicas Ready {both_ready:.1?} after helm install; the deleted leader's pod gone after \
         {stopped:.1?}, the Lease handed over {:.1?} after the deletion",
        handover.elapsed()
    );
    cluster.stop();
}

/// The real-node cluster of a test (one node) with the operator's image imported.
async fn real_cluster_with_the_image(tools: &Tools, name: &str) -> RealCluster {
    if let Err(why) = RealCluster::support(tools) {
        panic!("this machine cannot run real nodes: {why}");
    }
    let archive = cso_testenv::node::operator_image_archive();
    assert!(
        archive.is_file(),
        "{} is missing: run `make image-test` (or `bash hack/image.sh`)",
        archive.display()
    );
    let cluster = RealCluster::start(tools, name, None, 1).await.unwrap();
    cluster.import_image(&archive).unwrap();
    cluster
}

/// [`real_cluster_with_the_image`] with Cluster API's CRDs (the operator watches them; Cluster API itself is not
/// needed by the tests that use this).
async fn cluster_for_the_operator(tools: &Tools, name: &str) -> RealCluster {
    let cluster = real_cluster_with_the_image(tools, name).await;
    let client = cluster.control_plane.client().await.unwrap();
    let capi_crds = cso_testenv::crds::read_dirs(&tools.capi_crd_dirs).unwrap();
    cso_testenv::crds::install(&client, &capi_crds).await.unwrap();
    cluster
}

/// `helm install` (or `upgrade --install`) of the chart with the image built here and `settings` (`--set`).
fn install_chart(tools: &Tools, cluster: &RealCluster, settings: &[String]) {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../charts/cluster-stack-operator");
    let kubeconfig = cluster.control_plane.kubeconfig_path();
    let mut args = vec![
        "upgrade".to_owned(),
        "--install".into(),
        "cso".into(),
        chart.display().to_string(),
        "--namespace".into(),
        NAMESPACE.into(),
        "--create-namespace".into(),
    ];
    let image =
        cso_testenv::node::chart_image_settings(&cso_testenv::node::operator_image_archive()).unwrap();
    for setting in image.into_iter().chain(settings.iter().cloned()) {
        args.push("--set".into());
        args.push(setting);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    helm(tools, kubeconfig, &args);
}

/// The Ready operator pod that holds the Lease.
async fn leader(client: &kube::Client) -> String {
    leader_other_than(client, None).await
}

/// The Ready operator pod that holds the Lease, once that is not `former` (a pod that led before).
async fn leader_other_than(client: &kube::Client, former: Option<&str>) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    cso_testenv::eventually("the Lease held by a Ready replica", TIMEOUT, || async {
        let lease = leases
            .get_opt(LEASE)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no Lease yet")?;
        let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
        let (ready, seen) = operator_pods(&pods).await?;
        ready
            .into_iter()
            .find(|pod| Some(pod.as_str()) != former && holder.starts_with(pod.as_str()))
            .ok_or(format!("held by {holder:?}; pods: {seen}"))
    })
    .await
}

/// The memory of every operator pod, from the pods' memory cgroups: working set (what the kubelet and the kernel
/// hold against the limit) and resident set of its processes, in MiB.
async fn operator_memory(client: &kube::Client, cluster: &RealCluster) -> Vec<(String, String)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    pods.list(&ListParams::default().labels("app.kubernetes.io/component=controller-manager"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|pod| {
            let memory = cluster.pod_memory(pod.metadata.uid.as_deref()?)?;
            let mib = |bytes: u64| bytes as f64 / 1024.0 / 1024.0;
            Some((
                pod.metadata.name?,
                format!(
                    "working set {:.1} MiB, resident {:.1} MiB",
                    mib(memory.working_set),
                    mib(memory.resident)
                ),
            ))
        })
        .collect()
}

/// The operator's `/metrics` through its metrics Service (the API server's service proxy; plain HTTP or
/// HTTPS, whichever the chart serves).
async fn operator_metrics(client: &kube::Client) -> Result<String, String> {
    let services: Api<Service> = Api::namespaced(client.clone(), NAMESPACE);
    let metrics_service = services
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .find(|name| name.contains("metrics"))
        .ok_or("no metrics Service")?;
    let mut seen = Vec::new();
    for scheme in ["", "https:"] {
        let request = http::Request::get(format!(
            "/api/v1/namespaces/{NAMESPACE}/services/{scheme}{metrics_service}:metrics/proxy/metrics"
        ))
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
        match client.request_text(request).await {
            Ok(text) if text.contains("cso_") => return Ok(text),
            other => seen.push(format!("{other:?}")),
        }
    }
    Err(seen.join(" / "))
}

/// What the pods reach off their node, where a site has it: a GitHub stand-in with the bundled releases `tags`
/// and a workload control plane `workload_name`, both on this machine's address on the nodes' bridge.
async fn site_servers(
    tools: &Tools,
    cluster: &RealCluster,
    tags: &[&str],
    workload_name: &str,
) -> (cso_testenv::github::FakeGithub, cso_testenv::ControlPlane) {
    let host = cluster.host_address();
    let github = cso_testenv::github::FakeGithub::start_on(host, 30).await.unwrap();
    let releases = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases");
    for tag in tags {
        github.publish_dir(tag, &releases.join(tag)).unwrap();
    }
    let placement = cso_testenv::control_plane::Placement {
        address: host,
        netns: None,
    };
    let workload = cso_testenv::ControlPlane::start_placed(tools, workload_name, None, &placement)
        .await
        .unwrap();
    (github, workload)
}

/// Creates `stack` through the operator's admission webhook, once kube-proxy routes its Service to a Ready pod
/// (a moment after Ready); panics when the webhook refuses it.
async fn create_admitted(stacks: &Api<cso_api::ClusterStack>, stack: &cso_api::ClusterStack) {
    cso_testenv::eventually("the ClusterStack admitted", TIMEOUT, || async {
        match stacks.create(&PostParams::default(), stack).await {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("failed calling webhook") => Err(e.to_string()),
            Err(e) => panic!("the ClusterStack refused: {e}"),
        }
    })
    .await;
}

/// Successful writes (`POST`, `PUT`, `PATCH`, `DELETE`) the API server at `client` has served, per resource
/// (`apiserver_request_total`).
async fn writes(client: &kube::Client) -> std::collections::BTreeMap<String, f64> {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(request).await.unwrap();
    let mut writes = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let label = |name: &str| {
            line.split(&format!("{name}=\""))
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_default()
                .to_owned()
        };
        let verb = label("verb");
        // The API server renews its own identity Lease; the operator writes no Lease in a workload cluster.
        if label("resource") == "leases" {
            continue;
        }
        if !["POST", "PUT", "PATCH", "DELETE"].contains(&verb.as_str()) || !label("code").starts_with('2') {
            continue;
        }
        let count: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        *writes.entry(label("resource")).or_insert(0.0) += count;
    }
    writes
}

/// The difference of two [`writes`] readings, resources without a write left out.
fn writes_between(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
) -> std::collections::BTreeMap<String, u64> {
    after
        .iter()
        .map(|(resource, n)| {
            (
                resource.clone(),
                (n - before.get(resource).unwrap_or(&0.0)) as u64,
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pods_install_a_stack_and_its_addons_and_finish_an_upgrade_across_a_leader_handover() {
    use cso_api::{ClusterAddon, ClusterStackRelease};
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};

    let tools = Tools::discover().unwrap();
    let cluster = cluster_for_the_operator(&tools, "stacks").await;
    let client = cluster.control_plane.client().await.unwrap();
    let host = cluster.host_address();
    let (github, workload_plane) = site_servers(
        &tools,
        &cluster,
        &["docker-ferrol-1-27-v1", "docker-ferrol-1-27-v2"],
        "stacks-workload",
    )
    .await;
    let workload = workload_plane.client().await.unwrap();

    install_chart(
        &tools,
        &cluster,
        &[
            "replicas=2".into(),
            "source=github".into(),
            format!("extraArgs[0]=--github-api-url={}", github.api_url()),
            // The workload cluster is a bare API server: nothing applied there ever runs (the addons that
            // really run are the next issue's).
            "extraArgs[1]=--addon-health-checks=false".into(),
        ],
    );
    let first_leader = leader(&client).await;
    let idle_memory = operator_memory(&client, &cluster).await;

    // A ClusterStack: its release fetched, rendered and applied by the pods.
    let tenant = cso_testenv::namespace(&client, "tenant").await.unwrap();
    let stacks: Api<cso_api::ClusterStack> = Api::namespaced(client.clone(), &tenant);
    create_admitted(&stacks, &ferrol_stack(&tenant, &["v1"])).await;
    let stack_releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), &tenant);
    cso_testenv::eventually("the release v1 ready", TIMEOUT, || async {
        let release = stack_releases
            .get_opt("docker-ferrol-1-27-v1")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no release yet")?;
        if release.status.as_ref().is_some_and(|s| s.ready) {
            Ok(())
        } else {
            Err(format!("{:?}", release.status))
        }
    })
    .await;
    let classes: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &tenant,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "cluster.x-k8s.io",
            "v1beta1",
            "ClusterClass",
        )),
    );
    assert!(classes.get_opt("docker-ferrol-1-27-v1").await.unwrap().is_some());

    // A Cluster of that class: its addons applied into its workload cluster by the pods.
    cso_testenv::kubeconfig_secret(&client, &tenant, "c1", workload_plane.kubeconfig_yaml())
        .await
        .unwrap();
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &tenant,
        &ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta1", "Cluster")),
    );
    let cluster_object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"name": "c1", "namespace": tenant},
        "spec": {
            "topology": {"class": "docker-ferrol-1-27-v1", "version": "v1.27.3"},
            "controlPlaneEndpoint": {"host": host.to_string(), "port": 6443},
        },
    }))
    .unwrap();
    clusters
        .create(&PostParams::default(), &cluster_object)
        .await
        .unwrap();
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &tenant);
    let applied = |class: &'static str| {
        let addons = addons.clone();
        async move {
            let addon = addons
                .get_opt("cluster-addon-c1")
                .await
                .map_err(|e| e.to_string())?
                .ok_or("no ClusterAddon yet")?;
            let ready = addon.status.as_ref().is_some_and(|s| s.ready);
            if addon.spec.cluster_stack == class && ready {
                Ok(addon)
            } else {
                Err(format!(
                    "{} ready={ready} {:?}",
                    addon.spec.cluster_stack, addon.status
                ))
            }
        }
    };
    let installed = cso_testenv::eventually("the addons of v1 applied", TIMEOUT, || {
        applied("docker-ferrol-1-27-v1")
    })
    .await;
    let deployments: Api<k8s_openapi::api::apps::v1::Deployment> = Api::all(workload.clone());
    let names = |list: Vec<k8s_openapi::api::apps::v1::Deployment>| -> Vec<String> {
        list.into_iter().filter_map(|d| d.metadata.name).collect()
    };
    let before = names(deployments.list(&ListParams::default()).await.unwrap().items);
    assert!(before.contains(&"web".to_owned()), "{before:?}");
    let inventory_v1 = installed.status.unwrap().resources.len();

    // The upgrade: v2 added to the ClusterStack and the Cluster moved to it at once. v2's download takes 5 s;
    // while the leader is in it, its pod is deleted without a grace period (the kubelet kills it, as a node
    // failure or an eviction would): the other replica must take the Lease and do the upgrade.
    github.slow_down("docker-ferrol-1-27-v2", Duration::from_secs(5));
    let v2_assets: Vec<String> = github
        .asset_ids("docker-ferrol-1-27-v2")
        .iter()
        .map(|id| format!("/releases/assets/{id}"))
        .collect();
    let downloads = || {
        github
            .requests()
            .iter()
            .filter(|r| r.host == "api" && v2_assets.iter().any(|asset| r.path.ends_with(asset.as_str())))
            .count()
    };
    let downloads_before = downloads();
    let writes_before = writes(&workload).await;
    stacks
        .patch(
            "ferrol",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"versions": ["v1", "v2"]}})),
        )
        .await
        .unwrap();
    clusters
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"topology": {"class": "docker-ferrol-1-27-v2"}}})),
        )
        .await
        .unwrap();
    cso_testenv::eventually("the leader downloading v2", TIMEOUT, || async {
        if downloads() > downloads_before {
            Ok(())
        } else {
            Err("no download yet".to_owned())
        }
    })
    .await;
    let deleted = Instant::now();
    let downloads_at_the_kill = downloads();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    pods.delete(
        &first_leader,
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let done_at_deletion = applied("docker-ferrol-1-27-v2").await.is_ok();
    let second_leader = leader(&client).await;
    let handed_over = deleted.elapsed();
    assert_ne!(second_leader, first_leader);
    let upgraded = cso_testenv::eventually("the addons of v2 applied after the handover", TIMEOUT, || {
        applied("docker-ferrol-1-27-v2")
    })
    .await;
    let upgrade_finished = deleted.elapsed();
    // The new leader downloaded v2 again: the killed one never finished.
    assert!(
        downloads() > downloads_at_the_kill,
        "no download of v2 after the leader was killed: it was not the new leader that finished it"
    );
    assert!(
        !done_at_deletion,
        "the upgrade had finished before the leader's pod was deleted"
    );

    // Nothing lost: every object of v2 in the workload cluster; the one v2 dropped pruned.
    let inventory = upgraded.status.unwrap().resources;
    for resource in &inventory {
        let gvk = GroupVersionKind::gvk(&resource.group, &resource.version, &resource.kind);
        let (api_resource, _) = kube::discovery::pinned_kind(&workload, &gvk).await.unwrap();
        let api: Api<DynamicObject> = if resource.namespace.is_empty() {
            Api::all_with(workload.clone(), &api_resource)
        } else {
            Api::namespaced_with(workload.clone(), &resource.namespace, &api_resource)
        };
        assert!(
            api.get_opt(&resource.name).await.unwrap().is_some(),
            "{resource:?} of v2 is missing in the workload cluster"
        );
    }
    let after = names(deployments.list(&ListParams::default()).await.unwrap().items);
    assert!(
        !after.contains(&"web".to_owned()),
        "web (dropped by v2) not pruned: {after:?}"
    );
    // Written once for the change, though two replicas worked on it: v1 -> v2 of ferrol drops the `web`
    // Deployment and changes nothing else, so the one write is its deletion (nothing re-applied by the new
    // leader).
    assert_eq!(
        inventory_v1,
        inventory.len() + 1,
        "v2 has one object less than v1"
    );
    let upgrade_writes = writes_between(&writes_before, &writes(&workload).await);
    let total: u64 = upgrade_writes.values().sum();
    assert_eq!(
        upgrade_writes,
        [("deployments".to_owned(), 1)].into(),
        "writes to the workload cluster for the upgrade"
    );
    let busy_memory = operator_memory(&client, &cluster).await;
    eprintln!(
        "in cluster, the main job: the Lease taken {handed_over:.1?} and v1 -> v2 finished {upgrade_finished:.1?} \
         after the leader's pod was killed in it \
         ({} objects, {total} writes to the workload cluster: {upgrade_writes:?}); operator memory (cgroup \
         working set) idle {idle_memory:?}, after one Cluster {busy_memory:?}",
        inventory.len()
    );
    drop(workload_plane);
    cluster.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_too_small_is_oom_killed_and_restarted_by_the_kubelet_and_the_default_limit_converges() {
    let tools = Tools::discover().unwrap();
    let cluster = cluster_for_the_operator(&tools, "memory").await;
    let client = cluster.control_plane.client().await.unwrap();
    install_chart(
        &tools,
        &cluster,
        &[
            "resources.limits.memory=8Mi".into(),
            "resources.requests.memory=8Mi".into(),
        ],
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    // The kernel kills it in its cgroup; the kubelet says so and starts it again.
    let (restarts, reason) =
        cso_testenv::eventually("the operator OOMKilled and restarted", TIMEOUT, || async {
            let list = pods
                .list(&ListParams::default().labels("app.kubernetes.io/component=controller-manager"))
                .await
                .map_err(|e| e.to_string())?;
            let statuses: Vec<_> = list
                .items
                .iter()
                .flat_map(|p| {
                    p.status
                        .clone()
                        .unwrap_or_default()
                        .container_statuses
                        .unwrap_or_default()
                })
                .collect();
            statuses
                .iter()
                .find_map(|c| {
                    let reason = c.last_state.as_ref()?.terminated.as_ref()?.reason.clone()?;
                    (c.restart_count >= 1 && reason == "OOMKilled").then_some((c.restart_count, reason))
                })
                .ok_or(format!("{statuses:?}"))
        })
        .await;
    assert_eq!(reason, "OOMKilled");

    // The chart's default limit back: once the limited pod is gone, the one pod left (of the new template) is
    // Ready and leads.
    let limited = Instant::now();
    install_chart(&tools, &cluster, &[]);
    let restarts_of = |pod: &Pod| -> i32 {
        pod.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map(|c| c.iter().map(|c| c.restart_count).sum())
            .unwrap_or_default()
    };
    let limit_of = |pod: &Pod| -> Option<String> {
        let limits = pod
            .spec
            .as_ref()?
            .containers
            .first()?
            .resources
            .as_ref()?
            .limits
            .as_ref()?;
        Some(limits.get("memory")?.0.clone())
    };
    let converged_pod = cso_testenv::eventually("only the default limit's pod, Ready", TIMEOUT, || async {
        let list = pods
            .list(&ListParams::default().labels("app.kubernetes.io/component=controller-manager"))
            .await
            .map_err(|e| e.to_string())?;
        let (ready, seen) = operator_pods(&pods).await?;
        match list.items.as_slice() {
            [pod] if limit_of(pod).as_deref() != Some("8Mi") && ready.len() == 1 => Ok(pod.clone()),
            _ => Err(seen),
        }
    })
    .await;
    let leading = leader(&client).await;
    assert_eq!(converged_pod.metadata.name.as_deref(), Some(leading.as_str()));
    let converged = limited.elapsed();
    // It stays: no restart under the default limit while it works (a second look after a while).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let memory = operator_memory(&client, &cluster).await;
    let pod = pods.get(&leading).await.unwrap();
    assert_eq!(
        restarts_of(&pod),
        0,
        "the pod under the default limit restarted: {:?}",
        pod.status
    );
    eprintln!(
        "memory: OOMKilled under 8Mi and restarted {restarts} time(s) by the kubelet; under the default limit \
         Ready and leading {converged:.1?} after the upgrade; working set {memory:?}"
    );
    cluster.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_api_calls_the_pods_hooks_through_the_charts_extension_config() {
    use cso_api::ClusterAddon;
    use cso_testenv::{
        capi::{ClusterApi, ClusterApiTools, Options, TopologyCluster},
        stand_in::{StandIn, Workload},
    };
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};

    let tools = Tools::discover().unwrap();
    let capi_tools = ClusterApiTools::discover().unwrap();
    let cluster = real_cluster_with_the_image(&tools, "capi").await;
    let client = cluster.control_plane.client().await.unwrap();
    // Cluster API v1.14 beside the API server in the control-plane node's namespace, as its pods would run:
    // it resolves the chart's ExtensionConfig service reference through the cluster's DNS and dials the
    // Service's ClusterIP through kube-proxy.
    let cluster_api = ClusterApi::start(
        &capi_tools,
        &cluster.control_plane,
        &Options {
            placement: cluster.placement(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let (github, workload_plane) =
        site_servers(&tools, &cluster, &["docker-ferrol-1-27-v1"], "capi-workload").await;
    let workload = workload_plane.client().await.unwrap();

    // The chart with its defaults for the hook server: its Service and the ExtensionConfig that names it.
    install_chart(
        &tools,
        &cluster,
        &[
            "source=github".into(),
            format!("extraArgs[0]=--github-api-url={}", github.api_url()),
            "extraArgs[1]=--addon-health-checks=false".into(),
        ],
    );
    leader(&client).await;
    let hooks: std::collections::BTreeSet<String> =
        cso_testenv::capi::discovered_hooks(&client, "cso-hook-server-extensionconfig", TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", cluster_api.log_tail(cso_testenv::capi::Provider::Core)))
            .into_iter()
            .collect();
    let every_hook: std::collections::BTreeSet<String> = cso_api::rules::Hook::ALL
        .iter()
        .map(|h| h.as_str().to_owned())
        .collect();
    assert_eq!(
        hooks, every_hook,
        "Cluster API discovered the pods' handlers through the Service"
    );

    // The stack, and a Cluster of its class built by Cluster API (the stand-in plays the machines).
    let tenant = cso_testenv::namespace(&client, "tenant").await.unwrap();
    let stacks: Api<cso_api::ClusterStack> = Api::namespaced(client.clone(), &tenant);
    create_admitted(&stacks, &ferrol_stack(&tenant, &["v1"])).await;
    let classes: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &tenant,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(
            "cluster.x-k8s.io",
            "v1beta2",
            "ClusterClass",
        )),
    );
    cso_testenv::eventually(
        "the ClusterClass applied and reconciled by Cluster API",
        TIMEOUT,
        || async {
            let class = classes
                .get_opt("docker-ferrol-1-27-v1")
                .await
                .map_err(|e| e.to_string())?
                .ok_or("no ClusterClass yet")?;
            let class = serde_json::to_value(class).map_err(|e| e.to_string())?;
            let reconciled = class
                .pointer("/status/conditions")
                .and_then(serde_json::Value::as_array)
                .is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "VariablesReady" && c["status"] == "True")
                });
            if reconciled {
                Ok(())
            } else {
                Err(format!("{:?}", class.pointer("/status")))
            }
        },
    )
    .await;
    let _stand_in = StandIn::start(
        client.clone(),
        Workload {
            kubeconfig: workload_plane.kubeconfig_yaml().to_owned(),
            server_url: workload_plane.server_url().to_owned(),
        },
    );
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &tenant,
        &ApiResource::from_gvk(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Cluster")),
    );
    let created = Instant::now();
    let cluster_object = TopologyCluster {
        namespace: &tenant,
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
    clusters
        .create(
            &PostParams::default(),
            &serde_json::from_value(cluster_object).unwrap(),
        )
        .await
        .unwrap_or_else(|e| panic!("Cluster API refused the Cluster: {e}"));

    // Its addons in the workload cluster, and Cluster API's calls answered by the pods.
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), &tenant);
    let workload_deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(workload.clone(), "kube-system");
    cso_testenv::eventually("the addons in the workload cluster", TIMEOUT, || async {
        let addon = addons
            .get_opt("cluster-addon-c1")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no ClusterAddon yet")?;
        let ready = addon.status.as_ref().is_some_and(|s| s.ready);
        let metrics_server = workload_deployments
            .get_opt("metrics-server")
            .await
            .map_err(|e| e.to_string())?;
        if ready && metrics_server.is_some() {
            Ok(())
        } else {
            Err(format!("{:?}", addon.status))
        }
    })
    .await;
    let installed = created.elapsed();
    let answered = cso_testenv::eventually(
        "AfterControlPlaneInitialized answered by the pods",
        TIMEOUT,
        || async {
            let metrics = operator_metrics(&client).await?;
            let calls: f64 = metrics
                .lines()
                .filter(|l| {
                    l.starts_with("cso_hook_requests_total{")
                        && l.contains("hook=\"AfterControlPlaneInitialized\"")
                        && l.contains("result=\"success\"")
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            if calls > 0.0 {
                Ok(calls)
            } else {
                Err("no call counted yet".to_owned())
            }
        },
    )
    .await;
    eprintln!(
        "in cluster, Cluster API: every hook discovered through the chart's ExtensionConfig; the Cluster's addons \
         in its workload cluster {installed:.1?} after it was created; {answered} AfterControlPlaneInitialized \
         call(s) answered by the pod; Cluster API started in {:.1?}",
        cluster_api.started_in()
    );
    drop(cluster_api);
    drop(workload_plane);
    cluster.stop();
}
