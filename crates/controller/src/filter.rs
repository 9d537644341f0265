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
