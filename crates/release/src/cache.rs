//! The release cache: `<release-dir>/cluster-stacks/<tag>/`, laid out as the Go operator lays it out.
//!
//! A release is downloaded into a temporary directory beside its final place, verified (metadata, addon
//! config, archives read through), and renamed into place: a half-written release is never visible, and
//! what a crash leaves behind (`.download-*`) is removed at start and never blocks a retry. Each tag is
//! downloaded at most once at a time, however many controllers ask.
//!
//! A release that is already on disk — every release in `--local` mode, and every release an earlier
//! process downloaded — is verified the same way before its first use in this process: its archives are
//! read through (integrity, limits, unsafe entries), because nothing proves that what lies in the directory
//! is what an earlier, verifying process wrote there. The outcome, accepted or refused, is remembered with a
//! fingerprint of the release's files (name, size, modification time, inode), so the archives are read once
//! per release per process, and again only when a file changes.

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::SystemTime,
};

use cso_api::ReleaseId;

use crate::{
    Release, ReleaseError,
    archive::{ArchiveError, UnpackLimits},
    deps::DependencyResolver,
    source::{Provenance, ReleaseSource, SourceError},
};

/// The cache directory below the release directory.
pub const CLUSTER_STACKS_DIR: &str = "cluster-stacks";
const DOWNLOAD_PREFIX: &str = ".download-";
/// Releases fetched at a pin while their tag's directory holds another digest in use.
const PINNED_DIR: &str = ".pinned";

/// The manifest digest a cached release was fetched at, if recorded.
fn digest_of(release: &Release) -> Option<&str> {
    release.provenance.as_ref().and_then(|p| p.digest.as_deref())
}

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
    /// A chart dependency of the release could not be fetched (see [`crate::deps`]): the message names the
    /// chart, the dependency, its version and the repository asked. Nothing was cached; worth retrying.
    #[error("release {tag}: chart {error}")]
    Dependency {
        tag: String,
        error: Box<crate::deps::DependencyError>,
    },
    #[error("release cache {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// The process-wide release cache, shared by every controller.
#[derive(Debug)]
pub struct ReleaseCache {
    root: PathBuf,
    source: Arc<dyn ReleaseSource>,
    limits: UnpackLimits,
    /// Fetches the chart dependencies a downloaded release does not vendor.
    dependencies: DependencyResolver,
    /// One lock per tag: the single flight of downloads.
    downloads: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Releases checked since start (accepted or refused), while their directory exists and its files
    /// keep their fingerprint.
    loaded: Mutex<HashMap<String, Checked>>,
}

/// What the first load of a release in this process found.
#[derive(Debug)]
struct Checked {
    fingerprint: Fingerprint,
    outcome: Result<Arc<Release>, ReleaseError>,
}

/// The regular files at the top of a release directory: name, size, modification time and inode. A
/// replaced or rewritten file changes it, so a verified release is not trusted after an edit.
type Fingerprint = Vec<(String, u64, Option<SystemTime>, u64)>;

fn fingerprint(dir: &Path) -> Result<Fingerprint, std::io::Error> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        // Follows links, as reading the release does.
        let Ok(meta) = std::fs::metadata(entry.path()) else {
            continue;
        };
        if meta.is_file() {
            files.push((
                entry.file_name().to_string_lossy().into_owned(),
                meta.len(),
                meta.modified().ok(),
                meta.ino(),
            ));
        }
    }
    files.sort();
    Ok(files)
}

