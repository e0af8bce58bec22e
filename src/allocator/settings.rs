//! The allocator's settings (`PYTORCH_CUDA_ALLOC_CONF`) and the PyTorch releases whose
//! behaviour differs (spec sections 1.1, 1.3 and 4.3).
//!
//! Takes the text of `PYTORCH_CUDA_ALLOC_CONF`, read as PyTorch's `CUDAAllocatorConfig`
//! reads it (the same tokens, the same refusals), or a snapshot's `allocator_settings`;
//! gives [`Settings`]. The release is not in the file: [`Profile::guess`] takes it from the
//! fields present, and a user can name it.

use crate::model::{Features, Snapshot};
use std::fmt;

const MIB: u64 = 1 << 20;
/// `kLargeBuffer`: the default segment size of 1-10 MiB requests and of the large
/// pool's expandable pages, the default `max_non_split_rounding` and the smallest
/// `max_split_size_mb`.
pub const LARGE_BUFFER: u64 = 20 * MIB;
/// Buckets of `roundup_power2_divisions`: [1 MiB, 2 MiB), ..., [32 GiB, 64 GiB) and up.
pub const DIVISION_BUCKETS: usize = 16;

/// The settings one run of the allocator uses.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// `max_split_size_mb` in bytes; `u64::MAX` when unlimited (the default).
    pub max_split_size: u64,
    /// `max_non_split_rounding_mb` in bytes (default 20 MiB).
    pub max_non_split_rounding: u64,
    /// `roundup_power2_divisions` per bucket (0: plain 512-byte rounding).
    pub divisions: [u64; DIVISION_BUCKETS],
    /// `garbage_collection_threshold` (0: off); acts only with a memory fraction.
    pub gc_threshold: f64,
    /// `per_process_memory_fraction` (`torch.cuda.set_per_process_memory_fraction`).
    pub memory_fraction: Option<f64>,
    pub expandable_segments: bool,
    /// `large_segment_size_mb` in bytes (2.11 and later; 20 MiB before).
    pub large_segment_size: u64,
    /// `backend:cudaMallocAsync`: another allocator, which this model is not.
    pub backend_async: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            max_split_size: u64::MAX,
            max_non_split_rounding: LARGE_BUFFER,
            divisions: [0; DIVISION_BUCKETS],
            gc_threshold: 0.0,
            memory_fraction: None,
            expandable_segments: false,
            large_segment_size: LARGE_BUFFER,
            backend_async: false,
        }
    }
}

/// A `PYTORCH_CUDA_ALLOC_CONF` PyTorch would refuse: the words are PyTorch's where it has
/// them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfError(pub String);

fn err<T>(s: impl Into<String>) -> Result<T, ConfError> {
    Err(ConfError(s.into()))
}

/// The tokens of `lexArgs`: runs of characters between `,` `:` `[` `]`, each separator a
/// token of its own; spaces dropped.
fn lex(conf: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = String::new();
    for ch in conf.chars() {
        if matches!(ch, ',' | ':' | '[' | ']') {
            if !buf.is_empty() {
                out.push(std::mem::take(&mut buf));
            }
            out.push(ch.to_string());
        } else if ch != ' ' {
            buf.push(ch);
        }
    }
    if !buf.is_empty() {
        out.push(buf);
    }
    out
}

struct Tokens {
    t: Vec<String>,
    i: usize,
}

impl Tokens {
    fn expect(&mut self, sep: &str) -> Result<(), ConfError> {
        self.i += 1;
        if self.t.get(self.i).map(String::as_str) != Some(sep) {
            return err(format!(
                "Error parsing CachingAllocator settings, expected {sep}"
            ));
        }
        Ok(())
    }

    fn value(&mut self, what: &str) -> Result<String, ConfError> {
        self.i += 1;
        match self.t.get(self.i) {
            Some(v) if !matches!(v.as_str(), "," | ":" | "[" | "]") => Ok(v.clone()),
            _ => err(format!("Error, expecting {what} value")),
        }
    }
}

/// A whole number as C's `stoul` reads the start of a token, refusing trailing text
/// (PyTorch would take `128abc` as 128; a typo is worth a refusal here).
fn whole(v: &str, key: &str) -> Result<u64, ConfError> {
    v.parse::<u64>()
        .map_err(|_| ConfError(format!("{key}: expected a whole number, found {v:?}")))
}

