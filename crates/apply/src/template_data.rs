//! The data values templates see: `{Cluster, ControlPlane, InfraCluster}`, the full objects (metadata, spec,
//! status) read from the management cluster. The control plane and infrastructure objects are the ones the
//! Cluster references, looked up in the Cluster's namespace, as the Go operator does.

use cso_api::capi::{CapiReference, Cluster};
use kube::{Api, api::DynamicObject, core::GroupVersionKind};
use serde_json::{Map, Value};

use crate::{ClusterDiscovery, discovery::DiscoveryError};

/// Why the template data could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TemplateDataError {
    #[error("{what} {kind} {namespace}/{name} referenced by the Cluster was not found")]
    Missing {
        what: &'static str,
        kind: String,
        namespace: String,
        name: String,
    },
    #[error("failed to read {what} of the Cluster: {message}")]
    Read { what: &'static str, message: String },
}

/// Reads the Cluster's references and builds the template data.
pub async fn template_data(
    discovery: &ClusterDiscovery,
    cluster: &Cluster,
) -> Result<Value, TemplateDataError> {
    let namespace = cluster.metadata.namespace.clone().unwrap_or_default();
    let mut data = Map::new();
    let cluster_value = serde_json::to_value(cluster).map_err(|e| TemplateDataError::Read {
        what: "the Cluster",
        message: e.to_string(),
    })?;
    data.insert("Cluster".into(), cluster_value);
    for (key, what, reference) in [
        ("ControlPlane", "control plane", &cluster.spec.control_plane_ref),
        (
            "InfraCluster",
            "infrastructure cluster",
            &cluster.spec.infrastructure_ref,
        ),
    ] {
        if let Some(reference) = reference {
            data.insert(key.into(), fetch(discovery, what, reference, &namespace).await?);
        }
    }
    Ok(Value::Object(data))
}

async fn fetch(
    discovery: &ClusterDiscovery,
    what: &'static str,
    reference: &CapiReference,
    namespace: &str,
) -> Result<Value, TemplateDataError> {
    let read_error = |message: String| TemplateDataError::Read { what, message };
    let gvk = match (&reference.api_version, &reference.api_group) {
        (Some(api_version), _) => {
            let (group, version) = api_version.split_once('/').unwrap_or(("", api_version.as_str()));
            GroupVersionKind::gvk(group, version, &reference.kind)
        }
        // `v1beta2` references name only the group: take the version the cluster prefers.
        (None, Some(group)) => {
            let preferred = kube::discovery::group(discovery.client(), group)
                .await
                .map_err(|e| read_error(e.to_string()))?;
            let version = preferred.preferred_version_or_latest().to_owned();
            GroupVersionKind::gvk(group, &version, &reference.kind)
        }
        (None, None) => {
            return Err(read_error(format!(
                "the reference to {} {} names no API group",
                reference.kind, reference.name
            )));
        }
    };
    let kind = discovery.resolve(&gvk).await.map_err(|e| match e {
        DiscoveryError::UnknownKind(_) => {
            read_error(format!("the cluster does not serve {}", reference.kind))
        }
        other => read_error(other.to_string()),
    })?;
    let api: Api<DynamicObject> = Api::namespaced_with(discovery.client().clone(), namespace, &kind.resource);
    match api.get_opt(&reference.name).await {
        Ok(Some(object)) => serde_json::to_value(object).map_err(|e| read_error(e.to_string())),
        Ok(None) => Err(TemplateDataError::Missing {
            what,
            kind: reference.kind.clone(),
            namespace: namespace.to_owned(),
            name: reference.name.clone(),
        }),
        Err(e) => Err(read_error(e.to_string())),
    }
}
