//! Live bytes at a moment as a tree of stacks (root first), for flame graphs and the
//! folded-stack format other tools read (`frame;frame;frame BYTES`).

use super::attribution::{Attributor, Site};
use super::frames::user_frames;
use super::top::LiveState;
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
    /// The category of most of the bytes at and below it ([`super::categories`]), and
    /// that category's share of them.
    pub category: String,
    pub category_share: f64,
    pub children: Vec<FlameNode>,
}

/// The frames of an allocation, root first: the Python frames when the stack has any
/// (without nn.Module's call and hook wrappers in torch/nn/modules/module.py), else the shown C++ frames; allocations from before
/// the trace are one frame.
fn path(attr: &Attributor, l: &crate::timeline::Lifetime) -> Vec<String> {
    let stack = Attributor::allocation_stack(l);
    let mut frames = user_frames(attr.frames(), stack, usize::MAX);
    // nn.Module's call wrappers sit between every pair of modules and say nothing.
    frames.retain(|f| !f.contains("torch/nn/modules/module.py:"));
    if frames.is_empty() {
        let site = attr.site(l);
        frames.push(attr.site_name(match &site {
            Site::Frame(_) => &Site::NoStack,
            other => other,
        }));
    }
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
    categories: BTreeMap<u8, u64>,
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
            category_share: main.map_or(0.0, |(_, &b)| super::share(b, self.bytes)),
            children,
        }
    }
}

/// The tree of the live set (the root is "all", its bytes the moment's total) and the
/// folded lines, sorted.
pub fn flame(attr: &Attributor, live: &LiveState) -> (FlameNode, Vec<(String, u64)>) {
    attr.prepare_moment(live.at);
    // Allocations with the same stack, origin and category share a path and its
    // category: work out each once.
    let mut index: std::collections::HashMap<_, usize> = std::collections::HashMap::new();
    let mut distinct: Vec<(&crate::timeline::Lifetime, u64, usize, u8)> = Vec::new();
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
        let frames = path(attr, l);
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
