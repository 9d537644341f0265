//! `cso-dev up`: a management and a workload control plane on loopback, for development and the quick start
//! (the workload one runs workloads: kube-controller-manager, kube-scheduler and kwok with simulated nodes, see
//! [`cso_testenv::workloads`]),
//! with Cluster API (v1.14, built by `make tools`) on the management one by default: its managers, the
//! provider stand-in for machines ([`cso_testenv::stand_in`]) pointing every Cluster at the workload control
//! plane, hook-server certificates in `DIR/hook-certs` and an `ExtensionConfig` for
//! `https://127.0.0.1:<hook port>` (registered before the managers start, so that the core manager's warm-up
//! finds it at its first start as at every later one; it was a race before), so that `cso run --hook-cert-dir DIR/hook-certs --hook-port 9442` is
//! discovered and called by Cluster API. A Cluster API manager that exits is started again with back-off (see
//! [`crate::restarts`]); any other process that stops on its own stops `up`. `cso-dev status`: what they serve,
//! and the managers' restart counts.

use std::{
    path::Path,
    time::{Duration, Instant, SystemTime},
};

use anyhow::Context;
use cso_testenv::{
    ControlPlane, Tools,
    capi::{ClusterApi, ClusterApiTools, Options, Provider, start_management_with_cluster_api},
    stand_in::{StandIn, Workload},
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use tokio::signal::unix::{SignalKind, signal};

use crate::{
    restarts::{self, Action, BACKOFF, ManagerReport, Supervision},
    workload::{LocalWorkload, NodeChoice},
};

/// The name of the `ExtensionConfig` `cso-dev up` registers.
pub const EXTENSION_NAME: &str = "cso";

/// How `cso-dev up` runs.
#[derive(Clone, Debug)]
pub struct UpOptions {
    /// Leave Cluster API out: only the CRDs of Cluster API v1.10 (`v1beta1`) on the management plane, as
    /// before issue 13.
    pub without_cluster_api: bool,
    /// The port `cso run --hook-port` serves the lifecycle hooks on; the ExtensionConfig points there.
    pub hook_port: u16,
    /// The workload cluster's nodes.
    pub workload_nodes: NodeChoice,
}

/// `cso-dev nodes`: a cluster of real nodes ([`cso_testenv::node::RealCluster`]) until SIGINT or SIGTERM.
pub async fn real_nodes(dir: &Path, nodes: usize, images: &[std::path::PathBuf]) -> anyhow::Result<()> {
    let started = Instant::now();
    let tools = Tools::discover()?;
    if let Err(why) = cso_testenv::node::RealCluster::support(&tools) {
        anyhow::bail!("this machine cannot run real nodes: {why}");
    }
    let dir = fresh_dir(dir)?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let cluster = cso_testenv::node::RealCluster::start(&tools, "real", Some(&dir), nodes).await?;
    for image in images {
        cluster.import_image(image)?;
    }
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, cluster.control_plane.kubeconfig_yaml())?;
    crate::announce(&format!(
        "ready in {:.1}s: {} node(s) ({}), slot {}, API server {}, kubeconfig {}",
        started.elapsed().as_secs_f64(),
        cluster.nodes().len(),
        cluster
            .nodes()
            .iter()
            .map(|n| format!("{} {}", n.name, n.address))
            .collect::<Vec<_>>()
            .join(", "),
        cluster.slot(),
        cluster.control_plane.server_url(),
        kubeconfig.display()
    ));
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    eprintln!("stopping: the nodes, the control plane, then what they left on the machine");
    cluster.stop();
    Ok(())
}

/// `dir`, emptied (created when missing), as an absolute path.
pub fn fresh_dir(dir: &Path) -> anyhow::Result<std::path::PathBuf> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("failed to clean {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    Ok(dir.canonicalize()?)
}

