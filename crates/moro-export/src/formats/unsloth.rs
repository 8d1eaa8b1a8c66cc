//! Unsloth: a `FastLanguageModel` + `SFTTrainer` script.

use moro_core::job::LossImpl;
use moro_recipe::choices::{Attention, Method, Quantization, Stack};

use super::*;
use crate::ExportError;
use crate::plan::{Dist, Plan};
use crate::python::{Py, call, code};
use crate::value::Value;

pub(crate) fn unsloth(p: &Plan<'_>, main: &str) -> Result<Out, ExportError> {
    let mut w = Vec::new();
    stack_warning(p, "Unsloth", &[Stack::Unsloth], &mut w);
    quant_gptq_note(p, "Unsloth", &mut w);
    if !matches!(p.dist, Dist::Single | Dist::Ddp { .. }) {
        w.push(format!(
            "parallel.strategy = {}: Unsloth documents single-GPU and DDP training; the ZeRO/FSDP settings \
             are exported for the HF Trainer under it",
            match p.dist {
                Dist::Zero { stage, .. } => format!("zero{stage}"),
                _ => "fsdp".to_owned(),
            }
        ));
    }
    if matches!(
        p.quant,
        Quantization::Fp4 | Quantization::Fp4Dq | Quantization::Nf4
    ) {
        w.push(format!(
            "model.quantization = {}: Unsloth's load_in_4bit is always NF4 with double quantization",
            p.quant
        ));
    }
    if p.t.attention == Attention::Eager {
        w.push("training.attention = eager: Unsloth chooses its own attention kernels".to_owned());
    }
    let dataset = p.dataset_or("yahma/alpaca-cleaned", &mut w);
    let mut sft = sft_config_kwargs(p, &mut w, false);
    // Unsloth checkpoints through get_peft_model / from_pretrained, not the Trainer flag.
    sft.retain(|(k, _)| k != "gradient_checkpointing" && k != "gradient_checkpointing_kwargs");
    // Unsloth patches the same modules and the loss with its own kernels.
    sft.retain(|(k, _)| k != "use_liger_kernel" && k != "liger_kernel_config");
    sft.retain(|(k, _)| k != "torch_compile");
    if p.compile {
        w.push(
            "training.compile: Unsloth compiles its own kernels and patches the model; the \
             Trainer's torch_compile is not exported"
                .to_owned(),
        );
    }
    if p.liger.any() {
        w.push(format!(
            "training.liger_kernels = {}: Unsloth uses its own kernels instead of Liger's; not exported",
            p.liger.names().join(", ")
        ));
    }
    let own = p.t.stack == Stack::Unsloth;
    // On its own stack `loss: standard` is Unsloth's full-logits path, switched on by
    // `UNSLOTH_RETURN_LOGITS=1`, and `loss: fused` its default.
    let return_logits = own && p.loss == LossImpl::Standard;
    match p.loss {
        LossImpl::Standard | LossImpl::StandardLegacy | LossImpl::StandardNoUpcast => {}
        LossImpl::Fused if own => {}
        _ => w.push(format!(
            "training.loss = {}: Unsloth uses its own fused cross-entropy",
            p.loss.as_str()
        )),
    }
    let launch = script_launch(p, main);
    // A recipe planned on the unsloth stack says whether its checkpoints go to host memory
    // (`"unsloth"`) or stay (`True`); one planned on another stack gets Unsloth's default.
    let offload = p.activation_offload || p.t.stack != Stack::Unsloth;
    let gc: Py = match (p.checkpointing, offload) {
        (false, _) => false.into(),
        (true, true) => "unsloth".into(),
        (true, false) => true.into(),
    };

    let mut s = script_header(p, "Unsloth", &launch, &mut w);
    s.push('\n');
    if return_logits {
        s.push_str(
            "import os\n\n# The full-logits loss (`loss: standard`) moro estimated; set before Unsloth loads.\nos.environ[\"UNSLOTH_RETURN_LOGITS\"] = \"1\"\n\n",
        );
    }
    s.push_str(
        "from unsloth import FastLanguageModel  # first: Unsloth patches transformers and TRL\n\n",
    );
    s.push_str("import torch\nfrom datasets import load_dataset\nfrom trl import SFTConfig, SFTTrainer\n\n");
    let mut load: Vec<(&str, Py)> = vec![
        ("model_name", p.base.clone().into()),
        ("max_seq_length", p.t.max_seq_length.into()),
        ("dtype", code(format!("torch.{}", p.torch_dtype()))),
        ("load_in_4bit", p.bnb4().into()),
        ("load_in_8bit", p.int8().into()),
        ("full_finetuning", (p.method == Method::Full).into()),
    ];
    if p.method == Method::Full {
        load.push(("use_gradient_checkpointing", gc.clone()));
    }
    s.push_str(&format!(
        "model, tokenizer = {}\n\n",
        call("FastLanguageModel.from_pretrained", &[], &load, 0)
    ));
    if p.is_peft() {
        let (targets, defaulted) = p.target_names();
        if p.all_linear() && defaulted {
            w.push(
                "model.target_modules = all-linear: Unsloth takes module names; exported as the attention and MLP \
                 projections (the model's architecture was not known)"
                    .to_owned(),
            );
        }
        let mut peft: Vec<(&str, Py)> = vec![
            ("r", p.adapter.rank.into()),
            ("target_modules", Value::from(targets).into()),
            ("lora_alpha", Py::Lit(p.alpha())),
            ("lora_dropout", p.adapter.dropout.into()),
            ("bias", "none".into()),
            ("use_gradient_checkpointing", gc),
            ("random_state", 3407_u64.into()),
            ("max_seq_length", p.t.max_seq_length.into()),
        ];
        if p.adapter.dora {
            peft.push(("use_dora", true.into()));
        }
        s.push_str(&format!(
            "model = {}\n\n",
            call(
                "FastLanguageModel.get_peft_model",
                &[code("model")],
                &peft,
                0
            )
        ));
    }
    s.push_str(&format!(
        "training_args = {}\n\n",
        call("SFTConfig", &[], &kw(&sft), 0)
    ));
    s.push_str(&dataset_lines(&dataset, Some("tokenizer.eos_token")));
    let trainer_kw: Vec<(&str, Py)> = vec![
        ("model", code("model")),
        ("processing_class", code("tokenizer")),
        ("args", code("training_args")),
        ("train_dataset", code("dataset")),
    ];
    Ok(sft_script_out(p, main, s, &trainer_kw, w, launch))
}
