//! `cso render`: what a release would do, without doing it. Prints the objects of the cluster class and of
//! each addon chart or stage as YAML; with `--diff`, compares them with the live clusters by server-side dry
//! run and prints what would be created, changed (with a line diff) and pruned, and for a live Cluster whether
//! Cluster API would accept moving it to the release's class (`cso_controller::preflight`).

use std::{fmt::Write as _, path::Path, sync::Arc, time::Duration};

use anyhow::{Context, bail};
use cso_api::{
    ClusterAddon, ClusterStackRelease, ReleaseId, capi::Cluster, cluster_addon::StageAction, common::Resource,
};
use cso_apply::{
    ApplyEngine, Change, ClusterDiscovery, ObjectKey, PlannedChange, WorkloadClients,
    plan::without_server_fields, resource_of, template_data::template_data,
};
use cso_controller::preview::{self, ForCluster, Part, Target};
use cso_release::{
    ChartMirrors, DependencyResolver, Release, ReleaseCache,
    archive::UnpackLimits,
    source::{self, SourceSettings},
};
use cso_render::{Helm, ValuesTemplater};
use kube::{Api, Client};
use serde_json::Value;

use crate::{
    cli::RenderArgs,
    renderer_binary::{self, RendererProgram},
};

const HELM_TIMEOUT: Duration = Duration::from_secs(120);

pub async fn render(args: RenderArgs) -> anyhow::Result<()> {
    let scratch = tempfile::Builder::new().prefix("cso-render-").tempdir()?;
    let release = load_release(&args, scratch.path()).await?;
    let live_cluster = args.cluster.as_deref().and_then(live_cluster_name);
    let client = if args.diff || live_cluster.is_some() {
        Some(super::kube_client(args.kubeconfig.as_deref(), cso_apply::ClientLimits::UNLIMITED).await?)
    } else {
        None
    };

    let (cluster, workload) = match (&args.cluster, &live_cluster, &client) {
        (_, Some((namespace, name)), Some(client)) => live_target(client, namespace, name, args.diff).await?,
        (Some(file), None, _) => (file_target(file)?, None),
        _ => {
            let namespace = args.namespace.as_deref().unwrap_or("default");
            (ForCluster::example(&release, namespace), None)
        }
    };
    let namespace = args
        .namespace
        .clone()
        .or_else(|| cluster.cluster.metadata.namespace.clone())
        .unwrap_or_else(|| "default".to_owned());

    // Found as `cso run` finds it: `--helm`/`CSO_HELM`, else beside cso, else on PATH.
    let helm_binary = renderer_binary::locate_here(RendererProgram::Helm, args.helm.as_deref())?.path;
    let helm = || Helm::new(&helm_binary, HELM_TIMEOUT).context("failed to prepare helm");
    let templater = ValuesTemplater::new(helm()?).context("failed to prepare the values templater")?;
    let parts = preview::render(&helm()?, &templater, &release, &namespace, &cluster)
        .await
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("failed to render {}", release.id))?;

    let cluster_name = format!(
        "{}/{}",
        cluster.cluster.metadata.namespace.as_deref().unwrap_or_default(),
        cluster.cluster.metadata.name.as_deref().unwrap_or_default()
    );
    let mut out = format!(
        "# {} (cluster addon {}, Kubernetes {}) for Cluster {cluster_name}\n",
        release.id, release.metadata.cluster_addon, release.metadata.kubernetes
    );
    match (args.diff, client) {
        (false, _) => print_objects(&mut out, &parts, &cluster_name)?,
        (true, Some(client)) => {
            let workload = workload.as_ref().map(|w| &w.cluster);
            let diff = Diff {
                client: client.clone(),
                workload,
                release: &release,
                cluster_name: &cluster_name,
                live_cluster: live_cluster.as_ref(),
            };
            diff.print(&mut out, &parts).await?;
            if live_cluster.is_some() {
                out.push_str(&move_preflight(&client, &cluster, &release, &parts, &cluster_name).await);
            }
        }
        (true, None) => bail!("--diff needs the management cluster"),
    }
    print!("{out}");
    Ok(())
}

