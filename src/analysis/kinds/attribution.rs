//! Who holds the memory: each allocation's call site, category and stack, computed once
//! per distinct stack.
//!
//! * Call site: the innermost frame of the user's code. Frames of torch itself, of
//!   Python's standard library, of `nn.Module` call wrappers and hooks, and C++ frames
//!   are skipped (`keep` and `skip` patterns adjust that). A stack with only C++ frames is
//!   named by what they show (the autograd engine, NCCL, the allocator itself).
//!   Allocations from before the trace have no allocation stack: "before recording".
//! * Category: a user rule whose pattern matches any frame of the stack, else the
//!   innermost frame that a built-in rule matches (frames written `filename:line:name`;
//!   Python and C++ frames have rule tables of their own).
//! * Stack: the whole interned stack.
//!
//! Keys are data; renderers choose the words.

use super::decision::{Decision, Evidence};
pub use super::decision::{Mark, StackRule};
use crate::model::{FrameTable, StackId};
use crate::timeline::{Lifetime, Origin};
use regex::{Regex, RegexSet};
use serde::Serialize;
use std::cell::RefCell;
use std::sync::LazyLock;

/// How allocations are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    /// The innermost frame of the user's code.
    #[default]
    Callsite,
    /// Parameters, gradients, optimizer state, activations, ...
    Category,
    /// The whole stack.
    Stack,
    /// The file of the call site.
    File,
}

impl std::str::FromStr for GroupBy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "callsite" => Ok(GroupBy::Callsite),
            "category" => Ok(GroupBy::Category),
            "stack" => Ok(GroupBy::Stack),
            "file" => Ok(GroupBy::File),
            _ => Err(format!(
                "expected callsite, category, stack or file, found {s:?}"
            )),
        }
    }
}

/// What a C++-only stack shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CppSite {
    /// The autograd engine running backward.
    AutogradBackward,
    /// NCCL or c10d collectives.
    Nccl,
    /// Only the allocator's own frames were recorded.
    Allocator,
}

/// The call site of an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Site {
    /// A frame (Python, or C++ when the stack has no Python frame).
    Frame(crate::model::FrameId),
    /// The backward of an autograd node, named by its C++ frame
    /// (`torch::autograd::generated::MmBackward0::apply`).
    BackwardOf(crate::model::FrameId),
    /// A C++-only stack of a known kind.
    Cpp(CppSite),
    /// Allocated before the trace began: its allocation stack is not in the file.
    BeforeRecording,
    /// The allocation has an empty stack (recorded without stacks).
    NoStack,
}

/// A group's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GroupKey {
    Site(Site),
    Category(u32),
    Stack(StackId),
    /// A call site's file (a string id), or a site without a file.
    /// The file of a call site that is a frame (other sites group as [`GroupKey::Site`]).
    File(crate::model::StrId),
}

/// What a group (or a band of a chart) is: the kind of its key, the merged rest, or
/// one allocation. Written in JSON by its snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupKind {
    /// A Python frame: `filename:line:name`.
    Frame,
    /// A source file.
    File,
    /// The backward of an autograd node.
    BackwardNode,
    /// A stack with C++ frames only.
    Cpp,
    /// Allocated before recording began.
    BeforeRecording,
    /// No stack was recorded.
    NoStack,
    /// A category.
    Category,
    /// A whole stack.
    Stack,
    /// The groups past a limit, merged.
    Rest,
    /// One allocation (a band of a chart by allocation).
    Allocation,
}

impl GroupKind {
    /// The name JSON and export tables write.
    pub fn name(self) -> &'static str {
        match self {
            GroupKind::Frame => "frame",
            GroupKind::File => "file",
            GroupKind::BackwardNode => "backward_node",
            GroupKind::Cpp => "cpp",
            GroupKind::BeforeRecording => "before_recording",
            GroupKind::NoStack => "no_stack",
            GroupKind::Category => "category",
            GroupKind::Stack => "stack",
            GroupKind::Rest => "rest",
            GroupKind::Allocation => "allocation",
        }
    }
}

/// Built-in categories, in the order the names table holds them.
pub const BUILTIN_CATEGORIES: [&str; 14] = [
    "parameters",
    "gradients",
    "optimizer_state",
    "step_temporaries",
    "activations",
    "backward_temporaries",
    "caches",
    "communication",
    "workspaces",
    "compile",
    "inputs",
    "autocast_copies",
    "other",
    "unknown",
];
pub const PARAMETERS: u32 = 0;
pub const GRADIENTS: u32 = 1;
pub const OPTIMIZER_STATE: u32 = 2;
pub const STEP_TEMPORARIES: u32 = 3;
pub const ACTIVATIONS: u32 = 4;
pub const BACKWARD_TEMPORARIES: u32 = 5;
pub const CACHES: u32 = 6;
pub const COMMUNICATION: u32 = 7;
pub const WORKSPACES: u32 = 8;
pub const COMPILE: u32 = 9;
pub const INPUTS: u32 = 10;
/// Autocast's cached copies of the weights in half precision.
pub const AUTOCAST_COPIES: u32 = 11;
/// Index of "other" (nothing decided a category).
pub const OTHER: u32 = 12;
/// Index of "unknown" (no allocation stack and nothing else to go by).
pub const UNKNOWN: u32 = 13;

