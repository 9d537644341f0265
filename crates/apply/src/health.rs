//! Health gates: whether what an addon applied is running, not only applied. [`assess`] judges one object
//! from its status (pure); [`check`] reads the objects of an inventory that have a rule and judges them.
//!
//! The rules follow what the kinds' controllers write and what `kubectl rollout status` and `kubectl wait`
//! read (k8s.io/kubectl `polymorphichelpers/rollout_status.go`):
//!
//! - every kind: an object being deleted is progressing; so is one without a status (its controller has not
//!   written one yet), and one with a field of the wrong type (a string where a number belongs): never a
//!   panic, never a guess.
//! - `apps` Deployment: its controller has observed the current generation; a `Progressing` condition with
//!   reason `ProgressDeadlineExceeded` is a failure; `updatedReplicas >= spec.replicas` (default 1), no old
//!   replicas left (`replicas <= updatedReplicas`), `availableReplicas >= updatedReplicas`. A paused
//!   rollout that is not done says so (one that is done is healthy); when it is not available the
//!   `Available` condition's reason and message are added.
//! - `apps` DaemonSet: generation observed; with the `RollingUpdate` strategy (the default)
//!   `updatedNumberScheduled >= desiredNumberScheduled` (`OnDelete` updates no pods by itself); then
//!   `numberAvailable >= desiredNumberScheduled`. A DaemonSet that no node needs (desired 0) is healthy.
//! - `apps` StatefulSet: generation observed (and observed at all); `readyReplicas >= spec.replicas`, and
//!   `availableReplicas` too when the status has it; with `RollingUpdate`, `updatedReplicas` reaches
//!   `spec.replicas - partition`, and when nothing is held back by a partition the controller has made
//!   the update revision the current one (`currentRevision == updateRevision`).
//! - `batch` Job: `Failed` (or `FailureTarget`, which precedes it) True is a failure, `Complete` True is
//!   healthy; otherwise progressing (`n of m completions`; suspended says so).
//! - `apiextensions.k8s.io` CustomResourceDefinition: `Established` True is healthy; `NamesAccepted` False
//!   is a failure (the names conflict with another kind's, and waiting does not change that).
//! - `apiregistration.k8s.io` APIService: `Available` True is healthy; otherwise progressing, with the
//!   condition's reason and message (`FailedDiscoveryCheck: ...`).
//! - core Pod: phase `Succeeded` or the `Ready` condition True is healthy; phase `Failed` is a failure;
//!   otherwise progressing, saying why when the status does (unschedulable, a container's waiting reason with
//!   its restarts, a container that restarted and its last exit code).
//! - a Deployment, DaemonSet or StatefulSet that does not run: [`check`] reads the pods its selector selects
//!   and adds why the first of them that says so does not run (`pod kube-system/metrics-server-…: not ready,
//!   phase Pending (container metrics-server: ImagePullBackOff: …)`), so a condition names the pod and the
//!   reason, not only a replica count.
//! - every other kind has no rule ([`assess`] answers `None`): it counts as healthy once applied.
//! - settling: a check given a settle time (while an addon waits after an apply) counts a Deployment,
//!   DaemonSet or StatefulSet its controller calls running only once every container of its live pods has
//!   been up that long ([`unsettled`]): a container that exits at start, in a pod without a readiness probe,
//!   is Ready for a moment after each start, and its workload available for that moment.
//!
//! Whatever is taken from a status into a message is cut to [`MAX_REASON_CHARS`] characters on one line, so
//! a hostile or broken controller cannot put a megabyte into a condition.

use std::{collections::HashSet, time::Duration};

use chrono::{DateTime, Utc};
use cso_api::common::Resource;
use futures::StreamExt as _;
use serde_json::Value;

use crate::{
    ClusterDiscovery,
    discovery::{ApiRef, DiscoveryError, GetObjectError},
    inventory::ObjectKey,
};

/// How long a reason or message taken from an object's status may be in a [`Health`] message (characters).
pub const MAX_REASON_CHARS: usize = 200;

/// How long a read error may be in a [`HealthReport`] (characters).
const MAX_ERROR_CHARS: usize = 300;

/// How many objects [`check`] reads at once.
pub const CONCURRENT_READS: usize = 8;

/// Whether an object is running as its kind's controller means it to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    Healthy,
    /// Not yet, and why (short, human, from the object's status).
    Progressing(String),
    /// It will not get there by waiting, and why.
    Failed(String),
}

impl Health {
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy)
    }

    pub fn is_failed(&self) -> bool {
        matches!(self, Health::Failed(_))
    }

    /// The same finding with `detail` added to why it is not healthy (`<why>; <detail>`); healthy stays so.
    fn with_detail(self, detail: &str) -> Self {
        match self {
            Health::Healthy => Health::Healthy,
            Health::Progressing(why) => Health::Progressing(format!("{why}; {detail}")),
            Health::Failed(why) => Health::Failed(format!("{why}; {detail}")),
        }
    }

    /// Why it is not healthy; `None` when it is.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Health::Healthy => None,
            Health::Progressing(why) | Health::Failed(why) => Some(why),
        }
    }
}

impl std::fmt::Display for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason().unwrap_or("healthy"))
    }
}

/// A rule: the health of an object of its kind whose status is an object with something in it. `Err` is a
/// field that cannot be read (the object is progressing, and that is why).
type Rule = fn(&Value) -> Result<Health, String>;

fn rule(group: &str, kind: &str) -> Option<Rule> {
    Some(match (group, kind) {
        ("apps", "Deployment") => deployment,
        ("apps", "DaemonSet") => daemon_set,
        ("apps", "StatefulSet") => stateful_set,
        ("batch", "Job") => job,
        ("apiextensions.k8s.io", "CustomResourceDefinition") => custom_resource_definition,
        ("apiregistration.k8s.io", "APIService") => api_service,
        ("", "Pod") => pod,
        _ => return None,
    })
}

/// Whether objects of `kind` in API `group` (empty for the core group) have a health rule; objects of other
/// kinds count as healthy once applied.
pub fn has_rule(group: &str, kind: &str) -> bool {
    rule(group, kind).is_some()
}

/// The health of `object` (as the API server returns it, with `apiVersion` and `kind`); `None` for kinds
/// without a rule.
pub fn assess(object: &Value) -> Option<Health> {
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let group = api_version.rsplit_once('/').map_or("", |(group, _)| group);
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default();
    assess_as(group, kind, object)
}

/// The health of `object` judged as a `kind` of API `group`, whatever its own `apiVersion` and `kind` say;
/// `None` for kinds without a rule.
pub fn assess_as(group: &str, kind: &str, object: &Value) -> Option<Health> {
    let rule = rule(group, kind)?;
    let skipped = object
        .pointer(&format!(
            "/metadata/annotations/{}",
            SKIP_ANNOTATION.replace('/', "~1")
        ))
        .and_then(Value::as_str)
        == Some("true");
    if skipped {
        return None;
    }
    if object
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|deleted| !deleted.is_null())
    {
        return Some(Health::Progressing("being deleted".into()));
    }
    Some(match object.get("status") {
        None | Some(Value::Null) => Health::Progressing(NO_STATUS.into()),
        Some(Value::Object(status)) if status.is_empty() => Health::Progressing(NO_STATUS.into()),
        Some(Value::Object(_)) => rule(object).unwrap_or_else(Health::Progressing),
        Some(other) => Health::Progressing(format!("status is {}, not an object", preview(other))),
    })
}

const NO_STATUS: &str = "no status yet";

/// An object annotated `clusterstack.x-k8s.io/skip-health-check: "true"` is not judged: it counts as running
/// once applied (say, an APIService a NetworkPolicy keeps the API server from reaching, which would hold
/// every upgrade for the whole wait).
pub const SKIP_ANNOTATION: &str = "clusterstack.x-k8s.io/skip-health-check";

fn deployment(object: &Value) -> Result<Health, String> {
    if let Some(waiting) = unobserved(object)? {
        return Ok(Health::Progressing(waiting));
    }
    let wanted = int(object, "spec.replicas", 1)?;
    let replicas = int(object, "status.replicas", 0)?;
    let updated = int(object, "status.updatedReplicas", 0)?;
    let available = int(object, "status.availableReplicas", 0)?;
    let paused = boolean(object, "spec.paused")?;
    let available_condition = condition(object, "Available")?;
    // The controller sets this reason only for the current generation's rollout (checked above).
    if let Some(progressing) = condition(object, "Progressing")?
        && progressing.reason == "ProgressDeadlineExceeded"
    {
        return Ok(Health::Failed(format!(
            "progress deadline exceeded, {available} of {wanted} replicas available{}",
            in_parentheses(progressing.describe())
        )));
    }
    let waiting = if updated < wanted {
        format!("{updated} of {wanted} replicas updated")
    } else if replicas > updated {
        format!("{} old replicas pending termination", replicas - updated)
    } else if available < updated {
        format!("{available} of {updated} replicas available")
    } else {
        return Ok(Health::Healthy);
    };
    let waiting = if paused {
        format!("rollout paused, {waiting}")
    } else {
        waiting
    };
    let unavailable = available_condition
        .filter(|available| available.status != "True")
        .and_then(|available| available.describe());
    Ok(Health::Progressing(format!(
        "{waiting}{}",
        in_parentheses(unavailable)
    )))
}

