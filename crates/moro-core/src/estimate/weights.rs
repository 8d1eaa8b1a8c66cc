//! Weight storage: dense, bitsandbytes 4-bit and 8-bit, GPTQ; LoRA / DoRA adapters; the
//! dequantization transient of a quantized matmul.

use crate::job::{Job, Method, PeftKind, Quantization};
use crate::model::{Linear, ModelSpec};

use super::Regime;

/// bitsandbytes' 4-bit block size: `functional.py` `quantize_4bit`: `if blocksize is None:
/// blocksize = 64`; transformers' `BitsAndBytesConfig` has no option to change it.
pub const NF4_BLOCK: u64 = 64;
/// Block size of the double-quantized absmax: `quantize_blockwise(_absmax - offset,
/// blocksize=256)` (`functional.py`).
pub const NF4_DQ_BLOCK: u64 = 256;
/// Fixed bytes per 4-bit Linear: the 16-entry fp32 code (64 B) and, with double quant, the
/// 256-entry fp32 `state2.code` (1 KiB) and the fp32 offset, each rounded up to the
/// allocator's 512 B minimum block (`kMinBlockSize`, CUDACachingAllocator.cpp).
const NF4_FIXED: u64 = 512;
const NF4_DQ_FIXED: u64 = 512 + 1024 + 512;
/// GPTQ group size (AutoGPTQ / Qwen's Int4 checkpoints: `group_size: 128`).
pub const GPTQ_GROUP: u64 = 128;

/// Stored bytes of one copy of a quantized Linear weight with `n = in·out` elements.
///
/// - NF4/FP4 (memory-anatomy §1.1, bitsandbytes `_ops.py` fake `quantize_4bit`): packed
///   `n/2` bytes + fp32 absmax per 64-element block; double quant stores the absmax as uint8
///   plus an fp32 absmax per 256 of them.
/// - LLM.int8 (§1.4): int8 `CB` (n bytes) + fp32 row scales `SCB` (4·out).
/// - GPTQ int4: packed `qweight` n/2, fp16 `scales` (in/128)·out, packed int4 `qzeros`
///   (in/128)·out/2 and int32 `g_idx` (4·in) (AutoGPTQ `QuantLinear.__init__`).
#[must_use]
pub fn quantized_linear_bytes(l: &Linear, q: Quantization) -> u64 {
    let n = l.weight_numel();
    let blocks = n.div_ceil(NF4_BLOCK);
    match q {
        Quantization::Nf4 | Quantization::Fp4 => n.div_ceil(2) + 4 * blocks + NF4_FIXED,
        Quantization::Nf4Dq | Quantization::Fp4Dq => {
            n.div_ceil(2) + blocks + 4 * blocks.div_ceil(NF4_DQ_BLOCK) + NF4_DQ_FIXED
        }
        Quantization::Int8 => n + 4 * l.out_features,
        Quantization::Gptq4 => {
            let groups = l.in_features.div_ceil(GPTQ_GROUP);
            n.div_ceil(2)
                + groups * l.out_features * 2
                + groups * l.out_features.div_ceil(2)
                + 4 * l.in_features
        }
        // `*_blocks` (two values a byte) and `*_scales` (one byte per 32 values).
        Quantization::Mxfp4 => n.div_ceil(2) + n.div_ceil(32),
        // Scales and biases in a 16-bit model's dtype ([`crate::job::AffineQuant::bytes`]).
        Quantization::Mlx2
        | Quantization::Mlx3
        | Quantization::Mlx4
        | Quantization::Mlx5
        | Quantization::Mlx6
        | Quantization::Mlx8
        | Quantization::Mlx4G32
        | Quantization::Mlx8G32 => q
            .mlx()
            .map_or(n * 2, |a| a.bytes(l.out_features, l.in_features, 2)),
        Quantization::None => n * 2,
    }
}

