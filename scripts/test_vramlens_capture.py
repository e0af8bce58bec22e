#!/usr/bin/env python3
"""Tests of the capture helper (python/vramlens/capture.py, also run as
scripts/vramlens_capture.py) with fakes: no GPU, torch or nvidia-ml-py needed.

    python3 scripts/test_vramlens_capture.py [-v]

Python standard library only. The fake torch provides exactly what the helper calls:
torch.cuda.is_available, torch.cuda.memory._record_memory_history / _snapshot and
torch._C._cuda_attach_out_of_memory_observer. The fake pynvml provides the nvidia-ml-py
calls NvmlSource makes, and SmiSource gets a fake `run` in place of subprocess.run.

The tests in RegressionTests pin down defects the helper once had.
"""

import contextlib
import copy
import functools
import io
import itertools
import json
import os
import pickle
import shlex
import subprocess
import sys
import tempfile
import textwrap
import threading
import types
import unittest
from unittest import mock

sys.dont_write_bytecode = True  # leave no __pycache__ next to the helper

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_SRC = os.path.join(os.path.dirname(HERE), "python")
sys.path.insert(0, PYTHON_SRC)
import vramlens.capture as vc  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30

# A small snapshot shaped like torch.cuda.memory._snapshot()'s.
SNAPSHOT = {
    "segments": [{
        "device": 0, "address": 0x7F0000000000, "total_size": 2 * MIB,
        "allocated_size": 512, "active_size": 512, "requested_size": 500,
        "stream": 0, "segment_type": "small", "segment_pool_id": (0, 0),
        "is_expandable": False, "frames": [],
        "blocks": [
            {"address": 0x7F0000000000, "size": 512, "requested_size": 500,
             "state": "active_allocated", "frames": []},
            {"address": 0x7F0000000200, "size": 2 * MIB - 512, "requested_size": 0,
             "state": "inactive", "frames": []},
        ],
    }],
    "device_traces": [[
        {"action": "segment_alloc", "addr": 0x7F0000000000, "size": 2 * MIB, "stream": 0,
         "time_us": 1_700_000_000_000_000, "frames": []},
        {"action": "alloc", "addr": 0x7F0000000000, "size": 512, "stream": 0,
         "time_us": 1_700_000_000_000_010,
         "frames": [{"filename": "train.py", "line": 3, "name": "step"}]},
    ]],
    "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
}

OOM_TEXT = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            "79.15 GiB of which 1.06 GiB is free.")


def make_fake_torch(available=True):
    """A fake torch module and the state it records: `events` is the ordered list of
    calls into it, `observers` the functions given to the OOM observer hook."""
    state = types.SimpleNamespace(events=[], history=[], observers=[], snapshots=0)

    def record_memory_history(**kw):
        state.history.append(kw)
        state.events.append(("history", kw))

    def snapshot():
        state.snapshots += 1
        state.events.append(("snapshot", state.snapshots))
        snap = copy.deepcopy(SNAPSHOT)
        snap["device_traces"][0].append(
            {"action": "alloc", "addr": 0x7F0000001000, "size": state.snapshots,
             "stream": 0, "time_us": 1_700_000_000_000_100, "frames": []})
        return snap

    def attach_oom_observer(fn):
        state.observers.append(fn)
        state.events.append(("observer", fn))

    def fire_oom():
        """What the caching allocator does just before raising OutOfMemoryError."""
        for fn in state.observers:
            fn(0, 2 * GIB, 78 * GIB, 1 * GIB)

    torch = types.SimpleNamespace(
        cuda=types.SimpleNamespace(
            is_available=lambda: available,
            memory=types.SimpleNamespace(
                _record_memory_history=record_memory_history, _snapshot=snapshot),
        ),
        _C=types.SimpleNamespace(_cuda_attach_out_of_memory_observer=attach_oom_observer),
        fire_oom=fire_oom,  # test-only: lets a script run by main() trigger the observer
    )
    return torch, state


def expected_snapshot(n):
    """What the fake's n-th _snapshot() call returned."""
    snap = copy.deepcopy(SNAPSHOT)
    snap["device_traces"][0].append(
        {"action": "alloc", "addr": 0x7F0000001000, "size": n,
         "stream": 0, "time_us": 1_700_000_000_000_100, "frames": []})
    return snap


ROW0 = {"gpu": 0, "uuid": "GPU-aaaa", "total_bytes": 80 * GIB, "used_bytes": 3 * GIB,
        "free_bytes": 77 * GIB, "processes": [{"pid": 42, "used_bytes": 3 * GIB}]}
