//! The `vramlens` binary: parses arguments, runs one subcommand, maps the outcome to an
//! exit status (0 success, 2 error). A closed pipe ends the program quietly with 0.

mod cli;
mod cmd;

use clap::Parser;
use std::io::{self, BufWriter, Write};
use std::process::ExitCode;

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    if let Some(n) = cli.threads {
        // Only fails if a pool already exists, which cannot happen this early.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build_global();
    }
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let result = match &cli.command {
        cli::Command::Summary(args) => cmd::summary::run(args, &mut out),
        cli::Command::Timeline(args) => cmd::timeline::run(args, &mut out),
        cli::Command::Segments(args) => cmd::segments::run(args, &mut out),
        cli::Command::Oom(args) => cmd::oom::run(args, &mut out),
        cli::Command::Reconcile(args) => cmd::reconcile::run(args, &mut out),
        cli::Command::Redact(args) => cmd::redact::run(args, &mut out),
    }
    .and_then(|()| out.flush().map_err(anyhow::Error::from));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            drop(out);
            let message = format!("{e:#}").replace('\n', " ");
            let _ = writeln!(io::stderr(), "vramlens: error: {message}");
            ExitCode::from(2)
        }
    }
}
