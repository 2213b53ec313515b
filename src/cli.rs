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
    after_help = MAIN_EXAMPLES
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

const MAIN_EXAMPLES: &str = "\
Examples:
  embedjob init docs/                  write docs.toml, a commented job for the folder
  embedjob estimate docs.toml          what a run will send and cost
  embedjob run docs.toml               embed into out/docs.parquet (again: only what changed)
  embedjob inspect out/docs.parquet    check the output
  embedjob embed --local 'some text'   one vector, with the local model

The API key is read from EMBEDJOB_API_KEY (never from a flag). Commands without a job file \
take the service address from EMBEDJOB_BASE_URL. Paths in a job file are taken from the job \
file's directory.";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write a commented job file for a folder or a file of documents.
    #[command(after_help = INIT_EXAMPLES)]
    Init(InitArgs),
    /// Run a job: read, chunk, embed, validate and write Parquet.
    #[command(after_help = RUN_EXAMPLES)]
    Run(RunArgs),
    /// Count a job's chunks, tokens, requests and cost without embedding anything.
    #[command(after_help = ESTIMATE_EXAMPLES)]
    Estimate(EstimateArgs),
    /// List the models the key can see, or show one.
    #[command(after_help = MODELS_EXAMPLES)]
    Models(ModelsArgs),
    /// Embed a few texts and print the vectors (--local: with the local model).
    #[command(after_help = EMBED_EXAMPLES)]
    Embed(EmbedArgs),
    /// Send one prompt to a chat model and print the reply as it arrives.
    #[command(after_help = CHAT_EXAMPLES)]
    Chat(ChatArgs),
    /// Serve a simulator of the model service on 127.0.0.1, with optional faults.
    #[cfg(feature = "simulator")]
    #[command(after_help = SIMULATE_EXAMPLES)]
    Simulate(Box<SimulateOptions>),
    /// Show an output's metadata and check every vector in it.
    #[command(after_help = INSPECT_EXAMPLES)]
    Inspect(InspectArgs),
    /// Print a shell completion script.
    #[command(after_help = COMPLETIONS_EXAMPLES)]
    Completions(CompletionsArgs),
    /// Print the manual page (roff), or one command's.
    #[command(after_help = MAN_EXAMPLES)]
    Man(ManArgs),
    /// Search a job's output: the chunks nearest to a text, by cosine similarity.
    #[command(after_help = QUERY_EXAMPLES)]
    Query(QueryArgs),
}

const QUERY_EXAMPLES: &str = "\
Examples:
  embedjob query docs.toml 'how do I rotate the key?'
  embedjob query docs.toml 'rate limits' -k 3 --json";

const INIT_EXAMPLES: &str = "\
Examples:
  embedjob init docs/                  files under docs/ -> docs.toml
  embedjob init data/pages.jsonl.gz    records, fields guessed from the first one -> pages.toml
  embedjob init data/ -o jobs/data.toml --force";

const RUN_EXAMPLES: &str = "\
Examples:
  embedjob run docs.toml
  embedjob run docs.toml --json > summary.json
  embedjob run docs.toml --max-duration 1h30m --max-cost 2.50
  embedjob run docs.toml --set backend.concurrency=16 --set chunking.max_tokens=256
  embedjob run docs.toml --shard 2/4                    shard 2 of 4, into output.path/
  zcat pages.jsonl.gz | embedjob run pages.toml        with `path = \"-\"` in [source]

From cron, give the job file's full path: paths in it are taken from its directory.
Exit codes: 0 done, 1 failed, 2 bad job or flags, 3 done with quarantined chunks,
4 stopped early (run again to carry on).";

const ESTIMATE_EXAMPLES: &str = "\
Examples:
  embedjob estimate docs.toml
  embedjob estimate docs.toml --fresh --json
  embedjob estimate docs.toml --shard 0/4";

const MODELS_EXAMPLES: &str = "\
Examples:
  EMBEDJOB_BASE_URL=http://127.0.0.1:9000 embedjob models
  embedjob models svc-embed-1 --json";

const EMBED_EXAMPLES: &str = "\
Examples:
  embedjob embed --local 'a first text' 'a second one'
  embedjob embed --model svc-embed-1 --json 'hello'
  cut -f2 titles.tsv | embedjob embed --local --json -     one text per line";

const CHAT_EXAMPLES: &str = "\
Examples:
  embedjob chat --model svc-base 'Say hello'
  embedjob chat --model svc-base --system 'Answer briefly' --no-stream 'What is a vector?'";

#[cfg(feature = "simulator")]
const SIMULATE_EXAMPLES: &str = "\
Examples:
  embedjob simulate --port 9000
  EMBEDJOB_API_KEY=unused-local-key EMBEDJOB_BASE_URL=http://127.0.0.1:9000 embedjob models";

const INSPECT_EXAMPLES: &str = "\
Examples:
  embedjob inspect out/docs.parquet
  embedjob inspect out/shards/ --json     a directory's files, as one dataset";