/// Whether Cluster API would accept moving the live Cluster to the release's class (a dry run, explained by
/// the two classes; the release's class as rendered when it is not applied yet).
async fn move_preflight(
    client: &Client,
    cluster: &ForCluster,
    release: &Release,
    parts: &[Part],
    cluster_name: &str,
) -> String {
    let rendered_class = parts
        .iter()
        .filter(|p| matches!(p.target, Target::Management { .. }))
        .flat_map(|p| &p.manifests)
        .find(|m| m.kind() == "ClusterClass")
        .map(|m| &m.object);
    let resource = cso_apply::cluster_resource(client).await;
    // Asked with the old class's defaults followed where the move as it is is refused: the change a rollout
    // with `spec.variables.followClassDefaults` would make is proposed with its dry run.
    let preflight = cso_controller::preflight::preflight_with(
        client,
        &resource,
        &cluster.cluster,
        release,
        rendered_class,
        None,
        &cso_api::rules::move_variables::VariableRules {
            follow_class_defaults: true,
            declared: Vec::new(),
        },
    )
    .await;
    cso_controller::preflight::describe(&preflight, cluster_name)
}

/// A live Cluster's workload cluster, for `--diff`.
struct LiveWorkload {
    /// Owns the private kubeconfig file helm renders against.
    _clients: WorkloadClients,
    cluster: cso_apply::WorkloadCluster,
}

/// The live Cluster `namespace/name` with its template data from the management cluster and, for a diff,
/// its workload cluster (addons are then rendered against it, as the controller renders them).
async fn live_target(
    client: &Client,
    namespace: &str,
    name: &str,
    diff: bool,
) -> anyhow::Result<(ForCluster, Option<LiveWorkload>)> {
    let resource = cso_apply::cluster_resource(client).await;
    let cluster = Api::<Cluster>::namespaced_with(client.clone(), namespace, &resource)
        .get(name)
        .await
        .with_context(|| format!("failed to read Cluster {namespace}/{name}"))?;
    let template_data = template_data(&ClusterDiscovery::new(client.clone()), &cluster).await?;
    let workload = if diff {
        let clients = WorkloadClients::new(client.clone(), Duration::from_secs(10), Duration::from_secs(30))?;
        let cluster = clients
            .get(namespace, name)
            .await
            .with_context(|| format!("cannot reach the workload cluster of {namespace}/{name}"))?;
        Some(LiveWorkload {
            _clients: clients,
            cluster,
        })
    } else {
        None
    };
    let target = ForCluster {
        cluster,
        template_data,
        workload_kubeconfig: workload.as_ref().map(|w| w.cluster.kubeconfig_path.clone()),
    };
    Ok((target, workload))
}

/// A Cluster from the YAML file `file`, whole (see [`ForCluster::offline`]).
fn file_target(file: &str) -> anyhow::Result<ForCluster> {
    let text = std::fs::read_to_string(file).with_context(|| format!("failed to read the Cluster {file}"))?;
    let object: Value = serde_saphyr::from_str(&text).with_context(|| format!("{file} is not YAML"))?;
    if !object.is_object() {
        bail!("{file} is not a Cluster: not a YAML map");
    }
    ForCluster::offline(object).map_err(|e| anyhow::anyhow!("{file} is {e}"))
}

/// `NAMESPACE/NAME` when `cluster` is not an existing file.
fn live_cluster_name(cluster: &str) -> Option<(String, String)> {
    if Path::new(cluster).is_file() {
        return None;
    }
    let (namespace, name) = cluster.split_once('/')?;
    (!namespace.is_empty() && !name.is_empty() && !name.contains('/'))
        .then(|| (namespace.to_owned(), name.to_owned()))
}

