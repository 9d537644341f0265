//! One release directory (`<release-dir>/cluster-stacks/<tag>/`): its metadata, its addon style and its
//! archives, found by their exact expected names.

use std::path::{Path, PathBuf};

use cso_api::ReleaseId;

use crate::{
    ReleaseError,
    addon_config::{ADDON_CONFIG_FILE, AddonConfig},
    archive::{self, UnpackLimits},
    metadata::{METADATA_FILE, Metadata},
};

/// The values file of old-style releases.
pub const ADDON_VALUES_FILE: &str = "cluster-addon-values.yaml";

/// How a release ships its addons.
#[derive(Clone, Debug, PartialEq)]
pub enum AddonStyle {
    /// One umbrella chart, values from `cluster-addon-values.yaml`.
    Single { values_file: PathBuf },
    /// One chart directory per stage, run by hook as `clusteraddon.yaml` says.
    Staged { config: AddonConfig },
}

/// A release on disk, its files checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Release {
    pub id: ReleaseId,
    pub dir: PathBuf,
    pub metadata: Metadata,
    pub addons: AddonStyle,
    /// `<provider>-<name>-<M>-<m>-cluster-class-<version>.tgz`
    pub cluster_class_chart: PathBuf,
    /// `<provider>-<name>-<M>-<m>-cluster-addon-<addon version>.tgz`
    pub cluster_addon_archive: PathBuf,
    /// Where the files came from, as recorded when they were cached (none: cached by the Go operator or an
    /// older cso, or a `--local` directory).
    pub provenance: Option<crate::source::Provenance>,
}

/// Copies the files of the release directory `from` into `to`, creating it (a release is flat: its
/// files only; what unpacking wrote beside them is left behind). Links to files are followed, as reading a
/// release follows them, so a release whose archives are links into a build directory copies whole.
pub fn copy_release_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for (name, path) in release_files(from)? {
        std::fs::copy(path, to.join(name))?;
    }
    Ok(())
}

/// The digest of a release directory's files, `sha256:<hex>`: over the name, length and bytes of every file
/// [`copy_release_dir`] copies, in name order, leaving out the cache's own provenance record. It names a
/// `--local` release's resolved copy, so a rebuilt release (any byte of any file changed, a file added or
/// removed) gets a copy of its own, while a restart, a `touch` or a copy with new times finds the copy made
/// before. Blocking: reads every file.
pub fn files_digest(dir: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for (name, path) in release_files(dir)? {
        if name == crate::source::PROVENANCE_FILE {
            continue;
        }
        let mut file = std::fs::File::open(&path)?;
        let length = file.metadata()?.len();
        hasher.update((name.len() as u64).to_le_bytes());
        hasher.update(name.as_bytes());
        hasher.update(length.to_le_bytes());
        let copied = std::io::copy(&mut file, &mut hasher)?;
        if copied != length {
            return Err(std::io::Error::other(format!(
                "{} changed while it was read",
                path.display()
            )));
        }
    }
    Ok(format!("sha256:{}", hex::encode(hasher.finalize())))
}

/// The regular files at the top of `dir` (links followed), as (name, path), in name order.
fn release_files(dir: &Path) -> std::io::Result<Vec<(String, PathBuf)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if std::fs::metadata(entry.path()).is_ok_and(|meta| meta.is_file()) {
            files.push((entry.file_name().to_string_lossy().into_owned(), entry.path()));
        }
    }
    files.sort();
    Ok(files)
}