/// A copy of a remembered refusal, with the same kind and message (the error types hold `io::Error`s,
/// which cannot be cloned).
fn replay(error: &ReleaseError) -> ReleaseError {
    let io = |e: &std::io::Error| std::io::Error::new(e.kind(), e.to_string());
    match error {
        ReleaseError::Missing { path, what } => ReleaseError::Missing {
            path: path.clone(),
            what: what.clone(),
        },
        ReleaseError::Invalid { path, what } => ReleaseError::Invalid {
            path: path.clone(),
            what: what.clone(),
        },
        ReleaseError::Io { path, source } => ReleaseError::Io {
            path: path.clone(),
            source: io(source),
        },
        ReleaseError::Archive(archive) => ReleaseError::Archive(match archive {
            ArchiveError::UnsafeEntry {
                archive,
                entry,
                reason,
            } => ArchiveError::UnsafeEntry {
                archive: archive.clone(),
                entry: entry.clone(),
                reason,
            },
            ArchiveError::TooLarge { archive, what, limit } => ArchiveError::TooLarge {
                archive: archive.clone(),
                what: what.clone(),
                limit: *limit,
            },
            ArchiveError::Corrupt { archive, source } => ArchiveError::Corrupt {
                archive: archive.clone(),
                source: io(source),
            },
            ArchiveError::Io { path, source } => ArchiveError::Io {
                path: path.clone(),
                source: io(source),
            },
        }),
    }
}

