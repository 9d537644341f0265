//! `clusterctl move` between two management control planes of the environment, each running Cluster API's
//! managers as [`crate::capi`] starts them: clusterctl of the same release (`make tools` builds it from the
//! wrapper module `hack/testenv/capi` into `CSO_CLUSTERCTL`), what `clusterctl init` would have left on each
//! plane ([`prepare`]), a kubeconfig per plane ([`write_kubeconfig`]) and the move itself
//! ([`Clusterctl::move_clusters`]). The second plane runs in a network namespace of its own
//! ([`crate::capi::start_second_management_with_cluster_api`]: the Docker/Dev provider binds port 19000 on every
//! interface), and each plane needs Kubernetes' garbage collector ([`crate::workloads::GarbageCollector`], see
//! below). `tests/clusterctl_move.rs` does all of it.
//!
//! What `clusterctl move` (v1.14, `cmd/clusterctl/client/{move.go,cluster/mover.go,objectgraph.go,
//! inventory.go}`) needs, checked in this order:
//!
//! - on both planes, the CRD `clusters.cluster.x-k8s.io` with `v1beta2` as its storage version (its contract), and
//!   the inventory CRD `providers.clusterctl.cluster.x-k8s.io` (`cmd/clusterctl/config/manifest/
//!   clusterctl-api.yaml`, with the label `clusterctl.cluster.x-k8s.io/core: inventory`; clusterctl would install it
//!   itself, [`prepare`] does it up front);
//! - every provider in the source's inventory (`Provider` objects, one per installed provider) also in the
//!   target's, by `providerName` and `type`, at the same or a newer version (`checkTargetProviders`);
//! - the kinds it looks at are those of the CRDs labelled `clusterctl.cluster.x-k8s.io` (any value; `clusterctl
//!   init` gives every object of a provider that label and `cluster.x-k8s.io/provider: <provider>`), in their
//!   storage version, plus Secrets and ConfigMaps, in the namespace moved. Clusters, ClusterClasses and
//!   ClusterResourceSets (and the kinds of CRDs labelled `clusterctl.cluster.x-k8s.io/move-hierarchy`) move with
//!   everything they own, followed down the owner references: a ClusterClass owns its templates (Cluster API's
//!   ClusterClass controller makes it their owner), a Cluster its topology's objects and through the control
//!   plane the kubeconfig Secret; a Secret without owners named `<cluster>-<purpose>` (`kubeconfig`, `ca`, ...)
//!   goes with its Cluster, a Cluster after its ClusterClass. Objects of kinds whose CRDs carry the label
//!   themselves (ours) are found the same way;
//! - an object with an owner reference to an object that does not exist is neither moved nor deleted, and
//!   nothing says so at the default verbosity. Cluster API's topology controller leaves exactly that on every
//!   new Cluster's infrastructure cluster and control plane (the Secret `<cluster>-shim`, a temporary second
//!   owner it deletes once the Cluster owns both) for the garbage collector to remove: without one, both stay on
//!   the source with the kubeconfig Secret, while the Cluster moves;
//! - every Cluster moved has `status.initialization.infrastructureProvisioned`, the condition
//!   `ControlPlaneInitialized=True` and (with a control plane reference) `status.initialization.
//!   controlPlaneInitialized`; every Machine has a `status.nodeRef` (`checkProvisioningCompleted`); no Cluster is
//!   paused and no ClusterClass has the paused annotation. A refusal changes nothing;
//! - then it pauses the Clusters (`spec.paused: true`) and ClusterClasses (annotation `cluster.x-k8s.io/paused`),
//!   waits (up to about two minutes) while any object it moves has `clusterctl.cluster.x-k8s.io/block-move`,
//!   creates the objects on the target owners first (namespaces as needed; metadata and spec, not the status:
//!   a create does not write a status subresource; owner references rebuilt with the new UIDs; the managed
//!   fields kept; the Cluster paused), deletes them from the source (annotation
//!   `clusterctl.cluster.x-k8s.io/delete-for-move`, then a delete and the finalizers removed) and unpauses the
//!   ClusterClasses and Clusters on the target. Creating a topology Cluster on the target takes about 12 s:
//!   Cluster API's Cluster webhooks wait 2 s a call for its ClusterClass to be reconciled, which, paused, it is
//!   not (they admit it with a warning).
//!
//! After the move the target's providers must report the status again (a provider stand-in started on the
//! target does, [`crate::stand_in`]), and the source's must leave the paused Cluster's objects alone while they
//! are copied and deleted (the stand-in does).
//!
//! `--namespace` moves one namespace (without it, the kubeconfig's current namespace, `default` for the
//! environment's kubeconfigs). The namespaces are left on the source. The kinds of providers without an inventory
//! entry (CAPO's CRDs, [`crate::capi::capo_crds`]) are not labelled here and do not move.
//!
//! Only the labels and the inventory are written: the providers' Deployments, Services and webhook
//! configurations `clusterctl init` would create are not needed by `move` (the managers run as processes,
//! [`crate::capi`]). clusterctl runs with a configuration directory of its own (`XDG_CONFIG_HOME`, `HOME` and an
//! empty `--config`) and `CLUSTERCTL_DISABLE_VERSIONCHECK=true` (its version check asks GitHub).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::{
    api::core::v1::Namespace, apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::{Value, json};

