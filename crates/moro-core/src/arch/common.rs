//! Pieces shared by the per-`model_type` adapters: head resolution, the usual Linear sets,
//! per-layer attention patterns, and the final assembly with overflow-checked counting.

use super::ArchError;
use super::cfg::{self, Cfg, MAX_HEAD_DIM, MAX_HEADS, MAX_POSITIONS, MAX_TOTAL_PARAMS};
use crate::model::{
    AttentionKind, Dtype, LayerGroup, Linear, LinearRole, MlaSpec, ModelSpec, MoeSpec, NormKind,
    WeightLayout,
};

/// Attention head shape.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heads {
    /// Query heads.
    pub nh: u64,
    /// Key/value heads.
    pub kv: u64,
    /// Head dim.
    pub hd: u64,
}

impl Heads {
    /// Query width `nh · hd` (bounded: both ≤ 2^14).
    pub(crate) const fn q(&self) -> u64 {
        self.nh * self.hd
    }

    /// Key (or value) width `kv · hd`.
    pub(crate) const fn kv_width(&self) -> u64 {
        self.kv * self.hd
    }
}

/// Resolves heads the way transformers' configs do: query heads from the first present key of
/// `nh_keys`; KV heads from `kv_key` (absent: `kv_default`, else the query heads, the MHA
/// default of `LlamaConfig` and most others); head dim from `head_dim` when given (null counts
/// as absent), else `hd_default`, else `hidden / heads`, which must divide exactly.
/// KV heads must divide the query heads (transformers' `repeat_kv` requires it).
pub(crate) fn heads(
    c: &Cfg<'_>,
    hidden: u64,
    nh_keys: &[&str],
    kv_key: &str,
    kv_default: Option<u64>,
    hd_default: Option<u64>,
) -> Result<Heads, ArchError> {
    let nh = c.dim_any(nh_keys, MAX_HEADS)?;
    let kv = c.dim_or(kv_key, kv_default.unwrap_or(nh), MAX_HEADS)?;
    if kv > nh || nh % kv != 0 {
        return Err(c.err(
            kv_key,
            format!("({kv}) must divide the number of query heads ({nh})"),
        ));
    }
    let hd = match (c.opt_dim("head_dim", MAX_HEAD_DIM)?, hd_default) {
        (Some(hd), _) | (None, Some(hd)) => hd,
        (None, None) => {
            if !hidden.is_multiple_of(nh) {
                let key = nh_keys.first().copied().unwrap_or("num_attention_heads");
                return Err(c.err(key, format!("({nh}) must divide hidden size ({hidden})")));
            }
            hidden / nh
        }
    };
    Ok(Heads { nh, kv, hd })
}

/// Separate `q_proj`, `k_proj`, `v_proj`, `o_proj` (transformers' Llama-style attention):
/// q `H → nh·hd`, k and v `H → kv·hd`, o `nh·hd → H`.
pub(crate) fn qkvo(h: u64, a: Heads, qkv_bias: bool, o_bias: bool) -> Vec<Linear> {
    vec![
        Linear::new("q_proj", h, a.q(), qkv_bias, LinearRole::Attention),
        Linear::new("k_proj", h, a.kv_width(), qkv_bias, LinearRole::Attention),
        Linear::new("v_proj", h, a.kv_width(), qkv_bias, LinearRole::Attention),
        Linear::new("o_proj", a.q(), h, o_bias, LinearRole::Attention),
    ]
}

/// A gated (SwiGLU/GeGLU) MLP `gate_proj`, `up_proj` (`H → I`) and `down_proj` (`I → H`).
pub(crate) fn gated_mlp(h: u64, i: u64, bias: bool, role: LinearRole) -> Vec<Linear> {
    gated_named(["gate_proj", "up_proj", "down_proj"], h, i, bias, role)
}

/// A gated MLP with custom names `[gate, up, down]` (Mixtral experts: `w1`, `w3`, `w2`).
pub(crate) fn gated_named(
    names: [&str; 3],
    h: u64,
    i: u64,
    bias: bool,
    role: LinearRole,
) -> Vec<Linear> {
    let [gate, up, down] = names;
    vec![
        Linear::new(gate, h, i, bias, role),
        Linear::new(up, h, i, bias, role),
        Linear::new(down, i, h, bias, role),
    ]
}

/// The router of a transformers MoE block: `gate`, `H → experts`, no bias; an `nn.Linear`
/// in transformers 4, a plain weight from 5.0 (`MixtralTopKRouter`, `Qwen3MoeTopKRouter`,
/// `DeepseekV3TopkRouter`: `F.linear(hidden_states, self.weight)`).
pub(crate) fn router(h: u64, experts: u64) -> Linear {
    Linear {
        layout: WeightLayout::StackedFrom5,
        ..Linear::new("gate", h, experts, false, LinearRole::Router)
    }
}

