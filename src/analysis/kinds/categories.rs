//! What kind of memory each allocation of a device is: parameters, gradients, optimizer
//! state, step temporaries, activations, backward temporaries, caches, communication,
//! workspaces, compile, inputs, other, unknown; each with the evidence that decided it.
//!
//! Takes a device's replay ([`DeviceReplay`]: its trace and final blocks) and an
//! [`Attributor`] (stacks); gives [`DeviceCategories`], which an attributor is bound to
//! so that every command asks the same rules. The evidence, strongest first:
//!
//! 1. What the file states: the categories of an `export_memory_timeline` file; a user
//!    rule (`--rules`); a frame that says what the memory is for (an all-gather, a
//!    cuBLAS workspace, autotuning, `AccumulateGrad`, a data loader, a KV-cache class,
//!    building a module).
//! 2. The allocation's lifetime across the phases of each step ([`crate::analysis::kinds::phases`]): made
//!    in backward and alive past it, a gradient (whatever op made it: `.grad` takes the
//!    op's output without a copy); made and freed in backward, a backward temporary; made
//!    in an optimizer step and kept past it, optimizer state; freed within it, a step
//!    temporary; made in a forward, an activation; made in a module's `__init__`,
//!    parameters (in an optimizer's file, optimizer state). In a forward-only trace, an
//!    allocation at a stack whose allocations grow while the previous one is alive is a
//!    cache (a KV cache grown by `torch.cat` over decode steps).
//! 3. Sizes, for memory from before recording (no allocation stack): the blocks alive
//!    throughout form copies of one set of sizes (the gradients' sizes the trace made,
//!    the optimizer state's per parameter, else the equal sets they form among
//!    themselves); the first copy is parameters, the next the gradients and optimizer
//!    state the trace does not show being made. Blocks from before recording freed in
//!    the trace take the phase they were freed in. Every decision by sizes is an
//!    inference, and says so.
//!
//! Decisions are data ([`Decision`], [`Evidence`]); renderers say them in words.

use crate::analysis::kinds::attribution::{
    self, ACTIVATIONS, AUTOCAST_COPIES, Attributor, BACKWARD_TEMPORARIES, CACHES, GRADIENTS,
    INPUTS, OPTIMIZER_STATE, OTHER, PARAMETERS, STEP_TEMPORARIES, UNKNOWN, decide_by_stack,
};
use crate::analysis::kinds::attribution::{DeviceDecisions, is_python};
use crate::analysis::kinds::decision::Mark;
pub use crate::analysis::kinds::decision::{Decision, Evidence, LifetimeRule, Reference, SizeRule};
use crate::analysis::kinds::phases::{Phase, Phases};
use crate::model::frames::FxMap;
use crate::model::{Action, ConvertedFrom, DeviceTrace, StackId};
use crate::timeline::replay::{DeviceReplay, FinalAllocation};
use crate::timeline::{Lifetime, Origin};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};

/// The categories of one device's allocations.
#[derive(Debug, Default)]
pub struct DeviceCategories<'a> {
    pub phases: Phases,
    /// Blocks alive throughout with no allocation stack: (category, rule) by address.
    persistent: FxMap<u64, (u32, SizeRule)>,
    /// Sizes of the parameters' set, as the sizes rules found it.
    parameter_sizes: BTreeSet<u64>,
    /// How many parameters alive at the end have each size (made in the trace, or
    /// decided by sizes among the memory from before recording).
    parameter_counts: BTreeMap<u64, u64>,
    /// The `alloc` events of autocast's copies of weights decided by sizes and lifetime
    /// ([`SizeRule::HalfParameterKeptThroughForward`]), ascending.
    half_parameters: Vec<u32>,
    /// The `alloc` events of what the user's code made outside every module and the next
    /// backward freed ([`LifetimeRule::MadeBeforeBackwardFreedByIt`]), ascending.
    saved_for_backward: Vec<u32>,
    /// Stacks whose allocations grow while the previous one is alive.
    cache_stacks: BTreeSet<StackId>,
    /// An `export_memory_timeline` file: the one frame of each stack is its category.
    file_categories: bool,
    /// The trace has events.
    traced: bool,
    /// The stacks show Python code but no module, backward, optimizer step or
    /// `zero_grad` anywhere ([`shows_no_modules`]).
    without_modules: bool,
    /// For a live set at one moment: the first free after it at each address, up to the
    /// end of the moment's run ([`DeviceCategories::prepare_moment`]).
    moment: Mutex<Option<(usize, FxMap<u64, usize>)>>,
    /// The device's trace, for [`DeviceCategories::prepare_moment`].
    trace: Option<&'a DeviceTrace>,
}

