//! moro's trace of a training step against the real step's allocation sequence, recorded on
//! fake CUDA tensors (`calibration/step_events.py`: the HF model, PEFT and `torch.optim` of
//! `../shared/oracle`, torch 2.15, transformers 5.24, PEFT 0.21.2, bitsandbytes 0.50.2;
//! `validation/oracle-traces/step-events.jsonl`). Twelve jobs: Llama-3.1-8B (untied) and
//! Qwen2.5-1.5B (tied, q/k/v biases) cut to 2 layers, full fine-tuning in bf16, LoRA and
//! QLoRA (NF4, double quantized, PEFT's kbit preparation) under bf16 autocast, r 16 on the
//! seven projections, with and without checkpointing, fused AdamW, 1 × 512 tokens.
//!
//! Both sequences are replayed through the same allocator model
//! (`moro_core::caching_allocator`).

mod support;

use moro_core::caching_allocator::{CachingAllocator, Handle};
use moro_core::estimate::trace::{Op, Trace, step};
use moro_core::estimate::{Component, DeviceProfile, Regime};
use moro_core::job::{
    Attention, Job, JobSettings, Method, Optimizer, PeftKind, Precision, Quantization, Stack,
    Targets,
};
use moro_core::model::ModelSpec;
use serde_json::Value;
use support::replay_compact;

const EVENTS: &str = include_str!("../../../validation/oracle-traces/step-events.jsonl");
const DORA_EVENTS: &str = include_str!("../../../validation/oracle-traces/step-events-dora.jsonl");

/// A recorded allocation: its size, category and phase.
type Allocation = (u64, String, String);

/// One recorded step: each allocation (and its index), or a free (and the index of the
/// allocation it frees).
struct Recorded {
    label: String,
    events: Vec<(Option<Allocation>, usize)>,
}

fn recorded(v: &Value) -> Recorded {
    let cats: Vec<String> = v["categories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    let phases: Vec<String> = v["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    let events = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let e = e.as_array().unwrap();
            if e.len() == 3 {
                let at = |k: usize| usize::try_from(e[k].as_u64().unwrap()).unwrap();
                (
                    Some((
                        e[0].as_u64().unwrap(),
                        cats[at(1)].clone(),
                        phases[at(2)].clone(),
                    )),
                    i,
                )
            } else {
                let freed = -1 - e[0].as_i64().unwrap();
                (None, usize::try_from(freed).unwrap())
            }
        })
        .collect();
    Recorded {
        label: v["label"].as_str().unwrap().to_owned(),
        events,
    }
}

/// The recorded sequence replayed: (allocated peak, reserved peak).
fn replay_recorded(r: &Recorded) -> (u64, u64) {
    let mut a = CachingAllocator::new();
    let mut handles: Vec<Option<Handle>> = vec![None; r.events.len()];
    for (e, i) in &r.events {
        match e {
            Some((bytes, _, _)) => handles[*i] = Some(a.malloc(*bytes)),
            None => {
                if let Some(h) = handles[*i].take() {
                    a.free(h);
                }
            }
        }
    }
    (a.peak_allocated(), a.peak_reserved())
}

fn job_of(v: &Value) -> (ModelSpec, Job) {
    let label = v["label"].as_str().unwrap();
    // `-dora-d<dropout>-` in the labels of `step-events-dora.jsonl`.
    let dora_dropout = label
        .split("-dora-d")
        .nth(1)
        .and_then(|rest| rest.split('-').next())
        .map(|d| d.parse::<f64>().expect("a dropout"));
    let m = moro_core::arch::parse_config(v["config"].to_string().as_bytes()).expect("parses");
    let method = if label.contains("-qlora-") {
        Method::QuantizedAdapters
    } else if label.contains("-lora-") {
        Method::Adapters
    } else {
        Method::Full
    };
    let settings = JobSettings {
        method: Some(method),
        quantization: Some(if method == Method::QuantizedAdapters {
            Quantization::Nf4Dq
        } else {
            Quantization::None
        }),
        precision: Some(if method == Method::Full {
            Precision::Bf16
        } else {
            Precision::Bf16Mixed
        }),
        stack: Some(Stack::Hf),
        optimizer: Some(Optimizer::AdamwTorchFused),
        attention: Some(Attention::Sdpa),
        gradient_checkpointing: Some(label.ends_with("-ckpt")),
        micro_batch_size: Some(1),
        seq_len: Some(512),
        lora_rank: Some(16),
        lora_alpha: Some(32.0),
        lora_dropout: Some(dora_dropout.unwrap_or(0.0)),
        dora: Some(dora_dropout.is_some()),
        target_modules: Some(Targets::Names(
            moro_core::job::DEFAULT_TARGETS
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
        )),
        ..JobSettings::default()
    };
    let job = settings.resolve_for(&m).expect("resolves");
    (m, job)
}

/// Bytes of the parameters (frozen and trainable, quantization states included) live at the
/// recorded step's allocated peak, each rounded to 512 B as the tracker counts them.
fn params_at_recorded_peak(r: &Recorded) -> u64 {
    let round = |b: u64| b.div_ceil(512) * 512;
    let (mut live, mut peak, mut params, mut at_peak) = (0u64, 0u64, 0u64, 0u64);
    for (e, i) in &r.events {
        let (bytes, cat) = match e {
            Some((b, c, _)) => (*b, c.as_str()),
            None => {
                let (b, c, _) = r.events[*i].0.as_ref().unwrap();
                (*b, c.as_str())
            }
        };
        let sign_alloc = e.is_some();
        let is_param = cat.starts_with("params");
        if sign_alloc {
            live += round(bytes);
            if is_param {
                params += round(bytes);
            }
            if live > peak {
                peak = live;
                at_peak = params;
            }
        } else {
            live -= round(bytes);
            if is_param {
                params -= round(bytes);
            }
        }
    }
    at_peak
}

/// The fake device has no cuBLAS.
fn no_cublas() -> DeviceProfile {
    DeviceProfile {
        cublas_workspace_bytes: 0,
        ..DeviceProfile::default()
    }
}

const MIB: u64 = 1 << 20;

