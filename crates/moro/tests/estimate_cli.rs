//! `moro estimate`, `moro models` and `moro validate` through the real binary: output shape,
//! exit codes, and a clear one-line error naming the field for bad input.

mod common;

use std::process::Command;

use common::Out;

/// The binary without the developer's Hugging Face cache, token or calibration profile.
fn moro() -> Command {
    common::isolated()
}

fn run(args: &[&str]) -> Out {
    Out::of(moro().args(args))
}

fn json(args: &[&str]) -> serde_json::Value {
    run(args).answer_json()
}

/// `--batch-lengths` replays micro-batches of those lengths in that order: `--seq-len` defaults
/// to the longest, `run_of_batches` says how many and in what order, and `--trace` writes that
/// run, whose token ids are one sequence × each length × 8 bytes (int64), in the order given.
/// A length over `--seq-len`, an inference job or a 0 is refused, exit 2.
#[test]
fn batch_lengths_replay_a_run_in_the_order_given() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("run.jsonl");
    let job = [
        "estimate",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--method",
        "lora",
        "--batch-lengths",
        "1024,384,2048,640",
    ];
    let v = json(&[&job[..], &["--json"]].concat());
    assert_eq!(v["job"]["seq_len"], 2048);
    let r = &v["run_of_batches"];
    assert_eq!(
        (r["batches"].as_u64(), r["order"].as_str()),
        (Some(4), Some("given"))
    );
    assert_eq!(r["longest_tokens"], 2048);
    assert!(
        r["reserved_bytes"].as_u64() >= r["needed_bytes"].as_u64(),
        "{v}"
    );
    let text = run(&[&job[..], &["--trace", trace.to_str().unwrap()]].concat()).stdout;
    assert!(
        text.contains("run     4 batches replayed in the order given (the longest 2048 tokens)"),
        "{text}"
    );
    let ids: Vec<u64> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["op"] == "alloc" && e["name"] == "input_ids")
        .map(|e| e["bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [1024 * 8, 384 * 8, 2048 * 8, 640 * 8]);
    for bad in [
        &["--seq-len", "1024"][..],
        &["--method", "inference"][..],
        &["--batch-lengths", "512,0"][..],
    ] {
        let o = run(&[&job[..], bad].concat());
        assert_eq!(o.code, 2, "{bad:?}: {}", o.stderr);
    }
}

/// Padded batches differ in length over a run: the estimate says that the reserved level and
/// nvidia-smi climb with the blocks shorter batches leave, and that the partly used blocks of
/// one GPU without sharding are within the bound (docs/memory-anatomy.md §17; `moro-core/tests/
/// varying_lengths.rs` holds both to replays). Packed batches, all of one length, get no
/// such note, nor does an inference job.
#[test]
fn padded_batches_are_told_the_cache_climbs() {
    let job = [
        "estimate",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--method",
        "lora",
        "--seq-len",
        "2048",
    ];
    let words = "where padded batches differ in length over a run";
    let padded = run(&[&job[..], &["--padded"]].concat()).stdout;
    assert!(padded.contains(words), "{padded}");
    assert!(padded.contains("within \"at most\""), "{padded}");
    let sharded = run(&[&job[..], &["--padded", "--gpus", "2"]].concat()).stdout;
    assert!(
        sharded.contains(words) && !sharded.contains("within \"at most\""),
        "{sharded}"
    );
    assert!(!run(&job).stdout.contains(words));
}

#[test]
fn estimate_json_has_the_documented_fields() {
    let v = json(&[
        "estimate",
        "--model",
        "Qwen/Qwen2.5-7B",
        "--method",
        "qlora",
        "--seq-len",
        "2048",
        "--json",
    ]);
    let a = v["peak_allocated_bytes"].as_u64().expect("allocated");
    let r = v["peak_reserved_bytes"].as_u64().expect("reserved");
    let d = v["peak_device_bytes"].as_u64().expect("device");
    assert!(a <= r && r <= d, "{a} {r} {d}");
    assert!(v["peak_phase"].is_string());
    let comps = v["components"].as_object().expect("components");
    assert!(comps.contains_key("weights") && comps.contains_key("cuda_context"));
    // The components at the peak add up to the device level.
    let sum: u64 = comps.values().map(|x| x.as_u64().unwrap_or(0)).sum();
    assert_eq!(sum, d);
    // The exact parameter count of Qwen2.5-7B (docs/model-params.md).
    assert_eq!(v["model"]["parameters"].as_u64(), Some(7_615_616_512));
}

#[test]
fn memory_verdict_and_exit_code() {
    let small = run(&["estimate", "--model", "Qwen/Qwen2.5-7B", "--memory", "4GiB"]);
    assert_eq!(small.code, 1, "{}", small.stderr);
    assert!(small.stdout.contains("does NOT fit"), "{}", small.stdout);
    let big = run(&[
        "estimate",
        "--model",
        "Qwen/Qwen2.5-0.5B",
        "--memory",
        "80GiB",
    ]);
    assert_eq!(big.code, 0, "{}", big.stderr);
    assert!(big.stdout.contains("fits on"), "{}", big.stdout);
}

/// A full fine-tune on one GPU says where its reserve comes from: the replayed steps
/// (AdamW on the hf stack), or a warning where the replay does not model the job
/// (Adafactor); LoRA on a Llama-style layer, traced op by op, says its replay is the
/// reserve, with no fragmentation warning.
#[test]
fn full_fine_tune_warns_about_fragmentation() {
    let note = "full fine-tunes fragment PyTorch's cache";
    let replayed = "replayed through PyTorch's caching allocator";
    let full = run(&[
        "estimate",
        "--model",
        "Qwen/Qwen2.5-0.5B",
        "--method",
        "full",
    ]);
    assert_eq!(full.code, 0, "{}", full.stderr);
    assert!(full.stdout.contains(replayed), "{}", full.stdout);
    assert!(!full.stdout.contains(note), "{}", full.stdout);
    let j = json(&[
        "estimate",
        "--model",
        "Qwen/Qwen2.5-0.5B",
        "--method",
        "full",
        "--json",
    ]);
    let frag = j["replayed_fragmentation_bytes"].as_u64().unwrap();
    let reserve =
        j["peak_reserved_bytes"].as_u64().unwrap() - j["peak_allocated_bytes"].as_u64().unwrap();
    assert!(frag > 0 && reserve >= frag, "{frag} {reserve}");
    let adafactor = run(&[
        "estimate",
        "--model",
        "Qwen/Qwen2.5-0.5B",
        "--method",
        "full",
        "--optimizer",
        "adafactor",
    ]);
    assert!(adafactor.stdout.contains(note), "{}", adafactor.stdout);
    // Adafactor's step on a bf16 model holds four fp32 copies of the embedding
    // (151,936 · 896 · 4 = 544,538,624 B, 545,259,520 rounded to 2 MiB); at 256 tokens the
    // loss's fp32 logits block (155 MB) holds none of them: four new segments.
    let short = json(&[
        "estimate",
        "--model",
        "Qwen/Qwen2.5-0.5B",
        "--method",
        "full",
        "--optimizer",
        "adafactor",
        "--seq-len",
        "256",
        "--json",
    ]);
    assert_eq!(short["step_segments_bytes"].as_u64(), Some(4 * 545_259_520));
    let lora = run(&[
        "estimate",
        "--model",
        "Qwen/Qwen2.5-0.5B",
        "--method",
        "lora",
    ]);
    assert!(
        lora.stdout.contains("note: the reserve is ")
            && lora.stdout.contains(replayed)
            && lora.stdout.contains("traced op by op"),
        "{}",
        lora.stdout
    );
    assert!(!lora.stdout.contains(note), "{}", lora.stdout);
}

/// torchtune 0.1's QLoRA build with torchao 0.1 leaves 9.14 GB in the cache (the
/// tutorial's 9.13 GB): the reserved level says so, in the text and in `--json`.
#[test]
fn torchtune_nf4_load_sets_the_reserved_floor() {
    let dir = tempfile::tempdir().unwrap();
    let recipe = |torchao: &str| {
        let path = dir.path().join(format!("tt{torchao}.yaml"));
        std::fs::write(
            &path,
            format!(
                "name: tt\nversion: \"0.1.0\"\nmodel:\n  base: meta-llama/Llama-2-7b-hf\n  \
                 quantization: nf4-dq\n  lora_rank: 8\n  target_modules: all-linear\n\
                 training:\n  micro_batch_size: 2\n  max_seq_length: 512\n  gradient_checkpointing: true\n  \
                 stack: torchtune\n  \
                 precision: bf16\n  versions:\n    torchao: \"{torchao}\"\n"
            ),
        )
        .unwrap();
        path.to_string_lossy().into_owned()
    };
    let old = recipe("0.1");
    let new = recipe("0.3");
    let note = "what loading the model left in PyTorch's cache";
    let o = run(&["estimate", &old]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains(note), "{}", o.stdout);
    let j = json(&["estimate", &old, "--json"]);
    let floor = j["load_reserved_bytes"].as_u64().unwrap();
    assert!((9_080_000_000..9_180_000_000).contains(&floor), "{floor}");
    assert_eq!(j["peak_reserved_bytes"].as_u64(), Some(floor));
    let o = run(&["estimate", &new]);
    assert!(!o.stdout.contains(note), "{}", o.stdout);
    assert_eq!(
        json(&["estimate", &new, "--json"])["load_reserved_bytes"],
        0
    );
}

fn bad(args: &[&str], needle: &str) {
    let o = run(args);
    assert_eq!(
        o.code, 2,
        "args {args:?}: stdout {} stderr {}",
        o.stdout, o.stderr
    );
    assert!(
        o.stderr.contains(needle),
        "args {args:?}: expected `{needle}` in {}",
        o.stderr
    );
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    assert!(
        o.stdout.is_empty(),
        "nothing on stdout for an error: {}",
        o.stdout
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    let m = ["estimate", "--model", "Qwen/Qwen2.5-0.5B"];
    let with = |extra: &[&'static str]| -> Vec<&str> {
        let mut v: Vec<&str> = m.to_vec();
        v.extend_from_slice(extra);
        v
    };
    bad(&with(&["--micro-batch-size", "0"]), "micro-batch-size");
    bad(&with(&["--micro-batch-size=-3"]), "micro-batch-size");
    bad(&with(&["--seq-len", "1000000000000"]), "max_seq_length");
    bad(&with(&["--lora-rank", "100000"]), "lora_rank");
    bad(&with(&["--optimizer", "adamw_9bit"]), "adamw_8bit");
    bad(&with(&["--target-modules", "nonsense"]), "target_modules");
    bad(&with(&["--memory", "lots"]), "--memory");
    // A size without a unit is not read as bytes, a negative one is not a flag, and a GPU is
    // never smaller than 1 GiB.
    bad(&with(&["--memory", "24"]), "say `24GiB`");
    bad(&with(&["--memory", "-24GiB"]), "negative");
    bad(&with(&["--memory", "24MB"]), "under 1 GiB");
    bad(&["estimate", "--model", "Qwen/Qwen9-7B"], "did you mean");
    // A setting for something the job does not do is refused, not dropped.
    bad(
        &with(&["--method", "full", "--lora-rank", "64"]),
        "lora_rank",
    );
    bad(
        &with(&["--method", "full", "--target-modules", "q_proj"]),
        "target_modules",
    );
    bad(
        &with(&["--method", "inference", "--optimizer", "adamw_8bit"]),
        "optimizer",
    );
    bad(
        &with(&["--method", "inference", "--gradient-checkpointing"]),
        "gradient_checkpointing",
    );
    bad(
        &with(&["--method", "lora", "--max-new-tokens", "64"]),
        "training.max_new_tokens",
    );
    bad(
        &with(&[
            "--method",
            "inference",
            "--seq-len",
            "512",
            "--max-new-tokens",
            "512",
        ]),
        "training.max_new_tokens",
    );
}

/// A generation's prompt is prefilled and its tokens decoded one at a time: the job line
/// says so, the cache at the peak is the whole context's, and the keys and values that
/// outgrew their blocks are reported apart from the reserve. By hand: Llama-3.1-8B keeps
/// 2 × 8 heads × 128 × 2 B = 4 KiB a layer, token and sequence. The last forward feeds
/// token 4,607 (the last one generated is never fed back), and the peak is its last
/// layer's values made while the old ones, a token shorter, still exist: 8 sequences ×
/// (64 tensors × 4,607 + 4,606) tokens × 2 KiB.
#[test]
fn a_generation_is_prefilled_then_decoded() {
    let args = [
        "estimate",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--method",
        "inference",
        "--micro-batch-size",
        "8",
        "--seq-len",
        "4608",
        "--max-new-tokens",
        "4096",
    ];
    let text = run(&args).stdout;
    assert!(
        text.contains("context 4608 (512 prompt + 4096 generated)"),
        "{text}"
    );
    assert!(
        text.contains("returns them when memory runs short"),
        "{text}"
    );
    let mut with_json = args.to_vec();
    with_json.push("--json");
    let v = json(&with_json);
    assert_eq!(v["peak_phase"], "decode");
    assert_eq!(
        v["components"]["kv_cache"].as_u64(),
        Some(8 * (64 * 4607 + 4606) * 2048)
    );
    assert!(v["idle_cache_bytes"].as_u64().unwrap() > 1 << 30, "{v}");
    // Past the replay's budget (32 layers × 190,000 tokens) the formulas answer, and say
    // what they leave out.
    let long = run(&[
        "estimate",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--method",
        "inference",
        "--seq-len",
        "200000",
        "--max-new-tokens",
        "190000",
    ]);
    assert_eq!(long.code, 0, "{}", long.stderr);
    assert!(
        long.stdout.contains("summed by formulas, not replayed"),
        "{}",
        long.stdout
    );
}

/// Under `--json` an error is a JSON object on stdout (nothing else there), exit 2.
#[test]
fn errors_are_json_when_json_is_asked_for() {
    for args in [
        &[
            "estimate",
            "--model",
            "Qwen/Qwen2.5-0.5B",
            "--memory",
            "24",
            "--json",
        ][..],
        &["estimate", "--model", "Qwen/Qwen9-7B", "--json"][..],
        &["recipe", "check", "/nonexistent-moro/moro.yaml", "--json"][..],
    ] {
        let o = run(args);
        assert_eq!(o.code, 2, "{args:?}: {}", o.stderr);
        let v: serde_json::Value = serde_json::from_str(&o.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", o.stdout));
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert_eq!(e["exit_code"], 2, "{v}");
        assert!(o.stderr.is_empty(), "{args:?}: {}", o.stderr);
    }
    let o = run(&["estimate", "--model", "Qwen/Qwen9-7B", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    assert!(
        v["error"]["hint"]
            .as_str()
            .is_some_and(|h| h.contains("Qwen/")),
        "{v}"
    );
    // A job's error names its field.
    let args = [
        "estimate",
        "--model",
        "Qwen/Qwen2.5-0.5B",
        "--method",
        "full",
    ];
    let o = run(&[&args[..], &["--lora-rank", "8", "--json"]].concat());
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    assert_eq!(v["error"]["field"], "lora_rank", "{v}");
}

/// What clap refuses before any command runs is JSON too under `--json`: the argument as
/// the field, clap's tip as the hint; without `--json`, clap's words on stderr.
#[test]
fn command_line_errors_are_json_when_json_is_asked_for() {
    for (args, field, message, hint) in [
        (
            &["estimate", "--json", "--lora-r", "8"][..],
            "lora_r",
            "unexpected argument '--lora-r' found",
            Some("a similar argument exists: '--lora-rank'"),
        ),
        (
            &[
                "estimate",
                "--model",
                "Qwen/Qwen2.5-0.5B",
                "--seq-len",
                "long",
                "--json",
            ][..],
            "seq_len",
            "invalid value 'long' for '--seq-len <SEQ_LEN>': `long` is not a whole number",
            None,
        ),
        (
            &["fit", "--json", "--method", "qlor"][..],
            "method",
            "invalid value 'qlor' for '--method <METHOD>': unknown method `qlor`; use auto, \
             full, lora, qlora or inference",
            None,
        ),
    ] {
        let o = run(args);
        assert_eq!(o.code, 2, "{args:?}");
        assert!(o.stderr.is_empty(), "{args:?}: {}", o.stderr);
        let v: serde_json::Value = serde_json::from_str(&o.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", o.stdout));
        assert_eq!(v["error"]["field"], field, "{v}");
        assert_eq!(v["error"]["message"], message, "{v}");
        assert_eq!(v["error"]["hint"].as_str(), hint, "{v}");
    }
    let o = run(&["estimate", "--lora-r", "8"]);
    assert_eq!(o.code, 2);
    assert!(o.stdout.is_empty(), "{}", o.stdout);
    assert!(
        o.stderr
            .starts_with("error: unexpected argument '--lora-r'"),
        "{}",
        o.stderr
    );
    // A value that only looks like the flag, after `--`, is not a request for JSON.
    let o = run(&["estimate", "--lora-r", "--", "--json"]);
    assert!(o.stdout.is_empty(), "{}", o.stdout);
}

#[test]
fn bad_config_files_name_the_problem() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{ \"model_type\": \"llama\", ").expect("write");
    bad(
        &["estimate", "--model", broken.to_str().expect("utf8")],
        "broken.json",
    );

    let unknown = dir.path().join("unknown.json");
    std::fs::write(&unknown, r#"{"model_type": "mamba", "hidden_size": 64}"#).expect("write");
    let o = run(&["estimate", "--model", unknown.to_str().expect("utf8")]);
    assert_eq!(o.code, 2);
    assert!(
        o.stderr.contains("mamba") && o.stderr.contains("llama"),
        "{}",
        o.stderr
    );

    let incomplete = dir.path().join("incomplete.json");
    std::fs::write(&incomplete, r#"{"model_type": "llama", "hidden_size": 64}"#).expect("write");
    bad(
        &["estimate", "--model", incomplete.to_str().expect("utf8")],
        "field",
    );
}

#[test]
fn hf_cache_is_searched_before_the_catalog() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = dir.path().join("models--acme--tiny-llama");
    let snap = repo.join("snapshots").join("0123abc");
    std::fs::create_dir_all(&snap).expect("mkdir");
    std::fs::create_dir_all(repo.join("refs")).expect("mkdir");
    std::fs::write(repo.join("refs").join("main"), "0123abc").expect("write");
    let config = r#"{"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 1000, "tie_word_embeddings": false, "torch_dtype": "bfloat16"}"#;
    std::fs::write(snap.join("config.json"), config).expect("write");
    let o = moro()
        .env("HF_HUB_CACHE", dir.path())
        .args(["estimate", "--model", "acme/tiny-llama", "--json"])
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["model"]["source"], "Hugging Face cache");
    // By hand: embeddings 2·1000·256, per layer q 256·256 + k,v 2·256·128 + o 256·256 +
    // MLP 3·256·512 + 2 norms·256, final norm 256.
    let per_layer = 256 * 256 + 2 * 256 * 128 + 256 * 256 + 3 * 256 * 512 + 2 * 256;
    assert_eq!(
        v["model"]["parameters"].as_u64(),
        Some(2 * 1000 * 256 + 2 * per_layer + 256)
    );
}

#[test]
fn models_json_lists_the_catalog() {
    let v = json(&["models", "--json"]);
    let arr = v.as_array().expect("array");
    assert!(arr.len() >= 69, "{}", arr.len());
    let qwen = arr
        .iter()
        .find(|e| e["id"] == "Qwen/Qwen2.5-7B")
        .expect("listed");
    assert_eq!(qwen["model_type"], "qwen2");
    assert_eq!(qwen["parameters"].as_u64(), Some(7_615_616_512));
}

#[test]
fn validate_json_shape() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../validation/measured.jsonl"
    );
    let v = json(&["validate", path, "--json"]);
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 221);
    for r in rows {
        let status = r["status"].as_str().expect("status");
        assert!(
            ["ok", "skipped", "oom_ok", "oom_missed"].contains(&status),
            "{status}"
        );
        if status == "ok" {
            assert!(r["predicted_bytes"].is_u64() && r["measured_bytes"].is_u64());
            assert!(r["error"].is_f64());
        }
        if status == "skipped" {
            assert!(r["reason"].is_string());
        }
    }
    assert!(v["summary"]["overall"]["median_abs"].is_f64());
}

#[test]
fn validate_missing_file_is_exit_2() {
    bad(&["validate", "/nonexistent/rows.jsonl"], "rows.jsonl");
}

/// `--explain ID` shows the job a row was read as, and predicts exactly what the full report
/// does for that row; an unknown id is a one-line error, exit 2.
#[test]
fn validate_explain_matches_the_report() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../validation/measured.jsonl"
    );
    let id = "litgpt-config-hub-027";
    let x = json(&["validate", path, "--explain", id, "--json"]);
    assert_eq!(x["row"]["job"]["stack"], "litgpt");
    assert_eq!(
        x["row"]["job"]["versions"]["bitsandbytes"],
        serde_json::json!([0, 42, 0])
    );
    let report = json(&["validate", path, "--json"]);
    let row = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == id)
        .expect("row");
    assert_eq!(x["predicted_bytes"], row["predicted_bytes"]);
    assert_eq!(x["error"], row["error"]);
    let text = run(&["validate", path, "--explain", id]);
    assert_eq!(text.code, 0, "{}", text.stderr);
    assert!(text.stdout.contains("measured") && text.stdout.contains("activations"));
    bad(
        &["validate", path, "--explain", "no-such-row"],
        "no-such-row",
    );
}

