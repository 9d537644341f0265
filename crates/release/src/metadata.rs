//! `metadata.yaml`: the versions of a release (cluster stack, Kubernetes, cluster addon, node image).

use std::path::Path;

use cso_api::{ReleaseId, Version};
use serde::Deserialize;

use crate::ReleaseError;

/// The file name inside a release.
pub const METADATA_FILE: &str = "metadata.yaml";

/// The versions a release declares, parsed and checked against the release's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    pub cluster_stack: Version,
    /// The full Kubernetes version, e.g. `v1.27.3` (`status.kubernetesVersion`, helm `--kube-version`).
    pub kubernetes: String,
    pub cluster_addon: Version,
    pub node_image: Option<Version>,
}

#[derive(Deserialize)]
struct RawMetadata {
    versions: RawVersions,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawVersions {
    #[serde(default)]
    cluster_stack: String,
    #[serde(default)]
    kubernetes: String,
    #[serde(default)]
    components: RawComponents,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawComponents {
    #[serde(default)]
    cluster_addon: String,
    #[serde(default)]
    node_image: Option<String>,
}

impl Metadata {
    /// Parses `metadata.yaml` of the release `id` (read from `path`, named in errors).
    pub fn parse(text: &str, path: &Path, id: &ReleaseId) -> Result<Self, ReleaseError> {
        let invalid = |what: String| ReleaseError::Invalid {
            path: path.to_path_buf(),
            what,
        };
        let raw: RawMetadata =
            serde_saphyr::from_str(text).map_err(|e| invalid(format!("not valid metadata YAML: {e}")))?;
        let version = |field: &str, value: &str| {
            if value.is_empty() {
                return Err(invalid(format!("{field} is missing")));
            }
            Version::parse_dot(value).map_err(|e| invalid(format!("{field}: {e}")))
        };
        let cluster_stack = version("versions.clusterStack", &raw.versions.cluster_stack)?;
        let cluster_addon = version(
            "versions.components.clusterAddon",
            &raw.versions.components.cluster_addon,
        )?;
        let node_image = match raw.versions.components.node_image.as_deref() {
            None | Some("") => None,
            Some(v) => Some(version("versions.components.nodeImage", v)?),
        };
        let kubernetes = raw.versions.kubernetes;
        let minor = kubernetes_minor(&kubernetes).ok_or_else(|| {
            invalid(format!(
                "versions.kubernetes {kubernetes:?} is not a Kubernetes version like v1.27.3"
            ))
        })?;
        if cluster_stack != id.version {
            return Err(invalid(format!(
                "versions.clusterStack {} does not match the release {}",
                cluster_stack.to_dot(),
                id.tag()
            )));
        }
        if minor != (id.kubernetes.major, id.kubernetes.minor) {
            return Err(invalid(format!(
                "versions.kubernetes {kubernetes} does not belong to Kubernetes {} of release {}",
                id.kubernetes,
                id.tag()
            )));
        }
        Ok(Metadata {
            cluster_stack,
            kubernetes,
            cluster_addon,
            node_image,
        })
    }
}

/// `v1.27.3` -> (1, 27); a leading `v` and three numeric parts are required.
fn kubernetes_minor(full: &str) -> Option<(u32, u32)> {
    let mut parts = full.strip_prefix('v')?.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next()?;
    let patch_ok = !patch.is_empty()
        && patch
            .split(['-', '+'])
            .next()?
            .bytes()
            .all(|b| b.is_ascii_digit());
    (patch_ok && parts.next().is_none()).then_some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(tag: &str) -> ReleaseId {
        ReleaseId::parse_tag(tag).unwrap()
    }

    const HASH: &str = "versions:\n  clusterStack: v0-sha.hipstsw\n  kubernetes: v1.27.7\n  components:\n    clusterAddon: v0-sha.hipstsw\n    nodeImage: v0-sha.hipstsw\n";

    #[test]
    fn parses_and_normalises_hash_versions() {
        let m = Metadata::parse(
            HASH,
            Path::new("metadata.yaml"),
            &id("docker-ferrol-1-27-v0-sha-hipstsw"),
        )
        .unwrap();
        assert_eq!(m.cluster_addon.to_dash(), "v0-sha-hipstsw");
        assert_eq!(m.kubernetes, "v1.27.7");
    }

    #[test]
    fn every_problem_names_the_file_and_the_field() {
        let cases = [
            (
                "versions: {kubernetes: v1.27.3, components: {clusterAddon: v1}}",
                "versions.clusterStack is missing",
            ),
            (
                "versions: {clusterStack: v1, kubernetes: v1.27.3, components: {}}",
                "clusterAddon is missing",
            ),
            (
                "versions: {clusterStack: v1, kubernetes: 1.27, components: {clusterAddon: v1}}",
                "not a Kubernetes version",
            ),
            (
                "versions: {clusterStack: v1, kubernetes: v1.28.1, components: {clusterAddon: v1}}",
                "does not belong to Kubernetes 1.27",
            ),
            (
                "versions: {clusterStack: v2, kubernetes: v1.27.3, components: {clusterAddon: v1}}",
                "does not match the release",
            ),
            (
                "versions: {clusterStack: v1, kubernetes: v1.27.3, components: {clusterAddon: v1-x}}",
                "clusterAddon: invalid",
            ),
            ("versions: [", "not valid metadata YAML"),
            ("", "not valid metadata YAML"),
        ];
        for (text, expected) in cases {
            let err = Metadata::parse(text, Path::new("/r/metadata.yaml"), &id("docker-ferrol-1-27-v1"))
                .unwrap_err();
            let message = err.to_string();
            assert!(
                message.contains("/r/metadata.yaml") && message.contains(expected),
                "{text:?}: {message}"
            );
        }
    }
}
