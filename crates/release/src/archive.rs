//! Safe reading and unpacking of `.tgz` chart and addon archives.
//!
//! Refused, each with an error naming the entry: absolute paths and `..`; symbolic links that are absolute
//! or contain `..` (a link that only goes down cannot leave the directory, whatever other links exist);
//! hard links to anything but a regular file unpacked earlier; devices, FIFOs and other special entries;
//! two entries for one path; writing through a link. Limits on total size, file count and single-file size
//! stop gzip bombs; a truncated or corrupt gzip stream (bad CRC included) is an error, never a partial result.
//! Unpacking goes into a fresh temporary directory beside the target, renamed into place at the end.

use std::{
    collections::HashSet,
    fs::File,
    io::{self, BufReader, Read},
    path::{Component, Path, PathBuf},
};

use flate2::read::GzDecoder;

/// Limits for one archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnpackLimits {
    pub max_total_bytes: u64,
    pub max_files: u64,
    pub max_file_bytes: u64,
}

impl Default for UnpackLimits {
    /// Real stacks are far below these (the largest fixture, with Cilium, unpacks to under 1 MiB).
    fn default() -> Self {
        UnpackLimits {
            max_total_bytes: 256 << 20,
            max_files: 10_000,
            max_file_bytes: 64 << 20,
        }
    }
}

/// Why an archive was refused.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{archive}: entry {entry:?}: {reason}")]
    UnsafeEntry {
        archive: PathBuf,
        entry: String,
        reason: &'static str,
    },
    #[error("{archive}: {what} exceeds the limit of {limit}")]
    TooLarge {
        archive: PathBuf,
        what: String,
        limit: u64,
    },
    #[error("{archive}: corrupt or truncated archive: {source}")]
    Corrupt { archive: PathBuf, source: io::Error },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// What an unpack produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Unpacked {
    pub files: u64,
    pub bytes: u64,
    /// Names of the entries at the top level (chart directories of a new-style addon archive).
    pub top_level: Vec<String>,
}

/// Unpacks `archive` into `target`, which must not exist yet; on error nothing is left at `target`.
pub fn unpack(archive: &Path, target: &Path, limits: UnpackLimits) -> Result<Unpacked, ArchiveError> {
    let parent = target.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|source| ArchiveError::Io {
        path: parent.to_path_buf(),
        source,
    })?;
    let staging = tempfile::Builder::new()
        .prefix(".unpack-")
        .tempdir_in(parent)
        .map_err(|source| ArchiveError::Io {
            path: parent.to_path_buf(),
            source,
        })?;
    let unpacked = walk(archive, limits, Some(staging.path()))?;
    let staged = staging.keep();
    std::fs::rename(&staged, target).map_err(|source| {
        let _ = std::fs::remove_dir_all(&staged);
        ArchiveError::Io {
            path: target.to_path_buf(),
            source,
        }
    })?;
    Ok(unpacked)
}

/// Reads the whole archive with the same checks as [`unpack`], writing nothing.
pub fn inspect(archive: &Path, limits: UnpackLimits) -> Result<Unpacked, ArchiveError> {
    walk(archive, limits, None)
}

