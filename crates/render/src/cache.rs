//! Identical inputs render once: a renderer that remembers outputs by (chart content digest, release,
//! namespace, values, kube version, API versions, CRD flag, target). Besides saving Helm runs, this keeps
//! renders stable for charts that mint secrets on every render (Cilium's Hubble server certificate): the
//! same output is re-applied, so nothing changes on the cluster. Outputs are kept compressed (manifests are
//! repetitive YAML: a ferrol addon render of 25 KiB keeps about 4 KiB), and the cache is bounded by their
//! total compressed size: with a kubeconfig of its own per Cluster, each Cluster's render is an entry.

use std::{
    collections::{HashMap, VecDeque},
    path::Path,
    sync::{Arc, Mutex},
};

use futures::future::BoxFuture;
use sha2::{Digest, Sha256};

use crate::{ChartRenderer, RenderError, RenderRequest};

/// Default bound of the cached outputs (compressed).
pub const DEFAULT_CAPACITY_BYTES: usize = 64 << 20;

#[derive(Debug, Default)]
struct Entries {
    /// Deflated outputs.
    outputs: HashMap<[u8; 32], Arc<[u8]>>,
    order: VecDeque<[u8; 32]>,
    bytes: usize,
    hits: u64,
    misses: u64,
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
            let output = cached.as_deref().and_then(inflate);
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
                        entries.bytes -= dropped.len();
                    }
                }
            }
            if let Some(output) = output {
                return Ok(output);
            }
            let output = self.inner.render(request).await?;
            let Some(deflated) = deflate(&output) else {
                return Ok(output);
            };
            let mut entries = self.lock();
            if deflated.len() <= self.capacity_bytes && !entries.outputs.contains_key(&key) {
                while entries.bytes + deflated.len() > self.capacity_bytes {
                    let Some(oldest) = entries.order.pop_front() else {
                        break;
                    };
                    if let Some(evicted) = entries.outputs.remove(&oldest) {
                        entries.bytes -= evicted.len();
                    }
                }
                entries.bytes += deflated.len();
                entries.order.push_back(key);
                entries.outputs.insert(key, deflated.into());
            }
            Ok(output)
        })
    }
}

fn deflate(text: &str) -> Option<Vec<u8>> {
    use std::io::Write;
    let mut encoder = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(text.as_bytes()).ok()?;
    encoder.finish().ok()
}

fn inflate(bytes: &[u8]) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    flate2::read::DeflateDecoder::new(bytes)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
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
                Ok(format!(
                    "{}-{}-secret-{n}",
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

    #[tokio::test]
    async fn the_cache_stays_within_its_capacity() {
        let chart = chart();
        let renderer = CachingRenderer::new(Minting::default(), 40);
        for values in ["a", "b", "c", "d"] {
            renderer.render(request(chart.path(), values)).await.unwrap();
        }
        let entries = renderer.entries.lock().unwrap();
        assert!(
            entries.bytes <= 40 && entries.outputs.len() < 4,
            "{} bytes in {} entries",
            entries.bytes,
            entries.outputs.len()
        );
    }
}
