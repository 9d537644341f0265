//! Applying rendered objects to a cluster (management or workload): a discovery cache per cluster
//! ([`discovery`]), an inventory of what was applied keyed by group, kind, namespace and name
//! ([`inventory`]), the engine that applies in order and prunes ([`engine`]) and its dry run ([`plan`]),
//! CEL wait conditions ([`cel`]), health gates over what was applied ([`health`]), client-side rate limits
//! ([`rate_limit`]), request counts ([`request_tally`]), clients for workload clusters ([`workload`]) with
//! watches that find drift ([`drift`]), who wrote which fields ([`managed_fields`]) and the data values
//! templates see ([`template_data`]).

pub mod cel;
mod connection;
pub mod discovery;
pub mod drift;
pub mod engine;
pub mod health;
pub mod inventory;
mod lean_http2;
pub mod managed_fields;
pub mod plan;
pub mod rate_limit;
pub mod request_tally;
pub mod template_data;
pub mod workload;

pub use connection::{Connections, IdleConnection};
pub use discovery::{ClusterDiscovery, DiscoveryError, cluster_resource};
pub use drift::{DriftCause, DriftNotifier, DriftWatch, Verdict};
pub use engine::{ApplyEngine, ApplyReport, DEFAULT_FIELD_MANAGER, Failure, LiveMeta};
pub use health::{Health, HealthReport};
pub use inventory::{ObjectKey, resource_of};
pub use managed_fields::Writer;
pub use plan::{Change, PlannedChange};
pub use rate_limit::{ClientLimits, limited_client, observed_client};
pub use request_tally::{RequestKind, RequestObserver, RequestTally};
pub use workload::{WorkloadClients, WorkloadCluster, WorkloadError};
