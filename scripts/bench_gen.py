#!/usr/bin/env python3
"""Generate a large, realistic PyTorch CUDA memory snapshot pickle for benchmarks.

    python3 scripts/bench_gen.py --size-mb 300 -o bench-data/snap_300m.pickle
    python3 scripts/bench_gen.py --size-mb 300 --gzip -o bench-data/snap_300m.pickle.gz
    python3 scripts/bench_gen.py --size-mb 30 --verify -o bench-data/snap_30m.pickle

What it models (PyTorch 2.10, `_record_memory_history(stacks="all")`, Python 3.8-3.13
`pickle.dump`, protocol 4):

* One training step of a decoder-only transformer is simulated against a small model of
  the CUDA caching allocator (512-byte rounding, small/large pools, 2 MiB / 20 MiB /
  rounded large segments, best-fit, splitting, coalescing): forward activations
  allocated (temporaries freed right away), backward frees the saved activations and
  allocates gradients, AdamW foreach step allocates/frees temporaries, then
  `zero_grad(set_to_none=True)` and `torch.cuda.empty_cache()` (segment_free of every
  segment).  That step is a *tile*; the trace is N tiles, each with its addresses
  shifted to a fresh VA range and its time_us shifted by one step period.  The last
  tile stops before zero_grad/empty_cache, so the final `segments` list (the last
  tile's segments, plus segments holding parameters and optimizer state that were
  allocated before recording started) is consistent with the trace: contiguous
  blocks, sums, states, block frames = the frames of the alloc that made them.
* 12-layer decoder (every 4th layer local attention with a mask, every other layer a
  top-2 MoE MLP, layers 5 and 11 activation-checkpointed, i.e. recomputed during
  backward from the autograd thread), grad-norm clipping, AdamW foreach step.
  392 distinct tracebacks, 18-83 frames (median 57; 31 on average per trace entry,
  since autograd-thread stacks are short), mixing Python frames and C++ frames
  ('??'/'' file names, line 0, `_PyEval_EvalFrameDefault` interleaving, autograd
  device-thread stacks with no Python frames at all).  428 distinct frame dicts.
* Trace entry keys in 2.10 order: action, addr, size, stream, time_us,
  compile_context ('N/A'), user_metadata (''), frames.
* Object sharing as PyTorch's dumper produces it: every dict-key string and action /
  state string is one object (written once, then BINGET/LONG_BINGET); one frame dict
  per distinct frame (C++ frames are per return address, so equal-looking frames
  such as `_PyEval_EvalFrameDefault` exist as several dicts); 'N/A' is a new str per
  entry (written inline every time); '' and 1-character strings are CPython
  singletons (shared); pool-id tuples are new per segment; file/function-name
  strings are new per frame dict; one shared empty list for every frame-less
  block/segment.  Frame *lists*, with --sharing:
    capture   (default, what torch really writes): one list per captured context.
              alloc has its own list (also used by a segment_alloc it triggered and
              by its block in `segments`); free_requested+free_completed share the
              free's list; all segment_free of one empty_cache share one list.
              Verified against real 2.5 and 2.10 files: thousands of list objects
              with only ~100-250 distinct contents.
    traceback one list object per distinct traceback content, written once and
              referenced everywhere after (smaller files, cheaper to parse).

The pickle is written STREAMING by a small protocol-4 writer that follows CPython's C
pickler byte for byte (FRAME of >= 64 KiB committed at the start of the first save()
past the target, MEMOIZE after every str/dict/list/tuple, SETITEMS/APPENDS batches of
1000, single-element containers via SETITEM/APPEND, BINGET below index 256 and
LONG_BINGET above).  Memory use stays small (only shared objects are memoised);
`--verify` loads the result and checks `pickle.dumps(pickle.load(f), protocol=4)` is
identical to the file (use it on small sizes: a 30 MB file needs ~1 GB of RAM).

Numbers (default model, capture sharing): 12408 trace entries per tile, ~176 bytes
per trace entry (real 2.5-era stacks="all" file: 169), 397 final segments / 716
blocks; --sharing traceback: ~80 bytes per entry.  The size lands within one tile
(~2.2 MB) of --size-mb.  Speed: ~2.2 s per 100 MB, ~25 MB RSS, any size.
Stdlib only.
"""

import argparse
import gzip
import os
import random
import sys
import time

from pickle_bytes import FRAME_TARGET, MEMOIZE, Frames, enc_get, enc_int, pack_f64, pack_u32

MIB = 1 << 20
KIB = 1 << 10

# --------------------------------------------------------------------------------------
# pickle byte helpers (CPython C pickler, protocol 4)
# --------------------------------------------------------------------------------------

EMPTY_DICT_M = b'}\x94'
EMPTY_LIST_M = b']\x94'
MARK = b'('
SETITEM = b's'
SETITEMS = b'u'
APPEND = b'a'
APPENDS = b'e'
TUPLE2 = b'\x86'
NEWTRUE = b'\x88'
NEWFALSE = b'\x89'


def enc_str(s):
    """save_unicode() + memo_put() (the caller accounts for the memo slot)."""
    data = s.encode('utf-8', 'surrogatepass')
    n = len(data)
    if n < 256:
        return b'\x8c' + bytes((n,)) + data + MEMOIZE
    if n >= FRAME_TARGET:
        raise ValueError('strings >= 64 KiB bypass framing; not supported here')
    return b'X' + pack_u32(n) + data + MEMOIZE


def is_singleton_str(s):
    # CPython keeps '' and 1-character latin-1 strings as singletons, so torch's
    # py::str for them (and the unpickler) always yields the same object.
    return len(s) == 0 or (len(s) == 1 and ord(s) < 256)


class CountingSink:
    def __init__(self):
        self.n = 0

    def write(self, b):
        self.n += len(b)
        return len(b)


class PickleStream(Frames):
    """Streaming protocol-4 writer.  Content is handed over as lists of byte 'parts';
    each part starts where CPython's save() would start an object (the only places the
    C pickler commits a frame).  Trailing opcodes (SETITEMS, APPENDS, TUPLE2...) are
    glued onto the previous part; leading MARKs onto the part that opens a container."""

    def __init__(self, fh):
        super().__init__(fh)
        self.memo_n = 0          # number of memo slots used so far
        self.shared = {}         # key -> memo index, for objects referenced again
        self.gets = {}           # key -> cached BINGET/LONG_BINGET bytes

    # -- framing
    def emit(self, parts):
        data = b''.join(parts)
        frame = self.frame
        if len(frame) + len(data) <= FRAME_TARGET:
            frame += data
            return
        start = 0
        off = 0
        for p in parts:
            if len(self.frame) + (off - start) >= FRAME_TARGET:
                self.frame += data[start:off]
                self.commit()
                start = off
            off += len(p)
        self.frame += data[start:]

    def raw(self, b):
        """bytes that do not start a save() (MARK before a batch, APPENDS, ...)."""
        self.frame += b

    # -- memo helpers (return bytes; they must be emitted in the order they are made)
    def new_slot(self):
        i = self.memo_n
        self.memo_n += 1
        return i

    def ref(self, key):
        return self.gets.get(key)

    def define(self, key):
        i = self.memo_n
        self.memo_n += 1
        self.shared[key] = i
        return i

    def shared_str(self, s, key=None):
        """A string object shared across the whole snapshot (dict keys, actions...)."""
        if key is None:
            key = ('s', s)
        g = self.gets.get(key)
        if g is not None:
            return g
        i = self.define(key)
        self.gets[key] = enc_get(i)
        return enc_str(s)

    def fresh_str(self, s):
        """A new str object (not shared) -- unless CPython makes it a singleton."""
        if is_singleton_str(s):
            return self.shared_str(s, ('s1', s))
        self.memo_n += 1
        return enc_str(s)


def stream_list(w, count, item_iter):
    """Write a list of `count` items, pulling item emitters lazily (batches of 1000).
    item_iter yields callables that emit one item each."""
    w.memo_n += 1
    w.emit([EMPTY_LIST_M])
    if count == 0:
        return
    if count == 1:
        next(item_iter)()
        w.raw(APPEND)
        return
    done = 0
    while done < count:
        w.raw(MARK)
        batch = min(1000, count - done)
        for _ in range(batch):
            next(item_iter)()
        w.raw(APPENDS)
        done += batch


# --------------------------------------------------------------------------------------
# traceback catalog
# --------------------------------------------------------------------------------------

SITE = '/opt/conda/envs/train/lib/python3.11/site-packages'
MODULE_PY = SITE + '/torch/nn/modules/module.py'
FUNCTIONAL_PY = SITE + '/torch/nn/functional.py'
ADAMW_PY = SITE + '/torch/optim/adamw.py'
ADAM_PY = SITE + '/torch/optim/adam.py'
OPTIM_PY = SITE + '/torch/optim/optimizer.py'
TENSOR_PY = SITE + '/torch/_tensor.py'
AUTOGRAD_PY = SITE + '/torch/autograd/__init__.py'
GRAPH_PY = SITE + '/torch/autograd/graph.py'
CUDA_MEM_PY = SITE + '/torch/cuda/memory.py'
PROFILER_PY = SITE + '/torch/autograd/profiler.py'
MODEL_PY = '/workspace/nanollm/nanollm/model.py'
ROTARY_PY = '/workspace/nanollm/nanollm/rotary.py'
TRAIN_PY = '/workspace/nanollm/train.py'
CKPT_PY = SITE + '/torch/utils/checkpoint.py'


class Catalog:
    """Distinct frames (by identity key) and distinct tracebacks (tuples of frame ids)."""

    def __init__(self):
        self.frames = []          # fid -> (name, filename, line)
        self.frame_ids = {}       # (name, filename, line, variant) -> fid
        self.tbs = []             # tb id -> tuple of fids
        self.tb_ids = {}

    def f(self, name, filename='??', line=0, variant=0):
        key = (name, filename, line, variant)
        fid = self.frame_ids.get(key)
        if fid is None:
            fid = len(self.frames)
            self.frame_ids[key] = fid
            self.frames.append((name, filename, line))
        return fid

    def tb(self, fids):
        t = tuple(fids)
        assert len(t) >= 2, 'frames lists are written with MARK ... APPENDS'
        i = self.tb_ids.get(t)
        if i is None:
            i = len(self.tbs)
            self.tb_ids[t] = i
            self.tbs.append(t)
        return i


def cpp(name, filename='??'):
    return (name, filename)