/// The index of a built-in category's name.
pub fn builtin_category(name: &str) -> Option<u32> {
    BUILTIN_CATEGORIES
        .iter()
        .position(|c| *c == name)
        .map(|i| i as u32)
}

/// How a frame rule acts: it decides a category whatever the phase, or says which part
/// of a step the stack ran in and leaves the category to the lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleKind {
    Category(&'static str),
    Mark(Mark),
}

/// The built-in rules over Python frames: (kind, pattern over `filename:line:name`),
/// tried innermost frame first; the first match decides. A `Mark` rule stops the search
/// (an activation inside an FSDP-wrapped module is the module's, not communication).
pub const PYTHON_RULES: [(RuleKind, &str); 12] = [
    (
        RuleKind::Category("communication"),
        r"(?i)_fsdp_collectives|all_gather|allgather|reduce_scatter|all_reduce|allreduce|broadcast_coalesced|fsdp.*:_?(unshard|pre_forward|pre_backward)[a-z_]*$|distributed/tensor/_redistribute|_functional_collectives|torch/distributed/distributed_c10d",
    ),
    (RuleKind::Category("workspaces"), r"(?i)workspace"),
    (
        RuleKind::Category("compile"),
        r"(?i)(torch/_inductor|torch/_dynamo|torch/utils/benchmark|triton)/[^:]*:[0-9]+:[^:]*(autotune|do_bench|benchmark)|compile_fx|codecache|_dynamo/convert_frame|triton/runtime",
    ),
    (
        RuleKind::Category("caches"),
        r"(?i)cache_utils\.py:|kv_?cache|cache_engine|paged_attention|mem(ory)?_pool\.py:",
    ),
    (
        RuleKind::Category("gradients"),
        r"accumulate_grad|AccumulateGrad",
    ),
    (RuleKind::Mark(Mark::ZeroGrad), r":zero_grad$"),
    (
        RuleKind::Mark(Mark::Optimizer),
        r"(?i)torch/optim/|Optimizer\.step|optimizer\.step|optim[a-z_]*\.py:[0-9]+:step$",
    ),
    (RuleKind::Mark(Mark::Backward), BACKWARD_PYTHON),
    (
        RuleKind::Category("parameters"),
        r"torch/nn/modules/[^:]*:[0-9]+:(__init__|reset_parameters)$|:_apply$|load_state_dict|_load_from_state_dict|:to_empty$|:materialize$|torch/nn/parameter",
    ),
    (
        RuleKind::Category("inputs"),
        r"torch/utils/data/|DataLoader|pin_memory|collate",
    ),
    (
        RuleKind::Mark(Mark::Forward),
        r":forward$|:_call_impl$|:_wrapped_call_impl$|nn\.Module: |torchinductor|<eval_with_key>|:[a-z_]*loss[a-z_]*$|cross_entropy",
    ),
    (
        RuleKind::Mark(Mark::Forward),
        r"^[^:]*/c[a-z0-9]{50,}\.py:[0-9]+:call$",
    ),
];

/// Python frames of the autograd engine: `loss.backward()`, `torch.autograd.grad`, compiled
/// backward.
const BACKWARD_PYTHON: &str = r"torch/_tensor\.py:[0-9]+:backward$|torch/autograd/__init__\.py:[0-9]+:(backward|grad)$|:_engine_run_backward$|torch/_functorch/[^:]*:[0-9]+:(backward|_backward_impl|call_compiled_backward)$|compiled_autograd";

/// The built-in rules over C++ frames: only signatures that say what the memory is for
/// or where it was made (dispatcher and allocator frames say nothing and match none).
pub const CPP_RULES: [(RuleKind, &str); 4] = [
    (
        RuleKind::Category("communication"),
        r"(?i)nccl|c10d::|ProcessGroup",
    ),
    (RuleKind::Category("workspaces"), r"(?i)workspace"),
    (RuleKind::Category("gradients"), r"AccumulateGrad"),
    (RuleKind::Mark(Mark::Backward), BACKWARD_CPP),
];

/// C++ frames of the autograd engine.
const BACKWARD_CPP: &str = r"autograd::Engine|evaluate_function|Backward[0-9]*::apply";

/// The built-in tables, compiled once.
struct BuiltinRules {
    python: Vec<(Rule, Regex)>,
    cpp: Vec<(Rule, Regex)>,
    backward_python: Regex,
    backward_cpp: Regex,
}

static BUILTIN: LazyLock<BuiltinRules> = LazyLock::new(|| {
    let compile = |table: &[(RuleKind, &str)]| -> Vec<(Rule, Regex)> {
        table
            .iter()
            .map(|(kind, pattern)| {
                let rule = match kind {
                    RuleKind::Category(name) => {
                        Rule::Category(builtin_category(name).expect("built-in category"))
                    }
                    RuleKind::Mark(m) => Rule::Mark(*m),
                };
                (rule, Regex::new(pattern).expect("built-in rule"))
            })
            .collect()
    };
    BuiltinRules {
        python: compile(&PYTHON_RULES),
        cpp: compile(&CPP_RULES),
        backward_python: Regex::new(BACKWARD_PYTHON).expect("built-in rule"),
        backward_cpp: Regex::new(BACKWARD_CPP).expect("built-in rule"),
    }
});

