//! The canonical identity of one cluster-stack release and every name derived from it.
//!
//! `docker-ferrol-1-27-v0-sha-hipstsw` (dash form: release tag, ClusterStackRelease name, cache directory) and
//! `docker-ferrol-1-27-v0-sha.hipstsw` (dot form: ClusterClass name) are the same [`ReleaseId`]. Every
//! comparison in the operator goes through this type, never through strings, which is what breaks the custom
//! channel in the Go operator.

use std::{fmt, str::FromStr};

use crate::version::{Channel, KubernetesVersion, Version, VersionError, is_name_part};

/// Why a release name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseIdError {
    #[error(
        "invalid release name {0:?}: expected <provider>-<name>-<major>-<minor>-<version>, e.g. docker-ferrol-1-27-v1"
    )]
    Format(String),
    #[error(
        "invalid release name {name:?}: {what} {value:?} must be lowercase letters and digits without dashes"
    )]
    Segment {
        name: String,
        what: &'static str,
        value: String,
    },
    #[error("invalid release name {0:?}: {1}")]
    Version(String, VersionError),
}

/// One release of one cluster stack: provider, stack name, Kubernetes minor and stack version.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReleaseId {
    pub provider: String,
    pub name: String,
    pub kubernetes: KubernetesVersion,
    pub version: Version,
}

impl ReleaseId {
    /// Builds the identity from a ClusterStack's fields and one `spec.versions` entry (dot form).
    pub fn from_stack_spec(
        provider: &str,
        name: &str,
        kubernetes_version: &str,
        version: &str,
    ) -> Result<Self, ReleaseIdError> {
        let display = format!("{provider}-{name}-{kubernetes_version}-{version}");
        let kubernetes = KubernetesVersion::parse_dot(kubernetes_version)
            .map_err(|e| ReleaseIdError::Version(display.clone(), e))?;
        let version = Version::parse_dot(version).map_err(|e| ReleaseIdError::Version(display.clone(), e))?;
        Self::new(provider, name, kubernetes, version).map_err(|e| match e {
            ReleaseIdError::Segment { what, value, .. } => ReleaseIdError::Segment {
                name: display,
                what,
                value,
            },
            other => other,
        })
    }

    pub fn new(
        provider: &str,
        name: &str,
        kubernetes: KubernetesVersion,
        version: Version,
    ) -> Result<Self, ReleaseIdError> {
        let display = format!("{provider}-{name}-{}-{}", kubernetes.to_dash(), version.to_dash());
        check_segment(&display, "provider", provider)?;
        check_segment(&display, "stack name", name)?;
        Ok(ReleaseId {
            provider: provider.to_owned(),
            name: name.to_owned(),
            kubernetes,
            version,
        })
    }

    /// Parses the dash form (release tag / ClusterStackRelease name): 5 or 7 segments.
    pub fn parse_tag(s: &str) -> Result<Self, ReleaseIdError> {
        let parts: Vec<&str> = s.split('-').collect();
        if parts.len() != 5 && parts.len() != 7 {
            return Err(ReleaseIdError::Format(s.to_owned()));
        }
        Self::from_segments(s, &parts, Version::parse_dash)
    }

    /// Parses the dot form (ClusterClass name): 5 or 6 segments.
    pub fn parse_cluster_class(s: &str) -> Result<Self, ReleaseIdError> {
        let parts: Vec<&str> = s.split('-').collect();
        if parts.len() != 5 && parts.len() != 6 {
            return Err(ReleaseIdError::Format(s.to_owned()));
        }
        Self::from_segments(s, &parts, Version::parse_dot)
    }

    /// Parses either form; the forms never overlap except for stable versions, where they are identical.
    pub fn parse_any(s: &str) -> Result<Self, ReleaseIdError> {
        match s.split('-').count() {
            7 => Self::parse_tag(s),
            6 => Self::parse_cluster_class(s),
            _ => Self::parse_tag(s),
        }
    }

    fn from_segments(
        s: &str,
        parts: &[&str],
        parse_version: fn(&str) -> Result<Version, VersionError>,
    ) -> Result<Self, ReleaseIdError> {
        let kubernetes = KubernetesVersion::from_parts(parts[2], parts[3])
            .ok_or_else(|| ReleaseIdError::Format(s.to_owned()))?;
        let version_text = parts[4..].join("-");
        let version = parse_version(&version_text).map_err(|e| ReleaseIdError::Version(s.to_owned(), e))?;
        let id = Self::new(parts[0], parts[1], kubernetes, version)?;
        Ok(id)
    }

    /// `docker-ferrol-1-27-v0-sha-hipstsw`: release tag, ClusterStackRelease name, cache directory name.
    pub fn tag(&self) -> String {
        format!("{}{}", self.tag_prefix(), self.version.to_dash())
    }

    /// `docker-ferrol-1-27-v0-sha.hipstsw`: the ClusterClass name (by the stacks' convention).
    pub fn cluster_class_name(&self) -> String {
        format!("{}{}", self.tag_prefix(), self.version.to_dot())
    }

    /// `docker-ferrol-1-27`: the Helm release name of the cluster-class chart, and the prefix of chart files.
    pub fn stack_prefix(&self) -> String {
        format!("{}-{}-{}", self.provider, self.name, self.kubernetes.to_dash())
    }

    /// `docker-ferrol-1-27-`: every tag of this stack and Kubernetes minor starts with it.
    pub fn tag_prefix(&self) -> String {
        format!("{}-", self.stack_prefix())
    }

    pub fn channel(&self) -> Channel {
        self.version.channel()
    }

