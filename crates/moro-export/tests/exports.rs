//! Exports of the catalog's small models in every format: byte-for-byte snapshots, every key
//! checked against the trainer's own key list (`data/trainer-keys/`), values against the
//! trainer's accepted values, YAML read back by a YAML 1.2 reader and by PyYAML (YAML 1.1).
//!
//! `UPDATE_SNAPSHOTS=1 cargo test -p moro-export` rewrites the snapshots.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use moro_export::{Export, Format, Options, export};

const CASES: &[(&str, &str)] = &[
    (
        "qwen2.5-0.5b-lora",
        "name: qwen-lora\nmodel:\n  base: Qwen/Qwen2.5-0.5B\n  method: lora\n  lora_rank: 16\n  lora_alpha: 32\n  \
         target_modules: [q_proj, k_proj, v_proj, o_proj]\ntraining:\n  micro_batch_size: 4\n  \
         gradient_accumulation_steps: 4\n  max_seq_length: 2048\n  optimizer: adamw_torch_fused\n  \
         gradient_checkpointing: true\n  attention: sdpa\n  learning_rate: 0.0002\n  num_epochs: 3\n  \
         warmup_ratio: 0.03\n  lr_scheduler: cosine\n  dataset: tatsu-lab/alpaca\n",
    ),
    (
        "llama-3.2-1b-instruct-qlora",
        "name: llama-qlora\nmodel:\n  base: meta-llama/Llama-3.2-1B-Instruct\n  method: qlora\n  quantization: nf4-dq\n  \
         lora_rank: 64\n  lora_alpha: 16\n  lora_dropout: 0.1\n  target_modules: all-linear\ntraining:\n  \
         micro_batch_size: 8\n  gradient_accumulation_steps: 2\n  max_seq_length: 4096\n  optimizer: paged_adamw_8bit\n  \
         gradient_checkpointing: true\n  attention: flash\n  stack: trl\n  packing: false\n",
    ),
    (
        "qwen2.5-7b-full-zero3-8gpu",
        "name: qwen7b-full\nmodel:\n  base: Qwen/Qwen2.5-7B\n  method: full\ntraining:\n  micro_batch_size: 2\n  \
         gradient_accumulation_steps: 8\n  max_seq_length: 4096\n  optimizer: adamw_torch\n  gradient_checkpointing: true\n  \
         attention: flash\n  learning_rate: 0.00001\n  weight_decay: 0.1\n  output_dir: /ckpt/qwen7b\n\
         parallel:\n  gpus: 8\n  strategy: zero3\n  offload: optimizer\n",
    ),
    (
        "llama-3.1-8b-lora-fsdp-4gpu",
        "model:\n  base: meta-llama/Llama-3.1-8B\n  method: lora\ntraining:\n  micro_batch_size: 1\n  \
         gradient_accumulation_steps: 16\n  max_seq_length: 8192\n  optimizer: sgd_momentum\n  precision: fp16-mixed\n  \
         loss: fused\n  dataset: ./data/train.jsonl\nparallel:\n  gpus: 4\n  strategy: fsdp_full_shard\n",
    ),
    (
        "qwen2.5-7b-full-zero3-2x8gpu",
        "name: qwen7b-full-2-nodes\nmodel:\n  base: Qwen/Qwen2.5-7B\n  method: full\ntraining:\n  micro_batch_size: 2\n  \
         gradient_accumulation_steps: 4\n  max_seq_length: 4096\n  optimizer: adamw_torch\n  gradient_checkpointing: true\n  \
         attention: flash\n  dataset: tatsu-lab/alpaca\n  output_dir: /ckpt/qwen7b\n\
         parallel:\n  gpus: 16\n  nodes: 2\n  strategy: zero3\n",
    ),
    (
        "llama-3.1-8b-full-hybrid-2x8gpu",
        "name: llama8b-hybrid\nmodel:\n  base: meta-llama/Llama-3.1-8B\n  method: full\ntraining:\n  micro_batch_size: 1\n  \
         gradient_accumulation_steps: 8\n  max_seq_length: 8192\n  gradient_checkpointing: true\n  dataset: tatsu-lab/alpaca\n\
         parallel:\n  gpus: 16\n  nodes: 2\n  strategy: fsdp_hybrid_shard\n",
    ),
    (
        "qwen2.5-1.5b-full-fsdp2-2gpu",
        "model:\n  base: Qwen/Qwen2.5-1.5B\n  method: full\ntraining:\n  micro_batch_size: 2\n  \
         max_seq_length: 2048\n  gradient_checkpointing: true\n  dataset: tatsu-lab/alpaca\n\
         parallel:\n  gpus: 2\n  strategy: fsdp_full_shard\n  fsdp_version: 2\n",
    ),
    (
        "smollm2-135m-full-ddp-2gpu",
        "model:\n  base: HuggingFaceTB/SmolLM2-135M\n  method: full\ntraining:\n  micro_batch_size: 16\n  optimizer: adamw_8bit\n  \
         precision: bf16\nparallel:\n  gpus: 2\n",
    ),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn model(id: &str) -> moro_core::model::ModelSpec {
    let e = moro_core::catalog::find(id).unwrap_or_else(|| panic!("{id} not in the catalog"));
    moro_core::catalog::load(e).unwrap_or_else(|err| panic!("{id}: {err}"))
}

fn exports() -> Vec<(String, Export)> {
    let mut out = Vec::new();
    for (case, text) in CASES {
        let recipe = moro_recipe::parse(text).unwrap_or_else(|e| panic!("{case}: {e}"));
        let m = model(&recipe.model.base);
        for f in Format::ALL {
            match export(f, &recipe, Some(&m), &Options::default()) {
                Ok(e) => out.push(((*case).to_owned(), e)),
                Err(e) => assert!(
                    f == Format::Deepspeed && !case.contains("zero"),
                    "{case} {f}: {e}"
                ),
            }
        }
    }
    out
}

/// A key list: lines that are not comments.
fn list(name: &str) -> BTreeSet<String> {
    let path = root().join("data/trainer-keys").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        text.starts_with("# "),
        "{name}: the first line names the trainer version"
    );
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn yaml_json(text: &str) -> serde_json::Value {
    serde_saphyr::from_str::<serde_json::Value>(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn json_keys(v: &serde_json::Value, prefix: &str, opaque: &[&str], out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.push(p.clone());
                if !opaque.contains(&p.as_str()) {
                    json_keys(v, &p, opaque, out);
                }
            }
        }
        serde_json::Value::Array(items) => {
            for i in items {
                json_keys(i, &format!("{prefix}[]"), opaque, out);
            }
        }
        _ => {}
    }
}

