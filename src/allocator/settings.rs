//! The allocator's settings (`PYTORCH_CUDA_ALLOC_CONF`) and the PyTorch releases whose
//! behaviour differs (spec sections 1.1, 1.3 and 4.3).
//!
//! Takes the text of `PYTORCH_CUDA_ALLOC_CONF`, read as PyTorch's `CUDAAllocatorConfig`
//! reads it (the same tokens, the same refusals), or a snapshot's `allocator_settings`;
//! gives [`Settings`]. The release is not in the file: [`Profile::guess`] takes it from the
//! fields present, and a user can name it.

use crate::model::Snapshot;
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

/// The tokens of the allocator's tokenizer: runs of characters between `,` `:` `[` `]`,
/// each separator a token of its own. Up to 2.9 only spaces are dropped; from 2.10 all
/// white space is.
fn lex(conf: &str, all_space: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut buf = String::new();
    for ch in conf.chars() {
        if matches!(ch, ',' | ':' | '[' | ']') {
            if !buf.is_empty() {
                out.push(std::mem::take(&mut buf));
            }
            out.push(ch.to_string());
        } else if !(ch == ' ' || all_space && ch.is_whitespace()) {
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
    /// The parser of 2.10 and later: it checks no separator (any token stands in for
    /// one) and says "Index out of bounds" when tokens run out.
    new: bool,
}

impl Tokens {
    fn expect(&mut self, sep: &str) -> Result<(), ConfError> {
        self.i += 1;
        match self.t.get(self.i) {
            Some(t) if t == sep || self.new => Ok(()),
            None if self.new => err("Index out of bounds in ConfigTokenizer"),
            _ => err(format!(
                "Error parsing CachingAllocator settings, expected {sep}"
            )),
        }
    }

    fn value(&mut self, what: &str) -> Result<String, ConfError> {
        self.i += 1;
        match self.t.get(self.i) {
            Some(v) if self.new || !matches!(v.as_str(), "," | ":" | "[" | "]") => Ok(v.clone()),
            None if self.new => err("Index out of bounds in ConfigTokenizer"),
            _ => err(format!("Error, expecting {what} value")),
        }
    }
}

/// A whole number as C's `stoi`/`stoull` read a token: its leading digits (and sign),
/// the rest ignored (`100abc` is 100, `1.5` is 1); a negative number wraps to the
/// largest. A token with no leading digit is refused as they refuse it.
fn whole(v: &str, key: &str, new: bool) -> Result<u64, ConfError> {
    let (neg, digits) = match v.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, v.strip_prefix('+').unwrap_or(v)),
    };
    let n: String = digits.chars().take_while(|c| c.is_ascii_digit()).collect();
    let func = if new { "stoull" } else { "stoi" };
    if n.is_empty() {
        return err(format!("{key}: {func} cannot read {v:?} as a whole number"));
    }
    let x: u64 = n
        .parse()
        .map_err(|_| ConfError(format!("{key}: {v:?} is out of range for {func}")))?;
    if !new && x > i32::MAX as u64 {
        return err(format!("{key}: {v:?} is out of range for stoi"));
    }
    Ok(if neg { u64::MAX } else { x })
}

/// A number as C's `stod` reads the start of a token.
fn real(v: &str, key: &str) -> Result<f64, ConfError> {
    let mut end = 0;
    for k in (1..=v.len()).rev() {
        if v.is_char_boundary(k) && v[..k].parse::<f64>().is_ok() {
            end = k;
            break;
        }
    }
    if end == 0 {
        return err(format!("{key}: stod cannot read {v:?} as a number"));
    }
    Ok(v[..end].parse().expect("parsed above"))
}

fn boolean(v: &str, key: &str, new: bool) -> Result<bool, ConfError> {
    match v {
        "True" => Ok(true),
        "False" => Ok(false),
        _ if new => err(format!(
            "Expected 'True' or 'False' in ConfigTokenizer but got '{v}' (for {key})"
        )),
        _ => err(format!("Expected a single True/False argument for {key}")),
    }
}

/// Megabytes as the allocator stores them: capped so that the bytes fit.
fn mib_bytes(v: u64) -> u64 {
    v.min(u64::MAX / MIB) * MIB
}

