//! What setting a job up leaves in PyTorch's cache. The caching allocator keeps every segment
//! it `cudaMalloc`ed until `empty_cache()`, which training recipes do not call, so a load
//! or an engine setup that fragments the cache sets a floor under the step's reserved level:
//! the step's peak reserved is at least the reserved after it.
//!
//! Modelled:
//!
//! - torchtune 0.1.x's QLoRA model build with torchao before 0.2, whose NF4 quantizer needs
//!   64 bytes of temporaries per weight element. Replayed through [`CachingAllocator`],
//!   Llama-2-7B's build and load end at 9.14 GB reserved, and torchtune's QLoRA tutorial
//!   logged 9.13 GB "peak memory reserved, model init"; a trace of the same code on the meta
//!   device, replayed through the same model, also gives 9.14 GB (`calibration/README.md`).
//! - DeepSpeed ZeRO-3's engine setup and its optimizer step ([`zero3_setup_and_step`]),
//!   whose fp32 partitions, optimizer states and step temporaries are each one flat tensor
//!   per sub-group of up to 1e9 elements: blocks of gigabytes that the layers' smaller
//!   requests split and the next large request cannot reuse.

use crate::caching_allocator::{CachingAllocator, Handle};
use crate::job::{Job, Method, Offload, Sharding};
use crate::model::{LinearRole, ModelSpec};
use crate::stack::Nf4Kernel;

use super::Regime;
use super::parallel;
use super::weights::base_weight_bytes;

/// The reserved bytes the job's setup leaves in PyTorch's cache (0 where the setup is not
/// modelled to fragment it). `churn`: the blocks a forward and backward allocate and free
/// (at their peak), replayed where a setup is followed by steps.
#[must_use]
pub fn load_reserved_bytes(model: &ModelSpec, job: &Job, r: &Regime, churn: &[u64]) -> u64 {
    if job.stack.profile().nf4 == Nf4Kernel::Torchao
        && job.method == Method::QuantizedAdapters
        && job.versions.torchao_unchunked_nf4()
    {
        torchtune_nf4_build(model, job).reserved()
    } else if replays_steps(job) {
        zero3_setup_and_step(model, job, r, churn)
    } else {
        0
    }
}

/// Whether the job's setup is replayed with its training steps, so that
/// [`load_reserved_bytes`] needs their churn: DeepSpeed ZeRO-3 without offload.
#[must_use]
pub fn replays_steps(job: &Job) -> bool {
    job.parallel.sharding == Sharding::Zero3
        && job.parallel.offload == Offload::None
        && job.method != Method::Inference
}

/// DeepSpeed ZeRO-3 without offload, per rank, statement by statement from v0.11.1's
/// `stage3.py` (the large allocations; the layers' activations are left out, and they fit in
/// what the step frees):
///
/// 1. the frozen parameters' partitions (PEFT), allocated by `zero.Init`;
/// 2. `defragment`: `empty_cache()`, then one flat 16-bit buffer of the trainable partitions;
/// 3. `_create_fp32_partitions`, per sub-group: `.clone().float()`, the 16-bit clone freed;
/// 4. `initialize_optimizer_states`: a zeroed fp32 `gradient_buffer` of the largest
///    sub-group, one optimizer step per sub-group that creates its states (Adam:
///    `exp_avg`, `exp_avg_sq`), then the buffer freed;
/// 5. the IPG bucket (`reduce_bucket_size` 16-bit elements) and the 16-bit
///    `grad_partitions_flat_buffer` of every trainable partition;
/// 6. two training steps, each the forward and backward's `churn` (allocated, then freed)
///    and the optimizer step: the per-gradient `double()` of `get_grad_norm_direct` (each freed
///    at once: only a gradient larger than every earlier one needs a new block), then per
///    sub-group the 16-bit `flatten` and its fp32 copy, the flatten freed, the copy freed in
///    `_release_sub_group`. `has_overflow`'s `isinf` / `isnan` bools run on
///    `reduce_and_partition_stream` (a stream of its own under `overlap_comm`, which stage 3
///    turns on by default), and the caching allocator keeps a stream's blocks for that
///    stream: their segment is a pool of its own.
fn zero3_setup_and_step(model: &ModelSpec, job: &Job, r: &Regime, churn: &[u64]) -> u64 {
    let p = &job.parallel;
    let split = p.tensor_parallel.max(1) * p.pipeline.max(1);
    let n = p.data_parallel.max(1) * split;
    let parts = parallel::zero3_partitions(model, job);
    let groups = parallel::zero3_sub_groups(&parts);
    let t: u64 = parts.iter().sum();
    let largest = groups.iter().copied().max().unwrap_or(0);
    let states = parallel::deepspeed_state_bytes(model, job, r) / n;
    let mut s = Sim(CachingAllocator::new());
    if job.method != Method::Full {
        s.a(base_weight_bytes(model, job, r) / n);
    }
    s.0.empty_cache();
    s.a(2 * t);
    for &g in &groups {
        let clone = s.a(2 * g);
        s.a(4 * g);
        s.f(clone);
    }
    let gradient_buffer = s.a(4 * largest);
    for &g in &groups {
        let per = u64::try_from(u128::from(states) * u128::from(g) / u128::from(t.max(1)))
            .unwrap_or(u64::MAX);
        s.a(per / 2);
        s.a(per - per / 2);
    }
    s.f(gradient_buffer);
    s.a(p
        .reduce_bucket
        .unwrap_or(model.hidden_size * model.hidden_size)
        * 2);
    s.a(2 * t);
    for _ in 0..2 {
        let held: Vec<Handle> = churn.iter().map(|&b| s.a(b)).collect();
        s.free_all(held);
        let mut widest = 0;
        for &x in &parts {
            if x > widest {
                widest = x;
                let d = s.a(8 * x);
                s.f(d);
            }
        }
        for &g in &groups {
            let flat = s.a(2 * g);
            let fp32 = s.a(4 * g);
            s.f(flat);
            s.f(fp32);
        }
    }
    let mut side = CachingAllocator::new();
    let bools = side.malloc(t.max(1));
    side.free(bools);
    s.0.reserved() + side.reserved()
}