/// Stored bytes of a torchao `NF4Tensor` of `n` elements (torchao `dtypes/nf4tensor.py`,
/// block 64, scaler block 256): packed `quantized_data` n/2, int8 `quantized_scalers` n/64,
/// and `quantization_factor`, a `[:, 0]` view that keeps its full n/64-element bf16 storage
/// alive (n/32 bytes) as torchtune's `copy_` override assigns it. [DERIVED from the code;
/// unverified on a GPU]
#[must_use]
pub const fn torchao_nf4_bytes(n: u64) -> u64 {
    n.div_ceil(2) + n.div_ceil(64) + 2 * n.div_ceil(64) + 512
}

/// Bytes of the base model's weights as the job holds them (adapters excluded).
///
/// Only `nn.Linear` modules inside the decoder layers are quantized (no stacked weight,
/// [`crate::model::Linear::is_module`]); embeddings, norms, biases and lm_head stay in
/// the load dtype (transformers `replace_with_bnb_linear` and
/// `get_keys_to_not_convert`, memory-anatomy §1.2) — except under Lightning's plugin, which
/// quantizes lm_head too.
#[must_use]
pub fn base_weight_bytes(model: &ModelSpec, job: &Job, r: &Regime) -> u64 {
    let total = model.total_params();
    if job.method == Method::Full {
        return total * r.param_bytes;
    }
    let q = job.quantization;
    if q == Quantization::None {
        return total * r.frozen_bytes;
    }
    if let Some(affine) = q.mlx() {
        return super::mlx::weight_bytes(model, affine, r);
    }
    let mut quant = 0u64;
    let mut quantized_params = 0u64;
    let torchtune = job.stack.profile().nf4 == crate::stack::Nf4Kernel::Torchao && q.is_bnb4();
    // bitsandbytes replaces `nn.Linear` modules; MXFP4 is the stored experts only.
    let quantized = |l: &Linear| match q {
        Quantization::Mxfp4 => {
            l.layout == crate::model::WeightLayout::Stacked
                && l.role == crate::model::LinearRole::Expert
        }
        _ => job.is_module(l),
    };
    for (layers, l) in model.linears().filter(|(_, l)| quantized(l)) {
        if torchtune {
            // torchtune quantizes only the base weight of each `LoRALinear`
            // (`lora.py`: `to_nf4(linear.weight) if self._quantize_base`); other Linears
            // stay in the load dtype.
            if !job.adapts(l) {
                continue;
            }
            quant += layers * l.count * torchao_nf4_bytes(l.weight_numel());
        } else {
            quant += layers * l.count * quantized_linear_bytes(l, q);
        }
        quantized_params += layers * l.count * l.weight_numel();
    }
    if r.quantize_lm_head {
        let head = Linear::new(
            "lm_head",
            model.hidden_size,
            model.vocab_size,
            false,
            crate::model::LinearRole::Mlp,
        );
        quant += quantized_linear_bytes(&head, q);
        if !model.tie_word_embeddings {
            quantized_params += head.weight_numel();
        }
    }
    quant + (total - quantized_params.min(total)) * r.unquantized_bytes
}

/// Bytes of the bitsandbytes 4-bit quantization states of the base (absmax, its double
/// quantization, the codes): the part of [`base_weight_bytes`] that is not the packed
/// weight. They are not parameters — `Linear4bit` keeps `quant_state` on the module and
/// restores it onto its weight (`fix_4bit_weight_quant_state_from_module`, bitsandbytes
/// 0.50) — so FSDP does not shard them: every rank holds all of them (the rank traces of
/// `validation/oracle-traces/fsdp-*` list them whole). 0 for other storage.
#[must_use]
pub fn bnb4_quant_state_bytes(model: &ModelSpec, job: &Job) -> u64 {
    let q = job.quantization;
    if job.method == Method::Full || !q.is_bnb4() || !job.stack.profile().nf4.is_bitsandbytes() {
        return 0;
    }
    model
        .linears()
        .filter(|(_, l)| job.is_module(l))
        .map(|(layers, l)| {
            layers
                * l.count
                * quantized_linear_bytes(l, q).saturating_sub(l.weight_numel().div_ceil(2))
        })
        .sum()
}

