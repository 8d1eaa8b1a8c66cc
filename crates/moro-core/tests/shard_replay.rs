//! A sharded step's allocations replayed through moro's caching allocator, stream by stream.
//!
//! `validation/oracle-traces/fsdp-tiny-events.jsonl` is every allocation, free, resize and
//! `record_stream` of one FSDP1 rank (a tiny Llama, full fine-tune, rank 0 of 2, two steps)
//! recorded by `calibration/shard_trace.py` on fake CUDA tensors, each with the stream it was
//! made on (FSDP1 gathers on its unshard stream and reduces on its post-backward stream) and
//! the storage it is about. Frees are replayed where the program made them, as if the GPU
//! kept up; FSDP's waits are taken at phase boundaries (its final callback makes the compute
//! stream wait for the post-backward stream at the end of backward), where every stream is
//! synchronized.

use std::collections::HashMap;

use moro_core::caching_allocator::{CachingAllocator, Handle, Stream};

const FIXTURE: &str = include_str!("../../../validation/oracle-traces/fsdp-tiny-events.jsonl");

struct Replayed {
    peak_allocated: u64,
    peak_reserved: u64,
    /// The most each of FSDP's side streams' segments held.
    reducing_reserved: u64,
    unshard: u64,
    pre_unshard: u64,
}

/// Replays the fixture's events; `streams: false` puts every allocation on the compute
/// stream.
fn replay(row: &serde_json::Value, streams: bool) -> Replayed {
    let rows = row["events"]["rows"].as_array().expect("events");
    let mut a = CachingAllocator::new();
    let mut live: HashMap<u64, (Handle, u64)> = HashMap::new();
    let mut phase = None;
    let side = [Stream(1), Stream(2), Stream(3)];
    for e in rows {
        let kind = e[1].as_str().unwrap();
        let delta = e[2].as_i64().unwrap();
        let stream = u32::try_from(e[3].as_u64().unwrap()).unwrap();
        let uid = e[6].as_u64().unwrap();
        if phase != Some(e[5].as_u64().unwrap()) {
            phase = Some(e[5].as_u64().unwrap());
            for s in side {
                a.synchronize(s);
            }
        }
        let on = if streams {
            Stream(stream)
        } else {
            Stream::COMPUTE
        };
        match kind {
            // An empty storage allocates nothing (`CUDACachingAllocator::allocate(0)`).
            "a" if delta == 0 => {}
            "a" => {
                let n = u64::try_from(delta).unwrap();
                live.insert(uid, (a.malloc_on(on, n), n));
            }
            "f" => {
                if let Some((h, n)) = live.remove(&uid)
                    && n > 0
                {
                    a.free(h);
                }
            }
            "r" => {
                // A resize makes a new storage of the new size (FSDP frees its unsharded
                // buffers to 0 and regrows them).
                let old = live.remove(&uid);
                let size = old.map_or(0, |(_, n)| n).saturating_add_signed(delta);
                if let Some((h, n)) = old
                    && n > 0
                {
                    a.free(h);
                }
                let h = (size > 0).then(|| a.malloc_on(on, size));
                if let Some(h) = h {
                    live.insert(uid, (h, size));
                }
            }
            "s" => {
                if streams && let Some((h, _)) = live.get(&uid) {
                    a.record_stream(*h, Stream(stream));
                }
            }
            other => panic!("event kind {other}"),
        }
    }
    Replayed {
        peak_allocated: a.peak_allocated(),
        peak_reserved: a.peak_reserved(),
        reducing_reserved: a.peak_reserved_on(Stream(2)),
        unshard: a.peak_reserved_on(Stream(1)),
        pre_unshard: a.peak_reserved_on(Stream(3)),
    }
}

/// The replayed allocated peak is the tracer's own count to the byte (the allocator rounds
/// requests to 512 B as the tracer does); the reserved peak, which the tracer cannot see,
/// is at least that, and keeping the all-gather and reduce-scatter streams' blocks apart
/// reserves more than one shared pool would.
#[test]
fn an_fsdp_rank_replays_stream_by_stream() {
    let row: serde_json::Value = serde_json::from_str(FIXTURE.lines().next().unwrap()).unwrap();
    let traced = row["measured"]["peak_allocated_bytes"].as_u64().unwrap();
    let with = replay(&row, true);
    let without = replay(&row, false);
    eprintln!(
        "traced allocated {traced}; replayed allocated {}, reserved {} with streams, {} on one",
        with.peak_allocated, with.peak_reserved, without.peak_reserved
    );
    assert_eq!(with.peak_allocated, traced);
    assert_eq!(without.peak_allocated, traced);
    assert!(with.peak_reserved >= with.peak_allocated);
    assert!(
        with.peak_reserved > without.peak_reserved,
        "streams: {} vs one pool: {}",
        with.peak_reserved,
        without.peak_reserved
    );
}