/// Names that the marks, the phases and the call site look for by themselves, whatever
/// the rules' patterns say: a module's `forward`, an optimizer's `step` (their files
/// are learnt from them), and the module call wrappers.
const NAMES_READ: [&str; 4] = ["forward", "step", "_call_impl", "_wrapped_call_impl"];

/// What the built-in decisions read of one frame: a bit for each built-in rule of the
/// frame's kind (Python or C++, by its file) that matches `filename:line:name`, one for
/// the autograd engine's pattern, and one for each name looked for by itself (the names
/// that build a module's tensors, `NAMES_READ`). Two frames of the same file with the
/// same evidence are alike to every built-in mark and category (user rules aside), so
/// redaction keeps a function name only where replacing it would change this.
pub fn frame_evidence(filename: &str, line: i64, name: &str) -> u64 {
    let rules = &*BUILTIN;
    let file = filename.replace('\\', "/");
    let text = format!("{file}:{line}:{name}");
    let python = is_python(filename) || filename.starts_with("<eval_with_key>");
    let (table, backward, offset) = if python {
        (&rules.python, &rules.backward_python, 0)
    } else {
        (&rules.cpp, &rules.backward_cpp, PYTHON_RULES.len())
    };
    let mut bits = 0u64;
    for (i, (_, re)) in table.iter().enumerate() {
        if re.is_match(&text) {
            bits |= 1 << (offset + i);
        }
    }
    let mut next = PYTHON_RULES.len() + CPP_RULES.len();
    if backward.is_match(&text) {
        bits |= 1 << next;
    }
    next += 1;
    if INIT_NAMES.contains(&name) {
        bits |= 1 << next;
    }
    next += 1;
    if let Some(i) = NAMES_READ.iter().position(|n| *n == name) {
        bits |= 1 << (next + i);
    }
    bits
}

/// What a stack tells, computed once per stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StackFacts {
    pub site: Site,
    /// A category the stack decides whatever the phase, and what decided it.
    pub category: Option<(u32, StackRule)>,
    /// Which part of a step it ran in.
    pub mark: Mark,
    /// The file of the innermost `__init__` frame of the user's code, for [`Mark::Init`].
    pub init_file: Option<crate::model::StrId>,
    /// A C++ frame is autocast's `cached_cast`: a cast under autocast (of a weight, kept
    /// in autocast's cache, or of an activation).
    pub autocast_cast: bool,
    /// The stack holds a C++ frame (recorded with `stacks="all"`): where none does, the
    /// frames cannot show autocast's `cached_cast`.
    pub cpp_frames: bool,
}

/// The categories of one device's allocations by their lifetimes, which an attributor
/// bound to that device ([`Attributor::bind`]) asks before its stacks.
pub trait DeviceDecisions {
    /// The category of a lifetime with what decided it.
    fn decide(&self, attr: &Attributor<'_>, l: &Lifetime) -> Decision;
    /// Readies decisions about a live set just after event `at`; None: the end.
    fn prepare_moment(&self, at: Option<usize>);
}

/// How call sites and categories are decided.
#[derive(Debug, Clone, Default)]
pub struct AttributionOptions {
    /// Frames matching this are never skipped for the call site.
    pub keep: Option<Regex>,
    /// Frames matching this are skipped for the call site, as torch's own are.
    pub skip: Option<Regex>,
    /// User rules, tried before the built-in ones, in the file's order.
    pub rules: Vec<UserRule>,
    /// The user rules' patterns as one set, built by the first attributor that needs it
    /// and shared by every attributor of these options (and their clones).
    pub rule_set: UserRuleSet,
}

/// The user rules' patterns combined, so that a frame is searched once for all of them
/// rather than once per rule: tens of thousands of rules that match nothing cost about
/// what one does. Built once for every attributor of a run (clones share it), each part
/// when first needed:
/// - one alternation of every pattern, `(?:p1)|(?:p2)|...`: whether any rule matches a
///   frame (an alternation matches where one of its branches does);
/// - for the frames it matches, a [`RegexSet`] of the patterns: which rules match, of
///   which the first in the file decides.
///
/// When either cannot be compiled (too large; a pattern whose `(?x)` comment would run
/// past its group), the rules are tried in turn, as they would be alone.
#[derive(Debug, Clone, Default)]
pub struct UserRuleSet(std::sync::Arc<RuleSetParts>);

#[derive(Debug, Default)]
struct RuleSetParts {
    any: std::sync::OnceLock<Option<Regex>>,
    which: std::sync::OnceLock<Option<RegexSet>>,
}

/// The most a combined pattern may take when compiled (the rules file's size bounds it).
const RULE_SET_LIMIT: usize = 1 << 30;

impl UserRuleSet {
    /// The index of the first rule (in the file's order) that matches any of `texts`;
    /// None when no combined matcher could be built (the caller tries each rule).
    fn first_match(&self, rules: &[(u32, Regex, u32)], texts: &[String]) -> Option<Option<usize>> {
        let any = self
            .0
            .any
            .get_or_init(|| {
                let alternation: Vec<String> = rules
                    .iter()
                    .map(|(_, re, _)| format!("(?:{})", re.as_str()))
                    .collect();
                regex::RegexBuilder::new(&alternation.join("|"))
                    .size_limit(RULE_SET_LIMIT)
                    .dfa_size_limit(64 << 20)
                    .build()
                    .ok()
            })
            .as_ref()?;
        let hits: Vec<&String> = texts.iter().filter(|t| any.is_match(t)).collect();
        if hits.is_empty() {
            return Some(None);
        }
        let which = self
            .0
            .which
            .get_or_init(|| {
                regex::RegexSetBuilder::new(rules.iter().map(|(_, re, _)| re.as_str()))
                    .size_limit(RULE_SET_LIMIT)
                    .dfa_size_limit(64 << 20)
                    .build()
                    .ok()
            })
            .as_ref()
            .filter(|set| set.len() == rules.len())?;
        Some(
            hits.iter()
                .filter_map(|t| which.matches(t).iter().next())
                .min(),
        )
    }
}

/// One rule of a `--rules` file.
#[derive(Debug, Clone)]
pub struct UserRule {
    /// The category it decides: a built-in one or a new name.
    pub category: String,
    pub pattern: Regex,
    /// Its 1-based line in the file, blank and comment lines counted: what names it in
    /// evidence (`rule:LINE`).
    pub line: u32,
}

/// The most lines a rules file may have (2^24): every rule and category is named by an
/// index of 32 bits, and a file past this is not a set of rules a person keeps.
pub const MAX_RULES_LINES: usize = 1 << 24;

/// Reads a rules file: one `category = pattern` per line, `#` comments and blank lines
/// ignored. Errors name the line.
pub fn parse_rules(text: &str) -> Result<Vec<UserRule>, String> {
    let mut rules = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if n >= MAX_RULES_LINES {
            return Err(format!(
                "line {}: a rules file has at most {MAX_RULES_LINES} lines (2^24)",
                n + 1
            ));
        }
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, pattern) = line
            .split_once('=')
            .ok_or_else(|| format!("line {}: expected `category = pattern`", n + 1))?;
        let name = name.trim();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!(
                "line {}: a category name is letters, digits, '_' or '-', found {name:?}",
                n + 1
            ));
        }
        let re =
            Regex::new(pattern.trim()).map_err(|e| format!("line {}: bad pattern: {e}", n + 1))?;
        rules.push(UserRule {
            category: name.to_string(),
            pattern: re,
            line: (n + 1) as u32,
        });
    }
    Ok(rules)
}

