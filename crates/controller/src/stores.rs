//! The watch caches the reconcilers read instead of asking the API server, and the one rule that says when a
//! cached copy of a reconciled object may be used.
//!
//! Every kind the controllers react to is watched once ([`crate::watch::SharedWatch`]); its store is here.
//! A reconcile triggered by an event reads a store at least as new as that event (the store is filled before
//! the event is handed on). What a store cannot know is a write this process made a moment ago whose event
//! has not arrived yet: [`Written`] remembers the resourceVersion of our last write of each reconciled
//! object, and a queued copy older than that is read again from the API server
//! (`patch::current`). Without the stores (a reconciler called directly, in tests) everything is read from the
//! API server as before.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use cso_api::{ClusterAddon, ClusterStackRelease, capi::Cluster, fleet::ClusterSeen};
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Resource, ResourceExt,
    core::PartialObjectMeta,
    discovery::ApiResource,
    runtime::reflector::{ObjectRef, Store},
};

/// The stores of the shared watches that reconcilers read (a ClusterStack is read only as queued). Each is
/// used only once it has its first list; before that (or when its watch cannot list at all: no Cluster API
/// installed) the reconcilers read from the API server.
#[derive(Clone)]
pub(crate) struct Stores {
    pub(crate) releases: Listed<ClusterStackRelease>,
    pub(crate) addons: Listed<ClusterAddon>,
    /// Clusters, in the version they are read in (`Context::cluster_resource`).
    pub(crate) clusters: Listed<Cluster>,
    pub(crate) cluster_resource: ApiResource,
    /// Metadata of Cluster API's Secrets (type `cluster.x-k8s.io/secret`): whether a kubeconfig changed.
    pub(crate) capi_secrets: Listed<PartialObjectMeta<Secret>>,
    /// Whether the Cluster store holds every Cluster (no `--watch-filter`): only then can it say which
    /// releases are in use.
    pub(crate) all_clusters: bool,
}

/// A store and whether it has had its first list.
#[derive(Clone)]
pub(crate) struct Listed<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    pub(crate) store: Store<K>,
    pub(crate) listed: crate::watch::Listed,
}

impl<K> std::fmt::Debug for Listed<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listed")
            .field("objects", &self.store.state().len())
            .field("listed", &self.listed.now())
            .finish()
    }
}

impl<K> Listed<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    /// The store, if it has had its first list.
    fn store(&self) -> Option<&Store<K>> {
        self.listed.now().then_some(&self.store)
    }
}

impl<K> Listed<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// The object `name` in `namespace` as the watch last saw it: `Some(None)` when it has none, `None` when
    /// the store cannot tell (not listed yet).
    pub(crate) fn get(&self, namespace: &str, name: &str) -> Option<Option<Arc<K>>> {
        Some(self.store()?.get(&ObjectRef::new(name).within(namespace)))
    }
}

impl Stores {
    pub(crate) fn releases(&self) -> Option<&Store<ClusterStackRelease>> {
        self.releases.store()
    }

    pub(crate) fn addons(&self) -> Option<&Store<ClusterAddon>> {
        self.addons.store()
    }

    /// Every Cluster, when the store holds them all (the store's own copies: nothing is cloned).
    pub(crate) fn all_clusters(&self) -> Option<Vec<Arc<Cluster>>> {
        let store = self.clusters.store().filter(|_| self.all_clusters)?;
        Some(store.state())
    }

    /// The Cluster `name` in `namespace` as the watch last saw it: `Some(None)` when it has none, `None`
    /// when the store cannot tell.
    pub(crate) fn cluster(&self, namespace: &str, name: &str) -> Option<Option<Arc<Cluster>>> {
        let store = self.clusters.store()?;
        Some(store.get(&ObjectRef::new_with(name, self.cluster_resource.clone()).within(namespace)))
    }

    /// Whether the Cluster store has had its first list, where it is to hold every Cluster (elsewhere there is
    /// nothing to wait for).
    pub(crate) fn clusters_listed(&self) -> bool {
        !self.all_clusters || self.clusters.listed.now()
    }

    /// What the fleet counts know of the Cluster `name` in `namespace`, and the namespace of its ClusterClass:
    /// gone only when the store holds every Cluster and has none of that name.
    pub(crate) fn cluster_seen(&self, namespace: &str, name: &str) -> (ClusterSeen, Option<String>) {
        match self.cluster(namespace, name) {
            Some(Some(cluster)) => (
                ClusterSeen::of(Some(&cluster)),
                cluster.class().map(|class| class.namespace),
            ),
            Some(None) if self.all_clusters => (ClusterSeen::Gone, None),
            _ => (ClusterSeen::Unknown, None),
        }
    }

    /// The resourceVersion of the Secret `name` in `namespace` as the watch last saw it.
    pub(crate) fn capi_secret_version(&self, namespace: &str, name: &str) -> Option<String> {
        self.capi_secrets
            .store()?
            .get(&ObjectRef::new(name).within(namespace))
            .and_then(|s| s.resource_version())
    }
}

/// The resourceVersion our last write of each object returned, by `Kind/namespace/name`.
#[derive(Debug, Default)]
pub(crate) struct Written {
    versions: Mutex<HashMap<String, String>>,
}

fn key_of<K: Resource<DynamicType = ()>>(object: &K) -> String {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        object.namespace().unwrap_or_default(),
        object.name_any()
    )
}

impl Written {
    /// Records `object` as a write of ours returned it.
    pub(crate) fn record<K: Resource<DynamicType = ()>>(&self, object: &K) {
        let Some(version) = object.resource_version() else {
            return;
        };
        self.versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key_of(object), version);
    }

    /// Forgets what we wrote to `object` (it is gone, or was just read fresh).
    pub(crate) fn forget<K: Resource<DynamicType = ()>>(&self, object: &K) {
        self.versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key_of(object));
    }

    /// Whether `queued` may be used as it is: it is our last write's version, or we wrote nothing to it since
    /// the start (or since it was last read fresh). Only equality counts: resourceVersions are opaque.
    pub(crate) fn is_current<K: Resource<DynamicType = ()>>(&self, queued: &K) -> bool {
        match self
            .versions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key_of(queued))
        {
            None => true,
            Some(version) => queued.resource_version().as_deref() == Some(version.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use kube::api::ObjectMeta;

    use super::*;

    fn addon(name: &str, version: &str) -> ClusterAddon {
        ClusterAddon {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            spec: Default::default(),
            status: None,
        }
    }

    #[test]
    fn a_queued_copy_is_current_unless_we_wrote_a_newer_one() {
        let written = Written::default();
        // Nothing written since the start: the store's copy is as new as anything we know.
        assert!(written.is_current(&addon("a", "5")));
        // We wrote version 7: a copy at 5 was queued before our write; the copy at 7 is ours.
        written.record(&addon("a", "7"));
        assert!(!written.is_current(&addon("a", "5")));
        assert!(written.is_current(&addon("a", "7")));
        // A newer write by someone else is not ours either: read fresh (only equality counts).
        assert!(!written.is_current(&addon("a", "9")));
        // Other objects are not affected; forgetting starts over.
        assert!(written.is_current(&addon("b", "5")));
        written.forget(&addon("a", "7"));
        assert!(written.is_current(&addon("a", "5")));
    }
}
