//! Publishes events (`events.k8s.io/v1`) about the operator's objects and the Clusters it serves. An event
//! said again within six minutes is not a new object: the first one's `series` counts it (a merge patch of
//! its count and last time), as the Events API intends and as Kubernetes' own recorders do. For that, the
//! recorder remembers each recent event by a digest of what makes it the same event (its type, reason,
//! action, note and the object it is about) with only the name to patch and the count: not the event
//! itself, so that a thousand Clusters' recent events cost tens of kilobytes, not megabytes.

use std::{
    collections::HashMap,
    hash::{Hash, Hasher},
    sync::Mutex,
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{core::v1::ObjectReference, events::v1::Event},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};

use crate::events::Kind;

/// How long an event is remembered for its repeats to count in its series.
const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// The longest object name an event can be named after: `<object>.<16 hex digits>` is an object name too.
/// Longer ones get a generated name.
const MAX_NAMED_AFTER: usize = crate::cluster_addon_create::MAX_NAME_LENGTH - 17;

/// The Events API keeps at most this many bytes of a note.
const MAX_NOTE: usize = 1000;

/// The API server keeps at most this many characters of a generated name's base.
const MAX_GENERATED_BASE: usize = 58;

/// An event said recently: where it is and how often it was said.
#[derive(Debug)]
struct Said {
    namespace: Box<str>,
    name: Box<str>,
    count: i32,
    last: Instant,
}

impl Said {
    /// Whether a repeat at `now` still counts in this event's series.
    fn recent_at(&self, now: Instant) -> bool {
        now.duration_since(self.last) < SERIES_WINDOW
    }
}

#[derive(Debug)]
struct Recent {
    said: HashMap<u64, Said>,
    swept: Instant,
}

/// Publishes events as one reporting controller and instance.
pub(crate) struct Recorder {
    client: Client,
    controller: String,
    instance: String,
    recent: Mutex<Recent>,
}