/// Call sites, categories and stacks of allocations, cached per stack. Bound to a
/// device ([`Attributor::bind`]), it decides categories by the lifetimes of that device's
/// allocations as well ([`crate::analysis::kinds::categories`]); unbound, by their stacks alone.
pub struct Attributor<'f> {
    frames: &'f FrameTable,
    keep: Option<Regex>,
    skip: Option<Regex>,
    /// user rules: (category index, pattern, line in the file)
    user_rules: Vec<(u32, Regex, u32)>,
    /// The same patterns combined (None: no rules).
    user_set: Option<UserRuleSet>,
    /// built-in rules over Python frames and over C++ frames
    python_rules: Vec<(Rule, Regex)>,
    cpp_rules: Vec<(Rule, Regex)>,
    backward_python: Regex,
    backward_cpp: Regex,
    /// Category names: the built-in ones, then user-defined ones.
    pub categories: Vec<String>,
    /// per stack id, once computed
    cache: RefCell<Vec<Option<StackFacts>>>,
    /// The device's lifetimes, when bound.
    device: Option<Box<dyn DeviceDecisions + Send + 'f>>,
}

#[derive(Debug, Clone, Copy)]
enum Rule {
    Category(u32),
    Mark(Mark),
}

/// Python's standard library and interpreter plumbing, by file name.
fn is_stdlib(filename: &str) -> bool {
    const FILES: [&str; 8] = [
        "threading.py",
        "contextlib.py",
        "functools.py",
        "runpy.py",
        "abc.py",
        "typing.py",
        "weakref.py",
        "_contextlib.py",
    ];
    let in_stdlib_dir = (filename.contains("/lib/python3") || filename.contains("\\Lib\\"))
        && !filename.contains("-packages");
    let base = filename.rsplit(['/', '\\']).next().unwrap_or(filename);
    in_stdlib_dir || (!filename.contains('/') && FILES.contains(&base))
}

fn is_torch(filename: &str) -> bool {
    let f = filename.replace('\\', "/");
    f.contains("/torch/") || f.starts_with("torch/")
}

pub(crate) fn is_python(filename: &str) -> bool {
    (filename.ends_with(".py") || filename.starts_with('<'))
        && !filename.starts_with("<eval_with_key>")
}

/// Libraries that only pass a call on (einops to torch, opt_einsum to torch), and code
/// that torch generates (inductor's compiled kernels, FX graphs): never a call site while
/// a frame of the user's own code is below them.
fn is_dispatch(filename: &str) -> bool {
    const LIBRARIES: [&str; 4] = ["/einops/", "/opt_einsum/", "/torchinductor", "/triton/"];
    let f = filename.replace('\\', "/");
    LIBRARIES.iter().any(|l| f.contains(l)) || is_generated(&f)
}

