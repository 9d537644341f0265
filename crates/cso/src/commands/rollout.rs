//! `cso rollout status NAME`: one ClusterStackRollout as its status tells it: phase and current wave, each
//! wave's counts, the failing Clusters with why, and the Clusters the preflight refused with why. And the
//! one-line-per-rollout table `cso status` ends with.

use std::fmt::Write as _;

use anyhow::Context as _;
use cso_api::{
    ClusterStackRollout,
    cluster_stack_rollout::outcome,
    conditions::{ConditionStatus, READY},
};
use kube::Api;

use super::status::align;
use crate::cli::RolloutStatusArgs;

pub async fn print(args: RolloutStatusArgs) -> anyhow::Result<()> {
    let client = super::kube_client(args.kubeconfig.as_deref(), cso_apply::ClientLimits::UNLIMITED).await?;
    let rollout = Api::<ClusterStackRollout>::namespaced(client, &args.namespace)
        .get_opt(&args.name)
        .await
        .with_context(|| {
            format!(
                "failed to read ClusterStackRollout {}/{}",
                args.namespace, args.name
            )
        })?
        .with_context(|| {
            format!(
                "ClusterStackRollout {}/{} does not exist",
                args.namespace, args.name
            )
        })?;
    print!("{}", describe(&rollout));
    Ok(())
}

/// One rollout in full.
fn describe(rollout: &ClusterStackRollout) -> String {
    let mut out = String::new();
    let status = rollout.status.clone().unwrap_or_default();
    let _ = writeln!(
        out,
        "rollout {}/{}: ClusterStack {} to {} ({}): {}{}",
        rollout.metadata.namespace.as_deref().unwrap_or_default(),
        rollout.metadata.name.as_deref().unwrap_or_default(),
        rollout.spec.cluster_stack,
        rollout.spec.version,
        if status.target_class.is_empty() {
            "class unknown yet"
        } else {
            &status.target_class
        },
        if status.phase.is_empty() {
            "not reconciled yet"
        } else {
            &status.phase
        },
        if status.current_wave.is_empty() {
            String::new()
        } else {
            format!(", wave {}", status.current_wave)
        }
    );
    let _ = writeln!(
        out,
        "clusters {}, done {}, failing {}{}{}",
        status.clusters,
        status.done,
        status.failing,
        if status.skipped > 0 {
            format!(", skipped {} (not on the release)", status.skipped)
        } else {
            String::new()
        },
        if status.unassigned > 0 {
            format!(", in no wave {}", status.unassigned)
        } else {
            String::new()
        }
    );
    for condition in status
        .conditions
        .iter()
        .filter(|c| c.type_ != READY && c.status == ConditionStatus::False)
    {
        let _ = writeln!(
            out,
            "{} {}: {}",
            condition.type_,
            condition.reason.as_deref().unwrap_or_default(),
            condition.message.as_deref().unwrap_or_default()
        );
    }
    if !status.waves.is_empty() {
        let mut rows = vec![
            [
                "WAVE", "CLUSTERS", "MOVED", "DONE", "FAILING", "SKIPPED", "FINISHED",
            ]
            .map(str::to_owned)
            .to_vec(),
        ];
        for wave in &status.waves {
            rows.push(vec![
                format!(
                    "{}{}",
                    wave.name,
                    if wave.name == status.current_wave {
                        " *"
                    } else {
                        ""
                    }
                ),
                wave.clusters.to_string(),
                wave.moved.to_string(),
                wave.done.to_string(),
                wave.failing.to_string(),
                wave.skipped.to_string(),
                wave.finished_at.map(|t| t.to_rfc3339()).unwrap_or_default(),
            ]);
        }
        out.push('\n');
        out.push_str(&align(rows));
    }
    let failing: Vec<String> = status
        .waves
        .iter()
        .flat_map(|w| {
            w.failing_clusters
                .iter()
                .map(move |f| format!("  {} (wave {}): {}", f.cluster, w.name, f.reason))
        })
        .collect();
    if !failing.is_empty() {
        let _ = writeln!(out, "\nfailing:\n{}", failing.join("\n"));
    }
    let refused: Vec<String> = status
        .moves
        .iter()
        .filter(|m| m.outcome == outcome::REFUSED)
        .map(|m| format!("  {} (from {}): {}", m.cluster, m.from, m.reasons.join("; ")))
        .collect();
    if !refused.is_empty() {
        let _ = writeln!(
            out,
            "\nrefused by the preflight (skipped until they change):\n{}",
            refused.join("\n")
        );
    }
    // What the moves did to the variables, to undo it by.
    let changed: Vec<String> = status
        .moves
        .iter()
        .filter(|m| !m.variables_dropped.is_empty() || !m.variables_changed.is_empty())
        .map(|m| {
            let mut lines = vec![format!("  {}:", m.cluster)];
            lines.extend(
                m.variables_dropped
                    .iter()
                    .map(|d| format!("    left out {d} (the old class's default)")),
            );
            lines.extend(m.variables_changed.iter().map(|c| format!("    {c}")));
            lines.join("\n")
        })
        .collect();
    if !changed.is_empty() {
        let _ = writeln!(out, "\nvariables changed by the moves:\n{}", changed.join("\n"));
    }
    out
}

