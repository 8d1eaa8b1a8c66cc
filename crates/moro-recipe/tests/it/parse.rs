//! Reading moro.yaml: the product's example, defaults, and every kind of bad input with its
//! field, line and column.

use moro_recipe::choices::{Method, Optimizer, Quantization};
use moro_recipe::{RecipeErrorKind, TargetModules};

use crate::{FULL, PRODUCT, err, ok};

#[test]
fn the_product_example_reads_as_written() {
    let r = ok(PRODUCT);
    assert_eq!(r.name.as_deref(), Some("customer-support-qwen"));
    assert_eq!(r.version.as_deref(), Some("0.1.0"));
    assert_eq!(r.model.base, "Qwen/Qwen2.5-1.5B");
    assert_eq!(r.model.quantization, Some(Quantization::Nf4));
    assert_eq!(r.model.lora_rank, Some(16));
    assert_eq!(r.model.lora_alpha, Some(32.0));
    assert_eq!(r.model.lora_dropout, Some(0.05));
    let Some(TargetModules::Names(names)) = &r.model.target_modules else {
        panic!("target_modules: {:?}", r.model.target_modules)
    };
    assert_eq!(names.len(), 7);
    assert_eq!(names[6], "down_proj");
    assert_eq!(r.training.micro_batch_size, 2);
    assert_eq!(r.training.gradient_accumulation_steps, 8);
    assert_eq!(r.training.learning_rate, Some(2.0e-4));
    assert_eq!(r.training.max_seq_length, 2048);
    assert_eq!(r.training.optimizer, Some(Optimizer::Adamw8bit));
    assert_eq!(r.training.gradient_checkpointing, Some(true));
    assert!(r.training.auto_heal);
    // No method given: a quantized base means QLoRA.
    assert_eq!(r.model.method, None);
    assert_eq!(r.model.effective_method(), Method::Qlora);
    assert!(r.parallel.is_none() && r.hardware.is_none() && r.prediction.is_none());
}

#[test]
fn every_section_reads() {
    let r = ok(FULL);
    assert_eq!(r.model.target_modules, Some(TargetModules::AllLinear));
    let p = r.parallel.as_ref().unwrap();
    assert_eq!((p.gpus, p.tensor_parallel, p.nodes), (Some(16), 2, 2));
    let h = r.hardware.as_ref().unwrap();
    assert_eq!(h.preset.as_deref(), Some("h100-sxm"));
    assert!(h.detected);
    let pred = r.prediction.as_ref().unwrap();
    assert_eq!(pred.components.get("activations"), Some(30_064_771_072));
    let order: Vec<&str> = pred.components.0.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        order,
        ["weights", "activations", "optimizer"],
        "component order is kept"
    );
    assert_eq!(r.training.num_epochs, Some(2.5));
}

#[test]
fn method_is_derived_when_absent() {
    let m = |extra: &str| ok(&format!("model:\n  base: m\n{extra}")).model;
    // As `moro estimate` without `--method`: LoRA, QLoRA with a quantized base.
    assert_eq!(m("").effective_method(), Method::Lora);
    assert_eq!(m("  lora_rank: 8\n").effective_method(), Method::Lora);
    assert_eq!(
        m("  target_modules: all-linear\n").effective_method(),
        Method::Lora
    );
    assert_eq!(
        m("  quantization: int8\n").effective_method(),
        Method::Qlora
    );
    assert_eq!(
        m("  quantization: none\n  lora_rank: 8\n").effective_method(),
        Method::Lora
    );
    assert_eq!(m("  quantization: none\n").effective_method(), Method::Lora);
    assert_eq!(m("  method: full\n").effective_method(), Method::Full);
    // QLoRA without a quantization: NF4 with double quantization.
    let q = m("  method: qlora\n");
    assert_eq!(q.effective_quantization(), Quantization::Nf4Dq);
    assert_eq!(
        m("  method: inference\n").effective_quantization(),
        Quantization::None
    );
}

#[test]
fn aliases_and_yaml_11_booleans_are_accepted() {
    let r = ok(
        "model:\n  base: m\ntraining:\n  optimizer: adamw_bnb_8bit\n  attention: \
                flash_attention_2\n  gradient_checkpointing: yes\n  auto_heal: on\n",
    );
    assert_eq!(r.training.optimizer, Some(Optimizer::Adamw8bit));
    assert!(r.training.gradient_checkpointing == Some(true) && r.training.auto_heal);
    // A number where free text goes is read as its text.
    assert_eq!(
        ok("version: 0.1\nmodel:\n  base: m\n").version.as_deref(),
        Some("0.1")
    );
}

