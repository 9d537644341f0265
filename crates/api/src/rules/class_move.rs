//! Whether Cluster API would accept moving a Cluster to another ClusterClass, explained in terms of the two
//! classes (issue 30, "preflight of a class move").
//!
//! The answer itself comes from Cluster API: a server-side dry run of the change ([`DryRun`], made by
//! `cso_controller::preflight`). This module explains it, purely, from what the two classes say:
//!
//! - variables whose values the new class's schema refuses ([`validate`]: the subset of OpenAPI v3 that
//!   ClusterClass variables use: `type`, `properties`, `required`, `additionalProperties`,
//!   `x-kubernetes-preserve-unknown-fields`, `items`, `enum`, `pattern`, lengths, bounds and sizes; a field
//!   the schema does not specify is refused, as Cluster API refuses it);
//! - variables the new class no longer defines, and variables it requires that the Cluster does not set and
//!   the schema does not default;
//! - a Kubernetes step Cluster API refuses (down, more than one minor without the class's
//!   `kubernetesVersions`, a version the list does not name);
//! - which hooks and stages of the release the move runs;
//! - a refusal of a variable by the rules of its new schema that are not evaluated here (CEL
//!   `x-kubernetes-validations`, `oneOf`/`anyOf`/`allOf`/`not`): said as refused by those rules, named as the
//!   schema states them, with Cluster API's words ([`Reason::VariableRule`]). Without a dry run such rules
//!   cannot refuse anything, so a verdict without one is only [`Verdict::Likely`].
//!
//! A refused field that the old class's schema defaults is said to be the old class's default.
//!
//! The same [`explain`] serves `cso render --diff` (with a dry run), and a caller that must not make a
//! request per Cluster (the fleet's counts, a rollout's planning) with [`DryRun::NotAsked`]: the
//! explanation alone is then the verdict ([`fleet_moves`] counts a set of Clusters so).

use std::{collections::BTreeMap, fmt};

use serde_json::Value;

use super::{
    Hook,
    move_variables::{MoveVariables, move_variables, variable_lists},
};
use crate::{
    ReleaseId,
    capi::Cluster,
    cluster_stack_release::{RefusedMove, ReleaseMoves},
};

/// One variable a ClusterClass defines (`spec.variables[]`).
#[derive(Clone, Debug, PartialEq)]
pub struct VariableDefinition {
    pub name: String,
    pub required: bool,
    /// `schema.openAPIV3Schema`.
    pub schema: Value,
}

/// What the preflight needs of a ClusterClass (`v1beta1` or `v1beta2`, which spell these fields alike).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClassView {
    pub name: String,
    pub variables: Vec<VariableDefinition>,
    /// `spec.kubernetesVersions` (`v1beta2`): the versions a chained upgrade may go through.
    pub kubernetes_versions: Vec<String>,
}

impl ClassView {
    /// Reads a ClusterClass object, as served or as rendered.
    pub fn from_object(class: &Value) -> Self {
        let variables = class
            .pointer("/spec/variables")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| {
                Some(VariableDefinition {
                    name: v.get("name")?.as_str()?.to_owned(),
                    required: v.get("required").and_then(Value::as_bool).unwrap_or(false),
                    schema: v
                        .pointer("/schema/openAPIV3Schema")
                        .cloned()
                        .unwrap_or(Value::Null),
                })
            })
            .collect();
        ClassView {
            name: class
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            variables,
            kubernetes_versions: class
                .pointer("/spec/kubernetesVersions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
        }
    }

    /// The definition of the variable `name`, if the class defines it.
    pub(crate) fn variable(&self, name: &str) -> Option<&VariableDefinition> {
        self.variables.iter().find(|v| v.name == name)
    }
}

/// The stages of the target release, per hook (`clusteraddon.yaml`); `None` for a release with a single
/// addon chart.
pub type ReleaseStages = Option<BTreeMap<Hook, Vec<String>>>;

/// The move to explain.
#[derive(Clone, Debug)]
pub struct Move<'a> {
    /// `spec.topology.variables[]` of the Cluster: name and value, as stored (with the old class's defaults).
    pub variables: Vec<(String, Value)>,
    /// The override lists (`machineDeployment md-0`, `controlPlane`, ...) with their names and values.
    pub overrides: Vec<(String, Vec<(String, Value)>)>,
    /// The Cluster's `spec.topology.version`.
    pub from_version: Option<&'a str>,
    /// The release's Kubernetes version.
    pub to_version: &'a str,
    pub from: &'a ClassView,
    pub to: &'a ClassView,
    pub stages: &'a ReleaseStages,
}

impl<'a> Move<'a> {
    /// The move of `cluster` (the whole object) from `from` to `to` at `to_version`.
    pub fn of_cluster(
        cluster: &'a Value,
        from: &'a ClassView,
        to: &'a ClassView,
        to_version: &'a str,
        stages: &'a ReleaseStages,
    ) -> Self {
        let topology = cluster.pointer("/spec/topology").unwrap_or(&Value::Null);
        let pairs = |pointer: &str| -> Vec<(String, Value)> {
            topology
                .pointer(pointer)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| {
                    Some((
                        v.get("name")?.as_str()?.to_owned(),
                        v.get("value").cloned().unwrap_or(Value::Null),
                    ))
                })
                .collect()
        };
        Move {
            variables: pairs("/variables"),
            overrides: variable_lists(topology)
                .into_iter()
                .filter_map(|at| Some((at.owner()?, pairs(&at.pointer()))))
                .collect(),
            from_version: cluster.pointer("/spec/topology/version").and_then(Value::as_str),
            to_version,
            from,
            to,
            stages,
        }
    }
}

/// One field error of a refusal (`status.details.causes[]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cause {
    pub field: String,
    pub message: String,
}

/// Cluster API's answer to the dry run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DryRun {
    Accepted,
    /// Refused by admission (a webhook or the schema): the message and its causes.
    Refused {
        message: String,
        causes: Vec<Cause>,
    },
    /// The dry run could not be made (the API server unreachable, the Cluster missing, ...): why.
    Failed(String),
    /// Not asked (computed from the caches only).
    NotAsked,
}

