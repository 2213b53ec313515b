//! The local backend: a sentence-transformers ONNX model (all-MiniLM-L6-v2 by
//! default) run in-process with fastembed. No key, no network.
//!
//! ONNX Runtime is a shared library loaded at run time, and an absent or too
//! old one makes `ort` panic. So everything that can be checked is checked
//! before `ort` sees the file, and the load itself runs under `catch_unwind`:
//! a bad set-up is a [`LocalError`] that says how to fix it, never a panic.
//!
//! Inference runs on one dedicated thread that owns the model. [`embed`]
//! sends its texts over a bounded channel and awaits a one-shot reply, so it
//! never blocks the async runtime and no lock is held across inference.
//! Within a request, texts are sorted by token count and embedded in
//! sub-batches of similar length, because padding dominates the cost of
//! mixed-length text; the vectors are put back in input order and checked by
//! [`crate::validate::check`] like any backend's.
//!
//! [`embed`]: crate::backend::EmbeddingBackend::embed

mod config;

pub use self::config::{local_backend, Kind, LocalParams};

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::job::BackendConfig;
use crate::warnings::{Warning, Warnings};

mod assets;
mod model;
mod runtime;
#[cfg(test)]
mod tests;
mod thread;

pub use assets::AssetSearch;
pub use runtime::{
    runtime_file_name, runtime_version, version_from_bytes, version_from_file_name, RuntimeVersion,
};
pub use thread::LocalBackend;

/// The model used when `backend.model` is not set.
pub const DEFAULT_MODEL: &str = "all-MiniLM-L6-v2";
/// Tokens the model sees per text, `[CLS]` and `[SEP]` included; longer texts
/// are cut. sentence-transformers uses 256 for this model, although its
/// `tokenizer.json` says 128.
pub const MAX_LENGTH: usize = 256;
/// Texts per inference call. Small batches of similar length waste little
/// on padding.
pub const DEFAULT_BATCH_SIZE: usize = 32;
/// Requests waiting for the model when no job sets `backend.concurrency`.
pub const DEFAULT_QUEUE_CAPACITY: usize = 8;
/// The oldest ONNX Runtime that fastembed 7.5 (`ort` 2.0.0-rc.15) can use.
pub const MIN_RUNTIME_VERSION: RuntimeVersion = RuntimeVersion {
    major: 1,
    minor: 24,
    patch: 0,
};
/// The files a model folder must hold.
pub const MODEL_FILES: [&str; 5] = [
    "model.onnx",
    "tokenizer.json",
    "config.json",
    "special_tokens_map.json",
    "tokenizer_config.json",
];

/// Environment variables the asset search reads.
pub const ORT_DYLIB_PATH_ENV: &str = "ORT_DYLIB_PATH";
pub const MODEL_DIR_ENV: &str = "EMBEDJOB_MODEL_DIR";
pub const CACHE_DIR_ENV: &str = "EMBEDJOB_CACHE_DIR";

const THREAD_NAME: &str = "embedjob-local-model";
const SETUP_HINT: &str = "run scripts/setup-local";

