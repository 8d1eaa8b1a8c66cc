"""FlashAttention-2 (the `flash-attn` package) on fake CUDA tensors, for the step oracle.

transformers' `attn_implementation="flash_attention_2"` calls `flash_attn.flash_attn_func`,
a CUDA extension that neither installs nor runs without a GPU. `install()` puts in its place
an autograd function that allocates and saves what flash-attn 2.8.4 does (read from
github.com/Dao-AILab/flash-attention at 0251105a, `flash_attn/flash_attn_interface.py`
`FlashAttnFunc` and `csrc/flash_attn/flash_api.cpp` `mha_fwd` / `mha_bwd`), so that
`step_events.py --flash-attn` records transformers' own path around it:

forward (`FlashAttnFunc.forward`, `mha_fwd`, no dropout, training shapes: one split):
  `out = empty_like(q)` (batch, tokens, heads, head dim), `softmax_lse` (batch, heads,
  tokens) fp32, `p = empty({0})` (no memory), `rng_state` two int64; saved for backward:
  q, k and v as given (transformers passes transposed views, whose last dimension is
  contiguous, so `maybe_contiguous` copies nothing), `out`, `softmax_lse`, `rng_state`.

backward (`FlashAttnFunc.backward`, `mha_bwd`, not deterministic):
  `dq, dk, dv = empty_like(q), empty_like(k), empty_like(v)` in Python first, then in C++
  `softmax_d` (batch, heads, tokens rounded to 128) fp32, `dq_accum` (batch, tokens rounded
  to 128, heads, head dim rounded to 32) fp32, and with grouped KV heads `dk_expanded` and
  `dv_expanded` (batch, tokens, query heads, head dim), summed into dk and dv; the C++
  locals are freed as `mha_bwd` returns (in reverse order of construction), `softmax_d`
  when the Python wrapper drops it.

transformers' `_is_packed_sequence` (one sequence a batch, position ids given) reads its
result on the host, which fake tensors cannot; the emulation makes the same tensors and
answers False, as a GPU does for the arange positions the oracle feeds.
"""

from __future__ import annotations


def _round(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def install() -> list:
    import torch
    import transformers.modeling_flash_attention_utils as fau
    import transformers.utils.import_utils as iu

    class FlashAttnFunc(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, softmax_scale, causal):
            b, s, h, _ = q.shape
            out = torch.empty_like(q)
            lse = torch.empty((b, h, s), dtype=torch.float32, device=q.device)
            rng_state = torch.empty((2,), dtype=torch.int64, device=q.device)
            ctx.save_for_backward(q, k, v, out, lse, rng_state)
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse, rng_state = ctx.saved_tensors
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            b, s, h, d = q.shape
            hk = k.shape[2]
            f32 = dict(dtype=torch.float32, device=q.device)
            softmax_d = torch.empty((b, h, _round(s, 128)), **f32)
            dq_accum = torch.empty((b, _round(s, 128), h, _round(d, 32 if d <= 128 else 64)), **f32)
            if hk != h:
                dk_expanded = torch.empty((b, k.shape[1], h, d), dtype=q.dtype, device=q.device)
                dv_expanded = torch.empty((b, k.shape[1], h, d), dtype=q.dtype, device=q.device)
                del dv_expanded
                del dk_expanded
            del dq_accum
            del softmax_d
            return dq, dk, dv, None, None

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                        window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                        deterministic=False, return_attn_probs=False):
        assert dropout_p == 0.0 and not deterministic and q.shape[-1] % 8 == 0
        return FlashAttnFunc.apply(q, k, v, softmax_scale, causal)

    def flash_attn_varlen_func(*a, **k):
        raise NotImplementedError("the oracle feeds unpadded, unpacked sequences")

    def lazy_imports(implementation, attention_wrapper=None, allow_all_kernels=False):
        return flash_attn_func, flash_attn_varlen_func, None, None, None

    class Unpacked:
        """The check's bool tensor, read as False (and freed) by the caller's `if`."""

        def __init__(self, t):
            self.t = t

        def __bool__(self):
            return False

    def is_packed_sequence(position_ids, batch_size):
        if position_ids is None or batch_size != 1 or position_ids.shape[-1] == 1:
            return False
        increasing = torch.arange(position_ids.shape[1], device=position_ids.device) \
            + position_ids.min()
        return Unpacked((increasing - position_ids).abs().sum().bool())

    fau._lazy_imports = lazy_imports
    fau._loaded_implementation = None
    fau._is_packed_sequence = is_packed_sequence
    available = lambda *a, **k: True  # noqa: E731
    iu.is_flash_attn_2_available = available
    fau.is_flash_attn_2_available = available
    fau.FLASH_ATTENTION_COMPATIBILITY_MATRIX[2]["general_availability_check"] = available
    return ["flash_attn.flash_attn_func emulated (flash-attn 2.8.4 allocations, "
            "calibration/flash_attn_emulation.py)"]