const COMPLETIONS_EXAMPLES: &str = "\
Examples:
  embedjob completions bash > ~/.local/share/bash-completion/completions/embedjob
  embedjob completions zsh > ~/.zfunc/_embedjob
  embedjob completions fish > ~/.config/fish/completions/embedjob.fish";

const MAN_EXAMPLES: &str = "\
Examples:
  embedjob man > ~/.local/share/man/man1/embedjob.1 && man embedjob
  embedjob man run > ~/.local/share/man/man1/embedjob-run.1";

#[derive(Debug, Args)]
pub struct ManArgs {
    /// A command, for its own page (embedjob-COMMAND(1)).
    pub command: Option<String>,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// The folder of documents, or a .jsonl, .csv or .parquet file (compressed or not).
    pub path: std::path::PathBuf,
    /// Where to write the job file [default: NAME.toml in the current directory].
    #[arg(long, short = 'o', value_name = "JOB.toml")]
    pub output: Option<std::path::PathBuf>,
    /// Overwrite the job file if it exists.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct QueryArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// The text to search for; it is embedded with the job's own backend and model.
    pub text: String,
    /// How many results (1 to 1000).
    #[arg(short = 'k', long = "top", default_value_t = 10, value_name = "K")]
    pub k: usize,
    /// Print one JSON object on stdout: {"results": [{rank, score, id, doc_id, text, metadata}, …]}
    /// (`metadata`: the output's metadata columns, when it has some).
    #[arg(long)]
    pub json: bool,
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
    /// The embedding model: the service's (e.g. svc-embed-1), or with --local
    /// the local model's [default with --local: all-MiniLM-L6-v2].
    #[arg(long, required_unless_present = "local")]
    pub model: Option<String>,
    /// Embed with the local model: no key, no server.
    #[arg(long)]
    pub local: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// The texts to embed; `-` reads them from stdin, one per line (blank lines skipped).
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
    /// Stop after this long (e.g. 90s, 30m, 1h30m, 2h; a bare number is
    /// seconds), keeping what was done: exit 4, and the next run resumes.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub max_duration: Option<std::time::Duration>,
    /// Batch mode: wait for the batches, collecting and submitting until
    /// the job is done (or `--max-duration` passes: exit 4, resumable).
    #[arg(long)]
    pub wait: bool,
    /// The most this run may be billed (sets `budget.max_cost`): it stops
    /// before a request would go over, keeping what was done (exit 4). With
    /// --shard, the whole job's: each shard takes its part.
    #[arg(long, value_name = "AMOUNT")]
    pub max_cost: Option<f64>,
    /// Run one shard of the job: I/N (shard I, from 0, of N); N, with the index
    /// from JOB_COMPLETION_INDEX (a Kubernetes Indexed Job) or
    /// SLURM_ARRAY_TASK_ID (a Slurm job array); or auto, both from a Slurm job
    /// array. `output.path` then names a directory of the shards' files, and
    /// the job's rate limits and budget are shared out among the shards.
    #[arg(long, value_name = "I/N|N|auto")]
    pub shard: Option<String>,
}

/// The longest `--max-duration`: a year.
pub const MAX_DURATION_HOURS: f64 = 8760.0;

/// A positive duration up to a year: `90` (seconds), or as `humantime` reads
/// it (`90s`, `30m`, `1h30m`, `1h 30m`, `2h`, `1day`), or a decimal with one
/// unit (`1.5h`).
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let invalid = || format!("{text:?} is not a positive duration such as 90s, 30m, 1h30m or 2h");
    let duration = if let Ok(seconds) = text.parse::<f64>() {
        std::time::Duration::try_from_secs_f64(seconds).map_err(|_| invalid())?
    } else if let Ok(duration) = humantime::parse_duration(text) {
        duration
    } else {
        decimal_duration(text).ok_or_else(invalid)?
    };
    if duration.is_zero() {
        return Err(invalid());
    }
    if duration.as_secs_f64() > MAX_DURATION_HOURS * 3600.0 {
        return Err(format!(
            "{text:?} is longer than the longest time limit, {MAX_DURATION_HOURS}h (a year)"
        ));
    }
    Ok(duration)
}

/// `1.5h`, `0.5m`: a decimal number with one unit of s, m or h.
fn decimal_duration(text: &str) -> Option<std::time::Duration> {
    let at = text.find(|c: char| c.is_ascii_alphabetic())?;
    let scale = match &text[at..] {
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return None,
    };
    let number: f64 = text[..at].trim().parse().ok()?;
    std::time::Duration::try_from_secs_f64(number * scale).ok()
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
    /// Estimate one shard of the job (as `run --shard`).
    #[arg(long, value_name = "I/N|N|auto")]
    pub shard: Option<String>,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// An output file, or a directory whose `*.parquet` files are inspected together.
    pub path: std::path::PathBuf,
    /// Print the report as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}
