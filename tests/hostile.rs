//! Hostile and odd inputs: each case runs the real binary on a file written here, and
//! checks the outcome (a clear error with exit status 2, or a correct result), the time
//! and the peak memory of the process. Before these were handled, the
//! cases ran for minutes, used gigabytes, aborted, or printed wrong numbers.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a run of the binary gave.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    /// Peak resident memory of the process, in MB (10^6 bytes).
    rss_mb: f64,
    wall: Duration,
}

/// Runs `vramlens ARGS` (stdin from `input` when given), killing it after `limit`.
// The child is reaped with waitpid below, not Child::wait.
#[allow(clippy::zombie_processes)]
fn run_with(args: &[&str], input: Option<&[u8]>, limit: Duration) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vramlens"))
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let pid = child.id() as libc::pid_t;
    let feeder = input.map(|data| {
        let mut stdin = child.stdin.take().unwrap();
        let data = data.to_vec();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        })
    });
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    // Peak memory: VmHWM of /proc/PID/status, a high-water mark of the process's own
    // address space, polled until it exits (ru_maxrss of a child starts at the parent's
    // peak, which here is the test process's).
    let watcher = std::thread::spawn(move || {
        let t = Instant::now();
        let mut peak_kib = 0u64;
        loop {
            if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status"))
                && let Some(kib) = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak_kib = peak_kib.max(kib);
            }
            // SAFETY: kill(pid, 0) only checks that the process exists.
            if unsafe { libc::kill(pid, 0) } != 0 {
                return peak_kib;
            }
            if t.elapsed() > limit {
                // SAFETY: the child is ours and not yet reaped (wait4 below reaps it).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    let mut status = 0;
    // SAFETY: waits for our own child, writing its status into the local.
    let r = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(r, pid, "wait4 failed");
    let wall = start.elapsed();
    let peak_kib = watcher.join().unwrap();
    if let Some(f) = feeder {
        let _ = f.join();
    }
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    Run {
        code,
        stdout: String::from_utf8_lossy(&out_t.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&err_t.join().unwrap()).into_owned(),
        rss_mb: peak_kib as f64 * 1024.0 / 1e6,
        wall,
    }
}

fn run(args: &[&str]) -> Run {
    run_with(args, None, Duration::from_secs(120))
}

/// A file in a fresh temporary folder (kept alive by the returned guard).
fn file(name: &str, data: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, data).unwrap();
    (dir, path)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Asserts a clean refusal: status 2, one line naming the file and containing `needle`,
/// no panic, within `secs` seconds and `mb` MB of memory.
fn refused(r: &Run, path: &str, needle: &str, secs: u64, mb: f64) {
    assert_eq!(r.code, Some(2), "{path}: {r:?}");
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "one line: {}", r.stderr);
    assert!(
        r.stderr.starts_with(&format!("vramlens: error: {path}: ")),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains(needle), "{needle:?} not in {}", r.stderr);
    bounded(r, secs, mb);
}

/// The wall-clock limit is a guard against quadratic work (which takes hours on these
/// inputs), not a speed claim: it is stretched for an unoptimised build on a loaded
/// machine.
const SLACK: u64 = 4;

fn bounded(r: &Run, secs: u64, mb: f64) {
    assert!(
        r.wall < Duration::from_secs(secs * SLACK),
        "took {:?} (limit {} s)",
        r.wall,
        secs * SLACK
    );
    assert!(r.rss_mb < mb, "peak RSS {:.0} MB (limit {mb} MB)", r.rss_mb);
}

fn ok(r: &Run) -> serde_json::Value {
    assert_eq!(r.code, Some(0), "{r:?}");
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout))
}

/// A protocol 4 pickle writer, memoizing as CPython's pickler does (MEMOIZE after every
/// str, dict and list), with shared strings written once and read back by GET.
#[derive(Default)]
struct Pickle {
    out: Vec<u8>,
    memo: u32,
    shared: HashMap<String, u32>,
}

