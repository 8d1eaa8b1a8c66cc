//! The recipe search against brute force, and the margin against the validation data.
//!
//! The brute force enumerates the space from issue 3 §2 with its own loops, decides "fits"
//! from the raw estimate and the documented margin rule, and ranks with its own comparator
//! written from the documented objective; the search must find a configuration no fitting
//! one beats.

use std::cmp::Ordering;

use moro_core::catalog;
use moro_core::estimate::estimate;
use moro_core::hardware::{Device, preset};
use moro_core::job::{Attention, Method, Optimizer, Precision, Stack};
use moro_core::model::ModelSpec;
use moro_core::search::{
    Caps, Config, MethodChoice, Objective, Request, Space, TargetSet, margin_bytes, search,
};
use moro_core::units::{GIB, MIB};

fn model(id: &str) -> ModelSpec {
    let e = catalog::find(id).unwrap_or_else(|| panic!("{id} not in catalog"));
    catalog::load(e).unwrap()
}

fn device(spec: &str) -> Device {
    if let Some(p) = preset(spec) {
        return p.to_device(None).unwrap();
    }
    match moro_core::hardware::parse_hardware_spec(spec).unwrap() {
        moro_core::hardware::HardwareSpec::Given(h) => h.devices[0].clone(),
        moro_core::hardware::HardwareSpec::Detect => unreachable!(),
    }
}

/// The documented quality order, written independently of `moro_core::search::quality_key`.
fn quality_cmp(a: &Config, b: &Config) -> Ordering {
    let method = |m: Method| match m {
        Method::Full => 3,
        Method::Lora => 2,
        _ => 1,
    };
    let all_linear = |c: &Config| c.method != Method::Full && c.targets == TargetSet::AllLinear;
    let rank = |c: &Config| if c.method == Method::Full { 0 } else { c.rank };
    let opt = |o: Optimizer| match o {
        Optimizer::AdamwTorchFused => 3,
        Optimizer::Adamw8bit => 2,
        _ => 1,
    };
    a.seq_len
        .cmp(&b.seq_len)
        .then(method(a.method).cmp(&method(b.method)))
        .then(all_linear(a).cmp(&all_linear(b)))
        .then(
            (a.precision == Precision::Bf16Mixed || a.precision == Precision::Fp16Mixed)
                .cmp(&(b.precision == Precision::Bf16Mixed || b.precision == Precision::Fp16Mixed)),
        )
        .then(rank(a).cmp(&rank(b)))
        .then(b.gradient_checkpointing.cmp(&a.gradient_checkpointing))
        .then(a.micro_batch.cmp(&b.micro_batch))
        .then(opt(a.optimizer).cmp(&opt(b.optimizer)))
        .then((a.attention == Attention::Flash).cmp(&(b.attention == Attention::Flash)))
}

/// The documented speed order.
fn speed_cmp(a: &Config, b: &Config) -> Ordering {
    let method = |m: Method| match m {
        Method::Lora => 3,
        Method::Full => 2,
        _ => 1,
    };
    let opt = |o: Optimizer| match o {
        Optimizer::AdamwTorchFused => 3,
        Optimizer::Adamw8bit => 2,
        _ => 1,
    };
    let all_linear = |c: &Config| c.method != Method::Full && c.targets == TargetSet::AllLinear;
    let rank = |c: &Config| if c.method == Method::Full { 0 } else { c.rank };
    a.seq_len
        .cmp(&b.seq_len)
        .then(b.gradient_checkpointing.cmp(&a.gradient_checkpointing))
        .then(a.micro_batch.cmp(&b.micro_batch))
        .then(method(a.method).cmp(&method(b.method)))
        .then((a.attention == Attention::Flash).cmp(&(b.attention == Attention::Flash)))
        .then(opt(a.optimizer).cmp(&opt(b.optimizer)))
        .then(all_linear(a).cmp(&all_linear(b)))
        .then(rank(a).cmp(&rank(b)))
        .then((a.precision != Precision::Bf16).cmp(&(b.precision != Precision::Bf16)))
}

