#!/usr/bin/env python3
"""Write testdata/allocator/: one small snapshot per mechanism of PyTorch's caching
allocator, each trace written out by hand (standard library only).

Run:  python3 scripts/gen_allocator_fixtures.py [--out DIR]   (rewrites testdata/allocator/)

Nothing here models the allocator. Every entry below is what the allocator's algorithm
(shared/spec/caching-allocator.md, sections 1.3-1.6) records for the calls made, worked
out by hand in the comment beside it; the final segments are bookkeeping of those
entries (segments made and freed, ranges mapped and unmapped, blocks alive with the
block sizes the comments give), not a replay. `vramlens simulate` must reproduce every
entry (tests/allocator_fixtures.rs).

Layout: PyTorch 2.5 (protocol 4, allocator_settings, external_annotations), except
gc_threshold.pickle, 2.10 (user_metadata), whose allocator reads
per_process_memory_fraction from PYTORCH_CUDA_ALLOC_CONF.
"""

import argparse
import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(HERE), "testdata", "allocator")

KiB = 1024
MiB = 1024 * KiB
T0 = 1750000000000000
SIDE = 0x55D4C0A3E2D0          # a side stream's cudaStream_t
A = 0x7F0000000000             # segment addresses, far apart
B = 0x7F0010000000
C = 0x7F0020000000
D = 0x7F0030000000
E = 0x7F1000000000             # an expandable segment's reservation (large pool)
F = 0x7F2000000000             # another (small pool)


def frame(name, filename, line):
    return {"name": name, "filename": filename, "line": line}


TRAIN = [frame("step", "train.py", 10), frame("<module>", "train.py", 40)]
EMPTY_CACHE = [frame("empty_cache", "/usr/lib/python3/site-packages/torch/cuda/memory.py", 222),
               frame("<module>", "train.py", 41)]