ROW1 = {"gpu": 1, "uuid": "GPU-bbbb", "total_bytes": 80 * GIB, "used_bytes": 0,
        "free_bytes": 80 * GIB, "processes": None}


class FakeSource:
    """A device memory source: returns `rows`, raising on the calls listed in `fail_on`
    (1-based). `read_once` is set after the first read."""

    def __init__(self, rows=(ROW0, ROW1), fail_on=()):
        self.rows = [dict(r) for r in rows]
        self.fail_on = set(fail_on)
        self.reads = 0
        self.closed = 0
        self.read_once = threading.Event()
        self.lock = threading.Lock()

    def read(self):
        with self.lock:
            self.reads += 1
            n = self.reads
        self.read_once.set()
        if n in self.fail_on:
            raise RuntimeError("nvml went away")
        return [dict(r) for r in self.rows]

    def close(self):
        self.closed += 1


def read_jsonl(path):
    with open(path) as f:
        lines = f.read().splitlines()
    return lines, [json.loads(line) for line in lines]


def load_pickle(path):
    with open(path, "rb") as f:
        data = f.read()
    return data, pickle.loads(data)


class TempDirCase(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="vramlens-capture-test-")
        self.tmp = self._tmp.name
        self.out = os.path.join(self.tmp, "out")

    def tearDown(self):
        self._tmp.cleanup()

    def path(self, name):
        return os.path.join(self.out, name)

    def files(self):
        return sorted(os.listdir(self.out))


# ------------------------------------------------------------------------------- capture

