//! Condition types, reasons, event reasons and labels, spelled as the Go operator spells them so that
//! dashboards, alerts and runbooks written for it keep working. Names the Go operator does not have are
//! marked *new* and listed in `docs/conditions.md`.

/// Condition types.
pub mod condition {
    pub const CLUSTER_READY: &str = "ClusterReady";
    pub const EVALUATED_CEL: &str = "EvaluatedCEL";
    pub const HELM_CHART_FOUND: &str = "HelmChartFound";
    pub const HELM_CHART_TEMPLATED: &str = "HelmChartTemplated";
    pub const CLUSTER_ADDON_CONFIG_VALIDATED: &str = "ClusterAddonConfigValidated";
    pub const HELM_CHART_APPLIED: &str = "HelmChartApplied";
    pub const HOOK_SERVER_READY: &str = "HookServerReady";
    pub const HELM_CHART_DELETED: &str = "HelmChartDeleted";
    /// *New.* False (Warning, reason `StageTimedOut`) when a stage of the last hook run was given up after the
    /// per-stage timeout (`--stage-timeout`) so that Cluster API could go on; removed when a run starts.
    pub const HOOK_STAGES_COMPLETED: &str = "HookStagesCompleted";
    pub const PROVIDER_CLUSTER_STACK_RELEASES_SYNCED: &str = "ProviderClusterStackReleasesSynced";
    pub const CLUSTER_STACK_RELEASES_SYNCED: &str = "ClusterStackReleasesSynced";
    pub const CLUSTER_STACK_RELEASE_AVAILABLE: &str = "ClusterStackReleaseAvailable";
    /// The Go constant is `ClusterStackReleaseAssetsReadyCondition`.
    pub const CLUSTER_STACK_RELEASE_DOWNLOADED: &str = "ClusterStackReleaseDownloaded";
    pub const PROVIDER_CLUSTER_STACK_RELEASE_READY: &str = "ProviderClusterStackReleaseReady";
    pub const ASSETS_CLIENT_API_AVAILABLE: &str = "AssetsClientAPIAvailable";
    pub const RELEASES_SYNCED: &str = "ReleasesSynced";
    /// *New.* On a ClusterStackRelease being deleted: False while Clusters still use its ClusterClass.
    pub const CLUSTER_CLASS_UNUSED: &str = "ClusterClassUnused";
    /// *New.* On a ClusterAddon: True when every applied object with a health rule runs (Deployments
    /// available, DaemonSets rolled out, Jobs complete, ...; `cso_apply::health`). `status.ready` needs it.
    pub const ADDONS_HEALTHY: &str = "AddonsHealthy";
    /// *New.* On a ClusterStackRelease (and on a ClusterAddon whose release was refused): whether the release
    /// is what it must be. True when its signature verified against a configured key (`--verify-key`) and it
    /// is at its pinned digest (`spec.digest`), whichever of the two applies; False when it was refused
    /// (unsigned, signed by another key, a bad signature, a pinned tag that moved, or the check could not be
    /// made). Absent when nothing is checked (no key, no pin).
    pub const RELEASE_VERIFIED: &str = "ReleaseVerified";
    /// *New.* On a ClusterAddon whose Cluster is labelled for a shard (`clusterstack.x-k8s.io/shard`) that no
    /// replica has reconciled for `--shard-grace`: set False by the default shard, removed by the shard's
    /// next reconcile. Absent otherwise.
    pub const SHARD_RECONCILING: &str = "ShardReconciling";
    /// *New.* On a ClusterAddon: False (Warning, reason `DriftFight`) while something else keeps changing
    /// objects it applied, so that they are put back again and again (with back-off); the message names each
    /// object, the field manager that changes it and the fields. Absent otherwise.
    pub const DRIFT_SETTLED: &str = "DriftSettled";
    /// *New.* On a ClusterStackRollout: its spec and its ClusterStack's are valid (False, Error, `InvalidSpec`;
    /// False, Warning, `ClusterStackNotFound`).
    pub const ROLLOUT_SPEC_VALID: &str = "SpecValid";
    /// *New.* On a ClusterStackRollout: the ClusterStackRelease the Clusters move to is ready (False, Info,
    /// `ReleaseNotReady`: nothing is moved).
    pub const RELEASE_READY: &str = "ReleaseReady";
    /// *New.* On a ClusterStackRollout: no moved Cluster is failing (False, Warning, `WaveFailing`: the Clusters
    /// not done within `waveTimeout`, each with why; the rollout is paused).
    pub const CLUSTERS_HEALTHY: &str = "ClustersHealthy";
    /// *New.* On a ClusterStackRollout: no Cluster was refused by the preflight (False, Warning,
    /// `MoveRefused`: the refused Clusters, each with why; they are skipped).
    pub const PREFLIGHT_PASSED: &str = "PreflightPassed";
    /// *New.* On a ClusterStackRollout: every move it tried was made (False, Warning, `MoveFailed`: the
    /// Clusters whose dry run or patch failed, each with why; they are tried again with back-off).
    pub const MOVES_MADE: &str = "MovesMade";
    /// *New.* On a ClusterStackRollout: not held by `spec.paused` (False, Info, `PausedBySpec`).
    pub const ROLLOUT_ACTIVE: &str = "RolloutActive";
}

