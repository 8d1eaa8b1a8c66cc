//! Inference: weights + KV cache + the prefill's transients and logits.

use crate::job::{Attention, Job, KvDtype};
use crate::model::{AttentionKind, ModelSpec};

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
    let elem = match kv {
        KvDtype::F16 => 2,
        KvDtype::F8 => 1,
        KvDtype::F32 => 4,
    };
    let per_tok = model.kv_cache_elems_per_token_layer() / tp.max(1);
    model
        .layers
        .iter()
        .map(|g| {
            let tokens = match g.attention {
                AttentionKind::Full => context,
                AttentionKind::Sliding { window } => context.min(window),
            };
            g.count * tokens * per_tok
        })
        .sum::<u64>()
        * batch
        * elem
}

/// Phases of an inference job.
pub(super) fn phases(
    model: &ModelSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
) -> Vec<PhaseBytes> {
    let sh = Sharded::new(model, job, r);
    let tp = sh.tp;
    let pp = job.parallel.pipeline.max(1);
    let b = job.micro_batch_size;
    let s = job.seq_len;
    let t = b * s;
    let kv = kv_cache_bytes(model, b, s, job.kv_dtype, tp) / pp;
    let cb = r.compute_bytes;
    let h = model.hidden_size;
    let ad = model.q_width() / tp;
    let kd = model.kv_width() / tp;
    let i = model.active_intermediate(model.moe.is_some()) / tp;
    // The prefill runs the whole prompt through one layer at a time without saving anything:
    // the residual and normed stream, q/k/v/out, and the MLP's gate/up/product are alive
    // together (no autograd). Eager attention also materializes fp32 and 16-bit scores.
    let mut prefill = t * (cb * (2 * ad + 2 * kd + 3 * i) + 3 * cb * h);
    if job.attention == Attention::Eager {
        prefill += b * (model.num_heads / tp) * s * s * (4 + cb);
    }
    // Logits: `generate` keeps only the last position (`logits_to_keep=1`), upcast to fp32.
    let logits = b * model.vocab_size / tp * 4 * 2;
    let dequant = super::weights::dequant_transient(model, job, r);
    let cublas = device.cublas_workspace_bytes;
    vec![
        PhaseBytes {
            phase: Phase::Load,
            components: vec![(Component::Weights, sh.weights)],
        },
        PhaseBytes {
            phase: Phase::Prefill,
            components: vec![
                (Component::Weights, sh.weights),
                (Component::KvCache, kv),
                (Component::Activations, prefill / pp),
                (Component::LogitsLoss, logits),
                (Component::Transients, cublas + dequant),
            ],
        },
        PhaseBytes {
            phase: Phase::Decode,
            components: vec![
                (Component::Weights, sh.weights),
                (Component::KvCache, kv),
                (Component::LogitsLoss, logits),
                (Component::Transients, cublas + dequant),
            ],
        },
    ]
}
