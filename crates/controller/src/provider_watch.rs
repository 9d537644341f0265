//! Watches on provider objects (`<X>ClusterStackRelease`), started the first time a ClusterStackRelease
//! refers to a kind: a change of a provider object (its `status.ready`) reconciles the ClusterStackRelease
//! that owns it at once, instead of at the next poll. Each watch retries on its own bounded backoff
//! ([`crate::watch`]).

use std::{collections::HashMap, sync::Mutex};

use cso_api::{ClusterStackRelease, GROUP};
use futures::{Stream, StreamExt};
use kube::{
    Api, Client, ResourceExt,
    api::DynamicObject,
    core::GroupVersionKind,
    discovery::ApiResource,
    runtime::{WatchStreamExt, reflector::ObjectRef, watcher},
};
use tokio::sync::mpsc;

/// The provider-object watches of one operator.
pub struct ProviderWatches {
    client: Client,
    namespace: Option<String>,
    sender: mpsc::UnboundedSender<ObjectRef<ClusterStackRelease>>,
    running: Mutex<HashMap<GroupVersionKind, AbortOnDrop>>,
}

impl std::fmt::Debug for ProviderWatches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kinds: Vec<String> = self
            .running
            .lock()
            .map(|r| r.keys().map(|gvk| gvk.kind.clone()).collect())
            .unwrap_or_default();
        f.debug_struct("ProviderWatches")
            .field("kinds", &kinds)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl ProviderWatches {
    /// The watches and the stream of ClusterStackReleases to reconcile because their provider object changed.
    pub(crate) fn new(
        client: Client,
        namespace: Option<String>,
    ) -> (
        Self,
        impl Stream<Item = ObjectRef<ClusterStackRelease>> + Send + 'static,
    ) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let triggers = futures::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|item| (item, receiver))
        });
        let watches = ProviderWatches {
            client,
            namespace,
            sender,
            running: Mutex::default(),
        };
        (watches, triggers)
    }

    /// Starts watching `gvk` unless it is watched already.
    pub(crate) fn ensure(&self, gvk: &GroupVersionKind, resource: &ApiResource) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if running.contains_key(gvk) {
            return;
        }
        let api: Api<DynamicObject> = match &self.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, resource),
            None => Api::all_with(self.client.clone(), resource),
        };
        let sender = self.sender.clone();
        let kind = gvk.kind.clone();
        let task = tokio::spawn(async move {
            let mut objects = watcher(api, watcher::Config::default().any_semantic())
                .backoff(crate::watch::backoff())
                .touched_objects()
                .boxed();
            while let Some(object) = objects.next().await {
                let object = match object {
                    Ok(object) => object,
                    Err(e) => {
                        tracing::debug!(%kind, error = %e, "provider object watch interrupted");
                        continue;
                    }
                };
                let namespace = object.namespace().unwrap_or_default();
                for owner in object.owner_references() {
                    if owner.kind == "ClusterStackRelease"
                        && owner.api_version.split('/').next() == Some(GROUP)
                        && sender
                            .send(ObjectRef::new(&owner.name).within(&namespace))
                            .is_err()
                    {
                        return;
                    }
                }
            }
        });
        tracing::info!(kind = %gvk.kind, group = %gvk.group, "watching provider objects");
        running.insert(gvk.clone(), AbortOnDrop(task));
    }
}
