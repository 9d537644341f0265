//! Child processes (etcd, kube-apiserver, a registry) that never outlive the process that started them.
//!
//! Each child runs in its own process group. It is killed when its [`Supervised`] guard drops, and a small
//! watchdog (`sh`, also in its own group) kills it when the parent process dies without dropping the guard:
//! a panicking test or a `static` control plane leaves nothing behind. (A parent-death signal would need
//! `unsafe` `pre_exec`, which this workspace forbids.)

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use crate::Error;

/// A running child process with its log file.
#[derive(Debug)]
pub struct Supervised {
    name: String,
    child: Child,
    watchdog: Option<Child>,
    log: PathBuf,
}

impl Supervised {
    /// Starts `command`, with stdout and stderr going to `log`.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> Result<Self, Error> {
        let out = File::create(log).map_err(|e| Error::io(log, e))?;
        let err = out.try_clone().map_err(|e| Error::io(log, e))?;
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| Error::Process(format!("failed to start {name}: {e}")))?;
        let watchdog = spawn_watchdog(child.id()).ok();
        Ok(Supervised {
            name: name.to_owned(),
            child,
            watchdog,
            log: log.to_path_buf(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited, and if so a description with the end of its log.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!(
                "{} exited ({status}); log tail:\n{}",
                self.name,
                self.log_tail()
            )),
            _ => None,
        }
    }

    /// The last lines of the log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Polls `probe` every `interval` until it answers true; fails when the process exits first or
    /// `timeout` passes, with the end of its log.
    pub async fn wait_ready<F, Fut>(
        &mut self,
        timeout: Duration,
        interval: Duration,
        mut probe: F,
    ) -> Result<(), Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(exit) = self.exited() {
                return Err(Error::Process(exit));
            }
            if probe().await {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(Error::Process(format!(
                    "{} not ready after {timeout:?}:\n{}",
                    self.name,
                    self.log_tail()
                )));
            }
            tokio::time::sleep(interval).await;
        }
    }

    /// Asks the process to stop (SIGTERM), then kills it after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        signal_group(self.child.id(), "TERM");
        let deadline = std::time::Instant::now() + grace;
        while std::time::Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        signal_group(self.child.id(), "KILL");
        let _ = self.child.wait();
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        if self.watchdog.is_some() {
            self.stop(Duration::from_secs(5));
        }
    }
}

fn signal_group(pgid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([format!("-{signal}"), "--".to_owned(), format!("-{pgid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A shell loop that kills the child's process group once this process is gone. (POSIX `sh` syntax:
/// dash's `kill` takes a negative pid for a group but no `--`.)
fn spawn_watchdog(child_pgid: u32) -> std::io::Result<Child> {
    let parent = std::process::id();
    let script = format!(
        "while kill -0 {parent} 2>/dev/null && kill -0 -{child_pgid} 2>/dev/null; do sleep 1; done; \
         kill -TERM -{child_pgid} 2>/dev/null; sleep 3; kill -KILL -{child_pgid} 2>/dev/null; exit 0"
    );
    let mut command = Command::new("sh");
    command
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    command.spawn()
}
