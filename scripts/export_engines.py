#!/usr/bin/env python3
"""Run the README's fleet recipe in Spark, then every documented query in Spark and DuckDB.

    python3 scripts/export_engines.py --paths LIST --work DIR --out FILE [--shards N] [--format parquet|jsonl]...

LIST holds the inputs, one a line (files or folders), given to the recipe as
`snapshot_paths`. For each format, in one Spark session (local[2]):

1. the README block `# name: fleet_recipe` is run as written, with its parameter line
   (`N, ROOT, OPTIONS = ...`) set to N shards, DIR/<format> and `--events` (and, for JSON
   Lines, `--format jsonl` and `spark.read.json`); then run again, and the files of the
   dataset compared (a second run must change nothing); then, for the first format, once
   more with N + 1 shards, and the tables compared again (another sharding must give the
   same partitions);
2. the docs' `# name: manifest_check` block is run on the dataset;
3. every `-- name: NAME` SQL block of docs/export.md and README.md (and the checks of
   export_duckdb.py) is run in Spark, over the docs' `spark_views`, and in DuckDB, over
   the docs' `views`.

`vramlens` must be on PATH. Writes one JSON object to FILE: {format: {"spark": {name: rows},
"duckdb": {name: rows}, "rerun_changed": [...], "resharded_changed": [...],
"manifest_check": text, "seconds": {...}}}; values are made comparable (decimals as
integers, timestamps as RFC 3339 text in UTC). Needs pyspark and a Java runtime, and DuckDB;
used by tests/export.rs.
"""

import argparse
import contextlib
import datetime
import decimal
import hashlib
import io
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import export_duckdb  # noqa: E402

DOCS = [os.path.join(HERE, "..", "docs", "export.md"), os.path.join(HERE, "..", "README.md")]


def value(v):
    """One cell as JSON, the same from both engines."""
    if isinstance(v, bool) or v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, datetime.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return v.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if isinstance(v, float):
        return v
    return export_duckdb.plain(v)


def blocks(paths):
    """(name, kind, text) of every named block: ```sql blocks and SQL inside Python strings
    that start with `-- name:`, and ```python blocks that start with `# name:`."""
    out = []
    for path in paths:
        doc = open(path, encoding="utf-8").read()
        for m in re.finditer(r"```sql\n-- name: (\w+)\n(.*?)```", doc, re.S):
            out.append((m.group(1), "sql", m.group(2)))
        for m in re.finditer(r'"""\n\s*-- name: (\w+)\n(.*?)"""', doc, re.S):
            out.append((m.group(1), "sql", m.group(2)))
        for m in re.finditer(r"```python\n# name: (\w+)\n(.*?)```", doc, re.S):
            out.append((m.group(1), "python", m.group(2)))
    return out