ALLOC_PROLOGUE = [
    cpp('torch::unwind::unwind()'),
    cpp('torch::CapturedTraceback::gather(bool, bool, bool)'),
    cpp('torch::cuda::(anonymous namespace)::gather_with_cpp()', 'memory_snapshot.cpp'),
    cpp('c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, CUstream_st*)', 'CUDACachingAllocator.cpp'),
    cpp('c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, unsigned long, CUstream_st*)', ''),
    cpp('c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)', ''),
]
EMPTY_CHAIN = [
    cpp('at::TensorBase at::detail::_empty_strided_generic<c10::ArrayRef<long> >(c10::ArrayRef<long>, c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType)', ''),
    cpp('at::detail::empty_strided_cuda(c10::ArrayRef<long>, c10::ArrayRef<long>, c10::ScalarType, std::optional<c10::Device>)'),
    cpp('at::detail::empty_strided_cuda(c10::ArrayRef<long>, c10::ArrayRef<long>, c10::TensorOptions const&)'),
]
FREE_PROLOGUE = [
    cpp('torch::unwind::unwind()'),
    cpp('torch::CapturedTraceback::gather(bool, bool, bool)'),
    cpp('torch::cuda::(anonymous namespace)::gather_with_cpp()', 'memory_snapshot.cpp'),
    cpp('c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free(c10::cuda::CUDACachingAllocator::Native::(anonymous namespace)::Block*)', 'CUDACachingAllocator.cpp'),
    cpp('c10::cuda::CUDACachingAllocator::Native::local_raw_delete(void*)', 'CUDACachingAllocator.cpp'),
    cpp('c10::StorageImpl::~StorageImpl()', ''),
    cpp('c10::intrusive_ptr<c10::StorageImpl, c10::detail::intrusive_target_default_null_type<c10::StorageImpl> >::reset_()', ''),
    cpp('c10::TensorImpl::~TensorImpl()'),
]
PY_DEALLOC = [
    cpp('c10::TensorImpl::~TensorImpl() [clone .localalias]', 'TensorImpl.cpp'),
    cpp('THPVariable_subclass_clear(THPVariable*)', 'python_variable.cpp'),
    cpp('THPVariable_subclass_dealloc(_object*)'),
]
PY_TAIL = [cpp(n) for n in (
    'PyEval_EvalCode', 'run_mod', 'pyrun_file', '_PyRun_SimpleFileObject',
    'Py_RunMain', 'Py_BytesMain', '__libc_start_main', '_start')]
GLUE = {
    'method': [],
    'prepend': [cpp('_PyObject_Call_Prepend'), cpp('slot_tp_call')],
    'vector': [cpp('method_vectorcall')],
    'func': [],
    'none': [],
}
AUTOGRAD_THREAD = [
    cpp('torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)', 'function.h'),
    cpp('torch::autograd::call_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&)', 'engine.cpp'),
    cpp('torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)'),
    cpp('torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)', 'engine.cpp'),
    cpp('torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)', 'engine.cpp'),
    cpp('torch::autograd::python::PythonEngine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)', 'python_engine.cpp'),
    cpp('execute_native_thread_routine'),
    cpp('start_thread'),
    cpp('__clone3'),
]

