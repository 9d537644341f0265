//! `cso demo`: the operator's main job on an embedded default. Starts a local management control plane,
//! runs the controllers with the bundled example stack (ferrol v1 and v2, local source), creates a
//! ClusterStack, waits until both ClusterClasses and their templates are applied, prints what was created
//! and how long each step took, and stops everything.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use cso_api::{ClusterStack, ClusterStackRelease};
use cso_controller::{Operator, Settings};
use cso_release::{ReleaseCache, archive::UnpackLimits, source::local::LocalSource};
use cso_render::{CachingRenderer, Helm, ValuesTemplater, cache::DEFAULT_CAPACITY_BYTES};
use cso_testenv::Tools;
use kube::{Api, api::PostParams};

/// The example releases built into the repository.
pub const BUNDLED_RELEASES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/releases");
const STACK_RELEASES: [&str; 2] = ["docker-ferrol-1-27-v1", "docker-ferrol-1-27-v2"];
const NAMESPACE: &str = "demo";

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
    let kubeconfig = dir.join("management.kubeconfig");
    std::fs::write(&kubeconfig, plane.kubeconfig_yaml())?;
    steps.end("control plane");

    steps.begin("starting the operator with the bundled ferrol stack (local source)");
    let release_dir = dir.join("releases");
    for tag in STACK_RELEASES {
        copy_dir(&releases.join(tag), &release_dir.join("cluster-stacks").join(tag))?;
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
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let controllers = tokio::spawn(cso_controller::run(operator, async move {
        let _ = stopped.await;
    }));
    steps.end("operator start");

    steps.begin("creating ClusterStack demo/ferrol (versions v1, v2) and waiting for its ClusterClasses");
    let outcome = converge(&client).await;
    steps.end("ClusterStack to ready ClusterClasses");

    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(30), controllers).await;
    plane.stop();
    let (releases_ready, inventory) = outcome?;

    println!();
    println!("cso demo: done in {:.1}s", steps.started.elapsed().as_secs_f64());
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
    println!("state and kubeconfig were in {}", dir.display());
    Ok(())
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

fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| format!("failed to read {}", from.display()))? {
        let entry = entry?;
        std::fs::copy(entry.path(), to.join(entry.file_name()))?;
    }
    Ok(())
}