impl Pickle {
    fn new() -> Self {
        Pickle {
            out: vec![0x80, 4],
            ..Default::default()
        }
    }
    fn memoize(&mut self) -> u32 {
        self.out.push(0x94);
        self.memo += 1;
        self.memo - 1
    }
    fn get(&mut self, index: u32) -> &mut Self {
        if index < 256 {
            self.out.extend_from_slice(&[b'h', index as u8]);
        } else {
            self.out.push(b'j');
            self.out.extend_from_slice(&index.to_le_bytes());
        }
        self
    }
    /// A string written in full and memoized; returns its memo index.
    fn fresh(&mut self, s: &str) -> u32 {
        let b = s.as_bytes();
        if b.len() < 256 {
            self.out.extend_from_slice(&[0x8c, b.len() as u8]);
        } else {
            self.out.push(b'X');
            self.out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        }
        self.out.extend_from_slice(b);
        self.memoize()
    }
    /// A string shared across the file (keys, action names): written once.
    fn str(&mut self, s: &str) -> &mut Self {
        match self.shared.get(s) {
            Some(&i) => {
                self.get(i);
            }
            None => {
                let i = self.fresh(s);
                self.shared.insert(s.to_string(), i);
            }
        }
        self
    }
    fn int(&mut self, v: i128) -> &mut Self {
        if (0..256).contains(&v) {
            self.out.extend_from_slice(&[b'K', v as u8]);
        } else if (i32::MIN as i128..=i32::MAX as i128).contains(&v) {
            self.out.push(b'J');
            self.out.extend_from_slice(&(v as i32).to_le_bytes());
        } else {
            let mut bytes = v.to_le_bytes().to_vec();
            while bytes.len() > 1 {
                let last = bytes[bytes.len() - 1];
                let prev = bytes[bytes.len() - 2];
                if (last == 0 && prev & 0x80 == 0) || (last == 0xff && prev & 0x80 != 0) {
                    bytes.pop();
                } else {
                    break;
                }
            }
            self.out.extend_from_slice(&[0x8a, bytes.len() as u8]);
            self.out.extend_from_slice(&bytes);
        }
        self
    }
    fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.out.extend_from_slice(b);
        self
    }
    /// `{` MEMOIZE MARK; returns the dict's memo index. Close with `end_dict`.
    fn dict(&mut self) -> u32 {
        self.out.push(b'}');
        let i = self.memoize();
        self.out.push(b'(');
        i
    }
    fn end_dict(&mut self) -> &mut Self {
        self.raw(b"u")
    }
    /// `]` MEMOIZE MARK; returns the list's memo index. Close with `end_list`.
    fn list(&mut self) -> u32 {
        self.out.push(b']');
        let i = self.memoize();
        self.out.push(b'(');
        i
    }
    fn end_list(&mut self) -> &mut Self {
        self.raw(b"e")
    }
    fn empty_list(&mut self) -> u32 {
        self.out.push(b']');
        self.memoize()
    }
    fn stop(&mut self) -> Vec<u8> {
        self.out.push(b'.');
        std::mem::take(&mut self.out)
    }

    /// A segment dict of one device, with one block covering it when `block`.
    fn segment_with(&mut self, device: i64, address: u64, total: u128, block: bool) {
        self.dict();
        self.str("device").int(device as i128);
        self.str("address").int(address as i128);
        self.str("total_size").int(total as i128);
        self.str("allocated_size").int(0);
        self.str("active_size").int(0);
        self.str("stream").int(0);
        self.str("segment_type").str("large");
        self.str("blocks");
        if block {
            self.list();
            self.dict();
            self.str("size").int(total as i128);
            self.str("state").str("inactive");
            self.end_dict();
            self.end_list();
        } else {
            self.empty_list();
        }
        self.end_dict();
    }

    fn segment(&mut self, device: i64, address: u64, total: u128) {
        self.segment_with(device, address, total, true);
    }

    /// A trace entry: action, addr, size, stream, time_us.
    fn entry(&mut self, action: &str, addr: u128, size: u128, stream: u128, time: i128) {
        self.dict();
        self.str("action").str(action);
        let addr_key = if action == "oom" {
            "device_free"
        } else {
            "addr"
        };
        self.str(addr_key).int(addr as i128);
        self.str("size").int(size as i128);
        self.str("stream").int(stream as i128);
        self.str("time_us").int(time);
        self.end_dict();
    }
}

/// Items of a list in batches of 1000 (MARK ... APPENDS), as Python writes them.
fn batched(p: &mut Pickle, n: usize, mut item: impl FnMut(&mut Pickle, usize)) {
    for start in (0..n).step_by(1000) {
        p.raw(b"(");
        for i in start..(start + 1000).min(n) {
            item(p, i);
        }
        p.raw(b"e");
    }
}

/// `{'segments': [...], 'device_traces': [[...]]}` with `segments` segments and `entries`
/// trace entries of device 0, each written by its closure.
fn snapshot(
    segments: usize,
    segment: impl FnMut(&mut Pickle, usize),
    entries: usize,
    entry: impl FnMut(&mut Pickle, usize),
) -> Vec<u8> {
    let mut p = Pickle::new();
    p.dict();
    p.str("segments");
    p.empty_list();
    batched(&mut p, segments, segment);
    p.str("device_traces");
    p.list();
    p.empty_list();
    batched(&mut p, entries, entry);
    p.end_list();
    p.end_dict();
    p.stop()
}

fn one_segment(p: &mut Pickle, _: usize) {
    p.segment(0, 0x7f00_0000_0000, 2 << 20);
}

// ---------------------------------------------------------------------------------------
// Arithmetic on values from the file

#[test]
fn sizes_of_2_63_and_more_are_refused_naming_the_key() {
    // Two segments of 8 EiB: "reserved 0 B" before (the sum wrapped).
    let data = snapshot(
        2,
        |p, i| p.segment(0, (i as u64) << 40, 1 << 63),
        0,
        |_, _| {},
    );
    let (_d, f) = file("two_8eib.pickle", &data);
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "segments[0].total_size: expected a size below 2^63 bytes, found int 9223372036854775808",
        30,
        200.0,
    );
    // Each below 2^63, together above.
    let data = snapshot(
        2,
        |p, i| p.segment_with(0, (i as u64) << 40, (1 << 62) + 5 * i as u128, false),
        0,
        |_, _| {},
    );
    let (_d, f) = file("sum.pickle", &data);
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "segments[1].total_size: sizes on device 0 add up to more than 2^63 bytes",
        30,
        200.0,
    );
    // A segment that ends beyond the address space.
    let data = snapshot(1, |p, _| p.segment(0, u64::MAX - 4095, 8192), 0, |_, _| {});
    let (_d, f) = file("end.pickle", &data);
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "segments[0].total_size: expected memory below 2^64, found 8192 bytes at address 0xfffffffffffff000",
        30,
        200.0,
    );
    // A trace entry of 2^64 - 1 bytes, and trace sizes that add up past 2^63.
    let data = snapshot(1, one_segment, 1, |p, _| {
        p.entry("alloc", 4096, u64::MAX as u128, 0, 1)
    });
    let (_d, f) = file("entry.pickle", &data);
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "device_traces[0][0].size: expected a size below 2^63 bytes, found int 18446744073709551615",
        30,
        200.0,
    );
    let data = snapshot(1, one_segment, 3, |p, i| {
        p.entry("alloc", 4096 * i as u128, 1 << 62, 0, 1 + i as i128)
    });
    let (_d, f) = file("entries.pickle", &data);
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "device_traces[0][1].size: sizes of this trace add up to more than 2^63 bytes",
        30,
        200.0,
    );
}

