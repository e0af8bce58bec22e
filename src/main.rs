//! The `vramlens` binary: parses arguments, runs one subcommand, maps the outcome to an
//! exit status (0 success, 2 error). A closed pipe ends the program quietly with 0. All
//! text goes to stdout through [`TerminalText`], so nothing read from a file can drive
//! the terminal; error lines are escaped the same way.

mod cli;
mod cmd;

use clap::Parser;
use std::io::{self, BufWriter, IsTerminal, Write};
use std::process::ExitCode;
use vramlens::render::words::terminal::{TerminalText, escape_controls};
use vramlens::render::words::wrap::Wrapped;

/// The terminal's width in columns: `COLUMNS` when set, else what the terminal on stdout
/// says; None when neither tells.
fn terminal_columns() -> Option<usize> {
    if let Some(n) = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return Some(n);
    }
    #[cfg(unix)]
    {
        let mut size = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes one winsize into the struct given, which lives here.
        let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
        if ok && size.ws_col > 0 {
            return Some(usize::from(size.ws_col));
        }
    }
    None
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>().is_some_and(|io| {
            io.kind() == io::ErrorKind::BrokenPipe
                || io
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<serde_json::Error>())
                    .and_then(serde_json::Error::io_error_kind)
                    == Some(io::ErrorKind::BrokenPipe)
        })
    })
}

/// One line of stderr for an error: its causes joined, control characters made visible.
fn error_line(e: &anyhow::Error) -> String {
    let message = format!("{e:#}").replace('\n', " ");
    format!("vramlens: error: {}", escape_controls(&message))
}

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    if let Some(n) = cli.threads.filter(|&n| n > 0) {
        // Only fails if a pool already exists, which cannot happen this early.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global();
    }
    if cli.redact {
        cmd::redact_reads();
    }
    let stdout = io::stdout();
    // Text for people, on a terminal, is folded at its width; anything else passes as is.
    let width = match cli.command.writes_prose() && stdout.is_terminal() {
        true => terminal_columns(),
        false => None,
    };
    let mut out = TerminalText::new(Wrapped::new(
        BufWriter::new(stdout.lock()),
        width.unwrap_or(usize::MAX),
    ));
    let result = cmd::output::check_command_output(&cli.command)
        .and_then(|()| match &cli.command {
            cli::Command::Summary(args) => cmd::summary::run(args, &mut out),
            cli::Command::Timeline(args) => cmd::charts::timeline::run(args, &mut out),
            cli::Command::Segments(args) => cmd::charts::segments::run(args, &mut out),
            cli::Command::Oom(args) => cmd::oom::run(args, &mut out),
            cli::Command::Reconcile(args) => cmd::reconcile::run(args, &mut out),
            cli::Command::Top(args) => cmd::top::run(args, &mut out),
            cli::Command::Flamegraph(args) => cmd::charts::flamegraph::run(args, &mut out),
            cli::Command::Diff(args) => cmd::diff::run_diff(args, &mut out),
            cli::Command::Check(args) => cmd::diff::run_check(args, &mut out),
            cli::Command::Budget(args) => cmd::budget::run(args, &mut out),
            cli::Command::Redact(args) => cmd::redact::run(args, &mut out),
            cli::Command::Report(args) => cmd::report::run(args, &mut out),
            cli::Command::Export(args) => cmd::export::run(args, &mut out),
            cli::Command::Simulate(args) => cmd::simulate::run(args, &mut out),
        })
        .and_then(|()| out.flush().map_err(anyhow::Error::from));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        // A budget check that failed: its report is printed, the status says so.
        Err(e) if e.is::<cmd::diff::CheckFailed>() => {
            let _ = out.flush();
            ExitCode::from(1)
        }
        Err(e) => {
            // What was printed before the failure (reports of good files) stays, before
            // the error lines.
            let _ = out.flush();
            drop(out);
            let errors = match e.downcast::<cmd::Failures>() {
                Ok(f) => f.0,
                Err(e) => vec![e],
            };
            let mut stderr = io::stderr().lock();
            for e in &errors {
                let _ = writeln!(stderr, "{}", error_line(e));
            }
            ExitCode::from(2)
        }
    }
}
