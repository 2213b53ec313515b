//! embedjob: a batch job runner that turns text into vector indexes.
//!
//! The crate follows the data's way through a job:
//! [`source`] → [`chunk`] → [`batch`] → [`backend`] → [`validate`] →
//! [`sink`]. Each kind of source, backend and sink reads its part of a
//! [`job`] file and builds itself; [`kinds`] reads a job file with them all.
//! [`pipeline`] builds a job's stages and wires them together with bounded
//! channels, and [`state`] keeps what a job remembers between runs (lock,
//! checkpoint, failures, summary).
//! The data the stages pass on is in [`types`]; [`client`] speaks to the
//! model service, [`rate`] paces and retries what is sent to it, and
//! [`simulate`] stands in for it in tests and users' pipelines. Only
//! [`commands`] prints: lower layers hand their [`warnings`] up.
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
pub mod bounded;
pub mod chunk;
pub mod cli;
pub mod client;
pub mod commands;
pub mod contract;
pub mod display;
pub mod estimate;
pub mod exit;
pub mod fsio;
pub mod inspect;
pub mod job;
pub mod kinds;
pub mod parquet_io;
pub mod pipeline;
pub mod progress;
pub mod query;
pub mod rate;
pub mod secret;
#[cfg(feature = "simulator")]
pub mod simulate;
pub mod sink;
pub mod source;
pub mod state;
pub mod store;
#[cfg(test)]
mod testing;
pub mod types;
pub mod validate;
pub mod warnings;
