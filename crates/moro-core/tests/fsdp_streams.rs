//! What an FSDP rank holds on FSDP's own streams at its peak, against the rank traces.
//!
//! `calibration/shard_trace.py` records the stream every allocation of a rank is made on
//! (FSDP1's unshard and post-backward streams, FSDP2's all-gather copy-in and reduce-scatter
//! streams) and, at the traced allocated peak, the live bytes by stream
//! (`measured.by_stream_at_peak` in `validation/oracle-traces/fsdp-*.jsonl`).
//!
//! moro names the same bytes at its own peak ([`moro_core::estimate::rank::RankParts`]:
//! `all_gather_stream`, `reduce_scatter_stream`, `pre_unshard_stream`). Where the two peaks fall at slightly
//! different moments of backward the difference is the unit FSDP was gathering or the
//! gradients it had not yet reduced there, so each stream is held to within one gathered
//! layer unit, and two sharded layer gradients plus 128 MiB, of the trace.

use moro_core::estimate::{Regime, parallel::Sharded};
use moro_core::validation::{CatalogModels, explain};

const SHARDED: &str = include_str!("../../../validation/oracle-sharded.jsonl");

fn traces() -> Vec<serde_json::Value> {
    let dir = format!(
        "{}/../../validation/oracle-traces",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("fsdp-") && n.ends_with(".jsonl"))
        })
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn stream(by: &serde_json::Value, names: &[&str]) -> u64 {
    names.iter().filter_map(|n| by[*n].as_u64()).sum()
}

#[test]
fn side_streams_at_the_peak_follow_the_rank_traces() {
    let mut compared = 0;
    let mut offloaded = 0;
    for t in traces() {
        // A rank whose peak is the model's load holds nothing on FSDP's streams.
        let traced_phase = t["measured"]["peak_at"]["phase"].as_str().unwrap_or("");
        if !traced_phase.starts_with("step") {
            continue;
        }
        let by = &t["measured"]["by_stream_at_peak"];
        let dist = &t["dist"];
        let id = format!(
            "oracle-{}-w{}-r{}",
            t["label"].as_str().unwrap().replace('/', "-"),
            dist["world_size"],
            dist["rank"]
        );
        let Ok(x) = explain(SHARDED, &CatalogModels, &id) else {
            continue;
        };
        let rank = x.estimate.rank.unwrap();
        let st = Sharded::new(&x.model, &x.job, &Regime::resolve(&x.model, &x.job))
            .fsdp_streams
            .unwrap();
        let ag = stream(
            by,
            &[
                "unshard_stream",
                "all_gather_copy_in_stream",
                "all_gather_stream",
            ],
        );
        let rs = stream(by, &["post_backward_stream", "reduce_scatter_stream"]);
        let pre = stream(by, &["pre_unshard_stream"]);
        eprintln!(
            "{:90} {:>15} ag {:>6.3} / {:>6.3} GiB  rs {:>6.3} / {:>6.3} GiB  cached {:.3}",
            &id[7..id.len().min(97)],
            format!("{:?}", x.estimate.peak_phase),
            rank.all_gather_stream as f64 / 2f64.powi(30),
            ag as f64 / 2f64.powi(30),
            rank.reduce_scatter_stream as f64 / 2f64.powi(30),
            rs as f64 / 2f64.powi(30),
            rank.stream_cached as f64 / 2f64.powi(30),
        );
        assert!(
            rank.all_gather_stream.abs_diff(ag) <= st.unit,
            "{id}: all-gather stream {} vs traced {ag}",
            rank.all_gather_stream
        );
        assert!(
            rank.reduce_scatter_stream.abs_diff(rs) <= 2 * st.unit_grad + (128 << 20),
            "{id}: reduce-scatter stream {} vs traced {rs}",
            rank.reduce_scatter_stream
        );
        // Under CPU offload: the gathered units' shards copied back from the host, to within
        // one unit's shard (moro counts the prefetched unit's too).
        assert!(
            rank.pre_unshard_stream.abs_diff(pre) <= st.unit / st.group.max(1),
            "{id}: pre-unshard stream {} vs traced {pre}",
            rank.pre_unshard_stream
        );
        if pre > 0 {
            offloaded += 1;
        }
        compared += 1;
    }
    assert!(compared >= 50, "{compared} ranks compared");
    assert!(offloaded >= 4, "{offloaded} offloaded ranks compared");
}
