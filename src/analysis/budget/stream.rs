//! A series predicted by its allocation stream: the runs' allocations matched one to one,
//! each allocation's size fitted against the series' size, the target's stream built in
//! the recorded order and replayed through the allocator model.
//!
//! Takes each run's [`Prepared`] recording as a [`Stream`]; gives a [`StreamFit`] (how
//! each size was fitted, each measured size predicted from the others) or why the runs'
//! streams do not match ([`Mismatch`]); [`Stream::replay`] gives the peaks of
//! requested and reserved bytes at any size and capacity.
//!
//! What it cannot know: how the program left the allocator's cache before recording. The
//! blocks alive at the first event are allocated first, in the order of their tags, into
//! an empty allocator (an inference, which the answer says), for a predicted size and for
//! a measured one alike.

use super::{AllocLines, Line};
use crate::allocator::prepared::Prepared;
use crate::allocator::requests::{Request, Requests};
use crate::allocator::scenario::{self, OomCause, Scenario};
use crate::allocator::start::StartState;
use crate::allocator::{Profile, Settings};
use crate::analysis::kinds::phases::{Phase, Phases};
use serde::Serialize;
use std::collections::BTreeMap;

/// One command of a stream, its size apart: what runs of one workload share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Command {
    /// An allocation; `stream` and `pool` index the stream's lists (by first use).
    Alloc {
        tag: u32,
        stream: u16,
        pool: u16,
    },
    FreeRequested(u32),
    Free(u32),
    EmptyCache,
}

/// A run's allocations and frees in recorded order, with the blocks alive before
/// recording allocated first.
#[derive(Clone, Debug, PartialEq)]
pub struct Stream {
    commands: Vec<Command>,
    /// Each allocation's requested size, in the order of its `Alloc` command.
    sizes: Vec<u64>,
    /// Each allocation's budget line (its place in [`Line::ALL`]), in the same order.
    lines: Vec<u8>,
    /// Each allocation's call site (an index into `site_names`), in the same order.
    sites: Vec<u32>,
    site_names: Vec<String>,
    /// The phases of the trace.
    phases: Phases,
    /// Each command's trace entry; None for a block alive before recording.
    events: Vec<Option<u32>>,
    /// The recording's reserved bytes: at the start, then after each command that
    /// changed them (command index, bytes).
    recorded_reserved: Vec<(Option<u32>, u64)>,
    streams: Vec<u64>,
    pools: Vec<(i64, i64)>,
    tags: u32,
    settings: Settings,
    profile: Profile,
}

impl Stream {
    /// The stream of a prepared recording. A recorded OOM's request is left out: the
    /// program never got that memory.
    pub fn of(p: &Prepared, lines: &AllocLines) -> Stream {
        let mut s = Stream {
            commands: Vec::new(),
            sizes: Vec::new(),
            lines: Vec::new(),
            sites: Vec::new(),
            site_names: lines.site_names.clone(),
            phases: lines.phases.clone(),
            events: Vec::new(),
            recorded_reserved: Vec::new(),
            streams: Vec::new(),
            pools: Vec::new(),
            tags: p.requests.tags,
            settings: p.settings.clone(),
            profile: p.profile,
        };
        // A call site nothing decided is named empty: not known.
        let unknown = s.site_names.len() as u32;
        s.site_names.push(String::new());
        let mut live = p.start.live_requests();
        live.sort_unstable_by_key(|l| l.tag);
        for l in &live {
            let line = (
                lines.line(None, l.addr),
                lines.site(None, l.addr).unwrap_or(unknown),
            );
            s.alloc(l.tag, l.requested, l.stream, l.private, None, line);
        }
        for r in p.requests.iter() {
            match r {
                Request::Alloc {
                    tag,
                    size,
                    stream,
                    pool,
                    event,
                    ..
                } => s.alloc(
                    tag,
                    size,
                    stream,
                    pool,
                    Some(event),
                    (
                        lines.line(Some(event), 0),
                        lines.site(Some(event), 0).unwrap_or(unknown),
                    ),
                ),
                Request::FreeRequested { tag, event } => {
                    s.push(Command::FreeRequested(tag), Some(event))
                }
                Request::Free { tag, event } => s.push(Command::Free(tag), Some(event)),
                Request::EmptyCache { event, .. } => s.push(Command::EmptyCache, Some(event)),
                Request::Oom { .. } => {}
            }
        }
        s.recorded_reserved = s.recorded_reserved_of(p);
        s
    }

    /// The recording's reserved bytes over the stream: each segment event at the command
    /// of its trace entry (a dropped OOM request's at the command after it).
    fn recorded_reserved_of(&self, p: &Prepared) -> Vec<(Option<u32>, u64)> {
        let mut out: Vec<(Option<u32>, u64)> = Vec::new();
        for (event, reserved) in p.recorded_reserved() {
            let Some(event) = event else {
                out.push((None, reserved));
                continue;
            };
            let at = self
                .events
                .partition_point(|e| e.is_none_or(|e| e < event))
                .min(self.commands.len().saturating_sub(1));
            let point = (Some(at as u32), reserved);
            match out.last_mut() {
                Some(last) if last.0 == point.0 => *last = point,
                _ => out.push(point),
            }
        }
        out
    }

    /// How many commands come first for the blocks alive before recording.
    pub fn before(&self) -> usize {
        self.events.partition_point(Option::is_none)
    }

    /// What the recording's allocator held at its first event beyond what `fresh` (this
    /// stream replayed from an empty allocator) reserves once the blocks from before
    /// recording are allocated: a cache left by earlier work.
    pub fn cache_at_start(&self, fresh: &StreamReplay) -> u64 {
        let recorded = match self.recorded_reserved.first() {
            Some(&(None, bytes)) => bytes,
            _ => return 0,
        };
        let before = self.before() as u32;
        let replayed = fresh
            .reserved_series
            .iter()
            .take_while(|(at, _)| at.is_none_or(|a| a < before))
            .last()
            .map_or(0, |&(_, bytes)| bytes);
        recorded.saturating_sub(replayed)
    }

    /// How many commands (allocations, frees and cache flushes).
    pub fn commands(&self) -> usize {
        self.commands.len()
    }

    /// The recording's reserved bytes over the stream: at the start, then after each
    /// command that changed them (command index, bytes).
    pub fn recorded_reserved(&self) -> &[(Option<u32>, u64)] {
        &self.recorded_reserved
    }

    fn alloc(
        &mut self,
        tag: u32,
        size: u64,
        stream: u64,
        pool: (i64, i64),
        event: Option<u32>,
        (line, site): (u8, u32),
    ) {
        let stream = index_of(&mut self.streams, stream);
        let pool = index_of(&mut self.pools, pool);
        self.sizes.push(size);
        self.lines.push(line);
        self.sites.push(site);
        self.push(Command::Alloc { tag, stream, pool }, event);
    }

    fn push(&mut self, c: Command, event: Option<u32>) {
        self.commands.push(c);
        self.events.push(event);
    }

    /// What identifies each allocation across runs, its size apart: its call site, stream
    /// and pool. Not its budget line: a run's categories are decided from its own sizes
    /// and lifetimes, which may put one allocation in another line at another size.
    fn alloc_keys(&self) -> Vec<(&str, u16, u16)> {
        let mut k = 0;
        let mut out = Vec::with_capacity(self.sizes.len());
        for c in &self.commands {
            if let Command::Alloc { stream, pool, .. } = *c {
                let site = self
                    .site_names
                    .get(self.sites[k] as usize)
                    .map_or("", String::as_str);
                out.push((site, stream, pool));
                k += 1;
            }
        }
        out
    }

    /// How many allocations (blocks from before recording included).
    pub fn allocations(&self) -> usize {
        self.sizes.len()
    }

    /// The trace entry of command `i` (None: a block from before recording).
    pub fn event(&self, i: usize) -> Option<u32> {
        self.events.get(i).copied().flatten()
    }

