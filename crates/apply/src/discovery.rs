//! One discovery cache per cluster: kinds are resolved once and asked again only when unknown (a CRD that
//! was just installed, or a kind the cluster does not serve), and held once for all clusters that serve a
//! kind alike; a group's preferred version is kept for [`PREFERRED_VERSION_TTL`].
//! [`ClusterDiscovery::get_object`] reads one object of any kind through it, named the way Cluster API
//! references name objects. [`cluster_resource`] decides, once at start-up, which version of Cluster API
//! `Cluster`s the operator reads.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, RwLock},
};

use cso_api::capi::{CAPI_GROUP, CLUSTER_VERSIONS, Cluster, FALLBACK_CLUSTER_VERSION, read_version};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIGroup;
use kube::{
    Api, Client,
    api::DynamicObject,
    core::GroupVersionKind,
    discovery::{ApiCapabilities, ApiResource, Scope},
};

/// A kind the cluster does not serve, or discovery that failed.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("the cluster does not serve {}", describe(.0))]
    UnknownKind(GroupVersionKind),
    #[error("discovery of {} failed: {error}", describe(gvk))]
    Failed {
        gvk: GroupVersionKind,
        error: kube::Error,
    },
}

/// `group/version/Kind`; the parts that are empty (the core group, or a version not known yet because a
/// reference named only the group) are left out.
fn describe(gvk: &GroupVersionKind) -> String {
    [gvk.group.as_str(), gvk.version.as_str(), gvk.kind.as_str()]
        .into_iter()
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join("/")
}

/// How a reference names the API of the object it points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiRef<'a> {
    /// A full `apiVersion`: `group/version`, or just `version` for the core group (`v1`). Cluster API
    /// `v1beta1` references have this shape.
    Version(&'a str),
    /// Only the API group (Cluster API `v1beta2` references, `apiGroup`): the object is read in the version
    /// the cluster prefers for that group.
    Group(&'a str),
}

/// Why [`ClusterDiscovery::get_object`] could not read an object.
#[derive(Debug, thiserror::Error)]
pub enum GetObjectError {
    /// The cluster does not serve the kind (or its group), or discovery failed.
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    /// The kind is served but the read failed (not a 404: a missing object is `Ok(None)`).
    #[error("failed to read {kind} {}: {error}", describe_object(namespace.as_deref(), name))]
    Read {
        kind: String,
        namespace: Option<String>,
        name: String,
        error: kube::Error,
    },
}

fn describe_object(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name.to_owned(),
    }
}

/// The versions in which the cluster serves `kind` of API `group`, the group's preferred version first and
/// then the others newest first (Kubernetes' version priority). Empty when the group is served but not the
/// kind; [`DiscoveryError::UnknownKind`] when the group is not served at all.
pub async fn served_versions(
    client: &Client,
    group: &str,
    kind: &str,
) -> Result<Vec<String>, DiscoveryError> {
    let unversioned = GroupVersionKind::gvk(group, "", kind);
    let api_group = match kube::discovery::group(client, group).await {
        Ok(api_group) => api_group,
        Err(kube::Error::Discovery(_)) => return Err(DiscoveryError::UnknownKind(unversioned)),
        Err(kube::Error::Api(status)) if status.code == 404 => {
            return Err(DiscoveryError::UnknownKind(unversioned));
        }
        Err(error) => {
            return Err(DiscoveryError::Failed {
                gvk: unversioned,
                error,
            });
        }
    };
    let serves_kind = |version: &str| {
        api_group
            .versioned_resources(version)
            .iter()
            .any(|(resource, _)| resource.kind == kind)
    };
    let preferred = api_group.preferred_version().filter(|v| serves_kind(v));
    let others = api_group
        .versions()
        .filter(|v| Some(*v) != preferred && serves_kind(v));
    Ok(preferred.into_iter().chain(others).map(str::to_owned).collect())
}

