//! A job's values checked against each other and the model, before anything is estimated.

use super::*;
use crate::stack::CompileScope;

impl Job {
    /// The generated tokens of an inference job: at least one, and a prompt of at least
    /// one token before them.
    fn validate_generation(&self, model: &ModelSpec) -> Result<(), JobError> {
        let Some(n) = self.new_tokens else {
            return Ok(());
        };
        let err = |message: String| {
            Err(JobError {
                field: "training.max_new_tokens",
                message,
            })
        };
        if self.method != Method::Inference {
            return err(format!(
                "applies to inference; a {} job trains on whole sequences: drop it",
                self.method.as_str()
            ));
        }
        if model.seq2seq.is_some() {
            return err(format!(
                "`{}` is an encoder-decoder: its generated tokens are training.target_len",
                model.model_type
            ));
        }
        if n == 0 || n >= self.seq_len {
            return err(format!(
                "must be between 1 and max_seq_length − 1 = {} (the prompt takes the rest of \
                 max_seq_length), got {n}",
                self.seq_len.saturating_sub(1)
            ));
        }
        Ok(())
    }

    /// An encoder-decoder model's settings, and what moro models of it: transformers' own
    /// loop (`Seq2SeqTrainer`, `generate`; the HF stack) with SDPA, LoRA adapters (not
    /// DoRA) or a full fine-tune, bf16 or fp32 weights, whole layers on each GPU
    /// ([`crate::estimate::activations::seq2seq`]).
    fn validate_seq2seq(&self, model: &ModelSpec) -> Result<(), JobError> {
        let err = |field, message: String| Err(JobError { field, message });
        let Some(_) = &model.seq2seq else {
            if self.target_len.is_some() {
                return err(
                    "training.target_len",
                    format!(
                        "applies to encoder-decoder models (t5, mt5); `{}` reads one sequence: \
                         drop it and size max_seq_length",
                        model.model_type
                    ),
                );
            }
            return Ok(());
        };
        if let Some(t) = self.target_len
            && (t == 0 || t > MAX_SEQ_LEN)
        {
            return err(
                "training.target_len",
                format!("must be between 1 and {MAX_SEQ_LEN} tokens, got {t}"),
            );
        }
        let t5 = &model.model_type;
        let bart = model
            .seq2seq
            .as_ref()
            .is_some_and(|s| s.family == crate::model::Seq2SeqFamily::Bart);
        if self.stack != Stack::Hf {
            return err(
                "stack",
                format!(
                    "`{t5}` is an encoder-decoder, which moro models in transformers' own loop \
                     (Seq2SeqTrainer); the {} stack does not train it: use stack hf",
                    self.stack.as_str()
                ),
            );
        }
        if self.method.is_peft() && self.adapter.method != PeftKind::Lora {
            return err(
                "peft",
                format!(
                    "moro models LoRA on `{t5}`; {} was not traced there",
                    self.adapter.method.as_str()
                ),
            );
        }
        if self.method.is_peft() && self.adapter.dora {
            return err(
                "dora",
                format!("DoRA on `{t5}` was not traced; moro models plain LoRA there"),
            );
        }
        if self.attention != Attention::Sdpa {
            return err(
                "attention",
                if bart {
                    format!("moro models `{t5}` with transformers' default attention, sdpa")
                } else {
                    format!(
                        "`{t5}` adds a learned position bias to its scores, which \
                         FlashAttention cannot take; moro models transformers' default, sdpa"
                    )
                },
            );
        }
        if self.quantization != Quantization::None {
            return err(
                "quantization",
                if bart {
                    format!("QLoRA of `{t5}` was not traced: use lora or full")
                } else {
                    format!(
                        "bitsandbytes leaves `{t5}`'s `wo` unquantized \
                         (`_keep_in_fp32_modules` joins `modules_to_not_convert`), which moro \
                         does not model yet: use lora or full"
                    )
                },
            );
        }
        if self.precision == Precision::Fp16Mixed && self.method.is_peft() && !bart {
            return err(
                "precision",
                format!(
                    "`{t5}` keeps its `wo` weights in fp32 when its base loads in fp16 \
                     (`_keep_in_fp32_modules`), which moro does not model yet: use bf16, \
                     bf16-mixed or fp32"
                ),
            );
        }
        if self.parallel.tensor_parallel > 1 || self.parallel.pipeline > 1 {
            return err(
                "parallel",
                format!(
                    "tensor and pipeline parallelism of `{t5}` are not modelled; shard it with \
                     ZeRO or FSDP instead"
                ),
            );
        }
        Ok(())
    }