/// The first allocation of at least 16 MiB where the two sequences differ by more than 5 %
/// in size, in words.
fn first_divergence(rec: &Recorded, ours: &Trace) -> Option<String> {
    let big_rec: Vec<&Allocation> = rec
        .events
        .iter()
        .filter_map(|(e, _)| e.as_ref())
        .filter(|e| e.0 >= 16 * MIB)
        .collect();
    let big_ours: Vec<_> = ours
        .events
        .iter()
        .filter(|e| e.op == Op::Alloc && e.bytes >= 16 * MIB)
        .collect();
    for (k, pair) in big_rec.iter().zip(&big_ours).enumerate() {
        let (r, o) = pair;
        #[allow(clippy::cast_precision_loss)]
        let off = (o.bytes as f64 / r.0 as f64 - 1.0).abs();
        if off > 0.05 {
            return Some(format!(
                "large allocation {k}: recorded {} B ({}, {}), moro {} B ({} {} layer {:?}, {:?} of step {})",
                r.0,
                r.1,
                r.2,
                o.bytes,
                o.name,
                o.module.unwrap_or(""),
                o.layer,
                o.phase,
                o.step
            ));
        }
    }
    (big_rec.len() != big_ours.len()).then(|| {
        format!(
            "{} large allocations recorded, {} in moro's trace",
            big_rec.len(),
            big_ours.len()
        )
    })
}

/// Every recorded step: moro's trace reaches the recorded allocated peak within 2 %. Both
/// replayed through the allocator model, the reserved peaks agree within 0.5 % for all
/// twelve. Every layer is traced op by op: the full fine-tunes' coarse layers (their saved
/// bytes cut into shapes) left the 2-layer Llama's 8–9 % over (one extra 1 GiB segment: in
/// the second step the embedding's gradient found its cached block split by a layer's
/// gradient, which the recorded step's smaller temporaries place elsewhere).
#[test]
fn traces_match_the_recorded_steps() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for line in EVENTS.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let rec = recorded(&v);
        let (model, job) = job_of(&v);
        let regime = Regime::resolve(&model, &job);
        let trace = step::trace(&model, &job, &regime, &no_cublas())
            .unwrap_or_else(|| panic!("{}: not traced", rec.label));
        dump_trace(&rec.label, &trace);
        let (want_alloc, want_reserved) = replay_recorded(&rec);
        let ours = trace.replay();
        #[allow(clippy::cast_precision_loss)]
        let err = |a: u64, b: u64| a as f64 / b as f64 - 1.0;
        let ea = err(ours.allocated, want_alloc);
        let er = err(ours.reserved, want_reserved);
        let recorded_peak = v["peak_allocated_bytes"].as_u64().unwrap();
        eprintln!(
            "{}: allocated {:+.2} %, reserved {:+.2} % (recorded {:.3} / {:.3} GiB; tracker {:.3})",
            rec.label,
            ea * 100.0,
            er * 100.0,
            want_alloc as f64 / f64::from(1u32 << 30),
            want_reserved as f64 / f64::from(1u32 << 30),
            recorded_peak as f64 / f64::from(1u32 << 30),
        );
        // The breakdown read off the trace: its components at the peak add up to the peak,
        // and its weights and adapters are the parameters the recorded step held then.
        let parts = trace.components_at_peak();
        assert_eq!(parts.iter().map(|p| p.1).sum::<u64>(), trace.peak().0);
        let params: u64 = parts
            .iter()
            .filter(|p| matches!(p.0, Component::Weights | Component::Adapters))
            .map(|p| p.1)
            .sum();
        let want = params_at_recorded_peak(&rec);
        #[allow(clippy::cast_precision_loss)]
        let off = params as f64 / want as f64 - 1.0;
        assert!(
            off.abs() < 0.005,
            "{}: parameters {params} vs {want}",
            rec.label
        );
        if let Some(d) = first_divergence(&rec, &trace) {
            eprintln!("  first divergence: {d}");
        }
        assert!(trace.op_by_op, "{}", rec.label);
        if ea.abs() > 0.02 || er.abs() > 0.005 {
            failures.push(format!(
                "{}: {:+.2} % / {:+.2} %",
                rec.label,
                ea * 100.0,
                er * 100.0
            ));
        }
        checked += 1;
    }
    assert_eq!(checked, 12);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// PEFT's DoRA (`step-events-dora.jsonl`, `calibration/step_events.py --matrix-dora`: the
/// 2-layer Llama-3.1-8B, r 16 on the seven projections, bf16 autocast, 1 × 512 tokens):
/// without dropout under checkpointing, and with dropout 0.05 with and without. Each
/// module's identity, `lora_B(lora_A(eye))`, fp32 weight copies and norm temporaries are in
/// moro's trace as PEFT 0.21.2 makes them: replayed, the allocated peaks agree within 2 %
/// and the reserved within 3 % (−0.2, −0.5 and −2.9 %), where the same job traced as plain
/// LoRA is 30 % under the recorded reserved peak.
#[test]
fn dora_traces_match_the_recorded_steps() {
    let mut checked = 0;
    for line in DORA_EVENTS.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let rec = recorded(&v);
        let (model, job) = job_of(&v);
        assert!(job.adapter.dora, "{}", rec.label);
        let regime = Regime::resolve(&model, &job);
        let trace = step::trace(&model, &job, &regime, &no_cublas())
            .unwrap_or_else(|| panic!("{}: not traced", rec.label));
        let (want_alloc, want_reserved) = replay_recorded(&rec);
        let ours = trace.replay();
        #[allow(clippy::cast_precision_loss)]
        let err = |a: u64, b: u64| a as f64 / b as f64 - 1.0;
        let (ea, er) = (
            err(ours.allocated, want_alloc),
            err(ours.reserved, want_reserved),
        );
        eprintln!(
            "{}: allocated {:+.2} %, reserved {:+.2} %",
            rec.label,
            ea * 100.0,
            er * 100.0
        );
        assert!(ea.abs() <= 0.02 && er.abs() <= 0.03, "{}", rec.label);
        // The same job without DoRA's modules in the trace.
        let mut plain = job.clone();
        plain.adapter.dora = false;
        plain.adapter.dropout = 0.0;
        let plain_regime = Regime::resolve(&model, &plain);
        let without = step::trace(&model, &plain, &plain_regime, &no_cublas())
            .unwrap()
            .replay();
        eprintln!(
            "  without DoRA's modules: reserved {:+.2} %",
            err(without.reserved, want_reserved) * 100.0
        );
        assert!(
            err(without.reserved, want_reserved) < -0.10,
            "{}",
            rec.label
        );
        checked += 1;
    }
    assert_eq!(checked, 3);
}

