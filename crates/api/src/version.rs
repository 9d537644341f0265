//! Cluster-stack versions (`v1`, `v1-alpha.1`, `v0-sha.hipstsw`, `v0-ttl.1744718400`) and Kubernetes minor
//! versions (`1.27`).
//!
//! A version has a *dot form* (`spec.versions`, ClusterClass names, chart versions, `metadata.yaml`) and a
//! *dash form* (release tags, ClusterStackRelease names, cache directories). Both parse into one value, so the
//! two forms of the same release compare equal. Unlike the Go operator, every pre-release version (hash
//! versions such as `v0-sha.hipstsw` included) belongs to the `custom` channel, except the stacks' development
//! builds `v0-ttl.<unix timestamp>` (pushed to ttl.sh since 2026), which have a channel of their own, `ttl`, so
//! that a ClusterStack can follow the newest build. Numeric patches compare as numbers (`alpha.9` < `alpha.10`;
//! ttl builds by timestamp).

use std::{cmp::Ordering, fmt, str::FromStr};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Why a version string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    #[error(
        "invalid cluster stack version {0:?}: expected v<major> or v<major>-<word>.<patch> (dash form: v<major>-<word>-<patch>)"
    )]
    Format(String),
    #[error("invalid cluster stack version {0:?}: the major version must be a number without leading zeros")]
    Major(String),
    #[error(
        "invalid cluster stack version {0:?}: pre-release word and patch must be lowercase letters and digits"
    )]
    Characters(String),
    #[error(
        "invalid cluster stack version {0:?}: a ttl build's patch must be a unix timestamp (digits), e.g. v0-ttl.1744718400"
    )]
    Timestamp(String),
    #[error(
        "invalid Kubernetes version {0:?}: expected <major>.<minor> such as 1.27 (or <major>.<minor>.<patch>, read as its minor), major and minor non-zero"
    )]
    Kubernetes(String),
}

/// The release channel a ClusterStack follows (`spec.channel`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Channel {
    /// Plain versions: `v1`, `v2`, ...
    #[default]
    Stable,
    /// Pre-release versions, including hash builds: `v0-sha.hipstsw`, `v1-alpha.0`. A `custom` ClusterStack
    /// also admits `ttl` builds (see [`Channel::admits`]).
    Custom,
    /// The stacks' development builds, `v0-ttl.<unix timestamp>`, ordered by time.
    Ttl,
}

impl Channel {
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Stable => "stable",
            Channel::Custom => "custom",
            Channel::Ttl => "ttl",
        }
    }

    /// Whether a ClusterStack following `self` may list and own a release of channel `release`.
    ///
    /// `ttl` builds are pre-releases, and the stacks' own generator (`generate-clusterstack-ttl.sh`) writes
    /// them into `channel: custom` ClusterStacks, which the Go operator accepts (it never checks a version
    /// against the channel). So `custom` admits `ttl` builds; `ttl` admits only them, which is what makes
    /// "follow the newest development build" (auto-subscribe, ordered by timestamp) possible.
    pub fn admits(self, release: Channel) -> bool {
        self == release || (self == Channel::Custom && release == Channel::Ttl)
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The pre-release word of the stacks' development builds (`v0-ttl.1744718400`).
pub const TTL_WORD: &str = "ttl";

/// The pre-release part of a version: `alpha.1` is word `alpha`, patch `1`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PreRelease {
    pub word: String,
    pub patch: String,
}

/// A cluster-stack version.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Version {
    pub major: u64,
    pub pre: Option<PreRelease>,
}

impl Version {
    pub fn stable(major: u64) -> Self {
        Version { major, pre: None }
    }

    pub fn channel(&self) -> Channel {
        match &self.pre {
            None => Channel::Stable,
            Some(p) if p.word == TTL_WORD => Channel::Ttl,
            Some(_) => Channel::Custom,
        }
    }

    /// Parses the dot form (`v1`, `v1-alpha.1`).
    pub fn parse_dot(s: &str) -> Result<Self, VersionError> {
        Self::parse_with(s, '.')
    }

