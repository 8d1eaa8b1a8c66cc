#!/usr/bin/env python
"""Rank-by-rank trace of a sharded (FSDP1 / FSDP2 / FSDP + QLoRA) training step,
without a GPU and without a second process.

One process plays rank R of a world of N: `torch.distributed` runs on PyTorch's
fake process group (collectives return at once and move no data), tensors are
FakeTensors on a fake "cuda" device (no data, no arithmetic), and every device
storage is accounted as the CUDA caching allocator accounts `allocated_bytes`
(512-byte rounding). The Hugging Face model, PEFT, bitsandbytes' Python code,
accelerate's FSDP preparation and PyTorch's FSDP run unchanged, so the sharding,
flattening, padding, all-gathers, reduce-scatters and frees are the real ones.

It reuses the fake-CUDA oracle (../shared/oracle: fakecuda.py, oracle.py,
qlora_approx.py) for the fake device, the SDPA kernel choice and the NF4
approximation, and adds: fake CUDA streams and events (recorded per allocation),
storage resizes (FSDP frees and re-allocates its unsharded buffers with
`UntypedStorage.resize_`, which no dispatch mode sees), FSDP-aware categories,
and the loading paths (model fully on the GPU before wrapping, CPU, rank-0 CPU +
meta with `sync_module_states`, torchtune's meta init + sharded load).

Stacks:
  --fsdp 1 --stack hf         HF Trainer + accelerate FSDP1 (accelerate's own
                              Accelerator.prepare_model with the plugin arguments
                              transformers' TrainingArguments builds)
  --fsdp 2 --stack hf         accelerate fsdp_version=2 (Accelerator.prepare)
  --fsdp 2 --stack torchtune  torchtune full_finetune_distributed-style fully_shard
                              (per decoder layer, then root with
                              reshard_after_forward=False), pure bf16, meta init

Examples (from the repository root; PY = the oracle venv's python):
  $PY calibration/shard_trace.py --builtin tiny-llama --fsdp 1 --method lora --world 2 --ranks 0,1
  $PY calibration/shard_trace.py --config ../shared/models/meta-llama--Llama-2-7b-hf.json \\
      --fsdp 2 --stack torchtune --method full --world 4 --rank 0 --batch 2 --seq 512 --grad-ckpt
  $PY calibration/shard_trace.py --matrix tiny-fsdp1   # regenerates validation/oracle-traces/fsdp-tiny-fsdp1.jsonl

See calibration/README.md ("Sharded training on fake tensors") for what is and is
not measured.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import itertools
import json
import os
import subprocess
import sys
import time
import warnings
import weakref
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, ".."))
ORACLE_DIR = os.environ.get("MORO_ORACLE_DIR") or os.path.normpath(os.path.join(ROOT, "..", "shared", "oracle"))
MODELS_DIR = os.path.normpath(os.path.join(ROOT, "..", "shared", "models"))
TRACES_DIR = os.path.join(ROOT, "validation", "oracle-traces")

GiB = 1024 ** 3
ROUND = 512
TRACER = "moro-shard-trace/1"


# ----------------------------------------------------------------- hand rules
# (torch-free; the tests check the tracer against their own copies of these rules)
def rounded(nbytes: int) -> int:
    """Caching allocator `allocated_bytes` charge of one block."""
    return 0 if nbytes <= 0 else (nbytes + ROUND - 1) // ROUND * ROUND


def fsdp1_flat_numel(numels, itemsize: int, world: int, align: bool = True) -> int:
    """Padded numel of one FSDP1 FlatParameter (all ranks together).
    use_orig_params=True aligns every original parameter's start to 16 bytes
    (padding inserted before a parameter whose offset is not a multiple), then the
    total is padded to a multiple of the world size."""
    total = 0
    unit = 16 // itemsize if align else 1
    for n in numels:
        if align and total % unit:
            total += unit - total % unit
        total += n
    if total % world:
        total += world - total % world
    return total


def fsdp2_local_rows(dim0: int, world: int, rank: int) -> int:
    """Rows of a dim-0 Shard(0) chunk on `rank` (torch.chunk rule)."""
    chunk = -(-dim0 // world)
    return max(0, min(chunk, dim0 - chunk * rank))


# --------------------------------------------------------------- environment
_ENV_READY = False


def setup_environment(rank: int, world: int):
    """Fake process group, fake CUDA streams, the oracle's fake-CUDA patches."""
    global _ENV_READY, torch, F, oracle, fakecuda, qlora_approx
    if _ENV_READY:
        return
    sys.path.insert(0, ORACLE_DIR)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch as _torch
    import torch.nn.functional as _F

    torch, F = _torch, _F
    import fakecuda as _fc

    fakecuda = _fc
    fakecuda.ensure_fake_cuda_backward()
    fakecuda.stub_cuda_queries()
    fakecuda.patch_module_apply_for_fake()
    import oracle as _oracle

    oracle = _oracle
    import qlora_approx as _qa

    qlora_approx = _qa
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    oracle.patch_transformers_for_fake()

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    import torch.distributed._tools.fake_collectives  # noqa: F401  (fake kernels of c10d ops)

    Streams.install()
    _patch_fsdp()
    _patch_data_ptr()
    _patch_bnb_fsdp_view()
    _patch_dtensor_propagation()
    for k, v in dict(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                     LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT="29500").items():
        os.environ[k] = v
    _ENV_READY = True


class Streams:
    """Fake torch.cuda streams and events. `torch.cuda.Stream()` needs a driver; FSDP
    only needs objects that compare, hash, wait and record. The current stream is a
    Python variable, so the tracker can read it at every allocation."""

    current = None
    default = None
    created: list = []

    class Stream:
        _ids = itertools.count(1)

        def __init__(self, device=None, priority=0, _default=False, **kw):
            self.stream_id = 0 if _default else next(Streams.Stream._ids)
            self.priority = priority
            self.device_index = 0
            self.device_type = 1
            self.device = torch.device("cuda", 0)
            self.waits = 0
            Streams.created.append(weakref.ref(self))

        def wait_stream(self, other):
            self.waits += 1

        def wait_event(self, ev):
            self.waits += 1

        def record_event(self, ev=None):
            ev = ev or Streams.Event()
            ev.stream = self
            return ev

        def synchronize(self):
            pass

        def query(self):
            return True

        def __repr__(self):
            return "<fake stream %d>" % self.stream_id

    class Event:
        def __init__(self, *a, **k):
            self.stream = None

        def record(self, stream=None):
            self.stream = stream or Streams.current
            return self

        def wait(self, stream=None):
            pass

        def synchronize(self):
            pass

        def query(self):
            return True

        def elapsed_time(self, other):
            return 0.0

    @staticmethod
    @contextlib.contextmanager
    def stream(s):
        prev = Streams.current
        if s is not None:
            Streams.current = s
        try:
            yield s
        finally:
            Streams.current = prev

    @classmethod
    def install(cls):
        cls.default = cls.Stream(_default=True)
        cls.current = cls.default
        c = torch.cuda
        c.Stream = cls.Stream
        c.Event = cls.Event
        c.current_stream = lambda device=None: cls.current
        c.default_stream = lambda device=None: cls.default
        c.stream = cls.stream
        c.set_stream = lambda s: setattr(cls, "current", s)
        c.synchronize = lambda device=None: None
        c.current_device = lambda: 0
        c.device_count = lambda: 1
        c.set_device = lambda d: None


RECORD_STREAM_CALLS = []


def _patch_fsdp():
    """FSDP1 asks its device handle `is_available()` and calls `record_stream` with a
    stream object; answer the first for FSDP only (init code elsewhere must keep
    seeing no CUDA, or it asks for the real generator) and log the second."""
    import torch.distributed.fsdp._common_utils as cu
    import torch.distributed.fsdp._flat_param  # noqa: F401
    import torch.distributed.fsdp._runtime_utils  # noqa: F401

    class _CudaHandle:
        def __getattr__(self, name):
            return getattr(torch.cuda, name)

        def is_available(self):
            return True

    handle = _CudaHandle()
    orig = cu._FSDPDeviceHandle.from_device.__func__

    def from_device(cls, device):
        return handle if device.type == "cuda" else orig(cls, device)

    cu._FSDPDeviceHandle.from_device = classmethod(from_device)

    # FSDP2's reset_sharded_param skips re-padding when `type(data) is torch.Tensor`
    # and the storage is unchanged; a FakeTensor fails the type test and would be
    # re-padded (one extra copy) at every lazy init. Let it pass the test.
    import builtins

    import torch.distributed.fsdp._fully_shard._fsdp_param as fsdp_param_mod
    from torch._subclasses.fake_tensor import FakeTensor

    def _type(x, *rest):
        if rest:
            return builtins.type(x, *rest)
        return torch.Tensor if builtins.type(x) is FakeTensor else builtins.type(x)

    fsdp_param_mod.type = _type

    def record_stream(tensor, stream):
        if tensor.device.type == "cuda":
            RECORD_STREAM_CALLS.append((id(tensor.untyped_storage()), getattr(stream, "stream_id", -1)))
            if TRACKER is not None:
                TRACKER.note_record_stream(tensor, stream)

    for name, mod in list(sys.modules.items()):
        if name.startswith("torch.distributed.fsdp") and hasattr(mod, "_no_dispatch_record_stream"):
            mod._no_dispatch_record_stream = record_stream


def _patch_data_ptr():
    """FakeTensor storages report data_ptr 0, which makes FSDP's "same storage?"
    checks always true. Give each fake storage its StorageImpl address instead
    (0 when resized to 0 bytes, as a freed CUDA storage reports)."""
    from torch._subclasses.fake_tensor import FakeTensor

    orig_st = torch.UntypedStorage.data_ptr

    def st_data_ptr(self):
        if self.device.type == "meta":
            return 0 if self.nbytes() == 0 else int(self._cdata)
        return orig_st(self)

    torch.UntypedStorage.data_ptr = st_data_ptr

    def t_data_ptr(self):
        st = self.untyped_storage()
        base = st.data_ptr()
        return 0 if base == 0 else base + self.storage_offset() * self.element_size()

    FakeTensor.data_ptr = t_data_ptr

    # `t.data = other` keeps a FakeTensor's Python-side `fake_device`; FSDP moves
    # parameters between host and device that way (FSDP2 init, FSDP1 CPU offload).
    base = torch._C.TensorBase.__dict__["data"]

    def _get_data(self):
        return base.__get__(self, type(self))

    def _set_data(self, value):
        base.__set__(self, value)
        dev = getattr(value, "fake_device", None)
        if dev is not None:
            self.fake_device = dev

    FakeTensor.data = property(_get_data, _set_data)

    # Pinned host memory is host memory: a fake host copy is enough (the fake mode has
    # no kernel for aten._pin_memory). FSDP CPU offload pins its CPU shards and grads.
    def _pin_memory(self, *a, **k):
        return self.clone() if self.device.type == "cpu" else self

    FakeTensor.pin_memory = _pin_memory
    FakeTensor.is_pinned = lambda self, *a, **k: self.device.type == "cpu"


