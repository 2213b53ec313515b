//! The model on the inference thread: loaded from its folder, its tokenizer
//! checked, and texts embedded in sub-batches of similar length.

use fastembed::{
    InitOptionsUserDefined, OutputKey, Pooling, TextEmbedding, TokenizerFiles,
    UserDefinedEmbeddingModel,
};
use tokenizers::Tokenizer;

use super::assets::Assets;
use super::{environment, LocalError, LocalSettings, MAX_LENGTH};
use crate::types::{RawVectors, Usage, Vectors};
use crate::validate;

/// The model, owned by the inference thread.
pub(super) struct Model {
    embedding: TextEmbedding,
    /// The model's tokenizer, truncating at [`MAX_LENGTH`] and not padding:
    /// it counts the tokens the model sees.
    counter: Tokenizer,
    batch_size: usize,
    pub(super) dimensions: usize,
}

impl Model {
    pub(super) fn load(
        assets: &Assets,
        settings: &LocalSettings,
    ) -> Result<(Model, Tokenizer), LocalError> {
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
    pub(super) fn embed(&mut self, texts: &[&str]) -> Result<(Vec<Vec<f32>>, Vec<usize>), String> {
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
pub(super) fn answer(
    inputs: usize,
    vectors: Vec<Vec<f32>>,
    lengths: &[usize],
    dimensions: usize,
) -> Result<Vectors, String> {
    let tokens = lengths.iter().sum::<usize>() as u64;
    let usage = Usage {
        prompt_tokens: tokens,
        completion_tokens: 0,
        total_tokens: tokens,
    };
    validate::check(
        RawVectors::in_order(vectors, usage),
        inputs,
        Some(dimensions),
    )
    .map_err(|e| e.to_string())
}