#[test]
fn a_device_free_that_is_not_a_size_is_unknown_with_a_warning() {
    let data = snapshot(1, one_segment, 1, |p, _| {
        p.entry("oom", u64::MAX as u128, 1 << 30, 0, 1_700_000_000_000_000)
    });
    let (_d, f) = file("oom.pickle", &data);
    // -1 written through int64 (the C++ pickler) is the same entry with a LONG1 of -1.
    let data_neg = snapshot(1, one_segment, 1, |p, _| {
        p.dict();
        p.str("action").str("oom");
        p.str("device_free").raw(b"J\xff\xff\xff\xff");
        p.str("size").int(1 << 30);
        p.str("stream").int(0);
        p.end_dict();
    });
    let (_d2, f_neg) = file("oom_neg.pickle", &data_neg);
    for f in [&f, &f_neg] {
        let v = ok(&run(&["summary", "--json", s(f)]));
        let oom = &v["devices"][0]["ooms"][0];
        assert_eq!(oom["size"], 1 << 30);
        assert_eq!(oom["device_free"], serde_json::Value::Null, "{v}");
        let warnings = v["warnings"].to_string();
        assert!(
            warnings.contains("oom entry with a device_free that is not a size"),
            "{warnings}"
        );
        let text = run(&["summary", s(f)]);
        assert!(
            text.stdout
                .contains("requested 1.0 GiB, device had an unknown amount free"),
            "{}",
            text.stdout
        );
        assert!(!text.stdout.contains("EiB"), "{}", text.stdout);
    }
}

#[test]
fn a_time_beyond_any_real_time_is_taken_as_absent() {
    let t0 = 1_700_000_000_000_000i128;
    for far in [i64::MAX as i128, 1 << 64, -(1 << 60)] {
        let data = snapshot(1, one_segment, 3, |p, i| match i {
            0 => p.entry("alloc", 4096, 512, 0, t0),
            1 => p.entry("alloc", 8192, 512, 0, far),
            _ => p.entry("free_requested", 4096, 512, 0, t0 + 10),
        });
        let (_d, f) = file("time.pickle", &data);
        let v = ok(&run(&["summary", "--json", s(&f)]));
        let d = &v["devices"][0]["trace"];
        assert_eq!(d["first_time_us"], t0 as i64, "{v}");
        assert_eq!(d["last_time_us"], (t0 + 10) as i64, "{v}");
        assert!(
            v["warnings"]
                .to_string()
                .contains("time_us more than 285 years")
        );
    }
}

// ---------------------------------------------------------------------------------------
// Memory: nothing sized by a number from the file, sharing expanded under a budget

#[test]
fn a_memo_read_of_a_huge_index_costs_nothing() {
    // 12 bytes: an empty list, then LONG_BINGET 2^28 - 1 (315 MB and 1.8 s before).
    let mut data = b"\x80\x04]\x94j".to_vec();
    data.extend_from_slice(&((1u32 << 28) - 1).to_le_bytes());
    data.extend_from_slice(b"a.");
    let (_d, f) = file("get.pickle", &data);
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "byte 4: memo reference 268435455 to an index that was never stored",
        5,
        60.0,
    );
    // An explicit PUT of a huge index, read back: kept aside, not in a table that size.
    let mut data = b"\x80\x02]q\x00K\x01r".to_vec();
    data.extend_from_slice(&((1u32 << 31) + 7).to_le_bytes());
    data.push(b'j');
    data.extend_from_slice(&((1u32 << 31) + 7).to_le_bytes());
    data.extend_from_slice(b"\x86a.");
    let (v, _) = vramlens::pickle::parse_bytes(&data).unwrap();
    assert_eq!(format!("{v:?}").matches("Int(1)").count(), 2, "{v:?}");
}

#[test]
fn billion_laughs_in_allocator_settings_is_refused_within_budget() {
    // L0 = 'ha' * 20; L(i+1) = [Li, Li]; allocator_settings = {'k': L60}: 2^60 strings.
    let mut p = Pickle::new();
    p.dict();
    p.str("segments");
    p.empty_list();
    p.str("allocator_settings");
    p.raw(b"}");
    p.memoize();
    p.str("k");
    let mut cur = p.fresh(&"ha".repeat(20));
    p.raw(b"0");
    for _ in 0..60 {
        p.raw(b"]");
        let next = p.memoize();
        p.raw(b"(");
        p.get(cur).get(cur).raw(b"e0");
        cur = next;
    }
    p.get(cur).raw(b"s");
    p.end_dict();
    let data = p.stop();
    assert!(data.len() < 2000);
    let (_d, f) = file("laughs.pickle", &data);
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "allocator_settings.k: the decoded snapshot would exceed 64 MiB",
        30,
        400.0,
    );
}

#[test]
fn a_big_string_read_back_many_times_is_interned_once() {
    // One 1 MiB compile_context shared by 20,000 entries (8 s before: hashed per read).
    let big = "x".repeat(1 << 20);
    let mut big_index = None;
    let data = snapshot(1, one_segment, 20_000, |p, i| {
        p.dict();
        p.str("action").str("alloc");
        p.str("addr").int(0x7f00_0000_0000 + 512 * i as i128);
        p.str("size").int(512);
        p.str("stream").int(0);
        p.str("compile_context");
        match big_index {
            Some(b) => {
                p.get(b);
            }
            None => big_index = Some(p.fresh(&big)),
        }
        p.end_dict();
    });
    let (_d, f) = file("bigstr.pickle", &data);
    let r = run(&["summary", "--json", s(&f)]);
    let v = ok(&r);
    assert_eq!(v["devices"][0]["trace"]["events"], 20_000, "{v}");
    bounded(&r, 20, 150.0);
}

