//! Generation as transformers' `generate` runs it on one GPU, tensor by tensor: the prompt's
//! prefill under `no_grad`, then one forward a generated token, every layer's keys and
//! values grown by `torch.cat` (transformers 5.25 `DynamicLayer.update`: a new tensor a
//! token longer, then the old one dropped).
//!
//! A cat's request is always a little larger than the block its old tensor frees, so the
//! block cannot take the next request of its own layer; once the cache outgrows its
//! segments every layer's new tensor needs a new segment and leaves the old one wholly
//! free. PyTorch keeps such segments cached until a `cudaMalloc` fails, then returns them
//! and tries again (`release_cached_blocks`), so what a job needs is the replay's
//! [`super::Replayed::needed`], and a GPU with room to spare reports up to its
//! [`super::Replayed::reserved`].
//!
//! The order of the ops is the oracle's (`calibration/generate_events.py`: the model on
//! fake CUDA tensors, with what `generate` makes around it, `generation/utils.py`
//! `_sample`); `crates/moro-core/tests/generate.rs` holds the trace to its sequences.

use crate::caching_allocator::{SMALL_SIZE, round_size};
use crate::job::{Attention, Job, Method, Quantization};
use crate::model::{AttentionKind, ModelSpec};

use super::super::{Backend, Component, DeviceProfile, Phase, PhaseBytes, Regime};
use super::decoder_layer;
use super::params::{Param, params};
use super::{Builder, Replayed, Tensor, Trace};

/// The most decode steps × layers a generation's replay follows: about 8 million events,
/// half a second on one core. Longer generations are estimated by the formulas.
pub const MAX_LAYER_STEPS: u64 = 1 << 21;

/// Whether `job`'s stack generates with transformers' `DynamicCache` in PyTorch, whose
/// keys and values grow a token a step by `torch.cat`.
#[must_use]
pub fn cache_grows_by_copy(job: &Job) -> bool {
    job.stack.profile().kv_cache == crate::stack::KvCacheLayout::Transformers
        && job.stack.profile().runtime == crate::stack::Runtime::Torch
}

/// Whether [`trace`] models `job` on `model`: an inference job that generates tokens one
/// at a time ([`Job::new_tokens`], at most [`MAX_LAYER_STEPS`] layer-steps) on one CUDA GPU
/// with SDPA's flash kernel, a bf16 or fp16 Llama, Mistral, Qwen2 or Qwen3 model without
/// sliding windows, unquantized, its cache in the compute dtype, on a stack whose cache is
/// transformers' `DynamicCache`.
#[must_use]
pub fn models(model: &ModelSpec, job: &Job, r: &Regime, device: &DeviceProfile) -> bool {
    job.method == Method::Inference
        && job.new_tokens.is_some_and(|n| {
            n > 0 && n < job.seq_len && n.saturating_mul(model.num_layers) <= MAX_LAYER_STEPS
        })
        && cache_grows_by_copy(job)
        && device.backend == Backend::Cuda
        && device.flash_sdpa
        && job.attention == Attention::Sdpa
        && job.quantization == Quantization::None
        && job.parallel.gpus() == 1
        && r.compute_bytes == 2
        && r.frozen_bytes == 2
        && job.kv_dtype.bytes() == r.compute_bytes
        && decoder_layer::llama_style(model)
        && model.vision.is_none()
        && model.seq2seq.is_none()
        && model.encoder.is_none()
        && model.gemma3n.is_none()
        && !model.has_recurrent_mixer()
        && model
            .layers
            .iter()
            .all(|g| g.attention == AttentionKind::Full)
}

/// The generation's events with their names, every decode step whole.
#[must_use]
pub fn trace<'m>(
    model: &'m ModelSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
) -> Option<Trace<'m>> {
    if !models(model, job, r, device) {
        return None;
    }
    // Every step whole: the named trace is read event by event.
    let g = Generation {
        lean_steps: false,
        ..Generation::new(model, job, r, device)
    };
    let mut b = Builder::with_capacity(g.events_hint());
    g.record(&mut b);
    Some(b.finish())
}

