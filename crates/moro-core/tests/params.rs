//! Exact parameter counts of every catalog config against independent figures.
//!
//! The expected numbers are copied from `docs/model-params.md` ("exact total (computed)" and
//! "non-emb (computed)" columns). Those were computed by the catalog researcher from the
//! JSON files and cross-checked against keras-hub preset metadata, DeepSeek's own V3
//! breakdown, the Pythia model-card table and the Gemma 2/3 report tables; they are not
//! produced by moro. Active counts (MoE rows) are given there rounded to 0.01B and follow
//! the HF convention: router + top-k experts + shared experts + attention + embedding +
//! lm_head. (DeepSeek's own "activated" figure excludes the input embedding; the doc's
//! 37.55B for V3 includes it, which is what `ModelSpec::active_params` counts.)

use moro_core::arch::parse_config;

/// `(file stem, exact total, exact non-embedding, active in units of 0.01B)`.
type Row = (&'static str, &'static str, u64, u64, Option<u64>);

macro_rules! row {
    ($file:literal, $total:expr, $non_emb:expr, $active:expr) => {
        (
            $file,
            include_str!(concat!("../../../data/models/", $file, ".json")),
            $total,
            $non_emb,
            $active,
        )
    };
}

/// Rows of docs/model-params.md's table, one per `data/models` file.
const CATALOG: &[Row] = &[
    row!(
        "deepseek-ai--DeepSeek-R1-Distill-Llama-70B",
        70_553_706_496,
        68_452_360_192,
        None
    ),
    row!(
        "deepseek-ai--DeepSeek-R1-Distill-Llama-8B",
        8_030_261_248,
        6_979_588_096,
        None
    ),
    row!(
        "deepseek-ai--DeepSeek-R1-Distill-Qwen-1.5B",
        1_777_088_000,
        1_310_340_608,
        None
    ),
    row!(
        "deepseek-ai--DeepSeek-R1-Distill-Qwen-14B",
        14_770_033_664,
        13_212_898_304,
        None
    ),
    row!(
        "deepseek-ai--DeepSeek-R1-Distill-Qwen-32B",
        32_763_876_352,
        31_206_740_992,
        None
    ),
    row!(
        "deepseek-ai--DeepSeek-R1-Distill-Qwen-7B",
        7_615_616_512,
        6_525_621_760,
        None
    ),
    row!(
        "HuggingFaceTB--SmolLM2-1.7B",
        1_711_376_384,
        1_610_713_088,
        None
    ),
    row!(
        "HuggingFaceTB--SmolLM2-135M",
        134_515_008,
        106_203_456,
        None
    ),
    row!(
        "HuggingFaceTB--SmolLM2-360M",
        361_821_120,
        314_635_200,
        None
    ),
    row!(
        "meta-llama--Llama-2-13b-hf",
        13_015_864_320,
        12_688_184_320,
        None
    ),
    row!(
        "meta-llama--Llama-2-70b-hf",
        68_976_648_192,
        68_452_360_192,
        None
    ),
    row!(
        "meta-llama--Llama-2-7b-hf",
        6_738_415_616,
        6_476_271_616,
        None
    ),
    row!(
        "meta-llama--Llama-3.1-405B-Instruct",
        405_853_388_800,
        401_650_696_192,
        None
    ),
    row!(
        "meta-llama--Llama-3.1-70B-Instruct",
        70_553_706_496,
        68_452_360_192,
        None
    ),
    row!(
        "meta-llama--Llama-3.1-8B",
        8_030_261_248,
        6_979_588_096,
        None
    ),
    row!(
        "meta-llama--Llama-3.2-1B-Instruct",
        1_235_814_400,
        973_146_112,
        None
    ),
    row!(
        "meta-llama--Llama-3.2-3B",
        3_212_749_824,
        2_818_747_392,
        None
    ),
    row!(
        "meta-llama--Meta-Llama-3-70B",
        70_553_706_496,
        68_452_360_192,
        None
    ),
    row!(
        "meta-llama--Meta-Llama-3-8B",
        8_030_261_248,
        6_979_588_096,
        None
    ),
    row!(
        "mistralai--Mistral-7B-v0.1",
        7_241_732_096,
        6_979_588_096,
        None
    ),
    row!(
        "mistralai--Mistral-7B-v0.3",
        7_248_023_552,
        6_979_588_096,
        None
    ),
    row!(
        "mistralai--Mistral-Nemo-Base-2407",
        12_247_782_400,
        10_905_605_120,
        None
    ),
    row!(
        "mistralai--Mistral-Small-24B-Base-2501",
        23_572_403_200,
        22_230_225_920,
        None
    ),
    row!(
        "mistralai--Mixtral-8x22B-Instruct-v0.1",
        140_630_071_296,
        140_227_418_112,
        Some(3916)
    ),
    row!(
        "mistralai--Mixtral-8x7B-v0.1",
        46_702_792_704,
        46_440_648_704,
        Some(1288)
    ),
    row!("Qwen--Qwen2.5-0.5B", 494_032_768, 357_898_112, None),
    row!("Qwen--Qwen2.5-1.5B", 1_543_714_304, 1_310_340_608, None),
    row!("Qwen--Qwen2.5-14B", 14_770_033_664, 13_212_898_304, None),
    row!("Qwen--Qwen2.5-32B", 32_763_876_352, 31_206_740_992, None),
    row!("Qwen--Qwen2.5-3B", 3_085_938_688, 2_774_773_760, None),
    row!(
        "Qwen--Qwen2.5-3B-Instruct",
        3_085_938_688,
        2_774_773_760,
        None
    ),
    row!("Qwen--Qwen2.5-72B", 72_706_203_648, 70_214_787_072, None),
    row!("Qwen--Qwen2.5-7B", 7_615_616_512, 6_525_621_760, None),
    row!("Qwen--Qwen3-0.6B", 596_049_920, 440_467_456, None),
    row!("Qwen--Qwen3-1.7B", 1_720_574_976, 1_409_410_048, None),
    row!("Qwen--Qwen3-14B", 14_768_307_200, 13_212_482_560, None),
    row!(
        "Qwen--Qwen3-235B-A22B",
        235_093_634_560,
        233_848_974_848,
        Some(2219)
    ),
    row!(
        "Qwen--Qwen3-30B-A3B",
        30_532_122_624,
        29_909_792_768,
        Some(335)
    ),
    row!("Qwen--Qwen3-32B", 32_762_123_264, 31_206_298_624, None),
    row!("Qwen--Qwen3-4B", 4_022_468_096, 3_633_511_936, None),
    row!("Qwen--Qwen3-8B", 8_190_735_360, 6_946_075_648, None),
    row!(
        "TinyLlama--TinyLlama-1.1B-Chat-v1.0",
        1_100_048_384,
        968_976_384,
        None
    ),
];

fn check(rows: &[Row]) {
    let mut failures = Vec::new();
    for (file, json, total, non_emb, active) in rows {
        let spec = match parse_config(json.as_bytes()) {
            Ok(s) => s,
            Err(e) => {
                failures.push(format!("{file}: parse error: {e}"));
                continue;
            }
        };
        let got = spec.total_params();
        if got != *total {
            failures.push(format!(
                "{file}: total {got} != {total} (diff {})",
                got.abs_diff(*total)
            ));
        }
        let got_non_emb = got - spec.embedding_params() - spec.lm_head_params();
        if got_non_emb != *non_emb {
            failures.push(format!("{file}: non-embedding {got_non_emb} != {non_emb}"));
        }
        if let Some(centi_b) = active {
            // Doc gives 2 decimals of a billion: |active - x.xxB| <= 0.005B.
            let want = centi_b * 10_000_000;
            let got_active = spec.active_params();
            if got_active.abs_diff(want) > 5_000_000 {
                failures.push(format!("{file}: active {got_active} !~ {want}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn catalog_configs_match_exact_counts() {
    check(CATALOG);
}
