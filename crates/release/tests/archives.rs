//! Hostile and broken archives: each is refused with its own error, nothing is written outside the target
//! directory, nothing panics; good archives unpack completely and atomically. The same hostile archives
//! inside a release on disk (`--local`, or a cache an earlier process left) make the release refused
//! before its first use, while a good release beside it loads.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{
    io::Write,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use cso_api::ReleaseId;
use cso_release::{
    CacheError, ReleaseCache, ReleaseError, ReleaseSource, SourceError,
    archive::{self, ArchiveError, UnpackLimits},
    source::local::LocalSource,
};
use flate2::{Compression, write::GzEncoder};
use futures::future::BoxFuture;

/// One tar entry, written byte by byte so that unsafe names and types can be expressed.
enum Entry<'a> {
    File(&'a str, &'a [u8]),
    Dir(&'a str),
    Symlink(&'a str, &'a str),
    HardLink(&'a str, &'a str),
    Fifo(&'a str),
}

fn header(name: &str, kind: tar::EntryType, size: u64, link: Option<&str>) -> tar::Header {
    let mut h = tar::Header::new_old();
    let raw = h.as_old_mut();
    raw.name[..name.len()].copy_from_slice(name.as_bytes());
    if let Some(link) = link {
        raw.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_cksum();
    h
}

fn tar_bytes(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::new();
    for entry in entries {
        let (h, data): (tar::Header, &[u8]) = match entry {
            Entry::File(n, d) => (header(n, tar::EntryType::Regular, d.len() as u64, None), d),
            Entry::Dir(n) => (header(n, tar::EntryType::Directory, 0, None), b""),
            Entry::Symlink(n, t) => (header(n, tar::EntryType::Symlink, 0, Some(t)), b""),
            Entry::HardLink(n, t) => (header(n, tar::EntryType::Link, 0, Some(t)), b""),
            Entry::Fifo(n) => (header(n, tar::EntryType::Fifo, 0, None), b""),
        };
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// Unpacks into `<tmp>/sandbox/out` and checks that nothing appeared outside `out`, and nothing at all on error.
fn unpack_in_sandbox(
    bytes: &[u8],
    limits: UnpackLimits,
) -> (Result<archive::Unpacked, ArchiveError>, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let archive_path = tmp.path().join("a.tgz");
    std::fs::write(&archive_path, bytes).unwrap();
    let sandbox = tmp.path().join("sandbox");
    std::fs::create_dir(&sandbox).unwrap();
    let result = archive::unpack(&archive_path, &sandbox.join("out"), limits);
    let names = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    };
    let beside: Vec<String> = names(&sandbox).into_iter().filter(|n| n != "out").collect();
    assert!(
        beside.is_empty(),
        "nothing but the target may appear beside it: {beside:?}"
    );
    let outside: Vec<String> = names(tmp.path())
        .into_iter()
        .filter(|n| n != "a.tgz" && n != "sandbox")
        .collect();
    assert!(
        outside.is_empty(),
        "nothing may be written outside the sandbox: {outside:?}"
    );
    if result.is_err() {
        assert!(
            !sandbox.join("out").exists(),
            "a refused archive leaves no target directory"
        );
    }
    (result, tmp)
}

fn refused(entries: &[Entry], expected: &str) {
    let (result, _tmp) = unpack_in_sandbox(&gzip(&tar_bytes(entries)), UnpackLimits::default());
    let message = result.expect_err(expected).to_string();
    assert!(message.contains(expected), "expected {expected:?} in: {message}");
}

#[test]
fn path_traversal_is_refused() {
    refused(
        &[Entry::File("ok.txt", b"x"), Entry::File("../evil.txt", b"x")],
        "\"../evil.txt\": contains `..`",
    );
    refused(&[Entry::File("a/../../evil.txt", b"x")], "contains `..`");
}

#[test]
fn absolute_paths_are_refused() {
    refused(
        &[Entry::File("/tmp/evil.txt", b"x")],
        "\"/tmp/evil.txt\": is an absolute path",
    );
}

#[test]
fn symlink_escapes_are_refused() {
    refused(
        &[Entry::Symlink("link", "../../etc")],
        "\"link\": symbolic link points outside its directory",
    );
    refused(
        &[Entry::Symlink("link", "/etc/passwd")],
        "symbolic link points outside its directory",
    );
    // A link that goes down is fine; writing through any link is not.
    refused(
        &[
            Entry::Dir("d/"),
            Entry::Symlink("l", "d"),
            Entry::File("l/x", b"x"),
        ],
        "\"l/x\": would be written through a link",
    );
}

#[test]
fn hard_link_escapes_are_refused() {
    refused(
        &[Entry::HardLink("h", "../../etc/passwd")],
        "\"h\": hard link points outside the archive",
    );
    refused(
        &[Entry::HardLink("h", "not-in-archive")],
        "hard link to something that is not a file of this archive",
    );
}

#[test]
fn special_files_and_duplicates_are_refused() {
    refused(
        &[Entry::Fifo("pipe")],
        "\"pipe\": is a device, FIFO or other special file",
    );
    refused(
        &[Entry::File("a", b"1"), Entry::File("a", b"2")],
        "\"a\": appears twice",
    );
}

#[test]
fn gzip_bombs_hit_the_limits() {
    let zeros = vec![0u8; 4 << 20];
    let limits = UnpackLimits {
        max_total_bytes: 1 << 20,
        max_files: 100,
        max_file_bytes: 8 << 20,
    };
    let (result, _tmp) = unpack_in_sandbox(&gzip(&tar_bytes(&[Entry::File("zeros", &zeros)])), limits);
    let message = result.unwrap_err().to_string();
    assert!(message.contains("exceeds the limit"), "{message}");

    let limits = UnpackLimits {
        max_total_bytes: 64 << 20,
        max_files: 100,
        max_file_bytes: 1 << 20,
    };
    let (result, _tmp) = unpack_in_sandbox(&gzip(&tar_bytes(&[Entry::File("big", &zeros)])), limits);
    assert!(result.unwrap_err().to_string().contains("entry \"big\""));

    // Zeros beyond the tar end marker: the stream limit catches them too.
    let mut bomb = tar_bytes(&[Entry::File("small", b"x")]);
    bomb.extend(std::iter::repeat_n(0u8, 8 << 20));
    let limits = UnpackLimits {
        max_total_bytes: 1 << 20,
        max_files: 10,
        max_file_bytes: 1 << 20,
    };
    let (result, _tmp) = unpack_in_sandbox(&gzip(&bomb), limits);
    assert!(result.unwrap_err().to_string().contains("exceeds the limit"));

    let many: Vec<String> = (0..20).map(|i| format!("f{i}")).collect();
    let entries: Vec<Entry> = many.iter().map(|n| Entry::File(n, b"x")).collect();
    let limits = UnpackLimits {
        max_total_bytes: 1 << 20,
        max_files: 10,
        max_file_bytes: 1 << 20,
    };
    let (result, _tmp) = unpack_in_sandbox(&gzip(&tar_bytes(&entries)), limits);
    assert!(
        result
            .unwrap_err()
            .to_string()
            .contains("the number of files exceeds the limit of 10")
    );
}

#[test]
fn truncated_and_corrupt_gzip_are_refused() {
    let good = gzip(&tar_bytes(&[
        Entry::File("chart/Chart.yaml", b"name: x\n"),
        Entry::File("chart/values.yaml", b"{}\n"),
    ]));
    for cut in [good.len() / 2, good.len() - 4] {
        let (result, _tmp) = unpack_in_sandbox(&good[..cut], UnpackLimits::default());
        let message = result.unwrap_err().to_string();
        assert!(
            message.contains("corrupt or truncated"),
            "cut at {cut}: {message}"
        );
    }
    let mut flipped = good.clone();
    let crc = flipped.len() - 6;
    flipped[crc] ^= 0xff;
    let (result, _tmp) = unpack_in_sandbox(&flipped, UnpackLimits::default());
    assert!(result.unwrap_err().to_string().contains("corrupt or truncated"));
    let (result, _tmp) = unpack_in_sandbox(b"this is not gzip", UnpackLimits::default());
    assert!(result.unwrap_err().to_string().contains("corrupt or truncated"));
}

#[test]
fn good_archives_unpack_with_links_that_stay_inside() {
    let entries = [
        Entry::Dir("chart/"),
        Entry::File("chart/Chart.yaml", b"name: x\n"),
        Entry::Dir("chart/templates/"),
        Entry::File("chart/templates/a.yaml", b"kind: A\n"),
        Entry::Symlink("chart/current", "templates"),
        Entry::HardLink("chart/copy.yaml", "chart/Chart.yaml"),
        Entry::Dir("other/"),
    ];
    let (result, tmp) = unpack_in_sandbox(&gzip(&tar_bytes(&entries)), UnpackLimits::default());
    let unpacked = result.unwrap();
    assert_eq!(unpacked.top_level, ["chart", "other"]);
    let out = tmp.path().join("sandbox/out");
    assert_eq!(
        std::fs::read_to_string(out.join("chart/current/a.yaml")).unwrap(),
        "kind: A\n"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("chart/copy.yaml")).unwrap(),
        "name: x\n"
    );
}

#[test]
fn every_fixture_archive_unpacks() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases");
    let mut count = 0;
    for release in std::fs::read_dir(&fixtures).unwrap() {
        for file in std::fs::read_dir(release.unwrap().path()).unwrap() {
            let path = file.unwrap().path();
            if path.extension().is_some_and(|e| e == "tgz") {
                let out = tempfile::tempdir().unwrap();
                let unpacked = archive::unpack(&path, &out.path().join("x"), UnpackLimits::default())
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                assert!(unpacked.files > 0, "{}", path.display());
                count += 1;
            }
        }
    }
    assert!(count >= 11, "all fixture archives were read ({count})");
}

/// The five hostile entries the hostile run found rendered, each with the reason it must be refused for.
fn hostile_variants() -> Vec<(&'static str, Vec<Entry<'static>>, &'static str)> {
    vec![
        (
            "absolute path",
            vec![Entry::File("/tmp/evil.yaml", b"kind: Evil\n")],
            "\"/tmp/evil.yaml\": is an absolute path",
        ),
        (
            "dot-dot path",
            vec![Entry::File("chart/../../evil.yaml", b"kind: Evil\n")],
            "contains `..`",
        ),
        (
            "escaping symlink",
            vec![Entry::Symlink(
                "chart/templates/evil.yaml",
                "../../../../etc/passwd",
            )],
            "symbolic link points outside its directory",
        ),
        (
            "hard link",
            vec![Entry::HardLink("chart/templates/evil.yaml", "/etc/passwd")],
            "hard link points outside the archive",
        ),
        (
            "fifo",
            vec![Entry::Fifo("chart/templates/pipe")],
            "is a device, FIFO or other special file",
        ),
    ]
}

/// A chart archive: a good chart with `extra` entries after it.
fn chart_tgz(extra: &[Entry]) -> Vec<u8> {
    let mut entries = vec![
        Entry::Dir("chart/"),
        Entry::File(
            "chart/Chart.yaml",
            b"apiVersion: v2\nname: chart\nversion: 0.1.0\n",
        ),
        Entry::Dir("chart/templates/"),
        Entry::File("chart/templates/a.yaml", b"kind: A\n"),
    ];
    for entry in extra {
        entries.push(match entry {
            Entry::File(n, d) => Entry::File(n, d),
            Entry::Dir(n) => Entry::Dir(n),
            Entry::Symlink(n, t) => Entry::Symlink(n, t),
            Entry::HardLink(n, t) => Entry::HardLink(n, t),
            Entry::Fifo(n) => Entry::Fifo(n),
        });
    }
    gzip(&tar_bytes(&entries))
}

fn good_release() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/releases/docker-ferrol-1-27-v1")
}

