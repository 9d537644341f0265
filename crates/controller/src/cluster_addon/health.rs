//! Whether the applied addons run (pure): what a health check of the applied objects
//! ([`cso_apply::health`]) means for the `AddonsHealthy` condition, `status.ready`, the events and when to
//! look again.
//!
//! Applied addons are waited for up to `--stage-timeout` (reason `WaitingForHealth`, Info). Not running
//! by then is reported (`NotHealthyInTime`, Warning, event `AddonsNotHealthy`), and so is addons that ran and
//! no longer do (`Degraded`, Warning, event `AddonsDegraded`); either way a hook waiting for them goes on
//! ([`cso_api::rules::addons::health_settled`]), and they are looked at again at each periodic pass.
//! `status.ready` is True only while they run. The wait is
//! timed from the moment they were first found not running after an apply: the condition keeps that time
//! while its message follows what the objects' status says.
//!
//! Given up on or degraded, they are looked at again on a back-off from the moment they were found so (a
//! quarter of the time since, from [`GIVEN_UP_POLL`] up to [`GIVEN_UP_POLL_MAX`]), not only at the periodic
//! pass, so that addons that run again (a workload cluster back after an outage, an object put back) are
//! found running within seconds of it. Objects that cannot be read at all (the workload cluster does not
//! answer) are no finding: `AddonsHealthy` Unknown (`HealthNotReadable`) says so, `status.ready` keeps what
//! the last finding said, and they are looked at again on the same back-off.

use std::time::Duration;

use chrono::{DateTime, Utc};
use cso_api::{
    ClusterAddon,
    conditions::{ConditionStatus, ConditionsExt, Severity},
    names::{condition, event, reason},
};

use crate::events::Events;

/// How soon addons that do not run yet are looked at again.
pub(crate) const WAITING_POLL: Duration = Duration::from_secs(5);
/// How soon addons given up on, degraded or not readable are looked at again, at first.
pub(crate) const GIVEN_UP_POLL: Duration = Duration::from_secs(10);
/// ... and at the latest (the periodic pass may come sooner).
pub(crate) const GIVEN_UP_POLL_MAX: Duration = Duration::from_secs(120);

/// What a health check of the applied objects found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    Running,
    /// Not running: the objects and why, from their status (`Deployment kube-system/x: 0 of 1 ...; ...`).
    NotRunning(String),
    /// Nothing found not running, but objects that could not be read, and why.
    Unreadable(String),
}

impl Found {
    /// The finding of `report`: running when every object with a health rule is healthy and could be read.
    pub(crate) fn of(report: &cso_apply::HealthReport) -> Self {
        if report.is_healthy() {
            Found::Running
        } else if report.unhealthy.is_empty() {
            Found::Unreadable(report.summary(3))
        } else {
            Found::NotRunning(report.summary(3))
        }
    }
}

/// What the finding means for the addon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// They run: `status.ready` may be True.
    pub(crate) running: bool,
    /// When to look again (none: at the periodic pass).
    pub(crate) again: Option<Duration>,
}

