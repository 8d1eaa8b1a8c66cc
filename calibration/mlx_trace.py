"""Peak active memory of `mlx_lm.lora`'s training step, run on MLX's CPU backend.

MLX's lazy graph, its vjps, `mx.compile` and its evaluation order are the same on every
device; what differs on the CPU is that `mx.fast.rms_norm` and `mx.fast.rope` run their
composite fallbacks (`RMSNorm::use_fallback`, `RoPE::use_fallback`: true on the CPU, mlx
0.32 `fast.cpp`), whose vjps keep other tensors than the Metal primitives. This script
replaces them with custom functions whose vjps keep what the Metal ones keep
(`RMSNorm::vjp`: x and the weight; `RoPE::vjp`: nothing), so the trace is the Metal
graph's. The model is built from a config.json with random weights (sizes are all that
matter), converted as `mlx_lm.lora`'s `train_model` does, and trained by mlx-lm's own
`tuner.trainer.train` on batches of exactly `--seq` tokens. The figure is
`mx.get_peak_memory()` over the steps, after the model is built (what `mlx_lm.lora`
prints as "Peak mem", less a load that peaks lower than the step).

    python calibration/mlx_trace.py --config models/Qwen3-0.6B.json --seq 512 --rank 8

Prints one JSON object. Needs `pip install "mlx[cpu]" mlx-lm` (Linux or macOS).
"""

import argparse
import json
import sys

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_map


def metal_rms_norm():
    """`mx.fast.rms_norm` whose vjp keeps only x and the weight (mlx `RMSNorm::vjp`)."""
    fallback = mx.fast.rms_norm

    def build(eps):
        @mx.custom_function
        def f(x, w):
            return fallback(x, w, eps)

        @f.vjp
        def f_vjp(primals, cotangent, _output):
            x, w = primals
            xf = x.astype(mx.float32)
            r = mx.rsqrt(mx.mean(xf * xf, axis=-1, keepdims=True) + eps)
            n = xf * r
            g = cotangent.astype(mx.float32)
            gw = g * w.astype(mx.float32)
            dx = r * (gw - n * mx.mean(gw * n, axis=-1, keepdims=True))
            dw = mx.sum((g * n).reshape(-1, x.shape[-1]), axis=0)
            return dx.astype(x.dtype), dw.astype(w.dtype)

        return f

    cache = {}

    def rms_norm(x, weight, eps):
        if weight is None:
            return fallback(x, weight, eps)
        if eps not in cache:
            cache[eps] = build(eps)
        return cache[eps](x, weight)

    return rms_norm


def metal_rope():
    """`mx.fast.rope` whose vjp keeps nothing but the cotangent (mlx `RoPE::vjp`: the
    inverse rotation of the cotangent)."""
    fallback = mx.fast.rope

    def rope(x, dims, *, traditional, base, scale, offset, freqs=None):
        @mx.custom_function
        def f(x):
            return fallback(
                x, dims, traditional=traditional, base=base, scale=scale,
                offset=offset, freqs=freqs,
            )

        @f.vjp
        def f_vjp(_primals, cotangent, _output):
            return fallback(
                cotangent, dims, traditional=traditional, base=base, scale=-scale,
                offset=offset, freqs=freqs,
            )

        return f(x)

    return rope


def metal_cross_entropy():
    """`nn.losses.cross_entropy` as it runs on a GPU from mlx 0.32.2 (`mx.fast.cross_entropy`,
    `use_fast` when the default device is a GPU): the fused kernel keeps the logits for its
    vjp (`CrossEntropy::vjp`: `{logits, targets, loss, cotangent}`), whose own fused kernel
    writes only the logits' gradient. Emulated here with the same inputs kept; the gradient is
    built in place where MLX can donate buffers."""
    slow = nn.losses.cross_entropy

    @mx.custom_function
    def ce(logits, targets):
        lse = mx.logsumexp(logits, axis=-1).astype(mx.float32)
        score = mx.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        return lse - score.astype(mx.float32)

    @ce.vjp
    def ce_vjp(primals, cotangent, _output):
        logits, targets = primals
        g = cotangent.astype(logits.dtype)[..., None]
        gx = mx.softmax(logits, axis=-1, precise=True) * g
        gt = mx.take_along_axis(gx, targets[..., None], axis=-1) - g
        gx = mx.put_along_axis(gx, targets[..., None], gt, axis=-1)
        return gx, mx.zeros_like(targets)

    def cross_entropy(logits, targets, **kw):
        if kw:
            return slow(logits, targets, **kw)
        return ce(logits, targets.astype(mx.int32)).astype(logits.dtype)

    return cross_entropy