#[test]
fn unknown_key_names_field_line_and_column() {
    let e = err("name: x\nmodel:\n  base: a\n  lora_rnak: 16\n");
    assert_eq!(e.kind, RecipeErrorKind::UnknownField);
    assert_eq!((e.line, e.column), (Some(4), Some(3)));
    assert_eq!(e.field.as_deref(), Some("model.lora_rnak"));
    let s = e.to_string();
    assert!(
        s.starts_with("moro.yaml:4:3: field `model.lora_rnak`: unknown key `lora_rnak`"),
        "{s}"
    );
    assert!(s.contains("lora_rank"), "lists the known keys: {s}");

    let e = err("model:\n  base: a\ntrainig:\n  micro_batch_size: 2\n");
    assert_eq!(
        (e.line, e.column, e.field.as_deref()),
        (Some(3), Some(1), Some("trainig"))
    );

    let e = err("model:\n  base: a\nhardware:\n  name: x\n  vram: 12\n");
    assert_eq!(
        (e.line, e.column, e.field.as_deref()),
        (Some(5), Some(3), Some("hardware.vram"))
    );

    // Flow style positions too.
    let e = err("model: {base: a, rank: 4}\n");
    assert_eq!(
        (e.line, e.column, e.field.as_deref()),
        (Some(1), Some(18), Some("model.rank"))
    );
}

/// DoRA is PEFT's `use_dora` on LoRA, not a method: `peft: dora` points to `dora: true`.
#[test]
fn peft_dora_points_to_the_dora_setting() {
    let e = err("model:\n  base: a\n  peft: dora\n");
    assert_eq!(e.field.as_deref(), Some("model.peft"));
    assert!(e.to_string().contains("`dora: true`"), "{e}");
    let e = err("model:\n  base: a\n  peft: bitfit\n");
    assert!(!e.to_string().contains("dora: true"), "{e}");
}

#[test]
fn zero_negative_and_fractional_batches_are_rejected_with_the_field() {
    let e = err("model:\n  base: a\ntraining:\n  micro_batch_size: 0\n");
    assert_eq!(e.kind, RecipeErrorKind::Value);
    assert_eq!((e.line, e.column), (Some(4), Some(21)));
    assert_eq!(
        e.to_string(),
        "moro.yaml:4:21: field `training.micro_batch_size`: must be between 1 and 65536, got 0"
    );

    let e = err("model:\n  base: a\ntraining:\n  micro_batch_size: -2\n");
    assert_eq!(e.kind, RecipeErrorKind::Type);
    assert_eq!(e.field.as_deref(), Some("training.micro_batch_size"));
    assert!(e.message.contains("`-2`"), "{e}");

    let e = err("model:\n  base: a\ntraining:\n  gradient_accumulation_steps: 2.5\n");
    assert_eq!(
        e.field.as_deref(),
        Some("training.gradient_accumulation_steps")
    );
    assert!(e.message.contains("whole number"), "{e}");
    assert_eq!((e.line, e.column), (Some(4), Some(32)));
}

#[test]
fn absurd_numbers_are_rejected_with_the_field() {
    let e = err("model:\n  base: a\ntraining:\n  max_seq_length: 1000000000000\n");
    assert_eq!(e.field.as_deref(), Some("training.max_seq_length"));
    assert!(e.message.contains("16777216"), "{e}");
    // Beyond u64.
    let e = err("model:\n  base: a\ntraining:\n  max_seq_length: 100000000000000000000000\n");
    assert_eq!(e.field.as_deref(), Some("training.max_seq_length"));
    let e = err("model:\n  base: a\n  lora_rank: 1000000\n");
    assert_eq!(e.field.as_deref(), Some("model.lora_rank"));
    let e = err("model:\n  base: a\n  lora_dropout: 1.5\n");
    assert_eq!(
        (e.field.as_deref(), e.line),
        (Some("model.lora_dropout"), Some(3))
    );
    let e = err("model:\n  base: a\ntraining:\n  learning_rate: .nan\n");
    assert_eq!(e.field.as_deref(), Some("training.learning_rate"));
    let e = err("model:\n  base: a\ntraining:\n  warmup_ratio: 2\n");
    assert_eq!(e.field.as_deref(), Some("training.warmup_ratio"));
}

#[test]
fn wrong_types_name_the_field() {
    let e = err("model:\n  base: a\ntraining:\n  optimizer: adam\n");
    assert_eq!(
        (e.kind, e.field.as_deref()),
        (RecipeErrorKind::Type, Some("training.optimizer"))
    );
    assert!(
        e.message.contains("adamw_8bit"),
        "lists the valid names: {e}"
    );

    let e = err("model:\n  base: a\n  target_modules: q_proj\n");
    assert_eq!(e.field.as_deref(), Some("model.target_modules"));
    assert!(e.message.contains("all-linear"), "{e}");

    let e = err("model:\n  base: a\n  target_modules: [q_proj, {x: 1}]\n");
    assert_eq!(e.field.as_deref(), Some("model.target_modules[1]"));

    let e = err("model:\n  base: a\ntraining:\n  gradient_checkpointing: maybe\n");
    assert_eq!(e.field.as_deref(), Some("training.gradient_checkpointing"));
    assert!(e.message.contains("`maybe`"), "{e}");

    let e = err("model: qwen\n");
    assert_eq!(
        (e.field.as_deref(), e.line, e.column),
        (Some("model"), Some(1), Some(8))
    );

    let e = err("- a\n- b\n");
    assert_eq!(e.kind, RecipeErrorKind::Type);
}

