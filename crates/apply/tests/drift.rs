//! Drift found by watching, against a real kube-apiserver: a kind whose objects this engine applied is
//! watched from the earliest of those applies, without a list (counted at the client); a delete or another
//! manager's edit afterwards is told; a kind watched before anything of it was applied (a restarted operator)
//! is listed first, and its verdict follows the applies from then on; a deletion behind a long outage is
//! told within seconds of the server's return, not when the watches' back-off next tries; the events of the
//! engine's own writes are never told, even when they come before the write's answer; nor is the history a
//! new process's watch replays up to its records.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    collections::BTreeMap,
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use cso_apply::{
    ApplyEngine, ClientLimits, ClusterDiscovery, DEFAULT_FIELD_MANAGER, DriftWatch, ObjectKey, RequestTally,
    Verdict, observed_client,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams},
};

const WAIT: Duration = Duration::from_secs(20);

async fn eventually<T, F: Future<Output = Option<T>>>(what: &str, check: impl Fn() -> F) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn config_maps(namespace: &str, names: &[&str]) -> Vec<cso_render::Manifest> {
    let yaml: String = names
        .iter()
        .map(|name| {
            format!(
                "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {namespace}\ndata:\n  k: v\n"
            )
        })
        .collect();
    cso_render::parse_manifests(&yaml).unwrap()
}

fn engine(client: &kube::Client) -> ApplyEngine {
    ApplyEngine::new(
        Arc::new(ClusterDiscovery::new(client.clone())),
        DEFAULT_FIELD_MANAGER,
    )
}

/// A watch over `engine`'s discovery and a count of the drift it told.
fn drift_watch(engine: &ApplyEngine, discovery: Arc<ClusterDiscovery>) -> (DriftWatch, Arc<AtomicUsize>) {
    let told = Arc::new(AtomicUsize::new(0));
    let counter = told.clone();
    let watch = DriftWatch::new(
        ("ns".into(), "c1".into()),
        discovery,
        engine.clone(),
        Arc::new(move |_: &str, _: &str, _: &ObjectKey| {
            counter.fetch_add(1, Ordering::SeqCst);
        }),
    );
    (watch, told)
}

