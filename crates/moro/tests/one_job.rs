//! One job, resolved once: the same job said as flags and as the smallest moro.yaml that
//! says the same gives byte-identical answers from every command that takes it, and this
//! machine's calibration profile moves every command's answer the same way.

mod common;

use std::path::Path;

use common::{json_of, moro};
use serde_json::Value;

/// A setting as a flag and as a moro.yaml key (`section.key`), with how its value is
/// written in YAML (`None`: as given).
struct Setting {
    name: &'static str,
    flag: &'static str,
    key: &'static str,
}

const SETTINGS: &[Setting] = &[
    Setting {
        name: "method",
        flag: "--method",
        key: "model.method",
    },
    Setting {
        name: "quant",
        flag: "--quantization",
        key: "model.quantization",
    },
    Setting {
        name: "peft",
        flag: "--peft",
        key: "model.peft",
    },
    Setting {
        name: "rank",
        flag: "--lora-rank",
        key: "model.lora_rank",
    },
    Setting {
        name: "alpha",
        flag: "--lora-alpha",
        key: "model.lora_alpha",
    },
    Setting {
        name: "targets",
        flag: "--target-modules",
        key: "model.target_modules",
    },
    Setting {
        name: "tokens",
        flag: "--virtual-tokens",
        key: "model.virtual_tokens",
    },
    Setting {
        name: "factor",
        flag: "--decompose-factor",
        key: "model.decompose_factor",
    },
    Setting {
        name: "block",
        flag: "--boft-block-size",
        key: "model.boft_block_size",
    },
    Setting {
        name: "butterfly",
        flag: "--boft-n-butterfly-factor",
        key: "model.boft_n_butterfly_factor",
    },
    Setting {
        name: "mbs",
        flag: "--micro-batch-size",
        key: "training.micro_batch_size",
    },
    Setting {
        name: "seq",
        flag: "--seq-len",
        key: "training.max_seq_length",
    },
    Setting {
        name: "new",
        flag: "--max-new-tokens",
        key: "training.max_new_tokens",
    },
    Setting {
        name: "accum",
        flag: "--grad-accum",
        key: "training.gradient_accumulation_steps",
    },
    Setting {
        name: "optim",
        flag: "--optimizer",
        key: "training.optimizer",
    },
    Setting {
        name: "gc",
        flag: "--gradient-checkpointing",
        key: "training.gradient_checkpointing",
    },
    Setting {
        name: "attn",
        flag: "--attention",
        key: "training.attention",
    },
    Setting {
        name: "prec",
        flag: "--precision",
        key: "training.precision",
    },
    Setting {
        name: "stack",
        flag: "--stack",
        key: "training.stack",
    },
    Setting {
        name: "loss",
        flag: "--loss",
        key: "training.loss",
    },
    Setting {
        name: "liger",
        flag: "--liger",
        key: "training.liger",
    },
    Setting {
        name: "kernels",
        flag: "--liger-kernels",
        key: "training.liger_kernels",
    },
    Setting {
        name: "compile",
        flag: "--compile",
        key: "training.compile",
    },
    Setting {
        name: "act_offload",
        flag: "--activation-offload",
        key: "training.activation_offload",
    },
    Setting {
        name: "gpus",
        flag: "--gpus",
        key: "parallel.gpus",
    },
    Setting {
        name: "strategy",
        flag: "--strategy",
        key: "parallel.strategy",
    },
    Setting {
        name: "tp",
        flag: "--tensor-parallel",
        key: "parallel.tensor_parallel",
    },
    Setting {
        name: "offload",
        flag: "--offload",
        key: "parallel.offload",
    },
    Setting {
        name: "nodes",
        flag: "--nodes",
        key: "parallel.nodes",
    },
    Setting {
        name: "fsdp_version",
        flag: "--fsdp-version",
        key: "parallel.fsdp_version",
    },
];

fn setting(name: &str) -> &'static Setting {
    SETTINGS
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no setting `{name}`"))
}

/// A job: the model and the settings it says (`"name=value"`); `packed=false` is `--padded`.
struct Case {
    model: &'static str,
    says: &'static [&'static str],
}

