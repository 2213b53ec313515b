//! Command-line definitions (clap). Nothing here does work.

use clap::{Args, Parser, Subcommand};

#[cfg(feature = "simulator")]
use crate::simulate::SimulateOptions;

#[derive(Debug, Parser)]
#[command(
    name = "embedjob",
    version,
    about = "Turn text into vector indexes: chunk by tokens, embed concurrently, validate, write Parquet.",
    long_about = None,
    after_help = "The API key is read from EMBEDJOB_API_KEY (never from a flag). \
                  Commands without a job file take the service address from EMBEDJOB_BASE_URL."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a job: read, chunk, embed, validate and write Parquet.
    Run(RunArgs),
    /// Count a job's chunks, tokens, requests and cost without embedding anything.
    Estimate(EstimateArgs),
    /// List the models the key can see, or show one.
    Models(ModelsArgs),
    /// Embed a few texts and print the vectors.
    Embed(EmbedArgs),
    /// Send one prompt to a chat model and print the reply as it arrives.
    Chat(ChatArgs),
    /// Serve a simulator of the model service on 127.0.0.1, with optional faults.
    #[cfg(feature = "simulator")]
    Simulate(SimulateOptions),
    /// Show an output's metadata and check every vector in it.
    Inspect(InspectArgs),
}

#[derive(Debug, Args)]
pub struct ModelsArgs {
    /// Show only this model.
    pub id: Option<String>,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct EmbedArgs {
    /// The embedding model, e.g. svc-embed-1.
    #[arg(long)]
    pub model: String,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// The texts to embed.
    #[arg(required = true)]
    pub texts: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ChatArgs {
    /// The chat model, e.g. svc-base.
    #[arg(long)]
    pub model: String,
    /// A system message sent before the prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// Sampling temperature, 0.0 to 2.0.
    #[arg(long, allow_negative_numbers = true)]
    pub temperature: Option<f64>,
    /// Upper limit of tokens in the reply.
    #[arg(long)]
    pub max_tokens: Option<u64>,
    /// Wait for the whole reply instead of streaming it.
    #[arg(long)]
    pub no_stream: bool,
    /// The user's message.
    pub prompt: String,
}

/// A job file and its overrides, shared by every command that takes one.
#[derive(Debug, Args)]
pub struct JobArgs {
    /// The job file (TOML).
    pub job: std::path::PathBuf,
    /// Override a job-file key by its dotted path, e.g. backend.model=svc-embed-1-l.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Print the run's summary as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// No progress lines on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// Discard the checkpoint of an unfinished run and the previous output,
    /// and embed everything again.
    #[arg(long)]
    pub fresh: bool,
    /// Stop after this long (e.g. 90s, 30m, 2h; a bare number is seconds),
    /// keeping what was done: exit 4, and the next run resumes.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub max_duration: Option<std::time::Duration>,
    /// The most this run may be billed (sets `budget.max_cost`): it stops
    /// before a request would go over, keeping what was done (exit 4).
    #[arg(long, value_name = "AMOUNT")]
    pub max_cost: Option<f64>,
}

/// The longest `--max-duration`: a year.
pub const MAX_DURATION_HOURS: f64 = 8760.0;

/// `90`, `90s`, `30m`, `2h` or `1.5h`, up to a year.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((at, _)) => (&text[..at], &text[at..]),
        None => (text, "s"),
    };
    let scale = match unit {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(format!("unknown unit {unit:?}: use s, m or h")),
    };
    match number.trim().parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 => {
            let seconds = n * scale;
            if seconds > MAX_DURATION_HOURS * 3600.0 {
                return Err(format!(
                    "{text:?} is longer than the longest time limit, {MAX_DURATION_HOURS}h (a year)"
                ));
            }
            Ok(std::time::Duration::from_secs_f64(seconds))
        }
        _ => Err(format!(
            "{text:?} is not a positive duration such as 90s, 30m or 2h"
        )),
    }
}

#[derive(Debug, Args)]
pub struct EstimateArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Print the estimate as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Estimate a run with --fresh: every chunk sent, nothing reused.
    #[arg(long)]
    pub fresh: bool,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// An output file, or a directory whose `*.parquet` files are inspected together.
    pub path: std::path::PathBuf,
    /// Print the report as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}
