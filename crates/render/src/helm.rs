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
    /// and `.Capabilities` holds the cluster's own API versions. With `--take-ownership` (Helm 3.17 and
    /// later), because the objects are the operator's, not a Helm release's: Helm 4 otherwise refuses to
    /// render a chart whose objects exist without Helm's release annotations.
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
    /// Whether this helm knows `--take-ownership`, asked once.
    takes_ownership: tokio::sync::OnceCell<bool>,
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
            takes_ownership: tokio::sync::OnceCell::new(),
        })
    }

    /// Whether `helm version` names a release with `--take-ownership` (3.17 or later); a version that cannot be
    /// read counts as recent.
    async fn takes_ownership(&self) -> bool {
        *self
            .takes_ownership
            .get_or_init(|| async {
                let version = self
                    .command()
                    .args(["version", "--template", "{{.Version}}"])
                    .stdin(Stdio::null())
                    .output()
                    .await
                    .ok()
                    .filter(|o| o.status.success())
                    .and_then(|o| parse_version(&String::from_utf8_lossy(&o.stdout)));
                tracing::debug!(?version, binary = %self.binary.display(), "helm version");
                knows_take_ownership(version)
            })
            .await
    }

    /// `helm` with its private home directories.
    fn command(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.binary);
        command
            .env("HELM_CACHE_HOME", self.private_dir("cache"))
            .env("HELM_CONFIG_HOME", self.private_dir("config"))
            .env("HELM_DATA_HOME", self.private_dir("data"))
            .kill_on_drop(true);
        command
    }

    fn arguments(request: &RenderRequest, take_ownership: bool) -> Vec<String> {
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
            if take_ownership {
                args.push("--take-ownership".to_owned());
            }
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
            let take_ownership = request.target_kubeconfig.is_some() && self.takes_ownership().await;
            let mut child = self
                .command()
                .args(Self::arguments(&request, take_ownership))
                .current_dir(chart.parent().unwrap_or(Path::new("/")))
                .stdin(if request.values.is_some() {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
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

/// `--take-ownership` came with Helm 3.17; an unreadable version counts as recent.
fn knows_take_ownership(version: Option<(u32, u32)>) -> bool {
    !matches!(version, Some((major, minor)) if major < 3 || (major == 3 && minor < 17))
}

/// `(major, minor)` of a Helm version such as `v3.20.2` or `v4.3`.
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.trim().strip_prefix('v')?.split(['.', '+', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helm_versions_are_read_as_major_and_minor() {
        assert_eq!(parse_version("v3.20.2"), Some((3, 20)));
        assert_eq!(parse_version("v4.3\n"), Some((4, 3)));
        assert_eq!(parse_version("v3.16.4+g2f5ae68"), Some((3, 16)));
        assert_eq!(parse_version("3.20.2"), None);
        assert_eq!(parse_version("<no value>"), None);
    }

    #[test]
    fn take_ownership_from_helm_3_17() {
        assert!(knows_take_ownership(Some((4, 3))));
        assert!(knows_take_ownership(Some((3, 17))));
        assert!(!knows_take_ownership(Some((3, 16))));
        assert!(!knows_take_ownership(Some((2, 17))));
        assert!(knows_take_ownership(None));
    }

    #[test]
    fn take_ownership_only_with_a_target_cluster() {
        let offline = RenderRequest {
            chart: "chart.tgz".into(),
            release_name: "r".into(),
            namespace: "ns".into(),
            ..Default::default()
        };
        assert!(
            !Helm::arguments(&offline, true)
                .iter()
                .any(|a| a.contains("dry-run") || a.contains("ownership"))
        );
        let live = RenderRequest {
            target_kubeconfig: Some("/k".into()),
            ..offline
        };
        let args = Helm::arguments(&live, true);
        assert!(
            args.contains(&"--dry-run=server".to_owned()) && args.contains(&"--take-ownership".to_owned())
        );
        assert!(!Helm::arguments(&live, false).contains(&"--take-ownership".to_owned()));
    }
}
