//! A ClusterAddon in `clusterctl move` (Cluster API's move contract). The move pauses the Cluster, waits
//! while any object it moves carries `clusterctl.cluster.x-k8s.io/block-move`, copies metadata and spec to
//! the target management cluster (not the status: a subresource is not created with the object), deletes
//! the source objects and unpauses the Cluster on the target.
//!
//! So a ClusterAddon blocks moves while its Cluster runs; once the Cluster is paused, its reconcile (one at a
//! time per object, so after any apply in flight) records its status in `clusterstack.x-k8s.io/moved-status`
//! and stops blocking, in one write; nothing is done to the workload cluster while it is paused. The copy on
//! the target has another UID: it takes its status (inventory, stages, readiness) from that record, so
//! nothing is applied or run again there, and, once its Cluster runs, blocks moves again and drops the
//! record. The pure [`next_move_step`] decides; [`act`] writes.

use cso_api::{
    ClusterAddon, ClusterAddonStatus, capi::BLOCK_MOVE_ANNOTATION, cluster_addon::MOVED_STATUS_ANNOTATION,
};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::{Error, patch, stores::Written};

/// What `MOVED_STATUS_ANNOTATION` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct MovedStatus {
    /// The UID of the ClusterAddon the status was recorded on: another UID means this is a copy.
    uid: String,
    status: ClusterAddonStatus,
}

/// What a ClusterAddon's reconcile does about moves before anything else.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum MoveStep {
    /// Nothing: the reconcile goes on, or stops if the Cluster is paused.
    Nothing,
    /// A copy made by a move: take the recorded status as its own and drop the record.
    Adopt(Box<ClusterAddonStatus>),
    /// The Cluster is paused and the ClusterAddon still blocks a move: record its status and stop blocking.
    Release(String),
    /// The Cluster runs: block moves (again), and drop a record left by a pause that was not a move.
    Block,
}

/// The step for `addon`, whose Cluster is paused or not.
pub(crate) fn next_move_step(addon: &ClusterAddon, cluster_paused: bool) -> MoveStep {
    let annotations = addon.annotations();
    let record = annotations
        .get(MOVED_STATUS_ANNOTATION)
        .and_then(|r| serde_json::from_str::<MovedStatus>(r).ok());
    let uid = addon.uid().unwrap_or_default();
    if let Some(record) = &record
        && record.uid != uid
    {
        return MoveStep::Adopt(Box::new(record.status.clone()));
    }
    let blocking = annotations.contains_key(BLOCK_MOVE_ANNOTATION);
    if cluster_paused {
        if !blocking {
            return MoveStep::Nothing;
        }
        let record = MovedStatus {
            uid,
            status: addon.status.clone().unwrap_or_default(),
        };
        return MoveStep::Release(serde_json::to_string(&record).unwrap_or_default());
    }
    // An unreadable record is dropped too: it can be neither adopted nor trusted.
    if blocking && !annotations.contains_key(MOVED_STATUS_ANNOTATION) {
        MoveStep::Nothing
    } else {
        MoveStep::Block
    }
}

/// Carries out `step` on `addon`; returns the ClusterAddon as written (the adopted status in place: the answer
/// to the metadata patch, written after it, carries it).
pub(crate) async fn act(
    written: &Written,
    api: &Api<ClusterAddon>,
    addon: &ClusterAddon,
    step: MoveStep,
) -> Result<ClusterAddon, Error> {
    let annotations = match step {
        MoveStep::Nothing => return Ok(addon.clone()),
        MoveStep::Adopt(status) => {
            let mut adopted = addon.clone();
            adopted.status = Some(*status);
            let status = adopted.status.clone().unwrap_or_default();
            patch::status(written, api, &adopted, addon.status.as_ref(), &status).await?;
            tracing::info!(cluster_addon = %addon.name_any(), namespace = ?addon.namespace(), "ClusterAddon moved here: its recorded status adopted");
            return annotate(written, api, &adopted, json!({ MOVED_STATUS_ANNOTATION: null })).await;
        }
        MoveStep::Release(record) => {
            tracing::info!(cluster_addon = %addon.name_any(), namespace = ?addon.namespace(), "Cluster paused: ClusterAddon ready to be moved");
            json!({ BLOCK_MOVE_ANNOTATION: null, MOVED_STATUS_ANNOTATION: record })
        }
        MoveStep::Block => json!({ BLOCK_MOVE_ANNOTATION: "", MOVED_STATUS_ANNOTATION: null }),
    };
    annotate(written, api, addon, annotations).await
}

