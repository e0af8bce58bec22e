#!/usr/bin/env python3
"""Tile a real snapshot into a large one, for benchmarks.

    python3 scripts/bench_tile.py --tiles 630 -o bench-data/tiled_1g.pickle \\
        ../shared/data/cs336-cliffkai/memory_snapshot_xl_bwd.pickle

The trace of device 0 (or --device) is repeated --tiles times, as a job that runs the
recorded step again and again would record it: every tile but the last ends by freeing
what its step left allocated (free_requested and free_completed, with the stack of the
allocation) and by `torch.cuda.empty_cache()`, which gives back the segments the step
created (segment_free, in the order the allocator releases them: the large pool, then
the small one, each by size, then address). That is the state the step started from,
so the next tile's entries, addresses included, are the recorded ones again (a segment
freed and allocated again at the same address, as the driver hands it out) and only
the times move on, by one recording period per tile. The last tile is the recording
as it ends, so the final `segments` are the original ones: the file is a stream the
caching allocator could have written, and one that replays as the original does.

This needs a recording whose segments from before the trace all hold something
(`empty_cache` would give back an empty one, and the next tile would use memory the
allocator no longer has) and whose trace frees nothing allocated before it; the
script refuses others.

Each trace entry is a new dict, but its `frames` list is the same object as in the
original, so from the second tile on an entry is written as about 60 bytes: a dict of
memo references and integers, the frames list read back from the memo (the shape of a
long recording whose stacks repeat). `allocator_settings` and `external_annotations`
are kept.

The file is written streaming, opcode for opcode as CPython's C pickler writes
protocol 4 (FRAME of 64 KiB at object boundaries, MEMOIZE after every str, dict, list
and tuple, SETITEMS/APPENDS batches of 1000, BINGET/LONG_BINGET), so memory stays at
the size of the original snapshot. With --verify the result is loaded again and
compared entry by entry with the tiling done in memory (use it on a few tiles).
Stdlib only.
"""

import argparse
import os
import pickle
import sys

from pickle_bytes import FRAME_TARGET, Frames, enc_get, enc_int, pack_f64, pack_u32



class Writer(Frames):
    """A protocol-4 pickler over Python objects, memoizing by identity as CPython
    does, with a frame buffer committed at object boundaries."""

    def __init__(self, fh):
        super().__init__(fh)
        self.memo = {}       # id -> memo index
        self.keep = []       # memoized objects stay alive, so their ids stay unique
        self.memo_n = 0

    def boundary(self):
        if len(self.frame) >= FRAME_TARGET:
            self.commit()

    def memoize(self, obj, keep=True):
        self.frame += b'\x94'
        if keep:
            self.memo[id(obj)] = self.memo_n
            self.keep.append(obj)
        self.memo_n += 1

    def save(self, obj, keep=True):
        """Writes one object. keep=False: a transient container (not referenced again):
        memoized as CPython would, without remembering it."""
        f = self.frame
        if obj is None:
            f += b'N'
        elif obj is True:
            f += b'\x88'
        elif obj is False:
            f += b'\x89'
        elif isinstance(obj, int):
            f += enc_int(obj)
        elif isinstance(obj, float):
            f += b'G' + pack_f64(obj)
        elif id(obj) in self.memo:
            f += enc_get(self.memo[id(obj)])
        elif isinstance(obj, str):
            data = obj.encode('utf-8', 'surrogatepass')
            if len(data) < 256:
                f += b'\x8c' + bytes((len(data),)) + data
            else:
                f += b'X' + pack_u32(len(data)) + data
            self.memoize(obj)
        elif isinstance(obj, tuple):
            if not obj:
                f += b')'
            elif len(obj) <= 3:
                for x in obj:
                    self.save(x)
                self.frame += (b'\x85', b'\x86', b'\x87')[len(obj) - 1]
                self.memoize(obj, keep)
            else:
                f += b'('
                for x in obj:
                    self.save(x)
                self.frame += b't'
                self.memoize(obj, keep)
        elif isinstance(obj, list):
            f += b']'
            self.memoize(obj, keep)
            self.batches(obj, False)
        elif isinstance(obj, dict):
            f += b'}'
            self.memoize(obj, keep)
            self.batches(list(obj.items()), True)
        else:
            raise TypeError('unsupported type %s' % type(obj).__name__)
        self.boundary()

    def batches(self, items, pairs):
        if len(items) == 1:
            self.item(items[0], pairs)
            self.frame += b's' if pairs else b'a'
            return
        for i in range(0, len(items), 1000):
            self.frame += b'('
            for it in items[i:i + 1000]:
                self.item(it, pairs)
            self.frame += b'u' if pairs else b'e'

    def item(self, it, pairs):
        if pairs:
            self.save(it[0])
            self.save(it[1])
        else:
            self.save(it)


