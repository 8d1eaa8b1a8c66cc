//! The full recipe search for a 7B model on a 24 GB card (issue 3 §6: well under 100 ms on
//! one core). `cargo bench -p moro-core --bench search`.

use moro_core::catalog;
use moro_core::hardware::preset;
use moro_core::model::ModelSpec;
use moro_core::search::{Caps, Objective, Request, Space, search};

fn main() {
    divan::main();
}

fn setup(id: &str, hw: &str) -> (ModelSpec, Caps) {
    let spec = catalog::find(id).and_then(|e| catalog::load(e).ok());
    let device = preset(hw).and_then(|p| p.to_device(None));
    match (spec, device) {
        (Some(s), Some(d)) => (s, Caps::of_device(&d)),
        _ => std::process::exit(1),
    }
}

/// `moro recipe generate --model Qwen/Qwen2.5-7B --hardware rtx-4090`: every method, rank,
/// target set, precision, checkpointing, optimizer, attention and micro batch, the sequence
/// length free (8192 → 1024).
#[divan::bench(args = ["quality", "speed"])]
fn qwen2_5_7b_rtx_4090(bencher: divan::Bencher, objective: &str) {
    let (spec, caps) = setup("Qwen/Qwen2.5-7B", "rtx-4090");
    let objective = if objective == "speed" {
        Objective::Speed
    } else {
        Objective::Quality
    };
    let request = Request {
        objective,
        ..Request::default()
    };
    bencher.bench(|| search_once(&spec, &request, &caps));
}

/// The same with the sequence length fixed at 2048.
#[divan::bench]
fn qwen2_5_7b_rtx_4090_seq_2048(bencher: divan::Bencher) {
    let (spec, caps) = setup("Qwen/Qwen2.5-7B", "rtx-4090");
    let request = Request {
        seq_len: Some(2048),
        ..Request::default()
    };
    bencher.bench(|| search_once(&spec, &request, &caps));
}

/// Nothing fits (72B on 12 GB): every sequence length is searched to the end.
#[divan::bench]
fn qwen2_5_72b_rtx_3060_nothing_fits(bencher: divan::Bencher) {
    let (spec, caps) = setup("Qwen/Qwen2.5-72B", "rtx-3060-12gb");
    let request = Request::default();
    bencher.bench(|| search_once(&spec, &request, &caps));
}

fn search_once(spec: &ModelSpec, request: &Request, caps: &Caps) -> usize {
    divan::black_box(
        Space::new(spec, request, caps).map_or(0, |space| search(spec, &space, caps).evaluated),
    )
}
