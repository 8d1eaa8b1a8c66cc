//! What the tests that hold moro to the fake-CUDA oracle's traces share: the oracle's device,
//! a collector of peak comparisons, and the seq2seq tracer's job.
#![allow(dead_code)]

use std::ops::RangeInclusive;

use moro_core::estimate::{DeviceProfile, Estimate};
use moro_core::job::{Attention, JobSettings, Method, Optimizer, Padding, Precision, Targets};
use serde_json::Value;

/// The peaks (allocated, reserved) of a compact recorded step (`step_events.py`'s
/// `--matrix-h200` / `--matrix-lora` form): `r` empties the cache and resets the peaks
/// (the harness's reset after loading), `<i>` allocates `sizes[i]` bytes, `-<k>` frees the
/// allocation made `k` allocations earlier.
pub fn replay_compact(row: &Value) -> (u64, u64) {
    let (allocated, reserved, _) = replay_compact_needed(row);
    (allocated, reserved)
}

/// [`replay_compact`]'s peaks and the reserved bytes the sequence needs
/// ([`moro_core::caching_allocator::CachingAllocator::peak_needed`]).
pub fn replay_compact_needed(row: &Value) -> (u64, u64, u64) {
    use moro_core::caching_allocator::{CachingAllocator, Handle};
    let sizes: Vec<u64> = row["sizes"]
        .as_array()
        .expect("sizes")
        .iter()
        .map(|v| v.as_u64().expect("a size"))
        .collect();
    let mut a = CachingAllocator::new();
    let mut made: Vec<Option<Handle>> = Vec::new();
    for token in row["events"].as_str().expect("events").split(' ') {
        if token == "r" {
            a.empty_cache();
            a.reset_peaks();
        } else if let Some(back) = token.strip_prefix('-') {
            let i = made.len() - back.parse::<usize>().expect("a free");
            a.free(made[i].take().expect("freed once"));
        } else {
            let i: usize = token.parse().expect("an allocation");
            made.push(Some(a.malloc(sizes[i])));
        }
    }
    (a.peak_allocated(), a.peak_reserved(), a.peak_needed())
}

/// The allocated, reserved and needed peaks of moro's trace `t` replayed through the
/// allocator model from the reset after loading (the first event of step 1), as the
/// harness and the oracle's compact rows reset.
pub fn replay_trace_after_load(t: &moro_core::estimate::trace::Trace) -> (u64, u64, u64) {
    use moro_core::caching_allocator::{CachingAllocator, Handle};
    use moro_core::estimate::trace::Op;
    let mut a = CachingAllocator::new();
    let mut handles: Vec<Option<Handle>> = Vec::new();
    let mut reset = false;
    for e in &t.events {
        if !reset && e.step > 0 {
            a.empty_cache();
            a.reset_peaks();
            reset = true;
        }
        let i = e.tensor as usize;
        match e.op {
            Op::Alloc => {
                if handles.len() <= i {
                    handles.resize(i + 1, None);
                }
                handles[i] = Some(a.malloc(e.bytes));
            }
            Op::Free => {
                if let Some(h) = handles[i].take() {
                    a.free(h);
                }
            }
        }
    }
    (a.peak_allocated(), a.peak_reserved(), a.peak_needed())
}

/// The oracle's device: no cuBLAS workspace (the fake tensors never allocate one).
pub fn oracle_device() -> DeviceProfile {
    DeviceProfile {
        cublas_workspace_bytes: 0,
        ..DeviceProfile::default()
    }
}

/// Compares allocated peaks with traced ones, printing each (run with `--nocapture`) and
/// collecting those outside their band.
#[derive(Default)]
pub struct Peaks {
    failures: Vec<String>,
    checked: usize,
}

impl Peaks {
    /// Records `e`'s allocated peak against trace `t`'s (`measured.peak_allocated_bytes`),
    /// a failure when the relative error is outside `band`.
    pub fn check(&mut self, label: &str, e: &Estimate, t: &Value, band: RangeInclusive<f64>) {
        let want = t["measured"]["peak_allocated_bytes"].as_u64().unwrap();
        #[allow(clippy::cast_precision_loss)]
        let err = e.peak_allocated_bytes as f64 / want as f64 - 1.0;
        eprintln!(
            "{label}: {:+.2} % (moro {} at {}, oracle {want} at {})",
            err * 100.0,
            e.peak_allocated_bytes,
            e.peak_phase.as_str(),
            t["measured"]["peak_at"]["phase"]
        );
        if !band.contains(&err) {
            self.failures
                .push(format!("{label}: {:+.2} %", err * 100.0));
        }
        self.checked += 1;
    }

