//! Cluster API itself in the test environment: the managers of one Cluster API release (v1.14.x, built by
//! `make tools` from the wrapper module `hack/testenv/capi`) running against a local control plane.
//!
//! What a Cluster API installation does through kustomize and cert-manager is done here directly, as envtest
//! does for Go operators:
//!
//! - the CRDs of each provider (`<config>/crd/kustomization.yaml`: its `resources`) get the kustomization's
//!   labels (the contract labels `cluster.x-k8s.io/v1beta1: v1beta1`, `cluster.x-k8s.io/v1beta2: v1beta2`,
//!   which the topology controller reads to pick a template's apiVersion, and the provider label of
//!   `<config>/default/kustomization.yaml`) and, where a `patches` file asks for a conversion webhook, the
//!   conversion webhook at `https://127.0.0.1:<provider's webhook port>/convert` with our CA;
//! - the provider's admission webhooks (`<config>/webhook/manifests.yaml`) are installed with their service
//!   references rewritten to `https://127.0.0.1:<port><path>` and the CA bundle;
//! - each manager runs with the admin kubeconfig, `--leader-elect=false`, the feature gates
//!   `ClusterTopology=true,RuntimeSDK=true`, a serving certificate for `127.0.0.1` and its health and
//!   metrics (plain HTTP) endpoints on loopback ports.
//!
//! The core manager always runs its controllers. The kubeadm bootstrap and control-plane providers and the
//! Docker/Dev infrastructure provider run, by default, for their conversion and admission webhooks only
//! ([`ProviderControllers::WebhooksOnly`]: their controllers watch a namespace that holds nothing), because
//! there is no Docker daemon and no machine here: with [`ProviderControllers::Running`] the Docker provider's
//! controllers fail on the missing `/var/run/docker.sock` and the kubeadm control-plane provider on the
//! missing connection to the workload cluster. What a provider reports about machines must come from a
//! stand-in; Cluster API accepting a ClusterClass and `TopologyReconciled=True` need none
//! (`tests/cluster_api.rs`).
//!
//! Beside the release's own providers, the CRDs of Cluster API Provider OpenStack v0.14.7
//! (`tests/fixtures/crds/capo-v0.14.7/`, see [`capo_crds`]) are installed, so that the OpenStack stacks'
//! templates (`OpenStackClusterTemplate`, `OpenStackMachineTemplate`, `infrastructure…/v1beta1`) are served:
//! CRDs only, with the labels CAPO's kustomizations give them. No CAPO manager runs (CAPO is not on the Go
//! module proxy, so `make tools` cannot build it): its defaulting and validating webhooks are absent, so
//! objects of its kinds are checked against the CRD schemas alone, and no controller acts on them. Its CRDs
//! serve and store `v1beta1` only, so no conversion webhook is needed.
//!
//! Limits: the webhook servers listen on every interface (Cluster API has no flag for the webhook host), and
//! the Docker/Dev provider always starts the debug server of its in-memory backend on port 19000 (all
//! interfaces, not configurable): one Docker/Dev provider per network at a time. A second management plane with
//! Cluster API beside one on loopback runs in a network namespace of its own
//! ([`start_second_management_with_cluster_api`]; for `clusterctl move`, [`crate::clusterctl`]).
//!
//! A manager that exits stays exited unless its owner restarts it ([`ClusterApi::exit_status`],
//! [`ClusterApi::restart`]): the core manager exits when it cannot discover every registered runtime extension
//! within a minute of starting (its `ExtensionConfig` warm-up), which in a cluster its pod's restart would mend.
//!
//! The admission webhooks apply to the whole control plane: start Cluster API on a control plane of its own
//! ([`start_management_with_cluster_api`], [`shared_management_with_cluster_api`]), not on the shared one
//! that carries the Cluster API v1.10 CRDs.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
    time::{Duration, Instant},
};

use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use k8s_openapi::{
    ByteString,
    apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceConversion, CustomResourceDefinition, WebhookClientConfig, WebhookConversion,
    },
};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{
    ControlPlane, Error, Tools,
    control_plane::{Placement, free_port},
    crds, pki,
    process::Supervised,
};

const READY_TIMEOUT: Duration = Duration::from_secs(120);
const FIELD_MANAGER: &str = "cso-testenv";
/// The namespace the providers' controllers watch in [`ProviderControllers::WebhooksOnly`]: it never exists.
pub const WEBHOOKS_ONLY_NAMESPACE: &str = "cso-testenv-capi-webhooks-only";
/// The feature gates every manager runs with.
pub const FEATURE_GATES: &str = "ClusterTopology=true,RuntimeSDK=true";

/// One Cluster API provider of the release `make tools` built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Provider {
    /// The core manager (`sigs.k8s.io/cluster-api/core`): Clusters, ClusterClasses, topology, Runtime SDK.
    Core,
    /// The kubeadm bootstrap provider (`KubeadmConfig`, `KubeadmConfigTemplate`).
    KubeadmBootstrap,
    /// The kubeadm control-plane provider (`KubeadmControlPlane`, `KubeadmControlPlaneTemplate`).
    KubeadmControlPlane,
    /// The Docker/Dev infrastructure provider of `sigs.k8s.io/cluster-api/test` (`DockerClusterTemplate`, ...).
    Docker,
}