def tree(root):
    """SHA-256 of every file of the dataset (not the hidden folders), by path."""
    files = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for f in filenames:
            p = os.path.join(dirpath, f)
            files[os.path.relpath(p, root)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return files


def changed(a, b, only_tables=False):
    keep = (lambda p: not p.startswith("manifest" + os.sep)) if only_tables else (lambda p: True)
    a = {k: v for k, v in a.items() if keep(k)}
    b = {k: v for k, v in b.items() if keep(k)}
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def recipe(code, shards, root, fmt):
    """The README's recipe with its parameters set."""
    options = ["--events"] + (["--format", "jsonl"] if fmt == "jsonl" else [])
    line = re.compile(r"^N, ROOT, OPTIONS = .*$", re.M)
    if not line.search(code):
        raise SystemExit("fleet_recipe: no `N, ROOT, OPTIONS = ...` line")
    code = line.sub(f"N, ROOT, OPTIONS = {shards}, {root!r}, {options!r}", code)
    if fmt == "jsonl":
        code = code.replace("spark.read.parquet(", "spark.read.json(")
    return code


def spark_rows(spark, sql):
    df = spark.sql(sql)
    names = df.columns
    return [dict(zip(names, map(value, row))) for row in df.collect()]


def duckdb_rows(con, sql):
    cur = con.execute(sql)
    if cur.description is None:
        return []
    names = [d[0] for d in cur.description]
    return [dict(zip(names, map(value, row))) for row in cur.fetchall()]


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--paths", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--format", action="append", choices=["parquet", "jsonl"])
    ap.add_argument("--out", required=True, help="where the JSON goes (tasks may write to stdout)")
    args = ap.parse_args(argv)
    formats = args.format or ["parquet"]
    paths = [line for line in open(args.paths, encoding="utf-8").read().splitlines() if line]
    named = blocks(DOCS)
    python = {n: t for n, k, t in named if k == "python"}
    queries = [(n, t) for n, k, t in named if k == "sql"]
    queries += [
        ("allocated_peaks", export_duckdb.ALLOCATED_PEAKS),
        ("end_requested", export_duckdb.END_REQUESTED),
        ("sums", export_duckdb.SUMS),
    ]

    import duckdb
    from pyspark.sql import SparkSession

    t0 = time.time()
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("vramlens-export-test")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    seconds = {"spark_start": round(time.time() - t0, 1)}
    results = {"seconds": seconds}
    for fmt in formats:
        root = os.path.abspath(os.path.join(args.work, fmt))
        res = {}
        env = {"snapshot_paths": paths, "sc": spark.sparkContext, "spark": spark}
        t = time.time()
        exec(recipe(python["fleet_recipe"], args.shards, root, fmt), dict(env))
        seconds[f"{fmt}_recipe"] = round(time.time() - t, 1)
        first = tree(root)
        t = time.time()
        exec(recipe(python["fleet_recipe"], args.shards, root, fmt), dict(env))
        seconds[f"{fmt}_recipe_again"] = round(time.time() - t, 1)
        res["rerun_changed"] = changed(first, tree(root))
        if fmt == formats[0]:
            # The partitions do not depend on the sharding (once: the format does not
            # change how a file's partition is found).
            exec(recipe(python["fleet_recipe"], args.shards + 1, root, fmt), dict(env))
            res["resharded_changed"] = changed(first, tree(root), only_tables=True)
        res["manifests"] = sorted(os.listdir(os.path.join(root, "manifest")))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(python["manifest_check"], {"ROOT": root, "__name__": "manifest_check"})
        res["manifest_check"] = out.getvalue()

        t = time.time()
        views = python["spark_views"].replace('"out/', f'"{root}/')
        if fmt == "jsonl":
            views = views.replace("spark.read.parquet(", "spark.read.json(")
        exec(views, {"spark": spark})
        # Each view read once for all the queries (they read the same tables many times).
        for table in spark.catalog.listTables():
            if table.isTemporary:
                spark.catalog.cacheTable(table.name)
        res["spark"] = {name: spark_rows(spark, sql.strip().rstrip(";")) for name, sql in queries
                        if name != "views"}
        seconds[f"{fmt}_spark_queries"] = round(time.time() - t, 1)

        t = time.time()
        con = duckdb.connect()
        duck = {}
        for name, sql in queries:
            if name == "views":
                sql = sql.replace("'out/", "'" + root.replace("'", "''") + "/")
                if fmt == "jsonl":
                    sql = sql.replace("read_parquet(", "read_json(").replace(".parquet'", ".jsonl'")
                for stmt in filter(str.strip, sql.split(";")):
                    con.execute(stmt)
                continue
            duck[name] = duckdb_rows(con, sql)
        res["duckdb"] = duck
        seconds[f"{fmt}_duckdb_queries"] = round(time.time() - t, 1)
        res["rows"] = {
            t: duckdb_rows(con, f"SELECT count(*) AS n FROM {t}")[0]["n"]
            for t in ["snapshots", "lifetimes", "stacks", "events"]
        }
        results[fmt] = res
    spark.stop()
    seconds["total"] = round(time.time() - t0, 1)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(results, f, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
