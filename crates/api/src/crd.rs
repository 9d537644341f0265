//! The operator's CustomResourceDefinitions, generated from the Rust types, and their YAML form.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps,
};
use kube::CustomResourceExt;

use crate::{ClusterAddon, ClusterStack, ClusterStackRelease, ClusterStackRollout};

/// All four CRDs, in a stable order (the Go operator's three, then the rollouts).
pub fn all() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        ClusterAddon::crd(),
        ClusterStack::crd(),
        ClusterStackRelease::crd(),
        ClusterStackRollout::crd(),
    ];
    for crd in &mut crds {
        for version in &mut crd.spec.versions {
            if let Some(root) = version
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
            {
                shape_root_like_the_go_operator(root);
            }
        }
    }
    crds
}

/// The Go operator's CRDs describe `apiVersion`, `kind` and `metadata` at the root and do not require `spec`
/// there; an object the Go operator accepts must be accepted here too.
fn shape_root_like_the_go_operator(root: &mut JSONSchemaProps) {
    let typed = |type_: &str, description: Option<&str>| JSONSchemaProps {
        type_: Some(type_.to_owned()),
        description: description.map(str::to_owned),
        ..Default::default()
    };
    let properties = root.properties.get_or_insert_with(Default::default);
    properties.insert(
        "apiVersion".into(),
        typed(
            "string",
            Some("The versioned schema of this representation of an object."),
        ),
    );
    properties.insert(
        "kind".into(),
        typed("string", Some("The REST resource this object represents.")),
    );
    // The API server allows nothing but the type on `metadata`.
    properties.insert("metadata".into(), typed("object", None));
    root.required = None;
}

/// The schema of a field that holds any JSON value (a ClusterClass variable's value): kept as it is.
pub fn any_value(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "x-kubernetes-preserve-unknown-fields": true })
}

/// The CRDs as one multi-document YAML stream (what `cso crds` prints and `config/crd/` holds).
pub fn to_yaml() -> Result<String, serde_saphyr::ser::Error> {
    let mut out = String::new();
    for crd in all() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd)?);
    }
    Ok(out)
}
