//! The replayed fragmentation of full fine-tunes against the H200's measured
//! `max_memory_reserved − max_memory_allocated` (`validation/h200/`, which moro's model
//! never saw while the replay was written).

use moro_core::validation::{CatalogModels, explain};

/// The nine full fine-tunes of the H200 set: (job id, measured reserved − allocated in GiB,
/// from the `-reserved` and `-allocated` rows).
const JOBS: [(&str, f64); 9] = [
    ("e00578d00b", 61.539_062 - 59.910_156),
    ("457918c83f", 128.113_281 - 119.750_000),
    ("371d4fad14", 75.990_234 - 74.845_703),
    ("ee25a960b0", 65.830_078 - 59.900_391),
    ("62779155a1", 46.232_422 - 45.191_406),
    ("896224463b", 123.250_000 - 119.890_625),
    ("d01d2061c2", 14.183_594 - 11.530_273),
    ("86c70f4974", 25.552_734 - 22.570_312),
    ("8f7aee3b3a", 20.986_328 - 16.626_953),
];

/// A file of `validation/`.
fn validation(file: &str) -> String {
    let path = format!("{}/../../validation/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn h200() -> String {
    validation("h200/measured.jsonl")
}

#[allow(clippy::cast_precision_loss)]
fn gib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

fn measured_gib(text: &str, id: &str) -> f64 {
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["id"] == id)
        .and_then(|v| v["measured_gib"].as_f64())
        .unwrap_or_else(|| panic!("{id}"))
}

/// The fragmentation the replay generates is the measured one within a quarter (plus
/// 0.25 GiB) for eight of the nine jobs, where the ratio model before it said 1.0 to 2.0 GiB
/// for all of them (measured: 1.0 to 8.4). The ninth, 8-bit AdamW, is over (1.68 against
/// 1.04 GiB): bitsandbytes' states are modelled as one byte an element, in two tensors.
#[test]
fn replayed_fragmentation_is_the_h200s() {
    let text = h200();
    let mut within = 0;
    for (job, _) in JOBS {
        let frag = {
            let e = explain(&text, &CatalogModels, &format!("moro-cal-{job}-reserved"))
                .unwrap_or_else(|e| panic!("{job}: {e}"))
                .estimate;
            gib(e.replayed_fragmentation_bytes)
        };
        let measured = measured_gib(&text, &format!("moro-cal-{job}-reserved"))
            - measured_gib(&text, &format!("moro-cal-{job}-allocated"));
        let expected = JOBS.iter().find(|j| j.0 == job).map(|j| j.1).unwrap_or(0.0);
        assert!((measured - expected).abs() < 0.01, "{job}: {measured}");
        eprintln!("{job}: replayed {frag:.2} GiB, measured {measured:.2} GiB");
        if (frag - measured).abs() <= 0.25 * measured + 0.25 {
            within += 1;
        } else {
            assert!(frag > measured, "{job}: {frag:.2} under {measured:.2}");
        }
    }
    assert!(within >= 8, "{within} of 9");
}

/// Llama-3.1-8B with DoRA (`moro-cal-566e30cdce`, `validation/h200/settings.jsonl`): DoRA's
/// weight-sized temporaries (the identity, `lora_B(lora_A(eye))`, the fp32 weight copies,
/// 0.06 to 1.1 GiB a module) are `cudaMalloc`ed in the first layer's forward and split by
/// smaller tensors after. The GPU measured 2.22 GiB of reserved − allocated; the ratio
/// model gave 0.98 (the logits block), 5.5 % under the reserved level, and the real step's
/// allocation sequence, replayed, 2.25 (`real_step_replay.rs`). moro's trace, replayed, is
/// held to the measured fragmentation within 0.25 GiB and the reserved level within 2 %.
#[test]
fn dora_is_replayed_to_the_h200s_reserve() {
    let text = validation("h200/settings.jsonl");
    let id = "moro-cal-566e30cdce";
    let e = explain(&text, &CatalogModels, &format!("{id}-reserved"))
        .unwrap()
        .estimate;
    let reserved = measured_gib(&text, &format!("{id}-reserved"));
    let measured = reserved - measured_gib(&text, &format!("{id}-allocated"));
    let frag = gib(e.replayed_fragmentation_bytes);
    assert!(
        (frag - measured).abs() <= 0.25,
        "{frag:.2} against {measured:.2} GiB"
    );
    let err = gib(e.peak_reserved_bytes) / reserved - 1.0;
    assert!(err.abs() <= 0.02, "reserved {err:+.3}");
}

