//! Stack frames for display: noise filtered as the official viewer filters it (spec 6.9).

use crate::model::{FrameTable, StackId};

/// Frames whose function name contains one of these are allocator or interpreter plumbing.
const NOISE_NAMES: [&str; 8] = [
    "unwind::unwind",
    "CapturedTraceback::gather",
    "gather_with_cpp",
    "_start",
    "__libc_start_main",
    "PyEval_",
    "PyObject_",
    "PyFunction_",
];

/// Frames whose file name contains one of these are dispatcher or interpreter plumbing.
const NOISE_FILES: [&str; 10] = [
    "core/boxing",
    "/Register",
    "/Redispatch",
    "pythonrun.c",
    "Modules/main.c",
    "Objects/call.c",
    "Objects/methodobject.c",
    "pycore_ceval.h",
    "ceval.c",
    "cpython/abstract.h",
];

/// `filename:line:name` of the frames of a stack that are not noise, innermost first,
/// at most `limit` of them.
pub fn display_frames(frames: &FrameTable, stack: Option<StackId>, limit: usize) -> Vec<String> {
    let Some(stack) = stack else {
        return Vec::new();
    };
    frames
        .stack(stack)
        .iter()
        .map(|&id| frames.frame(id))
        .filter(|f| {
            let name = frames.str(f.name);
            let file = frames.str(f.filename);
            !NOISE_NAMES.iter().any(|n| name.contains(n))
                && !NOISE_FILES.iter().any(|n| file.contains(n))
        })
        .take(limit)
        .map(|f| {
            format!(
                "{}:{}:{}",
                frames.str(f.filename),
                f.line,
                frames.str(f.name)
            )
        })
        .collect()
}

/// The most telling single frame of a stack, for legends and grouping: the innermost
/// Python frame outside the torch package, else the innermost Python frame, else the
/// first displayed frame.
pub fn headline_frame(frames: &FrameTable, stack: Option<StackId>) -> Option<String> {
    let python = user_frames(frames, stack, usize::MAX);
    // The innermost frame outside PyTorch's own package is where the user's (or a model
    // library's) code asked for the memory; torch/nn/... frames say less.
    python
        .iter()
        .find(|f| !f.contains("/torch/"))
        .or(python.first())
        .cloned()
}

/// Whether a displayed frame (`filename:line:name`) is Python code: a `.py` file, or
/// code without a file (`<string>`, `<frozen runpy>`); every other frame is C++.
pub fn is_python_frame(frame: &str) -> bool {
    frame.contains(".py:") || frame.starts_with('<')
}

/// Frames for a short listing: the Python frames (where users recognise their code),
/// innermost first; all displayed frames when the stack has no Python frame.
pub fn user_frames(frames: &FrameTable, stack: Option<StackId>, limit: usize) -> Vec<String> {
    let shown = display_frames(frames, stack, usize::MAX);
    let python: Vec<String> = shown
        .iter()
        .filter(|f| is_python_frame(f))
        .take(limit)
        .cloned()
        .collect();
    if python.is_empty() {
        shown.into_iter().take(limit).collect()
    } else {
        python
    }
}