impl Settings {
    /// Reads `PYTORCH_CUDA_ALLOC_CONF` as the release of `profile` does: every key not
    /// given keeps its default, the last of a repeated key wins, and what that release
    /// refuses is refused with its message.
    pub fn parse(conf: &str, profile: Profile) -> Result<Settings, ConfError> {
        let new = profile >= Profile::V2_10;
        let mut s = Settings::default();
        let mut tk = Tokens {
            t: lex(conf, new),
            i: 0,
            new,
        };
        // 2.11 and later read large_segment_size_mb first: it sets the smallest
        // max_split_size_mb and the default max_non_split_rounding_mb.
        if profile >= Profile::V2_11
            && let Some(k) = tk.t.iter().position(|t| t == "large_segment_size_mb")
        {
            let raw = tk.t.get(k + 2).cloned().unwrap_or_default();
            let v = whole(&raw, "large_segment_size_mb", true)?;
            if v <= 10 {
                return err("CachingAllocator option large_segment_size_mb must be > 10 MB");
            }
            s.large_segment_size = mib_bytes(v);
            s.max_non_split_rounding = s.large_segment_size;
        }
        let min_split_mb = s.large_segment_size / MIB;
        while tk.i < tk.t.len() {
            let key = tk.t[tk.i].clone();
            let known = key_known(&key, profile);
            match key.as_str() {
                "max_split_size_mb" | "max_non_split_rounding_mb" if known => {
                    tk.expect(":")?;
                    let v = whole(&tk.value(&key)?, &key, new)?;
                    let too_small = if new {
                        v < min_split_mb
                    } else {
                        v <= min_split_mb
                    };
                    if too_small {
                        let rel = if new { ">=" } else { ">" };
                        return err(format!(
                            "CachingAllocator option {key} too small, must be {rel} {min_split_mb}"
                        ));
                    }
                    if key == "max_split_size_mb" {
                        s.max_split_size = mib_bytes(v);
                    } else {
                        s.max_non_split_rounding = mib_bytes(v);
                    }
                }
                "large_segment_size_mb" if known => {
                    // Read before the rest.
                    tk.expect(":")?;
                    tk.value(&key)?;
                }
                "garbage_collection_threshold" if known => {
                    tk.expect(":")?;
                    let v = real(&tk.value(&key)?, &key)?;
                    if new && !(v > 0.0 && v < 1.0) {
                        return err("garbage_collect_threshold is invalid, set it in (0.0, 1.0)");
                    }
                    if v.is_nan() || v <= 0.0 {
                        return err("garbage_collect_threshold too small, set it 0.0~1.0");
                    }
                    if v >= 1.0 {
                        return err("garbage_collect_threshold too big, set it 0.0~1.0");
                    }
                    s.gc_threshold = v;
                }
                "per_process_memory_fraction" if known => {
                    tk.expect(":")?;
                    let v = real(&tk.value(&key)?, &key)?;
                    if !(0.0..=1.0).contains(&v) {
                        return err("per_process_memory_fraction is invalid, set it in [0.0, 1.0]");
                    }
                    // A fraction of 1 sets no limit (and leaves garbage collection off).
                    s.memory_fraction = (v < 1.0).then_some(v);
                }
                "roundup_power2_divisions" if known => {
                    tk.expect(":")?;
                    parse_divisions(&mut tk, &mut s.divisions, profile)?;
                }
                "expandable_segments" if known => {
                    tk.expect(":")?;
                    s.expandable_segments = boolean(&tk.value(&key)?, &key, new)?;
                }
                "release_lock_on_cudamalloc"
                | "pinned_use_cuda_host_register"
                | "pinned_use_background_threads"
                | "graph_capture_record_stream_reuse"
                    if known =>
                {
                    tk.expect(":")?;
                    boolean(&tk.value(&key)?, &key, new)?;
                }
                "pinned_num_register_threads" if known => {
                    tk.expect(":")?;
                    let v = whole(&tk.value(&key)?, &key, new)?;
                    if !v.is_power_of_two() {
                        return err("Number of register threads has to be power of 2 ");
                    }
                    if v > 128 {
                        return err(
                            "Number of register threads should be less than or equal to 128",
                        );
                    }
                }
                "pinned_reserve_segment_size_mb" if known => {
                    tk.expect(":")?;
                    if whole(&tk.value(&key)?, &key, new)? == 0 {
                        return err("Pinned reserve segment size has to be greater than 0");
                    }
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
                other if new => {
                    return err(format!(
                        "Unrecognized key '{other}' in CUDA allocator config."
                    ));
                }
                other => {
                    return err(format!("Unrecognized CachingAllocator option: {other}"));
                }
            }
            tk.i += 1;
            if tk.i < tk.t.len() {
                if !new && tk.t[tk.i] != "," {
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
    pub fn of_snapshot(snap: &Snapshot, profile: Profile) -> Option<Settings> {
        let map = snap.allocator_settings.as_ref()?;
        let mut s = map
            .get("PYTORCH_CUDA_ALLOC_CONF")
            .and_then(|v| v.as_str())
            .and_then(|c| Settings::parse(c, profile).ok())
            .unwrap_or_default();
        if let Some(v) = map.get("max_split_size").and_then(|v| v.as_i64()) {
            s.max_split_size = if v < 0 { u64::MAX } else { v as u64 };
        }
        if let Some(v) = map
            .get("garbage_collection_threshold")
            .and_then(|v| v.as_f64())
        {
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
            parts.push(format!(
                "garbage_collection_threshold:{}",
                short_number(self.gc_threshold)
            ));
        }
        if let Some(f) = self.memory_fraction {
            parts.push(format!("per_process_memory_fraction:{}", short_number(f)));
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

/// A setting's number as given where that is short, else in exponent form: a fraction
/// of 1e-300 is not printed as 300 zeros.
fn short_number(f: f64) -> String {
    let plain = f.to_string();
    if plain.len() <= 16 {
        plain
    } else {
        format!("{f:e}")
    }
}

/// Bytes as whole MiB, or the byte count with a `B` marker where they are not whole MiB
/// (a recorded `max_split_size` may be any size).
fn mb(bytes: u64) -> String {
    if bytes.is_multiple_of(MIB) {
        (bytes / MIB).to_string()
    } else {
        format!("{:.3}", bytes as f64 / MIB as f64)
    }
}

/// `roundup_power2_divisions:N` or `:[MB:N,...,>:N]`.
fn parse_divisions(
    tk: &mut Tokens,
    div: &mut [u64; DIVISION_BUCKETS],
    profile: Profile,
) -> Result<(), ConfError> {
    let new = tk.new;
    let spelled = if profile == Profile::V2_0 {
        "divisons"
    } else {
        "divisions"
    };
    tk.i += 1;
    let Some(v) = tk.t.get(tk.i).cloned() else {
        return if new {
            err("Index out of bounds in ConfigTokenizer")
        } else {
            err("Error, expecting roundup_power2_divisions value")
        };
    };
    if v != "[" {
        let n = whole(&v, "roundup_power2_divisions", new)?;
        if !n.is_power_of_two() {
            return err(format!("For roundups, the {spelled} has to be power of 2 "));
        }
        div.fill(n);
        return Ok(());
    }
    let mut first = true;
    let mut last = 0usize;
    loop {
        tk.i += 1;
        let Some(key) = tk.t.get(tk.i).cloned() else {
            return if new {
                err("Index out of bounds in ConfigTokenizer")
            } else {
                err("Error parsing CachingAllocator settings, expected ,")
            };
        };
        if key == "]" {
            return Ok(());
        }
        tk.expect(":")?;
        let n = whole(
            &tk.value("roundup_power2_divisions")?,
            "roundup_power2_divisions",
            new,
        )?;
        // 2.0-2.3 refuse 0; later releases take it as "no rounding".
        if !(n.is_power_of_two() || n == 0 && profile > Profile::V2_0) {
            return err(format!(
                "For roundups, the {spelled} has to be power of 2 or 0 to disable roundup "
            ));
        }
        if key == ">" {
            // Up to 2.9 the fill starts at the last named bucket (overwriting it); from
            // 2.10 just after it (pytorch#165304).
            let from = if new { last + 1 } else { last };
            for d in div.iter_mut().skip(from) {
                *d = n;
            }
        } else {
            let mb = whole(&key, "roundup_power2_divisions", new)?;
            if !mb.is_power_of_two() {
                return err("For roundups, the intervals have to be power of 2 ");
            }
            let index = (mb.trailing_zeros() as usize).min(DIVISION_BUCKETS - 1);
            if first {
                for d in div.iter_mut().take(index) {
                    *d = n;
                }
            }
            first = false;
            div[index] = n;
            last = index;
        }
        match tk.t.get(tk.i + 1).map(String::as_str) {
            Some("]") => {}
            Some(_) if new => tk.i += 1,
            Some(",") => tk.i += 1,
            _ => return err("Error parsing CachingAllocator settings, expected ,"),
        }
    }
}

/// Whether the release of `profile` knows a key (pytorch's tests of its wheels).
fn key_known(key: &str, profile: Profile) -> bool {
    match key {
        "max_non_split_rounding_mb" | "pinned_use_background_threads" => profile >= Profile::V2_4,
        "graph_capture_record_stream_reuse" => profile >= Profile::V2_4,
        "pinned_reserve_segment_size_mb" | "per_process_memory_fraction" => {
            profile >= Profile::V2_10
        }
        "large_segment_size_mb" => profile >= Profile::V2_11,
        _ => true,
    }
}

/// Releases of PyTorch whose allocator behaves differently where this model looks
/// (spec sections 1.3, 1.6 and 4.3; the parser's changes as PyTorch's own wheels show).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub enum Profile {
    /// 2.0-2.3: `roundup_power2_divisions` of 1 leaves sizes unaligned.
    #[serde(rename = "2.0")]
    V2_0,
    /// 2.4-2.9: one division is plain 512-byte rounding; the first configuration parser.
    #[serde(rename = "2.4")]
    V2_4,
    /// 2.10: the second configuration parser (`max_split_size_mb` of 20 accepted,
    /// `per_process_memory_fraction`, `>` of the divisions list after the last bucket).
    #[serde(rename = "2.10")]
    V2_10,
    /// 2.11 and later: `large_segment_size_mb`; expandable segments in private pools;
    /// `should_split` asks the block's pool.
    #[serde(rename = "2.11")]
    V2_11,
}

impl Profile {
    pub const ALL: [Profile; 4] = [Profile::V2_0, Profile::V2_4, Profile::V2_10, Profile::V2_11];

    /// The profile of the earliest release the file's layout allows
    /// ([`crate::model::layout::layout`]: the one guess of a file's release, as `summary`
    /// prints it). The earliest, because a field a release writes only when used (an
    /// annotation, a compile context) may be missing from a later release's file.
    pub fn guess(snap: &Snapshot) -> Profile {
        Profile::of_release(crate::model::layout::layout(snap).min_release)
    }

    /// The profile a release (`"2.5"`, `"1.13"`) falls in; releases before 2.0 in 2.0's.
    pub fn of_release(release: &str) -> Profile {
        let (major, minor) = crate::model::layout::release_key(release);
        Profile::of_version(major, minor)
    }

    /// The profile of release `major.minor`; releases before 2.0 in 2.0's.
    fn of_version(major: u32, minor: u32) -> Profile {
        match (major, minor) {
            (major, _) if major < 2 => Profile::V2_0,
            (2, minor) if minor <= 3 => Profile::V2_0,
            (2, minor) if minor <= 9 => Profile::V2_4,
            (2, 10) => Profile::V2_10,
            _ => Profile::V2_11,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Profile::V2_0 => "2.0",
            Profile::V2_4 => "2.4",
            Profile::V2_10 => "2.10",
            Profile::V2_11 => "2.11",
        }
    }

    /// The releases each profile stands for.
    pub fn releases(self) -> &'static str {
        match self {
            Profile::V2_0 => "2.0-2.3",
            Profile::V2_4 => "2.4-2.9",
            Profile::V2_10 => "2.10",
            Profile::V2_11 => "2.11 and later",
        }
    }

    /// A release as `torch.__version__` spells it: `2.5`, `2.5.1`, with a pre-release
    /// (`2.6.0a0`, `2.6.0rc1`), a development build (`2.10.0.dev20250101`) or a local
    /// label (`2.5.1+cu121`); any other spelling is refused.
    pub fn parse(s: &str) -> Result<Profile, String> {
        let release = s
            .trim()
            .split_once('+')
            .map_or(s.trim(), |(r, local)| if local.is_empty() { "" } else { r });
        let parts: Vec<&str> = release.split('.').collect();
        let number = |x: &str| -> Option<u32> {
            (!x.is_empty() && x.bytes().all(|b| b.is_ascii_digit()))
                .then(|| x.parse().ok())
                .flatten()
        };
        // A patch: digits, then a pre-release tag of letters and digits.
        let patch = |x: &str| {
            x.bytes().next().is_some_and(|b| b.is_ascii_digit())
                && x.bytes().all(|b| b.is_ascii_alphanumeric())
        };
        let dev = |x: &str| x.strip_prefix("dev").is_some_and(|n| number(n).is_some());
        let well_formed = match parts.len() {
            2 => true,
            3 => patch(parts[2]),
            4 => patch(parts[2]) && dev(parts[3]),
            _ => false,
        };
        let (major, minor) = if well_formed {
            (number(parts[0]), number(parts[1]))
        } else {
            (None, None)
        };
        match (major, minor) {
            (Some(2), Some(m)) => Ok(Profile::of_version(2, m)),
            _ => Err(format!(
                "expected a PyTorch release from 2.0 on, such as 2.4 or 2.10, found {s:?}"
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

#[cfg(test)]
mod tests {
    //! Each case as PyTorch's own wheels (2.3, 2.8, 2.9, 2.10, 2.15) parsed it.
    use super::*;

    fn ok(s: &str, p: Profile) -> Settings {
        Settings::parse(s, p).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn refused(s: &str, p: Profile) -> String {
        Settings::parse(s, p).expect_err(s).0
    }

    /// `--torch` takes `torch.__version__`'s spellings, and only those.
    #[test]
    fn releases_as_torch_spells_them() {
        for (s, p) in [
            ("2.3", Profile::V2_0),
            (" 2.4 ", Profile::V2_4),
            ("2.5.1", Profile::V2_4),
            ("2.5.1+cu121", Profile::V2_4),
            ("2.5+cu121", Profile::V2_4),
            ("2.6.0a0+git1234abc", Profile::V2_4),
            ("2.6.0rc1", Profile::V2_4),
            ("2.10.0.dev20250101", Profile::V2_10),
            ("2.15", Profile::V2_11),
        ] {
            assert_eq!(Profile::parse(s), Ok(p), "{s}");
        }
        for s in [
            "2",
            "2.",
            "2.x",
            "2.5.abc",
            "2.5.1.2",
            "2.5.1+",
            "2.5.1.devx",
            "1.13",
            "+2.5",
            "2.-1",
            "",
        ] {
            assert!(Profile::parse(s).is_err(), "{s}");
        }
    }

    /// A tiny fraction or threshold is written in exponent form, not as 300 digits.
    #[test]
    fn numbers_in_a_conf_stay_short() {
        let s = Settings {
            memory_fraction: Some(1e-300),
            gc_threshold: 0.5,
            ..Settings::default()
        };
        assert_eq!(
            s.to_conf(),
            "garbage_collection_threshold:0.5,per_process_memory_fraction:1e-300"
        );
        let s = Settings {
            memory_fraction: Some(0.25),
            ..Settings::default()
        };
        assert_eq!(s.to_conf(), "per_process_memory_fraction:0.25");
    }

    #[test]
    fn keys_values_and_defaults() {
        let s = ok("", Profile::V2_4);
        assert_eq!(s, Settings::default());
        let s = ok(
            " max_split_size_mb : 1 2 8 ,expandable_segments:True,",
            Profile::V2_4,
        );
        assert_eq!(s.max_split_size, 128 << 20);
        assert!(s.expandable_segments);
        // The last of a repeated key wins; digits then anything are the digits.
        assert_eq!(
            ok(
                "max_split_size_mb:100,max_split_size_mb:200abc",
                Profile::V2_4
            )
            .max_split_size,
            200 << 20
        );
        assert_eq!(
            ok("garbage_collection_threshold:.5", Profile::V2_4).gc_threshold,
            0.5
        );
        assert_eq!(
            ok("garbage_collection_threshold:5e-1", Profile::V2_10).gc_threshold,
            0.5
        );
    }

    #[test]
    fn refusals_by_release() {
        assert_eq!(
            refused("max_split_size_mb:20", Profile::V2_4),
            "CachingAllocator option max_split_size_mb too small, must be > 20"
        );
        assert_eq!(
            ok("max_split_size_mb:20", Profile::V2_10).max_split_size,
            20 << 20
        );
        assert_eq!(
            refused("max_split_size_mb:19", Profile::V2_10),
            "CachingAllocator option max_split_size_mb too small, must be >= 20"
        );
        assert_eq!(
            refused("expandable_segments:true", Profile::V2_4),
            "Expected a single True/False argument for expandable_segments"
        );
        assert_eq!(
            refused("garbage_collection_threshold:1", Profile::V2_4),
            "garbage_collect_threshold too big, set it 0.0~1.0"
        );
        assert_eq!(
            refused("garbage_collection_threshold:0", Profile::V2_10),
            "garbage_collect_threshold is invalid, set it in (0.0, 1.0)"
        );
        assert_eq!(
            refused("expandable=True", Profile::V2_4),
            "Unrecognized CachingAllocator option: expandable=True"
        );
        assert_eq!(
            refused("per_process_memory_fraction:0.5", Profile::V2_4),
            "Unrecognized CachingAllocator option: per_process_memory_fraction"
        );
        assert_eq!(
            refused(",expandable_segments:True", Profile::V2_10),
            "Unrecognized key ',' in CUDA allocator config."
        );
        assert_eq!(
            refused("expandable_segments,True", Profile::V2_4),
            "Error parsing CachingAllocator settings, expected :"
        );
        // 2.10's tokenizer checks no separator.
        assert!(ok("expandable_segments,True", Profile::V2_10).expandable_segments);
        assert_eq!(
            refused("backend:cuda", Profile::V2_4),
            "Unknown allocator backend, options are native and cudaMallocAsync"
        );
        assert_eq!(
            refused("roundup_power2_divisions:3", Profile::V2_4),
            "For roundups, the divisions has to be power of 2 "
        );
        assert_eq!(
            refused("large_segment_size_mb:10", Profile::V2_11),
            "CachingAllocator option large_segment_size_mb must be > 10 MB"
        );
        assert!(refused("max_split_size_mb:abc", Profile::V2_4).contains("stoi"));
    }

    #[test]
    fn divisions_lists() {
        let d = |s: &str, p| ok(s, p).divisions;
        assert_eq!(d("roundup_power2_divisions:4", Profile::V2_4), [4; 16]);
        let mut want = [0u64; 16];
        want[0] = 4;
        want[6] = 8;
        assert_eq!(
            d("roundup_power2_divisions:[1:4,64:8]", Profile::V2_4),
            want
        );
        // `>` overwrote the last named bucket up to 2.9, starts after it from 2.10.
        let mut old = [8u64; 16];
        old[..9].fill(1);
        assert_eq!(
            d("roundup_power2_divisions:[256:1,512:2,>:8]", Profile::V2_4),
            old
        );
        let mut new = [8u64; 16];
        new[..9].fill(1);
        new[9] = 2;
        assert_eq!(
            d("roundup_power2_divisions:[256:1,512:2,>:8]", Profile::V2_10),
            new
        );
        assert_eq!(d("roundup_power2_divisions:[>:8]", Profile::V2_4), [8; 16]);
        let mut skip_first = [8u64; 16];
        skip_first[0] = 0;
        assert_eq!(
            d("roundup_power2_divisions:[>:8]", Profile::V2_10),
            skip_first
        );
        assert_eq!(
            ok("roundup_power2_divisions:[65536:4]", Profile::V2_4).divisions[15],
            4
        );
    }

    #[test]
    fn settings_round_trip_as_conf_text() {
        let text =
            "expandable_segments:True,max_split_size_mb:128,garbage_collection_threshold:0.6";
        let s = ok(text, Profile::V2_4);
        assert_eq!(s.to_conf(), text);
        assert_eq!(ok(&s.to_conf(), Profile::V2_4), s);
        assert_eq!(Settings::default().to_conf(), "");
    }

    #[test]
    fn releases_by_name() {
        assert_eq!(Profile::parse("2.3.1"), Ok(Profile::V2_0));
        assert_eq!(Profile::parse("2.9"), Ok(Profile::V2_4));
        assert_eq!(Profile::parse("2.10"), Ok(Profile::V2_10));
        assert_eq!(Profile::parse("2.15"), Ok(Profile::V2_11));
        assert!(Profile::parse("1.13").is_err());
    }
}
