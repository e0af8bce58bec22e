#!/usr/bin/env python3
"""Independent expected figures for PyTorch CUDA memory snapshot files.

Standard library only.  Computes, for each input file, the figures the Rust
analyzer (`vramlens`) is tested against, using CPython's own `pickle` /
`json` / `gzip` modules, so the numbers do not depend on our Rust parser.

Usage:
    python3 scripts/expected.py FILE...
        one JSON object per line per FILE (sorted keys, integers only)
    python3 scripts/expected.py --real OUT.json [--data-dir DIR]
        walk DIR (default /work/shared/data) for *.pickle / *.pkl files and write
        {relative path: object-without-"path"} to OUT.json (sorted keys, indent 1)

Rules (per device d), see also tests/ and testdata/README.md:
  * devices = every d with a segment whose `device == d` or a non-empty
    `device_traces[d]`, ascending (host_segments / host_traces are not devices).
  * reserved  = sum segment `total_size`
  * allocated = sum block `size` with state `active_allocated`
  * active    = sum block `size` whose state starts with `active_`
  * requested = sum over `active_allocated` blocks of: `requested_size` if the block
    has a `frames` key (PyTorch >= 2.1); else `history[0]['real_size']` if a
    non-empty `history` exists; else `requested_size` if present; else `size`.
  * free_block_bytes = sum `size` of `inactive` blocks; largest_free_block_bytes =
    max of those (0 if none); rounding_waste_bytes = sum(size - requested) over
    `active_allocated` blocks.
  * trace: events = len(device_traces[d]); actions = count per action; first/last
    time_us = time_us of the first/last entry with time_us > 0 (null if none);
    ooms = entries with action 'oom' (index in device_traces[d], size, device_free).
A list root is the list of segments (no traces).  Input may be gzip-compressed
(sniffed by magic bytes, whatever the name) and may be JSON instead of pickle.
"""

import gzip
import io
import json
import os
import pickle
import sys

DEFAULT_DATA_DIR = "/work/shared/data"


class _DataOnlyUnpickler(pickle.Unpickler):
    """Refuses every GLOBAL / STACK_GLOBAL: snapshots contain plain data only."""

    def find_class(self, module, name):  # pragma: no cover - defensive
        raise pickle.UnpicklingError(
            "refusing to import %s.%s: not a plain-data snapshot" % (module, name))

    def persistent_load(self, pid):  # pragma: no cover - defensive
        raise pickle.UnpicklingError("persistent ids are not allowed")