/// Keyword arguments of each multi-line call `name(` ... `)` in a generated script.
fn calls(script: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut cur: Option<(String, Vec<String>)> = None;
    for line in script.lines() {
        if line.starts_with('#') {
            continue;
        }
        if let Some((_, kws)) = &mut cur {
            if line == ")" {
                out.push(cur.take().unwrap_or_default());
            } else if let Some((k, _)) = line.trim_start().split_once('=')
                && !k.contains(['(', '"', ' '])
            {
                kws.push(k.to_owned());
            }
        } else if let Some(head) = line.strip_suffix('(') {
            let name = head.rsplit(" = ").next().unwrap_or(head).to_owned();
            cur = Some((name, Vec::new()));
        }
    }
    out
}

fn check_keys(what: &str, keys: &[String], allowed: &BTreeSet<String>) {
    for k in keys {
        assert!(
            allowed.contains(k),
            "{what}: key `{k}` is not in the trainer's key list"
        );
    }
}

#[test]
fn every_key_is_one_the_trainer_accepts() {
    let bnb = list("bitsandbytes.txt");
    for (case, e) in exports() {
        for f in &e.files {
            let what = format!("{case} {} {}", e.format, f.name);
            if f.name.ends_with(".json") {
                let v: serde_json::Value = serde_json::from_str(&f.content).unwrap_or_default();
                let (allowed, opaque): (_, &[&str]) =
                    if f.name == "ds_config.json" || e.format == Format::Deepspeed {
                        (list("deepspeed.txt"), &[])
                    } else {
                        (
                            list("hf-trainer.txt"),
                            // Keyword arguments of Liger's `apply_liger_kernel_to_*`.
                            &["gradient_checkpointing_kwargs", "liger_kernel_config"],
                        )
                    };
                let mut keys = Vec::new();
                json_keys(&v, "", opaque, &mut keys);
                check_keys(&what, &keys, &allowed);
            } else if f.name.ends_with(".yaml") {
                let v = yaml_json(&f.content);
                let (allowed, opaque): (_, &[&str]) =
                    if f.name == "accelerate.yaml" || e.format == Format::Accelerate {
                        (list("accelerate.txt"), &[])
                    } else if e.format == Format::Mlx {
                        (list("mlx-lm.txt"), &[])
                    } else if e.format == Format::Axolotl {
                        (
                            list("axolotl.txt"),
                            &["bnb_config_kwargs", "gradient_checkpointing_kwargs"],
                        )
                    } else {
                        (list("llamafactory.txt"), &[])
                    };
                let mut keys = Vec::new();
                json_keys(&v, "", opaque, &mut keys);
                check_keys(&what, &keys, &allowed);
                if let Some(serde_json::Value::Object(b)) = v.get("bnb_config_kwargs") {
                    check_keys(&what, &b.keys().cloned().collect::<Vec<_>>(), &bnb);
                }
            } else if f.name.ends_with(".py") {
                let calls = calls(&f.content);
                assert!(
                    calls.iter().any(|(n, _)| n == "SFTConfig"),
                    "{what}: no SFTConfig"
                );
                for (name, kws) in &calls {
                    let (allowed, prefix) = match name.as_str() {
                        "SFTConfig" => (list("trl.txt"), ""),
                        "LoraConfig" => (list("peft-lora.txt"), ""),
                        "BitsAndBytesConfig" => (bnb.clone(), ""),
                        "FastLanguageModel.from_pretrained" => {
                            (list("unsloth.txt"), "from_pretrained.")
                        }
                        "FastLanguageModel.get_peft_model" => {
                            (list("unsloth.txt"), "get_peft_model.")
                        }
                        _ => continue,
                    };
                    let keys: Vec<String> = kws.iter().map(|k| format!("{prefix}{k}")).collect();
                    check_keys(&format!("{what} {name}"), &keys, &allowed);
                }
                if e.format == Format::Trl {
                    let cli = list("trl-cli.txt");
                    let args: Vec<String> = f
                        .content
                        .lines()
                        .filter_map(|l| l.trim_start_matches('#').trim_start().strip_prefix("--"))
                        .map(|a| a.split_whitespace().next().unwrap_or_default().to_owned())
                        .collect();
                    // A run with a dict-only field has no command line, and says so.
                    let said = f
                        .content
                        .contains("No `trl sft` command line says this run");
                    assert!(
                        said || args.contains(&"max_length".to_owned()),
                        "{what}: no --max_length"
                    );
                    check_keys(&format!("{what} trl sft"), &args, &cli);
                }
            }
        }
    }
}

