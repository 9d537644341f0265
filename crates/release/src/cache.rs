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
//!
//! A `--local` release whose charts do not vendor their dependencies (the stacks' 2026 build leaves them
//! out) is not used where it lies: the release directory is the stack author's build output and is never
//! written. It is "downloaded" instead: the local source copies its files into a staging directory under
//! the local cache (`--local-cache-dir`, by default `<tmp>/cso-local-cache`), the dependencies are resolved
//! there exactly as for a download, and the copy is renamed to `<tag>@<digest>`, named by the digest of the
//! release's files ([`crate::release::files_digest`]). A rebuilt release has another digest and is resolved
//! again; an unchanged one finds its copy, also after a restart. Which release is used, as found, fetched
//! again or through a resolved copy, is decided by [`on_disk`].

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
/// The local cache's directory below the temporary directory, unless `--local-cache-dir` says otherwise.
pub const DEFAULT_LOCAL_CACHE_DIR: &str = "cso-local-cache";
/// Hex digits of the files' digest in the name of a resolved copy (`<tag>@<16 hex>`).
const COPY_DIGEST_CHARS: usize = 16;

/// What the cache does with a release it found on disk and verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDisk {
    /// Used as it lies.
    Use,
    /// Cached (by a cso that did not resolve dependencies) without its chart dependencies: fetched again,
    /// and replaced.
    FetchAgain,
    /// A `--local` release without its chart dependencies: used through its resolved copy in the local
    /// cache, which is made first when there is none for its files.
    UseResolvedCopy,
}

/// Whether a verified release is used as found (pure). `local_input`: a release directory of `--local`
/// mode (the operator's input, never written); `lacks_dependencies`: its charts declare dependencies
/// their `charts/` do not hold.
pub fn on_disk(local_input: bool, lacks_dependencies: bool) -> OnDisk {
    match (local_input, lacks_dependencies) {
        (_, false) => OnDisk::Use,
        (false, true) => OnDisk::FetchAgain,
        (true, true) => OnDisk::UseResolvedCopy,
    }
}

/// The name of the resolved copy of release `tag` whose files have `digest` (`sha256:<hex>`).
fn copy_name(tag: &str, digest: &str) -> String {
    let hex = digest.rsplit(':').next().unwrap_or(digest);
    format!("{tag}@{}", &hex[..hex.len().min(COPY_DIGEST_CHARS)])
}

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
    /// Where `--local` releases without their chart dependencies are copied and resolved.
    local_cache: PathBuf,
    /// The resolved copy each `--local` release was last used through, by tag: the copy a rebuilt release
    /// replaces is removed.
    copies_in_use: Mutex<HashMap<String, PathBuf>>,
}