/// Writes release `docker-ferrol-1-27-v<version>` into `stacks`: the good fixture's metadata and values,
/// the given archives.
fn write_release(stacks: &Path, version: u32, class: &[u8], addon: &[u8]) -> ReleaseId {
    let tag = format!("docker-ferrol-1-27-v{version}");
    let dir = stacks.join(&tag);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("metadata.yaml"),
        format!(
            "versions: {{clusterStack: v{version}, kubernetes: v1.27.3, components: {{clusterAddon: v1}}}}"
        ),
    )
    .unwrap();
    std::fs::copy(
        good_release().join("cluster-addon-values.yaml"),
        dir.join("cluster-addon-values.yaml"),
    )
    .unwrap();
    std::fs::write(
        dir.join(format!("docker-ferrol-1-27-cluster-class-v{version}.tgz")),
        class,
    )
    .unwrap();
    std::fs::write(dir.join("docker-ferrol-1-27-cluster-addon-v1.tgz"), addon).unwrap();
    ReleaseId::parse_tag(&tag).unwrap()
}

/// A release directory with the good fixture (v1) and, for every hostile variant, one release whose
/// cluster-class chart holds it and one whose addon archive does. Returns the hostile releases with the
/// archive that is bad and the expected reason.
fn hostile_release_dir(release_dir: &Path) -> Vec<(ReleaseId, String, &'static str)> {
    let stacks = release_dir.join("cluster-stacks");
    cso_release::release::copy_release_dir(&good_release(), &stacks.join("docker-ferrol-1-27-v1")).unwrap();
    let good_chart = chart_tgz(&[]);
    let mut hostile = Vec::new();
    let mut version = 2;
    for (_, entries, reason) in hostile_variants() {
        let bad = chart_tgz(&entries);
        let id = write_release(&stacks, version, &bad, &good_chart);
        hostile.push((
            id,
            format!("docker-ferrol-1-27-cluster-class-v{version}.tgz"),
            reason,
        ));
        let id = write_release(&stacks, version + 1, &good_chart, &bad);
        hostile.push((id, "docker-ferrol-1-27-cluster-addon-v1.tgz".to_owned(), reason));
        version += 2;
    }
    hostile
}

