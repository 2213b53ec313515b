//! The local backend: its vectors against the Python reference, the order of
//! its answers, its token counts, and a clear error (never a panic) for every
//! broken set-up.
//!
//! The runtime and the model are found as a run finds them (ORT_DYLIB_PATH,
//! EMBEDJOB_CACHE_DIR, .cache/), so these tests fail, not skip, when
//! scripts/setup-local has not been run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use embedjob::backend::local::{
    AssetSearch, LocalBackend, LocalError, LocalSettings, MAX_LENGTH, MODEL_FILES,
};
use embedjob::backend::BackendKind;
use embedjob::backend::EmbeddingBackend;
use serde_json::Value;

use crate::support::{bin, run, run_with_stdin, text};

fn reference_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference")
}

fn sentences() -> Vec<String> {
    let text = std::fs::read_to_string(reference_dir().join("sentences.txt"))
        .expect("tests/reference/sentences.txt is readable");
    text.lines().map(str::to_string).collect()
}

fn reference_vectors() -> Vec<Vec<f32>> {
    let text = std::fs::read_to_string(reference_dir().join("sentences.ref.json"))
        .expect("tests/reference/sentences.ref.json is readable");
    let json: Value = serde_json::from_str(&text).expect("the reference is JSON");
    assert_eq!(json["dimensions"], 384);
    json["vectors"]
        .as_array()
        .expect("vectors is an array")
        .iter()
        .map(|row| {
            row.as_array()
                .expect("a vector is an array")
                .iter()
                .map(|x| x.as_f64().expect("a number") as f32)
                .collect()
        })
        .collect()
}

fn load(settings: LocalSettings) -> LocalBackend {
    LocalBackend::load(settings).unwrap_or_else(|e| {
        panic!("the local model must load (CI runs scripts/setup-local first): {e}")
    })
}

/// One model for the tests that only embed.
fn backend() -> &'static LocalBackend {
    static BACKEND: OnceLock<LocalBackend> = OnceLock::new();
    BACKEND.get_or_init(|| load(LocalSettings::from_env()))
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

fn refs(texts: &[String]) -> Vec<&str> {
    texts.iter().map(String::as_str).collect()
}

fn assert_matches_reference(rows: Vec<&[f32]>, reference: &[Vec<f32>]) {
    assert_eq!(rows.len(), reference.len());
    for (i, (row, want)) in rows.iter().zip(reference).enumerate() {
        let c = cosine(row, want);
        assert!(c >= 0.9999, "line {}: cosine {c} with the reference", i + 1);
    }
}

#[tokio::test]
async fn vectors_match_the_python_reference() {
    let texts = sentences();
    assert_eq!(texts.len(), 21);
    let vectors = backend().embed(&refs(&texts), 0).await.unwrap();
    assert_eq!(vectors.dimensions, 384);
    assert_eq!(vectors.len(), 21);
    let reference = reference_vectors();
    let worst = vectors
        .rows()
        .zip(&reference)
        .flat_map(|(row, want)| row.iter().zip(want).map(|(a, b)| (a - b).abs()))
        .fold(0f32, f32::max);
    eprintln!("largest difference from the Python reference: {worst:e}");
    assert_matches_reference(vectors.rows().collect(), &reference);
}

