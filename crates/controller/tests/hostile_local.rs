//! Hostile archives in a `--local` release directory, through the real operator: the release is refused
//! before anything reads its charts (a False `ClusterStackReleaseDownloaded` naming the file and the
//! reason, a `ValidateHelmChartFailed` event), helm never sees it and nothing is applied; a good release in
//! the same directory is installed.
#![allow(clippy::unwrap_used, reason = "tests fail loudly on unexpected errors")]

mod support;

use std::{io::Read, path::Path};

use cso_api::{
    ClusterStackRelease,
    names::{condition, reason},
};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use support::*;

/// The fixture chart `archive` with one raw tar entry appended after its content: the tar crate's builder
/// refuses unsafe names, so the header is written byte by byte, as a hostile packer would.
fn with_hostile_entry(archive: &Path, name: &str, kind: tar::EntryType, link: Option<&str>) -> Vec<u8> {
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(archive).unwrap())
        .read_to_end(&mut plain)
        .unwrap();
    // Drop the end-of-archive blocks, then append the entry and new ones.
    let mut end = plain.len();
    while end >= 512 && plain[end - 512..end].iter().all(|b| *b == 0) {
        end -= 512;
    }
    plain.truncate(end);
    let mut header = tar::Header::new_old();
    let raw = header.as_old_mut();
    raw.name[..name.len()].copy_from_slice(name.as_bytes());
    if let Some(link) = link {
        raw.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    header.set_entry_type(kind);
    let content: &[u8] = if kind == tar::EntryType::Regular {
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: evil}\n"
    } else {
        b""
    };
    header.set_size(content.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    plain.extend_from_slice(header.as_bytes());
    plain.extend_from_slice(content);
    plain.resize(plain.len().div_ceil(512) * 512 + 1024, 0);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &plain).unwrap();
    gz.finish().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_local_releases_are_refused_and_nothing_is_applied() {
    let plane = cso_testenv::shared_management();
    let client = plane.client().await.unwrap();
    let ns = cso_testenv::namespace(&client, "hostile-local").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tags = [
        "docker-ferrol-1-27-v1",
        "docker-ferrol-1-27-v2",
        "docker-ferrol-1-27-v3",
    ];
    local_releases(dir.path(), &tags);
    let stacks = dir.path().join("cluster-stacks");
    // v1: an absolute path in the cluster-class chart; v2: a hard link out of it. The two variants the
    // hostile run saw rendered and applied.
    let v1 = stacks.join("docker-ferrol-1-27-v1/docker-ferrol-1-27-cluster-class-v1.tgz");
    std::fs::write(
        &v1,
        with_hostile_entry(&v1, "/tmp/cso-hostile-local.yaml", tar::EntryType::Regular, None),
    )
    .unwrap();
    let v2 = stacks.join("docker-ferrol-1-27-v2/docker-ferrol-1-27-cluster-class-v2.tgz");
    std::fs::write(
        &v2,
        with_hostile_entry(
            &v2,
            "docker-ferrol-1-27-cluster-class/templates/evil.yaml",
            tar::EntryType::Link,
            Some("/etc/passwd"),
        ),
    )
    .unwrap();

    let operator = RunningOperator::local(&client, &ns, dir.path()).await;
    create_stack(&client, &ns, "ferrol", ferrol_spec(&["v1", "v2", "v3"])).await;

    for (tag, file, why) in [
        (
            "docker-ferrol-1-27-v1",
            "docker-ferrol-1-27-cluster-class-v1.tgz",
            "is an absolute path",
        ),
        (
            "docker-ferrol-1-27-v2",
            "docker-ferrol-1-27-cluster-class-v2.tgz",
            "hard link points outside the archive",
        ),
    ] {
        let message = wait_condition::<ClusterStackRelease>(
            &client,
            &ns,
            tag,
            condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
            reason::ISSUE_WITH_RELEASE_ASSETS,
        )
        .await;
        assert!(
            message.contains(file),
            "{tag}: the condition names the file: {message}"
        );
        assert!(
            message.contains(why),
            "{tag}: the condition gives the reason: {message}"
        );
        let release: ClusterStackRelease = Api::namespaced(client.clone(), &ns).get(tag).await.unwrap();
        assert!(
            !release.status.as_ref().is_some_and(|s| s.ready),
            "{tag} is not ready"
        );
    }
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    eventually("a ValidateHelmChartFailed event", CONVERGE, || async {
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("ValidateHelmChartFailed"))
    })
    .await;

    // The good release beside them is installed, and only it.
    ready_release(&client, &ns, "docker-ferrol-1-27-v3").await;
    assert_eq!(cluster_classes(&client, &ns).await, ["docker-ferrol-1-27-v3"]);
    assert!(!Path::new("/tmp/cso-hostile-local.yaml").exists());
    // One chart went to helm: v3's (rendered again at a resync, it is a cache hit, not a second miss).
    let (_, misses) = operator.renderer.stats();
    assert_eq!(misses, 1, "helm rendered only the good release");
    operator.stop().await;
}