    /// The phase command `i` ran in (None: a block from before recording).
    pub fn phase(&self, i: usize) -> Option<Phase> {
        self.event(i).map(|e| self.phases.phase_at(e as usize))
    }

    /// The most requested bytes alive with `sizes`, and the command after which it is
    /// first reached.
    fn requested_peak(&self, sizes: &[u64]) -> (u64, usize) {
        let mut live = vec![0u64; self.tags as usize];
        let (mut now, mut peak, mut at) = (0u64, 0u64, 0usize);
        let mut k = 0;
        for (i, c) in self.commands.iter().enumerate() {
            match *c {
                Command::Alloc { tag, .. } => {
                    now += sizes[k];
                    if let Some(slot) = live.get_mut(tag as usize) {
                        *slot = sizes[k];
                    }
                    k += 1;
                    if now > peak {
                        (peak, at) = (now, i);
                    }
                }
                Command::Free(tag) => {
                    if let Some(slot) = live.get_mut(tag as usize) {
                        now -= std::mem::take(slot);
                    }
                }
                Command::FreeRequested(_) | Command::EmptyCache => {}
            }
        }
        (peak, at)
    }

    /// The requested bytes alive just after command `at` with `sizes`, by line (indexed
    /// by [`Line::ALL`]'s order).
    pub fn live_by_line(&self, sizes: &[u64], at: usize) -> [u64; Line::ALL.len()] {
        let mut out = [0u64; Line::ALL.len()];
        for k in self.live_at(at) {
            let line = (self.lines[k] as usize).min(out.len() - 1);
            out[line] = out[line].saturating_add(sizes[k]);
        }
        out
    }

    /// The call sites holding the most requested bytes just after command `at` with
    /// `sizes`: at most `most` of them, the most bytes first (ties by name).
    pub fn live_by_site(&self, sizes: &[u64], at: usize, most: usize) -> Vec<SiteLive> {
        let mut by_site: BTreeMap<(u32, u8), (u64, u64)> = BTreeMap::new();
        for k in self.live_at(at) {
            let e = by_site.entry((self.sites[k], self.lines[k])).or_default();
            *e = (e.0.saturating_add(sizes[k]), e.1 + 1);
        }
        let mut out: Vec<SiteLive> = by_site
            .into_iter()
            .map(|((site, line), (bytes, allocations))| {
                self.site_live((site, line), bytes, allocations)
            })
            .collect();
        out.sort_by(|a, b| {
            b.bytes
                .cmp(&a.bytes)
                .then_with(|| a.callsite.cmp(&b.callsite))
                .then(a.line.cmp(&b.line))
        });
        out.truncate(most);
        out
    }

    /// How the live bytes of each call site (and line) change from this stream's own peak
    /// of requested bytes to the moment just after command `at` with `sizes`, the largest
    /// change first (ties by name).
    pub fn site_changes(&self, sizes: &[u64], at: usize, laws: &[Option<Law>]) -> Vec<SiteChange> {
        #[derive(Default)]
        struct Tally {
            now: u64,
            before: u64,
            allocations: u64,
            law: Option<Law>,
        }
        let (_, own_at) = self.requested_peak(&self.sizes);
        let mut by_site: BTreeMap<(u32, u8), Tally> = BTreeMap::new();
        for k in self.live_at(at) {
            let e = by_site.entry((self.sites[k], self.lines[k])).or_default();
            e.now = e.now.saturating_add(sizes[k]);
            e.allocations += 1;
            e.law = e.law.max(laws.get(k).copied().flatten());
        }
        for k in self.live_at(own_at) {
            let e = by_site.entry((self.sites[k], self.lines[k])).or_default();
            e.before = e.before.saturating_add(self.sizes[k]);
        }
        let mut out: Vec<SiteChange> = by_site
            .into_iter()
            .map(|(key, t)| SiteChange {
                live: self.site_live(key, t.now, t.allocations),
                change_bytes: (t.now as i128 - t.before as i128)
                    .clamp(i64::MIN as i128, i64::MAX as i128) as i64,
                law: t.law,
            })
            .filter(|c| c.change_bytes != 0)
            .collect();
        out.sort_by(|a, b| {
            b.change_bytes
                .unsigned_abs()
                .cmp(&a.change_bytes.unsigned_abs())
                .then_with(|| a.live.callsite.cmp(&b.live.callsite))
                .then(a.live.line.cmp(&b.live.line))
        });
        out
    }

    /// The requested bytes alive just after command `at` with `sizes` of the allocations
    /// (their places in `sizes`) that `keep` keeps.
    pub fn live_bytes_where(&self, sizes: &[u64], at: usize, keep: impl Fn(usize) -> bool) -> u64 {
        self.live_at(at)
            .filter(|&k| keep(k))
            .fold(0u64, |sum, k| sum.saturating_add(sizes[k]))
    }

    /// A call site (its index, its line's) holding `bytes` in `allocations`.
    fn site_live(&self, (site, line): (u32, u8), bytes: u64, allocations: u64) -> SiteLive {
        SiteLive {
            callsite: self
                .site_names
                .get(site as usize)
                .cloned()
                .unwrap_or_default(),
            line: Line::ALL[(line as usize).min(Line::ALL.len() - 1)],
            bytes,
            allocations,
        }
    }

    /// The allocations (their places in `sizes`) live just after command `at`.
    fn live_at(&self, at: usize) -> impl Iterator<Item = usize> {
        let mut live: Vec<Option<usize>> = vec![None; self.tags as usize];
        let mut k = 0;
        for c in self.commands.iter().take(at + 1) {
            match *c {
                Command::Alloc { tag, .. } => {
                    if let Some(slot) = live.get_mut(tag as usize) {
                        *slot = Some(k);
                    }
                    k += 1;
                }
                Command::Free(tag) => {
                    if let Some(slot) = live.get_mut(tag as usize) {
                        *slot = None;
                    }
                }
                Command::FreeRequested(_) | Command::EmptyCache => {}
            }
        }
        live.into_iter().flatten()
    }

    /// The stream with `sizes` as requests to the allocator: each command's index is its
    /// event.
    fn requests(&self, sizes: &[u64]) -> Requests {
        let mut k = 0;
        let commands = self.commands.iter().enumerate().map(|(i, c)| {
            let event = i as u32;
            match *c {
                Command::Alloc { tag, stream, pool } => {
                    let size = sizes[k];
                    k += 1;
                    Request::Alloc {
                        tag,
                        size,
                        stream: self.streams[stream as usize],
                        pool: self.pools[pool as usize],
                        event,
                        outputs: 0..0,
                    }
                }
                Command::FreeRequested(tag) => Request::FreeRequested { tag, event },
                Command::Free(tag) => Request::Free { tag, event },
                Command::EmptyCache => Request::EmptyCache {
                    event,
                    outputs: 0..0,
                },
            }
        });
        Requests::from_commands(commands.collect::<Vec<_>>(), self.tags)
    }

    /// Replays the stream with `sizes` through the allocator model at `capacity` (None:
    /// unlimited) with `settings`.
    pub fn replay(
        &self,
        sizes: &[u64],
        settings: &Settings,
        capacity: Option<u64>,
        total_memory: Option<u64>,
    ) -> StreamReplay {
        let (requested_peak_bytes, requested_peak_at) = self.requested_peak(sizes);
        let p = Prepared {
            device: 0,
            device_free: Vec::new(),
            total_memory,
            settings: self.settings.clone(),
            profile: self.profile,
            requests: self.requests(sizes),
            start: StartState::default(),
        };
        let sc = Scenario {
            settings: settings.clone(),
            capacity,
            total_memory,
        };
        // The start is empty: it always fits.
        let o = scenario::run(&p, &sc).expect("an empty start fits any capacity");
        StreamReplay {
            requested_peak_bytes,
            requested_peak_at,
            reserved_peak_bytes: o.peak_reserved_bytes,
            first_oom: o
                .first_oom
                .map(|f| (f.event as usize, f.cause, f.request_bytes)),
            reserved_series: o.series,
        }
    }