pub async fn up(dir: &Path, options: &UpOptions) -> anyhow::Result<()> {
    let started = Instant::now();
    let tools = Tools::discover()?;
    std::fs::create_dir_all(dir).with_context(|| format!("failed to create {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    for plane in ["management", "workload"] {
        // State of an earlier run (old certificates, old etcd data) is not reused.
        let state = dir.join(plane);
        if state.exists() {
            std::fs::remove_dir_all(&state)
                .with_context(|| format!("failed to clean {}", state.display()))?;
        }
    }
    // Restart counts of an earlier run are not this one's.
    let _ = std::fs::remove_file(dir.join(restarts::STATUS_FILE));
    let (management_dir, workload_dir) = (dir.join("management"), dir.join("workload"));
    // The workload cluster runs workloads: kube-controller-manager, kube-scheduler, and simulated or real nodes.
    let workload_start = async {
        LocalWorkload::start(&tools, &workload_dir, options.workload_nodes)
            .await
            .context("failed to start the workload cluster")
    };
    let (mut management, mut cluster_api, (mut workload, nodes_line)) = if options.without_cluster_api {
        eprintln!(
            "starting the management and workload control planes in {} (without Cluster API)",
            dir.display()
        );
        let (management, workload) = tokio::try_join!(
            async { anyhow::Ok(cso_testenv::start_management(&tools, Some(&management_dir)).await?) },
            workload_start,
        )?;
        (management, None, workload)
    } else {
        let capi = ClusterApiTools::discover()?;
        eprintln!(
            "starting the management control plane with Cluster API {} and the workload control plane in {}",
            capi.version,
            dir.display()
        );
        // The hook server's certificates and its ExtensionConfig, registered before the core manager starts:
        // its warm-up finds it at every start, as on a site where the chart's exists.
        let hook_certs = dir.join("hook-certs");
        let ca = cso_testenv::pki::write_serving_certificate(&hook_certs)?;
        std::fs::write(hook_certs.join("ca.crt"), &ca)?;
        let capi_options = Options {
            extensions_at_start: vec![cso_testenv::capi::Extension {
                name: EXTENSION_NAME.to_owned(),
                url: format!("https://127.0.0.1:{}", options.hook_port),
                ca_pem: ca,
            }],
            ..Options::default()
        };
        let (with_capi, workload) = tokio::try_join!(
            async {
                anyhow::Ok(
                    start_management_with_cluster_api(&tools, &capi, Some(&management_dir), &capi_options)
                        .await?,
                )
            },
            workload_start,
        )?;
        (with_capi.control_plane, Some(with_capi.cluster_api), workload)
    };
    let management_kubeconfig = dir.join("management.kubeconfig");
    let workload_kubeconfig = dir.join("workload.kubeconfig");
    std::fs::write(&management_kubeconfig, management.kubeconfig_yaml())?;
    std::fs::write(&workload_kubeconfig, workload.control_plane().kubeconfig_yaml())?;

    let mut stand_in = None;
    if let Some(cluster_api) = &cluster_api {
        let client = management.client().await?;
        let url = format!("https://127.0.0.1:{}", options.hook_port);
        stand_in = Some(StandIn::start(
            client,
            Workload {
                kubeconfig: workload.control_plane().kubeconfig_yaml().to_owned(),
                server_url: workload.control_plane().server_url().to_owned(),
            },
        ));
        let capi_mib: u64 = cluster_api
            .pids()
            .iter()
            .filter_map(|(_, pid)| cso_testenv::usage::Usage::of(Some(*pid)))
            .map(|usage| usage.rss_kib)
            .sum::<u64>()
            / 1024;
        eprintln!(
            "Cluster API {} running (managers {} MiB resident); ExtensionConfig {EXTENSION_NAME} points at {url}: \
             run `cso run --kubeconfig {} --hook-cert-dir {} --hook-port {}` to be discovered; Clusters get \
             their control plane from the stand-in, with the workload control plane as their API server",
            cluster_api.version(),
            capi_mib,
            management_kubeconfig.display(),
            dir.join("hook-certs").display(),
            options.hook_port,
        );
    }

    eprintln!("workload cluster: {nodes_line}");
    eprintln!(
        "control planes up in {:.1}s; resident memory: management {} MiB, workload {} MiB",
        started.elapsed().as_secs_f64(),
        resident_mib(&management),
        resident_mib(workload.control_plane())
    );
    crate::announce(&format!(
        "ready management={} workload={}",
        management_kubeconfig.display(),
        workload_kubeconfig.display()
    ));

    let mut managers = cluster_api
        .as_ref()
        .map(|c| {
            let hint = format!(
                "the core manager gives up its warm-up when nothing answers on the hook port: once `cso run \
                 --kubeconfig {} --hook-cert-dir {} --hook-port {}` runs, it is discovered at the next start",
                management_kubeconfig.display(),
                dir.join("hook-certs").display(),
                options.hook_port
            );
            ManagerSupervisor::new(&dir, c, hint)
        })
        .transpose()?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut health = tokio::time::interval(Duration::from_secs(1));
    let outcome = loop {
        tokio::select! {
            _ = terminate.recv() => break Ok(()),
            _ = interrupt.recv() => break Ok(()),
            _ = health.tick() => {
                if let Err(e) = management
                    .check_running()
                    .and_then(|()| workload.check_running())
                {
                    // Not restarted: see `cso-dev up --help`.
                    break Err(anyhow::Error::new(e).context(
                        "a control plane stopped on its own; both are stopped (a killed process is not restarted: run `cso-dev up` again)",
                    ));
                }
                if let (Some(supervisor), Some(cluster_api)) = (managers.as_mut(), cluster_api.as_mut())
                    && let Err(e) = supervisor.tick(cluster_api)
                {
                    break Err(e.context("a Cluster API manager could not be started again; both control planes are stopped"));
                }
            }
        }
    };
    eprintln!("stopping the control planes");
    drop(stand_in);
    if let Some(cluster_api) = cluster_api {
        cluster_api.stop();
    }
    management.stop();
    workload.stop();
    outcome
}

/// Prints, for each control plane of `dir`, its server, Kubernetes version and the CRDs it serves; then the
/// Cluster API managers with their restart counts (from [`restarts::STATUS_FILE`]).
pub async fn status(dir: &Path) -> anyhow::Result<()> {
    for plane in ["management", "workload"] {
        let path = dir.join(format!("{plane}.kubeconfig"));
        let yaml = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "no {} (is `cso-dev up --dir {}` running?)",
                path.display(),
                dir.display()
            )
        })?;
        let client = cso_testenv::client_from_yaml(&yaml).await?;
        let version = client
            .apiserver_version()
            .await
            .with_context(|| format!("{plane} does not answer"))?;
        let crds: Api<CustomResourceDefinition> = Api::all(client);
        let mut names: Vec<String> = crds
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter_map(|c| c.metadata.name)
            .collect();
        names.sort();
        println!(
            "{plane}: Kubernetes {} ({} CRDs)",
            version.git_version,
            names.len()
        );
        for name in names {
            println!("  {name}");
        }
    }
    let managers = dir.join(restarts::STATUS_FILE);
    if let Ok(text) = std::fs::read_to_string(&managers) {
        let status: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{} is not JSON", managers.display()))?;
        println!("cluster-api managers (started again with back-off when they exit):");
        for line in restarts::status_lines(&status, SystemTime::now()) {
            println!("  {line}");
        }
    }
    Ok(())
}

