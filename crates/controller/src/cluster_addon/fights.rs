//! Drift fights (issue 33): an object that something else keeps changing (an autoscaler, a policy engine, a
//! `kubectl edit` loop, two Clusters whose kubeconfigs point at one API server with different values) is put
//! back with back-off and reported, and its ClusterAddon's wake-ups wait for the back-off, so that a fight
//! cannot keep the workers from other ClusterAddons.
//!
//! The rule (pure, with table tests below): each correction of an object (an apply's `drift_corrected`)
//! within a quiet window after the last one's hold is one more round, and holds the object for twice as long
//! as before ([`FIRST_HOLD`], doubling up to the resync interval, the cap); while held, drift of it is not
//! corrected (`Progress::reapply_due`) and its drift notifications wait for the hold's end ([`wake`]). From
//! [`FIGHT_ROUNDS`] rounds on the object is in a fight: condition `DriftSettled` False (`DriftFight`,
//! Warning) naming it, who changes it and which fields (from the drift watch's `managedFields`), an event
//! once per fight, the gauge `cso_drift_fights`. The fight is over when the object is found as applied a
//! quiet window (the cap) after its last correction; rounds that never became a fight are forgotten a quiet
//! window after their hold.
//!
//! The memory ([`Fights`]) lives in this process, like the resync clock: a restart starts every object at
//! round one.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use cso_api::{ClusterAddon, cluster_addon::cluster_addon_name};
use cso_apply::{DriftCause, ObjectKey};
use futures::{Stream, StreamExt};
use kube::runtime::reflector::ObjectRef;

/// Rounds in a row that make a fight.
pub(crate) const FIGHT_ROUNDS: u32 = 3;
/// The hold after a first correction, doubled each round up to the cap (the resync interval).
pub(crate) const FIRST_HOLD: Duration = Duration::from_secs(1);
/// The most objects the condition names.
const NAMED: usize = 3;

/// `(namespace, cluster)` of a ClusterAddon's Cluster, as the drift watches name it.
pub(crate) type Owner = (String, String);

/// The corrections of one object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Round {
    /// Corrections in a row, each within a quiet window of the last one's hold.
    pub(crate) rounds: u32,
    pub(crate) corrected_at: Instant,
    /// No correction before `corrected_at + hold`.
    pub(crate) hold: Duration,
    /// Who changed it last, as its drift watch saw.
    pub(crate) cause: Option<DriftCause>,
}

impl Round {
    pub(crate) fn hold_end(&self) -> Instant {
        self.corrected_at + self.hold
    }

    pub(crate) fn held(&self, now: Instant) -> bool {
        now < self.hold_end()
    }

    pub(crate) fn in_fight(&self) -> bool {
        self.rounds >= FIGHT_ROUNDS
    }
}

/// The round after a correction at `now`: the next one (its hold doubled, up to `cap`) when the previous
/// correction's hold ended less than a quiet window (`cap`) ago, else the first.
pub(crate) fn corrected(
    previous: Option<&Round>,
    now: Instant,
    cap: Duration,
    cause: Option<DriftCause>,
) -> Round {
    let (rounds, hold) = match previous {
        Some(p) if now < p.hold_end() + cap => (p.rounds + 1, (p.hold * 2).min(cap)),
        _ => (1, FIRST_HOLD.min(cap)),
    };
    Round {
        rounds,
        corrected_at: now,
        hold,
        cause: cause.or_else(|| previous.and_then(|p| p.cause.clone())),
    }
}

/// Whether a look at `now` ends the record of an object: found `as_applied` a quiet window (`cap`) after
/// its last correction (the fight is over), or no correction for a quiet window after its hold.
pub(crate) fn settled(round: &Round, now: Instant, cap: Duration, as_applied: bool) -> bool {
    now >= round.hold_end() + cap || (as_applied && now >= round.corrected_at + cap)
}

/// When to look at a ClusterAddon again for its objects' sake: at the hold's end of an object seen drifted
/// and held (to put it back), and a quiet window after the last correction of an object in a fight (to
/// end the fight when it is over).
pub(crate) fn next_look<'a>(
    rounds: impl Iterator<Item = (&'a Round, bool)>,
    now: Instant,
    cap: Duration,
) -> Option<Duration> {
    rounds
        .filter_map(|(round, drifted)| {
            if drifted && round.held(now) {
                Some(round.hold_end())
            } else if round.in_fight() {
                Some(round.corrected_at + cap)
            } else {
                None
            }
        })
        .min()
        .map(|at| at.saturating_duration_since(now).max(Duration::from_millis(100)))
}

