//! Where releases come from, behind one trait: a local directory, GitHub releases, or an OCI registry.

pub mod github;
pub mod local;
pub mod oci;
pub mod verify;

use std::{path::PathBuf, str::FromStr, sync::Arc, time::Duration};

use cso_api::{Channel, ReleaseId};
use futures::future::BoxFuture;

/// A source of releases. Listing returns every tag; downloading writes one release's files into an empty
/// directory (the cache verifies and publishes them) and says where exactly they came from.
pub trait ReleaseSource: Send + Sync + std::fmt::Debug {
    /// `local`, `github` or `oci`, for logs, metrics and conditions.
    fn kind(&self) -> &'static str;

    /// Every release tag the source has, unfiltered.
    fn list_tags(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>>;

    /// Downloads the files of release `tag` into the empty directory `dest`. With `pin` (a manifest digest),
    /// a tag that points elsewhere is refused ([`Refusal::TagMoved`]) before anything is downloaded; a source
    /// that verifies signatures refuses what does not verify, also before anything is downloaded.
    fn download<'a>(
        &'a self,
        tag: &'a str,
        dest: &'a std::path::Path,
        pin: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Provenance, SourceError>>;

    /// Whether a release cached with `provenance` (none: cached by the Go operator or an older cso) may be
    /// used as it is, or must be fetched again: a source that verifies signatures accepts only what a key
    /// it trusts now signed.
    fn accepts(&self, provenance: Option<&Provenance>) -> bool {
        let _ = provenance;
        true
    }

    /// Whether this source checks signatures (`--verify-key` given, for a source that can).
    fn verifies(&self) -> bool {
        false
    }

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
    /// `--verify-key`: every OCI release must carry a cosign signature by one of these keys.
    pub verify_keys: Vec<verify::TrustedKey>,
}

/// Builds the source the settings and the environment (`GIT_*`, `OCI_*`) describe.
pub fn from_settings(settings: &SourceSettings) -> Result<Arc<dyn ReleaseSource>, SourceError> {
    if settings.local {
        return Ok(Arc::new(local::LocalSource::new(
            settings.release_dir.join(crate::cache::CLUSTER_STACKS_DIR),
        )));
    }
    Ok(match settings.kind {
        SourceKind::Github => Arc::new(
            github::GithubSource::new(github::GithubConfig::from_env(&settings.github_api_url)?)?
                .requiring_signatures(!settings.verify_keys.is_empty()),
        ),
        SourceKind::Oci => {
            Arc::new(oci::OciSource::new(oci::OciConfig::from_env()?).verifying(settings.verify_keys.clone()))
        }
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
        _pin: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Provenance, SourceError>> {
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
    /// The release is not what it must be (unsigned, signed by no trusted key, or not at its pinned digest):
    /// refused before anything of it was downloaded.
    #[error("release refused ({}): {message}", refusal.reason())]
    Refused {
        refusal: Refusal,
        /// The manifest digest the tag pointed to.
        digest: String,
        message: String,
    },
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

/// Where the files of a cached release came from (the same record as the ClusterStackRelease's
/// `status.source`), kept beside them in [`PROVENANCE_FILE`].
pub use cso_api::cluster_stack_release::ReleaseProvenance as Provenance;

/// The file in a release directory that holds its [`Provenance`] (hidden: the Go operator's layout is the
/// other files, and it ignores this one).
pub const PROVENANCE_FILE: &str = ".cso-provenance.json";

/// What `dir` records, if anything readable (an unreadable record counts as none: the release is then
/// treated as one cached before records were kept).
pub fn read_provenance(dir: &std::path::Path) -> Option<Provenance> {
    let text = std::fs::read(dir.join(PROVENANCE_FILE)).ok()?;
    serde_json::from_slice(&text)
        .inspect_err(|e| tracing::warn!(dir = %dir.display(), error = %e, "unreadable provenance record"))
        .ok()
}

/// Records `provenance` in `dir`.
pub fn write_provenance(dir: &std::path::Path, provenance: &Provenance) -> std::io::Result<()> {
    let text = serde_json::to_vec_pretty(provenance).map_err(std::io::Error::other)?;
    std::fs::write(dir.join(PROVENANCE_FILE), text)
}

/// Why a release was refused, as the `ReleaseVerified` condition and the verification metric say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No signature at all.
    Unsigned,
    /// Signatures, none by a trusted key.
    SignatureMismatch,
    /// Malformed signatures, or signatures of another manifest.
    InvalidSignature,
    /// The version is pinned to a digest and the tag points elsewhere.
    TagMoved,
    /// The signatures could not be read (the registry failed): tried again.
    VerificationFailed,
}

impl Refusal {
    /// The condition reason.
    pub fn reason(self) -> &'static str {
        use cso_api::names::reason;
        match self {
            Refusal::Unsigned => reason::UNSIGNED,
            Refusal::SignatureMismatch => reason::SIGNATURE_MISMATCH,
            Refusal::InvalidSignature => reason::INVALID_SIGNATURE,
            Refusal::TagMoved => reason::TAG_MOVED,
            Refusal::VerificationFailed => reason::VERIFICATION_FAILED,
        }
    }

    /// The metric's `outcome` label.
    pub fn outcome(self) -> &'static str {
        match self {
            Refusal::Unsigned => "unsigned",
            Refusal::SignatureMismatch => "signature_mismatch",
            Refusal::InvalidSignature => "invalid_signature",
            Refusal::TagMoved => "tag_moved",
            Refusal::VerificationFailed => "error",
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
            verify_keys: Vec::new(),
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
