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
//! Warning) on each ClusterAddon that put it back, naming it, who changes it and which fields (from the drift
//! watch's `managedFields`), an event once per fight, the gauge `cso_drift_fights`. The fight is over when the
//! object is found as applied a quiet window (the cap) after its last correction; rounds that never became a
//! fight are forgotten a quiet window after their hold.
//!
//! Holds end when the fight does ([`late`]): a writer in a fight answers each correction within about the
//! same time (its *answer*: from a correction to the first drift seen after it). Drift first seen at least
//! [`LATE_AFTER`] and four answers after the last correction, while that correction's hold lasts, is no
//! answer of the writer (it stopped, and a person or another writer changed the object): the object's record
//! is dropped and the drift put back at once, as a first correction. A correction counts from its apply's
//! start: drift told before it is the last round's (a notification the throttle reads only after the
//! correction is of drift that correction put back), drift told since is the new round's, even when the
//! reconcile has not ended yet. (The events of the apply's own writes are not told at all: `cso_apply::drift`.
//! Taken for the writer's answer, they once kept a later deletion waiting for the hold's end.) Seen in a
//! chaos run: after a fight
//! that had grown the hold to the cap (300 s), a deletion 25 s after the last correction was put back
//! 275 s later.
//!
//! An object is one object on one API server ([`Place`]): Clusters whose kubeconfigs point at the same API
//! server share its rounds and its hold, so that the object is put back once per hold however many
//! ClusterAddons fight over it, and the first of them to find it drifted claims it for the moment its apply
//! takes ([`CLAIM`]; they are woken together). Per ClusterAddon, a fleet of them would write the object
//! `fleet / cap` times a second for ever.
//!
//! The memory ([`Fights`]) lives in this process, like the resync clock: a restart starts every object at
//! round one.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use cso_api::{ClusterAddon, cluster_addon::cluster_addon_name};
use cso_apply::{DriftCause, ObjectKey};
use futures::{Stream, StreamExt};
use kube::runtime::reflector::ObjectRef;

use crate::context::DriftTold;

/// Rounds in a row that make a fight.
pub(crate) const FIGHT_ROUNDS: u32 = 3;
/// The hold after a first correction, doubled each round up to the cap (the resync interval).
pub(crate) const FIRST_HOLD: Duration = Duration::from_secs(1);
/// The most objects the condition names.
const NAMED: usize = 3;
/// Drift seen this long after the last correction (and four of the writer's answers) is not the writer's
/// answer ([`late`]).
pub(crate) const LATE_AFTER: Duration = Duration::from_secs(10);

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
    /// The writer's slowest answer in this fight: how soon after a correction the drift the next one put back
    /// was first seen (the longest of the rounds); none for a first round.
    pub(crate) answer: Option<Duration>,
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

/// The round after a correction at `now` of drift first seen at `seen` (now when not told): the next one (its
/// hold doubled, up to `cap`) when the previous correction's hold ended less than a quiet window (`cap`) ago,
/// else the first.
pub(crate) fn corrected(
    previous: Option<&Round>,
    now: Instant,
    seen: Option<Instant>,
    cap: Duration,
    cause: Option<DriftCause>,
) -> Round {
    let (previous, rounds, hold) = match previous {
        Some(p) if now < p.hold_end() + cap => (Some(p), p.rounds + 1, (p.hold * 2).min(cap)),
        _ => (None, 1, FIRST_HOLD.min(cap)),
    };
    Round {
        rounds,
        corrected_at: now,
        hold,
        cause: cause.or_else(|| previous.and_then(|p| p.cause.clone())),
        // An answer is known only from a drift notification; a correction without one (a resync found it)
        // keeps what was known.
        answer: previous.and_then(|p| match seen {
            Some(seen) => {
                let this = seen.saturating_duration_since(p.corrected_at);
                Some(p.answer.map_or(this, |slowest| slowest.max(this)))
            }
            None => p.answer,
        }),
    }
}

