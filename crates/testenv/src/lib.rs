//! Real local Kubernetes control planes (etcd + kube-apiserver on loopback) for the tests and `cso-dev`.
//!
//! Tests share one control plane per test binary ([`shared_management`]) and isolate themselves by
//! namespace ([`namespace`]); `cso-dev up` starts its own. [`github::FakeGithub`] stands in for GitHub;
//! [`registry::Registry`] is a real OCI registry. [`capi`] runs Cluster API itself (v1.14's managers, CRDs and
//! webhooks) on a control plane of its own; [`stand_in::StandIn`] plays the providers' part where machines
//! would be needed; [`clusterctl`] runs `clusterctl move` between two such management planes (the second in a
//! network namespace of its own, [`capi::start_second_management_with_cluster_api`]). [`workloads`] makes a
//! control plane run workloads (kube-controller-manager, kube-scheduler and kwok's simulated nodes;
//! [`workloads::shared_workload_cluster`]). [`cosign`] signs releases with cosign and
//! with a signer of its own, for the tests of release verification. [`cert_manager`] issues what cert-manager would
//! for the chart tests. [`egress`] keeps every address the simulated clusters use on this machine. [`node`] runs
//! real nodes (containerd, kubelet, kube-proxy) with cluster DNS ([`cluster_dns`]).

pub mod archive;
pub mod capi;
pub mod cert_manager;
pub mod chart_repo;
pub mod cluster_dns;
pub mod clusterctl;
pub mod control_plane;
pub mod cosign;
pub mod crds;
pub mod egress;
pub mod github;
pub mod go_operator;
pub mod node;
pub mod pki;
pub mod process;
pub mod proxy;
pub mod registry;
pub mod stand_in;
pub mod tools;
pub mod usage;
pub mod workloads;

use std::{path::Path, sync::OnceLock};

pub use control_plane::{ControlPlane, client_from_yaml, config_from_yaml, free_port};
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, api::PostParams};
pub use tools::Tools;
pub use workloads::{NodeSpec, WorkloadCluster, WorkloadRuntime};

/// Everything that can go wrong while starting or using a local control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Tools(String),
    #[error("failed to generate certificates: {0}")]
    Pki(String),
    #[error("{0}")]
    Process(String),
    #[error("{0}")]
    Kube(String),
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

impl Error {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// Installs the ring crypto provider for rustls once per process.
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Starts a management control plane: our CRDs plus the Cluster API `v1beta1` CRDs, installed and Established.
pub async fn start_management(tools: &Tools, dir: Option<&Path>) -> Result<ControlPlane, Error> {
    let plane = start_management_without_our_crds(tools, dir).await?;
    crds::install(&plane.client().await?, &cso_api::crd::all()).await?;
    Ok(plane)
}

/// Starts a management control plane with the Cluster API `v1beta1` CRDs and without ours: for installing ours
/// the way a site does, with a Helm chart that owns them.
pub async fn start_management_without_our_crds(
    tools: &Tools,
    dir: Option<&Path>,
) -> Result<ControlPlane, Error> {
    if tools.capi_crd_dirs.is_empty() {
        return Err(Error::Tools(
            "no Cluster API CRD directories: run `make tools` or set CSO_CAPI_CRD_DIRS".into(),
        ));
    }
    let capi_crds = crds::read_dirs(&tools.capi_crd_dirs)?;
    let plane = ControlPlane::start(tools, "management", dir).await?;
    crds::install(&plane.client().await?, &capi_crds).await?;
    Ok(plane)
}

/// The management control plane shared by all tests of this test binary, started on first use.
///
/// It is started on a thread of its own (each test has its own runtime) and lives until the test binary
/// exits, when the process watchdogs stop it. Panics with the reason when it cannot start: a test that
/// needs a real API server must fail, not skip, without one.
pub fn shared_management() -> &'static ControlPlane {
    static SHARED: OnceLock<ControlPlane> = OnceLock::new();
    SHARED.get_or_init(|| start_shared(|tools| Box::pin(start_management(tools, None))))
}

