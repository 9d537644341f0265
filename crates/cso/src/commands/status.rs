//! `cso status`: the fleet view over a kubeconfig. Per release, the Clusters whose addons are on it and how
//! many are ready, progressing or failing, with the first failing ones named; counted by
//! [`cso_api::fleet`], the rule the `cso_clusters` gauge and the `status.clusters` of ClusterStacks and
//! ClusterStackReleases follow too. Then, for the releases whose `status.moves` the operator wrote, how many
//! Clusters of their stack on other releases could move to them and which could not, and why (issue 30);
//! then the ClusterStackRollouts, one line each (`cso rollout status NAME` shows one in full).

use std::fmt::Write as _;

use anyhow::Context as _;
use cso_api::{
    ClusterAddon, ClusterStackRelease, ClusterStackRollout,
    capi::Cluster,
    fleet::{Member, ReleaseCounts, clusters_seen, fleet},
};
use kube::Api;

use crate::cli::StatusArgs;

pub async fn print(args: StatusArgs) -> anyhow::Result<()> {
    let client = super::kube_client(args.kubeconfig.as_deref(), cso_apply::ClientLimits::UNLIMITED).await?;
    let (addons, releases, rollouts): (
        Api<ClusterAddon>,
        Api<ClusterStackRelease>,
        Api<ClusterStackRollout>,
    ) = match &args.namespace {
        Some(namespace) => (
            Api::namespaced(client.clone(), namespace),
            Api::namespaced(client.clone(), namespace),
            Api::namespaced(client.clone(), namespace),
        ),
        None => (
            Api::all(client.clone()),
            Api::all(client.clone()),
            Api::all(client.clone()),
        ),
    };
    let listed = addons
        .list(&Default::default())
        .await
        .context("failed to list the ClusterAddons")?;
    // Clusters are counted, not ClusterAddons: one whose Cluster is gone counts for nothing, one that failed
    // before its first install counts on the release its Cluster's class names. Without Cluster API's CRD
    // (or the right to list Clusters), each ClusterAddon counts alone.
    let cluster_resource = cso_controller::cluster_resource(&client).await;
    let clusters: Api<Cluster> = match &args.namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &cluster_resource),
        None => Api::all_with(client.clone(), &cluster_resource),
    };
    let clusters = clusters.list(&Default::default()).await.ok();
    let seen = clusters_seen(&listed.items, clusters.as_ref().map(|c| &c.items));
    let counts = fleet(
        listed
            .items
            .iter()
            .zip(&seen)
            .map(|(addon, cluster)| Member { addon, cluster }),
    );
    print!("{}", table(&counts));
    // The moves are an addition: without them (an older operator, no ClusterStackReleases) the table is all.
    let releases = releases
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let moves = moves_table(&releases);
    if !moves.is_empty() {
        print!("\n{moves}");
    }
    // Rollouts too are an addition (an operator without their CRD has none).
    let rollouts = rollouts
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let rollouts = super::rollout::summary_table(&rollouts);
    if !rollouts.is_empty() {
        print!("\n{rollouts}");
    }
    Ok(())
}

/// Per release whose `status.moves` is written: the Clusters of its stack on other releases, how many could
/// move to it (as they are, or with their old class's defaults followed), and the first that could not with
/// why. Empty when no release has moves.
fn moves_table(releases: &[ClusterStackRelease]) -> String {
    const HEADINGS: [&str; 6] = [
        "MOVES TO",
        "OTHER CLUSTERS",
        "COULD MOVE",
        "WITH DEFAULTS",
        "REFUSED",
        "REFUSED CLUSTERS",
    ];
    let mut rows = Vec::new();
    for release in releases {
        let Some(moves) = release.status.as_ref().and_then(|s| s.moves.as_ref()) else {
            continue;
        };
        let mut refused: Vec<String> = moves
            .refused_clusters
            .iter()
            .map(|r| format!("{} ({})", r.cluster, r.reasons.join("; ")))
            .collect();
        let named = i32::try_from(moves.refused_clusters.len()).unwrap_or(i32::MAX);
        if moves.refused > named {
            refused.push(format!("… ({} more)", moves.refused - named));
        }
        rows.push(vec![
            format!(
                "{}/{}",
                release.metadata.namespace.as_deref().unwrap_or_default(),
                release.metadata.name.as_deref().unwrap_or_default()
            ),
            moves.clusters.to_string(),
            moves.movable.to_string(),
            moves.movable_with_defaults.to_string(),
            moves.refused.to_string(),
            refused.join(", "),
        ]);
    }
    if rows.is_empty() {
        return String::new();
    }
    rows.insert(0, HEADINGS.map(str::to_owned).to_vec());
    align(rows)
}