/// Whether drift first seen at `seen`, while `round`'s hold lasts, comes too late to be the answer of the
/// writer `round` fought: at least [`LATE_AFTER`] and four of its answers after the correction. A first round
/// (no answer known) is never late: its hold is short anyway.
pub(crate) fn late(round: &Round, seen: Instant) -> bool {
    let Some(answer) = round.answer else {
        return false;
    };
    round.held(seen) && seen.saturating_duration_since(round.corrected_at) >= LATE_AFTER.max(answer * 4)
}

/// Whether a look at `now` ends the record of an object: found `as_applied` a quiet window (`cap`) after
/// its hold ended (nobody changed it since: the fight is over; at the hold's end itself the last one to put
/// it back finds it as it left it, while the others are about to put it back), or not put back for two
/// quiet windows after its hold (nothing happens to it any more, whatever the looks tell).
pub(crate) fn settled(round: &Round, now: Instant, cap: Duration, as_applied: bool) -> bool {
    let quiet = round.hold_end() + cap;
    (as_applied && now >= quiet) || now >= quiet + cap
}

/// When to look at a ClusterAddon again for its objects' sake: at the hold's end of an object seen drifted
/// and held (to put it back), and a quiet window after the hold of an object in a fight that was found as
/// applied (to end the fight when it is over). An object found drifted and not held is being put
/// back (by this reconcile, or by another ClusterAddon on the same API server, whose apply tells the drift
/// watches): nothing to look at then.
pub(crate) fn next_look<'a>(
    rounds: impl Iterator<Item = (&'a Round, bool)>,
    now: Instant,
    cap: Duration,
) -> Option<Duration> {
    rounds
        .filter_map(|(round, drifted)| {
            if drifted {
                round.held(now).then(|| round.hold_end())
            } else {
                let over = round.hold_end() + cap;
                (round.in_fight() && now < over).then_some(over)
            }
        })
        .min()
        .map(|at| at.saturating_duration_since(now).max(Duration::from_millis(100)))
}

/// The `DriftSettled` message for the objects in a fight (at most [`NAMED`] of them named):
/// `Deployment.apps kube-system/metrics-server: changed by "fighter" (Update) at .spec.replicas; put back 5
/// times, now at most every 16s`. It changes only with a correction, so that looks between them write no
/// status.
pub(crate) fn message<'a>(fights: impl Iterator<Item = (&'a ObjectKey, &'a Round)>) -> Option<String> {
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
            format!(
                "{key}: {cause}; put back {} times, now at most every {}s",
                round.rounds,
                round.hold.as_secs_f64().ceil()
            )
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

/// How long a ClusterAddon that found a drifted object not held has it to itself: others that find it drifted
/// meanwhile (Clusters whose kubeconfigs point at one API server, woken together) wait for its apply.
const CLAIM: Duration = Duration::from_secs(5);

/// One object on one API server: `(server, object)`. Clusters whose kubeconfigs point at the same API server
/// share its objects, and so their rounds and holds: one object, one back-off.
pub(crate) type Place = (String, ObjectKey);

/// The ClusterAddon controller's memory of corrections, per object and API server, which ClusterAddons took
/// part, and the wake-ups its drift throttle has pending.
#[derive(Debug, Default)]
pub(crate) struct Fights(Mutex<Memory>);

#[derive(Debug, Default)]
struct Memory {
    rounds: HashMap<Place, Round>,
    /// When drift of an object with a record was first seen since its last correction.
    seen: HashMap<Place, Instant>,
    /// Objects a ClusterAddon is putting back now (see [`CLAIM`]).
    claims: HashMap<Place, Claim>,
    /// The API server of each ClusterAddon's Cluster and the objects there it put back.
    addons: HashMap<Owner, (String, BTreeSet<ObjectKey>)>,
    pending: HashMap<Owner, Instant>,
}

/// An object a ClusterAddon is putting back.
#[derive(Debug)]
struct Claim {
    by: Owner,
    /// The others wait for its apply until then.
    until: Instant,
    /// The end of the hold its correction will bring: the others' drift notifications meanwhile (of its own
    /// apply) wait for that.
    hold_end: Instant,
}

impl Memory {
    /// The claim on `place` of a ClusterAddon other than `owner`, if one holds.
    fn claimed(&self, place: &Place, owner: &Owner, now: Instant) -> Option<&Claim> {
        self.claims
            .get(place)
            .filter(|claim| claim.by != *owner && now < claim.until)
    }

