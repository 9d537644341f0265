//! `cso-dev up`: a management and a workload control plane on loopback, for development and the quick start;
//! `cso-dev status`: what they serve.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Context;
use cso_testenv::{ControlPlane, Tools};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use tokio::signal::unix::{SignalKind, signal};

pub async fn up(dir: &Path) -> anyhow::Result<()> {
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
    eprintln!(
        "starting the management and workload control planes in {}",
        dir.display()
    );
    let (management_dir, workload_dir) = (dir.join("management"), dir.join("workload"));
    let (mut management, mut workload) = tokio::try_join!(
        cso_testenv::start_management(&tools, Some(&management_dir)),
        ControlPlane::start(&tools, "workload", Some(&workload_dir)),
    )?;
    let management_kubeconfig = dir.join("management.kubeconfig");
    let workload_kubeconfig = dir.join("workload.kubeconfig");
    std::fs::write(&management_kubeconfig, management.kubeconfig_yaml())?;
    std::fs::write(&workload_kubeconfig, workload.kubeconfig_yaml())?;

    eprintln!(
        "control planes up in {:.1}s; resident memory: management {} MiB, workload {} MiB",
        started.elapsed().as_secs_f64(),
        resident_mib(&management),
        resident_mib(&workload)
    );
    println!(
        "ready management={} workload={}",
        management_kubeconfig.display(),
        workload_kubeconfig.display()
    );

    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut health = tokio::time::interval(Duration::from_secs(1));
    let outcome = loop {
        tokio::select! {
            _ = terminate.recv() => break Ok(()),
            _ = interrupt.recv() => break Ok(()),
            _ = health.tick() => {
                if let Err(e) = management.check_running().and_then(|()| workload.check_running()) {
                    // Not restarted: see `cso-dev up --help`.
                    break Err(anyhow::Error::new(e).context(
                        "a control plane stopped on its own; both are stopped (a killed process is not restarted: run `cso-dev up` again)",
                    ));
                }
            }
        }
    };
    eprintln!("stopping the control planes");
    management.stop();
    workload.stop();
    outcome
}

/// Prints, for each control plane of `dir`, its server, Kubernetes version and the CRDs it serves.
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
    Ok(())
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