fn daemon_set(object: &Value) -> Result<Health, String> {
    if let Some(waiting) = unobserved(object)? {
        return Ok(Health::Progressing(waiting));
    }
    let strategy = text(object, "spec.updateStrategy.type")?.unwrap_or("RollingUpdate");
    let desired = int(object, "status.desiredNumberScheduled", 0)?;
    let updated = int(object, "status.updatedNumberScheduled", 0)?;
    let available = int(object, "status.numberAvailable", 0)?;
    Ok(if strategy == "RollingUpdate" && updated < desired {
        Health::Progressing(format!("{updated} of {desired} pods updated"))
    } else if available < desired {
        Health::Progressing(format!("{available} of {desired} pods available"))
    } else {
        Health::Healthy
    })
}

fn stateful_set(object: &Value) -> Result<Health, String> {
    if let Some(waiting) = unobserved(object)? {
        return Ok(Health::Progressing(waiting));
    }
    let wanted = int(object, "spec.replicas", 1)?;
    let ready = int(object, "status.readyReplicas", 0)?;
    if ready < wanted {
        return Ok(Health::Progressing(format!("{ready} of {wanted} pods ready")));
    }
    if let Some(available) = optional_int(object, "status.availableReplicas")?
        && available < wanted
    {
        return Ok(Health::Progressing(format!(
            "{available} of {wanted} pods available"
        )));
    }
    if text(object, "spec.updateStrategy.type")?.unwrap_or("RollingUpdate") != "RollingUpdate" {
        // OnDelete: pods are updated when someone deletes them; there is no rollout to wait for.
        return Ok(Health::Healthy);
    }
    let partition = int(object, "spec.updateStrategy.rollingUpdate.partition", 0)?.clamp(0, wanted.max(0));
    let to_update = wanted - partition;
    let updated = int(object, "status.updatedReplicas", 0)?;
    if updated < to_update {
        let held = if partition > 0 {
            format!(" (partition {partition})")
        } else {
            String::new()
        };
        return Ok(Health::Progressing(format!(
            "{updated} of {to_update} pods updated{held}"
        )));
    }
    if partition == 0 {
        let current = text(object, "status.currentRevision")?;
        let update = text(object, "status.updateRevision")?;
        if let (Some(current), Some(update)) = (current, update)
            && current != update
        {
            return Ok(Health::Progressing(format!(
                "rolling update to revision {} not complete (current revision {})",
                clip(update, MAX_REASON_CHARS),
                clip(current, MAX_REASON_CHARS)
            )));
        }
    }
    Ok(Health::Healthy)
}

fn job(object: &Value) -> Result<Health, String> {
    for failure in ["Failed", "FailureTarget"] {
        if let Some(failed) = condition(object, failure)?
            && failed.status == "True"
        {
            return Ok(Health::Failed(
                failed.describe().unwrap_or_else(|| "the job failed".into()),
            ));
        }
    }
    if condition(object, "Complete")?.is_some_and(|complete| complete.status == "True") {
        return Ok(Health::Healthy);
    }
    let completions = int(object, "spec.completions", 1)?;
    let succeeded = int(object, "status.succeeded", 0)?;
    let active = int(object, "status.active", 0)?;
    let failed = int(object, "status.failed", 0)?;
    let suspended = boolean(object, "spec.suspend")?
        || condition(object, "Suspended")?.is_some_and(|suspended| suspended.status == "True");
    let mut message = format!("{succeeded} of {completions} completions");
    let pods: Vec<String> = [(active, "active"), (failed, "failed")]
        .into_iter()
        .filter(|(count, _)| *count > 0)
        .map(|(count, what)| format!("{count} {what}"))
        .collect();
    if !pods.is_empty() {
        message = format!("{message} ({})", pods.join(", "));
    }
    if suspended {
        message = format!("suspended, {message}");
    }
    Ok(Health::Progressing(message))
}

fn custom_resource_definition(object: &Value) -> Result<Health, String> {
    if let Some(names) = condition(object, "NamesAccepted")?
        && names.status == "False"
    {
        return Ok(Health::Failed(format!(
            "names not accepted{}",
            in_parentheses(names.describe())
        )));
    }
    Ok(match condition(object, "Established")? {
        Some(established) if established.status == "True" => Health::Healthy,
        established => Health::Progressing(format!(
            "not established yet{}",
            in_parentheses(established.and_then(|c| c.describe()))
        )),
    })
}

fn api_service(object: &Value) -> Result<Health, String> {
    Ok(match condition(object, "Available")? {
        Some(available) if available.status == "True" => Health::Healthy,
        available => Health::Progressing(format!(
            "not available{}",
            in_parentheses(available.and_then(|c| c.describe()))
        )),
    })
}

fn pod(object: &Value) -> Result<Health, String> {
    let phase = text(object, "status.phase")?.unwrap_or_default();
    match phase {
        "Succeeded" => return Ok(Health::Healthy),
        "Failed" => {
            let why = describe(
                text(object, "status.reason")?.unwrap_or_default(),
                text(object, "status.message")?.unwrap_or_default(),
            );
            return Ok(Health::Failed(format!("phase Failed{}", in_parentheses(why))));
        }
        _ => {}
    }
    if condition(object, "Ready")?.is_some_and(|ready| ready.status == "True") {
        return Ok(Health::Healthy);
    }
    let why = match condition(object, "PodScheduled")? {
        Some(scheduled) if scheduled.status == "False" => scheduled.describe(),
        _ => container_trouble(object).or_else(|| {
            condition(object, "Ready")
                .ok()
                .flatten()
                .and_then(|c| c.describe())
        }),
    };
    let phase = if phase.is_empty() {
        String::new()
    } else {
        format!(", phase {}", clip(phase, MAX_REASON_CHARS))
    };
    Ok(Health::Progressing(format!(
        "not ready{phase}{}",
        in_parentheses(why)
    )))
}