/// Whether a refusal says something about the files (remembered until they change) rather than about
/// reading them just now (an I/O error: tried again at the next call).
fn is_about_the_files(error: &ReleaseError) -> bool {
    !matches!(
        error,
        ReleaseError::Io { .. } | ReleaseError::Archive(ArchiveError::Io { .. })
    )
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
            dependencies: DependencyResolver::default(),
            downloads: Mutex::default(),
            loaded: Mutex::default(),
        })
    }

    /// Fetches chart dependencies with `resolver` (its mirrors: `--chart-mirror`) instead of from the
    /// repositories the charts name.
    pub fn with_dependencies(mut self, resolver: DependencyResolver) -> Self {
        self.dependencies = resolver;
        self
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
        self.get_pinned(id, None).await
    }

    /// The release at manifest digest `pin` (if given): a cached release at another digest is fetched
    /// again, and a tag that no longer points to `pin` is refused.
    pub async fn get_pinned(&self, id: &ReleaseId, pin: Option<&str>) -> Result<Arc<Release>, CacheError> {
        if let Some(release) = self.cached_pinned(id, pin)? {
            return Ok(release);
        }
        let tag = id.tag();
        let lock = {
            let mut downloads = self.downloads.lock().unwrap_or_else(|p| p.into_inner());
            downloads.entry(tag.clone()).or_default().clone()
        };
        let _flight = lock.lock().await;
        // Whoever held the lock before may have finished the download.
        if let Some(release) = self.cached_pinned(id, pin)? {
            return Ok(release);
        }
        self.download(id, pin).await
    }

    /// [`Self::cached`], and at manifest digest `pin` if one is given: the release at
    /// `<release-dir>/cluster-stacks/<tag>` if it is at the pin, else one kept at the pin beside it (see
    /// [`Self::pinned_path`]).
    pub fn cached_pinned(
        &self,
        id: &ReleaseId,
        pin: Option<&str>,
    ) -> Result<Option<Arc<Release>>, CacheError> {
        let main = self.cached(id)?;
        let Some(pin) = pin else { return Ok(main) };
        if main
            .as_ref()
            .is_some_and(|release| digest_of(release) == Some(pin))
        {
            return Ok(main);
        }
        Ok(self
            .load(&self.pinned_path(id, pin), id)?
            .filter(|release| digest_of(release) == Some(pin) && self.accepted(release)))
    }

    /// Where a release fetched at `digest` is kept when its tag's directory holds another digest that is
    /// still in use (namespaces may pin one tag to different digests): `cluster-stacks/.pinned/<tag>@<hex>`,
    /// hidden from the Go operator's layout.
    fn pinned_path(&self, id: &ReleaseId, digest: &str) -> PathBuf {
        let hex = digest.rsplit(':').next().unwrap_or(digest);
        self.root.join(PINNED_DIR).join(format!("{}@{hex}", id.tag()))
    }

    /// The release if it is in the cache, without downloading. Loaded and verified (metadata, addon config,
    /// archives read through) at its first use in this process and again only when its files change; a
    /// release that fails is refused, every time, with the file and the reason. Blocking on first use: the
    /// archives are decompressed (real releases are a few MiB; the limits bound a hostile one, and a refusal
    /// is remembered, so a bomb is read once). A release the source does not accept now (cached without a
    /// signature by a trusted key) counts as not cached; that is decided at each call, from what the first
    /// load found, so its archives are not read again while a fetch keeps being refused.
    pub fn cached(&self, id: &ReleaseId) -> Result<Option<Arc<Release>>, CacheError> {
        let found = self.load(&self.path(id), id)?;
        Ok(found.filter(|release| {
            let accepted = self.accepted(release);
            if !accepted {
                tracing::debug!(tag = %id.tag(), provenance = ?release.provenance, "cached without a signature trusted now: not used");
            }
            accepted
        }))
    }

    fn accepted(&self, release: &Release) -> bool {
        self.source.accepts(release.provenance.as_ref())
    }

    /// The release in `dir` (its tag's directory or a pinned one), loaded and checked once per fingerprint.
    fn load(&self, dir: &Path, id: &ReleaseId) -> Result<Option<Arc<Release>>, CacheError> {
        let tag = id.tag();
        let key = dir
            .strip_prefix(&self.root)
            .unwrap_or(dir)
            .to_string_lossy()
            .into_owned();
        let forget = || {
            self.loaded.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        };
        if !dir.is_dir() {
            forget();
            return Ok(None);
        }
        let fingerprint = fingerprint(dir).map_err(|source| CacheError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let refused = |error| CacheError::Release {
            tag: tag.clone(),
            error,
        };
        if let Some(checked) = self.loaded.lock().unwrap_or_else(|p| p.into_inner()).get(&key)
            && checked.fingerprint == fingerprint
        {
            return match &checked.outcome {
                Ok(release) => Ok(Some(release.clone())),
                Err(error) => Err(refused(replay(error))),
            };
        }
        let outcome = Release::load(dir, id).and_then(|release| {
            release.verify_archives(self.limits)?;
            Ok(Arc::new(release))
        });
        match &outcome {
            Ok(_) => tracing::info!(%tag, dir = %key, "release verified"),
            Err(error) => tracing::warn!(%tag, dir = %key, %error, "release refused"),
        }
        match outcome {
            // Cached by a version of cso that did not resolve dependencies: it cannot render offline, so it
            // is fetched again (and replaced) as if it were not cached. Not in `--local` mode, where the
            // release directory is the operator's input and nothing is downloaded.
            Ok(release) if self.source.kind() != "local" && self.lacks_dependencies(&release) => {
                forget();
                Ok(None)
            }
            Ok(release) => {
                self.remember(&key, fingerprint, Ok(release.clone()));
                Ok(Some(release))
            }
            Err(error) if is_about_the_files(&error) => {
                let copy = replay(&error);
                self.remember(&key, fingerprint, Err(error));
                Err(refused(copy))
            }
            Err(error) => {
                forget();
                Err(refused(error))
            }
        }
    }

    fn lacks_dependencies(&self, release: &Release) -> bool {
        match crate::deps::missing(release) {
            Ok(missing) if missing.is_empty() => false,
            Ok(missing) => {
                tracing::info!(
                    tag = %release.id.tag(),
                    ?missing,
                    "cached without its chart dependencies: fetching it again"
                );
                true
            }
            // Verified just now, so this is an I/O error: rendering will say what is wrong.
            Err(_) => false,
        }
    }

    fn remember(&self, tag: &str, fingerprint: Fingerprint, outcome: Result<Arc<Release>, ReleaseError>) {
        self.loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(tag.to_owned(), Checked { fingerprint, outcome });
    }

    async fn download(&self, id: &ReleaseId, pin: Option<&str>) -> Result<Arc<Release>, CacheError> {
        let tag = id.tag();
        let staging = tempfile::Builder::new()
            .prefix(&format!("{DOWNLOAD_PREFIX}{tag}-"))
            .tempdir_in(&self.root)
            .map_err(|source| CacheError::Io {
                path: self.root.clone(),
                source,
            })?;
        tracing::info!(%tag, source = self.source.kind(), "downloading release");
        let provenance: Provenance =
            self.source
                .download(&tag, staging.path(), pin)
                .await
                .map_err(|error| CacheError::Source {
                    tag: tag.clone(),
                    source_kind: self.source.kind(),
                    error,
                })?;
        crate::source::write_provenance(staging.path(), &provenance).map_err(|source| CacheError::Io {
            path: staging.path().to_path_buf(),
            source,
        })?;

        let staged = staging.path().to_path_buf();
        let (limits, staged_id) = (self.limits, id.clone());
        let verify = move || {
            let release = Release::load(&staged, &staged_id)?;
            release.verify_archives(limits)?;
            Ok::<_, ReleaseError>(release)
        };
        let release = self.verify_staged(staging.path(), &tag, verify.clone()).await?;

        // The dependencies are fetched only for a release that passed verification, and the rewritten
        // archives are read through again before the rename.
        let started = std::time::Instant::now();
        let resolved = self
            .dependencies
            .resolve(&release, self.limits)
            .await
            .map_err(|error| CacheError::Dependency {
                tag: tag.clone(),
                error: Box::new(error),
            })?;
        if !resolved.added.is_empty() {
            self.verify_staged(staging.path(), &tag, verify).await?;
            tracing::info!(
                %tag,
                charts = resolved.added.len(),
                bytes = resolved.bytes,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "chart dependencies resolved"
            );
        }

        // The tag's directory, unless it holds another digest that is still good for its users: then the
        // release fetched at a pin is kept beside it.
        let main = self.path(id);
        let target = match (pin, &provenance.digest) {
            (Some(_), Some(fetched))
                if self.load(&main, id).ok().flatten().is_some_and(|cached| {
                    self.accepted(&cached) && digest_of(&cached) != Some(fetched.as_str())
                }) =>
            {
                let pinned = self.pinned_path(id, fetched);
                let parent = self.root.join(PINNED_DIR);
                std::fs::create_dir_all(&parent).map_err(|source| CacheError::Io { path: parent, source })?;
                pinned
            }
            _ => main,
        };
        // A release cached without its dependencies is replaced: moved aside under the prefix that the next
        // start removes, so a crash between the two renames leaves no half state behind, only a retry.
        let replaced = if target.is_dir() {
            let aside = tempfile::Builder::new()
                .prefix(&format!("{DOWNLOAD_PREFIX}{tag}-replaced-"))
                .tempdir_in(&self.root)
                .map_err(|source| CacheError::Io {
                    path: self.root.clone(),
                    source,
                })?
                .keep();
            let old = aside.join(&tag);
            std::fs::rename(&target, &old).map_err(|source| CacheError::Io {
                path: target.clone(),
                source,
            })?;
            Some(aside)
        } else {
            None
        };
        let staged = staging.keep();
        std::fs::rename(&staged, &target).map_err(|source| {
            let _ = std::fs::remove_dir_all(&staged);
            CacheError::Io {
                path: target.clone(),
                source,
            }
        })?;
        if let Some(aside) = replaced {
            let _ = std::fs::remove_dir_all(aside);
        }
        tracing::info!(%tag, "release cached");
        // Verified in staging, and a rename keeps every file as it was (same inode, size and time): the
        // release is remembered as verified without reading its archives again.
        let fingerprint = fingerprint(&target).map_err(|source| CacheError::Io {
            path: target.clone(),
            source,
        })?;
        let release = Arc::new(Release::load(&target, id).map_err(|error| CacheError::Release {
            tag: tag.clone(),
            error,
        })?);
        let key = target
            .strip_prefix(&self.root)
            .unwrap_or(&target)
            .to_string_lossy()
            .into_owned();
        self.remember(&key, fingerprint, Ok(release.clone()));
        Ok(release)
    }

    async fn verify_staged(
        &self,
        staging: &Path,
        tag: &str,
        verify: impl FnOnce() -> Result<Release, ReleaseError> + Send + 'static,
    ) -> Result<Release, CacheError> {
        tokio::task::spawn_blocking(verify)
            .await
            .map_err(|e| CacheError::Io {
                path: staging.to_path_buf(),
                source: std::io::Error::other(e),
            })?
            .map_err(|error| CacheError::Release {
                tag: tag.to_owned(),
                error,
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