#[test]
fn missing_and_duplicate_keys() {
    let e = err("name: x\n");
    assert_eq!(
        (e.kind, e.field.as_deref()),
        (RecipeErrorKind::MissingField, Some("model"))
    );
    let e = err("name: x\nmodel:\n  lora_rank: 4\n");
    assert_eq!(e.field.as_deref(), Some("model.base"));
    assert_eq!(e.line, Some(3));
    let e = err("model:\n  base: a\nmodel:\n  base: b\n");
    assert_eq!(
        (e.kind, e.field.as_deref()),
        (RecipeErrorKind::DuplicateField, Some("model"))
    );
    assert_eq!((e.line, e.column), (Some(3), Some(1)));
    let e = err(
        "model:\n  base: a\nprediction:\n  peak_allocated_bytes: 1\n  peak_reserved_bytes: 1\n  \
         peak_device_bytes: 1\n  components: {a: 1, a: 2}\n",
    );
    assert_eq!(e.field.as_deref(), Some("prediction.components.a"));
}

#[test]
fn inconsistent_fields_are_rejected() {
    let e = err("model:\n  base: a\n  method: full\n  quantization: nf4\n");
    assert_eq!(
        (e.field.as_deref(), e.line, e.column),
        (Some("model.quantization"), Some(4), Some(17))
    );
    let e = err("model:\n  base: a\n  method: qlora\n  quantization: none\n");
    assert_eq!(e.field.as_deref(), Some("model.quantization"));
    let e = err("model:\n  base: a\nparallel:\n  gpus: 6\n  tensor_parallel: 4\n");
    assert_eq!(
        (e.field.as_deref(), e.line),
        (Some("parallel.gpus"), Some(4))
    );
    let e = err(
        "model:\n  base: a\nparallel:\n  gpus: 2\n  strategy: zero2\n  offload: optimizer_and_params\n",
    );
    assert_eq!(e.field.as_deref(), Some("parallel.offload"));
    let e = err("model:\n  base: a\n  target_modules: []\n");
    assert_eq!(e.field.as_deref(), Some("model.target_modules"));
    let e = err("model:\n  base: a\n  target_modules: [q_proj, v_proj, q_proj]\n");
    assert_eq!(
        (e.field.as_deref(), e.column),
        (Some("model.target_modules[2]"), Some(36))
    );
    let e = err("model:\n  base: \"  \"\n");
    assert_eq!(e.field.as_deref(), Some("model.base"));
}

#[test]
fn an_unknown_gpu_preset_is_named_not_skipped() {
    // Issue 18: an unknown `hardware.preset` read as "has no `hardware:` section".
    let e = err("model:\n  base: a\nhardware:\n  preset: rtx-9999\n  memory_bytes: 24000000000\n");
    assert_eq!(
        (e.field.as_deref(), e.line, e.column),
        (Some("hardware.preset"), Some(4), Some(11))
    );
    assert!(
        e.to_string()
            .contains("unknown GPU preset `rtx-9999`; nearest presets: rtx-"),
        "{e}"
    );
    let e = err("model:\n  base: a\nhardware:\n  preset: 2xh100-sxm\n");
    assert_eq!(e.field.as_deref(), Some("hardware.preset"));
    for ok in ["h100-sxm", "rtx-4090", "NVIDIA GeForce RTX 4090"] {
        let text = format!("model:\n  base: a\nhardware:\n  preset: \"{ok}\"\n");
        assert!(moro_recipe::parse(&text).is_ok(), "{ok}");
    }
}

#[test]
fn empty_files_syntax_errors_and_bad_bytes() {
    for text in ["", "\n\n", "# only a comment\n"] {
        let e = err(text);
        assert_eq!((e.kind, e.line), (RecipeErrorKind::Syntax, Some(1)));
        assert!(e.message.contains("empty"), "{e}");
    }
    let e = err("model:\n  base: a\n\tstack: hf\n");
    assert_eq!(e.kind, RecipeErrorKind::Syntax);
    assert!(matches!(e.line, Some(2 | 3)), "{e}");
    let e = err("model: {base: [a\n");
    assert!(e.line.is_some(), "{e}");

    let e = moro_recipe::parse_bytes(b"model:\n  base: \xff\xfe\n").unwrap_err();
    assert_eq!(
        (e.kind, e.line, e.column),
        (RecipeErrorKind::Syntax, Some(2), Some(9))
    );
    assert!(e.to_string().contains("UTF-8"));
    // A byte-order mark is fine.
    assert!(moro_recipe::parse_bytes(b"\xef\xbb\xbfmodel:\n  base: a\n").is_ok());
}