def _patch_bnb_fsdp_view():
    """bitsandbytes re-wraps an FSDP view of a 4-bit weight into Params4bit in
    forward (`fix_4bit_weight_quant_state_from_module`); Params4bit cannot wrap a
    FakeTensor. Attach the module's quant_state to the view instead (same storage,
    no copy, as the re-wrap)."""
    try:
        import bitsandbytes.nn.modules as bm
    except Exception:
        return

    def fix(module):
        if getattr(module.weight, "quant_state", None) is not None:
            return
        module.weight.quant_state = module.quant_state

    bm.fix_4bit_weight_quant_state_from_module = fix

    # QuantState.as_dict (state_dict of a 4-bit Linear, which accelerate's FSDP2 prepare
    # takes) reads `offset.item()`: data-dependent on a fake tensor. Give it a real 0.
    import bitsandbytes.functional as BF

    orig_as_dict = BF.QuantState.as_dict

    class _Zero:
        def item(self):
            return 0.0

    def as_dict(self, packed=False):
        saved = getattr(self, "offset", None)
        if saved is not None and getattr(self, "nested", False):
            self.offset = _Zero()
            try:
                return orig_as_dict(self, packed)
            finally:
                self.offset = saved
        return orig_as_dict(self, packed)

    BF.QuantState.as_dict = as_dict


# ------------------------------------------------------------------- tracker
CATEGORIES = (
    "params_loaded",          # model parameters before wrapping (full, unsharded)
    "params_sharded_trainable",
    "params_sharded_frozen",
    "params_sharded_pre_upcast",  # FSDP1+accelerate: bf16 shard the orig-param views hold until lazy init
    "params_replicated",      # parameters FSDP does not manage (ignored / not wrapped)
    "quant_state",            # NF4 absmax / nested absmax / code (replicated on every rank)
    "buffers",
    "unsharded_params",       # all-gathered (padded) unsharded parameters
    "mp_shard",               # FSDP1 low-precision copy of the local shard
    "all_gather_buffers",     # FSDP2 all-gather input/output buffers
    "grads_unsharded",        # gradients of unsharded (flat) parameters before reduce-scatter
    "reduce_scatter_buffers",
    "grads",                  # sharded gradients (.grad of the sharded parameters)
    "optimizer_states",
    "optimizer_temps",
    "inputs",
    "activations",
    "backward_temps",
    "wrap_temps",
    "load_temps",
)
PHASE_DEFAULT = {
    "load": "load_temps",
    "wrap": "wrap_temps",
    "idle": "inputs",
    "forward": "activations",
    "backward": "backward_temps",
    "clip": "optimizer_temps",
    "optimizer": "optimizer_temps",
    "zero_grad": "optimizer_temps",
}
TRACKER = None
_PROPAGATING = [0]


def _patch_dtensor_propagation():
    """DTensor derives output metadata by running each op on global-shape fake
    tensors, in the active fake mode (ours). Those are not device allocations."""
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    orig = ShardingPropagator._propagate_tensor_meta_non_cached
    if getattr(orig, "_shard_trace", False):
        return

    def wrapped(self, op_schema):
        _PROPAGATING[0] += 1
        try:
            return orig(self, op_schema)
        finally:
            _PROPAGATING[0] -= 1

    wrapped._shard_trace = True
    ShardingPropagator._propagate_tensor_meta_non_cached = wrapped


class _Rec:
    __slots__ = ("nbytes", "cat", "desc", "stream", "ref", "recorded", "uid")
    _uids = itertools.count()

    def __init__(self, nbytes, cat, desc, stream):
        self.nbytes, self.cat, self.desc, self.stream = nbytes, cat, desc, stream
        self.ref = None
        self.recorded = False
        self.uid = next(_Rec._uids)  # which storage an event is about


def _make_tracker_class():
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    _CAT = torch.ops.aten.cat.default

    class ShardTracker(TorchDispatchMode):
        """Live device storages of this rank, as the caching allocator counts them."""

        def __init__(self, top=True, events=False):
            super().__init__()
            self.records = {}
            self.by_cat = defaultdict(int)
            self.by_stream = defaultdict(int)
            self.current = self.peak = 0
            self.peak_where = {}
            self.peak_cats = {}
            self.peak_streams = {}
            self.peak_top = None
            self.keep_top = top
            self._dirty = False
            # the same for the training steps alone (differs when loading or wrapping peaks)
            self.step_peak = 0
            self.step_peak_where = {}
            self.step_peak_cats, self.step_peak_streams, self.step_peak_top = {}, {}, None
            self._step_dirty = False
            self.phase, self.phase_label = "load", "load"
            self.phase_peaks, self.phase_peak_where = {}, {}
            self.phase_end, self.phase_end_cats = {}, {}
            self.category_override = None
            self.stream_cat = {}
            self.stream_name = {0: "default"}
            self.resolve_streams = None
            self.op_count = 0
            self.events = [] if events else None
            self.record_stream_bytes = 0
            self._orig_resize = None
            self.unknown_resizes = 0
            self.flat_grad_numels = set()  # FSDP1: unpadded numel of flat params that need a grad

        # ------------------------------------------------------------ streams
        def _stream_id(self):
            s = Streams.current
            return getattr(s, "stream_id", 0)

        def _cat_for_stream(self, sid):
            if sid == 0:
                return None
            if sid not in self.stream_cat and self.resolve_streams is not None:
                self.resolve_streams(self)
            return self.stream_cat.get(sid)

        def default_cat(self, resize_growth=False):
            if self.category_override:
                return self.category_override
            c = self._cat_for_stream(self._stream_id())
            if c:
                return c
            if resize_growth and self.phase in ("forward", "backward", "idle"):
                return "unsharded_params"
            return PHASE_DEFAULT.get(self.phase, "inputs")

        # ------------------------------------------------------------ storage
        def _event(self, kind, rec, delta, stream=None):
            if self.events is not None:
                self.events.append((self.op_count, kind, delta, rec.stream if stream is None else stream,
                                    rec.cat, self.phase_label, rec.uid))

        def _on_free(self, key, _ref):
            rec = self.records.get(key)
            if rec is None:
                return
            if rec.nbytes:
                self._before_decrease()
            del self.records[key]
            self._add(rec, -rec.nbytes)
            self._event("f", rec, -rec.nbytes)

        def _add(self, rec, delta):
            self.current += delta
            self.by_cat[rec.cat] += delta
            self.by_stream[rec.stream] += delta

        def register_storage(self, st, cat=None, desc=""):
            key = id(st)
            rec = self.records.get(key)
            if rec is not None:
                if cat is not None and rec.cat != cat:
                    self.by_cat[rec.cat] -= rec.nbytes
                    rec.cat = cat
                    self.by_cat[cat] += rec.nbytes
                return rec
            sid = self._stream_id()
            rec = _Rec(rounded(st.nbytes()), cat or self.default_cat(), desc, sid)
            rec.ref = weakref.ref(st, functools.partial(self._on_free, key))
            self.records[key] = rec
            self._add(rec, rec.nbytes)
            self._event("a", rec, rec.nbytes)
            self._update_peak(desc)
            return rec

        def register(self, t, cat=None, desc=""):
            if isinstance(t, DTensor):
                t = t._local_tensor
            if not isinstance(t, torch.Tensor) or t.device.type != "cuda":
                return None
            try:
                st = t.untyped_storage()
            except Exception:
                return None
            return self.register_storage(st, cat, desc)

        def retag(self, t, cat):
            if t is not None:
                self.register(t, cat)

        def note_record_stream(self, t, stream):
            rec = self.records.get(id(t.untyped_storage()))
            if rec is not None and not rec.recorded:
                rec.recorded = True
            if rec is not None:
                self._event("s", rec, 0, getattr(stream, "stream_id", 0))

        def _resize(self, st, size):
            self._orig_resize(st, size)
            rec = self.records.get(id(st))
            if rec is None:
                if size:
                    self.unknown_resizes += 1
                return
            new = rounded(st.nbytes())
            delta = new - rec.nbytes
            if delta == 0:
                return
            if delta < 0:
                self._before_decrease()
                if rec.recorded:
                    self.record_stream_bytes += rec.nbytes
                self._add(rec, delta)
                rec.nbytes = new
                self._event("r", rec, delta)
                return
            if rec.nbytes == 0:  # a fresh allocation into an old storage object
                sid = self._stream_id()
                cat = self.default_cat(resize_growth=True)
                rec.cat, rec.stream = cat, sid
                rec.recorded = False
            self._add(rec, delta)
            rec.nbytes = new
            self._event("r", rec, delta)
            self._update_peak("resize_ %s" % rec.desc)

        # --------------------------------------------------------------- peak
        def _update_peak(self, desc):
            cur = self.current
            lbl = self.phase_label
            if cur > self.phase_peaks.get(lbl, -1):
                self.phase_peaks[lbl] = cur
                self.phase_peak_where[lbl] = desc
            if cur > self.peak:
                self.peak = cur
                self.peak_where = {"phase": lbl, "op": desc, "op_index": self.op_count}
                self._dirty = True
            if cur > self.step_peak and lbl.startswith("step"):
                self.step_peak = cur
                self.step_peak_where = {"phase": lbl, "op": desc, "op_index": self.op_count}
                self._step_dirty = True

        def _before_decrease(self):
            # The live set right before the first decrease after a new peak is the
            # live set at that peak (only increases happened in between), with the
            # categories hooks gave it since (e.g. a gradient tagged by FSDP's hook).
            # So snapshot it only then: one O(live) pass per local maximum.
            if not (self._dirty or self._step_dirty):
                return
            agg = {}
            for r in self.records.values():
                if not r.nbytes:
                    continue
                k = (r.cat, r.desc, r.stream)
                a = agg.get(k)
                if a is None:
                    agg[k] = [r.nbytes, 1]
                else:
                    a[0] += r.nbytes
                    a[1] += 1
            cats, streams = defaultdict(int), defaultdict(int)
            for (c, _d, s), (b, _n) in agg.items():
                cats[c] += b
                streams[s] += b
            if self._dirty:
                self.peak_top = agg
                self.peak_cats, self.peak_streams = dict(cats), dict(streams)
            if self._step_dirty:
                self.step_peak_top = agg
                self.step_peak_cats, self.step_peak_streams = dict(cats), dict(streams)
            self._dirty = self._step_dirty = False

        # ------------------------------------------------------------- phases
        def set_phase(self, phase, label=None):
            self.phase_end[self.phase_label] = self.current
            self.phase_end_cats[self.phase_label] = {k: v for k, v in self.by_cat.items() if v}
            self.phase = phase
            self.phase_label = label or phase
            self.phase_peaks.setdefault(self.phase_label, self.current)
            self.phase_peak_where.setdefault(self.phase_label, "")

        def finish(self):
            self.phase_end[self.phase_label] = self.current
            self.phase_end_cats[self.phase_label] = {k: v for k, v in self.by_cat.items() if v}
            self._before_decrease()

        def top_at_peak(self, n=15, which=None):
            which = self.peak_top if which is None else which
            if not which:
                return []
            rows = sorted(which.items(), key=lambda kv: -kv[1][0])[:n]
            return [{"category": k[0], "what": k[1], "stream": self.stream_name.get(k[2], "stream%d" % k[2]),
                     "bytes": v[0], "count": v[1]} for k, v in rows]

        # ----------------------------------------------------------- dispatch
        def __enter__(self):
            from torch._guards import active_fake_mode

            self._active_fake_mode = active_fake_mode
            self._fake_mode_on_entry = active_fake_mode()
            self._orig_resize = torch.UntypedStorage.resize_
            tracker = self

            def resize_(st, size):
                return tracker._resize(st, size)

            torch.UntypedStorage.resize_ = resize_
            return super().__enter__()

        def __exit__(self, *a):
            torch.UntypedStorage.resize_ = self._orig_resize
            return super().__exit__(*a)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if any(issubclass(t, DTensor) for t in types):
                return NotImplemented  # let DTensor run its local ops, which come back here
            out = func(*args, **(kwargs or {}))
            if _PROPAGATING[0] or self._active_fake_mode() is not self._fake_mode_on_entry:
                return out  # DTensor's sharding propagation runs the op on global-shape fake args: no device memory
            self.op_count += 1
            flat, _ = tree_flatten(out)
            for t in flat:
                if isinstance(t, torch.Tensor) and not isinstance(t, DTensor) and t.device.type == "cuda":
                    desc = "%s %s %s" % (func.__name__, str(t.dtype).replace("torch.", ""), tuple(t.shape))
                    cat = None
                    if (self.phase == "backward" and func is _CAT and t.dim() == 1
                            and t.numel() in self.flat_grad_numels and not self.category_override):
                        # FSDP1: backward of the flat parameter's split into views is a cat,
                        # whose output is the unsharded flat gradient
                        cat = "grads_unsharded"
                    self.register(t, cat, desc)
            return out

    return ShardTracker