# forward op kinds: name -> (op chain innermost first, python binding)
OPS = {
    'mm': (['at::(anonymous namespace)::structured_mm_out_cuda_functional::set_output_raw_strided(long, c10::ArrayRef<long>, c10::ArrayRef<long>, c10::TensorOptions, c10::ArrayRef<at::Dimname>)',
            'at::meta::structured_mm::meta(at::Tensor const&, at::Tensor const&)',
            'at::(anonymous namespace)::wrapper_CUDA_mm(at::Tensor const&, at::Tensor const&)',
            'at::_ops::mm::redispatch(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&)',
            'torch::autograd::VariableType::(anonymous namespace)::mm(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&)',
            'at::_ops::mm::call(at::Tensor const&, at::Tensor const&)',
            'at::native::_matmul_impl(at::Tensor&, at::Tensor const&, at::Tensor const&)',
            'at::native::matmul(at::Tensor const&, at::Tensor const&)',
            'at::native::linear(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&)',
            'at::_ops::linear::call(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&)'],
           'torch::autograd::THPVariable_linear(_object*, _object*, _object*)'),
    'mul': (['at::TensorIteratorBase::build(at::TensorIteratorConfig&)',
             'at::meta::structured_mul_Tensor::meta(at::Tensor const&, at::Tensor const&)',
             'at::(anonymous namespace)::wrapper_CUDA_mul_Tensor(at::Tensor const&, at::Tensor const&)',
             'at::_ops::mul_Tensor::redispatch(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&)',
             'torch::autograd::VariableType::(anonymous namespace)::mul_Tensor(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&)',
             'at::_ops::mul_Tensor::call(at::Tensor const&, at::Tensor const&)'],
            'torch::autograd::TypeError_to_NotImplemented_<&torch::autograd::THPVariable_mul>(_object*, _object*, _object*)'),
    'add': (['at::TensorIteratorBase::build(at::TensorIteratorConfig&)',
             'at::meta::structured_add_Tensor::meta(at::Tensor const&, at::Tensor const&, c10::Scalar const&)',
             'at::(anonymous namespace)::wrapper_CUDA_add_Tensor(at::Tensor const&, at::Tensor const&, c10::Scalar const&)',
             'at::_ops::add_Tensor::redispatch(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&, c10::Scalar const&)',
             'torch::autograd::VariableType::(anonymous namespace)::add_Tensor(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&, c10::Scalar const&)',
             'at::_ops::add_Tensor::call(at::Tensor const&, at::Tensor const&, c10::Scalar const&)'],
            'torch::autograd::TypeError_to_NotImplemented_<&torch::autograd::THPVariable_add>(_object*, _object*, _object*)'),
    'to': (['at::native::empty_strided_cuda(c10::ArrayRef<long>, c10::ArrayRef<long>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>)',
            'at::_ops::empty_strided::call(c10::ArrayRef<c10::SymInt>, c10::ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>)',
            'at::native::_to_copy(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, bool, std::optional<c10::MemoryFormat>)',
            'at::_ops::_to_copy::redispatch(c10::DispatchKeySet, at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, bool, std::optional<c10::MemoryFormat>)',
            'at::native::to(at::Tensor const&, c10::ScalarType, bool, bool, std::optional<c10::MemoryFormat>)',
            'at::_ops::to_dtype::call(at::Tensor const&, c10::ScalarType, bool, bool, std::optional<c10::MemoryFormat>)'],
           'torch::autograd::dispatch_to(at::Tensor const&, c10::ScalarType, bool, bool, std::optional<c10::MemoryFormat>)'),
    'pow': (['at::TensorIteratorBase::build(at::TensorIteratorConfig&)',
             'at::meta::structured_pow_Tensor_Scalar::meta(at::Tensor const&, c10::Scalar const&)',
             'at::(anonymous namespace)::wrapper_CUDA_pow_Tensor_Scalar(at::Tensor const&, c10::Scalar const&)',
             'at::_ops::pow_Tensor_Scalar::call(at::Tensor const&, c10::Scalar const&)'],
            'torch::autograd::THPVariable_pow(_object*, _object*, _object*)'),
    'mean': (['at::native::mean_out(at::Tensor const&, c10::OptionalArrayRef<long>, bool, std::optional<c10::ScalarType>, at::Tensor&)',
              'at::(anonymous namespace)::wrapper_CUDA_mean_dim(at::Tensor const&, c10::OptionalArrayRef<long>, bool, std::optional<c10::ScalarType>)',
              'at::_ops::mean_dim::call(at::Tensor const&, c10::OptionalArrayRef<long>, bool, std::optional<c10::ScalarType>)'],
             'torch::autograd::THPVariable_mean(_object*, _object*, _object*)'),
    'rsqrt': (['at::TensorIteratorBase::build_borrowing_unary_op(at::TensorBase const&, at::TensorBase const&)',
               'at::(anonymous namespace)::wrapper_CUDA_rsqrt(at::Tensor const&)',
               'at::_ops::rsqrt::call(at::Tensor const&)'],
              'torch::autograd::THPVariable_rsqrt(_object*, _object*, _object*)'),
    'view_as_complex_mul': (['at::TensorIteratorBase::build(at::TensorIteratorConfig&)',
                             'at::(anonymous namespace)::wrapper_CUDA_mul_Tensor(at::Tensor const&, at::Tensor const&)',
                             'at::_ops::mul_Tensor::call(at::Tensor const&, at::Tensor const&)'],
                            'torch::autograd::TypeError_to_NotImplemented_<&torch::autograd::THPVariable_mul>(_object*, _object*, _object*)'),
    'flatten': (['at::native::clone(at::Tensor const&, std::optional<c10::MemoryFormat>)',
                 'at::_ops::clone::call(at::Tensor const&, std::optional<c10::MemoryFormat>)',
                 'at::native::reshape_symint(at::Tensor const&, c10::ArrayRef<c10::SymInt>)',
                 'at::native::flatten(at::Tensor const&, long, long)',
                 'at::_ops::flatten_using_ints::call(at::Tensor const&, long, long)'],
                'torch::autograd::THPVariable_flatten(_object*, _object*, _object*)'),
    'contiguous': (['at::native::clone(at::Tensor const&, std::optional<c10::MemoryFormat>)',
                    'at::_ops::clone::call(at::Tensor const&, std::optional<c10::MemoryFormat>)',
                    'at::native::contiguous(at::Tensor const&, c10::MemoryFormat)',
                    'at::_ops::contiguous::call(at::Tensor const&, c10::MemoryFormat)'],
                   'torch::autograd::THPVariable_contiguous(_object*, _object*, _object*)'),
    'sdpa': (['at::native::_flash_attention_forward(at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, std::optional<at::Tensor> const&, long, long, double, bool, bool, std::optional<double>, std::optional<long>, std::optional<long>, std::optional<at::Tensor> const&, std::optional<at::Tensor> const&)',
              'at::native::_scaled_dot_product_flash_attention_cuda(at::Tensor const&, at::Tensor const&, at::Tensor const&, double, bool, bool, std::optional<double>)',
              'at::_ops::_scaled_dot_product_flash_attention::redispatch(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&, at::Tensor const&, double, bool, bool, std::optional<double>)',
              'torch::autograd::VariableType::(anonymous namespace)::_scaled_dot_product_flash_attention(c10::DispatchKeySet, at::Tensor const&, at::Tensor const&, at::Tensor const&, double, bool, bool, std::optional<double>)',
              'at::native::scaled_dot_product_attention(at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, double, bool, std::optional<double>, bool)',
              'at::_ops::scaled_dot_product_attention::call(at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, double, bool, std::optional<double>, bool)'],
             'torch::autograd::THPVariable_scaled_dot_product_attention(_object*, _object*, _object*)'),
    'sdpa_mem': (['at::native::_efficient_attention_forward(at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, std::optional<at::Tensor> const&, std::optional<at::Tensor> const&, std::optional<long>, std::optional<long>, double, long, bool, std::optional<double>, std::optional<at::Tensor> const&, std::optional<long>)',
                  'at::native::_scaled_dot_product_efficient_attention_cuda(at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, bool, double, bool, std::optional<double>)',
                  'at::_ops::_scaled_dot_product_efficient_attention::call(at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, bool, double, bool, std::optional<double>)',
                  'at::native::scaled_dot_product_attention(at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, double, bool, std::optional<double>, bool)',
                  'at::_ops::scaled_dot_product_attention::call(at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, double, bool, std::optional<double>, bool)'],
                 'torch::autograd::THPVariable_scaled_dot_product_attention(_object*, _object*, _object*)'),
    'ones': (['at::native::full(c10::ArrayRef<long>, c10::Scalar const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>)',
              'at::native::ones(c10::ArrayRef<long>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>)',
              'at::_ops::ones::call(c10::ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>)'],
             'torch::autograd::THPVariable_ones(_object*, _object*, _object*)'),
    'tril': (['at::native::tril_cuda(at::Tensor const&, long)',
              'at::_ops::tril::call(at::Tensor const&, long)'],
             'torch::autograd::THPVariable_tril(_object*, _object*, _object*)'),
    'embedding': (['at::native::index_select_out_cuda(at::Tensor const&, long, at::Tensor const&, at::Tensor&)',
                   'at::native::index_select_cuda(at::Tensor const&, long, at::Tensor const&)',
                   'at::_ops::index_select::call(at::Tensor const&, long, at::Tensor const&)',
                   'at::native::embedding_symint(at::Tensor const&, at::Tensor const&, c10::SymInt, bool, bool)',
                   'at::_ops::embedding::call(at::Tensor const&, at::Tensor const&, c10::SymInt, bool, bool)'],
                  'torch::autograd::THPVariable_embedding(_object*, _object*, _object*)'),
    'log_softmax': (['at::meta::structured__log_softmax::meta(at::Tensor const&, long, bool)',
                     'at::(anonymous namespace)::wrapper_CUDA__log_softmax(at::Tensor const&, long, bool)',
                     'at::_ops::_log_softmax::call(at::Tensor const&, long, bool)',
                     'at::native::log_softmax(at::Tensor const&, long, std::optional<c10::ScalarType>)',
                     'at::native::cross_entropy_loss_symint(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, c10::SymInt, double)',
                     'at::_ops::cross_entropy_loss::call(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, c10::SymInt, double)'],
                    'torch::autograd::THPVariable_cross_entropy_loss(_object*, _object*, _object*)'),
    'nll': (['at::meta::structured_nll_loss_forward::meta(at::Tensor const&, at::Tensor const&, at::OptionalTensorRef, long, long)',
             'at::(anonymous namespace)::wrapper_CUDA_nll_loss_forward(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, long)',
             'at::_ops::nll_loss_forward::call(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, c10::SymInt)',
             'at::native::nll_loss_nd_symint(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, c10::SymInt)',
             'at::native::cross_entropy_loss_symint(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, c10::SymInt, double)',
             'at::_ops::cross_entropy_loss::call(at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, c10::SymInt, double)'],
            'torch::autograd::THPVariable_cross_entropy_loss(_object*, _object*, _object*)'),
    'copy_h2d': (['at::native::empty_cuda(c10::ArrayRef<long>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)',
                  'at::native::_to_copy(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, bool, std::optional<c10::MemoryFormat>)',
                  'at::_ops::_to_copy::call(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, bool, std::optional<c10::MemoryFormat>)',
                  'at::native::to(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, bool, bool, std::optional<c10::MemoryFormat>)'],
                 'torch::autograd::THPVariable_to(_object*, _object*, _object*)'),
}
BACKWARD_NODES = {
    'mm': ('torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
           ['at::native::mm_out_cuda(at::Tensor const&, at::Tensor const&, at::Tensor&)',
            'at::(anonymous namespace)::wrapper_CUDA_mm(at::Tensor const&, at::Tensor const&)',
            'at::_ops::mm::call(at::Tensor const&, at::Tensor const&)',
            'torch::autograd::generated::details::mm_mat1_backward(at::Tensor const&, at::Tensor const&, c10::ArrayRef<c10::SymInt>, c10::ArrayRef<c10::SymInt>, c10::Layout, c10::Scalar const&)']),
    'mm_w': ('torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
             ['at::native::mm_out_cuda(at::Tensor const&, at::Tensor const&, at::Tensor&)',
              'at::(anonymous namespace)::wrapper_CUDA_mm(at::Tensor const&, at::Tensor const&)',
              'at::_ops::mm::call(at::Tensor const&, at::Tensor const&)',
              'torch::autograd::generated::details::mm_mat2_backward(at::Tensor const&, at::Tensor const&, c10::ArrayRef<c10::SymInt>, c10::ArrayRef<c10::SymInt>, c10::Layout, c10::Scalar const&)']),
    'mul': ('torch::autograd::generated::MulBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
            ['at::(anonymous namespace)::wrapper_CUDA_mul_Tensor(at::Tensor const&, at::Tensor const&)',
             'at::_ops::mul_Tensor::call(at::Tensor const&, at::Tensor const&)',
             'torch::autograd::generated::details::mul_tensor_backward(at::Tensor const&, at::Tensor const&, c10::ScalarType)']),
    'add': ('torch::autograd::generated::AddBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
            ['at::(anonymous namespace)::wrapper_CUDA_add_Tensor(at::Tensor const&, at::Tensor const&, c10::Scalar const&)',
             'at::_ops::add_Tensor::call(at::Tensor const&, at::Tensor const&, c10::Scalar const&)',
             'torch::autograd::InputBuffer::add(unsigned long, at::Tensor, std::optional<c10::Stream> const&, std::optional<c10::Stream> const&)']),
    'to': ('torch::autograd::generated::ToCopyBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
           ['at::native::_to_copy(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, bool, std::optional<c10::MemoryFormat>)',
            'at::_ops::_to_copy::call(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, bool, std::optional<c10::MemoryFormat>)',
            'torch::autograd::generated::details::_to_copy_backward(at::Tensor const&, c10::TensorOptions const&)']),
    'pow': ('torch::autograd::generated::PowBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
            ['at::(anonymous namespace)::wrapper_CUDA_pow_Tensor_Scalar(at::Tensor const&, c10::Scalar const&)',
             'torch::autograd::generated::details::pow_backward(at::Tensor, at::Tensor const&, c10::Scalar const&)']),
    'mean': ('torch::autograd::generated::MeanBackward1::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
             ['at::native::expand(at::Tensor const&, c10::ArrayRef<long>, bool)',
              'at::native::clone(at::Tensor const&, std::optional<c10::MemoryFormat>)',
              'torch::autograd::generated::details::mean_backward(at::Tensor const&, c10::ArrayRef<c10::SymInt>, c10::OptionalArrayRef<long>, c10::SymInt, bool)']),
    'rsqrt': ('torch::autograd::generated::RsqrtBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
              ['at::(anonymous namespace)::wrapper_CUDA_mul_Tensor(at::Tensor const&, at::Tensor const&)',
               'at::_ops::mul_Tensor::call(at::Tensor const&, at::Tensor const&)']),
    'view_as_complex_mul': ('torch::autograd::generated::MulBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
                            ['at::native::conj_physical(at::Tensor const&)',
                             'at::(anonymous namespace)::wrapper_CUDA_mul_Tensor(at::Tensor const&, at::Tensor const&)',
                             'torch::autograd::generated::details::mul_tensor_backward(at::Tensor const&, at::Tensor const&, c10::ScalarType)']),
    'flatten': ('torch::autograd::generated::ViewBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
                ['at::native::clone(at::Tensor const&, std::optional<c10::MemoryFormat>)',
                 'at::native::reshape_symint(at::Tensor const&, c10::ArrayRef<c10::SymInt>)']),
    'contiguous': ('torch::autograd::generated::CloneBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
                   ['at::native::clone(at::Tensor const&, std::optional<c10::MemoryFormat>)',
                    'at::_ops::clone::call(at::Tensor const&, std::optional<c10::MemoryFormat>)']),
    'sdpa': ('torch::autograd::generated::ScaledDotProductFlashAttentionBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
             ['at::native::_flash_attention_backward(at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, long, long, double, bool, at::Tensor const&, at::Tensor const&, std::optional<double>, std::optional<long>, std::optional<long>)',
              'at::native::_scaled_dot_product_flash_attention_backward_cuda(at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, long, long, double, bool, at::Tensor const&, at::Tensor const&, std::optional<double>)',
              'at::_ops::_scaled_dot_product_flash_attention_backward::call(at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, c10::SymInt, c10::SymInt, double, bool, at::Tensor const&, at::Tensor const&, std::optional<double>)']),
    'sdpa_mem': ('torch::autograd::generated::ScaledDotProductEfficientAttentionBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
                 ['at::native::_efficient_attention_backward(at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, std::optional<at::Tensor> const&, std::optional<at::Tensor> const&, at::Tensor const&, at::Tensor const&, std::optional<long>, std::optional<long>, double, at::Tensor const&, at::Tensor const&, long, bool, std::optional<double>, std::optional<long>, std::optional<long>, bool)',
                  'at::_ops::_efficient_attention_backward::call(at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<c10::SymInt>, std::optional<c10::SymInt>, double, at::Tensor const&, at::Tensor const&, long, bool, std::optional<double>, std::optional<long>, std::optional<long>, bool)']),
    'embedding': ('torch::autograd::generated::EmbeddingBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
                  ['at::native::embedding_dense_backward_cuda(at::Tensor const&, at::Tensor const&, long, long, bool)',
                   'at::_ops::embedding_dense_backward::call(at::Tensor const&, at::Tensor const&, c10::SymInt, c10::SymInt, bool)',
                   'at::native::embedding_backward_symint(at::Tensor const&, at::Tensor const&, c10::SymInt, c10::SymInt, bool, bool)']),
    'log_softmax': ('torch::autograd::generated::LogSoftmaxBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
                    ['at::(anonymous namespace)::wrapper_CUDA__log_softmax_backward_data(at::Tensor const&, at::Tensor const&, long, c10::ScalarType)',
                     'at::_ops::_log_softmax_backward_data::call(at::Tensor const&, at::Tensor const&, long, c10::ScalarType)']),
    'nll': ('torch::autograd::generated::NllLossBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
            ['at::native::zeros_like(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)',
             'at::(anonymous namespace)::wrapper_CUDA_nll_loss_backward(at::Tensor const&, at::Tensor const&, at::Tensor const&, std::optional<at::Tensor> const&, long, long, at::Tensor const&)']),
}
OPS.update({
    'softmax': (['at::meta::structured__softmax::meta(at::Tensor const&, long, bool)',
                 'at::(anonymous namespace)::wrapper_CUDA__softmax(at::Tensor const&, long, bool)',
                 'at::_ops::_softmax::call(at::Tensor const&, long, bool)',
                 'at::native::softmax(at::Tensor const&, long, std::optional<c10::ScalarType>)',
                 'at::_ops::softmax_int::call(at::Tensor const&, long, std::optional<c10::ScalarType>)'],
                'torch::autograd::THPVariable_softmax(_object*, _object*, _object*)'),
    'topk': (['at::meta::structured_topk::meta(at::Tensor const&, long, long, bool, bool)',
              'at::(anonymous namespace)::wrapper_CUDA_topk(at::Tensor const&, long, long, bool, bool)',
              'at::_ops::topk::call(at::Tensor const&, c10::SymInt, long, bool, bool)'],
             'torch::autograd::THPVariable_topk(_object*, _object*, _object*)'),
    'nonzero': (['at::native::nonzero_cuda(at::Tensor const&)',
                 'at::_ops::nonzero::call(at::Tensor const&)',
                 'at::native::where(at::Tensor const&)'],
                'torch::autograd::THPVariable_where(_object*, _object*, _object*)'),
    'index': (['at::native::index(at::Tensor const&, c10::List<std::optional<at::Tensor> > const&)',
               'at::(anonymous namespace)::wrapper_CUDA_index_Tensor(at::Tensor const&, c10::List<std::optional<at::Tensor> > const&)',
               'at::_ops::index_Tensor::call(at::Tensor const&, c10::List<std::optional<at::Tensor> > const&)'],
              'torch::autograd::THPVariable_getitem(_object*, _object*)'),
    'zeros': (['at::native::zeros_like(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)',
               'at::_ops::zeros_like::call(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)'],
              'torch::autograd::THPVariable_zeros_like(_object*, _object*, _object*)'),
    'index_add': (['at::native::index_add_cuda_impl(at::Tensor const&, long, at::Tensor const&, at::Tensor const&, c10::Scalar const&, at::Tensor const&)',
                   'at::(anonymous namespace)::wrapper_CUDA_index_add(at::Tensor const&, long, at::Tensor const&, at::Tensor const&, c10::Scalar const&)',
                   'at::_ops::index_add::call(at::Tensor const&, long, at::Tensor const&, at::Tensor const&, c10::Scalar const&)'],
                  'torch::autograd::THPVariable_index_add(_object*, _object*, _object*)'),
    'repeat_kv': (['at::native::repeat_interleave_symint(at::Tensor const&, c10::SymInt, std::optional<long>, std::optional<c10::SymInt>)',
                   'at::_ops::repeat_interleave_self_int::call(at::Tensor const&, c10::SymInt, std::optional<long>, std::optional<c10::SymInt>)'],
                  'torch::autograd::THPVariable_repeat_interleave(_object*, _object*, _object*)'),
    'stack': (['at::native::_stack_out_cuda(c10::ArrayRef<at::Tensor>, long, at::Tensor&)',
               'at::native::stack(c10::ArrayRef<at::Tensor>, long)',
               'at::_ops::stack::call(c10::ArrayRef<at::Tensor>, long)'],
              'torch::autograd::THPVariable_stack(_object*, _object*, _object*)'),
    'vector_norm': (['at::meta::structured_linalg_vector_norm::meta(at::Tensor const&, c10::Scalar const&, at::OptionalIntArrayRef, bool, std::optional<c10::ScalarType>)',
                     'at::(anonymous namespace)::wrapper_CUDA_linalg_vector_norm(at::Tensor const&, c10::Scalar const&, c10::OptionalArrayRef<long>, bool, std::optional<c10::ScalarType>)',
                     'at::_ops::linalg_vector_norm::call(at::Tensor const&, c10::Scalar const&, c10::OptionalArrayRef<long>, bool, std::optional<c10::ScalarType>)'],
                    'torch::autograd::THPVariable_linalg_vector_norm(_object*, _object*, _object*)'),
    'foreach_norm': (['at::native::foreach_tensor_norm_cuda(c10::ArrayRef<at::Tensor>, c10::Scalar const&, std::optional<c10::ScalarType>)',
                      'at::_ops::_foreach_norm_Scalar::call(c10::ArrayRef<at::Tensor>, c10::Scalar const&, std::optional<c10::ScalarType>)'],
                     'torch::autograd::THPVariable__foreach_norm(_object*, _object*, _object*)'),
    'clamp': (['at::meta::structured_clamp::meta(at::Tensor const&, at::OptionalScalarRef, at::OptionalScalarRef)',
               'at::(anonymous namespace)::wrapper_CUDA_clamp(at::Tensor const&, std::optional<c10::Scalar> const&, std::optional<c10::Scalar> const&)',
               'at::_ops::clamp::call(at::Tensor const&, std::optional<c10::Scalar> const&, std::optional<c10::Scalar> const&)'],
              'torch::autograd::THPVariable_clamp(_object*, _object*, _object*)'),
})
BACKWARD_NODES.update({
    'softmax': ('torch::autograd::generated::SoftmaxBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
                ['at::(anonymous namespace)::wrapper_CUDA__softmax_backward_data(at::Tensor const&, at::Tensor const&, long, c10::ScalarType)',
                 'at::_ops::_softmax_backward_data::call(at::Tensor const&, at::Tensor const&, long, c10::ScalarType)']),
    'topk': ('torch::autograd::generated::TopkBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
             ['at::native::zeros_symint(c10::ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>)',
              'torch::autograd::generated::details::value_selecting_reduction_backward_symint(at::Tensor const&, long, at::Tensor const&, c10::ArrayRef<c10::SymInt>, bool)']),
    'index': ('torch::autograd::generated::IndexBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
              ['at::native::zeros_symint(c10::ArrayRef<c10::SymInt>, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>)',
               'at::native::index_put_with_sort_kernel(at::Tensor&, c10::List<std::optional<at::Tensor> > const&, at::Tensor const&, bool, bool)',
               'torch::autograd::generated::details::index_backward(at::Tensor, c10::List<std::optional<at::Tensor> > const&, at::Tensor const&)']),
    'index_add': ('torch::autograd::generated::IndexAddBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
                  ['at::native::index_select_cuda(at::Tensor const&, long, at::Tensor const&)',
                   'at::_ops::index_select::call(at::Tensor const&, long, at::Tensor const&)']),
    'repeat_kv': ('torch::autograd::generated::RepeatInterleaveBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)',
                  ['at::native::sum_out(at::Tensor const&, c10::OptionalArrayRef<long>, bool, std::optional<c10::ScalarType>, at::Tensor&)',
                   'at::_ops::sum_dim_IntList::call(at::Tensor const&, c10::OptionalArrayRef<long>, bool, std::optional<c10::ScalarType>)']),
})
UNPACK_HOOK = [
    cpp('_PyObject_Call'),
    cpp('torch::autograd::PySavedVariableHooks::call_unpack_hook()', 'python_saved_variable_hooks.cpp'),
    cpp('torch::autograd::SavedVariable::unpack(std::shared_ptr<torch::autograd::Node>) const', 'saved_variable.cpp'),
    cpp('torch::autograd::generated::MulBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)', 'Functions.cpp'),
]
RELEASE_FRAMES = {
    'saved': [cpp('torch::autograd::SavedVariable::reset_data()', 'saved_variable.cpp'),
              cpp('torch::autograd::Node::release_variables()', '')],
    'buffer': [cpp('std::vector<at::Tensor, std::allocator<at::Tensor> >::~vector()', ''),
               cpp('torch::autograd::InputBuffer::~InputBuffer()', 'input_buffer.cpp')],
}

