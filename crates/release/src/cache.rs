//! The release cache: `<release-dir>/cluster-stacks/<tag>/`, laid out as the Go operator lays it out.
//!
//! A release is downloaded into a temporary directory beside its final place, verified (metadata, addon
//! config, archives read through), and renamed into place: a half-written release is never visible, and
//! what a crash leaves behind (`.download-*`) is removed at start and never blocks a retry. Each tag is
//! downloaded at most once at a time, however many controllers ask.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use cso_api::ReleaseId;

use crate::{
    Release, ReleaseError,
    archive::UnpackLimits,
    source::{ReleaseSource, SourceError},
};

/// The cache directory below the release directory.
pub const CLUSTER_STACKS_DIR: &str = "cluster-stacks";
const DOWNLOAD_PREFIX: &str = ".download-";

/// Why a release could not be had.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("failed to fetch release {tag} from {source_kind}: {error}")]
    Source {
        tag: String,
        source_kind: &'static str,
        error: SourceError,
    },
    #[error("release {tag} is unusable: {error}")]
    Release { tag: String, error: ReleaseError },
    #[error("release cache {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// The process-wide release cache, shared by every controller.
#[derive(Debug)]
pub struct ReleaseCache {
    root: PathBuf,
    source: Arc<dyn ReleaseSource>,
    limits: UnpackLimits,
    /// One lock per tag: the single flight of downloads.
    downloads: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Releases loaded since start, while their directory exists.
    loaded: Mutex<HashMap<String, Arc<Release>>>,
}

impl ReleaseCache {
    /// A cache in `<release_dir>/cluster-stacks`; removes what interrupted downloads left behind.
    pub fn new(
        release_dir: &Path,
        source: Arc<dyn ReleaseSource>,
        limits: UnpackLimits,
    ) -> Result<Self, CacheError> {
        let root = release_dir.join(CLUSTER_STACKS_DIR);
        std::fs::create_dir_all(&root).map_err(|source| CacheError::Io {
            path: root.clone(),
            source,
        })?;
        for entry in std::fs::read_dir(&root)
            .map_err(|source| CacheError::Io {
                path: root.clone(),
                source,
            })?
            .flatten()
        {
            if entry.file_name().to_string_lossy().starts_with(DOWNLOAD_PREFIX) {
                tracing::info!(path = %entry.path().display(), "removing an interrupted download");
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        Ok(ReleaseCache {
            root,
            source,
            limits,
            downloads: Mutex::default(),
            loaded: Mutex::default(),
        })
    }

    pub fn source(&self) -> &Arc<dyn ReleaseSource> {
        &self.source
    }

    /// `<release-dir>/cluster-stacks/<tag>`
    pub fn path(&self, id: &ReleaseId) -> PathBuf {
        self.root.join(id.tag())
    }

    /// The release, downloaded first when it is not in the cache.
    pub async fn get(&self, id: &ReleaseId) -> Result<Arc<Release>, CacheError> {
        if let Some(release) = self.cached(id)? {
            return Ok(release);
        }
        let tag = id.tag();
        let lock = {
            let mut downloads = self.downloads.lock().unwrap_or_else(|p| p.into_inner());
            downloads.entry(tag.clone()).or_default().clone()
        };
        let _flight = lock.lock().await;
        // Whoever held the lock before may have finished the download.
        if let Some(release) = self.cached(id)? {
            return Ok(release);
        }
        self.download(id).await
    }

    /// The release if it is in the cache (loaded and checked once per process), without downloading.
    pub fn cached(&self, id: &ReleaseId) -> Result<Option<Arc<Release>>, CacheError> {
        let tag = id.tag();
        let dir = self.path(id);
        if !dir.is_dir() {
            self.loaded.lock().unwrap_or_else(|p| p.into_inner()).remove(&tag);
            return Ok(None);
        }
        if let Some(release) = self.loaded.lock().unwrap_or_else(|p| p.into_inner()).get(&tag) {
            return Ok(Some(release.clone()));
        }
        let release = Arc::new(Release::load(&dir, id).map_err(|error| CacheError::Release {
            tag: tag.clone(),
            error,
        })?);
        self.loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(tag, release.clone());
        Ok(Some(release))
    }

    async fn download(&self, id: &ReleaseId) -> Result<Arc<Release>, CacheError> {
        let tag = id.tag();
        let staging = tempfile::Builder::new()
            .prefix(&format!("{DOWNLOAD_PREFIX}{tag}-"))
            .tempdir_in(&self.root)
            .map_err(|source| CacheError::Io {
                path: self.root.clone(),
                source,
            })?;
        tracing::info!(%tag, source = self.source.kind(), "downloading release");
        self.source
            .download(&tag, staging.path())
            .await
            .map_err(|error| CacheError::Source {
                tag: tag.clone(),
                source_kind: self.source.kind(),
                error,
            })?;

        let staged = staging.path().to_path_buf();
        let (limits, staged_id) = (self.limits, id.clone());
        tokio::task::spawn_blocking(move || {
            let release = Release::load(&staged, &staged_id)?;
            release.verify_archives(limits)
        })
        .await
        .map_err(|e| CacheError::Io {
            path: staging.path().to_path_buf(),
            source: std::io::Error::other(e),
        })?
        .map_err(|error| CacheError::Release {
            tag: tag.clone(),
            error,
        })?;

        let target = self.path(id);
        let staged = staging.keep();
        std::fs::rename(&staged, &target).map_err(|source| {
            let _ = std::fs::remove_dir_all(&staged);
            CacheError::Io {
                path: target.clone(),
                source,
            }
        })?;
        tracing::info!(%tag, "release cached");
        self.cached(id)?.ok_or_else(|| CacheError::Io {
            path: target,
            source: std::io::Error::other("the release vanished right after it was cached"),
        })
    }

    /// Tags of the releases in the cache (published ones only).
    pub fn cached_tags(&self) -> Vec<String> {
        let mut tags: Vec<String> = std::fs::read_dir(&self.root)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| !n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default();
        tags.sort();
        tags
    }
}
