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
//! [`validate::check`] like any backend's.
//!
//! [`embed`]: EmbeddingBackend::embed

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once, PoisonError};

use fastembed::{
    InitOptionsUserDefined, OutputKey, Pooling, TextEmbedding, TokenizerFiles,
    UserDefinedEmbeddingModel,
};
use futures::future::BoxFuture;
use futures::FutureExt;
use tokenizers::Tokenizer;
use tokio::sync::{mpsc, oneshot};

use super::{BackendError, BackendInfo, BackendStats, EmbeddingBackend};
use crate::job::{BackendConfig, BackendKind};
use crate::types::{RawVectors, Usage, Vectors};
use crate::validate;

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

/// The platform's file name of ONNX Runtime, e.g. `libonnxruntime.so`.
pub fn runtime_file_name() -> String {
    format!(
        "{}onnxruntime{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    )
}

/// An ONNX Runtime release number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuntimeVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl fmt::Display for RuntimeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl RuntimeVersion {
    /// Reads the leading `MAJOR.MINOR[.PATCH]` of `text`.
    fn parse_prefix(text: &[u8]) -> Option<RuntimeVersion> {
        let end = text
            .iter()
            .position(|b| !(b.is_ascii_digit() || *b == b'.'))
            .unwrap_or(text.len());
        let text = std::str::from_utf8(&text[..end]).ok()?;
        Self::from_parts(text.split('.'))
    }

    fn from_parts<'a>(mut parts: impl Iterator<Item = &'a str>) -> Option<RuntimeVersion> {
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = match parts.next() {
            Some(p) => p.parse().ok()?,
            None => 0,
        };
        Some(RuntimeVersion {
            major,
            minor,
            patch,
        })
    }
}

/// The version a library file name carries, as in `libonnxruntime.so.1.31.1`
/// or `libonnxruntime.1.31.1.dylib`: the first run of numeric dot-separated
/// parts after `onnxruntime`.
pub fn version_from_file_name(name: &str) -> Option<RuntimeVersion> {
    let (_, rest) = name.split_once("onnxruntime")?;
    let parts: Vec<&str> = rest.split('.').collect();
    let numeric = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    let start = parts.iter().position(numeric)?;
    let run: Vec<&str> = parts[start..].iter().copied().take_while(numeric).collect();
    if run.len() < 2 {
        return None;
    }
    RuntimeVersion::from_parts(run.into_iter())
}

/// The marker ONNX Runtime's linker script puts in its symbol versions
/// (`VERS_1.31.1`); it sits in the first few kilobytes of the ELF file.
const VERSION_MARKER: &[u8] = b"VERS_";

/// Finds the version recorded inside a library by scanning its bytes for
/// `VERS_<version>`, without loading it. `None` when the file holds no marker
/// (builds for other platforms, or a file that is not ONNX Runtime).
pub fn version_from_bytes(path: &Path) -> io::Result<Option<RuntimeVersion>> {
    const BLOCK: usize = 1 << 20;
    // Long enough for a marker and its version to straddle two blocks.
    const KEEP: usize = 32;
    let mut file = File::open(path)?;
    let mut buffer = Vec::with_capacity(BLOCK + KEEP);
    let mut block = vec![0u8; BLOCK];
    loop {
        let read = file.read(&mut block)?;
        let at_end = read == 0;
        buffer.extend_from_slice(&block[..read]);
        let mut from = 0;
        while let Some(found) = memchr::memmem::find(&buffer[from..], VERSION_MARKER) {
            let start = from + found + VERSION_MARKER.len();
            let tail = &buffer[start..];
            // A marker too near the end of the buffer is read again with the next block.
            if !at_end && tail.len() < KEEP {
                break;
            }
            if let Some(version) = RuntimeVersion::parse_prefix(tail) {
                return Ok(Some(version));
            }
            from = start;
        }
        if at_end {
            return Ok(None);
        }
        let keep_from = buffer.len().saturating_sub(KEEP);
        buffer.drain(..keep_from);
    }
}

/// The version of the ONNX Runtime library at `path`, without loading it.
///
/// The bytes are the truth (a renamed file keeps its `VERS_` marker), so
/// they are read first; the name of the file the path resolves to, after
/// symlinks, is the fallback. `None` when neither says.
pub fn runtime_version(path: &Path) -> io::Result<Option<RuntimeVersion>> {
    if let Some(version) = version_from_bytes(path)? {
        return Ok(Some(version));
    }
    let resolved = std::fs::canonicalize(path)?;
    Ok(resolved
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(version_from_file_name))
}