/// Parameters of the PEFT-library adapters ([`lora_tensors`]): LoRA's `r·(in + out)` per
/// adapted copy (plus DoRA's magnitude), or another PEFT method's tensors.
#[must_use]
pub fn lora_params(model: &ModelSpec, job: &Job) -> u64 {
    lora_tensors(model, job)
        .iter()
        .map(|&(c, (rows, cols))| c * rows * cols)
        .sum()
}

/// Whether IA³ scales the input of `l` (a feedforward module) rather than its output: the
/// job's `adapter.feedforward`, else PEFT's default for decoders
/// (`TRANSFORMERS_MODELS_TO_IA3_FEEDFORWARD_MODULES_MAPPING`: `down_proj` for Llama-style
/// models), the Linears reading the MLP's intermediate.
#[must_use]
pub fn ia3_feedforward(model: &ModelSpec, job: &Job, l: &Linear) -> bool {
    match &job.adapter.feedforward {
        Some(t) => t.matches(&l.name),
        None => {
            matches!(
                l.role,
                crate::model::LinearRole::Mlp | crate::model::LinearRole::Expert
            ) && l.out_features == model.hidden_size
                && l.in_features != model.hidden_size
        }
    }
}

/// The trainable tensors of a PEFT-library job as `(copies, (rows, cols))` (vectors as
/// `(n, 1)`), per method:
///
/// - LoRA (`LoraLayer.update_layer`): `lora_A = nn.Linear(in, r)`, `lora_B = nn.Linear(r, out)`,
///   no biases; DoRA adds a magnitude vector of `out` (`lora/dora.py`).
/// - AdaLoRA (`AdaLoraLayer.update_layer`): `lora_A` (r × in), `lora_E` (r × 1), `lora_B`
///   (out × r) at `init_r` (`adapter.rank`).
/// - IA³ (`IA3Layer.update_layer`): `ia3_l` of `in` (feedforward, [`ia3_feedforward`]) or
///   `out` elements.
/// - LoHa (`LoHaLayer.update_layer`): `hada_w1_a`, `hada_w2_a` (out × r), `hada_w1_b`,
///   `hada_w2_b` (r × in).
/// - LoKr (`LoKrLayer.create_adapter_parameters`, `decompose_both=False`): `lokr_w1`
///   (a × c) and `lokr_w2` (b × d), or `lokr_w2_a` (b × r) and `lokr_w2_b` (r × d) when
///   r < max(b, d) / 2; (a, b) and (c, d) factor out and in ([`lokr_factors`]).
/// - OFT (`OFTRotationModule`): r skew-symmetric blocks of b(b − 1)/2 parameters, b = in / r.
/// - VeRA (`VeraLayer.update_layer`): `lambda_d` (r) and `lambda_b` (out); the shared
///   random A and B are frozen buffers ([`vera_buffers`]).
/// - LN tuning (`LNTuningLayer.update_layer`: `deepcopy(layer)`): a copy of every norm's
///   parameters, each layer's and the final norm.
/// - Prompt tuning (`PromptEmbedding`): `num_virtual_tokens × hidden`.
/// - Prefix tuning (`PrefixEncoder`, `prefix_projection=False`): one embedding of
///   `num_virtual_tokens × (layers · 2 · token_dim)`, token_dim the key/value width.
#[must_use]
pub fn lora_tensors(model: &ModelSpec, job: &Job) -> Vec<(u64, (u64, u64))> {
    let r = job.adapter.rank;
    let h = model.hidden_size;
    match job.adapter.method {
        PeftKind::LnTuning => {
            let mut v: Vec<(u64, (u64, u64))> = model
                .layers
                .iter()
                .filter(|g| g.other_params > 0)
                .map(|g| {
                    let k = g.other_params.div_ceil(h.max(1));
                    (g.count * k, (g.other_params / k, 1))
                })
                .collect();
            if model.final_norm_params > 0 {
                v.push((1, (model.final_norm_params, 1)));
            }
            return v;
        }
        PeftKind::PromptTuning => return vec![(1, (job.adapter.virtual_tokens, h))],
        PeftKind::PrefixTuning => {
            let width = model.num_layers * 2 * model.kv_width();
            return vec![(1, (job.adapter.virtual_tokens, width))];
        }
        _ => {}
    }
    let mut v = Vec::new();
    for (layers, l) in model.linears() {
        if !job.adapts(l) {
            continue;
        }
        let copies = job.trained_share(model, layers) * l.count;
        if l.count > 1 && job.adapts_stacked(l) {
            // `ParamWrapper.update_layer`: `lora_A` in → r·E and `lora_B` r·E → out over the
            // stack. The gate and up stacks are one `gate_up_proj` at rank 2r (PEFT's
            // conversion doubles it): lora_A 2r·E × H and lora_B 2I × 2r·E, counted here as
            // one r·E × H and one 2I × r·E per member.
            let re = r * l.count;
            let gate_up = l.out_features != model.hidden_size;
            let b_rows = if gate_up {
                2 * l.out_features
            } else {
                l.out_features
            };
            v.push((layers, (re, l.in_features)));
            v.push((layers, (b_rows, re)));
            continue;
        }
        for (_, shape) in adapter_tensors(model, job, l) {
            v.push((copies, shape));
        }
    }
    v
}

