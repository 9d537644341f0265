//! `cso-dev up --real-nodes`: the management cluster the way a site runs it. A real node
//! ([`cso_testenv::node::RealCluster`]: containerd, kubelet, kube-proxy and cluster DNS, the control plane in the
//! node's network namespace), Cluster API v1.14 beside it in that namespace, and the operator installed by its
//! chart from the image `make image-test` (or `hack/image.sh`) builds, so that `kubectl logs -n cso-system
//! deploy/cso-controller-manager` shows it as on a site. Cluster API finds the operator's hooks through the
//! chart's `ExtensionConfig`; the provider stand-in ([`cso_testenv::stand_in`]) points every Cluster at a workload
//! control plane (with kwok's simulated nodes); the bundled releases are served by a GitHub stand-in. Every
//! server the pods reach listens on this machine's address on the nodes' bridge. Until SIGINT or SIGTERM; then
//! everything is removed from the machine (a watchdog does the same if `cso-dev` is killed).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::Context;
use cso_testenv::{
    ControlPlane, NodeSpec, Tools, WorkloadRuntime,
    capi::{ClusterApi, ClusterApiTools, Options},
    control_plane::Placement,
    github::FakeGithub,
    node::RealCluster,
    stand_in::{StandIn, Workload},
};
use tokio::signal::unix::{SignalKind, signal};

use crate::demo::BUNDLED_RELEASES;

/// The chart in this repository.
const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../charts/cluster-stack-operator");
/// The namespace the chart is installed into.
const NAMESPACE: &str = "cso-system";

pub async fn up_real_nodes(dir: &Path, image: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let tools = Tools::discover()?;
    if let Err(why) = RealCluster::support(&tools) {
        anyhow::bail!("this machine cannot run real nodes: {why}");
    }
    anyhow::ensure!(
        image.is_file(),
        "{} is missing: run `make image-test` (or `bash hack/image.sh`), or give --image",
        image.display()
    );
    let helm = tools.helm.clone().context("helm is missing: run `make tools`")?;
    let capi_tools = ClusterApiTools::discover()?;
    let dir = crate::dev::fresh_dir(dir)?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;

    eprintln!(
        "starting a real node with the management control plane in {}",
        dir.display()
    );
    let cluster = RealCluster::start(&tools, "management", Some(&dir.join("management")), 1).await?;
    cluster.import_image(image)?;
    let cluster_api = ClusterApi::start(
        &capi_tools,
        &cluster.control_plane,
        &Options {
            placement: cluster.placement(0),
            ..Default::default()
        },
    )
    .await?;
    let host = cluster.host_address();
    let github = FakeGithub::start_on(host, 100).await?;
    let mut published = Vec::new();
    for entry in std::fs::read_dir(BUNDLED_RELEASES)?.filter_map(Result::ok) {
        let tag = entry.file_name().to_string_lossy().into_owned();
        github.publish_dir(&tag, &entry.path())?;
        published.push(tag);
    }
    let workload = ControlPlane::start_placed(
        &tools,
        "workload",
        Some(&dir.join("workload")),
        &Placement {
            address: host,
            netns: None,
        },
    )
    .await?;
    let workload_runtime = WorkloadRuntime::start(&tools, &workload, &NodeSpec::numbered("node", 2)).await?;
    let management_kubeconfig = dir.join("management.kubeconfig");
    let workload_kubeconfig = dir.join("workload.kubeconfig");
    std::fs::write(&management_kubeconfig, cluster.control_plane.kubeconfig_yaml())?;
    std::fs::write(&workload_kubeconfig, workload.kubeconfig_yaml())?;
    let stand_in = StandIn::start(
        cluster.control_plane.client().await?,
        Workload {
            kubeconfig: workload.kubeconfig_yaml().to_owned(),
            server_url: workload.server_url().to_owned(),
        },
    );

    eprintln!("installing the chart with {}", image.display());
    helm_install(&helm, &management_kubeconfig, image, github.api_url())?;
    crate::announce(&format!(
        "ready in {:.1}s: management={} workload={}; slot {}, releases {} on a GitHub stand-in at {}\n\
         kubectl --kubeconfig {} logs -n {NAMESPACE} deploy/cso-controller-manager -f",
        started.elapsed().as_secs_f64(),
        management_kubeconfig.display(),
        workload_kubeconfig.display(),
        cluster.slot(),
        published.join(", "),
        github.api_url(),
        management_kubeconfig.display(),
    ));
    // Until a signal, or until a process stops on its own (not restarted: `cso-dev up --help`).
    let mut cluster = cluster;
    let mut cluster_api = cluster_api;
    let mut workload = workload;
    let mut workload_runtime = workload_runtime;
    let mut health = tokio::time::interval(std::time::Duration::from_secs(1));
    let outcome = loop {
        tokio::select! {
            _ = interrupt.recv() => break Ok(()),
            _ = terminate.recv() => break Ok(()),
            _ = health.tick() => {
                let checked = cluster
                    .check_running()
                    .and_then(|()| workload.check_running())
                    .and_then(|()| workload_runtime.check_running())
                    .and_then(|()| cluster_api.check_running());
                if let Err(e) = checked {
                    break Err(anyhow::Error::new(e).context("a process stopped on its own; everything is stopped"));
                }
            }
        }
    };
    eprintln!(
        "stopping: Cluster API, the workload control plane, the node, then what they left on the machine"
    );
    drop(stand_in);
    cluster_api.stop();
    drop(workload_runtime);
    workload.stop();
    cluster.stop();
    outcome
}

/// `helm upgrade --install` of the chart with the image of the archive `image` and the GitHub stand-in as the release source; waits
/// until the Deployment is available.
fn helm_install(helm: &Path, kubeconfig: &Path, image: &Path, github_api_url: &str) -> anyhow::Result<()> {
    let output = Command::new(helm)
        .args([
            "upgrade",
            "--install",
            "cso",
            CHART,
            "--namespace",
            NAMESPACE,
            "--create-namespace",
        ])
        .args(["--wait", "--timeout", "180s"])
        .args(
            cso_testenv::node::chart_image_settings(image)?
                .into_iter()
                .flat_map(|setting| ["--set".to_owned(), setting]),
        )
        .args(["--set", "source=github"])
        .arg("--set")
        .arg(format!("extraArgs[0]=--github-api-url={github_api_url}"))
        // The workload cluster's pods are simulated (kwok): nothing applied there really runs.
        .args(["--set", "extraArgs[1]=--addon-health-checks=false"])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .with_context(|| format!("failed to run {}", helm.display()))?;
    anyhow::ensure!(
        output.status.success(),
        "helm install failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// The image archive `--image` names, or the one `make image-test` writes.
pub fn image_or_default(image: Option<PathBuf>) -> PathBuf {
    image.unwrap_or_else(cso_testenv::node::operator_image_archive)
}
