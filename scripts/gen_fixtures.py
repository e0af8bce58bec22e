#!/usr/bin/env python3
"""Generate the committed test fixtures under testdata/ (standard library only).

Run:  python3 scripts/gen_fixtures.py          (rewrites testdata/ in place)

Deterministic: no wall clock, every random choice comes from random.Random(seed);
running it twice yields byte-identical files.  For every good fixture it also writes
testdata/<file>.expected.json, computed by scripts/expected.py from the written file
(independent stdlib unpickling), without the "path" field.

All snapshots are produced by a tiny simulation of the CUDA caching allocator
(block rounding to 512 bytes, 2 MiB small-pool segments, 20 MiB / exact large-pool
segments, best-fit reuse, splitting, merging on free, empty_cache, OOM retry,
expandable segments with map/unmap), so segments, blocks and traces are mutually
consistent like real data.  Tracebacks are shared the way PyTorch shares them: one
dict per distinct frame, one list per distinct traceback, the same list object put in
every block / segment / trace entry that recorded it (pickle writes BINGET for the
repeats); blocks without a context share one empty list.

Which PyTorch release each good fixture imitates (layouts per
shared/spec/snapshot-format.md sections 1-5):

  sample.pickle            2.5  (protocol 4) README demo: one training step on device 0,
                                 stacks="all" (C++ + Python frames), ProfilerStep#0
                                 external_annotations, allocator_settings, 6 segments,
                                 all three block states, ~300 trace entries, one OOM.
  v1_13_list.pickle        1.13 (protocol 2) root is the bare segment list, blocks carry
                                 legacy `history` (most recent first), some without.
  v2_0_history.pickle      2.0  (protocol 4) segment requested_size, block history with
                                 cpp_frames on one record, traces without time_us,
                                 one trace entry with a cpp_frames string.
  v2_1.pickle              2.1  (protocol 4) segment_pool_id / is_expandable / frames,
                                 block address + frames, no time_us; one expandable
                                 segment (segment_map / segment_unmap) next to normal
                                 ones (segment_alloc / segment_free).
  v2_2.pickle              2.2  (protocol 4) adds time_us; the first entry has time_us 0.
  v2_3_settings.pickle     2.3  (protocol 4) allocator_settings with expandable
                                 segments and max_split_size_mb:128.
  v2_8_compile.pickle      2.8  (protocol 4) external_annotations + compile_context.
  v2_10_meta.pickle        2.10 (protocol 4) + user_metadata.
  v2_12_pool.pickle        2.12 (protocol 4) + forward_frames (2.11) + pool_id on trace
                                 entries, a private pool (1, 0), an active_pending_free.
  v2_14_host_p5.pickle     2.14 (PROTOCOL 5, Python 3.14 default) host_segments /
                                 host_traces, an `annotate` action, a trace stream
                                 18446720620317114368 (>= 2**63) and an orphan
                                 free_completed with addr 2**64-1 (re-interpreted -1).
  multi_device.pickle      2.6  (protocol 4) 3 device slots: devices 0 and 2 used,
                                 device 1 empty.
  unknown_keys.pickle      2.6  (protocol 4) unknown top-level / segment / block / trace
                                 keys and the nightly-only `user_defined` action.
  empty.pickle             2.3  (protocol 4) no segments, device_traces [[]].
  snapshot_gz.bin          2.4  gzip of a protocol-4 snapshot (name without .gz);
  snapshot_gz.pickle.gz         the same bytes.
  v2_5.json                2.5  the same structure as JSON (pool ids as arrays).
  cpp_pickler.pickle       2.6  written by our own imitation of PyTorch's C++
                                 torch::jit::Pickler (_memory_snapshot_pickled):
                                 PROTO 2, no FRAME, EMPTY_DICT MARK .. SETITEMS,
                                 EMPTY_LIST MARK .. APPENDS, strings memoised by value
                                 (BINUNICODE + BINPUT, BINGET later), shared containers
                                 BINPUT/BINGET, BININT1/BININT2/BININT/LONG1(8 bytes).
  protocol2.pickle         2.4  dumped with pickle protocol 2 (BINPUT, no FRAME).
  big_ints.pickle          2.9  XPU-like (torch.xpu.memory._dump_snapshot): addresses
                                 >= 2**63 (9-byte LONG1) and a segment stream >= 2**63.
  hostile_strings.pickle   2.10 (protocol 4) frame names, file names, allocator settings,
                                 an action name, annotations and metadata holding
                                 terminal escape sequences (ESC, OSC, C1 controls).

Bad fixtures (testdata/bad/, no expected files): see testdata/README.md.
"""

import argparse
import base64
import gzip
import io
import json
import os
import pickle
import pickletools
import random
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "testdata")
BAD = os.path.join(OUT, "bad")
sys.path.insert(0, HERE)
import expected  # noqa: E402  (scripts/expected.py)

KiB = 1024
MiB = 1024 * 1024
GiB = 1024 * MiB
MIN_BLOCK = 512
SMALL_SIZE = 1 * MiB          # kSmallSize: requests <= 1 MiB use the small pool
SMALL_BUFFER = 2 * MiB        # kSmallBuffer: small-pool segment size
LARGE_BUFFER = 20 * MiB       # kLargeBuffer: segment for 1 MiB < size < 10 MiB
MIN_LARGE_ALLOC = 10 * MiB    # kMinLargeAlloc
ROUND_LARGE = 2 * MiB         # kRoundLarge
BASE_ADDR = 0x7F3A00000000
T0 = 1750000000000000         # 2025-06-15 15:06:40 UTC in microseconds
COPY_STREAM = 0x55D4C0A3E2D0       # an opaque cudaStream_t of a side (copy) stream
XPU_STREAM = 18446720620317114368   # >= 2**63 (XPU queue pointer, PR #170645)
U64_MAX = 2 ** 64 - 1


def fresh(s):
    """A new str object equal to s (PyTorch >= 2.1 creates one py::str per frame)."""
    if len(s) <= 1:
        return s
    return "".join([s[:1], s[1:]])


def new_tuple(t):
    """A new tuple object (pool ids are fresh per dict; `tuple(t)` would return t itself)."""
    return tuple(list(t))


def align(n, a):
    return (n + a - 1) // a * a


# --------------------------------------------------------------------------------------
# Frames and tracebacks
# --------------------------------------------------------------------------------------

SITE = "/opt/conda/lib/python3.11/site-packages/torch"
TRAIN = "/home/alice/nanogpt/train.py"
MODEL = "/home/alice/nanogpt/model.py"
MODULE_PY = SITE + "/nn/modules/module.py"
LINEAR_PY = SITE + "/nn/modules/linear.py"
FUNCTIONAL_PY = SITE + "/nn/functional.py"
ADAMW_PY = SITE + "/optim/adamw.py"
OPTIMIZER_PY = SITE + "/optim/optimizer.py"

OUTER = [("train", TRAIN, 187), ("main", TRAIN, 240), ("<module>", TRAIN, 251)]
CALL = [("_call_impl", MODULE_PY, 1747), ("_wrapped_call_impl", MODULE_PY, 1736)]
GPT_FWD = [("forward", MODEL, 186)] + CALL
BLOCK_FWD = [("forward", MODEL, 104)] + CALL + GPT_FWD
ATTN_FWD = [("forward", MODEL, 71)] + CALL + BLOCK_FWD
MLP_FWD = [("forward", MODEL, 88)] + CALL + BLOCK_FWD

PY_STACKS = {
    "param_init": [("__init__", LINEAR_PY, 106), ("__init__", MODEL, 64),
                   ("__init__", MODEL, 121), ("build_model", TRAIN, 98),
                   ("main", TRAIN, 221), ("<module>", TRAIN, 251)],
    "embed_init": [("__init__", SITE + "/nn/modules/sparse.py", 167),
                   ("__init__", MODEL, 140), ("build_model", TRAIN, 98),
                   ("main", TRAIN, 221), ("<module>", TRAIN, 251)],
    "ln_init": [("__init__", SITE + "/nn/modules/normalization.py", 208),
                ("__init__", MODEL, 99), ("__init__", MODEL, 121),
                ("build_model", TRAIN, 98), ("main", TRAIN, 221), ("<module>", TRAIN, 251)],
    "batch": [("get_batch", TRAIN, 61)] + OUTER,
    "prefetch": [("prefetch", TRAIN, 75)] + OUTER,
    "embed": [("embedding", FUNCTIONAL_PY, 2551),
              ("forward", SITE + "/nn/modules/sparse.py", 190)] + CALL + GPT_FWD + OUTER,
    "ln": [("layer_norm", FUNCTIONAL_PY, 2910),
           ("forward", SITE + "/nn/modules/normalization.py", 217)] + CALL + BLOCK_FWD + OUTER,
    "qkv": [("forward", LINEAR_PY, 125)] + CALL + ATTN_FWD + OUTER,
    "sdpa": [("forward", MODEL, 78)] + CALL + BLOCK_FWD + OUTER,
    "attn_proj": [("forward", LINEAR_PY, 125)] + CALL + [("forward", MODEL, 80)] + CALL
                 + BLOCK_FWD + OUTER,
    "residual": [("forward", MODEL, 105)] + CALL + GPT_FWD + OUTER,
    "mlp_fc": [("forward", LINEAR_PY, 125)] + CALL + MLP_FWD + OUTER,
    "gelu": [("gelu", FUNCTIONAL_PY, 1702), ("forward", MODEL, 89)] + CALL + BLOCK_FWD + OUTER,
    "mlp_proj": [("forward", LINEAR_PY, 125)] + CALL + [("forward", MODEL, 90)] + CALL
                + BLOCK_FWD + OUTER,
    "lm_head": [("forward", LINEAR_PY, 125)] + CALL + [("forward", MODEL, 190)] + CALL + OUTER,
    "loss": [("cross_entropy", FUNCTIONAL_PY, 3494), ("forward", MODEL, 192)] + CALL + OUTER,
    "opt_state": [("_init_group", ADAMW_PY, 128), ("step", ADAMW_PY, 209),
                  ("_use_grad", OPTIMIZER_PY, 79), ("wrapper", OPTIMIZER_PY, 487),
                  ("train", TRAIN, 183), ("main", TRAIN, 240), ("<module>", TRAIN, 251)],
    "opt_tmp": [("_multi_tensor_adamw", ADAMW_PY, 612), ("adamw", ADAMW_PY, 784),
                ("step", ADAMW_PY, 220), ("_use_grad", OPTIMIZER_PY, 79),
                ("wrapper", OPTIMIZER_PY, 487), ("train", TRAIN, 183),
                ("main", TRAIN, 240), ("<module>", TRAIN, 251)],
    "empty_cache": [("empty_cache", SITE + "/cuda/memory.py", 192),
                    ("train", TRAIN, 189), ("main", TRAIN, 240), ("<module>", TRAIN, 251)],
    "eval_logits": [("forward", LINEAR_PY, 125)] + CALL + [("forward", MODEL, 190)] + CALL
                   + [("evaluate", TRAIN, 140), ("train", TRAIN, 195), ("main", TRAIN, 240),
                      ("<module>", TRAIN, 251)],
    "fx_graph": [("forward", "<eval_with_key>.3", 12), ("_call_impl", MODULE_PY, 1747),
                 ("__call__", SITE + "/fx/graph_module.py", 784)] + GPT_FWD + OUTER,
    "pinned": [("pin_memory", SITE + "/utils/data/_utils/pin_memory.py", 64),
               ("get_batch", TRAIN, 58)] + OUTER,
}

# Strings a file may carry that would drive a terminal if printed raw: CSI sequences (clear
# screen, cursor moves, hidden text), OSC 0 (window title), OSC 8 (hyperlink) and OSC 52
# (clipboard) ended by BEL or ST, their C1 forms (U+009B CSI, U+009D OSC, U+009C ST), CR,
# backspace, DEL, and U+E000 (the private-use character vramlens' style markers start with).
HOSTILE_NAME = "forward\x1b[2J\x1b[H\x1b]0;pwned\x07"
HOSTILE_FILE = "/home/eve/\x1b]8;;https://example.invalid/\x1b\\model\x1b]8;;\x1b\\.py"
HOSTILE_CONF = "expandable_segments:False\x1b[8m,\u009b31mhidden\r\x7f"
HOSTILE_ACTION = "alloc\x1b[1A\x1b[2K"
HOSTILE_ANNOTATION = "ProfilerStep#1\u009d0;title\u009c\x08"
HOSTILE_META = "phase=\x1b]52;c;Y2xpcGJvYXJk\x07\ue000"
PY_STACKS["hostile"] = [(HOSTILE_NAME, HOSTILE_FILE, 13)] + OUTER

CPP_MALLOC_PREFIX = [
    ("torch::unwind::unwind()", "??", 0),
    ("torch::CapturedTraceback::gather(bool, bool, bool)", "??", 0),
    ("torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp", 0),
    ("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc("
     "signed char, unsigned long, CUstream_st*)", "CUDACachingAllocator.cpp", 0),
    ("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc("
     "void**, signed char, unsigned long, CUstream_st*)", "", 0),
    ("at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, "
     "std::optional<c10::Device>, std::optional<c10::MemoryFormat>)", "??", 0),
]
CPP_PY_GLUE = [("_PyEval_EvalFrameDefault", "??", 0), ("_PyFunction_Vectorcall", "??", 0)]
CPP_MAIN_SUFFIX = [("Py_RunMain", "??", 0), ("Py_BytesMain", "??", 0),
                   ("__libc_start_main", "??", 0), ("_start", "??", 0)]
CPP_AUTOGRAD_THREAD = [
    ("at::native::zeros_like(at::Tensor const&, std::optional<c10::ScalarType>, "
     "std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, "
     "std::optional<c10::MemoryFormat>)", "??", 0),
    ("torch::autograd::InputBuffer::add(unsigned long, at::Tensor, "
     "std::optional<c10::Stream> const&, std::optional<c10::Stream> const&)",
     "input_buffer.cpp", 0),
    ("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, "
     "torch::autograd::Node*, torch::autograd::InputBuffer&, "
     "std::shared_ptr<torch::autograd::ReadyQueue> const&)", "engine.cpp", 0),
    ("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)",
     "engine.cpp", 0),
    ("torch::autograd::python::PythonEngine::thread_init(int, "
     "std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)", "python_engine.cpp", 0),
    ("start_thread", "??", 0),
    ("__clone3", "??", 0),
]

