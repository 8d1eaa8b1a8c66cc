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
        "01-ai--Yi-1.5-34B-Chat",
        34_388_917_248,
        33_471_413_248,
        None
    ),
    row!("01-ai--Yi-1.5-6B-Chat", 6_061_035_520, 5_536_747_520, None),
    row!("01-ai--Yi-1.5-9B", 8_829_407_232, 8_305_119_232, None),
    row!("01-ai--Yi-34B", 34_388_917_248, 33_471_413_248, None),
    row!("01-ai--Yi-34B-200K", 34_388_917_248, 33_471_413_248, None),
    row!("01-ai--Yi-6B", 6_061_035_520, 5_536_747_520, None),
    row!("01-ai--Yi-6B-200K", 6_061_035_520, 5_536_747_520, None),
    row!(
        "EleutherAI--pythia-1.4b-deduped-v0",
        1_414_647_808,
        1_208_602_624,
        None
    ),
    row!(
        "EleutherAI--pythia-12b-v0",
        11_846_072_320,
        11_327_027_200,
        None
    ),
    row!("EleutherAI--pythia-14m", 14_067_712, 1_189_888, None),
    row!(
        "HuggingFaceH4--zephyr-7b-beta",
        7_241_732_096,
        6_979_588_096,
        None
    ),
    row!(
        "HuggingFaceTB--SmolLM-1.7B",
        1_711_376_384,
        1_610_713_088,
        None
    ),
    row!("HuggingFaceTB--SmolLM-135M", 134_515_008, 106_203_456, None),
    row!(
        "HuggingFaceTB--SmolLM-135M-Instruct",
        134_515_008,
        106_203_456,
        None
    ),
    row!("HuggingFaceTB--SmolLM-360M", 361_821_120, 314_635_200, None),
    row!(
        "HuggingFaceTB--SmolLM-360M-Instruct",
        361_821_120,
        314_635_200,
        None
    ),
    row!(
        "Qwen--Qwen2.5-0.5B-Instruct",
        494_032_768,
        357_898_112,
        None
    ),
    row!(
        "Qwen--Qwen2.5-14B-Instruct",
        14_770_033_664,
        13_212_898_304,
        None
    ),
    row!(
        "Qwen--Qwen2.5-Coder-32B-Instruct",
        32_763_876_352,
        31_206_740_992,
        None
    ),
    row!(
        "Qwen--Qwen3-Coder-480B-A35B-Instruct",
        480_154_875_392,
        478_287_885_824,
        Some(3547)
    ),
    row!(
        "allenai--OLMo-2-0325-32B",
        32_234_279_936,
        31_206_675_456,
        None
    ),
    row!(
        "allenai--OLMo-2-1124-13B",
        13_716_198_400,
        12_688_593_920,
        None
    ),
    row!(
        "deepseek-ai--deepseek-coder-6.7b-instruct",
        6_740_512_768,
        6_476_271_616,
        None
    ),
    row!("distilbert--distilgpt2", 81_912_576, 43_315_200, None),
    row!(
        "google--gemma-2-27b-it",
        27_227_128_320,
        26_047_480_320,
        None
    ),
    row!("google--gemma-2-9b-it", 9_241_705_984, 8_324_201_984, None),
    row!("lmsys--vicuna-7b-v1.5", 6_738_415_616, 6_476_271_616, None),
    row!(
        "meta-llama--Llama-3.1-405B",
        405_853_388_800,
        401_650_696_192,
        None
    ),
    row!(
        "meta-llama--Llama-3.3-70B-Instruct",
        70_553_706_496,
        68_452_360_192,
        None
    ),
    row!(
        "mistralai--Mistral-7B-Instruct-v0.1",
        7_241_732_096,
        6_979_588_096,
        None
    ),
    row!(
        "mistralai--Mistral-7B-Instruct-v0.2",
        7_241_732_096,
        6_979_588_096,
        None
    ),
    row!(
        "mistralai--Mistral-7B-Instruct-v0.3",
        7_248_023_552,
        6_979_588_096,
        None
    ),
    row!(
        "mistralai--Mixtral-8x22B-v0.1",
        140_620_634_112,
        140_227_418_112,
        Some(3915)
    ),
    row!(
        "mistralai--Mixtral-8x7B-Instruct-v0.1",
        46_702_792_704,
        46_440_648_704,
        Some(1288)
    ),
    row!(
        "stabilityai--stablelm-2-zephyr-1_6b",
        1_644_515_328,
        1_233_473_536,
        None
    ),
    row!(
        "unsloth--SmolLM-1.7B-Instruct",
        1_711_376_384,
        1_610_713_088,
        None
    ),
    row!(
        "upstage--SOLAR-10.7B-v1.0",
        10_731_524_096,
        10_469_380_096,
        None
    ),
    row!(
        "allenai--OLMo-2-1124-7B",
        7_298_617_344,
        6_476_533_760,
        None
    ),
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
        "deepseek-ai--DeepSeek-V2-Lite",
        15_706_484_224,
        15_287_053_824,
        Some(266)
    ),
    row!(
        "deepseek-ai--DeepSeek-V3",
        671_026_419_200,
        669_173_061_120,
        Some(3755)
    ),
    row!(
        "EleutherAI--pythia-1.4b",
        1_414_647_808,
        1_208_602_624,
        None
    ),
    row!(
        "EleutherAI--pythia-12b",
        11_846_072_320,
        11_327_027_200,
        None
    ),
    row!("EleutherAI--pythia-160m", 162_322_944, 85_056_000, None),
    row!("EleutherAI--pythia-1b", 1_011_781_632, 805_736_448, None),
    row!(
        "EleutherAI--pythia-2.8b",
        2_775_208_960,
        2_517_652_480,
        None
    ),
    row!("EleutherAI--pythia-410m", 405_334_016, 302_311_424, None),
    row!(
        "EleutherAI--pythia-6.9b",
        6_857_302_016,
        6_444_163_072,
        None
    ),
    row!("EleutherAI--pythia-70m", 70_426_624, 18_915_328, None),
    row!("google--gemma-2-27b", 27_227_128_320, 26_047_480_320, None),
    row!("google--gemma-2-2b", 2_614_341_888, 2_024_517_888, None),
    row!("google--gemma-2-2b-it", 2_614_341_888, 2_024_517_888, None),
    row!("google--gemma-2-9b", 9_241_705_984, 8_324_201_984, None),
    // Gemma 3 4B/12B/27B are multimodal: their SigLIP tower and projector are counted (the
    // transformers 5.24 meta-device split in validation/vlm-params.json; the 4B's 419,816,304
    // is keras-hub's with-vision minus text-only preset count).
    row!(
        "google--gemma-3-12b-it",
        12_187_325_040,
        11_180_446_320,
        None
    ),
    row!("google--gemma-3-1b-it", 999_885_952, 697_896_064, None),
    row!(
        "google--gemma-3-27b-it",
        27_432_406_640,
        26_022_776_432,
        None
    ),
    row!("google--gemma-3-4b-it", 4_300_079_472, 3_628_826_992, None),
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
        "microsoft--Phi-3-medium-4k-instruct",
        13_960_238_080,
        13_631_902_720,
        None
    ),
    row!(
        "microsoft--Phi-3-mini-4k-instruct",
        3_821_079_552,
        3_624_078_336,
        None
    ),
    row!(
        "microsoft--Phi-3.5-mini-instruct",
        3_821_079_552,
        3_624_078_336,
        None
    ),
    row!("microsoft--phi-4", 14_659_507_200, 13_631_902_720, None),
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
    row!("openai-community--gpt2", 124_439_808, 85_842_432, None),
    row!(
        "openai-community--gpt2-large",
        774_030_080,
        709_701_120,
        None
    ),
    row!(
        "openai-community--gpt2-medium",
        354_823_168,
        303_360_000,
        None
    ),
    row!(
        "openai-community--gpt2-xl",
        1_557_611_200,
        1_477_200_000,
        None
    ),
    row!("Qwen--Qwen2.5-0.5B", 494_032_768, 357_898_112, None),
    row!("Qwen--Qwen2.5-1.5B", 1_543_714_304, 1_310_340_608, None),
    row!(
        "Qwen--Qwen2.5-1.5B-Instruct",
        1_543_714_304,
        1_310_340_608,
        None
    ),
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
    row!(
        "Qwen--Qwen2.5-72B-Instruct",
        72_706_203_648,
        70_214_787_072,
        None
    ),
    row!("Qwen--Qwen2.5-7B", 7_615_616_512, 6_525_621_760, None),
    // Instruct / Base / -it variants below have their base's shapes (context, eos, stored
    // dtype differ: docs/model-params.md), so the base model's independent count holds.
    row!(
        "Qwen--Qwen2.5-7B-Instruct",
        7_615_616_512,
        6_525_621_760,
        None
    ),
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
    row!(
        "openai--gpt-oss-20b",
        20_914_757_184,
        19_756_490_304,
        Some(419)
    ),
    row!(
        "openai--gpt-oss-120b",
        116_829_156_672,
        115_670_889_792,
        Some(571)
    ),
    row!("Qwen--Qwen3-32B", 32_762_123_264, 31_206_298_624, None),
    row!("Qwen--Qwen3-4B", 4_022_468_096, 3_633_511_936, None),
    row!("Qwen--Qwen3-8B", 8_190_735_360, 6_946_075_648, None),
    row!("Qwen--Qwen3-8B-Base", 8_190_735_360, 6_946_075_648, None),
    row!("tiiuae--falcon-7b", 6_921_720_704, 6_626_251_648, None),
    row!(
        "TinyLlama--TinyLlama-1.1B-Chat-v1.0",
        1_100_048_384,
        968_976_384,
        None
    ),
    // Mistral Small 3.1: transformers 5.24 meta-device count (`data/staged/manifest.jsonl`),
    // lm_head tied as `Mistral3Config` defaults it.
    row!(
        "mistralai--Mistral-Small-3.1-24B-Instruct-2503",
        23_340_272_640,
        22_669_184_000,
        None
    ),
    // Qwen3-VL: transformers 5.24 meta-device counts (`data/staged/manifest.jsonl`, where
    // these configs came from; both seen in real files).
    row!(
        "Qwen--Qwen3-VL-4B-Instruct",
        4_437_815_808,
        4_048_859_648,
        None
    ),
    row!(
        "Qwen--Qwen3-VL-30B-A3B-Instruct",
        31_070_754_032,
        30_448_424_176,
        None
    ),
    row!(
        "Qwen--Qwen2.5-VL-3B-Instruct",
        3_754_622_976,
        3_443_458_048,
        None
    ),
    row!(
        "Qwen--Qwen2.5-VL-7B-Instruct",
        8_292_166_656,
        7_202_171_904,
        None
    ),
    row!(
        "Qwen--Qwen2.5-VL-32B-Instruct",
        33_452_718_336,
        31_895_582_976,
        None
    ),
    row!(
        "Qwen--Qwen2.5-VL-72B-Instruct",
        73_410_777_344,
        70_919_360_768,
        None
    ),
    row!(
        "Qwen--Qwen2-VL-2B-Instruct",
        2_208_985_600,
        1_975_611_904,
        None
    ),
    row!(
        "Qwen--Qwen2-VL-7B-Instruct",
        8_291_375_616,
        7_201_380_864,
        None
    ),
    row!(
        "llava-hf--llava-1.5-7b-hf",
        7_063_427_072,
        6_800_758_784,
        None
    ),
    row!(
        "HuggingFaceTB--SmolLM2-1.7B-Instruct",
        1_711_376_384,
        1_610_713_088,
        None
    ),
    row!(
        "tiiuae--Falcon3-7B-Instruct",
        7_455_550_464,
        6_650_244_096,
        None
    ),
    row!(
        "meta-llama--Llama-3.1-8B-Instruct",
        8_030_261_248,
        6_979_588_096,
        None
    ),
    row!(
        "meta-llama--Meta-Llama-3-8B-Instruct",
        8_030_261_248,
        6_979_588_096,
        None
    ),
    row!(
        "deepseek-ai--DeepSeek-Coder-V2-Lite-Instruct",
        15_706_484_224,
        15_287_053_824,
        Some(266)
    ),
    row!("google--gemma-3-1b-pt", 999_885_952, 697_896_064, None),
    row!(
        "meta-llama--Llama-3.2-3B-Instruct",
        3_212_749_824,
        2_818_747_392,
        None
    ),
    row!("Qwen--Qwen2-0.5B-Instruct", 494_032_768, 357_898_112, None),
    row!(
        "Qwen--Qwen2-1.5B-Instruct",
        1_543_714_304,
        1_310_340_608,
        None
    ),
    row!(
        "Qwen--Qwen2-7B-Instruct",
        7_615_616_512,
        6_525_621_760,
        None
    ),
    row!(
        "codellama--CodeLlama-7b-hf",
        6_738_546_688,
        6_476_271_616,
        None
    ),
    row!(
        "codellama--CodeLlama-13b-hf",
        13_016_028_160,
        12_688_184_320,
        None
    ),
    row!(
        "microsoft--Phi-4-mini-instruct",
        3_836_021_760,
        3_221_425_152,
        None
    ),
    row!(
        "Qwen--Qwen1.5-MoE-A2.7B-Chat",
        14_315_784_192,
        13_693_454_336,
        Some(269)
    ),
    row!(
        "google--gemma-2-2b-jpn-it",
        2_614_341_888,
        2_024_517_888,
        None
    ),
    row!(
        "TinyLlama--TinyLlama-1.1B-Chat-v0.4",
        1_100_060_672,
        968_976_384,
        None
    ),
    row!(
        "tiiuae--Falcon3-1B-Instruct",
        1_669_408_768,
        1_132_537_856,
        None
    ),
    row!(
        "tiiuae--Falcon3-3B-Instruct",
        3_227_655_168,
        2_422_348_800,
        None
    ),
    row!(
        "tiiuae--Falcon3-10B-Instruct",
        10_305_653_760,
        9_500_347_392,
        None
    ),
    row!(
        "HuggingFaceTB--SmolLM2-360M-Instruct",
        361_821_120,
        314_635_200,
        None
    ),
    row!(
        "Qwen--Qwen2.5-Coder-7B-Instruct",
        7_615_616_512,
        6_525_621_760,
        None
    ),
    row!(
        "Qwen--Qwen2.5-Coder-0.5B-Instruct",
        494_032_768,
        357_898_112,
        None
    ),
    row!(
        "mistralai--Mistral-Nemo-Instruct-2407",
        12_247_782_400,
        10_905_605_120,
        None
    ),
    row!(
        "meta-llama--Llama-2-7b-chat-hf",
        6_738_415_616,
        6_476_271_616,
        None
    ),
    row!(
        "meta-llama--Llama-2-13b-chat-hf",
        13_015_864_320,
        12_688_184_320,
        None
    ),
    row!(
        "HuggingFaceH4--zephyr-7b-alpha",
        7_241_732_096,
        6_979_588_096,
        None
    ),
    row!(
        "unsloth--llama-3-8b-bnb-4bit",
        8_030_261_248,
        6_979_588_096,
        None
    ),
    row!(
        "unsloth--llama-3-8b-Instruct-bnb-4bit",
        8_030_261_248,
        6_979_588_096,
        None
    ),
    row!(
        "HuggingFaceTB--SmolLM3-3B",
        3_075_098_624,
        2_812_430_336,
        None
    ),
    row!(
        "ibm-granite--granite-3.3-8b-instruct",
        8_170_864_640,
        7_969_509_376,
        None
    ),
    row!(
        "allenai--Olmo-3.1-32B-Instruct",
        32_233_522_176,
        31_206_675_456,
        None
    ),
    row!(
        "zai-org--GLM-4.5-Air",
        106_852_245_504,
        105_610_731_520,
        Some(1342)
    ),
    row!(
        "zai-org--GLM-4.6",
        352_797_814_784,
        351_245_922_304,
        Some(3363)
    ),
    row!(
        "allenai--OLMo-2-0425-1B",
        1_484_916_736,
        1_073_874_944,
        None
    ),
    row!(
        "allenai--Olmo-3-7B-Instruct",
        7_298_011_136,
        6_476_533_760,
        None
    ),
];