/// Inductor's generated modules: `<dir>/c<51 base-32 characters>.py`.
fn is_generated(filename: &str) -> bool {
    let base = filename.rsplit(['/', '\\']).next().unwrap_or(filename);
    let Some(stem) = base.strip_suffix(".py") else {
        return false;
    };
    stem.len() >= 50
        && stem.starts_with('c')
        && stem
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// Names of functions that build a module's or an optimizer's tensors.
const INIT_NAMES: [&str; 4] = [
    "__init__",
    "reset_parameters",
    "_init_weights",
    "init_weights",
];

impl<'f> Attributor<'f> {
    pub fn new(frames: &'f FrameTable, options: &AttributionOptions) -> Self {
        let mut categories: Vec<String> =
            BUILTIN_CATEGORIES.iter().map(|s| s.to_string()).collect();
        let mut user_rules = Vec::new();
        // Category names by index, for rules naming one already seen.
        let mut index_of: std::collections::HashMap<String, u32> = categories
            .iter()
            .enumerate()
            .map(|(i, c)| (c.clone(), i as u32))
            .collect();
        for rule in &options.rules {
            let index = *index_of.entry(rule.category.clone()).or_insert_with(|| {
                categories.push(rule.category.clone());
                (categories.len() - 1) as u32
            });
            user_rules.push((index, rule.pattern.clone(), rule.line));
        }
        Attributor {
            frames,
            keep: options.keep.clone(),
            skip: options.skip.clone(),
            user_rules,
            user_set: (!options.rules.is_empty()).then(|| options.rule_set.clone()),
            python_rules: BUILTIN.python.clone(),
            cpp_rules: BUILTIN.cpp.clone(),
            backward_python: BUILTIN.backward_python.clone(),
            backward_cpp: BUILTIN.backward_cpp.clone(),
            categories,
            cache: RefCell::new(vec![None; frames.stack_count()]),
            device: None,
        }
    }

    pub fn frames(&self) -> &FrameTable {
        self.frames
    }

    /// Decides categories by the lifetimes of one device's allocations from now on
    /// ([`crate::analysis::kinds::categories::DeviceCategories::build`]).
    pub fn bind(&mut self, device: impl DeviceDecisions + Send + 'f) {
        self.device = Some(Box::new(device));
    }

    /// Readies category decisions about a live set just after event `at`
    /// ([`DeviceDecisions::prepare_moment`]); None: the end.
    pub fn prepare_moment(&self, at: Option<usize>) {
        if let Some(d) = &self.device {
            d.prepare_moment(at);
        }
    }

    /// `filename:line:name` of a frame.
    fn frame_text(&self, id: crate::model::FrameId) -> String {
        let f = self.frames.frame(id);
        format!(
            "{}:{}:{}",
            self.frames.str(f.filename),
            f.line,
            self.frames.str(f.name)
        )
    }

    /// A frame as the rules read it: `filename:line:name` with `/` for every path
    /// separator (Windows paths match the same rules).
    fn rule_text(&self, id: crate::model::FrameId) -> String {
        let f = self.frames.frame(id);
        format!(
            "{}:{}:{}",
            self.frames.str(f.filename).replace('\\', "/"),
            f.line,
            self.frames.str(f.name)
        )
    }

    fn is_python_frame(&self, id: crate::model::FrameId) -> bool {
        let file = self.frames.str(self.frames.frame(id).filename);
        // FX-generated code (`<eval_with_key>`) is Python for the rules, though never a
        // call site.
        is_python(file) || file.starts_with("<eval_with_key>")
    }

    fn compute(&self, stack: StackId) -> StackFacts {
        let ids = self.frames.stack(stack);
        if ids.is_empty() {
            return StackFacts {
                site: Site::NoStack,
                category: None,
                mark: Mark::Empty,
                init_file: None,
                autocast_cast: false,
                cpp_frames: false,
            };
        }
        let texts: Vec<String> = ids.iter().map(|&id| self.rule_text(id)).collect();
        let (mark, init_file) = self.mark(ids, &texts);
        StackFacts {
            site: self.python_site(ids, &texts),
            category: self.stack_category(ids, &texts),
            mark,
            init_file,
            autocast_cast: texts.iter().any(|t| t.contains("autocast::cached_cast")),
            cpp_frames: ids.iter().any(|&id| !self.is_python_frame(id)),
        }
    }

    /// User rules match anywhere in the stack; then the innermost frame that a built-in
    /// rule matches decides (the most specific context: an all-gather inside an FSDP
    /// forward is communication), the table's order breaking ties within one frame. A
    /// rule that marks a part of the step (a module's `forward`, an optimizer's `step`)
    /// leaves the category to the allocation's lifetime.
    fn stack_category(
        &self,
        ids: &[crate::model::FrameId],
        texts: &[String],
    ) -> Option<(u32, StackRule)> {
        // The first rule, in the file's order, that matches any frame.
        let user = match self
            .user_set
            .as_ref()
            .and_then(|set| set.first_match(&self.user_rules, texts))
        {
            Some(first) => first,
            None => self
                .user_rules
                .iter()
                .position(|(_, re, _)| texts.iter().any(|t| re.is_match(t))),
        };
        if let Some(i) = user {
            let (category, _, line) = &self.user_rules[i];
            return Some((*category, StackRule::User(*line)));
        }
        ids.iter().zip(texts).find_map(|(&id, t)| {
            let rules = if self.is_python_frame(id) {
                &self.python_rules
            } else {
                &self.cpp_rules
            };
            rules
                .iter()
                .find(|(_, re)| re.is_match(t))
                .map(|(rule, _)| match rule {
                    Rule::Category(c) => Some((*c, StackRule::Frame(id))),
                    Rule::Mark(_) => None,
                })
        })?
    }

    /// The part of a step a stack ran in: backward if any frame is the autograd engine's
    /// (its frames are outermost in C++ stacks), then `zero_grad`, an optimizer's `step`,
    /// building a model, a `forward`, in that order, from any frame.
    fn mark(
        &self,
        ids: &[crate::model::FrameId],
        texts: &[String],
    ) -> (Mark, Option<crate::model::StrId>) {
        let python: Vec<bool> = ids.iter().map(|&id| self.is_python_frame(id)).collect();
        let any = |m: Mark| {
            texts.iter().zip(&python).any(|(t, &py)| {
                let rules = if py {
                    &self.python_rules
                } else {
                    &self.cpp_rules
                };
                rules
                    .iter()
                    .any(|(rule, re)| matches!(rule, Rule::Mark(x) if *x == m) && re.is_match(t))
            })
        };
        let backward = texts.iter().zip(&python).any(|(t, &py)| {
            if py {
                self.backward_python.is_match(t)
            } else {
                self.backward_cpp.is_match(t)
            }
        });
        if backward {
            return (Mark::Backward, None);
        }
        if any(Mark::ZeroGrad) {
            return (Mark::ZeroGrad, None);
        }
        if any(Mark::Optimizer) {
            return (Mark::Optimizer, None);
        }
        // The innermost `__init__` of the user's code (its file says whose it is), or
        // torch's own module building and moving.
        let user_init = ids.iter().find(|&&id| {
            let f = self.frames.frame(id);
            let file = self.frames.str(f.filename);
            is_python(file)
                && !is_torch(file)
                && !is_stdlib(file)
                && INIT_NAMES.contains(&self.frames.str(f.name))
        });
        if let Some(&id) = user_init {
            return (Mark::Init, Some(self.frames.frame(id).filename));
        }
        let parameters = builtin_category("parameters").expect("built-in category");
        let torch_init = texts.iter().zip(&python).any(|(t, &py)| {
            py && self.python_rules.iter().any(|(rule, re)| {
                matches!(rule, Rule::Category(c) if *c == parameters) && re.is_match(t)
            })
        });
        if torch_init {
            return (Mark::Init, None);
        }
        if any(Mark::Forward) {
            return (Mark::Forward, None);
        }
        (Mark::Plain, None)
    }

    fn python_site(&self, ids: &[crate::model::FrameId], texts: &[String]) -> Site {
        let kept = |t: &str| self.keep.as_ref().is_some_and(|re| re.is_match(t));
        let skipped = |t: &str| self.skip.as_ref().is_some_and(|re| re.is_match(t));
        let mut fallback = None;
        let mut dispatch = None;
        let mut any_python = false;
        for (&id, text) in ids.iter().zip(texts) {
            let f = self.frames.frame(id);
            let file = self.frames.str(f.filename);
            let name = self.frames.str(f.name);
            if kept(text) {
                return Site::Frame(id);
            }
            if !is_python(file) || skipped(text) {
                continue;
            }
            any_python = true;
            if is_stdlib(file) || matches!(name, "_call_impl" | "_wrapped_call_impl") {
                continue;
            }
            // Without a frame of the user's code, torch's own frame names the site, and
            // a pass-through library or generated code only when there is no other.
            if is_dispatch(file) {
                dispatch.get_or_insert(id);
                continue;
            }
            if is_torch(file) {
                fallback.get_or_insert(id);
                continue;
            }
            return Site::Frame(id);
        }
        if let Some(id) = fallback.or(dispatch) {
            return Site::Frame(id);
        }
        if any_python {
            // Only wrappers and the standard library: the innermost Python frame.
            if let Some(&id) = ids
                .iter()
                .find(|&&id| is_python(self.frames.str(self.frames.frame(id).filename)))
            {
                return Site::Frame(id);
            }
        }
        self.cpp_site(ids, texts)
    }

    /// Names a stack of C++ frames only.
    fn cpp_site(&self, ids: &[crate::model::FrameId], texts: &[String]) -> Site {
        if let Some((&id, _)) = ids
            .iter()
            .zip(texts)
            .find(|(_, t)| backward_node(t).is_some())
        {
            return Site::BackwardOf(id);
        }
        if texts
            .iter()
            .any(|t| t.contains("autograd::Engine") || t.contains("evaluate_function"))
        {
            return Site::Cpp(CppSite::AutogradBackward);
        }
        if texts.iter().any(|t| {
            let l = t.to_ascii_lowercase();
            l.contains("nccl") || l.contains("c10d")
        }) {
            return Site::Cpp(CppSite::Nccl);
        }
        // The first frame that is neither noise nor the allocator's own.
        const INTERNAL: [&str; 12] = [
            "CUDACachingAllocator",
            "c10::cuda::",
            "c10/cuda/",
            "unwind::",
            "CapturedTraceback",
            "gather_with_cpp",
            "at::detail::empty",
            "at::empty",
            "at::native::empty",
            "c10::Allocator",
            "_start",
            "__libc_start_main",
        ];
        let found = ids
            .iter()
            .zip(texts)
            .find(|(_, t)| !INTERNAL.iter().any(|n| t.contains(n)) && !t.contains("PyEval_"));
        match found {
            Some((&id, _)) => Site::Frame(id),
            None => Site::Cpp(CppSite::Allocator),
        }
    }

    /// What a stack tells (call site, stack category, mark), computed once per stack.
    pub fn facts(&self, stack: StackId) -> StackFacts {
        let i = stack.0 as usize;
        if let Some(Some(v)) = self.cache.borrow().get(i) {
            return *v;
        }
        let v = self.compute(stack);
        if let Some(slot) = self.cache.borrow_mut().get_mut(i) {
            *slot = Some(v);
        }
        v
    }

    /// The allocation stack of a lifetime: none for memory from before the trace (the
    /// stack recorded with an orphan free is the free's, not the allocation's), nor for a
    /// block alive at the end whose allocation was recorded without frames.
    pub fn allocation_stack(l: &Lifetime) -> Option<StackId> {
        match l.origin {
            Origin::BeforeTrace => None,
            _ => l.stack(),
        }
    }

    /// The allocation stack of a lifetime when it has frames.
    fn framed_stack(&self, l: &Lifetime) -> Option<StackId> {
        Self::allocation_stack(l).filter(|&s| !self.frames.stack(s).is_empty())
    }

    /// The call site of a lifetime.
    pub fn site(&self, l: &Lifetime) -> Site {
        match self.framed_stack(l) {
            Some(s) => self.facts(s).site,
            None if l.origin == Origin::Traced => Site::NoStack,
            None => Site::BeforeRecording,
        }
    }

    /// The category of a lifetime (an index into [`Attributor::categories`]).
    pub fn category(&self, l: &Lifetime) -> u32 {
        self.decide(l).category
    }

    /// The category of a lifetime with what decided it: by its lifetime on the bound
    /// device ([`crate::analysis::kinds::categories`]), else by its stack alone.
    pub fn decide(&self, l: &Lifetime) -> Decision {
        match &self.device {
            Some(d) => d.decide(self, l),
            None => decide_by_stack(self, l),
        }
    }

    /// The category a stack decides, if any, and the part of the step it marks.
    pub fn stack_facts(&self, l: &Lifetime) -> Option<StackFacts> {
        self.framed_stack(l).map(|s| self.facts(s))
    }

    /// The call site of a stack.
    pub fn stack_site(&self, stack: Option<StackId>) -> Site {
        stack.map_or(Site::NoStack, |s| self.facts(s).site)
    }

    /// The group of a lifetime.
    pub fn key(&self, l: &Lifetime, by: GroupBy) -> GroupKey {
        match by {
            GroupBy::Callsite => GroupKey::Site(self.site(l)),
            GroupBy::Category => GroupKey::Category(self.category(l)),
            GroupBy::Stack => match self.framed_stack(l) {
                Some(s) => GroupKey::Stack(s),
                _ => GroupKey::Site(self.site(l)),
            },
            GroupBy::File => {
                let site = self.site(l);
                match site {
                    Site::Frame(id) => GroupKey::File(self.frames.frame(id).filename),
                    other => GroupKey::Site(other),
                }
            }
        }
    }

    /// A stable name for a group, as JSON and folded stacks print it: a frame as
    /// `filename:line:name`, a file as its path, a category by its name, a stack by its
    /// innermost shown frame and id; keys without a frame as a parenthesised token.
    pub fn name(&self, key: &GroupKey) -> String {
        match key {
            GroupKey::Site(site) => self.site_name(site),
            GroupKey::Category(c) => self
                .categories
                .get(*c as usize)
                .cloned()
                .unwrap_or_else(|| "other".into()),
            GroupKey::Stack(s) => match self.facts(*s).site {
                Site::Frame(id) => format!("{} (stack {})", self.frame_text(id), s.0),
                other => format!("{} (stack {})", self.site_name(&other), s.0),
            },
            GroupKey::File(f) => self.frames.str(*f).to_string(),
        }
    }

    /// The name of a call site.
    pub fn site_name(&self, site: &Site) -> String {
        match site {
            Site::Frame(id) => self.frame_text(*id),
            Site::BackwardOf(id) => {
                let text = self.frame_text(*id);
                format!("(backward of {})", backward_node(&text).unwrap_or("a node"))
            }
            Site::Cpp(CppSite::AutogradBackward) => "(C++ autograd engine, backward)".into(),
            Site::Cpp(CppSite::Nccl) => "(C++ NCCL / c10d)".into(),
            Site::Cpp(CppSite::Allocator) => "(C++ allocator frames only)".into(),
            Site::BeforeRecording => "(before recording)".into(),
            Site::NoStack => "(no stack recorded)".into(),
        }
    }

    /// The kind of a group key.
    pub fn kind(key: &GroupKey) -> GroupKind {
        match key {
            GroupKey::Site(Site::Frame(_)) => GroupKind::Frame,
            GroupKey::File(_) => GroupKind::File,
            GroupKey::Site(Site::BackwardOf(_)) => GroupKind::BackwardNode,
            GroupKey::Site(Site::Cpp(_)) => GroupKind::Cpp,
            GroupKey::Site(Site::BeforeRecording) => GroupKind::BeforeRecording,
            GroupKey::Site(Site::NoStack) => GroupKind::NoStack,
            GroupKey::Category(_) => GroupKind::Category,
            GroupKey::Stack(_) => GroupKind::Stack,
        }
    }

    /// Frames of a stack for display: every frame, innermost first, `filename:line:name`.
    pub fn stack_frames(&self, stack: Option<StackId>) -> Vec<String> {
        stack.map_or_else(Vec::new, |s| {
            self.frames
                .stack(s)
                .iter()
                .map(|&id| self.frame_text(id))
                .collect()
        })
    }
}

/// The autograd node of a C++ frame such as
/// `torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)`:
/// `MmBackward0`.
fn backward_node(frame_text: &str) -> Option<&str> {
    let at = frame_text.find("::apply")?;
    let head = &frame_text[..at];
    let name = head.rsplit("::").next()?;
    let name = name.rsplit(':').next()?;
    let trimmed = name.trim_end_matches(|c: char| c.is_ascii_digit());
    (trimmed.ends_with("Backward") && trimmed.len() > "Backward".len()).then_some(name)
}

/// The category a stack alone gives (an attributor bound to no device).
pub fn decide_by_stack(attr: &Attributor, l: &Lifetime) -> Decision {
    let Some(facts) = attr.stack_facts(l) else {
        return Decision {
            category: UNKNOWN,
            evidence: Evidence::Nothing,
        };
    };
    if let Some((category, rule)) = facts.category {
        return Decision {
            category,
            evidence: Evidence::Stack(rule),
        };
    }
    let category = match facts.mark {
        Mark::Backward => BACKWARD_TEMPORARIES,
        Mark::Optimizer => OPTIMIZER_STATE,
        Mark::ZeroGrad => GRADIENTS,
        Mark::Forward => ACTIVATIONS,
        Mark::Init => PARAMETERS,
        Mark::Empty => UNKNOWN,
        Mark::Plain => OTHER,
    };
    let evidence = match facts.mark {
        Mark::Plain | Mark::Empty => Evidence::Nothing,
        m => Evidence::Mark(m),
    };
    Decision { category, evidence }
}

#[cfg(test)]
mod tests {
    use super::GroupKind;

    #[test]
    fn group_kind_json_is_its_name() {
        use GroupKind::*;
        for k in [
            Frame,
            File,
            BackwardNode,
            Cpp,
            BeforeRecording,
            NoStack,
            Category,
            Stack,
            Rest,
            Allocation,
        ] {
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.name()));
        }
    }

    #[test]
    fn many_user_rules_are_one_set_and_the_first_in_the_file_wins() {
        use super::{AttributionOptions, Attributor, StackRule, parse_rules};
        use crate::model::{Frame, FrameTable};
        let mut table = FrameTable::new();
        let stack = |t: &mut FrameTable, frames: &[(&str, i64, &str)]| {
            let ids: Vec<_> = frames
                .iter()
                .map(|&(file, line, name)| {
                    let frame = Frame {
                        filename: t.intern_str(file),
                        name: t.intern_str(name),
                        line,
                    };
                    t.intern_frame(frame)
                })
                .collect();
            t.intern_stack(&ids)
        };
        // Innermost frame first.
        let both = stack(
            &mut table,
            &[
                ("/home/u/inner.py", 7, "leaf"),
                ("/home/u/outer.py", 3, "root"),
            ],
        );
        let inner = stack(&mut table, &[("/home/u/inner.py", 7, "leaf")]);
        let neither = stack(&mut table, &[("/home/u/other.py", 1, "main")]);
        // 3,000 rules that match nothing, with, on lines 4 and 2,902 of the file (after
        // its comment line), a rule for the outer frame and one for the inner one.
        let mut text = String::from("# rules\n");
        for i in 0..3_000 {
            match i {
                2 => text.push_str("outer = outer\\.py:3:root\n"),
                2_900 => text.push_str("inner = inner\\.py:7:leaf\n"),
                _ => text.push_str(&format!("c{} = nomatch_{i}_zz\n", i % 50)),
            }
        }
        let options = AttributionOptions {
            rules: parse_rules(&text).unwrap(),
            ..Default::default()
        };
        let attr = Attributor::new(&table, &options);
        assert!(attr.user_set.is_some());
        let outer = attr.categories.iter().position(|c| c == "outer").unwrap() as u32;
        let inner_cat = attr.categories.iter().position(|c| c == "inner").unwrap() as u32;
        // The rule earlier in the file wins, though it matches an outer frame; rules are
        // named by their line in the file.
        assert_eq!(attr.facts(both).category, Some((outer, StackRule::User(4))));
        assert_eq!(
            attr.facts(inner).category,
            Some((inner_cat, StackRule::User(2_902)))
        );
        assert_eq!(attr.facts(neither).category, None);
        // The same as trying each rule in turn.
        let mut one_by_one = Attributor::new(&table, &options);
        one_by_one.user_set = None;
        for s in [both, inner, neither] {
            assert_eq!(one_by_one.facts(s).category, attr.facts(s).category);
        }
        // Attributors of the same options share the combined patterns, built once.
        let parts = &options.rule_set.0;
        assert!(parts.any.get().is_some_and(Option::is_some));
        assert!(
            parts
                .which
                .get()
                .is_some_and(|s| s.as_ref().unwrap().len() == 3_000)
        );
        let again = Attributor::new(&table, &options.clone());
        assert!(std::sync::Arc::ptr_eq(
            &again.user_set.unwrap().0,
            &options.rule_set.0
        ));
    }
}
