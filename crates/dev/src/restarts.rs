//! Restarting Cluster API's managers in `cso-dev up`, as a Deployment restarts its pod's container: a manager that
//! exits is started again after a back-off that doubles with each exit ([`BACKOFF`]), and the restart counts are
//! kept in `DIR/cluster-api-managers.json` for `cso-dev status`.
//!
//! The core manager exits when it cannot discover every registered runtime extension within a minute of starting
//! (its `ExtensionConfig` warm-up: "ExtensionConfig registry warmup timed out after 1m0s"), which is what happens
//! until `cso run` serves the hook port `cso-dev up` registered. In a cluster its pod would be restarted; here
//! `up` does the same. The decision (when to restart, the next back-off) is the pure [`next`]; `up` observes the
//! processes and acts on it.

use std::{
    path::Path,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::{Value, json};

/// The file in `cso-dev up`'s directory with each manager's state and restart count.
pub const STATUS_FILE: &str = "cluster-api-managers.json";

/// How long to wait before starting an exited process again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after the first exit (and after an exit that followed a long clean run).
    pub first: Duration,
    /// The longest wait: each exit doubles the wait up to this.
    pub cap: Duration,
    /// A run at least this long counts as clean: the exit that ends it waits [`Backoff::first`] again.
    pub reset_after: Duration,
}

/// The kubelet's numbers for a crashing container (CrashLoopBackOff): 10 s, doubling, at most 5 minutes, reset
/// after 10 minutes of running. With them the core manager, which exits a minute after each start while no
/// hook server answers, runs again 10, 20, 40, 80, 160 s after each exit and then every 5 minutes; once
/// `cso run` serves, it is discovered at the latest when the current wait ends.
pub const BACKOFF: Backoff = Backoff {
    first: Duration::from_secs(10),
    cap: Duration::from_secs(300),
    reset_after: Duration::from_secs(600),
};

/// Where a manager is in its run, exit, wait, restart cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Running {
        since: Instant,
    },
    /// Exited; to be started again at `restart_at`.
    Waiting {
        restart_at: Instant,
    },
}

/// What `up` knows about one manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Supervision {
    pub phase: Phase,
    /// How often it was started again.
    pub restarts: u32,
    /// The wait after its next exit (unless the run before it was clean).
    pub next_wait: Duration,
}

impl Supervision {
    /// A manager that was just started.
    pub fn started(now: Instant, backoff: &Backoff) -> Self {
        Supervision {
            phase: Phase::Running { since: now },
            restarts: 0,
            next_wait: backoff.first,
        }
    }
}

/// What to do about one manager now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Nothing,
    /// It exited after running `ran_for`: report it; it is started again in `wait`.
    Exited {
        ran_for: Duration,
        wait: Duration,
    },
    /// Its wait is over: start it again.
    Restart,
}

/// The decision for one manager, from what `up` knew and whether its process has exited now: the new state and
/// what to do.
pub fn next(known: Supervision, exited: bool, now: Instant, backoff: &Backoff) -> (Supervision, Action) {
    match known.phase {
        Phase::Running { .. } if !exited => (known, Action::Nothing),
        Phase::Running { since } => {
            let ran_for = now.saturating_duration_since(since);
            let wait = if ran_for >= backoff.reset_after {
                backoff.first
            } else {
                known.next_wait
            };
            let state = Supervision {
                phase: Phase::Waiting {
                    restart_at: now + wait,
                },
                restarts: known.restarts,
                next_wait: (wait * 2).min(backoff.cap),
            };
            (state, Action::Exited { ran_for, wait })
        }
        Phase::Waiting { restart_at } if now < restart_at => (known, Action::Nothing),
        Phase::Waiting { .. } => {
            let state = Supervision {
                phase: Phase::Running { since: now },
                restarts: known.restarts + 1,
                next_wait: known.next_wait,
            };
            (state, Action::Restart)
        }
    }
}

/// One manager as `cso-dev status` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagerReport {
    /// The provider's short name (`core`, `kubeadm-bootstrap`, ...).
    pub name: String,
    pub supervision: Supervision,
    /// How its last run ended (`exit status: 1`), once one has.
    pub last_exit: Option<String>,
}