use crate::{
    ControlPlane, Error,
    capi::{ClusterApiTools, Provider},
    crds,
};

/// The label `clusterctl init` gives every object of a provider; `move` moves the kinds of the CRDs that have it.
pub const CLUSTERCTL_LABEL: &str = "clusterctl.cluster.x-k8s.io";
/// The label with a provider's manifest label (`cluster-api`, `bootstrap-kubeadm`, ...).
pub const PROVIDER_LABEL: &str = "cluster.x-k8s.io/provider";
/// The label of clusterctl's own objects: the inventory CRD and the `Provider` objects (`inventory`).
pub const CORE_LABEL: &str = "clusterctl.cluster.x-k8s.io/core";
/// The inventory CRD.
pub const INVENTORY_CRD: &str = "providers.clusterctl.cluster.x-k8s.io";
/// The inventory CRD's manifest in the `sigs.k8s.io/cluster-api` module.
const INVENTORY_MANIFEST: &str = "cmd/clusterctl/config/manifest/clusterctl-api.yaml";
const FIELD_MANAGER: &str = "cso-testenv-clusterctl";
/// How long a move may take before it is stopped (it waits up to about two minutes for `block-move`).
pub const MOVE_TIMEOUT: Duration = Duration::from_secs(240);

/// One entry of clusterctl's provider inventory, as `clusterctl init` writes it: a
/// `clusterctl.cluster.x-k8s.io/v1alpha3` `Provider` named after the manifest label, in the provider's namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InventoryEntry {
    pub provider: Provider,
    /// `providerName`: `cluster-api`, `kubeadm`, `kubeadm`, `docker`.
    pub provider_name: &'static str,
    /// `type`: `CoreProvider`, `BootstrapProvider`, `ControlPlaneProvider`, `InfrastructureProvider`.
    pub provider_type: &'static str,
    /// The object's name and the value of [`PROVIDER_LABEL`] on the provider's objects: `cluster-api`,
    /// `bootstrap-kubeadm`, `control-plane-kubeadm`, `infrastructure-docker`.
    pub manifest_label: &'static str,
    /// The namespace `clusterctl init` installs the provider into (its `config/default` kustomization's
    /// `namespace`: `capi-system`, `capi-kubeadm-bootstrap-system`, ...).
    pub namespace: String,
    /// The version installed: the release `make tools` built (`v1.14.2`).
    pub version: String,
}

