//! Optimizer states and step temporaries (memory-anatomy §6).

use crate::job::{Job, Method, Optimizer, PeftKind};
use crate::model::ModelSpec;

use super::Regime;
use super::weights::{adapter_grad_tensors, lora_tensors};

/// bitsandbytes keeps tensors below this many elements in 32-bit state
/// (`Optimizer2State.init_state`: `if p.numel() < config["min_8bit_size"]`, default 4096).
pub const BNB_MIN_8BIT: u64 = 4096;
/// bitsandbytes 8-bit block size since 0.44 (commit aa57bd8, "Change 8bit optimizer blocksize
/// 2048->256"): one fp32 absmax per 256 elements per state.
pub const BNB_BLOCK: u64 = 256;
/// bitsandbytes pages state buffers of at least this many elements (`get_state_buffer`:
/// `F.get_paged(...)` for `numel >= 1e5`), in CUDA managed memory outside PyTorch's counters.
pub const BNB_PAGED_MIN: u64 = 100_000;

/// One trainable tensor kind: `copies` tensors of `numel` elements each.
#[derive(Debug, Clone, Copy)]
pub struct Trainable {
    /// How many such tensors.
    pub copies: u64,
    /// Elements of each.
    pub numel: u64,
    /// Rows × cols when 2-D (for Adafactor's factored states), else (numel, 1).
    pub shape: (u64, u64),
    /// The token embedding (HF Trainer forces 32-bit states on it for bnb optimizers).
    pub embedding: bool,
}

/// The trainable tensors of the job.
#[must_use]
pub fn trainable_tensors(model: &ModelSpec, job: &Job) -> Vec<Trainable> {
    match job.method {
        Method::Inference => vec![],
        Method::Adapters | Method::QuantizedAdapters if job.adapter.method.is_adapter() => {
            adapter_grad_tensors(model, job.adapter.method)
                .into_iter()
                .map(|(copies, numel)| Trainable {
                    copies,
                    numel,
                    shape: (numel, 1),
                    embedding: false,
                })
                .collect()
        }
        Method::Adapters | Method::QuantizedAdapters => lora_tensors(model, job)
            .into_iter()
            .map(|(copies, shape)| Trainable {
                copies,
                numel: shape.0 * shape.1,
                shape,
                embedding: false,
            })
            .collect(),
        Method::Full => {
            let h = model.hidden_size;
            let mut v = Vec::new();
            for g in &model.layers {
                for l in &g.linears {
                    // A fused weight is one stacked tensor per layer; Linears one per copy.
                    let (copies, stack) = if !job.is_module(l) {
                        (g.count, l.count)
                    } else {
                        (g.count * l.count, 1)
                    };
                    v.push(Trainable {
                        copies,
                        numel: stack * l.weight_numel(),
                        shape: (stack * l.out_features, l.in_features),
                        embedding: false,
                    });
                    if l.bias {
                        v.push(Trainable {
                            copies,
                            numel: stack * l.out_features,
                            shape: (stack * l.out_features, 1),
                            embedding: false,
                        });
                    }
                }
                if g.other_params > 0 {
                    // Norm weights (and biases): 1-D tensors of about h elements each.
                    let pieces = g.other_params.div_ceil(h.max(1));
                    let numel = g.other_params / pieces.max(1);
                    v.push(Trainable {
                        copies: g.count * pieces,
                        numel,
                        shape: (numel, 1),
                        embedding: false,
                    });
                }
            }
            v.push(Trainable {
                copies: 1,
                numel: model.embedding_params(),
                shape: (model.vocab_size, h),
                embedding: true,
            });
            if !model.tie_word_embeddings && model.encoder.is_none() {
                v.push(Trainable {
                    copies: 1,
                    numel: model.lm_head_params(),
                    shape: (model.vocab_size, h),
                    embedding: false,
                });
            }
            if model.position_embeddings > 0 {
                v.push(Trainable {
                    copies: 1,
                    numel: model.position_embeddings * h,
                    shape: (model.position_embeddings, h),
                    embedding: true,
                });
            }
            if let Some(vision) = model
                .vision
                .as_ref()
                .filter(|_| job.vision == crate::job::VisionTraining::Trained)
            {
                // The tower's and projector's Linears, their 1-D norms and biases, and the
                // patch and position embeddings as one piece.
                let groups = vision
                    .layers
                    .iter()
                    .map(|g| (g.count, g.linears.as_slice(), g.other_params))
                    .chain(std::iter::once((1, vision.projector.as_slice(), 0)));
                for (count, linears, other) in groups {
                    for l in linears {
                        v.push(Trainable {
                            copies: count,
                            numel: l.weight_numel(),
                            shape: (l.out_features, l.in_features),
                            embedding: false,
                        });
                        if l.bias {
                            v.push(Trainable {
                                copies: count,
                                numel: l.out_features,
                                shape: (l.out_features, 1),
                                embedding: false,
                            });
                        }
                    }
                    if other > 0 {
                        v.push(Trainable {
                            copies: count,
                            numel: other,
                            shape: (other, 1),
                            embedding: false,
                        });
                    }
                }
                for numel in [vision.embedding_params, vision.projector_other_params] {
                    if numel > 0 {
                        v.push(Trainable {
                            copies: 1,
                            numel,
                            shape: (numel, 1),
                            embedding: false,
                        });
                    }
                }
            }
            if let Some(enc) = &model.encoder {
                // `token_type_embeddings` (an `nn.Embedding`), the pooler's (RoBERTa: the
                // head's) `dense` and the classifier, weights and biases.
                let n = enc.num_labels;
                v.extend([
                    Trainable {
                        copies: 1,
                        numel: enc.type_vocab_size * h,
                        shape: (enc.type_vocab_size, h),
                        embedding: true,
                    },
                    Trainable {
                        copies: 1,
                        numel: h * h,
                        shape: (h, h),
                        embedding: false,
                    },
                    Trainable {
                        copies: 1,
                        numel: n * h,
                        shape: (n, h),
                        embedding: false,
                    },
                    Trainable {
                        copies: 1,
                        numel: h,
                        shape: (h, 1),
                        embedding: false,
                    },
                    Trainable {
                        copies: 1,
                        numel: n,
                        shape: (n, 1),
                        embedding: false,
                    },
                ]);
            }
            if model.final_norm_params > 0 {
                v.push(Trainable {
                    copies: 1,
                    numel: model.final_norm_params,
                    shape: (model.final_norm_params, 1),
                    embedding: false,
                });
            }
            v
        }
    }
}

