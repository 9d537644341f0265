//! What an apply would do, without doing it: each rendered object prepared exactly as the engine prepares
//! it (namespace, labels), sent to the server as a server-side-apply dry run, and compared with the live
//! object; plus the objects the previous inventory has and the render does not, each checked as the prune
//! would check it (one `prune_target` decision serves both: deleted only when it exists and carries the
//! operator's label, never a Namespace or a CustomResourceDefinition, and nothing when the apply would be
//! held for pruning most of what was applied).
//! This is what `cso render --diff` shows.

use std::collections::{BTreeMap, BTreeSet};

use cso_api::{common::Resource, manifest::Manifest};
use kube::api::{Patch, PatchParams};
use serde_json::Value;

use crate::{
    ApplyEngine,
    engine::{PruneTarget, Removal, TakeOver, api_error},
    inventory::{ObjectKey, shrink_held, to_prune},
};

/// What would happen to one object.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// Does not exist: would be created as `after`.
    Create { after: Value },
    /// Exists and would change from `before` to `after` (both without server-managed fields).
    Update { before: Value, after: Value },
    /// Exists and would not change.
    Unchanged,
    /// In the previous inventory, not in the render, and carrying the operator's label: would be deleted.
    Prune,
    /// In the previous inventory, not in the render, but not to be deleted (no operator's label, a shared
    /// Namespace, a Namespace or CRD, which a prune never deletes, or an apply that would be held): would be
    /// left alone, for this reason.
    Keep(String),
    /// In the previous inventory, not in the render, and already gone: nothing to do.
    Absent,
    /// The server refused the dry run, or the kind is not served (yet).
    Refused(String),
}

/// One object of a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct PlannedChange {
    pub key: ObjectKey,
    pub change: Change,
}

impl ApplyEngine {
    /// Plans applying `manifests` (as [`ApplyEngine::apply`] would, with the same arguments) by server-side
    /// dry run. Reads only; changes nothing.
    pub async fn plan(
        &self,
        manifests: &[Manifest],
        default_namespace: &str,
        labels: &BTreeMap<String, String>,
        previous: &[Resource],
    ) -> Vec<PlannedChange> {
        let mut planned = Vec::new();
        let mut current = BTreeSet::new();
        // Objects in a namespace the same render creates cannot be dry-run before it exists: the server
        // answers 404 for the namespace. They would be created with it, so that is what the plan says.
        let created_namespaces: BTreeSet<&str> = manifests
            .iter()
            .filter(|m| m.kind() == "Namespace" && m.group_version().0.is_empty())
            .map(|m| m.name())
            .collect();
        let previous = self.normalised(previous, default_namespace).await;
        let held = shrink_held(&previous, manifests.len());
        for manifest in manifests {
            let item = self.prepare(manifest, default_namespace, labels).await;
            current.insert(item.key.clone());
            let change = match (&item.kind, &item.error) {
                // The apply would touch nothing.
                _ if held.is_some() => Change::Keep(held.clone().unwrap_or_default()),
                (Some(kind), None) => {
                    let api = self.api(kind, &item.key.namespace);
                    let params = PatchParams::apply(&self.field_manager).force().dry_run();
                    match api.get_opt(&item.key.name).await {
                        Err(e) => Change::Refused(api_error(&e)),
                        Ok(Some(live)) if self.would_leave_unwritten(&live, &item) => Change::Unchanged,
                        Ok(live) => match api
                            .patch(&item.key.name, &params, &Patch::Apply(&item.object))
                            .await
                        {
                            Err(kube::Error::Api(status))
                                if status.code == 404
                                    && live.is_none()
                                    && created_namespaces.contains(item.key.namespace.as_str()) =>
                            {
                                compare(None, item.object.clone())
                            }
                            Err(e) => Change::Refused(api_error(&e)),
                            Ok(after) => compare(live.map(to_value), to_value(after)),
                        },
                    }
                }
                (_, error) => Change::Refused(error.clone().unwrap_or_default()),
            };
            planned.push(PlannedChange {
                key: item.key,
                change,
            });
        }
        let stale: Vec<Resource> = to_prune(&previous, &current).into_iter().cloned().collect();
        let removal = Removal::Prune(TakeOver::Check);
        planned.extend(
            self.plan_removal(&stale, default_namespace, &current, held.as_deref(), removal)
                .await,
        );
        planned
    }

