//! The architecture description every estimate starts from.
//!
//! A [`ModelSpec`] holds the scalar shape of a decoder-only transformer (hidden size, heads,
//! vocabulary, ...) and, for exact byte accounting, the list of its parameter tensors grouped
//! by layer kind: every `nn.Linear` with its real input/output width (so LoRA adapters, 4-bit
//! storage and dequantization transients are computed per module), and the remaining
//! non-Linear parameters (norms, embeddings, routers' biases).
//!
//! It is built from a HF `config.json` by [`crate::arch`], and can be built by hand in tests.
//! The parameter count ([`ModelSpec::total_params`]) must equal the count transformers
//! instantiates for the same config, to the parameter (tested against
//! `docs/model-params.md` for every catalog model).

use serde::{Deserialize, Serialize};

/// Storage dtype of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// 32-bit float.
    F32,
    /// bfloat16.
    Bf16,
    /// float16.
    F16,
    /// 8-bit float (e4m3 / e5m2).
    F8,
    /// 8-bit integer.
    I8,
}

impl Dtype {
    /// Bytes per element.
    #[must_use]
    pub const fn bytes(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
            Self::F8 | Self::I8 => 1,
        }
    }

    /// Parses a HF `torch_dtype` / `dtype` string (`bfloat16`, `float16`, `float32`, ...).
    #[must_use]
    pub fn from_hf(s: &str) -> Option<Self> {
        match s.trim().trim_start_matches("torch.") {
            "float32" | "fp32" | "float" => Some(Self::F32),
            "bfloat16" | "bf16" => Some(Self::Bf16),
            "float16" | "fp16" | "half" => Some(Self::F16),
            "float8_e4m3fn" | "float8_e5m2" | "fp8" => Some(Self::F8),
            "int8" => Some(Self::I8),
            _ => None,
        }
    }
}

/// What a Linear belongs to; drives which modules LoRA `all-linear` targets, which a
/// quantizer replaces, and which take part in a token's forward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinearRole {
    /// Attention projections (q/k/v/o, fused qkv, MLA's low-rank projections).
    Attention,
    /// Dense MLP projections.
    Mlp,
    /// A routed expert's projection (`count` = number of experts).
    Expert,
    /// A shared expert's projection (always active).
    SharedExpert,
    /// The MoE router / gate (a Linear, quantized by bitsandbytes, not a LoRA target by
    /// PEFT's `all-linear`? It is: PEFT excludes only the output layer).
    Router,
    /// A vision tower's or projector's Linear ([`crate::vision::VisionSpec`]): quantized by
    /// bitsandbytes like the language model's (transformers 5.24 `get_keys_to_not_convert`
    /// skips only tied and output embeddings), adapted only when the job adapts the tower.
    Vision,
}

/// One `nn.Linear` (or HF `Conv1D`) kind inside a layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Linear {
    /// The module name as PEFT sees it (`q_proj`, `query_key_value`, `c_attn`, `w1`, ...).
    pub name: String,
    /// Input features.
    pub in_features: u64,
    /// Output features.
    pub out_features: u64,
    /// Whether it has a bias vector (`out_features` extra parameters per copy).
    pub bias: bool,
    /// How many copies of this Linear one layer holds (experts: `n_routed_experts`).
    pub count: u64,
    /// How many of those copies one token passes through (experts: `num_experts_per_tok`;
    /// otherwise `count`).
    pub active: u64,
    /// Its role.
    pub role: LinearRole,
    /// Whether it is an `nn.Linear` module or part of a stacked parameter.
    #[serde(default, skip_serializing_if = "WeightLayout::is_module_always")]
    pub layout: WeightLayout,
}