/// What the first load of a release in this process found.
#[derive(Debug)]
struct Checked {
    fingerprint: Fingerprint,
    outcome: Result<Arc<Release>, ReleaseError>,
    /// For a `--local` release used through a resolved copy: the digest of its files, which names the copy.
    resolved_copy: Option<String>,
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
            local_cache: std::env::temp_dir().join(DEFAULT_LOCAL_CACHE_DIR),
            copies_in_use: Mutex::default(),
        })
    }

    /// Copies and resolves `--local` releases that lack chart dependencies in `dir` (`--local-cache-dir`),
    /// created when first needed.
    pub fn with_local_cache(mut self, dir: impl Into<PathBuf>) -> Self {
        self.local_cache = dir.into();
        self
    }

    /// Where `--local` releases that lack chart dependencies are copied and resolved.
    pub fn local_cache(&self) -> &Path {
        &self.local_cache
    }

    fn is_local(&self) -> bool {
        self.source.kind() == crate::source::Provenance::LOCAL
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
        // A `--local` release at a pin: the copy made of its files when they had that digest.
        let beside = if self.is_local() {
            self.copy_path(id, pin)
        } else {
            self.pinned_path(id, pin)
        };
        Ok(self
            .load(&beside, id)?
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

    /// The release in `dir` (its tag's directory, a pinned one or a resolved copy), loaded and checked once
    /// per fingerprint; a `--local` release that lacks chart dependencies gives its resolved copy, if made.
    fn load(&self, dir: &Path, id: &ReleaseId) -> Result<Option<Arc<Release>>, CacheError> {
        let tag = id.tag();
        let key = self.key_of(dir);
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
        let remembered = self
            .loaded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .filter(|checked| checked.fingerprint == fingerprint)
            .map(|checked| match &checked.outcome {
                Ok(release) => Ok((release.clone(), checked.resolved_copy.clone())),
                Err(error) => Err(replay(error)),
            });
        match remembered {
            Some(Ok((release, None))) => return Ok(Some(release)),
            Some(Ok((_, Some(digest)))) => return self.resolved_copy(id, &digest),
            Some(Err(error)) => return Err(refused(error)),
            None => {}
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
            Ok(release) => {
                // A release directory of `--local` mode; not a resolved copy, which is the cache's own.
                let local_input = self.is_local() && dir.parent() == Some(self.root.as_path());
                match on_disk(local_input, self.lacks_dependencies(&release)) {
                    OnDisk::Use => {
                        self.remember(&key, fingerprint, Ok(release.clone()), None);
                        Ok(Some(release))
                    }
                    // It cannot render offline, so it is fetched again (and replaced) as if it were not cached.
                    OnDisk::FetchAgain => {
                        tracing::info!(%tag, dir = %key, "cached without its chart dependencies: fetching it again");
                        forget();
                        Ok(None)
                    }
                    OnDisk::UseResolvedCopy => {
                        let digest = crate::release::files_digest(dir).map_err(|source| CacheError::Io {
                            path: dir.to_path_buf(),
                            source,
                        })?;
                        tracing::info!(
                            %tag,
                            %digest,
                            local_cache = %self.local_cache.display(),
                            "a local release without its chart dependencies: used through a resolved copy"
                        );
                        self.remember(&key, fingerprint, Ok(release), Some(digest.clone()));
                        self.resolved_copy(id, &digest)
                    }
                }
            }
            Err(error) if is_about_the_files(&error) => {
                let copy = replay(&error);
                self.remember(&key, fingerprint, Err(error), None);
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
                tracing::debug!(tag = %release.id.tag(), ?missing, "chart dependencies not vendored");
                true
            }
            // Verified just now, so this is an I/O error: rendering will say what is wrong.
            Err(_) => false,
        }
    }

    /// `<local cache>/<tag>@<digest>`: where the `--local` release `id` whose files have `digest` is copied
    /// and resolved.
    fn copy_path(&self, id: &ReleaseId, digest: &str) -> PathBuf {
        self.local_cache.join(copy_name(&id.tag(), digest))
    }

    /// The resolved copy of the `--local` release `id` whose files have `digest`, if it was made (by this
    /// process or an earlier one); none sends [`Self::get`] to make it. The copy it replaces, if this
    /// process used another one for the tag (the release was rebuilt), is removed.
    fn resolved_copy(&self, id: &ReleaseId, digest: &str) -> Result<Option<Arc<Release>>, CacheError> {
        let dir = self.copy_path(id, digest);
        let found = self.load(&dir, id)?;
        if found.is_some() {
            self.use_copy(id, dir);
        }
        Ok(found)
    }

    /// Records `dir` as the copy release `id` is used through, removing the one it was used through before.
    fn use_copy(&self, id: &ReleaseId, dir: PathBuf) {
        let tag = id.tag();
        let before = self
            .copies_in_use
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(tag.clone(), dir.clone());
        if let Some(before) = before.filter(|before| *before != dir) {
            tracing::info!(%tag, copy = %before.display(), now = %dir.display(), "removing the copy of a release that was rebuilt");
            self.loaded
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&self.key_of(&before));
            let _ = std::fs::remove_dir_all(&before);
        }
    }

    fn remember(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        outcome: Result<Arc<Release>, ReleaseError>,
        resolved_copy: Option<String>,
    ) {
        self.loaded.lock().unwrap_or_else(|p| p.into_inner()).insert(
            key.to_owned(),
            Checked {
                fingerprint,
                outcome,
                resolved_copy,
            },
        );
    }

    async fn download(&self, id: &ReleaseId, pin: Option<&str>) -> Result<Arc<Release>, CacheError> {
        let tag = id.tag();
        // A `--local` release is copied into the local cache, never into the release directory.
        let local = self.is_local();
        let parent = if local {
            std::fs::create_dir_all(&self.local_cache).map_err(|source| CacheError::Io {
                path: self.local_cache.clone(),
                source,
            })?;
            remove_stale_staging(&self.local_cache);
            self.local_cache.clone()
        } else {
            self.root.clone()
        };
        let staging = tempfile::Builder::new()
            .prefix(&format!("{DOWNLOAD_PREFIX}{tag}-"))
            .tempdir_in(&parent)
            .map_err(|source| CacheError::Io {
                path: parent.clone(),
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
        prepare_release(staging.path(), id, &self.dependencies, self.limits).await?;

        let main = self.path(id);
        let target = match (local, pin, &provenance.digest) {
            // Named by the digest of the files copied (the local source records it).
            (true, _, Some(digest)) => self.copy_path(id, digest),
            (true, _, None) => {
                return Err(CacheError::Io {
                    path: staging.path().to_path_buf(),
                    source: std::io::Error::other(
                        "the local source recorded no digest of the release's files",
                    ),
                });
            }
            // The tag's directory, unless it holds another digest that is still good for its users: then the
            // release fetched at a pin is kept beside it.
            (false, Some(_), Some(fetched))
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
        if local && target.is_dir() {
            // Resolved meanwhile by another process that reads the same release directory: the same files.
            drop(staging);
            let release = self.load(&target, id)?.ok_or_else(|| CacheError::Io {
                path: target.clone(),
                source: std::io::Error::other("the resolved copy went away while it was read"),
            })?;
            self.use_copy(id, target);
            return Ok(release);
        }
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
        tracing::info!(%tag, dir = %target.display(), "release cached");
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
        self.remember(&self.key_of(&target), fingerprint, Ok(release.clone()), None);
        if local {
            self.use_copy(id, target);
        }
        Ok(release)
    }

    /// The key of the release in `dir` among the loaded ones: its path below the cache, or its whole path.
    fn key_of(&self, dir: &Path) -> String {
        dir.strip_prefix(&self.root)
            .unwrap_or(dir)
            .to_string_lossy()
            .into_owned()
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

/// Makes the release in `dir` whole: loads and verifies it (metadata, addon config, archives read
/// through), adds the chart dependencies its charts declare and do not vendor (fetched by `dependencies`:
/// `--chart-mirror`, the repositories in `Chart.yaml`, credentials), and verifies the rewritten archives
/// again. `dir` is rewritten, so it must be a staging directory or a scratch copy, never a release someone
/// else owns. The one path by which a release is prepared for use: a download, a `--local` release's copy,
/// `cso render`'s copy of a release directory.
pub async fn prepare_release(
    dir: &Path,
    id: &ReleaseId,
    dependencies: &DependencyResolver,
    limits: UnpackLimits,
) -> Result<Release, CacheError> {
    let tag = id.tag();
    let verify = {
        let (dir, id) = (dir.to_path_buf(), id.clone());
        move || {
            let release = Release::load(&dir, &id)?;
            release.verify_archives(limits)?;
            Ok::<_, ReleaseError>(release)
        }
    };
    let release = verify_blocking(dir, &tag, verify.clone()).await?;
    // The dependencies are fetched only for a release that passed verification.
    let started = std::time::Instant::now();
    let resolved = dependencies
        .resolve(&release, limits)
        .await
        .map_err(|error| CacheError::Dependency {
            tag: tag.clone(),
            error: Box::new(error),
        })?;
    if resolved.added.is_empty() {
        return Ok(release);
    }
    let release = verify_blocking(dir, &tag, verify).await?;
    tracing::info!(
        %tag,
        charts = resolved.added.len(),
        bytes = resolved.bytes,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "chart dependencies resolved"
    );
    Ok(release)
}

async fn verify_blocking(
    dir: &Path,
    tag: &str,
    verify: impl FnOnce() -> Result<Release, ReleaseError> + Send + 'static,
) -> Result<Release, CacheError> {
    tokio::task::spawn_blocking(verify)
        .await
        .map_err(|e| CacheError::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::other(e),
        })?
        .map_err(|error| CacheError::Release {
            tag: tag.to_owned(),
            error,
        })
}

/// How old a staging directory in the local cache must be to be taken for one that a crash left behind
/// (the local cache may be shared by processes: a younger one may be another's download in progress).
const STALE_STAGING: std::time::Duration = std::time::Duration::from_secs(3600);

/// Removes the staging directories in `dir` that crashed downloads left behind.
fn remove_stale_staging(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let stale = entry
            .metadata()
            .and_then(|meta| meta.modified())
            .is_ok_and(|modified| modified.elapsed().is_ok_and(|age| age > STALE_STAGING));
        if stale && entry.file_name().to_string_lossy().starts_with(DOWNLOAD_PREFIX) {
            tracing::info!(path = %entry.path().display(), "removing an interrupted copy");
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_releases_are_used_as_found() {
        // (a `--local` release directory, lacks chart dependencies) → what the cache does
        let table = [
            (
                false,
                false,
                OnDisk::Use,
                "a cached release with its dependencies",
            ),
            (
                true,
                false,
                OnDisk::Use,
                "a local release that vendors them (or needs none)",
            ),
            (
                false,
                true,
                OnDisk::FetchAgain,
                "cached without them by an older cso",
            ),
            (
                true,
                true,
                OnDisk::UseResolvedCopy,
                "a local release without them: its directory is never written",
            ),
        ];
        for (local_input, lacks_dependencies, expected, what) in table {
            assert_eq!(on_disk(local_input, lacks_dependencies), expected, "{what}");
        }
    }

    #[test]
    fn a_resolved_copy_is_named_by_its_tag_and_the_files_digest() {
        let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
        assert_eq!(
            copy_name("docker-scs-1-35-v1", &digest),
            "docker-scs-1-35-v1@0123456789abcdef"
        );
        assert_eq!(
            copy_name("docker-scs-1-35-v1", "sha256:12"),
            "docker-scs-1-35-v1@12"
        );
    }
}
