//! The variables a class move writes (issue 40): the Cluster's own (`spec.topology.variables`) and each
//! override list (`controlPlane.variables.overrides`, and those of every MachineDeployment and MachinePool
//! under `workers`), changed by what a rollout declares ([`Declared`]: set or remove a variable or a field
//! inside one) and, when asked, with the values that follow the old class's defaults left out
//! (the values that follow the old class's defaults, see [`move_variables`]). The move then writes the changed lists in the same guarded patch as the class
//! ([`MoveVariables::json_patch`]), so that a Cluster is never seen on one class with the other's values.
//!
//! Pure: the caller reads the Cluster and its old class, and makes the dry run and the patch.

use serde_json::{Map, Value, json};

use super::class_move::{ClassView, default_into};

/// A change a rollout declares to the variables of the Clusters it moves (`spec.variables.set` and
/// `spec.variables.remove`). It is made wherever the Cluster sets the variable: its own list and every
/// override; a `set` adds the variable (and the objects on the way to its field) to the Cluster's own list
/// when it is not there, never to an override (which would then override what it did not before).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declared {
    pub name: String,
    /// The field inside the value, outermost first; empty for the whole variable.
    pub field: Vec<String>,
    /// The value to set; `None` removes.
    pub value: Option<Value>,
}

impl Declared {
    /// `oidcConfig.groupsPrefix`, or the variable's name.
    pub fn path(&self) -> String {
        std::iter::once(self.name.as_str())
            .chain(self.field.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(".")
    }
}

/// What a move may do to the variables: a rollout's `spec.variables`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VariableRules {
    /// `followClassDefaults`: a move refused as it is is asked again with the old class's defaults followed.
    pub follow_class_defaults: bool,
    /// `set` and `remove`, made with every move.
    pub declared: Vec<Declared>,
}

/// Where a list of variables is in a Cluster's `spec.topology`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListAt {
    /// `variables`: the Cluster's own.
    Own,
    /// `controlPlane.variables.overrides`.
    ControlPlane,
    /// `workers.<key>[index].variables.overrides` of the worker `name` (`key`: `machineDeployments` or
    /// `machinePools`, `kind` its singular).
    Worker {
        key: &'static str,
        kind: &'static str,
        index: usize,
        name: String,
    },
}

impl ListAt {
    /// Its JSON pointer under `spec.topology`: `/variables`, `/workers/machineDeployments/0/variables/overrides`.
    pub fn pointer(&self) -> String {
        match self {
            ListAt::Own => "/variables".to_owned(),
            ListAt::ControlPlane => "/controlPlane/variables/overrides".to_owned(),
            ListAt::Worker { key, index, .. } => format!("/workers/{key}/{index}/variables/overrides"),
        }
    }

    /// Whose overrides it holds (`machineDeployment md-0`, `controlPlane`); `None` for the Cluster's own.
    pub fn owner(&self) -> Option<String> {
        match self {
            ListAt::Own => None,
            ListAt::ControlPlane => Some("controlPlane".to_owned()),
            ListAt::Worker { kind, name, .. } => Some(format!("{kind} {name}")),
        }
    }
}

/// One list of variables the move changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangedList {
    pub at: ListAt,
    /// The list as the Cluster has it (`None`: it has none).
    pub before: Option<Value>,
    pub after: Value,
}

/// The variables a move writes, and what it changed in them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MoveVariables {
    /// The lists that change, in the order of the topology.
    pub lists: Vec<ChangedList>,
    /// What was left out because it equalled the old class's default: `oidcConfig.groupsPrefix`, or
    /// `oidcConfig.groupsPrefix in machineDeployment md-0`.
    pub dropped: Vec<String>,
    /// The declared changes made, each with the value it replaced: `removed oidcConfig.groupsPrefix (was
    /// "corp:")`.
    pub changed: Vec<String>,
}

impl MoveVariables {
    /// Whether the move leaves the variables as they are.
    pub fn is_empty(&self) -> bool {
        self.lists.is_empty()
    }

    /// Whether values were left out to follow the old class's defaults.
    pub fn follows_defaults(&self) -> bool {
        !self.dropped.is_empty()
    }

