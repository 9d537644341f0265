//! Provider mode: the `<X>ClusterStackRelease` object of each release, made from the ClusterStack's
//! `spec.providerRef` template (`<X>ClusterStackReleaseTemplate`, `spec.template`).

use std::collections::BTreeMap;

use cso_api::{ClusterStack, common::ObjectReference};
use cso_apply::discovery::{ApiRef, GetObjectError};
use kube::{
    Api, ResourceExt,
    api::{DynamicObject, PostParams},
    core::GroupVersionKind,
};
use serde_json::{Map, Value};

use crate::Context;

/// What has to happen to the provider object.
#[derive(Clone, Debug, PartialEq)]
pub enum ProviderChange {
    Create(Value),
    Update(Value),
    Unchanged,
}

/// Why the provider object could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// `ProviderTemplateNotFound`
    #[error("provider template could not be found - check provider reference of cluster stack: {0}")]
    TemplateNotFound(String),
    /// `FailedToCreateOrUpdate`
    #[error("{0}")]
    Failed(String),
}

/// The kind of the provider object: the template's kind without `Template`.
pub fn provider_kind(template_kind: &str) -> &str {
    template_kind.strip_suffix("Template").unwrap_or(template_kind)
}

/// Builds the provider object named `name` in `namespace` from `template` (the template object), given the
/// object that exists (if any) and the ClusterStack's labels and annotations, which are merged in.
pub fn build_provider_object(
    template: &Value,
    existing: Option<&Value>,
    name: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Result<ProviderChange, String> {
    let api_version = template["apiVersion"].as_str().unwrap_or_default();
    let kind = provider_kind(template["kind"].as_str().unwrap_or_default());
    let inner = template
        .pointer("/spec/template")
        .filter(|t| t.is_object())
        .ok_or_else(|| {
            format!(
                "missing spec.template in the provider template {}",
                template_name(template)
            )
        })?;
    let spec = inner.get("spec").ok_or_else(|| {
        format!(
            "missing spec.template.spec in the provider template {}",
            template_name(template)
        )
    })?;

    let mut object = match existing {
        Some(existing) => existing.clone(),
        None => {
            let mut fresh = Map::new();
            fresh.insert("apiVersion".into(), Value::String(api_version.to_owned()));
            fresh.insert("kind".into(), Value::String(kind.to_owned()));
            let mut metadata = Map::new();
            if let Some(Value::Object(template_metadata)) = inner.get("metadata") {
                for key in ["labels", "annotations"] {
                    if let Some(value) = template_metadata.get(key) {
                        metadata.insert(key.into(), value.clone());
                    }
                }
            }
            metadata.insert("name".into(), Value::String(name.to_owned()));
            metadata.insert("namespace".into(), Value::String(namespace.to_owned()));
            fresh.insert("metadata".into(), Value::Object(metadata));
            Value::Object(fresh)
        }
    };
    let before = object.clone();
    object["spec"] = spec.clone();
    for (key, values) in [("labels", labels), ("annotations", annotations)] {
        if values.is_empty() {
            continue;
        }
        let metadata = object["metadata"]
            .as_object_mut()
            .ok_or_else(|| format!("the provider object {name} has no metadata"))?;
        let map = metadata.entry(key).or_insert_with(|| Value::Object(Map::new()));
        if !map.is_object() {
            *map = Value::Object(Map::new());
        }
        if let Some(map) = map.as_object_mut() {
            for (k, v) in values {
                map.insert(k.clone(), Value::String(v.clone()));
            }
        }
    }
    Ok(match existing {
        None => ProviderChange::Create(object),
        Some(_) if object != before => ProviderChange::Update(object),
        Some(_) => ProviderChange::Unchanged,
    })
}

fn template_name(template: &Value) -> &str {
    template
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Creates or updates the provider object of release `name`; returns its reference and what changed.
pub(crate) async fn sync_provider_object(
    ctx: &Context,
    stack: &ClusterStack,
    name: &str,
) -> Result<(ObjectReference, ProviderChange), ProviderError> {
    let namespace = stack.namespace().unwrap_or_default();
    let template_ref = stack
        .spec
        .provider_ref
        .as_ref()
        .ok_or_else(|| ProviderError::TemplateNotFound("spec.providerRef is not set".into()))?;
    let api_version = template_ref.api_version.clone().unwrap_or_default();
    let template_kind = template_ref.kind.clone().unwrap_or_default();
    let template_name = template_ref.name.clone().unwrap_or_default();
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g.to_owned(), v.to_owned()),
        None => (String::new(), api_version.clone()),
    };
    let described = format!("{api_version} {template_kind} {namespace}/{template_name}");

    let template = match ctx
        .discovery
        .get_object(
            ApiRef::Version(&api_version),
            &template_kind,
            Some(&namespace),
            &template_name,
        )
        .await
    {
        Ok(Some(template)) => template,
        Ok(None) => return Err(ProviderError::TemplateNotFound(described)),
        Err(GetObjectError::Discovery(e)) => {
            return Err(ProviderError::TemplateNotFound(format!("{described}: {e}")));
        }
        Err(e) => return Err(ProviderError::Failed(format!("failed to read {described}: {e}"))),
    };
    let template = serde_json::to_value(&template).map_err(|e| ProviderError::Failed(e.to_string()))?;

    let object_gvk = GroupVersionKind::gvk(&group, &version, provider_kind(&template_kind));
    let object_kind = ctx
        .discovery
        .resolve(&object_gvk)
        .await
        .map_err(|e| ProviderError::Failed(e.to_string()))?;
    let objects: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &namespace, &object_kind.resource);
    let existing = ctx
        .discovery
        .get_object(
            ApiRef::Version(&api_version),
            provider_kind(&template_kind),
            Some(&namespace),
            name,
        )
        .await
        .map_err(|e| ProviderError::Failed(format!("failed to read the provider object {name}: {e}")))?
        .map(|o| serde_json::to_value(&o))
        .transpose()
        .map_err(|e| ProviderError::Failed(e.to_string()))?;
    let labels = stack.labels().clone();
    let annotations: BTreeMap<String, String> = stack
        .annotations()
        .iter()
        .filter(|(k, _)| k.as_str() != "kubectl.kubernetes.io/last-applied-configuration")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let change = build_provider_object(
        &template,
        existing.as_ref(),
        name,
        &namespace,
        &labels,
        &annotations,
    )
    .map_err(ProviderError::Failed)?;
    let written = match &change {
        ProviderChange::Create(object) | ProviderChange::Update(object) => {
            let object: DynamicObject =
                serde_json::from_value(object.clone()).map_err(|e| ProviderError::Failed(e.to_string()))?;
            let result = if matches!(change, ProviderChange::Create(_)) {
                objects.create(&PostParams::default(), &object).await
            } else {
                objects.replace(name, &PostParams::default(), &object).await
            };
            result.map_err(|e| {
                ProviderError::Failed(format!("failed to write the provider object {name}: {e}"))
            })?
        }
        ProviderChange::Unchanged => match &existing {
            Some(existing) => {
                serde_json::from_value(existing.clone()).map_err(|e| ProviderError::Failed(e.to_string()))?
            }
            None => return Err(ProviderError::Failed("provider object vanished".into())),
        },
    };
    let reference = ObjectReference {
        api_version: Some(api_version),
        kind: Some(provider_kind(&template_kind).to_owned()),
        name: Some(name.to_owned()),
        namespace: Some(namespace),
        uid: written.metadata.uid.clone(),
        ..Default::default()
    };
    Ok((reference, change))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn template() -> Value {
        json!({
            "apiVersion": "infrastructure.clusterstack.x-k8s.io/v1alpha1",
            "kind": "TestInfrastructureProviderClusterStackReleaseTemplate",
            "metadata": {"name": "provider-test1", "namespace": "cluster"},
            "spec": {"template": {
                "metadata": {"labels": {"from": "template"}},
                "spec": {"nodeImages": ["controlplaneamd64provider", "workeramd64provider"]},
            }},
        })
    }

    #[test]
    fn creates_from_the_template_with_the_stacks_labels() {
        let labels = BTreeMap::from([("team".to_owned(), "a".to_owned())]);
        let ProviderChange::Create(object) = build_provider_object(
            &template(),
            None,
            "docker-ferrol-1-27-v1",
            "cluster",
            &labels,
            &BTreeMap::new(),
        )
        .unwrap() else {
            panic!("expected a create");
        };
        assert_eq!(object["kind"], "TestInfrastructureProviderClusterStackRelease");
        assert_eq!(
            object["apiVersion"],
            "infrastructure.clusterstack.x-k8s.io/v1alpha1"
        );
        assert_eq!(object["metadata"]["name"], "docker-ferrol-1-27-v1");
        assert_eq!(object["metadata"]["namespace"], "cluster");
        assert_eq!(
            object["metadata"]["labels"],
            json!({"from": "template", "team": "a"})
        );
        assert_eq!(object["spec"]["nodeImages"][1], "workeramd64provider");
    }

    #[test]
    fn updates_spec_and_labels_and_leaves_equal_objects_alone() {
        let labels = BTreeMap::from([("team".to_owned(), "a".to_owned())]);
        let existing = json!({
            "apiVersion": "infrastructure.clusterstack.x-k8s.io/v1alpha1",
            "kind": "TestInfrastructureProviderClusterStackRelease",
            "metadata": {"name": "r", "namespace": "cluster", "resourceVersion": "7", "labels": {"team": "a"}},
            "spec": {"nodeImages": ["old"]},
            "status": {"ready": true},
        });
        let ProviderChange::Update(updated) = build_provider_object(
            &template(),
            Some(&existing),
            "r",
            "cluster",
            &labels,
            &BTreeMap::new(),
        )
        .unwrap() else {
            panic!("expected an update");
        };
        assert_eq!(
            updated["metadata"]["resourceVersion"], "7",
            "an update is guarded by the resourceVersion"
        );
        assert_eq!(updated["spec"]["nodeImages"][0], "controlplaneamd64provider");

        // A label added to the ClusterStack alone is persisted too (the Go operator drops it).
        let more = BTreeMap::from([
            ("team".to_owned(), "a".to_owned()),
            ("env".to_owned(), "prod".to_owned()),
        ]);
        assert!(matches!(
            build_provider_object(
                &template(),
                Some(&updated),
                "r",
                "cluster",
                &more,
                &BTreeMap::new()
            )
            .unwrap(),
            ProviderChange::Update(_)
        ));
        assert_eq!(
            build_provider_object(
                &template(),
                Some(&updated),
                "r",
                "cluster",
                &labels,
                &BTreeMap::new()
            )
            .unwrap(),
            ProviderChange::Unchanged
        );
    }

    #[test]
    fn a_template_without_spec_template_is_an_error() {
        let broken =
            json!({"apiVersion": "x/v1", "kind": "XTemplate", "metadata": {"name": "t"}, "spec": {}});
        let error =
            build_provider_object(&broken, None, "r", "ns", &BTreeMap::new(), &BTreeMap::new()).unwrap_err();
        assert!(error.contains("missing spec.template"), "{error}");
    }
}
