//! moro's predictions against independent figures: published measurements
//! (`validation/measured.jsonl`) and the fake-CUDA oracle's allocation traces
//! (`validation/oracle.jsonl`, converted by `validation/oracle_to_rows.py`).

use moro_core::validation::{CatalogModels, Report, Status, validate};

fn report(file: &str) -> Report {
    let path = format!("{}/../../validation/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    validate(&text, &CatalogModels, false)
}

/// The text of a file under `validation/` and its rows by id.
fn rows_by_id(file: &str) -> (String, std::collections::HashMap<String, serde_json::Value>) {
    let path = format!("{}/../../validation/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let rows = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| Some((v["id"].as_str()?.to_owned(), v)))
        .collect();
    (text, rows)
}

/// `s` within the bounds: median and p90 of |error|, share under-predicted by more than 5 %.
fn assert_within(s: &moro_core::validation::Stats, median: f64, p90: f64, under: f64) {
    assert!(s.median_abs <= median, "median {}", s.median_abs);
    assert!(s.p90_abs <= p90, "p90 {}", s.p90_abs);
    assert!(s.under_5pct_share <= under, "under {}", s.under_5pct_share);
}

fn print_summary(name: &str, r: &Report) {
    let s = &r.summary;
    eprintln!(
        "{name}: covered {}/{} ({:.0}%), median {:.1}%, p90 {:.1}%, under>5% {:.0}%, oom ok {} missed {}",
        s.covered,
        s.rows,
        s.coverage * 100.0,
        s.overall.median_abs * 100.0,
        s.overall.p90_abs * 100.0,
        s.overall.under_5pct_share * 100.0,
        s.oom_ok,
        s.oom_missed
    );
}

/// The oracle runs the real HF training step on fake tensors: moro's per-op model must
/// reproduce it almost exactly (cuBLAS workspaces, which the oracle cannot see, are the
/// main difference).
#[test]
fn oracle_traces_are_reproduced() {
    let r = report("oracle.jsonl");
    print_summary("oracle", &r);
    let s = &r.summary;
    assert!(s.covered >= 120, "covered {}", s.covered);
    assert_within(&s.overall, 0.01, 0.03, 0.0);
}

/// Regression guard on the published measurements: the figures reached so far must not get
/// worse (coverage 93.0 %, median 2.6 %, p90 9.1 %, under > 5 %: 9.8 %, no OOM row missed).
/// Qwen3's `q_norm`/`k_norm` save fp32 copies of q and k and one `rsqrt` per head: without
/// them moro was 5–12 % under the fake-CUDA traces of Qwen3 LoRA, QLoRA and full fine-tunes
/// without checkpointing (`validation/oracle-traces/qwen3-no-checkpointing.jsonl`, torch 2.15,
/// transformers 5.24). Every one is now within 2 %.
#[test]
fn qwen3_without_checkpointing_matches_its_traces() {
    let r = report("oracle.jsonl");
    let qwen3: Vec<_> = r.rows.iter().filter(|x| x.id.contains("Qwen3")).collect();
    assert!(qwen3.len() >= 12, "{} Qwen3 rows", qwen3.len());
    for row in qwen3 {
        let e = row
            .error
            .unwrap_or_else(|| panic!("{}: {:?}", row.id, row.reason));
        assert!(e.abs() <= 0.02, "{}: {:+.2} %", row.id, e * 100.0);
    }
}

/// litgpt's own LoRA step, traced (`calibration/litgpt_trace.py`: the litgpt source at the
/// commit of each published row, its model, LoRA, AdamW, chunked lm_head and chunked
/// cross-entropy, Fabric's precision plugin, on fake CUDA tensors), for seven published rows
/// (`validation/oracle-litgpt.jsonl`). Every LoRA trace is within 0.35 % of its published
/// measurement. The two QLoRA traces (Llama 2 13B, bitsandbytes 0.41's kept matmul inputs
/// emulated, PagedAdamW's managed states left out) are 1.7 % under theirs: the published
/// runs hold about 0.4 GB the traced step does not, not yet found. moro is never under a trace
/// and at most 2.5 % over it. Found by these traces:
/// litgpt splits Phi-3's fused `gate_up_proj` into `fc_1` and `fc_2`, each with its own LoRA
/// dropout, and `zero_pad`'s `index_copy` saves the adapted q/v slices of GPT-NeoX's fused
/// qkv (moro was 3.0 % and 2.5 % under); and lit-gpt's resource tables were measured with the
/// fp32 RMSNorm of 2023-10-24, not the commit they name (the Llama 2 7B row).
#[test]
fn litgpt_steps_match_their_traces() {
    let r = report("oracle-litgpt.jsonl");
    print_summary("oracle, litgpt", &r);
    assert!(r.rows.len() >= 9, "{} rows", r.rows.len());
    for row in &r.rows {
        let e = row
            .error
            .unwrap_or_else(|| panic!("{}: {:?}", row.id, row.reason));
        assert!(
            (-0.01..=0.025).contains(&e),
            "{}: {:+.2} %",
            row.id,
            e * 100.0
        );
    }
    // The traces themselves against the published figures they reproduce (GB, 10⁹ B).
    let (_, traced) = rows_by_id("oracle-litgpt.jsonl");
    let (_, published) = rows_by_id("measured.jsonl");
    for (id, t) in &traced {
        let p = &published[id.strip_prefix("oracle-").unwrap()];
        assert_eq!(p["measured_unit"], "GB", "{id}");
        let below = if p["method"] == "qlora" { 0.02 } else { 0.0035 };
        let (t, p) = (
            t["measured_value"].as_f64().unwrap(),
            p["measured_value"].as_f64().unwrap() * 1e9,
        );
        assert!(
            (-below..=0.0035).contains(&(t / p - 1.0)),
            "{id}: traced {t}, published {p}"
        );
    }
}

/// Sharded jobs, rank by rank: `calibration/shard_trace.py` runs one process as rank r of a
/// fake process group (torch 2.15, transformers 5.24, PEFT 0.21, accelerate 1.15) on fake
/// CUDA tensors: FSDP1 as the HF Trainer and accelerate configure it, FSDP2 per layer,
/// FSDP + QLoRA, world sizes 2 and 4 (Llama-3.2-1B also 8), Llama-3.2-1B, Llama-2-7B (cut to
/// fewer layers) and Llama-2-70B QLoRA (4, 8 and 80 layers), and the fms rows' stack under
/// transformers 4.48, `validation/oracle-traces/fsdp-*.jsonl`. Per rank
/// at the allocated level: the median within 3 %, none more than 3 % under or 10 % over. The
/// 70B QLoRA traces are the exception on the high side: the one-GPU QLoRA layer's backward
/// working set is over by about 1.5 GiB at 2 × 4096 tokens and a hidden size of 8192 (the
/// published one-GPU rows of the same model are 5 % over), so those rows are only held to
/// never being under by more than 3 %.
#[test]
fn sharded_rank_traces_are_reproduced() {
    let r = report("oracle-sharded.jsonl");
    print_summary("oracle, sharded", &r);
    assert!(r.summary.covered >= 50, "covered {}", r.summary.covered);
    let mut close = Vec::new();
    for row in &r.rows {
        let e = row
            .error
            .unwrap_or_else(|| panic!("{}: {:?}", row.id, row.reason));
        assert!(e >= -0.03, "{}: {:+.1} %", row.id, e * 100.0);
        if row.id.contains("Llama-2-70b") {
            assert!(e <= 0.30, "{}: {:+.1} %", row.id, e * 100.0);
        } else {
            assert!(e <= 0.10, "{}: {:+.1} %", row.id, e * 100.0);
            close.push(e.abs());
        }
    }
    close.sort_by(f64::total_cmp);
    let median = close[close.len() / 2];
    assert!(median <= 0.03, "median {median}");
}

/// A rank whose script put the whole model on its GPU before wrapping it ("gpu loading" in
/// the row's sharding) holds at least that load: Llama-2-70B QLoRA on two ranks peaks there
/// in its trace (34.71 GiB), above its training step. The row is read against the larger of
/// moro's step and its whole-model load (33.99 GiB, −2.1 %), which the CLI prints apart.
#[test]
fn gpu_loading_rows_are_read_against_the_whole_model_load() {
    let (text, _) = rows_by_id("oracle-sharded.jsonl");
    let id = "oracle-meta-llama--Llama-2-70b-hf-fsdp1-hf-qlora-w2-r0-b2s4096-ckpt-load-gpu-w2-r0";
    let est = moro_core::validation::explain(&text, &CatalogModels, id)
        .expect("explained")
        .estimate;
    let load = est.rank.as_ref().expect("a rank").whole_model_load;
    assert!(
        load > est.peak_allocated_bytes,
        "{load} {}",
        est.peak_allocated_bytes
    );
    let r = validate(&text, &CatalogModels, false);
    let row = r.rows.iter().find(|x| x.id == id).expect("row");
    assert_eq!(row.predicted_bytes, Some(load));
    let e = row.error.expect("compared");
    assert!((-0.03..=0.0).contains(&e), "{e:+.3}");
}

/// The published fms-acceleration FSDP rows ran transformers 4.48, where a reentrant
/// checkpoint wraps each FSDP unit and FSDP1's reshard-only hooks keep every finished
/// layer's checkpoint and input gradient to the end of backward
/// (`estimate::parallel::fsdp1_holds_recomputed_inputs`). Their rank traces under 4.48
/// (`validation/oracle-traces/fsdp-transformers-4.48.jsonl`): the whole-model PEFT ranks
/// within 3 % (Llama-2-70B QLoRA on 2 ranks: 43.68 GiB traced, the published run 43.48); a
/// full fine-tune, whose flat parameters require grad, holds nothing and is not under.
#[test]
fn fsdp1_on_transformers_4_48_holds_recomputed_inputs() {
    let r = report("oracle-sharded.jsonl");
    let rows: Vec<_> = r.rows.iter().filter(|x| x.id.contains("tf4.48")).collect();
    assert!(rows.len() >= 6, "{} rows", rows.len());
    for row in rows {
        let e = row
            .error
            .unwrap_or_else(|| panic!("{}: {:?}", row.id, row.reason));
        assert!(e >= -0.03, "{}: {:+.1} %", row.id, e * 100.0);
        if !row.id.contains("-L8-") {
            assert!(e <= 0.03, "{}: {:+.1} %", row.id, e * 100.0);
        }
    }
}

#[test]
fn measured_rows_do_not_regress() {
    let r = report("measured.jsonl");
    print_summary("measured", &r);
    let s = &r.summary;
    assert!(s.coverage >= 0.92, "coverage {}", s.coverage);
    assert_within(&s.overall, 0.03, 0.10, 0.10);
    // Every OOM row moro covers is predicted not to fit.
    assert_eq!(s.oom_missed, 0, "oom missed {}", s.oom_missed);
}

/// The bar of issue 2 §7, first part: ≥ 85 % of high/medium rows covered, median |error|
/// ≤ 6 %, p90 ≤ 15 %.
#[test]
fn measured_rows_meet_coverage_median_and_p90() {
    let r = report("measured.jsonl");
    let s = &r.summary;
    assert!(s.coverage >= 0.85, "coverage {}", s.coverage);
    assert!(
        s.overall.median_abs <= 0.06,
        "median {}",
        s.overall.median_abs
    );
    assert!(s.overall.p90_abs <= 0.15, "p90 {}", s.overall.p90_abs);
}

/// The bar of issue 2 §7, second part: at most 10 % of rows under-predicted by more than 5 %
/// (9.8 %: 17 of 173 rows).
#[test]
fn measured_rows_meet_the_under_prediction_bar() {
    let r = report("measured.jsonl");
    print_summary("measured", &r);
    let s = &r.summary;
    assert!(
        s.overall.under_5pct_share <= 0.10,
        "under {}",
        s.overall.under_5pct_share
    );
}

/// Every row is either predicted or skipped with a reason; no row is silently dropped.
#[test]
fn every_row_is_accounted_for() {
    let r = report("measured.jsonl");
    for row in &r.rows {
        if row.status == Status::Skipped {
            assert!(
                row.reason.as_deref().is_some_and(|s| !s.is_empty()),
                "{}",
                row.id
            );
        } else {
            assert!(row.predicted_bytes.is_some(), "{}", row.id);
        }
    }
}

/// Issue 6: the multi-GPU and sharded rows (more than one GPU, a ZeRO / FSDP strategy, or
/// tensor-parallel inference). Guard on the figures reached (53 rows: median 3.2 %,
/// p90 8.2 %, under > 5 %: 8 %; 55 rows before two torchtune README rows were marked low
/// confidence, and before FSDP1's held layer inputs and the fms rows' double quantization
/// were modelled: 4.7 %, 19.6 %, 16 %).
#[test]
fn multi_gpu_rows_do_not_regress() {
    let (text, rows) = rows_by_id("measured.jsonl");
    let multi: std::collections::HashSet<&String> = rows
        .iter()
        .filter(|(_, v)| {
            let gpus = v["num_gpus"].as_u64().unwrap_or(1);
            let sharded = v["sharding"].as_str().is_some_and(|s| !s.is_empty());
            let tp = v["inference"]["tensor_parallel"].as_u64().unwrap_or(1);
            gpus > 1 || sharded || tp > 1
        })
        .map(|(id, _)| id)
        .collect();
    let r = validate(&text, &CatalogModels, false);
    let errors: Vec<f64> = r
        .rows
        .iter()
        .filter(|row| row.status == Status::Ok && multi.contains(&row.id))
        .filter_map(|row| row.error)
        .collect();
    let s = moro_core::validation::stats(&errors);
    eprintln!(
        "multi-GPU: {} rows, median {:.1}%, p90 {:.1}%, under>5% {:.0}%",
        s.n,
        s.median_abs * 100.0,
        s.p90_abs * 100.0,
        s.under_5pct_share * 100.0
    );
    assert!(s.n >= 50, "rows {}", s.n);
    assert_within(&s, 0.04, 0.12, 0.09);
}

/// Qwen2.5-1.5B's full fine-tune on the H200 (foreach AdamW): the real step's own sequence
/// (torch 2.15 on fake tensors), replayed with the two cuBLAS workspaces where the GPU makes
/// them, reserves 5.4 % under the measurement (torch 2.11), and moro's trace, which follows
/// that sequence (`step_trace.rs`), as much.
const ON_AN_EDGE: &str = "moro-cal-8f7aee3b3a";

/// Real GPU measurements moro never saw while it was built: `calibration/harness.py` on an
/// NVIDIA H200 (torch 2.11, transformers 5.17, PEFT 0.21, bitsandbytes 0.50.2), 37 jobs at
/// three levels each (`validation/h200/`). Every job's allocated peak is within a few percent
/// (8-bit AdamW's full fine-tune is the widest, +7.7 %, over); LoRA, QLoRA and inference jobs
/// do not come in more than 6.5 % under at any level. Full fine-tunes' reserve comes from the
/// replayed steps (`estimate::replay`): no job is more than 3.2 % under at any level but
/// [`ON_AN_EDGE`]'s reserved and device levels, 5.4 and 4.5 % (the ratio model before it was up
/// to 15.5 % under).
#[test]
fn h200_measurements_are_reproduced() {
    let (text, rows) = rows_by_id("h200/measured.jsonl");
    let r = validate(&text, &CatalogModels, false);
    print_summary("h200", &r);
    let s = &r.summary;
    assert_eq!(s.covered, s.rows, "every H200 row is predicted");
    assert!(s.rows >= 100, "rows {}", s.rows);
    assert_within(&s.overall, 0.01, 0.04, 0.02);
    let (mut allocated, mut not_full) = (0, 0);
    for row in &r.rows {
        let v = &rows[&row.id];
        let e = row.error.unwrap();
        if v["level"].as_str() == Some("allocated") {
            assert!((-0.01..=0.08).contains(&e), "{} {e}", row.id);
            allocated += 1;
        }
        if v["method"].as_str() != Some("full") {
            assert!(e >= -0.065, "{} {e}", row.id);
            not_full += 1;
        } else if row.id.starts_with(ON_AN_EDGE) {
            assert!(e >= -0.06, "{} {e}", row.id);
        } else {
            assert!(e >= -0.035, "{} {e}", row.id);
        }
    }
    assert_eq!(allocated, 37);
    assert!(not_full >= 80, "checked {not_full}");
}

/// Settings measured on the H200 on 2026-12-04 (`validation/h200/settings.jsonl`, harness v4,
/// liger-kernel 0.8.5): Liger's kernels (`use_liger_kernel=True`) on Llama-3.1-8B LoRA with
/// and without checkpointing and at micro-batch 2, on a tied Llama-3.2-1B full fine-tune and
/// on Qwen2.5-7B LoRA, DoRA, and `torch.compile`. Without Liger's RMSNorm and SwiGLU kernels
/// in the model the 8B LoRA without checkpointing was +10.4 % over (only the fused loss was
/// modelled); the tied full fine-tune +7.1 % (two tied gradient copies where the fused loss
/// leaves one). Compiled, by the traces alone (docs/torch-compile.md): 8B LoRA without
/// checkpointing −1.8 % (eager 31.78 GiB, compiled 26.82), 1B full −1.6 % (compiled 0.49
/// GiB above eager: the logits' gradient kept for the tied embedding's).
#[test]
fn h200_liger_dora_and_compile_rows_are_reproduced() {
    let (text, rows) = rows_by_id("h200/settings.jsonl");
    let r = validate(&text, &CatalogModels, false);
    print_summary("h200 settings", &r);
    let (mut liger_allocated, mut compiled_allocated) = (0, 0);
    for row in &r.rows {
        let v = &rows[&row.id];
        let loss = v["loss_impl"].as_str().unwrap_or("");
        let e = row
            .error
            .unwrap_or_else(|| panic!("{} not predicted", row.id));
        let level = v["level"].as_str().unwrap_or("");
        if level == "allocated" {
            assert!((-0.03..=0.03).contains(&e), "{} {e}", row.id);
            if loss.contains("use_liger_kernel") {
                liger_allocated += 1;
            }
            if v["torch_compile"].as_bool() == Some(true) {
                compiled_allocated += 1;
            }
        } else {
            assert!(e >= -0.06, "{} {e}", row.id);
        }
    }
    assert_eq!(liger_allocated, 5);
    assert_eq!(compiled_allocated, 2);
}

/// The H200's five full fine-tunes of bf16 models without autocast (Llama-3.1-8B with fused
/// and foreach AdamW; Llama-3.2-1B; Qwen2.5-1.5B, whose q, k and v have biases) are traced
/// op by op (`estimate/trace/decoder_layer.rs`) and their reserve is the replay of that trace:
/// each reserved peak within 0.2 % of the measured one (the coarse trace's replay, floored
/// by a ratio of the churning bytes, gave −0.4 to +0.4 %), Qwen2.5-1.5B's but
/// ([`ON_AN_EDGE`]). The 8-bit AdamW run is left out: its harness gave the embedding 8-bit
/// states (the row's notes).
#[test]
fn h200_full_reserve_is_its_replayed_step() {
    let checked = h200_reserved_rows_within(0.002, |v| {
        v["method"] == "full"
            && v["precision"].as_str().unwrap().starts_with("bf16-true")
            && !v["optimizer"].as_str().unwrap().contains("8bit")
            && !v["id"].as_str().unwrap().starts_with(ON_AN_EDGE)
    });
    assert_eq!(checked, 4);
}

/// The H200's QLoRA runs under bf16 autocast (classic QLoRA: NF4 after
/// `prepare_model_for_kbit_training`, fp32 adapters, SDPA) are traced op by op
/// (`estimate/trace/decoder_layer.rs`) and their reserve is the replay of that trace: each
/// reserved peak within 0.6 % of the measured one (the run with bitsandbytes' paged AdamW
/// too, whose large states are managed memory outside the allocator). Their reserve came
/// from a ratio of the churning bytes before: −1.7 to +3.2 % (median |error| 1.0 %).
#[test]
fn h200_qlora_reserve_is_its_replayed_step() {
    let checked = h200_reserved_rows_within(0.006, |v| {
        v["method"] == "qlora" && v["precision"].as_str().unwrap().starts_with("bf16-mixed")
    });
    assert_eq!(checked, 9);
}

/// Asserts each reserved-level row of the H200's measured runs that `pick` picks within
/// `tolerance` of its measurement; returns how many it checked.
fn h200_reserved_rows_within(tolerance: f64, pick: impl Fn(&serde_json::Value) -> bool) -> usize {
    let (text, rows) = rows_by_id("h200/measured.jsonl");
    let r = validate(&text, &CatalogModels, false);
    let mut checked = 0;
    for row in &r.rows {
        let v = &rows[&row.id];
        if v["level"] != "reserved" || !pick(v) {
            continue;
        }
        let e = row.error.unwrap();
        eprintln!("{}: {:+.2} %", row.id, e * 100.0);
        assert!(e.abs() <= tolerance, "{} {e}", row.id);
        checked += 1;
    }
    checked
}