    /// Plans pruning `stale`, objects an inventory has and a render planned apart does not (as
    /// [`ApplyEngine::apply`] prunes them; whether that render is held is the caller's to check with
    /// [`shrink_held`]).
    pub async fn plan_prune(&self, stale: &[Resource], default_namespace: &str) -> Vec<PlannedChange> {
        let stale = self.normalised(stale, default_namespace).await;
        let removal = Removal::Prune(TakeOver::Check);
        self.plan_removal(&stale, default_namespace, &BTreeSet::new(), None, removal)
            .await
    }

    /// Plans deleting `objects` (as [`ApplyEngine::delete`] would).
    pub async fn plan_delete(&self, objects: &[Resource], default_namespace: &str) -> Vec<PlannedChange> {
        let objects = self.normalised(objects, default_namespace).await;
        let objects: Vec<Resource> = to_prune(&objects, &BTreeSet::new())
            .into_iter()
            .cloned()
            .collect();
        self.plan_removal(
            &objects,
            default_namespace,
            &BTreeSet::new(),
            None,
            Removal::Delete,
        )
        .await
    }

    /// What removing each of `stale` (normalised) comes to; all kept when the apply is `held` (why).
    async fn plan_removal(
        &self,
        stale: &[Resource],
        default_namespace: &str,
        current: &BTreeSet<ObjectKey>,
        held: Option<&str>,
        removal: Removal,
    ) -> Vec<PlannedChange> {
        let mut planned = Vec::with_capacity(stale.len());
        for stale in stale {
            let change = match held {
                Some(why) => Change::Keep(why.to_owned()),
                None => match self
                    .prune_target(stale, default_namespace, current, removal)
                    .await
                {
                    Ok(PruneTarget::Delete(_)) => Change::Prune,
                    Ok(PruneTarget::NotOurs) => Change::Keep("not labelled by the operator".into()),
                    Ok(PruneTarget::Shared(reason)) => Change::Keep(reason),
                    Ok(PruneTarget::Spared) => {
                        Change::Keep("Namespaces and CustomResourceDefinitions are never pruned".into())
                    }
                    Ok(PruneTarget::Absent) => Change::Absent,
                    Err(error) => Change::Refused(error),
                },
            };
            planned.push(PlannedChange {
                key: ObjectKey::of(stale),
                change,
            });
        }
        planned
    }
}

fn to_value(object: kube::api::DynamicObject) -> Value {
    serde_json::to_value(object).unwrap_or_default()
}

fn compare(live: Option<Value>, after: Value) -> Change {
    let after = without_server_fields(after);
    match live.map(without_server_fields) {
        None => Change::Create { after },
        Some(before) if before == after => Change::Unchanged,
        Some(before) => Change::Update { before, after },
    }
}

/// The object without what the server maintains: status, managed fields, versions, timestamps, uid.
pub fn without_server_fields(mut object: Value) -> Value {
    if let Some(map) = object.as_object_mut() {
        map.remove("status");
    }
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in [
            "managedFields",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "uid",
            "selfLink",
        ] {
            metadata.remove(field);
        }
    }
    object
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn server_fields_do_not_count_as_changes() {
        let live = json!({"metadata": {"name": "a", "resourceVersion": "7", "generation": 2, "uid": "u",
                          "managedFields": [{}]}, "spec": {"x": 1}, "status": {"ready": true}});
        let after =
            json!({"metadata": {"name": "a", "resourceVersion": "7", "generation": 3}, "spec": {"x": 1}});
        assert_eq!(compare(Some(live.clone()), after), Change::Unchanged);
        let changed = json!({"metadata": {"name": "a"}, "spec": {"x": 2}});
        assert!(matches!(compare(Some(live), changed), Change::Update { .. }));
        assert!(matches!(
            compare(None, json!({"metadata": {"name": "a"}})),
            Change::Create { .. }
        ));
    }
}