/// Records `found` in `addon`'s `AddonsHealthy` at `now`. `applied_anew`: this reconcile applied other
/// addons (an install or an upgrade), so a wait starts now whatever was found before.
pub(crate) fn record(
    addon: &mut ClusterAddon,
    found: &Found,
    applied_anew: bool,
    now: DateTime<Utc>,
    timeout: Duration,
    events: &mut Events,
) -> Verdict {
    let summary = match found {
        Found::Running => {
            addon.mark_true(condition::ADDONS_HEALTHY);
            return Verdict {
                running: true,
                again: None,
            };
        }
        Found::Unreadable(summary) => {
            // Found not running before: that finding stands (its wait, its timeout, its reason), and it is
            // looked at again as it would be.
            if let Some(found) = addon
                .get_condition(condition::ADDONS_HEALTHY)
                .filter(|c| c.status == ConditionStatus::False)
            {
                let again = if found.reason.as_deref() == Some(reason::WAITING_FOR_HEALTH) {
                    WAITING_POLL
                } else {
                    given_up_poll(now, found.last_transition_time)
                };
                return Verdict {
                    running: false,
                    again: Some(again),
                };
            }
            let since = addon
                .reason_since(condition::ADDONS_HEALTHY, reason::HEALTH_NOT_READABLE)
                .unwrap_or(now);
            addon.mark_unknown(
                condition::ADDONS_HEALTHY,
                reason::HEALTH_NOT_READABLE,
                format!("the addons' objects cannot be read: {summary}"),
            );
            addon.keep_transition(condition::ADDONS_HEALTHY, since);
            return Verdict {
                running: addon.status.as_ref().is_some_and(|s| s.ready),
                again: Some(given_up_poll(now, since)),
            };
        }
        Found::NotRunning(summary) => summary,
    };
    if applied_anew {
        addon.delete_condition(condition::ADDONS_HEALTHY);
    }
    let before = addon
        .get_condition(condition::ADDONS_HEALTHY)
        .map(|c| (c.status, c.reason.clone(), c.last_transition_time));
    // Given up on, or degraded: looked at again on a back-off from when it was found so (they may recover).
    let given_up = |addon: &mut ClusterAddon, why: &'static str, message: String| {
        let since = addon.reason_since(condition::ADDONS_HEALTHY, why).unwrap_or(now);
        addon.mark_false(condition::ADDONS_HEALTHY, why, Severity::Warning, message);
        // Timed from when it was found so, whatever the message says since (restarts, error texts).
        addon.keep_transition(condition::ADDONS_HEALTHY, since);
        Verdict {
            running: false,
            again: Some(given_up_poll(now, since)),
        }
    };
    match before {
        Some((ConditionStatus::True, _, _)) => {
            let message = format!("the addons no longer run: {summary}");
            events.warning(event::ADDONS_DEGRADED, message.clone());
            given_up(addon, reason::DEGRADED, message)
        }
        Some((ConditionStatus::False, Some(why), _)) if why == reason::DEGRADED => given_up(
            addon,
            reason::DEGRADED,
            format!("the addons no longer run: {summary}"),
        ),
        Some((ConditionStatus::False, Some(why), _)) if why == reason::NOT_HEALTHY_IN_TIME => {
            given_up(addon, reason::NOT_HEALTHY_IN_TIME, not_in_time(timeout, summary))
        }
        Some((ConditionStatus::False, Some(why), since)) if why == reason::WAITING_FOR_HEALTH => {
            let waited = (now - since).to_std().unwrap_or_default();
            if waited >= timeout {
                let message = not_in_time(timeout, summary);
                events.warning(event::ADDONS_NOT_HEALTHY, message.clone());
                given_up(addon, reason::NOT_HEALTHY_IN_TIME, message)
            } else {
                waiting(addon, summary, Some(since))
            }
        }
        _ => waiting(addon, summary, None),
    }
}

/// When to look again at addons found given up on, degraded or unreadable since `since`: a quarter of the time
/// since, within [`GIVEN_UP_POLL`] and [`GIVEN_UP_POLL_MAX`].
fn given_up_poll(now: DateTime<Utc>, since: DateTime<Utc>) -> Duration {
    ((now - since).to_std().unwrap_or_default() / 4).clamp(GIVEN_UP_POLL, GIVEN_UP_POLL_MAX)
}

/// Marks the addons as waited for, the wait started at `since` (now when `None`).
fn waiting(addon: &mut ClusterAddon, summary: &str, since: Option<DateTime<Utc>>) -> Verdict {
    addon.mark_false(
        condition::ADDONS_HEALTHY,
        reason::WAITING_FOR_HEALTH,
        Severity::Info,
        format!("applied, not running yet: {summary}"),
    );
    if let Some(since) = since {
        addon.keep_transition(condition::ADDONS_HEALTHY, since);
    }
    Verdict {
        running: false,
        again: Some(WAITING_POLL),
    }
}

fn not_in_time(timeout: Duration, summary: &str) -> String {
    format!(
        "the addons do not run {}s after they were applied: {summary}",
        timeout.as_secs()
    )
}

/// Whether a health look waits for running workloads to settle (`--addon-settle-time`): this reconcile installs
/// or upgrades the addons, or they have not been found running since the last install or upgrade.
pub(crate) fn settling(addon: &ClusterAddon, installs_or_upgrades: bool) -> bool {
    installs_or_upgrades || !addon.is_condition_true(condition::ADDONS_HEALTHY)
}