/// Models added for the validation set (not in docs/model-params.md). Expected totals were
/// worked out by hand from each published architecture (the per-layer arithmetic is in the
/// comment) and agree with the public figures noted: [recalled] = model card / paper figure
/// from memory, not re-read; "validation" = `params_b` of shared/validation/measured.jsonl.
/// Non-embedding = total − V·H (− V·H again when untied).
const EXTRA: &[Row] = &[
    // phi-2: 2,779,683,840 [recalled, HF model card "2.7B"/page 2.78B]; 32 × 78,671,360
    // + 2 × 51200·2560 + lm_head bias 51,200 + final LN 5,120.
    row!("microsoft--phi-2", 2_779_683_840, 2_517_539_840, None),
    // phi-1_5: 24 × 50,354,176 + 2 × 51200·2048 + 51,200 + 4,096; validation 1.42B.
    row!("microsoft--phi-1_5", 1_418_270_720, 1_208_555_520, None),
    // gemma-2b: 2,506,172,416 [recalled; keras-hub gemma_2b_en]; tied.
    row!("google--gemma-2b", 2_506_172_416, 1_981_884_416, None),
    // bert-large-uncased as BertForSequenceClassification (2 labels): BertModel
    // 335,141,888 + classifier 1024·2 + 2 (see `bert_large_by_hand`).
    row!(
        "google-bert--bert-large-uncased",
        335_143_938,
        303_889_410,
        None
    ),
    // gemma-7b: 8,537,680,896 [recalled; keras-hub gemma_7b_en]; tied, 16 KV heads.
    row!("google--gemma-7b", 8_537_680_896, 7_751_248_896, None),
    // Qwen-7B: 7,721,324,544 [recalled, Qwen-7B model card]; 32 × 202,395,648 + 2 × 151936·4096
    // + 4,096.
    row!("Qwen--Qwen-7B", 7_721_324_544, 6_476_664_832, None),
    // Qwen-1.8B: 24 × 50,604,032 + 2 × 151936·2048 + 2,048; validation 1.84B.
    row!("Qwen--Qwen-1_8B", 1_836_828_672, 1_214_498_816, None),
    // Qwen-14B: 40 × 315,253,760 + 2 × 152064·5120 + 5,120; validation 14.17B.
    row!("Qwen--Qwen-14B", 14_167_290_880, 12_610_155_520, None),
    // Qwen-72B: 80 × 872,456,192 + 2 × 152064·8192 + 8,192; validation 72.29B.
    row!("Qwen--Qwen-72B", 72_287_920_128, 69_796_503_552, None),
    // bloomz-7b1 = bloom-7b1 architecture: 7,069,016,064 [recalled, BLOOM card]; tied.
    row!("bigscience--bloomz-7b1", 7_069_016_064, 6_041_411_584, None),
    // santacoder (MQA): 24 × 42,490,112 + wte 49280·2048 + wpe 2048·2048 + ln_f; "1.1B"
    // [recalled], validation 1.12B.
    row!(
        "bigcode--gpt_bigcode-santacoder",
        1_124_886_528,
        1_023_961_088,
        None
    ),
    // octocoder = StarCoder 15.5B [recalled]: 40 × 379,128,064 + wte + wpe 8192·6144 + ln_f.
    row!("bigcode--octocoder", 15_517_456_384, 15_215_466_496, None),
    // falcon-40b: 60 × 679,510,016 + tied 65024·8192 + ln_f = 41.30B. The HF page's "41.8B"
    // counts the tied lm_head a second time (+532,676,608 = 41,835,970,560).
    row!("tiiuae--falcon-40b", 41_303_293_952, 40_770_617_344, None),
    // stablelm-base-alpha-3b (GPT-NeoX): 16 × 201,379,840 + 2 × 50688·4096 + 8,192;
    // validation 3.64B.
    row!(
        "stabilityai--stablelm-base-alpha-3b",
        3_637_321_728,
        3_222_085_632,
        None
    ),
    // CodeLlama-34b: 48 × 692,076,544 + 2 × 32000·8192 + 8,192; validation 33.74B.
    row!(
        "codellama--CodeLlama-34b-hf",
        33_743_970_304,
        33_219_682_304,
        None
    ),
    // Mistral 7B v0.2: same shapes as v0.1 (vocab 32000): 7,241,732,096 as in the doc.
    row!(
        "unsloth--Mistral-7B-v0.2",
        7_241_732_096,
        6_979_588_096,
        None
    ),
];