/// How transformers holds a Linear's weights.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightLayout {
    /// One `nn.Linear` module per copy.
    #[default]
    Module,
    /// All copies are one stacked `nn.Parameter` (`count × in × out`, and `count × out` for
    /// the bias) that the model multiplies itself (`F.linear`, `grouped_mm`): gpt-oss's
    /// `GptOssExperts` and `GptOssTopKRouter` in every release.
    Stacked,
    /// `nn.Linear` modules per expert in transformers 4 (`MixtralBlockSparseTop2MLP`, the
    /// router `nn.Linear`), stacked from transformers 5.0 (`MixtralExperts.gate_up_proj`,
    /// `MixtralTopKRouter.weight`; the same for Qwen2-MoE, Qwen3-MoE and DeepSeek V2/V3).
    StackedFrom5,
}

impl WeightLayout {
    /// Whether this is [`Self::Module`] (serde's skip test).
    #[must_use]
    pub const fn is_module_always(&self) -> bool {
        matches!(self, Self::Module)
    }
}

impl Linear {
    /// A plain single Linear.
    #[must_use]
    pub fn new(
        name: &str,
        in_features: u64,
        out_features: u64,
        bias: bool,
        role: LinearRole,
    ) -> Self {
        Self {
            name: name.to_owned(),
            in_features,
            out_features,
            bias,
            count: 1,
            active: 1,
            role,
            layout: WeightLayout::Module,
        }
    }

    /// Whether it is an `nn.Linear` module with the library versions `v` (none said: the
    /// current releases): what PEFT's `target_modules` (`all-linear` included) and
    /// bitsandbytes' `replace_with_bnb_linear` can reach. A stacked weight is never adapted
    /// nor quantized.
    #[must_use]
    pub fn is_module(&self, v: &crate::job::Versions) -> bool {
        match self.layout {
            WeightLayout::Module => true,
            WeightLayout::Stacked => false,
            WeightLayout::StackedFrom5 => v.transformers.is_some_and(|t| t < (5, 0)),
        }
    }

    /// Weight elements of one copy (`in · out`).
    #[must_use]
    pub const fn weight_numel(&self) -> u64 {
        self.in_features * self.out_features
    }

    /// All parameters of all copies (weights and biases).
    #[must_use]
    pub const fn params(&self) -> u64 {
        self.count * (self.weight_numel() + if self.bias { self.out_features } else { 0 })
    }
}

/// Attention kind of a layer, for the KV cache and eager attention's s² term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionKind {
    /// Attends to the whole context.
    Full,
    /// Attends to the last `window` tokens.
    Sliding {
        /// The window, in tokens.
        window: u64,
    },
    /// Cross-attention from the text to the images' vision states (Mllama's
    /// `MllamaCrossAttentionDecoderLayer`): its k and v read the vision states, its KV cache
    /// holds them, not the text.
    Cross,
    /// No attention: the layer mixes tokens with a recurrent mixer (a state-space scan,
    /// [`ModelSpec::ssm`], or a gated DeltaNet, [`ModelSpec::gated_delta_net`]), which keeps
    /// a fixed-size state instead of a KV cache.
    Recurrent,
}

impl AttentionKind {
    /// Tokens of a `context`-token sequence this layer's KV cache keeps (0: none).
    #[must_use]
    pub fn cached_tokens(self, context: u64) -> u64 {
        match self {
            Self::Full => context,
            Self::Sliding { window } => context.min(window),
            Self::Recurrent | Self::Cross => 0,
        }
    }
}

/// Gemma 3n's text model (transformers 5.25 `Gemma3nTextModel`, `Gemma3nTextDecoderLayer`):
/// the hidden state travels as `altup` streams (AltUp: each layer predicts all of them,
/// runs on one, corrects all), each layer adds a low-rank LAuReL branch and its own
/// per-layer input (`ple` wide, from a second embedding table and a projection of the
/// token embedding), the last `kv_shared_layers` reuse the keys and values of the last
/// layer of their kind that has its own, and some layers sparsify their MLP's gate
/// (`_gaussian_topk`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gemma3nSpec {
    /// AltUp streams (`altup_num_inputs`).
    pub altup: u64,
    /// LAuReL rank (`laurel_rank`).
    pub laurel_rank: u64,
    /// Per-layer input width (`hidden_size_per_layer_input`).
    pub ple: u64,
    /// Per-layer input vocabulary (`vocab_size_per_layer_input`).
    pub ple_vocab: u64,
    /// Per [`ModelSpec::layers`] group: whether its layers reuse another layer's keys and
    /// values (no k/v projections of their own), and whether they sparsify the MLP's gate.
    pub groups: Vec<Gemma3nGroup>,
}