/// One adapted Linear's trainable tensors, in `named_parameters` order, as `(name, (rows,
/// cols))` ([`lora_tensors`] lists each method's; not a stacked expert's).
#[must_use]
pub fn adapter_tensors(
    model: &ModelSpec,
    job: &Job,
    l: &crate::model::Linear,
) -> Vec<(&'static str, (u64, u64))> {
    let r = job.adapter.rank;
    let (i, o) = (l.in_features, l.out_features);
    match job.adapter.method {
        PeftKind::Ia3 => vec![(
            "ia3_l",
            if ia3_feedforward(model, job, l) {
                (i, 1)
            } else {
                (o, 1)
            },
        )],
        // `VeraLayer.__init__` registers `vera_lambda_b`, then `vera_lambda_d`.
        PeftKind::Vera => vec![("vera_lambda_b", (o, 1)), ("vera_lambda_d", (r, 1))],
        PeftKind::AdaLora => vec![("lora_A", (r, i)), ("lora_B", (o, r)), ("lora_E", (r, 1))],
        PeftKind::Oft => {
            // `oft_R.weight`: r × b(b − 1)/2, b = in / r (`OFTRotationModule`).
            let b = i / r.max(1);
            vec![("oft_R", (r, b * b.saturating_sub(1) / 2))]
        }
        PeftKind::Boft => {
            // `boft_R` (D, in / b, b, b), then `boft_s` (out, 1) (`BOFTLayer.update_layer`).
            let b = job.adapter.boft_block_size().max(1);
            vec![
                (
                    "boft_R",
                    (job.adapter.boft_butterfly_factor() * (i / b), b * b),
                ),
                ("boft_s", (o, 1)),
            ]
        }
        PeftKind::LoKr => {
            let ((a, b), (c, d)) = lokr_factors(l, job.adapter.decompose_factor);
            if lokr_w2_factored(r, b, d) {
                vec![
                    ("lokr_w1", (a, c)),
                    ("lokr_w2_a", (b, r)),
                    ("lokr_w2_b", (r, d)),
                ]
            } else {
                vec![("lokr_w1", (a, c)), ("lokr_w2", (b, d))]
            }
        }
        PeftKind::LoHa => vec![
            ("hada_w1_a", (o, r)),
            ("hada_w1_b", (r, i)),
            ("hada_w2_a", (o, r)),
            ("hada_w2_b", (r, i)),
        ],
        _ if job.adapter.dora => vec![
            ("lora_A", (r, i)),
            ("lora_B", (o, r)),
            ("lora_magnitude_vector", (o, 1)),
        ],
        _ => vec![("lora_A", (r, i)), ("lora_B", (o, r))],
    }
}

