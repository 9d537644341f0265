//! Text kept deflated against a sample of alike text. What the operator keeps per Cluster repeats from one
//! Cluster to the next (the Clusters of a site share their class, network and conditions; the renders of one
//! chart differ in a few values): deflated against a sample of its kind, each keeps little more than what
//! tells it apart. Raw deflate with a preset dictionary, as zlib defines it; the dictionary is part of the
//! format, so text deflated against one sample inflates only against the same sample.
//!
//! Deflate refers back at most 32 KiB: a byte of the text finds its like in the sample only if the two are at
//! most 32 KiB apart, so the sample helps texts up to about that size (a Cluster's object, ferrol's 25 KiB
//! addon render) and a larger text hardly more than deflate alone.
//!
//! Each thread keeps one deflate and one inflate state and resets them between texts: a deflate state is
//! about 300 KiB, and making one per text (per Cluster event) left the allocator's arenas fragmented by them
//! (a resident size half as large again at 1000 Clusters, with less heap in use).

use std::{cell::RefCell, sync::Arc, thread::LocalKey};

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// Deflate refers back at most this far: a sample's bytes before its last 32 KiB cannot be used.
const WINDOW: usize = 32 * 1024;

/// The sample text is deflated against (at most its last 32 KiB), shared by everything deflated against it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dictionary(Arc<[u8]>);