class CaptureTest(TempDirCase):
    def run_capture(self, body, torch_module=None, source=None, **kw):
        """Runs `body(written)` inside capture(); returns (exception or None, printed text)."""
        stream = io.StringIO()
        err = None
        try:
            with vc.capture(self.out, torch_module=torch_module, source=source,
                            print_commands=True, stream=stream, **kw) as written:
                body(written)
        except BaseException as e:  # noqa: B902 - the test looks at what propagated
            err = e
        return err, stream.getvalue()

    def test_records_history_dumps_snapshots_and_prints_commands(self):
        torch, st = make_fake_torch()
        src = FakeSource()
        seen = {}

        def body(written):
            # History is on while the block runs, with the arguments given.
            self.assertEqual(st.history, [dict(enabled="all", context="all", stacks="all",
                                               max_entries=1234)])
            self.assertEqual(len(st.observers), 1)
            oom = self.path("oom_snapshot.pickle")
            self.assertFalse(os.path.exists(oom))
            # The allocator calls the observer (device, alloc, device_allocated, device_free).
            st.observers[0](0, 2 * GIB, 78 * GIB, 1 * GIB)
            data, snap = load_pickle(oom)
            self.assertEqual(data[:2], b"\x80\x04", "pickle protocol 4")
            self.assertEqual(snap, expected_snapshot(1))
            self.assertEqual(written, [oom])
            # A second OOM in the same run does not rewrite it.
            mtime = os.stat(oom).st_mtime_ns
            st.observers[0](0, 4 * GIB, 78 * GIB, 1 * GIB)
            self.assertEqual(st.snapshots, 1)
            self.assertEqual(load_pickle(oom)[1], expected_snapshot(1))
            self.assertEqual(os.stat(oom).st_mtime_ns, mtime)
            self.assertEqual(written, [oom])
            seen["written"] = written
            raise RuntimeError(OOM_TEXT)

        err, printed = self.run_capture(body, torch, src, max_entries=1234, stacks="all",
                                        interval_ms=5)

        # The OOM exception propagates unchanged.
        self.assertIsInstance(err, RuntimeError)
        self.assertEqual(str(err), OOM_TEXT)
        # History: on once, then off at the end, after the final snapshot was taken.
        self.assertEqual(st.history[-1], {"enabled": None})
        self.assertEqual(len(st.history), 2)
        kinds = [e[0] for e in st.events]
        self.assertEqual(kinds, ["history", "observer", "snapshot", "snapshot", "history"])
        # Final snapshot: protocol 4, the fake's dict, written atomically (no .tmp left).
        data, snap = load_pickle(self.path("snapshot.pickle"))
        self.assertEqual(data[:2], b"\x80\x04")
        self.assertEqual(snap, expected_snapshot(2))
        self.assertEqual(self.files(), ["nvml.jsonl", "oom.log", "oom_snapshot.pickle",
                                        "snapshot.pickle"])
        # oom.log holds the traceback with the message.
        with open(self.path("oom.log")) as f:
            log = f.read()
        self.assertIn("Traceback (most recent call last)", log)
        self.assertIn("RuntimeError: " + OOM_TEXT, log)
        # Samples were taken and the source closed.
        lines, rows = read_jsonl(self.path("nvml.jsonl"))
        self.assertGreaterEqual(len(rows), 2)
        self.assertEqual({r["gpu"] for r in rows}, {0, 1})
        self.assertEqual(src.closed, 1)
        # `written` names every file.
        self.assertEqual(sorted(set(seen["written"])),
                         [self.path(n) for n in self.files()])
        # The printed commands name the files.
        oom, log_p = self.path("oom_snapshot.pickle"), self.path("oom.log")
        final = self.path("snapshot.pickle")
        out_lines = printed.splitlines()
        self.assertEqual(out_lines[0], "vramlens: wrote " + ", ".join(
            [self.path(n) for n in self.files()]))
        self.assertEqual(out_lines[1:], [
            f"  next: vramlens oom {oom} --log {log_p}",
            f"  next: vramlens timeline {oom} --at oom",
            f"  next: vramlens summary {final}",
            f"  next: vramlens timeline {final} -o {self.path('timeline.svg')} --force"
            f" --nvml {self.path('nvml.jsonl')}",
            f"  next: vramlens reconcile {oom} --nvml {self.path('nvml.jsonl')}",
        ])

    def test_normal_block_writes_snapshot_and_no_oom_files(self):
        torch, st = make_fake_torch()
        src = FakeSource()
        err, printed = self.run_capture(lambda w: None, torch, src, interval_ms=5)
        self.assertIsNone(err)
        self.assertEqual(st.history, [
            dict(enabled="all", context="all", stacks="python", max_entries=100_000),
            {"enabled": None}])
        self.assertEqual(self.files(), ["nvml.jsonl", "snapshot.pickle"])
        self.assertEqual(load_pickle(self.path("snapshot.pickle"))[1], expected_snapshot(1))
        final = self.path("snapshot.pickle")
        self.assertNotIn("vramlens oom", printed)
        self.assertIn(f"  next: vramlens summary {final}\n", printed)
        self.assertIn(f"  next: vramlens timeline {final} -o ", printed)

    def test_other_exception_propagates_without_oom_log(self):
        torch, st = make_fake_torch()

        def body(written):
            raise ValueError("shape mismatch")

        err, printed = self.run_capture(body, torch, FakeSource(), interval_ms=5)
        self.assertIsInstance(err, ValueError)
        self.assertEqual(self.files(), ["nvml.jsonl", "snapshot.pickle"])
        self.assertEqual(st.history[-1], {"enabled": None})
        self.assertNotIn("vramlens oom", printed)

    def test_oom_without_observer_call_suggests_the_log(self):
        torch, _ = make_fake_torch()

        def body(written):
            raise RuntimeError("CUDA error: out of memory")

        err, printed = self.run_capture(body, torch, FakeSource(), interval_ms=5)
        self.assertIsInstance(err, RuntimeError)
        self.assertIn(f"  next: vramlens oom --log {self.path('oom.log')}\n", printed)
        self.assertNotIn("oom_snapshot", printed)

    def test_print_commands_false_prints_nothing(self):
        torch, _ = make_fake_torch()
        stream = io.StringIO()
        with vc.capture(self.out, torch_module=torch, source=FakeSource(),
                        print_commands=False, stream=stream):
            pass
        self.assertEqual(stream.getvalue(), "")
        self.assertEqual(self.files(), ["nvml.jsonl", "snapshot.pickle"])

    def test_cuda_unavailable_only_samples(self):
        torch, st = make_fake_torch(available=False)
        err, printed = self.run_capture(lambda w: None, torch, FakeSource(), interval_ms=5)
        self.assertIsNone(err)
        self.assertEqual(st.events, [])
        self.assertEqual(self.files(), ["nvml.jsonl"])
        self.assertEqual(printed, "vramlens: no memory history: torch.cuda.is_available() is "
                                  f"False\nvramlens: wrote {self.path('nvml.jsonl')}\n")

    def test_without_torch_samples_and_prints(self):
        src = FakeSource()
        with mock.patch.dict(sys.modules, {"torch": None}):  # `import torch` fails
            err, printed = self.run_capture(lambda w: None, None, src, interval_ms=5)
        self.assertIsNone(err)
        self.assertEqual(self.files(), ["nvml.jsonl"])
        lines, rows = read_jsonl(self.path("nvml.jsonl"))
        self.assertGreaterEqual(len(rows), 2)
        self.assertEqual(src.closed, 1)
        self.assertEqual(printed, "vramlens: no memory history: PyTorch (torch) is not "
                                  f"installed\nvramlens: wrote {self.path('nvml.jsonl')}\n")

    def test_without_torch_or_source_still_runs(self):
        with mock.patch.dict(sys.modules, {"torch": None}), \
                mock.patch.object(vc, "default_source", return_value=None):
            err, printed = self.run_capture(lambda w: None)
        self.assertIsNone(err)
        self.assertEqual(self.files(), [])
        self.assertEqual(printed, "vramlens: no memory history: PyTorch (torch) is not "
                                  "installed\nvramlens: wrote nothing\n")

    def test_imports_torch_when_not_given(self):
        torch, st = make_fake_torch()
        with mock.patch.dict(sys.modules, {"torch": torch}):
            err, _ = self.run_capture(lambda w: None, None, FakeSource(), interval_ms=5)
        self.assertIsNone(err)
        self.assertEqual(len(st.history), 2)
        self.assertEqual(self.files(), ["nvml.jsonl", "snapshot.pickle"])

    def test_uses_default_source_when_none_given(self):
        torch, _ = make_fake_torch()
        src = FakeSource()
        with mock.patch.object(vc, "default_source", return_value=src) as ds:
            err, _ = self.run_capture(lambda w: None, torch, None, interval_ms=5)
        self.assertIsNone(err)
        ds.assert_called_once_with()
        self.assertGreaterEqual(src.reads, 1)
        self.assertEqual(src.closed, 1)