/// Whether LoKr factors `lokr_w2` (b × d) into `lokr_w2_a @ lokr_w2_b` at rank r:
/// `use_w2 = not (r < max(b, d) / 2)` (`LoKrLayer.update_layer`).
#[must_use]
pub const fn lokr_w2_factored(rank: u64, b: u64, d: u64) -> bool {
    2 * rank < if b > d { b } else { d }
}

/// LoKr's factors of a Linear, `((a, b), (c, d))` with out = a·b and in = c·d
/// (`LoKrLayer.update_layer`: `factorization(out)`, `factorization(in)`).
#[must_use]
pub fn lokr_factors(l: &crate::model::Linear, factor: Option<u64>) -> ((u64, u64), (u64, u64)) {
    (
        factorization(l.out_features, factor),
        factorization(l.in_features, factor),
    )
}

/// PEFT's `factorization(dimension, factor)` (`tuners/lokr/layer.py`, 0.21.2): with a factor
/// that divides the dimension, `(factor, dimension / factor)` as is; otherwise the divisor
/// pair `(m, n)`, m ≤ n, closest to the square root with m at most the factor.
#[must_use]
pub fn factorization(dimension: u64, factor: Option<u64>) -> (u64, u64) {
    if let Some(f) = factor
        && f > 0
        && dimension.is_multiple_of(f)
    {
        return (f, dimension / f);
    }
    let factor = factor.unwrap_or(dimension);
    let (mut m, mut n) = (1, dimension);
    let length = m + n;
    while m < n {
        let mut new_m = m + 1;
        while !dimension.is_multiple_of(new_m) {
            new_m += 1;
        }
        let new_n = dimension / new_m;
        if new_m + new_n > length || new_m > factor {
            break;
        }
        (m, n) = (new_m, new_n);
    }
    if m > n { (n, m) } else { (m, n) }
}

/// VeRA's frozen shared projections (`VeraModel._init_vera_A_vera_B`): A of r × the widest
/// targeted input and B of the widest targeted output × r, one pair for the whole model, in
/// fp32 (`_kaiming_init` on a `torch.Generator`); 0 for other methods.
#[must_use]
pub fn vera_buffers(model: &ModelSpec, job: &Job) -> u64 {
    if job.adapter.method != PeftKind::Vera {
        return 0;
    }
    let targeted = || model.linears().filter(|(_, l)| job.adapts(l));
    let max_in = targeted().map(|(_, l)| l.in_features).max().unwrap_or(0);
    let max_out = targeted().map(|(_, l)| l.out_features).max().unwrap_or(0);
    job.adapter.rank * (max_in + max_out) * 4
}

/// BOFT's permutation buffers `boft_P`, one per adapted Linear in forward order, D × in × in
/// in fp32 (`BOFTLayer.update_layer`: `torch.empty` in the default dtype, registered with
/// `register_buffer`): PEFT makes them on the CPU and never moves them
/// (`_move_adapter_to_device_of_base_layer` moves `boft_R` and `boft_s` only); the HF
/// Trainer then moves the whole model to the GPU for an unquantized base
/// (`Trainer._move_model_to_device`) and leaves a bitsandbytes one where it is, so the
/// buffers are on the GPU only for an unquantized base. Empty for other methods.
#[must_use]
pub fn boft_permutations(model: &ModelSpec, job: &Job) -> Vec<u64> {
    if job.adapter.method != PeftKind::Boft
        || !job.method.is_peft()
        || job.quantization != crate::job::Quantization::None
    {
        return Vec::new();
    }
    let d = job.adapter.boft_butterfly_factor();
    model
        .layers
        .iter()
        .flat_map(|g| {
            let one: Vec<u64> = g
                .linears
                .iter()
                .filter(|l| job.adapts(l))
                .flat_map(|l| {
                    std::iter::repeat_n(d * l.in_features * l.in_features * 4, to_usize(l.count))
                })
                .collect();
            std::iter::repeat_n(one, to_usize(g.count)).flatten()
        })
        .collect()
}