# --------------------------------------------------------------------- model
def load_config(args):
    if args.config:
        with open(args.config) as f:
            d = json.load(f)
        name = os.path.basename(args.config)
    else:
        d = dict(oracle.BUILTIN_CONFIGS[args.builtin])
        name = "builtin:" + args.builtin
    for kv in args.override or []:
        k, v = kv.split("=", 1)
        d[k] = json.loads(v)
    return name, d


def materialize(model, dev):
    """Meta parameters/buffers -> empty tensors on `dev` (ties kept)."""
    done = {}
    for m in model.modules():
        for name, p in list(m.named_parameters(recurse=False)):
            if p.device.type != "meta":
                continue
            if id(p) not in done:
                done[id(p)] = torch.nn.Parameter(torch.empty_like(p, device=dev), requires_grad=p.requires_grad)
                for k in ("quant_state", "blocksize", "compress_statistics", "quant_type", "quant_storage",
                          "bnb_quantized", "module"):
                    if hasattr(p, k):
                        setattr(done[id(p)], k, getattr(p, k))
            setattr(m, name, done[id(p)])
        for name, b in list(m.named_buffers(recurse=False)):
            if b.device.type == "meta":
                m.register_buffer(name, torch.empty_like(b, device=dev), persistent=name not in m._non_persistent_buffers_set)


