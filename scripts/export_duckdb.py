#!/usr/bin/env python3
"""Run the example queries of docs/export.md with DuckDB over an exported folder.

    python3 scripts/export_duckdb.py OUTDIR [--doc docs/export.md] [--format parquet|jsonl]

Every ```sql block of the document that starts with `-- name: NAME` is run, in order; the
`views` block first has its `'out/` paths pointed at OUTDIR (and, for --format jsonl,
read_parquet/.parquet turned into read_json/.jsonl). Besides the documented queries it
runs a few checks of its own (`allocated_peaks`, `end_requested`, `sums`) that the tests
compare with `vramlens summary --json`. Prints one JSON object: {name: [row, ...]}, each
row an object keyed by column name. Needs DuckDB (`pip install duckdb`); used by
tests/export.rs.
"""

import argparse
import json
import os
import re
import sys

import duckdb

# The allocated peak by lifetime arithmetic (block bytes instead of requested bytes).
ALLOCATED_PEAKS = """
WITH deltas AS (
    SELECT file, device, alloc_event AS event, block_bytes AS delta
    FROM lifetimes WHERE alloc_event IS NOT NULL
    UNION ALL
    SELECT file, device, free_completed_event, -block_bytes
    FROM lifetimes WHERE free_completed_event IS NOT NULL
),
running AS (
    SELECT file, device, sum(delta) OVER (PARTITION BY file, device ORDER BY event) AS live
    FROM deltas
),
highest AS (SELECT file, device, max(live) AS live FROM running GROUP BY file, device),
start AS (
    SELECT file, device, sum(block_bytes) AS bytes
    FROM lifetimes WHERE alloc_event IS NULL GROUP BY file, device
)
SELECT s.file, s.device,
       coalesce(st.bytes, 0) + greatest(coalesce(h.live, 0), 0) AS peak_bytes
FROM snapshots s
LEFT JOIN highest h USING (file, device)
LEFT JOIN start st USING (file, device)
WHERE s.device IS NOT NULL
ORDER BY s.file, s.device
"""

# Requested bytes of the allocations alive at the end and not waiting on a free: what the
# final segments' active_allocated blocks asked for.
END_REQUESTED = """
SELECT file, device, sum(requested_bytes) AS bytes
FROM lifetimes
WHERE free_completed_event IS NULL AND free_requested_event IS NULL
GROUP BY file, device
ORDER BY file, device
"""

# Per file: the path, the totals over devices, and the rows of each table (written so
# that Spark runs it too: no correlated subquery).
SUMS = """
WITH s AS (
    SELECT file, min(source_path) AS source_path,
           sum(reserved_bytes) AS reserved_bytes,
           sum(allocated_bytes) AS allocated_bytes,
           sum(requested_bytes) AS requested_bytes,
           count(device) AS devices
    FROM snapshots GROUP BY file
),
l AS (SELECT file, count(*) AS lifetimes FROM lifetimes GROUP BY file),
k AS (SELECT file, count(*) AS stack_frames FROM stacks GROUP BY file)
SELECT s.file, s.source_path, s.reserved_bytes, s.allocated_bytes, s.requested_bytes,
       s.devices, coalesce(l.lifetimes, 0) AS lifetimes, coalesce(k.stack_frames, 0) AS stack_frames
FROM s
LEFT JOIN l ON l.file = s.file
LEFT JOIN k ON k.file = s.file
ORDER BY s.file
"""


def plain(v):
    """DuckDB values as JSON: HUGEINT sums come back as int, decimals as int when whole."""
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    try:
        f = float(v)
        return int(v) if f == int(f) else f
    except (TypeError, ValueError):
        return str(v)


def run(con, sql):
    cur = con.execute(sql)
    if cur.description is None:
        return []
    names = [d[0] for d in cur.description]
    return [dict(zip(names, map(plain, row))) for row in cur.fetchall()]


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--doc", default=os.path.join(os.path.dirname(__file__), "..", "docs", "export.md"))
    ap.add_argument("--format", choices=["parquet", "jsonl"], default="parquet")
    args = ap.parse_args(argv)
    doc = open(args.doc, encoding="utf-8").read()
    blocks = re.findall(r"```sql\n(.*?)```", doc, re.S)
    out = os.path.abspath(args.outdir).replace("'", "''")
    con = duckdb.connect()
    results = {}
    for block in blocks:
        m = re.match(r"-- name: (\w+)\n", block)
        if not m:
            continue
        name, sql = m.group(1), block[m.end():]
        if name == "views":
            sql = sql.replace("'out/", f"'{out}/")
            if args.format == "jsonl":
                sql = sql.replace("read_parquet(", "read_json(").replace(".parquet'", ".jsonl'")
            for stmt in filter(str.strip, sql.split(";")):
                con.execute(stmt)
            continue
        results[name] = run(con, sql)
    results["allocated_peaks"] = run(con, ALLOCATED_PEAKS)
    results["end_requested"] = run(con, END_REQUESTED)
    results["sums"] = run(con, SUMS)
    json.dump(results, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
