//! Benchmark: what verifying a release's cosign signature costs (issue 17).
//!
//! 1. `OciSource::download` of `docker-ferrol-1-27-v1` from the real distribution registry on loopback,
//!    without keys and with one trusted key, for a release signed in cosign's bundle layout and one signed in
//!    the legacy `.sig` layout (each in a repository of its own). Plain and verifying downloads alternate
//!    (the order flips every round), so the cost reported is the median of the paired differences as well as
//!    the difference of the medians. The HTTP requests verification adds are counted from the registry's own
//!    access log (one download of each kind, the verifying one's requests minus the plain one's) and listed.
//! 2. The pure checks `verify::check_bundle` and `verify::check_legacy` on cosign's own output
//!    (crates/release/tests/fixtures/cosign): P-256, P-384 and RSA keys, per call.
//! 3. A refusal: an unsigned release with a key configured, against a plain download of the same release; the
//!    refusal must leave the destination empty (no layer downloaded).
//!
//! Parts 1 and 3 need cosign (`CSO_COSIGN`, from `bash hack/tools.sh --env`, or the tools' env file that
//! `Cosign::from_env` falls back to) and are skipped with a message without it; part 2 needs nothing. One
//! long-lived source per configuration, as in the operator; no pin.
//!
//! `cargo bench -p cso-release --bench verify_release` (results are written up in docs/benchmarks.md).
#![allow(clippy::unwrap_used, reason = "a benchmark: a failed unwrap is a failed run")]

use std::{
    hint::black_box,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use cso_release::{
    ReleaseSource, SourceError,
    source::{
        Refusal,
        oci::{OciConfig, OciSource},
        verify::{self, Finding, TrustedKey},
    },
};
use cso_testenv::{
    Tools,
    cosign::{Cosign, SignatureLayout},
    registry::{Registry, push_like_oras},
};

const TAG: &str = "docker-ferrol-1-27-v1";
const WARM_UP: usize = 5;
const ITERATIONS: usize = 30;
const CHECK_WARM_UP: usize = 200;
const CHECK_ITERATIONS: usize = 3000;

fn release_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/releases")
        .join(TAG)
}

fn cosign_fixture(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/cosign")
            .join(name),
    )
    .unwrap()
}

fn cosign_key(name: &str) -> TrustedKey {
    TrustedKey::from_pem(name, &cosign_fixture(name)).unwrap()
}

