//! The parts of each training step a device's trace ran through: building the model,
//! forward, backward, the optimizer step, `zero_grad`, and what lies between.
//!
//! Takes a device's trace, the snapshot's annotations and an [`Attributor`] (which knows
//! what each stack marks, [`Mark`]); gives [`Phases`]: runs of events in one phase, so
//! that the categories ([`crate::analysis::kinds::categories`]) can ask where an allocation was made and
//! where it was freed. What decides a phase, strongest first:
//!
//! 1. The `Optimizer.step#...` and `Optimizer.zero_grad#...` annotations that
//!    `torch.optim` records (`external_annotations`, 2.5 and later): every event timed
//!    inside one is in that phase.
//! 2. The stack of each allocation ([`Mark`]), and of each free in `zero_grad` (frees
//!    elsewhere are left to the allocations around them): the autograd engine's frames (C++ `Engine`,
//!    `evaluate_function`, `...Backward0::apply`; Python `Tensor.backward`,
//!    `torch.autograd.grad`, compiled backward), an optimizer's `step`, `zero_grad`, a
//!    module's `__init__`, a `forward` or a loss.
//! 3. An event with no frames continues the phase before it (the autograd engine's own
//!    thread has no Python frames, so a recording of Python stacks shows backward as
//!    empty stacks after the call to `backward()`); frames that say nothing are inside
//!    a backward around them (hooks), part of the forward between a forward and a
//!    backward (the loss), else between phases (the training loop: every allocation
//!    inside a forward or an optimizer step has that function's frame).
//!
//! Nothing here pairs events or looks at sizes.

use crate::analysis::kinds::attribution::Attributor;
use crate::analysis::kinds::decision::Mark;
use crate::model::{Action, Annotation, DeviceTrace, StrId};
use serde::Serialize;
use std::collections::BTreeSet;

/// A part of a training step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Nothing says which: data loading, logging, the training loop itself.
    Between,
    /// Building or moving a model or an optimizer.
    Init,
    Forward,
    Backward,
    /// An optimizer's `step`.
    Optimizer,
    ZeroGrad,
}

/// A run of consecutive events in one phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// Its first event.
    pub start: u32,
    pub phase: Phase,
}

/// The phases of a device's trace.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Phases {
    /// In event order; the first starts at event 0. Empty for an empty trace.
    runs: Vec<Run>,
    /// Files of the user's code that hold an optimizer's `step` (seen in the trace).
    pub optimizer_files: BTreeSet<StrId>,
    /// Files of the user's code that hold a module's `forward` (seen in the trace).
    pub module_files: BTreeSet<StrId>,
    /// Whether annotations decided any event.
    pub annotated: bool,
    /// The runs of `zero_grad` that freed memory (with `set_to_none`, every gradient).
    pub freeing_zero_grads: Vec<usize>,
    /// The trace ends in an annotated step or `zero_grad` whose END was recorded: what is
    /// alive at the end outlived it.
    pub last_run_closed: bool,
}

/// What one event says before its neighbours are consulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Said {
    Phase(Phase),
    /// No frames: continues the phase before.
    Empty,
    /// Frames that say nothing.
    Plain,
}

fn said_of(mark: Mark) -> Said {
    match mark {
        Mark::Empty => Said::Empty,
        Mark::Plain => Said::Plain,
        Mark::Init => Said::Phase(Phase::Init),
        Mark::Forward => Said::Phase(Phase::Forward),
        Mark::Backward => Said::Phase(Phase::Backward),
        Mark::Optimizer => Said::Phase(Phase::Optimizer),
        Mark::ZeroGrad => Said::Phase(Phase::ZeroGrad),
    }
}