/// The allocator driven by the generated code: each helper allocates and frees what the
/// library statement it mirrors does.
struct Sim(CachingAllocator);

impl Sim {
    fn a(&mut self, bytes: u64) -> Handle {
        self.0.malloc(bytes.max(1))
    }

    fn f(&mut self, h: Handle) {
        self.0.free(h);
    }

    fn free_all(&mut self, hs: impl IntoIterator<Item = Handle>) {
        for h in hs {
            self.f(h);
        }
    }

    /// `get_block_absmax(x, block)` over `n` bf16 elements (torchao 0.1 `nf4tensor.py`):
    /// `blocks.abs()` (2n bytes), then `.max(dim=1)`: bf16 values (kept) and int64 indices.
    fn block_absmax(&mut self, n: u64, block: u64) -> Handle {
        let abs = self.a(2 * n);
        let values = self.a(n / block * 2);
        let indices = self.a(n / block * 8);
        self.f(abs);
        self.f(indices);
        values
    }

    /// `NF4Tensor.from_tensor` (torchao 0.1) of a live bf16 tensor of `n` elements, statement
    /// by statement; returns the NF4 tensor's own storages.
    fn quantize(&mut self, n: u64) -> Vec<Handle> {
        let nf4 = self.a(32);
        // double_quantize_scalers: per-64 absmax, minus its mean, per-256 absmax of that,
        // `256 / (2 * absmax)` over the expanded view (`__rtruediv__` is `reciprocal() *
        // 256`), then `* factor`, `.round()`, `.clamp()` and `.to(int8)`.
        let sb = n / 64 * 2;
        let absmax = self.block_absmax(n, 64);
        let mean = self.a(2);
        let scalers = self.a(sb);
        self.f(absmax);
        let scaler_absmax = self.block_absmax(n / 64, 256);
        let doubled = self.a(sb);
        let reciprocal = self.a(sb);
        let factor = self.a(sb);
        self.f(reciprocal);
        self.f(doubled);
        let scaled = self.a(sb);
        let rounded = self.a(sb);
        self.f(scaled);
        let clamped = self.a(sb);
        self.f(rounded);
        let int8 = self.a(n / 64);
        self.free_all([scalers, scaler_absmax, clamped]);
        // convert_to_norm_float_weight: absmax again, `blocks / scales`, then
        // quantize_tensor_nearest: `(value - nf4).abs()` over n × 16 bf16, `.min(dim=-1)`
        // (bf16 values dropped, int64 indices kept), `q[::2] << 4 | q[1::2]` in int64 and
        // `.to(uint8)`.
        let scales = self.block_absmax(n, 64);
        let blocks = self.a(2 * n);
        let diff = self.a(32 * n);
        let abs = self.a(32 * n);
        self.f(diff);
        let min_values = self.a(2 * n);
        let nearest = self.a(8 * n);
        self.f(min_values);
        self.f(abs);
        let shifted = self.a(4 * n);
        let combined = self.a(4 * n);
        self.f(shifted);
        let data = self.a(n / 2);
        self.free_all([scales, blocks, nearest, combined]);
        vec![int8, factor, mean, data, nf4]
    }