    /// Its own sizes.
    pub fn own_sizes(&self) -> &[u64] {
        &self.sizes
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }
}

/// The blocks alive before recording that no event of the trace frees, paired across the
/// runs of a series by what holds from run to run, never by address: each run's copy of
/// `streams` with those blocks reordered so that the same place pairs them.
///
/// Their addresses (and so the order the recording lists them in) change from process to
/// process. In each stream and pool, the sizes every run has are paired first, equal
/// with equal, smallest first (the weights, kept the same at every size); what is left
/// in each run (what grows with the size: inputs made before recording) is paired by
/// rank of size; where each rank grows with the series' size (`sizes`, one per stream) by
/// a law the sizes show exactly ([`grows_with`]), those are inputs, counted with the
/// activations whatever line the runs gave them. Blocks the trace frees keep their place: the order of their frees,
/// which the runs share, already pairs them. Where the runs hold different numbers of
/// such blocks in a stream and pool, no pairing is decided and the streams are left as
/// recorded (their matching then fails or matches them in part).
pub fn paired_before_recording<'a>(streams: &[Option<&'a Stream>], sizes: &[u64]) -> Paired<'a> {
    use std::borrow::Cow;
    let kept: Vec<Option<KeptByPool>> = streams
        .iter()
        .map(|s| s.map(Stream::kept_before_recording))
        .collect();
    let as_recorded = || Paired {
        streams: streams.iter().map(|s| s.map(Cow::Borrowed)).collect(),
        inputs: vec![BTreeMap::new(); streams.len()],
    };
    let Some(first) = kept.iter().flatten().next() else {
        return as_recorded();
    };
    let alike = kept.iter().flatten().all(|k| {
        k.len() == first.len()
            && k.iter()
                .zip(first)
                .all(|(a, b)| a.0 == b.0 && a.1.len() == b.1.len())
    });
    if !alike || kept.iter().any(Option::is_none) {
        return as_recorded();
    }
    let mut out = as_recorded();
    for group in first.keys() {
        let places: Vec<&Vec<usize>> = kept.iter().flatten().map(|k| &k[group]).collect();
        // How many blocks of each size every run holds.
        let mut common: BTreeMap<u64, usize> = BTreeMap::new();
        for (r, s) in streams.iter().flatten().enumerate() {
            let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
            for &k in places[r] {
                *counts.entry(s.sizes[k]).or_default() += 1;
            }
            if r == 0 {
                common = counts;
            } else {
                common.retain(|size, n| match counts.get(size) {
                    Some(&m) => {
                        *n = (*n).min(m);
                        true
                    }
                    None => false,
                });
            }
        }
        // Each run's order: the sizes every run has first, then the rest, each by size.
        let orders: Vec<(Vec<usize>, Vec<usize>)> = streams
            .iter()
            .flatten()
            .enumerate()
            .map(|(r, s)| {
                let key = |k: usize| {
                    (
                        s.sizes[k],
                        s.lines[k],
                        s.site_names.get(s.sites[k] as usize),
                    )
                };
                let mut sorted: Vec<usize> = places[r].clone();
                sorted.sort_by(|&a, &b| key(a).cmp(&key(b)).then(a.cmp(&b)));
                let mut left = common.clone();
                sorted
                    .into_iter()
                    .partition(|&k| match left.get_mut(&s.sizes[k]) {
                        Some(n) if *n > 0 => {
                            *n -= 1;
                            true
                        }
                        _ => false,
                    })
            })
            .collect();
        // What the rest holds grows with the size, rank by rank, by a law the sizes
        // measured show exactly: inputs of the run, never its weights. Otherwise (other
        // weights at each size: another model) they keep the lines the runs gave them.
        let inputs = (0..orders[0].1.len()).all(|i| {
            let ys: Vec<u64> = streams
                .iter()
                .flatten()
                .zip(&orders)
                .map(|(s, o)| s.sizes[o.1[i]])
                .collect();
            grows_with(sizes, &ys)
        });
        for (r, s) in streams.iter().flatten().enumerate() {
            let at = places[r];
            let (shared, rest) = &orders[r];
            let grown: Vec<usize> = rest
                .iter()
                .copied()
                .filter(|&k| {
                    inputs && Line::ALL[(s.lines[k] as usize).min(Line::ALL.len() - 1)].with_model()
                })
                .collect();
            for &k in &grown {
                let site = s
                    .site_names
                    .get(s.sites[k] as usize)
                    .cloned()
                    .unwrap_or_default();
                let line = Line::ALL[(s.lines[k] as usize).min(Line::ALL.len() - 1)];
                let from = out.inputs[r].entry((site, line)).or_default();
                *from = from.saturating_add(s.sizes[k]);
            }
            let order: Vec<usize> = shared.iter().chain(rest).copied().collect();
            if order == *at && grown.is_empty() {
                continue;
            }
            let copy = out.streams[r]
                .as_mut()
                .expect("every run has a stream")
                .to_mut();
            for &k in &grown {
                copy.lines[k] = Line::Activations as u8;
            }
            let (sizes, lines, sites) = (
                order.iter().map(|&k| copy.sizes[k]).collect::<Vec<_>>(),
                order.iter().map(|&k| copy.lines[k]).collect::<Vec<_>>(),
                order.iter().map(|&k| copy.sites[k]).collect::<Vec<_>>(),
            );
            for (i, &k) in at.iter().enumerate() {
                copy.sizes[k] = sizes[i];
                copy.lines[k] = lines[i];
                copy.sites[k] = sites[i];
            }
        }
    }
    out
}

/// Whether bytes `ys` measured at the series' sizes `xs` (ascending) grow with the size by
/// a law they show exactly, with fewer terms than sizes (so that one size at least checks
/// it): `c · s` or `c · s²` from two sizes, `a + b · s` or `a + c · s²` from three, any
/// polynomial of degree 2 from four. A size that stays the same does not grow.
pub fn grows_with(xs: &[u64], ys: &[u64]) -> bool {
    let n = xs.len();
    if n != ys.len() || n < 2 || ys.iter().all(|&y| y == ys[0]) {
        return false;
    }
    through_origin(xs, ys, itself)
        || through_origin(xs, ys, squared)
        || (n >= 3 && (on_one_line(xs, ys, itself) || on_one_line(xs, ys, squared)))
        || (n >= 4 && law_at(xs, ys, xs[0]).1 == Law::Quadratic)
}

fn itself(x: i128) -> i128 {
    x
}

fn squared(x: i128) -> i128 {
    x * x
}

/// Whether the points (f(x), y) of `xs` and `ys` lie on one line through the origin
/// (y · f(x0) = y0 · f(x) at every size), in exact integers.
fn through_origin(xs: &[u64], ys: &[u64], f: fn(i128) -> i128) -> bool {
    let (fx, y) = (
        |i: usize| f(i128::from(xs[i])),
        |i: usize| i128::from(ys[i]),
    );
    (0..xs.len()).all(|i| y(i) * fx(0) == y(0) * fx(i))
}

/// Whether the points (f(x), y) of `xs` and `ys` lie on one line, in exact integers.
fn on_one_line(xs: &[u64], ys: &[u64], f: fn(i128) -> i128) -> bool {
    let n = xs.len();
    let (fx, y) = (
        |i: usize| f(i128::from(xs[i])),
        |i: usize| i128::from(ys[i]),
    );
    (0..n).all(|i| (y(i) - y(0)) * (fx(n - 1) - fx(0)) == (y(n - 1) - y(0)) * (fx(i) - fx(0)))
}

/// The places of a stream's blocks from before recording that no command frees, by
/// stream and pool.
type KeptByPool = BTreeMap<(u16, u16), Vec<usize>>;

