//! DeepSpeed and accelerate: their config files, and the two formats that are only those.

use moro_core::job::FsdpApi;
use moro_recipe::choices::{Precision, Strategy};

use super::*;
use crate::json::to_json;
use crate::plan::{ACCELERATE_CONFIG_NAME, DS_CONFIG_NAME, Dist, MASTER_PORT, Plan};
use crate::value::{Map, Value};
use crate::yaml::to_yaml;
use crate::{ExportError, ExportFile};

/// DeepSpeed config for the HF integration: sizes and precision flags the Trainer fills from
/// its own arguments are `"auto"`, so the two never disagree.
pub(super) fn deepspeed_value(
    stage: u8,
    offload_optimizer: bool,
    offload_params: bool,
    reduce_bucket: Option<u64>,
) -> Value {
    let mut z = Map::new();
    z.set("stage", u64::from(stage));
    if offload_optimizer {
        let mut o = Map::new();
        o.set("device", "cpu");
        o.set("pin_memory", true);
        z.set("offload_optimizer", o);
    }
    if offload_params && stage == 3 {
        let mut o = Map::new();
        o.set("device", "cpu");
        o.set("pin_memory", true);
        z.set("offload_param", o);
    }
    z.set("overlap_comm", true);
    z.set("contiguous_gradients", true);
    match reduce_bucket {
        Some(b) => z.set("reduce_bucket_size", b),
        None => z.set("reduce_bucket_size", "auto"),
    }
    if stage == 3 {
        // DeepSpeed's default, written out: moro's estimate of the step's fp32 gradients and
        // of the cache they leave is per sub-group of this many elements.
        z.set("sub_group_size", 1_000_000_000_u64);
        z.set("stage3_prefetch_bucket_size", "auto");
        z.set("stage3_param_persistence_threshold", "auto");
        z.set("stage3_max_live_parameters", 1_000_000_000_u64);
        z.set("stage3_max_reuse_distance", 1_000_000_000_u64);
        z.set("stage3_gather_16bit_weights_on_model_save", true);
    } else {
        z.set("allgather_partitions", true);
        z.set("allgather_bucket_size", 200_000_000_u64);
        z.set("reduce_scatter", true);
    }
    let auto_flag = || {
        let mut m = Map::new();
        m.set("enabled", "auto");
        m
    };
    let mut root = Map::new();
    root.set("bf16", auto_flag());
    root.set("fp16", auto_flag());
    root.set("zero_optimization", z);
    root.set("gradient_accumulation_steps", "auto");
    root.set("gradient_clipping", "auto");
    root.set("train_batch_size", "auto");
    root.set("train_micro_batch_size_per_gpu", "auto");
    root.set("steps_per_print", 100_u64);
    root.set("wall_clock_breakdown", false);
    Value::Map(root)
}

