//! Recipe ⇄ engine Job.

use moro_core::job::{
    Attention, Job, JobError, KvDtype, LossImpl, Method, Offload, Optimizer, Padding, Parallel,
    PeftConfig, PeftKind, Precision, Quantization, Sharding, Stack, Targets, Versions,
};
use moro_recipe::choices::LrScheduler;
use moro_recipe::{Recipe, TrainingExtras, to_yaml};

use crate::{FULL, PRODUCT, ok};

#[test]
fn the_product_example_is_a_qlora_job() {
    let job = ok(PRODUCT).to_job().unwrap();
    assert_eq!(job.method, Method::QuantizedAdapters);
    assert_eq!(job.quantization, Quantization::Nf4);
    assert_eq!(job.adapter.rank, 16);
    assert_eq!(job.adapter.alpha, 32.0);
    assert_eq!(job.adapter.dropout, 0.05);
    assert_eq!(job.adapter.targets, PeftConfig::default().targets);
    assert_eq!(
        (job.micro_batch_size, job.grad_accum, job.seq_len),
        (2, 8, 2048)
    );
    assert_eq!(job.optimizer, Optimizer::Adamw8bit);
    assert!(job.gradient_checkpointing);
    assert_eq!(job.parallel, Parallel::single());
}

#[test]
fn omitted_fields_mean_the_engine_defaults() {
    let job = ok("model:\n  base: m\n  method: lora\n").to_job().unwrap();
    assert_eq!(job, Job::default());
}

#[test]
fn every_field_maps() {
    let job = ok(FULL).to_job().unwrap();
    assert_eq!(job.method, Method::Adapters);
    assert_eq!(job.adapter.targets, Targets::AllLinear);
    assert!(job.adapter.dora);
    assert_eq!(
        (job.adapter.rank, job.adapter.alpha, job.adapter.dropout),
        (64, 128.0, 0.0)
    );
    assert_eq!(job.precision, Precision::Bf16);
    assert_eq!(job.attention, Attention::Flash);
    assert_eq!(job.stack, Stack::Trl);
    assert_eq!(job.loss, Some(LossImpl::ChunkedNll));
    assert_eq!(job.padding, Padding::Padded);
    assert_eq!(job.kv_dtype, KvDtype::F16);
    assert_eq!(
        job.parallel,
        Parallel {
            data_parallel: 8,
            tensor_parallel: 2,
            pipeline: 1,
            sharding: Sharding::FsdpFullShard,
            offload: Offload::OptimizerAndParams,
            nodes: 2,
            reduce_bucket: None,
            fsdp: moro_core::job::FsdpApi::Fsdp1,
        }
    );
    assert_eq!(
        job.versions,
        Versions {
            transformers: Some((4, 47)),
            bitsandbytes: Some((0, 43, 1)),
            trl: Some((0, 25)),
            torch: None,
            torchao: None,
            torchtune: None,
            mlx: None,
            peft: None,
        }
    );
    let extras = ok(FULL).extras();
    assert_eq!(extras.lr_scheduler, Some(LrScheduler::Cosine));
    assert_eq!(extras.dataset.as_deref(), Some("tatsu-lab/alpaca"));
}

