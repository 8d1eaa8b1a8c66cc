//! Encoder-decoder models (T5, FLAN-T5, mT5): parameter counts against transformers, one
//! block's saved tensors by hand, and whole training steps against the fake-CUDA oracle's
//! traces (`calibration/seq2seq_trace.py`: transformers 5.25, torch 2.15, PEFT 0.21.2, the
//! model built with `AutoModelForSeq2SeqLM.from_config` and fed `--seq` encoder tokens and
//! `--target-len` labels: `validation/oracle-traces/seq2seq.jsonl`).

use moro_core::arch::parse_config;
use moro_core::estimate::activations::Activations;
use moro_core::estimate::regime::Regime;
mod support;

use moro_core::estimate::{DeviceProfile, estimate};
use moro_core::job::{Attention, Job, Method, Optimizer, Precision, Stack};
use moro_core::model::ModelSpec;
use serde_json::{Value, json};
use support::{Peaks, oracle_device, seq2seq_generation, seq2seq_settings};

const TRACES: &str = include_str!("../../../validation/oracle-traces/seq2seq.jsonl");

fn spec(cfg: &Value) -> ModelSpec {
    parse_config(cfg.to_string().as_bytes()).expect("parses")
}

fn config_file(name: &str) -> Value {
    let dir = env!("CARGO_MANIFEST_DIR");
    let text = std::fs::read_to_string(format!("{dir}/../../validation/seq2seq-configs/{name}"))
        .expect("config");
    serde_json::from_str(&text).expect("json")
}

/// Parameter counts of the released shapes, as transformers 5.25 builds them
/// (`T5ForConditionalGeneration` / `MT5ForConditionalGeneration` on the meta device:
/// `from_config` ties lm_head to `shared`; `from_pretrained` keeps the checkpoint's own
/// lm_head where the config says `tie_word_embeddings: false`, V · d more). t5-small's
/// 60,506,624 and FLAN-T5-base's 247,577,856 are also the Hub's published counts.
#[test]
fn parameter_counts_are_transformers() {
    let t5 = |d: u64, ff: u64, heads: u64, layers: u64, proj: &str, tie: Option<bool>| {
        let mut c = json!({"model_type": "t5", "d_model": d, "d_ff": ff, "d_kv": 64,
            "num_heads": heads, "num_layers": layers, "vocab_size": 32128,
            "feed_forward_proj": proj});
        if let Some(t) = tie {
            c["tie_word_embeddings"] = t.into();
        }
        spec(&c).total_params()
    };
    // T5 v1.0 (tied): transformers' count as it is.
    assert_eq!(t5(512, 2048, 8, 6, "relu", None), 60_506_624);
    assert_eq!(t5(768, 3072, 12, 12, "relu", None), 222_903_552);
    // FLAN-T5 (untied): transformers' tied count plus 32,128 · d.
    assert_eq!(
        t5(768, 2048, 12, 12, "gated-gelu", Some(false)),
        222_903_552 + 32_128 * 768
    );
    assert_eq!(
        t5(2048, 5120, 32, 24, "gated-gelu", Some(false)),
        2_783_959_040 + 32_128 * 2048
    );
    assert_eq!(
        t5(4096, 10240, 64, 24, "gated-gelu", Some(false)),
        11_003_736_064 + 32_128 * 4096
    );
    // mT0-xxl (mT5-xxl shape): 250,112 rows, untied.
    let mt0 = spec(
        &json!({"model_type": "mt5", "d_model": 4096, "d_ff": 10240, "d_kv": 64,
        "num_heads": 64, "num_layers": 24, "tie_word_embeddings": false}),
    );
    assert_eq!(mt0.total_params(), 11_896_598_528 + 250_112 * 4096);
    // An unequal decoder (`num_decoder_layers`) counts its own blocks.
    let deep = spec(&json!({"model_type": "t5", "num_layers": 6, "num_decoder_layers": 7}));
    let block = 8 * 512 * 512 + 2 * 512 * 2048 + 3 * 512;
    assert_eq!(deep.total_params(), 60_506_624 + block);
}

fn job(method: Method, precision: Precision, b: u64, s: u64, t: u64) -> Job {
    Job {
        method,
        precision,
        micro_batch_size: b,
        seq_len: s,
        target_len: Some(t),
        optimizer: Optimizer::AdamwTorch,
        attention: Attention::Sdpa,
        stack: Stack::Hf,
        gradient_checkpointing: false,
        ..Job::default()
    }
}

