"""Capture what vramlens needs around a PyTorch job: memory history, an OOM snapshot and
device memory samples.

Use it around a training script without changing it:

    python -m vramlens.capture --out vramlens-out -- train.py --epochs 1

or inside one:

    from vramlens.capture import capture
    with capture("vramlens-out"):
        train()

What it does:
  * turns on torch.cuda.memory._record_memory_history (Python stacks by default, a bounded
    ring buffer of --max-entries events);
  * installs an OOM observer that dumps the snapshot with pickle protocol 4 (the protocol
    every viewer reads) to OUT/oom_snapshot.pickle, and keeps the OOM message in
    OUT/oom.log when the exception reaches the wrapper;
  * samples device memory every --interval-ms in a thread into OUT/nvml.jsonl (JSON lines:
    time_us, gpu, uuid, total/used/free bytes, per-process bytes) through nvidia-ml-py
    when installed, else `nvidia-smi`;
  * dumps OUT/snapshot.pickle at the end, and prints the vramlens commands to run next.

Python standard library only; nvidia-ml-py is used when present. Run as a command it
needs torch and a CUDA device (exit status 2 without them, before the script runs);
`capture()` in a script without them only samples the device, and says so.
"""

import argparse
import contextlib
import json
import os
import pickle
import runpy
import shlex
import subprocess
import sys
import threading
import time
import traceback

__all__ = ["capture", "Sampler", "main"]


def _now_us():
    return int(time.time() * 1_000_000)


class NvmlSource:
    """Device memory through nvidia-ml-py (module pynvml)."""

    def __init__(self, nvml):
        self.nvml = nvml
        nvml.nvmlInit()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    def read(self):
        rows = []
        for i, h in enumerate(self.handles):
            mem = self.nvml.nvmlDeviceGetMemoryInfo(h)
            uuid = self.nvml.nvmlDeviceGetUUID(h)
            if isinstance(uuid, bytes):
                uuid = uuid.decode()
            procs = []
            try:
                for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(h):
                    used = p.usedGpuMemory
                    procs.append({"pid": int(p.pid), "used_bytes": None if used is None else int(used)})
            except self.nvml.NVMLError:
                procs = None
            rows.append({
                "gpu": i,
                "uuid": uuid,
                "total_bytes": int(mem.total),
                "used_bytes": int(mem.used),
                "free_bytes": int(mem.free),
                "processes": procs,
            })
        return rows

    def close(self):
        with contextlib.suppress(Exception):
            self.nvml.nvmlShutdown()


