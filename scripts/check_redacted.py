#!/usr/bin/env python3
"""Checks a redacted snapshot against its original, with Python's own pickle (stdlib only).

Usage: check_redacted.py ORIGINAL REDACTED [--strip-code] [--metadata keep|hash|drop]
                         [--annotations keep|hash|drop]
       check_redacted.py --pairs < PAIRS

Independently of vramlens, it checks that:
- REDACTED opens with pickle.load;
- both have the same structure: the same dict keys at every place (frames may lose
  their FX keys), the same list lengths, the same types, and every number, bool and None
  equal (a frame line of 2**64 - 1, PyTorch's unsigned -1, may come back as -1; with
  --strip-code positive frame lines may differ);
- strings differ only where redaction may change them (frame file and function names,
  annotation names, user_metadata, compile_context, internal_metadata, cpp_frames,
  forward_frames, and values of keys PyTorch does not write);
- the frames map one to one: equal frames stay equal and distinct frames distinct;
- with --strip-code, every function name of the user's own Python files is hashed
  (`f_` and 16 hex digits), but for the names the category rules read (`forward`,
  `__init__`, `step`, a loss, ...) and names a library's frame also has;
- no home folder survives anywhere in the bytes (/home/, /Users/, X:/Users/, /homes/,
  /homestud/, /scratch/, /pscratch/), nor the first two folders of any absolute file name
  of the original (/home/NAME, /pscratch/sd, D:/Dev, ...); no frame file name is an
  absolute path; and no user name seen in the original's home folders (or
  torchinductor_NAME folders) appears as a whole word in any string, nor in the bytes.

Prints one JSON line with what was checked; exits 1 with a message on the first failure.
With --pairs, checks every pair given on standard input in one process (a test of many
files starts Python once), one JSON line per pair.
"""

import argparse
import base64
import gzip
import json
import pickle
import re
import sys

GENERIC = {"root", "conda", "user", "users", "ubuntu", "admin", "runner", "jovyan",
           "ec2-user", "jenkins", "build", "builder", "shared", "public", "default",
           "guest", "nobody", "data", "work", "home", "src", "test", "tmp", "localhost"}

# Keys whose string values redaction may change.
FREE_TEXT_KEYS = {"filename", "name", "user_metadata", "compile_context",
                  "internal_metadata", "cpp_frames", "forward_frames", "category"}
# Keys PyTorch writes; string values under any other key may change too.
KNOWN_KEYS = {
    "segments", "device_traces", "allocator_settings", "external_annotations",
    "host_segments", "host_traces", "device", "address", "total_size", "allocated_size",
    "active_size", "requested_size", "stream", "segment_type", "segment_pool_id",
    "is_expandable", "frames", "forward_frames", "blocks", "size", "state", "history",
    "addr", "real_size", "cpp_frames", "action", "device_free", "time_us",
    "compile_context", "user_metadata", "internal_metadata", "pool_id", "category",
    "filename", "line", "name", "stage", "PYTORCH_CUDA_ALLOC_CONF", "max_split_size",
    "garbage_collection_threshold", "expandable_segments", "pinned_num_register_threads",
    "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
    "graph_capture_record_stream_reuse", "max_round_threshold", "max_cached_size",
    "roundup_power2_divisions",
}
FX_KEYS = {"fx_node_op", "fx_node_name", "fx_node_target", "fx_original_trace"}


class Failed(Exception):
    pass


def load(path):
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    text_start = raw.lstrip()[:1]
    if text_start in (b"{", b"["):
        return json.loads(raw), True
    if raw.lstrip()[:1] == b"<":
        html = raw.decode("utf-8", "replace")
        start = html.index('"base64"', html.index("local_files")) + len('"base64"')
        start = html.index('"', start) + 1
        return pickle.loads(base64.b64decode(html[start:html.index('"', start)])), False
    return pickle.loads(raw), False


def is_frame(d):
    return isinstance(d, dict) and "line" in d and ("filename" in d or "name" in d)


ABSOLUTE = re.compile(r"^(/|\\|[A-Za-z]:[/\\]|~/)")


def path_text(path):
    """A path kept as (parent, ".", key) and (parent, "[", index) triples, written out
    only for a failure message."""
    parts = []
    while isinstance(path, tuple):
        path, sep, part = path
        parts.append(f".{part}" if sep == "." else f"[{part}]")
    parts.append(path)
    return "".join(reversed(parts))


def strings_into(v, out):
    """Every string of `v`, dict keys included, added to the set `out`."""
    if isinstance(v, str):
        out.add(v)
    elif isinstance(v, dict):
        for k, x in v.items():
            strings_into(k, out)
            strings_into(x, out)
    elif isinstance(v, (list, tuple)):
        for x in v:
            strings_into(x, out)


