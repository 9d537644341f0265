//! Which renderer program `cso run` and `cso render` run, and whether it runs: `cso-renderer` (the long-lived
//! engine, `--renderer=engine`) or `helm` (`--renderer=helm`, and `cso render`).
//!
//! The lookup is the one users expect from a program shipped with its helpers (the image puts `cso`,
//! `cso-renderer` and `helm` side by side in `/usr/local/bin`):
//! 1. the explicit value (`--renderer-binary`/`CSO_RENDERER`, `--helm`/`CSO_HELM`): a path is taken as it is,
//!    a bare name is looked up on `PATH` as a shell does; nothing else is tried, so a wrong value is an error
//!    rather than a silent fallback to another binary;
//! 2. else the program beside `cso`'s own executable;
//! 3. else the program on `PATH`.
//!
//! [`locate`] is that order as a pure function (the probe for "is an executable file" is passed in);
//! [`locate_here`] applies it to this process, and [`check_engine_answers`] / [`check_helm_runs`] are the
//! start-up checks of `cso run`, so that a missing or broken renderer stops the process before it reports
//! ready instead of failing every release later.

use std::{
    fmt,
    path::{Path, PathBuf},
    time::Duration,
};

/// A renderer program `cso` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RendererProgram {
    /// `cso-renderer` (hack/renderer): one long-lived process on Helm's engine.
    Engine,
    /// `helm`: a `helm template` process per render.
    Helm,
}

impl RendererProgram {
    /// The file name looked for beside `cso` and on `PATH`.
    pub fn file_name(self) -> &'static str {
        match self {
            RendererProgram::Engine => "cso-renderer",
            RendererProgram::Helm => "helm",
        }
    }

    fn flag(self) -> &'static str {
        match self {
            RendererProgram::Engine => "--renderer-binary",
            RendererProgram::Helm => "--helm",
        }
    }

    fn env(self) -> &'static str {
        match self {
            RendererProgram::Engine => "CSO_RENDERER",
            RendererProgram::Helm => "CSO_HELM",
        }
    }

    /// Where a checkout gets it, and what else there is.
    fn how_to_get_it(self) -> &'static str {
        match self {
            RendererProgram::Engine => {
                "In a checkout of cso, `make tools` builds it into ~/.cache/cso/renderer-<digest>/cso-renderer \
                 and links it into target/debug/ and target/release/ beside cso (again after `cargo clean`); \
                 `bash hack/tools.sh --env` prints its path as CSO_RENDERER. The image ships it beside cso. \
                 Or render with helm instead: --renderer=helm."
            }
            RendererProgram::Helm => {
                "In a checkout of cso, `make tools` builds Helm 3 into ~/.cache/cso/helm-<version>/helm \
                 (`bash hack/tools.sh --env` prints its path as CSO_HELM). The image ships it beside cso."
            }
        }
    }
}

/// Why a candidate was tried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Given by the flag or its environment variable.
    Explicit,
    /// In the directory of `cso`'s own executable.
    BesideExecutable,
    /// In a directory of `PATH`.
    OnPath,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::Explicit => "as given",
            Origin::BesideExecutable => "beside cso",
            Origin::OnPath => "on PATH",
        })
    }
}

/// A place the program may be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub path: PathBuf,
    pub origin: Origin,
}

/// The places to look for `program`, in order, without duplicates. `explicit` is the flag's value (an empty
/// one counts as not given), `exe_dir` the directory of `cso`'s executable, `path_entries` the directories of
/// `PATH` (empty entries, which a shell reads as the current directory, are skipped: the operator does not run
/// programs from wherever it was started).
pub fn candidates(
    program: RendererProgram,
    explicit: Option<&Path>,
    exe_dir: Option<&Path>,
    path_entries: &[PathBuf],
) -> Vec<Candidate> {
    let on_path = |name: &Path| {
        path_entries
            .iter()
            .filter(|dir| !dir.as_os_str().is_empty())
            .map(|dir| Candidate {
                path: dir.join(name),
                origin: Origin::OnPath,
            })
            .collect::<Vec<_>>()
    };
    let found = match explicit.filter(|value| !value.as_os_str().is_empty()) {
        Some(value) if is_bare_name(value) => on_path(value)
            .into_iter()
            .map(|candidate| Candidate {
                origin: Origin::Explicit,
                ..candidate
            })
            .collect(),
        Some(value) => vec![Candidate {
            path: value.to_path_buf(),
            origin: Origin::Explicit,
        }],
        None => {
            let name = Path::new(program.file_name());
            exe_dir
                .map(|dir| Candidate {
                    path: dir.join(name),
                    origin: Origin::BesideExecutable,
                })
                .into_iter()
                .chain(on_path(name))
                .collect()
        }
    };
    let mut unique: Vec<Candidate> = Vec::with_capacity(found.len());
    for candidate in found {
        if !unique.iter().any(|seen| seen.path == candidate.path) {
            unique.push(candidate);
        }
    }
    unique
}

