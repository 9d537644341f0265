//! Leader election with a `coordination.k8s.io` Lease named `clusterstack.x-k8s.io`, as the Go operator's.
//!
//! Only the leader runs the controllers; webhooks, the hook server, metrics and probes run on every replica.
//! `kube-lease-manager` acquires and releases the lease. Holding it is done here, because that is where
//! safety lies: the leader renews every third of the lease duration, each renewal re-reads the Lease and
//! writes it with its `resourceVersion` as a precondition, and every attempt is bounded in time. A failed
//! renewal is retried until shortly before the lease would expire, so a short API outage costs nothing;
//! after that, or as soon as the Lease names another holder, [`Leadership::lost`] resolves and the caller
//! stops at once (fail-stop), before another replica can acquire the lease. On a graceful stop the lease is
//! released, so a successor need not wait for it to expire: a waiting replica watches the Lease and asks again
//! as soon as it has no holder ([`released`]), instead of sleeping until the expiry it last saw, which is all
//! `kube-lease-manager` does.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use anyhow::Context;
use cso_controller::Metrics;
use futures::StreamExt;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::runtime::WatchStreamExt;
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};

/// How long to wait before asking again after the API could not be reached while waiting for the lease.
const RETRY: Duration = Duration::from_secs(2);
/// The field manager of the leader's renewals.
const FIELD_MANAGER: &str = "cso-leader-election";

/// Where and how long the lease is held.
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// The Lease: the Go operator's leader-election ID for the default shard, one per named shard
    /// ([`cso_api::shard::Shard::lease_name`]).
    pub name: String,
    pub namespace: String,
    pub duration: Duration,
    /// This replica's name in the lease's `holderIdentity`.
    pub identity: String,
}

impl LeaseSettings {
    /// The pod name (`HOSTNAME`) plus a per-process suffix, so a restarted pod is a new holder.
    pub fn identity() -> String {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/etc/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
            })
            .unwrap_or_else(|| "cso".to_owned());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        format!("{host}_{}_{nanos:08x}", std::process::id())
    }
}

/// The lease, held.
pub struct Leadership {
    manager: LeaseManager,
    /// The Lease's name.
    name: String,
    metrics: Arc<Metrics>,
    leases: Api<Lease>,
    identity: String,
    schedule: Schedule,
    /// Until when the lease is ours, by the `renewTime` last written (by this process's clock).
    valid_until: SystemTime,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("identity", &self.identity)
            .field("schedule", &self.schedule)
            .finish_non_exhaustive()
    }
}

