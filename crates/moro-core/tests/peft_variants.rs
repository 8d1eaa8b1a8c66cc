//! DoRA, LoKr and prefix tuning against the training step traced on fake CUDA tensors with
//! PEFT's own config for each (`calibration/peft_trace.py`: `../shared/oracle` with its
//! `LoraConfig` replaced; torch 2.15, transformers 5.24, PEFT 0.21.2), and against PEFT's
//! MetaMathQA benchmark rows of the same methods.
//!
//! The traces of four architectures (Llama-3.2-3B, Qwen3-0.6B, Gemma-2-2B, Pythia-410M) are
//! rows of `validation/oracle.jsonl` (`validation/oracle-traces/peft-methods.jsonl`); the
//! figures written here were traced for these tests.
//!
//! By hand, Llama-3.2-3B at 4 × 768 tokens, DoRA on q and v (28 layers, bf16 base, fp32
//! adapters): `base_result` (bf16) and `lora_result` (fp32) per module, 3,072 tokens ×
//! 4,096 outputs × 6 B × 28 = 1.97 GiB over LoRA; the trace says +1.97 GiB. With
//! `lora_dropout` 0.05 DoRA recomputes `F.linear(dropout(x), weight.to(fp32))`: the fp32
//! weight copies (3,072 + 1,024) × 3,072 × 4 B × 28 = 1.31 GiB are saved, and `base_result`
//! is fp32: +3.94 GiB by hand, +3.89 GiB traced.

use moro_core::catalog;
use moro_core::estimate::{DeviceProfile, estimate};
use moro_core::job::{Attention, Job, Method, Optimizer, PeftConfig, PeftKind, Precision, Targets};
use moro_core::model::ModelSpec;
use moro_core::validation::{CatalogModels, Status, validate};

const GIB: f64 = (1u64 << 30) as f64;

fn model(id: &str) -> ModelSpec {
    catalog::load(catalog::find(id).expect("in catalog")).expect("parses")
}

fn names(v: &[&str]) -> Targets {
    Targets::Names(v.iter().map(|s| (*s).to_owned()).collect())
}

/// PEFT's MetaMathQA setting: bf16 weights without AMP, foreach AdamW, SDPA, no
/// checkpointing, r 32 on q and v.
fn job(peft: PeftKind, batch: u64, seq: u64) -> Job {
    Job {
        method: Method::Adapters,
        adapter: PeftConfig {
            method: peft,
            rank: 32,
            alpha: 64.0,
            dropout: 0.0,
            targets: names(&["q_proj", "v_proj"]),
            ..PeftConfig::default()
        },
        micro_batch_size: batch,
        seq_len: seq,
        optimizer: Optimizer::AdamwTorch,
        precision: Precision::Bf16,
        attention: Attention::Sdpa,
        gradient_checkpointing: false,
        ..Job::default()
    }
}

fn dora(dropout: f64) -> Job {
    let mut j = job(PeftKind::Lora, 4, 768);
    j.adapter.dora = true;
    j.adapter.dropout = dropout;
    j
}

fn prefix(tokens: u64) -> Job {
    let mut j = job(PeftKind::PrefixTuning, 4, 768);
    j.adapter.virtual_tokens = tokens;
    j.adapter.targets = Targets::AllLinear;
    j
}

/// Llama-3.2-3B jobs with the trainable count PEFT reports (`num_trainable_params` of the
/// benchmark, the same in the trace) and the traced allocated peak (GiB).
fn llama_cases() -> Vec<(&'static str, Job, u64, f64)> {
    let mut lokr = job(PeftKind::LoKr, 4, 768);
    lokr.adapter.decompose_factor = Some(4);
    vec![
        ("dora", dora(0.0), 9_289_728, 21.678),
        ("dora dropout 0.05", dora(0.05), 9_289_728, 24.075),
        ("lokr r32 factor 4", lokr, 2_294_656, 20.957),
        ("prefix 200", prefix(200), 11_468_800, 18.747),
        ("prefix 50", prefix(50), 2_867_200, 18.483),
    ]
}