/// What a Gemma 3n layer group does beyond its Linears.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gemma3nGroup {
    /// Reuses the keys and values of an earlier layer (`kv_sharing_modes == "reuse"`).
    pub kv_shared: bool,
    /// `activation_sparsity_pattern > 0`: `relu(gate - (mean + std · icdf(p)))`.
    pub sparse: bool,
    /// Keeps its keys and values at full length for the layers that reuse them
    /// (`kv_sharing_modes == "store"`), a sliding layer too.
    pub stores_kv: bool,
}

/// A gated DeltaNet linear-attention mixer (transformers 5.25 `Qwen3NextGatedDeltaNet`):
/// `in_proj_qkvz` makes q and k (`key_heads` of `key_head_dim`) and v and the gate z
/// (`value_heads` of `value_head_dim`), `in_proj_ba` one β and one decay per value head; a
/// depthwise causal `conv1d` over q, k and v; the gated delta rule over `chunk`-token
/// chunks; a gated RMSNorm per value head; `out_proj`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatedDeltaNetSpec {
    /// Query and key heads (`linear_num_key_heads`).
    pub key_heads: u64,
    /// Value heads (`linear_num_value_heads`); q and k are repeated to them.
    pub value_heads: u64,
    /// Channels per query and key head (`linear_key_head_dim`).
    pub key_head_dim: u64,
    /// Channels per value head (`linear_value_head_dim`).
    pub value_head_dim: u64,
    /// Causal convolution width (`linear_conv_kernel_dim`).
    pub conv_kernel: u64,
    /// Tokens per chunk of the delta rule (64 in `torch_chunk_gated_delta_rule`).
    pub chunk: u64,
}

impl GatedDeltaNetSpec {
    /// `key_heads · key_head_dim`.
    #[must_use]
    pub const fn key_dim(&self) -> u64 {
        self.key_heads * self.key_head_dim
    }

    /// `value_heads · value_head_dim`.
    #[must_use]
    pub const fn value_dim(&self) -> u64 {
        self.value_heads * self.value_head_dim
    }

    /// Channels the convolution runs over: q, k and v.
    #[must_use]
    pub const fn conv_channels(&self) -> u64 {
        2 * self.key_dim() + self.value_dim()
    }
}

/// A Mamba-2 state-space mixer (transformers 5.25 `GraniteMoeHybridMambaLayer`, the same
/// layer as `Mamba2Mixer`): `in_proj` makes the gate z, the convolved x, B and C, and one
/// time step per head; a depthwise causal `conv1d` over x, B and C; the chunked scan (state
/// space duality) over `chunk`-token chunks; a gated RMSNorm; `out_proj`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SsmSpec {
    /// Scan heads (`mamba_n_heads`).
    pub heads: u64,
    /// Channels per head (`mamba_d_head`); `heads · head_dim` is the inner width.
    pub head_dim: u64,
    /// State size per channel (`mamba_d_state`).
    pub state: u64,
    /// Groups sharing B and C (`mamba_n_groups`).
    pub groups: u64,
    /// Causal convolution width (`mamba_d_conv`).
    pub conv_kernel: u64,
    /// Tokens per scan chunk (`mamba_chunk_size`).
    pub chunk: u64,
}

impl SsmSpec {
    /// The inner width `heads · head_dim` (`mamba_expand · hidden_size`).
    #[must_use]
    pub const fn inner(&self) -> u64 {
        self.heads * self.head_dim
    }