/// Whether a settled addon (nothing to apply) is to be checked: health gates are on, and the periodic pass is
/// due or it was not found running last time.
pub(crate) fn due_when_settled(addon: &ClusterAddon, gates: bool, resync_due: bool) -> bool {
    gates
        && (resync_due
            || !addon.is_condition_true(condition::ADDONS_HEALTHY)
            || !addon.status.as_ref().is_some_and(|s| s.ready))
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;
    use rstest::rstest;

    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(600);
    const SUMMARY: &str = "Deployment kube-system/metrics-server: 0 of 1 replicas available";

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::<Utc>::UNIX_EPOCH + TimeDelta::seconds(1_800_000_000 + seconds)
    }

    fn with_health(status: Option<(bool, &'static str)>, since: i64) -> ClusterAddon {
        let mut addon = ClusterAddon::new("cluster-addon-c1", Default::default());
        match status {
            None => {}
            Some((true, _)) => addon.mark_true(condition::ADDONS_HEALTHY),
            Some((false, why)) => addon.mark_false(condition::ADDONS_HEALTHY, why, Severity::Info, "x"),
        }
        if let Some(c) = addon.status.as_mut().and_then(|s| s.conditions.first_mut()) {
            c.last_transition_time = at(since);
        }
        addon
    }

    fn reason_of(addon: &ClusterAddon) -> Option<String> {
        addon
            .get_condition(condition::ADDONS_HEALTHY)
            .and_then(|c| c.reason.clone())
    }

    #[rstest]
    #[case::first_look(None, false, 0, reason::WAITING_FOR_HEALTH, Some(WAITING_POLL), &[])]
    #[case::still_waiting(Some((false, reason::WAITING_FOR_HEALTH)), false, 599, reason::WAITING_FOR_HEALTH, Some(WAITING_POLL), &[])]
    #[case::timed_out(Some((false, reason::WAITING_FOR_HEALTH)), false, 600, reason::NOT_HEALTHY_IN_TIME, Some(GIVEN_UP_POLL), &[event::ADDONS_NOT_HEALTHY])]
    #[case::still_given_up(Some((false, reason::NOT_HEALTHY_IN_TIME)), false, 5000, reason::NOT_HEALTHY_IN_TIME, Some(GIVEN_UP_POLL_MAX), &[])]
    #[case::given_up_a_minute_ago(Some((false, reason::NOT_HEALTHY_IN_TIME)), false, 60, reason::NOT_HEALTHY_IN_TIME, Some(Duration::from_secs(15)), &[])]
    #[case::degraded(Some((true, "")), false, 5000, reason::DEGRADED, Some(GIVEN_UP_POLL), &[event::ADDONS_DEGRADED])]
    #[case::still_degraded(Some((false, reason::DEGRADED)), false, 5000, reason::DEGRADED, Some(GIVEN_UP_POLL_MAX), &[])]
    #[case::degraded_a_moment_ago(Some((false, reason::DEGRADED)), false, 8, reason::DEGRADED, Some(GIVEN_UP_POLL), &[])]
    #[case::an_upgrade_waits_again(Some((true, "")), true, 5000, reason::WAITING_FOR_HEALTH, Some(WAITING_POLL), &[])]
    #[case::an_upgrade_after_a_timeout_waits_again(Some((false, reason::NOT_HEALTHY_IN_TIME)), true, 5000, reason::WAITING_FOR_HEALTH, Some(WAITING_POLL), &[])]
    fn addons_not_running(
        #[case] before: Option<(bool, &'static str)>,
        #[case] applied_anew: bool,
        #[case] elapsed: i64,
        #[case] expected: &str,
        #[case] again: Option<Duration>,
        #[case] raised: &[&str],
    ) {
        let mut addon = with_health(before, 0);
        let mut events = Events::default();
        let found = Found::NotRunning(SUMMARY.into());
        let verdict = record(
            &mut addon,
            &found,
            applied_anew,
            at(elapsed),
            TIMEOUT,
            &mut events,
        );
        assert_eq!(
            verdict,
            Verdict {
                running: false,
                again
            }
        );
        assert_eq!(reason_of(&addon).as_deref(), Some(expected));
        assert_eq!(events.reasons(), raised);
        let condition = addon.get_condition(condition::ADDONS_HEALTHY).unwrap();
        assert!(
            condition.message.as_deref().unwrap().contains(SUMMARY),
            "{condition:?}"
        );
        let severity = if expected == reason::WAITING_FOR_HEALTH {
            Severity::Info
        } else {
            Severity::Warning
        };
        assert_eq!(condition.severity, Some(severity));
    }

    #[test]
    fn the_wait_is_timed_from_the_first_finding_whatever_the_messages_say() {
        let mut addon = with_health(Some((false, reason::WAITING_FOR_HEALTH)), 0);
        let mut events = Events::default();
        for (second, replicas) in [(100, "0 of 2"), (200, "1 of 2"), (300, "0 of 2")] {
            let found = Found::NotRunning(format!("Deployment kube-system/x: {replicas} replicas available"));
            record(&mut addon, &found, false, at(second), TIMEOUT, &mut events);
            let condition = addon.get_condition(condition::ADDONS_HEALTHY).unwrap();
            assert_eq!(condition.last_transition_time, at(0));
            assert!(condition.message.as_deref().unwrap().contains(replicas));
        }
        let verdict = record(
            &mut addon,
            &Found::NotRunning(SUMMARY.into()),
            false,
            at(600),
            TIMEOUT,
            &mut events,
        );
        assert!(!verdict.running);
        assert_eq!(reason_of(&addon).as_deref(), Some(reason::NOT_HEALTHY_IN_TIME));
    }

    #[test]
    fn the_back_off_is_timed_from_when_they_were_found_so_whatever_the_messages_say() {
        let mut addon = with_health(Some((true, "")), 0);
        let mut events = Events::default();
        let look = |addon: &mut ClusterAddon, second: i64, restarts: u32| {
            let found = Found::NotRunning(format!(
                "pod kube-system/x: CrashLoopBackOff, {restarts} restarts"
            ));
            record(addon, &found, false, at(second), TIMEOUT, &mut Events::default())
        };
        record(
            &mut addon,
            &Found::NotRunning(SUMMARY.into()),
            false,
            at(0),
            TIMEOUT,
            &mut events,
        );
        assert_eq!(reason_of(&addon).as_deref(), Some(reason::DEGRADED));
        let since = addon
            .get_condition(condition::ADDONS_HEALTHY)
            .unwrap()
            .last_transition_time;
        look(&mut addon, 100, 4);
        look(&mut addon, 200, 5);
        let verdict = look(&mut addon, 480, 7);
        assert_eq!(
            addon
                .get_condition(condition::ADDONS_HEALTHY)
                .unwrap()
                .last_transition_time,
            since,
            "the transition stays when only the message changes"
        );
        assert_eq!(
            verdict.again,
            Some(GIVEN_UP_POLL_MAX),
            "8 minutes degraded: every 2 minutes"
        );
    }

    #[rstest]
    #[case::waiting(reason::WAITING_FOR_HEALTH, WAITING_POLL)]
    #[case::given_up(reason::NOT_HEALTHY_IN_TIME, GIVEN_UP_POLL_MAX)]
    #[case::degraded(reason::DEGRADED, GIVEN_UP_POLL_MAX)]
    fn a_read_that_fails_leaves_a_finding_that_they_do_not_run_as_it_was(
        #[case] why: &'static str,
        #[case] again: Duration,
    ) {
        let mut addon = with_health(Some((false, why)), 0);
        let before = addon.get_condition(condition::ADDONS_HEALTHY).cloned();
        let found = Found::Unreadable("Deployment kube-system/x: cannot be read: timed out".into());
        let verdict = record(
            &mut addon,
            &found,
            false,
            at(3000),
            TIMEOUT,
            &mut Events::default(),
        );
        assert_eq!(
            verdict,
            Verdict {
                running: false,
                again: Some(again)
            }
        );
        assert_eq!(addon.get_condition(condition::ADDONS_HEALTHY).cloned(), before);
    }

    #[rstest]
    #[case::running_before(Some((true, "")), true)]
    #[case::never_found_running(None, false)]
    fn objects_that_cannot_be_read_are_no_finding(
        #[case] before: Option<(bool, &'static str)>,
        #[case] ready: bool,
    ) {
        let mut addon = with_health(before, 0);
        addon.status.get_or_insert_with(Default::default).ready = ready;
        let mut events = Events::default();
        let found = Found::Unreadable("Deployment kube-system/x: cannot be read: connection refused".into());
        let first = record(&mut addon, &found, false, at(100), TIMEOUT, &mut events);
        assert_eq!(
            first,
            Verdict {
                running: ready,
                again: Some(GIVEN_UP_POLL)
            }
        );
        let condition = addon.get_condition(condition::ADDONS_HEALTHY).unwrap();
        assert_eq!(condition.status, ConditionStatus::Unknown);
        assert_eq!(condition.reason.as_deref(), Some(reason::HEALTH_NOT_READABLE));
        assert!(
            condition
                .message
                .as_deref()
                .unwrap()
                .contains("connection refused")
        );
        assert!(events.reasons().is_empty());
        // Still not readable ten minutes on: looked at on the back-off, timed from the first such look.
        let later = record(&mut addon, &found, false, at(700), TIMEOUT, &mut events);
        assert_eq!(later.again, Some(GIVEN_UP_POLL_MAX));
        // Readable again and running: healthy at once.
        let back = record(&mut addon, &Found::Running, false, at(710), TIMEOUT, &mut events);
        assert!(back.running);
        assert!(addon.is_condition_true(condition::ADDONS_HEALTHY));
    }

    #[rstest]
    #[case::never_looked(None)]
    #[case::waiting(Some((false, reason::WAITING_FOR_HEALTH)))]
    #[case::given_up(Some((false, reason::NOT_HEALTHY_IN_TIME)))]
    #[case::degraded(Some((false, reason::DEGRADED)))]
    fn running_addons_are_healthy_whatever_came_before(#[case] before: Option<(bool, &'static str)>) {
        let mut addon = with_health(before, 0);
        let mut events = Events::default();
        let verdict = record(&mut addon, &Found::Running, false, at(10), TIMEOUT, &mut events);
        assert_eq!(
            verdict,
            Verdict {
                running: true,
                again: None
            }
        );
        assert!(addon.is_condition_true(condition::ADDONS_HEALTHY));
        assert!(events.reasons().is_empty());
    }

    #[rstest]
    #[case::running_and_re_applied(Some((true, "")), false, false)]
    #[case::running_and_upgraded(Some((true, "")), true, true)]
    #[case::waiting(Some((false, reason::WAITING_FOR_HEALTH)), false, true)]
    #[case::degraded(Some((false, reason::DEGRADED)), false, true)]
    #[case::never_looked(None, false, true)]
    fn running_workloads_settle_only_while_the_addons_are_waited_for(
        #[case] health: Option<(bool, &'static str)>,
        #[case] installs_or_upgrades: bool,
        #[case] expected: bool,
    ) {
        assert_eq!(settling(&with_health(health, 0), installs_or_upgrades), expected);
    }

    #[rstest]
    #[case::gates_off(false, true, Some((true, "")), true, false)]
    #[case::resync_due(true, true, Some((true, "")), true, true)]
    #[case::running_and_not_due(true, false, Some((true, "")), true, false)]
    #[case::waiting(true, false, Some((false, reason::WAITING_FOR_HEALTH)), false, true)]
    #[case::never_checked(true, false, None, true, true)]
    #[case::not_ready(true, false, Some((true, "")), false, true)]
    fn settled_addons_are_checked_at_the_periodic_pass_and_until_they_run(
        #[case] gates: bool,
        #[case] resync_due: bool,
        #[case] health: Option<(bool, &'static str)>,
        #[case] ready: bool,
        #[case] due: bool,
    ) {
        let mut addon = with_health(health, 0);
        addon.status.get_or_insert_with(Default::default).ready = ready;
        assert_eq!(due_when_settled(&addon, gates, resync_due), due);
    }
}
