//! The model as a stack's own model code builds it from a transformers checkpoint.
//!
//! litgpt and torchtune convert the checkpoint into their own modules
//! ([`StackProfile::transformers_modules`] false): where transformers fuses projections into
//! one Linear, their conversion scripts split the weight into one Linear per projection, and
//! each gets its own LoRA (and, in a LoRA layer with dropout, its own dropout mask and copy):
//!
//! - litgpt `scripts/convert_hf_checkpoint.py` `copy_weights_phi3` (@f247be87): Phi-3's
//!   `gate_up_proj` → `mlp.fc_1` and `mlp.fc_2` (`weight.chunk(2, dim=0)`). q, k and v stay
//!   one fused `attn` Linear, but its `LoRAQKVLinear` gives each slice its own rank-r pair
//!   (`lora_A` r·3 × H, `lora_B` by slice) behind one dropout
//!   ([`super::AttentionModule::LitgptFusedQkv`]): three Linears here.
//!   GPT-NeoX's and Falcon's `query_key_value` the same way (`copy_weights_gpt_neox`,
//!   `copy_weights_falcon` keep it fused; `LoRAQKVLinear` adapts only the enabled slices and
//!   `zero_pad`s their output).
//! - torchtune `models/phi3/_convert_weights.py` `phi3_hf_to_tune` (0.6): `qkv_proj` →
//!   `q_proj`, `k_proj`, `v_proj` and `gate_up_proj` → `w1`, `w3`.
//!
//! The parts take transformers' unfused names (`q_proj`, `k_proj`, `v_proj`, `gate_proj`,
//! `up_proj`), so a job's targets, resolved against this model
//! ([`crate::targets::resolve`]), name the slices litgpt's `lora_query` … `lora_mlp` pick.

use std::borrow::Cow;

use super::StackProfile;
use crate::job::{Job, Targets};
use crate::model::{Linear, LinearRole, ModelSpec};

/// `model` as `job`'s stack builds it ([`as_built`]) and `job` with its target names bound
/// to that model's modules ([`crate::targets::resolve`]; a fused name such as
/// `query_key_value` names its parts there). Borrowed when the stack builds transformers'
/// own model.
#[must_use]
pub fn with_job<'a>(model: &'a ModelSpec, job: &'a Job) -> (Cow<'a, ModelSpec>, Cow<'a, Job>) {
    let built = as_built(model, job.stack.profile());
    let job = match (&built, &job.adapter.targets) {
        (Cow::Owned(m), Targets::Names(_)) => {
            let targets = crate::targets::resolve(m, &job.adapter.targets);
            if targets == job.adapter.targets {
                Cow::Borrowed(job)
            } else {
                let mut bound = job.clone();
                bound.adapter.targets = targets;
                Cow::Owned(bound)
            }
        }
        _ => Cow::Borrowed(job),
    };
    (built, job)
}

/// `model` as `profile`'s stack builds it: lm_head untied where the stack unties it, fused
/// gate/up and q/k/v projections split where its model code splits them.
#[must_use]
pub fn as_built<'a>(model: &'a ModelSpec, profile: &StackProfile) -> Cow<'a, ModelSpec> {
    let untie = profile.unties_embeddings && model.tie_word_embeddings;
    let split = !profile.transformers_modules && has_fused(model);
    if !untie && !split {
        return Cow::Borrowed(model);
    }
    let mut built = model.clone();
    if untie {
        built.tie_word_embeddings = false;
    }
    if split {
        let qkv = [model.q_width(), model.kv_width(), model.kv_width()];
        for group in &mut built.layers {
            group.linears = group
                .linears
                .iter()
                .flat_map(|l| match fused(l, model) {
                    Some(Fused::GateUp) => parts(
                        l,
                        &[
                            ("gate_proj", model.intermediate_size),
                            ("up_proj", model.intermediate_size),
                        ],
                    ),
                    Some(Fused::Qkv) => parts(
                        l,
                        &[("q_proj", qkv[0]), ("k_proj", qkv[1]), ("v_proj", qkv[2])],
                    ),
                    None => vec![l.clone()],
                })
                .collect();
        }
    }
    Cow::Owned(built)
}

enum Fused {
    GateUp,
    Qkv,
}

/// transformers' fused projections by name and shape (Phi-3's `gate_up_proj` H → 2I;
/// `qkv_proj`, `query_key_value` H → nh·hd + 2·kv·hd).
fn fused(l: &Linear, model: &ModelSpec) -> Option<Fused> {
    if l.in_features != model.hidden_size || l.count != 1 {
        return None;
    }
    match (l.name.as_str(), l.role) {
        ("gate_up_proj", LinearRole::Mlp) if l.out_features == 2 * model.intermediate_size => {
            Some(Fused::GateUp)
        }
        ("qkv_proj" | "query_key_value", LinearRole::Attention)
            if l.out_features == model.q_width() + 2 * model.kv_width() =>
        {
            Some(Fused::Qkv)
        }
        _ => None,
    }
}

fn has_fused(model: &ModelSpec) -> bool {
    model.linears().any(|(_, l)| fused(l, model).is_some())
}

/// `l` split along its output into the named Linears of `parts` features, the bias shared
/// out the same way.
fn parts(l: &Linear, parts: &[(&str, u64)]) -> Vec<Linear> {
    parts
        .iter()
        .map(|&(name, out)| Linear {
            name: name.to_owned(),
            out_features: out,
            ..l.clone()
        })
        .collect()
}
