//! Cluster-stack releases: what a release contains ([`Release`], [`Metadata`], [`AddonConfig`]), where it
//! comes from ([`source`]: a local directory, GitHub releases, OCI) and how it is kept ([`ReleaseCache`]:
//! verified, atomic, one download per tag, chart dependencies resolved on the way in: [`deps`]), with safe
//! unpacking of its archives ([`archive`]).

pub mod addon_config;
pub mod archive;
pub mod cache;
pub mod deps;
pub mod metadata;
pub mod release;
pub mod source;

use std::path::PathBuf;

pub use addon_config::{AddonConfig, Hook, Stage};
pub use cache::{CacheError, ReleaseCache};
pub use deps::{ChartMirrors, DependencyResolver};
pub use metadata::Metadata;
pub use release::{AddonStyle, Release};
pub use source::{ReleaseSource, SourceError, StackKey};

/// A release whose files are missing or wrong. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("{path}: missing {what}")]
    Missing { path: PathBuf, what: String },
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
    #[error(transparent)]
    Archive(#[from] archive::ArchiveError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}
