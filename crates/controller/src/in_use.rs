//! The Clusters the operator may see (which releases they use is a shared rule: `cso_api::rules`).

use std::sync::Arc;

use cso_api::capi::Cluster;
use kube::api::ListParams;

use crate::{Context, Error};

/// Every Cluster the operator may see: the Cluster store when it holds them all, else a list (with a
/// `--watch-filter` the store holds only the selected Clusters, but a Cluster outside the filter still uses
/// its release). Without Cluster API installed there are none.
pub(crate) async fn list_clusters(ctx: &Context) -> Result<Vec<Arc<Cluster>>, Error> {
    if let Some(clusters) = ctx.stores().and_then(|s| s.all_clusters()) {
        return Ok(clusters);
    }
    match ctx
        .clusters(ctx.settings.namespace.as_deref())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => Ok(list.items.into_iter().map(Arc::new).collect()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(source) => Err(Error::kube("list Clusters", source)),
    }
}
