#!/usr/bin/env python3
"""Generate a large Kineto trace with memory events for benchmarks (standard library only).

    python3 scripts/bench_trace_gen.py --size-mb 500 -o bench-data/trace_500m.json

The file looks like `torch.profiler.profile(profile_memory=True, with_stack=True)` output
of PyTorch 2.5+ (`prof.export_chrome_trace()`): a top-level object with schemaVersion,
deviceProperties, traceEvents and baseTimeNanoseconds, one event per line as Kineto writes
them. Training steps repeat until the size is reached; each operator is a cpu_op span
(with External id, Record function id, Input Dims and Input type arguments) inside
python_function spans of its module and the training loop, with its cuda_runtime launch,
its kernel on a stream (with the kernel's launch arguments) and the flow events between
them; about half the operators allocate an output ([memory] event with Addr, Bytes, Total
Allocated, Total Reserved) and free an input later. Deterministic (random.Random(seed)).
"""

import argparse
import json
import os
import random

BASE_NS = 1749945600000000000
PID = 81234
TID = 81234


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=float, required=True, help="target size, 10^6 bytes")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    target = int(args.size_mb * 1e6)
    rng = random.Random(args.seed)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    ops = ["aten::linear", "aten::addmm", "aten::gelu", "aten::layer_norm", "aten::add",
           "aten::mul", "aten::softmax", "aten::bmm", "aten::dropout", "aten::view"]
    kernels = ["ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn",
               "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>",
               "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>",
               "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>"]
    py = ["train.py(88): <module>", "train.py(61): train_step",
          "torch/nn/modules/module.py(1747): _call_impl", "model.py(104): forward",
          "torch/nn/modules/module.py(1747): _call_impl", "model.py(88): forward"]
    written = 0
    t = 1_000_000.0          # µs after the base
    ev_idx = 0
    live = []                # (addr, size)
    allocated = 2 << 30      # memory from before profiling
    reserved = 6 << 30
    next_addr = 0x7F0000000000
    with open(args.output, "w") as f:
        head = ('{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {"id": 0, "name": '
                '"NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912}\n  ],\n'
                '  "profile_memory": 1,\n  "with_stack": 1,\n  "traceEvents": [\n')
        f.write(head)
        written += len(head)
        first = True

        def emit(ev):
            nonlocal written, first
            line = ("" if first else ",\n") + "  " + json.dumps(ev, separators=(", ", ": "))
            first = False
            f.write(line)
            written += len(line)

        step = 0
        while written < target:
            step += 1
            emit({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                  "pid": PID, "tid": TID, "ts": round(t, 3), "dur": 5000.0,
                  "args": {"External id": ev_idx, "Record function id": 0, "Ev Idx": ev_idx}})
            for depth, name in enumerate(py):
                emit({"ph": "X", "cat": "python_function", "name": name, "pid": PID,
                      "tid": TID, "ts": round(t + depth * 0.5, 3), "dur": 4990.0 - depth,
                      "args": {"Python parent id": depth, "Python id": depth + 1,
                               "Ev Idx": ev_idx}})
                ev_idx += 1
            for k in range(40):
                op = ops[rng.randrange(len(ops))]
                start = t + 10 + k * 120.0
                ev_idx += 1
                emit({"ph": "X", "cat": "cpu_op", "name": op, "pid": PID, "tid": TID,
                      "ts": round(start, 3), "dur": 80.0,
                      "args": {"External id": ev_idx, "Record function id": 0,
                               "Concrete Inputs": ["", "", ""],
                               "Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"],
                               "Input Strides": [[2048, 1], [2048, 1], [1]],
                               "Input Dims": [[4096, 2048], [2048, 2048], [2048]],
                               "Ev Idx": ev_idx}})
                emit({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                      "pid": PID, "tid": TID, "ts": round(start + 20, 3), "dur": 6.5,
                      "args": {"External id": ev_idx, "cbid": 211, "correlation": ev_idx}})
                emit({"ph": "X", "cat": "kernel", "name": kernels[k % len(kernels)], "pid": 0,
                      "tid": 7, "ts": round(start + 30, 3), "dur": 55.2,
                      "args": {"External id": ev_idx, "queued": 0, "device": 0, "context": 1,
                               "stream": 7, "correlation": ev_idx, "registers per thread": 168,
                               "shared memory": 73728, "blocks per SM": 1.2,
                               "warps per SM": 4.8, "grid": [16, 32, 1], "block": [256, 1, 1],
                               "est. achieved occupancy %": 6}})
                emit({"ph": "s", "id": ev_idx, "pid": PID, "tid": TID, "ts": round(start + 20, 3),
                      "cat": "ac2g", "name": "ac2g"})
                emit({"ph": "f", "id": ev_idx, "pid": 0, "tid": 7, "ts": round(start + 30, 3),
                      "cat": "ac2g", "name": "ac2g", "bp": "e"})
                if k % 2 == 0:
                    size = rng.choice([512, 8192, 1 << 20, 16 << 20, 32 << 20])
                    addr = next_addr
                    next_addr += max(size, 512)
                    allocated += size
                    if allocated > reserved:
                        reserved += 2 << 30
                    live.append((addr, size))
                    emit({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                          "pid": PID, "tid": TID, "ts": round(start + 5, 3),
                          "args": {"Total Reserved": reserved, "Total Allocated": allocated,
                                   "Bytes": size, "Addr": addr, "Device Id": 0,
                                   "Device Type": 1, "Ev Idx": ev_idx}})
                if k % 2 == 1 and len(live) > 8:
                    addr, size = live.pop(rng.randrange(len(live) - 4))
                    allocated -= size
                    emit({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                          "pid": PID, "tid": TID, "ts": round(start + 60, 3),
                          "args": {"Total Reserved": reserved, "Total Allocated": allocated,
                                   "Bytes": -size, "Addr": addr, "Device Id": 0,
                                   "Device Type": 1, "Ev Idx": ev_idx}})
            t += 6000.0
        tail = f'\n  ],\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": {BASE_NS}\n}}\n'
        f.write(tail)


if __name__ == "__main__":
    main()