fn assert_refused(result: Result<impl std::fmt::Debug, CacheError>, file: &str, reason: &str) {
    let error = result.expect_err(file);
    assert!(
        matches!(
            error,
            CacheError::Release {
                error: ReleaseError::Archive(ArchiveError::UnsafeEntry { .. }),
                ..
            }
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains(file),
        "the error names the file {file}: {message}"
    );
    assert!(
        message.contains(reason),
        "the error gives the reason {reason:?}: {message}"
    );
}

#[tokio::test]
async fn hostile_archives_in_a_local_release_are_refused_and_a_good_release_still_loads() {
    let release_dir = tempfile::tempdir().unwrap();
    let hostile = hostile_release_dir(release_dir.path());
    let cache = ReleaseCache::new(
        release_dir.path(),
        Arc::new(LocalSource::new(release_dir.path().join("cluster-stacks"))),
        UnpackLimits::default(),
    )
    .unwrap();
    assert_eq!(cache.source().list_tags().await.unwrap().len(), 11);
    for (id, file, reason) in &hostile {
        assert_refused(cache.get(id).await, file, reason);
        assert_refused(cache.cached(id), file, reason);
    }
    let good = ReleaseId::parse_tag("docker-ferrol-1-27-v1").unwrap();
    let release = cache.get(&good).await.unwrap();
    assert!(
        Arc::ptr_eq(&release, &cache.cached(&good).unwrap().unwrap()),
        "checked once, then remembered"
    );
    assert!(!release_dir.path().join("evil.yaml").exists());
    assert!(!Path::new("/tmp/evil.yaml").exists());
}

/// A remote source that must not be asked: the releases are in the cache already.
#[derive(Debug, Default)]
struct Remote {
    asked: AtomicUsize,
}

impl ReleaseSource for Remote {
    fn kind(&self) -> &'static str {
        "remote"
    }

    fn list_tags(&self) -> BoxFuture<'_, Result<Vec<String>, SourceError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn download<'a>(
        &'a self,
        tag: &'a str,
        _dest: &'a Path,
        _pin: Option<&'a str>,
    ) -> BoxFuture<'a, Result<cso_release::source::Provenance, SourceError>> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            Err(SourceError::NotFound {
                what: format!("{tag} (this test downloads nothing)"),
            })
        })
    }
}