impl Release {
    /// Reads the release of `id` in `dir`: metadata, addon config or values, and the two archives' presence.
    pub fn load(dir: &Path, id: &ReleaseId) -> Result<Self, ReleaseError> {
        let metadata_path = dir.join(METADATA_FILE);
        let metadata = Metadata::parse(&read(&metadata_path, "release metadata")?, &metadata_path, id)?;

        let config_path = dir.join(ADDON_CONFIG_FILE);
        let addons = if config_path.is_file() {
            AddonStyle::Staged {
                config: AddonConfig::parse(&read(&config_path, "addon config")?, &config_path)?,
            }
        } else {
            let values_file = dir.join(ADDON_VALUES_FILE);
            if !values_file.is_file() {
                return Err(ReleaseError::Missing {
                    path: values_file,
                    what: format!("addon values (the release has no {ADDON_CONFIG_FILE} either)"),
                });
            }
            AddonStyle::Single { values_file }
        };

        let prefix = id.stack_prefix();
        let cluster_class_chart = expected_file(
            dir,
            &format!("{prefix}-cluster-class-{}.tgz", metadata.cluster_stack.to_dot()),
            "cluster-class chart",
        )?;
        let cluster_addon_archive = expected_file(
            dir,
            &format!("{prefix}-cluster-addon-{}.tgz", metadata.cluster_addon.to_dot()),
            "cluster-addon archive",
        )?;
        Ok(Release {
            id: id.clone(),
            dir: dir.to_path_buf(),
            metadata,
            addons,
            cluster_class_chart,
            cluster_addon_archive,
            provenance: crate::source::read_provenance(dir),
        })
    }

