//! Where releases come from, behind one trait: a local directory, GitHub releases, or an OCI registry.

pub mod github;
pub mod local;
pub mod oci;

use std::{path::PathBuf, str::FromStr, sync::Arc, time::Duration};

use cso_api::{Channel, ReleaseId};
use futures::future::BoxFuture;

/// A source of releases. Listing returns every tag; downloading writes one release's files into an empty
/// directory (the cache verifies and publishes them).
pub trait ReleaseSource: Send + Sync + std::fmt::Debug {
    /// `local`, `github` or `oci`, for logs, metrics and conditions.
    fn kind(&self) -> &'static str;

    /// Every release tag the source has, unfiltered.
    fn list_tags(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>>;

    /// Downloads the files of release `tag` into the empty directory `dest`.
    fn download<'a>(
        &'a self,
        tag: &'a str,
        dest: &'a std::path::Path,
    ) -> BoxFuture<'a, Result<(), SourceError>>;

    /// Requests left in the current rate-limit window, where the source has one and said so.
    fn rate_limit_remaining(&self) -> Option<i64> {
        None
    }
}

/// The remote kind of source (`--source`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SourceKind {
    #[default]
    Github,
    Oci,
}

impl FromStr for SourceKind {
    type Err = SourceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "github" => Ok(SourceKind::Github),
            "oci" => Ok(SourceKind::Oci),
            other => Err(SourceError::Config(format!(
                "unknown release source {other:?}: use github or oci"
            ))),
        }
    }
}

/// How the operator was told to get releases, as the Go operator's flags say it.
#[derive(Clone, Debug)]
pub struct SourceSettings {
    /// `--source`
    pub kind: SourceKind,
    /// `--local`: releases are already under `<release-dir>/cluster-stacks/`.
    pub local: bool,
    /// `--release-dir`
    pub release_dir: PathBuf,
    /// The GitHub API base URL (GitHub Enterprise, or a stand-in).
    pub github_api_url: String,
}

/// Builds the source the settings and the environment (`GIT_*`, `OCI_*`) describe.
pub fn from_settings(settings: &SourceSettings) -> Result<Arc<dyn ReleaseSource>, SourceError> {
    if settings.local {
        return Ok(Arc::new(local::LocalSource::new(
            settings.release_dir.join(crate::cache::CLUSTER_STACKS_DIR),
        )));
    }
    Ok(match settings.kind {
        SourceKind::Github => Arc::new(github::GithubSource::new(github::GithubConfig::from_env(
            &settings.github_api_url,
        )?)?),
        SourceKind::Oci => Arc::new(oci::OciSource::new(oci::OciConfig::from_env()?)),
    })
}

/// The source the operator was configured with but could not build (a missing `GIT_*` or `OCI_*` variable, a
/// bad URL). Every call answers with that error, so controllers report it in their conditions, as the Go
/// operator does with `AssetsClientAPIAvailable`, instead of the process refusing to start.
#[derive(Debug)]
pub struct UnavailableSource {
    kind: &'static str,
    message: String,
}

impl UnavailableSource {
    pub fn new(kind: SourceKind, error: &SourceError) -> Self {
        UnavailableSource {
            kind: match kind {
                SourceKind::Github => "github",
                SourceKind::Oci => "oci",
            },
            message: match error {
                SourceError::Config(message) => message.clone(),
                other => other.to_string(),
            },
        }
    }
}

impl ReleaseSource for UnavailableSource {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn list_tags(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>> {
        Box::pin(async move { Err(SourceError::Config(self.message.clone())) })
    }

    fn download<'a>(
        &'a self,
        _tag: &'a str,
        _dest: &'a std::path::Path,
    ) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move { Err(SourceError::Config(self.message.clone())) })
    }
}

/// Configuration variables as the Go operator reads them: empty means unset, and trailing newlines (as
/// left by `base64 -d` of a Secret value) are trimmed.
pub(crate) struct Env<F>(pub(crate) F);

impl<F: Fn(&str) -> Option<String>> Env<F> {
    pub(crate) fn get(&self, key: &str) -> Option<String> {
        (self.0)(key)
            .map(|v| v.trim_end_matches(['\n', '\r']).to_owned())
            .filter(|v| !v.is_empty())
    }