/// The H200's measured allocated peaks (`validation/h200/measured.jsonl`, torch 2.11 on a
/// real GPU): every one-GPU training row the trace models is within 2 % of its trace's
/// allocated peak, but one. The harness's bitsandbytes 8-bit AdamW run (`62779155a1`)
/// calls the optimizer without the HF Trainer, whose 32-bit states for `nn.Embedding` the
/// `hf` stack models: the trace is over by those states' difference, (8 − 2) B for each of
/// the embedding's 525 M elements.
#[test]
fn traces_reach_the_h200s_allocated_peaks() {
    use moro_core::validation::{CatalogModels, explain};
    let text = include_str!("../../../validation/h200/measured.jsonl");
    let device = DeviceProfile::for_compute_capability(Some((9, 0)));
    let mut checked = 0;
    let mut failures = Vec::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let id = v["id"].as_str().unwrap();
        if !id.ends_with("-allocated") {
            continue;
        }
        let Ok(x) = explain(text, &CatalogModels, id) else {
            continue;
        };
        let regime = Regime::resolve(&x.model, &x.job);
        let Some(trace) = step::trace(&x.model, &x.job, &regime, &device) else {
            continue;
        };
        let measured = v["measured_gib"].as_f64().unwrap();
        #[allow(clippy::cast_precision_loss)]
        let ours = trace.peak().0 as f64 / f64::from(1u32 << 30);
        let err = ours / measured - 1.0;
        eprintln!(
            "{id}: {:?} {ours:.2} GiB, measured {measured:.2} ({:+.2} %)",
            x.job.method,
            err * 100.0
        );
        let allowed = if id.contains("62779155a1") {
            let embedding = x.model.embedding_params();
            #[allow(clippy::cast_precision_loss)]
            let extra = (6 * embedding) as f64 / f64::from(1u32 << 30);
            (ours - measured - extra).abs() < 0.05 * extra
        } else {
            err.abs() <= 0.02
        };
        if !allowed {
            failures.push(format!("{id}: {:+.2} %", err * 100.0));
        }
        checked += 1;
    }
    assert!(checked >= 30, "{checked}");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The estimate reads a traced job off its trace: on every row of the fake-CUDA oracle
/// (`validation/oracle.jsonl`, the real HF step on fake tensors, which runs no GEMM and so
/// makes no cuBLAS workspace) whose job the trace models, the estimate's allocated level is
/// the trace's largest live total, its components there add up to it, and it is within 1 %
/// of the oracle's peak for a full fine-tune (Qwen3's `q_norm`/`k_norm` and a bf16-mixed
/// fp32 stream included: the formulas' per-layer bytes cut into tensors) and 2 % for LoRA
/// and QLoRA, TRL's chunked loss included.
#[test]
fn oracle_rows_are_read_off_their_traces() {
    use moro_core::estimate::estimate;
    use moro_core::validation::{CatalogModels, explain};
    let text = include_str!("../../../validation/oracle.jsonl");
    let device = no_cublas();
    let (mut checked, mut full) = (0, 0);
    let mut failures = Vec::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let id = v["id"].as_str().unwrap();
        let Ok(x) = explain(text, &CatalogModels, id) else {
            continue;
        };
        let regime = Regime::resolve(&x.model, &x.job);
        let Some(trace) = step::trace(&x.model, &x.job, &regime, &device) else {
            continue;
        };
        let est = estimate(&x.model, &x.job, &device).unwrap();
        assert_eq!(est.peak_allocated_bytes, trace.peak().0, "{id}");
        let allocated: u64 = est
            .components
            .iter()
            .filter(|c| {
                !matches!(
                    c.0,
                    Component::AllocatorReserve
                        | Component::OutsideAllocator
                        | Component::CudaContext
                )
            })
            .map(|c| c.1)
            .sum();
        assert_eq!(allocated, est.peak_allocated_bytes, "{id}");
        let measured = v["measured_value"].as_f64().unwrap();
        #[allow(clippy::cast_precision_loss)]
        let err = est.peak_allocated_bytes as f64 / measured - 1.0;
        let bar = if x.job.method == Method::Full {
            full += 1;
            0.01
        } else {
            0.02
        };
        if err.abs() > bar {
            failures.push(format!("{id}: {:+.2} %", err * 100.0));
        }
        checked += 1;
    }
    assert!(checked >= 150 && full >= 25, "{checked} rows, {full} full");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// TRL's `chunked_nll` loss (`SFTTrainer`'s default from TRL 1.7), run as TRL ships it on
/// fake CUDA tensors (`calibration/trl_trace.py`, TRL 1.10.0.dev0; the `oracle-trl-` rows
/// of `validation/oracle.jsonl`): Llama-3.2-1B (tied), Llama-3.1-8B (untied, 2 layers),
/// Qwen2.5-0.5B, Qwen3-0.6B, Mistral-7B-v0.3 (2 layers) and Gemma-2-2B (the soft cap);
/// LoRA, QLoRA and full fine-tuning, bf16 and bf16-mixed, with and without checkpointing.
/// Traced, with no cuBLAS workspace (fake tensors run no GEMM), each allocated peak is
/// within 1 % of TRL's (Mistral-7B's 2-layer LoRA +1.0 %, the rest 0.3 % or less); the loss's
/// formulas were 0.1 to 27 % over.
#[test]
fn trl_chunked_losses_are_read_off_their_traces() {
    use moro_core::job::LossImpl;
    use moro_core::validation::{CatalogModels, explain};
    let text = include_str!("../../../validation/oracle.jsonl");
    let device = no_cublas();
    let mut failures = Vec::new();
    let mut checked = 0;
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let id = v["id"].as_str().unwrap();
        if !id.starts_with("oracle-trl-") {
            continue;
        }
        let x = explain(text, &CatalogModels, id).unwrap();
        let regime = Regime::resolve(&x.model, &x.job);
        assert_eq!(regime.loss, LossImpl::ChunkedNll, "{id}");
        let Some(trace) = step::trace(&x.model, &x.job, &regime, &device) else {
            panic!("{id}: not traced");
        };
        let measured = v["measured_value"].as_f64().unwrap();
        #[allow(clippy::cast_precision_loss)]
        let err = trace.peak().0 as f64 / measured - 1.0;
        if err.abs() > 0.01 {
            failures.push(format!("{id}: {:+.2} %", err * 100.0));
        }
        checked += 1;
    }
    assert_eq!(checked, 11);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The H200's Liger runs (`validation/h200/settings.jsonl`: Llama-3.1-8B LoRA with and
