//! Cluster API (`v1beta1`) style conditions with the `Ready` summary rule, as the Go operator writes them.
//!
//! The list is kept sorted (`Ready` first, then by type); a condition keeps its `lastTransitionTime` while
//! nothing about it changes; `Ready` summarises the others by (status, severity) priority.

use std::cmp::Ordering;

use chrono::{DateTime, SubsecRound, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The summary condition type.
pub const READY: &str = "Ready";

/// `True`, `False` or `Unknown`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

/// How bad a `False` condition is. Only set on `False` conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Severity {
    Error,
    Warning,
    Info,
}

/// One observation about an object, in the Cluster API `v1beta1` shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Type of the condition, in CamelCase.
    #[serde(rename = "type")]
    pub type_: String,
    /// Status of the condition: True, False or Unknown.
    #[schemars(with = "String")]
    pub status: ConditionStatus,
    /// Severity of a False condition: Error, Warning or Info.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub severity: Option<Severity>,
    /// Last time the condition changed from one status, reason, severity or message to another.
    #[schemars(with = "String", extend("format" = "date-time"))]
    pub last_transition_time: DateTime<Utc>,
    /// Machine-readable reason for the last transition, in CamelCase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable message about the last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Condition {
    pub fn is_true(&self) -> bool {
        self.status == ConditionStatus::True
    }

    /// Whether two conditions say the same thing; the transition time is not compared.
    fn same_observation(&self, other: &Condition) -> bool {
        self.type_ == other.type_
            && self.status == other.status
            && self.severity == other.severity
            && self.reason == other.reason
            && self.message == other.message
    }
}

/// Read and write access to an object's condition list.
pub trait HasConditions {
    fn conditions(&self) -> &[Condition];
    fn conditions_mut(&mut self) -> &mut Vec<Condition>;
}

impl HasConditions for Vec<Condition> {
    fn conditions(&self) -> &[Condition] {
        self
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        self
    }
}

/// The operations on a condition list. Implemented for everything that [`HasConditions`].
pub trait ConditionsExt: HasConditions {
    fn get_condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions().iter().find(|c| c.type_ == type_)
    }

    fn is_condition_true(&self, type_: &str) -> bool {
        self.get_condition(type_).is_some_and(Condition::is_true)
    }

    /// Since when condition `type_` has given `reason` (its transition time), if it gives that reason.
    fn reason_since(&self, type_: &str, reason: &str) -> Option<DateTime<Utc>> {
        self.get_condition(type_)
            .filter(|c| c.reason.as_deref() == Some(reason))
            .map(|c| c.last_transition_time)
    }

    /// Sets the transition time of condition `type_` (if there is one) to `since`: a finding that goes on keeps
    /// the time it began while its message follows what is seen (setting a condition with another message
    /// counts as a transition).
    fn keep_transition(&mut self, type_: &str, since: DateTime<Utc>) {
        if let Some(condition) = self.conditions_mut().iter_mut().find(|c| c.type_ == type_) {
            condition.last_transition_time = since;
        }
    }

    fn is_condition_false(&self, type_: &str) -> bool {
        self.get_condition(type_)
            .is_some_and(|c| c.status == ConditionStatus::False)
    }

    /// Sets a condition at time `now`, keeping the old transition time if nothing changed.
    fn set_condition_at(&mut self, mut condition: Condition, now: DateTime<Utc>) {
        let list = self.conditions_mut();
        match list.iter_mut().find(|c| c.type_ == condition.type_) {
            Some(existing) if existing.same_observation(&condition) => {}
            Some(existing) => {
                condition.last_transition_time = now.trunc_subsecs(0);
                *existing = condition;
            }
            None => {
                condition.last_transition_time = now.trunc_subsecs(0);
                list.push(condition);
            }
        }
        list.sort_by(order_ready_first);
    }

    fn mark_true(&mut self, type_: &str) {
        self.set_condition_at(
            new_condition(type_, ConditionStatus::True, None, None, None),
            Utc::now(),
        );
    }

    fn mark_false(&mut self, type_: &str, reason: &str, severity: Severity, message: impl Into<String>) {
        let message = message.into();
        let condition = new_condition(
            type_,
            ConditionStatus::False,
            Some(severity),
            Some(reason.to_owned()),
            (!message.is_empty()).then_some(message),
        );
        self.set_condition_at(condition, Utc::now());
    }

    fn mark_unknown(&mut self, type_: &str, reason: &str, message: impl Into<String>) {
        let message = message.into();
        let condition = new_condition(
            type_,
            ConditionStatus::Unknown,
            None,
            Some(reason.to_owned()),
            (!message.is_empty()).then_some(message),
        );
        self.set_condition_at(condition, Utc::now());
    }

    fn delete_condition(&mut self, type_: &str) {
        self.conditions_mut().retain(|c| c.type_ != type_);
    }

    /// Sets `Ready` from all other conditions (Cluster API `SetSummary`):
    /// the most severe group decides (False/Error, False/Warning, False/Info, True, Unknown);
    /// a False summary takes reason and message from the first condition of that group by type.
    /// Without other conditions, `Ready` is removed.
    fn set_summary(&mut self) {
        let summary = summarize(self.conditions());
        match summary {
            Some(ready) => self.set_condition_at(ready, Utc::now()),
            None => self.delete_condition(READY),
        }
    }
}