/// Condition reasons.
pub mod reason {
    pub const CONTROL_PLANE_NOT_READY: &str = "ControlPlaneNotReady";
    pub const FAILED_TO_APPLY_OBJECTS: &str = "FailedToApplyObjects";
    pub const OBJECTS_APPLYING_ONGOING: &str = "ObjectsApplyingOngoing";
    /// *New.* `HelmChartApplied` False (Error): the API server refuses objects for good (400, 403, 422: a
    /// terminating namespace, a schema, RBAC, an admission policy); trying again does not change that, a change
    /// of the objects or the cluster does.
    pub const OBJECTS_REFUSED: &str = "ObjectsRefused";
    pub const PROVIDER_TEMPLATE_NOT_FOUND: &str = "ProviderTemplateNotFound";
    pub const FAILED_TO_CREATE_OR_UPDATE: &str = "FailedToCreateOrUpdate";
    pub const RELEASE_ASSETS_NOT_DOWNLOADED_YET: &str = "ReleaseAssetsNotDownloadedYet";
    pub const ISSUE_WITH_RELEASE_ASSETS: &str = "IssueWithReleaseAssets";
    pub const PROCESS_ONGOING: &str = "ProcessOngoing";
    pub const FAILED_CREATE_ASSETS_CLIENT: &str = "FailedCreateAssetsClient";
    /// *New.* A render with fewer than half the objects of the last apply was held: nothing applied or pruned.
    pub const PRUNE_HELD: &str = "PruneHeld";
    pub const FAILED_TO_SYNC: &str = "FailedToSync";
    /// *New.* `ClusterStackReleaseAvailable` False: no release of the stack is ready yet.
    pub const NO_READY_RELEASE: &str = "NoReadyRelease";
    /// *New.* `ClusterStackReleasesSynced` False: `spec` names a version that does not parse.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// *New.* `ClusterStackReleaseDownloaded` False: the source has no such release.
    pub const RELEASE_NOT_FOUND: &str = "ReleaseNotFound";
    /// *New.* `HelmChartApplied` False: `helm template` of the cluster-class chart failed.
    pub const FAILED_TO_RENDER_CHART: &str = "FailedToRenderChart";
    /// *New.* `ProviderClusterStackReleaseReady` False: the provider object named by `spec.providerRef` is
    /// missing or unreadable.
    pub const PROVIDER_OBJECT_NOT_FOUND: &str = "ProviderObjectNotFound";
    /// *New.* `ClusterClassUnused` False.
    pub const CLUSTER_CLASS_IN_USE: &str = "ClusterClassInUse";
    pub const TEMPLATE_NEW_CLUSTER_STACK_FAILED: &str = "TemplateNewClusterStackFailed";
    pub const TEMPLATE_NEW_CLUSTER_STACK_OVERWRITE_FAILED: &str = "TemplateNewClusterStackOverwriteFailed";
    pub const HELM_CHART_MISSING: &str = "HelmChartMissing";
    pub const FAILED_TO_EVALUATE_PRE_CONDITION: &str = "FailedToEvaluatePreCondition";
    pub const FAILED_TO_EVALUATE_POST_CONDITION: &str = "FailedToEvaluatePostCondition";
    pub const PARSING_CLUSTER_ADDON_CONFIG_FAILED: &str = "ParsingClusterAddonConfigFailed";
    /// *New.* `HookServerReady` False: `spec.hook` names a hook that does not exist.
    pub const UNKNOWN_HOOK: &str = "UnknownHook";
    /// *New.* `HookStagesCompleted` False: a stage did not finish within the per-stage timeout.
    pub const STAGE_TIMED_OUT: &str = "StageTimedOut";
    /// *New.* `ClusterReady` False: the Cluster's class is not set or not a cluster stack's.
    pub const NO_CLUSTER_STACK_CLASS: &str = "NoClusterStackClass";
    /// *New.* `HelmChartDeleted` / deletion of a ClusterStackRelease: some objects could not be deleted.
    pub const FAILED_TO_DELETE_OBJECTS: &str = "FailedToDeleteObjects";
    /// *New.* `ClusterStackReleaseDownloaded` False: a chart dependency of the release (a subchart it does not
    /// vendor) could not be fetched; the message names the chart, the dependency's version and repository.
    pub const CHART_DEPENDENCY_UNAVAILABLE: &str = "ChartDependencyUnavailable";
    /// *New.* `AddonsHealthy` False (Info): applied, not running yet; waited for up to `--stage-timeout`.
    pub const WAITING_FOR_HEALTH: &str = "WaitingForHealth";
    /// *New.* `AddonsHealthy` False (Warning): not running `--stage-timeout` after the apply; the message names
    /// the objects and why. A hook waiting for these addons goes on.
    pub const NOT_HEALTHY_IN_TIME: &str = "NotHealthyInTime";
    /// *New.* `AddonsHealthy` False (Warning): the addons ran, and no longer do (found by a later check).
    pub const DEGRADED: &str = "Degraded";
    /// *New.* `AddonsHealthy` Unknown: the addons' objects cannot be read (the workload cluster does not
    /// answer); `status.ready` keeps what the last finding said.
    pub const HEALTH_NOT_READABLE: &str = "HealthNotReadable";
    /// *New.* `ReleaseVerified` False: keys are configured and the release has no signature.
    pub const UNSIGNED: &str = "Unsigned";
    /// *New.* `ReleaseVerified` False: the release has signatures, none of them by a configured key.
    pub const SIGNATURE_MISMATCH: &str = "SignatureMismatch";
    /// *New.* `ReleaseVerified` False: a signature is malformed, or what it signs is not the release's digest.
    pub const INVALID_SIGNATURE: &str = "InvalidSignature";
    /// *New.* `ReleaseVerified` False: the version is pinned (`spec.versionDigests`) and its tag now points
    /// to another digest.
    pub const TAG_MOVED: &str = "TagMoved";
    /// *New.* `ReleaseVerified` False: the signature could not be checked (the registry failed).
    pub const VERIFICATION_FAILED: &str = "VerificationFailed";
    /// *New.* `ClusterStackReleaseDownloaded` False: the release was refused by verification (`ReleaseVerified`
    /// False says why).
    pub const RELEASE_NOT_VERIFIED: &str = "ReleaseNotVerified";
    /// *New.* `ShardReconciling` False (Warning): no replica holds the Lease of the Cluster's shard.
    pub const NO_SHARD_REPLICA: &str = "NoShardReplica";
    /// *New.* `DriftSettled` False (Warning): objects were put back several times in a row, each soon after the
    /// last (a drift fight).
    pub const DRIFT_FIGHT: &str = "DriftFight";
    /// *New.* `SpecValid` False (Warning): the rollout's ClusterStack does not exist.
    pub const CLUSTER_STACK_NOT_FOUND: &str = "ClusterStackNotFound";
    /// *New.* `ReleaseReady` False (Info): the ClusterStackRelease to move to is missing or not ready.
    pub const RELEASE_NOT_READY: &str = "ReleaseNotReady";
    /// *New.* `ClustersHealthy` False (Warning): moved Clusters are not done within `waveTimeout`.
    pub const WAVE_FAILING: &str = "WaveFailing";
    /// *New.* `PreflightPassed` False (Warning): Cluster API would refuse moving some Clusters.
    pub const MOVE_REFUSED: &str = "MoveRefused";
    /// *New.* `MovesMade` False (Warning): a move could not be made now (the dry run or the patch failed).
    pub const MOVE_FAILED: &str = "MoveFailed";
    /// *New.* `RolloutActive` False (Info): `spec.paused` is set.
    pub const PAUSED_BY_SPEC: &str = "PausedBySpec";
}