def quantize_nf4(model, storage_dtype, blocksize=64, double_quant=True, skip=("lm_head",), target_device=None):
    """qlora_approx.quantize_linears_nf4 with a floating `bnb_4bit_quant_storage`
    (the FSDP-QLoRA setting): bnb's real quantize_4bit packs the weight into
    numel/2 bytes stored as `storage_dtype` elements, so FSDP can flatten it."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as BF
    from torch import nn
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    qlora_approx._install_fallback_emulation()
    if qlora_approx._DYNAMIC_MAP_HOST is None:
        with unset_fake_temporarily():
            qlora_approx._DYNAMIC_MAP_HOST = BF.create_dynamic_map()
    n = 0
    for _, parent in list(model.named_modules()):
        for cname, child in list(parent.named_children()):
            if type(child) is not nn.Linear or cname in skip:
                continue
            dev = target_device or child.weight.device
            BF.name2qmap["dynamic"] = qlora_approx._DYNAMIC_MAP_HOST.to(dev)
            lin = bnb.nn.Linear4bit.__new__(bnb.nn.Linear4bit)
            nn.Module.__init__(lin)
            lin.in_features, lin.out_features = child.in_features, child.out_features
            with torch.no_grad():
                # as from_pretrained does: one bf16 weight on the device at a time, quantized, dropped
                w = child.weight.detach()
                w = torch.empty(w.shape, dtype=torch.bfloat16, device=dev) if w.device != dev else w.to(torch.bfloat16)
                packed, qs = BF.quantize_4bit(w, blocksize=blocksize,
                                              compress_statistics=double_quant, quant_type="nf4",
                                              quant_storage=storage_dtype)
                del w
            p = nn.Parameter(packed, requires_grad=False)
            for k, v in dict(quant_state=qs, blocksize=blocksize, compress_statistics=double_quant,
                             quant_type="nf4", quant_storage=storage_dtype, bnb_quantized=True, module=lin).items():
                setattr(p, k, v)
            lin.weight = p
            lin.register_parameter("bias", None)
            lin.compute_dtype = torch.bfloat16
            lin.compute_type_is_set = True
            lin.quant_state = qs
            lin.quant_storage = storage_dtype
            lin.support_avx512bf16_for_cpu = False
            setattr(parent, cname, lin)
            n += 1
    model.is_loaded_in_4bit = True
    return n


def move_quant_states(model, device):
    """Quant states are not parameters: real Params4bit.to() moves them with the
    weight; here they are moved after wrapping (same bytes, replicated per rank)."""
    seen = set()
    for m in model.modules():
        qs = getattr(m, "quant_state", None)
        if qs is None or id(qs) in seen or qs.__class__.__name__ != "QuantState":
            continue
        seen.add(id(qs))
        if qs.absmax.device.type != "cuda":
            new = qs.to(device)
            if new is not None:
                qs = new
            m.quant_state = qs


def quant_state_tensors(model):
    seen = set()
    out = []
    for m in model.modules():
        stack = [getattr(m, "quant_state", None)]
        while stack:
            q = stack.pop()
            if q is None or id(q) in seen or q.__class__.__name__ != "QuantState":
                continue
            seen.add(id(q))
            for v in vars(q).values():
                if isinstance(v, torch.Tensor):
                    out.append(v)
                elif v is not None and v.__class__.__name__ == "QuantState":
                    stack.append(v)
    return out


def decoder_layer_class(model):
    names = set(getattr(model, "_no_split_modules", None) or [])
    for m in model.modules():
        if type(m).__name__ in names:
            return type(m)
    raise RuntimeError("no decoder layer class found (_no_split_modules=%s)" % names)


# ----------------------------------------------------------------- the run
def run(args) -> dict:
    setup_environment(args.rank, args.world)
    global TRACKER
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import AutoModelForCausalLM

    t0 = time.time()
    notes = []
    cfg_name, cfg_dict = load_config(args)
    hf_cfg = oracle.make_hf_config(cfg_dict, args.attn)
    sdpa = oracle.GpuLikeSDPA(args.sdpa_backend, emulate_fa_workspace=True)
    F.scaled_dot_product_attention = sdpa
    torch.nn.functional.scaled_dot_product_attention = sdpa

    method, fsdp_v, stack = args.method, args.fsdp, args.stack
    if stack == "torchtune" and fsdp_v != 2:
        raise SystemExit("--stack torchtune is FSDP2 only")
    # HF Trainer + FSDP: from_pretrained without device_map loads on the host and FSDP moves
    # each unit to its device; a bitsandbytes model is loaded onto the GPU by transformers.
    load = args.load or ("meta" if stack == "torchtune" else "gpu" if method == "qlora" else "cpu")
    args.load_resolved = load
    if stack == "torchtune" and load != "meta":
        raise SystemExit("--stack torchtune loads on meta (its recipe's init)")
    if stack == "torchtune" and args.cpu_offload:
        raise SystemExit("--stack torchtune --cpu-offload is not supported (the recipe materialises the "
                         "offloaded shards on the host; not emulated)")
    if fsdp_v == 2 and load == "rank0-cpu":
        raise SystemExit("--fsdp 2 --load rank0-cpu cannot run on fake tensors: accelerate moves the model to "
                         "meta (model.to('meta')), and a fake host tensor cannot be swapped for a meta one")
    load_dtype = torch.bfloat16 if args.load_dtype == "bf16" else torch.float32

    Tracker = _make_tracker_class()
    tracker = Tracker(top=args.top > 0, events=args.events)
    TRACKER = tracker
    fm = FakeTensorMode(allow_non_fake_inputs=True)
    mesh = None
    if fsdp_v == 2:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cuda", (args.world,))  # outside fake mode: it reads real rank tensors
        import torch.distributed.fsdp._fully_shard._fsdp_init as fi
        import torch.distributed.fsdp._fully_shard._fully_shard as fs

        fi._init_default_mesh = fs._init_default_mesh = lambda *a, **k: mesh  # accelerate passes mesh=None

    accelerator = None
    if stack == "hf":
        accelerator = make_accelerator(args)

    dist_info = {"world_size": args.world, "rank": args.rank, "fsdp_version": fsdp_v, "stack": stack,
                 "loading_path": load, "cpu_offload": bool(args.cpu_offload)}
    n_total = n_train = 0
    with fm, tracker:
        # ------------------------------------------------------------ load
        tracker.set_phase("load", "load")
        if load == "gpu":
            dev = "cuda"
        elif load == "cpu":
            dev = "cpu"
        elif load == "rank0-cpu":
            # rank 0 on the host; the other ranks hold meta tensors that FSDP1's
            # param_init_fn (to_empty) materialises unit by unit before the broadcast. A fake
            # meta tensor cannot be moved to the fake device (different dispatch keys), so
            # every rank builds on the host: the same device bytes per unit.
            dev = "cpu"
        else:
            dev = "meta"
        with torch.device("meta" if method == "qlora" else dev):
            model = AutoModelForCausalLM.from_config(hf_cfg, **{"dtype" if transformers_major() >= 5 else "torch_dtype": load_dtype})
        model.train()
        if method == "qlora":
            # from_pretrained + BitsAndBytesConfig: each Linear weight arrives in bf16 and is
            # quantized on its device; the rest is loaded as is
            nq = quantize_nf4(model, torch.bfloat16 if args.quant_storage == "bf16" else torch.uint8,
                              double_quant=not args.no_double_quant, target_device=torch.device(dev))
            if dev != "meta":
                materialize(model, torch.device(dev))
            notes.append("qlora: %d Linear layers -> NF4 (bnb quantize_4bit, quant_storage=%s; approximation, "
                         "see qlora_approx.py)" % (nq, args.quant_storage))
        kbit_prepare = False
        if method == "qlora":
            # TRL's SFTTrainer: prepare_model_for_kbit_training unless the 4-bit weights are on
            # cpu/meta ("sharded QLoRA"); HF Trainer alone never calls it.
            kbit_prepare = {"auto": dev == "cuda", "on": True, "off": False}[args.kbit_prepare]
            if kbit_prepare:
                model = kbit_prepare_emulated(model)
                notes.append("qlora: peft.prepare_model_for_kbit_training (non-4-bit params -> fp32)")
        if args.grad_ckpt and stack == "hf" and args.ckpt_impl == "hf":
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": bool(args.ckpt_reentrant)})
            if args.ckpt_reentrant:
                model.enable_input_require_grads()  # reentrant checkpointing needs a grad-requiring input
        if args.loss == "shift-contiguous" and transformers_major() >= 5:
            model.loss_function = shift_contiguous_causal_lm_loss  # transformers < 5 runs its own
        if method in ("lora", "qlora"):
            model = apply_lora(model, args, load_dtype if method == "lora" else torch.bfloat16)
        elif method == "full":
            for p in model.parameters():
                p.requires_grad_(True)
        register_loaded(tracker, model)  # (in a function: no loop variable may keep an old tensor alive)
        n_total, n_train = count_params(model, method)
        tracker.set_phase("load", "after_load")
        after_load = tracker.current

        # ------------------------------------------------------------ wrap
        tracker.set_phase("wrap", "wrap")
        layer_cls = decoder_layer_class(model.get_base_model() if hasattr(model, "get_base_model") else model)
        opt = None
        if stack == "hf" and fsdp_v == 1:
            model, wrap_desc = wrap_fsdp1_hf(args, accelerator, model, method, load, dist_info)
        elif stack == "hf":
            model, opt, wrap_desc = wrap_fsdp2_hf(args, accelerator, model, method, load, mesh, dist_info)
        else:
            model, wrap_desc = wrap_fsdp2_torchtune(args, model, layer_cls, mesh, dist_info)
        dist_info["wrap_policy"] = wrap_desc
        if method == "qlora":
            move_quant_states(model, torch.device("cuda", 0))
            for t in quant_state_tensors(model):
                tracker.retag(t, "quant_state")
        units = describe_units(model, fsdp_v)
        for p, managed in units["params"]:
            if managed == "pre_upcast":
                tracker.retag(p, "params_sharded_pre_upcast")
                continue
            tracker.retag(p, ("params_sharded_trainable" if p.requires_grad else "params_sharded_frozen")
                          if managed else "params_replicated")
        for b in model.buffers():
            tracker.retag(b, "buffers")
        tracker.resolve_streams = functools.partial(resolve_stream_roles, model, fsdp_v)
        install_grad_taggers(tracker, fsdp_v)
        if fsdp_v == 1:
            install_flat_param_hooks(model)

        trainable = [p for p in model.parameters() if p.requires_grad]
        if opt is None:
            opt_kwargs = dict(lr=1e-4, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8)
            opt_kwargs["fused" if args.adamw_impl == "fused" else "foreach"] = True
            if args.adamw_impl == "for":
                opt_kwargs = dict(lr=1e-4, weight_decay=0.0, foreach=False)
            opt = torch.optim.AdamW(trainable, **opt_kwargs)
            if accelerator is not None:
                opt = accelerator.prepare_optimizer(opt)
        base_opt = getattr(opt, "optimizer", opt)
        tagger = oracle._OptStateTagger(base_opt, tracker)
        tracker.set_phase("wrap", "after_wrap")
        after_wrap = tracker.current
        sharded_param_bytes = sum(tracker.records[id(loc(p).untyped_storage())].nbytes
                                  for p, managed in units["params"] if managed is True and loc(p).device.type == "cuda"
                                  and id(loc(p).untyped_storage()) in tracker.records)
        units["sharded_param_storage_bytes"] = sharded_param_bytes

        fmt = None
        if args.memtracker:
            if fsdp_v != 2:
                raise SystemExit("--memtracker: FSDPMemTracker tracks FSDP2 modules only")
            from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

            fmt = FSDPMemTracker(model, base_opt)

        # ----------------------------------------------------------- steps
        B, S = args.batch, args.seq
        vocab = hf_cfg.vocab_size
        root_fwd = model
        with contextlib.ExitStack() as es:
            for step in range(1, args.steps + 1):
                if fmt is not None and step == 2:
                    # entered after one step: DTensor's sharding propagation (which runs each op
                    # once on global-shape fake tensors, then caches) has warmed up
                    es.enter_context(fmt)
                elif fmt is not None and step > 2:
                    fmt.reset_mod_stats()
                tracker.set_phase("idle", "step%d.inputs" % step)
                input_ids = torch.randint(0, vocab, (B, S), device="cuda")
                labels = input_ids.clone()
                if fmt is not None and step == 2:
                    fmt.track_inputs((input_ids, labels))
                tracker.set_phase("forward", "step%d.forward" % step)
                out = root_fwd(input_ids=input_ids, labels=labels)
                loss = out["loss"] if isinstance(out, dict) else out.loss
                del out
                tracker.set_phase("backward", "step%d.backward" % step)
                loss.backward()
                del loss
                if stack == "hf" and args.max_grad_norm > 0:
                    tracker.set_phase("clip", "step%d.clip" % step)
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                tracker.set_phase("optimizer", "step%d.optimizer" % step)
                opt.step()
                tagger.tag()
                tracker.set_phase("zero_grad", "step%d.zero_grad" % step)
                opt.zero_grad(set_to_none=True)
                del input_ids, labels
                gc.collect()
            tracker.set_phase("idle", "end")
            tracker.finish()
        resolve_stream_roles(model, fsdp_v, tracker)

    TRACKER = None
    wall = time.time() - t0
    return build_row(args, tracker, cfg_name, cfg_dict, hf_cfg, method, load, dist_info, units, notes,
                     after_load, after_wrap, n_total, n_train, sdpa, fmt, wall, kbit_prepare)


def shift_contiguous_causal_lm_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, **kw):
    """The causal-LM loss as transformers 4.46-4.48 computed it: fp32 logits, then a
    contiguous copy of the shifted logits (transformers 5 pads the labels instead)."""
    logits = logits.float()
    shift_logits = logits[..., :-1, :].contiguous()
    shift_labels = labels[..., 1:].contiguous()
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = F.cross_entropy(shift_logits.view(-1, vocab_size), shift_labels.view(-1).to(shift_logits.device),
                           ignore_index=ignore_index, reduction=reduction)
    if reduction == "sum":
        loss = loss / num_items_in_batch
    return loss


def register_loaded(tracker, model):
    for p in model.parameters():
        tracker.retag(p, "params_loaded")
    for b in model.buffers():
        tracker.retag(b, "buffers")
    for t in quant_state_tensors(model):
        tracker.retag(t, "quant_state")


def kbit_prepare_emulated(model):
    """peft.prepare_model_for_kbit_training. PEFT leaves Params4bit alone by class name;
    the emulated 4-bit weights are plain Parameters, so they are hidden (an empty uint8
    stand-in) while PEFT casts the other parameters to fp32."""
    from peft import prepare_model_for_kbit_training

    hidden = []
    for m in model.modules():
        w = m._parameters.get("weight")
        if w is not None and getattr(w, "bnb_quantized", False):
            hidden.append((m, w))
            m._parameters["weight"] = torch.nn.Parameter(torch.empty(0, dtype=torch.uint8, device="meta"),
                                                         requires_grad=False)
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    for m, w in hidden:
        m._parameters["weight"] = w
    return model


def loc(p):
    from torch.distributed.tensor import DTensor

    return p._local_tensor if isinstance(p, DTensor) else p


def count_params(model, method):
    seen, tot, tr = set(), 0, 0
    for m in model.modules():
        for _, p in m.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            qs = getattr(p, "quant_state", None)
            n = int(qs.shape[0]) * int(qs.shape[1]) if qs is not None else p.numel()
            tot += n
            if p.requires_grad:
                tr += n
    return tot, tr


def apply_lora(model, args, base_dtype):
    from peft import LoraConfig, get_peft_model

    lcfg = LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                      target_modules=[t for t in args.lora_targets.split(",") if t], bias="none",
                      task_type="CAUSAL_LM")
    dev = next(model.parameters()).device
    prev = torch.get_default_dtype()
    torch.set_default_dtype(base_dtype if base_dtype.is_floating_point else torch.bfloat16)
    try:
        with torch.device(dev):
            model = get_peft_model(model, lcfg, autocast_adapter_dtype=(args.lora_dtype == "fp32"))
    finally:
        torch.set_default_dtype(prev)
    if args.lora_dtype == "bf16":
        for _, p in model.named_parameters():
            if p.requires_grad:
                p.data = p.data.to(torch.bfloat16)
    return model


def transformers_major():
    """The installed transformers' major version (5 renamed `torch_dtype` to `dtype`)."""
    return int(__import__("transformers").__version__.split(".")[0])