class Walker:
    """Walks the original and the redacted value side by side, once: it checks them and
    gathers the distinct strings of each (dict keys included), which is what the name
    checks need (a string seen a million times is checked once)."""

    def __init__(self, strip_code, from_json):
        self.strip_code = strip_code
        self.from_json = from_json
        self.frame_map = {}
        self.frame_back = {}
        self.frames = 0
        self.numbers = 0
        self.strings_changed = 0
        self.strings_a = set()
        self.strings_b = set()

    def fail(self, path, message):
        raise Failed(f"{path_text(path)}: {message}")

    def walk(self, a, b, path, key=None, free=False):
        ta, tb = type(a), type(b)
        if ta is not tb and not (self.from_json and {ta, tb} <= {list, tuple}):
            self.fail(path, f"type {ta.__name__} became {tb.__name__}")
        if isinstance(a, str):
            self.strings_a.add(a)
            self.strings_b.add(b)
            if a != b:
                if not free:
                    self.fail(path, f"string {a!r} became {b!r}")
                self.strings_changed += 1
        elif isinstance(a, dict):
            frame = is_frame(a)
            if frame:
                self.frame(a, b, path)
            if a.keys() != b.keys():
                ka, kb = set(a), set(b)
                missing = ka - kb - (FX_KEYS if frame else set())
                if missing or kb - ka:
                    self.fail(path, f"keys differ: lost {sorted(missing)}, gained {sorted(kb - ka)}")
                for k in ka - kb:
                    strings_into(a[k], self.strings_a)
            # Keys as they are (a key that is not a string is taken apart in strings()).
            sa, sb = self.strings_a, self.strings_b
            sa.update(a)
            sb.update(b)
            for k in b:
                x, y = a[k], b[k]
                tx = type(x)
                free_k = free or k not in KNOWN_KEYS or k in FREE_TEXT_KEYS
                # Strings and integers (most values) checked here as walk() would check
                # them, without a call each.
                if tx is str and type(y) is str:
                    sa.add(x)
                    sb.add(y)
                    if x != y:
                        if not free_k:
                            self.fail((path, ".", k), f"string {x!r} became {y!r}")
                        self.strings_changed += 1
                elif tx is int and type(y) is int:
                    self.numbers += 1
                    if x != y and not (k == "line" and ((x == 2**64 - 1 and y == -1)
                                                        or (self.strip_code and x > 0))):
                        self.fail((path, ".", k), f"{x!r} became {y!r}")
                else:
                    self.walk(x, y, (path, ".", k), k, free_k)
        elif isinstance(a, (list, tuple)):
            if len(a) != len(b):
                self.fail(path, f"length {len(a)} became {len(b)}")
            for i, (x, y) in enumerate(zip(a, b)):
                self.walk(x, y, (path, "[", i), key, free)
        else:
            self.numbers += 1
            if a == b:
                return
            if key == "line" and a == 2**64 - 1 and b == -1:
                return
            if key == "line" and self.strip_code and isinstance(a, int) and a > 0:
                return
            self.fail(path, f"{a!r} became {b!r}")

    def strings(self, side):
        """The distinct strings of one side, keys that are not strings taken apart."""
        out = set()
        for v in side:
            strings_into(v, out)
        return out

    def frame(self, a, b, path):
        self.frames += 1
        ka = (a.get("filename"), a.get("name"), a.get("line"))
        kb = (b.get("filename"), b.get("name"), b.get("line"))
        if self.frame_map.setdefault(ka, kb) != kb:
            self.fail(path, f"one frame {ka} became two: {self.frame_map[ka]} and {kb}")
        back = self.frame_back.get(kb)
        if back is None:
            self.frame_back[kb] = ka
            # Once per distinct redacted frame: the answer is the same for its repeats.
            if isinstance(kb[0], str) and ABSOLUTE.match(kb[0]):
                self.fail(path, f"absolute file name left: {kb[0]!r}")
        elif back != ka:
            self.fail(path, f"two frames {back} and {ka} became one: {kb}")


LIBRARY_FILE = re.compile(
    r"(?i)[/\\](site|dist)-packages[/\\]|[/\\]lib(64)?[/\\]python[0-9.]*[/\\]"
    r"|[/\\]python[0-9]+[/\\]lib[/\\]|torchinductor_|^<frozen ")
# Names of the user's code that the category rules read (docs/redaction.md): kept by
# --strip-code.
RULE_NAMES = re.compile(
    r"(?i)^(forward|step|__init__|reset_parameters|_init_weights|init_weights|zero_grad"
    r"|_call_impl|_wrapped_call_impl|_apply|to_empty|materialize)$|loss|cross_entropy|cache"
    r"|workspace|gather|scatter|reduce|broadcast|autotune|bench|compile|collate|pin_memory"
    r"|dataloader|accumulate|state_dict")
HASHED = re.compile(r"^f_[0-9a-f]{16}( \[[0-9]+\])?$")