/// Why a move is refused, in terms of the two classes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The new class's schema refuses the Cluster's value of `variable`, at `path` (`.a.b[0]`, empty for the
    /// value itself).
    VariableRefused {
        variable: String,
        path: String,
        why: String,
    },
    /// The Cluster sets `variable`, which the new class does not define.
    VariableRemoved { variable: String },
    /// The new class requires `variable`; the Cluster does not set it and the schema has no default.
    VariableRequired { variable: String },
    /// The Kubernetes version would go down.
    KubernetesDowngrade { from: String, to: String },
    /// More than one minor, and the new class has no `kubernetesVersions` to chain the steps.
    KubernetesSkipsMinors { from: String, to: String },
    /// The new class lists `kubernetesVersions` and the target (or a minor on the way) is not among them.
    KubernetesNotListed { version: String, listed: Vec<String> },
    /// Cluster API refused `variable` (at `field`) by a rule of the new class's schema that the preflight
    /// does not evaluate itself: `rules` are those the schema states (CEL `x-kubernetes-validations`,
    /// `oneOf`/`anyOf`/`allOf`/`not`), `message` what Cluster API said.
    VariableRule {
        variable: String,
        field: String,
        rules: Vec<String>,
        message: String,
    },
    /// `reason` concerns the value an override list sets (`of`: `machineDeployment md-0`, `controlPlane`).
    InOverride { of: String, reason: Box<Reason> },
    /// A refusal of the dry run that the classes do not explain, as Cluster API said it.
    ClusterApi { field: String, message: String },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::VariableRefused { variable, path, why } => {
                write!(f, "variable {variable}{path}: {why}")
            }
            Reason::VariableRemoved { variable } => write!(
                f,
                "variable {variable}: set by the Cluster, not defined by the new class"
            ),
            Reason::VariableRequired { variable } => write!(
                f,
                "variable {variable}: required by the new class, not set by the Cluster and without a default"
            ),
            Reason::KubernetesDowngrade { from, to } => {
                write!(f, "Kubernetes {from} -> {to}: the version cannot go down")
            }
            Reason::KubernetesSkipsMinors { from, to } => write!(
                f,
                "Kubernetes {from} -> {to}: more than one minor, and the new class has no kubernetesVersions to \
                 upgrade through"
            ),
            Reason::KubernetesNotListed { version, listed } => write!(
                f,
                "Kubernetes {version}: not in the new class's kubernetesVersions [{}]",
                listed.join(", ")
            ),
            Reason::VariableRule {
                variable,
                field,
                rules,
                message,
            } => write!(
                f,
                "variable {variable}: refused by a rule of the new class's schema ({}); Cluster API said: \
                 {field}: {message}",
                rules.join("; ")
            ),
            Reason::InOverride { of, reason } => write!(f, "{reason} (in the overrides of {of})"),
            Reason::ClusterApi { field, message } if field.is_empty() => write!(f, "{message}"),
            Reason::ClusterApi { field, message } => write!(f, "{field}: {message}"),
        }
    }
}

/// The verdict of a preflight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Cluster API accepted the dry run.
    Accepted,
    /// Cluster API refused it, or (without a dry run) the classes say it would.
    Refused,
    /// No dry run and nothing in the classes against the move: it would most likely be accepted.
    Likely,
}

/// The lifecycle hook runs a move goes through, with the release's stages for each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookRun {
    pub hook: Hook,
    /// The Kubernetes version of a per-step hook's step; `None` for the once-per-upgrade hooks.
    pub step: Option<String>,
    /// The release's stages for this hook (empty: the hook is answered at once).
    pub stages: Vec<String>,
}

/// The preflight's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preflight {
    pub from_class: String,
    pub to_class: String,
    pub verdict: Verdict,
    /// Why it is refused (or, without a dry run, would be).
    pub reasons: Vec<Reason>,
    /// Why the dry run could not be made, if it could not.
    pub dry_run_failed: Option<String>,
    /// `(from, to)` when the Kubernetes version changes.
    pub version_change: Option<(String, String)>,
    /// The hooks the move runs, in order, with their stages.
    pub hooks: Vec<HookRun>,
    /// A release with a single addon chart: it is applied when the class changes (no stages).
    pub single_chart: bool,
    /// The variables the move writes, when it changes them (a rollout's declared changes; the old class's
    /// defaults followed where the move was refused without): the verdict, reasons and hooks are those of the
    /// move with them.
    pub variables: Option<MoveVariables>,
    /// Why the move was refused before the old class's defaults were followed (when they were).
    pub refused_as_is: Vec<Reason>,
}

/// Explains Cluster API's answer `dry_run` to `change` from the two classes.
pub fn explain(change: &Move<'_>, dry_run: &DryRun) -> Preflight {
    let mut reasons = variable_reasons(change);
    reasons.extend(kubernetes_reasons(
        change.from_version,
        change.to_version,
        &change.to.kubernetes_versions,
    ));
    if let DryRun::Refused { message, causes } = dry_run {
        // What Cluster API said that the classes did not already explain.
        let unexplained: Vec<&Cause> = causes
            .iter()
            .filter(|c| !reasons.iter().any(|r| explains(r, c)))
            .collect();
        for cause in unexplained {
            reasons.push(
                rule_reason(change.to, cause).unwrap_or_else(|| Reason::ClusterApi {
                    field: cause.field.clone(),
                    message: cause.message.clone(),
                }),
            );
        }
        if reasons.is_empty() {
            reasons.push(Reason::ClusterApi {
                field: String::new(),
                message: message.clone(),
            });
        }
    }
    let verdict = match dry_run {
        DryRun::Accepted => Verdict::Accepted,
        DryRun::Refused { .. } => Verdict::Refused,
        DryRun::Failed(_) | DryRun::NotAsked if reasons.is_empty() => Verdict::Likely,
        DryRun::Failed(_) | DryRun::NotAsked => Verdict::Refused,
    };
    let version_change = match change.from_version {
        Some(from) if from != change.to_version => Some((from.to_owned(), change.to_version.to_owned())),
        _ => None,
    };
    Preflight {
        from_class: change.from.name.clone(),
        to_class: change.to.name.clone(),
        verdict,
        reasons,
        dry_run_failed: match dry_run {
            DryRun::Failed(why) => Some(why.clone()),
            _ => None,
        },
        hooks: hook_runs(change, version_change.as_ref()),
        version_change,
        single_chart: change.stages.is_none(),
        variables: None,
        refused_as_is: Vec::new(),
    }
}

/// How many of a set of Clusters could move to a class, and which could not and why: the fleet's view,
/// from the caches alone ([`DryRun::NotAsked`]; no request per Cluster).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetMoves {
    /// Clusters nothing in the classes holds back.
    pub movable: usize,
    /// Clusters held back as they are that nothing holds back with their old class's defaults followed
    /// ([`move_variables`]: a rollout with `spec.variables.followClassDefaults` moves them).
    pub movable_with_defaults: usize,
    /// `namespace/name` of each Cluster that could not move, with why, in the order given.
    pub refused: Vec<(String, Vec<Reason>)>,
}

