//! Re-rendering when the inputs change (pure): the values templates see the Cluster, its control plane and
//! its infrastructure cluster, and any of those can change after the addons were applied (the endpoint, the
//! pod CIDR, a label, a topology variable). What counts is what the templates make of them: the digest of
//! every templated values file of the release is recorded with each complete apply
//! ([`cso_api::cluster_addon::APPLIED_INPUTS_ANNOTATION`]); when the templates now give other values, the
//! release is rendered and applied again (and what it no longer has is pruned). Data the templates do not
//! read (a status condition's timestamp, the resourceVersion) changes nothing, so nothing churns.
//!
//! The digest is of the values, not of the rendered objects: a chart that mints a secret (`genCA`) at each
//! render would otherwise look changed at every look. Addons applied before the digest was recorded (by the
//! Go operator, or by an older cso) adopt the current digest: the digest itself renders nothing, so swapping
//! operators rolls nothing on its account.

use sha2::{Digest, Sha256};

/// The digest of templated values files, each named by its chart (`""` for a single-chart release), in the
/// order given: `sha256:<hex>`.
pub(crate) fn digest<'a>(values: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut hasher = Sha256::new();
    for (chart, text) in values {
        // Lengths first, so no two lists hash alike by moving a boundary.
        hasher.update((chart.len() as u64).to_le_bytes());
        hasher.update(chart.as_bytes());
        hasher.update((text.len() as u64).to_le_bytes());
        hasher.update(text.as_bytes());
    }
    format!("sha256:{}", hex::encode(hasher.finalize()))
}

/// What templating the values of the current release gave, in this reconcile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum Inputs {
    /// Not templated (yet, or not needed: a hook's stages are under way and render their own).
    #[default]
    Unknown,
    /// The digest of the values now, and whether it differs from the recorded one.
    Templated { digest: String, changed: bool },
    /// A values file could not be templated: the `HelmChartTemplated` reason and the message.
    Failed { reason: &'static str, message: String },
    /// The values files cannot be read (the release's stage charts do not unpack): the stages report it.
    Unavailable,
}

impl Inputs {
    /// The outcome of templating, given the digest recorded with the last complete apply (`None`: never
    /// recorded, which adopts the current one).
    pub(crate) fn templated(recorded: Option<&str>, now: String) -> Self {
        let changed = recorded.is_some_and(|recorded| recorded != now);
        Inputs::Templated { digest: now, changed }
    }

    /// The templates give other values than the applied addons were rendered from.
    pub(crate) fn changed(&self) -> bool {
        matches!(self, Inputs::Templated { changed: true, .. })
    }

    /// The digest to record with what this reconcile applied or found applied.
    pub(crate) fn digest(&self) -> Option<&str> {
        match self {
            Inputs::Templated { digest, .. } => Some(digest),
            Inputs::Unknown | Inputs::Failed { .. } | Inputs::Unavailable => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    #[test]
    fn the_digest_follows_every_byte_of_the_values_and_the_chart_names() {
        let base = digest([("cni", "a: 1\n"), ("csi", "b: 2\n")]);
        assert!(base.starts_with("sha256:") && base.len() == 7 + 64);
        assert_eq!(base, digest([("cni", "a: 1\n"), ("csi", "b: 2\n")]), "stable");
        for other in [
            digest([("cni", "a: 2\n"), ("csi", "b: 2\n")]),
            digest([("cni", "a: 1\n"), ("csi", "b: 2")]),
            digest([("cn", "ia: 1\n"), ("csi", "b: 2\n")]),
            digest([("csi", "b: 2\n"), ("cni", "a: 1\n")]),
            digest([("cni", "a: 1\n")]),
        ] {
            assert_ne!(base, other);
        }
        assert_ne!(
            digest([("", "")]),
            digest([]),
            "an empty values file is an input too"
        );
    }

    #[rstest]
    #[case::never_recorded_adopts(None, "sha256:b", false)]
    #[case::the_same(Some("sha256:b"), "sha256:b", false)]
    #[case::other_values(Some("sha256:a"), "sha256:b", true)]
    fn only_a_recorded_digest_that_differs_is_a_change(
        #[case] recorded: Option<&str>,
        #[case] now: &str,
        #[case] changed: bool,
    ) {
        let inputs = Inputs::templated(recorded, now.to_owned());
        assert_eq!(inputs.changed(), changed);
        assert_eq!(inputs.digest(), Some(now));
    }

    #[test]
    fn nothing_templated_is_no_change_and_records_nothing() {
        for inputs in [
            Inputs::Unknown,
            Inputs::Unavailable,
            Inputs::Failed {
                reason: "TemplateNewClusterStackOverwriteFailed",
                message: "no InfraCluster".into(),
            },
        ] {
            assert!(!inputs.changed());
            assert_eq!(inputs.digest(), None);
        }
    }
}