/// One line per rollout: name, target, phase, wave, done of all, failing. Empty without rollouts.
pub(super) fn summary_table(rollouts: &[ClusterStackRollout]) -> String {
    if rollouts.is_empty() {
        return String::new();
    }
    let mut rows = vec![
        [
            "ROLLOUT",
            "TO",
            "PHASE",
            "WAVE",
            "DONE",
            "FAILING",
            "FAILING CLUSTERS",
        ]
        .map(str::to_owned)
        .to_vec(),
    ];
    for rollout in rollouts {
        let status = rollout.status.clone().unwrap_or_default();
        let failing: Vec<String> = status
            .waves
            .iter()
            .flat_map(|w| w.failing_clusters.iter().map(|f| f.cluster.clone()))
            .collect();
        rows.push(vec![
            format!(
                "{}/{}",
                rollout.metadata.namespace.as_deref().unwrap_or_default(),
                rollout.metadata.name.as_deref().unwrap_or_default()
            ),
            status.target_class.clone(),
            status.phase.clone(),
            status.current_wave.clone(),
            format!("{}/{}", status.done, status.clusters),
            status.failing.to_string(),
            failing.join(", "),
        ]);
    }
    align(rows)
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use cso_api::{
        ClusterStackRolloutSpec, ClusterStackRolloutStatus,
        cluster_stack_rollout::{ClusterMove, FailingCluster, WaveStatus},
    };

    use super::*;

    fn rollout() -> ClusterStackRollout {
        let mut rollout = ClusterStackRollout::new("to-v2", ClusterStackRolloutSpec::to("ferrol", "v2"));
        rollout.metadata.namespace = Some("ns".into());
        rollout.status = Some(ClusterStackRolloutStatus {
            phase: "Paused".into(),
            current_wave: "early".into(),
            target_class: "docker-ferrol-1-27-v2".into(),
            clusters: 6,
            done: 2,
            failing: 1,
            waves: vec![
                WaveStatus {
                    name: "canary".into(),
                    clusters: 1,
                    moved: 1,
                    done: 1,
                    finished_at: Some(chrono::Utc.timestamp_opt(1_800_000_000, 0).unwrap()),
                    ..WaveStatus::default()
                },
                WaveStatus {
                    name: "early".into(),
                    clusters: 2,
                    moved: 2,
                    done: 1,
                    failing: 1,
                    failing_clusters: vec![FailingCluster {
                        cluster: "ns/c2".into(),
                        reason: "its addons are not ready".into(),
                    }],
                    ..WaveStatus::default()
                },
            ],
            moves: vec![
                ClusterMove {
                    cluster: "ns/c1".into(),
                    outcome: outcome::MOVED.into(),
                    from: "docker-ferrol-1-27-v1".into(),
                    variables_dropped: vec!["oidcConfig.groupsPrefix".into()],
                    variables_changed: vec!["set nodes to 3 (was 2)".into()],
                    ..ClusterMove::default()
                },
                ClusterMove {
                    cluster: "ns/c9".into(),
                    outcome: outcome::REFUSED.into(),
                    from: "docker-ferrol-1-27-v1".into(),
                    reasons: vec!["variable x refused".into()],
                    ..ClusterMove::default()
                },
            ],
            ..ClusterStackRolloutStatus::default()
        });
        rollout
    }

    #[test]
    fn a_rollout_in_full_names_its_waves_failing_and_refused_clusters() {
        let text = describe(&rollout());
        assert!(
            text.starts_with(
                "rollout ns/to-v2: ClusterStack ferrol to v2 (docker-ferrol-1-27-v2): Paused, wave early\n"
            ),
            "{text}"
        );
        assert!(text.contains("clusters 6, done 2, failing 1\n"), "{text}");
        assert!(
            text.contains("early *  2         2      1     1        0"),
            "{text}"
        );
        assert!(
            text.contains("  ns/c2 (wave early): its addons are not ready"),
            "{text}"
        );
        assert!(
            text.contains("  ns/c9 (from docker-ferrol-1-27-v1): variable x refused"),
            "{text}"
        );
        assert!(
            text.ends_with(
                "variables changed by the moves:\n  ns/c1:\n    left out oidcConfig.groupsPrefix (the old \
                 class's default)\n    set nodes to 3 (was 2)\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn one_line_per_rollout_in_cso_status() {
        assert_eq!(summary_table(&[]), "");
        assert_eq!(
            summary_table(&[rollout()]),
            "ROLLOUT   TO                     PHASE   WAVE   DONE  FAILING  FAILING CLUSTERS\n\
             ns/to-v2  docker-ferrol-1-27-v2  Paused  early  2/6   1        ns/c2\n"
        );
    }
}