fn boolean(v: &str, key: &str) -> Result<bool, ConfError> {
    match v {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => err(format!("Expected a single True/False argument for {key}")),
    }
}

impl Settings {
    /// Reads `PYTORCH_CUDA_ALLOC_CONF` as PyTorch does: every key not given keeps its
    /// default. Refuses what PyTorch refuses, with its message.
    pub fn parse(conf: &str) -> Result<Settings, ConfError> {
        let mut s = Settings::default();
        let mut tk = Tokens { t: lex(conf), i: 0 };
        while tk.i < tk.t.len() {
            let key = tk.t[tk.i].clone();
            match key.as_str() {
                "max_split_size_mb" => {
                    tk.expect(":")?;
                    let v = whole(&tk.value("max_split_size_mb")?, &key)?;
                    if v <= LARGE_BUFFER / MIB {
                        return err(format!(
                            "CachingAllocator option max_split_size_mb too small, must be > {}",
                            LARGE_BUFFER / MIB
                        ));
                    }
                    s.max_split_size = v.saturating_mul(MIB);
                }
                "max_non_split_rounding_mb" => {
                    tk.expect(":")?;
                    let v = whole(&tk.value("max_non_split_rounding_mb")?, &key)?;
                    if v <= LARGE_BUFFER / MIB {
                        return err(format!(
                            "CachingAllocator option max_non_split_rounding_mb too small, must be > {}",
                            LARGE_BUFFER / MIB
                        ));
                    }
                    s.max_non_split_rounding = v.saturating_mul(MIB);
                }
                "large_segment_size_mb" => {
                    tk.expect(":")?;
                    let v = whole(&tk.value("large_segment_size_mb")?, &key)?;
                    if v == 0 || v % 2 != 0 {
                        return err("large_segment_size_mb: expected a positive even number of MiB (a multiple of the 2 MiB segment rounding)");
                    }
                    s.large_segment_size = v.saturating_mul(MIB);
                }
                "garbage_collection_threshold" => {
                    tk.expect(":")?;
                    let raw = tk.value("garbage_collection_threshold")?;
                    let v: f64 = raw.parse().map_err(|_| {
                        ConfError(format!("{key}: expected a number, found {raw:?}"))
                    })?;
                    if v.is_nan() || v <= 0.0 {
                        return err("garbage_collect_threshold too small, set it 0.0~1.0");
                    }
                    if v >= 1.0 {
                        return err("garbage_collect_threshold too big, set it 0.0~1.0");
                    }
                    s.gc_threshold = v;
                }
                "per_process_memory_fraction" => {
                    tk.expect(":")?;
                    let raw = tk.value("per_process_memory_fraction")?;
                    let v: f64 = raw.parse().map_err(|_| {
                        ConfError(format!("{key}: expected a number, found {raw:?}"))
                    })?;
                    if !(v > 0.0 && v <= 1.0) {
                        return err("per_process_memory_fraction: expected a number in (0, 1]");
                    }
                    s.memory_fraction = Some(v);
                }
                "roundup_power2_divisions" => {
                    tk.expect(":")?;
                    parse_divisions(&mut tk, &mut s.divisions)?;
                }
                "expandable_segments" => {
                    tk.expect(":")?;
                    s.expandable_segments = boolean(&tk.value(&key)?, &key)?;
                }
                "release_lock_on_cudamalloc"
                | "pinned_use_cuda_host_register"
                | "pinned_use_background_threads"
                | "graph_capture_record_stream_reuse" => {
                    tk.expect(":")?;
                    boolean(&tk.value(&key)?, &key)?;
                }
                "pinned_num_register_threads" | "pinned_reserve_segment_size_mb" => {
                    tk.expect(":")?;
                    whole(&tk.value(&key)?, &key)?;
                }
                "backend" => {
                    tk.expect(":")?;
                    match tk.value("backend")?.as_str() {
                        "native" => s.backend_async = false,
                        "cudaMallocAsync" => s.backend_async = true,
                        _ => {
                            return err(
                                "Unknown allocator backend, options are native and cudaMallocAsync",
                            );
                        }
                    }
                }
                other => {
                    return err(format!("Unrecognized CachingAllocator option: {other}"));
                }
            }
            tk.i += 1;
            if tk.i < tk.t.len() {
                if tk.t[tk.i] != "," {
                    return err("Error parsing CachingAllocator settings, expected ,");
                }
                tk.i += 1;
            }
        }
        Ok(s)
    }