/// Jobs that differ from the default in every field, one field at a time and all at once.
fn jobs() -> Vec<Job> {
    let d = Job::default();
    let mut v = vec![d.clone()];
    let all = Job {
        method: Method::QuantizedAdapters,
        quantization: Quantization::Fp4Dq,
        adapter: PeftConfig {
            rank: 128,
            alpha: 16.5,
            dropout: 0.1,
            targets: Targets::Names(vec!["q_proj".into(), "yes".into()]),
            dora: true,
            ..PeftConfig::default()
        },
        micro_batch_size: 7,
        seq_len: 16_384,
        grad_accum: 3,
        optimizer: Optimizer::PagedAdamw32bit,
        gradient_checkpointing: true,
        attention: Attention::Eager,
        precision: Precision::Fp16Mixed,
        stack: Stack::Torchtune,
        loss: Some(LossImpl::Fused),
        padding: Padding::Padded,
        parallel: Parallel {
            data_parallel: 4,
            tensor_parallel: 2,
            pipeline: 3,
            sharding: Sharding::Zero3,
            offload: Offload::OptimizerAndParams,
            nodes: 3,
            reduce_bucket: Some(500_000_000),
            fsdp: moro_core::job::FsdpApi::Fsdp1,
        },
        kv_dtype: KvDtype::F8,
        versions: Versions {
            transformers: Some((4, 46)),
            bitsandbytes: Some((0, 42, 0)),
            trl: Some((0, 9)),
            torch: Some((1, 13)),
            torchao: Some((0, 1)),
            torchtune: Some((0, 2)),
            mlx: Some((0, 32, 1)),
            peft: Some((0, 20)),
        },
        optimizer_in_backward: false,
        images: moro_core::vision::Images {
            per_sample: 2,
            width: 1280,
            height: 720,
            pan_and_scan: true,
        },
        vision: moro_core::job::VisionTraining::Adapted,
        liger: moro_core::job::Liger {
            rms_norm: true,
            glu: true,
            ..moro_core::job::Liger::default()
        },
        compile: true,
        activation_offload: true,
        adapted_layers: None,
        target_len: Some(512),
        new_tokens: Some(1000),
    };
    v.push(all);
    // A generation: its prompt and the tokens it generates.
    v.push(Job {
        method: Method::Inference,
        new_tokens: Some(1536),
        ..d.clone()
    });
    // MLX's own settings: its quantized storage and the last layers that train.
    v.push(Job {
        method: Method::QuantizedAdapters,
        quantization: Quantization::Mlx4G32,
        stack: Stack::Mlx,
        adapted_layers: Some(8),
        ..d.clone()
    });
    v.push(Job {
        liger: moro_core::job::Liger::ALL,
        ..d.clone()
    });
    v.push(Job {
        optimizer_in_backward: true,
        ..d.clone()
    });
    for m in Method::ALL {
        let quantization = if m == Method::QuantizedAdapters {
            Quantization::Nf4
        } else {
            Quantization::None
        };
        v.push(Job {
            method: m,
            quantization,
            ..d.clone()
        });
        // Non-default LoRA settings survive on the methods that train adapters.
        if m.is_peft() {
            v.push(Job {
                method: m,
                quantization,
                adapter: PeftConfig {
                    rank: 8,
                    ..PeftConfig::default()
                },
                ..d.clone()
            });
        }
    }
    for q in Quantization::ALL {
        v.push(Job {
            method: Method::Inference,
            quantization: q,
            ..d.clone()
        });
    }
    for o in Optimizer::ALL {
        v.push(Job {
            optimizer: o,
            ..d.clone()
        });
    }
    for p in Precision::ALL {
        v.push(Job {
            precision: p,
            ..d.clone()
        });
    }
    for s in Stack::ALL {
        v.push(Job {
            stack: s,
            loss: Some(LossImpl::Chunked),
            ..d.clone()
        });
    }
    for l in [
        LossImpl::Standard,
        LossImpl::StandardLegacy,
        LossImpl::ChunkedNll,
        LossImpl::Chunked,
        LossImpl::Fused,
    ] {
        v.push(Job {
            loss: Some(l),
            ..d.clone()
        });
    }
    v.push(Job {
        versions: Versions {
            transformers: Some((4, 50)),
            ..Versions::default()
        },
        ..d.clone()
    });
    v.push(Job {
        versions: Versions {
            bitsandbytes: Some((0, 43, 0)),
            trl: Some((1, 7)),
            ..Versions::default()
        },
        ..d.clone()
    });
    for k in [KvDtype::F16, KvDtype::F8, KvDtype::F32] {
        v.push(Job {
            kv_dtype: k,
            ..d.clone()
        });
    }
    for s in [
        Sharding::None,
        Sharding::Zero1,
        Sharding::Zero2,
        Sharding::FsdpShardGradOp,
        Sharding::FsdpHybridShard,
    ] {
        v.push(Job {
            parallel: Parallel {
                data_parallel: 8,
                sharding: s,
                offload: Offload::Optimizer,
                ..Parallel::single()
            },
            ..d.clone()
        });
    }
    v.push(Job {
        parallel: Parallel {
            data_parallel: 16,
            sharding: Sharding::FsdpHybridShard,
            nodes: 2,
            ..Parallel::single()
        },
        ..d.clone()
    });
    v.push(Job {
        adapter: PeftConfig {
            targets: Targets::AllLinear,
            ..PeftConfig::default()
        },
        ..d.clone()
    });
    // Every PEFT method with the settings of its own.
    for peft in PeftKind::ALL.into_iter().filter(|p| !p.is_adapter()) {
        v.push(Job {
            adapter: PeftConfig {
                method: peft,
                rank: 8,
                dora: peft == PeftKind::Lora,
                virtual_tokens: if peft.uses_virtual_tokens() { 64 } else { 20 },
                decompose_factor: (peft == PeftKind::LoKr).then_some(4),
                ..PeftConfig::default()
            },
            ..d.clone()
        });
    }
    v
}