    /// Reads both archives through (integrity, limits, unsafe entries) and checks their layout: the
    /// cluster-class chart and an old-style addon chart are one chart directory; a staged addon archive has
    /// a directory for every stage of `clusteraddon.yaml`. Blocking: decompresses the archives.
    pub fn verify_archives(&self, limits: UnpackLimits) -> Result<(), ReleaseError> {
        let class = archive::inspect(&self.cluster_class_chart, limits)?;
        check_single_chart(&self.cluster_class_chart, &class.top_level)?;
        let addon = archive::inspect(&self.cluster_addon_archive, limits)?;
        match &self.addons {
            AddonStyle::Single { .. } => check_single_chart(&self.cluster_addon_archive, &addon.top_level)?,
            AddonStyle::Staged { config } => {
                let missing: Vec<&str> = config
                    .chart_names()
                    .into_iter()
                    .filter(|name| !addon.top_level.iter().any(|t| t == name))
                    .collect();
                if !missing.is_empty() {
                    return Err(ReleaseError::Invalid {
                        path: self.cluster_addon_archive.clone(),
                        what: format!(
                            "has no chart directory for the stages {missing:?} of {ADDON_CONFIG_FILE} (it has {:?})",
                            addon.top_level
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// The directory with the addon archive's charts (one per stage), unpacked next to the archive on first
    /// use (`<dir>/<archive name without .tgz>/`, where the Go operator puts it). Blocking.
    pub fn addon_charts(&self, limits: UnpackLimits) -> Result<PathBuf, ReleaseError> {
        let name = self
            .cluster_addon_archive
            .file_name()
            .map(|n| n.to_string_lossy().trim_end_matches(".tgz").to_owned())
            .unwrap_or_default();
        let target = self.dir.join(name);
        if target.is_dir() {
            return Ok(target);
        }
        match archive::unpack(&self.cluster_addon_archive, &target, limits) {
            Ok(_) => Ok(target),
            // Unpacked meanwhile by another reconcile.
            Err(_) if target.is_dir() => Ok(target),
            Err(e) => Err(e.into()),
        }
    }

    pub fn is_staged(&self) -> bool {
        matches!(self.addons, AddonStyle::Staged { .. })
    }
}

fn read(path: &Path, what: &str) -> Result<String, ReleaseError> {
    std::fs::read_to_string(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => ReleaseError::Missing {
            path: path.to_path_buf(),
            what: what.to_owned(),
        },
        _ => ReleaseError::Io {
            path: path.to_path_buf(),
            source,
        },
    })
}

/// The file `name` in `dir`, matched exactly (the Go operator's substring match takes `v10` for `v1`).
fn expected_file(dir: &Path, name: &str, what: &str) -> Result<PathBuf, ReleaseError> {
    let path = dir.join(name);
    if path.is_file() {
        return Ok(path);
    }
    let similar: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| n.ends_with(".tgz"))
                .collect()
        })
        .unwrap_or_default();
    Err(ReleaseError::Missing {
        path,
        what: format!("{what} (archives present: {similar:?})"),
    })
}

fn check_single_chart(archive: &Path, top_level: &[String]) -> Result<(), ReleaseError> {
    if top_level.len() == 1 {
        Ok(())
    } else {
        Err(ReleaseError::Invalid {
            path: archive.to_path_buf(),
            what: format!("a chart archive must hold exactly one chart directory, found {top_level:?}"),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test: a failed unwrap is a failed test")]

    use super::*;

    fn release_dir(files: &[(&str, &[u8])]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in files {
            std::fs::write(dir.path().join(name), bytes).unwrap();
        }
        dir
    }

    const BUILT: &[(&str, &[u8])] = &[
        ("metadata.yaml", b"versions: v1"),
        ("x-cluster-addon-v1.tgz", b"addons"),
    ];

    #[test]
    fn the_files_digest_follows_names_and_bytes_not_times_or_what_lies_beside_them() {
        let built = release_dir(BUILT);
        let digest = files_digest(built.path()).unwrap();
        assert!(
            digest.starts_with("sha256:") && digest.len() == 7 + 64,
            "{digest}"
        );
        assert_eq!(
            files_digest(release_dir(BUILT).path()).unwrap(),
            digest,
            "the same files elsewhere, written at another time"
        );

        let beside = release_dir(BUILT);
        std::fs::create_dir(beside.path().join("x-cluster-addon-v1")).unwrap();
        std::fs::write(beside.path().join("x-cluster-addon-v1/unpacked"), "x").unwrap();
        std::fs::write(beside.path().join(crate::source::PROVENANCE_FILE), "{}").unwrap();
        assert_eq!(
            files_digest(beside.path()).unwrap(),
            digest,
            "an unpacked directory and the provenance record are not the release's files"
        );

        let rebuilt: &[(&str, &[u8])] = &[
            ("metadata.yaml", b"versions: v1"),
            ("x-cluster-addon-v1.tgz", b"addonz"),
        ];
        let renamed: &[(&str, &[u8])] = &[
            ("metadata.yaml", b"versions: v1"),
            ("x-cluster-addon-v2.tgz", b"addons"),
        ];
        let added: &[(&str, &[u8])] = &[
            ("metadata.yaml", b"versions: v1"),
            ("x-cluster-addon-v1.tgz", b"addons"),
            ("hashes.json", b"{}"),
        ];
        // Names and contents that run together alike: `ab` + `c` is not `a` + `bc`.
        let shifted: &[(&str, &[u8])] = &[
            ("metadata.yam", b"lversions: v1"),
            ("x-cluster-addon-v1.tgz", b"addons"),
        ];
        for (what, files) in [
            ("one byte of an archive", rebuilt),
            ("a file renamed", renamed),
            ("a file added", added),
            ("a name's end moved into the content", shifted),
        ] {
            assert_ne!(files_digest(release_dir(files).path()).unwrap(), digest, "{what}");
        }
    }

    #[test]
    fn a_copy_follows_links_to_files_and_has_the_same_digest() {
        let built = release_dir(BUILT);
        let elsewhere = release_dir(&[("addons.tgz", b"addons")]);
        let linked = release_dir(&[("metadata.yaml", b"versions: v1")]);
        std::os::unix::fs::symlink(
            elsewhere.path().join("addons.tgz"),
            linked.path().join("x-cluster-addon-v1.tgz"),
        )
        .unwrap();
        assert_eq!(
            files_digest(linked.path()).unwrap(),
            files_digest(built.path()).unwrap()
        );
        let copy = tempfile::tempdir().unwrap();
        copy_release_dir(linked.path(), &copy.path().join("release")).unwrap();
        assert_eq!(
            files_digest(&copy.path().join("release")).unwrap(),
            files_digest(built.path()).unwrap()
        );
        assert!(
            !std::fs::symlink_metadata(copy.path().join("release/x-cluster-addon-v1.tgz"))
                .unwrap()
                .is_symlink()
        );
    }
}