/// Observes the Cluster API managers at each health tick, decides with [`restarts::next`] and acts: reports an
/// exit (status and the end of its log) on stderr, starts a manager again once its back-off is over, and keeps
/// [`restarts::STATUS_FILE`] up to date.
struct ManagerSupervisor {
    status_dir: std::path::PathBuf,
    managers: Vec<(Provider, ManagerReport)>,
    /// Said after a core manager exit whose log ends with the warm-up's time-out.
    warm_up_hint: String,
}

/// How the core manager's log says that its warm-up could not discover a runtime extension in time.
const WARM_UP_TIMED_OUT: &str = "ExtensionConfig registry warmup timed out";

impl ManagerSupervisor {
    fn new(dir: &Path, cluster_api: &ClusterApi, warm_up_hint: String) -> anyhow::Result<Self> {
        let now = Instant::now();
        let supervisor = ManagerSupervisor {
            status_dir: dir.to_path_buf(),
            warm_up_hint,
            managers: cluster_api
                .providers()
                .into_iter()
                .map(|provider| {
                    let report = ManagerReport {
                        name: provider.name().to_owned(),
                        supervision: Supervision::started(now, &BACKOFF),
                        last_exit: None,
                    };
                    (provider, report)
                })
                .collect(),
        };
        supervisor.write_status(now)?;
        Ok(supervisor)
    }

    fn tick(&mut self, cluster_api: &mut ClusterApi) -> anyhow::Result<()> {
        let now = Instant::now();
        let mut changed = false;
        for (provider, report) in &mut self.managers {
            let exit = cluster_api.exit_status(*provider);
            let (supervision, action) = restarts::next(report.supervision, exit.is_some(), now, &BACKOFF);
            report.supervision = supervision;
            match action {
                Action::Nothing => continue,
                Action::Exited { ran_for, wait } => {
                    let exit = exit.map_or_else(|| "exited".to_owned(), |status| status.to_string());
                    let log_tail = cluster_api.log_tail(*provider);
                    eprintln!(
                        "cluster-api {} exited ({exit}) after {}s; starting it again in {}s (restart {}); the end of \
                         its log:\n{}",
                        provider.name(),
                        ran_for.as_secs(),
                        wait.as_secs(),
                        report.supervision.restarts + 1,
                        indent(&log_tail),
                    );
                    if *provider == Provider::Core && log_tail.contains(WARM_UP_TIMED_OUT) {
                        eprintln!("({})", self.warm_up_hint);
                    }
                    report.last_exit = Some(exit);
                }
                Action::Restart => {
                    cluster_api
                        .restart(*provider)
                        .with_context(|| format!("failed to start cluster-api {} again", provider.name()))?;
                    eprintln!(
                        "cluster-api {} started again (restart {})",
                        provider.name(),
                        report.supervision.restarts
                    );
                }
            }
            changed = true;
        }
        if changed {
            self.write_status(now)?;
        }
        Ok(())
    }

    fn write_status(&self, now: Instant) -> anyhow::Result<()> {
        let reports: Vec<ManagerReport> = self.managers.iter().map(|(_, r)| r.clone()).collect();
        let status = restarts::status_json(&reports, now, SystemTime::now());
        restarts::write_status(&self.status_dir, &status).with_context(|| {
            format!(
                "failed to write {}",
                self.status_dir.join(restarts::STATUS_FILE).display()
            )
        })
    }
}

/// `text` with every line indented, for log tails inside a message.
fn indent(text: &str) -> String {
    text.lines()
        .map(|line| format!("    {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Resident memory of a control plane's processes (etcd + kube-apiserver), from /proc.
fn resident_mib(plane: &ControlPlane) -> u64 {
    plane
        .pids()
        .iter()
        .filter_map(|pid| cso_testenv::usage::Usage::of(Some(*pid)))
        .map(|usage| usage.rss_kib)
        .sum::<u64>()
        / 1024
}
