//! A real OCI registry on loopback (the CNCF distribution registry, Debian's `docker-registry`), and pushing
//! releases into it the way the stack tooling does: one tag per release, artifact type
//! `application/vnd.scs.cluster-stacks.v1`, one layer per file titled with `org.opencontainers.image.title`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use oci_client::{
    Client, Reference,
    client::{ClientConfig, ClientProtocol, Config, ImageLayer},
    manifest::OciImageManifest,
    secrets::RegistryAuth,
};

use crate::{Error, Tools, process::Supervised};

/// The artifact type of a cluster-stack release.
pub const ARTIFACT_TYPE: &str = "application/vnd.scs.cluster-stacks.v1";
/// The layer media type of a release file (ORAS's default for files).
pub const FILE_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
const TITLE_ANNOTATION: &str = "org.opencontainers.image.title";

/// A running registry. Dropping it stops the registry and removes its storage.
#[derive(Debug)]
pub struct Registry {
    host: String,
    auth: RegistryAuth,
    storage: PathBuf,
    _process: Supervised,
    _dir: tempfile::TempDir,
}

impl Registry {
    /// A registry that anyone may read and write.
    pub async fn start(tools: &Tools) -> Result<Self, Error> {
        Self::start_with(tools, None).await
    }

    /// A registry that requires HTTP basic authentication (htpasswd) for every request.
    pub async fn start_with_basic_auth(tools: &Tools, user: &str, password: &str) -> Result<Self, Error> {
        Self::start_with(tools, Some((user, password))).await
    }

    async fn start_with(tools: &Tools, basic_auth: Option<(&str, &str)>) -> Result<Self, Error> {
        let binary = tools.registry.clone().ok_or_else(|| {
            Error::Tools("docker-registry not found: run `make tools` or set CSO_REGISTRY".into())
        })?;
        let dir = tempfile::Builder::new()
            .prefix("cso-registry-")
            .tempdir()
            .map_err(|e| Error::io(Path::new("/tmp"), e))?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| Error::io(Path::new("127.0.0.1:0"), e))?
            .port();
        let storage = dir.path().join("data");
        let config = dir.path().join("config.yml");
        let text = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
            storage.display()
        );
        let (text, auth) = match basic_auth {
            None => (text, RegistryAuth::Anonymous),
            Some((user, password)) => {
                let hash = bcrypt::hash_with_result(password, 5)
                    .map_err(|e| Error::Tools(format!("bcrypt: {e}")))?
                    .format_for_version(bcrypt::Version::TwoA);
                let htpasswd = dir.path().join("htpasswd");
                std::fs::write(&htpasswd, format!("{user}:{hash}\n")).map_err(|e| Error::io(&htpasswd, e))?;
                let auth_config = format!(
                    "auth:\n  htpasswd:\n    realm: cso-test\n    path: {}\n",
                    htpasswd.display()
                );
                (
                    text + &auth_config,
                    RegistryAuth::Basic(user.to_owned(), password.to_owned()),
                )
            }
        };
        std::fs::write(&config, text).map_err(|e| Error::io(&config, e))?;
        let mut command = Command::new(binary);
        command.arg("serve").arg(&config);
        let mut process = Supervised::spawn(
            "docker-registry",
            command,
            &dir.path().join("registry.log"),
            Some(dir.path()),
        )?;
        let host = format!("127.0.0.1:{port}");
        let listening = || async {
            matches!(
                tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(&host)).await,
                Ok(Ok(_))
            )
        };
        process
            .wait_ready(Duration::from_secs(30), Duration::from_millis(50), listening)
            .await?;
        Ok(Registry {
            host,
            auth,
            storage,
            _process: process,
            _dir: dir,
        })
    }

    /// `127.0.0.1:<port>`
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Where the registry keeps blobs (for tests that tamper with them).
    pub fn storage(&self) -> &Path {
        &self.storage
    }

    fn client(&self) -> Client {
        Client::new(ClientConfig {
            protocol: ClientProtocol::Http,
            ..Default::default()
        })
    }

    /// Pushes the regular files of `dir` as release `tag` of `repository` (e.g. `kaas/cluster-stacks`).
    pub async fn push_release_dir(&self, repository: &str, tag: &str, dir: &Path) -> Result<String, Error> {
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_file()) {
                let data = std::fs::read(entry.path()).map_err(|e| Error::io(&entry.path(), e))?;
                files.push((entry.file_name().to_string_lossy().into_owned(), data));
            }
        }
        files.sort();
        self.push_files(repository, tag, files).await
    }

    /// Pushes `files` as one release artifact; returns the manifest digest.
    pub async fn push_files(
        &self,
        repository: &str,
        tag: &str,
        files: Vec<(String, Vec<u8>)>,
    ) -> Result<String, Error> {
        crate::install_crypto_provider();
        let reference: Reference = format!("{}/{repository}:{tag}", self.host)
            .parse()
            .map_err(|e| Error::Kube(format!("reference: {e}")))?;
        let layers: Vec<ImageLayer> = files
            .into_iter()
            .map(|(name, data)| {
                ImageLayer::new(
                    data,
                    FILE_MEDIA_TYPE.to_owned(),
                    Some(BTreeMap::from([(TITLE_ANNOTATION.to_owned(), name)])),
                )
            })
            .collect();
        let config = Config::new(
            b"{}".to_vec(),
            "application/vnd.oci.empty.v1+json".to_owned(),
            None,
        );
        let mut manifest = OciImageManifest::build(&layers, &config, None);
        manifest.artifact_type = Some(ARTIFACT_TYPE.to_owned());
        let pushed = self
            .client()
            .push(&reference, &layers, config, &self.auth, Some(manifest))
            .await
            .map_err(|e| Error::Kube(format!("push {reference}: {e}")))?;
        Ok(pushed.manifest_url)
    }
}
