//! Reading one measured row: its fields, partly free text, read by keywords into a [`Row`]
//! (the job, the hardware, what was measured), the same way for every row.

use serde::Serialize;
use serde_json::Value;

use crate::hardware;
use crate::job::{
    Attention, FsdpApi, Job, LossImpl, Method, Offload, Optimizer, Padding, Parallel, PeftConfig,
    PeftKind, Precision, Quantization, Sharding, Stack, Targets, Versions,
};
use crate::units::GIB;

/// Which level of the answer a row measured.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// `torch.cuda.max_memory_allocated` (and torchtune's "peak active").
    Allocated,
    /// `torch.cuda.max_memory_reserved`.
    Reserved,
    /// nvidia-smi / NVML: the whole device.
    Device,
}

impl Metric {
    /// All levels, lowest first.
    pub const ALL: [Self; 3] = [Self::Allocated, Self::Reserved, Self::Device];

    /// Display name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Allocated => "allocated",
            Self::Reserved => "reserved",
            Self::Device => "device",
        }
    }

    /// The estimate's figure at this level.
    #[must_use]
    pub const fn of(self, est: &crate::estimate::Estimate) -> u64 {
        self.pick([
            est.peak_allocated_bytes,
            est.peak_reserved_bytes,
            est.peak_device_bytes,
        ])
    }

    /// This level's figure of `levels`, in [`Self::ALL`]'s order.
    #[must_use]
    pub const fn pick(self, levels: [u64; 3]) -> u64 {
        match self {
            Self::Allocated => levels[0],
            Self::Reserved => levels[1],
            Self::Device => levels[2],
        }
    }
}

/// A row moro can predict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Row id.
    pub id: String,
    /// Source key (for per-source summaries).
    pub source: String,
    /// The model id as the row names it.
    pub model_id: String,
    /// The job.
    pub job: Job,
    /// Which level was measured.
    pub metric: Metric,
    /// Measured bytes per GPU (`per_gpu_gib` × 2^30).
    pub measured_bytes: u64,
    /// The run did not fit (`outcome: OOM`).
    pub oom: bool,
    /// Memory of the GPU, when known (for OOM rows).
    pub gpu_memory_bytes: Option<u64>,
    /// Compute capability of the GPU, when known.
    pub compute_capability: Option<(u32, u32)>,
    /// `confidence` field.
    pub confidence: String,
    /// Config fields the run changed (`model_overrides`: the calibration harness cuts models
    /// to fewer layers to fit the card).
    pub model_overrides: Option<serde_json::Map<String, Value>>,
    /// The row is a one-GPU trace on fake CUDA tensors (`source_key` `oracle-…`), not a GPU
    /// run: no GEMM runs, so no cuBLAS workspace is allocated (`validation/README.md`).
    pub simulated: bool,
    /// The CUDA context the same machine measured on its own
    /// (`secondary_measurements.cuda_context_only_MiB`), replacing the device default the way
    /// `moro calibrate` does.
    pub cuda_context_bytes: Option<u64>,
    /// The run used lit-gpt code from before it expanded a multi-query model's single key
    /// and value head to all query heads for training (commit 50b1974b, 2023-10-24:
    /// "training: flash attention requires it"). Until then `CausalSelfAttention` passed
    /// one k/v head with `n_head` query heads to `F.scaled_dot_product_attention`, whose
    /// flash and memory-efficient kernels require equal head counts
    /// (`check_batch_size_and_num_heads`, `sdp_utils.cpp`), so SDPA ran its math kernel.
    pub litgpt_unexpanded_mqa: bool,
    /// The run's trainable parameters (`trainable_params`), when the row gives them: they pin
    /// the settings of PEFT methods a row leaves out (IA³'s feedforward modules, AdaLoRA's
    /// `init_r`, prompt tuning's virtual tokens; [`resolve_peft`]).
    pub trainable_params: Option<u64>,
    /// The run loaded the whole model onto each GPU before wrapping it (`sharding` says
    /// "gpu loading"): that load is a floor under every level
    /// ([`crate::estimate::rank::RankParts::whole_model_load`]).
    pub loads_whole_model: bool,
}

