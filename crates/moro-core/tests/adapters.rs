//! lit-gpt's LLaMA-Adapter and Adapter v2: parameter counts by hand, and the measured rows of
//! lit-gpt's resource tables (`tutorials/resource-tables.md`, "Finetuning with Adapter on 1
//! GPU") predicted by `moro validate`.

use moro_core::catalog;
use moro_core::estimate::weights::AdapterParams;
use moro_core::estimate::{DeviceProfile, estimate};
use moro_core::job::{Job, Method, PeftKind, Precision, Quantization, Stack};
use moro_core::model::ModelSpec;
use moro_core::validation::{CatalogModels, Status, validate};

fn model(id: &str) -> ModelSpec {
    catalog::load(catalog::find(id).expect("catalog entry")).expect("catalog spec")
}

fn adapter_job(peft: PeftKind) -> Job {
    Job {
        method: Method::Adapters,
        adapter: moro_core::job::PeftConfig {
            method: peft,
            ..moro_core::job::PeftConfig::default()
        },
        stack: Stack::Litgpt,
        precision: Precision::Bf16,
        micro_batch_size: 1,
        seq_len: 1304,
        ..Job::default()
    }
}

/// Llama-2-7B: 32 layers, n_embd 4096, 32 heads, MLP 11008, vocabulary 32000.
///
/// v1 (`lit_gpt/adapter.py`): layers 2..31 (30) each hold `adapter_wte` (10 × 4096) and a
/// `gating_factor` (1, 1, 32, 1): 30 · (40,960 + 32) = 1,229,760.
///
/// v2 (`lit_gpt/adapter_v2.py`) adds, per layer, `adapter_bias` + `adapter_scale` on every
/// Linear: 2 · (qkv 12,288 + proj 4096 + fc_1 11,008 + fc_2 11,008 + proj 4096) = 84,992,
/// and the two RMSNorm weights (2 · 4096); then `ln_f` (4096) and lm_head's pair (2 · 32,000):
/// 32 · (84,992 + 8192) + 4096 + 64,000 = 3,049,984, 4,279,744 in all. Both are the counts
/// lit-gpt printed for the resource table.
#[test]
fn llama2_7b_adapter_parameters_by_hand() {
    let m = model("meta-llama/Llama-2-7b-hf");
    let v1 = AdapterParams::new(&m, PeftKind::LlamaAdapter);
    assert_eq!(v1.prefix, 30 * 10 * 4096);
    assert_eq!(v1.gating, 30 * 32);
    assert_eq!(v1.trainable(), 1_229_760);
    // `adapter_wte` never gets a gradient (the no-grad adapter kv cache, litgpt#1287).
    assert_eq!(v1.with_grad(), 30 * 32);

    let v2 = AdapterParams::new(&m, PeftKind::AdapterV2);
    let per_layer = 2 * (12_288 + 4096 + 11_008 + 11_008 + 4096) + 2 * 4096;
    assert_eq!(
        v2.trainable() - v1.trainable(),
        32 * per_layer + 4096 + 2 * 32_000
    );
    assert_eq!(v2.trainable(), 4_279_744);
    assert_eq!(v2.norms, 32 * 2 * 4096 + 4096);

    // The estimate reports lit-gpt's trainable count.
    let e = estimate(
        &m,
        &adapter_job(PeftKind::AdapterV2),
        &DeviceProfile::default(),
    )
    .expect("estimate");
    assert_eq!(e.trainable_params, 4_279_744);
    // LoRA jobs have no adapter parameters.
    assert_eq!(AdapterParams::new(&m, PeftKind::Lora).trainable(), 0);
}

/// StableLM-Alpha-3B (GPT-NeoX: 16 layers, 4096 wide, 32 heads, LayerNorms with bias,
/// MLP 16384, padded vocabulary 50688): v1 14 · (40,960 + 32) = 573,888; v2 adds
/// 16 · (2 · (12,288 + 4096 + 16,384 + 4096) + 2 · 2 · 4096) + 2 · 4096 + 2 · 50,688.
#[test]
fn stablelm_3b_adapter_parameters_by_hand() {
    let m = model("stabilityai/stablelm-base-alpha-3b");
    assert_eq!(
        AdapterParams::new(&m, PeftKind::LlamaAdapter).trainable(),
        573_888
    );
    let per_layer = 2 * (12_288 + 4096 + 16_384 + 4096) + 2 * 2 * 4096;
    assert_eq!(
        AdapterParams::new(&m, PeftKind::AdapterV2).trainable(),
        573_888 + 16 * per_layer + 2 * 4096 + 2 * 50_688
    );
    assert_eq!(
        AdapterParams::new(&m, PeftKind::AdapterV2).trainable(),
        2_125_248
    );
}

/// Activations: v1 saves nothing in the layers before `adapter_start_layer`; v2 saves every
/// layer plus each Linear's pre-scale output and the trainable norms' outputs.
#[test]
fn adapter_v2_saves_more_than_v1() {
    let m = model("meta-llama/Llama-2-7b-hf");
    let d = DeviceProfile::default();
    let act = |peft| {
        estimate(&m, &adapter_job(peft), &d)
            .expect("estimate")
            .phase_component(
                moro_core::estimate::Phase::ForwardEnd,
                moro_core::estimate::Component::Activations,
            )
    };
    let v1 = act(PeftKind::LlamaAdapter);
    let v2 = act(PeftKind::AdapterV2);
    // Per token and layer v2 adds at least 2·(5h + 2I) bytes of pre-scale outputs and
    // 2 · 4h of fp32 `x_normed` over 29 fully saved v1 layers: more than 3 GiB at 1304 tokens.
    assert!(v2 > v1 + 3 * (1 << 30), "v1 {v1} v2 {v2}");
}

