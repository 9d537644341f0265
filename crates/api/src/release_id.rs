//! The canonical identity of one cluster-stack release and every name derived from it.
//!
//! `docker-ferrol-1-27-v0-sha-hipstsw` (dash form: release tag, ClusterStackRelease name, cache directory) and
//! `docker-ferrol-1-27-v0-sha.hipstsw` (dot form: ClusterClass name) are the same [`ReleaseId`]. Every
//! comparison in the operator goes through this type, never through strings, which is what breaks the custom
//! channel in the Go operator.
//!
//! Names are read from the right: the version (`v1`, `v0-sha-hipstsw` / `v0-sha.hipstsw`, `v0-ttl-1744718400`),
//! then the Kubernetes minor (`1-27`), then the provider is the first segment and the stack name everything
//! between. Stack names may have dashes (`openstack-hosted-control-plane-1-34-v1`, as the stacks publish them
//! since 2026); providers may not, as in the Go operator, where the provider is the first segment.

use std::{fmt, str::FromStr};

use crate::version::{Channel, KubernetesVersion, Version, VersionError, is_name_part};

/// Why a release name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseIdError {
    #[error(
        "invalid release name {0:?}: expected <provider>-<name>-<major>-<minor>-<version>, e.g. docker-ferrol-1-27-v1"
    )]
    Format(String),
    #[error("invalid release name {name:?}: {what} {value:?} must be {rule}")]
    Segment {
        name: String,
        what: &'static str,
        value: String,
        rule: &'static str,
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
            ReleaseIdError::Segment {
                what, value, rule, ..
            } => ReleaseIdError::Segment {
                name: display,
                what,
                value,
                rule,
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
        if !is_name_part(provider) {
            return Err(segment_error(&display, "provider", provider, PROVIDER_RULE));
        }
        if !is_stack_name(name) {
            return Err(segment_error(&display, "stack name", name, STACK_NAME_RULE));
        }
        Ok(ReleaseId {
            provider: provider.to_owned(),
            name: name.to_owned(),
            kubernetes,
            version,
        })
    }

    /// Parses the dash form (release tag / ClusterStackRelease name): `…-v1` or `…-v0-sha-hipstsw`.
    pub fn parse_tag(s: &str) -> Result<Self, ReleaseIdError> {
        let parts: Vec<&str> = s.split('-').collect();
        // A pre-release takes three segments (`v0`, word, patch). Its first one, `v<major>`, can never be a
        // stable tag's third segment from the right: that is the Kubernetes major, a bare number.
        let version_len = if parts.len() >= 3 && is_major(parts[parts.len() - 3]) {
            3
        } else {
            1
        };
        Self::from_segments(s, &parts, version_len, Version::parse_dash)
    }

    /// Parses the dot form (ClusterClass name): `…-v1` or `…-v0-sha.hipstsw`.
    pub fn parse_cluster_class(s: &str) -> Result<Self, ReleaseIdError> {
        let parts: Vec<&str> = s.split('-').collect();
        // A pre-release takes two segments (`v0`, `word.patch`), and only it has a dot.
        let version_len = if parts.last().is_some_and(|p| p.contains('.')) {
            2
        } else {
            1
        };
        Self::from_segments(s, &parts, version_len, Version::parse_dot)
    }

    /// Parses either form. Only the dot form has a dot, and the forms of a stable version are identical.
    pub fn parse_any(s: &str) -> Result<Self, ReleaseIdError> {
        if s.contains('.') {
            Self::parse_cluster_class(s)
        } else {
            Self::parse_tag(s)
        }
    }

    /// Reads `parts` from the right: `version_len` segments of version, two of Kubernetes minor, and at
    /// least two before them (the provider, then the stack name's segments).
    fn from_segments(
        s: &str,
        parts: &[&str],
        version_len: usize,
        parse_version: fn(&str) -> Result<Version, VersionError>,
    ) -> Result<Self, ReleaseIdError> {
        let format = || ReleaseIdError::Format(s.to_owned());
        let Some(stack_len) = parts.len().checked_sub(version_len + 2).filter(|n| *n >= 2) else {
            return Err(format());
        };
        let (stack, rest) = parts.split_at(stack_len);
        let (minor, version) = rest.split_at(2);
        let kubernetes = KubernetesVersion::from_parts(minor[0], minor[1]).ok_or_else(format)?;
        let version =
            parse_version(&version.join("-")).map_err(|e| ReleaseIdError::Version(s.to_owned(), e))?;
        Self::new(stack[0], &stack[1..].join("-"), kubernetes, version)
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

const PROVIDER_RULE: &str = "lowercase letters and digits without dashes";
const STACK_NAME_RULE: &str = "lowercase letters and digits, in parts joined by single dashes";

/// A stack name: segments of lowercase letters and digits joined by single dashes (`scs`,
/// `hosted-control-plane`). Empty segments would make names that read back differently.
pub(crate) fn is_stack_name(name: &str) -> bool {
    name.split('-').all(is_name_part)
}

/// `v<major>`: the first segment of every version.
fn is_major(segment: &str) -> bool {
    segment
        .strip_prefix('v')
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
}

fn segment_error(name: &str, what: &'static str, value: &str, rule: &'static str) -> ReleaseIdError {
    ReleaseIdError::Segment {
        name: name.to_owned(),
        what,
        value: value.to_owned(),
        rule,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rstest::rstest;

    use super::*;
    use crate::version::tests::version_strategy;

    /// Names as the stacks publish them, read from the right: (name, provider, stack name, minor, version in
    /// dot form, channel).
    #[rstest]
    #[case::stable("docker-ferrol-1-27-v2", "docker", "ferrol", "1.27", "v2", Channel::Stable)]
    #[case::hash_tag(
        "docker-ferrol-1-27-v0-sha-hipstsw",
        "docker",
        "ferrol",
        "1.27",
        "v0-sha.hipstsw",
        Channel::Custom
    )]
    #[case::hash_class(
        "docker-ferrol-1-27-v0-sha.hipstsw",
        "docker",
        "ferrol",
        "1.27",
        "v0-sha.hipstsw",
        Channel::Custom
    )]
    #[case::ttl_tag(
        "docker-scs-1-35-v0-ttl-1744718400",
        "docker",
        "scs",
        "1.35",
        "v0-ttl.1744718400",
        Channel::Ttl
    )]
    #[case::ttl_class(
        "docker-scs-1-35-v0-ttl.1744718400",
        "docker",
        "scs",
        "1.35",
        "v0-ttl.1744718400",
        Channel::Ttl
    )]
    #[case::stack_2026("docker-scs-1-35-v1", "docker", "scs", "1.35", "v1", Channel::Stable)]
    #[case::dashed_name_stable(
        "openstack-hosted-control-plane-1-34-v1",
        "openstack",
        "hosted-control-plane",
        "1.34",
        "v1",
        Channel::Stable
    )]
    #[case::dashed_name_hash_tag(
        "openstack-hosted-control-plane-1-34-v0-sha-3960147",
        "openstack",
        "hosted-control-plane",
        "1.34",
        "v0-sha.3960147",
        Channel::Custom
    )]
    #[case::dashed_name_hash_class(
        "openstack-hosted-control-plane-1-34-v0-sha.3960147",
        "openstack",
        "hosted-control-plane",
        "1.34",
        "v0-sha.3960147",
        Channel::Custom
    )]
    #[case::dashed_name_ttl(
        "openstack-scs2-1-34-v0-ttl-1768809871",
        "openstack",
        "scs2",
        "1.34",
        "v0-ttl.1768809871",
        Channel::Ttl
    )]
    #[case::name_with_a_number_segment(
        "docker-scs-2-1-35-v1-rc-1",
        "docker",
        "scs-2",
        "1.35",
        "v1-rc.1",
        Channel::Custom
    )]
    #[case::name_with_a_version_like_segment(
        "docker-v2-1-35-v1",
        "docker",
        "v2",
        "1.35",
        "v1",
        Channel::Stable
    )]
    fn reads_names_from_the_right(
        #[case] text: &str,
        #[case] provider: &str,
        #[case] name: &str,
        #[case] minor: &str,
        #[case] version: &str,
        #[case] channel: Channel,
    ) {
        let id = ReleaseId::parse_any(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(
            id,
            ReleaseId::from_stack_spec(provider, name, minor, version).unwrap()
        );
        assert_eq!(id.channel(), channel);
        assert!(
            [id.tag(), id.cluster_class_name()].contains(&text.to_owned()),
            "{text} reads back as {} / {}",
            id.tag(),
            id.cluster_class_name()
        );
        assert_eq!(ReleaseId::parse_tag(&id.tag()).unwrap(), id);
        assert_eq!(
            ReleaseId::parse_cluster_class(&id.cluster_class_name()).unwrap(),
            id
        );
        assert_eq!(
            id.stack_prefix(),
            format!("{provider}-{name}-{}", minor.replace('.', "-"))
        );
    }

    #[rstest]
    #[case::spec_patch_is_dropped(
        "docker",
        "scs",
        "1.35.1",
        "v0-ttl.1744718400",
        "docker-scs-1-35-v0-ttl-1744718400"
    )]
    #[case::dashed_name(
        "openstack",
        "hosted-control-plane",
        "1.34.6",
        "v1",
        "openstack-hosted-control-plane-1-34-v1"
    )]
    fn names_from_a_spec(
        #[case] provider: &str,
        #[case] name: &str,
        #[case] kubernetes: &str,
        #[case] version: &str,
        #[case] tag: &str,
    ) {
        assert_eq!(
            ReleaseId::from_stack_spec(provider, name, kubernetes, version)
                .unwrap()
                .tag(),
            tag
        );
    }

    #[rstest]
    #[case::provider_with_a_dash("dock-er", "ferrol", "provider")]
    #[case::empty_provider("", "ferrol", "provider")]
    #[case::empty_name("docker", "", "stack name")]
    #[case::double_dash("docker", "hosted--plane", "stack name")]
    #[case::trailing_dash("docker", "scs-", "stack name")]
    #[case::leading_dash("docker", "-scs", "stack name")]
    #[case::capitals("docker", "Scs", "stack name")]
    fn names_that_are_refused_from_a_spec(#[case] provider: &str, #[case] name: &str, #[case] field: &str) {
        match ReleaseId::from_stack_spec(provider, name, "1.27", "v1") {
            Err(ReleaseIdError::Segment { what, .. }) => assert_eq!(what, field),
            other => panic!("{provider}/{name}: {other:?}"),
        }
    }

    #[rstest]
    #[case::ttl_without_timestamp("docker-scs-1-35-v0-ttl-latest")]
    #[case::ttl_class_without_timestamp("docker-scs-1-35-v0-ttl.latest")]
    #[case::no_name("docker-1-35-v1")]
    #[case::no_name_pre_release("docker-1-35-v0-sha-abc")]
    #[case::empty_name_segment("docker--scs-1-35-v1")]
    #[case::minor_missing("docker-scs-35-v1")]
    #[case::version_only("v0-ttl-1744718400")]
    #[case::dot_in_the_name("docker-s.cs-1-35-v1")]
    fn more_names_refused(#[case] text: &str) {
        assert!(
            ReleaseId::parse_any(text).is_err(),
            "{text}: {:?}",
            ReleaseId::parse_any(text)
        );
    }

    #[test]
    fn ttl_builds_of_a_stack_order_by_time() {
        let mut ids: Vec<ReleaseId> = [
            "docker-scs-1-35-v0-ttl-1744718400",
            "docker-scs-1-35-v0-ttl-999999999",
            "docker-scs-1-35-v0-ttl-1744718399",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        ids.sort();
        let patches: Vec<String> = ids.iter().map(|id| id.version.to_dot()).collect();
        assert_eq!(
            patches,
            ["v0-ttl.999999999", "v0-ttl.1744718399", "v0-ttl.1744718400"]
        );
    }

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
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        let mut seen = 0;
        for dir in ["releases", "releases-2026"] {
            for entry in std::fs::read_dir(fixtures.join(dir)).unwrap() {
                let entry = entry.unwrap();
                if !entry.file_type().unwrap().is_dir() {
                    continue; // README.md
                }
                let tag = entry.file_name().into_string().unwrap();
                let id = ReleaseId::parse_tag(&tag).unwrap_or_else(|e| panic!("{tag}: {e}"));
                assert_eq!(id.tag(), tag);
                seen += 1;
            }
        }
        assert!(
            seen >= 6,
            "expected the fixture releases under {}",
            fixtures.display()
        );
    }

    fn id_strategy() -> impl Strategy<Value = ReleaseId> {
        (
            "[a-z][a-z0-9]{0,8}",
            // Stack names with dashes, and with segments that look like numbers or versions.
            "[a-z0-9]{1,6}(-(v?[0-9]{1,2}|[a-z0-9]{1,6})){0,3}",
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
        fn arbitrary_names_never_panic(s in "[a-z0-9.v\\-]{0,40}") {
            let _ = ReleaseId::parse_any(&s);
        }
    }
}