SMALL_SEGMENT = 2 << 20  # the small pool's segments (blocks up to 1 MiB)


class NotTileable(Exception):
    pass


def step_cleanup(trace, segments, device):
    """The entries that take the recorded step back to where it started: the frees of
    what it left allocated (latest first) and the empty_cache that gives back the
    segments it created. Their time is the step's last; `tile` shifts it."""
    open_allocs = {}
    created = {}
    for e in trace:
        a = e['action']
        if a == 'alloc':
            open_allocs[e['addr']] = e
        elif a == 'free_completed':
            if open_allocs.pop(e['addr'], None) is None:
                raise NotTileable('its trace frees memory allocated before it (at %#x)'
                                  % e['addr'])
        elif a == 'segment_alloc':
            created[e['addr']] = e
        elif a == 'segment_free':
            created.pop(e['addr'], None)
    for s in segments:
        if s.get('device', device) != device or s['address'] in created:
            continue
        if not any(b['state'] == 'active_allocated' and b['address'] not in open_allocs
                   for b in s['blocks']):
            raise NotTileable('its segment at %#x holds nothing from before the trace '
                              '(empty_cache would give it back)' % s['address'])
    # The keys and action strings as the file has them (one object each, read back
    # from the memo), so the cleanup's entries are memo references like the rest.
    any_free = next((e for e in trace if e['action'] == 'free_requested'), None)
    any_done = next((e for e in trace if e['action'] == 'free_completed'), None)
    if any_free is None or any_done is None:
        raise NotTileable('its trace has no frees to copy the shape of')
    last_time = max((e['time_us'] for e in trace if 'time_us' in e), default=None)
    out = []

    def entry(action, addr, size, stream, frames):
        e = {}
        for k in any_free:
            e[k] = {'action': action, 'addr': addr, 'size': size, 'stream': stream,
                    'time_us': last_time, 'frames': frames}.get(k, any_free[k])
        return e

    for a in reversed(list(open_allocs.values())):
        for kind in (any_free['action'], any_done['action']):
            out.append(entry(kind, a['addr'], a['size'], a['stream'], a.get('frames', [])))
    segment_free = 'segment_free'
    release_frames = empty_cache_frames(trace)
    order = sorted(created.values(),
                   key=lambda s: (s['size'] <= SMALL_SEGMENT, s['stream'], s['size'], s['addr']))
    for s in order:
        out.append(entry(segment_free, s['addr'], s['size'], s['stream'], release_frames))
    return out


def empty_cache_frames(trace):
    """The stack of a `torch.cuda.empty_cache()` call, as the recording writes stacks
    (the C++ frames, then the Python one), its dicts shaped as the file's frames."""
    template = next((f for e in trace for f in e.get('frames', ())), None)
    torch_dir = next((f['filename'].rsplit('/torch/', 1)[0] + '/torch/'
                      for e in trace for f in e.get('frames', ())
                      if '/torch/' in f.get('filename', '')), 'torch/')
    names = [
        ('c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::emptyCache()',
         'CUDACachingAllocator.cpp', 0),
        ('c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::emptyCache()',
         '', 0),
        ('THCPModule_emptyCache(_object*, _object*)', 'Module.cpp', 0),
        ('empty_cache', torch_dir + 'cuda/memory.py', 222),
    ]
    if template is None:
        return []
    keys = list(template)
    out = []
    for name, filename, line in names:
        values = {'name': name, 'filename': filename, 'line': line}
        out.append({k: values.get(k, template[k]) for k in keys})
    return out


def tile_entry(e, k, period):
    e2 = dict(e)
    if 'time_us' in e2 and e2['time_us'] is not None:
        e2['time_us'] = e['time_us'] + k * period
    return e2


def tile_plan(snap, device):
    """(the step with its cleanup, the step alone, the period between tiles)."""
    trace = snap['device_traces'][device]
    step = trace + step_cleanup(trace, snap['segments'], device)
    times = [e['time_us'] for e in step if e.get('time_us') is not None]
    period = (max(times) - min(times) + 1000) if times else 0
    return step, trace, period


