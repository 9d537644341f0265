//! `cso-dev demo`: the operator's main job on an embedded default, through Cluster API. Starts a local
//! management control plane with Cluster API v1.14 (its managers, and the provider stand-in for machines) and
//! a workload control plane that runs workloads (kube-controller-manager, kube-scheduler, kwok's simulated
//! nodes), runs the controllers and the hook server (registered with Cluster API by an
//! `ExtensionConfig`) with the bundled example stack (ferrol v1 and v2, local source), creates a ClusterStack
//! and waits until both ClusterClasses and their templates are applied, creates a Cluster with a topology
//! (Cluster API builds it from our ClusterClass and calls our hooks; its addons land in the workload cluster),
//! upgrades it to v2 (held by `BeforeClusterUpgrade` until v2's addons are applied), prints what was created
//! where, the pods running on the simulated nodes once the addons were ready, the hooks Cluster API called in order with their times, how long each step took, and stops
//! everything.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use cso_api::{ClusterAddon, ClusterStack, ClusterStackRelease, rules::Hook};
use cso_controller::{Operator, Settings};
use cso_release::{ReleaseCache, archive::UnpackLimits, source::local::LocalSource};
use cso_render::{CachingRenderer, Engine, ValuesTemplater, cache::DEFAULT_CAPACITY_BYTES};
use cso_testenv::{
    Tools,
    capi::{ClusterApiTools, Options, TopologyCluster, start_management_with_cluster_api},
    stand_in::{StandIn, Workload},
};
use cso_webhook::TlsServer;

use crate::workload::{self, LocalWorkload, NodeChoice};
use kube::{
    Api,
    api::{DynamicObject, Patch, PatchParams, PostParams},
    core::{ApiResource, GroupVersionKind},
};

/// The example releases built into the repository.
pub const BUNDLED_RELEASES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/releases");
const STACK_RELEASES: [&str; 2] = ["docker-ferrol-1-27-v1", "docker-ferrol-1-27-v2"];
const NAMESPACE: &str = "demo";
const CLUSTER: &str = "c1";
const CLUSTER_CLASS: &str = "docker-ferrol-1-27-v1";
const UPGRADE_CLASS: &str = "docker-ferrol-1-27-v2";
const UPGRADE_VERSION: &str = "v1.27.4";

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

