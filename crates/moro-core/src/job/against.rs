//! Checking a resolved job against the model and the hardware it is meant for: what cannot
//! run is refused (naming the setting and the hardware fact), what runs but is unusual is
//! a warning. Nothing is replaced.

use super::{Attention, Job, JobError, Method, Precision, Quantization};
use crate::hardware::{Device, Vendor};
use crate::model::ModelSpec;

/// The warnings for `job` on `model` and `device` (`None`: no hardware named).
///
/// # Errors
/// A setting the hardware cannot run: FlashAttention 2 below compute capability 8.0
/// (flash-attn 2.x `csrc/flash_attn/flash_api.cpp`: "FlashAttention only supports Ampere GPUs
/// or newer.") or on an Apple GPU; bitsandbytes quantization and optimizers on an Apple GPU
/// (bitsandbytes 0.50's MPS backend has no 8-bit optimizers; its 4-bit path is not
/// modelled); Liger's Triton kernels on an Apple GPU.
pub fn check(
    job: &Job,
    model: &ModelSpec,
    device: Option<&Device>,
) -> Result<Vec<String>, JobError> {
    let mut warnings = Vec::new();
    if job.method != Method::Inference
        && model.max_position_embeddings > 0
        && job.seq_len > model.max_position_embeddings
    {
        warnings.push(format!(
            "max_seq_length {} is beyond the model's {} positions: the model was not trained \
             on sequences this long",
            job.seq_len, model.max_position_embeddings
        ));
    }
    if model.attention_sinks {
        match job.attention {
            Attention::Sdpa => {
                return Err(JobError {
                    field: "attention",
                    message: format!(
                        "{} has attention sinks, which transformers runs only in `eager` \
                         attention or FlashAttention 3/4 kernels (`_supports_sdpa = False`): \
                         use `eager`",
                        model.model_type
                    ),
                });
            }
            Attention::Flash => warnings.push(format!(
                "attention flash: FlashAttention 2 ignores {}'s attention sinks (transformers \
                 passes them to FA3/FA4 kernels only, e.g. kernels-community/vllm-flash-attn3); \
                 the memory is FlashAttention's either way",
                model.model_type
            )),
            Attention::Eager => {}
        }
    }
    if job.attention == Attention::Flash
        && job.stack.profile().transformers_modules
        && model.vision.as_ref().is_some_and(|v| !v.flash_attention)
    {
        return Err(JobError {
            field: "attention",
            message: format!(
                "multimodal {} does not run FlashAttention in transformers \
                 (`_supports_flash_attn = False`: it would drop the bidirectional mask over \
                 image tokens); use `sdpa` or `eager`",
                model.model_type
            ),
        });
    }
    if job.method == Method::QuantizedAdapters && model.linears().any(|(_, l)| !job.is_module(l)) {
        warnings.push(format!(
            "qlora on {}: bitsandbytes quantizes nn.Linear modules only, and the experts are \
             fused parameters, so they stay unquantized, and PEFT's k-bit preparation casts \
             them to fp32; LoRA on the 16-bit model needs less",
            model.model_type
        ));
    }
    // A size alone (`--memory 24GiB`) says nothing about the GPU's features.
    let Some(d) = device.filter(|d| d.vendor != Vendor::Generic) else {
        return Ok(warnings);
    };
    let cc = d.compute_capability.map_or_else(String::new, |(a, b)| {
        format!(" (compute capability {a}.{b})")
    });
    if job.attention == Attention::Flash && !d.supports_flash_attention {
        return Err(JobError {
            field: "attention",
            message: format!(
                "FlashAttention 2 needs an NVIDIA GPU of compute capability 8.0 (Ampere) or newer \
                 or a supported AMD GPU; {}{cc} has none: use `sdpa`",
                d.name
            ),
        });
    }
    if d.vendor == Vendor::Apple && job.stack.profile().triton_kernels {
        return Err(JobError {
            field: "stack",
            message: format!(
                "the {} stack's kernels are Triton kernels, which run on CUDA and ROCm; {} is an \
                 Apple GPU",
                job.stack.as_str(),
                d.name
            ),
        });
    }
    if d.vendor == Vendor::Apple
        && job.quantization != Quantization::None
        && job.quantization.mlx().is_none()
    {
        return Err(JobError {
            field: "quantization",
            message: format!(
                "{} is an Apple GPU: GPTQ's kernels need CUDA or ROCm, and bitsandbytes' 4-bit \
                 path on MPS (0.50's `mps` backend, PyTorch ops where its Metal kernels are \
                 missing) is not modelled; `--stack mlx` quantizes the MLX way",
                d.name
            ),
        });
    }
    if d.vendor == Vendor::Apple && job.optimizer.is_bitsandbytes() {
        return Err(JobError {
            field: "optimizer",
            message: format!(
                "{} needs bitsandbytes' optimizer kernels, which do not run on MPS \
                 (bitsandbytes 0.50: 8-bit optimizers not supported there; paged memory is \
                 CUDA's); {} is an Apple GPU: use adamw_torch_fused",
                job.optimizer.as_str(),
                d.name
            ),
        });
    }
    if d.vendor == Vendor::Apple && job.liger.any() {
        return Err(JobError {
            field: "liger",
            message: format!(
                "Liger's kernels are Triton kernels, which run on CUDA and ROCm; {} is an Apple \
                 GPU: drop liger",
                d.name
            ),
        });
    }
    if job.quantization == Quantization::Mxfp4 && d.compute_capability.is_some_and(|cc| cc < (7, 5))
    {
        return Err(JobError {
            field: "quantization",
            message: format!(
                "MXFP4 kernels need compute capability 7.5 or newer; {}{cc} has less, and \
                 transformers dequantizes the experts to bf16 there: use `none`",
                d.name
            ),
        });
    }
    let bf16 = matches!(job.precision, Precision::Bf16 | Precision::Bf16Mixed);
    if bf16 && !d.supports_bf16 {
        warnings.push(format!(
            "precision {}: {}{cc} has no bf16 arithmetic; PyTorch emulates it slowly or \
             refuses it (`fp16-mixed` is the usual choice there)",
            job.precision.as_str(),
            d.name
        ));
    }
    Ok(warnings)
}
