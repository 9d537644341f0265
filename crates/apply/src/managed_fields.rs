//! Who wrote which fields of an object, read from its `metadata.managedFields` (pure): the last writer
//! other than the operator ([`last_writer`]), with the fields it owns rendered as paths such as
//! `.spec.template.metadata.labels.domain` ([`paths`]); and the conflicts a server-side apply without force
//! was refused with ([`conflicts`]), among them fields another manager last wrote through a subresource
//! (`scale`: an autoscaler's `spec.replicas`), which the engine leaves out of its applies ([`remove_path`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde_json::Value;

/// The most fields named in a [`Writer`]: an entry can own hundreds.
const MAX_FIELDS: usize = 5;

/// One field manager's last write of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Writer {
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// `scale`, `status`, ... when written through a subresource.
    pub subresource: Option<String>,
    /// The fields it owns (at most [`MAX_FIELDS`]), as paths; empty when it is the operator's own manager.
    pub fields: Vec<String>,
    /// More fields it owns than named.
    pub more_fields: usize,
    /// When (RFC 3339, as the API server records it).
    pub time: Option<String>,
    /// The manager is the operator's own: another applier with the same field manager wrote it (another
    /// Cluster whose kubeconfig points at the same API server, another replica of an operator).
    pub ours: bool,
}

impl std::fmt::Display for Writer {
    /// `"fighter" (Update) at .spec.template.metadata.labels.domain`
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} ({}", self.manager, self.operation)?;
        if let Some(subresource) = &self.subresource {
            write!(f, ", subresource {subresource}")?;
        }
        write!(f, ")")?;
        if self.ours {
            return write!(
                f,
                ", the operator's own field manager: something else applies this object with it (another Cluster \
                 whose kubeconfig points at the same API server?)"
            );
        }
        if !self.fields.is_empty() {
            write!(f, " at {}", self.fields.join(", "))?;
            if self.more_fields > 0 {
                write!(f, " and {} more", self.more_fields)?;
            }
        }
        Ok(())
    }
}

/// The newest write of the object by a manager other than `ours` (the `status` subresource aside: status
/// writes are no drift); when there is none, the newest of `ours` (another applier using the same manager).
pub fn last_writer(entries: &[ManagedFieldsEntry], ours: &str) -> Option<Writer> {
    let candidates = entries
        .iter()
        .filter(|e| e.subresource.as_deref() != Some("status"))
        .filter(|e| e.manager.is_some());
    let newest = |of_ours: bool| {
        candidates
            .clone()
            .filter(|e| (e.manager.as_deref() == Some(ours)) == of_ours)
            .max_by_key(|e| e.time.as_ref().map(|t| t.0))
    };
    let (entry, is_ours) = match newest(false) {
        Some(entry) => (entry, false),
        None => (newest(true)?, true),
    };
    let all = if is_ours {
        Vec::new()
    } else {
        entry.fields_v1.as_ref().map(|f| paths(&f.0)).unwrap_or_default()
    };
    let more_fields = all.len().saturating_sub(MAX_FIELDS);
    Some(Writer {
        manager: entry.manager.clone().unwrap_or_default(),
        operation: entry.operation.clone().unwrap_or_default(),
        subresource: entry.subresource.clone().filter(|s| !s.is_empty()),
        fields: all.into_iter().take(MAX_FIELDS).collect(),
        more_fields,
        time: entry.time.as_ref().map(|t| t.0.to_string()),
        ours: is_ours,
    })
}

/// The fields of a `fieldsV1` set as paths: `f:name` is `.name`, `k:{"name":"x"}` is `[name="x"]`,
/// `v:"a"` is `[="a"]`, `i:0` is `[0]`; a node owned with its children (`.`) is named by its children.
pub fn paths(fields: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(fields, String::new(), &mut out);
    out
}

