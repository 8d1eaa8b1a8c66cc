//! One function per format: [`Plan`] in, files, warnings and a launch command out.

use moro_core::job::LossImpl;
use moro_recipe::choices::{Attention, LrScheduler, Method, Precision, Quantization, Strategy};

use crate::json::to_json;
use crate::plan::{ACCELERATE_CONFIG_NAME, DS_CONFIG_NAME, Dist, HOSTFILE_NAME, MASTER_PORT, Plan};
use crate::python::{Py, call, code, literal};
use crate::value::{Map, Value};
use crate::yaml::to_yaml;
use crate::{ExportError, ExportFile};

/// What a format function returns.
pub(crate) struct Out {
    pub(crate) files: Vec<ExportFile>,
    pub(crate) warnings: Vec<String>,
    pub(crate) launch: String,
}

fn file(name: &str, content: String) -> ExportFile {
    ExportFile {
        name: name.to_owned(),
        content,
    }
}

const LOGGING_STEPS: u64 = 10;

// ---------------------------------------------------------------------------------------------
// Launch commands, one node or several

/// How a launcher reaches the nodes of a multi-node run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Launcher {
    /// The same command on every node, each with its own `NODE_RANK` (torchrun, accelerate,
    /// LLaMA-Factory's torchrun).
    EachNode,
    /// The DeepSpeed launcher on node 0 only: it starts the others over ssh (pdsh) from the
    /// hostfile.
    DeepSpeedHostfile,
}

/// `torchrun` for the plan's GPUs. Several nodes: the static multi-node form of
/// `torch.distributed.run`, run on every node (`--nnodes`, `--nproc_per_node`, `--node_rank`,
/// `--master_addr`, `--master_port`).
fn torchrun(p: &Plan<'_>, script: &str) -> String {
    if p.multi_node() {
        format!(
            "torchrun --nnodes {} --nproc_per_node {} --node_rank $NODE_RANK --master_addr \
             $MASTER_ADDR --master_port {MASTER_PORT} {script}",
            p.nodes,
            p.gpus_per_node()
        )
    } else {
        format!("torchrun --nproc_per_node {} {script}", p.dist.gpus())
    }
}

/// The DeepSpeed launcher for the plan's GPUs. Several nodes: `--hostfile`, `--num_nodes`
/// (the first N hosts of the hostfile) and `--num_gpus` ("max number of GPUs to use on each
/// node"), as `deepspeed/launcher/runner.py` names them.
fn deepspeed_launch(p: &Plan<'_>, script: &str) -> String {
    if p.multi_node() {
        format!(
            "deepspeed --hostfile {HOSTFILE_NAME} --num_nodes {} --num_gpus {} {script}",
            p.nodes,
            p.gpus_per_node()
        )
    } else {
        format!("deepspeed --num_gpus {} {script}", p.dist.gpus())
    }
}

/// `accelerate launch` flags that make one node's launch part of a multi-node run
/// (`--machine_rank`, `--main_process_ip`, `--main_process_port` in
/// `accelerate/commands/launch.py`; they override the config file's values). Empty on one node.
fn accelerate_machine_flags(p: &Plan<'_>) -> String {
    if p.multi_node() {
        format!(
            " --machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR --main_process_port \
             {MASTER_PORT}"
        )
    } else {
        String::new()
    }
}

/// `accelerate launch --config_file CONFIG [machine flags] SCRIPT`.
fn accelerate_launch(p: &Plan<'_>, config: &str, script: &str) -> String {
    format!(
        "accelerate launch --config_file {config}{} {script}",
        accelerate_machine_flags(p)
    )
}

/// The node a multi-node accelerate config names as the main one: a placeholder for its
/// address (the launch command's `--main_process_ip $MASTER_ADDR` overrides it).
const MAIN_NODE_PLACEHOLDER: &str = "node-0";

