//! Leader election with a `coordination.k8s.io` Lease named `clusterstack.x-k8s.io`, as the Go operator's.
//!
//! Only the leader runs the controllers; webhooks, the hook server, metrics and probes run on every replica.
//! Leadership is fail-stop: when the lease is taken over or cannot be renewed (renewal is due a third of the
//! lease duration before it expires), [`Leadership::lost`] resolves and the caller stops at once, before
//! another replica can acquire the lease. On a graceful stop the lease is released, so a successor need not
//! wait for it to expire.

use std::time::Duration;

use anyhow::Context;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};

/// The Go operator's leader-election ID.
pub const LEASE_NAME: &str = "clusterstack.x-k8s.io";
/// How long to wait before asking again after the API could not be reached while waiting for the lease.
const RETRY: Duration = Duration::from_secs(2);

/// Where and how long the lease is held.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub namespace: String,
    pub duration: Duration,
    /// This replica's name in the lease's `holderIdentity`.
    pub identity: String,
}

impl LeaseSettings {
    /// The pod name (`HOSTNAME`) plus a per-process suffix, so a restarted pod is a new holder.
    pub fn identity() -> String {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
            })
            .unwrap_or_else(|| "cso".to_owned());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        format!("{host}_{}_{nanos:08x}", std::process::id())
    }
}

/// The lease, held.
pub struct Leadership {
    manager: LeaseManager,
    identity: String,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// Waits until this replica holds the lease; `None` when `stop` resolves first.
pub async fn acquire(
    client: kube::Client,
    settings: &LeaseSettings,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<Option<Leadership>> {
    let seconds = settings.duration.as_secs().max(3);
    let manager = LeaseManagerBuilder::new(client, LEASE_NAME)
        .with_namespace(&settings.namespace)
        .with_identity(&settings.identity)
        .with_duration(seconds)
        .with_grace(seconds / 3)
        .build()
        .await
        .with_context(|| {
            format!(
                "cannot use the leader-election Lease {}/{LEASE_NAME}",
                settings.namespace
            )
        })?;
    tracing::info!(identity = %settings.identity, namespace = %settings.namespace, lease = LEASE_NAME,
        "waiting for the leader-election lease");
    let wait = async {
        loop {
            match manager.changed().await {
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the leader-election lease; trying again");
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    };
    tokio::select! {
        () = wait => {
            tracing::info!(identity = %settings.identity, "became the leader");
            Ok(Some(Leadership { manager, identity: settings.identity.clone() }))
        }
        () = stop => Ok(None),
    }
}

impl Leadership {
    /// Keeps the lease renewed; resolves (with the reason) only when leadership is lost.
    pub async fn lost(&self) -> String {
        loop {
            match self.manager.changed().await {
                Ok(true) => continue,
                Ok(false) => return "another replica holds the lease".to_owned(),
                Err(e) => return format!("the lease could not be renewed: {e}"),
            }
        }
    }

    /// Gives the lease up so that another replica takes over at once.
    pub async fn release(self) {
        match self.manager.release().await {
            Ok(()) => tracing::info!(identity = %self.identity, "released the leader-election lease"),
            Err(e) => {
                tracing::warn!(error = %e, "cannot release the leader-election lease; it expires on its own")
            }
        }
    }
}
