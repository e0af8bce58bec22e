//! The vocabulary of a category's decision, shared by the rooms that decide it: the
//! part of a step a stack marks ([`Mark`]), the rule that decided ([`StackRule`],
//! [`LifetimeRule`], [`SizeRule`]), the [`Decision`] with its [`Evidence`].

use serde::Serialize;

/// What a stack says about the part of a training step it ran in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mark {
    /// No frames at all (recorded without stacks, or a thread with no Python frame).
    Empty,
    /// Frames, none of which says anything about the step.
    Plain,
    /// A module's or optimizer's `__init__`, moving a model, loading weights.
    Init,
    /// A module's `forward` (or a loss function).
    Forward,
    /// The autograd engine: `backward()`, a backward node, compiled backward.
    Backward,
    /// An optimizer's `step`.
    Optimizer,
    /// `zero_grad`.
    ZeroGrad,
}

/// What decided a category from the stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StackRule {
    /// A `--rules` rule, by its 1-based line in the file (blank and comment lines
    /// counted).
    User(u32),
    /// A built-in rule over a frame: the frame that matched.
    Frame(crate::model::FrameId),
}

/// A category and what decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// An index into [`super::attribution::Attributor::categories`].
    pub category: u32,
    pub evidence: Evidence,
}

impl Decision {
    /// Whether the category is inferred (by sizes, or by a lifetime the trace shows only
    /// in part) rather than read from the stack or the lifetime.
    pub fn inferred(&self) -> bool {
        self.evidence.inferred()
    }
}

/// What decided a category.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Evidence {
    /// The category an `export_memory_timeline` file gives the tensor.
    FileCategory,
    /// A frame rule: a user rule, or a built-in rule on a frame.
    Stack(StackRule),
    /// The part of the step the stack marks, with no lifetime to go by (an attributor
    /// bound to no device, or a block alive at the end whose allocation the trace lost).
    Mark(Mark),
    /// The allocation's lifetime across the phases of the steps.
    Lifetime(LifetimeRule),
    /// Sizes of memory from before recording.
    Sizes(SizeRule),
    /// Nothing decided: a stack no rule matched and no phase, or no stack at all.
    Nothing,
}

impl Evidence {
    /// A stable identifier of the evidence, as JSON and export write it:
    /// `file:export_memory_timeline`, `rule:N` (the rule on line N of the `--rules` file), `stack:FRAME`
    /// (the frame a built-in rule matched, `filename:line:name`), `mark:PHASE`,
    /// `lifetime:RULE`, `sizes:copy_C_of_N_REFERENCE`, `sizes:unmatched`, `sizes:without_modules`, `sizes:autocast_copy_of_parameter`,
    /// `sizes:half_a_parameter_kept_through_forward`, `none`.
    pub fn code(&self, frames: &crate::model::FrameTable) -> String {
        match self {
            Evidence::FileCategory => "file:export_memory_timeline".into(),
            Evidence::Stack(StackRule::User(line)) => format!("rule:{line}"),
            Evidence::Stack(StackRule::Frame(id)) => {
                let f = frames.frame(*id);
                format!(
                    "stack:{}:{}:{}",
                    frames.str(f.filename),
                    f.line,
                    frames.str(f.name)
                )
            }
            Evidence::Mark(m) => format!("mark:{}", snake(m)),
            Evidence::Lifetime(r) => format!("lifetime:{}", snake(r)),
            Evidence::Sizes(SizeRule::CopyOf {
                copy,
                copies,
                reference,
            }) => format!("sizes:copy_{copy}_of_{copies}_{}", snake(reference)),
            Evidence::Sizes(SizeRule::Unmatched) => "sizes:unmatched".into(),
            Evidence::Sizes(SizeRule::WithoutModules) => "sizes:without_modules".into(),
            Evidence::Sizes(SizeRule::AutocastCopy) => "sizes:autocast_copy_of_parameter".into(),
            Evidence::Sizes(SizeRule::HalfParameterKeptThroughForward) => {
                "sizes:half_a_parameter_kept_through_forward".into()
            }
            Evidence::Nothing => "none".into(),
        }
    }

    pub fn inferred(&self) -> bool {
        match self {
            Evidence::Sizes(_) => true,
            Evidence::Lifetime(r) => r.inferred(),
            Evidence::Mark(_) => false,
            _ => false,
        }
    }
}

