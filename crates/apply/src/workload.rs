//! Clients for workload clusters, built from the Secret `<cluster>-kubeconfig` (key `value`) the way
//! Cluster API writes it; cached per cluster and rebuilt when the Secret changes; with connect and request
//! timeouts, so that an unreachable cluster costs seconds, not minutes. Readiness is `GET /readyz`. Each
//! cluster comes with its apply engine (which remembers what it applied, to tell drift) and its kubeconfig
//! in a private file, for `helm template --dry-run=server`; and, when the clients are given a
//! [`DriftNotifier`], with the watches that find drift of what the engine applied ([`crate::drift`]).

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client,
    config::{KubeConfigOptions, Kubeconfig},
};

use crate::{
    ApplyEngine, ClusterDiscovery, DEFAULT_FIELD_MANAGER,
    drift::{DriftNotifier, DriftWatch},
};

/// The data key of the kubeconfig in the Secret.
pub const KUBECONFIG_KEY: &str = "value";
/// Cluster API's Secrets (kubeconfig, CA, ...) have this type; Secrets support it as a field selector.
pub const CAPI_SECRET_SELECTOR: &str = "type=cluster.x-k8s.io/secret";
const KUBECONFIG_SECRET_SUFFIX: &str = "-kubeconfig";
/// How long an `ok` from a workload cluster's `/readyz` is taken as current.
pub const READY_STAYS_FRESH: Duration = Duration::from_secs(5);
/// How long the connection of a workload cluster's kube clients stays open after its last request (it is
/// closed within twice that); with drift watches they ride the watches' lean connection
/// ([`crate::Connections::Lean`]) and this one carries only the bodies that cannot go there. Nothing needs it
/// between passes (minutes apart: `--resync-interval`), and an open connection (TLS and HTTP/2 state and
/// hyper's request channel, about 80 KiB) was most of what the operator kept per Cluster: with 2 s, only the
/// Clusters of the last few seconds' passes hold one, which cut the peak at 1000 Clusters by a third
/// (docs/benchmarks.md, issue 42); 15 s cut nothing, an install of 300 Clusters being over in 20 s. Reopening
/// costs a full TLS handshake (no sessions are kept for it); a pass's requests seconds apart (a slow render)
/// may reopen it within the pass.
const IDLE_CONNECTION_RELEASED_AFTER: Duration = Duration::from_secs(2);
/// How long a workload cluster's kube client (its request channel and the task serving it, 25 KiB per Cluster
/// at an install's peak) is kept after it was last asked for; what its discovery found is kept. The drift
/// watches hold none: theirs is a direct client ([`crate::rate_limit::DirectClient`]).
const IDLE_CLIENT_DROPPED_AFTER: Duration = Duration::from_secs(2);

/// The name of the Secret with the kubeconfig of Cluster `cluster`.
pub fn kubeconfig_secret_name(cluster: &str) -> String {
    format!("{cluster}{KUBECONFIG_SECRET_SUFFIX}")
}

/// The Cluster whose kubeconfig Secret is named `secret`, if it is one.
pub fn cluster_of_kubeconfig_secret(secret: &str) -> Option<&str> {
    secret.strip_suffix(KUBECONFIG_SECRET_SUFFIX)
}

/// Why a workload cluster cannot be talked to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    #[error("kubeconfig secret {namespace}/{name} not found")]
    SecretMissing { namespace: String, name: String },
    #[error("kubeconfig secret {namespace}/{name} is unusable: {reason}")]
    SecretInvalid {
        namespace: String,
        name: String,
        reason: String,
    },
    #[error("failed to read kubeconfig secret {namespace}/{name}: {reason}")]
    SecretUnreadable {
        namespace: String,
        name: String,
        reason: String,
    },
    #[error("workload cluster {cluster} is not ready: {reason}")]
    NotReady { cluster: String, reason: String },
}

