//! What a ClusterStack's spec means: the stack it follows ([`StackKey`]: provider, name, Kubernetes
//! minor), its channel and versions ([`StackSpec`]), the one ownership rule (which releases are the
//! ClusterStack's), and what its digest pins must be ([`version_digest_errors`]).
//!
//! The admission webhook refuses a spec these rules refuse, and the controller reports the same errors in its
//! conditions, so both say the same about one object. Errors name the field they are about.

use std::{borrow::Cow, fmt};

use crate::{
    ClusterStack, ReleaseId,
    cluster_stack_release::is_manifest_digest,
    release_id::is_stack_name,
    version::{Channel, KubernetesVersion, Version, is_name_part},
};

/// One rejected field of an object, e.g. `spec.versions: invalid version "3": ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// The field's path, e.g. `spec.versions`, or one entry of a map, `spec.versionDigests[v2]`.
    pub field: Cow<'static, str>,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<Cow<'static, str>>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// One cluster stack for one Kubernetes minor: what a ClusterStack follows, whatever its channel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StackKey {
    pub provider: String,
    pub name: String,
    pub kubernetes: KubernetesVersion,
}

impl StackKey {
    /// The stack of `stack`'s spec; `spec.versions` are not looked at, so a ClusterStack with a bad version
    /// still has an identity (and its Clusters still count as users).
    pub fn of(stack: &ClusterStack) -> Result<StackKey, Vec<FieldError>> {
        let spec = &stack.spec;
        let mut errors = Vec::new();
        // Provider and name start every release name, which is read from the right: the provider is its
        // first segment (so it has no dash), the name everything up to the Kubernetes minor (dashes allowed,
        // `hosted-control-plane`). Capitals or empty segments would make names that are no object names or
        // read back differently.
        if !is_name_part(&spec.provider) {
            errors.push(FieldError::new(
                "spec.provider",
                format!(
                    "{:?} must be lowercase letters and digits without dashes",
                    spec.provider
                ),
            ));
        }
        if !is_stack_name(&spec.name) {
            errors.push(FieldError::new(
                "spec.name",
                format!(
                    "{:?} must be lowercase letters and digits, in parts joined by single dashes",
                    spec.name
                ),
            ));
        }
        // `1.34.6` (as the stacks' generator writes it) is the minor `1.34`: only the minor names releases.
        match KubernetesVersion::parse_dot(&spec.kubernetes_version) {
            Err(e) => {
                errors.push(FieldError::new("spec.kubernetesVersion", e.to_string()));
                Err(errors)
            }
            Ok(kubernetes) if errors.is_empty() => Ok(StackKey {
                provider: spec.provider.clone(),
                name: spec.name.clone(),
                kubernetes,
            }),
            _ => Err(errors),
        }
    }

    /// `docker-ferrol-1-27-`: every tag of the stack starts with it.
    pub fn tag_prefix(&self) -> String {
        format!("{}-{}-{}-", self.provider, self.name, self.kubernetes.to_dash())
    }

    /// Whether `id` is a release of this stack and Kubernetes minor, of any channel.
    pub fn contains(&self, id: &ReleaseId) -> bool {
        id.provider == self.provider && id.name == self.name && id.kubernetes == self.kubernetes
    }

    /// The ownership rule: a ClusterStack owns the releases of its stack on a channel its channel admits.
    /// Hash builds (`v0-sha.hipstsw`) are on the `custom` channel, so a `custom` ClusterStack owns them;
    /// ttl builds (`v0-ttl.1744718400`) are owned by a `ttl` ClusterStack and by a `custom` one, where the
    /// stacks' generator puts them ([`Channel::admits`]).
    pub fn owns(&self, channel: Channel, id: &ReleaseId) -> bool {
        self.contains(id) && channel.admits(id.channel())
    }
}

/// The stack a ClusterStack follows, from its spec, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackSpec {
    pub stack: StackKey,
    pub channel: Channel,
    /// `spec.versions`, each of `channel`, in the order written.
    pub versions: Vec<Version>,
    pub auto_subscribe: bool,
    /// `spec.versionDigests` that are well formed ([`version_digest_errors`] names the others): the manifest
    /// digest each pinned version's release must have.
    pub pins: std::collections::BTreeMap<Version, String>,
}