/// Why a container of the pod does not run: `container <name>: <reason>: <message>` of the first (init)
/// container that waits with a reason, with its restarts when it has any (`, 4 restarts`; for
/// `CrashLoopBackOff` without the kubelet's message, which only repeats the back-off and the pod); else, for the
/// first one that is not ready and has restarted, `container <name>: restarted 4 times, last exit code 1
/// (Error)`. Init containers that finished with exit code 0 and containers that are ready say nothing.
fn container_trouble(pod: &Value) -> Option<String> {
    let containers: Vec<&Value> = ["initContainerStatuses", "containerStatuses"]
        .into_iter()
        .filter_map(|list| pod.get("status")?.get(list)?.as_array())
        .flatten()
        .filter(|c| c.get("ready").and_then(Value::as_bool) != Some(true))
        .filter(|c| c.pointer("/state/terminated/exitCode").and_then(Value::as_i64) != Some(0))
        .collect();
    let name = |container: &Value| {
        clip(
            container.get("name").and_then(Value::as_str).unwrap_or("?"),
            MAX_REASON_CHARS,
        )
    };
    let restarts = |container: &Value| container.get("restartCount").and_then(Value::as_i64).unwrap_or(0);
    let waiting = containers.iter().find_map(|container| {
        let waiting = container.get("state")?.get("waiting")?;
        let reason = waiting.get("reason").and_then(Value::as_str).unwrap_or_default();
        let message = match reason {
            "CrashLoopBackOff" => "",
            _ => waiting.get("message").and_then(Value::as_str).unwrap_or_default(),
        };
        let why = describe(reason, message)?;
        Some(match restarts(container) {
            0 => format!("container {}: {why}", name(container)),
            1 => format!("container {}: {why}, 1 restart", name(container)),
            n => format!("container {}: {why}, {n} restarts", name(container)),
        })
    });
    waiting.or_else(|| {
        containers.iter().find(|c| restarts(c) > 0).map(|container| {
            let last = container.get("lastState").and_then(|s| s.get("terminated"));
            let code = last.and_then(|t| t.get("exitCode")).and_then(Value::as_i64);
            let reason = last
                .and_then(|t| t.get("reason"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            let exit = code.map_or_else(String::new, |code| {
                format!(", last exit code {code}{}", in_parentheses(describe(reason, "")))
            });
            let times = match restarts(container) {
                1 => "once".to_owned(),
                n => format!("{n} times"),
            };
            format!("container {}: restarted {times}{exit}", name(container))
        })
    })
}

/// Whether objects of the kind run pods that [`check`] looks at when the object does not run.
fn runs_pods(group: &str, kind: &str) -> bool {
    group == "apps" && matches!(kind, "Deployment" | "DaemonSet" | "StatefulSet")
}

/// The label selector of a workload (`spec.selector`) as a query (`app=web,tier in (a,b),!legacy`); `None`
/// when it has none, selects everything, or has something a query cannot say.
pub fn selector_query(workload: &Value) -> Option<String> {
    let selector = workload.get("spec")?.get("selector")?;
    let mut terms: Vec<String> = Vec::new();
    if let Some(labels) = selector.get("matchLabels").and_then(Value::as_object) {
        for (key, value) in labels {
            terms.push(format!("{key}={}", value.as_str()?));
        }
    }
    for expression in selector
        .get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let key = expression.get("key")?.as_str()?;
        let values = || -> Option<String> {
            let values: Option<Vec<&str>> = expression
                .get("values")?
                .as_array()?
                .iter()
                .map(Value::as_str)
                .collect();
            Some(values?.join(","))
        };
        terms.push(match expression.get("operator")?.as_str()? {
            "In" => format!("{key} in ({})", values()?),
            "NotIn" => format!("{key} notin ({})", values()?),
            "Exists" => key.to_owned(),
            "DoesNotExist" => format!("!{key}"),
            _ => return None,
        });
    }
    (!terms.is_empty()).then(|| terms.join(","))
}

/// Why the workload's pods do not run, from `pods` (the workload's, any order): `pod <ns>/<name>: <why>` of the
/// pod that says most plainly why it does not run (a container waiting with a reason other than being created,
/// then one unschedulable or restarting, then one being created; among equals the first by name), then `and N
/// more pods that do not run` for the others that say why. Finished pods (an evicted one, kept until the
/// garbage collector takes it, counts for no replica) and pods being deleted are left out. `None` when no pod
/// says why.
pub fn pod_trouble(pods: &[Value]) -> Option<String> {
    let mut troubled: Vec<(u8, String, String)> = pods
        .iter()
        .filter_map(|pod| {
            let (rank, why) = why_pod_does_not_run(pod)?;
            Some((rank, pod_name(pod), why))
        })
        .collect();
    troubled.sort();
    let (_, name, why) = troubled.first()?;
    let more = match troubled.len() - 1 {
        0 => String::new(),
        1 => ", and 1 more pod that does not run".into(),
        n => format!(", and {n} more pods that do not run"),
    };
    Some(format!("pod {name}: {}{more}", clip(why, MAX_REASON_CHARS)))
}

/// Why a pod of a workload does not run, with a rank (lower: plainer, see [`pod_trouble`]); `None` for a pod
/// that is ready, finished or being deleted, or that says nothing.
fn why_pod_does_not_run(pod: &Value) -> Option<(u8, String)> {
    if !is_live(pod)
        || condition(pod, "Ready")
            .ok()
            .flatten()
            .is_some_and(|c| c.status == "True")
    {
        return None;
    }
    if let Some(scheduled) = condition(pod, "PodScheduled")
        .ok()
        .flatten()
        .filter(|c| c.status == "False")
    {
        return Some((1, scheduled.describe()?));
    }
    let why = container_trouble(pod)?;
    let being_created = ["ContainerCreating", "PodInitializing"]
        .iter()
        .any(|reason| why.contains(&format!(": {reason}")));
    let restarting = why.contains(": restarted ");
    let rank = if being_created {
        2
    } else if restarting {
        1
    } else {
        0
    };
    Some((rank, why))
}

/// The pods `workload` selects in `namespace` (at most [`MAX_PODS_LISTED`]), read from its cluster; `None` when
/// it has no selector or they cannot be read (the workload's own finding stands).
async fn pods_of(
    discovery: &ClusterDiscovery,
    namespace: Option<&str>,
    workload: &Value,
) -> Option<Vec<Value>> {
    let query = selector_query(workload)?;
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(discovery.client(), namespace?);
    let list = pods
        .list(
            &kube::api::ListParams::default()
                .labels(&query)
                .limit(MAX_PODS_LISTED),
        )
        .await
        .ok()?;
    Some(
        list.items
            .iter()
            .filter_map(|pod| serde_json::to_value(pod).ok())
            .collect(),
    )
}

/// Which of `pods` (a running workload's, any order) has not been up for `settle` at `now`: `pod <ns>/<name>:
/// container <c> up 3s of 15s` for the container that started last, with its restarts when it has any, and
/// `container <c> not running (<reason>)` for a live pod's container that is not running at all. Finished
/// pods and pods being deleted are left out (they count for no replica); a start time that cannot be read
/// counts as settled (never a guess). `None`: every container has been up for `settle`.
pub fn unsettled(pods: &[Value], now: DateTime<Utc>, settle: Duration) -> Option<String> {
    let settle_secs = i64::try_from(settle.as_secs()).unwrap_or(i64::MAX);
    let mut youngest: Option<(i64, String)> = None;
    for pod in pods.iter().filter(|pod| is_live(pod)) {
        let pod_name = pod_name(pod);
        let containers = field(pod, "status.containerStatuses")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for container in containers {
            let name = container.get("name").and_then(Value::as_str).unwrap_or("?");
            let restarts = container.get("restartCount").and_then(Value::as_i64).unwrap_or(0);
            let restarted = match restarts {
                0 => String::new(),
                1 => ", restarted once".to_owned(),
                n => format!(", restarted {n} times"),
            };
            let state = container.get("state");
            let Some(running) = state.and_then(|state| state.get("running")) else {
                let why = state
                    .and_then(Value::as_object)
                    .and_then(|state| state.values().find_map(|s| s.get("reason")?.as_str()))
                    .unwrap_or("no state");
                return Some(format!(
                    "pod {pod_name}: container {name} not running ({}){restarted}",
                    clip(why, MAX_REASON_CHARS)
                ));
            };
            let Some(started) = running
                .get("startedAt")
                .and_then(Value::as_str)
                .and_then(|at| DateTime::parse_from_rfc3339(at).ok())
            else {
                continue;
            };
            let up = (now - started.with_timezone(&Utc)).num_seconds().max(0);
            if up < settle_secs && youngest.as_ref().is_none_or(|(least, _)| up < *least) {
                youngest = Some((
                    up,
                    format!("pod {pod_name}: container {name} up {up}s of {settle_secs}s{restarted}"),
                ));
            }
        }
    }
    youngest.map(|(_, why)| why)
}

/// `namespace/name` of `pod`.
fn pod_name(pod: &Value) -> String {
    let meta = |field: &str| {
        text(pod, &format!("metadata.{field}"))
            .ok()
            .flatten()
            .unwrap_or_default()
    };
    format!("{}/{}", meta("namespace"), meta("name"))
}

/// Whether `pod` counts for its workload: not finished and not being deleted.
fn is_live(pod: &Value) -> bool {
    let phase = pod
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or_default();
    !matches!(phase, "Succeeded" | "Failed")
        && pod
            .pointer("/metadata/deletionTimestamp")
            .is_none_or(Value::is_null)
}

/// How many of a workload's pods [`check`] reads to say why it does not run.
const MAX_PODS_LISTED: u32 = 100;

/// Why the controller's status does not describe the current spec yet, if it does not:
/// `status.observedGeneration` is behind `metadata.generation` (or not written at all).
fn unobserved(object: &Value) -> Result<Option<String>, String> {
    // The API server sets a generation of at least 1; an object without one is judged as if it had 1.
    let generation = int(object, "metadata.generation", 1)?.max(1);
    Ok(match optional_int(object, "status.observedGeneration")? {
        None => Some("not observed by its controller yet".into()),
        Some(observed) if observed < generation => Some(format!(
            "generation {generation} not observed by its controller yet (observed {observed})"
        )),
        Some(_) => None,
    })
}

/// One condition of `status.conditions`, its fields as written ("" when missing or not a string).
#[derive(Debug)]
struct Condition<'a> {
    status: &'a str,
    reason: &'a str,
    message: &'a str,
}

impl Condition<'_> {
    /// `Reason: message`, cut to length; `None` when the condition gives neither.
    fn describe(&self) -> Option<String> {
        describe(self.reason, self.message)
    }
}

/// The condition of type `kind`; `None` when the status has none; `Err` when `status.conditions` is not a
/// list.
fn condition<'a>(object: &'a Value, kind: &str) -> Result<Option<Condition<'a>>, String> {
    let conditions = match object.get("status").and_then(|status| status.get("conditions")) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(conditions)) => conditions,
        Some(other) => return Err(format!("status.conditions is {}, not a list", preview(other))),
    };
    let field =
        |condition: &'a Value, name: &str| condition.get(name).and_then(Value::as_str).unwrap_or_default();
    Ok(conditions
        .iter()
        .find(|condition| condition.get("type").and_then(Value::as_str) == Some(kind))
        .map(|condition| Condition {
            status: field(condition, "status"),
            reason: field(condition, "reason"),
            message: field(condition, "message"),
        }))
}

fn describe(reason: &str, message: &str) -> Option<String> {
    let reason = clip(reason, MAX_REASON_CHARS);
    let message = clip(message, MAX_REASON_CHARS);
    match (reason.is_empty(), message.is_empty()) {
        (true, true) => None,
        (false, true) => Some(reason),
        (true, false) => Some(message),
        (false, false) => Some(format!("{reason}: {message}")),
    }
}

fn in_parentheses(why: Option<String>) -> String {
    why.map(|why| format!(" ({why})")).unwrap_or_default()
}

/// The value at the dotted `path`; `None` when a part of it is missing or null.
fn field<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(object, |value, part| value.get(part))
        .filter(|value| !value.is_null())
}

fn optional_int(object: &Value, path: &str) -> Result<Option<i64>, String> {
    match field(object, path) {
        None => Ok(None),
        Some(Value::Number(number)) if number.is_i64() => Ok(number.as_i64()),
        Some(other) => Err(format!("{path} is {}, not an integer", preview(other))),
    }
}

fn int(object: &Value, path: &str, default: i64) -> Result<i64, String> {
    Ok(optional_int(object, path)?.unwrap_or(default))
}

fn boolean(object: &Value, path: &str) -> Result<bool, String> {
    match field(object, path) {
        None => Ok(false),
        Some(Value::Bool(value)) => Ok(*value),
        Some(other) => Err(format!("{path} is {}, not a boolean", preview(other))),
    }
}