/// A series' streams with the blocks from before recording paired.
pub struct Paired<'a> {
    /// Each run's stream (reordered where the pairing moved blocks; None: no trace).
    pub streams: Vec<Option<std::borrow::Cow<'a, Stream>>>,
    /// For each run, the bytes of blocks from before recording whose size differs from
    /// run to run that its categories put in a line sized by the model, by call site and
    /// that line: inputs, which the streams count as activations.
    pub inputs: Vec<BTreeMap<(String, Line), u64>>,
}

impl Stream {
    /// The allocations (their places in `sizes`) of blocks alive before recording that
    /// no command frees, by stream and pool, in stream order.
    fn kept_before_recording(&self) -> KeptByPool {
        let freed: std::collections::BTreeSet<u32> = self
            .commands
            .iter()
            .filter_map(|c| match *c {
                Command::Free(t) | Command::FreeRequested(t) => Some(t),
                _ => None,
            })
            .collect();
        let mut out = KeptByPool::new();
        // The blocks from before recording come first, one allocation each.
        for (k, c) in self.commands[..self.before()].iter().enumerate() {
            if let Command::Alloc { tag, stream, pool } = *c
                && !freed.contains(&tag)
            {
                out.entry((stream, pool)).or_default().push(k);
            }
        }
        out
    }
}

/// The first command where two streams of equal length differ, sizes apart. Frees in one
/// burst (consecutive frees, as a container or cache cleared at once makes them) may come
/// in any order: their order follows addresses, which differ between runs.
fn first_difference(a: &Stream, b: &Stream) -> Option<usize> {
    first_command_difference(&a.commands, &b.commands)
}

/// [`first_difference`] of two command lists of equal length.
fn first_command_difference(a: &[Command], b: &[Command]) -> Option<usize> {
    let is_free = |c: &Command| matches!(c, Command::Free(_) | Command::FreeRequested(_));
    let mut i = 0;
    let n = a.len();
    while i < n {
        if !is_free(&a[i]) {
            if a[i] != b[i] {
                return Some(i);
            }
            i += 1;
            continue;
        }
        let end = (i..n).find(|&j| !is_free(&a[j])).unwrap_or(n);
        let mut x = a[i..end].to_vec();
        let mut y = b[i..end].to_vec();
        x.sort_unstable_by_key(free_key);
        y.sort_unstable_by_key(free_key);
        if x != y {
            return Some(i + (i..end).position(|j| a[j] != b[j]).unwrap_or(0));
        }
        i = end;
    }
    None
}

/// The commands of `s` that concern allocations kept by `keep` (by their place in the
/// largest run, `place` of each of `s`'s allocations), those allocations tagged by that
/// place: what two runs of one workload share once what only some make is left out.
fn projected(s: &Stream, place: &[u32], keep: &[bool]) -> Vec<Command> {
    let mut by_tag: Vec<u32> = vec![NONE; s.tags as usize];
    let mut k = 0;
    let mut out = Vec::with_capacity(s.commands.len());
    let kept = |j: u32| j != NONE && keep[j as usize];
    for c in &s.commands {
        match *c {
            Command::Alloc { tag, stream, pool } => {
                let j = place[k];
                k += 1;
                if let Some(slot) = by_tag.get_mut(tag as usize) {
                    *slot = j;
                }
                if kept(j) {
                    out.push(Command::Alloc {
                        tag: j,
                        stream,
                        pool,
                    });
                }
            }
            Command::Free(tag) | Command::FreeRequested(tag) => {
                let j = by_tag.get(tag as usize).copied().unwrap_or(NONE);
                if kept(j) {
                    out.push(match c {
                        Command::Free(_) => Command::Free(j),
                        _ => Command::FreeRequested(j),
                    });
                }
            }
            Command::EmptyCache => out.push(Command::EmptyCache),
        }
    }
    out
}

fn free_key(c: &Command) -> (u8, u32) {
    match *c {
        Command::FreeRequested(t) => (0, t),
        Command::Free(t) => (1, t),
        _ => (2, 0),
    }
}

fn index_of<T: PartialEq + Copy>(list: &mut Vec<T>, v: T) -> u16 {
    match list.iter().position(|x| *x == v) {
        Some(i) => i as u16,
        None if list.len() > u16::MAX as usize => u16::MAX,
        None => {
            list.push(v);
            (list.len() - 1) as u16
        }
    }
}

/// A call site's allocations live at a moment of a stream, in one line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SiteLive {
    /// Its name as `top` gives it (empty: not known).
    pub callsite: String,
    pub line: Line,
    pub bytes: u64,
    pub allocations: u64,
}

/// How a call site's live bytes change between two moments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteChange {
    /// What is live at the later moment.
    pub live: SiteLive,
    pub change_bytes: i64,
    /// The highest law among the allocations live then (None: only allocations without
    /// a law, made by some runs alone).
    pub law: Option<Law>,
}

/// A stream replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamReplay {
    pub requested_peak_bytes: u64,
    /// The command after which the requested peak is first reached.
    pub requested_peak_at: usize,
    pub reserved_peak_bytes: u64,
    /// The first request that runs out of memory: its command, cause and size.
    pub first_oom: Option<(usize, OomCause, u64)>,
    /// Reserved bytes at the start, then after each command that changed them, ending at
    /// the first OOM (command index, bytes).
    pub reserved_series: Vec<(Option<u32>, u64)>,
}

/// Why the runs' streams cannot be matched one to one.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Mismatch {
    /// A run has no trace to replay (index into the report's runs).
    NoTrace { run: usize },
    /// Two runs make different numbers of allocations and frees.
    Length {
        run: usize,
        commands: u64,
        other_run: usize,
        other_commands: u64,
    },
    /// The first command where two runs differ (another allocation or free, another
    /// stream), by each run's trace entry (null: a block from before recording).
    Order {
        run: usize,
        event: Option<u32>,
        other_run: usize,
        other_event: Option<u32>,
    },
}

/// How an allocation's size follows the series' size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Law {
    /// The same at every size.
    Constant,
    /// `a + b · size`, exactly at every size measured.
    Linear,
    /// `a + b · size + c · size²`, exactly at every size measured.
    Quadratic,
    /// No polynomial of degree 2 or less holds at every size measured: the one through
    /// the three largest sizes.
    Inexact,
}

/// The size at `t` of an allocation measuring `ys` at sizes `xs` (ascending, distinct),
/// and the law it follows: the lowest degree that holds at every size measured. With two
/// sizes, a size that is proportional to the square of the series' size (and not to the
/// size) is quadratic; any other that changes is linear.
pub fn law_at(xs: &[u64], ys: &[u64], t: u64) -> (u64, Law) {
    let n = xs.len();
    if n == 0 {
        return (0, Law::Constant);
    }
    if ys.iter().all(|&y| y == ys[0]) || n == 1 {
        return (ys[n - 1], Law::Constant);
    }
    let (x, y) = (|i: usize| i128::from(xs[i]), |i: usize| i128::from(ys[i]));
    let square = through_origin(xs, ys, squared);
    let proportional = through_origin(xs, ys, itself);
    let line = on_one_line(xs, ys, itself);
    if line && (n > 2 || proportional || !square) {
        return (through(&[0, n - 1], xs, ys, t), Law::Linear);
    }
    if square {
        // c · t² with c = y0 / x0², rounded once.
        let v = (y(0) * i128::from(t) * i128::from(t) + x(0) * x(0) / 2) / (x(0) * x(0));
        return (v.clamp(0, u64::MAX as i128) as u64, Law::Quadratic);
    }
    let three = [0, n / 2, n - 1];
    let exact = (0..n).all(|i| (polynomial(&three, xs, ys, xs[i]) - ys[i] as f64).abs() < 0.01);
    if exact {
        return (through(&three, xs, ys, t), Law::Quadratic);
    }
    (through(&[n - 3, n - 2, n - 1], xs, ys, t), Law::Inexact)
}

/// A batch size and a sequence length.
pub type Shape = (u64, u64);