/// The generation's phases and, where `replay`, its replay, read as the events go by.
#[must_use]
pub fn levels(
    model: &ModelSpec,
    job: &Job,
    r: &Regime,
    device: &DeviceProfile,
    replay: bool,
) -> Option<(Vec<PhaseBytes>, Option<Replayed>)> {
    if !models(model, job, r, device) {
        return None;
    }
    let g = Generation::new(model, job, r, device);
    let mut b = Builder::reading(device.backend, replay, g.ps.len() + 64);
    g.record(&mut b);
    Some(b.finish_reading())
}

/// One generation's shapes.
struct Generation<'m> {
    ps: Vec<Param<'m>>,
    b: u64,
    prompt: u64,
    new_tokens: u64,
    h: u64,
    q: u64,
    kv: u64,
    inter: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    /// Qwen3's RMSNorm over each head of q and of k before RoPE.
    qk_norm: bool,
    vocab: u64,
    layers: u64,
    cb: u64,
    cublas: u64,
    /// Lean decode steps leave out the small pool's temporaries ([`Self::record`]).
    lean_steps: bool,
}

/// What a layer's cache holds: its keys and values.
type Cached<'m> = (Tensor<'m>, Tensor<'m>);

impl<'m> Generation<'m> {
    fn new(model: &'m ModelSpec, job: &Job, r: &Regime, device: &DeviceProfile) -> Self {
        let new_tokens = job.new_tokens.unwrap_or(0);
        Self {
            ps: params(model, job, r),
            b: job.micro_batch_size,
            prompt: job.seq_len - new_tokens,
            new_tokens,
            h: model.hidden_size,
            q: model.q_width(),
            kv: model.kv_width(),
            inter: model.intermediate_size,
            heads: model.num_heads,
            kv_heads: model.num_kv_heads,
            head_dim: model.head_dim,
            qk_norm: model.qk_norm,
            vocab: model.vocab_size,
            layers: model.num_layers,
            cb: r.compute_bytes,
            cublas: device.cublas_workspace_bytes,
            lean_steps: true,
        }
    }

    /// About how many events a trace of whole steps keeps.
    fn events_hint(&self) -> usize {
        let per_step = 100 * self.layers + 40;
        usize::try_from(self.ps.len() as u64 + 200 * self.layers + self.new_tokens * per_step)
            .unwrap_or(usize::MAX)
    }

    /// Loading, the prefill of the prompt, and the decode steps: `max_new_tokens` tokens
    /// take the prefill and one forward fewer than that. The first and last decode steps
    /// are traced whole; the ones between leave out the temporaries the small pool serves,
    /// which find the blocks the step before freed (the large pool's requests, the cache
    /// and the growing ids are all kept).
    fn record(&self, b: &mut Builder<'m>) {
        b.at(Phase::Load, 0);
        for p in &self.ps {
            b.alloc_in(
                p.name,
                p.module,
                p.layer,
                Component::Weights,
                p.numel,
                p.dtype_bytes,
            );
        }
        // The rotary embedding's two buffers (`inv_freq`, `original_inv_freq`).
        for _ in 0..2 {
            b.alloc("inv_freq", Component::Weights, self.head_dim / 2, 4);
        }
        b.at(Phase::Prefill, 1);
        let bt = self.b;
        let p = self.prompt;
        // The caller's ids and mask; the position ids made from the mask
        // (`_prepare_position_ids_for_generation`: `cumsum - 1`, `masked_fill`), the mask
        // then dropped as all ones.
        let mut ids = b.alloc("input_ids", Component::Transients, bt * p, 8);
        let _mask = b.alloc("attention_mask", Component::Transients, bt * p, 8);
        let cumsum = b.alloc("cumsum", Component::Transients, bt * p, 8);
        let sub = b.alloc("position_ids", Component::Transients, bt * p, 8);
        b.free(cumsum);
        let eq = b.alloc("mask == 0", Component::Transients, bt * p, 1);
        let mut pos = b.alloc("position_ids", Component::Transients, bt * p, 8);
        b.free(eq);
        b.free(sub);
        let _unfinished = b.alloc("unfinished_sequences", Component::Transients, bt, 8);
        let _pad = b.alloc("pad_token_id", Component::Transients, 1, 8);
        let mut cache: Vec<Option<Cached<'m>>> = vec![None; self.layers as usize];
        let mut cublas = None;
        for step in 0..self.new_tokens {
            // Tokens in the context once this step's forward has run.
            let t = p + step;
            let n = if step == 0 { p } else { 1 };
            if step == 1 {
                b.at(Phase::Decode, 1);
            }
            let lean = self.lean_steps && step > 1 && step + 1 < self.new_tokens;
            let logits = self.forward(b, &mut cache, &mut cublas, n, t - n, lean);
            // `_update_model_kwargs_for_generation`: the position ids a column longer.
            let ar = self.tmp(b, "arange", 8, lean);
            let next = self.tmp(b, "position_ids", bt * 8, lean);
            self.drop(b, ar);
            let grown = b.alloc("position_ids", Component::Transients, bt * (t + 1), 8);
            self.drop(b, next);
            b.free(pos);
            pos = grown;
            // The last logits in fp32, the greedy token, finished rows padded.
            let fp32 = self.tmp_in(
                b,
                "logits (fp32)",
                Component::LogitsLoss,
                bt * self.vocab * 4,
                lean,
            );
            let argmax = self.tmp(b, "argmax", bt * 8, lean);
            let m1 = self.tmp(b, "next_tokens", bt * 8, lean);
            let rsub = self.tmp(b, "1 - unfinished", bt * 8, lean);
            let m2 = self.tmp(b, "pad", bt * 8, lean);
            self.drop(b, rsub);
            let token = self.tmp(b, "next_tokens", bt * 8, lean);
            self.drop(b, m1);
            self.drop(b, m2);
            self.drop(b, argmax);
            let longer = b.alloc("input_ids", Component::Transients, bt * (t + 1), 8);
            b.free(ids);
            ids = longer;
            b.free(logits);
            self.drop(b, fp32);
            self.drop(b, token);
        }
    }

