use std::process::ExitCode;

use clap::Parser;

use embedjob::cli::{Cli, Command};
use embedjob::commands;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("embedjob: error: could not start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Init(args) => commands::init(&args),
            Command::Completions(args) => commands::completions(&args),
            Command::Man(args) => commands::man(&args),
            Command::Run(args) => commands::run(&args).await,
            Command::Estimate(args) => commands::estimate(&args).await,
            Command::Models(args) => commands::models(&args).await,
            Command::Embed(args) => commands::embed(&args).await,
            Command::Chat(args) => commands::chat(&args).await,
            #[cfg(feature = "simulator")]
            Command::Simulate(options) => commands::simulate(*options).await,
            Command::Inspect(args) => commands::inspect(&args).await,
            Command::Query(args) => commands::query(&args).await,
        }
    });
    match result {
        Ok(code) => ExitCode::from(code.code()),
        Err(failure) => {
            let mut message = embedjob::secret::scrub(&error_chain(&failure.error)).into_owned();
            embedjob::secret::truncate_chars(&mut message, MAX_ERROR_CHARS);
            eprintln!("embedjob: error: {message}");
            ExitCode::from(failure.exit.code())
        }
    }
}

/// The longest error printed: room for every problem of a job file, not
/// for a page a server sent.
const MAX_ERROR_CHARS: usize = 8000;

/// The error and its causes on one line, each cause once: many errors
/// already quote their cause in their own message.
fn error_chain(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}