impl Provider {
    pub const ALL: [Provider; 4] = [
        Provider::Core,
        Provider::KubeadmBootstrap,
        Provider::KubeadmControlPlane,
        Provider::Docker,
    ];

    /// A short name, used for log files and object names.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Core => "core",
            Provider::KubeadmBootstrap => "kubeadm-bootstrap",
            Provider::KubeadmControlPlane => "kubeadm-control-plane",
            Provider::Docker => "docker",
        }
    }

    /// The variables (hack/tools.sh's env output) with its manager binary and its config directory.
    fn env_keys(self) -> [&'static str; 2] {
        match self {
            Provider::Core => ["CSO_CAPI_MANAGER", "CSO_CAPI_MANAGER_CONFIG"],
            Provider::KubeadmBootstrap => [
                "CSO_CAPI_KUBEADM_BOOTSTRAP_MANAGER",
                "CSO_CAPI_KUBEADM_BOOTSTRAP_CONFIG",
            ],
            Provider::KubeadmControlPlane => [
                "CSO_CAPI_KUBEADM_CONTROL_PLANE_MANAGER",
                "CSO_CAPI_KUBEADM_CONTROL_PLANE_CONFIG",
            ],
            Provider::Docker => ["CSO_CAPI_DOCKER_MANAGER", "CSO_CAPI_DOCKER_CONFIG"],
        }
    }
}

/// The binaries and config directories of one Cluster API release, as `make tools` lists them.
#[derive(Clone, Debug)]
pub struct ClusterApiTools {
    /// `v1.14.2`
    pub version: String,
    pub providers: Vec<ProviderTools>,
}

/// One provider's manager binary and its `config` directory (CRDs, kustomizations, webhook manifests).
#[derive(Clone, Debug)]
pub struct ProviderTools {
    pub provider: Provider,
    pub binary: PathBuf,
    pub config_dir: PathBuf,
}