/// Event reasons.
pub mod event {
    pub const CLUSTER_STACK_RELEASE_CREATED: &str = "ClusterStackReleaseCreated";
    pub const ERROR_CREATING_CLUSTER_STACK_RELEASE: &str = "ErrorCreatingClusterStackRelease";
    pub const FAILED_TO_DELETE_CLUSTER_STACK_RELEASE: &str = "FailedToDeleteClusterStackRelease";
    /// *New.*
    pub const CLUSTER_STACK_RELEASE_DELETED: &str = "ClusterStackReleaseDeleted";
    pub const CREATE_PROVIDER_STACK_RELEASE: &str = "CreateProviderStackRelease";
    pub const UPDATE_PROVIDER_STACK_RELEASE: &str = "UpdateProviderStackRelease";
    pub const FAILED_CREATE_ASSETS_CLIENT: &str = "FailedCreateAssetsClient";
    pub const FAILED_TO_SYNC: &str = "FailedToSync";
    pub const VALIDATE_HELM_CHART_FAILED: &str = "ValidateHelmChartFailed";
    /// *New.*
    pub const RELEASE_DOWNLOAD_FAILED: &str = "ReleaseDownloadFailed";
    /// *New.* Normal: a downloaded release's signature verified (the message names digest, signer, layout).
    pub const RELEASE_VERIFIED: &str = "ReleaseVerified";
    /// *New.* Warning: a release was refused by verification (`ReleaseVerified` False says why).
    pub const RELEASE_REFUSED: &str = "ReleaseRefused";
    /// *New.* A chart dependency of a release could not be fetched when the release entered the cache.
    pub const CHART_DEPENDENCY_UNAVAILABLE: &str = "ChartDependencyUnavailable";
    /// *New.*
    pub const FAILED_TO_RENDER_CHART: &str = "FailedToRenderChart";
    /// *New.*
    pub const FAILED_TO_APPLY_OBJECTS: &str = "FailedToApplyObjects";
    /// *New.* Objects of a release were re-applied because they had been changed or deleted.
    pub const DRIFT_CORRECTED: &str = "DriftCorrected";
    /// *New.* Warning, once per fight: an object is being changed by something else again and again, and put
    /// back with back-off (`DriftSettled` False says by whom).
    pub const DRIFT_FIGHT: &str = "DriftFight";
    /// *New.* A rollout moved a Cluster to its release's class.
    pub const CLUSTER_MOVED: &str = "ClusterMoved";
    /// *New.* Warning: the preflight refused moving a Cluster; it is skipped until it changes.
    pub const MOVE_REFUSED: &str = "MoveRefused";
    /// *New.* Warning: a move could not be made now (the dry run or the patch failed); tried again.
    pub const MOVE_FAILED: &str = "MoveFailed";
    /// *New.* A rollout started moving the Clusters of a wave.
    pub const WAVE_STARTED: &str = "WaveStarted";
    /// *New.* A rollout paused: Warning for failing Clusters (`ClustersHealthy` False says which), Normal for
    /// `spec.paused`.
    pub const ROLLOUT_PAUSED: &str = "RolloutPaused";
    /// *New.* A paused rollout goes on.
    pub const ROLLOUT_RESUMED: &str = "RolloutResumed";
    /// *New.* Every wave of a rollout is done.
    pub const ROLLOUT_COMPLETED: &str = "RolloutCompleted";
    /// *New.* Every wave of a rollout is through, with Clusters skipped (Warning): they are named.
    pub const ROLLOUT_INCOMPLETE: &str = "RolloutIncomplete";
    /// *New.*
    pub const CLUSTER_CLASS_IN_USE: &str = "ClusterClassInUse";
    /// *New.*
    pub const FAILED_TO_DELETE_OBJECTS: &str = "FailedToDeleteObjects";
    pub const TEMPLATE_NEW_CLUSTER_STACK_FAILED: &str = "TemplateNewClusterStackFailed";
    /// *New.* Applied addons did not run within `--stage-timeout` (`AddonsHealthy` False, `NotHealthyInTime`).
    pub const ADDONS_NOT_HEALTHY: &str = "AddonsNotHealthy";
    /// *New.* Addons that ran no longer do (`AddonsHealthy` False, `Degraded`).
    pub const ADDONS_DEGRADED: &str = "AddonsDegraded";
    /// *New.* A stage of a lifecycle hook failed (render, apply, CEL).
    pub const STAGE_FAILED: &str = "StageFailed";
    /// *New.* A stage of a lifecycle hook did not finish within `--stage-timeout`: given up, the hook goes on.
    pub const STAGE_TIMED_OUT: &str = "StageTimedOut";
    /// *New.* The addons of a ClusterAddon were applied into its workload cluster.
    pub const CLUSTER_ADDON_APPLIED: &str = "ClusterAddonApplied";
    /// *New.* A reconcile took longer than `--reconcile-timeout` and was stopped (it is retried).
    pub const RECONCILE_TIMED_OUT: &str = "ReconcileTimedOut";
    /// *New.* The API server refused to delete objects a release no longer has (403, 405, 409): left in place
    /// and dropped from the inventory, so the rest of the work goes on.
    pub const PRUNE_REFUSED: &str = "PruneRefused";
    /// *New.* A render with fewer than half the objects of the last apply (none, say) was not applied: it
    /// would have pruned most of what runs. A release that removes that much says so in a delete stage.
    pub const PRUNE_HELD: &str = "PruneHeld";
    /// *New.* On a Cluster: no ClusterAddon can be made for it (its name leaves no room for `cluster-addon-`).
    pub const CLUSTER_ADDON_NOT_CREATED: &str = "ClusterAddonNotCreated";
    /// *New.* On a Cluster: its class names a release of a known stack that the source does not have (a typo).
    pub const UNKNOWN_CLUSTER_STACK_RELEASE: &str = "UnknownClusterStackRelease";
}

/// The label with the release tag that every object applied for a release carries (besides
/// [`crate::OWNED_LABEL`]); it maps a changed ClusterClass back to its ClusterStackRelease.
pub const RELEASE_LABEL: &str = "clusterstack.x-k8s.io/release";
