#!/usr/bin/env python3
"""Generate a snapshot and a profiler trace of the same synthetic run (standard library only).

Run:  python3 scripts/gen_profile_pair.py        (rewrites testdata/profile/ in place)

One script of allocator events (scripts/gen_fixtures.py's simulation of the caching
allocator: 512-byte rounding, small and large pools, splitting, merging, empty_cache) is
written twice, as PyTorch 2.10 would record it both ways in one process:

  run.pickle                 torch.cuda.memory._dump_snapshot(): trace entries with the
                             requested size, Unix µs times, Python stacks.
  run.trace.json             torch.profiler.profile(profile_memory=True, with_stack=True)
                             export_chrome_trace(): `[memory]` instant events with the block
                             size (rounded, as the allocator reports to the profiler), Addr,
                             Total Allocated / Total Reserved after the event, ts relative to
                             baseTimeNanoseconds; each allocation inside python_function spans
                             (its Python stack) and cpu_op spans (aten::linear > aten::empty).
                             The profiler's clock runs 730 µs ahead of the allocator's, as two
                             clocks calibrated at different moments do.
  run.nvml.jsonl             device readings every 2 ms over the run (used = reserved + 600 MiB
                             of CUDA context), so `reconcile` has a log to read.
  other_run.trace.json       the same trace placed 3 days later: another run.
  other_process.trace.json   the same times, every address moved by 64 GiB: another process.
  no_base.trace.json         run.trace.json as Kineto of April-May 2024 wrote it: ts relative
                             to a base it does not write (no baseTimeNanoseconds), so the
                             times are offsets, not dates.
  categories.json            export_memory_timeline(*.json): bytes per category over time.
  timeline.html              export_memory_timeline(*.html): a picture, no data.
  README.md                  this list.

Deterministic: no wall clock, every random choice from random.Random(seed).
"""

import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "testdata", "profile")
sys.path.insert(0, HERE)
import gen_fixtures as g  # noqa: E402

BASE_NS = 1749945600000000000      # baseTimeNanoseconds: 2025-06-15 00:00:00 UTC
SKEW_NS = 730_000                   # the profiler's clock minus the allocator's
CONTEXT_BYTES = 600 * g.MiB         # the CUDA context, outside the allocator


class TracedSim(g.Sim):
    """The simulation, noting the block size of each alloc and free_completed entry."""

    def malloc(self, req, ctx, **kw):
        addr = super().malloc(req, ctx, **kw)
        self.trace[-1]["block"] = self.live[addr].size
        self.trace[-1]["ctx"] = ctx
        return addr

    def _free_block(self, seg, b, tb):
        size = b.size
        super()._free_block(seg, b, tb)
        self.trace[-1]["block"] = size


def run_script():
    """One training step of a small GPT, then a cache flush, on device 0."""
    rng = random.Random(20250616)
    clock = g.Clock(rng)
    frames = g.Frames()
    sim = TracedSim(0, clock, frames, rng=rng)
    params = g.model_init(sim, n_layer=2)
    sizes = [sim.live[a].req for a in params]
    saved = g.forward(sim, n_layer=2)
    logits = sim.malloc(g.B * g.T * 50304 * 2, "lm_head")
    loss = sim.malloc(4, "loss")
    sim.free(logits)
    grads = g.backward(sim, saved, params, sizes)
    for gr in grads:
        sim.free(gr)
    sim.free(loss)
    sim.empty_cache()
    return sim


def kineto_events(sim, shift_ns=0, addr_shift=0):
    """[memory] events and the spans around each allocation, on one thread."""
    events = []
    allocated = 0
    reserved = 0
    for e in sim.trace:
        a = e["action"]
        if a in ("segment_alloc", "segment_map"):
            reserved += e["size"]
            continue
        if a in ("segment_free", "segment_unmap"):
            reserved -= e["size"]
            continue
        if a not in ("alloc", "free_completed"):
            continue
        t_ns = e["time"] * 1000 + SKEW_NS + shift_ns - BASE_NS
        block = e["block"]
        allocated += block if a == "alloc" else -block
        events.append({
            "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
            "pid": 4242, "tid": 4242, "ts": round(t_ns / 1000, 3),
            "args": {"Total Reserved": reserved, "Total Allocated": allocated,
                     "Bytes": block if a == "alloc" else -block,
                     "Addr": e["addr"] + addr_shift, "Device Id": 0, "Device Type": 1},
        })
        if a != "alloc":
            continue
        # Python frames outermost first, each span a little shorter than its caller's.
        # The autograd engine's thread has no Python frames.
        py = list(reversed(g.PY_STACKS.get(e["ctx"], [])))
        spans = [("python_function", f"{file}({line}): {name}") for name, file, line in py]
        outer_op = "autograd::engine::evaluate_function: AddmmBackward0" if not py else "aten::linear"
        spans += [("cpu_op", outer_op), ("cpu_op", "aten::empty")]
        for depth, (cat, name) in enumerate(spans):
            half = 500 - 20 * depth          # ns
            events.append({
                "ph": "X", "cat": cat, "name": name, "pid": 4242, "tid": 4242,
                "ts": round((t_ns - half) / 1000, 3), "dur": round(2 * half / 1000, 3),
                "args": {"External id": len(events)},
            })
    return events


