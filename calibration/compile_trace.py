#!/usr/bin/env python3
"""What torch.compile saves for backward in Hugging Face decoder layers, vs eager PyTorch.

Traces, on a CPU-only machine, the tensors that autograd keeps between forward and
backward ("saved activations") for N decoder layers of a Hugging Face causal LM,
built from a `config.json` under `FakeTensorMode` on a fake "cuda" device (no
weights, no arithmetic; the fake-CUDA helpers of ../../shared/oracle make autocast
and backward tracing behave as on a GPU):

* EAGER: every tensor passed to autograd's pack hook
  (`torch.autograd.graph.saved_tensors_hooks`) during the forward, deduplicated by
  storage; parameters are not counted. Each storage is attributed to the aten op
  that created it (a TorchDispatchMode) and to the module that was running.
* COMPILED: `torch.compile(stack, backend=<ours>, fullgraph=True, dynamic=False)`
  where <ours> is what Inductor's `compile_fx` does up to the partitioner:
  `torch._dynamo.backends.common.aot_autograd` with Inductor's decomposition table
  (`torch._inductor.decomposition.select_decomp_table`), Inductor's pre-grad passes
  (`torch._inductor.compile_fx.run_pre_grad_passes`) and Inductor's partition
  function (`torch._inductor.compile_fx.partition_fn`: joint-graph passes, then
  `torch._functorch.partitioners.min_cut_rematerialization_partition(...,
  compiler="inductor")`). The forward/backward "compilers" only record the graphs
  and run them as Python on fake tensors (no code generation). The saved tensors
  are the forward graph's outputs beyond its first `num_fwd_outputs` (tensors and
  SymInts); views are charged to their base, graph inputs that are parameters or
  buffers cost nothing.

The SDPA kernel choice is made as on an sm80+ GPU (flash when there is no mask and
the dtype is 16-bit, mem-efficient with a mask, math otherwise) by replacing
`torch.nn.functional.scaled_dot_product_attention` with a function that calls
`aten._scaled_dot_product_flash_attention` / `_scaled_dot_product_efficient_attention`
directly (the ops the CompositeImplicit SDPA would dispatch to on a GPU). Without
this, fake CUDA tensors on a GPU-less machine get the math kernel.

Cases (`--case`):
  layer  N decoder layers (`--layers`), inputs hidden_states [B,T,H] (requires grad)
         and position_ids; rotary cos/sin (and, with `--mask hf`, HF's
         `create_causal_mask`) are computed inside the traced region, as the model
         does. Per-layer bytes = saved(N+1 layers) - saved(N layers) (default N=2),
         so tensors shared by all layers (cos/sin, mask) and first-layer effects drop
         out; `--no-diff` divides the N-layer total minus shared tensors by N instead.
         A second call of the compiled module under a pack hook cross-checks the
         graph analysis (`compiled_hook_matches_graph` in the JSON).
  ckpt   the same with HF's non-reentrant gradient checkpointing
         (`gradient_checkpointing_enable(use_reentrant=False)`) inside the region.
  loss   lm_head + transformers' ForCausalLMLoss (fp32 logits, cross entropy).

Output: a human-readable summary on stdout and one JSON object per case appended
to `--out` (JSON lines). Example:

  PY=/work/oracle-venv/bin/python
  $PY calibration/compile_trace.py --config data/models/meta-llama--Llama-3.1-8B.json \\
      --precision bf16 --method full --seq 2048 --out /tmp/ct.jsonl
  $PY calibration/compile_trace.py --config data/models/google--gemma-2-2b.json \\
      --attn eager --mask hf --precision bf16-mixed --method lora --seq 1024
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ORACLE = os.path.normpath(os.path.join(HERE, "..", "..", "shared", "oracle"))

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# ----------------------------------------------------------------------------- setup
def setup(oracle_dir: str) -> list[str]:
    """Fake-CUDA patches from the oracle (backward on fake cuda, autocast checks,
    CUDA RNG stubs for checkpointing, Module._apply on fake params)."""
    sys.path.insert(0, oracle_dir)
    import fakecuda  # noqa: E402

    notes = ["backward patch: " + fakecuda.ensure_fake_cuda_backward()]
    notes += fakecuda.stub_cuda_queries()
    notes.append(fakecuda.patch_module_apply_for_fake())
    warnings.filterwarnings("ignore")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    return notes


def versions() -> dict:
    import torch
    import transformers

    v = {"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__}
    try:
        import peft

        v["peft"] = peft.__version__
    except Exception:  # pragma: no cover
        pass
    try:
        import torchtune

        v["torchtune"] = torchtune.__version__
    except Exception:  # pragma: no cover
        pass
    return v


def make_hf_config(path: str, attn: str, overrides: list[str]):
    from transformers import AutoConfig

    with open(path) as f:
        d = json.load(f)
    for kv in overrides or []:
        k, v = kv.split("=", 1)
        d[k] = json.loads(v)
    d = dict(d)
    model_type = d.pop("model_type")
    for k in ("architectures", "transformers_version", "torch_dtype", "dtype", "auto_map", "quantization_config"):
        d.pop(k, None)
    cfg = AutoConfig.for_model(model_type, **d)
    cfg.use_cache = False
    cfg._attn_implementation = attn
    return cfg


def dims(cfg) -> dict:
    H = cfg.hidden_size
    nh = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or nh
    hd = getattr(cfg, "head_dim", None) or H // nh
    return {"H": H, "I": cfg.intermediate_size, "heads": nh, "kv_heads": kv, "head_dim": hd,
            "vocab": cfg.vocab_size, "model_type": cfg.model_type}


# ------------------------------------------------------------------------------ SDPA
SDPA_CALLS: dict[str, int] = {}


def make_gpu_sdpa(orig):
    """F.scaled_dot_product_attention as an sm80+ GPU runs it (priority flash >
    mem-efficient > math), written with the aten ops the CompositeImplicit SDPA
    dispatches to, so that eager autograd and AOTAutograd see the same ops as on a
    GPU. Mirrors aten/src/ATen/native/transformers/attention.cpp: a bool mask is
    converted to an additive float mask in the query dtype (convert_boolean_attn_mask),
    padded to a multiple of 16 and expanded (preprocess_mask) for mem-efficient.
    Flash takes GQA (enable_gqa) natively, mem-efficient does not."""
    import torch

    def count(k):
        SDPA_CALLS[k] = SDPA_CALLS.get(k, 0) + 1

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                     scale=None, enable_gqa=False):
        if torch.is_autocast_enabled("cuda"):
            dt = torch.get_autocast_dtype("cuda")
            query, key, value = [x.to(dt) if x.dtype == torch.float32 else x for x in (query, key, value)]
        q, k, v = query, key, value
        low = q.dtype in (torch.float16, torch.bfloat16) and q.dtype == k.dtype == v.dtype
        d = q.shape[-1]
        same_heads = k.shape[1] == q.shape[1] and v.shape[1] == q.shape[1]
        gqa_ok = same_heads or (enable_gqa and q.shape[1] % k.shape[1] == 0)
        if scale is None:
            scale = 1.0 / math.sqrt(d)
        with torch.autocast("cuda", enabled=False):
            if attn_mask is None and low and d <= 256 and gqa_ok and not (is_causal and q.shape[-2] != k.shape[-2]):
                count("flash")
                if d % 8:
                    pad = 8 - d % 8
                    qp, kp, vp = (torch.nn.functional.pad(x, (0, pad)) for x in (q, k, v))
                    out = torch.ops.aten._scaled_dot_product_flash_attention(
                        qp, kp, vp, dropout_p, is_causal, False, scale=scale)[0]
                    return out[..., :d]
                return torch.ops.aten._scaled_dot_product_flash_attention(
                    q, k, v, dropout_p, is_causal, False, scale=scale)[0]
            if same_heads and q.dtype in (torch.float16, torch.bfloat16, torch.float32) and q.dtype == k.dtype == v.dtype:
                count("efficient")
                bias = attn_mask
                if bias is not None:
                    if bias.dtype == torch.bool:
                        bias = torch.where(bias.logical_not(), float("-inf"),
                                           torch.zeros((), dtype=q.dtype, device=q.device)).to(q.dtype)
                    else:
                        bias = bias.to(q.dtype)
                    Tk = k.shape[-2]
                    if Tk % 16:
                        bias = torch.nn.functional.pad(bias, (0, 16 - Tk % 16))[..., :Tk]
                    bias = bias.expand(q.shape[0], q.shape[1], q.shape[-2], Tk)
                return torch.ops.aten._scaled_dot_product_efficient_attention(
                    q, k, v, bias, True, dropout_p, is_causal, scale=scale)[0]
            count("math")
            return orig(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa)

    return scaled_dot_product_attention


_ORIG_SDPA = None


def patch_sdpa():
    global _ORIG_SDPA
    import torch

    if _ORIG_SDPA is None:
        _ORIG_SDPA = torch.nn.functional.scaled_dot_product_attention
        torch.nn.functional.scaled_dot_product_attention = make_gpu_sdpa(_ORIG_SDPA)


def patch_packed_detection_for_eager():
    """Eager on a GPU: HF's find_packed_sequence_indices sees arange position_ids and
    returns None (no packing), so SDPA gets no mask. Under fake tensors it cannot read
    values and assumes packing; answer None for FakeTensors outside dynamo, as the
    oracle does. Under dynamo (compile) HF's own rule applies (tracing -> a mask)."""
    import transformers.masking_utils as mu
    from torch._subclasses.fake_tensor import FakeTensor

    orig = mu.find_packed_sequence_indices

    def f(position_ids):
        import torch

        if isinstance(position_ids, FakeTensor) and not torch.compiler.is_compiling():
            return None
        return orig(position_ids)

    mu.find_packed_sequence_indices = f