#[test]
fn extra_configs_match_hand_counts() {
    check(EXTRA);
}

#[test]
fn every_catalog_entry_has_an_expected_count() {
    let known: Vec<String> = CATALOG
        .iter()
        .chain(EXTRA)
        .map(|r| r.0.replacen("--", "/", 1))
        .collect();
    for e in moro_core::catalog::entries() {
        assert!(
            known.iter().any(|k| k == e.id),
            "{} has no expected count",
            e.id
        );
    }
    assert_eq!(known.len(), moro_core::catalog::entries().len());
}

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

fn catalog_spec(file: &str) -> moro_core::model::ModelSpec {
    let (_, json, ..) = CATALOG.iter().find(|r| r.0 == file).expect("row exists");
    parse_config(json.as_bytes()).expect("parses")
}

/// `(full layers, sliding layers with their window)` of a spec.
fn attention_split(spec: &moro_core::model::ModelSpec) -> (u64, Vec<(u64, u64)>) {
    use moro_core::model::AttentionKind;
    let mut full = 0;
    let mut sliding = Vec::new();
    for g in &spec.layers {
        match g.attention {
            AttentionKind::Full => full += g.count,
            AttentionKind::Sliding { window } => sliding.push((g.count, window)),
            AttentionKind::Recurrent | AttentionKind::Cross => {}
        }
    }
    (full, sliding)
}