    /// The settings a snapshot recorded: its `PYTORCH_CUDA_ALLOC_CONF` text (for the
    /// keys the record lacks), then the recorded values, which are the ones in force when
    /// the snapshot was taken. None when the file has no `allocator_settings` (before
    /// PyTorch 2.3).
    pub fn of_snapshot(snap: &Snapshot) -> Option<Settings> {
        let map = snap.allocator_settings.as_ref()?;
        let mut s = map
            .get("PYTORCH_CUDA_ALLOC_CONF")
            .and_then(|v| v.as_str())
            .and_then(|c| Settings::parse(c).ok())
            .unwrap_or_default();
        if let Some(v) = map.get("max_split_size").and_then(|v| v.as_i64()) {
            s.max_split_size = if v < 0 { u64::MAX } else { v as u64 };
        }
        if let Some(v) = map.get("garbage_collection_threshold").and_then(|v| v.as_f64()) {
            s.gc_threshold = v;
        }
        if let Some(v) = map.get("expandable_segments").and_then(|v| v.as_bool()) {
            s.expandable_segments = v;
        }
        if let Some(d) = map
            .get("roundup_power2_divisions")
            .and_then(|v| v.as_object())
        {
            // Keys are bucket positions "1", "2", "4" ... "32768" (pytorch#119404).
            for (k, v) in d {
                if let (Ok(pos), Some(v)) = (k.parse::<u64>(), v.as_u64())
                    && pos.is_power_of_two()
                {
                    let b = pos.trailing_zeros() as usize;
                    if b < DIVISION_BUCKETS {
                        s.divisions[b] = v;
                    }
                }
            }
        }
        Some(s)
    }

    /// The divisions of the bucket `size` falls in.
    pub fn divisions_for(&self, size: u64) -> u64 {
        let log = 63 - size.max(1).leading_zeros() as i64;
        let b = (log - 20).clamp(0, DIVISION_BUCKETS as i64 - 1) as usize;
        self.divisions[b]
    }

    /// The settings in `PYTORCH_CUDA_ALLOC_CONF` syntax, keys that differ from the
    /// defaults only (empty: all defaults).
    pub fn to_conf(&self) -> String {
        let d = Settings::default();
        let mut parts: Vec<String> = Vec::new();
        if self.backend_async {
            parts.push("backend:cudaMallocAsync".into());
        }
        if self.expandable_segments {
            parts.push("expandable_segments:True".into());
        }
        if self.max_split_size != d.max_split_size {
            parts.push(format!("max_split_size_mb:{}", mb(self.max_split_size)));
        }
        if self.max_non_split_rounding != d.max_non_split_rounding {
            parts.push(format!(
                "max_non_split_rounding_mb:{}",
                mb(self.max_non_split_rounding)
            ));
        }
        if self.divisions != d.divisions {
            let first = self.divisions[0];
            if self.divisions.iter().all(|&x| x == first) {
                parts.push(format!("roundup_power2_divisions:{first}"));
            } else {
                let items: Vec<String> = self
                    .divisions
                    .iter()
                    .enumerate()
                    .map(|(b, v)| format!("{}:{v}", 1u64 << b))
                    .collect();
                parts.push(format!("roundup_power2_divisions:[{}]", items.join(",")));
            }
        }
        if self.gc_threshold != d.gc_threshold {
            parts.push(format!("garbage_collection_threshold:{}", self.gc_threshold));
        }
        if let Some(f) = self.memory_fraction {
            parts.push(format!("per_process_memory_fraction:{f}"));
        }
        if self.large_segment_size != d.large_segment_size {
            parts.push(format!(
                "large_segment_size_mb:{}",
                mb(self.large_segment_size)
            ));
        }
        parts.join(",")
    }
}

/// Bytes as whole MiB, or the byte count with a `B` marker where they are not whole MiB
/// (a recorded `max_split_size` may be any size).
fn mb(bytes: u64) -> String {
    if bytes % MIB == 0 {
        (bytes / MIB).to_string()
    } else {
        format!("{:.3}", bytes as f64 / MIB as f64)
    }
}