    /// A temporary of `bytes`, or none where the step is lean and the small pool serves it.
    fn tmp(
        &self,
        b: &mut Builder<'m>,
        name: &'static str,
        bytes: u64,
        lean: bool,
    ) -> Option<Tensor<'m>> {
        self.tmp_in(b, name, Component::Activations, bytes, lean)
    }

    fn tmp_in(
        &self,
        b: &mut Builder<'m>,
        name: &'static str,
        component: Component,
        bytes: u64,
        lean: bool,
    ) -> Option<Tensor<'m>> {
        (!lean || round_size(bytes) > SMALL_SIZE).then(|| b.alloc(name, component, bytes, 1))
    }

    fn drop(&self, b: &mut Builder<'m>, t: Option<Tensor<'m>>) {
        if let Some(t) = t {
            b.free(t);
        }
    }

    /// One forward over `n` new tokens after `past` cached ones: the model's inputs, the
    /// rotary tables, every layer (its cache grown), the final norm and the last position's
    /// logits (`logits_to_keep=1`), which it returns.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        b: &mut Builder<'m>,
        cache: &mut [Option<Cached<'m>>],
        cublas: &mut Option<Tensor<'m>>,
        n: u64,
        past: u64,
        lean: bool,
    ) -> Tensor<'m> {
        let bt = self.b;
        let tokens = bt * n;
        // `prepare_inputs_for_generation`: the ids' (and after the prefill the position
        // ids') last columns, cloned.
        let inputs = self.tmp(b, "input_ids (clone)", tokens * 8, lean);
        let positions = (past > 0)
            .then(|| self.tmp(b, "position_ids (clone)", tokens * 8, lean))
            .flatten();
        let emb = self.tmp(b, "embedding", tokens * self.h * self.cb, lean);
        // `LlamaRotaryEmbedding.forward`: the positions in fp32, the angles, their cat, cos
        // and sin scaled, and their 16-bit copies the layers read.
        let d = self.head_dim;
        let pf = self.tmp(b, "positions (fp32)", tokens * 4, lean);
        let freqs = self.tmp(b, "freqs", tokens * d / 2 * 4, lean);
        self.drop(b, pf);
        let angles = self.tmp(b, "rotary cat", tokens * d * 4, lean);
        let cos = self.tmp(b, "cos", tokens * d * 4, lean);
        let cos_scaled = self.tmp(b, "cos", tokens * d * 4, lean);
        self.drop(b, cos);
        let sin = self.tmp(b, "sin", tokens * d * 4, lean);
        let sin_scaled = self.tmp(b, "sin", tokens * d * 4, lean);
        self.drop(b, sin);
        let cos16 = self.tmp(b, "cos", tokens * d * self.cb, lean);
        let sin16 = self.tmp(b, "sin", tokens * d * self.cb, lean);
        for x in [freqs, angles, cos_scaled, sin_scaled] {
            self.drop(b, x);
        }
        if cublas.is_none() && self.cublas > 0 {
            *cublas = Some(b.alloc("cuBLAS workspace", Component::Transients, self.cublas, 1));
        }
        // Each layer's input is freed after the layer, the embedding's only at the end.
        let mut x = emb;
        for (k, slot) in cache.iter_mut().enumerate() {
            let out = self.layer(b, slot, k as u64, n, past, lean);
            if k > 0 {
                self.drop(b, x);
            }
            x = out;
        }
        let normed = self.norm(b, tokens, self.h, lean);
        self.drop(b, x);
        self.drop(b, emb);
        self.drop(b, sin16);
        self.drop(b, cos16);
        let logits = b.alloc("logits", Component::LogitsLoss, bt * self.vocab, self.cb);
        self.drop(b, normed);
        self.drop(b, inputs);
        self.drop(b, positions);
        logits
    }

    /// `LlamaRMSNorm.forward` on `rows` rows of `width`: the fp32 upcast, its square, their
    /// mean, `+ eps`, `rsqrt`, the normalized fp32 product, its 16-bit cast and the weight's
    /// product, which it returns.
    fn norm(&self, b: &mut Builder<'m>, rows: u64, width: u64, lean: bool) -> Option<Tensor<'m>> {
        let wide = rows * width * 4;
        let up = self.tmp(b, "norm upcast", wide, lean);
        let sq = self.tmp(b, "norm pow", wide, lean);
        let mean = self.tmp(b, "norm mean", rows * 4, lean);
        self.drop(b, sq);
        let eps = self.tmp(b, "norm + eps", rows * 4, lean);
        let rs = self.tmp(b, "norm rsqrt", rows * 4, lean);
        self.drop(b, eps);
        let prod = self.tmp(b, "norm product", wide, lean);
        self.drop(b, rs);
        self.drop(b, up);
        let cast = self.tmp(b, "norm cast", rows * width * self.cb, lean);
        let out = self.tmp(b, "normed", rows * width * self.cb, lean);
        self.drop(b, cast);
        self.drop(b, prod);
        self.drop(b, mean);
        out
    }

    /// A projection of `heads` heads, through Qwen3's per-head norm where the model has it
    /// (the raw projection freed once normed).
    fn head_projection(
        &self,
        b: &mut Builder<'m>,
        name: &'static str,
        tokens: u64,
        heads: u64,
        lean: bool,
    ) -> Option<Tensor<'m>> {
        let raw = self.tmp(b, name, tokens * heads * self.head_dim * self.cb, lean);
        if !self.qk_norm {
            return raw;
        }
        let normed = self.norm(b, tokens * heads, self.head_dim, lean);
        self.drop(b, raw);
        normed
    }

    /// `apply_rotary_pos_emb` on a `width`-wide projection: `x·cos`, `rotate_half` (the
    /// negated half, the cat), its product with sin, and the sum, which it returns.
    fn rope(&self, b: &mut Builder<'m>, tokens: u64, width: u64, lean: bool) -> Option<Tensor<'m>> {
        let bytes = tokens * width * self.cb;
        let xc = self.tmp(b, "rope x·cos", bytes, lean);
        let neg = self.tmp(b, "rope neg", bytes / 2, lean);
        let half = self.tmp(b, "rope rotate_half", bytes, lean);
        self.drop(b, neg);
        let xs = self.tmp(b, "rope x·sin", bytes, lean);
        self.drop(b, half);
        let out = self.tmp(b, "rope out", bytes, lean);
        self.drop(b, xc);
        self.drop(b, xs);
        out
    }

    /// One decoder layer over `n` tokens (`LlamaDecoderLayer.forward` under `no_grad`, SDPA
    /// on the flash kernel with grouped heads passed as they are): returns its output.
    #[allow(clippy::too_many_arguments)]
    fn layer(
        &self,
        b: &mut Builder<'m>,
        slot: &mut Option<Cached<'m>>,
        layer: u64,
        n: u64,
        past: u64,
        lean: bool,
    ) -> Option<Tensor<'m>> {
        let tokens = self.b * n;
        let cb = self.cb;
        let normed = self.norm(b, tokens, self.h, lean);
        let q = self.head_projection(b, "q_proj", tokens, self.heads, lean);
        let k = self.head_projection(b, "k_proj", tokens, self.kv_heads, lean);
        let v = self.tmp(b, "v_proj", tokens * self.kv * cb, lean);
        let qr = self.rope(b, tokens, self.q, lean);
        let kr = self.rope(b, tokens, self.kv, lean);
        self.drop(b, q);
        self.drop(b, k);
        // `DynamicLayer.update`: the keys a token longer, then the old ones dropped; the
        // values likewise.
        let cached = self.b * (past + n) * self.kv;
        let keys = b.alloc_in("keys", None, Some(layer), Component::KvCache, cached, cb);
        if let Some((old, _)) = slot {
            b.free(*old);
        }
        let values = b.alloc_in("values", None, Some(layer), Component::KvCache, cached, cb);
        if let Some((_, old)) = slot {
            b.free(*old);
        }
        *slot = Some((keys, values));
        self.drop(b, kr);
        self.drop(b, v);
        // `_scaled_dot_product_flash_attention`: the output, its log-sum-exp, the two
        // philox seeds.
        let attn = self.tmp(b, "attention", tokens * self.q * cb, lean);
        let lse = self.tmp(b, "logsumexp", tokens * self.heads * 4, lean);
        let seed = self.tmp(b, "philox seed", 16, lean);
        let offset = self.tmp(b, "philox offset", 8, lean);
        self.drop(b, offset);
        self.drop(b, seed);
        self.drop(b, lse);
        let o = self.tmp(b, "o_proj", tokens * self.h * cb, lean);
        self.drop(b, attn);
        self.drop(b, qr);
        self.drop(b, normed);
        let r1 = self.tmp(b, "residual", tokens * self.h * cb, lean);
        self.drop(b, o);
        let normed = self.norm(b, tokens, self.h, lean);
        let wide = tokens * self.inter * cb;
        let gate = self.tmp(b, "gate_proj", wide, lean);
        let act = self.tmp(b, "silu", wide, lean);
        self.drop(b, gate);
        let up = self.tmp(b, "up_proj", wide, lean);
        let prod = self.tmp(b, "gate·up", wide, lean);
        self.drop(b, act);
        self.drop(b, up);
        let down = self.tmp(b, "down_proj", tokens * self.h * cb, lean);
        self.drop(b, prod);
        self.drop(b, normed);
        let r2 = self.tmp(b, "residual", tokens * self.h * cb, lean);
        self.drop(b, down);
        self.drop(b, r1);
        r2
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{JobSettings, Precision};

    /// The lean decode steps replay to the peaks of the whole ones: the small pool's
    /// temporaries find the blocks the step before freed.
    #[test]
    fn lean_steps_keep_the_peaks() {
        let model = crate::catalog::load(
            crate::catalog::find("meta-llama/Llama-3.1-8B").expect("in the catalog"),
        )
        .expect("loads");
        for (b, prompt, new) in [(1, 512, 300), (4, 128, 700), (16, 64, 500)] {
            let job = JobSettings {
                method: Some(Method::Inference),
                precision: Some(Precision::Bf16),
                micro_batch_size: Some(b),
                seq_len: Some(prompt + new),
                new_tokens: Some(new),
                ..JobSettings::default()
            }
            .resolve_for(&model)
            .expect("resolves");
            let r = Regime::resolve(&model, &job);
            let device = DeviceProfile::default();
            let read = |lean_steps| {
                let g = Generation {
                    lean_steps,
                    ..Generation::new(&model, &job, &r, &device)
                };
                let mut bld = Builder::reading(Backend::Cuda, true, 1024);
                g.record(&mut bld);
                let (phases, replayed) = bld.finish_reading();
                let replayed = replayed.expect("replayed");
                (
                    phases,
                    replayed.allocated,
                    replayed.reserved,
                    replayed.needed,
                )
            };
            assert_eq!(read(true), read(false), "b {b}, prompt {prompt}, new {new}");
        }
    }
}