pub async fn demo(dir: &Path, releases: Option<&Path>, nodes: NodeChoice) -> anyhow::Result<()> {
    let releases = releases.map_or_else(|| PathBuf::from(BUNDLED_RELEASES), Path::to_path_buf);
    let mut steps = Steps::new();
    let tools = Tools::discover().context("the tools are missing: run `make tools`")?;
    let renderer = tools
        .renderer
        .clone()
        .context("cso-renderer is missing: run `make tools`")?;
    let capi = ClusterApiTools::discover().context("Cluster API is missing: run `make tools`")?;

    steps.begin(&format!(
        "starting a management control plane (etcd + kube-apiserver) with Cluster API {}",
        capi.version
    ));
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("failed to clean {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir)?;
    let dir = dir.canonicalize()?;
    let management =
        start_management_with_cluster_api(&tools, &capi, Some(&dir.join("management")), &Options::default())
            .await?;
    let client = management.control_plane.client().await?;
    std::fs::write(
        dir.join("management.kubeconfig"),
        management.control_plane.kubeconfig_yaml(),
    )?;
    steps.end("management control plane + Cluster API");

    steps.begin(
        "starting a workload control plane that runs workloads (the Cluster's API server, \
         kube-controller-manager, kube-scheduler, and its nodes)",
    );
    let (workload, nodes_line) = match LocalWorkload::start(&tools, &dir.join("workload"), nodes).await {
        Ok(workload) => workload,
        Err(e) => {
            management.cluster_api.stop();
            management.control_plane.stop();
            return Err(e).context("failed to start the workload cluster");
        }
    };
    eprintln!("    nodes: {nodes_line}");
    let workload_client = workload.control_plane().client().await?;
    std::fs::write(
        dir.join("workload.kubeconfig"),
        workload.control_plane().kubeconfig_yaml(),
    )?;
    steps.end("workload control plane and nodes");

    steps.begin("starting the operator and its hook server with the bundled ferrol stack (local source)");
    let release_dir = dir.join("releases");
    for tag in STACK_RELEASES {
        let copy = release_dir.join("cluster-stacks").join(tag);
        cso_release::release::copy_release_dir(&releases.join(tag), &copy)?;
        if !workload.is_real() {
            metrics_api_service_not_judged(&copy)?;
        }
    }
    let source = Arc::new(LocalSource::new(release_dir.join("cluster-stacks")));
    // What `cso run` renders with by default: one long-lived renderer on Helm's engine.
    let engine = Engine::new(&renderer, Duration::from_secs(120));
    let operator = Operator {
        client: client.clone(),
        releases: Arc::new(ReleaseCache::new(&release_dir, source, UnpackLimits::default())?),
        renderer: Arc::new(CachingRenderer::new(engine.clone(), DEFAULT_CAPACITY_BYTES)),
        values: Arc::new(ValuesTemplater::with_engine(engine)),
        metrics: Default::default(),
        take_over_from: Vec::new(),
        // Health gates on, as `cso run` has them: the addons are ready once they run on the nodes.
        settings: Settings::default(),
        cluster_resource: cso_controller::cluster_resource(&client).await,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controllers = tokio::spawn(cso_controller::run(operator, async move {
        let _ = stopped.await;
    }));
    let calls: Arc<Mutex<Vec<HookCall>>> = Arc::default();
    let hook_server = start_hook_server(&client, &dir, steps.started, calls.clone()).await?;
    let _stand_in = StandIn::start(
        client.clone(),
        Workload {
            kubeconfig: workload.control_plane().kubeconfig_yaml().to_owned(),
            server_url: workload.control_plane().server_url().to_owned(),
        },
    );
    steps.end("operator, hook server discovered by Cluster API");

    steps.begin("creating ClusterStack demo/ferrol (versions v1, v2) and waiting for its ClusterClasses");
    let classes = converge(&client).await;
    steps.end("ClusterStack to ready ClusterClasses");

    let mut addons = None;
    let mut running = None;
    let mut upgraded = None;
    let mut running_after = None;
    let mut api_service = None;
    let mut top = None;
    if classes.is_ok() {
        steps.begin(&format!(
            "creating Cluster {NAMESPACE}/{CLUSTER} with a topology of class {CLUSTER_CLASS}: Cluster API builds \
             it and calls AfterControlPlaneInitialized; waiting for its addons in the workload cluster"
        ));
        addons = Some(install_addons(&client).await);
        steps.end("Cluster to addons running");
        if matches!(addons, Some(Ok(_))) {
            running = Some(workload::pods(&workload_client).await);
            api_service = Some(api_service_check(&workload_client, workload.is_real()).await);
            if workload.is_real() {
                top = Some(workload::top_nodes(&workload_client, Duration::from_secs(120)).await);
            }
        }
        if matches!(addons, Some(Ok(_))) {
            steps.begin(&format!(
                "upgrading the Cluster to {UPGRADE_CLASS} at {UPGRADE_VERSION}: Cluster API holds it at \
                 BeforeClusterUpgrade until the new addons are applied"
            ));
            upgraded = Some(upgrade(&client).await);
            steps.end("upgrade through Cluster API");
            if matches!(upgraded, Some(Ok(_))) {
                running_after = Some(pods_without_web(&workload_client).await);
            }
        }
    }

    steps.begin("cleaning up: stopping the operator, the hook server, Cluster API and both control planes");
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(30), controllers).await;
    hook_server.shutdown(Duration::from_secs(1)).await;
    workload.stop();
    management.cluster_api.stop();
    management.control_plane.stop();
    steps.end("clean-up");
    let (releases_ready, inventory) = classes?;
    let (addon_objects, waited_for) = addons.context("the addons were not installed")??;
    let (upgraded_objects, _) = upgraded.context("the Cluster was not upgraded")??;
    let running = running.context("the pods were not listed")??;
    let running_after = running_after.context("the pods were not listed after the upgrade")??;
    let real = top.is_some();

    println!();
    println!(
        "cso-dev demo: done in {:.1}s",
        steps.started.elapsed().as_secs_f64()
    );
    for (what, took) in &steps.done {
        println!("  {what:<44} {:>6.1}s", took.as_secs_f64());
    }
    println!("workload cluster: {nodes_line}");
    println!("created in the management cluster (namespace {NAMESPACE}):");
    println!("  ClusterStack ferrol");
    for (release, objects) in releases_ready.iter().zip(inventory) {
        println!("  ClusterStackRelease {release} (ready)");
        for object in objects {
            println!("    {object}");
        }
    }
    println!(
        "  Cluster {CLUSTER} (class {CLUSTER_CLASS}, then {UPGRADE_CLASS}), built by Cluster API, and ClusterAddon \
         cluster-addon-{CLUSTER} (ready)"
    );
    println!("applied into the workload cluster by the ClusterAddon (class {CLUSTER_CLASS}):");
    for object in addon_objects {
        println!("  {object}");
    }
    println!("the ClusterAddon was not ready while it waited for:");
    for reason in &waited_for {
        println!("  {reason}");
    }
    if real {
        println!(
            "running in the workload cluster when cluster-addon-{CLUSTER} was ready (real pods on real nodes):"
        );
    } else {
        println!(
            "running in the workload cluster when cluster-addon-{CLUSTER} was ready (pods on the simulated nodes; \
             ready means running):"
        );
    }
    for pod in &running {
        println!("  {pod}");
    }
    if let Some(check) = api_service {
        let check = check.unwrap_or_else(|e| format!("{e:#}"));
        if real {
            println!("  APIService {METRICS_API_SERVICE}: {check}");
        } else {
            println!(
                "  APIService {METRICS_API_SERVICE}: {check} (simulated pods have no network; the check's dial stays \
                 on this machine; not judged here, a real cluster serves it)"
            );
        }
    }
    if let Some(top) = top {
        println!(
            "kubectl top nodes (the workload cluster's metrics API, served by the stack's metrics-server):"
        );
        for line in top.unwrap_or_else(|e| vec![format!("{e:#}")]) {
            println!("  {line}");
        }
    }
    println!("after the upgrade to {UPGRADE_CLASS}:");
    for object in upgraded_objects {
        println!("  {object}");
    }
    println!("running after the upgrade:");
    for pod in &running_after {
        let kept = running.iter().any(|before| before.uid == pod.uid);
        println!("  {pod}{}", if kept { " (kept)" } else { " (new)" });
    }
    let pruned: Vec<&workload::PodLine> = running
        .iter()
        .filter(|before| !running_after.iter().any(|after| after.uid == before.uid))
        .collect();
    println!("gone after the upgrade:");
    for pod in pruned {
        println!("  {}/{}", pod.namespace, pod.name);
    }
    println!("lifecycle hooks Cluster API called (time since the demo started; repeated answers folded):");
    for line in hook_summary(&calls.lock().unwrap_or_else(|p| p.into_inner())) {
        println!("  {line}");
    }
    println!("state and kubeconfigs were in {}", dir.display());
    Ok(())
}

/// Keeps metrics-server's APIService in the release copy at `release` but has the health gates leave it out
/// (`clusterstack.x-k8s.io/skip-health-check`, through the chart's own `apiService.annotations`): the simulated
/// pods have no network, so the API server's check of it fails (on this machine: `cso_testenv::egress`) and it
/// never becomes Available (a real cluster serves it). The demo prints what the check found. Everything else
/// of the release is as bundled.
fn metrics_api_service_not_judged(release: &Path) -> anyhow::Result<()> {
    let file = release.join("cluster-addon-values.yaml");
    let values =
        std::fs::read_to_string(&file).with_context(|| format!("failed to read {}", file.display()))?;
    let key = "  metrics-server:\n";
    if !values.contains(key) {
        bail!("{} has no metrics-server values", file.display());
    }
    let not_judged = format!(
        "{key}    apiService:\n      annotations:\n        {}: \"true\"\n",
        cso_apply::health::SKIP_ANNOTATION
    );
    let values = values.replacen(key, &not_judged, 1);
    std::fs::write(&file, values).with_context(|| format!("failed to write {}", file.display()))
}

/// metrics-server's APIService, as the ferrol addons apply it.
const METRICS_API_SERVICE: &str = "v1beta1.metrics.k8s.io";

/// What the workload API server's check of metrics-server's APIService found: `Available=<status> (<reason>:
/// <message>)`, once it has checked (up to 30 s); with `real` pods, once it is Available (up to 120 s).
async fn api_service_check(workload: &kube::Client, real: bool) -> anyhow::Result<String> {
    use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
    let api_services: Api<APIService> = Api::all(workload.clone());
    let limit = Duration::from_secs(if real { 120 } else { 30 });
    let deadline = Instant::now() + limit;
    loop {
        let checked = api_services
            .get_opt(METRICS_API_SERVICE)
            .await
            .context("failed to read the APIService")?;
        let available = checked
            .and_then(|a| a.status)
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .find(|c| c.type_ == "Available");
        match available {
            Some(c)
                if c.status == "True" || (!real && c.reason.as_deref() == Some("FailedDiscoveryCheck")) =>
            {
                return Ok(format!(
                    "Available={} ({}: {})",
                    c.status,
                    c.reason.unwrap_or_default(),
                    c.message.unwrap_or_default()
                ));
            }
            other if Instant::now() > deadline => bail!("not Available within {limit:?}: {other:?}"),
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// The workload cluster's pods once none of ferrol v1's `web` Deployment is left (v2 has none: pruned; its pods
/// go with it), up to 60 s.
async fn pods_without_web(workload: &kube::Client) -> anyhow::Result<Vec<workload::PodLine>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pods = workload::pods(workload).await?;
        let web: Vec<&workload::PodLine> = pods.iter().filter(|p| p.name.starts_with("web-")).collect();
        if web.is_empty() {
            return Ok(pods);
        }
        if Instant::now() > deadline {
            bail!("web's pods are still there 60s after the upgrade pruned it: {web:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One lifecycle hook call Cluster API made: when (since the demo started), which hook, how it was answered.
#[derive(Clone, Debug)]
struct HookCall {
    at: Duration,
    hook: Hook,
    result: &'static str,
}

/// The hook server with certificates in `DIR/hook-certs`, registered with Cluster API (ExtensionConfig
/// `cso-demo`); every answered call is recorded in `calls`.
async fn start_hook_server(
    client: &kube::Client,
    dir: &Path,
    started: Instant,
    calls: Arc<Mutex<Vec<HookCall>>>,
) -> anyhow::Result<TlsServer> {
    let certs = dir.join("hook-certs");
    let ca = cso_testenv::pki::write_serving_certificate(&certs)?;
    let observe: cso_webhook::hooks::HookObserver = Arc::new(move |hook, outcome, _took| {
        calls.lock().unwrap_or_else(|p| p.into_inner()).push(HookCall {
            at: started.elapsed(),
            hook,
            result: outcome.result_label(),
        });
    });
    let server = TlsServer::start(
        cso_webhook::hook_router(client.clone(), observe),
        "127.0.0.1:0".parse()?,
        &certs,
    )
    .await?;
    let url = format!("https://127.0.0.1:{}", server.local_addr.port());
    cso_testenv::capi::register_extension(client, "cso-demo", &url, &ca, &[NAMESPACE.to_owned()]).await?;
    cso_testenv::capi::discovered_hooks(client, "cso-demo", Duration::from_secs(60)).await?;
    Ok(server)
}

/// The calls, one line per run of answers of one hook: `+12.3s  BeforeClusterUpgrade  retry x2, success`.
fn hook_summary(calls: &[HookCall]) -> Vec<String> {
    /// Consecutive calls of one hook: when the first came, and each answer with how often it was given.
    struct Run {
        at: Duration,
        hook: Hook,
        answers: Vec<(&'static str, usize)>,
    }
    let mut runs: Vec<Run> = Vec::new();
    for call in calls {
        match runs.last_mut() {
            Some(run) if run.hook == call.hook => match run.answers.last_mut() {
                Some((result, count)) if *result == call.result => *count += 1,
                _ => run.answers.push((call.result, 1)),
            },
            _ => runs.push(Run {
                at: call.at,
                hook: call.hook,
                answers: vec![(call.result, 1)],
            }),
        }
    }
    runs.into_iter()
        .map(|run| {
            let answers: Vec<String> = run
                .answers
                .into_iter()
                .map(|(result, count)| {
                    if count > 1 {
                        format!("{result} x{count}")
                    } else {
                        result.to_owned()
                    }
                })
                .collect();
            format!(
                "+{:>6.1}s  {:<30} {}",
                run.at.as_secs_f64(),
                run.hook.as_str(),
                answers.join(", ")
            )
        })
        .collect()
}

fn capi_api(client: &kube::Client, group: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1beta2", kind), plural);
    Api::namespaced_with(client.clone(), NAMESPACE, &resource)
}

/// Creates the Cluster with a topology of [`CLUSTER_CLASS`] (Cluster API builds it; the stand-in makes its
/// control plane initialised and points it at the workload cluster) and waits until its ClusterAddon is
/// ready; returns what was applied into the workload cluster.
async fn install_addons(client: &kube::Client) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let cluster: DynamicObject = serde_json::from_value(
        TopologyCluster {
            namespace: NAMESPACE,
            name: CLUSTER,
            api_version: "cluster.x-k8s.io/v1beta2",
            class: CLUSTER_CLASS,
            class_namespace: None,
            version: "v1.27.3",
            worker_class: "workeramd64",
            worker_replicas: 0,
            image_repository: Some("registry.k8s.io"),
        }
        .to_json(),
    )?;
    capi_api(client, "cluster.x-k8s.io", "Cluster", "clusters")
        .create(&PostParams::default(), &cluster)
        .await
        .context("Cluster API refused the Cluster")?;
    addons_ready(client, CLUSTER_CLASS).await
}

/// Moves the Cluster to [`UPGRADE_CLASS`] at [`UPGRADE_VERSION`] and waits until the addons of v2 are
/// applied and Cluster API has finished the upgrade (no hook pending, the control plane at the version).
async fn upgrade(client: &kube::Client) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let clusters = capi_api(client, "cluster.x-k8s.io", "Cluster", "clusters");
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"topology": {
                "classRef": {"name": UPGRADE_CLASS}, "version": UPGRADE_VERSION}}})),
        )
        .await
        .context("Cluster API refused the upgrade")?;
    let objects = addons_ready(client, UPGRADE_CLASS).await?;
    let control_planes = capi_api(
        client,
        "controlplane.cluster.x-k8s.io",
        "KubeadmControlPlane",
        "kubeadmcontrolplanes",
    );
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let cluster = serde_json::to_value(clusters.get(CLUSTER).await?)?;
        let pending = cluster
            .pointer("/metadata/annotations/runtime.cluster.x-k8s.io~1pending-hooks")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let control_plane = cluster
            .pointer("/spec/controlPlaneRef/name")
            .and_then(serde_json::Value::as_str);
        let reached = match control_plane {
            Some(name) => {
                control_planes
                    .get_opt(name)
                    .await?
                    .map(serde_json::to_value)
                    .transpose()?
                    .and_then(|kcp| kcp.pointer("/status/version").cloned())
                    == Some(serde_json::json!(UPGRADE_VERSION))
            }
            None => false,
        };
        if pending.is_empty() && reached {
            return Ok(objects);
        }
        if Instant::now() > deadline {
            bail!("Cluster API did not finish the upgrade within 180s (pending hooks: {pending:?})");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the ClusterAddon is ready with the addons of `class`; returns what it applied and, in the order
/// first seen, what its conditions said it waited for meanwhile.
async fn addons_ready(client: &kube::Client, class: &str) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let addons: Api<ClusterAddon> = Api::namespaced(client.clone(), NAMESPACE);
    let name = cso_api::cluster_addon::cluster_addon_name(CLUSTER);
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut waited_for: Vec<String> = Vec::new();
    loop {
        let addon = addons.get_opt(&name).await?;
        let status = addon.as_ref().and_then(|a| a.status.as_ref());
        let of_class = addon
            .as_ref()
            .is_some_and(|a| a.spec.cluster_stack == class && a.spec.hook.is_empty());
        if of_class && let Some(status) = status.filter(|s| !s.ready) {
            for condition in &status.conditions {
                if condition.status == cso_api::conditions::ConditionStatus::False
                    && let Some(message) = condition.message.as_deref().filter(|m| !m.is_empty())
                {
                    // `Ready` repeats the message of the condition that holds it.
                    if !waited_for.iter().any(|seen| seen == message) {
                        waited_for.push(message.to_owned());
                    }
                }
            }
        }
        if of_class && status.is_some_and(|s| s.ready) {
            let mut objects: Vec<String> = status
                .iter()
                .flat_map(|s| &s.resources)
                .map(|o| match o.namespace.as_str() {
                    "" => format!("{} {}", o.kind, o.name),
                    ns => format!("{} {ns}/{}", o.kind, o.name),
                })
                .collect();
            objects.sort();
            return Ok((objects, waited_for));
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
            bail!("the addons of {class} were not applied within 180s: {why}");
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