class Fixture:
    def __init__(self, conf="", max_split=-1, gc=0.0, expandable=False, v210=False):
        self.trace = []
        self.conf = conf
        self.max_split = max_split
        self.gc = gc
        self.expandable = expandable
        self.v210 = v210
        # Bookkeeping of the entries (not a model): segments, mapped ranges, live blocks.
        self.segments = {}      # addr -> (size, stream, small)
        self.mapped = []        # [addr, size, stream, small] ranges, merged when adjacent
        self.live = {}          # addr -> (block size, requested, stream)

    def entry(self, action, addr, size, stream=0, frames=None, **extra):
        e = {"action": action}
        if action == "oom":
            e["device_free"] = extra["device_free"]
        else:
            e["addr"] = addr
        e.update({"size": size, "stream": stream, "time_us": T0 + len(self.trace),
                  "frames": frames if frames is not None else TRAIN})
        if self.v210:
            e["compile_context"] = "N/A"
            e["user_metadata"] = ""
        self.trace.append(e)

    # --- entries, with their bookkeeping ---
    def segment_alloc(self, addr, size, stream=0, small=False):
        self.segments[addr] = (size, stream, small)
        self.entry("segment_alloc", addr, size, stream)

    def segment_free(self, addr, size, stream=0, frames=None):
        assert self.segments.pop(addr)[0] == size
        self.entry("segment_free", addr, size, stream, frames)

    def segment_map(self, addr, size, stream=0, small=False):
        self.mapped.append([addr, size, stream, small])
        self.entry("segment_map", addr, size, stream)

    def segment_unmap(self, addr, size, stream=0, frames=None):
        out = []
        for r in self.mapped:
            lo, hi = r[0], r[0] + r[1]
            if lo <= addr and addr + size <= hi:
                if addr > lo:
                    out.append([lo, addr - lo, r[2], r[3]])
                if addr + size < hi:
                    out.append([addr + size, hi - addr - size, r[2], r[3]])
            else:
                out.append(r)
        self.mapped = out
        self.entry("segment_unmap", addr, size, stream, frames)

    def alloc(self, addr, requested, block, stream=0):
        self.live[addr] = (block, requested, stream)
        self.entry("alloc", addr, requested, stream)

    def free(self, addr, stream=0):
        self.free_requested(addr, stream)
        self.free_completed(addr, stream)

    def free_requested(self, addr, stream=0):
        self.entry("free_requested", addr, self.live[addr][1], stream)

    def free_completed(self, addr, stream=0):
        _, requested, _ = self.live.pop(addr)
        self.entry("free_completed", addr, requested, stream)

    def oom(self, rounded, device_free, stream=0):
        self.entry("oom", 0, rounded, stream, device_free=device_free)

    # --- the file ---
    def final_segments(self):
        spans = [(a, s, st, sm, False) for a, (s, st, sm) in self.segments.items()]
        merged = []
        for r in sorted(self.mapped):
            if merged and merged[-1][0] + merged[-1][1] == r[0] and merged[-1][2] == r[2]:
                merged[-1][1] += r[1]
            else:
                merged.append(list(r))
        spans += [(a, s, st, sm, True) for a, s, st, sm in merged]
        out = []
        for addr, size, stream, small, expandable in sorted(spans):
            blocks = []
            at = addr
            for b in sorted(x for x in self.live if addr <= x < addr + size):
                bsize, req, _ = self.live[b]
                if b > at:
                    blocks.append({"address": at, "size": b - at, "requested_size": 0,
                                   "state": "inactive", "frames": []})
                blocks.append({"address": b, "size": bsize, "requested_size": req,
                               "state": "active_allocated", "frames": TRAIN})
                at = b + bsize
            if at < addr + size:
                blocks.append({"address": at, "size": addr + size - at, "requested_size": 0,
                               "state": "inactive", "frames": []})
            alloc = sum(b["size"] for b in blocks if b["state"] != "inactive")
            out.append({"device": 0, "address": addr, "total_size": size,
                        "allocated_size": alloc, "active_size": alloc,
                        "requested_size": sum(b["requested_size"] for b in blocks),
                        "stream": stream, "segment_type": "small" if small else "large",
                        "segment_pool_id": (0, 0), "is_expandable": expandable,
                        "frames": TRAIN, "blocks": blocks})
        return out

    def write(self, name):
        settings = {"PYTORCH_CUDA_ALLOC_CONF": self.conf, "max_split_size": self.max_split,
                    "garbage_collection_threshold": self.gc,
                    "expandable_segments": self.expandable,
                    "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
                    "pinned_use_cuda_host_register": False,
                    "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}}
        if self.v210:
            settings["graph_capture_record_stream_reuse"] = False
        snap = {"segments": self.final_segments(), "device_traces": [self.trace],
                "allocator_settings": settings, "external_annotations": []}
        os.makedirs(OUT, exist_ok=True)
        with open(os.path.join(OUT, name), "wb") as f:
            pickle.dump(snap, f, protocol=4)


def split_rules():
    """Rounding, best fit and the split thresholds of both pools."""
    x = Fixture()
    # 12 MiB (>= 10 MiB): a segment of 12 MiB (rounded to 2 MiB), taken whole.
    x.segment_alloc(A, 12 * MiB)
    x.alloc(A, 12 * MiB, 12 * MiB)
    x.free(A)
    # 11 MiB from the free 12 MiB: 1 MiB left is not more than 1 MiB, not split off.
    x.alloc(A, 11 * MiB, 12 * MiB)
    x.free(A)
    # 10.5 MiB: 1.5 MiB left, more than 1 MiB: split; [A + 10.5 MiB, 1.5 MiB] free.
    x.alloc(A, 21 * MiB // 2, 21 * MiB // 2)
    # 1000 B: small pool (<= 1 MiB), rounded to 1024; a 2 MiB small segment.
    x.segment_alloc(B, 2 * MiB, small=True)
    x.alloc(B, 1000, 1024)
    # 2000 B: rounded to 2048, from the small segment's rest (split: >= 512 B left).
    x.alloc(B + 1024, 2000, 2048)
    # 1258291 B (rounded 1258496): the free 1.5 MiB block is the best fit; 314368 B
    # left is not split off: the block is 1.5 MiB.
    x.alloc(A + 21 * MiB // 2, 1258291, 3 * MiB // 2)
    # 3 MiB: between 1 and 10 MiB, a 20 MiB segment; 17 MiB left, split off.
    x.segment_alloc(C, 20 * MiB)
    x.alloc(C, 3 * MiB, 3 * MiB)
    x.free(A)
    # 2 MiB: free large blocks [A, 10.5 MiB] and [C + 3 MiB, 17 MiB]: best fit takes
    # the smaller, at A; 8.5 MiB left, split off.
    x.alloc(A, 2 * MiB, 2 * MiB)
    x.write("split_rules.pickle")


def max_split():
    """max_split_size_mb:40: oversize blocks kept whole, released before a retry."""
    x = Fixture(conf="max_split_size_mb:40", max_split=40 * MiB)
    # 64 MiB (oversize): a 64 MiB segment, never split.
    x.segment_alloc(A, 64 * MiB)
    x.alloc(A, 64 * MiB, 64 * MiB)
    x.free(A)
    # 16 MiB: the free 64 MiB block is oversize and 16 MiB is not: refused; new segment.
    x.segment_alloc(B, 16 * MiB)
    x.alloc(B, 16 * MiB, 16 * MiB)
    # 50 MiB (oversize): 64 < 50 + 20 MiB of slack: taken whole, not split.
    x.alloc(A, 50 * MiB, 64 * MiB)
    x.free(A)
    # 30 MiB: no fit (64 MiB is oversize); cudaMalloc fails (the device is full);
    # release_available_cached_blocks frees the smallest free block >= max(30, 40) MiB,
    # the 64 MiB segment; the next cudaMalloc succeeds.
    x.segment_free(A, 64 * MiB)
    x.segment_alloc(C, 30 * MiB)
    x.alloc(C, 30 * MiB, 30 * MiB)
    x.write("max_split.pickle")


def gc_threshold():
    """garbage_collection_threshold:0.5 under a memory fraction of 0.99 of 100 MiB:
    allowed 103809024 B, threshold 51904512 B. The GC clock ticks at each search."""
    x = Fixture(conf="garbage_collection_threshold:0.5,per_process_memory_fraction:0.99",
                gc=0.5, v210=True)
    x.segment_alloc(A, 30 * MiB)            # search 1 fails; reserved 0 <= threshold
    x.alloc(A, 30 * MiB, 30 * MiB)
    x.segment_alloc(B, 24 * MiB)            # search 2 fails; 30 MiB <= threshold
    x.alloc(B, 24 * MiB, 24 * MiB)
    x.free(A)                               # free since clock 2
    x.free(B)                               # free since clock 2
    x.alloc(B, 24 * MiB, 24 * MiB)          # search 3 takes the 24 MiB block
    x.free(B)                               # free since clock 3
    # 40 MiB: search 4 fails; reserved 54 MiB > threshold: GC, target 4718592 B; ages
    # A: 4 - 2 = 2, B: 4 - 3 = 1, average 1.5: A goes (30 MiB >= target). Then
    # 24 + 40 MiB <= the allowed 99 MiB: a new segment.
    x.segment_free(A, 30 * MiB)
    x.segment_alloc(C, 40 * MiB)
    x.alloc(C, 40 * MiB, 40 * MiB)
    x.write("gc_threshold.pickle")


def expandable():
    """expandable_segments:True: 20 MiB pages mapped as needed, unmapped by empty_cache."""
    x = Fixture(conf="expandable_segments:True", expandable=True)
    # 16 MiB: a new reservation at E; one 20 MiB page mapped; 4 MiB left, split off.
    x.segment_map(E, 20 * MiB)
    x.alloc(E, 16 * MiB, 16 * MiB)
    # 16 MiB: the free 4 MiB is too small; the unmapped rest after it, with the free 4
    # MiB before it, can hold it: one page more at E + 20 MiB, merged with the 4 MiB.
    x.segment_map(E + 20 * MiB, 20 * MiB)
    x.alloc(E + 16 * MiB, 16 * MiB, 16 * MiB)   # 8 MiB left at E + 32 MiB
    x.free(E)
    # 4 MiB: free blocks [E + 32, 8 MiB] (followed by unmapped space: it could grow to
    # the whole reservation) and [E, 16 MiB] (cannot grow): best fit by the size a block
    # can grow to takes [E, 16 MiB]; 12 MiB left, split off.
    x.alloc(E, 4 * MiB, 4 * MiB)
    x.free(E + 16 * MiB)                        # merges: [E + 4, 36 MiB] free
    # empty_cache(): the whole pages inside [E + 4, E + 40) are [E + 20, E + 40).
    x.segment_unmap(E + 20 * MiB, 20 * MiB, frames=EMPTY_CACHE)
    # 1000 B: the small pool's own reservation at F, 2 MiB pages.
    x.segment_map(F, 2 * MiB, small=True)
    x.alloc(F, 1000, 1024)
    x.write("expandable.pickle")


def pending_frees():
    """Frees that wait for other streams (record_stream): not reused until completed."""
    x = Fixture()
    x.segment_alloc(A, 16 * MiB)
    x.alloc(A, 16 * MiB, 16 * MiB)
    x.free_requested(A)                      # used on another stream: waits
    # 16 MiB: A is waiting, not free: a new segment.
    x.segment_alloc(B, 16 * MiB)
    x.alloc(B, 16 * MiB, 16 * MiB)
    x.free_completed(A)                      # its event done (process_events)
    # 12 MiB: A's 16 MiB block, 4 MiB left split off.
    x.alloc(A, 12 * MiB, 12 * MiB)
    # 16 MiB on the side stream: free blocks of stream 0 are not its own: new segment.
    x.segment_alloc(C, 16 * MiB, stream=SIDE)
    x.alloc(C, 16 * MiB, 16 * MiB, stream=SIDE)
    x.write("pending_frees.pickle")


def oom_retry():
    """The out-of-memory retry: every whole cached segment released, then the retry;
    then a request nothing can serve (fragmentation: 20 MiB free in a split segment)."""
    x = Fixture()
    x.segment_alloc(A, 40 * MiB)
    x.alloc(A, 40 * MiB, 40 * MiB)
    x.segment_alloc(B, 40 * MiB)
    x.alloc(B, 40 * MiB, 40 * MiB)
    x.free(B)
    x.alloc(B, 20 * MiB, 20 * MiB)           # split: [B + 20, 20 MiB] free
    x.free(A)
    # 50 MiB: no free block fits; cudaMalloc fails (80 + 50 > 120 MiB); the retry frees
    # every whole free segment in (stream, size, address) order: [B + 20] is split,
    # [A, 40 MiB] whole; then cudaMalloc of 50 MiB succeeds (40 + 50 <= 120).
    x.segment_free(A, 40 * MiB)
    x.segment_alloc(C, 50 * MiB)
    x.alloc(C, 50 * MiB, 50 * MiB)
    # 40 MiB: no fit, cudaMalloc fails (90 + 40 > 120), nothing whole to free: out of
    # memory, the device having 30 MiB free.
    x.oom(40 * MiB, device_free=30 * MiB)
    x.write("oom_retry.pickle")


def tie_break():
    """Two free 8 MiB blocks of one size: the allocator takes the lower address, which
    leaves the upper one to merge into a 20 MiB block for a 20 MiB request: 40 MiB
    reserved at most. Taking the upper one instead leaves no 20 MiB block: a third
    segment, 60 MiB."""
    x = Fixture()
    x.segment_alloc(A, 20 * MiB)
    x.alloc(A, 8 * MiB, 8 * MiB)                  # [A, 8 MiB]; 12 MiB left, split off
    x.alloc(A + 8 * MiB, 12 * MiB, 12 * MiB)      # the 12 MiB left, exactly
    x.segment_alloc(B, 20 * MiB)
    x.alloc(B, 8 * MiB, 8 * MiB)
    x.alloc(B + 8 * MiB, 12 * MiB, 12 * MiB)
    x.free(A)                                     # [A, 8 MiB] free
    x.free(B)                                     # [B, 8 MiB] free: equal sizes
    x.alloc(A, 8 * MiB, 8 * MiB)                  # the lower address of the two
    x.free(B + 8 * MiB)                           # merges with [B, 8 MiB]: 20 MiB free
    x.alloc(B, 20 * MiB, 20 * MiB)                # no new segment
    x.write("tie_break.pickle")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=OUT, help="folder to write (default: testdata/allocator)")
    OUT = ap.parse_args().out
    split_rules()
    max_split()
    gc_threshold()
    expandable()
    pending_frees()
    oom_retry()
    tie_break()
