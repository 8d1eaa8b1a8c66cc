//! MLX: a config for `mlx_lm.lora --config` (mlx-lm 0.32 `lora.py` `CONFIG_DEFAULTS`), and
//! for QLoRA the `mlx_lm.convert` that makes its quantized model.

use moro_recipe::choices::{Optimizer, Precision, Stack};

use super::*;
use crate::ExportError;
use crate::plan::{Dist, Plan};
use crate::value::Map;

/// The MLX-quantized copy of a base model that `mlx_lm.convert` writes, and the command, when
/// the job trains on MLX-quantized weights; `None` for a 16-bit base.
pub(crate) fn mlx_convert(p: &Plan<'_>) -> Option<(String, String)> {
    let q = mlx_quantization(p).mlx()?;
    let name = p.base.rsplit('/').next().unwrap_or(&p.base);
    let path = format!("mlx_model/{name}-{}bit-g{}", q.bits, q.group_size);
    let command = format!(
        "mlx_lm.convert --hf-path {} --mlx-path {path} -q --q-bits {} --q-group-size {}",
        p.base, q.bits, q.group_size
    );
    Some((path, command))
}

/// The MLX storage of the recipe's base: its own, or for a bitsandbytes base planned on
/// another stack MLX's of the same width (4-bit NF4/FP4 → `mlx-4bit`, LLM.int8 → `mlx-8bit`).
fn mlx_quantization(p: &Plan<'_>) -> moro_core::job::Quantization {
    use moro_core::job::Quantization as Q;
    match Q::from(p.quant) {
        q if q.mlx().is_some() => q,
        q if q.is_bnb4() || q == Q::Gptq4 => Q::Mlx4,
        Q::Int8 => Q::Mlx8,
        _ => Q::None,
    }
}

/// `mlx_lm.lora`'s `lora_parameters.keys` for moro's target names: paths inside a decoder
/// block (`self_attn.q_proj`, `mlp.down_proj`), as mlx-lm's Llama-style models name them.
fn mlx_keys(p: &Plan<'_>) -> Vec<String> {
    let (names, _) = p.target_names();
    names
        .iter()
        .map(|n| {
            let attention = p.model.is_some_and(|m| {
                m.linears()
                    .any(|(_, l)| &l.name == n && l.role == moro_core::model::LinearRole::Attention)
            }) || ["q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj"]
                .contains(&n.as_str());
            format!("{}.{n}", if attention { "self_attn" } else { "mlp" })
        })
        .collect()
}