    /// `topology` (a Cluster's `spec.topology`) with the changed lists in place.
    pub fn applied_to(&self, topology: &Value) -> Value {
        let mut changed = topology.clone();
        for list in &self.lists {
            match changed.pointer_mut(&list.at.pointer()) {
                Some(slot) => *slot = list.after.clone(),
                None => {
                    // Only the Cluster's own list can be missing (overrides are changed only where present).
                    if let Some(topology) = changed.as_object_mut() {
                        topology.insert("variables".to_owned(), list.after.clone());
                    }
                }
            }
        }
        changed
    }

    /// The fields of `spec.topology` a merge patch sets to make the change (the dry run's): the Cluster's own
    /// list, and the whole `controlPlane` or worker arrays whose overrides change (a merge patch replaces
    /// arrays whole). `topology` is the Cluster's.
    pub fn merge_patch(&self, topology: &Value) -> Map<String, Value> {
        let changed = self.applied_to(topology);
        let mut patch = Map::new();
        for list in &self.lists {
            let (key, inner) = match &list.at {
                ListAt::Own => ("variables", None),
                ListAt::ControlPlane => ("controlPlane", None),
                ListAt::Worker { key, .. } => ("workers", Some(*key)),
            };
            let Some(value) = changed.get(key) else {
                continue;
            };
            match inner {
                None => {
                    patch.insert(key.to_owned(), value.clone());
                }
                Some(inner) => {
                    let workers = patch.entry(key).or_insert_with(|| json!({}));
                    workers[inner] = value.get(inner).cloned().unwrap_or(Value::Null);
                }
            }
        }
        patch
    }

    /// JSON patch operations (paths under the Cluster's root) that make the change, each list guarded by a
    /// test of what it was (and a worker's overrides by a test of its name, so that a reordered list fails).
    pub fn json_patch(&self) -> Vec<Value> {
        let mut ops = Vec::new();
        for list in &self.lists {
            let path = format!("/spec/topology{}", list.at.pointer());
            if let ListAt::Worker { key, index, name, .. } = &list.at {
                ops.push(json!({"op": "test", "path": format!("/spec/topology/workers/{key}/{index}/name"), "value": name}));
            }
            match &list.before {
                Some(before) => {
                    ops.push(json!({"op": "test", "path": path, "value": before}));
                    ops.push(json!({"op": "replace", "path": path, "value": list.after}));
                }
                None => ops.push(json!({"op": "add", "path": path, "value": list.after})),
            }
        }
        ops
    }
}

/// The variable lists of a Cluster's `topology`. The Cluster's own list comes first, whether it has one or
/// not; overrides only where they are set.
pub fn variable_lists(topology: &Value) -> Vec<ListAt> {
    let mut lists = vec![ListAt::Own];
    if topology.pointer("/controlPlane/variables/overrides").is_some() {
        lists.push(ListAt::ControlPlane);
    }
    for (kind, key) in [
        ("machineDeployment", "machineDeployments"),
        ("machinePool", "machinePools"),
    ] {
        let workers = topology
            .pointer(&format!("/workers/{key}"))
            .and_then(Value::as_array);
        for (index, worker) in workers.into_iter().flatten().enumerate() {
            if worker.pointer("/variables/overrides").is_some() {
                let name = worker.get("name").and_then(Value::as_str).unwrap_or_default();
                lists.push(ListAt::Worker {
                    key,
                    kind,
                    index,
                    name: name.to_owned(),
                });
            }
        }
    }
    lists
}