/// Time ranges `[start, end]` of the optimizer's annotations, by start. An END closes the
/// latest open START of its name; the open ones are kept by name, so unmatched STARTs and
/// ENDs cost one look-up each (linear in the annotations, not quadratic).
fn annotated_ranges(annotations: &[Annotation], device: i64) -> Vec<(i64, i64, Phase)> {
    // Only looked up by name, never iterated: the ranges are sorted below.
    let mut open: std::collections::HashMap<&str, Vec<(i64, Phase)>> =
        std::collections::HashMap::new();
    let mut ranges = Vec::new();
    for a in annotations {
        if a.device != device && a.device >= 0 {
            continue;
        }
        let phase = if a.name.starts_with("Optimizer.step#") {
            Phase::Optimizer
        } else if a.name.starts_with("Optimizer.zero_grad#") {
            Phase::ZeroGrad
        } else {
            continue;
        };
        match a.stage.as_str() {
            "START" => open
                .entry(a.name.as_str())
                .or_default()
                .push((a.time_us, phase)),
            "END" => {
                if let Some((start, phase)) = open.get_mut(a.name.as_str()).and_then(Vec::pop)
                    && start <= a.time_us
                {
                    ranges.push((start, a.time_us, phase));
                }
            }
            _ => {}
        }
    }
    ranges.sort_unstable_by_key(|&(s, e, p)| (s, e, p));
    // Disjoint, so that one look-up finds the range of a time: a range nested in or
    // overlapping the one before ends that one where it starts.
    let mut disjoint: Vec<(i64, i64, Phase)> = Vec::with_capacity(ranges.len());
    for r in ranges {
        if let Some(last) = disjoint.last_mut()
            && last.1 >= r.0
        {
            last.1 = r.0 - 1;
            if last.1 < last.0 {
                disjoint.pop();
            }
        }
        disjoint.push(r);
    }
    disjoint
}

impl Phases {
    /// Finds the phases of `trace` (the trace of `device`).
    pub fn find(
        trace: &DeviceTrace,
        annotations: &[Annotation],
        device: i64,
        attr: &Attributor,
    ) -> Phases {
        let ranges = if trace.keys.time_us {
            annotated_ranges(annotations, device)
        } else {
            Vec::new()
        };
        let frames = attr.frames();
        // What each stack says, computed once.
        let mut said_of_stack: Vec<Option<Said>> = vec![None; frames.stack_count()];
        let mut phases = Phases {
            annotated: !ranges.is_empty(),
            ..Phases::default()
        };
        let mut said: Vec<(u32, Said)> = Vec::new();
        let mut zero_grad_frees: Vec<usize> = Vec::new();
        let mut last_annotated = false;
        for i in 0..trace.len() {
            let from_annotation = if ranges.is_empty() {
                None
            } else {
                trace.time_us(i).and_then(|t| {
                    let n = ranges.partition_point(|&(s, _, _)| s <= t);
                    n.checked_sub(1)
                        .map(|k| ranges[k])
                        .filter(|&(_, e, _)| e >= t)
                        .map(|(_, _, p)| p)
                })
            };
            // Allocations say where they were made; of the frees, only `zero_grad`'s
            // (which frees gradients and allocates nothing) say more than the
            // allocations around them.
            let action = trace.action(i);
            let is_alloc = action == Action::Alloc;
            if from_annotation.is_none() && !is_alloc && action != Action::FreeRequested {
                continue;
            }
            let from_stack = match trace.stack(i) {
                None => Said::Empty,
                Some(stack) => match said_of_stack.get(stack.0 as usize).copied().flatten() {
                    Some(s) => s,
                    None => {
                        let facts = attr.facts(stack);
                        phases.learn_files(attr, stack, facts.mark);
                        let s = said_of(facts.mark);
                        if let Some(slot) = said_of_stack.get_mut(stack.0 as usize) {
                            *slot = Some(s);
                        }
                        s
                    }
                },
            };
            let s = match from_annotation {
                Some(p) => Said::Phase(p),
                None if is_alloc => from_stack,
                None if from_stack == Said::Phase(Phase::ZeroGrad) => from_stack,
                None => continue,
            };
            if s == Said::Phase(Phase::ZeroGrad) && action == Action::FreeRequested {
                zero_grad_frees.push(i);
            }
            last_annotated = from_annotation.is_some();
            if said.last().is_none_or(|&(_, last)| last != s) {
                said.push((i as u32, s));
            }
        }
        phases.runs = resolve(&said);
        let mut freeing: Vec<usize> = zero_grad_frees
            .iter()
            .map(|&i| phases.run_of(i))
            .filter(|&r| phases.phase(r) == Phase::ZeroGrad)
            .collect();
        freeing.dedup();
        phases.freeing_zero_grads = freeing;
        phases.last_run_closed = last_annotated;
        phases
    }