impl Recorder {
    pub(crate) fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        Recorder {
            client,
            controller: controller.to_owned(),
            instance: instance.unwrap_or_else(|| controller.to_owned()),
            recent: Mutex::new(Recent {
                said: HashMap::new(),
                swept: Instant::now(),
            }),
        }
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes an event about `regarding`: a new event, or the next of the series of the same event said
    /// within the last six minutes. A note longer than the Events API keeps is cut.
    pub(crate) async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: Kind,
        reason: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let note = within_limit(note);
        let key = digest(regarding, type_, reason, note);
        let now = Instant::now();
        let repeat = {
            let mut recent = self.recent();
            if now.duration_since(recent.swept) > SERIES_WINDOW / 6 {
                recent.said.retain(|_, said| said.recent_at(now));
                recent.swept = now;
            }
            recent
                .said
                .get(&key)
                .filter(|said| said.recent_at(now))
                .map(|said| (said.namespace.clone(), said.name.clone(), said.count + 1))
        };
        if let Some((namespace, name, count)) = repeat {
            let events: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            let series = serde_json::json!({"series": {
                "count": count,
                "lastObservedTime": MicroTime(Timestamp::now()),
            }});
            match events
                .patch(&name, &PatchParams::default(), &Patch::Merge(&series))
                .await
            {
                Ok(_) => {
                    if let Some(said) = self.recent().said.get_mut(&key) {
                        said.count = said.count.max(count);
                        said.last = now;
                    }
                    return Ok(());
                }
                // The event is gone (its time to live passed, or someone deleted it): a new one.
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let event = self.event(regarding, &namespace, type_, reason, note);
        let events: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let created = events.create(&PostParams::default(), &event).await?;
        let name = created.metadata.name.unwrap_or_default();
        self.recent().said.insert(
            key,
            Said {
                namespace: namespace.into(),
                name: name.into(),
                count: 1,
                last: now,
            },
        );
        Ok(())
    }

    fn event(
        &self,
        regarding: &ObjectReference,
        namespace: &str,
        type_: Kind,
        reason: &str,
        note: &str,
    ) -> Event {
        let now = Timestamp::now();
        let object = regarding.name.as_deref().unwrap_or(&self.controller);
        let (name, generate_name) = if object.len() <= MAX_NAMED_AFTER {
            (Some(format!("{object}.{:x}", now.as_nanosecond())), None)
        } else {
            // A generated name's base must end alphanumeric.
            let base: String = object.chars().take(MAX_GENERATED_BASE).collect();
            (None, Some(format!("{}-", base.trim_end_matches(['.', '-']))))
        };
        Event {
            metadata: ObjectMeta {
                name,
                generate_name,
                namespace: Some(namespace.to_owned()),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some(reason.to_owned()),
            reason: Some(reason.to_owned()),
            note: Some(note.to_owned()),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(
                match type_ {
                    Kind::Normal => "Normal",
                    Kind::Warning => "Warning",
                }
                .to_owned(),
            ),
            ..Default::default()
        }
    }
}

/// `note`, cut (at a character's boundary) to what the Events API keeps.
fn within_limit(note: &str) -> &str {
    let mut cut = note.len().min(MAX_NOTE);
    while !note.is_char_boundary(cut) {
        cut -= 1;
    }
    &note[..cut]
}

/// What makes two events the same event: what they say and the object they are about.
fn digest(regarding: &ObjectReference, type_: Kind, reason: &str, note: &str) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (type_, reason, note).hash(&mut hasher);
    for part in [
        &regarding.api_version,
        &regarding.kind,
        &regarding.namespace,
        &regarding.name,
        &regarding.uid,
    ] {
        part.hash(&mut hasher);
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(name: &str, uid: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("cluster.x-k8s.io/v1beta2".into()),
            kind: Some("Cluster".into()),
            namespace: Some("tenant".into()),
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_note_is_cut_to_the_events_apis_limit_at_a_characters_boundary() {
        assert_eq!(within_limit("short"), "short");
        assert_eq!(within_limit(&"a".repeat(1500)).len(), 1000);
        let note = format!("{}é", "a".repeat(999));
        assert_eq!(within_limit(&note), "a".repeat(999), "é would straddle the limit");
    }

    #[test]
    fn the_same_event_is_what_it_says_about_the_same_object() {
        let c1 = reference("c1", "u1");
        let base = digest(&c1, Kind::Warning, "Unreachable", "no route");
        assert_eq!(base, digest(&c1, Kind::Warning, "Unreachable", "no route"));
        for other in [
            digest(&c1, Kind::Normal, "Unreachable", "no route"),
            digest(&c1, Kind::Warning, "Applied", "no route"),
            digest(&c1, Kind::Warning, "Unreachable", "timed out"),
            digest(&reference("c2", "u1"), Kind::Warning, "Unreachable", "no route"),
            digest(&reference("c1", "u2"), Kind::Warning, "Unreachable", "no route"),
        ] {
            assert_ne!(base, other);
        }
    }

    #[tokio::test]
    async fn events_are_named_after_their_object_or_generated_when_it_is_too_long() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let recorder = Recorder::new(Client::try_from(config).unwrap(), "clusterstack-controller", None);
        let short = recorder.event(
            &reference("c1", "u1"),
            "tenant",
            Kind::Warning,
            "Unreachable",
            "no route",
        );
        let name = short.metadata.name.unwrap();
        assert!(name.starts_with("c1.") && name.len() > 3, "{name}");
        assert_eq!(short.metadata.generate_name, None);
        assert_eq!(
            short.reporting_instance.as_deref(),
            Some("clusterstack-controller")
        );
        assert_eq!(short.type_.as_deref(), Some("Warning"));
        let long_name = format!("{}-.{}", "a".repeat(56), "b".repeat(200));
        let long = recorder.event(
            &reference(&long_name, "u1"),
            "tenant",
            Kind::Normal,
            "Applied",
            "",
        );
        assert_eq!(long.metadata.name, None);
        assert_eq!(long.metadata.generate_name, Some(format!("{}-", "a".repeat(56))));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_repeat_counts_in_the_first_events_series_and_another_note_is_an_event_of_its_own() {
        let plane = cso_testenv::shared_management();
        let client = plane.client().await.unwrap();
        let ns = cso_testenv::namespace(&client, "recorder").await.unwrap();
        let recorder = Recorder::new(client.clone(), "clusterstack-controller", Some("cso-0".into()));
        let about = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("ConfigMap".into()),
            namespace: Some(ns.clone()),
            name: Some("subject".into()),
            ..Default::default()
        };
        for _ in 0..3 {
            recorder
                .publish(&about, Kind::Warning, "Unreachable", "no route")
                .await
                .unwrap();
        }
        recorder
            .publish(&about, Kind::Warning, "Unreachable", "timed out")
            .await
            .unwrap();
        let events: Api<Event> = Api::namespaced(client.clone(), &ns);
        let listed = events.list(&Default::default()).await.unwrap().items;
        assert_eq!(listed.len(), 2, "{listed:?}");
        let repeated = said_in(&listed, "no route");
        assert_eq!(repeated.series.as_ref().map(|s| s.count), Some(3));
        assert_eq!(repeated.reporting_instance.as_deref(), Some("cso-0"));
        assert_eq!(said_in(&listed, "timed out").series, None);

        // Gone before its repeat (deleted, or its time to live passed): the repeat is a new event.
        events
            .delete(&repeated.metadata.name.unwrap(), &Default::default())
            .await
            .unwrap();
        recorder
            .publish(&about, Kind::Warning, "Unreachable", "no route")
            .await
            .unwrap();
        let listed = events.list(&Default::default()).await.unwrap().items;
        assert_eq!(listed.len(), 2, "{listed:?}");
        assert_eq!(said_in(&listed, "no route").series, None);
    }

    fn said_in(events: &[Event], note: &str) -> Event {
        events
            .iter()
            .find(|e| e.note.as_deref() == Some(note))
            .unwrap()
            .clone()
    }
}
