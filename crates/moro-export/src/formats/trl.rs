//! TRL: an `SFTTrainer` script (and the `trl sft` command line).

use moro_core::job::LossImpl;

use super::*;
use crate::ExportError;
use crate::json::to_json;
use crate::plan::{Dist, Plan};
use crate::python::{Py, call, code};
use crate::value::{Map, Value};

/// `load_dataset(...)` for a hub id or a local file.
pub(super) fn load_dataset_call(dataset: &str) -> String {
    match local_data_type(dataset) {
        Some(kind) => format!(
            "load_dataset({}, data_files={}, split=\"train\")",
            crate::json::string(kind),
            crate::json::string(dataset)
        ),
        None => format!(
            "load_dataset({}, split=\"train\")",
            crate::json::string(dataset)
        ),
    }
}

/// The dataset lines of a TRL / Unsloth script: `load_dataset(...)`, then Alpaca-style rows
/// (instruction, optional input, output: `yahma/alpaca-cleaned`, `tatsu-lab/alpaca`) written
/// out as one `text` each, since `SFTTrainer` reads only a `text`, `messages` or
/// `prompt`/`completion` column (TRL 1.x `SFTTrainer._prepare_dataset`). `eos` is the
/// expression of the end-of-text token to append; `None` where `SFTTrainer` appends it.
pub(super) fn dataset_lines(dataset: &str, eos: Option<&str>) -> String {
    const ALPACA: &str = r####"

def alpaca_text(rows):
    """Alpaca-style rows (instruction, optional input, output) as one training text each."""
    inputs = rows["input"] if "input" in rows else [""] * len(rows["instruction"])
    texts = []
    for instruction, context, output in zip(rows["instruction"], inputs, rows["output"]):
        text = f"### Instruction:\n{instruction}\n\n"
        if context:
            text += f"### Input:\n{context}\n\n"
        texts.append(text + f"### Response:\n{output}"END)
    return {"text": texts}


# SFTTrainer trains on a `text`, `messages` or `prompt`/`completion` column: Alpaca-style
# rows are written out as text first.
if {"instruction", "output"} <= set(dataset.column_names):
    dataset = dataset.map(alpaca_text, batched=True, remove_columns=dataset.column_names)

"####;
    let end = eos.map_or(String::new(), |e| format!(" + {e}"));
    format!(
        "dataset = {}\n{}",
        load_dataset_call(dataset),
        ALPACA.replace("END)", &format!("{end})"))
    )
}

/// SFTConfig keyword arguments (TRL ≥ 0.20 names: `max_length`, not `max_seq_length`).
pub(super) fn sft_config_kwargs(
    p: &Plan<'_>,
    w: &mut Vec<String>,
    loss_type: bool,
) -> Vec<(String, Py)> {
    let mut m = Map::new();
    hf_training_args(p, &mut m, w);
    let mut kw: Vec<(String, Py)> = Vec::new();
    kw.push(("max_length".to_owned(), p.t.max_seq_length.into()));
    kw.push(("packing".to_owned(), p.t.packing.into()));
    if loss_type {
        match p.loss {
            LossImpl::ChunkedNll => kw.push(("loss_type".to_owned(), "chunked_nll".into())),
            LossImpl::Standard | LossImpl::StandardLegacy | LossImpl::StandardNoUpcast => {
                kw.push(("loss_type".to_owned(), "nll".into()))
            }
            LossImpl::Fused => {}
            LossImpl::Chunked => {
                w.push(
                    "training.loss = chunked (litgpt/torchtune): TRL's nearest is loss_type=\"chunked_nll\"; exported as that"
                        .to_owned(),
                );
                kw.push(("loss_type".to_owned(), "chunked_nll".into()));
            }
        }
    }
    for (k, v) in m.0 {
        kw.push((k, Py::Lit(v)));
    }
    kw
}

/// `SFTConfig` fields a command line cannot set: typed `Optional[dict]`, they get argparse's
/// `type=dict`, which no string passes (transformers 5.25 `HfArgumentParser`; checked with
/// TRL 1.16's `TrlParser`). `gradient_checkpointing_kwargs` is typed `dict | str` and reads
/// JSON, so it can.
const DICT_ONLY_FIELDS: &[&str] = &["liger_kernel_config"];