/// without checkpointing and at two sequences, Qwen2.5-7B LoRA, Llama-3.2-1B full with
/// checkpointing) are traced: no logits, the fused loss's input gradient made in the
/// forward and handed back as the hidden state's, a trainable head's weight gradient made
/// there too, and the tied embedding's two gradients added in place. Their allocated peaks
/// are within 0.5 % (the full fine-tune was +5.0 % with the out-of-place sum).
#[test]
fn liger_runs_are_read_off_their_traces() {
    use moro_core::validation::{CatalogModels, explain};
    let text = include_str!("../../../validation/h200/settings.jsonl");
    let device = DeviceProfile::for_compute_capability(Some((9, 0)));
    let mut checked = 0;
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let id = v["id"].as_str().unwrap();
        if !id.ends_with("-allocated") || !line.contains("Liger fused linear") {
            continue;
        }
        let x = explain(text, &CatalogModels, id).unwrap();
        let regime = Regime::resolve(&x.model, &x.job);
        assert!(
            step::trace(&x.model, &x.job, &regime, &device).is_some(),
            "{id}: not traced"
        );
        let measured = v["measured_gib"].as_f64().unwrap();
        #[allow(clippy::cast_precision_loss)]
        let ours = x.estimate.peak_allocated_bytes as f64 / f64::from(1u32 << 30);
        assert!(
            (ours / measured - 1.0).abs() <= 0.005,
            "{id}: {ours:.3} vs {measured:.3}"
        );
        checked += 1;
    }
    assert_eq!(checked, 5);
}

/// moro's trace replayed as the harness measures: the cache emptied and the peaks reset
/// once the model is loaded.
fn replay_after_load(t: &Trace) -> (u64, u64) {
    let (allocated, reserved, _) = support::replay_trace_after_load(t);
    (allocated, reserved)
}

/// With `MORO_TRACE_DUMP=DIR`, writes `trace` to `DIR/<label>.jsonl` (one event a line), to
/// compare with the oracle's `--desc` events event by event.
fn dump_trace(label: &str, trace: &Trace) {
    if let Ok(dir) = std::env::var("MORO_TRACE_DUMP") {
        let lines: Vec<String> = trace
            .events
            .iter()
            .map(|e| serde_json::to_string(e).unwrap())
            .collect();
        std::fs::write(format!("{dir}/{label}.jsonl"), lines.join("\n")).unwrap();
    }
}

/// moro's trace `t` against the oracle's compact row `v`, both replayed from the reset after
/// loading: the relative errors of the allocated and reserved peaks, printed under `label`.
fn errors_after_load(label: &str, t: &Trace, v: &Value) -> (f64, f64) {
    let (want_alloc, want_reserved) = replay_compact(v);
    let (alloc, reserved) = replay_after_load(t);
    #[allow(clippy::cast_precision_loss)]
    let err = |a: u64, b: u64| a as f64 / b as f64 - 1.0;
    let (ea, er) = (err(alloc, want_alloc), err(reserved, want_reserved));
    eprintln!(
        "{label}: allocated {:+.3} %, reserved {:+.3} %",
        ea * 100.0,
        er * 100.0
    );
    (ea, er)
}

/// LoRA under bf16 autocast on a Llama-style layer is traced op by op
/// (`trace/decoder_layer.rs`). Against the recorded steps of the 2-layer Llama-3.1-8B and
/// Qwen2.5-1.5B, with and without checkpointing, the allocated peaks agree within 0.1 %,
/// the reserved within 0.5 %, and every allocation of 16 MiB or more has its recorded size
/// in its recorded order (the coarse cut of the layer's saved bytes was 0.1–0.2 % over the
/// allocated peaks). Against the whole Llama-3.1-8B of the H200 run `7cbf4904a2` (1 × 2048,
/// checkpointing), replayed from the reset after loading, both peaks agree within 0.5 %.
#[test]
fn lora_layers_are_traced_op_by_op() {
    let mut checked = 0;
    for line in EVENTS.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let rec = recorded(&v);
        if !rec.label.contains("-lora-") {
            continue;
        }
        let (model, job) = job_of(&v);
        let regime = Regime::resolve(&model, &job);
        let trace = step::trace(&model, &job, &regime, &no_cublas()).unwrap();
        assert!(trace.op_by_op, "{}", rec.label);
        let (want_alloc, want_reserved) = replay_recorded(&rec);
        let ours = trace.replay();
        #[allow(clippy::cast_precision_loss)]
        let err = |a: u64, b: u64| a as f64 / b as f64 - 1.0;
        let (ea, er) = (
            err(ours.allocated, want_alloc),
            err(ours.reserved, want_reserved),
        );
        eprintln!(
            "{}: allocated {:+.3} %, reserved {:+.3} %",
            rec.label,
            ea * 100.0,
            er * 100.0
        );
        assert!(ea.abs() <= 0.001, "{}: allocated {ea:+.4}", rec.label);
        assert!(er.abs() <= 0.005, "{}: reserved {er:+.4}", rec.label);
        assert_eq!(first_divergence(&rec, &trace), None, "{}", rec.label);
        checked += 1;
    }
    assert_eq!(checked, 4);

    use moro_core::validation::{CatalogModels, explain};
    let h200 = include_str!("../../../validation/h200/measured.jsonl");
    let whole = include_str!("../../../validation/oracle-traces/step-events-h200.jsonl")
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["h200_row"] == "moro-cal-7cbf4904a2")
        .unwrap();
    let x = explain(h200, &CatalogModels, "moro-cal-7cbf4904a2-reserved").unwrap();
    let regime = Regime::resolve(&x.model, &x.job);
    let trace = step::trace(&x.model, &x.job, &regime, &no_cublas()).unwrap();
    assert!(trace.op_by_op);
    let (ea, er) = errors_after_load("Llama-3.1-8B whole", &trace, &whole);
    assert!(ea.abs() <= 0.005);
    assert!(er.abs() <= 0.005);
}

