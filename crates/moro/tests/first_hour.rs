//! Issue 18, "a new user's first hour", walked through as it was tried: each test is one
//! bullet of what was seen, run with the same commands, and checks the new behaviour. The
//! detailed tests of each behaviour live beside their command (`estimate_cli.rs`,
//! `recipe_cli.rs`, `recipe_export.rs`, moro-export's `export_check.rs`); these hold the
//! issue's own cases.

mod common;

use common::Out;

fn moro(dir: &std::path::Path, args: &[&str]) -> Out {
    Out::of(common::isolated().current_dir(dir).args(args))
}

fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn does_not_fit_is_no_longer_a_dead_end() {
    let d = scratch();
    let o = moro(d.path(), &common::LLAMA2_FULL_ON_H100);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stdout.contains("does NOT fit"), "{}", o.stdout);
    let after = o
        .stdout
        .split("what fits here")
        .nth(1)
        .expect("suggestions");
    let lines: Vec<&str> = after.lines().filter(|l| l.contains("predicted")).collect();
    assert!(!lines.is_empty(), "{}", o.stdout);
    // A job that fits says how much room is left, in words and in bytes.
    let fits = [
        "estimate",
        "--model",
        "Qwen/Qwen2.5-7B",
        "--method",
        "qlora",
        "--hardware",
        "rtx-4090",
    ];
    let o = moro(d.path(), &fits);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("GiB to spare"), "{}", o.stdout);
    let v = moro(d.path(), &[&fits[..], &["--json"]].concat()).json();
    let spare = v["memory_bytes"].as_u64().unwrap() - v["peak_upper_bytes"].as_u64().unwrap();
    assert!(spare > 0, "{v}");
}

#[test]
fn recipe_generate_keeps_room_and_ranks_as_it_says() {
    let d = scratch();
    let generate = |seq: &str| {
        moro(
            d.path(),
            &[
                "recipe",
                "generate",
                "--model",
                "Qwen/Qwen2.5-1.5B",
                "--hardware",
                "rtx-4090",
                "--seq-len",
                seq,
                "--json",
            ],
        )
        .json()
    };
    let (long, short) = (generate("8192"), generate("2048"));
    for v in [&long, &short] {
        // Not filled to the brim: the bound, not the prediction, is within the card.
        assert!(v["best"]["headroom_bytes"].as_i64().unwrap() > 0, "{v}");
    }
    // Quality ranks the method first: a shorter context never trades it away.
    assert_eq!(
        long["recipe"]["model"]["method"], short["recipe"]["model"]["method"],
        "{long}\n{short}"
    );
    let help = moro(d.path(), &["recipe", "generate", "--help"]).stdout;
    assert!(help.contains("quality (method > adapters"), "{help}");
    assert!(help.contains("speed (no offload"), "{help}");
}

#[test]
fn contradictions_are_refused_or_warned_naming_the_hardware_fact() {
    let d = scratch();
    let llama = ["estimate", "--model", "meta-llama/Llama-3.1-8B"];
    let refused = |args: &[&str], field: &str, fact: &str| {
        let o = moro(d.path(), &[&llama[..], args].concat());
        assert_eq!(o.code, 2, "{args:?}: {}{}", o.stdout, o.stderr);
        let first = o.stderr.lines().next().unwrap_or("");
        assert!(
            first.contains(field) && first.contains(fact),
            "{args:?}: {first}"
        );
    };
    let v100 = ["--hardware", "v100-sxm2-32gb"];
    refused(
        &[&["--method", "lora", "--attention", "flash"][..], &v100].concat(),
        "`attention`",
        "compute capability 7.0",
    );
    let mac = ["--hardware", "apple-m2-max-64gb", "--stack", "hf"];
    refused(
        &[&["--method", "qlora", "--attention", "flash"][..], &mac].concat(),
        "`attention`",
        "Apple M2 Max",
    );
    refused(
        &[&["--method", "qlora"][..], &mac].concat(),
        "`quantization`",
        "need CUDA or ROCm",
    );
    refused(
        &["--method", "qlora", "--quantization", "none"],
        "`quantization`",
        "QLoRA",
    );
    refused(
        &["--method", "full", "--lora-rank", "64"],
        "`lora_rank`",
        "full fine-tune",
    );
    refused(
        &["--method", "inference", "--optimizer", "adamw_8bit"],
        "`optimizer`",
        "inference",
    );
    refused(
        &["--method", "lora", "--memory", "24"],
        "--memory",
        "no unit",
    );
    refused(
        &["--method", "lora", "--memory=-24GiB"],
        "--memory",
        "negative",
    );
    // What runs but is unusual is a warning, and the setting is kept.
    let o = moro(
        d.path(),
        &[
            &llama[..],
            &[
                "--method",
                "lora",
                "--precision",
                "bf16-mixed",
                "--hardware",
                "t4",
            ],
        ]
        .concat(),
    );
    assert!(
        o.stderr.contains("compute capability 7.5) has no bf16"),
        "{}",
        o.stderr
    );
    assert!(o.stdout.contains("bf16-mixed"), "{}", o.stdout);
    let o = moro(
        d.path(),
        &[
            "estimate",
            "--model",
            "meta-llama/Llama-2-7b-hf",
            "--method",
            "lora",
            "--seq-len",
            "200000",
        ],
    );
    assert!(
        o.stderr.contains("beyond the model's 4096 positions"),
        "{}",
        o.stderr
    );
    assert!(o.stdout.contains("200000 tokens"), "{}", o.stdout);
    // A recipe's unknown preset is named with its line, not read as no hardware at all.
    std::fs::write(
        d.path().join("moro.yaml"),
        "model:\n  base: Qwen/Qwen2.5-7B\n  method: qlora\nhardware:\n  preset: rtx-9999\n",
    )
    .unwrap();
    for cmd in [
        &["estimate", "moro.yaml"][..],
        &["recipe", "check", "moro.yaml"],
    ] {
        let o = moro(d.path(), cmd);
        assert_eq!(o.code, 2, "{cmd:?}: {}", o.stdout);
        assert!(
            o.stderr.contains("moro.yaml:5:") && o.stderr.contains("hardware.preset"),
            "{cmd:?}: {}",
            o.stderr
        );
        assert!(!o.stderr.contains("no `hardware:` section"), "{}", o.stderr);
    }
}