/// The `DriftSettled` message for the objects in a fight (at most [`NAMED`] of them named):
/// `Deployment.apps kube-system/metrics-server: changed by "fighter" (Update) at .spec.replicas; put back 5
/// times, next in 16s`.
pub(crate) fn message<'a>(
    fights: impl Iterator<Item = (&'a ObjectKey, &'a Round)>,
    now: Instant,
) -> Option<String> {
    let mut fights: Vec<_> = fights.filter(|(_, round)| round.in_fight()).collect();
    if fights.is_empty() {
        return None;
    }
    fights.sort_by_key(|(key, _)| key.to_string());
    let named: Vec<String> = fights
        .iter()
        .take(NAMED)
        .map(|(key, round)| {
            let cause = round
                .cause
                .as_ref()
                .map_or_else(|| "changed".to_owned(), ToString::to_string);
            let next = round
                .hold_end()
                .saturating_duration_since(now)
                .as_secs_f64()
                .ceil();
            format!("{key}: {cause}; put back {} times, next in {next}s", round.rounds)
        })
        .collect();
    let mut message = named.join(". ");
    if fights.len() > NAMED {
        message.push_str(&format!(". And {} more objects", fights.len() - NAMED));
    }
    Some(message)
}

/// What to do with a drift notification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Reconcile now.
    Now,
    /// Reconcile when the hold ends.
    At(Instant),
    /// A wake-up is already pending for the ClusterAddon: it will look at this too.
    Pending,
}

/// The drift notification throttle: a ClusterAddon whose drifted object is held is woken once, at the hold's
/// end (`hold_end`), however many notifications come meanwhile (`pending`: a wake-up is scheduled).
pub(crate) fn wake(hold_end: Option<Instant>, pending: bool, now: Instant) -> Wake {
    match hold_end.filter(|end| *end > now) {
        None => Wake::Now,
        Some(_) if pending => Wake::Pending,
        Some(end) => Wake::At(end),
    }
}

/// What a reconcile made of its ClusterAddon's fights.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FightReport {
    /// The `DriftSettled` message, while objects are in a fight.
    pub(crate) message: Option<String>,
    /// The event's note, when an object entered a fight now.
    pub(crate) announce: Option<String>,
    /// Look again this soon.
    pub(crate) next_look: Option<Duration>,
}

/// The ClusterAddon controller's memory of corrections, per Cluster and object, and the wake-ups its drift
/// throttle has pending.
#[derive(Debug, Default)]
pub(crate) struct Fights {
    rounds: Mutex<HashMap<Owner, HashMap<ObjectKey, Round>>>,
    pending: Mutex<HashMap<Owner, Instant>>,
}

impl Fights {
    fn rounds(&self) -> std::sync::MutexGuard<'_, HashMap<Owner, HashMap<ObjectKey, Round>>> {
        self.rounds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether every object of `drifted` (some) is held now: drift that is not to be corrected yet.
    pub(crate) fn all_held(&self, owner: &Owner, drifted: &[ObjectKey], now: Instant) -> bool {
        let rounds = self.rounds();
        let Some(objects) = rounds.get(owner) else {
            return false;
        };
        !drifted.is_empty()
            && drifted
                .iter()
                .all(|key| objects.get(key).is_some_and(|r| r.held(now)))
    }

    /// What a reconcile saw and did: `drifted` the objects the watches found drifted (`None`: could not
    /// tell), `corrected` the objects its apply put back (with their causes), at `now`, the cap `cap`.
    pub(crate) fn reconciled(
        &self,
        owner: &Owner,
        drifted: Option<&[ObjectKey]>,
        corrected: &[(ObjectKey, Option<DriftCause>)],
        now: Instant,
        cap: Duration,
    ) -> FightReport {
        let mut all = self.rounds();
        let objects = all.entry(owner.clone()).or_default();
        let mut entered = Vec::new();
        for (key, cause) in corrected {
            let round = self::corrected(objects.get(key), now, cap, cause.clone());
            if round.rounds == FIGHT_ROUNDS {
                entered.push(key.to_string());
            }
            objects.insert(key.clone(), round);
        }
        objects.retain(|key, round| {
            let as_applied = drifted.is_some_and(|d| !d.contains(key));
            corrected.iter().any(|(k, _)| k == key) || !settled(round, now, cap, as_applied)
        });
        let message = self::message(objects.iter(), now);
        let drifted_now = |key: &ObjectKey| {
            drifted.is_some_and(|d| d.contains(key)) && !corrected.iter().any(|(k, _)| k == key)
        };
        let next_look = self::next_look(objects.iter().map(|(k, r)| (r, drifted_now(k))), now, cap);
        if objects.is_empty() {
            all.remove(owner);
        }
        let announce = (!entered.is_empty()).then(|| {
            format!(
                "put back again and again, now with back-off: {}",
                message.as_deref().unwrap_or(&entered.join(", "))
            )
        });
        FightReport {
            message,
            announce,
            next_look,
        }
    }