/// A client for one workload cluster, with its discovery cache.
#[derive(Clone, Debug)]
pub struct WorkloadCluster {
    pub name: String,
    /// The API server's URL, as the kubeconfig names it: Clusters whose kubeconfigs point at one API server
    /// share its objects.
    pub server: String,
    pub discovery: Arc<ClusterDiscovery>,
    /// Applies to this cluster.
    pub engine: ApplyEngine,
    /// The kubeconfig, readable only by this user, for tools such as `helm`.
    pub kubeconfig_path: PathBuf,
    /// The watches of what `engine` applied (when the clients have a notifier).
    pub drift: Option<Arc<DriftWatch>>,
    /// When `/readyz` last answered `ok` ([`WorkloadClients::ready`]).
    ready_at: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

impl WorkloadCluster {
    /// The client to talk to the cluster with (a clone: cheap).
    pub fn client(&self) -> Client {
        self.discovery.client()
    }
}

struct Cached {
    secret_version: String,
    cluster: WorkloadCluster,
}

/// Workload-cluster clients, shared by the controllers.
pub struct WorkloadClients {
    management: Client,
    connect_timeout: Duration,
    request_timeout: Duration,
    take_over_from: Vec<String>,
    limits: crate::ClientLimits,
    drift_notifier: Option<DriftNotifier>,
    kubeconfigs: tempfile::TempDir,
    cache: Mutex<HashMap<(String, String), Cached>>,
}

impl std::fmt::Debug for WorkloadClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cached = self.cache.lock().map(|c| c.len()).unwrap_or_default();
        f.debug_struct("WorkloadClients")
            .field("cached", &cached)
            .finish_non_exhaustive()
    }
}