/// The H200's full fine-tunes of Llama-3.2-1B-Instruct and Qwen2.5-1.5B (bf16 weights
/// without autocast, 1 × 2048, checkpointing; `step-events-h200-full.jsonl`, the real HF step
/// of the harness's job on fake tensors): moro's trace of each row's job, replayed from the
/// reset after loading, reaches the real sequence's allocated peak within 0.01 % and its
/// reserved peak within 0.1 %. Both reserved levels turn on where one fp32 logits-sized block
/// lands, so the trace must follow the sequence's order, not only its sizes: with the
/// copies `ViewBackward0` makes of q's and k's gradients traced, but a recomputed layer's
/// saved tensors still dropped after each backward function's incoming gradient (not
/// before) and its checkpointed input held to the end of its backward, Llama-3.2-1B's trace
/// reserved 1,000 MiB more than the real sequence.
#[test]
fn full_fine_tunes_follow_the_h200_sequences() {
    use moro_core::validation::{CatalogModels, explain};
    let h200 = include_str!("../../../validation/h200/measured.jsonl");
    let mut checked = 0;
    for line in
        include_str!("../../../validation/oracle-traces/step-events-h200-full.jsonl").lines()
    {
        let whole: Value = serde_json::from_str(line).unwrap();
        let row = whole["h200_row"].as_str().unwrap();
        let x = explain(h200, &CatalogModels, &format!("{row}-reserved")).unwrap();
        let regime = Regime::resolve(&x.model, &x.job);
        let trace = step::trace(&x.model, &x.job, &regime, &no_cublas()).unwrap();
        assert!(trace.op_by_op, "{row}");
        let (ea, er) = errors_after_load(row, &trace, &whole);
        assert!(ea.abs() <= 0.0001, "{row}: allocated {ea}");
        assert!(er.abs() <= 0.001, "{row}: reserved {er}");
        checked += 1;
    }
    assert_eq!(checked, 2);
}

/// PEFT's IA³ and VeRA (`calibration/step_events.py --matrix-peft`): vectors on a few
/// Linears (IA³ on k, v and the MLP's down projection, scaling down's input, and on the
/// 2-layer Qwen2.5-7B also on q, o, up and down, scaling up's and down's inputs; VeRA at r
/// 256 on q and v, with its shared frozen A and B) on the 2-layer Llama-3.1-8B and
/// Qwen2.5-7B, with and without checkpointing, 1 × 512 under bf16 autocast, replayed from the reset
/// after loading. Both are traced op by op (`decoder_layer.rs`: IA³'s fp32 products and
/// their casts back, the input's fp32 copy on down, what `mul` saves and when its backward
/// drops it; VeRA's fp32 input copy, autocast's copies of the sliced shared matrices, the two
/// vectors' fp32 products and their casts, the fp32 sum cast back): allocated and reserved
/// within 0.1 % (the saved bytes cut into shapes were −1.6 to −2.9 % under at the reserved
/// level for IA³, −0.7 to −1.1 % for VeRA).
#[test]
fn ia3_and_vera_are_traced_op_by_op() {
    let rows = include_str!("../../../validation/oracle-traces/step-events-peft.jsonl");
    let checked = rows_within(
        rows,
        |label, job, trace| {
            assert!(
                matches!(job.adapter.method, PeftKind::Ia3 | PeftKind::Vera),
                "{label}"
            );
            assert!(trace.op_by_op, "{label}");
        },
        |_, _| (0.001, 0.001),
    );
    assert_eq!(checked, 10);
}

/// PEFT's LoHa, LoKr and OFT (`calibration/step_events.py --matrix-peft-weight`), which
/// build a weight-sized tensor per adapted module every forward: LoHa at r 16, LoKr at r 32
/// with factor 4, OFT in 32 blocks, on q and v of the 2-layer Llama-3.1-8B and Qwen2.5-7B,
/// with and without checkpointing, 1 × 512 under bf16 autocast. Replayed from the reset
/// after loading, allocated within 0.5 % and reserved within 2 %.
///
/// By hand, Llama-3.1-8B without checkpointing: LoHa's ΔW under autocast is the 16-bit
/// product of its factors, (4,096 + 1,024) × 4,096 × 2 B = 40 MiB per layer, and the first
/// layer keeps none (its input needs no gradient). Counted in fp32 in both layers (160 MiB
/// where 40 are kept), with a 16-bit copy of x per module, the allocated peak was 3.6 %
/// over the oracle's.
#[test]
fn loha_lokr_and_oft_are_traced() {
    let rows = include_str!("../../../validation/oracle-traces/step-events-peft-weight.jsonl");
    let checked = rows_within(
        rows,
        |label, job, _| {
            assert!(
                matches!(
                    job.adapter.method,
                    PeftKind::LoHa | PeftKind::LoKr | PeftKind::Oft
                ),
                "{label}"
            );
        },
        |_, _| (0.005, 0.02),
    );
    assert_eq!(checked, 12);
}

/// PEFT's AdaLoRA (`calibration/step_events.py --matrix-peft-adalora`): `init_r` 64 and 16
/// on q and v of the 2-layer Llama-3.1-8B and Qwen2.5-7B, with and without checkpointing,
/// 1 × 512 under bf16 autocast, `update_and_allocate` after each optimizer step (before
/// masking starts). Replayed from the reset after loading, allocated within 0.5 % and
/// reserved within 2 %.
///
/// By hand, the rank allocator's three copies of every `lora_` parameter: Llama-3.1-8B at
/// r 64 trains (64 · 4,096 + 4,096 · 64 + 64) + (64 · 4,096 + 1,024 · 64 + 64) = 852,096
/// fp32 elements a layer, 3 · 2 · 852,096 · 4 B = 19.5 MiB over the 2 layers.
#[test]
fn adalora_is_traced() {
    let rows = include_str!("../../../validation/oracle-traces/step-events-peft-adalora.jsonl");
    let checked = rows_within(
        rows,
        |label, job, trace| {
            assert_eq!(job.adapter.method, PeftKind::AdaLora, "{label}");
            let importance: u64 = trace
                .events
                .iter()
                .filter(|e| e.name == "ipt" && e.step == 1 && e.op == Op::Alloc)
                .map(|e| e.bytes)
                .sum();
            if label.starts_with("meta-llama") && job.adapter.rank == 64 {
                // Made twice in the first step: zeros, then `(p * p.grad).abs()`.
                assert_eq!(importance, 2 * 2 * 852_096 * 4, "{label}");
            }
        },
        |_, _| (0.005, 0.02),
    );
    assert_eq!(checked, 8);
}

