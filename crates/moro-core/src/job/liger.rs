//! Liger Kernel's Triton kernels, patched into a transformers model (`use_liger_kernel=True`
//! in the HF Trainer and TRL; axolotl's `liger_*` keys; LLaMA-Factory's
//! `enable_liger_kernel`). What each keeps is in docs/liger-kernels.md (liger-kernel 0.8.5).

use serde::{Deserialize, Serialize};

/// Which of Liger's kernels replace the model's PyTorch code. All off: no Liger.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Liger {
    /// `rms_norm`: `LigerRMSNorm` saves its input and one fp32 `rstd` per row instead of
    /// the fp32 copy (and, for a trainable weight, the normalized output) that
    /// transformers' `LlamaRMSNorm` leaves to autograd.
    #[serde(default)]
    pub rms_norm: bool,
    /// `swiglu` / `geglu`: `LigerSiLUMulFunction` / `LigerGELUMulFunction` save the gate
    /// and up projections and recompute the activation in backward, where eager keeps the
    /// activation's output as well.
    #[serde(default)]
    pub glu: bool,
    /// `rope`: q and k rotated in place; nothing more or less is saved (forward transients
    /// only).
    #[serde(default)]
    pub rope: bool,
    /// `fused_linear_cross_entropy`: the model's `lce_forward`; the logits are never
    /// materialized ([`super::LossImpl::Fused`]).
    #[serde(default)]
    pub fused_linear_cross_entropy: bool,
}

/// A kernel's name, as Liger's `apply_liger_kernel_to_*` keyword, with the spellings
/// moro accepts for it.
const NAMES: [(&str, &[&str]); 4] = [
    ("rms_norm", &["rms_norm", "rmsnorm"]),
    ("swiglu", &["swiglu", "geglu", "glu", "glu_activation"]),
    ("rope", &["rope"]),
    (
        "fused_linear_cross_entropy",
        &["fused_linear_cross_entropy", "flce"],
    ),
];

/// Model types that liger-kernel 0.8.5 patches (`MODEL_TYPE_TO_APPLY_LIGER_FN`, restricted
/// to the ones moro reads); on any other, `_apply_liger_kernel_to_instance` changes nothing.
const PATCHED_MODEL_TYPES: [&str; 21] = [
    "deepseek_v2",
    "deepseek_v3",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "gpt_oss",
    "granite",
    "llama",
    "llava",
    "mistral",
    "mixtral",
    "olmo2",
    "olmo3",
    "phi3",
    "qwen2",
    "qwen2_5_vl",
    "qwen2_vl",
    "qwen3",
    "qwen3_moe",
    "smollm3",
];

impl Liger {
    /// Every kernel: what `use_liger_kernel=True` turns on for a Llama-style model
    /// (`apply_liger_kernel_to_llama`'s defaults: rope, rms_norm, swiglu and
    /// fused_linear_cross_entropy on, cross_entropy off).
    pub const ALL: Self = Self {
        rms_norm: true,
        glu: true,
        rope: true,
        fused_linear_cross_entropy: true,
    };

    /// Whether any kernel is on.
    #[must_use]
    pub const fn any(self) -> bool {
        self.rms_norm || self.glu || self.rope || self.fused_linear_cross_entropy
    }

    /// The kernels that are on, by Liger's keyword names.
    #[must_use]
    pub fn names(self) -> Vec<&'static str> {
        let on = [
            self.rms_norm,
            self.glu,
            self.rope,
            self.fused_linear_cross_entropy,
        ];
        NAMES
            .iter()
            .zip(on)
            .filter(|(_, on)| *on)
            .map(|((name, _), _)| *name)
            .collect()
    }

    /// The kernels named in `names` (Liger's keywords or moro's spellings).
    ///
    /// # Errors
    /// No name, or an unknown one, with the known ones.
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Result<Self, String> {
        let known = || NAMES.map(|(n, _)| n).join(", ");
        if names.is_empty() {
            return Err(format!("names no kernel; known: {}", known()));
        }
        let mut out = Self::default();
        for raw in names {
            let name = raw.as_ref().trim().to_ascii_lowercase().replace('-', "_");
            let Some(i) = NAMES
                .iter()
                .position(|(_, spellings)| spellings.contains(&name.as_str()))
            else {
                return Err(format!(
                    "`{}` is not a Liger kernel moro models; known: {}",
                    raw.as_ref(),
                    known()
                ));
            };
            match i {
                0 => out.rms_norm = true,
                1 => out.glu = true,
                2 => out.rope = true,
                _ => out.fused_linear_cross_entropy = true,
            }
        }
        Ok(out)
    }

    /// Whether liger-kernel 0.8.5 patches `model_type` where moro has not traced its kernels
    /// (`apply_liger_kernel_to_mllama`, `apply_liger_kernel_to_qwen3_next`).
    #[must_use]
    pub fn patches_untraced(model_type: &str) -> bool {
        matches!(model_type, "mllama" | "qwen3_next")
    }

    /// Whether liger-kernel 0.8.5 has kernels for `model_type`.
    #[must_use]
    pub fn patches(model_type: &str) -> bool {
        PATCHED_MODEL_TYPES.contains(&model_type)
    }

    /// Whether the Trainer's instance patch (`_apply_liger_kernel_to_instance`) swaps the
    /// attention's `q_norm` and `k_norm` for `LigerRMSNorm` too: liger-kernel 0.8.5
    /// `apply_liger_kernel_to_qwen3` / `_qwen3_moe` / `_gemma3_text` patch
    /// `decoder_layer.self_attn.q_norm` and `k_norm`; Olmo 2/3 reach them only through the
    /// class swap, which a model already built does not see (docs/liger-kernels.md).
    #[must_use]
    pub fn patches_qk_norm(model_type: &str) -> bool {
        matches!(model_type, "qwen3" | "qwen3_moe" | "gemma3_text")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_spellings() {
        assert_eq!(
            Liger::ALL.names(),
            ["rms_norm", "swiglu", "rope", "fused_linear_cross_entropy"]
        );
        let l = Liger::from_names(&["RMSNorm", "geglu", "flce"]).unwrap();
        assert!(l.rms_norm && l.glu && l.fused_linear_cross_entropy && !l.rope);
        assert_eq!(Liger::from_names(&l.names()).unwrap(), l);
        let err = Liger::from_names(&["layer_norm"]).unwrap_err();
        assert!(err.contains("known: rms_norm, swiglu"), "{err}");
        assert!(!Liger::default().any());
        let empty: [&str; 0] = [];
        assert!(
            Liger::from_names(&empty)
                .unwrap_err()
                .contains("names no kernel")
        );
    }

    #[test]
    fn model_types_liger_leaves_alone() {
        assert!(Liger::patches("llama") && Liger::patches("qwen2"));
        // Not in `MODEL_TYPE_TO_APPLY_LIGER_FN` (0.8.5).
        assert!(!Liger::patches("qwen2_moe") && !Liger::patches("glm4_moe"));
        assert!(!Liger::patches("gpt_neox") && !Liger::patches("phi"));
    }
}