/// Mistral-7B-v0.3 QLoRA on the H200 (`moro-cal-04f2bd94cc`, 1 × 2048, checkpointing): each
/// 4-bit Linear's dequantized weight is freed and split by smaller tensors, which the ratio
/// reserve left out (−5.9 % at the reserved level before the replay; the real step's
/// sequence replayed gives +0.9 %, `real_step_replay.rs`). With QLoRA replayed, the reserved
/// level is within 5 % and the allocated within 2 %.
#[test]
fn qlora_is_replayed() {
    let text = h200();
    let id = "moro-cal-04f2bd94cc";
    let e = explain(&text, &CatalogModels, &format!("{id}-reserved"))
        .unwrap()
        .estimate;
    assert!(e.replayed_fragmentation_bytes > 0);
    let reserved = gib(e.peak_reserved_bytes) / measured_gib(&text, &format!("{id}-reserved"));
    let allocated = gib(e.peak_allocated_bytes) / measured_gib(&text, &format!("{id}-allocated"));
    assert!((reserved - 1.0).abs() <= 0.05, "reserved {reserved:.3}");
    assert!((allocated - 1.0).abs() <= 0.02, "allocated {allocated:.3}");
}

/// Every QLoRA run of the H200 (`validation/h200/measured.jsonl`: ten jobs, Llama, Mistral
/// and Qwen, 512 to 4,096 tokens, with and without checkpointing) is predicted within 2 %
/// under its reserved level. A checkpointed layer's forward makes and drops the tensors its
/// recompute will save, and the blocks they leave are what the next dequantized weights
/// split; without them in the trace the replay left these runs up to 4.4 % under.
#[test]
fn qlora_runs_reserve_as_the_h200s() {
    use moro_core::validation::{Status, validate};
    let report = validate(&h200(), &CatalogModels, false);
    let mut checked = 0;
    for r in &report.rows {
        if r.method != Some("qlora") || !r.id.ends_with("-reserved") {
            continue;
        }
        assert_eq!(r.status, Status::Ok, "{}", r.id);
        let e = r.error.expect("compared");
        assert!((-0.02..=0.05).contains(&e), "{}: {:+.2} %", r.id, e * 100.0);
        checked += 1;
    }
    assert_eq!(checked, 10);
}

/// Later micro-batches of a step replay as the capped ones do
/// ([`moro_core::estimate::replay::REPLAYED_MICRO_BATCHES`]): 16 micro-batches traced in full
/// give the same fragmentation as the cap, for QLoRA with and without checkpointing and a
/// full fine-tune, on an untied and a tied model.
#[test]
fn capped_micro_batches_replay_as_all_of_them() {
    use moro_core::estimate::trace::step;
    use moro_core::estimate::{DeviceProfile, Regime, replay};
    use moro_core::job::{Job, Method, Quantization};
    let device = DeviceProfile::default();
    for id in ["meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-1.5B"] {
        let m = moro_core::catalog::load(moro_core::catalog::find(id).unwrap()).unwrap();
        for (method, quantization, ckpt) in [
            (Method::QuantizedAdapters, Quantization::Nf4Dq, true),
            (Method::QuantizedAdapters, Quantization::Nf4Dq, false),
            (Method::Full, Quantization::None, true),
        ] {
            let job = Job {
                method,
                quantization,
                seq_len: 2048,
                micro_batch_size: 2,
                grad_accum: 16,
                gradient_checkpointing: ckpt,
                ..Job::default()
            };
            let r = Regime::resolve(&m, &job);
            let t = step::trace(&m, &job, &r, &device).unwrap();
            let all = t.replay().reserved - t.peak().0;
            let capped = replay::step(&m, &job, &r, &device).map_or(0, |s| s.fragmentation);
            assert_eq!(capped, all, "{id} {method:?} checkpointing {ckpt}");
            // Read as it is traced, keeping no event, the step gives the stored trace's
            // levels.
            let levels = step::levels(&m, &job, &r, &device, true).unwrap();
            assert_eq!(levels.phases, t.phases(), "{id} {method:?} {ckpt}");
            assert_eq!(levels.replayed, Some(t.replay()), "{id} {method:?} {ckpt}");
        }
    }
}