#[tokio::test]
async fn small_sorted_batches_come_back_in_input_order() {
    // Batches of 3 texts, grouped by length, over a reversed input.
    let backend = load(LocalSettings {
        batch_size: 3,
        threads: Some(1),
        ..LocalSettings::from_env()
    });
    let mut texts = sentences();
    texts.reverse();
    let mut reference = reference_vectors();
    reference.reverse();
    let vectors = backend.embed(&refs(&texts), 0).await.unwrap();
    assert_matches_reference(vectors.rows().collect(), &reference);
    // The same text gives the same vector whichever batch it lands in.
    let alone = backend.embed(&[texts[0].as_str()], 0).await.unwrap();
    assert!(cosine(alone.row(0), vectors.row(0)) >= 0.99999);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_together_each_get_their_own_vectors() {
    // Requests that queue up are embedded together and split again.
    let texts = sentences();
    let reference = reference_vectors();
    let tokenizer = backend().tokenizer();
    let parts: Vec<(usize, usize)> = vec![(0, 7), (7, 8), (8, 21), (3, 5), (20, 21), (0, 21)];
    let answers = futures::future::join_all(parts.iter().map(|&(from, to)| {
        let texts = &texts;
        async move {
            let slice = refs(&texts[from..to]);
            backend().embed(&slice, 0).await
        }
    }))
    .await;
    for ((from, to), answer) in parts.into_iter().zip(answers) {
        let vectors = answer.unwrap();
        assert_matches_reference(vectors.rows().collect(), &reference[from..to]);
        let tokens: usize = texts[from..to]
            .iter()
            .map(|t| {
                tokenizer
                    .encode(t.as_str(), true)
                    .unwrap()
                    .len()
                    .min(MAX_LENGTH)
            })
            .sum();
        assert_eq!(vectors.usage.prompt_tokens, tokens as u64, "{from}..{to}");
    }
}

#[tokio::test]
async fn paraphrase_pairs_are_closer_than_unrelated_sentences() {
    let texts = sentences();
    let vectors = backend().embed(&refs(&texts), 0).await.unwrap();
    for pair in 0..5 {
        let (a, b) = (2 * pair, 2 * pair + 1);
        let together = cosine(vectors.row(a), vectors.row(b));
        let nearest_other = (10..texts.len())
            .flat_map(|j| {
                [
                    cosine(vectors.row(a), vectors.row(j)),
                    cosine(vectors.row(b), vectors.row(j)),
                ]
            })
            .fold(f64::MIN, f64::max);
        assert!(
            together > nearest_other,
            "lines {}-{}: {together} vs unrelated {nearest_other}",
            a + 1,
            b + 1
        );
    }
}

#[tokio::test]
async fn usage_counts_the_tokens_the_model_sees() {
    let texts = sentences();
    let tokenizer = backend().tokenizer();
    let count = |text: &str| tokenizer.encode(text, true).unwrap().len();
    // The exposed tokenizer counts everything, for the chunker.
    assert_eq!(count(&texts[19]), 179);
    assert_eq!(count(&texts[20]), 323);
    // The model sees at most 256 tokens of a text; usage counts those.
    let long = backend().embed(&[texts[20].as_str()], 0).await.unwrap();
    assert_eq!(long.usage.prompt_tokens, MAX_LENGTH as u64);
    assert_eq!(long.usage.total_tokens, MAX_LENGTH as u64);
    let all = backend().embed(&refs(&texts), 0).await.unwrap();
    let expected: usize = texts.iter().map(|t| count(t).min(MAX_LENGTH)).sum();
    assert_eq!(all.usage.prompt_tokens, expected as u64);
    assert_eq!(backend().info().input_per_1k, Some(0.0));
}

#[tokio::test]
async fn info_describes_the_model() {
    let backend = backend();
    let info = backend.info();
    assert_eq!(info.kind, BackendKind::Local);
    assert_eq!(info.model, "all-MiniLM-L6-v2");
    assert_eq!(info.dimensions, Some(384));
    assert_eq!(info.context_window, Some(256));
    assert!(backend.runtime_path().is_absolute());
    assert!(backend.runtime_version().is_some());
    let before = backend.stats().requests;
    backend.embed(&["one"], 1).await.unwrap();
    assert!(backend.stats().requests > before);
}

#[tokio::test]
async fn empty_requests_and_empty_texts() {
    let none = backend().embed(&[], 0).await.unwrap();
    assert!(none.is_empty());
    assert_eq!(none.usage.total_tokens, 0);
    let blank = backend().embed(&["", " "], 0).await.unwrap();
    assert_eq!(blank.len(), 2);
    assert!(blank.values.iter().all(|v| v.is_finite()));
    // [CLS] and [SEP] only.
    assert_eq!(blank.usage.prompt_tokens, 4);
}

#[test]
fn inference_leaves_the_async_runtime_free() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let texts = sentences();
        let long: Vec<&str> = std::iter::repeat_n(texts[20].as_str(), 48).collect();
        let ticks = Arc::new(AtomicUsize::new(0));
        let counter = ticks.clone();
        // On a one-thread runtime this only ticks while `embed` is waiting.
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(1)).await;
                counter.fetch_add(1, Ordering::Relaxed);
            }
        });
        backend().embed(&long, 0).await.unwrap();
        ticker.abort();
        assert!(
            ticks.load(Ordering::Relaxed) > 0,
            "the runtime was blocked while the model ran"
        );
    });
}

