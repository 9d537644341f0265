//! Identical inputs render once: a renderer that remembers outputs by (chart content digest, release,
//! namespace, values, kube version, API versions, CRD flag, target). Besides saving Helm runs, this keeps
//! renders stable for charts that mint secrets on every render (Cilium's Hubble server certificate): the
//! same output is re-applied, so nothing changes on the cluster. Outputs are kept deflated against the first
//! output of the same chart and release ([`cso_api::deflated`]): renders of one chart for many Clusters differ
//! in a few values, so each keeps little more than those. The cache is bounded by the outputs' total deflated
//! size: with a kubeconfig of its own per Cluster, each Cluster's render is an entry.

use std::{
    collections::{HashMap, VecDeque},
    path::Path,
    sync::{Arc, Mutex},
};

use cso_api::deflated::{self, Dictionary};
use futures::future::BoxFuture;
use sha2::{Digest, Sha256};

use crate::{ChartRenderer, RenderError, RenderRequest};

/// Default bound of the cached outputs (compressed).
pub const DEFAULT_CAPACITY_BYTES: usize = 64 << 20;

#[derive(Debug, Default)]
struct Entries {
    /// Outputs, each deflated against its chart's sample.
    outputs: HashMap<[u8; 32], Kept>,
    /// The first output of each chart and release still cached (what its outputs are deflated against).
    samples: HashMap<(std::path::PathBuf, String), Dictionary>,
    order: VecDeque<[u8; 32]>,
    bytes: usize,
    hits: u64,
    misses: u64,
}

/// One cached output.
#[derive(Clone, Debug)]
struct Kept {
    deflated: Arc<[u8]>,
    sample: Dictionary,
}

impl Kept {
    fn inflate(&self) -> Option<String> {
        deflated::inflate_text(&self.deflated, Some(&self.sample)).ok()
    }
}

/// A [`ChartRenderer`] with a cache in front of another.
#[derive(Debug)]
pub struct CachingRenderer<R> {
    inner: R,
    capacity_bytes: usize,
    entries: Mutex<Entries>,
}

impl<R: ChartRenderer> CachingRenderer<R> {
    pub fn new(inner: R, capacity_bytes: usize) -> Self {
        CachingRenderer {
            inner,
            capacity_bytes,
            entries: Mutex::default(),
        }
    }

    /// (hits, misses) so far.
    pub fn stats(&self) -> (u64, u64) {
        let entries = self.lock();
        (entries.hits, entries.misses)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn key(request: &RenderRequest) -> std::io::Result<[u8; 32]> {
        let mut hasher = Sha256::new();
        hash_path(&mut hasher, &request.chart)?;
        for part in [&request.release_name, &request.namespace] {
            field(&mut hasher, part.as_bytes());
        }
        field(
            &mut hasher,
            request.values.as_deref().unwrap_or_default().as_bytes(),
        );
        field(
            &mut hasher,
            request.kube_version.as_deref().unwrap_or_default().as_bytes(),
        );
        let mut apis = request.api_versions.clone();
        apis.sort();
        for api in &apis {
            field(&mut hasher, api.as_bytes());
        }
        field(&mut hasher, &[u8::from(request.include_crds)]);
        // The target matters for `lookup`: the kubeconfig's content names the cluster and the identity.
        match &request.target_kubeconfig {
            Some(path) => field(&mut hasher, &std::fs::read(path)?),
            None => field(&mut hasher, b""),
        }
        Ok(hasher.finalize().into())
    }
}

impl<R: ChartRenderer> ChartRenderer for CachingRenderer<R> {
    fn render(&self, request: RenderRequest) -> BoxFuture<'_, Result<String, RenderError>> {
        Box::pin(async move {
            let key = match Self::key(&request) {
                Ok(key) => key,
                // An unreadable chart: let the renderer report it.
                Err(_) => return self.inner.render(request).await,
            };
            // Inflated outside the lock: other renders need not wait for it.
            let cached = self.lock().outputs.get(&key).cloned();
            let output = cached.as_ref().and_then(Kept::inflate);
            {
                let mut entries = self.lock();
                if output.is_some() {
                    entries.hits += 1;
                } else {
                    entries.misses += 1;
                    // A kept output that does not inflate (it cannot: it was deflated here) goes, so that the
                    // render below takes its place.
                    if cached.is_some()
                        && let Some(dropped) = entries.outputs.remove(&key)
                    {
                        entries.bytes -= dropped.deflated.len();
                    }
                }
            }
            if let Some(output) = output {
                return Ok(output);
            }
            let sample_key = (request.chart.clone(), request.release_name.clone());
            let output = self.inner.render(request).await?;
            let sample = self
                .lock()
                .samples
                .entry(sample_key)
                .or_insert_with(|| Dictionary::from_sample(output.as_bytes()))
                .clone();
            let deflated: Arc<[u8]> = deflated::deflate(output.as_bytes(), Some(&sample)).into();
            let mut entries = self.lock();
            if deflated.len() <= self.capacity_bytes && !entries.outputs.contains_key(&key) {
                let mut evicted_any = false;
                while entries.bytes + deflated.len() > self.capacity_bytes {
                    let Some(oldest) = entries.order.pop_front() else {
                        break;
                    };
                    if let Some(evicted) = entries.outputs.remove(&oldest) {
                        entries.bytes -= evicted.deflated.len();
                        evicted_any = true;
                    }
                }
                entries.bytes += deflated.len();
                entries.order.push_back(key);
                entries.outputs.insert(key, Kept { deflated, sample });
                if evicted_any {
                    // A sample no kept output refers to goes with its last output.
                    entries.samples.retain(|_, sample| sample.is_shared());
                }
            }
            Ok(output)
        })
    }
}

