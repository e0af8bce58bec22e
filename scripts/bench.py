#!/usr/bin/env python3
"""Benchmark vramlens against Python's pickle.load and PyTorch's own _memory_viz.

    python3 scripts/bench.py [--vramlens target/release/vramlens] [--json] FILE...

For every FILE (page cache warmed first by reading it once) each tool runs in a fresh
child process; wall time is measured around spawn..reap and peak RSS comes from the
child's rusage (os.wait4, ru_maxrss, KiB on Linux):

  vramlens     `vramlens summary --json FILE > /dev/null`
  pickle.load  `python3 -c "pickle.load(open(FILE,'rb'))"` (gzip.open for .gz input)
  memory_viz   PyTorch's `_memory_viz.py stats FILE`, only when it is at hand:
               env VRAMLENS_MEMORY_VIZ=/path/to/_memory_viz.py (run as a script, no
               torch import), else `python3 -m torch.cuda._memory_viz stats FILE` when
               torch is importable (that includes `import torch`: seconds, ~0.5 GB).
               Otherwise the leg is reported as skipped, with the reason.

Units: MB = 10^6 bytes (file size, throughput and RSS alike); RSS/file = peak RSS
divided by the file size.  Peak RSS has a floor of about 10 MB (printed): a child's
ru_maxrss starts at this process's RSS at fork.  A command that fails (non-zero exit, signal, timeout, not
found) is reported as failed with the tail of its stderr; the script itself keeps going
and exits 1 only if something failed.  Stdlib only.
"""