impl ClusterApiTools {
    /// Reads `CSO_CAPI_MANAGER_VERSION` and each provider's binary and config directory
    /// (`CSO_CAPI_MANAGER` and `CSO_CAPI_MANAGER_CONFIG` for the core, `CSO_CAPI_DOCKER_MANAGER` and
    /// `CSO_CAPI_DOCKER_CONFIG` for the Docker provider, ...); `None` when any is missing.
    fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Option<Self> {
        let version = lookup("CSO_CAPI_MANAGER_VERSION")?;
        let providers = Provider::ALL
            .into_iter()
            .map(|provider| {
                let [binary, config_dir] = provider.env_keys();
                let binary = lookup(binary)?;
                let config_dir = lookup(config_dir)?;
                Some(ProviderTools {
                    provider,
                    binary: binary.into(),
                    config_dir: config_dir.into(),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(ClusterApiTools { version, providers })
    }

    /// Finds them like [`Tools::discover`]: the environment, then the `env` file of the tools cache.
    pub fn discover() -> Result<Self, Error> {
        let env_file = crate::tools::cache_dir().join("env");
        let from_file: BTreeMap<String, String> = std::fs::read_to_string(&env_file)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect();
        let lookup = |key: &str| {
            std::env::var(key)
                .ok()
                .filter(|v| !v.is_empty())
                .or_else(|| from_file.get(key).cloned())
        };
        let tools = Self::from_lookup(lookup).ok_or_else(|| {
            Error::Tools(format!(
                "the Cluster API managers are not built: run `make tools` (writes {}) or set \
                 CSO_CAPI_MANAGER_VERSION, CSO_CAPI_MANAGER, CSO_CAPI_MANAGER_CONFIG and the providers' variables",
                env_file.display()
            ))
        })?;
        for provider in &tools.providers {
            if !provider.binary.is_file() {
                return Err(Error::Tools(format!(
                    "{} does not exist: run `make tools`",
                    provider.binary.display()
                )));
            }
        }
        Ok(tools)
    }

    fn provider(&self, provider: Provider) -> Option<&ProviderTools> {
        self.providers.iter().find(|p| p.provider == provider)
    }
}

/// Whether the providers other than the core run their controllers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProviderControllers {
    /// Conversion and admission webhooks only: the controllers watch [`WEBHOOKS_ONLY_NAMESPACE`].
    #[default]
    WebhooksOnly,
    /// Everything, as in a real installation (the Docker provider's controllers need a Docker daemon).
    Running,
}

/// How to start Cluster API.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub provider_controllers: ProviderControllers,
    /// Extra arguments for the core manager (for example `--v=4`).
    pub core_args: Vec<String>,
    /// Runtime extensions registered before the managers start (after the CRDs, before Cluster API's webhooks
    /// exist), so that the core manager's first warm-up already sees them, as a restarted manager sees a site's
    /// (`cso-dev up`). Those registered later with [`register_extension`] are seen by the running manager only.
    pub extensions_at_start: Vec<Extension>,
    /// Where the managers run: on this machine's loopback (the default), or in a real node's network namespace
    /// ([`crate::node::RealCluster::placement`]) beside that cluster's API server, where they resolve Service
    /// names through the cluster's DNS and reach Services as its pods do (an `ExtensionConfig` with a service
    /// reference). Their health and metrics ports listen on the placement's address.
    pub placement: Placement,
}

/// A runtime extension to register ([`Options::extensions_at_start`]): the `ExtensionConfig` `name` for the
/// server at `url`, trusted through `ca_pem`, for the Clusters of every namespace.
#[derive(Clone, Debug)]
pub struct Extension {
    pub name: String,
    pub url: String,
    pub ca_pem: String,
}

/// One running manager.
#[derive(Debug)]
struct Manager {
    provider: Provider,
    webhook_port: u16,
    health_port: u16,
    metrics_port: u16,
    launch: Launch,
    process: Supervised,
}

/// How a manager is started: kept to start it again the same way (same ports, certificates and flags).
#[derive(Clone, Debug)]
struct Launch {
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Launch {
    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args).envs(self.env.iter().cloned());
        command
    }
}

/// Cluster API's managers running against a control plane. Dropping it stops them (the CRDs and webhook
/// configurations stay in the control plane).
#[derive(Debug)]
pub struct ClusterApi {
    version: String,
    ca_pem: String,
    started_in: Duration,
    address: std::net::IpAddr,
    managers: Vec<Manager>,
}

impl ClusterApi {
    /// Installs the release's CRDs and webhooks into `plane` and starts its managers; returns when every
    /// manager answers `/readyz` and the webhook configurations are in place.
    pub async fn start(
        capi: &ClusterApiTools,
        plane: &ControlPlane,
        options: &Options,
    ) -> Result<Self, Error> {
        let started = Instant::now();
        let dir = plane.dir().join("cluster-api");
        let cert_dir = dir.join("certs");
        std::fs::create_dir_all(&cert_dir).map_err(|e| Error::io(&cert_dir, e))?;
        let ca_pem = pki::write_serving_certificate(&cert_dir)?;
        let client = plane.client().await?;

        let mut ports = BTreeMap::new();
        for provider in Provider::ALL {
            ports.insert(provider, [free_port()?, free_port()?, free_port()?]);
        }

        let mut all_crds = Vec::new();
        for provider in Provider::ALL {
            let tools = capi
                .provider(provider)
                .ok_or_else(|| Error::Tools(format!("no {} provider in the tools", provider.name())))?;
            let webhook_port = ports[&provider][0];
            all_crds.extend(provider_crds(&tools.config_dir, webhook_port, &ca_pem)?);
        }
        all_crds.extend(capo_crds()?);
        crds::install(&client, &all_crds).await?;
        // Before Cluster API's defaulting webhook exists: what it would default is written out here.
        for extension in &options.extensions_at_start {
            let object = extension_config(&extension.name, &extension.url, &extension.ca_pem, &[]);
            Api::<kube::api::DynamicObject>::all_with(client.clone(), &extension_config_resource())
                .patch(
                    &extension.name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&object),
                )
                .await
                .map_err(|e| {
                    Error::Kube(format!(
                        "failed to register the runtime extension {}: {e}",
                        extension.name
                    ))
                })?;
        }

        let mut managers = Vec::new();
        for provider in Provider::ALL {
            let Some(tools) = capi.provider(provider) else {
                continue;
            };
            let [webhook_port, health_port, metrics_port] = ports[&provider];
            let address = options.placement.address;
            let mut args = vec![
                format!("--kubeconfig={}", plane.kubeconfig_path().display()),
                "--leader-elect=false".into(),
                format!("--feature-gates={FEATURE_GATES}"),
                format!("--webhook-port={webhook_port}"),
                format!("--webhook-cert-dir={}", cert_dir.display()),
                format!(
                    "--health-addr={}",
                    std::net::SocketAddr::new(address, health_port)
                ),
                format!(
                    "--diagnostics-address={}",
                    std::net::SocketAddr::new(address, metrics_port)
                ),
                "--insecure-diagnostics".into(),
            ];
            if provider == Provider::Core {
                args.extend(options.core_args.iter().cloned());
            } else if options.provider_controllers == ProviderControllers::WebhooksOnly {
                args.push(format!("--namespace={WEBHOOKS_ONLY_NAMESPACE}"));
            }
            // In a node's namespace through `ip netns exec`, which gives the process the namespace's
            // resolv.conf (`/etc/netns/<namespace>/`): the cluster's DNS.
            let (program, args) = match &options.placement.netns {
                None => (tools.binary.clone(), args),
                Some(netns) => (
                    PathBuf::from("ip"),
                    [
                        vec!["netns".to_owned(), "exec".into(), netns.clone()],
                        vec![tools.binary.display().to_string()],
                        args,
                    ]
                    .concat(),
                ),
            };
            let launch = Launch {
                program,
                args,
                // The Docker provider's in-memory backend advertises this address for its workload API servers.
                env: vec![("POD_IP".into(), address.to_string())],
            };
            let log = dir.join(format!("{}.log", provider.name()));
            let process = Supervised::spawn(
                &format!("cluster-api {}", provider.name()),
                launch.command(),
                &log,
                None,
            )?;
            managers.push(Manager {
                provider,
                webhook_port,
                health_port,
                metrics_port,
                launch,
                process,
            });
        }
        let address = options.placement.address;
        for manager in &mut managers {
            let port = manager.health_port;
            manager
                .process
                .wait_ready(READY_TIMEOUT, Duration::from_millis(200), || {
                    http_ok(address, port, "/readyz")
                })
                .await?;
        }

