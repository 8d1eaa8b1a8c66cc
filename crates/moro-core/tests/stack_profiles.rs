//! The stack as data: formulas read a stack's profile, never its name.

use moro_core::job::{JobSettings, Method, Precision, Stack};
use moro_core::stack::{DefaultCheckpointing, KbitPrepare};

/// No estimator or search file branches on a stack's name (`Stack::Hf`, `job.stack ==`):
/// what differs between stacks is in `src/stack/`.
#[test]
fn formulas_never_name_a_stack() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut dirs = vec![src.join("estimate"), src.join("search")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(dir).expect("source folder") {
            let path = e.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    let mut seen = 0;
    for f in files {
        let text = std::fs::read_to_string(&f).expect("source");
        seen += 1;
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for v in [
                "Stack::Hf",
                "Stack::Trl",
                "Stack::Litgpt",
                "Stack::Torchtune",
            ] {
                // The search's default request names the default stack; no formula does.
                let default_request = f.ends_with("space.rs") && code.trim() == "stack: Stack::Hf,";
                assert!(
                    !code.contains(v) || default_request,
                    "{}:{}: {}",
                    f.display(),
                    i + 1,
                    line.trim()
                );
            }
            assert!(
                !code.contains("stack =="),
                "{}:{}: {}",
                f.display(),
                i + 1,
                line.trim()
            );
        }
    }
    assert!(seen > 15, "{seen} files read");
}

/// TRL's `SFTTrainer` runs on the HF Trainer: its profile differs from HF's only in what
/// TRL changes (checkpointing default, loss, the kbit preparation of its older releases).
/// Under checkpointing both make the input embeddings require grad (TRL itself, and
/// transformers 5.25 for every `input_ids` model).
#[test]
fn trl_is_hf_with_sft_trainer_defaults() {
    let (hf, trl) = (Stack::Hf.profile(), Stack::Trl.profile());
    assert_eq!(trl.default_checkpointing, DefaultCheckpointing::On);
    assert_eq!(trl.kbit_prepare, KbitPrepare::SftTrainerLegacy);
    assert!(trl.peft_input_grads && hf.peft_input_grads);
    let same_rest = moro_core::stack::StackProfile {
        default_checkpointing: hf.default_checkpointing,
        default_loss: hf.default_loss,
        kbit_prepare: hf.kbit_prepare,
        ..*trl
    };
    assert_eq!(&same_rest, hf);
}

/// The defaults the profiles give, as the README states them: checkpointing on for TRL
/// always and for HF's QLoRA; pure bf16 on litgpt and torchtune; fp32 adapters under bf16
/// autocast for HF/TRL PEFT.
#[test]
fn defaults_come_from_the_profile() {
    let job = |stack, method| {
        JobSettings {
            stack: Some(stack),
            method: Some(method),
            ..JobSettings::default()
        }
        .resolve()
        .expect("job")
    };
    for (stack, method, ckpt, precision) in [
        (
            Stack::Hf,
            Method::QuantizedAdapters,
            true,
            Precision::Bf16Mixed,
        ),
        (Stack::Hf, Method::Adapters, false, Precision::Bf16Mixed),
        (Stack::Hf, Method::Full, false, Precision::Bf16),
        (Stack::Trl, Method::Adapters, true, Precision::Bf16Mixed),
        (Stack::Litgpt, Method::Adapters, false, Precision::Bf16),
        (
            Stack::Torchtune,
            Method::QuantizedAdapters,
            false,
            Precision::Bf16,
        ),
    ] {
        let j = job(stack, method);
        assert_eq!(j.gradient_checkpointing, ckpt, "{stack:?} {method:?}");
        assert_eq!(j.precision, precision, "{stack:?} {method:?}");
    }
}
