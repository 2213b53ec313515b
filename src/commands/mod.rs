//! The commands: `run`, `estimate` and `query` take a job file ([`job`],
//! [`query`]), which `init` writes ([`init`]); `models`, `embed` and `chat`
//! talk to the service or the local model ([`service`]); `simulate`,
//! `inspect`, `completions` and `man` need neither. Results go to stdout;
//! nothing else does. Only the commands print: warnings from below come up
//! as values and go to stderr through [`messages`], scrubbed of the key.

mod init;
mod job;
mod messages;
mod query;
mod service;

use std::io::Write;
use std::time::Duration;

use crate::client::{ApiKey, Client, ClientConfig};
use crate::exit::{Exit, Failure};
#[cfg(feature = "simulator")]
use crate::simulate::{self, SimulateOptions};

pub use self::init::init;
pub use self::job::{estimate, run};
pub use self::query::query;
pub use self::service::{chat, embed, models, models_table};

pub const API_KEY_ENV: &str = "EMBEDJOB_API_KEY";
pub const BASE_URL_ENV: &str = "EMBEDJOB_BASE_URL";
pub const TIMEOUT_ENV: &str = "EMBEDJOB_TIMEOUT_SECONDS";
/// The path the service's routes sit under, when not `/v1` (`""` for the root).
pub const API_PATH_ENV: &str = "EMBEDJOB_API_PATH";

/// A chat stream may take this many times the request timeout in all.
const STREAM_TIMEOUTS: u32 = 10;

/// The commands retry transient faults a few times, honouring Retry-After.
pub(crate) const COMMAND_RETRIES: usize = 3;

pub(crate) type Outcome = Result<Exit, Failure>;

/// Builds a client from the environment; every problem is a usage error.
pub fn client_from_env() -> Result<Client, Failure> {
    let mut problems = Vec::new();
    let key = match std::env::var(API_KEY_ENV) {
        Ok(key) if !key.trim().is_empty() => Some(key),
        Ok(_) => {
            problems.push(format!(
                "{API_KEY_ENV} is empty: set it to the service's API key"
            ));
            None
        }
        Err(_) => {
            problems.push(format!(
                "{API_KEY_ENV} is not set: set it to the service's API key"
            ));
            None
        }
    };
    let base = match std::env::var(BASE_URL_ENV) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            problems.push(format!(
                "{BASE_URL_ENV} is not set: set it to the service's address, e.g. http://127.0.0.1:9000"
            ));
            None
        }
    };
    let timeout = match std::env::var(TIMEOUT_ENV) {
        Err(_) => Duration::from_secs(60),
        Ok(text) => match crate::job::seconds_in_range(text.trim().parse::<f64>().ok()) {
            Some(timeout) => timeout,
            None => {
                problems.push(format!(
                    "{TIMEOUT_ENV} must be a number of seconds between {} and {}, not {text:?}",
                    crate::job::MIN_TIMEOUT_SECONDS,
                    crate::job::MAX_TIMEOUT_SECONDS
                ));
                Duration::from_secs(60)
            }
        },
    };
    match (key, base) {
        (Some(key), Some(base)) if problems.is_empty() => {
            let mut config = ClientConfig::new(base, ApiKey::new(key));
            config.timeout = timeout;
            config.api_path = std::env::var(API_PATH_ENV).ok();
            config.stream_timeout = timeout.saturating_mul(STREAM_TIMEOUTS);
            Client::new(config).map_err(Failure::usage)
        }
        _ => Err(Failure::usage(anyhow::anyhow!(problems.join("; ")))),
    }
}

/// Prints `value` as one line of JSON, with no key in any form (see [`crate::secret`]).
pub(crate) fn print_json(value: &serde_json::Value) -> Result<(), Failure> {
    let text = serde_json::to_string(&crate::secret::scrub_json(value)).map_err(Failure::failed)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")
        .map_err(|e| Failure::failed(anyhow::Error::from(e).context("writing to stdout")))
}

/// Prints a completion script for `args.shell`.
pub fn completions(args: &crate::cli::CompletionsArgs) -> Outcome {
    use clap::CommandFactory;
    let mut command = crate::cli::Cli::command();
    let mut out = std::io::stdout().lock();
    clap_complete::generate(args.shell, &mut command, "embedjob", &mut out);
    out.flush().or_else(closed_stdout)?;
    Ok(Exit::Success)
}

/// Prints the manual page, or a command's own page.
pub fn man(args: &crate::cli::ManArgs) -> Outcome {
    use clap::CommandFactory;
    let command = crate::cli::Cli::command();
    let page = match &args.command {
        None => command,
        Some(name) => {
            let names: Vec<String> = command
                .get_subcommands()
                .map(|c| c.get_name().to_string())
                .collect();
            let Some(sub) = command.find_subcommand(name) else {
                return Err(Failure::usage(anyhow::anyhow!(
                    "no command {name:?}; the commands are {}",
                    names.join(", ")
                )));
            };
            sub.clone().name(format!("embedjob-{name}"))
        }
    };
    let mut out = std::io::stdout().lock();
    clap_mangen::Man::new(page)
        .render(&mut out)
        .and_then(|()| out.flush())
        .or_else(closed_stdout)?;
    Ok(Exit::Success)
}

/// A reader that stopped reading (`| head`) is not an error for output
/// that is only text; any other write error is.
fn closed_stdout(e: std::io::Error) -> Result<(), Failure> {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Ok(())
    } else {
        Err(Failure::failed(
            anyhow::Error::from(e).context("writing to stdout"),
        ))
    }
}

#[cfg(feature = "simulator")]
pub async fn simulate(options: SimulateOptions) -> Outcome {
    let config = options.to_config().map_err(|problems| {
        Failure::usage(anyhow::anyhow!("invalid simulator options:\n{problems}"))
    })?;
    simulate::serve(config).await.map_err(Failure::failed)?;
    Ok(Exit::Success)
}

/// Prints the report whatever it finds; a failed check makes the exit 1.
pub async fn inspect(args: &crate::cli::InspectArgs) -> Outcome {
    let path = args.path.clone();
    let report = tokio::task::spawn_blocking(move || crate::inspect::inspect(&path))
        .await
        .map_err(|e| Failure::failed(anyhow::anyhow!("the inspection stopped unexpectedly: {e}")))?
        .map_err(|e| Failure {
            exit: e.exit(),
            error: e.into(),
        })?;
    if args.json {
        print_json(&serde_json::to_value(&report).map_err(Failure::failed)?)?;
    } else {
        print!("{}", crate::secret::scrub(&crate::inspect::text(&report)));
    }
    if report.ok {
        return Ok(Exit::Success);
    }
    let n = report.totals.problem_count;
    let first = crate::inspect::first_problem(&report).unwrap_or_default();
    Err(Failure::failed(anyhow::anyhow!(
        "{n} failed check{} in {}; the first: {first}",
        if n == 1 { "" } else { "s" },
        args.path.display()
    )))
}
