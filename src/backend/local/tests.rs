use super::model::answer;
use super::*;

fn v(major: u32, minor: u32, patch: u32) -> RuntimeVersion {
    RuntimeVersion {
        major,
        minor,
        patch,
    }
}

#[test]
fn versions_from_file_names() {
    assert_eq!(
        version_from_file_name("libonnxruntime.so.1.31.1"),
        Some(v(1, 31, 1))
    );
    assert_eq!(
        version_from_file_name("libonnxruntime.1.16.3.dylib"),
        Some(v(1, 16, 3))
    );
    assert_eq!(
        version_from_file_name("libonnxruntime.so.1.24"),
        Some(v(1, 24, 0))
    );
    assert_eq!(version_from_file_name("libonnxruntime.so.1"), None);
    assert_eq!(version_from_file_name("libonnxruntime.so"), None);
    assert_eq!(version_from_file_name("libother.so.1.2.3"), None);
}

#[test]
fn versions_compare_numerically() {
    assert!(v(1, 9, 0) < MIN_RUNTIME_VERSION);
    assert!(v(1, 23, 2) < MIN_RUNTIME_VERSION);
    assert!(v(1, 24, 0) >= MIN_RUNTIME_VERSION);
    assert!(v(1, 100, 0) > MIN_RUNTIME_VERSION);
    assert_eq!(v(1, 31, 1).to_string(), "1.31.1");
}

#[test]
fn version_marker_is_found_anywhere_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    // Placed to straddle the 1 MiB blocks the scan reads.
    for offset in [0usize, 100, (1 << 20) - 7, (1 << 20) - 2, 3 << 20] {
        let path = dir.path().join(format!("lib{offset}"));
        let mut bytes = vec![0u8; offset];
        bytes.extend_from_slice(b"xVERS_\0VERS_1.23.2\0more");
        bytes.resize(bytes.len() + 64, 0);
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(
            version_from_bytes(&path).unwrap(),
            Some(v(1, 23, 2)),
            "offset {offset}"
        );
    }
    let path = dir.path().join("none");
    std::fs::write(&path, b"\x7fELF no marker here VERS_").unwrap();
    assert_eq!(version_from_bytes(&path).unwrap(), None);
}

#[test]
fn the_first_existing_place_wins() {
    let empty = tempfile::tempdir().unwrap();
    let full = tempfile::tempdir().unwrap();
    let lib_dir = full.path().join("onnxruntime").join("lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    std::fs::write(lib_dir.join(runtime_file_name()), b"x").unwrap();
    std::fs::create_dir_all(full.path().join("models").join("m")).unwrap();
    let search = AssetSearch {
        runtime_path: None,
        model_dir: None,
        cache_dirs: vec![empty.path().to_path_buf(), full.path().to_path_buf()],
    };
    assert_eq!(
        search.find_runtime().unwrap(),
        lib_dir.join(runtime_file_name())
    );
    assert_eq!(
        search.find_model_dir(None, "m").unwrap(),
        full.path().join("models").join("m")
    );
    // A configured folder is the only place looked at.
    let err = search
        .find_model_dir(Some(empty.path().join("nope").as_path()), "m")
        .unwrap_err();
    assert!(matches!(err, LocalError::ModelMissing { ref looked } if looked.len() == 1));
    // So is ORT_DYLIB_PATH.
    let pinned = AssetSearch {
        runtime_path: Some(empty.path().join("libonnxruntime.so")),
        ..search
    };
    let err = pinned.find_runtime().unwrap_err();
    assert!(matches!(err, LocalError::RuntimeMissing { ref looked } if looked.len() == 1));
}

#[test]
fn answers_are_checked_like_any_response() {
    let ok = answer(2, vec![vec![0.6, 0.8], vec![1.0, 0.0]], &[3, 4], 2).unwrap();
    assert_eq!(ok.row(1), &[1.0, 0.0]);
    assert_eq!(ok.usage.prompt_tokens, 7);
    let short = answer(2, vec![vec![0.6, 0.8]], &[3], 2).unwrap_err();
    assert!(short.starts_with("item count"), "{short}");
    let missing = answer(1, vec![Vec::new()], &[3], 2).unwrap_err();
    assert!(missing.starts_with("vector length"), "{missing}");
    let nan = answer(1, vec![vec![f32::NAN, 0.0]], &[3], 2).unwrap_err();
    assert!(nan.starts_with("finite values"), "{nan}");
}

#[test]
fn zero_settings_are_refused() {
    let mut settings = LocalSettings::from_env();
    settings.batch_size = 0;
    let err = LocalBackend::load(settings).unwrap_err();
    assert_eq!(err.to_string(), "`backend.batch_size` must be at least 1");
}
