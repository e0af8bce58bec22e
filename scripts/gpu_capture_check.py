#!/usr/bin/env python3
"""The GPU check of the capture helper: small real recordings made on a CUDA machine.

Runs four short jobs, each in a fresh process (allocator settings apply at CUDA start),
under scripts/vramlens_capture.py, while nvidia-smi logs device and per-process memory:

  ok        a small MLP training loop, no OOM; final snapshot and NVML samples
  oom       the same, then an evaluation loop that keeps its autograd graphs alive (a
            classic leak) until the device runs out of memory
  oom_exp   the same leak with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  oom_cap   the same leak under torch.cuda.set_per_process_memory_fraction(0.05)

Usage: python3 scripts/gpu_capture_check.py OUTDIR   (about a minute on one H200)
Everything lands in OUTDIR/<job>/ plus OUTDIR/nvsmi_gpu.csv, OUTDIR/nvsmi_apps.csv and
OUTDIR/versions.json.
"""

import json
import os
import subprocess
import sys
import time

JOB = r'''
import os, sys, torch
sys.path.insert(0, os.environ["VRAMLENS_SCRIPTS"])
from vramlens_capture import capture

mode = sys.argv[1]
torch.manual_seed(0)
dev = "cuda"
if mode == "oom_cap":
    torch.cuda.set_per_process_memory_fraction(0.05)

def make_model(width, depth):
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).to(dev, torch.bfloat16)

def train(model, opt, batch, width, steps):
    for step in range(steps):
        x = torch.randn(batch, width, device=dev, dtype=torch.bfloat16)
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()

def leaky_eval(model, batch, width):
    kept = []
    while True:  # keeps every graph alive: grows until the device is full
        x = torch.randn(batch, width, device=dev, dtype=torch.bfloat16)
        kept.append(model(x).sum())

with capture(os.environ["VRAMLENS_OUT"], max_entries=20000, interval_ms=50):
    width = 4096
    model = make_model(width, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    train(model, opt, 8192, width, 5)
    if mode != "ok":
        leaky_eval(model, 16384, width)
'''


def main():
    out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "gpu-capture")
    os.makedirs(out, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    smi = []
    with open(os.path.join(out, "nvsmi_gpu.csv"), "w") as g, open(os.path.join(out, "nvsmi_apps.csv"), "w") as a:
        smi.append(subprocess.Popen(
            ["nvidia-smi", "--query-gpu=timestamp,index,uuid,memory.used,memory.total",
             "--format=csv", "-lms", "200"], stdout=g, stderr=subprocess.DEVNULL))
        smi.append(subprocess.Popen(
            ["nvidia-smi", "--query-compute-apps=timestamp,gpu_uuid,pid,used_memory",
             "--format=csv", "-lms", "200"], stdout=a, stderr=subprocess.DEVNULL))
        time.sleep(0.5)
        results = {}
        for mode in ["ok", "oom", "oom_exp", "oom_cap"]:
            env = dict(os.environ, VRAMLENS_OUT=os.path.join(out, mode), VRAMLENS_SCRIPTS=here,
                       PYTHONUNBUFFERED="1")
            if mode == "oom_exp":
                env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
            t = time.time()
            r = subprocess.run([sys.executable, "-c", JOB, mode], env=env, capture_output=True,
                               text=True, timeout=240)
            results[mode] = {"returncode": r.returncode, "seconds": round(time.time() - t, 1),
                             "stderr_tail": r.stderr[-3000:]}
            print(mode, r.returncode, results[mode]["seconds"], "s", flush=True)
            print(r.stderr[-1500:], flush=True)
            time.sleep(0.5)
        for p in smi:
            p.terminate()
            p.wait(timeout=5)
    import torch
    versions = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0),
        "total_memory_bytes": torch.cuda.get_device_properties(0).total_memory,
        "driver": subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True).stdout.strip(),
        "python": sys.version.split()[0],
        "jobs": results,
    }
    with open(os.path.join(out, "versions.json"), "w") as f:
        json.dump(versions, f, indent=1, sort_keys=True)
    print(json.dumps({k: v for k, v in versions.items() if k != "jobs"}))


if __name__ == "__main__":
    main()