/// A name without a directory (`helm`, not `./helm` or `/usr/bin/helm`): looked up on `PATH`.
fn is_bare_name(value: &Path) -> bool {
    !value.as_os_str().as_encoded_bytes().contains(&b'/')
}

/// The first of [`candidates`] that `is_executable_file` accepts.
pub fn locate(
    program: RendererProgram,
    explicit: Option<&Path>,
    exe_dir: Option<&Path>,
    path_entries: &[PathBuf],
    is_executable_file: impl Fn(&Path) -> bool,
) -> Result<Candidate, NotFound> {
    let candidates = candidates(program, explicit, exe_dir, path_entries);
    match candidates.iter().find(|c| is_executable_file(&c.path)) {
        Some(found) => Ok(found.clone()),
        None => Err(NotFound {
            program,
            explicit: explicit
                .filter(|value| !value.as_os_str().is_empty())
                .map(Path::to_path_buf),
            exe_dir: exe_dir.map(Path::to_path_buf),
            path_entries: path_entries
                .iter()
                .filter(|dir| !dir.as_os_str().is_empty())
                .cloned()
                .collect(),
        }),
    }
}

/// No candidate was an executable file. Its message says where the lookup looked and how to point at the
/// program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotFound {
    pub program: RendererProgram,
    pub explicit: Option<PathBuf>,
    pub exe_dir: Option<PathBuf>,
    pub path_entries: Vec<PathBuf>,
}

impl fmt::Display for NotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let program = self.program;
        let name = program.file_name();
        let (flag, env) = (program.flag(), program.env());
        let path = || {
            if self.path_entries.is_empty() {
                "PATH is empty".to_owned()
            } else {
                let dirs: Vec<String> = self
                    .path_entries
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect();
                format!("PATH is {}", dirs.join(":"))
            }
        };
        match &self.explicit {
            Some(value) if is_bare_name(value) => write!(
                f,
                "{name} was not found: {flag}/{env} names {value:?}, which is not an executable file in any \
                 directory of PATH ({}). Give a path with {flag}=PATH or {env}=PATH.",
                path(),
                value = value.display().to_string(),
            )?,
            Some(value) => write!(
                f,
                "{name} was not found: {flag}/{env} is {}, which is not an executable file. Correct {flag} or \
                 {env}, or leave both unset to use the {name} beside cso or on PATH.",
                value.display()
            )?,
            None => {
                let beside = match &self.exe_dir {
                    Some(dir) => format!("beside cso in {}", dir.display()),
                    None => "beside cso (its directory is unknown)".to_owned(),
                };
                write!(
                    f,
                    "{name} was not found: looked {beside} and on PATH ({}), and {flag}/{env} is not set. \
                     Point at it with {flag}=PATH or {env}=PATH, or put it beside cso or on PATH.",
                    path()
                )?;
            }
        }
        write!(f, " {}", program.how_to_get_it())
    }
}

impl std::error::Error for NotFound {}

/// [`locate`] for this process: beside its executable ([`std::env::current_exe`], symlinks resolved) and on its
/// `PATH`, relative explicit paths taken from the current directory.
pub fn locate_here(program: RendererProgram, explicit: Option<&Path>) -> Result<Candidate, NotFound> {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    let path_entries: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect())
        .unwrap_or_default();
    let mut found = locate(
        program,
        explicit,
        exe_dir.as_deref(),
        &path_entries,
        is_executable_file,
    )?;
    if found.path.is_relative()
        && let Ok(cwd) = std::env::current_dir()
    {
        found.path = cwd.join(&found.path);
    }
    Ok(found)
}