# ----------------------------------------------------------------------------- modules
def build_stack(cfg, n_layers, mask_mode, ckpt):
    import torch
    from transformers import AutoModel

    base = AutoModel.from_config(cfg)
    if len(base.layers) < n_layers:
        raise SystemExit("the config has %d layers, the trace needs %d: pass --override num_hidden_layers=%d"
                         % (len(base.layers), n_layers, n_layers))

    class Stack(torch.nn.Module):
        """What the model's forward does between the embedding and the final norm."""

        def __init__(self):
            super().__init__()
            self.layers = base.layers[:n_layers]
            self.rotary_emb = base.rotary_emb
            self.cfg = cfg

        def forward(self, hidden_states, position_ids):
            masks = {"full_attention": None, "sliding_attention": None}
            if mask_mode == "hf":
                from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

                kw = dict(config=self.cfg, inputs_embeds=hidden_states, attention_mask=None, cache=None,
                          position_ids=position_ids)
                masks["full_attention"] = create_causal_mask(**kw)
                if "sliding_attention" in (getattr(self.cfg, "layer_types", None) or []):
                    masks["sliding_attention"] = create_sliding_window_causal_mask(**kw)
            types = getattr(self.cfg, "layer_types", None)
            if getattr(self.rotary_emb, "layer_types", None):
                # Gemma 3: one rotary embedding per layer type (`Gemma3TextModel.forward`)
                pes = {t: self.rotary_emb(hidden_states, position_ids, t) for t in set(types)}
            else:
                pe = self.rotary_emb(hidden_states, position_ids)
                pes = None
            for i, layer in enumerate(self.layers):
                m = masks[types[i]] if types else masks["full_attention"]
                hidden_states = layer(hidden_states, attention_mask=m, position_ids=position_ids,
                                      position_embeddings=pes[types[i]] if pes else pe)
            return hidden_states

    st = Stack()
    if ckpt:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return st