/// The API resource the operator reads, lists and watches Cluster API `Cluster`s in, decided once at
/// start-up: the newest version the cluster serves that the view is written for
/// ([`cso_api::capi::read_version`]); `v1beta1` when discovery fails or Cluster API is not installed (yet).
///
/// Cluster API 1.11 and later serve `v1beta2` (and store it); `v1beta1` is to be removed, and an operator
/// that reads through it would then see no Clusters at all. A Cluster API installed or upgraded after the
/// start is read in the version decided at the start until the operator restarts (`v1beta1` stays served
/// for releases to come, so that is still correct, only older).
pub async fn cluster_resource(client: &Client) -> ApiResource {
    let mut wait = CLUSTER_DISCOVERY_FIRST_WAIT;
    let mut attempts = 1;
    let served = loop {
        match served_versions(client, CAPI_GROUP, "Cluster").await {
            Ok(served) => break served,
            Err(DiscoveryError::UnknownKind(_)) => break Vec::new(),
            // A failure (not an answer) is asked again a few times: the choice stays for the whole run, and
            // falling back for a blip would read Clusters in v1beta1 until the next restart.
            Err(error) if attempts < CLUSTER_DISCOVERY_ATTEMPTS => {
                tracing::debug!(%error, retry_in = ?wait, "asking which versions of Clusters are served");
                tokio::time::sleep(wait).await;
                wait *= 2;
                attempts += 1;
            }
            Err(error) => {
                tracing::warn!(%error, fallback = FALLBACK_CLUSTER_VERSION,
                    "cannot tell which versions of Cluster API Clusters are served");
                break Vec::new();
            }
        }
    };
    let version = read_version(&served);
    if !served.is_empty() && !CLUSTER_VERSIONS.contains(&version) {
        tracing::warn!(%version, ?served, known = ?CLUSTER_VERSIONS,
            "Clusters are served in no version this operator is written for; reading them in the preferred one");
    }
    tracing::info!(group = CAPI_GROUP, %version, ?served, "reading Cluster API Clusters");
    Cluster::resource(version)
}

/// How often [`cluster_resource`] asks when discovery fails, and how long it first waits (doubling): 3.5 s
/// of waiting in all, before falling back.
const CLUSTER_DISCOVERY_ATTEMPTS: u32 = 4;
const CLUSTER_DISCOVERY_FIRST_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// How the operator addresses one kind.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedKind {
    pub resource: ApiResource,
    pub namespaced: bool,
}

/// A kind as one cluster serves it.
type KnownKind = (GroupVersionKind, ResolvedKind);

/// The kinds the clusters serve, each held once for every cluster that serves it alike: the workload clusters
/// of a fleet serve the same kinds (a deployment's, a CRD's), and each [`ClusterDiscovery`] holds its kinds
/// (about 4 KiB of names per cluster) through these. A kind no cluster holds any more is let go.
static KINDS_SERVED: std::sync::LazyLock<Mutex<HashMap<GroupVersionKind, Vec<std::sync::Weak<KnownKind>>>>> =
    std::sync::LazyLock::new(Mutex::default);

/// The shared copy of `known`.
fn shared_kind(known: KnownKind) -> Arc<KnownKind> {
    let mut served = KINDS_SERVED.lock().unwrap_or_else(|p| p.into_inner());
    let alike = served.entry(known.0.clone()).or_default();
    alike.retain(|kind| kind.strong_count() > 0);
    if let Some(shared) = alike
        .iter()
        .filter_map(std::sync::Weak::upgrade)
        .find(|kind| **kind == known)
    {
        return shared;
    }
    let shared = Arc::new(known);
    alike.push(Arc::downgrade(&shared));
    shared
}

/// Where a [`ClusterDiscovery`]'s client comes from.
enum ClientSlot {
    Kept(Client),
    OnDemand(OnDemand),
}

/// A client made when asked for and dropped once not asked for during `idle`.
struct OnDemand {
    maker: crate::rate_limit::ClientMaker,
    idle: std::time::Duration,
    current: Arc<Mutex<Option<CurrentClient>>>,
}

struct CurrentClient {
    client: Client,
    last_asked: tokio::time::Instant,
}

impl OnDemand {
    fn client(&self) -> Client {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(current) = current.as_mut() {
            current.last_asked = tokio::time::Instant::now();
            return current.client.clone();
        }
        let client = self.maker.make();
        *current = Some(CurrentClient {
            client: client.clone(),
            last_asked: tokio::time::Instant::now(),
        });
        tokio::spawn(drop_when_idle(Arc::downgrade(&self.current), self.idle));
        client
    }

    #[cfg(test)]
    fn holds_a_client(&self) -> bool {
        self.current.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }
}

/// Drops the client in `slot` once it has not been asked for during `idle` (clones in use live on until
/// their users are done); ends with it, or with the slot.
async fn drop_when_idle(slot: std::sync::Weak<Mutex<Option<CurrentClient>>>, idle: std::time::Duration) {
    let mut wait = idle;
    loop {
        tokio::time::sleep(wait).await;
        let Some(slot) = slot.upgrade() else { return };
        let mut current = slot.lock().unwrap_or_else(|p| p.into_inner());
        let Some(asked) = current.as_ref().map(|c| c.last_asked.elapsed()) else {
            return;
        };
        if asked >= idle {
            *current = None;
            return;
        }
        wait = idle - asked;
    }
}