/// The terms a size may have in a batch × sequence series: 1, B·S, B·S², B, S, S² (a
/// constant, what grows with the tokens, attention's scores, per-sample, per-position
/// and position-pair buffers), in the order a simpler law is preferred.
const TERMS: [fn(f64, f64) -> f64; 6] = [
    |_, _| 1.0,
    |b, s| b * s,
    |b, s| b * s * s,
    |b, _| b,
    |_, s| s,
    |_, s| s * s,
];

/// Whether term `i` of [`TERMS`] is quadratic in the sequence length.
fn quadratic_term(i: usize) -> bool {
    i == 2 || i == 5
}

/// The size at `t` of an allocation measuring `ys` at the shapes `xs` (distinct), and
/// its law: the fewest of the terms 1, B·S, B·S², B, S, S² (in that order) whose combination holds exactly at
/// every shape measured, with fewer terms than shapes (so that it is checked by at least
/// one more). Where none holds, the terms through as many shapes as measured: inexact.
pub fn law2_at(xs: &[Shape], ys: &[u64], t: Shape) -> (u64, Law) {
    let n = xs.len();
    if n == 0 {
        return (0, Law::Constant);
    }
    if ys.iter().all(|&y| y == ys[0]) {
        return (ys[0], Law::Constant);
    }
    let mut fallback = None;
    for k in 1..=n.min(TERMS.len()) {
        // Every law of `k` terms that holds: where two disagree at `t`, the shapes
        // measured cannot tell them apart (two sequence lengths fit any two terms in it).
        let mut found: Option<(u64, Law)> = None;
        for terms in subsets(TERMS.len(), k) {
            let Some(c) = solve(xs, ys, &terms) else {
                continue;
            };
            let at = |(b, s): Shape| -> f64 {
                terms
                    .iter()
                    .zip(&c)
                    .map(|(&i, c)| c * TERMS[i](b as f64, s as f64))
                    .sum()
            };
            let holds = xs
                .iter()
                .zip(ys)
                .all(|(&x, &y)| (at(x) - y as f64).abs() < 0.5);
            if !holds {
                continue;
            }
            let v = at(t).round().max(0.0) as u64;
            let law = if terms.iter().any(|&i| quadratic_term(i)) {
                Law::Quadratic
            } else if terms == [0] {
                Law::Constant
            } else {
                Law::Linear
            };
            if k == n {
                fallback.get_or_insert((v, Law::Inexact));
                continue;
            }
            match found {
                None => found = Some((v, law)),
                Some((w, _)) if w.abs_diff(v) > 0 => return (w, Law::Inexact),
                Some(_) => {}
            }
        }
        if let Some(f) = found {
            return f;
        }
    }
    fallback.unwrap_or((ys[n - 1], Law::Inexact))
}

/// The subsets of `0..n` with `k` members, each ascending, in lexicographic order.
fn subsets(n: usize, k: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut cur = Vec::with_capacity(k);
    fn go(start: usize, n: usize, k: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if cur.len() == k {
            out.push(cur.clone());
            return;
        }
        for i in start..n {
            cur.push(i);
            go(i + 1, n, k, cur, out);
            cur.pop();
        }
    }
    go(0, n, k, &mut cur, &mut out);
    out
}

/// The coefficients of `terms` fitted to (xs, ys) by elimination with the largest pivot
/// (each term scaled to 1 at its largest): None where the shapes cannot tell the terms
/// apart.
fn solve(xs: &[Shape], ys: &[u64], terms: &[usize]) -> Option<Vec<f64>> {
    let k = terms.len();
    let scale: Vec<f64> = terms
        .iter()
        .map(|&i| {
            xs.iter()
                .map(|&(b, s)| TERMS[i](b as f64, s as f64).abs())
                .fold(0.0, f64::max)
                .max(1e-300)
        })
        .collect();
    let y_scale = ys.iter().copied().max().unwrap_or(1).max(1) as f64;
    let mut rows: Vec<Vec<f64>> = xs
        .iter()
        .zip(ys)
        .map(|(&(b, s), &y)| {
            let mut r: Vec<f64> = terms
                .iter()
                .zip(&scale)
                .map(|(&i, sc)| TERMS[i](b as f64, s as f64) / sc)
                .collect();
            r.push(y as f64 / y_scale);
            r
        })
        .collect();
    for j in 0..k {
        let p = (j..rows.len()).max_by(|&a, &b| rows[a][j].abs().total_cmp(&rows[b][j].abs()))?;
        if rows[p][j].abs() < 1e-9 {
            return None;
        }
        rows.swap(j, p);
        let pivot = rows[j].clone();
        for (r, row) in rows.iter_mut().enumerate() {
            let f = row[j] / pivot[j];
            if r != j && f != 0.0 {
                for (x, p) in row[j..].iter_mut().zip(&pivot[j..]) {
                    *x -= f * p;
                }
            }
        }
    }
    Some(
        (0..k)
            .map(|j| rows[j][k] / rows[j][j] * y_scale / scale[j])
            .collect(),
    )
}

/// The polynomial through the points `at` of (xs, ys), evaluated at `t` (Lagrange, in
/// f64: exact laws of real sizes round back to their integer), never below 0.
fn through(at: &[usize], xs: &[u64], ys: &[u64], t: u64) -> u64 {
    polynomial(at, xs, ys, t).round().max(0.0) as u64
}

/// The polynomial through the points `at` of (xs, ys) at `t`, unrounded.
fn polynomial(at: &[usize], xs: &[u64], ys: &[u64], t: u64) -> f64 {
    let t = t as f64;
    let mut v = 0.0;
    for &i in at {
        let mut term = ys[i] as f64;
        for &j in at {
            if j != i {
                term *= (t - xs[j] as f64) / (xs[i] as f64 - xs[j] as f64);
            }
        }
        v += term;
    }
    v
}

/// How many allocations follow each law.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LawCounts {
    pub constant: u64,
    pub linear: u64,
    pub quadratic: u64,
    pub inexact: u64,
    /// Allocations without a counterpart in every run fitted: taken at their size in
    /// the run replayed.
    pub unmatched: u64,
}

impl LawCounts {
    /// The counts of each allocation's law (None: unmatched).
    pub fn of(laws: &[Option<Law>]) -> LawCounts {
        let mut c = LawCounts::default();
        for l in laws {
            match l {
                Some(Law::Constant) => c.constant += 1,
                Some(Law::Linear) => c.linear += 1,
                Some(Law::Quadratic) => c.quadratic += 1,
                Some(Law::Inexact) => c.inexact += 1,
                None => c.unmatched += 1,
            }
        }
        c
    }
}

/// The runs of a series matched allocation by allocation.
#[derive(Debug, Clone)]
pub struct StreamFit<'a> {
    /// The streams, by ascending size.
    streams: Vec<&'a Stream>,
    sizes: Vec<u64>,
    /// Each run's batch size and sequence length, where both vary (the sizes are then
    /// their tokens).
    shapes: Option<Vec<Shape>>,
    /// Where the runs' streams differ: their allocations matched in order (None: one to
    /// one, the same commands in the same order).
    partial: Option<Partial>,
}

/// The runs' allocations matched in order where their streams differ.
#[derive(Debug, Clone)]
struct Partial {
    /// For each run, each allocation of the largest run's counterpart in it ([`NONE`]:
    /// none).
    counterpart: Vec<Vec<u32>>,
    /// For each run, each of its allocations' counterpart in the largest run.
    in_largest: Vec<Vec<u32>>,
    unmatched: Unmatched,
}

const NONE: u32 = u32::MAX;

/// What matching the runs' allocations in order left without a counterpart.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Unmatched {
    /// Where the runs' streams first differ.
    pub parted: Mismatch,
    /// Allocations of the largest run that some other run does not make: the
    /// prediction takes them at their size in the largest run.
    pub largest_only: u64,
    /// Allocations of the other runs without a counterpart in the largest run: the
    /// prediction, which follows the largest run's order, leaves them out.
    pub others_only: u64,
}