def make_accelerator(args):
    """accelerate's Accelerator with the FSDP plugin arguments transformers 5.x's
    TrainingArguments builds (`_process_fsdp_args`), bf16 mixed precision (or none,
    `--mixed-precision no`). accelerate before 1.6 knows FSDP1 only."""
    import inspect

    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin

    kw = dict(fsdp_version=args.fsdp, auto_wrap_policy="TRANSFORMER_BASED_WRAP",
              cpu_ram_efficient_loading=args.load == "rank0-cpu", state_dict_type="FULL_STATE_DICT")
    if args.cpu_offload:
        kw["cpu_offload"] = True
    if args.grad_ckpt and args.ckpt_impl == "fsdp":
        kw["activation_checkpointing"] = True  # fsdp_config activation_checkpointing: accelerate's own AC
    if "fsdp_version" not in inspect.signature(FullyShardedDataParallelPlugin).parameters:
        kw.pop("fsdp_version")  # accelerate < 1.6: FSDP1 only, FULL_SHARD spelled as a strategy
        kw["sharding_strategy"] = "FULL_SHARD"
    if args.fsdp == 1:
        kw.setdefault("sharding_strategy", None)
        if kw["sharding_strategy"] is None:
            kw.pop("sharding_strategy")
            kw["reshard_after_forward"] = "full_shard"
        kw.update(forward_prefetch=args.forward_prefetch,
                  backward_prefetch=args.backward_prefetch, use_orig_params=not args.no_orig_params,
                  sync_module_states=not args.no_sync_module_states, limit_all_gathers=not args.no_limit_all_gathers)
    else:
        kw.update(reshard_after_forward=True)
    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: True  # only while accelerate probes the machine
    try:
        plugin = FullyShardedDataParallelPlugin(**kw)
        acc = Accelerator(mixed_precision=args.mixed_precision, fsdp_plugin=plugin)
    finally:
        torch.cuda.is_available = real
    return acc


def wrap_fsdp1_hf(args, accelerator, model, method, load, dist_info):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    plugin = accelerator.state.fsdp_plugin
    if method in ("lora", "qlora"):
        if args.wrap == "trainer":
            try:
                from transformers.distributed.fsdp import update_fsdp_plugin_peft

                update_fsdp_plugin_peft(model, accelerator)  # PEFT's fsdp_auto_wrap_policy
            except ImportError:  # transformers < 5: Trainer._fsdp_qlora_plugin_updates
                from peft.utils.other import fsdp_auto_wrap_policy

                plugin.auto_wrap_policy = fsdp_auto_wrap_policy(model)
        if method == "qlora" and args.quant_storage == "bf16":
            # update_fsdp_plugin_peft does this from model.hf_quantizer, which the fake model lacks
            plugin.set_mixed_precision(torch.bfloat16, override=True)
    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: True
    try:
        model = accelerator.prepare_model(model)
    finally:
        torch.cuda.is_available = real
    mp = plugin.mixed_precision_policy
    dist_info.update(
        sharding_strategy=str(plugin.sharding_strategy or plugin.reshard_after_forward).split(".")[-1],
        use_orig_params=bool(plugin.use_orig_params),
        mixed_precision={"param_dtype": str(mp.param_dtype), "reduce_dtype": str(mp.reduce_dtype),
                         "buffer_dtype": str(mp.buffer_dtype)} if mp else None,
        backward_prefetch=str(plugin.backward_prefetch).split(".")[-1] if plugin.backward_prefetch else None,
        forward_prefetch=bool(plugin.forward_prefetch), limit_all_gathers=bool(plugin.limit_all_gathers),
        sync_module_states=bool(plugin.sync_module_states),
        cpu_ram_efficient_loading=bool(plugin.cpu_ram_efficient_loading),
        autocast_forward=bool(accelerator.native_amp),
        accelerate_upcasts_trainable_flat_params_to_fp32=True,
    )
    pol = plugin.auto_wrap_policy
    desc = getattr(pol, "func", pol)
    desc = getattr(desc, "__name__", str(desc))
    if isinstance(pol, functools.partial) and "policies" in pol.keywords:
        desc = "_or_policy(lambda: leaf module with trainable weight, transformer_auto_wrap_policy) [peft fsdp_auto_wrap_policy]"
    elif isinstance(pol, functools.partial) and "transformer_layer_cls" in pol.keywords:
        desc = "transformer_auto_wrap_policy(%s)" % ",".join(sorted(c.__name__ for c in pol.keywords["transformer_layer_cls"]))
    return model, desc


def wrap_fsdp2_hf(args, accelerator, model, method, load, mesh, dist_info):
    opt_kwargs = dict(lr=1e-4, weight_decay=0.0)
    opt_kwargs["fused" if args.adamw_impl == "fused" else "foreach"] = args.adamw_impl != "for"
    # Trainer creates the optimizer before accelerate's FSDP2 prepare (which swaps its
    # parameters out); keep no other reference to the unsharded parameters
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], **opt_kwargs)
    real = torch.cuda.is_available
    torch.cuda.is_available = lambda: True
    try:
        model, opt = accelerator.prepare(model, opt)
    finally:
        torch.cuda.is_available = real
    plugin = accelerator.state.fsdp_plugin
    mp = plugin.mixed_precision_policy
    dist_info.update(
        sharding_strategy="FULL_SHARD (reshard_after_forward=%s; embed own unit; [norm, lm_head] unit "
                          "reshard_after_forward=False; root reshard_after_forward=None)" % plugin.reshard_after_forward,
        use_orig_params=None,
        mixed_precision={"param_dtype": str(mp.param_dtype), "reduce_dtype": str(mp.reduce_dtype),
                         "output_dtype": str(mp.output_dtype)} if mp else None,
        backward_prefetch="FSDP2 implicit (one group ahead)", forward_prefetch="FSDP2 implicit",
        limit_all_gathers=None, sync_module_states=None,
        cpu_ram_efficient_loading=bool(plugin.cpu_ram_efficient_loading),
        autocast_forward=False, accelerate_upcasts_trainable_params_to_fp32=method != "qlora",
    )
    return model, opt, "accelerate fsdp2_prepare_model: fully_shard per decoder layer (transformer_based_wrap)"


def wrap_fsdp2_torchtune(args, model, layer_cls, mesh, dist_info):
    """torchtune full_finetune_distributed / lora_finetune_distributed: model on meta
    in bf16, activation checkpointing with checkpoint_wrapper (NO_REENTRANT) on each
    layer, fully_shard on every module named `*.layers.<i>`, then the root with
    reshard_after_forward=False; no MixedPrecisionPolicy (pure bf16); then rope
    buffers on the device and load_from_full_model_state_dict (one full parameter
    on the device at a time, distributed to its shard)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, distribute_tensor

    if args.grad_ckpt:
        apply_activation_checkpointing(
            model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
            check_fn=lambda m: isinstance(m, layer_cls))
    kw = {"reshard_after_forward": True, "mesh": mesh}
    if args.cpu_offload:
        from torch.distributed.fsdp import CPUOffloadPolicy

        kw["offload_policy"] = CPUOffloadPolicy()
    n = 0
    for name, m in reversed(list(model.named_modules())):
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] == "layers" and parts[-1].isdigit():
            fully_shard(m, **kw)
            n += 1
    fully_shard(model, **dict(kw, reshard_after_forward=False))
    # materialise: non-persistent buffers (rope) on the device, then each parameter
    # from a full copy on the device (distribute_tensor scatters it from rank 0)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for mod in list(model.modules()):
        if type(mod).__name__.endswith("RotaryEmbedding"):
            with torch.device("cuda"):
                fresh = type(mod)(config=base.config)
            for bname, b in fresh.named_buffers(recurse=False):
                mod.register_buffer(bname, b, persistent=False)
            mod.original_inv_freq = getattr(fresh, "original_inv_freq", None)
    target = "cpu" if args.cpu_offload else "cuda"
    for mod in list(model.modules()):
        for pname, p in list(mod.named_parameters(recurse=False)):
            if isinstance(p, DTensor):
                full = torch.empty(p.shape, dtype=p.dtype, device="cuda")
                sharded = distribute_tensor(full, p.device_mesh, p.placements)
                del full
                if target == "cpu":
                    sharded = DTensor.from_local(sharded._local_tensor.to("cpu"), p.device_mesh, p.placements,
                                                 run_check=False, shape=p.shape, stride=p.stride())
                newp = torch.nn.Parameter(sharded, requires_grad=p.requires_grad)
                setattr(mod, pname, newp)
            elif p.device.type == "meta":
                setattr(mod, pname, torch.nn.Parameter(torch.empty_like(p, device="cuda"), requires_grad=p.requires_grad))
    # FSDP2 re-reads the (re-assigned) sharded parameters
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            st = m._get_fsdp_state()
            pg = st._fsdp_param_group
            if pg is not None:
                for fp in pg.fsdp_params:
                    fp.reset_sharded_param()
    dist_info.update(
        sharding_strategy="FULL_SHARD (layers reshard_after_forward=True, root False)",
        use_orig_params=None, mixed_precision=None, backward_prefetch="FSDP2 implicit (one group ahead)",
        forward_prefetch="FSDP2 implicit", limit_all_gathers=None, sync_module_states=None,
        cpu_ram_efficient_loading=None, autocast_forward=False,
        activation_checkpointing="checkpoint_wrapper NO_REENTRANT per decoder layer" if args.grad_ckpt else None,
    )
    return model, "torchtune shard_model: fully_shard on '*.layers.<i>' (%d units) then root" % n


def describe_units(model, fsdp_v):
    """Every parameter with whether FSDP manages (shards) it, and per-unit sizes."""
    from torch.distributed.tensor import DTensor

    out = {"params": [], "units": []}
    seen = set()
    if fsdp_v == 1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        for m in FSDP.fsdp_modules(model):
            h = m._handle
            if h is None:
                continue
            fp = h.flat_param
            shard = fp._local_shard if hasattr(fp, "_local_shard") else fp
            out["units"].append({
                "module": type(m.module).__name__,
                "numel_unpadded": int(fp._unpadded_unsharded_size.numel()),
                "numel_padded": int(shard.numel()) * h.world_size if h.uses_sharded_strategy else int(shard.numel()),
                "shard_numel": int(shard.numel()),
                "dtype": str(shard.dtype).replace("torch.", ""),
                "device": shard.device.type,
                "requires_grad": bool(fp.requires_grad),
                "n_params": len(fp._fqns),
                "trainable_params": sum(1 for p in fp._params if p.requires_grad) if fp._params is not None else None,
            })
            seen.add(id(fp.untyped_storage()) if fp.device.type == "cuda" else id(fp))
            out["params"].append((fp, True))
        for p in model.parameters():
            if p.device.type == "cuda" and id(p.untyped_storage()) in seen:
                continue  # use_orig_params: a view into a flat parameter's shard
            if p.device.type == "cuda" and p.untyped_storage().nbytes():
                # an FSDP-managed original parameter that does not view the flat parameter:
                # accelerate replaced the flat parameter's data by an fp32 copy, and the views
                # point at the bf16 shard until FSDP's lazy init re-points them
                out["params"].append((p, "pre_upcast" if getattr(p, "_fsdp_flattened", False) else False))
        return out
    for p in model.parameters():
        out["params"].append((p, isinstance(p, DTensor)))
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            pg = m._get_fsdp_state()._fsdp_param_group
            if pg is None:
                continue
            out["units"].append({
                "module": type(m).__name__,
                "params": len(pg.fsdp_params),
                "shard_bytes": sum(rounded(fp._sharded_param_data.untyped_storage().nbytes())
                                   for fp in pg.fsdp_params if fp._sharded_param_data.device.type == "cuda"),
                "unsharded_numel": sum(fp.sharded_param.numel() for fp in pg.fsdp_params),
                "local_numel": sum(fp.sharded_param._local_tensor.numel() for fp in pg.fsdp_params),
                "dtype": str(pg.fsdp_params[0].sharded_param.dtype).replace("torch.", "") if pg.fsdp_params else None,
            })
    return out


def resolve_stream_roles(model, fsdp_v, tracker):
    """Name the fake streams after the FSDP attributes that hold them."""
    roles = {}
    if fsdp_v == 1:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        for m in FSDP.fsdp_modules(model):
            for attr, cat in (("_unshard_stream", "unsharded_params"), ("_post_backward_stream", "reduce_scatter_buffers"),
                              ("_pre_unshard_stream", "mp_shard"), ("_all_reduce_stream", "reduce_scatter_buffers")):
                s = getattr(m, attr, None)
                if s is not None and getattr(s, "stream_id", 0):
                    roles[s.stream_id] = (attr.strip("_"), cat)
            break
    else:
        from torch.distributed.fsdp import FSDPModule

        for m in model.modules():
            if isinstance(m, FSDPModule):
                ctx = m._get_fsdp_state()._comm_ctx
                for attr, cat in (("all_gather_copy_in_stream", "all_gather_buffers"), ("all_gather_stream", "all_gather_buffers"),
                                  ("reduce_scatter_stream", "reduce_scatter_buffers"), ("all_reduce_stream", "reduce_scatter_buffers")):
                    s = getattr(ctx, attr, None)
                    if s is not None and getattr(s, "stream_id", 0):
                        roles[s.stream_id] = (attr, cat)
                break
    for sid, (name, cat) in roles.items():
        tracker.stream_name[sid] = name
        tracker.stream_cat[sid] = cat


def _tag_unsharded_grad(g):
    if TRACKER is not None:
        TRACKER.retag(g, "grads_unsharded")


def install_flat_param_hooks(model):
    """FSDP1: tag the unsharded flat-parameter gradient as soon as autograd makes it."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    for m in FSDP.fsdp_modules(model):
        h = m._handle
        if h is not None and h.flat_param.requires_grad:
            h.flat_param.register_hook(_tag_unsharded_grad)
            if TRACKER is not None:
                TRACKER.flat_grad_numels.add(int(h.flat_param._unpadded_unsharded_size.numel()))


