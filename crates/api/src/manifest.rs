//! One rendered object, as the apply engine takes it: the whole object plus the template it came from.
//! Parsing rendered YAML into these is the renderer's job (`cso_render::parse_manifests`); applying them is
//! the engine's (`cso_apply`); the type lives here so that neither depends on the other.

use serde_json::Value;

/// One rendered object.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    /// The whole object.
    pub object: Value,
    /// The template it came from (Helm's `# Source:` comment), when known.
    pub source: Option<String>,
}

impl Manifest {
    pub fn api_version(&self) -> &str {
        self.object["apiVersion"].as_str().unwrap_or_default()
    }
    pub fn kind(&self) -> &str {
        self.object["kind"].as_str().unwrap_or_default()
    }
    pub fn name(&self) -> &str {
        self.object["metadata"]["name"].as_str().unwrap_or_default()
    }
    /// The namespace the object itself names, if any.
    pub fn namespace(&self) -> Option<&str> {
        self.object["metadata"]["namespace"]
            .as_str()
            .filter(|ns| !ns.is_empty())
    }
    /// `(group, version)` from `apiVersion`.
    pub fn group_version(&self) -> (&str, &str) {
        match self.api_version().split_once('/') {
            Some((group, version)) => (group, version),
            None => ("", self.api_version()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_identity_fields_and_splits_the_api_version() {
        let manifest = Manifest {
            object: serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": ""}}),
            source: None,
        };
        assert_eq!((manifest.kind(), manifest.name()), ("Deployment", "web"));
        assert_eq!(manifest.namespace(), None, "an empty namespace is none");
        assert_eq!(manifest.group_version(), ("apps", "v1"));
    }
}