/// The most of a run's allocations that may lack a counterpart for its stream to be
/// matched in part: past it, the runs are not one workload's.
pub const MAX_UNMATCHED_SHARE: f64 = 0.25;

/// The most allocations that two runs' streams may differ by (made by one and not the
/// other, counted on both sides) for them to be matched in part.
const MAX_EDITS: usize = 4096;

/// For each item of `b`, its counterpart in `a` ([`NONE`]: none): the longest common
/// subsequence of the two, found as the shortest edit script (Myers' greedy algorithm;
/// among equally short scripts, the one that matches earliest items first). None where
/// more than [`MAX_EDITS`] items must be left unmatched.
fn align<K: PartialEq>(a: &[K], b: &[K]) -> Option<Vec<u32>> {
    let mut out = vec![NONE; b.len()];
    // The common prefix is matched as it is. (Not the common suffix: where a run makes
    // one more of a repeated allocation, the extra one is the last of the repeat in
    // every step, which the suffix would match the other way round in the last step.)
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    for (j, o) in out.iter_mut().enumerate().take(prefix) {
        *o = j as u32;
    }
    let (a_mid, b_mid) = (&a[prefix..], &b[prefix..]);
    let (n, m) = (a_mid.len() as i64, b_mid.len() as i64);
    let max = (n + m).min(MAX_EDITS as i64);
    // v[k + offset]: the furthest x on diagonal k = x - y; one copy kept per edit count.
    let offset = max + 1;
    let mut v = vec![0i64; (2 * max + 3) as usize];
    // i32 halves what the edits kept take (streams of at most 2^31 allocations).
    let mut trace: Vec<Vec<i32>> = Vec::new();
    let mut end = None;
    'edits: for d in 0..=max {
        trace.push(
            v[(offset - d) as usize..=(offset + d) as usize]
                .iter()
                .map(|&x| x as i32)
                .collect(),
        );
        for k in (-d..=d).step_by(2) {
            let i = (k + offset) as usize;
            let mut x = if k == -d || (k != d && v[i - 1] < v[i + 1]) {
                v[i + 1]
            } else {
                v[i - 1] + 1
            };
            let mut y = x - k;
            while x < n && y < m && a_mid[x as usize] == b_mid[y as usize] {
                x += 1;
                y += 1;
            }
            v[i] = x;
            if x >= n && y >= m {
                end = Some(d);
                break 'edits;
            }
        }
    }
    let d_end = end?;
    // Back from the end: each edit's step, and the matched run before it.
    let (mut x, mut y) = (n, m);
    for d in (0..=d_end).rev() {
        let k = x - y;
        let before = &trace[d as usize];
        let at = |k: i64| i64::from(before[(k + d) as usize]);
        let (px, py) = if d == 0 {
            (0, 0)
        } else {
            let down = k == -d || (k != d && at(k - 1) < at(k + 1));
            let pk = if down { k + 1 } else { k - 1 };
            let px = at(pk);
            (px, px - pk)
        };
        // The matched run on this diagonal, from after the edit to (x, y).
        let (sx, sy) = if d == 0 {
            (0, 0)
        } else if px - py == k + 1 {
            (px, px - k)
        } else {
            (px + 1, px + 1 - k)
        };
        let run = (x - sx).min(y - sy);
        for t in 0..run {
            out[prefix + (y - 1 - t) as usize] = (prefix as i64 + x - 1 - t) as u32;
        }
        (x, y) = (px, py);
    }
    Some(out)
}

impl Partial {
    /// The runs' allocations (by ascending size) matched to the largest run's in order,
    /// where few enough lack a counterpart.
    fn of(streams: &[&Stream], parted: &Mismatch) -> Option<Partial> {
        let last = streams.len() - 1;
        let largest = streams[last].alloc_keys();
        let mut counterpart = Vec::with_capacity(streams.len());
        let mut in_largest = Vec::with_capacity(streams.len());
        let mut others_only = 0u64;
        for (k, s) in streams.iter().enumerate() {
            let keys = s.alloc_keys();
            let map = if k == last {
                (0..largest.len() as u32).collect()
            } else {
                align(&keys, &largest)?
            };
            let mut back = vec![NONE; keys.len()];
            for (j, &i) in map.iter().enumerate() {
                if i != NONE {
                    back[i as usize] = j as u32;
                }
            }
            let lacking = back.iter().filter(|&&j| j == NONE).count();
            if lacking as f64 > MAX_UNMATCHED_SHARE * keys.len() as f64 {
                return None;
            }
            others_only += lacking as u64;
            counterpart.push(map);
            in_largest.push(back);
        }
        let keep: Vec<bool> = (0..largest.len())
            .map(|j| counterpart.iter().all(|m| m[j] != NONE))
            .collect();
        let largest_only = keep.iter().filter(|&&k| !k).count();
        if largest_only as f64 > MAX_UNMATCHED_SHARE * largest.len() as f64 {
            return None;
        }
        // What every run makes is made and freed in the same order: the allocations
        // alone matching is not one workload (a run that keeps what another frees).
        let common = projected(streams[last], &in_largest[last], &keep);
        for (k, s) in streams.iter().enumerate().take(last) {
            let other = projected(s, &in_largest[k], &keep);
            if other.len() != common.len() || first_command_difference(&other, &common).is_some() {
                return None;
            }
        }
        Some(Partial {
            counterpart,
            in_largest,
            unmatched: Unmatched {
                parted: parted.clone(),
                largest_only: largest_only as u64,
                others_only,
            },
        })
    }
}

/// Where a stream is predicted: a size of a series that varies one thing, or a shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    Size(u64),
    Shape(Shape),
}

impl<'a> StreamFit<'a> {
    /// Matches the streams of a series (by ascending size; `runs` are their places in
    /// the report, for a mismatch): the same commands in the same order, sizes apart.
    pub fn new(
        streams: &[Option<&'a Stream>],
        sizes: &[u64],
        runs: &[usize],
    ) -> Result<StreamFit<'a>, Mismatch> {
        let mut got = Vec::new();
        for (s, &run) in streams.iter().zip(runs) {
            got.push(s.ok_or(Mismatch::NoTrace { run })?);
        }
        let (first, first_run) = (got[0], runs[0]);
        let mut parted = None;
        for (s, &run) in got.iter().zip(runs).skip(1) {
            if s.commands.len() != first.commands.len() {
                parted = Some(Mismatch::Length {
                    run: first_run,
                    commands: first.commands.len() as u64,
                    other_run: run,
                    other_commands: s.commands.len() as u64,
                });
                break;
            }
            // Streams and pools by first use: their ids differ from process to process.
            if let Some(i) = first_difference(first, s) {
                parted = Some(Mismatch::Order {
                    run: first_run,
                    event: first.event(i),
                    other_run: run,
                    other_event: s.event(i),
                });
                break;
            }
        }
        // Where the streams differ, their allocations matched in order, when few lack a
        // counterpart.
        let partial = match parted {
            None => None,
            Some(m) => Some(Partial::of(&got, &m).ok_or(m)?),
        };
        Ok(StreamFit {
            streams: got,
            sizes: sizes.to_vec(),
            shapes: None,
            partial,
        })
    }

    /// What matching the allocations in order left without a counterpart, where the
    /// streams differ (None: they match one to one).
    pub fn unmatched(&self) -> Option<&Unmatched> {
        self.partial.as_ref().map(|p| &p.unmatched)
    }

    /// Allocations of the largest run with a counterpart in every run.
    pub fn matched(&self) -> u64 {
        let n = self.largest().allocations() as u64;
        n - self.unmatched().map_or(0, |u| u.largest_only)
    }

    /// Whether allocation `j` of the largest run has a counterpart in every run.
    pub fn is_matched(&self, j: usize) -> bool {
        self.partial
            .as_ref()
            .is_none_or(|p| p.counterpart.iter().all(|m| m[j] != NONE))
    }