    /// `NF4Tensor.get_original_weight` (torchao 0.1): unpacks the high and low nibbles to
    /// int64, looks them up in the bf16 table, dequantizes the scalers and multiplies by
    /// them (each `repeated.flatten()` materializes), then `torch.stack`s the halves.
    fn dequantize(&mut self, n: u64) -> Handle {
        let hi = self.a(n / 2);
        let first = self.a(4 * n);
        self.f(hi);
        let lo = self.a(n / 2);
        let second = self.a(4 * n);
        self.f(lo);
        let d1 = self.a(n);
        let d2 = self.a(n);
        let divided = self.a(n / 64 * 2);
        let scalers = self.a(n / 64 * 2);
        self.f(divided);
        let r1 = self.a(n);
        let p1 = self.a(n);
        self.f(r1);
        let r2 = self.a(n);
        let p2 = self.a(n);
        self.f(r2);
        let out = self.a(2 * n);
        self.free_all([first, second, d1, d2, scalers, p1, p2]);
        out
    }
}

/// One Linear of a torchtune layer: input and output features, and whether LoRA (hence, with
/// `quantize_base`, NF4) applies to it.
struct TtLinear {
    inp: u64,
    out: u64,
    nf4: bool,
}

/// torchtune 0.1's QLoRA model build (`lora_llama2` and friends with `quantize_base=True`,
/// under the recipe's `set_default_dtype(bf16)` on the device) and `load_state_dict`:
///
/// 1. one template layer: each LoRA Linear creates an `nn.Linear` bf16 weight, quantizes it
///    (`to_nf4`) and drops it, then its `lora_a` / `lora_b`; attention first (q, k, v,
///    output), the RoPE cache, the MLP as built (w1, w2, w3), the two RMSNorms;
/// 2. the embedding and the output projection (bf16);
/// 3. `_get_clones`: 32 `copy.deepcopy`s of the template. torchtune's NF4 `clone`
///    dequantizes and quantizes again; `Tensor.__deepcopy__` then replaces the clone's
///    tensors with copies of the template's (the scaler factor compacted to one per 256
///    scalers);
/// 4. the builder returns and the template layer is freed;
/// 5. `load_state_dict`: torchtune's NF4 `copy_` quantizes a device copy of the checkpoint
///    tensor and takes its storages, dropping the old ones.
///
/// Linears without LoRA stay bf16 `nn.Linear`s (copied, and loaded in place).
fn torchtune_nf4_build(model: &ModelSpec, job: &Job) -> CachingAllocator {
    let mut s = Sim(CachingAllocator::new());
    let h = model.hidden_size;
    let r = job.adapter.rank;
    let Some(group) = model.layers.first() else {
        return s.0;
    };
    // torchtune builds the MLP as gate (w1), down (w2), up (w3).
    let rank = |name: &str| match name {
        "gate_proj" => 0,
        "down_proj" => 1,
        "up_proj" => 2,
        _ => 3,
    };
    let mut attention = Vec::new();
    let mut mlp = Vec::new();
    // Every copy of a Linear is its own weight (experts: one per expert).
    for l in &group.linears {
        for _ in 0..l.count.max(1) {
            let lin = TtLinear {
                inp: l.in_features,
                out: l.out_features,
                nf4: job.adapts(l),
            };
            if l.role == LinearRole::Attention {
                attention.push(lin);
            } else {
                mlp.push((rank(&l.name), lin));
            }
        }
    }
    mlp.sort_by_key(|m| m.0);
    let mlp: Vec<TtLinear> = mlp.into_iter().map(|m| m.1).collect();
    let lora = |s: &mut Sim, l: &TtLinear| {
        if l.nf4 {
            vec![s.a(r * l.inp * 2), s.a(l.out * r * 2)]
        } else {
            vec![]
        }
    };
    // RoPE: fp32 `theta`, then `build_rope_cache`: positions, `idx_theta`, cos and sin,
    // stacked into the cache (`position_embeddings.py`).
    let seq = model.max_position_embeddings.max(1);
    let half = model.head_dim / 2;
    let rope = |s: &mut Sim| {
        let theta = s.a(half * 4);
        let positions = s.a(seq * 4);
        let idx = s.a(seq * half * 4);
        let cos = s.a(seq * half * 4);
        let sin = s.a(seq * half * 4);
        let cache = s.a(seq * half * 2 * 4);
        s.free_all([positions, idx, cos, sin]);
        vec![theta, cache]
    };

    // 1. The template layer.
    let mut template: Vec<Handle> = Vec::new();
    let build = |s: &mut Sim, l: &TtLinear, keep: &mut Vec<Handle>| {
        let n = l.inp * l.out;
        let w = s.a(2 * n);
        if l.nf4 {
            keep.extend(s.quantize(n));
            s.f(w);
        } else {
            keep.push(w);
        }
        keep.extend(lora(s, l));
    };
    for l in &attention {
        build(&mut s, l, &mut template);
    }
    template.extend(rope(&mut s));
    for l in &mlp {
        build(&mut s, l, &mut template);
    }
    template.push(s.a(h * 2));
    template.push(s.a(h * 2));
    // 2. Embedding and output projection.
    let _embedding = s.a(model.vocab_size * h * 2);
    if !model.tie_word_embeddings {
        let _output = s.a(model.vocab_size * h * 2);
    }
    // 3. The clones.
    let mut adapters: Vec<Handle> = Vec::new();
    let clone = |s: &mut Sim, l: &TtLinear, adapters: &mut Vec<Handle>| -> Vec<Handle> {
        let n = l.inp * l.out;
        let weight = if l.nf4 {
            let w = s.dequantize(n);
            let fresh = s.quantize(n);
            s.f(w);
            let copies = vec![
                s.a(n / 64),
                s.a(n / 16_384 * 2),
                s.a(2),
                s.a(n / 2),
                s.a(32),
            ];
            s.free_all(fresh);
            copies
        } else {
            vec![s.a(2 * n)]
        };
        adapters.extend(lora(s, l));
        weight
    };
    let mut layers: Vec<Vec<Vec<Handle>>> = Vec::new();
    let mut small = Vec::new();
    for _ in 0..model.num_layers {
        small.push(s.a(h * 2));
        let mut built: Vec<Vec<Handle>> = attention
            .iter()
            .map(|l| clone(&mut s, l, &mut adapters))
            .collect();
        small.extend([s.a(half * 4), s.a(seq * half * 2 * 4)]);
        small.push(s.a(h * 2));
        built.extend(mlp.iter().map(|l| clone(&mut s, l, &mut adapters)));
        layers.push(built);
    }
    small.push(s.a(h * 2));
    // 4. The template goes.
    s.free_all(template);
    // 5. load_state_dict.
    for built in &mut layers {
        for (b, l) in built.iter_mut().zip(attention.iter().chain(mlp.iter())) {
            if !l.nf4 {
                continue;
            }
            let n = l.inp * l.out;
            let src = s.a(2 * n);
            let fresh = s.quantize(n);
            s.f(src);
            let old = std::mem::replace(b, fresh);
            s.free_all(old);
        }
    }
    s.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One 4096 × 4096 weight: its NF4 storages are the packed data (n/2), the int8 scalers
    /// (n/64), their bf16 factors over the expanded view (n/32), the mean and the table; the
    /// peak inside is the bf16 input, `blocks / scales` and the two n × 16 bf16 differences.
    #[test]
    fn one_weight_by_hand() {
        let n: u64 = 4096 * 4096;
        let mut s = Sim(CachingAllocator::new());
        let w = s.a(2 * n);
        let parts = s.quantize(n);
        s.f(w);
        // The table and the mean round to 512 bytes each.
        assert_eq!(s.0.allocated(), n / 2 + n / 64 + n / 32 + 512 + 512);
        // At `(value - nf4).abs()`: the input, the kept factor, int8 scalers, table and
        // mean, the new absmax, `blocks / scales` and the two n × 16 bf16 tensors.
        assert_eq!(
            s.0.peak_allocated(),
            2 * n + (n / 32 + n / 64 + 512 + 512) + n / 32 + 2 * n + 32 * n + 32 * n
        );
        s.free_all(parts);
        assert_eq!(s.0.allocated(), 0);
    }
}