/// The lifetime rules ([`super::categories::DeviceCategories::decide`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LifetimeRule {
    /// Made in backward and alive after it ended (freed by `zero_grad` or the optimizer,
    /// or alive at the end).
    MadeInBackwardOutlivedIt,
    /// Made in backward and kept through a `zero_grad` that freed memory (gradients
    /// with `set_to_none`): not a gradient.
    MadeInBackwardKeptThroughZeroGrad,
    /// Made in backward and alive after it, but the size of no parameter.
    MadeInBackwardNotParameterSized,
    /// Made in backward, alive at the end of a trace that ends in backward, and its size
    /// is one of the parameters' (inferred).
    MadeInBackwardParameterSized,
    /// Made and freed within one backward.
    MadeAndFreedInBackward,
    /// Made in backward, alive at the end of a trace that ends in backward (inferred).
    MadeInBackwardTraceEnded,
    /// Made in an optimizer step and kept past it.
    MadeInStepKept,
    /// Made and freed within one optimizer step.
    MadeAndFreedInStep,
    /// Made in an optimizer step, alive at the end of a trace that ends in it (inferred).
    MadeInStepTraceEnded,
    /// Made in `zero_grad`.
    MadeInZeroGrad,
    /// Made in a forward.
    MadeInForward,
    /// Made by a stack whose allocations grow while the previous one is alive, in a
    /// trace with no backward.
    GrowsWhileAlive,
    /// Made in the `__init__` of the user's optimizer (its file holds the `step`).
    MadeInOptimizerInit,
    /// Made while building a model and kept.
    MadeInInitKept,
    /// Made and freed while building a model.
    MadeAndFreedInInit,
    /// Alive at the end, allocated before the trace by a backward (its block's frames).
    BlockMadeInBackward,
    /// Alive at the end, allocated before the trace by an optimizer step (its block's
    /// frames).
    BlockMadeInStep,
    /// Made outside every phase, by a stack no rule matched.
    MadeBetweenPhases,
    /// Made and freed between the same two phases by the user's own code, in a trace with no module `forward` (a
    /// script that calls its functions directly): the computation's intermediates, as a
    /// forward's would be (inferred).
    MadeAndFreedWithoutModules,
    /// Made by the user's own code outside every module (its frames mark no phase) before
    /// a backward, and freed by that backward of the same step: saved for it, as a
    /// forward's activations are (inferred: no frame says forward).
    MadeBeforeBackwardFreedByIt,
    /// From before recording, freed in backward (inferred: saved for backward).
    BeforeRecordingFreedInBackward,
    /// From before recording, freed in a forward (inferred).
    BeforeRecordingFreedInForward,
    /// From before recording, freed by an optimizer step (inferred: old state replaced).
    BeforeRecordingFreedInStep,
    /// From before recording, freed by `zero_grad` (inferred).
    BeforeRecordingFreedInZeroGrad,
    /// From before recording, freed outside every phase.
    BeforeRecordingFreedBetween,
}

impl LifetimeRule {
    pub fn inferred(self) -> bool {
        use LifetimeRule::*;
        matches!(
            self,
            MadeInBackwardParameterSized
                | MadeInBackwardTraceEnded
                | MadeInStepTraceEnded
                | BeforeRecordingFreedInBackward
                | BeforeRecordingFreedInForward
                | BeforeRecordingFreedInStep
                | BeforeRecordingFreedInZeroGrad
                | MadeAndFreedWithoutModules
                | MadeBeforeBackwardFreedByIt
        )
    }
}

/// The sizes rules for memory from before recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum SizeRule {
    /// One of `copies` copies of the reference set of sizes; this block is in copy
    /// `copy` (1-based).
    CopyOf {
        copy: u8,
        copies: u8,
        reference: Reference,
    },
    /// Alive throughout, in none of the copies.
    Unmatched,
    /// Alive throughout, in a trace that shows no module, backward or optimizer step (a
    /// benchmark of functions called directly): the inputs made before recording.
    WithoutModules,
    /// Made by autocast's `cached_cast`, half the size of a parameter: the weight's copy
    /// in half precision that autocast keeps for the forward.
    AutocastCopy,
    /// In stacks that record no C++ frame (so no `cached_cast` to read): made in a
    /// forward, exactly half the bytes of a parameter, at most one per parameter of that
    /// size in the forward, and alive until the forward's last allocation or later (the
    /// end of the autocast region): autocast's half-precision copy of a weight.
    HalfParameterKeptThroughForward,
}

/// The set of sizes that memory from before recording is matched against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reference {
    /// The gradients the trace made.
    Gradients,
    /// The optimizer state the trace made, per parameter.
    OptimizerState,
    /// The equal sets the blocks from before recording form among themselves.
    EqualSets,
}

/// The snake_case name serde gives a unit variant.
fn snake<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}
