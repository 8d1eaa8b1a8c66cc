//! The caching allocator model against the H200: the real training step's allocation
//! sequence, replayed through `moro_core::caching_allocator`, reaches the reserved level the
//! GPU measured.
//!
//! The sequences (`validation/oracle-traces/step-events-h200*.jsonl`,
//! `calibration/step_events.py --matrix-h200`) are every allocation and free of the real
//! Hugging Face step — transformers 5.25, PEFT 0.21.2, bitsandbytes 0.50.2, torch 2.15 —
//! run whole on fake CUDA tensors, with the settings of five H200 harness runs
//! (`validation/h200/`: Llama-3.1-8B LoRA, the same with DoRA, and Mistral-7B-v0.3 QLoRA,
//! bf16-mixed, 1 × 2048 tokens, checkpointing, fused AdamW; two full fine-tunes in bf16
//! without autocast). The measurements were made with
//! torch 2.11 and transformers 5.17 on the GPU, so the sequences are near, not equal, to what
//! ran there.

mod support;

use serde_json::Value;
use support::replay_compact as replay;

const SEQUENCES: [&str; 2] = [
    include_str!("../../../validation/oracle-traces/step-events-h200.jsonl"),
    include_str!("../../../validation/oracle-traces/step-events-h200-dora.jsonl"),
];
/// Two full fine-tunes of bf16 models without autocast, as the harness ran them
/// (`calibration/step_events.py --matrix-h200`): Llama-3.2-1B-Instruct with fused AdamW and
/// Qwen2.5-1.5B with foreach AdamW, lm_head untied, 1 × 2048, checkpointing.
const FULL_SEQUENCES: &str =
    include_str!("../../../validation/oracle-traces/step-events-h200-full.jsonl");
const H200: [&str; 2] = [
    include_str!("../../../validation/h200/measured.jsonl"),
    include_str!("../../../validation/h200/settings.jsonl"),
];

/// The H200's measurement of `row` at `level`, in bytes.
fn measured(row: &str, level: &str) -> f64 {
    let id = format!("{row}-{level}");
    H200.iter()
        .flat_map(|file| file.lines())
        .map(|l| serde_json::from_str::<Value>(l).expect("row"))
        .find(|v| v["id"] == id.as_str())
        .and_then(|v| v["measured_gib"].as_f64())
        .map_or_else(|| panic!("{id} is measured"), |g| g * f64::from(1u32 << 30))
}

/// Allocated and reserved peaks within 2 % of the H200's, and the allocated peak the
/// oracle's own tracker counted. Reserved − allocated is 1.24, 2.22 and 0.95 GiB on the GPU
/// (LoRA, DoRA, QLoRA); the replay gives 1.16, 2.25 and 1.08. A ratio reserve was 5.5 %
/// under the DoRA run's reserved level: DoRA's weight-sized temporaries (`W + s·B·A` and the
/// identity, per module, in every forward and recompute) churn blocks as QLoRA's
/// dequantized weights do; moro's trace now carries them (`tests/replay.rs`).
#[test]
fn the_real_sequence_reaches_the_measured_reserved_level() {
    let mut checked = 0;
    for line in SEQUENCES.iter().flat_map(|file| file.lines()) {
        let row: Value = serde_json::from_str(line).expect("sequence");
        let h200 = row["h200_row"].as_str().expect("h200 row");
        let (allocated, reserved) = replay(&row);
        let traced = row["peak_allocated_bytes"].as_u64().expect("oracle peak");
        #[allow(clippy::cast_precision_loss)]
        let (allocated, reserved, traced) = (allocated as f64, reserved as f64, traced as f64);
        let (want_allocated, want_reserved) =
            (measured(h200, "allocated"), measured(h200, "reserved"));
        eprintln!(
            "{h200}: allocated {:+.2} %, reserved {:+.2} % (replay − measured)",
            (allocated / want_allocated - 1.0) * 100.0,
            (reserved / want_reserved - 1.0) * 100.0
        );
        assert!(
            (allocated / traced - 1.0).abs() < 0.005,
            "{h200}: {allocated} vs {traced}"
        );
        assert!(
            (allocated / want_allocated - 1.0).abs() <= 0.02,
            "{h200}: allocated"
        );
        assert!(
            (reserved / want_reserved - 1.0).abs() <= 0.02,
            "{h200}: reserved"
        );
        checked += 1;
    }
    assert_eq!(checked, 3);
}

/// The full fine-tunes' real sequences, replayed as recorded (no cuBLAS on fake tensors):
/// allocated within 0.6 % of the H200's; Qwen2.5-1.5B's reserved level 0.4 % under the
/// measured one and Llama-3.2-1B's 7.3 % under (14.11 GB against 15.23). Both levels turn
/// on where one fp32 logits-sized block (1,002 MiB) lands: with the GPU's two 32 MiB cuBLAS
/// workspaces inserted at the first matmul of the forward and of the backward, the same
/// sequences replay to Llama-3.2-1B's measured reserved level to the byte (15,229,517,824)
/// and to 5.4 % under Qwen2.5-1.5B's. moro's trace follows these sequences event for event
/// (`step_trace.rs`) and places the workspaces there, so its estimates do the same.
#[test]
fn the_full_fine_tunes_real_sequences_against_the_h200() {
    let mut checked = 0;
    for line in FULL_SEQUENCES.lines() {
        let row: Value = serde_json::from_str(line).expect("sequence");
        let h200 = row["h200_row"].as_str().expect("h200 row");
        let (allocated, reserved) = replay(&row);
        #[allow(clippy::cast_precision_loss)]
        let (allocated, reserved) = (allocated as f64, reserved as f64);
        let ea = allocated / measured(h200, "allocated") - 1.0;
        let er = reserved / measured(h200, "reserved") - 1.0;
        eprintln!(
            "{h200}: allocated {:+.2} %, reserved {:+.2} %",
            ea * 100.0,
            er * 100.0
        );
        assert!(ea.abs() <= 0.006, "{h200}: allocated {ea}");
        let one_segment_more = h200 == "moro-cal-d01d2061c2";
        if one_segment_more {
            assert!((-0.08..=-0.065).contains(&er), "{h200}: reserved {er}");
        } else {
            assert!(er.abs() <= 0.005, "{h200}: reserved {er}");
        }
        checked += 1;
    }
    assert_eq!(checked, 2);
}
