//! The generated CRDs must match the Go operator's CRDs field for field: names, scope, short names, printer
//! columns, and every field path with its type, enum, default, pattern and required list. The reference is
//! `tests/fixtures/upstream-crds/signature.json`, taken from the Go operator's CRDs. The only differences
//! allowed are the deliberate widenings in [`WIDENINGS`] (a field that accepts more), the new optional
//! fields in [`ADDITIONS`] and the new printer columns in [`ADDED_COLUMNS`] (after the Go operator's, which
//! stay as they are), each with its reason (and a record in `docs/decisions.md`); every one must still be
//! needed, so a stale exception fails too.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// Flattens a schema into `path -> "type[ enum=..][ default=..][ pattern=..]"` plus `path!required` entries.
fn walk(schema: &Value, path: &str, out: &mut BTreeMap<String, String>) {
    let Some(obj) = schema.as_object() else { return };
    let mut sig = obj.get("type").and_then(Value::as_str).unwrap_or("").to_owned();
    if obj.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        sig = "int-or-string".into();
    }
    if let Some(values) = obj.get("enum").and_then(Value::as_array) {
        let mut names: Vec<String> = values
            .iter()
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
            .collect();
        names.sort();
        sig += &format!(" enum={}", names.join(","));
    }
    if let Some(default) = obj.get("default") {
        sig += &format!(" default={default}");
    }
    if let Some(pattern) = obj.get("pattern").and_then(Value::as_str) {
        sig += &format!(" pattern={pattern}");
    }
    if !path.is_empty() {
        out.insert(path.to_owned(), sig);
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (key, sub) in props {
            let sub_path = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            walk(sub, &sub_path, out);
        }
    }
    if let Some(items) = obj.get("items") {
        walk(items, &format!("{path}[]"), out);
    }
    if let Some(required) = obj
        .get("required")
        .and_then(Value::as_array)
        .filter(|r| !r.is_empty())
    {
        let mut names: Vec<&str> = required.iter().filter_map(Value::as_str).collect();
        names.sort();
        out.insert(format!("{path}!required"), names.join(","));
    }
}

/// A field where our CRD accepts more than the Go CRD, on purpose: everything the Go CRD accepts is still
/// accepted, so existing objects stay valid.
struct Widening {
    kind: &'static str,
    version: &'static str,
    path: &'static str,
    go: &'static str,
    ours: &'static str,
    why: &'static str,
}

const WIDENINGS: &[Widening] = &[
    Widening {
        kind: "ClusterStack",
        version: "v1alpha1",
        path: "spec.kubernetesVersion",
        go: r"string pattern=^\d\.\d+$",
        ours: r"string pattern=^\d\.\d+(\.\d+)?$",
        why: "the stacks' generator writes the patch version (\"1.34.6\"); it means the minor 1.34",
    },
    Widening {
        kind: "ClusterStack",
        version: "v1alpha1",
        path: "spec.channel",
        go: "string enum=custom,stable default=\"stable\"",
        ours: "string enum=custom,stable,ttl default=\"stable\"",
        why: "development builds v0-ttl.<unix timestamp> have a channel of their own, to follow the newest",
    },
];

/// A field the Go CRD does not have: `subtree` and everything under it. Only optional fields may be added
/// (nothing in a `!required` list of the Go CRD changes), so every object the Go CRD accepts is still
/// accepted, and the Go operator, which does not know the field, never writes it.
struct Addition {
    kind: &'static str,
    version: &'static str,
    subtree: &'static str,
    why: &'static str,
}