/// `--reduce-bucket-size` is DeepSpeed's bucket: ZeRO-2 holds two 16-bit buffers of it during
/// backward, so 2e8 instead of "auto" (Qwen-1.8B: 2,048²) adds 2 × (2e8 − 2,048²) × 2 bytes.
#[test]
fn reduce_bucket_size_flag_sizes_deepspeed_buckets() {
    let peak = |extra: &[&str]| {
        let mut args = vec![
            "estimate",
            "--model",
            "Qwen/Qwen-1_8B",
            "--method",
            "lora",
            "--gpus",
            "1",
            "--strategy",
            "zero2",
            "--json",
        ];
        args.extend_from_slice(extra);
        json(&args)["peak_allocated_bytes"].as_u64().unwrap()
    };
    let auto = peak(&[]);
    let qwen = peak(&["--reduce-bucket-size", "200000000"]);
    assert_eq!(qwen - auto, 2 * (200_000_000 - 2048 * 2048) * 2);
    bad(
        &[
            "estimate",
            "--model",
            "Qwen/Qwen-1_8B",
            "--reduce-bucket-size",
            "0",
        ],
        "--reduce-bucket-size",
    );
}

/// PEFT's other methods from the command line: IA³ on Llama-3.2-3B's k, v and down_proj
/// trains 28 · (1,024 + 1,024 + 8,192) = 286,720 parameters (PEFT's benchmark prints the
/// same), and the text names the method; prompt tuning's virtual tokens are validated.
#[test]
fn other_peft_methods_from_flags() {
    let args = [
        "estimate",
        "--model",
        "meta-llama/Llama-3.2-3B",
        "--peft",
        "ia3",
        "--target-modules",
        "k_proj,v_proj,down_proj",
    ];
    let mut with_json = args.to_vec();
    with_json.push("--json");
    let j = json(&with_json);
    assert_eq!(j["trainable_params"].as_u64(), Some(286_720));
    let text = run(&args);
    assert_eq!(text.code, 0, "{}", text.stderr);
    assert!(text.stdout.contains("PEFT ia3"), "{}", text.stdout);
    // With the MLP's three as feedforward modules (input scaling): 28 · (3,072 + 1,024 +
    // 1,024 + 3,072 + 3,072 + 3,072 + 8,192) = 630,784, PEFT's count for that config.
    let ff = json(&[
        "estimate",
        "--model",
        "meta-llama/Llama-3.2-3B",
        "--peft",
        "ia3",
        "--target-modules",
        "gate_proj,o_proj,q_proj,k_proj,v_proj,down_proj,up_proj",
        "--feedforward-modules",
        "up_proj,gate_proj,down_proj",
        "--json",
    ]);
    assert_eq!(ff["trainable_params"].as_u64(), Some(630_784));
    bad(
        &[
            "estimate",
            "--model",
            "meta-llama/Llama-3.2-3B",
            "--peft",
            "prompt-tuning",
            "--virtual-tokens",
            "0",
        ],
        "--virtual-tokens",
    );
    bad(
        &[
            "estimate",
            "--model",
            "meta-llama/Llama-3.2-3B",
            "--peft",
            "bitfit",
        ],
        "unknown PEFT method",
    );
    bad(
        &[
            "estimate",
            "--model",
            "meta-llama/Llama-3.2-3B",
            "--peft",
            "dora",
        ],
        "`--peft lora --dora`",
    );
}