        for manager in &managers {
            let tools = capi
                .provider(manager.provider)
                .ok_or_else(|| Error::Tools(format!("no {} provider", manager.provider.name())))?;
            install_admission_webhooks(
                &client,
                manager.provider,
                &tools.config_dir,
                manager.webhook_port,
                &ca_pem,
            )
            .await?;
        }

        Ok(ClusterApi {
            version: capi.version.clone(),
            ca_pem,
            started_in: started.elapsed(),
            address,
            managers,
        })
    }

    /// The Cluster API release (`v1.14.2`).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The CA (PEM) of the managers' serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// From the call of [`ClusterApi::start`] until every manager was ready and the webhooks installed.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Process ids of the managers, for measuring their memory.
    pub fn pids(&self) -> Vec<(Provider, u32)> {
        self.managers
            .iter()
            .map(|m| (m.provider, m.process.pid()))
            .collect()
    }

    /// `http://<address>:<port>/metrics` of a provider's manager (plain HTTP, no authentication).
    pub fn metrics_url(&self, provider: Provider) -> Option<String> {
        self.manager(provider).map(|m| {
            format!(
                "http://{}/metrics",
                std::net::SocketAddr::new(self.address, m.metrics_port)
            )
        })
    }

    /// The end of a manager's log, for failure messages.
    pub fn log_tail(&self, provider: Provider) -> String {
        self.manager(provider)
            .map(|m| m.process.log_tail())
            .unwrap_or_default()
    }

    /// The providers whose managers run (or ran), in start order.
    pub fn providers(&self) -> Vec<Provider> {
        self.managers.iter().map(|m| m.provider).collect()
    }

    /// How a provider's manager ended, once it has (`None` while it runs).
    pub fn exit_status(&mut self, provider: Provider) -> Option<std::process::ExitStatus> {
        self.manager_mut(provider)?.process.exit_status()
    }

    /// Starts a provider's manager again after it exited, with the same flags, ports and certificates; its
    /// log goes on in the same file. Returns at once (no wait for `/readyz`): the caller decides when (see
    /// `cso-dev up`, which restarts with back-off as a Deployment restarts its pod).
    pub fn restart(&mut self, provider: Provider) -> Result<(), Error> {
        let manager = self
            .manager_mut(provider)
            .ok_or_else(|| Error::Process(format!("no cluster-api {} manager", provider.name())))?;
        manager.process.restart(manager.launch.command())
    }

    /// An error describing the first manager that has exited, if any.
    pub fn check_running(&mut self) -> Result<(), Error> {
        match self.managers.iter_mut().find_map(|m| m.process.exited()) {
            Some(exit) => Err(Error::Process(exit)),
            None => Ok(()),
        }
    }

    /// Stops the managers.
    pub fn stop(mut self) {
        for manager in &mut self.managers {
            manager.process.stop(Duration::from_secs(10));
        }
    }

    fn manager(&self, provider: Provider) -> Option<&Manager> {
        self.managers.iter().find(|m| m.provider == provider)
    }

    fn manager_mut(&mut self, provider: Provider) -> Option<&mut Manager> {
        self.managers.iter_mut().find(|m| m.provider == provider)
    }
}

/// A management control plane with Cluster API running: our CRDs, the release's CRDs and webhooks, and its
/// managers. Field order is drop order: Cluster API stops before its control plane.
#[derive(Debug)]
pub struct ManagementWithClusterApi {
    pub cluster_api: ClusterApi,
    pub control_plane: ControlPlane,
}

/// Starts a control plane with our CRDs, then Cluster API on it.
pub async fn start_management_with_cluster_api(
    tools: &Tools,
    capi: &ClusterApiTools,
    dir: Option<&Path>,
    options: &Options,
) -> Result<ManagementWithClusterApi, Error> {
    let control_plane = ControlPlane::start(tools, "management", dir).await?;
    let client = control_plane.client().await?;
    crds::install(&client, &cso_api::crd::all()).await?;
    let cluster_api = ClusterApi::start(capi, &control_plane, options).await?;
    Ok(ManagementWithClusterApi {
        cluster_api,
        control_plane,
    })
}