    /// The runs' shapes, where batch and sequence both vary (by the same order).
    pub fn with_shapes(mut self, shapes: Vec<Shape>) -> StreamFit<'a> {
        self.shapes = Some(shapes);
        self
    }

    /// Where run `k` was measured.
    pub fn point(&self, k: usize) -> At {
        match &self.shapes {
            Some(s) => At::Shape(s[k]),
            None => At::Size(self.sizes[k]),
        }
    }

    /// The largest size's stream: the order the prediction keeps.
    pub fn largest(&self) -> &'a Stream {
        self.streams[self.streams.len() - 1]
    }

    /// Each allocation's size at `t`, fitted on the runs `from` (indices by ascending
    /// size), and how many follow each law.
    pub fn sizes_at(&self, t: At, from: &[usize]) -> (Vec<u64>, LawCounts) {
        self.sizes_of(self.streams.len() - 1, t, from)
    }

    /// Each allocation of run `run`'s stream at `t`, fitted on the runs `from`: where it
    /// has a counterpart in each of them, by the law their sizes follow; else at its
    /// own size (counted as unmatched).
    pub fn sizes_of(&self, run: usize, t: At, from: &[usize]) -> (Vec<u64>, LawCounts) {
        let (sizes, laws) = self.fit_each(run, t, from);
        (sizes, LawCounts::of(&laws))
    }

    /// [`StreamFit::sizes_at`], with each allocation's law (None: no counterpart in
    /// every run, taken at its own size).
    pub fn sizes_and_laws(&self, t: At, from: &[usize]) -> (Vec<u64>, Vec<Option<Law>>) {
        self.fit_each(self.streams.len() - 1, t, from)
    }

    fn fit_each(&self, run: usize, t: At, from: &[usize]) -> (Vec<u64>, Vec<Option<Law>>) {
        let xs: Vec<u64> = from.iter().map(|&i| self.sizes[i]).collect();
        let shapes: Vec<Shape> = self
            .shapes
            .as_ref()
            .map(|s| from.iter().map(|&i| s[i]).collect())
            .unwrap_or_default();
        // A shape's laws are searched once for each set of measured sizes.
        let mut known: crate::model::frames::FxMap<Vec<u64>, (u64, Law)> = Default::default();
        let mut law = |ys: &[u64]| match t {
            At::Size(t) => law_at(&xs, ys, t),
            At::Shape(t) => *known
                .entry(ys.to_vec())
                .or_insert_with(|| law2_at(&shapes, ys, t)),
        };
        let own = &self.streams[run].sizes;
        // The place of allocation `a` of `run` in run `i` (None: no counterpart).
        let place = |a: usize, i: usize| -> Option<usize> {
            let Some(p) = &self.partial else {
                return Some(a);
            };
            let j = p.in_largest[run][a];
            (j != NONE)
                .then(|| p.counterpart[i][j as usize])
                .filter(|&x| x != NONE)
                .map(|x| x as usize)
        };
        let mut laws = Vec::with_capacity(own.len());
        let mut ys = vec![0u64; from.len()];
        let sizes = (0..own.len())
            .map(|a| {
                for (y, &i) in ys.iter_mut().zip(from) {
                    let Some(x) = place(a, i) else {
                        laws.push(None);
                        return own[a];
                    };
                    *y = self.streams[i].sizes[x];
                }
                let (v, l) = law(&ys);
                laws.push(Some(l));
                v
            })
            .collect();
        (sizes, laws)
    }

    /// Every run.
    pub fn all(&self) -> Vec<usize> {
        (0..self.sizes.len()).collect()
    }

    /// The sizes measured, ascending.
    /// The runs' streams, by ascending size.
    pub fn streams(&self) -> &[&'a Stream] {
        &self.streams
    }

    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }
}

/// A measured size replayed from a stream: its own (how much allocating the blocks from
/// before recording into an empty allocator changes) or predicted from the other sizes.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StreamCheck {
    pub size: u64,
    pub predicted_requested_bytes: u64,
    pub predicted_reserved_bytes: u64,
    /// The recording's peaks.
    pub recorded_requested_bytes: u64,
    pub recorded_reserved_bytes: u64,
    /// (predicted - recorded) / recorded, rounded to 4 decimals.
    /// (predicted - reference) / reference, rounded to 4 decimals: the reference is the
    /// recording's peak, or for reserved `fresh_process_reserved_bytes` where set.
    pub requested_error: f64,
    pub reserved_error: f64,
    /// What the recording's allocator held at its first event beyond what the blocks
    /// alive then take when allocated first into an empty allocator: a cache left by
    /// earlier work (a size's own check; 0 in a held-out one).
    pub cache_at_start_bytes: u64,
    /// Where the recording began with a cache left by earlier work (and its reserved
    /// peak is above a fresh process's): the size's own stream replayed from an empty
    /// allocator, the reserved peak of a fresh process, which a held-out check is
    /// judged against.
    pub fresh_process_reserved_bytes: Option<u64>,
}

fn relative_error(p: u64, r: u64) -> f64 {
    let e = (p as f64 - r as f64) / r.max(1) as f64;
    (e * 10_000.0).round() / 10_000.0
}

impl StreamCheck {
    fn new(size: u64, predicted: &StreamReplay, recorded: (u64, u64)) -> StreamCheck {
        StreamCheck {
            size,
            predicted_requested_bytes: predicted.requested_peak_bytes,
            predicted_reserved_bytes: predicted.reserved_peak_bytes,
            recorded_requested_bytes: recorded.0,
            recorded_reserved_bytes: recorded.1,
            requested_error: relative_error(predicted.requested_peak_bytes, recorded.0),
            reserved_error: relative_error(predicted.reserved_peak_bytes, recorded.1),
            cache_at_start_bytes: 0,
            fresh_process_reserved_bytes: None,
        }
    }

    /// Whether the recording of this size (its own check) began with a cache left by
    /// earlier work that raised its reserved peak above a fresh process's.
    pub fn began_with_cache(&self) -> bool {
        self.fresh_process_reserved_bytes.is_some()
    }

    /// A held-out check judged against a fresh process's reserved peak.
    fn against_fresh(mut self, fresh: Option<u64>) -> StreamCheck {
        if let Some(f) = fresh {
            self.fresh_process_reserved_bytes = Some(f);
            self.reserved_error = relative_error(self.predicted_reserved_bytes, f);
        }
        self
    }

    /// The larger of its two errors, unsigned.
    pub fn worst(&self) -> f64 {
        self.requested_error.abs().max(self.reserved_error.abs())
    }
}

