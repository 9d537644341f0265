//! The data values templates see: `{Cluster, ControlPlane, InfraCluster}`, the full objects (metadata, spec,
//! status) read from the management cluster. The control plane and infrastructure objects are the ones the
//! Cluster references, looked up in the Cluster's namespace, as the Go operator does.
//!
//! Templates see the Cluster whole, not the operator's typed view of it (which keeps only the few fields the
//! operator itself needs), because stacks template any field (`spec.clusterNetwork`, `metadata.labels`,
//! `spec.topology.variables`, `status`, ...): the object the typed view was read from
//! ([`Cluster::object`]; for the controllers, the watch cache's copy, so no read per render), or, for a
//! Cluster built in code, a fresh read.

use cso_api::capi::{CAPI_GROUP, CapiReference, Cluster, remove_managed_fields};
use kube::api::DynamicObject;
use serde_json::{Map, Value};

use crate::{
    ClusterDiscovery,
    discovery::{ApiRef, DiscoveryError, GetObjectError},
};

/// Why the template data could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TemplateDataError {
    #[error("{what} ({kind} {namespace}/{name}) was not found")]
    Missing {
        what: &'static str,
        kind: String,
        namespace: String,
        name: String,
    },
    #[error("failed to read {what}: {message}")]
    Read { what: &'static str, message: String },
}

/// Reads the Cluster, whole, and the objects it references, and builds the template data.
///
/// The Cluster is `cluster`'s whole object, in the version it was read in (the operator reads Clusters in
/// `v1beta2` on Cluster API 1.11 and later, `v1beta1` before); a Cluster without one (built in code) is read
/// from the API server in the version the server prefers. Its `controlPlaneRef` and `infrastructureRef`
/// (either reference shape) are taken from that object; a reference the Cluster does not have leaves its key
/// out, as in the Go operator.
pub async fn template_data(
    discovery: &ClusterDiscovery,
    cluster: &Cluster,
) -> Result<Value, TemplateDataError> {
    let namespace = cluster.metadata.namespace.clone().unwrap_or_default();
    let name = cluster.metadata.name.clone().unwrap_or_default();
    let full = match &cluster.object {
        Some(object) => object.value(),
        None => {
            read(
                discovery,
                "the Cluster",
                ApiRef::Group(CAPI_GROUP),
                "Cluster",
                &namespace,
                &name,
            )
            .await?
        }
    };
    let mut data = Map::new();
    for (key, what, field) in [
        ("ControlPlane", "the Cluster's control plane", "controlPlaneRef"),
        (
            "InfraCluster",
            "the Cluster's infrastructure cluster",
            "infrastructureRef",
        ),
    ] {
        let Some(reference) = full.get("spec").and_then(|spec| spec.get(field)) else {
            continue;
        };
        if reference.is_null() {
            continue;
        }
        let reference: CapiReference =
            serde_json::from_value(reference.clone()).map_err(|e| TemplateDataError::Read {
                what,
                message: format!("spec.{field} of the Cluster is not a reference: {e}"),
            })?;
        let api = match (&reference.api_version, &reference.api_group) {
            (Some(api_version), _) if !api_version.is_empty() => ApiRef::Version(api_version),
            (_, Some(group)) if !group.is_empty() => ApiRef::Group(group),
            _ => {
                return Err(TemplateDataError::Read {
                    what,
                    message: format!(
                        "spec.{field} ({} {}) names neither an apiVersion nor an apiGroup",
                        reference.kind, reference.name
                    ),
                });
            }
        };
        // Always the Cluster's namespace, whatever the reference says: the Go operator does the same, and
        // Cluster API does not allow references across namespaces.
        let object = read(discovery, what, api, &reference.kind, &namespace, &reference.name).await?;
        data.insert(key.into(), object);
    }
    data.insert("Cluster".into(), full);
    Ok(Value::Object(data))
}

/// One object, as template data; a missing one is [`TemplateDataError::Missing`].
async fn read(
    discovery: &ClusterDiscovery,
    what: &'static str,
    api: ApiRef<'_>,
    kind: &str,
    namespace: &str,
    name: &str,
) -> Result<Value, TemplateDataError> {
    let read_error = |message: String| TemplateDataError::Read { what, message };
    match discovery.get_object(api, kind, Some(namespace), name).await {
        Ok(Some(object)) => to_template_value(object).map_err(|e| read_error(e.to_string())),
        Ok(None) => Err(TemplateDataError::Missing {
            what,
            kind: kind.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }),
        Err(GetObjectError::Discovery(DiscoveryError::UnknownKind(_))) => {
            let api = match api {
                ApiRef::Version(version) | ApiRef::Group(version) => version,
            };
            Err(read_error(format!("the cluster does not serve {kind} of {api}")))
        }
        Err(other) => Err(read_error(other.to_string())),
    }
}

/// The object as templates see it: `apiVersion`, `kind`, `metadata`, `spec`, `status`, ... with the keys the
/// API server uses, without `metadata.managedFields` ([`remove_managed_fields`]; the Go operator's
/// unstructured object has it, but no stack templates it, and every template run would carry it).
fn to_template_value(object: DynamicObject) -> Result<Value, serde_json::Error> {
    let mut value = serde_json::to_value(object)?;
    remove_managed_fields(&mut value);
    Ok(value)
}