#[test]
fn with_source_names_the_file() {
    let e = err("model:\n  base: a\n  bogus: 1\n").with_source("recipes/a.yaml");
    assert!(e.to_string().starts_with("recipes/a.yaml:3:3: "), "{e}");
}

#[test]
fn library_versions_are_strings_with_a_checked_form() {
    // Unquoted, 4.50 is still read as written (not as the float 4.5).
    let r = ok("model:\n  base: a\ntraining:\n  versions:\n    transformers: 4.50\n");
    let job = r.to_job().unwrap();
    assert_eq!(job.versions.transformers, Some((4, 50)));
    let e = err("model:\n  base: a\ntraining:\n  versions:\n    bitsandbytes: 0.x\n");
    assert_eq!(e.field.as_deref(), Some("training.versions.bitsandbytes"));
    assert_eq!((e.line, e.column), (Some(5), Some(19)));
    let r = ok("model:\n  base: a\ntraining:\n  versions:\n    peft: \"0.20\"\n");
    assert_eq!(r.to_job().unwrap().versions.peft, Some((0, 20)));
    let e = err("model:\n  base: a\ntraining:\n  versions:\n    accelerate: \"1.2\"\n");
    assert_eq!(
        (e.kind, e.field.as_deref()),
        (
            RecipeErrorKind::UnknownField,
            Some("training.versions.accelerate")
        )
    );
}

#[test]
fn parallel_nodes_default_divide_and_are_checked() {
    // Given.
    let r = ok("model:\n  base: a\nparallel:\n  gpus: 16\n  nodes: 2\n  strategy: zero3\n");
    assert_eq!(
        r.parallel.as_ref().map(|p| (p.gpus, p.nodes)),
        Some((Some(16), 2))
    );
    // Missing: one node.
    let r = ok("model:\n  base: a\nparallel:\n  gpus: 16\n  strategy: zero3\n");
    assert_eq!(r.parallel.as_ref().map(|p| p.nodes), Some(1));
    // Not dividing the GPUs: the field, its position, one line.
    let e = err("model:\n  base: a\nparallel:\n  gpus: 12\n  nodes: 5\n");
    assert_eq!(
        (e.field.as_deref(), e.line, e.column),
        (Some("parallel.nodes"), Some(5), Some(10))
    );
    assert!(
        e.message.contains("12 GPUs") && e.message.contains("5 nodes"),
        "{e}"
    );
    assert!(e.to_string().contains("parallel.nodes"), "{e}");
    // More nodes than GPUs, zero, and a wrong type.
    let e = err("model:\n  base: a\nparallel:\n  gpus: 2\n  nodes: 4\n");
    assert_eq!(e.field.as_deref(), Some("parallel.nodes"));
    let e = err("model:\n  base: a\nparallel:\n  gpus: 2\n  nodes: 0\n");
    assert_eq!(e.field.as_deref(), Some("parallel.nodes"));
    let e = err("model:\n  base: a\nparallel:\n  gpus: 2\n  nodes: two\n");
    assert_eq!(e.field.as_deref(), Some("parallel.nodes"));
    // Unknown keys next to it stay errors.
    let e = err("model:\n  base: a\nparallel:\n  gpus: 16\n  nodes: 2\n  hosts: 2\n");
    assert_eq!(e.line, Some(6));
}

#[test]
fn parallel_reduce_bucket_size_reaches_the_job_and_is_checked() {
    let r = ok(
        "model:\n  base: a\nparallel:\n  gpus: 2\n  strategy: zero2\n  reduce_bucket_size: 200000000\n",
    );
    let job = r.to_job().unwrap();
    assert_eq!(job.parallel.reduce_bucket, Some(200_000_000));
    // Absent: "auto".
    let r = ok("model:\n  base: a\nparallel:\n  gpus: 2\n  strategy: zero2\n");
    assert_eq!(r.to_job().unwrap().parallel.reduce_bucket, None);
    // Zero: the field and its line.
    let e = err(
        "model:\n  base: a\nparallel:\n  gpus: 2\n  strategy: zero2\n  reduce_bucket_size: 0\n",
    );
    assert_eq!(
        e.field.as_deref(),
        Some("parallel.reduce_bucket_size"),
        "{e}"
    );
    assert_eq!(e.line, Some(6));
}
