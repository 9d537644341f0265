//! An object in `clusterctl move` (Cluster API's move contract): a ClusterAddon, a ClusterStackRollout. The
//! move pauses the Clusters, waits while any object it moves carries `clusterctl.cluster.x-k8s.io/block-move`,
//! copies metadata and spec to the target management cluster (not the status: a subresource is not created
//! with the object), deletes the source objects and unpauses the Clusters on the target.
//!
//! So such an object blocks moves while its Clusters run (a ClusterAddon's one Cluster, a rollout's Clusters);
//! once they are paused, its reconcile (one at a time per object, so after any work in flight) records its
//! status in `clusterstack.x-k8s.io/moved-status` and stops blocking, in one write; nothing else is done while
//! they are paused. The copy on the target has another UID: it takes its status (a ClusterAddon's inventory,
//! stages and readiness; a rollout's moves and waves) and the record from it, so nothing is applied, run or
//! moved again there, and, once its Clusters run (the move is over), blocks moves again and drops the record.
//! While an object carries a record of its own, its move is under way: it does nothing else. The pure
//! [`next_move_step`] decides; [`act`] writes.

use cso_api::{
    ClusterAddon, ClusterAddonStatus, ClusterStackRollout, ClusterStackRolloutStatus,
    MOVED_STATUS_ANNOTATION, capi::BLOCK_MOVE_ANNOTATION,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::json;

use crate::{Error, patch, patch::ControllerStatus, stores::Written};

/// An object that moves with its Clusters and keeps its status across the move.
pub(crate) trait Moving:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug
{
    type Status: ControllerStatus + Default + DeserializeOwned + std::fmt::Debug;

    fn status(&self) -> Option<&Self::Status>;
    fn status_mut(&mut self) -> &mut Option<Self::Status>;

    /// The recorded status as the copy on the target takes it.
    fn adopted(recorded: Self::Status) -> Self::Status {
        recorded
    }
}

impl Moving for ClusterAddon {
    type Status = ClusterAddonStatus;

    fn status(&self) -> Option<&ClusterAddonStatus> {
        self.status.as_ref()
    }

    fn status_mut(&mut self) -> &mut Option<ClusterAddonStatus> {
        &mut self.status
    }
}

impl Moving for ClusterStackRollout {
    type Status = ClusterStackRolloutStatus;

    fn status(&self) -> Option<&ClusterStackRolloutStatus> {
        self.status.as_ref()
    }

    fn status_mut(&mut self) -> &mut Option<ClusterStackRolloutStatus> {
        &mut self.status
    }

    /// Without the Clusters' generations of its moves: the copies of the Clusters on the target count theirs
    /// anew, so they tell nothing there (a refusal is asked again; a Cluster is not taken for one seen before
    /// its move).
    fn adopted(mut recorded: ClusterStackRolloutStatus) -> ClusterStackRolloutStatus {
        for record in &mut recorded.moves {
            record.generation = None;
        }
        recorded
    }
}

/// What `MOVED_STATUS_ANNOTATION` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct MovedStatus<S> {
    /// The UID of the object the status was recorded on: another UID means this is a copy.
    uid: String,
    status: S,
}

/// What an object's reconcile does about moves before anything else.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum MoveStep<S> {
    /// Nothing: the reconcile goes on, or stops if the Clusters are paused.
    Nothing,
    /// A copy made by a move: take the recorded status as its own, and the record too.
    Adopt(Box<S>),
    /// The Clusters are paused and the object still blocks a move: record its status and stop blocking.
    Release(String),
    /// The Clusters run: block moves (again), and drop a record left by a pause that was not a move.
    Block,
}

