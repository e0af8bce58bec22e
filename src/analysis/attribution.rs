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

use crate::model::{FrameTable, StackId};
use crate::timeline::{Lifetime, Origin};
use regex::Regex;
use serde::Serialize;
use std::cell::RefCell;

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
    Category(u8),
    Stack(StackId),
    /// A call site's file (a string id), or a site without a file.
    /// The file of a call site that is a frame (other sites group as [`GroupKey::Site`]).
    File(crate::model::StrId),
}

/// Built-in categories, in the order the names table holds them.
pub const BUILTIN_CATEGORIES: [&str; 11] = [
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "backward_temporaries",
    "communication",
    "workspaces",
    "compile",
    "inputs",
    "other",
    "unknown",
];
/// Index of "other" (a stack that no rule matched).
pub const OTHER: u8 = 9;
/// Index of "unknown" (no allocation stack: before recording, or recorded without stacks).
pub const UNKNOWN: u8 = 10;

/// The built-in rules over Python frames: (category, pattern over
/// `filename:line:name`), tried innermost frame first; the first match decides.
pub const PYTHON_RULES: [(&str, &str); 9] = [
    (
        "communication",
        r"(?i)_fsdp_collectives|all_gather|allgather|reduce_scatter|all_reduce|allreduce|broadcast_coalesced|fsdp.*:_?(unshard|pre_forward|pre_backward)[a-z_]*$|distributed/tensor/_redistribute|_functional_collectives|torch/distributed/distributed_c10d",
    ),
    ("workspaces", r"(?i)workspace"),
    (
        "compile",
        r"(?i)autotune|do_bench|benchmark_|compile_fx|codecache|_dynamo/convert_frame|triton/runtime",
    ),
    (
        "optimizer_state",
        r"torch/optim/|:zero_grad$|:_init_group$|_multi_tensor_|Optimizer\.step|optimizer\.step",
    ),
    ("gradients", r"accumulate_grad|AccumulateGrad"),
    (
        "backward_temporaries",
        r"torch/_tensor\.py:[0-9]+:backward$|torch/autograd/__init__\.py:[0-9]+:(backward|grad)$|:_engine_run_backward$|autograd::engine::evaluate_function",
    ),
    (
        "parameters",
        r"torch/nn/modules/[^:]*:[0-9]+:(__init__|reset_parameters)$|:_apply$|load_state_dict|_load_from_state_dict|:to_empty$|:materialize$|torch/nn/parameter",
    ),
    ("inputs", r"torch/utils/data/|DataLoader|pin_memory|collate"),
    (
        "activations",
        r":forward$|:_call_impl$|:_wrapped_call_impl$|nn\.Module: |torchinductor|<eval_with_key>|:[a-z_]*loss[a-z_]*$|cross_entropy",
    ),
];

/// The built-in rules over C++ frames: only signatures that say what the memory is for
/// (dispatcher and allocator frames say nothing and match none).
pub const CPP_RULES: [(&str, &str); 4] = [
    ("communication", r"(?i)nccl|c10d::|ProcessGroup"),
    ("workspaces", r"(?i)workspace"),
    ("gradients", r"AccumulateGrad"),
    (
        "backward_temporaries",
        r"autograd::Engine|evaluate_function|Backward[0-9]*::apply",
    ),
];

/// How call sites and categories are decided.
#[derive(Debug, Clone, Default)]
pub struct AttributionOptions {
    /// Frames matching this are never skipped for the call site.
    pub keep: Option<Regex>,
    /// Frames matching this are skipped for the call site, as torch's own are.
    pub skip: Option<Regex>,
    /// User rules (category name, pattern), tried before the built-in ones.
    pub rules: Vec<(String, Regex)>,
}

/// Reads a rules file: one `category = pattern` per line, `#` comments and blank lines
/// ignored. Errors name the line.
pub fn parse_rules(text: &str) -> Result<Vec<(String, Regex)>, String> {
    let mut rules = Vec::new();
    for (n, line) in text.lines().enumerate() {
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
        rules.push((name.to_string(), re));
    }
    Ok(rules)
}

/// Call sites, categories and stacks of allocations, cached per stack.
pub struct Attributor<'f> {
    frames: &'f FrameTable,
    keep: Option<Regex>,
    skip: Option<Regex>,
    /// (category index, pattern): user rules, then built-in ones
    rules: Vec<(u8, Regex)>,
    user_rules: usize,
    /// built-in rules over C++ frames
    cpp_rules: Vec<(u8, Regex)>,
    /// Category names: the built-in ones, then user-defined ones.
    pub categories: Vec<String>,
    /// per stack id: (site, category), once computed
    cache: RefCell<Vec<Option<(Site, u8)>>>,
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

fn is_python(filename: &str) -> bool {
    (filename.ends_with(".py") || filename.starts_with('<'))
        && !filename.starts_with("<eval_with_key>")
}

