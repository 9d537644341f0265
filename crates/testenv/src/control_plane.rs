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

/// Where a control plane's servers run and listen: loopback of this machine ([`Placement::default`]), or a
/// real node's network namespace, as kind runs a control plane in its control-plane node ([`crate::node`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The address etcd and kube-apiserver listen on and the API server advertises (the `kubernetes`
    /// Service's endpoint).
    pub address: std::net::IpAddr,
    /// The network namespace (`/run/netns/<name>`) they run in; `None` is this machine's own.
    pub netns: Option<String>,
}

impl Default for Placement {
    fn default() -> Self {
        Placement {
            address: std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            netns: None,
        }
    }
}

impl Placement {
    /// A command that runs `program` in this placement's network namespace (only that namespace is entered:
    /// the mounts stay the machine's, which a kubelet and its container runtime must share).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        match &self.netns {
            None => Command::new(program),
            Some(netns) => {
                let mut command = Command::new("nsenter");
                command
                    .arg(format!("--net=/run/netns/{netns}"))
                    .arg("--")
                    .arg(program);
                command
            }
        }
    }

    /// Whether the control plane serves real nodes: then the API server authorizes kubelets (`Node`), admits
    /// what `NodeRestriction` allows, mounts service-account tokens into pods and calls kubelets with a client
    /// certificate.
    pub fn serves_real_nodes(&self) -> bool {
        self.netns.is_some()
    }
}

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
    pki: Pki,
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
        Self::start_placed(tools, name, dir, &Placement::default()).await
    }

    /// [`ControlPlane::start`], with the servers where `placement` says.
    pub async fn start_placed(
        tools: &Tools,
        name: &str,
        dir: Option<&Path>,
        placement: &Placement,
    ) -> Result<Self, Error> {
        crate::egress::ensure()?;
        let mut attempt = 1;
        loop {
            match Self::start_once(tools, name, dir, placement).await {
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

    async fn start_once(
        tools: &Tools,
        name: &str,
        dir: Option<&Path>,
        placement: &Placement,
    ) -> Result<Self, Error> {
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
        let pki = Pki::generate_for(&dir, &[placement.address.to_string()])?;
        let host = placement.address;

        let (client_port, peer_port, api_port) = (free_port()?, free_port()?, free_port()?);
        // etcd stops last, so its watchdog removes a temporary directory the owner never dropped.
        let orphan_dir = tempdir.as_ref().map(tempfile::TempDir::path);
        let mut etcd = start_etcd(tools, &dir, placement, client_port, peer_port, orphan_dir)?;
        etcd.wait_ready(ETCD_READY_TIMEOUT, Duration::from_millis(100), || {
            etcd_healthy(host, client_port)
        })
        .await?;

        let mut apiserver = start_apiserver(tools, &dir, &pki, placement, client_port, api_port)?;
        let server_url = format!("https://{}", std::net::SocketAddr::new(host, api_port));
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
            pki,
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

    /// The control plane's certificates, and its CA to sign more (real nodes' certificates).
    pub fn pki(&self) -> &Pki {
        &self.pki
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

/// A port on loopback that nothing listens on now, for a server the environment starts.
///
/// Chosen outside the kernel's ephemeral range (`net.ipv4.ip_local_port_range`): a port from that range (what a
/// bind to port 0 gives) can be taken as the source port of any outgoing connection between this choice and the
/// server's own bind, and a server that cannot bind its webhook port exits after its health check passed. Never the
/// same port twice in one process; the start in the range is random, so processes side by side rarely meet.
pub fn free_port() -> Result<u16, Error> {
    use std::hash::{BuildHasher, Hasher};
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let (low, high) = server_port_range();
    let span = u32::from(high - low) + 1;
    let mut seed = std::collections::hash_map::RandomState::new().build_hasher();
    seed.write_u32(std::process::id());
    let start = (seed.finish() % u64::from(span)) as u32;
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    for step in 0..span {
        let port = low + ((start + step) % span) as u16;
        if handed_out.contains(&port) {
            continue;
        }
        // Free on loopback and on every address (some servers bind the wildcard), each tried on its own.
        let loopback_free = TcpListener::bind(("127.0.0.1", port)).is_ok();
        if loopback_free && TcpListener::bind(("0.0.0.0", port)).is_ok() {
            handed_out.insert(port);
            return Ok(port);
        }
    }
    Err(Error::Process(format!(
        "no free port on loopback in {low}-{high}"
    )))
}

/// The ports [`free_port`] chooses from: below the ephemeral range when there is room, from 20000 (clear of the
/// fixed ports of the real nodes' kubelets, kube-proxies and etcd, 2379-10259), else above it when there is
/// room there, else 20000-65535.
fn server_port_range() -> (u16, u16) {
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut bounds = text.split_whitespace().map(|n| n.parse::<u16>().ok());
            Some((bounds.next()??, bounds.next()??))
        })
        .unwrap_or((32768, 60999));
    if ephemeral.0 > 22000 {
        (20000, ephemeral.0 - 1)
    } else if ephemeral.1 < 63535 {
        (ephemeral.1 + 1, 65535)
    } else {
        // No room outside it: the whole range above the nodes' ports, and the race this avoids comes back.
        (20000, 65535)
    }
}

fn start_etcd(
    tools: &Tools,
    dir: &Path,
    placement: &Placement,
    client_port: u16,
    peer_port: u16,
    orphan_dir: Option<&Path>,
) -> Result<Supervised, Error> {
    let client_url = format!(
        "http://{}",
        std::net::SocketAddr::new(placement.address, client_port)
    );
    let peer_url = format!(
        "http://{}",
        std::net::SocketAddr::new(placement.address, peer_port)
    );
    let mut command = placement.command(&tools.etcd);
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
async fn etcd_healthy(host: std::net::IpAddr, port: u16) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect((host, port)).await?;
        stream
            .write_all(format!("GET /health HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
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
    placement: &Placement,
    etcd_port: u16,
    port: u16,
) -> Result<Supervised, Error> {
    let mut command = placement.command(&tools.kube_apiserver);
    let path = |p: &Path| p.display().to_string();
    let host = placement.address;
    command.args([
        format!(
            "--etcd-servers=http://{}",
            std::net::SocketAddr::new(host, etcd_port)
        ),
        format!("--bind-address={host}"),
        format!("--advertise-address={host}"),
        format!("--secure-port={port}"),
        format!("--cert-dir={}", path(&dir.join("apiserver-certs"))),
        format!("--tls-cert-file={}", path(&pki.serving_cert)),
        format!("--tls-private-key-file={}", path(&pki.serving_key)),
        format!("--client-ca-file={}", path(&pki.ca_cert)),
        format!(
            "--service-account-issuer=https://{}/",
            std::net::SocketAddr::new(host, port)
        ),
        format!("--service-account-key-file={}", path(&pki.sa_public_key)),
        format!("--service-account-signing-key-file={}", path(&pki.sa_private_key)),
        format!("--service-cluster-ip-range={}", crate::egress::SERVICE_CIDR),
        // As kubeadm sets it: a node's kubelet is dialled at its address, never by a name looked up in DNS.
        "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname".into(),
        "--allow-privileged=true".into(),
        "--enable-priority-and-fairness=false".into(),
        "--profiling=false".into(),
    ]);
    if placement.serves_real_nodes() {
        // The aggregation layer as kubeadm sets it up, so that an `APIService` served from a pod (a stack's
        // metrics-server) authenticates the API server's proxied requests: the front proxy's client certificate
        // and the request headers it sets. kubeadm gives the front proxy a CA of its own; here the cluster's CA
        // signs it, and only the name `front-proxy-client` is accepted.
        let (proxy_cert, proxy_key) = pki.sign(dir, "front-proxy-client", "front-proxy-client", None, &[])?;
        command.args([
            format!("--requestheader-client-ca-file={}", path(&pki.ca_cert)),
            "--requestheader-allowed-names=front-proxy-client".into(),
            "--requestheader-username-headers=X-Remote-User".into(),
            "--requestheader-group-headers=X-Remote-Group".into(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
            format!("--proxy-client-cert-file={}", path(&proxy_cert)),
            format!("--proxy-client-key-file={}", path(&proxy_key)),
            // Mutating admission policies (beta, off by default in 1.35): the environment's image substitution
            // (crate::node::substitute_image) is one.
            "--feature-gates=MutatingAdmissionPolicy=true".into(),
            "--runtime-config=admissionregistration.k8s.io/v1beta1=true".into(),
        ]);
        command.args([
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            format!("--kubelet-client-certificate={}", path(&pki.admin_cert)),
            format!("--kubelet-client-key={}", path(&pki.admin_key)),
            format!("--kubelet-certificate-authority={}", path(&pki.ca_cert)),
        ]);
    } else {
        // No kubelet mounts tokens on simulated nodes, and no node authenticates.
        command.args([
            "--authorization-mode=RBAC",
            "--disable-admission-plugins=ServiceAccount",
        ]);
    }
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

/// The metrics (Prometheus text) of the API server `client` talks to.
pub async fn api_server_metrics(client: &kube::Client) -> Result<String, Error> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| Error::Kube(e.to_string()))?;
    client
        .request_text(request)
        .await
        .map_err(|e| Error::Kube(format!("GET /metrics: {e}")))
}

/// The write requests of the kinds an operator makes (server-side apply, patch, delete) the API server of
/// `client` answered, by verb and resource (`APPLY deployments`). Creates and updates are left out: the API
/// server's own bootstrapping and bookkeeping (its Leases, its `kubernetes` endpoints) makes them all the time.
pub async fn api_server_writes(
    client: &kube::Client,
) -> Result<std::collections::BTreeMap<String, f64>, Error> {
    let text = api_server_metrics(client).await?;
    let mut writes = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let label = |name: &str| {
            let start = line.find(&format!("{name}=\""))? + name.len() + 2;
            Some(line[start..].split('"').next()?.to_owned())
        };
        let (Some(verb), Some(resource)) = (label("verb"), label("resource")) else {
            continue;
        };
        if !["PATCH", "APPLY", "DELETE"].contains(&verb.as_str()) {
            continue;
        }
        let count: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_default();
        *writes.entry(format!("{verb} {resource}")).or_default() += count;
    }
    Ok(writes)
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