/// Frozen buffers a PEFT method keeps on the GPU beside its parameters: VeRA's projections
/// ([`vera_buffers`]) and BOFT's permutations ([`boft_permutations`]).
#[must_use]
pub fn peft_buffers(model: &ModelSpec, job: &Job) -> u64 {
    vera_buffers(model, job) + boft_permutations(model, job).iter().sum::<u64>()
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// lit-gpt `adapter.Config.adapter_prompt_length`: tokens of the learned prefix.
pub const ADAPTER_PROMPT_LENGTH: u64 = 10;
/// lit-gpt `adapter.Config.adapter_start_layer`: the first layer with a prefix and a gate.
pub const ADAPTER_START_LAYER: u64 = 2;

/// Parameters lit-gpt's LLaMA-Adapter (v1 and v2) adds or makes trainable, by kind.
///
/// - `prefix`: `CausalSelfAttention.adapter_wte = nn.Embedding(adapter_prompt_length,
///   n_embd)` in every layer with `block_idx >= adapter_start_layer` (`lit_gpt/adapter.py`).
/// - `gating`: `gating_factor = nn.Parameter(torch.zeros(1, 1, n_head, 1))` in the same layers.
/// - `scale_bias` (v2 only): `AdapterV2Linear.adapter_bias` (zeros) and `adapter_scale`
///   (ones), `out_features` each, on every Linear of every layer and on `lm_head`
///   (`lit_gpt/adapter_v2.py`).
/// - `norms` (v2 only): `adapter_filter` also marks `norm_1`, `norm_2` and `ln_f` trainable;
///   the Linears' own weights and biases stay frozen.
///
/// For Llama-2-7B: v1 30 · (10·4096 + 32) = 1,229,760; v2 adds 32 · (2 · 42,496 + 2·4096)
/// + 4096 + 2·32,000 = 3,049,984 (4,279,744 in all), the counts lit-gpt prints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdapterParams {
    /// `adapter_wte` weights.
    pub prefix: u64,
    /// `gating_factor`s.
    pub gating: u64,
    /// v2 `adapter_bias` + `adapter_scale`.
    pub scale_bias: u64,
    /// v2 trainable norm weights (and biases) of the base model.
    pub norms: u64,
}

impl AdapterParams {
    /// The adapter parameters of `kind` on `model` (zero for LoRA).
    #[must_use]
    pub fn new(model: &ModelSpec, kind: PeftKind) -> Self {
        if !kind.is_adapter() {
            return Self::default();
        }
        let layers = adapter_layers(model);
        let mut p = Self {
            prefix: layers * ADAPTER_PROMPT_LENGTH * model.hidden_size,
            gating: layers * model.num_heads,
            ..Self::default()
        };
        if kind == PeftKind::AdapterV2 {
            p.scale_bias = model
                .linears()
                .map(|(n, l)| 2 * n * l.count * l.out_features)
                .sum::<u64>()
                + 2 * model.vocab_size;
            p.norms = model
                .layers
                .iter()
                .map(|g| g.count * g.other_params)
                .sum::<u64>()
                + model.final_norm_params;
        }
        p
    }

    /// Tensors the adapter adds to the model (the `Adapters` component).
    #[must_use]
    pub const fn added(&self) -> u64 {
        self.prefix + self.gating + self.scale_bias
    }

    /// Parameters with `requires_grad` (what lit-gpt prints as trainable).
    #[must_use]
    pub const fn trainable(&self) -> u64 {
        self.added() + self.norms
    }

    /// Parameters that receive a gradient. The fine-tuning scripts run `validate` under
    /// `torch.no_grad()` before training; its forward fills each layer's `adapter_kv_cache`
    /// with the prefix's k/v, and `CausalSelfAttention.scaled_dot_product_attention` reuses
    /// that cache in every later forward (it is never cleared), so `adapter_wte` never gets
    /// a gradient nor optimizer states (Lightning-AI/litgpt#1287; PR #2327: "training instead
    /// reuses detached K/V and the adapter embeddings receive no gradients").
    #[must_use]
    pub const fn with_grad(&self) -> u64 {
        self.gating + self.scale_bias + self.norms
    }
}