# Stacks of the category fixtures (make_categories): the user's own modules and optimizer,
# torch's AdamW, compiled code, a KV cache.
PROJ = "/home/alice/proj"
LAYERS_PY = PROJ + "/layers.py"            # the user's modules: __init__ and forward
MYOPT_PY = PROJ + "/my_optimizer.py"       # the user's optimizer: __init__ and step
LOOP = [("train_step", PROJ + "/train.py", 40), ("main", PROJ + "/train.py", 77)]
GEN_LOOP = [("generate", PROJ + "/generate.py", 31), ("main", PROJ + "/generate.py", 60)]
GENERATED = "/tmp/torchinductor_alice/q3/c" + "q3ffxmz7a4k2npw6hbs5d4jqy2uv7c3lrhkzt5mo6e2wxyz4abcd" + ".py"
GENERATED_BWD = "/tmp/torchinductor_alice/7w/c" + "7wz2k5n4hq3b6x2yr7dmc5fjk8upl3wt4bxe6zs2qv9ghno3xyz" + ".py"
RUNTIME_WRAPPERS = SITE + "/_functorch/_aot_autograd/runtime_wrappers.py"
BENCH_PY = PROJ + "/benchmark_attention.py"
BENCH_LOOP = [("benchmark_attention", BENCH_PY, 58), ("main", BENCH_PY, 95),
              ("<module>", BENCH_PY, 120)]
TRITON_TESTING_PY = "/opt/conda/lib/python3.11/site-packages/triton/testing.py"
PY_STACKS.update({
    "my_init": [("__init__", LAYERS_PY, 12), ("__init__", LAYERS_PY, 60),
                ("main", PROJ + "/train.py", 70)],
    "my_fwd": [("forward", LAYERS_PY, 20)] + CALL + [("forward", LAYERS_PY, 66)] + CALL + LOOP,
    "my_fwd_out": [("forward", LAYERS_PY, 21)] + CALL + [("forward", LAYERS_PY, 66)] + CALL
                  + LOOP,
    "my_loss": [("cross_entropy", FUNCTIONAL_PY, 3494), ("train_step", PROJ + "/train.py", 38),
                ("main", PROJ + "/train.py", 77)],
    "my_batch": [("get_batch", PROJ + "/data.py", 14)] + LOOP,
    "backward_call": [("_engine_run_backward", SITE + "/autograd/graph.py", 825),
                      ("backward", SITE + "/autograd/__init__.py", 347),
                      ("backward", SITE + "/_tensor.py", 581),
                      ("train_step", PROJ + "/train.py", 39), ("main", PROJ + "/train.py", 77)],
    "myopt_init": [("__init__", MYOPT_PY, 30), ("main", PROJ + "/train.py", 72)],
    "myopt_state": [("step", MYOPT_PY, 47), ("train_step", PROJ + "/train.py", 41),
                    ("main", PROJ + "/train.py", 77)],
    "myopt_tmp": [("step", MYOPT_PY, 45), ("train_step", PROJ + "/train.py", 41),
                  ("main", PROJ + "/train.py", 77)],
    "zero_grad": [("zero_grad", OPTIMIZER_PY, 955), ("train_step", PROJ + "/train.py", 36),
                  ("main", PROJ + "/train.py", 77)],
    "adam_state": [("_init_group", ADAMW_PY, 128), ("step", ADAMW_PY, 209),
                   ("_use_grad", OPTIMIZER_PY, 79), ("wrapper", OPTIMIZER_PY, 487),
                   ("train_step", PROJ + "/train.py", 41), ("main", PROJ + "/train.py", 77)],
    "adam_tmp": [("_multi_tensor_adamw", ADAMW_PY, 612), ("adamw", ADAMW_PY, 784),
                 ("step", ADAMW_PY, 220), ("_use_grad", OPTIMIZER_PY, 79),
                 ("wrapper", OPTIMIZER_PY, 487), ("train_step", PROJ + "/train.py", 41),
                 ("main", PROJ + "/train.py", 77)],
    "compiled_fwd": [("call", GENERATED, 120), ("__call__", SITE + "/_inductor/output_code.py", 460),
                     ("forward", RUNTIME_WRAPPERS, 1500), ("forward", LAYERS_PY, 66)] + CALL + LOOP,
    "compiled_bwd": [("call", GENERATED_BWD, 88),
                     ("call_compiled_backward", RUNTIME_WRAPPERS, 1810),
                     ("backward", RUNTIME_WRAPPERS, 1900),
                     ("apply", SITE + "/autograd/function.py", 307)],
    "dec_attn": [("forward", LAYERS_PY, 120)] + CALL + [("forward", LAYERS_PY, 140)] + CALL
                + GEN_LOOP,
    "kv_cat_k": [("forward", LAYERS_PY, 126)] + CALL + [("forward", LAYERS_PY, 140)] + CALL
                + GEN_LOOP,
    "kv_cat_v": [("forward", LAYERS_PY, 127)] + CALL + [("forward", LAYERS_PY, 140)] + CALL
                + GEN_LOOP,
    "dec_logits": [("forward", LAYERS_PY, 150)] + CALL + GEN_LOOP,
    # An attention benchmark: the script calls its own functions, no module anywhere.
    "bench_qkv": [("main", BENCH_PY, 88), ("<module>", BENCH_PY, 120)],
    "bench_scores": [("annotated_scaled_dot_product_attention", BENCH_PY, 31)] + BENCH_LOOP,
    "bench_weights": [("annotated_scaled_dot_product_attention", BENCH_PY, 33)] + BENCH_LOOP,
    "bench_out": [("annotated_scaled_dot_product_attention", BENCH_PY, 34)] + BENCH_LOOP,
    "bench_flush": [("do_bench", TRITON_TESTING_PY, 120), ("benchmark_attention", BENCH_PY, 62),
                    ("main", BENCH_PY, 95), ("<module>", BENCH_PY, 120)],
})

# C++-only stacks (the autograd engine's thread): a backward node's kernel output.
CPP_ENGINE = [
    ("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, "
     "torch::autograd::Node*, torch::autograd::InputBuffer&, "
     "std::shared_ptr<torch::autograd::ReadyQueue> const&)", "engine.cpp", 0),
    ("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)",
     "engine.cpp", 0),
    ("start_thread", "??", 0),
]
CPP_ONLY_STACKS = {
    "mm_backward": [("at::native::mm(at::Tensor const&, at::Tensor const&)", "??", 0),
                    ("torch::autograd::generated::MmBackward0::apply("
                     "std::vector<at::Tensor, std::allocator<at::Tensor> >&&)", "??", 0)]
                   + CPP_ENGINE,
    "mul_backward": [("at::native::mul(at::Tensor const&, at::Tensor const&)", "??", 0),
                     ("torch::autograd::generated::MulBackward0::apply("
                      "std::vector<at::Tensor, std::allocator<at::Tensor> >&&)", "??", 0)]
                    + CPP_ENGINE,
}

FWD_TRACE = (
    '  File "/home/alice/nanogpt/train.py", line 178, in train\n'
    '    logits, loss = model(x, y)\n',
    '  File "/home/alice/nanogpt/model.py", line 89, in forward\n'
    '    x = F.gelu(self.c_fc(x))\n',
)


class Frames:
    """One dict per distinct frame, one list per distinct traceback (shared objects)."""

    def __init__(self, legacy=False, cpp=False):
        self.legacy = legacy      # 1.13 / 2.0: filename,name,line order, shared strings
        self.cpp = cpp            # stacks="all": interleave C++ frames
        self._frames = {}
        self._tbs = {}
        self._strs = {}
        self.empty = []           # the shared empty frames list

    def _s(self, s):
        if s not in self._strs:
            self._strs[s] = fresh(s)
        return self._strs[s]

    def frame(self, name, filename, line):
        key = (name, filename, line)
        f = self._frames.get(key)
        if f is None:
            if self.legacy:
                f = {"filename": self._s(filename), "name": self._s(name), "line": line}
            else:
                f = {"name": fresh(name), "filename": fresh(filename), "line": line}
            self._frames[key] = f
        return f

    def tb(self, ctx):
        """The shared traceback list for a named context."""
        if ctx is None:
            return None
        t = self._tbs.get(ctx)
        if t is not None:
            return t
        if ctx == "autograd_thread":
            spec = list(CPP_MALLOC_PREFIX) + CPP_AUTOGRAD_THREAD if self.cpp else []
        elif ctx in CPP_ONLY_STACKS:
            spec = list(CPP_MALLOC_PREFIX) + CPP_ONLY_STACKS[ctx] if self.cpp else []
        else:
            py = PY_STACKS[ctx]
            if self.cpp:
                spec = list(CPP_MALLOC_PREFIX)
                for fr in py:
                    spec.append(fr)
                    spec.extend(CPP_PY_GLUE)
                spec.extend(CPP_MAIN_SUFFIX)
            else:
                spec = list(py)
        t = [self.frame(*fr) for fr in spec]
        self._tbs[ctx] = t
        return t


class Clock:
    def __init__(self, rng, t0=T0):
        self.rng = rng
        self.t = t0

    def tick(self, lo=2, hi=180):
        self.t += self.rng.randint(lo, hi)
        return self.t


# --------------------------------------------------------------------------------------
# Allocator simulation
# --------------------------------------------------------------------------------------

class Blk:
    __slots__ = ("addr", "size", "state", "req", "tb", "hist", "fwd")

    def __init__(self, addr, size):
        self.addr = addr
        self.size = size
        self.state = "inactive"
        self.req = 0
        self.tb = None
        self.hist = []      # legacy history records (addr, real_size, tb, cpp), newest first
        self.fwd = None


class Seg:
    def __init__(self, device, addr, size, kind, stream, pool, expandable, tb):
        self.device = device
        self.addr = addr
        self.kind = kind            # "large" | "small"
        self.stream = stream
        self.pool = pool
        self.expandable = expandable
        self.tb = tb
        self.fwd = None
        self.blocks = [Blk(addr, size)] if size else []

    @property
    def total(self):
        return sum(b.size for b in self.blocks)


