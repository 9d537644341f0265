//! The local source (`--local`): releases already unpacked under `<release-dir>/cluster-stacks/<tag>/`.
//! Listing works, so auto-subscribe works offline; nothing is downloaded.
//!
//! The directory is the cache's own (`<release-dir>/cluster-stacks`), so a local release is loaded by
//! [`ReleaseCache::cached`](crate::ReleaseCache::cached), which reads its archives through before their
//! first use, like a downloaded release's: files put there by hand are trusted no more than a download.
//! A local release whose charts do not vendor their dependencies is the one the cache "downloads": this
//! source copies its files into the cache's staging directory (never writing into the release directory,
//! which is the stack author's build output), and the cache resolves the dependencies in the copy as it does
//! for a download (see [`crate::cache`]). The copy's provenance carries the digest of the files
//! ([`files_digest`]), which names the copy.

use std::path::{Path, PathBuf};

use futures::future::BoxFuture;

use super::{Provenance, Refusal, ReleaseSource, SourceError};
use crate::release::{copy_release_dir, files_digest};

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

    /// Copies the files of release `tag` into `dest`; the provenance records their digest. A pin (a
    /// ClusterStack's `versionDigests`) is compared with that digest.
    fn download<'a>(
        &'a self,
        tag: &'a str,
        dest: &'a Path,
        pin: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Provenance, SourceError>> {
        Box::pin(async move {
            let from = self.root.join(tag);
            if !from.is_dir() {
                return Err(SourceError::NotFound {
                    what: format!(
                        "release {tag} in {} (local mode downloads nothing)",
                        self.root.display()
                    ),
                });
            }
            let to = dest.to_path_buf();
            let digest = tokio::task::spawn_blocking(move || {
                copy_release_dir(&from, &to)?;
                files_digest(&to)
            })
            .await
            .map_err(std::io::Error::other)
            .and_then(|copied| copied)
            .map_err(|source| SourceError::Io {
                path: self.root.join(tag),
                source,
            })?;
            if let Some(pin) = pin
                && pin != digest
            {
                return Err(SourceError::Refused {
                    refusal: Refusal::TagMoved,
                    message: format!(
                        "the files of local release {tag} have digest {digest}, pinned is {pin}"
                    ),
                    digest,
                });
            }
            Ok(Provenance {
                digest: Some(digest),
                ..Provenance::of_kind(Provenance::LOCAL)
            })
        })
    }
}
