//! `helm template` behind a small trait. Never touches the network at render time (no
//! `--dependency-update`: a chart must vendor its dependencies), runs with private Helm home directories,
//! is killed on timeout or when the caller gives up, and reports Helm's stderr in its errors.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use futures::future::BoxFuture;
use tokio::io::AsyncWriteExt;

/// What to render.
#[derive(Clone, Debug, Default)]
pub struct RenderRequest {
    /// A chart directory or `.tgz`.
    pub chart: PathBuf,
    pub release_name: String,
    pub namespace: String,
    /// Helm values (YAML), passed on stdin.
    pub values: Option<String>,
    /// `--kube-version`, e.g. `v1.27.3`.
    pub kube_version: Option<String>,
    /// `--api-versions`, e.g. `cilium.io/v2` or `apps/v1/Deployment`.
    pub api_versions: Vec<String>,
    /// `--include-crds`
    pub include_crds: bool,
    /// A kubeconfig of the cluster the objects are for: Helm then renders with `--dry-run=server`, so that
    /// `lookup` sees existing objects (charts such as Cilium otherwise mint new certificates on every render)
    /// and `.Capabilities` holds the cluster's own API versions.
    pub target_kubeconfig: Option<PathBuf>,
}

/// Why a chart could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("failed to run helm ({binary}): {source}")]
    Spawn { binary: PathBuf, source: std::io::Error },
    #[error("helm template of {chart} failed: {stderr}")]
    Failed { chart: PathBuf, stderr: String },
    #[error("helm template of {chart} took longer than {timeout:?} and was stopped")]
    Timeout { chart: PathBuf, timeout: Duration },
    #[error("helm template of {chart} produced output that is not UTF-8")]
    Output { chart: PathBuf },
}

/// Renders charts.
pub trait ChartRenderer: Send + Sync + std::fmt::Debug {
    fn render(&self, request: RenderRequest) -> BoxFuture<'_, Result<String, RenderError>>;
}

/// The `helm` binary (Helm 3 or 4).
#[derive(Debug)]
pub struct Helm {
    binary: PathBuf,
    timeout: Duration,
    home: tempfile::TempDir,
}

impl Helm {
    /// `binary` is a name looked up on `PATH` or a path; a relative path is taken from the current directory
    /// (helm runs in a directory of its own).
    pub fn new(binary: impl Into<PathBuf>, timeout: Duration) -> std::io::Result<Self> {
        let home = tempfile::Builder::new().prefix("cso-helm-").tempdir()?;
        let binary = binary.into();
        let binary = if binary.is_relative() && binary.components().count() > 1 {
            std::env::current_dir()?.join(binary)
        } else {
            binary
        };
        Ok(Helm {
            binary,
            timeout,
            home,
        })
    }

    fn arguments(request: &RenderRequest) -> Vec<String> {
        let mut args = vec![
            "template".to_owned(),
            request.release_name.clone(),
            request.chart.display().to_string(),
            "--namespace".to_owned(),
            request.namespace.clone(),
        ];
        if request.include_crds {
            args.push("--include-crds".to_owned());
        }
        if let Some(version) = &request.kube_version {
            args.extend(["--kube-version".to_owned(), version.clone()]);
        }
        for api in &request.api_versions {
            args.extend(["--api-versions".to_owned(), api.clone()]);
        }
        if let Some(kubeconfig) = &request.target_kubeconfig {
            args.extend([
                "--dry-run=server".to_owned(),
                "--kubeconfig".to_owned(),
                kubeconfig.display().to_string(),
            ]);
        }
        if request.values.is_some() {
            args.extend(["--values".to_owned(), "-".to_owned()]);
        }
        args
    }

    fn private_dir(&self, name: &str) -> PathBuf {
        self.home.path().join(name)
    }
}

impl ChartRenderer for Helm {
    fn render(&self, request: RenderRequest) -> BoxFuture<'_, Result<String, RenderError>> {
        Box::pin(async move {
            let chart = request.chart.clone();
            let mut child = tokio::process::Command::new(&self.binary)
                .args(Self::arguments(&request))
                .current_dir(chart.parent().unwrap_or(Path::new("/")))
                .env("HELM_CACHE_HOME", self.private_dir("cache"))
                .env("HELM_CONFIG_HOME", self.private_dir("config"))
                .env("HELM_DATA_HOME", self.private_dir("data"))
                .stdin(if request.values.is_some() {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|source| RenderError::Spawn {
                    binary: self.binary.clone(),
                    source,
                })?;
            if let (Some(values), Some(mut stdin)) = (request.values, child.stdin.take()) {
                // A chart that fails before reading its values closes stdin: the error comes from helm below.
                let _ = stdin.write_all(values.as_bytes()).await;
            }
            let output = match tokio::time::timeout(self.timeout, child.wait_with_output()).await {
                Ok(output) => output.map_err(|source| RenderError::Spawn {
                    binary: self.binary.clone(),
                    source,
                })?,
                Err(_) => {
                    return Err(RenderError::Timeout {
                        chart,
                        timeout: self.timeout,
                    });
                }
            };
            if !output.status.success() {
                let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
                return Err(RenderError::Failed { chart, stderr });
            }
            String::from_utf8(output.stdout).map_err(|_| RenderError::Output { chart })
        })
    }
}
