#!/usr/bin/env python3
"""Tile a real snapshot into a large one, for benchmarks.

    python3 scripts/bench_tile.py --tiles 280 -o bench-data/tiled_280.pickle \\
        ../shared/data/cs336-kkaitlyn111/memory_ctx128_fullstep.pickle

The trace of device 0 (or --device) is repeated --tiles times; every tile gets fresh
addresses (shifted by a multiple of 2^37, past the original span) and times shifted by
one recording period. Each trace entry is a new dict, but its `frames` list is the same
object as in the original, so from the second tile on an entry is written as about 60
bytes: a dict of memo references and integers, the frames list read back from the memo
(the shape of a long recording whose stacks repeat). The final `segments` are the
original ones moved to the last tile's addresses; `allocator_settings` and
`external_annotations` are kept.

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

ADDR_STEP = 1 << 37


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


def shifted_segments(segments, offset):
    out = []
    for s in segments:
        s2 = dict(s)
        s2['address'] = s['address'] + offset
        s2['blocks'] = []
        for b in s['blocks']:
            b2 = dict(b)
            if 'address' in b2:
                b2['address'] = b['address'] + offset
            s2['blocks'].append(b2)
        out.append(s2)
    return out


def tile_entry(e, k, period):
    e2 = dict(e)
    if 'addr' in e2 and e2.get('action') != 'oom':
        e2['addr'] = e['addr'] + k * ADDR_STEP
    if 'time_us' in e2:
        e2['time_us'] = e['time_us'] + k * period
    return e2


def write_tiled(snap, device, tiles, fh):
    trace = snap['device_traces'][device]
    times = [e['time_us'] for e in trace if 'time_us' in e]
    period = (max(times) - min(times) + 1000) if times else 0
    w = Writer(fh)
    w.frame += b'}'
    w.memoize(snap)
    keys = list(snap.keys())
    w.frame += b'('
    for key in keys:
        w.save(key)
        if key == 'segments':
            w.save(shifted_segments(snap['segments'], (tiles - 1) * ADDR_STEP), keep=False)
        elif key == 'device_traces':
            write_traces(w, snap['device_traces'], device, tiles, period)
        else:
            w.save(snap[key])
    w.frame += b'u'
    w.finish()


def write_traces(w, traces, device, tiles, period):
    w.frame += b']'
    w.memoize(traces, keep=False)
    w.frame += b'('
    for d, t in enumerate(traces):
        if d != device:
            w.save(t, keep=False)
            continue
        w.frame += b']'
        w.memoize(t, keep=False)
        total = len(t) * tiles
        if total == 0:
            continue
        if total == 1:
            w.save(tile_entry(t[0], 0, period), keep=False)
            w.frame += b'a'
            continue
        n = 0
        templates = None
        for k in range(tiles):
            if k == 1:
                templates = [entry_template(w, e) for e in t]
            for i, e in enumerate(t):
                if n % 1000 == 0:
                    w.frame += b'('
                tpl = templates[i] if templates else None
                if tpl is None:
                    w.save(tile_entry(e, k, period), keep=False)
                else:
                    # Same bytes as save() would write: everything but the shifted
                    # integers is a memo reference by now.
                    parts, addr_at, time_at = tpl
                    if addr_at is not None:
                        parts[addr_at] = enc_int(e['addr'] + k * ADDR_STEP)
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
    """The bytes of a tiled entry as parts, with the places of the shifted integers;
    None when a value is not a memo reference or a plain integer by now."""
    if len(e) < 2:
        return None
    parts = [b'}\x94(']
    addr_at = time_at = None
    for key, value in e.items():
        if id(key) not in w.memo:
            return None
        parts.append(enc_get(w.memo[id(key)]))
        if isinstance(value, bool) or value is None:
            return None
        if isinstance(value, int):
            if key == 'addr' and e.get('action') != 'oom':
                addr_at = len(parts)
            elif key == 'time_us':
                time_at = len(parts)
            parts.append(enc_int(value))
        elif id(value) in w.memo:
            parts.append(enc_get(w.memo[id(value)]))
        else:
            return None
    parts.append(b'u')
    return parts, addr_at, time_at


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('snapshot')
    ap.add_argument('--tiles', type=int, required=True)
    ap.add_argument('--device', type=int, default=0)
    ap.add_argument('-o', '--output', required=True)
    ap.add_argument('--verify', action='store_true')
    args = ap.parse_args(argv)
    with open(args.snapshot, 'rb') as f:
        snap = pickle.load(f)
    tmp = args.output + '.part'
    with open(tmp, 'wb') as fh:
        write_tiled(snap, args.device, args.tiles, fh)
    os.replace(tmp, args.output)
    size = os.path.getsize(args.output)
    n = len(snap['device_traces'][args.device]) * args.tiles
    print('%s: %.1f MB, %d trace entries (%.0f bytes each)'
          % (args.output, size / 1e6, n, size / max(n, 1)), file=sys.stderr)
    if args.verify:
        with open(args.output, 'rb') as f:
            got = pickle.load(f)
        trace = snap['device_traces'][args.device]
        times = [e['time_us'] for e in trace if 'time_us' in e]
        period = (max(times) - min(times) + 1000) if times else 0
        want = [tile_entry(e, k, period) for k in range(args.tiles) for e in trace]
        assert got['device_traces'][args.device] == want, 'trace differs'
        assert got['segments'] == shifted_segments(
            snap['segments'], (args.tiles - 1) * ADDR_STEP), 'segments differ'
        for key in snap:
            if key not in ('segments', 'device_traces'):
                assert got[key] == snap[key], key
        print('verified', file=sys.stderr)
    return 0


if __name__ == '__main__':
    sys.exit(main())