/// The variables `topology` (a Cluster's `spec.topology`) has after a move that makes the `declared` changes
/// and, with `follow` (the old class), leaves out what equals the old class's defaults first.
pub fn move_variables(topology: &Value, follow: Option<&ClassView>, declared: &[Declared]) -> MoveVariables {
    let mut moved = MoveVariables::default();
    for at in variable_lists(topology) {
        let before = topology.pointer(&at.pointer()).cloned();
        let of = at.owner();
        let mut items: Vec<Value> = before
            .as_ref()
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let within = |path: String| match &of {
            Some(of) => format!("{path} in {of}"),
            None => path,
        };
        if let Some(class) = follow {
            items.retain_mut(|item| {
                let Some(name) = item.get("name").and_then(Value::as_str).map(str::to_owned) else {
                    return true;
                };
                let Some(definition) = class.variable(&name) else {
                    return true;
                };
                let Some(value) = item.get_mut("value") else {
                    return true;
                };
                let mut dropped = Vec::new();
                let whole = if of.is_none() {
                    follows_default(&definition.schema, value, &name, &mut dropped)
                } else {
                    // An override equal to the default is the owner's choice against the Cluster's value:
                    // only the fields inside it follow the class.
                    leave_out_defaults(&definition.schema, value, &name, &mut dropped);
                    false
                };
                if whole {
                    dropped.push(name);
                }
                moved.dropped.extend(dropped.into_iter().map(&within));
                !whole
            });
        }
        for change in declared {
            if let Some(said) = make(change, &mut items, of.is_none()) {
                moved.changed.push(within(said));
            }
        }
        let after = Value::Array(items);
        let unchanged = match &before {
            Some(before) => *before == after,
            None => after.as_array().is_none_or(Vec::is_empty),
        };
        if !unchanged {
            moved.lists.push(ChangedList { at, before, after });
        }
    }
    moved
}

/// Makes `change` in one list of variables (`own`: the Cluster's, where a `set` may add); what was done, said
/// with the value it replaced, or `None` when the list is as the change wants it already.
fn make(change: &Declared, items: &mut Vec<Value>, own: bool) -> Option<String> {
    let path = change.path();
    let position = items
        .iter()
        .position(|item| item.get("name").and_then(Value::as_str) == Some(change.name.as_str()));
    match (&change.value, position) {
        (None, None) => None,
        (None, Some(i)) if change.field.is_empty() => {
            let item = items.remove(i);
            Some(format!(
                "removed {path} (was {})",
                shown(item.get("value").unwrap_or(&Value::Null))
            ))
        }
        (None, Some(i)) => {
            let (last, parents) = change.field.split_last()?;
            let mut at = items[i].get_mut("value")?;
            for key in parents {
                at = at.get_mut(key)?;
            }
            let was = at.as_object_mut()?.remove(last)?;
            Some(format!("removed {path} (was {})", shown(&was)))
        }
        (Some(_), None) if !own => None,
        (Some(value), position) => {
            let i = position.unwrap_or_else(|| {
                items.push(json!({"name": change.name, "value": {}}));
                items.len() - 1
            });
            let mut at = items[i].as_object_mut()?.entry("value").or_insert(Value::Null);
            for key in &change.field {
                if !at.is_object() {
                    *at = json!({});
                }
                at = at.as_object_mut()?.entry(key.clone()).or_insert(Value::Null);
            }
            // Nothing was there when the variable or the field is new (a field is never set to null by its
            // owner).
            let was = (position.is_some() && !at.is_null()).then(|| at.clone());
            if was.as_ref() == Some(value) {
                return None;
            }
            *at = value.clone();
            Some(match was {
                Some(was) => format!("set {path} to {} (was {})", shown(value), shown(&was)),
                None => format!("set {path} to {} (was unset)", shown(value)),
            })
        }
    }
}

/// A value as a change says it: compact JSON, cut at 60 characters.
fn shown(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= 60 {
        return text;
    }
    let cut: String = text.chars().take(57).collect();
    format!("{cut}...")
}

/// Whether `value` is all default by `schema` (as Cluster API defaults it: the default, with the defaults
/// inside it filled in), so that it goes whole; else leaves out of it each property that is, recursing
/// (what was left out is added to `dropped`, `at` being the path of `value`).
fn follows_default(schema: &Value, value: &mut Value, at: &str, dropped: &mut Vec<String>) -> bool {
    if is_default(schema, value) {
        return true;
    }
    let mut inside = Vec::new();
    leave_out_defaults(schema, value, at, &mut inside);
    // What is left may be the default itself (`{}`, whose fields were defaulted inside it).
    if is_default(schema, value) {
        return true;
    }
    dropped.append(&mut inside);
    false
}