    /// The images and vision settings against the model: images need a vision tower, and
    /// what trains in it must be something the method trains.
    fn validate_images(&self, model: &ModelSpec) -> Result<(), JobError> {
        use crate::vision::{MAX_IMAGE_SIDE, MAX_IMAGES_PER_SAMPLE};
        let err = |field, message: String| Err(JobError { field, message });
        let i = &self.images;
        let Some(v) = &model.vision else {
            if i.pan_and_scan {
                return err(
                    "training.pan_and_scan",
                    format!("{} is a text model: it takes no images", model.model_type),
                );
            }
            if i.per_sample > 0 {
                return err(
                    "training.images_per_sample",
                    format!(
                        "{} is a text model (no vision tower): it takes no images",
                        model.model_type
                    ),
                );
            }
            if self.vision != VisionTraining::Frozen {
                return err(
                    "training.vision",
                    format!("{} has no vision tower to train", model.model_type),
                );
            }
            return Ok(());
        };
        if i.pan_and_scan && v.pan_and_scan.is_none() {
            return err(
                "training.pan_and_scan",
                format!(
                    "{}'s processor has no pan-and-scan (Gemma 3's has): drop it",
                    model.model_type
                ),
            );
        }
        if i.per_sample > MAX_IMAGES_PER_SAMPLE {
            return err(
                "training.images_per_sample",
                format!(
                    "must be at most {MAX_IMAGES_PER_SAMPLE}, got {}",
                    i.per_sample
                ),
            );
        }
        if i.per_sample > 0 {
            for (what, side) in [("width", i.width), ("height", i.height)] {
                if side == 0 || side > MAX_IMAGE_SIDE {
                    return err(
                        "training.image_size",
                        format!(
                            "the {what} must be between 1 and {MAX_IMAGE_SIDE} pixels, got {side}"
                        ),
                    );
                }
            }
            // Qwen-VL's `smart_resize` refuses aspect ratios over 200.
            if matches!(v.tokens, crate::vision::ImageTokens::Dynamic { .. })
                && i.width.max(i.height) > 200 * i.width.min(i.height)
            {
                return err(
                    "training.image_size",
                    format!(
                        "{} × {} has an aspect ratio over 200, which the processor refuses",
                        i.width, i.height
                    ),
                );
            }
        }
        if v.cross_states_per_image() > 0 && !matches!(self.stack, Stack::Hf | Stack::Trl) {
            return err(
                "stack",
                format!(
                    "`{}` is modelled as transformers runs it (its cross-attention layers and a \
                     tower that does not checkpoint); the {} stack was not traced there: use \
                     stack hf or trl",
                    model.model_type,
                    self.stack.as_str()
                ),
            );
        }
        let added = v.added_tokens(i);
        if model.max_position_embeddings > 0
            && self.method != Method::Inference
            && self.seq_len + added > model.max_position_embeddings.max(self.seq_len)
        {
            return err(
                "training.image_size",
                format!(
                    "{} image tokens and {} text tokens are more than the model's {} positions",
                    added, self.seq_len, model.max_position_embeddings
                ),
            );
        }
        match (self.vision, self.method) {
            (VisionTraining::Adapted, m) if !m.is_peft() => err(
                "training.vision",
                format!(
                    "`adapted` puts adapters in the tower, which a {} job does not train; \
                     use `trained` for a full fine-tune",
                    m.as_str()
                ),
            ),
            (VisionTraining::Trained, m) if m != Method::Full => err(
                "training.vision",
                format!(
                    "`trained` trains the tower's weights, which a {} job keeps frozen; \
                     use `adapted` for adapters in the tower",
                    m.as_str()
                ),
            ),
            (VisionTraining::Adapted, _) if self.adapter.method != PeftKind::Lora => err(
                "training.vision",
                "`adapted` is modelled for LoRA adapters only".to_owned(),
            ),
            _ => Ok(()),
        }
    }

