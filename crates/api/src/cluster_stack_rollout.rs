//! `ClusterStackRollout`: moves the Clusters of a ClusterStack to one of its releases in waves, each wave
//! checked by the preflight of the class move before a Cluster moves and watched for health before the next
//! wave starts. The rules (wave assignment, the next step, pause and resume) are [`crate::rules::rollout`].
#![allow(
    clippy::duplicated_attributes,
    reason = "kube-derive takes one printcolumn(...) per column; clippy reads the repeated keys as duplicates"
)]

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::conditions::{Condition, HasConditions};

/// A rollout of one release of a ClusterStack to its Clusters, in waves.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "clusterstack.x-k8s.io",
    version = "v1alpha1",
    kind = "ClusterStackRollout",
    namespaced,
    status = "ClusterStackRolloutStatus",
    shortname = "csro",
    label("cluster.x-k8s.io/v1beta1", "v1beta1"),
    // `clusterctl move` moves every rollout (no owner: its Clusters are found by label).
    label("clusterctl.cluster.x-k8s.io", ""),
    label("clusterctl.cluster.x-k8s.io/move", ""),
    printcolumn(name = "ClusterStack", type_ = "string", json_path = ".spec.clusterStack"),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.version"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Wave", type_ = "string", json_path = ".status.currentWave"),
    printcolumn(
        name = "Done",
        type_ = "integer",
        json_path = ".status.done",
        description = "Clusters on the release with their addons ready and Cluster API up to date"
    ),
    printcolumn(
        name = "Clusters",
        type_ = "integer",
        json_path = ".status.clusters",
        description = "Clusters taking part"
    ),
    printcolumn(
        name = "Failing",
        type_ = "integer",
        json_path = ".status.failing",
        description = "Moved Clusters not done within the wave timeout"
    ),
    printcolumn(
        name = "Skipped",
        type_ = "integer",
        json_path = ".status.skipped",
        description = "Clusters refused by the preflight or moved back: not on the release"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Ready')].message"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStackRolloutSpec {
    /// The ClusterStack (in this namespace) whose release the Clusters move to.
    #[schemars(length(min = 1))]
    pub cluster_stack: String,
    /// The version of the ClusterStack's release the Clusters move to, in dot form: `v2`.
    #[schemars(length(min = 1))]
    pub version: String,
    /// Which Clusters of the stack take part; every Cluster of the stack on an older release when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
    /// The waves, in order; a Cluster belongs to the first wave whose selector matches it, a wave without a
    /// selector takes every Cluster left. Without waves, all Clusters are one wave, `all`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waves: Vec<Wave>,
    /// How long a wave's Clusters stay done before the next wave starts (Go duration: `10m`). Default `0s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bake_time: Option<String>,
    /// How long a moved Cluster may take to be done (its addons ready on the release, Cluster API up to
    /// date) before it counts as failing and pauses the rollout (Go duration). Default `30m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave_timeout: Option<String>,
    /// Holds the rollout: no Cluster is moved while set; what was moved goes on by itself.
    #[serde(default)]
    pub paused: bool,
    /// What the moves do to the Clusters' variables: changes declared for every move, and following the old
    /// class's defaults for a Cluster the plain move would refuse.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variables: Option<RolloutVariables>,
}

/// What a rollout's moves may do to the Clusters' variables.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutVariables {
    /// A Cluster that Cluster API would refuse to move as it is moves with every value (or field of one) that
    /// equals what its old class's schema defaults left out, in the same patch as the class: the new class
    /// defaults it, or nothing does when it no longer defines it. Values its owner changed from the default
    /// are never touched (a Cluster refused over one stays). Judged by value: a default written by hand follows
    /// the class too. Inside an override (`workers.*[].variables.overrides`, `controlPlane.variables.overrides`)
    /// only fields follow: an override equal to the default stays, as it overrides the Cluster's value. Each
    /// Cluster's changes are in `status.moves[].variablesDropped` and its `ClusterMoved` event. Default off.
    #[serde(default)]
    pub follow_class_defaults: bool,
    /// Values every move sets, in the same patch as the class, wherever the Cluster sets the variable (its own
    /// list and each override); a variable the Cluster does not set is added to its own list, never to an
    /// override. Made after `followClassDefaults`. Each Cluster's changes, with the values they replaced, are
    /// in `status.moves[].variablesChanged` and its `ClusterMoved` event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<VariableValue>,
    /// Variables (or fields inside them) every move removes, in the same patch as the class, wherever the
    /// Cluster sets them; what a Cluster does not set is no change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<VariableField>,
}

/// A variable, or a field inside its value, and the value a move sets there.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VariableValue {
    /// The variable's name, as the ClusterClass defines it.
    #[schemars(length(min = 1))]
    pub name: String,
    /// A field inside the variable's value, its keys joined by dots (`groupsPrefix`, `claims.user`); the
    /// whole value when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The value (any JSON).
    #[schemars(schema_with = "crate::crd::any_value")]
    pub value: serde_json::Value,
}

/// A variable, or a field inside its value, that a move removes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VariableField {
    /// The variable's name, as the ClusterClass defines it.
    #[schemars(length(min = 1))]
    pub name: String,
    /// A field inside the variable's value, its keys joined by dots; the whole variable when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

impl ClusterStackRolloutSpec {
    /// A rollout of `cluster_stack`'s release `version` (dot form) to all its Clusters at once: no selector,
    /// one wave, no bake, the default wave timeout, not paused.
    pub fn to(cluster_stack: &str, version: &str) -> Self {
        ClusterStackRolloutSpec {
            cluster_stack: cluster_stack.to_owned(),
            version: version.to_owned(),
            cluster_selector: None,
            waves: Vec::new(),
            bake_time: None,
            wave_timeout: None,
            paused: false,
            variables: None,
        }
    }
}