/// The status file's content: each manager's state (`running` or `waiting`, with the restart time in seconds
/// since the Unix epoch), restart count and last exit.
pub fn status_json(managers: &[ManagerReport], now: Instant, wall_now: SystemTime) -> Value {
    let unix = |at: Instant| {
        let from_now = at.saturating_duration_since(now);
        (wall_now + from_now)
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    let managers: Vec<Value> = managers
        .iter()
        .map(|m| {
            let mut entry = json!({
                "name": m.name,
                "restarts": m.supervision.restarts,
                "lastExit": m.last_exit,
            });
            match m.supervision.phase {
                Phase::Running { .. } => entry["state"] = "running".into(),
                Phase::Waiting { restart_at } => {
                    entry["state"] = "waiting".into();
                    entry["restartAt"] = unix(restart_at).into();
                }
            }
            entry
        })
        .collect();
    json!({ "managers": managers })
}

/// Writes the status file into `dir` (whole or not at all: a temporary file renamed over it).
pub fn write_status(dir: &Path, status: &Value) -> std::io::Result<()> {
    let path = dir.join(STATUS_FILE);
    let temporary = dir.join(format!("{STATUS_FILE}.tmp"));
    std::fs::write(&temporary, format!("{status:#}\n"))?;
    std::fs::rename(&temporary, &path)
}

/// The lines `cso-dev status` prints for the status file's content: `core: running, restarts: 2, last exit:
/// exit status: 1`, or `core: waiting to restart (in 35s), restarts: 2, last exit: ...`.
pub fn status_lines(status: &Value, wall_now: SystemTime) -> Vec<String> {
    let now = wall_now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    status
        .get("managers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|m| {
            let name = m.get("name").and_then(Value::as_str).unwrap_or("?");
            let restarts = m.get("restarts").and_then(Value::as_u64).unwrap_or(0);
            let state = match m.get("state").and_then(Value::as_str) {
                Some("waiting") => {
                    let at = m.get("restartAt").and_then(Value::as_u64).unwrap_or(now);
                    format!("waiting to restart (in {}s)", at.saturating_sub(now))
                }
                Some(state) => state.to_owned(),
                None => "unknown".to_owned(),
            };
            let mut line = format!("{name}: {state}, restarts: {restarts}");
            if let Some(exit) = m.get("lastExit").and_then(Value::as_str) {
                line.push_str(&format!(", last exit: {exit}"));
            }
            line
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    const fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn exits_are_restarted_after_a_doubling_wait_that_a_clean_run_resets() {
        let t0 = Instant::now();
        let at = |n: u64| t0 + secs(n);
        let running = |since: u64, restarts: u32, next_wait: u64| Supervision {
            phase: Phase::Running { since: at(since) },
            restarts,
            next_wait: secs(next_wait),
        };
        let waiting = |until: u64, restarts: u32, next_wait: u64| Supervision {
            phase: Phase::Waiting {
                restart_at: at(until),
            },
            restarts,
            next_wait: secs(next_wait),
        };
        let exited = |ran_for: u64, wait: u64| Action::Exited {
            ran_for: secs(ran_for),
            wait: secs(wait),
        };
        // (what was known, exited now, now (s after t0), the new state, the action)
        let table = [
            // Running on: nothing to do.
            (running(0, 0, 10), false, 30, running(0, 0, 10), Action::Nothing),
            // The first exit (the core manager's warm-up gives up after a minute): 10 s, then 20 s next time.
            (running(0, 0, 10), true, 61, waiting(71, 0, 20), exited(61, 10)),
            // Still waiting; the process is gone all along, which changes nothing.
            (waiting(71, 0, 20), true, 70, waiting(71, 0, 20), Action::Nothing),
            // The wait is over: started again, counted.
            (waiting(71, 0, 20), true, 71, running(71, 1, 20), Action::Restart),
            // The next exits wait twice as long each time ...
            (running(71, 1, 20), true, 132, waiting(152, 1, 40), exited(61, 20)),
            (
                running(100, 4, 160),
                true,
                160,
                waiting(320, 4, 300),
                exited(60, 160),
            ),
            // ... up to 5 minutes.
            (
                running(100, 5, 300),
                true,
                160,
                waiting(460, 5, 300),
                exited(60, 300),
            ),
            (
                running(0, 6, 300),
                true,
                599,
                waiting(899, 6, 300),
                exited(599, 300),
            ),
            // A run of 10 minutes or more was clean: the wait starts again at 10 s.
            (
                running(0, 6, 300),
                true,
                600,
                waiting(610, 6, 20),
                exited(600, 10),
            ),
            (
                running(0, 6, 300),
                false,
                5000,
                running(0, 6, 300),
                Action::Nothing,
            ),
        ];
        for (row, (known, exited_now, now, state, action)) in table.into_iter().enumerate() {
            assert_eq!(
                next(known, exited_now, at(now), &BACKOFF),
                (state, action),
                "row {row}: {known:?}, exited {exited_now}, at {now}s"
            );
        }
    }

    #[test]
    fn a_started_manager_waits_the_first_back_off_after_its_first_exit() {
        let t0 = Instant::now();
        let started = Supervision::started(t0, &BACKOFF);
        assert_eq!(started.restarts, 0);
        let (state, action) = next(started, true, t0 + secs(5), &BACKOFF);
        assert_eq!(
            action,
            Action::Exited {
                ran_for: secs(5),
                wait: BACKOFF.first
            }
        );
        assert_eq!(
            state.phase,
            Phase::Waiting {
                restart_at: t0 + secs(15)
            }
        );
    }

    #[test]
    fn the_status_file_shows_each_manager_with_its_restarts() {
        let now = Instant::now();
        let wall = UNIX_EPOCH + secs(1_000_000);
        let managers = [
            ManagerReport {
                name: "core".into(),
                supervision: Supervision {
                    phase: Phase::Waiting {
                        restart_at: now + secs(20),
                    },
                    restarts: 2,
                    next_wait: secs(80),
                },
                last_exit: Some("exit status: 1".into()),
            },
            ManagerReport {
                name: "docker".into(),
                supervision: Supervision::started(now, &BACKOFF),
                last_exit: None,
            },
        ];
        let status = status_json(&managers, now, wall);
        assert_eq!(status["managers"][0]["restartAt"], 1_000_020);
        let read_back: Value = serde_json::from_str(&format!("{status:#}")).unwrap();
        assert_eq!(
            status_lines(&read_back, wall + secs(5)),
            [
                "core: waiting to restart (in 15s), restarts: 2, last exit: exit status: 1",
                "docker: running, restarts: 0",
            ]
        );
    }
}