/// The counts as a table, one line per release.
fn table(counts: &[ReleaseCounts]) -> String {
    const HEADINGS: [&str; 6] = [
        "RELEASE",
        "CLUSTERS",
        "READY",
        "PROGRESSING",
        "FAILING",
        "FAILING CLUSTERS",
    ];
    let mut rows = vec![HEADINGS.map(str::to_owned).to_vec()];
    for release in counts {
        let mut failing = release.failing_clusters.join(", ");
        if release.failing > release.failing_clusters.len() {
            let _ = write!(
                failing,
                ", … ({} more)",
                release.failing - release.failing_clusters.len()
            );
        }
        rows.push(vec![
            if release.release.is_empty() {
                "(none yet)".to_owned()
            } else {
                release.release.clone()
            },
            release.clusters.to_string(),
            release.ready.to_string(),
            release.progressing.to_string(),
            release.failing.to_string(),
            failing,
        ]);
    }
    align(rows)
}

/// `rows` (the headings first) in columns two spaces apart.
pub(super) fn align(rows: Vec<Vec<String>>) -> String {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|column| {
            rows.iter()
                .map(|row| row[column].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut text = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        let _ = writeln!(text, "{}", cells.join("  ").trim_end());
    }
    text
}

#[cfg(test)]
mod tests {
    use cso_api::cluster_stack_release::{RefusedMove, ReleaseMoves};

    use super::*;

    #[test]
    fn releases_with_moves_say_which_clusters_could_move_and_why_not() {
        let mut with = ClusterStackRelease::new("docker-scs-1-35-v2", Default::default());
        with.metadata.namespace = Some("ns".into());
        with.status.get_or_insert_default().moves = Some(ReleaseMoves {
            clusters: 6,
            movable: 1,
            movable_with_defaults: 1,
            refused: 4,
            refused_clusters: vec![RefusedMove {
                cluster: "ns/c1".into(),
                reasons: vec!["variable imageRepository: \"x\" is not one of [\"\"]".into()],
            }],
        });
        let without = ClusterStackRelease::new("docker-scs-1-35-v1", Default::default());
        assert_eq!(moves_table(std::slice::from_ref(&without)), "");
        assert_eq!(
            moves_table(&[without, with]),
            "MOVES TO               OTHER CLUSTERS  COULD MOVE  WITH DEFAULTS  REFUSED  REFUSED CLUSTERS\n\
             ns/docker-scs-1-35-v2  6               1           1              4        ns/c1 (variable \
             imageRepository: \"x\" is not one of [\"\"]), … (3 more)\n"
        );
    }

    #[test]
    fn one_aligned_line_per_release() {
        let counts = [
            ReleaseCounts {
                release: String::new(),
                clusters: 1,
                progressing: 1,
                ..Default::default()
            },
            ReleaseCounts {
                stack: "docker-ferrol-1-27".into(),
                release: "docker-ferrol-1-27-v2".into(),
                clusters: 10,
                ready: 5,
                failing: 5,
                failing_clusters: vec!["ns/a".into(), "ns/b".into(), "ns/c".into()],
                ..Default::default()
            },
        ];
        assert_eq!(
            table(&counts),
            "RELEASE                CLUSTERS  READY  PROGRESSING  FAILING  FAILING CLUSTERS\n\
             (none yet)             1         0      1            0\n\
             docker-ferrol-1-27-v2  10        5      0            5        ns/a, ns/b, ns/c, … (2 more)\n"
        );
    }
}
