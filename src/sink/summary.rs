//! The run summary, `<output>.summary.json`.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::atomic::{with_suffix, TempFile};
use super::SinkError;

/// `<output>.summary.json`.
pub fn summary_path(output: &Path) -> PathBuf {
    with_suffix(output, ".summary.json")
}

/// Writes `value` as pretty-printed JSON to `path`, complete or not at all:
/// through a temporary file in the same directory (created if missing), fsynced
/// and renamed over `path`.
pub fn write_json_atomically(path: &Path, value: &serde_json::Value) -> Result<(), SinkError> {
    let (temp, file) = TempFile::create(path)?;
    let temp_path = temp.temp_path().to_path_buf();
    let mut writer = BufWriter::new(file);
    serde_json::to_writer_pretty(&mut writer, value).map_err(|source| SinkError::Json {
        path: temp_path.clone(),
        source,
    })?;
    let io_error = |source| SinkError::Io {
        path: temp_path.clone(),
        action: "cannot write",
        source,
    };
    writer.write_all(b"\n").map_err(io_error)?;
    let file = writer.into_inner().map_err(|e| io_error(e.into_error()))?;
    temp.commit(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::testing::names;

    #[test]
    fn summary_is_written_and_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = summary_path(&dir.path().join("out/docs.parquet"));
        assert_eq!(path, dir.path().join("out/docs.parquet.summary.json"));

        write_json_atomically(&path, &serde_json::json!({"rows": 1})).unwrap();
        write_json_atomically(&path, &serde_json::json!({"rows": 2, "cost": null})).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with('\n'));
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value, serde_json::json!({"rows": 2, "cost": null}));
        assert_eq!(
            names(&dir.path().join("out")),
            ["docs.parquet.summary.json"]
        );
    }

    #[test]
    fn a_path_without_a_file_name_is_an_error() {
        let error = write_json_atomically(Path::new("/"), &serde_json::json!({})).unwrap_err();
        assert!(matches!(error, SinkError::InvalidPath { .. }), "{error}");
    }
}