/// A LoRA job whose layers are traced op by op is replayed, and the replay alone is its
/// reserve (H200 `7cbf4904a2`: Llama-3.1-8B, SDPA); one traced coarsely keeps the ratio's
/// reserve (`103068b23d`, Phi-3's fused q/k/v and gate/up projections, whose coarse replay
/// came out 2.4 % under the oracle's). Sharded jobs are not replayed.
#[test]
fn lora_is_replayed_where_traced_op_by_op_and_sharded_jobs_are_not() {
    let text = h200();
    let lora = explain(&text, &CatalogModels, "moro-cal-7cbf4904a2-reserved")
        .unwrap()
        .estimate;
    assert!(lora.reserve_from_replay);
    assert!(lora.replayed_fragmentation_bytes > 0);
    let reserve = lora.peak_reserved_bytes - lora.peak_allocated_bytes;
    // The reserved level is rounded up to the allocator's 2 MiB.
    let replayed = lora.replayed_fragmentation_bytes;
    assert!(
        reserve >= replayed && reserve < replayed + (2 << 20),
        "{reserve}"
    );
    let fused = explain(&text, &CatalogModels, "moro-cal-103068b23d-reserved")
        .unwrap()
        .estimate;
    assert!(!fused.reserve_from_replay);
    assert_eq!(fused.replayed_fragmentation_bytes, 0);
    let full = explain(&text, &CatalogModels, "moro-cal-e00578d00b-reserved").unwrap();
    let mut job = full.job.clone();
    job.parallel.data_parallel = 8;
    job.parallel.sharding = moro_core::job::Sharding::FsdpFullShard;
    let r = moro_core::estimate::Regime::resolve(&full.model, &job);
    assert_eq!(
        moro_core::estimate::replay::step(
            &full.model,
            &job,
            &r,
            &moro_core::estimate::DeviceProfile::default()
        )
        .map_or(0, |s| s.fragmentation),
        0
    );
}

/// BERT-large sequence classification, fp32, no checkpointing, on a V100 (the HF docs'
/// single-GPU table, nvidia-smi after training): the replayed encoder steps bring the
/// device level within 5 % of the measured 14,949 MiB (batch 4) and 8,681 MiB (batch 1),
/// where the ratio model was 7.7 % and 4.3 % under. With checkpointing the encoder is not
/// replayed (it came out 10–16 % over).
#[test]
fn bert_large_without_checkpointing_is_replayed() {
    let text = validation("measured.jsonl");
    for (id, mib) in [
        ("hf-docs-perf-train-gpu-one-001", 14_949.0),
        ("hf-docs-perf-train-gpu-one-002", 8_681.0),
    ] {
        let e = explain(&text, &CatalogModels, id).unwrap().estimate;
        assert!(e.replayed_fragmentation_bytes > 0, "{id}");
        #[allow(clippy::cast_precision_loss)]
        let err = e.peak_device_bytes as f64 / (mib * f64::from(1u32 << 20)) - 1.0;
        assert!(err.abs() <= 0.05, "{id}: {err:+.3}");
    }
    let ckpt = explain(&text, &CatalogModels, "hf-docs-perf-train-gpu-one-003").unwrap();
    assert_eq!(ckpt.estimate.replayed_fragmentation_bytes, 0);
}

/// Read without its replay, the step trace of a job traced op by op is a floor under the
/// estimate (the replay's fragmentation is the whole reserve and only adds to it) at the
/// same allocated level: `tests/search.rs` rules configurations out on it. Llama-3.1-8B:
/// LoRA, QLoRA on HF and on TRL, and a bf16 full fine-tune.
#[test]
fn the_trace_without_its_replay_is_a_floor() {
    use moro_core::estimate::{
        DeviceProfile, add_replayed_step, estimate, estimate_without_replay, replayed_step_floor,
        trace,
    };
    use moro_core::job::{Job, Method, Precision, Quantization, Stack};

    let Some(model) = moro_core::catalog::find("meta-llama/Llama-3.1-8B")
        .and_then(|e| moro_core::catalog::load(e).ok())
    else {
        panic!("Llama-3.1-8B is in the catalog");
    };
    let base = Job {
        seq_len: 2048,
        micro_batch_size: 2,
        gradient_checkpointing: true,
        ..Job::default()
    };
    let qlora = Job {
        method: Method::QuantizedAdapters,
        quantization: Quantization::Nf4Dq,
        ..base.clone()
    };
    let jobs = [
        Job {
            method: Method::Adapters,
            ..base.clone()
        },
        qlora.clone(),
        Job {
            stack: Stack::Trl,
            ..qlora
        },
        Job {
            method: Method::Full,
            precision: Precision::Bf16,
            gradient_checkpointing: false,
            ..base
        },
    ];
    let profile = DeviceProfile::default();
    for job in jobs {
        let full = estimate(&model, &job, &profile).unwrap_or_else(|e| panic!("{e}"));
        assert!(trace::step::op_by_op(&model, &job, &full.regime), "{job:?}");
        let mut floor =
            estimate_without_replay(&model, &job, &profile).unwrap_or_else(|e| panic!("{e}"));
        let step = replayed_step_floor(&floor, &model, &job, &profile);
        add_replayed_step(&mut floor, &profile, step.as_ref());
        assert_eq!(
            floor.peak_allocated_bytes, full.peak_allocated_bytes,
            "{job:?}"
        );
        assert_eq!(floor.replayed_fragmentation_bytes, 0);
        assert!(full.replayed_fragmentation_bytes > 0, "{job:?}");
        assert!(
            floor.peak_device_bytes < full.peak_device_bytes,
            "{job:?}: floor {} not under {}",
            floor.peak_device_bytes,
            full.peak_device_bytes
        );
    }
}