class NextCommandsTest(unittest.TestCase):
    def test_combinations(self):
        j = os.path.join
        d = "out"
        oom, log, final = j(d, "oom_snapshot.pickle"), j(d, "oom.log"), j(d, "snapshot.pickle")
        self.assertEqual(vc.next_commands(d, set()), [])
        self.assertEqual(vc.next_commands(d, {j(d, "nvml.jsonl")}), [])
        self.assertEqual(vc.next_commands(d, {log}), [f"vramlens oom --log {log}"])
        self.assertEqual(vc.next_commands(d, {oom}), [
            f"vramlens oom {oom}", f"vramlens timeline {oom} --at oom"])
        self.assertEqual(vc.next_commands(d, {final}), [
            f"vramlens summary {final}",
            f"vramlens timeline {final} -o {j(d, 'timeline.svg')} --force"])
        nvml = j(d, "nvml.jsonl")
        self.assertEqual(vc.next_commands(d, {final, nvml}), [
            f"vramlens summary {final}",
            f"vramlens timeline {final} -o {j(d, 'timeline.svg')} --force --nvml {nvml}",
            f"vramlens reconcile {final} --nvml {nvml}"])

    def test_paths_are_quoted_for_the_shell(self):
        d = "my run $(id)"
        final = os.path.join(d, "snapshot.pickle")
        cmds = vc.next_commands(d, {final})
        self.assertEqual(cmds[0], "vramlens summary 'my run $(id)/snapshot.pickle'")
        # Split as a shell would: the path comes back whole, nothing runs.
        self.assertEqual(shlex.split(cmds[0]), ["vramlens", "summary", final])


# ------------------------------------------------------------------------------- Sampler