    /// Whether `place` is held for `owner`: by its back-off, or claimed by another ClusterAddon.
    fn held(&self, place: &Place, owner: &Owner, now: Instant) -> bool {
        self.rounds.get(place).is_some_and(|r| r.held(now)) || self.claimed(place, owner, now).is_some()
    }
}

impl Fights {
    fn memory(&self) -> std::sync::MutexGuard<'_, Memory> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether every object of `drifted` (some) on `server` is held now: drift that is not to be corrected
    /// yet. When not, `owner` claims them for a moment (its apply is on the way; `cap` to tell the hold it
    /// will bring).
    pub(crate) fn claim(
        &self,
        owner: &Owner,
        server: &str,
        drifted: &[ObjectKey],
        now: Instant,
        cap: Duration,
    ) -> bool {
        let mut memory = self.memory();
        memory
            .addons
            .entry(owner.clone())
            .or_insert_with(|| (server.to_owned(), BTreeSet::new()))
            .0 = server.to_owned();
        let places: Vec<Place> = drifted.iter().map(|k| (server.to_owned(), k.clone())).collect();
        if !places.is_empty() && places.iter().all(|p| memory.held(p, owner, now)) {
            return true;
        }
        for place in places {
            if !memory.held(&place, owner, now) {
                let hold_end = self::corrected(memory.rounds.get(&place), now, None, cap, None).hold_end();
                let claim = Claim {
                    by: owner.clone(),
                    until: now + CLAIM,
                    hold_end,
                };
                memory.claims.insert(place, claim);
            }
        }
        false
    }

