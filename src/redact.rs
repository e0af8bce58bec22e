//! Redaction: rules over the strings of a [`Snapshot`] that remove what identifies people
//! and machines and keep every number.
//!
//! Takes a decoded snapshot and [`RedactOptions`]; rewrites its strings in place and
//! returns a [`RedactReport`] (each distinct original string, what it became, and how
//! many places held it). Numbers, events and the shape of every stack are untouched, so
//! any analysis gives the same figures on the redacted snapshot; [`apply`] can run on a
//! snapshot just read, before any command looks at it.
//!
//! The rules:
//! - Absolute paths (file names of frames, and paths inside any other text) are cut to the
//!   part a reader needs: from the package root for installed packages (`site-packages`,
//!   `dist-packages`), from `pythonX.Y/` for the standard library, from the source tree
//!   for interpreters and libraries built from source, from `torchinductor/` for
//!   generated kernels, below temporary folders, and for everything else (the user's own
//!   files) below the folder that all files of the same root share (from the package
//!   when a checkout holds a package of its own name). No absolute path, home folder or
//!   user folder is left.
//! - User names (from home folders such as `/home/NAME`, `/Users/NAME`, from scratch and
//!   data areas such as `/scratch/NAME`, `/mnt/VOLUME/NAME`, `//HOST/share/NAME` (not a
//!   bare `/data/NAME`: that is a data set's folder), and
//!   `torchinductor_NAME`, `NAME@host`) and host names (`//HOST/share`, `/net/HOST`,
//!   `user@HOST`), and words given by the caller, are replaced wherever they appear as
//!   a whole word, in every text field.
//! - Function names and line numbers stay (paths inside them cut) unless `strip_code`,
//!   which replaces those of the user's own code by keyed hashes (SipHash-2-4) that keep
//!   equal frames equal and distinct frames distinct; code text (`forward_frames`,
//!   `cpp_frames`) and compiled regions (`compile_context`, but `N/A`) are hashed then
//!   too. Libraries' frames (installed packages, the standard library, generated code,
//!   trees built from source; native code in torch's, CPython's and the C runtime's
//!   namespaces) keep theirs, and a user's function name stays where the built-in
//!   category rules read it ([`crate::analysis::kinds::attribution::frame_evidence`]), so that
//!   every command decides the same categories on a stripped copy.
//! - Annotation names and user metadata are kept (after the rules above), hashed or
//!   dropped, as asked.
//! - Strings matching a `keep` pattern are left as they are.
//!
//! Distinct file names stay distinct and distinct function names stay distinct (a
//! collision gets a ` [2]` suffix), so frames and stacks keep their identity.
//! Text is text wherever it stands: names and values of keys vramlens does not interpret
//! (bytes read as text), keys and values of `allocator_settings` and of the dicts inside
//! it, `PYTORCH_CUDA_ALLOC_CONF` (its options hold no path or name, so it changes only
//! when one holds one), unknown action names and unknown block states. Not touched: the
//! action, state and segment-type names vramlens knows, and the keys of the format.

use crate::model::frames::FxMap;
use crate::model::round_trip::ExtraKeys;
use crate::model::{BlockState, Frame, FrameTable, Snapshot, StrId, TraceString};
use regex::Regex;
use serde::Serialize;
use siphasher::sip::SipHasher24;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::hash::Hasher;
use std::sync::LazyLock;

pub const SCHEMA_VERSION: u32 = 1;

/// What to do with a kind of free text (annotation names, user metadata).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TextMode {
    /// Keep it, with paths cut and names removed (default).
    #[default]
    Keep,
    /// Replace it by a keyed hash.
    Hash,
    /// Replace it by the empty string.
    Drop,
}

/// Redaction options. Defaults: keep function names, line numbers, annotation names and
/// user metadata (with paths cut and names removed), fixed hash key, no extra words.
#[derive(Clone, Debug, Default)]
pub struct RedactOptions {
    /// Replace function names, line numbers and code text by keyed hashes.
    pub strip_code: bool,
    /// Secret for the hash key; without it the key is fixed (and public).
    pub salt: Option<String>,
    pub annotations: TextMode,
    pub metadata: TextMode,
    /// Strings matching any of these are left untouched.
    pub keep: Vec<Regex>,
    /// More words to remove wherever they appear (host names, project names).
    pub scrub: Vec<String>,
}

/// Which kind of string changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Field {
    /// `filename` of frames.
    Filename,
    /// `name` of frames.
    Function,
    /// `name` of `external_annotations`.
    Annotation,
    UserMetadata,
    CompileContext,
    InternalMetadata,
    CppFrames,
    ForwardFrames,
    /// String values of `allocator_settings` (not `PYTORCH_CUDA_ALLOC_CONF`).
    Setting,
    /// Strings inside keys vramlens does not interpret (and `category`).
    OtherKey,
}

/// One distinct original string and what it became.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Change {
    pub field: Field,
    pub original: String,
    pub redacted: String,
    /// Places that held it: distinct frames for file and function names, trace entries
    /// for per-entry fields, records for annotations.
    pub count: u64,
}

/// Names found in the snapshot (and given by the caller) and removed.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FoundNames {
    pub users: Vec<String>,
    pub hosts: Vec<String>,
    /// Words given with the options.
    pub words: Vec<String>,
}

impl FoundNames {
    /// The names found (user and host names a rule may remove) and the words the
    /// options give, each set sorted.
    fn of(users: BTreeSet<String>, hosts: BTreeSet<String>, options: &RedactOptions) -> Self {
        FoundNames {
            users: users.into_iter().filter(|n| usable_name(n)).collect(),
            hosts: hosts.into_iter().filter(|n| usable_name(n)).collect(),
            words: options
                .scrub
                .iter()
                .filter(|w| !w.trim().is_empty())
                .cloned()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
        }
    }
}

/// What [`apply`] changed.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RedactReport {
    pub names: FoundNames,
    /// Sorted by field, then original.
    pub changes: Vec<Change>,
    /// Frames whose line number was replaced (`strip_code`).
    pub lines_replaced: u64,
    /// Distinct strings the rules would have changed but a `keep` pattern protected.
    pub kept_by_pattern: u64,
}

impl RedactReport {
    /// Number of distinct strings changed per field.
    pub fn totals(&self) -> BTreeMap<Field, u64> {
        let mut t = BTreeMap::new();
        for c in &self.changes {
            *t.entry(c.field).or_insert(0) += 1;
        }
        t
    }
}

const USER: &str = "<user>";
const HOST: &str = "<host>";
const WORD: &str = "<redacted>";

/// Account names that identify nobody; never replaced as words.
const GENERIC_NAMES: [&str; 24] = [
    "root",
    "conda",
    "user",
    "users",
    "ubuntu",
    "admin",
    "runner",
    "jovyan",
    "ec2-user",
    "jenkins",
    "build",
    "builder",
    "shared",
    "public",
    "default",
    "guest",
    "nobody",
    "data",
    "work",
    "home",
    "src",
    "test",
    "tmp",
    "localhost",
];

fn is_generic(name: &str) -> bool {
    GENERIC_NAMES.iter().any(|g| g.eq_ignore_ascii_case(name))
}

/// Folders after which a component is a user name, and how many components lie
/// between: home folders, scratch and work areas of clusters (`/scratch/NAME`,
/// `/lustre/NAME`), and mounts of a volume (`/mnt/VOLUME/NAME`,
/// `/media/VOLUME/NAME`). A name met there is removed wherever it appears, like one of a
/// home folder (unless it is a generic account name).
/// The second value says whether a path may end at the user's folder (`/home/NAME`):
/// elsewhere the last component is taken for a file.
fn user_folder(component: &str) -> Option<(usize, bool)> {
    match component {
        "home" | "Users" | "homes" | "homestud" => Some((0, true)),
        // Not a bare `/data`: `/data/imagenet` is a data set; `/mnt/data/NAME` is
        // covered by the mount rule below.
        "scratch" | "pscratch" | "work" | "lustre" | "gpfs" | "fsx" => Some((0, false)),
        "mnt" | "media" => Some((1, false)),
        _ => None,
    }
}

