"""Protocol-4 pickle bytes as CPython's C pickler writes them, for the benchmark file
writers (scripts/bench_gen.py, scripts/bench_tile.py): integer and memo-get opcodes, and
a frame buffer committed as FRAME opcodes of about 64 KiB. Stdlib only.
"""

import struct

FRAME_TARGET = 64 * 1024
MEMOIZE = b'\x94'
STOP = b'.'
pack_u32 = struct.Struct('<I').pack
pack_f64 = struct.Struct('>d').pack


def enc_int(v):
    """save_long() for protocol >= 2."""
    if -0x80000000 <= v <= 0x7fffffff:
        if v >= 0:
            if v < 0x100:
                return b'K' + bytes((v,))
            if v < 0x10000:
                return b'M' + v.to_bytes(2, 'little')
        return b'J' + v.to_bytes(4, 'little', signed=True)
    nbytes = (v.bit_length() >> 3) + 1
    data = v.to_bytes(nbytes, 'little', signed=True)
    if v < 0 and nbytes > 1 and data[-1] == 0xff and (data[-2] & 0x80):
        data = data[:-1]
    if len(data) < 256:
        return b'\x8a' + bytes((len(data),)) + data
    return b'\x8b' + len(data).to_bytes(4, 'little', signed=True) + data


def enc_get(idx):
    """BINGET / LONG_BINGET of memo slot `idx`."""
    if idx < 256:
        return b'h' + bytes((idx,))
    return b'j' + pack_u32(idx)


class Frames:
    """The output file: PROTO 4 outside any frame, then `frame` (bytes the writer adds)
    written as one FRAME each time `commit` is called (a frame under 4 bytes is written
    bare, as CPython does), and STOP at the end."""

    def __init__(self, fh):
        self.fh = fh
        self.frame = bytearray()
        fh.write(b'\x80\x04')

    def commit(self):
        n = len(self.frame)
        if n >= 4:
            self.fh.write(b'\x95' + n.to_bytes(8, 'little'))
        self.fh.write(self.frame)
        self.frame = bytearray()

    def finish(self):
        self.frame += STOP
        self.commit()