/// PEFT's BOFT (`calibration/step_events.py --matrix-peft-boft`): blocks of 4 with one
/// butterfly factor and of 16 with two, on q and v of the 2-layer Llama-3.1-8B and
/// Qwen2.5-7B, with and without checkpointing, 1 × 512 under bf16 autocast, with the fp32
/// permutation buffers on the GPU. Replayed from the reset after loading, allocated within
/// 0.5 % and reserved within 2 %.
///
/// By hand, Llama-3.1-8B with one factor: q_proj and v_proj each read 4,096 wide, so each
/// module saves the identity, the permutations' copy and the rotation, 3 × 4,096² × 2 B =
/// 96 MiB (the first layer without checkpointing no rotation), and loading leaves 4 fp32
/// buffers of 64 MiB.
#[test]
fn boft_is_traced() {
    let rows = include_str!("../../../validation/oracle-traces/step-events-peft-boft.jsonl");
    let checked = rows_within(
        rows,
        |label, job, trace| {
            assert_eq!(job.adapter.method, PeftKind::Boft, "{label}");
            let buffers: Vec<u64> = trace
                .events
                .iter()
                .filter(|e| e.name == "boft_P")
                .map(|e| e.bytes)
                .collect();
            let d = job.adapter.boft_butterfly_factor();
            let width = if label.starts_with("Qwen") {
                3_584
            } else {
                4_096
            };
            assert_eq!(buffers, vec![d * width * width * 4; 4], "{label}");
        },
        |_, _| (0.005, 0.02),
    );
    assert_eq!(checked, 8);
}

/// PEFT's methods on a 4-bit base (`calibration/step_events.py --matrix-peft-qlora`), which
/// the step trace leaves to the formulas: BOFT (blocks of 4 with and without checkpointing,
/// of 16 with two factors), OFT, IA³, VeRA and AdaLoRA with and without checkpointing, on the
/// 2-layer Llama-3.1-8B in NF4 after `prepare_model_for_kbit_training` (fp32 hidden states,
/// so autocast casts the matmuls' fp32 inputs to 16 bits; BOFT saves those casts of the
/// identity, the rotation and the permutations, once for each `bmm`), BOFT's permutation
/// buffers on the host. The estimate's allocated peak within 1 % of the oracle's: counting
/// BOFT's one fp32 copy of the permutations and a rotation in the first layer, it was about
/// 3 % over.
#[test]
fn peft_methods_on_a_4bit_base_match_the_oracle() {
    let rows = include_str!("../../../validation/oracle-traces/step-events-peft-qlora.jsonl");
    let mut checked = 0;
    for line in rows.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let label = v["label"].as_str().unwrap();
        let (m, job, _, device) = support::oracle_step_job(&v);
        assert!(job.adapter.method.is_other_peft(), "{label}");
        assert!(
            job.quantization != moro_core::job::Quantization::None,
            "{label}"
        );
        let e = moro_core::estimate::estimate(&m, &job, &device).unwrap();
        let want = v["peak_allocated_bytes"].as_u64().unwrap();
        #[allow(clippy::cast_precision_loss)]
        let err = e.peak_allocated_bytes as f64 / want as f64 - 1.0;
        eprintln!("{label}: allocated {:+.3} %", err * 100.0);
        assert!(err.abs() < 0.01, "{label}: {err:+.4}");
        checked += 1;
    }
    assert_eq!(checked, 11);
}

/// PEFT's prompt and prefix tuning (`calibration/step_events.py --matrix-peft-prompt`): 50
/// virtual tokens (prefix tuning also 200; PEFT refuses it with checkpointing) on the
/// 2-layer Llama-3.1-8B and Qwen2.5-7B, 1 × 512 under bf16 autocast, over the prompt's
/// tokens too. Prompt tuning runs the frozen layers op by op, their input needing a gradient
/// from the first layer on: replayed from the reset after loading, allocated within 0.12 %
/// and reserved within 0.5 % (traced coarsely from the layers' saved bytes it was within
/// 0.12 % and 1.6 %). Prefix tuning's layers are traced coarsely: within 0.5 % and 2 %. Over
/// the sequence's tokens alone prompt tuning's trace was 2.4 % under; with LoRA pairs listed
/// on the default targets, prefix tuning's 0.6 % over.
#[test]
fn prompt_and_prefix_tuning_are_traced() {
    let rows = include_str!("../../../validation/oracle-traces/step-events-peft-prompt.jsonl");
    let checked = one_method_op_by_op(
        rows,
        PeftKind::PromptTuning,
        (0.002, 0.006),
        (0.005, 0.02),
        |label, job, trace| {
            assert!(job.adapter.method.uses_virtual_tokens(), "{label}");
            assert!(
                trace
                    .events
                    .iter()
                    .all(|e| e.name != "lora_A" && e.name != "lora_B"),
                "{label}"
            );
        },
    );
    assert_eq!(checked, 8);
}