FOREACH = [
    ('_foreach_mul', 'at::native::foreach_tensor_mul_scalar_kernel_cuda(c10::ArrayRef<at::Tensor>, c10::Scalar const&)', 520),
    ('_foreach_sqrt', 'at::native::foreach_tensor_sqrt_cuda(c10::ArrayRef<at::Tensor>)', 566),
    ('_foreach_div', 'at::native::foreach_tensor_div_scalar_kernel_cuda(c10::ArrayRef<at::Tensor>, c10::Scalar const&)', 569),
    ('_foreach_add', 'at::native::foreach_tensor_add_scalar_kernel_cuda(c10::ArrayRef<at::Tensor>, c10::Scalar const&)', 571),
    ('_foreach_addcdiv', 'at::native::foreach_tensor_addcdiv_scalar_cuda(c10::ArrayRef<at::Tensor>, c10::ArrayRef<at::Tensor>, c10::ArrayRef<at::Tensor>, c10::Scalar const&)', 584),
    ('_foreach_neg', 'at::native::foreach_tensor_neg_cuda(c10::ArrayRef<at::Tensor>)', 559),
]


class TracebackBuilder:
    def __init__(self, cat):
        self.cat = cat
        self.eval_variant = 0

    def _cpp_list(self, items):
        return [self.cat.f(n, fn, 0) for (n, fn) in items]

    def _op_chain(self, op):
        chain, binding = OPS[op]
        out = []
        for i, name in enumerate(chain[:6]):
            # deterministic pseudo-random file name per function (as addr2line gives)
            h = sum(map(ord, name)) % 100
            fn = ('RegisterCUDA.cpp' if h < 30 else '' if h < 50 else
                  'VariableType_2.cpp' if 'VariableType' in name else '??')
            out.append((name, fn))
        out.append(('c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::WrapFunctionIntoFunctor_<c10::CompileTimeFunctionPointer<at::Tensor (at::Tensor const&), &at::(anonymous namespace)::%s>, at::Tensor, c10::guts::typelist::typelist<at::Tensor const&> >, at::Tensor (at::Tensor const&)>::call(c10::OperatorKernel*, c10::DispatchKeySet, at::Tensor const&)' % op, 'RegisterCUDA.cpp'))
        out.append((binding, 'python_variable_methods.cpp' if 'THPVariable_' in binding else '??'))
        out.append(('cfunction_call', '??'))
        return out

    def _python(self, pystack):
        """pystack: innermost first, list of (func, file, line, glue).  Returns fids,
        interleaving _PyEval_EvalFrameDefault/glue frames, and appends the outermost
        frames after the interpreter/libc tail the way torch's unwinder does."""
        cat = self.cat
        out = []
        on_autograd_thread = pystack[-1][0] == '@autograd'
        if on_autograd_thread:
            # Python called back from the autograd engine (checkpoint unpack hook)
            inner, outer = pystack[:-1], []
        else:
            inner = pystack[:-3] if len(pystack) > 4 else pystack[:-1]
            outer = pystack[len(inner):]
        for (func, file, line, glue) in inner:
            out.append(cat.f(func, file, line))
            # one return address per call site -> a few distinct equal-looking dicts
            out.append(cat.f('_PyEval_EvalFrameDefault', '??', 0, variant=(line * 7 + len(func)) % 23))
            out.extend(cat.f(n, fn, 0) for (n, fn) in GLUE[glue])
        if on_autograd_thread:
            out.extend(self._cpp_list(UNPACK_HOOK + AUTOGRAD_THREAD[2:]))
        else:
            out.extend(cat.f(n, fn, 0) for (n, fn) in PY_TAIL)
        out.extend(cat.f(func, file, line) for (func, file, line, _g) in outer)
        return out

    def py_alloc(self, op, pystack):
        cat = self.cat
        fids = self._cpp_list(ALLOC_PROLOGUE)
        if op not in ('embedding', 'to', 'copy_h2d'):
            fids += self._cpp_list(EMPTY_CHAIN)
        fids += self._cpp_list(self._op_chain(op))
        fids += self._python(pystack)
        return cat.tb(fids)

    def py_free(self, pystack):
        fids = self._cpp_list(FREE_PROLOGUE + PY_DEALLOC)
        fids += self._python(pystack)
        return self.cat.tb(fids)

    def bw_alloc(self, node, variant=0):
        apply_name, chain = BACKWARD_NODES[node]
        fids = self._cpp_list(ALLOC_PROLOGUE + EMPTY_CHAIN)
        fids += self._cpp_list([(n, '??' if i % 2 else '') for i, n in enumerate(chain)])
        if variant:
            fids.append(self.cat.f('torch::autograd::generated::details::handle_r_to_c(c10::ScalarType, at::Tensor)', 'FunctionsManual.cpp'))
        fids.append(self.cat.f(apply_name, 'Functions.cpp'))
        fids += self._cpp_list(AUTOGRAD_THREAD)
        return self.cat.tb(fids)

    def bw_free(self, node, kind):
        apply_name, _chain = BACKWARD_NODES[node]
        fids = self._cpp_list(FREE_PROLOGUE)
        fids += self._cpp_list(RELEASE_FRAMES[kind])
        if kind == 'saved':
            fids.append(self.cat.f(apply_name, 'Functions.cpp'))
        fids += self._cpp_list(AUTOGRAD_THREAD[1:])
        return self.cat.tb(fids)

    def generic(self, cpp_items, pystack):
        fids = self._cpp_list(cpp_items) + self._python(pystack)
        return self.cat.tb(fids)