import argparse
import importlib.util
import json
import os
import platform
import shlex
import shutil
import signal
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
    wait4.  Returns dict(rc, signal, wall_s, maxrss_kib, stderr_tail, timed_out, error).

    fork, not posix_spawn/vfork: Linux seeds a child's ru_maxrss at exec with the
    high-water RSS of the address space it replaces; with vfork that is this
    process's *peak*, with fork only its *current* RSS (~10 MB, see rss_floor)."""
    exe = shutil.which(argv[0]) if os.sep not in argv[0] else argv[0]
    res = {'rc': None, 'signal': None, 'wall_s': None, 'maxrss_kib': None,
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('files', nargs='+', metavar='FILE')
    ap.add_argument('--vramlens', default='target/release/vramlens',
                    help='vramlens binary (default: target/release/vramlens)')
    ap.add_argument('--vramlens-args', default='summary --json {file}',
                    help="arguments for vramlens, {file} is replaced (default: 'summary --json {file}')")
    ap.add_argument('--python', default=sys.executable, help='interpreter for the Python legs')
    ap.add_argument('--only', action='append', choices=('vramlens', 'pickle.load', 'memory_viz'),
                    help='run only these legs (repeatable)')
    ap.add_argument('--repeat', type=int, default=1,
                    help='runs per leg; the fastest run is reported (default 1)')
    ap.add_argument('--timeout', type=float, default=1800.0, help='per-run timeout in seconds')
    ap.add_argument('--json', action='store_true', help='print JSON instead of the Markdown table')
    ap.add_argument('--json-out', metavar='PATH', help='also write the JSON results to PATH')
    args = ap.parse_args(argv)

    legs = []
    vl = args.vramlens
    if os.sep in vl and not os.path.isabs(vl):
        vl = os.path.abspath(vl)
    legs.append(('vramlens', lambda f: [vl] + [a.replace('{file}', f) for a in shlex.split(args.vramlens_args)],
                 None))
    legs.append(('pickle.load', lambda f: [args.python, '-c', LOAD_CODE, f], None))
    mv_prefix, mv_reason = memory_viz_leg(args.python)
    legs.append(('memory_viz', (lambda f: mv_prefix + [f]) if mv_prefix else None, mv_reason))
    if args.only:
        legs = [l for l in legs if l[0] in args.only]

    floor = run_child([shutil.which('true') or '/bin/true'], 60)
    rss_floor_mb = floor['maxrss_kib'] * 1024 / 1e6 if floor['maxrss_kib'] else None
    print('bench: RSS floor (ru_maxrss of `true` spawned the same way): %s MB'
          % fmt(rss_floor_mb, '.1f'), file=sys.stderr)

    results = []
    any_failed = False
    for path in args.files:
        rec_base = {'file': path}
        try:
            size = os.path.getsize(path)
            t0 = time.perf_counter()
            warm(path)
            warm_s = time.perf_counter() - t0
        except OSError as e:
            print('bench: %s: %s' % (path, e), file=sys.stderr)
            results.append(dict(rec_base, tool='-', status='failed', error=str(e), size_bytes=None))
            any_failed = True
            continue
        print('bench: %s (%.1f MB, page cache warmed in %.2f s)' % (path, size / 1e6, warm_s),
              file=sys.stderr)
        for name, mk, reason in legs:
            rec = dict(rec_base, tool=name, size_bytes=size, status=None, cmd=None, rc=None,
                       wall_s=None, mb_per_s=None, peak_rss_mb=None, rss_per_file=None,
                       runs=[], stderr_tail=None, note=None)
            if mk is None:
                rec['status'] = 'skipped'
                rec['note'] = reason
                print('bench:   %-11s skipped: %s' % (name, reason), file=sys.stderr)
                results.append(rec)
                continue
            cmd = mk(path)
            rec['cmd'] = ' '.join(shlex.quote(c) for c in (cmd if name != 'pickle.load' else
                                  cmd[:2] + ['<load code>'] + cmd[3:]))
            best = None
            for _ in range(max(1, args.repeat)):
                r = run_child(cmd, args.timeout)
                rec['runs'].append({k: r[k] for k in ('rc', 'signal', 'wall_s', 'maxrss_kib', 'timed_out')})
                ok = r['error'] is None and r['rc'] == 0 and not r['timed_out']
                if not ok:
                    best = r
                    break
                if best is None or r['wall_s'] < best['wall_s']:
                    best = r
            r = best
            ok = r['error'] is None and r['rc'] == 0 and not r['timed_out']
            rec['rc'] = r['rc']
            rec['wall_s'] = r['wall_s']
            if r['maxrss_kib'] is not None:
                rss = r['maxrss_kib'] * 1024
                rec['peak_rss_mb'] = rss / 1e6
                rec['rss_per_file'] = rss / size if size else None
            if ok:
                rec['status'] = 'ok'
                rec['mb_per_s'] = size / 1e6 / r['wall_s'] if r['wall_s'] else None
                print('bench:   %-11s %.2f s, peak RSS %.0f MB' % (name, r['wall_s'], rec['peak_rss_mb']),
                      file=sys.stderr)
            else:
                any_failed = True
                rec['status'] = 'failed'
                why = (r['error'] or ('timed out after %.0f s' % args.timeout if r['timed_out'] else
                                      'killed by signal %s' % r['signal'] if r['signal'] else
                                      'exit status %s' % r['rc']))
                rec['note'] = why
                rec['stderr_tail'] = r['stderr_tail']
                print('bench:   %-11s FAILED (%s)%s' % (name, why, (':\n' + '\n'.join(
                    '      ' + l for l in r['stderr_tail'].splitlines()[-15:])) if r['stderr_tail'] else ''),
                    file=sys.stderr)
            results.append(rec)

    meta = {'python': platform.python_version(), 'platform': platform.platform(),
            'cpus': os.cpu_count(), 'time': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
            'mb': 1e6, 'rss_source': 'os.wait4 ru_maxrss (KiB) of a fork+exec child',
            'rss_floor_mb': rss_floor_mb}
    doc = {'meta': meta, 'results': results}
    if args.json_out:
        with open(args.json_out, 'w') as f:
            json.dump(doc, f, indent=2)
    if args.json:
        json.dump(doc, sys.stdout, indent=2)
        print()
    else:
        print('| file | size MB | tool | wall s | MB/s | peak RSS MB | RSS/file |')
        print('|---|---:|---|---:|---:|---:|---:|')
        for r in results:
            size_mb = fmt(r['size_bytes'] / 1e6 if r.get('size_bytes') else None, '.1f')
            if r['status'] == 'ok':
                print('| %s | %s | %s | %s | %s | %s | %s |' % (
                    os.path.basename(r['file']), size_mb, r['tool'], fmt(r['wall_s'], '.2f'),
                    fmt(r['mb_per_s'], '.1f'), fmt(r['peak_rss_mb'], '.0f'), fmt(r['rss_per_file'], '.2f')))
            else:
                print('| %s | %s | %s | %s | | | |' % (
                    os.path.basename(r['file']), size_mb, r['tool'],
                    r['status'] + (': ' + r['note'] if r.get('note') else '')))
        print('\nMB = 10^6 bytes.  RSS floor %s MB: a child\'s ru_maxrss starts at this process\'s '
              'RSS at fork, so smaller peaks read as the floor.' % fmt(rss_floor_mb, '.1f'))
        notes = [r for r in results if r['status'] == 'failed' and r.get('stderr_tail')]
        for r in notes:
            print('\n%s on %s failed; stderr tail:\n```\n%s\n```' % (
                r['tool'], os.path.basename(r['file']), '\n'.join(r['stderr_tail'].splitlines()[-15:])))
    return 1 if any_failed else 0


if __name__ == '__main__':
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)     # `bench.py ... | head` exits quietly
    sys.exit(main())
