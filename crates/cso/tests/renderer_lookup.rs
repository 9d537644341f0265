//! How `cso run` finds its renderer, as a process against a real API server: with no `CSO_RENDERER`, nothing
//! beside its executable and nothing on `PATH` it refuses to start, at once, saying where it looked and how to
//! point at it; with `cso-renderer` beside a copy of `cso` (as in the image) it renders without being told
//! where, and `/metrics` shows the memory of the operator and of its renderer process.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use cso_api::ClusterStack;
use kube::{Api, api::PostParams};

mod support;

use support::*;

/// A directory holding `cso` alone (a hard link to the test's binary, else a copy), and an empty directory to
/// serve as `PATH`. Inside the target directory, so that the link works and nothing of the machine's `PATH`
/// leaks in. `std::env::current_exe` of the linked binary is the link, so `target/debug/` (where
/// `make tools` links the renderer) is not where it looks.
struct LoneCso {
    dir: tempfile::TempDir,
}

impl LoneCso {
    fn new() -> Self {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        std::fs::create_dir(dir.path().join("empty-path")).unwrap();
        let original = Path::new(env!("CARGO_BIN_EXE_cso"));
        let lone = dir.path().join("bin/cso");
        if std::fs::hard_link(original, &lone).is_err() {
            std::fs::copy(original, &lone).unwrap();
        }
        LoneCso { dir }
    }

    fn cso(&self) -> PathBuf {
        self.dir.path().join("bin/cso")
    }

    fn bin_dir(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    /// A `PATH` with one empty directory.
    fn empty_path(&self) -> PathBuf {
        self.dir.path().join("empty-path")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_renderer_anywhere_cso_run_refuses_to_start_and_says_where_it_looked() {
    let plane = cso_testenv::shared_management();
    let lone = LoneCso::new();
    let scratch = tempfile::tempdir().unwrap();
    let certs = scratch.path().join("certs");
    cso_testenv::pki::write_serving_certificate(&certs).unwrap();
    let instance = Instance::new(&certs, false);

    for (what, extra, refusal, how_to_point) in [
        (
            "the engine (default)",
            &[][..],
            "cso-renderer was not found",
            "--renderer-binary=PATH or CSO_RENDERER=PATH",
        ),
        (
            "helm",
            &["--renderer=helm"][..],
            "helm was not found",
            "--helm=PATH or CSO_HELM=PATH",
        ),
    ] {
        let mut command = operator_command(
            &lone.cso(),
            plane.kubeconfig_path(),
            scratch.path(),
            Some("default"),
            &Source::Github("http://127.0.0.1:1"),
            &scratch.path().join("unused.log"),
            &instance,
            extra,
        );
        command
            .env_remove("CSO_RENDERER")
            .env_remove("CSO_HELM")
            .env_remove("CSO_RENDER_WITH")
            .env("PATH", lone.empty_path())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let mut process = KillOnDrop(command.spawn().unwrap());
        let status = loop {
            if let Some(status) = process.0.try_wait().unwrap() {
                break status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{what}: cso run without a renderer did not exit within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let took = started.elapsed();
        let mut stderr = String::new();
        std::io::Read::read_to_string(process.0.stderr.as_mut().unwrap(), &mut stderr).unwrap();

        assert!(!status.success(), "{what}: exits non-zero: {status}\n{stderr}");
        for part in [
            refusal,
            &format!("beside cso in {}", lone.bin_dir().display()),
            &format!("PATH is {}", lone.empty_path().display()),
            how_to_point,
            "make tools",
        ] {
            assert!(stderr.contains(part), "{what}: says {part:?}:\n{stderr}");
        }
        for never in ["serving HTTP", "starting controllers"] {
            assert!(
                !stderr.contains(never),
                "{what}: refused before anything serves or leads, but logged {never:?}:\n{stderr}"
            );
        }
        println!("{what}: refused in {took:?}:\n{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_renderer_beside_cso_it_renders_unprompted_and_its_memory_is_exported() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "renderer-beside").await.unwrap();
    let fake = github_with_ferrol().await;
    let lone = LoneCso::new();
    let renderer = cso_testenv::Tools::discover()
        .unwrap()
        .renderer
        .expect("cso-renderer: run `make tools`");
    let beside = lone.bin_dir().join("cso-renderer");
    std::os::unix::fs::symlink(&renderer, &beside).unwrap();

    let scratch = tempfile::tempdir().unwrap();
    let certs = scratch.path().join("certs");
    cso_testenv::pki::write_serving_certificate(&certs).unwrap();
    let release_dir = scratch.path().join("releases");
    std::fs::create_dir_all(&release_dir).unwrap();
    let log = scratch.path().join("cso.log");
    let instance = Instance::new(&certs, false);
    let mut command = operator_command(
        &lone.cso(),
        plane.kubeconfig_path(),
        &release_dir,
        Some(&ns),
        &Source::Github(fake.api_url()),
        &log,
        &instance,
        &[],
    );
    command
        .env_remove("CSO_RENDERER")
        .env_remove("CSO_RENDER_WITH")
        .env("PATH", lone.empty_path());
    let mut operator = KillOnDrop(command.spawn().unwrap());

    Api::<ClusterStack>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &ferrol_stack(&ns, &["v1"]))
        .await
        .unwrap();
    wait_for("v1 ready", Duration::from_secs(90), || async {
        (ready(&client, &ns).await == ["docker-ferrol-1-27-v1"]).then_some(())
    })
    .await;

    let checked = logged(&log, "renderer checked: it answers").expect("the start-up check is logged");
    assert_eq!(checked["found"], "beside cso", "{checked}");
    assert_eq!(checked["path"], beside.display().to_string(), "{checked}");

    let text = metrics_text(instance.metrics_port).await;
    let value = |name: &str| metric_sum(&text, name, &[]);
    for name in [
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_start_time_seconds",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_max_fds",
        "cso_renderer_resident_memory_bytes",
    ] {
        assert!(value(name) > 0.0, "{name} = {}:\n{text}", value(name));
    }
    let resident = value("process_resident_memory_bytes");
    assert!(
        resident > 5e6 && resident < 2e9,
        "the operator's resident memory is plausible: {resident}"
    );
    let renderer_resident = value("cso_renderer_resident_memory_bytes");
    assert!(
        renderer_resident > 5e6 && renderer_resident < 2e9,
        "the renderer's resident memory is plausible: {renderer_resident}"
    );
    assert!(value("process_open_fds") <= value("process_max_fds"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = value("process_start_time_seconds");
    assert!(
        started > now - 600.0 && started <= now + 1.0,
        "started during this test: {started} (now {now})"
    );
    println!(
        "operator resident {:.1} MiB, renderer resident {:.1} MiB",
        resident / 1048576.0,
        renderer_resident / 1048576.0
    );
    assert!(terminate(&mut operator).success());
}
