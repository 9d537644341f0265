//! `cso-dev demo`: the operator's main job on an embedded default. Starts a local management control plane and a
//! workload control plane, runs the controllers with the bundled example stack (ferrol v1 and v2, local
//! source), creates a ClusterStack and waits until both ClusterClasses and their templates are applied,
//! creates a Cluster with its kubeconfig Secret and waits until its addons run in the workload cluster,
//! prints what was created where and how long each step took, and stops everything.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use cso_api::{ClusterAddon, ClusterStack, ClusterStackRelease, capi::Cluster};
use cso_controller::{Operator, Settings};
use cso_release::{ReleaseCache, archive::UnpackLimits, source::local::LocalSource};
use cso_render::{CachingRenderer, Helm, ValuesTemplater, cache::DEFAULT_CAPACITY_BYTES};
use cso_testenv::Tools;
use kube::{Api, api::PostParams};

/// The example releases built into the repository.
pub const BUNDLED_RELEASES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/releases");
const STACK_RELEASES: [&str; 2] = ["docker-ferrol-1-27-v1", "docker-ferrol-1-27-v2"];
const NAMESPACE: &str = "demo";
const CLUSTER: &str = "c1";
const CLUSTER_CLASS: &str = "docker-ferrol-1-27-v1";

struct Steps {
    started: Instant,
    last: Instant,
    done: Vec<(String, Duration)>,
}

impl Steps {
    fn new() -> Self {
        let now = Instant::now();
        Steps {
            started: now,
            last: now,
            done: Vec::new(),
        }
    }

    fn begin(&mut self, what: &str) {
        eprintln!("==> {what}");
        self.last = Instant::now();
    }

    fn end(&mut self, what: &str) {
        self.done.push((what.to_owned(), self.last.elapsed()));
    }
}