    /// The end of the hold of `key` of `owner`, if any.
    pub(crate) fn hold_end(&self, owner: &Owner, key: &ObjectKey) -> Option<Instant> {
        self.rounds()
            .get(owner)
            .and_then(|objects| objects.get(key))
            .map(Round::hold_end)
    }

    /// The throttle's decision for a drift notification of `key` of `owner` ([`wake`]); a wake-up decided
    /// for later is recorded as pending until [`Fights::woken`].
    pub(crate) fn notified(&self, owner: &Owner, key: &ObjectKey, now: Instant) -> Wake {
        let hold_end = self.hold_end(owner, key);
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let decided = wake(hold_end, pending.contains_key(owner), now);
        if let Wake::At(at) = decided {
            pending.insert(owner.clone(), at);
        }
        decided
    }

    /// The pending wake-up of `owner` happened.
    pub(crate) fn woken(&self, owner: &Owner) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(owner);
    }

    /// Objects in a fight, over every ClusterAddon (the gauge `cso_drift_fights`).
    pub(crate) fn in_fight(&self) -> usize {
        self.rounds()
            .values()
            .flat_map(HashMap::values)
            .filter(|r| r.in_fight())
            .count()
    }

    /// Forgets `owner` (its ClusterAddon is gone).
    pub(crate) fn forget(&self, owner: &Owner) {
        self.rounds().remove(owner);
    }
}

/// The drift notification throttle: the ClusterAddons to reconcile for the drift `told` by the workload
/// clusters' watches (`(namespace, cluster, object)`), each held one woken once, when its hold ends
/// ([`Fights::notified`]). Only drift goes through it: first reconciles, spec and Cluster changes reach the
/// controller directly.
pub(crate) fn drift_wakes(
    fights: Arc<Fights>,
    told: impl Stream<Item = (String, String, ObjectKey)> + Send + 'static,
) -> impl Stream<Item = ObjectRef<ClusterAddon>> + Send + 'static {
    let (later, woken) = tokio::sync::mpsc::unbounded_channel::<Owner>();
    let now = told.filter_map(move |(namespace, cluster, key)| {
        let owner = (namespace, cluster);
        let wake_now = match fights.notified(&owner, &key, Instant::now()) {
            Wake::Now => Some(owner),
            Wake::At(at) => {
                let (later, fights) = (later.clone(), fights.clone());
                tokio::spawn(async move {
                    tokio::time::sleep_until(at.into()).await;
                    fights.woken(&owner);
                    let _ = later.send(owner);
                });
                None
            }
            Wake::Pending => None,
        };
        std::future::ready(wake_now)
    });
    let later = futures::stream::unfold(woken, |mut woken| async move {
        woken.recv().await.map(|owner| (owner, woken))
    });
    futures::stream::select(now, later)
        .map(|(namespace, cluster)| ObjectRef::new(&cluster_addon_name(&cluster)).within(&namespace))
}

#[cfg(test)]
mod tests {
    use cso_apply::Writer;
    use rstest::rstest;

    use super::*;