impl InventoryEntry {
    /// The `Provider` object.
    pub fn to_json(&self) -> Value {
        json!({
            "apiVersion": "clusterctl.cluster.x-k8s.io/v1alpha3", "kind": "Provider",
            "metadata": {
                "name": self.manifest_label,
                "namespace": self.namespace,
                "labels": {
                    CLUSTERCTL_LABEL: "",
                    PROVIDER_LABEL: self.manifest_label,
                    CORE_LABEL: "inventory",
                },
            },
            "providerName": self.provider_name,
            "type": self.provider_type,
            "version": self.version,
        })
    }
}

/// clusterctl's names for a provider: `(providerName, type, manifest label)`.
fn clusterctl_names(provider: Provider) -> (&'static str, &'static str, &'static str) {
    match provider {
        Provider::Core => ("cluster-api", "CoreProvider", "cluster-api"),
        Provider::KubeadmBootstrap => ("kubeadm", "BootstrapProvider", "bootstrap-kubeadm"),
        Provider::KubeadmControlPlane => ("kubeadm", "ControlPlaneProvider", "control-plane-kubeadm"),
        Provider::Docker => ("docker", "InfrastructureProvider", "infrastructure-docker"),
    }
}

/// The inventory of the providers `capi` runs, as `clusterctl init` of that release would write it.
pub fn inventory(capi: &ClusterApiTools) -> Result<Vec<InventoryEntry>, Error> {
    capi.providers
        .iter()
        .map(|tools| {
            let (provider_name, provider_type, manifest_label) = clusterctl_names(tools.provider);
            let path = tools.config_dir.join("default").join("kustomization.yaml");
            let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
            let kustomization: Value = serde_saphyr::from_str(&text)
                .map_err(|e| Error::Kube(format!("{}: not YAML: {e}", path.display())))?;
            let namespace = kustomization
                .get("namespace")
                .and_then(Value::as_str)
                .ok_or_else(|| Error::Tools(format!("{}: no namespace", path.display())))?
                .to_owned();
            Ok(InventoryEntry {
                provider: tools.provider,
                provider_name,
                provider_type,
                manifest_label,
                namespace,
                version: capi.version.clone(),
            })
        })
        .collect()
}

/// What [`prepare`] did to a plane.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The CRDs that got [`CLUSTERCTL_LABEL`], sorted.
    pub labelled_crds: Vec<String>,
    /// The `Provider` objects written.
    pub inventory: Vec<InventoryEntry>,
}

/// Makes the management plane of `client`, with Cluster API of `capi` running ([`crate::capi::ClusterApi`]),
/// look to clusterctl as `clusterctl init` would have left it: the CRDs of the four providers (those whose
/// [`PROVIDER_LABEL`] is one of their manifest labels) labelled [`CLUSTERCTL_LABEL`], the inventory CRD, and one
/// `Provider` per provider in its namespace (created when missing). Other CRDs are left as they are (CAPO's; ours,
/// which carry their labels themselves). Idempotent. Fails when a provider has no labelled CRD.
pub async fn prepare(client: &kube::Client, capi: &ClusterApiTools) -> Result<Prepared, Error> {
    let inventory = inventory(capi)?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let labels: Vec<&str> = inventory.iter().map(|e| e.manifest_label).collect();
    let selector = format!("{PROVIDER_LABEL} in ({})", labels.join(","));
    let found = crds
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| Error::Kube(format!("failed to list the providers' CRDs: {e}")))?;
    let mut per_provider: BTreeMap<&str, usize> = labels.iter().map(|l| (*l, 0)).collect();
    let mut labelled_crds = Vec::new();
    for crd in &found.items {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let provider = crd
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(PROVIDER_LABEL))
            .map(String::as_str)
            .unwrap_or_default();
        if let Some(count) = per_provider.get_mut(provider) {
            *count += 1;
        }
        crds.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {CLUSTERCTL_LABEL: ""}}})),
        )
        .await
        .map_err(|e| Error::Kube(format!("failed to label the CRD {name}: {e}")))?;
        labelled_crds.push(name);
    }
    if let Some((provider, _)) = per_provider.iter().find(|(_, count)| **count == 0) {
        return Err(Error::Kube(format!(
            "no CRD with {PROVIDER_LABEL}={provider}: is Cluster API running on this plane (crate::capi::ClusterApi)?"
        )));
    }
    labelled_crds.sort();

    crds::install(client, &[inventory_crd(capi)?]).await?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let providers = kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("clusterctl.cluster.x-k8s.io", "v1alpha3", "Provider"),
        "providers",
    );
    for entry in &inventory {
        let namespace =
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": entry.namespace}});
        namespaces
            .patch(
                &entry.namespace,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Apply(&namespace),
            )
            .await
            .map_err(|e| Error::Kube(format!("failed to create the namespace {}: {e}", entry.namespace)))?;
        Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), &entry.namespace, &providers)
            .patch(
                entry.manifest_label,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&entry.to_json()),
            )
            .await
            .map_err(|e| {
                Error::Kube(format!(
                    "failed to write the inventory entry {}/{}: {e}",
                    entry.namespace, entry.manifest_label
                ))
            })?;
    }
    Ok(Prepared {
        labelled_crds,
        inventory,
    })
}