impl<T: HasConditions + ?Sized> ConditionsExt for T {}

fn new_condition(
    type_: &str,
    status: ConditionStatus,
    severity: Option<Severity>,
    reason: Option<String>,
    message: Option<String>,
) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status,
        severity,
        last_transition_time: DateTime::<Utc>::UNIX_EPOCH,
        reason,
        message,
    }
}

fn order_ready_first(a: &Condition, b: &Condition) -> Ordering {
    (a.type_ != READY, &a.type_).cmp(&(b.type_ != READY, &b.type_))
}

/// Rank of a condition in the summary; lower is more important.
fn summary_rank(c: &Condition) -> u8 {
    match (c.status, c.severity) {
        (ConditionStatus::False, Some(Severity::Error)) => 0,
        (ConditionStatus::False, Some(Severity::Warning)) => 1,
        (ConditionStatus::False, _) => 2,
        (ConditionStatus::True, _) => 3,
        (ConditionStatus::Unknown, _) => 4,
    }
}

fn summarize(conditions: &[Condition]) -> Option<Condition> {
    let top = conditions.iter().filter(|c| c.type_ != READY).min_by(|a, b| {
        summary_rank(a)
            .cmp(&summary_rank(b))
            .then_with(|| a.type_.cmp(&b.type_))
    })?;
    Some(match top.status {
        ConditionStatus::True => new_condition(READY, ConditionStatus::True, None, None, None),
        ConditionStatus::False => new_condition(
            READY,
            ConditionStatus::False,
            Some(top.severity.unwrap_or(Severity::Info)),
            top.reason.clone(),
            top.message.clone(),
        ),
        ConditionStatus::Unknown => new_condition(
            READY,
            ConditionStatus::Unknown,
            None,
            top.reason.clone(),
            top.message.clone(),
        ),
    })
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(secs, 500).single().unwrap()
    }

    #[test]
    fn transition_time_is_kept_while_nothing_changes() {
        let mut list: Vec<Condition> = Vec::new();
        let c = new_condition(
            "A",
            ConditionStatus::False,
            Some(Severity::Info),
            Some("R".into()),
            None,
        );
        list.set_condition_at(c.clone(), at(100));
        list.set_condition_at(c.clone(), at(200));
        assert_eq!(
            list[0].last_transition_time,
            Utc.timestamp_opt(100, 0).single().unwrap()
        );
        let mut changed = c;
        changed.message = Some("now different".into());
        list.set_condition_at(changed, at(300));
        assert_eq!(
            list[0].last_transition_time,
            Utc.timestamp_opt(300, 0).single().unwrap()
        );
    }

    #[test]
    fn ready_first_then_alphabetical() {
        let mut list: Vec<Condition> = Vec::new();
        list.mark_true("Zeta");
        list.mark_true("Alpha");
        list.set_summary();
        let types: Vec<_> = list.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Ready", "Alpha", "Zeta"]);
    }

    #[test]
    fn summary_takes_the_most_severe_false_and_first_by_type() {
        let mut list: Vec<Condition> = Vec::new();
        list.mark_true("Applied");
        list.mark_false("Zed", "ZedBroken", Severity::Error, "zed");
        list.mark_false("Bee", "BeeBroken", Severity::Error, "bee");
        list.mark_false("Alpha", "AlphaSlow", Severity::Info, "alpha");
        list.set_summary();
        let ready = list.get_condition(READY).unwrap();
        assert_eq!(ready.status, ConditionStatus::False);
        assert_eq!(ready.severity, Some(Severity::Error));
        assert_eq!(ready.reason.as_deref(), Some("BeeBroken"));
        assert_eq!(ready.message.as_deref(), Some("bee"));
    }

    #[test]
    fn summary_is_true_when_all_true_and_unknown_only_when_nothing_better() {
        let mut list: Vec<Condition> = Vec::new();
        list.mark_true("A");
        list.mark_unknown("B", "Waiting", "");
        list.set_summary();
        assert!(list.is_condition_true(READY), "True outranks Unknown");

        let mut unknown_only: Vec<Condition> = Vec::new();
        unknown_only.mark_unknown("B", "Waiting", "for something");
        unknown_only.set_summary();
        assert_eq!(
            unknown_only.get_condition(READY).unwrap().status,
            ConditionStatus::Unknown
        );
    }

    #[test]
    fn summary_without_other_conditions_removes_ready() {
        let mut list: Vec<Condition> = Vec::new();
        list.mark_true("A");
        list.set_summary();
        list.delete_condition("A");
        list.set_summary();
        assert!(list.is_empty());
    }

    #[test]
    fn a_finding_that_goes_on_keeps_its_transition_time() {
        let began = DateTime::<Utc>::UNIX_EPOCH + chrono::TimeDelta::seconds(1_800_000_000);
        let mut list: Vec<Condition> = Vec::new();
        assert_eq!(list.reason_since("A", "R"), None);
        list.mark_false("A", "R", Severity::Warning, "3 restarts");
        list.keep_transition("A", began);
        assert_eq!(list.reason_since("A", "R"), Some(began));
        assert_eq!(list.reason_since("A", "Other"), None);
        // Another message counts as a transition; keeping the time undoes that.
        list.mark_false("A", "R", Severity::Warning, "4 restarts");
        assert_ne!(list.reason_since("A", "R"), Some(began));
        list.keep_transition("A", began);
        assert_eq!(list.reason_since("A", "R"), Some(began));
        // No such condition: nothing is set.
        list.keep_transition("B", began);
        assert!(list.get_condition("B").is_none());
    }

    #[test]
    fn mark_true_clears_reason_severity_and_message() {
        let mut list: Vec<Condition> = Vec::new();
        list.mark_false("A", "R", Severity::Warning, "m");
        list.mark_true("A");
        let a = list.get_condition("A").unwrap();
        assert_eq!(
            (a.severity, a.reason.as_ref(), a.message.as_ref()),
            (None, None, None)
        );
    }

    #[test]
    fn wire_format_matches_cluster_api() {
        let mut list: Vec<Condition> = Vec::new();
        list.set_condition_at(
            new_condition(
                "A",
                ConditionStatus::False,
                Some(Severity::Warning),
                Some("R".into()),
                None,
            ),
            at(0),
        );
        let json = serde_json::to_value(&list[0]).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"type": "A", "status": "False", "severity": "Warning",
                               "lastTransitionTime": "1970-01-01T00:00:00Z", "reason": "R"})
        );
    }
}
