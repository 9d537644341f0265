//! What a process uses, from `/proc`: CPU time and resident memory, for benchmarks and reports.

use std::time::Duration;

/// CPU time (user + system) and memory (KiB) of one process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub cpu: Duration,
    pub rss_kib: u64,
    pub peak_rss_kib: u64,
    /// The part of `rss_kib` that maps files (`RssFile`: mostly the program's own code and data, which the
    /// kernel may drop and read again), as opposed to memory the process allocated.
    pub file_rss_kib: u64,
}

impl Usage {
    /// The usage of process `pid`, or of this process with `None`; `None` when it cannot be read.
    pub fn of(pid: Option<u32>) -> Option<Usage> {
        let dir = pid.map_or_else(|| "/proc/self".to_owned(), |pid| format!("/proc/{pid}"));
        let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        let status = std::fs::read_to_string(format!("{dir}/status")).ok()?;
        let field = |name: &str| -> Option<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()
        };
        // The kernel's clock tick is 100 Hz on every Linux this runs on.
        Some(Usage {
            cpu: Duration::from_millis(ticks * 10),
            rss_kib: field("VmRSS:")?,
            peak_rss_kib: field("VmHWM:")?,
            file_rss_kib: field("RssFile:").unwrap_or(0),
        })
    }
}
