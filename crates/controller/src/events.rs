//! Events a reconcile decided to publish. The pure steps of a reconciler collect them here (with the
//! conditions they go with); the act step publishes them. One rule lives here: a condition that turns False
//! publishes an event, unless it already said the same (a retry that fails the same way stays quiet: one
//! event per problem, not one per attempt). Problems that are not conditions (events about Clusters) are
//! announced once while they last through [`Announced`].

use std::{
    collections::{BTreeSet, HashMap},
    sync::Mutex,
};

use cso_api::conditions::{ConditionStatus, ConditionsExt, HasConditions, Severity};

/// Whether an event is `Normal` or `Warning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    Normal,
    Warning,
}

/// One event to publish about the reconciled object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pending {
    pub(crate) kind: Kind,
    pub(crate) reason: &'static str,
    pub(crate) note: String,
}

/// The events of one reconcile, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Events(pub(crate) Vec<Pending>);

/// A condition that turns False: its type, reason and severity.
pub(crate) type FalseCondition<'a> = (&'a str, &'a str, Severity);

impl Events {
    pub(crate) fn normal(&mut self, reason: &'static str, note: impl Into<String>) {
        self.0.push(Pending {
            kind: Kind::Normal,
            reason,
            note: note.into(),
        });
    }

    pub(crate) fn warning(&mut self, reason: &'static str, note: impl Into<String>) {
        self.0.push(Pending {
            kind: Kind::Warning,
            reason,
            note: note.into(),
        });
    }

    /// Marks `condition` False with `message` and queues the event `(kind, reason)`, unless the condition
    /// already was False for the same reason.
    pub(crate) fn report_false<K: HasConditions>(
        &mut self,
        object: &mut K,
        (condition, reason, severity): FalseCondition<'_>,
        message: &str,
        (kind, event_reason): (Kind, &'static str),
    ) {
        let repeated = object
            .get_condition(condition)
            .is_some_and(|c| c.status == ConditionStatus::False && c.reason.as_deref() == Some(reason));
        object.mark_false(condition, reason, severity, message);
        if !repeated {
            self.0.push(Pending {
                kind,
                reason: event_reason,
                note: message.to_owned(),
            });
        }
    }

    /// The reasons of the queued events, in order (for tests and logs).
    #[cfg(test)]
    pub(crate) fn reasons(&self) -> Vec<&'static str> {
        self.0.iter().map(|e| e.reason).collect()
    }
}

/// The problems each object was told about, so that a problem is announced once while it lasts (and again
/// if it comes back after going away), not at every reconcile. Kept in memory: a restart announces a lasting
/// problem once more.
#[derive(Debug, Default)]
pub struct Announced(Mutex<HashMap<String, BTreeSet<String>>>);

impl Announced {
    /// Records `current` as the problems of `key` now; returns those that are news (not announced before).
    pub(crate) fn news(&self, key: &str, current: BTreeSet<String>) -> BTreeSet<String> {
        let mut announced = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let news = match announced.get(key) {
            Some(before) => current.difference(before).cloned().collect(),
            None => current.clone(),
        };
        if current.is_empty() {
            announced.remove(key);
        } else {
            announced.insert(key.to_owned(), current);
        }
        news
    }
}

#[cfg(test)]
mod tests {
    use cso_api::{ClusterStackRelease, names::condition};

    use super::*;

    #[test]
    fn a_repeated_failure_is_marked_but_not_announced_again() {
        let mut release = ClusterStackRelease::new("docker-ferrol-1-27-v1", Default::default());
        let mut events = Events::default();
        let failed = (
            condition::HELM_CHART_APPLIED,
            "FailedToRenderChart",
            Severity::Error,
        );
        events.report_false(
            &mut release,
            failed,
            "first",
            (Kind::Warning, "FailedToRenderChart"),
        );
        events.report_false(
            &mut release,
            failed,
            "second",
            (Kind::Warning, "FailedToRenderChart"),
        );
        assert_eq!(events.reasons(), ["FailedToRenderChart"]);
        assert_eq!(
            release
                .get_condition(condition::HELM_CHART_APPLIED)
                .and_then(|c| c.message.as_deref()),
            Some("second"),
            "the message follows the latest failure"
        );
        let other = (
            condition::HELM_CHART_APPLIED,
            "ObjectsApplyingOngoing",
            Severity::Warning,
        );
        events.report_false(
            &mut release,
            other,
            "third",
            (Kind::Warning, "FailedToApplyObjects"),
        );
        assert_eq!(
            events.reasons(),
            ["FailedToRenderChart", "FailedToApplyObjects"],
            "a new reason is news"
        );
    }
}