impl Clone for DeviceCategories<'_> {
    /// A copy with no moment readied.
    fn clone(&self) -> Self {
        DeviceCategories {
            phases: self.phases.clone(),
            persistent: self.persistent.clone(),
            parameter_sizes: self.parameter_sizes.clone(),
            parameter_counts: self.parameter_counts.clone(),
            half_parameters: self.half_parameters.clone(),
            saved_for_backward: self.saved_for_backward.clone(),
            cache_stacks: self.cache_stacks.clone(),
            file_categories: self.file_categories,
            traced: self.traced,
            without_modules: self.without_modules,
            moment: Mutex::new(None),
            trace: self.trace,
        }
    }
}

/// The category an `export_memory_timeline` category name is.
fn file_category(name: &str) -> u32 {
    match name {
        "parameter" => PARAMETERS,
        "optimizer_state" => OPTIMIZER_STATE,
        "input" => INPUTS,
        "temporary" | "activation" => ACTIVATIONS,
        "gradient" => GRADIENTS,
        "autograd_detail" => BACKWARD_TEMPORARIES,
        _ => UNKNOWN,
    }
}

/// Trace entries from which the frees are paired on a thread of their own.
const FREES_BESIDE_FROM: usize = 1 << 14;

impl<'a> DeviceCategories<'a> {
    /// The categories of the allocations of `r`'s device.
    pub fn build(r: &DeviceReplay<'a>, attr: &Attributor) -> DeviceCategories<'a> {
        // Each allocation's free reads the trace alone: on a long trace, with more than
        // one thread allowed, it is found on a thread of its own beside the rest (where a
        // thread can be had), as the replay pairs its events. Not a task of the thread
        // pool: a caller may hold the pool's threads waiting on this one.
        let beside = r.trace.len() >= FREES_BESIDE_FROM && rayon::current_num_threads() > 1;
        let (mut cats, frees) = if beside {
            std::thread::scope(|s| {
                let frees = std::thread::Builder::new()
                    .spawn_scoped(s, || allocation_frees(r.trace))
                    .ok();
                let cats = Self::build_by_stacks(r, attr);
                let frees =
                    frees.map(|f| f.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
                (cats, frees)
            })
        } else {
            (Self::build_by_stacks(r, attr), None)
        };
        if cats.phases.has(Phase::Backward)
            || (cats.phases.has(Phase::Forward) && !cats.parameter_counts.is_empty())
        {
            let frees = frees.unwrap_or_else(|| allocation_frees(r.trace));
            cats.saved_for_backward = cats.made_before_backward_freed_by_it(r.trace, &frees, attr);
            cats.half_parameters = cats.half_parameters_kept_through_forward(r.trace, &frees, attr);
        }
        cats
    }

    /// The phases, the caches and what was alive at the end: every rule but those that
    /// pair allocations with their frees.
    fn build_by_stacks(r: &DeviceReplay<'a>, attr: &Attributor) -> DeviceCategories<'a> {
        let snap = r.snap;
        let phases = Phases::find(r.trace, &snap.external_annotations, r.device, attr);
        let file_categories = snap.features.converted_from == Some(ConvertedFrom::MemoryTimeline);
        let mut cats = DeviceCategories {
            phases,
            file_categories,
            traced: !r.trace.is_empty(),
            trace: Some(r.trace),
            ..DeviceCategories::default()
        };
        if !cats.phases.has(Phase::Backward) {
            cats.cache_stacks = growing_stacks(r, attr, &cats.phases);
        }
        let finals = r.final_allocations();
        // A snapshot's stacks are whole; a converted trace's are operator names and a
        // few Python frames, which would not show a module if there were one.
        cats.without_modules =
            snap.features.converted_from.is_none() && shows_no_modules(r, &finals, attr);
        cats.infer_persistent(&finals, attr);
        cats
    }

    /// The category of a lifetime of this device, and what decided it.
    pub fn decide(&self, attr: &Attributor, l: &Lifetime) -> Decision {
        let lifetime = |rule: LifetimeRule, category: u32| Decision {
            category,
            evidence: Evidence::Lifetime(rule),
        };
        let facts = attr.stack_facts(l);
        if let Some(f) = facts {
            if self.file_categories
                && let Some(&frame) = attr
                    .frames()
                    .stack(Attributor::allocation_stack(l).expect("a framed stack"))
                    .first()
            {
                let name = attr.frames().str(attr.frames().frame(frame).name);
                return Decision {
                    category: file_category(name),
                    evidence: Evidence::FileCategory,
                };
            }
            if let Some((category, rule)) = f.category {
                return Decision {
                    category,
                    evidence: Evidence::Stack(rule),
                };
            }
        }
        // A cast under autocast the size of half a parameter: autocast's copy of a
        // weight (an activation's cast is sized by the batch and sequence).
        if l.origin == Origin::Traced
            && facts.is_some_and(|f| f.autocast_cast)
            && self.parameter_sizes.contains(&l.size.saturating_mul(2))
        {
            return Decision {
                category: AUTOCAST_COPIES,
                evidence: Evidence::Sizes(SizeRule::AutocastCopy),
            };
        }
        if l.origin == Origin::Traced
            && l.alloc
                .is_some_and(|a| listed(&self.half_parameters, a.index()))
        {
            return Decision {
                category: AUTOCAST_COPIES,
                evidence: Evidence::Sizes(SizeRule::HalfParameterKeptThroughForward),
            };
        }
        match l.origin {
            Origin::Traced => match l.alloc {
                Some(a) => self.decide_traced(attr, l, a.index(), facts.map(|f| f.init_file)),
                None => decide_by_stack(attr, l),
            },
            Origin::BeforeTrace => {
                let freed = self.freed_at(l);
                let phase = freed.map_or(Phase::Between, |f| self.phases.phase_at(f));
                use LifetimeRule::*;
                match phase {
                    Phase::Backward => lifetime(BeforeRecordingFreedInBackward, ACTIVATIONS),
                    Phase::Forward => lifetime(BeforeRecordingFreedInForward, ACTIVATIONS),
                    Phase::Optimizer => lifetime(BeforeRecordingFreedInStep, OPTIMIZER_STATE),
                    Phase::ZeroGrad => lifetime(BeforeRecordingFreedInZeroGrad, GRADIENTS),
                    Phase::Init | Phase::Between => lifetime(BeforeRecordingFreedBetween, UNKNOWN),
                }
            }
            Origin::Survivor => match facts {
                // A block whose allocation the trace lost but whose frames it kept: made
                // where its frames say, and alive at the end.
                Some(f) => match f.mark {
                    Mark::Backward => lifetime(LifetimeRule::BlockMadeInBackward, GRADIENTS),
                    Mark::Optimizer => lifetime(LifetimeRule::BlockMadeInStep, OPTIMIZER_STATE),
                    _ => decide_by_stack(attr, l),
                },
                None => match self.persistent.get(&l.addr) {
                    Some(&(category, rule)) => Decision {
                        category,
                        evidence: Evidence::Sizes(rule),
                    },
                    None => Decision {
                        category: if self.traced { PARAMETERS } else { UNKNOWN },
                        evidence: if self.traced {
                            Evidence::Sizes(SizeRule::Unmatched)
                        } else {
                            Evidence::Nothing
                        },
                    },
                },
            },
        }
    }

    fn moment_lock(&self) -> MutexGuard<'_, Option<(usize, FxMap<u64, usize>)>> {
        self.moment.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Readies decisions about the allocations alive just after event `at` (a live set,
    /// whose lifetimes do not say when they are freed yet): the first free after `at` at
    /// each address, up to the end of `at`'s run, where that run is one whose rules ask
    /// whether an allocation outlives it.
    pub fn prepare_moment(&self, at: Option<usize>) {
        let Some(at) = at else {
            *self.moment_lock() = None;
            return;
        };
        if self.moment_lock().as_ref().is_some_and(|(m, _)| *m == at) {
            return;
        }
        let run = self.phases.run_of(at);
        let mut first = FxMap::default();
        let asks = match self.phases.phase(run) {
            Phase::Backward | Phase::Optimizer | Phase::Init => true,
            // Where no module forward is seen, what is made and freed between phases is
            // read as the computation's intermediates.
            Phase::Between => self.without_modules,
            _ => false,
        };
        if let (Some(trace), true) = (self.trace, asks) {
            let end = self
                .phases
                .runs()
                .get(run + 1)
                .map_or(trace.len(), |r| r.start as usize);
            for i in at + 1..end.min(trace.len()) {
                if matches!(
                    trace.action(i),
                    Action::FreeRequested | Action::FreeCompleted
                ) {
                    first.entry(trace.addr(i)).or_insert(i);
                }
            }
        }
        *self.moment_lock() = Some((at, first));
    }

    /// When a lifetime is freed: its own free, or for a live set readied by
    /// [`DeviceCategories::prepare_moment`], the first free after the moment at its
    /// address within the moment's run.
    fn freed_at(&self, l: &Lifetime) -> Option<usize> {
        if let Some(e) = l.free_requested.or(l.free_completed) {
            return Some(e.index());
        }
        let moment = self.moment_lock();
        let (at, first) = moment.as_ref()?;
        if l.alloc.is_some_and(|a| a.index() <= *at) {
            first.get(&l.addr).copied()
        } else {
            None
        }
    }

    /// Whether a lifetime that [`DeviceCategories::freed_at`] finds no free for outlived
    /// the run it was made in: that run is not the last, or the trace ends after its
    /// annotation closed. (For a live set, no free within the rest of the moment's run
    /// means it lived past that run.)
    fn alive_past(&self, made: usize) -> bool {
        made != self.phases.last_run() || self.phases.last_run_closed
    }

    /// Whether an allocation made in run `made` (freed in run `freed`, if known) stayed
    /// alive through a run of `zero_grad` that freed memory.
    fn kept_through_zero_grad(&self, made: usize, freed: Option<usize>) -> bool {
        let until = match freed {
            Some(f) => f,
            None => match self.moment_lock().as_ref() {
                Some((at, _)) => self.phases.run_of(*at),
                None => usize::MAX,
            },
        };
        self.phases
            .freeing_zero_grads
            .iter()
            .any(|&z| z > made && z < until)
    }

    fn decide_traced(
        &self,
        attr: &Attributor,
        l: &Lifetime,
        alloc: usize,
        init_file: Option<Option<crate::model::StrId>>,
    ) -> Decision {
        use LifetimeRule::*;
        let lifetime = |rule: LifetimeRule, category: u32| Decision {
            category,
            evidence: Evidence::Lifetime(rule),
        };
        let made = self.phases.run_of(alloc);
        let freed = self.freed_at(l).map(|e| self.phases.run_of(e));
        let same_run = freed == Some(made);
        let ended = freed.is_some() || self.alive_past(made);
        if Attributor::allocation_stack(l).is_some_and(|s| self.cache_stacks.contains(&s)) {
            return lifetime(GrowsWhileAlive, CACHES);
        }
        match self.phases.phase(made) {
            Phase::Backward if same_run => lifetime(MadeAndFreedInBackward, BACKWARD_TEMPORARIES),
            Phase::Backward
                if ended
                    && !self.parameter_sizes.is_empty()
                    && !self.parameter_sizes.contains(&l.size) =>
            {
                lifetime(MadeInBackwardNotParameterSized, OTHER)
            }
            Phase::Backward if ended && self.kept_through_zero_grad(made, freed) => {
                lifetime(MadeInBackwardKeptThroughZeroGrad, OTHER)
            }
            Phase::Backward if ended => lifetime(MadeInBackwardOutlivedIt, GRADIENTS),
            Phase::Backward if self.parameter_sizes.contains(&l.size) => {
                lifetime(MadeInBackwardParameterSized, GRADIENTS)
            }
            Phase::Backward => lifetime(MadeInBackwardTraceEnded, BACKWARD_TEMPORARIES),
            Phase::Optimizer if same_run => lifetime(MadeAndFreedInStep, STEP_TEMPORARIES),
            Phase::Optimizer if ended => lifetime(MadeInStepKept, OPTIMIZER_STATE),
            Phase::Optimizer => lifetime(MadeInStepTraceEnded, OPTIMIZER_STATE),
            Phase::ZeroGrad => lifetime(MadeInZeroGrad, GRADIENTS),
            Phase::Forward => lifetime(MadeInForward, ACTIVATIONS),
            Phase::Init => {
                let file = init_file.flatten();
                if file.is_some_and(|f| self.phases.optimizer_files.contains(&f)) {
                    lifetime(MadeInOptimizerInit, OPTIMIZER_STATE)
                } else if same_run {
                    lifetime(MadeAndFreedInInit, OTHER)
                } else {
                    lifetime(MadeInInitKept, PARAMETERS)
                }
            }
            Phase::Between => match attr.stack_facts(l).map(|f| f.mark) {
                Some(Mark::Plain) if listed(&self.saved_for_backward, alloc) => {
                    lifetime(MadeBeforeBackwardFreedByIt, ACTIVATIONS)
                }
                Some(Mark::Plain) if same_run && self.without_modules => {
                    lifetime(MadeAndFreedWithoutModules, ACTIVATIONS)
                }
                Some(Mark::Plain) | Some(Mark::Empty) | None => lifetime(MadeBetweenPhases, OTHER),
                Some(_) => decide_by_stack(attr, l),
            },
        }
    }

    /// Matches the blocks alive throughout that have no allocation stack against one set
    /// of sizes (the module documentation's rule 3).
    fn infer_persistent(&mut self, finals: &[FinalAllocation], attr: &Attributor) {
        let last_run = self.phases.last_run();
        let mut untraced: Vec<(u64, u64)> = Vec::new();
        let mut gradients: BTreeMap<u64, u64> = BTreeMap::new();
        let mut state: BTreeMap<u64, u64> = BTreeMap::new();
        // The parameters the trace made and alive at the end, counted by size.
        let mut traced_parameters: BTreeMap<u64, u64> = BTreeMap::new();
        let mut made_in_backward: Vec<u64> = Vec::new();
        for f in finals {
            let framed = f.stack.filter(|&s| !attr.frames().stack(s).is_empty());
            match f.last_alloc {
                None if framed.is_none() => untraced.push((f.addr, f.size)),
                None => {}
                Some(a) => {
                    let run = self.phases.run_of(a);
                    let strong = framed.and_then(|s| attr.facts(s).category);
                    match (self.phases.phase(run), strong) {
                        (Phase::Backward, None) if run != last_run => made_in_backward.push(f.size),
                        (_, Some((c, _))) if c == GRADIENTS => {
                            *gradients.entry(f.size).or_default() += 1
                        }
                        (_, Some((c, _))) if c == PARAMETERS => {
                            *traced_parameters.entry(f.size).or_default() += 1;
                        }
                        (Phase::Optimizer, None) => *state.entry(f.size).or_default() += 1,
                        (Phase::Init, None) => {
                            *traced_parameters.entry(f.size).or_default() += 1;
                        }
                        _ => {}
                    }
                }
            }
        }
        // Made in backward and kept: gradients, but where the parameters' sizes are known
        // from the trace, only those of a parameter's size (a cuBLAS workspace made by
        // the first matmul on the autograd engine's thread is kept too).
        for size in made_in_backward {
            if traced_parameters.is_empty() || traced_parameters.contains_key(&size) {
                *gradients.entry(size).or_default() += 1;
            }
        }
        self.parameter_sizes = traced_parameters.keys().copied().collect();
        self.parameter_counts = traced_parameters.clone();
        if untraced.is_empty() || !self.traced {
            return;
        }
        // No module, backward, optimizer step or zero_grad anywhere: nothing says
        // there are weights to copy; what was made before is the functions' inputs.
        if self.without_modules && traced_parameters.is_empty() {
            for &(addr, _) in &untraced {
                self.persistent
                    .insert(addr, (INPUTS, SizeRule::WithoutModules));
            }
            return;
        }
        let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
        for &(_, size) in &untraced {
            *counts.entry(size).or_default() += 1;
        }
        let (reference, sets, kind) = if !gradients.is_empty() {
            (gradients.clone(), 1, Reference::Gradients)
        } else if !state.is_empty() {
            let k = exact_copies(&state);
            (divide(&state, k), 1, Reference::OptimizerState)
        } else {
            // Gradients made before recording are kept through a traced backward that
            // makes none: expect more than one copy there, and only an exact one in a
            // forward-only trace.
            let k = if self.phases.has(Phase::Backward) {
                likely_copies(&counts)
            } else {
                exact_copies(&counts)
            };
            (divide(&counts, k), k, Reference::EqualSets)
        };
        // Copies of the reference among the untraced blocks, by the sizes that hold
        // nine tenths of its bytes.
        let copies = major_sizes(&reference, 0.9)
            .iter()
            .map(|s| counts.get(s).copied().unwrap_or(0) / reference[s].max(1))
            .min()
            .unwrap_or(0)
            .min(if kind == Reference::EqualSets {
                sets
            } else {
                u64::MAX
            })
            .min(u8::MAX as u64) as u8;
        let mut roles = Vec::new();
        if traced_parameters.is_empty() {
            roles.push(PARAMETERS);
        }
        if gradients.is_empty() {
            roles.push(GRADIENTS);
        }
        if state.is_empty() {
            roles.extend([OPTIMIZER_STATE; 4]);
        }
        self.parameter_sizes.extend(reference.keys().copied());
        let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
        for &(addr, size) in &untraced {
            let n = seen.entry(size).or_default();
            let per_copy = reference.get(&size).copied().unwrap_or(0);
            let decided = if per_copy > 0 && *n < per_copy * copies as u64 {
                let copy = (*n / per_copy) as usize;
                roles.get(copy).map(|&category| {
                    (
                        category,
                        SizeRule::CopyOf {
                            copy: copy as u8 + 1,
                            copies,
                            reference: kind,
                        },
                    )
                })
            } else {
                None
            };
            *n += 1;
            let decided = decided.unwrap_or((PARAMETERS, SizeRule::Unmatched));
            if decided.0 == PARAMETERS {
                *self.parameter_counts.entry(size).or_default() += 1;
            }
            self.persistent.insert(addr, decided);
        }
    }

    /// How many parameters have twice `size` bytes.
    fn parameters_of_twice(&self, size: u64) -> u64 {
        size.checked_mul(2)
            .and_then(|twice| self.parameter_counts.get(&twice))
            .copied()
            .unwrap_or(0)
    }

    /// The allocations the user's own code made outside every module and the backward
    /// of the same step freed (the module documentation's rule 2, where no `forward`
    /// frame shows a forward: a script that computes attention by calling its own
    /// functions). Each was made between phases by frames that mark no phase, freed by a
    /// free in backward whose stack is the autograd engine's (or has no frames, as on the
    /// engine's own thread), with no optimizer step, `zero_grad` or model building in
    /// between: autograd held it for backward, as it holds a forward's activations.
    fn made_before_backward_freed_by_it(
        &self,
        trace: &DeviceTrace,
        frees: &[(u32, Option<u32>)],
        attr: &Attributor,
    ) -> Vec<u32> {
        if !self.phases.has(Phase::Backward) {
            return Vec::new();
        }
        // Runs that end a step, counted up to each run: two runs with the same count
        // are in the same step.
        let mut steps = Vec::with_capacity(self.phases.runs().len());
        let mut ended = 0u32;
        for run in self.phases.runs() {
            if matches!(run.phase, Phase::Optimizer | Phase::ZeroGrad | Phase::Init) {
                ended += 1;
            }
            steps.push(ended);
        }
        let mark = |i: u32| trace.stack(i as usize).map(|s| attr.facts(s));
        frees
            .iter()
            .filter_map(|&(alloc, free)| {
                let free = free?;
                let made = self.phases.run_of(alloc as usize);
                let freed = self.phases.run_of(free as usize);
                if self.phases.phase(made) != Phase::Between
                    || self.phases.phase(freed) != Phase::Backward
                    || steps.get(made) != steps.get(freed)
                {
                    return None;
                }
                let by_engine =
                    mark(free).is_none_or(|f| matches!(f.mark, Mark::Backward | Mark::Empty));
                let made_by_user =
                    mark(alloc).is_some_and(|f| f.mark == Mark::Plain && f.category.is_none());
                (by_engine && made_by_user).then_some(alloc)
            })
            .collect()
    }

    /// Autocast's half-precision copies of the weights, where the stacks record no C++
    /// frame and so cannot show `cached_cast`: per forward (a run of the forward phase),
    /// the allocations made in it that no frame rule decides, exactly half the bytes of
    /// a parameter, and alive until the forward's last allocation or later (autocast
    /// keeps its copies until its region ends; an activation of the same size freed
    /// within the forward is not one). A size is taken where the forward made at most one
    /// such allocation per parameter of twice its bytes (autocast casts a weight once);
    /// a forward's copies are taken where they copy weights of two sizes or more that
    /// hold at least half the parameters' bytes (autocast casts every weight a linear
    /// layer uses, and a model's linear layers come in several sizes; a few outputs that
    /// happen to be half a weight, such as an fp32 model's logits, or the activations of
    /// one size that a training forward keeps for backward, are not a set of copies). A
    /// forward cut short before it used half the weights (an OOM early in it), or a
    /// model whose weights are all of one size, is not decided by sizes: its copies stay
    /// activations.
    fn half_parameters_kept_through_forward(
        &self,
        trace: &DeviceTrace,
        frees: &[(u32, Option<u32>)],
        attr: &Attributor,
    ) -> Vec<u32> {
        if self.parameter_counts.is_empty() || !self.phases.has(Phase::Forward) {
            return Vec::new();
        }
        let facts = |i: u32| trace.stack(i as usize).map(|s| attr.facts(s));
        if frees
            .iter()
            .any(|&(alloc, _)| facts(alloc).is_some_and(|f| f.cpp_frames))
        {
            return Vec::new();
        }
        let mut last_alloc: Vec<u32> = vec![0; self.phases.runs().len()];
        for &(alloc, _) in frees {
            if let Some(last) = last_alloc.get_mut(self.phases.run_of(alloc as usize)) {
                *last = alloc;
            }
        }
        // forward run -> size -> its allocations that live through the forward
        let mut kept: BTreeMap<usize, BTreeMap<u64, Vec<u32>>> = BTreeMap::new();
        for &(alloc, free) in frees {
            let run = self.phases.run_of(alloc as usize);
            if self.phases.phase(run) != Phase::Forward {
                continue;
            }
            let size = trace.size(alloc as usize);
            if self.parameters_of_twice(size) == 0
                || free.is_some_and(|f| f <= last_alloc[run])
                || facts(alloc).is_some_and(|f| f.category.is_some())
            {
                continue;
            }
            kept.entry(run)
                .or_default()
                .entry(size)
                .or_default()
                .push(alloc);
        }
        let parameter_bytes: u128 = self
            .parameter_counts
            .iter()
            .map(|(&size, &n)| size as u128 * n as u128)
            .sum();
        let mut out = Vec::new();
        for sizes in kept.values() {
            // At most one copy per parameter of twice its bytes.
            let taken: Vec<(&u64, &Vec<u32>)> = sizes
                .iter()
                .filter(|(size, allocs)| allocs.len() as u64 <= self.parameters_of_twice(**size))
                .collect();
            let bytes: u128 = taken
                .iter()
                .map(|(size, allocs)| **size as u128 * allocs.len() as u128)
                .sum();
            // Copies of weights of two sizes or more, holding (twice the copies' bytes)
            // half the parameters or more.
            if taken.len() >= 2 && bytes * 2 * 2 >= parameter_bytes {
                out.extend(taken.iter().flat_map(|(_, allocs)| allocs.iter().copied()));
            }
        }
        out.sort_unstable();
        out
    }
}

/// Whether event `i` is in `events` (ascending).
fn listed(events: &[u32], i: usize) -> bool {
    u32::try_from(i).is_ok_and(|i| events.binary_search(&i).is_ok())
}

/// Each `alloc` event of a trace with the event that freed it (its `free_requested`,
/// else its `free_completed`; None while alive at the end), in event order.
fn allocation_frees(trace: &DeviceTrace) -> Vec<(u32, Option<u32>)> {
    let mut out: Vec<(u32, Option<u32>)> = Vec::new();
    let mut open: FxMap<u64, usize> = FxMap::default();
    for i in 0..trace.len() {
        match trace.action(i) {
            Action::Alloc => {
                open.insert(trace.addr(i), out.len());
                out.push((i as u32, None));
            }
            Action::FreeRequested | Action::FreeCompleted => {
                if let Some(k) = open.remove(&trace.addr(i)) {
                    out[k].1 = Some(i as u32);
                }
            }
            _ => {}
        }
    }
    out
}

/// Whether a device's stacks (its trace's allocations and its final blocks) show Python
/// code and none of them a module's `__init__` or `forward`, a backward, an optimizer
/// step or `zero_grad`: a script that calls its own functions directly (an attention
/// benchmark). Stacks without Python frames (C++ only, a profiler's operator names)
/// show nothing either way.
fn shows_no_modules(r: &DeviceReplay, finals: &[FinalAllocation], attr: &Attributor) -> bool {
    let traced = (0..r.trace.len())
        .filter(|&i| r.trace.action(i) == Action::Alloc)
        .filter_map(|i| r.trace.stack(i));
    let mut seen = BTreeSet::new();
    let mut python = false;
    for s in traced.chain(finals.iter().filter_map(|f| f.stack)) {
        if !seen.insert(s) {
            continue;
        }
        match attr.facts(s).mark {
            Mark::Empty => {}
            Mark::Plain => {
                let frames = attr.frames();
                python |= frames
                    .stack(s)
                    .iter()
                    .any(|&f| is_python(frames.str(frames.frame(f).filename)));
            }
            _ => return false,
        }
    }
    python
}

/// How many equal copies a multiset of sizes holds, exactly: the greatest common divisor
/// of the counts of its sizes of 1 KiB or more (scalars, such as an optimizer's step
/// counters, are left out).
fn exact_copies(counts: &BTreeMap<u64, u64>) -> u64 {
    counts
        .iter()
        .filter(|&(&s, _)| s >= 1024)
        .fold(0, |g, (_, &n)| gcd(g, n))
        .max(1)
}

/// How many equal copies a multiset holds when some memory besides the copies may be
/// mixed in: the smallest k of at least 2 that divides the counts of the sizes holding
/// 99% of its bytes, else 1.
fn likely_copies(counts: &BTreeMap<u64, u64>) -> u64 {
    let total: u128 = counts.iter().map(|(&s, &n)| s as u128 * n as u128).sum();
    (2..=8)
        .find(|&k| {
            let held: u128 = counts
                .iter()
                .filter(|&(_, &n)| n % k == 0)
                .map(|(&s, &n)| s as u128 * n as u128)
                .sum();
            held as f64 >= total as f64 * 0.99
        })
        .unwrap_or(1)
}

/// The sizes holding at least `share` of the bytes of `counts`, largest bytes first.
fn major_sizes(counts: &BTreeMap<u64, u64>, share: f64) -> Vec<u64> {
    let total: u128 = counts.iter().map(|(&s, &n)| s as u128 * n as u128).sum();
    let mut by_bytes: Vec<(u128, u64)> = counts
        .iter()
        .map(|(&s, &n)| (s as u128 * n as u128, s))
        .collect();
    by_bytes.sort_unstable_by(|a, b| b.cmp(a));
    let mut out = Vec::new();
    let mut held = 0u128;
    for (bytes, size) in by_bytes {
        if share < 1.0 && held as f64 >= total as f64 * share {
            break;
        }
        held += bytes;
        out.push(size);
    }
    out
}

fn divide(counts: &BTreeMap<u64, u64>, k: u64) -> BTreeMap<u64, u64> {
    counts
        .iter()
        .filter(|&(_, &n)| n / k > 0)
        .map(|(&s, &n)| (s, n / k))
        .collect()
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Stacks of forward allocations that grow while the previous allocation of the same
/// stack is alive, at least twice and never shrinking: a cache grown by concatenation.
fn growing_stacks(r: &DeviceReplay, attr: &Attributor, phases: &Phases) -> BTreeSet<StackId> {
    #[derive(Default, Clone, Copy)]
    struct Seen {
        last: u64,
        grew: u32,
        shrank: bool,
        live: u32,
    }
    let trace = r.trace;
    let mut seen: FxMap<StackId, Seen> = FxMap::default();
    let mut live: FxMap<u64, StackId> = FxMap::default();
    for i in 0..trace.len() {
        match trace.action(i) {
            Action::Alloc => {
                let Some(stack) = trace.stack(i) else {
                    continue;
                };
                if phases.phase_at(i) != Phase::Forward
                    || attr.facts(stack).category.is_some()
                    || attr.frames().stack(stack).is_empty()
                {
                    continue;
                }
                let size = trace.size(i);
                let s = seen.entry(stack).or_default();
                if s.live > 0 && size > s.last && s.last > 0 {
                    s.grew += 1;
                } else if size < s.last {
                    s.shrank = true;
                }
                s.last = size;
                s.live += 1;
                if let Some(old) = live.insert(trace.addr(i), stack)
                    && let Some(o) = seen.get_mut(&old)
                {
                    o.live = o.live.saturating_sub(1);
                }
            }
            Action::FreeCompleted => {
                if let Some(stack) = live.remove(&trace.addr(i))
                    && let Some(s) = seen.get_mut(&stack)
                {
                    s.live = s.live.saturating_sub(1);
                }
            }
            _ => {}
        }
    }
    seen.into_iter()
        .filter(|(_, s)| s.grew >= 2 && !s.shrank)
        .map(|(stack, _)| stack)
        .collect()
}

/// The part of a group's bytes in one category.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CategoryPart {
    pub category: String,
    /// Requested bytes.
    pub bytes: u64,
    pub count: usize,
    /// What decided the category of most of the part's bytes ([`Evidence::code`]).
    pub evidence: String,
    /// Whether that is an inference.
    pub inferred: bool,
    /// The part by what decided it, the most bytes first.
    pub by_evidence: Vec<EvidencePart>,
}

/// The bytes of a category that one piece of evidence decided.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EvidencePart {
    pub evidence: String,
    pub bytes: u64,
    pub count: usize,
    pub inferred: bool,
}

/// The categories of a group's allocations, the most bytes first (ties: the built-in
/// order), each split by the evidence that decided it. Every allocation is decided once.
pub fn split<'l>(
    attr: &Attributor,
    members: impl IntoIterator<Item = &'l Lifetime>,
) -> Vec<CategoryPart> {
    // (category, evidence) -> (bytes, count)
    let mut parts: BTreeMap<(u32, Evidence), (u64, usize)> = BTreeMap::new();
    for l in members {
        let d = attr.decide(l);
        let p = parts.entry((d.category, d.evidence)).or_insert((0, 0));
        p.0 += l.size;
        p.1 += 1;
    }
    let mut by_category: BTreeMap<u32, Vec<(Evidence, u64, usize)>> = BTreeMap::new();
    for ((c, e), (bytes, count)) in parts {
        by_category.entry(c).or_default().push((e, bytes, count));
    }
    let mut out: Vec<(u32, CategoryPart)> = by_category
        .into_iter()
        .map(|(c, mut evidence)| {
            evidence.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let by_evidence: Vec<EvidencePart> = evidence
                .iter()
                .map(|(e, bytes, count)| EvidencePart {
                    evidence: e.code(attr.frames()),
                    bytes: *bytes,
                    count: *count,
                    inferred: e.inferred(),
                })
                .collect();
            let main = &by_evidence[0];
            (
                c,
                CategoryPart {
                    category: attr
                        .categories
                        .get(c as usize)
                        .cloned()
                        .unwrap_or_else(|| "other".into()),
                    bytes: by_evidence.iter().map(|p| p.bytes).sum(),
                    count: by_evidence.iter().map(|p| p.count).sum(),
                    evidence: main.evidence.clone(),
                    inferred: main.inferred,
                    by_evidence,
                },
            )
        })
        .collect();
    out.sort_by(|a, b| b.1.bytes.cmp(&a.1.bytes).then(a.0.cmp(&b.0)));
    out.into_iter().map(|(_, p)| p).collect()
}

/// Names of the categories a decision can give, for renderers that need them all.
pub fn builtin_names() -> &'static [&'static str] {
    &attribution::BUILTIN_CATEGORIES
}

impl DeviceDecisions for DeviceCategories<'_> {
    fn decide(&self, attr: &Attributor<'_>, l: &Lifetime) -> Decision {
        DeviceCategories::decide(self, attr, l)
    }

    fn prepare_moment(&self, at: Option<usize>) {
        DeviceCategories::prepare_moment(self, at)
    }
}

/// An attributor of `r`'s file under `options`, bound to the categories of `r`'s device:
/// the one way a command's session (or a rank's) gets the attributor its analyses share.
pub fn bound_attributor<'f>(
    r: &DeviceReplay<'f>,
    options: &crate::analysis::kinds::attribution::AttributionOptions,
) -> Attributor<'f> {
    let mut attr = Attributor::new(&r.snap.frames, options);
    attr.bind(DeviceCategories::build(r, &attr));
    attr
}