    /// Parses the dash form (`v1`, `v1-alpha-1`).
    pub fn parse_dash(s: &str) -> Result<Self, VersionError> {
        Self::parse_with(s, '-')
    }

    /// Parses either form. Only the dot form has a dot, and stable versions read the same in both, so the
    /// dot decides which parser's error a refused text gets.
    pub fn parse_any(s: &str) -> Result<Self, VersionError> {
        if s.contains('.') {
            Self::parse_dot(s)
        } else {
            Self::parse_dash(s)
        }
    }

    fn parse_with(s: &str, patch_separator: char) -> Result<Self, VersionError> {
        let rest = s
            .strip_prefix('v')
            .ok_or_else(|| VersionError::Format(s.to_owned()))?;
        let (major, pre) = match rest.split_once('-') {
            None => (rest, None),
            Some((major, pre)) => {
                let (word, patch) = pre
                    .split_once(patch_separator)
                    .ok_or_else(|| VersionError::Format(s.to_owned()))?;
                if word.is_empty() || patch.is_empty() {
                    return Err(VersionError::Format(s.to_owned()));
                }
                if !is_name_part(word) || !is_name_part(patch) {
                    return Err(if word.contains(['-', '.']) || patch.contains(['-', '.']) {
                        VersionError::Format(s.to_owned())
                    } else {
                        VersionError::Characters(s.to_owned())
                    });
                }
                // The ttl channel is ordered by time: a patch that is not a timestamp could not be placed.
                if word == TTL_WORD && parse_number(patch).is_none() {
                    return Err(VersionError::Timestamp(s.to_owned()));
                }
                (
                    major,
                    Some(PreRelease {
                        word: word.to_owned(),
                        patch: patch.to_owned(),
                    }),
                )
            }
        };
        Ok(Version {
            major: parse_number(major).ok_or_else(|| VersionError::Major(s.to_owned()))?,
            pre,
        })
    }

    /// The dot form: `v1`, `v0-sha.hipstsw`.
    pub fn to_dot(&self) -> String {
        self.render('.')
    }

    /// The dash form: `v1`, `v0-sha-hipstsw`.
    pub fn to_dash(&self) -> String {
        self.render('-')
    }

    fn render(&self, patch_separator: char) -> String {
        match &self.pre {
            None => format!("v{}", self.major),
            Some(p) => format!("v{}-{}{}{}", self.major, p.word, patch_separator, p.patch),
        }
    }
}

/// Prints the dot form.
impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_dot())
    }
}

impl FromStr for Version {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_any(s)
    }
}

/// A total order: by major; a pre-release sorts before the stable version of the same major (as in
/// SemVer); pre-releases by word, then by patch, numerically when both patches are numbers.
impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        self.major
            .cmp(&other.major)
            .then_with(|| match (&self.pre, &other.pre) {
                (None, None) => Ordering::Equal,
                (None, Some(_)) => Ordering::Greater,
                (Some(_), None) => Ordering::Less,
                (Some(a), Some(b)) => a
                    .word
                    .cmp(&b.word)
                    .then_with(|| compare_patch(&a.patch, &b.patch)),
            })
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Numbers before words, numbers by value, and the text itself as the final tie-break so that the
/// order agrees with equality (`01` and `1` are different versions).
fn compare_patch(a: &str, b: &str) -> Ordering {
    let numeric = |s: &str| s.bytes().all(|c| c.is_ascii_digit());
    match (numeric(a), numeric(b)) {
        (true, true) => {
            let (ta, tb) = (a.trim_start_matches('0'), b.trim_start_matches('0'));
            ta.len()
                .cmp(&tb.len())
                .then_with(|| ta.cmp(tb))
                .then_with(|| a.cmp(b))
        }
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => a.cmp(b),
    }
}