/// Waits until this replica holds the lease; `None` when `stop` resolves first. `metrics` shows whether this
/// replica leads and counts failed renewals.
pub async fn acquire(
    client: kube::Client,
    settings: &LeaseSettings,
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<Option<Leadership>> {
    let name = settings.name.as_str();
    metrics.set_leading(name, false);
    let schedule = Schedule::new(settings.duration);
    let seconds = schedule.duration.as_secs();
    let leases = Api::namespaced(client.clone(), &settings.namespace);
    let mut manager = lease_manager(&client, settings, seconds).await?;
    tracing::info!(identity = %settings.identity, namespace = %settings.namespace, lease = name,
        "waiting for the leader-election lease");
    let wait = async {
        // With back-off: a watch that cannot reach the API server must not re-list in a tight loop.
        let watch = kube::runtime::watcher(
            leases.clone(),
            kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}")),
        )
        .default_backoff();
        let mut releases = std::pin::pin!(watch.filter_map(|event| async move {
            match event {
                Ok(
                    kube::runtime::watcher::Event::Apply(lease)
                    | kube::runtime::watcher::Event::InitApply(lease),
                ) if released(&lease) => Some(()),
                Ok(kube::runtime::watcher::Event::Delete(_)) => Some(()),
                Err(e) => {
                    tracing::debug!(error = %e, "the watch of the leader-election lease was interrupted");
                    None
                }
                Ok(_) => None,
            }
        }));
        loop {
            tokio::select! {
                changed = manager.changed() => match changed {
                    Ok(true) => return,
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the leader-election lease; trying again");
                        tokio::time::sleep(RETRY).await;
                    }
                },
                // Released by its holder (or deleted): ask again now, with a manager that reads the Lease afresh
                // (the old one trusts the renewal it saw until that expires).
                Some(()) = releases.next() => {
                    tracing::debug!(lease = name, "the leader-election lease was released; asking for it");
                    match lease_manager(&client, settings, seconds).await {
                        Ok(fresh) => manager = fresh,
                        Err(e) => tracing::warn!(error = %e, "cannot ask for the released lease now; waiting"),
                    }
                }
            }
        }
    };
    tokio::select! {
        () = wait => {}
        () = stop => return Ok(None),
    }
    tracing::info!(identity = %settings.identity, "became the leader");
    metrics.set_leading(name, true);
    // Until the first renewal tells exactly: the renewal the Lease shows, if it is ours and can be read within
    // one attempt's time (a request cancelled for a fresh manager may have written it a moment earlier), and
    // never later than now less the longest the write that took it may have taken.
    let at_most = SystemTime::now() + schedule.duration - schedule.attempt_timeout;
    let written = tokio::time::timeout(schedule.attempt_timeout, leases.get_opt(name))
        .await
        .ok()
        .and_then(Result::ok)
        .flatten()
        .and_then(|lease| {
            let ours = lease.spec.as_ref()?.holder_identity.as_deref() == Some(settings.identity.as_str());
            ours.then(|| expiry(lease.spec.as_ref())).flatten()
        });
    let valid_until = written.map_or(at_most, |written| written.min(at_most));
    Ok(Some(Leadership {
        manager,
        name: name.to_owned(),
        metrics,
        leases,
        identity: settings.identity.clone(),
        valid_until,
        schedule,
    }))
}

/// A `kube-lease-manager` for the lease of `settings`, `seconds` long, with no cached view of the Lease.
async fn lease_manager(
    client: &kube::Client,
    settings: &LeaseSettings,
    seconds: u64,
) -> anyhow::Result<LeaseManager> {
    LeaseManagerBuilder::new(client.clone(), &settings.name)
        .with_namespace(&settings.namespace)
        .with_identity(&settings.identity)
        .with_duration(seconds)
        // Only its own renewal loop, which is not used once the lease is held, reads the grace; the builder
        // requires one shorter than the duration (its default, 5 s, is not for 3 or 4 s leases).
        .with_grace(seconds / 3)
        .build()
        .await
        .with_context(|| {
            format!(
                "cannot use the leader-election Lease {}/{}",
                settings.namespace, settings.name
            )
        })
}

/// Whether a Lease is free for the asking: its holder gave it up (a graceful stop clears `holderIdentity`).
fn released(lease: &Lease) -> bool {
    lease
        .spec
        .as_ref()
        .and_then(|spec| spec.holder_identity.as_deref())
        .is_none_or(str::is_empty)
}

/// The timing of holding a lease of a given duration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Schedule {
    duration: Duration,
    /// Time between renewals.
    period: Duration,
    /// The longest one renewal attempt (a read and a write) may take.
    attempt_timeout: Duration,
    /// Leadership is given up this long before the lease would expire.
    margin: Duration,
    /// Wait between failed attempts.
    retry: Duration,
}

impl Schedule {
    fn new(duration: Duration) -> Self {
        let duration = Duration::from_secs(duration.as_secs().max(3));
        let period = duration / 3;
        Schedule {
            duration,
            period,
            attempt_timeout: period / 2,
            margin: period / 2,
            retry: (period / 4).min(Duration::from_millis(500)),
        }
    }

    /// When to renew a lease valid until `valid_until`.
    fn next_renewal(&self, valid_until: SystemTime) -> SystemTime {
        valid_until - self.duration + self.period
    }

    /// The last moment this replica may consider itself the leader.
    fn give_up_at(&self, valid_until: SystemTime) -> SystemTime {
        valid_until - self.margin
    }
}

/// Why one renewal attempt did not renew.
#[derive(Debug)]
enum Failure {
    /// The lease is not ours any more.
    Lost(String),
    /// The API could not be asked (or the Lease changed meanwhile): try again.
    Transient(String),
}