# --------------------------------------------------------------------------------------
# caching-allocator model
# --------------------------------------------------------------------------------------

class Block:
    __slots__ = ('seg', 'addr', 'size', 'req', 'allocated', 'cap', 'prev', 'next')

    def __init__(self, seg, addr, size):
        self.seg = seg
        self.addr = addr
        self.size = size
        self.req = 0
        self.allocated = False
        self.cap = None       # (tb, cap id) of the allocation occupying it
        self.prev = None
        self.next = None


class Segment:
    __slots__ = ('addr', 'size', 'small', 'head', 'cap')

    def __init__(self, addr, size, small, cap):
        self.addr = addr
        self.size = size
        self.small = small
        self.head = None
        self.cap = cap


def round_size(n):
    return 512 if n < 512 else (n + 511) // 512 * 512


def segment_size(rounded):
    if rounded <= MIB:
        return 2 * MIB
    if rounded < 10 * MIB:
        return 20 * MIB
    return (rounded + 2 * MIB - 1) // (2 * MIB) * (2 * MIB)


class Allocator:
    """Enough of CUDACachingAllocator to produce realistic addresses and segments."""

    def __init__(self, va_base=0):
        self.segments = []
        self.free = {True: [], False: []}     # small? -> list of free blocks
        self.next_va = va_base

    def malloc(self, req, cap, on_segment):
        size = round_size(req)
        small = size <= MIB
        best = None
        for b in self.free[small]:
            if b.size >= size and (best is None or b.size < best.size or
                                   (b.size == best.size and b.addr < best.addr)):
                best = b
        if best is None:
            ssize = segment_size(size)
            seg = Segment(self.next_va, ssize, small, cap)
            self.next_va += ssize + 2 * MIB   # leave a gap, as cudaMalloc VAs do
            b = Block(seg, seg.addr, ssize)
            seg.head = b
            self.segments.append(seg)
            self.free[small].append(b)
            on_segment(seg)
            best = b
        self.free[small].remove(best)
        remaining = best.size - size
        if (small and remaining >= 512) or (not small and remaining > MIB):
            rest = Block(best.seg, best.addr + size, remaining)
            rest.prev = best
            rest.next = best.next
            if best.next:
                best.next.prev = rest
            best.next = rest
            best.size = size
            self.free[small].append(rest)
        best.allocated = True
        best.req = req
        best.cap = cap
        return best

    def free_block(self, b):
        small = b.seg.small
        b.allocated = False
        b.cap = None
        fl = self.free[small]
        for nb in (b.prev, b.next):
            if nb is not None and not nb.allocated:
                fl.remove(nb)
                if nb is b.prev:
                    nb.size += b.size
                    nb.next = b.next
                    if b.next:
                        b.next.prev = nb
                    nb.req = b.req
                    b = nb
                else:
                    b.size += nb.size
                    b.next = nb.next
                    if nb.next:
                        nb.next.prev = b
        fl.append(b)

    def release_all(self):
        segs = self.segments
        self.segments = []
        self.free = {True: [], False: []}
        return segs


# --------------------------------------------------------------------------------------
# one training step
# --------------------------------------------------------------------------------------