def install_grad_taggers(tracker, fsdp_v):
    """Tag unsharded gradients when FSDP's post-backward hook starts and sharded
    gradients when it ends."""
    if getattr(install_grad_taggers, "_done", None) == fsdp_v:
        return
    install_grad_taggers._done = fsdp_v
    if fsdp_v == 1:
        import torch.distributed.fsdp._runtime_utils as ru

        orig = ru._post_backward_hook

        def _post_backward_hook(state, handle, *unused):
            T = TRACKER
            flat_param = handle.flat_param if handle is not None else None
            if T is not None and flat_param is not None and flat_param.grad is not None:
                T.retag(flat_param.grad, "grads_unsharded")
            r = orig(state, handle, *unused)
            if T is not None and flat_param is not None:
                for g in (flat_param.grad, getattr(flat_param, "_saved_grad_shard", None),
                          getattr(flat_param, "_cpu_grad", None)):
                    if g is not None and g.device.type == "cuda":
                        T.retag(g, "grads")
            return r

        ru._post_backward_hook = _post_backward_hook
    else:
        from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam

        orig_init = FSDPParam.init_unsharded_param

        def init_unsharded_param(self):
            r = orig_init(self)
            up = getattr(self, "_unsharded_param", None)
            if up is not None and up.requires_grad and not getattr(up, "_shard_trace_hook", False):
                up.register_hook(_tag_unsharded_grad)
                up._shard_trace_hook = True
            return r

        FSDPParam.init_unsharded_param = init_unsharded_param

        import torch.distributed.fsdp._fully_shard._fsdp_param_group as pgm

        def with_category(fn, cat):
            @functools.wraps(fn)
            def wrapped(*a, **k):
                T = TRACKER
                if T is None:
                    return fn(*a, **k)
                prev = T.category_override
                T.category_override = cat
                try:
                    return fn(*a, **k)
                finally:
                    T.category_override = prev
            return wrapped

        # all-gather copy-in/output buffers; reduce-scatter input and output (the output
        # becomes the sharded gradient, re-tagged when post_backward returns)
        pgm.foreach_all_gather = with_category(pgm.foreach_all_gather, "all_gather_buffers")
        pgm.foreach_reduce = with_category(pgm.foreach_reduce, "reduce_scatter_buffers")
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        orig = FSDPParamGroup.post_backward

        def post_backward(self, *unused):
            T = TRACKER
            if T is not None:
                for fp in self.fsdp_params:
                    for g in (getattr(fp, "unsharded_accumulated_grad", None),):
                        if g is not None:
                            T.retag(g, "grads_unsharded")
                    try:
                        up = fp._unsharded_param if hasattr(fp, "_unsharded_param") else None
                    except Exception:
                        up = None
                    if up is not None and up.grad is not None:
                        T.retag(up.grad, "grads_unsharded")
            r = orig(self, *unused)
            if T is not None:
                for fp in self.fsdp_params:
                    g = fp.sharded_param.grad
                    if g is not None:
                        T.retag(g, "grads")
            return r

        FSDPParamGroup.post_backward = post_backward


# --------------------------------------------------------------------- output
def versions():
    import platform

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for m in ("transformers", "peft", "accelerate", "bitsandbytes"):
        try:
            out[m] = __import__(m).__version__
        except Exception:
            pass
    return out


def memtracker_summary(fmt):
    try:
        snap = fmt.get_tracker_snapshot("peak")
        for dev, s in snap.items():
            if str(dev).startswith("cuda"):
                return {getattr(k, "value", str(k)): int(v) for k, v in s.items() if v}
    except Exception as e:  # pragma: no cover
        return {"error": repr(e)}
    return {}


def build_row(args, tracker, cfg_name, cfg_dict, hf_cfg, method, load, dist_info, units, notes,
              after_load, after_wrap, n_total, n_train, sdpa, fmt, wall, kbit_prepare):
    def gb(x):
        return round(x / GiB, 4)

    phases = {}
    last = "step%d." % args.steps
    for lbl, pk in tracker.phase_peaks.items():
        ph = {"peak_bytes": pk, "peak_at": tracker.phase_peak_where.get(lbl, ""),
              "end_bytes": tracker.phase_end.get(lbl)}
        if lbl in ("after_load", "after_wrap", "end") or lbl.startswith(last):
            ph["end_by_category"] = tracker.phase_end_cats.get(lbl, {})
        phases[lbl] = ph
    step_peak = max([v["peak_bytes"] for k, v in phases.items() if k.startswith("step")] or [0])
    by_stream = {tracker.stream_name.get(k, "stream%d" % k): v for k, v in tracker.peak_streams.items()}
    cfg_used = oracle.config_summary(hf_cfg, cfg_dict)
    cfg_used["overrides"] = {kv.split("=", 1)[0]: json.loads(kv.split("=", 1)[1]) for kv in (args.override or [])}
    dist_info.update(
        units=len(units["units"]),
        sharded_param_storage_bytes=units.get("sharded_param_storage_bytes"),
        record_stream_freed_bytes=tracker.record_stream_bytes,
        unknown_storage_resizes=tracker.unknown_resizes,
    )
    row = {
        "tracer": TRACER,
        "label": args.label or default_label(args),
        "config_name": cfg_name,
        "config": cfg_used,
        "env": versions(),
        "job": {
            "method": method, "precision": ("bf16-mixed (HF Trainer bf16=True via accelerate)"
                                            if args.mixed_precision == "bf16" else
                                            "bf16 (HF Trainer without bf16: a bf16 model, no mixed precision)")
            if args.stack == "hf" else "bf16 (torchtune dtype=bf16, no mixed precision)",
            "load_dtype": args.load_dtype, "optimizer": "torch.optim.AdamW(%s)" % args.adamw_impl,
            "max_grad_norm": args.max_grad_norm if args.stack == "hf" else None,
            "lora": None if method == "full" else {"r": args.lora_r, "alpha": args.lora_alpha,
                                                   "dropout": args.lora_dropout, "targets": args.lora_targets.split(","),
                                                   "adapter_dtype": args.lora_dtype},
            "qlora": None if method != "qlora" else {"quant": "nf4 (approximation)", "quant_storage": args.quant_storage,
                                                     "double_quant": not args.no_double_quant,
                                                     "prepare_model_for_kbit_training": kbit_prepare},
            "micro_batch": args.batch, "seq_len": args.seq, "grad_ckpt": bool(args.grad_ckpt),
            "attn_implementation": args.attn, "sdpa_backend_policy": args.sdpa_backend, "steps": args.steps,
            "loss": "HF model loss (logits.float() + cross_entropy)" if args.loss == "hf" else
            "transformers 4.46-4.48 style: logits.float(), shifted .contiguous() copy, cross_entropy",
            "ckpt_reentrant": bool(args.ckpt_reentrant),
            "ckpt_impl": args.ckpt_impl if args.grad_ckpt else None,
        },
        "dist": dist_info,
        "params": {"total": n_total, "trainable": n_train},
        "attention_calls": sdpa.calls,
        "measured": {
            "peak_allocated_bytes": tracker.peak,
            "peak_allocated_gib": gb(tracker.peak),
            "peak_at": tracker.peak_where,
            "step_peak_allocated_bytes": step_peak,
            "after_load_bytes": after_load,
            "after_wrap_bytes": after_wrap,
            "end_bytes": tracker.current,
            "phases": phases,
            "breakdown_at_peak": tracker.peak_cats,
            "breakdown_at_peak_gib": {k: gb(v) for k, v in tracker.peak_cats.items() if v},
            "by_stream_at_peak": by_stream,
        },
        "units": dedupe_units(units["units"]),
        "units_total": len(units["units"]),
        "wall_time_s": round(wall, 2),
        "notes": notes,
    }
    if args.top > 0:
        row["measured"]["top_live_at_peak"] = tracker.top_at_peak(args.top)
    if tracker.step_peak and tracker.step_peak < tracker.peak:
        # the global peak is in loading or wrapping: the training steps' own peak as well
        m = row["measured"]
        m["step_peak_at"] = tracker.step_peak_where
        m["breakdown_at_step_peak"] = tracker.step_peak_cats
        m["by_stream_at_step_peak"] = {tracker.stream_name.get(k, "stream%d" % k): v
                                       for k, v in tracker.step_peak_streams.items()}
        if args.top > 0:
            m["top_live_at_step_peak"] = tracker.top_at_peak(args.top, tracker.step_peak_top)
    if fmt is not None:
        row["fsdp_mem_tracker_peak"] = memtracker_summary(fmt)
        row["fsdp_mem_tracker_window"] = "steps 2..%d" % args.steps
        row["measured"]["peak_from_step2_bytes"] = max(
            [v["peak_bytes"] for k, v in phases.items() if k.startswith("step") and not k.startswith("step1.")] or [0])
    if tracker.events is not None:
        cats = sorted({e[4] for e in tracker.events})
        phs = []
        for e in tracker.events:
            if e[5] not in phs:
                phs.append(e[5])
        row["events"] = {
            "columns": ["op_index", "kind(a=alloc,f=free,r=resize,s=record_stream)", "delta_bytes",
                        "stream (s: the stream recorded)", "category", "phase", "storage"],
            "categories": cats, "phases": phs,
            "streams": {str(k): v for k, v in tracker.stream_name.items()},
            "rows": [[e[0], e[1], e[2], e[3], cats.index(e[4]), phs.index(e[5]), e[6]] for e in tracker.events],
        }
    return row


