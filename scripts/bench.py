#!/usr/bin/env python3
"""Benchmark vramlens commands against Python's pickle.load and PyTorch's _memory_viz.

    python3 scripts/bench.py [--repeat 3] [--cmd NAME=ARGS]... [--json] FILE...

Legs, each run in a fresh child process with the page cache warm:

  vramlens commands   `--cmd NAME=ARGS` (repeatable); in ARGS `{file}` is the snapshot
                      and `{out}` an output path in a temporary folder, one per command
                      (the same in every round: give `--force` to commands that write
                      it). Default: `--cmd 'summary=summary --json {file}'`. Examples:
                        --cmd 'timeline=timeline --force -o {out}.svg {file}'
                        --cmd 'oom=oom --json {file}'
                        --cmd 'segments=segments --force -o {out}.svg {file}'
  previous commands   with `--previous BIN`: each command again with another vramlens binary
                      (the previous release), in the same rounds, named `previous NAME`
  other tools         `--tool NAME=ARGV` (repeatable): any other program, `{file}` in ARGV
                      the snapshot (e.g. a peer's parser built natively)
  pickle.load         `python3 -c "pickle.load(open(FILE,'rb'))"` (gzip.open for .gz input)
  memory_viz          PyTorch's `_memory_viz.py stats FILE` (pickle.load, then a pass over
                      the segments), when it is at hand: env VRAMLENS_MEMORY_VIZ=/path (run
                      as a script, no torch import; benches/run.sh points it at a copy in
                      bench-data/), else `python3 -m torch.cuda._memory_viz stats` when torch
                      is importable (that includes `import torch`). Otherwise skipped.

Runs are interleaved (round r runs every leg on every file before round r+1), so that
drifts in a noisy machine's speed hit every leg alike; the table shows medians over the
rounds. For every run: wall time around spawn..reap, user+sys CPU time and peak RSS
from the child's rusage (os.wait4; ru_maxrss, KiB on Linux). Columns:

  wall s, cpu s      medians; cpu/wall near 2 means two cores busy
  MB/s               file size / median wall (MB = 10^6 bytes)
  RSS MB, RSS/file   median peak RSS, and divided by the file size
  x pickle.load      how many times faster than pickle.load (its wall / this wall)
  x memory_viz       the same against _memory_viz.py stats
  / summary          this command's wall divided by `summary`'s (when a leg named summary ran;
                     a previous binary's legs by that binary's `summary`)

Peak RSS has a floor of about 10 MB (printed): a child's ru_maxrss starts at this
process's RSS at fork. A command that fails (non-zero exit, signal, timeout) is reported
with the tail of its stderr; the script goes on and exits 1 if anything failed. Stdlib
only.
"""

import argparse
import importlib.util
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time

LOAD_CODE = (
    "import sys, pickle, gzip\n"
    "p = sys.argv[1]\n"
    "f = open(p, 'rb')\n"
    "if f.read(2) == b'\\x1f\\x8b':\n"
    "    f.close(); f = gzip.open(p, 'rb')\n"
    "else:\n"
    "    f.seek(0)\n"
    "obj = pickle.load(f)\n"
)


def warm(path):
    buf = bytearray(1 << 20)          # small, reused: keeps this process's RSS low
    with open(path, 'rb', buffering=0) as f:
        while f.readinto(buf):
            pass


def stderr_tail(path, limit=1500):
    try:
        with open(path, 'rb') as f:
            f.seek(0, os.SEEK_END)
            n = f.tell()
            f.seek(max(0, n - limit))
            return f.read().decode('utf-8', 'replace').strip()
    except OSError:
        return ''