fn walk(node: &Value, at: String, out: &mut Vec<String>) {
    let children: Vec<(&String, &Value)> = node
        .as_object()
        .map(|o| o.iter().filter(|(k, _)| k.as_str() != ".").collect())
        .unwrap_or_default();
    if children.is_empty() {
        if !at.is_empty() {
            out.push(at);
        }
        return;
    }
    for (key, child) in children {
        walk(child, format!("{at}{}", segment(key)), out);
    }
}

fn segment(key: &str) -> String {
    match key.split_once(':') {
        Some(("f", name)) => format!(".{name}"),
        Some(("k", keys)) => match serde_json::from_str::<serde_json::Map<String, Value>>(keys) {
            Ok(keys) => {
                let keys: Vec<String> = keys.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("[{}]", keys.join(","))
            }
            Err(_) => format!("[{keys}]"),
        },
        Some(("v", value)) => format!("[={value}]"),
        Some(("i", index)) => format!("[{index}]"),
        _ => format!(".{key}"),
    }
}

/// One field a server-side apply without force conflicted on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    /// The manager that owns the field.
    pub manager: String,
    /// The subresource it wrote the field through (`scale`), if any.
    pub subresource: Option<String>,
    /// The field, as the API server names it (`.spec.replicas`).
    pub field: String,
}

/// The conflicts of a 409 answer to a server-side apply without force (its `FieldManagerConflict` causes:
/// `conflict with "hpa" with subresource "scale" using apps/v1 at 2026-...`, field `.spec.replicas`).
pub fn conflicts(status: &kube::core::Status) -> Vec<Conflict> {
    status
        .details
        .iter()
        .flat_map(|d| d.causes.iter())
        .filter(|c| c.reason == "FieldManagerConflict")
        .map(|cause| Conflict {
            manager: quoted_after(&cause.message, "conflict with ").unwrap_or_default(),
            subresource: quoted_after(&cause.message, "with subresource "),
            field: cause.field.clone(),
        })
        .collect()
}

/// The Go-quoted string right after `prefix` in `text`.
fn quoted_after(text: &str, prefix: &str) -> Option<String> {
    let rest = text.split_once(prefix)?.1.strip_prefix('"')?;
    let mut value = String::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => value.push(chars.next()?),
            '"' => return Some(value),
            c => value.push(c),
        }
    }
    None
}

