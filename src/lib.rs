//! embedjob: a batch job runner that turns text into vector indexes.
//!
//! The crate follows the data's way through a job:
//! `source → chunk → batch → backend → validate → sink`, with
//! [`client`] speaking to the model service and [`simulate`] standing in for
//! it in tests and users' pipelines.
//!
//! ```no_run
//! use embedjob::client::{ApiKey, Client, ClientConfig, EmbeddingInput};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::new(ClientConfig::new("http://127.0.0.1:9000", ApiKey::new("key")))?;
//! let response = client.embeddings("svc-embed-1", EmbeddingInput::One("hello")).await?;
//! let vectors = embedjob::validate::check(response, 1, Some(1024))?;
//! assert_eq!(vectors.dimensions, 1024);
//! # Ok(()) }
//! ```

pub mod backend;
pub mod batch;
pub mod checkpoint;
pub mod chunk;
pub mod cli;
pub mod client;
pub mod commands;
pub mod estimate;
pub mod exit;
pub mod inspect;
pub mod job;
pub mod pipeline;
pub mod progress;
pub mod retry;
pub mod run;
pub mod simulate;
pub mod sink;
pub mod source;
pub mod validate;