#[test]
fn trainable_counts_are_peft_counts() {
    let m = model("meta-llama/Llama-3.2-3B");
    for (name, j, trainable, _) in llama_cases() {
        let e = estimate(&m, &j, &DeviceProfile::default()).expect("valid job");
        assert_eq!(e.trainable_params, trainable, "{name}");
    }
}

/// LoKr by hand: `factorization(3072, 4)` = (4, 768), `factorization(1024, 4)` = (4, 256);
/// w1 is 4 × 4 and, as 32 < 768 / 2, w2 is factored: q has 16 + 768·32 + 32·768 = 49,168
/// parameters and v 16 + 256·32 + 32·768 = 32,784; over 28 layers 2,294,656, PEFT's count.
/// Without a factor PEFT searches near the square root: 3,072 = 48 × 64 and 1,024 = 32 × 32,
/// w2 (64 × 64 and 32 × 64) stays whole at r = 32 ≥ 64 / 2.
#[test]
fn lokr_factors_by_hand() {
    let m = model("meta-llama/Llama-3.2-3B");
    let mut sqrt = job(PeftKind::LoKr, 4, 768);
    sqrt.adapter.decompose_factor = None;
    let e = estimate(&m, &sqrt, &DeviceProfile::default()).expect("valid job");
    let q = 48 * 48 + 64 * 64;
    let v = 32 * 48 + 32 * 64;
    assert_eq!(e.trainable_params, 28 * (q + v));
}

/// Within 1 % of each trace (plain LoRA's own row is +0.5 %); the methods differ from LoRA's
/// 19.707 GiB by −1.2 to +4.4 GiB.
#[test]
fn allocated_peak_matches_the_traces() {
    let m = model("meta-llama/Llama-3.2-3B");
    for (name, j, _, traced) in llama_cases() {
        let e = estimate(&m, &j, &DeviceProfile::default()).expect("valid job");
        let got = e.peak_allocated_bytes as f64 / GIB;
        assert!(
            (got / traced - 1.0).abs() < 0.01,
            "{name}: {got:.3} GiB vs trace {traced:.3}"
        );
    }
}

/// DoRA's weight norm is rebuilt every forward (`DoraLinearLayer.forward`: `eye(in)`, the
/// in × out `lora_weight`, the weight cast to fp32, `scaling * lora_weight` and their sum):
/// for Llama-3.1-8B's down_proj (in 14,336, out 4,096) (14,336² + 4 · 14,336 · 4,096) · 4 B
/// = 1.72 GiB at once, again in the recompute under checkpointing. At one 256-token
/// sequence that is the peak: the trace peaks at 17.39 GiB on the sum's `add` in backward,
/// plain LoRA at 15.87 GiB. Recorded again event by event (`calibration/step_events.py`,
/// transformers 5.25): 17.393 GiB; moro's step trace, which holds the fp32 identity
/// `lora_A` saves in the recompute, peaks 0.14 % under it (3.9 % under without it).
#[test]
fn dora_weight_norm_transient_under_checkpointing() {
    let m = model("meta-llama/Llama-3.1-8B");
    let mut j = job(PeftKind::Lora, 1, 256);
    j.adapter.rank = 16;
    j.adapter.alpha = 32.0;
    j.adapter.targets = Targets::AllLinear;
    j.gradient_checkpointing = true;
    let plain = estimate(&m, &j, &DeviceProfile::default()).expect("valid job");
    j.adapter.dora = true;
    let e = estimate(&m, &j, &DeviceProfile::default()).expect("valid job");
    let got = e.peak_allocated_bytes as f64 / GIB;
    assert!((got - 17.392).abs() < 0.1, "{got:.3} GiB vs trace 17.392");
    let transient = (14_336u64 * 14_336 + 4 * 14_336 * 4_096 + 14_336 * 16) * 4;
    let lift = e.peak_allocated_bytes - plain.peak_allocated_bytes;
    assert!(
        lift > transient / 2 && lift < transient,
        "DoRA lifts the peak by {lift} B; its transient is {transient} B"
    );
}