#[test]
fn a_segment_or_blocks_list_shared_by_many_segments_is_refused_within_budget() {
    // One segment dict of 1000 blocks, then 100,000 references to it.
    let mut p = Pickle::new();
    p.dict();
    p.str("segments");
    p.list();
    let seg = p.dict();
    p.str("device").int(0);
    p.str("address").int(0x7f00_0000_0000);
    p.str("total_size").int(1000 * 512);
    p.str("blocks");
    p.list();
    for _ in 0..1000 {
        p.dict();
        p.str("size").int(512);
        p.str("state").str("inactive");
        p.end_dict();
    }
    p.end_list();
    p.end_dict();
    p.end_list();
    p.raw(b"(");
    for i in 0..100_000 {
        p.get(seg);
        if i % 1000 == 999 {
            p.raw(b"e(");
        }
    }
    p.raw(b"e");
    p.end_dict();
    let data = p.stop();
    let (_d, f) = file("shared_segment.pickle", &data);
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "segments[1673].blocks: the decoded snapshot would exceed 64 MiB (64 MiB plus twice the file's size): a value shared through the pickle memo is expanded once per reference",
        30,
        400.0,
    );
    // One blocks list of 10,000 blocks shared by 100,000 segments.
    let mut p = Pickle::new();
    p.dict();
    p.str("segments");
    p.list();
    let mut blocks = None;
    for i in 0..100_000u64 {
        p.dict();
        p.str("device").int(0);
        p.str("address").int((0x7f00_0000_0000 + (i << 24)) as i128);
        p.str("total_size").int(10_000 * 512);
        p.str("blocks");
        match blocks {
            Some(b) => {
                p.get(b);
            }
            None => {
                blocks = Some(p.list());
                for _ in 0..10_000 {
                    p.dict();
                    p.str("size").int(512);
                    p.str("state").str("inactive");
                    p.end_dict();
                }
                p.end_list();
            }
        }
        p.end_dict();
        if i % 1000 == 999 {
            p.raw(b"e(");
        }
    }
    p.end_list();
    p.end_dict();
    let data = p.stop();
    let (_d, f) = file("shared_blocks.pickle", &data);
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "the decoded snapshot would exceed",
        30,
        400.0,
    );
}

/// `{'segments': [], 'device_traces': [[], [], ...]}`: one empty list read back n - 1
/// times.
fn empty_traces(n: usize) -> Vec<u8> {
    let mut p = Pickle::new();
    p.dict();
    p.str("segments");
    p.empty_list();
    p.str("device_traces");
    p.list();
    let empty = p.empty_list();
    let mut data = std::mem::take(&mut p.out);
    for _ in 1..n {
        data.extend_from_slice(&[b'h', empty as u8]);
    }
    data.extend_from_slice(b"eu.");
    data
}

#[test]
fn millions_of_empty_device_traces_are_refused() {
    // 20 MB: 10^7 empty device traces (3-6 GB and an abort before). No snapshot holds
    // that many values at once.
    let (_d, f) = file("traces.pickle", &empty_traces(10_000_000));
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "values held at once after",
        60,
        400.0,
    );
    // 10^6: within what the reader holds, refused by what a snapshot can be.
    let (_d, f) = file("traces.pickle", &empty_traces(1_000_000));
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "device_traces: 1000000 lists; expected one per device (at most 65536)",
        60,
        400.0,
    );
}

#[test]
fn values_piling_up_are_refused_before_they_take_gigabytes() {
    // A list of 40 million Nones (40 MB): no snapshot holds that many values at once.
    let mut data = b"\x80\x04](".to_vec();
    data.extend(std::iter::repeat_n(b'N', 40_000_000));
    data.extend_from_slice(b"e.");
    let (_d, f) = file("nones.pickle", &data);
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "byte 4793493: 4793491 values held at once after 4793493 bytes; a memory snapshot never needs that many",
        60,
        500.0,
    );
    // The same in 40 KB of gzip: the first pass stops at the ratio guard, before any
    // value is made.
    let (_d, f) = file("nones.pickle.gz", &gzip(&data));
    assert!(std::fs::metadata(&f).unwrap().len() < 100_000);
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "read error: gzip: the content decompresses to more than 200 times its compressed size of",
        60,
        100.0,
    );
}

// ---------------------------------------------------------------------------------------
// gzip

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn sample() -> Vec<u8> {
    std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/testdata/sample.pickle"
    ))
    .unwrap()
}

/// `head` then `chunks` MiB of `fill` bytes, as gzip members (a member of 1 MiB of one
/// byte compresses to about 1 KB, and members concatenate).
fn gzip_bomb(head: &[u8], fill: u8, chunks: usize) -> Vec<u8> {
    let mut out = gzip(head);
    let member = gzip(&vec![fill; 1 << 20]);
    for _ in 0..chunks {
        out.extend_from_slice(&member);
    }
    out
}

#[test]
fn gzip_bombs_are_refused_without_holding_the_content() {
    // A BINUNICODE8 of 4 GiB, followed by 4 GiB of zeros: 4 MB compressed (2 GB of
    // memory and an abort on a 4 GiB allocation before).
    let bomb = gzip_bomb(b"\x80\x04\x8d\x00\x00\x00\x00\x01\x00\x00\x00", 0, 4096);
    assert!(bomb.len() < 5 << 20);
    let (_d, f) = file("bomb.pickle.gz", &bomb);
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "byte 11: an argument of 4294967296 bytes (BINUNICODE8 bytes); at most 268435456 bytes are read for one opcode from a stream",
        30,
        100.0,
    );
    // A protocol 0 integer that never ends: the line is never held whole.
    let (_d, f) = file("line.pickle.gz", &gzip_bomb(b"I", b'7', 1024));
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "byte 1: read error: gzip: the content decompresses to more than 200 times its compressed size",
        60,
        700.0,
    );
    // Valid content that decompresses a thousand times: the sample, then NULs.
    let (_d, f) = file("ratio.pickle.gz", &gzip_bomb(&sample(), 0, 2048));
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "gzip: the content decompresses to more than 200 times its compressed size",
        60,
        100.0,
    );
}