    /// Channels the convolution runs over: x, B and C (`conv_dim`).
    #[must_use]
    pub const fn conv_channels(&self) -> u64 {
        self.inner() + 2 * self.groups * self.state
    }

    /// `in_proj`'s output width: z, x, B, C and the time steps.
    #[must_use]
    pub const fn in_proj_width(&self) -> u64 {
        self.inner() + self.conv_channels() + self.heads
    }
}

/// A group of identical decoder layers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerGroup {
    /// How many layers of this kind (consecutive or not).
    pub count: u64,
    /// The Linears of one such layer.
    pub linears: Vec<Linear>,
    /// Parameters of one such layer that are not in a Linear: norm weights/biases, q/k norms,
    /// MoE correction biases. Kept in the load dtype (never quantized).
    pub other_params: u64,
    /// Attention kind of each layer in the group (`count` entries are implied: one kind for
    /// the whole group).
    pub attention: AttentionKind,
    /// Whether this group's MLP is a mixture of experts.
    pub moe: bool,
}

impl LayerGroup {
    /// Parameters of one layer of this group.
    #[must_use]
    pub fn layer_params(&self) -> u64 {
        self.linears.iter().map(Linear::params).sum::<u64>() + self.other_params
    }
}

/// Normalization kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormKind {
    /// RMSNorm: weight only.
    RmsNorm,
    /// LayerNorm: weight and bias.
    LayerNorm,
}

/// Mixture-of-experts shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoeSpec {
    /// Routed experts per MoE layer.
    pub num_experts: u64,
    /// Routed experts each token passes through.
    pub experts_per_token: u64,
    /// Shared (always-on) experts.
    pub num_shared_experts: u64,
    /// Intermediate size of one routed expert.
    pub expert_intermediate_size: u64,
    /// Intermediate size of the shared expert block (0 when none).
    pub shared_intermediate_size: u64,
    /// Leading layers that are dense instead of MoE.
    pub first_dense_layers: u64,
}

/// DeepSeek multi-head latent attention shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MlaSpec {
    /// Rank of the query compression (`None`: q is a full projection).
    pub q_lora_rank: Option<u64>,
    /// Rank of the joint KV compression (what the KV cache stores).
    pub kv_lora_rank: u64,
    /// Rotary part of each query/key head.
    pub qk_rope_head_dim: u64,
    /// Non-rotary part of each query/key head.
    pub qk_nope_head_dim: u64,
    /// Value head dim.
    pub v_head_dim: u64,
}

/// What an encoder-only model (BERT, RoBERTa) has besides its layers, for the sequence-
/// classification head it is fine-tuned with (`BertForSequenceClassification`,
/// `RobertaForSequenceClassification`): no lm_head and no `T·V` logits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncoderSpec {
    /// Rows of the token-type (segment) embedding, `type_vocab_size` (BERT 2, RoBERTa 1).
    pub type_vocab_size: u64,
    /// Classes of the classification head (`num_labels`, or the length of `id2label`;
    /// `PretrainedConfig` defaults to 2).
    pub num_labels: u64,
    /// `hidden_dropout_prob > 0`: the embeddings, the attention output and the MLP output
    /// each pass through `nn.Dropout`, which saves a 1-byte mask in training.
    pub hidden_dropout: bool,
    /// `attention_probs_dropout_prob > 0`: eager attention drops out the probabilities.
    pub attention_dropout: bool,
    /// BERT's pooler reads `hidden_states[:, 0]` (`BertPooler.forward`), a view of the last
    /// layer's output: when `dense` saves that view (no autocast cast in between), the whole
    /// `(b, s, h)` output stays alive until backward. RoBERTa's head drops out the first
    /// token first (`RobertaClassificationHead.forward`), a new tensor, and has no pooler.
    pub pooler_reads_view: bool,
}

