//! Inference: weights + KV cache + the prefill's transients and logits.

use crate::job::{Attention, Job, KvDtype};
use crate::model::ModelSpec;

use super::parallel::Sharded;
use super::{Component, DeviceProfile, Phase, PhaseBytes, Regime};

/// KV-cache bytes for `batch` sequences of `context` tokens.
///
/// Per layer and token the cache stores K and V, `2·k·d` elements (MLA: the compressed
/// latent plus the rotary key, `kv_lora_rank + qk_rope_head_dim`); sliding-window layers
/// keep at most `window` tokens (transformers `DynamicSlidingWindowLayer`; llama.cpp's SWA
/// cache).
#[must_use]
pub fn kv_cache_bytes(model: &ModelSpec, batch: u64, context: u64, kv: KvDtype, tp: u64) -> u64 {
    let elem = kv.bytes();
    let per_tok = model.kv_cache_elems_per_token_layer() / tp.max(1);
    model
        .layers
        .iter()
        .enumerate()
        .map(|(i, g)| {
            // Gemma 3n: a layer that reuses another's keys and values caches none; the layer
            // it reuses keeps them at full length, a sliding one too (`DynamicCache`'s
            // full-length layer for `kv_sharing_modes == "store"`).
            let sharing = model.gemma3n.as_ref().and_then(|s| s.groups.get(i));
            let tokens = match sharing {
                Some(f) if f.kv_shared => 0,
                Some(f) if f.stores_kv => context,
                _ => g.attention.cached_tokens(context),
            };
            g.count * tokens * per_tok
        })
        .sum::<u64>()
        * batch
        * elem
}

/// The cache of Mllama's cross-attention layers ([`AttentionKind::Cross`]): every layer keeps
/// the keys and values of its images' vision states, made at the prefill
/// (`MllamaTextCrossAttention`: `cache.update` of the projected `cross_attention_states`),
/// whatever the text's length.
fn cross_cache(model: &ModelSpec, job: &Job, tp: u64) -> u64 {
    let Some(v) = &model.vision else { return 0 };
    let states = v.cross_states_per_image() * job.images.per_sample * job.micro_batch_size;
    let layers: u64 = model
        .layers
        .iter()
        .filter(|g| g.attention == crate::model::AttentionKind::Cross)
        .map(|g| g.count)
        .sum();
    layers * states * 2 * model.kv_width() / tp.max(1) * job.kv_dtype.bytes()
}

/// litgpt's KV cache (`build_kv_cache`: `heads = 1 if n_query_groups == 1 else n_head`):
/// grouped-query models cache every query head, not their KV groups; tensor parallelism
/// (`generate/tp.py`) divides `n_head` and `n_query_groups` by the degree first. The
/// boolean causal mask cache (`torch.ones((S, S), dtype=bool).tril()`) comes with it.
#[must_use]
pub fn litgpt_kv_cache_bytes(
    model: &ModelSpec,
    batch: u64,
    context: u64,
    kv: KvDtype,
    tp: u64,
) -> u64 {
    let elem = kv.bytes();
    let tp = tp.max(1);
    let groups = (model.num_kv_heads / tp).max(1);
    let heads = if groups == 1 { 1 } else { model.num_heads / tp };
    model.num_layers * 2 * heads * model.head_dim * context * batch * elem + context * context
}