/// The bound comes with every estimate, and "fits" is judged on it: with memory between the
/// prediction and the bound the verdict is "uncertain" (exit 1), above the bound "fits"
/// (exit 0), under the prediction "does not fit" (exit 1). The band names the regime and how
/// many runs and sources stand behind it.
#[test]
fn estimate_is_judged_on_its_upper_bound() {
    let job = [
        "estimate",
        "--model",
        "Qwen/Qwen2.5-7B",
        "--method",
        "qlora",
        "--seq-len",
        "2048",
    ];
    let v = json(&[&job[..], &["--json"]].concat());
    let d = v["peak_device_bytes"].as_u64().unwrap();
    let up = v["peak_upper_bytes"].as_u64().unwrap();
    assert!(up >= d + (512 << 20), "{up} vs {d}");
    let u = &v["upper"];
    let (ua, ur, ud) = (
        u["allocated"].as_u64().unwrap(),
        u["reserved"].as_u64().unwrap(),
        u["device"].as_u64().unwrap(),
    );
    assert!(ua >= v["peak_allocated_bytes"].as_u64().unwrap() && ua <= ur && ur <= ud);
    assert_eq!(ud, up);
    assert!(v["band"]["sources"].as_u64().unwrap() >= 3, "{}", v["band"]);
    assert_eq!(v["band"]["coverage_percent"], 95);
    assert_eq!(v["band"]["coverage"], 0.95);
    assert!(v["band"]["regime"].as_str().unwrap().contains("one GPU"));

    let gib = |b: u64| format!("{}B", b);
    let between = gib(d + (up - d) / 2);
    let o = run(&[&job[..], &["--memory", &between]].concat());
    assert_eq!(o.code, 1, "{}", o.stdout);
    assert!(o.stdout.contains("uncertain on"), "{}", o.stdout);
    let v = json(&[&job[..], &["--memory", &between, "--json"]].concat());
    assert_eq!(v["verdict"], "uncertain");
    assert_eq!(v["fits"], false);

    let above = gib(up);
    let o = run(&[&job[..], &["--memory", &above]].concat());
    assert_eq!(o.code, 0, "{}", o.stdout);
    assert!(o.stdout.contains("fits on"), "{}", o.stdout);
    assert!(o.stdout.contains("at most"), "{}", o.stdout);

    let under = gib(d - 1);
    let v = json(&[&job[..], &["--memory", &under, "--json"]].concat());
    assert_eq!(v["verdict"], "does_not_fit");
}