/// How long a group's preferred version is trusted: an upgrade of Cluster API or a provider that changes it
/// is seen within this time, and a reference naming only its group costs no discovery request otherwise.
pub const PREFERRED_VERSION_TTL: std::time::Duration = std::time::Duration::from_secs(60);

pub struct ClusterDiscovery {
    client: ClientSlot,
    /// The kinds resolved so far (a few: a linear search finds one).
    kinds: RwLock<Vec<Arc<KnownKind>>>,
    /// Each group's preferred version, and when it was asked.
    preferred: RwLock<HashMap<String, (String, std::time::Instant)>>,
    /// The version each kind named by group alone is read in (group, kind), and when it was found.
    kind_versions: RwLock<HashMap<(String, String), (String, std::time::Instant)>>,
}

impl std::fmt::Debug for ClusterDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let known = self.kinds.read().map(|k| k.len()).unwrap_or_default();
        f.debug_struct("ClusterDiscovery")
            .field("known_kinds", &known)
            .finish_non_exhaustive()
    }
}

impl ClusterDiscovery {
    /// Discovery through `client`, which it keeps.
    pub fn new(client: Client) -> Self {
        Self::with_slot(ClientSlot::Kept(client))
    }

    /// Discovery through clients of `maker`, made when needed and dropped once unused for `idle`: a
    /// client's request channel and the task serving it (a tokio block of 32 requests, 11 KiB, and more once
    /// used) are not kept for a cluster that is talked to once in a while. What was discovered is kept.
    pub fn on_demand(maker: crate::rate_limit::ClientMaker, idle: std::time::Duration) -> Self {
        Self::with_slot(ClientSlot::OnDemand(OnDemand {
            maker,
            idle,
            current: Arc::default(),
        }))
    }

    fn with_slot(client: ClientSlot) -> Self {
        ClusterDiscovery {
            client,
            kinds: RwLock::default(),
            preferred: RwLock::default(),
            kind_versions: RwLock::default(),
        }
    }

    /// The client to talk to the cluster with (a clone: cheap).
    pub fn client(&self) -> Client {
        match &self.client {
            ClientSlot::Kept(client) => client.clone(),
            ClientSlot::OnDemand(on_demand) => on_demand.client(),
        }
    }

    /// A client for requests that stay open (watches): over the lean connection of the maker of the clients
    /// made on demand, without a kube client of its own ([`crate::rate_limit::DirectClient`]), or through the
    /// kept client.
    /// Each call makes one with a rate limit of its own: a caller makes one and clones it.
    pub fn direct_client(&self) -> crate::rate_limit::DirectClient {
        match &self.client {
            ClientSlot::Kept(client) => client.clone().into(),
            ClientSlot::OnDemand(on_demand) => on_demand.maker.direct(),
        }
    }