/// Bytes per element of the trainable parameters (and their gradients).
#[must_use]
pub const fn trainable_bytes(job: &Job, r: &Regime) -> u64 {
    match job.method {
        Method::Full => r.param_bytes,
        _ => r.adapter_bytes,
    }
}

/// State bytes of one tensor, split into (inside PyTorch's allocator, paged/managed).
///
/// - torch AdamW: `exp_avg`/`exp_avg_sq = torch.zeros_like(p)`: 2 × param dtype
///   (`torch/optim/adam.py`).
/// - bnb 8-bit (`Optimizer2State`): uint8 state1/state2 + fp32 absmax per 256 elements;
///   fp32 states below 4096 elements; HF Trainer's 32-bit override for `nn.Embedding`.
/// - bnb 32-bit paged: fp32 state1/state2.
/// - HF Adafactor (`optimization.py`, `beta1=None`): factored fp32 row + column second
///   moments for ≥2-D tensors, a full fp32 `exp_avg_sq` for 1-D ones.
/// - bnb Lion (`Optimizer1State`): one state, fp32 or 8-bit.
/// - SGD with momentum: one buffer in the param dtype.
#[must_use]
pub fn state_bytes(t: &Trainable, opt: Optimizer, param_bytes: u64, r: &Regime) -> (u64, u64) {
    let n = t.numel;
    let paged = opt.is_paged() && n >= BNB_PAGED_MIN;
    let split = |bytes: u64, big_state: u64| {
        if paged {
            (bytes - big_state, big_state)
        } else {
            (bytes, 0)
        }
    };
    let eight_bit_two = |n: u64| 2 * n + 2 * 4 * n.div_ceil(BNB_BLOCK);
    let per = match opt {
        Optimizer::AdamwTorch | Optimizer::AdamwTorchFused => (2 * n * param_bytes, 0),
        Optimizer::Adamw8bit | Optimizer::PagedAdamw8bit => {
            if n < BNB_MIN_8BIT || (t.embedding && r.embedding_states_32bit) {
                split(8 * n, 8 * n)
            } else {
                split(eight_bit_two(n), 2 * n)
            }
        }
        Optimizer::PagedAdamw32bit => split(8 * n, 8 * n),
        Optimizer::Adafactor => {
            if t.shape.1 > 1 {
                (4 * (t.shape.0 + t.shape.1), 0)
            } else {
                (4 * n, 0)
            }
        }
        Optimizer::Lion32bit => (4 * n, 0),
        Optimizer::Lion8bit => {
            if n < BNB_MIN_8BIT {
                (4 * n, 0)
            } else {
                (n + 4 * n.div_ceil(BNB_BLOCK), 0)
            }
        }
        Optimizer::Sgd => (0, 0),
        Optimizer::SgdMomentum => (n * param_bytes, 0),
    };
    (per.0 * t.copies, per.1 * t.copies)
}