    /// Whether `other` is a release of the same stack and Kubernetes minor (any version).
    pub fn same_stack(&self, other: &ReleaseId) -> bool {
        self.provider == other.provider && self.name == other.name && self.kubernetes == other.kubernetes
    }
}

/// Prints the dash form (the tag).
impl fmt::Display for ReleaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.tag())
    }
}

impl FromStr for ReleaseId {
    type Err = ReleaseIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_any(s)
    }
}

fn check_segment(name: &str, what: &'static str, value: &str) -> Result<(), ReleaseIdError> {
    if is_name_part(value) {
        Ok(())
    } else {
        Err(ReleaseIdError::Segment {
            name: name.to_owned(),
            what,
            value: value.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::version::tests::version_strategy;

    #[test]
    fn reference_names() {
        let id = ReleaseId::from_stack_spec("docker", "ferrol", "1.21", "v3-alpha.0").unwrap();
        assert_eq!(id.tag(), "docker-ferrol-1-21-v3-alpha-0");
        let hash = ReleaseId::parse_tag("docker-ferrol-1-27-v0-sha-hipstsw").unwrap();
        assert_eq!(hash.cluster_class_name(), "docker-ferrol-1-27-v0-sha.hipstsw");
        assert_eq!(hash.stack_prefix(), "docker-ferrol-1-27");
        assert_eq!(hash.channel(), Channel::Custom);
        assert_eq!(
            ReleaseId::parse_cluster_class("docker-ferrol-1-27-v0-sha.hipstsw").unwrap(),
            hash,
            "the ClusterClass name and the tag name the same release"
        );
        assert_eq!(
            ReleaseId::parse_any("docker-ferrol-1-27-v0-sha.hipstsw").unwrap(),
            hash
        );
        let stable = ReleaseId::parse_any("docker-ferrol-1-27-v2").unwrap();
        assert_eq!(
            (stable.tag(), stable.cluster_class_name()),
            ("docker-ferrol-1-27-v2".into(), "docker-ferrol-1-27-v2".into())
        );
    }

    #[test]
    fn refuses_malformed_names() {
        for bad in [
            "docker-ferrol-1-27",
            "docker-ferrol-1-27-v1-alpha",
            "docker-ferrol-1-x-v1",
            "docker-ferrol-0-27-v1",
            "-ferrol-1-27-v1",
            "Docker-ferrol-1-27-v1",
            "docker-ferrol-1-27-v0-sha.hipstsw-x",
            "test-cluster-class",
            "docker-ferrol-1-27-v1.0",
        ] {
            assert!(ReleaseId::parse_any(bad).is_err(), "{bad}");
        }
        assert!(
            ReleaseId::parse_tag("docker-ferrol-1-27-v0-sha.hipstsw").is_err(),
            "dot form is not a tag"
        );
        assert!(ReleaseId::parse_cluster_class("docker-ferrol-1-27-v0-sha-hipstsw").is_err());
        assert!(matches!(
            ReleaseId::from_stack_spec("dock-er", "ferrol", "1.27", "v1"),
            Err(ReleaseIdError::Segment { what: "provider", .. })
        ));
    }

    #[test]
    fn orders_versions_of_one_stack() {
        let mut ids: Vec<ReleaseId> = [
            "docker-ferrol-1-27-v10",
            "docker-ferrol-1-27-v9",
            "docker-ferrol-1-27-v2",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        ids.sort();
        let tags: Vec<String> = ids.iter().map(ReleaseId::tag).collect();
        assert_eq!(
            tags,
            [
                "docker-ferrol-1-27-v2",
                "docker-ferrol-1-27-v9",
                "docker-ferrol-1-27-v10"
            ]
        );
    }

    #[test]
    fn every_fixture_tag_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let tag = entry.unwrap().file_name().into_string().unwrap();
            let id = ReleaseId::parse_tag(&tag).unwrap_or_else(|e| panic!("{tag}: {e}"));
            assert_eq!(id.tag(), tag);
            seen += 1;
        }
        assert!(seen >= 5, "expected the fixture releases under {}", dir.display());
    }

    fn id_strategy() -> impl Strategy<Value = ReleaseId> {
        (
            "[a-z][a-z0-9]{0,8}",
            "[a-z][a-z0-9]{0,8}",
            1u32..3,
            1u32..40,
            version_strategy(),
        )
            .prop_map(|(provider, name, major, minor, version)| ReleaseId {
                provider,
                name,
                kubernetes: KubernetesVersion { major, minor },
                version,
            })
    }

    proptest! {
        #[test]
        fn names_round_trip(id in id_strategy()) {
            prop_assert_eq!(ReleaseId::parse_tag(&id.tag()).unwrap().tag(), id.tag());
            prop_assert_eq!(ReleaseId::parse_cluster_class(&id.cluster_class_name()).unwrap().cluster_class_name(), id.cluster_class_name());
            prop_assert_eq!(ReleaseId::parse_any(&id.cluster_class_name()).unwrap(), id.clone());
            prop_assert_eq!(ReleaseId::parse_any(&id.tag()).unwrap(), id);
        }

        #[test]
        fn ordering_is_a_total_order(a in id_strategy(), b in id_strategy(), c in id_strategy()) {
            prop_assert_eq!(a.cmp(&b), b.cmp(&a).reverse());
            prop_assert_eq!(a.cmp(&b) == std::cmp::Ordering::Equal, a == b);
            if a <= b && b <= c { prop_assert!(a <= c); }
        }

        #[test]
        fn arbitrary_names_never_panic(s in "[a-z0-9.\\-]{0,40}") {
            let _ = ReleaseId::parse_any(&s);
        }
    }
}
