//! The recipe search against brute force, and the margin against the validation data.
//!
//! The brute force enumerates the space from issue 3 §2 with its own loops, decides "fits"
//! from the raw estimate and the documented margin rule, and ranks with its own comparator
//! written from the documented objective; the search must find a configuration no fitting
//! one beats.

use std::cmp::Ordering;

use moro_core::bound::{JobClass, Table};
use moro_core::catalog;
use moro_core::estimate::{
    add_replayed_step, estimate, estimate_without_replay, replayed_step_floor,
};
use moro_core::hardware::{Device, preset};
use moro_core::job::{Attention, Method, Offload, Optimizer, Precision, Sharding, Stack};
use moro_core::model::ModelSpec;
use moro_core::search::{
    Caps, Cluster, Config, Layout, MethodChoice, Objective, Request, Space, TargetSet,
    margin_bytes, search, search_best,
};
use moro_core::units::{GIB, MIB};
use moro_core::validation::Metric;

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

/// The documented communication order of a layout (smaller is less): offload level × 5 +
/// sharding level, ZeRO-3 / FULL_SHARD costing one more across nodes.
fn comm(l: &Layout) -> u64 {
    let shard = match l.sharding {
        Sharding::None => 0,
        Sharding::Zero1 => 1,
        Sharding::Zero2 | Sharding::FsdpShardGradOp => 2,
        Sharding::FsdpHybridShard => 3,
        Sharding::Zero3 | Sharding::FsdpFullShard => 3 + u64::from(l.nodes > 1),
    };
    let off = match l.offload {
        Offload::None => 0,
        Offload::Optimizer => 1,
        Offload::OptimizerAndParams => 2,
    };
    off * 5 + shard
}

fn deepspeed(l: &Layout) -> bool {
    matches!(
        l.sharding,
        Sharding::Zero1 | Sharding::Zero2 | Sharding::Zero3
    )
}