def user_functions_hashed(frame_map):
    """With --strip-code: the function names of the user's own Python files (not an
    installed package, the standard library or generated code) are hashed, but those the
    category rules read and those a library's frame of the same file also has. Gives how
    many distinct frames were checked."""
    library_names = {ka[1] for ka in frame_map
                     if isinstance(ka[0], str) and LIBRARY_FILE.search(ka[0])}
    checked = 0
    for ka, kb in frame_map.items():
        file, name = ka[0], ka[1]
        if not (isinstance(file, str) and isinstance(name, str)):
            continue
        if not file.endswith(".py") or LIBRARY_FILE.search(file):
            continue
        if not re.search(r"[A-Za-z0-9]", name) or name in library_names or RULE_NAMES.search(name):
            continue
        checked += 1
        if not HASHED.match(kb[1] or ""):
            raise Failed(f"function {name!r} of {file!r} is left as {kb[1]!r}")
    return checked


HOME = re.compile(r"(?:/home/|/Users/|[A-Za-z]:[/\\]Users[/\\]|/homestud/|/homes/(?:[^/]{1,2}/)*)([^/\\\s\"']{3,})")
INDUCTOR = re.compile(r"torchinductor_([A-Za-z0-9][^/\\\s\"']*)")


def check(original_path, redacted_path, strip_code):
    """The checks of one pair; the report printed for it. Raises Failed."""
    original, from_json = load(original_path)
    raw = open(redacted_path, "rb").read()
    redacted = pickle.loads(raw)
    w = Walker(strip_code, from_json)
    w.walk(original, redacted, "(root)")

    strings_a, strings_b = w.strings(w.strings_a), w.strings(w.strings_b)
    users = set()
    for s in strings_a:
        for m in HOME.finditer(s):
            users.add(m.group(1))
        for m in INDUCTOR.finditer(s):
            users.add(m.group(1))
    users = sorted(u for u in users if u.lower() not in GENERIC and len(u) >= 2)
    text = raw.decode("latin-1")
    for home in ("/home/", "/Users/", ":/Users/", ":\\Users\\", "/homes/", "/homestud/",
                 "/scratch/", "/pscratch/"):
        if home in text:
            raise Failed(f"a home folder ({home}) is left in the bytes")
    prefixes = set()
    for s in w.frame_map:
        name = s[0]
        if isinstance(name, str) and re.match(r"^(/|\\|[A-Za-z]:[/\\])", name):
            parts = [p for p in re.split(r"[/\\]", name) if p]
            if len(parts) >= 3:
                prefixes.add("/".join(parts[:2]))
                prefixes.add("\\".join(parts[:2]))
    for prefix in sorted(prefixes):
        if prefix in text:
            raise Failed(f"the folder {prefix!r} of an original file name is left in the bytes")
    # Every user name as a whole word, all in one pattern: one scan of each distinct
    # string (and of the bytes, for names of 4 characters or more) finds any of them;
    # the longest first, so that the match names the user found.
    def whole_words(names):
        alternatives = "|".join(re.escape(u) for u in sorted(names, key=lambda u: (-len(u), u)))
        return re.compile(r"(?<![A-Za-z0-9_])(?:" + alternatives + r")(?![A-Za-z0-9_])", re.I)
    if users:
        word = whole_words(users)
        for s in sorted(strings_b):
            m = word.search(s)
            if m:
                raise Failed(f"user name {m.group(0)!r} is left in {s[:200]!r}")
        long_names = [u for u in users if len(u) >= 4]
        if long_names:
            m = whole_words(long_names).search(text)
            if m:
                raise Failed(f"user name {m.group(0)!r} is left in the bytes")
    hashed = user_functions_hashed(w.frame_map) if strip_code else 0
    return {"ok": True, "users": users, "folders": len(prefixes), "frames": w.frames,
            "user_functions_hashed": hashed,
            "distinct_frames": len(w.frame_map), "numbers": w.numbers,
            "strings_changed": w.strings_changed}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("original", nargs="?")
    ap.add_argument("redacted", nargs="?")
    ap.add_argument("--strip-code", action="store_true")
    ap.add_argument("--pairs", action="store_true",
                    help="check many pairs in one process: one 'ORIGINAL<TAB>REDACTED' line "
                         "per pair on standard input ('<TAB>--strip-code' after it for that "
                         "pair), one JSON line printed per pair, in order")
    args = ap.parse_args()
    if args.pairs:
        pairs = []
        for line in sys.stdin.read().splitlines():
            fields = line.split("\t")
            pairs.append((fields[0], fields[1], "--strip-code" in fields[2:]))
    elif args.original and args.redacted:
        pairs = [(args.original, args.redacted, args.strip_code)]
    else:
        ap.error("give ORIGINAL REDACTED, or --pairs")
    for original, redacted, strip_code in pairs:
        try:
            print(json.dumps(check(original, redacted, strip_code)), flush=True)
        except Failed as e:
            print(f"check_redacted: {redacted}: {e}", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
