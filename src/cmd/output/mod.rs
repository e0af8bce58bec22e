//! What the commands write: output files (this file) and `export`'s output folder
//! ([`outdir`]).
//!
//! Output files (`-o`): what may be written and how.
//!
//! A chart is written to a temporary file created exclusively beside the target (never
//! through a link planted at its name), then moved into place by tempfile: without
//! `--force` by `persist_noclobber` (a rename that will not replace, else a hard link),
//! which fails if the name was taken meanwhile; with `--force` by a rename that replaces
//! the directory entry (a link or device is never written through). Only a new
//! name or a regular file is ever replaced; a directory, link, FIFO, device or socket at
//! the name is refused even with `--force`, and so is an output that is one of the inputs.

pub mod outdir;

use crate::cli::Command;
use anyhow::{Context, Result, anyhow, bail};
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use tempfile::NamedTempFile;

/// What is at the output name now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Absent,
    Regular,
}

/// Names what a non-regular file is, for the error.
fn kind_of(ft: &fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return "a named pipe (FIFO)";
        }
        if ft.is_char_device() {
            return "a character device";
        }
        if ft.is_block_device() {
            return "a block device";
        }
        if ft.is_socket() {
            return "a socket";
        }
    }
    if ft.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// Looks at the output name without following a link there.
fn inspect(path: &Path) -> Result<Target> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Target::Absent),
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot check {}", crate::cmd::shown_path(path)));
        }
    };
    let ft = meta.file_type();
    if ft.is_file() {
        Ok(Target::Regular)
    } else if ft.is_dir() {
        bail!(
            "{}: is a directory; give a file name for the chart, such as {}",
            path.display(),
            path.join("chart.svg").display()
        )
    } else {
        bail!(
            "{}: is {}; vramlens writes only to a new or a regular file",
            path.display(),
            kind_of(&ft)
        )
    }
}

/// Refuses to go on when the output name is taken by something that is not a regular
/// file (always), or by a file and `--force` was not given.
pub fn check_output(output: Option<&Path>, force: bool) -> Result<()> {
    if let Some(o) = output
        && inspect(o)? == Target::Regular
        && !force
    {
        bail!(
            "{}: already exists; use --force to overwrite it",
            o.display()
        );
    }
    Ok(())
}

/// Charts are SVG: a name with another extension is refused rather than given SVG bytes.
fn check_svg_name(path: &Path) -> Result<()> {
    match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("svg") => Ok(()),
        Some(e) => bail!(
            "{}: vramlens writes SVG, not .{e}; name the file .svg (convert it with a browser or rsvg-convert)",
            path.display()
        ),
        None => bail!(
            "{}: expected a file name ending in .svg (vramlens writes SVG)",
            path.display()
        ),
    }
}

/// Reports are HTML: a name with another extension is refused.
fn check_html_name(path: &Path) -> Result<()> {
    match path.extension().and_then(|e| e.to_str()) {
        Some(e) if e.eq_ignore_ascii_case("html") || e.eq_ignore_ascii_case("htm") => Ok(()),
        Some(e) => bail!(
            "{}: vramlens writes the report as HTML, not .{e}; name the file .html",
            path.display()
        ),
        None => bail!(
            "{}: expected a file name ending in .html (the report is one HTML file)",
            path.display()
        ),
    }
}

/// The same file (device and inode on Unix; the resolved path elsewhere).
pub fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (fs::metadata(a), fs::metadata(b)) {
            (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        match (fs::canonicalize(a), fs::canonicalize(b)) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        }
    }
}

/// Every check of an output file before any input is read: the kind of what is at the
/// name, the extension (`.svg` for a chart), the folder, not one of the inputs, `--force`
/// for an existing file.
pub fn check_output_path(output: &Path, force: bool, inputs: &[&Path], svg: bool) -> Result<()> {
    let target = inspect(output)?;
    if svg {
        check_svg_name(output)?;
    }
    let dir = output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        bail!(
            "{}: folder {} does not exist",
            output.display(),
            dir.display()
        );
    }
    if target == Target::Regular {
        if let Some(input) = inputs.iter().find(|i| same_file(i, output)) {
            bail!(
                "{}: is the same file as the input {}; write the chart to another file",
                output.display(),
                input.display()
            );
        }
        if !force {
            bail!(
                "{}: already exists; use --force to overwrite it",
                output.display()
            );
        }
    }
    Ok(())
}

/// The checks of the command's output file, if it writes one. Every command is listed, so
/// a new command with `-o` has to say how its output is checked.
pub fn check_command_output(command: &Command) -> Result<()> {
    match command {
        Command::Timeline(a) => match &a.output {
            Some(o) => {
                let mut inputs: Vec<&Path> = vec![&a.file];
                inputs.extend(a.nvml.iter().map(PathBuf::as_path));
                check_output_path(o, a.force, &inputs, true)
            }
            None => Ok(()),
        },
        Command::Segments(a) => match &a.output {
            Some(o) => check_output_path(o, a.force, &[&a.file], true),
            None => Ok(()),
        },
        Command::Flamegraph(a) => match &a.output {
            Some(o) => check_output_path(o, a.force, &[&a.file], !a.folded),
            None => Ok(()),
        },
        Command::Report(a) => {
            check_html_name(&a.output)?;
            let mut inputs: Vec<&Path> = a.files.iter().map(PathBuf::as_path).collect();
            inputs.extend(a.trace.as_deref());
            inputs.extend(a.device_logs.files());
            check_output_path(&a.output, a.force, &inputs, false)
        }
        Command::Export(a) => crate::cmd::export::check_output_dir(&a.output, a.force, a.events),
        Command::Budget(a) => match &a.output {
            Some(o) => {
                let mut inputs: Vec<&Path> = a.files.iter().map(PathBuf::as_path).collect();
                inputs.extend(a.device_logs.files());
                check_output_path(o, a.force, &inputs, true)
            }
            None => Ok(()),
        },
        Command::Simulate(a) => match &a.output {
            Some(o) => {
                let mut inputs: Vec<&Path> = vec![&a.snapshot];
                inputs.extend(a.device_logs.files());
                check_output_path(o, a.force, &inputs, true)
            }
            None => Ok(()),
        },
        // redact checks its output itself (refusing the input in its own words).
        Command::Redact(_)
        | Command::Summary(_)
        | Command::Oom(_)
        | Command::Reconcile(_)
        | Command::Top(_)
        | Command::Diff(_)
        | Command::Check(_) => Ok(()),
    }
}

