//! Hostile and broken archives: each is refused with its own error, nothing is written outside the target
//! directory, nothing panics; good archives unpack completely and atomically.
#![allow(clippy::unwrap_used, reason = "a test file: a failed unwrap is a failed test")]

use std::{io::Write, path::Path};

use cso_release::archive::{self, ArchiveError, UnpackLimits};
use flate2::{Compression, write::GzEncoder};

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
