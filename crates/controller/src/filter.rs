//! Which objects the controllers look at: the `--watch-filter` label (selected by the API server, so other
//! operators' objects are never even sent to us) and the Cluster API pause annotation.

use cso_api::capi::{PAUSED_ANNOTATION, WATCH_FILTER_LABEL};
use kube::{ResourceExt, runtime::watcher};

use crate::Settings;

/// The watch configuration for every watched kind.
pub(crate) fn watcher_config(settings: &Settings) -> watcher::Config {
    let config = watcher::Config::default().any_semantic();
    match &settings.watch_filter {
        Some(value) => config.labels(&format!("{WATCH_FILTER_LABEL}={value}")),
        None => config,
    }
}

/// [`watcher_config`] for the kinds that are sharded (Clusters, ClusterAddons): a named shard's watches select
/// its own objects only, so the API server neither lists nor sends it other shards'.
pub(crate) fn sharded_config(settings: &Settings) -> watcher::Config {
    let selectors: Vec<String> = settings
        .watch_filter
        .iter()
        .map(|value| format!("{WATCH_FILTER_LABEL}={value}"))
        .chain(settings.shard.selector())
        .collect();
    let config = watcher::Config::default().any_semantic();
    if selectors.is_empty() {
        config
    } else {
        config.labels(&selectors.join(","))
    }
}

/// Labels an object created for a watched one carries, so the watch filter selects it too (the Go
/// operator forgets this, and `--watch-filter` then stops its pipeline after the first step).
pub(crate) fn propagated_labels(settings: &Settings) -> std::collections::BTreeMap<String, String> {
    settings
        .watch_filter
        .iter()
        .map(|value| (WATCH_FILTER_LABEL.to_owned(), value.clone()))
        .collect()
}

/// Whether the object is paused (`cluster.x-k8s.io/paused`, any value).
pub(crate) fn is_paused(object: &impl ResourceExt) -> bool {
    object.annotations().contains_key(PAUSED_ANNOTATION)
}

#[cfg(test)]
mod tests {
    use cso_api::shard::Shard;

    use super::*;

    #[test]
    fn a_named_shard_selects_its_own_within_the_watch_filter() {
        let selector = |watch_filter: Option<&str>, shard: Shard| {
            sharded_config(&Settings {
                watch_filter: watch_filter.map(str::to_owned),
                shard,
                ..Settings::default()
            })
            .label_selector
        };
        let a = || Shard::Named("a".into());
        assert_eq!(
            selector(None, Shard::Default),
            None,
            "the default shard watches every Cluster"
        );
        assert_eq!(
            selector(None, a()).as_deref(),
            Some("clusterstack.x-k8s.io/shard=a")
        );
        assert_eq!(
            selector(Some("x"), a()).as_deref(),
            Some("cluster.x-k8s.io/watch-filter=x,clusterstack.x-k8s.io/shard=a")
        );
        assert_eq!(
            selector(Some("x"), Shard::Default).as_deref(),
            Some("cluster.x-k8s.io/watch-filter=x")
        );
    }
}