fn values(name: &str) -> BTreeSet<String> {
    list(&format!("values/{name}.txt"))
}

fn s<'a>(v: &'a serde_json::Value, path: &str) -> Option<&'a str> {
    path.split('.')
        .try_fold(v, |v, k| v.get(k))
        .and_then(serde_json::Value::as_str)
}

#[test]
fn values_are_ones_the_trainers_accept() {
    let optim = values("hf-optim");
    let sched = values("hf-lr-scheduler");
    for (case, e) in exports() {
        for f in &e.files {
            let what = format!("{case} {} {}", e.format, f.name);
            let v = if f.name.ends_with(".json") {
                serde_json::from_str(&f.content).unwrap_or_default()
            } else if f.name.ends_with(".yaml") {
                yaml_json(&f.content)
            } else {
                continue;
            };
            let check = |path: &str, set: &BTreeSet<String>| {
                if let Some(x) = s(&v, path) {
                    assert!(
                        set.contains(x),
                        "{what}: {path} = {x} is not an accepted value"
                    );
                }
            };
            check("optim", &optim);
            check("lr_scheduler_type", &sched);
            match (e.format, f.name.as_str()) {
                (_, "accelerate.yaml") | (Format::Accelerate, _) => {
                    check("distributed_type", &values("accelerate-distributed-type"));
                    check(
                        "fsdp_config.fsdp_reshard_after_forward",
                        &values("accelerate-fsdp-sharding-strategy"),
                    );
                    check(
                        "fsdp_config.fsdp_auto_wrap_policy",
                        &values("accelerate-fsdp-auto-wrap-policy"),
                    );
                    check(
                        "fsdp_config.fsdp_state_dict_type",
                        &values("accelerate-fsdp-state-dict-type"),
                    );
                    check(
                        "deepspeed_config.deepspeed_multinode_launcher",
                        &values("accelerate-deepspeed-multinode-launcher"),
                    );
                    let mp = s(&v, "mixed_precision");
                    assert!(
                        mp.is_none() || matches!(mp, Some("no" | "fp16" | "bf16" | "fp8")),
                        "{what}"
                    );
                }
                (_, "ds_config.json") | (Format::Deepspeed, _) => {
                    check(
                        "zero_optimization.offload_optimizer.device",
                        &values("deepspeed-offload-device"),
                    );
                    check(
                        "zero_optimization.offload_param.device",
                        &values("deepspeed-offload-device"),
                    );
                    assert_eq!(
                        s(&v, "train_micro_batch_size_per_gpu"),
                        Some("auto"),
                        "{what}"
                    );
                }
                (Format::Axolotl, _) => {
                    let mut opt = optim.clone();
                    opt.extend(values("axolotl-optimizer-extra"));
                    check("optimizer", &opt);
                    check("lr_scheduler", &sched);
                    check(
                        "attn_implementation",
                        &values("axolotl-attn-implementation"),
                    );
                }
                (Format::Llamafactory, _) => {
                    check("flash_attn", &values("llamafactory-flash-attn"));
                    check(
                        "quantization_method",
                        &values("llamafactory-quantization-method"),
                    );
                    check("template", &values("llamafactory-template"));
                }
                _ => {}
            }
        }
    }
}

