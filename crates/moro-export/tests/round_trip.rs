//! What an export writes, read back as the trainer reads it, is the job moro estimated.

use moro_core::estimate::{DeviceProfile, estimate};
use moro_core::job::{JobSettings, Method, Optimizer, Quantization, Stack, Targets};
use moro_export::{Format, Options, export};

fn model(id: &str) -> moro_core::model::ModelSpec {
    moro_core::catalog::load(moro_core::catalog::find(id).unwrap()).unwrap()
}

/// The job `mlx_lm.lora` runs from a config and its launch line, by mlx-lm 0.32's rules:
/// `max_seq_length` cuts the batch and the model reads all but the last token, a model
/// converted with `-q --q-bits B --q-group-size G` is QLoRA at B bits in groups of G,
/// `lora_parameters.scale` is alpha over rank, no `keys` adapts every Linear of a block,
/// `num_layers: -1` is every layer.
fn mlx_job(yaml: &str, launch: &str) -> JobSettings {
    let v: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
    let flag = |name: &str| -> Option<u64> {
        let mut words = launch.split_whitespace();
        words.find(|w| *w == name)?;
        words.next()?.parse().ok()
    };
    let quantization = match (flag("--q-bits"), flag("--q-group-size")) {
        (Some(bits), Some(group)) => Quantization::ALL.into_iter().find(|q| {
            q.mlx()
                .is_some_and(|a| a.bits == bits && a.group_size == group)
        }),
        _ => None,
    };
    let full = v["fine_tune_type"] == "full";
    let lora = &v["lora_parameters"];
    let rank = lora["rank"].as_u64();
    JobSettings {
        stack: Some(Stack::Mlx),
        method: Some(match (full, quantization) {
            (true, _) => Method::Full,
            (false, Some(_)) => Method::QuantizedAdapters,
            (false, None) => Method::Adapters,
        }),
        quantization: Some(quantization.unwrap_or(Quantization::None)),
        lora_rank: rank,
        #[allow(clippy::cast_precision_loss)]
        lora_alpha: rank.map(|r| lora["scale"].as_f64().unwrap() * r as f64),
        lora_dropout: lora["dropout"].as_f64(),
        dora: Some(v["fine_tune_type"] == "dora"),
        target_modules: (!full).then(|| match lora.get("keys") {
            Some(serde_json::Value::Array(keys)) => Targets::Names(
                keys.iter()
                    .map(|k| k.as_str().unwrap().rsplit('.').next().unwrap().to_owned())
                    .collect(),
            ),
            _ => Targets::AllLinear,
        }),
        micro_batch_size: v["batch_size"].as_u64(),
        grad_accum: v["grad_accumulation_steps"].as_u64(),
        seq_len: v["max_seq_length"].as_u64().map(|s| s - 1),
        gradient_checkpointing: v["grad_checkpoint"].as_bool(),
        optimizer: Some(match v["optimizer"].as_str().unwrap() {
            "adam" | "adamw" => Optimizer::AdamwTorch,
            "sgd" if v["optimizer_config"]["sgd"]["momentum"].is_number() => Optimizer::SgdMomentum,
            "sgd" => Optimizer::Sgd,
            other => panic!("optimizer {other}"),
        }),
        adapted_layers: Some(match v["num_layers"].as_i64().unwrap() {
            -1 => None,
            n => Some(u64::try_from(n).unwrap()),
        }),
        ..JobSettings::default()
    }
}