/// Optimizer state bytes of the whole job: (inside the allocator, paged).
///
/// AdaLoRA's `RankAllocator.update_ipt` (`tuners/adalora/layer.py`), run by
/// `update_and_allocate` after every optimizer step, keeps `ipt`, `exp_avg_ipt` and
/// `exp_avg_unc` (`torch.zeros_like(p)`, then `(p * p.grad).abs()` and two moving averages)
/// for every adapter parameter: three more fp32-sized copies, counted with the states.
#[must_use]
pub fn states(model: &ModelSpec, job: &Job, r: &Regime) -> (u64, u64) {
    let pb = trainable_bytes(job, r);
    let tensors = trainable_tensors(model, job);
    let (inside, paged) = tensors.iter().fold((0, 0), |acc, t| {
        let s = state_bytes(t, job.optimizer, pb, r);
        (acc.0 + s.0, acc.1 + s.1)
    });
    let importance = if job.method.is_peft() && job.adapter.method == PeftKind::AdaLora {
        3 * pb * tensors.iter().map(|t| t.copies * t.numel).sum::<u64>()
    } else {
        0
    };
    (inside + importance, paged)
}

/// Data-parallel divisor of optimizer states under ZeRO ≥ 1 / FSDP.
#[must_use]
pub fn shard_divisor(job: &Job) -> u64 {
    use crate::job::Sharding;
    match job.parallel.sharding {
        Sharding::None => 1,
        // Sharded within one node, replicated across nodes.
        Sharding::FsdpHybridShard => job.parallel.hybrid_shard_group(),
        _ => job.parallel.data_parallel.max(1),
    }
}

/// The temporaries of one `optimizer.step()` alive together at its worst moment, as
/// (how many, bytes of each).
///
/// - foreach AdamW: `exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)`, a copy of
///   every second moment of the group (torch docs: "the foreach implementation uses ~
///   sizeof(params) more peak memory"), memory-anatomy §6.
/// - fused AdamW and bitsandbytes: in-place kernels, no param-sized temporaries.
/// - HF Adafactor (`optimization.py` `Adafactor.step`, per parameter): `update = (grad**2) +
///   eps` holds `grad**2` and the sum, then the sum and `_approx_sq_grad`'s `torch.mul(r_factor,
///   c_factor)` (or `exp_avg_sq.rsqrt()`): two fp32 tensors of the parameter's size. A 16-bit
///   parameter adds `grad.float()` and `p_data_fp32 = p.float()`: four. The largest parameter
///   sets the peak.
#[must_use]
pub fn step_temporaries(model: &ModelSpec, job: &Job, r: &Regime) -> Vec<(u64, u64)> {
    let pb = trainable_bytes(job, r);
    let tensors = trainable_tensors(model, job);
    match job.optimizer {
        Optimizer::AdamwTorch => tensors.iter().map(|t| (t.copies, t.numel * pb)).collect(),
        Optimizer::Adafactor => {
            let largest = tensors.iter().map(|t| t.numel).max().unwrap_or(0);
            vec![(if pb < 4 { 4 } else { 2 }, 4 * largest)]
        }
        _ => Vec::new(),
    }
}

/// Bytes of the temporaries of `optimizer.step()` ([`step_temporaries`]).
#[must_use]
pub fn step_transient(model: &ModelSpec, job: &Job, r: &Regime) -> u64 {
    step_temporaries(model, job, r)
        .iter()
        .map(|&(n, b)| n * b)
        .sum()
}