/// PEFT's LN tuning (`calibration/step_events.py --matrix-peft-ln`: a trainable copy of each
/// of PEFT's default norms) on the 2-layer Llama-3.1-8B and Qwen2.5-7B, with and without
/// checkpointing, 1 × 512 under bf16 autocast. Replayed from the reset after loading,
/// allocated within 0.8 % and reserved within 2 %: the trace reads the formulas' saved
/// bytes, which count more than the real step keeps on the 2-layer Qwen2.5-7B without
/// checkpointing (+0.7 %; the first layer keeps less, as its input needs no gradient).
#[test]
fn ln_tuning_is_traced() {
    let rows = include_str!("../../../validation/oracle-traces/step-events-peft-ln.jsonl");
    let checked = rows_within(
        rows,
        |label, job, trace| {
            assert_eq!(job.adapter.method, PeftKind::LnTuning, "{label}");
            assert!(
                trace.events.iter().any(|e| e.name == "ln_tuning_layers"),
                "{label}"
            );
        },
        |_, _| (0.008, 0.02),
    );
    assert_eq!(checked, 4);
}

/// The op-level LoRA layer beyond the main fixture's jobs (`step-events-lora.jsonl`,
/// `step_events.py --matrix-lora`: the 2-layer Llama-3.1-8B, 1 × 512): fp32 adapters on the
/// bf16 model without autocast (every adapter tensor fp32, the sum cast back), dropout 0.05
/// under autocast (its fp32 output and saved mask), eager attention (`repeat_kv`'s copies,
/// the fp32 softmax and the probabilities the layer holds to its end), with and without
/// checkpointing, and q and v alone; the 2-layer Qwen3-8B, whose q and k are normalized
/// per head; eager attention over two sequences (`matmul`'s copies of q, k and v where it
/// cannot fold the batch into bmm's), with and without grouped KV heads (Llama-2-7B, 2 ×
/// 384, r 8, dropout 0.1). Replayed from the reset after loading, both peaks within 0.1 %.
#[test]
fn lora_layer_variants_are_traced_op_by_op() {
    let rows = include_str!("../../../validation/oracle-traces/step-events-lora.jsonl");
    assert_eq!(op_level_rows_within(rows, |_| 0.001), 11);
}

/// QLoRA's layers op by op (`calibration/step_events.py --matrix-qlora`): bitsandbytes'
/// 4-bit layers (the input cast to bf16, the weight dequantized with its nested absmax in
/// the forward and again in the backward, the output cast back to fp32), PEFT's clone of the
/// base output, the fp32 residual stream and norms `prepare_model_for_kbit_training` leaves,
/// autocast's casts of q, k and v for SDPA: the 2-layer Llama-3.1-8B with and without
/// checkpointing, with dropout 0.05, on q and v alone over 2 × 512 tokens, without double
/// quantization; the 2-layer Qwen2.5-7B and Mistral-7B, and Qwen3-8B (its q and k norms in
/// fp32, saving the projections' outputs) with and without checkpointing. Replayed from the
/// reset after loading, both peaks within 0.15 % (the job without double quantization is the
/// widest, +0.11 % reserved: the oracle quantizes on the device, which leaves each layer's
/// fp32 absmax in other blocks than loading from the host does).
#[test]
fn qlora_layers_are_traced_op_by_op() {
    let rows = include_str!("../../../validation/oracle-traces/step-events-qlora.jsonl");
    assert_eq!(op_level_rows_within(rows, |_| 0.0015), 10);
}

/// LoRA and QLoRA as TRL's `SFTTrainer` prepares them (`calibration/trl_trace.py
/// --matrix-trl-peft`, TRL f2cd577, with its chunked loss): QLoRA without
/// `prepare_model_for_kbit_training` (the residual stream and norms bf16) with its adapters
/// cast to bf16 (no autocast copies; `lora_A` saves its 16-bit input as is, the norm's
/// output shared by q, k and v), and under checkpointing the input embeddings requiring
/// grad, so the first layer computes its input's gradient: the 2-layer Llama-3.1-8B with and
/// without checkpointing, with dropout, on q and v alone, without double quantization;
/// Qwen2.5-7B, Mistral-7B and Qwen3-8B; LoRA with fp32 adapters with and without
/// checkpointing. Replayed from the reset after loading, both peaks within 0.1 %; the job
/// without double quantization within 0.5 % (+0.47 % reserved: the oracle quantizes on the
/// device, leaving each weight's fp32 absmax in other blocks than a load from the host).
#[test]
fn trl_peft_layers_are_traced_op_by_op() {
    let rows = include_str!("../../../validation/oracle-traces/step-events-trl-peft.jsonl");
    let tolerance = |label: &str| {
        if label.contains("-nf4-") {
            0.005
        } else {
            0.001
        }
    };
    assert_eq!(op_level_rows_within(rows, tolerance), 10);
}

/// Full fine-tunes of bf16 models without autocast, op by op (`calibration/step_events.py
/// --matrix-full`): the 2-layer Qwen3-8B (trainable q and k norms, whose gradients are copied
/// contiguous for their projections' weight gradients) with and without checkpointing,
/// Mistral-7B over 2 × 512 tokens, Llama-3.1-8B with eager attention and with foreach AdamW
/// over 1,024 tokens, Qwen2.5-7B (q, k and v biases: `AddmmBackward` makes the input's
/// gradient first). Replayed from the reset after loading, both peaks within 0.1 %.
#[test]
fn full_fine_tune_layers_are_traced_op_by_op() {
    let rows = include_str!("../../../validation/oracle-traces/step-events-full.jsonl");
    assert_eq!(op_level_rows_within(rows, |_| 0.001), 6);
}

/// transformers' `flash_attention_2` op by op (`calibration/step_events.py --matrix-flash`,
/// on an emulation of flash-attn 2.8.4's allocations and saved tensors): its RNG state, dq,
/// dk and dv made before the backward's workspace, transformers' packed-sequence check on
/// one sequence's position ids; LoRA on the 2-layer Llama-3.1-8B with and without
/// checkpointing, Mistral-7B over 2 × 256 tokens with dropout, Qwen3-8B; QLoRA on
/// Llama-3.1-8B and Qwen2.5-7B (q, k and v cast to bf16 by `fa_peft_integration_check`);
/// full fine-tunes of Qwen2.5-7B and of Llama-3.1-8B over 1,024 tokens with checkpointing.
/// Replayed from the reset after loading, both peaks within 0.15 %.
#[test]
fn flash_attn_layers_are_traced_op_by_op() {
    let rows = include_str!("../../../validation/oracle-traces/step-events-flash.jsonl");
    assert_eq!(op_level_rows_within(rows, |_| 0.0015), 8);
}