#[test]
fn model_names_are_honest() {
    let d = scratch();
    // Llama 3.3 is its own catalog entry now, estimated as itself.
    let o = moro(
        d.path(),
        &[
            "estimate",
            "--model",
            "meta-llama/Llama-3.3-70B-Instruct",
            "--method",
            "qlora",
        ],
    );
    let first = o.stdout.lines().next().unwrap_or("");
    assert!(
        first.contains("meta-llama/Llama-3.3-70B-Instruct"),
        "{first}"
    );
    assert!(!o.stdout.contains("3.1-70B"), "{}", o.stdout);
    // A renamed repository says which entry it is.
    let o = moro(
        d.path(),
        &[
            "estimate",
            "--model",
            "meta-llama/Meta-Llama-3.1-8B",
            "--method",
            "qlora",
        ],
    );
    assert!(
        o.stdout.contains(
            "`meta-llama/Meta-Llama-3.1-8B` is `meta-llama/Llama-3.1-8B` since the Hub renamed it"
        ),
        "{}",
        o.stdout
    );
    // An unknown id offline suggests the closest catalog names.
    let o = moro(
        d.path(),
        &[
            "estimate",
            "--model",
            "acme/Llama-3.1-8B-foo",
            "--method",
            "qlora",
        ],
    );
    assert_eq!(o.code, 2);
    assert!(
        o.stderr.contains("did you mean `meta-llama/Llama-3.1-8B`"),
        "{}",
        o.stderr
    );
}

#[test]
fn exports_say_what_their_trainer_runs() {
    let d = scratch();
    // The hf-sized Llama-3.1-8B recipe, exported to TRL and Unsloth.
    std::fs::write(
        d.path().join("moro.yaml"),
        "model:\n  base: meta-llama/Llama-3.1-8B\n  method: qlora\ntraining:\n  stack: hf\n",
    )
    .unwrap();
    for to in ["trl", "unsloth"] {
        let o = moro(
            d.path(),
            &[
                "recipe",
                "export",
                "moro.yaml",
                "--to",
                to,
                "--output",
                &format!("{to}/"),
            ],
        );
        assert_eq!(o.code, 0, "{}", o.stderr);
        assert!(
            o.stderr.contains("planned on stack hf") && o.stderr.contains(&format!("stack {to}")),
            "{}",
            o.stderr
        );
    }
    // Unsloth's example dataset has instruction / input / output columns: the script writes
    // them out as text before SFTTrainer sees them.
    let script = std::fs::read_to_string(d.path().join("unsloth/train_unsloth.py")).unwrap();
    let map = script
        .find("dataset.map(alpaca_text")
        .expect("formats the rows");
    assert!(map < script.find("SFTTrainer(").unwrap(), "{script}");
}

#[test]
fn polish() {
    let d = scratch();
    let llama = ["estimate", "--model", "meta-llama/Llama-3.1-8B"];
    for extra in [
        &["--method", "full", "--gpus", "2"][..],
        &["--method", "full", "--gpus", "8", "--sharding", "zero3"],
    ] {
        let o = moro(d.path(), &[&llama[..], extra].concat());
        assert!(
            !o.stdout.contains("(None)") && !o.stdout.contains("(Zero3)"),
            "{}",
            o.stdout
        );
    }
    // Notes about training memory are not printed for inference.
    let o = moro(d.path(), &[&llama[..], &["--method", "inference"]].concat());
    assert!(
        !o.stdout.contains("paged") && !o.stdout.contains("NCCL"),
        "{}",
        o.stdout
    );
    // DoRA is in the job line.
    let o = moro(
        d.path(),
        &[&llama[..], &["--method", "lora", "--dora"]].concat(),
    );
    assert!(
        o.stdout
            .lines()
            .any(|l| l.starts_with("job") && l.contains("DoRA")),
        "{}",
        o.stdout
    );
    // `moro fit` fits 100 columns, serves inference, and a size stands for a current model.
    let o = moro(d.path(), &["fit", "--model-size", "7B", "--method", "full"]);
    assert!(
        o.stdout.lines().all(|l| l.chars().count() <= 100),
        "{}",
        o.stdout
    );
    let o = moro(
        d.path(),
        &["fit", "--model-size", "7B", "--method", "qlora", "--json"],
    );
    let v = o.json();
    // Qwen2-7B's published count; Llama-2-7B's 32,000-entry vocabulary no longer stands in.
    assert_eq!(v["parameters"].as_u64(), Some(7_615_616_512), "{v}");
    let o = moro(
        d.path(),
        &[
            "fit",
            "--model",
            "meta-llama/Llama-3.1-8B",
            "--method",
            "inference",
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    // Errors are JSON under --json.
    let o = moro(
        d.path(),
        &[
            &llama[..],
            &["--method", "lora", "--memory", "24", "--json"],
        ]
        .concat(),
    );
    assert_eq!(o.code, 2);
    let e = o.json();
    assert_eq!(e["error"]["field"], "--memory", "{e}");
    // Shell completions.
    for shell in ["bash", "zsh", "fish", "powershell"] {
        let o = moro(d.path(), &["completions", shell]);
        assert!(o.code == 0 && o.stdout.contains("estimate"), "{shell}");
    }
}
