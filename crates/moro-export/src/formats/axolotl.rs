//! axolotl: one YAML config.

use moro_core::job::FsdpApi;
use moro_recipe::choices::{Attention, Method, Precision, Quantization, Strategy};

use super::*;
use crate::ExportError;
use crate::plan::{DS_CONFIG_NAME, Dist, Plan};
use crate::value::{Map, Value};

pub(crate) fn axolotl(p: &Plan<'_>, main: &str) -> Result<Out, ExportError> {
    let mut w = Vec::new();
    let mut m = Map::new();
    m.set("base_model", &p.base);
    m.set("load_in_8bit", p.int8());
    m.set("load_in_4bit", p.bnb4());
    match p.method {
        Method::Lora if p.bnb4() => m.set("adapter", "qlora"),
        Method::Lora => m.set("adapter", "lora"),
        Method::Qlora if p.bnb4() => m.set("adapter", "qlora"),
        Method::Qlora => m.set("adapter", "lora"),
        Method::Full | Method::Inference => {}
    }
    if p.is_peft() {
        m.set("lora_r", p.adapter.rank);
        m.set("lora_alpha", p.alpha());
        m.set("lora_dropout", p.adapter.dropout);
        if p.all_linear() {
            m.set("lora_target_linear", true);
        } else {
            m.set("lora_target_modules", Value::from(p.target_names().0));
        }
        if p.adapter.dora {
            m.set("peft_use_dora", true);
        }
    }
    if p.bnb4() {
        let mut b = Map::new();
        b.set("bnb_4bit_quant_type", p.bnb_quant_type());
        b.set("bnb_4bit_use_double_quant", p.double_quant());
        m.set("bnb_config_kwargs", b);
    }
    quant_gptq_note(p, "axolotl", &mut w);
    if p.quant == Quantization::GptqInt4 {
        m.set("gptq", true);
    }

    let dataset = p.dataset_or("tatsu-lab/alpaca", &mut w);
    let mut d = Map::new();
    d.set("path", &dataset);
    if let Some(ext) = local_data_type(&dataset) {
        d.set("ds_type", ext);
    }
    d.set("type", "alpaca");
    m.set("datasets", Value::List(vec![Value::Map(d)]));
    w.push(
        "datasets[0].type = alpaca: moro.yaml does not record the dataset's prompt format; set axolotl's \
         `type` to match it (alpaca, chat_template, completion, ...)"
            .to_owned(),
    );
    m.set("dataset_prepared_path", "last_run_prepared");
    m.set("val_set_size", 0.0);
    m.set("output_dir", &p.output_dir);

    m.set("sequence_len", p.t.max_seq_length);
    m.set("sample_packing", p.t.packing);
    m.set("pad_to_sequence_len", p.t.packing);

    m.set("micro_batch_size", p.t.micro_batch_size);
    m.set(
        "gradient_accumulation_steps",
        p.t.gradient_accumulation_steps,
    );
    m.set("num_epochs", epochs(p));
    let (optim, optim_args) = p.hf_optim();
    m.set("optimizer", optim);
    m.set_opt("optim_args", optim_args);
    m.set("lr_scheduler", lr_scheduler(p));
    m.set(
        "learning_rate",
        p.t.learning_rate.unwrap_or_else(|| default_lr(p.method)),
    );
    m.set_opt("warmup_ratio", p.t.warmup_ratio);
    m.set_opt("weight_decay", p.t.weight_decay);

    match p.precision {
        Precision::Bf16Mixed => {
            m.set("bf16", true);
            if p.method == Method::Full {
                w.push(
                    "training.precision = bf16-mixed: axolotl with bf16 loads the model in bf16, so full \
                     fine-tuning trains bf16 weights without fp32 master copies (less memory than predicted)"
                        .to_owned(),
                );
            }
        }
        // DeepSpeed's bf16 mode ([`Plan::amp`]).
        Precision::Bf16 if p.deepspeed() => m.set("bf16", true),
        Precision::Bf16 => {
            m.set("bf16", false);
            m.set("bfloat16", true);
        }
        Precision::Fp16Mixed => {
            m.set("bf16", false);
            m.set("fp16", true);
        }
        Precision::Fp32 => {
            m.set("bf16", false);
            m.set("fp16", false);
        }
    }
    m.set("gradient_checkpointing", p.checkpointing);
    if p.checkpointing {
        let mut k = Map::new();
        k.set("use_reentrant", false);
        m.set("gradient_checkpointing_kwargs", k);
    }
    m.set("attn_implementation", p.hf_attention());
    if p.compile {
        // axolotl passes `torch_compile` to the Trainer's arguments.
        m.set("torch_compile", true);
    }
    if p.t.packing && p.t.attention == Attention::Eager {
        w.push("training.packing with eager attention: axolotl packs only with flash/sdpa-style kernels".to_owned());
    }
    let liger = p.liger_kernels();
    if liger.any() {
        // axolotl's LigerPlugin (`integrations/liger/args.py`) applies only the kernels whose
        // keys are true, before the model is built.
        m.set(
            "plugins",
            Value::from(vec!["axolotl.integrations.liger.LigerPlugin"]),
        );
        m.set("liger_rope", liger.rope);
        m.set("liger_rms_norm", liger.rms_norm);
        m.set("liger_glu_activation", liger.glu);
        m.set(
            "liger_fused_linear_cross_entropy",
            liger.fused_linear_cross_entropy,
        );
    } else {
        hf_loss_warning(p, "axolotl", &mut w);
    }
    stack_warning(p, "axolotl", HF_STACKS, &mut w);

    let files = Vec::new();
    match p.dist {
        Dist::Zero { .. } => m.set("deepspeed", DS_CONFIG_NAME),
        Dist::Fsdp {
            strategy,
            offload_params,
            version,
            ..
        } => {
            // axolotl's FSDP block: `fsdp_config` keys without the `fsdp_` prefix, which
            // axolotl turns into accelerate's FSDP environment (`setup_fsdp_envs`).
            let fsdp2 = version == FsdpApi::Fsdp2;
            let mut f = Map::new();
            f.set("offload_params", offload_params);
            f.set(
                "state_dict_type",
                if p.is_peft() {
                    "FULL_STATE_DICT"
                } else {
                    "SHARDED_STATE_DICT"
                },
            );
            f.set("auto_wrap_policy", "TRANSFORMER_BASED_WRAP");
            f.set_opt("transformer_layer_cls_to_wrap", p.decoder_layer_class());
            f.set("cpu_ram_efficient_loading", true);
            if fsdp2 {
                // FSDP2's sharding is reshard_after_forward true/false.
                f.set(
                    "reshard_after_forward",
                    strategy != Strategy::FsdpShardGradOp,
                );
            } else {
                // axolotl's reshard_after_forward is FSDP2's bool; left out, accelerate's FSDP1
                // takes its default FULL_SHARD.
                f.set("sync_module_states", true);
                f.set("use_orig_params", true);
            }
            // FSDP2 says SHARD_GRAD_OP with reshard_after_forward; the rest become full.
            let kept = strategy == Strategy::FsdpFullShard
                || (fsdp2 && strategy == Strategy::FsdpShardGradOp);
            if !kept {
                w.push(format!(
                    "parallel.strategy = {strategy}: axolotl's FSDP{} config has no such \
                     sharding; exported as full sharding",
                    version.version()
                ));
            }
            m.set("fsdp_version", version.version());
            m.set("fsdp_config", f);
        }
        Dist::Single | Dist::Ddp { .. } => {}
    }
    m.set("logging_steps", LOGGING_STEPS);
    m.set("save_strategy", "epoch");

    let header = p.header("axolotl config");
    let launch = match p.dist {
        Dist::Single => format!("axolotl train {main}"),
        // Without a config file accelerate needs the machine count too (axolotl's
        // docs/multi-node.qmd: the same accelerate settings on every machine).
        d if p.multi_node() => format!(
            "accelerate launch --num_processes {} --num_machines {}{} -m axolotl.cli.train {main}",
            d.gpus(),
            p.nodes,
            accelerate_machine_flags(p)
        ),
        d => format!(
            "accelerate launch --num_processes {} -m axolotl.cli.train {main}",
            d.gpus()
        ),
    };
    Ok(yaml_config_out(p, main, m, header, files, w, launch))
}

// ---------------------------------------------------------------------------------------------