class Sim:
    def __init__(self, device, clock, frames, base=BASE_ADDR, rng=None):
        self.device = device
        self.clock = clock
        self.frames = frames
        self.va = base
        self.rng = rng or random.Random(device)
        self.segments = []
        self.trace = []
        self.live = {}          # addr -> Blk (active_allocated or active_pending_free)
        self.ctx = {}           # extra per-entry fields (compile_context, user_metadata, ...)

    # -- helpers ---------------------------------------------------------------------
    def _new_va(self, size):
        addr = self.va
        self.va += align(size, ROUND_LARGE) + ROUND_LARGE * self.rng.randint(0, 3)
        return addr

    def record(self, action, addr, size, stream, tb, device_free=None, pool=(0, 0), **kw):
        e = {"action": action, "size": size, "stream": stream, "time": self.clock.tick(),
             "tb": tb, "pool": pool}
        if action == "oom":
            e["device_free"] = device_free
        else:
            e["addr"] = addr
        e.update(self.ctx)
        e.update(kw)
        self.trace.append(e)
        return e

    def _find(self, addr):
        for s in self.segments:
            for i, b in enumerate(s.blocks):
                if b.addr == addr:
                    return s, i
        raise KeyError(hex(addr))

    # -- malloc ----------------------------------------------------------------------
    def malloc(self, req, ctx, stream=0, pool=(0, 0), expandable=False, fwd=False, cpp=None):
        tb = self.frames.tb(ctx)
        rounded = max(MIN_BLOCK, align(req, MIN_BLOCK))
        small = rounded <= SMALL_SIZE
        kind = "small" if small else "large"
        best = None
        for s in self.segments:
            if (s.kind, s.stream, s.pool, s.expandable) != (kind, stream, pool, expandable):
                continue
            for b in s.blocks:
                if b.state == "inactive" and b.size >= rounded:
                    if best is None or (b.size, b.addr) < (best[1].size, best[1].addr):
                        best = (s, b)
        if best is None:
            if expandable:
                best = self._grow_expandable(kind, rounded, stream, pool, tb)
            else:
                if small:
                    seg_size = SMALL_BUFFER
                elif rounded < MIN_LARGE_ALLOC:
                    seg_size = LARGE_BUFFER
                else:
                    seg_size = align(rounded, ROUND_LARGE)
                seg = Seg(self.device, self._new_va(seg_size), seg_size, kind, stream, pool,
                          False, tb)
                if fwd:
                    seg.fwd = FWD_TRACE
                self.segments.append(seg)
                self.record("segment_alloc", seg.addr, seg_size, stream, tb, pool=pool)
                best = (seg, seg.blocks[0])
        seg, b = best
        remaining = b.size - rounded
        if (small and remaining >= MIN_BLOCK) or (not small and remaining > SMALL_SIZE):
            rest = Blk(b.addr + rounded, remaining)
            seg.blocks.insert(seg.blocks.index(b) + 1, rest)
            b.size = rounded
        b.state = "active_allocated"
        b.req = req
        b.tb = tb
        b.fwd = FWD_TRACE if fwd else None
        if tb is not None:
            b.hist = [(b.addr, req, tb, cpp)] + b.hist[:2]
        else:
            b.hist = []     # keep "no history" unambiguous (real 1.13 would keep stale ones)
        self.live[b.addr] = b
        self.record("alloc", b.addr, req, stream, tb, pool=pool,
                    **({"fwd": FWD_TRACE} if fwd else {}), **({"cpp": cpp} if cpp else {}))
        return b.addr

    def _grow_expandable(self, kind, rounded, stream, pool, tb):
        page = SMALL_BUFFER if kind == "small" else LARGE_BUFFER
        seg = None
        for s in self.segments:
            if (s.kind, s.stream, s.pool, s.expandable) == (kind, stream, pool, True):
                seg = s
        if seg is None:
            seg = Seg(self.device, self._new_va(64 * GiB // 1024), 0, kind, stream, pool,
                      True, tb)
            self.va = seg.addr + 64 * GiB   # VA reservation of the expandable segment
            self.segments.append(seg)
        tail = seg.blocks[-1] if seg.blocks and seg.blocks[-1].state == "inactive" else None
        have = tail.size if tail else 0
        map_size = align(rounded - have, page)
        start = seg.addr + seg.total
        self.record("segment_map", start, map_size, stream, tb, pool=pool)
        if tail:
            tail.size += map_size
        else:
            tail = Blk(start, map_size)
            seg.blocks.append(tail)
        return seg, tail

    # -- free ------------------------------------------------------------------------
    def free(self, addr, pending=False, ctx=None):
        """Frees a block; its free entries carry the allocation's stack, or `ctx`'s."""
        b = self.live[addr]
        seg, _ = self._find(addr)
        tb = self.frames.tb(ctx) if ctx else b.tb
        self.record("free_requested", addr, b.req, seg.stream, tb, pool=seg.pool)
        if pending:
            b.state = "active_pending_free"
        else:
            self._free_block(seg, b, tb)

    def start_recording(self):
        """Drops what was recorded so far, as a `_record_memory_history` call made now
        would: the trace restarts, and the blocks alive hold no frames."""
        self.trace.clear()
        for seg in self.segments:
            seg.tb = None
            for b in seg.blocks:
                b.tb = None
                b.hist = []

    def complete(self, addr, ctx=None):
        """Delayed free_completed (record_stream); ctx = the malloc that processed events."""
        b = self.live[addr]
        assert b.state == "active_pending_free"
        seg, _ = self._find(addr)
        self._free_block(seg, b, self.frames.tb(ctx) if ctx else b.tb)

    def _free_block(self, seg, b, tb):
        self.record("free_completed", b.addr, b.req, seg.stream, tb, pool=seg.pool)
        del self.live[b.addr]
        b.state = "inactive"
        b.tb = None
        b.fwd = None
        i = seg.blocks.index(b)
        if i + 1 < len(seg.blocks) and seg.blocks[i + 1].state == "inactive":
            nxt = seg.blocks.pop(i + 1)
            b.size += nxt.size
            b.hist = b.hist + nxt.hist
        if i > 0 and seg.blocks[i - 1].state == "inactive":
            prv = seg.blocks.pop(i - 1)
            b.addr = prv.addr
            b.size += prv.size
            b.hist = b.hist + prv.hist

    # -- cache release / oom / snapshot ----------------------------------------------
    def empty_cache(self, ctx=None):
        """release_cached_blocks: the large pool, then the small one; in each, whole free
        segments in (stream, size, address) order, then the free tails of expandable
        segments unmapped."""
        tbc = self.frames.tb(ctx) if ctx else None
        for kind in ("large", "small"):
            plain = sorted((s for s in self.segments if s.kind == kind and not s.expandable),
                           key=lambda s: (s.stream, s.total, s.addr))
            for seg in plain:
                if len(seg.blocks) == 1 and seg.blocks[0].state == "inactive":
                    self.record("segment_free", seg.addr, seg.total, seg.stream,
                                tbc if tbc is not None else seg.tb, pool=seg.pool)
                    self.segments.remove(seg)
            for seg in [s for s in self.segments if s.kind == kind and s.expandable]:
                page = SMALL_BUFFER if seg.kind == "small" else LARGE_BUFFER
                tail = seg.blocks[-1] if seg.blocks else None
                if tail is None or tail.state != "inactive":
                    continue
                start = align(tail.addr - seg.addr, page) + seg.addr
                end = seg.addr + seg.total
                if end - start <= 0:
                    continue
                self.record("segment_unmap", start, end - start, seg.stream,
                            tbc if tbc is not None else seg.tb, pool=seg.pool)
                tail.size -= end - start
                if tail.size == 0:
                    seg.blocks.pop()
                if not seg.blocks:
                    self.segments.remove(seg)

    def oom(self, req, ctx, device_free, stream=0):
        # malloc retry: release every fully free cached segment with the malloc's stack
        self.empty_cache(ctx)
        rounded = max(MIN_BLOCK, align(req, MIN_BLOCK))   # round_size(): params.size()
        self.record("oom", None, rounded, stream, self.frames.tb(ctx), device_free=device_free)

    def active_bytes(self):
        return sum(b.size for s in self.segments for b in s.blocks
                   if b.state.startswith("active_"))

    def snapshot_marker(self):
        self.record("snapshot", 0, self.active_bytes(), 0, None)

    def sorted_segments(self):
        return sorted(self.segments, key=lambda s: s.addr)


# --------------------------------------------------------------------------------------
# Serialisation per release
# --------------------------------------------------------------------------------------

def seg_dict(seg, V, frames):
    blocks = [block_dict(b, V, frames) for b in seg.blocks]
    alloc = sum(b.size for b in seg.blocks if b.state == "active_allocated")
    active = sum(b.size for b in seg.blocks if b.state.startswith("active_"))
    req = sum(b.req for b in seg.blocks if b.state.startswith("active_"))
    d = {"device": seg.device, "address": seg.addr, "total_size": seg.total,
         "allocated_size": alloc, "active_size": active}
    if V >= (2, 0):
        d["requested_size"] = req
    d["stream"] = seg.stream
    d["segment_type"] = seg.kind
    if V >= (2, 1):
        d["segment_pool_id"] = new_tuple(seg.pool)
        d["is_expandable"] = seg.expandable
    d["blocks"] = blocks
    if V >= (2, 1):
        d["frames"] = seg.tb if seg.tb is not None else frames.empty
        if V >= (2, 11) and seg.fwd:
            d["forward_frames"] = list(seg.fwd)
    return d


def block_dict(b, V, frames):
    if V >= (2, 1):
        d = {"address": b.addr, "size": b.size, "requested_size": b.req, "state": b.state,
             "frames": b.tb if b.tb is not None else frames.empty}
        if V >= (2, 11) and b.fwd:
            d["forward_frames"] = list(b.fwd)
        return d
    d = {"size": b.size}
    if V >= (2, 0):
        d["requested_size"] = b.req
    d["state"] = b.state
    if b.hist:
        hist = []
        for (addr, real, tb, cpp) in b.hist:
            h = {"addr": addr, "real_size": real}
            if tb is not None:
                h["frames"] = tb
            if cpp and V >= (2, 0):
                h["cpp_frames"] = cpp
            hist.append(h)
        d["history"] = hist
    return d


def entry_dict(e, V):
    d = {"action": e["action"]}
    if e["action"] == "oom":
        d["device_free"] = e["device_free"]
    else:
        d["addr"] = e["addr"]
    d["size"] = e["size"]
    d["stream"] = e["stream"]
    if V >= (2, 2):
        d["time_us"] = e.get("time_override", e["time"])
    if V >= (2, 8):
        d["compile_context"] = fresh(e.get("compile_context", "N/A"))
    if V >= (2, 10):
        d["user_metadata"] = fresh(e.get("user_metadata", ""))
    if V >= (2, 12):
        d["pool_id"] = new_tuple(e["pool"])
    if e["tb"] is not None and e["action"] != "snapshot":
        d["frames"] = e["tb"]
    if V >= (2, 11) and e.get("fwd"):
        d["forward_frames"] = list(e["fwd"])
    if V == (2, 0) and e.get("cpp"):
        d["cpp_frames"] = e["cpp"]
    for k, v in e.get("unknown", {}).items():
        d[k] = v
    return d


def allocator_settings(V, conf="", max_split=-1, gc=0.0, expandable=False):
    d = {"PYTORCH_CUDA_ALLOC_CONF": conf, "max_split_size": max_split,
         "garbage_collection_threshold": gc, "expandable_segments": expandable,
         "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
         "pinned_use_cuda_host_register": False}
    if V >= (2, 9):
        d["graph_capture_record_stream_reuse"] = False
    d["roundup_power2_divisions"] = {str(1 << i): 0 for i in range(16)}
    if V >= (2, 13):
        # pinned host allocator settings (values are plausible defaults, not verified)
        d["max_round_threshold"] = 0
        d["max_cached_size"] = -1
    return d


def annotation(clock, name, stage, device=0):
    return {"stage": fresh(stage), "name": fresh(name), "device": device,
            "time_us": clock.tick()}


def build(V, sims, frames, device_count, annotations=None, settings=None):
    """Top-level dict of release V from per-device sims (dict device -> Sim)."""
    segments = []
    for d in sorted(sims):
        segments.extend(seg_dict(s, V, frames) for s in sims[d].sorted_segments())
    if V < (2, 0):
        return segments
    traces = []
    for d in range(device_count):
        traces.append([entry_dict(e, V) for e in sims[d].trace] if d in sims else [])
    snap = {"segments": segments, "device_traces": traces}
    if V >= (2, 3):
        snap["allocator_settings"] = settings if settings is not None else allocator_settings(V)
    if V >= (2, 5):
        snap["external_annotations"] = annotations if annotations is not None else []
    if V >= (2, 14):
        snap["host_segments"] = []
        snap["host_traces"] = []
    return snap


# --------------------------------------------------------------------------------------
# Scenarios
# --------------------------------------------------------------------------------------

N_EMBD = 768
VOCAB = 50304
B, T = 4, 256


def model_init(sim, n_layer=2, ctx_extra=None):
    """Parameters of a small GPT (fp16). Returns list of (addr, size)."""
    params = []
    params.append(sim.malloc(VOCAB * N_EMBD * 2, "embed_init"))     # wte, 73.7 MiB
    params.append(sim.malloc(1024 * N_EMBD * 2, "embed_init"))      # wpe, 1.5 MiB
    for _ in range(n_layer):
        params.append(sim.malloc(N_EMBD * 2, "ln_init"))
        params.append(sim.malloc(N_EMBD * 2, "ln_init"))
        params.append(sim.malloc(3 * N_EMBD * N_EMBD * 2, "param_init"))   # c_attn
        params.append(sim.malloc(3 * N_EMBD * 2, "param_init"))
        params.append(sim.malloc(N_EMBD * N_EMBD * 2, "param_init"))       # c_proj
        params.append(sim.malloc(N_EMBD * 2, "param_init"))
        params.append(sim.malloc(4 * N_EMBD * N_EMBD * 2, "param_init"))   # c_fc
        params.append(sim.malloc(4 * N_EMBD * 2, "param_init"))
        params.append(sim.malloc(4 * N_EMBD * N_EMBD * 2, "param_init"))   # mlp c_proj
        params.append(sim.malloc(N_EMBD * 2, "param_init"))
    return params


def forward(sim, n_layer=2, keep=True):
    """Activations of one forward pass; returns addresses saved for backward."""
    act = B * T * N_EMBD * 2
    saved = []
    saved.append(sim.malloc(act, "embed"))
    for _ in range(n_layer):
        ln1 = sim.malloc(act, "ln")
        stats = sim.malloc(B * T * 4 * 2, "ln")                   # mean / rstd
        qkv = sim.malloc(3 * act, "qkv")
        att = sim.malloc(act, "sdpa")
        lse = sim.malloc(B * 12 * T * 4, "sdpa")
        proj = sim.malloc(act, "attn_proj")
        res1 = sim.malloc(act, "residual")
        ln2 = sim.malloc(act, "ln")
        fc = sim.malloc(4 * act, "mlp_fc")
        gelu = sim.malloc(4 * act, "gelu")
        out = sim.malloc(act, "mlp_proj")
        sim.free(proj)
        res2 = sim.malloc(act, "residual")
        sim.free(out)
        saved += [ln1, stats, qkv, att, lse, res1, ln2, fc, gelu, res2]
    return saved


def backward(sim, saved, params, param_sizes):
    grads = []
    for addr, size in reversed(list(zip(params, param_sizes))):
        tmp = sim.malloc(min(size, B * T * N_EMBD * 2) + 1000, "autograd_thread")
        grads.append(sim.malloc(size, "autograd_thread"))
        sim.free(tmp)
        if saved:
            sim.free(saved.pop())
    while saved:
        sim.free(saved.pop())
    return grads


def make_sample():
    """PyTorch 2.5, device 0, one training step with stacks="all"."""
    V = (2, 5)
    rng = random.Random(20250615)
    clock = Clock(rng)
    frames = Frames(cpp=True)
    sim = Sim(0, clock, frames, rng=rng)
    ann = []
    params = model_init(sim, n_layer=2)
    sizes = [sim.live[a].req for a in params]
    sim.snapshot_marker()
    # ---- ProfilerStep#0: forward, loss, backward, SGD (foreach) step, zero_grad ----
    ann.append(annotation(clock, "ProfilerStep#0", "START"))
    x = sim.malloc(B * T * 8, "batch")
    y = sim.malloc(B * T * 8, "batch")
    nxt = sim.malloc(B * T * 8, "prefetch", stream=COPY_STREAM)
    saved = forward(sim, n_layer=2)
    logits = sim.malloc(B * T * VOCAB * 2, "lm_head")
    loss_tmp = sim.malloc(B * T * VOCAB * 4, "loss")
    loss = sim.malloc(4, "loss")
    sim.free(loss_tmp)
    sim.free(nxt, pending=True)          # used on the main stream too (record_stream)
    grads = backward(sim, saved + [logits], params, sizes)
    sim.complete(nxt, ctx="opt_tmp")     # events processed inside a later malloc
    for _ in range(2):
        tmps = [sim.malloc(s, "opt_tmp") for s in sizes[2:10]]
        for t in tmps:
            sim.free(t)
    for g in grads:                      # optimizer.zero_grad(set_to_none=True)
        sim.free(g)
    sim.free(loss)
    sim.free(x)
    sim.free(y)
    ann.append(annotation(clock, "ProfilerStep#0", "END"))
    sim.empty_cache("empty_cache")       # segment_free of the fully free segments
    # ---- evaluation: next batch prefetched, OOM on a huge logits tensor ----
    x2 = sim.malloc(B * T * 8, "batch")
    EB = 4 * B                            # evaluation batch
    h = [sim.malloc(EB * T * N_EMBD * 2, "embed")]
    h.append(sim.malloc(3 * EB * T * N_EMBD * 2, "qkv"))
    h.append(sim.malloc(EB * T * N_EMBD * 2, "sdpa"))
    sim.free(h[1])                        # its 18 MiB segment is released by the OOM retry
    h.append(sim.malloc(EB * T * 4 * 2, "ln"))
    sim.oom(16 * EB * T * VOCAB * 2 + 100, "eval_logits", device_free=1288699904)
    sim.free(h[3])                        # exception unwinding
    sim.free(x2)
    # After the OOM (whose retry would have completed any pending free): the next batch
    # prefetched on the copy stream, freed, still waiting for its event at dump time.
    pend = sim.malloc(B * T * 8, "prefetch", stream=COPY_STREAM)
    sim.free(pend, pending=True)
    settings = allocator_settings(V)
    return build(V, {0: sim}, frames, 1, annotations=ann, settings=settings)


def small_scenario(sim, layers=1, with_oom=False, pool=(0, 0), prefix_snapshot=True):
    """A compact training-ish sequence used by the per-release fixtures.

    Sizes are jittered with the sim's seeded rng so every fixture has its own figures.
    """
    j = sim.rng.randint
    params = []
    params.append(sim.malloc(2 * MiB + 512 * j(1, 400) + j(0, 511), "embed_init", pool=pool))
    params.append(sim.malloc(N_EMBD * 2, "ln_init", pool=pool))
    for _ in range(layers):
        params.append(sim.malloc(3 * N_EMBD * N_EMBD * 2 + 512 * j(0, 64), "param_init", pool=pool))
        params.append(sim.malloc(3 * N_EMBD * 2 + j(0, 700), "param_init", pool=pool))
    if prefix_snapshot:
        sim.snapshot_marker()
    acts = []
    for i in range(layers * 3):
        acts.append(sim.malloc(B * T * N_EMBD * 2 + j(0, 9000), "qkv", pool=pool))
        acts.append(sim.malloc(B * T * 4 + j(0, 3000), "ln", pool=pool))
    tmp = sim.malloc(11 * MiB + j(1, 3 * MiB), "lm_head", pool=pool)
    sim.free(tmp)
    for a in acts[::2]:
        sim.free(a)
    if with_oom:
        sim.oom(30 * GiB + j(1, 10 ** 6), "eval_logits",
                device_free=2 * GiB + 512 * j(0, 10 ** 6))
    return params, acts


def make_v1_13():
    V = (1, 13)
    rng = random.Random(113)
    clock = Clock(rng)
    frames = Frames(legacy=True)
    sim = Sim(0, clock, frames, base=0x7F3A00000000, rng=rng)
    small_scenario(sim, layers=2)
    # allocations without a context -> blocks without history
    a = sim.malloc(4096, None)
    sim.malloc(3 * MiB, None)
    sim.free(a)
    return build(V, {0: sim}, frames, 1)


def make_v2_0():
    V = (2, 0)
    rng = random.Random(200)
    clock = Clock(rng)
    frames = Frames(legacy=True)
    sim = Sim(0, clock, frames, rng=rng)
    small_scenario(sim, layers=1)
    cpp = ("frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x6b "
           "(0x7f3c1a2b3c4d in /opt/conda/lib/python3.10/site-packages/torch/lib/libc10.so)\n"
           "frame #1: c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"
           "(int, unsigned long, CUstream_st*) + 0x1f2 (0x7f3c1a2b4000 in "
           "/opt/conda/lib/python3.10/site-packages/torch/lib/libc10_cuda.so)\n")
    sim.malloc(5000, "opt_state", cpp=cpp)
    sim.malloc(2048, None)
    sim.snapshot_marker()
    return build(V, {0: sim}, frames, 1)


def make_v2_1():
    V = (2, 1)
    rng = random.Random(210)
    clock = Clock(rng)
    frames = Frames()
    sim = Sim(0, clock, frames, rng=rng)
    small_scenario(sim, layers=1)
    sim.empty_cache("empty_cache")
    # expandable_segments toggled on at runtime: one expandable large segment
    e1 = sim.malloc(30 * MiB + 1, "mlp_fc", expandable=True)
    e2 = sim.malloc(12 * MiB, "gelu", expandable=True)
    e3 = sim.malloc(25 * MiB, "mlp_proj", expandable=True)
    sim.free(e3)
    sim.free(e2)
    sim.empty_cache("empty_cache")      # segment_unmap of the free tail
    sim.malloc(3 * MiB, "residual", expandable=True)
    sim.snapshot_marker()
    del e1
    return build(V, {0: sim}, frames, 1)


def make_v2_2(clock_seed=220):
    V = (2, 2)
    rng = random.Random(clock_seed)
    clock = Clock(rng)
    frames = Frames()
    sim = Sim(0, clock, frames, rng=rng)
    small_scenario(sim, layers=2)
    sim.trace[0]["time_override"] = 0   # raw clock before the converter's calibration
    return V, sim, frames


def make_v2_3():
    V = (2, 3)
    rng = random.Random(230)
    clock = Clock(rng)
    frames = Frames(cpp=True)
    sim = Sim(0, clock, frames, rng=rng)
    a = sim.malloc(6 * MiB + 100, "qkv", expandable=True)
    b = sim.malloc(200 * 1024, "ln", expandable=True)
    c = sim.malloc(40 * MiB + 512, "mlp_fc", expandable=True)
    d = sim.malloc(300 * 1024, "ln", expandable=True)
    sim.free(b)
    sim.free(c)
    sim.empty_cache("empty_cache")
    sim.malloc(9 * MiB, "gelu", expandable=True)
    sim.snapshot_marker()
    del a, d
    settings = allocator_settings(V, conf="expandable_segments:True,max_split_size_mb:128",
                                  max_split=134217728, gc=0.6, expandable=True)
    return build(V, {0: sim}, frames, 1, settings=settings)


def make_v2_8():
    V = (2, 8)
    rng = random.Random(280)
    clock = Clock(rng)
    frames = Frames()
    sim = Sim(0, clock, frames, rng=rng)
    ann = [annotation(clock, "ProfilerStep#3", "START")]
    small_scenario(sim, layers=1)
    sim.ctx = {"compile_context": "Torch-Compiled Region: 0/0"}
    t = [sim.malloc(B * T * N_EMBD * 2, "fx_graph") for _ in range(3)]
    for a in t[:2]:
        sim.free(a)
    sim.ctx = {}
    ann.append(annotation(clock, "ProfilerStep#3", "END"))
    ann.append(annotation(clock, "Optimizer.zero_grad#AdamW.zero_grad", "START"))
    ann.append(annotation(clock, "Optimizer.zero_grad#AdamW.zero_grad", "END"))
    return build(V, {0: sim}, frames, 1, annotations=ann)


def make_v2_10():
    V = (2, 10)
    rng = random.Random(2100)
    clock = Clock(rng)
    frames = Frames(cpp=True)
    sim = Sim(0, clock, frames, rng=rng)
    sim.ctx = {"user_metadata": "phase=init"}
    small_scenario(sim, layers=1, with_oom=True)
    sim.ctx = {"user_metadata": "phase=eval;step=7", "compile_context": "N/A"}
    a = sim.malloc(B * T * N_EMBD * 2, "embed")
    sim.ctx = {}
    sim.free(a)
    ann = [annotation(clock, "ProfilerStep#7", "START"), annotation(clock, "ProfilerStep#7", "END")]
    return build(V, {0: sim}, frames, 2, annotations=ann)


def make_v2_12():
    V = (2, 12)
    rng = random.Random(2120)
    clock = Clock(rng)
    frames = Frames()
    sim = Sim(0, clock, frames, rng=rng)
    small_scenario(sim, layers=1)
    # anomaly-mode backward: forward_frames on a few entries / blocks / one segment
    g1 = sim.malloc(24 * MiB + 1, "autograd_thread", fwd=True)   # new segment
    g2 = sim.malloc(1536, "autograd_thread", fwd=True)
    sim.free(g2)
    # CUDA-graph private pool (1, 0)
    p1 = sim.malloc(B * T * N_EMBD * 2, "qkv", pool=(1, 0))
    p2 = sim.malloc(B * T * N_EMBD * 2, "sdpa", pool=(1, 0))
    sim.malloc(4096, "ln", pool=(1, 0))
    sim.free(p1)
    sim.free(p2, pending=True)
    sim.snapshot_marker()
    del g1
    return build(V, {0: sim}, frames, 1)


def host_segment(frames, clock):
    """Pinned host memory (2.14+): one segment per host block, never split."""
    tb = frames.tb("pinned")
    addr = 0x7F3B5C000000
    size = 2 * MiB
    freed = addr + 3 * size
    fsize = 1 * MiB
    segs = [
        {"device": -1, "address": addr, "total_size": size, "allocated_size": size,
         "active_size": size, "requested_size": size, "stream": 0, "segment_type": "small",
         "segment_pool_id": new_tuple((0, 0)), "is_expandable": False,
         "blocks": [{"address": addr, "size": size, "requested_size": size,
                     "state": "active_allocated", "frames": tb}],
         "frames": tb},
        {"device": -1, "address": freed, "total_size": fsize, "allocated_size": 0,
         "active_size": 0, "requested_size": fsize, "stream": 0, "segment_type": "small",
         "segment_pool_id": new_tuple((0, 0)), "is_expandable": False,
         "blocks": [{"address": freed, "size": fsize, "requested_size": fsize,
                     "state": "inactive", "frames": frames.empty}],
         "frames": tb},
    ]
    traces = []
    for action, a, s in (("alloc", addr, size), ("alloc", freed, fsize),
                         ("free_requested", freed, fsize), ("free_completed", freed, fsize)):
        traces.append({"action": action, "addr": a, "size": s, "stream": 0,
                       "time_us": clock.tick(), "compile_context": fresh("N/A"),
                       "user_metadata": "", "pool_id": new_tuple((0, 0)), "frames": tb})
    return segs, traces


def make_v2_14():
    V = (2, 14)
    rng = random.Random(2140)
    clock = Clock(rng)
    frames = Frames(cpp=True)
    sim = Sim(0, clock, frames, rng=rng)
    # ring buffer wrapped: orphan free of a "-1" address re-interpreted as UINT64_MAX
    sim.record("free_completed", U64_MAX, 512, 0, frames.tb("opt_tmp"))
    small_scenario(sim, layers=1)
    a = sim.malloc(B * T * N_EMBD * 2, "mlp_fc", stream=XPU_STREAM)
    sim.record("annotate", a, sim.live[a].req, XPU_STREAM, frames.tb("mlp_fc"),
               user_metadata="activation:mlp.c_fc")
    b = sim.malloc(3000, "ln", stream=XPU_STREAM)
    sim.free(b)
    sim.snapshot_marker()
    ann = [annotation(clock, "ProfilerStep#0", "START"), annotation(clock, "ProfilerStep#0", "END")]
    snap = build(V, {0: sim}, frames, 1, annotations=ann)
    hs, ht = host_segment(frames, clock)
    snap["host_segments"] = hs
    snap["host_traces"] = ht
    return snap


def make_multi_device():
    V = (2, 6)
    rng = random.Random(26)
    clock = Clock(rng)
    frames = Frames()
    s0 = Sim(0, clock, frames, base=0x7F3A00000000, rng=random.Random(260))
    s2 = Sim(2, clock, frames, base=0x7F1C00000000, rng=random.Random(262))
    small_scenario(s0, layers=2)
    small_scenario(s2, layers=1, with_oom=True)
    s2.malloc(512 * 1024, "batch")
    ann = [annotation(clock, "ProfilerStep#0", "START", 0), annotation(clock, "ProfilerStep#0", "START", 2),
           annotation(clock, "ProfilerStep#0", "END", 2), annotation(clock, "ProfilerStep#0", "END", 0)]
    return build(V, {0: s0, 2: s2}, frames, 3, annotations=ann)


def make_unknown_keys():
    V = (2, 6)
    rng = random.Random(2600)
    clock = Clock(rng)
    frames = Frames()
    sim = Sim(0, clock, frames, rng=rng)
    ud_start = [{"filename": "ProfilerStep#1", "name": "START", "line": 0}]
    ud_end = [{"filename": "ProfilerStep#1", "name": "END", "line": 0}]
    sim.record("user_defined", 0, 0, 0, ud_start)
    small_scenario(sim, layers=1)
    sim.record("user_defined", 0, 0, 0, ud_end)
    sim.trace[5]["unknown"] = {"future_trace_field": {"a": 1, "b": [1, 2]}}
    snap = build(V, {0: sim}, frames, 1)
    snap["vramlens_future_section"] = {"version": 3, "items": [1, 2, 3], "note": "ignore me"}
    snap["segments"][0]["future_segment_field"] = "numa:0"
    snap["segments"][0]["blocks"][0]["future_block_field"] = [1, (2, 3), None, 1.5]
    return snap


def make_hostile():
    """PyTorch 2.10 layout whose strings hold terminal escape sequences (HOSTILE_*)."""
    V = (2, 10)
    rng = random.Random(2101)
    clock = Clock(rng)
    frames = Frames()
    sim = Sim(0, clock, frames, rng=rng)
    ann = [annotation(clock, HOSTILE_ANNOTATION, "START")]
    sim.ctx = {"compile_context": HOSTILE_NAME, "user_metadata": HOSTILE_META}
    sim.malloc(64 * MiB + 100, "hostile")
    sim.ctx = {}
    small_scenario(sim, layers=1)
    sim.record(HOSTILE_ACTION, 0, 0, 0, frames.tb("hostile"))
    sim.oom(8 * GiB, "hostile", device_free=1 * GiB)
    ann.append(annotation(clock, HOSTILE_ANNOTATION, "END"))
    settings = allocator_settings(V, conf=HOSTILE_CONF)
    return build(V, {0: sim}, frames, 1, annotations=ann, settings=settings)


def make_empty():
    V = (2, 3)
    return {"segments": [], "device_traces": [[]], "allocator_settings": allocator_settings(V)}


def make_v2_4(seed):
    V = (2, 4)
    rng = random.Random(seed)
    clock = Clock(rng)
    frames = Frames()
    sim = Sim(0, clock, frames, rng=rng)
    small_scenario(sim, layers=1, with_oom=(seed % 2 == 1))
    sim.snapshot_marker()
    return build(V, {0: sim}, frames, 1)


def make_v2_5_json():
    V = (2, 5)
    rng = random.Random(250)
    clock = Clock(rng)
    frames = Frames()
    sim = Sim(0, clock, frames, rng=rng)
    ann = [annotation(clock, "ProfilerStep#0", "START")]
    small_scenario(sim, layers=1, with_oom=True)
    p = sim.malloc(8192, "qkv", pool=(0, 1))
    sim.free(p, pending=True)
    ann.append(annotation(clock, "ProfilerStep#0", "END"))
    return build(V, {0: sim}, frames, 2, annotations=ann)


def make_cpp_content():
    V = (2, 6)
    rng = random.Random(2601)
    clock = Clock(rng)
    frames = Frames(cpp=True)
    sim = Sim(0, clock, frames, rng=rng)
    ann = [annotation(clock, "ProfilerStep#0", "START")]
    small_scenario(sim, layers=1, with_oom=True)
    # many distinct contexts -> > 256 memo entries (LONG_BINPUT / LONG_BINGET)
    live = []
    for ctx in ("embed", "ln", "sdpa", "attn_proj", "residual", "mlp_fc", "gelu", "mlp_proj",
                "loss", "opt_state", "opt_tmp", "fx_graph", "autograd_thread"):
        live.append(sim.malloc(3000 + 512 * rng.randint(0, 40), ctx))
    for a in live[::3]:
        sim.free(a)
    a = sim.malloc(700, "batch")
    sim.free(a, pending=True)
    for i in range(120):                 # record_function regions: distinct names
        name = "## transformer.h.%d.%s ##" % (i // 4, ("attn", "mlp", "ln_1", "ln_2")[i % 4])
        ann.append(annotation(clock, name, "START"))
        ann.append(annotation(clock, name, "END"))
    ann.append(annotation(clock, "ProfilerStep#0", "END"))
    return build(V, {0: sim}, frames, 1, annotations=ann)


def make_big_ints():
    V = (2, 9)
    rng = random.Random(290)
    clock = Clock(rng)
    frames = Frames()
    sim = Sim(0, clock, frames, base=0xFF00000000200000, rng=rng)
    small_scenario(sim, layers=1)
    a = sim.malloc(5 * MiB, "qkv", stream=XPU_STREAM)
    sim.malloc(1000, "ln", stream=XPU_STREAM)
    sim.free(a)
    sim.snapshot_marker()
    return build(V, {0: sim}, frames, 1)


# --------------------------------------------------------------------------------------
# Imitation of PyTorch's C++ pickler (torch::jit::Pickler, tag_aggregates=false)
# --------------------------------------------------------------------------------------

class CppPickler:
    def __init__(self):
        self.out = bytearray()
        self.memo_id = 0
        self.str_memo = {}
        self.obj_memo = {}
        self.shared = set()

    def _count(self, root):
        seen = {}
        stack = [root]
        while stack:
            o = stack.pop()
            if isinstance(o, (list, dict, tuple)):
                n = seen.get(id(o), 0) + 1
                seen[id(o)] = n
                if n > 1:
                    continue
                if isinstance(o, dict):
                    stack.extend(o.keys())
                    stack.extend(o.values())
                else:
                    stack.extend(o)
        self.shared = {i for i, n in seen.items() if n > 1}

    def _binput(self):
        i = self.memo_id
        if i <= 255:
            self.out += b"q" + bytes([i])
        else:
            self.out += b"r" + struct.pack("<I", i)
        self.memo_id += 1
        return i

    def _binget(self, i):
        if i <= 255:
            self.out += b"h" + bytes([i])
        else:
            self.out += b"j" + struct.pack("<I", i)

    def dumps(self, obj):
        self._count(obj)
        self._keep = obj
        self.out += b"\x80\x02"
        self._push(obj)
        self.out += b"."
        return bytes(self.out)

    def _push(self, o):
        shared = isinstance(o, (list, dict, tuple)) and id(o) in self.shared
        if shared and id(o) in self.obj_memo:
            self._binget(self.obj_memo[id(o)])
            return
        self._push_impl(o)
        if shared:
            self.obj_memo[id(o)] = self._binput()

    def _push_impl(self, o):
        out = self.out
        if o is None:
            out += b"N"
        elif o is True:
            out += b"\x88"
        elif o is False:
            out += b"\x89"
        elif isinstance(o, int):
            if 0 <= o <= 0xFF:
                out += b"K" + bytes([o])
            elif 0 <= o <= 0xFFFF:
                out += b"M" + struct.pack("<H", o)
            elif -2 ** 31 <= o < 2 ** 31:
                out += b"J" + struct.pack("<i", o)
            else:
                assert -2 ** 63 <= o < 2 ** 63, "C++ IValue ints are int64"
                out += b"\x8a\x08" + struct.pack("<q", o)
        elif isinstance(o, float):
            out += b"G" + struct.pack(">d", o)
        elif isinstance(o, str):
            i = self.str_memo.get(o)
            if i is not None:
                self._binget(i)
            else:
                data = o.encode("utf-8")
                out += b"X" + struct.pack("<I", len(data)) + data
                self.str_memo[o] = self._binput()
        elif isinstance(o, list):
            out += b"]("
            for x in o:
                self._push(x)
            self.out += b"e"
        elif isinstance(o, dict):
            out += b"}("
            for k, v in o.items():
                self._push(k)
                self._push(v)
            self.out += b"u"
        elif isinstance(o, tuple):
            assert len(o) == 2
            for x in o:
                self._push(x)
            self.out += b"\x86"
        else:
            raise TypeError(type(o))


# --------------------------------------------------------------------------------------
# Bad fixtures
# --------------------------------------------------------------------------------------

def os_system_bytes():
    cmd = "touch /tmp/vramlens_pwned".encode("utf-8")
    return (b"\x80\x02" + b"cos\nsystem\n" + b"X" + struct.pack("<I", len(cmd)) + cmd
            + b"\x85" + b"R" + b".")


def bad_memo_bytes():
    body = (b"}" + b"\x94"                                        # EMPTY_DICT, MEMOIZE 0
            + b"\x8c\x08segments" + b"\x94"                        # SHORT_BINUNICODE, MEMOIZE 1
            + b"h\x07"                                             # BINGET 7 (never stored)
            + b"s" + b".")                                          # SETITEM, STOP
    return b"\x80\x04" + b"\x95" + struct.pack("<Q", len(body)) + body


def deep_nesting_gz():
    n = 1000000
    raw = b"\x80\x02" + b"]" * n + b"a" * (n - 1) + b"."
    return gzip.compress(raw, compresslevel=9, mtime=0)


def chrome_trace():
    base = 1750000000000000
    ev = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "pid": 4242, "tid": 4242,
         "ts": base + 10.125, "dur": 8.5, "args": {"External id": 1, "Record function id": 0}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 4242, "tid": 4242,
         "ts": base + 30.5, "dur": 120.25, "args": {"External id": 2}},
        {"ph": "X", "cat": "kernel", "name": "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_nn",
         "pid": 0, "tid": 7, "ts": base + 60.0, "dur": 45.75,
         "args": {"device": 0, "stream": 7, "correlation": 12}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add_", "pid": 4242, "tid": 4242,
         "ts": base + 200.0, "dur": 6.0, "args": {"External id": 3}},
    ]
    mem = [(base + 11.0, 0x7F3A00000000, 1572864, 1572864, 20971520),
           (base + 31.0, 0x7F3A00180000, 4718592, 6291456, 20971520),
           (base + 151.0, 0x7F3A00180000, -4718592, 1572864, 20971520)]
    for ts, addr, nbytes, tot_a, tot_r in mem:
        ev.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                   "pid": 4242, "tid": 4242, "ts": ts,
                   "args": {"Device Type": 1, "Device Id": 0, "Addr": addr, "Bytes": nbytes,
                            "Total Allocated": tot_a, "Total Reserved": tot_r}})
    doc = {"schemaVersion": 1,
           "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB",
                                 "totalGlobalMem": 85031714816}],
           "traceEvents": ev, "displayTimeUnit": "ms"}
    return json.dumps(doc, indent=1).encode("utf-8") + b"\n"