    const CAP: Duration = Duration::from_secs(20);

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            group: "apps".into(),
            kind: "Deployment".into(),
            namespace: "kube-system".into(),
            name: name.into(),
        }
    }

    fn fighter() -> DriftCause {
        DriftCause::Written(Writer {
            manager: "fighter".into(),
            operation: "Update".into(),
            subresource: None,
            fields: vec![".spec.template.metadata.labels.domain".into()],
            more_fields: 0,
            time: None,
            ours: false,
        })
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn round(rounds: u32, at: Instant, hold: f64) -> Round {
        Round {
            rounds,
            corrected_at: at,
            hold: secs(hold),
            cause: None,
        }
    }

    #[rstest]
    #[case::a_first_correction(None, 0.0, (1, 1.0))]
    #[case::again_at_the_holds_end(Some((1, 1.0)), 1.0, (2, 2.0))]
    #[case::doubling(Some((4, 8.0)), 8.5, (5, 16.0))]
    #[case::capped(Some((5, 16.0)), 16.0, (6, 20.0))]
    #[case::stays_capped(Some((6, 20.0)), 20.0, (7, 20.0))]
    #[case::within_the_quiet_window(Some((1, 1.0)), 20.9, (2, 2.0))]
    #[case::after_the_quiet_window(Some((3, 4.0)), 24.0, (1, 1.0))]
    fn each_correction_soon_after_the_last_is_one_more_round_and_doubles_the_hold(
        #[case] previous: Option<(u32, f64)>,
        #[case] after: f64,
        #[case] expected: (u32, f64),
    ) {
        let t0 = Instant::now();
        let previous = previous.map(|(rounds, hold)| round(rounds, t0, hold));
        let next = corrected(previous.as_ref(), t0 + secs(after), CAP, None);
        assert_eq!((next.rounds, next.hold), (expected.0, secs(expected.1)));
        assert_eq!(next.in_fight(), expected.0 >= FIGHT_ROUNDS);
    }

    #[test]
    fn a_cap_shorter_than_the_first_hold_holds_for_the_cap() {
        let next = corrected(None, Instant::now(), Duration::from_millis(300), None);
        assert_eq!(next.hold, Duration::from_millis(300));
    }

    #[test]
    fn the_cause_seen_last_is_kept() {
        let t0 = Instant::now();
        let first = corrected(None, t0, CAP, Some(fighter()));
        let second = corrected(Some(&first), t0 + secs(1.0), CAP, None);
        assert_eq!(
            second.cause,
            Some(fighter()),
            "a correction without a cause seen keeps the last one"
        );
    }

    #[rstest]
    #[case::as_applied_soon_after(3, 4.0, 5.0, true, false)]
    #[case::as_applied_a_quiet_window_after(3, 4.0, 20.0, true, true)]
    #[case::drifted_a_quiet_window_after(3, 4.0, 20.0, false, false)]
    #[case::nothing_for_a_quiet_window_after_the_hold(1, 1.0, 21.0, false, true)]
    #[case::a_first_round_as_applied_at_its_holds_end(1, 1.0, 1.0, true, false)]
    fn a_record_ends_when_the_object_stayed_as_applied_or_nothing_happened(
        #[case] rounds: u32,
        #[case] hold: f64,
        #[case] after: f64,
        #[case] as_applied: bool,
        #[case] expected: bool,
    ) {
        let t0 = Instant::now();
        assert_eq!(
            settled(&round(rounds, t0, hold), t0 + secs(after), CAP, as_applied),
            expected
        );
    }

    #[rstest]
    #[case::not_held(None, false, "now")]
    #[case::hold_over(Some(-1.0), false, "now")]
    #[case::held(Some(3.0), false, "at the hold's end")]
    #[case::held_and_already_pending(Some(3.0), true, "pending")]
    #[case::pending_but_not_held(None, true, "now")]
    fn a_held_addon_is_woken_once_at_its_holds_end(
        #[case] hold_end: Option<f64>,
        #[case] pending: bool,
        #[case] expected: &str,
    ) {
        let now = Instant::now() + secs(10.0);
        let hold_end = hold_end.map(|s| if s < 0.0 { now - secs(-s) } else { now + secs(s) });
        let expected = match expected {
            "now" => Wake::Now,
            "pending" => Wake::Pending,
            _ => Wake::At(hold_end.unwrap()),
        };
        assert_eq!(wake(hold_end, pending, now), expected);
    }

    #[test]
    fn a_fight_is_reported_held_looked_at_again_and_over_once_the_object_stays_as_applied() {
        let fights = Fights::default();
        let owner: Owner = ("ns".into(), "c1".into());
        let (web, other) = (key("metrics-server"), key("web"));
        let t0 = Instant::now();
        let put_back = [(web.clone(), Some(fighter()))];
        let mut at = t0;
        let mut reports = Vec::new();
        for _ in 0..FIGHT_ROUNDS {
            reports.push(fights.reconciled(&owner, Some(std::slice::from_ref(&web)), &put_back, at, CAP));
            assert!(
                fights.all_held(&owner, std::slice::from_ref(&web), at),
                "held right after a correction"
            );
            assert!(
                !fights.all_held(&owner, &[web.clone(), other.clone()], at),
                "another object's drift is put back at once"
            );
            at = fights.hold_end(&owner, &web).unwrap();
        }
        assert!(
            reports[..2]
                .iter()
                .all(|r| r.message.is_none() && r.announce.is_none()),
            "{reports:?}"
        );
        let fight = reports.last().unwrap();
        assert_eq!(
            fight.message.as_deref(),
            Some(
                "Deployment.apps kube-system/metrics-server: changed by \"fighter\" (Update) at \
                 .spec.template.metadata.labels.domain; put back 3 times, next in 4s"
            )
        );
        assert!(
            fight.announce.as_deref().is_some_and(|a| a.contains("back-off")),
            "{fight:?}"
        );
        assert_eq!(fights.in_fight(), 1);
        let last = at - secs(4.0);
        // Drifted again while held: looked at again at the hold's end, nothing announced again.
        let seen = fights.reconciled(
            &owner,
            Some(std::slice::from_ref(&web)),
            &[],
            last + secs(1.0),
            CAP,
        );
        assert_eq!(seen.next_look, Some(secs(3.0)));
        assert_eq!(seen.announce, None);
        // The writer stopped: as applied, but not yet for a quiet window; then over.
        let quiet = fights.reconciled(&owner, Some(&[]), &[], at, CAP);
        assert!(quiet.message.is_some(), "still reported");
        assert_eq!(
            quiet.next_look,
            Some(CAP - secs(4.0)),
            "looked at again to end it"
        );
        let over = fights.reconciled(&owner, Some(&[]), &[], last + CAP, CAP);
        assert_eq!(over, FightReport::default());
        assert_eq!(fights.in_fight(), 0);
        assert!(fights.rounds().is_empty(), "nothing kept");
    }

    #[test]
    fn a_look_that_cannot_tell_ends_no_fight() {
        let fights = Fights::default();
        let owner: Owner = ("ns".into(), "c1".into());
        let t0 = Instant::now();
        let mut at = t0;
        for _ in 0..FIGHT_ROUNDS {
            fights.reconciled(&owner, None, &[(key("a"), None)], at, CAP);
            at = fights.hold_end(&owner, &key("a")).unwrap();
        }
        let unknown = fights.reconciled(&owner, None, &[], at + secs(10.0), CAP);
        assert!(
            unknown
                .message
                .is_some_and(|m| m.contains(": changed; put back 3 times"))
        );
    }

    #[test]
    fn many_objects_in_a_fight_are_counted_not_all_named() {
        let fights = Fights::default();
        let owner: Owner = ("ns".into(), "c1".into());
        let keys: Vec<ObjectKey> = (0..5).map(|i| key(&format!("o{i}"))).collect();
        let put_back: Vec<_> = keys.iter().map(|k| (k.clone(), None)).collect();
        let mut at = Instant::now();
        let mut report = FightReport::default();
        for _ in 0..FIGHT_ROUNDS {
            report = fights.reconciled(&owner, Some(&keys), &put_back, at, CAP);
            at += secs(10.0);
        }
        let message = report.message.unwrap();
        assert!(message.ends_with(". And 2 more objects"), "{message}");
        assert_eq!(fights.in_fight(), 5);
    }

    #[test]
    fn the_throttle_wakes_a_held_addon_once() {
        let fights = Fights::default();
        let owner: Owner = ("ns".into(), "c1".into());
        let t0 = Instant::now();
        fights.reconciled(&owner, Some(&[key("a")]), &[(key("a"), None)], t0, CAP);
        let end = fights.hold_end(&owner, &key("a")).unwrap();
        assert_eq!(fights.notified(&owner, &key("a"), t0), Wake::At(end));
        assert_eq!(fights.notified(&owner, &key("a"), t0), Wake::Pending);
        assert_eq!(
            fights.notified(&owner, &key("b"), t0),
            Wake::Now,
            "another object is not held"
        );
        fights.woken(&owner);
        assert_eq!(fights.notified(&owner, &key("a"), end), Wake::Now);
    }
}