impl Dictionary {
    /// A dictionary of `sample`'s last 32 KiB.
    pub fn from_sample(sample: &[u8]) -> Self {
        Dictionary(sample[sample.len().saturating_sub(WINDOW)..].into())
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether something besides this handle uses it (what was deflated against it, kept elsewhere).
    pub fn is_shared(&self) -> bool {
        Arc::strong_count(&self.0) > 1
    }

    /// Whether it is empty (deflating against it is plain deflate).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Why kept bytes did not inflate: they were not deflated against this dictionary, or they are cut short.
#[derive(Debug, thiserror::Error)]
#[error("deflated text does not inflate: {0}")]
pub struct InflateError(String);

thread_local! {
    static DEFLATE: RefCell<Option<Compress>> = const { RefCell::new(None) };
    static INFLATE: RefCell<Option<Decompress>> = const { RefCell::new(None) };
}

/// Runs `work` with this thread's kept state of `kept` (made by `make` the first time), and keeps it again. It is
/// taken out while in use, so that nothing can find it half used; `work` resets it first.
fn with_kept<S, T>(
    kept: &'static LocalKey<RefCell<Option<S>>>,
    make: impl FnOnce() -> S,
    work: impl FnOnce(&mut S) -> T,
) -> T {
    let mut state = kept.with_borrow_mut(Option::take).unwrap_or_else(make);
    let out = work(&mut state);
    kept.with_borrow_mut(|slot| *slot = Some(state));
    out
}

/// Grows `out` when it is full, so that the next step of a stream has room to write.
fn make_room(out: &mut Vec<u8>) {
    if out.len() == out.capacity() {
        out.reserve(out.capacity().max(256));
    }
}

/// `text` deflated against `dictionary`.
pub fn deflate(text: &[u8], dictionary: Option<&Dictionary>) -> Vec<u8> {
    with_kept(
        &DEFLATE,
        || Compress::new(Compression::default(), false),
        |compress| {
            compress.reset();
            deflate_with(compress, text, dictionary)
        },
    )
}

fn deflate_with(compress: &mut Compress, text: &[u8], dictionary: Option<&Dictionary>) -> Vec<u8> {
    if let Some(dictionary) = dictionary.filter(|d| !d.is_empty()) {
        // Setting a dictionary fails only once compression has begun.
        let _ = compress.set_dictionary(&dictionary.0);
    }
    let mut out = Vec::with_capacity(text.len() / 4 + 64);
    loop {
        make_room(&mut out);
        let (read, written) = (compress.total_in(), out.len());
        let rest = &text[usize::try_from(read).unwrap_or(usize::MAX).min(text.len())..];
        match compress.compress_vec(rest, &mut out, FlushCompress::Finish) {
            Ok(Status::StreamEnd) => break,
            Ok(_) if compress.total_in() > read || out.len() > written || out.len() == out.capacity() => {}
            // Neither fails nor stalls with room to write; should it, keep the text stored as it is.
            _ => return stored(text),
        }
    }
    out.shrink_to_fit();
    out
}

/// Deflate's stored form of `text` (its bytes as they are, in blocks): it refers to no dictionary, so it
/// inflates against any.
fn stored(text: &[u8]) -> Vec<u8> {
    const BLOCK: usize = 0xffff;
    let mut out = Vec::with_capacity(text.len() + (text.len() / BLOCK + 1) * 5);
    let mut blocks = text.chunks(BLOCK).peekable();
    if blocks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(block) = blocks.next() {
        let len = u16::try_from(block.len()).unwrap_or(u16::MAX);
        out.push(u8::from(blocks.peek().is_none()));
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    out
}

/// `bytes`, deflated against `dictionary`, inflated.
pub fn inflate(bytes: &[u8], dictionary: Option<&Dictionary>) -> Result<Vec<u8>, InflateError> {
    with_kept(
        &INFLATE,
        || Decompress::new(false),
        |decompress| {
            decompress.reset(false);
            inflate_with(decompress, bytes, dictionary)
        },
    )
}

fn inflate_with(
    decompress: &mut Decompress,
    bytes: &[u8],
    dictionary: Option<&Dictionary>,
) -> Result<Vec<u8>, InflateError> {
    if let Some(dictionary) = dictionary.filter(|d| !d.is_empty()) {
        decompress
            .set_dictionary(&dictionary.0)
            .map_err(|e| InflateError(e.to_string()))?;
    }
    let mut out = Vec::with_capacity(bytes.len() * 4 + 64);
    loop {
        make_room(&mut out);
        let (read, written) = (decompress.total_in(), out.len());
        let rest = &bytes[usize::try_from(read).unwrap_or(usize::MAX).min(bytes.len())..];
        match decompress.decompress_vec(rest, &mut out, FlushDecompress::Finish) {
            Ok(Status::StreamEnd) => return Ok(out),
            Ok(_) if decompress.total_in() > read || out.len() > written || out.len() == out.capacity() => {}
            Ok(_) => return Err(InflateError("the stream is cut short".to_owned())),
            Err(e) => return Err(InflateError(e.to_string())),
        }
    }
}

/// [`inflate`], as UTF-8 text.
pub fn inflate_text(bytes: &[u8], dictionary: Option<&Dictionary>) -> Result<String, InflateError> {
    String::from_utf8(inflate(bytes, dictionary)?).map_err(|e| InflateError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(name: &str, host: &str) -> String {
        format!(
            r#"{{"apiVersion":"cluster.x-k8s.io/v1beta2","kind":"Cluster","metadata":{{"name":"{name}","namespace":"tenant"}},"spec":{{"controlPlaneEndpoint":{{"host":"{host}","port":6443}},"clusterNetwork":{{"pods":{{"cidrBlocks":["192.168.0.0/16"]}}}},"topology":{{"classRef":{{"name":"docker-ferrol-1-27-v1"}},"version":"v1.27.3","workers":{{"machineDeployments":[{{"class":"workers","name":"md-0","replicas":3}}]}}}}}},"status":{{"phase":"Provisioned","conditions":[{{"type":"Ready","status":"True"}},{{"type":"ControlPlaneReady","status":"True"}}]}}}}"#
        )
    }

    #[test]
    fn text_comes_back_as_it_was_with_and_without_a_dictionary() {
        let sample = cluster("first", "10.0.0.1");
        let dictionary = Dictionary::from_sample(sample.as_bytes());
        for text in [String::new(), cluster("second", "10.0.0.2"), "x".repeat(200_000)] {
            for dict in [None, Some(&dictionary)] {
                let kept = deflate(text.as_bytes(), dict);
                assert_eq!(inflate_text(&kept, dict).unwrap(), text);
            }
        }
    }

    #[test]
    fn alike_text_keeps_little_more_than_its_differences() {
        let dictionary = Dictionary::from_sample(cluster("first", "10.0.0.1").as_bytes());
        let text = cluster("second", "10.0.0.2");
        let plain = deflate(text.as_bytes(), None).len();
        let against = deflate(text.as_bytes(), Some(&dictionary)).len();
        assert!(
            against * 3 < plain,
            "{against} bytes against the sample, {plain} without"
        );
    }

    #[test]
    fn only_the_same_dictionary_inflates_it() {
        let first = Dictionary::from_sample(cluster("first", "10.0.0.1").as_bytes());
        let other = Dictionary::from_sample(b"something else entirely, not a Cluster at all");
        let text = cluster("second", "10.0.0.2");
        let kept = deflate(text.as_bytes(), Some(&first));
        assert!(inflate_text(&kept, Some(&other)).map_or(true, |wrong| wrong != text));
        assert!(inflate_text(&kept, None).map_or(true, |wrong| wrong != text));
        assert!(
            inflate(&kept[..kept.len() / 2], Some(&first)).is_err(),
            "a stream cut short is an error"
        );
    }

    #[test]
    fn the_stored_form_inflates_against_any_dictionary() {
        let dictionary = Dictionary::from_sample(b"a sample");
        for text in [Vec::new(), b"short".to_vec(), vec![7u8; 200_000]] {
            assert_eq!(inflate(&stored(&text), Some(&dictionary)).unwrap(), text);
            assert_eq!(inflate(&stored(&text), None).unwrap(), text);
        }
    }

    #[test]
    fn a_dictionary_keeps_only_the_window_deflate_can_refer_to() {
        let sample = vec![b'a'; WINDOW + 100];
        assert_eq!(Dictionary::from_sample(&sample).len(), WINDOW);
        assert_eq!(Dictionary::from_sample(b"abc").len(), 3);
    }
}
