#!/usr/bin/env python3
"""Writes a copy of a snapshot whose stacks keep their Python frames only, as
`_record_memory_history(stacks="python")` would have recorded them.

Standard library only; used by tests/categories_real.rs to check that what the C++
frames decide (autocast's `cached_cast`) is decided the same without them.

Usage: python3 scripts/strip_cpp_frames.py IN.pickle OUT.pickle
"""
import pickle
import sys


def python_only(frames):
    return [f for f in frames
            if f.get("filename", "").endswith(".py") or f.get("filename", "").startswith("<")]


def main(src, dst):
    with open(src, "rb") as f:
        snap = pickle.load(f)  # a file of our own test data, never a user's
    for trace in snap.get("device_traces", []):
        for entry in trace:
            if "frames" in entry:
                entry["frames"] = python_only(entry["frames"])
    for seg in snap.get("segments", []):
        if "frames" in seg:
            seg["frames"] = python_only(seg["frames"])
        for block in seg.get("blocks", []):
            if "frames" in block:
                block["frames"] = python_only(block["frames"])
    with open(dst, "wb") as f:
        pickle.dump(snap, f, protocol=4)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