    /// What a reconcile saw and did on `server` (its Cluster's API server; `None`: not reached):
    /// `drifted` the objects the watches found drifted (`None`: could not tell), `corrected` the objects its
    /// apply put back (with their causes), writing from `written` on, at `now`, the cap `cap`.
    ///
    /// A correction counts from `written`: drift seen before it is the last round's (the writer's answer to
    /// the last correction), drift seen since is this one's (a writer that answers before the reconcile ends).
    #[allow(
        clippy::too_many_arguments,
        reason = "what one reconcile saw and did, each told apart"
    )]
    pub(crate) fn reconciled(
        &self,
        owner: &Owner,
        server: Option<&str>,
        drifted: Option<&[ObjectKey]>,
        corrected: &[(ObjectKey, Option<DriftCause>)],
        written: Instant,
        now: Instant,
        cap: Duration,
    ) -> FightReport {
        let mut memory = self.memory();
        let Memory {
            rounds,
            seen,
            claims,
            addons,
            ..
        } = &mut *memory;
        let known = addons.get(owner).map(|(server, _)| server.clone());
        let Some(server) = server.map(str::to_owned).or(known) else {
            return FightReport::default();
        };
        let (at, involved) = addons
            .entry(owner.clone())
            .or_insert_with(|| (server.clone(), BTreeSet::new()));
        if *at != server {
            // Another API server (a new kubeconfig): what happened on the old one is no concern of it now.
            *at = server.clone();
            involved.clear();
        }
        let place = |key: &ObjectKey| (server.clone(), key.clone());
        let mut entered = Vec::new();
        for (key, cause) in corrected {
            let (first_seen, since) = match seen.remove(&place(key)) {
                Some(at) if at < written => (Some(at), None),
                since => (None, since),
            };
            let round = self::corrected(rounds.get(&place(key)), written, first_seen, cap, cause.clone());
            if let Some(at) = since {
                seen.insert(place(key), at);
            }
            if round.rounds == FIGHT_ROUNDS {
                entered.push(key.to_string());
            }
            rounds.insert(place(key), round);
            claims.remove(&place(key));
            involved.insert(key.clone());
        }
        involved.retain(|key| {
            let as_applied = drifted.is_some_and(|d| !d.contains(key));
            let just_corrected = corrected.iter().any(|(k, _)| k == key);
            match rounds.get(&place(key)) {
                Some(round) if !just_corrected && settled(round, now, cap, as_applied) => {
                    rounds.remove(&place(key));
                    seen.remove(&place(key));
                    false
                }
                Some(_) => true,
                None => false,
            }
        });
        claims.retain(|_, claim| now < claim.until);
        let mine: Vec<(&ObjectKey, &Round)> = involved
            .iter()
            .filter_map(|key| Some((key, rounds.get(&place(key))?)))
            .collect();
        let message = self::message(mine.iter().copied());
        let drifted_now = |key: &ObjectKey| {
            drifted.is_some_and(|d| d.contains(key)) && !corrected.iter().any(|(k, _)| k == key)
        };
        let next_look = self::next_look(mine.iter().map(|(k, r)| (*r, drifted_now(k))), now, cap);
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

    /// The end of the hold of `key` of `owner`'s API server, if any.
    /// With another ClusterAddon's claim on it, the end of the hold its correction brings.
    pub(crate) fn hold_end(&self, owner: &Owner, key: &ObjectKey) -> Option<Instant> {
        let memory = self.memory();
        let (server, _) = memory.addons.get(owner)?;
        let place = (server.clone(), key.clone());
        let round = memory.rounds.get(&place).map(Round::hold_end);
        let claim = memory
            .claimed(&place, owner, Instant::now())
            .map(|claim| claim.hold_end);
        round.max(claim)
    }

    /// The throttle's decision at `now` for a drift notification of `key` of `owner`, told at `told` ([`wake`]);
    /// a wake-up decided for later is recorded as pending until [`Fights::woken`]. Drift that comes [`late`]
    /// ends the record of the object: it is put back now. Drift told before the object's last correction
    /// began (read by the throttle only after it) is no sight of new drift: that correction put it back.
    pub(crate) fn notified(&self, owner: &Owner, key: &ObjectKey, told: Instant, now: Instant) -> Wake {
        {
            let mut memory = self.memory();
            let Memory {
                rounds, seen, addons, ..
            } = &mut *memory;
            if let Some((server, _)) = addons.get(owner) {
                let place = (server.clone(), key.clone());
                if let Some(round) = rounds.get(&place).filter(|round| told >= round.corrected_at) {
                    let first_seen = *seen.entry(place.clone()).or_insert(told);
                    if late(round, first_seen) {
                        tracing::info!(object = %key, after = ?first_seen.saturating_duration_since(round.corrected_at),
                            "drift long after the last correction: not the fighting writer's answer, put back now");
                        rounds.remove(&place);
                        seen.remove(&place);
                    }
                }
            }
        }
        let hold_end = self.hold_end(owner, key);
        let mut memory = self.memory();
        let decided = wake(hold_end, memory.pending.contains_key(owner), now);
        if let Wake::At(at) = decided {
            memory.pending.insert(owner.clone(), at);
        }
        decided
    }

    /// The pending wake-up of `owner` happened.
    pub(crate) fn woken(&self, owner: &Owner) {
        self.memory().pending.remove(owner);
    }

    /// Objects in a fight, over every API server (the gauge `cso_drift_fights`).
    pub(crate) fn in_fight(&self) -> usize {
        self.memory().rounds.values().filter(|r| r.in_fight()).count()
    }

    /// Forgets `owner` (its ClusterAddon is gone), and the rounds of objects no other ClusterAddon took part in.
    pub(crate) fn forget(&self, owner: &Owner) {
        let mut memory = self.memory();
        memory.addons.remove(owner);
        memory.pending.remove(owner);
        let Memory {
            rounds, seen, addons, ..
        } = &mut *memory;
        rounds.retain(|(server, key), _| {
            addons
                .values()
                .any(|(at, involved)| at == server && involved.contains(key))
        });
        seen.retain(|place, _| rounds.contains_key(place));
    }
}