/// The release named by `args.release`: a directory (copied into `scratch`, since unpacking writes beside the
/// archives and a preview must not change the user's files) or a tag fetched through the release cache.
async fn load_release(args: &RenderArgs, scratch: &Path) -> anyhow::Result<Release> {
    let resolver =
        DependencyResolver::new(ChartMirrors::parse(&args.chart_mirror).map_err(anyhow::Error::msg)?);
    let dir = Path::new(&args.release);
    if dir.is_dir() {
        let tag = dir
            .canonicalize()?
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let id = ReleaseId::parse_tag(&tag)
            .with_context(|| format!("the release directory must be named by its tag, not {tag:?}"))?;
        let copy = scratch.join(&tag);
        cso_release::release::copy_release_dir(dir, &copy)
            .with_context(|| format!("failed to copy {}", dir.display()))?;
        // Prepared as the cache prepares a release that enters it, `cso run --local` included: verified, the
        // dependencies the charts do not vendor fetched into the copy (from `--chart-mirror`, else the
        // repositories in `Chart.yaml`), verified again.
        return cso_release::cache::prepare_release(&copy, &id, &resolver, UnpackLimits::default())
            .await
            .with_context(|| format!("failed to prepare the release {tag}"));
    }
    let id = ReleaseId::parse_tag(&args.release).with_context(|| {
        format!(
            "{:?} is neither a release directory nor a release tag",
            args.release
        )
    })?;
    let settings = SourceSettings {
        kind: args.source.parse()?,
        local: false,
        release_dir: args.release_dir.clone(),
        github_api_url: args.github_api_url.clone(),
        verify_keys: Vec::new(),
    };
    let cache = ReleaseCache::new(
        &args.release_dir,
        source::from_settings(&settings)?,
        UnpackLimits::default(),
    )?
    .with_dependencies(resolver);
    Ok(cache.get(&id).await?.as_ref().clone())
}

fn heading(part: &Part, cluster_name: &str) -> String {
    match &part.target {
        Target::Management { namespace } => {
            format!("{} -> management cluster, namespace {namespace}", part.title)
        }
        Target::Workload => format!("{} -> workload cluster of {cluster_name}", part.title),
    }
}

fn print_objects(out: &mut String, parts: &[Part], cluster_name: &str) -> anyhow::Result<()> {
    for part in parts {
        writeln!(
            out,
            "# == {}: {} objects",
            heading(part, cluster_name),
            part.manifests.len()
        )?;
        for manifest in &part.manifests {
            writeln!(
                out,
                "---\n{}",
                serde_saphyr::to_string(&manifest.object)?.trim_end()
            )?;
        }
    }
    Ok(())
}

struct Diff<'a> {
    client: Client,
    workload: Option<&'a cso_apply::WorkloadCluster>,
    release: &'a Release,
    cluster_name: &'a str,
    live_cluster: Option<&'a (String, String)>,
}

#[derive(Default)]
struct Tally {
    create: usize,
    change: usize,
    prune: usize,
    delete: usize,
    unchanged: usize,
    kept: usize,
    refused: usize,
}

/// Whether the objects planned for removal are pruned (gone from the release) or deleted by a delete stage.
#[derive(Clone, Copy)]
enum Removal {
    Prune,
    Delete,
}