#[test]
fn sliding_window_patterns_follow_the_configs() {
    // Mistral 7B v0.1: sliding_window 4096 on all 32 layers; v0.3: null → full.
    assert_eq!(
        attention_split(&catalog_spec("mistralai--Mistral-7B-v0.1")),
        (0, vec![(32, 4096)])
    );
    assert_eq!(
        attention_split(&catalog_spec("mistralai--Mistral-7B-v0.3")),
        (32, vec![])
    );
    // OLMo 3.1 32B: `layer_types` three sliding (4096) then one full, over 64 layers.
    assert_eq!(
        attention_split(&catalog_spec("allenai--Olmo-3.1-32B-Instruct")),
        (16, vec![(48, 4096)])
    );
    // Gemma 2 9B: 42 layers alternating, even indices sliding (4096).
    assert_eq!(
        attention_split(&catalog_spec("google--gemma-2-9b")),
        (21, vec![(21, 4096)])
    );
    // Gemma 3 27B: 62 layers, every 6th global → 10 global, 52 local (window 1024).
    assert_eq!(
        attention_split(&catalog_spec("google--gemma-3-27b-it")),
        (10, vec![(52, 1024)])
    );
    // Gemma 3 1B: 26 layers → 4 global, 22 local (window 512).
    assert_eq!(
        attention_split(&catalog_spec("google--gemma-3-1b-it")),
        (4, vec![(22, 512)])
    );
    // Qwen2.5: use_sliding_window false → all full.
    assert_eq!(
        attention_split(&catalog_spec("Qwen--Qwen2.5-7B")),
        (28, vec![])
    );
}