    /// Remembers the user's files that hold an optimizer's `step` or a module's `forward`.
    fn learn_files(&mut self, attr: &Attributor, stack: crate::model::StackId, mark: Mark) {
        let (set, name) = match mark {
            Mark::Optimizer => (&mut self.optimizer_files, "step"),
            Mark::Forward => (&mut self.module_files, "forward"),
            _ => return,
        };
        let frames = attr.frames();
        for &id in frames.stack(stack) {
            let f = frames.frame(id);
            let file = frames.str(f.filename);
            if frames.str(f.name) == name && file.ends_with(".py") && !is_torch_file(file) {
                set.insert(f.filename);
            }
        }
    }

    /// The phases as runs, in event order.
    pub fn runs(&self) -> &[Run] {
        &self.runs
    }

    /// The index of the run holding event `i`.
    pub fn run_of(&self, i: usize) -> usize {
        self.runs
            .partition_point(|r| r.start as usize <= i)
            .saturating_sub(1)
    }

    /// A reader of the phase of each event, for a pass that asks in event order:
    /// [`PhaseCursor::phase_at`] is [`Phases::phase_at`], in constant time while the
    /// events asked about do not go back.
    pub fn cursor(&self) -> PhaseCursor<'_> {
        PhaseCursor {
            phases: self,
            started: 0,
            last: 0,
        }
    }

    /// The phase of run `run`.
    pub fn phase(&self, run: usize) -> Phase {
        self.runs.get(run).map_or(Phase::Between, |r| r.phase)
    }

    /// The phase of event `i`.
    pub fn phase_at(&self, i: usize) -> Phase {
        self.phase(self.run_of(i))
    }

    /// The index of the last run (the one the trace ends in).
    pub fn last_run(&self) -> usize {
        self.runs.len().saturating_sub(1)
    }

    /// Whether any event is in `phase`.
    pub fn has(&self, phase: Phase) -> bool {
        self.runs.iter().any(|r| r.phase == phase)
    }
}

/// Reads the phase of events asked about in order ([`Phases::cursor`]).
pub struct PhaseCursor<'p> {
    phases: &'p Phases,
    /// Runs starting at or before `last`.
    started: usize,
    /// The event last asked about.
    last: usize,
}

impl PhaseCursor<'_> {
    /// The phase of event `i`, as [`Phases::phase_at`] gives it.
    pub fn phase_at(&mut self, i: usize) -> Phase {
        let runs = &self.phases.runs;
        if i < self.last {
            self.started = runs.partition_point(|r| r.start as usize <= i);
        } else {
            while self.started < runs.len() && runs[self.started].start as usize <= i {
                self.started += 1;
            }
        }
        self.last = i;
        self.phases.phase(self.started.saturating_sub(1))
    }
}

fn is_torch_file(file: &str) -> bool {
    let f = file.replace('\\', "/");
    f.contains("/torch/") || f.starts_with("torch/") || f.contains("/site-packages/")
}

