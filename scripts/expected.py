#!/usr/bin/env python3
"""Independent expected figures for PyTorch CUDA memory snapshot files.

Standard library only.  Computes, for each input file, the figures the Rust
analyzer (`vramlens`) is tested against, using CPython's own `pickle` /
`json` / `gzip` modules, so the numbers do not depend on our Rust parser.

Usage:
    python3 scripts/expected.py FILE...
        one JSON object per line per FILE (sorted keys, integers only)
    python3 scripts/expected.py --real OUT.json [--data-dir DIR]
        walk DIR (default ../shared/data beside the repository) for *.pickle / *.pkl
        files and write {relative path: object-without-"path"} to OUT.json (sorted
        keys, indent 1)

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
  * peak_requested_bytes / peak_requested_index: the highest point of the official
    viewer's Active Memory Timeline (spec section 6.2, default options) and the index
    in the original device_traces[d] of the entry after which it is first reached
    (null when the peak is the state before any event); see `_peak_figures`.
  * peak_allocated_bytes / peak_allocated_index: the same timeline counted in block
    bytes: an allocation that holds a block of the final segments (an active block at
    its address whose requested size is the allocation's, and, for one made in the
    trace, the last alloc at that address) counts that block's size; every other
    size is rounded up to a multiple of 512, at least 512.
  * peak_reserved_bytes: the highest reserved total, replaying segment events
    backwards from the final reserved bytes and then forwards; see `_peak_figures`.
  Every peak is null when the device's trace shows nothing over time: fewer than two
  entries that change memory (alloc, free_completed, segment_alloc / _free / _map /
  _unmap); only the final state is known then.
A list root is the list of segments (no traces).  Input may be gzip-compressed
(sniffed by magic bytes, whatever the name) and may be JSON instead of pickle.
"""

import gzip
import io
import json
import os
import pickle
import sys

# ../shared/data beside the repository (this file is scripts/expected.py in it), wherever
# the script is run from.
DEFAULT_DATA_DIR = os.path.normpath(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "shared", "data"))


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


def _viewer_requested(block):
    """Requested size the viewer gives a surviving block (spec section 6.1).

    `annotate_snapshot`: a block with a `frames` key (>= 2.1) keeps its
    `requested_size`; a legacy block (1.13 / 2.0, no `frames`) takes
    `history[0]['real_size']` when it has a non-empty history, else its `size`.
    """
    if "frames" in block:
        return block["requested_size"]
    history = block.get("history")
    if history:
        return history[0]["real_size"]
    return block["size"]


def _merge_frees(trace):
    """Spec section 6.1, "Free merging": the normalised trace of one device.

    Returns a list of (original index, action, entry).  A `free_completed` whose
    immediately preceding *kept* entry is a `free_requested` with the same `addr` is
    dropped and that entry becomes a `free` (it keeps the free_requested's index).
    Non-adjacent pairs stay separate.  Versions (also section 6.1) only label
    lifetimes and do not change any size, so they are not computed here.
    """
    kept = []
    for i, e in enumerate(trace):
        action = e["action"]
        if action == "free_completed" and kept:
            _, prev_action, prev = kept[-1]
            if prev_action == "free_requested" and prev.get("addr") == e.get("addr"):
                kept[-1] = (kept[-1][0], "free", prev)
                continue
        kept.append((i, action, e))
    return kept


def _block(size):
    """Block bytes of a request: rounded up to a multiple of 512, at least 512."""
    return max(1, size + 511) // 512 * 512 if size > 0 else 512


# Trace actions that change requested or reserved memory.
_CHANGES_MEMORY = ("alloc", "free_completed", "segment_alloc", "segment_free",
                   "segment_map", "segment_unmap")


def _peak_figures(segs, trace):
    """Peaks of one device: requested and allocated (block bytes) and reserved."""
    changes = sum(1 for e in trace if e.get("action") in _CHANGES_MEMORY)
    if changes < 2:
        return {
            "peak_requested_bytes": None,
            "peak_requested_index": None,
            "peak_allocated_bytes": None,
            "peak_allocated_index": None,
            "peak_reserved_bytes": None,
        }
    requested, requested_index, reserved = _timeline_peak(segs, trace, lambda n: n)
    allocated, allocated_index, _ = _timeline_peak(segs, trace, _block, real_blocks=True)
    return {
        "peak_requested_bytes": requested,
        "peak_requested_index": requested_index,
        "peak_allocated_bytes": allocated,
        "peak_allocated_index": allocated_index,
        "peak_reserved_bytes": reserved,
    }


