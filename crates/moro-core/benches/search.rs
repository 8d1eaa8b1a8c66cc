//! The full recipe search for a 7B model on a 24 GB card (issue 3 §6: well under 100 ms on
//! one core). `cargo bench -p moro-core --bench search`.

use moro_core::catalog;
use moro_core::hardware::preset;
use moro_core::model::ModelSpec;
use moro_core::search::{Caps, EstimateCache, Objective, Request, Space, search, search_cached};

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

/// `moro fit`'s core for Llama-3.1-8B QLoRA at 4,096 tokens: one search per GPU class of
/// the catalog, one GPU each, with and without the estimates shared between them.
#[divan::bench(args = [false, true], sample_count = 10)]
fn llama_3_1_8b_qlora_every_gpu_class(bencher: divan::Bencher, shared: bool) {
    let (spec, _) = setup("meta-llama/Llama-3.1-8B", "rtx-4090");
    let request = Request {
        method: moro_core::search::MethodChoice::Only(moro_core::job::Method::QuantizedAdapters),
        seq_len: Some(4096),
        ..Request::default()
    };
    let caps: Vec<Caps> = moro_core::hardware::presets()
        .iter()
        .filter_map(|p| p.to_device(None))
        .map(|d| Caps::of_device(&d))
        .collect();
    bencher.bench(|| {
        let cache = EstimateCache::default();
        caps.iter()
            .map(|c| {
                Space::new(&spec, &request, c).map_or(0, |space| {
                    search_cached(&spec, &space, c, shared.then_some(&cache)).evaluated
                })
            })
            .sum::<usize>()
    });
}

fn search_once(spec: &ModelSpec, request: &Request, caps: &Caps) -> usize {
    divan::black_box(
        Space::new(spec, request, caps).map_or(0, |space| search(spec, &space, caps).evaluated),
    )
}