fn text<'a>(object: &'a Value, path: &str) -> Result<Option<&'a str>, String> {
    match field(object, path) {
        None => Ok(None),
        Some(Value::String(value)) => Ok(Some(value)),
        Some(other) => Err(format!("{path} is {}, not a string", preview(other))),
    }
}

/// A value found where another type belongs, as JSON, cut short.
fn preview(value: &Value) -> String {
    match value {
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
        scalar => clip(&scalar.to_string(), 40),
    }
}

/// `text` on one line (runs of whitespace and control characters become one space), cut to `max`
/// characters with `…` when longer.
fn clip(text: &str, max: usize) -> String {
    let mut clipped = String::new();
    let mut count = 0;
    let words = text
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|word| !word.is_empty());
    for word in words {
        for c in (count > 0).then_some(' ').into_iter().chain(word.chars()) {
            if count == max {
                clipped.push('…');
                return clipped;
            }
            clipped.push(c);
            count += 1;
        }
    }
    clipped
}

/// An object of the inventory that is not healthy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectHealth {
    pub key: ObjectKey,
    /// Never [`Health::Healthy`].
    pub health: Health,
    /// Where its entry is in the inventory [`check`] was given.
    pub position: usize,
}

/// An object of the inventory that could not be read (the caller decides what that means).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadError {
    pub key: ObjectKey,
    /// The error, cut short.
    pub error: String,
    /// Where its entry is in the inventory [`check`] was given.
    pub position: usize,
}

/// `Kind namespace/name`, or `Kind name` for a cluster-scoped object.
fn named(key: &ObjectKey) -> String {
    match key.namespace.as_str() {
        "" => format!("{} {}", key.kind, key.name),
        namespace => format!("{} {namespace}/{}", key.kind, key.name),
    }
}

/// `Deployment kube-system/metrics-server: 0 of 1 replicas available`.
impl std::fmt::Display for ObjectHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", named(&self.key), self.health)
    }
}

/// `Deployment kube-system/metrics-server: cannot be read: <error>`.
impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: cannot be read: {}", named(&self.key), self.error)
    }
}

/// The health of the objects of an inventory that have a rule ([`check`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealthReport {
    /// How many objects were looked at: the inventory's entries with a rule, each object once.
    pub checked: usize,
    /// The objects that are not healthy, in the inventory's order.
    pub unhealthy: Vec<ObjectHealth>,
    /// The objects that could not be read, in the inventory's order.
    pub errors: Vec<ReadError>,
}

impl HealthReport {
    /// Every object checked is healthy (and all of them could be read).
    pub fn is_healthy(&self) -> bool {
        self.unhealthy.is_empty() && self.errors.is_empty()
    }

    /// Some object has failed (waiting will not make it healthy).
    pub fn has_failed(&self) -> bool {
        self.unhealthy.iter().any(|object| object.health.is_failed())
    }

    /// The objects that are not healthy or could not be read, in the inventory's order, at most `limit` of
    /// them, `; `-separated, then `and N more`: `Deployment kube-system/metrics-server: 0 of 1 replicas
    /// available; DaemonSet kube-system/cilium: 1 of 3 pods available; and 2 more`. Empty when healthy.
    pub fn summary(&self, limit: usize) -> String {
        let mut findings: Vec<(usize, String)> = self
            .unhealthy
            .iter()
            .map(|object| (object.position, object.to_string()))
            .chain(
                self.errors
                    .iter()
                    .map(|error| (error.position, error.to_string())),
            )
            .collect();
        findings.sort_by_key(|(position, _)| *position);
        let more = findings.len().saturating_sub(limit);
        let mut parts: Vec<String> = findings
            .into_iter()
            .take(limit)
            .map(|(_, finding)| finding)
            .collect();
        if more > 0 {
            parts.push(format!("and {more} more"));
        }
        parts.join("; ")
    }
}

/// Reads the objects of `resources` (an inventory, as the engine records it) whose kinds have a rule, at
/// most [`CONCURRENT_READS`] at once, and judges them. An object that is not there, or of a kind the cluster
/// does not serve, is progressing; one that cannot be read is in [`HealthReport::errors`]. An object the
/// inventory names twice is read once. `settle`: how long a running workload's containers must have been up
/// to count (see [`unsettled`]); zero counts a workload as its controller does.
pub async fn check(discovery: &ClusterDiscovery, resources: &[Resource], settle: Duration) -> HealthReport {
    let mut seen = HashSet::new();
    // Owned entries: the reads' futures borrow nothing but the discovery (a future that borrows its
    // argument is not `Send` for every lifetime, which a caller spawned on the runtime needs).
    let wanted: Vec<(usize, Resource)> = resources
        .iter()
        .enumerate()
        .filter(|(_, resource)| has_rule(&resource.group, &resource.kind))
        .filter(|(_, resource)| seen.insert(ObjectKey::of(resource)))
        .map(|(position, resource)| (position, resource.clone()))
        .collect();
    let outcomes: Vec<(usize, ObjectKey, Result<Health, String>)> =
        futures::stream::iter(wanted.into_iter().map(|(position, resource)| async move {
            let outcome = read(discovery, &resource, settle).await;
            (position, ObjectKey::of(&resource), outcome)
        }))
        .buffered(CONCURRENT_READS)
        .collect()
        .await;
    let mut report = HealthReport {
        checked: outcomes.len(),
        ..HealthReport::default()
    };
    for (position, key, outcome) in outcomes {
        match outcome {
            Ok(Health::Healthy) => {}
            Ok(health) => report.unhealthy.push(ObjectHealth {
                key,
                health,
                position,
            }),
            Err(error) => report.errors.push(ReadError { key, error, position }),
        }
    }
    report
}