const fn case(model: &'static str, says: &'static [&'static str]) -> Case {
    Case { model, says }
}

const QWEN7: &str = "Qwen/Qwen2.5-7B";
const QWEN15: &str = "Qwen/Qwen2.5-1.5B";
const LLAMA8: &str = "meta-llama/Llama-3.1-8B";
const LLAMA3B: &str = "meta-llama/Llama-3.2-3B";
const L70: &str = "meta-llama/Llama-3.1-70B";

/// Every method, stack, optimizer and parallel strategy, some with nothing else said (so
/// the defaults decide) and some with every knob turned.
const CASES: &[Case] = &[
    // Defaults only: the issue's own examples.
    case(QWEN7, &["method=qlora", "mbs=1", "seq=2048"]),
    case(QWEN7, &["method=full", "mbs=1", "seq=2048"]),
    case(QWEN7, &[]),
    case(QWEN7, &["method=lora"]),
    case(QWEN7, &["method=inference", "seq=8192", "mbs=4"]),
    case(
        QWEN7,
        &["method=inference", "seq=4096", "mbs=8", "new=3584"],
    ),
    case(LLAMA8, &["method=inference", "seq=768", "new=256"]),
    case(QWEN7, &["quant=nf4"]),
    case(QWEN7, &["quant=int8"]),
    case(QWEN7, &["quant=fp4-dq"]),
    // Every stack, with and without a method.
    case(LLAMA8, &["stack=trl"]),
    case(LLAMA8, &["stack=trl", "method=qlora"]),
    case(LLAMA8, &["stack=trl", "method=full", "gc=true"]),
    case(LLAMA8, &["stack=litgpt"]),
    case(LLAMA8, &["stack=litgpt", "method=qlora"]),
    case(LLAMA8, &["stack=torchtune", "method=lora", "rank=8"]),
    case(LLAMA8, &["stack=torchtune", "method=full"]),
    case(LLAMA8, &["stack=hf", "method=qlora", "gc=false"]),
    // Every optimizer.
    case(QWEN15, &["method=full", "optim=adamw_torch"]),
    case(QWEN15, &["method=full", "optim=adamw_torch_fused"]),
    case(QWEN15, &["method=full", "optim=adamw_8bit"]),
    case(QWEN15, &["method=full", "optim=paged_adamw_8bit"]),
    case(QWEN15, &["method=full", "optim=paged_adamw_32bit"]),
    case(QWEN15, &["method=full", "optim=adafactor"]),
    case(QWEN15, &["method=full", "optim=lion_32bit"]),
    case(QWEN15, &["method=full", "optim=lion_8bit"]),
    case(QWEN15, &["method=full", "optim=sgd"]),
    case(
        QWEN15,
        &["method=lora", "optim=adamw_8bit", "rank=64", "alpha=16"],
    ),
    // Precision, attention, loss, shape.
    case(QWEN15, &["method=full", "prec=bf16-mixed"]),
    case(QWEN15, &["method=full", "prec=fp32"]),
    case(
        QWEN15,
        &["method=lora", "prec=fp16-mixed", "attn=eager", "seq=1024"],
    ),
    case(QWEN15, &["method=lora", "prec=bf16"]),
    case(
        QWEN15,
        &["method=lora", "attn=flash", "seq=8192", "mbs=2", "accum=8"],
    ),
    case(QWEN15, &["method=lora", "loss=chunked"]),
    case(QWEN15, &["method=full", "loss=fused", "gc=true"]),
    case(QWEN15, &["method=lora", "packed=false", "seq=4096"]),
    case(QWEN15, &["method=lora", "targets=all-linear"]),
    case(QWEN15, &["method=lora", "targets=q_proj,v_proj", "rank=32"]),
    // PEFT's other methods and lit-gpt's adapters.
    case(
        LLAMA3B,
        &["method=lora", "peft=ia3", "targets=k_proj,v_proj,down_proj"],
    ),
    case(
        LLAMA3B,
        &["method=lora", "dora=true", "targets=q_proj,v_proj"],
    ),
    case(LLAMA8, &["method=qlora", "dora=true"]),
    // Liger's kernels: all of them, or some.
    case(LLAMA8, &["method=lora", "liger=true"]),
    case(LLAMA8, &["method=lora", "liger=true", "gc=false"]),
    // torch.compile, with and without checkpointing.
    case(LLAMA8, &["method=lora", "compile=true", "gc=false"]),
    case(QWEN15, &["method=full", "compile=true"]),
    // Unsloth: its defaults (offloaded checkpoints, fused loss), and plain checkpointing.
    case(LLAMA8, &["stack=unsloth", "method=qlora"]),
    case(
        QWEN7,
        &["stack=unsloth", "method=lora", "act_offload=false"],
    ),
    // torchtune: its per-layer compile, its activation offloading.
    case(LLAMA3B, &["stack=torchtune", "method=full", "compile=true"]),
    case(
        LLAMA3B,
        &[
            "stack=torchtune",
            "method=lora",
            "compile=true",
            "gc=true",
            "act_offload=true",
        ],
    ),
    case(QWEN15, &["method=full", "kernels=rms_norm,swiglu"]),
    case(
        LLAMA3B,
        &["stack=trl", "kernels=fused_linear_cross_entropy"],
    ),
    case(LLAMA3B, &["method=lora", "peft=vera", "rank=256"]),
    case(LLAMA3B, &["method=lora", "peft=adalora", "rank=64"]),
    case(LLAMA3B, &["method=lora", "peft=loha", "rank=32"]),
    case(
        LLAMA3B,
        &["method=lora", "peft=lokr", "rank=32", "factor=4"],
    ),
    case(LLAMA3B, &["method=lora", "peft=lokr", "rank=8"]),
    case(LLAMA3B, &["method=lora", "peft=boft"]),
    case(
        LLAMA3B,
        &["method=lora", "peft=boft", "block=8", "butterfly=2"],
    ),
    case(LLAMA3B, &["method=lora", "peft=oft", "rank=32"]),
    case(
        LLAMA3B,
        &["method=lora", "peft=prefix-tuning", "tokens=200"],
    ),
    case(LLAMA3B, &["method=lora", "peft=ln-tuning"]),
    case(
        LLAMA3B,
        &["method=lora", "peft=prompt-tuning", "tokens=200"],
    ),
    case(LLAMA3B, &["peft=adapter", "stack=litgpt"]),
    case(LLAMA3B, &["peft=adapter-v2", "stack=litgpt"]),
    // Every parallel strategy; `gpus` is the total.
    case(LLAMA8, &["method=full", "gpus=8"]),
    case(LLAMA8, &["method=full", "gpus=8", "strategy=zero1"]),
    case(LLAMA8, &["method=full", "gpus=8", "strategy=zero2"]),
    case(LLAMA8, &["method=full", "gpus=8", "strategy=zero3"]),
    case(
        LLAMA8,
        &[
            "method=full",
            "gpus=4",
            "strategy=zero3",
            "offload=optimizer",
        ],
    ),
    case(
        LLAMA8,
        &[
            "method=full",
            "gpus=4",
            "strategy=zero3",
            "offload=optimizer_and_params",
        ],
    ),
    case(
        LLAMA8,
        &["method=full", "gpus=8", "strategy=fsdp_full_shard"],
    ),
    case(
        LLAMA8,
        &["method=full", "gpus=8", "strategy=fsdp_shard_grad_op"],
    ),
    case(
        L70,
        &[
            "method=full",
            "gpus=16",
            "nodes=2",
            "strategy=fsdp_hybrid_shard",
        ],
    ),
    case(L70, &["method=full", "gpus=16", "tp=2", "strategy=zero3"]),
    case(L70, &["method=qlora", "gpus=2", "strategy=fsdp_full_shard"]),
    case(
        LLAMA8,
        &[
            "method=full",
            "gpus=8",
            "strategy=fsdp_full_shard",
            "fsdp_version=2",
        ],
    ),
    case(
        L70,
        &[
            "method=qlora",
            "gpus=2",
            "strategy=fsdp_full_shard",
            "fsdp_version=2",
        ],
    ),
    case(L70, &["method=lora", "gpus=8", "strategy=zero3", "gc=true"]),
];

fn split(kv: &str) -> (&str, &str) {
    kv.split_once('=')
        .unwrap_or_else(|| panic!("`{kv}` is not name=value"))
}

/// The flags of a case.
fn flags(c: &Case) -> Vec<String> {
    let mut v = vec!["--model".to_owned(), c.model.to_owned()];
    for kv in c.says {
        let (name, value) = split(kv);
        if name == "packed" {
            assert_eq!(value, "false");
            v.push("--padded".to_owned());
            continue;
        }
        if name == "dora" {
            assert_eq!(value, "true");
            v.push("--dora".to_owned());
            continue;
        }
        let s = setting(name);
        if name == "gc" || name == "liger" || name == "compile" {
            v.push(format!("{}={value}", s.flag));
        } else {
            v.push(s.flag.to_owned());
            v.push(value.to_owned());
        }
    }
    v
}

/// The smallest moro.yaml that says what the case says.
fn yaml(c: &Case) -> String {
    let mut sections: Vec<(&str, Vec<String>)> = vec![
        ("model", vec![format!("base: {}", c.model)]),
        ("training", Vec::new()),
        ("parallel", Vec::new()),
    ];
    for kv in c.says {
        let (name, value) = split(kv);
        let (section, key) = if name == "packed" {
            ("training", "packing")
        } else if name == "dora" {
            ("model", "dora")
        } else {
            setting(name).key.split_once('.').unwrap()
        };
        let value = if (name == "targets" && value != "all-linear") || name == "kernels" {
            format!("[{value}]")
        } else {
            value.to_owned()
        };
        let entry = sections.iter_mut().find(|(s, _)| *s == section).unwrap();
        entry.1.push(format!("{key}: {value}"));
    }
    let mut out = String::new();
    for (section, lines) in sections {
        if lines.is_empty() {
            continue;
        }
        out.push_str(section);
        out.push_str(":\n");
        for l in lines {
            out.push_str("  ");
            out.push_str(&l);
            out.push('\n');
        }
    }
    out
}

fn estimate_json(dir: &Path, args: &[String]) -> Value {
    let out = moro(dir)
        .arg("estimate")
        .args(args)
        .args(["--memory", "80GiB", "--json"])
        .output()
        .unwrap();
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "moro estimate {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    json_of(&out.stdout)
}

#[test]
fn every_job_gives_the_same_bytes_from_flags_and_from_a_recipe() {
    assert!(CASES.len() >= 50, "{} cases", CASES.len());
    let dir = tempfile::tempdir().unwrap();
    for (i, c) in CASES.iter().enumerate() {
        let from_flags = estimate_json(dir.path(), &flags(c));
        let file = format!("job-{i}.yaml");
        std::fs::write(dir.path().join(&file), yaml(c)).unwrap();
        let from_recipe = estimate_json(dir.path(), std::slice::from_ref(&file));
        assert_eq!(
            from_flags,
            from_recipe,
            "{:?} and\n{}differ",
            flags(c),
            yaml(c)
        );
        // `recipe check` reads the same file to the same bytes.
        let check = moro(dir.path())
            .args(["recipe", "check", &file, "--hardware", "80GiB", "--json"])
            .output()
            .unwrap();
        assert!(
            matches!(check.status.code(), Some(0 | 1)),
            "recipe check {}: {}",
            yaml(c),
            String::from_utf8_lossy(&check.stderr)
        );
        let check = json_of(&check.stdout);
        for level in [
            "peak_allocated_bytes",
            "peak_reserved_bytes",
            "peak_device_bytes",
        ] {
            assert_eq!(check[level], from_flags[level], "{level} of\n{}", yaml(c));
        }
    }
}

#[test]
fn the_defaults_are_the_trainers_and_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let job = |says: &[&str]| {
        let args: Vec<String> = ["--model", QWEN7]
            .iter()
            .map(ToString::to_string)
            .chain(says.iter().map(ToString::to_string))
            .collect();
        estimate_json(dir.path(), &args)["job"].clone()
    };
    // PEFT's prepare_model_for_kbit_training checkpoints a QLoRA model on the hf stack.
    assert_eq!(job(&["--method", "qlora"])["gradient_checkpointing"], true);
    // TRL's SFTConfig checkpoints by default, whatever the method.
    assert_eq!(job(&["--stack", "trl"])["gradient_checkpointing"], true);
    assert_eq!(job(&["--method", "lora"])["gradient_checkpointing"], false);
    // transformers 5 loads bf16 checkpoints as bf16: a full fine-tune trains bf16 weights.
    assert_eq!(job(&["--method", "full"])["precision"], "bf16");
    assert_eq!(job(&["--method", "lora"])["precision"], "bf16-mixed");
    assert_eq!(job(&["--stack", "torchtune"])["precision"], "bf16");
    // An explicit setting is never replaced.
    assert_eq!(
        job(&["--method", "qlora", "--gradient-checkpointing=false"])["gradient_checkpointing"],
        false
    );
    // The text says what the precision means.
    let out = moro(dir.path())
        .args(["estimate", "--model", QWEN7, "--method", "full"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("bf16 (bf16 weights, no fp32 master copy)"),
        "{text}"
    );
}

#[test]
fn a_hardware_count_is_the_gpu_count() {
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        let out = moro(dir.path())
            .args(["estimate", "--model", LLAMA8, "--method", "full", "--json"])
            .args(extra)
            .output()
            .unwrap();
        json_of(&out.stdout)
    };
    let named = run(&["--hardware", "8xh100-sxm", "--strategy", "zero3"]);
    let said = run(&[
        "--hardware",
        "h100-sxm",
        "--gpus",
        "8",
        "--strategy",
        "zero3",
    ]);
    assert_eq!(named["job"]["parallel"]["data_parallel"], 8);
    assert_eq!(named["peak_device_bytes"], said["peak_device_bytes"]);
    // A ZeRO-3 shard of an 8B full fine-tune over 8 GPUs is far below one GPU's 16 bytes per
    // parameter (8.03e9 × 16 B = 120 GiB).
    assert!(named["peak_device_bytes"].as_u64().unwrap() < 40 << 30);
    // --gpus is the total: 8 GPUs at tensor parallel 2 are 4 data-parallel ranks.
    let tp = run(&["--gpus", "8", "--tensor-parallel", "2"]);
    assert_eq!(tp["job"]["parallel"]["data_parallel"], 4);
    // A total the model-parallel group does not divide is refused, from flags as from a
    // recipe, naming the field.
    let out = moro(dir.path())
        .args([
            "estimate",
            "--model",
            LLAMA8,
            "--gpus",
            "3",
            "--tensor-parallel",
            "2",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("3 GPUs in all cannot be split"), "{err}");
    std::fs::write(
        dir.path().join("tp.yaml"),
        format!("model:\n  base: {LLAMA8}\nparallel:\n  gpus: 3\n  tensor_parallel: 2\n"),
    )
    .unwrap();
    let out = moro(dir.path())
        .args(["estimate", "tp.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("parallel.gpus"), "{err}");
}

const GIB: u64 = 1 << 30;

/// Peak device bytes from `estimate`, `recipe check`, `recipe generate` and `fit` for
/// Qwen2.5-1.5B LoRA at 2,048 tokens on an H200.
fn peaks_on_h200(dir: &Path) -> [u64; 4] {
    let run = |args: &[&str]| {
        let out = moro(dir).args(args).output().unwrap();
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        json_of(&out.stdout)
    };
    let job = ["--model", QWEN15, "--method", "lora", "--seq-len", "2048"];
    let est = run(&[&["estimate", "--hardware", "h200", "--json"][..], &job].concat());
    std::fs::write(
        dir.join("check.yaml"),
        format!("model:\n  base: {QWEN15}\n  method: lora\ntraining:\n  max_seq_length: 2048\n"),
    )
    .unwrap();
    let check = run(&[
        "recipe",
        "check",
        "check.yaml",
        "--hardware",
        "h200",
        "--json",
    ]);
    let generate = run(&[
        "recipe",
        "generate",
        "--model",
        QWEN15,
        "--method",
        "lora",
        "--seq-len",
        "2048",
        "--hardware",
        "h200",
        "--json",
    ]);
    let fit = run(&[
        "fit",
        "--model",
        QWEN15,
        "--method",
        "lora",
        "--seq-len",
        "2048",
        "--json",
    ]);
    let h200 = fit["fits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["preset"] == "h200")
        .expect("an h200 row")
        .clone();
    let peak = |v: &Value| v.as_u64().unwrap();
    [
        peak(&est["peak_device_bytes"]),
        peak(&check["peak_device_bytes"]),
        peak(&generate["best"]["peak_device_bytes"]),
        peak(&h200["peak_device_bytes"]),
    ]
}

#[test]
fn the_calibration_profile_moves_every_command_the_same_way() {
    let dir = tempfile::tempdir().unwrap();
    let before = peaks_on_h200(dir.path());
    // The default context of a Hopper GPU is 920 MiB; the profile says 1 GiB more.
    common::write_h200_profile(
        &dir.path().join(".moro-config"),
        &serde_json::json!({ "cuda_context_bytes": 920 * (1 << 20) + GIB }),
    );
    let after = peaks_on_h200(dir.path());
    for (i, name) in ["estimate", "recipe check", "recipe generate", "fit"]
        .iter()
        .enumerate()
    {
        assert_eq!(after[i], before[i] + GIB, "{name}: {before:?} → {after:?}");
    }
}

#[test]
fn a_spelling_means_the_same_on_the_command_line_and_in_a_recipe() {
    let dir = tempfile::tempdir().unwrap();
    // Aliases people write: TRL's and litgpt's names, FlashAttention's short name.
    const ALIASES: &[Case] = &[
        case(QWEN15, &["attn=fa2"]),
        case(QWEN15, &["prec=bf16-true"]),
        case(QWEN15, &["optim=adamw_bnb_8bit"]),
        case(QWEN15, &["loss=liger"]),
        case(QWEN15, &["quant=gptq"]),
    ];
    for c in ALIASES {
        let from_flags = estimate_json(dir.path(), &flags(c));
        std::fs::write(dir.path().join("alias.yaml"), yaml(c)).unwrap();
        let from_recipe = estimate_json(dir.path(), &["alias.yaml".to_owned()]);
        assert_eq!(from_flags, from_recipe, "{:?}", c.says);
    }
    // An unknown spelling names the accepted ones, from flags as from a recipe.
    let out = moro(dir.path())
        .args(["estimate", "--model", QWEN15, "--attention", "fa3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown attention `fa3`; use flash, sdpa or eager"),
        "{err}"
    );
}