static VERSIONED_TREE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[A-Za-z][A-Za-z0-9_+]*-\d+(\.\d+)+$").unwrap());
static CONDA_BUILD: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"_\d{10,}$").unwrap());
static PYTHON_DIR: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^python\d+(\.\d+)*$").unwrap());
static WINDOWS_PYTHON_DIR: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)^python\d+$").unwrap());
/// An absolute path inside text: after a start, space, quote, bracket, `:` or `@`
/// (`user@host:/home/user/x`), without a `file://` before it.
static PATH_IN_TEXT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r#"(?:^|[\s"'(\[=,;<>`:@])(?:file://)?((?:[A-Za-z]:)?[/\\][^\s"'<>|()\[\],;`]*|~/[^\s"'<>|()\[\],;`]*)"#,
    )
    .unwrap()
});
static USER_AT_HOST: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b([A-Za-z0-9][A-Za-z0-9._-]*)@([A-Za-z0-9][A-Za-z0-9-]*(?:\.[A-Za-z0-9-]+)*)\b")
        .unwrap()
});

/// A path split into components; `/`, `\` and a drive letter all understood.
struct SplitPath<'a> {
    /// Components, the drive (`C:`) or UNC host first when present.
    parts: Vec<&'a str>,
    /// Index of the first component after a UNC `//host`.
    unc_host: bool,
    tilde: bool,
}

fn split_path(path: &str) -> SplitPath<'_> {
    let unc_host = path.starts_with("//") || path.starts_with("\\\\");
    let tilde = path.starts_with("~/");
    let body = if tilde { &path[2..] } else { path };
    let parts = body
        .split(['/', '\\'])
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    SplitPath {
        parts,
        unc_host,
        tilde,
    }
}

fn is_absolute(s: &str) -> bool {
    let b = s.as_bytes();
    s.starts_with('/')
        || s.starts_with('\\')
        || s.starts_with("~/")
        || (b.len() > 2
            && b[0].is_ascii_alphabetic()
            && b[1] == b':'
            && (b[2] == b'/' || b[2] == b'\\'))
}

/// Where a path's personal part ends and which names it shows.
struct Personal {
    /// Components up to and including the user's folder.
    prefix: usize,
    user: Option<String>,
    host: Option<String>,
}

fn personal(sp: &SplitPath) -> Personal {
    let p = &sp.parts;
    let mut out = Personal {
        prefix: 0,
        user: None,
        host: None,
    };
    if sp.tilde {
        out.prefix = 0;
        return out;
    }
    if sp.unc_host && !p.is_empty() {
        out.host = Some(p[0].to_string());
        out.prefix = 1;
    }
    if p.first() == Some(&"net") && p.len() > 2 {
        out.host = Some(p[1].to_string());
        out.prefix = 2;
    }
    if p.first() == Some(&"root") {
        out.prefix = 1;
    }
    // `//host/share/NAME`: the folder under a share is a user's.
    let start = if sp.unc_host && p.len() > 3 {
        out.prefix = 3;
        if !is_generic(p[2]) {
            out.user = Some(p[2].to_string());
        }
        3
    } else {
        0
    };
    for i in start..p.len().saturating_sub(1) {
        let Some((skip, home)) = user_folder(p[i]) else {
            continue;
        };
        // Sharded homes: /global/homes/g/NAME, /pscratch/sd/g/NAME.
        let mut j = i + 1 + skip;
        while j + 1 < p.len() && p[j].len() <= 2 {
            j += 1;
        }
        if j >= p.len() || (j + 1 == p.len() && !home) {
            break;
        }
        // A path that ends at the user's folder is all personal.
        out.prefix = out.prefix.max((j + 1).min(p.len()));
        if !is_generic(p[j]) {
            out.user = Some(p[j].to_string());
        }
        break;
    }
    out
}

/// Cuts paths; built once from every absolute path of the snapshot.
struct PathCutter {
    /// Cluster key -> components shared by every path of the cluster.
    common: BTreeMap<String, Vec<String>>,
}

/// How a path is cut when a rule other than the shared-folder one applies.
fn cut_by_rule(sp: &SplitPath) -> Option<String> {
    cut_library(sp).or_else(|| cut_temporary(sp))
}

/// How a library's file is cut: an installed package from its root, the standard
/// library from `pythonX.Y/`, a tree built from source from its top, code torch
/// generated from `torchinductor/`. None for any other file.
fn cut_library(sp: &SplitPath) -> Option<String> {
    let p = &sp.parts;
    let join = |from: usize| p[from..].join("/");
    if let Some(i) = p
        .iter()
        .rposition(|c| *c == "site-packages" || *c == "dist-packages")
    {
        return Some(if i + 1 < p.len() {
            join(i + 1)
        } else {
            p[i].to_string()
        });
    }
    for i in 0..p.len().saturating_sub(1) {
        let (c, next) = (p[i], p[i + 1]);
        if (c == "lib" || c == "lib64" || c == "Lib") && PYTHON_DIR.is_match(next) {
            return Some(join(i + 1));
        }
        if WINDOWS_PYTHON_DIR.is_match(c) && next.eq_ignore_ascii_case("lib") {
            return Some(join(i));
        }
        if CONDA_BUILD.is_match(c) && next == "work" {
            return Some(join(i));
        }
    }
    if let Some(i) = p.iter().position(|c| VERSIONED_TREE.is_match(c)) {
        return Some(join(i));
    }
    if let Some(i) = p.iter().position(|c| c.starts_with("torchinductor_")) {
        let rest = join(i + 1);
        return Some(if rest.is_empty() {
            "torchinductor".into()
        } else {
            format!("torchinductor/{rest}")
        });
    }
    None
}

/// How a file below a temporary folder is cut (a notebook's cells, a script run from
/// there: the user's own code).
fn cut_temporary(sp: &SplitPath) -> Option<String> {
    let p = &sp.parts;
    let join = |from: usize| p[from..].join("/");
    // Temporary folders: /tmp, /var/tmp, macOS /var/folders/../T, Windows ...\Temp.
    if p.first() == Some(&"tmp") && p.len() > 1 {
        return Some(join(1));
    }
    if p.len() > 2 && p[0] == "var" && p[1] == "tmp" {
        return Some(join(2));
    }
    if let Some(f) = p.iter().position(|c| *c == "folders")
        && let Some(t) = p[f..].iter().position(|c| *c == "T")
        && f + t + 1 < p.len()
    {
        return Some(join(f + t + 1));
    }
    if let Some(i) = p.iter().position(|c| c.eq_ignore_ascii_case("temp"))
        && i + 1 < p.len()
    {
        return Some(join(i + 1));
    }
    None
}

/// The cluster of a path cut by the shared-folder rule: its personal folder, or its
/// first two components.
fn cluster_key(sp: &SplitPath, personal: &Personal) -> (String, usize) {
    let dir_len = sp.parts.len().saturating_sub(1);
    let key_len = if personal.prefix > 0 {
        personal.prefix
    } else {
        2.min(dir_len)
    };
    let mut key = sp.parts[..key_len.min(sp.parts.len())].join("/");
    if sp.tilde {
        key.insert_str(0, "~/");
    }
    (key, key_len)
}

impl PathCutter {
    fn new<'a>(paths: impl Iterator<Item = &'a str>) -> Self {
        let mut common: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for path in paths {
            let sp = split_path(path);
            if sp.parts.is_empty() || cut_by_rule(&sp).is_some() {
                continue;
            }
            let who = personal(&sp);
            let (key, _) = cluster_key(&sp, &who);
            let dir = &sp.parts[..sp.parts.len() - 1];
            match common.get_mut(&key) {
                Some(c) => {
                    let shared = c.iter().zip(dir).take_while(|(a, b)| a == b).count();
                    c.truncate(shared);
                }
                None => {
                    common.insert(key, dir.iter().map(|s| s.to_string()).collect());
                }
            }
        }
        PathCutter { common }
    }

    fn cut(&self, path: &str) -> String {
        let sp = split_path(path);
        if sp.parts.is_empty() {
            return String::new();
        }
        if let Some(cut) = cut_by_rule(&sp) {
            return cut;
        }
        let who = personal(&sp);
        let last = sp.parts.len() - 1;
        // A checkout holding a package of its own name (torchtitan/torchtitan/...): from
        // the package.
        if let Some(i) =
            (who.prefix..last.saturating_sub(1)).find(|&i| sp.parts[i] == sp.parts[i + 1])
        {
            return sp.parts[i + 1..].join("/");
        }
        // Else below the folder all paths of the same root share, never keeping
        // anything at or above the user's folder, always keeping the file name.
        let (key, _) = cluster_key(&sp, &who);
        let shared = self.common.get(&key).map_or(0, |c| c.len());
        let start = shared.max(who.prefix).min(last);
        sp.parts[start..].join("/")
    }
}

