//! The operator's reconcilers. Each reads its object, observes what it needs, decides in pure functions
//! (the next step, then the status, events and retry from what happened; table tests beside them) and acts
//! through one applier (`applier`); the status is written once, from what the act step reported.
//! `docs/architecture.md` shows the data flow module by module.
//!
//! [`run`] starts the controllers (ClusterStack, ClusterStackRelease, ClusterAddonCreate, ClusterAddon,
//! ClusterStackRollout) on one shared [`Context`], with the fleet status writer (`fleet_status`: the Cluster
//! counts in the statuses), and runs them until shutdown.

mod applier;
pub mod cluster_addon;
pub mod cluster_addon_create;
pub mod cluster_stack;
pub mod cluster_stack_release;
mod context;
mod events;
mod filter;
mod fleet_status;
mod in_use;
pub mod metrics;
mod moving;
mod patch;
pub mod preflight;
pub mod preview;
mod provider_watch;
mod recorder;
pub mod rendering;
pub mod rollout;
mod run;
mod shard;
mod stores;
mod unattended;
mod watch;

pub use context::{Context, ControllerContext, EVENT_REPORTER, Settings};
/// The version Clusters are read in, for [`Operator::cluster_resource`].
pub use cso_apply::cluster_resource;
pub use metrics::{MeteredRenderer, MeteredSource, Metrics};
pub use run::{Operator, run};

/// Why a reconcile did not finish. What the user can act on is also in the object's conditions.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("failed to {action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    /// Already written to the object's conditions (and usually an event); retried with backoff.
    #[error("{0}")]
    Reported(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// The reconcile took longer than `--reconcile-timeout` and was stopped; it is retried.
    #[error("the reconcile took longer than {0:?} and was stopped; it is retried")]
    TimedOut(std::time::Duration),
}

impl Error {
    pub(crate) fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube {
            action: action.into(),
            source,
        }
    }
}