#[test]
fn every_moro_optimizer_maps_to_an_hf_optim_name() {
    let optim = values("hf-optim");
    for o in moro_recipe::choices::Optimizer::ALL {
        let text = format!("model:\n  base: Qwen/Qwen2.5-0.5B\ntraining:\n  optimizer: {o}\n");
        let r = moro_recipe::parse(&text).unwrap_or_else(|e| panic!("{e}"));
        let e = export(Format::HfTrainer, &r, None, &Options::default())
            .unwrap_or_else(|e| panic!("{e}"));
        let v: serde_json::Value = serde_json::from_str(&e.files[0].content).unwrap_or_default();
        let name = s(&v, "optim").unwrap_or_default();
        assert!(
            optim.contains(name),
            "{o} exported as optim={name}, which transformers does not accept"
        );
    }
}

#[test]
fn multi_gpu_launch_commands_and_pointers() {
    for (case, e) in exports() {
        let main = &e.files[0].content;
        if case.contains("zero3-8gpu") {
            match e.format {
                Format::Trl | Format::Unsloth => assert_eq!(
                    e.launch,
                    format!("deepspeed --num_gpus 8 {}", e.files[0].name)
                ),
                Format::Llamafactory => {
                    assert!(e.launch.starts_with("FORCE_TORCHRUN=1 NPROC_PER_NODE=8 "))
                }
                Format::Axolotl => assert!(e.launch.contains("--num_processes 8")),
                _ => {}
            }
            if matches!(
                e.format,
                Format::Axolotl
                    | Format::Llamafactory
                    | Format::Trl
                    | Format::HfTrainer
                    | Format::Unsloth
            ) {
                assert!(
                    main.contains("ds_config.json"),
                    "{case} {}: does not point at the DeepSpeed config",
                    e.format
                );
                let ds = e
                    .files
                    .iter()
                    .find(|f| f.name == "ds_config.json")
                    .map(|f| f.content.clone())
                    .unwrap_or_default();
                let v: serde_json::Value = serde_json::from_str(&ds).unwrap_or_default();
                assert_eq!(v["zero_optimization"]["stage"], 3);
                assert_eq!(v["zero_optimization"]["offload_optimizer"]["device"], "cpu");
                assert!(v["zero_optimization"].get("offload_param").is_none());
            }
        }
        if case.contains("fsdp-4gpu")
            && matches!(
                e.format,
                Format::Trl | Format::HfTrainer | Format::Unsloth | Format::Accelerate
            )
        {
            let acc = e
                .files
                .iter()
                .find(|f| f.name.ends_with(".yaml"))
                .map(|f| yaml_json(&f.content))
                .unwrap_or_default();
            assert_eq!(acc["distributed_type"], "FSDP");
            assert_eq!(acc["num_processes"], 4);
            assert_eq!(
                acc["fsdp_config"]["fsdp_reshard_after_forward"],
                "FULL_SHARD"
            );
            assert_eq!(
                acc["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"],
                "LlamaDecoderLayer"
            );
            assert!(
                e.launch
                    .starts_with("accelerate launch --config_file accelerate.yaml")
            );
        }
        if case.contains("ddp-2gpu") && matches!(e.format, Format::Trl | Format::Unsloth) {
            assert_eq!(
                e.launch,
                format!("torchrun --nproc_per_node 2 {}", e.files[0].name)
            );
        }
    }
}

/// The export of one of [`CASES`] in one format.
fn case_export(case: &str, format: Format) -> Export {
    let text = CASES
        .iter()
        .find(|(c, _)| *c == case)
        .map(|(_, t)| *t)
        .unwrap_or_else(|| panic!("no case {case}"));
    let recipe = moro_recipe::parse(text).unwrap_or_else(|e| panic!("{case}: {e}"));
    let m = model(&recipe.model.base);
    export(format, &recipe, Some(&m), &Options::default())
        .unwrap_or_else(|e| panic!("{case} {format}: {e}"))
}