/// moro's model of FSDP's side-stream pools ([`moro_core::estimate::streams`]) against the
/// recorded rank replayed stream by stream: the pools that gather (the unit buffers and,
/// under FSDP1's mixed precision, the low-precision shards) and the pool that reduces (the
/// reduce-scatter outputs and the fp32 gradients kept in `.grad`) reserve what the
/// replay's do, to the segment.
#[test]
fn moro_side_stream_pools_match_the_replay() {
    use moro_core::estimate::{Phase, Regime, parallel::Sharded, streams};
    use moro_core::job::{JobSettings, Method, Precision, Sharding};

    let row: serde_json::Value = serde_json::from_str(FIXTURE.lines().next().unwrap()).unwrap();
    let replayed = replay(&row, true);
    let config = serde_json::to_string(&row["config"]).unwrap();
    let model =
        moro_core::validation::config_with_overrides(&config, &serde_json::Map::new()).unwrap();
    let job = JobSettings {
        method: Some(Method::Full),
        precision: Some(Precision::Bf16Mixed),
        micro_batch_size: Some(2),
        seq_len: Some(64),
        gradient_checkpointing: Some(true),
        gpus: Some(2),
        sharding: Some(Sharding::FsdpFullShard),
        ..JobSettings::default()
    }
    .resolve_for(&model)
    .unwrap();
    let par = Sharded::new(&model, &job, &Regime::resolve(&model, &job));
    let side = streams::Streams::of(&par)
        .unwrap()
        .at(&par, &job, Phase::OptimizerStep, false);
    eprintln!(
        "unshard: moro {} replay {}; pre-unshard: moro {} replay {}; post-backward: moro {} \
         replay {}",
        side.all_gather.reserved,
        replayed.unshard,
        side.pre_unshard.reserved,
        replayed.pre_unshard,
        side.reduce_scatter.reserved,
        replayed.reducing_reserved
    );
    assert_eq!(side.all_gather.reserved, replayed.unshard);
    assert_eq!(side.reduce_scatter.reserved, replayed.reducing_reserved);
    // The replay hands a `record_stream`ed block back only at a phase's end, as if every
    // all-gather of the phase were still running: it holds every shard the phase cast.
    // moro holds the shards of the two all-gathers `limit_all_gathers` lets run.
    assert!(side.pre_unshard.reserved > 0);
    assert!(side.pre_unshard.reserved <= replayed.pre_unshard);
}

/// PEFT under FSDP1, adapters in units of their own: the next layer unit is gathered only
/// after the running layer's MLP backward, so at the rank's peak one layer unit is gathered,
/// and two only briefly at each layer's end (`estimate::parallel`: one layer unit at a
/// layer's widest moment; the all-gather pool still holds two).
#[test]
fn peft_fsdp1_gathers_one_layer_unit_at_the_peak() {
    let row: serde_json::Value = serde_json::from_str(FIXTURE.lines().nth(1).unwrap()).unwrap();
    assert!(row["label"].as_str().unwrap().contains("qlora"));
    let ev = &row["events"];
    let names = |key: &str| -> Vec<&str> {
        ev[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect()
    };
    let (cats, phases) = (names("categories"), names("phases"));
    let unsharded = cats.iter().position(|c| *c == "unsharded_params").unwrap() as u64;
    let rows = ev["rows"].as_array().unwrap();
    let regrown = |e: &serde_json::Value| {
        e[1].as_str() == Some("r") && e[4].as_u64() == Some(unsharded) && e[2].as_i64() > Some(0)
    };
    // The layer unit: the size FSDP regrows most often among the large buffers (the root
    // is regrown once a step, the adapters' units are a few KiB).
    let largest = rows
        .iter()
        .filter(|e| regrown(e))
        .map(|e| e[2].as_i64().unwrap())
        .max();
    let unit = rows
        .iter()
        .filter(|e| regrown(e))
        .map(|e| e[2].as_i64().unwrap())
        .filter(|&d| Some(d) != largest && d * 4 > largest.unwrap())
        .max()
        .expect("a layer unit");
    let peak = row["measured"]["peak_at"]["op_index"].as_u64().unwrap();
    let (mut live, mut at_peak, mut most_in_backward) = (0i64, None, 0);
    for e in rows {
        let delta = e[2].as_i64().unwrap();
        if e[1].as_str() == Some("r") && e[4].as_u64() == Some(unsharded) && delta.abs() == unit {
            live += delta.signum();
            if phases[e[5].as_u64().unwrap() as usize].ends_with(".backward") {
                most_in_backward = most_in_backward.max(live);
            }
        }
        if e[0].as_u64().unwrap() <= peak {
            at_peak = Some(live);
        }
    }
    assert_eq!(at_peak, Some(1), "layer units gathered at the peak");
    assert_eq!(
        most_in_backward, 2,
        "layer units gathered at once in backward"
    );
}