    /// Fails unless `expected` traces were checked and all were inside their band.
    pub fn finish(self, expected: usize) {
        assert_eq!(self.checked, expected, "traces checked");
        assert!(self.failures.is_empty(), "{:?}", self.failures);
    }
}

/// The job of a `calibration/seq2seq_trace.py` training trace, as moro settings.
pub fn seq2seq_settings(t: &Value) -> JobSettings {
    let j = &t["job"];
    let n = |k: &str| j[k].as_u64().unwrap();
    let lora = &j["lora"];
    JobSettings {
        method: Some(match j["method"].as_str().unwrap() {
            "full" => Method::Full,
            _ => Method::Adapters,
        }),
        precision: Some(match j["precision"].as_str().unwrap() {
            "bf16-mixed" => Precision::Bf16Mixed,
            _ => Precision::Bf16,
        }),
        optimizer: Some(Optimizer::AdamwTorch),
        attention: Some(Attention::Sdpa),
        gradient_checkpointing: Some(j["grad_ckpt"].as_bool().unwrap()),
        micro_batch_size: Some(n("micro_batch")),
        seq_len: Some(n("seq_len")),
        target_len: Some(n("target_len")),
        padding: Some(if j["padded"].as_bool().unwrap() {
            Padding::Padded
        } else {
            Padding::Packed
        }),
        lora_rank: lora["r"].as_u64(),
        lora_alpha: lora["alpha"].as_f64(),
        lora_dropout: lora["dropout"].as_f64(),
        target_modules: lora["targets"]
            .as_array()
            .map(|v| Targets::Names(v.iter().map(|s| s.as_str().unwrap().to_owned()).collect())),
        ..JobSettings::default()
    }
}

/// Holds moro's inference estimate to each `calibration/seq2seq_trace.py --generate` trace
/// of `traces` (the model from `model`): the peak within `peak`, the encoder's phase within
/// `encoder` (relative errors). Returns how many were checked.
pub fn seq2seq_generation(
    traces: &str,
    model: impl Fn(&Value) -> moro_core::model::ModelSpec,
    peak: f64,
    encoder: f64,
) -> usize {
    let mut checked = 0;
    for line in traces.lines() {
        let t: Value = serde_json::from_str(line).expect("trace");
        let m = model(&t);
        let n = |k: &str| t[k].as_u64().unwrap();
        let job = JobSettings {
            method: Some(Method::Inference),
            precision: Some(Precision::Bf16),
            micro_batch_size: Some(n("batch")),
            seq_len: Some(n("seq_len")),
            target_len: Some(n("new_tokens")),
            padding: Some(if t["padded"].as_bool() == Some(true) {
                Padding::Padded
            } else {
                Padding::Packed
            }),
            ..JobSettings::default()
        }
        .resolve_for(&m)
        .expect("resolves");
        let e = moro_core::estimate::estimate(&m, &job, &oracle_device()).expect("valid job");
        let label = t["label"].as_str().unwrap();
        #[allow(clippy::cast_precision_loss)]
        let rel = |got: u64, want: u64| got as f64 / want as f64 - 1.0;
        let p = rel(e.peak_allocated_bytes, n("peak_allocated_bytes"));
        let prefill = e
            .phases
            .iter()
            .find(|p| p.phase == moro_core::estimate::Phase::Prefill)
            .map(moro_core::estimate::PhaseBytes::total)
            .unwrap();
        let enc = rel(prefill, n("encoder_peak_bytes"));
        eprintln!(
            "{label}: peak {:+.2} %, encoder {:+.2} %",
            p * 100.0,
            enc * 100.0
        );
        assert!(p.abs() <= peak, "{label}: peak {p}");
        assert!(enc.abs() <= encoder, "{label}: encoder {enc}");
        checked += 1;
    }
    checked
}