def dedupe_units(units):
    """FSDP units with the same shape, dtype and trainability, counted once."""
    out = {}
    for u in units:
        k = json.dumps(u, sort_keys=True)
        if k in out:
            out[k]["count"] += 1
        else:
            out[k] = dict(u, count=1)
    return list(out.values())


def default_label(args):
    src = os.path.basename(args.config).replace(".json", "") if args.config else args.builtin
    parts = [src]
    for kv in args.override or []:
        parts.append(kv.replace("num_hidden_layers=", "L").replace("=", ""))
    parts += ["fsdp%d" % args.fsdp, args.stack, args.method, "w%d" % args.world, "r%d" % args.rank,
              "b%ds%d" % (args.batch, args.seq), "ckpt" if args.grad_ckpt else "nockpt",
              "load-" + getattr(args, "load_resolved", args.load or "default")]
    flags = [(args.cpu_offload, "offload"), (args.wrap != "trainer" and args.method != "full", "wrap-" + args.wrap),
             (args.lora_dtype != "fp32" and args.method != "full", "lora-" + args.lora_dtype),
             (args.ckpt_reentrant, "reentrant"), (args.mixed_precision == "no", "mp-no"), (args.grad_ckpt and args.ckpt_impl != "hf", "ac-" + args.ckpt_impl),
             (args.loss != "hf", "loss-" + args.loss), (args.no_orig_params, "no-orig-params"),
             (args.no_sync_module_states, "no-sync"), (args.backward_prefetch != "BACKWARD_PRE" and args.fsdp == 1,
                                                       "bwd-" + args.backward_prefetch.lower())]
    parts += [name for on, name in flags if on]
    if transformers_major() < 5:  # a transformers 4.x run says which
        parts.append("tf" + ".".join(__import__("transformers").__version__.split(".")[:2]))
    return "-".join(parts)


# ------------------------------------------------------------------------ CLI
def build_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--config", help="HF config.json")
    src.add_argument("--builtin", help="built-in tiny config of the oracle (tiny-llama, ...)")
    p.add_argument("--override", action="append", help="config override KEY=JSON (repeatable)")
    p.add_argument("--table", nargs="+", help="print a markdown table of these fixture files")
    p.add_argument("--matrix", help="run a named fixture matrix (tiny-fsdp1, tiny-fsdp2, tiny-events, llama1b, world8, llama7b, llama70b-qlora, offload, transformers-4.48, all)")
    p.add_argument("--fsdp", type=int, choices=[1, 2], default=1)
    p.add_argument("--stack", choices=["hf", "torchtune"], default="hf")
    p.add_argument("--method", choices=["full", "lora", "qlora"], default="full")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--ranks", help="comma list: run each rank in its own process (sequentially)")
    p.add_argument("--load", choices=["gpu", "cpu", "rank0-cpu", "meta"],
                   help="gpu: model fully on each rank's GPU before wrapping (default for hf); cpu: on the "
                        "host on every rank; rank0-cpu: cpu_ram_efficient_loading (rank 0 host, others meta, "
                        "sync_module_states); meta: torchtune's meta init + sharded load")
    p.add_argument("--load-dtype", choices=["bf16", "fp32"], default="bf16",
                   help="dtype the model is loaded in (from_pretrained torch_dtype)")
    p.add_argument("--cpu-offload", action="store_true", help="FSDP1 CPUOffload(offload_params=True) / FSDP2 CPUOffloadPolicy")
    p.add_argument("--mixed-precision", choices=["bf16", "no"], default="bf16",
                   help="hf stack: accelerate's mixed_precision (no: the Trainer without --bf16, a bf16 "
                        "model trained in bf16 without autocast or fp32 copies)")
    p.add_argument("--backward-prefetch", default="BACKWARD_PRE", help="FSDP1: BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH")
    p.add_argument("--forward-prefetch", action="store_true")
    p.add_argument("--no-limit-all-gathers", action="store_true")
    p.add_argument("--no-orig-params", action="store_true", help="FSDP1 use_orig_params=False")
    p.add_argument("--no-sync-module-states", action="store_true")
    p.add_argument("--wrap", choices=["trainer", "transformer"], default="trainer",
                   help="PEFT under FSDP1: trainer = PEFT's fsdp_auto_wrap_policy as Trainer sets it; "
                        "transformer = decoder layers only")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--lora-dropout", type=float, default=0.0)
    p.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    p.add_argument("--lora-dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--quant-storage", choices=["bf16", "uint8"], default="bf16")
    p.add_argument("--no-double-quant", action="store_true")
    p.add_argument("--kbit-prepare", choices=["auto", "on", "off"], default="off",
                   help="qlora: peft.prepare_model_for_kbit_training (HF Trainer alone: off)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--grad-ckpt", action="store_true")
    p.add_argument("--ckpt-impl", choices=["hf", "fsdp"], default="hf",
                   help="hf: model.gradient_checkpointing_enable (Trainer gradient_checkpointing=True); "
                        "fsdp: fsdp_config activation_checkpointing (accelerate applies checkpoint_wrapper)")
    p.add_argument("--ckpt-reentrant", action="store_true",
                   help="hf stack: use_reentrant=True (transformers < 5 default when no kwargs are given)")
    p.add_argument("--loss", choices=["hf", "shift-contiguous"], default="hf",
                   help="hf: this transformers' loss; shift-contiguous: transformers 4.46-4.48's")
    p.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    p.add_argument("--sdpa-backend", choices=["auto", "flash", "efficient", "math"], default="auto")
    p.add_argument("--adamw-impl", choices=["fused", "foreach", "for"], default="fused")
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="hf stack: Trainer's clipping (0: off)")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--memtracker", action="store_true", help="FSDP2: also run torch's FSDPMemTracker")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--events", action="store_true", help="store every allocation/free/resize (tiny models only)")
    p.add_argument("--out", help="append the row (one JSON line) to this file")
    p.add_argument("--label")
    return p


def run_ranks(argv, ranks, out):
    """One process per rank, one after the other (fake PG state is per process)."""
    rows = []
    for r in ranks:
        cmd = [sys.executable, os.path.abspath(__file__)] + strip_arg(argv, "--ranks") + ["--rank", str(r)]
        t0 = time.time()
        proc = subprocess.run(cmd + ["--print-row"], capture_output=True, text=True)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not line:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit("rank %d failed (rc=%d)" % (r, proc.returncode))
        row = json.loads(line[-1])
        row["process_wall_s"] = round(time.time() - t0, 1)
        rows.append(row)
        if out:
            with open(out, "a") as f:
                f.write(json.dumps(row) + "\n")
    return rows


def strip_arg(argv, name):
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == name:
            skip = True
            continue
        if a.startswith(name + "="):
            continue
        if a in ("--rank",) or a.startswith("--rank="):
            skip = a == "--rank"
            continue
        out.append(a)
    return out


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    print_row = "--print-row" in argv
    if print_row:
        argv.remove("--print-row")
    p = build_parser()
    args = p.parse_args(argv)
    if args.matrix:
        return run_matrix(args.matrix)
    if args.table:
        return table(args.table)
    if not args.config and not args.builtin:
        p.error("--config or --builtin is required")
    if args.ranks:
        rows = run_ranks(argv, [int(x) for x in args.ranks.split(",")], args.out)
        for r in rows:
            print(summary_line(r))
        return
    row = run(args)
    line = json.dumps(row)
    if print_row:
        print(line)
        return
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    print(summary_line(row))


def summary_line(row):
    m = row["measured"]
    top = ", ".join("%s %.2f" % (k, v) for k, v in sorted(m["breakdown_at_peak_gib"].items(), key=lambda kv: -kv[1])[:5])
    return "%-70s peak %.3f GiB at %s | %s" % (row["label"][:70], m["peak_allocated_gib"], m["peak_at"].get("phase"), top)


# -------------------------------------------------------------------- matrix
TINY = ["--builtin", "tiny-llama", "--override", "num_hidden_layers=3", "--override", "vocab_size=1001",
        "--batch", "2", "--seq", "64"]
L1B = ["--config", os.path.join(ORACLE_DIR, "configs", "meta-llama--Llama-3.2-1B-Instruct.json"),
       "--batch", "1", "--seq", "2048"]
L7B = ["--config", os.path.join(MODELS_DIR, "meta-llama--Llama-2-7b-hf.json")]
L70B = ["--config", os.path.join(MODELS_DIR, "meta-llama--Llama-2-70b-hf.json"), "--method", "qlora",
        "--lora-r", "16", "--lora-alpha", "16", "--lora-targets", "q_proj,k_proj,v_proj,o_proj",
        "--batch", "2", "--seq", "4096", "--grad-ckpt", "--world", "2"]
TT_LORA = ["--method", "lora", "--lora-dtype", "bf16"]  # torchtune keeps LoRA weights in the model dtype
MT = ["--memtracker", "--steps", "3"]


# The published FSDP rows of fms-acceleration (transformers 4.48.1, PEFT 0.13.2, accelerate
# 1.0.1): reentrant checkpointing wrapped around each FSDP unit, as transformers < 4.52 does.
M7B_TF4 = ["--config", os.path.join(MODELS_DIR, "mistralai--Mistral-7B-v0.1.json"), "--lora-r", "16",
           "--lora-alpha", "16", "--lora-dropout", "0.1", "--lora-targets", "q_proj,k_proj,v_proj,o_proj",
           "--seq", "4096", "--grad-ckpt", "--ckpt-reentrant", "--world", "2"]