/// Header lines saying how a multi-node launch is run; none on one node.
fn node_header(p: &Plan<'_>, launcher: Launcher) -> Vec<String> {
    if !p.multi_node() {
        return Vec::new();
    }
    let others = match p.nodes - 1 {
        1 => "1 on the other".to_owned(),
        last => format!("1 to {last} on the others"),
    };
    match launcher {
        Launcher::EachNode => vec![format!(
            "{} nodes of {} GPUs: run the command on every node, with NODE_RANK set to the node's \
             rank (0 on the main node, {others}) and MASTER_ADDR to the main node's address.",
            p.nodes,
            p.gpus_per_node()
        )],
        Launcher::DeepSpeedHostfile => {
            let mut v = vec![
                format!(
                    "{} nodes of {} GPUs: run the command on the main node only; the deepspeed \
                     launcher starts the others over passwordless ssh (pdsh).",
                    p.nodes,
                    p.gpus_per_node()
                ),
                format!(
                    "`{HOSTFILE_NAME}` lists the nodes, one `HOST slots=GPUS` line each, the main \
                     node first:"
                ),
            ];
            for i in 0..p.nodes {
                v.push(format!("  node-{i} slots={}", p.gpus_per_node()));
            }
            v
        }
    }
}

/// The warning of a multi-node export: what each node has to do; `None` on one node.
fn node_warning(p: &Plan<'_>, launcher: Launcher) -> Option<String> {
    if !p.multi_node() {
        return None;
    }
    let last = p.nodes - 1;
    Some(match launcher {
        Launcher::EachNode => format!(
            "parallel.nodes = {}: run the launch command on each node with NODE_RANK (0 to {last}) \
             and MASTER_ADDR (the main node's address) set; every node needs the same files",
            p.nodes
        ),
        Launcher::DeepSpeedHostfile => format!(
            "parallel.nodes = {}: run the launch command on the main node only; the deepspeed \
             launcher reaches the other nodes over passwordless ssh, listed in `{HOSTFILE_NAME}` \
             one per line as `HOST slots={}`, the main node first",
            p.nodes,
            p.gpus_per_node()
        ),
    })
}

/// A Python script's multi-node header comment lines (and its warning); empty on one node.
fn script_node_header(p: &Plan<'_>, warnings: &mut Vec<String>) -> String {
    let launcher = script_launcher(p);
    warnings.extend(node_warning(p, launcher));
    node_header(p, launcher)
        .iter()
        .map(|l| format!("# {l}\n"))
        .collect()
}

/// The launcher a Python-launched trainer's command uses ([`script_launch`]).
const fn script_launcher(p: &Plan<'_>) -> Launcher {
    match p.dist {
        Dist::Zero { .. } => Launcher::DeepSpeedHostfile,
        _ => Launcher::EachNode,
    }
}

// ---------------------------------------------------------------------------------------------
// DeepSpeed and accelerate