#[test]
fn moe_and_mla_shapes() {
    use moro_core::model::LinearRole;
    let v3 = catalog_spec("deepseek-ai--DeepSeek-V3");
    let moe = v3.moe.as_ref().expect("moe");
    assert_eq!(
        (
            moe.num_experts,
            moe.experts_per_token,
            moe.num_shared_experts
        ),
        (256, 8, 1)
    );
    assert_eq!(moe.first_dense_layers, 3);
    let dense: u64 = v3.layers.iter().filter(|g| !g.moe).map(|g| g.count).sum();
    assert_eq!(dense, 3);
    // MLA caches kv_lora_rank + qk_rope_head_dim = 512 + 64 per token per layer.
    assert_eq!(v3.kv_cache_elems_per_token_layer(), 576);

    let mixtral = catalog_spec("mistralai--Mixtral-8x7B-v0.1");
    let names: Vec<(&str, LinearRole, u64, u64)> = mixtral
        .linears()
        .map(|(_, l)| (l.name.as_str(), l.role, l.count, l.active))
        .collect();
    assert!(names.contains(&("gate", LinearRole::Router, 1, 1)));
    assert!(names.contains(&("w1", LinearRole::Expert, 8, 2)));
    assert!(names.contains(&("w2", LinearRole::Expert, 8, 2)));
    assert!(names.contains(&("w3", LinearRole::Expert, 8, 2)));
}