/// Finds absolute paths inside text; gives (start, end) byte ranges.
fn paths_in_text(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for c in PATH_IN_TEXT.captures_iter(text) {
        let m = c.get(1).expect("group 1 always takes part");
        let mut end = m.end();
        while end > m.start() && matches!(text.as_bytes()[end - 1], b'.' | b':') {
            end -= 1;
        }
        let path = &text[m.start()..end];
        let separators = path.matches(['/', '\\']).count();
        if separators >= 2 {
            out.push((m.start(), end));
        }
    }
    out
}

/// Replaces user names, host names and given words where they stand as whole words.
struct Scrubber {
    re: Option<Regex>,
    replacement: FxMap<String, &'static str>,
}

impl Scrubber {
    fn new(names: &FoundNames) -> Self {
        let mut replacement: FxMap<String, &'static str> = FxMap::default();
        let groups: [(&[String], &'static str); 3] = [
            (&names.words, WORD),
            (&names.hosts, HOST),
            (&names.users, USER),
        ];
        for (list, with) in groups {
            for n in list {
                replacement.entry(n.to_lowercase()).or_insert(with);
            }
        }
        let mut all: Vec<&String> = replacement.keys().collect();
        // Longest first, so that a name inside a longer one does not win.
        all.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
        let re = (!all.is_empty()).then(|| {
            let alternation: Vec<String> = all.iter().map(|n| regex::escape(n)).collect();
            Regex::new(&format!(r"(?i)\b(?:{})\b", alternation.join("|")))
                .expect("escaped names form a valid pattern")
        });
        Scrubber { re, replacement }
    }

    fn scrub(&self, text: &str) -> String {
        match &self.re {
            Some(re) => re
                .replace_all(text, |c: &regex::Captures| {
                    let found = c[0].to_lowercase();
                    self.replacement
                        .get(&found)
                        .copied()
                        .unwrap_or(WORD)
                        .to_string()
                })
                .into_owned(),
            None => text.to_string(),
        }
    }
}

/// A name is used as a whole word only when it starts and ends with a letter or digit
/// and is not a generic account name.
fn usable_name(n: &str) -> bool {
    n.chars().count() >= 2
        && n.chars().next().is_some_and(|c| c.is_alphanumeric())
        && n.chars().last().is_some_and(|c| c.is_alphanumeric())
        && !is_generic(n)
}

struct Hasher24 {
    k0: u64,
    k1: u64,
}

/// The fixed key used without a salt ("vramlens", "redact\0\0").
const FIXED_KEY: (u64, u64) = (0x7672_616d_6c65_6e73, 0x7265_6461_6374_0000);

impl Hasher24 {
    fn new(salt: Option<&str>) -> Self {
        let (k0, k1) = match salt {
            None => FIXED_KEY,
            Some(s) => {
                let derive = |tag: u8| {
                    let mut h = SipHasher24::new_with_keys(FIXED_KEY.0, FIXED_KEY.1);
                    h.write(&[tag]);
                    h.write(s.as_bytes());
                    h.finish()
                };
                (derive(0), derive(1))
            }
        };
        Hasher24 { k0, k1 }
    }

    fn hash(&self, parts: &[&[u8]]) -> u64 {
        let mut h = SipHasher24::new_with_keys(self.k0, self.k1);
        for p in parts {
            h.write(&(p.len() as u64).to_le_bytes());
            h.write(p);
        }
        h.finish()
    }

    fn label(&self, prefix: &str, s: &str) -> String {
        format!("{prefix}{:016x}", self.hash(&[s.as_bytes()]))
    }
}

/// Strings with no letter or digit carry no name and no code (`??`, `<unknown>` aside).
fn carries_nothing(s: &str) -> bool {
    !s.chars().any(|c| c.is_alphanumeric())
}

/// Whether a frame's file is a library's rather than the user's own: an installed
/// package (`site-packages`, `dist-packages`), Python's standard library (`pythonX.Y/`, a
/// Windows `PythonXY/Lib`, a module frozen into the interpreter), code torch generated
/// (`torchinductor_NAME/`), or a C or C++ source of a tree built from source
/// (`python-3.10.14/Objects/call.c`, `glibc-2.31/...`; not a `.py` file, which may be a
/// checkout of the user's named like a release).
fn is_library_file(file: &str) -> bool {
    if file.starts_with("<frozen ") {
        return true;
    }
    if !is_absolute(file) {
        return false;
    }
    let sp = split_path(file);
    let p = &sp.parts;
    let python_dir = p.windows(2).any(|w| {
        ((w[0] == "lib" || w[0] == "lib64" || w[0] == "Lib") && PYTHON_DIR.is_match(w[1]))
            || (WINDOWS_PYTHON_DIR.is_match(w[0]) && w[1].eq_ignore_ascii_case("lib"))
    });
    p.iter()
        .any(|c| *c == "site-packages" || *c == "dist-packages" || c.starts_with("torchinductor_"))
        || python_dir
        || (!file.ends_with(".py") && cut_library(&sp).is_some())
}

/// Namespaces and prefixes of native code that is torch's (`at::`, `c10::`, `c10d::`,
/// `torch::`, `caffe2::`, its Python bindings `THP...`), CPython's (`Py...`, `_Py...`),
/// pybind11's, the C++ library's or the C runtime's.
const LIBRARY_NATIVE: [&str; 14] = [
    "at::",
    "c10::",
    "c10d::",
    "torch::",
    "caffe2::",
    "pybind11::",
    "std::",
    "__gnu_cxx::",
    "THP",
    "Py",
    "_Py",
    "__libc_",
    "_start",
    "start_thread",
];

/// Whether a native frame's function (`[return type ]qualified::name(arguments)`) is a
/// library's: its qualified name, not its return or argument types, starts in
/// [`LIBRARY_NATIVE`].
fn is_library_native(name: &str) -> bool {
    let name = name.replace("(anonymous namespace)", "{anonymous}");
    // The qualified name: from the last space outside template arguments up to the
    // arguments (the first `(` outside template arguments).
    let (mut depth, mut start, mut end) = (0i32, 0, name.len());
    for (i, c) in name.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            ' ' if depth == 0 => start = i + 1,
            '(' if depth == 0 => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let head = name[start.min(end)..end].trim_start_matches(['*', '&']);
    let head = head.strip_prefix("{anonymous}::").unwrap_or(head);
    LIBRARY_NATIVE.iter().any(|p| head.starts_with(p))
}

/// With `strip_code`, what a frame keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FrameKeeps {
    /// Nothing: its name and line are hashed (the user's own code).
    Nothing,
    /// Its name, which a category rule reads; its line is hashed.
    Name,
    /// Its name and line: a library's frame.
    NameAndLine,
}

/// Rewrites the strings of `snap`; see the module documentation for the rules.
pub fn apply(snap: &mut Snapshot, options: &RedactOptions) -> RedactReport {
    let mut r = Redactor::new(snap, options);
    r.rewrite(snap);
    r.report
}

/// The paths of the files a command was given (snapshots, traces, logs) as `--redact`
/// shows them. Each should be absolute (the caller joins a relative one to the working
/// folder, which may itself be a home folder). By the rule for your own files: each is cut
/// below the folder all the absolute ones share, never keeping anything at or above a
/// user's folder and always keeping the file name (`/home/alice/runs/a/x.pickle` and
/// `/home/alice/runs/b/x.pickle` become `a/x.pickle` and `b/x.pickle`; one file alone, its
/// name); then the user and host names their full paths show, and `scrub` words, are
/// removed from what is left. `-` (standard input) and paths matching `keep` stay.
pub fn input_paths(paths: &[String], options: &RedactOptions) -> Vec<String> {
    let mut users = BTreeSet::new();
    let mut hosts = BTreeSet::new();
    for p in paths {
        names_in(p, true, &mut users, &mut hosts);
    }
    let names = FoundNames::of(users, hosts, options);
    let scrubber = Scrubber::new(&names);
    let kept = |p: &str| p == "-" || options.keep.iter().any(|k| k.is_match(p));
    // The folder every absolute input shares.
    let mut shared: Option<Vec<&str>> = None;
    for p in paths.iter().filter(|p| is_absolute(p) && !kept(p)) {
        let sp = split_path(p);
        let dir = &sp.parts[..sp.parts.len().saturating_sub(1)];
        shared = Some(match shared {
            None => dir.to_vec(),
            Some(c) => {
                let n = c.iter().zip(dir).take_while(|(a, b)| a == b).count();
                c[..n].to_vec()
            }
        });
    }
    let shared = shared.map_or(0, |c| c.len());
    paths
        .iter()
        .map(|p| {
            if kept(p) {
                return p.clone();
            }
            let cut = if is_absolute(p) {
                let sp = split_path(p);
                let last = sp.parts.len().saturating_sub(1);
                let start = shared.max(personal(&sp).prefix).min(last);
                sp.parts[start..].join("/")
            } else {
                p.clone()
            };
            scrubber.scrub(&cut)
        })
        .collect()
}