#[test]
fn gzip_checksums_and_members_are_read() {
    let plain = sample();
    let want = ok(&run(&[
        "summary",
        "--json",
        concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/sample.pickle"),
    ]));
    // Split in two members (`cat a.gz b.gz`): read as one.
    let mut two = gzip(&plain[..5000]);
    two.extend(gzip(&plain[5000..]));
    let (_d, f) = file("two.pickle.gz", &two);
    let got = ok(&run(&["summary", "--json", s(&f)]));
    assert_eq!(got["devices"], want["devices"]);
    assert_eq!(got["warnings"], want["warnings"]);
    // A wrong CRC (last 8 bytes: CRC32 and length): refused, not other numbers.
    let mut bad = gzip(&plain);
    let n = bad.len();
    bad[n - 8] ^= 0xff;
    let (_d, f) = file("crc.pickle.gz", &bad);
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "gzip: corrupt gzip stream does not have a matching checksum",
        10,
        100.0,
    );
    let mut bad = gzip(&plain);
    let n = bad.len();
    bad[n - 1] ^= 0x01;
    let (_d, f) = file("len.pickle.gz", &bad);
    refused(&run(&["summary", s(&f)]), s(&f), "gzip: ", 10, 100.0);
    // Garbage after the member: refused as such.
    let mut junk = gzip(&plain);
    junk.extend_from_slice(b"not gzip");
    let (_d, f) = file("junk.pickle.gz", &junk);
    refused(&run(&["summary", s(&f)]), s(&f), "gzip: ", 10, 100.0);
}

#[test]
fn data_after_the_pickle_is_reported() {
    let mut data = sample();
    data.extend_from_slice(b"trailing garbage");
    let (_d, f) = file("trailing.pickle", &data);
    let v = ok(&run(&["summary", "--json", s(&f)]));
    assert!(
        v["warnings"]
            .to_string()
            .contains("16 bytes after the end of the pickle (STOP) were ignored"),
        "{}",
        v["warnings"]
    );
    let (_d, f) = file("trailing.pickle.gz", &gzip(&data));
    let v = ok(&run(&["summary", "--json", s(&f)]));
    assert!(v["warnings"].to_string().contains("16 bytes after the end"));
    // Without trailing bytes, no such warning.
    let (_d, f) = file("clean.pickle", &sample());
    let v = ok(&run(&["summary", "--json", s(&f)]));
    assert!(!v["warnings"].to_string().contains("after the end"));
}

// ---------------------------------------------------------------------------------------
// Valid files that were refused, and work that grew quadratically