fn file_of<'a>(e: &'a Export, name: &str) -> &'a str {
    e.files
        .iter()
        .find(|f| f.name == name)
        .map(|f| f.content.as_str())
        .unwrap_or_else(|| panic!("{}: no {name}", e.format))
}

/// 16 GPUs on 2 nodes of 8: every launcher gets the node count, 8 processes per node and the
/// node's rank; accelerate's config counts all 16 processes over 2 machines.
#[test]
fn multi_node_launch_commands() {
    let zero3 = "qwen2.5-7b-full-zero3-2x8gpu";
    let torchrun_each_node = "--nnodes 2 --nproc_per_node 8 --node_rank $NODE_RANK \
                              --master_addr $MASTER_ADDR --master_port 29500";
    let machine =
        "--machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR --main_process_port 29500";

    let e = case_export(zero3, Format::Trl);
    assert_eq!(
        e.launch,
        "deepspeed --hostfile hostfile --num_nodes 2 --num_gpus 8 train_trl.py"
    );
    let script = file_of(&e, "train_trl.py");
    assert!(
        script.contains("#   node-0 slots=8\n#   node-1 slots=8\n"),
        "{script}"
    );
    let e = case_export(zero3, Format::Deepspeed);
    assert_eq!(
        e.launch,
        "deepspeed --hostfile hostfile --num_nodes 2 --num_gpus 8 <train.py> --deepspeed ds_config.json"
    );
    assert!(
        e.warnings.iter().any(|w| w.contains("slots=8")),
        "{:?}",
        e.warnings
    );
    let e = case_export(zero3, Format::HfTrainer);
    assert!(
        e.launch
            .starts_with("deepspeed --hostfile hostfile --num_nodes 2 --num_gpus 8 ")
    );

    let e = case_export(zero3, Format::Accelerate);
    assert_eq!(
        e.launch,
        format!("accelerate launch --config_file accelerate.yaml {machine} <train.py>")
    );
    let acc_text = file_of(&e, "accelerate.yaml");
    assert!(acc_text.contains("each node sets its own"), "{acc_text}");
    let acc = yaml_json(acc_text);
    assert_eq!(acc["num_machines"], 2);
    assert_eq!(acc["num_processes"], 16);
    assert_eq!(acc["machine_rank"], 0);
    assert_eq!(acc["main_process_port"], 29500);
    assert!(acc["main_process_ip"].is_string());
    assert_eq!(acc["distributed_type"], "DEEPSPEED");
    assert_eq!(
        acc["deepspeed_config"]["deepspeed_multinode_launcher"],
        "standard"
    );

    let e = case_export(zero3, Format::Llamafactory);
    assert_eq!(
        e.launch,
        "FORCE_TORCHRUN=1 NNODES=2 NODE_RANK=$NODE_RANK MASTER_ADDR=$MASTER_ADDR MASTER_PORT=29500 \
         NPROC_PER_NODE=8 llamafactory-cli train llamafactory.yaml"
    );
    let e = case_export(zero3, Format::Axolotl);
    assert_eq!(
        e.launch,
        format!(
            "accelerate launch --num_processes 16 --num_machines 2 {machine} -m axolotl.cli.train axolotl.yaml"
        )
    );

    let hybrid = "llama-3.1-8b-full-hybrid-2x8gpu";
    for f in [
        Format::Accelerate,
        Format::Trl,
        Format::HfTrainer,
        Format::Llamafactory,
    ] {
        let e = case_export(hybrid, f);
        assert!(
            e.launch.starts_with(&format!(
                "accelerate launch --config_file accelerate.yaml {machine} "
            )),
            "{f}: {}",
            e.launch
        );
        let acc = yaml_json(file_of(&e, "accelerate.yaml"));
        assert_eq!(acc["distributed_type"], "FSDP");
        assert_eq!(acc["num_machines"], 2);
        assert_eq!(acc["num_processes"], 16);
        assert_eq!(acc["machine_rank"], 0);
        assert_eq!(
            acc["fsdp_config"]["fsdp_reshard_after_forward"],
            "HYBRID_SHARD"
        );
        assert!(acc.get("deepspeed_config").is_none());
    }
    let e = case_export(hybrid, Format::Axolotl);
    assert!(
        e.launch.contains(&format!("--num_machines 2 {machine}")),
        "{}",
        e.launch
    );

    // DDP over 2 nodes: torchrun's multi-node form.
    let ddp = "model:\n  base: HuggingFaceTB/SmolLM2-135M\nparallel:\n  gpus: 16\n  nodes: 2\n";
    let r = moro_recipe::parse(ddp).unwrap_or_else(|e| panic!("{e}"));
    let e = export(Format::Trl, &r, None, &Options::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        e.launch,
        format!("torchrun {torchrun_each_node} train_trl.py")
    );

    // No "add the node count" warning once the nodes are given; one node of 16 keeps one.
    for (case, _) in CASES.iter().filter(|(c, _)| c.contains("2x8gpu")) {
        for f in Format::ALL {
            // mlx_lm trains on one device: it says so instead.
            if (f == Format::Deepspeed && !case.contains("zero")) || f == Format::Mlx {
                continue;
            }
            let e = case_export(case, f);
            assert!(
                e.warnings.iter().all(|w| !w.contains("on one node")),
                "{case} {f}: {:?}",
                e.warnings
            );
            assert!(
                e.warnings
                    .iter()
                    .any(|w| w.starts_with("parallel.nodes = 2")),
                "{case} {f}: {:?}",
                e.warnings
            );
        }
    }
    let one =
        "model:\n  base: HuggingFaceTB/SmolLM2-135M\nparallel:\n  gpus: 16\n  strategy: zero3\n";
    let r = moro_recipe::parse(one).unwrap_or_else(|e| panic!("{e}"));
    let e = export(Format::Trl, &r, None, &Options::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(e.launch, "deepspeed --num_gpus 16 train_trl.py");
    assert!(
        e.warnings
            .iter()
            .any(|w| w.contains("parallel.gpus = 16 on one node")),
        "{:?}",
        e.warnings
    );
}

#[test]
fn what_a_trainer_cannot_express_is_reported() {
    let text = "model:\n  base: Qwen/Qwen2.5-0.5B\n  quantization: fp4\n  dora: true\ntraining:\n  loss: chunked\n  \
                stack: torchtune\nparallel:\n  gpus: 4\n  tensor_parallel: 2\n";
    let r = moro_recipe::parse(text).unwrap_or_else(|e| panic!("{e}"));
    let un =
        export(Format::Unsloth, &r, None, &Options::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        un.warnings
            .iter()
            .any(|w| w.contains("fp4") && w.contains("NF4")),
        "{:?}",
        un.warnings
    );
    assert!(
        un.warnings.iter().any(|w| w.contains("tensor_parallel")),
        "{:?}",
        un.warnings
    );
    let ax =
        export(Format::Axolotl, &r, None, &Options::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        ax.warnings
            .iter()
            .any(|w| w.contains("training.loss = chunked")),
        "{:?}",
        ax.warnings
    );
    assert!(
        ax.warnings.iter().any(|w| w.contains("torchtune")),
        "{:?}",
        ax.warnings
    );
    // fp4 is expressible in LLaMA-Factory (quantization_type: fp4) and axolotl (bnb_config_kwargs).
    let lf = export(Format::Llamafactory, &r, None, &Options::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let v = yaml_json(&lf.files[0].content);
    assert_eq!(v["quantization_type"], "fp4");
    assert_eq!(v["use_dora"], true);
    let hf =
        export(Format::HfTrainer, &r, None, &Options::default()).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        hf.warnings.iter().any(|w| w.contains("LoRA")),
        "{:?}",
        hf.warnings
    );
    let ds = export(Format::Deepspeed, &r, None, &Options::default());
    assert_eq!(
        ds.err().and_then(|e| e.field).as_deref(),
        Some("parallel.strategy")
    );
    let inf = moro_recipe::parse("model:\n  base: x/y\n  method: inference\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let err = export(Format::Trl, &inf, None, &Options::default())
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.starts_with("field `model.method`"), "{err}");
}

/// A vision-language recipe is refused with the reason rather than exported as a text-only
/// script that would load the wrong model class and find no images.
#[test]
fn vision_language_recipes_are_refused() {
    let r = moro_recipe::parse("model:\n  base: Qwen/Qwen2.5-VL-3B-Instruct\n  method: lora\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let vlm = model("Qwen/Qwen2.5-VL-3B-Instruct");
    for format in [Format::Trl, Format::Unsloth, Format::Axolotl] {
        let err = export(format, &r, Some(&vlm), &Options::default())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.starts_with("field `model.base`: a vision-language model"),
            "{err}"
        );
    }
    let images = moro_recipe::parse(
        "model:\n  base: x/y\n  method: lora\ntraining:\n  images_per_sample: 2\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(export(Format::Trl, &images, None, &Options::default()).is_err());
}

/// Strings a YAML 1.1 reader turns into booleans, numbers or null unless quoted.
const HOSTILE: &str = "name: \"on\"\nmodel:\n  base: \"yes\"\n  method: lora\n  target_modules: [\"y\", \"null\", \"0755\"]\n\
                       training:\n  dataset: \"3.10\"\n  output_dir: \"1e3\"\n";

#[test]
fn yaml_reads_back_identically_yaml12() {
    let r = moro_recipe::parse(HOSTILE).unwrap_or_else(|e| panic!("{e}"));
    for f in [Format::Axolotl, Format::Llamafactory] {
        let e = export(f, &r, None, &Options::default()).unwrap_or_else(|e| panic!("{e}"));
        let v = yaml_json(&e.files[0].content);
        let key = if f == Format::Axolotl {
            "base_model"
        } else {
            "model_name_or_path"
        };
        assert_eq!(v[key], "yes");
        assert_eq!(v["output_dir"], "1e3");
    }
}

fn pyyaml() -> bool {
    Command::new("python3")
        .args(["-c", "import yaml"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn yaml_reads_back_identically_in_pyyaml() {
    if !pyyaml() {
        eprintln!("note: python3 with PyYAML not found; skipping the YAML 1.1 read-back check");
        return;
    }
    let hostile = moro_recipe::parse(HOSTILE).unwrap_or_else(|e| panic!("{e}"));
    let mut all: Vec<(String, Export)> = exports();
    for f in [Format::Axolotl, Format::Llamafactory, Format::Accelerate] {
        all.push((
            "hostile".to_owned(),
            export(f, &hostile, None, &Options::default()).unwrap_or_else(|e| panic!("{e}")),
        ));
    }
    let dir = std::env::temp_dir().join(format!("moro-export-pyyaml-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_default();
    for (case, e) in &all {
        for f in e.files.iter().filter(|f| f.name.ends_with(".yaml")) {
            let path = dir.join(format!("{case}-{}-{}", e.format, f.name));
            std::fs::write(&path, &f.content).unwrap_or_default();
            let out = Command::new("python3")
                .args([
                    "-c",
                    "import json,sys,yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
                    &path.to_string_lossy(),
                ])
                .output()
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let py: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            assert_eq!(
                py,
                yaml_json(&f.content),
                "{case} {} {}: PyYAML reads it differently",
                e.format,
                f.name
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn scripts_are_valid_python() {
    let ok = Command::new("python3")
        .args(["-c", "import ast"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("note: python3 not found; skipping the Python syntax check");
        return;
    }
    for (case, e) in exports() {
        for f in e.files.iter().filter(|f| f.name.ends_with(".py")) {
            let out = Command::new("python3")
                .args(["-c", "import ast,sys; ast.parse(sys.stdin.read())"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .and_then(|mut c| {
                    use std::io::Write;
                    c.stdin
                        .take()
                        .map(|mut i| i.write_all(f.content.as_bytes()))
                        .transpose()?;
                    c.wait_with_output()
                })
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(
                out.status.success(),
                "{case} {}: {}",
                f.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

#[test]
fn snapshots() {
    let update = std::env::var_os("UPDATE_SNAPSHOTS").is_some_and(|v| v == "1");
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots");
    let mut failures = Vec::new();
    for (case, e) in exports() {
        let dir = base.join(&case).join(e.format.as_str());
        let mut files: Vec<(String, String)> = e
            .files
            .iter()
            .map(|f| (f.name.clone(), f.content.clone()))
            .collect();
        let mut meta = format!("launch: {}\n", e.launch);
        for w in &e.warnings {
            meta.push_str(&format!("warning: {w}\n"));
        }
        files.push(("_launch_and_warnings.txt".to_owned(), meta));
        for (name, content) in files {
            let path = dir.join(&name);
            if update {
                std::fs::create_dir_all(&dir).unwrap_or_default();
                std::fs::write(&path, &content)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            } else {
                match std::fs::read_to_string(&path) {
                    Ok(golden) if golden == content => {}
                    Ok(_) => failures.push(format!("{} differs", path.display())),
                    Err(_) => failures.push(format!("{} is missing", path.display())),
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "snapshots (rerun with UPDATE_SNAPSHOTS=1 to accept):\n{}",
        failures.join("\n")
    );
}

/// A recipe's DeepSpeed bucket reaches ds_config.json; without one it stays "auto"; a
/// non-DeepSpeed strategy warns that it does not use it.
#[test]
fn reduce_bucket_size_is_exported() {
    let with = "model:\n  base: Qwen/Qwen2.5-0.5B\n  method: full\nparallel:\n  gpus: 2\n  strategy: zero2\n  reduce_bucket_size: 200000000\n";
    let recipe = moro_recipe::parse(with).unwrap();
    let m = model(&recipe.model.base);
    let e = export(Format::Deepspeed, &recipe, Some(&m), &Options::default()).unwrap();
    let ds: serde_json::Value = serde_json::from_str(file_of(&e, "ds_config.json")).unwrap();
    assert_eq!(ds["zero_optimization"]["reduce_bucket_size"], 200_000_000);
    let auto = moro_recipe::parse(&with.replace("  reduce_bucket_size: 200000000\n", "")).unwrap();
    let e = export(Format::Deepspeed, &auto, Some(&m), &Options::default()).unwrap();
    let ds: serde_json::Value = serde_json::from_str(file_of(&e, "ds_config.json")).unwrap();
    assert_eq!(ds["zero_optimization"]["reduce_bucket_size"], "auto");
    let ddp = moro_recipe::parse(&with.replace("zero2", "none")).unwrap();
    let e = export(Format::Trl, &ddp, Some(&m), &Options::default()).unwrap();
    assert!(
        e.warnings.iter().any(|w| w.contains("reduce_bucket_size")),
        "{:?}",
        e.warnings
    );
}

/// `training.compile` becomes each trainer's `torch_compile`; Unsloth, which compiles its
/// own kernels, says it is not exported.
#[test]
fn compile_is_exported_as_torch_compile() {
    let text = "model:\n  base: meta-llama/Llama-3.1-8B\n  method: lora\ntraining:\n  compile: true\n  gradient_checkpointing: false\n";
    let recipe = moro_recipe::parse(text).unwrap();
    let m = model(&recipe.model.base);
    let of = |f: Format| export(f, &recipe, Some(&m), &Options::default()).unwrap();
    let hf: serde_json::Value =
        serde_json::from_str(file_of(&of(Format::HfTrainer), "training_args.json")).unwrap();
    assert_eq!(hf["torch_compile"], true, "{hf}");
    for (f, file) in [
        (Format::Axolotl, "axolotl.yaml"),
        (Format::Llamafactory, "llamafactory.yaml"),
    ] {
        let v = yaml_json(file_of(&of(f), file));
        assert_eq!(v["torch_compile"], true, "{f}: {v}");
    }
    assert!(file_of(&of(Format::Trl), "train_trl.py").contains("torch_compile=True"));
    let unsloth = of(Format::Unsloth);
    assert!(!file_of(&unsloth, "train_unsloth.py").contains("torch_compile"));
    assert!(
        unsloth
            .warnings
            .iter()
            .any(|w| w.contains("training.compile")),
        "{:?}",
        unsloth.warnings
    );
}

/// A recipe planned on the unsloth stack exports the checkpointing it was estimated with:
/// `"unsloth"` (inputs offloaded to host memory, its default) or `True` (plain), and no
/// warning that another stack was planned.
#[test]
fn unsloth_exports_the_checkpointing_it_estimated() {
    for (offload, expected) in [
        ("", "use_gradient_checkpointing=\"unsloth\""),
        (
            "  activation_offload: false\n",
            "use_gradient_checkpointing=True",
        ),
    ] {
        let text = format!(
            "model:\n  base: meta-llama/Llama-3.1-8B\n  method: qlora\ntraining:\n  stack: unsloth\n{offload}"
        );
        let recipe = moro_recipe::parse(&text).unwrap();
        let m = model(&recipe.model.base);
        let e = export(Format::Unsloth, &recipe, Some(&m), &Options::default()).unwrap();
        let script = file_of(&e, "train_unsloth.py");
        assert!(script.contains(expected), "{offload:?}: {script}");
        assert!(!script.contains("UNSLOTH_RETURN_LOGITS"), "{script}");
        assert!(
            !e.warnings
                .iter()
                .any(|w| w.contains("training.stack") || w.contains("training.loss")),
            "{:?}",
            e.warnings
        );
    }
    // `loss: standard` on the unsloth stack is its full-logits path.
    let text = "model:\n  base: meta-llama/Llama-3.1-8B\n  method: qlora\ntraining:\n  stack: unsloth\n  loss: standard\n";
    let recipe = moro_recipe::parse(text).unwrap();
    let m = model(&recipe.model.base);
    let e = export(Format::Unsloth, &recipe, Some(&m), &Options::default()).unwrap();
    let script = file_of(&e, "train_unsloth.py");
    let env = script
        .find("os.environ[\"UNSLOTH_RETURN_LOGITS\"] = \"1\"")
        .expect(script);
    assert!(
        env < script.find("from unsloth import").unwrap(),
        "{script}"
    );
}