/// Merges `annotations` (a `null` removes one) into `addon`'s.
async fn annotate(
    written: &Written,
    api: &Api<ClusterAddon>,
    addon: &ClusterAddon,
    annotations: serde_json::Value,
) -> Result<ClusterAddon, Error> {
    let name = addon.name_any();
    let annotated = api
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": annotations } })),
        )
        .await
        .map_err(|e| Error::kube(format!("annotate ClusterAddon {name} for clusterctl move"), e))?;
    written.record(&annotated);
    Ok(annotated)
}

#[cfg(test)]
mod tests {
    use cso_api::ClusterAddonSpec;
    use kube::api::ObjectMeta;
    use rstest::rstest;

    use super::*;

    fn ready() -> ClusterAddonStatus {
        ClusterAddonStatus {
            ready: true,
            ..Default::default()
        }
    }

    fn record(uid: &str) -> String {
        serde_json::to_string(&MovedStatus {
            uid: uid.into(),
            status: ready(),
        })
        .unwrap()
    }

    fn addon(uid: &str, annotations: &[(&str, String)], status: Option<ClusterAddonStatus>) -> ClusterAddon {
        ClusterAddon {
            metadata: ObjectMeta {
                name: Some("cluster-addon-c1".into()),
                uid: Some(uid.into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), v.clone()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: ClusterAddonSpec::default(),
            status,
        }
    }

    fn blocking() -> (&'static str, String) {
        (BLOCK_MOVE_ANNOTATION, String::new())
    }

    #[rstest]
    // Running and blocking: the steady state, no write.
    #[case::running(addon("a", &[blocking()], Some(ready())), false, MoveStep::Nothing)]
    // Made before moves were handled (or by the Go operator): blocks from now on.
    #[case::running_not_blocking(addon("a", &[], Some(ready())), false, MoveStep::Block)]
    // Paused for a move: the status recorded under its own UID, the block lifted in the same write.
    #[case::paused(addon("a", &[blocking()], Some(ready())), true, MoveStep::Release(record("a")))]
    // Paused and already released: nothing, and nothing else is done while paused.
    #[case::paused_released(addon("a", &[(MOVED_STATUS_ANNOTATION, record("a"))], Some(ready())), true, MoveStep::Nothing)]
    // Unpaused without a move (same UID): blocks again and forgets the record.
    #[case::unpaused_unmoved(addon("a", &[(MOVED_STATUS_ANNOTATION, record("a"))], Some(ready())), false, MoveStep::Block)]
    // The copy on the target (another UID, no status): adopts, paused or not.
    #[case::copy_paused(addon("b", &[(MOVED_STATUS_ANNOTATION, record("a"))], None), true, MoveStep::Adopt(Box::new(ready())))]
    #[case::copy_running(addon("b", &[(MOVED_STATUS_ANNOTATION, record("a"))], None), false, MoveStep::Adopt(Box::new(ready())))]
    // A record nobody can read: not adopted, dropped once the Cluster runs.
    #[case::garbled(addon("b", &[(MOVED_STATUS_ANNOTATION, "{".into())], None), false, MoveStep::Block)]
    #[case::garbled_paused(addon("b", &[(MOVED_STATUS_ANNOTATION, "{".into())], None), true, MoveStep::Nothing)]
    fn the_move_step_follows_the_pause_and_the_uid(
        #[case] addon: ClusterAddon,
        #[case] paused: bool,
        #[case] expected: MoveStep,
    ) {
        assert_eq!(next_move_step(&addon, paused), expected);
    }

    #[test]
    fn a_released_record_is_adopted_by_the_copy_whole() {
        let mut status = ready();
        status.resources = vec![cso_api::common::Resource {
            kind: "Deployment".into(),
            name: "metrics-server".into(),
            namespace: "kube-system".into(),
            ..Default::default()
        }];
        let source = addon("a", &[blocking()], Some(status.clone()));
        let MoveStep::Release(record) = next_move_step(&source, true) else {
            panic!("not released")
        };
        let copy = addon("b", &[(MOVED_STATUS_ANNOTATION, record)], None);
        assert_eq!(next_move_step(&copy, true), MoveStep::Adopt(Box::new(status)));
    }
}
