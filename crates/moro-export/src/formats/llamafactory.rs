//! LLaMA-Factory: one YAML config for `llamafactory-cli train`.

use moro_recipe::choices::{Attention, Precision};

use super::*;
use crate::ExportError;
use crate::plan::{ACCELERATE_CONFIG_NAME, Dist, MASTER_PORT, Plan};
use crate::value::Map;

/// LLaMA-Factory chat template for a model (base and instruct use the same one).
pub(super) fn llamafactory_template(p: &Plan<'_>) -> Option<&'static str> {
    let base = p.base.to_ascii_lowercase();
    let by_name = [
        ("llama-3", "llama3"),
        ("llama3", "llama3"),
        ("llama-2", "llama2"),
        ("qwen3", "qwen3"),
        ("qwen2", "qwen"),
        ("qwen-", "qwen"),
        ("gemma-3", "gemma3"),
        ("gemma-2", "gemma2"),
        ("gemma", "gemma"),
        ("phi-4", "phi4"),
        ("phi-3", "phi"),
        ("mistral", "mistral"),
        ("mixtral", "mistral"),
        ("smollm2", "smollm2"),
        ("olmo-2", "olmo"),
        ("falcon", "falcon"),
    ];
    by_name
        .iter()
        .find(|(k, _)| base.contains(k))
        .map(|(_, t)| *t)
}

pub(crate) fn llamafactory(p: &Plan<'_>, main: &str) -> Result<Out, ExportError> {
    let mut w = Vec::new();
    let mut m = Map::new();
    m.set("model_name_or_path", &p.base);
    if p.bnb4() || p.int8() {
        m.set("quantization_bit", if p.int8() { 8_u64 } else { 4_u64 });
        m.set("quantization_method", "bnb");
        if p.bnb4() {
            m.set("quantization_type", p.bnb_quant_type());
            m.set("double_quantization", p.double_quant());
        }
    }
    quant_gptq_note(p, "LLaMA-Factory", &mut w);
    m.set(
        "flash_attn",
        match p.t.attention {
            Attention::Flash => "fa2",
            Attention::Sdpa => "sdpa",
            Attention::Eager => "disabled",
        },
    );
    m.set("stage", "sft");
    m.set("do_train", true);
    m.set("finetuning_type", if p.is_peft() { "lora" } else { "full" });
    if p.is_peft() {
        m.set("lora_rank", p.adapter.rank);
        m.set("lora_alpha", p.alpha());
        m.set("lora_dropout", p.adapter.dropout);
        m.set(
            "lora_target",
            if p.all_linear() {
                "all".to_owned()
            } else {
                p.target_names().0.join(",")
            },
        );
        if p.adapter.dora {
            m.set("use_dora", true);
        }
    }
    let dataset = p.dataset_or("alpaca_en_demo", &mut w);
    if p.t.dataset.is_some() {
        w.push(format!(
            "training.dataset = `{dataset}`: LLaMA-Factory takes dataset names registered in \
             data/dataset_info.json; register it there under this name"
        ));
    }
    m.set("dataset", &dataset);
    match llamafactory_template(p) {
        Some(t) => m.set("template", t),
        None => {
            m.set("template", "default");
            w.push(format!(
                "template = default: no LLaMA-Factory chat template known for `{}`",
                p.base
            ));
        }
    }
    m.set("cutoff_len", p.t.max_seq_length);
    m.set("packing", p.t.packing);
    m.set("preprocessing_num_workers", 16_u64);

    let mut hf = Map::new();
    hf_training_args(p, &mut hf, &mut w);
    // LLaMA-Factory turns gradient checkpointing on unless told not to, and sets its kwargs itself.
    for k in [
        "gradient_checkpointing",
        "gradient_checkpointing_kwargs",
        "use_liger_kernel",
        "liger_kernel_config",
    ] {
        hf.0.retain(|(key, _)| key != k);
    }
    if !p.checkpointing {
        m.set("disable_gradient_checkpointing", true);
    }
    let liger = p.liger_kernels();
    if liger.any() {
        // LLaMA-Factory applies the model's defaults, every kernel (`model/model_utils/
        // liger_kernel.py` `apply_liger_kernel`): a subset saves at most what was estimated.
        m.set("enable_liger_kernel", true);
        if liger != moro_core::job::Liger::ALL {
            w.push(format!(
                "training.liger_kernels = {}: LLaMA-Factory's enable_liger_kernel turns on all of \
                 Liger's kernels for the model, which keep no more memory than estimated",
                liger.names().join(", ")
            ));
        }
    } else {
        hf_loss_warning(p, "LLaMA-Factory", &mut w);
    }
    // `pure_bf16` is refused with ZeRO-3 (`hparams/parser.py`); under DeepSpeed `bf16` is its
    // bf16 mode ([`Plan::amp`]), set by the shared arguments.
    if p.precision == Precision::Bf16 && !p.deepspeed() {
        m.set("pure_bf16", true);
    }
    stack_warning(p, "LLaMA-Factory", HF_STACKS, &mut w);
    m.0.extend(hf.0);
    m.set("plot_loss", true);

    let mut files = Vec::new();
    let launch = match p.dist {
        Dist::Single => format!("llamafactory-cli train {main}"),
        // LLaMA-Factory's launcher (src/llamafactory/launcher.py) runs torchrun with NNODES,
        // NODE_RANK, NPROC_PER_NODE, MASTER_ADDR and MASTER_PORT from the environment.
        Dist::Ddp { .. } | Dist::Zero { .. } if p.multi_node() => format!(
            "FORCE_TORCHRUN=1 NNODES={} NODE_RANK=$NODE_RANK MASTER_ADDR=$MASTER_ADDR \
             MASTER_PORT={MASTER_PORT} NPROC_PER_NODE={} llamafactory-cli train {main}",
            p.nodes,
            p.gpus_per_node()
        ),
        Dist::Ddp { n } | Dist::Zero { n, .. } => {
            format!("FORCE_TORCHRUN=1 NPROC_PER_NODE={n} llamafactory-cli train {main}")
        }
        Dist::Fsdp { .. } => {
            files.push(accelerate_file(p, &mut w));
            accelerate_launch(
                p,
                ACCELERATE_CONFIG_NAME,
                &format!("-m llamafactory.launcher {main}"),
            )
        }
    };
    let header = p.header("LLaMA-Factory config");
    Ok(yaml_config_out(p, main, m, header, files, w, launch))
}

// ---------------------------------------------------------------------------------------------