def tiled_trace(snap, device, tiles):
    """The tiled trace in memory (for --verify)."""
    step, last, period = tile_plan(snap, device)
    out = []
    for k in range(tiles):
        out += [tile_entry(e, k, period) for e in (last if k == tiles - 1 else step)]
    return out


def write_tiled(snap, device, tiles, fh):
    step, last, period = tile_plan(snap, device)
    w = Writer(fh)
    w.frame += b'}'
    w.memoize(snap)
    keys = list(snap.keys())
    w.frame += b'('
    for key in keys:
        w.save(key)
        if key == 'device_traces':
            write_traces(w, snap['device_traces'], device, tiles, step, last, period)
        else:
            w.save(snap[key])
    w.frame += b'u'
    w.finish()


def write_traces(w, traces, device, tiles, step, last, period):
    w.frame += b']'
    w.memoize(traces, keep=False)
    w.frame += b'('
    for d, t in enumerate(traces):
        if d != device:
            w.save(t, keep=False)
            continue
        w.frame += b']'
        w.memoize(t, keep=False)
        total = len(step) * (tiles - 1) + len(last)
        if total == 0:
            continue
        if total == 1:
            w.save(tile_entry(last[0], 0, period), keep=False)
            w.frame += b'a'
            continue
        n = 0
        templates = None
        for k in range(tiles):
            if k == 1:
                templates = [entry_template(w, e) for e in step]
            for i, e in enumerate(last if k == tiles - 1 else step):
                if n % 1000 == 0:
                    w.frame += b'('
                tpl = templates[i] if templates else None
                if tpl is None:
                    w.save(tile_entry(e, k, period), keep=False)
                else:
                    # Same bytes as save() would write: everything but the shifted
                    # time is a memo reference by now.
                    parts, time_at = tpl
                    if time_at is not None:
                        parts[time_at] = enc_int(e['time_us'] + k * period)
                    w.frame += b''.join(parts)
                    w.memo_n += 1
                    w.boundary()
                n += 1
                if n % 1000 == 0 or n == total:
                    w.frame += b'e'
    w.frame += b'e'


def entry_template(w, e):
    """The bytes of a tiled entry as parts, with the place of the shifted time; None
    when a value is not a memo reference or a plain integer by now."""
    if len(e) < 2:
        return None
    parts = [b'}\x94(']
    time_at = None
    for key, value in e.items():
        if id(key) not in w.memo:
            return None
        parts.append(enc_get(w.memo[id(key)]))
        if isinstance(value, bool) or value is None:
            return None
        if isinstance(value, int):
            if key == 'time_us':
                time_at = len(parts)
            parts.append(enc_int(value))
        elif id(value) in w.memo:
            parts.append(enc_get(w.memo[id(value)]))
        else:
            return None
    parts.append(b'u')
    return parts, time_at


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('snapshot')
    ap.add_argument('--tiles', type=int, required=True)
    ap.add_argument('--device', type=int, default=0)
    ap.add_argument('-o', '--output', required=True)
    ap.add_argument('--verify', action='store_true')
    args = ap.parse_args(argv)
    if args.tiles < 1:
        ap.error('--tiles must be at least 1')
    with open(args.snapshot, 'rb') as f:
        snap = pickle.load(f)
    try:
        step, last, _ = tile_plan(snap, args.device)
    except NotTileable as ex:
        print('%s: cannot be tiled: %s' % (args.snapshot, ex), file=sys.stderr)
        return 2
    tmp = args.output + '.part'
    with open(tmp, 'wb') as fh:
        write_tiled(snap, args.device, args.tiles, fh)
    os.replace(tmp, args.output)
    size = os.path.getsize(args.output)
    n = len(step) * (args.tiles - 1) + len(last)
    print('%s: %.1f MB, %d trace entries (%.0f bytes each)'
          % (args.output, size / 1e6, n, size / max(n, 1)), file=sys.stderr)
    if args.verify:
        with open(args.output, 'rb') as f:
            got = pickle.load(f)
        assert got['device_traces'][args.device] == tiled_trace(
            snap, args.device, args.tiles), 'trace differs'
        for key in snap:
            if key != 'device_traces':
                assert got[key] == snap[key], key
        print('verified', file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
