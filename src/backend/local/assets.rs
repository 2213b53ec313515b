//! Where ONNX Runtime and the model are found, and everything about them
//! checked before `ort` sees the library.

use std::path::{Path, PathBuf};

use super::runtime::{looks_like_library, runtime_file_name, runtime_version, RuntimeVersion};
use super::{
    LocalError, LocalSettings, CACHE_DIR_ENV, MIN_RUNTIME_VERSION, MODEL_DIR_ENV, MODEL_FILES,
    ORT_DYLIB_PATH_ENV,
};

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

/// What a load found, before anything is handed to ONNX Runtime.
#[derive(Debug, Clone)]
pub(super) struct Assets {
    pub(super) runtime: PathBuf,
    pub(super) runtime_version: Option<RuntimeVersion>,
    pub(super) model_dir: PathBuf,
}

pub(super) fn locate(settings: &LocalSettings) -> Result<Assets, LocalError> {
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
