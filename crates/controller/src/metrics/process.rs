//! The operator's own resource use, read from `/proc` at every scrape: the metrics of Prometheus' process
//! collector under its names (`process_resident_memory_bytes`, `process_virtual_memory_bytes`,
//! `process_start_time_seconds`, `process_cpu_seconds_total`, `process_open_fds`, `process_max_fds`, as Go
//! operators export them, so existing dashboards and alerts work), and `cso_renderer_resident_memory_bytes`:
//! the resident memory of the `cso-renderer` processes the operator started. Those live in the same container,
//! so the two resident sizes together are what the container's memory limit sees, and an alert on their sum can
//! fire before an OOM kill.
//!
//! Linux only: elsewhere (no `/proc`) the metrics are left out. Times in `/proc/<pid>/stat` are in clock ticks
//! of `USER_HZ`, which the kernel fixes at 100 for user space on every architecture Kubernetes runs on (as
//! Prometheus' procfs library assumes too); memory comes from `/proc/<pid>/status` in kB, so no page size is
//! needed.

use std::{
    path::Path,
    sync::{Arc, OnceLock},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

/// Clock ticks per second of the times in `/proc/<pid>/stat`.
const USER_HZ: f64 = 100.0;

/// What `/proc/<pid>/stat` says that the metrics need.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StatTimes {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// When the process started, in seconds after boot.
    pub started_after_boot_seconds: f64,
}

/// The CPU time and start of a process from the text of its `/proc/<pid>/stat`. The command name (field 2) is
/// in parentheses and may itself hold spaces and parentheses, so the fields are counted after its last `)`.
pub fn parse_stat(text: &str) -> Option<StatTimes> {
    let (_, after_name) = text.rsplit_once(')')?;
    // Field 3 (state) is the first after the name; utime is field 14, stime 15, starttime 22.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |number: usize| fields.get(number - 3)?.parse::<u64>().ok();
    let ticks = |t: u64| t as f64 / USER_HZ;
    Some(StatTimes {
        cpu_seconds: ticks(field(14)? + field(15)?),
        started_after_boot_seconds: ticks(field(22)?),
    })
}

/// What `/proc/<pid>/status` says about memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatusMemory {
    /// `VmRSS`: resident memory, in bytes.
    pub resident_bytes: u64,
    /// `VmSize`: virtual memory, in bytes.
    pub virtual_bytes: u64,
}

/// Resident and virtual memory from the text of `/proc/<pid>/status` (`VmRSS:  12345 kB`).
pub fn parse_status(text: &str) -> Option<StatusMemory> {
    let kilobytes = |key: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
            .and_then(|value| value.trim().strip_suffix("kB"))
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(|kb| kb.saturating_mul(1024))
    };
    Some(StatusMemory {
        resident_bytes: kilobytes("VmRSS")?,
        virtual_bytes: kilobytes("VmSize")?,
    })
}

/// The boot time (`btime`, seconds since the epoch) from the text of `/proc/stat`.
pub fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("btime "))
        .and_then(|value| value.trim().parse().ok())
}

/// The soft limit of open files from the text of `/proc/<pid>/limits`; `None` when unlimited.
pub fn parse_max_open_files(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|soft| soft.parse().ok())
}

/// This process's figures, as the process collector exports them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProcessFigures {
    pub memory: StatusMemory,
    pub cpu_seconds: f64,
    /// Seconds since the epoch.
    pub start_time_seconds: f64,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
}

/// Reads this process's figures from `/proc/self`; `None` without `/proc`.
pub fn read_own() -> Option<ProcessFigures> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    let memory = parse_status(&read("/proc/self/status")?)?;
    let times = parse_stat(&read("/proc/self/stat")?)?;
    let boot = parse_boot_time(&read("/proc/stat")?)?;
    Some(ProcessFigures {
        memory,
        cpu_seconds: times.cpu_seconds,
        start_time_seconds: boot as f64 + times.started_after_boot_seconds,
        open_fds: std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|entries| entries.count() as u64),
        max_fds: read("/proc/self/limits")
            .as_deref()
            .and_then(parse_max_open_files),
    })
}

/// The resident memory of the processes `pids`, summed; a process that has exited in the meantime counts 0.
pub fn resident_bytes_of(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|pid| {
            std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("status")).ok()
        })
        .filter_map(|text| parse_status(&text))
        .map(|memory| memory.resident_bytes)
        .sum()
}

