//! Child processes (etcd, kube-apiserver, a registry) that never outlive the process that started them.
//!
//! Each child runs in its own process group. It is killed when its [`Supervised`] guard drops, and a small
//! watchdog (`sh`, also in its own group) kills it when the parent process dies without dropping the guard:
//! a panicking test or a `static` control plane leaves nothing behind, neither processes nor (when asked)
//! their data directory. (A parent-death signal would need `unsafe` `pre_exec`, which this workspace forbids.)
//!
//! A child that exited can be started again in its place ([`Supervised::restart`], as a Deployment restarts its
//! pod's container): its output goes on in the same log, after a line that marks the restart.

use std::{
    fs::File,
    io::Write,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
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
    orphan_dir: Option<PathBuf>,
}

impl Supervised {
    /// Starts `command`, with stdout and stderr going to `log`. When the parent dies without dropping the
    /// guard, the watchdog kills the child and then removes `orphan_dir` (the child's temporary data
    /// directory, which a `static` owner's destructor never gets to remove).
    pub fn spawn(name: &str, command: Command, log: &Path, orphan_dir: Option<&Path>) -> Result<Self, Error> {
        let out = File::create(log).map_err(|e| Error::io(log, e))?;
        let (child, watchdog) = launch(name, command, out, orphan_dir)?;
        Ok(Supervised {
            name: name.to_owned(),
            child,
            watchdog,
            log: log.to_path_buf(),
            orphan_dir: orphan_dir.map(Path::to_path_buf),
        })
    }

    /// Starts `command` in place of the process, which must have exited: its output is appended to the same
    /// log after a line `--- <name> restarted ---`, and a new watchdog guards it. (The old watchdog removes
    /// the `orphan_dir` a few seconds after the old process exited: restart only processes that keep no state
    /// there, such as Cluster API's managers, which have none.)
    pub fn restart(&mut self, command: Command) -> Result<(), Error> {
        if self.exit_status().is_none() {
            return Err(Error::Process(format!("{} still runs: not restarted", self.name)));
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        let mut out = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&self.log)
            .map_err(|e| Error::io(&self.log, e))?;
        writeln!(out, "--- {} restarted ---", self.name).map_err(|e| Error::io(&self.log, e))?;
        let (child, watchdog) = launch(&self.name, command, out, self.orphan_dir.as_deref())?;
        self.child = child;
        self.watchdog = watchdog;
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// How the process ended, once it has.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
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

/// Starts `command` in a process group of its own with stdout and stderr going to `out`, and its watchdog.
fn launch(
    name: &str,
    mut command: Command,
    out: File,
    orphan_dir: Option<&Path>,
) -> Result<(Child, Option<Child>), Error> {
    let err = out
        .try_clone()
        .map_err(|e| Error::Process(format!("failed to start {name}: {e}")))?;
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let child = command
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| Error::Process(format!("failed to start {name}: {e}")))?;
    let watchdog = spawn_watchdog(std::process::id(), child.id(), orphan_dir).ok();
    Ok((child, watchdog))
}

fn signal_group(pgid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([format!("-{signal}"), "--".to_owned(), format!("-{pgid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A shell loop that kills the child's process group once `parent` is gone, then removes `orphan_dir`
/// (passed as `$1`, so no quoting is involved). (POSIX `sh` syntax: dash's `kill` takes a negative pid for
/// a group but no `--`.)
fn spawn_watchdog(parent: u32, child_pgid: u32, orphan_dir: Option<&Path>) -> std::io::Result<Child> {
    let script = format!(
        "while kill -0 {parent} 2>/dev/null && kill -0 -{child_pgid} 2>/dev/null; do sleep 1; done; \
         kill -TERM -{child_pgid} 2>/dev/null; sleep 3; kill -KILL -{child_pgid} 2>/dev/null; \
         if [ -n \"$1\" ]; then rm -rf -- \"$1\"; fi; exit 0"
    );
    let mut command = Command::new("sh");
    command
        .args(["-c", &script, "cso-watchdog"])
        .arg(orphan_dir.map(Path::as_os_str).unwrap_or_default())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    command.spawn()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    fn sleeper(own_group: bool) -> Child {
        let mut command = Command::new("sleep");
        command.arg("600");
        if own_group {
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
        }
        command.spawn().unwrap()
    }

    fn alive(pid: u32) -> bool {
        Command::new("kill")
            .args(["-0", &pid.to_string()])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Polls `done` for up to 20 s (the watchdog checks every second and gives a 3 s grace period).
    fn eventually(mut done: impl FnMut() -> bool) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if done() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    #[test]
    fn watchdog_kills_the_child_and_removes_its_directory_when_the_parent_dies() {
        let dir = tempfile::tempdir().unwrap().keep();
        std::fs::write(dir.join("data"), "x").unwrap();
        let mut parent = sleeper(false);
        let mut child = sleeper(true);
        let mut watchdog = spawn_watchdog(parent.id(), child.id(), Some(&dir)).unwrap();

        std::thread::sleep(Duration::from_millis(1500));
        assert!(alive(child.id()), "the child must live while its parent does");
        assert!(dir.exists(), "the directory must stay while its parent lives");

        parent.kill().unwrap();
        parent.wait().unwrap();
        assert!(
            eventually(|| matches!(child.try_wait(), Ok(Some(_)))),
            "the child outlived its parent"
        );
        assert!(eventually(|| !dir.exists()), "{} was left behind", dir.display());
        watchdog.wait().unwrap();
    }

    fn shell(script: &str) -> Command {
        let mut command = Command::new("sh");
        command.args(["-c", script]);
        command
    }

    #[test]
    fn an_exited_process_is_restarted_in_place_and_its_log_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("flaky.log");
        let mut process = Supervised::spawn("flaky", shell("echo first run; exit 3"), &log, None).unwrap();
        assert!(
            eventually(|| process.exit_status().is_some()),
            "the first run ends on its own"
        );
        assert_eq!(process.exit_status().unwrap().code(), Some(3));

        process.restart(shell("echo second run; exec sleep 600")).unwrap();
        assert!(
            eventually(|| process.log_tail().contains("second run")),
            "{}",
            process.log_tail()
        );
        assert_eq!(process.exit_status(), None, "the second run goes on");
        assert_eq!(
            process.log_tail(),
            "first run\n--- flaky restarted ---\nsecond run",
            "one log for both runs"
        );
        let refused = process.restart(shell("echo third run")).unwrap_err();
        assert!(refused.to_string().contains("still runs"), "{refused}");

        let pid = process.pid();
        drop(process);
        assert!(!alive(pid), "dropping the guard stops the restarted process");
    }

    #[test]
    fn watchdog_without_a_directory_still_kills_the_child() {
        let mut parent = sleeper(false);
        let mut child = sleeper(true);
        let mut watchdog = spawn_watchdog(parent.id(), child.id(), None).unwrap();
        parent.kill().unwrap();
        parent.wait().unwrap();
        assert!(eventually(|| matches!(child.try_wait(), Ok(Some(_)))));
        watchdog.wait().unwrap();
    }
}