/// Routed experts: each of `names` held `experts` times, `top_k` of them active per token;
/// modules per expert in transformers 4, stacked `gate_up_proj` / `down_proj` from 5.0.
pub(crate) fn routed_experts(
    names: [&str; 3],
    h: u64,
    i: u64,
    experts: u64,
    top_k: u64,
) -> Vec<Linear> {
    gated_named(names, h, i, false, LinearRole::Expert)
        .into_iter()
        .map(|l| Linear {
            count: experts,
            active: top_k,
            layout: WeightLayout::StackedFrom5,
            ..l
        })
        .collect()
}

/// A DeepSeekMoE-style block's Linears: the [`router`], routed experts `gate_proj`/`up_proj`/
/// `down_proj` of `moe_i` ([`routed_experts`]), and, when `shared_i` > 0, one always-active
/// shared gated MLP of `shared_i` (Qwen2-MoE, DeepSeek V2/V3, GLM-4.5).
pub(crate) fn moe_linears(
    h: u64,
    experts: u64,
    top_k: u64,
    moe_i: u64,
    shared_i: u64,
) -> Vec<Linear> {
    let mut linears = vec![router(h, experts)];
    linears.extend(routed_experts(
        ["gate_proj", "up_proj", "down_proj"],
        h,
        moe_i,
        experts,
        top_k,
    ));
    if shared_i > 0 {
        linears.extend(gated_mlp(h, shared_i, false, LinearRole::SharedExpert));
    }
    linears
}

/// Validates MoE routing numbers: `top_k` (named `k_key`) must be in `1..=experts`.
pub(crate) fn check_top_k(
    c: &Cfg<'_>,
    k_key: &str,
    top_k: u64,
    experts: u64,
) -> Result<(), ArchError> {
    if top_k > experts {
        return Err(c.err(
            k_key,
            format!("({top_k}) must not exceed the number of experts ({experts})"),
        ));
    }
    Ok(())
}

/// The checkpoint's context length from the first present key of `keys`, else `default`.
pub(crate) fn max_positions(c: &Cfg<'_>, keys: &[&str], default: u64) -> Result<u64, ArchError> {
    for key in keys {
        if let Some(n) = c.opt_dim(key, MAX_POSITIONS)? {
            return Ok(n);
        }
    }
    Ok(default)
}

/// The sliding window (`sliding_window`): `default` when the key is absent, none when it is
/// `null` (Mistral v0.3 writes `"sliding_window": null` to switch the 4096 default off) or 0.
pub(crate) fn sliding_window(c: &Cfg<'_>, default: Option<u64>) -> Result<Option<u64>, ArchError> {
    if !c.has_key("sliding_window") {
        return Ok(default);
    }
    match c.uint_or("sliding_window", 0, MAX_POSITIONS)? {
        0 => Ok(None),
        w => Ok(Some(w)),
    }
}