#[test]
fn a_trace_written_as_one_batch_by_the_cpp_pickler_is_read() {
    // PyTorch's C++ pickler: protocol 2, BINPUT after every container, the whole trace
    // in one MARK ... APPENDS (a full default ring buffer has 100,000 entries).
    let n = 150_000u32;
    let mut out = b"\x80\x02}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02X\x0d\x00\x00\x00device_tracesq\x03]q\x04]q\x05(".to_vec();
    let mut memo = 6u32;
    let put = |out: &mut Vec<u8>, memo: &mut u32| {
        out.push(b'r');
        out.extend_from_slice(&memo.to_le_bytes());
        *memo += 1;
    };
    let mut keys: HashMap<&str, u32> = HashMap::new();
    for i in 0..n {
        out.push(b'}');
        put(&mut out, &mut memo);
        out.push(b'(');
        for (k, v) in [
            ("action", None),
            ("addr", Some(0x7f00_0000_0000u64 + 512 * (i as u64 / 2))),
            ("size", Some(512)),
            ("stream", Some(0)),
        ] {
            match keys.get(k) {
                Some(&m) => {
                    out.push(b'j');
                    out.extend_from_slice(&m.to_le_bytes());
                }
                None => {
                    out.push(b'X');
                    out.extend_from_slice(&(k.len() as u32).to_le_bytes());
                    out.extend_from_slice(k.as_bytes());
                    keys.insert(k, memo);
                    put(&mut out, &mut memo);
                }
            }
            match v {
                None => {
                    let action = if i % 2 == 0 {
                        "alloc"
                    } else {
                        "free_completed"
                    };
                    match keys.get(action) {
                        Some(&m) => {
                            out.push(b'j');
                            out.extend_from_slice(&m.to_le_bytes());
                        }
                        None => {
                            out.push(b'X');
                            out.extend_from_slice(&(action.len() as u32).to_le_bytes());
                            out.extend_from_slice(action.as_bytes());
                            keys.insert(action, memo);
                            put(&mut out, &mut memo);
                        }
                    }
                }
                Some(v) => {
                    out.push(0x8a);
                    out.push(8);
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
        out.push(b'u');
    }
    out.extend_from_slice(b"eau.");
    let (_d, f) = file("cpp.pickle", &out);
    let r = run(&["summary", "--json", s(&f)]);
    let v = ok(&r);
    assert_eq!(v["devices"][0]["trace"]["events"], n as u64, "{v}");
    bounded(&r, 60, 600.0);
}

#[test]
fn repeated_stores_of_one_memo_index_run_in_linear_time() {
    // h0 q0 repeated: a read then a store at the same index, a million times (each
    // store scanned the whole stack before).
    let mut data = b"\x80\x02K\x07q\x00".to_vec();
    for _ in 0..1_000_000 {
        data.extend_from_slice(b"h\x00q\x00");
    }
    data.push(b'.');
    let (_d, f) = file("putget.pickle", &data);
    let r = run(&["summary", s(&f)]);
    refused(
        &r,
        s(&f),
        "not a memory snapshot: expected a dict with 'segments' or a list of segments, found int 7",
        30,
        300.0,
    );
}

#[test]
fn a_protocol_0_integer_of_a_million_digits_is_refused_at_once() {
    let mut data = b"L".to_vec();
    data.extend(std::iter::repeat_n(b'9', 1_000_000));
    data.extend_from_slice(b"L\n.");
    let (_d, f) = file("digits.pickle", &data);
    refused(
        &run(&["summary", s(&f)]),
        s(&f),
        "byte 0: a decimal integer of 1000000 digits; Python reads at most 4300",
        10,
        100.0,
    );
    // 4300 digits are read (the value is not a snapshot, which is what is reported).
    let mut data = b"L".to_vec();
    data.extend(std::iter::repeat_n(b'9', 4300));
    data.extend_from_slice(b"L\n.");
    let (v, _) = vramlens::pickle::parse_bytes(&data).unwrap();
    assert!(matches!(v, vramlens::pickle::Value::BigInt(_)));
}

#[test]
fn a_hundred_thousand_devices_run_in_seconds() {
    let n = 100_000;
    let data = snapshot(
        n as usize,
        |p, d| p.segment(d as i64, 0x7f00_0000_0000, 2 << 20),
        0,
        |_, _| {},
    );
    let (_d, f) = file("devices.pickle", &data);
    let r = run(&["summary", "--json", s(&f)]);
    // 100 MB of JSON: read into the fields checked (the rest is parsed and skipped, so
    // the whole output must still be JSON) rather than into a tree of values.
    #[derive(serde::Deserialize)]
    struct Device {
        device: i64,
        reserved_bytes: u64,
    }
    #[derive(serde::Deserialize)]
    struct Summary {
        devices: Vec<Device>,
    }
    assert_eq!(r.code, Some(0), "{r:?}");
    let v: Summary =
        serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout));
    assert_eq!(v.devices.len(), n as usize);
    assert_eq!(v.devices[n as usize - 1].device, n - 1);
    assert_eq!(v.devices[n as usize - 1].reserved_bytes, 2 << 20);
    bounded(&r, 60, 800.0);
}

#[test]
fn three_hundred_thousand_streams_run_in_seconds() {
    let n = 300_000;
    let data = snapshot(1, one_segment, n, |p, i| {
        let i = i as u128;
        p.entry(
            "alloc",
            0x7f00_0000_0000 + 512 * i,
            512,
            0x5555_0000_0000 + 16 * i,
            1_700_000_000_000_000 + i as i128,
        )
    });
    let (_d, f) = file("streams.pickle", &data);
    let r = run(&["summary", "--json", s(&f)]);
    let v = ok(&r);
    assert_eq!(v["devices"][0]["trace"]["events"], n as u64);
    bounded(&r, 60, 600.0);
}

// ---------------------------------------------------------------------------------------
// Inputs that are not plain files, and formats named

#[test]
fn standard_input_and_pipes_are_read() {
    let want = ok(&run(&[
        "summary",
        "--json",
        concat!(env!("CARGO_MANIFEST_DIR"), "/testdata/sample.pickle"),
    ]));
    let r = run_with(
        &["summary", "--json", "-"],
        Some(&sample()),
        Duration::from_secs(60),
    );
    let got = ok(&r);
    assert_eq!(got["devices"], want["devices"]);
    assert_eq!(got["source"]["path"], "-");
    // gzip through a pipe.
    let r = run_with(
        &["summary", "--json", "-"],
        Some(&gzip(&sample())),
        Duration::from_secs(60),
    );
    assert_eq!(ok(&r)["devices"], want["devices"]);
    // A FIFO: read as a stream (it read as "empty file" before).
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("snap.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: creates a FIFO at a path in our own temporary folder.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::write(&fifo, sample()).unwrap())
    };
    let got = ok(&run(&["summary", "--json", s(&fifo)]));
    writer.join().unwrap();
    assert_eq!(got["devices"], want["devices"]);
    // Empty standard input.
    let r = run_with(&["summary", "-"], Some(b""), Duration::from_secs(30));
    assert_eq!(r.code, Some(2));
    assert_eq!(
        r.stderr.trim_end(),
        "vramlens: error: standard input: empty file; expected a PyTorch memory snapshot"
    );
}

#[test]
fn endless_devices_are_refused_at_once() {
    refused(
        &run(&["summary", "/dev/zero"]),
        "/dev/zero",
        "is a device, not a file",
        5,
        50.0,
    );
}

#[test]
fn other_compressors_are_named() {
    for (magic, name) in [
        (
            &b"\x28\xb5\x2f\xfd\x00\x00"[..],
            "zstd-compressed; decompress it first (zstd -d FILE)",
        ),
        (&b"\xfd7zXZ\x00\x00"[..], "xz-compressed"),
        (&b"BZh91AY&SY"[..], "bzip2-compressed"),
        (&b"PK\x03\x04\x00\x00"[..], "a zip archive"),
    ] {
        let (_d, f) = file("snap.pickle", magic);
        refused(&run(&["summary", s(&f)]), s(&f), name, 5, 50.0);
    }
}

#[test]
fn pages_json_with_a_bom_and_logs_are_told_apart() {
    let root = env!("CARGO_MANIFEST_DIR");
    // The HTML _memory_viz.py writes starts with a lowercase doctype.
    let page = std::fs::read_to_string(format!("{root}/testdata/sample_viz.html")).unwrap();
    let lower = page.replacen("<!DOCTYPE html>", "<!doctype html>", 1);
    assert_ne!(lower, page);
    let (_d, f) = file("page.html", lower.as_bytes());
    let v = ok(&run(&["summary", "--json", s(&f)]));
    assert_eq!(v["source"]["format"], "html");
    assert!(!v["warnings"].to_string().contains("after the end"));
    // JSON with a byte-order mark.
    let json = std::fs::read(format!("{root}/testdata/v2_5.json")).unwrap();
    let mut bom = b"\xef\xbb\xbf".to_vec();
    bom.extend_from_slice(&json);
    let (_d, f) = file("bom.json", &bom);
    let v = ok(&run(&["summary", "--json", s(&f)]));
    assert_eq!(v["source"]["format"], "json");
    // An nvidia-smi log names the command that reads it.
    let (_d, f) = file(
        "gpu.csv",
        b"timestamp, memory.used [MiB]\n2024/01/01 00:00:00.000, 1 MiB\n",
    );
    refused(
        &run(&["top", s(&f)]),
        s(&f),
        "this is an nvidia-smi CSV log, not a memory snapshot; expected a PyTorch memory snapshot (read the log beside one with `vramlens reconcile SNAPSHOT --nvml FILE`, or draw it on a chart with `vramlens timeline SNAPSHOT -o chart.svg --nvml FILE`)",
        5,
        50.0,
    );
}

// ---------------------------------------------------------------------------------------
// Round three: side inputs under the main input's rules

/// Runs `vramlens ARGS` and asserts a refusal naming `needle` within `secs` and `mb`.
fn refused_anywhere(args: &[&str], needle: &str, secs: u64, mb: f64) {
    let r = run(args);
    assert_eq!(r.code, Some(2), "{args:?}: {r:?}");
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "one line: {}", r.stderr);
    assert!(
        r.stderr.contains(needle),
        "{args:?}: {needle:?} not in {}",
        r.stderr
    );
    bounded(&r, secs, mb);
}

