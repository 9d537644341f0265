//! Reading the reconciled object as it is, and writing what a reconciler decided: the status by server-side
//! apply (fields we stop setting are removed, unlike with a merge patch), finalizers by JSON patch guarded by
//! the resourceVersion. Every write records the version it made ([`Written`]), so that the next reconcile
//! knows whether the store's copy has caught up with it.

use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::json;

use crate::{Error, stores::Written};

/// The field manager of the status; the same as the apply engine's, so one name owns all our writes.
pub(crate) const FIELD_MANAGER: &str = cso_apply::DEFAULT_FIELD_MANAGER;

/// `object` as the API server has it now; `None` when it is gone. The controller's store can lag behind the
/// writes of the previous reconcile: acting on that copy would redo finished work (run a finished stage
/// again, and so undo what happened since) or skip a status write because the old copy already showed it.
/// When the stores run, the queued copy is used if it is not older than our last write of it (see
/// [`crate::stores::Written`]), which is what a reconcile triggered by its own object's events finds; else,
/// and without stores, one read.
pub(crate) async fn current<K>(ctx: &crate::Context, api: &Api<K>, object: &K) -> Result<Option<K>, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    if ctx.stores().is_some() && ctx.written.is_current(object) {
        return Ok(Some(object.clone()));
    }
    let fresh = api
        .get_opt(&object.name_any())
        .await
        .map_err(|source| Error::kube(format!("read {}", object.name_any()), source))?;
    // Read fresh: the store catches up with it, and nothing of ours is newer.
    ctx.written.forget(object);
    Ok(fresh)
}

/// A status a controller writes, of which some fields may be another writer's.
///
/// The fleet status writer (`crate::fleet_status`, field manager `cso-fleet`) owns `status.clusters` of
/// ClusterStacks and ClusterStackReleases, and `status.moves` of the latter. A controller applies its whole
/// status with force: had it sent `status.clusters` as read, it would have become a co-owner of the counts
/// (and, forced, taken them over), and a later write without them would have removed them. So a controller's write leaves those fields out
/// entirely (they are `None`, which is not serialised), neither dropping nor taking them, and whether it
/// writes at all does not depend on them: a count that changed is no reason for a controller to write.
pub(crate) trait ControllerStatus: Serialize + PartialEq + Clone {
    /// The status without the fields another writer owns.
    fn controllers_part(&self) -> std::borrow::Cow<'_, Self> {
        std::borrow::Cow::Borrowed(self)
    }
}

impl ControllerStatus for cso_api::ClusterAddonStatus {}
impl ControllerStatus for cso_api::ClusterStackRolloutStatus {}

/// The statuses whose `clusters` the fleet status writer owns: the controllers' part is the rest.
macro_rules! counts_written_by_the_fleet_writer {
    ($($status:ty),+) => {$(
        impl ControllerStatus for $status {
            fn controllers_part(&self) -> std::borrow::Cow<'_, Self> {
                if self.clusters.is_none() {
                    return std::borrow::Cow::Borrowed(self);
                }
                std::borrow::Cow::Owned(Self {
                    clusters: None,
                    ..self.clone()
                })
            }
        }
    )+};
}

counts_written_by_the_fleet_writer!(cso_api::ClusterStackStatus);

/// A ClusterStackRelease's `clusters` and `moves` are the fleet status writer's.
impl ControllerStatus for cso_api::ClusterStackReleaseStatus {
    fn controllers_part(&self) -> std::borrow::Cow<'_, Self> {
        if self.clusters.is_none() && self.moves.is_none() {
            return std::borrow::Cow::Borrowed(self);
        }
        std::borrow::Cow::Owned(Self {
            clusters: None,
            moves: None,
            ..self.clone()
        })
    }
}

/// Writes `status` of `object` when it differs from `before` (recorded in `written`); the fields of other
/// writers are neither compared nor written ([`ControllerStatus`]).
pub(crate) async fn status<K, S>(
    written: &Written,
    api: &Api<K>,
    object: &K,
    before: Option<&S>,
    status: &S,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    S: ControllerStatus,
{
    let status = status.controllers_part();
    if before.map(ControllerStatus::controllers_part).as_deref() == Some(status.as_ref()) {
        return Ok(());
    }
    let patch = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    let updated = api
        .patch_status(
            &object.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(|source| Error::kube(format!("update the status of {}", object.name_any()), source))?;
    written.record(&updated);
    Ok(())
}

/// Adds `finalizer` unless it is there.
pub(crate) async fn add_finalizer<K>(
    written: &Written,
    api: &Api<K>,
    object: &K,
    finalizer: &str,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    if object.finalizers().iter().any(|f| f == finalizer) {
        return Ok(());
    }
    let ops = if object.meta().finalizers.is_none() {
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": object.resource_version()},
            {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]},
        ])
    } else {
        json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": object.resource_version()},
            {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer},
        ])
    };
    json_patch(written, api, object, ops, "add the finalizer to").await
}

/// Removes `finalizer` if it is there.
pub(crate) async fn remove_finalizer<K>(
    written: &Written,
    api: &Api<K>,
    object: &K,
    finalizer: &str,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let Some(index) = object.finalizers().iter().position(|f| f == finalizer) else {
        return Ok(());
    };
    let ops = json!([
        {"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": finalizer},
        {"op": "remove", "path": format!("/metadata/finalizers/{index}")},
    ]);
    json_patch(written, api, object, ops, "remove the finalizer from").await
}

async fn json_patch<K>(
    written: &Written,
    api: &Api<K>,
    object: &K,
    ops: serde_json::Value,
    what: &str,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let patch: json_patch::Patch =
        serde_json::from_value(ops).map_err(|e| Error::Internal(format!("a JSON patch: {e}")))?;
    match api
        .patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
    {
        Ok(updated) => {
            written.record(&updated);
            Ok(())
        }
        // Gone already: nothing to guard any more.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::kube(format!("{what} {}", object.name_any()), source)),
    }
}

#[cfg(test)]
mod tests {
    use cso_api::{
        ClusterStackReleaseStatus, ClusterStackStatus, cluster_stack::StackClusters,
        cluster_stack_release::ClusterCounts,
    };

    use super::*;

    /// A controller's status write has no `clusters` (not even empty), and a change of the counts alone is
    /// no reason for it to write.
    #[test]
    fn a_controllers_status_leaves_out_the_counts() {
        let counts = ClusterCounts {
            clusters: 2,
            ready: 2,
            ..Default::default()
        };
        let release = ClusterStackReleaseStatus {
            ready: true,
            clusters: Some(counts.clone()),
            moves: Some(cso_api::cluster_stack_release::ReleaseMoves {
                clusters: 1,
                movable: 1,
                ..Default::default()
            }),
            ..Default::default()
        };
        let written = serde_json::to_value(release.controllers_part()).unwrap();
        assert_eq!(written, json!({"ready": true}));
        let stack = ClusterStackStatus {
            usable_versions: "v1".into(),
            clusters: Some(StackClusters {
                total: counts,
                releases: Vec::new(),
            }),
            ..Default::default()
        };
        let written = serde_json::to_value(stack.controllers_part()).unwrap();
        assert_eq!(written, json!({"usableVersions": "v1"}));
        let recounted = ClusterStackStatus {
            clusters: None,
            ..stack.clone()
        };
        assert_eq!(stack.controllers_part(), recounted.controllers_part());
    }
}