const ADDITIONS: &[Addition] = &[
    Addition {
        kind: "ClusterStack",
        version: "v1alpha1",
        subtree: "status.clusters",
        why: "the Clusters on the stack's releases, in all and per release (the fleet status writer)",
    },
    Addition {
        kind: "ClusterStackRelease",
        version: "v1alpha1",
        subtree: "status.clusters",
        why: "the Clusters on the release (the fleet status writer)",
    },
    Addition {
        kind: "ClusterStackRelease",
        version: "v1alpha1",
        subtree: "status.moves",
        why: "which Clusters of the stack could move to the release, and why not (the fleet status writer, issue 30)",
    },
    Addition {
        kind: "ClusterStack",
        version: "v1alpha1",
        subtree: "spec.versionDigests",
        why: "digest pins: version -> the manifest digest its release must have (issue 17)",
    },
    Addition {
        kind: "ClusterStackRelease",
        version: "v1alpha1",
        subtree: "spec.digest",
        why: "the pinned manifest digest, copied from the ClusterStack's versionDigests (issue 17)",
    },
    Addition {
        kind: "ClusterStackRelease",
        version: "v1alpha1",
        subtree: "status.source",
        why: "where the release was fetched from, its digest and whether its signature verified (issue 17)",
    },
];

impl Addition {
    fn covers(&self, kind: &str, version: &str, path: &str) -> bool {
        (self.kind, self.version) == (kind, version)
            && path
                .strip_prefix(self.subtree)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[', '!']))
    }
}

/// A printer column the Go CRD does not have. New columns come after the Go operator's, in this order:
/// scripts that read `kubectl get` by position still find the Go operator's columns where they were.
struct AddedColumn {
    kind: &'static str,
    version: &'static str,
    name: &'static str,
    json_path: &'static str,
    why: &'static str,
}

const ADDED_COLUMNS: &[AddedColumn] = &[
    AddedColumn {
        kind: "ClusterStack",
        version: "v1alpha1",
        name: "Clusters",
        json_path: ".status.clusters.clusters",
        why: "how many Clusters are on the stack's releases",
    },
    AddedColumn {
        kind: "ClusterStack",
        version: "v1alpha1",
        name: "Failing",
        json_path: ".status.clusters.failing",
        why: "how many of them are failing",
    },
    AddedColumn {
        kind: "ClusterStackRelease",
        version: "v1alpha1",
        name: "Clusters",
        json_path: ".status.clusters.clusters",
        why: "how many Clusters are on the release",
    },
    AddedColumn {
        kind: "ClusterStackRelease",
        version: "v1alpha1",
        name: "Failing",
        json_path: ".status.clusters.failing",
        why: "how many of them are failing",
    },
];

fn widening(kind: &str, version: &str, path: &str, ours: &str, go: &str) -> Option<&'static Widening> {
    WIDENINGS
        .iter()
        .find(|w| (w.kind, w.version, w.path, w.ours, w.go) == (kind, version, path, ours, go))
}