/// accelerate `mixed_precision`.
pub(super) fn accelerate_mixed_precision(p: &Plan<'_>) -> &'static str {
    match p.precision {
        Precision::Bf16Mixed => "bf16",
        Precision::Fp16Mixed => "fp16",
        Precision::Bf16 | Precision::Fp32 => "no",
    }
}

/// accelerate config (`accelerate launch --config_file`), as `accelerate config` writes it.
pub(super) fn accelerate_value(p: &Plan<'_>, warnings: &mut Vec<String>) -> Value {
    let mut m = Map::new();
    m.set("compute_environment", "LOCAL_MACHINE");
    m.set("debug", false);
    match p.dist {
        Dist::Single => {
            m.set("distributed_type", "NO");
            m.set("mixed_precision", accelerate_mixed_precision(p));
        }
        Dist::Ddp { .. } => {
            m.set("distributed_type", "MULTI_GPU");
            m.set("mixed_precision", accelerate_mixed_precision(p));
        }
        Dist::Zero { stage, .. } => {
            // With a config file, accelerate takes precision, accumulation and offload from it
            // and refuses the same settings in its own config.
            let mut d = Map::new();
            d.set("deepspeed_config_file", DS_CONFIG_NAME);
            if p.multi_node() {
                // Several machines: accelerate otherwise hands the launch to the deepspeed
                // launcher with pdsh from one node (`deepspeed_multinode_launcher` defaults to
                // "pdsh"); "standard" runs torchrun on each node with the machine flags
                // (`prepare_deepspeed_cmd_env` in accelerate/utils/launch.py).
                d.set("deepspeed_multinode_launcher", "standard");
            }
            if stage == 3 {
                d.set("zero3_init_flag", true);
            }
            m.set("deepspeed_config", d);
            m.set("distributed_type", "DEEPSPEED");
        }
        Dist::Fsdp {
            strategy,
            offload_params,
            version,
            ..
        } => {
            let fsdp2 = version == FsdpApi::Fsdp2;
            let mut f = Map::new();
            f.set("fsdp_activation_checkpointing", false);
            f.set("fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP");
            if !fsdp2 {
                f.set("fsdp_backward_prefetch", "BACKWARD_PRE");
            }
            f.set("fsdp_cpu_ram_efficient_loading", true);
            if !fsdp2 {
                f.set("fsdp_forward_prefetch", false);
            }
            f.set("fsdp_offload_params", offload_params);
            if fsdp2 {
                // FSDP2 takes a bool (accelerate `FullyShardedDataParallelPlugin`: "Should be a
                // bool if `fsdp_version` is set to 2"); it has no hybrid key of its own.
                f.set(
                    "fsdp_reshard_after_forward",
                    strategy != Strategy::FsdpShardGradOp,
                );
                if strategy == Strategy::FsdpHybridShard {
                    warnings.push(
                        "parallel.strategy = fsdp_hybrid_shard with fsdp_version 2: accelerate's \
                         FSDP2 config has no hybrid sharding; exported as full sharding"
                            .to_owned(),
                    );
                }
            } else {
                // FSDP1's sharding strategy (accelerate ≥ 1.6 spells it
                // fsdp_reshard_after_forward).
                f.set("fsdp_reshard_after_forward", fsdp_strategy_name(strategy));
            }
            f.set(
                "fsdp_state_dict_type",
                if p.is_peft() {
                    "FULL_STATE_DICT"
                } else {
                    "SHARDED_STATE_DICT"
                },
            );
            if !fsdp2 {
                f.set("fsdp_sync_module_states", true);
            }
            match p.decoder_layer_class() {
                Some(c) => f.set("fsdp_transformer_layer_cls_to_wrap", c),
                None => warnings.push(
                    "fsdp_transformer_layer_cls_to_wrap not set (model architecture unknown): \
                     accelerate wraps the model's _no_split_modules"
                        .to_owned(),
                ),
            }
            if !fsdp2 {
                f.set("fsdp_use_orig_params", true);
            }
            f.set("fsdp_version", version.version());
            m.set("distributed_type", "FSDP");
            m.set("fsdp_config", f);
            m.set("mixed_precision", accelerate_mixed_precision(p));
        }
    }
    m.set("downcast_bf16", "no");
    // accelerate's ClusterConfig (`commands/config/config_args.py`): `num_machines`, and
    // `num_processes` over all of them; `machine_rank` is this machine's (each node passes its
    // own with --machine_rank), `main_process_ip` / `main_process_port` the main node's.
    m.set("machine_rank", 0_u64);
    if p.multi_node() {
        m.set("main_process_ip", MAIN_NODE_PLACEHOLDER);
        m.set("main_process_port", MASTER_PORT);
    }
    m.set("main_training_function", "main");
    m.set("num_machines", p.nodes);
    m.set("num_processes", p.dist.gpus());
    m.set("rdzv_backend", "static");
    m.set("same_network", true);
    m.set("use_cpu", false);
    Value::Map(m)
}

pub(super) const fn fsdp_strategy_name(s: Strategy) -> &'static str {
    match s {
        Strategy::FsdpShardGradOp => "SHARD_GRAD_OP",
        Strategy::FsdpHybridShard => "HYBRID_SHARD",
        _ => "FULL_SHARD",
    }
}

