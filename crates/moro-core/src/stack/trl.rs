//! TRL `SFTTrainer` on the transformers `Trainer`: its defaults differ (checkpointing on,
//! `chunked_nll` from 1.7, bf16 trainables on quantized models from 0.26), the rest is HF's.

use super::{DefaultCheckpointing, DefaultLoss, KbitPrepare, StackProfile};

/// The TRL stack.
pub(super) const PROFILE: StackProfile = StackProfile {
    default_checkpointing: DefaultCheckpointing::On,
    default_loss: DefaultLoss::SftTrainer,
    kbit_prepare: KbitPrepare::SftTrainerLegacy,
    ..super::hf::PROFILE
};