def wrong_type_snapshot():
    V, sim, frames = make_v2_2(clock_seed=221)
    snap = build(V, {0: sim}, frames, 1)
    assert len(snap["device_traces"][0]) > 17
    snap["device_traces"][0][17]["size"] = "4096"
    return snap


# --------------------------------------------------------------------------------------
# Self checks (on the unpickled objects, like a reader would see them)
# --------------------------------------------------------------------------------------

LATE_RECORDINGS = {"categories/old_moments.pickle", "categories/forward_only.pickle",
                   "categories/autocast_no_frames.pickle",
                   "categories/fp32_half_weight_output.pickle",
                   "budget/autocast_bs1.pickle", "budget/autocast_bs2.pickle",
                   "budget/autocast_bs4.pickle",
                   "budget/attn_seq128.pickle", "budget/attn_seq256.pickle",
                   "budget/attn_seq512.pickle",
                   "categories/attention_bench.pickle"} | {
                       "budget/%s_seq%d.pickle" % (kind, t)
                       for kind in ("shuffled", "stale") for t in (128, 256, 384, 512)}


def check_snapshot(name, root):
    segs = root if isinstance(root, list) else root["segments"]
    for s in segs:
        addr = s["address"]
        total = 0
        for b in s["blocks"]:
            assert b["size"] % 512 == 0, name
            if "address" in b:
                assert b["address"] == addr + total, (name, hex(b["address"]))
            total += b["size"]
        assert total == s["total_size"], name
        alloc = sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated")
        active = sum(b["size"] for b in s["blocks"] if b["state"].startswith("active_"))
        assert s["allocated_size"] == alloc and s["active_size"] == active, name
        if "requested_size" in s:
            req = sum(b["requested_size"] for b in s["blocks"] if b["state"].startswith("active_"))
            assert s["requested_size"] == req, name
        assert s["allocated_size"] <= s["active_size"] <= s["total_size"], name
    if isinstance(root, list):
        return
    # Recordings started late: their first allocations land in segments made before the
    # trace, and blocks from before it are freed in it.
    late = name in LATE_RECORDINGS
    for d, trace in enumerate(root["device_traces"]):
        open_blocks = {}
        seg_ranges = [(s["address"], s["address"] + s["total_size"]) for s in segs] if late else []
        for i, e in enumerate(trace):
            a = e["action"]
            if a in ("segment_alloc", "segment_map"):
                seg_ranges.append((e["addr"], e["addr"] + e["size"]))
            elif a == "alloc":
                assert e["addr"] not in open_blocks, (name, i)
                assert any(lo <= e["addr"] < hi for lo, hi in seg_ranges), (name, i)
                open_blocks[e["addr"]] = ["alloc", e["size"]]
            elif a == "free_requested" and late and e["addr"] not in open_blocks:
                open_blocks[e["addr"]] = ["free_requested", e["size"]]
            elif a == "free_requested":
                assert open_blocks[e["addr"]][0] == "alloc", (name, i)
                assert open_blocks[e["addr"]][1] == e["size"], (name, i)
                open_blocks[e["addr"]][0] = "free_requested"
            elif a == "free_completed":
                if e["addr"] not in open_blocks:
                    assert i == 0, (name, i)       # only the deliberate orphan
                    continue
                assert open_blocks.pop(e["addr"])[0] == "free_requested", (name, i)
            elif a == "snapshot":
                assert e["addr"] == 0 and e["stream"] == 0, name
            elif a == "oom":
                assert "addr" not in e and "device_free" in e, name
        live = {b_addr for b_addr, st in open_blocks.items()}
        final = set()
        for s in segs:
            if s["device"] != d:
                continue
            off = s["address"]
            for b in s["blocks"]:
                if b["state"].startswith("active_"):
                    final.add(off)
                off += b["size"]
        if trace:
            assert live <= final, (name, d, sorted(live - final))


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------
# Category fixtures: one rule of the categories each (tests/categories.rs computes every
# expected figure from these constants)
# --------------------------------------------------------------------------------------