/// Reads one inventory entry whose kind has a rule and judges it; `Err` is a read that failed.
async fn read(discovery: &ClusterDiscovery, resource: &Resource, settle: Duration) -> Result<Health, String> {
    let api_version = match (resource.group.as_str(), resource.version.as_str()) {
        (_, "") => None,
        ("", version) => Some(version.to_owned()),
        (group, version) => Some(format!("{group}/{version}")),
    };
    let api = match &api_version {
        Some(api_version) => ApiRef::Version(api_version),
        // An entry without a version (written by hand, or by an older operator): the preferred one.
        None => ApiRef::Group(&resource.group),
    };
    let namespace = (!resource.namespace.is_empty()).then_some(resource.namespace.as_str());
    let object = match discovery
        .get_object(api, &resource.kind, namespace, &resource.name)
        .await
    {
        Ok(Some(object)) => object,
        // A finished Job or Pod may be gone by design (`ttlSecondsAfterFinished`, pod garbage collection): it
        // ran. Anything else missing does not run.
        Ok(None) if matches!(resource.kind.as_str(), "Job" | "Pod") => return Ok(Health::Healthy),
        Ok(None) => return Ok(Health::Progressing("not found".into())),
        Err(GetObjectError::Discovery(unknown @ DiscoveryError::UnknownKind(_))) => {
            return Ok(Health::Progressing(clip(&unknown.to_string(), MAX_ERROR_CHARS)));
        }
        // The kube error alone: the report names the object.
        Err(GetObjectError::Read { error, .. }) => return Err(clip(&error.to_string(), MAX_ERROR_CHARS)),
        Err(error @ GetObjectError::Discovery(_)) => return Err(clip(&error.to_string(), MAX_ERROR_CHARS)),
    };
    let object = serde_json::to_value(&object).map_err(|e| clip(&e.to_string(), MAX_ERROR_CHARS))?;
    let health = assess_as(&resource.group, &resource.kind, &object).unwrap_or(Health::Healthy);
    // A workload that does not run: why its pods do not, when one of them says so.
    // Not while its controller has yet to see the current spec (right after every apply): its pods are not
    // what the finding is about.
    let unobserved = unobserved(&object).ok().flatten().is_some();
    if unobserved || !runs_pods(&resource.group, &resource.kind) {
        return Ok(health);
    }
    match health {
        Health::Healthy if !settle.is_zero() => {
            let pods = pods_of(discovery, namespace, &object).await.unwrap_or_default();
            Ok(match unsettled(&pods, Utc::now(), settle) {
                Some(why) => Health::Progressing(format!("running, not yet settled: {why}")),
                None => Health::Healthy,
            })
        }
        Health::Healthy => Ok(Health::Healthy),
        not_running => {
            let pods = pods_of(discovery, namespace, &object).await.unwrap_or_default();
            Ok(match pod_trouble(&pods) {
                Some(trouble) => not_running.with_detail(&trouble),
                None => not_running,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;
    use serde_json::json;

    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Is {
        Healthy,
        Progressing,
        Failed,
    }

    /// `object` is judged `is`, and its message has `says` in it.
    fn judged(object: &Value, is: Is, says: &str) {
        let health = assess(object).expect("a kind with a rule");
        let found = match &health {
            Health::Healthy => Is::Healthy,
            Health::Progressing(_) => Is::Progressing,
            Health::Failed(_) => Is::Failed,
        };
        assert_eq!(found, is, "{health:?}");
        assert!(
            health.to_string().contains(says),
            "{health:?} does not say {says:?}"
        );
    }

    fn object(api_version: &str, kind: &str, spec: Value, status: Option<Value>) -> Value {
        let mut object = json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {"name": "x", "namespace": "kube-system", "generation": 2},
            "spec": spec,
        });
        if let Some(status) = status {
            object["status"] = status;
        }
        object
    }

    fn deployment(spec: Value, status: Option<Value>) -> Value {
        object("apps/v1", "Deployment", spec, status)
    }

    fn conditions(conditions: &[(&str, &str, &str, &str)]) -> Value {
        conditions
            .iter()
            .map(|(kind, status, reason, message)| {
                json!({"type": kind, "status": status, "reason": reason, "message": message,
                       "lastTransitionTime": "2026-11-02T10:00:00Z"})
            })
            .collect()
    }

    fn unavailable() -> Value {
        conditions(&[
            (
                "Available",
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.",
            ),
            (
                "Progressing",
                "True",
                "ReplicaSetUpdated",
                "ReplicaSet \"metrics-server-6d94bc8694\" is progressing.",
            ),
        ])
    }

    #[rstest]
    #[case::no_status(deployment(json!({"replicas": 2}), None), Is::Progressing, "no status yet")]
    #[case::empty_status(deployment(json!({"replicas": 2}), Some(json!({}))), Is::Progressing, "no status yet")]
    #[case::not_observed(
        deployment(json!({"replicas": 2}), Some(json!({"observedGeneration": 1, "replicas": 2,
            "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2}))),
        Is::Progressing, "generation 2 not observed by its controller yet (observed 1)")]
    #[case::no_observed_generation(
        deployment(json!({"replicas": 1}), Some(json!({"replicas": 1}))),
        Is::Progressing, "not observed by its controller yet")]
    #[case::unavailable(
        deployment(json!({"replicas": 2}), Some(json!({"observedGeneration": 2, "replicas": 2,
            "updatedReplicas": 2, "unavailableReplicas": 2, "conditions": unavailable()}))),
        Is::Progressing,
        "0 of 2 replicas available (MinimumReplicasUnavailable: Deployment does not have minimum availability.)")]
    #[case::not_updated(
        deployment(json!({"replicas": 3}), Some(json!({"observedGeneration": 2, "replicas": 3,
            "updatedReplicas": 1, "availableReplicas": 3, "conditions": conditions(&[
                ("Available", "True", "MinimumReplicasAvailable", "Deployment has minimum availability.")])}))),
        Is::Progressing, "1 of 3 replicas updated")]
    #[case::old_replicas_left(
        deployment(json!({"replicas": 2}), Some(json!({"observedGeneration": 2, "replicas": 3,
            "updatedReplicas": 2, "availableReplicas": 2}))),
        Is::Progressing, "1 old replicas pending termination")]
    #[case::default_one_replica(
        deployment(json!({}), Some(json!({"observedGeneration": 2}))),
        Is::Progressing, "0 of 1 replicas updated")]
    #[case::deadline_exceeded(
        deployment(json!({"replicas": 2}), Some(json!({"observedGeneration": 2, "replicas": 2,
            "updatedReplicas": 2, "unavailableReplicas": 2, "conditions": conditions(&[
                ("Available", "False", "MinimumReplicasUnavailable", "Deployment does not have minimum availability."),
                ("Progressing", "False", "ProgressDeadlineExceeded",
                 "ReplicaSet \"metrics-server-6d94bc8694\" has timed out progressing.")])}))),
        Is::Failed,
        "progress deadline exceeded, 0 of 2 replicas available (ProgressDeadlineExceeded: ReplicaSet")]
    #[case::paused(
        deployment(json!({"replicas": 2, "paused": true}), Some(json!({"observedGeneration": 2, "replicas": 2,
            "updatedReplicas": 0, "availableReplicas": 2, "conditions": conditions(&[
                ("Progressing", "Unknown", "DeploymentPaused", "Deployment is paused")])}))),
        Is::Progressing, "rollout paused, 0 of 2 replicas updated")]
    #[case::paused_but_rolled_out(
        deployment(json!({"replicas": 1, "paused": true}), Some(json!({"observedGeneration": 2, "replicas": 1,
            "updatedReplicas": 1, "availableReplicas": 1}))),
        Is::Healthy, "healthy")]
    #[case::available(
        deployment(json!({"replicas": 2}), Some(json!({"observedGeneration": 2, "replicas": 2,
            "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2, "conditions": conditions(&[
                ("Available", "True", "MinimumReplicasAvailable", "Deployment has minimum availability."),
                ("Progressing", "True", "NewReplicaSetAvailable", "ReplicaSet \"x\" has successfully progressed.")])}))),
        Is::Healthy, "healthy")]
    #[case::scaled_to_zero(
        deployment(json!({"replicas": 0}), Some(json!({"observedGeneration": 2}))),
        Is::Healthy, "healthy")]
    #[case::replicas_a_string(
        deployment(json!({"replicas": 1}), Some(json!({"observedGeneration": 2, "updatedReplicas": "one"}))),
        Is::Progressing, "status.updatedReplicas is \"one\", not an integer")]
    #[case::generation_a_float(
        deployment(json!({"replicas": 1}), Some(json!({"observedGeneration": 2.5}))),
        Is::Progressing, "status.observedGeneration is 2.5, not an integer")]
    #[case::conditions_not_a_list(
        deployment(json!({"replicas": 1}), Some(json!({"observedGeneration": 2, "conditions": "Available"}))),
        Is::Progressing, "status.conditions is \"Available\", not a list")]
    #[case::paused_a_string(
        deployment(json!({"replicas": 1, "paused": "yes"}), Some(json!({"observedGeneration": 2}))),
        Is::Progressing, "spec.paused is \"yes\", not a boolean")]
    #[case::status_a_string(deployment(json!({}), Some(json!("ok"))), Is::Progressing, "status is \"ok\", not an object")]
    #[case::being_deleted(
        {
            let mut d = deployment(json!({"replicas": 1}), Some(json!({"observedGeneration": 2, "replicas": 1,
                "updatedReplicas": 1, "availableReplicas": 1})));
            d["metadata"]["deletionTimestamp"] = json!("2026-11-02T10:00:00Z");
            d
        },
        Is::Progressing, "being deleted")]
    fn deployments(#[case] object: Value, #[case] is: Is, #[case] says: &str) {
        judged(&object, is, says);
    }

    fn daemon_set(spec: Value, status: Option<Value>) -> Value {
        object("apps/v1", "DaemonSet", spec, status)
    }

    fn daemon_status(desired: i64, updated: i64, available: i64) -> Value {
        json!({"observedGeneration": 2, "currentNumberScheduled": desired, "desiredNumberScheduled": desired,
               "numberMisscheduled": 0, "numberReady": available, "numberAvailable": available,
               "updatedNumberScheduled": updated})
    }

    #[rstest]
    #[case::no_status(daemon_set(json!({}), None), Is::Progressing, "no status yet")]
    #[case::not_observed(
        daemon_set(json!({}), Some(json!({"observedGeneration": 1, "desiredNumberScheduled": 0}))),
        Is::Progressing, "generation 2 not observed")]
    #[case::not_updated(daemon_set(json!({}), Some(daemon_status(3, 1, 3))), Is::Progressing, "1 of 3 pods updated")]
    #[case::rolling_update_named(
        daemon_set(json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}}),
            Some(daemon_status(3, 2, 3))),
        Is::Progressing, "2 of 3 pods updated")]
    #[case::on_delete_waits_for_no_update(
        daemon_set(json!({"updateStrategy": {"type": "OnDelete"}}), Some(daemon_status(3, 0, 3))),
        Is::Healthy, "healthy")]
    #[case::on_delete_still_needs_available_pods(
        daemon_set(json!({"updateStrategy": {"type": "OnDelete"}}), Some(daemon_status(3, 0, 2))),
        Is::Progressing, "2 of 3 pods available")]
    #[case::unavailable(daemon_set(json!({}), Some(daemon_status(3, 3, 1))), Is::Progressing, "1 of 3 pods available")]
    #[case::available(daemon_set(json!({}), Some(daemon_status(3, 3, 3))), Is::Healthy, "healthy")]
    #[case::no_node_wants_it(daemon_set(json!({}), Some(daemon_status(0, 0, 0))), Is::Healthy, "healthy")]
    #[case::number_a_string(
        daemon_set(json!({}), Some(json!({"observedGeneration": 2, "desiredNumberScheduled": "3"}))),
        Is::Progressing, "status.desiredNumberScheduled is \"3\", not an integer")]
    #[case::strategy_a_number(
        daemon_set(json!({"updateStrategy": {"type": 1}}), Some(daemon_status(1, 1, 1))),
        Is::Progressing, "spec.updateStrategy.type is 1, not a string")]
    fn daemon_sets(#[case] object: Value, #[case] is: Is, #[case] says: &str) {
        judged(&object, is, says);
    }

    fn stateful_set(spec: Value, status: Option<Value>) -> Value {
        object("apps/v1", "StatefulSet", spec, status)
    }

    fn sts_status(ready: i64, updated: i64, current: &str, update: &str) -> Value {
        json!({"observedGeneration": 2, "replicas": 3, "readyReplicas": ready, "availableReplicas": ready,
               "currentReplicas": 3 - updated, "updatedReplicas": updated,
               "currentRevision": current, "updateRevision": update, "collisionCount": 0})
    }

    fn rolling(partition: i64) -> Value {
        json!({"replicas": 3, "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": partition}}})
    }

    #[rstest]
    #[case::no_status(stateful_set(rolling(0), None), Is::Progressing, "no status yet")]
    #[case::never_observed(
        stateful_set(rolling(0), Some(json!({"replicas": 0, "availableReplicas": 0}))),
        Is::Progressing, "not observed by its controller yet")]
    #[case::not_ready(
        stateful_set(rolling(0), Some(sts_status(1, 3, "r1", "r1"))),
        Is::Progressing,
        "1 of 3 pods ready"
    )]
    #[case::ready_but_not_available(
        stateful_set(rolling(0), Some(json!({"observedGeneration": 2, "replicas": 3, "readyReplicas": 3,
            "availableReplicas": 2, "updatedReplicas": 3, "currentRevision": "r1", "updateRevision": "r1"}))),
        Is::Progressing, "2 of 3 pods available")]
    #[case::available_not_written(
        stateful_set(rolling(0), Some(json!({"observedGeneration": 2, "replicas": 3, "readyReplicas": 3,
            "updatedReplicas": 3, "currentRevision": "r1", "updateRevision": "r1"}))),
        Is::Healthy, "healthy")]
    #[case::updating(
        stateful_set(rolling(0), Some(sts_status(3, 1, "r1", "r2"))),
        Is::Progressing,
        "1 of 3 pods updated"
    )]
    #[case::revision_not_current(
        stateful_set(rolling(0), Some(sts_status(3, 3, "web-5d4f8c7b9", "web-7c9d5f6b8"))),
        Is::Progressing,
        "rolling update to revision web-7c9d5f6b8 not complete (current revision web-5d4f8c7b9)"
    )]
    #[case::partition_held(
        stateful_set(rolling(2), Some(sts_status(3, 0, "r1", "r2"))),
        Is::Progressing,
        "0 of 1 pods updated (partition 2)"
    )]
    #[case::partition_reached(
        stateful_set(rolling(2), Some(sts_status(3, 1, "r1", "r2"))),
        Is::Healthy,
        "healthy"
    )]
    #[case::partition_beyond_replicas(
        stateful_set(rolling(5), Some(sts_status(3, 0, "r1", "r2"))),
        Is::Healthy,
        "healthy"
    )]
    #[case::rolled_out(
        stateful_set(rolling(0), Some(sts_status(3, 3, "r2", "r2"))),
        Is::Healthy,
        "healthy"
    )]
    #[case::on_delete(
        stateful_set(json!({"replicas": 3, "updateStrategy": {"type": "OnDelete"}}), Some(sts_status(3, 0, "r1", "r2"))),
        Is::Healthy, "healthy")]
    #[case::default_one_replica(
        stateful_set(json!({}), Some(json!({"observedGeneration": 2, "replicas": 1}))),
        Is::Progressing, "0 of 1 pods ready")]
    #[case::partition_a_string(
        stateful_set(json!({"replicas": 3, "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": "1"}}}),
            Some(sts_status(3, 3, "r1", "r1"))),
        Is::Progressing, "spec.updateStrategy.rollingUpdate.partition is \"1\", not an integer")]
    fn stateful_sets(#[case] object: Value, #[case] is: Is, #[case] says: &str) {
        judged(&object, is, says);
    }

    fn job(spec: Value, status: Option<Value>) -> Value {
        object("batch/v1", "Job", spec, status)
    }

    #[rstest]
    #[case::no_status(job(json!({"completions": 1}), None), Is::Progressing, "no status yet")]
    #[case::running(
        job(json!({"completions": 3}), Some(json!({"startTime": "2026-11-02T10:00:00Z", "active": 1,
            "succeeded": 1, "failed": 2, "ready": 1}))),
        Is::Progressing, "1 of 3 completions (1 active, 2 failed)")]
    #[case::default_one_completion(
        job(json!({}), Some(json!({"startTime": "2026-11-02T10:00:00Z", "active": 1}))),
        Is::Progressing, "0 of 1 completions (1 active)")]
    #[case::complete(
        job(json!({"completions": 1}), Some(json!({"startTime": "2026-11-02T10:00:00Z", "succeeded": 1,
            "completionTime": "2026-11-02T10:01:00Z", "conditions": conditions(&[
                ("SuccessCriteriaMet", "True", "CompletionsReached", "Reached expected number of succeeded pods"),
                ("Complete", "True", "CompletionsReached", "Reached expected number of succeeded pods")])}))),
        Is::Healthy, "healthy")]
    #[case::success_criteria_met_pods_terminating(
        job(json!({"completions": 1}), Some(json!({"startTime": "2026-11-02T10:00:00Z", "succeeded": 1,
            "conditions": conditions(&[("SuccessCriteriaMet", "True", "CompletionsReached", "")])}))),
        Is::Progressing, "1 of 1 completions")]
    #[case::failed(
        job(json!({"completions": 1, "backoffLimit": 2}), Some(json!({"startTime": "2026-11-02T10:00:00Z",
            "failed": 3, "conditions": conditions(&[
                ("FailureTarget", "True", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
                ("Failed", "True", "BackoffLimitExceeded", "Job has reached the specified backoff limit")])}))),
        Is::Failed, "BackoffLimitExceeded: Job has reached the specified backoff limit")]
    #[case::failure_target_pods_terminating(
        job(json!({"completions": 1}), Some(json!({"startTime": "2026-11-02T10:00:00Z", "failed": 1,
            "conditions": conditions(&[("FailureTarget", "True", "DeadlineExceeded", "Job was active longer than specified deadline")])}))),
        Is::Failed, "DeadlineExceeded: Job was active longer than specified deadline")]
    #[case::failed_false_is_not_a_failure(
        job(json!({"completions": 2}), Some(json!({"active": 2, "conditions": conditions(&[("Failed", "False", "", "")])}))),
        Is::Progressing, "0 of 2 completions")]
    #[case::suspended(
        job(json!({"completions": 1, "suspend": true}), Some(json!({"conditions": conditions(&[
            ("Suspended", "True", "JobSuspended", "Job suspended")])}))),
        Is::Progressing, "suspended, 0 of 1 completions")]
    #[case::succeeded_a_string(
        job(json!({"completions": 1}), Some(json!({"succeeded": "1"}))),
        Is::Progressing, "status.succeeded is \"1\", not an integer")]
    fn jobs(#[case] object: Value, #[case] is: Is, #[case] says: &str) {
        judged(&object, is, says);
    }

    fn crd(status: Option<Value>) -> Value {
        object(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            json!({"group": "example.com", "names": {"kind": "Widget", "plural": "widgets"}}),
            status,
        )
    }

    fn api_service(status: Option<Value>) -> Value {
        object(
            "apiregistration.k8s.io/v1",
            "APIService",
            json!({"group": "metrics.k8s.io", "version": "v1beta1",
                   "service": {"namespace": "kube-system", "name": "metrics-server"}}),
            status,
        )
    }

    #[rstest]
    #[case::crd_no_status(crd(None), Is::Progressing, "no status yet")]
    #[case::crd_names_accepted_only(
        crd(Some(json!({"conditions": conditions(&[("NamesAccepted", "True", "NoConflicts", "no conflicts found")])}))),
        Is::Progressing, "not established yet")]
    #[case::crd_establishing(
        crd(Some(json!({"conditions": conditions(&[
            ("NamesAccepted", "True", "NoConflicts", "no conflicts found"),
            ("Established", "False", "Installing", "the initial names have been accepted")])}))),
        Is::Progressing, "not established yet (Installing: the initial names have been accepted)")]
    #[case::crd_established(
        crd(Some(json!({"acceptedNames": {"kind": "Widget", "plural": "widgets"}, "conditions": conditions(&[
            ("NamesAccepted", "True", "NoConflicts", "no conflicts found"),
            ("Established", "True", "InitialNamesAccepted", "the initial names have been accepted")])}))),
        Is::Healthy, "healthy")]
    #[case::crd_names_conflict(
        crd(Some(json!({"conditions": conditions(&[
            ("NamesAccepted", "False", "KindConflict", "\"Widget\" is already in use"),
            ("Established", "False", "NotAccepted", "not all names are accepted")])}))),
        Is::Failed, "names not accepted (KindConflict: \"Widget\" is already in use)")]
    #[case::api_service_no_status(api_service(None), Is::Progressing, "no status yet")]
    #[case::api_service_discovery_failing(
        api_service(Some(json!({"conditions": conditions(&[("Available", "False", "FailedDiscoveryCheck",
            "failing or missing response from https://10.96.12.7:443/apis/metrics.k8s.io/v1beta1: bad status from https://10.96.12.7:443/apis/metrics.k8s.io/v1beta1: 503")])}))),
        Is::Progressing, "not available (FailedDiscoveryCheck: failing or missing response from https://10.96.12.7:443")]
    #[case::api_service_no_endpoints(
        api_service(Some(json!({"conditions": conditions(&[("Available", "False", "MissingEndpoints",
            "endpoints for service/metrics-server in \"kube-system\" have no addresses with port name \"https\"")])}))),
        Is::Progressing, "MissingEndpoints")]
    #[case::api_service_available(
        api_service(Some(json!({"conditions": conditions(&[("Available", "True", "Passed", "all checks passed")])}))),
        Is::Healthy, "healthy")]
    #[case::api_service_conditions_an_object(
        api_service(Some(json!({"conditions": {"Available": "True"}}))),
        Is::Progressing, "status.conditions is an object, not a list")]
    fn registrations(#[case] object: Value, #[case] is: Is, #[case] says: &str) {
        judged(&object, is, says);
    }

    fn pod(status: Option<Value>) -> Value {
        object(
            "v1",
            "Pod",
            json!({"containers": [{"name": "agent", "image": "cilium:1.17"}]}),
            status,
        )
    }

    #[rstest]
    #[case::no_status(pod(None), Is::Progressing, "no status yet")]
    #[case::pending_as_created(pod(Some(json!({"phase": "Pending", "qosClass": "BestEffort"}))), Is::Progressing, "not ready, phase Pending")]
    #[case::unschedulable(
        pod(Some(json!({"phase": "Pending", "conditions": conditions(&[("PodScheduled", "False", "Unschedulable",
            "0/3 nodes are available: 3 node(s) had untolerated taint {node.kubernetes.io/not-ready: }.")])}))),
        Is::Progressing, "not ready, phase Pending (Unschedulable: 0/3 nodes are available")]
    #[case::crash_looping(
        pod(Some(json!({"phase": "Running", "conditions": conditions(&[
                ("PodScheduled", "True", "", ""),
                ("Ready", "False", "ContainersNotReady", "containers with unready status: [agent]")]),
            "containerStatuses": [{"name": "agent", "ready": false, "restartCount": 5,
                "state": {"waiting": {"reason": "CrashLoopBackOff",
                    "message": "back-off 2m40s restarting failed container=agent"}}}]}))),
        Is::Progressing, "not ready, phase Running (container agent: CrashLoopBackOff, 5 restarts)")]
    #[case::image_not_pulled(
        pod(Some(json!({"phase": "Pending", "conditions": conditions(&[("PodScheduled", "True", "", "")]),
            "containerStatuses": [{"name": "agent", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff",
                    "message": "Back-off pulling image \"cilium:1.17\""}}}]}))),
        Is::Progressing, "not ready, phase Pending (container agent: ImagePullBackOff: Back-off pulling image \"cilium:1.17\")")]
    #[case::restarted_between_back_offs(
        pod(Some(json!({"phase": "Running", "conditions": conditions(&[
                ("Ready", "False", "ContainersNotReady", "containers with unready status: [agent]")]),
            "containerStatuses": [{"name": "agent", "ready": false, "restartCount": 3,
                "state": {"running": {"startedAt": "2026-11-28T02:00:00Z"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}))),
        Is::Progressing, "not ready, phase Running (container agent: restarted 3 times, last exit code 1 (Error))")]
    #[case::not_ready(
        pod(Some(json!({"phase": "Running", "conditions": conditions(&[
            ("Ready", "False", "ContainersNotReady", "containers with unready status: [agent]")])}))),
        Is::Progressing, "(ContainersNotReady: containers with unready status: [agent])")]
    #[case::ready(
        pod(Some(json!({"phase": "Running", "conditions": conditions(&[("Ready", "True", "", "")])}))),
        Is::Healthy, "healthy")]
    #[case::succeeded(pod(Some(json!({"phase": "Succeeded"}))), Is::Healthy, "healthy")]
    #[case::failed(
        pod(Some(json!({"phase": "Failed", "reason": "Evicted",
            "message": "The node was low on resource: memory."}))),
        Is::Failed, "phase Failed (Evicted: The node was low on resource: memory.)")]
    #[case::phase_a_number(pod(Some(json!({"phase": 3}))), Is::Progressing, "status.phase is 3, not a string")]
    fn pods(#[case] object: Value, #[case] is: Is, #[case] says: &str) {
        judged(&object, is, says);
    }

    #[rstest]
    #[case::labels(json!({"matchLabels": {"app": "web", "tier": "front"}}), Some("app=web,tier=front"))]
    #[case::expressions(
        json!({"matchLabels": {"app": "web"}, "matchExpressions": [
            {"key": "track", "operator": "In", "values": ["stable", "canary"]},
            {"key": "zone", "operator": "NotIn", "values": ["b"]},
            {"key": "owned", "operator": "Exists"},
            {"key": "legacy", "operator": "DoesNotExist"}]}),
        Some("app=web,track in (stable,canary),zone notin (b),owned,!legacy"))]
    #[case::everything(json!({}), None)]
    #[case::unknown_operator(json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}), None)]
    #[case::value_a_number(json!({"matchLabels": {"app": 3}}), None)]
    fn selectors_as_queries(#[case] selector: Value, #[case] query: Option<&str>) {
        let workload = json!({"spec": {"selector": selector}});
        assert_eq!(selector_query(&workload).as_deref(), query);
    }

    fn named_pod(name: &str, status: Value) -> Value {
        let mut pod = pod(Some(status));
        pod["metadata"] = json!({"name": name, "namespace": "kube-system"});
        pod
    }

    fn pulling(name: &str) -> Value {
        named_pod(
            name,
            json!({"phase": "Pending", "containerStatuses": [{"name": "agent", "restartCount": 0,
                "state": {"waiting": {"reason": "ErrImagePull", "message": "no such host"}}}]}),
        )
    }

    fn running(name: &str, containers: Value) -> Value {
        named_pod(
            name,
            json!({"phase": "Running", "conditions": conditions(&[("Ready", "False", "ContainersNotReady", "")]),
                "containerStatuses": containers}),
        )
    }

    #[rstest]
    #[case::none(vec![], None)]
    #[case::all_ready(
        vec![named_pod("a", json!({"phase": "Running", "conditions": conditions(&[("Ready", "True", "", "")])}))],
        None)]
    #[case::one_says_why(
        vec![named_pod("a", json!({"phase": "Running", "conditions": conditions(&[("Ready", "True", "", "")])})),
             pulling("b")],
        Some("pod kube-system/b: container agent: ErrImagePull: no such host"))]
    #[case::first_by_name_and_the_rest_counted(
        vec![pulling("c"), pulling("b"), pulling("d")],
        Some("pod kube-system/b: container agent: ErrImagePull: no such host, and 2 more pods that do not run"))]
    #[case::pending_without_a_reason_says_nothing(
        vec![named_pod("a", json!({"phase": "Pending"}))],
        None)]
    #[case::an_evicted_pod_is_not_the_trouble(
        vec![named_pod("a", json!({"phase": "Failed", "reason": "Evicted", "message": "low on memory"})),
             pulling("b")],
        Some("pod kube-system/b: container agent: ErrImagePull: no such host"))]
    #[case::a_ready_sidecar_that_restarted_long_ago_is_not_the_trouble(
        vec![running("a", json!([
            {"name": "sidecar", "ready": true, "restartCount": 2,
             "state": {"running": {}}, "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}},
            {"name": "main", "ready": false, "restartCount": 0,
             "state": {"waiting": {"reason": "CreateContainerConfigError", "message": "secret \"x\" not found"}}}]))],
        Some("pod kube-system/a: container main: CreateContainerConfigError: secret \"x\" not found"))]
    #[case::a_finished_init_container_is_not_the_trouble(
        vec![named_pod("a", json!({"phase": "Pending",
            "initContainerStatuses": [{"name": "init", "ready": false, "restartCount": 1,
                "state": {"terminated": {"exitCode": 0}}, "lastState": {"terminated": {"exitCode": 1}}}],
            "containerStatuses": [{"name": "main", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "back-off pulling"}}}]}))],
        Some("pod kube-system/a: container main: ImagePullBackOff: back-off pulling"))]
    #[case::a_plain_reason_before_one_being_created(
        vec![named_pod("a", json!({"phase": "Pending", "containerStatuses": [{"name": "agent", "restartCount": 0,
                "state": {"waiting": {"reason": "ContainerCreating"}}}]})),
             pulling("b")],
        Some("pod kube-system/b: container agent: ErrImagePull: no such host, and 1 more pod that does not run"))]
    #[case::crash_looping_with_its_restarts(
        vec![running("a", json!([{"name": "agent", "ready": false, "restartCount": 4,
            "state": {"waiting": {"reason": "CrashLoopBackOff",
                "message": "back-off 1m20s restarting failed container=agent pod=a_kube-system(uid)"}}}]))],
        Some("pod kube-system/a: container agent: CrashLoopBackOff, 4 restarts"))]
    fn why_a_workloads_pods_do_not_run(#[case] pods: Vec<Value>, #[case] says: Option<&str>) {
        assert_eq!(pod_trouble(&pods).as_deref(), says);
    }

    /// A ready pod whose containers started at the given times (`(name, startedAt, restarts)`).
    fn started(name: &str, containers: &[(&str, &str, i64)]) -> Value {
        let statuses: Vec<Value> = containers
            .iter()
            .map(|(container, at, restarts)| {
                json!({"name": container, "ready": true, "restartCount": restarts,
                    "state": {"running": {"startedAt": at}}})
            })
            .collect();
        named_pod(
            name,
            json!({"phase": "Running", "conditions": conditions(&[("Ready", "True", "", "")]),
                "containerStatuses": statuses}),
        )
    }

    #[rstest]
    #[case::no_pods(vec![], None)]
    #[case::up_long_enough(vec![started("a", &[("agent", "2026-11-28T11:59:00Z", 0)])], None)]
    #[case::up_exactly_the_settle_time(vec![started("a", &[("agent", "2026-11-28T11:59:45Z", 3)])], None)]
    #[case::just_started(
        vec![started("a", &[("agent", "2026-11-28T11:59:58Z", 0)])],
        Some("pod kube-system/a: container agent up 2s of 15s"))]
    #[case::restarted_and_up_a_moment(
        vec![started("a", &[("agent", "2026-11-28T11:59:59Z", 4)])],
        Some("pod kube-system/a: container agent up 1s of 15s, restarted 4 times"))]
    #[case::the_container_that_started_last_is_named(
        vec![started("a", &[("old", "2026-11-28T11:00:00Z", 0), ("agent", "2026-11-28T11:59:50Z", 1)]),
             started("b", &[("agent", "2026-11-28T11:59:55Z", 0)])],
        Some("pod kube-system/b: container agent up 5s of 15s"))]
    #[case::a_start_in_the_future_counts_as_just_started(
        vec![started("a", &[("agent", "2026-11-28T12:00:09Z", 0)])],
        Some("pod kube-system/a: container agent up 0s of 15s"))]
    #[case::a_container_that_does_not_run(
        vec![named_pod("a", json!({"phase": "Running", "containerStatuses": [{"name": "agent", "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}))],
        Some("pod kube-system/a: container agent not running (CrashLoopBackOff), restarted 2 times"))]
    #[case::pods_being_deleted_and_finished_ones_do_not_count(
        vec![{
            let mut pod = started("a", &[("agent", "2026-11-28T11:59:59Z", 0)]);
            pod["metadata"]["deletionTimestamp"] = json!("2026-11-28T11:59:59Z");
            pod
        }, named_pod("b", json!({"phase": "Succeeded", "containerStatuses": [{"name": "agent",
            "state": {"terminated": {"reason": "Completed"}}}]}))],
        None)]
    #[case::a_start_time_that_cannot_be_read_is_no_guess(
        vec![started("a", &[("agent", "yesterday", 0)])],
        None)]
    fn a_running_workloads_pods_settle(#[case] pods: Vec<Value>, #[case] says: Option<&str>) {
        let now = DateTime::parse_from_rfc3339("2026-11-28T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(unsettled(&pods, now, Duration::from_secs(15)).as_deref(), says);
    }

    #[rstest]
    #[case::config_map("v1", "ConfigMap")]
    #[case::service("v1", "Service")]
    #[case::a_deployment_of_another_group("example.com/v1", "Deployment")]
    #[case::a_pod_of_another_group("example.com/v1", "Pod")]
    #[case::no_kind("apps/v1", "")]
    fn kinds_without_a_rule_are_not_judged(#[case] api_version: &str, #[case] kind: &str) {
        let object = object(api_version, kind, json!({}), None);
        assert_eq!(assess(&object), None);
        let (group, _) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        assert!(!has_rule(group, kind));
    }

    #[test]
    fn an_object_annotated_to_skip_the_check_is_not_judged() {
        let mut unavailable = object(
            "apiregistration.k8s.io/v1",
            "APIService",
            json!({}),
            Some(
                json!({"conditions": [{"type": "Available", "status": "False", "reason": "FailedDiscoveryCheck"}]}),
            ),
        );
        assert!(matches!(assess(&unavailable), Some(Health::Progressing(_))));
        unavailable["metadata"]["annotations"] = json!({SKIP_ANNOTATION: "true"});
        assert_eq!(assess(&unavailable), None);
        unavailable["metadata"]["annotations"] = json!({SKIP_ANNOTATION: "yes"});
        assert!(assess(&unavailable).is_some(), "only \"true\" skips");
    }

    #[test]
    fn kinds_with_a_rule() {
        for (group, kind) in [
            ("apps", "Deployment"),
            ("apps", "DaemonSet"),
            ("apps", "StatefulSet"),
            ("batch", "Job"),
            ("apiextensions.k8s.io", "CustomResourceDefinition"),
            ("apiregistration.k8s.io", "APIService"),
            ("", "Pod"),
        ] {
            assert!(has_rule(group, kind), "{group} {kind}");
        }
        assert!(!has_rule("apps", "ReplicaSet"));
    }

    #[test]
    fn statuses_of_any_shape_never_panic() {
        for status in [
            json!(null),
            json!([]),
            json!(7),
            json!({"conditions": [1, "x", null, {"type": 3}]}),
            json!({"conditions": [{"type": "Available", "status": true, "reason": 7}]}),
            json!({"observedGeneration": -1, "replicas": -5, "updatedReplicas": i64::MAX}),
            json!({"observedGeneration": u64::MAX}),
            json!({"containerStatuses": "x", "initContainerStatuses": [{"state": []}]}),
        ] {
            for (api_version, kind) in [
                ("apps/v1", "Deployment"),
                ("apps/v1", "DaemonSet"),
                ("apps/v1", "StatefulSet"),
                ("batch/v1", "Job"),
                ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
                ("apiregistration.k8s.io/v1", "APIService"),
                ("v1", "Pod"),
            ] {
                let mut object = object(api_version, kind, json!({"replicas": "x"}), Some(status.clone()));
                let health = assess(&object).expect("a rule");
                assert!(!health.is_healthy(), "{kind} {status}: {health:?}");
                object["spec"] = json!("not an object");
                object["metadata"] = json!(null);
                assess(&object).expect("a rule");
            }
        }
    }

    #[test]
    fn a_huge_message_is_cut_short_and_kept_on_one_line() {
        let hostile = format!("line one\n\tline two {}", "x".repeat(1 << 20));
        let service = api_service(Some(json!({"conditions": conditions(&[
            ("Available", "False", &hostile, &hostile)])}))); // reason and message both huge
        let health = assess(&service).expect("a rule");
        let message = health.to_string();
        assert!(
            message.chars().count() < 2 * MAX_REASON_CHARS + 40,
            "{}",
            message.len()
        );
        assert!(
            message.starts_with("not available (line one line two xxx"),
            "{message}"
        );
        assert!(!message.contains('\n') && !message.contains('\t'), "{message}");
        assert!(message.contains('…'), "{message}");

        let pod = pod(Some(json!({"phase": "x".repeat(1 << 20)})));
        assert!(assess(&pod).expect("a rule").to_string().chars().count() < MAX_REASON_CHARS + 40);
        let deployment = deployment(
            json!({}),
            Some(json!({"observedGeneration": "y".repeat(1 << 20)})),
        );
        assert!(assess(&deployment).expect("a rule").to_string().chars().count() < 100);
    }

    #[rstest]
    #[case::short("Installing", "Installing")]
    #[case::exactly_the_limit(&"a".repeat(MAX_REASON_CHARS), &"a".repeat(MAX_REASON_CHARS))]
    #[case::one_over(&"a".repeat(MAX_REASON_CHARS + 1), &format!("{}…", "a".repeat(MAX_REASON_CHARS)))]
    #[case::whitespace("  a\r\n\u{7}b  ", "a b")]
    #[case::multibyte(&"é".repeat(300), &format!("{}…", "é".repeat(MAX_REASON_CHARS)))]
    fn clipping(#[case] text: &str, #[case] clipped: &str) {
        assert_eq!(clip(text, MAX_REASON_CHARS), clipped);
    }

    fn key(kind: &str, namespace: &str, name: &str) -> ObjectKey {
        ObjectKey {
            group: "apps".into(),
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn the_summary_follows_the_inventory_and_stops_at_the_limit() {
        let report = HealthReport {
            checked: 6,
            unhealthy: vec![
                ObjectHealth {
                    key: key("Deployment", "kube-system", "metrics-server"),
                    health: Health::Progressing("0 of 1 replicas available".into()),
                    position: 0,
                },
                ObjectHealth {
                    key: key("DaemonSet", "kube-system", "cilium"),
                    health: Health::Progressing("1 of 3 pods available".into()),
                    position: 3,
                },
                ObjectHealth {
                    key: ObjectKey {
                        group: "apiextensions.k8s.io".into(),
                        kind: "CustomResourceDefinition".into(),
                        namespace: Default::default(),
                        name: "widgets.example.com".into(),
                    },
                    health: Health::Failed("names not accepted".into()),
                    position: 5,
                },
            ],
            errors: vec![ReadError {
                key: key("StatefulSet", "kube-system", "etcd"),
                error: "Forbidden".into(),
                position: 4,
            }],
        };
        assert!(!report.is_healthy());
        assert!(report.has_failed());
        assert_eq!(
            report.summary(2),
            "Deployment kube-system/metrics-server: 0 of 1 replicas available; \
             DaemonSet kube-system/cilium: 1 of 3 pods available; and 2 more"
        );
        assert_eq!(
            report.summary(10),
            "Deployment kube-system/metrics-server: 0 of 1 replicas available; \
             DaemonSet kube-system/cilium: 1 of 3 pods available; \
             StatefulSet kube-system/etcd: cannot be read: Forbidden; \
             CustomResourceDefinition widgets.example.com: names not accepted"
        );
        assert_eq!(report.summary(0), "and 4 more");

        let healthy = HealthReport {
            checked: 2,
            ..HealthReport::default()
        };
        assert!(healthy.is_healthy() && !healthy.has_failed());
        assert_eq!(healthy.summary(3), "");

        let unreadable = HealthReport {
            checked: 1,
            unhealthy: vec![],
            errors: report.errors.clone(),
        };
        assert!(!unreadable.is_healthy() && !unreadable.has_failed());
    }
}