/// Redacts names from outside a snapshot (a profiler trace's `record_function` ranges) by
/// the rules for annotation names.
pub fn annotation_names(names: &mut [String], options: &RedactOptions) {
    let mut snap = Snapshot {
        external_annotations: names
            .iter()
            .map(|n| crate::model::Annotation {
                name: n.clone(),
                stage: "START".into(),
                device: 0,
                time_us: 0,
            })
            .collect(),
        ..Snapshot::default()
    };
    apply(&mut snap, options);
    for (n, a) in names.iter_mut().zip(snap.external_annotations) {
        *n = a.name;
    }
}

/// Where a distinct string was seen.
type Seen = BTreeMap<(Field, StrId), u64>;

struct Redactor<'o> {
    options: &'o RedactOptions,
    cutter: PathCutter,
    scrubber: Scrubber,
    hasher: Hasher24,
    /// Output for each (field, original) computed so far.
    text_out: FxMap<(Field, String), String>,
    /// File and function names after redaction, made distinct (with `strip_code`,
    /// function names as hashed).
    id_out: FxMap<(Field, StrId), String>,
    /// With `strip_code`, function names as kept (paths cut, names removed) by the frames
    /// that keep them.
    kept_names: FxMap<StrId, String>,
    /// With `strip_code`, what each frame keeps, by frame id.
    frame_keeps: Vec<FrameKeeps>,
    report: RedactReport,
    /// Changes of string-valued fields, merged into the report at the end.
    string_changes: BTreeMap<(Field, String), (String, u64)>,
    protected: BTreeSet<(Field, String)>,
}

/// Every string id a snapshot refers to, by field, with the places that hold it.
fn gather_ids(snap: &mut Snapshot) -> Seen {
    let mut seen = Seen::new();
    for i in 0..snap.frames.frame_count() {
        let f = snap.frames.frame(crate::model::FrameId(i as u32));
        *seen.entry((Field::Filename, f.filename)).or_insert(0) += 1;
        *seen.entry((Field::Function, f.name)).or_insert(0) += 1;
    }
    let traces = snap
        .device_traces
        .iter_mut()
        .chain(std::iter::once(&mut snap.host_trace));
    for t in traces {
        for (tag, id) in t.strings_mut() {
            if let Some(field) = trace_field(tag) {
                *seen.entry((field, *id)).or_insert(0) += 1;
            }
        }
    }
    // A block state vramlens does not know is text of the file like any other.
    for seg in snap.segments.iter().chain(&snap.host_segments) {
        for b in &seg.blocks {
            if let BlockState::Other(id) = b.state {
                *seen.entry((Field::OtherKey, id)).or_insert(0) += 1;
            }
        }
    }
    for ids in snap.extras.forward_frames.values() {
        for &id in ids {
            *seen.entry((Field::ForwardFrames, id)).or_insert(0) += 1;
        }
    }
    for h in snap.extras.history.values() {
        for rec in &h.records {
            if let Some(id) = rec.cpp_frames {
                *seen.entry((Field::CppFrames, id)).or_insert(0) += 1;
            }
        }
    }
    seen
}

fn trace_field(tag: TraceString) -> Option<Field> {
    match tag {
        // An action vramlens does not know is text of the file like any other.
        TraceString::OtherAction => Some(Field::OtherKey),
        TraceString::CompileContext => Some(Field::CompileContext),
        TraceString::UserMetadata => Some(Field::UserMetadata),
        TraceString::InternalMetadata => Some(Field::InternalMetadata),
        TraceString::CppFrames => Some(Field::CppFrames),
        TraceString::ForwardFrames => Some(Field::ForwardFrames),
    }
}

/// Every free-text string held as a `String`: annotation names, settings (their keys,
/// `PYTORCH_CUDA_ALLOC_CONF` and nested dicts among them), names and values of keys the
/// model does not interpret (bytes read as text), wherever they stand.
fn free_strings(snap: &mut Snapshot, f: &mut dyn FnMut(Field, &mut String)) {
    for a in &mut snap.external_annotations {
        f(Field::Annotation, &mut a.name);
    }
    if let Some(settings) = &mut snap.allocator_settings {
        for (mut k, mut v) in std::mem::take(settings) {
            f(Field::Setting, &mut k);
            json_strings(&mut v, &mut |s| f(Field::Setting, s));
            settings.insert(k, v);
        }
    }
    let extras = &mut snap.extras;
    let mut each = |keys: &mut ExtraKeys| {
        for (k, v) in keys.iter_mut() {
            f(Field::OtherKey, k);
            v.strings_mut(&mut |s| f(Field::OtherKey, s));
        }
    };
    for keys in extras.keys.values_mut() {
        each(keys);
    }
    for h in extras.history.values_mut() {
        for rec in &mut h.records {
            each(&mut rec.extra);
        }
    }
    let traces = snap
        .device_traces
        .iter_mut()
        .chain(std::iter::once(&mut snap.host_trace));
    for t in traces {
        for keys in t.extra_keys_mut() {
            each(keys);
        }
    }
}

/// Strings of a JSON value, object keys among them.
fn json_strings(v: &mut serde_json::Value, f: &mut dyn FnMut(&mut String)) {
    match v {
        serde_json::Value::String(s) => f(s),
        serde_json::Value::Array(items) => items.iter_mut().for_each(|i| json_strings(i, f)),
        serde_json::Value::Object(map) => {
            for (mut k, mut item) in std::mem::take(map) {
                f(&mut k);
                json_strings(&mut item, f);
                map.insert(k, item);
            }
        }
        _ => {}
    }
}

/// Names a text shows: users and hosts of its paths and of `user@host`.
fn names_in(
    text: &str,
    whole_path: bool,
    users: &mut BTreeSet<String>,
    hosts: &mut BTreeSet<String>,
) {
    let mut from_path = |path: &str| {
        let sp = split_path(path);
        let who = personal(&sp);
        users.extend(who.user);
        hosts.extend(who.host);
        if let Some(i) = sp
            .parts
            .iter()
            .position(|c| c.starts_with("torchinductor_"))
        {
            let name = &sp.parts[i]["torchinductor_".len()..];
            if !name.is_empty() && !is_generic(name) {
                users.insert(name.to_string());
            }
        }
    };
    if whole_path {
        if is_absolute(text) {
            from_path(text);
        }
    } else {
        for (a, b) in paths_in_text(text) {
            from_path(&text[a..b]);
        }
        for c in USER_AT_HOST.captures_iter(text) {
            users.insert(c[1].to_string());
            hosts.insert(c[2].to_string());
        }
    }
}