impl EncoderSpec {
    /// Parameters of the sequence-classification head: the pooler (BERT `pooler.dense`,
    /// RoBERTa `classifier.dense`: `h·h + h`) and the classifier (`h·n + n`).
    #[must_use]
    pub const fn head_params(&self, hidden: u64) -> u64 {
        hidden * hidden + hidden + hidden * self.num_labels + self.num_labels
    }

    /// Parameters outside the layers that are neither the word nor the position embedding:
    /// the token-type embedding and the classification head.
    #[must_use]
    pub const fn extra_params(&self, hidden: u64) -> u64 {
        self.type_vocab_size * hidden + self.head_params(hidden)
    }
}

/// The activation between an encoder-decoder model's feed-forward projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeedForward {
    /// `wo(dropout(relu(wi(x))))` (T5 v1.0, `feed_forward_proj: relu`).
    Relu,
    /// `wo(dropout(gelu_new(wi_0(x)) * wi_1(x)))` (T5 v1.1, FLAN-T5, mT5:
    /// `feed_forward_proj: gated-gelu`, transformers' `NewGELUActivation`).
    GatedGeluNew,
    /// `fc2(dropout(gelu(fc1(x))))` with biases (BART: `activation_function: gelu`,
    /// `activation_dropout`).
    Gelu,
}

/// Whose blocks an encoder-decoder has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Seq2SeqFamily {
    /// T5's pre-norm blocks with `T5LayerNorm` and a relative position bias.
    #[default]
    T5,
    /// BART's post-norm blocks with LayerNorm, biases and learned positions (transformers
    /// `BartEncoderLayer`, `BartDecoderLayer`).
    Bart,
}

/// What an encoder-decoder model (T5, mT5) has besides its layer groups: the first
/// [`ModelSpec::layers`] group is the encoder's blocks, the second the decoder's, whose
/// Linears are its self-attention's q, k, v, o, then the cross-attention's (k and v read
/// the encoder's output), then the feed-forward's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seq2SeqSpec {
    /// Encoder blocks.
    pub encoder_layers: u64,
    /// Decoder blocks.
    pub decoder_layers: u64,
    /// Feed-forward activation.
    pub feed_forward: FeedForward,
    /// Feed-forward width (`d_ff`).
    pub d_ff: u64,
    /// `dropout_rate > 0`: every `nn.Dropout` (embeddings, each sub-block's output, the
    /// feed-forward's hidden state, the stacks' outputs) saves a 1-byte mask in training.
    pub dropout: bool,
    /// T5 v1.0 (a config that does not say `tie_word_embeddings: false`) scales the decoder's
    /// output by `d_model ** -0.5` before lm_head (transformers 5.25
    /// `T5Config.scale_decoder_outputs`).
    pub scale_decoder_outputs: bool,
    /// Whose blocks these are.
    #[serde(default)]
    pub family: Seq2SeqFamily,
    /// `activation_dropout > 0` (BART): the feed-forward's hidden state is dropped out.
    #[serde(default)]
    pub activation_dropout: bool,
    /// Every self-attention layer has its own relative position bias, and every
    /// cross-attention layer makes its own zero bias (UMT5), where T5 computes both once.
    #[serde(default)]
    pub per_layer_bias: bool,
}