/// Turns what each event said into runs of phases (the module documentation's rule 3),
/// merging neighbours in the same phase.
fn resolve(said: &[(u32, Said)]) -> Vec<Run> {
    // After each position: the next phase an event states, and whether the next event
    // with something to say has no frames (it continues the phase, so frames that say
    // nothing before it are inside that phase too).
    let mut next: Vec<(Option<Phase>, bool)> = vec![(None, false); said.len()];
    let mut upcoming = (None, false);
    for (k, &(_, s)) in said.iter().enumerate().rev() {
        next[k] = upcoming;
        match s {
            Said::Phase(p) => upcoming = (Some(p), false),
            Said::Empty => upcoming.1 = true,
            Said::Plain => {}
        }
    }
    let mut runs: Vec<Run> = Vec::new();
    let mut previous: Option<Phase> = None;
    for (k, &(start, s)) in said.iter().enumerate() {
        let phase = match s {
            Said::Phase(p) => p,
            Said::Empty => previous.unwrap_or(Phase::Between),
            // Every allocation inside a forward or an optimizer step has its frames, so
            // frames that say nothing lie between two of them (the training loop);
            // inside backward they are hooks on the engine's thread.
            Said::Plain => match (previous, next[k]) {
                (Some(Phase::Backward), (_, true)) => Phase::Backward,
                (Some(Phase::Backward), (Some(Phase::Backward), _)) => Phase::Backward,
                (Some(Phase::Forward), (Some(Phase::Backward), _)) => Phase::Forward,
                _ => Phase::Between,
            },
        };
        previous = Some(phase);
        if runs.last().is_none_or(|r| r.phase != phase) {
            runs.push(Run { start, phase });
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cursor_reads_each_events_phase_as_the_runs_say_in_any_order() {
        use Phase::*;
        // Runs starting at 0, 3, 4 and 9 of a trace of 12 events, read by hand.
        let phases = Phases {
            runs: [(0, Init), (3, Forward), (4, Backward), (9, Optimizer)]
                .into_iter()
                .map(|(start, phase)| Run { start, phase })
                .collect(),
            ..Phases::default()
        };
        let by_hand = |i: usize| match i {
            0..=2 => Init,
            3 => Forward,
            4..=8 => Backward,
            _ => Optimizer,
        };
        let mut cursor = phases.cursor();
        // In order, with a skip, again, back to the start, back into the middle.
        for i in [0, 1, 2, 3, 4, 7, 7, 8, 9, 11, 0, 5, 3, 10, 20] {
            assert_eq!(cursor.phase_at(i), by_hand(i), "event {i}");
            assert_eq!(phases.phase_at(i), by_hand(i), "event {i}");
        }
        // No runs: every event is between steps.
        let none = Phases::default();
        let mut cursor = none.cursor();
        assert_eq!(cursor.phase_at(0), Between);
        assert_eq!(cursor.phase_at(5), Between);
    }

    fn phases_of(said: &[Said]) -> Vec<(u32, Phase)> {
        let said: Vec<(u32, Said)> = said
            .iter()
            .enumerate()
            .map(|(i, &s)| (i as u32, s))
            .collect();
        resolve(&said).iter().map(|r| (r.start, r.phase)).collect()
    }

    #[test]
    fn empty_stacks_continue_and_plain_frames_take_their_neighbours() {
        use Phase::*;
        let f = Said::Phase(Forward);
        let b = Said::Phase(Backward);
        let o = Said::Phase(Optimizer);
        // forward, the loss (plain), backward on the engine's thread (empty), a hook
        // inside backward (plain), the optimizer, then the loop (plain) and no more.
        let got = phases_of(&[
            Said::Plain,
            f,
            f,
            Said::Plain,
            b,
            Said::Empty,
            Said::Plain,
            Said::Empty,
            o,
            Said::Plain,
        ]);
        assert_eq!(
            got,
            vec![
                (0, Between),
                (1, Forward),
                (4, Backward),
                (8, Optimizer),
                (9, Between)
            ]
        );
    }

    #[test]
    fn annotations_pair_start_and_end_by_name() {
        let a = |stage: &str, name: &str, t: i64| Annotation {
            name: name.into(),
            stage: stage.into(),
            device: 0,
            time_us: t,
        };
        let ranges = annotated_ranges(
            &[
                a("START", "Optimizer.zero_grad#AdamW.zero_grad", 10),
                a("END", "Optimizer.zero_grad#AdamW.zero_grad", 12),
                a("START", "ProfilerStep#1", 13),
                a("START", "Optimizer.step#AdamW.step", 20),
                a("END", "Optimizer.step#AdamW.step", 30),
                a("END", "ProfilerStep#1", 31),
                a("END", "Optimizer.step#SGD.step", 40),
            ],
            0,
        );
        assert_eq!(
            ranges,
            vec![(10, 12, Phase::ZeroGrad), (20, 30, Phase::Optimizer)]
        );
    }

    #[test]
    fn unmatched_starts_and_ends_cost_one_look_up_each() {
        // 100,000 STARTs that no END closes, then 100,000 ENDs of other names (a search
        // of the open ones for each END would compare 10^10 names), then one pair that
        // matches, nested in a START of its own name that stays open.
        let n = 100_000;
        let a = |stage: &str, name: String, t: i64| Annotation {
            name,
            stage: stage.into(),
            device: 0,
            time_us: t,
        };
        let mut all: Vec<Annotation> = (0..n)
            .map(|i| a("START", format!("Optimizer.step#A{i}.step"), i))
            .collect();
        all.extend((0..n).map(|i| a("END", format!("Optimizer.step#B{i}.step"), n + i)));
        all.push(a("START", "Optimizer.step#C.step".into(), 3 * n));
        all.push(a("START", "Optimizer.step#C.step".into(), 3 * n + 5));
        all.push(a("END", "Optimizer.step#C.step".into(), 3 * n + 9));
        // The END closes the latest START of its name: 5 to 9 after 3n.
        assert_eq!(
            annotated_ranges(&all, 0),
            vec![(3 * n + 5, 3 * n + 9, Phase::Optimizer)]
        );
    }
}