/// The job, model, regime and device of a row `calibration/step_events.py` recorded on the
/// fake-CUDA oracle (its `config`, `job` and `stack`), as moro's step trace takes them.
pub fn oracle_step_job(
    v: &Value,
) -> (
    moro_core::model::ModelSpec,
    moro_core::job::Job,
    moro_core::estimate::Regime,
    DeviceProfile,
) {
    use moro_core::estimate::{Backend, Regime};
    use moro_core::job::{Quantization, Stack};
    let j = &v["job"];
    let m = moro_core::arch::parse_config(v["config"].to_string().as_bytes()).unwrap();
    let targets: Option<Vec<String>> = j["lora"]["targets"]
        .as_array()
        .map(|ts| ts.iter().map(|t| t.as_str().unwrap().to_owned()).collect());
    let qlora = j["method"] == "qlora";
    let settings = JobSettings {
        method: Some(match j["method"].as_str().unwrap() {
            "qlora" => Method::QuantizedAdapters,
            "full" => Method::Full,
            _ => Method::Adapters,
        }),
        quantization: qlora.then(|| {
            if j["qlora"]["double_quant"] == true {
                Quantization::Nf4Dq
            } else {
                Quantization::Nf4
            }
        }),
        precision: Some(match j["precision"].as_str().unwrap() {
            "bf16" => Precision::Bf16,
            _ => Precision::Bf16Mixed,
        }),
        stack: Some(if v["stack"] == "trl" {
            Stack::Trl
        } else {
            Stack::Hf
        }),
        optimizer: Some(if j["optimizer"] == "torch.optim.AdamW(foreach)" {
            Optimizer::AdamwTorch
        } else {
            Optimizer::AdamwTorchFused
        }),
        attention: Some(match j["attn_implementation"].as_str().unwrap() {
            "eager" => Attention::Eager,
            "flash_attention_2" => Attention::Flash,
            _ => Attention::Sdpa,
        }),
        gradient_checkpointing: j["grad_ckpt"].as_bool(),
        micro_batch_size: j["micro_batch"].as_u64(),
        seq_len: j["seq_len"].as_u64(),
        lora_rank: j["lora"]["r"].as_u64(),
        lora_alpha: j["lora"]["alpha"].as_f64(),
        lora_dropout: j["lora"]["dropout"].as_f64(),
        target_modules: targets.map(Targets::Names),
        // `--liger`: what the Trainer's `use_liger_kernel=True` applies (`liger_fake.py`).
        liger: (j["liger_kernel"] == true).then_some(moro_core::job::Liger::ALL),
        ..JobSettings::default()
    };
    let settings = with_peft(settings, &j["peft"]);
    let job = settings.resolve_for(&m).unwrap();
    let regime = Regime::resolve(&m, &job);
    // `--sdpa-backend math`: a GPU without SDPA's flash backend, or, for heads that are
    // not grouped, Apple's MPS (where the math kernel runs for every model).
    let math = j["sdpa_backend_policy"] == "math";
    let device = DeviceProfile {
        flash_sdpa: !math,
        backend: if math && m.num_kv_heads == m.num_heads {
            Backend::Mps
        } else {
            Backend::Cuda
        },
        // The oracle makes no cuBLAS workspace.
        cublas_workspace_bytes: 0,
        ..DeviceProfile::default()
    };
    (m, job, regime, device)
}

/// The PEFT method of a row `peft_trace.py`'s `--peft` spec built (IA³, VeRA, LN tuning,
/// LoHa, LoKr, OFT, BOFT, AdaLoRA at its `init_r`),
/// over `settings`; LoRA (no spec) as it is.
fn with_peft(settings: JobSettings, spec: &Value) -> JobSettings {
    use moro_core::job::PeftKind;
    let names = |key: &str| {
        spec[key]
            .as_array()
            .map(|ts| Targets::Names(ts.iter().map(|t| t.as_str().unwrap().to_owned()).collect()))
    };
    let kind = match spec["peft_type"].as_str() {
        Some("IA3") => PeftKind::Ia3,
        Some("VERA") => PeftKind::Vera,
        Some("LN_TUNING") => PeftKind::LnTuning,
        Some("LOHA") => PeftKind::LoHa,
        Some("LOKR") => PeftKind::LoKr,
        Some("OFT") => PeftKind::Oft,
        Some("BOFT") => PeftKind::Boft,
        Some("ADALORA") => PeftKind::AdaLora,
        Some("PROMPT_TUNING") => PeftKind::PromptTuning,
        Some("PREFIX_TUNING") => PeftKind::PrefixTuning,
        _ => return settings,
    };
    JobSettings {
        peft: Some(kind),
        lora_rank: spec["r"]
            .as_u64()
            .or(spec["init_r"].as_u64())
            .or(settings.lora_rank),
        lora_alpha: spec["alpha"]
            .as_f64()
            .or(spec["lora_alpha"].as_f64())
            .or(settings.lora_alpha),
        decompose_factor: spec["decompose_factor"].as_u64(),
        boft_block_size: spec["boft_block_size"].as_u64(),
        boft_n_butterfly_factor: spec["boft_n_butterfly_factor"].as_u64(),
        virtual_tokens: spec["num_virtual_tokens"].as_u64(),
        target_modules: names("target_modules").or(settings.target_modules),
        feedforward_modules: names("feedforward_modules"),
        lora_dropout: Some(0.0),
        ..settings
    }
}
