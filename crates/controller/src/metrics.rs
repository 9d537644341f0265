//! Prometheus metrics: controller-runtime's reconcile metrics (same names and labels, so dashboards made for
//! the Go operator work) and the operator's own: objects applied, pruned and put back, per target cluster.

use std::{future::Future, sync::Mutex, time::Instant};

use cso_apply::ApplyReport;
use kube::runtime::controller::Action;
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

use crate::Error;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    controller: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    /// `management` or `workload`.
    target: String,
}

/// The operator's metrics, shared by all controllers.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    reconciles: Family<ReconcileLabels, Counter>,
    errors: Family<ControllerLabels, Counter>,
    durations: Family<ControllerLabels, Histogram>,
    applied: Family<TargetLabels, Counter>,
    pruned: Family<TargetLabels, Counter>,
    drift_corrected: Family<TargetLabels, Counter>,
}

fn reconcile_buckets() -> Histogram {
    // controller-runtime's buckets: 5 ms to about 40 s.
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
        1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0,
        40.0, 50.0, 60.0,
    ])
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let metrics = Metrics {
            registry: Mutex::default(),
            reconciles: Family::default(),
            errors: Family::default(),
            durations: Family::new_with_constructor(reconcile_buckets),
            applied: Family::default(),
            pruned: Family::default(),
            drift_corrected: Family::default(),
        };
        registry.register(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            metrics.reconciles.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_errors",
            "Total number of reconciliation errors per controller",
            metrics.errors.clone(),
        );
        registry.register(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            metrics.durations.clone(),
        );
        registry.register(
            "cso_objects_applied",
            "Objects server-side applied, per target cluster",
            metrics.applied.clone(),
        );
        registry.register(
            "cso_objects_pruned",
            "Objects deleted because a release no longer has them, per target cluster",
            metrics.pruned.clone(),
        );
        registry.register(
            "cso_objects_drift_corrected",
            "Objects put back after someone deleted or changed them, per target cluster",
            metrics.drift_corrected.clone(),
        );
        *metrics.registry.lock().unwrap_or_else(|p| p.into_inner()) = registry;
        metrics
    }
}

impl Metrics {
    /// The metrics in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &registry);
        text
    }

    /// Runs one reconcile of `controller` and records it.
    pub(crate) async fn reconcile(
        &self,
        controller: &str,
        reconcile: impl Future<Output = Result<Action, Error>>,
    ) -> Result<Action, Error> {
        let started = Instant::now();
        let result = reconcile.await;
        let controller_label = ControllerLabels {
            controller: controller.to_owned(),
        };
        self.durations
            .get_or_create(&controller_label)
            .observe(started.elapsed().as_secs_f64());
        let outcome = if result.is_ok() { "success" } else { "error" };
        self.reconciles
            .get_or_create(&ReconcileLabels {
                controller: controller.to_owned(),
                result: outcome.to_owned(),
            })
            .inc();
        if result.is_err() {
            self.errors.get_or_create(&controller_label).inc();
        }
        result
    }

    /// Records what an apply did on `target` (`management` or `workload`).
    pub(crate) fn applied(&self, target: &str, report: &ApplyReport) {
        let labels = TargetLabels {
            target: target.to_owned(),
        };
        self.applied.get_or_create(&labels).inc_by(report.applied as u64);
        self.pruned
            .get_or_create(&labels)
            .inc_by(report.pruned.len() as u64);
        self.drift_corrected
            .get_or_create(&labels)
            .inc_by(report.drift_corrected.len() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reconciles_are_counted_and_timed_by_controller_and_result() {
        let metrics = Metrics::default();
        let _ = metrics
            .reconcile("clusterstack", async { Ok(Action::await_change()) })
            .await;
        let _ = metrics
            .reconcile("clusterstack", async { Err(Error::Reported("x".into())) })
            .await;
        let text = metrics.encode();
        assert!(
            text.contains(
                r#"controller_runtime_reconcile_total{controller="clusterstack",result="success"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"controller_runtime_reconcile_total{controller="clusterstack",result="error"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"controller_runtime_reconcile_errors_total{controller="clusterstack"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"controller_runtime_reconcile_time_seconds_count{controller="clusterstack"} 2"#),
            "{text}"
        );
    }
}