/// A regular file (after symlinks) with an execute bit.
pub fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// How long a start-up check may take: the program starts and answers one trivial request.
pub const START_CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// Starts `cso-renderer` at `binary` and has it template a trivial values file: it runs and speaks cso's
/// protocol. The process is ended afterwards (the operator starts its own at its first render).
pub async fn check_engine_answers(binary: &Path, timeout: Duration) -> anyhow::Result<()> {
    let templater = cso_render::ValuesTemplater::with_engine(cso_render::Engine::new(binary, timeout));
    let answer = templater
        .render(
            Path::new("the start-up check"),
            "check: {{ .check }}\n",
            &serde_json::json!({"check": "ok"}),
        )
        .await;
    drop(templater);
    match answer {
        Ok(values) if values.trim() == "check: ok" => Ok(()),
        Ok(values) => anyhow::bail!(
            "cso-renderer at {} answered a test render with unexpected output {values:?}: is it a \
             cso-renderer built from this version's hack/renderer?",
            binary.display()
        ),
        Err(error) => Err(anyhow::Error::new(error).context(format!(
            "cso-renderer at {} does not work: it failed a test render at start-up",
            binary.display()
        ))),
    }
}

/// Runs `helm version` from `binary`: it starts and exits successfully.
pub async fn check_helm_runs(binary: &Path, timeout: Duration) -> anyhow::Result<()> {
    let run = tokio::process::Command::new(binary)
        .args(["version", "--template", "{{.Version}}"])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let failed = |why: String| anyhow::anyhow!("helm at {} does not work: {why}", binary.display());
    match tokio::time::timeout(timeout, run).await {
        Err(_) => Err(failed(format!(
            "`helm version` did not finish within {timeout:?}"
        ))),
        Ok(Err(error)) => Err(failed(format!("it could not be started: {error}"))),
        Ok(Ok(output)) if !output.status.success() => Err(failed(format!(
            "`helm version` ended with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))),
        Ok(Ok(_)) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(list: &[&str]) -> Vec<PathBuf> {
        list.iter().map(PathBuf::from).collect()
    }

    /// The lookup, table-driven: (what, program, explicit, exe dir, PATH, executable files, expected).
    #[test]
    fn the_renderer_is_found_explicitly_then_beside_cso_then_on_path() {
        type Case<'a> = (
            &'a str,
            RendererProgram,
            Option<&'a str>,
            Option<&'a str>,
            &'a [&'a str],
            &'a [&'a str],
            Option<(&'a str, Origin)>,
        );
        use Origin::*;
        use RendererProgram::{Engine, Helm};
        let cases: &[Case<'_>] = &[
            (
                "an explicit path wins over the one beside cso",
                Engine,
                Some("/opt/r/cso-renderer"),
                Some("/app"),
                &["/usr/bin"],
                &["/opt/r/cso-renderer", "/app/cso-renderer"],
                Some(("/opt/r/cso-renderer", Explicit)),
            ),
            (
                "an explicit path that is not there is not replaced by another",
                Engine,
                Some("/opt/r/cso-renderer"),
                Some("/app"),
                &["/usr/bin"],
                &["/app/cso-renderer", "/usr/bin/cso-renderer"],
                None,
            ),
            (
                "a relative explicit path is a path, not a name",
                Helm,
                Some("bin/helm"),
                Some("/app"),
                &["/usr/bin"],
                &["bin/helm", "/usr/bin/helm"],
                Some(("bin/helm", Explicit)),
            ),
            (
                "an explicit bare name is looked up on PATH only",
                Helm,
                Some("helm3"),
                Some("/app"),
                &["/usr/local/bin", "/usr/bin"],
                &["/app/helm3", "/usr/bin/helm3"],
                Some(("/usr/bin/helm3", Explicit)),
            ),
            (
                "an empty explicit value counts as not given",
                Engine,
                Some(""),
                Some("/app"),
                &["/usr/bin"],
                &["/app/cso-renderer"],
                Some(("/app/cso-renderer", BesideExecutable)),
            ),
            (
                "beside cso comes before PATH",
                Engine,
                None,
                Some("/work/target/debug"),
                &["/usr/bin"],
                &["/work/target/debug/cso-renderer", "/usr/bin/cso-renderer"],
                Some(("/work/target/debug/cso-renderer", BesideExecutable)),
            ),
            (
                "then PATH, in its order",
                Helm,
                None,
                Some("/app"),
                &["/usr/local/bin", "", "/usr/bin"],
                &["/usr/bin/helm", "/usr/local/bin/helm"],
                Some(("/usr/local/bin/helm", OnPath)),
            ),
            (
                "the other program's file does not count",
                Helm,
                None,
                Some("/app"),
                &["/usr/bin"],
                &["/app/cso-renderer", "/usr/bin/cso-renderer"],
                None,
            ),
            (
                "nowhere, with an empty PATH",
                Engine,
                None,
                Some("/tmp/copy"),
                &[],
                &["/elsewhere/cso-renderer"],
                None,
            ),
        ];
        for (what, program, explicit, exe_dir, path, executable, expected) in cases {
            let found = locate(
                *program,
                explicit.map(Path::new),
                exe_dir.map(Path::new),
                &paths(path),
                |candidate| executable.iter().any(|e| Path::new(e) == candidate),
            );
            let found = found.ok().map(|c| (c.path, c.origin));
            let expected = expected.map(|(path, origin)| (PathBuf::from(path), origin));
            assert_eq!(found, expected, "{what}");
        }
    }

    #[test]
    fn candidates_are_in_order_without_duplicates_or_the_current_directory() {
        let found = candidates(
            RendererProgram::Engine,
            None,
            Some(Path::new("/usr/local/bin")),
            &paths(&["/usr/local/bin", "", "/usr/bin"]),
        );
        assert_eq!(
            found,
            [
                Candidate {
                    path: "/usr/local/bin/cso-renderer".into(),
                    origin: Origin::BesideExecutable
                },
                Candidate {
                    path: "/usr/bin/cso-renderer".into(),
                    origin: Origin::OnPath
                },
            ]
        );
    }

    #[test]
    fn not_found_says_where_it_looked_and_how_to_point_at_it() {
        let nowhere = |_: &Path| false;
        let message = locate(
            RendererProgram::Engine,
            None,
            Some(Path::new("/tmp/copy")),
            &paths(&["/usr/bin", "/bin"]),
            nowhere,
        )
        .unwrap_err()
        .to_string();
        for part in [
            "cso-renderer was not found",
            "beside cso in /tmp/copy",
            "PATH is /usr/bin:/bin",
            "--renderer-binary=PATH",
            "CSO_RENDERER=PATH",
            "make tools",
            "--renderer=helm",
        ] {
            assert!(message.contains(part), "{part:?} in: {message}");
        }

        let empty_path = locate(RendererProgram::Helm, None, Some(Path::new("/app")), &[], nowhere)
            .unwrap_err()
            .to_string();
        assert!(empty_path.starts_with("helm was not found"), "{empty_path}");
        assert!(empty_path.contains("PATH is empty"), "{empty_path}");
        assert!(
            empty_path.contains("--helm=PATH or CSO_HELM=PATH"),
            "{empty_path}"
        );

        let wrong = locate(
            RendererProgram::Engine,
            Some(Path::new("/opt/missing/cso-renderer")),
            Some(Path::new("/app")),
            &[],
            nowhere,
        )
        .unwrap_err()
        .to_string();
        assert!(
            wrong.contains("--renderer-binary/CSO_RENDERER is /opt/missing/cso-renderer"),
            "{wrong}"
        );
    }

    #[test]
    fn only_regular_files_with_an_execute_bit_count() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "#!/bin/sh\n").unwrap();
        let runnable = dir.path().join("runnable");
        std::fs::write(&runnable, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&runnable, std::fs::Permissions::from_mode(0o755)).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&runnable, &link).unwrap();
        assert!(is_executable_file(&runnable));
        assert!(is_executable_file(&link), "a symlink to one counts");
        assert!(!is_executable_file(&plain));
        assert!(!is_executable_file(dir.path()), "a directory does not");
        assert!(!is_executable_file(&dir.path().join("missing")));
    }
}
