"""Liger Kernel on fake CUDA tensors, for the step oracle (`step_events.py --liger`).

Liger's autograd functions (liger-kernel 0.8.5, `liger_kernel/ops/*.py`) allocate their
outputs, saved tensors and gradients with torch in Python and hand them to Triton kernels.
Fake tensors run no kernel, so `install()` makes every Triton launch a no-op and keeps the
Python around it as it is: what the step records is Liger's own allocation sequence. The
host reads fused linear cross-entropy makes (`target_mask.sum().item()`, the count of
tokens that are not ignored) are answered with a count (it scales values, not sizes), and its
backward's test of the incoming gradient against 1.0 takes the branch the step's last op
takes on a GPU. The SM count the RMSNorm backward sizes its partial
weight gradients by is the H100's and H200's, 132. The model is patched as the Trainer
does with `use_liger_kernel=True` (`_apply_liger_kernel_to_instance` on the base model, the
model's own defaults), right after it is built.
"""

from __future__ import annotations

SM_COUNT = 132
# What a host read of a fake tensor returns: a count that scales values, not sizes.
COUNTED_TOKENS = 1


def install() -> None:
    import torch
    import triton.runtime.jit as jit
    import triton.runtime.autotuner as autotuner

    def launch(self, grid):
        return lambda *a, **k: None

    jit.KernelInterface.__getitem__ = launch
    autotuner.Autotuner.__getitem__ = launch

    class Props:
        multi_processor_count = SM_COUNT
        name = "NVIDIA H200"
        total_memory = 141 << 30
        major, minor = 9, 0

    torch.cuda.get_device_properties = lambda *a, **k: Props()
    # `device_context` (ops/utils.py) enters `torch.cuda.device`, which would start CUDA.
    torch.cuda.device.__enter__ = lambda self: None
    torch.cuda.device.__exit__ = lambda self, *a: False

    from torch._subclasses.fake_tensor import DataDependentOutputException

    orig_item = torch.Tensor.item

    def item(self):
        try:
            return orig_item(self)
        except DataDependentOutputException:
            # A fake tensor has no value: the only host reads in Liger's step are the
            # counts of tokens its losses average over, none ignored.
            return COUNTED_TOKENS

    torch.Tensor.item = item

    import liger_kernel.ops.fused_linear_cross_entropy as flce

    def backward(grad_output, grad_input, grad_weight, grad_bias):
        # The loss is the step's last op: its gradient is 1.0, and the kernels that would
        # scale the stored gradients in place are skipped (`torch.equal` with a 1.0 made
        # on the device, a 512-byte block, is what remains of the branch).
        return grad_input, grad_weight, grad_bias

    flce.fused_linear_cross_entropy_backward = backward

    import transformers

    orig_from_config = transformers.AutoModelForCausalLM.from_config

    def from_config(*a, **k):
        model = orig_from_config(*a, **k)
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        _apply_liger_kernel_to_instance(model=model)
        return model

    transformers.AutoModelForCausalLM.from_config = from_config