/// Removes the field at `path` (`.spec.replicas`: field names only, no list keys) from `object`; whether the
/// path is of that form (a field that is not there counts as removed).
pub fn remove_path(object: &mut Value, path: &str) -> bool {
    let Some(rest) = path.strip_prefix('.') else {
        return false;
    };
    let names: Vec<&str> = rest.split('.').collect();
    if names.iter().any(|n| n.is_empty() || n.contains(['[', ']', '='])) {
        return false;
    }
    let (last, parents) = names.split_last().expect("split yields at least one name");
    let mut node = object;
    for name in parents {
        match node.get_mut(*name) {
            Some(child) => node = child,
            None => return true,
        }
    }
    if let Some(map) = node.as_object_mut() {
        map.remove(*last);
    }
    true
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, Time};
    use rstest::rstest;
    use serde_json::json;

    use super::*;

    fn entry(
        manager: &str,
        operation: &str,
        subresource: Option<&str>,
        at: i64,
        fields: Value,
    ) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            subresource: subresource.map(str::to_owned),
            time: Some(Time(k8s_openapi::jiff::Timestamp::from_second(at).unwrap())),
            fields_v1: Some(FieldsV1(fields)),
            api_version: Some("apps/v1".into()),
            fields_type: Some("FieldsV1".into()),
        }
    }

    #[rstest]
    #[case::one_label(
        json!({"f:spec": {"f:template": {"f:metadata": {"f:labels": {"f:domain": {}}}}}}),
        &[".spec.template.metadata.labels.domain"]
    )]
    #[case::a_node_with_its_children(
        json!({"f:metadata": {"f:labels": {".": {}, "f:a": {}, "f:b": {}}}}),
        &[".metadata.labels.a", ".metadata.labels.b"]
    )]
    #[case::a_node_alone(json!({"f:metadata": {"f:labels": {".": {}}}}), &[".metadata.labels"])]
    #[case::list_keys(
        json!({"f:spec": {"f:containers": {"k:{\"name\":\"web\"}": {"f:image": {}}}}}),
        &[".spec.containers[name=\"web\"].image"]
    )]
    #[case::set_values_and_indexes(
        json!({"f:finalizers": {"v:\"a\"": {}}, "f:args": {"i:0": {}}}),
        &[".args[0]", ".finalizers[=\"a\"]"]
    )]
    #[case::nothing(json!({}), &[])]
    fn fields_are_named_as_paths(#[case] fields: Value, #[case] expected: &[&str]) {
        assert_eq!(paths(&fields), expected);
    }

    #[test]
    fn the_last_writer_is_the_newest_other_manager_else_our_own() {
        let ours = entry(
            "cluster-stack-operator",
            "Apply",
            None,
            100,
            json!({"f:spec": {"f:replicas": {}}}),
        );
        let fighter = entry(
            "fighter",
            "Update",
            None,
            200,
            json!({"f:spec": {"f:template": {"f:metadata": {"f:labels": {"f:domain": {}}}}}}),
        );
        let older = entry(
            "kubectl-edit",
            "Update",
            None,
            150,
            json!({"f:metadata": {"f:labels": {"f:x": {}}}}),
        );
        let status = entry(
            "kube-controller-manager",
            "Update",
            Some("status"),
            300,
            json!({"f:status": {}}),
        );
        let writer = last_writer(
            &[ours.clone(), older, fighter, status.clone()],
            "cluster-stack-operator",
        )
        .unwrap();
        assert_eq!(writer.manager, "fighter");
        assert_eq!(
            writer.to_string(),
            r#""fighter" (Update) at .spec.template.metadata.labels.domain"#
        );
        let alone = last_writer(&[ours, status], "cluster-stack-operator").unwrap();
        assert!(alone.ours && alone.fields.is_empty(), "{alone:?}");
        assert!(alone.to_string().contains("same API server"), "{alone}");
        assert_eq!(last_writer(&[], "cluster-stack-operator"), None);
    }

    #[test]
    fn many_fields_are_cut_short() {
        let fields: serde_json::Map<String, Value> = (0..8).map(|i| (format!("f:l{i}"), json!({}))).collect();
        let writer = last_writer(
            &[entry(
                "policy",
                "Update",
                None,
                1,
                json!({"f:metadata": {"f:labels": fields}}),
            )],
            "cluster-stack-operator",
        )
        .unwrap();
        assert_eq!(writer.fields.len(), 5);
        assert!(writer.to_string().ends_with(" and 3 more"), "{writer}");
    }

    #[test]
    fn conflicts_name_the_manager_its_subresource_and_the_field() {
        let status: kube::core::Status = serde_json::from_value(json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 409, "reason": "Conflict",
            "message": "Apply failed with 2 conflicts: ...",
            "details": {"causes": [
                {"reason": "FieldManagerConflict", "message": "conflict with \"hpa\" with subresource \"scale\" using apps/v1 at 2026-01-01T00:00:00Z", "field": ".spec.replicas"},
                {"reason": "FieldManagerConflict", "message": "conflict with \"fighter\" using apps/v1", "field": ".metadata.labels.domain"},
                {"reason": "Other", "message": "x", "field": ".y"},
            ]},
        }))
        .unwrap();
        assert_eq!(
            conflicts(&status),
            [
                Conflict {
                    manager: "hpa".into(),
                    subresource: Some("scale".into()),
                    field: ".spec.replicas".into()
                },
                Conflict {
                    manager: "fighter".into(),
                    subresource: None,
                    field: ".metadata.labels.domain".into()
                },
            ]
        );
    }

    #[rstest]
    #[case::a_field(".spec.replicas", true, json!({"spec": {"template": {}}}))]
    #[case::not_there(".spec.paused", true, json!({"spec": {"replicas": 2, "template": {}}}))]
    #[case::parent_not_there(".status.x", true, json!({"spec": {"replicas": 2, "template": {}}}))]
    #[case::list_keys(".spec.containers[name=\"a\"].image", false, json!({"spec": {"replicas": 2, "template": {}}}))]
    #[case::not_a_path("spec", false, json!({"spec": {"replicas": 2, "template": {}}}))]
    fn only_plain_paths_are_removed(#[case] path: &str, #[case] removable: bool, #[case] after: Value) {
        let mut object = json!({"spec": {"replicas": 2, "template": {}}});
        assert_eq!(remove_path(&mut object, path), removable);
        assert_eq!(object, after);
    }
}