def build_model(config, bits, group, dtype):
    from mlx_lm.utils import _get_classes, quantize_model

    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    if bits:
        model, _ = quantize_model(model, config, group, bits)
        mx.eval(model.parameters())
    return model


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--layers", type=int, help="override num_hidden_layers")
    p.add_argument("--vocab", type=int, help="override vocab_size (the CPU's matmuls are slow)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=INT",
                   help="override an integer config value (hidden_size, head_dim, ...)")
    p.add_argument("--method", choices=["lora", "dora", "full"], default="lora")
    p.add_argument("--bits", type=int, default=0)
    p.add_argument("--group", type=int, default=64)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--keys", default="", help="comma-separated LoRA keys (default: all)")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--num-layers", type=int, default=16)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=512, help="tokens fed to the model")
    p.add_argument("--grad-checkpoint", action="store_true")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--optimizer", default="adam")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--loss", choices=["fused", "unfused"], default="fused",
                   help="fused: mlx >= 0.32.2 on a GPU; unfused: the CPU, and GPUs before 0.32.2")
    a = p.parse_args()

    mx.set_default_device(mx.cpu)
    mx.fast.rms_norm = metal_rms_norm()
    mx.fast.rope = metal_rope()
    if a.loss == "fused":
        nn.losses.cross_entropy = metal_cross_entropy()

    with open(a.config) as f:
        config = json.load(f)
    config = config.get("text_config", config) | {"model_type": config["model_type"]}
    if a.layers:
        config["num_hidden_layers"] = a.layers
    if a.vocab:
        config["vocab_size"] = a.vocab
    for kv in a.set:
        key, value = kv.split("=", 1)
        config[key] = int(value)
    dtype = getattr(mx, a.dtype)
    model = build_model(config, a.bits, a.group, dtype)
    weights = sum(v.nbytes for _, v in tree_flatten(model.parameters()))

    from mlx_lm.tuner.trainer import TrainingArgs, train
    from mlx_lm.tuner.utils import linear_to_lora_layers

    mx.random.seed(0)
    model.freeze()
    if a.method == "full":
        for layer in model.layers[-max(a.num_layers, 0):]:
            layer.unfreeze()
    else:
        params = {"rank": a.rank, "dropout": a.dropout, "scale": 20.0}
        if a.keys:
            params["keys"] = a.keys.split(",")
        linear_to_lora_layers(model, a.num_layers, params, use_dora=a.method == "dora")
    trainable = sum(v.size for _, v in tree_flatten(model.trainable_parameters()))
    mx.eval(model.parameters())

    # Samples of exactly `seq` tokens (a multiple of 32): the batch is `seq + 1` wide and
    # the model sees `seq` (`iterate_batches`, `default_loss`).
    vocab = config["vocab_size"]
    n = a.batch * 2
    data = [([(7 * i + j) % vocab for j in range(a.seq)], 0) for i in range(n)]
    opt = {"adam": optim.Adam, "adamw": optim.AdamW, "sgd": optim.SGD,
           "adafactor": optim.Adafactor}[a.optimizer](learning_rate=1e-5)
    if a.no_compile:
        mx.compile = lambda f, **_: f  # noqa: E731
        import mlx_lm.tuner.trainer as t
        t.mx.compile = mx.compile
    args = TrainingArgs(
        batch_size=a.batch, iters=a.steps, val_batches=0, steps_per_report=10**6,
        steps_per_eval=10**6, steps_per_save=10**6, max_seq_length=a.seq + 1,
        grad_checkpoint=a.grad_checkpoint, grad_accumulation_steps=a.grad_accum,
        adapter_file="/tmp/mlx_trace_adapters.safetensors",
    )
    mx.clear_cache()
    mx.reset_peak_memory()
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        train(model, opt, data, None, args)
    peak = mx.get_peak_memory()
    import os

    print(json.dumps({
        "model": os.path.basename(a.config).removesuffix(".json").replace("--", "/", 1), "layers": config["num_hidden_layers"],
        "vocab": config["vocab_size"], "set": a.set, "method": a.method,
        "bits": a.bits, "group": a.group, "rank": a.rank, "keys": a.keys or "all",
        "dropout": a.dropout, "num_layers": a.num_layers, "batch": a.batch, "seq": a.seq,
        "grad_checkpoint": a.grad_checkpoint, "grad_accum": a.grad_accum, "steps": a.steps,
        "optimizer": a.optimizer, "loss": a.loss, "dtype": a.dtype, "compile": not a.no_compile,
        "weights_bytes": weights, "trainable_params": trainable, "peak_active_bytes": peak,
        "mlx": mx.__version__,
    }))


if __name__ == "__main__":
    sys.exit(main())