/// One wave of a rollout.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Wave {
    /// The wave's name, unique within the rollout.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Which Clusters belong to this wave (of those not in an earlier wave); all of them when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
    /// At most this many of the wave's Clusters moved and not done at a time; all at once when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_in_progress: Option<u32>,
}

/// A label selector (the shape of `metav1.LabelSelector`): every `matchLabels` entry and every expression
/// must hold. An empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One expression of a [`LabelSelector`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelectorRequirement {
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    #[schemars(regex(pattern = r"^(In|NotIn|Exists|DoesNotExist)$"))]
    pub operator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// The phase of a rollout.
pub mod phase {
    /// Waiting for the release (its ClusterStackRelease ready) or the ClusterStack.
    pub const PENDING: &str = "Pending";
    pub const PROGRESSING: &str = "Progressing";
    /// Held by `spec.paused` or by a failing Cluster.
    pub const PAUSED: &str = "Paused";
    /// Every wave is done and every Cluster taking part is on the release.
    pub const COMPLETED: &str = "Completed";
    /// Every wave is through, but Clusters were skipped (refused by the preflight, or moved back to an older
    /// release after the rollout moved them): they are not on the release. It turns `Completed` once each is
    /// on the release (a refused Cluster that changes is asked again), on a newer one, or out of the rollout's
    /// scope.
    pub const INCOMPLETE: &str = "Incomplete";
}

/// What the operator last observed of a rollout.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStackRolloutStatus {
    /// `Pending`, `Progressing`, `Paused`, `Completed` or `Incomplete` (every wave through, Clusters
    /// skipped).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
    /// The wave Clusters are moved in now; empty once every wave is done.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub current_wave: String,
    /// The ClusterClass the Clusters move to: `docker-ferrol-1-27-v2`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target_class: String,
    /// Clusters taking part, in all waves.
    #[serde(default)]
    pub clusters: i32,
    /// Of them, done.
    #[serde(default)]
    pub done: i32,
    /// Of them, failing.
    #[serde(default)]
    pub failing: i32,
    /// Of them, skipped: refused by the preflight, or moved back to an older release after the rollout moved
    /// them. They are not on the release.
    #[serde(default)]
    pub skipped: i32,
    /// Clusters of the stack (on older releases, matching `clusterSelector`) that no wave's selector matches.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unassigned: i32,
    /// One entry per wave, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waves: Vec<WaveStatus>,
    /// What the rollout did to each Cluster it moved, refused or saw moved: its memory across reconciles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub moves: Vec<ClusterMove>,
    /// The generation of the spec this status is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// The state of one wave.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaveStatus {
    pub name: String,
    /// Clusters in the wave.
    #[serde(default)]
    pub clusters: i32,
    /// Moved to the release (by the rollout or by hand).
    #[serde(default)]
    pub moved: i32,
    /// Done: addons ready on the release and Cluster API up to date.
    #[serde(default)]
    pub done: i32,
    /// Moved and not done within the wave timeout.
    #[serde(default)]
    pub failing: i32,
    /// Refused by the preflight, or moved back to an older release by hand: left alone.
    #[serde(default)]
    pub skipped: i32,
    /// The failing Clusters (`namespace/name`, at most five) and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failing_clusters: Vec<FailingCluster>,
    /// Since when every Cluster of the wave is done or skipped (the bake starts then); kept while one of them is
    /// only in progress again, cleared when one fails. The bake ends with every Cluster done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", extend("format" = "date-time"))]
    pub finished_at: Option<DateTime<Utc>>,
}

/// A Cluster of a wave that is not done in time, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailingCluster {
    /// `namespace/name`.
    pub cluster: String,
    pub reason: String,
}

/// What the rollout did to one Cluster, or saw of it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterMove {
    /// `namespace/name`.
    pub cluster: String,
    /// The wave it belongs to.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub wave: String,
    /// `Moved` (by the rollout), `Found` (on the release already: moved by hand), `Refused` (by the
    /// preflight).
    pub outcome: String,
    /// The class it was on before.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub from: String,
    /// When it was moved, found on the release, or refused.
    #[schemars(with = "String", extend("format" = "date-time"))]
    pub at: DateTime<Utc>,
    /// The Cluster's generation the preflight refused; a change of the Cluster asks again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// The rollout's generation a refusal was made under; a change of the rollout's spec (turning on
    /// `spec.variables.followClassDefaults`, say) asks again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_generation: Option<i64>,
    /// Why it was refused, in terms of the two classes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// The values the move left out of its variables because they equalled the old class's defaults
    /// (`spec.variables.followClassDefaults`): `oidcConfig.groupsPrefix`, or `oidcConfig.groupsPrefix in
    /// machineDeployment md-0` inside an override; the new class defaults them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variables_dropped: Vec<String>,
    /// The changes the move made that the rollout declares (`spec.variables.set` and `remove`), each with
    /// the value it replaced, to undo it by: `removed oidcConfig.groupsPrefix (was "corp:")`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variables_changed: Vec<String>,
}

/// [`ClusterMove::outcome`] values.
pub mod outcome {
    pub const MOVED: &str = "Moved";
    pub const FOUND: &str = "Found";
    pub const REFUSED: &str = "Refused";
}

impl HasConditions for ClusterStackRollout {
    fn conditions(&self) -> &[Condition] {
        self.status.as_ref().map_or(&[], |s| &s.conditions)
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.status.get_or_insert_with(Default::default).conditions
    }
}

impl HasConditions for ClusterStackRolloutStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}