/// Whether `identity` holds the lease described by `spec`; the reason when not.
fn held_by(spec: Option<&LeaseSpec>, identity: &str) -> Result<(), String> {
    match spec.and_then(|s| s.holder_identity.as_deref()) {
        Some(holder) if holder == identity => Ok(()),
        Some(holder) if !holder.is_empty() => Err(format!("{holder} holds the lease")),
        _ => Err("the lease was released by someone else".to_owned()),
    }
}

/// Until when a lease is valid: its `renewTime` plus its duration.
fn expiry(spec: Option<&LeaseSpec>) -> Option<SystemTime> {
    let spec = spec?;
    let renewed: SystemTime = spec.renew_time.as_ref()?.0.into();
    let seconds = u64::try_from(spec.lease_duration_seconds?).ok()?;
    Some(renewed + Duration::from_secs(seconds))
}

impl Leadership {
    /// Keeps the lease renewed; resolves (with the reason) only when leadership is lost: the Lease names
    /// another holder, or it could not be renewed before it would expire.
    pub async fn lost(&mut self) -> String {
        let reason = self.hold().await;
        self.metrics.set_leading(&self.name, false);
        reason
    }

    async fn hold(&mut self) -> String {
        loop {
            sleep_until(self.schedule.next_renewal(self.valid_until)).await;
            let give_up_at = self.schedule.give_up_at(self.valid_until);
            let mut last_failure = None;
            loop {
                match self.renew(give_up_at).await {
                    Ok(valid_until) => {
                        if let Some(failure) = last_failure.take() {
                            tracing::info!(after = %failure, "renewed the leader-election lease again");
                        }
                        self.valid_until = valid_until;
                        break;
                    }
                    Err(Failure::Lost(reason)) => return reason,
                    Err(Failure::Transient(reason)) => {
                        self.metrics.renewal_failed(&self.name);
                        if SystemTime::now() + self.schedule.retry >= give_up_at {
                            return format!("the lease could not be renewed before it expires: {reason}");
                        }
                        if last_failure.is_none() {
                            tracing::warn!(error = %reason,
                                "cannot renew the leader-election lease; retrying until shortly before it expires");
                        }
                        last_failure = Some(reason);
                        tokio::time::sleep(self.schedule.retry).await;
                    }
                }
            }
        }
    }

    /// One renewal: reads the Lease, checks it is still ours and writes a new `renewTime` on the version
    /// read. Returns the new expiry. Never runs past `deadline` (nor longer than one attempt may take).
    async fn renew(&self, deadline: SystemTime) -> Result<SystemTime, Failure> {
        let limit = deadline
            .duration_since(SystemTime::now())
            .unwrap_or_default()
            .min(self.schedule.attempt_timeout);
        let attempt = async {
            let lease = self
                .leases
                .get_opt(&self.name)
                .await
                .map_err(|e| Failure::Transient(e.to_string()))?
                .ok_or_else(|| Failure::Lost("the lease was deleted".to_owned()))?;
            held_by(lease.spec.as_ref(), &self.identity).map_err(Failure::Lost)?;
            let patch = serde_json::json!({
                "metadata": {"resourceVersion": lease.metadata.resource_version},
                "spec": {
                    "renewTime": MicroTime(Timestamp::now()),
                    "leaseDurationSeconds": self.schedule.duration.as_secs(),
                },
            });
            let renewed = self
                .leases
                .patch(&self.name, &renewal_params(), &Patch::Merge(patch))
                .await
                .map_err(|e| Failure::Transient(e.to_string()))?;
            expiry(renewed.spec.as_ref())
                .ok_or_else(|| Failure::Transient("the renewed Lease has no renewTime".to_owned()))
        };
        match tokio::time::timeout(limit, attempt).await {
            Ok(result) => result,
            Err(_) => Err(Failure::Transient(format!("no answer within {limit:?}"))),
        }
    }