/// A Kubernetes minor release: `1.27` (dot form, `spec.kubernetesVersion`) or `1-27` (in names). A patch
/// release names its minor: `1.34.6` is `1.34`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KubernetesVersion {
    pub major: u32,
    pub minor: u32,
}

impl KubernetesVersion {
    /// Parses `1.27`, and `1.34.6` as `1.34`: the stacks' generator writes the full Kubernetes version into
    /// `spec.kubernetesVersion`, and a cluster stack is built per minor, so the patch selects nothing.
    pub fn parse_dot(s: &str) -> Result<Self, VersionError> {
        let invalid = || VersionError::Kubernetes(s.to_owned());
        let mut parts = s.split('.');
        let (Some(major), Some(minor)) = (parts.next(), parts.next()) else {
            return Err(invalid());
        };
        match (parts.next(), parts.next()) {
            (None, _) => {}
            (Some(patch), None) if parse_number(patch).is_some() => {}
            _ => return Err(invalid()),
        }
        Self::from_parts(major, minor).ok_or_else(invalid)
    }

    /// Builds from the two name segments (`"1"`, `"27"`).
    pub fn from_parts(major: &str, minor: &str) -> Option<Self> {
        let major = u32::try_from(parse_number(major)?).ok()?;
        let minor = u32::try_from(parse_number(minor)?).ok()?;
        (major != 0 && minor != 0).then_some(KubernetesVersion { major, minor })
    }

    /// `1.27`
    pub fn to_dot(self) -> String {
        format!("{}.{}", self.major, self.minor)
    }

    /// `1-27`
    pub fn to_dash(self) -> String {
        format!("{}-{}", self.major, self.minor)
    }
}

impl fmt::Display for KubernetesVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_dot())
    }
}