    /// The API resource of `gvk`, from the cache or, when unknown, from the cluster.
    pub async fn resolve(&self, gvk: &GroupVersionKind) -> Result<ResolvedKind, DiscoveryError> {
        if let Some(known) = self
            .kinds
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|known| known.0 == *gvk)
        {
            return Ok(known.1.clone());
        }
        let (resource, capabilities): (ApiResource, ApiCapabilities) =
            match kube::discovery::pinned_kind(&self.client(), gvk).await {
                Ok(found) => found,
                Err(kube::Error::Api(status)) if status.code == 404 => {
                    return Err(DiscoveryError::UnknownKind(gvk.clone()));
                }
                Err(kube::Error::Discovery(_)) => return Err(DiscoveryError::UnknownKind(gvk.clone())),
                Err(error) => {
                    return Err(DiscoveryError::Failed {
                        gvk: gvk.clone(),
                        error,
                    });
                }
            };
        let kind = ResolvedKind {
            resource,
            namespaced: capabilities.scope == Scope::Namespaced,
        };
        let shared = shared_kind((gvk.clone(), kind.clone()));
        let mut kinds = self.kinds.write().unwrap_or_else(|p| p.into_inner());
        kinds.retain(|known| known.0 != *gvk);
        kinds.push(shared);
        Ok(kind)
    }

    /// The version the cluster prefers for API `group` (the one `kubectl get` would show), e.g. `v1beta2`
    /// for `cluster.x-k8s.io` on Cluster API 1.11 and later, `v1beta1` before.
    ///
    /// Asked of the cluster every time, not cached: it changes when a CRD gains or loses a version (a Cluster
    /// API upgrade), and it is needed only when reading objects named by group alone, one request beside
    /// the read itself. `kind` only names what was looked for in a [`DiscoveryError`]: a group the cluster
    /// does not serve is [`DiscoveryError::UnknownKind`] with an empty version.
    pub async fn preferred_version(&self, group: &str, kind: &str) -> Result<String, DiscoveryError> {
        let unversioned = GroupVersionKind::gvk(group, "", kind);
        if group.is_empty() {
            // The core group has one version; `/api` lists it, there is no `/apis/` document for it.
            return Ok("v1".to_owned());
        }
        if let Some((version, asked)) = self
            .preferred
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(group)
            && asked.elapsed() < PREFERRED_VERSION_TTL
        {
            return Ok(version.clone());
        }
        let document = self.group_document(group, kind).await?;
        let version = document
            .preferred_version
            .map(|v| v.version)
            .or_else(|| document.versions.first().map(|v| v.version.clone()))
            .ok_or(DiscoveryError::UnknownKind(unversioned))?;
        self.preferred
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(group.to_owned(), (version.clone(), std::time::Instant::now()));
        Ok(version)
    }

    /// The discovery document of API `group` (`/apis/<group>`): its versions, in the server's order of
    /// preference. `kind` only names what was looked for in a [`DiscoveryError`].
    async fn group_document(&self, group: &str, kind: &str) -> Result<APIGroup, DiscoveryError> {
        let unversioned = GroupVersionKind::gvk(group, "", kind);
        let request = http::Request::get(format!("/apis/{group}"))
            .body(Vec::new())
            .map_err(|e| DiscoveryError::Failed {
                gvk: unversioned.clone(),
                error: kube::Error::HttpError(e),
            })?;
        match self.client().request(request).await {
            Ok(document) => Ok(document),
            Err(kube::Error::Api(status)) if status.code == 404 => {
                Err(DiscoveryError::UnknownKind(unversioned))
            }
            Err(error) => Err(DiscoveryError::Failed {
                gvk: unversioned,
                error,
            }),
        }
    }

    /// The version of `group` that `kind`, named by its group alone, is read in: the group's preferred
    /// version when it serves the kind, else the first of the group's versions (in the server's order of
    /// preference) that does. Kept for [`PREFERRED_VERSION_TTL`].
    ///
    /// The preferred version is the group's, not the kind's: providers share groups (every infrastructure
    /// provider's kinds are in `infrastructure.cluster.x-k8s.io`), so beside CAPD 1.14 (`v1beta2`) the
    /// group prefers `v1beta2` while CAPO 0.14's `OpenStackCluster` is served in `v1beta1` only, and
    /// reading it in the preferred version says the cluster does not serve it. Cluster API finds the
    /// version from the CRD's contract label; the newest version that serves the kind is the same one.
    pub async fn version_of_kind(&self, group: &str, kind: &str) -> Result<String, DiscoveryError> {
        let key = (group.to_owned(), kind.to_owned());
        if let Some((version, found)) = self
            .kind_versions
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            && found.elapsed() < PREFERRED_VERSION_TTL
        {
            return Ok(version.clone());
        }
        let preferred = self.preferred_version(group, kind).await?;
        let version = match self
            .resolve(&GroupVersionKind::gvk(group, &preferred, kind))
            .await
        {
            Ok(_) => preferred,
            Err(DiscoveryError::UnknownKind(unknown)) if !group.is_empty() => {
                let mut serving = None;
                for version in self.group_document(group, kind).await?.versions {
                    if version.version == preferred {
                        continue;
                    }
                    match self
                        .resolve(&GroupVersionKind::gvk(group, &version.version, kind))
                        .await
                    {
                        Ok(_) => {
                            serving = Some(version.version);
                            break;
                        }
                        Err(DiscoveryError::UnknownKind(_)) => {}
                        Err(error) => return Err(error),
                    }
                }
                serving.ok_or(DiscoveryError::UnknownKind(unknown))?
            }
            Err(error) => return Err(error),
        };
        self.kind_versions
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, (version.clone(), std::time::Instant::now()));
        Ok(version)
    }

    /// Reads the object `kind` `namespace/name` in the API `api` names, as the API server returns it.
    ///
    /// `Ok(None)` when the object does not exist. A kind the cluster does not serve (its CRD is not
    /// installed) is [`DiscoveryError::UnknownKind`], so callers can tell "not there yet" from a failure.
    /// `namespace` is ignored for a cluster-scoped kind; for a namespaced kind without one, the client's
    /// default namespace is used, as kubectl does. With [`ApiRef::Group`] the kind is read in the group's
    /// preferred version when it is served there, else in the newest that serves it
    /// ([`ClusterDiscovery::version_of_kind`]). A kind whose
    /// CRD was removed after it was resolved reads as `Ok(None)`: the API server answers 404 either way.
    pub async fn get_object(
        &self,
        api: ApiRef<'_>,
        kind: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<DynamicObject>, GetObjectError> {
        let gvk = match api {
            ApiRef::Version(api_version) => {
                let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
                GroupVersionKind::gvk(group, version, kind)
            }
            ApiRef::Group(group) => {
                let version = self.version_of_kind(group, kind).await?;
                GroupVersionKind::gvk(group, &version, kind)
            }
        };
        let resolved = match self.resolve(&gvk).await {
            Ok(resolved) => resolved,
            Err(error) => {
                // The preferred version may have moved on: asked again next time.
                if matches!(api, ApiRef::Group(_)) {
                    self.forget_group(&gvk.group);
                }
                return Err(error.into());
            }
        };
        let objects: Api<DynamicObject> = match (resolved.namespaced, namespace) {
            (true, Some(namespace)) => Api::namespaced_with(self.client(), namespace, &resolved.resource),
            (true, None) => Api::default_namespaced_with(self.client(), &resolved.resource),
            (false, _) => Api::all_with(self.client(), &resolved.resource),
        };
        objects.get_opt(name).await.map_err(|error| GetObjectError::Read {
            kind: kind.to_owned(),
            namespace: namespace.filter(|_| resolved.namespaced).map(str::to_owned),
            name: name.to_owned(),
            error,
        })
    }

    /// Drops a kind, and its group's preferred version, from the cache (after the cluster said it does not
    /// know it any more).
    pub fn forget(&self, gvk: &GroupVersionKind) {
        self.kinds
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|known| known.0 != *gvk);
        self.forget_group(&gvk.group);
    }

    /// Drops what is known of `group`'s versions: its preferred one and those its kinds are read in.
    fn forget_group(&self, group: &str) {
        self.preferred
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(group);
        self.kind_versions
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(kind_group, _), _| kind_group != group);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{ClientLimits, IdleConnection, rate_limit::ClientMaker};

    /// Clusters that serve a kind alike hold one copy of it; one that serves it otherwise (another plural, a
    /// CRD of its own) holds its own; a copy no cluster holds is let go.
    #[test]
    fn kinds_served_alike_are_held_once() {
        let gvk = GroupVersionKind::gvk("kinds.test.cso", "v1", "Widget");
        let known = |plural: &str| {
            let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
            (
                gvk.clone(),
                ResolvedKind {
                    resource,
                    namespaced: true,
                },
            )
        };
        let first = shared_kind(known("widgets"));
        let second = shared_kind(known("widgets"));
        assert!(Arc::ptr_eq(&first, &second), "served alike: one copy");
        let other = shared_kind(known("widgetz"));
        assert!(!Arc::ptr_eq(&first, &other), "served otherwise: its own");
        assert_eq!(other.1.resource.plural, "widgetz");
        drop((first, second));
        let alike = KINDS_SERVED.lock().unwrap()[&gvk]
            .iter()
            .filter(|k| k.strong_count() > 0)
            .count();
        assert_eq!(alike, 1, "only the copy still held is left");
    }

    /// A client made on demand is kept while it is asked for, dropped once it was not asked for during the
    /// idle time, and made again when asked for. (Making a client connects nowhere: no server is needed.)
    #[tokio::test(start_paused = true)]
    async fn an_on_demand_client_is_dropped_once_idle_and_made_again_when_asked_for() {
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let maker = ClientMaker::new(
            config,
            ClientLimits::UNLIMITED,
            None,
            IdleConnection::ReleasedAfter(Duration::from_secs(1)),
            crate::Connections::Pooled,
        )
        .unwrap();
        let idle = Duration::from_secs(2);
        let discovery = ClusterDiscovery::on_demand(maker, idle);
        let ClientSlot::OnDemand(slot) = &discovery.client else {
            panic!("not on demand")
        };
        assert!(!slot.holds_a_client(), "made before it was asked for");

        drop(discovery.client());
        assert!(slot.holds_a_client());
        // Asked for again within the idle time: kept past the first one's idle time.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        drop(discovery.client());
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(slot.holds_a_client(), "dropped 1.5 s after it was asked for");
        tokio::time::sleep(Duration::from_millis(1000)).await;
        assert!(!slot.holds_a_client(), "kept 2.5 s after it was last asked for");

        drop(discovery.client());
        assert!(slot.holds_a_client(), "not made again");
    }
}