CAT_PARAMS = [4 * MiB] * 4 + [2 * MiB + 4 * KiB] * 2 + [8 * KiB] * 3
CAT_ACT = 3 * MiB
CAT_STEP_TMP = 64 * MiB
CAT_BATCH = 64 * KiB


def cat_sim(seed, cpp):
    rng = random.Random(seed)
    clock = Clock(rng)
    frames = Frames(cpp=cpp)
    return Sim(0, clock, frames, rng=rng), frames, clock


def cat_forward(sim, out_ctx="my_fwd_out"):
    """A forward: three activations and an output, then the loss (4 bytes)."""
    acts = [sim.malloc(CAT_ACT, "my_fwd") for _ in range(3)]
    acts.append(sim.malloc(CAT_ACT, out_ctx))
    return acts, sim.malloc(4, "my_loss")


def cat_backward(sim, acts, grads_ctx, tmp_ctx, make_grads=True):
    """loss.backward(): each gradient is the output of its node's kernel (kept as .grad
    without a copy, no AccumulateGrad frame), one temporary per node, activations freed."""
    first = sim.malloc(4, "backward_call")
    grads = []
    for size in CAT_PARAMS:
        tmp = sim.malloc(CAT_ACT, tmp_ctx)
        if make_grads:
            grads.append(sim.malloc(size, grads_ctx))
        sim.free(tmp, ctx=tmp_ctx)
    for a in acts:
        sim.free(a, ctx=tmp_ctx)
    sim.free(first, ctx=tmp_ctx)
    return grads


def make_cat_steal():
    """PyTorch 2.6, stacks="all": torch modules, AdamW (state on the first step), two steps
    of zero_grad(set_to_none) / forward / backward / step; gradients made by MmBackward0."""
    V = (2, 6)
    sim, frames, clock = cat_sim(601, cpp=True)
    ann = []
    for size in CAT_PARAMS:
        sim.malloc(size, "param_init")
    grads, state = [], []
    for step in range(2):
        if grads:
            ann.append(annotation(clock, "Optimizer.zero_grad#AdamW.zero_grad", "START"))
            for g in grads:
                sim.free(g, ctx="zero_grad")
            ann.append(annotation(clock, "Optimizer.zero_grad#AdamW.zero_grad", "END"))
        x = sim.malloc(CAT_BATCH, "my_batch")
        acts, loss = cat_forward(sim)
        grads = cat_backward(sim, acts, "mm_backward", "mul_backward")
        ann.append(annotation(clock, "Optimizer.step#AdamW.step", "START"))
        if step == 0:
            state = [sim.malloc(size, "adam_state") for size in CAT_PARAMS for _ in range(2)]
        tmps = [sim.malloc(size, "adam_tmp") for size in CAT_PARAMS]
        tmps.append(sim.malloc(CAT_STEP_TMP, "adam_tmp"))        # the peak
        for t in tmps:
            sim.free(t, ctx="adam_tmp")
        ann.append(annotation(clock, "Optimizer.step#AdamW.step", "END"))
        sim.free(loss, ctx="my_batch")
        sim.free(x, ctx="my_batch")
    assert len(state) == 2 * len(CAT_PARAMS)
    return build(V, {0: sim}, frames, 1, annotations=ann, settings=allocator_settings(V))


def make_cat_compiled():
    """PyTorch 2.5, Python stacks: the user's modules, a compiled forward and backward
    (inductor's generated modules), gradients made by the compiled backward."""
    V = (2, 5)
    sim, frames, _ = cat_sim(602, cpp=False)
    for size in CAT_PARAMS:
        sim.malloc(size, "my_init")
    acts = [sim.malloc(CAT_ACT, "compiled_fwd") for _ in range(4)]
    loss = sim.malloc(4, "my_loss")
    cat_backward(sim, acts, "compiled_bwd", "compiled_bwd")
    sim.free(loss, ctx="my_batch")
    sim.malloc(CAT_BATCH, "my_batch")                         # the next step's batch
    return build(V, {0: sim}, frames, 1, settings=allocator_settings(V))


def cat_own_step(sim, moments):
    """The user's optimizer step: a large temporary, then per parameter a temporary and
    two new moments replacing the old ones."""
    big = sim.malloc(CAT_STEP_TMP, "myopt_tmp")                # the peak
    new = []
    for i, size in enumerate(CAT_PARAMS):
        tmp = sim.malloc(size, "myopt_tmp")
        for k in range(2):
            new.append(sim.malloc(size, "myopt_state"))
            sim.free(moments[2 * i + k], ctx="myopt_state")
        sim.free(tmp, ctx="myopt_tmp")
    sim.free(big, ctx="myopt_tmp")
    return new