/// The whole space of issue 3 §2, enumerated by hand.
fn brute_configs(
    dev: &Device,
    methods: &[Method],
    seq_lens: &[u64],
    effective_batch: u64,
) -> Vec<Config> {
    let precisions: &[Precision] = if dev.supports_bf16 {
        &[Precision::Bf16Mixed, Precision::Bf16]
    } else {
        &[Precision::Fp16Mixed]
    };
    let attentions: &[Attention] = if dev.supports_flash_attention {
        &[Attention::Flash, Attention::Sdpa]
    } else {
        &[Attention::Sdpa]
    };
    let mut out = Vec::new();
    for &seq_len in seq_lens {
        for &method in methods {
            let lora: Vec<(TargetSet, u64)> = if method == Method::Full {
                vec![(TargetSet::AllLinear, 0)]
            } else {
                let mut v = Vec::new();
                for t in [TargetSet::Attention, TargetSet::AllLinear] {
                    for r in [8, 16, 32, 64, 128] {
                        v.push((t, r));
                    }
                }
                v
            };
            for (targets, rank) in lora {
                for &precision in precisions {
                    for gradient_checkpointing in [false, true] {
                        for optimizer in [
                            Optimizer::AdamwTorchFused,
                            Optimizer::Adamw8bit,
                            Optimizer::PagedAdamw8bit,
                        ] {
                            for &attention in attentions {
                                let mut b = 1;
                                while b <= effective_batch {
                                    if effective_batch.is_multiple_of(b) {
                                        out.push(Config {
                                            method,
                                            targets,
                                            rank,
                                            precision,
                                            gradient_checkpointing,
                                            optimizer,
                                            attention,
                                            seq_len,
                                            micro_batch: b,
                                        });
                                    }
                                    b *= 2;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Fit by the documented rule, computed from the raw estimate.
fn fits(spec: &ModelSpec, space: &Space, caps: &Caps, c: &Config, stack: Stack) -> Option<u64> {
    let job = space.job(c);
    let est = estimate(spec, &job, &caps.profile).ok()?;
    let peak = est.peak_device_bytes;
    #[allow(clippy::cast_precision_loss)]
    let ratio = moro_core::search::margin_permille(stack) as f64 / 1000.0;
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let margin = ((peak as f64 * ratio) as u64).max(512 * MIB);
    // The rule and the library's integer arithmetic agree to a few bytes.
    assert!(margin.abs_diff(margin_bytes(peak, stack)) < 1024);
    (peak + margin <= caps.usable_bytes).then_some(peak)
}

fn check_brute_force(model_id: &str, hw: &str, request: &Request) {
    let spec = model(model_id);
    let dev = device(hw);
    let caps = Caps::of_device(&dev);
    let space = Space::new(&spec, request, &caps).unwrap();
    let out = search(&spec, &space, &caps);
    let cmp = match request.objective {
        Objective::Quality => quality_cmp,
        Objective::Speed => speed_cmp,
    };
    let seq_lens: Vec<u64> = match request.seq_len {
        Some(s) => vec![s],
        None => vec![8192, 4096, 2048, 1024]
            .into_iter()
            .filter(|s| *s <= spec.max_position_embeddings)
            .collect(),
    };
    let eb = request.effective_batch.unwrap_or(16);
    let methods = match request.method {
        MethodChoice::Auto => vec![Method::Full, Method::Lora, Method::Qlora],
        MethodChoice::Only(m) => vec![m],
    };
    let all = brute_configs(&dev, &methods, &seq_lens, eb);
    assert_eq!(
        all.len(),
        moro_core::search::all_configs(&space).len(),
        "{model_id} on {hw}: space size"
    );
    let mut best: Option<Config> = None;
    let mut min_peak = u64::MAX;
    for c in &all {
        if let Ok(est) = estimate(&spec, &space.job(c), &caps.profile) {
            min_peak = min_peak.min(est.peak_device_bytes);
        }
        if fits(&spec, &space, &caps, c, request.stack).is_some()
            && best.as_ref().is_none_or(|b| cmp(c, b) == Ordering::Greater)
        {
            best = Some(*c);
        }
    }
    match (&out.best, best) {
        (Some(got), Some(want)) => {
            assert!(got.fits());
            assert!(fits(&spec, &space, &caps, &got.config, request.stack).is_some());
            assert_eq!(
                cmp(&got.config, &want),
                Ordering::Equal,
                "{model_id} on {hw} ({:?}): search chose {:?}, brute force {:?}",
                request.objective,
                got.config,
                want
            );
            // Runners-up are fitting and in order, none better than the best.
            let mut prev = got.config;
            for r in &out.runners_up {
                assert!(r.fits());
                assert_ne!(cmp(&r.config, &prev), Ordering::Greater);
                prev = r.config;
            }
            assert!(out.closest.is_none());
        }
        (None, None) => {
            let c = out
                .closest
                .as_ref()
                .expect("closest configuration when nothing fits");
            assert!(!c.fits());
            assert_eq!(
                c.estimate.peak_device_bytes, min_peak,
                "{model_id} on {hw}: closest"
            );
            assert!(out.short_by_bytes() > 0);
        }
        (got, want) => panic!(
            "{model_id} on {hw}: search {:?}, brute force {:?}",
            got.as_ref().map(|c| c.config),
            want
        ),
    }
}

const PRESETS: [&str; 7] = [
    "rtx-3060-12gb",
    "rtx-4070-ti-super",
    "rtx-4090",
    "t4",
    "a100-sxm4-80gb",
    "apple-m3-max-64gb",
    "h100-sxm",
];

#[test]
fn no_fitting_configuration_beats_the_choice_quality() {
    for m in [
        "Qwen/Qwen2.5-0.5B",
        "Qwen/Qwen2.5-7B",
        "meta-llama/Llama-3.1-8B",
        "microsoft/phi-2",
        "Qwen/Qwen2.5-32B",
    ] {
        for hw in PRESETS {
            check_brute_force(
                m,
                hw,
                &Request {
                    seq_len: Some(2048),
                    ..Request::default()
                },
            );
        }
    }
}

#[test]
fn no_fitting_configuration_beats_the_choice_speed_and_free_seq_len() {
    for m in [
        "Qwen/Qwen2.5-1.5B",
        "meta-llama/Llama-3.2-3B",
        "google/gemma-2-9b",
    ] {
        for hw in ["rtx-3060-12gb", "rtx-4090", "a100-sxm4-80gb", "t4", "16GiB"] {
            for objective in [Objective::Quality, Objective::Speed] {
                check_brute_force(
                    m,
                    hw,
                    &Request {
                        objective,
                        ..Request::default()
                    },
                );
            }
        }
    }
}

#[test]
fn other_stacks_batches_and_fixed_methods() {
    let cases = [
        (
            "Qwen/Qwen2.5-7B",
            "rtx-4090",
            Stack::Trl,
            MethodChoice::Only(Method::Lora),
            8,
        ),
        (
            "Qwen/Qwen2.5-7B",
            "rtx-4090",
            Stack::Litgpt,
            MethodChoice::Auto,
            32,
        ),
        (
            "meta-llama/Llama-3.1-8B",
            "a100-sxm4-80gb",
            Stack::Torchtune,
            MethodChoice::Only(Method::Full),
            12,
        ),
        (
            "Qwen/Qwen2.5-3B",
            "rtx-3060-12gb",
            Stack::Hf,
            MethodChoice::Only(Method::Qlora),
            1,
        ),
        (
            "mistralai/Mistral-7B-v0.1",
            "rtx-4070",
            Stack::Hf,
            MethodChoice::Auto,
            6,
        ),
    ];
    for (m, hw, stack, method, eb) in cases {
        let seq_len = Some(4096);
        let mut req = Request {
            stack,
            method,
            seq_len,
            effective_batch: Some(eb),
            ..Request::default()
        };
        check_brute_force(m, hw, &req);
        req.objective = Objective::Speed;
        check_brute_force(m, hw, &req);
    }
}

#[test]
fn nothing_fits_reports_the_smallest_configuration() {
    // A 72B model on 12 GB: nothing fits even as QLoRA at 1024 tokens.
    check_brute_force("Qwen/Qwen2.5-72B", "rtx-3060-12gb", &Request::default());
    let spec = model("Qwen/Qwen2.5-72B");
    let caps = Caps::of_device(&device("rtx-3060-12gb"));
    let out = search(
        &spec,
        &Space::new(&spec, &Request::default(), &caps).unwrap(),
        &caps,
    );
    let c = out.closest.clone().unwrap();
    assert_eq!(c.config.method, Method::Qlora);
    assert!(
        c.estimate.peak_device_bytes > 30 * GIB,
        "NF4 72B weights alone are ~36 GiB"
    );
    assert_eq!(
        out.short_by_bytes(),
        c.estimate.peak_device_bytes + c.margin_bytes - caps.usable_bytes
    );
}

#[test]
fn no_bf16_means_fp16_mixed_and_no_flash() {
    let spec = model("Qwen/Qwen2.5-1.5B");
    let caps = Caps::of_device(&device("t4"));
    assert!(!caps.bf16 && !caps.flash_attention);
    let out = search(
        &spec,
        &Space::new(&spec, &Request::default(), &caps).unwrap(),
        &caps,
    );
    for c in out.best.iter().chain(&out.runners_up) {
        assert_eq!(c.job.precision, Precision::Fp16Mixed);
        assert_eq!(c.job.attention, Attention::Sdpa);
    }
}

#[test]
fn effective_batch_is_kept() {
    let spec = model("Qwen/Qwen2.5-7B");
    let caps = Caps::of_device(&device("rtx-4090"));
    for eb in [1, 6, 16, 48] {
        let req = Request {
            effective_batch: Some(eb),
            seq_len: Some(2048),
            ..Request::default()
        };
        let out = search(&spec, &Space::new(&spec, &req, &caps).unwrap(), &caps);
        for c in out.best.iter().chain(&out.runners_up) {
            assert_eq!(c.job.micro_batch_size * c.job.grad_accum, eb);
            assert!(c.job.micro_batch_size.is_power_of_two());
        }
    }
}

#[test]
fn bad_requests_name_the_field() {
    let spec = model("Qwen/Qwen2.5-7B");
    let caps = Caps::of_device(&device("rtx-4090"));
    let e = Space::new(
        &spec,
        &Request {
            seq_len: Some(0),
            ..Request::default()
        },
        &caps,
    )
    .unwrap_err();
    assert!(e.to_string().starts_with("`seq_len`"), "{e}");
    let e = Space::new(
        &spec,
        &Request {
            effective_batch: Some(0),
            ..Request::default()
        },
        &caps,
    )
    .unwrap_err();
    assert!(e.to_string().starts_with("`effective_batch`"), "{e}");
    let e = Space::new(
        &spec,
        &Request {
            method: MethodChoice::Only(Method::Inference),
            ..Request::default()
        },
        &caps,
    )
    .unwrap_err();
    assert!(e.to_string().starts_with("`method`"), "{e}");
}

/// p90 of `max(0, measured / predicted − 1)` per stack, from the validation set.
#[test]
fn margins_cover_p90_underprediction() {
    let text = include_str!("../../../validation/measured.jsonl");
    let report =
        moro_core::validation::validate(text, &moro_core::validation::CatalogModels, false);
    for stack in Stack::ALL {
        let mut short: Vec<f64> = report
            .rows
            .iter()
            .filter(|r| r.stack == Some(stack.as_str()))
            .filter_map(|r| {
                #[allow(clippy::cast_precision_loss)]
                Some((r.measured_bytes? as f64 / r.predicted_bytes? as f64 - 1.0).max(0.0))
            })
            .collect();
        if short.is_empty() {
            continue;
        }
        short.sort_by(f64::total_cmp);
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let p90 = short[((0.9 * short.len() as f64).ceil() as usize).clamp(1, short.len()) - 1];
        #[allow(clippy::cast_precision_loss)]
        let ratio = moro_core::search::margin_permille(stack) as f64 / 1000.0;
        eprintln!(
            "{}: {} rows, p90 under-prediction {:.1}%, margin {:.1}%",
            stack.as_str(),
            short.len(),
            p90 * 100.0,
            ratio * 100.0
        );
        let pooled = short.len() < moro_core::search::MARGIN_MIN_ROWS;
        assert!(
            pooled || ratio + 1e-9 >= p90,
            "the {} margin {ratio} is below the measured p90 under-prediction {p90:.4}",
            stack.as_str()
        );
        // ... and by less than the rounding to a whole percent.
        assert!(
            pooled || ratio < p90 + 0.01 + 1e-9,
            "{}: {ratio} vs {p90}",
            stack.as_str()
        );
    }
}