/// The traces of the other architectures (Qwen3 with q/k norms, Gemma-2 with eager
/// soft-capped attention, GPT-NeoX's fused `query_key_value` and parallel residual),
/// converted into `validation/oracle.jsonl`: every method within 3 %, or within the 64 MiB
/// of cuBLAS workspaces (two of 32 MiB on the rows' Hopper GPU) that a fake-tensor trace
/// cannot see, which is 3.5 % of Pythia-410M's 1.8 GiB step.
#[test]
fn other_architectures_match_their_traces() {
    let report = validate(
        include_str!("../../../validation/oracle.jsonl"),
        &CatalogModels,
        false,
    );
    let mut seen = 0;
    for arch in ["Qwen3-0.6B", "gemma-2-2b", "pythia-410m", "Llama-3.2-3B"] {
        for method in ["dora", "dora-dropout", "lokr", "lokr-sqrt", "prefix-50"] {
            let id = format!("-{method}");
            let row = report
                .rows
                .iter()
                .find(|r| r.id.contains(arch) && r.id.ends_with(&id))
                .unwrap_or_else(|| panic!("no trace row for {arch} {method}"));
            assert_eq!(row.status, Status::Ok, "{}: {:?}", row.id, row.reason);
            let e = row.error.expect("compared");
            let measured = row.measured_bytes.unwrap_or(0) as f64;
            let over = row.predicted_bytes.unwrap_or(0) as f64 - measured;
            assert!(
                e.abs() <= 0.03 || (0.0..=(64u64 << 20) as f64 + 0.01 * measured).contains(&over),
                "{}: {:+.2} %",
                row.id,
                e * 100.0
            );
            seen += 1;
        }
    }
    assert_eq!(seen, 20);
}

/// PEFT's MetaMathQA rows of DoRA, LoKr and prefix tuning are compared, none skipped, and
/// none under by more than 5 % (peak reserved over the run, generation evals included; LoRA's
/// own rows there come out +5 to +6 %: the rows take the 768-token cap as the longest batch).
/// The DoRA row (019) is the highest, +8.7 %: without autocast `lora_A` saves DoRA's fp32
/// identity until the module returns (the recorded step holds it:
/// [`dora_weight_norm_transient_under_checkpointing`]), and with the padded batch's mask in each layer the replay then keeps
/// one more fp32-logits-sized segment (1.47 GiB); no recorded padded DoRA step checks that.
#[test]
fn benchmark_rows_are_covered() {
    let report = validate(
        include_str!("../../../validation/measured.jsonl"),
        &CatalogModels,
        false,
    );
    for (id, method) in [
        ("019", "lora"),
        ("020", "lokr"),
        ("021", "prefix-tuning"),
        ("022", "prefix-tuning"),
        ("023", "prefix-tuning"),
    ] {
        let id = format!("peft-metamathqa-{id}");
        let r = report.rows.iter().find(|r| r.id == id).expect("row");
        assert_eq!(r.status, Status::Ok, "{id}: {:?}", r.reason);
        assert_eq!(r.method, Some(method), "{id}");
        let e = r.error.expect("compared");
        assert!((-0.05..0.09).contains(&e), "{id}: {e}");
    }
}