def torchtune_kwargs(cfg, n_layers) -> dict:
    """torchtune's llama3_2 builder arguments for an HF Llama config (torchtune 0.4
    `models/llama3_2/_model_builders.py`: `llama3_2_3b` passes these same fields)."""
    rs = getattr(cfg, "rope_scaling", None) or {}
    return dict(vocab_size=cfg.vocab_size, num_layers=n_layers, num_heads=cfg.num_attention_heads,
                num_kv_heads=cfg.num_key_value_heads, embed_dim=cfg.hidden_size,
                max_seq_len=cfg.max_position_embeddings, intermediate_dim=cfg.intermediate_size,
                rope_base=int(cfg.rope_theta if hasattr(cfg, "rope_theta") else
                              (cfg.rope_parameters or {}).get("rope_theta", 500000)),
                norm_eps=cfg.rms_norm_eps, scale_factor=int(rs.get("factor", 32)))


def build_torchtune_stack(cfg, n_layers, ckpt, lora_r, lora_dropout, lora):
    """torchtune's own decoder layers (`TransformerSelfAttentionLayer`), as its recipes
    build them: `llama3_2` / `lora_llama3_2` with the 3B LoRA config's targets
    (q_proj, v_proj, output_proj and the MLP), `set_trainable_params` on the adapters,
    and with `--case ckpt` `training.set_activation_checkpointing` (torchtune 0.4)."""
    import torch
    from torchtune.models.llama3_2 import llama3_2, lora_llama3_2

    from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE

    def apply_scaling(self, freqs, scale_factor, low_freq_factor, high_freq_factor, old_context_len):
        # torchtune's loop over `freqs` branches on values (no fake tensor can); the same
        # formula with `torch.where`: equal shapes, equal dtype.
        wavelen = 2 * math.pi / freqs
        smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        mid = (1 - smooth) * freqs / scale_factor + smooth * freqs
        return torch.where(wavelen < old_context_len / high_freq_factor, freqs,
                           torch.where(wavelen > old_context_len / low_freq_factor, freqs / scale_factor, mid))

    Llama3ScaledRoPE.apply_scaling = apply_scaling
    kw = torchtune_kwargs(cfg, n_layers)
    if lora:
        from torchtune.modules.peft import get_adapter_params, set_trainable_params

        base = lora_llama3_2(lora_attn_modules=["q_proj", "v_proj", "output_proj"], apply_lora_to_mlp=True,
                             apply_lora_to_output=False, lora_rank=lora_r, lora_alpha=2 * lora_r,
                             lora_dropout=lora_dropout, **kw)
        set_trainable_params(base, get_adapter_params(base))
    else:
        base = llama3_2(**kw)

    class Stack(torch.nn.Module):
        """What `TransformerDecoder.forward` does between the embedding and the final norm
        (no mask: SDPA `is_causal`; a packed batch's flex-attention BlockMask saves the same
        q, k, v, output and logsumexp)."""

        def __init__(self):
            super().__init__()
            self.layers = base.layers

        def forward(self, hidden_states, position_ids):
            for layer in self.layers:
                hidden_states = layer(hidden_states)
            return hidden_states

    st = Stack()
    if ckpt:
        from torchtune import modules, training

        training.set_activation_checkpointing(st, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
    return st


def build_torchtune_loss(cfg, chunks):
    """torchtune's output projection over `chunks` chunks of the final hidden state
    (`TransformerDecoder.chunked_output`) and `CEWithChunkedOutputLoss` with only
    `compute_cross_entropy` compiled, as `training.compile_loss` does (torchtune 0.4).
    The compiled call is made by the traced module itself: the chunking stays eager."""
    import torch
    from torchtune.modules.loss import CEWithChunkedOutputLoss

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.output = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            self.loss = CEWithChunkedOutputLoss(num_output_chunks=chunks) if chunks else StandardLoss()

        def forward(self, hidden_states, labels):
            if not chunks:
                # `TransformerDecoder.forward`: `self.output(h).float()`, eager
                return self.loss.compute_cross_entropy(self.output(hidden_states).float().flatten(0, 1),
                                                       labels.reshape(-1))
            logits = [self.output(c) for c in hidden_states.chunk(chunks, dim=1)]
            return self.loss(logits, labels)

    class StandardLoss(torch.nn.Module):
        """`loss: torch.nn.CrossEntropyLoss`, the whole module compiled by `compile_loss`."""

        def compute_cross_entropy(self, logits, labels):
            return torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100)

    return Head()