    pub(crate) fn required(&self, key: &str) -> Result<String, SourceError> {
        self.get(key)
            .ok_or_else(|| SourceError::Config(format!("environment variable {key} is not set")))
    }
}

/// Installs the ring crypto provider for rustls once per process (the HTTP client is built without a
/// default provider so that the whole binary has one TLS stack).
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Why a source could not answer.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("release source configuration: {0}")]
    Config(String),
    #[error("{what} not found")]
    NotFound { what: String },
    #[error("rate limited by {url}{}", retry_after.map(|d| format!(", retry in {}s", d.as_secs())).unwrap_or_default())]
    RateLimited {
        url: String,
        retry_after: Option<Duration>,
    },
    #[error("{url} answered {status}: {body}")]
    Http { url: String, status: u16, body: String },
    #[error("{url}: {message}")]
    Network { url: String, message: String },
    #[error("integrity check failed: {0}")]
    Integrity(String),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

impl SourceError {
    /// How long to wait before asking again, when the source said so.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            SourceError::RateLimited { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// One cluster stack for one Kubernetes minor: what a ClusterStack follows (defined with the other shared
/// rules in `cso_api`).
pub use cso_api::rules::StackKey;

/// The releases of `stack` in `tags` on `channel`, oldest first. Tags of other stacks are skipped without a
/// word; tags with the stack's prefix that do not parse are skipped with a debug log.
pub fn releases_of(tags: &[String], stack: &StackKey, channel: Channel) -> Vec<ReleaseId> {
    let prefix = stack.tag_prefix();
    let mut releases: Vec<ReleaseId> = tags
        .iter()
        .filter(|tag| tag.starts_with(&prefix))
        .filter_map(|tag| match ReleaseId::parse_tag(tag) {
            Ok(id) => Some(id),
            Err(e) => {
                tracing::debug!(%tag, error = %e, "skipping a release tag that does not parse");
                None
            }
        })
        .filter(|id| stack.contains(id) && id.channel() == channel)
        .collect();
    releases.sort();
    releases.dedup();
    releases
}

#[cfg(test)]
mod tests {
    use cso_api::KubernetesVersion;

    use super::*;

    #[test]
    fn settings_select_the_source_as_the_go_operator_does() {
        let settings = |kind: &str, local: bool| SourceSettings {
            kind: kind.parse().unwrap(),
            local,
            release_dir: "/tmp/downloads".into(),
            github_api_url: github::DEFAULT_API_URL.into(),
        };
        assert_eq!(
            from_settings(&settings("github", true)).unwrap().kind(),
            "local",
            "--local wins over --source"
        );
        assert!(
            "gitlab"
                .parse::<SourceKind>()
                .unwrap_err()
                .to_string()
                .contains("unknown release source")
        );
    }

    #[test]
    fn keeps_only_the_stack_and_channel_asked_for() {
        let tags: Vec<String> = [
            "docker-ferrol-1-27-v10",
            "docker-ferrol-1-27-v9",
            "docker-ferrol-1-28-v11",
            "docker-scs-1-27-v12",
            "openstack-ferrol-1-27-v13",
            "docker-ferrol-1-27-v0-sha-abcdef1",
            "docker-ferrol-1-27-garbage",
            "not-a-release",
            "v1.0.0",
        ]
        .map(String::from)
        .to_vec();
        let stack = StackKey {
            provider: "docker".into(),
            name: "ferrol".into(),
            kubernetes: KubernetesVersion { major: 1, minor: 27 },
        };
        let stable: Vec<String> = releases_of(&tags, &stack, Channel::Stable)
            .iter()
            .map(ReleaseId::tag)
            .collect();
        assert_eq!(stable, ["docker-ferrol-1-27-v9", "docker-ferrol-1-27-v10"]);
        let custom: Vec<String> = releases_of(&tags, &stack, Channel::Custom)
            .iter()
            .map(ReleaseId::tag)
            .collect();
        assert_eq!(custom, ["docker-ferrol-1-27-v0-sha-abcdef1"]);
    }
}