def make_cat_own_optimizer():
    """PyTorch 2.6, Python stacks: the user's modules and optimizer (moments made in its
    __init__, replaced by each step), two steps; gradients on the engine's thread (no
    frames)."""
    V = (2, 6)
    sim, frames, _ = cat_sim(603, cpp=False)
    for size in CAT_PARAMS:
        sim.malloc(size, "my_init")
    moments = [sim.malloc(size, "myopt_init") for size in CAT_PARAMS for _ in range(2)]
    grads = []
    for _ in range(2):
        for g in grads:
            sim.free(g, ctx="zero_grad")
        x = sim.malloc(CAT_BATCH, "my_batch")
        acts, loss = cat_forward(sim)
        grads = cat_backward(sim, acts, "mm_backward", "mm_backward")
        moments = cat_own_step(sim, moments)
        sim.free(loss, ctx="my_batch")
        sim.free(x, ctx="my_batch")
    sim.malloc(CAT_BATCH, "my_batch")                         # the next step's batch
    return build(V, {0: sim}, frames, 1, settings=allocator_settings(V))


def make_cat_old_moments():
    """PyTorch 2.6, Python stacks: recording starts after a first step, so parameters,
    gradients and moments are from before it; the recorded step accumulates into the
    gradients and replaces the moments."""
    V = (2, 6)
    sim, frames, _ = cat_sim(604, cpp=False)
    for size in CAT_PARAMS:
        sim.malloc(size, "my_init")
    moments = [sim.malloc(size, "myopt_init") for size in CAT_PARAMS for _ in range(2)]
    acts, loss = cat_forward(sim)
    cat_backward(sim, acts, "mm_backward", "mm_backward")
    moments = cat_own_step(sim, moments)
    sim.free(loss, ctx="my_batch")
    sim.start_recording()
    x = sim.malloc(CAT_BATCH, "my_batch")
    acts, loss = cat_forward(sim)
    cat_backward(sim, acts, "mm_backward", "mm_backward", make_grads=False)
    cat_own_step(sim, moments)
    sim.free(loss, ctx="my_batch")
    sim.free(x, ctx="my_batch")
    sim.malloc(CAT_BATCH, "my_batch")                         # the next step's batch
    return build(V, {0: sim}, frames, 1, settings=allocator_settings(V))


def make_cat_forward_only():
    """PyTorch 2.5, Python stacks: the model is built before recording starts; two
    forwards under no_grad."""
    V = (2, 5)
    sim, frames, _ = cat_sim(605, cpp=False)
    for size in CAT_PARAMS:
        sim.malloc(size, "my_init")
    sim.start_recording()
    for _ in range(2):
        x = sim.malloc(CAT_BATCH, "my_batch")
        acts, loss = cat_forward(sim)
        for a in acts:
            sim.free(a, ctx="my_fwd")
        sim.free(loss, ctx="my_batch")
        sim.free(x, ctx="my_batch")
    return build(V, {0: sim}, frames, 1, settings=allocator_settings(V))


BENCH_TOKEN = 4 * KiB      # bytes per token of each of Q, K, V and the output
BENCH_PAIR = 128           # bytes per (token, token) pair of the scores (and weights)
BENCH_FLUSH = 16 * MiB     # the cache-flush buffer of triton's do_bench


def make_cat_attention_bench(seq=512, seed=607):
    """PyTorch 2.6, Python stacks: an attention benchmark in `benchmark_attention.py`,
    no module: Q, K, V made before recording, then do_bench's cache flush buffer and two
    calls of the script's own `annotated_scaled_dot_product_attention` (scores, weights,
    output, each freed). At 512 tokens: Q, K, V and the output 2 MiB each, scores and
    weights 32 MiB each."""
    V = (2, 6)
    sim, frames, _ = cat_sim(seed, cpp=False)
    for _ in range(3):
        sim.malloc(seq * BENCH_TOKEN, "bench_qkv")
    sim.start_recording()
    flush = sim.malloc(BENCH_FLUSH, "bench_flush")
    for _ in range(2):
        scores = sim.malloc(seq * seq * BENCH_PAIR, "bench_scores")
        weights = sim.malloc(seq * seq * BENCH_PAIR, "bench_weights")
        sim.free(scores, ctx="bench_weights")
        out = sim.malloc(seq * BENCH_TOKEN, "bench_out")
        sim.free(weights, ctx="bench_out")
        sim.free(out, ctx="bench_out")
    sim.free(flush, ctx="bench_flush")
    return build(V, {0: sim}, frames, 1, settings=allocator_settings(V))


PY_STACKS.update({
    # The attention benchmark's forward and backward (make_cat_attention_backward).
    "bench_loss": [("main", BENCH_PY, 101), ("<module>", BENCH_PY, 120)],
    "bench_backward": [("_engine_run_backward", SITE + "/autograd/graph.py", 825),
                       ("backward", SITE + "/autograd/__init__.py", 347),
                       ("backward", SITE + "/_tensor.py", 581),
                       ("main", BENCH_PY, 102), ("<module>", BENCH_PY, 120)],
})


def make_cat_attention_backward(seq=512, seed=608):
    """PyTorch 2.6, Python stacks: the attention benchmark's forward and backward, no
    module anywhere. Q, K, V (2 MiB each at 512 tokens) made by the script, then twice:
    scores (32 MiB, freed by the script once the weights are made), weights (32 MiB,
    saved for backward), the output (2 MiB) and its sum (4 bytes); `backward()` makes its
    4-byte seed, and on the engine's thread (no frames) the output's gradient (2 MiB), the
    weights' (32 MiB), the scores' (32 MiB, the peak), frees the saved weights, makes
    Q's and K's gradients (2 MiB each) and frees all it made; then the script drops the
    output and its sum."""
    V = (2, 6)
    sim, frames, _ = cat_sim(seed, cpp=False)
    token, pair = seq * BENCH_TOKEN, seq * seq * BENCH_PAIR
    for _ in range(3):
        sim.malloc(token, "bench_qkv")
    for _ in range(2):
        scores = sim.malloc(pair, "bench_scores")
        weights = sim.malloc(pair, "bench_weights")
        sim.free(scores, ctx="bench_weights")
        out = sim.malloc(token, "bench_out")
        loss = sim.malloc(4, "bench_loss")
        seed_grad = sim.malloc(4, "bench_backward")
        made = [sim.malloc(token, "autograd_thread"), sim.malloc(pair, "autograd_thread")]
        made.append(sim.malloc(pair, "autograd_thread"))          # the peak
        sim.free(weights, ctx="autograd_thread")
        made += [sim.malloc(token, "autograd_thread") for _ in range(2)]
        for a in made + [seed_grad]:
            sim.free(a, ctx="autograd_thread")
        sim.free(loss, ctx="bench_loss")
        sim.free(out, ctx="bench_loss")
    return build(V, {0: sim}, frames, 1, settings=allocator_settings(V))


# A linear layer's weights in CAT_PARAMS: autocast casts these (not the 8 KiB norms).
CAT_LINEAR = CAT_PARAMS[:6]
CAT_COLLIDE = 2 * MiB      # an activation half a 4 MiB weight, freed within the forward