/// One t5-small encoder block of a full bf16 fine-tune, by hand (h = n = 512, f = 2048, 8
/// heads, dropout on): two norms' fp32 copies, `rsqrt`s and 16-bit copies kept for their
/// weights (2 · (6h + 4)); the two residual sums and dropout masks (2 · 3h); the norms'
/// outputs the Linears keep (2 · 2h); SDPA's q, k, v, output and log-sum-exp (8n + 4a); the
/// ReLU's output, its dropout's mask and output `wo` keeps (5f): 25,640 bytes a token, and
/// the block's own copy of the 8 × 256 × 256 16-bit position-bias mask. The oracle's block
/// (`--per-block`, batch 4 × 256) keeps 27,304,960 bytes: these and SDPA's two scalar
/// dropout seeds, which its tracker counts as 512 bytes each (its allocation granule).
#[test]
fn one_encoder_block_by_hand() {
    let mut cfg = config_file("t5-small.json");
    let all = |layers: u64, cfg: &mut Value| {
        cfg["num_layers"] = layers.into();
        cfg["num_decoder_layers"] = 6.into();
        let m = spec(cfg);
        let j = job(Method::Full, Precision::Bf16, 4, 256, 64);
        let r = Regime::resolve(&m, &j);
        Activations::new(&m, &j, &r, 1).all_layers()
    };
    let block = all(7, &mut cfg) - all(6, &mut cfg);
    let per_token = 2 * (6 * 512 + 4) + 2 * 3 * 512 + 2 * 2 * 512 + 8 * 512 + 4 * 8 + 5 * 2048;
    assert_eq!(per_token, 25_640);
    assert_eq!(block, per_token * 4 * 256 + 8 * 256 * 256 * 2);
    assert_eq!(block + 2 * 512, 27_304_960);
}

/// Every traced step: moro's allocated peak is never more than 1 % under the oracle's and
/// at most 3 % over (T5 v1.0 and FLAN-T5 shapes; full and LoRA; bf16 and bf16-mixed; with
/// and without checkpointing and a padding mask).
#[test]
fn training_steps_match_their_traces() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for line in TRACES.lines() {
        let t: Value = serde_json::from_str(line).expect("trace");
        let mut cfg = config_file(t["config_name"].as_str().unwrap());
        if t["job"]["untied_lm_head"].as_bool() == Some(true) {
            cfg["tie_word_embeddings"] = false.into();
        }
        let m = spec(&cfg);
        let job = seq2seq_settings(&t).resolve_for(&m).expect("resolves");
        let e = estimate(&m, &job, &oracle_device()).expect("valid job");
        let want = t["measured"]["peak_allocated_bytes"].as_u64().unwrap();
        #[allow(clippy::cast_precision_loss)]
        let err = e.peak_allocated_bytes as f64 / want as f64 - 1.0;
        let label = t["label"].as_str().unwrap();
        eprintln!(
            "{label}: {:+.2} % (moro {} at {}, oracle {want} at {})",
            err * 100.0,
            e.peak_allocated_bytes,
            e.peak_phase.as_str(),
            t["measured"]["peak_at"]["phase"]
        );
        if !(-0.01..=0.03).contains(&err) {
            failures.push(format!("{label}: {:+.2} %", err * 100.0));
        }
        checked += 1;
    }
    assert!(checked >= 10, "{checked} traces");
    assert!(failures.is_empty(), "{failures:?}");
}

/// What is not modelled is refused by name, and the target length belongs to
/// encoder-decoders only.
#[test]
fn unmodelled_settings_are_refused_by_name() {
    let t5 = spec(&config_file("flan-t5-base.json"));
    let field = |j: &Job, m: &ModelSpec| j.validate(m).unwrap_err().field;
    let base = job(Method::Adapters, Precision::Bf16Mixed, 4, 512, 128);
    assert!(base.validate(&t5).is_ok());
    assert_eq!(
        field(
            &Job {
                adapter: moro_core::job::PeftConfig {
                    method: moro_core::job::PeftKind::PrefixTuning,
                    ..moro_core::job::PeftConfig::default()
                },
                ..base.clone()
            },
            &t5
        ),
        "peft"
    );
    assert_eq!(
        field(
            &Job {
                precision: Precision::Fp16Mixed,
                ..base.clone()
            },
            &t5
        ),
        "precision"
    );
    assert_eq!(
        field(
            &Job {
                method: Method::QuantizedAdapters,
                quantization: moro_core::job::Quantization::Nf4Dq,
                ..base.clone()
            },
            &t5
        ),
        "quantization"
    );
    let mut dora = base.clone();
    dora.adapter.dora = true;
    assert_eq!(field(&dora, &t5), "dora");
    assert_eq!(
        field(
            &Job {
                stack: Stack::Trl,
                ..base.clone()
            },
            &t5
        ),
        "stack"
    );
    assert_eq!(
        field(
            &Job {
                attention: Attention::Flash,
                ..base.clone()
            },
            &t5
        ),
        "attention"
    );
    assert_eq!(
        field(
            &Job {
                target_len: Some(0),
                ..base.clone()
            },
            &t5
        ),
        "training.target_len"
    );
    let llama =
        moro_core::catalog::load(moro_core::catalog::find("Qwen/Qwen2.5-0.5B").unwrap()).unwrap();
    assert_eq!(field(&base, &llama), "training.target_len");
}