/// An encoder-decoder's generation (transformers 5.25 `generate` on T5: the encoder once,
/// then one decoder step a token), traced on fake tensors (`calibration/seq2seq_trace.py
/// --generate`, `validation/oracle-traces/seq2seq-generate.jsonl`):
///
/// - the encoder's forward under `no_grad`: its position bias (made once, passed to every
///   block), the residual and the normed input, and the wider of the attention's moment
///   (q, k, v, the output and the block's own contiguous mask, per sample with a padding
///   mask) and the feed-forward's: `wi_0`'s output and three of `NewGELUActivation`'s
///   intermediates (`0.5·x`, `pow`, its scaled copy), or `wi`'s output and the ReLU's;
/// - then the `EncoderDecoderCache`: every decoder block's self-attention keys and values
///   over the generated tokens and its cross-attention's over the source (computed at the
///   first step and kept), the encoder's output, and the step's logits with their fp32 copy.
fn seq2seq_phases(
    model: &ModelSpec,
    s2s: &crate::model::Seq2SeqSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
    weights: u64,
) -> Vec<PhaseBytes> {
    let elem = job.kv_dtype.bytes();
    let cb = r.compute_bytes;
    let b = job.micro_batch_size;
    let (src, new) = (job.seq_len, job.target_tokens());
    let te = b * src;
    let h = model.hidden_size;
    let n = model.q_width();
    let a = model.num_heads;
    let f = s2s.d_ff;
    let padded = job.padding == crate::job::Padding::Padded;
    let per = if padded { b } else { 1 };
    let ff = match s2s.feed_forward {
        crate::model::FeedForward::GatedGeluNew => 4 * f,
        crate::model::FeedForward::Relu | crate::model::FeedForward::Gelu => 2 * f,
    };
    // The bias every block receives, then the wider of the attention's moment (q, k, v,
    // the output and the block's mask copy) and the feed-forward's (the mask is freed).
    let bart = s2s.family == crate::model::Seq2SeqFamily::Bart;
    // BART has no position bias; a padded batch's boolean mask (made once) becomes an
    // additive one per call (traced, `seq2seq-bart-generate.jsonl`).
    let bias = if bart { 0 } else { a * src * src * cb };
    // With a padding mask `torch.where(mask, bias, min)` follows the permuted bias's strides
    // and `.contiguous()` copies it: two per-sample masks at that moment.
    let copies = if padded { 2 } else { 1 };
    let masks = match (bart, padded) {
        (true, true) => b * src * src * (cb + 1),
        (true, false) => 0,
        (false, _) => copies * per * a * src * src * cb,
    };
    let attention = te * cb * 4 * n + masks;
    let encoder = bias + te * cb * 4 * h + (te * cb * ff).max(attention);
    // UMT5 computes its relative position buckets (`_relative_position_bucket`) over every
    // pair of positions in every encoder layer, after the layer's q, k and v: at its widest
    // five int64, one fp32 and one boolean `S × S` tensors, 53 bytes a pair, beside the
    // stream and q, k, v (traced, `seq2seq-umt5-generate.jsonl`: umt5-small's peak at 2,048
    // tokens). T5 computes them once, and its traced peaks are the blocks'.
    let buckets = if s2s.per_layer_bias {
        53 * src * src + te * cb * (2 * h + 3 * n)
    } else {
        0
    };
    let encoder = encoder.max(buckets);
    let kv = s2s.decoder_layers * b * 2 * n * (new + src) * elem;
    let encoder_output = te * h * cb;
    let logits = b * model.vocab_size * (cb + 4);
    let cublas = device.cublas_workspace_bytes;
    vec![
        PhaseBytes {
            phase: Phase::Load,
            components: vec![(Component::Weights, weights)],
        },
        PhaseBytes {
            phase: Phase::Prefill,
            components: vec![
                (Component::Weights, weights),
                (Component::Activations, encoder),
                (Component::Transients, cublas),
            ],
        },
        PhaseBytes {
            phase: Phase::Decode,
            components: vec![
                (Component::Weights, weights),
                (Component::KvCache, kv),
                (Component::Activations, encoder_output),
                (Component::LogitsLoss, logits),
                (Component::Transients, cublas),
            ],
        },
    ]
}