#[test]
fn linear_names_are_the_hf_module_names() {
    let names = |file: &str| -> Vec<String> {
        let mut v: Vec<String> = catalog_spec(file)
            .linears()
            .map(|(_, l)| l.name.clone())
            .collect();
        v.dedup();
        v
    };
    assert_eq!(
        names("microsoft--Phi-3-mini-4k-instruct"),
        ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    );
    assert_eq!(
        names("openai-community--gpt2"),
        ["c_attn", "c_proj", "c_fc", "c_proj"]
    );
    assert_eq!(
        names("EleutherAI--pythia-70m"),
        ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]
    );
    assert_eq!(
        names("meta-llama--Llama-3.1-8B"),
        [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj"
        ]
    );
    assert_eq!(
        names("deepseek-ai--DeepSeek-V2-Lite")[..4],
        ["q_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
    );
}

#[test]
fn defaults_for_absent_keys() {
    use moro_core::model::Dtype;
    // GPT-2's config has no torch_dtype (fp32 checkpoint) and no tie key (ties by default).
    let gpt2 = catalog_spec("openai-community--gpt2");
    assert_eq!(gpt2.load_dtype, Dtype::F32);
    assert!(gpt2.tie_word_embeddings);
    // phi-4 has no torch_dtype: bf16.
    assert_eq!(catalog_spec("microsoft--phi-4").load_dtype, Dtype::Bf16);
    // Gemma 2 has no tie key: ties by default.
    assert!(catalog_spec("google--gemma-2-2b").tie_word_embeddings);
    assert_eq!(catalog_spec("google--gemma-2-2b").load_dtype, Dtype::F32);
    // Variants keep their own differences: the -it upload stores bf16, the Instruct models
    // have 32k positions where their bases have 128k, Qwen3-8B-Base 32k where Qwen3-8B 40k.
    assert_eq!(
        catalog_spec("google--gemma-2-2b-it").load_dtype,
        Dtype::Bf16
    );
    for (variant, positions) in [
        ("Qwen--Qwen2.5-7B-Instruct", 32_768),
        ("Qwen--Qwen2.5-72B-Instruct", 32_768),
        ("Qwen--Qwen2.5-1.5B-Instruct", 32_768),
        ("Qwen--Qwen2.5-7B", 131_072),
        ("Qwen--Qwen3-8B-Base", 32_768),
        ("Qwen--Qwen3-8B", 40_960),
    ] {
        assert_eq!(
            catalog_spec(variant).max_position_embeddings,
            positions,
            "{variant}"
        );
    }
    // Falcon-7B: FalconConfig ties by default; multi_query → one KV head.
    let falcon = catalog_spec("tiiuae--falcon-7b");
    assert!(falcon.tie_word_embeddings);
    assert_eq!((falcon.num_kv_heads, falcon.head_dim), (1, 64));
}