/// `trl sft` command-line arguments equivalent to the script, or why none are (a comment's
/// lines).
pub(super) fn trl_cli(
    p: &Plan<'_>,
    dataset: &str,
    sft: &[(String, Py)],
) -> Result<Vec<String>, String> {
    if let Some(field) = DICT_ONLY_FIELDS
        .iter()
        .find(|f| sft.iter().any(|(k, _)| k == *f))
    {
        return Err(format!(
            "{field} is a dict, which TRL's parser\n# reads only from a --config file."
        ));
    }
    if p.is_peft() && p.adapter.method != moro_core::job::PeftKind::Lora {
        return Err(format!(
            "TRL's `--use_peft` builds LoRA, not\n# `{}`.",
            p.adapter.method.as_str()
        ));
    }
    let mut a: Vec<(String, String)> = vec![
        ("model_name_or_path".into(), p.base.clone()),
        ("dataset_name".into(), dataset.to_owned()),
        ("dtype".into(), p.torch_dtype().to_owned()),
        ("attn_implementation".into(), p.hf_attention().to_owned()),
    ];
    if p.is_peft() {
        a.push(("use_peft".into(), "true".into()));
        a.push(("lora_r".into(), p.adapter.rank.to_string()));
        a.push((
            "lora_alpha".into(),
            crate::value::float_text(p.adapter.alpha)
                .trim_end_matches(".0")
                .to_owned(),
        ));
        a.push((
            "lora_dropout".into(),
            crate::value::float_text(p.adapter.dropout),
        ));
        let targets = if p.all_linear() {
            vec!["all-linear".to_owned()]
        } else {
            p.target_names().0
        };
        a.push(("lora_target_modules".into(), targets.join(" ")));
        if p.adapter.dora {
            a.push(("use_dora".into(), "true".into()));
        }
    }
    if p.bnb4() {
        a.push(("load_in_4bit".into(), "true".into()));
        a.push(("bnb_4bit_quant_type".into(), p.bnb_quant_type().into()));
        a.push(("use_bnb_nested_quant".into(), p.double_quant().to_string()));
    } else if p.int8() {
        a.push(("load_in_8bit".into(), "true".into()));
    }
    for (k, v) in sft {
        let text = match v {
            Py::Lit(Value::Str(s)) => s.clone(),
            Py::Lit(Value::Bool(b)) => b.to_string(),
            Py::Lit(Value::Int(i)) => i.to_string(),
            Py::Lit(Value::Float(f)) => crate::value::float_text(*f),
            Py::Lit(Value::Map(m)) => serde_like_json(m),
            _ => continue,
        };
        a.push((k.clone(), text));
    }
    Ok(a.into_iter()
        .map(|(k, v)| format!("--{k} {}", shell_word(&v)))
        .collect())
}

pub(super) fn serde_like_json(m: &Map) -> String {
    to_json(&Value::Map(m.clone()))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join("")
}

/// A shell word: bare when safe, else single-quoted.
pub(super) fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/' | ':' | '=' | ',')
        })
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

pub(super) fn kw(v: &[(String, Py)]) -> Vec<(&str, Py)> {
    v.iter().map(|(k, p)| (k.as_str(), p.clone())).collect()
}

/// `device_map` for a quantized model without sharded parameters: each process its own GPU.
pub(super) const KBIT_DEVICE_MAP: &str = "{\"\": int(os.environ.get(\"LOCAL_RANK\", \"0\"))}";