class Step:
    def __init__(self, rng, layers):
        self.rng = rng
        self.cat = Catalog()
        self.tb = TracebackBuilder(self.cat)
        self.layers = layers
        self.events = []          # (action, rel addr, size, rel time, tb, cap)
        self.cleanup_start = None
        self.final_segments = None
        self.ncaps = 0
        self.t = 0
        self.va_span = 0

    # -- event helpers
    def new_cap(self, tb):
        self.ncaps += 1
        return (tb, self.ncaps - 1)

    def tick(self, lo=3, hi=60):
        self.t += self.rng.randint(lo, hi)

    def alloc(self, req, tb):
        cap = self.new_cap(tb)
        self.tick()

        def on_segment(seg):
            self.events.append(('segment_alloc', seg.addr, seg.size, self.t, tb, cap[1]))
        b = self.alloc_model.malloc(req, cap, on_segment)
        self.events.append(('alloc', b.addr, req, self.t, tb, cap[1]))
        return b

    def free(self, b, tb):
        cap = self.new_cap(tb)
        self.tick(1, 20)
        req = b.req
        self.events.append(('free_requested', b.addr, req, self.t, tb, cap[1]))
        self.events.append(('free_completed', b.addr, req, self.t, tb, cap[1]))
        self.alloc_model.free_block(b)

    # -- model definition
    def build(self):
        rng = self.rng
        tbb = self.tb
        L = self.layers
        B, S, D, H, KVH, FFN, V = 4, 2048, 2048, 16, 4, 5632, 32000
        N = B * S
        bf16, fp32 = 2, 4
        act = N * D * bf16
        kv = N * (D // H) * KVH * bf16
        ffn = N * FFN * bf16
        E, FE = 8, 1408                           # MoE experts, expert FFN width

        # Python stacks are lists of (func, file, line, glue), innermost first.
        step_py = lambda line: [('train_step', TRAIN_PY, line, 'func'), ('main', TRAIN_PY, 231, 'func'),
                                ('<module>', TRAIN_PY, 262, 'none')]
        module_call = [('_call_impl', MODULE_PY, 1784, 'vector'),
                       ('_wrapped_call_impl', MODULE_PY, 1773, 'vector')]
        above_model = module_call + step_py(118)
        # class layout in model.py: RMSNorm ~40-60, Attention 130-160, LocalAttention
        # 170-200, MLP 215-225, MoE 235-258, Block 260-270, LocalBlock 280-290,
        # Transformer 295-315
        blk_lines = {'A': {'attn': 266, 'mlp': 267, 'norm1': 265, 'norm2': 267, 'res1': 266, 'res2': 267},
                     'B': {'attn': 286, 'mlp': 287, 'norm1': 285, 'norm2': 287, 'res1': 286, 'res2': 287}}
        ctx = {'block_outer': None}              # what called Block.forward

        def in_model(line):
            """code running directly in Transformer.forward at `line`"""
            return [('forward', MODEL_PY, line, 'prepend')] + above_model

        def in_block(kind, line):
            """code running directly in Block.forward (layer kind A/B) at `line`"""
            outer = ctx['block_outer'] or in_model(305)
            return [('forward', MODEL_PY, line, 'prepend')] + module_call + outer

        def in_sub(kind, sub, line):
            """code running in a submodule (attn/mlp/norm1/norm2) of a block at `line`"""
            return [('forward', MODEL_PY, line, 'prepend')] + module_call + \
                in_block(kind, blk_lines[kind][sub])

        def in_norm(kind, which, line, func='_norm'):
            inner = [(func, MODEL_PY, line, 'func')] if func != 'forward' else []
            return inner + [('forward', MODEL_PY, 56 if func == 'forward' else 55, 'prepend')] + \
                module_call + (in_block(kind, blk_lines[kind][which]) if kind else in_model(308))

        def fsite(op, stack):
            return tbb.py_alloc(op, stack)

        def free_site(stack):
            return tbb.py_free(stack)

        # persistent state allocated before recording started: one flat buffer per layer
        # for weights (bf16), exp_avg and exp_avg_sq (fp32), like flat-param optimizers
        def layer_params(i):
            n = D * D * 2 + 2 * D * D // H * KVH + 2 * D
            n += 3 * D * FFN if i % 2 == 0 else D * E + 3 * E * D * FE
            return n
        flat = [V * D, D * V + D] + [layer_params(i) for i in range(L)]
        pre = Allocator(0)
        for n in flat:
            for nbytes in (n * bf16, n * fp32, n * fp32):
                pre.malloc(nbytes, None, lambda s: None)
        for i in range(8):                        # small persistent buffers (rope cache, counters)
            pre.malloc(512 * (i + 1), None, lambda s: None)
        self.persistent = pre

        # --- the step ---
        self.alloc_model = Allocator(0)
        # entries: (block, backward node, 'saved'|'buffer', weight-grad bytes or 0)
        #          or ('ckpt', layer) = recompute that layer here during backward
        saved_stack = [[]]
        keep = lambda *items: saved_stack[-1].extend(items)

        idx = self.alloc(N * 8, fsite('copy_h2d', step_py(109)))
        tgt = self.alloc(N * 8, fsite('copy_h2d', step_py(110)))
        x = self.alloc(act, fsite('embedding', [('forward', SITE + '/torch/nn/modules/sparse.py', 190, 'prepend')]
                                  + module_call + in_model(301)))
        keep((x, 'embedding', 'buffer', 0))

        def rmsnorm(kind, which):
            s = lambda ln: in_norm(kind, which, ln)
            xf = self.alloc(N * D * fp32, fsite('to', s(48)))
            p2 = self.alloc(N * D * fp32, fsite('pow', s(49)))
            ms = self.alloc(N * fp32, fsite('mean', s(49)))
            self.free(p2, free_site(s(49)))
            rs = self.alloc(N * fp32, fsite('rsqrt', s(49)))
            y = self.alloc(N * D * fp32, fsite('mul', s(50)))
            yb = self.alloc(act, fsite('to', s(51)))
            out = self.alloc(act, fsite('mul', in_norm(kind, which, 56, 'forward')))
            keep((xf, 'to', 'saved', 0), (ms, 'mean', 'saved', 0), (rs, 'rsqrt', 'saved', 0),
                 (y, 'to', 'saved', 0), (yb, 'mul', 'saved', 0), (out, 'mul', 'buffer', 0))

        def linear(stack, size, wbytes, functional=False):
            if not functional:
                stack = [('forward', SITE + '/torch/nn/modules/linear.py', 125, 'prepend')] + module_call + stack
            b = self.alloc(size, fsite('mm', stack))
            keep((b, 'mm', 'saved', wbytes))

        ntok_e = [int(N * 2 / E * (0.6 + 0.8 * rng.random())) // 8 * 8 + 8 for _e in range(E)]

        def run_layer(layer):
            kind = 'A' if layer % 4 != 3 else 'B'     # every 4th layer: local attention w/ mask
            moe = layer % 2 == 1                      # every other layer: MoE MLP
            o = 0 if kind == 'A' else 40              # line offset of the LocalAttention class
            rmsnorm(kind, 'norm1')
            linear(in_sub(kind, 'attn', 139 + o), act, D * D * bf16)
            linear(in_sub(kind, 'attn', 140 + o), kv, D * D // H * KVH * bf16)
            linear(in_sub(kind, 'attn', 141 + o), kv, D * D // H * KVH * bf16)
            for (sz, ln) in ((act, 143 + o), (kv, 144 + o)):
                st = lambda l2: [('apply_rotary_emb', ROTARY_PY, l2, 'func')] + in_sub(kind, 'attn', ln)
                t1 = self.alloc(sz * 2, fsite('to', st(31)))
                t2 = self.alloc(sz * 2, fsite('view_as_complex_mul', st(33)))
                self.free(t1, free_site(st(34)))
                t3 = self.alloc(sz, fsite('flatten', st(34)))
                keep((t2, 'view_as_complex_mul', 'saved', 0), (t3, 'flatten', 'saved', 0))
            for (sz, ln) in ((kv, 145 + o), (kv, 146 + o)):
                rk = self.alloc(sz * H // KVH, fsite('repeat_kv', [('repeat_kv', MODEL_PY, 122, 'func')] +
                                                     in_sub(kind, 'attn', ln)))
                keep((rk, 'repeat_kv', 'saved', 0))
            for ln in (150 + o, 151 + o, 152 + o):       # q/k/v .transpose(1, 2).contiguous()
                keep((self.alloc(act, fsite('contiguous', in_sub(kind, 'attn', ln))), 'contiguous', 'saved', 0))
            sdpa_py = [('scaled_dot_product_attention', FUNCTIONAL_PY, 5975, 'func')]
            if kind == 'B':
                m1 = self.alloc(S * S, fsite('ones', in_sub(kind, 'attn', 186)))
                m2 = self.alloc(S * S, fsite('tril', in_sub(kind, 'attn', 186)))
                self.free(m1, free_site(in_sub(kind, 'attn', 186)))
                ao = self.alloc(act, fsite('sdpa_mem', sdpa_py + in_sub(kind, 'attn', 194)))
                lse = self.alloc(N * H * fp32 // 4, fsite('sdpa_mem', sdpa_py + in_sub(kind, 'attn', 194)))
                keep((m2, 'sdpa_mem', 'saved', 0), (ao, 'sdpa_mem', 'saved', 0), (lse, 'sdpa_mem', 'saved', 0))
            else:
                ao = self.alloc(act, fsite('sdpa', in_sub(kind, 'attn', 154)))
                lse = self.alloc(N * H * fp32 // 4, fsite('sdpa', in_sub(kind, 'attn', 154)))
                keep((ao, 'sdpa', 'saved', 0), (lse, 'sdpa', 'saved', 0))
            keep((self.alloc(act, fsite('contiguous', in_sub(kind, 'attn', 155 + o))), 'contiguous', 'saved', 0))
            linear(in_sub(kind, 'attn', 156 + o), act, D * D * bf16)
            keep((self.alloc(act, fsite('add', in_block(kind, blk_lines[kind]['res1']))), 'add', 'buffer', 0))
            rmsnorm(kind, 'norm2')
            if not moe:
                linear(in_sub(kind, 'mlp', 221), ffn, D * FFN * bf16)
                linear(in_sub(kind, 'mlp', 222), ffn, D * FFN * bf16)
                sl = self.alloc(ffn, fsite('mul', [('silu', FUNCTIONAL_PY, 2379, 'func')] + in_sub(kind, 'mlp', 223)))
                pr = self.alloc(ffn, fsite('mul', in_sub(kind, 'mlp', 223)))
                keep((sl, 'mul', 'saved', 0), (pr, 'mul', 'saved', 0))
                linear(in_sub(kind, 'mlp', 224), act, D * FFN * bf16)
            else:
                # MoE MLP (class MoE, top-2 routing); experts are plain functions (F.linear)
                moe_py = lambda ln: in_sub(kind, 'mlp', ln)
                linear(moe_py(241), N * E * bf16, D * E * bf16)
                p_ = self.alloc(N * E * fp32, fsite('softmax', moe_py(242)))
                tv = self.alloc(N * 2 * fp32, fsite('topk', moe_py(243)))
                ti = self.alloc(N * 2 * 8, fsite('topk', moe_py(243)))
                y = self.alloc(act, fsite('zeros', moe_py(244)))
                keep((p_, 'softmax', 'saved', 0), (tv, 'topk', 'saved', 0), (ti, 'topk', 'saved', 0))
                for e in range(E):
                    ntok = ntok_e[e]
                    nz = self.alloc(ntok * 8, fsite('nonzero', moe_py(247)))
                    xe = self.alloc(ntok * D * bf16, fsite('index', moe_py(248)))
                    keep((nz, 'index', 'saved', 0), (xe, 'index', 'saved', 0))
                    ex = lambda ln: [('expert_forward', MODEL_PY, ln, 'func')] + moe_py(249)
                    linear(ex(230), ntok * FE * bf16, D * FE * bf16, True)
                    linear(ex(231), ntok * FE * bf16, D * FE * bf16, True)
                    sl = self.alloc(ntok * FE * bf16, fsite('mul', [('silu', FUNCTIONAL_PY, 2379, 'func')] + ex(232)))
                    pr = self.alloc(ntok * FE * bf16, fsite('mul', ex(232)))
                    keep((sl, 'mul', 'saved', 0), (pr, 'mul', 'saved', 0))
                    linear(ex(233), ntok * D * bf16, D * FE * bf16, True)
                    keep((self.alloc(ntok * D * bf16, fsite('mul', moe_py(250))), 'mul', 'saved', 0))
                    y2 = self.alloc(act, fsite('index_add', moe_py(251)))
                    self.free(y, free_site(moe_py(251)))
                    y = y2
                keep((y, 'index_add', 'buffer', 0))
            keep((self.alloc(act, fsite('add', in_block(kind, blk_lines[kind]['res2']))), 'add', 'buffer', 0))

        ckpt_fwd_outer = [('forward', MODEL_PY, 56, 'prepend')] + module_call + \
            [('checkpoint', CKPT_PY, 496, 'func'), ('_fn', SITE + '/torch/_compile.py', 53, 'func')] + in_model(304)
        ckpt_re_outer = [('recompute_fn', CKPT_PY, 1127, 'func'), ('unpack_hook', CKPT_PY, 1175, 'func'),
                         ('@autograd', None, None, None)]
        for layer in range(L):
            if layer % 6 == 5:
                # activation checkpointing (non-reentrant): forward runs without saving,
                # everything but the block output is freed when checkpoint() returns
                ctx['block_outer'] = ckpt_fwd_outer
                saved_stack.append([])
                run_layer(layer)
                tmp = saved_stack.pop()
                ctx['block_outer'] = None
                ftb = free_site(ckpt_fwd_outer[len(module_call) + 1:])
                for item in tmp[:-1]:
                    self.free(item[0], ftb)
                keep(('ckpt', layer), tmp[-1])
            else:
                run_layer(layer)

        hf = self.alloc(act, fsite('mul', in_norm(None, None, 56, 'forward')))
        keep((hf, 'mul', 'saved', 0))
        linear(in_model(309), N * V * bf16, D * V * bf16)
        ce = [('cross_entropy', FUNCTIONAL_PY, 3494, 'func'), ('compute_loss', TRAIN_PY, 89, 'func')] + step_py(119)
        lf = self.alloc(N * V * fp32, fsite('to', [('compute_loss', TRAIN_PY, 88, 'func')] + step_py(119)))
        ls = self.alloc(N * V * fp32, fsite('log_softmax', ce))
        loss = self.alloc(4, fsite('nll', ce))
        keep((lf, 'to', 'saved', 0), (ls, 'log_softmax', 'saved', 0), (loss, 'nll', 'buffer', 0))
        self.free(idx, free_site(step_py(120)))
        self.t += 5000

        # --- backward (autograd device thread: C++ frames only, except recomputation) ---
        grads = []
        bw_python = [('_engine_run_backward', GRAPH_PY, 829, 'func'), ('backward', AUTOGRAD_PY, 354, 'func'),
                     ('backward', TENSOR_PY, 648, 'func')] + step_py(121)
        gin = [self.alloc(4, tbb.generic(ALLOC_PROLOGUE + EMPTY_CHAIN + [
            ('at::native::ones_like(at::Tensor const&, std::optional<c10::ScalarType>, std::optional<c10::Layout>, std::optional<c10::Device>, std::optional<bool>, std::optional<c10::MemoryFormat>)', ''),
            ('torch::autograd::python::PythonEngine::execute(std::vector<torch::autograd::Edge, std::allocator<torch::autograd::Edge> > const&, std::vector<at::Tensor, std::allocator<at::Tensor> > const&, bool, bool, std::vector<torch::autograd::Edge, std::allocator<torch::autograd::Edge> > const&)', 'python_engine.cpp'),
            ('THPEngine_run_backward(_object*, _object*, _object*)', 'python_engine.cpp'),
            ('cfunction_call', '??')], bw_python))]

        def backward(items):
            for item in reversed(items):
                if item[0] == 'ckpt':
                    ctx['block_outer'] = ckpt_re_outer
                    saved_stack.append([])
                    run_layer(item[1])
                    tmp = saved_stack.pop()
                    ctx['block_outer'] = None
                    out = tmp.pop()
                    self.free(out[0], tbb.bw_free('add', 'buffer'))
                    backward(tmp)
                    continue
                blk, node, kind, wbytes = item
                g = self.alloc(max(blk.req, 4), tbb.bw_alloc(node, 1 if node == 'view_as_complex_mul' else 0))
                if wbytes:
                    grads.append(self.alloc(wbytes, tbb.bw_alloc('mm_w')))   # kept as .grad
                self.free(blk, tbb.bw_free(node, kind))
                self.free(gin[0], tbb.bw_free(node, 'buffer'))
                gin[0] = g
        backward(saved_stack[0])
        self.free(gin[0], tbb.bw_free('embedding', 'buffer'))
        grads.append(self.alloc(V * D * bf16, tbb.bw_alloc('embedding')))
        for i in range(2 * L + 1):                # norm weight grads (small pool)
            grads.append(self.alloc(D * bf16, tbb.bw_alloc('mul', 1)))
        self.free(tgt, free_site(step_py(122)))
        self.t += 3000

        # --- clip_grad_norm_ ---
        clip_py = lambda line: [('_clip_grads_with_norm_' if line > 150 else '_get_total_norm',
                                 SITE + '/torch/nn/utils/clip_grad.py', line, 'func'),
                                ('_no_grad_wrapper', SITE + '/torch/nn/utils/clip_grad.py', 35, 'func'),
                                ('clip_grad_norm_', SITE + '/torch/nn/utils/clip_grad.py', 230, 'func')] + step_py(123)
        norms = [self.alloc(4, fsite('foreach_norm', clip_py(94))) for _g in grads]
        stk = self.alloc(4 * len(norms), fsite('stack', clip_py(103)))
        tot = self.alloc(4, fsite('vector_norm', clip_py(103)))
        ftb = free_site(clip_py(103))
        for nb in norms:
            self.free(nb, ftb)
        self.free(stk, free_site(clip_py(104)))
        c1 = self.alloc(4, fsite('add', clip_py(161)))
        c2 = self.alloc(4, fsite('clamp', clip_py(162)))
        self.free(c1, free_site(clip_py(162)))
        self.free(c2, free_site(clip_py(166)))
        self.free(tot, free_site(step_py(123)))
        self.t += 500

        # --- optimizer step: AdamW foreach over chunks of the parameter list ---
        self.opt_start = self.t
        opt_py = lambda line: [('_multi_tensor_adamw', ADAM_PY, line, 'func'), ('adam', ADAM_PY, 951, 'func'),
                               ('step', ADAMW_PY, 243, 'func'), ('_use_grad', OPTIM_PY, 79, 'func'),
                               ('wrapper', OPTIM_PY, 485, 'func')] + step_py(124)
        sizes = [g.req for g in grads]
        chunk = 48
        for c0 in range(0, len(sizes), chunk):
            part = sizes[c0:c0 + chunk]
            live = []
            for (op, kern, line) in FOREACH:
                tbid = tbb.generic(ALLOC_PROLOGUE + EMPTY_CHAIN + [
                    (kern, '??'), ('at::_ops::%s_Scalar::call(c10::ArrayRef<at::Tensor>, c10::Scalar const&)' % op, ''),
                    ('torch::autograd::THPVariable_%s(_object*, _object*, _object*)' % op, 'python_torch_functions_2.cpp'),
                    ('cfunction_call', '??')], opt_py(line))
                live.append(([self.alloc(sz, tbid) for sz in part], line))
                if len(live) > 2:
                    old, oline = live.pop(0)
                    ftb = tbb.py_free(opt_py(oline + 1))
                    for bb in old:
                        self.free(bb, ftb)
            for old, oline in live:
                ftb = tbb.py_free(opt_py(oline + 2))
                for bb in old:
                    self.free(bb, ftb)
        self.opt_end = self.t
        self.t += 2000

        # final state of the last tile = here
        self.cleanup_start = len(self.events)
        self.final_grads = list(grads)
        self.final_segments = self.snapshot_segments()

        # --- cleanup (all tiles but the last): zero_grad(set_to_none), empty_cache ---
        self.zg_start = self.t
        zg = tbb.py_free([('zero_grad', OPTIM_PY, 1012, 'func'), ('_use_grad', OPTIM_PY, 79, 'func'),
                          ('train_step', TRAIN_PY, 126, 'func'), ('main', TRAIN_PY, 231, 'func'),
                          ('<module>', TRAIN_PY, 262, 'none')])
        for g in grads:
            self.free(g, zg)
        self.zg_end = self.t
        self.t += 500
        ec_tb = tbb.generic([
            ('torch::unwind::unwind()', '??'),
            ('torch::CapturedTraceback::gather(bool, bool, bool)', '??'),
            ('torch::cuda::(anonymous namespace)::gather_with_cpp()', 'memory_snapshot.cpp'),
            ('c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::release_block(c10::cuda::CUDACachingAllocator::Native::(anonymous namespace)::Block*, std::shared_ptr<c10::GatheredContext> const&)', 'CUDACachingAllocator.cpp'),
            ('c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::release_blocks(c10::cuda::CUDACachingAllocator::Native::(anonymous namespace)::BlockPool&, std::shared_ptr<c10::GatheredContext> const&)', 'CUDACachingAllocator.cpp'),
            ('c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::release_cached_blocks(std::shared_ptr<c10::GatheredContext> const&, c10::MempoolId_t)', 'CUDACachingAllocator.cpp'),
            ('c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::emptyCache(c10::MempoolId_t)', ''),
            ('THCPModule_emptyCache(_object*, _object*)', 'Module.cpp'),
            ('cfunction_vectorcall_NOARGS', '??')],
            [('empty_cache', CUDA_MEM_PY, 224, 'func'), ('train_step', TRAIN_PY, 127, 'func'),
             ('main', TRAIN_PY, 231, 'func'), ('<module>', TRAIN_PY, 262, 'none')])
        cap = self.new_cap(ec_tb)
        self.tick()
        for seg in sorted(self.alloc_model.release_all(), key=lambda s: (s.small, s.addr)):
            self.events.append(('segment_free', seg.addr, seg.size, self.t, ec_tb, cap[1]))
        self.t += 1000
        self.period_us = self.t
        self.va_span = self.alloc_model.next_va

    def snapshot_segments(self):
        """Final state of this tile's allocator: list of (segaddr, size, small, seg cap,
        [(addr, size, req, state, cap)])."""
        out = []
        for seg in self.alloc_model.segments:
            blocks = []
            b = seg.head
            while b is not None:
                blocks.append((b.addr, b.size, b.req, 'active_allocated' if b.allocated else 'inactive',
                               b.cap if b.allocated else None))
                b = b.next
            out.append((seg.addr, seg.size, seg.small, seg.cap, blocks))
        return out


# --------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------

TIME0 = 1766124544221968          # 2025-12-19, microseconds since the epoch
VA_TOP = 0x7f40_0000_0000


class Generator:
    def __init__(self, step, ntiles, sharing, va_top=VA_TOP):
        self.step = step
        self.ntiles = ntiles
        self.sharing = sharing
        st = step
        self.shift = (st.va_span + (1 << 30) - 1) >> 30 << 30
        self.base = va_top - (ntiles + 1) * self.shift
        if self.base < (1 << 41):
            raise SystemExit('too many tiles for the VA range (%d)' % ntiles)
        self.pbase = self.base - ((st.persistent.next_va + (1 << 30)) >> 30 << 30) - (1 << 32)
        self.period = st.period_us + 20000
        nmain = st.cleanup_start
        self.ev_main = st.events[:nmain]
        self.ev_clean = st.events[nmain:]
        # per-capture use counts in the trace (to drop memo entries after last use)
        uses_full = {}
        for e in st.events:
            uses_full[e[5]] = uses_full.get(e[5], 0) + 1
        uses_last = {}
        for e in self.ev_main:
            uses_last[e[5]] = uses_last.get(e[5], 0) + 1
        self.uses_full = uses_full
        self.uses_last = uses_last
        self.n_entries = (ntiles - 1) * len(st.events) + len(self.ev_main) if ntiles else 0

    # -- frame dicts / lists
    def frame_dict_parts(self, w, fid):
        key = ('fd', fid)
        g = w.gets.get(key)
        if g is not None:
            return [g]
        name, filename, line = self.step.cat.frames[fid]
        w.shared[key] = w.memo_n
        w.gets[key] = enc_get(w.memo_n)
        w.memo_n += 1
        # list literal: evaluated left to right == memo order == byte order
        return [EMPTY_DICT_M + MARK,
                w.shared_str('name'), w.fresh_str(name),
                w.shared_str('filename'), w.fresh_str(filename),
                w.shared_str('line'), enc_int(line) + SETITEMS]

    def list_of_tb(self, w, tb):
        """Parts of a *fresh* list object containing traceback tb."""
        cached = self.tb_items.get(tb)
        w.memo_n += 1                       # the list's own MEMOIZE comes first
        if cached is not None:
            return list(cached)
        parts = [EMPTY_LIST_M + MARK]
        all_known = True
        for fid in self.step.cat.tbs[tb]:
            key = ('fd', fid)
            g = w.gets.get(key)
            if g is None:
                all_known = False
                parts.extend(self.frame_dict_parts(w, fid))
            else:
                parts.append(g)
        parts[-1] = parts[-1] + APPENDS
        if all_known:
            self.tb_items[tb] = tuple(parts)
        return parts

    def frames_ref(self, w, capkey, tb, uses):
        """Parts for a `frames` value.  capkey identifies the list object; uses = how
        many references the trace will make (None: keep forever)."""
        if capkey is None:
            g = w.gets.get(('empty',))
            if g is not None:
                return [g]
            w.define(('empty',))
            w.gets[('empty',)] = enc_get(w.shared[('empty',)])
            return [EMPTY_LIST_M]
        idx = self.live.get(capkey)
        if idx is not None:
            if uses is not None:
                left = self.live_left[capkey] - 1
                if left <= 0:
                    del self.live[capkey]
                    del self.live_left[capkey]
                else:
                    self.live_left[capkey] = left
            return [enc_get(idx)]
        idx = w.memo_n
        parts = self.list_of_tb(w, tb)
        if uses is None or uses > 1:
            self.live[capkey] = idx
            if uses is not None:
                self.live_left[capkey] = uses - 1
        return parts

    # -- sections
    def write_segments(self, w):
        st = self.step
        last = self.ntiles - 1
        segs = []
        for seg in st.persistent.segments:
            blocks = []
            b = seg.head
            while b is not None:
                blocks.append((b.addr + self.pbase, b.size, b.req,
                               'active_allocated' if b.allocated else 'inactive', None))
                b = b.next
            segs.append((seg.addr + self.pbase, seg.size, seg.small, None, blocks))
        if self.ntiles > 0:
            off = self.base + last * self.shift
            for (sa, ss, small, cap, blocks) in st.final_segments:
                segs.append((sa + off, ss, small, cap,
                             [(ba + off, bs, br, state, bc) for (ba, bs, br, state, bc) in blocks]))
        segs.sort(key=lambda s: s[0])
        self.n_segments = len(segs)
        self.n_blocks = sum(len(s[4]) for s in segs)
        # how often each capture list is referenced from `segments` (block + segment)
        seg_refs = {}
        for s in segs:
            for c in [s[3]] + [b[4] for b in s[4]]:
                if c is not None:
                    seg_refs[c[1]] = seg_refs.get(c[1], 0) + 1

        def frames_parts(cap):
            if cap is None:
                return self.frames_ref(w, None, None, None)
            tb, cid = cap
            if self.sharing == 'traceback':
                return self.frames_ref(w, ('tb', tb), tb, None)
            return self.frames_ref(w, (last, cid), tb, self.uses_last.get(cid, 0) + seg_refs[cid])

        def seg_emitter(s):
            def emit():
                sa, ss, small, cap, blocks = s
                S = w.shared_str
                alloc_sz = sum(b[1] for b in blocks if b[3] == 'active_allocated')
                req_sz = sum(b[2] for b in blocks if b[3] == 'active_allocated')
                w.memo_n += 1                                    # segment dict
                parts = [EMPTY_DICT_M + MARK,
                         S('device'), enc_int(0), S('address'), enc_int(sa), S('total_size'), enc_int(ss),
                         S('allocated_size'), enc_int(alloc_sz), S('active_size'), enc_int(alloc_sz),
                         S('requested_size'), enc_int(req_sz), S('stream'), enc_int(0),
                         S('segment_type'), S('small' if small else 'large'), S('segment_pool_id'),
                         enc_int(0)]
                w.memo_n += 1                                    # (0, 0): a new tuple per segment
                parts += [enc_int(0) + TUPLE2 + MEMOIZE, S('is_expandable'), NEWFALSE, S('blocks')]
                w.memo_n += 1                                    # blocks list
                nb = len(blocks)
                if nb > 1000:
                    raise ValueError('more than 1000 blocks in a segment')
                parts.append(EMPTY_LIST_M + (MARK if nb > 1 else b''))
                w.emit(parts)
                for (ba, bs, br, state, bc) in blocks:
                    w.memo_n += 1                                # block dict
                    parts = [EMPTY_DICT_M + MARK, S('address'), enc_int(ba), S('size'), enc_int(bs),
                             S('requested_size'), enc_int(br), S('state'), S(state), S('frames')]
                    parts += frames_parts(bc)
                    parts[-1] += SETITEMS
                    w.emit(parts)
                w.raw(APPENDS if nb > 1 else APPEND)
                parts = [S('frames')] + frames_parts(cap)
                parts[-1] += SETITEMS
                w.emit(parts)
            return emit

        w.emit([w.shared_str('segments')])
        stream_list(w, len(segs), (seg_emitter(s) for s in segs))

    def write_traces(self, w):
        st = self.step
        w.emit([w.shared_str('device_traces')])
        w.memo_n += 1
        w.emit([EMPTY_LIST_M])                         # device_traces (1 device)
        stream_list(w, self.n_entries, self.entry_emitters(w))
        w.raw(APPEND)

    def entry_emitters(self, w):
        S = w.shared_str
        keys = ('action', 'addr', 'size', 'stream', 'time_us', 'compile_context',
                'user_metadata', 'frames')
        NA = enc_str('N/A')
        zero = enc_int(0)
        size_cache = {}
        sharing_tb = self.sharing == 'traceback'
        for tile in range(self.ntiles):
            is_last = tile == self.ntiles - 1
            events = self.ev_main if is_last else self.step.events
            uses = self.uses_last if is_last else self.uses_full
            aoff = self.base + tile * self.shift
            toff = TIME0 + tile * self.period
            live = self.live
            for (act, raddr, size, trel, tb, cid) in events:
                def emit(act=act, raddr=raddr, size=size, trel=trel, tb=tb, cid=cid):
                    sb = size_cache.get(size)
                    if sb is None:
                        sb = size_cache[size] = enc_int(size)
                    w.memo_n += 1                       # entry dict
                    parts = [EMPTY_DICT_M + MARK, S('action'), S(act), S('addr'), enc_int(raddr + aoff),
                             S('size'), sb, S('stream'), zero, S('time_us'), enc_int(trel + toff),
                             S('compile_context')]
                    w.memo_n += 1                       # 'N/A' is a new str each time
                    parts.append(NA)
                    parts.append(S('user_metadata'))
                    parts.append(w.shared_str('', ('s1', '')))
                    parts.append(S('frames'))
                    if sharing_tb:
                        parts.extend(self.frames_ref(w, ('tb', tb), tb, None))
                    else:
                        parts.extend(self.frames_ref(w, (tile, cid), tb, uses[cid]))
                    parts[-1] = parts[-1] + SETITEMS
                    w.emit(parts)
                yield emit

    def annotations(self):
        st = self.step
        out = []
        for tile in range(self.ntiles):
            toff = TIME0 + tile * self.period
            is_last = tile == self.ntiles - 1
            out.append(('ProfilerStep#%d' % tile, 'START', toff - 5))
            out.append(('Optimizer.step#AdamW.step', 'START', toff + st.opt_start))
            out.append(('Optimizer.step#AdamW.step', 'END', toff + st.opt_end + 3))
            if not is_last:
                out.append(('Optimizer.zero_grad#AdamW.zero_grad', 'START', toff + st.zg_start))
                out.append(('Optimizer.zero_grad#AdamW.zero_grad', 'END', toff + st.zg_end + 2))
                out.append(('ProfilerStep#%d' % tile, 'END', toff + st.period_us))
        return out

    def write_tail(self, w):
        S = w.shared_str
        empty = lambda: w.shared_str('', ('s1', ''))
        w.emit([S('allocator_settings')])
        w.memo_n += 1
        parts = [EMPTY_DICT_M + MARK,
                 S('PYTORCH_CUDA_ALLOC_CONF'), empty(),
                 S('max_split_size'), enc_int(-1),
                 S('garbage_collection_threshold'), b'G' + pack_f64(0.0),
                 S('expandable_segments'), NEWFALSE,
                 S('pinned_num_register_threads'), enc_int(1),
                 S('release_lock_on_cudamalloc'), NEWFALSE,
                 S('pinned_use_cuda_host_register'), NEWFALSE,
                 S('graph_capture_record_stream_reuse'), NEWFALSE,
                 S('roundup_power2_divisions')]
        w.memo_n += 1
        parts.append(EMPTY_DICT_M + MARK)
        for i in range(16):
            parts.append(w.fresh_str(str(1 << i)))   # '1','2','4','8' are singletons
            parts.append(enc_int(0))
        parts[-1] += SETITEMS + SETITEMS
        w.emit(parts)

        w.emit([S('external_annotations')])
        ann = self.annotations()
        self.n_annotations = len(ann)

        def emitters():
            for (name, stage, t) in ann:
                def emit(name=name, stage=stage, t=t):
                    w.memo_n += 1
                    # torch builds these from an unordered_map: new key strings per entry
                    parts = [EMPTY_DICT_M + MARK, w.fresh_str('stage'), w.fresh_str(stage),
                             w.fresh_str('name'), w.fresh_str(name), S('device'), enc_int(0),
                             S('time_us'), enc_int(t) + SETITEMS]
                    w.emit(parts)
                yield emit
        stream_list(w, len(ann), emitters())

    def write(self, fh):
        self.live = {}
        self.live_left = {}
        self.tb_items = {}
        w = PickleStream(fh)
        w.memo_n += 1
        w.emit([EMPTY_DICT_M + MARK])       # root dict, 4 items
        self.write_segments(w)
        self.write_traces(w)
        self.write_tail(w)
        w.raw(SETITEMS)
        w.finish()
        self.memo_size = w.memo_n
        return w


def build_step(seed, layers):
    rng = random.Random(seed)
    st = Step(rng, layers)
    st.build()
    return st


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--size-mb', type=float, default=300.0,
                    help='target size of the (uncompressed) pickle in MB (10^6 bytes)')
    ap.add_argument('-o', '--output', required=True)
    ap.add_argument('--gzip', action='store_true', help='gzip the output stream (level 6)')
    ap.add_argument('--tiles', type=int, default=None, help='number of steps (overrides --size-mb)')
    ap.add_argument('--layers', type=int, default=12, help='transformer layers per step')
    ap.add_argument('--sharing', choices=('capture', 'traceback'), default='capture',
                    help='frames-list sharing model (see module docstring)')
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--va-top', type=lambda v: int(v, 0), default=VA_TOP,
                    help='top of the address range (default 0x7f4000000000; '
                         'add 2**48 for a trace whose addresses are all at or above 2^48)')
    ap.add_argument('--verify', action='store_true',
                    help='after writing, check pickle.dumps(pickle.load(f), protocol=4) == file')
    ap.add_argument('--stats', action='store_true', help='print model statistics')
    args = ap.parse_args(argv)

    t0 = time.time()
    step = build_step(args.seed, args.layers)
    if args.tiles is not None:
        ntiles = args.tiles
    else:
        # size is affine in the number of tiles: measure 2 and 3 tiles
        s2 = CountingSink()
        Generator(step, 2, args.sharing).write(s2)
        s3 = CountingSink()
        Generator(step, 3, args.sharing).write(s3)
        per_tile = s3.n - s2.n
        fixed = s2.n - 2 * per_tile
        target = int(args.size_mb * 1e6)
        ntiles = max(1, round((target - fixed) / per_tile))
    gen = Generator(step, ntiles, args.sharing, args.va_top)
    out_dir = os.path.dirname(os.path.abspath(args.output))
    os.makedirs(out_dir, exist_ok=True)
    tmp = args.output + '.tmp'
    if args.gzip:
        raw = open(tmp, 'wb')
        fh = gzip.GzipFile(filename='', mode='wb', fileobj=raw, compresslevel=6, mtime=0)
    else:
        raw = None
        fh = open(tmp, 'wb', buffering=1 << 20)
    counter = CountingSink()

    class Tee:
        def write(self, b):
            counter.write(b)
            return fh.write(b)
    gen.write(Tee())
    fh.close()
    if raw is not None:
        raw.close()
    os.replace(tmp, args.output)
    dt = time.time() - t0
    n = gen.n_entries
    on_disk = os.path.getsize(args.output)
    print('%s: %d bytes pickle (%.1f MB)%s, %d tiles x %d entries = %d trace entries, '
          '%.1f bytes/entry, %d segments, %d blocks, %d annotations, %d frames, %d distinct '
          'tracebacks, %d memo slots, sharing=%s, %.1f s'
          % (args.output, counter.n, counter.n / 1e6,
             (', %d bytes gzipped' % on_disk) if args.gzip else '',
             ntiles, len(step.events), n, counter.n / max(n, 1), gen.n_segments, gen.n_blocks,
             gen.n_annotations, len(step.cat.frames), len(step.cat.tbs), gen.memo_size,
             args.sharing, dt))
    if args.stats:
        lens = [len(t) for t in step.cat.tbs]
        from collections import Counter
        print('traceback length min/mean/max: %d/%.1f/%d' % (min(lens), sum(lens) / len(lens), max(lens)))
        print('actions per tile:', dict(Counter(e[0] for e in step.events)))
        print('tile VA span %.1f GiB, period %.3f s' % (step.va_span / 2**30, gen.period / 1e6))
    if args.verify:
        import pickle
        opener = gzip.open if args.gzip else open
        with opener(args.output, 'rb') as f:
            data = f.read()
        obj = pickle.loads(data)
        again = pickle.dumps(obj, protocol=4)
        if again != data:
            i = next((k for k in range(min(len(again), len(data))) if again[k] != data[k]),
                     min(len(again), len(data)))
            print('VERIFY FAILED: re-pickled bytes differ at offset %d (len %d vs %d)'
                  % (i, len(again), len(data)), file=sys.stderr)
            return 1
        print('verify: pickle.load ok, %d entries, re-pickled bytes identical' %
              len(obj['device_traces'][0]))
    return 0


if __name__ == '__main__':
    sys.exit(main())