#[tokio::test]
async fn hostile_archives_in_the_cache_after_a_restart_are_refused_and_a_good_release_still_loads() {
    // What an earlier process left in the cache, or what was put there behind its back: this process
    // has not verified any of it.
    let release_dir = tempfile::tempdir().unwrap();
    let hostile = hostile_release_dir(release_dir.path());
    let remote = Arc::new(Remote::default());
    let cache = ReleaseCache::new(release_dir.path(), remote.clone(), UnpackLimits::default()).unwrap();
    for (id, file, reason) in &hostile {
        assert_refused(cache.cached(id), file, reason);
        assert_refused(cache.get(id).await, file, reason);
    }
    let good = ReleaseId::parse_tag("docker-ferrol-1-27-v1").unwrap();
    let release = cache.get(&good).await.unwrap();
    assert_eq!(release.metadata.cluster_stack.to_dot(), "v1");
    assert_eq!(remote.asked.load(Ordering::SeqCst), 0, "nothing was downloaded");

    // A file changed after the check is checked again: the good release turned hostile is refused...
    let chart = release.cluster_class_chart.clone();
    std::fs::write(&chart, chart_tgz(&[Entry::Fifo("chart/pipe")])).unwrap();
    assert_refused(
        cache.cached(&good),
        "docker-ferrol-1-27-cluster-class-v1.tgz",
        "FIFO",
    );
    // ...and a hostile release that was repaired loads.
    let (id, _, _) = &hostile[0];
    let class = cache.path(id).join("docker-ferrol-1-27-cluster-class-v2.tgz");
    std::fs::write(
        &class,
        chart_tgz(&[Entry::File("chart/templates/b.yaml", b"kind: B\n")]),
    )
    .unwrap();
    cache.cached(id).unwrap().unwrap();
}

#[test]
fn a_truncated_archive_in_the_cache_is_refused() {
    let release_dir = tempfile::tempdir().unwrap();
    let stacks = release_dir.path().join("cluster-stacks");
    let good = chart_tgz(&[]);
    let id = write_release(&stacks, 2, &good[..good.len() / 2], &good);
    let cache = ReleaseCache::new(
        release_dir.path(),
        Arc::new(Remote::default()),
        UnpackLimits::default(),
    )
    .unwrap();
    let message = cache.cached(&id).unwrap_err().to_string();
    assert!(
        message.contains("docker-ferrol-1-27-cluster-class-v2.tgz: corrupt or truncated"),
        "{message}"
    );
}