#[test]
fn job_recipe_job_is_the_identity() {
    for job in jobs() {
        let r = Recipe::from_job("t", "Qwen/Qwen2.5-0.5B", &job, TrainingExtras::default());
        assert_eq!(r.to_job().as_ref(), Ok(&job), "{r:#?}");
        // And through the file.
        let y = to_yaml(&r, "");
        let back = ok(&y);
        assert_eq!(back, r, "{y}");
        assert_eq!(back.to_job().as_ref(), Ok(&job), "{y}");
    }
}

/// A full fine-tune or inference job writes no adapter settings (they would be refused when
/// read back: `JobSettings::check_adapters_used`).
#[test]
fn jobs_without_adapters_write_no_adapter_settings() {
    for method in [Method::Full, Method::Inference] {
        let job = Job {
            method,
            adapter: PeftConfig {
                rank: 8,
                ..PeftConfig::default()
            },
            ..Job::default()
        };
        let r = Recipe::from_job("t", "Qwen/Qwen2.5-0.5B", &job, TrainingExtras::default());
        let y = to_yaml(&r, "");
        assert!(!y.contains("lora_") && !y.contains("target_modules"), "{y}");
        assert_eq!(
            r.settings().expect("settings").check_adapters_used(),
            Ok(())
        );
    }
}

#[test]
fn extras_round_trip() {
    let extras = TrainingExtras {
        version: Some("2.0".into()),
        auto_heal: true,
        learning_rate: Some(3e-5),
        num_epochs: Some(1.5),
        warmup_ratio: Some(0.1),
        weight_decay: Some(0.0),
        lr_scheduler: Some(LrScheduler::ConstantWithWarmup),
        dataset: Some("data/train.jsonl".into()),
        output_dir: Some("runs/1".into()),
    };
    let r = Recipe::from_job("n", "m", &Job::default(), extras.clone());
    assert_eq!(r.extras(), extras);
    assert_eq!(ok(&to_yaml(&r, "")).extras(), extras);
}

#[test]
fn single_gpu_jobs_write_no_parallel_section() {
    let r = Recipe::from_job("n", "m", &Job::default(), TrainingExtras::default());
    assert!(r.parallel.is_none());
    assert!(!to_yaml(&r, "").contains("parallel:"));
}

#[test]
fn invalid_recipes_do_not_become_jobs() {
    let mut r = ok(PRODUCT);
    r.training.micro_batch_size = 0;
    let e = r.to_job().unwrap_err();
    assert_eq!(e.field.as_deref(), Some("training.micro_batch_size"));
    assert_eq!(e.line, None, "no text, no position");
}

#[test]
fn engine_errors_point_into_the_file() {
    let text = PRODUCT;
    let err = JobError {
        field: "lora_rank",
        message: "4096 is above the model's hidden size 1536".into(),
    };
    let e = moro_recipe::job_error(&err, Some(text));
    assert_eq!(e.field.as_deref(), Some("model.lora_rank"));
    assert_eq!((e.line, e.column), (Some(6), Some(14)));
    let err = JobError {
        field: "target_modules",
        message: "`x` is not a Linear".into(),
    };
    let e = moro_recipe::job_error(&err, Some(text));
    assert_eq!(
        (e.field.as_deref(), e.line),
        (Some("model.target_modules"), Some(9))
    );
    // An absent field points at its section.
    let err = JobError {
        field: "parallel.data_parallel",
        message: "too many".into(),
    };
    let e = moro_recipe::job_error(&err, Some(text));
    assert_eq!((e.field.as_deref(), e.line), (Some("parallel.gpus"), None));
    let err = JobError {
        field: "max_seq_length",
        message: "x".into(),
    };
    let e = moro_recipe::job_error(&err, Some("model:\n  base: m\ntraining:\n  stack: hf\n"));
    assert_eq!(
        (e.field.as_deref(), e.line),
        (Some("training.max_seq_length"), Some(4))
    );
}