/// Whether the file starts like a shared library of this platform.
fn looks_like_library(path: &Path) -> io::Result<bool> {
    let mut magic = [0u8; 4];
    let mut file = File::open(path)?;
    let mut filled = 0;
    while filled < magic.len() {
        let n = file.read(&mut magic[filled..])?;
        if n == 0 {
            return Ok(false);
        }
        filled += n;
    }
    Ok(if cfg!(target_os = "macos") {
        matches!(
            magic,
            [0xcf, 0xfa, 0xed, 0xfe] | [0xfe, 0xed, 0xfa, 0xcf] | [0xca, 0xfe, 0xba, 0xbe]
        )
    } else if cfg!(windows) {
        magic.starts_with(b"MZ")
    } else {
        magic == *b"\x7fELF"
    })
}

/// Where the runtime and the model are looked for, in order. A run takes it
/// from the environment ([`AssetSearch::from_env`]); tests build it by hand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AssetSearch {
    /// `ORT_DYLIB_PATH`: when set, the only place the runtime is looked for.
    pub runtime_path: Option<PathBuf>,
    /// `EMBEDJOB_MODEL_DIR`: when set (and `backend.model_dir` is not), the
    /// only place the model is looked for.
    pub model_dir: Option<PathBuf>,
    /// Cache folders laid out as `scripts/setup-local` leaves them, tried in
    /// order: `onnxruntime/lib/<runtime file>` and `models/<model>`.
    pub cache_dirs: Vec<PathBuf>,
}

impl AssetSearch {
    /// `ORT_DYLIB_PATH` and `EMBEDJOB_MODEL_DIR` when set; then the cache
    /// folders `$EMBEDJOB_CACHE_DIR`, `.cache` in the current directory, and
    /// `.cache` in the nearest folder above the running executable that has
    /// one (the repository the binary was built in). Relative paths are
    /// taken from the current directory.
    pub fn from_env() -> AssetSearch {
        let var = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let mut cache_dirs = Vec::new();
        if let Some(dir) = var(CACHE_DIR_ENV) {
            cache_dirs.push(dir);
        }
        if let Ok(cwd) = std::env::current_dir() {
            cache_dirs.push(cwd.join(".cache"));
        }
        if let Some(dir) = executable_repository_cache() {
            if !cache_dirs.contains(&dir) {
                cache_dirs.push(dir);
            }
        }
        AssetSearch {
            runtime_path: var(ORT_DYLIB_PATH_ENV),
            model_dir: var(MODEL_DIR_ENV),
            cache_dirs,
        }
    }

    /// Looks only in one cache folder.
    pub fn in_cache(dir: impl Into<PathBuf>) -> AssetSearch {
        AssetSearch {
            runtime_path: None,
            model_dir: None,
            cache_dirs: vec![dir.into()],
        }
    }

    /// The runtime file: `runtime_path` when set, else the first cache
    /// folder that has one.
    pub fn find_runtime(&self) -> Result<PathBuf, LocalError> {
        let looked = match &self.runtime_path {
            Some(path) => vec![path.clone()],
            None => self
                .cache_dirs
                .iter()
                .map(|dir| {
                    dir.join("onnxruntime")
                        .join("lib")
                        .join(runtime_file_name())
                })
                .collect(),
        };
        looked
            .iter()
            .find(|path| path.is_file())
            .cloned()
            .ok_or(LocalError::RuntimeMissing { looked })
    }

    /// The model folder: `configured` (`backend.model_dir`) when set, else
    /// `model_dir`, else the first cache folder's `models/<model>`.
    pub fn find_model_dir(
        &self,
        configured: Option<&Path>,
        model: &str,
    ) -> Result<PathBuf, LocalError> {
        let looked = match configured.or(self.model_dir.as_deref()) {
            Some(dir) => vec![dir.to_path_buf()],
            None => self
                .cache_dirs
                .iter()
                .map(|dir| dir.join("models").join(model))
                .collect(),
        };
        looked
            .iter()
            .find(|dir| dir.is_dir())
            .cloned()
            .ok_or(LocalError::ModelMissing { looked })
    }
}

fn executable_repository_cache() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .map(|dir| dir.join(".cache"))
        .find(|cache| cache.join("onnxruntime").is_dir() || cache.join("models").is_dir())
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
        let local = config.local().cloned().unwrap_or_default();
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
            queue_capacity: shared.concurrency.max(1),
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

