//! Installing CustomResourceDefinitions into a control plane and waiting until they are served.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api,
    api::{Patch, PatchParams},
};

use crate::Error;

const ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(60);
const FIELD_MANAGER: &str = "cso-testenv";

/// Applies the CRDs (server-side) and waits until every one is Established.
pub async fn install(client: &kube::Client, crds: &[CustomResourceDefinition]) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .map_err(|e| Error::Kube(format!("failed to apply CRD {name}: {e}")))?;
    }
    for crd in crds {
        wait_established(&api, crd.metadata.name.as_deref().unwrap_or_default()).await?;
        wait_discoverable(client, crd).await?;
    }
    Ok(())
}

/// Waits until the API server's discovery lists the CRD's kind in every version it serves: `Established` comes
/// a moment before discovery does, and a client that looks the kind up in that moment finds nothing.
async fn wait_discoverable(client: &kube::Client, crd: &CustomResourceDefinition) -> Result<(), Error> {
    let group = &crd.spec.group;
    let plural = &crd.spec.names.plural;
    let deadline = Instant::now() + ESTABLISHED_TIMEOUT;
    for version in crd.spec.versions.iter().filter(|v| v.served) {
        let group_version = format!("{group}/{}", version.name);
        loop {
            let listed = client
                .list_api_group_resources(&group_version)
                .await
                .is_ok_and(|list| list.resources.iter().any(|r| &r.name == plural));
            if listed {
                break;
            }
            if Instant::now() > deadline {
                return Err(Error::Kube(format!(
                    "{plural}.{group_version} not in the API server's discovery after {ESTABLISHED_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// Reads every CRD in the `*.yaml` files of `dirs`.
pub fn read_dirs(dirs: &[PathBuf]) -> Result<Vec<CustomResourceDefinition>, Error> {
    let mut crds = Vec::new();
    for dir in dirs {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| Error::io(dir, e))?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
            .collect();
        files.sort();
        for file in files {
            crds.extend(read_file(&file)?);
        }
    }
    Ok(crds)
}

/// Reads the CRDs of a chart's `crds` files that carry Helm template markers (cert-manager's): the
/// markers sit in comments and in label and annotation values, so those are dropped; the schema is kept.
pub fn read_helm_templated(dir: &Path) -> Result<Vec<CustomResourceDefinition>, Error> {
    let mut crds = read_dirs(&[dir.to_path_buf()])?;
    for crd in &mut crds {
        crd.metadata.labels = None;
        crd.metadata.annotations = None;
    }
    Ok(crds)
}

fn read_file(path: &Path) -> Result<Vec<CustomResourceDefinition>, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let docs: Vec<Option<CustomResourceDefinition>> = serde_saphyr::from_multiple(&text)
        .map_err(|e| Error::Kube(format!("{}: not a CRD: {e}", path.display())))?;
    Ok(docs.into_iter().flatten().collect())
}

async fn wait_established(api: &Api<CustomResourceDefinition>, name: &str) -> Result<(), Error> {
    let deadline = Instant::now() + ESTABLISHED_TIMEOUT;
    loop {
        let crd = api
            .get(name)
            .await
            .map_err(|e| Error::Kube(format!("failed to read CRD {name}: {e}")))?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Kube(format!(
                "CRD {name} not Established after {ESTABLISHED_TIMEOUT:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