pub(super) fn text(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

pub(super) fn num(v: &Value, key: &str) -> Option<u64> {
    match v.get(key)? {
        Value::Number(n) => n.as_u64().or_else(|| {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            n.as_f64()
                .filter(|f| *f >= 0.0 && f.is_finite())
                .map(|f| f.round() as u64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

pub(super) fn truthy(v: &Value, key: &str) -> Option<bool> {
    match v.get(key)? {
        Value::Bool(b) => Some(*b),
        Value::String(s) => {
            let l = s.to_ascii_lowercase();
            if l.starts_with("true") || l.starts_with("yes") || l.starts_with("on") {
                Some(true)
            } else if l.starts_with("false") || l.starts_with("no") || l.starts_with("off") {
                Some(false)
            } else {
                None
            }
        }
        _ => None,
    }
}

/// Reads a row. `Err` carries the reason it is skipped.
///
/// # Errors
/// A one-line reason the row cannot be predicted.
#[allow(clippy::too_many_lines)]
pub fn interpret(v: &Value) -> Result<Row, String> {
    let id = text(v, "id");
    let method_text = text(v, "method").to_ascii_lowercase();
    let framework = format!("{} {}", text(v, "framework"), text(v, "framework_version"));
    let fw = framework.to_ascii_lowercase();
    let model_id = text(v, "model_hf_id");
    if model_id.is_empty() {
        return Err("no model_hf_id".into());
    }
    let quant_all = v
        .get("quantization")
        .map(|q| q.to_string().to_ascii_lowercase())
        .unwrap_or_default();
    // The scheme is the object's `type` where it has one: its other fields name dtypes
    // (`"storage": "uint8"`) that must not be read as the scheme.
    let quant_text = v
        .get("quantization")
        .map(|q| q.get("type").unwrap_or(q).to_string().to_ascii_lowercase())
        .unwrap_or_default();
    let quant_text = if quant_text == "null" {
        String::new()
    } else {
        quant_text
    };
    let double_quant = v
        .get("quantization")
        .and_then(|q| q.get("double_quant"))
        .and_then(Value::as_bool)
        .unwrap_or(false);

    // lit-gpt's adapters: `adapter`, `adapter_v2`, with `+nf4` when the base is quantized
    // (the `quantization` object says how).
    let peft_text = method_text.split('+').next().unwrap_or_default();
    let peft = match peft_text {
        "adapter" | "llama-adapter" => PeftKind::LlamaAdapter,
        "adapter_v2" | "adapter-v2" | "llama-adapter-v2" => PeftKind::AdapterV2,
        other => PeftKind::parse(other)
            .filter(|k| k.is_other_peft())
            .unwrap_or(PeftKind::Lora),
    };
    let method = match method_text.as_str() {
        "full" => Method::Full,
        "lora" => Method::Adapters,
        "qlora" | "gptq-lora" => Method::QuantizedAdapters,
        m if m.starts_with("inference") => Method::Inference,
        _ if peft.is_adapter() || peft.is_other_peft() => Method::Adapters,
        other => {
            return Err(format!(
                "PEFT method `{other}` is not modelled (LoRA/QLoRA, DoRA, IA³, VeRA, AdaLoRA, LoHa, \
                 LoKr, OFT, BOFT, LN tuning, prompt and prefix tuning and lit-gpt's adapters only)"
            ));
        }
    };
    let quantization = if quant_text.is_empty() {
        Quantization::None
    } else if let Some(q) =
        Quantization::from_name(quant_text.trim_matches('"')).filter(|q| q.mlx().is_some())
    {
        // MLX's affine storage by its moro name (`mlx-4bit`).
        q
    } else if quant_text.contains("gptq") {
        Quantization::Gptq4
    } else if quant_text.contains("mxfp4") {
        Quantization::Mxfp4
    } else if quant_text.contains("int8") || quant_text.contains("8-bit") {
        Quantization::Int8
    } else if quant_text.contains("nf4")
        || quant_text.contains("4-bit")
        || quant_text.contains("fp4")
    {
        let fp4 = quant_text.contains("fp4") && !quant_text.contains("nf4");
        match (fp4, double_quant || quant_text.contains("torchao")) {
            (true, true) => Quantization::Fp4Dq,
            (true, false) => Quantization::Fp4,
            (false, true) => Quantization::Nf4Dq,
            (false, false) => Quantization::Nf4,
        }
    } else {
        return Err(format!("quantization `{quant_text}` is not modelled"));
    };
    let method = if method == Method::Adapters && quantization != Quantization::None {
        Method::QuantizedAdapters
    } else {
        method
    };

    let stack = if fw.contains("mlx") {
        Stack::Mlx
    } else if fw.contains("litgpt") || fw.contains("lit-gpt") {
        Stack::Litgpt
    } else if fw.contains("torchtune") {
        Stack::Torchtune
    } else if version_of(&fw, "trl").is_some() {
        Stack::Trl
    } else {
        Stack::Hf
    };

    if peft.is_adapter() && stack != Stack::Litgpt {
        return Err(format!(
            "`{method_text}` is modelled as lit-gpt's LLaMA-Adapter; this row is not from lit-gpt"
        ));
    }

    // Shape.
    let inference = v.get("inference").filter(|i| !i.is_null());
    let (micro_batch_size, seq_len, new_tokens) = if method == Method::Inference {
        let inf = inference.ok_or("inference row without an `inference` object")?;
        let new = num(inf, "max_new_tokens").unwrap_or(0);
        let prompt = num(inf, "prompt_tokens_approx").or_else(|| {
            let p = text(inf, "prompt").to_ascii_lowercase();
            // "short (~20 tokens)"
            p.split(|c: char| !c.is_ascii_digit())
                .find(|s| !s.is_empty())
                .and_then(|s| s.parse().ok())
                .filter(|_| p.contains("token"))
        });
        // A script's default prompt is a sentence; any other prompt without a token count
        // has an unknown length.
        let default_prompt = text(inf, "prompt").to_ascii_lowercase().contains("default");
        let prompt = match prompt {
            Some(p) => p,
            None if default_prompt => 32,
            None => {
                return Err(format!(
                    "prompt length not given (`{}`)",
                    text(inf, "prompt")
                ));
            }
        };
        (
            num(inf, "batch_size").unwrap_or(1),
            prompt + new,
            (new > 0 && prompt > 0).then_some(new),
        )
    } else {
        let b = num(v, "micro_batch_size").ok_or("no micro_batch_size")?;
        let s = num(v, "seq_len").ok_or("no seq_len")?;
        (b, s, None)
    };
    if micro_batch_size == 0 || seq_len == 0 {
        return Err("zero batch or sequence length".into());
    }

    // Precision.
    let prec_text = text(v, "precision").to_ascii_lowercase();
    let weights_text = text(v, "base_weights_dtype").to_ascii_lowercase();
    let precision = if prec_text.contains("32-true")
        || (prec_text.starts_with("fp32") && !prec_text.contains("amp"))
    {
        Precision::Fp32
    } else if prec_text.contains("fp16")
        && (prec_text.contains("amp") || prec_text.contains("mixed"))
    {
        Precision::Fp16Mixed
    } else if prec_text.contains("bf16-true")
        || prec_text.contains("pure")
        || prec_text.contains("no amp")
    {
        Precision::Bf16
    } else if prec_text.contains("amp") || prec_text.contains("mixed") {
        if method == Method::Full
            && (weights_text.contains("bf16") || weights_text.contains("bfloat16"))
        {
            Precision::Bf16
        } else {
            Precision::Bf16Mixed
        }
    } else if prec_text.is_empty() && quant_all.contains("fp32") {
        // No torch_dtype with a bitsandbytes config: transformers loads the unquantized
        // modules in the default dtype, fp32, and bnb computes in fp32.
        Precision::Fp32
    } else if prec_text.contains("bf16") || prec_text.contains("fp16") || prec_text.is_empty() {
        Precision::Bf16
    } else {
        Precision::Bf16Mixed
    };

    // Optimizer.
    let opt_text = format!(
        "{} {}",
        text(v, "optimizer"),
        text(v, "optimizer_state_dtype")
    )
    .to_ascii_lowercase();
    let optimizer = if opt_text.contains("paged") {
        if opt_text.contains("8bit") || opt_text.contains("8-bit") {
            Optimizer::PagedAdamw8bit
        } else {
            Optimizer::PagedAdamw32bit
        }
    } else if opt_text.contains("8bit") || opt_text.contains("8-bit") {
        Optimizer::Adamw8bit
    } else if opt_text.contains("adafactor") {
        Optimizer::Adafactor
    } else if opt_text.contains("lion") {
        Optimizer::Lion32bit
    } else if opt_text.contains("sgd") {
        Optimizer::SgdMomentum
    } else if opt_text.contains("fused")
        || opt_text.contains("deepspeed")
        || opt_text.contains("adamw_hf")
    {
        Optimizer::AdamwTorchFused
    } else {
        Optimizer::AdamwTorch
    };

    // LoRA.
    let mut lora = PeftConfig {
        dropout: 0.0,
        ..PeftConfig::default()
    };
    if let Some(l) = v.get("lora").filter(|l| !l.is_null()) {
        if let Some(r) = num(l, "r") {
            lora.rank = r;
        }
        if let Some(a) = l.get("alpha").and_then(Value::as_f64) {
            lora.alpha = a;
        }
        lora.dropout = l.get("dropout").and_then(Value::as_f64).unwrap_or(0.0);
        lora.targets = match l.get("target_modules") {
            Some(Value::Array(a)) => Targets::Names(
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect(),
            ),
            Some(Value::String(s)) if s.to_ascii_lowercase().contains("all") => Targets::AllLinear,
            _ => Targets::Names(vec!["q_proj".into(), "v_proj".into()]),
        };
        if peft == PeftKind::AdaLora {
            // AdaLoRA allocates at `init_r` (PEFT's default 12); `r` is LoRA's field.
            lora.rank = num(l, "init_r").unwrap_or(12);
        }
        if let Some(n) = num(l, "num_virtual_tokens") {
            lora.virtual_tokens = n;
        }
        lora.dora = truthy(l, "use_dora").unwrap_or(false);
        if peft == PeftKind::LoKr {
            // PEFT's -1 (and any non-positive factor) searches near the square root.
            lora.decompose_factor = l
                .get("decompose_factor")
                .and_then(Value::as_i64)
                .and_then(|f| u64::try_from(f).ok())
                .filter(|f| *f > 0);
            if truthy(l, "decompose_both") == Some(true) {
                return Err("LoKr with `decompose_both` (w1 factored too) is not modelled".into());
            }
        }
        if peft == PeftKind::Boft {
            lora.block_size = num(l, "boft_block_size");
            lora.butterfly_factor = num(l, "boft_n_butterfly_factor");
            if num(l, "boft_block_num").is_some_and(|n| n > 0) {
                return Err(
                    "BOFT sized by `boft_block_num` is not read; give boft_block_size".into(),
                );
            }
        }
        if peft == PeftKind::PrefixTuning && truthy(l, "prefix_projection") == Some(true) {
            return Err(
                "prefix tuning with `prefix_projection` (an MLP over the prefix) is not modelled"
                    .into(),
            );
        }
        if let Some(Value::Array(a)) = l.get("feedforward_modules") {
            lora.feedforward = Some(Targets::Names(
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect(),
            ));
        }
    }
    if peft == PeftKind::LnTuning || peft.uses_virtual_tokens() {
        // Their targets are norms or none: no Linear carries their tensors.
        lora.targets = Targets::AllLinear;
    }
    if peft == PeftKind::PromptTuning
        && v.get("lora")
            .and_then(|l| num(l, "num_virtual_tokens"))
            .is_none()
    {
        // Unknown until the trainable count pins it ([`resolve_peft`]).
        lora.virtual_tokens = 0;
    }

    let attn_text = text(v, "attention_impl").to_ascii_lowercase();
    let attention = if attn_text.contains("eager") {
        Attention::Eager
    } else if attn_text.contains("flash") && !attn_text.contains("sdpa") {
        Attention::Flash
    } else {
        Attention::Sdpa
    };
    let loss_text = text(v, "loss_impl").to_ascii_lowercase();
    // `use_liger_kernel=True` patches every kernel the model type has; a row naming only a
    // fused loss ran that loss alone.
    let liger = if loss_text.contains("use_liger_kernel") {
        crate::job::Liger::ALL
    } else {
        crate::job::Liger::default()
    };
    let loss = if liger.any() {
        None
    } else if loss_text.contains("liger") || loss_text.contains("fused") {
        Some(LossImpl::Fused)
    } else if loss_text.contains("chunked_nll") {
        // TRL's `loss_type="chunked_nll"`.
        Some(LossImpl::ChunkedNll)
    } else if loss_text.contains("chunk") {
        Some(LossImpl::Chunked)
    } else if loss_text.contains("crossentropy") || loss_text.contains("cross_entropy") {
        Some(LossImpl::Standard)
    } else {
        None
    };
    let gradient_checkpointing = truthy(v, "gradient_checkpointing").unwrap_or(false);
    let kind = text(v, "seq_len_kind").to_ascii_lowercase();
    let notes = text(v, "notes").to_ascii_lowercase();
    let padding = if kind.contains("pack") || kind.contains("random token") || kind.is_empty() {
        Padding::Packed
    } else if kind.contains("first batch contains the longest")
        || notes.contains("first micro-batch forced to contain the longest")
        // lit-gpt's fine-tuning scripts put the longest sample first (`get_batch`:
        // `ix[0] = longest_seq_ix`) from 2023-06-21 (fa5d73e3) until 2024-02-29 (73baa2d5),
        // all under the old `lit-gpt` name.
        || (fw.contains("lit-gpt") && kind.contains("longest"))
    {
        Padding::LongestFirst
    } else {
        Padding::Padded
    };

    if kind.contains("much shorter") || kind.contains("data dependent") {
        return Err(format!(
            "sequence length is data-dependent (`{kind}`); only an upper bound is known"
        ));
    }
    let activation_offload = truthy(v, "activation_offload") == Some(true);

    // Parallelism.
    let gpus = num(v, "num_gpus").unwrap_or(1).max(1);
    let sharding_text = text(v, "sharding").to_ascii_lowercase();
    let cpu_text = text(v, "cpu_offload").to_ascii_lowercase();
    let offload = if cpu_text.contains("param") {
        Offload::OptimizerAndParams
    } else if cpu_text.contains("optim") {
        Offload::Optimizer
    } else {
        Offload::None
    };
    let mut parallel = Parallel {
        offload,
        ..Parallel::single()
    };
    if sharding_text.contains("zero-3") || sharding_text.contains("zero3") {
        parallel.sharding = Sharding::Zero3;
        parallel.data_parallel = gpus;
    } else if sharding_text.contains("zero-2") || sharding_text.contains("zero2") {
        parallel.sharding = Sharding::Zero2;
        parallel.data_parallel = gpus;
        if fw.contains("qwen finetune.py") {
            // Qwen's `finetune/ds_config_zero2.json` (QwenLM/Qwen, used by every ZeRO-2
            // script of its finetune/ directory) sets `"reduce_bucket_size": 2e8` instead of
            // "auto".
            parallel.reduce_bucket = Some(200_000_000);
        }
    } else if sharding_text.contains("zero-1") {
        parallel.sharding = Sharding::Zero1;
        parallel.data_parallel = gpus;
    } else if sharding_text.contains("shard_grad_op") {
        parallel.sharding = Sharding::FsdpShardGradOp;
        parallel.data_parallel = gpus;
    } else if sharding_text.contains("hybrid") {
        parallel.sharding = Sharding::FsdpHybridShard;
        parallel.data_parallel = gpus;
    } else if sharding_text.contains("fsdp") || sharding_text.contains("full_shard") {
        parallel.sharding = Sharding::FsdpFullShard;
        parallel.data_parallel = gpus;
    } else if sharding_text.contains("tensor") {
        parallel.tensor_parallel = gpus;
    } else if sharding_text.contains("pipeline") || sharding_text.contains("sequential") {
        parallel.pipeline = gpus;
    } else if gpus > 1 {
        parallel.data_parallel = gpus;
    }
    if offload != Offload::None && parallel.sharding == Sharding::None {
        return Err(
            "CPU offload without ZeRO/FSDP (accelerate big-model offload) is not modelled".into(),
        );
    }

    // litgpt's `generate/sequentially.py` builds each layer's KV cache outside any dtype
    // context (`build_kv_cache(..., dtype=None)`): fp32.
    let fp32_kv = stack == Stack::Litgpt && parallel.pipeline > 1;
    let job = Job {
        method,
        quantization,
        adapter: PeftConfig {
            method: peft,
            ..lora
        },
        micro_batch_size,
        seq_len,
        grad_accum: num(v, "grad_accum").unwrap_or(1).max(1),
        optimizer,
        gradient_checkpointing,
        attention,
        precision,
        stack,
        loss,
        padding,
        parallel,
        versions: Versions {
            transformers: version_of(&fw, "transformers"),
            bitsandbytes: version3_of(&fw, "bitsandbytes").or_else(|| {
                // litgpt pinned `bitsandbytes==0.42.0` (pyproject `[all]`) until 2024-12-28.
                let year: u32 = text(v, "measured_when").get(..4)?.parse().ok()?;
                (stack == Stack::Litgpt && year <= 2024).then_some((0, 42, 0))
            }),
            // fms-acceleration's accelerated-peft plugin replaces TRL's preparation of the
            // quantized model with its own, which only freezes the base and never upcasts
            // to fp32 (`framework_plugin_bnb.py` `_prepare_model_for_kbit_training`: "the
            // stock one in peft will introduce extraneous casting"), as TRL ≥ 0.26 does.
            trl: version_of(&fw, "trl").filter(|_| !quant_all.contains("accelerated-peft")),
            peft: version_of(&fw, "peft"),
            torch: torch_version(&fw),
            // torchtune 0.1.0 and 0.1.1 pin `torchao==0.1` (pyproject.toml); 0.2.0 pins 0.3.1.
            torchao: version_of(&fw, "torchao").or_else(|| {
                (stack == Stack::Torchtune && version_of(&fw, "torchtune") == Some((0, 1)))
                    .then_some((0, 1))
            }),
            // A row that names no release: torchtune 0.3.0 was released on 2024-09-18.
            torchtune: version_of(&fw, "torchtune").or_else(|| {
                let when = text(v, "measured_when");
                (stack == Stack::Torchtune && !when.is_empty() && when.as_str() < "2024-09")
                    .then_some((0, 2))
            }),
            // A row that names no release: mlx 0.32.2, the first with the fused
            // cross-entropy, came out in August 2026.
            mlx: version3_of(&fw, "mlx").or_else(|| {
                let when = text(v, "measured_when");
                (stack == Stack::Mlx && !when.is_empty() && when.as_str() < "2026-08")
                    .then_some((0, 32, 1))
            }),
        },
        kv_dtype: if precision == Precision::Fp32 || fp32_kv {
            crate::job::KvDtype::F32
        } else {
            crate::job::KvDtype::F16
        },
        optimizer_in_backward: truthy(v, "optimizer_in_backward") == Some(true),
        // The measured rows are text-only runs.
        images: crate::vision::Images::default(),
        vision: crate::job::VisionTraining::Frozen,
        liger,
        compile: truthy(v, "torch_compile") == Some(true),
        activation_offload,
        // MLX's `num_layers`, else the stack's default.
        adapted_layers: match v.get("num_layers").and_then(Value::as_i64) {
            Some(n) if n < 0 => None,
            Some(n) => u64::try_from(n).ok(),
            None => stack.profile().default_adapted_layers,
        },
        // An encoder-decoder row's target tokens per sample.
        target_len: num(v, "target_len"),
        new_tokens,
    };
    // FSDP2 where the row says so (`fully_shard`), else the stack's.
    let mut job = job;
    if job.parallel.sharding.is_fsdp() {
        job.parallel.fsdp =
            if sharding_text.contains("fsdp2") || sharding_text.contains("fully_shard") {
                FsdpApi::Fsdp2
            } else if sharding_text.contains("fsdp1") {
                FsdpApi::Fsdp1
            } else {
                FsdpApi::default_for(job.stack, &job.versions)
            };
    }

    let metric_text = text(v, "metric").to_ascii_lowercase();
    let metric = if metric_text.contains("nvidia") || metric_text.contains("nvml") {
        Metric::Device
    } else if metric_text.contains("reserved")
        && (!metric_text.contains("alloc")
            || metric_text.starts_with("torch.cuda.max_memory_reserved"))
    {
        Metric::Reserved
    } else {
        Metric::Allocated
    };
    let oom = text(v, "outcome").eq_ignore_ascii_case("oom");
    // The calibration harness empties PyTorch's cache after loading unless told to keep it;
    // what loading leaves in the cache (its fragmentation) is not modelled.
    if metric != Metric::Allocated
        && v.get("calibration")
            .and_then(|c| c.get("load_cache"))
            .and_then(Value::as_str)
            == Some("kept")
    {
        return Err(
            "measured on top of the model load's cache (harness --keep-load-cache): the load's \
             fragmentation is not modelled"
                .into(),
        );
    }
    let measured_gib = v
        .get("per_gpu_gib")
        .and_then(Value::as_f64)
        .or_else(|| v.get("measured_gib").and_then(Value::as_f64));
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let measured_bytes = match measured_gib {
        Some(g) if g.is_finite() && g > 0.0 => (g * GIB as f64) as u64,
        _ if oom => 0,
        _ => return Err("no measured value".into()),
    };
    // Checkouts of the pre-release `lit-gpt` measured up to October 2023 (the expansion
    // landed on 2023-10-24; the October resource tables ran 8641822, which predates it).
    let litgpt_unexpanded_mqa = stack == Stack::Litgpt
        && fw.contains("lit-gpt")
        && text(v, "measured_when")
            .get(..7)
            .is_some_and(|d| d <= "2023-10");
    let gpu = text(v, "gpu");
    let (gpu_memory_bytes, compute_capability) = gpu_facts(&gpu);
    if oom && gpu_memory_bytes.is_none() {
        return Err(format!("OOM row on an unknown GPU `{gpu}`"));
    }
    let simulated = text(v, "source_key").starts_with("oracle-") && job.parallel.gpus() == 1;
    Ok(Row {
        id,
        source: text(v, "source_key"),
        model_id,
        job,
        metric,
        measured_bytes,
        oom,
        gpu_memory_bytes,
        compute_capability,
        confidence: text(v, "confidence"),
        model_overrides: v.get("model_overrides").and_then(Value::as_object).cloned(),
        simulated,
        cuda_context_bytes: measured_context(v),
        litgpt_unexpanded_mqa,
        trainable_params: num(v, "trainable_params"),
        loads_whole_model: text(v, "sharding")
            .to_ascii_lowercase()
            .contains("gpu loading"),
    })
}

/// The bare CUDA context a row measured on its own machine, in bytes.
///
/// `secondary_measurements.cuda_context_only_MiB` is nvidia-smi after the first CUDA tensor
/// (the transformers docs' `torch.ones((1, 1)).to("cuda")` then `print_gpu_utilization()`),
/// so it includes the 2 MiB small-pool segment that tensor reserved (`kSmallBuffer`,
/// CUDACachingAllocator.cpp), which the reserved level already counts: it is taken off.
/// Kernels loaded later (cuBLAS on its first GEMM) are not in it.
pub(super) fn measured_context(v: &Value) -> Option<u64> {
    let mib = v
        .get("secondary_measurements")?
        .get("cuda_context_only_MiB")?
        .as_f64()
        .filter(|m| m.is_finite() && *m > 2.0)?;
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    Some(((mib - 2.0) * crate::units::MIB as f64) as u64)
}

/// PyTorch `(major, minor)` of a row: named in the framework text (`torch 2.4.1`,
/// `pytorch 1.13`), else bounded by the transformers release: transformers ≤ 4.26 came out
/// before PyTorch 2.0.0 (2023-03-15; transformers 4.27.0 the same day), so a run on it used
/// a 1.x release. Only `< 2.0` is ever asked of the inferred value, so it is the last 1.x
/// minor, 1.13.
pub(super) fn torch_version(fw: &str) -> Option<(u32, u32)> {
    version_of(fw, "torch")
        .or_else(|| version_of(fw, "pytorch"))
        .or_else(|| {
            version_of(fw, "transformers")
                .filter(|v| *v < (4, 27))
                .map(|_| (1, 13))
        })
}

/// The `major.minor.patch` version of `package` in a framework-version string such as
/// `"torch 2.4.1, transformers 4.48.1, trl 0.13.0"` (missing parts are 0; whole words only,
/// so `trl` does not match `sfttrl`; an approximate `transformers ~4.16` reads as 4.16).
pub(super) fn version3_of(fw: &str, package: &str) -> Option<(u32, u32, u32)> {
    let needle = format!("{package} ");
    let mut from = 0;
    while let Some(pos) = fw[from..].find(&needle) {
        let start = from + pos;
        from = start + needle.len();
        if start > 0 && fw.as_bytes()[start - 1].is_ascii_alphanumeric() {
            continue;
        }
        let rest = fw[from..].strip_prefix('~').unwrap_or(&fw[from..]);
        if !rest.starts_with(|c: char| c.is_ascii_digit()) {
            continue;
        }
        let mut parts = rest
            .split(|c: char| !c.is_ascii_digit())
            .map(|p| p.parse::<u32>().ok());
        let a = parts.next()??;
        let b = parts.next().flatten().unwrap_or(0);
        let c = parts.next().flatten().unwrap_or(0);
        return Some((a, b, c));
    }
    None
}

/// The `major.minor` part of [`version3_of`].
pub(super) fn version_of(fw: &str, package: &str) -> Option<(u32, u32)> {
    version3_of(fw, package).map(|(a, b, _)| (a, b))
}

/// Memory and compute capability of a GPU named in free text ("NVIDIA A100-SXM4-40GB",
/// "1x RTX 4090", "A100 40GB (per text)").
#[must_use]
pub fn gpu_facts(gpu: &str) -> (Option<u64>, Option<(u32, u32)>) {
    if let Some(m) = hardware::match_name(gpu) {
        return (m.memory_bytes, m.compute_capability);
    }
    let l = gpu.to_ascii_lowercase();
    let cc = if l.contains("h100") || l.contains("h200") || l.contains("h800") {
        Some((9, 0))
    } else if l.contains("a100") || l.contains("a800") {
        Some((8, 0))
    } else if l.contains("a10g") || l.contains("a6000") || l.contains("3090") || l.contains("a10 ")
    {
        Some((8, 6))
    } else if l.contains("l40") || l.contains("4090") || l.contains("l4") {
        Some((8, 9))
    } else if l.contains("v100") {
        Some((7, 0))
    } else if l.contains("t4") {
        Some((7, 5))
    } else {
        None
    };
    // "40GB", "80 GB", "(24 GB)"
    let digits: Vec<(usize, &str)> = l
        .match_indices(|c: char| c.is_ascii_digit())
        .collect::<Vec<_>>();
    let mut mem = None;
    if !digits.is_empty() {
        let bytes = l.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i].is_ascii_digit() {
                let start = i;
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
                let n: u64 = l[start..i].parse().unwrap_or(0);
                let rest = l[i..].trim_start();
                if (rest.starts_with("gb") || rest.starts_with("gib")) && (8..=300).contains(&n) {
                    // vendors' "80GB" cards report ~79.2 GiB usable (nvidia-smi MiB).
                    mem = Some(n * GIB - n * GIB / 100);
                }
            } else {
                i += 1;
            }
        }
    }
    (mem, cc)
}