impl StackSpec {
    /// Checks `stack`'s spec: provider and name make release names, `kubernetesVersion` is a minor such as
    /// `1.27` (or a patch release, `1.34.6`, read as its minor), every version parses (dot form) and belongs
    /// to a channel the spec's channel admits. Every error is returned,
    /// each naming its field. (`providerRef` and immutability are the webhook's: they need no release names.)
    pub fn validate(stack: &ClusterStack) -> Result<StackSpec, Vec<FieldError>> {
        let spec = &stack.spec;
        let key = StackKey::of(stack);
        let mut errors = key.as_ref().err().cloned().unwrap_or_default();
        let mut versions = Vec::with_capacity(spec.versions.len());
        for text in &spec.versions {
            match Version::parse_dot(text) {
                Err(e) => errors.push(FieldError::new(
                    "spec.versions",
                    format!("invalid version {text:?}: {e}"),
                )),
                Ok(version) if !spec.channel.admits(version.channel()) => errors.push(FieldError::new(
                    "spec.versions",
                    format!(
                        "version {text:?} belongs to channel {}, but the ClusterStack follows channel {}",
                        version.channel(),
                        spec.channel
                    ),
                )),
                Ok(version) => versions.push(version),
            }
        }
        match key {
            Ok(stack) if errors.is_empty() => Ok(StackSpec {
                stack,
                channel: spec.channel,
                versions,
                auto_subscribe: spec.auto_subscribe,
                pins: spec
                    .version_digests
                    .iter()
                    .filter(|(_, digest)| is_manifest_digest(digest))
                    .filter_map(|(text, digest)| Some((Version::parse_dot(text).ok()?, digest.clone())))
                    .collect(),
            }),
            _ => Err(errors),
        }
    }