/// `moro validate --json` gives each compared row its bound and the summary the bound's
/// coverage, in-sample and with each source left out; several files are one set.
#[test]
fn validate_reports_the_bound() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../validation/");
    let files = [
        format!("{root}measured.jsonl"),
        format!("{root}h200/measured.jsonl"),
    ];
    let v = json(&["validate", &files[0], &files[1], "--json"]);
    let rows = v["rows"].as_array().unwrap();
    let ok: Vec<_> = rows.iter().filter(|r| r["status"] == "ok").collect();
    assert!(ok.len() > 250, "{}", ok.len());
    for r in &ok {
        let (p, u) = (
            r["predicted_bytes"].as_u64().unwrap(),
            r["predicted_upper_bytes"].as_u64().unwrap(),
        );
        assert!(u >= p, "{}", r["id"]);
    }
    let s = &v["summary"];
    let covered = ok
        .iter()
        .filter(|r| r["measured_bytes"].as_u64() <= r["predicted_upper_bytes"].as_u64())
        .count();
    #[allow(clippy::cast_precision_loss)]
    let share = covered as f64 / ok.len() as f64;
    assert!((s["upper_coverage"].as_f64().unwrap() - share).abs() < 1e-9);
    assert!(s["upper_ratio_median"].as_f64().unwrap() >= 1.0);
    let loso = s["upper_by_regime"]["leave_one_source_out"]
        .as_array()
        .unwrap();
    let one = loso.iter().find(|r| r["regime"] == "one GPU").unwrap();
    assert!(one["sources"].as_u64().unwrap() >= 15, "{one}");
}

/// Words, not debug text: the job line names the strategy as a person does, and the note on
/// memory outside PyTorch's allocator names only what this job has.
#[test]
fn output_speaks_words() {
    let base = ["estimate", "--model", "Qwen/Qwen2.5-7B"];
    let o = run(&[
        &base[..],
        &["--method", "full", "--gpus", "8", "--strategy", "zero3"],
    ]
    .concat());
    assert!(o.stdout.contains("8 GPUs (ZeRO-3)"), "{}", o.stdout);
    assert!(!o.stdout.contains("Zero3"), "{}", o.stdout);
    let o = run(&[&base[..], &["--method", "lora", "--gpus", "2"]].concat());
    assert!(o.stdout.contains("2 GPUs (DDP)"), "{}", o.stdout);
    assert!(!o.stdout.contains("(None)"), "{}", o.stdout);
    let o = run(&[
        &base[..],
        &[
            "--method",
            "inference",
            "--gpus",
            "2",
            "--strategy",
            "zero3",
        ],
    ]
    .concat());
    assert!(o.stdout.contains("note: NCCL buffers sit"), "{}", o.stdout);
    assert!(!o.stdout.contains("paged"), "{}", o.stdout);
}

/// The job line says in what dtype the adapters train: PEFT upcasts them to fp32 on a bf16
/// model (`get_peft_model(..., autocast_adapter_dtype=True)`, its default), and the estimate
/// counts them so; torchtune builds them in the model's dtype.
#[test]
fn the_job_line_names_the_adapters_dtype() {
    let base = [
        "estimate",
        "--model",
        "meta-llama/Llama-3.2-3B",
        "--method",
        "lora",
        "--precision",
        "bf16",
    ];
    let hf = json(&[&base[..], &["--json"]].concat());
    let trainable = hf["trainable_params"].as_u64().unwrap();
    let adapters = hf["components"]["adapters"].as_u64().unwrap();
    assert_eq!(adapters, 4 * trainable, "{hf}");
    let o = run(&base);
    assert!(
        o.stdout
            .contains("bf16 (fp32 adapters on a bf16 model, no autocast)"),
        "{}",
        o.stdout
    );
    let tt = json(&[&base[..], &["--stack", "torchtune", "--json"]].concat());
    let trainable = tt["trainable_params"].as_u64().unwrap();
    assert_eq!(
        tt["components"]["adapters"].as_u64().unwrap(),
        2 * trainable,
        "{tt}"
    );
    let o = run(&[&base[..], &["--stack", "torchtune"]].concat());
    assert!(
        o.stdout.contains("bf16 (bf16 adapters, no autocast)"),
        "{}",
        o.stdout
    );
    // TRL casts a quantized model's trainable parameters to bf16 (`sft_trainer.py`), under
    // autocast too: the line says so, as the adapters' bytes count them.
    let trl = [
        "estimate",
        "--model",
        "meta-llama/Llama-3.2-3B",
        "--method",
        "qlora",
        "--stack",
        "trl",
    ];
    let v = json(&[&trl[..], &["--json"]].concat());
    assert_eq!(
        v["components"]["adapters"].as_u64().unwrap(),
        2 * v["trainable_params"].as_u64().unwrap(),
        "{v}"
    );
    let o = run(&trl);
    assert!(
        o.stdout
            .contains("bf16-mixed (bf16 adapters under bf16 autocast)"),
        "{}",
        o.stdout
    );
}

/// "Does not fit" is not a dead end: the issue's Llama-2-7B full fine-tune on one H100 lists
/// configurations of the same method, context and effective batch whose bound fits, and when
/// nothing like the job fits (a 70B full fine-tune on a 24 GB card) what would.
#[test]
fn does_not_fit_says_what_would() {
    let job = common::LLAMA2_FULL_ON_H100;
    let o = run(&job);
    assert_eq!(o.code, 1);
    assert!(o.stdout.contains("does NOT fit"), "{}", o.stdout);
    assert!(o.stdout.contains("what fits here"), "{}", o.stdout);
    let v = json(&[&job[..], &["--json"]].concat());
    let same = v["suggestions"]["same_job"].as_array().unwrap();
    assert!(!same.is_empty(), "{v}");
    for s in same {
        assert!(s["peak_upper_bytes"].as_u64().unwrap() <= v["memory_bytes"].as_u64().unwrap());
        assert_eq!(s["job"]["method"], "full");
        assert_eq!(s["job"]["seq_len"], v["job"]["seq_len"]);
    }
    // None is another one with checkpointing added for no lower bound: only slower.
    for a in same {
        for b in same {
            let mut a_ckpt = a["job"].clone();
            a_ckpt["gradient_checkpointing"] = true.into();
            let slower_copy = a["job"]["gradient_checkpointing"] == false
                && b["job"] == a_ckpt
                && b["peak_upper_bytes"].as_u64() >= a["peak_upper_bytes"].as_u64();
            assert!(!slower_copy, "{b} only adds checkpointing to {a}");
        }
    }
    let o = run(&[
        "estimate",
        "--model",
        "meta-llama/Llama-3.1-70B-Instruct",
        "--method",
        "full",
        "--hardware",
        "rtx-4090",
    ]);
    assert_eq!(o.code, 1);
    assert!(o.stdout.contains("what would fit:"), "{}", o.stdout);
    // "More GPUs" means more than the job's own: `--gpus 2 --memory 24GiB` names one device
    // of two, and the alternative it offers has at least four.
    let v = json(&[
        "estimate",
        "--model",
        "meta-llama/Llama-2-70b-hf",
        "--method",
        "qlora",
        "--gpus",
        "2",
        "--strategy",
        "fsdp_full_shard",
        "--memory",
        "24GiB",
        "--json",
    ]);
    let more = &v["suggestions"]["alternatives"]["more_gpus"];
    assert!(more["gpus"].as_u64().unwrap() > 2, "{v}");
    // A job that fits gets no suggestions.
    let v = json(&[
        "estimate",
        "--model",
        "Qwen/Qwen2.5-0.5B",
        "--memory",
        "80GiB",
        "--json",
    ]);
    assert!(v.get("suggestions").is_none());
}

