//! Live bytes at a moment as a tree of stacks (root first), for flame graphs and the
//! folded-stack format other tools read (`frame;frame;frame BYTES`).
//!
//! By default a stack is the frames a reader recognises: its Python frames, and under
//! the innermost of them one `(N C++ frames)` element for the C++ frames it called that
//! led to the allocation. A stack without a Python frame is the name `top` gives it
//! (`(backward of MmBackward0)`, `(C++ NCCL / c10d)`, its first telling C++ frame) with
//! the `(N C++ frames)` element under it. A C++-only stack recorded 60 frames deep
//! (the autograd engine's thread, the dispatcher, the allocator) would otherwise make
//! the graph 60 rows tall for a sliver of the bytes. [`FlameOptions::all_frames`]
//! keeps every displayed frame instead.

use crate::analysis::kinds::attribution::{Attributor, Site};
use crate::analysis::kinds::frames::{display_frames, is_python_frame};
use crate::analysis::reports::top::LiveState;
use serde::Serialize;
use std::collections::BTreeMap;

/// One node: a frame under its parent, with the bytes of every allocation whose stack
/// passes through it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FlameNode {
    pub name: String,
    /// Requested bytes at and below this node.
    pub bytes: u64,
    pub count: usize,
    /// Bytes allocated by this frame itself (the stack ends here).
    pub self_bytes: u64,
    /// The category of most of the bytes at and below it ([`crate::analysis::kinds::categories`]), and
    /// that category's share of them.
    pub category: String,
    pub category_share: f64,
    pub children: Vec<FlameNode>,
}

/// Which frames of a stack become boxes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlameOptions {
    /// Every frame the stack shows, Python and C++ alike, as recorded (less the
    /// allocator's and interpreter's plumbing that the official viewer hides too,
    /// [`display_frames`]). Default false: Python frames, the C++ frames under the
    /// innermost one as one `(N C++ frames)` element, and a C++-only stack as its call
    /// site's name over one such element.
    pub all_frames: bool,
}

/// The element that stands for `n` C++ frames (a name no recorded frame has: frames are
/// `filename:line:name`).
pub fn cpp_frames_name(n: usize) -> String {
    format!("({n} C++ frame{})", if n == 1 { "" } else { "s" })
}

/// The frames of an allocation, root first (see the module's head for which);
/// allocations from before the trace, or without frames, are one element naming that.
fn path(attr: &Attributor, l: &crate::timeline::Lifetime, options: &FlameOptions) -> Vec<String> {
    let stack = Attributor::allocation_stack(l);
    // Innermost first.
    let shown = display_frames(attr.frames(), stack, usize::MAX);
    let mut frames: Vec<String> = if shown.is_empty() {
        let site = attr.site(l);
        vec![attr.site_name(match &site {
            Site::Frame(_) => &Site::NoStack,
            other => other,
        })]
    } else if options.all_frames {
        shown
    } else {
        match shown.iter().position(|f| is_python_frame(f)) {
            Some(innermost) => {
                // The C++ frames between Python frames are the interpreter's and the
                // bindings' glue (a few per call, differing between calls of the same
                // line): left out, as nn.Module's call and hook wrappers are, which sit
                // between every pair of modules and say nothing.
                let python = shown[innermost..]
                    .iter()
                    .filter(|f| is_python_frame(f) && !f.contains("torch/nn/modules/module.py:"))
                    .cloned();
                (innermost > 0)
                    .then(|| cpp_frames_name(innermost))
                    .into_iter()
                    .chain(python)
                    .collect()
            }
            None => vec![cpp_frames_name(shown.len()), attr.site_name(&attr.site(l))],
        }
    };
    frames.reverse();
    // One line per stack, ';' between frames: each frame a field of the folded format.
    frames
        .iter()
        .map(|f| crate::units::folded_field(f))
        .collect()
}

#[derive(Default)]
struct Building {
    bytes: u64,
    count: usize,
    self_bytes: u64,
    /// Bytes by category index.
    categories: BTreeMap<u32, u64>,
    children: BTreeMap<String, Building>,
}

impl Building {
    fn finish(self, name: String, names: &[String]) -> FlameNode {
        let mut children: Vec<FlameNode> = self
            .children
            .into_iter()
            .map(|(n, b)| b.finish(n, names))
            .collect();
        let main = self
            .categories
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)));
        children.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
        FlameNode {
            name,
            bytes: self.bytes,
            count: self.count,
            self_bytes: self.self_bytes,
            category: main
                .and_then(|(&c, _)| names.get(c as usize).cloned())
                .unwrap_or_default(),
            category_share: main.map_or(0.0, |(_, &b)| crate::analysis::share(b, self.bytes)),
            children,
        }
    }
}

/// The tree of the live set (the root is "all", its bytes the moment's total) and the
/// folded lines, sorted.
pub fn flame(
    attr: &Attributor,
    live: &LiveState,
    options: &FlameOptions,
) -> (FlameNode, Vec<(String, u64)>) {
    attr.prepare_moment(live.at);
    // Allocations with the same stack, origin and category share a path and its
    // category: work out each once.
    let mut index: std::collections::HashMap<_, usize> = std::collections::HashMap::new();
    let mut distinct: Vec<(&crate::timeline::Lifetime, u64, usize, u32)> = Vec::new();
    for l in &live.lifetimes {
        let category = attr.category(l);
        let key = (
            Attributor::allocation_stack(l),
            std::mem::discriminant(&l.origin),
            category,
        );
        let i = *index.entry(key).or_insert_with(|| {
            distinct.push((l, 0, 0, category));
            distinct.len() - 1
        });
        distinct[i].1 += l.size;
        distinct[i].2 += 1;
    }
    let mut root = Building::default();
    let mut folded: BTreeMap<String, u64> = BTreeMap::new();
    for (l, bytes, count, category) in distinct {
        let frames = path(attr, l, options);
        root.bytes += bytes;
        root.count += count;
        *root.categories.entry(category).or_default() += bytes;
        let mut node = &mut root;
        for f in &frames {
            node = node.children.entry(f.clone()).or_default();
            node.bytes += bytes;
            node.count += count;
            *node.categories.entry(category).or_default() += bytes;
        }
        node.self_bytes += bytes;
        *folded.entry(frames.join(";")).or_insert(0) += bytes;
    }
    (
        root.finish("all".into(), &attr.categories),
        folded.into_iter().filter(|(_, b)| *b > 0).collect(),
    )
}
