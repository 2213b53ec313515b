//! One integration binary: every test runs against in-process servers on
//! 127.0.0.1, each in its own temporary directory where it writes files.

mod batch;
mod batch_client;
mod batch_sim;
mod capacity;
mod cli;
mod client;
mod cost;
mod hostile;
mod inputs;
mod inspect;
mod layout;
mod local;
mod lookup;
mod memory;
mod pgvector;
mod query;
mod quota;
mod regression;
mod resume;
mod run;
mod secrets;
mod servers;
mod shards;
mod share;
mod simulator;
mod source;
mod storm;
mod support;
mod tls;
mod window;
