//! The ClusterStack controller: which ClusterStackReleases must exist, and the status that says so.

pub mod plan;