class SamplerTest(TempDirCase):
    def setUp(self):
        super().setUp()
        os.makedirs(self.out)
        self.clock = itertools.count(1_000_000, 250)

    def sampler(self, src, interval_s=60.0):
        return vc.Sampler(self.path("nvml.jsonl"), src, interval_s,
                          clock_us=lambda: next(self.clock))

    def test_writes_sorted_json_lines_with_time(self):
        src = FakeSource()
        s = self.sampler(src).start()
        self.assertTrue(src.read_once.wait(5))  # the thread's first tick
        s.stop()  # wakes the thread, which exits; then one last sample
        self.assertEqual(src.reads, 2)
        self.assertEqual((s.samples, s.errors), (2, 0))
        lines, rows = read_jsonl(self.path("nvml.jsonl"))
        self.assertEqual(rows, [
            {"time_us": 1_000_000, **ROW0}, {"time_us": 1_000_000, **ROW1},
            {"time_us": 1_000_250, **ROW0}, {"time_us": 1_000_250, **ROW1},
        ])
        for line, row in zip(lines, rows):
            self.assertEqual(line, json.dumps(row, sort_keys=True))
            self.assertEqual(list(json.loads(line)), sorted(row))

    def test_failed_read_counts_an_error_and_writes_nothing(self):
        src = FakeSource(fail_on={1})
        s = self.sampler(src).start()
        self.assertTrue(src.read_once.wait(5))
        s.stop()
        self.assertEqual((s.samples, s.errors), (1, 1))
        _, rows = read_jsonl(self.path("nvml.jsonl"))
        # Only the last sample: the failed tick (time 1_000_000) left no line.
        self.assertEqual([r["time_us"] for r in rows], [1_000_250, 1_000_250])

    def test_stop_takes_a_last_sample_and_closes_the_source(self):
        src = FakeSource(rows=[ROW0])
        s = self.sampler(src).start()
        self.assertTrue(src.read_once.wait(5))
        self.assertEqual(src.closed, 0)
        s.stop()
        self.assertEqual(src.closed, 1)
        self.assertEqual(src.reads, 2)
        self.assertFalse(s._thread.is_alive())
        self.assertTrue(s._file.closed)
        _, rows = read_jsonl(self.path("nvml.jsonl"))
        self.assertEqual(rows[-1], {"time_us": 1_000_250, **ROW0})

    def test_samples_repeatedly_at_the_interval(self):
        src = FakeSource(rows=[ROW0], fail_on={2})
        done = threading.Event()
        orig = src.read

        def read():
            rows = orig()
            if src.reads >= 4:
                done.set()
            return rows

        src.read = read
        s = self.sampler(src, interval_s=0.005).start()
        self.assertTrue(done.wait(5))
        s.stop()
        self.assertGreaterEqual(s.samples, 4)
        self.assertEqual(s.errors, 1)
        _, rows = read_jsonl(self.path("nvml.jsonl"))
        self.assertEqual(len(rows), s.samples)
        times = [r["time_us"] for r in rows]
        self.assertEqual(times, sorted(times))
        self.assertNotIn(1_000_250, times)  # the failed second tick

    def test_source_with_no_devices_writes_no_lines(self):
        src = FakeSource(rows=[])
        s = self.sampler(src).start()
        self.assertTrue(src.read_once.wait(5))
        s.stop()
        self.assertEqual(s.samples, 2)
        self.assertEqual(read_jsonl(self.path("nvml.jsonl"))[0], [])


# ---------------------------------------------------------------------- device sources

SMI_OUT = textwrap.dedent("""\
    0, GPU-1f2e3d4c-0000-1111-2222-333344445555, 81559, 1234, 80325
    1, GPU-99999999-aaaa-bbbb-cccc-dddddddddddd, 81559, 0, 81559
    No devices were found? garbage
    2, GPU-x, [N/A], [N/A], [N/A]

    """)


class SmiSourceTest(unittest.TestCase):
    def test_parses_two_gpus_in_bytes_and_skips_garbage(self):
        calls = []

        def run(args, **kw):
            calls.append((args, kw))
            return types.SimpleNamespace(stdout=SMI_OUT, returncode=0)

        src = vc.SmiSource(run=run)
        rows = src.read()
        self.assertEqual(calls, [(
            ["nvidia-smi",
             "--query-gpu=index,uuid,memory.total,memory.used,memory.free",
             "--format=csv,noheader,nounits"],
            dict(capture_output=True, text=True, timeout=10, check=True))])
        self.assertEqual(rows, [
            {"gpu": 0, "uuid": "GPU-1f2e3d4c-0000-1111-2222-333344445555",
             "total_bytes": 81559 * 1048576, "used_bytes": 1234 * 1048576,
             "free_bytes": 80325 * 1048576, "processes": None},
            {"gpu": 1, "uuid": "GPU-99999999-aaaa-bbbb-cccc-dddddddddddd",
             "total_bytes": 81559 * 1048576, "used_bytes": 0,
             "free_bytes": 81559 * 1048576, "processes": None},
        ])
        src.close()  # nothing to release

    def test_failing_command_raises_and_sampler_counts_it(self):
        def run(args, **kw):
            raise vc.subprocess.CalledProcessError(9, args, "", "NVIDIA-SMI has failed")

        src = vc.SmiSource(run=run)
        with self.assertRaises(vc.subprocess.CalledProcessError):
            src.read()
        with tempfile.TemporaryDirectory() as d:
            s = vc.Sampler(os.path.join(d, "n.jsonl"), src, 60.0).start()
            s.stop()
            self.assertEqual(s.samples, 0)
            self.assertGreaterEqual(s.errors, 1)
            self.assertEqual(os.path.getsize(os.path.join(d, "n.jsonl")), 0)