fn config_map_key(namespace: &str, name: &str) -> ObjectKey {
    ObjectKey {
        group: Default::default(),
        kind: "ConfigMap".into(),
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// A client of the shared control plane whose requests are counted.
async fn counted_client() -> (kube::Client, Arc<RequestTally>) {
    let plane = cso_testenv::shared_management();
    let tally = Arc::new(RequestTally::default());
    let config = cso_testenv::config_from_yaml(plane.kubeconfig_yaml())
        .await
        .unwrap();
    let client = observed_client(config, ClientLimits::UNLIMITED, Some(tally.observer())).unwrap();
    (client, tally)
}

/// Applies the ConfigMaps `names` with `engine` (`previous` the inventory before) and waits until `watch`
/// finds them as applied: its cache is whole and the applies' own events are in.
async fn apply_until_as_applied(
    engine: &ApplyEngine,
    watch: &DriftWatch,
    namespace: &str,
    names: &[&str],
    previous: &[cso_api::common::Resource],
) {
    let report = engine
        .apply(
            &config_maps(namespace, names),
            namespace,
            &BTreeMap::new(),
            previous,
        )
        .await;
    assert!(report.is_complete(), "{}", report.failure_summary());
    eventually("as applied", || async {
        (watch.verdict(&report.resources) == Verdict::AsApplied).then_some(())
    })
    .await;
}

/// The lists of ConfigMaps `tally` counted.
fn config_map_lists(tally: &RequestTally) -> u64 {
    tally
        .counts()
        .iter()
        .filter(|(kind, _)| kind.verb == "list" && kind.resource == "configmaps")
        .map(|(_, count)| count)
        .sum()
}

/// `names` applied first by a new engine over `client`, and a drift watch of them, streaming.
async fn applied_and_watched(
    client: &kube::Client,
    ns: &str,
    names: &[&str],
) -> (ApplyEngine, DriftWatch, Arc<AtomicUsize>, cso_apply::ApplyReport) {
    let discovery = Arc::new(ClusterDiscovery::new(client.clone()));
    let engine = ApplyEngine::new(discovery.clone(), DEFAULT_FIELD_MANAGER);
    let report = engine
        .apply_first(&config_maps(ns, names), ns, &BTreeMap::new())
        .await;
    assert!(report.is_complete(), "{}", report.failure_summary());
    let (watch, told) = drift_watch(&engine, discovery);
    watch.watch(&report.resources).await;
    eventually("the watch request is open", || async {
        watch.streaming().then_some(())
    })
    .await;
    (engine, watch, told, report)
}

#[tokio::test]
async fn a_watch_begins_where_the_applies_left_off_and_tells_deletes_and_edits() {
    let (client, tally) = counted_client().await;
    let ns = cso_testenv::namespace(&client, "drift-seeded").await.unwrap();
    let (engine, watch, told, report) = applied_and_watched(&client, &ns, &["a", "b"]).await;
    assert_eq!(watch.verdict(&report.resources), Verdict::AsApplied);
    assert_eq!(
        config_map_lists(&tally),
        0,
        "watched from the applies, without a list"
    );

    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    api.delete("a", &DeleteParams::default()).await.unwrap();
    eventually("the delete is told", || async {
        (told.load(Ordering::SeqCst) >= 1).then_some(())
    })
    .await;
    assert_eq!(
        watch.verdict(&report.resources),
        Verdict::Drifted(vec![config_map_key(&ns, "a")])
    );

    let told_before = told.load(Ordering::SeqCst);
    let edit = serde_json::json!({"data": {"k": "edited"}});
    api.patch("b", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    eventually("another manager's edit is told", || async {
        (told.load(Ordering::SeqCst) > told_before).then_some(())
    })
    .await;

    // Applied again: as applied again, once the applies' own events are in.
    apply_until_as_applied(&engine, &watch, &ns, &["a", "b"], &report.resources).await;
}

#[tokio::test]
async fn a_kind_watched_before_any_apply_is_listed_first() {
    let (client, tally) = counted_client().await;
    let ns = cso_testenv::namespace(&client, "drift-listed").await.unwrap();
    // Applied by an earlier process.
    let earlier = engine(&client);
    let report = earlier
        .apply_first(&config_maps(&ns, &["a"]), &ns, &BTreeMap::new())
        .await;
    assert!(report.is_complete(), "{}", report.failure_summary());

    // This process's engine has applied nothing: the watch lists, and cannot vouch for what it did not apply.
    let discovery = Arc::new(ClusterDiscovery::new(client.clone()));
    let engine = ApplyEngine::new(discovery.clone(), DEFAULT_FIELD_MANAGER);
    let (watch, told) = drift_watch(&engine, discovery);
    watch.watch(&report.resources).await;
    assert_eq!(watch.verdict(&report.resources), Verdict::Unknown);
    apply_until_as_applied(&engine, &watch, &ns, &["a"], &report.resources).await;
    assert_eq!(
        config_map_lists(&tally),
        1,
        "listed once, before anything was applied"
    );

    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the delete is told", || async {
        (told.load(Ordering::SeqCst) >= 1).then_some(())
    })
    .await;
}

/// A new process's engine reads what an earlier one applied and records each object as it is; its watch
/// resumes from the earliest record of the kind, so it replays what happened to the objects recorded later: an
/// edit the earlier process put back is history, not drift.
#[tokio::test]
async fn history_a_resumed_watch_replays_is_not_told() {
    let (client, _tally) = counted_client().await;
    let ns = cso_testenv::namespace(&client, "drift-history").await.unwrap();
    let earlier = engine(&client);
    let first = earlier
        .apply_first(&config_maps(&ns, &["a", "b"]), &ns, &BTreeMap::new())
        .await;
    assert!(first.is_complete(), "{}", first.failure_summary());
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let edit = serde_json::json!({"data": {"k": "edited"}});
    api.patch("b", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .unwrap();
    let put_back = earlier
        .apply(
            &config_maps(&ns, &["a", "b"]),
            &ns,
            &BTreeMap::new(),
            &first.resources,
        )
        .await;
    assert!(put_back.is_complete(), "{}", put_back.failure_summary());

    // The new process writes neither; b's record is newer than a's, the edit and its correction between.
    let discovery = Arc::new(ClusterDiscovery::new(client.clone()));
    let engine = ApplyEngine::new(discovery.clone(), DEFAULT_FIELD_MANAGER);
    let report = engine
        .apply(
            &config_maps(&ns, &["a", "b"]),
            &ns,
            &BTreeMap::new(),
            &put_back.resources,
        )
        .await;
    assert_eq!((report.applied, report.unchanged), (2, 2), "read, not written");
    let (watch, told) = drift_watch(&engine, discovery);
    watch.watch(&report.resources).await;
    eventually("the watch request is open", || async {
        watch.streaming().then_some(())
    })
    .await;
    // A delete after the replay: told, and alone (one watch per kind takes its events in order).
    api.delete("a", &DeleteParams::default()).await.unwrap();
    eventually("the delete is told", || async {
        (told.load(Ordering::SeqCst) >= 1).then_some(())
    })
    .await;
    assert_eq!(told.load(Ordering::SeqCst), 1, "only the delete is told");
    assert_eq!(
        watch.verdict(&report.resources),
        Verdict::Drifted(vec![config_map_key(&ns, "a")]),
        "b as applied"
    );
}

/// A deletion made while the API server could not be reached for 40 s is told within seconds of its return.
/// The watches' own back-off has grown to 32 s by then (tries 1, 3, 7, 15 and 31 s into the cut, the next
/// 63 s in: 23 s after the return); the probe (after 1, 3, 7, 15, 25, 35 and 45 s) brings them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_behind_a_long_outage_is_told_within_seconds_of_the_return() {
    let plane = cso_testenv::shared_management();
    let direct = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&direct, "drift-outage").await.unwrap();
    let mut proxy = cso_testenv::proxy::ApiProxy::start(plane.server_url())
        .await
        .unwrap();
    let yaml = plane.kubeconfig_yaml().replace(plane.server_url(), &proxy.url());
    let config = cso_testenv::config_from_yaml(&yaml).await.unwrap();
    let client = observed_client(config, ClientLimits::UNLIMITED, None).unwrap();
    let (_engine, _watch, told, _report) = applied_and_watched(&client, &ns, &["a"]).await;

    proxy.cut();
    Api::<ConfigMap>::namespaced(direct, &ns)
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(40)).await;
    assert_eq!(told.load(Ordering::SeqCst), 0, "nothing told behind the cut");
    proxy.restore().await.unwrap();
    let restored = tokio::time::Instant::now();
    while told.load(Ordering::SeqCst) == 0 {
        assert!(
            restored.elapsed() < Duration::from_secs(15),
            "the deletion was not told within 15 s of the return"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("told {:?} after the return", restored.elapsed());
}

/// Each deletion of an object that is put back at once is told once: the event of the apply that puts it
/// back (which often comes before the apply's answer, so before the engine records it) is not told too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_events_of_its_own_corrections_are_not_told() {
    let (client, _) = counted_client().await;
    let ns = cso_testenv::namespace(&client, "drift-echo").await.unwrap();
    let (engine, watch, told, report) = applied_and_watched(&client, &ns, &["a"]).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    const ROUNDS: usize = 15;
    for round in 1..=ROUNDS {
        api.delete("a", &DeleteParams::default()).await.unwrap();
        eventually("the delete is told", || async {
            (told.load(Ordering::SeqCst) >= round).then_some(())
        })
        .await;
        let again = engine
            .apply(
                &config_maps(&ns, &["a"]),
                &ns,
                &BTreeMap::new(),
                &report.resources,
            )
            .await;
        assert!(again.is_complete(), "{}", again.failure_summary());
        eventually("as applied again", || async {
            (watch.verdict(&report.resources) == Verdict::AsApplied).then_some(())
        })
        .await;
        // The put back's own event has come (the verdict says so); a told echo would have come with it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            told.load(Ordering::SeqCst),
            round,
            "round {round}: one deletion, one told (the put back's own event was told as drift)"
        );
    }
}