/// The architecture of a decoder-only language model (or, with [`ModelSpec::encoder`], an
/// encoder-only one, or with [`ModelSpec::seq2seq`] an encoder-decoder one), as moro needs
/// it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// HF `model_type` (`llama`, `qwen2`, ...; `gemma3` configs resolve to their text part).
    pub model_type: String,
    /// Hidden size h.
    pub hidden_size: u64,
    /// Dense MLP intermediate size I (MoE layers use [`MoeSpec`]).
    pub intermediate_size: u64,
    /// Decoder layers L.
    pub num_layers: u64,
    /// Query heads a.
    pub num_heads: u64,
    /// Key/value heads k (GQA/MQA; equals `num_heads` for MHA).
    pub num_kv_heads: u64,
    /// Head dim d (`head_dim` when the config gives it, else h / a).
    pub head_dim: u64,
    /// Vocabulary rows of the embedding V.
    pub vocab_size: u64,
    /// Whether lm_head shares the embedding's weight.
    pub tie_word_embeddings: bool,
    /// Learned absolute position embeddings (GPT-2: `n_positions`), 0 for rotary models.
    pub position_embeddings: u64,
    /// Context length the model was trained for.
    pub max_position_embeddings: u64,
    /// Norm kind.
    pub norm: NormKind,
    /// Gated (3-matrix, SwiGLU/GeGLU) MLP instead of a 2-matrix one.
    pub gated_mlp: bool,
    /// Bias on q/k/v.
    pub qkv_bias: bool,
    /// Bias on the attention output projection.
    pub o_bias: bool,
    /// Bias on MLP projections.
    pub mlp_bias: bool,
    /// Mixture of experts, when the model has one.
    pub moe: Option<MoeSpec>,
    /// Multi-head latent attention, when the model has it.
    pub mla: Option<MlaSpec>,
    /// Layer groups (dense, MoE, sliding / full attention), whose counts sum to `num_layers`.
    pub layers: Vec<LayerGroup>,
    /// Parameters outside the decoder layers that are not the token embedding or lm_head:
    /// the final norm (a vision tower and projector are [`ModelSpec::vision`]).
    pub final_norm_params: u64,
    /// The dtype the checkpoint is stored in (`torch_dtype` / `dtype`), bf16 when absent.
    pub load_dtype: Dtype,
    /// Encoder-only models (BERT, RoBERTa): the parts outside the layers, and the switch to
    /// the encoder's per-layer activation model. `None` for decoders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoder: Option<EncoderSpec>,
    /// `final_logit_softcapping` (Gemma 2): the logits pass through `tanh(x / cap) · cap`,
    /// whose saved output is one more logits-sized tensor ([`crate::estimate`]'s loss).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub logit_softcapping: bool,
    /// `attn_logit_softcapping` (Gemma 2): eager attention caps its scores with
    /// `tanh(x / cap) · cap`, and `tanh` saves its output, one more 16-bit score tensor per
    /// layer ([`crate::estimate::activations`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attn_softcapping: bool,
    /// RoPE builds q and k with `torch.cat` of the rotated and passed-through parts
    /// (transformers 5.25 `phi3` `apply_rotary_pos_emb`), so q is laid out (batch, heads,
    /// tokens, dim), SDPA's output comes back in that layout and `transpose(1, 2)
    /// .contiguous()` copies it for o_proj: a trainable o_proj saves that copy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rope_by_concat: bool,
    /// `q_norm` and `k_norm`: an RMSNorm over each head's `head_dim` on the q and k
    /// projections' outputs before RoPE (transformers 5.24 `Qwen3Attention.forward`, Gemma 3's
    /// `Gemma3Attention.forward`), whose
    /// fp32 inputs and `rsqrt` are saved for backward ([`crate::estimate::activations`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub qk_norm: bool,
    /// Learned attention sinks, one logit per head (gpt-oss: `GptOssAttention.sinks`): eager
    /// attention appends it as one more score column before the softmax and drops it after
    /// (transformers 5.24 `gpt_oss` `eager_attention_forward`). Transformers has no SDPA
    /// path for them (`GptOssPreTrainedModel._supports_sdpa = False`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attention_sinks: bool,
    /// The norm weights multiply in fp32 in a 16-bit model, so `weight * normed` saves the
    /// fp32 `normed` when the weight trains: gpt-oss keeps them fp32
    /// (`_keep_in_fp32_modules`); Gemma's norms compute `normed * (1.0 + weight.float())`
    /// (transformers `GemmaRMSNorm`, `Gemma2RMSNorm`, `Gemma3RMSNorm`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fp32_norms: bool,
    /// The checkpoint stores its experts in MXFP4 (`quantization_config.quant_method:
    /// mxfp4`, gpt-oss), which inference keeps ([`crate::job::Quantization::Mxfp4`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mxfp4_experts: bool,
    /// How a routed expert applies its gate (MoE models whose experts are [`Linear::fused`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expert_gate: Option<ExpertGate>,
    /// Every routed expert runs on every token, scaled by the token's router score (zero
    /// outside its top-k), instead of on the tokens routed to it: transformers 5.25
    /// `Llama4TextMoe.forward` (`hidden_states.repeat(num_experts, 1)` times the sigmoid
    /// scores, then one `bmm` per expert stack), so a MoE layer's activations grow with the
    /// number of experts, not with top-k.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub experts_see_every_token: bool,
    /// Encoder-decoder models (T5, mT5): the two stacks' shape; `None` for every other model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq2seq: Option<Seq2SeqSpec>,
    /// The vision tower and projector of a vision-language model; `None` for text models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision: Option<crate::vision::VisionSpec>,
    /// The bitsandbytes storage of a pre-quantized checkpoint (`quantization_config` with
    /// `quant_method: bitsandbytes`, as Unsloth's `*-bnb-4bit` repositories ship): its
    /// weights load quantized, so a job on it is QLoRA unless it says otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prequantized: Option<crate::job::Quantization>,
    /// The state-space mixer of the layers whose attention is
    /// [`AttentionKind::Recurrent`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssm: Option<SsmSpec>,
    /// The gated DeltaNet mixer of the layers whose attention is
    /// [`AttentionKind::Recurrent`] (Qwen3-Next).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gated_delta_net: Option<GatedDeltaNetSpec>,
    /// Gemma 3n's AltUp, LAuReL, per-layer inputs and KV sharing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemma3n: Option<Gemma3nSpec>,
    /// The attention output is multiplied by `sigmoid` of a gate that `q_proj` makes beside
    /// the queries (Qwen3-Next's `Qwen3NextAttention`: `q_proj` is twice as wide).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attention_output_gate: bool,
}