/// What a load found, before anything is handed to ONNX Runtime.
#[derive(Debug, Clone)]
struct Assets {
    runtime: PathBuf,
    runtime_version: Option<RuntimeVersion>,
    model_dir: PathBuf,
}

fn locate(settings: &LocalSettings) -> Result<Assets, LocalError> {
    settings.check()?;
    let found = settings.search.find_runtime()?;
    // ort wants an absolute path; a relative one is taken from the current directory.
    let runtime =
        std::fs::canonicalize(&found).map_err(|source| LocalError::RuntimeUnreadable {
            path: found.clone(),
            source,
        })?;
    let unreadable = |source| LocalError::RuntimeUnreadable {
        path: runtime.clone(),
        source,
    };
    if !looks_like_library(&runtime).map_err(unreadable)? {
        return Err(LocalError::RuntimeNotLibrary { path: runtime });
    }
    let runtime_version = runtime_version(&runtime).map_err(unreadable)?;
    if let Some(version) = runtime_version {
        if version < MIN_RUNTIME_VERSION {
            return Err(LocalError::RuntimeTooOld {
                found: version.to_string(),
                path: runtime,
            });
        }
    }
    let model_dir = settings
        .search
        .find_model_dir(settings.model_dir.as_deref(), &settings.model)?;
    for name in MODEL_FILES {
        let path = model_dir.join(name);
        if !path.is_file() {
            return Err(LocalError::ModelFileMissing { path });
        }
    }
    Ok(Assets {
        runtime,
        runtime_version,
        model_dir,
    })
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

fn runtime_log(level: ort::logging::LogLevel, _category: &str, _id: &str, _at: &str, text: &str) {
    if level >= ort::logging::LogLevel::Error {
        eprintln!("embedjob: onnxruntime: {text}");
    }
}

/// The model, owned by the inference thread.
struct Model {
    embedding: TextEmbedding,
    /// The model's tokenizer, truncating at [`MAX_LENGTH`] and not padding:
    /// it counts the tokens the model sees.
    counter: Tokenizer,
    batch_size: usize,
    dimensions: usize,
}

impl Model {
    fn load(assets: &Assets, settings: &LocalSettings) -> Result<(Model, Tokenizer), LocalError> {
        let dir = &assets.model_dir;
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|e| LocalError::ModelInvalid {
                dir: dir.clone(),
                message: format!("cannot read {}: {e}", path.display()),
            })
        };
        let files = TokenizerFiles {
            tokenizer_file: read("tokenizer.json")?,
            config_file: read("config.json")?,
            special_tokens_map_file: read("special_tokens_map.json")?,
            tokenizer_config_file: read("tokenizer_config.json")?,
        };
        let model =
            UserDefinedEmbeddingModel::new(read("model.onnx")?, files).with_pooling(Pooling::Mean);
        let model = UserDefinedEmbeddingModel {
            output_key: Some(OutputKey::ByName("last_hidden_state")),
            ..model
        };
        let environment = environment(&assets.runtime)?;
        let mut options = InitOptionsUserDefined::new()
            .with_environment(environment)
            .with_max_length(MAX_LENGTH);
        if let Some(threads) = settings.threads {
            options = options.with_intra_threads(threads);
        }
        let invalid = |e: fastembed::Error| LocalError::ModelInvalid {
            dir: dir.clone(),
            message: e.to_string(),
        };
        let embedding =
            TextEmbedding::try_new_from_user_defined(model, options).map_err(invalid)?;
        let mut counter = embedding.tokenizer.clone();
        counter.with_padding(None);
        // fastembed caps the length at tokenizer_config.json's model_max_length.
        let truncation = counter.get_truncation().map(|t| t.max_length);
        if truncation != Some(MAX_LENGTH) {
            return Err(LocalError::ModelInvalid {
                dir: dir.clone(),
                message: format!(
                    "the tokenizer truncates at {truncation:?} tokens, not {MAX_LENGTH}"
                ),
            });
        }
        let mut full = counter.clone();
        full.with_truncation(None)
            .map_err(|e| LocalError::ModelInvalid {
                dir: dir.clone(),
                message: e.to_string(),
            })?;
        let mut model = Model {
            embedding,
            counter,
            batch_size: settings.batch_size,
            dimensions: 0,
        };
        // The vector length comes from the model itself.
        let probe = model
            .embedding
            .embed(["dimensions"], None)
            .map_err(invalid)?;
        model.dimensions = probe.first().map_or(0, Vec::len);
        if model.dimensions == 0 {
            return Err(LocalError::ModelInvalid {
                dir: dir.clone(),
                message: "the model returned an empty vector".to_string(),
            });
        }
        if let Some(declared) = settings.dimensions {
            if declared != model.dimensions {
                return Err(LocalError::DimensionsMismatch {
                    declared,
                    found: model.dimensions,
                    dir: dir.clone(),
                });
            }
        }
        Ok((model, full))
    }

    /// Embeds `texts` in sub-batches of similar token count. Returns each
    /// text's vector, in input order, and the tokens the model saw of it.
    fn embed(&mut self, texts: &[&str]) -> Result<(Vec<Vec<f32>>, Vec<usize>), String> {
        let encodings = self
            .counter
            .encode_batch_fast(texts.to_vec(), true)
            .map_err(|e| format!("cannot tokenize: {e}"))?;
        let lengths: Vec<usize> = encodings.iter().map(|e| e.len()).collect();
        if lengths.len() != texts.len() {
            return Err(format!(
                "the tokenizer returned {} encodings for {} texts",
                lengths.len(),
                texts.len()
            ));
        }
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| lengths[i]);
        let mut placed: Vec<Vec<f32>> = vec![Vec::new(); texts.len()];
        for group in order.chunks(self.batch_size.max(1)) {
            let batch: Vec<&str> = group.iter().map(|&i| texts[i]).collect();
            let vectors = self
                .embedding
                .embed(&batch, Some(batch.len()))
                .map_err(|e| format!("inference failed: {e}"))?;
            if vectors.len() != group.len() {
                return Err(format!(
                    "the model returned {} vectors for {} texts",
                    vectors.len(),
                    group.len()
                ));
            }
            for (&i, vector) in group.iter().zip(vectors) {
                placed[i] = vector;
            }
        }
        Ok((placed, lengths))
    }
}