impl Diff<'_> {
    async fn print(&self, out: &mut String, parts: &[Part]) -> anyhow::Result<()> {
        let mut tally = Tally::default();
        let management = ApplyEngine::for_management(Arc::new(ClusterDiscovery::new(self.client.clone())));
        let mut workload_keys = Vec::new();
        for part in parts {
            writeln!(out, "== {}", heading(part, self.cluster_name))?;
            if part.action == StageAction::Delete {
                let Some(workload) = self.workload else {
                    for manifest in &part.manifests {
                        tally.delete += 1;
                        writeln!(out, "   delete     {} {}", manifest.kind(), manifest.name())?;
                    }
                    writeln!(
                        out,
                        "   (not checked: pass --cluster NAMESPACE/NAME of a live Cluster)"
                    )?;
                    continue;
                };
                let targets: Vec<Resource> = part.manifests.iter().map(resource_of).collect();
                let planned = workload
                    .engine
                    .plan_delete(&targets, part.target.default_namespace())
                    .await;
                print_planned(out, &planned, &self.release.id.tag(), Removal::Delete, &mut tally)?;
                continue;
            }
            let planned = match (&part.target, self.workload) {
                (Target::Management { namespace }, _) => {
                    let previous = self.release_inventory(namespace).await?;
                    management
                        .plan(&part.manifests, namespace, &part.labels, &previous)
                        .await
                }
                (Target::Workload, Some(workload)) => {
                    let planned = workload
                        .engine
                        .plan(
                            &part.manifests,
                            part.target.default_namespace(),
                            &part.labels,
                            &[],
                        )
                        .await;
                    workload_keys.extend(planned.iter().map(|p| p.key.clone()));
                    planned
                }
                (Target::Workload, None) => {
                    writeln!(
                        out,
                        "   (not compared: pass --cluster NAMESPACE/NAME of a live Cluster)"
                    )?;
                    continue;
                }
            };
            print_planned(out, &planned, &self.release.id.tag(), Removal::Prune, &mut tally)?;
        }
        if let (Some(workload), Some((namespace, name))) = (self.workload, self.live_cluster) {
            let previous = self.addon_inventory(namespace, name).await?;
            let held = cso_apply::inventory::shrink_held(&previous, workload_keys.len());
            let stale: Vec<Resource> = previous
                .into_iter()
                .filter(|r| !workload_keys.contains(&ObjectKey::of(r)))
                .collect();
            if !stale.is_empty() {
                writeln!(
                    out,
                    "== no longer in the release -> workload cluster of {}",
                    self.cluster_name
                )?;
                let planned = match held {
                    // The apply would be held: nothing of the inventory goes.
                    Some(why) => stale
                        .iter()
                        .map(|r| PlannedChange {
                            key: ObjectKey::of(r),
                            change: Change::Keep(why.clone()),
                        })
                        .collect(),
                    None => workload.engine.plan_prune(&stale, "kube-system").await,
                };
                print_planned(out, &planned, &self.release.id.tag(), Removal::Prune, &mut tally)?;
            }
        }
        writeln!(
            out,
            "== {} to create, {} to change, {} to prune, {} to delete, {} unchanged, {} left alone, {} refused",
            tally.create, tally.change, tally.prune, tally.delete, tally.unchanged, tally.kept, tally.refused
        )?;
        Ok(())
    }

    /// What the ClusterStackRelease of this release applied (if it exists): its objects are pruned when gone.
    async fn release_inventory(&self, namespace: &str) -> anyhow::Result<Vec<Resource>> {
        let releases: Api<ClusterStackRelease> = Api::namespaced(self.client.clone(), namespace);
        let release = releases.get_opt(&self.release.id.tag()).await?;
        Ok(release
            .and_then(|r| r.status)
            .map(|s| s.resources)
            .unwrap_or_default()
            .to_vec())
    }

    /// What the Cluster's ClusterAddon applied to the workload cluster.
    async fn addon_inventory(&self, namespace: &str, cluster: &str) -> anyhow::Result<Vec<Resource>> {
        let addons: Api<ClusterAddon> = Api::namespaced(self.client.clone(), namespace);
        let addon = addons
            .get_opt(&cso_api::cluster_addon::cluster_addon_name(cluster))
            .await?;
        Ok(addon
            .and_then(|a| a.status)
            .map(|s| s.resources)
            .unwrap_or_default()
            .to_vec())
    }
}

fn print_planned(
    out: &mut String,
    planned: &[PlannedChange],
    tag: &str,
    removal: Removal,
    tally: &mut Tally,
) -> anyhow::Result<()> {
    for item in planned {
        match &item.change {
            Change::Create { .. } => {
                tally.create += 1;
                writeln!(out, "   create     {}", item.key)?;
            }
            Change::Unchanged => {
                tally.unchanged += 1;
                writeln!(out, "   unchanged  {}", item.key)?;
            }
            Change::Prune => match removal {
                Removal::Prune => {
                    tally.prune += 1;
                    writeln!(out, "   prune      {}", item.key)?;
                }
                Removal::Delete => {
                    tally.delete += 1;
                    writeln!(out, "   delete     {}", item.key)?;
                }
            },
            Change::Keep(reason) => {
                tally.kept += 1;
                writeln!(out, "   keep       {} ({reason})", item.key)?;
            }
            Change::Absent => writeln!(out, "   absent     {}", item.key)?,
            Change::Refused(reason) => {
                tally.refused += 1;
                writeln!(out, "   refused    {}: {reason}", item.key)?;
            }
            Change::Update { before, after } => {
                tally.change += 1;
                writeln!(out, "   change     {}", item.key)?;
                let before = serde_saphyr::to_string(&without_server_fields(before.clone()))?;
                let after = serde_saphyr::to_string(&without_server_fields(after.clone()))?;
                let diff = similar::TextDiff::from_lines(&before, &after);
                let unified = diff
                    .unified_diff()
                    .context_radius(2)
                    .header("live", tag)
                    .to_string();
                for line in unified.lines() {
                    writeln!(out, "      {line}")?;
                }
            }
        }
    }
    Ok(())
}