fn field(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

/// Hashes a chart archive's bytes, or a chart directory's relative paths and file contents.
fn hash_path(hasher: &mut Sha256, path: &Path) -> std::io::Result<()> {
    if path.is_file() {
        field(hasher, &std::fs::read(path)?);
        return Ok(());
    }
    let mut stack = vec![path.to_path_buf()];
    let mut files = Vec::new();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                files.push(entry.path());
            }
        }
    }
    files.sort();
    for file in files {
        let relative = file.strip_prefix(path).unwrap_or(&file);
        field(hasher, relative.to_string_lossy().as_bytes());
        field(hasher, &std::fs::read(&file)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Renders a fresh random-looking output each time, like a chart that mints secrets.
    #[derive(Debug, Default)]
    struct Minting(AtomicUsize);

    impl ChartRenderer for Minting {
        fn render(&self, request: RenderRequest) -> BoxFuture<'_, Result<String, RenderError>> {
            let n = self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                // A secret that shares nothing with the last one's.
                let secret: String = Sha256::digest(n.to_le_bytes())
                    .iter()
                    .map(|byte| format!("{byte:02x}"))
                    .collect();
                Ok(format!(
                    "{}-{}-secret-{n}-{secret}",
                    request.release_name,
                    request.values.unwrap_or_default()
                ))
            })
        }
    }

    fn chart() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("Chart.yaml"), "name: c\n").unwrap();
        dir
    }

    fn request(chart: &Path, values: &str) -> RenderRequest {
        RenderRequest {
            chart: chart.to_path_buf(),
            release_name: "r".into(),
            values: Some(values.into()),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn identical_inputs_render_once_and_any_change_renders_again() {
        let chart = chart();
        let renderer = CachingRenderer::new(Minting::default(), 1 << 20);
        let first = renderer.render(request(chart.path(), "a")).await.unwrap();
        assert_eq!(
            renderer.render(request(chart.path(), "a")).await.unwrap(),
            first,
            "the same output, not a new secret"
        );
        assert_ne!(
            renderer.render(request(chart.path(), "b")).await.unwrap(),
            first,
            "other values render anew"
        );
        std::fs::write(chart.path().join("values.yaml"), "x: 1\n").unwrap();
        assert_ne!(
            renderer.render(request(chart.path(), "a")).await.unwrap(),
            first,
            "another chart content renders anew"
        );
        assert_eq!(renderer.stats(), (1, 3));
    }

    /// Renders the same long, repetitive manifest each time.
    #[derive(Debug)]
    struct Manifests;

    impl ChartRenderer for Manifests {
        fn render(&self, _: RenderRequest) -> BoxFuture<'_, Result<String, RenderError>> {
            let manifest =
                "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  namespace: kube-system\n";
            Box::pin(async move { Ok(manifest.repeat(200)) })
        }
    }

    #[tokio::test]
    async fn outputs_are_kept_compressed_and_come_back_whole() {
        let chart = chart();
        let renderer = CachingRenderer::new(Manifests, 1 << 20);
        let first = renderer.render(request(chart.path(), "a")).await.unwrap();
        assert_eq!(renderer.render(request(chart.path(), "a")).await.unwrap(), first);
        assert_eq!(renderer.stats(), (1, 1));
        let kept = renderer.entries.lock().unwrap().bytes;
        assert!(
            kept * 10 < first.len(),
            "{kept} bytes kept of a {}-byte output",
            first.len()
        );
    }

    /// Renders a long manifest that names the values it was given, as a chart does with a Cluster's name.
    #[derive(Debug)]
    struct Named;

    impl ChartRenderer for Named {
        fn render(&self, request: RenderRequest) -> BoxFuture<'_, Result<String, RenderError>> {
            let values = request.values.unwrap_or_default();
            let output = (0..300)
                .map(|i| {
                    format!(
                        "---\nkind: ConfigMap\nmetadata:\n  name: c{i}\ndata:\n  line: \"{}\"\n",
                        i * 7919 % 1013
                    )
                })
                .collect::<String>()
                + &format!("---\nkind: Secret\nmetadata:\n  name: {values}-kubeconfig\n");
            Box::pin(async move { Ok(output) })
        }
    }

    #[tokio::test]
    async fn renders_of_one_chart_keep_little_more_than_their_differences() {
        let chart = chart();
        let renderer = CachingRenderer::new(Named, 1 << 20);
        let first = renderer.render(request(chart.path(), "cluster-1")).await.unwrap();
        let after_first = renderer.entries.lock().unwrap().bytes;
        let second = renderer.render(request(chart.path(), "cluster-2")).await.unwrap();
        let second_kept = renderer.entries.lock().unwrap().bytes - after_first;
        let alone = deflated::deflate(second.as_bytes(), None).len();
        assert!(
            second_kept * 5 < alone,
            "{second_kept} bytes kept for the second Cluster's render, {alone} deflated alone"
        );
        assert_eq!(
            renderer.render(request(chart.path(), "cluster-1")).await.unwrap(),
            first
        );
        assert_eq!(
            renderer.render(request(chart.path(), "cluster-2")).await.unwrap(),
            second
        );
        assert_eq!(renderer.stats(), (2, 2));
    }

    #[tokio::test]
    async fn the_cache_stays_within_its_capacity() {
        let chart = chart();
        let renderer = CachingRenderer::new(Minting::default(), 100);
        for values in ["a", "b", "c", "d"] {
            renderer.render(request(chart.path(), values)).await.unwrap();
        }
        let entries = renderer.entries.lock().unwrap();
        assert!(
            entries.bytes <= 100 && entries.outputs.len() < 4,
            "{} bytes in {} entries",
            entries.bytes,
            entries.outputs.len()
        );
        assert!(
            entries.samples.values().all(Dictionary::is_shared),
            "no sample is kept without an output"
        );
    }
}
