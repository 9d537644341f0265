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
/// files only; what unpacking wrote beside them is left behind).
pub fn copy_release_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    Ok(())
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