def build_loss(cfg):
    import torch
    from transformers.loss.loss_utils import ForCausalLMLoss

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head = torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

        def forward(self, hidden_states, labels):
            logits = self.lm_head(hidden_states)
            return ForCausalLMLoss(logits, labels, vocab_size=cfg.vocab_size)

    return Head()


# --------------------------------------------------------------------------- helpers
def nbytes_of(t) -> int:
    return t.numel() * t.element_size()


def shape_of(t):
    return [int(s) for s in t.shape]


def dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


class ModuleStack:
    """Forward pre/post hooks that keep the dotted path of the running module."""

    def __init__(self, root):
        self.stack = [""]
        self.handles = []
        for name, m in root.named_modules():
            self.handles.append(m.register_forward_pre_hook(self._pre(name)))
            self.handles.append(m.register_forward_hook(self._post(name), always_call=True))

    def _pre(self, name):
        def h(mod, args):
            self.stack.append(name)

        return h

    def _post(self, name):
        def h(mod, args, out):
            if self.stack and self.stack[-1] == name:
                self.stack.pop()

        return h

    @property
    def current(self):
        return self.stack[-1]

    def remove(self):
        for h in self.handles:
            h.remove()


def make_op_tagger(mstack):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class OpTagger(TorchDispatchMode):
        """Remembers, per storage, the first aten op that returned a tensor on it."""

        def __init__(self):
            super().__init__()
            self.by_storage = {}
            self.keep = []
            self.param_storages = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            flat, _ = tree_flatten(out)
            for t in flat:
                if isinstance(t, torch.Tensor):
                    try:
                        st = t.untyped_storage()
                    except Exception:
                        continue
                    k = id(st)
                    if k not in self.by_storage:
                        name = str(func.overloadpacket.__name__)
                        if name == "_to_copy" and args and isinstance(args[0], torch.Tensor):
                            try:
                                if id(args[0].untyped_storage()) in self.param_storages:
                                    name = "_to_copy(param)"
                            except Exception:
                                pass
                        self.by_storage[k] = (name, mstack.current)
                        self.keep.append(st)
            return out

    return OpTagger()


def norm_path(path: str) -> str:
    for pre in ("base_model.model.", "_orig_mod."):
        if path.startswith(pre):
            path = path[len(pre):]
    return path


def classify_module(path: str) -> str:
    path = norm_path(path)
    if path.startswith("layers."):
        return "layer"
    if path in ("", "rotary_emb") or path.startswith("rotary_emb"):
        return "shared"
    return "layer"