def make_fake_pynvml(shutdown_raises=False):
    state = types.SimpleNamespace(calls=[])

    class NVMLError(Exception):
        pass

    devices = [
        dict(uuid=b"GPU-0000", total=80 * GIB, used=3 * GIB, free=77 * GIB,
             procs=[types.SimpleNamespace(pid=4242, usedGpuMemory=3 * GIB - MIB),
                    types.SimpleNamespace(pid=4343, usedGpuMemory=None)]),
        dict(uuid="GPU-1111", total=40 * GIB, used=0, free=40 * GIB, procs=NVMLError),
    ]

    def call(name, fn):
        def wrapped(*a):
            state.calls.append(name)
            return fn(*a)
        return wrapped

    def processes(h):
        procs = devices[h]["procs"]
        if procs is NVMLError:
            raise NVMLError("Not Supported")
        return list(procs)

    def shutdown():
        if shutdown_raises:
            raise NVMLError("Uninitialized")

    nvml = types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=call("init", lambda: None),
        nvmlDeviceGetCount=call("count", lambda: len(devices)),
        nvmlDeviceGetHandleByIndex=call("handle", lambda i: i),
        nvmlDeviceGetMemoryInfo=call("mem", lambda h: types.SimpleNamespace(
            total=devices[h]["total"], used=devices[h]["used"], free=devices[h]["free"])),
        nvmlDeviceGetUUID=call("uuid", lambda h: devices[h]["uuid"]),
        nvmlDeviceGetComputeRunningProcesses=call("procs", processes),
        nvmlShutdown=call("shutdown", shutdown),
    )
    return nvml, state


class NvmlSourceTest(unittest.TestCase):
    def test_reads_memory_uuid_and_processes(self):
        nvml, st = make_fake_pynvml()
        src = vc.NvmlSource(nvml)
        self.assertEqual(st.calls, ["init", "count", "handle", "handle"])
        rows = src.read()
        self.assertEqual(rows, [
            {"gpu": 0, "uuid": "GPU-0000", "total_bytes": 80 * GIB, "used_bytes": 3 * GIB,
             "free_bytes": 77 * GIB,
             "processes": [{"pid": 4242, "used_bytes": 3 * GIB - MIB},
                           {"pid": 4343, "used_bytes": None}]},
            {"gpu": 1, "uuid": "GPU-1111", "total_bytes": 40 * GIB, "used_bytes": 0,
             "free_bytes": 40 * GIB, "processes": None},
        ])
        json.dumps(rows)  # serialisable as the sampler writes it
        src.close()
        self.assertEqual(st.calls[-1], "shutdown")

    def test_close_ignores_shutdown_errors(self):
        nvml, st = make_fake_pynvml(shutdown_raises=True)
        vc.NvmlSource(nvml).close()
        self.assertEqual(st.calls[-1], "shutdown")

    def test_default_source_prefers_pynvml(self):
        nvml, _ = make_fake_pynvml()
        with mock.patch.dict(sys.modules, {"pynvml": nvml}):
            src = vc.default_source()
        self.assertIsInstance(src, vc.NvmlSource)
        self.assertIs(src.nvml, nvml)

    def test_default_source_falls_back_to_smi_then_none(self):
        good = types.SimpleNamespace(read=lambda: [], close=lambda: None)

        def broken():
            raise FileNotFoundError("nvidia-smi")

        with mock.patch.dict(sys.modules, {"pynvml": None}):
            with mock.patch.object(vc, "SmiSource", return_value=good):
                self.assertIs(vc.default_source(), good)
            with mock.patch.object(vc, "SmiSource", return_value=types.SimpleNamespace(
                    read=broken, close=lambda: None)):
                self.assertIsNone(vc.default_source())


# ---------------------------------------------------------------------------------- main

