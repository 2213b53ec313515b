//! `kind = "local"`: the embedded fastembed model. Its parameters and
//! their checks are read in every build; it builds itself only with the
//! cargo feature `local`.

use std::path::{Path, PathBuf};
#[cfg(feature = "local")]
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Deserialize;

#[cfg(feature = "local")]
use crate::backend::EmbeddingBackend;
use crate::backend::{BackendKind, Embedding, EmbeddingKind};
use crate::exit::Failure;
use crate::job::{BackendParams, BackendShared, ChunkingConfig, Job, KindTable};

/// `kind = "local"`: the embedded fastembed model.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct LocalParams {
    /// The directory holding `model.onnx` and the tokenizer files. Absent:
    /// `EMBEDJOB_MODEL_DIR`, else `models/<model>` in the cache that
    /// `scripts/setup-local` fills.
    pub model_dir: Option<PathBuf>,
    /// ONNX Runtime intra-op threads. Absent: every available core.
    pub threads: Option<usize>,
    /// Texts per inference call, grouped by similar length. Absent: 32.
    pub batch_size: Option<usize>,
}

pub struct Kind;

impl crate::job::Kind<dyn BackendParams> for Kind {
    fn name(&self) -> &'static str {
        "local"
    }

    fn keys(&self) -> &'static [&'static str] {
        &["model_dir", "threads", "batch_size"]
    }

    fn parse(&self, table: &mut KindTable<'_>) -> Option<Box<dyn BackendParams>> {
        let params: LocalParams = table.deserialize()?;
        Some(Box::new(params))
    }
}

impl EmbeddingKind for Kind {
    fn build<'a>(&'a self, job: &'a Job) -> BoxFuture<'a, Result<Embedding, Failure>> {
        Box::pin(build(job))
    }

    fn info_kind(&self) -> BackendKind {
        BackendKind::Local
    }
}

impl BackendParams for LocalParams {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn clone_box(&self) -> Box<dyn BackendParams> {
        Box::new(self.clone())
    }

    /// Takes a relative `model_dir` from `base`.
    fn resolve_paths(&mut self, base: &Path) {
        if let Some(dir) = &mut self.model_dir {
            *dir = crate::job::paths::relative_to(base, dir);
        }
    }

    fn problems(
        &self,
        _shared: &BackendShared,
        chunking: Option<&ChunkingConfig>,
        p: &mut Vec<String>,
    ) {
        if let Some(threads) = self.threads {
            if !(1..=1024).contains(&threads) {
                p.push(format!(
                    "`backend.threads` must be between 1 and 1024, not {threads}"
                ));
            }
        }
        if let Some(size) = self.batch_size {
            if !(1..=4096).contains(&size) {
                p.push(format!(
                    "`backend.batch_size` must be between 1 and 4096, not {size}"
                ));
            }
        }
        if chunking.is_some_and(|c| c.tokenizer.is_some()) {
            p.push(
                "`chunking.tokenizer` does not apply to backend kind \"local\": the model counts with its own"
                    .to_string(),
            );
        }
    }
}

/// Loads the local model off the async runtime. A missing or too old ONNX
/// Runtime or a missing model file is a set-up problem: exit 2, with how to fix it.
#[cfg(feature = "local")]
async fn build(job: &Job) -> Result<Embedding, Failure> {
    let backend = load(&job.backend).await?;
    let chunking = crate::backend::fitted_chunking(job, backend.info())?;
    let chunker = crate::chunk::TokenChunker::with_tokenizer(&chunking, backend.tokenizer())
        .map_err(Failure::usage)?;
    Ok(Embedding {
        backend: Arc::new(backend),
        chunker: Arc::new(chunker),
    })
}

#[cfg(feature = "local")]
async fn load(config: &crate::job::BackendConfig) -> Result<super::LocalBackend, Failure> {
    let settings = super::LocalSettings::from_config(config);
    tokio::task::spawn_blocking(move || super::LocalBackend::load(settings))
        .await
        .map_err(|e| {
            Failure::failed(anyhow::anyhow!(
                "loading the local model stopped unexpectedly: {e}"
            ))
        })?
        .map_err(Failure::usage)
}

/// The local model with its defaults (`model`: another model's folder in
/// the cache), for the commands without a job file, with a chunker that
/// counts tokens as the model does.
#[cfg(feature = "local")]
pub async fn local_backend(model: Option<String>) -> Result<Embedding, Failure> {
    let config = crate::job::BackendConfig {
        shared: BackendShared {
            model,
            ..BackendShared::default()
        },
        params: Box::new(LocalParams::default()),
    };
    let backend = load(&config).await?;
    let chunker =
        crate::chunk::TokenChunker::with_tokenizer(&ChunkingConfig::default(), backend.tokenizer())
            .map_err(Failure::usage)?;
    Ok(Embedding {
        backend: Arc::new(backend),
        chunker: Arc::new(chunker),
    })
}

#[cfg(not(feature = "local"))]
pub async fn local_backend(_model: Option<String>) -> Result<Embedding, Failure> {
    Err(not_built())
}

#[cfg(not(feature = "local"))]
async fn build(_job: &Job) -> Result<Embedding, Failure> {
    Err(not_built())
}

#[cfg(not(feature = "local"))]
fn not_built() -> Failure {
    Failure::usage(anyhow::anyhow!(
        "`backend.kind = \"local\"`: this embedjob was built without the local backend \
         (cargo feature `local`)"
    ))
}