    /// Gives the lease up so that another replica takes over at once.
    pub async fn release(self) {
        self.metrics.set_leading(&self.name, false);
        match self.manager.release().await {
            Ok(()) => tracing::info!(identity = %self.identity, "released the leader-election lease"),
            Err(e) => {
                tracing::warn!(error = %e, "cannot release the leader-election lease; it expires on its own")
            }
        }
    }
}

fn renewal_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

async fn sleep_until(at: SystemTime) {
    if let Ok(wait) = at.duration_since(SystemTime::now()) {
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn a_lease_is_released_when_it_names_no_holder() {
        let lease = |spec: Option<LeaseSpec>| Lease {
            spec,
            ..Lease::default()
        };
        let cases = [
            ("no spec", lease(None), true),
            (
                "no holder (a graceful stop's release)",
                lease(Some(spec(None, None, None))),
                true,
            ),
            (
                "an empty holder",
                lease(Some(spec(Some(""), Some(1), Some(15)))),
                true,
            ),
            (
                "held",
                lease(Some(spec(Some("pod-a_1"), Some(1), Some(15)))),
                false,
            ),
            // Expired but named: the waiting replica's own timer handles that (kube-lease-manager).
            (
                "expired long ago",
                lease(Some(spec(Some("pod-a_1"), Some(1), Some(1)))),
                false,
            ),
        ];
        for (what, lease, expected) in cases {
            assert_eq!(released(&lease), expected, "{what}");
        }
    }

    fn spec(holder: Option<&str>, renewed_secs_after_epoch: Option<i64>, duration: Option<i32>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            renew_time: renewed_secs_after_epoch.map(|s| MicroTime(Timestamp::from_second(s).unwrap())),
            lease_duration_seconds: duration,
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn renewal_every_third_and_giving_up_half_a_period_before_expiry() {
        let schedule = Schedule::new(Duration::from_secs(15));
        assert_eq!(schedule.period, Duration::from_secs(5));
        let valid_until = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        assert_eq!(
            schedule.next_renewal(valid_until),
            SystemTime::UNIX_EPOCH + Duration::from_secs(990)
        );
        assert_eq!(
            schedule.give_up_at(valid_until),
            SystemTime::UNIX_EPOCH + Duration::from_millis(997_500)
        );
        // A failed renewal is retried for the rest of the lease less the margin: 7.5 s of outage tolerated.
        let tolerated = schedule
            .give_up_at(valid_until)
            .duration_since(schedule.next_renewal(valid_until))
            .unwrap();
        assert_eq!(tolerated, Duration::from_millis(7_500));
        assert!(
            schedule.attempt_timeout <= schedule.margin,
            "an attempt cannot outlive the lease"
        );
    }

    #[test]
    fn leases_shorter_than_three_seconds_are_raised_to_three() {
        let schedule = Schedule::new(Duration::from_millis(500));
        assert_eq!(schedule.duration, Duration::from_secs(3));
        assert_eq!(schedule.period, Duration::from_secs(1));
        assert!(schedule.retry > Duration::ZERO);
    }

    #[test]
    fn only_our_own_identity_holds_the_lease() {
        assert!(held_by(Some(&spec(Some("me"), Some(1), Some(15))), "me").is_ok());
        let other = held_by(Some(&spec(Some("you"), Some(1), Some(15))), "me").unwrap_err();
        assert!(other.contains("you holds the lease"), "{other}");
        for released in [spec(None, None, None), spec(Some(""), None, None)] {
            let reason = held_by(Some(&released), "me").unwrap_err();
            assert!(reason.contains("released"), "{reason}");
        }
        assert!(held_by(None, "me").is_err());
    }

    #[test]
    fn expiry_is_the_renew_time_plus_the_duration() {
        assert_eq!(
            expiry(Some(&spec(Some("me"), Some(100), Some(15)))),
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(115))
        );
        assert_eq!(expiry(Some(&spec(Some("me"), None, Some(15)))), None);
        assert_eq!(expiry(Some(&spec(Some("me"), Some(100), None))), None);
        assert_eq!(expiry(Some(&spec(Some("me"), Some(100), Some(-1)))), None);
        assert_eq!(expiry(None), None);
    }
}