def run_child(argv, timeout):
    """fork+exec argv (stdin/stdout -> /dev/null, stderr -> temp file), reap it with
    wait4. Returns dict(rc, signal, wall_s, cpu_s, maxrss_kib, stderr_tail, timed_out,
    error).

    fork, not posix_spawn/vfork: Linux seeds a child's ru_maxrss at exec with the
    high-water RSS of the address space it replaces; with vfork that is this process's
    *peak*, with fork only its *current* RSS (~10 MB, see the floor)."""
    exe = shutil.which(argv[0]) if os.sep not in argv[0] else argv[0]
    res = {'rc': None, 'signal': None, 'wall_s': None, 'cpu_s': None, 'maxrss_kib': None,
           'stderr_tail': '', 'timed_out': False, 'error': None}
    if not exe or not os.path.isfile(exe) or not os.access(exe, os.X_OK):
        res['error'] = '%s: not found or not executable' % argv[0]
        return res
    fd, errpath = tempfile.mkstemp(prefix='bench-stderr-')
    try:
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:                                  # child
            try:
                nul = os.open(os.devnull, os.O_RDWR)
                os.dup2(nul, 0)
                os.dup2(nul, 1)
                os.dup2(fd, 2)
                os.execv(exe, argv)
            except BaseException as e:               # noqa: BLE001 - report and bail
                try:
                    os.write(2, ('exec %s failed: %s\n' % (exe, e)).encode())
                finally:
                    os._exit(127)
        killed = []

        def kill():
            killed.append(True)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        timer = threading.Timer(timeout, kill) if timeout else None
        if timer:
            timer.start()
        try:
            _pid, status, ru = os.wait4(pid, 0)
        finally:
            if timer:
                timer.cancel()
        res['wall_s'] = time.perf_counter() - t0
        res['cpu_s'] = ru.ru_utime + ru.ru_stime
        res['maxrss_kib'] = ru.ru_maxrss
        if os.WIFSIGNALED(status):
            res['signal'] = os.WTERMSIG(status)
        else:
            res['rc'] = os.WEXITSTATUS(status)
        res['timed_out'] = bool(killed)
        res['stderr_tail'] = stderr_tail(errpath)
        return res
    finally:
        os.close(fd)
        try:
            os.unlink(errpath)
        except OSError:
            pass


def memory_viz_leg(python):
    """(argv prefix, None) when PyTorch's _memory_viz is at hand, else (None, reason)."""
    env_path = os.environ.get('VRAMLENS_MEMORY_VIZ')
    if env_path:
        if os.path.isfile(env_path):
            return [python, env_path, 'stats'], None
        return None, 'VRAMLENS_MEMORY_VIZ=%s is not a file' % env_path
    if importlib.util.find_spec('torch') is not None:
        return [python, '-m', 'torch.cuda._memory_viz', 'stats'], None
    return None, ('torch is not importable here and VRAMLENS_MEMORY_VIZ is not set '
                  '(point it at a copy of torch/cuda/_memory_viz.py to include this leg)')


def fmt(v, spec):
    return '-' if v is None else format(v, spec)