#[test]
fn the_mlx_config_is_the_job_estimated() {
    let cases = [
        "model:\n  base: Qwen/Qwen3-8B\n  method: qlora\ntraining:\n  stack: mlx\n",
        "model:\n  base: meta-llama/Llama-3.2-3B\n  method: lora\n  lora_rank: 16\n  lora_alpha: 32\n  target_modules: [q_proj, v_proj]\ntraining:\n  stack: mlx\n  micro_batch_size: 4\n  max_seq_length: 1024\n  num_layers: 8\n",
        "model:\n  base: Qwen/Qwen2.5-1.5B\n  method: full\ntraining:\n  stack: mlx\n  gradient_checkpointing: true\n  num_layers: all\n  optimizer: sgd_momentum\n  gradient_accumulation_steps: 4\n",
        "model:\n  base: meta-llama/Llama-3.1-8B\n  method: qlora\n  quantization: mlx-8bit-g32\n  lora_dropout: 0.05\ntraining:\n  stack: mlx\n  max_seq_length: 4096\n",
        "model:\n  base: Qwen/Qwen3-8B\n  method: qlora\n  dora: true\ntraining:\n  stack: mlx\n  max_seq_length: 1024\n",
    ];
    for text in cases {
        let recipe = moro_recipe::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let m = model(&recipe.model.base);
        let e = export(Format::Mlx, &recipe, Some(&m), &Options::default()).unwrap();
        assert!(
            !e.warnings.iter().any(|w| w.contains("training.stack")),
            "{:?}",
            e.warnings
        );
        let planned = recipe.to_job().unwrap();
        let read = mlx_job(&e.files[0].content, &e.launch)
            .resolve_for(&m)
            .unwrap();
        assert_eq!(read.method, planned.method, "{text}");
        assert_eq!(read.quantization, planned.quantization, "{text}");
        assert_eq!(read.adapted_layers, planned.adapted_layers, "{text}");
        assert_eq!(read.seq_len, planned.seq_len, "{text}");
        let d = DeviceProfile::default();
        let planned_job = recipe.settings().unwrap().resolve_for(&m).unwrap();
        assert_eq!(
            estimate(&m, &read, &d).unwrap(),
            estimate(&m, &planned_job, &d).unwrap(),
            "{text}\n{}",
            e.files[0].content
        );
    }
}

/// The keyword arguments of `call(` … `)` in a script moro wrote (one `key=value` a line).
fn kwargs(script: &str, call: &str) -> serde_json::Map<String, serde_json::Value> {
    let start = script
        .find(&format!("{call}("))
        .unwrap_or_else(|| panic!("no {call}(\n{script}"));
    let body = &script[start..];
    let body = &body[..body.find("\n)").unwrap()];
    let mut out = serde_json::Map::new();
    for line in body.lines().skip(1) {
        let Some((k, v)) = line.trim().trim_end_matches(',').split_once('=') else {
            continue;
        };
        let v = match v {
            "True" => serde_json::Value::Bool(true),
            "False" => serde_json::Value::Bool(false),
            v => serde_json::from_str(v).unwrap_or_else(|_| v.into()),
        };
        out.insert(k.to_owned(), v);
    }
    out
}

/// The job Unsloth 2026.8 runs from the script moro exports: `load_in_4bit` is its NF4 with
/// double quantization, `use_gradient_checkpointing="unsloth"` checkpoints to host memory and
/// `True` plainly, `UNSLOTH_RETURN_LOGITS=1` the full logits' loss; the rest are TRL's
/// `SFTConfig` and PEFT's LoRA fields.
fn unsloth_job(script: &str) -> JobSettings {
    let load = kwargs(script, "FastLanguageModel.from_pretrained");
    let peft = kwargs(script, "FastLanguageModel.get_peft_model");
    let sft = kwargs(script, "SFTConfig");
    let ckpt = &peft["use_gradient_checkpointing"];
    let optim = sft["optim"].as_str().unwrap();
    JobSettings {
        stack: Some(Stack::Unsloth),
        method: Some(if load["load_in_4bit"] == true {
            Method::QuantizedAdapters
        } else {
            Method::Adapters
        }),
        quantization: Some(if load["load_in_4bit"] == true {
            Quantization::Nf4Dq
        } else {
            Quantization::None
        }),
        lora_rank: peft["r"].as_u64(),
        lora_alpha: peft["lora_alpha"].as_f64(),
        lora_dropout: peft["lora_dropout"].as_f64(),
        target_modules: Some(Targets::Names(
            peft["target_modules"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str().unwrap().to_owned())
                .collect(),
        )),
        micro_batch_size: sft["per_device_train_batch_size"].as_u64(),
        grad_accum: sft["gradient_accumulation_steps"].as_u64(),
        seq_len: sft["max_length"].as_u64(),
        gradient_checkpointing: Some(*ckpt != false),
        activation_offload: Some(*ckpt == "unsloth"),
        optimizer: Optimizer::ALL.into_iter().find(|o| o.as_str() == optim),
        loss: script
            .contains("os.environ[\"UNSLOTH_RETURN_LOGITS\"] = \"1\"")
            .then_some(moro_core::job::LossImpl::Standard),
        ..JobSettings::default()
    }
}