/// The inventory CRD of the release (`cmd/clusterctl/config/manifest/clusterctl-api.yaml` of the
/// `sigs.k8s.io/cluster-api` module the core provider's config directory is in), labelled as clusterctl labels
/// it when it installs it.
fn inventory_crd(capi: &ClusterApiTools) -> Result<CustomResourceDefinition, Error> {
    let core = capi
        .providers
        .iter()
        .find(|p| p.provider == Provider::Core)
        .ok_or_else(|| Error::Tools("no core provider in the tools".into()))?;
    let path = core
        .config_dir
        .ancestors()
        .map(|dir| dir.join(INVENTORY_MANIFEST))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            Error::Tools(format!(
                "{INVENTORY_MANIFEST} not found above {}: is CSO_CAPI_MANAGER_CONFIG the core/config directory of \
                 the sigs.k8s.io/cluster-api module?",
                core.config_dir.display()
            ))
        })?;
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let mut crd: CustomResourceDefinition = serde_saphyr::from_str(&text)
        .map_err(|e| Error::Kube(format!("{}: not a CRD: {e}", path.display())))?;
    crd.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(CORE_LABEL.into(), "inventory".into());
    Ok(crd)
}

/// Writes the admin kubeconfig of `plane` to `path` (mode 0600), for `--kubeconfig` and `--to-kubeconfig`.
pub fn write_kubeconfig(plane: &ControlPlane, path: &Path) -> Result<(), Error> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    file.write_all(plane.kubeconfig_yaml().as_bytes())
        .map_err(|e| Error::io(path, e))
}

/// The clusterctl binary `make tools` built, with a configuration directory of its own.
#[derive(Debug)]
pub struct Clusterctl {
    binary: PathBuf,
    home: tempfile::TempDir,
    verbosity: u8,
}

impl Clusterctl {
    /// `CSO_CLUSTERCTL`, else the tools' `env` file; an error saying to run `make tools` when it is not built.
    pub fn discover() -> Result<Self, Error> {
        let binary = std::env::var("CSO_CLUSTERCTL")
            .ok()
            .filter(|v| !v.is_empty())
            .or_else(|| crate::tools::from_env_file("CSO_CLUSTERCTL"))
            .map(PathBuf::from)
            .ok_or_else(|| {
                Error::Tools(format!(
                    "clusterctl is not built: run `make tools` (or `bash hack/tools.sh clusterctl`; writes {}) or set \
                     CSO_CLUSTERCTL",
                    crate::tools::cache_dir().join("env").display()
                ))
            })?;
        Self::new(binary)
    }