/// Which of `clusters` (whole Cluster objects, e.g. from the watch cache, each with its class when known)
/// could move to `to` at `to_version`, as they are or with their old class's defaults followed, by
/// [`explain`] without a dry run.
pub fn fleet_moves<'a, C: std::borrow::Borrow<Value>>(
    clusters: impl IntoIterator<Item = (C, Option<&'a ClassView>)>,
    to: &ClassView,
    to_version: &str,
) -> FleetMoves {
    let unknown = ClassView::default();
    let mut moves = FleetMoves::default();
    for (cluster, from) in clusters {
        let cluster: &Value = cluster.borrow();
        let from = from.unwrap_or(&unknown);
        let change = Move::of_cluster(cluster, from, to, to_version, &None);
        let preflight = explain(&change, &DryRun::NotAsked);
        if preflight.verdict != Verdict::Refused {
            moves.movable += 1;
            continue;
        }
        let followed = move_variables(
            cluster
                .get("spec")
                .and_then(|s| s.get("topology"))
                .unwrap_or(&Value::Null),
            Some(from),
            &[],
        );
        let with_defaults = followed.follows_defaults() && {
            let mut changed = cluster.clone();
            if let Some(topology) = changed.pointer_mut("/spec/topology") {
                *topology = followed.applied_to(topology);
            }
            let again = explain(
                &Move::of_cluster(&changed, from, to, to_version, &None),
                &DryRun::NotAsked,
            );
            again.verdict != Verdict::Refused
        };
        if with_defaults {
            moves.movable_with_defaults += 1;
            continue;
        }
        let name = |field: &str| {
            cluster
                .pointer(&format!("/metadata/{field}"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        moves.refused.push((
            format!("{}/{}", name("namespace"), name("name")),
            preflight.reasons,
        ));
    }
    moves
}

/// How many refused Clusters a release's [`ReleaseMoves`] names.
pub const REFUSED_NAMED: usize = 3;

/// The moves to the release `target` (its ClusterClass `class`, in `namespace`, at Kubernetes `to_version`)
/// of the Clusters of its stack: those whose class is another release of the same provider and stack name
/// (any Kubernetes minor) in `namespace` ([`crate::capi::Cluster::stack_release`]). `clusters` are whole
/// Cluster objects, e.g. from the watch cache; `class_of` finds a ClusterClass by namespace and name (each
/// Cluster's own, for its defaults).
pub fn release_moves<'a>(
    target: &ReleaseId,
    namespace: &str,
    class: &ClassView,
    to_version: &str,
    clusters: impl IntoIterator<Item = &'a Cluster>,
    class_of: &dyn Fn(&str, &str) -> Option<ClassView>,
) -> ReleaseMoves {
    let mut of_stack: Vec<(&Cluster, &crate::capi::WholeObject, Option<ClassView>)> = clusters
        .into_iter()
        .filter(|cluster| {
            cluster.stack_release().is_some_and(|(id, class_namespace)| {
                class_namespace == namespace
                    && id.provider == target.provider
                    && id.name == target.name
                    && id != *target
            })
        })
        .filter_map(|cluster| {
            let from = cluster.class().and_then(|c| class_of(&c.namespace, &c.name));
            Some((cluster, cluster.object.as_ref()?, from))
        })
        .collect();
    of_stack.sort_by_key(|(c, _, _)| (c.metadata.namespace.as_deref(), c.metadata.name.as_deref()));
    // Each Cluster's view is parsed when its turn comes: never the whole fleet's at once.
    let moves = fleet_moves(
        of_stack
            .iter()
            .map(|(_, object, from)| (object.topology_view(), from.as_ref())),
        class,
        to_version,
    );
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    ReleaseMoves {
        clusters: count(of_stack.len()),
        movable: count(moves.movable),
        movable_with_defaults: count(moves.movable_with_defaults),
        refused: count(moves.refused.len()),
        refused_clusters: moves
            .refused
            .into_iter()
            .take(REFUSED_NAMED)
            .map(|(cluster, reasons)| RefusedMove {
                cluster,
                reasons: reasons.iter().map(ToString::to_string).collect(),
            })
            .collect(),
    }
}

/// Whether `reason` is what Cluster API's `cause` says: the same variable (`spec.topology.variables[NAME]`),
/// or the topology version.
fn explains(reason: &Reason, cause: &Cause) -> bool {
    let about_variable = |name: &str| {
        cause.field.contains(&format!("variables[{name}]")) || cause.message.contains(&format!("\"{name}\""))
    };
    match reason {
        Reason::VariableRefused { variable, .. }
        | Reason::VariableRemoved { variable }
        | Reason::VariableRequired { variable }
        | Reason::VariableRule { variable, .. } => about_variable(variable),
        Reason::KubernetesDowngrade { .. }
        | Reason::KubernetesSkipsMinors { .. }
        | Reason::KubernetesNotListed { .. } => cause.field.ends_with("topology.version"),
        Reason::InOverride { of, reason } => {
            // `...machineDeployments[md-0].variables.overrides[NAME]...`, `controlPlane.variables.overrides[NAME]`.
            let owner = of.rsplit(' ').next().unwrap_or_default();
            let variable = match reason.as_ref() {
                Reason::VariableRefused { variable, .. } | Reason::VariableRemoved { variable } => variable,
                _ => return false,
            };
            cause.field.contains(&format!("overrides[{variable}]"))
                && (owner == "controlPlane" || cause.field.contains(&format!("[{owner}]")))
        }
        Reason::ClusterApi { .. } => false,
    }
}

/// The variable a cause of Cluster API's refusal is about: `NAME` of `spec.topology.variables[NAME]...` or of
/// an override's `...variables.overrides[NAME]...`.
fn variable_of_field(field: &str) -> Option<&str> {
    ["variables[", "overrides["]
        .into_iter()
        .filter_map(|marker| field.rfind(marker).map(|i| i + marker.len()))
        .max()
        .and_then(|start| field[start..].split(']').next())
        .filter(|name| !name.is_empty())
}

/// A cause about a variable whose schema in the new class `to` has rules the preflight does not evaluate
/// (CEL, `oneOf`/`anyOf`/`allOf`/`not`): explained as refused by those rules.
fn rule_reason(to: &ClassView, cause: &Cause) -> Option<Reason> {
    let variable = variable_of_field(&cause.field)?;
    let definition = to.variable(variable)?;
    let mut rules = Vec::new();
    unevaluated_rules(&definition.schema, "", &mut rules);
    (!rules.is_empty()).then(|| Reason::VariableRule {
        variable: variable.to_owned(),
        field: cause.field.clone(),
        rules,
        message: cause.message.clone(),
    })
}

/// The rules of `schema` (at `at`, a path like `.a.b`) that [`validate`] does not evaluate, said as the
/// schema states them.
fn unevaluated_rules(schema: &Value, at: &str, rules: &mut Vec<String>) {
    let Some(object) = schema.as_object() else {
        return;
    };
    let place = if at.is_empty() {
        String::new()
    } else {
        format!(" at {at}")
    };
    for rule in object
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let text = rule.get("rule").and_then(Value::as_str).unwrap_or_default();
        let message = rule
            .get("message")
            .and_then(Value::as_str)
            .map(|m| format!(" ({m:?})"))
            .unwrap_or_default();
        rules.push(format!("CEL {text:?}{message}{place}"));
    }
    for keyword in ["oneOf", "anyOf", "allOf", "not"] {
        if object.contains_key(keyword) {
            rules.push(format!("{keyword}{place}"));
        }
    }
    for (name, property) in object
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
    {
        unevaluated_rules(property, &format!("{at}.{name}"), rules);
    }
    if let Some(items) = object.get("items") {
        unevaluated_rules(items, &format!("{at}[]"), rules);
    }
    if let Some(values) = object.get("additionalProperties") {
        unevaluated_rules(values, &format!("{at}[*]"), rules);
    }
}

/// The fields an unknown-fields error `why` at `path` names that the old class's schema `old` defaults
/// there: the new schema refuses what the old class wrote (the issue's `identityRef.type`).
fn old_defaults(old: &Value, path: &str, why: &str) -> Vec<String> {
    let Some(names) = why.strip_suffix(" field(s) are not specified in the variable schema") else {
        return Vec::new();
    };
    let mut schema = Some(old);
    for segment in path.split_inclusive(['.', '[']).filter(|s| !s.is_empty()) {
        let segment = segment.trim_end_matches(['.', '[']).trim_end_matches(']');
        if segment.is_empty() {
            continue;
        }
        schema = match segment.parse::<usize>() {
            Ok(_) => schema.and_then(|s| s.get("items")),
            Err(_) => schema.and_then(|s| s.pointer(&format!("/properties/{segment}"))),
        };
    }
    let Some(properties) = schema.and_then(|s| s.get("properties")) else {
        return Vec::new();
    };
    names
        .split(", ")
        .map(|n| n.trim_matches('"'))
        .filter(|n| properties.get(*n).is_some_and(|p| p.get("default").is_some()))
        .map(|n| format!("{n:?}"))
        .collect()
}

/// Why the new class refuses the value `value` of the variable `name`: not defined, or refused by its schema
/// (after its defaults are filled in), a field the old class defaulted said so.
fn value_reasons(change: &Move<'_>, name: &str, value: &Value) -> Vec<Reason> {
    let Some(definition) = change.to.variable(name) else {
        return vec![Reason::VariableRemoved {
            variable: name.to_owned(),
        }];
    };
    let mut value = value.clone();
    default_into(&definition.schema, &mut value);
    let old_schema = change.from.variable(name).map(|d| &d.schema);
    validate(&definition.schema, &value)
        .into_iter()
        .map(|(path, why)| {
            let why = match old_schema.map(|old| old_defaults(old, &path, &why)) {
                Some(defaulted) if !defaulted.is_empty() => format!(
                    "{why} ({} defaulted by the old class {})",
                    defaulted.join(", "),
                    change.from.name
                ),
                _ => why,
            };
            Reason::VariableRefused {
                variable: name.to_owned(),
                path,
                why,
            }
        })
        .collect()
}

fn variable_reasons(change: &Move<'_>) -> Vec<Reason> {
    let mut reasons = Vec::new();
    for (name, value) in &change.variables {
        reasons.extend(value_reasons(change, name, value));
    }
    for (of, overrides) in &change.overrides {
        for (name, value) in overrides {
            reasons.extend(
                value_reasons(change, name, value)
                    .into_iter()
                    .map(|reason| Reason::InOverride {
                        of: of.clone(),
                        reason: Box::new(reason),
                    }),
            );
        }
    }
    for definition in &change.to.variables {
        let set = change.variables.iter().any(|(n, _)| n == &definition.name);
        if definition.required && !set && definition.schema.get("default").is_none() {
            reasons.push(Reason::VariableRequired {
                variable: definition.name.clone(),
            });
        }
    }
    reasons
}

/// `vMAJOR.MINOR.PATCH` (pre-release and build suffixes ignored).
fn semver(version: &str) -> Option<(u64, u64, u64)> {
    let core = version.trim_start_matches('v');
    let core = core.split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    Some((
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    ))
}

/// Cluster API's rules for a topology version change (`validateTopologyVersionUpdate`,
/// `ValidateClusterForClusterClass`; docs/cluster-api-contract.md §3).
fn kubernetes_reasons(from: Option<&str>, to: &str, listed: &[String]) -> Vec<Reason> {
    let (Some(from), Some(target)) = (from, semver(to)) else {
        return Vec::new();
    };
    let Some(current) = semver(from) else {
        return Vec::new();
    };
    if target == current {
        return Vec::new();
    }
    if target < current {
        return vec![Reason::KubernetesDowngrade {
            from: from.to_owned(),
            to: to.to_owned(),
        }];
    }
    if listed.is_empty() {
        return if target.0 != current.0 || target.1 > current.1 + 1 {
            vec![Reason::KubernetesSkipsMinors {
                from: from.to_owned(),
                to: to.to_owned(),
            }]
        } else {
            Vec::new()
        };
    }
    let not_listed = |version: String| Reason::KubernetesNotListed {
        version,
        listed: listed.to_vec(),
    };
    let listed_versions: Vec<(u64, u64, u64)> = listed.iter().filter_map(|v| semver(v)).collect();
    if !listed_versions.contains(&target) {
        return vec![not_listed(to.to_owned())];
    }
    // Each minor on the way needs a version of its own in the list to step through.
    (current.1 + 1..target.1)
        .filter(|minor| !listed_versions.iter().any(|v| v.0 == target.0 && v.1 == *minor))
        .map(|minor| not_listed(format!("v{}.{minor}", target.0)))
        .collect()
}

/// The hooks the move runs: `BeforeClusterUpgrade` (cso applies the new class's addons when the class
/// changes, before Cluster API asks), and for a version change the per-step hooks of each minor on the way and
/// `AfterClusterUpgrade`.
fn hook_runs(change: &Move<'_>, version_change: Option<&(String, String)>) -> Vec<HookRun> {
    let stages = |hook: Hook| -> Vec<String> {
        change
            .stages
            .as_ref()
            .and_then(|s| s.get(&hook).cloned())
            .unwrap_or_default()
    };
    let run = |hook: Hook, step: Option<String>| HookRun {
        hook,
        step,
        stages: stages(hook),
    };
    let mut runs = vec![run(Hook::BeforeClusterUpgrade, None)];
    let Some((from, to)) = version_change else {
        return runs;
    };
    for step in upgrade_steps(from, to, &change.to.kubernetes_versions) {
        for hook in [
            Hook::BeforeControlPlaneUpgrade,
            Hook::AfterControlPlaneUpgrade,
            Hook::BeforeWorkersUpgrade,
            Hook::AfterWorkersUpgrade,
        ] {
            runs.push(run(hook, Some(step.clone())));
        }
    }
    runs.push(run(Hook::AfterClusterUpgrade, None));
    runs
}

/// The versions the control plane steps through (`GetUpgradePlanFromClusterClassVersions`: the newest
/// listed version of each minor after the current one, ending at the target; one step without a list).
fn upgrade_steps(from: &str, to: &str, listed: &[String]) -> Vec<String> {
    let (Some(current), Some(target)) = (semver(from), semver(to)) else {
        return vec![to.to_owned()];
    };
    let mut steps: Vec<String> = Vec::new();
    if !listed.is_empty() && target.0 == current.0 {
        for minor in current.1 + 1..target.1 {
            if let Some(newest) = listed
                .iter()
                .filter(|v| semver(v).is_some_and(|s| s.0 == target.0 && s.1 == minor))
                .max_by_key(|v| semver(v))
            {
                steps.push(newest.clone());
            }
        }
    }
    steps.push(to.to_owned());
    steps
}

/// Fills in the schema's defaults for properties `value` leaves out, as Cluster API defaults a variable's
/// value before validating it.
pub fn default_into(schema: &Value, value: &mut Value) {
    if let (Some(properties), Some(object)) = (
        schema.get("properties").and_then(Value::as_object),
        value.as_object_mut(),
    ) {
        for (name, property) in properties {
            match object.get_mut(name) {
                Some(inner) => default_into(property, inner),
                None => {
                    if let Some(default) = property.get("default") {
                        object.insert(name.clone(), default.clone());
                    }
                }
            }
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array_mut()) {
        for item in array {
            default_into(items, item);
        }
    }
}

/// Validates `value` against an OpenAPI v3 schema (the subset ClusterClass variables use): the errors, each
/// with the path of the offending part (`.a.b[0]`, empty for the value itself).
pub fn validate(schema: &Value, value: &Value) -> Vec<(String, String)> {
    let mut errors = Vec::new();
    check(schema, value, "", &mut errors);
    errors
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn check(schema: &Value, value: &Value, path: &str, errors: &mut Vec<(String, String)>) {
    let Some(schema) = schema.as_object() else {
        return;
    };
    let flag = |key: &str| schema.get(key).and_then(Value::as_bool).unwrap_or(false);
    let number = |key: &str| schema.get(key).and_then(Value::as_f64);
    let size = |key: &str| schema.get(key).and_then(Value::as_u64);
    if value.is_null() {
        if !flag("nullable") && schema.contains_key("type") {
            errors.push((path.to_owned(), "must not be null".into()));
        }
        return;
    }
    let actual = type_name(value);
    let int_or_string = flag("x-kubernetes-int-or-string");
    if let Some(wanted) = schema.get("type").and_then(Value::as_str) {
        let fits = wanted == actual
            || (wanted == "number" && actual == "integer")
            || (int_or_string && matches!(actual, "integer" | "string"));
        if !fits {
            errors.push((path.to_owned(), format!("must be of type {wanted}, not {actual}")));
            return;
        }
    }
    // This level's own errors come before those of the fields and items inside it.
    let start = errors.len();
    let mut own: Vec<String> = Vec::new();
    let mut error = |why: String| own.push(why);
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let allowed: Vec<String> = allowed.iter().map(Value::to_string).collect();
        error(format!("{value} is not one of [{}]", allowed.join(", ")));
    }
    match value {
        Value::String(s) => {
            let length = s.chars().count() as u64;
            if let Some(min) = size("minLength").filter(|min| length < *min) {
                error(format!("must be at least {min} characters long"));
            }
            if let Some(max) = size("maxLength").filter(|max| length > *max) {
                error(format!("must be at most {max} characters long"));
            }
            if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
                match regex::Regex::new(pattern) {
                    Ok(re) if !re.is_match(s) => error(format!("{s:?} does not match {pattern:?}")),
                    Ok(_) => {}
                    Err(e) => error(format!("the schema's pattern {pattern:?} is invalid: {e}")),
                }
            }
        }
        Value::Number(n) => {
            let n = n.as_f64().unwrap_or_default();
            if let Some(min) = number("minimum") {
                if flag("exclusiveMinimum") && n <= min {
                    error(format!("must be greater than {min}"));
                } else if n < min {
                    error(format!("must be at least {min}"));
                }
            }
            if let Some(max) = number("maximum") {
                if flag("exclusiveMaximum") && n >= max {
                    error(format!("must be less than {max}"));
                } else if n > max {
                    error(format!("must be at most {max}"));
                }
            }
        }
        Value::Array(items) => {
            let count = items.len() as u64;
            if let Some(min) = size("minItems").filter(|min| count < *min) {
                error(format!("must have at least {min} items"));
            }
            if let Some(max) = size("maxItems").filter(|max| count > *max) {
                error(format!("must have at most {max} items"));
            }
            if flag("uniqueItems") && items.iter().enumerate().any(|(i, a)| items[..i].contains(a)) {
                error("must not have duplicate items".into());
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check(item_schema, item, &format!("{path}[{i}]"), errors);
                }
            }
        }
        Value::Object(fields) => {
            let count = fields.len() as u64;
            if let Some(min) = size("minProperties").filter(|min| count < *min) {
                error(format!("must have at least {min} fields"));
            }
            if let Some(max) = size("maxProperties").filter(|max| count > *max) {
                error(format!("must have at most {max} fields"));
            }
            for required in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                if !fields.contains_key(required) {
                    error(format!("field {required:?} is required"));
                }
            }
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let mut unknown = Vec::new();
            for (name, inner) in fields {
                let inner_path = format!("{path}.{name}");
                match (properties.and_then(|p| p.get(name)), additional) {
                    (Some(property), _) => check(property, inner, &inner_path, errors),
                    (None, Some(Value::Object(_))) => {
                        check(additional.unwrap_or(&Value::Null), inner, &inner_path, errors);
                    }
                    (None, Some(Value::Bool(true))) => {}
                    (None, _) if flag("x-kubernetes-preserve-unknown-fields") => {}
                    (None, _) => unknown.push(name.as_str()),
                }
            }
            if !unknown.is_empty() {
                // Cluster API's words (`variables.ValidateClusterVariable`, pruning).
                let quoted: Vec<String> = unknown.iter().map(|n| format!("{n:?}")).collect();
                errors.push((
                    path.to_owned(),
                    format!(
                        "{} field(s) are not specified in the variable schema",
                        quoted.join(", ")
                    ),
                ));
            }
        }
        _ => {}
    }
    errors.splice(start..start, own.into_iter().map(|why| (path.to_owned(), why)));
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use rstest::rstest;
    use serde_json::json;

    use super::*;

    /// The identityRef of the issue: openstack-scs-1-33 defaulted `type`, 1-34 no longer has it.
    fn identity_ref(with_type: bool) -> Value {
        let mut properties = json!({
            "name": {"type": "string", "default": "openstack"},
            "cloudName": {"type": "string", "default": "openstack"},
        });
        if with_type {
            properties["type"] = json!({"type": "string", "default": "Secret", "enum": ["Secret"]});
        }
        json!({"type": "object", "properties": properties})
    }

    fn class(name: &str, variables: Value, kubernetes_versions: &[&str]) -> ClassView {
        ClassView::from_object(&json!({
            "metadata": {"name": name},
            "spec": {"variables": variables, "kubernetesVersions": kubernetes_versions},
        }))
    }

    fn cluster(version: &str, variables: Value) -> Value {
        json!({"spec": {"topology": {"version": version, "variables": variables}}})
    }

    fn old_class() -> ClassView {
        class(
            "openstack-scs-1-33-v1",
            json!([
                {"name": "identityRef", "required": false, "schema": {"openAPIV3Schema": identity_ref(true)}},
                {"name": "flavor", "required": false, "schema": {"openAPIV3Schema": {"type": "string", "enum": ["small", "large"]}}},
                {"name": "legacy", "required": false, "schema": {"openAPIV3Schema": {"type": "boolean"}}},
            ]),
            &[],
        )
    }

    fn new_class(kubernetes_versions: &[&str]) -> ClassView {
        class(
            "openstack-scs-1-34-v1",
            json!([
                {"name": "identityRef", "required": false, "schema": {"openAPIV3Schema": identity_ref(false)}},
                {"name": "flavor", "required": false, "schema": {"openAPIV3Schema": {"type": "string", "enum": ["large"]}}},
                {"name": "legacy", "required": false, "schema": {"openAPIV3Schema": {"type": "boolean"}}},
                {"name": "region", "required": true, "schema": {"openAPIV3Schema": {"type": "string", "minLength": 1}}},
                {"name": "dns", "required": true, "schema": {"openAPIV3Schema": {"type": "string", "default": "1.1.1.1"}}},
                {"name": "ports", "required": false, "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-validations": [{"rule": "self.min <= self.max", "message": "min must not exceed max"}],
                    "properties": {"min": {"type": "integer"}, "max": {"type": "integer"},
                        "auth": {"type": "object", "oneOf": [{"required": ["token"]}, {"required": ["cert"]}],
                            "properties": {"token": {"type": "string"}, "cert": {"type": "string"}}}}}}},
            ]),
            kubernetes_versions,
        )
    }

    fn stages() -> ReleaseStages {
        Some(BTreeMap::from([
            (
                Hook::BeforeClusterUpgrade,
                vec!["cni".to_owned(), "metrics-server".to_owned()],
            ),
            (Hook::AfterClusterUpgrade, vec!["cni".to_owned()]),
        ]))
    }

    /// The refusal, as the preflight explains it: the field, and that the old class wrote it.
    const TYPE_REFUSED: &str = "\"type\" field(s) are not specified in the variable schema (\"type\" defaulted \
                                by the old class openstack-scs-1-33-v1)";

    const IDENTITY: &str = "{\"cloudName\":\"openstack\",\"name\":\"openstack\",\"type\":\"Secret\"}";

    /// What Cluster API v1.14 answered in the issue.
    fn refused_identity() -> DryRun {
        DryRun::Refused {
            message: format!(
                "Cluster.cluster.x-k8s.io \"c1\" is invalid: spec.topology.variables[identityRef]: Invalid value: \
                 {IDENTITY}: failed validation: \"type\" field(s) are not specified in the variable schema of \
                 variable \"identityRef\""
            ),
            causes: vec![Cause {
                field: "spec.topology.variables[identityRef]".into(),
                message: format!(
                    "Invalid value: {IDENTITY}: failed validation: \"type\" field(s) are not specified in the \
                     variable schema of variable \"identityRef\""
                ),
            }],
        }
    }

    fn identity_value() -> Value {
        serde_json::from_str(IDENTITY).unwrap()
    }

    #[rstest]
    // The case: the old class's default `type` is unknown to the new schema; Cluster API refuses.
    #[case::field_the_new_schema_lacks(
        json!([{"name": "identityRef", "value": identity_value()}, {"name": "region", "value": "fra"}]),
        "v1.33.4", "v1.34.2", &[][..], refused_identity(), Verdict::Refused,
        vec![Reason::VariableRefused {
            variable: "identityRef".into(), path: String::new(),
            why: TYPE_REFUSED.into(),
        }]
    )]
    // The same, explained without a dry run (the fleet's counts).
    #[case::without_a_dry_run(
        json!([{"name": "identityRef", "value": identity_value()}, {"name": "region", "value": "fra"}]),
        "v1.33.4", "v1.34.2", &[][..], DryRun::NotAsked, Verdict::Refused,
        vec![Reason::VariableRefused {
            variable: "identityRef".into(), path: String::new(),
            why: TYPE_REFUSED.into(),
        }]
    )]
    #[case::narrowed_enum_removed_variable_and_newly_required(
        json!([{"name": "flavor", "value": "small"}, {"name": "gone", "value": 1}]),
        "v1.33.4", "v1.34.2", &[][..], DryRun::NotAsked, Verdict::Refused,
        vec![
            Reason::VariableRefused { variable: "flavor".into(), path: String::new(), why: "\"small\" is not one of [\"large\"]".into() },
            Reason::VariableRemoved { variable: "gone".into() },
            Reason::VariableRequired { variable: "region".into() },
        ]
    )]
    #[case::values_the_new_class_accepts(
        json!([{"name": "identityRef", "value": {"name": "x"}}, {"name": "flavor", "value": "large"}, {"name": "region", "value": "fra"}]),
        "v1.33.4", "v1.34.2", &[][..], DryRun::Accepted, Verdict::Accepted, vec![]
    )]
    #[case::nothing_against_it_without_a_dry_run(
        json!([{"name": "region", "value": "fra"}]),
        "v1.34.0", "v1.34.2", &[][..], DryRun::NotAsked, Verdict::Likely, vec![]
    )]
    #[case::two_minors_without_kubernetes_versions(
        json!([{"name": "region", "value": "fra"}]),
        "v1.33.4", "v1.35.1", &[][..], DryRun::NotAsked, Verdict::Refused,
        vec![Reason::KubernetesSkipsMinors { from: "v1.33.4".into(), to: "v1.35.1".into() }]
    )]
    #[case::two_minors_through_kubernetes_versions(
        json!([{"name": "region", "value": "fra"}]),
        "v1.33.4", "v1.35.1", &["v1.33.4", "v1.34.2", "v1.35.1"][..], DryRun::NotAsked, Verdict::Likely, vec![]
    )]
    #[case::a_minor_missing_from_kubernetes_versions(
        json!([{"name": "region", "value": "fra"}]),
        "v1.33.4", "v1.35.1", &["v1.33.4", "v1.35.1"][..], DryRun::NotAsked, Verdict::Refused,
        vec![Reason::KubernetesNotListed { version: "v1.34".into(), listed: vec!["v1.33.4".into(), "v1.35.1".into()] }]
    )]
    #[case::down(
        json!([{"name": "region", "value": "fra"}]),
        "v1.34.3", "v1.34.2", &[][..], DryRun::NotAsked, Verdict::Refused,
        vec![Reason::KubernetesDowngrade { from: "v1.34.3".into(), to: "v1.34.2".into() }]
    )]
    // Cluster API refuses for a reason the classes do not show: said as it said it.
    #[case::refused_for_another_reason(
        json!([{"name": "region", "value": "fra"}]),
        "v1.34.0", "v1.34.2", &[][..],
        DryRun::Refused { message: "denied".into(), causes: vec![Cause {
            field: "spec.topology.version".into(), message: "AfterClusterUpgrade hook is pending".into() }] },
        Verdict::Refused,
        vec![Reason::ClusterApi { field: "spec.topology.version".into(), message: "AfterClusterUpgrade hook is pending".into() }]
    )]
    // Refused by rules the preflight does not evaluate (CEL, oneOf): explained as such, with the rules, for
    // the Cluster's own value and for an override.
    #[case::refused_by_a_cel_rule(
        json!([{"name": "region", "value": "fra"}, {"name": "ports", "value": {"min": 9, "max": 1}}]),
        "v1.34.0", "v1.34.2", &[][..],
        DryRun::Refused { message: "denied".into(), causes: vec![Cause {
            field: "spec.topology.variables[ports].value".into(), message: "Invalid value: \"object\": min must not exceed max".into() }] },
        Verdict::Refused,
        vec![Reason::VariableRule {
            variable: "ports".into(),
            field: "spec.topology.variables[ports].value".into(),
            rules: vec!["CEL \"self.min <= self.max\" (\"min must not exceed max\")".into(), "oneOf at .auth".into()],
            message: "Invalid value: \"object\": min must not exceed max".into(),
        }]
    )]
    #[case::an_override_refused_by_one_of(
        json!([{"name": "region", "value": "fra"}]),
        "v1.34.0", "v1.34.2", &[][..],
        DryRun::Refused { message: "denied".into(), causes: vec![Cause {
            field: "spec.topology.workers.machineDeployments[md-0].variables.overrides[ports].value.auth".into(),
            message: "must validate one and only one schema (oneOf)".into() }] },
        Verdict::Refused,
        vec![Reason::VariableRule {
            variable: "ports".into(),
            field: "spec.topology.workers.machineDeployments[md-0].variables.overrides[ports].value.auth".into(),
            rules: vec!["CEL \"self.min <= self.max\" (\"min must not exceed max\")".into(), "oneOf at .auth".into()],
            message: "must validate one and only one schema (oneOf)".into(),
        }]
    )]
    // The dry run could not be made: the classes decide, and the failure is reported.
    #[case::dry_run_failed(
        json!([{"name": "legacy", "value": "yes"}, {"name": "region", "value": "fra"}]),
        "v1.34.0", "v1.34.2", &[][..], DryRun::Failed("connection refused".into()), Verdict::Refused,
        vec![Reason::VariableRefused { variable: "legacy".into(), path: String::new(), why: "must be of type boolean, not string".into() }]
    )]
    fn explains_the_move(
        #[case] variables: Value,
        #[case] from: &str,
        #[case] to: &str,
        #[case] kubernetes_versions: &[&str],
        #[case] dry_run: DryRun,
        #[case] verdict: Verdict,
        #[case] reasons: Vec<Reason>,
    ) {
        let cluster = cluster(from, variables);
        let (old, new, stages) = (old_class(), new_class(kubernetes_versions), stages());
        let preflight = explain(&Move::of_cluster(&cluster, &old, &new, to, &stages), &dry_run);
        assert_eq!(preflight.reasons, reasons);
        assert_eq!(preflight.verdict, verdict);
        assert_eq!(preflight.from_class, "openstack-scs-1-33-v1");
        assert_eq!(preflight.to_class, "openstack-scs-1-34-v1");
    }

    #[test]
    fn a_value_an_override_sets_is_judged_like_the_clusters_own_and_said_with_its_owner() {
        let mut cluster = cluster("v1.34.0", json!([{"name": "region", "value": "fra"}]));
        cluster["spec"]["topology"]["workers"] = json!({"machineDeployments": [
            {"name": "md-0", "class": "default-worker", "variables": {"overrides": [
                {"name": "flavor", "value": "small"}, {"name": "gone", "value": 1}]}}]});
        let (old, new, stages) = (old_class(), new_class(&[]), stages());
        let change = Move::of_cluster(&cluster, &old, &new, "v1.34.2", &stages);
        let in_md0 = |reason: Reason| Reason::InOverride {
            of: "machineDeployment md-0".into(),
            reason: Box::new(reason),
        };
        let expected = vec![
            in_md0(Reason::VariableRefused {
                variable: "flavor".into(),
                path: String::new(),
                why: "\"small\" is not one of [\"large\"]".into(),
            }),
            in_md0(Reason::VariableRemoved {
                variable: "gone".into(),
            }),
        ];
        // Cluster API's causes about those overrides are what the classes say: not repeated.
        let refused = DryRun::Refused {
            message: "denied".into(),
            causes: vec![Cause {
                field: "spec.topology.workers.machineDeployments[md-0].variables.overrides[flavor].value"
                    .into(),
                message: "Unsupported value: \"small\"".into(),
            }],
        };
        let preflight = explain(&change, &refused);
        assert_eq!(preflight.reasons, expected);
        assert_eq!(
            preflight.reasons[0].to_string(),
            "variable flavor: \"small\" is not one of [\"large\"] (in the overrides of machineDeployment md-0)"
        );
        assert_eq!(explain(&change, &DryRun::NotAsked).verdict, Verdict::Refused);
    }

    #[test]
    fn a_refusal_the_classes_explain_is_not_repeated_and_a_failed_dry_run_is_reported() {
        let cluster = cluster(
            "v1.33.4",
            json!([{"name": "identityRef", "value": identity_value()}, {"name": "region", "value": "x"}]),
        );
        let (old, new, stages) = (old_class(), new_class(&[]), stages());
        let change = Move::of_cluster(&cluster, &old, &new, "v1.34.2", &stages);
        let preflight = explain(&change, &refused_identity());
        assert_eq!(preflight.reasons.len(), 1, "{:?}", preflight.reasons);
        assert_eq!(
            preflight.reasons[0].to_string(),
            format!("variable identityRef: {TYPE_REFUSED}")
        );
        assert_eq!(preflight.dry_run_failed, None);
        let failed = explain(&change, &DryRun::Failed("the API server is unreachable".into()));
        assert_eq!(
            failed.dry_run_failed.as_deref(),
            Some("the API server is unreachable")
        );
        assert_eq!(failed.verdict, Verdict::Refused);
    }

    #[rstest]
    // A class move alone: cso runs BeforeClusterUpgrade's stages when the class changes.
    #[case::class_only("v1.34.2", &[][..], vec![
        (Hook::BeforeClusterUpgrade, None, 2)])]
    #[case::one_minor("v1.35.1", &[][..], vec![
        (Hook::BeforeClusterUpgrade, None, 2),
        (Hook::BeforeControlPlaneUpgrade, Some("v1.35.1"), 0), (Hook::AfterControlPlaneUpgrade, Some("v1.35.1"), 0),
        (Hook::BeforeWorkersUpgrade, Some("v1.35.1"), 0), (Hook::AfterWorkersUpgrade, Some("v1.35.1"), 0),
        (Hook::AfterClusterUpgrade, None, 1)])]
    #[case::chained("v1.36.0", &["v1.34.2", "v1.35.0", "v1.35.1", "v1.36.0"][..], vec![
        (Hook::BeforeClusterUpgrade, None, 2),
        (Hook::BeforeControlPlaneUpgrade, Some("v1.35.1"), 0), (Hook::AfterControlPlaneUpgrade, Some("v1.35.1"), 0),
        (Hook::BeforeWorkersUpgrade, Some("v1.35.1"), 0), (Hook::AfterWorkersUpgrade, Some("v1.35.1"), 0),
        (Hook::BeforeControlPlaneUpgrade, Some("v1.36.0"), 0), (Hook::AfterControlPlaneUpgrade, Some("v1.36.0"), 0),
        (Hook::BeforeWorkersUpgrade, Some("v1.36.0"), 0), (Hook::AfterWorkersUpgrade, Some("v1.36.0"), 0),
        (Hook::AfterClusterUpgrade, None, 1)])]
    fn names_the_hooks_and_stages_the_move_runs(
        #[case] to: &str,
        #[case] kubernetes_versions: &[&str],
        #[case] runs: Vec<(Hook, Option<&str>, usize)>,
    ) {
        let cluster = cluster("v1.34.2", json!([{"name": "region", "value": "x"}]));
        let (old, new, stages) = (old_class(), new_class(kubernetes_versions), stages());
        let preflight = explain(
            &Move::of_cluster(&cluster, &old, &new, to, &stages),
            &DryRun::NotAsked,
        );
        let got: Vec<(Hook, Option<&str>, usize)> = preflight
            .hooks
            .iter()
            .map(|r| (r.hook, r.step.as_deref(), r.stages.len()))
            .collect();
        assert_eq!(got, runs);
        assert!(!preflight.single_chart);
        assert_eq!(preflight.version_change.is_some(), to != "v1.34.2");
    }

    #[test]
    fn counts_which_clusters_of_a_fleet_could_move_and_why_not() {
        let named = |name: &str, version: &str, variables: Value| {
            let mut cluster = cluster(version, variables);
            cluster["metadata"] = json!({"namespace": "team", "name": name});
            cluster
        };
        let clusters = [
            named("a", "v1.33.4", json!([{"name": "region", "value": "fra"}])),
            named(
                "b",
                "v1.33.4",
                json!([{"name": "identityRef", "value": identity_value()}, {"name": "region", "value": "x"}]),
            ),
            named("c", "v1.32.0", json!([{"name": "region", "value": "fra"}])),
            named(
                "d",
                "v1.34.0",
                json!([{"name": "region", "value": "fra"}, {"name": "flavor", "value": "large"}]),
            ),
        ];
        let moves = fleet_moves(clusters.iter().map(|c| (c, None)), &new_class(&[]), "v1.34.2");
        assert_eq!(moves.movable, 2);
        let refused: Vec<(&str, Vec<String>)> = moves
            .refused
            .iter()
            .map(|(name, reasons)| (name.as_str(), reasons.iter().map(ToString::to_string).collect()))
            .collect();
        assert_eq!(
            refused,
            [
                ("team/b", vec!["variable identityRef: \"type\" field(s) are not specified in the variable schema".to_owned()]),
                ("team/c", vec!["Kubernetes v1.32.0 -> v1.34.2: more than one minor, and the new class has no kubernetesVersions to upgrade through".to_owned()]),
            ]
        );
    }

    #[test]
    fn a_release_counts_the_clusters_of_its_stack_on_other_releases() {
        let of = |namespace: &str, name: &str, class: &str, version: &str, variables: Value| -> Cluster {
            serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
                "metadata": {"namespace": namespace, "name": name},
                "spec": {"topology": {"classRef": {"name": class}, "version": version, "variables": variables}},
            }))
            .unwrap()
        };
        let region = json!([{"name": "region", "value": "fra"}]);
        let clusters = [
            of("team", "a", "openstack-scs-1-33-v1", "v1.33.4", region.clone()),
            of(
                "team",
                "b",
                "openstack-scs-1-33-v1",
                "v1.33.4",
                json!([{"name": "identityRef", "value": identity_value()}, {"name": "region", "value": "x"}]),
            ),
            of(
                "team",
                "c",
                "openstack-scs-1-34-v2",
                "v1.34.2",
                json!([{"name": "gone", "value": 1}]),
            ),
            // Not counted: already on the release, another stack, another namespace, no class of a stack.
            of(
                "team",
                "d",
                "openstack-scs-1-34-v1",
                "v1.34.2",
                json!([{"name": "gone", "value": 1}]),
            ),
            of(
                "team",
                "e",
                "openstack-other-1-33-v1",
                "v1.33.4",
                json!([{"name": "gone", "value": 1}]),
            ),
            of(
                "elsewhere",
                "f",
                "openstack-scs-1-33-v1",
                "v1.33.4",
                json!([{"name": "gone", "value": 1}]),
            ),
            of(
                "team",
                "g",
                "my-own-class",
                "v1.33.4",
                json!([{"name": "gone", "value": 1}]),
            ),
        ];
        let target = ReleaseId::parse_tag("openstack-scs-1-34-v1").unwrap();
        let moves = release_moves(&target, "team", &new_class(&[]), "v1.34.2", &clusters, &|_, _| {
            None
        });
        assert_eq!(
            moves,
            ReleaseMoves {
                clusters: 3,
                movable: 1,
                movable_with_defaults: 0,
                refused: 2,
                refused_clusters: vec![
                    RefusedMove {
                        cluster: "team/b".into(),
                        reasons: vec![
                            "variable identityRef: \"type\" field(s) are not specified in the variable schema".into()
                        ],
                    },
                    RefusedMove {
                        cluster: "team/c".into(),
                        reasons: vec![
                            "variable gone: set by the Cluster, not defined by the new class".into(),
                            "variable region: required by the new class, not set by the Cluster and without a default"
                                .into(),
                        ],
                    },
                ],
            }
        );

        // With b's class at hand: its identityRef.type is what that class defaulted, so b could move with the
        // class's defaults followed; c's class is not at hand, it stays refused.
        let class_of = |namespace: &str, name: &str| {
            (namespace == "team" && name == "openstack-scs-1-33-v1").then(old_class)
        };
        let moves = release_moves(&target, "team", &new_class(&[]), "v1.34.2", &clusters, &class_of);
        assert_eq!(
            (moves.movable, moves.movable_with_defaults, moves.refused),
            (1, 1, 1)
        );
        assert_eq!(moves.refused_clusters[0].cluster, "team/c");
    }

    #[rstest]
    #[case::unknown_nested_field(
        json!({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}}}),
        json!({"a": {"b": "x", "c": 1}}), vec![(".a", "\"c\" field(s) are not specified in the variable schema")])]
    #[case::preserve_unknown_fields(
        json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}), json!({"c": 1}), vec![])]
    #[case::additional_properties_schema(
        json!({"type": "object", "additionalProperties": {"type": "integer", "maximum": 3}}),
        json!({"x": 2, "y": 4}), vec![(".y", "must be at most 3")])]
    #[case::required_field(
        json!({"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}),
        json!({}), vec![("", "field \"name\" is required")])]
    #[case::pattern_and_length(
        json!({"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}),
        json!("Abcd"), vec![("", "must be at most 3 characters long"), ("", "\"Abcd\" does not match \"^[a-z]+$\"")])]
    #[case::items(
        json!({"type": "array", "maxItems": 2, "items": {"type": "string"}}),
        json!(["a", 1, "c"]), vec![("", "must have at most 2 items"), ("[1]", "must be of type string, not integer")])]
    #[case::integer_is_a_number(json!({"type": "number", "minimum": 1}), json!(2), vec![])]
    #[case::exclusive_minimum(
        json!({"type": "integer", "minimum": 1, "exclusiveMinimum": true}), json!(1), vec![("", "must be greater than 1")])]
    #[case::int_or_string(json!({"x-kubernetes-int-or-string": true}), json!("50%"), vec![])]
    #[case::null_not_allowed(json!({"type": "string"}), Value::Null, vec![("", "must not be null")])]
    #[case::nullable(json!({"type": "string", "nullable": true}), Value::Null, vec![])]
    fn validates_the_openapi_subset_of_variables(
        #[case] schema: Value,
        #[case] value: Value,
        #[case] errors: Vec<(&str, &str)>,
    ) {
        let got = validate(&schema, &value);
        let got: Vec<(&str, &str)> = got.iter().map(|(p, w)| (p.as_str(), w.as_str())).collect();
        assert_eq!(got, errors);
    }

    #[test]
    fn names_the_unknown_fields_the_old_class_defaulted_at_their_path() {
        let old = json!({"type": "array", "items": {"type": "object", "properties": {
            "auth": {"type": "object", "properties": {"b": {"type": "string", "default": "x"}, "c": {"type": "string"}}}}}});
        let why = "\"b\", \"c\" field(s) are not specified in the variable schema";
        assert_eq!(old_defaults(&old, "[0].auth", why), ["\"b\""]);
        assert!(old_defaults(&old, "[0].auth", "must be at most 3").is_empty());
        assert!(old_defaults(&old, "[0].other", why).is_empty());
    }

    #[test]
    fn defaults_fill_missing_properties_before_validation() {
        let schema = json!({"type": "object", "required": ["usernameClaim"],
            "properties": {"usernameClaim": {"type": "string", "default": "sub"}, "clientID": {"type": "string"}}});
        let mut value = json!({"clientID": "kubectl"});
        default_into(&schema, &mut value);
        assert_eq!(value, json!({"clientID": "kubectl", "usernameClaim": "sub"}));
        assert!(validate(&schema, &value).is_empty());
    }
}
