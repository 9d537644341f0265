//! One discovery cache per cluster: kinds are resolved once and asked again only when unknown (a CRD that
//! was just installed, or a kind the cluster does not serve).

use std::{collections::HashMap, sync::RwLock};

use kube::{
    Client,
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

fn describe(gvk: &GroupVersionKind) -> String {
    if gvk.group.is_empty() {
        format!("{}/{}", gvk.version, gvk.kind)
    } else {
        format!("{}/{}/{}", gvk.group, gvk.version, gvk.kind)
    }
}

/// How the operator addresses one kind.
#[derive(Clone, Debug)]
pub struct ResolvedKind {
    pub resource: ApiResource,
    pub namespaced: bool,
}

pub struct ClusterDiscovery {
    client: Client,
    kinds: RwLock<HashMap<GroupVersionKind, ResolvedKind>>,
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
    pub fn new(client: Client) -> Self {
        ClusterDiscovery {
            client,
            kinds: RwLock::default(),
        }
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The API resource of `gvk`, from the cache or, when unknown, from the cluster.
    pub async fn resolve(&self, gvk: &GroupVersionKind) -> Result<ResolvedKind, DiscoveryError> {
        if let Some(kind) = self.kinds.read().unwrap_or_else(|p| p.into_inner()).get(gvk) {
            return Ok(kind.clone());
        }
        let (resource, capabilities): (ApiResource, ApiCapabilities) =
            match kube::discovery::pinned_kind(&self.client, gvk).await {
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
        self.kinds
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(gvk.clone(), kind.clone());
        Ok(kind)
    }

    /// Drops a kind from the cache (after the cluster said it does not know it any more).
    pub fn forget(&self, gvk: &GroupVersionKind) {
        self.kinds.write().unwrap_or_else(|p| p.into_inner()).remove(gvk);
    }
}
