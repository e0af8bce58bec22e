#!/usr/bin/env python3
"""Time `vramlens report` and how long headless Chromium takes to load the page.

    python3 scripts/bench_report.py target/release/vramlens bench-data/snap_300m.pickle
    python3 scripts/bench_report.py target/release/vramlens ../shared/data/ccl-bench-torchtitan-fsdp-oom

For each set of inputs: the wall time of `vramlens report` (median of --runs), the page's
size, and Chromium's Navigation Timing for a copy of the page with one more inline script
that writes `domContentLoadedEventEnd` and `loadEventStart` into the page when it loads
(the page's policy allows inline scripts; nothing else differs). Chromium runs headless
with networking off and a fresh profile each time. Prints one Markdown table row per input.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time

PROBE = """<script>
window.addEventListener('load', function () {
  var n = performance.getEntriesByType('navigation')[0];
  var p = document.createElement('pre');
  p.id = 'bench-timing';
  p.textContent = JSON.stringify({dcl: n.domContentLoadedEventEnd, load: n.loadEventStart});
  document.body.appendChild(p);
});
</script>
"""

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--no-proxy-server",
    "--host-resolver-rules=MAP * ~NOTFOUND", "--window-size=1400,1000", "--dump-dom",
]


def chromium():
    for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if os.path.exists(p):
            return p
    raise SystemExit("chromium not found in /usr/bin")


def load_times(page, runs, work):
    dcl, load, wall = [], [], []
    for i in range(runs):
        profile = os.path.join(work, f"profile{i}")
        t0 = time.perf_counter()
        out = subprocess.run(
            [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "file://" + page],
            capture_output=True, text=True, check=True)
        wall.append(time.perf_counter() - t0)
        shutil.rmtree(profile, ignore_errors=True)
        m = re.search(r'<pre id="bench-timing">(.*?)</pre>', out.stdout)
        if not m:
            raise SystemExit("the page did not report its timing")
        t = json.loads(m.group(1))
        dcl.append(t["dcl"])
        load.append(t["load"])
    return statistics.median(dcl), statistics.median(load), statistics.median(wall)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("vramlens")
    ap.add_argument("inputs", nargs="+", help="one set of inputs per report (a file or folder)")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    print("| input | input MB | report MB | `vramlens report` s | Chromium DOMContentLoaded ms | load ms | Chromium process s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as work:
        blank = os.path.join(work, "blank.html")
        with open(blank, "w") as f:
            f.write("<!DOCTYPE html><html><body>" + PROBE + "</body></html>")
        _, _, blank_wall = load_times(blank, args.runs, work)
        for inp in args.inputs:
            page = os.path.join(work, "report.html")
            walls = []
            for _ in range(args.runs):
                if os.path.exists(page):
                    os.remove(page)
                t0 = time.perf_counter()
                subprocess.run([args.vramlens, "report", inp, "-o", page],
                               check=True, stdout=subprocess.DEVNULL)
                walls.append(time.perf_counter() - t0)
            size = os.path.getsize(page)
            with open(page) as f:
                html = f.read()
            probed = os.path.join(work, "probed.html")
            with open(probed, "w") as f:
                f.write(html.replace("</body>", PROBE + "</body>", 1))
            dcl, load, wall = load_times(probed, args.runs, work)
            if os.path.isdir(inp):
                in_size = sum(os.path.getsize(os.path.join(inp, n)) for n in os.listdir(inp))
            else:
                in_size = os.path.getsize(inp)
            print(f"| {os.path.basename(inp.rstrip('/'))} | {in_size / 1e6:.1f} | {size / 1e6:.2f} "
                  f"| {statistics.median(walls):.2f} | {dcl:.0f} | {load:.0f} "
                  f"| {wall:.2f} (blank page {blank_wall:.2f}) |")


if __name__ == "__main__":
    main()
