#!/usr/bin/env python3
"""Benchmark `vramlens export` against `vramlens summary` on the same input.

    python3 scripts/bench_export.py [--vramlens target/release/vramlens] [--repeat 5] INPUT...

INPUT is a snapshot file or a folder of them (exported in one call). For each input the
commands below run --repeat times, interleaved, each in a fresh process under
`/usr/bin/time -f` (wall, user and system CPU seconds, peak RSS), with the page cache
warmed first; every run of export writes to a new temporary folder, removed after. While
a command runs, /proc/PID/status is sampled every 5 ms for the peak of anonymous memory
(RssAnon), which leaves out the pages of the memory-mapped input that peak RSS counts.

  summary         vramlens summary --json INPUT > /dev/null
  export parquet  vramlens export INPUT -o TMP
  export jsonl    vramlens export INPUT -o TMP --format jsonl

Prints a Markdown table of medians: wall s, CPU s (user + system), CPU / wall (above 1
when more than one core was used), peak RSS MB, peak anonymous MB, and the ratios of
export to summary. MB = 10^6 bytes. Stdlib only.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def warm(path):
    paths = [path]
    if os.path.isdir(path):
        paths = [os.path.join(path, n) for n in sorted(os.listdir(path))]
    buf = bytearray(1 << 20)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def input_bytes(path):
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))
    return os.path.getsize(path)


def run(cmd):
    """(wall s, cpu s, peak RSS bytes, peak RssAnon bytes) of one run."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as tf:
        full = ["/usr/bin/time", "-o", tf.name, "-f", "%e %U %S %M"] + cmd
        p = subprocess.Popen(full, stdout=subprocess.DEVNULL)
        anon = [0]

        def sample():
            while p.poll() is None:
                try:
                    # /usr/bin/time's child is vramlens.
                    children = open(f"/proc/{p.pid}/task/{p.pid}/children").read().split()
                    for c in children:
                        for line in open(f"/proc/{c}/status"):
                            if line.startswith("RssAnon:"):
                                anon[0] = max(anon[0], int(line.split()[1]) * 1024)
                except (OSError, ValueError):
                    pass
                time.sleep(0.005)

        t = threading.Thread(target=sample)
        t.start()
        rc = p.wait()
        t.join()
        if rc != 0:
            sys.exit(f"failed ({rc}): {' '.join(cmd)}")
        wall, user, sys_, rss = tf.read().split()[-4:]
        return float(wall), float(user) + float(sys_), int(rss) * 1024, anon[0]


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--vramlens", default="target/release/vramlens")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("inputs", nargs="+")
    args = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="vramlens-bench-export-")
    print("| input | MB | command | wall s | CPU s | CPU/wall | peak RSS MB | peak anon MB |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    try:
        for inp in args.inputs:
            warm(inp)
            size = input_bytes(inp)
            out = os.path.join(tmp, "out")
            legs = {
                "summary --json": [args.vramlens, "summary", "--json", inp],
                "export (parquet)": [args.vramlens, "export", inp, "-o", out],
                "export --format jsonl": [args.vramlens, "export", inp, "-o", out, "--format", "jsonl"],
            }
            results = {name: [] for name in legs}
            for _ in range(args.repeat):
                for name, cmd in legs.items():
                    shutil.rmtree(out, ignore_errors=True)
                    results[name].append(run(cmd))
            shutil.rmtree(out, ignore_errors=True)
            med = {n: [statistics.median(col) for col in zip(*r)] for n, r in results.items()}
            for name, (wall, cpu, rss, anon) in med.items():
                print(f"| {os.path.basename(inp.rstrip('/'))} | {size / 1e6:.1f} | `{name}` | "
                      f"{wall:.2f} | {cpu:.2f} | {cpu / wall:.2f} | {rss / 1e6:.0f} | {anon / 1e6:.0f} |")
            base = med["summary --json"]
            for name in list(legs)[1:]:
                m = med[name]
                print(f"<!-- {name}: wall {m[0] / base[0]:.2f}x summary, CPU {m[1] / base[1]:.2f}x, "
                      f"peak RSS {m[2] / size:.2f} of the input, anon {m[3] / size:.2f} -->")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
