//! An OCI registry as a release source: one tag per release; the release's files are the manifest's layers
//! titled with `org.opencontainers.image.title` (untitled layers are skipped, as the Go operator does).
//! Every blob's digest is verified while it is written.

use std::{collections::BTreeSet, path::Path};

use futures::future::BoxFuture;
use oci_client::{
    Client, Reference,
    client::{ClientConfig, ClientProtocol},
    errors::OciErrorCode,
    secrets::RegistryAuth,
};

use super::{ReleaseSource, SourceError};

const TITLE_ANNOTATION: &str = "org.opencontainers.image.title";
const TAGS_PER_PAGE: usize = 1000;

/// Where the releases are and how to authenticate.
#[derive(Clone)]
pub struct OciConfig {
    /// The registry host, e.g. `registry.scs.community`; credentials are sent to it alone.
    pub registry: String,
    /// The repository with its host, e.g. `registry.scs.community/kaas/cluster-stacks`.
    pub repository: String,
    pub auth: RegistryAuth,
    /// Plain HTTP, allowed for loopback registries only (tests and local mirrors).
    pub plain_http: bool,
}

impl std::fmt::Debug for OciConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let auth = match self.auth {
            RegistryAuth::Anonymous => "anonymous",
            RegistryAuth::Basic(..) => "basic",
            RegistryAuth::Bearer(_) => "token",
        };
        f.debug_struct("OciConfig")
            .field("registry", &self.registry)
            .field("repository", &self.repository)
            .field("auth", &auth)
            .field("plain_http", &self.plain_http)
            .finish()
    }
}

impl OciConfig {
    /// From the Go operator's variables: `OCI_REGISTRY`, `OCI_REPOSITORY`, and `OCI_ACCESS_TOKEN` or
    /// `OCI_USERNAME` + `OCI_PASSWORD` (trailing newlines trimmed), plus `OCI_PLAIN_HTTP=true` for loopback.
    /// As in the Go operator, the access token is sent base64-encoded, so existing secrets keep working.
    pub fn from_env() -> Result<Self, SourceError> {
        Self::from_lookup(|key| std::env::var(key).ok())
    }

    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, SourceError> {
        use base64::Engine;
        let env = super::Env(lookup);
        let registry = env.required("OCI_REGISTRY")?;
        let repository = env.required("OCI_REPOSITORY")?;
        if !repository.starts_with(&format!("{registry}/")) {
            return Err(SourceError::Config(format!(
                "OCI_REPOSITORY {repository:?} is not a repository of OCI_REGISTRY {registry:?}"
            )));
        }
        let auth = match (
            env.get("OCI_ACCESS_TOKEN"),
            env.get("OCI_USERNAME"),
            env.get("OCI_PASSWORD"),
        ) {
            (Some(token), _, _) => {
                RegistryAuth::Bearer(base64::engine::general_purpose::STANDARD.encode(token))
            }
            (None, Some(user), Some(password)) => RegistryAuth::Basic(user, password),
            (None, Some(_), None) | (None, None, Some(_)) => {
                return Err(SourceError::Config(
                    "OCI_USERNAME and OCI_PASSWORD go together".into(),
                ));
            }
            (None, None, None) => RegistryAuth::Anonymous,
        };
        let plain_http = env.get("OCI_PLAIN_HTTP").is_some_and(|v| v == "true");
        let host = registry.rsplit_once(':').map_or(registry.as_str(), |(h, _)| h);
        if plain_http && !matches!(host, "127.0.0.1" | "localhost" | "[::1]") {
            return Err(SourceError::Config(format!(
                "OCI_PLAIN_HTTP is only allowed for loopback registries, not {registry}"
            )));
        }
        Ok(OciConfig {
            registry,
            repository,
            auth,
            plain_http,
        })
    }
}

pub struct OciSource {
    config: OciConfig,
    client: Client,
}

impl std::fmt::Debug for OciSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OciSource")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl OciSource {
    pub fn new(config: OciConfig) -> Self {
        crate::source::install_crypto_provider();
        let protocol = if config.plain_http {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        };
        let client = Client::new(ClientConfig {
            protocol,
            ..Default::default()
        });
        OciSource { config, client }
    }

    fn reference(&self, tag: Option<&str>) -> Result<Reference, SourceError> {
        let text = match tag {
            Some(tag) => format!("{}:{tag}", self.config.repository),
            None => self.config.repository.clone(),
        };
        text.parse()
            .map_err(|e| SourceError::Config(format!("OCI reference {text:?}: {e}")))
    }

    fn error(&self, reference: &Reference, error: oci_client::errors::OciDistributionError) -> SourceError {
        use oci_client::errors::OciDistributionError as E;
        let url = reference.whole();
        match error {
            E::ImageManifestNotFoundError(_) => SourceError::NotFound {
                what: format!("OCI artifact {url}"),
            },
            E::ServerError {
                code: 404, message, ..
            } => SourceError::NotFound {
                what: format!("OCI artifact {url}: {message}"),
            },
            E::ServerError { code: 429, .. } => SourceError::RateLimited {
                url,
                retry_after: None,
            },
            E::ServerError { code, message, .. } => SourceError::Http {
                url,
                status: code,
                body: message,
            },
            E::RegistryError { envelope, .. }
                if envelope.errors.iter().any(|e| {
                    matches!(
                        e.code,
                        OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown | OciErrorCode::BlobUnknown
                    )
                }) =>
            {
                SourceError::NotFound {
                    what: format!("OCI artifact {url}: {envelope}"),
                }
            }
            E::RegistryError { envelope, .. }
                if envelope
                    .errors
                    .iter()
                    .any(|e| matches!(e.code, OciErrorCode::Toomanyrequests)) =>
            {
                SourceError::RateLimited {
                    url,
                    retry_after: None,
                }
            }
            E::DigestError(e) => SourceError::Integrity(format!("{url}: {e}")),
            other => SourceError::Network {
                url,
                message: other.to_string(),
            },
        }
    }
}