/// Checks one request's share of the vectors as any backend's answer is checked.
fn answer(
    inputs: usize,
    vectors: Vec<Vec<f32>>,
    lengths: &[usize],
    dimensions: usize,
) -> Result<Vectors, String> {
    let tokens = lengths.iter().sum::<usize>() as u64;
    let usage = Usage {
        prompt_tokens: tokens,
        total_tokens: tokens,
    };
    validate::check(
        RawVectors::in_order(vectors, usage),
        inputs,
        Some(dimensions),
    )
    .map_err(|e| e.to_string())
}

struct Request {
    texts: Vec<String>,
    reply: oneshot::Sender<Result<Vectors, String>>,
}

/// A local model behind the [`EmbeddingBackend`] trait.
pub struct LocalBackend {
    info: BackendInfo,
    requests: mpsc::Sender<Request>,
    tokenizer: Tokenizer,
    runtime_path: PathBuf,
    runtime_version: Option<RuntimeVersion>,
    model_dir: PathBuf,
    answered: AtomicU64,
}

impl fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalBackend")
            .field("info", &self.info)
            .field("runtime_path", &self.runtime_path)
            .field("model_dir", &self.model_dir)
            .finish_non_exhaustive()
    }
}

impl LocalBackend {
    /// Finds and checks ONNX Runtime and the model, then loads the model on
    /// its own thread. Blocks until the model is ready (about a second);
    /// from async code, call it inside `spawn_blocking`.
    pub fn load(settings: LocalSettings) -> Result<LocalBackend, LocalError> {
        let assets = locate(&settings)?;
        quiet_model_thread_panics();
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let (requests, queue) = mpsc::channel::<Request>(settings.queue_capacity.max(1));
        let thread_assets = assets.clone();
        let thread_settings = settings.clone();
        std::thread::Builder::new()
            .name(THREAD_NAME.to_string())
            .spawn(move || serve(&thread_assets, &thread_settings, ready_tx, queue))
            .map_err(LocalError::Thread)?;
        let (dimensions, tokenizer) = ready_rx.recv().map_err(|_| LocalError::Panicked {
            message: "the model thread stopped while loading".to_string(),
        })??;
        Ok(LocalBackend {
            info: BackendInfo {
                kind: BackendKind::Local,
                model: settings.model,
                dimensions: Some(dimensions),
                context_window: Some(MAX_LENGTH as u64),
                input_per_1k: Some(0.0),
            },
            requests,
            tokenizer,
            runtime_path: assets.runtime,
            runtime_version: assets.runtime_version,
            model_dir: assets.model_dir,
            answered: AtomicU64::new(0),
        })
    }