/// A decimal number without sign or leading zeros (so that rendering gives back the same text).
fn parse_number(s: &str) -> Option<u64> {
    let canonical =
        !s.is_empty() && s.bytes().all(|c| c.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if canonical { s.parse().ok() } else { None }
}

/// Lowercase ASCII letters and digits: what can stand in an object name segment.
pub(crate) fn is_name_part(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;
    use rstest::rstest;

    use super::*;

    #[test]
    fn parses_the_reference_examples() {
        assert_eq!(Version::parse_dot("v1").unwrap(), Version::stable(1));
        let alpha = Version::parse_dot("v1-alpha.1").unwrap();
        assert_eq!(
            alpha.pre,
            Some(PreRelease {
                word: "alpha".into(),
                patch: "1".into()
            })
        );
        let hash = Version::parse_dot("v0-sha.hipstsw").unwrap();
        assert_eq!(hash.major, 0);
        assert_eq!(
            hash,
            Version::parse_dash("v0-sha-hipstsw").unwrap(),
            "dot and dash forms are one version"
        );
        assert_eq!(hash.to_dash(), "v0-sha-hipstsw");
        assert_eq!(hash.to_dot(), "v0-sha.hipstsw");
    }

    #[test]
    fn rejects_what_the_reference_rejects() {
        for bad in [
            "v1-alpha",
            "v1-alpha-1",
            "v1.0-alpha.1",
            "v1-alpha.",
            "1",
            "v",
            "",
            "v1-.1",
            "vx",
        ] {
            assert!(
                Version::parse_dot(bad).is_err(),
                "{bad} must not parse in dot form"
            );
        }
        for bad in ["v1-alpha", "v1-alpha.1", "v1-alpha-", "v1-alpha-1-2"] {
            assert!(
                Version::parse_dash(bad).is_err(),
                "{bad} must not parse in dash form"
            );
        }
    }

    #[test]
    fn rejects_forms_that_would_not_round_trip_or_name_an_object() {
        assert_eq!(Version::parse_dot("v01"), Err(VersionError::Major("v01".into())));
        assert_eq!(
            Version::parse_dot("v1-Alpha.1"),
            Err(VersionError::Characters("v1-Alpha.1".into()))
        );
        assert_eq!(
            Version::parse_dot("v1-al_pha.1"),
            Err(VersionError::Characters("v1-al_pha.1".into()))
        );
    }

    #[rstest]
    #[case::stable("v3", Channel::Stable)]
    #[case::hash_build("v0-sha.hipstsw", Channel::Custom)]
    #[case::hash_build_dash("v0-sha-hipstsw", Channel::Custom)]
    #[case::git_build("v0-git.a97eb17", Channel::Custom)]
    #[case::alpha("v3-alpha.0", Channel::Custom)]
    #[case::ttl_build("v0-ttl.1744718400", Channel::Ttl)]
    #[case::ttl_build_dash("v0-ttl-1744718400", Channel::Ttl)]
    #[case::ttl_any_major("v2-ttl.1", Channel::Ttl)]
    #[case::word_only_starting_with_ttl("v0-ttlx.abc", Channel::Custom)]
    fn channel_of_a_version(#[case] text: &str, #[case] channel: Channel) {
        assert_eq!(Version::parse_any(text).unwrap().channel(), channel);
    }

    #[rstest]
    #[case::dot("v0-ttl.1744718400", "v0-ttl-1744718400")]
    #[case::dash("v0-ttl-1744718400", "v0-ttl-1744718400")]
    fn ttl_builds_have_a_dot_and_a_dash_form(#[case] text: &str, #[case] dash: &str) {
        let v = Version::parse_any(text).unwrap();
        assert_eq!(v.to_dash(), dash);
        assert_eq!(v.to_dot(), "v0-ttl.1744718400");
        assert_eq!(
            Version::parse_dot("v0-ttl.1744718400").unwrap(),
            Version::parse_dash("v0-ttl-1744718400").unwrap()
        );
    }

    #[rstest]
    #[case::word("v0-ttl.abc")]
    #[case::mixed("v0-ttl.174a")]
    #[case::leading_zero("v0-ttl.0174")]
    #[case::dash_word("v0-ttl-latest")]
    fn ttl_builds_need_a_timestamp(#[case] text: &str) {
        assert!(
            matches!(Version::parse_any(text), Err(VersionError::Timestamp(_))),
            "{text}: {:?}",
            Version::parse_any(text)
        );
    }

    #[rstest]
    #[case::by_timestamp("v0-ttl.1744718400", "v0-ttl.1744718401")]
    #[case::numerically_not_as_text("v0-ttl.999999999", "v0-ttl.1000000000")]
    #[case::major_first("v0-ttl.1900000000", "v1-ttl.1")]
    #[case::before_the_stable_release("v1-ttl.1744718400", "v1")]
    fn ttl_builds_are_ordered_by_time(#[case] older: &str, #[case] newer: &str) {
        let (older, newer) = (
            Version::parse_any(older).unwrap(),
            Version::parse_any(newer).unwrap(),
        );
        assert!(older < newer, "{older} < {newer}");
    }

    #[rstest]
    #[case(Channel::Stable, Channel::Stable, true)]
    #[case(Channel::Stable, Channel::Custom, false)]
    #[case(Channel::Stable, Channel::Ttl, false)]
    #[case(Channel::Custom, Channel::Custom, true)]
    #[case::the_generator_writes_ttl_builds_into_custom_stacks(Channel::Custom, Channel::Ttl, true)]
    #[case(Channel::Custom, Channel::Stable, false)]
    #[case(Channel::Ttl, Channel::Ttl, true)]
    #[case(Channel::Ttl, Channel::Custom, false)]
    #[case(Channel::Ttl, Channel::Stable, false)]
    fn which_channel_admits_which(#[case] stack: Channel, #[case] release: Channel, #[case] admitted: bool) {
        assert_eq!(stack.admits(release), admitted);
    }

    #[test]
    fn channels_serialize_as_the_crd_writes_them() {
        for (channel, text) in [
            (Channel::Stable, "stable"),
            (Channel::Custom, "custom"),
            (Channel::Ttl, "ttl"),
        ] {
            assert_eq!(serde_json::to_value(channel).unwrap(), serde_json::json!(text));
            assert_eq!(channel.to_string(), text);
        }
    }

    #[test]
    fn patches_compare_numerically() {
        let v = |s| Version::parse_dot(s).unwrap();
        assert!(v("v1-alpha.9") < v("v1-alpha.10"));
        assert!(v("v2") < v("v10-alpha.1"), "major decides first");
        assert!(v("v10") > v("v9"));
        assert!(v("v1-rc.1") < v("v1"), "a pre-release comes before its release");
        assert!(v("v1-alpha.1") < v("v1-beta.0"));
        assert!(v("v1-alpha.9") < v("v1-alpha.a"), "numbers before words");
    }

    #[rstest]
    #[case::minor("1.27", 1, 27)]
    #[case::two_digit_minor("1.9", 1, 9)]
    #[case::patch_names_its_minor("1.34.6", 1, 34)]
    #[case::patch_zero("1.35.0", 1, 35)]
    fn kubernetes_versions(#[case] text: &str, #[case] major: u32, #[case] minor: u32) {
        let k = KubernetesVersion::parse_dot(text).unwrap();
        assert_eq!(k, KubernetesVersion { major, minor });
        assert_eq!(
            k.to_dot(),
            format!("{major}.{minor}"),
            "names use the minor alone"
        );
        assert_eq!(k.to_dash(), format!("{major}-{minor}"));
    }

    #[rstest]
    #[case("1.x")]
    #[case("1")]
    #[case("0.27")]
    #[case("1.0")]
    #[case("01.27")]
    #[case("")]
    #[case("1.34.")]
    #[case("1.34.x")]
    #[case("1.34.06")]
    #[case("1.34.6.1")]
    #[case("v1.34.6")]
    #[case("1.34-6")]
    fn kubernetes_versions_refused(#[case] text: &str) {
        assert!(KubernetesVersion::parse_dot(text).is_err(), "{text}");
    }

    #[test]
    fn kubernetes_versions_order_numerically() {
        assert!(KubernetesVersion::parse_dot("1.9").unwrap() < KubernetesVersion::parse_dot("1.10").unwrap());
    }

    pub(crate) fn version_strategy() -> impl Strategy<Value = Version> {
        let pre = prop_oneof![
            Just(None),
            ("[a-z][a-z0-9]{0,5}", "[a-z0-9]{1,7}")
                .prop_filter("a ttl build's patch is a timestamp", |(word, _)| word != TTL_WORD)
                .prop_map(Some),
            (0u64..2_000_000_000).prop_map(|t| Some((TTL_WORD.to_owned(), t.to_string()))),
        ];
        (0u64..40, pre).prop_map(|(major, pre)| Version {
            major,
            pre: pre.map(|(word, patch)| PreRelease { word, patch }),
        })
    }

    proptest! {
        #[test]
        fn dot_and_dash_forms_round_trip(v in version_strategy()) {
            prop_assert_eq!(Version::parse_dot(&v.to_dot()).unwrap().to_dot(), v.to_dot());
            prop_assert_eq!(Version::parse_dash(&v.to_dash()).unwrap().to_dash(), v.to_dash());
            prop_assert_eq!(Version::parse_any(&v.to_dash()).unwrap(), v.clone());
            prop_assert_eq!(Version::parse_any(&v.to_dot()).unwrap(), v);
        }

        #[test]
        fn ordering_is_a_total_order(a in version_strategy(), b in version_strategy(), c in version_strategy()) {
            prop_assert_eq!(a.cmp(&b), b.cmp(&a).reverse());
            prop_assert_eq!(a.cmp(&b) == Ordering::Equal, a == b);
            if a <= b && b <= c {
                prop_assert!(a <= c);
            }
        }

        #[test]
        fn arbitrary_text_never_panics(s in "\\PC{0,20}") {
            let _ = Version::parse_any(&s);
            let _ = KubernetesVersion::parse_dot(&s);
        }
    }
}