class SmiSource:
    """Device memory through the nvidia-smi command (MiB resolution)."""

    QUERY = "index,uuid,memory.total,memory.used,memory.free"

    def __init__(self, run=subprocess.run):
        self.run = run

    def read(self):
        out = self.run(
            ["nvidia-smi", "--query-gpu=" + self.QUERY, "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
        rows = []
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 5:
                continue
            index, uuid, total, used, free = parts
            mib = 1 << 20
            try:
                rows.append({
                    "gpu": int(index),
                    "uuid": uuid,
                    "total_bytes": int(total) * mib,
                    "used_bytes": int(used) * mib,
                    "free_bytes": int(free) * mib,
                    "processes": None,
                })
            except ValueError:
                continue
        return rows

    def close(self):
        pass


def default_source():
    """nvidia-ml-py when it imports and initialises, else nvidia-smi, else None."""
    try:
        import pynvml  # nvidia-ml-py
        return NvmlSource(pynvml)
    except Exception:
        pass
    try:
        src = SmiSource()
        src.read()
        return src
    except Exception:
        return None


class Sampler:
    """Samples a source every `interval_s` in a daemon thread into a JSON-lines file."""

    def __init__(self, path, source, interval_s=0.1, clock_us=_now_us):
        self.path = path
        self.source = source
        self.interval_s = interval_s
        self.clock_us = clock_us
        self.samples = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = None
        self._file = None

    def sample_once(self):
        t = self.clock_us()
        try:
            rows = self.source.read()
        except Exception:
            self.errors += 1
            return
        for row in rows:
            self._file.write(json.dumps({"time_us": t, **row}, sort_keys=True) + "\n")
        self._file.flush()
        self.samples += 1

    def _loop(self):
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)

    def start(self):
        self._file = open(self.path, "w")
        self._thread = threading.Thread(target=self._loop, name="vramlens-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sample_once()  # one last sample after the job
        self._file.close()
        self.source.close()


def dump_snapshot(torch, path):
    """Writes the allocator snapshot with pickle protocol 4."""
    snapshot = torch.cuda.memory._snapshot()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    os.replace(tmp, path)
    return path


def next_commands(out_dir, files):
    """The vramlens commands worth running on what was written, each path quoted for a
    POSIX shell (shlex.quote), so that a command copied from the output runs as shown."""
    q = shlex.quote
    cmds = []
    oom = os.path.join(out_dir, "oom_snapshot.pickle")
    final = os.path.join(out_dir, "snapshot.pickle")
    log = os.path.join(out_dir, "oom.log")
    if oom in files:
        cmds.append(f"vramlens oom {q(oom)}" + (f" --log {q(log)}" if log in files else ""))
        cmds.append(f"vramlens timeline {q(oom)} --at oom")
    elif log in files:
        cmds.append(f"vramlens oom --log {q(log)}")
    nvml = os.path.join(out_dir, "nvml.jsonl")
    if final in files:
        cmds.append(f"vramlens summary {q(final)}")
        svg = os.path.join(out_dir, "timeline.svg")
        with_nvml = f" --nvml {q(nvml)}" if nvml in files else ""
        cmds.append(f"vramlens timeline {q(final)} -o {q(svg)} --force{with_nvml}")
    if nvml in files and (oom in files or final in files):
        cmds.append(f"vramlens reconcile {q(oom if oom in files else final)} --nvml {q(nvml)}")
    return cmds


@contextlib.contextmanager
def capture(out_dir, max_entries=100_000, stacks="python", interval_ms=100,
            torch_module=None, source=None, print_commands=True, stream=sys.stderr):
    """Records memory history and samples device memory while the block runs."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    torch = torch_module
    if torch is None:
        try:
            import torch  # noqa: F811
        except ImportError:
            torch = None
    cuda = torch is not None and torch.cuda.is_available()
    if cuda:
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks=stacks,
                                                 max_entries=max_entries)
        oom_path = os.path.join(out_dir, "oom_snapshot.pickle")
        dumped = []

        def on_oom(device, alloc, device_alloc, device_free):
            # The first OOM of this run (a file left by an earlier run is replaced).
            if not dumped:
                dump_snapshot(torch, oom_path)
                dumped.append(oom_path)
                written.append(oom_path)

        torch._C._cuda_attach_out_of_memory_observer(on_oom)
    src = source if source is not None else default_source()
    sampler = None
    if src is not None:
        sampler = Sampler(os.path.join(out_dir, "nvml.jsonl"), src, interval_ms / 1000).start()
    try:
        yield written
    except BaseException as e:
        if "out of memory" in str(e):
            log = os.path.join(out_dir, "oom.log")
            with open(log, "w") as f:
                f.write("".join(traceback.format_exception(type(e), e, e.__traceback__)))
            written.append(log)
        raise
    finally:
        if sampler is not None:
            sampler.stop()
            written.append(sampler.path)
        if cuda:
            # A failure here must neither leave recording on nor hide the job's own error.
            try:
                written.append(dump_snapshot(torch, os.path.join(out_dir, "snapshot.pickle")))
            except Exception as err:
                print(f"vramlens: could not write the final snapshot: {err}", file=stream)
            finally:
                torch.cuda.memory._record_memory_history(enabled=None)
        if print_commands:
            if torch is None:
                print("vramlens: no memory history: PyTorch (torch) is not installed",
                      file=stream)
            elif not cuda:
                print("vramlens: no memory history: torch.cuda.is_available() is False",
                      file=stream)
            if written:
                print("vramlens: wrote " + ", ".join(sorted(set(written))), file=stream)
            else:
                print("vramlens: wrote nothing", file=stream)
            for c in next_commands(out_dir, set(written)):
                print("  next: " + c, file=stream)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m vramlens.capture",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="vramlens-out", help="folder for the files (default vramlens-out)")
    p.add_argument("--max-entries", type=int, default=100_000, help="trace ring buffer size")
    p.add_argument("--stacks", choices=["python", "all"], default="python",
                   help="python (default) or all (adds C++ frames; slower, larger)")
    p.add_argument("--interval-ms", type=int, default=100, help="device memory sampling period")
    p.add_argument("script", help="the Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = p.parse_args(argv)
    # Without torch and a CUDA device there is nothing to record: say so and run nothing.
    try:
        import torch
    except ImportError as e:
        print(f"vramlens_capture: error: PyTorch is needed to record CUDA memory, and "
              f"`import torch` failed ({e}); run this helper with the Python that trains",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("vramlens_capture: error: torch.cuda.is_available() is False: no CUDA device "
              "to record memory from; nothing was run", file=sys.stderr)
        return 2
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    sys.argv = [a.script] + args
    # As `python3 script.py` does: the script's folder comes first on the import path.
    sys.path.insert(0, os.path.dirname(os.path.abspath(a.script)))
    code = 0
    try:
        with capture(a.out, a.max_entries, a.stacks, a.interval_ms):
            runpy.run_path(a.script, run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    return code


if __name__ == "__main__":
    sys.exit(main())