/// The step for `object`, whose Clusters are paused or not.
pub(crate) fn next_move_step<K: Moving>(object: &K, clusters_paused: bool) -> MoveStep<K::Status> {
    let annotations = object.annotations();
    let record = annotations
        .get(MOVED_STATUS_ANNOTATION)
        .and_then(|r| serde_json::from_str::<MovedStatus<K::Status>>(r).ok());
    let uid = object.uid().unwrap_or_default();
    if let Some(record) = record
        && record.uid != uid
    {
        return MoveStep::Adopt(Box::new(K::adopted(record.status)));
    }
    let blocking = annotations.contains_key(BLOCK_MOVE_ANNOTATION);
    if clusters_paused {
        if !blocking {
            return MoveStep::Nothing;
        }
        let record = MovedStatus {
            uid,
            status: object.status().cloned().unwrap_or_default(),
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

/// Takes `object` through its move step ([`next_move_step`], then [`act`]); its Clusters are paused or not.
pub(crate) async fn take_part<K: Moving>(
    written: &Written,
    api: &Api<K>,
    object: &K,
    clusters_paused: bool,
) -> Result<K, Error> {
    act(written, api, object, next_move_step(object, clusters_paused)).await
}

/// Whether `object`'s move is under way: it carries a record (released on the source, adopted on the target
/// before its Clusters run).
pub(crate) fn under_way<K: Moving>(object: &K) -> bool {
    object.annotations().contains_key(MOVED_STATUS_ANNOTATION)
}

/// Carries out `step` on `object`; returns the object as written (the adopted status in place: the answer to
/// the metadata patch, written after it, carries it).
pub(crate) async fn act<K: Moving>(
    written: &Written,
    api: &Api<K>,
    object: &K,
    step: MoveStep<K::Status>,
) -> Result<K, Error> {
    let kind = K::kind(&());
    let annotations = match step {
        MoveStep::Nothing => return Ok(object.clone()),
        MoveStep::Adopt(status) => {
            let mut adopted = object.clone();
            *adopted.status_mut() = Some(*status);
            let status = adopted.status().cloned().unwrap_or_default();
            patch::status(written, api, &adopted, object.status(), &status).await?;
            tracing::info!(%kind, name = %object.name_any(), namespace = ?object.namespace(),
                "moved here: its recorded status adopted");
            // The record stays, as its own, until the Clusters run (`Block` drops it): the move is not over
            // before, and what is not here yet (the Clusters of a rollout) must not count as gone.
            let record = MovedStatus {
                uid: object.uid().unwrap_or_default(),
                status,
            };
            let record = serde_json::to_string(&record).unwrap_or_default();
            return annotate(written, api, &adopted, json!({ MOVED_STATUS_ANNOTATION: record })).await;
        }
        MoveStep::Release(record) => {
            tracing::info!(%kind, name = %object.name_any(), namespace = ?object.namespace(),
                "its Clusters paused: ready to be moved");
            json!({ BLOCK_MOVE_ANNOTATION: null, MOVED_STATUS_ANNOTATION: record })
        }
        MoveStep::Block => json!({ BLOCK_MOVE_ANNOTATION: "", MOVED_STATUS_ANNOTATION: null }),
    };
    annotate(written, api, object, annotations).await
}

/// Merges `annotations` (a `null` removes one) into `object`'s.
async fn annotate<K: Moving>(
    written: &Written,
    api: &Api<K>,
    object: &K,
    annotations: serde_json::Value,
) -> Result<K, Error> {
    let name = object.name_any();
    let annotated = api
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": annotations } })),
        )
        .await
        .map_err(|e| Error::kube(format!("annotate {} {name} for clusterctl move", K::kind(&())), e))?;
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
    // The copy, adopted (the record its own now): nothing while the move is under way, then blocks and drops it.
    #[case::adopted_paused(addon("b", &[(MOVED_STATUS_ANNOTATION, record("b"))], Some(ready())), true, MoveStep::Nothing)]
    #[case::adopted_running(addon("b", &[(MOVED_STATUS_ANNOTATION, record("b"))], Some(ready())), false, MoveStep::Block)]
    // A record nobody can read: not adopted, dropped once the Cluster runs.
    #[case::garbled(addon("b", &[(MOVED_STATUS_ANNOTATION, "{".into())], None), false, MoveStep::Block)]
    #[case::garbled_paused(addon("b", &[(MOVED_STATUS_ANNOTATION, "{".into())], None), true, MoveStep::Nothing)]
    fn the_move_step_follows_the_pause_and_the_uid(
        #[case] addon: ClusterAddon,
        #[case] paused: bool,
        #[case] expected: MoveStep<ClusterAddonStatus>,
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
        }]
        .into();
        let source = addon("a", &[blocking()], Some(status.clone()));
        let MoveStep::Release(record) = next_move_step(&source, true) else {
            panic!("not released")
        };
        let copy = addon("b", &[(MOVED_STATUS_ANNOTATION, record)], None);
        assert_eq!(next_move_step(&copy, true), MoveStep::Adopt(Box::new(status)));
    }

    #[test]
    fn a_rollouts_copy_adopts_its_moves_without_the_clusters_generations() {
        let moved = cso_api::cluster_stack_rollout::ClusterMove {
            cluster: "ns/c1".into(),
            outcome: "Moved".into(),
            generation: Some(7),
            rollout_generation: Some(2),
            ..Default::default()
        };
        let status = ClusterStackRolloutStatus {
            phase: "Progressing".into(),
            moves: vec![moved.clone()],
            ..Default::default()
        };
        let rollout =
            |uid: &str, annotations: &[(&str, String)], status: Option<ClusterStackRolloutStatus>| {
                let mut rollout =
                    ClusterStackRollout::new("to-v2", cso_api::ClusterStackRolloutSpec::to("ferrol", "v2"));
                rollout.metadata.uid = Some(uid.into());
                rollout.metadata.annotations = Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), v.clone()))
                        .collect(),
                );
                rollout.status = status;
                rollout
            };
        let MoveStep::Release(record) =
            next_move_step(&rollout("a", &[blocking()], Some(status.clone())), true)
        else {
            panic!("not released")
        };
        let adopted = ClusterStackRolloutStatus {
            moves: vec![cso_api::cluster_stack_rollout::ClusterMove {
                generation: None,
                ..moved
            }],
            ..status
        };
        assert_eq!(
            next_move_step(&rollout("b", &[(MOVED_STATUS_ANNOTATION, record)], None), false),
            MoveStep::Adopt(Box::new(adopted))
        );
    }
}