L70B_TF4 = L70B + ["--lora-dropout", "0.1", "--ckpt-reentrant"]
TF4_VERSIONS = {"transformers": "4.48.1", "peft": "0.13.2", "accelerate": "1.0.1"}


def _both_worlds(base, extra_runs):
    runs = []
    for w in (2, 4):
        for extra in extra_runs:
            runs.append((base + extra + ["--world", str(w)], [0, w - 1]))
    return runs


MATRIX = {
    # name -> (file, [(argv, ranks), ...])
    "tiny-fsdp1": ("fsdp-tiny-fsdp1.jsonl", _both_worlds(TINY, [
        ["--fsdp", "1", "--method", "full", "--grad-ckpt"],
        ["--fsdp", "1", "--method", "full"],
        ["--fsdp", "1", "--method", "lora", "--grad-ckpt"],
        ["--fsdp", "1", "--method", "qlora", "--grad-ckpt"],
    ]) + [
        (TINY + ["--fsdp", "1", "--method", "lora", "--grad-ckpt", "--wrap", "transformer", "--lora-dtype", "bf16",
                 "--world", "2"], [0, 1]),
        (TINY + ["--fsdp", "1", "--method", "full", "--grad-ckpt", "--cpu-offload", "--world", "2"], [0, 1]),
        (TINY + ["--fsdp", "1", "--method", "full", "--grad-ckpt", "--load", "gpu", "--world", "2"], [0, 1]),
        (TINY + ["--fsdp", "1", "--method", "full", "--grad-ckpt", "--load", "rank0-cpu", "--world", "2"], [0, 1]),
    ]),
    "tiny-fsdp2": ("fsdp-tiny-fsdp2.jsonl", _both_worlds(TINY, [
        ["--fsdp", "2", "--stack", "hf", "--method", "full", "--grad-ckpt"] + MT,
        ["--fsdp", "2", "--stack", "torchtune", "--method", "full", "--grad-ckpt"] + MT,
        ["--fsdp", "2", "--stack", "torchtune", "--grad-ckpt"] + TT_LORA + MT,
        ["--fsdp", "2", "--stack", "hf", "--method", "lora", "--grad-ckpt"] + MT,
    ]) + [
        (TINY + ["--fsdp", "2", "--stack", "hf", "--method", "qlora", "--grad-ckpt", "--world", "2"] + MT, [0, 1]),
        (TINY + ["--fsdp", "2", "--stack", "torchtune", "--method", "full", "--world", "2"] + MT, [0, 1]),
    ]),
    "tiny-events": ("fsdp-tiny-events.jsonl", [
        (TINY + ["--fsdp", "1", "--method", "full", "--grad-ckpt", "--world", "2", "--events", "--top", "0"], [0]),
        (TINY + ["--fsdp", "1", "--method", "qlora", "--grad-ckpt", "--world", "2", "--events", "--top", "0",
                 "--steps", "1"], [0]),
    ]),
    "llama1b": ("fsdp-llama-3.2-1b.jsonl", _both_worlds(L1B, [
        ["--fsdp", "1", "--method", "full", "--grad-ckpt"],
        ["--fsdp", "1", "--method", "lora", "--grad-ckpt"],
        ["--fsdp", "2", "--stack", "hf", "--method", "full", "--grad-ckpt"],
        ["--fsdp", "2", "--stack", "torchtune", "--method", "full", "--grad-ckpt"],
        ["--fsdp", "2", "--stack", "hf", "--method", "lora", "--grad-ckpt"],
        ["--fsdp", "1", "--method", "qlora", "--grad-ckpt"],
    ]) + [
        (L1B + ["--fsdp", "1", "--method", "lora", "--world", "2"], [0, 1]),
        # question a at 1B scale: adapters inside the decoder-layer flat parameter
        (L1B + ["--fsdp", "1", "--method", "lora", "--grad-ckpt", "--wrap", "transformer", "--lora-dtype", "bf16",
                "--world", "2"], [0, 1]),
    ]),
    "world8": ("fsdp-world-8.jsonl", [
        (L1B + ["--world", "8"] + extra, [0, 7]) for extra in (
            ["--fsdp", "1", "--method", "full", "--grad-ckpt"],
            ["--fsdp", "1", "--method", "lora", "--grad-ckpt"],
            ["--fsdp", "1", "--method", "qlora", "--grad-ckpt"],
            ["--fsdp", "2", "--stack", "hf", "--method", "full", "--grad-ckpt"],
            ["--fsdp", "2", "--stack", "torchtune", "--method", "full", "--grad-ckpt"],
        )
    ]),
    "llama7b": ("fsdp-llama-2-7b.jsonl", [
        # question c: torchtune full_finetune_distributed (llama2/7B_full: bf16, batch 2, AC on, fused AdamW)
        (L7B + ["--fsdp", "2", "--stack", "torchtune", "--method", "full", "--grad-ckpt", "--world", "4",
                "--batch", "2", "--seq", "512"], [0, 1, 2, 3]),
        (L7B + ["--fsdp", "2", "--stack", "torchtune", "--method", "full", "--world", "4",
                "--batch", "2", "--seq", "512"], [0, 3]),
        (L7B + ["--fsdp", "2", "--stack", "torchtune", "--method", "full", "--grad-ckpt", "--world", "4",
                "--batch", "2", "--seq", "512", "--override", "num_hidden_layers=4"] + MT, [0]),
        (L7B + ["--fsdp", "1", "--method", "full", "--grad-ckpt", "--world", "4", "--batch", "2", "--seq", "512"],
         [0, 3]),
        (L7B + ["--fsdp", "1", "--method", "lora", "--grad-ckpt", "--world", "2", "--batch", "1", "--seq", "2048"],
         [0, 1]),
        (L7B + ["--fsdp", "1", "--method", "qlora", "--grad-ckpt", "--world", "2", "--batch", "1", "--seq", "2048"],
         [0, 1]),
    ]),
    "llama70b-qlora": ("fsdp-llama-2-70b-qlora.jsonl", [
        (L70B + ["--fsdp", "1", "--override", "num_hidden_layers=4"], [0, 1]),
        (L70B + ["--fsdp", "1", "--override", "num_hidden_layers=8"], [0, 1]),
        (L70B + ["--fsdp", "1"], [0, 1]),
        (L70B + ["--fsdp", "1", "--override", "num_hidden_layers=8", "--ckpt-reentrant"], [0]),
        (L70B + ["--fsdp", "1", "--override", "num_hidden_layers=8", "--ckpt-impl", "fsdp"], [0]),
        (L70B + ["--fsdp", "1", "--override", "num_hidden_layers=8", "--loss", "shift-contiguous"], [0]),
        (L70B + ["--fsdp", "1", "--override", "num_hidden_layers=8", "--no-orig-params"], [0]),
        (L70B + ["--fsdp", "1", "--override", "num_hidden_layers=8", "--load", "rank0-cpu"], [0]),
        (L70B + ["--fsdp", "2", "--override", "num_hidden_layers=8"], [0]),
    ]),
    # CPU offload of the parameters: PEFT's FSDP-QLoRA recipe (accelerate's
    # fsdp_offload_params with cpu_ram_efficient_loading), and Llama-3.2-1B LoRA and full
    # under FSDP1 and accelerate's FSDP2.
    "offload": ("fsdp-offload.jsonl", [
        (L70B + ["--fsdp", "1", "--cpu-offload", "--load", "rank0-cpu", "--override", "num_hidden_layers=4"],
         [0, 1]),
        (L70B + ["--fsdp", "1", "--cpu-offload", "--load", "rank0-cpu", "--override", "num_hidden_layers=8",
                 "--world", "4"], [0]),
        (L70B + ["--fsdp", "1", "--cpu-offload", "--load", "rank0-cpu"], [0]),
    ] + [
        (L1B + ["--fsdp", str(v), "--stack", "hf", "--method", m, "--grad-ckpt", "--world", "2", "--cpu-offload"], [0])
        for v in (2, 1) for m in ("lora", "full")
    ]),
    "transformers-4.48": ("fsdp-transformers-4.48.jsonl", [
        (M7B_TF4 + ["--fsdp", "1", "--method", "qlora", "--batch", "4"], [0]),
        (M7B_TF4 + ["--fsdp", "1", "--method", "lora", "--batch", "4"], [0]),
        (M7B_TF4 + ["--fsdp", "1", "--method", "full", "--batch", "2", "--override", "num_hidden_layers=8"], [0]),
        (L70B_TF4 + ["--fsdp", "1"], [0]),
        (L70B_TF4 + ["--fsdp", "1", "--override", "num_hidden_layers=8", "--world", "4"], [0, 3]),
    ]),
}

# Matrices that need other library versions than the oracle's venv (run under their own).
VERSIONED = {"transformers-4.48": TF4_VERSIONS}


def table(paths):
    """Markdown table of fixture rows: peak per rank and the largest components at it
    (GiB, or MiB for rows under 1 GiB)."""
    print("| run | w | r | peak | at | step peak | after load / after wrap | largest at peak |")
    print("|---|---:|---:|---:|---|---:|---|---|")
    for path in paths:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                m, d = r["measured"], r["dist"]
                unit, div = ("GiB", GiB) if m["peak_allocated_bytes"] >= GiB else ("MiB", 1024 ** 2)
                top = ", ".join("%s %.2f" % (k, v / div) for k, v in
                                sorted(m["breakdown_at_peak"].items(), key=lambda kv: -kv[1])[:4])
                lbl = r["label"].replace("-w%d-r%d-" % (d["world_size"], d["rank"]), "-")
                print("| %s | %d | %d | %.3f %s | %s | %.3f | %.2f / %.2f | %s |" % (
                    lbl, d["world_size"], d["rank"], m["peak_allocated_bytes"] / div, unit,
                    m["peak_at"].get("phase"), m["step_peak_allocated_bytes"] / div,
                    m["after_load_bytes"] / div, m["after_wrap_bytes"] / div, top))


def run_matrix(name):
    names = [n for n in MATRIX if n not in VERSIONED] if name == "all" else [name]
    for n in names:
        if n not in MATRIX:
            raise SystemExit("unknown matrix %r (have: %s, all)" % (n, ", ".join(MATRIX)))
        for pkg, want in VERSIONED.get(n, {}).items():
            have = __import__(pkg).__version__
            if have != want:
                raise SystemExit("matrix %s needs %s %s (this Python has %s): see calibration/README.md"
                                 % (n, pkg, want, have))
        fname, runs = MATRIX[n]
        path = os.path.join(TRACES_DIR, fname)
        tmp = path + ".partial"
        if os.path.exists(tmp):
            os.remove(tmp)
        for argv, ranks in runs:
            for row in run_ranks(argv, ranks, tmp):
                print(summary_line(row), flush=True)
        os.replace(tmp, path)
        print("wrote", path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