    /// clusterctl at `binary`.
    pub fn new(binary: PathBuf) -> Result<Self, Error> {
        if !binary.is_file() {
            return Err(Error::Tools(format!(
                "{} does not exist: run `make tools`",
                binary.display()
            )));
        }
        let home = tempfile::Builder::new()
            .prefix("cso-clusterctl-")
            .tempdir()
            .map_err(|e| Error::io(Path::new("/tmp"), e))?;
        let config = home.path().join("clusterctl.yaml");
        std::fs::write(
            &config,
            "# clusterctl's configuration in the test environment: nothing to set\n",
        )
        .map_err(|e| Error::io(&config, e))?;
        Ok(Clusterctl {
            binary,
            home,
            verbosity: 0,
        })
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// clusterctl's `-v` for the moves from now on: 0 (its default) prints a line per step, 5 every object.
    pub fn set_verbosity(&mut self, level: u8) {
        self.verbosity = level;
    }

    /// A command for clusterctl with its own configuration directory, no version check against GitHub, and
    /// neither `KUBECONFIG` nor `CLUSTERCTL_LOG_LEVEL` from this process.
    fn command(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.binary);
        command
            .arg("--config")
            .arg(self.home.path().join("clusterctl.yaml"))
            .env("HOME", self.home.path())
            .env("XDG_CONFIG_HOME", self.home.path().join("config"))
            .env("XDG_CACHE_HOME", self.home.path().join("cache"))
            .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
            .env_remove("CLUSTERCTL_LOG_LEVEL")
            .env_remove("KUBECONFIG")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        command
    }

    /// `clusterctl version -o short`: the release (`v1.14.2`).
    pub async fn version(&self) -> Result<String, Error> {
        let mut command = self.command();
        command.args(["version", "-o", "short"]);
        let (stdout, _) = self.run(&mut command, "clusterctl version").await?;
        Ok(stdout.trim().to_owned())
    }

    /// `clusterctl move --kubeconfig FROM --to-kubeconfig TO [--namespace NAMESPACE]`: its output (stdout, then
    /// stderr) when it succeeds; otherwise an [`Error::Process`] with its exit status and output. Stopped after
    /// [`MOVE_TIMEOUT`]. Runs as a child process of the async runtime, which goes on meanwhile (a stand-in on
    /// either plane keeps polling).
    pub async fn move_clusters(
        &self,
        from: &Path,
        to: &Path,
        namespace: Option<&str>,
    ) -> Result<String, Error> {
        let mut command = self.command();
        command
            .arg("move")
            .arg("--kubeconfig")
            .arg(from)
            .arg("--to-kubeconfig")
            .arg(to)
            .arg(format!("-v={}", self.verbosity));
        if let Some(namespace) = namespace {
            command.args(["--namespace", namespace]);
        }
        let what = format!(
            "clusterctl move --kubeconfig {} --to-kubeconfig {}{}",
            from.display(),
            to.display(),
            namespace.map(|n| format!(" --namespace {n}")).unwrap_or_default()
        );
        let (stdout, stderr) = self.run(&mut command, &what).await?;
        Ok(stdout + &stderr)
    }

