//! Which run of each lifecycle hook a ClusterAddon is on, and how long its current stage has been going:
//! the record that lets blocking hooks be answered from state instead of from the call.
//!
//! Cluster API calls a blocking hook again and again until it answers without `retryAfterSeconds`; since
//! 1.12 one upgrade may call the same hook once per step of a chained upgrade (`AfterControlPlaneUpgrade` at
//! v1.34 and again at v1.35). So a hook call is identified by a [`HookRun`]: the hook, the class and the
//! Kubernetes version of its step. The hook server records the run it starts (annotation
//! [`HOOK_RUNS_ANNOTATION`], one entry per hook) together with `spec.hook`; the ClusterAddon controller runs
//! the stages and clears `spec.hook` when they are done. A call is answered "done" when its run is recorded
//! and `spec.hook` no longer names its hook, so the record needs no second writer and survives restarts.
//!
//! The stage clock ([`StageClock`], annotation [`STAGE_CLOCK_ANNOTATION`]) records since when the current
//! stage has been running, so that a stage that cannot finish is given up after the per-stage timeout even
//! across restarts.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::Hook;
use crate::ClusterAddon;

/// Annotation of a ClusterAddon: the last run of each hook the hook server started (JSON: hook name ->
/// [`HookRun`]).
pub const HOOK_RUNS_ANNOTATION: &str = "clusterstack.x-k8s.io/hook-runs";
/// Annotation of a ClusterAddon: which hooks the release of its class has stages for (JSON [`HookStages`]).
pub const HOOK_STAGES_ANNOTATION: &str = "clusterstack.x-k8s.io/hook-stages";
/// Annotation of a ClusterAddon: since when the current stage of the running hook runs (JSON [`StageClock`]).
pub const STAGE_CLOCK_ANNOTATION: &str = "clusterstack.x-k8s.io/stage-clock";

/// One call of a hook, as far as its answer goes: the class of the Cluster and the Kubernetes version of
/// the step (the target for `Before*` hooks, the version reached for `After*` hooks).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookRun {
    pub class: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kubernetes_version: String,
}

impl HookRun {
    pub fn new(class: impl Into<String>, kubernetes_version: impl Into<String>) -> Self {
        HookRun {
            class: class.into(),
            kubernetes_version: kubernetes_version.into(),
        }
    }

    /// `class at version`, for messages.
    pub fn describe(&self) -> String {
        if self.kubernetes_version.is_empty() {
            self.class.clone()
        } else {
            format!("{} at {}", self.class, self.kubernetes_version)
        }
    }
}

/// The runs recorded on a ClusterAddon, by hook name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookRuns(pub BTreeMap<String, HookRun>);

impl HookRuns {
    /// What `addon` records; an unreadable record counts as none (the hook then starts its run again, which
    /// repeats idempotent applies and never skips a stage).
    pub fn of(addon: &ClusterAddon) -> Self {
        addon
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(HOOK_RUNS_ANNOTATION))
            .and_then(|text| serde_json::from_str(text).ok())
            .unwrap_or_default()
    }

    pub fn get(&self, hook: Hook) -> Option<&HookRun> {
        self.0.get(hook.as_str())
    }

    /// The record with `run` as `hook`'s latest run.
    pub fn with(mut self, hook: Hook, run: HookRun) -> Self {
        self.0.insert(hook.as_str().to_owned(), run);
        self
    }

    pub fn encode(&self) -> String {
        // A map of strings always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The Kubernetes version the stages of `hook` render with, when its run names one.
    pub fn kubernetes_version(&self, hook: Hook) -> Option<&str> {
        self.get(hook)
            .map(|run| run.kubernetes_version.as_str())
            .filter(|v| !v.is_empty())
    }
}

/// The hooks the release of `class` has stages for, as the ClusterAddon controller found them in its
/// `clusteraddon.yaml` (none for a release with one addon chart). With it, the hook server answers a blocking
/// hook with nothing to run at once, instead of starting an empty run and asking Cluster API to come back
/// (which costs the `retryAfterSeconds` Cluster API caches, at every hook of every upgrade step).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookStages {
    pub class: String,
    pub hooks: Vec<String>,
}

impl HookStages {
    pub fn new(class: impl Into<String>, hooks: impl IntoIterator<Item = Hook>) -> Self {
        HookStages {
            class: class.into(),
            hooks: hooks.into_iter().map(|h| h.as_str().to_owned()).collect(),
        }
    }

    /// What `addon` records, if anything readable.
    pub fn of(addon: &ClusterAddon) -> Option<Self> {
        addon
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(HOOK_STAGES_ANNOTATION))
            .and_then(|text| serde_json::from_str(text).ok())
    }

    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether the release of `class` is known to have no stages for `hook` (`false` when the record is of
    /// another class: then nobody knows yet).
    pub fn nothing_to_run(&self, class: &str, hook: Hook) -> bool {
        self.class == class && !self.hooks.iter().any(|h| h == hook.as_str())
    }
}