/// Layers with a prefix and a gate: `block_idx >= adapter_start_layer`.
#[must_use]
pub const fn adapter_layers(model: &ModelSpec) -> u64 {
    model.num_layers.saturating_sub(ADAPTER_START_LAYER)
}

/// Bytes of the adapters' `adapter_kv_cache`: per adapter layer the prefix's k and v
/// (`ak`, `av`, repeated to all heads: `(1, n_head, adapter_prompt_length, head_size)`),
/// computed once by the first (no-grad) validation forward and kept for the whole run.
#[must_use]
pub fn adapter_kv_cache_bytes(model: &ModelSpec, kind: PeftKind, bytes: u64) -> u64 {
    if kind.is_adapter() {
        adapter_layers(model) * 2 * ADAPTER_PROMPT_LENGTH * model.q_width() * bytes
    } else {
        0
    }
}

/// The adapter tensors that receive gradients, as `(copies, numel)`: the gates, v2's
/// bias/scale pairs (`lm_head`'s included) and v2's norm weights (split into
/// `hidden_size`-sized pieces, weight and bias).
#[must_use]
pub fn adapter_grad_tensors(model: &ModelSpec, kind: PeftKind) -> Vec<(u64, u64)> {
    if !kind.is_adapter() {
        return vec![];
    }
    let h = model.hidden_size.max(1);
    let mut v = vec![(adapter_layers(model), model.num_heads)];
    if kind == PeftKind::AdapterV2 {
        for (n, l) in model.linears() {
            v.push((2 * n * l.count, l.out_features));
        }
        v.push((2, model.vocab_size));
        let mut pieces = |copies: u64, params: u64| {
            if params > 0 {
                let k = params.div_ceil(h);
                v.push((copies * k, params / k));
            }
        };
        for g in &model.layers {
            pieces(g.count, g.other_params);
        }
        pieces(1, model.final_norm_params);
    }
    v
}

/// Parameters the method adds to the base model: LoRA's A/B (and DoRA's magnitude), or the
/// lit-gpt adapter's tensors ([`AdapterParams::added`]).
#[must_use]
pub fn added_params(model: &ModelSpec, job: &Job) -> u64 {
    if job.adapter.method.is_adapter() {
        AdapterParams::new(model, job.adapter.method).added()
    } else {
        lora_params(model, job)
    }
}

/// Parameters that get gradients (and optimizer states) in a PEFT job.
#[must_use]
pub fn grad_params(model: &ModelSpec, job: &Job) -> u64 {
    if job.adapter.method.is_adapter() {
        AdapterParams::new(model, job.adapter.method).with_grad()
    } else {
        lora_params(model, job)
    }
}

/// The transient of a quantized matmul: the dequantized weight of the largest quantized
/// Linear in the compute dtype, plus (double quant) its dequantized fp32 absmax.
///
/// bitsandbytes ≤ 0.49 `MatMul4Bit.forward`: `F.dequantize_4bit(B, quant_state).to(A.dtype)`;
/// bnb 0.50 `_dequant_linear_fallback` for M > 1536 rows: `B_dq = torch.empty(shapeB,
/// dtype=A.dtype)` + `absmax_dq` fp32 (memory-anatomy §1.3). LLM.int8's backward makes
/// `CB.to(ctx.dtype_A)` (§1.4). GPTQ kernels dequantize to fp16 for large batches.
#[must_use]
pub fn dequant_transient(model: &ModelSpec, job: &Job, r: &Regime) -> u64 {
    if job.quantization == Quantization::None || job.method == Method::Full {
        return 0;
    }
    let mut n = model.largest_linear_numel();
    if r.quantize_lm_head {
        n = n.max(model.vocab_size * model.hidden_size);
    }
    let absmax = if job.quantization.double_quant() {
        4 * n.div_ceil(NF4_BLOCK)
    } else {
        0
    };
    n * r.dequant_bytes + absmax
}
