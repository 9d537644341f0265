//! The operator's reconcilers. Each follows dereference -> validate -> build (pure) -> apply -> status;
//! the pure parts live beside them and are tested without a cluster.

pub mod cluster_stack;