impl<'o> Redactor<'o> {
    fn new(snap: &mut Snapshot, options: &'o RedactOptions) -> Self {
        let seen = gather_ids(snap);
        // Every text that may hold a path or a name.
        let mut texts: Vec<(Field, String)> = seen
            .keys()
            .map(|&(field, id)| (field, snap.frames.str(id).to_string()))
            .collect();
        free_strings(snap, &mut |field, s| texts.push((field, s.clone())));

        let mut users = BTreeSet::new();
        let mut hosts = BTreeSet::new();
        let mut paths: Vec<String> = Vec::new();
        for (field, text) in &texts {
            let whole = *field == Field::Filename;
            names_in(text, whole, &mut users, &mut hosts);
            if options.keep.iter().any(|k| k.is_match(text)) {
                continue;
            }
            if whole {
                if is_absolute(text) {
                    paths.push(text.clone());
                }
            } else {
                paths.extend(
                    paths_in_text(text)
                        .into_iter()
                        .map(|(a, b)| text[a..b].to_string()),
                );
            }
        }
        let names = FoundNames::of(users, hosts, options);
        let mut r = Redactor {
            options,
            cutter: PathCutter::new(paths.iter().map(String::as_str)),
            scrubber: Scrubber::new(&names),
            hasher: Hasher24::new(options.salt.as_deref()),
            text_out: FxMap::default(),
            id_out: FxMap::default(),
            kept_names: FxMap::default(),
            frame_keeps: Vec::new(),
            report: RedactReport {
                names,
                ..Default::default()
            },
            string_changes: BTreeMap::new(),
            protected: BTreeSet::new(),
        };
        r.plan_ids(snap, &seen);
        r
    }

    fn kept(&self, s: &str) -> bool {
        self.options.keep.iter().any(|k| k.is_match(s))
    }

    /// Cuts every path inside a text, then removes names.
    fn clean_text(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for (a, b) in paths_in_text(text) {
            out.push_str(&text[last..a]);
            out.push_str(&self.cutter.cut(&text[a..b]));
            last = b;
        }
        out.push_str(&text[last..]);
        self.scrubber.scrub(&out)
    }

    /// The rules for one string of a field (before file and function names are made
    /// distinct).
    fn rule(&self, field: Field, s: &str) -> String {
        let mode = match field {
            Field::Annotation => self.options.annotations,
            Field::UserMetadata => self.options.metadata,
            Field::CppFrames | Field::ForwardFrames if self.options.strip_code => TextMode::Hash,
            // A compiled region names generated code and the function compiled.
            Field::CompileContext if self.options.strip_code && s != "N/A" => TextMode::Hash,
            _ => TextMode::Keep,
        };
        match field {
            Field::Filename => {
                if is_absolute(s) {
                    self.scrubber.scrub(&self.cutter.cut(s))
                } else {
                    self.scrubber.scrub(s)
                }
            }
            Field::Function if self.options.strip_code && !carries_nothing(s) => {
                self.hasher.label("f_", s)
            }
            // Names made from profiler ranges may hold paths.
            Field::Function => self.clean_text(s),
            _ => match mode {
                _ if s.is_empty() => String::new(),
                TextMode::Keep => self.clean_text(s),
                TextMode::Drop => String::new(),
                TextMode::Hash => {
                    let prefix = match field {
                        Field::Annotation => "a_",
                        Field::UserMetadata => "m_",
                        _ => "c_",
                    };
                    self.hasher.label(prefix, s)
                }
            },
        }
    }

    /// Decides the output of every interned string, keeping file and function names
    /// distinct.
    fn plan_ids(&mut self, snap: &Snapshot, seen: &Seen) {
        // Per distinct name, its outputs and how many frames take each: (id, kept form,
        // output, changed, places).
        let mut changes: Vec<(Field, StrId, String, u64)> = Vec::new();
        for field in [Field::Filename, Field::Function] {
            if field == Field::Function && self.options.strip_code {
                self.plan_frame_keeps(snap);
            }
            // (id, kept form, output, changed, places)
            let mut planned: Vec<(StrId, bool, String, bool, u64)> = Vec::new();
            let mut used: HashSet<String> = HashSet::new();
            let forms = self.forms(snap, seen, field);
            for (id, kept_form, places) in forms {
                let s = snap.frames.str(id);
                let out = if kept_form {
                    self.clean_text(s)
                } else {
                    self.rule(field, s)
                };
                if out == s {
                    used.insert(out.clone());
                    planned.push((id, kept_form, out, false, places));
                } else if self.kept(s) {
                    self.protected.insert((field, s.to_string()));
                    used.insert(s.to_string());
                    planned.push((id, kept_form, s.to_string(), false, places));
                } else {
                    planned.push((id, kept_form, out, true, places));
                }
            }
            for (id, kept_form, out, changed, places) in &mut planned {
                if *changed {
                    let mut candidate = out.clone();
                    let mut k = 2;
                    while used.contains(&candidate) {
                        candidate = format!("{out} [{k}]");
                        k += 1;
                    }
                    used.insert(candidate.clone());
                    *out = candidate;
                }
                if snap.frames.str(*id) != out.as_str() {
                    changes.push((field, *id, out.clone(), *places));
                }
                if *kept_form && field == Field::Function && self.options.strip_code {
                    self.kept_names.insert(*id, std::mem::take(out));
                } else {
                    self.id_out.insert((field, *id), std::mem::take(out));
                }
            }
        }
        for (field, id, out, places) in changes {
            self.report.changes.push(Change {
                field,
                original: snap.frames.str(id).to_string(),
                redacted: out,
                count: places,
            });
        }
        for (&(field, id), &count) in seen {
            if matches!(field, Field::Filename | Field::Function) {
                continue;
            }
            let original = snap.frames.str(id);
            let out = self.output(field, original);
            if out != original {
                self.report.changes.push(Change {
                    field,
                    original: original.to_string(),
                    redacted: out.clone(),
                    count,
                });
            }
            self.id_out.insert((field, id), out);
        }
    }

    /// The forms a file or function name takes, with the frames that hold each: (id,
    /// kept form, places). File names, and function names without `strip_code`, take
    /// one; with it, a function name is hashed where its frame keeps nothing and kept
    /// (cleaned) where its frame keeps it, and takes one form where both are the same
    /// text (a name with no letter or digit).
    fn forms(&self, snap: &Snapshot, seen: &Seen, field: Field) -> Vec<(StrId, bool, u64)> {
        let strip = field == Field::Function && self.options.strip_code;
        if !strip {
            return seen
                .iter()
                .filter(|((f, _), _)| *f == field)
                .map(|(&(_, id), &n)| (id, false, n))
                .collect();
        }
        // (hashed, kept) frame counts per name.
        let mut counts: BTreeMap<StrId, (u64, u64)> = BTreeMap::new();
        for (i, keeps) in self.frame_keeps.iter().enumerate() {
            let f = snap.frames.frame(crate::model::FrameId(i as u32));
            let c = counts.entry(f.name).or_default();
            if *keeps == FrameKeeps::Nothing && !carries_nothing(snap.frames.str(f.name)) {
                c.0 += 1;
            } else {
                c.1 += 1;
            }
        }
        let mut out = Vec::new();
        for (id, (hashed, kept)) in counts {
            if hashed > 0 {
                out.push((id, false, hashed));
            }
            if kept > 0 {
                out.push((id, true, kept));
            }
        }
        out
    }

    /// With `strip_code`, what each frame keeps: a library's frame its name and line
    /// (they identify nobody); a frame of the user's own code its name where hashing the
    /// name would change what the category rules read of the frame
    /// ([`frame_evidence`](crate::analysis::kinds::attribution::frame_evidence), on the file
    /// name as cut), so that every command decides the same categories on the copy;
    /// else nothing.
    fn plan_frame_keeps(&mut self, snap: &Snapshot) {
        use crate::analysis::kinds::attribution::frame_evidence;
        let frames = &snap.frames;
        self.frame_keeps = (0..frames.frame_count())
            .map(|i| {
                let f = frames.frame(crate::model::FrameId(i as u32));
                let file = frames.str(f.filename);
                let name = frames.str(f.name);
                let python = file.ends_with(".py") || file.starts_with('<');
                let library = if python || is_absolute(file) {
                    is_library_file(file)
                } else {
                    is_library_native(name)
                };
                if library {
                    return FrameKeeps::NameAndLine;
                }
                // Rules read line numbers only as digits, which a hashed line still is.
                let cut = &self.id_out[&(Field::Filename, f.filename)];
                let hashed = self.hasher.label("f_", name);
                if frame_evidence(cut, f.line, name) != frame_evidence(cut, f.line, &hashed) {
                    FrameKeeps::Name
                } else {
                    FrameKeeps::Nothing
                }
            })
            .collect();
    }

    /// The output for a free-text string (cached by value).
    fn output(&mut self, field: Field, s: &str) -> String {
        if let Some(out) = self.text_out.get(&(field, s.to_string())) {
            return out.clone();
        }
        let mut out = self.rule(field, s);
        if out != s && self.kept(s) {
            self.protected.insert((field, s.to_string()));
            out = s.to_string();
        }
        self.text_out.insert((field, s.to_string()), out.clone());
        out
    }