/// Median and p90 of `values` (sorted here), as fetch_release reports them.
fn median_p90(values: &mut [f64]) -> (f64, f64) {
    values.sort_by(f64::total_cmp);
    (values[values.len() / 2], values[values.len() * 9 / 10])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Part 2: microseconds per call of `check`, which must return a finding `expected` accepts.
fn time_check(check: impl Fn() -> Finding, expected: impl Fn(&Finding) -> bool) -> (f64, f64, f64) {
    assert!(expected(&check()), "{:?}", check());
    for _ in 0..CHECK_WARM_UP {
        black_box(check());
    }
    let mut micros = Vec::with_capacity(CHECK_ITERATIONS);
    let all = Instant::now();
    for _ in 0..CHECK_ITERATIONS {
        let started = Instant::now();
        black_box(check());
        micros.push(started.elapsed().as_secs_f64() * 1e6);
    }
    let mean = all.elapsed().as_secs_f64() * 1e6 / CHECK_ITERATIONS as f64;
    let (median, p90) = median_p90(&mut micros);
    (median, p90, mean)
}

fn pure_checks() {
    let digest = String::from_utf8(cosign_fixture("subject-digest.txt")).unwrap();
    let another = format!("sha256:{}", "0".repeat(64));
    let payload = cosign_fixture("legacy-payload.json");
    let verified = |f: &Finding| matches!(f, Finding::Verified(_));
    let other_signer = |f: &Finding| matches!(f, Finding::OtherSigner(_));
    let invalid = |f: &Finding| matches!(f, Finding::Invalid(_));

    println!(
        "pure checks on cosign v3.1.3's output, {CHECK_ITERATIONS} calls each after {CHECK_WARM_UP} \
         warm-up calls"
    );
    println!(
        "{:<46} {:>10} {:>10} {:>10}",
        "check", "median µs", "p90 µs", "mean µs"
    );
    let row = |name: &str, (median, p90, mean): (f64, f64, f64)| {
        println!("{name:<46} {median:>10.1} {p90:>10.1} {mean:>10.1}");
    };
    for (label, key, bundle, signature) in [
        ("P-256 (key1)", "key1.pub", "bundle.json", "legacy-signature.txt"),
        (
            "P-384 (SHA-384)",
            "p384.pub",
            "p384-bundle.json",
            "p384-legacy-signature.txt",
        ),
        (
            "RSA 2048 (PKCS#1 v1.5)",
            "rsa.pub",
            "rsa-bundle.json",
            "rsa-legacy-signature.txt",
        ),
    ] {
        let keys = [cosign_key(key)];
        let bundle = cosign_fixture(bundle);
        let signature = String::from_utf8(cosign_fixture(signature)).unwrap();
        row(
            &format!("check_bundle, {label}"),
            time_check(
                || verify::check_bundle(black_box(&bundle), &digest, &keys),
                verified,
            ),
        );
        row(
            &format!("check_legacy, {label}"),
            time_check(
                || verify::check_legacy(black_box(&payload), &signature, &digest, &keys),
                verified,
            ),
        );
    }
    // Refusals: another key (the signature is checked and fails), another digest (refused before any crypto).
    let key1 = [cosign_key("key1.pub")];
    let key2 = [cosign_key("key2.pub")];
    let bundle = cosign_fixture("bundle.json");
    let signature = String::from_utf8(cosign_fixture("legacy-signature.txt")).unwrap();
    row(
        "check_bundle, P-256, by another key (refused)",
        time_check(
            || verify::check_bundle(black_box(&bundle), &digest, &key2),
            other_signer,
        ),
    );
    row(
        "check_legacy, P-256, by another key (refused)",
        time_check(
            || verify::check_legacy(black_box(&payload), &signature, &digest, &key2),
            other_signer,
        ),
    );
    row(
        "check_bundle, about another digest (refused)",
        time_check(
            || verify::check_bundle(black_box(&bundle), &another, &key1),
            invalid,
        ),
    );
    row(
        "check_legacy, about another digest (refused)",
        time_check(
            || verify::check_legacy(black_box(&payload), &signature, &another, &key1),
            invalid,
        ),
    );
}

fn source(host: &str, repository: &str, keys: Vec<TrustedKey>) -> OciSource {
    let config = OciConfig::from_lookup(|k| match k {
        "OCI_REGISTRY" => Some(host.to_owned()),
        "OCI_REPOSITORY" => Some(format!("{host}/{repository}")),
        "OCI_PLAIN_HTTP" => Some("true".into()),
        _ => None,
    })
    .unwrap();
    OciSource::new(config).verifying(keys)
}

#[derive(Clone, Copy, PartialEq)]
enum Expect {
    Unverified,
    Verified,
    Refused,
}

/// One download into a fresh directory (made before the clock starts); checks the outcome.
async fn download_once(source: &OciSource, expect: Expect) -> Duration {
    let dest = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let result = source.download(TAG, dest.path(), None).await;
    let elapsed = started.elapsed();
    let files = std::fs::read_dir(dest.path()).unwrap().count();
    match (expect, result) {
        (Expect::Unverified, Ok(p)) => assert!(p.signer.is_none() && files == 5, "{p:?}, {files} files"),
        (Expect::Verified, Ok(p)) => assert!(p.signer.is_some() && files == 5, "{p:?}, {files} files"),
        (
            Expect::Refused,
            Err(SourceError::Refused {
                refusal: Refusal::Unsigned,
                ..
            }),
        ) => assert_eq!(files, 0, "a refused release downloads nothing"),
        (_, other) => panic!("unexpected outcome: {other:?}"),
    }
    elapsed
}

/// The registry's access-log lines written since `offset` (`METHOD path status`), long hex shortened.
fn access_log_since(log: &Path, offset: usize) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap();
    text[offset..]
        .lines()
        .filter_map(|line| {
            // 127.0.0.1 - - [date] "GET /v2/... HTTP/1.1" 200 123 "" "agent"
            let (_, rest) = line.split_once("] \"")?;
            let (request, rest) = rest.split_once('"')?;
            let mut request = request.split(' ');
            let (method, path) = (request.next()?, request.next()?);
            let status = rest.split_whitespace().next()?;
            Some(format!("{method} {} {status}", shorten_hex(path)))
        })
        .collect()
}

