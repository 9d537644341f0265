//! `helm template` behind a small trait. Never touches the network at render time (no
//! `--dependency-update`: a chart must vendor its dependencies), runs with private Helm home directories,
//! is killed on timeout or when the caller gives up, and reports Helm's stderr in its errors.
//!
//! What one render may make the operator hold is bounded: helm's output is read up to
//! [`MAX_OUTPUT_BYTES`] (more is refused and helm is killed at once, before the rest is read), and its
//! stderr up to [`MAX_STDERR_BYTES`] (the rest is read and dropped).

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

/// The most one `helm template` may write to stdout: 16 MiB. Real releases render far less (the largest
/// fixture, Cilium and metrics-server, renders about 120 kB; a chart with all of kube-prometheus-stack's
/// CRDs about 5 MB); parsed into objects, the output takes several times its size in memory, and the
/// operator's Helm chart limits the whole container (operator and helm) to 256 MiB.
pub const MAX_OUTPUT_BYTES: usize = 16 << 20;
/// The most of helm's stderr kept for an error message.
pub const MAX_STDERR_BYTES: usize = 64 << 10;

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
    /// The program could not be started or its output read: `program` is `helm` or `cso-renderer`.
    #[error("failed to run {program} ({binary}): {source}")]
    Spawn {
        program: &'static str,
        binary: PathBuf,
        source: std::io::Error,
    },
    #[error("helm template of {chart} failed: {stderr}")]
    Failed { chart: PathBuf, stderr: String },
    #[error("helm template of {chart} took longer than {timeout:?} and was stopped")]
    Timeout { chart: PathBuf, timeout: Duration },
    /// The long-lived renderer ([`crate::Engine`]) failed as a process: it died, or wrote what cannot be read.
    #[error("the renderer ({binary}) failed while rendering {chart}: {message}")]
    Engine {
        binary: PathBuf,
        chart: PathBuf,
        message: String,
    },
    #[error("helm template of {chart} produced output that is not UTF-8")]
    Output { chart: PathBuf },
    #[error(
        "helm template of {chart} produced more than {limit} bytes ({}), the most one render may produce; it was stopped",
        human_bytes(*.limit)
    )]
    OutputTooLarge { chart: PathBuf, limit: usize },
}

/// `bytes` as MiB or KiB when it is a whole number of them, else as bytes.
pub fn human_bytes(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} bytes")
    }
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
    /// The most stdout one render may produce.
    output_limit: usize,
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
            output_limit: MAX_OUTPUT_BYTES,
            home,
            takes_ownership: tokio::sync::OnceCell::new(),
        })
    }

    /// The same helm with another limit on one render's output (default [`MAX_OUTPUT_BYTES`]).
    pub fn with_output_limit(mut self, bytes: usize) -> Self {
        self.output_limit = bytes;
        self
    }

    /// The most stdout one render may produce.
    pub fn output_limit(&self) -> usize {
        self.output_limit
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
                    program: "helm",
                    binary: self.binary.clone(),
                    source,
                })?;
            let stdin = child.stdin.take();
            let stdout = child.stdout.take();
            let stderr = child.stderr.take();
            let values = request.values;
            let spawn_error = |source| RenderError::Spawn {
                program: "helm",
                binary: self.binary.clone(),
                source,
            };
            let feed = async move {
                if let (Some(values), Some(mut stdin)) = (values, stdin) {
                    // A chart that fails before reading its values closes stdin: the error comes from helm.
                    let _ = stdin.write_all(values.as_bytes()).await;
                }
                Ok(())
            };
            let output = async {
                match read_at_most(stdout, self.output_limit).await {
                    Ok(Some(stdout)) => Ok(stdout),
                    Ok(None) => Err(RenderError::OutputTooLarge {
                        chart: chart.clone(),
                        limit: self.output_limit,
                    }),
                    Err(e) => Err(spawn_error(e)),
                }
            };
            let errors = async { read_keeping(stderr, MAX_STDERR_BYTES).await.map_err(spawn_error) };
            let run = async {
                // Output over the limit ends the other two at once; helm is killed below.
                let ((), stdout, stderr) = tokio::try_join!(feed, output, errors)?;
                let status = child.wait().await.map_err(spawn_error)?;
                Ok((status, stdout, stderr))
            };
            let finished = tokio::time::timeout(self.timeout, run).await;
            if !matches!(finished, Ok(Ok(_))) {
                // Stopped now, not only when `child` is dropped (kill_on_drop).
                let _ = child.start_kill();
            }
            let (status, stdout, stderr) = match finished {
                Ok(result) => result?,
                Err(_) => {
                    return Err(RenderError::Timeout {
                        chart,
                        timeout: self.timeout,
                    });
                }
            };
            if !status.success() {
                let stderr = String::from_utf8_lossy(&stderr).trim().to_owned();
                return Err(RenderError::Failed { chart, stderr });
            }
            String::from_utf8(stdout).map_err(|_| RenderError::Output { chart })
        })
    }
}

