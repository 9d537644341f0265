//! How every watch of the operator comes back after the API server went away: each watch retries on its own
//! bounded, jittered backoff ([`RETRY_FIRST`] doubling to [`RETRY_MAX`], each wait between half and all of
//! that), so all of them are back within a few seconds of the API server answering again, and resumes from the
//! last resourceVersion it saw, or lists again when the server no longer has that version: no change made in
//! the meantime is missed.
//!
//! kube-runtime's default backoff grows to 30 s (and starts over only after two minutes without an error), and
//! a `Controller` built with `new`/`watches` has one backoff for all its watches: a failing watch pauses the
//! others, and their errors are taken one per backoff period. After a 30 s outage, edits waited 29-132 s for a
//! controller's watches to come back (issue 19). Here every watch has its own backoff, and its errors are
//! logged and left out of the controller's stream, so one watch never waits for another.

use std::{fmt::Debug, time::Duration};

use futures::{Stream, StreamExt};
use kube::{
    Api, Resource,
    runtime::{Controller, WatchStreamExt, reflector, utils::Backoff, watcher},
};
use serde::de::DeserializeOwned;

/// The first wait after a watch fails.
pub(crate) const RETRY_FIRST: Duration = Duration::from_millis(250);
/// The longest wait between two attempts of one watch: how late at most a watch notices that the API server
/// answers again.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(2);

/// The backoff of one watch: [`RETRY_FIRST`] doubling up to [`RETRY_MAX`], with equal jitter; reset by any
/// event that gets through.
#[derive(Clone, Debug, Default)]
pub(crate) struct WatchBackoff {
    failures: u32,
}

/// A new [`WatchBackoff`].
pub(crate) fn backoff() -> WatchBackoff {
    WatchBackoff::default()
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let ceiling = RETRY_FIRST
            .saturating_mul(1 << self.failures.min(16))
            .min(RETRY_MAX);
        self.failures = self.failures.saturating_add(1);
        // Between half and all of the ceiling: watches cut at the same moment do not retry in lockstep.
        Some(ceiling.mul_f64(0.5 + 0.5 * random_fraction()))
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.failures = 0;
    }
}

/// A number in [0, 1): the standard library's randomly keyed hasher over the clock (jitter needs no more).
fn random_fraction() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    #[allow(clippy::cast_precision_loss, reason = "53 random bits fit a float exactly")]
    let fraction = (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64;
    fraction
}

/// A controller of `K` whose own watch has its own backoff (use [`touched`] for the others it watches).
pub(crate) fn controller<K>(api: Api<K>, config: watcher::Config) -> Controller<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Debug + Unpin,
{
    controller_with(api, config, K::DynamicType::default())
}

/// [`controller`] of a kind whose version is chosen at run time (`dyntype`, e.g. Cluster API's `Cluster`).
pub(crate) fn controller_with<K>(
    api: Api<K>,
    config: watcher::Config,
    dyntype: K::DynamicType,
) -> Controller<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Debug + Unpin,
{
    let kind = K::kind(&dyntype).into_owned();
    let writer = reflector::store::Writer::new(dyntype.clone());
    let reader = writer.as_reader();
    let objects = watcher(api, config)
        .backoff(backoff())
        .reflect(writer)
        .applied_objects();
    Controller::for_stream_with(without_errors(kind, objects), reader, dyntype)
        // Nothing fails through the streams above; a trigger stream added later gets a bounded backoff too.
        .trigger_backoff(backoff())
}

/// The objects of `api` that changed (for `Controller::watches_stream`), on the watch's own backoff.
pub(crate) fn touched<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    touched_with(api, config, &K::DynamicType::default())
}

/// [`touched`] of a kind whose version is chosen at run time (`dyntype`; for
/// `Controller::watches_stream_with`).
pub(crate) fn touched_with<K>(
    api: Api<K>,
    config: watcher::Config,
    dyntype: &K::DynamicType,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + use<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let kind = K::kind(dyntype).into_owned();
    without_errors(kind, watcher(api, config).backoff(backoff()).touched_objects())
}

/// `stream` (of objects of `kind`) with its errors logged and left out: the backoff has already waited for
/// them.
fn without_errors<T>(
    kind: String,
    stream: impl Stream<Item = Result<T, watcher::Error>> + Send + 'static,
) -> impl Stream<Item = Result<T, watcher::Error>> + Send + 'static
where
    T: Send + 'static,
{
    stream.filter(move |item| {
        if let Err(e) = item {
            tracing::debug!(%kind, error = %e, "watch interrupted; retrying");
        }
        std::future::ready(item.is_ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_to_a_bound_with_jitter_and_start_over_after_a_reset() {
        let mut backoff = backoff();
        let waits: Vec<Duration> = backoff.by_ref().take(12).collect();
        for (i, wait) in waits.iter().enumerate() {
            let ceiling = RETRY_FIRST.saturating_mul(1 << i).min(RETRY_MAX);
            assert!(*wait >= ceiling / 2 && *wait <= ceiling, "wait {i}: {wait:?}");
        }
        assert!(waits.iter().all(|w| *w <= RETRY_MAX));
        assert!(waits.windows(2).any(|w| w[0] != w[1]), "jittered: {waits:?}");
        backoff.reset();
        assert!(backoff.next().is_some_and(|w| w <= RETRY_FIRST));
    }
}