/// A second management control plane with Cluster API, in a network namespace of its own, beside one on this
/// machine's loopback ([`start_second_management_with_cluster_api`]). Field order is drop order: Cluster API,
/// then its control plane, then the namespace (whose teardown kills whatever of the plane is left), then its
/// directory.
#[derive(Debug)]
pub struct SecondManagement {
    pub cluster_api: ClusterApi,
    pub control_plane: ControlPlane,
    pub network: crate::node::NetworkNamespace,
    _dir: Option<tempfile::TempDir>,
}

/// Starts a management control plane with our CRDs and Cluster API as [`start_management_with_cluster_api`]
/// does, but in a network namespace of its own ([`crate::node::NetworkNamespace`]; etcd, kube-apiserver and the
/// four managers at its address, `options.placement` is replaced), so that it can run beside a first one on
/// loopback: the Docker/Dev provider's manager binds port 19000 on every interface, and a second one on the
/// same network exits. For `clusterctl move` between two management clusters ([`crate::clusterctl`]).
///
/// Its API server is reached from this machine at the namespace's address, the managers reach its webhooks on
/// the namespace's loopback, as in a real node's namespace (`cso-dev up --real-nodes`). What its managers must
/// dial on this machine (a workload cluster's API server) must listen on
/// [`crate::node::NetworkNamespace::host_address`]. Files live in `dir`, or in a temporary directory removed on
/// drop. Needs root.
pub async fn start_second_management_with_cluster_api(
    tools: &Tools,
    capi: &ClusterApiTools,
    dir: Option<&Path>,
    options: &Options,
) -> Result<SecondManagement, Error> {
    let (tempdir, dir) = match dir {
        Some(dir) => (None, dir.to_path_buf()),
        None => {
            let tmp = tempfile::Builder::new()
                .prefix("cso-management-2-")
                .tempdir()
                .map_err(|e| Error::io(Path::new("/tmp"), e))?;
            let path = tmp.path().to_path_buf();
            (Some(tmp), path)
        }
    };
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let network = crate::node::NetworkNamespace::take(&dir)?;
    let placement = network.placement();
    let control_plane = ControlPlane::start_placed(
        tools,
        "management-2",
        Some(&dir.join("control-plane")),
        &placement,
    )
    .await?;
    let client = control_plane.client().await?;
    crds::install(&client, &cso_api::crd::all()).await?;
    let options = Options {
        placement,
        ..options.clone()
    };
    let cluster_api = ClusterApi::start(capi, &control_plane, &options).await?;
    Ok(SecondManagement {
        cluster_api,
        control_plane,
        network,
        _dir: tempdir,
    })
}

/// A management control plane with Cluster API (default [`Options`]) shared by all tests of this test
/// binary, started on first use on a thread of its own; it lives until the test binary exits, when the
/// process watchdogs stop it. Panics with the reason when it cannot start.
pub fn shared_management_with_cluster_api() -> &'static ManagementWithClusterApi {
    static SHARED: OnceLock<ManagementWithClusterApi> = OnceLock::new();
    SHARED.get_or_init(|| {
        crate::start_shared(|tools| {
            Box::pin(async move {
                let capi = ClusterApiTools::discover()?;
                start_management_with_cluster_api(tools, &capi, None, &Options::default()).await
            })
        })
    })
}

/// The CRDs of one provider as its `crd` kustomization builds them, with conversion webhooks at `port`.
fn provider_crds(config_dir: &Path, port: u16, ca_pem: &str) -> Result<Vec<CustomResourceDefinition>, Error> {
    let crd_dir = config_dir.join("crd");
    let kustomization = read_yaml(&crd_dir.join("kustomization.yaml"))?;
    let mut labels = kustomization_labels(&kustomization);
    // The provider label of the `default` kustomization (`cluster.x-k8s.io/provider: cluster-api`).
    if let Ok(default) = read_yaml(&config_dir.join("default").join("kustomization.yaml")) {
        labels.extend(kustomization_labels(&default));
    }

    let mut crds = Vec::new();
    for resource in string_list(&kustomization, "resources") {
        let path = crd_dir.join(&resource);
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let docs: Vec<Option<CustomResourceDefinition>> = serde_saphyr::from_multiple(&text)
            .map_err(|e| Error::Kube(format!("{}: not a CRD: {e}", path.display())))?;
        crds.extend(docs.into_iter().flatten());
    }
    for crd in &mut crds {
        let crd_labels = crd.metadata.labels.get_or_insert_with(BTreeMap::new);
        crd_labels.extend(labels.clone());
    }

    // `patches`: the ones that switch a CRD to webhook conversion.
    let patches = kustomization
        .get("patches")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for patch in patches {
        let Some(file) = patch.get("path").and_then(Value::as_str) else {
            continue;
        };
        let patch = read_yaml(&crd_dir.join(file))?;
        let name = patch.pointer("/metadata/name").and_then(Value::as_str);
        let conversion = patch.pointer("/spec/conversion");
        let (Some(name), Some(conversion)) = (name, conversion) else {
            continue;
        };
        if conversion.get("strategy").and_then(Value::as_str) != Some("Webhook") {
            continue;
        }
        let path = conversion
            .pointer("/webhook/clientConfig/service/path")
            .and_then(Value::as_str)
            .unwrap_or("/convert");
        let review_versions = conversion
            .pointer("/webhook/conversionReviewVersions")
            .map(|v| string_array(Some(v)))
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| vec!["v1".to_owned()]);
        let Some(crd) = crds.iter_mut().find(|c| c.metadata.name.as_deref() == Some(name)) else {
            return Err(Error::Tools(format!(
                "{}: a conversion patch for {name}, which the kustomization does not list",
                crd_dir.display()
            )));
        };
        crd.spec.conversion = Some(CustomResourceConversion {
            strategy: "Webhook".into(),
            webhook: Some(WebhookConversion {
                client_config: Some(WebhookClientConfig {
                    url: Some(format!("https://127.0.0.1:{port}{path}")),
                    ca_bundle: Some(ByteString(ca_pem.as_bytes().to_vec())),
                    service: None,
                }),
                conversion_review_versions: review_versions,
            }),
        });
    }
    Ok(crds)
}