fn walk(archive: &Path, limits: UnpackLimits, dest: Option<&Path>) -> Result<Unpacked, ArchiveError> {
    let file = File::open(archive).map_err(|source| ArchiveError::Io {
        path: archive.to_path_buf(),
        source,
    })?;
    // Tar headers and padding add at most a few KiB per entry on top of the content.
    let stream_limit = limits
        .max_total_bytes
        .saturating_add(limits.max_files.saturating_mul(1024))
        .saturating_add(1 << 20);
    let mut stream = LimitedReader {
        inner: GzDecoder::new(BufReader::new(file)),
        remaining: stream_limit,
        exceeded: false,
    };
    let corrupt = |source: io::Error| ArchiveError::Corrupt {
        archive: archive.to_path_buf(),
        source,
    };
    let unsafe_entry = |entry: &str, reason: &'static str| ArchiveError::UnsafeEntry {
        archive: archive.to_path_buf(),
        entry: entry.to_owned(),
        reason,
    };
    let too_large = |what: String, limit: u64| ArchiveError::TooLarge {
        archive: archive.to_path_buf(),
        what,
        limit,
    };

    // A failed read is the bomb guard tripping, or a broken stream.
    let read_failed = |e: io::Error| {
        if stream_exceeded(&e) {
            too_large("the unpacked stream".into(), stream_limit)
        } else {
            corrupt(e)
        }
    };

    let mut result = Unpacked::default();
    let mut seen: HashSet<PathBuf> = HashSet::new();
    let mut regular_files: HashSet<PathBuf> = HashSet::new();
    let mut links: HashSet<PathBuf> = HashSet::new();
    let mut dirs: HashSet<PathBuf> = HashSet::new();
    {
        let mut tar = tar::Archive::new(&mut stream);
        let entries = tar.entries().map_err(corrupt)?;
        for entry in entries {
            let mut entry = entry.map_err(read_failed)?;
            let raw_path = entry.path_bytes().into_owned();
            let display = String::from_utf8_lossy(&raw_path).into_owned();
            let relative = safe_relative_path(&display).map_err(|reason| unsafe_entry(&display, reason))?;
            if relative.as_os_str().is_empty() {
                continue; // the archive root itself ("./")
            }
            if let Some(Component::Normal(first)) = relative.components().next() {
                let first = first.to_string_lossy().into_owned();
                if !result.top_level.contains(&first) {
                    result.top_level.push(first);
                }
            }
            if relative.ancestors().skip(1).any(|a| links.contains(a)) {
                return Err(unsafe_entry(&display, "would be written through a link"));
            }
            let kind = entry.header().entry_type();
            let repeated_dir = kind.is_dir() && dirs.contains(&relative);
            if !seen.insert(relative.clone()) && !repeated_dir {
                return Err(unsafe_entry(&display, "appears twice in the archive"));
            }
            let out = dest.map(|d| d.join(&relative));
            if let Some(parent) = out.as_ref().and_then(|o| o.parent()) {
                std::fs::create_dir_all(parent).map_err(|source| ArchiveError::Io {
                    path: parent.to_path_buf(),
                    source,
                })?;
            }
            match kind {
                k if k.is_dir() => {
                    dirs.insert(relative.clone());
                    if let Some(out) = &out {
                        std::fs::create_dir_all(out).map_err(|source| ArchiveError::Io {
                            path: out.clone(),
                            source,
                        })?;
                    }
                }
                k if k.is_file() || k == tar::EntryType::Continuous => {
                    result.files += 1;
                    if result.files > limits.max_files {
                        return Err(too_large("the number of files".into(), limits.max_files));
                    }
                    let declared = entry.header().size().map_err(corrupt)?;
                    if declared > limits.max_file_bytes {
                        return Err(too_large(
                            format!("entry {display:?} ({declared} bytes)"),
                            limits.max_file_bytes,
                        ));
                    }
                    let mut sink: Box<dyn io::Write> = match &out {
                        Some(out) => Box::new(File::create(out).map_err(|source| ArchiveError::Io {
                            path: out.clone(),
                            source,
                        })?),
                        None => Box::new(io::sink()),
                    };
                    let copied = io::copy(&mut (&mut entry).take(limits.max_file_bytes + 1), &mut sink)
                        .map_err(read_failed)?;
                    if copied > limits.max_file_bytes {
                        return Err(too_large(format!("entry {display:?}"), limits.max_file_bytes));
                    }
                    result.bytes += copied;
                    if result.bytes > limits.max_total_bytes {
                        return Err(too_large("the unpacked size".into(), limits.max_total_bytes));
                    }
                    regular_files.insert(relative);
                }
                tar::EntryType::Symlink => {
                    let target = link_target(&entry)
                        .ok_or_else(|| unsafe_entry(&display, "symbolic link without a target"))?;
                    let target_path = Path::new(&target);
                    let goes_down_only = target_path.is_relative()
                        && target_path
                            .components()
                            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
                    if !goes_down_only {
                        return Err(unsafe_entry(
                            &display,
                            "symbolic link points outside its directory",
                        ));
                    }
                    links.insert(relative);
                    if let Some(out) = &out {
                        std::os::unix::fs::symlink(target_path, out).map_err(|source| ArchiveError::Io {
                            path: out.clone(),
                            source,
                        })?;
                    }
                }
                tar::EntryType::Link => {
                    let target = link_target(&entry)
                        .ok_or_else(|| unsafe_entry(&display, "hard link without a target"))?;
                    let target = safe_relative_path(&target)
                        .map_err(|_| unsafe_entry(&display, "hard link points outside the archive"))?;
                    if !regular_files.contains(&target) {
                        return Err(unsafe_entry(
                            &display,
                            "hard link to something that is not a file of this archive",
                        ));
                    }
                    links.insert(relative);
                    if let (Some(out), Some(dest)) = (&out, dest) {
                        std::fs::hard_link(dest.join(&target), out).map_err(|source| ArchiveError::Io {
                            path: out.clone(),
                            source,
                        })?;
                    }
                }
                tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => {}
                _ => return Err(unsafe_entry(&display, "is a device, FIFO or other special file")),
            }
        }
    }
    // The tar end marker may come before the end of the gzip stream: read it to the end, so that a
    // truncated stream or a bad checksum is noticed.
    io::copy(&mut stream, &mut io::sink()).map_err(read_failed)?;
    Ok(result)
}

fn link_target<R: Read>(entry: &tar::Entry<'_, R>) -> Option<String> {
    entry
        .link_name_bytes()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .filter(|t| !t.is_empty())
}

/// A path with only normal components (and `.`), relative, no `..`.
fn safe_relative_path(raw: &str) -> Result<PathBuf, &'static str> {
    let path = Path::new(raw);
    let mut clean = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => clean.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err("contains `..`"),
            Component::RootDir | Component::Prefix(_) => return Err("is an absolute path"),
        }
    }
    Ok(clean)
}

/// A reader that fails once more than `remaining` bytes were read: the gzip-bomb guard.
struct LimitedReader<R> {
    inner: R,
    remaining: u64,
    exceeded: bool,
}

const STREAM_LIMIT_MESSAGE: &str = "decompressed stream exceeds the unpack limit";

fn stream_exceeded(e: &io::Error) -> bool {
    e.get_ref()
        .is_some_and(|inner| inner.to_string() == STREAM_LIMIT_MESSAGE)
}

impl<R: Read> Read for LimitedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.exceeded {
            return Err(io::Error::other(STREAM_LIMIT_MESSAGE));
        }
        let n = self.inner.read(buf)?;
        match self.remaining.checked_sub(n as u64) {
            Some(left) => {
                self.remaining = left;
                Ok(n)
            }
            None => {
                self.exceeded = true;
                Err(io::Error::other(STREAM_LIMIT_MESSAGE))
            }
        }
    }
}