/// The decoder's tokens are the target's: a longer target grows the estimate, and with no
/// target length the encoder's stands in.
#[test]
fn the_target_length_is_the_decoders() {
    let t5 = spec(&config_file("flan-t5-base.json"));
    let peak = |t: Option<u64>| {
        let j = Job {
            target_len: t,
            ..job(Method::Adapters, Precision::Bf16Mixed, 4, 512, 0)
        };
        estimate(&t5, &j, &DeviceProfile::default())
            .unwrap()
            .peak_allocated_bytes
    };
    assert!(peak(Some(64)) < peak(Some(256)));
    assert_eq!(peak(None), peak(Some(512)));
}

const GENERATE: &str = include_str!("../../../validation/oracle-traces/seq2seq-generate.jsonl");

/// Generation as `generate` runs it (`calibration/seq2seq_trace.py --generate`: the encoder
/// once, then greedy decoder steps with an `EncoderDecoderCache`; bf16 weights): moro's
/// inference estimate is within 1 % of every traced peak, and its encoder phase within 2 %
/// of the traced encoder's.
#[test]
fn generation_matches_its_traces() {
    let model = |t: &Value| {
        let mut cfg = config_file(t["config_name"].as_str().unwrap());
        if t["untied_lm_head"].as_bool() == Some(true) {
            cfg["tie_word_embeddings"] = false.into();
        }
        spec(&cfg)
    };
    let checked = seq2seq_generation(GENERATE, model, 0.01, 0.02);
    assert!(checked >= 5, "{checked} traces");
}

/// A config moro cannot read is an error naming its own key, never a panic or an overflow.
#[test]
fn bad_configs_name_their_field() {
    let field = |cfg: Value| match parse_config(cfg.to_string().as_bytes()) {
        Err(moro_core::arch::ArchError::Field { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        field(json!({"model_type": "t5", "feed_forward_proj": "gated-silu"})),
        "feed_forward_proj"
    );
    assert_eq!(
        field(json!({"model_type": "t5", "num_decoder_layers": 0})),
        "num_decoder_layers"
    );
    assert_eq!(
        field(json!({"model_type": "mt5", "dropout_rate": 1.5})),
        "dropout_rate"
    );
    assert_eq!(
        field(
            json!({"model_type": "t5", "d_model": 262_144, "d_ff": 2_097_152,
            "num_layers": 4096})
        ),
        "num_layers"
    );
}

const UMT5: &str = include_str!("../../../validation/oracle-traces/seq2seq-umt5.jsonl");

/// UMT5 (umt5-small's shape, its own lm_head as the checkpoint has it): counted as
/// transformers 5.25 builds it, a relative position bias in every layer (306,601,984;
/// `UMT5Config()`'s tied defaults 172,122,112), and every traced step (`calibration/
/// seq2seq_trace.py --matrix seq2seq-umt5`) within −1 … +3 %.
#[test]
fn umt5_matches_transformers_and_its_traces() {
    let small = spec(&config_file("umt5-small.json"));
    assert_eq!(small.total_params(), 306_601_984);
    assert_eq!(
        spec(&json!({"model_type": "umt5"})).total_params(),
        172_122_112
    );
    let mut peaks = Peaks::default();
    for line in UMT5.lines() {
        let t: Value = serde_json::from_str(line).expect("trace");
        let job = seq2seq_settings(&t).resolve_for(&small).expect("resolves");
        let e = estimate(&small, &job, &oracle_device()).expect("valid job");
        peaks.check(t["label"].as_str().unwrap(), &e, &t, -0.01..=0.03);
    }
    peaks.finish(4);
}

/// UMT5's generation (`seq2seq_trace.py --generate`, umt5-small's shape, untied): every
/// encoder layer makes its own position bias, one at a time, so the encoder's widest moment
/// is T5's; the peak within 1 % of each trace.
#[test]
fn umt5_generation_matches_its_traces() {
    let traces = include_str!("../../../validation/oracle-traces/seq2seq-umt5-generate.jsonl");
    let m = spec(&config_file("umt5-small.json"));
    assert_eq!(seq2seq_generation(traces, |_| m.clone(), 0.01, 0.02), 2);
}