    /// The model's tokenizer, for counting tokens as the model does. It
    /// neither truncates nor pads, so it counts every token of a text; the
    /// model itself sees at most [`MAX_LENGTH`], `[CLS]` and `[SEP]` included.
    pub fn tokenizer(&self) -> Tokenizer {
        self.tokenizer.clone()
    }

    /// The ONNX Runtime library in use, symlinks resolved.
    pub fn runtime_path(&self) -> &Path {
        &self.runtime_path
    }

    /// The runtime's version, when the library file records it.
    pub fn runtime_version(&self) -> Option<RuntimeVersion> {
        self.runtime_version
    }

    pub fn model_dir(&self) -> &Path {
        &self.model_dir
    }
}

type Ready = Result<(usize, Tokenizer), LocalError>;

/// The inference thread: loads the model, then answers requests until every
/// sender is gone.
fn serve(
    assets: &Assets,
    settings: &LocalSettings,
    ready: std::sync::mpsc::SyncSender<Ready>,
    mut queue: mpsc::Receiver<Request>,
) {
    let loaded = panic::catch_unwind(AssertUnwindSafe(|| Model::load(assets, settings)))
        .unwrap_or_else(|payload| {
            Err(LocalError::Panicked {
                message: panic_message(payload.as_ref()),
            })
        });
    let mut model = match loaded {
        Ok((model, tokenizer)) => {
            if ready.send(Ok((model.dimensions, tokenizer))).is_err() {
                return;
            }
            model
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    while let Some(first) = queue.blocking_recv() {
        // Requests that queued up meanwhile are embedded together: the more
        // texts there are to sort by length, the less padding.
        let mut requests = vec![first];
        while let Ok(more) = queue.try_recv() {
            requests.push(more);
        }
        // A caller that gave up needs no answer.
        requests.retain(|r| !r.reply.is_closed());
        if requests.is_empty() {
            continue;
        }
        let texts: Vec<&str> = requests
            .iter()
            .flat_map(|r| r.texts.iter().map(String::as_str))
            .collect();
        let result = panic::catch_unwind(AssertUnwindSafe(|| model.embed(&texts))).unwrap_or_else(
            |payload| {
                Err(format!(
                    "the local model failed: {}",
                    panic_message(payload.as_ref())
                ))
            },
        );
        match result {
            Ok((vectors, lengths)) => {
                let mut vectors = vectors.into_iter();
                let mut start = 0;
                for request in requests {
                    let n = request.texts.len();
                    let share: Vec<Vec<f32>> = vectors.by_ref().take(n).collect();
                    let counts = lengths.get(start..start + n).unwrap_or_default();
                    start += n;
                    let _ = request
                        .reply
                        .send(answer(n, share, counts, model.dimensions));
                }
            }
            Err(message) => {
                for request in requests {
                    let _ = request.reply.send(Err(message.clone()));
                }
            }
        }
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// Panics on the model thread are caught and returned as errors carrying the
/// panic's message, so the default hook's report on stderr would only say it
/// twice. Other threads keep the hook they had.
fn quiet_model_thread_panics() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if std::thread::current().name() != Some(THREAD_NAME) {
                previous(info);
            }
        }));
    });
}

fn stopped() -> BackendError {
    BackendError::Permanent {
        status: None,
        message: "the local model's thread has stopped".to_string(),
    }
}

impl EmbeddingBackend for LocalBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn embed<'a>(
        &'a self,
        texts: &'a [&'a str],
        _tokens: u64,
    ) -> BoxFuture<'a, Result<Vectors, BackendError>> {
        async move {
            let dimensions = self.info.dimensions.unwrap_or_default();
            if texts.is_empty() {
                return Ok(Vectors {
                    dimensions,
                    values: Vec::new(),
                    usage: Usage::default(),
                    discarded: Usage::default(),
                });
            }
            let (reply, answer) = oneshot::channel();
            let request = Request {
                texts: texts.iter().map(|t| (*t).to_string()).collect(),
                reply,
            };
            self.requests.send(request).await.map_err(|_| stopped())?;
            let vectors = answer.await.map_err(|_| stopped())?.map_err(|message| {
                BackendError::Permanent {
                    status: None,
                    message,
                }
            })?;
            self.answered.fetch_add(1, Ordering::Relaxed);
            Ok(vectors)
        }
        .boxed()
    }

    fn stats(&self) -> BackendStats {
        BackendStats {
            requests: self.answered.load(Ordering::Relaxed),
            ..BackendStats::default()
        }
    }
}

#[cfg(test)]
mod tests {
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
}