    fn rewrite(&mut self, snap: &mut Snapshot) {
        // Frames keep their ids: file and function names stay distinct, and line
        // numbers are replaced injectively within each (file, function).
        let old = std::mem::take(&mut snap.frames);
        let mut table = FrameTable::new();
        let mut lines_used: FxMap<(StrId, StrId), HashSet<i64>> = FxMap::default();
        for i in 0..old.frame_count() {
            let f = old.frame(crate::model::FrameId(i as u32));
            let filename = table.intern_str(&self.id_out[&(Field::Filename, f.filename)]);
            let keeps = self
                .frame_keeps
                .get(i)
                .copied()
                .unwrap_or(FrameKeeps::Nothing);
            let name = match self.kept_names.get(&f.name) {
                Some(kept)
                    if keeps != FrameKeeps::Nothing
                        || !self.id_out.contains_key(&(Field::Function, f.name)) =>
                {
                    table.intern_str(kept)
                }
                _ => table.intern_str(&self.id_out[&(Field::Function, f.name)]),
            };
            let line = if self.options.strip_code && f.line > 0 && keeps != FrameKeeps::NameAndLine
            {
                let used = lines_used.entry((f.filename, f.name)).or_default();
                // The cut file name, so that a frame of an installed package gets the
                // same hash on every machine.
                let file = &self.id_out[&(Field::Filename, f.filename)];
                let mut h = self.line_hash(file, old.str(f.name), f.line);
                while used.contains(&h) {
                    h = h % (i32::MAX as i64) + 1;
                }
                used.insert(h);
                self.report.lines_replaced += 1;
                h
            } else {
                f.line
            };
            let id = table.intern_frame(Frame {
                filename,
                name,
                line,
            });
            debug_assert_eq!(id.0 as usize, i, "redaction merged two frames");
        }
        for s in 0..old.stack_count() {
            let id = table.intern_stack(old.stack(crate::model::StackId(s as u32)));
            debug_assert_eq!(id.0 as usize, s, "redaction merged two stacks");
        }
        let mut remap = |field: Option<Field>, id: StrId| -> StrId {
            match field {
                Some(f) => table.intern_str(&self.id_out[&(f, id)]),
                None => table.intern_str(old.str(id)),
            }
        };
        let drop_metadata = self.options.metadata == TextMode::Drop;
        let traces = snap
            .device_traces
            .iter_mut()
            .chain(std::iter::once(&mut snap.host_trace));
        for t in traces {
            for (tag, id) in t.strings_mut() {
                *id = remap(trace_field(tag), *id);
            }
            if drop_metadata {
                t.clear_user_metadata();
            }
        }
        for s in snap
            .segments
            .iter_mut()
            .chain(snap.host_segments.iter_mut())
        {
            for b in &mut s.blocks {
                if let BlockState::Other(id) = b.state {
                    b.state = BlockState::Other(remap(Some(Field::OtherKey), id));
                }
            }
        }
        for ids in snap.extras.forward_frames.values_mut() {
            for id in ids.iter_mut() {
                *id = remap(Some(Field::ForwardFrames), *id);
            }
        }
        for h in snap.extras.history.values_mut() {
            for rec in &mut h.records {
                if let Some(id) = rec.cpp_frames {
                    rec.cpp_frames = Some(remap(Some(Field::CppFrames), id));
                }
            }
        }
        snap.frames = table;

        let mut changes = std::mem::take(&mut self.string_changes);
        free_strings(snap, &mut |field, s| {
            let out = self.output(field, s);
            if out != *s {
                let entry = changes
                    .entry((field, std::mem::take(s)))
                    .or_insert_with(|| (out.clone(), 0));
                entry.1 += 1;
                *s = out;
            }
        });
        // Warnings quote what the file had (an unknown key's name): they show what the
        // rest shows, cleaned by the same rules.
        let warnings = std::mem::take(&mut snap.warnings.0);
        for (mut warning, count) in warnings {
            if let Some(name) = warning.quoted_mut() {
                *name = self.clean_text(name);
            }
            *snap.warnings.0.entry(warning).or_insert(0) += count;
        }
        for ((field, original), (redacted, count)) in changes {
            self.report.changes.push(Change {
                field,
                original,
                redacted,
                count,
            });
        }
        self.report
            .changes
            .sort_by(|a, b| (a.field, &a.original).cmp(&(b.field, &b.original)));
        self.report.kept_by_pattern = self.protected.len() as u64;
    }