/// Where the CRDs of Cluster API Provider OpenStack v0.14.7 are kept (`config/crd/bases/` of its tag, files
/// unchanged; provenance in that directory's README).
pub const CAPO_CRDS_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/crds/capo-v0.14.7"
);

/// The labels CAPO v0.14.7's kustomizations put on its CRDs: the contract label of `config/crd` (CAPO
/// v0.14 implements the `v1beta1` contract, and its kinds' version for it is `v1beta1`) and the provider
/// label of `config/default`. The topology controller reads the contract label to know which apiVersion of
/// a template to use; Cluster API v1.14 (contract `v1beta2`) falls back to the `v1beta1` label when there is
/// no `cluster.x-k8s.io/v1beta2` one.
pub const CAPO_CRD_LABELS: [(&str, &str); 2] = [
    ("cluster.x-k8s.io/v1beta1", "v1beta1"),
    ("cluster.x-k8s.io/provider", "infrastructure-openstack"),
];

/// The CRDs of Cluster API Provider OpenStack v0.14.7 (OpenStackCluster, OpenStackClusterTemplate,
/// OpenStackMachine, OpenStackMachineTemplate), labelled as its kustomizations label them
/// ([`CAPO_CRD_LABELS`]). They carry no conversion: CAPO v0.14 serves `v1beta1` alone.
pub fn capo_crds() -> Result<Vec<CustomResourceDefinition>, Error> {
    let mut crds = crds::read_dirs(&[PathBuf::from(CAPO_CRDS_DIR)])?;
    for crd in &mut crds {
        let labels = crd.metadata.labels.get_or_insert_with(BTreeMap::new);
        for (key, value) in CAPO_CRD_LABELS {
            labels.insert(key.to_owned(), value.to_owned());
        }
    }
    Ok(crds)
}

/// Installs a provider's mutating and validating webhook configurations, pointed at `port` on loopback.
async fn install_admission_webhooks(
    client: &kube::Client,
    provider: Provider,
    config_dir: &Path,
    port: u16,
    ca_pem: &str,
) -> Result<(), Error> {
    let path = config_dir.join("webhook").join("manifests.yaml");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let docs: Vec<Option<Value>> = serde_saphyr::from_multiple(&text)
        .map_err(|e| Error::Kube(format!("{}: not YAML: {e}", path.display())))?;
    for mut doc in docs.into_iter().flatten() {
        let kind = doc
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let original = doc
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let name = format!("cso-testenv-capi-{}-{original}", provider.name());
        doc["metadata"]["name"] = Value::String(name.clone());
        if let Some(webhooks) = doc.get_mut("webhooks").and_then(Value::as_array_mut) {
            for webhook in webhooks {
                let path = webhook
                    .pointer("/clientConfig/service/path")
                    .and_then(Value::as_str)
                    .unwrap_or("/")
                    .to_owned();
                webhook["clientConfig"] = serde_json::json!({
                    "url": format!("https://127.0.0.1:{port}{path}"),
                    "caBundle": BASE64.encode(ca_pem),
                });
            }
        }
        if !["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"].contains(&kind.as_str()) {
            return Err(Error::Tools(format!(
                "{}: unexpected kind {kind:?}",
                path.display()
            )));
        }
        crate::apply_object(client, &doc, FIELD_MANAGER)
            .await
            .map_err(|e| Error::Kube(format!("failed to apply {kind} {name}: {e}")))?;
    }
    Ok(())
}

fn read_yaml(path: &Path) -> Result<Value, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_saphyr::from_str(&text).map_err(|e| Error::Kube(format!("{}: not YAML: {e}", path.display())))
}

/// The `labels[].pairs` (and the older `commonLabels`) of a kustomization.
fn kustomization_labels(kustomization: &Value) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut add = |pairs: Option<&Value>| {
        if let Some(pairs) = pairs.and_then(Value::as_object) {
            for (key, value) in pairs {
                if let Some(value) = value.as_str() {
                    labels.insert(key.clone(), value.to_owned());
                }
            }
        }
    };
    for entry in kustomization
        .get("labels")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        add(entry.get("pairs"));
    }
    add(kustomization.get("commonLabels"));
    labels
}