/// Creates a new file beside the target whose name nobody else holds, removed when dropped
/// unless persisted. tempfile picks the random name (retrying on a taken one); the file is
/// opened here with `create_new` (O_CREAT | O_EXCL, which fails on any existing entry, a
/// link included) and the usual mode (0666 less the umask, not tempfile's 0600), and its
/// errors pass unchanged (tempfile's own would name the temporary file).
fn create_temp(dir: &Path, name: &str) -> io::Result<NamedTempFile> {
    tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".vramlens-tmp")
        .rand_bytes(16)
        .make_in(dir, |tmp| {
            OpenOptions::new().write(true).create_new(true).open(tmp)
        })
}

/// Moves the finished temporary file to `path`.
fn publish(tmp: NamedTempFile, path: &Path, force: bool) -> Result<()> {
    let exists = || {
        anyhow!(
            "{}: already exists; use --force to overwrite it",
            path.display()
        )
    };
    let cannot = || format!("cannot write {}", crate::cmd::shown_path(path));
    if force {
        // Checked again just before: only a new name or a regular file is replaced.
        inspect(path)?;
        return tmp
            .persist(path)
            .map(drop)
            .map_err(|e| e.error)
            .with_context(cannot);
    }
    // renameat2(RENAME_NOREPLACE), else a hard link: fails if the name was taken meanwhile.
    match tmp.persist_noclobber(path) {
        Ok(_) => Ok(()),
        Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => Err(exists()),
        // A file system without either: check, then rename.
        Err(e) => {
            if inspect(path)? != Target::Absent {
                return Err(exists());
            }
            e.file
                .persist(path)
                .map(drop)
                .map_err(|e| e.error)
                .with_context(cannot)
        }
    }
}

/// Writes a chart or report to `path` through a temporary file beside it, so a failure
/// leaves nothing behind. The content is made in memory first (a chart's size is bounded
/// by its drawing, not its input): the temporary file exists only while finished bytes
/// are copied into it, so a run stopped while it draws (killed, or out of time) leaves no
/// partial file, and an error while drawing creates none.
pub fn write_new_file(
    path: &Path,
    force: bool,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<()> {
    check_output(Some(path), force)?;
    let mut content: Vec<u8> = Vec::new();
    write(&mut content)
        .with_context(|| format!("cannot write {}", crate::cmd::shown_path(path)))?;
    write_new_file_streamed(path, force, |w| w.write_all(&content))
}

/// Writes `path` through a temporary file beside it, streamed (for a copy as large as
/// its input, such as `redact`'s), so a failure leaves nothing behind.
pub fn write_new_file_streamed(
    path: &Path,
    force: bool,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<()> {
    check_output(Some(path), force)?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| anyhow!("{}: not a file name", crate::cmd::shown_path(path)))?
        .to_string_lossy();
    let mut tmp = match create_temp(dir, &name) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            bail!(
                "{}: folder {} does not exist",
                path.display(),
                dir.display()
            )
        }
        Err(e) => {
            return Err(e)
                .with_context(|| format!("cannot write {}", crate::cmd::shown_path(path)));
        }
    };
    // Through the File itself: NamedTempFile's own writes would name the temporary file in
    // their errors. On an error `tmp` is dropped, and with it the temporary file.
    (|| -> io::Result<()> {
        let mut f = io::BufWriter::new(tmp.as_file_mut());
        write(&mut f)?;
        f.flush()
    })()
    .with_context(|| format!("cannot write {}", crate::cmd::shown_path(path)))?;
    publish(tmp, path, force)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_names_differ_and_stay_beside_the_target() {
        let dir = std::env::temp_dir().join(format!("vramlens-output-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let a = create_temp(&dir, "x.svg").unwrap();
        let b = create_temp(&dir, "x.svg").unwrap();
        assert_ne!(a.path(), b.path());
        for p in [a.path(), b.path()] {
            assert_eq!(p.parent(), Some(dir.as_path()));
            let name = p.file_name().unwrap().to_string_lossy();
            assert!(name.starts_with(".x.svg.") && name.ends_with(".vramlens-tmp"));
        }
        drop((a, b));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_svg_names() {
        assert!(check_svg_name(Path::new("a/b.svg")).is_ok());
        assert!(check_svg_name(Path::new("b.SVG")).is_ok());
        let png = check_svg_name(Path::new("b.png")).unwrap_err().to_string();
        assert_eq!(
            png,
            "b.png: vramlens writes SVG, not .png; name the file .svg (convert it with a browser or rsvg-convert)"
        );
        assert!(check_svg_name(Path::new("chart")).is_err());
    }
}