#[test]
fn the_unsloth_script_is_the_job_estimated() {
    let cases = [
        "model:\n  base: meta-llama/Llama-3.1-8B\n  method: qlora\ntraining:\n  stack: unsloth\n",
        "model:\n  base: Qwen/Qwen2.5-7B\n  method: lora\n  lora_rank: 32\n  target_modules: [q_proj, v_proj]\ntraining:\n  stack: unsloth\n  micro_batch_size: 4\n  max_seq_length: 2048\n  activation_offload: false\n  gradient_accumulation_steps: 4\n",
        "model:\n  base: Qwen/Qwen3-8B\n  method: qlora\ntraining:\n  stack: unsloth\n  loss: standard\n  optimizer: adamw_torch\n",
    ];
    for text in cases {
        let recipe = moro_recipe::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let m = model(&recipe.model.base);
        let e = export(Format::Unsloth, &recipe, Some(&m), &Options::default()).unwrap();
        let script = &e.files[0].content;
        let read = unsloth_job(script).resolve_for(&m).unwrap();
        let planned = recipe.settings().unwrap().resolve_for(&m).unwrap();
        let d = DeviceProfile::default();
        assert_eq!(
            estimate(&m, &read, &d).unwrap(),
            estimate(&m, &planned, &d).unwrap(),
            "{text}\n{script}"
        );
    }
}

/// The job TRL's `SFTTrainer` runs from the script moro exports for PEFT's methods: the
/// `peft_config` class is the method (PEFT 0.21.2 names: `r`, LoHa's and LoKr's `alpha`,
/// `decompose_factor`, `num_virtual_tokens`), `SFTConfig` the batch, length, checkpointing
/// and optimizer, `bf16=True` on a bf16 model the HF Trainer's autocast. Each config was
/// also built and trained one step on a tiny Llama with PEFT 0.21.2 when this was written.
fn trl_peft_job(script: &str) -> JobSettings {
    use moro_core::job::PeftKind;
    let class = [
        "LoraConfig",
        "LoHaConfig",
        "LoKrConfig",
        "OFTConfig",
        "BOFTConfig",
        "VeraConfig",
    ]
    .into_iter()
    .chain(["IA3Config", "LNTuningConfig", "PromptTuningConfig"])
    .chain(["PrefixTuningConfig"])
    .find(|c| script.contains(&format!("peft_config = {c}(")))
    .expect("a PEFT config");
    let peft = kwargs(script, class);
    let sft = kwargs(script, "SFTConfig");
    let kind = match class {
        "LoraConfig" => PeftKind::Lora,
        "LoHaConfig" => PeftKind::LoHa,
        "LoKrConfig" => PeftKind::LoKr,
        "OFTConfig" => PeftKind::Oft,
        "BOFTConfig" => PeftKind::Boft,
        "VeraConfig" => PeftKind::Vera,
        "IA3Config" => PeftKind::Ia3,
        "LNTuningConfig" => PeftKind::LnTuning,
        "PromptTuningConfig" => PeftKind::PromptTuning,
        _ => PeftKind::PrefixTuning,
    };
    let names = |v: &serde_json::Value| {
        v.as_array()
            .map(|a| Targets::Names(a.iter().map(|t| t.as_str().unwrap().to_owned()).collect()))
    };
    let optim = sft["optim"].as_str().unwrap();
    JobSettings {
        stack: Some(Stack::Trl),
        method: Some(Method::Adapters),
        peft: Some(kind),
        lora_rank: peft.get("r").and_then(serde_json::Value::as_u64),
        lora_alpha: peft
            .get("alpha")
            .or_else(|| peft.get("lora_alpha"))
            .and_then(serde_json::Value::as_f64),
        // PEFT's `lora_dropout` and `vera_dropout`; the other methods drop out no input.
        lora_dropout: Some(
            peft.get("lora_dropout")
                .or_else(|| peft.get("vera_dropout"))
                .and_then(serde_json::Value::as_f64)
                .unwrap_or(0.0),
        ),
        target_modules: peft.get("target_modules").and_then(names),
        feedforward_modules: peft.get("feedforward_modules").and_then(names),
        decompose_factor: peft
            .get("decompose_factor")
            .and_then(serde_json::Value::as_u64),
        virtual_tokens: peft
            .get("num_virtual_tokens")
            .and_then(serde_json::Value::as_u64),
        boft_block_size: peft
            .get("boft_block_size")
            .and_then(serde_json::Value::as_u64),
        boft_n_butterfly_factor: peft
            .get("boft_n_butterfly_factor")
            .and_then(serde_json::Value::as_u64),
        micro_batch_size: sft["per_device_train_batch_size"].as_u64(),
        grad_accum: sft["gradient_accumulation_steps"].as_u64(),
        seq_len: sft["max_length"].as_u64(),
        gradient_checkpointing: sft["gradient_checkpointing"].as_bool(),
        precision: (script.contains("dtype=torch.bfloat16") && sft["bf16"] == true)
            .then_some(moro_core::job::Precision::Bf16Mixed),
        optimizer: Optimizer::ALL.into_iter().find(|o| o.as_str() == optim),
        ..JobSettings::default()
    }
}