# ------------------------------------------------------------------------------- eager
def trace_eager(model, inputs, autocast, fm, layer_input):
    import torch

    mstack = ModuleStack(model)
    tagger = make_op_tagger(mstack)
    param_storages = {id(p.untyped_storage()) for p in model.parameters()}
    param_storages |= {id(b.untyped_storage()) for b in model.buffers()}
    tagger.param_storages = param_storages
    seen = {}
    order = []

    def pack(t):
        try:
            st = t.untyped_storage()
        except Exception:
            return t
        k = id(st)
        if k not in seen:
            seen[k] = (t, st, mstack.current)
            order.append(k)
        return t

    def unpack(t):
        return t

    ac = torch.autocast("cuda", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with fm, ac, torch.autograd.graph.saved_tensors_hooks(pack, unpack), tagger:
        out = model(*inputs)
    mstack.remove()
    items = []
    for k in order:
        t, st, mod_at_save = seen[k]
        if k in param_storages:
            continue
        op, mod = tagger.by_storage.get(k, ("<input>", ""))
        if layer_input is not None and k == id(layer_input.untyped_storage()):
            cat, op = "layer_input", "<input hidden_states>"
        elif op == "<input>":
            cat = "input"
        elif op == "_to_copy(param)":
            cat = "weight_cast"
        else:
            cat = classify_module(mod)
        items.append({"shape": shape_of(t), "dtype": dtype_name(t.dtype), "bytes": int(st.nbytes()),
                      "op": op, "module": mod, "saved_by": mod_at_save, "category": cat})
    return items, out


# ---------------------------------------------------------------------------- compiled
def make_backend(rec):
    import torch
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor import compile_fx as cfx
    from torch._inductor.decomposition import select_decomp_table

    def backend(gm, example_inputs):
        sources = []
        for n in gm.graph.find_nodes(op="placeholder"):
            ga = n.meta.get("grapharg")
            sources.append(ga.source.name if ga is not None and ga.source is not None else n.name)
        sources = [s() if callable(s) else s for s in sources]
        entry = {"dynamo_gm": gm, "sources": sources}
        rec.append(entry)

        def pfn(joint, joint_inputs, **kw):
            entry["num_fwd_outputs"] = kw.get("num_fwd_outputs")
            entry["joint_nodes"] = len(joint.graph.nodes)
            # Inductor's compile_fx sets the fake mode before its joint-graph passes; the
            # random-op pass (LoRA dropout) reads it.
            from torch._guards import detect_fake_mode
            from torch._inductor.virtualized import V

            with V.set_fake_mode(detect_fake_mode(joint_inputs)):
                fw, bw = cfx.partition_fn(joint, joint_inputs, **kw)
            entry["fw"] = fw
            entry["bw"] = bw
            return fw, bw

        def fwc(g, ex):
            return make_boxed_func(g.forward)

        kwargs = dict(fw_compiler=fwc, bw_compiler=fwc, partition_fn=pfn,
                      decompositions=select_decomp_table(), keep_inference_input_mutations=True)
        if hasattr(cfx, "run_pre_grad_passes"):
            kwargs["pre_grad_passes"] = cfx.run_pre_grad_passes
        with torch._functorch.config.patch(unlift_effect_tokens=True):
            return aot_autograd(**kwargs)(gm, example_inputs)

    return backend


def _base(node):
    import torch

    while (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
           and node.target.is_view and node.args and hasattr(node.args[0], "op")):
        node = node.args[0]
    return node


def _module_of(node) -> str:
    """Dotted path of the innermost nn.Module on the node's nn_module_stack
    (entries for inlined plain functions are skipped)."""
    stk = node.meta.get("nn_module_stack")
    if not stk:
        return ""
    path = ""
    for key, val in stk.items():
        p = val[0] if isinstance(val, tuple) else str(val)
        if not p.startswith("L['self']") and not p.startswith("L__self__"):
            continue
        path = p
    path = path.replace("L['self']", "").replace("._modules", "").replace("_modules", "")
    path = path.replace("[", ".").replace("]", "").replace("'", "").replace("..", ".").strip(".")
    return path


def analyse_compiled(entry, input_names):
    """input_names: {source substring: category} for non-parameter graph inputs."""
    import torch

    fw = entry["fw"]
    outs = list(fw.graph.find_nodes(op="output"))[0].args[0]
    n_out = entry["num_fwd_outputs"]
    saved = outs[n_out:]
    placeholders = list(fw.graph.find_nodes(op="placeholder"))
    ph_src = {}
    for i, p in enumerate(placeholders):
        ph_src[p] = entry["sources"][i] if i < len(entry["sources"]) else p.name
    items = []
    seen_base = set()
    for node in saved:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            items.append({"shape": [], "dtype": type(val).__name__, "bytes": 8, "op": "symint", "module": "",
                          "category": "symint", "node": node.name})
            continue
        b = _base(node)
        bval = b.meta.get("val")
        dup = b in seen_base
        seen_base.add(b)
        if b.op == "placeholder":
            src = ph_src.get(b, b.name)
            cat = None
            for key, c in input_names.items():
                if key in src:
                    cat = c
            if cat is None:
                cat = "param" if ("_parameters" in src or "_buffers" in src or "weight" in src) else "input"
            op = "<input %s>" % src
            mod = ""
        else:
            op = str(b.target).replace("aten.", "").replace("prims.", "prims.")
            if b.target is __import__("operator").getitem:
                parent = b.args[0]
                op = "%s[%d]" % (str(parent.target), b.args[1])
            mod = _module_of(b)
            cat = classify_module(mod)
            if b.target in (torch.ops.prims.convert_element_type.default, torch.ops.aten._to_copy.default):
                src = _base(b.args[0])
                if src.op == "placeholder":
                    s_name = ph_src.get(src, src.name)
                    if "_parameters" in s_name or "_buffers" in s_name:
                        cat = "weight_cast"
        nb = 0 if (dup or cat == "param") else nbytes_of(bval)
        items.append({"shape": shape_of(val), "dtype": dtype_name(val.dtype), "bytes": int(nb), "op": op,
                      "module": mod, "category": cat, "node": node.name,
                      "view_of": (b.name if b is not node else None), "duplicate_base": dup})
    return items


def count_ops(gm):
    import collections

    c = collections.Counter()
    for n in gm.graph.nodes:
        if n.op == "call_function":
            c[str(n.target)] += 1
    return c


# --------------------------------------------------------------------------------- run
def run_case(args, cfg, notes):
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    patch_sdpa()
    patch_packed_detection_for_eager()
    torch._inductor.config.joint_graph_constant_folding = args.constant_folding
    if args.skip_fwd_side_effects:
        torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint = True
    dm = dims(cfg)
    B, T = args.batch, args.seq
    precision, method = args.precision, args.method
    if precision == "bf16":
        base_dtype, autocast = torch.bfloat16, False
    elif precision == "bf16-mixed":
        base_dtype = torch.float32 if method == "full" else torch.bfloat16
        autocast = True
    elif precision == "fp32":
        base_dtype, autocast = torch.float32, False
    else:
        raise ValueError(precision)

    def build(fm, n_layers):
        with fm:
            prev = torch.get_default_dtype()
            torch.set_default_dtype(base_dtype)
            try:
                with torch.device("cuda"):
                    if args.builder == "torchtune" and args.case == "loss":
                        model = build_torchtune_loss(cfg, args.chunks)
                    elif args.builder == "torchtune":
                        model = build_torchtune_stack(cfg, n_layers, args.case == "ckpt", args.lora_r,
                                                      args.lora_dropout, method == "lora")
                    elif args.case == "loss":
                        model = build_loss(cfg)
                    else:
                        model = build_stack(cfg, n_layers, args.mask, args.case == "ckpt")
                    if method == "lora" and args.case == "loss":
                        # LoRA leaves lm_head frozen (not a target): only hidden_states needs a grad
                        for p_ in model.parameters():
                            p_.requires_grad_(False)
                    elif method == "lora" and args.builder == "hf":
                        from peft import LoraConfig, get_peft_model

                        targets = [t for t in LORA_TARGETS if any(n.endswith(t) for n, _ in model.named_modules())]
                        lcfg = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=args.lora_dropout,
                                          target_modules=targets, bias="none")
                        peft_model = get_peft_model(model, lcfg, autocast_adapter_dtype=True)
                        # trace the wrapped module itself (PeftModel.forward only forwards to it),
                        # so that module paths and input names stay those of the stack
                        model = peft_model.base_model.model
            finally:
                torch.set_default_dtype(prev)
            model.train()
            if method == "full":
                for p in model.parameters():
                    p.requires_grad_(True)
            hidden = torch.randn(B, T, dm["H"], dtype=base_dtype, device="cuda", requires_grad=True)
            if args.case == "loss":
                second = torch.randint(0, dm["vocab"], (B, T), device="cuda")
            else:
                second = torch.arange(T, device="cuda")[None].expand(B, T)
        return model, hidden, second

    BT = B * T
    result = {"model": os.path.basename(args.config).removesuffix(".json"), "case": args.case,
              "builder": args.builder, "chunks": args.chunks if args.case == "loss" else None,
              "precision": precision, "method": method, "lora": method == "lora",
              "lora_r": args.lora_r if method == "lora" else None,
              "lora_dropout": args.lora_dropout if method == "lora" else None,
              "B": B, "T": T, "layers": args.layers,
              "attn": args.attn, "mask": args.mask, "dims": dm, "base_dtype": dtype_name(base_dtype),
              "autocast_bf16": autocast}
    ac = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if autocast else contextlib.nullcontext
    names = {"L['hidden_states": "layer_input", "L['position_ids": "shared", "L['labels": "input"}

    def trace(n_layers, explain):
        r = {}
        if not args.skip_eager:
            fm = FakeTensorMode(allow_non_fake_inputs=True)
            model, hidden, second = build(fm, n_layers)
            SDPA_CALLS.clear()
            r["eager_items"], _ = trace_eager(model, (hidden, second), autocast, fm, hidden)
            r["eager_sdpa_calls"] = dict(SDPA_CALLS)
            del model, hidden, second
        if args.skip_compiled:
            return r
        torch._dynamo.reset()
        fm = FakeTensorMode(allow_non_fake_inputs=True)
        model, hidden, second = build(fm, n_layers)
        if explain:
            with fm, ac():
                ex = torch._dynamo.explain(model)(hidden, second)
            r["dynamo_explain"] = {
                "graph_count": ex.graph_count, "graph_break_count": ex.graph_break_count,
                "break_reasons": [str(x.reason)[:400] for x in ex.break_reasons]}
            torch._dynamo.reset()
        rec = []
        if args.builder == "torchtune" and args.case == "loss":
            # `training.compile_loss`: only the upcast + cross-entropy is compiled, once per
            # chunk shape; the output projection and the chunking run eagerly.
            model.loss.compute_cross_entropy = torch.compile(
                model.loss.compute_cross_entropy, backend=make_backend(rec), fullgraph=True, dynamic=False)
            compiled = model
        else:
            compiled = torch.compile(model, backend=make_backend(rec), fullgraph=not args.allow_breaks,
                                     dynamic=False)
        SDPA_CALLS.clear()
        t0 = time.time()
        with fm, ac():
            compiled(hidden, second)
        r["compile_seconds"] = round(time.time() - t0, 1)
        r["compiled_sdpa_calls"] = dict(SDPA_CALLS)
        entries = list(rec)
        r["compiled_graphs"] = len(entries)
        items, fw_ops = [], {}
        for entry in entries:
            if "fw" not in entry:
                continue
            items += analyse_compiled(entry, names)
            for k, v in count_ops(entry["fw"]).items():
                fw_ops[k] = fw_ops.get(k, 0) + v
        r["compiled_items"] = items
        r["compiled_fw_attention_ops"] = {k: v for k, v in fw_ops.items() if "attention" in k}
        # cross-check: call the compiled module again under a pack hook. AOTAutograd's
        # CompiledFunction saves its tensors with ctx.save_for_backward, so they reach the
        # hook (dynamo recompiles once for the hook state); eager code between graphs too.
        pstor = {id(p.untyped_storage()) for p in model.parameters()} | {
            id(b.untyped_storage()) for b in model.buffers()}
        seen = {}

        def pack(t):
            try:
                st = t.untyped_storage()
            except Exception:
                return t
            if id(st) not in pstor and id(st) not in seen:
                seen[id(st)] = (st, t)
            return t

        with fm, ac(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            compiled(hidden, second)
        r["compiled_hook_bytes"] = int(sum(st.nbytes() for st, _ in seen.values()))
        r["compiled_hook_count"] = len(seen)
        return r

    def totals(items):
        act = sum(i["bytes"] for i in items if i["category"] not in ("param", "weight_cast"))
        wc = sum(i["bytes"] for i in items if i["category"] == "weight_cast")
        shared = sum(i["bytes"] for i in items if i["category"] in ("shared", "input"))
        return act, wc, shared

    L = args.layers
    r1 = trace(L, args.explain)
    result.update({k: v for k, v in r1.items() if k not in ("eager_items", "compiled_items")})
    per_layer_case = args.case != "loss"
    r2 = trace(L + 1, False) if (per_layer_case and not args.no_diff) else None
    for kind in ("eager", "compiled"):
        key = kind + "_items"
        if key not in r1:
            continue
        act1, wc1, sh1 = totals(r1[key])
        summ = {"total_act_bytes_n": act1, "weight_cast_bytes_n": wc1, "shared_bytes_n": sh1, "n_layers": L}
        if r2 is not None:
            act2, wc2, _ = totals(r2[key])
            summ.update({"total_act_bytes_n_plus_1": act2, "per_layer_bytes": act2 - act1,
                         "per_layer_weight_cast_bytes": wc2 - wc1, "method": "difference of N+1 and N layers"})
        else:
            summ.update({"per_layer_bytes": (act1 - sh1) / L if per_layer_case else act1,
                         "per_layer_weight_cast_bytes": wc1 / L,
                         "method": "N layers, shared removed" if per_layer_case else "whole head + loss"})
        summ["per_layer_per_token"] = summ["per_layer_bytes"] / BT
        summ["shared_per_token"] = sh1 / BT
        result[kind + "_summary"] = summ
        result[kind + "_saved_bytes"] = summ["per_layer_bytes"]
        result[kind + "_saved"] = r1[key]
        if r2 is not None:
            result[kind + "_saved_n_plus_1"] = r2[key]
    if "compiled_items" in r1:
        g = sum(i["bytes"] for i in r1["compiled_items"] if i["category"] != "param")
        result["compiled_graph_bytes_n"] = g
        result["compiled_hook_matches_graph"] = (g == r1["compiled_hook_bytes"])
    result["config_flags"] = {
        "inductor.joint_graph_constant_folding": torch._inductor.config.joint_graph_constant_folding,
        "functorch.activation_memory_budget": torch._functorch.config.activation_memory_budget,
        "dynamo.skip_fwd_side_effects_in_bwd_under_checkpoint":
            torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint,
    }
    result["versions"] = versions()
    result["notes"] = notes
    return result


def fmt_items(items, BT):
    rows = []
    for i in items:
        if i["category"] == "param":
            continue
        rows.append("    %-11s %9.1f B/tok  %-9s %-22s %-44s %s" % (
            i["category"], i["bytes"] / BT, i["dtype"], str(tuple(i["shape"])), i["op"][:44], i["module"]))
    return "\n".join(rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--config", required=True, help="HF config.json (e.g. data/models/meta-llama--Llama-3.1-8B.json)")
    p.add_argument("--override", action="append", default=[], help="KEY=JSON config override")
    p.add_argument("--case", choices=["layer", "ckpt", "loss"], default="layer")
    p.add_argument("--layers", type=int, default=2,
                   help="decoder layers N in the traced stack; per-layer bytes = saved(N+1) - saved(N). The default "
                        "2 skips first-layer effects (gemma-2: layer 0 saves one [B,heads,T,T] tensor less)")
    p.add_argument("--precision", choices=["bf16", "bf16-mixed", "fp32"], default="bf16",
                   help="bf16: bf16 weights, no autocast. bf16-mixed: autocast(bf16); full FT fp32 weights, "
                        "LoRA bf16 base + fp32 adapters")
    p.add_argument("--method", choices=["full", "lora"], default="full")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-dropout", type=float, default=0.0)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    p.add_argument("--mask", choices=["none", "hf"], default="none",
                   help="none: no mask, SDPA is_causal (HF eager on GPU). hf: HF create_causal_mask inside the "
                        "traced region (what a whole-model torch.compile runs)")
    p.add_argument("--builder", choices=["hf", "torchtune"], default="hf",
                   help="hf: transformers' modules (+ PEFT LoRA). torchtune: torchtune's llama3_2 layers (+ its "
                        "LoRA on q, v, output_proj and the MLP) and, for --case loss, its chunked output and "
                        "CEWithChunkedOutputLoss with compute_cross_entropy compiled; needs torchtune importable")
    p.add_argument("--chunks", type=int, default=8,
                   help="torchtune loss: num_output_chunks; 0 for the standard loss (fp32 logits from the model, "
                        "the CrossEntropyLoss module compiled)")
    p.add_argument("--explain", action="store_true", help="also run torch._dynamo.explain (graph breaks)")
    p.add_argument("--allow-breaks", action="store_true", help="compile without fullgraph=True")
    p.add_argument("--constant-folding", action="store_true",
                   help="keep Inductor's joint-graph constant folding on (needs a real GPU: it evaluates on device)")
    p.add_argument("--skip-eager", action="store_true")
    p.add_argument("--skip-compiled", action="store_true", help="trace eager PyTorch only")
    p.add_argument("--no-diff", action="store_true",
                   help="do not also trace N+1 layers (per-layer bytes then = N-layer total minus shared, / N)")
    p.add_argument("--skip-fwd-side-effects", action="store_true",
                   help="set torch._dynamo.config.skip_fwd_side_effects_in_bwd_under_checkpoint (ckpt case)")
    p.add_argument("--oracle-dir", default=DEFAULT_ORACLE)
    p.add_argument("--out", help="append one JSON line per case to this file")
    p.add_argument("--full-lists", action="store_true", help="print every saved tensor")
    args = p.parse_args(argv)
    if args.case == "loss":
        args.layers = 1

    notes = setup(args.oracle_dir)
    if args.builder == "torchtune":
        # torchao builds lookup tables with real arithmetic at import: import outside the fake mode
        import torchtune.models.llama3_2  # noqa: F401
        import torchtune.modules.loss  # noqa: F401
        import torchtune.training  # noqa: F401
    cfg = make_hf_config(args.config, args.attn, args.override)
    res = run_case(args, cfg, notes)
    BT = args.batch * args.seq
    print("== %s case=%s precision=%s method=%s B=%d T=%d layers=%d attn=%s mask=%s" % (
        res["model"], res["case"], res["precision"], res["method"], res["B"], res["T"], res["layers"],
        res["attn"], res["mask"]))
    for kind in ("eager", "compiled"):
        sm = res.get(kind + "_summary")
        if not sm:
            continue
        extra = ""
        if kind == "compiled":
            extra = " graphs=%d attn_ops=%s hook_check=%s(%d vs %d)" % (
                res["compiled_graphs"], res["compiled_fw_attention_ops"], res["compiled_hook_matches_graph"],
                res["compiled_hook_bytes"], res["compiled_graph_bytes_n"])
        what = "total" if res["case"] == "loss" else "per layer"
        print("  %-8s: %s %.1f B/token (%s), shared %.1f B/token, weight casts %d B/layer, sdpa=%s%s" % (
            kind, what, sm["per_layer_per_token"], sm["method"], sm["shared_per_token"],
            sm["per_layer_weight_cast_bytes"], res.get(kind + "_sdpa_calls"), extra))
        if args.full_lists:
            print(fmt_items(res[kind + "_saved"], BT))
            if res.get(kind + "_saved_n_plus_1"):
                print("    -- %d layers:" % (res["layers"] + 1))
                print(fmt_items(res[kind + "_saved_n_plus_1"], BT))
    if "dynamo_explain" in res:
        print("  dynamo.explain:", res["dynamo_explain"])
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