def make_cat_autocast(batch=1, autocast=True, seed=609):
    """PyTorch 2.6, Python stacks only (no C++ frame, so no autocast frame): the model
    built before recording (fp32), then two inference forwards. Per forward: the batch
    (64 KiB), then per linear weight its half-precision copy (autocast's cache) and the
    layer's output (1.5 MiB per sample in bf16), each output freed once the next is made;
    after the first layer an activation of 2 MiB (half a 4 MiB weight) made and freed;
    the forward's output (1.5 MiB per sample); then the autocast region ends and frees
    its copies, and the script the rest. Without autocast the same forward makes no
    copies, its activations are fp32 (3 MiB per sample) and its output is 2 MiB, half a
    4 MiB weight, alive to the end of the forward."""
    V = (2, 6)
    sim, frames, _ = cat_sim(seed, cpp=False)
    for size in CAT_PARAMS:
        sim.malloc(size, "my_init")
    sim.start_recording()
    act = batch * (CAT_ACT // 2 if autocast else CAT_ACT)
    for _ in range(2):
        x = sim.malloc(CAT_BATCH, "my_batch")
        copies, prev = [], None
        for k, size in enumerate(CAT_LINEAR):
            if autocast:
                copies.append(sim.malloc(size // 2, "my_fwd"))
            a = sim.malloc(act, "my_fwd")
            if prev is not None:
                sim.free(prev, ctx="my_fwd")
            prev = a
            if k == 0:
                sim.free(sim.malloc(CAT_COLLIDE, "my_fwd"), ctx="my_fwd")
        out = sim.malloc(act if autocast else CAT_COLLIDE, "my_fwd_out")
        sim.free(prev, ctx="my_fwd")
        for c in copies:
            sim.free(c, ctx="my_batch")
        sim.free(out, ctx="my_batch")
        sim.free(x, ctx="my_batch")
    return build(V, {0: sim}, frames, 1, settings=allocator_settings(V))


KV_LAYERS = 2
KV_PROMPT = 16            # tokens of the prompt
KV_STEPS = 8              # decode steps
KV_TOKEN = 64 * KiB       # bytes of one token's keys (and of its values) in one layer


def make_cat_kv_cache():
    """PyTorch 2.6, Python stacks: greedy decoding with a cache grown by torch.cat: at
    every step each layer's keys and values are copied into a tensor one token longer and
    the old one freed."""
    V = (2, 6)
    sim, frames, _ = cat_sim(606, cpp=False)
    for size in CAT_PARAMS:
        sim.malloc(size, "my_init")
    keys, values = [], []
    for _ in range(KV_LAYERS):                                 # the prompt
        a = sim.malloc(CAT_ACT, "dec_attn")
        keys.append(sim.malloc(KV_PROMPT * KV_TOKEN, "kv_cat_k"))
        values.append(sim.malloc(KV_PROMPT * KV_TOKEN, "kv_cat_v"))
        sim.free(a, ctx="dec_attn")
    for t in range(1, KV_STEPS + 1):
        for layer in range(KV_LAYERS):
            a = sim.malloc(CAT_ACT, "dec_attn")
            for cache, ctx in ((keys, "kv_cat_k"), (values, "kv_cat_v")):
                grown = sim.malloc((KV_PROMPT + t) * KV_TOKEN, ctx)
                sim.free(cache[layer], ctx=ctx)
                cache[layer] = grown
            sim.free(a, ctx="dec_attn")
        logits = sim.malloc(CAT_ACT, "dec_logits")
        sim.free(logits, ctx="dec_logits")
    return build(V, {0: sim}, frames, 1, settings=allocator_settings(V))


# --------------------------------------------------------------------------------------
# Budget series: one synthetic model at several batch sizes and sequence lengths
# (tests/budget.rs computes every expected figure from these constants)
# --------------------------------------------------------------------------------------

BUDGET_LAYERS = 2
BUDGET_HIDDEN = 16 * KiB  # bytes per token of each of a layer's two activations
BUDGET_OUT = 8 * KiB      # bytes per token of a layer's output
BUDGET_SCORES = 32        # bytes per (token, token) pair of a layer's attention scores
PY_STACKS.update({
    "attn_scores": [("scaled_dot_product_attention", LAYERS_PY, 44), ("forward", LAYERS_PY, 30)]
                   + CALL + [("forward", LAYERS_PY, 66)] + CALL + LOOP,
    "attn_workspace": [("scaled_dot_product_attention", LAYERS_PY, 46),
                       ("forward", LAYERS_PY, 30)] + CALL + [("forward", LAYERS_PY, 66)] + CALL
                      + LOOP,
})


def budget_forward(sim, batch, seq, workspace=0):
    """The activations of one forward of the budget model, in allocation order: per layer
    two hidden activations, the attention scores and the output. With `workspace`, the
    first layer's attention also makes a workspace of that many bytes, kept with the
    activations (a kernel that only some sizes pick)."""
    acts = []
    for layer in range(BUDGET_LAYERS):
        acts.append(sim.malloc(batch * seq * BUDGET_HIDDEN, "my_fwd"))
        acts.append(sim.malloc(batch * seq * seq * BUDGET_SCORES, "attn_scores"))
        if workspace and layer == 0:
            acts.append(sim.malloc(workspace, "attn_workspace"))
        acts.append(sim.malloc(batch * seq * BUDGET_HIDDEN, "my_fwd"))
        acts.append(sim.malloc(batch * seq * BUDGET_OUT, "my_fwd_out"))
    return acts


def make_budget_run(seed, batch, seq, step_copies=0, loss_bytes=4, workspace=0):
    """PyTorch 2.6, Python stacks: building the model, a first step (forward, backward,
    AdamW), then a second forward: its end is the peak, holding the weights, the first
    step's gradients and optimizer state, and the second forward's activations.

    With `step_copies`, the optimizer step makes that many temporary copies of the
    parameters (a foreach step's), freed before it ends: while the forward's activations
    are smaller than the copies, the peak is in the optimizer step; past them, at the end
    of the second forward."""
    V = (2, 6)
    sim, frames, clock = cat_sim(seed, cpp=False)
    ann = []
    for size in CAT_PARAMS:
        sim.malloc(size, "my_init")

    def forward():
        return budget_forward(sim, batch, seq, workspace), sim.malloc(loss_bytes, "my_loss")

    acts, loss = forward()
    first = sim.malloc(4, "backward_call")
    for a in acts:
        sim.free(a, ctx="mm_backward")
    grads = [sim.malloc(size, "mm_backward") for size in CAT_PARAMS]
    sim.free(first, ctx="mm_backward")
    sim.free(loss, ctx="my_batch")
    ann.append(annotation(clock, "Optimizer.step#AdamW.step", "START"))
    state = [sim.malloc(size, "adam_state") for size in CAT_PARAMS for _ in range(2)]
    tmp = sim.malloc(CAT_PARAMS[0], "adam_tmp")
    sim.free(tmp, ctx="adam_tmp")
    copies = [sim.malloc(size, "adam_tmp") for _ in range(step_copies) for size in CAT_PARAMS]
    for c in copies:
        sim.free(c, ctx="adam_tmp")
    ann.append(annotation(clock, "Optimizer.step#AdamW.step", "END"))
    acts, loss = forward()                                       # the peak
    first = sim.malloc(4, "backward_call")
    for a in acts:
        sim.free(a, ctx="mm_backward")
    sim.free(first, ctx="mm_backward")
    sim.free(loss, ctx="my_batch")
    assert len(grads) == len(CAT_PARAMS) and len(state) == 2 * len(CAT_PARAMS)
    return build(V, {0: sim}, frames, 1, annotations=ann, settings=allocator_settings(V))


SERIES_TOKEN = 4 * KiB     # bytes per token of each input and of the output
SERIES_PAIR = 64           # bytes per (token, token) pair of the scores


def make_series_run(seq, seed, earlier=()):
    """PyTorch 2.6, Python stacks: before recording, the weights (`CAT_PARAMS`) made in an
    order of the run's own (shuffled by `seed`, as a loader's order or a dict's may be:
    their addresses in another order in every run) and the run's three inputs (`seq` x 4
    KiB each); then two forwards, each making scores (`seq` x `seq` x 64 bytes) and an
    output (`seq` x 4 KiB), both freed. With `earlier`, the same process first ran those
    sizes (inputs made, two forwards, inputs freed): their segments are still cached
    when recording starts."""
    V = (2, 6)
    sim, frames, _ = cat_sim(seed, cpp=False)
    order = list(CAT_PARAMS)
    random.Random(seed).shuffle(order)
    for size in order:
        sim.malloc(size, "my_init")

    def inputs(t):
        return [sim.malloc(t * SERIES_TOKEN, "my_batch") for _ in range(3)]

    def forwards(t):
        for _ in range(2):
            scores = sim.malloc(t * t * SERIES_PAIR, "attn_scores")
            out = sim.malloc(t * SERIES_TOKEN, "my_fwd_out")
            sim.free(scores, ctx="my_fwd_out")
            sim.free(out, ctx="my_loss")

    for t in earlier:
        x = inputs(t)
        forwards(t)
        for a in x:
            sim.free(a, ctx="my_batch")
    inputs(seq)
    sim.start_recording()
    forwards(seq)
    return build(V, {0: sim}, frames, 1, settings=allocator_settings(V))


def make_budget_steps(seed, batch, seqs):
    """The `make_budget_run` model trained one step per sequence length in `seqs` (a
    last batch shorter, say): each step a forward, a backward that frees its activations
    (the gradients made by the first and kept), and an AdamW step (its state made by the
    first). The peak of each step is at the end of its backward's first allocation:
    the weights, gradients, optimizer state and that step's activations."""
    V = (2, 6)
    sim, frames, clock = cat_sim(seed, cpp=False)
    ann = []
    for size in CAT_PARAMS:
        sim.malloc(size, "my_init")
    grads, state = [], []
    for k, seq in enumerate(seqs):
        acts = budget_forward(sim, batch, seq)
        loss = sim.malloc(4, "my_loss")
        first = sim.malloc(4, "backward_call")
        for a in acts:
            sim.free(a, ctx="mm_backward")
        if k == 0:
            grads = [sim.malloc(size, "mm_backward") for size in CAT_PARAMS]
        sim.free(first, ctx="mm_backward")
        sim.free(loss, ctx="my_batch")
        ann.append(annotation(clock, "Optimizer.step#AdamW.step", "START"))
        if k == 0:
            state = [sim.malloc(size, "adam_state") for size in CAT_PARAMS for _ in range(2)]
        tmp = sim.malloc(CAT_PARAMS[0], "adam_tmp")
        sim.free(tmp, ctx="adam_tmp")
        ann.append(annotation(clock, "Optimizer.step#AdamW.step", "END"))
    assert len(grads) == len(CAT_PARAMS) and len(state) == 2 * len(CAT_PARAMS)
    return build(V, {0: sim}, frames, 1, annotations=ann, settings=allocator_settings(V))


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def write_expected(path):
    obj = expected.figures_for_path(path)
    text = json.dumps(obj, sort_keys=True, indent=1) + "\n"
    write(path + ".expected.json", text.encode("utf-8"))
    return obj


GOOD = []  # (file name, bytes) in write order


def add(name, data, limit=100 * 1024):
    assert len(data) < limit, (name, len(data))
    GOOD.append((name, data))


def main(argv=None):
    global OUT, BAD
    parser = argparse.ArgumentParser(description="Writes the fixtures in testdata/.")
    parser.add_argument("--out", default=OUT,
                        help="folder to write to instead of testdata/ (the tests compare)")
    OUT = os.path.abspath(parser.parse_args(argv).out)
    BAD = os.path.join(OUT, "bad")
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(BAD, exist_ok=True)

    sample = make_sample()
    sample_bytes = pickle.dumps(sample, protocol=4)
    add("sample.pickle", sample_bytes)
    add("v1_13_list.pickle", pickle.dumps(make_v1_13(), protocol=2))
    add("v2_0_history.pickle", pickle.dumps(make_v2_0(), protocol=4))
    add("v2_1.pickle", pickle.dumps(make_v2_1(), protocol=4))
    V, sim, frames = make_v2_2()
    add("v2_2.pickle", pickle.dumps(build(V, {0: sim}, frames, 1), protocol=4))
    add("v2_3_settings.pickle", pickle.dumps(make_v2_3(), protocol=4))
    add("v2_8_compile.pickle", pickle.dumps(make_v2_8(), protocol=4))
    add("v2_10_meta.pickle", pickle.dumps(make_v2_10(), protocol=4))
    add("v2_12_pool.pickle", pickle.dumps(make_v2_12(), protocol=4))
    add("v2_14_host_p5.pickle", pickle.dumps(make_v2_14(), protocol=5))
    add("multi_device.pickle", pickle.dumps(make_multi_device(), protocol=4))
    add("unknown_keys.pickle", pickle.dumps(make_unknown_keys(), protocol=4))
    add("empty.pickle", pickle.dumps(make_empty(), protocol=4))
    gz = gzip.compress(pickle.dumps(make_v2_4(240), protocol=4), compresslevel=9, mtime=0)
    add("snapshot_gz.bin", gz)
    add("snapshot_gz.pickle.gz", gz)
    add("v2_5.json", (json.dumps(make_v2_5_json()) + "\n").encode("utf-8"))
    add("cpp_pickler.pickle", CppPickler().dumps(make_cpp_content()))
    add("protocol2.pickle", pickle.dumps(make_v2_4(241), protocol=2))
    add("big_ints.pickle", pickle.dumps(make_big_ints(), protocol=4))
    add("hostile_strings.pickle", pickle.dumps(make_hostile(), protocol=4))
    add("categories/steal.pickle", pickle.dumps(make_cat_steal(), protocol=4))
    add("categories/compiled.pickle", pickle.dumps(make_cat_compiled(), protocol=4))
    add("categories/own_optimizer.pickle", pickle.dumps(make_cat_own_optimizer(), protocol=4))
    add("categories/old_moments.pickle", pickle.dumps(make_cat_old_moments(), protocol=4))
    add("categories/forward_only.pickle", pickle.dumps(make_cat_forward_only(), protocol=4))
    add("categories/kv_cache.pickle", pickle.dumps(make_cat_kv_cache(), protocol=4))
    add("categories/attention_bench.pickle",
        pickle.dumps(make_cat_attention_bench(), protocol=4))
    add("categories/attention_backward.pickle",
        pickle.dumps(make_cat_attention_backward(), protocol=4))
    add("categories/autocast_no_frames.pickle", pickle.dumps(make_cat_autocast(), protocol=4))
    add("categories/fp32_half_weight_output.pickle",
        pickle.dumps(make_cat_autocast(autocast=False, seed=610), protocol=4))
    for b in (1, 2, 4, 8):
        add("budget/batch_bs%d.pickle" % b, pickle.dumps(make_budget_run(700 + b, b, 128), protocol=4))
    for t in (128, 256, 512, 1024):
        add("budget/seq_ctx%d.pickle" % t, pickle.dumps(make_budget_run(800 + t, 2, t), protocol=4))
    for b in (1, 2, 4):
        add("budget/autocast_bs%d.pickle" % b,
            pickle.dumps(make_cat_autocast(b, seed=620 + b), protocol=4))
    for t in (128, 256, 512):
        add("budget/attn_seq%d.pickle" % t,
            pickle.dumps(make_cat_attention_bench(t, 700 + t), protocol=4))
    for k, t in enumerate((128, 256, 384, 512)):
        add("budget/shuffled_seq%d.pickle" % t,
            pickle.dumps(make_series_run(t, 1400 + t), protocol=4))
        add("budget/stale_seq%d.pickle" % t,
            pickle.dumps(make_series_run(t, 1500 + t, (128, 256, 384, 512)[:k]), protocol=4))
    # A second run at 512 tokens whose loss holds 8 MiB, not 4 bytes: a repeat of the
    # size that reserves more.
    add("budget/seq_ctx512_rerun.pickle",
        pickle.dumps(make_budget_run(1300, 2, 512, loss_bytes=8 * MiB), protocol=4))
    # Batch and sequence both varying: four shapes measured (three sequence lengths, so
    # that a law in the length is told apart), and 4 x 512 to predict.
    for b, t in ((1, 128), (2, 128), (2, 256), (1, 512), (4, 512)):
        add("budget/bxs_bs%d_seq%d.pickle" % (b, t),
            pickle.dumps(make_budget_run(1200 + 10 * b + t, b, t), protocol=4))
    # A peak that moves: in the optimizer step up to 512 tokens, in the forward at 1024.
    for t in (128, 256, 512, 1024):
        add("budget/moving_seq%d.pickle" % t,
            pickle.dumps(make_budget_run(1000 + t, 2, t, step_copies=8), protocol=4))
    # From 512 tokens on, each forward's attention also makes an 8 MiB workspace (a
    # kernel only those sizes pick): the runs' allocations match in order, not one to one.
    for t in (512, 1024):
        add("budget/ws_seq%d.pickle" % t,
            pickle.dumps(make_budget_run(800 + t, 2, t, workspace=8 * MiB), protocol=4))
    # Five steps, their batches of 512, 448, 512, 384 and 512 tokens.
    add("budget/steps.pickle",
        pickle.dumps(make_budget_steps(1100, 2, [512, 448, 512, 384, 512]), protocol=4))
    # The same sizes in another precision (its name says so), for the refusal.
    add("budget/seq_ctx512_bf16.pickle", pickle.dumps(make_budget_run(900, 2, 512), protocol=4))

    for name, data in GOOD:
        path = os.path.join(OUT, name)
        write(path, data)
        raw = expected.read_bytes(path)
        root, _ = expected.load(raw)
        check_snapshot(name, root)
        write_expected(path)

    # The HTML page torch.cuda._memory_viz trace_plot writes: the pickle, padded with 1 to
    # 3 NUL bytes to a multiple of 3, base64 in a JSON list assigned to local_files.
    padded = sample_bytes + b"\0" * (3 - len(sample_bytes) % 3)
    files = json.dumps([{"name": "snapshot.pickle", "base64": base64.b64encode(padded).decode()}])
    write(os.path.join(OUT, "sample_viz.html"), (VIZ_HTML.replace("$SNAPSHOT", files)).encode())

    # ---- bad fixtures -------------------------------------------------------------
    bad = {
        "empty.pickle": b"",
        "truncated.pickle": sample_bytes[: len(sample_bytes) // 2],
        "random.bin": random.Random(7).randbytes(4096),
        "list_of_ints.pickle": pickle.dumps(list(range(0, 5000, 7)), protocol=4),
        "tensor_meta.pickle": pickle.dumps({
            "layer.weight": {"shape": [4096, 4096], "dtype": "torch.float16", "device": "cuda:0"},
            "layer.bias": {"shape": [4096], "dtype": "torch.float16", "device": "cuda:0"},
            "embed.weight": {"shape": [50304, 4096], "dtype": "torch.bfloat16", "device": "cuda:0"},
        }, protocol=4),
        "os_system.pickle": os_system_bytes(),
        "wrong_type.pickle": pickle.dumps(wrong_type_snapshot(), protocol=4),
        "chrome_trace.json": chrome_trace(),
        "deep_nesting.pickle.gz": deep_nesting_gz(),
        "bad_memo.pickle": bad_memo_bytes(),
        "segments_not_list.pickle": pickle.dumps(
            {"segments": 42, "device_traces": [[]]}, protocol=4),
    }
    for name, data in bad.items():
        assert len(data) < 100 * 1024, (name, len(data))
        write(os.path.join(BAD, name), data)

    # sanity on the bad ones (never executing anything)
    ops = [op.name for op, _, _ in pickletools.genops(bad["os_system.pickle"])]
    assert ops == ["PROTO", "GLOBAL", "BINUNICODE", "TUPLE1", "REDUCE", "STOP"], ops
    for name in ("bad_memo.pickle", "os_system.pickle", "truncated.pickle"):
        try:
            expected.load(bad[name])
        except Exception:
            pass
        else:
            raise AssertionError(name + " unexpectedly loaded")

    write(os.path.join(OUT, "README.md"), README.encode("utf-8"))
    names = [n for n, _ in GOOD]
    sys.stderr.write("wrote %d good fixtures (+ .expected.json), %d bad fixtures, README.md "
                     "under %s\n" % (len(names), len(bad), OUT))


VIZ_HTML = """<!DOCTYPE html>
<html>
<head>
</head>
<body>
<script type="module">
import {add_local_files} from "https://example.invalid/MemoryViz.js"
const local_files = $SNAPSHOT
add_local_files(local_files, 'Active Memory Timeline')
</script>
</body>
"""


README = """\
# testdata/

Generated by `python3 scripts/gen_fixtures.py` (deterministic, standard library only;
re-run it instead of editing files by hand). Each good fixture `X` has `X.expected.json`,
the figures `python3 scripts/expected.py X` computes with CPython's own `pickle`/`json`
(without the `path` field). Real third-party snapshots are NOT copied here; their
expected figures are in `tests/data/real_expected.json`
(`python3 scripts/expected.py --real tests/data/real_expected.json`).

## Good fixtures

- `sample.pickle`: PyTorch 2.5 layout, protocol 4, the README demo: one nanoGPT training step on device 0 recorded with stacks="all" (C++ + Python frames), ProfilerStep#0 START/END external_annotations, allocator_settings, 6 segments (large + small), active_allocated / active_pending_free / inactive blocks, ~300 trace entries (alloc, free_requested, free_completed incl. one delayed record_stream completion, segment_alloc, segment_free, snapshot) and one `oom` near the end.
- `v1_13_list.pickle`: PyTorch 1.13, protocol 2: root is a bare list of segment dicts; blocks {size, state, [history]} with most-recent-first history {addr, real_size, frames}; some blocks without history (requested = size).
- `v2_0_history.pickle`: PyTorch 2.0, protocol 4: segment requested_size; blocks {size, requested_size, state, [history]} (one history record with a cpp_frames string); traces without time_us, one alloc entry with cpp_frames; frame keys in filename,name,line order with shared strings.
- `v2_1.pickle`: PyTorch 2.1, protocol 4: segment_pool_id tuple, is_expandable, frames on segments and blocks, block address; traces without time_us; segment_alloc/segment_free on normal segments and one expandable segment with segment_map/segment_unmap.
- `v2_2.pickle`: PyTorch 2.2, protocol 4: adds time_us (Unix epoch us, ~1.75e15); the first entry has time_us 0 (unknown time; first_time_us is the next one).
- `v2_3_settings.pickle`: PyTorch 2.3, protocol 4: allocator_settings with PYTORCH_CUDA_ALLOC_CONF 'expandable_segments:True,max_split_size_mb:128', max_split_size 134217728, garbage_collection_threshold 0.6 (BINFLOAT), 16 roundup_power2_divisions keys; expandable segments only (segment_map/unmap), C++ frames.
- `v2_8_compile.pickle`: PyTorch 2.8, protocol 4: external_annotations and compile_context ('N/A' or 'Torch-Compiled Region: 0/0'), FX `<eval_with_key>` frames.
- `v2_10_meta.pickle`: PyTorch 2.10, protocol 4: user_metadata strings, graph_capture_record_stream_reuse setting, an OOM (with segment_free of cached segments before it), 2 device slots (device 1 empty).
- `v2_12_pool.pickle`: PyTorch 2.12, protocol 4: forward_frames (list of str, 2.11+) on some trace entries and blocks, pool_id tuples on all trace entries, a private pool segment (segment_pool_id (1, 0)) with an active_pending_free block.
- `v2_14_host_p5.pickle`: PyTorch 2.14, PROTOCOL 5 (Python 3.14 default): host_segments (device -1, one block) and host_traces (flat list, ignored for devices), an `annotate` action, trace/segment stream 18446720620317114368 (>= 2**63, 9-byte LONG1), and an orphan free_completed at index 0 with addr 2**64-1 (re-interpreted -1; ring buffer wrapped).
- `multi_device.pickle`: PyTorch 2.6, protocol 4: 3 device_traces slots; devices 0 and 2 have segments and traces (device 2 has an OOM), device 1 is empty and must not be listed.
- `unknown_keys.pickle`: PyTorch 2.6, protocol 4: unknown top-level key, unknown segment/block/trace keys (incl. a None, a float and a nested tuple), and the nightly-only `user_defined` action (addr 0, size 0, frames [{'filename': 'ProfilerStep#1', 'name': 'START'|'END', 'line': 0}]).
- `empty.pickle`: PyTorch 2.3, protocol 4: segments [] and device_traces [[]] plus allocator_settings; no devices.
- `snapshot_gz.bin`: gzip (mtime 0) of a PyTorch 2.4 protocol-4 snapshot; the name does not end in .gz, so readers must sniff the 1f 8b magic.
- `snapshot_gz.pickle.gz`: the same bytes under a .gz name.
- `v2_5.json`: a PyTorch 2.5 snapshot as JSON (pool ids as 2-element arrays, 0.0 float), 2 device slots, an OOM and an active_pending_free block in private pool (0, 1).
- `cpp_pickler.pickle`: PyTorch 2.6 content with time_us written by our imitation of PyTorch's C++ pickler (`torch::cuda::_memory_snapshot_pickled`): PROTO 2, no FRAME; EMPTY_DICT MARK .. SETITEMS and EMPTY_LIST MARK .. APPENDS even when empty; every string BINUNICODE memoised by value (BINPUT/LONG_BINPUT then BINGET/LONG_BINGET); shared frames lists / frame dicts / empty list BINPUT then BINGET; BININT1 / BININT2 / BININT / LONG1 with 8-byte payload; TUPLE2 pool ids; BINFLOAT; NEWTRUE/NEWFALSE.
- `protocol2.pickle`: a PyTorch 2.4 snapshot dumped with pickle protocol 2 (BINPUT/LONG_BINPUT memo, BINUNICODE strings, no FRAME).
- `big_ints.pickle`: PyTorch 2.9 XPU-style snapshot: every address >= 2**63 (0xff000000_00200000 region, 9-byte LONG1) and a segment / trace stream 18446720620317114368.

- `hostile_strings.pickle`: PyTorch 2.10, protocol 4, whose strings hold terminal escape sequences: a frame name with CSI clear-screen and an OSC 0 window title, a file name with an OSC 8 hyperlink, `PYTORCH_CUDA_ALLOC_CONF` with hidden-text CSI, a C1 CSI (U+009B), CR and DEL, an unknown action named with cursor moves, annotation names with a C1 OSC (U+009D .. U+009C) and backspace, user_metadata with an OSC 52 clipboard write and U+E000, compile_context like the frame name; a 64 MiB allocation and an OOM with that stack. Text output must show them as visible escapes.

- `sample_viz.html`: the HTML page `torch.cuda._memory_viz trace_plot` writes, holding `sample.pickle` (padded with NUL bytes to a multiple of 3, base64 in `local_files`); no `.expected.json`: its figures are those of `sample.pickle`.

## categories/: one rule of the categories each (tests/categories.rs)

Parameters of 4 x 4 MiB, 2 x (2 MiB + 4 KiB) and 3 x 8 KiB, activations of 3 MiB, a 64 MiB
optimizer temporary at each step's peak:

- `categories/steal.pickle`: PyTorch 2.6, stacks="all": torch modules, AdamW (moments made by its first step, foreach temporaries), two steps of zero_grad(set_to_none) / forward / backward / step with the Optimizer annotations; each gradient is the output of `MmBackward0::apply` kept as `.grad` (no AccumulateGrad frame).
- `categories/compiled.pickle`: PyTorch 2.5, Python stacks: the user's modules, a forward and a backward through inductor's generated modules (`/tmp/torchinductor_alice/.../c<hash>.py`), gradients made by the compiled backward.
- `categories/own_optimizer.pickle`: PyTorch 2.6, Python stacks: the user's modules (`layers.py`, `__init__` and `forward`) and optimizer (`my_optimizer.py`: moments made in `__init__`, replaced by each `step`), two steps; backward on the engine's thread (no frames).
- `categories/old_moments.pickle`: the same, recording started after the first step: parameters, gradients and moments come from before the trace (blocks without frames); the recorded step accumulates into the gradients and replaces the moments.
- `categories/forward_only.pickle`: PyTorch 2.5: the model built before recording started, then two forwards.
- `categories/kv_cache.pickle`: PyTorch 2.6: greedy decoding, 2 layers, a 16-token prompt and 8 steps, each step copying every layer's keys and values into a tensor one token (64 KiB) longer and freeing the old one.
- `categories/attention_bench.pickle`: PyTorch 2.6: an attention benchmark (`benchmark_attention.py`) with no module: Q, K, V (2 MiB each) made before recording, triton `do_bench`'s 16 MiB cache-flush buffer, then two calls of the script's own `annotated_scaled_dot_product_attention`: 32 MiB scores, 32 MiB weights, a 2 MiB output, each freed (sequence length 512).
- `categories/attention_backward.pickle`: PyTorch 2.6, Python stacks: the same benchmark's forward and backward, no module: Q, K, V (2 MiB each) made by the script; twice: 32 MiB scores (freed by the script), 32 MiB weights (saved for backward, freed by the engine), a 2 MiB output and its 4-byte sum; `backward()`'s 4-byte seed, then on the engine's thread (no frames) the gradients of the output (2 MiB), the weights (32 MiB) and the scores (32 MiB, the peak), Q's and K's (2 MiB each), all freed in backward; the script then frees the output and its sum.
- `categories/autocast_no_frames.pickle`: PyTorch 2.6, Python stacks only (no C++ frame shows autocast): the model (`CAT_PARAMS`, fp32) built before recording, two inference forwards under autocast: per linear weight (the four of 4 MiB and two of 2 MiB + 4 KiB) its half-precision copy and a 1.5 MiB output, a 2 MiB activation (half a 4 MiB weight) made and freed after the first layer, a 1.5 MiB final output; the copies freed when the autocast region ends.
- `categories/fp32_half_weight_output.pickle`: the same forward without autocast: no copies, 3 MiB outputs, and a final output of 2 MiB (half a 4 MiB weight) alive to the forward's end.

## budget/: one synthetic model at several sizes (tests/budget.rs)

The parameters of `categories/`, 2 layers; each run builds the model, runs a step
(forward, backward, AdamW with the Optimizer annotations) and a second forward, whose end
is the peak: weights, gradients, two moments per parameter, and per layer two activations
of 16 KiB a token, attention scores of 32 bytes a (token, token) pair and an output of
8 KiB a token.

- `budget/batch_bs{1,2,4,8}.pickle`: sequence length 128, batch 1, 2, 4, 8.
- `budget/seq_ctx{128,256,512,1024}.pickle`: batch 2, sequence length 128 to 1024.
- `budget/seq_ctx512_bf16.pickle`: the 512 run again, its name stating another precision.
- `budget/ws_seq{512,1024}.pickle`: the `seq_ctx` runs at 512 and 1024 tokens whose first layer's attention also makes an 8 MiB workspace in each forward, freed with the activations: with `seq_ctx128` and `seq_ctx256`, a series whose allocations match in order but not one to one (two more in the larger runs).
- `budget/steps.pickle`: the `seq_ctx` model trained five steps, one per batch of 512, 448, 512, 384 and 512 tokens (batch 2): after the first, the steps' peaks differ by the activations of 384 and 512 tokens.
- `budget/seq_ctx512_rerun.pickle`: `seq_ctx512` again, its loss 8 MiB rather than 4 bytes (a repeat of the size that reserves more).
- `budget/bxs_bs{1,2,2,1,4}_seq{128,128,256,512,512}.pickle`: the `seq_ctx` run at five batch × sequence shapes; the first four are a series that varies both (three sequence lengths), the last the shape to predict (batch 4, 512 tokens).
- `budget/moving_seq{128,256,512,1024}.pickle`: the `seq_ctx` runs with an optimizer step that makes 8 temporary copies of the parameters (160 MiB): up to 512 tokens the peak is in the optimizer step (the forward's activations, 160 KiB a token and 128 bytes a token pair, are smaller); at 1024 (288 MiB of activations) it is at the end of the second forward.
- `budget/shuffled_seq{128,256,384,512}.pickle`: PyTorch 2.6: before recording, the weights (`CAT_PARAMS`: four of 4 MiB, two of 2 MiB + 4 KiB, three of 8 KiB) made in a shuffled order of each run's own (their addresses in another order in every file) and three inputs of the sequence length x 4 KiB; then two forwards, each with scores of length x length x 64 bytes and an output of length x 4 KiB, both freed. The peak: the weights, the inputs, one forward's scores and output.
- `budget/stale_seq{128,256,384,512}.pickle`: the same workload, each file from a process that first ran every smaller length of the list (inputs made, two forwards, inputs freed), so that recording starts with their segments cached.
- `budget/attn_seq{128,256,512}.pickle`: `categories/attention_bench.pickle` at sequence lengths 128 to 512: Q, K, V and the output 4 KiB a token, scores and weights 128 bytes a (token, token) pair, the 16 MiB flush buffer constant.
- `budget/autocast_bs{1,2,4}.pickle`: `categories/autocast_no_frames.pickle` at batch sizes 1, 2 and 4: the copies of the weights (10 MiB + 4 KiB) the same at every batch, the outputs 1.5 MiB a sample.

## Bad fixtures (`bad/`, must be rejected with a clean error, never a panic)

- `bad/empty.pickle`: 0 bytes.
- `bad/truncated.pickle`: the first half of sample.pickle (no STOP).
- `bad/random.bin`: 4096 bytes from random.Random(7).randbytes.
- `bad/list_of_ints.pickle`: a valid pickle whose root is a list of ints, not segments.
- `bad/tensor_meta.pickle`: a valid pickle of a dict of tensor metadata ({'layer.weight': {'shape': [...], 'dtype': ..., 'device': 'cuda:0'}, ...}), not a snapshot.
- `bad/os_system.pickle`: protocol 2 GLOBAL 'os system' + BINUNICODE 'touch /tmp/vramlens_pwned' + TUPLE1 + REDUCE + STOP. Must be refused without executing anything (check /tmp/vramlens_pwned does not appear).
- `bad/wrong_type.pickle`: a valid PyTorch 2.2 snapshot where device_traces[0][17]['size'] is the str '4096'.
- `bad/chrome_trace.json`: a small Kineto/Chrome trace (schemaVersion 1, 'X' events and 3 "[memory]" instant events with Device Type / Device Id / Addr / Bytes / Total Allocated / Total Reserved): a different format, not a snapshot.
- `bad/deep_nesting.pickle.gz`: gzip of PROTO 2, 1,000,000 EMPTY_LIST, 999,999 APPEND, STOP (1,000,000-deep nested lists; decompresses to ~2 MB): tests recursion limits.
- `bad/bad_memo.pickle`: protocol 4 with a BINGET 7 of a memo slot never stored.
- `bad/segments_not_list.pickle`: root dict whose 'segments' is an int.

## gpu/: our own recordings on a GPU

Made by `scripts/gpu_capture_check.py` on one NVIDIA H200 (139.80 GiB, driver 580.159.04)
with PyTorch 2.11.0+cu130, Python 3.12, through `scripts/vramlens_capture.py`
(`versions.json` has the details). Each job ran in a fresh process:

- `ok/`: a 4-layer MLP (width 4096, bf16) trained 5 steps; `snapshot.pickle`, `nvml.jsonl`.
- `oom/`: the same, then an evaluation loop that keeps its autograd graphs alive until the
  device is full; `oom_snapshot.pickle` (dumped by the OOM observer), `snapshot.pickle`
  (after the exception), `oom.log` (the PyTorch 2.11 OOM message), `nvml.jsonl`.
- `oom_exp/`: the same leak with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.
- `oom_cap/`: the same leak under `torch.cuda.set_per_process_memory_fraction(0.05)`.
- `nvsmi_gpu.csv`, `nvsmi_apps.csv`: `nvidia-smi --query-gpu=timestamp,index,uuid,memory.used,memory.total`
  and `--query-compute-apps=timestamp,gpu_uuid,pid,used_memory` (`--format=csv -lms 200`)
  over all four jobs.

`*.expected.json` beside each snapshot: `scripts/expected.py` (independent figures).

## allocator/

One snapshot per mechanism of PyTorch's caching allocator (split rules, `max_split_size_mb`,
garbage collection under a memory fraction, expandable segments, frees that wait for other
streams, the out-of-memory retry), written by `scripts/gen_allocator_fixtures.py`: each
trace entry worked out by hand from the allocator's algorithm, beside it in the script.
`tests/allocator_fixtures.rs` and `tests/simulate.rs` check that the allocator model
reproduces every entry, and the what-ifs worked out there.
"""


if __name__ == "__main__":
    main()