impl StreamFit<'_> {
    /// Each measured size's own stream replayed with no limit, against `recorded`
    /// (each size's peak requested and reserved bytes, by ascending size).
    pub fn own(&self, recorded: &[(u64, u64)]) -> Vec<StreamCheck> {
        use rayon::prelude::*;
        (0..self.sizes.len())
            .into_par_iter()
            .map(|k| {
                let s = self.streams[k];
                let r = s.replay(&s.sizes, &s.settings, None, None);
                let mut c = StreamCheck::new(self.sizes[k], &r, recorded[k]);
                c.cache_at_start_bytes = s.cache_at_start(&r);
                if c.cache_at_start_bytes > 0 && r.reserved_peak_bytes < recorded[k].1 {
                    c.fresh_process_reserved_bytes = Some(r.reserved_peak_bytes);
                }
                c
            })
            .collect()
    }

    /// Each measured size predicted from the others (three sizes or more), replayed with
    /// no limit, against `recorded`, or where the size's own check (`own`) says its
    /// recording began with a cache left by earlier work, its reserved peak against a
    /// fresh process's.
    pub fn held_out(&self, recorded: &[(u64, u64)], own: &[StreamCheck]) -> Vec<StreamCheck> {
        use rayon::prelude::*;
        let n = self.sizes.len();
        if n < 3 {
            return Vec::new();
        }
        (0..n)
            .into_par_iter()
            .map(|k| {
                let from: Vec<usize> = (0..n).filter(|&i| i != k).collect();
                let (sizes, _) = self.sizes_of(k, self.point(k), &from);
                let s = self.streams[k];
                let r = s.replay(&sizes, &s.settings, None, None);
                StreamCheck::new(self.sizes[k], &r, recorded[k])
                    .against_fresh(own.get(k).and_then(|c| c.fresh_process_reserved_bytes))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sequences matched in order by hand: an item only one side has is skipped where
    /// the next items agree again, and a sequence with nothing in common is unmatched.
    #[test]
    fn allocations_matched_in_order_by_hand() {
        let n = NONE;
        // b has one more item (9) after the first two: a's items keep their places.
        let a = [1, 2, 3, 4, 5, 6, 7, 8, 10, 11];
        let b = [1, 2, 9, 3, 4, 5, 6, 7, 8, 10, 11];
        assert_eq!(
            align(&a, &b).unwrap(),
            vec![0, 1, n, 2, 3, 4, 5, 6, 7, 8, 9]
        );
        // a has one more (9): b's items skip it.
        assert_eq!(align(&b, &a).unwrap(), vec![0, 1, 3, 4, 5, 6, 7, 8, 9, 10]);
        // One item replaced by another: neither has a counterpart.
        let c = [1, 2, 12, 4, 5, 6, 7, 8, 10, 11];
        assert_eq!(align(&a, &c).unwrap(), vec![0, 1, n, 3, 4, 5, 6, 7, 8, 9]);
        // An extra item in the last few: both tails, of equal length, agree after it.
        assert_eq!(align(&[1, 2], &[0, 1, 2]).unwrap(), vec![n, 0, 1]);
        // Nothing in common: nothing matched; past the most edits, no answer.
        let x: Vec<u32> = (0..200).collect();
        let y: Vec<u32> = (1000..1200).collect();
        assert_eq!(align(&x, &y), Some(vec![n; 200]));
        let x: Vec<u32> = (0..MAX_EDITS as u32).collect();
        let y: Vec<u32> = (0..MAX_EDITS as u32).map(|v| v + 1_000_000).collect();
        assert_eq!(align(&x, &y), None);
        // An extra item inside a repeated key, and two more a little later: the earliest
        // items matched first, so the extra ones are the last of each repeat.
        let a = [1, 7, 7, 2, 3, 5, 5, 4, 1, 7, 7, 2, 3, 5, 5, 4];
        let b = [
            1, 7, 7, 7, 2, 3, 5, 5, 5, 5, 4, 1, 7, 7, 7, 2, 3, 5, 5, 5, 5, 4,
        ];
        assert_eq!(
            align(&a, &b).unwrap(),
            vec![
                0, 1, 2, n, 3, 4, 5, 6, n, n, 7, 8, 9, 10, n, 11, 12, 13, 14, n, n, 15
            ]
        );
    }

    /// Inputs made before recording grow with the size by a law the sizes show; other
    /// weights at each size (another model) do not.
    #[test]
    fn what_grows_with_the_size_by_hand() {
        // Q, K, V of 4 KiB a token; a mask of 64 bytes a token pair; 1 MiB + 1 KiB a token.
        assert!(grows_with(&[128, 256, 512], &[512 << 10, 1 << 20, 2 << 20]));
        assert!(grows_with(&[128, 256, 512], &[1 << 20, 4 << 20, 16 << 20]));
        assert!(grows_with(
            &[128, 256, 512],
            &[
                (1 << 20) + (128 << 10),
                (1 << 20) + (256 << 10),
                (1 << 20) + (512 << 10)
            ]
        ));
        // Four sizes: any quadratic (1 MiB + 1 KiB a token + 8 bytes a token pair).
        let q = |t: u64| (1 << 20) + t * 1024 + t * t * 8;
        assert!(grows_with(
            &[128, 256, 384, 512],
            &[q(128), q(256), q(384), q(512)]
        ));
        // Two sizes: in proportion to the size or to its square only.
        assert!(grows_with(&[128, 512], &[512 << 10, 2 << 20]));
        assert!(grows_with(&[128, 512], &[1 << 20, 16 << 20]));
        assert!(!grows_with(&[128, 512], &[3 << 20, 5 << 20]));
        // The same size everywhere; weights of three models at three sizes.
        assert!(!grows_with(&[128, 256, 512], &[4096, 4096, 4096]));
        assert!(!grows_with(&[128, 256, 512], &[3 << 20, 5 << 20, 6 << 20]));
    }

    #[test]
    fn laws_by_hand() {
        // 5 everywhere; 3 + 2·s; 7·s²; 1 + s + s².
        assert_eq!(law_at(&[1, 2, 4], &[5, 5, 5], 8), (5, Law::Constant));
        assert_eq!(law_at(&[1, 2, 4], &[5, 7, 11], 8), (19, Law::Linear));
        assert_eq!(law_at(&[1, 2, 4], &[7, 28, 112], 8), (448, Law::Quadratic));
        assert_eq!(law_at(&[1, 2, 4], &[3, 7, 21], 8), (73, Law::Quadratic));
        // Two sizes: proportional is linear, proportional to the square is quadratic,
        // anything else a line through both.
        assert_eq!(law_at(&[128, 256], &[512, 1024], 512), (2048, Law::Linear));
        assert_eq!(
            law_at(&[128, 256], &[512, 2048], 512),
            (8192, Law::Quadratic)
        );
        assert_eq!(law_at(&[128, 256], &[600, 1000], 512), (1800, Law::Linear));
        // Four sizes no quadratic holds at: the one through the three largest.
        // Through (2, 4), (3, 9), (4, 17): 1.5 s² - 2.5 s + 3 → at 5: 28.
        assert_eq!(law_at(&[1, 2, 3, 4], &[1, 4, 9, 17], 5), (28, Law::Inexact));
        // Never below zero.
        assert_eq!(law_at(&[2, 4], &[10, 4], 10), (0, Law::Linear));
    }

    #[test]
    fn batch_by_sequence_laws_by_hand() {
        // Three sequence lengths: with two, any two terms in the length fit.
        let xs = [(1, 128), (2, 128), (2, 256), (1, 512)];
        let t = (4, 512);
        let y = |f: fn(u64, u64) -> u64| xs.map(|(b, s)| f(b, s));
        // The weights; 16 KiB a token; 32 bytes a token pair; 1 MiB + 8 KiB a token.
        assert_eq!(law2_at(&xs, &y(|_, _| 4096), t), (4096, Law::Constant));
        assert_eq!(
            law2_at(&xs, &y(|b, s| b * s * 16384), t),
            (4 * 512 * 16384, Law::Linear)
        );
        assert_eq!(
            law2_at(&xs, &y(|b, s| b * s * s * 32), t),
            (4 * 512 * 512 * 32, Law::Quadratic)
        );
        assert_eq!(
            law2_at(&xs, &y(|b, s| (1 << 20) + b * s * 8192), t),
            ((1 << 20) + 4 * 512 * 8192, Law::Linear)
        );
        // A per-position buffer, and scores beside a per-sample one.
        assert_eq!(law2_at(&xs, &y(|_, s| s * 4), t), (2048, Law::Linear));
        assert_eq!(
            law2_at(&xs, &y(|b, s| b * s * s * 2 + b * 100), t),
            (4 * 512 * 512 * 2 + 400, Law::Quadratic)
        );
        // Two sequence lengths only: two terms in the length fit any size, and disagree.
        let two = [(1, 128), (2, 128), (2, 256), (4, 256)];
        let ys = two.map(|(b, s)| b * s * s * 2 + b * 100);
        assert_eq!(law2_at(&two, &ys, t).1, Law::Inexact);
        // Four shapes no pair or triple of terms holds at: through all four, inexact.
        assert_eq!(law2_at(&xs, &[1, 7, 3, 100], t).1, Law::Inexact);
    }
}