    /// [`StackSpec::validate`] with the errors in one message (`field: message; field: message`), as a
    /// condition shows it.
    pub fn parse(stack: &ClusterStack) -> Result<StackSpec, String> {
        Self::validate(stack).map_err(|errors| {
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    /// Whether `id` is one of this ClusterStack's releases: same provider, name and Kubernetes minor, and a
    /// channel the ClusterStack's channel admits (any version).
    pub fn owns(&self, id: &ReleaseId) -> bool {
        self.stack.owns(self.channel, id)
    }

    /// The manifest digest release `id` is pinned to, if any.
    pub fn pin(&self, id: &ReleaseId) -> Option<&str> {
        self.pins.get(&id.version).map(String::as_str)
    }

    /// The release of this stack with `version`.
    pub fn release(&self, version: &Version) -> Option<ReleaseId> {
        let stack = &self.stack;
        ReleaseId::new(&stack.provider, &stack.name, stack.kubernetes, version.clone()).ok()
    }
}

/// Checks `spec.versionDigests`, the digest pins: every key is a version of `spec.versions` as written there
/// (dot form, `v2`, `v0-sha.hipstsw`), every value a manifest digest `sha256:<64 lowercase hex>`. Each
/// problem is one error naming its entry, `spec.versionDigests[<key>]`. Apart from [`StackSpec::validate`]:
/// a bad pin makes the webhook refuse the object, but it does not change which stack and releases the spec
/// means.
pub fn version_digest_errors(stack: &ClusterStack) -> Vec<FieldError> {
    let spec = &stack.spec;
    let mut errors = Vec::new();
    for (version, digest) in &spec.version_digests {
        let field = format!("spec.versionDigests[{version}]");
        if !spec.versions.contains(version) {
            errors.push(FieldError::new(
                field.clone(),
                format!("version {version:?} is not in spec.versions; only a listed version can be pinned"),
            ));
        }
        if !is_manifest_digest(digest) {
            errors.push(FieldError::new(
                field,
                format!("{digest:?} is not a manifest digest: sha256:<64 lowercase hex digits>"),
            ));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use rstest::rstest;
    use serde_json::json;

    use super::*;

    fn stack(spec: serde_json::Value) -> ClusterStack {
        serde_json::from_value(json!({
            "apiVersion": "clusterstack.x-k8s.io/v1alpha1", "kind": "ClusterStack",
            "metadata": {"name": "ferrol", "namespace": "ns"}, "spec": spec,
        }))
        .unwrap()
    }

    /// A docker/ferrol/1.27 ClusterStack with `overrides` merged into its spec.
    fn ferrol(overrides: serde_json::Value) -> ClusterStack {
        let mut spec = json!({"provider": "docker", "name": "ferrol", "kubernetesVersion": "1.27",
                              "noProvider": true, "autoSubscribe": false});
        for (key, value) in overrides.as_object().unwrap() {
            spec[key] = value.clone();
        }
        stack(spec)
    }

    fn id(name: &str) -> ReleaseId {
        ReleaseId::parse_any(name).unwrap()
    }

    fn fields(errors: &[FieldError]) -> Vec<&str> {
        errors.iter().map(|e| e.field.as_ref()).collect()
    }

    #[test]
    fn a_valid_spec() {
        let spec = StackSpec::parse(&ferrol(json!({"versions": ["v1", "v2"]}))).unwrap();
        assert_eq!(
            spec.stack,
            StackKey {
                provider: "docker".into(),
                name: "ferrol".into(),
                kubernetes: KubernetesVersion { major: 1, minor: 27 }
            }
        );
        assert_eq!(spec.channel, Channel::Stable);
        assert_eq!(spec.versions, [Version::stable(1), Version::stable(2)]);
        assert!(!spec.auto_subscribe);
        assert_eq!(spec.stack.tag_prefix(), "docker-ferrol-1-27-");
        assert_eq!(
            spec.release(&Version::stable(2)),
            Some(id("docker-ferrol-1-27-v2"))
        );

        let custom = StackSpec::parse(&ferrol(
            json!({"channel": "custom", "versions": ["v0-sha.hipstsw"]}),
        ))
        .unwrap();
        assert_eq!(
            custom.release(&custom.versions[0]).map(|r| r.tag()).as_deref(),
            Some("docker-ferrol-1-27-v0-sha-hipstsw")
        );
    }

    #[test]
    fn errors_name_their_fields() {
        for (overrides, expected_fields, expected_text) in [
            (
                json!({"versions": ["v1-alpha"]}),
                vec!["spec.versions"],
                "invalid version \"v1-alpha\"",
            ),
            (
                json!({"versions": ["3"]}),
                vec!["spec.versions"],
                "invalid version \"3\"",
            ),
            (
                json!({"versions": ["v0-sha.hipstsw"]}),
                vec!["spec.versions"],
                "belongs to channel custom, but the ClusterStack follows channel stable",
            ),
            (
                json!({"channel": "custom", "versions": ["v0-sha.hipstsw", "v2"]}),
                vec!["spec.versions"],
                "version \"v2\" belongs to channel stable",
            ),
            (
                json!({"provider": "dock-er"}),
                vec!["spec.provider"],
                "\"dock-er\" must be lowercase",
            ),
            (
                json!({"name": "Ferrol"}),
                vec!["spec.name"],
                "\"Ferrol\" must be lowercase",
            ),
            (
                json!({"kubernetesVersion": "1.x"}),
                vec!["spec.kubernetesVersion"],
                "invalid Kubernetes version",
            ),
            (
                json!({"provider": "", "kubernetesVersion": "0.27", "versions": ["v1", "x"]}),
                vec!["spec.provider", "spec.kubernetesVersion", "spec.versions"],
                "invalid version \"x\"",
            ),
        ] {
            let errors = StackSpec::validate(&ferrol(overrides.clone())).unwrap_err();
            assert_eq!(fields(&errors), expected_fields, "{overrides}");
            let message = StackSpec::parse(&ferrol(overrides.clone())).unwrap_err();
            assert!(message.contains(expected_text), "{overrides}: {message}");
            assert!(message.starts_with(expected_fields[0]), "{message}");
        }
    }

    #[test]
    fn the_identity_does_not_need_valid_versions() {
        let bad_versions = ferrol(json!({"versions": ["one"]}));
        assert!(StackSpec::validate(&bad_versions).is_err());
        assert_eq!(
            StackKey::of(&bad_versions).unwrap().tag_prefix(),
            "docker-ferrol-1-27-"
        );
        assert!(StackKey::of(&ferrol(json!({"kubernetesVersion": "127"}))).is_err());
    }

    #[test]
    fn a_stack_spec_owns_the_releases_of_its_stack_and_channel() {
        let stable = StackSpec::parse(&ferrol(json!({}))).unwrap();
        let custom = StackSpec::parse(&ferrol(json!({"channel": "custom"}))).unwrap();
        for (release, owned_by_stable, owned_by_custom) in [
            ("docker-ferrol-1-27-v1", true, false),
            ("docker-ferrol-1-27-v12", true, false),
            // Hash builds, in dash (tag) and dot (ClusterClass) form, are custom releases.
            ("docker-ferrol-1-27-v0-sha-hipstsw", false, true),
            ("docker-ferrol-1-27-v0-sha.hipstsw", false, true),
            ("docker-ferrol-1-27-v1-alpha.0", false, true),
            ("docker-ferrol-1-28-v1", false, false),
            ("docker-scs-1-27-v1", false, false),
            ("openstack-ferrol-1-27-v1", false, false),
            ("docker-ferrol-2-27-v1", false, false),
        ] {
            let release = id(release);
            assert_eq!(stable.owns(&release), owned_by_stable, "stable owns {release}");
            assert_eq!(custom.owns(&release), owned_by_custom, "custom owns {release}");
            // `contains` is the channel-blind part: any version of the stack and minor.
            assert_eq!(
                stable.stack.contains(&release),
                owned_by_stable || owned_by_custom,
                "{release}"
            );
        }
    }

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn pins_name_listed_versions_and_manifest_digests() {
        let pinned = ferrol(json!({"versions": ["v1", "v2"], "versionDigests": {"v2": DIGEST}}));
        assert!(version_digest_errors(&pinned).is_empty());
        let spec = StackSpec::validate(&pinned).expect("pins do not change what the spec means");
        let release = |v: &str| spec.release(&Version::parse_dot(v).unwrap()).unwrap();
        assert_eq!(spec.pin(&release("v2")), Some(DIGEST));
        assert_eq!(spec.pin(&release("v1")), None);

        let custom = ferrol(json!({"channel": "custom", "versions": ["v0-sha.hipstsw"],
                                   "versionDigests": {"v0-sha.hipstsw": DIGEST}}));
        assert!(version_digest_errors(&custom).is_empty());

        let upper = DIGEST.to_uppercase().replace("SHA256", "sha256");
        let short = &DIGEST[..DIGEST.len() - 1];
        let sha512 = format!("sha512:{}", &DIGEST["sha256:".len()..]);
        for (pins, expected_fields, expected_text) in [
            (
                json!({"v3": DIGEST}),
                vec!["spec.versionDigests[v3]"],
                "version \"v3\" is not in spec.versions",
            ),
            (
                // The dash form of a listed version is not how it is written there.
                json!({"v0-sha-hipstsw": DIGEST}),
                vec!["spec.versionDigests[v0-sha-hipstsw]"],
                "is not in spec.versions",
            ),
            (
                json!({"v2": upper}),
                vec!["spec.versionDigests[v2]"],
                "is not a manifest digest",
            ),
            (
                json!({"v2": short}),
                vec!["spec.versionDigests[v2]"],
                "is not a manifest digest",
            ),
            (
                json!({"v2": sha512}),
                vec!["spec.versionDigests[v2]"],
                "is not a manifest digest",
            ),
            (
                json!({"v1": "", "v9": "latest"}),
                vec![
                    "spec.versionDigests[v1]",
                    "spec.versionDigests[v9]",
                    "spec.versionDigests[v9]",
                ],
                "\"\" is not a manifest digest",
            ),
        ] {
            let stack = ferrol(json!({"versions": ["v1", "v2"], "versionDigests": pins}));
            let errors = version_digest_errors(&stack);
            assert_eq!(fields(&errors), expected_fields, "{pins}");
            assert!(
                errors[0].to_string().starts_with(expected_fields[0]),
                "{errors:?}"
            );
            assert!(errors[0].message.contains(expected_text), "{pins}: {errors:?}");
        }
    }

    #[test]
    fn pins_serialise_only_when_set() {
        let unpinned = ferrol(json!({"versions": ["v1"]}));
        let spec = serde_json::to_value(&unpinned.spec).unwrap();
        assert!(spec.get("versionDigests").is_none(), "{spec}");
        let pinned = ferrol(json!({"versions": ["v1"], "versionDigests": {"v1": DIGEST}}));
        let spec = serde_json::to_value(&pinned.spec).unwrap();
        assert_eq!(spec["versionDigests"], json!({"v1": DIGEST}));
    }

    /// `spec.kubernetesVersion` as written -> the minor every release name uses.
    #[rstest]
    #[case::minor("1.27", "docker-ferrol-1-27-")]
    #[case::generator_writes_a_patch("1.34.6", "docker-ferrol-1-34-")]
    #[case::patch_zero("1.35.0", "docker-ferrol-1-35-")]
    fn kubernetes_version_names_a_minor(#[case] kubernetes: &str, #[case] prefix: &str) {
        let spec = StackSpec::parse(&ferrol(
            json!({"kubernetesVersion": kubernetes, "versions": ["v1"]}),
        ))
        .unwrap();
        assert_eq!(spec.stack.tag_prefix(), prefix);
        assert_eq!(
            spec.release(&spec.versions[0]).unwrap().tag(),
            format!("{prefix}v1")
        );
        let minor = &prefix["docker-ferrol-".len()..prefix.len() - 1];
        assert!(
            spec.owns(&id(&format!("docker-ferrol-{minor}-v7"))),
            "{kubernetes} owns releases of {minor}"
        );
    }

    #[rstest]
    #[case("1.34.x")]
    #[case("1.34.")]
    #[case("1.34.6.1")]
    #[case("v1.34.6")]
    fn kubernetes_versions_refused(#[case] kubernetes: &str) {
        let errors = StackSpec::validate(&ferrol(json!({"kubernetesVersion": kubernetes}))).unwrap_err();
        assert_eq!(fields(&errors), ["spec.kubernetesVersion"], "{kubernetes}");
    }

    /// Stack names as the stacks publish them since 2026, with dashes.
    #[rstest]
    #[case::plain("docker", "scs", "1.35", "docker-scs-1-35-v1")]
    #[case::dashed(
        "openstack",
        "hosted-control-plane",
        "1.34.6",
        "openstack-hosted-control-plane-1-34-v1"
    )]
    #[case::digits("openstack", "scs2", "1.34", "openstack-scs2-1-34-v1")]
    fn stack_names_with_dashes(
        #[case] provider: &str,
        #[case] name: &str,
        #[case] kubernetes: &str,
        #[case] tag: &str,
    ) {
        let spec = StackSpec::parse(&stack(json!({"provider": provider, "name": name,
            "kubernetesVersion": kubernetes, "noProvider": true, "versions": ["v1"]})))
        .unwrap();
        let release = spec.release(&spec.versions[0]).unwrap();
        assert_eq!(release.tag(), tag);
        assert_eq!(id(tag), release, "the tag reads back as the spec's release");
        assert!(spec.owns(&id(tag)));
        assert!(
            !spec.owns(&id(&format!(
                "{provider}-other-{}",
                &tag[provider.len() + 1 + name.len() + 1..]
            ))),
            "another stack of the provider is not owned"
        );
    }

    #[rstest]
    #[case::double_dash("hosted--plane")]
    #[case::trailing_dash("scs-")]
    #[case::leading_dash("-scs")]
    #[case::capitals("Hosted-plane")]
    fn stack_names_refused(#[case] name: &str) {
        let errors = StackSpec::validate(&ferrol(json!({"name": name}))).unwrap_err();
        assert_eq!(fields(&errors), ["spec.name"], "{name}");
    }

    /// Which versions a spec's channel accepts in `spec.versions`.
    #[rstest]
    #[case::stable_stable("stable", "v1", true)]
    #[case::stable_ttl("stable", "v0-ttl.1744718400", false)]
    #[case::custom_hash("custom", "v0-sha.hipstsw", true)]
    #[case::custom_git("custom", "v0-git.a97eb17", true)]
    // What `generate-clusterstack-ttl.sh` writes: `channel: custom` with a ttl build. The Go operator takes it.
    #[case::custom_ttl("custom", "v0-ttl.1744718400", true)]
    #[case::ttl_ttl("ttl", "v0-ttl.1744718400", true)]
    #[case::ttl_hash("ttl", "v0-sha.hipstsw", false)]
    #[case::ttl_stable("ttl", "v1", false)]
    #[case::ttl_without_timestamp("ttl", "v0-ttl.latest", false)]
    fn versions_a_channel_accepts(#[case] channel: &str, #[case] version: &str, #[case] accepted: bool) {
        let result = StackSpec::validate(&ferrol(json!({"channel": channel, "versions": [version]})));
        assert_eq!(result.is_ok(), accepted, "{channel} {version}: {result:?}");
        if let Err(errors) = result {
            assert_eq!(fields(&errors), ["spec.versions"]);
        }
    }

    /// Which releases a ClusterStack of each channel owns (lists, keeps, counts users of).
    #[rstest]
    #[case::stable_release("docker-ferrol-1-27-v3", true, false, false)]
    #[case::hash_build("docker-ferrol-1-27-v0-sha-hipstsw", false, true, false)]
    #[case::ttl_tag("docker-ferrol-1-27-v0-ttl-1744718400", false, true, true)]
    #[case::ttl_class("docker-ferrol-1-27-v0-ttl.1744718400", false, true, true)]
    #[case::ttl_of_another_minor("docker-ferrol-1-28-v0-ttl-1744718400", false, false, false)]
    fn ownership_by_channel(
        #[case] release: &str,
        #[case] stable: bool,
        #[case] custom: bool,
        #[case] ttl: bool,
    ) {
        for (channel, owned) in [("stable", stable), ("custom", custom), ("ttl", ttl)] {
            let spec = StackSpec::parse(&ferrol(json!({"channel": channel}))).unwrap();
            assert_eq!(spec.channel.as_str(), channel);
            assert_eq!(spec.owns(&id(release)), owned, "{channel} owns {release}");
        }
    }
}