/// A bare control plane standing in for a workload cluster, shared like [`shared_management`].
pub fn shared_workload() -> &'static ControlPlane {
    static SHARED: OnceLock<ControlPlane> = OnceLock::new();
    SHARED.get_or_init(|| start_shared(|tools| Box::pin(ControlPlane::start(tools, "workload", None))))
}

pub(crate) type Starting<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, Error>> + 'a>>;

/// Starts what a shared test fixture is (a control plane, one with Cluster API, a workload cluster) on a thread
/// of its own with its own runtime (each test has its own); panics with the reason when it cannot start.
pub(crate) fn start_shared<T: Send + 'static>(
    start: impl FnOnce(&Tools) -> Starting<'_, T> + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let tools = Tools::discover().map_err(std::io::Error::other)?;
        runtime.block_on(start(&tools)).map_err(std::io::Error::other)
    })
    .join()
    .expect("test fixture start-up thread panicked")
    .unwrap_or_else(|e| panic!("cannot start the test control plane: {e}"))
}

/// Polls `check` every 250 ms until it answers `Ok`, and returns that; panics after `timeout` with `what` and what
/// `check` said last (for tests).
pub async fn eventually<T, F, Fut>(what: &str, timeout: std::time::Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(seen) if std::time::Instant::now() > deadline => {
                panic!("{what}: not after {timeout:?}; last seen: {seen}")
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(250)).await,
        }
    }
}

/// Server-side applies `object` (JSON with `apiVersion`, `kind` and `metadata`, namespaced or not as the API
/// server's discovery says) as `field_manager`, forced; returns the object as applied.
pub async fn apply_object(
    client: &kube::Client,
    object: &serde_json::Value,
    field_manager: &str,
) -> Result<kube::api::DynamicObject, Error> {
    use kube::api::{DynamicObject, Patch, PatchParams};
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = object["kind"].as_str().unwrap_or_default();
    let gvk = kube::core::GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .map_err(|e| Error::Kube(format!("{api_version} {kind}: {e}")))?;
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
        Some(namespace) if caps.scope == kube::discovery::Scope::Namespaced => {
            Api::namespaced_with(client.clone(), namespace, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    };
    api.patch(
        name,
        &PatchParams::apply(field_manager).force(),
        &Patch::Apply(object),
    )
    .await
    .map_err(|e| Error::Kube(format!("{kind} {name}: {e}")))
}

/// Creates a namespace with a generated name starting with `prefix` and returns its name.
pub async fn namespace(client: &kube::Client, prefix: &str) -> Result<String, Error> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            generate_name: Some(format!("{prefix}-")),
            ..Default::default()
        },
        ..Default::default()
    };
    let created = api
        .create(&PostParams::default(), &ns)
        .await
        .map_err(|e| Error::Kube(e.to_string()))?;
    Ok(created.metadata.name.unwrap_or_default())
}

/// Writes the Secret Cluster API keeps a workload cluster's kubeconfig in (`<cluster>-kubeconfig`, key
/// `value`), as the operator reads it.
pub async fn kubeconfig_secret(
    client: &kube::Client,
    namespace: &str,
    cluster: &str,
    kubeconfig: &str,
) -> Result<(), Error> {
    use k8s_openapi::api::core::v1::Secret;
    let name = format!("{cluster}-kubeconfig");
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        },
        type_: Some("cluster.x-k8s.io/secret".into()),
        string_data: Some([("value".to_owned(), kubeconfig.to_owned())].into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), namespace)
        .patch(
            &name,
            &kube::api::PatchParams::apply("cso-testenv").force(),
            &kube::api::Patch::Apply(&secret),
        )
        .await
        .map(|_| ())
        .map_err(|e| Error::Kube(e.to_string()))
}

/// The bytes of the files under `path` (or of `path`, a file), symbolic links counted as themselves.
pub fn disk_size(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    std::fs::read_dir(path)
        .map(|entries| entries.flatten().map(|e| disk_size(&e.path())).sum())
        .unwrap_or_default()
}