class MainCase(TempDirCase):
    def run_main(self, script_text, *args, torch=None, extra_argv=(), sampled=True):
        """Writes `script_text` to a temporary script and runs main() on it with the fake
        torch in sys.modules and a fake source; returns (code, printed, stderr, state)."""
        script = os.path.join(self.tmp, "job.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent(script_text))
        if torch is None:
            torch, st = make_fake_torch()
        else:
            torch, st = torch
        printed, stderr = io.StringIO(), io.StringIO()
        src = FakeSource()
        capture = functools.partial(vc.capture, stream=printed)
        argv = ["--out", self.out, "--interval-ms", "5", *extra_argv, script, *args]
        with mock.patch.dict(sys.modules, {"torch": torch}), \
                mock.patch.object(vc, "default_source", return_value=src), \
                mock.patch.object(vc, "capture", capture), \
                mock.patch.object(sys, "argv", list(sys.argv)), \
                mock.patch.object(sys, "path", list(sys.path)), \
                contextlib.redirect_stderr(stderr):
            code = vc.main(argv)
        self.assertEqual(src.closed, 1 if sampled else 0)
        return code, printed.getvalue(), stderr.getvalue(), st


class MainTest(MainCase):
    def test_normal_script_exits_0(self):
        code, printed, err, st = self.run_main("""\
            import json, sys, torch
            assert __name__ == "__main__"
            with open(sys.argv[-1], "w") as f:
                json.dump({"argv": sys.argv, "cuda": torch.cuda.is_available()}, f)
            """, "--epochs", "1", os.path.join(self.tmp, "seen.json"),
            extra_argv=["--max-entries", "77", "--stacks", "all"])
        self.assertEqual(code, 0, err)
        with open(os.path.join(self.tmp, "seen.json")) as f:
            seen = json.load(f)
        self.assertEqual(seen["argv"], [os.path.join(self.tmp, "job.py"), "--epochs", "1",
                                        os.path.join(self.tmp, "seen.json")])
        self.assertTrue(seen["cuda"])
        self.assertEqual(st.history, [
            dict(enabled="all", context="all", stacks="all", max_entries=77),
            {"enabled": None}])
        self.assertEqual(self.files(), ["nvml.jsonl", "snapshot.pickle"])
        self.assertIn(f"  next: vramlens summary {self.path('snapshot.pickle')}", printed)
        self.assertEqual(err, "")

    def test_double_dash_before_script(self):
        code, _, err, _ = self.run_main(
            "import sys; assert sys.argv[1:] == ['-x'], sys.argv\n", "-x", extra_argv=["--"])
        self.assertEqual(code, 0, err)

    def test_oom_script_exits_1_with_log_and_snapshot(self):
        code, printed, err, st = self.run_main("""\
            import torch

            def step():
                torch.fire_oom()  # the allocator calls the observer, then raises
                raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB "
                                   "(GPU 0; 79.15 GiB total capacity; 78.00 GiB already "
                                   "allocated; 1.00 GiB free; 78.50 GiB reserved in total "
                                   "by PyTorch)")

            step()
            """)
        self.assertEqual(code, 1)
        self.assertIn("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", err)
        self.assertEqual(self.files(), ["nvml.jsonl", "oom.log", "oom_snapshot.pickle",
                                        "snapshot.pickle"])
        with open(self.path("oom.log")) as f:
            log = f.read()
        self.assertIn("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0;", log)
        self.assertIn("in step", log)
        data, snap = load_pickle(self.path("oom_snapshot.pickle"))
        self.assertEqual(data[:2], b"\x80\x04")
        self.assertEqual(snap, expected_snapshot(1))
        self.assertEqual(st.history[-1], {"enabled": None})
        self.assertIn(f"  next: vramlens oom {self.path('oom_snapshot.pickle')} "
                      f"--log {self.path('oom.log')}", printed)

    def test_oom_message_only_exits_1_with_log(self):
        code, printed, err, _ = self.run_main(
            'raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB ...")\n')
        self.assertEqual(code, 1)
        self.assertEqual(self.files(), ["nvml.jsonl", "oom.log", "snapshot.pickle"])
        with open(self.path("oom.log")) as f:
            self.assertIn("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB ...",
                          f.read())
        self.assertIn(f"  next: vramlens oom --log {self.path('oom.log')}", printed)

    def test_other_error_exits_1_without_log(self):
        code, _, err, _ = self.run_main("raise KeyError('batch')\n")
        self.assertEqual(code, 1)
        self.assertIn("KeyError: 'batch'", err)
        self.assertEqual(self.files(), ["nvml.jsonl", "snapshot.pickle"])

    def test_exit_codes_pass_through(self):
        for text, want in [("import sys; sys.exit(3)\n", 3),
                           ("import sys; sys.exit(0)\n", 0),
                           ("raise SystemExit('bad config')\n", 1)]:
            with self.subTest(script=text):
                code, _, _, _ = self.run_main(text)
                self.assertEqual(code, want)

    def test_without_torch_fails_before_running_the_script(self):
        ran = os.path.join(self.tmp, "ran")
        code, printed, err, _ = self.run_main(f"open({ran!r}, 'w').close()\n",
                                              torch=(None, None), sampled=False)
        self.assertEqual(code, 2)
        self.assertTrue(err.startswith(
            "vramlens_capture: error: PyTorch is needed to record CUDA memory, and "
            "`import torch` failed ("), err)
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertEqual(printed, "")
        self.assertFalse(os.path.exists(ran))
        self.assertFalse(os.path.exists(self.out))

    def test_without_cuda_fails_before_running_the_script(self):
        ran = os.path.join(self.tmp, "ran")
        code, printed, err, st = self.run_main(f"open({ran!r}, 'w').close()\n",
                                               torch=make_fake_torch(available=False),
                                               sampled=False)
        self.assertEqual(code, 2)
        self.assertEqual(err, "vramlens_capture: error: torch.cuda.is_available() is False: "
                              "no CUDA device to record memory from; nothing was run\n")
        self.assertEqual(printed, "")
        self.assertEqual(st.events, [])
        self.assertFalse(os.path.exists(ran))
        self.assertFalse(os.path.exists(self.out))


class CommandLineTest(TempDirCase):
    """The two ways to start the helper from a shell, each in a fresh interpreter."""

    def python(self, *args, env=None):
        return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                              timeout=60, env=env, cwd=self.tmp)

    def test_module_help(self):
        env = dict(os.environ, PYTHONPATH=PYTHON_SRC, PYTHONDONTWRITEBYTECODE="1")
        r = self.python("-m", "vramlens.capture", "--help", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith("usage: python -m vramlens.capture [-h] [--out OUT]"),
                        r.stdout)
        self.assertIn("--interval-ms", r.stdout)

    def test_script_in_checkout_runs_the_module(self):
        # scripts/vramlens_capture.py runs main() of the package's module: without torch
        # (as on this machine) the module's own refusal comes back, status and message.
        job = os.path.join(self.tmp, "job.py")
        with open(job, "w") as f:
            f.write("raise SystemExit(3)\n")
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONPATH", None)
        r = self.python(os.path.join(HERE, "vramlens_capture.py"), "--out", self.out, "--",
                        job, "--epochs", "1", env=env)
        try:
            import torch  # noqa: F401
            has_torch = True
        except ImportError:
            has_torch = False
        if has_torch:
            self.assertNotEqual(r.returncode, 0, r.stderr)
        else:
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("vramlens_capture: error: PyTorch is needed", r.stderr)

    def test_script_in_checkout_imports_as_before(self):
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONPATH", None)
        code = ("import sys; sys.path.insert(0, sys.argv[1]); import vramlens_capture as s, "
                "vramlens.capture as m; assert s.capture is m.capture and s.Sampler is "
                "m.Sampler and s.main is m.main; print(m.__file__)")
        r = self.python("-c", code, HERE, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(os.path.realpath(r.stdout.strip()),
                         os.path.realpath(os.path.join(PYTHON_SRC, "vramlens", "capture.py")))


class RegressionTests(MainCase):
    """Defects the capture helper once had (see the module docstring)."""

    def test_sys_exit_without_code_is_success(self):
        # sys.exit() / `raise SystemExit` means status 0; main() once mapped e.code None to 1.
        code, _, _, _ = self.run_main("import sys; sys.exit()\n")
        self.assertEqual(code, 0)

    def test_script_folder_is_importable(self):
        # `python3 job.py` puts job.py's folder first on sys.path; runpy.run_path does not,
        # so a script importing a module next to it fails under the wrapper.
        with open(os.path.join(self.tmp, "job_helpers_for_vramlens_test.py"), "w") as f:
            f.write("VALUE = 7\n")
        code, _, err, _ = self.run_main(
            "import job_helpers_for_vramlens_test as h\nassert h.VALUE == 7\n")
        sys.modules.pop("job_helpers_for_vramlens_test", None)
        self.assertEqual(code, 0, err)

    def test_double_dash_in_script_arguments_is_kept(self):
        # argparse already drops the `--` before the script; main() also drops every `--`
        # among the script's own arguments.
        code, _, err, _ = self.run_main(
            "import sys; assert sys.argv[1:] == ['--epochs', '1', '--', 'x'], sys.argv\n",
            "--epochs", "1", "--", "x")
        self.assertEqual(code, 0, err)

    def test_oom_snapshot_left_by_an_earlier_run_is_replaced(self):
        # The observer writes only `if not os.path.exists(oom_path)`: with a reused --out
        # folder an earlier run's oom_snapshot.pickle stays, this run's OOM is not dumped
        # and the printed commands do not mention the OOM snapshot.
        os.makedirs(self.out)
        with open(self.path("oom_snapshot.pickle"), "wb") as f:
            pickle.dump({"stale": True}, f, protocol=4)
        code, printed, _, _ = self.run_main(
            "import torch\ntorch.fire_oom()\nraise RuntimeError('CUDA out of memory.')\n")
        self.assertEqual(code, 1)
        self.assertEqual(load_pickle(self.path("oom_snapshot.pickle"))[1],
                         expected_snapshot(1))


if __name__ == "__main__":
    unittest.main()