    /// A line number in 1..2^31 from a keyed hash of the frame.
    fn line_hash(&self, filename: &str, name: &str, line: i64) -> i64 {
        let h = self.hasher.hash(&[
            b"line",
            filename.as_bytes(),
            name.as_bytes(),
            &line.to_le_bytes(),
        ]);
        (h % (i32::MAX as u64)) as i64 + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut_all(paths: &[&str]) -> Vec<String> {
        let cutter = PathCutter::new(paths.iter().copied());
        paths.iter().map(|p| cutter.cut(p)).collect()
    }

    #[test]
    fn installed_packages_and_interpreters_are_cut_at_their_root() {
        let got = cut_all(&[
            "/home/alice/miniconda3/envs/x/lib/python3.10/site-packages/torch/nn/modules/module.py",
            "/usr/local/lib/python3.10/dist-packages/vllm/worker/worker.py",
            "/home/alice/.conda/envs/flexgen/lib/python3.9/threading.py",
            "/oscar/home/jsolt/FourierNN/myenv/lib64/python3.9/site-packages/torch/optim/adam.py",
            "C:/Users/Jo/AppData/Local/Programs/Python/Python310/lib/threading.py",
            "/usr/local/src/conda/python-3.10.14/Objects/call.c",
            "/build/glibc-B3wQXB/glibc-2.31/nptl/pthread_create.c",
            "/croot/python-split_1715024085344/work/build-static/Python/ceval.c",
            "/tmp/torchinductor_alice/qo/cqoabc.py",
            "/tmp/ipykernel_2591349/2415349784.py",
            "/var/folders/xy/abc123/T/tmpf00/x.py",
        ]);
        assert_eq!(
            got,
            [
                "torch/nn/modules/module.py",
                "vllm/worker/worker.py",
                "python3.9/threading.py",
                "torch/optim/adam.py",
                "Python310/lib/threading.py",
                "python-3.10.14/Objects/call.c",
                "glibc-2.31/nptl/pthread_create.c",
                "python-split_1715024085344/work/build-static/Python/ceval.c",
                "torchinductor/qo/cqoabc.py",
                "ipykernel_2591349/2415349784.py",
                "tmpf00/x.py",
            ]
        );
    }

    #[test]
    fn own_files_are_cut_at_the_shared_project_folder() {
        let got = cut_all(&[
            "/home/alice/src/torchtitan/torchtitan/models/llama3/model.py",
            "/home/alice/src/torchtitan/scripts/run.py",
            "/mnt/mcx/select_n/bert/run.py",
            "/mnt/mcx/select_n/lib/transformers/models/bert/modeling_bert.py",
            "/root/KIVI-lmeval/test_memnew.py",
            "/root/KIVI-lmeval/models/llama.py",
            "/home/bob/a1/x.py",
            "/home/bob/a2/sub/y.py",
            "D:/Dev/assignment2-systems/cs336-basics/model.py",
            "D:/Dev/assignment2-systems/cs336_systems/run.py",
            "/pscratch/sd/g/gb555/proj/train.py",
            "/global/homes/g/gb555/x.py",
        ]);
        assert_eq!(
            got,
            [
                "torchtitan/models/llama3/model.py",
                "scripts/run.py",
                "bert/run.py",
                "lib/transformers/models/bert/modeling_bert.py",
                "test_memnew.py",
                "models/llama.py",
                "a1/x.py",
                "a2/sub/y.py",
                "cs336-basics/model.py",
                "cs336_systems/run.py",
                "train.py",
                "x.py",
            ]
        );
    }

    #[test]
    fn names_come_from_home_folders_hosts_and_addresses() {
        let (mut users, mut hosts) = (BTreeSet::new(), BTreeSet::new());
        names_in("/home/alice/x.py", true, &mut users, &mut hosts);
        names_in("/Users/Bob/y.py", true, &mut users, &mut hosts);
        names_in(
            "/tmp/torchinductor_carol/ab/c.py",
            true,
            &mut users,
            &mut hosts,
        );
        names_in(
            "/home/conda/feedstock_root/x.c",
            true,
            &mut users,
            &mut hosts,
        );
        names_in(r"\\fileserver\share\x.py", true, &mut users, &mut hosts);
        names_in(
            "run by dave@gpu-node-7.example.org at /global/homes/g/erin/z.py",
            false,
            &mut users,
            &mut hosts,
        );
        // Names met only outside home folders.
        names_in("/scratch/frank/z.py", true, &mut users, &mut hosts);
        names_in("/mnt/data/gina/z.py", true, &mut users, &mut hosts);
        names_in("//files2/share/hank/z.py", true, &mut users, &mut hosts);
        // A file right under a data folder is a file, not a user's folder.
        names_in("/mnt/data/model.py", true, &mut users, &mut hosts);
        names_in("/data/train.py", true, &mut users, &mut hosts);
        // A data set under /data is not a user's folder.
        names_in(
            "/data/imagenet/train/n01440764/x.py",
            true,
            &mut users,
            &mut hosts,
        );
        names_in("/data/home/kim2/x.py", true, &mut users, &mut hosts);
        names_in(
            "copy from ivan@box:/home/ivan2/x, see file:///home/judy/a.py",
            false,
            &mut users,
            &mut hosts,
        );
        assert_eq!(
            users.into_iter().collect::<Vec<_>>(),
            [
                "Bob", "alice", "carol", "dave", "erin", "frank", "gina", "hank", "ivan", "ivan2",
                "judy", "kim2"
            ]
        );
        assert_eq!(
            hosts.into_iter().collect::<Vec<_>>(),
            ["box", "files2", "fileserver", "gpu-node-7.example.org"]
        );
    }

    #[test]
    fn names_are_replaced_as_whole_words_only() {
        let names = FoundNames {
            users: vec!["lin".into(), "c-kaitwang".into()],
            hosts: vec!["gpu7".into()],
            words: vec!["secretproj".into()],
        };
        let s = Scrubber::new(&names);
        assert_eq!(
            s.scrub("Linear lin_layer Lin.py"),
            "Linear lin_layer <user>.py"
        );
        assert_eq!(
            s.scrub("C-KAITWANG on gpu7: SecretProj"),
            "<user> on <host>: <redacted>"
        );
        assert_eq!(Scrubber::new(&FoundNames::default()).scrub("lin"), "lin");
    }

    #[test]
    fn paths_inside_text_are_found() {
        let t = r#"File "/home/a/x.py", line 3, in f (at /opt/lib/libtorch.so) see 1/2 and C:\Users\b\y.py."#;
        let found: Vec<&str> = paths_in_text(t).iter().map(|&(a, b)| &t[a..b]).collect();
        assert_eq!(
            found,
            ["/home/a/x.py", "/opt/lib/libtorch.so", r"C:\Users\b\y.py"]
        );
        assert!(paths_in_text("Torch-Compiled Region: 0/0").is_empty());
    }

    fn snapshot(user: &str) -> Snapshot {
        let frame = |name: &str, file: &str, line: i64| serde_json::json!({"name": name, "filename": file, "line": line});
        let site = "lib/python3.10/site-packages/torch/nn/modules/module.py";
        let frames = serde_json::json!([
            frame("forward", &format!("/home/{user}/envA/{site}"), 10),
            frame("forward", &format!("/home/{user}/envB/{site}"), 10),
            frame("train", &format!("/home/{user}/proj/train.py"), 5),
            frame("train", &format!("/home/{user}/proj/train.py"), 6),
            frame("??", "", 0),
        ]);
        let json = serde_json::json!({
            "segments": [{"device": 0, "address": 1048576, "total_size": 1024,
                "allocated_size": 512, "active_size": 512, "requested_size": 500, "stream": 0,
                "segment_type": "small", "segment_pool_id": [0, 0], "is_expandable": false,
                "frames": frames,
                "blocks": [
                    {"address": 1048576, "size": 512, "requested_size": 500,
                     "state": "active_allocated", "frames": frames},
                    {"address": 1049088, "size": 512, "requested_size": 0,
                     "state": "inactive", "frames": []}]}],
            "device_traces": [[{"action": "alloc", "addr": 1048576, "size": 500, "stream": 0,
                "time_us": 1,
                "compile_context": format!("Torch-Compiled Region: 0/0 (/home/{user}/proj/train.py)"),
                "user_metadata": format!("run by {user}@gpu7.example.org"), "frames": frames}]],
            "external_annotations": [{"name": format!("step of {user}"), "stage": "START",
                "device": 0, "time_us": 1}],
        });
        crate::model::decode_json(&json).unwrap()
    }

    fn frame_strings(snap: &Snapshot) -> Vec<(String, String, i64)> {
        (0..snap.frames.frame_count())
            .map(|i| {
                let f = snap.frames.frame(crate::model::FrameId(i as u32));
                (
                    snap.frames.str(f.filename).to_string(),
                    snap.frames.str(f.name).to_string(),
                    f.line,
                )
            })
            .collect()
    }

    #[test]
    fn unknown_block_states_are_text_and_data_sets_are_not_users() {
        // A block state vramlens does not know, holding the user's name and home path,
        // and a frame under `/data/imagenet` (a data set, not a user's folder).
        let json = serde_json::json!({
            "segments": [{"device": 0, "address": 4096, "total_size": 512,
                "allocated_size": 512, "active_size": 512, "requested_size": 512, "stream": 0,
                "segment_type": "small", "segment_pool_id": [0, 0], "is_expandable": false,
                "frames": [{"name": "load_imagenet", "filename": "/data/imagenet/loader.py", "line": 3}],
                "blocks": [{"address": 4096, "size": 512, "requested_size": 512,
                    "state": "pinned by alice /home/alice/x", "frames": []}]}],
            "device_traces": [[{"action": "alloc", "addr": 4096, "size": 512, "stream": 0,
                "time_us": 1, "frames": [{"name": "f", "filename": "/home/alice/p/t.py", "line": 1}]}]],
        });
        let mut snap = crate::model::decode_json(&json).unwrap();
        let report = apply(&mut snap, &RedactOptions::default());
        let BlockState::Other(id) = snap.segments[0].blocks[0].state else {
            panic!(
                "the state stays unknown: {:?}",
                snap.segments[0].blocks[0].state
            );
        };
        // The name is replaced and the path cut, as in any other text.
        assert_eq!(snap.frames.str(id), "pinned by <user> x");
        assert_eq!(report.names.users, ["alice"]);
        let names: Vec<String> = frame_strings(&snap).into_iter().map(|f| f.1).collect();
        assert!(names.contains(&"load_imagenet".to_string()), "{names:?}");
    }

    #[test]
    fn apply_cuts_paths_removes_names_everywhere_and_keeps_frames_distinct() {
        let mut snap = snapshot("alice");
        let report = apply(&mut snap, &RedactOptions::default());
        let module = "torch/nn/modules/module.py";
        assert_eq!(
            frame_strings(&snap),
            [
                (module.to_string(), "forward".to_string(), 10),
                (format!("{module} [2]"), "forward".to_string(), 10),
                ("train.py".to_string(), "train".to_string(), 5),
                ("train.py".to_string(), "train".to_string(), 6),
                (String::new(), "??".to_string(), 0),
            ]
        );
        let t = &snap.device_traces[0];
        assert_eq!(
            snap.frames.str(t.compile_context(0).unwrap()),
            "Torch-Compiled Region: 0/0 (train.py)"
        );
        assert_eq!(
            snap.frames.str(t.user_metadata(0).unwrap()),
            "run by <user>@<host>"
        );
        assert_eq!(snap.external_annotations[0].name, "step of <user>");
        assert_eq!(report.names.users, ["alice"]);
        assert_eq!(report.names.hosts, ["gpu7.example.org"]);
        let fields: Vec<(Field, u64)> = report.changes.iter().map(|c| (c.field, c.count)).collect();
        assert_eq!(
            fields,
            [
                (Field::Filename, 1),
                (Field::Filename, 1),
                (Field::Filename, 2),
                (Field::Annotation, 1),
                (Field::UserMetadata, 1),
                (Field::CompileContext, 1),
            ]
        );
        assert_eq!(report.lines_replaced, 0);
    }

    #[test]
    fn strip_code_and_drop_modes() {
        let mut snap = snapshot("alice");
        let options = RedactOptions {
            strip_code: true,
            annotations: TextMode::Drop,
            metadata: TextMode::Drop,
            ..Default::default()
        };
        let report = apply(&mut snap, &options);
        let frames = frame_strings(&snap);
        // torch's own frames keep their name and line; the user's `train` is hashed.
        assert_eq!(frames[0].1, "forward");
        assert_eq!(frames[1].1, "forward");
        assert_eq!((frames[0].2, frames[1].2), (10, 10));
        let train = Hasher24::new(None).label("f_", "train");
        assert_eq!(
            (frames[2].1.as_str(), frames[3].1.as_str()),
            (&*train, &*train)
        );
        assert_ne!(frames[2].2, frames[3].2, "distinct lines stay distinct");
        assert!(frames[2].2 > 0 && frames[3].2 > 0);
        assert!(frames[2].2 != 5 || frames[3].2 != 6);
        assert_eq!(frames[4], (String::new(), "??".to_string(), 0));
        assert_eq!(report.lines_replaced, 2);
        assert_eq!(snap.device_traces[0].user_metadata(0), None);
        assert_eq!(snap.external_annotations[0].name, "");
        // The same frames recorded by another user on another machine hash the same.
        let mut other = snapshot("bob");
        apply(&mut other, &options);
        assert_eq!(frame_strings(&other), frames);
    }

    #[test]
    fn strip_code_keeps_library_names_and_what_the_categories_read() {
        let frame = |name: &str, file: &str, line: i64| serde_json::json!({"name": name, "filename": file, "line": line});
        let site = "/home/alice/env/lib/python3.11/site-packages";
        let frames = serde_json::json!([
            frame(
                "_call_impl",
                &format!("{site}/torch/nn/modules/module.py"),
                1773
            ),
            frame(
                "broadcast_coalesced",
                &format!("{site}/torch/nn/parallel/comm.py"),
                66
            ),
            frame(
                "_bootstrap_inner",
                "/home/alice/env/lib/python3.11/threading.py",
                1045
            ),
            frame("forward", "/home/alice/proj/model.py", 40),
            frame("compute_loss", "/home/alice/proj/train.py", 12),
            frame("__init__", "/home/alice/proj/model.py", 8),
            frame("step", "/home/alice/proj/optim.py", 30),
            frame("secret_helper", "/home/alice/proj/train.py", 20),
            frame("<module>", "/home/alice/proj/train.py", 99),
            frame(
                "at::Tensor at::native::empty_cuda(c10::ArrayRef<long>, std::optional<c10::ScalarType>)",
                "EmptyTensor.cpp",
                0
            ),
            frame(
                "c10d::ProcessGroupNCCL::allgather(std::vector<at::Tensor>&)",
                "ProcessGroupNCCL.cpp",
                0
            ),
            frame(
                "(anonymous namespace)::THPFunction_apply(_object*, _object*)",
                "??",
                0
            ),
            frame(
                "at::Tensor myext::secret_kernel(at::Tensor const&)",
                "kernel.cu",
                0
            ),
            frame("myext::workspace_for(at::Tensor const&)", "kernel.cu", 7),
            // The name of a library's frame, in the user's own file: hashed there only.
            frame("_bootstrap_inner", "/home/alice/proj/train.py", 3),
        ]);
        let json = serde_json::json!({
            "segments": [],
            "device_traces": [[{"action": "alloc", "addr": 1048576, "size": 512, "stream": 0,
                "time_us": 1, "frames": frames}]],
        });
        let mut snap = crate::model::decode_json(&json).unwrap();
        let options = RedactOptions {
            strip_code: true,
            ..Default::default()
        };
        let report = apply(&mut snap, &options);
        let h = |s: &str| Hasher24::new(None).label("f_", s);
        let got = frame_strings(&snap);
        let names: Vec<&str> = got.iter().map(|f| f.1.as_str()).collect();
        assert_eq!(
            names,
            [
                "_call_impl",
                "broadcast_coalesced",
                "_bootstrap_inner",
                // The user's names that the rules read: a module's forward, a loss, a
                // module's __init__, an optimizer's step.
                "forward",
                "compute_loss",
                "__init__",
                "step",
                &h("secret_helper"),
                &h("<module>"),
                "at::Tensor at::native::empty_cuda(c10::ArrayRef<long>, std::optional<c10::ScalarType>)",
                "c10d::ProcessGroupNCCL::allgather(std::vector<at::Tensor>&)",
                "(anonymous namespace)::THPFunction_apply(_object*, _object*)",
                &h("at::Tensor myext::secret_kernel(at::Tensor const&)"),
                // A workspace is a category the rules read off the name.
                "myext::workspace_for(at::Tensor const&)",
                &h("_bootstrap_inner"),
            ]
        );
        // The report counts the frames of each form that differs from the original.
        let bootstrap: Vec<(&str, u64)> = report
            .changes
            .iter()
            .filter(|c| c.field == Field::Function && c.original == "_bootstrap_inner")
            .map(|c| (c.redacted.as_str(), c.count))
            .collect();
        assert_eq!(bootstrap, [(h("_bootstrap_inner").as_str(), 1)]);
        // Libraries keep their lines; the user's frames' lines are hashed.
        let lines: Vec<i64> = got.iter().map(|f| f.2).collect();
        assert_eq!(&lines[..3], [1773, 66, 1045]);
        for (i, original) in [(3, 40), (4, 12), (5, 8), (6, 30), (7, 20), (8, 99), (13, 7)] {
            assert!(lines[i] > 0 && lines[i] != original, "frame {i}: {lines:?}");
        }
        assert_eq!(report.lines_replaced, 8);
        // No user file path is left, and the user's other names are gone.
        for (file, name, _) in &got {
            assert!(!file.contains("alice") && !file.starts_with('/'), "{file}");
            assert!(!name.contains("secret"), "{name}");
        }
    }

    #[test]
    fn native_names_are_a_librarys_by_their_qualified_name() {
        for name in [
            "at::native::empty_cuda(c10::ArrayRef<long>)",
            "at::Tensor at::functorch::le_Tensor_generated_plumbing<std::tuple<at::Tensor, std::optional<long> > (*)(at::Tensor const&), &at::le>(at::Tensor const&)",
            "_object* torch::autograd::TypeError_to_NotImplemented_<&torch::autograd::THPVariable_add>(_object*, _object*, _object*)",
            "(anonymous namespace)::THPFunction_apply(_object*, _object*)",
            "_PyEval_EvalFrameDefault",
            "PyObject_Call",
            "__libc_start_main",
        ] {
            assert!(is_library_native(name), "{name}");
        }
        for name in [
            "at::Tensor myext::attention(at::Tensor const&)",
            "myext::run<at::Tensor>(at::Tensor const&)",
            "secret_kernel",
            "(anonymous namespace)::my_helper(int)",
        ] {
            assert!(!is_library_native(name), "{name}");
        }
        assert!(is_library_file(
            "/home/a/env/lib/python3.11/site-packages/x/y.py"
        ));
        assert!(is_library_file("/usr/lib/python3.10/threading.py"));
        assert!(is_library_file("<frozen runpy>"));
        assert!(is_library_file("/tmp/torchinductor_a/qo/cqo.py"));
        assert!(is_library_file(
            "/usr/local/src/conda/python-3.10.14/Objects/call.c"
        ));
        assert!(!is_library_file("/home/a/proj-1.2/train.py"));
        assert!(!is_library_file("/tmp/ipykernel_1/2.py"));
        assert!(!is_library_file("/home/a/proj/train.py"));
        assert!(!is_library_file("train.py"));
    }

    #[test]
    fn hashes_are_keyed_and_stable() {
        let fixed = Hasher24::new(None);
        assert_eq!(
            fixed.label("f_", "forward"),
            Hasher24::new(None).label("f_", "forward")
        );
        assert_ne!(fixed.label("f_", "forward"), fixed.label("f_", "backward"));
        let salted = Hasher24::new(Some("s3cret"));
        assert_ne!(fixed.label("f_", "forward"), salted.label("f_", "forward"));
        assert_eq!(fixed.label("f_", "forward").len(), 18);
    }
}
