//! The operator's HTTPS endpoints: the validating admission webhooks ([`admission`]) and the Cluster API
//! runtime-extension server with the lifecycle hooks ([`hooks`]), served with certificates that are reloaded
//! when they change ([`tls`]).

pub mod admission;
pub mod hooks;
pub mod tls;

pub use admission::router as admission_router;
pub use hooks::router as hook_router;
pub use tls::{ServeError, TlsServer};