impl ModelSpec {
    /// Whether some layers mix tokens with a recurrent mixer instead of attention.
    #[must_use]
    pub const fn has_recurrent_mixer(&self) -> bool {
        self.ssm.is_some() || self.gated_delta_net.is_some()
    }
}

/// The gated activation inside a fused expert, as the saved tensors differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpertGate {
    /// gpt-oss's clamped SwiGLU on interleaved gate/up columns (`GptOssExperts._apply_gate`:
    /// `gate.clamp(max=limit)`, `up.clamp(-limit, limit)`, `glu = gate * sigmoid(gate *
    /// alpha)`, `(up + 1) * glu`).
    ClampedSwiglu,
}

impl ModelSpec {
    /// Token-embedding parameters (V · h).
    #[must_use]
    pub const fn embedding_params(&self) -> u64 {
        self.vocab_size * self.hidden_size
    }

    /// lm_head parameters counted separately (0 when tied, and for encoders, which have a
    /// classification head instead).
    #[must_use]
    pub const fn lm_head_params(&self) -> u64 {
        if self.tie_word_embeddings || self.encoder.is_some() {
            0
        } else {
            self.vocab_size * self.hidden_size
        }
    }

    /// Parameters of all decoder layers.
    #[must_use]
    pub fn layer_params(&self) -> u64 {
        self.layers.iter().map(|g| g.count * g.layer_params()).sum()
    }

    /// Parameters of an encoder's token-type embedding and classification head (0 for
    /// decoders).
    #[must_use]
    pub fn encoder_extra_params(&self) -> u64 {
        self.encoder
            .as_ref()
            .map_or(0, |e| e.extra_params(self.hidden_size))
    }