/// Loads with `settings`, checking that any panic was turned into an error.
fn load_error(settings: LocalSettings) -> LocalError {
    match std::panic::catch_unwind(|| LocalBackend::load(settings)) {
        Ok(Ok(_)) => panic!("the load should have failed"),
        Ok(Err(e)) => {
            eprintln!("load error: {e}");
            e
        }
        Err(_) => panic!("the load panicked instead of returning an error"),
    }
}

fn settings_in(search: AssetSearch) -> LocalSettings {
    LocalSettings {
        search,
        ..LocalSettings::from_env()
    }
}

#[test]
fn missing_runtime_says_where_it_looked_and_what_to_run() {
    let empty = tempfile::tempdir().unwrap();
    let err = load_error(settings_in(AssetSearch::in_cache(empty.path())));
    assert!(matches!(err, LocalError::RuntimeMissing { .. }), "{err:?}");
    let message = err.to_string();
    let looked = empty.path().display().to_string();
    for needle in [
        looked.as_str(),
        "scripts/setup-local",
        "ORT_DYLIB_PATH",
        "1.24.0 or newer",
    ] {
        assert!(
            message.contains(needle),
            "{needle:?} missing from: {message}"
        );
    }
}

#[test]
fn runtime_named_as_too_old_is_refused_before_loading() {
    // A stand-in (not a real library): the version is read from its name.
    let cache = tempfile::tempdir().unwrap();
    let lib = cache.path().join("onnxruntime/lib");
    std::fs::create_dir_all(&lib).unwrap();
    let mut bytes = b"\x7fELF".to_vec();
    bytes.resize(4096, 0);
    std::fs::write(lib.join("libonnxruntime.so.1.16.3"), bytes).unwrap();
    std::os::unix::fs::symlink("libonnxruntime.so.1.16.3", lib.join("libonnxruntime.so")).unwrap();
    let err = load_error(settings_in(AssetSearch::in_cache(cache.path())));
    match &err {
        LocalError::RuntimeTooOld { found, path } => {
            assert_eq!(found, "1.16.3");
            assert!(path.ends_with("libonnxruntime.so.1.16.3"), "{path:?}");
        }
        other => panic!("expected RuntimeTooOld, got {other:?}"),
    }
    assert!(err.to_string().contains("1.24.0 or newer"), "{err}");
}

#[test]
fn real_old_runtime_is_refused_even_under_another_name() {
    // onnxruntime 1.23.2 from PyPI, unpacked by scripts/setup-old-runtime.
    let rel = "onnxruntime-1.23.2/lib/libonnxruntime.so.1.23.2";
    let Some(old) = AssetSearch::from_env()
        .cache_dirs
        .iter()
        .map(|dir| dir.join(rel))
        .find(|path| path.is_file())
    else {
        panic!("{rel} is missing: run scripts/setup-old-runtime (scripts/test does)");
    };
    let pinned = |path: PathBuf| {
        settings_in(AssetSearch {
            runtime_path: Some(path),
            ..AssetSearch::from_env()
        })
    };
    let err = load_error(pinned(old.clone()));
    assert!(
        matches!(&err, LocalError::RuntimeTooOld { found, .. } if found == "1.23.2"),
        "{err:?}"
    );
    // Renamed, it still records its version inside.
    let dir = tempfile::tempdir().unwrap();
    let renamed = dir.path().join("libonnxruntime.so");
    std::fs::copy(&old, &renamed).unwrap();
    let err = load_error(pinned(renamed));
    assert!(
        matches!(&err, LocalError::RuntimeTooOld { found, .. } if found == "1.23.2"),
        "{err:?}"
    );
}