#[test]
fn a_gzip_bomb_is_refused_while_streaming_as_page_trace_device_log_or_log() {
    const RATIO: &str = "decompresses to more than 200 times its compressed size";
    let (_d, snap) = file("sample.pickle", &sample());
    // 2 GiB of white space in 2 MB, behind the start of each kind of file.
    let bomb = |head: &[u8]| gzip_bomb(head, b' ', 2048);
    let page = bomb(
        b"<!doctype html><script>const local_files = [{\"name\": \"s.pickle\", \"base64\": \"",
    );
    let (_d1, page) = file("viz.html.gz", &page);
    // Refused before the page is held: the guard stops at the ratio of what was taken.
    refused(&run(&["summary", s(&page)]), s(&page), RATIO, 30, 150.0);
    let (_d2, trace) = file("trace.json.gz", &bomb(b"{\"traceEvents\": ["));
    let chart = _d2.path().join("t.svg");
    refused_anywhere(
        &["timeline", s(&snap), "-o", s(&chart), "--trace", s(&trace)],
        RATIO,
        30,
        150.0,
    );
    let csv = b"timestamp, index, memory.used [MiB], memory.total [MiB]\n".to_vec();
    // Logs are read line by line: 2 GiB of empty lines.
    let lines = |head: &[u8]| gzip_bomb(head, b'\n', 2048);
    let (_d3, log) = file("smi.csv.gz", &lines(&csv));
    refused_anywhere(
        &["reconcile", s(&snap), "--nvml", s(&log)],
        RATIO,
        30,
        150.0,
    );
    let (_d4, log) = file("train.log.gz", &lines(b"step 1\n"));
    refused_anywhere(&["oom", s(&snap), "--log", s(&log)], RATIO, 30, 150.0);
    // A side input compressed within the ratio is read as the plain file is.
    let text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.25 GiB of which 1.00 GiB is free.\n";
    let (_d5, plain) = file("oom.log", text.as_bytes());
    let (_d6, packed) = file("oom.log.gz", &gzip(text.as_bytes()));
    let a = run(&["oom", s(&snap), "--log", s(&plain), "--json"]);
    let b = run(&["oom", s(&snap), "--log", s(&packed), "--json"]);
    assert_eq!(a.code, Some(0), "{a:?}");
    assert_eq!(
        a.stdout.replace("oom.log.gz", "oom.log"),
        b.stdout.replace("oom.log.gz", "oom.log")
    );
}