pub(super) fn ds_file(p: &Plan<'_>) -> Option<ExportFile> {
    match p.dist {
        Dist::Zero {
            stage,
            offload_optimizer,
            offload_params,
            ..
        } => Some(file(
            DS_CONFIG_NAME,
            to_json(&deepspeed_value(
                stage,
                offload_optimizer,
                offload_params,
                p.reduce_bucket,
            )),
        )),
        _ => None,
    }
}

/// The header lines of an accelerate config: the launch line, and on several nodes how each
/// one sets its rank.
pub(super) fn accelerate_header(p: &Plan<'_>, config: &str) -> Vec<String> {
    let mut header = p.header("accelerate config");
    header.push(accelerate_launch(p, config, "<script>"));
    if p.multi_node() {
        header.extend(node_header(p, Launcher::EachNode));
        header.push(format!(
            "machine_rank and main_process_ip below are the main node's: each node sets its own \
             rank with --machine_rank, and --main_process_ip replaces the {MAIN_NODE_PLACEHOLDER} \
             placeholder."
        ));
    }
    header
}

pub(super) fn accelerate_file(p: &Plan<'_>, warnings: &mut Vec<String>) -> ExportFile {
    let header = accelerate_header(p, ACCELERATE_CONFIG_NAME);
    file(
        ACCELERATE_CONFIG_NAME,
        to_yaml(&accelerate_value(p, warnings), &header),
    )
}

/// Companion files of a Python-launched trainer (HF / TRL / Unsloth): the DeepSpeed config
/// for ZeRO (the trainer points at it), the accelerate config for FSDP (the launcher does).
pub(super) fn script_companions(p: &Plan<'_>, warnings: &mut Vec<String>) -> Vec<ExportFile> {
    match p.dist {
        Dist::Zero { .. } => ds_file(p).into_iter().collect(),
        Dist::Fsdp { .. } => vec![accelerate_file(p, warnings)],
        Dist::Single | Dist::Ddp { .. } => Vec::new(),
    }
}

/// How a Python training script is started for the plan's layout.
pub(super) fn script_launch(p: &Plan<'_>, script: &str) -> String {
    match p.dist {
        Dist::Single => format!("python {script}"),
        Dist::Ddp { .. } => torchrun(p, script),
        Dist::Zero { .. } => deepspeed_launch(p, script),
        Dist::Fsdp { .. } => accelerate_launch(p, ACCELERATE_CONFIG_NAME, script),
    }
}

pub(crate) fn deepspeed(p: &Plan<'_>, main: &str) -> Result<Out, ExportError> {
    let Dist::Zero {
        stage,
        offload_optimizer,
        offload_params,
        ..
    } = p.dist
    else {
        return Err(ExportError::field(
            "parallel.strategy",
            "a DeepSpeed config needs parallel.strategy zero1, zero2 or zero3 (and parallel.gpus > 1); \
             use --to accelerate for DDP or FSDP",
        ));
    };
    let content = to_json(&deepspeed_value(
        stage,
        offload_optimizer,
        offload_params,
        p.reduce_bucket,
    ));
    Ok(Out {
        files: vec![file(main, content)],
        warnings: node_warning(p, Launcher::DeepSpeedHostfile)
            .into_iter()
            .collect(),
        launch: deepspeed_launch(p, &format!("<train.py> --deepspeed {main}")),
    })
}

pub(crate) fn accelerate(p: &Plan<'_>, main: &str) -> Result<Out, ExportError> {
    let mut warnings: Vec<String> = node_warning(p, Launcher::EachNode).into_iter().collect();
    let header = accelerate_header(p, main);
    let mut files = vec![file(
        main,
        to_yaml(&accelerate_value(p, &mut warnings), &header),
    )];
    files.extend(ds_file(p));
    Ok(Out {
        files,
        warnings,
        launch: accelerate_launch(p, main, "<train.py>"),
    })
}
