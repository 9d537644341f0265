//! The local source (`--local`): releases already unpacked under `<release-dir>/cluster-stacks/<tag>/`.
//! Listing works, so auto-subscribe works offline; nothing can be downloaded.
//!
//! The directory is the cache's own (`<release-dir>/cluster-stacks`), so a local release is loaded by
//! [`ReleaseCache::cached`](crate::ReleaseCache::cached), which reads its archives through before their
//! first use, like a downloaded release's: files put there by hand are trusted no more than a download.

use std::path::{Path, PathBuf};

use futures::future::BoxFuture;

use super::{ReleaseSource, SourceError};

#[derive(Clone, Debug)]
pub struct LocalSource {
    /// `<release-dir>/cluster-stacks`
    root: PathBuf,
}

impl LocalSource {
    pub fn new(cluster_stacks_dir: impl Into<PathBuf>) -> Self {
        LocalSource {
            root: cluster_stacks_dir.into(),
        }
    }
}

impl ReleaseSource for LocalSource {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn list_tags(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>> {
        Box::pin(async move {
            let entries = match std::fs::read_dir(&self.root) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(source) => {
                    return Err(SourceError::Io {
                        path: self.root.clone(),
                        source,
                    });
                }
            };
            let mut tags: Vec<String> = entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|name| !name.starts_with('.'))
                .collect();
            tags.sort();
            Ok(tags)
        })
    }

    fn download<'a>(
        &'a self,
        tag: &'a str,
        _dest: &'a Path,
        _pin: Option<&'a str>,
    ) -> BoxFuture<'a, Result<super::Provenance, SourceError>> {
        Box::pin(async move {
            Err(SourceError::NotFound {
                what: format!(
                    "release {tag} in {} (local mode downloads nothing)",
                    self.root.display()
                ),
            })
        })
    }
}
