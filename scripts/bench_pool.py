#!/usr/bin/env python3
"""Pool several runs of scripts/bench.py into one table.

    python3 scripts/bench_pool.py RUN.json...

Each RUN.json is what `scripts/bench.py --json-out RUN.json` wrote. On a machine whose
speed drifts within minutes, one run's medians of wall times compare poorly, but the legs
of one round run back to back, so each round's ratio to that round's `summary` holds.
This pools the rounds of every run given (a leg counts in the runs that have it):

  rounds        how many rounds the leg ran in, over all runs
  wall s, CPU s medians over those rounds; CPU/wall the median of each round's ratio
  MB/s          file size / median wall (MB = 10^6 bytes)
  peak RSS MB   median; RSS / file the same over the file size
  / summary     the median of each round's wall over the same round's `summary` wall,
                with the smallest and largest (for pickle.load: how many times slower); a
                previous binary's legs (`previous NAME`) over that binary's `summary`
  / previous    where `bench.py --previous` ran: the median of each round's wall over the
                same round's wall of the same command by the previous binary, with the
                smallest and largest (below 1: faster now)

Prints a Markdown table, files and legs in the order of the runs (a leg that joins in a
later run goes after the leg it follows there).
Stdlib only.
"""

import json
import statistics
import sys


def leg_name(tool):
    return tool[len('vramlens '):] if tool.startswith('vramlens ') else tool


def main(paths):
    rounds = {}      # (file, leg) -> [(wall, cpu, rss KiB, summary wall)]
    sizes = {}
    order = []
    for path in paths:
        with open(path) as f:
            results = json.load(f)['results']
        ok = {(r['file'], leg_name(r['tool'])): r for r in results if r['status'] == 'ok'}
        for (file, leg), r in ok.items():
            base_leg = 'previous summary' if leg.startswith('previous ') else 'summary'
            summary = ok.get((file, base_leg))
            if summary is None:
                continue
            if (file, leg) not in rounds:
                rounds[(file, leg)] = []
                # After the leg that comes before it in this run, if that one is listed.
                before = [k for k in ok if k[0] == file]
                prev = before[before.index((file, leg)) - 1] if before[0] != (file, leg) else None
                at = order.index(prev) + 1 if prev in order else len(order)
                order.insert(at, (file, leg))
            sizes[file] = r['size_bytes']
            prev = ok.get((file, 'previous ' + leg))
            prev_runs = prev['runs'] if prev else [None] * len(r['runs'])
            for run, base, p in zip(r['runs'], summary['runs'], prev_runs):
                rounds[(file, leg)].append(
                    (run['wall_s'], run['cpu_s'], run['maxrss_kib'], base['wall_s'],
                     p['wall_s'] if p else None))
    files = list(dict.fromkeys(f for f, _ in order))
    print('| file | tool | rounds | wall s | CPU s | CPU/wall | MB/s | peak RSS MB '
          '| RSS / file | / summary (range) | / previous (range) |')
    print('|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|')
    med = statistics.median
    for file in files:
        mb = sizes[file] / 1e6
        for f, leg in order:
            if f != file:
                continue
            v = rounds[(f, leg)]
            wall = med(x[0] for x in v)
            rss = med(x[2] for x in v) * 1024 / 1e6
            ratios = [x[0] / x[3] for x in v]
            vs = [x[0] / x[4] for x in v if x[4]]
            previous = f'{med(vs):.2f} ({min(vs):.2f}-{max(vs):.2f})' if vs else ''
            name = file.rsplit('/', 1)[-1].removesuffix('.pickle')
            print(f'| {name} | {leg} | {len(v)} | {wall:.2f} | {med(x[1] for x in v):.2f} '
                  f'| {med(x[1] / x[0] for x in v):.2f} | {mb / wall:.0f} | {rss:.0f} '
                  f'| {rss / mb:.2f} | {med(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) '
                  f'| {previous} |')


if __name__ == '__main__':
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
