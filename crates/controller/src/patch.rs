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

/// Writes `status` of `object` when it differs from `before` (recorded in `written`).
pub(crate) async fn status<K, S>(
    written: &Written,
    api: &Api<K>,
    object: &K,
    before: Option<&S>,
    status: &S,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    S: Serialize + PartialEq,
{
    if before == Some(status) {
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
