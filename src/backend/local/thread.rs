//! The inference thread that owns the model, and the [`LocalBackend`] that
//! sends it requests over a bounded channel.

use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokenizers::Tokenizer;
use tokio::sync::{mpsc, oneshot};

use super::assets::{locate, Assets};
use super::model::{answer, Model};
use super::runtime::RuntimeVersion;
use super::{LocalError, LocalSettings, MAX_LENGTH, THREAD_NAME};
use crate::backend::BackendKind;
use crate::backend::{BackendError, BackendInfo, BackendStats, EmbeddingBackend};
use crate::types::{Usage, Vectors};
use crate::warnings::Warnings;

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
                output_per_1k: None,
                other_input_per_1k: None,
                special_tokens: crate::backend::LOCAL_SPECIAL_TOKENS,
                max_inputs_per_request: None,
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

    fn notices(&self) -> Warnings {
        super::RUNTIME_LOG.clone()
    }
}