def read_bytes(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data


def is_json(data):
    stripped = data.lstrip(b" \t\r\n")
    if stripped.startswith(b"\xef\xbb\xbf"):
        stripped = stripped[3:].lstrip(b" \t\r\n")
    return stripped[:1] in (b"{", b"[")


def load(data):
    """Return (root object, pickle protocol or None)."""
    if is_json(data):
        text = data.decode("utf-8-sig")
        return json.loads(text), None
    protocol = None
    if len(data) >= 2 and data[0] == 0x80:
        protocol = data[1]
    root = _DataOnlyUnpickler(io.BytesIO(data)).load()
    return root, protocol


def _requested(block):
    if "frames" in block:
        return block["requested_size"]
    history = block.get("history")
    if history:
        return history[0]["real_size"]
    if "requested_size" in block:
        return block["requested_size"]
    return block["size"]


def _device_figures(device, segments, trace):
    segs = [s for s in segments if s.get("device") == device]
    states = {}
    reserved = allocated = active = requested = 0
    free_bytes = waste = largest_free = 0
    nblocks = 0
    large = small = expandable = 0
    for s in segs:
        reserved += s["total_size"]
        st = s.get("segment_type")
        if st == "large":
            large += 1
        elif st == "small":
            small += 1
        if s.get("is_expandable") is True:
            expandable += 1
        for b in s.get("blocks", []):
            nblocks += 1
            state = b["state"]
            states[state] = states.get(state, 0) + 1
            size = b["size"]
            if state.startswith("active_"):
                active += size
            if state == "active_allocated":
                allocated += size
                r = _requested(b)
                requested += r
                waste += size - r
            elif state == "inactive":
                free_bytes += size
                if size > largest_free:
                    largest_free = size
    actions = {}
    first_t = last_t = None
    ooms = []
    for i, e in enumerate(trace):
        a = e["action"]
        actions[a] = actions.get(a, 0) + 1
        t = e.get("time_us")
        if isinstance(t, int) and not isinstance(t, bool) and t > 0:
            if first_t is None:
                first_t = t
            last_t = t
        if a == "oom":
            ooms.append({"index": i, "size": e["size"], "device_free": e["device_free"]})
    return {
        "device": device,
        "segments": len(segs),
        "segments_large": large,
        "segments_small": small,
        "segments_expandable": expandable,
        "blocks": nblocks,
        "blocks_by_state": states,
        "reserved_bytes": reserved,
        "allocated_bytes": allocated,
        "active_bytes": active,
        "requested_bytes": requested,
        "free_block_bytes": free_bytes,
        "rounding_waste_bytes": waste,
        "largest_free_block_bytes": largest_free,
        "trace": {
            "events": len(trace),
            "actions": actions,
            "first_time_us": first_t,
            "last_time_us": last_t,
        },
        "ooms": ooms,
    }


def figures(root, protocol):
    if isinstance(root, list):
        kind = "list"
        segments = root
        traces = []
    elif isinstance(root, dict):
        kind = "dict"
        segments = root.get("segments", [])
        traces = root.get("device_traces", []) or []
    else:
        raise ValueError("root is %s, not dict or list" % type(root).__name__)
    devices = set()
    for s in segments:
        devices.add(s["device"])
    for d, t in enumerate(traces):
        if t:
            devices.add(d)
    out = []
    for d in sorted(devices):
        trace = traces[d] if 0 <= d < len(traces) else []
        out.append(_device_figures(d, segments, trace))
    return {"pickle_protocol": protocol, "root": kind, "devices": out}


def figures_for_path(path):
    root, protocol = load(read_bytes(path))
    return figures(root, protocol)


def _check_no_floats(obj):
    if isinstance(obj, float):
        raise AssertionError("float in output")
    if isinstance(obj, dict):
        for v in obj.values():
            _check_no_floats(v)
    elif isinstance(obj, list):
        for v in obj:
            _check_no_floats(v)


def dumps_line(obj):
    _check_no_floats(obj)
    return json.dumps(obj, sort_keys=True)


def write_real(out_path, data_dir=DEFAULT_DATA_DIR):
    result = {}
    for dirpath, dirnames, filenames in os.walk(data_dir):
        dirnames.sort()
        for name in sorted(filenames):
            if not (name.endswith(".pickle") or name.endswith(".pkl")):
                continue
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, data_dir).replace(os.sep, "/")
            result[rel] = figures_for_path(full)
    _check_no_floats(result)
    parent = os.path.dirname(out_path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(out_path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(result, f, sort_keys=True, indent=1)
        f.write("\n")
    return result


def main(argv):
    if argv and argv[0] == "--real":
        if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--data-dir"):
            sys.stderr.write("usage: expected.py --real OUT.json [--data-dir DIR]\n")
            return 2
        data_dir = argv[3] if len(argv) == 4 else DEFAULT_DATA_DIR
        result = write_real(argv[1], data_dir)
        sys.stderr.write("wrote %d entries to %s\n" % (len(result), argv[1]))
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        sys.stderr.write(__doc__)
        return 2
    rc = 0
    for path in argv:
        try:
            obj = figures_for_path(path)
        except Exception as exc:  # report and keep going
            sys.stderr.write("%s: error: %s: %s\n" % (path, type(exc).__name__, exc))
            rc = 1
            continue
        obj["path"] = path
        sys.stdout.write(dumps_line(obj) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