impl WorkloadClients {
    pub fn new(
        management: Client,
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> std::io::Result<Self> {
        Ok(WorkloadClients {
            management,
            connect_timeout,
            request_timeout,
            take_over_from: Vec::new(),
            limits: crate::ClientLimits::UNLIMITED,
            drift_notifier: None,
            kubeconfigs: tempfile::Builder::new().prefix("cso-workload-").tempdir()?,
            cache: Mutex::default(),
        })
    }

    /// Field managers whose applied fields the engines take over (see [`ApplyEngine::taking_over_from`]).
    pub fn taking_over_from(mut self, managers: impl IntoIterator<Item = String>) -> Self {
        self.take_over_from = managers.into_iter().collect();
        self
    }

    /// `--qps` and `--burst` for each workload cluster's client.
    pub fn with_limits(mut self, limits: crate::ClientLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Each workload cluster's engine comes with drift watches that tell `notifier` (see [`crate::drift`]).
    pub fn watching_drift(mut self, notifier: DriftNotifier) -> Self {
        self.drift_notifier = Some(notifier);
        self
    }

    /// The client of the Cluster `cluster` in `namespace`, rebuilt when its kubeconfig Secret changed.
    pub async fn get(&self, namespace: &str, cluster: &str) -> Result<WorkloadCluster, WorkloadError> {
        self.get_known(namespace, cluster, None).await
    }

    /// [`WorkloadClients::get`], told the kubeconfig Secret's resourceVersion as a watch of Secrets
    /// shows it (`known_version`): when the cached client was built from that version, it is returned
    /// without reading the Secret.
    pub async fn get_known(
        &self,
        namespace: &str,
        cluster: &str,
        known_version: Option<&str>,
    ) -> Result<WorkloadCluster, WorkloadError> {
        let key = (namespace.to_owned(), cluster.to_owned());
        if let Some(known) = known_version
            && let Some(cached) = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key)
            && cached.secret_version == known
        {
            return Ok(cached.cluster.clone());
        }
        let name = kubeconfig_secret_name(cluster);
        let secrets: Api<Secret> = Api::namespaced(self.management.clone(), namespace);
        let secret = match secrets.get_opt(&name).await {
            Ok(Some(secret)) => secret,
            Ok(None) => {
                return Err(WorkloadError::SecretMissing {
                    namespace: namespace.into(),
                    name,
                });
            }
            Err(e) => {
                return Err(WorkloadError::SecretUnreadable {
                    namespace: namespace.into(),
                    name,
                    reason: e.to_string(),
                });
            }
        };
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        if let Some(cached) = self.cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key)
            && cached.secret_version == version
        {
            return Ok(cached.cluster.clone());
        }
        let invalid = |reason: String| WorkloadError::SecretInvalid {
            namespace: namespace.into(),
            name: name.clone(),
            reason,
        };
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(KUBECONFIG_KEY))
            .ok_or_else(|| invalid(format!("no key {KUBECONFIG_KEY:?}")))?;
        let text =
            std::str::from_utf8(&bytes.0).map_err(|_| invalid("the kubeconfig is not UTF-8".into()))?;
        let kubeconfig = Kubeconfig::from_yaml(text).map_err(|e| invalid(e.to_string()))?;
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| invalid(e.to_string()))?;
        let server = config.cluster_url.to_string();
        config.connect_timeout = Some(self.connect_timeout);
        config.write_timeout = Some(self.request_timeout);
        // Bounds each response's start (a watch's comes at once).
        config.read_timeout = Some(self.request_timeout);
        // With drift watches, one lean connection kept while they are carries them and the passes' requests;
        // hyper's pool (without them, everything; with them, the bodies the lean one cannot send at once) is
        // released between passes.
        let idle = crate::IdleConnection::ReleasedAfter(IDLE_CONNECTION_RELEASED_AFTER);
        let connections = if self.drift_notifier.is_some() {
            crate::Connections::Lean
        } else {
            crate::Connections::Pooled
        };
        let maker = crate::rate_limit::ClientMaker::new(config, self.limits, None, idle, connections)
            .map_err(|e| invalid(e.to_string()))?;
        // Kube's clients are made for a pass and dropped after it, with drift watches too: theirs is a direct
        // client on the same connection.
        let discovery = Arc::new(ClusterDiscovery::on_demand(maker, IDLE_CLIENT_DROPPED_AFTER));
        let kubeconfig_path = self
            .kubeconfigs
            .path()
            .join(format!("{namespace}_{cluster}.kubeconfig"));
        write_private(&kubeconfig_path, text.as_bytes())
            .map_err(|e| invalid(format!("failed to store it: {e}")))?;
        let engine = ApplyEngine::new(discovery.clone(), DEFAULT_FIELD_MANAGER)
            .taking_over_from(self.take_over_from.clone());
        let drift = self.drift_notifier.as_ref().map(|notifier| {
            Arc::new(DriftWatch::new(
                key.clone(),
                discovery.clone(),
                engine.clone(),
                notifier.clone(),
            ))
        });
        let built = WorkloadCluster {
            name: cluster.to_owned(),
            server,
            engine,
            discovery,
            kubeconfig_path,
            drift,
            ready_at: Arc::default(),
        };
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(
            key,
            Cached {
                secret_version: version,
                cluster: built.clone(),
            },
        );
        Ok(built)
    }

    /// Forgets the client of a Cluster that is gone.
    pub fn forget(&self, namespace: &str, cluster: &str) {
        self.cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(namespace.to_owned(), cluster.to_owned()));
        let _ = std::fs::remove_file(
            self.kubeconfigs
                .path()
                .join(format!("{namespace}_{cluster}.kubeconfig")),
        );
    }

    /// `GET /readyz` on the workload cluster, within the request timeout; an `ok` less than
    /// [`READY_STAYS_FRESH`] old is taken as it is (a ClusterAddon reconciled again at once, for its own status
    /// write, does not ask again), and so are the cluster's drift watches while every one of them streams
    /// ([`DriftWatch::streaming`]): the periodic pass over an idle fleet asks nothing.
    pub async fn ready(&self, cluster: &WorkloadCluster) -> Result<(), WorkloadError> {
        let not_ready = |reason: String| WorkloadError::NotReady {
            cluster: cluster.name.clone(),
            reason,
        };
        let ready_at = || cluster.ready_at.lock().unwrap_or_else(|p| p.into_inner());
        if ready_at().is_some_and(|at| at.elapsed() < READY_STAYS_FRESH)
            || cluster.drift.as_ref().is_some_and(|drift| drift.streaming())
        {
            return Ok(());
        }
        let answer = self.ask_ready(cluster).await.map_err(not_ready);
        *ready_at() = answer.is_ok().then(std::time::Instant::now);
        answer
    }

    async fn ask_ready(&self, cluster: &WorkloadCluster) -> Result<(), String> {
        let request = http::Request::get("/readyz")
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        match tokio::time::timeout(
            self.request_timeout + self.connect_timeout,
            cluster.client().request_text(request),
        )
        .await
        {
            Ok(Ok(body)) if body.trim() == "ok" => Ok(()),
            Ok(Ok(body)) => Err(format!("/readyz answered {body:?}")),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("/readyz did not answer in time".into()),
        }
    }
}

/// Writes `bytes` to `path` (mode 0600), replacing it atomically.
fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let staging = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&staging)?;
    file.write_all(bytes)?;
    std::fs::rename(staging, path)
}
