//! `status.summary` entries: what phase each release of a ClusterStack is in, read from its conditions.

use cso_api::{
    ClusterStackRelease, ReleaseId,
    cluster_stack::{ClusterStackReleaseSummary, ReleasePhase},
    conditions::{ConditionsExt, READY},
    names::condition,
};

/// The summary of release `id`, from its ClusterStackRelease if it exists yet.
pub fn release_summary(id: &ReleaseId, release: Option<&ClusterStackRelease>) -> ClusterStackReleaseSummary {
    let mut summary = ClusterStackReleaseSummary {
        name: id.version.to_dash(),
        ready: false,
        phase: ReleasePhase::None,
        message: None,
    };
    let Some(release) = release else {
        return summary;
    };
    if release.is_condition_true(READY) {
        summary.ready = true;
        summary.phase = ReleasePhase::Done;
        return summary;
    }
    // The Go operator puts the reason here, not the message.
    summary.message = release.get_condition(READY).and_then(|c| c.reason.clone());
    summary.phase = if release.is_condition_true(condition::PROVIDER_CLUSTER_STACK_RELEASE_READY) {
        ReleasePhase::ApplyingObjects
    } else if release.is_condition_true(condition::CLUSTER_STACK_RELEASE_DOWNLOADED) {
        ReleasePhase::ProviderSpecificWork
    } else if release.is_condition_false(condition::CLUSTER_STACK_RELEASE_DOWNLOADED) {
        ReleasePhase::DownloadingAssets
    } else {
        ReleasePhase::None
    };
    summary
}

#[cfg(test)]
mod tests {
    use cso_api::conditions::Severity;

    use super::*;

    #[test]
    fn phases_follow_the_conditions() {
        let id = ReleaseId::parse_tag("docker-ferrol-1-27-v0-sha-hipstsw").unwrap();
        let absent = release_summary(&id, None);
        assert_eq!(
            (absent.name.as_str(), absent.phase, absent.ready),
            ("v0-sha-hipstsw", ReleasePhase::None, false)
        );

        let mut csr = ClusterStackRelease::new("docker-ferrol-1-27-v0-sha-hipstsw", Default::default());
        csr.mark_false(
            condition::CLUSTER_STACK_RELEASE_DOWNLOADED,
            "ReleaseAssetsNotDownloadedYet",
            Severity::Info,
            "assets not downloaded yet",
        );
        csr.set_summary();
        let downloading = release_summary(&id, Some(&csr));
        assert_eq!(downloading.phase, ReleasePhase::DownloadingAssets);
        assert_eq!(
            downloading.message.as_deref(),
            Some("ReleaseAssetsNotDownloadedYet")
        );

        csr.mark_true(condition::CLUSTER_STACK_RELEASE_DOWNLOADED);
        csr.mark_true(condition::PROVIDER_CLUSTER_STACK_RELEASE_READY);
        csr.mark_false(
            condition::HELM_CHART_APPLIED,
            "FailedToApplyObjects",
            Severity::Error,
            "x",
        );
        csr.set_summary();
        assert_eq!(
            release_summary(&id, Some(&csr)).phase,
            ReleasePhase::ApplyingObjects
        );

        csr.mark_true(condition::HELM_CHART_APPLIED);
        csr.set_summary();
        let done = release_summary(&id, Some(&csr));
        assert_eq!(
            (done.phase, done.ready, done.message),
            (ReleasePhase::Done, true, None)
        );
    }
}