/// Runs of 64 hex digits (digests) as their first 8 and `…`.
fn shorten_hex(text: &str) -> String {
    let bytes = text.as_bytes();
    let (mut out, mut i) = (String::new(), 0);
    while i < bytes.len() {
        let run = bytes[i..].iter().take_while(|b| b.is_ascii_hexdigit()).count();
        if run >= 64 {
            out.push_str(&text[i..i + 8]);
            out.push('…');
            i += run;
        } else if run > 0 {
            out.push_str(&text[i..i + run]);
            i += run;
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// The requests one download makes, from the registry's access log.
async fn requests_of(log: &Path, source: &OciSource, expect: Expect) -> Vec<String> {
    let offset = std::fs::metadata(log).unwrap().len() as usize;
    download_once(source, expect).await;
    // The access log is written as each response completes: give the last line a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    access_log_since(log, offset)
}

/// `more` minus `fewer`, as multisets, in `more`'s order.
fn extra_requests(more: &[String], fewer: &[String]) -> Vec<String> {
    let mut left = fewer.to_vec();
    more.iter()
        .filter(|r| match left.iter().position(|l| l == *r) {
            Some(i) => {
                left.remove(i);
                false
            }
            None => true,
        })
        .cloned()
        .collect()
}

struct Pair {
    name: &'static str,
    plain: OciSource,
    checking: OciSource,
    expect: Expect,
}

async fn registry_part(cosign: Cosign) {
    let registry = Registry::start(&Tools::discover().unwrap()).await.unwrap();
    let log = registry.storage().parent().unwrap().join("registry.log");
    let keys_dir = tempfile::tempdir().unwrap();
    let trusted = cosign
        .generate_key_pair(keys_dir.path(), "trusted")
        .await
        .unwrap();
    let key = || vec![TrustedKey::from_file(&trusted.public).unwrap()];
    let host = registry.host().to_owned();

    let mut pairs = Vec::new();
    for (name, repository, layout, expect) in [
        (
            "bundle-signed",
            "kaas/bundle-signed",
            Some(SignatureLayout::Bundle),
            Expect::Verified,
        ),
        (
            "legacy-signed",
            "kaas/legacy-signed",
            Some(SignatureLayout::Legacy),
            Expect::Verified,
        ),
        ("unsigned (refused)", "kaas/unsigned", None, Expect::Refused),
    ] {
        let digest = push_like_oras(&registry, repository, TAG, &release_fixture())
            .await
            .unwrap();
        if let Some(layout) = layout {
            let reference = format!("{host}/{repository}@{digest}");
            cosign.sign(&trusted, &reference, layout).await.unwrap();
        }
        pairs.push(Pair {
            name,
            plain: source(&host, repository, Vec::new()),
            checking: source(&host, repository, key()),
            expect,
        });
    }
    let size: u64 = std::fs::read_dir(release_fixture())
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();

    println!();
    println!(
        "OciSource::download of {TAG} ({} KiB, 5 files) from distribution 2.8 on loopback: without keys \
         (plain) and with one trusted key, alternating; {ITERATIONS} pairs after {WARM_UP} warm-up pairs",
        size / 1024
    );
    println!(
        "{:<20} {:>11} {:>9} {:>13} {:>11} {:>13} {:>11}",
        "release", "plain med", "p90", "with key med", "p90", "cost (pairs)", "cost (meds)"
    );
    for pair in &pairs {
        let (mut plain, mut checking, mut differences) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..WARM_UP + ITERATIONS {
            let (p, c) = if round % 2 == 0 {
                let p = download_once(&pair.plain, Expect::Unverified).await;
                (p, download_once(&pair.checking, pair.expect).await)
            } else {
                let c = download_once(&pair.checking, pair.expect).await;
                (download_once(&pair.plain, Expect::Unverified).await, c)
            };
            if round >= WARM_UP {
                plain.push(ms(p));
                checking.push(ms(c));
                differences.push(ms(c) - ms(p));
            }
        }
        let (plain_median, plain_p90) = median_p90(&mut plain);
        let (checking_median, checking_p90) = median_p90(&mut checking);
        let (difference, _) = median_p90(&mut differences);
        println!(
            "{:<20} {:>8.2} ms {:>6.2} ms {:>10.2} ms {:>8.2} ms {:>+10.2} ms {:>+8.2} ms",
            pair.name,
            plain_median,
            plain_p90,
            checking_median,
            checking_p90,
            difference,
            checking_median - plain_median
        );
    }

    println!();
    println!(
        "HTTP requests per download, from the registry's access log (GET /v2/ = oci-client's auth probe)"
    );
    for pair in &pairs {
        let plain = requests_of(&log, &pair.plain, Expect::Unverified).await;
        let checking = requests_of(&log, &pair.checking, pair.expect).await;
        let probes = |r: &[String]| r.iter().filter(|l| l.starts_with("GET /v2/ ")).count();
        let (plain_probes, checking_probes) = (probes(&plain), probes(&checking));
        println!(
            "{}: plain {} ({plain_probes} probes), with key {} ({checking_probes} probes): {:+} requests",
            pair.name,
            plain.len(),
            checking.len(),
            checking.len() as isize - plain.len() as isize
        );
        let not_probe = |r: &[String]| -> Vec<String> {
            r.iter()
                .filter(|l| !l.starts_with("GET /v2/ "))
                .cloned()
                .collect()
        };
        for request in extra_requests(&not_probe(&checking), &not_probe(&plain)) {
            println!("    + {request}");
        }
        for request in extra_requests(&not_probe(&plain), &not_probe(&checking)) {
            println!("    - {request}");
        }
        println!(
            "    {:+} GET /v2/ (one before each request: anonymous, oci-client keeps no token)",
            checking_probes as isize - plain_probes as isize
        );
    }
    drop(keys_dir);
}

#[tokio::main]
async fn main() {
    pure_checks();
    match Cosign::from_env() {
        Some(cosign) => registry_part(cosign).await,
        None => {
            println!();
            println!(
                "skipped the downloads and the refusal (parts 1 and 3): no cosign (CSO_COSIGN is not \
                 set, nor in the tools' env file); run `make tools` and export the lines of \
                 `bash hack/tools.sh --env`"
            );
        }
    }
}
