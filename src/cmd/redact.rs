//! `vramlens redact`: read a snapshot, apply the redaction rules, write it back as a
//! pickle (through a temporary file), or with `--show` only list what would change.

use crate::cli::{RedactArgs, TextModeArg};
use crate::cmd::output::write_new_file_streamed;
use anyhow::{Context, Result, bail};
use std::io::{IsTerminal, Write};
use std::path::Path;
use vramlens::input::{ReadOptions, read_snapshot};
use vramlens::model::encode::write_snapshot;
use vramlens::redact::{RedactOptions, TextMode, apply};
use vramlens::render::redact::{RedactRun, RedactSettings, write_redact_text};
use vramlens::render::{Style, write_json};

fn mode(m: TextModeArg) -> TextMode {
    match m {
        TextModeArg::Keep => TextMode::Keep,
        TextModeArg::Hash => TextMode::Hash,
        TextModeArg::Drop => TextMode::Drop,
    }
}

/// True when both paths name the same existing file (also through links).
fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(ma), Ok(mb)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return ma.dev() == mb.dev() && ma.ino() == mb.ino();
        }
    }
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(ca), Ok(cb)) => ca == cb,
        _ => false,
    }
}

pub fn run(args: &RedactArgs, out: &mut dyn Write) -> Result<()> {
    let output = if args.show {
        None
    } else {
        args.output.as_deref()
    };
    if let Some(o) = output {
        if same_file(&args.file, o) {
            bail!(
                "{}: is the input snapshot; the redacted copy must go to another file",
                o.display()
            );
        }
        if o.exists() && !args.force {
            bail!(
                "{}: already exists; use --force to overwrite it",
                o.display()
            );
        }
    }
    let keep = args
        .keep
        .iter()
        .map(|k| {
            regex::Regex::new(k)
                .with_context(|| format!("--keep {k:?}: not a valid regular expression"))
        })
        .collect::<Result<Vec<_>>>()?;
    let options = RedactOptions {
        strip_code: args.strip_code,
        salt: args.salt.clone(),
        annotations: mode(args.annotations),
        metadata: mode(args.metadata),
        keep,
        scrub: args.scrub.clone(),
    };
    let (mut snap, info) = read_snapshot(&args.file, ReadOptions { progress: true })?;
    let report = apply(&mut snap, &options);
    if let Some(o) = output {
        write_new_file_streamed(o, args.force, |w| write_snapshot(&snap, w).map(|_| ()))?;
    }
    let output_name = output.map(|o| o.display().to_string());
    let settings = RedactSettings {
        strip_code: options.strip_code,
        salted: options.salt.is_some(),
        annotations: options.annotations,
        metadata: options.metadata,
        keep: args.keep.clone(),
    };
    let run = RedactRun::new(
        &info.path,
        output_name.as_deref(),
        output.is_some(),
        settings,
        &report,
    );
    if args.json {
        write_json(out, &run)?;
    } else {
        let style = Style::detect(std::io::stdout().is_terminal());
        write_redact_text(out, &run, args.show, style)?;
    }
    Ok(())
}