/// The README's "does not fit" transcript is what the binary prints.
#[test]
fn readme_does_not_fit_transcript_is_true() {
    let readme = include_str!("../../../README.md");
    let cmd = "$ moro estimate --model meta-llama/Llama-2-7b-hf --method full --precision \
               bf16-mixed --optimizer adamw_torch --hardware h100-sxm\n…\n";
    let at = readme.find(cmd).expect("the transcript is in the README") + cmd.len();
    let shown = &readme[at..at + readme[at..].find("```").unwrap()];
    let args: Vec<&str> = cmd[2..cmd.find('\n').unwrap()].split(' ').skip(1).collect();
    let o = run(&args);
    let tail = &o.stdout[o.stdout.find("does NOT fit").unwrap()..];
    assert_eq!(shown, tail);
}

/// Names are honest: an alias keeps its own name and says whose config stands in for it,
/// and an unknown id that cannot reach the Hub still gets the nearest catalog names.
#[test]
fn stand_ins_and_unknown_ids_say_so() {
    let o = run(&[
        "estimate",
        "--model",
        "meta-llama/Meta-Llama-3-70B-Instruct",
        "--method",
        "qlora",
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains(
            "meta-llama/Meta-Llama-3-70B-Instruct (llama, 70.55B parameters, from embedded \
             catalog: `meta-llama/Meta-Llama-3-70B`'s config, same architecture)"
        ),
        "{}",
        o.stdout
    );
    let v = json(&[
        "estimate",
        "--model",
        "meta-llama/Meta-Llama-3-70B-Instruct",
        "--method",
        "qlora",
        "--json",
    ]);
    assert_eq!(v["model"]["id"], "meta-llama/Meta-Llama-3-70B-Instruct");

    // No network: an endpoint nothing listens on.
    let o = moro()
        .env_remove("HF_HUB_OFFLINE")
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .args(["estimate", "--model", "someorg/Llama-3.1-8B-x"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("did you mean `meta-llama/Llama-3.1-8B`"),
        "{stderr}"
    );
}

/// Settings are checked against the hardware: what cannot run is refused naming the setting
/// and the hardware fact, what runs but is unusual is a warning on stderr.
#[test]
fn settings_are_checked_against_the_hardware() {
    let m = ["estimate", "--model", "Qwen/Qwen2.5-7B"];
    bad(
        &[
            &m[..],
            &["--attention", "flash", "--hardware", "v100-sxm2-32gb"],
        ]
        .concat(),
        "compute capability 7.0",
    );
    bad(
        &[
            &m[..],
            &["--method", "qlora", "--hardware", "apple-m3-max-64gb"],
        ]
        .concat(),
        "Apple GPU",
    );
    // 512 tokens: at the default 2,048 the math kernel's fp32 softmax, kept by every layer
    // without checkpointing, does not fit a T4.
    let small = [
        "estimate",
        "--model",
        "Qwen/Qwen2.5-0.5B",
        "--seq-len",
        "512",
    ];
    let o = run(&[
        &small[..],
        &["--precision", "bf16-mixed", "--hardware", "t4"],
    ]
    .concat());
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stderr.contains("warning: precision bf16-mixed"),
        "{}",
        o.stderr
    );
    let o = run(&[
        "estimate",
        "--model",
        "meta-llama/Llama-2-7b-hf",
        "--seq-len",
        "200000",
    ]);
    assert!(
        o.stderr.contains("beyond the model's 4096 positions"),
        "{}",
        o.stderr
    );
    // The same job on a GPU that runs it says nothing.
    let o = run(&[
        &m[..],
        &["--attention", "flash", "--hardware", "a100-sxm4-80gb"],
    ]
    .concat());
    assert_eq!(o.code, 0);
    assert!(!o.stderr.contains("warning"), "{}", o.stderr);
}

/// LoRA on the output layer is not modelled: a job that asks for it is estimated without it
/// and says so, whether it came from flags or a moro.yaml, instead of dropping it silently.
#[test]
fn lora_on_the_output_layer_is_named_as_left_out() {
    let flags = [
        "estimate",
        "--model",
        "Qwen/Qwen2.5-0.5B",
        "--method",
        "lora",
        "--target-modules",
        "q_proj,v_proj,lm_head",
    ];
    let o = run(&flags);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stderr.contains(
            "warning: target_modules `lm_head`: LoRA on the output layer is not modelled"
        ),
        "{}",
        o.stderr
    );
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("moro.yaml");
    std::fs::write(
        &recipe,
        "model:\n  base: Qwen/Qwen2.5-0.5B\n  method: lora\n  target_modules: [q_proj, v_proj, lm_head]\n",
    )
    .unwrap();
    let o = run(&["estimate", recipe.to_str().unwrap()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.contains("`lm_head`"), "{}", o.stderr);
    let o = run(&flags[..5]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stderr.contains("lm_head"), "{}", o.stderr);
}

/// `moro completions SHELL` prints a script that knows the subcommands and their flags.
#[test]
fn completions_cover_the_commands() {
    for shell in ["bash", "zsh", "fish", "powershell"] {
        let o = run(&["completions", shell]);
        assert_eq!(o.code, 0, "{shell}: {}", o.stderr);
        for word in ["estimate", "recipe", "lora-rank", "hardware"] {
            assert!(o.stdout.contains(word), "{shell} lacks {word}");
        }
    }
    assert_eq!(run(&["completions", "tcsh"]).code, 2);
}

/// The README's count of the embedded catalog is the catalog's (it had drifted: 84 for 85).
#[test]
fn readme_catalog_count_is_the_catalogs() {
    let readme = include_str!("../../../README.md");
    let at = readme
        .find(" HF configs, exact parameter counts")
        .expect("the README names the catalog's size");
    let said: usize = readme[..at]
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a number before ` HF configs`");
    let o = run(&["models", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let models: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    assert_eq!(said, models.as_array().expect("a list").len());
}

/// A repository the Hub renamed (`Meta-Llama-3.1-8B` → `Llama-3.1-8B`) resolves offline to
/// today's id, says so, and estimates the same bytes.
#[test]
fn renamed_repositories_resolve_with_a_note() {
    let est = |model: &str| json(&["estimate", "--model", model, "--method", "qlora", "--json"]);
    let old = est("meta-llama/Meta-Llama-3.1-8B");
    let new = est("meta-llama/Llama-3.1-8B");
    assert_eq!(old["model"]["id"], "meta-llama/Llama-3.1-8B");
    assert!(
        old["model"]["source"]
            .as_str()
            .unwrap()
            .contains("since the Hub renamed it"),
        "{old}"
    );
    assert_eq!(old["peak_device_bytes"], new["peak_device_bytes"]);
}

/// `--svg`'s sweeps refuse what the job itself would be refused: a V100 has no
/// FlashAttention 2 (compute capability 7.0), so no flash line is drawn for it; an A100 has one.
#[test]
fn svg_sweeps_draw_only_what_the_hardware_runs() {
    let dir = tempfile::tempdir().unwrap();
    let svg = |hardware: &str| {
        let path = dir.path().join(format!("{hardware}.svg"));
        let out = run(&[
            "estimate",
            "--model",
            "Qwen/Qwen2.5-0.5B",
            "--method",
            "lora",
            "--seq-len",
            "1024",
            "--hardware",
            hardware,
            "--svg",
            path.to_str().unwrap(),
        ]);
        assert!(out.code == 0 || out.code == 1, "{}", out.stderr);
        std::fs::read_to_string(path).unwrap()
    };
    let v100 = svg("v100-sxm2-32gb");
    assert!(!v100.contains("flash attention"), "no flash on a V100");
    assert!(v100.contains("sdpa attention") && v100.contains("eager attention"));
    assert!(svg("a100-sxm4-80gb").contains("flash attention"));
}

/// What transformers 5 and PEFT 0.21 cannot run on MoE models is refused, naming the setting:
/// SDPA on gpt-oss's attention sinks, MXFP4 experts in training, dropout on LoRA over
/// Qwen3-MoE's stacked experts. Left unsaid, each gets the value that runs: eager attention,
/// MXFP4 inference (12.82 GiB of weights, the checkpoint's 13.76 GB), LoRA without dropout.
#[test]
fn moe_settings_transformers_cannot_run_are_refused() {
    bad(
        &[
            "estimate",
            "--model",
            "openai/gpt-oss-20b",
            "--attention",
            "sdpa",
        ],
        "attention sinks",
    );
    bad(
        &[
            "estimate",
            "--model",
            "openai/gpt-oss-20b",
            "--method",
            "lora",
            "--quantization",
            "mxfp4",
        ],
        "dequantize=True",
    );
    bad(
        &[
            "estimate",
            "--model",
            "Qwen/Qwen3-30B-A3B",
            "--lora-dropout",
            "0.05",
        ],
        "ParamWrapper",
    );
    let v = json(&[
        "estimate",
        "--model",
        "openai/gpt-oss-20b",
        "--method",
        "inference",
        "--json",
    ]);
    let text = v.to_string();
    assert!(text.contains("mxfp4"), "{text}");
    assert!(text.contains("eager"), "{text}");
    let o = run(&[
        "estimate",
        "--model",
        "Qwen/Qwen3-30B-A3B",
        "--method",
        "lora",
    ]);
    assert!(o.code == 0 || o.code == 1, "{}", o.stderr);
}

/// `--liger` models Liger's kernels and names what it changes; settings Liger cannot take are
/// refused naming the field (docs/liger-kernels.md).
#[test]
fn liger_is_estimated_and_its_contradictions_are_refused() {
    let base = [
        "estimate",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--method",
        "lora",
        "--seq-len",
        "2048",
        "--gradient-checkpointing=false",
        "--json",
    ];
    let (p, l, liger) = peaks_without_and_with(&base, "--liger");
    // Per layer and token, RMSNorm (2 × 2h saved less, frozen weights) and SwiGLU (2I less):
    // (4·4096 + 2·14336) B × 2048 tokens × 32 layers ≈ 2.75 GiB; and the fp32 logits.
    let per_layers = (4 * 4096 + 2 * 14336) * 2048 * 32;
    assert!(p - l > per_layers, "{p} → {l}");
    assert_eq!(liger["job"]["liger"]["rms_norm"], true, "{liger}");

    for (args, field) in [
        (
            &["--model", "Qwen/Qwen1.5-MoE-A2.7B-Chat", "--liger"][..],
            "liger",
        ),
        (
            &["--model", "EleutherAI/pythia-410m", "--liger"][..],
            "liger",
        ),
        (
            &[
                "--model",
                "meta-llama/Llama-3.1-8B",
                "--liger",
                "--stack",
                "torchtune",
            ][..],
            "liger",
        ),
        (
            &[
                "--model",
                "meta-llama/Llama-3.1-8B",
                "--liger",
                "--loss",
                "chunked",
            ][..],
            "loss",
        ),
        (
            &[
                "--model",
                "meta-llama/Llama-3.1-8B",
                "--method",
                "inference",
                "--liger",
            ][..],
            "liger",
        ),
        (
            &[
                "--model",
                "meta-llama/Llama-3.1-8B",
                "--liger-kernels",
                "layer_norm",
            ][..],
            "liger_kernels",
        ),
        (
            &[
                "--model",
                "meta-llama/Llama-3.2-3B",
                "--liger",
                "--hardware",
                "apple-m4-16gb",
            ][..],
            "liger",
        ),
    ] {
        let mut a = vec!["estimate", "--json"];
        a.extend_from_slice(args);
        assert_refused(&a, field);
    }
}

/// The allocated peaks of `base` without and with `flag`, and the estimate with it.
fn peaks_without_and_with(base: &[&str], flag: &str) -> (u64, u64, serde_json::Value) {
    let without = json(base);
    let mut args = base.to_vec();
    args.push(flag);
    let with = json(&args);
    (
        without["peak_allocated_bytes"].as_u64().unwrap(),
        with["peak_allocated_bytes"].as_u64().unwrap(),
        with,
    )
}

/// `args` exit 2 with a JSON error naming `field`.
fn assert_refused(args: &[&str], field: &str) {
    let o = run(args);
    assert_eq!(o.code, 2, "{args:?}: {}", o.stdout);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(v["error"]["field"], field, "{args:?}: {v}");
}

/// `--compile` models what Inductor's partitioner saves (docs/torch-compile.md) and refuses,
/// naming the field, what was not traced under it.
#[test]
fn compile_is_estimated_and_what_was_not_traced_is_refused() {
    let base = [
        "estimate",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--method",
        "lora",
        "--lora-dropout",
        "0",
        "--seq-len",
        "2048",
        "--gradient-checkpointing=false",
        "--json",
    ];
    let (e, c, compiled) = peaks_without_and_with(&base, "--compile");
    // The traced per-layer difference alone, 69,632 B/token × 2048 tokens × 32 layers
    // (4.25 GiB); the H200 measured 4.96 GiB less compiled.
    assert!(e - c > 69_632 * 2048 * 32, "{e} → {c}");
    assert_eq!(compiled["job"]["compile"], true, "{compiled}");

    for (args, field) in [
        (&["--method", "qlora"][..], "quantization"),
        (&["--model", "Qwen/Qwen1.5-MoE-A2.7B-Chat"][..], "compile"),
        (&["--stack", "litgpt"][..], "compile"),
        (
            &["--stack", "torchtune", "--model", "Qwen/Qwen2.5-7B"][..],
            "compile",
        ),
        (&["--liger"][..], "liger"),
        (&["--dora"][..], "dora"),
        (&["--attention", "eager"][..], "attention"),
    ] {
        let mut a = vec!["estimate", "--json", "--compile"];
        if !args.contains(&"--model") {
            a.extend_from_slice(&["--model", "meta-llama/Llama-3.1-8B"]);
        }
        a.extend_from_slice(args);
        assert_refused(&a, field);
    }
}

/// torchtune's activation offloading keeps two layer inputs on the GPU and moves the rest
/// to pinned host memory: Llama-3.2-3B at 2 × 4,096 tokens, 28 layers of 2 · 3,072 B per
/// token each, 26 of them offloaded (1.22 GiB) by hand. Without checkpointing, or on a
/// stack whose offloading moro has not read, it is refused naming the field.
#[test]
fn activation_offload_moves_checkpoints_to_the_host() {
    let base = [
        "estimate",
        "--model",
        "meta-llama/Llama-3.2-3B",
        "--stack",
        "torchtune",
        "--method",
        "lora",
        "--micro-batch-size",
        "2",
        "--seq-len",
        "4096",
        "--json",
    ];
    let checkpointed = [&base[..], &["--gradient-checkpointing"]].concat();
    let (e, o, offloaded) = peaks_without_and_with(&checkpointed, "--activation-offload");
    let by_hand = 26 * 2 * 3072 * 8192;
    assert_eq!(
        offloaded["host_bytes"].as_u64(),
        Some(by_hand),
        "{offloaded}"
    );
    assert!(e - o <= by_hand && e - o > by_hand / 2, "{e} → {o}");
    let mut unchecked = base.to_vec();
    unchecked.push("--activation-offload");
    assert_refused(&unchecked, "activation_offload");
    let hf: Vec<&str> = checkpointed
        .iter()
        .map(|a| if *a == "torchtune" { "hf" } else { *a })
        .chain(["--activation-offload"])
        .collect();
    assert_refused(&hf, "activation_offload");
}

/// The README's table of the bound's coverage is what `moro validate` prints for the
/// command it names.
#[test]
fn readme_bound_table_is_what_validate_prints() {
    let readme = include_str!("../../../README.md");
    let start = readme
        .find("(`moro validate validation/")
        .expect("the README names the command");
    let after = &readme[start + 2..];
    let command = &after[..after.find('`').unwrap()];
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../");
    let files: Vec<String> = command
        .split(' ')
        .skip(2)
        .map(|f| format!("{root}{f}"))
        .collect();
    let mut args = vec!["validate"];
    args.extend(files.iter().map(String::as_str));
    let o = run(&args);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let percent = |p: &str| p.replace('%', " %").replace("100.0 %", "100 %");
    let table = &readme[start..];
    let mut checked = 0;
    for line in table.lines().skip_while(|l| !l.starts_with("| one GPU")) {
        if !line.starts_with('|') {
            break;
        }
        let regime = line.split('|').nth(1).unwrap().trim();
        let printed = o
            .stdout
            .lines()
            .find(|l| {
                l.strip_prefix(regime).is_some_and(|r| {
                    r.starts_with("  ") && r.trim_start().starts_with(char::is_numeric)
                })
            })
            .unwrap_or_else(|| panic!("`{regime}` is not printed:\n{}", o.stdout));
        let v: Vec<&str> = printed[regime.len()..].split_whitespace().collect();
        let row = format!(
            "| {regime} | {} | {} | {} | {} | {} | {} |",
            v[0],
            v[1],
            percent(v[2]),
            v[3],
            percent(v[4]),
            v[5]
        );
        assert_eq!(line, row);
        checked += 1;
    }
    assert!(checked >= 6, "{checked} rows");
}

/// `--stack unsloth` estimates what Unsloth's kernels keep and refuses, naming the field,
/// what was not read of it.
#[test]
fn unsloth_stack_is_estimated_and_what_was_not_read_is_refused() {
    let base = [
        "estimate",
        "--json",
        "--model",
        "meta-llama/Llama-3.1-8B",
        "--method",
        "qlora",
        "--seq-len",
        "2048",
        "--micro-batch-size",
        "2",
    ];
    let trl = json(&[&base[..], &["--stack", "trl"]].concat());
    let with = json(&[&base[..], &["--stack", "unsloth"]].concat());
    let (trl, unsloth) = (
        trl["peak_allocated_bytes"].as_u64().unwrap(),
        with["peak_allocated_bytes"].as_u64().unwrap(),
    );
    // No logits tensor and offloaded checkpoints: less than TRL's step.
    assert!(unsloth < trl, "{trl} → {unsloth}");
    assert_eq!(with["job"]["stack"], "unsloth", "{with}");
    assert!(with["host_bytes"].as_u64().unwrap() > 0, "{with}");
    for (args, field) in [
        (&["--model", "google/gemma-2-9b"][..], "stack"),
        (&["--method", "full"][..], "method"),
        (&["--liger"][..], "liger"),
        (&["--loss", "chunked"][..], "loss"),
        (&["--attention", "eager"][..], "attention"),
        (&["--hardware", "apple-m4-16gb"][..], "stack"),
    ] {
        let mut a = base.to_vec();
        if args.contains(&"--method") || args.contains(&"--model") {
            a.truncate(2);
            a.extend_from_slice(&["--seq-len", "2048"]);
            if !args.contains(&"--model") {
                a.extend_from_slice(&["--model", "meta-llama/Llama-3.1-8B"]);
            }
        }
        a.extend_from_slice(&["--stack", "unsloth"]);
        a.extend_from_slice(args);
        assert_refused(&a, field);
    }
    // The recipe search refuses it on a GPU without Triton too.
    assert_refused(
        &[
            "recipe",
            "generate",
            "--json",
            "--model",
            "Qwen/Qwen2.5-0.5B",
            "--stack",
            "unsloth",
            "--hardware",
            "apple-m4-16gb",
        ],
        "stack",
    );
}

#[test]
fn mlx_stack_is_estimated_and_what_mlx_lacks_is_refused() {
    let base = [
        "estimate",
        "--json",
        "--model",
        "Qwen/Qwen3-8B",
        "--stack",
        "mlx",
        "--seq-len",
        "2048",
    ];
    let q = json(&[&base[..], &["--method", "qlora"]].concat());
    assert_eq!(q["job"]["stack"], "mlx", "{q}");
    assert_eq!(q["job"]["quantization"], "mlx-4bit", "{q}");
    assert_eq!(q["job"]["adapted_layers"], 16, "{q}");
    // One level: MLX's live buffers, no cache and no context.
    assert_eq!(q["peak_allocated_bytes"], q["peak_device_bytes"], "{q}");
    // mlx-community's 4-bit Qwen3-8B: 4.5 bits per weight and 16-bit norms, 4.6 GB.
    let weights = q["components"]["weights"].as_u64().unwrap();
    assert!(
        (4_500_000_000..4_700_000_000).contains(&weights),
        "{weights}"
    );
    // Fewer trained layers keep fewer activations.
    let eight = json(&[&base[..], &["--method", "qlora", "--num-layers", "8"]].concat());
    assert!(eight["peak_allocated_bytes"].as_u64() < q["peak_allocated_bytes"].as_u64());
    for (args, field) in [
        (
            &["--method", "qlora", "--quantization", "nf4-dq"][..],
            "quantization",
        ),
        (
            &["--method", "lora", "--attention", "flash"][..],
            "attention",
        ),
        (
            &["--method", "full", "--gpus", "2", "--strategy", "zero3"][..],
            "strategy",
        ),
        (
            &["--method", "lora", "--precision", "bf16-mixed"][..],
            "precision",
        ),
        (
            &["--method", "lora", "--optimizer", "paged_adamw_8bit"][..],
            "optimizer",
        ),
        (&["--method", "lora", "--liger"][..], "liger"),
        (
            &["--method", "lora", "--num-layers", "40"][..],
            "num_layers",
        ),
        (&["--method", "inference"][..], "method"),
    ] {
        assert_refused(&[&base[..], args].concat(), field);
    }
    // MLX's own settings are refused on other stacks.
    assert_refused(
        &[
            "estimate",
            "--json",
            "--model",
            "Qwen/Qwen3-8B",
            "--quantization",
            "mlx-4bit",
        ],
        "quantization",
    );
    assert_refused(
        &[
            "estimate",
            "--json",
            "--model",
            "Qwen/Qwen3-8B",
            "--num-layers",
            "8",
        ],
        "num_layers",
    );
}

/// `--trace` writes the step's allocations as JSON lines. For a bf16 LoRA of Qwen2.5-7B the
/// loaded tensors are the published 7,615,616,512 parameters in bf16 (docs/model-params.md)
/// plus r 16's adapters on the seven projections in fp32, counted by hand: per layer
/// q (3584 in, 3584 out), k and v (3584, 512), o (3584, 3584), gate and up (3584, 18944),
/// down (18944, 3584), 16 × (in + out) each, 28 layers. Every tensor made is freed at most
/// once, and a job the trace does not model is refused with exit 2 and no file.
#[test]
fn trace_writes_the_steps_allocations() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.jsonl");
    let o = run(&[
        "estimate",
        "--model",
        "Qwen/Qwen2.5-7B",
        "--method",
        "lora",
        "--lora-rank",
        "16",
        "--target-modules",
        "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
        "--seq-len",
        "1024",
        "--trace",
        path.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let text = std::fs::read_to_string(&path).unwrap();
    let events: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let loaded: u64 = events
        .iter()
        .filter(|e| e["phase"] == "load" && e["op"] == "alloc")
        .map(|e| e["bytes"].as_u64().unwrap())
        .sum();
    let per_layer: u64 = [
        (3584, 3584),
        (3584, 512),
        (3584, 512),
        (3584, 3584),
        (3584, 18944),
        (3584, 18944),
        (18944, 3584),
    ]
    .iter()
    .map(|(i, o)| 16 * (i + o))
    .sum();
    assert_eq!(loaded, 7_615_616_512 * 2 + 28 * per_layer * 4);
    let mut live = std::collections::HashSet::new();
    for e in &events {
        let id = e["tensor"].as_u64().unwrap();
        if e["op"] == "alloc" {
            assert!(live.insert(id), "tensor {id} made twice");
        } else {
            assert!(live.remove(&id), "tensor {id} freed before it was made");
        }
    }
    assert!(
        events
            .iter()
            .any(|e| e["phase"] == "optimizer_step" && e["step"] == 2)
    );

    let refused = dir.path().join("sharded.jsonl");
    let o = run(&[
        "estimate",
        "--model",
        "Qwen/Qwen2.5-7B",
        "--method",
        "lora",
        "--gpus",
        "2",
        "--trace",
        refused.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("--trace"), "{}", o.stderr);
    assert!(!refused.exists());
}

/// A sharded job's rank, by part: the Llama-2-70B QLoRA job of the FSDP1 rank traces
/// (`validation/oracle-traces/fsdp-llama-2-70b-qlora.jsonl`, 80 layers, rank 0 of 2). The
/// shard, the replicated quantization states and the whole model as loaded onto each GPU
/// before wrapping agree with the trace's sharded storage, its bytes after wrapping and
/// after loading within 1 %; the text names the gathered units and the loading floor.
#[test]
fn sharded_estimate_names_each_ranks_parts() {
    let fixture = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../validation/oracle-traces/fsdp-llama-2-70b-qlora.jsonl"
    ))
    .unwrap();
    let trace: serde_json::Value = fixture
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|r| r["config"]["num_hidden_layers"] == 80 && r["dist"]["rank"] == 0)
        .expect("the 80-layer rank 0 trace");
    let job = [
        "estimate",
        "--model",
        "meta-llama/Llama-2-70b-hf",
        "--method",
        "qlora",
        "--gpus",
        "2",
        "--strategy",
        "fsdp_full_shard",
        "--seq-len",
        "4096",
        "--micro-batch-size",
        "2",
        "--lora-rank",
        "16",
        "--lora-alpha",
        "16",
        "--target-modules",
        "q_proj,k_proj,v_proj,o_proj",
    ];
    let mut with_json = job.to_vec();
    with_json.push("--json");
    let v = json(&with_json);
    let rank = &v["rank"];
    let close = |ours: &serde_json::Value, traced: &serde_json::Value, what: &str| {
        #[allow(clippy::cast_precision_loss)]
        let (a, b) = (
            ours.as_u64().unwrap() as f64,
            traced.as_u64().unwrap() as f64,
        );
        assert!((a / b - 1.0).abs() < 0.01, "{what}: {a} vs traced {b}");
    };
    close(
        &rank["weights_shard"],
        &trace["dist"]["sharded_param_storage_bytes"],
        "shard",
    );
    let after_wrap = rank["weights_shard"].as_u64().unwrap() + rank["replicated"].as_u64().unwrap();
    close(
        &serde_json::Value::from(after_wrap),
        &trace["measured"]["after_wrap_bytes"],
        "after wrapping",
    );
    close(
        &rank["whole_model_load"],
        &trace["measured"]["after_load_bytes"],
        "whole model loaded",
    );
    assert_eq!(rank["shard_group"], 2);
    let text = run(&job);
    for part in [
        "per rank",
        "weights shard",
        "gathered layers",
        "gathered root",
        "on all-gather stream",
        "stream-held cache",
        "loading:",
    ] {
        assert!(text.stdout.contains(part), "{part}:\n{}", text.stdout);
    }
    let mut offloaded = job.to_vec();
    offloaded.extend(["--offload", "optimizer_and_params"]);
    let text = run(&offloaded);
    assert!(!text.stdout.contains("weights shard"), "{}", text.stdout);
    assert!(text.stdout.contains("replicated"), "{}", text.stdout);
    assert!(
        text.stdout.contains("on all-gather stream"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("host memory for offload"),
        "{}",
        text.stdout
    );
}

/// An error moro makes itself names its field under `--json` where it is about one (a flag's
/// value, a recipe's key) and no field where it is not (a file, a model path).
#[test]
fn json_errors_name_the_field_they_are_about_and_no_other() {
    let llama = ["estimate", "--json", "--model", "meta-llama/Llama-3.1-8B"];
    assert_refused(&[&llama[..], &["--memory", "24"]].concat(), "--memory");
    assert_refused(&[&llama[..], &["--memory", "0.5GiB"]].concat(), "--memory");
    assert_refused(
        &[&llama[..], &["--method", "full", "--lora-rank", "64"]].concat(),
        "lora_rank",
    );
    // An FSDP implementation for a job FSDP does not shard.
    assert_refused(
        &[&llama[..], &["--gpus", "2", "--fsdp-version", "2"]].concat(),
        "parallel.fsdp_version",
    );
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("moro.yaml"),
        "model:\n  base: Qwen/Qwen2.5-7B\n  method: qlora\nhardware:\n  preset: rtx-9999\n",
    )
    .unwrap();
    std::fs::write(d.join("notes.txt"), "not a model\n").unwrap();
    for (args, field) in [
        (
            &["estimate", "moro.yaml", "--json"][..],
            Some("hardware.preset"),
        ),
        (
            &["recipe", "check", "moro.yaml", "--json"],
            Some("hardware.preset"),
        ),
        (&["estimate", "missing.yaml", "--json"], None),
        // The path is in backticks at the message's start; it is not a field.
        (&["estimate", "--model", "./notes.txt", "--json"], None),
    ] {
        let o = moro().current_dir(d).args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["error"]["field"].as_str(), field, "{args:?}: {v}");
    }
}

/// On a GPU without SDPA's flash backend (a T4, compute capability 7.5) a grouped-KV model's
/// attention runs SDPA's math kernel: the job says so, and its fp32 scores and softmax
/// (`step_trace.rs` holds the op-level trace to the oracle's) leave more reserved than the
/// same job on a GPU with the flash kernel (an A10G).
#[test]
fn a_gpu_without_flash_sdpa_runs_the_math_kernel() {
    let args = |hw: &'static str| {
        [
            "estimate",
            "--model",
            "meta-llama/Llama-3.2-3B",
            "--method",
            "qlora",
            "--precision",
            "fp16-mixed",
            "--seq-len",
            "4096",
            "--hardware",
            hw,
        ]
    };
    let o = run(&args("t4"));
    assert!(o.stdout.contains("SDPA's math kernel"), "{}", o.stdout);
    assert!(!run(&args("a10g")).stdout.contains("math kernel"));
    let estimate = |hw| {
        let mut a = args(hw).to_vec();
        a.push("--json");
        json(&a)
    };
    assert_eq!(estimate("t4")["sdpa_math_kernel"], true);
    assert!(estimate("a10g").get("sdpa_math_kernel").is_none());
    let reserved = |hw| estimate(hw)["peak_reserved_bytes"].as_u64().unwrap();
    // The math kernel's fp32 scores of 24 heads × 4,096² tokens are 1.5 GiB a layer.
    assert!(reserved("t4") > reserved("a10g") + (512 << 20));
}