/// Who owns one field of an object (and, walking down, the fields below it), by its `fieldsV1` sets: the
/// operator's own Apply entry and every other entry. A field owned as a whole (an atomic list, a map set
/// with `.`) owns everything below it.
#[derive(Clone, Debug, Default)]
pub struct FieldOwners<'a> {
    ours: Option<&'a Value>,
    others: Vec<&'a Value>,
}

impl<'a> FieldOwners<'a> {
    /// The owners of the whole object: `manager`'s Apply entry is ours, every other entry another's.
    pub fn of(entries: &'a [ManagedFieldsEntry], manager: &str) -> Self {
        let mut owners = FieldOwners::default();
        for entry in entries {
            let Some(fields) = entry.fields_v1.as_ref().map(|f| &f.0) else {
                continue;
            };
            if entry.manager.as_deref() == Some(manager) && entry.operation.as_deref() == Some("Apply") {
                owners.ours = Some(fields);
            } else {
                owners.others.push(fields);
            }
        }
        owners
    }

    /// The owners of the field `name` below this one.
    pub fn field(&self, name: &str) -> Self {
        self.below(|set| set.get(&format!("f:{name}")))
    }

    /// The owners of the list item `item` (at `index`) below this one: by its keys (`k:{"name":"x"}`), its
    /// value (`v:"a"`) or its index (`i:0`).
    pub fn item(&self, item: &Value, index: usize) -> Self {
        self.below(|set| {
            set.iter().find_map(|(key, child)| {
                let found = match key.split_once(':') {
                    Some(("k", keys)) => serde_json::from_str::<serde_json::Map<String, Value>>(keys)
                        .is_ok_and(|keys| keys.iter().all(|(k, v)| item.get(k) == Some(v))),
                    Some(("v", value)) => serde_json::from_str::<Value>(value).is_ok_and(|v| &v == item),
                    Some(("i", at)) => at.parse() == Ok(index),
                    _ => false,
                };
                found.then_some(child)
            })
        })
    }

    /// Whether the operator has an Apply entry here: it applied the object (or this field).
    pub fn has_ours(&self) -> bool {
        self.ours.is_some()
    }

    /// Whether the operator's Apply entry owns this field and no other entry does: a value of it that is not
    /// the one applied is the API server's (defaulted, normalised, set by an admission webhook at the apply),
    /// as any other writer that changes a field takes it over.
    pub fn ours_alone(&self) -> bool {
        self.ours.is_some() && self.others.is_empty()
    }

    fn below(&self, child: impl Fn(&'a serde_json::Map<String, Value>) -> Option<&'a Value>) -> Self {
        let step = |set: &'a Value| match set.as_object() {
            // Owned as a whole: so is everything below.
            Some(children) if children.is_empty() => Some(set),
            Some(children) => child(children),
            None => None,
        };
        FieldOwners {
            ours: self.ours.and_then(step),
            others: self.others.iter().copied().filter_map(step).collect(),
        }
    }
}