impl<'f> Attributor<'f> {
    pub fn new(frames: &'f FrameTable, options: &AttributionOptions) -> Self {
        let mut categories: Vec<String> =
            BUILTIN_CATEGORIES.iter().map(|s| s.to_string()).collect();
        let mut rules = Vec::new();
        for (name, re) in &options.rules {
            let index = match categories.iter().position(|c| c == name) {
                Some(i) => i,
                None => {
                    categories.push(name.clone());
                    categories.len() - 1
                }
            };
            rules.push((index.min(u8::MAX as usize) as u8, re.clone()));
        }
        let user_rules = rules.len();
        let mut cpp_rules = Vec::new();
        for (table, out) in [
            (&PYTHON_RULES[..], &mut rules),
            (&CPP_RULES[..], &mut cpp_rules),
        ] {
            for (name, pattern) in table {
                let index = BUILTIN_CATEGORIES.iter().position(|c| c == name).unwrap();
                out.push((index as u8, Regex::new(pattern).expect("built-in rule")));
            }
        }
        Attributor {
            frames,
            keep: options.keep.clone(),
            skip: options.skip.clone(),
            rules,
            user_rules,
            cpp_rules,
            categories,
            cache: RefCell::new(vec![None; frames.stack_count()]),
        }
    }

    pub fn frames(&self) -> &FrameTable {
        self.frames
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

    fn compute(&self, stack: StackId) -> (Site, u8) {
        let ids = self.frames.stack(stack);
        if ids.is_empty() {
            return (Site::NoStack, UNKNOWN);
        }
        let texts: Vec<String> = ids.iter().map(|&id| self.frame_text(id)).collect();
        (self.python_site(ids, &texts), self.categorize(ids, &texts))
    }

    /// User rules match anywhere in the stack; then the innermost frame that a built-in
    /// rule matches decides (the most specific context: an all-gather inside an FSDP
    /// forward is communication, an activation inside an FSDP-wrapped module is an
    /// activation), the table's order breaking ties within one frame.
    fn categorize(&self, ids: &[crate::model::FrameId], texts: &[String]) -> u8 {
        let (user, python) = self.rules.split_at(self.user_rules);
        if let Some((c, _)) = user
            .iter()
            .find(|(_, re)| texts.iter().any(|t| re.is_match(t)))
        {
            return *c;
        }
        ids.iter()
            .zip(texts)
            .find_map(|(&id, t)| {
                let file = self.frames.str(self.frames.frame(id).filename);
                // FX-generated code (`<eval_with_key>`) is Python for the rules, though
                // never a call site.
                let rules = if is_python(file) || file.starts_with("<eval_with_key>") {
                    python
                } else {
                    &self.cpp_rules[..]
                };
                rules.iter().find(|(_, re)| re.is_match(t))
            })
            .map_or(OTHER, |(c, _)| *c)
    }

    fn python_site(&self, ids: &[crate::model::FrameId], texts: &[String]) -> Site {
        let kept = |t: &str| self.keep.as_ref().is_some_and(|re| re.is_match(t));
        let skipped = |t: &str| self.skip.as_ref().is_some_and(|re| re.is_match(t));
        let mut fallback = None;
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
            if is_torch(file) {
                fallback.get_or_insert(id);
                continue;
            }
            return Site::Frame(id);
        }
        if let Some(id) = fallback {
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

    fn cached(&self, stack: StackId) -> (Site, u8) {
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
    /// stack recorded with an orphan free is the free's, not the allocation's).
    pub fn allocation_stack(l: &Lifetime) -> Option<StackId> {
        match l.origin {
            Origin::BeforeTrace => None,
            _ => l.stack(),
        }
    }

    /// The call site of a lifetime.
    pub fn site(&self, l: &Lifetime) -> Site {
        match Self::allocation_stack(l) {
            Some(s) => self.cached(s).0,
            None if l.origin == Origin::Traced => Site::NoStack,
            None => Site::BeforeRecording,
        }
    }

    /// The category of a lifetime (an index into [`Attributor::categories`]).
    pub fn category(&self, l: &Lifetime) -> u8 {
        match Self::allocation_stack(l) {
            Some(s) => self.cached(s).1,
            None => UNKNOWN,
        }
    }

    /// The call site of a stack.
    pub fn stack_site(&self, stack: Option<StackId>) -> Site {
        stack.map_or(Site::NoStack, |s| self.cached(s).0)
    }

    /// The group of a lifetime.
    pub fn key(&self, l: &Lifetime, by: GroupBy) -> GroupKey {
        match by {
            GroupBy::Callsite => GroupKey::Site(self.site(l)),
            GroupBy::Category => GroupKey::Category(self.category(l)),
            GroupBy::Stack => match Self::allocation_stack(l) {
                Some(s) if !self.frames.stack(s).is_empty() => GroupKey::Stack(s),
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
            GroupKey::Stack(s) => match self.cached(*s).0 {
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
            Site::Cpp(CppSite::AutogradBackward) => "(C++ autograd engine, backward)".into(),
            Site::Cpp(CppSite::Nccl) => "(C++ NCCL / c10d)".into(),
            Site::Cpp(CppSite::Allocator) => "(C++ allocator frames only)".into(),
            Site::BeforeRecording => "(before recording)".into(),
            Site::NoStack => "(no stack recorded)".into(),
        }
    }

    /// The kind of a group key, for JSON.
    pub fn kind(key: &GroupKey) -> &'static str {
        match key {
            GroupKey::Site(Site::Frame(_)) => "frame",
            GroupKey::File(_) => "file",
            GroupKey::Site(Site::Cpp(_)) => "cpp",
            GroupKey::Site(Site::BeforeRecording) => "before_recording",
            GroupKey::Site(Site::NoStack) => "no_stack",
            GroupKey::Category(_) => "category",
            GroupKey::Stack(_) => "stack",
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