/// Settings PEFT refuses or moro cannot model are field-named errors.
#[test]
fn bad_settings_name_their_field() {
    let m = model("meta-llama/Llama-3.2-3B");
    let mut zero = job(PeftKind::LoKr, 1, 512);
    zero.adapter.decompose_factor = Some(0);
    let e = estimate(&m, &zero, &DeviceProfile::default()).unwrap_err();
    assert!(e.to_string().contains("decompose_factor"), "{e}");
    let e = estimate(&m, &prefix(0), &DeviceProfile::default()).unwrap_err();
    assert!(e.to_string().contains("virtual_tokens"), "{e}");
    // PEFT 0.9.0 brought DoRA with bitsandbytes layers that refuse it; 0.10.0 QDoRA.
    for (peft, quantized, refused) in [
        ((0, 8), false, true),
        ((0, 9), false, false),
        ((0, 9), true, true),
        ((0, 10), true, false),
    ] {
        let mut d = dora(0.0);
        d.versions.peft = Some(peft);
        if quantized {
            d.method = Method::QuantizedAdapters;
            d.quantization = moro_core::job::Quantization::Nf4Dq;
        }
        let got = estimate(&m, &d, &DeviceProfile::default());
        assert_eq!(got.is_err(), refused, "{peft:?} {quantized}");
        if let Err(e) = got {
            assert!(e.to_string().contains("dora"), "{e}");
        }
    }
    let mut dropped = job(PeftKind::LoKr, 1, 512);
    dropped.adapter.dropout = 0.1;
    let e = estimate(&m, &dropped, &DeviceProfile::default()).unwrap_err();
    assert!(e.to_string().contains("lora_dropout"), "{e}");
    // PEFT 0.21.2 raises "PREFIX_TUNING does not work with gradient checkpointing" (as the
    // oracle's `step_events.py` found); prompt tuning takes it.
    let mut checkpointed = prefix(50);
    checkpointed.gradient_checkpointing = true;
    let e = estimate(&m, &checkpointed, &DeviceProfile::default()).unwrap_err();
    assert!(e.to_string().contains("gradient_checkpointing"), "{e}");
    checkpointed.adapter.method = PeftKind::PromptTuning;
    assert!(estimate(&m, &checkpointed, &DeviceProfile::default()).is_ok());
    // On a bitsandbytes 4-bit base PEFT 0.21.2's LoHa and LoKr fail in the forward (ΔW is
    // built in the packed weight's shape: "shape '[2048, 1]' is invalid for input of size
    // 4096" for a 64 × 64 LoKr); OFT rotates the input and runs.
    for (peft, refused) in [
        (PeftKind::LoKr, true),
        (PeftKind::LoHa, true),
        (PeftKind::Oft, false),
    ] {
        let mut q = job(peft, 1, 512);
        q.adapter.rank = 8;
        q.method = Method::QuantizedAdapters;
        q.quantization = moro_core::job::Quantization::Nf4Dq;
        let got = estimate(&m, &q, &DeviceProfile::default());
        assert_eq!(got.is_err(), refused, "{peft:?}");
        if let Err(e) = got {
            assert!(e.to_string().contains("peft"), "{e}");
        }
    }
    // torchtune trains LoRA and DoRA (`torchtune/modules/peft/`: `lora.py`, `dora.py`);
    // litgpt LoRA without DoRA (`litgpt/lora.py`) and its own adapters.
    use moro_core::job::Stack;
    for (stack, peft, dora, field) in [
        (Stack::Torchtune, PeftKind::Lora, true, None),
        (Stack::Torchtune, PeftKind::LoKr, false, Some("`peft`")),
        (Stack::Litgpt, PeftKind::Lora, true, Some("`dora`")),
        (Stack::Litgpt, PeftKind::PromptTuning, false, Some("`peft`")),
        (Stack::Trl, PeftKind::LoKr, false, None),
    ] {
        let mut j = job(peft, 1, 512);
        j.adapter.dora = dora;
        j.stack = stack;
        let got = estimate(&m, &j, &DeviceProfile::default());
        match (field, got) {
            (None, got) => assert!(got.is_ok(), "{stack:?} {peft:?}: {:?}", got.err()),
            (Some(f), Err(e)) => assert!(e.to_string().contains(f), "{e}"),
            (Some(_), Ok(_)) => panic!("{stack:?} {peft:?} dora {dora}: estimated"),
        }
    }
    let row = r#"{"id": "x", "model_hf_id": "meta-llama/Llama-3.2-3B", "method": "lokr",
        "lora": {"peft_type": "LOKR", "r": 8, "decompose_both": true,
        "target_modules": ["q_proj"]}, "micro_batch_size": 1, "seq_len": 512,
        "measured_value": 1000000000, "measured_unit": "bytes", "outcome": "ok",
        "confidence": "high"}"#
        .replace('\n', " ");
    let report = validate(&row, &CatalogModels, false);
    let reason = report.rows[0].reason.as_deref().unwrap_or("");
    assert!(reason.contains("decompose_both"), "{reason}");
}