fn string_list(value: &Value, key: &str) -> Vec<String> {
    string_array(value.get(key))
}

fn string_array(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

/// `GET path` over plain HTTP on loopback answers 200.
async fn http_ok(address: std::net::IpAddr, port: u16, path: &str) -> bool {
    let attempt = async {
        let mut stream = tokio::net::TcpStream::connect((address, port)).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        std::io::Result::Ok(response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), attempt).await,
        Ok(Ok(true))
    )
}

/// A Cluster with a managed topology, as the tests and the demo create them: one control-plane replica, one
/// MachineDeployment `md-0` of `worker_class`, the usual service and pod networks (values templates read the pod
/// CIDR).
#[derive(Clone, Debug)]
pub struct TopologyCluster<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// `v1beta2` (`classRef`) or `v1beta1` (`class`, `classNamespace`).
    pub api_version: &'a str,
    pub class: &'a str,
    /// The ClusterClass's namespace when it is not the Cluster's.
    pub class_namespace: Option<&'a str>,
    pub version: &'a str,
    pub worker_class: &'a str,
    /// `0` for worker upgrades that complete without machines (see `stand_in`).
    pub worker_replicas: u32,
    /// `imageRepository`, when the class has that variable and it must be set.
    pub image_repository: Option<&'a str>,
}

impl TopologyCluster<'_> {
    pub fn to_json(&self) -> Value {
        let mut topology = serde_json::json!({
            "version": self.version,
            "controlPlane": {"replicas": 1},
            "workers": {"machineDeployments": [
                {"class": self.worker_class, "name": "md-0", "replicas": self.worker_replicas}]},
        });
        if let Some(value) = self.image_repository {
            topology["variables"] = serde_json::json!([{"name": "imageRepository", "value": value}]);
        }
        if self.api_version.ends_with("v1beta1") {
            topology["class"] = self.class.into();
            if let Some(namespace) = self.class_namespace {
                topology["classNamespace"] = namespace.into();
            }
        } else {
            topology["classRef"] = serde_json::json!({"name": self.class});
            if let Some(namespace) = self.class_namespace {
                topology["classRef"]["namespace"] = namespace.into();
            }
        }
        serde_json::json!({
            "apiVersion": self.api_version, "kind": "Cluster",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "clusterNetwork": {
                    // The environment's own ranges, kept on this machine (crate::egress).
                    "services": {"cidrBlocks": [crate::egress::SERVICE_CIDR]},
                    "pods": {"cidrBlocks": [crate::egress::NODE_POD_CIDRS]},
                    "serviceDomain": "cluster.local"
                },
                "topology": topology,
            }
        })
    }
}

/// Registers a runtime extension with Cluster API: the `ExtensionConfig` `name`
/// (`runtime.cluster.x-k8s.io/v1beta2`, cluster-scoped) for the extension server at `url` (`https://...`),
/// trusted through `ca_pem`, for the Clusters of `namespaces` (every namespace when empty). Replaces an
/// earlier one of the same name.
pub async fn register_extension(
    client: &kube::Client,
    name: &str,
    url: &str,
    ca_pem: &str,
    namespaces: &[String],
) -> Result<(), Error> {
    let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &extension_config_resource());
    let object = extension_config(name, url, ca_pem, namespaces);
    // Cluster API's defaulting webhook admits the object; a moment in which the API server cannot reach it (a
    // manager restarting its webhook server) is waited out, as `kubectl apply` in a retry loop would.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match api
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&object),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if e.to_string().contains("failed calling webhook") && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => {
                return Err(Error::Kube(format!(
                    "failed to register the runtime extension {name}: {e}"
                )));
            }
        }
    }
}

/// `runtime.cluster.x-k8s.io/v1beta2` `ExtensionConfig`s.
fn extension_config_resource() -> kube::core::ApiResource {
    kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("runtime.cluster.x-k8s.io", "v1beta2", "ExtensionConfig"),
        "extensionconfigs",
    )
}

