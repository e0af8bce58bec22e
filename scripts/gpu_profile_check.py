#!/usr/bin/env python3
"""The GPU check of profiler traces: a snapshot and a profiler trace recorded in one run.

Runs one short training job (a small MLP, bf16) on a CUDA machine with memory history on
(torch.cuda.memory._record_memory_history) and, around the same steps,
torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True). It
writes, into OUTDIR:

  snapshot.pickle        torch.cuda.memory._dump_snapshot()
  trace.json             prof.export_chrome_trace()
  memory_timeline.raw.json.gz, memory_timeline.json
                         prof.export_memory_timeline(..., device="cuda:0")
  nvml.jsonl             device readings every 20 ms (nvidia-ml-py when present, else none)
  versions.json          torch, CUDA, driver, GPU

then, when a vramlens binary is given (VRAMLENS=path/to/vramlens), checks what the
project claims on this real pair:

  - `vramlens summary trace.json --json`: the replayed peak equals the maximum of Total
    Allocated over the trace's CUDA [memory] events (computed here with json);
  - `vramlens reconcile snapshot.pickle --trace trace.json --json`: the trace is used, and
    most of its allocations in the snapshot's span match the snapshot's (same address,
    a block size holding the requested size, within 2 ms of the typical offset);
  - `vramlens summary memory_timeline.raw.json.gz --json` reads the export.

Usage: VRAMLENS=target/release/vramlens python3 scripts/gpu_profile_check.py OUTDIR
(under a minute on one H200). Exit status 1 when a check fails.
"""

import json
import os
import subprocess
import sys
import time

JOB = r'''
import json, os, sys, threading, time, torch
out = sys.argv[1]
torch.manual_seed(0)
dev = "cuda"

def sampler(stop, path):
    try:
        import pynvml
    except ImportError:
        return
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    uuid = pynvml.nvmlDeviceGetUUID(h)
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    with open(path, "w") as f:
        while not stop.is_set():
            m = pynvml.nvmlDeviceGetMemoryInfo(h)
            procs = [{"pid": p.pid, "used_bytes": p.usedGpuMemory}
                     for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
            f.write(json.dumps({"time_us": time.time_ns() // 1000, "gpu": torch.cuda.current_device(),
                                "uuid": uuid, "total_bytes": m.total, "used_bytes": m.used,
                                "free_bytes": m.free, "processes": procs}) + "\n")
            stop.wait(0.02)

stop = threading.Event()
t = threading.Thread(target=sampler, args=(stop, os.path.join(out, "nvml.jsonl")))
t.start()
torch.cuda.memory._record_memory_history(max_entries=100000)
width, depth, batch = 2048, 4, 4096
layers = []
for _ in range(depth):
    layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
model = torch.nn.Sequential(*layers).to(dev, torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

def step():
    x = torch.randn(batch, width, device=dev, dtype=torch.bfloat16)
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

step()   # warm-up: parameters, optimizer state and workspaces exist before profiling
torch.cuda.synchronize()
with torch.profiler.profile(
    activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
    profile_memory=True, record_shapes=True, with_stack=True,
) as prof:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
prof.export_chrome_trace(os.path.join(out, "trace.json"))
prof.export_memory_timeline(os.path.join(out, "memory_timeline.raw.json.gz"), device="cuda:0")
prof.export_memory_timeline(os.path.join(out, "memory_timeline.json"), device="cuda:0")
torch.cuda.memory._dump_snapshot(os.path.join(out, "snapshot.pickle"))
stop.set()
t.join()
'''


def versions():
    info = {"python": sys.version.split()[0]}
    try:
        import torch
        info["torch"] = torch.__version__
        info["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        info["driver"] = q.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def cuda_peak(trace_path):
    """Maximum Total Allocated over the CUDA [memory] events, per device."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    peaks = {}
    for e in events:
        a = e.get("args", {})
        if e.get("name") == "[memory]" and a.get("Device Type") == 1:
            d = a["Device Id"]
            peaks[d] = max(peaks.get(d, 0), a.get("Total Allocated", 0))
    return peaks


def run_vramlens(binary, args):
    r = subprocess.run([binary] + args, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"vramlens {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def check(out, binary):
    failures = []
    trace = os.path.join(out, "trace.json")
    peaks = cuda_peak(trace)
    summary = run_vramlens(binary, ["summary", trace, "--json"])
    for d in summary["devices"]:
        want = peaks.get(d["device"])
        if want != d["peak_allocated_bytes"]:
            failures.append(f"device {d['device']}: replayed peak {d['peak_allocated_bytes']}, "
                            f"trace's Total Allocated peak {want}")
    args = ["reconcile", os.path.join(out, "snapshot.pickle"), "--trace", trace, "--json"]
    nvml = os.path.join(out, "nvml.jsonl")
    if os.path.exists(nvml) and os.path.getsize(nvml) > 0:
        args += ["--nvml", nvml]
    else:
        failures.append("no NVML samples (install nvidia-ml-py): reconcile needs a device log")
    rec = run_vramlens(binary, args) if "--nvml" in args else None
    if rec is not None:
        t = rec["trace"]
        if t["used"] != "used":
            failures.append(f"trace not used: {t['used']}")
        for d in t["devices"]:
            a = d.get("alignment")
            if a is None:
                continue
            print(f"device {d['device']}: metadata offset {a['metadata_offset_us']} us, "
                  f"clocks {a['residual_us']} us apart, {a['matched']} of "
                  f"{a['trace_allocations']} allocations matched")
            if a["trace_allocations"] and a["matched"] < 0.9 * a["trace_allocations"]:
                failures.append(f"only {a['matched']} of {a['trace_allocations']} matched")
    run_vramlens(binary, ["summary", os.path.join(out, "memory_timeline.raw.json.gz"), "--json"])
    return failures


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)
    start = time.time()
    r = subprocess.run([sys.executable, "-c", JOB, out], timeout=900)
    if r.returncode != 0:
        print(f"the job failed with exit {r.returncode}", file=sys.stderr)
        return 1
    info = versions()
    info["seconds"] = round(time.time() - start, 1)
    with open(os.path.join(out, "versions.json"), "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
    binary = os.environ.get("VRAMLENS")
    if not binary:
        print(f"recorded into {out}; set VRAMLENS=path/to/vramlens to check it")
        return 0
    failures = check(out, binary)
    for f in failures:
        print("FAILED:", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
