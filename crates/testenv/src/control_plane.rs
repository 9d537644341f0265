//! One local Kubernetes control plane: etcd and kube-apiserver on loopback ports, with generated
//! certificates and an admin kubeconfig. On its own it runs no controllers and has no nodes: no garbage
//! collection through owner references, namespaces never finish terminating, and Deployments, DaemonSets and
//! Jobs never get a status. [`crate::workloads`] adds kube-controller-manager, kube-scheduler and simulated
//! nodes (kwok) to one, so that workloads run ([`ControlPlane::start_with_workloads`]).

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{Error, Tools, pki::Pki, process::Supervised};

const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(60);
const APISERVER_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Starts of one control plane before a lost race for its ports fails it.
const PORT_RACE_ATTEMPTS: u32 = 3;

/// A running etcd + kube-apiserver pair. Dropping it stops both.
#[derive(Debug)]
pub struct ControlPlane {
    name: String,
    dir: PathBuf,
    server_url: String,
    kubeconfig_path: PathBuf,
    kubeconfig_yaml: String,
    ca_cert: PathBuf,
    sa_private_key: PathBuf,
    // Field order is drop order: the API server stops before its etcd.
    apiserver: Supervised,
    etcd: Supervised,
    _tempdir: Option<tempfile::TempDir>,
}

impl ControlPlane {
    /// Starts a control plane whose files (certificates, etcd data, logs, kubeconfig) live in `dir`, or in a
    /// temporary directory removed on drop.
    ///
    /// Its ports are picked free, then bound by etcd and kube-apiserver a moment later; another process (a
    /// test binary running beside this one) may take one in between. That start is tried again on new ports,
    /// up to [`PORT_RACE_ATTEMPTS`] times.
    ///
    /// Before anything starts, the addresses its clusters will use are kept on this machine
    /// ([`crate::egress::ensure`]).
    pub async fn start(tools: &Tools, name: &str, dir: Option<&Path>) -> Result<Self, Error> {
        crate::egress::ensure()?;
        let mut attempt = 1;
        loop {
            match Self::start_once(tools, name, dir).await {
                Err(Error::Process(message))
                    if message.contains("address already in use") && attempt < PORT_RACE_ATTEMPTS =>
                {
                    eprintln!("control plane {name}: a port was taken meanwhile; starting again on others");
                    if let Some(dir) = dir {
                        let _ = std::fs::remove_dir_all(dir.join("etcd"));
                    }
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn start_once(tools: &Tools, name: &str, dir: Option<&Path>) -> Result<Self, Error> {
        let (tempdir, dir) = match dir {
            Some(dir) => (None, dir.to_path_buf()),
            None => {
                let tmp = tempfile::Builder::new()
                    .prefix(&format!("cso-{name}-"))
                    .tempdir()
                    .map_err(|e| Error::io(Path::new("/tmp"), e))?;
                let path = tmp.path().to_path_buf();
                (Some(tmp), path)
            }
        };
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let pki = Pki::generate(&dir)?;

        let (client_port, peer_port, api_port) = (free_port()?, free_port()?, free_port()?);
        // etcd stops last, so its watchdog removes a temporary directory the owner never dropped.
        let orphan_dir = tempdir.as_ref().map(tempfile::TempDir::path);
        let mut etcd = start_etcd(tools, &dir, client_port, peer_port, orphan_dir)?;
        etcd.wait_ready(ETCD_READY_TIMEOUT, Duration::from_millis(100), || {
            etcd_healthy(client_port)
        })
        .await?;

        let mut apiserver = start_apiserver(tools, &dir, &pki, client_port, api_port)?;
        let server_url = format!("https://127.0.0.1:{api_port}");
        let kubeconfig_yaml = render_kubeconfig(name, &server_url, &pki);
        let kubeconfig_path = dir.join("kubeconfig");
        std::fs::write(&kubeconfig_path, &kubeconfig_yaml).map_err(|e| Error::io(&kubeconfig_path, e))?;
        let client = client_from_yaml(&kubeconfig_yaml).await?;
        apiserver
            .wait_ready(APISERVER_READY_TIMEOUT, Duration::from_millis(200), || {
                apiserver_ready(client.clone())
            })
            .await?;

        Ok(ControlPlane {
            name: name.to_owned(),
            dir,
            server_url,
            kubeconfig_path,
            kubeconfig_yaml,
            ca_cert: pki.ca_cert.clone(),
            sa_private_key: pki.sa_private_key.clone(),
            apiserver,
            etcd,
            _tempdir: tempdir,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `https://127.0.0.1:<port>`
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// The admin kubeconfig file.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The admin kubeconfig (what goes into a `<cluster>-kubeconfig` Secret).
    pub fn kubeconfig_yaml(&self) -> &str {
        &self.kubeconfig_yaml
    }

    /// The CA (PEM file) that signed the API server's serving certificate and the admin client certificate.
    pub fn ca_cert_path(&self) -> &Path {
        &self.ca_cert
    }

    /// The private key (PEM file) the API server signs service-account tokens with.
    pub fn service_account_key_path(&self) -> &Path {
        &self.sa_private_key
    }

    /// A new client for the admin user. Build one per async runtime: a client is tied to the runtime it
    /// was created in.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        client_from_yaml(&self.kubeconfig_yaml).await
    }

    /// Process ids of etcd and kube-apiserver (for measuring their memory).
    pub fn pids(&self) -> [u32; 2] {
        [self.etcd.pid(), self.apiserver.pid()]
    }

    /// An error describing the first of etcd and kube-apiserver that has exited, if any.
    pub fn check_running(&mut self) -> Result<(), Error> {
        match self.etcd.exited().or_else(|| self.apiserver.exited()) {
            Some(exit) => Err(Error::Process(format!("control plane {}: {exit}", self.name))),
            None => Ok(()),
        }
    }

    /// Stops kube-apiserver, then etcd.
    pub fn stop(mut self) {
        self.apiserver.stop(Duration::from_secs(10));
        self.etcd.stop(Duration::from_secs(10));
    }
}

/// A client from kubeconfig text.
pub async fn client_from_yaml(yaml: &str) -> Result<kube::Client, Error> {
    kube::Client::try_from(config_from_yaml(yaml).await?).map_err(|e| Error::Kube(e.to_string()))
}

/// A client configuration from kubeconfig text (for a client built some other way than kube's default).
pub async fn config_from_yaml(yaml: &str) -> Result<kube::Config, Error> {
    let kubeconfig = Kubeconfig::from_yaml(yaml).map_err(|e| Error::Kube(e.to_string()))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kube(e.to_string()))
}

/// A port on loopback that nothing listens on now.
pub(crate) fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io(Path::new("127.0.0.1:0"), e))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::io(Path::new("127.0.0.1:0"), e))
}

fn start_etcd(
    tools: &Tools,
    dir: &Path,
    client_port: u16,
    peer_port: u16,
    orphan_dir: Option<&Path>,
) -> Result<Supervised, Error> {
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let mut command = Command::new(&tools.etcd);
    command
        .arg("--data-dir")
        .arg(dir.join("etcd"))
        .args([
            "--listen-client-urls",
            &client_url,
            "--advertise-client-urls",
            &client_url,
        ])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args(["--initial-cluster", &format!("default={peer_url}")])
        .args(["--unsafe-no-fsync", "--log-level", "warn"]);
    Supervised::spawn("etcd", command, &dir.join("etcd.log"), orphan_dir)
}

/// `GET /health` over plain HTTP.
async fn etcd_healthy(port: u16) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        std::io::Result::Ok(response.contains("\"health\":\"true\""))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), attempt).await,
        Ok(Ok(true))
    )
}