def parse_cmd(spec):
    name, sep, args = spec.partition('=')
    if not sep or not name or not args.strip():
        raise argparse.ArgumentTypeError("expected NAME=ARGS, e.g. 'timeline=timeline --force -o {out}.svg {file}'")
    return name.strip(), args


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('files', nargs='+', metavar='FILE')
    ap.add_argument('--vramlens', default='target/release/vramlens',
                    help='vramlens binary (default: target/release/vramlens)')
    ap.add_argument('--cmd', action='append', type=parse_cmd, metavar='NAME=ARGS',
                    help="a vramlens command to time (repeatable; default 'summary=summary --json {file}')")
    ap.add_argument('--previous', metavar='BIN',
                    help='another vramlens binary (the previous release) run with the same commands')
    ap.add_argument('--tool', action='append', type=parse_cmd, default=[], metavar='NAME=ARGV',
                    help="another program to time, {file} in ARGV the snapshot (repeatable)")
    ap.add_argument('--python', default=sys.executable, help='interpreter for the Python legs')
    ap.add_argument('--no-python', action='store_true', help='skip pickle.load and memory_viz')
    ap.add_argument('--repeat', type=int, default=3, help='rounds (default 3; the median is shown)')
    ap.add_argument('--timeout', type=float, default=1800.0, help='per-run timeout in seconds')
    ap.add_argument('--json', action='store_true', help='print JSON instead of the Markdown table')
    ap.add_argument('--json-out', metavar='PATH', help='also write the JSON results to PATH')
    args = ap.parse_args(argv)

    vl = args.vramlens
    if os.sep in vl and not os.path.isabs(vl):
        vl = os.path.abspath(vl)
    cmds = args.cmd or [('summary', 'summary --json {file}')]
    outdir = tempfile.mkdtemp(prefix='vramlens-bench-')
    legs = []                      # (name, kind, make_argv or None, skip reason)
    binaries = [('vramlens', vl)]
    if args.previous:
        binaries.append(('previous', os.path.abspath(args.previous)))
    for name, spec in cmds:
        for label, binary in binaries:
            def make(f, spec=spec, name=name, label=label, binary=binary):
                out = os.path.join(outdir, label + '-' + name)
                return [binary] + [a.replace('{file}', f).replace('{out}', out)
                                   for a in shlex.split(spec)]
            legs.append((label + ' ' + name, label, make, None, spec))
    for name, spec in args.tool:
        legs.append((name, 'tool', lambda f, spec=spec: [a.replace('{file}', f) for a in shlex.split(spec)],
                     None, spec))
    if not args.no_python:
        legs.append(('pickle.load', 'python', lambda f: [args.python, '-c', LOAD_CODE, f], None, None))
        mv_prefix, mv_reason = memory_viz_leg(args.python)
        legs.append(('memory_viz', 'python', (lambda f: mv_prefix + [f]) if mv_prefix else None,
                     mv_reason, None))

    floor = run_child([shutil.which('true') or '/bin/true'], 60)
    rss_floor_mb = floor['maxrss_kib'] * 1024 / 1e6 if floor['maxrss_kib'] else None
    print('bench: RSS floor (ru_maxrss of `true` spawned the same way): %s MB'
          % fmt(rss_floor_mb, '.1f'), file=sys.stderr)

    files = []
    for path in args.files:
        try:
            files.append((path, os.path.getsize(path)))
        except OSError as e:
            print('bench: %s: %s' % (path, e), file=sys.stderr)
            return 1
    runs = {}                      # (file, leg) -> list of run dicts
    failed = {}                    # (file, leg) -> failing run
    for r in range(max(1, args.repeat)):
        for path, size in files:
            t0 = time.perf_counter()
            warm(path)
            print('bench: round %d/%d: %s (%.1f MB, page cache warmed in %.2f s)'
                  % (r + 1, args.repeat, path, size / 1e6, time.perf_counter() - t0), file=sys.stderr)
            for name, _kind, mk, _reason, _spec in legs:
                if mk is None or (path, name) in failed:
                    continue
                res = run_child(mk(path), args.timeout)
                ok = res['error'] is None and res['rc'] == 0 and not res['timed_out']
                if not ok:
                    failed[(path, name)] = res
                    why = (res['error'] or ('timed out after %.0f s' % args.timeout if res['timed_out'] else
                                            'killed by signal %s' % res['signal'] if res['signal'] else
                                            'exit status %s' % res['rc']))
                    res['why'] = why
                    print('bench:   %-22s FAILED (%s)%s' % (name, why, (':\n' + '\n'.join(
                        '      ' + l for l in res['stderr_tail'].splitlines()[-15:])) if res['stderr_tail'] else ''),
                        file=sys.stderr)
                    continue
                runs.setdefault((path, name), []).append(res)
                print('bench:   %-22s %6.2f s wall, %6.2f s cpu, peak RSS %5.0f MB'
                      % (name, res['wall_s'], res['cpu_s'], res['maxrss_kib'] * 1024 / 1e6), file=sys.stderr)
    shutil.rmtree(outdir, ignore_errors=True)

    results = []
    for path, size in files:
        med = {}
        for name, kind, mk, reason, spec in legs:
            rs = runs.get((path, name), [])
            if rs:
                med[name] = statistics.median(x['wall_s'] for x in rs)
        for name, kind, mk, reason, spec in legs:
            rec = {'file': path, 'size_bytes': size, 'tool': name, 'args': spec, 'status': None,
                   'runs': [], 'wall_s': None, 'cpu_s': None, 'mb_per_s': None, 'peak_rss_mb': None,
                   'rss_per_file': None, 'x_pickle_load': None, 'x_memory_viz': None,
                   'per_summary': None, 'note': None}
            if mk is None:
                rec['status'] = 'skipped'
                rec['note'] = reason
                results.append(rec)
                continue
            if (path, name) in failed:
                res = failed[(path, name)]
                rec['status'] = 'failed'
                rec['note'] = res['why']
                rec['stderr_tail'] = res['stderr_tail']
                results.append(rec)
                continue
            rs = runs[(path, name)]
            rec['status'] = 'ok'
            rec['runs'] = [{k: x[k] for k in ('wall_s', 'cpu_s', 'maxrss_kib')} for x in rs]
            wall = med[name]
            rec['wall_s'] = wall
            rec['cpu_s'] = statistics.median(x['cpu_s'] for x in rs)
            rss = statistics.median(x['maxrss_kib'] for x in rs) * 1024
            rec['peak_rss_mb'] = rss / 1e6
            rec['rss_per_file'] = rss / size if size else None
            rec['mb_per_s'] = size / 1e6 / wall if wall else None
            if kind in ('vramlens', 'previous'):
                if 'pickle.load' in med:
                    rec['x_pickle_load'] = med['pickle.load'] / wall
                if 'memory_viz' in med:
                    rec['x_memory_viz'] = med['memory_viz'] / wall
                if kind + ' summary' in med:
                    rec['per_summary'] = wall / med[kind + ' summary']
            results.append(rec)

    meta = {'python': platform.python_version(), 'platform': platform.platform(),
            'cpus': os.cpu_count(), 'time': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
            'rounds': args.repeat, 'statistic': 'median', 'mb': 1e6,
            'rss_source': 'os.wait4 ru_maxrss (KiB) of a fork+exec child',
            'rss_floor_mb': rss_floor_mb}
    doc = {'meta': meta, 'results': results}
    if args.json_out:
        with open(args.json_out, 'w') as f:
            json.dump(doc, f, indent=2)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        print('| file | size MB | tool | wall s | cpu s | MB/s | peak RSS MB | RSS/file '
              '| x pickle.load | x memory_viz | / summary |')
        print('|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|')
        for r in results:
            size_mb = fmt(r['size_bytes'] / 1e6, '.1f')
            if r['status'] == 'ok':
                print('| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |' % (
                    os.path.basename(r['file']), size_mb, r['tool'], fmt(r['wall_s'], '.2f'),
                    fmt(r['cpu_s'], '.2f'), fmt(r['mb_per_s'], '.0f'), fmt(r['peak_rss_mb'], '.0f'),
                    fmt(r['rss_per_file'], '.2f'), fmt(r['x_pickle_load'], '.1f'),
                    fmt(r['x_memory_viz'], '.1f'), fmt(r['per_summary'], '.2f')))
            else:
                print('| %s | %s | %s | %s | | | | | | | |' % (
                    os.path.basename(r['file']), size_mb, r['tool'],
                    r['status'] + (': ' + r['note'] if r.get('note') else '')))
        print('\nMedians of %d interleaved rounds; MB = 10^6 bytes. RSS floor %s MB: a child\'s '
              'ru_maxrss starts at this process\'s RSS at fork, so smaller peaks read as the floor.'
              % (args.repeat, fmt(rss_floor_mb, '.1f')))
        for r in results:
            if r['status'] == 'failed' and r.get('stderr_tail'):
                print('\n%s on %s failed; stderr tail:\n```\n%s\n```' % (
                    r['tool'], os.path.basename(r['file']), '\n'.join(r['stderr_tail'].splitlines()[-15:])))
    return 1 if failed else 0


if __name__ == '__main__':
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)     # `bench.py ... | head` exits quietly
    sys.exit(main())