#[test]
fn the_trl_script_is_the_peft_job_estimated() {
    let head = "model:\n  base: meta-llama/Llama-3.2-3B\n  method: lora\n";
    let train = "training:\n  stack: trl\n  micro_batch_size: 4\n  max_seq_length: 768\n";
    let cases = [
        "  peft: lokr\n  lora_rank: 32\n  lora_alpha: 64\n  decompose_factor: 4\n  target_modules: [q_proj, v_proj]\n",
        "  peft: loha\n  lora_rank: 16\n  target_modules: [q_proj, v_proj]\n",
        "  peft: oft\n  lora_rank: 32\n  target_modules: [q_proj, v_proj]\n",
        "  peft: boft\n  boft_block_size: 8\n  boft_n_butterfly_factor: 2\n  target_modules: [q_proj, v_proj]\n",
        "  peft: vera\n  lora_rank: 256\n  target_modules: [q_proj, v_proj]\n",
        "  peft: ia3\n  target_modules: [k_proj, v_proj, down_proj]\n  feedforward_modules: [down_proj]\n",
        "  peft: prompt-tuning\n  virtual_tokens: 50\n",
        "  peft: prefix-tuning\n  virtual_tokens: 200\n",
        "  peft: ln-tuning\n",
    ];
    for case in cases {
        let text = format!("{head}{case}{train}");
        let recipe = moro_recipe::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let m = model(&recipe.model.base);
        let e = export(Format::Trl, &recipe, Some(&m), &Options::default()).unwrap();
        let script = &e.files[0].content;
        let read = trl_peft_job(script).resolve_for(&m).unwrap();
        let planned = recipe.settings().unwrap().resolve_for(&m).unwrap();
        assert_eq!(read.adapter.method, planned.adapter.method, "{text}");
        let d = DeviceProfile::default();
        assert_eq!(
            estimate(&m, &read, &d).unwrap(),
            estimate(&m, &planned, &d).unwrap(),
            "{text}\n{script}"
        );
    }
}

/// The other exports write LoRA adapters, and say that `--to trl` takes the method.
#[test]
fn other_exports_name_the_trl_export_for_peft_methods() {
    let text = "model:\n  base: meta-llama/Llama-3.2-3B\n  method: lora\n  peft: lokr\n";
    let recipe = moro_recipe::parse(text).unwrap();
    let m = model(&recipe.model.base);
    for format in [Format::Axolotl, Format::Llamafactory, Format::Unsloth] {
        let e = export(format, &recipe, Some(&m), &Options::default()).unwrap_err();
        assert!(e.to_string().contains("--to trl"), "{format}: {e}");
    }
}