/// Since when stage `index` of `hook` runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StageClock {
    pub hook: String,
    pub index: usize,
    pub since: DateTime<Utc>,
}

impl StageClock {
    /// What `addon` records, if anything readable.
    pub fn of(addon: &ClusterAddon) -> Option<Self> {
        addon
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(STAGE_CLOCK_ANNOTATION))
            .and_then(|text| serde_json::from_str(text).ok())
    }

    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The clock for stage `index` of `hook`: this one if it already times that stage, else one started `now`.
    pub fn for_stage(
        current: Option<&StageClock>,
        hook: Hook,
        index: usize,
        now: DateTime<Utc>,
    ) -> StageClock {
        match current {
            Some(clock) if clock.hook == hook.as_str() && clock.index == index => clock.clone(),
            _ => StageClock {
                hook: hook.as_str().to_owned(),
                index,
                since: now,
            },
        }
    }

    /// Whether the stage has run longer than `timeout` at `now`.
    pub fn expired(&self, timeout: std::time::Duration, now: DateTime<Utc>) -> bool {
        (now - self.since).to_std().is_ok_and(|elapsed| elapsed > timeout)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn addon_with(annotation: &str, value: &str) -> ClusterAddon {
        let mut addon = ClusterAddon::new("cluster-addon-c", Default::default());
        addon.metadata.annotations = Some([(annotation.to_owned(), value.to_owned())].into());
        addon
    }

    #[test]
    fn runs_round_trip_through_the_annotation_and_unreadable_ones_count_as_none() {
        let runs = HookRuns::default()
            .with(
                Hook::AfterControlPlaneUpgrade,
                HookRun::new("docker-scs-1-35-v1", "v1.35.1"),
            )
            .with(Hook::AfterClusterUpgrade, HookRun::new("docker-scs-1-35-v1", ""));
        let addon = addon_with(HOOK_RUNS_ANNOTATION, &runs.encode());
        assert_eq!(HookRuns::of(&addon), runs);
        assert_eq!(
            HookRuns::of(&addon).kubernetes_version(Hook::AfterControlPlaneUpgrade),
            Some("v1.35.1")
        );
        assert_eq!(
            HookRuns::of(&addon).kubernetes_version(Hook::AfterClusterUpgrade),
            None
        );
        assert_eq!(
            HookRuns::of(&addon_with(HOOK_RUNS_ANNOTATION, "{not json")),
            HookRuns::default()
        );
    }

    #[test]
    fn hook_stages_know_only_about_their_own_class() {
        let stages = HookStages::new(
            "docker-scs-1-35-v1",
            [Hook::AfterControlPlaneInitialized, Hook::AfterClusterUpgrade],
        );
        assert!(stages.nothing_to_run("docker-scs-1-35-v1", Hook::AfterControlPlaneUpgrade));
        assert!(!stages.nothing_to_run("docker-scs-1-35-v1", Hook::AfterClusterUpgrade));
        assert!(!stages.nothing_to_run("docker-scs-1-35-v2", Hook::AfterControlPlaneUpgrade));
        let addon = addon_with(HOOK_STAGES_ANNOTATION, &stages.encode());
        assert_eq!(HookStages::of(&addon), Some(stages));
        assert_eq!(HookStages::of(&addon_with(HOOK_STAGES_ANNOTATION, "[")), None);
    }

    #[test]
    fn a_stage_clock_keeps_running_for_the_same_stage_and_restarts_for_another() {
        let t0 = DateTime::parse_from_rfc3339("2026-11-23T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let later = t0 + chrono::Duration::seconds(90);
        let clock = StageClock::for_stage(None, Hook::AfterClusterUpgrade, 0, t0);
        assert_eq!(
            StageClock::for_stage(Some(&clock), Hook::AfterClusterUpgrade, 0, later).since,
            t0
        );
        assert_eq!(
            StageClock::for_stage(Some(&clock), Hook::AfterClusterUpgrade, 1, later).since,
            later
        );
        assert_eq!(
            StageClock::for_stage(Some(&clock), Hook::BeforeClusterUpgrade, 0, later).since,
            later
        );
        assert!(clock.expired(Duration::from_secs(60), later));
        assert!(!clock.expired(Duration::from_secs(120), later));
        assert!(
            !clock.expired(Duration::from_secs(60), t0 - chrono::Duration::seconds(5)),
            "clock skew"
        );
        let addon = addon_with(STAGE_CLOCK_ANNOTATION, &clock.encode());
        assert_eq!(StageClock::of(&addon), Some(clock));
    }
}