pub async fn demo(dir: &Path, releases: Option<&Path>) -> anyhow::Result<()> {
    let releases = releases.map_or_else(|| PathBuf::from(BUNDLED_RELEASES), Path::to_path_buf);
    let mut steps = Steps::new();
    let tools = Tools::discover().context("the tools are missing: run `make tools`")?;
    let helm = tools.helm.clone().context("helm is missing: run `make tools`")?;

    steps.begin("starting a management control plane (etcd + kube-apiserver, Cluster API CRDs)");
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("failed to clean {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir)?;
    let dir = dir.canonicalize()?;
    let plane = cso_testenv::start_management(&tools, Some(&dir.join("management"))).await?;
    let client = plane.client().await?;
    std::fs::write(dir.join("management.kubeconfig"), plane.kubeconfig_yaml())?;
    steps.end("management control plane");

    steps.begin("starting a workload control plane (stands in for the Cluster's API server)");
    let workload =
        match cso_testenv::ControlPlane::start(&tools, "workload", Some(&dir.join("workload"))).await {
            Ok(workload) => workload,
            Err(e) => {
                plane.stop();
                return Err(e).context("failed to start the workload control plane");
            }
        };
    std::fs::write(dir.join("workload.kubeconfig"), workload.kubeconfig_yaml())?;
    steps.end("workload control plane");

    steps.begin("starting the operator with the bundled ferrol stack (local source)");
    let release_dir = dir.join("releases");
    for tag in STACK_RELEASES {
        cso_release::release::copy_release_dir(
            &releases.join(tag),
            &release_dir.join("cluster-stacks").join(tag),
        )?;
    }
    let source = Arc::new(LocalSource::new(release_dir.join("cluster-stacks")));
    let operator = Operator {
        client: client.clone(),
        releases: Arc::new(ReleaseCache::new(&release_dir, source, UnpackLimits::default())?),
        renderer: Arc::new(CachingRenderer::new(
            Helm::new(&helm, Duration::from_secs(120))?,
            DEFAULT_CAPACITY_BYTES,
        )),
        values: Arc::new(ValuesTemplater::new(Helm::new(&helm, Duration::from_secs(120))?)?),
        metrics: Default::default(),
        take_over_from: Vec::new(),
        settings: Settings::default(),
        cluster_resource: cso_controller::cluster_resource(&client).await,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controllers = tokio::spawn(cso_controller::run(operator, async move {
        let _ = stopped.await;
    }));
    steps.end("operator start");

    steps.begin("creating ClusterStack demo/ferrol (versions v1, v2) and waiting for its ClusterClasses");
    let classes = converge(&client).await;
    steps.end("ClusterStack to ready ClusterClasses");

    let addons = match &classes {
        Ok(_) => {
            steps.begin(&format!(
                "creating Cluster {NAMESPACE}/{CLUSTER} on class {CLUSTER_CLASS} with its kubeconfig Secret, \
                 waiting for its addons in the workload cluster"
            ));
            let addons = install_addons(&client, &workload).await;
            steps.end("Cluster to addons running");
            Some(addons)
        }
        Err(_) => None,
    };

    steps.begin("cleaning up: stopping the operator and both control planes");
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(30), controllers).await;
    workload.stop();
    plane.stop();
    steps.end("clean-up");
    let (releases_ready, inventory) = classes?;
    let addon_objects = addons.context("the addons were not installed")??;

    println!();
    println!(
        "cso-dev demo: done in {:.1}s",
        steps.started.elapsed().as_secs_f64()
    );
    for (what, took) in &steps.done {
        println!("  {what:<40} {:>6.1}s", took.as_secs_f64());
    }
    println!("created in the management cluster (namespace {NAMESPACE}):");
    println!("  ClusterStack ferrol");
    for (release, objects) in releases_ready.iter().zip(inventory) {
        println!("  ClusterStackRelease {release} (ready)");
        for object in objects {
            println!("    {object}");
        }
    }
    println!("  Cluster {CLUSTER} (class {CLUSTER_CLASS}) and ClusterAddon cluster-addon-{CLUSTER} (ready)");
    println!("applied into the workload cluster by the ClusterAddon:");
    for object in addon_objects {
        println!("  {object}");
    }
    println!("state and kubeconfigs were in {}", dir.display());
    Ok(())
}

/// Creates the Cluster (with its kubeconfig Secret pointing at `workload`) and waits until its ClusterAddon
/// is ready; returns what was applied into the workload cluster.
async fn install_addons(
    client: &kube::Client,
    workload: &cso_testenv::ControlPlane,
) -> anyhow::Result<Vec<String>> {
    let cluster: Cluster = serde_json::from_value(serde_json::json!({
        "apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Cluster",
        "metadata": {"name": CLUSTER, "namespace": NAMESPACE},
        "spec": {"topology": {"class": CLUSTER_CLASS, "version": "v1.27.3"},
                 "controlPlaneEndpoint": {"host": format!("{CLUSTER}.demo.test"), "port": 6443}},
    }))?;
    Api::<Cluster>::namespaced_with(client.clone(), NAMESPACE, &Cluster::v1beta1_resource())
        .create(&PostParams::default(), &cluster)
        .await
        .context("failed to create the Cluster")?;
    cso_testenv::kubeconfig_secret(client, NAMESPACE, CLUSTER, workload.kubeconfig_yaml()).await?;
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), NAMESPACE);
    let name = cso_api::cluster_addon::cluster_addon_name(CLUSTER);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let addon = addons.get_opt(&name).await?;
        let status = addon.as_ref().and_then(|a| a.status.as_ref());
        if status.is_some_and(|s| s.ready) {
            let mut objects: Vec<String> = status
                .iter()
                .flat_map(|s| &s.resources)
                .map(|o| match o.namespace.as_str() {
                    "" => format!("{} {}", o.kind, o.name),
                    ns => format!("{} {ns}/{}", o.kind, o.name),
                })
                .collect();
            objects.sort();
            return Ok(objects);
        }
        if Instant::now() > deadline {
            let why = status
                .map(|s| {
                    s.conditions
                        .iter()
                        .filter(|c| c.status != cso_api::conditions::ConditionStatus::True)
                        .map(|c| format!("{}: {}", c.type_, c.message.clone().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join("; ")
                })
                .unwrap_or_else(|| format!("{name} was not created"));
            bail!("the addons were not applied within 120s: {why}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates the ClusterStack and waits until both releases are ready; returns them with their objects.
async fn converge(client: &kube::Client) -> anyhow::Result<(Vec<String>, Vec<Vec<String>>)> {
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": NAMESPACE}}))?;
    namespaces.create(&PostParams::default(), &namespace).await?;
    let stack: ClusterStack = serde_json::from_value(serde_json::json!({
        "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
        "metadata": {"name": "ferrol", "namespace": NAMESPACE},
        "spec": {"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27", "channel": "stable",
                 "autoSubscribe": false, "noProvider": true, "versions": ["v1", "v2"]},
    }))?;
    Api::<ClusterStack>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &stack)
        .await
        .context("failed to create the ClusterStack")?;
    let releases: Api<ClusterStackRelease> = Api::namespaced(client.clone(), NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let list = releases.list(&Default::default()).await?.items;
        let ready: Vec<&ClusterStackRelease> = list
            .iter()
            .filter(|r| r.status.as_ref().is_some_and(|s| s.ready))
            .collect();
        if ready.len() == STACK_RELEASES.len() {
            let names = ready.iter().filter_map(|r| r.metadata.name.clone()).collect();
            let objects = ready
                .iter()
                .map(|r| {
                    r.status
                        .iter()
                        .flat_map(|s| &s.resources)
                        .map(|o| format!("{} {}", o.kind, o.name))
                        .collect()
                })
                .collect();
            return Ok((names, objects));
        }
        if Instant::now() > deadline {
            let states: Vec<String> = list
                .iter()
                .map(|r| {
                    let ready = r.status.as_ref().and_then(|s| s.conditions.first());
                    format!(
                        "{}: {}",
                        r.metadata.name.clone().unwrap_or_default(),
                        ready
                            .map(|c| format!(
                                "{} {}",
                                c.reason.clone().unwrap_or_default(),
                                c.message.clone().unwrap_or_default()
                            ))
                            .unwrap_or_else(|| "no status".into())
                    )
                })
                .collect();
            bail!("the releases were not ready within 120s: {}", states.join("; "));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