/// SDPA's math kernel, what a GPU without SDPA's flash backend (compute capability under
/// 8.0: T4, V100, RTX 20xx) runs for grouped KV heads (`calibration/step_events.py
/// --matrix-math`): q, k and v upcast to fp32, the causal mask, k and v repeated to every
/// head, the fp32 scores and softmax (kept for the backward) and the softmax's returned
/// 16-bit copy; LoRA on the 2-layer Llama-3.1-8B with and without checkpointing, Mistral-7B
/// over 2 × 256 tokens with dropout, Qwen3-8B; QLoRA on Llama-3.1-8B and Qwen2.5-7B (their
/// fp32 q, k and v cast by autocast first); full fine-tunes of Qwen2.5-7B and of
/// Llama-3.1-8B with checkpointing (`o_proj` saving the output's contiguous copy for its
/// weight's gradient). Replayed from the reset after loading, both peaks within 0.15 %.
#[test]
fn math_sdpa_layers_are_traced_op_by_op() {
    let rows = include_str!("../../../validation/oracle-traces/step-events-math.jsonl");
    assert_eq!(op_level_rows_within(rows, |_| 0.0015), 8);
}

/// SDPA's math kernel on heads that are not grouped, what Apple's MPS runs for every model
/// in training (`calibration/step_events.py --matrix-math-mha`): nothing repeated, the fp32
/// v saved for the product with it; LoRA on the 2-layer Llama-2-7B with checkpointing and
/// over 2 × 256 tokens without, a full fine-tune with checkpointing. Both peaks within
/// 0.15 %.
#[test]
fn math_sdpa_layers_without_grouped_heads_are_traced_op_by_op() {
    let rows = include_str!("../../../validation/oracle-traces/step-events-math-mha.jsonl");
    assert_eq!(op_level_rows_within(rows, |_| 0.0015), 3);
}

/// Liger's kernels as the Trainer's `use_liger_kernel=True` applies them, op by op
/// (`calibration/step_events.py --matrix-liger`: liger-kernel 0.8.5's own Python around
/// Triton launches that do nothing on fake tensors): `LigerRMSNorm` saving its input itself
/// and writing the input's gradient into the incoming one, RoPE in place, SwiGLU's gradients
/// written into gate's and up's saved outputs, the fused loss's one logits buffer or, on
/// classic QLoRA's fp32 stream, its per-chunk casts of the whole lm_head; LoRA on the 2-layer
/// Llama-3.1-8B with and without checkpointing and on Qwen3-8B (its q and k norms Liger's
/// too), QLoRA on Llama-3.1-8B and Qwen2.5-7B, full fine-tunes of both. Replayed from the
/// reset after loading, both peaks within 0.1 % (the coarse layers were 9 % over the full
/// fine-tune's reserved peak and 4.7 % under Qwen2.5-7B QLoRA's).
#[test]
fn liger_layers_are_traced_op_by_op() {
    let rows = include_str!("../../../validation/oracle-traces/step-events-liger.jsonl");
    assert_eq!(op_level_rows_within(rows, |_| 0.001), 7);
}

/// The same kernels under TRL's `SFTTrainer` with `use_liger_kernel=True`
/// (`calibration/trl_trace.py --matrix-trl-liger`): its PEFT preparation (QLoRA's stream,
/// norms and adapters in bf16, the input embeddings requiring grad under checkpointing) and
/// the model's own loss, Liger's fused one; QLoRA on the 2-layer Llama-3.1-8B with and
/// without checkpointing and on Qwen2.5-7B, LoRA with checkpointing. Both peaks within 0.1 %.
#[test]
fn trl_liger_layers_are_traced_op_by_op() {
    let rows = include_str!("../../../validation/oracle-traces/step-events-trl-liger.jsonl");
    assert_eq!(op_level_rows_within(rows, |_| 0.001), 4);
}

/// Replays each compact row of `rows` (a `step_events.py` matrix) and moro's op-by-op trace
/// of the same job from the reset after loading; asserts both peaks within `tolerance` of
/// the row's label. Returns the number of rows checked.
fn op_level_rows_within(rows: &str, tolerance: impl Fn(&str) -> f64) -> usize {
    rows_within(
        rows,
        |label, _, trace| assert!(trace.op_by_op, "{label}"),
        |label, _| (tolerance(label), tolerance(label)),
    )
}

/// [`rows_within`] over a fixture of two PEFT methods: `op_level`'s rows are traced op by op
/// and held to `op` (allocated, reserved), the other method's are not and are held to
/// `coarse`; `check` asserts what else each row's job and trace must be.
fn one_method_op_by_op(
    rows: &str,
    op_level: PeftKind,
    op: (f64, f64),
    coarse: (f64, f64),
    check: impl Fn(&str, &Job, &Trace),
) -> usize {
    rows_within(
        rows,
        |label, job, trace| {
            check(label, job, trace);
            assert_eq!(trace.op_by_op, job.adapter.method == op_level, "{label}");
        },
        |_, job| {
            if job.adapter.method == op_level {
                op
            } else {
                coarse
            }
        },
    )
}

/// Replays each compact row of `rows` and moro's trace of the same job from the reset after
/// loading; `check` asserts what the row's job and trace must be, and the allocated and
/// reserved peaks are held within `tolerance` of the row's label and job. Returns the number
/// of rows checked.
fn rows_within(
    rows: &str,
    check: impl Fn(&str, &Job, &Trace),
    tolerance: impl Fn(&str, &Job) -> (f64, f64),
) -> usize {
    let mut checked = 0;
    for line in rows.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let label = v["label"].as_str().unwrap();
        let (m, job, _, device) = support::oracle_step_job(&v);
        // As the estimate traces it: prompt tuning's tokens before each sequence.
        let trace = moro_core::estimate::trace::for_job(&m, &job, &device)
            .unwrap()
            .unwrap_or_else(|| panic!("{label}: traced"));
        check(label, &job, &trace);
        dump_trace(label, &trace);
        let (ea, er) = errors_after_load(label, &trace, &v);
        let (ta, tr) = tolerance(label, &job);
        assert!(
            ea.abs() <= ta && er.abs() <= tr,
            "{label}: {ea:+.4} / {er:+.4}"
        );
        checked += 1;
    }
    checked
}