#[test]
fn white_space_before_a_trace_follows_one_rule_as_main_input_and_as_trace() {
    let (_d, snap) = file("sample.pickle", &sample());
    let mut trace = vec![b' '; 8192];
    trace.extend_from_slice(br#"{"traceEvents": []}"#);
    let (_d1, t) = file("spaced.json", &trace);
    let needle = "4096 bytes or more of white space before the first value";
    refused(&run(&["summary", s(&t)]), s(&t), needle, 10, 100.0);
    let chart = _d1.path().join("t.svg");
    refused_anywhere(
        &["timeline", s(&snap), "-o", s(&chart), "--trace", s(&t)],
        needle,
        10,
        100.0,
    );
    // Less is read.
    let (_d2, t) = file("ok.json", &trace[8192 - 100..]);
    let r = run(&["summary", s(&t)]);
    assert!(!r.stderr.contains(needle), "{r:?}");
}

#[test]
fn an_oom_message_repeated_a_hundred_thousand_times_is_counted_once() {
    let message = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.25 GiB of which 1.00 GiB is free. Including non-PyTorch memory, this process has 78.24 GiB memory in use. Of the allocated memory 70.00 GiB is allocated by PyTorch, and 8.00 GiB is reserved by PyTorch but unallocated.\n";
    let other = message.replace("2.00 GiB. GPU 0", "4.00 GiB. GPU 0");
    let n = 100_000;
    let mut log = String::with_capacity(n * (message.len() + 8));
    for i in 0..n {
        log.push_str("step\n");
        log.push_str(if i == 7 { &other } else { message });
    }
    let (_d, path) = file("train.log", log.as_bytes());
    let r = run(&["oom", "--log", s(&path), "--json"]);
    let v = ok(&r);
    bounded(&r, 30, 100.0);
    let messages = v["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2, "{}", r.stdout.len());
    assert_eq!(messages[0]["count"], (n - 1) as u64);
    assert_eq!(messages[0]["line"], 2);
    assert_eq!(messages[0]["last_line"], 2 * n as u64);
    assert_eq!(messages[1]["count"], 1);
    assert_eq!(messages[1]["line"], 2 * 8);
    assert_eq!(v["analyses"].as_array().unwrap().len(), 2);
    // The text: each distinct message once, the repeats counted.
    let r = run(&["oom", "--log", s(&path)]);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.stdout.len() < 20_000, "{} bytes printed", r.stdout.len());
    assert!(
        r.stdout.contains(&format!(
            "log line 2: the same message {} times in all, the last on line {}",
            n - 1,
            2 * n
        )),
        "{}",
        r.stdout
    );
}

#[test]
fn a_long_name_shared_by_many_stacks_is_repeated_cut() {
    // One 1 MiB function name, written once and read back (memo) by 300 frames that
    // differ only in line number, each the stack of a live block and of its allocation.
    const N: usize = 300;
    const BASE: u64 = 0x7f00_0000_0000;
    const SIZE: u64 = 1 << 20;
    let name = "f".repeat(1 << 20);
    let mut p = Pickle::new();
    let mut name_memo = None;
    let mut frames = |p: &mut Pickle, i: usize| {
        p.list();
        p.dict();
        p.str("filename").str("/w/model.py");
        p.str("line").int(i as i128 + 1);
        p.str("name");
        match name_memo {
            Some(m) => {
                p.get(m);
            }
            None => name_memo = Some(p.fresh(&name)),
        }
        p.end_dict();
        p.end_list();
    };
    p.dict();
    p.str("segments");
    p.list();
    p.dict();
    p.str("device").int(0);
    p.str("address").int(BASE as i128);
    p.str("total_size").int((N as u64 * SIZE) as i128);
    p.str("allocated_size").int((N as u64 * SIZE) as i128);
    p.str("active_size").int((N as u64 * SIZE) as i128);
    p.str("stream").int(0);
    p.str("segment_type").str("large");
    p.str("blocks");
    p.list();
    for i in 0..N {
        p.dict();
        p.str("address").int((BASE + i as u64 * SIZE) as i128);
        p.str("size").int(SIZE as i128);
        p.str("requested_size").int(SIZE as i128);
        p.str("state").str("active_allocated");
        p.str("frames");
        frames(&mut p, i);
        p.end_dict();
    }
    p.end_list();
    p.end_dict();
    p.end_list();
    p.str("device_traces");
    p.list();
    p.list();
    for i in 0..N {
        p.dict();
        p.str("action").str("alloc");
        p.str("addr").int((BASE + i as u64 * SIZE) as i128);
        p.str("size").int(SIZE as i128);
        p.str("stream").int(0);
        p.str("time_us").int(i as i128 + 1);
        p.str("frames");
        frames(&mut p, i);
        p.end_dict();
    }
    p.end_list();
    p.end_list();
    p.end_dict();
    let data = p.stop();
    assert!(data.len() < 1_200_000, "{}", data.len());
    let (dir, path) = file("long_name.pickle", &data);
    let bound = 10 * data.len();
    for args in [
        &["segments", "--json"][..],
        &["timeline", "--at", "peak", "--json"],
        &["top", "--by", "stack", "--json"],
        &["flamegraph", "--folded"],
    ] {
        let mut a = args.to_vec();
        a.push(s(&path));
        let r = run(&a);
        assert_eq!(r.code, Some(0), "{args:?}: {}", r.stderr);
        bounded(&r, 30, 300.0);
        assert!(r.stdout.len() < bound, "{args:?}: {} bytes", r.stdout.len());
        assert!(r.stdout.contains("…[cut: 1048576 bytes, "), "{args:?}");
    }
    for (cmd, out) in [
        ("segments", "s.svg"),
        ("flamegraph", "f.svg"),
        ("timeline", "t.svg"),
    ] {
        let o = dir.path().join(out);
        let r = run(&[cmd, s(&path), "-o", s(&o)]);
        assert_eq!(r.code, Some(0), "{cmd}: {}", r.stderr);
        bounded(&r, 30, 300.0);
        let len = std::fs::metadata(&o).unwrap().len() as usize;
        assert!(len < bound, "{cmd}: {len} bytes");
    }
    // The report draws each stack up to six times (tooltips, lists, legends, the flame
    // graph): still within a few times the file.
    let o = dir.path().join("r.html");
    let r = run(&["report", "-o", s(&o), s(&path)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    bounded(&r, 60, 500.0);
    let len = std::fs::metadata(&o).unwrap().len() as usize;
    assert!(len < 3 * data.len(), "report: {len} bytes");
    let ev = dir.path().join("ev");
    let r = run(&["export", "--events", "-o", s(&ev), s(&path)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let len: u64 = std::fs::read_dir(&ev)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(
        (len as usize) < 3 * data.len(),
        "export --events: {len} bytes"
    );
    let x = dir.path().join("x");
    let r = run(&["export", "--format", "jsonl", "-o", s(&x), s(&path)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let mut total = 0;
    let mut stack = vec![x];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                total += std::fs::metadata(&p).unwrap().len() as usize;
            }
        }
    }
    assert!(total < bound, "export: {total} bytes");
}

#[test]
fn a_large_profiler_trace_as_the_main_input_is_not_held_whole() {
    // 64 MiB of trace: 16,000 [memory] events, each padded with 4 KiB of an argument the
    // converter does not keep. What is kept (the events) is a few MB; the file's pages
    // are given back as the reader passes them, so the peak stays far below its size.
    let pad = "x".repeat(4096);
    let mut text = String::from("{\"schemaVersion\": 1, \"traceEvents\": [\n");
    let mut total: i64 = 0;
    let mut i = 0u64;
    while text.len() < 64 << 20 {
        let bytes: i64 = if i.is_multiple_of(2) {
            1 << 20
        } else {
            -(1 << 20)
        };
        total += bytes;
        if i > 0 {
            text.push_str(",\n");
        }
        text.push_str(&format!(
            "{{\"ph\": \"i\", \"cat\": \"cpu_instant_event\", \"s\": \"t\", \"name\": \"[memory]\", \"pid\": 1, \"tid\": 1, \"ts\": {}, \"args\": {{\"Total Allocated\": {total}, \"Total Reserved\": {}, \"Bytes\": {bytes}, \"Addr\": {}, \"Device Id\": 0, \"Device Type\": 1, \"Pad\": \"{pad}\"}}}}",
            1000 + i,
            1 << 21,
            0x7f00_0000_0000u64 + (i / 2) * (1 << 21),
        ));
        i += 1;
    }
    text.push_str("\n]}\n");
    let size_mb = text.len() as f64 / 1e6;
    let (_dir, path) = file("big.trace.json", text.as_bytes());
    drop(text);
    let r = run(&["summary", "--json", s(&path)]);
    let v = ok(&r);
    // Every allocation is freed by the next event: the peak is one of them, 1 MiB.
    assert_eq!(v["devices"][0]["peak_requested_bytes"], 1 << 20);
    assert_eq!(v["devices"][0]["trace"]["events"], i);
    bounded(&r, 30, size_mb * 0.6);
}