pub(crate) fn mlx(p: &Plan<'_>, main: &str) -> Result<Out, ExportError> {
    let mut w = Vec::new();
    stack_warning(p, "mlx_lm", &[Stack::Mlx], &mut w);
    if !matches!(p.dist, Dist::Single) {
        w.push(
            "parallel: mlx_lm.lora trains on one Mac here; the config is for one device".to_owned(),
        );
    }
    let storage = mlx_quantization(p);
    if moro_core::job::Quantization::from(p.quant) != storage {
        w.push(format!(
            "model.quantization = {}: MLX does not load bitsandbytes or GPTQ weights; exported \
             as {}, MLX's own of the same width",
            p.quant,
            storage.as_str()
        ));
    }
    if !matches!(p.precision, Precision::Bf16) {
        w.push(format!(
            "training.precision = {}: MLX has no autocast and trains in the model's saved dtype",
            p.precision
        ));
    }
    let convert = mlx_convert(p);
    let mut m = Map::new();
    m.set(
        "model",
        convert.as_ref().map_or(p.base.clone(), |c| c.0.clone()),
    );
    m.set("train", true);
    let dataset = p.dataset_or("mlx-community/WikiSQL", &mut w);
    m.set("data", mlx_data(&dataset, &mut w));
    m.set(
        "fine_tune_type",
        match (p.is_peft(), p.adapter.dora) {
            (false, _) => "full",
            (true, false) => "lora",
            (true, true) => "dora",
        },
    );
    let optimizer = match p.optimizer {
        Optimizer::AdamwTorch | Optimizer::AdamwTorchFused => "adamw",
        Optimizer::Sgd | Optimizer::SgdMomentum => "sgd",
        o => {
            w.push(format!(
                "training.optimizer = {o}: mlx_lm has no such optimizer; exported as adamw"
            ));
            "adamw"
        }
    };
    m.set("optimizer", optimizer);
    if p.optimizer == Optimizer::SgdMomentum {
        let mut sgd = Map::new();
        sgd.set("momentum", 0.9);
        let mut config = Map::new();
        config.set("sgd", Value::Map(sgd));
        m.set("optimizer_config", Value::Map(config));
    }
    // `-1`: every layer.
    m.set(
        "num_layers",
        p.adapted_layers
            .and_then(|n| i64::try_from(n).ok())
            .unwrap_or(-1),
    );
    m.set("batch_size", p.t.micro_batch_size);
    m.set("grad_accumulation_steps", p.grad_accum);
    m.set("iters", 1000_u64);
    w.push(
        "iters = 1000 (mlx_lm's default): mlx_lm counts steps, not epochs; set it for your data"
            .to_owned(),
    );
    m.set("learning_rate", p.t.learning_rate.unwrap_or(1e-5));
    // The batch is cut at `max_seq_length` tokens and the model reads all but the last
    // (`iterate_batches`, `default_loss`: `inputs = batch[:, :-1]`).
    m.set("max_seq_length", p.t.max_seq_length + 1);
    m.set("grad_checkpoint", p.checkpointing);
    m.set("adapter_path", &p.output_dir);
    m.set("save_every", 100_u64);
    m.set("steps_per_report", LOGGING_STEPS);
    m.set("seed", 0_u64);
    if p.is_peft() {
        let mut lora = Map::new();
        lora.set("rank", p.adapter.rank);
        #[allow(clippy::cast_precision_loss)]
        let scale = p.adapter.alpha / p.adapter.rank.max(1) as f64;
        lora.set("scale", scale);
        lora.set("dropout", p.adapter.dropout);
        // No `keys`: every Linear of each adapted block (`get_keys_for_lora`).
        if !p.all_linear() {
            lora.set("keys", Value::from(mlx_keys(p)));
        }
        m.set("lora_parameters", Value::Map(lora));
    }
    let train = format!("mlx_lm.lora --config {main}");
    let launch = match &convert {
        Some((_, command)) => format!("{command} && {train}"),
        None => train,
    };
    let mut header = p.header("mlx_lm.lora config");
    header.push(
        "max_seq_length is one more than the tokens the model reads (mlx_lm drops the last)."
            .to_owned(),
    );
    header.push(format!("Run: {launch}"));
    Ok(Out {
        files: vec![file(main, to_yaml(&Value::Map(m), &header))],
        warnings: w,
        launch,
    })
}

/// `data:` as mlx_lm reads it: a Hub id, or a local folder holding `train.jsonl` (and
/// `valid.jsonl`, `test.jsonl`; mlx-lm 0.32 `tuner/datasets.py` `load_local_dataset`). A
/// recipe's `…/train.jsonl` becomes its folder; another local file is named with a warning,
/// since mlx_lm would find no training set in it.
fn mlx_data(dataset: &str, w: &mut Vec<String>) -> String {
    if local_data_type(dataset).is_none() {
        return dataset.to_owned();
    }
    let path = std::path::Path::new(dataset);
    let folder = path
        .parent()
        .map(|d| d.to_string_lossy().into_owned())
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| ".".to_owned());
    if path.file_name().is_none_or(|n| n != "train.jsonl") {
        w.push(format!(
            "training.dataset = {dataset}: mlx_lm reads `train.jsonl` and `valid.jsonl` from a \
             folder; save the rows as {folder}/train.jsonl (JSON Lines)"
        ));
    }
    folder
}