def trace_doc(events, base=True):
    doc = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3",
                              "totalGlobalMem": 85029158912}],
        "profile_memory": 1,
        "with_stack": 1,
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_NS,
    }
    if not base:
        del doc["baseTimeNanoseconds"]
    return doc


def nvml_lines(sim):
    """Readings every 2 ms from 10 ms before the first event to 10 ms after the last."""
    changes = []
    reserved = 0
    for e in sim.trace:
        if e["action"] in ("segment_alloc", "segment_map"):
            reserved += e["size"]
        elif e["action"] in ("segment_free", "segment_unmap"):
            reserved -= e["size"]
        changes.append((e["time"], reserved))
    first, last = changes[0][0], changes[-1][0]
    lines = []
    k = 0
    current = 0
    t = first - 10_000
    while t <= last + 10_000:
        while k < len(changes) and changes[k][0] <= t:
            current = changes[k][1]
            k += 1
        used = current + CONTEXT_BYTES
        lines.append(json.dumps({
            "time_us": t, "gpu": 0, "uuid": "GPU-00000000-1111-2222-3333-444444444444",
            "total_bytes": 85029158912, "used_bytes": used, "free_bytes": 85029158912 - used,
            "processes": [{"pid": 4242, "used_bytes": used}],
        }))
        t += 2_000
    return "\n".join(lines) + "\n"


def categories_doc():
    """[times in µs, rows of 9: an unused 0, then bytes per category] (PyTorch 2.2+)."""
    t0 = 1749945600000000
    rows = [
        (t0, [0, 400 * g.MiB, 0, 0, 0, 0, 0, 0, 0]),
        (t0 + 1000, [0, 400 * g.MiB, 0, 16 * g.MiB, 0, 0, 0, 0, 0]),
        (t0 + 2000, [0, 400 * g.MiB, 0, 16 * g.MiB, 8 * g.MiB, 300 * g.MiB, 0, 0, 0]),
        (t0 + 3000, [0, 400 * g.MiB, 800 * g.MiB, 16 * g.MiB, 0, 120 * g.MiB, 400 * g.MiB, 0, 0]),
        (t0 + 4000, [0, 400 * g.MiB, 800 * g.MiB, 0, 0, 0, 0, 0, 0]),
    ]
    return [[t for t, _ in rows], [sizes for _, sizes in rows]]


HTML = """<html>
<head><meta charset="utf-8" /><title>GPU Memory Timeline HTML</title></head>
<body>
  <img src='data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=='>
</body>
</html>
"""


def main():
    os.makedirs(OUT, exist_ok=True)
    sim = run_script()
    snap = g.build((2, 10), {0: sim}, sim.frames, 1,
                   settings=g.allocator_settings((2, 10)))
    import pickle
    with open(os.path.join(OUT, "run.pickle"), "wb") as f:
        pickle.dump(snap, f, protocol=4)

    def write_json(name, doc, indent=None):
        with open(os.path.join(OUT, name), "w") as f:
            json.dump(doc, f, indent=indent)
            f.write("\n")

    write_json("run.trace.json", trace_doc(kineto_events(sim)))
    write_json("other_run.trace.json",
               trace_doc(kineto_events(sim, shift_ns=3 * 86_400 * 10**9)))
    write_json("other_process.trace.json",
               trace_doc(kineto_events(sim, addr_shift=64 * g.GiB)))
    write_json("no_base.trace.json", trace_doc(kineto_events(sim), base=False))
    with open(os.path.join(OUT, "run.nvml.jsonl"), "w") as f:
        f.write(nvml_lines(sim))
    write_json("categories.json", categories_doc())
    with open(os.path.join(OUT, "timeline.html"), "w") as f:
        f.write(HTML)
    doc = __doc__.split("\n\n", 2)
    with open(os.path.join(OUT, "README.md"), "w") as f:
        f.write("# profile/: a snapshot and a profiler trace of one synthetic run\n\n")
        f.write("Written by `scripts/gen_profile_pair.py` (do not edit by hand):\n\n```\n")
        f.write(doc[2].strip() + "\n```\n")


if __name__ == "__main__":
    main()