/// All of `pipe` if it holds at most `limit` bytes; `None` as soon as it holds more (the rest is not read).
async fn read_at_most(
    pipe: Option<impl AsyncRead + Unpin>,
    limit: usize,
) -> std::io::Result<Option<Vec<u8>>> {
    let Some(pipe) = pipe else {
        return Ok(Some(Vec::new()));
    };
    let mut buffer = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    pipe.take(cap).read_to_end(&mut buffer).await?;
    Ok((buffer.len() <= limit).then_some(buffer))
}

/// The first `keep` bytes of `pipe` (with a note when there was more); the rest is read and dropped, so the
/// writer never blocks.
async fn read_keeping(pipe: Option<impl AsyncRead + Unpin>, keep: usize) -> std::io::Result<Vec<u8>> {
    let Some(mut pipe) = pipe else {
        return Ok(Vec::new());
    };
    let mut buffer = Vec::new();
    (&mut pipe)
        .take(u64::try_from(keep).unwrap_or(u64::MAX))
        .read_to_end(&mut buffer)
        .await?;
    let dropped = tokio::io::copy(&mut pipe, &mut tokio::io::sink()).await?;
    if dropped > 0 {
        buffer.extend_from_slice(format!("\n[{dropped} more bytes of helm's stderr left out]").as_bytes());
    }
    Ok(buffer)
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
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    /// A stand-in for helm: a shell script that runs `body` (and ignores its arguments).
    fn fake_helm(dir: &Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("helm");
        std::fs::write(
            &path,
            format!("#!/bin/sh\n[ \"$FAKE_HELM_PROBE\" = 1 ] && exit 0\n{body}\n"),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Another test of this binary may fork while the script was open for writing; its child holds the
        // file open until it execs, and running the script meanwhile fails with ETXTBSY. Wait until it runs.
        for _ in 0..100 {
            match std::process::Command::new(&path)
                .env("FAKE_HELM_PROBE", "1")
                .status()
            {
                Err(e) if e.raw_os_error() == Some(26) => std::thread::sleep(Duration::from_millis(20)),
                _ => break,
            }
        }
        path
    }

    fn request(dir: &Path) -> RenderRequest {
        RenderRequest {
            chart: dir.join("chart"),
            release_name: "r".into(),
            namespace: "ns".into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn output_over_the_limit_is_refused_without_reading_it_all() {
        let dir = tempfile::tempdir().unwrap();
        // Endless output: only the limit stops it (or the test's timeout).
        let helm = Helm::new(
            fake_helm(dir.path(), "yes 0123456789abcdef"),
            Duration::from_secs(30),
        )
        .unwrap()
        .with_output_limit(1 << 20);
        let started = std::time::Instant::now();
        let err = helm.render(request(dir.path())).await.unwrap_err();
        assert!(
            matches!(err, RenderError::OutputTooLarge { limit, .. } if limit == 1 << 20),
            "{err}"
        );
        assert!(
            err.to_string().contains("more than 1048576 bytes (1 MiB)"),
            "{err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "stopped at the limit"
        );
    }

    #[tokio::test]
    async fn output_up_to_the_limit_and_values_on_stdin_pass() {
        let dir = tempfile::tempdir().unwrap();
        // Echoes its values (stdin) back.
        let helm = Helm::new(fake_helm(dir.path(), "cat"), Duration::from_secs(30))
            .unwrap()
            .with_output_limit(3 << 20);
        let values = "k: v\n".repeat(600_000); // 3 MB, more than a pipe holds
        let rendered = helm
            .render(RenderRequest {
                values: Some(values.clone()),
                ..request(dir.path())
            })
            .await
            .unwrap();
        assert_eq!(rendered, values);
    }

    #[tokio::test]
    async fn a_flood_on_stderr_is_cut_in_the_error_and_does_not_block_helm() {
        let dir = tempfile::tempdir().unwrap();
        let helm = Helm::new(
            fake_helm(dir.path(), "head -c 5000000 /dev/zero | tr '\\0' e >&2; exit 1"),
            Duration::from_secs(30),
        )
        .unwrap();
        let err = helm.render(request(dir.path())).await.unwrap_err();
        let RenderError::Failed { stderr, .. } = &err else {
            panic!("{err}")
        };
        assert!(stderr.len() < MAX_STDERR_BYTES + 100, "{} bytes", stderr.len());
        assert!(
            stderr.ends_with("more bytes of helm's stderr left out]"),
            "{}",
            &stderr[stderr.len() - 80..]
        );
    }

    #[test]
    fn sizes_are_said_in_whole_units() {
        assert_eq!(human_bytes(16 << 20), "16 MiB");
        assert_eq!(human_bytes(64 << 10), "64 KiB");
        assert_eq!(human_bytes(1000), "1000 bytes");
        assert_eq!(human_bytes((1 << 20) + 1), "1048577 bytes");
    }

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