    /// Exact total parameter count (tied lm_head counted once; a vision tower and projector
    /// included).
    #[must_use]
    pub fn total_params(&self) -> u64 {
        self.embedding_params()
            + self.lm_head_params()
            + self.position_embeddings * self.hidden_size
            + self.layer_params()
            + self.final_norm_params
            + self.encoder_extra_params()
            + self.vision_params()
    }

    /// Parameters of the vision tower and projector (0 for text models).
    #[must_use]
    pub fn vision_params(&self) -> u64 {
        self.vision
            .as_ref()
            .map_or(0, crate::vision::VisionSpec::params)
    }

    /// Parameters one token passes through (MoE: router + top-k + shared experts).
    /// Embedding and lm_head are included (the HF convention used by model cards).
    #[must_use]
    pub fn active_params(&self) -> u64 {
        let layers: u64 = self
            .layers
            .iter()
            .map(|g| {
                let lin: u64 = g
                    .linears
                    .iter()
                    .map(|l| {
                        l.active * (l.weight_numel() + if l.bias { l.out_features } else { 0 })
                    })
                    .sum();
                g.count * (lin + g.other_params)
            })
            .sum();
        self.embedding_params()
            + self.lm_head_params()
            + self.position_embeddings * self.hidden_size
            + layers
            + self.final_norm_params
            + self.encoder_extra_params()
            + self.vision_params()
    }

    /// All Linear kinds of all layer groups with the number of layers holding them: the
    /// language model's, then a vision tower's and its projector's ([`LinearRole::Vision`]).
    pub fn linears(&self) -> impl Iterator<Item = (u64, &Linear)> {
        let tower = self.vision.iter().flat_map(|v| {
            v.layers
                .iter()
                .flat_map(|g| g.linears.iter().map(move |l| (g.count, l)))
                .chain(v.projector.iter().map(|l| (1, l)))
        });
        self.layers
            .iter()
            .flat_map(|g| g.linears.iter().map(move |l| (g.count, l)))
            .chain(tower)
    }

    /// Parameters held in decoder-layer Linears (what bitsandbytes quantizes).
    #[must_use]
    pub fn linear_params(&self) -> u64 {
        self.linears().map(|(n, l)| n * l.params()).sum()
    }

    /// Largest single Linear weight, in elements (one expert for MoE).
    #[must_use]
    pub fn largest_linear_numel(&self) -> u64 {
        self.linears()
            .map(|(_, l)| l.weight_numel())
            .max()
            .unwrap_or(0)
    }

    /// Effective q-projection width a·d (MLA: heads × (nope + rope)).
    #[must_use]
    pub fn q_width(&self) -> u64 {
        match &self.mla {
            Some(m) => self.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim),
            None => self.num_heads * self.head_dim,
        }
    }

    /// Width of one of K or V per token (k·d; MLA: heads × head dims after decompression).
    #[must_use]
    pub fn kv_width(&self) -> u64 {
        match &self.mla {
            Some(m) => self.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim),
            None => self.num_kv_heads * self.head_dim,
        }
    }

    /// Elements the KV cache stores per token per layer (K and V together; MLA stores the
    /// compressed latent plus the rotary key).
    #[must_use]
    pub fn kv_cache_elems_per_token_layer(&self) -> u64 {
        match &self.mla {
            Some(m) => m.kv_lora_rank + m.qk_rope_head_dim,
            None => 2 * self.num_kv_heads * self.head_dim,
        }
    }

    /// MLP intermediate width one token goes through in an average layer (dense I, or for MoE
    /// layers top-k · expert I + shared I), used for activation sizes.
    #[must_use]
    pub fn active_intermediate(&self, moe_layer: bool) -> u64 {
        match (&self.moe, moe_layer) {
            (Some(m), true) => {
                m.experts_per_token * m.expert_intermediate_size + m.shared_intermediate_size
            }
            _ => self.intermediate_size,
        }
    }
}
