//! Gzipped tar archives for tests: building one from files in memory, and reading the regular files of one
//! (to derive a test release from a real one).

use std::{io::Read, path::Path};

/// A gzipped tar of the regular files `(path, content)`, mode 0644.
pub fn tgz<P: AsRef<str>, C: AsRef<[u8]>>(files: &[(P, C)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    for (path, content) in files {
        let content = content.as_ref();
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        // Writing into memory cannot fail; a path tar cannot hold is a bug in the test that built it.
        builder
            .append_data(&mut header, path.as_ref(), content)
            .unwrap_or_else(|e| panic!("{}: {e}", path.as_ref()));
    }
    builder
        .into_inner()
        .and_then(|encoder| encoder.finish())
        .unwrap_or_else(|e| panic!("building a tar archive in memory: {e}"))
}

/// The regular files of the gzipped tar at `archive`, as `(path, content)`, in archive order (directories and
/// links are left out).
pub fn files_of(archive: &Path) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let mut reader = tar::Archive::new(flate2::read::GzDecoder::new(std::fs::File::open(archive)?));
    let mut files = Vec::new();
    for entry in reader.entries()? {
        let mut entry = entry?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let path = entry.path()?.to_string_lossy().into_owned();
        let mut content = Vec::new();
        entry.read_to_end(&mut content)?;
        files.push((path, content));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_built_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.tgz");
        std::fs::write(
            &path,
            tgz(&[("c/Chart.yaml", "name: c\n"), ("c/values.yaml", "")]),
        )
        .unwrap();
        assert_eq!(
            files_of(&path).unwrap(),
            [
                ("c/Chart.yaml".to_owned(), b"name: c\n".to_vec()),
                ("c/values.yaml".to_owned(), Vec::new())
            ]
        );
    }
}