pub(crate) fn trl(p: &Plan<'_>, main: &str) -> Result<Out, ExportError> {
    let mut w = Vec::new();
    stack_warning(p, "TRL", HF_STACKS, &mut w);
    quant_gptq_note(p, "transformers", &mut w);
    let dataset = p.dataset_or("trl-lib/Capybara", &mut w);
    let sft = sft_config_kwargs(p, &mut w, true);
    let launch = script_launch(p, main);

    let mut s = script_header(p, "TRL SFTTrainer", &launch, &mut w);
    match trl_cli(p, &dataset, &sft) {
        Ok(args) => {
            s.push_str(
                "#\n# The same run with the `trl sft` command line (for a dataset with a `text`,\n\
                 # `messages` or `prompt`/`completion` column; it skips this script's Alpaca rows):\n\
                 #   trl sft",
            );
            for arg in args {
                s.push_str(&format!(" \\\n#     {arg}"));
            }
        }
        Err(why) => s.push_str(&format!(
            "#\n# No `trl sft` command line says this run: {why}",
        )),
    }
    s.push_str("\n\nimport os\n\nimport torch\nfrom datasets import load_dataset\n");
    let peft = if p.is_peft() {
        Some(peft_config(p)?)
    } else {
        None
    };
    if let Some((class, _)) = &peft {
        s.push_str(&format!("from peft import {class}\n"));
    }
    if p.bnb4() || p.int8() {
        s.push_str("from transformers import AutoModelForCausalLM, BitsAndBytesConfig\n");
    } else {
        s.push_str("from transformers import AutoModelForCausalLM\n");
    }
    s.push_str("from trl import SFTConfig, SFTTrainer\n\n");
    s.push_str(&format!("MODEL = {}\n\n", crate::json::string(&p.base)));

    let mut model_kw: Vec<(&str, Py)> = vec![
        ("dtype", code(format!("torch.{}", p.torch_dtype()))),
        ("attn_implementation", p.hf_attention().into()),
    ];
    if let Some(bnb) = bnb_kwargs(p) {
        s.push_str(&format!(
            "quantization_config = {}\n\n",
            call("BitsAndBytesConfig", &[], &bnb, 0)
        ));
        model_kw.push(("quantization_config", code("quantization_config")));
        if !p.dist.shards_params() {
            model_kw.push(("device_map", code(KBIT_DEVICE_MAP)));
        }
    }
    // The arguments come first: with ZeRO-3 their DeepSpeed config must exist before
    // `from_pretrained`, which only then loads the weights partitioned (`zero.Init`, through
    // transformers' `is_deepspeed_zero3_enabled`).
    if matches!(p.dist, Dist::Zero { stage: 3, .. }) {
        s.push_str(
            "# SFTConfig first: ZeRO-3 partitions the weights as they load only when its DeepSpeed\n\
             # config exists before from_pretrained (else every rank loads the whole model).\n",
        );
    }
    s.push_str(&format!(
        "training_args = {}\n\n",
        call("SFTConfig", &[], &kw(&sft), 0)
    ));
    s.push_str(&format!(
        "model = {}\n\n",
        call(
            "AutoModelForCausalLM.from_pretrained",
            &[code("MODEL")],
            &model_kw,
            0
        )
    ));
    if let Some((class, kwargs)) = &peft {
        s.push_str(&format!(
            "peft_config = {}\n\n",
            call(class, &[], kwargs, 0)
        ));
    }
    s.push_str(&dataset_lines(&dataset, None));
    let mut trainer_kw: Vec<(&str, Py)> = vec![
        ("model", code("model")),
        ("args", code("training_args")),
        ("train_dataset", code("dataset")),
    ];
    if p.is_peft() {
        trainer_kw.push(("peft_config", code("peft_config")));
    }
    Ok(sft_script_out(p, main, s, &trainer_kw, w, launch))
}

/// The opening comment of a TRL / Unsloth script: what wrote it from which recipe, how to run
/// it, and on several nodes how each one starts.
pub(super) fn script_header(p: &Plan<'_>, what: &str, launch: &str, w: &mut Vec<String>) -> String {
    let mut s = format!(
        "# {what} script, written by moro {} from recipe `{}`.\n",
        env!("CARGO_PKG_VERSION"),
        p.name
    );
    s.push_str("# Edit the recipe and export again rather than editing this file.\n");
    s.push_str(&format!("# Run: {launch}\n"));
    s.push_str(&script_node_header(p, w));
    s
}

/// Ends a TRL / Unsloth script with the `SFTTrainer` call, training and saving, and returns
/// it with the launcher companions (DeepSpeed or accelerate config).
pub(super) fn sft_script_out(
    p: &Plan<'_>,
    main: &str,
    mut s: String,
    trainer_kw: &[(&str, Py)],
    mut w: Vec<String>,
    launch: String,
) -> Out {
    s.push_str(&format!(
        "trainer = {}\n",
        call("SFTTrainer", &[], trainer_kw, 0)
    ));
    s.push_str("trainer.train()\ntrainer.save_model()\n");
    let mut files = vec![file(main, s)];
    files.extend(script_companions(p, &mut w));
    Out {
        files,
        warnings: w,
        launch,
    }
}

pub(super) fn bnb_kwargs(p: &Plan<'_>) -> Option<Vec<(&'static str, Py)>> {
    if p.bnb4() {
        let mut v: Vec<(&'static str, Py)> = vec![
            ("load_in_4bit", true.into()),
            ("bnb_4bit_quant_type", p.bnb_quant_type().into()),
            ("bnb_4bit_use_double_quant", p.double_quant().into()),
            (
                "bnb_4bit_compute_dtype",
                code(format!("torch.{}", p.torch_dtype())),
            ),
        ];
        if p.dist.shards_params() {
            // ZeRO-3 / FSDP shard the packed 4-bit weights as tensors of the compute dtype.
            v.push((
                "bnb_4bit_quant_storage",
                code(format!("torch.{}", p.torch_dtype())),
            ));
        }
        Some(v)
    } else if p.int8() {
        Some(vec![("load_in_8bit", true.into())])
    } else {
        None
    }
}