mod errors {
    use moro_core::arch::{ArchError, parse_config};

    const LLAMA: &str = r#"{"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
        "vocab_size": 32000}"#;

    fn with(key: &str, value: serde_json::Value) -> Vec<u8> {
        let mut v: serde_json::Value = serde_json::from_str(LLAMA).unwrap();
        v[key] = value;
        serde_json::to_vec(&v).unwrap()
    }

    fn field_of(r: Result<moro_core::model::ModelSpec, ArchError>) -> String {
        match r {
            Err(ArchError::Field { field, .. }) => field,
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    #[test]
    fn baseline_parses() {
        assert_eq!(
            parse_config(LLAMA.as_bytes()).unwrap().total_params(),
            6_738_415_616
        );
    }

    #[test]
    fn absurd_sizes_name_the_field() {
        assert_eq!(
            field_of(parse_config(&with("hidden_size", (1u64 << 40).into()))),
            "hidden_size"
        );
        assert_eq!(
            field_of(parse_config(&with("hidden_size", 0.into()))),
            "hidden_size"
        );
        assert_eq!(
            field_of(parse_config(&with("vocab_size", (-5).into()))),
            "vocab_size"
        );
        assert_eq!(
            field_of(parse_config(&with("num_hidden_layers", "32".into()))),
            "num_hidden_layers"
        );
        assert_eq!(
            field_of(parse_config(&with("intermediate_size", 1.5.into()))),
            "intermediate_size"
        );
        assert_eq!(
            field_of(parse_config(&with("num_key_value_heads", 5.into()))),
            "num_key_value_heads"
        );
        assert_eq!(
            field_of(parse_config(&with("num_attention_heads", 96.into()))),
            "num_attention_heads"
        );
        assert_eq!(
            field_of(parse_config(&with("tie_word_embeddings", 1.into()))),
            "tie_word_embeddings"
        );
        assert_eq!(
            field_of(parse_config(&with("torch_dtype", "complex64".into()))),
            "torch_dtype"
        );
    }

    #[test]
    fn missing_fields_are_named() {
        let mut v: serde_json::Value = serde_json::from_str(LLAMA).unwrap();
        v.as_object_mut().unwrap().remove("num_hidden_layers");
        let e = parse_config(&serde_json::to_vec(&v).unwrap()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "config.json: field `num_hidden_layers` is missing"
        );
        assert_eq!(
            field_of(parse_config(br#"{"hidden_size": 4}"#)),
            "model_type"
        );
    }

    #[test]
    fn huge_but_bounded_sizes_error_instead_of_overflowing() {
        let json = r#"{"model_type": "mixtral", "hidden_size": 262144, "intermediate_size": 2097152,
            "num_hidden_layers": 4096, "num_attention_heads": 4096, "vocab_size": 8388608,
            "num_local_experts": 16384, "num_experts_per_tok": 2}"#;
        assert!(matches!(
            parse_config(json.as_bytes()),
            Err(ArchError::Field { .. })
        ));
    }

    #[test]
    fn unsupported_and_malformed() {
        match parse_config(br#"{"model_type": "whisper"}"#) {
            Err(ArchError::Unsupported {
                model_type,
                supported,
                closest,
            }) => {
                assert_eq!(model_type, "whisper");
                assert_eq!(closest, None, "nothing is near whisper");
                for t in [
                    "llama",
                    "gemma3",
                    "deepseek_v3",
                    "gpt_bigcode",
                    "bloom",
                    "qwen",
                ] {
                    assert!(supported.split(", ").any(|s| s == t), "{t} listed");
                }
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(parse_config(b"not json"), Err(ArchError::Json(_))));
        assert!(matches!(parse_config(b"[1, 2]"), Err(ArchError::Json(_))));
    }

    #[test]
    fn unsupported_names_the_closest_type() {
        let err = parse_config(br#"{"model_type": "falcon_h1"}"#).expect_err("unsupported");
        let message = err.to_string();
        assert!(
            message.starts_with(
                "unsupported model_type `falcon_h1` (the closest supported is `falcon`); supported: "
            ),
            "{message}"
        );
    }

    #[test]
    fn layer_types_must_match_layer_count() {
        let json = r#"{"model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
            "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 8,
            "vocab_size": 151936, "layer_types": ["full_attention"]}"#;
        assert_eq!(field_of(parse_config(json.as_bytes())), "layer_types");
    }

    proptest::proptest! {
        /// Any integer in any size field gives a spec or an error, never a panic; a returned
        /// spec can be counted without overflow.
        #[test]
        fn never_panics(key in proptest::sample::select(vec![
            "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "head_dim", "max_position_embeddings",
        ]), value in proptest::num::i64::ANY) {
            if let Ok(spec) = parse_config(&with(key, value.into())) {
                let _ = spec.total_params();
                let _ = spec.active_params();
            }
        }
    }
}

/// bert-large-uncased by hand from `modeling_bert.py`: `BertModel` has 335,141,888
/// parameters, `BertForSequenceClassification` adds `classifier` (1024 · 2 + 2).
#[test]
fn bert_large_by_hand() {
    let (h, i, l, v, pos, types) = (1024u64, 4096u64, 24u64, 30522u64, 512u64, 2u64);
    // word + position + token-type embeddings + embeddings.LayerNorm (weight, bias).
    let embeddings = v * h + pos * h + types * h + 2 * h;
    // query, key, value, attention.output.dense (biased H → H), intermediate.dense (H → I),
    // output.dense (I → H), two LayerNorms.
    let layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * 2 * h;
    assert_eq!(layer, 12_596_224);
    let pooler = h * h + h;
    let bert_model = embeddings + l * layer + pooler;
    assert_eq!(bert_model, 335_141_888);
    let spec = parse_config(include_bytes!(
        "../../../data/models/google-bert--bert-large-uncased.json"
    ))
    .expect("parses");
    let enc = spec.encoder.as_ref().expect("an encoder");
    assert_eq!(enc.num_labels, 2);
    assert_eq!(spec.total_params(), bert_model + h * 2 + 2);
    assert_eq!(spec.lm_head_params(), 0);
    assert_eq!(spec.num_layers, 24);
    assert_eq!(spec.layers[0].layer_params(), layer);
}

/// RoBERTa shares BERT's layout: roberta-base (vocab 50265, 514 positions, 1 token type)
/// with its 2-label head (`dense` H → H and `out_proj` H → 2) has 124,055,040
/// (`RobertaModel` without pooler; 124,645,632 with it) + 590,592 + 1,538 parameters.
#[test]
fn roberta_base_by_hand() {
    let cfg = br#"{"model_type": "roberta", "vocab_size": 50265, "hidden_size": 768,
        "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
        "max_position_embeddings": 514, "type_vocab_size": 1}"#;
    let spec = parse_config(cfg).expect("parses");
    let (h, i) = (768u64, 3072u64);
    let embeddings = 50265 * h + 514 * h + h + 2 * h;
    let layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 4 * h;
    assert_eq!(embeddings + 12 * layer, 124_055_040);
    assert_eq!(embeddings + 12 * layer + h * h + h, 124_645_632);
    assert_eq!(spec.total_params(), 124_055_040 + (h * h + h) + (h * 2 + 2));
    assert!(!spec.encoder.expect("an encoder").pooler_reads_view);
}

/// A pre-quantized checkpoint (Unsloth's `*-bnb-4bit`) declares its bitsandbytes storage in
/// `quantization_config`: NF4 with double quantization here, so a job on it is QLoRA unless
/// it says otherwise, and estimates as QLoRA on the base model's identical architecture.
#[test]
fn prequantized_checkpoints_default_to_their_storage() {
    use moro_core::estimate::{DeviceProfile, estimate};
    use moro_core::job::{JobSettings, Method, Quantization};
    let unsloth = catalog_spec("unsloth--llama-3-8b-bnb-4bit");
    assert_eq!(unsloth.prequantized, Some(Quantization::Nf4Dq));
    let base = catalog_spec("meta-llama--Meta-Llama-3-8B");
    assert_eq!(base.prequantized, None);
    let job = JobSettings::default().resolve_for(&unsloth).unwrap();
    assert_eq!(
        (job.method, job.quantization),
        (Method::QuantizedAdapters, Quantization::Nf4Dq)
    );
    let qlora = JobSettings {
        method: Some(Method::QuantizedAdapters),
        ..JobSettings::default()
    };
    let on_base = qlora.resolve_for(&base).unwrap();
    let lora = JobSettings {
        method: Some(Method::Adapters),
        ..JobSettings::default()
    };
    assert_eq!(
        lora.resolve_for(&unsloth).unwrap().method,
        Method::QuantizedAdapters
    );
    let full = JobSettings {
        method: Some(Method::Full),
        ..JobSettings::default()
    };
    let e = full.resolve_for(&unsloth).unwrap_err();
    assert_eq!(e.field, "method");
    assert!(e.message.contains("quantization_config"), "{}", e.message);
    let d = DeviceProfile::default();
    assert_eq!(
        estimate(&unsloth, &job, &d).unwrap().peak_device_bytes,
        estimate(&base, &on_base, &d).unwrap().peak_device_bytes
    );
}