fn start_apiserver(
    tools: &Tools,
    dir: &Path,
    pki: &Pki,
    etcd_port: u16,
    port: u16,
) -> Result<Supervised, Error> {
    let mut command = Command::new(&tools.kube_apiserver);
    let path = |p: &Path| p.display().to_string();
    command.args([
        format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
        "--bind-address=127.0.0.1".into(),
        "--advertise-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", path(&dir.join("apiserver-certs"))),
        format!("--tls-cert-file={}", path(&pki.serving_cert)),
        format!("--tls-private-key-file={}", path(&pki.serving_key)),
        format!("--client-ca-file={}", path(&pki.ca_cert)),
        "--authorization-mode=RBAC".into(),
        format!("--service-account-issuer=https://127.0.0.1:{port}/"),
        format!("--service-account-key-file={}", path(&pki.sa_public_key)),
        format!("--service-account-signing-key-file={}", path(&pki.sa_private_key)),
        format!("--service-cluster-ip-range={}", crate::egress::SERVICE_CIDR),
        // As kubeadm sets it: a node's kubelet is dialled at its address, never by a name looked up in DNS.
        "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname".into(),
        "--disable-admission-plugins=ServiceAccount".into(),
        "--allow-privileged=true".into(),
        "--enable-priority-and-fairness=false".into(),
        "--profiling=false".into(),
    ]);
    Supervised::spawn("kube-apiserver", command, &dir.join("kube-apiserver.log"), None)
}

/// `GET /readyz` answers `ok`.
async fn apiserver_ready(client: kube::Client) -> bool {
    let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else {
        return false;
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(5), client.request_text(request)).await,
        Ok(Ok(body)) if body.trim() == "ok"
    )
}

fn render_kubeconfig(name: &str, server: &str, pki: &Pki) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {name}
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {name}-admin
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: {name}
  context:
    cluster: {name}
    user: {name}-admin
current-context: {name}
",
        ca = BASE64.encode(&pki.ca_pem),
        cert = BASE64.encode(&pki.admin_cert_pem),
        key = BASE64.encode(&pki.admin_key_pem),
    )
}