/// The widest moment of a decode step's MoE layer: transformers 5.25's `generate` decodes
/// stacked experts with `batched_mm` on a GPU (`_optimize_model_for_decode` switches from
/// `grouped_mm`; `integrations/moe.py` `batched_mm_experts_forward`), which gathers each
/// routed token's experts' weights, `gate_up_proj[expert_ids]` and then, while that still
/// exists, `down_proj[expert_ids]`: `b · top_k` copies of one expert's weights (traced,
/// `calibration/generate_events.py` on Qwen3-30B-A3B). Experts held as modules (transformers
/// 4, litgpt, torchtune), quantized to MXFP4 (their own kernels) or every token through
/// every expert (Llama 4) gather nothing; nor does MPS, which keeps `grouped_mm`.
fn moe_decode_gather(
    model: &ModelSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
    tp: u64,
) -> u64 {
    let Some(moe) = &model.moe else { return 0 };
    if model.experts_see_every_token
        || device.backend != super::Backend::Cuda
        || job.quantization == crate::job::Quantization::Mxfp4
    {
        return 0;
    }
    // One routed expert's stacked weights (gate_up and down), in its widest MoE layer.
    let one_expert = model
        .layers
        .iter()
        .map(|g| {
            g.linears
                .iter()
                .filter(|l| l.role == crate::model::LinearRole::Expert && !job.is_module(l))
                .map(crate::model::Linear::weight_numel)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0);
    job.micro_batch_size * moe.experts_per_token * one_expert / tp * r.frozen_bytes
}

/// Phases of an inference job.
pub(super) fn phases(
    model: &ModelSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
    sh: &Sharded,
) -> Vec<PhaseBytes> {
    if let Some(s2s) = &model.seq2seq {
        return seq2seq_phases(model, s2s, job, r, device, sh.weights);
    }
    let tp = sh.tp;
    let pp = job.parallel.pipeline.max(1);
    let b = job.micro_batch_size;
    // The prefill runs the prompt (the whole context where no tokens are generated one at
    // a time); the cache then holds the whole context.
    let s = job.prompt_tokens();
    let t = b * s;
    let layout = job.stack.profile().kv_cache;
    let static_cache = layout != crate::stack::KvCacheLayout::Transformers;
    let kv_at = |tokens| {
        let bytes = if layout == crate::stack::KvCacheLayout::Litgpt {
            litgpt_kv_cache_bytes(model, b, tokens, job.kv_dtype, tp)
        } else {
            kv_cache_bytes(model, b, tokens, job.kv_dtype, tp)
        };
        bytes / pp
    };
    // litgpt's and torchtune's caches are allocated whole before the prefill (over
    // `max_seq_length`); transformers' `DynamicCache` grows a token a step.
    let (kv, kv_prefill) = (
        kv_at(job.seq_len),
        kv_at(if static_cache { job.seq_len } else { s }),
    );
    let cb = r.compute_bytes;
    let h = model.hidden_size;
    let ad = model.q_width() / tp;
    let kd = model.kv_width() / tp;
    // Experts that run on every token ([`ModelSpec::experts_see_every_token`]): the shared
    // expert's gated MLP, and the routed block's own tensors: the scaled copy of the input
    // for each expert, `gate_up` (2I), the activation and the product (I each).
    let (i, every_token) = match &model.moe {
        Some(moe) if model.experts_see_every_token => (
            moe.shared_intermediate_size / tp,
            moe.num_experts * (h + 4 * moe.expert_intermediate_size / tp),
        ),
        _ => (model.active_intermediate(model.moe.is_some()) / tp, 0),
    };
    // The prefill runs the whole prompt through one layer at a time without saving anything:
    // the residual and normed stream, q/k/v/out, and the MLP's gate/up/product are alive
    // together (no autograd). Eager attention also materializes fp32 and 16-bit scores.
    let mut prefill = t * (cb * (2 * ad + 2 * kd + 3 * i + every_token) + 3 * cb * h);
    if job.attention == Attention::Eager {
        prefill += b * (model.num_heads / tp) * s * s * (4 + cb);
    }
    prefill = prefill.max(super::recurrent::prefill_bytes(model, b, s, cb) / tp);
    if let Some(g) = &model.gemma3n {
        // Gemma 3n's widest moment is a layer's MLP (gate, up, the GELU and the product)
        // with every AltUp stream twice (the prediction and its clone) and a dozen h-wide
        // tensors of the layer (the streams' rescaled copies, the norms, LAuReL's sums and
        // the per-layer input's), the per-layer inputs, and the sliding layers' boolean mask
        // over the prompt (traced, `validation/oracle-traces/gemma3n-prefill.jsonl`).
        let i_max = model.intermediate_size / tp;
        prefill = t * cb * (4 * i_max + 2 * g.altup * h + 12 * h + 4 * g.ple) + b * s * s;
    }
    let state =
        super::recurrent::state_bytes(model, b, cb, tp) / pp + cross_cache(model, job, tp) / pp;
    let (kv, kv_prefill) = (kv + state, kv_prefill + state);
    // Logits: `generate` keeps only the last position (`logits_to_keep=1`), upcast to fp32.
    let logits = b * model.vocab_size / tp * 4 * 2;
    let dequant = super::weights::dequant_transient(model, job, r);
    // fp32 weights under autocast: `cached_cast` keeps a bf16 copy of every fp32 leaf that
    // requires grad (an unfrozen model) until the autocast region ends — the whole forward
    // (litgpt's bf16-mixed `generate` runs each step inside `torch.autocast`).
    let autocast_cache = if r.autocast && r.frozen_bytes == 4 {
        2 * (model.linear_params() + model.lm_head_params().max(model.embedding_params())) / tp
    } else {
        0
    };
    // litgpt's `generate/tp.py` shards the Blocks' Linears only: `wte` and `lm_head`
    // are replicated on every device.
    let replicated = if job.stack.profile().tp_replicates_embeddings && tp > 1 {
        let layers = model.layer_params();
        let rest = model.total_params().saturating_sub(layers);
        rest * r.frozen_bytes * (tp - 1) / tp
    } else {
        0
    };
    // A vision-language model's tower runs over the prompt's images first, under no_grad
    // ([`super::vision::step`]'s forward working set); the batch's `pixel_values` stay for
    // the whole forward, and Mllama's cross-attention mask with them. The prefill's widest
    // moment is the tower's or the language model's (traced,
    // `validation/oracle-traces/vlm-prefill.jsonl`).
    let v = super::vision::step(model, job, r);
    let tower = v.pixels + v.saved + v.forward_transient.saturating_sub(prefill / pp);
    let cublas = device.cublas_workspace_bytes;
    let weights = sh.weights + replicated;
    vec![
        PhaseBytes {
            phase: Phase::Load,
            components: vec![(Component::Weights, weights)],
        },
        PhaseBytes {
            phase: Phase::Prefill,
            components: vec![
                (Component::Weights, weights),
                (Component::KvCache, kv_prefill),
                (
                    Component::Activations,
                    prefill / pp + autocast_cache + tower,
                ),
                (Component::LogitsLoss, logits),
                (Component::Transients, cublas + dequant),
            ],
        },
        PhaseBytes {
            phase: Phase::Decode,
            components: vec![
                (Component::Weights, weights),
                (Component::KvCache, kv),
                (
                    Component::Activations,
                    // One layer's gather at a time, on every pipeline stage.
                    autocast_cache + moe_decode_gather(model, job, r, device, tp),
                ),
                (Component::LogitsLoss, logits),
                (Component::Transients, cublas + dequant),
            ],
        },
    ]
}
