//! What decided a category, in words for people: the evidence codes that analyses give
//! ([`crate::analysis::kinds::categories::Evidence::code`]) read back into a short phrase.

use crate::render::words::labels::short_frame;

/// A phrase for an evidence code such as `lifetime:made_in_backward_outlived_it`.
pub fn words(code: &str) -> String {
    let (kind, rest) = code.split_once(':').unwrap_or((code, ""));
    match kind {
        "file" => "the file's own category (export_memory_timeline)".into(),
        "rule" => format!("--rules line {rest}"),
        "stack" => format!("stack: {}", frame_words(rest)),
        "mark" => format!("stack: {}", mark_words(rest)),
        "lifetime" => lifetime_words(rest).to_string(),
        "sizes" => sizes_words(rest),
        _ => "nothing decided it".into(),
    }
}

/// A frame `filename:line:name` as a short phrase: the function alone for a C++ frame
/// (no file, or line 0), else the short form of the call site.
fn frame_words(frame: &str) -> String {
    let mut parts = frame.splitn(3, ':');
    let (file, line, name) = (parts.next(), parts.next(), parts.next());
    match (file, line, name) {
        (Some(f), Some(l), Some(n))
            if l.parse::<u64>().is_ok() && (f.is_empty() || f == "??" || l == "0") =>
        {
            n.to_string()
        }
        _ => short_frame(frame),
    }
}

fn mark_words(mark: &str) -> &'static str {
    match mark {
        "forward" => "made in a forward",
        "backward" => "made by the autograd engine",
        "optimizer" => "made in an optimizer step",
        "zero_grad" => "made in zero_grad",
        "init" => "made while building the model",
        _ => "no frame says",
    }
}

fn lifetime_words(rule: &str) -> &'static str {
    match rule {
        "made_in_backward_outlived_it" => "made in backward, alive after it",
        "made_in_backward_parameter_sized" => {
            "made in backward, alive when the trace ends in it, a parameter's size"
        }
        "made_and_freed_in_backward" => "made and freed within backward",
        "made_in_backward_trace_ended" => "made in backward, alive when the trace ends in it",
        "made_in_backward_kept_through_zero_grad" => {
            "made in backward, kept through a zero_grad that freed the gradients"
        }
        "made_in_backward_not_parameter_sized" => {
            "made in backward, alive after it, the size of no parameter"
        }
        "made_in_step_kept" => "made in an optimizer step, kept after it",
        "made_and_freed_in_step" => "made and freed within an optimizer step",
        "made_in_step_trace_ended" => "made in an optimizer step the trace ends in",
        "made_in_zero_grad" => "made in zero_grad",
        "made_in_forward" => "made in a forward",
        "grows_while_alive" => "grows while the previous one is alive (a growing cache)",
        "made_in_optimizer_init" => "made in the optimizer's __init__",
        "made_in_init_kept" => "made while building the model, kept",
        "made_and_freed_in_init" => "made and freed while building the model",
        "made_between_phases" => "made outside forward, backward and the optimizer step",
        "made_and_freed_without_modules" => {
            "made and freed by the script's own functions, in a trace with no module forward (read as a forward's intermediates)"
        }
        "made_before_backward_freed_by_it" => {
            "made by the script's own code outside any module before backward, and freed by it (read as a forward's activations saved for backward)"
        }
        "block_made_in_backward" => "alive at the end, made in backward (its block's frames)",
        "block_made_in_step" => "alive at the end, made in an optimizer step (its block's frames)",
        "before_recording_freed_in_backward" => {
            "from before recording, freed in backward (saved for it)"
        }
        "before_recording_freed_in_forward" => "from before recording, freed in a forward",
        "before_recording_freed_in_step" => {
            "from before recording, freed by the optimizer step (state it replaced)"
        }
        "before_recording_freed_in_zero_grad" => "from before recording, freed by zero_grad",
        "before_recording_freed_between" => "from before recording, freed outside every phase",
        _ => "its lifetime",
    }
}

/// `copy_2_of_2_gradients` -> "sizes: copy 2 of 2 of the gradients' sizes".
fn sizes_words(rule: &str) -> String {
    if rule == "unmatched" {
        return "sizes: alive throughout from before recording, in none of the copies".into();
    }
    if rule == "autocast_copy_of_parameter" {
        return "sizes: made by autocast's cached_cast, half a parameter's size: the weight's half-precision copy autocast keeps".into();
    }
    if rule == "half_a_parameter_kept_through_forward" {
        return "sizes: half a parameter's bytes, at most one per parameter, made in the forward and kept to its end: the weight's half-precision copy autocast keeps (the stacks record no autocast frame)".into();
    }
    if rule == "without_modules" {
        return "alive throughout from before recording, in a trace with no module, backward or optimizer step: read as inputs".into();
    }
    let parts: Vec<&str> = rule.splitn(5, '_').collect();
    if let ["copy", c, "of", n, reference] = parts[..] {
        let of = match reference {
            "gradients" => "the gradients' sizes",
            "optimizer_state" => "the optimizer state's sizes per parameter",
            _ => "equal sets among the memory from before recording",
        };
        return format!("sizes: copy {c} of {n} of {of}");
    }
    "sizes".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_reads_as_words() {
        assert_eq!(
            words("lifetime:made_in_backward_outlived_it"),
            "made in backward, alive after it"
        );
        assert_eq!(
            words("sizes:copy_2_of_2_equal_sets"),
            "sizes: copy 2 of 2 of equal sets among the memory from before recording"
        );
        assert_eq!(words("rule:3"), "--rules line 3");
        assert_eq!(words("none"), "nothing decided it");
        assert_eq!(
            words("file:export_memory_timeline"),
            "the file's own category (export_memory_timeline)"
        );
    }
}