    /// Checks the job's values against each other and the model.
    ///
    /// # Errors
    /// The first invalid field.
    pub fn validate(&self, model: &ModelSpec) -> Result<(), JobError> {
        let err = |field, message: String| Err(JobError { field, message });
        if self.micro_batch_size == 0 || self.micro_batch_size > MAX_BATCH {
            return err(
                "micro_batch_size",
                format!(
                    "must be between 1 and {MAX_BATCH}, got {}",
                    self.micro_batch_size
                ),
            );
        }
        if self.seq_len == 0 || self.seq_len > MAX_SEQ_LEN {
            return err(
                "max_seq_length",
                format!(
                    "must be between 1 and {MAX_SEQ_LEN} tokens, got {}",
                    self.seq_len
                ),
            );
        }
        if model.position_embeddings > 0 && self.seq_len > model.position_embeddings {
            return err(
                "max_seq_length",
                format!(
                    "{} has {} learned positions (`n_positions`): a longer sequence indexes past \
                     its position embedding; use at most {}",
                    model.model_type, model.position_embeddings, model.position_embeddings
                ),
            );
        }
        self.validate_gemma3n(model)?;
        self.validate_images(model)?;
        self.validate_seq2seq(model)?;
        self.validate_generation(model)?;
        self.validate_recurrent(model)?;
        self.validate_unsloth(model)?;
        self.validate_mlx(model)?;
        if self.grad_accum == 0 || self.grad_accum > 1 << 20 {
            return err(
                "gradient_accumulation_steps",
                format!("must be between 1 and {}, got {}", 1 << 20, self.grad_accum),
            );
        }
        let p = &self.parallel;
        for (name, v) in [
            ("parallel.data_parallel", p.data_parallel),
            ("parallel.tensor_parallel", p.tensor_parallel),
            ("parallel.pipeline", p.pipeline),
            ("parallel.nodes", p.nodes),
        ] {
            if v == 0 || v > 1 << 16 {
                return err(name, format!("must be between 1 and 65536, got {v}"));
            }
        }
        if let Some(b) = p.reduce_bucket
            && (b == 0 || b > 1 << 34)
        {
            return err(
                "parallel.reduce_bucket",
                format!("must be between 1 and {} elements, got {b}", 1u64 << 34),
            );
        }
        if !p.gpus().is_multiple_of(p.nodes) {
            return err(
                "parallel.nodes",
                format!(
                    "{} GPUs cannot be spread evenly over {} nodes",
                    p.gpus(),
                    p.nodes
                ),
            );
        }
        if (self.adapter.method.is_adapter() || self.adapter.method.is_other_peft())
            && !self.method.is_peft()
        {
            return err(
                "peft",
                format!(
                    "`{}` trains on a frozen base: use method lora (or qlora with a quantized \
                     base), not {}",
                    self.adapter.method.as_str(),
                    self.method.as_str()
                ),
            );
        }
        if self.method.is_peft()
            && self.adapter.dora
            && self.stack.profile().peft_methods == crate::stack::PeftMethods::Peft
            && let Some(why) = self
                .versions
                .peft_refuses_dora(self.quantization != Quantization::None)
        {
            return err(
                "dora",
                format!("{why}: set training.versions.peft to a later release, or drop dora"),
            );
        }
        let peft_methods = self.stack.profile().peft_methods;
        if self.method.is_peft()
            && !self.adapter.method.is_adapter()
            && !peft_methods.trains(self.adapter.method, self.adapter.dora)
        {
            let what = if self.adapter.dora && self.adapter.method == PeftKind::Lora {
                "dora"
            } else {
                self.adapter.method.as_str()
            };
            let own = if self.stack.profile().trains_llama_adapter {
                " and its own `adapter` and `adapter-v2`"
            } else {
                ""
            };
            return err(
                if what == "dora" { "dora" } else { "peft" },
                format!(
                    "the {} stack trains {}{own}, not `{what}`: use stack hf or trl (PEFT)",
                    self.stack.as_str(),
                    peft_methods.in_words()
                ),
            );
        }
        if self.adapter.method.is_adapter() && !self.stack.profile().trains_llama_adapter {
            return err(
                "peft",
                format!(
                    "`{}` is lit-gpt's LLaMA-Adapter (lit_gpt/adapter.py); it is modelled for \
                     the litgpt stack only",
                    self.adapter.method.as_str()
                ),
            );
        }
        if self.adapter.method.is_other_peft() {
            if self.method == Method::QuantizedAdapters && self.adapter.method.builds_delta_weight()
            {
                return err(
                    "peft",
                    format!(
                        "PEFT's {} builds ΔW in the shape of the base weight, which a 4-bit \
                         weight packs, and its forward fails (PEFT 0.21.2, bitsandbytes \
                         `Linear4bit`); train it on an unquantized base (method lora), or use \
                         LoRA, OFT, VeRA, IA³ or AdaLoRA with qlora",
                        self.adapter.method.as_str()
                    ),
                );
            }
            if self.parallel.sharding != Sharding::None || self.parallel.tensor_parallel > 1 {
                return err(
                    "peft",
                    format!(
                        "`{}` is modelled on one GPU or data parallel; use LoRA with sharding or \
                         tensor parallelism",
                        self.adapter.method.as_str()
                    ),
                );
            }
            if self.adapter.method == PeftKind::LoKr && self.adapter.decompose_factor == Some(0) {
                return err(
                    "decompose_factor",
                    "must be at least 1 (leave it out for PEFT's -1, factors near the square \
                     root)"
                        .to_owned(),
                );
            }
            if self.adapter.dropout > 0.0 && !self.adapter.method.drops_out_input() {
                return err(
                    "lora_dropout",
                    format!(
                        "`{}` has no input dropout (PEFT's LoHa and LoKr drop ranks and \
                         modules with `rank_dropout` and `module_dropout`); leave \
                         lora_dropout out or set it to 0",
                        self.adapter.method.as_str()
                    ),
                );
            }
            if self.adapter.method.refuses_checkpointing() && self.gradient_checkpointing {
                return err(
                    "gradient_checkpointing",
                    format!(
                        "PEFT refuses {} with gradient checkpointing (0.21.2 \
                         `PeftModel._setup_prompt_encoder`: its keys and values travel in a \
                         cache that checkpointing cannot recompute); turn \
                         gradient_checkpointing off",
                        self.adapter.method.as_str()
                    ),
                );
            }
            if self.adapter.method.uses_virtual_tokens()
                && !(1..=1 << 20).contains(&self.adapter.virtual_tokens)
            {
                return err(
                    "virtual_tokens",
                    format!(
                        "must be between 1 and {}, got {}",
                        1 << 20,
                        self.adapter.virtual_tokens
                    ),
                );
            }
        }
        if self.method.is_peft() && self.adapter.method.uses_targets() {
            let r = self.adapter.rank;
            if r == 0 && self.adapter.method != PeftKind::Ia3 {
                return err("lora_rank", "must be at least 1".to_owned());
            }
            // VeRA's shared random projections commonly exceed the hidden size (r = 256 to
            // 1,024); IA³ has no rank.
            if r > model.hidden_size
                && matches!(
                    self.adapter.method,
                    PeftKind::Lora | PeftKind::AdaLora | PeftKind::LoHa | PeftKind::LoKr
                )
            {
                return err(
                    "lora_rank",
                    format!(
                        "{r} is above the model's hidden size {}; a rank that large is a full \
                         fine-tune with extra steps",
                        model.hidden_size
                    ),
                );
            }
            if self.adapter.method == PeftKind::Boft {
                self.check_boft(model)?;
            }
            if self.adapter.method == PeftKind::Oft
                && let Some((_, l)) = model
                    .linears()
                    .find(|(_, l)| self.adapts(l) && !l.in_features.is_multiple_of(r.max(1)))
            {
                return err(
                    "lora_rank",
                    format!(
                        "OFT's r ({r}) must divide the input width of every target; `{}` has {}",
                        l.name, l.in_features
                    ),
                );
            }
            if self.adapter.dropout > 0.0
                && let Some((_, l)) = model
                    .linears()
                    .find(|(_, l)| self.adapts(l) && self.adapts_stacked(l))
            {
                return err(
                    "lora_dropout",
                    format!(
                        "{} with `{}` among the targets: PEFT puts LoRA on {}'s stacked experts \
                         with a ParamWrapper, which refuses lora_dropout != 0 (PEFT 0.21 \
                         `ParamWrapper.update_layer`); set lora_dropout to 0 or target the \
                         attention only",
                        self.adapter.dropout, l.name, model.model_type
                    ),
                );
            }
            // `gate_up_proj` holds both: PEFT refuses to adapt one half (`_convert_peft_config_moe`).
            let mut halves: Vec<(&str, bool)> = model
                .linears()
                .filter(|(_, l)| {
                    self.adapts_stacked(l)
                        && l.role == crate::model::LinearRole::Expert
                        && l.out_features != model.hidden_size
                })
                .map(|(_, l)| (l.name.as_str(), self.adapts(l)))
                .collect();
            halves.dedup();
            if halves.iter().any(|h| h.1) && halves.iter().any(|h| !h.1) {
                let name = |on: bool| {
                    halves
                        .iter()
                        .filter(|h| h.1 == on)
                        .map(|h| h.0)
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                return err(
                    "target_modules",
                    format!(
                        "`{}` without `{}`: {} stacks them into one gate_up_proj, and PEFT \
                         adapts both or neither",
                        name(true),
                        name(false),
                        model.model_type
                    ),
                );
            }
            if !(0.0..1.0).contains(&self.adapter.dropout) {
                return err(
                    "lora_dropout",
                    format!("must be in [0, 1), got {}", self.adapter.dropout),
                );
            }
            if !self.adapter.alpha.is_finite() || self.adapter.alpha <= 0.0 {
                return err(
                    "lora_alpha",
                    format!("must be positive, got {}", self.adapter.alpha),
                );
            }
            // Targets name the modules of the model as this stack builds it (a fused name
            // names its parts there).
            let built = crate::stack::as_built(model, self.stack.profile());
            let model = built.as_ref();
            let bound = crate::targets::resolve(model, &self.adapter.targets);
            if let Targets::Names(names) = &bound {
                let mut known: Vec<&str> = model
                    .linears()
                    .filter(|(_, l)| self.is_module(l))
                    .map(|(_, l)| l.name.as_str())
                    .collect();
                // Each name once, in the model's order (T5's attention names repeat).
                let mut seen = std::collections::HashSet::new();
                known.retain(|n| seen.insert(*n));
                if names.is_empty() {
                    let why = if model.linears().any(|(_, l)| !self.is_module(l)) {
                        format!(
                            "names no nn.Linear module of this model ({}: its experts and \
                             router are fused parameters, which PEFT's target_modules do not \
                             reach); it has: {}",
                            model.model_type,
                            known.join(", ")
                        )
                    } else {
                        "is empty".to_owned()
                    };
                    return err("target_modules", why);
                }
                for n in names {
                    if !model.linears().any(|(_, l)| &l.name == n) {
                        return err(
                            "target_modules",
                            format!(
                                "`{n}` is not a Linear of this model ({}); it has: {}",
                                model.model_type,
                                known.join(", ")
                            ),
                        );
                    }
                }
            }
        }
        if self.method == Method::QuantizedAdapters
            && !matches!(self.quantization, q if q.is_bnb4() || q == Quantization::Int8 || q == Quantization::Gptq4 || q.mlx().is_some())
        {
            return err(
                "quantization",
                "QLoRA needs a quantized base (nf4, nf4-dq, fp4, fp4-dq, int8; mlx-4bit on \
                 the mlx stack)"
                    .to_owned(),
            );
        }
        if model.encoder.is_some() && self.method == Method::Inference {
            return err(
                "method",
                format!(
                    "`{}` is an encoder (no generation, no KV cache); moro models its \
                     fine-tuning only",
                    model.model_type
                ),
            );
        }
        if self.quantization == Quantization::Mxfp4 {
            if !model.mxfp4_experts {
                return err(
                    "quantization",
                    format!(
                        "mxfp4 is gpt-oss's own expert format; {} has no MXFP4 experts",
                        model.model_type
                    ),
                );
            }
            if self.method != Method::Inference {
                return err(
                    "quantization",
                    "mxfp4 experts have no backward pass in transformers 5.24; a fine-tune \
                     loads them dequantized (`Mxfp4Config(dequantize=True)`): use `none`"
                        .to_owned(),
                );
            }
        }
        if self.method == Method::Full && self.quantization != Quantization::None {
            return err(
                "quantization",
                "a full fine-tune cannot train quantized weights; use lora/qlora or none"
                    .to_owned(),
            );
        }
        if self.optimizer_in_backward && self.grad_accum > 1 {
            return err(
                "optimizer_in_backward",
                format!(
                    "steps each parameter as soon as its gradient exists, so gradients cannot \
                     accumulate; set gradient_accumulation_steps to 1 (got {})",
                    self.grad_accum
                ),
            );
        }
        self.validate_kernels(model)
    }

    /// `torch.compile` against what was traced (docs/torch-compile.md): transformers' dense
    /// decoder layers of the traced families, full fine-tuning or plain LoRA, SDPA or
    /// FlashAttention (Gemma 2's soft-capped eager attention), transformers' own loss, one
    /// GPU or plain data parallel.
    fn validate_compile(&self, model: &ModelSpec) -> Result<(), JobError> {
        let scope = self.stack.profile().compile;
        if scope == CompileScope::Layers {
            return self.validate_layer_compile(model);
        }
        let refuse = |field, what: String| {
            Err(JobError {
                field,
                message: format!(
                    "torch.compile is modelled from traces of transformers' dense decoder \
                     layers; {what}"
                ),
            })
        };
        if scope == CompileScope::Untraced {
            return refuse(
                "compile",
                format!(
                    "the {} stack compiles its own modules, which were not traced: drop it",
                    self.stack.as_str()
                ),
            );
        }
        // The layer structures traced (validation/oracle-traces/compile.jsonl): pre-norm
        // RMSNorm decoders with a gated MLP (Llama, Mistral, Qwen2, Qwen3 with q/k norms,
        // Phi-3 with fused projections) and Gemma 2's four norms.
        const TRACED: [&str; 6] = ["llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2"];
        let dense = model.moe.is_none() && model.mla.is_none() && !model.attention_sinks;
        if !TRACED.contains(&model.model_type.as_str())
            || model.encoder.is_some()
            || model.vision.is_some()
            || !dense
        {
            return refuse(
                "compile",
                format!(
                    "`{}` layers were not traced under compile (traced: {}): drop it",
                    model.model_type,
                    TRACED.join(", ")
                ),
            );
        }
        if self.attention == Attention::Eager && !model.logit_softcapping {
            return refuse(
                "attention",
                "eager attention was traced only for Gemma 2's soft-capped scores: use sdpa"
                    .to_owned(),
            );
        }
        if self.quantization != Quantization::None {
            return refuse(
                "quantization",
                "bitsandbytes' 4-bit and 8-bit matmuls under compile were not traced: \
                 drop compile, or train LoRA on unquantized weights"
                    .to_owned(),
            );
        }
        if self.method.is_peft() && (self.adapter.method != PeftKind::Lora || self.adapter.dora) {
            let field = if self.adapter.dora { "dora" } else { "peft" };
            return refuse(
                field,
                "only plain LoRA adapters were traced under compile: drop compile".to_owned(),
            );
        }
        if self.liger.any() {
            return refuse(
                "liger",
                "Liger's Triton kernels are opaque to the partitioner and were not traced \
                 with it: choose one of liger and compile"
                    .to_owned(),
            );
        }
        if self.loss_impl() != LossImpl::Standard {
            return refuse(
                "loss",
                format!(
                    "the `{}` loss was not traced under compile; transformers' own loss \
                     (`loss: standard`, transformers ≥ 4.49) was",
                    self.loss_impl().as_str()
                ),
            );
        }
        let p = &self.parallel;
        if p.sharding != Sharding::None || p.tensor_parallel > 1 || p.pipeline > 1 {
            return refuse(
                "compile",
                "sharded, tensor- and pipeline-parallel steps were traced without it: drop it"
                    .to_owned(),
            );
        }
        Ok(())
    }

    /// torchtune's per-layer compile against what was traced
    /// (`validation/oracle-traces/compile-torchtune.jsonl`): its Llama decoder layers
    /// (`TransformerSelfAttentionLayer` as the llama2, llama3, 3.1 and 3.2 builders make
    /// them), full or LoRA, its standard and chunked losses, one GPU.
    fn validate_layer_compile(&self, model: &ModelSpec) -> Result<(), JobError> {
        let refuse = |field, what: &str| {
            Err(JobError {
                field,
                message: format!(
                    "torch.compile is modelled for torchtune from traces of its Llama \
                     decoder layers; {what}"
                ),
            })
        };
        let dense = model.moe.is_none() && model.mla.is_none() && model.vision.is_none();
        if model.model_type != "llama" || !dense {
            return refuse(
                "compile",
                &format!("`{}` layers were not traced: drop it", model.model_type),
            );
        }
        if self.method.is_peft() && (self.adapter.method != PeftKind::Lora || self.adapter.dora) {
            let field = if self.adapter.dora { "dora" } else { "peft" };
            return refuse(field, "only plain LoRA adapters were traced: drop compile");
        }
        if !matches!(self.loss_impl(), LossImpl::Standard | LossImpl::Chunked) {
            return refuse(
                "loss",
                "its `standard` and `chunked` losses were traced: choose one of them",
            );
        }
        let p = &self.parallel;
        if p.sharding != Sharding::None || p.tensor_parallel > 1 || p.pipeline > 1 {
            return refuse("compile", "sharded steps were traced without it: drop it");
        }
        Ok(())
    }

    /// The Unsloth stack against what was read of it (docs/unsloth-memory.md): its
    /// hand-written decoder path (`FastLlamaModel` and the Mistral, Qwen2, Qwen3 and Gemma
    /// subclasses), LoRA or QLoRA on one GPU or data parallel, its fused cross-entropy.
    fn validate_unsloth(&self, model: &ModelSpec) -> Result<(), JobError> {
        if self.stack != Stack::Unsloth {
            return Ok(());
        }
        let refuse = |field, what: &str| {
            Err(JobError {
                field,
                message: format!("{what} (read from unsloth 2026.8): use stack trl"),
            })
        };
        const READ: [&str; 5] = ["llama", "mistral", "qwen2", "qwen3", "gemma"];
        let dense = model.moe.is_none() && model.vision.is_none() && model.encoder.is_none();
        if !READ.contains(&model.model_type.as_str()) || !dense {
            return refuse(
                "stack",
                &format!(
                    "what Unsloth's kernels save in `{}` layers was not read (read: {})",
                    model.model_type,
                    READ.join(", ")
                ),
            );
        }
        match self.method {
            Method::Adapters | Method::QuantizedAdapters => {}
            Method::Full => {
                return refuse(
                    "method",
                    "Unsloth's full fine-tuning runs its compiled FastModel path, whose saved \
                     tensors were not read",
                );
            }
            Method::Inference => {
                return refuse("method", "Unsloth's inference path was not read");
            }
        }
        if self.method.is_peft() && self.adapter.method != PeftKind::Lora {
            return refuse("peft", "Unsloth trains LoRA adapters only");
        }
        if !matches!(self.quantization, Quantization::None | Quantization::Nf4Dq) {
            return refuse(
                "quantization",
                "Unsloth's `load_in_4bit` is NF4 with double quantization; 8-bit and GPTQ \
                 bases go through its FastModel path",
            );
        }
        if self.attention == Attention::Eager {
            return refuse(
                "attention",
                "Unsloth chooses FlashAttention or SDPA itself; eager attention is not one of them",
            );
        }
        if !matches!(self.loss_impl(), LossImpl::Fused | LossImpl::Standard) {
            return refuse(
                "loss",
                "Unsloth computes its fused cross-entropy (`loss: fused`), or with \
                 `UNSLOTH_RETURN_LOGITS=1` the full logits (`loss: standard`)",
            );
        }
        if self.liger.any() {
            return refuse(
                "liger",
                "Unsloth patches the same modules with its own kernels",
            );
        }
        let p = &self.parallel;
        if p.sharding != Sharding::None || p.tensor_parallel > 1 || p.pipeline > 1 {
            return refuse(
                "strategy",
                "Unsloth trains on one GPU or with plain data parallel",
            );
        }
        Ok(())
    }

    /// What the MLX stack runs (mlx-lm 0.32 `lora.py`, `tuner/`; docs/mlx-memory.md), and MLX's
    /// own settings on other stacks.
    fn validate_mlx(&self, model: &ModelSpec) -> Result<(), JobError> {
        let mlx_quant = self.quantization.mlx().is_some();
        if self.stack != Stack::Mlx {
            if mlx_quant {
                return Err(JobError {
                    field: "quantization",
                    message: format!(
                        "`{}` is MLX's storage, which only MLX loads: use stack mlx, or nf4-dq \
                         on {}",
                        self.quantization.as_str(),
                        self.stack.as_str()
                    ),
                });
            }
            if self.adapted_layers.is_some() {
                return Err(JobError {
                    field: "num_layers",
                    message: format!(
                        "is mlx_lm's `num_layers` (the last N layers train); the {} stack \
                         trains every layer: drop it, or use stack mlx",
                        self.stack.as_str()
                    ),
                });
            }
            return Ok(());
        }
        let refuse = |field, what: String| {
            Err(JobError {
                field,
                message: what,
            })
        };
        let dense = model.moe.is_none()
            && model.vision.is_none()
            && model.encoder.is_none()
            && model.mla.is_none();
        if !dense {
            return refuse(
                "stack",
                format!(
                    "the MLX stack is modelled for dense text decoders; what MLX keeps for {}'s \
                     experts, encoder or vision tower was not traced",
                    model.model_type
                ),
            );
        }
        match self.method {
            Method::Inference => {
                return refuse(
                    "method",
                    "MLX inference (`mlx_lm.generate`) is not modelled: estimate it with stack hf"
                        .to_owned(),
                );
            }
            Method::Adapters | Method::QuantizedAdapters
                if self.adapter.method != PeftKind::Lora =>
            {
                return refuse(
                    "peft",
                    "mlx_lm.lora trains LoRA (and DoRA: `dora: true`) adapters and full \
                     fine-tunes"
                        .to_owned(),
                );
            }
            _ => {}
        }
        if self.quantization != Quantization::None && !mlx_quant {
            return refuse(
                "quantization",
                format!(
                    "`{}` is a bitsandbytes/GPTQ storage, which MLX does not load; MLX quantizes \
                     with `mlx_lm.convert -q`: use mlx-4bit (or mlx-8bit, mlx-4bit-g32, …)",
                    self.quantization.as_str()
                ),
            );
        }
        if self.method == Method::QuantizedAdapters && !mlx_quant {
            return refuse(
                "quantization",
                "QLoRA on MLX trains on an MLX-quantized model: use mlx-4bit (or another \
                 mlx-Nbit)"
                    .to_owned(),
            );
        }
        if self.precision != Precision::Bf16 && self.precision != Precision::Fp32 {
            return refuse(
                "precision",
                format!(
                    "MLX has no autocast: the model computes in the dtype it was saved in; use \
                     bf16 (or fp32), not {}",
                    self.precision.as_str()
                ),
            );
        }
        if !matches!(
            self.optimizer,
            Optimizer::AdamwTorch
                | Optimizer::AdamwTorchFused
                | Optimizer::Sgd
                | Optimizer::SgdMomentum
        ) {
            return refuse(
                "optimizer",
                format!(
                    "`{}` is not one of mlx_lm's optimizers modelled here (adam, adamw, sgd): \
                     bitsandbytes' 8-bit and paged states are CUDA's",
                    self.optimizer.as_str()
                ),
            );
        }
        if self.attention == Attention::Flash {
            return refuse(
                "attention",
                "FlashAttention is CUDA's; MLX trains through its own attention (sdpa)".to_owned(),
            );
        }
        if self.loss.is_some_and(|l| l != LossImpl::Standard) {
            return refuse(
                "loss",
                "mlx_lm.lora computes the full logits' cross-entropy (`loss: standard`)".to_owned(),
            );
        }
        for (field, on, what) in [
            (
                "liger",
                self.liger.any(),
                "Liger's kernels are Triton's (CUDA)",
            ),
            (
                "compile",
                self.compile,
                "torch.compile is PyTorch's; MLX compiles its step itself",
            ),
            (
                "optimizer_in_backward",
                self.optimizer_in_backward,
                "torchtune's",
            ),
        ] {
            if on {
                return refuse(field, format!("is not an MLX setting ({what}): drop it"));
            }
        }
        let p = &self.parallel;
        if p.gpus() > 1 || p.sharding != Sharding::None || p.offload != Offload::None {
            return refuse(
                "strategy",
                "MLX trains on one Mac here: DeepSpeed and FSDP are PyTorch's, and mlx.launch's \
                 data parallel is not modelled"
                    .to_owned(),
            );
        }
        if let Some(n) = self.adapted_layers
            && (n == 0 || n > model.num_layers)
        {
            return refuse(
                "num_layers",
                format!(
                    "must be between 1 and the model's {} layers, or all, got {n} \
                     (mlx_lm.lora raises the same ValueError)",
                    model.num_layers
                ),
            );
        }
        Ok(())
    }

    /// Activation offloading against the stack and checkpointing.
    fn validate_activation_offload(&self) -> Result<(), JobError> {
        if !self.activation_offload {
            return Ok(());
        }
        if self.stack.profile().activation_offload.is_none() {
            return Err(JobError {
                field: "activation_offload",
                message: format!(
                    "is modelled for torchtune's `enable_activation_offloading` and Unsloth's \
                     `\"unsloth\"` checkpointing; the {} stack has none that was read: drop it",
                    self.stack.as_str()
                ),
            });
        }
        if !self.gradient_checkpointing {
            return Err(JobError {
                field: "activation_offload",
                message: "offloads the checkpointed layer inputs and needs gradient \
                          checkpointing: turn gradient_checkpointing on"
                    .to_owned(),
            });
        }
        Ok(())
    }

    /// Liger's kernels and `torch.compile` against the stack, the model and the loss.
    fn validate_kernels(&self, model: &ModelSpec) -> Result<(), JobError> {
        let err = |field, message: String| Err(JobError { field, message });
        if self.method == Method::Inference && (self.liger.any() || self.compile) {
            let field = if self.compile { "compile" } else { "liger" };
            return err(
                field,
                "is a training setting; moro models inference without it: drop it".to_owned(),
            );
        }
        self.validate_activation_offload()?;
        if self.compile {
            self.validate_compile(model)?;
        }
        if !self.liger.any() {
            return Ok(());
        }
        if !self.stack.profile().transformers_modules {
            return err(
                "liger",
                format!(
                    "patches transformers' model code, and the {} stack builds its own modules; \
                     use stack hf or trl (its own chunked loss is `loss: chunked`)",
                    self.stack.as_str()
                ),
            );
        }
        if Liger::patches_untraced(&model.model_type) {
            return err(
                "liger",
                format!(
                    "liger-kernel 0.8.5 patches `{}`, but moro has not traced its kernels \
                     there; estimate without Liger",
                    model.model_type
                ),
            );
        }
        if !Liger::patches(&model.model_type) {
            return err(
                "liger",
                format!(
                    "liger-kernel 0.8.5 has no kernels for model type `{}` \
                     (`use_liger_kernel=True` changes nothing there): drop it",
                    model.model_type
                ),
            );
        }
        if self.liger.fused_linear_cross_entropy && model.model_type == "granite" {
            return err(
                "liger_kernels",
                "Liger's granite patch has no fused linear cross-entropy (it raises \
                 NotImplementedError in 0.8.5); name the others: rms_norm, swiglu, rope"
                    .to_owned(),
            );
        }
        if self.liger.fused_linear_cross_entropy
            && self.loss.is_some_and(|l| l != super::LossImpl::Fused)
        {
            return err(
                "loss",
                "Liger's fused linear cross-entropy is the loss; drop `loss`, or leave \
                 fused_linear_cross_entropy out of `liger_kernels`"
                    .to_owned(),
            );
        }
        Ok(())
    }
}