def _final_blocks(segs):
    """{address: (size, requested size)} of the active blocks of the final segments."""
    blocks = {}
    for s in segs:
        addr = s["address"]
        for b in s.get("blocks", []):
            if b["state"] in ("active_allocated", "active_pending_free"):
                blocks[addr] = (b["size"], _viewer_requested(b))
            addr += b["size"]
    return blocks


def _timeline_peak(segs, trace, size_of, real_blocks=False):
    """(peak, index, peak_reserved) of one device, sizes counted by `size_of`.

    `segs`: the segments of the device; `trace`: its original device_traces[d] list
    (empty for a list root or a device without traces).

    Allocated: the Active Memory Timeline of the viewer, `process_alloc_data(snapshot,
    device, plot_segments=false)` (spec section 6.2) on the trace normalised by
    `annotate_snapshot` (section 6.1).  Its `max_at_time` is the stacked total
    including the "summarized" band (phase 3 only decides what is drawn
    individually), i.e. simply the running total of phase 4.
    """
    # Phase 1 (section 6.2): pair events over the merged trace.  An element is
    # [size, original index]; `actions` lists element ids in order, the first
    # occurrence of an id is its alloc and the second its free.
    final = _final_blocks(segs) if real_blocks else {}
    last_alloc = {}
    for index, e in enumerate(trace):
        if e["action"] == "alloc":
            last_alloc[e["addr"]] = index

    def alloc_size(index, e):
        block = final.get(e["addr"])
        if block and block[1] == e["size"] and block[0] >= e["size"] and last_alloc[e["addr"]] == index:
            return block[0]
        return size_of(e["size"])

    elements = []
    actions = []
    initially_allocated = []
    open_allocs = {}  # addr -> element id of an alloc not yet freed
    for index, action, e in _merge_frees(trace):
        if action == "alloc":
            # An alloc at an address that is already open replaces the open entry;
            # the old element is never freed (it stays on the stack to the end).
            elements.append((alloc_size(index, e), index))
            open_allocs[e["addr"]] = len(elements) - 1
            actions.append(len(elements) - 1)
        elif action in ("free", "free_completed"):
            addr = e["addr"]
            if addr in open_allocs:
                actions.append(open_allocs.pop(addr))
            else:
                # Orphan free (alloc outside the window, section 3.6): an element of
                # the free's size, alive from the start and freed here.
                elements.append((size_of(e["size"]), index))
                initially_allocated.append(len(elements) - 1)
                actions.append(len(elements) - 1)
        # free_requested (unmerged), segment_*, snapshot, oom, annotate and any
        # unknown action do not change the allocated total.

    # Phase 2 (section 6.2): every active_allocated block whose address is not open
    # at the end is alive for the whole timeline.  Block addresses are recomputed as
    # segment address + sizes of the preceding blocks (section 6.1), ignoring any
    # stored `address`.
    survivors_total = 0
    for s in segs:
        addr = s["address"]
        for b in s.get("blocks", []):
            if b["state"] == "active_allocated" and addr not in open_allocs:
                requested = _viewer_requested(b)
                if real_blocks and b["size"] >= requested:
                    survivors_total += b["size"]
                else:
                    survivors_total += size_of(requested)
            addr += b["size"]
    # (The viewer moves one survivor into `actions` when there are no actions at all,
    # to draw a flat plot; that changes neither the peak nor its index: the peak is
    # then the starting total, reported with index None.)

    # Phase 4 (section 6.2): the stack starts with every initially allocated element
    # (orphan frees and survivors); each action pushes an element at its first
    # occurrence and pops it at the second.
    total = survivors_total + sum(elements[k][0] for k in initially_allocated)
    peak, peak_index = total, None
    on_stack = set(initially_allocated)
    for k in actions:
        size, index = elements[k]
        if k in on_stack:
            on_stack.discard(k)
            total -= size
        else:
            on_stack.add(k)
            total += size
        if total > peak:
            peak, peak_index = total, index

    # Reserved (same start-from-the-end rule as the viewer's private-pool envelopes,
    # section 6.3, applied to the whole device): start = final reserved minus the net
    # segment events of the trace, then replay forwards.
    delta = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
    reserved = sum(s["total_size"] for s in segs)
    for e in trace:
        reserved -= delta.get(e["action"], 0) * e["size"]
    peak_reserved = reserved
    for e in trace:
        reserved += delta.get(e["action"], 0) * e["size"]
        if reserved > peak_reserved:
            peak_reserved = reserved

    return peak, peak_index, peak_reserved


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
    out = {
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
    out.update(_peak_figures(segs, trace))
    return out


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
        if not os.path.isdir(data_dir):
            sys.stderr.write("expected.py: error: %s is not a folder\n" % data_dir)
            return 2
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