/// The documented quality order, written independently of `moro_core::search::quality_key`.
fn quality_cmp(a: &Config, b: &Config) -> Ordering {
    let method = |m: Method| match m {
        Method::Full => 3,
        Method::Adapters => 2,
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
        .then(comm(&b.layout).cmp(&comm(&a.layout)))
        .then(a.layout.gpus.cmp(&b.layout.gpus))
        .then(rank(a).cmp(&rank(b)))
        .then(b.gradient_checkpointing.cmp(&a.gradient_checkpointing))
        .then(a.micro_batch.cmp(&b.micro_batch))
        .then(opt(a.optimizer).cmp(&opt(b.optimizer)))
        .then((a.attention == Attention::Flash).cmp(&(b.attention == Attention::Flash)))
        .then(deepspeed(&a.layout).cmp(&deepspeed(&b.layout)))
        .then(b.liger.cmp(&a.liger))
}

/// The documented speed order.
fn speed_cmp(a: &Config, b: &Config) -> Ordering {
    let method = |m: Method| match m {
        Method::Adapters => 3,
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
        .then((comm(&b.layout) / 5).cmp(&(comm(&a.layout) / 5)))
        .then(a.layout.gpus.cmp(&b.layout.gpus))
        .then(b.gradient_checkpointing.cmp(&a.gradient_checkpointing))
        .then(comm(&b.layout).cmp(&comm(&a.layout)))
        .then(a.micro_batch.cmp(&b.micro_batch))
        .then(method(a.method).cmp(&method(b.method)))
        .then((a.attention == Attention::Flash).cmp(&(b.attention == Attention::Flash)))
        .then(a.liger.cmp(&b.liger))
        .then(opt(a.optimizer).cmp(&opt(b.optimizer)))
        .then(all_linear(a).cmp(&all_linear(b)))
        .then(rank(a).cmp(&rank(b)))
        .then((a.precision != Precision::Bf16).cmp(&(b.precision != Precision::Bf16)))
        .then(deepspeed(&a.layout).cmp(&deepspeed(&b.layout)))
}

/// The layouts of issue 6 §3, enumerated by hand: GPU counts 1, 2, 4, … below a node, then
/// 1, 2, 4, … nodes and all of them; the strategies of each stack.
fn brute_layouts(cluster: Option<Cluster>, stack: Stack) -> Vec<Layout> {
    let Some(c) = cluster else {
        return vec![Layout::SINGLE];
    };
    let mut counts = Vec::new();
    if c.exact {
        counts.push(c.nodes * c.gpus_per_node);
    } else {
        let mut n = 1;
        while n < c.gpus_per_node {
            counts.push(n);
            n *= 2;
        }
        let mut m = 1;
        while m < c.nodes {
            counts.push(m * c.gpus_per_node);
            m *= 2;
        }
        counts.push(c.nodes * c.gpus_per_node);
    }
    let mut out = Vec::new();
    for gpus in counts {
        if gpus == 1 {
            out.push(Layout::SINGLE);
            continue;
        }
        let nodes = gpus.div_ceil(c.gpus_per_node);
        let mut v: Vec<(Sharding, Offload)> = match stack {
            Stack::Hf | Stack::Trl => vec![
                (Sharding::None, Offload::None),
                (Sharding::Zero1, Offload::None),
                (Sharding::Zero2, Offload::None),
                (Sharding::Zero3, Offload::None),
                (Sharding::FsdpShardGradOp, Offload::None),
                (Sharding::FsdpFullShard, Offload::None),
            ],
            Stack::Torchtune | Stack::Litgpt => vec![(Sharding::FsdpFullShard, Offload::None)],
            // Unsloth: one GPU or plain data parallel.
            Stack::Unsloth => vec![(Sharding::None, Offload::None)],
            // MLX: one Mac.
            Stack::Mlx => vec![],
        };
        if nodes > 1 && matches!(stack, Stack::Hf | Stack::Trl) {
            v.push((Sharding::FsdpHybridShard, Offload::None));
        }
        if c.offload {
            match stack {
                Stack::Hf | Stack::Trl => v.extend([
                    (Sharding::Zero2, Offload::Optimizer),
                    (Sharding::Zero3, Offload::Optimizer),
                    (Sharding::Zero3, Offload::OptimizerAndParams),
                    (Sharding::FsdpFullShard, Offload::OptimizerAndParams),
                ]),
                Stack::Torchtune => v.push((Sharding::FsdpFullShard, Offload::OptimizerAndParams)),
                Stack::Litgpt | Stack::Unsloth | Stack::Mlx => {}
            }
        }
        for (sharding, offload) in v {
            out.push(Layout {
                gpus,
                nodes,
                sharding,
                offload,
            });
        }
    }
    out
}

/// Whether the search may turn Liger's kernels on: transformers' modules (the hf and trl
/// stacks) and a model type liger-kernel 0.8.5 patches, of those these tests search
/// (`liger_kernel/transformers/monkey_patch.py` `MODEL_TYPE_TO_APPLY_LIGER_FN`: llama,
/// mistral, qwen2 and gemma2 are there, phi is not).
fn liger_by_hand(model_type: &str, stack: Stack, dev: &Device) -> bool {
    // Triton, which Liger's kernels are, does not run on Apple GPUs.
    dev.vendor != moro_core::hardware::Vendor::Apple
        && matches!(stack, Stack::Hf | Stack::Trl)
        && matches!(model_type, "llama" | "mistral" | "qwen2" | "gemma2")
}

/// The whole space of issue 3 §2 and issue 6 §3, enumerated by hand.
fn brute_configs(
    dev: &Device,
    methods: &[Method],
    seq_lens: &[u64],
    effective_batch: u64,
    layouts: &[Layout],
    ligers: &[bool],
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
                        // bitsandbytes (8-bit states) does not run on Apple GPUs.
                        let apple = dev.vendor == moro_core::hardware::Vendor::Apple;
                        for optimizer in [
                            Optimizer::AdamwTorchFused,
                            Optimizer::Adamw8bit,
                            Optimizer::PagedAdamw8bit,
                        ]
                        .into_iter()
                        .filter(|o| !apple || *o == Optimizer::AdamwTorchFused)
                        {
                            for &attention in attentions {
                                for &layout in layouts {
                                    // Each GPU's share of the global batch, rounded up.
                                    let share = effective_batch.div_ceil(layout.gpus).max(1);
                                    let mut b = 1;
                                    while b <= share {
                                        if share.is_multiple_of(b) {
                                            for &liger in ligers {
                                                out.push(Config {
                                                    method,
                                                    targets,
                                                    rank,
                                                    precision,
                                                    gradient_checkpointing,
                                                    optimizer,
                                                    attention,
                                                    liger,
                                                    seq_len,
                                                    micro_batch: b,
                                                    layout,
                                                });
                                            }
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
    }
    out
}

/// Whether the job's layers are traced op by op (its replay alone sets the reserve).
fn op_by_op(
    spec: &ModelSpec,
    job: &moro_core::job::Job,
    est: &moro_core::estimate::Estimate,
) -> bool {
    moro_core::estimate::trace::step::op_by_op(spec, job, &est.regime)
}

/// Fit by the documented rule, computed from the raw estimate: the device peak plus the
/// bound's rise over it (`data/error_model.json`), at least 512 MiB.
fn fits(spec: &ModelSpec, space: &Space, caps: &Caps, c: &Config) -> Option<u64> {
    let job = space.job(c);
    // The estimate without the replayed steps is a lower bound where the replay only raises
    // the reserve: what it rules out, the full estimate rules out too. Where the layers are
    // traced op by op the replay is the whole reserve: the trace read without it is the
    // floor (`tests/replay.rs`), and the margin is at least 512 MiB.
    let mut bound = estimate_without_replay(spec, &job, &caps.profile).ok()?;
    let least_margin = if op_by_op(spec, &job, &bound) {
        let step = replayed_step_floor(&bound, spec, &job, &caps.profile);
        add_replayed_step(&mut bound, &caps.profile, step.as_ref());
        512 * MIB
    } else {
        margin_bytes(&bound, &job)
    };
    if bound.peak_device_bytes + least_margin > caps.usable_bytes {
        return None;
    }
    let est = estimate(spec, &job, &caps.profile).ok()?;
    let peak = est.peak_device_bytes;
    let class = JobClass::of(&job);
    let band = |level| Table::builtin().band(level, class).upper_permille as f64 / 1000.0;
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let upper = [
        (est.peak_allocated_bytes, Metric::Allocated),
        (est.peak_reserved_bytes, Metric::Reserved),
        (peak, Metric::Device),
    ]
    .map(|(b, l)| (b as f64 * (1.0 + band(l))) as u64)
    .into_iter()
    .max()
    .unwrap();
    let margin = upper.saturating_sub(peak).max(512 * MIB);
    // The rule (each level's band, the largest bound, 512 MiB at least) and the library's
    // integer arithmetic agree to a few bytes.
    assert!(margin.abs_diff(margin_bytes(&est, &job)) < 1024);
    (peak + margin <= caps.usable_bytes).then_some(peak)
}

fn check_brute_force(model_id: &str, hw: &str, request: &Request) {
    let spec = model(model_id);
    let dev = device(hw);
    let caps = Caps::of_device(&dev);
    let space = Space::new(&spec, request, &caps).unwrap();
    let out = search(&spec, &space, &caps);
    // On several threads the search estimates ahead of its order and reads the results in
    // it: the same outcome, down to the configurations counted.
    let mut threaded = space.clone();
    threaded.workers = 3;
    assert_eq!(
        search(&spec, &threaded, &caps),
        out,
        "{model_id} on {hw}, 3 workers"
    );
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
    let methods: Vec<Method> = match request.method {
        MethodChoice::Auto => vec![Method::Full, Method::Adapters, Method::QuantizedAdapters],
        MethodChoice::Only(m) => vec![m],
    }
    .into_iter()
    // 4-bit bases need bitsandbytes, which does not run on Apple GPUs.
    .filter(|m| dev.vendor != moro_core::hardware::Vendor::Apple || *m != Method::QuantizedAdapters)
    .collect();
    let layouts = brute_layouts(request.cluster, request.stack);
    let ligers: &[bool] = if liger_by_hand(&spec.model_type, request.stack, &dev) {
        &[false, true]
    } else {
        &[false]
    };
    let all = brute_configs(&dev, &methods, &seq_lens, eb, &layouts, ligers);
    assert_eq!(
        all.len(),
        moro_core::search::all_configs(&space).len(),
        "{model_id} on {hw}: space size"
    );
    assert_eq!(
        all.len() as u64,
        space.size(),
        "{model_id} on {hw}: counted"
    );
    // The best fitting configuration: visited best first, the first that fits (the stable
    // sort keeps the enumeration's order among equals, as keeping only a strictly better
    // one in that order would).
    let mut ranked: Vec<&Config> = all.iter().collect();
    ranked.sort_by(|a, b| cmp(b, a));
    let best = ranked
        .into_iter()
        .find(|c| fits(&spec, &space, &caps, c).is_some())
        .copied();
    let mut min_peak = u64::MAX;
    for c in &all {
        // Exact minimum: the full estimate's device level is never more than 3 % under the
        // bound's (the step trace can lower the allocated level a little), so a
        // configuration whose bound is not within that of the minimum cannot be below it;
        // a job traced op by op is estimated in full (its replay is its whole reserve) where
        // the minimum is read: when nothing fits.
        if let Ok(bound) = estimate_without_replay(&spec, &space.job(c), &caps.profile)
            && let exact = op_by_op(&spec, &space.job(c), &bound)
            && if exact {
                best.is_none()
            } else {
                bound.peak_device_bytes / 100 * 97 < min_peak
            }
            && let Ok(est) = estimate(&spec, &space.job(c), &caps.profile)
        {
            assert!(
                exact || est.peak_device_bytes >= bound.peak_device_bytes / 100 * 97,
                "{model_id} on {hw}: {c:?} estimated {} under its bound {}",
                est.peak_device_bytes,
                bound.peak_device_bytes
            );
            min_peak = min_peak.min(est.peak_device_bytes);
        }
    }
    // The cheap pre-check `moro fit` uses agrees with the brute force on whether anything fits.
    assert_eq!(
        moro_core::search::can_fit(&spec, &space, &caps),
        best.is_some(),
        "{model_id} on {hw}: can_fit"
    );
    match (&out.best, best) {
        (Some(got), Some(want)) => {
            assert!(got.fits());
            assert!(fits(&spec, &space, &caps, &got.config).is_some());
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
            // The search for the best alone (`moro fit`, `moro tiers`) stops sooner and
            // finds the same.
            let best = search_best(&spec, &space, &caps, None).expect("the best fits");
            assert_eq!(best.config, got.config, "{model_id} on {hw}");
        }
        (None, None) => {
            assert!(search_best(&spec, &space, &caps, None).is_none());
            let c = out
                .closest
                .as_ref()
                .expect("closest configuration when nothing fits");
            assert!(!c.fits());
            // The search ranks what does not fit without the step trace, which moves a
            // device level by at most 3 %: the closest is the smallest in full within that.
            let got = c.estimate.peak_device_bytes;
            assert!(
                got >= min_peak && got - min_peak <= min_peak / 100 * 3,
                "{model_id} on {hw}: closest {got}, smallest {min_peak}"
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
            MethodChoice::Only(Method::Adapters),
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
            MethodChoice::Only(Method::QuantizedAdapters),
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

fn cluster(nodes: u64, gpus_per_node: u64) -> Option<Cluster> {
    Some(Cluster {
        nodes,
        gpus_per_node,
        exact: false,
        offload: true,
    })
}

/// Several GPUs: the count and the strategy are searched with the other knobs; brute force
/// over every layout agrees.
#[test]
fn no_fitting_configuration_beats_the_choice_multi_gpu() {
    let full = MethodChoice::Only(Method::Full);
    let cases: [(&str, &str, Option<Cluster>, MethodChoice, Stack); 8] = [
        // 7B full fine-tuning on a node of A100s; on two.
        (
            "Qwen/Qwen2.5-7B",
            "a100-sxm4-80gb",
            cluster(1, 8),
            full,
            Stack::Hf,
        ),
        (
            "Qwen/Qwen2.5-7B",
            "a100-sxm4-80gb",
            cluster(1, 2),
            full,
            Stack::Hf,
        ),
        // 70B full fine-tuning: a node of H100s (offload), two nodes (hybrid / across).
        (
            "meta-llama/Llama-3.1-70B-Instruct",
            "h100-sxm",
            cluster(1, 8),
            full,
            Stack::Hf,
        ),
        (
            "meta-llama/Llama-3.1-70B-Instruct",
            "h100-sxm",
            cluster(2, 8),
            full,
            Stack::Trl,
        ),
        // Exactly 16 GPUs without offload, as `moro fit` asks.
        (
            "meta-llama/Llama-3.1-70B-Instruct",
            "h100-sxm",
            Some(Cluster {
                nodes: 2,
                gpus_per_node: 8,
                exact: true,
                offload: false,
            }),
            full,
            Stack::Hf,
        ),
        // QLoRA of a 32B on four 24 GB cards; other stacks.
        (
            "Qwen/Qwen2.5-32B",
            "rtx-4090",
            cluster(1, 4),
            MethodChoice::Only(Method::QuantizedAdapters),
            Stack::Hf,
        ),
        (
            "Qwen/Qwen2.5-7B",
            "rtx-4090",
            cluster(1, 4),
            full,
            Stack::Torchtune,
        ),
        (
            "Qwen/Qwen2.5-7B",
            "rtx-4090",
            cluster(1, 8),
            full,
            Stack::Litgpt,
        ),
    ];
    for (m, hw, cluster, method, stack) in cases {
        for objective in [Objective::Quality, Objective::Speed] {
            check_brute_force(
                m,
                hw,
                &Request {
                    method,
                    seq_len: Some(4096),
                    stack,
                    cluster,
                    objective,
                    ..Request::default()
                },
            );
        }
    }
    // Method auto (full, LoRA and QLoRA) on two GPUs, the sequence length free.
    check_brute_force(
        "Qwen/Qwen2.5-1.5B",
        "rtx-3060-12gb",
        &Request {
            cluster: cluster(1, 2),
            effective_batch: Some(8),
            ..Request::default()
        },
    );
}

#[test]
fn layouts_follow_the_cluster_and_the_stack() {
    let req = |c: Option<Cluster>, stack| Request {
        cluster: c,
        stack,
        ..Request::default()
    };
    // One node of 8: counts 1, 2, 4, 8; no hybrid (it needs several nodes).
    let l = moro_core::search::layouts(&req(cluster(1, 8), Stack::Hf));
    let counts: std::collections::BTreeSet<u64> = l.iter().map(|x| x.gpus).collect();
    assert_eq!(counts.into_iter().collect::<Vec<_>>(), [1, 2, 4, 8]);
    assert!(l.iter().all(|x| x.sharding != Sharding::FsdpHybridShard));
    assert!(l.contains(&Layout::SINGLE));
    assert_eq!(
        (l[0].gpus, l[0].sharding),
        (8, Sharding::None),
        "DDP over every GPU first"
    );
    assert!(l.windows(2).all(|w| w[0].comm_cost() <= w[1].comm_cost()));
    // Two nodes: 16 GPUs, hybrid shard only across nodes, full shard across costs more.
    let l = moro_core::search::layouts(&req(cluster(2, 8), Stack::Hf));
    assert!(l.iter().any(|x| x.gpus == 16));
    assert!(
        l.iter()
            .filter(|x| x.sharding == Sharding::FsdpHybridShard)
            .all(|x| x.nodes == 2)
    );
    let cost = |s, g| {
        l.iter()
            .find(|x| x.sharding == s && x.gpus == g && x.offload == Offload::None)
            .unwrap()
            .comm_cost()
    };
    assert!(cost(Sharding::FsdpHybridShard, 16) < cost(Sharding::FsdpFullShard, 16));
    assert_eq!(cost(Sharding::FsdpFullShard, 8), cost(Sharding::Zero3, 8));
    assert!(cost(Sharding::None, 16) < cost(Sharding::Zero1, 16));
    // Offload only when allowed, and last.
    let no = Cluster {
        offload: false,
        ..cluster(1, 8).unwrap()
    };
    let l = moro_core::search::layouts(&req(Some(no), Stack::Hf));
    assert!(l.iter().all(|x| x.offload == Offload::None));
    // torchtune and litgpt shard with FSDP only.
    for stack in [Stack::Torchtune, Stack::Litgpt] {
        let l = moro_core::search::layouts(&req(cluster(1, 8), stack));
        assert!(
            l.iter()
                .all(|x| x.gpus == 1 || x.sharding == Sharding::FsdpFullShard),
            "{stack:?}"
        );
    }
    // Exactly 16.
    let ex = Cluster {
        exact: true,
        ..cluster(2, 8).unwrap()
    };
    assert!(
        moro_core::search::layouts(&req(Some(ex), Stack::Hf))
            .iter()
            .all(|x| x.gpus == 16)
    );
    // No cluster: the request's fixed layout.
    assert_eq!(
        moro_core::search::layouts(&Request::default()),
        [Layout::SINGLE]
    );
}

/// The effective batch is global: micro batch × accumulation × GPUs.
#[test]
fn effective_batch_is_over_all_gpus() {
    let spec = model("Qwen/Qwen2.5-7B");
    let caps = Caps::of_device(&device("a100-sxm4-80gb"));
    let space = Space::new(
        &spec,
        &Request {
            method: MethodChoice::Only(Method::Full),
            seq_len: Some(2048),
            effective_batch: Some(32),
            cluster: cluster(1, 8),
            ..Request::default()
        },
        &caps,
    )
    .unwrap();
    for c in moro_core::search::all_configs(&space) {
        let job = space.job(&c);
        assert_eq!(
            job.micro_batch_size * job.grad_accum * job.parallel.data_parallel,
            32,
            "{c:?}"
        );
        assert_eq!(job.parallel.gpus(), c.layout.gpus);
        assert_eq!(job.parallel.sharding, c.layout.sharding);
    }
    let out = search(&spec, &space, &caps);
    let best = out.best.unwrap();
    assert!(best.job.parallel.gpus() > 1, "{:?}", best.config.layout);
}

/// The plans of issue 6's closing note, as the engine makes them judged on the upper bound: a
/// 70B full fine-tune does not fit one H100 but fits a node of eight (sharded, never plain
/// DDP), and two nodes of H200s fit it without offload (two nodes of H100s did on the point
/// estimate, 67 GiB per GPU; sharded jobs' bound, +33 %, puts that over 80 GB); 70B QLoRA
/// fits one 80 GB card.
#[test]
fn seventy_b_full_needs_a_sharded_node() {
    let spec = model("meta-llama/Llama-3.1-70B-Instruct");
    let caps = Caps::of_device(&device("h100-sxm"));
    let req = |c: Option<Cluster>, m| Request {
        method: MethodChoice::Only(m),
        seq_len: Some(4096),
        cluster: c,
        ..Request::default()
    };
    let run = |r: &Request| search(&spec, &Space::new(&spec, r, &caps).unwrap(), &caps);
    assert!(run(&req(None, Method::Full)).best.is_none());
    let node = run(&req(cluster(1, 8), Method::Full)).best.unwrap();
    assert_eq!(node.job.parallel.gpus(), 8);
    assert!(matches!(
        node.job.parallel.sharding,
        Sharding::Zero3 | Sharding::FsdpFullShard
    ));
    let h200 = Caps::of_device(&device("h200"));
    let two = search(
        &spec,
        &Space::new(&spec, &req(cluster(2, 8), Method::Full), &h200).unwrap(),
        &h200,
    )
    .best
    .unwrap();
    assert_eq!(two.job.parallel.gpus(), 16);
    assert_eq!(two.job.parallel.offload, Offload::None);
    assert!(run(&req(None, Method::QuantizedAdapters)).best.is_some());
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
    assert_eq!(c.config.method, Method::QuantizedAdapters);
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

/// The bound on each level comes from the most specific cell of the shipped table's JSON
/// (read here on its own) with data for the job's regime; the device bound, which the search
/// judges on, is the largest of the three and at least 512 MiB over the device peak.
#[test]
fn margin_is_the_largest_level_bound() {
    let table: serde_json::Value =
        serde_json::from_str(include_str!("../data/error_model.json")).unwrap();
    let cells = table["cells"].as_array().unwrap();
    let matches = |c: &serde_json::Value, field: &str, want: &str| {
        c[field].is_null() || c[field].as_str() == Some(want)
    };
    let permille = |level: &str| {
        cells
            .iter()
            .filter(|c| c["sharded"] == false && matches(c, "level", level))
            .filter(|c| matches(c, "stack", "hf") && matches(c, "method", "qlora"))
            .max_by_key(|c| {
                [
                    !c["level"].is_null(),
                    !c["stack"].is_null(),
                    !c["method"].is_null(),
                ]
            })
            .unwrap()["upper_permille"]
            .as_u64()
            .unwrap()
    };
    let class = JobClass {
        stack: Stack::Hf,
        method: moro_core::job::Method::QuantizedAdapters,
        sharded: false,
    };
    let (a, r, d) = (13_000 * MIB, 14_000 * MIB, 15_000 * MIB);
    let by_hand = [(a, "allocated"), (r, "reserved"), (d, "device")]
        .map(|(b, l)| b + (b * permille(l)).div_ceil(1000))
        .into_iter()
        .max()
        .unwrap()
        .max(d + 512 * MIB);
    let got = Table::builtin().upper_levels(class, [a, r, d]);
    assert!(
        got.device.abs_diff(by_hand) <= 2,
        "{} vs {by_hand}",
        got.device
    );
    // A small job keeps the 512 MiB floor.
    let small = Table::builtin().upper_levels(class, [MIB, MIB, MIB]);
    assert_eq!(small.device, MIB + 512 * MIB);
}

/// A pre-quantized checkpoint (Unsloth's `*-bnb-4bit`) is searched as QLoRA over its own
/// storage; a full fine-tune of it is refused.
#[test]
fn prequantized_checkpoints_search_qlora_only() {
    use moro_core::job::Quantization;
    let m = moro_core::catalog::load(
        moro_core::catalog::find("unsloth/llama-3-8b-bnb-4bit").expect("in the catalog"),
    )
    .expect("parses");
    let caps = Caps::of_device(&device("rtx-4090"));
    let space = Space::new(&m, &Request::default(), &caps).expect("space");
    assert_eq!(space.methods, vec![Method::QuantizedAdapters]);
    let best = search(&m, &space, &caps).best.expect("fits a 4090");
    assert_eq!(best.job.quantization, Quantization::Nf4Dq);
    let full = Request {
        method: MethodChoice::Only(Method::Full),
        ..Request::default()
    };
    assert!(Space::new(&m, &full, &caps).is_err());
}

/// Without bitsandbytes (Apple GPUs) a bitsandbytes checkpoint cannot load: the search says
/// so and points at the base model, rather than suggesting LoRA on it.
#[test]
fn prequantized_checkpoints_on_apple_name_the_reason() {
    let m = moro_core::catalog::load(
        moro_core::catalog::find("unsloth/llama-3-8b-bnb-4bit").expect("in the catalog"),
    )
    .expect("parses");
    let caps = Caps::of_device(&device("apple-m3-max-64gb"));
    let err = Space::new(&m, &Request::default(), &caps).unwrap_err();
    assert!(err.to_string().contains("16-bit base model"), "{err}");
}