/// The `ExtensionConfig` `name` for the server at `url` trusted through `ca_pem`, for the Clusters of
/// `namespaces` (every namespace when empty: the empty selector Cluster API's defaulting would write).
fn extension_config(name: &str, url: &str, ca_pem: &str, namespaces: &[String]) -> serde_json::Value {
    let selector = if namespaces.is_empty() {
        serde_json::json!({})
    } else {
        serde_json::json!({"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]})
    };
    serde_json::json!({
        "apiVersion": "runtime.cluster.x-k8s.io/v1beta2", "kind": "ExtensionConfig",
        "metadata": {"name": name},
        "spec": {
            "clientConfig": {"url": url, "caBundle": BASE64.encode(ca_pem.as_bytes())},
            "namespaceSelector": selector,
        },
    })
}

/// Waits (at most `timeout`) until Cluster API has discovered the extension `name`; returns the hooks of its
/// handlers (`status.handlers[].requestHook.hook`), sorted.
pub async fn discovered_hooks(
    client: &kube::Client,
    name: &str,
    timeout: Duration,
) -> Result<Vec<String>, Error> {
    let resource = kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("runtime.cluster.x-k8s.io", "v1beta2", "ExtensionConfig"),
        "extensionconfigs",
    );
    let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
    let deadline = Instant::now() + timeout;
    loop {
        let config = api
            .get_opt(name)
            .await
            .map_err(|e| Error::Kube(e.to_string()))?
            .map(|c| serde_json::to_value(c).unwrap_or_default())
            .unwrap_or_default();
        let mut hooks: Vec<String> = config
            .pointer("/status/handlers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|h| {
                h.pointer("/requestHook/hook")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .collect();
        if !hooks.is_empty() {
            hooks.sort();
            return Ok(hooks);
        }
        if Instant::now() > deadline {
            let conditions = config.pointer("/status/conditions").cloned().unwrap_or_default();
            return Err(Error::Kube(format!(
                "Cluster API did not discover the runtime extension {name} within {timeout:?}: {conditions}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn topology_clusters_name_their_class_as_each_version_does() {
        let mut cluster = TopologyCluster {
            namespace: "tenant",
            name: "c1",
            api_version: "cluster.x-k8s.io/v1beta2",
            class: "docker-scs-1-35-v1",
            class_namespace: Some("stacks"),
            version: "v1.35.1",
            worker_class: "default-worker",
            worker_replicas: 0,
            image_repository: None,
        };
        let v1beta2 = cluster.to_json();
        assert_eq!(
            v1beta2["spec"]["topology"]["classRef"],
            serde_json::json!({"name": "docker-scs-1-35-v1", "namespace": "stacks"})
        );
        assert!(v1beta2["spec"]["topology"].get("variables").is_none());
        cluster.api_version = "cluster.x-k8s.io/v1beta1";
        cluster.image_repository = Some("registry.k8s.io");
        let v1beta1 = cluster.to_json();
        assert_eq!(v1beta1["spec"]["topology"]["class"], "docker-scs-1-35-v1");
        assert_eq!(v1beta1["spec"]["topology"]["classNamespace"], "stacks");
        assert_eq!(
            v1beta1["spec"]["topology"]["variables"][0]["value"],
            "registry.k8s.io"
        );
    }

    #[test]
    fn kustomization_labels_are_read_from_pairs_and_common_labels() {
        let kustomization: Value = serde_saphyr::from_str(
            "labels:\n- pairs:\n    cluster.x-k8s.io/v1beta1: v1beta1\n    cluster.x-k8s.io/v1beta2: v1beta2\n\
             - includeSelectors: true\n  pairs:\n    cluster.x-k8s.io/provider: cluster-api\n\
             commonLabels:\n  a: b\n",
        )
        .unwrap();
        let labels = kustomization_labels(&kustomization);
        assert_eq!(labels.len(), 4);
        assert_eq!(labels["cluster.x-k8s.io/v1beta2"], "v1beta2");
        assert_eq!(labels["cluster.x-k8s.io/provider"], "cluster-api");
        assert_eq!(labels["a"], "b");
    }

    #[test]
    fn capo_crds_are_the_four_openstack_kinds_with_the_contract_label() {
        let crds = capo_crds().unwrap();
        let mut kinds: Vec<&str> = crds.iter().map(|c| c.spec.names.kind.as_str()).collect();
        kinds.sort_unstable();
        assert_eq!(
            kinds,
            [
                "OpenStackCluster",
                "OpenStackClusterTemplate",
                "OpenStackMachine",
                "OpenStackMachineTemplate"
            ]
        );
        for crd in &crds {
            let labels = crd.metadata.labels.as_ref().unwrap();
            assert_eq!(labels["cluster.x-k8s.io/v1beta1"], "v1beta1");
            assert!(crd.spec.conversion.as_ref().is_none_or(|c| c.strategy == "None"));
            assert!(
                crd.spec
                    .versions
                    .iter()
                    .any(|v| v.name == "v1beta1" && v.served && v.storage)
            );
        }
    }

    #[test]
    fn tools_need_every_provider() {
        let all = |key: &str| Some(format!("/x/{key}"));
        let core = ClusterApiTools::from_lookup(all).unwrap();
        assert_eq!(
            core.provider(Provider::Core).unwrap().config_dir,
            PathBuf::from("/x/CSO_CAPI_MANAGER_CONFIG")
        );
        let tools = ClusterApiTools::from_lookup(all).unwrap();
        assert_eq!(tools.providers.len(), 4);
        assert_eq!(
            tools.provider(Provider::KubeadmControlPlane).unwrap().binary,
            PathBuf::from("/x/CSO_CAPI_KUBEADM_CONTROL_PLANE_MANAGER")
        );
        let no_docker = |key: &str| (!key.contains("DOCKER")).then(|| key.to_owned());
        assert!(ClusterApiTools::from_lookup(no_docker).is_none());
    }
}