/// PyTorch on an Apple GPU runs on MPS: no CUDA context, SDPA's math kernel in training,
/// the levels of `torch.accelerator`, and the reserve of MPS heaps: at least the 1 GiB
/// heap a Llama-2-7B layer's 64 MiB activations open (`mps_allocator`).
#[test]
fn an_apple_gpu_runs_pytorch_on_mps() {
    let args = [
        "estimate",
        "--model",
        "meta-llama/Llama-2-7b-hf",
        "--method",
        "lora",
        "--seq-len",
        "2048",
        "--hardware",
        "apple-m4-max-128gb",
    ];
    let o = run(&args);
    assert_eq!(o.code, 0, "{}", o.stderr);
    for want in [
        "on Apple's MPS, training runs SDPA's math kernel",
        "torch.accelerator.max_memory_allocated()",
        "torch.mps.driver_allocated_memory()",
        "PyTorch's MPS allocator",
    ] {
        assert!(o.stdout.contains(want), "{want}: {}", o.stdout);
    }
    assert!(!o.stdout.contains("cuda context"), "{}", o.stdout);
    assert!(!o.stdout.contains("nvidia-smi"), "{}", o.stdout);
    let mut a = args.to_vec();
    a.push("--json");
    let v = json(&a);
    assert_eq!(v["backend"], "mps");
    assert_eq!(v["components"]["cuda_context"], 0);
    let reserve =
        v["peak_reserved_bytes"].as_u64().unwrap() - v["peak_allocated_bytes"].as_u64().unwrap();
    assert!(reserve > 0, "{v}");
    // The same job named by its memory and `--device mps` is the same estimate.
    let mut b = vec![
        "estimate",
        "--model",
        "meta-llama/Llama-2-7b-hf",
        "--method",
        "lora",
    ];
    b.extend([
        "--seq-len",
        "2048",
        "--device",
        "mps",
        "--memory",
        "96GiB",
        "--json",
    ]);
    assert_eq!(json(&b)["peak_device_bytes"], v["peak_device_bytes"]);
    // On a CUDA GPU the same job keeps SDPA's flash kernel: far less.
    let mut c = vec![
        "estimate",
        "--model",
        "meta-llama/Llama-2-7b-hf",
        "--method",
        "lora",
    ];
    c.extend(["--seq-len", "2048", "--memory", "96GiB", "--json"]);
    let cuda = json(&c);
    assert!(cuda.get("backend").is_none());
    // Without grad MPS has an SDPA kernel of its own: inference keeps it.
    let mut i = vec![
        "estimate",
        "--model",
        "meta-llama/Llama-2-7b-hf",
        "--method",
    ];
    i.extend([
        "inference",
        "--device",
        "mps",
        "--memory",
        "96GiB",
        "--json",
    ]);
    let inference = json(&i);
    assert_eq!(inference["backend"], "mps");
    assert!(inference.get("sdpa_math_kernel").is_none(), "{inference}");
    // 32 layers × 32 heads × 2,048² fp32 probabilities kept for the backward: 16 GiB.
    assert!(
        v["peak_allocated_bytes"].as_u64().unwrap()
            > cuda["peak_allocated_bytes"].as_u64().unwrap() + (16u64 << 30),
        "{v} {cuda}"
    );
}