/// Leaves out of the object `value` each property that is all default by its schema in `schema`.
fn leave_out_defaults(schema: &Value, value: &mut Value, at: &str, dropped: &mut Vec<String>) {
    let (Some(properties), Some(object)) = (
        schema.get("properties").and_then(Value::as_object),
        value.as_object_mut(),
    ) else {
        return;
    };
    object.retain(|name, inner| {
        let Some(property) = properties.get(name) else {
            return true;
        };
        let path = format!("{at}.{name}");
        if follows_default(property, inner, &path, dropped) {
            dropped.push(path);
            return false;
        }
        true
    });
}

/// Whether `value` is what `schema` defaults: its default as given, or with the defaults inside filled in.
fn is_default(schema: &Value, value: &Value) -> bool {
    schema.get("default").is_some_and(|default| {
        let mut filled = default.clone();
        default_into(schema, &mut filled);
        value == default || *value == filled
    })
}

#[cfg(test)]
mod tests {
    use rstest::rstest;
    use serde_json::json;

    use super::*;

    /// A class with `oidcConfig` (properties defaulted, one not), `mirrors` (a defaulted array), `nodes` (a
    /// defaulted number) and `auth` (defaulted `{}` with a default inside).
    fn defaulting_class() -> ClassView {
        ClassView::from_object(&json!({
            "metadata": {"name": "docker-scs-1-35-v1"},
            "spec": {"variables": [
                {"name": "oidcConfig", "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "issuerURL": {"type": "string"},
                    "groupsPrefix": {"type": "string", "default": "oidc:"},
                    "claims": {"type": "object", "properties": {"user": {"type": "string", "default": "sub"}}}}}}},
                {"name": "mirrors", "schema": {"openAPIV3Schema": {"type": "array", "default": [], "items": {"type": "string"}}}},
                {"name": "nodes", "schema": {"openAPIV3Schema": {"type": "integer", "default": 3}}},
                {"name": "auth", "schema": {"openAPIV3Schema": {"type": "object", "default": {}, "properties": {
                    "prefix": {"type": "string", "default": "oidc:"}}}}},
            ]}
        }))
    }

    #[rstest]
    // Defaulted by Cluster API: left out so that the new class defaults it.
    #[case::a_defaulted_field(
        json!([{"name": "oidcConfig", "value": {"issuerURL": "https://dex", "groupsPrefix": "oidc:"}}]),
        json!([{"name": "oidcConfig", "value": {"issuerURL": "https://dex"}}]),
        &["oidcConfig.groupsPrefix"])]
    // Changed by the owner: kept, byte for byte.
    #[case::a_chosen_field(
        json!([{"name": "oidcConfig", "value": {"issuerURL": "https://dex", "groupsPrefix": "corp:"}}]),
        json!([{"name": "oidcConfig", "value": {"issuerURL": "https://dex", "groupsPrefix": "corp:"}}]),
        &[])]
    #[case::a_nested_default(
        json!([{"name": "oidcConfig", "value": {"claims": {"user": "sub"}, "groupsPrefix": "x"}}]),
        json!([{"name": "oidcConfig", "value": {"claims": {}, "groupsPrefix": "x"}}]),
        &["oidcConfig.claims.user"])]
    // Whole variables equal to their top-level default go; arrays are compared whole.
    #[case::whole_variables(
        json!([{"name": "mirrors", "value": []}, {"name": "nodes", "value": 3}]),
        json!([]),
        &["mirrors", "nodes"])]
    #[case::an_array_the_owner_filled(
        json!([{"name": "mirrors", "value": ["m1"]}, {"name": "nodes", "value": 5}]),
        json!([{"name": "mirrors", "value": ["m1"]}, {"name": "nodes", "value": 5}]),
        &[])]
    // Created by Cluster API from a top-level default `{}`, with the defaults inside it filled in: all default.
    #[case::a_default_with_defaults_inside(
        json!([{"name": "auth", "value": {"prefix": "oidc:"}}]),
        json!([]),
        &["auth"])]
    // A variable the old class does not define: no default to tell by.
    #[case::unknown_to_the_old_class(
        json!([{"name": "extra", "value": {"groupsPrefix": "oidc:"}}]),
        json!([{"name": "extra", "value": {"groupsPrefix": "oidc:"}}]),
        &[])]
    fn values_equal_to_the_old_classs_defaults_follow_the_class(
        #[case] variables: Value,
        #[case] expected: Value,
        #[case] dropped: &[&str],
    ) {
        let class = defaulting_class();
        let before = json!({ "variables": variables });
        let moved = move_variables(&before, Some(&class), &[]);
        assert_eq!(moved.applied_to(&before)["variables"], expected);
        assert_eq!(moved.dropped, dropped);
    }

    /// A topology with the Cluster's own variables `own` and md-0's overrides `overrides`.
    fn topology(own: Value, overrides: Value) -> Value {
        json!({
            "classRef": {"name": "docker-scs-1-35-v1"},
            "variables": own,
            "workers": {"machineDeployments": [
                {"class": "default-worker", "name": "md-0", "variables": {"overrides": overrides}},
                {"class": "default-worker", "name": "md-1"},
            ]}
        })
    }

    fn set(path: &str, value: Value) -> Declared {
        let mut parts = path.split('.').map(str::to_owned);
        Declared {
            name: parts.next().unwrap(),
            field: parts.collect(),
            value: Some(value),
        }
    }

    fn remove(path: &str) -> Declared {
        Declared {
            value: None,
            ..set(path, Value::Null)
        }
    }

    const MD: &str = "/workers/machineDeployments/0/variables/overrides";

    #[rstest]
    // An override follows the class inside its value; a whole override equal to the default stays, as it
    // overrides the Cluster's value.
    #[case::follow_inside_an_override(
        json!([{"name": "nodes", "value": 5}]),
        json!([{"name": "oidcConfig", "value": {"issuerURL": "https://md", "groupsPrefix": "oidc:"}}, {"name": "nodes", "value": 3}]),
        (true, vec![]),
        json!([{"name": "nodes", "value": 5}]),
        json!([{"name": "oidcConfig", "value": {"issuerURL": "https://md"}}, {"name": "nodes", "value": 3}]),
        &["oidcConfig.groupsPrefix in machineDeployment md-0"], &[])]
    // A declared field set wherever the variable is set; an override that does not set it is left alone.
    #[case::set_a_field_everywhere(
        json!([{"name": "oidcConfig", "value": {"issuerURL": "https://dex", "groupsPrefix": "corp:"}}]),
        json!([{"name": "oidcConfig", "value": {"issuerURL": "https://md"}}]),
        (false, vec![set("oidcConfig.groupsPrefix", json!("team:"))]),
        json!([{"name": "oidcConfig", "value": {"issuerURL": "https://dex", "groupsPrefix": "team:"}}]),
        json!([{"name": "oidcConfig", "value": {"issuerURL": "https://md", "groupsPrefix": "team:"}}]),
        &[], &["set oidcConfig.groupsPrefix to \"team:\" (was \"corp:\")",
               "set oidcConfig.groupsPrefix to \"team:\" (was unset) in machineDeployment md-0"])]
    // A set adds a missing variable to the Cluster's own list, never to an override.
    #[case::set_adds_to_the_clusters_own_list_only(
        json!([]),
        json!([{"name": "nodes", "value": 4}]),
        (false, vec![set("imageRepository", json!("registry.scs.community")), set("auth.prefix", json!("x:"))]),
        json!([{"name": "imageRepository", "value": "registry.scs.community"}, {"name": "auth", "value": {"prefix": "x:"}}]),
        json!([{"name": "nodes", "value": 4}]),
        &[], &["set imageRepository to \"registry.scs.community\" (was unset)", "set auth.prefix to \"x:\" (was unset)"])]
    // Remove: a whole variable and a field, wherever set; what is not there is no change.
    #[case::remove_everywhere(
        json!([{"name": "nodes", "value": 5}, {"name": "oidcConfig", "value": {"groupsPrefix": "corp:"}}]),
        json!([{"name": "nodes", "value": 4}, {"name": "oidcConfig", "value": {"issuerURL": "https://md"}}]),
        (false, vec![remove("nodes"), remove("oidcConfig.groupsPrefix"), remove("gone")]),
        json!([{"name": "oidcConfig", "value": {}}]),
        json!([{"name": "oidcConfig", "value": {"issuerURL": "https://md"}}]),
        &[], &["removed nodes (was 5)", "removed oidcConfig.groupsPrefix (was \"corp:\")",
               "removed nodes (was 4) in machineDeployment md-0"])]
    // Followed first, then declared: a declared value equal to the old default stays set.
    #[case::declared_after_followed(
        json!([{"name": "oidcConfig", "value": {"issuerURL": "https://dex", "groupsPrefix": "oidc:"}}]),
        json!([]),
        (true, vec![set("nodes", json!(3))]),
        json!([{"name": "oidcConfig", "value": {"issuerURL": "https://dex"}}, {"name": "nodes", "value": 3}]),
        json!([]),
        &["oidcConfig.groupsPrefix"], &["set nodes to 3 (was unset)"])]
    // A set to the value there already changes nothing.
    #[case::set_to_what_is_there(
        json!([{"name": "nodes", "value": 5}]),
        json!([]),
        (false, vec![set("nodes", json!(5))]),
        json!([{"name": "nodes", "value": 5}]),
        json!([]),
        &[], &[])]
    fn the_moves_variables_follow_the_class_and_make_the_declared_changes_in_every_list(
        #[case] own: Value,
        #[case] overrides: Value,
        #[case] (follow, declared): (bool, Vec<Declared>),
        #[case] own_after: Value,
        #[case] overrides_after: Value,
        #[case] dropped: &[&str],
        #[case] changed: &[&str],
    ) {
        let class = defaulting_class();
        let before = topology(own, overrides);
        let moved = move_variables(&before, follow.then_some(&class), &declared);
        assert_eq!(moved.dropped, dropped);
        assert_eq!(moved.changed, changed);
        let after = moved.applied_to(&before);
        assert_eq!(after["variables"], own_after);
        assert_eq!(after.pointer(MD).unwrap(), &overrides_after);
        // Only the lists that change are written; md-1 has none and gets none.
        for list in &moved.lists {
            assert_ne!(Some(&list.after), list.before.as_ref(), "{:?}", list.at);
        }
        assert!(after.pointer("/workers/machineDeployments/1/variables").is_none());
        assert_eq!(moved.is_empty(), before == after);
    }

    #[test]
    fn the_patches_write_each_changed_list_guarded_by_what_it_was() {
        let before = topology(
            json!([{"name": "nodes", "value": 5}]),
            json!([{"name": "nodes", "value": 4}]),
        );
        let moved = move_variables(&before, None, &[set("nodes", json!(6))]);
        assert_eq!(
            moved.json_patch(),
            vec![
                json!({"op": "test", "path": "/spec/topology/variables", "value": [{"name": "nodes", "value": 5}]}),
                json!({"op": "replace", "path": "/spec/topology/variables", "value": [{"name": "nodes", "value": 6}]}),
                json!({"op": "test", "path": "/spec/topology/workers/machineDeployments/0/name", "value": "md-0"}),
                json!({"op": "test", "path": format!("/spec/topology{MD}"), "value": [{"name": "nodes", "value": 4}]}),
                json!({"op": "replace", "path": format!("/spec/topology{MD}"), "value": [{"name": "nodes", "value": 6}]}),
            ]
        );
        // The merge patch of the dry run replaces the arrays whole: md-1 is in it, unchanged.
        let merge = moved.merge_patch(&before);
        assert_eq!(merge["variables"], json!([{"name": "nodes", "value": 6}]));
        let workers = merge["workers"]["machineDeployments"].as_array().unwrap();
        assert_eq!(workers.len(), 2);
        assert_eq!(
            workers[0]["variables"]["overrides"],
            json!([{"name": "nodes", "value": 6}])
        );
        assert_eq!(workers[1], before["workers"]["machineDeployments"][1]);

        // A Cluster without variables of its own gets the list added.
        let bare = json!({"classRef": {"name": "c"}});
        let moved = move_variables(&bare, None, &[set("nodes", json!(2))]);
        assert_eq!(
            moved.json_patch(),
            vec![
                json!({"op": "add", "path": "/spec/topology/variables", "value": [{"name": "nodes", "value": 2}]})
            ]
        );
        assert_eq!(
            moved.applied_to(&bare)["variables"],
            json!([{"name": "nodes", "value": 2}])
        );
        assert!(move_variables(&bare, None, &[remove("nodes")]).is_empty());
    }
}
