//! `cso status`: the fleet view over a kubeconfig. Per release, the Clusters whose addons are on it and how
//! many are ready, progressing or failing, with the first failing ones named; counted by
//! [`cso_api::fleet`], the rule the `cso_clusters` gauge and the `status.clusters` of ClusterStacks and
//! ClusterStackReleases follow too.

use std::fmt::Write as _;

use anyhow::Context as _;
use cso_api::{
    ClusterAddon,
    fleet::{ReleaseCounts, fleet},
};
use kube::Api;

use crate::cli::StatusArgs;

pub async fn print(args: StatusArgs) -> anyhow::Result<()> {
    let client = super::kube_client(args.kubeconfig.as_deref(), cso_apply::ClientLimits::UNLIMITED).await?;
    let addons: Api<ClusterAddon> = match &args.namespace {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::all(client),
    };
    let listed = addons
        .list(&Default::default())
        .await
        .context("failed to list the ClusterAddons")?;
    print!("{}", table(&fleet(&listed.items)));
    Ok(())
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
    let widths: Vec<usize> = (0..HEADINGS.len())
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
    use super::*;

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
