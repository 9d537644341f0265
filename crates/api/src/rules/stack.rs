//! What a ClusterStack's spec means: the stack it follows ([`StackKey`]: provider, name, Kubernetes
//! minor), its channel and versions ([`StackSpec`]), and the one ownership rule (which releases are the
//! ClusterStack's).
//!
//! The admission webhook refuses a spec these rules refuse, and the controller reports the same errors in its
//! conditions, so both say the same about one object. Errors name the field they are about.

use std::fmt;

use crate::{
    ClusterStack, ReleaseId,
    version::{Channel, KubernetesVersion, Version, is_name_part},
};

/// One rejected field of an object, e.g. `spec.versions: invalid version "3": ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// The field's path, e.g. `spec.versions`.
    pub field: &'static str,
    pub message: String,
}

impl FieldError {
    pub fn new(field: &'static str, message: impl Into<String>) -> Self {
        FieldError {
            field,
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
        // Provider and name are segments of every release name: dashes or capitals would make names that
        // cannot be told apart or cannot be Kubernetes object names.
        for (field, value) in [("spec.provider", &spec.provider), ("spec.name", &spec.name)] {
            if !is_name_part(value) {
                errors.push(FieldError::new(
                    field,
                    format!("{value:?} must be lowercase letters and digits without dashes"),
                ));
            }
        }
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

    /// The ownership rule: a ClusterStack owns the releases of its stack on its channel. Hash builds
    /// (`v0-sha.hipstsw`) are on the `custom` channel, so a `custom` ClusterStack owns them.
    pub(crate) fn owns(&self, channel: Channel, id: &ReleaseId) -> bool {
        self.contains(id) && id.channel() == channel
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
}

impl StackSpec {
    /// Checks `stack`'s spec: provider and name are release-name segments, `kubernetesVersion` is a minor
    /// such as `1.27`, every version parses (dot form) and belongs to the channel. Every error is returned,
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
                Ok(version) if version.channel() != spec.channel => errors.push(FieldError::new(
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

    /// Whether `id` is one of this ClusterStack's releases: same provider, name and Kubernetes minor, and the
    /// same channel (any version).
    pub fn owns(&self, id: &ReleaseId) -> bool {
        self.stack.owns(self.channel, id)
    }

    /// The release of this stack with `version`.
    pub fn release(&self, version: &Version) -> Option<ReleaseId> {
        let stack = &self.stack;
        ReleaseId::new(&stack.provider, &stack.name, stack.kubernetes, version.clone()).ok()
    }
}

#[cfg(test)]
mod tests {
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
        errors.iter().map(|e| e.field).collect()
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
}