/// What PyTorch cannot run on MPS is refused with the setting named, exit 2.
#[test]
fn mps_refuses_what_it_cannot_run() {
    let refused = |args: &[&str], field: &str| {
        let a = [&["estimate", "--model", "Qwen/Qwen2.5-0.5B"][..], args].concat();
        let o = run(&a);
        assert_eq!(o.code, 2, "{args:?}: {}", o.stdout);
        assert!(o.stderr.contains(field), "{args:?}: {}", o.stderr);
        assert!(o.stderr.starts_with("error:"), "{args:?}: {}", o.stderr);
    };
    let mac = ["--hardware", "apple-m4-24gb"];
    for (setting, field) in [
        (&["--optimizer", "adamw_8bit"][..], "`optimizer`"),
        (&["--optimizer", "paged_adamw_32bit"], "`optimizer`"),
        (&["--method", "qlora"], "`quantization`"),
        (&["--attention", "flash"], "`attention`"),
        (&["--device", "cuda"], "--device"),
    ] {
        refused(&[setting, &mac].concat(), field);
    }
    refused(&["--device", "mps"], "--device");
    refused(&["--device", "mps", "--hardware", "rtx-4090"], "--device");
    // MLX's own 4-bit base is not bitsandbytes': QLoRA on the MLX stack runs.
    refused(
        &[
            "--method",
            "qlora",
            "--stack",
            "hf",
            "--hardware",
            "apple-m4-24gb",
        ],
        "`quantization`",
    );
    let qlora_mlx = [
        "--method",
        "qlora",
        "--stack",
        "mlx",
        "--hardware",
        "apple-m4-24gb",
    ];
    let a = [
        &["estimate", "--model", "Qwen/Qwen2.5-0.5B"][..],
        &qlora_mlx,
    ]
    .concat();
    assert_eq!(run(&a).code, 0);
}
