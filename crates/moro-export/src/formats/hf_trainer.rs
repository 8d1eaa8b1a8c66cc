//! HF Trainer: `TrainingArguments` as JSON.

use moro_recipe::choices::Quantization;

use super::*;
use crate::ExportError;
use crate::json::to_json;
use crate::plan::Plan;
use crate::python::literal;
use crate::value::{Map, Value};

pub(crate) fn hf_trainer(p: &Plan<'_>, main: &str) -> Result<Out, ExportError> {
    let mut w = Vec::new();
    let mut m = Map::new();
    hf_training_args(p, &mut m, &mut w);
    hf_loss_warning(p, "the HF Trainer", &mut w);
    stack_warning(p, "the HF Trainer", HF_STACKS, &mut w);
    // What TrainingArguments has no field for: loading and adapting the model, the data.
    w.push(format!(
        "TrainingArguments has no fields for the model: load `{}` with dtype={}, attn_implementation={}{} in your script",
        p.base,
        p.torch_dtype(),
        p.hf_attention(),
        match p.quant {
            Quantization::None => String::new(),
            q => format!(" and quantization {q} (BitsAndBytesConfig)"),
        }
    ));
    if p.is_peft() {
        w.push(format!(
            "TrainingArguments has no fields for LoRA: wrap the model with peft LoraConfig(r={}, lora_alpha={}, \
             lora_dropout={}, target_modules={}{})",
            p.adapter.rank,
            literal(&p.alpha()),
            crate::value::float_text(p.adapter.dropout),
            if p.all_linear() { "\"all-linear\"".to_owned() } else { literal(&Value::from(p.target_names().0)) },
            if p.adapter.dora { ", use_dora=True" } else { "" }
        ));
    }
    w.push(format!(
        "TrainingArguments has no fields for the data: tokenize to max_seq_length = {}{}",
        p.t.max_seq_length,
        if p.t.packing { ", packed" } else { ", padded" }
    ));
    let mut files = vec![file(main, to_json(&Value::Map(m)))];
    files.extend(script_companions(p, &mut w));
    w.extend(node_warning(p, script_launcher(p)));
    Ok(Out {
        files,
        warnings: w,
        launch: script_launch(p, &format!("<train.py> {main}")),
    })
}

// ---------------------------------------------------------------------------------------------