/// DeepSpeed config for the HF integration: sizes and precision flags the Trainer fills from
/// its own arguments are `"auto"`, so the two never disagree.
fn deepspeed_value(
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
fn accelerate_mixed_precision(p: &Plan<'_>) -> &'static str {
    match p.precision {
        Precision::Bf16Mixed => "bf16",
        Precision::Fp16Mixed => "fp16",
        Precision::Bf16 | Precision::Fp32 => "no",
    }
}

/// accelerate config (`accelerate launch --config_file`), as `accelerate config` writes it.
fn accelerate_value(p: &Plan<'_>, warnings: &mut Vec<String>) -> Value {
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
            ..
        } => {
            let mut f = Map::new();
            f.set("fsdp_activation_checkpointing", false);
            f.set("fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP");
            f.set("fsdp_backward_prefetch", "BACKWARD_PRE");
            f.set("fsdp_cpu_ram_efficient_loading", true);
            f.set("fsdp_forward_prefetch", false);
            f.set("fsdp_offload_params", offload_params);
            // FSDP1's sharding strategy (accelerate ≥ 1.6 spells it fsdp_reshard_after_forward).
            f.set("fsdp_reshard_after_forward", fsdp_strategy_name(strategy));
            f.set(
                "fsdp_state_dict_type",
                if p.is_peft() {
                    "FULL_STATE_DICT"
                } else {
                    "SHARDED_STATE_DICT"
                },
            );
            f.set("fsdp_sync_module_states", true);
            match p.decoder_layer_class() {
                Some(c) => f.set("fsdp_transformer_layer_cls_to_wrap", c),
                None => warnings.push(
                    "fsdp_transformer_layer_cls_to_wrap not set (model architecture unknown): \
                     accelerate wraps the model's _no_split_modules"
                        .to_owned(),
                ),
            }
            f.set("fsdp_use_orig_params", true);
            f.set("fsdp_version", 1_u64);
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

const fn fsdp_strategy_name(s: Strategy) -> &'static str {
    match s {
        Strategy::FsdpShardGradOp => "SHARD_GRAD_OP",
        Strategy::FsdpHybridShard => "HYBRID_SHARD",
        _ => "FULL_SHARD",
    }
}

fn ds_file(p: &Plan<'_>) -> Option<ExportFile> {
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
fn accelerate_header(p: &Plan<'_>, config: &str) -> Vec<String> {
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

fn accelerate_file(p: &Plan<'_>, warnings: &mut Vec<String>) -> ExportFile {
    let header = accelerate_header(p, ACCELERATE_CONFIG_NAME);
    file(
        ACCELERATE_CONFIG_NAME,
        to_yaml(&accelerate_value(p, warnings), &header),
    )
}

/// Companion files of a Python-launched trainer (HF / TRL / Unsloth): the DeepSpeed config
/// for ZeRO (the trainer points at it), the accelerate config for FSDP (the launcher does).
fn script_companions(p: &Plan<'_>, warnings: &mut Vec<String>) -> Vec<ExportFile> {
    match p.dist {
        Dist::Zero { .. } => ds_file(p).into_iter().collect(),
        Dist::Fsdp { .. } => vec![accelerate_file(p, warnings)],
        Dist::Single | Dist::Ddp { .. } => Vec::new(),
    }
}

/// How a Python training script is started for the plan's layout.
fn script_launch(p: &Plan<'_>, script: &str) -> String {
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

// ---------------------------------------------------------------------------------------------
// Shared trainer settings

/// Learning rate when the recipe has none.
const fn default_lr(method: Method) -> f64 {
    match method {
        Method::Full => 1e-5,
        _ => 2e-4,
    }
}

fn lr_scheduler(p: &Plan<'_>) -> &'static str {
    p.t.lr_scheduler.map_or("cosine", LrScheduler::as_str)
}

fn epochs(p: &Plan<'_>) -> f64 {
    p.t.num_epochs.unwrap_or(1.0)
}

/// HF TrainingArguments fields shared by the HF, TRL, Unsloth and LLaMA-Factory exports.
fn hf_training_args(p: &Plan<'_>, m: &mut Map, warnings: &mut Vec<String>) {
    m.set("output_dir", &p.output_dir);
    m.set("per_device_train_batch_size", p.t.micro_batch_size);
    m.set(
        "gradient_accumulation_steps",
        p.t.gradient_accumulation_steps,
    );
    m.set("num_train_epochs", epochs(p));
    m.set(
        "learning_rate",
        p.t.learning_rate.unwrap_or_else(|| default_lr(p.method)),
    );
    m.set("lr_scheduler_type", lr_scheduler(p));
    m.set_opt("warmup_steps", p.warmup_steps());
    if p.t.warmup_ratio == Some(1.0) {
        warnings.push(
            "training.warmup_ratio = 1: transformers reads warmup_steps ≥ 1 as a step count; not exported"
                .to_owned(),
        );
    }
    m.set_opt("weight_decay", p.t.weight_decay);
    let (optim, optim_args) = p.hf_optim();
    m.set("optim", optim);
    m.set_opt("optim_args", optim_args);
    let (bf16, fp16) = p.amp();
    m.set("bf16", bf16);
    m.set("fp16", fp16);
    m.set("gradient_checkpointing", p.checkpointing);
    if p.checkpointing {
        let mut k = Map::new();
        k.set("use_reentrant", false);
        m.set("gradient_checkpointing_kwargs", k);
    }
    if p.loss == LossImpl::Fused {
        m.set("use_liger_kernel", true);
    }
    if matches!(p.dist, Dist::Zero { .. }) {
        m.set("deepspeed", DS_CONFIG_NAME);
    }
    m.set("logging_steps", LOGGING_STEPS);
    m.set("save_strategy", "epoch");
    m.set("report_to", "none");
}

/// The loss a transformers-Trainer-based format computes, with a warning when the recipe
/// asked for one it cannot express.
fn hf_loss_warning(p: &Plan<'_>, trainer: &str, warnings: &mut Vec<String>) {
    match p.loss {
        LossImpl::Standard | LossImpl::StandardLegacy | LossImpl::StandardNoUpcast | LossImpl::Fused => {}
        LossImpl::ChunkedNll => warnings.push(format!(
            "training.loss = chunked-nll (TRL's chunked loss): {trainer} computes the full-logits loss, \
             which needs more memory than predicted"
        )),
        LossImpl::Chunked => warnings.push(format!(
            "training.loss = chunked (litgpt/torchtune): {trainer} computes the full-logits loss, which \
             needs more memory than predicted"
        )),
    }
}

fn stack_warning(p: &Plan<'_>, trainer: &str, warnings: &mut Vec<String>) {
    use moro_recipe::choices::Stack;
    if matches!(p.t.stack, Stack::Litgpt | Stack::Torchtune) {
        warnings.push(format!(
            "training.stack = {}: the recipe was planned for another training stack; {trainer} allocates differently",
            p.t.stack
        ));
    }
}

fn quant_gptq_note(p: &Plan<'_>, trainer: &str, warnings: &mut Vec<String>) {
    if p.quant == Quantization::GptqInt4 {
        warnings.push(format!(
            "model.quantization = gptq-int4: {trainer} reads the GPTQ settings from the checkpoint's \
             quantization_config; model.base must be a GPTQ checkpoint"
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// axolotl

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
        m.set("lora_r", p.lora.rank);
        m.set("lora_alpha", p.alpha());
        m.set("lora_dropout", p.lora.dropout);
        if p.all_linear() {
            m.set("lora_target_linear", true);
        } else {
            m.set("lora_target_modules", Value::from(p.target_names().0));
        }
        if p.lora.dora {
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
    if p.t.packing && p.t.attention == Attention::Eager {
        w.push("training.packing with eager attention: axolotl packs only with flash/sdpa-style kernels".to_owned());
    }
    match p.loss {
        LossImpl::Fused => {
            m.set(
                "plugins",
                Value::from(vec!["axolotl.integrations.liger.LigerPlugin"]),
            );
            w.push(
                "training.loss = fused: enabled axolotl's LigerPlugin; set its `liger_fused_linear_cross_entropy: \
                 true` (a plugin key outside axolotl's core schema)"
                    .to_owned(),
            );
        }
        _ => hf_loss_warning(p, "axolotl", &mut w),
    }
    stack_warning(p, "axolotl", &mut w);

    let mut files = Vec::new();
    match p.dist {
        Dist::Zero { .. } => m.set("deepspeed", DS_CONFIG_NAME),
        Dist::Fsdp {
            strategy,
            offload_params,
            ..
        } => {
            // axolotl's FSDP block (FSDP2: sharding is reshard_after_forward true/false).
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
            f.set(
                "reshard_after_forward",
                strategy != Strategy::FsdpShardGradOp,
            );
            f.set("cpu_ram_efficient_loading", true);
            if strategy == Strategy::FsdpHybridShard {
                w.push(
                    "parallel.strategy = fsdp_hybrid_shard: axolotl's FSDP2 config has no hybrid sharding; \
                     exported as full sharding"
                        .to_owned(),
                );
            }
            m.set("fsdp_version", 2_u64);
            m.set("fsdp_config", f);
        }
        Dist::Single | Dist::Ddp { .. } => {}
    }
    m.set("logging_steps", LOGGING_STEPS);
    m.set("save_strategy", "epoch");

    let mut header = p.header("axolotl config");
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
    header.push(format!("Run: {launch}"));
    header.extend(node_header(p, Launcher::EachNode));
    w.extend(node_warning(p, Launcher::EachNode));
    files.insert(0, file(main, to_yaml(&Value::Map(m), &header)));
    files.extend(ds_file(p));
    Ok(Out {
        files,
        warnings: w,
        launch,
    })
}

/// `ds_type` for a local data file, from its extension.
fn local_data_type(path: &str) -> Option<&'static str> {
    let lower = path.to_ascii_lowercase();
    if lower.ends_with(".jsonl") || lower.ends_with(".json") {
        Some("json")
    } else if lower.ends_with(".csv") {
        Some("csv")
    } else if lower.ends_with(".parquet") {
        Some("parquet")
    } else {
        None
    }
}

// ---------------------------------------------------------------------------------------------
// LLaMA-Factory

/// LLaMA-Factory chat template for a model (base and instruct use the same one).
fn llamafactory_template(p: &Plan<'_>) -> Option<&'static str> {
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
        m.set("lora_rank", p.lora.rank);
        m.set("lora_alpha", p.alpha());
        m.set("lora_dropout", p.lora.dropout);
        m.set(
            "lora_target",
            if p.all_linear() {
                "all".to_owned()
            } else {
                p.target_names().0.join(",")
            },
        );
        if p.lora.dora {
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
    ] {
        hf.0.retain(|(key, _)| key != k);
    }
    if !p.checkpointing {
        m.set("disable_gradient_checkpointing", true);
    }
    if p.loss == LossImpl::Fused {
        m.set("enable_liger_kernel", true);
    } else {
        hf_loss_warning(p, "LLaMA-Factory", &mut w);
    }
    if p.precision == Precision::Bf16 {
        m.set("pure_bf16", true);
    }
    stack_warning(p, "LLaMA-Factory", &mut w);
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
    let mut header = p.header("LLaMA-Factory config");
    header.push(format!("Run: {launch}"));
    header.extend(node_header(p, Launcher::EachNode));
    w.extend(node_warning(p, Launcher::EachNode));
    files.insert(0, file(main, to_yaml(&Value::Map(m), &header)));
    files.extend(ds_file(p));
    Ok(Out {
        files,
        warnings: w,
        launch,
    })
}

// ---------------------------------------------------------------------------------------------
// HF Trainer

pub(crate) fn hf_trainer(p: &Plan<'_>, main: &str) -> Result<Out, ExportError> {
    let mut w = Vec::new();
    let mut m = Map::new();
    hf_training_args(p, &mut m, &mut w);
    hf_loss_warning(p, "the HF Trainer", &mut w);
    stack_warning(p, "the HF Trainer", &mut w);
    // What TrainingArguments has no field for: loading and adapting the model, the data.
    w.push(format!(
        "TrainingArguments has no fields for the model: load `{}` with dtype={}, attn_implementation={}{} in your script",
        p.base,
        p.torch_dtype(),
        p.hf_attention(),
        match p.quant {
            Quantization::None => String::new(),
            q => format!(" and quantization {q} (BitsAndBytesConfig)"),
        }
    ));
    if p.is_peft() {
        w.push(format!(
            "TrainingArguments has no fields for LoRA: wrap the model with peft LoraConfig(r={}, lora_alpha={}, \
             lora_dropout={}, target_modules={}{})",
            p.lora.rank,
            literal(&p.alpha()),
            crate::value::float_text(p.lora.dropout),
            if p.all_linear() { "\"all-linear\"".to_owned() } else { literal(&Value::from(p.target_names().0)) },
            if p.lora.dora { ", use_dora=True" } else { "" }
        ));
    }
    w.push(format!(
        "TrainingArguments has no fields for the data: tokenize to max_seq_length = {}{}",
        p.t.max_seq_length,
        if p.t.packing { ", packed" } else { ", padded" }
    ));
    let mut files = vec![file(main, to_json(&Value::Map(m)))];
    files.extend(script_companions(p, &mut w));
    w.extend(node_warning(p, script_launcher(p)));
    Ok(Out {
        files,
        warnings: w,
        launch: script_launch(p, &format!("<train.py> {main}")),
    })
}

// ---------------------------------------------------------------------------------------------
// TRL

/// `load_dataset(...)` for a hub id or a local file.
fn load_dataset_call(dataset: &str) -> String {
    match local_data_type(dataset) {
        Some(kind) => format!(
            "load_dataset({}, data_files={}, split=\"train\")",
            crate::json::string(kind),
            crate::json::string(dataset)
        ),
        None => format!(
            "load_dataset({}, split=\"train\")",
            crate::json::string(dataset)
        ),
    }
}

/// SFTConfig keyword arguments (TRL ≥ 0.20 names: `max_length`, not `max_seq_length`).
fn sft_config_kwargs(p: &Plan<'_>, w: &mut Vec<String>, loss_type: bool) -> Vec<(String, Py)> {
    let mut m = Map::new();
    hf_training_args(p, &mut m, w);
    let mut kw: Vec<(String, Py)> = Vec::new();
    kw.push(("max_length".to_owned(), p.t.max_seq_length.into()));
    kw.push(("packing".to_owned(), p.t.packing.into()));
    if loss_type {
        match p.loss {
            LossImpl::ChunkedNll => kw.push(("loss_type".to_owned(), "chunked_nll".into())),
            LossImpl::Standard | LossImpl::StandardLegacy | LossImpl::StandardNoUpcast => {
                kw.push(("loss_type".to_owned(), "nll".into()))
            }
            LossImpl::Fused => {}
            LossImpl::Chunked => {
                w.push(
                    "training.loss = chunked (litgpt/torchtune): TRL's nearest is loss_type=\"chunked_nll\"; exported as that"
                        .to_owned(),
                );
                kw.push(("loss_type".to_owned(), "chunked_nll".into()));
            }
        }
    }
    for (k, v) in m.0 {
        kw.push((k, Py::Lit(v)));
    }
    kw
}

/// `trl sft` command-line arguments equivalent to the script.
fn trl_cli(p: &Plan<'_>, dataset: &str, sft: &[(String, Py)]) -> Vec<String> {
    let mut a: Vec<(String, String)> = vec![
        ("model_name_or_path".into(), p.base.clone()),
        ("dataset_name".into(), dataset.to_owned()),
        ("dtype".into(), p.torch_dtype().to_owned()),
        ("attn_implementation".into(), p.hf_attention().to_owned()),
    ];
    if p.is_peft() {
        a.push(("use_peft".into(), "true".into()));
        a.push(("lora_r".into(), p.lora.rank.to_string()));
        a.push((
            "lora_alpha".into(),
            crate::value::float_text(p.lora.alpha)
                .trim_end_matches(".0")
                .to_owned(),
        ));
        a.push((
            "lora_dropout".into(),
            crate::value::float_text(p.lora.dropout),
        ));
        let targets = if p.all_linear() {
            vec!["all-linear".to_owned()]
        } else {
            p.target_names().0
        };
        a.push(("lora_target_modules".into(), targets.join(" ")));
        if p.lora.dora {
            a.push(("use_dora".into(), "true".into()));
        }
    }
    if p.bnb4() {
        a.push(("load_in_4bit".into(), "true".into()));
        a.push(("bnb_4bit_quant_type".into(), p.bnb_quant_type().into()));
        a.push(("use_bnb_nested_quant".into(), p.double_quant().to_string()));
    } else if p.int8() {
        a.push(("load_in_8bit".into(), "true".into()));
    }
    for (k, v) in sft {
        let text = match v {
            Py::Lit(Value::Str(s)) => s.clone(),
            Py::Lit(Value::Bool(b)) => b.to_string(),
            Py::Lit(Value::Int(i)) => i.to_string(),
            Py::Lit(Value::Float(f)) => crate::value::float_text(*f),
            Py::Lit(Value::Map(m)) => serde_like_json(m),
            _ => continue,
        };
        a.push((k.clone(), text));
    }
    a.into_iter()
        .map(|(k, v)| format!("--{k} {}", shell_word(&v)))
        .collect()
}

fn serde_like_json(m: &Map) -> String {
    to_json(&Value::Map(m.clone()))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join("")
}

/// A shell word: bare when safe, else single-quoted.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | ':' | '=' | ',')
        })
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn kw(v: &[(String, Py)]) -> Vec<(&str, Py)> {
    v.iter().map(|(k, p)| (k.as_str(), p.clone())).collect()
}

/// `device_map` for a quantized model without sharded parameters: each process its own GPU.
const KBIT_DEVICE_MAP: &str = "{\"\": int(os.environ.get(\"LOCAL_RANK\", \"0\"))}";

pub(crate) fn trl(p: &Plan<'_>, main: &str) -> Result<Out, ExportError> {
    let mut w = Vec::new();
    stack_warning(p, "TRL", &mut w);
    quant_gptq_note(p, "transformers", &mut w);
    let dataset = p.dataset_or("trl-lib/Capybara", &mut w);
    let sft = sft_config_kwargs(p, &mut w, true);
    let launch = script_launch(p, main);

    let mut s = String::new();
    s.push_str(&format!(
        "# TRL SFTTrainer script, written by moro {} from recipe `{}`.\n",
        env!("CARGO_PKG_VERSION"),
        p.name
    ));
    s.push_str("# Edit the recipe and export again rather than editing this file.\n");
    s.push_str(&format!("# Run: {launch}\n"));
    s.push_str(&script_node_header(p, &mut w));
    s.push_str("#\n# The same run with the `trl sft` command line:\n#   trl sft");
    for arg in trl_cli(p, &dataset, &sft) {
        s.push_str(&format!(" \\\n#     {arg}"));
    }
    s.push_str("\n\nimport os\n\nimport torch\nfrom datasets import load_dataset\n");
    if p.is_peft() {
        s.push_str("from peft import LoraConfig\n");
    }
    if p.bnb4() || p.int8() {
        s.push_str("from transformers import AutoModelForCausalLM, BitsAndBytesConfig\n");
    } else {
        s.push_str("from transformers import AutoModelForCausalLM\n");
    }
    s.push_str("from trl import SFTConfig, SFTTrainer\n\n");
    s.push_str(&format!("MODEL = {}\n\n", crate::json::string(&p.base)));

    let mut model_kw: Vec<(&str, Py)> = vec![
        ("dtype", code(format!("torch.{}", p.torch_dtype()))),
        ("attn_implementation", p.hf_attention().into()),
    ];
    if let Some(bnb) = bnb_kwargs(p) {
        s.push_str(&format!(
            "quantization_config = {}\n\n",
            call("BitsAndBytesConfig", &[], &bnb, 0)
        ));
        model_kw.push(("quantization_config", code("quantization_config")));
        if !p.dist.shards_params() {
            model_kw.push(("device_map", code(KBIT_DEVICE_MAP)));
        }
    }
    s.push_str(&format!(
        "model = {}\n\n",
        call(
            "AutoModelForCausalLM.from_pretrained",
            &[code("MODEL")],
            &model_kw,
            0
        )
    ));
    if p.is_peft() {
        s.push_str(&format!(
            "peft_config = {}\n\n",
            call("LoraConfig", &[], &lora_kwargs(p), 0)
        ));
    }
    s.push_str(&format!(
        "training_args = {}\n\n",
        call("SFTConfig", &[], &kw(&sft), 0)
    ));
    s.push_str(&format!("dataset = {}\n\n", load_dataset_call(&dataset)));
    let mut trainer_kw: Vec<(&str, Py)> = vec![
        ("model", code("model")),
        ("args", code("training_args")),
        ("train_dataset", code("dataset")),
    ];
    if p.is_peft() {
        trainer_kw.push(("peft_config", code("peft_config")));
    }
    Ok(sft_script_out(p, main, s, &trainer_kw, w, launch))
}

/// Ends a TRL / Unsloth script with the `SFTTrainer` call, training and saving, and returns
/// it with the launcher companions (DeepSpeed or accelerate config).
fn sft_script_out(
    p: &Plan<'_>,
    main: &str,
    mut s: String,
    trainer_kw: &[(&str, Py)],
    mut w: Vec<String>,
    launch: String,
) -> Out {
    s.push_str(&format!(
        "trainer = {}\n",
        call("SFTTrainer", &[], trainer_kw, 0)
    ));
    s.push_str("trainer.train()\ntrainer.save_model()\n");
    let mut files = vec![file(main, s)];
    files.extend(script_companions(p, &mut w));
    Out {
        files,
        warnings: w,
        launch,
    }
}

fn bnb_kwargs(p: &Plan<'_>) -> Option<Vec<(&'static str, Py)>> {
    if p.bnb4() {
        let mut v: Vec<(&'static str, Py)> = vec![
            ("load_in_4bit", true.into()),
            ("bnb_4bit_quant_type", p.bnb_quant_type().into()),
            ("bnb_4bit_use_double_quant", p.double_quant().into()),
            (
                "bnb_4bit_compute_dtype",
                code(format!("torch.{}", p.torch_dtype())),
            ),
        ];
        if p.dist.shards_params() {
            // ZeRO-3 / FSDP shard the packed 4-bit weights as tensors of the compute dtype.
            v.push((
                "bnb_4bit_quant_storage",
                code(format!("torch.{}", p.torch_dtype())),
            ));
        }
        Some(v)
    } else if p.int8() {
        Some(vec![("load_in_8bit", true.into())])
    } else {
        None
    }
}

fn lora_kwargs(p: &Plan<'_>) -> Vec<(&'static str, Py)> {
    let targets: Py = if p.all_linear() {
        "all-linear".into()
    } else {
        Value::from(p.target_names().0).into()
    };
    let mut v: Vec<(&'static str, Py)> = vec![
        ("r", p.lora.rank.into()),
        ("lora_alpha", Py::Lit(p.alpha())),
        ("lora_dropout", p.lora.dropout.into()),
        ("target_modules", targets),
        ("bias", "none".into()),
        ("task_type", "CAUSAL_LM".into()),
    ];
    if p.lora.dora {
        v.push(("use_dora", true.into()));
    }
    v
}

// ---------------------------------------------------------------------------------------------
// Unsloth

pub(crate) fn unsloth(p: &Plan<'_>, main: &str) -> Result<Out, ExportError> {
    let mut w = Vec::new();
    stack_warning(p, "Unsloth", &mut w);
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
    match p.loss {
        LossImpl::Standard | LossImpl::StandardLegacy | LossImpl::StandardNoUpcast => {}
        _ => w.push(format!(
            "training.loss = {}: Unsloth uses its own fused cross-entropy",
            loss_name(p.loss)
        )),
    }
    let launch = script_launch(p, main);
    let gc: Py = if p.checkpointing {
        "unsloth".into()
    } else {
        false.into()
    };

    let mut s = String::new();
    s.push_str(&format!(
        "# Unsloth script, written by moro {} from recipe `{}`.\n",
        env!("CARGO_PKG_VERSION"),
        p.name
    ));
    s.push_str("# Edit the recipe and export again rather than editing this file.\n");
    s.push_str(&format!("# Run: {launch}\n"));
    s.push_str(&script_node_header(p, &mut w));
    s.push('\n');
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
            ("r", p.lora.rank.into()),
            ("target_modules", Value::from(targets).into()),
            ("lora_alpha", Py::Lit(p.alpha())),
            ("lora_dropout", p.lora.dropout.into()),
            ("bias", "none".into()),
            ("use_gradient_checkpointing", gc),
            ("random_state", 3407_u64.into()),
            ("max_seq_length", p.t.max_seq_length.into()),
        ];
        if p.lora.dora {
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
    s.push_str(&format!("dataset = {}\n\n", load_dataset_call(&dataset)));
    let trainer_kw: Vec<(&str, Py)> = vec![
        ("model", code("model")),
        ("processing_class", code("tokenizer")),
        ("args", code("training_args")),
        ("train_dataset", code("dataset")),
    ];
    Ok(sft_script_out(p, main, s, &trainer_kw, w, launch))
}

const fn loss_name(l: LossImpl) -> &'static str {
    match l {
        LossImpl::Standard => "standard",
        LossImpl::StandardLegacy => "standard-legacy",
        LossImpl::StandardNoUpcast => "standard-no-upcast",
        LossImpl::ChunkedNll => "chunked-nll",
        LossImpl::Chunked => "chunked",
        LossImpl::Fused => "fused",
    }
}