/// The drift notification throttle: the ClusterAddons to reconcile for the drift `told` by the workload
/// clusters' watches, each held one woken once, when its hold ends ([`Fights::notified`]). Only drift goes
/// through it: first reconciles, spec and Cluster changes reach the controller directly.
pub(crate) fn drift_wakes(
    fights: Arc<Fights>,
    told: impl Stream<Item = DriftTold> + Send + 'static,
) -> impl Stream<Item = ObjectRef<ClusterAddon>> + Send + 'static {
    let (later, woken) = tokio::sync::mpsc::unbounded_channel::<Owner>();
    let now = told.filter_map(move |told| {
        let owner = (told.namespace, told.cluster);
        let wake_now = match fights.notified(&owner, &told.object, told.at, Instant::now()) {
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
            answer: None,
        }
    }

    #[rstest]
    // A fighter answering in 0.2 s: drift 1 s after the correction is its answer, drift 12 s after is not.
    #[case::the_fighters_answer(Some(0.2), 300.0, 1.0, false)]
    #[case::long_after_the_fighter_stopped(Some(0.2), 300.0, 12.0, true)]
    #[case::just_at_the_late_mark(Some(0.2), 300.0, 10.0, true)]
    // A writer that answers every 30 s is answering, even late in a long hold.
    #[case::a_slow_writer_answering(Some(30.0), 300.0, 35.0, false)]
    #[case::a_slow_writer_silent_for_four_answers(Some(30.0), 300.0, 121.0, true)]
    // After the hold there is no hold to end; a first round has no answer known.
    #[case::after_the_hold(Some(0.2), 8.0, 12.0, false)]
    #[case::a_first_round(None, 300.0, 50.0, false)]
    fn drift_long_after_the_last_correction_is_no_answer_of_the_writer(
        #[case] answer: Option<f64>,
        #[case] hold: f64,
        #[case] seen_after: f64,
        #[case] expected: bool,
    ) {
        let t0 = Instant::now();
        let mut round = round(6, t0, hold);
        round.answer = answer.map(secs);
        assert_eq!(late(&round, t0 + secs(seen_after)), expected);
    }

    #[test]
    fn a_correction_records_the_writers_slowest_answer() {
        let t0 = Instant::now();
        let first = corrected(None, t0, None, CAP, None);
        assert_eq!(first.answer, None);
        // Seen 0.3 s after the first correction, put back at its hold's end.
        let second = corrected(Some(&first), t0 + secs(1.0), Some(t0 + secs(0.3)), CAP, None);
        assert_eq!(second.answer, Some(secs(0.3)));
        // A slower answer (1.5 s), then a quick one: the slowest stays.
        let third = corrected(Some(&second), t0 + secs(3.0), Some(t0 + secs(2.5)), CAP, None);
        let fourth = corrected(Some(&third), t0 + secs(7.0), Some(t0 + secs(3.1)), CAP, None);
        assert_eq!((third.answer, fourth.answer), (Some(secs(1.5)), Some(secs(1.5))));
        // A correction no notification told of keeps the slowest answer known.
        let fifth = corrected(Some(&fourth), t0 + secs(15.0), None, CAP, None);
        assert_eq!(fifth.answer, Some(secs(1.5)));
        // After the quiet window a new fight starts: no answer known.
        let fresh = corrected(Some(&fifth), t0 + secs(100.0), None, CAP, None);
        assert_eq!((fresh.rounds, fresh.answer), (1, None));
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
        let next = corrected(previous.as_ref(), t0 + secs(after), None, CAP, None);
        assert_eq!((next.rounds, next.hold), (expected.0, secs(expected.1)));
        assert_eq!(next.in_fight(), expected.0 >= FIGHT_ROUNDS);
    }

    #[test]
    fn a_cap_shorter_than_the_first_hold_holds_for_the_cap() {
        let next = corrected(None, Instant::now(), None, Duration::from_millis(300), None);
        assert_eq!(next.hold, Duration::from_millis(300));
    }

    #[test]
    fn the_cause_seen_last_is_kept() {
        let t0 = Instant::now();
        let first = corrected(None, t0, None, CAP, Some(fighter()));
        let second = corrected(Some(&first), t0 + secs(1.0), None, CAP, None);
        assert_eq!(
            second.cause,
            Some(fighter()),
            "a correction without a cause seen keeps the last one"
        );
    }

    #[rstest]
    #[case::as_applied_soon_after(3, 4.0, 5.0, true, false)]
    #[case::as_applied_a_quiet_window_after_the_hold(3, 4.0, 24.0, true, true)]
    #[case::drifted_a_quiet_window_after_the_hold(3, 4.0, 24.0, false, false)]
    #[case::the_last_to_put_it_back_at_the_holds_end(6, 20.0, 20.0, true, false)]
    #[case::nothing_for_two_quiet_windows_after_the_hold(1, 1.0, 41.0, false, true)]
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
    #[case::drifted_and_held(3, 4.0, 1.0, true, Some(3.0))]
    #[case::drifted_not_held_being_put_back(3, 4.0, 5.0, true, None)]
    #[case::in_a_fight_as_applied(3, 4.0, 5.0, false, Some(19.0))]
    #[case::in_a_fight_past_the_quiet_window(3, 4.0, 25.0, false, None)]
    #[case::not_a_fight_as_applied(1, 1.0, 2.0, false, None)]
    fn looked_at_again_at_the_holds_end_or_to_end_a_fight(
        #[case] rounds: u32,
        #[case] hold: f64,
        #[case] after: f64,
        #[case] drifted: bool,
        #[case] expected: Option<f64>,
    ) {
        let t0 = Instant::now();
        let round = round(rounds, t0, hold);
        assert_eq!(
            next_look([(&round, drifted)].into_iter(), t0 + secs(after), CAP),
            expected.map(secs)
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

    const SERVER: &str = "https://10.0.0.1:6443/";

    fn owner(cluster: &str) -> Owner {
        ("ns".into(), cluster.into())
    }

    #[test]
    fn a_fight_is_reported_held_looked_at_again_and_over_once_the_object_stays_as_applied() {
        let fights = Fights::default();
        let owner = owner("c1");
        let (web, other) = (key("metrics-server"), key("web"));
        let t0 = Instant::now();
        let put_back = [(web.clone(), Some(fighter()))];
        let mut at = t0;
        let mut reports = Vec::new();
        for _ in 0..FIGHT_ROUNDS {
            assert!(
                !fights.claim(&owner, SERVER, std::slice::from_ref(&web), at, CAP),
                "not held: put back"
            );
            reports.push(fights.reconciled(
                &owner,
                Some(SERVER),
                Some(std::slice::from_ref(&web)),
                &put_back,
                at,
                at,
                CAP,
            ));
            assert!(
                fights.claim(&owner, SERVER, std::slice::from_ref(&web), at, CAP),
                "held right after a correction"
            );
            assert!(
                !fights.claim(&owner, SERVER, &[web.clone(), other.clone()], at, CAP),
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
                 .spec.template.metadata.labels.domain; put back 3 times, now at most every 4s"
            )
        );
        assert!(
            fight.announce.as_deref().is_some_and(|a| a.contains("back-off")),
            "{fight:?}"
        );
        assert_eq!(fights.in_fight(), 1);
        let last = at - secs(4.0);
        // Drifted again while held: looked at again at the hold's end, nothing announced again, the same
        // message (no status write).
        let seen = fights.reconciled(
            &owner,
            Some(SERVER),
            Some(std::slice::from_ref(&web)),
            &[],
            last + secs(1.0),
            last + secs(1.0),
            CAP,
        );
        assert_eq!(seen.next_look, Some(secs(3.0)));
        assert_eq!((seen.announce, &seen.message), (None, &fight.message));
        // The writer stopped: as applied, but not yet for a quiet window; then over.
        let quiet = fights.reconciled(&owner, Some(SERVER), Some(&[]), &[], at, at, CAP);
        assert!(quiet.message.is_some(), "still reported");
        assert_eq!(quiet.next_look, Some(CAP), "looked at again to end it");
        let over = fights.reconciled(&owner, None, Some(&[]), &[], at + CAP, at + CAP, CAP);
        assert_eq!(over, FightReport::default());
        assert_eq!(fights.in_fight(), 0);
        assert!(fights.memory().rounds.is_empty(), "nothing kept");
    }

    #[test]
    fn clusters_on_one_api_server_share_an_objects_back_off() {
        let fights = Fights::default();
        let (a, b, elsewhere) = (owner("a"), owner("b"), owner("c"));
        let object = [key("metrics-server")];
        let t0 = Instant::now();
        assert!(!fights.claim(&a, SERVER, &object, t0, CAP), "a puts it back");
        assert!(
            fights.claim(&b, SERVER, &object, t0, CAP),
            "b, woken with a, waits for a's apply"
        );
        assert_eq!(
            fights.notified(&b, &object[0], t0, t0),
            Wake::At(t0 + FIRST_HOLD),
            "b's notifications of a's apply wait for the hold it brings"
        );
        fights.woken(&b);
        assert!(
            !fights.claim(&elsewhere, "https://10.0.0.2:6443/", &object, t0, CAP),
            "another API server's"
        );
        fights.reconciled(
            &a,
            Some(SERVER),
            Some(&object),
            &[(object[0].clone(), None)],
            t0,
            t0,
            CAP,
        );
        assert!(
            fights.claim(&b, SERVER, &object, t0 + secs(0.5), CAP),
            "held for b too"
        );
        // b puts it back at the hold's end: the next round of the same object.
        let after = t0 + secs(1.0);
        assert!(!fights.claim(&b, SERVER, &object, after, CAP));
        fights.reconciled(
            &b,
            Some(SERVER),
            Some(&object),
            &[(object[0].clone(), None)],
            after,
            after,
            CAP,
        );
        assert_eq!(
            fights.hold_end(&a, &object[0]),
            Some(after + secs(2.0)),
            "a sees b's round"
        );
        let third = after + secs(2.0);
        let report = fights.reconciled(
            &a,
            Some(SERVER),
            Some(&object),
            &[(object[0].clone(), None)],
            third,
            third,
            CAP,
        );
        assert!(report.message.is_some_and(|m| m.contains("put back 3 times")));
        let b_sees = fights.reconciled(&b, Some(SERVER), Some(&object), &[], third, third, CAP);
        assert!(
            b_sees.message.is_some(),
            "reported on every ClusterAddon that took part"
        );
        assert!(b_sees.announce.is_none(), "announced once");
        assert_eq!(fights.in_fight(), 1, "one object");
        fights.forget(&a);
        assert_eq!(fights.in_fight(), 1, "b still takes part");
        fights.forget(&b);
        assert_eq!(fights.in_fight(), 0);
    }

    #[test]
    fn a_look_that_cannot_tell_ends_no_fight() {
        let fights = Fights::default();
        let owner = owner("c1");
        let t0 = Instant::now();
        let mut at = t0;
        for _ in 0..FIGHT_ROUNDS {
            fights.reconciled(&owner, Some(SERVER), None, &[(key("a"), None)], at, at, CAP);
            at = fights.hold_end(&owner, &key("a")).unwrap();
        }
        let unknown = fights.reconciled(&owner, None, None, &[], at + secs(10.0), at + secs(10.0), CAP);
        assert!(
            unknown
                .message
                .is_some_and(|m| m.contains(": changed; put back 3 times"))
        );
    }

    #[test]
    fn many_objects_in_a_fight_are_counted_not_all_named() {
        let fights = Fights::default();
        let owner = owner("c1");
        let keys: Vec<ObjectKey> = (0..5).map(|i| key(&format!("o{i}"))).collect();
        let put_back: Vec<_> = keys.iter().map(|k| (k.clone(), None)).collect();
        let mut at = Instant::now();
        let mut report = FightReport::default();
        for _ in 0..FIGHT_ROUNDS {
            report = fights.reconciled(&owner, Some(SERVER), Some(&keys), &put_back, at, at, CAP);
            at += secs(10.0);
        }
        let message = report.message.unwrap();
        assert!(message.ends_with(". And 2 more objects"), "{message}");
        assert_eq!(fights.in_fight(), 5);
    }

    /// A reconcile of `owner` that saw `a` drifted and put it back, writing from `written` on and ending at
    /// `now`: the end of the hold it brings.
    fn correct_a(fights: &Fights, owner: &Owner, written: Instant, now: Instant) -> Instant {
        fights.reconciled(
            owner,
            Some(SERVER),
            Some(&[key("a")]),
            &[(key("a"), None)],
            written,
            now,
            CAP,
        );
        fights.hold_end(owner, &key("a")).unwrap()
    }

    #[test]
    fn the_throttle_wakes_a_held_addon_once() {
        let fights = Fights::default();
        let owner = owner("c1");
        let t0 = Instant::now();
        let end = correct_a(&fights, &owner, t0, t0);
        assert_eq!(fights.notified(&owner, &key("a"), t0, t0), Wake::At(end));
        assert_eq!(fights.notified(&owner, &key("a"), t0, t0), Wake::Pending);
        assert_eq!(
            fights.notified(&owner, &key("b"), t0, t0),
            Wake::Now,
            "another object is not held"
        );
        fights.woken(&owner);
        assert_eq!(fights.notified(&owner, &key("a"), end, end), Wake::Now);
    }

    /// Corrections of `a` at `t0`, +1 s, +3 s, ... (each hold's end), each answered `answer` after it (as
    /// notified then); returns when the last one was made.
    fn fought(fights: &Fights, owner: &Owner, t0: Instant, answer: Duration, rounds: u32) -> Instant {
        let mut at = t0;
        for _ in 0..rounds {
            let end = correct_a(fights, owner, at, at);
            fights.notified(owner, &key("a"), at + answer, at + answer);
            fights.woken(owner);
            at = end;
        }
        at
    }

    #[rstest]
    // Told before the last correction (its own apply's echo, handled after it): no sight of new drift, so the
    // deletion 12 s later is late and put back now.
    #[case::an_echo_of_the_correction(-0.001, true)]
    // Told after it: the writer answered at once; drift 12 s later is still the first sight of that answer.
    #[case::the_writers_answer(0.2, false)]
    fn drift_told_before_the_last_correction_is_not_its_first_sight(
        #[case] echo_after: f64,
        #[case] put_back_now: bool,
    ) {
        let fights = Fights::default();
        let owner = owner("c1");
        let t0 = Instant::now();
        // Four rounds answered in 0.2 s; the fifth correction holds for 16 s.
        let last = fought(&fights, &owner, t0, secs(0.2), 4);
        let hold_end = correct_a(&fights, &owner, last, last);
        assert_eq!(hold_end, last + secs(16.0));
        let echo = if echo_after < 0.0 {
            last - secs(-echo_after)
        } else {
            last + secs(echo_after)
        };
        fights.notified(&owner, &key("a"), echo, last + secs(0.3));
        fights.woken(&owner);
        let deleted = last + secs(12.0);
        let expected = if put_back_now {
            Wake::Now
        } else {
            Wake::At(hold_end)
        };
        assert_eq!(fights.notified(&owner, &key("a"), deleted, deleted), expected);
    }

    /// A writer that answers a correction before its reconcile ends (the reconcile goes on to check health,
    /// say): the answer is the new round's, seen 0.1 s after the write. (Before: it went to the last round,
    /// whose answer then looked 8 s long, and a deletion 12 s after the next correction was not late.)
    #[test]
    fn an_answer_before_the_reconcile_ends_is_the_new_rounds() {
        let fights = Fights::default();
        let owner = owner("c1");
        let correct = |written: Instant, now: Instant| correct_a(&fights, &owner, written, now);
        let t0 = Instant::now();
        // Three rounds answered in 0.2 s, a fourth put back at once (from its hold's end on) and answered
        // 0.1 s after the write, while its reconcile still runs (2 s).
        let fourth = fought(&fights, &owner, t0, secs(0.2), 3);
        let fifth = correct(fourth, fourth);
        let answered = fifth + secs(0.1);
        fights.notified(&owner, &key("a"), answered, answered);
        fights.woken(&owner);
        let hold_end = correct(fifth, fifth + secs(2.0));
        assert_eq!(hold_end, fifth + secs(16.0), "held from the write");
        let sixth = correct(hold_end, hold_end);
        let answer = fights.memory().rounds[&(SERVER.to_owned(), key("a"))].answer;
        assert_eq!(answer, Some(secs(0.2)), "the slowest answer: 0.2 s, then 0.1 s");
        let deleted = sixth + secs(12.0);
        assert_eq!(fights.notified(&owner, &key("a"), deleted, deleted), Wake::Now);
    }
}