fn signature(crd: &Value) -> (String, Value) {
    let spec = &crd["spec"];
    let kind = spec["names"]["kind"].as_str().unwrap().to_owned();
    let mut short: Vec<String> = spec["names"]["shortNames"]
        .as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default();
    short.sort();
    let mut versions = serde_json::Map::new();
    for v in spec["versions"].as_array().unwrap() {
        let mut fields = BTreeMap::new();
        walk(&v["schema"]["openAPIV3Schema"], "", &mut fields);
        let mut sub: Vec<String> = v["subresources"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        sub.sort();
        let columns: Vec<Value> = v["additionalPrinterColumns"]
            .as_array()
            .map(|cols| cols.iter().map(|c| json!([c["name"], c["jsonPath"]])).collect())
            .unwrap_or_default();
        versions.insert(
            v["name"].as_str().unwrap().to_owned(),
            json!({"served": v["served"], "storage": v["storage"], "subresources": sub,
                   "printerColumns": columns, "fields": fields}),
        );
    }
    let entry =
        json!({"group": spec["group"], "scope": spec["scope"], "shortNames": short, "versions": versions});
    (kind, entry)
}

/// Kinds of ours the Go operator does not have: their CRDs are ours alone, so nothing is compared.
const NEW_KINDS: [&str; 1] = [
    // Issue 30: rolling a release out to the Clusters of a stack in waves.
    "ClusterStackRollout",
];

#[test]
fn generated_crds_match_the_go_operator() {
    let reference: Value = serde_json::from_str(include_str!(
        "../../../tests/fixtures/upstream-crds/signature.json"
    ))
    .expect("signature.json parses");
    let mut widened = Vec::new();
    let mut added = Vec::new();
    let mut added_columns = Vec::new();
    let ours: serde_json::Map<String, Value> = cso_api::crd::all()
        .iter()
        .map(|crd| signature(&serde_json::to_value(crd).unwrap()))
        .collect();
    for (kind, expected) in reference.as_object().unwrap() {
        let actual = ours.get(kind).unwrap_or_else(|| panic!("no CRD for {kind}"));
        for key in ["group", "scope", "shortNames"] {
            assert_eq!(actual[key], expected[key], "{kind}.{key}");
        }
        for (version, exp) in expected["versions"].as_object().unwrap() {
            let act = &actual["versions"][version];
            for key in ["served", "storage", "subresources"] {
                assert_eq!(act[key], exp[key], "{kind} {version} {key}");
            }
            let mut columns = exp["printerColumns"].as_array().unwrap().clone();
            for column in ADDED_COLUMNS
                .iter()
                .filter(|c| (c.kind, c.version) == (kind.as_str(), version.as_str()))
            {
                columns.push(json!([column.name, column.json_path]));
                added_columns.push((column.kind, column.name));
            }
            assert_eq!(
                act["printerColumns"],
                Value::Array(columns),
                "{kind} {version} printerColumns: the Go operator's, then ADDED_COLUMNS"
            );
            let (act_fields, exp_fields) = (
                act["fields"].as_object().unwrap(),
                exp["fields"].as_object().unwrap(),
            );
            let mut problems = Vec::new();
            for (path, sig) in exp_fields {
                match act_fields.get(path) {
                    Some(a) if a == sig => {}
                    Some(a) => {
                        match widening(kind, version, path, a.as_str().unwrap(), sig.as_str().unwrap()) {
                            Some(w) => widened.push(w.path),
                            None => problems.push(format!("{path}: ours {a}, Go {sig}")),
                        }
                    }
                    None => problems.push(format!("{path}: missing (Go {sig})")),
                }
            }
            for path in act_fields.keys().filter(|p| !exp_fields.contains_key(*p)) {
                match ADDITIONS.iter().find(|a| a.covers(kind, version, path)) {
                    Some(addition) => added.push((addition.kind, addition.subtree)),
                    None => problems.push(format!("{path}: not in the Go CRD")),
                }
            }
            assert!(
                problems.is_empty(),
                "{kind} {version} differs:\n{}",
                problems.join("\n")
            );
        }
    }
    let theirs: Vec<&String> = reference.as_object().unwrap().keys().collect();
    let mut extra: Vec<&str> = ours
        .keys()
        .filter(|kind| !theirs.contains(kind))
        .map(String::as_str)
        .collect();
    extra.sort_unstable();
    assert_eq!(
        extra, NEW_KINDS,
        "the Go operator's CRDs, and only the kinds it does not have beside them"
    );
    let unused: Vec<String> = WIDENINGS
        .iter()
        .filter(|w| !widened.contains(&w.path))
        .map(|w| format!("{} {}: {} ({})", w.kind, w.path, w.ours, w.why))
        .collect();
    assert!(
        unused.is_empty(),
        "widenings no longer needed, remove them: {unused:?}"
    );
    let unused: Vec<String> = ADDITIONS
        .iter()
        .filter(|a| !added.contains(&(a.kind, a.subtree)))
        .map(|a| format!("{} {} ({})", a.kind, a.subtree, a.why))
        .chain(
            ADDED_COLUMNS
                .iter()
                .filter(|c| !added_columns.contains(&(c.kind, c.name)))
                .map(|c| format!("{} column {} ({})", c.kind, c.name, c.why)),
        )
        .collect();
    assert!(
        unused.is_empty(),
        "additions no longer in the CRDs, remove them: {unused:?}"
    );
}

#[test]
fn crds_carry_the_cluster_api_contract_label() {
    for crd in cso_api::crd::all() {
        let labels = crd.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels.get("cluster.x-k8s.io/v1beta1").map(String::as_str),
            Some("v1beta1")
        );
        assert_eq!(crd.spec.scope, "Namespaced");
    }
}