impl ReleaseSource for OciSource {
    fn kind(&self) -> &'static str {
        "oci"
    }

    fn list_tags(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>> {
        Box::pin(async move {
            let reference = self.reference(Some("latest"))?;
            let mut tags: Vec<String> = Vec::new();
            let mut last: Option<String> = None;
            loop {
                let page = self
                    .client
                    .list_tags(
                        &reference,
                        &self.config.auth,
                        Some(TAGS_PER_PAGE),
                        last.as_deref(),
                    )
                    .await
                    .map_err(|e| self.error(&reference, e))?;
                let count = page.tags.len();
                last = page.tags.last().cloned();
                tags.extend(page.tags);
                if count < TAGS_PER_PAGE || last.is_none() {
                    break;
                }
            }
            Ok(tags)
        })
    }

    fn download<'a>(&'a self, tag: &'a str, dest: &'a Path) -> BoxFuture<'a, Result<(), SourceError>> {
        Box::pin(async move {
            let reference = self.reference(Some(tag))?;
            let (manifest, _digest) = self
                .client
                .pull_image_manifest(&reference, &self.config.auth)
                .await
                .map_err(|e| self.error(&reference, e))?;
            let mut written = BTreeSet::new();
            for layer in &manifest.layers {
                let Some(title) = layer.annotations.as_ref().and_then(|a| a.get(TITLE_ANNOTATION)) else {
                    continue;
                };
                if title.is_empty()
                    || title.starts_with('.')
                    || title.contains(['/', '\\'])
                    || !written.insert(title.clone())
                {
                    return Err(SourceError::Integrity(format!(
                        "{}: layer title {title:?} is not a plain, unique file name",
                        reference.whole()
                    )));
                }
                let path = dest.join(title);
                let file = tokio::fs::File::create(&path)
                    .await
                    .map_err(|source| SourceError::Io {
                        path: path.clone(),
                        source,
                    })?;
                self.client
                    .pull_blob(&reference, layer, file)
                    .await
                    .map_err(|e| self.error(&reference, e))?;
            }
            if written.is_empty() {
                return Err(SourceError::Integrity(format!(
                    "{}: the artifact has no titled files",
                    reference.whole()
                )));
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config(pairs: &[(&str, &str)]) -> Result<OciConfig, SourceError> {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        OciConfig::from_lookup(|k| env.get(k).cloned())
    }

    #[test]
    fn configuration_from_the_go_operators_variables() {
        let base = [
            ("OCI_REGISTRY", "registry.scs.community\n"),
            ("OCI_REPOSITORY", "registry.scs.community/kaas/cluster-stacks\n"),
        ];
        assert!(matches!(config(&base).unwrap().auth, RegistryAuth::Anonymous));
        let token = config(&[base[0], base[1], ("OCI_ACCESS_TOKEN", "abc\n")]).unwrap();
        assert!(
            matches!(&token.auth, RegistryAuth::Bearer(t) if t == "YWJj"),
            "base64 as the Go operator sends it"
        );
        assert!(!format!("{token:?}").contains("YWJj"));
        let basic = config(&[base[0], base[1], ("OCI_USERNAME", "u"), ("OCI_PASSWORD", "p")]).unwrap();
        assert!(matches!(basic.auth, RegistryAuth::Basic(..)));
        assert!(config(&[base[0], base[1], ("OCI_USERNAME", "u")]).is_err());
        assert!(
            config(&[base[0]])
                .unwrap_err()
                .to_string()
                .contains("OCI_REPOSITORY is not set")
        );
        assert!(config(&[base[0], ("OCI_REPOSITORY", "elsewhere.io/x")]).is_err());
        let plain = config(&[base[0], base[1], ("OCI_PLAIN_HTTP", "true")]).unwrap_err();
        assert!(plain.to_string().contains("only allowed for loopback"));
        let local = config(&[
            ("OCI_REGISTRY", "127.0.0.1:5000"),
            ("OCI_REPOSITORY", "127.0.0.1:5000/stacks"),
            ("OCI_PLAIN_HTTP", "true"),
        ]);
        assert!(local.unwrap().plain_http);
    }
}