/// The adapters are lit-gpt's: another stack, or a full fine-tune, is refused.
#[test]
fn adapters_need_litgpt_and_a_frozen_base() {
    let m = model("meta-llama/Llama-2-7b-hf");
    let d = DeviceProfile::default();
    let hf = Job {
        stack: Stack::Hf,
        ..adapter_job(PeftKind::LlamaAdapter)
    };
    assert_eq!(estimate(&m, &hf, &d).expect_err("hf").field, "peft");
    let full = Job {
        method: Method::Full,
        ..adapter_job(PeftKind::AdapterV2)
    };
    assert_eq!(estimate(&m, &full, &d).expect_err("full").field, "peft");
    let q = Job {
        method: Method::QuantizedAdapters,
        quantization: Quantization::Nf4,
        ..adapter_job(PeftKind::AdapterV2)
    };
    assert!(estimate(&m, &q, &d).is_ok());
}

/// The eight adapter rows of lit-gpt's resource tables are covered and predicted within 6%
/// each (mean within 3%).
///
/// The bound: the lit-gpt LoRA rows of the same tables, on the same base, loss and quantized
/// weight accounting, are predicted within about 1.5% for these two models; the adapter terms
/// are derived from the code, not fitted, so their own error adds on top. Predictions at the
/// time of writing: Llama-2-7B rows within ±1.1%, unquantized StableLM within +0.8%, the
/// quantized StableLM rows +3.0% to +4.2% (over by 0.15–0.2 GiB on 5–7 GiB, unexplained: the
/// shared base terms over-predict the same step from bf16 to nf4 by less on the LoRA rows).
/// 6% leaves room for that; the mean bound catches a drift of all rows together.
#[test]
fn resource_table_adapter_rows_are_predicted() {
    let text = include_str!("../../../validation/measured.jsonl");
    let report = validate(text, &CatalogModels, false);
    let ids = [
        "litgpt-resource-tables-032",
        "litgpt-resource-tables-034",
        "litgpt-resource-tables-035",
        "litgpt-resource-tables-036",
        "litgpt-resource-tables-038",
        "litgpt-resource-tables-039",
        "litgpt-resource-tables-040",
        "litgpt-resource-tables-042",
    ];
    let mut sum = 0.0;
    for id in ids {
        let row = report
            .rows
            .iter()
            .find(|r| r.id == id)
            .unwrap_or_else(|| panic!("{id} missing"));
        assert_eq!(row.status, Status::Ok, "{id}: {:?}", row.reason);
        let e = row.error.expect("error");
        eprintln!("{id}: {:+.2}%", e * 100.0);
        assert!(e.abs() <= 0.06, "{id}: {:+.2}%", e * 100.0);
        sum += e.abs();
    }
    assert!(sum / 8.0 <= 0.03, "mean |error| {:.2}%", sum / 8.0 * 100.0);
}

/// litgpt's LoRA on its own modules (`litgpt/lora.py` @f247be87, `convert_hf_checkpoint.py`
/// `copy_weights_phi3`), counted by hand for Phi-3-mini (H 3072, I 8192, 32 layers) at r 8
/// on query, key, value, projection and mlp: the fused qkv's `lora_A` is 3r × H and its
/// `lora_B` 3H × r (one pair per slice); the attention projection r · 2H; Phi-3's
/// `gate_up_proj` becomes `fc_1` and `fc_2`, r · (H + I) each; the MLP projection
/// r · (I + H). `calibration/litgpt_trace.py` counts the same 14,942,208 (15,223,296 with
/// lm_head's r · (H + V), which moro does not adapt). transformers' fused `gate_up_proj` under
/// PEFT is one LoRA of r · (H + 2I).
#[test]
fn litgpt_splits_phi3_fused_projections() {
    use moro_core::job::Targets;
    use moro_core::job::settings::JobSettings;
    let m = model("microsoft/Phi-3-mini-4k-instruct");
    let (h, i, r) = (3072, 8192, 8);
    let per_layer = (3 * r * h + 3 * h * r) + r * 2 * h + 2 * r * (h + i) + r * (i + h);
    let job = |stack| {
        JobSettings {
            method: Some(Method::Adapters),
            stack: Some(stack),
            lora_rank: Some(r),
            target_modules: Some(Targets::Names(
                ["query", "key", "value", "projection", "mlp"]
                    .map(String::from)
                    .to_vec(),
            )),
            seq_len: Some(512),
            ..JobSettings::default()
        }
        .resolve_for(&m)
        .unwrap()
    };
    let trainable = |stack| {
        estimate(&m, &job(stack), &DeviceProfile::default())
            .unwrap()
            .trainable_params
    };
    assert_eq!(trainable(Stack::Litgpt), 32 * per_layer);
    assert_eq!(trainable(Stack::Litgpt), 14_942_208);
    let peft = (r * (h + 3 * h)) + r * 2 * h + r * (h + 2 * i) + r * (i + h);
    assert_eq!(trainable(Stack::Hf), 32 * peft);
}