/// Keyword arguments of a Python call, in order.
type Kwargs = Vec<(&'static str, Py)>;

/// The PEFT config class and its arguments for the recipe's method (PEFT 0.21.2 names):
/// LoRA's [`lora_kwargs`]; the others with the settings moro estimates them by, each the
/// rest at PEFT's defaults. AdaLoRA is refused: its rank allocation needs
/// `update_and_allocate` after every optimizer step, which `SFTTrainer` never calls.
fn peft_config(p: &Plan<'_>) -> Result<(&'static str, Kwargs), ExportError> {
    use moro_core::job::PeftKind as K;
    let a = &p.adapter;
    let targets = || -> Py {
        if p.all_linear() {
            "all-linear".into()
        } else {
            Value::from(p.target_names().0).into()
        }
    };
    let task: (&'static str, Py) = ("task_type", "CAUSAL_LM".into());
    let (class, mut kw): (&'static str, Kwargs) = match a.method {
        K::Lora => return Ok(("LoraConfig", lora_kwargs(p))),
        K::LoHa => (
            "LoHaConfig",
            vec![
                ("r", a.rank.into()),
                ("alpha", Py::Lit(p.alpha())),
                ("target_modules", targets()),
            ],
        ),
        K::LoKr => {
            let mut v = vec![
                ("r", a.rank.into()),
                ("alpha", Py::Lit(p.alpha())),
                ("target_modules", targets()),
            ];
            if let Some(f) = a.decompose_factor {
                v.push(("decompose_factor", f.into()));
            }
            ("LoKrConfig", v)
        }
        // moro's rank is OFT's block count (`r`), the block size then follows from it.
        K::Oft => (
            "OFTConfig",
            vec![
                ("r", a.rank.into()),
                ("oft_block_size", 0u64.into()),
                ("target_modules", targets()),
            ],
        ),
        K::Boft => (
            "BOFTConfig",
            vec![
                ("boft_block_size", a.boft_block_size().into()),
                ("boft_n_butterfly_factor", a.boft_butterfly_factor().into()),
                ("target_modules", targets()),
            ],
        ),
        K::Vera => (
            "VeraConfig",
            vec![
                ("r", a.rank.into()),
                ("vera_dropout", a.dropout.into()),
                ("target_modules", targets()),
            ],
        ),
        K::Ia3 => {
            let mut v = vec![("target_modules", targets())];
            if let Some(moro_core::job::Targets::Names(ff)) = &a.feedforward {
                v.push(("feedforward_modules", Value::from(ff.clone()).into()));
            }
            ("IA3Config", v)
        }
        K::LnTuning => ("LNTuningConfig", Vec::new()),
        K::PromptTuning => (
            "PromptTuningConfig",
            vec![("num_virtual_tokens", a.virtual_tokens.into())],
        ),
        K::PrefixTuning => (
            "PrefixTuningConfig",
            vec![("num_virtual_tokens", a.virtual_tokens.into())],
        ),
        K::AdaLora => {
            return Err(ExportError::field(
                "model.peft",
                "`adalora`: its rank allocation needs `model.update_and_allocate(step)` after \
                 every optimizer step, which SFTTrainer never calls; write the loop by hand \
                 (moro estimate sizes it)",
            ));
        }
        other => {
            return Err(ExportError::field(
                "model.peft",
                format!(
                    "`{}` is lit-gpt's own; export it with litgpt's `finetune` command",
                    other.as_str()
                ),
            ));
        }
    };
    kw.push(task);
    Ok((class, kw))
}

pub(super) fn lora_kwargs(p: &Plan<'_>) -> Vec<(&'static str, Py)> {
    let targets: Py = if p.all_linear() {
        "all-linear".into()
    } else {
        Value::from(p.target_names().0).into()
    };
    let mut v: Vec<(&'static str, Py)> = vec![
        ("r", p.adapter.rank.into()),
        ("lora_alpha", Py::Lit(p.alpha())),
        ("lora_dropout", p.adapter.dropout.into()),
        ("target_modules", targets),
        ("bias", "none".into()),
        ("task_type", "CAUSAL_LM".into()),
    ];
    if p.adapter.dora {
        v.push(("use_dora", true.into()));
    }
    v
}

// ---------------------------------------------------------------------------------------------