#[test]
fn a_file_that_is_not_a_library_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("libonnxruntime.so");
    std::fs::write(&path, "not a library").unwrap();
    let err = load_error(settings_in(AssetSearch {
        runtime_path: Some(path),
        ..AssetSearch::from_env()
    }));
    assert!(
        matches!(err, LocalError::RuntimeNotLibrary { .. }),
        "{err:?}"
    );
}

/// A model folder with every file but `missing`; `model.onnx` holds `onnx`.
fn model_folder(missing: Option<&str>, onnx: &[u8]) -> tempfile::TempDir {
    let real = AssetSearch::from_env()
        .find_model_dir(None, "all-MiniLM-L6-v2")
        .expect("the model is set up (scripts/setup-local)");
    let dir = tempfile::tempdir().unwrap();
    for name in MODEL_FILES {
        if Some(name) == missing {
            continue;
        }
        let target = dir.path().join(name);
        if name == "model.onnx" {
            std::fs::write(target, onnx).unwrap();
        } else {
            std::fs::copy(real.join(name), target).unwrap();
        }
    }
    dir
}

#[test]
fn missing_model_file_is_named() {
    let dir = model_folder(Some("tokenizer.json"), b"");
    let err = load_error(LocalSettings {
        model_dir: Some(dir.path().to_path_buf()),
        ..LocalSettings::from_env()
    });
    match &err {
        LocalError::ModelFileMissing { path } => {
            assert_eq!(path, &dir.path().join("tokenizer.json"))
        }
        other => panic!("expected ModelFileMissing, got {other:?}"),
    }
    assert!(err.to_string().contains("scripts/setup-local"), "{err}");
}

#[test]
fn missing_model_folder_says_where_it_looked() {
    let empty = tempfile::tempdir().unwrap();
    let err = load_error(LocalSettings {
        model_dir: Some(empty.path().join("absent")),
        ..LocalSettings::from_env()
    });
    assert!(matches!(err, LocalError::ModelMissing { .. }), "{err:?}");
    assert!(err.to_string().contains("absent"), "{err}");
}

#[test]
fn corrupt_model_is_an_error_not_a_panic() {
    let dir = model_folder(None, b"this is not an ONNX model");
    let err = load_error(LocalSettings {
        model_dir: Some(dir.path().to_path_buf()),
        ..LocalSettings::from_env()
    });
    assert!(matches!(err, LocalError::ModelInvalid { .. }), "{err:?}");
}

#[test]
fn declared_dimensions_must_match_the_model() {
    let err = load_error(LocalSettings {
        dimensions: Some(1024),
        ..LocalSettings::from_env()
    });
    assert!(
        matches!(
            err,
            LocalError::DimensionsMismatch {
                declared: 1024,
                found: 384,
                ..
            }
        ),
        "{err:?}"
    );
}

/// `embed --local`: the local model from the command line, no key and no
/// server; `-` reads the texts from stdin, one per line.
#[tokio::test]
async fn embed_uses_the_local_model_with_texts_from_stdin() {
    // The last sentence is over the model's window, which `embed` refuses
    // (see inputs::embed_local_refuses_a_text_over_the_models_window).
    let mut texts = sentences();
    texts.pop();
    let mut command = bin();
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["embed", "--local", "--json", "-"]);
    let output = run_with_stdin(command, format!("{}\n\n", texts.join("\n")).into_bytes()).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let value: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(value["backend"], "local");
    assert_eq!(value["model"], "all-MiniLM-L6-v2");
    assert_eq!(value["dimensions"], 384);
    let rows: Vec<Vec<f32>> = serde_json::from_value(value["embeddings"].clone()).unwrap();
    assert_matches_reference(
        rows.iter().map(Vec::as_slice).collect(),
        &reference_vectors()[..texts.len()],
    );

    let mut command = bin();
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["embed", "--local", &texts[0], &texts[1]]);
    let output = run(command).await;
    let stdout = text(&output.stdout);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
    assert!(stdout.starts_with("0\t384\t["), "{stdout}");
    assert!(
        stderr.contains("2 vectors of 384 dimensions from the local model"),
        "{stderr}"
    );
    assert!(!stderr.contains("billed"), "{stderr}");
}