/// The [`Collector`] of the module's metrics, registered once in the operator's registry; the renderer is
/// given later (`Metrics::watch_renderer`), when `cso run` has built it.
#[derive(Debug, Default)]
pub(crate) struct ProcessCollector {
    pub(crate) renderer: Arc<OnceLock<cso_render::Engine>>,
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: f64) -> std::fmt::Result {
    let gauge = ConstGauge::new(value);
    gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        if let Some(own) = read_own() {
            let gauges = [
                (
                    "process_resident_memory_bytes",
                    "Resident memory size in bytes.",
                    Some(own.memory.resident_bytes as f64),
                ),
                (
                    "process_virtual_memory_bytes",
                    "Virtual memory size in bytes.",
                    Some(own.memory.virtual_bytes as f64),
                ),
                (
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                    Some(own.start_time_seconds),
                ),
                (
                    "process_open_fds",
                    "Number of open file descriptors.",
                    own.open_fds.map(|n| n as f64),
                ),
                (
                    "process_max_fds",
                    "Maximum number of open file descriptors.",
                    own.max_fds.map(|n| n as f64),
                ),
            ];
            for (name, help, value) in gauges {
                if let Some(value) = value {
                    gauge(&mut encoder, name, help, value)?;
                }
            }
            // Encoded with the `_total` suffix of a counter: `process_cpu_seconds_total`.
            let cpu = ConstCounter::new(own.cpu_seconds);
            cpu.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                cpu.metric_type(),
            )?)?;
        }
        if let Some(engine) = self.renderer.get() {
            gauge(
                &mut encoder,
                "cso_renderer_resident_memory_bytes",
                "Resident memory in bytes of the cso-renderer processes this operator runs (0 before the first \
                 render); with process_resident_memory_bytes, what the container's memory limit sees.",
                resident_bytes_of(&engine.process_ids()) as f64,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real `/proc/<pid>/stat` line, with a command name holding a space and parentheses.
    const STAT: &str = "4242 (cso (run) x) S 1 4242 4242 0 -1 4194560 15362 0 12 0 \
                        250 130 0 0 20 0 17 0 123456 2048000000 30000 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 \
                        1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";

    const STATUS: &str = "Name:\tcso\nUmask:\t0022\nState:\tS (sleeping)\nVmPeak:\t 2100000 kB\n\
                          VmSize:\t 2000000 kB\nVmRSS:\t   120000 kB\nRssAnon:\t  100000 kB\nThreads:\t17\n";

    const LIMITS: &str = "Limit                     Soft Limit           Hard Limit           Units     \n\
                          Max cpu time              unlimited            unlimited            seconds   \n\
                          Max open files            1024                 1048576              files     \n";

    #[test]
    fn stat_gives_cpu_time_and_start_in_seconds() {
        let times = parse_stat(STAT).unwrap();
        assert!((times.cpu_seconds - 3.8).abs() < 1e-9, "{times:?}");
        assert!(
            (times.started_after_boot_seconds - 1234.56).abs() < 1e-9,
            "{times:?}"
        );
        assert_eq!(parse_stat("4242 (cso) S 1"), None, "cut short");
    }

    #[test]
    fn status_gives_resident_and_virtual_memory_in_bytes() {
        assert_eq!(
            parse_status(STATUS),
            Some(StatusMemory {
                resident_bytes: 120_000 * 1024,
                virtual_bytes: 2_000_000 * 1024,
            })
        );
        // A kernel thread (or a zombie) has no memory lines.
        assert_eq!(parse_status("Name:\tkthreadd\nState:\tS (sleeping)\n"), None);
    }

    #[test]
    fn boot_time_and_the_soft_limit_of_open_files() {
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nintr 5\nbtime 1767225600\nprocesses 9\n"),
            Some(1_767_225_600)
        );
        assert_eq!(parse_max_open_files(LIMITS), Some(1024));
        assert_eq!(
            parse_max_open_files(
                "Max open files            unlimited            unlimited            files\n"
            ),
            None
        );
    }

    /// The value of the sample `name` (no labels) in Prometheus text.
    fn sample(text: &str, name: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
    }

    #[test]
    fn the_operators_metrics_carry_the_process_collectors_names() {
        let metrics = crate::Metrics::default();
        let text = metrics.encode();
        for name in [
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_start_time_seconds",
            "process_cpu_seconds_total",
            "process_open_fds",
            "process_max_fds",
        ] {
            let value = sample(&text, name).unwrap_or_else(|| panic!("{name} in:\n{text}"));
            assert!(
                value > 0.0 || name == "process_cpu_seconds_total",
                "{name} = {value}"
            );
        }
        assert!(text.contains("# TYPE process_cpu_seconds counter"), "{text}");
        assert_eq!(
            sample(&text, "cso_renderer_resident_memory_bytes"),
            None,
            "no renderer engine (--renderer=helm): left out"
        );

        metrics.watch_renderer(cso_render::Engine::new(
            "/nonexistent/cso-renderer",
            std::time::Duration::from_secs(1),
        ));
        assert_eq!(
            sample(&metrics.encode(), "cso_renderer_resident_memory_bytes"),
            Some(0.0),
            "before its first render no renderer runs"
        );
    }

    #[test]
    fn this_process_reads_plausibly() {
        let own = read_own().expect("/proc/self is readable");
        assert!(own.memory.resident_bytes > 1 << 20, "{own:?}");
        assert!(own.memory.virtual_bytes >= own.memory.resident_bytes, "{own:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            own.start_time_seconds <= now + 1.0 && own.start_time_seconds > now - 24.0 * 3600.0,
            "started within a day: {own:?}"
        );
        assert!(own.cpu_seconds >= 0.0, "{own:?}");
        assert!(own.open_fds.is_some_and(|n| n >= 3), "{own:?}");
        assert!(
            own.max_fds.is_some_and(|n| n >= own.open_fds.unwrap_or(0)),
            "{own:?}"
        );
        assert!(resident_bytes_of(&[std::process::id()]) > 1 << 20);
        assert_eq!(
            resident_bytes_of(&[u32::MAX]),
            0,
            "no such process: nothing, no error"
        );
    }
}