    /// Runs `command`: its stdout and stderr when it succeeds.
    async fn run(
        &self,
        command: &mut tokio::process::Command,
        what: &str,
    ) -> Result<(String, String), Error> {
        let output = tokio::time::timeout(MOVE_TIMEOUT, command.output())
            .await
            .map_err(|_| Error::Process(format!("{what}: not done after {MOVE_TIMEOUT:?}; stopped")))?
            .map_err(|e| Error::Process(format!("{what}: cannot run {}: {e}", self.binary.display())))?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if output.status.success() {
            Ok((stdout, stderr))
        } else {
            Err(Error::Process(format!(
                "{what}: {}:\n{stdout}{stderr}",
                output.status
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn inventory_entries_are_named_as_clusterctl_names_them() {
        let core = InventoryEntry {
            provider: Provider::Core,
            provider_name: "cluster-api",
            provider_type: "CoreProvider",
            manifest_label: "cluster-api",
            namespace: "capi-system".into(),
            version: "v1.14.2".into(),
        };
        let object = core.to_json();
        assert_eq!(object["metadata"]["name"], "cluster-api");
        assert_eq!(object["metadata"]["labels"][CLUSTERCTL_LABEL], "");
        assert_eq!(object["metadata"]["labels"][CORE_LABEL], "inventory");
        assert_eq!(object["version"], "v1.14.2");
        assert_eq!(
            clusterctl_names(Provider::KubeadmControlPlane),
            ("kubeadm", "ControlPlaneProvider", "control-plane-kubeadm")
        );
        assert_eq!(clusterctl_names(Provider::Docker).2, "infrastructure-docker");
    }
}

/// Everything a `clusterctl move` test stands on: a source management plane with Cluster API on loopback, a
/// target one in a network namespace of its own ([`crate::capi::start_second_management_with_cluster_api`]),
/// both with Kubernetes' garbage collector (Cluster API leaves it the dangling owner references of every new
/// Cluster's objects, and move moves nothing whose owner it cannot find) and prepared as `clusterctl init`
/// leaves them ([`prepare`]), their kubeconfig files, and a workload API server at the target namespace's
/// host address, which the managers of both reach. Field order is drop order.
#[derive(Debug)]
pub struct MovePlanes {
    pub workload: ControlPlane,
    pub source_gc: crate::workloads::GarbageCollector,
    pub target_gc: crate::workloads::GarbageCollector,
    pub source: crate::capi::ManagementWithClusterApi,
    pub target: crate::capi::SecondManagement,
    /// What [`prepare`] did to the source.
    pub prepared: Prepared,
    pub source_kubeconfig: PathBuf,
    pub target_kubeconfig: PathBuf,
    _kubeconfigs: tempfile::TempDir,
}

impl MovePlanes {
    /// Starts the two planes side by side (Cluster API with `options` on each), then the rest.
    pub async fn start(
        tools: &crate::Tools,
        capi: &ClusterApiTools,
        options: &crate::capi::Options,
    ) -> Result<Self, Error> {
        let (source, target) = tokio::join!(
            crate::capi::start_management_with_cluster_api(tools, capi, None, options),
            crate::capi::start_second_management_with_cluster_api(tools, capi, None, options),
        );
        let (source, target) = (source?, target?);
        let workload = ControlPlane::start_placed(
            tools,
            "move-workload",
            None,
            &crate::control_plane::Placement {
                address: target.network.host_address(),
                netns: None,
            },
        )
        .await?;
        let (source_gc, target_gc) = tokio::join!(
            crate::workloads::GarbageCollector::start(tools, &source.control_plane),
            crate::workloads::GarbageCollector::start(tools, &target.control_plane),
        );
        let prepared = prepare(&source.control_plane.client().await?, capi).await?;
        prepare(&target.control_plane.client().await?, capi).await?;
        let kubeconfigs = tempfile::Builder::new()
            .prefix("cso-move-kubeconfigs-")
            .tempdir()
            .map_err(|e| Error::io(Path::new("/tmp"), e))?;
        let source_kubeconfig = kubeconfigs.path().join("source.kubeconfig");
        let target_kubeconfig = kubeconfigs.path().join("target.kubeconfig");
        write_kubeconfig(&source.control_plane, &source_kubeconfig)?;
        write_kubeconfig(&target.control_plane, &target_kubeconfig)?;
        Ok(MovePlanes {
            workload,
            source_gc: source_gc?,
            target_gc: target_gc?,
            source,
            target,
            prepared,
            source_kubeconfig,
            target_kubeconfig,
            _kubeconfigs: kubeconfigs,
        })
    }

    /// The workload API server as the stand-in hands it to Cluster API.
    pub fn workload(&self) -> crate::stand_in::Workload {
        crate::stand_in::Workload {
            kubeconfig: self.workload.kubeconfig_yaml().to_owned(),
            server_url: self.workload.server_url().to_owned(),
        }
    }
}