#[test]
fn parallel_nodes_reach_the_job() {
    let job = ok("model:\n  base: m\nparallel:\n  gpus: 16\n  nodes: 2\n  strategy: zero3\n")
        .to_job()
        .unwrap();
    assert_eq!(job.parallel.nodes, 2);
    assert_eq!(job.parallel.gpus(), 16);
    assert_eq!(job.parallel.gpus_per_node(), 8);
    // Missing: one node.
    let job = ok("model:\n  base: m\nparallel:\n  gpus: 8\n  strategy: zero3\n")
        .to_job()
        .unwrap();
    assert_eq!(job.parallel.nodes, 1);
    // A one-node job writes no `nodes:` (recipes written before it existed read the same);
    // a multi-node one does.
    let one = Recipe::from_job("t", "m", &job, TrainingExtras::default());
    assert!(!to_yaml(&one, "").contains("nodes:"));
    let mut two = job;
    two.parallel.data_parallel = 16;
    two.parallel.nodes = 2;
    let y = to_yaml(
        &Recipe::from_job("t", "m", &two, TrainingExtras::default()),
        "",
    );
    assert!(y.contains("\nparallel:\n  gpus: 16\n  nodes: 2\n"), "{y}");
}

#[test]
fn engine_nodes_errors_name_the_field() {
    // A job built outside a recipe (CLI flags) is checked by the engine.
    let model =
        moro_core::catalog::load(moro_core::catalog::find("Qwen/Qwen2.5-0.5B").unwrap()).unwrap();
    let mut job = Job::default();
    job.parallel.data_parallel = 6;
    job.parallel.nodes = 4;
    let e: JobError = job.validate(&model).unwrap_err();
    assert_eq!(e.field, "parallel.nodes");
    assert_eq!(
        moro_recipe::job_error(&e, None).field.as_deref(),
        Some("parallel.nodes")
    );
    job.parallel.nodes = 0;
    assert_eq!(job.validate(&model).unwrap_err().field, "parallel.nodes");
    job.parallel.nodes = 3;
    assert!(job.validate(&model).is_ok());
}

#[test]
fn liger_keys_resolve_and_contradictions_name_the_field() {
    let liger = |training: &str| {
        ok(&format!("model:\n  base: m\ntraining:\n{training}"))
            .to_job()
            .map(|j| j.liger)
    };
    assert_eq!(liger("  liger: true\n"), Ok(moro_core::job::Liger::ALL));
    let some = liger("  liger_kernels: [rms_norm, swiglu]\n").unwrap();
    assert!(some.rms_norm && some.glu && !some.rope && !some.fused_linear_cross_entropy);
    for (training, needle) in [
        ("  liger_kernels: []\n", "names no kernel"),
        (
            "  liger_kernels: [layer_norm]\n",
            "`layer_norm` is not a Liger kernel",
        ),
        (
            "  liger: true\n  liger_kernels: [rope]\n",
            "while `liger: true` asks for all",
        ),
    ] {
        let e = liger(training).unwrap_err().to_string();
        assert!(
            e.contains("training.liger_kernels") && e.contains(needle),
            "{e}"
        );
    }
}

#[test]
fn the_fsdp_version_reaches_the_job_and_is_written_only_when_not_the_stacks() {
    use moro_core::job::FsdpApi;
    let fsdp = "model:\n  base: m\nparallel:\n  gpus: 4\n  strategy: fsdp_full_shard\n";
    // Unsaid: the stack's (accelerate's default for hf; torchtune's `fully_shard`).
    let hf = ok(fsdp).to_job().unwrap();
    assert_eq!(hf.parallel.fsdp, FsdpApi::Fsdp1);
    let tt = ok(&fsdp.replace("parallel:", "training:\n  stack: torchtune\nparallel:"))
        .to_job()
        .unwrap();
    assert_eq!(tt.parallel.fsdp, FsdpApi::Fsdp2);
    let two = ok(&format!("{fsdp}  fsdp_version: 2\n")).to_job().unwrap();
    assert_eq!(two.parallel.fsdp, FsdpApi::Fsdp2);
    // Written back only where it is not the stack's default.
    let y = |job: &Job| {
        to_yaml(
            &Recipe::from_job("t", "m", job, TrainingExtras::default()),
            "",
        )
    };
    assert!(!y(&hf).contains("fsdp_version"));
    assert!(!y(&tt).contains("fsdp_version"));
    assert!(y(&two).contains("  fsdp_version: 2\n"), "{}", y(&two));
    // Not 1 or 2, or not an FSDP strategy: refused by name.
    assert_eq!(
        crate::err(&format!("{fsdp}  fsdp_version: 3\n"))
            .field
            .as_deref(),
        Some("parallel.fsdp_version")
    );
    assert_eq!(
        crate::err(
            "model:\n  base: m\nparallel:\n  gpus: 4\n  strategy: zero3\n  fsdp_version: 2\n"
        )
        .field
        .as_deref(),
        Some("parallel.fsdp_version")
    );
}