/// Why the local model could not be loaded. Each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error(
        "ONNX Runtime not found at {}: {SETUP_HINT}, or set ORT_DYLIB_PATH to the absolute path of {} ({MIN_RUNTIME_VERSION} or newer)",
        list(.looked),
        runtime_file_name()
    )]
    RuntimeMissing { looked: Vec<PathBuf> },
    #[error(
        "ONNX Runtime at {} is version {found}, but {MIN_RUNTIME_VERSION} or newer is needed: {SETUP_HINT}, or point ORT_DYLIB_PATH at a newer {}",
        .path.display(),
        runtime_file_name()
    )]
    RuntimeTooOld { found: String, path: PathBuf },
    #[error(
        "{} is not a shared library, so it cannot be ONNX Runtime: {SETUP_HINT}, or point ORT_DYLIB_PATH at {}",
        .path.display(),
        runtime_file_name()
    )]
    RuntimeNotLibrary { path: PathBuf },
    #[error("cannot read ONNX Runtime at {}: {source}", .path.display())]
    RuntimeUnreadable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot load ONNX Runtime from {}: {message}; {SETUP_HINT}, or point ORT_DYLIB_PATH at a working {}", .path.display(), runtime_file_name())]
    RuntimeLoad { path: PathBuf, message: String },
    #[error(
        "this process already loaded ONNX Runtime from {}, and one process can use only one; cannot load {} as well",
        .loaded.display(),
        .requested.display()
    )]
    RuntimeConflict { loaded: PathBuf, requested: PathBuf },
    #[error(
        "model folder not found at {}: {SETUP_HINT}, or set `backend.model_dir` (or EMBEDJOB_MODEL_DIR) to a folder holding {}",
        list(.looked),
        MODEL_FILES.join(", ")
    )]
    ModelMissing { looked: Vec<PathBuf> },
    #[error("model file {} is missing: {SETUP_HINT}, or set `backend.model_dir` to a complete model folder", .path.display())]
    ModelFileMissing { path: PathBuf },
    #[error("cannot load the model in {}: {message}", .dir.display())]
    ModelInvalid { dir: PathBuf, message: String },
    #[error("`backend.dimensions` is {declared} but the model in {} makes vectors of length {found}", .dir.display())]
    DimensionsMismatch {
        declared: usize,
        found: usize,
        dir: PathBuf,
    },
    #[error("`backend.{key}` {message}")]
    Setting { key: &'static str, message: String },
    #[error("loading the local model failed unexpectedly: {message}")]
    Panicked { message: String },
    #[error("cannot start the local model's thread: {0}")]
    Thread(#[source] io::Error),
}

fn list(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "(no place to look)".to_string();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// How to load the local model.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalSettings {
    /// The model's name, reported in the output and used to find its folder
    /// in the cache.
    pub model: String,
    /// `backend.model_dir`: the folder holding [`MODEL_FILES`].
    pub model_dir: Option<PathBuf>,
    /// `backend.dimensions`: when set, the model's vector length must agree.
    pub dimensions: Option<usize>,
    /// `backend.threads`: ONNX Runtime intra-op threads; `None` uses every
    /// available core.
    pub threads: Option<usize>,
    /// `backend.batch_size`: texts per inference call.
    pub batch_size: usize,
    /// Requests waiting for the model before `embed` waits to send
    /// (`backend.concurrency` in a job).
    pub queue_capacity: usize,
    pub search: AssetSearch,
}

impl LocalSettings {
    /// The defaults, finding the assets as a run does.
    pub fn from_env() -> LocalSettings {
        LocalSettings {
            model: DEFAULT_MODEL.to_string(),
            model_dir: None,
            dimensions: None,
            threads: None,
            batch_size: DEFAULT_BATCH_SIZE,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            search: AssetSearch::from_env(),
        }
    }

    /// The settings of a job's `[backend]`, finding the assets as a run does.
    pub fn from_config(config: &BackendConfig) -> LocalSettings {
        let shared = &config.shared;
        let local = config.get::<LocalParams>().cloned().unwrap_or_default();
        LocalSettings {
            model: shared
                .model
                .clone()
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| DEFAULT_MODEL.to_string()),
            model_dir: local.model_dir,
            dimensions: shared.dimensions,
            threads: local.threads,
            batch_size: local.batch_size.unwrap_or(DEFAULT_BATCH_SIZE),
            queue_capacity: match shared.concurrency {
                crate::job::Concurrency::Auto => DEFAULT_QUEUE_CAPACITY,
                crate::job::Concurrency::Fixed(n) => n.max(1),
            },
            search: AssetSearch::from_env(),
        }
    }

    fn check(&self) -> Result<(), LocalError> {
        let positive = |key, value: usize| {
            if value == 0 {
                Err(LocalError::Setting {
                    key,
                    message: "must be at least 1".to_string(),
                })
            } else {
                Ok(())
            }
        };
        positive("batch_size", self.batch_size)?;
        positive("concurrency", self.queue_capacity)?;
        if let Some(threads) = self.threads {
            positive("threads", threads)?;
        }
        Ok(())
    }
}

/// The ONNX Runtime this process loaded. `ort` allows one library and one
/// environment per process, so every local backend shares them.
static RUNTIME: Mutex<Option<(PathBuf, ort::environment::Environment)>> = Mutex::new(None);

fn environment(path: &Path) -> Result<ort::environment::Environment, LocalError> {
    let mut slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((loaded, environment)) = slot.as_ref() {
        return if loaded == path {
            Ok(environment.clone())
        } else {
            Err(LocalError::RuntimeConflict {
                loaded: loaded.clone(),
                requested: path.to_path_buf(),
            })
        };
    }
    // An explicit path, so ORT_DYLIB_PATH never has to be set for ort.
    let builder = ort::init_from(path).map_err(|e| match e {
        ort::LoadDynamicError::BadVersion { version_str, path } => LocalError::RuntimeTooOld {
            found: version_str,
            path,
        },
        other => LocalError::RuntimeLoad {
            path: path.to_path_buf(),
            message: other.to_string(),
        },
    })?;
    let environment = builder
        .with_name("embedjob")
        .with_telemetry(false)
        .with_logger(Arc::new(runtime_log))
        .build()
        .map_err(|e| LocalError::RuntimeLoad {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    // Warnings (e.g. about graph optimisations) are noise for a batch job.
    environment.set_log_level(ort::logging::LogLevel::Error);
    *slot = Some((path.to_path_buf(), environment.clone()));
    Ok(environment)
}

/// What ONNX Runtime logs, for the command to print: one runtime per
/// process, so one place for every local backend.
static RUNTIME_LOG: std::sync::LazyLock<Warnings> = std::sync::LazyLock::new(Warnings::new);

fn runtime_log(level: ort::logging::LogLevel, _category: &str, _id: &str, _at: &str, text: &str) {
    if level >= ort::logging::LogLevel::Error {
        RUNTIME_LOG.push(Warning::logged("onnxruntime", text));
    }
}