/// `roundup_power2_divisions:N` or `:[MB:N,...,>:N]`.
fn parse_divisions(tk: &mut Tokens, div: &mut [u64; DIVISION_BUCKETS]) -> Result<(), ConfError> {
    tk.i += 1;
    let Some(v) = tk.t.get(tk.i).cloned() else {
        return err("Error, expecting roundup_power2_divisions value");
    };
    if v != "[" {
        let n = whole(&v, "roundup_power2_divisions")?;
        if !n.is_power_of_two() {
            return err("For roundups, the divisons has to be power of 2 ");
        }
        div.fill(n);
        return Ok(());
    }
    let mut first = true;
    let mut last = 0usize;
    loop {
        tk.i += 1;
        let Some(key) = tk.t.get(tk.i).cloned() else {
            return err("Error parsing roundup_power2_divisions value");
        };
        if key == "]" {
            return Ok(());
        }
        tk.expect(":")?;
        let n = whole(
            &tk.value("roundup_power2_divisions")?,
            "roundup_power2_divisions",
        )?;
        if n != 0 && !n.is_power_of_two() {
            return err(
                "For roundups, the divisons has to be power of 2 or 0 to disable roundup ",
            );
        }
        if key == ">" {
            for d in div.iter_mut().skip(last) {
                *d = n;
            }
        } else {
            let mb = whole(&key, "roundup_power2_divisions")?;
            if !mb.is_power_of_two() {
                return err("For roundups, the intervals have to be power of 2 ");
            }
            let index = (mb.trailing_zeros() as usize).min(DIVISION_BUCKETS - 1);
            if first {
                for d in div.iter_mut().take(index) {
                    *d = n;
                }
                first = false;
            }
            div[index] = n;
            last = index;
        }
        match tk.t.get(tk.i + 1).map(String::as_str) {
            Some("]") => {}
            Some(",") => tk.i += 1,
            _ => return err("Error parsing CachingAllocator settings, expected ,"),
        }
    }
}

/// Releases of PyTorch whose allocator behaves differently where this model looks
/// (spec 1.3, 1.6, 4.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub enum Profile {
    /// 2.0-2.3: `roundup_power2_divisions` of 1 leaves sizes unaligned; no expandable
    /// segments in private pools.
    #[serde(rename = "2.0")]
    V2_0,
    /// 2.4-2.10: one division is plain 512-byte rounding.
    #[serde(rename = "2.4")]
    V2_4,
    /// 2.11 and later: `large_segment_size_mb`; expandable segments in private pools;
    /// `should_split` asks the block's pool.
    #[serde(rename = "2.11")]
    V2_11,
}

impl Profile {
    pub const ALL: [Profile; 3] = [Profile::V2_0, Profile::V2_4, Profile::V2_11];

    /// The release guessed from a file's fields (spec 4.3): `allocator_settings` came in
    /// 2.3, so a file without it is older; the rest is 2.4-2.10 unless told otherwise.
    pub fn guess(features: &Features) -> Profile {
        if !features.allocator_settings {
            Profile::V2_0
        } else {
            Profile::V2_4
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Profile::V2_0 => "2.0",
            Profile::V2_4 => "2.4",
            Profile::V2_11 => "2.11",
        }
    }

    /// The releases each profile stands for.
    pub fn releases(self) -> &'static str {
        match self {
            Profile::V2_0 => "2.0-2.3",
            Profile::V2_4 => "2.4-2.10",
            Profile::V2_11 => "2.11 and later",
        }
    }

    /// A release as `2.5` or `2.5.1` (or a profile's name).
    pub fn parse(s: &str) -> Result<Profile, String> {
        let mut it = s.trim().split('.');
        let major: u32 = it.next().and_then(|x| x.parse().ok()).unwrap_or(0);
        let minor: Option<u32> = it.next().and_then(|x| x.parse().ok());
        match (major, minor) {
            (2, Some(m)) if m <= 3 => Ok(Profile::V2_0),
            (2, Some(m)) if m <= 10 => Ok(Profile::V2_4),
            (2, Some(_)) => Ok(Profile::V2_11),
            _ => Err(format!(
                "expected a PyTorch release from 2.0 on, such as 2.4 or 2.11, found {s:?}"
            )),
        }
    }

    pub(super) fn unaligned_division_one(self) -> bool {
        self == Profile::V2_0
    }

    pub(super) fn expandable_in_private_pools(self) -> bool {
        self >= Profile::V2_11
    }

    pub(super) fn split_tests_pool(self) -> bool {
        self >= Profile::V2_11
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.releases())
    }
}