/// Per-layer attention kinds from an explicit `layer_types` list (transformers ≥ 4.53 writes
/// it for hybrid models: `full_attention` / `sliding_attention`), when present. Its length must
/// equal the layer count and a sliding entry needs a window.
pub(crate) fn layer_types(
    c: &Cfg<'_>,
    layers: u64,
    window: Option<u64>,
) -> Result<Option<Vec<AttentionKind>>, ArchError> {
    let Some(types) = c.opt_str_list("layer_types")? else {
        return Ok(None);
    };
    if u64::try_from(types.len()).ok() != Some(layers) {
        return Err(c.err(
            "layer_types",
            format!("has {} entries but there are {layers} layers", types.len()),
        ));
    }
    types
        .iter()
        .map(|t| match *t {
            "full_attention" => Ok(AttentionKind::Full),
            "sliding_attention" => window
                .map(|w| AttentionKind::Sliding { window: w })
                .ok_or_else(|| {
                    c.err(
                        "sliding_window",
                        "is missing but layer_types has sliding layers",
                    )
                }),
            other => Err(c.err("layer_types", format!("has an unsupported entry `{other}`"))),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Layers of these attention kinds, none of them MoE (`Plan::kinds`).
pub(crate) fn dense(kinds: Vec<AttentionKind>) -> Vec<(AttentionKind, bool)> {
    kinds.into_iter().map(|a| (a, false)).collect()
}

/// Every layer attends fully, unless `layer_types` says otherwise.
pub(crate) fn all_full(c: &Cfg<'_>, layers: u64) -> Result<Vec<AttentionKind>, ArchError> {
    uniform(c, layers, None)
}

/// Every layer uses `window` when set (Mistral v0.1, Phi-3: the window applies to all layers),
/// unless `layer_types` says otherwise.
pub(crate) fn uniform(
    c: &Cfg<'_>,
    layers: u64,
    window: Option<u64>,
) -> Result<Vec<AttentionKind>, ArchError> {
    if let Some(kinds) = layer_types(c, layers, window)? {
        return Ok(kinds);
    }
    let kind = window.map_or(AttentionKind::Full, |w| AttentionKind::Sliding {
        window: w,
    });
    Ok((0..layers).map(|_| kind).collect())
}

/// Layer `i` slides when `sliding(i)` (and a window is set), otherwise attends fully;
/// `layer_types`, when present, wins.
pub(crate) fn pattern(
    c: &Cfg<'_>,
    layers: u64,
    window: Option<u64>,
    sliding: impl Fn(u64) -> bool,
) -> Result<Vec<AttentionKind>, ArchError> {
    if let Some(kinds) = layer_types(c, layers, window)? {
        return Ok(kinds);
    }
    Ok((0..layers)
        .map(|i| match window {
            Some(w) if sliding(i) => AttentionKind::Sliding { window: w },
            _ => AttentionKind::Full,
        })
        .collect())
}

/// Everything an adapter resolves; [`build`] turns it into a [`ModelSpec`].
pub(crate) struct Plan {
    /// HF `model_type` of the text model.
    pub model_type: String,
    /// Hidden size.
    pub hidden: u64,
    /// Dense MLP width.
    pub intermediate: u64,
    /// Attention heads.
    pub heads: Heads,
    /// Vocabulary rows.
    pub vocab: u64,
    /// lm_head tied to the embedding.
    pub tie: bool,
    /// Learned absolute position rows (0 for rotary/ALiBi models).
    pub position_embeddings: u64,
    /// Trained context length.
    pub max_positions: u64,
    /// Norm kind.
    pub norm: NormKind,
    /// Gated MLP.
    pub gated_mlp: bool,
    /// Bias on q/k/v.
    pub qkv_bias: bool,
    /// Bias on the attention output projection.
    pub o_bias: bool,
    /// Bias on MLP projections.
    pub mlp_bias: bool,
    /// Attention Linears of one layer.
    pub attn: Vec<Linear>,
    /// Non-Linear parameters of one layer in every layer (norms, q/k norms).
    pub layer_other: u64,
    /// Dense MLP Linears.
    pub dense_mlp: Vec<Linear>,
    /// MoE block: shape, Linears of one MoE layer's MLP, and its non-Linear parameters.
    pub moe: Option<(MoeSpec, Vec<Linear>, u64)>,
    /// Per layer: attention kind and whether its MLP is the MoE block.
    pub kinds: Vec<(AttentionKind, bool)>,
    /// MLA shape.
    pub mla: Option<MlaSpec>,
    /// Parameters outside the layers besides embedding/lm_head (final norm, ...).
    pub final_norm: u64,
    /// Checkpoint dtype.
    pub load_dtype: Dtype,
}

/// Groups identical layers (same attention kind and MLP kind) in order of first appearance
/// and assembles the spec, then recounts every parameter with checked arithmetic: a config
/// whose sizes would overflow `u64` or exceed [`MAX_TOTAL_PARAMS`] is an error, so
/// [`ModelSpec::total_params`] cannot overflow on a spec this module returns.
pub(crate) fn build(p: Plan) -> Result<ModelSpec, ArchError> {
    let mut groups: Vec<LayerGroup> = Vec::new();
    for (attention, moe) in &p.kinds {
        if let Some(g) = groups
            .iter_mut()
            .find(|g| g.attention == *attention && g.moe == *moe)
        {
            g.count += 1;
            continue;
        }
        let mut linears = p.attn.clone();
        let mut other = p.layer_other;
        match (&p.moe, *moe) {
            (Some((_, moe_linears, moe_other)), true) => {
                linears.extend(moe_linears.iter().cloned());
                other = cfg::add(other, *moe_other, "num_experts")?;
            }
            _ => linears.extend(p.dense_mlp.iter().cloned()),
        }
        groups.push(LayerGroup {
            count: 1,
            linears,
            other_params: other,
            attention: *attention,
            moe: *moe,
        });
    }
    let num_layers = u64::try_from(p.kinds.len()).unwrap_or(u64::MAX);
    let spec = ModelSpec {
        model_type: p.model_type,
        hidden_size: p.hidden,
        intermediate_size: p.intermediate,
        num_layers,
        num_heads: p.heads.nh,
        num_kv_heads: p.heads.kv,
        head_dim: p.heads.hd,
        vocab_size: p.vocab,
        tie_word_embeddings: p.tie,
        position_embeddings: p.position_embeddings,
        max_position_embeddings: p.max_positions,
        norm: p.norm,
        gated_mlp: p.gated_mlp,
        qkv_bias: p.qkv_bias,
        o_bias: p.o_bias,
        mlp_bias: p.mlp_bias,
        moe: p.moe.map(|(m, _, _)| m),
        mla: p.mla,
        layers: groups,
        final_norm_params: p.final_norm,
        load_dtype: p.load_dtype,
        encoder: None,
        logit_softcapping: false,
        attn_softcapping: false,
        rope_by_concat: false,
        qk_norm: false,
        attention_sinks: false,
        experts_see_every_token: false,
        fp32_norms: false,
        mxfp4_experts: false,
        expert_gate: None,
        seq2seq: None,
        vision: None,
        prequantized: None,
        ssm: None,
        gated_delta_net: None,
        attention_output_gate: false,
        gemma3n: None,
    };
    let total = checked_total(&spec)?;
    if total > MAX_TOTAL_PARAMS {
        return Err(ArchError::Field {
            field: "num_hidden_layers".to_owned(),
            problem: format!("gives {total} parameters, over the 2^50 limit"),
        });
    }
    Ok(spec)
}

/// [`ModelSpec::total_params`] with every operation checked.
fn checked_total(s: &ModelSpec) -> Result<u64, ArchError> {
    const F: &str = "num_hidden_layers";
    let emb = cfg::mul(s.vocab_size, s.hidden_size, "vocab_size")?;
    let mut total = if s.tie_word_embeddings {
        emb
    } else {
        cfg::mul(emb, 2, "vocab_size")?
    };
    total = cfg::add(
        total,
        cfg::mul(s.position_embeddings, s.hidden_size, "n_positions")?,
        F,
    )?;
    total = cfg::add(total, s.final_norm_params, F)?;
    for g in &s.layers {
        let mut layer = g.other_params;
        for l in &g.linears {
            let w = cfg::mul(l.in_features, l.out_features, F)?;
            let w = if l.bias {
                cfg::add(w, l.out_features, F)?
            } else {
                w
            };
            layer = cfg::add(layer, cfg::mul(w, l.count, F)?, F)?;
        }
        total = cfg::add(total, cfg::mul(layer, g.count, F)?, F)?;
    }
    Ok(total)
}

/// Appends an encoder-decoder's decoder stack to `spec` (whose layers are the encoder's):
/// `layers` layers of `linears` and `other` more parameters each, counted with checked
/// arithmetic so that [`ModelSpec::total_params`] cannot overflow; errors name `key`.
pub(crate) fn push_decoder_stack(
    spec: &mut ModelSpec,
    c: &Cfg<'_>,
    linears: Vec<Linear>,
    other: u64,
    layers: u64,
    key: &str,
) -> Result<(), ArchError> {
    let per_layer = linears
        .iter()
        .try_fold(other, |acc, l| cfg::add(acc, l.params(), key))?;
    let total = cfg::add(spec.total_params(), cfg::mul(per_layer, layers, key)?, key)?;
    if total > cfg::MAX_TOTAL_PARAMS {
        return Err(c.err(
            key,
            format!("gives {total} parameters, over the 2^50 limit"),
        ));
    }
    spec.layers.push(LayerGroup {
        count: layers,
        linears,
        other_params: other,
        attention: AttentionKind::Full,
        moe: false,
    });
    spec.num_layers += layers;
    Ok(())
}

/// Each layer's mixer from a hybrid model's `layer_types` (`None` without the key): a
/// name in `recurrent` is a recurrent layer ([`AttentionKind::Recurrent`]), one in `full`
/// a full-attention layer; any other name, or a list of the wrong length, is an error
/// naming the key.
pub(crate) fn hybrid_layer_types(
    c: &Cfg<'_>,
    layers: u64,
    recurrent: &[&str],
    full: &[&str],
) -> Result<Option<Vec<AttentionKind>>, ArchError> {
    let Some(types) = c.opt_str_list("layer_types")? else {
        return Ok(None);
    };
    if u64::try_from(types.len()).ok() != Some(layers) {
        return Err(c.err(
            "layer_types",
            format!(
                "has {} entries for {layers} layers (num_hidden_layers)",
                types.len()
            ),
        ));
    }
    types
        .into_iter()
        .map(|t| {
            if recurrent.contains(&t) {
                Ok(AttentionKind::Recurrent)
            } else if full.contains(&t) {
                Ok(AttentionKind::Full)
            } else {
                Err(c.err(
                    "layer_types",
                    format!(
                        "has \"{t}\"; expected \"{}\" or \"{}\"",
                        recurrent.first().copied().unwrap_or_default(),
                        full.first().copied().unwrap_or_default()
                    ),
                ))
            }
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}
