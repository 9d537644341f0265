//! The domain rules that more than one part of the operator needs, in one pure place: the ClusterStack
//! controller, the admission webhooks, the hook server and `cso render` call these instead of restating them,
//! so they cannot drift apart (they did: the webhook compared channels, the controller did not).
//!
//! - [`stack`]: what a ClusterStack's spec means ([`StackSpec`], [`StackKey`]), which releases it owns, and
//!   what its digest pins must be ([`version_digest_errors`]);
//! - [`users`]: which Clusters use which release;
//! - [`hooks`]: the Cluster API lifecycle hooks ([`Hook`]);
//! - [`hook_runs`]: which run of each hook a ClusterAddon is on, and its stage clock ([`HookRuns`]);
//! - [`addons`]: what a ClusterAddon records as applied, and whether that is done ([`AppliedAddons`]);
//! - [`class_move`]: whether Cluster API would accept moving a Cluster to another class, explained by the two
//!   classes ([`class_move::explain`]);
//! - [`move_variables`]: the variables a move writes: a rollout's declared changes and the old class's
//!   defaults followed, in the Cluster's own list and every override ([`move_variables::move_variables`]);
//! - [`rollout`]: a ClusterStackRollout's waves, the next Clusters to move, pause and resume, and when a
//!   Cluster is done on the new release ([`rollout::assess`], [`rollout::health`]).
//!
//! The identity of an applied object, [`crate::common::ObjectKey`], lives beside the inventory entry it keys.
//! Nothing here talks to a cluster: every function takes the objects it reads.

pub mod addons;
pub mod class_move;
pub mod hook_runs;
pub mod hooks;
pub mod move_variables;
pub mod rollout;
pub mod stack;
pub mod users;

pub use addons::AppliedAddons;
pub use hook_runs::{HookRun, HookRuns, HookStages, StageClock};
pub use hooks::Hook;
pub use stack::{FieldError, StackKey, StackSpec, version_digest_errors};
pub use users::{release_users, releases_in_use, stack_users};
