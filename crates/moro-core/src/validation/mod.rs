//! Reading measured peak-memory rows (`validation/measured.jsonl`, schema in
//! `validation/README.md`) into jobs, and scoring predictions against them.
//!
//! The rows were written by people, from papers, READMEs and benchmark tables: their fields
//! are partly free text (`"bf16 AMP (--bf16 True)"`, `"bnb.optim.PagedAdamW (32-bit,
//! paged)"`). [`interpret`] reads them by keywords, the same way for every row, so that rows
//! moro has never seen are read the same way. What a row describes that moro does not model
//! (other PEFT methods, encoder models, activation offload) is skipped with a reason.

mod row;
mod stats;

pub use row::*;
pub use stats::*;

use serde::Serialize;
use serde_json::Value;

use crate::bound::{Evaluation, JobClass, Point, Table};
use crate::job::{Attention, Job, Method, PeftConfig, PeftKind, Precision, Quantization, Targets};
use crate::units::GIB;

/// Status of one validated row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Predicted and compared.
    Ok,
    /// Not predicted.
    Skipped,
    /// OOM row, predicted not to fit.
    OomOk,
    /// OOM row, predicted to fit.
    OomMissed,
}

/// The naive formula the product started from, for reference:
/// `VRAM = M_base + M_lora + M_optimizer + M_activations + M_cuda_ctx`, with
/// `M_base = N·bits/8`, `M_lora = 2·r·d_model·N_targets·4`, `M_optimizer = 2·M_lora`,
/// `M_activations = b·s·L·(34·d_model + 5·s·h)` (h = attention heads), `M_cuda_ctx ≈ 1 GB`.
#[must_use]
pub fn naive_formula(model: &crate::model::ModelSpec, job: &Job) -> u64 {
    let n = model.total_params();
    let bits = match job.quantization {
        Quantization::None => {
            if job.precision == Precision::Fp32 {
                32
            } else {
                16
            }
        }
        Quantization::Int8 => 8,
        _ => 4,
    };
    let base = n * bits / 8;
    let targets = if job.method.is_peft() {
        model
            .linears()
            .filter(|(_, l)| job.adapts(l))
            .map(|(c, _)| c)
            .sum()
    } else {
        0
    };
    let lora = 2 * job.adapter.rank * model.hidden_size * targets * 4;
    let opt = 2 * lora;
    let acts = if job.method == Method::Inference {
        0
    } else {
        job.micro_batch_size
            * job.seq_len
            * model.num_layers
            * (34 * model.hidden_size + 5 * job.seq_len * model.num_heads)
    };
    base + lora + opt + acts + GIB
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_by_hand() {
        let s = stats(&[0.1, -0.2, 0.05, -0.01]);
        assert_eq!(s.n, 4);
        assert!((s.median_abs - 0.075).abs() < 1e-12);
        assert!((s.mean_abs - 0.09).abs() < 1e-12);
        assert!((s.p90_abs - 0.2).abs() < 1e-12);
        assert!((s.under_5pct_share - 0.25).abs() < 1e-12);
    }

    #[test]
    fn overrides_change_the_model() {
        let mut o = serde_json::Map::new();
        o.insert("num_hidden_layers".into(), Value::from(2));
        let full = CatalogModels.model("meta-llama/Llama-3.1-8B").unwrap();
        let cut = CatalogModels
            .model_with("meta-llama/Llama-3.1-8B", Some(&o))
            .unwrap();
        assert_eq!(cut.num_layers, 2);
        // 30 fewer layers of 218,112,000 parameters each (Llama-3.1-8B's decoder layer).
        assert_eq!(full.total_params() - cut.total_params(), 30 * 218_112_000);
    }

    /// The harness writes `"storage": "uint8"` beside `"type": "nf4"`: the scheme is read
    /// from `type` (it was read as LLM.int8 from the whole object, +25 % on every H200 QLoRA
    /// row), while a compute dtype elsewhere in the object still counts.
    #[test]
    fn quantization_scheme_comes_from_its_type() {
        let row = |q: &str| {
            let text = format!(
                r#"{{"id":"x","method":"qlora","model_hf_id":"meta-llama/Llama-3.1-8B",
                "quantization":{q},"seq_len":512,"micro_batch_size":1,"num_gpus":1,
                "gpu":"H100 80GB","metric":"torch.cuda.max_memory_allocated",
                "per_gpu_gib":10.0,"outcome":"ok","confidence":"high"}}"#
            );
            interpret(&serde_json::from_str(&text).unwrap()).unwrap()
        };
        let r = row(r#"{"type":"nf4","double_quant":true,"storage":"uint8"}"#);
        assert_eq!(r.job.quantization, Quantization::Nf4Dq);
        let r = row(r#"{"type":"bnb LLM.int8","compute_dtype":"fp16"}"#);
        assert_eq!(r.job.quantization, Quantization::Int8);
        let r = row(r#"{"type":"bnb 4-bit (fp4)","compute_dtype":"fp32 default"}"#);
        assert_eq!(r.job.quantization, Quantization::Fp4);
        assert_eq!(r.job.precision, Precision::Fp32);
    }

    /// Rows measured on top of the load's cache are skipped at the reserved and device
    /// levels, with the reason; their allocated level is compared.
    #[test]
    fn kept_load_cache_rows_are_skipped_above_the_allocated_level() {
        let row = |metric: &str, cache: &str| {
            let text = format!(
                r#"{{"id":"x","method":"lora","model_hf_id":"meta-llama/Llama-3.1-8B",
                "seq_len":512,"micro_batch_size":1,"num_gpus":1,"gpu":"H200",
                "metric":"{metric}","calibration":{{"load_cache":"{cache}"}},
                "per_gpu_gib":20.0,"outcome":"ok","confidence":"high"}}"#
            );
            interpret(&serde_json::from_str(&text).unwrap())
        };
        let reserved = "torch.cuda.max_memory_reserved()";
        let err = row(reserved, "kept").unwrap_err();
        assert!(err.contains("load"), "{err}");
        assert!(row("nvidia-smi", "kept").is_err());
        assert!(row(reserved, "emptied").is_ok());
        assert!(row("torch.cuda.max_memory_allocated()", "kept").is_ok());
    }

    #[test]
    fn gpu_text() {
        let (m, cc) = gpu_facts("A100 40GB (per text)");
        assert_eq!(cc, Some((8, 0)));
        assert!(m.unwrap() > 39 * GIB && m.unwrap() < 40 * GIB);
    }

    #[test]
    fn trl_versions() {
        assert_eq!(version_of("torch 2.4, trl 0.26.1", "trl"), Some((0, 26)));
        assert_eq!(version_of("peft 0.13", "trl"), None);
        assert_eq!(
            version_of(
                "fms-hf-tuning (hf trainer/trl sft) torch 2.4.1, trl 0.13.0",
                "trl"
            ),
            Some((0, 13))
        );
        assert_eq!(
            version3_of("bitsandbytes 0.41.1, x", "bitsandbytes"),
            Some((0, 41, 1))
        );
        assert_eq!(
            version_of("torch 2.4.1, transformers 4.48.1", "transformers"),
            Some((4, 48))
        );
        assert_eq!(
            version_of("transformers ~4.16 (jan 2022), cuda 11.2", "transformers"),
            Some((4, 16))
        );
        // transformers ≤ 4.26 predates torch 2.0; a named torch wins.
        assert_eq!(
            torch_version("transformers ~4.16 (jan 2022)"),
            Some((1, 13))
        );
        assert_eq!(torch_version("transformers 4.46"), None);
        assert_eq!(torch_version("torch 2.1, transformers 4.20"), Some((2, 1)));
    }
}

/// The outcome of one row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RowResult {
    /// Row id.
    pub id: String,
    /// Status.
    pub status: Status,
    /// Source key.
    pub source: String,
    /// Method (as modelled; lit-gpt's adapters by their own name), for grouping.
    pub method: Option<&'static str>,
    /// Stack (as modelled), for grouping.
    pub stack: Option<&'static str>,
    /// Level compared.
    pub metric: Option<Metric>,
    /// moro's prediction at that level.
    pub predicted_bytes: Option<u64>,
    /// The measurement.
    pub measured_bytes: Option<u64>,
    /// `(predicted - measured) / measured`.
    pub error: Option<f64>,
    /// The product's naive formula on the same row.
    pub naive_bytes: Option<u64>,
    /// Its signed error.
    pub naive_error: Option<f64>,
    /// Phase of moro's peak.
    pub phase: Option<&'static str>,
    /// Why it was skipped.
    pub reason: Option<String>,
    /// The job's error regime (stack, method family, sharded), for the bound.
    pub class: Option<JobClass>,
    /// The bound on the prediction at the row's level ([`crate::bound::Table::builtin`]).
    pub predicted_upper_bytes: Option<u64>,
    /// The prediction at every level (allocated, reserved, device), which the bound reads.
    #[serde(skip)]
    pub predicted_levels: Option<[u64; 3]>,
}

/// Aggregates over the compared rows.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Rows read.
    pub rows: usize,
    /// Rows predicted (ok + OOM rows).
    pub covered: usize,
    /// Rows skipped.
    pub skipped: usize,
    /// `covered / rows`.
    pub coverage: f64,
    /// OOM rows predicted not to fit.
    pub oom_ok: usize,
    /// OOM rows predicted to fit.
    pub oom_missed: usize,
    /// moro over all compared rows.
    pub overall: Stats,
    /// The naive formula over the same rows.
    pub naive: Stats,
    /// By method.
    pub by_method: std::collections::BTreeMap<String, Stats>,
    /// By source.
    pub by_source: std::collections::BTreeMap<String, Stats>,
    /// By stack.
    pub by_stack: std::collections::BTreeMap<String, Stats>,
    /// Share of compared rows whose measurement is at or under the shipped bound.
    pub upper_coverage: f64,
    /// Median of bound / measured over the compared rows.
    pub upper_ratio_median: f64,
    /// The bound by regime, with the shipped table and with each source left out of the fit
    /// that bounds it.
    pub upper_by_regime: Evaluation,
}

/// A validation report.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    /// One entry per input row.
    pub rows: Vec<RowResult>,
    /// Aggregates.
    pub summary: Summary,
}

/// What validating needs from the edge: resolving a model id to its architecture.
pub trait ModelSource {
    /// The architecture of `id`, or why not.
    ///
    /// # Errors
    /// Why the model is unavailable.
    fn model(&self, id: &str) -> Result<crate::model::ModelSpec, String>;

    /// The architecture of `id` with config fields replaced (`model_overrides`). The default
    /// ignores them; the catalog applies them.
    ///
    /// # Errors
    /// Why the model is unavailable or the overridden config does not parse.
    fn model_with(
        &self,
        id: &str,
        overrides: Option<&serde_json::Map<String, Value>>,
    ) -> Result<crate::model::ModelSpec, String> {
        let _ = overrides;
        self.model(id)
    }
}

/// Models from the embedded catalog.
#[derive(Debug, Clone, Copy, Default)]
pub struct CatalogModels;

impl ModelSource for CatalogModels {
    fn model(&self, id: &str) -> Result<crate::model::ModelSpec, String> {
        self.model_with(id, None)
    }

    fn model_with(
        &self,
        id: &str,
        overrides: Option<&serde_json::Map<String, Value>>,
    ) -> Result<crate::model::ModelSpec, String> {
        let e = crate::catalog::find(id)
            .ok_or_else(|| format!("model `{id}` is not in the catalog"))?;
        match overrides {
            None => crate::catalog::load(e).map_err(|e| e.to_string()),
            Some(o) => config_with_overrides(e.config_json, o),
        }
    }
}

/// Parses a config.json with some fields replaced (in `text_config` when the field lives
/// there, as in multimodal Gemma 3 configs).
///
/// # Errors
/// The config or the result does not parse.
pub fn config_with_overrides(
    config_json: &str,
    overrides: &serde_json::Map<String, Value>,
) -> Result<crate::model::ModelSpec, String> {
    let mut cfg: Value = serde_json::from_str(config_json).map_err(|e| e.to_string())?;
    for (k, v) in overrides {
        let in_text =
            cfg.get(k).is_none() && cfg.get("text_config").and_then(|t| t.get(k)).is_some();
        let target = if in_text {
            cfg.get_mut("text_config")
        } else {
            Some(&mut cfg)
        };
        if let Some(Value::Object(m)) = target {
            m.insert(k.clone(), v.clone());
        }
    }
    let bytes = serde_json::to_vec(&cfg).map_err(|e| e.to_string())?;
    crate::arch::parse_config(&bytes).map_err(|e| e.to_string())
}

/// Predicts every row of a JSONL text and scores the predictions. Rows with
/// `confidence: low` are skipped unless `include_low`.
#[must_use]
pub fn validate(jsonl: &str, models: &dyn ModelSource, include_low: bool) -> Report {
    let mut rows = Vec::new();
    for (i, line) in jsonl.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let skip = |id: String, reason: String| RowResult {
            id,
            status: Status::Skipped,
            source: String::new(),
            method: None,
            stack: None,
            metric: None,
            predicted_bytes: None,
            measured_bytes: None,
            error: None,
            naive_bytes: None,
            naive_error: None,
            phase: None,
            reason: Some(reason),
            class: None,
            predicted_upper_bytes: None,
            predicted_levels: None,
        };
        let v: Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(e) => {
                rows.push(skip(format!("line {}", i + 1), format!("not JSON: {e}")));
                continue;
            }
        };
        let id = text(&v, "id");
        let id = if id.is_empty() {
            format!("line {}", i + 1)
        } else {
            id
        };
        if !include_low && text(&v, "confidence") == "low" {
            let mut r = skip(id, "confidence: low".into());
            r.source = text(&v, "source_key");
            rows.push(r);
            continue;
        }
        let row = match interpret(&v) {
            Ok(r) => r,
            Err(reason) => {
                let mut r = skip(id, reason);
                r.source = text(&v, "source_key");
                rows.push(r);
                continue;
            }
        };
        rows.push(predict_row(&row, models));
    }
    let summary = summarize(&rows);
    Report { rows, summary }
}

/// What one row was predicted from: the row as read, the model and job it became, and the
/// full estimate (for `moro validate --explain ID`).
#[derive(Debug, Clone)]
pub struct Explained {
    /// The row as interpreted.
    pub row: Row,
    /// The model the row ran (with its `model_overrides`).
    pub model: crate::model::ModelSpec,
    /// The job, LoRA targets resolved against the model.
    pub job: Job,
    /// The estimate the row's prediction was taken from.
    pub estimate: crate::estimate::Estimate,
    /// The device profile it was estimated with (the row's GPU).
    pub profile: crate::estimate::DeviceProfile,
}

/// Interprets and estimates the row whose `id` is `id`.
///
/// # Errors
/// No such row, or why it is skipped (the same reason `validate` gives).
pub fn explain(jsonl: &str, models: &dyn ModelSource, id: &str) -> Result<Explained, String> {
    let v = jsonl
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| text(v, "id") == id)
        .ok_or_else(|| format!("no row with id `{id}`"))?;
    let row = interpret(&v)?;
    let (model, job, estimate) = estimate_row(&row, models)?;
    Ok(Explained {
        profile: row_profile(&row),
        row,
        model,
        job,
        estimate,
    })
}

/// The model a row ran, the job it is estimated as (sequence capped to learned positions,
/// LoRA targets resolved) and the estimate, with the row's device profile.
fn estimate_row(
    row: &Row,
    models: &dyn ModelSource,
) -> Result<(crate::model::ModelSpec, Job, crate::estimate::Estimate), String> {
    let model = models.model_with(&row.model_id, row.model_overrides.as_ref())?;
    let mut job = row.job.clone();
    cap_to_learned_positions(&mut job, &model);
    // Training only: generation with a KV cache never expanded MQA's k and v, before or
    // after that commit, and the inference model already runs the math kernel for it.
    if row.litgpt_unexpanded_mqa
        && job.method != Method::Inference
        && model.num_kv_heads == 1
        && model.num_heads > 1
        && job.attention == Attention::Sdpa
    {
        // SDPA's math kernel: the probabilities are materialized, as in eager attention.
        job.attention = Attention::Eager;
    }
    job.adapter.targets = crate::targets::resolve(
        &crate::stack::as_built(&model, job.stack.profile()),
        &job.adapter.targets,
    );
    resolve_peft(&model, &mut job, row.trainable_params)?;
    let estimate =
        crate::estimate::estimate(&model, &job, &row_profile(row)).map_err(|e| e.to_string())?;
    Ok((model, job, estimate))
}

/// Settings of PEFT methods a row does not give, from its trainable-parameter count where it
/// pins them (PEFT's defaults otherwise):
///
/// - IA³'s feedforward modules: PEFT's default (the MLP's down projection), or every
///   targeted MLP Linear when only that gives the count (a custom `feedforward_modules`).
/// - AdaLoRA's `init_r` (the rank its tensors are allocated at; the row's `r` is the LoRA
///   field AdaLoRA ignores): the count over one rank's parameters (without a count, the row's
///   `init_r` or PEFT's default 12).
/// - Prompt tuning's `num_virtual_tokens`: the count over one token's parameters (without a
///   count, the row's own, if it gives one).
fn resolve_peft(
    model: &crate::model::ModelSpec,
    job: &mut Job,
    trainable: Option<u64>,
) -> Result<(), String> {
    if !job.method.is_peft() {
        return Ok(());
    }
    let count = |job: &Job| crate::estimate::weights::lora_params(model, job);
    match job.adapter.method {
        PeftKind::Ia3 if job.adapter.feedforward.is_none() => {
            if let Some(n) = trainable.filter(|&n| n != count(job)) {
                let mlp: Vec<String> = model
                    .linears()
                    .filter(|(_, l)| {
                        job.adapts(l) && matches!(l.role, crate::model::LinearRole::Mlp)
                    })
                    .map(|(_, l)| l.name.clone())
                    .collect();
                let all_mlp = Job {
                    adapter: PeftConfig {
                        feedforward: Some(Targets::Names(mlp)),
                        ..job.adapter.clone()
                    },
                    ..job.clone()
                };
                if count(&all_mlp) == n {
                    *job = all_mlp;
                }
            }
        }
        // Both counts are linear in the setting: one unit's parameters divide them.
        PeftKind::AdaLora => {
            if let Some(n) = trainable {
                let mut one = job.clone();
                one.adapter.rank = 1;
                let per_rank = count(&one);
                if per_rank == 0 || n % per_rank != 0 {
                    return Err(format!(
                        "AdaLoRA: {n} trainable parameters is no whole rank of the targets \
                         ({per_rank} per rank)"
                    ));
                }
                job.adapter.rank = n / per_rank;
            }
        }
        PeftKind::PromptTuning => {
            if let Some(n) = trainable {
                let mut one = job.clone();
                one.adapter.virtual_tokens = 1;
                let per_token = count(&one).max(1);
                if n % per_token == 0 {
                    job.adapter.virtual_tokens = n / per_token;
                }
            }
            if job.adapter.virtual_tokens == 0 {
                return Err("prompt tuning: the number of virtual tokens is not given".to_owned());
            }
        }
        _ => {}
    }
    Ok(())
}

/// A run that completed on a model with learned absolute positions cannot have used longer
/// sequences than it has positions: the trainer cut them (fms-hf-tuning, for one, sets
/// `max_seq_length = min(max_seq_length, tokenizer.model_max_length)` in
/// `tuning/data/setup_dataprocessor.py`; santacoder's tokenizer says 2048, its `n_positions`).
fn cap_to_learned_positions(job: &mut Job, model: &crate::model::ModelSpec) {
    if model.position_embeddings > 0 && job.method != Method::Inference {
        job.seq_len = job.seq_len.min(model.position_embeddings);
    }
}

/// The device profile a row is predicted with: the defaults of its GPU's compute
/// capability, with the CUDA context the row measured itself, when it did, and no cuBLAS
/// workspace for a trace on fake tensors (which runs no GEMM).
fn row_profile(row: &Row) -> crate::estimate::DeviceProfile {
    let mut profile =
        crate::estimate::DeviceProfile::for_compute_capability(row.compute_capability);
    if let Some(c) = row.cuda_context_bytes {
        profile.cuda_context_bytes = c;
    }
    if row.simulated {
        profile.cublas_workspace_bytes = 0;
    }
    profile
}

fn predict_row(row: &Row, models: &dyn ModelSource) -> RowResult {
    let mut out = RowResult {
        id: row.id.clone(),
        status: Status::Skipped,
        source: row.source.clone(),
        method: Some(
            if row.job.adapter.method.is_adapter() || row.job.adapter.method.is_other_peft() {
                row.job.adapter.method.as_str()
            } else {
                row.job.method.as_str()
            },
        ),
        stack: Some(row.job.stack.as_str()),
        metric: Some(row.metric),
        predicted_bytes: None,
        measured_bytes: if row.oom {
            None
        } else {
            Some(row.measured_bytes)
        },
        error: None,
        naive_bytes: None,
        naive_error: None,
        phase: None,
        reason: None,
        class: None,
        predicted_upper_bytes: None,
        predicted_levels: None,
    };
    let (spec, job, est) = match estimate_row(row, models) {
        Ok(x) => x,
        Err(e) => {
            out.reason = Some(e);
            return out;
        }
    };
    out.phase = Some(est.peak_phase.as_str());
    let class = JobClass::of(&job);
    out.class = Some(class);
    if row.oom {
        let mem = row.gpu_memory_bytes.unwrap_or(u64::MAX);
        out.predicted_bytes = Some(est.peak_device_bytes);
        out.status = if est.peak_device_bytes > mem {
            Status::OomOk
        } else {
            Status::OomMissed
        };
        return out;
    }
    // A run that put the whole model on each GPU before wrapping it holds at least that
    // load, which moro prints apart from the step.
    let floor = match &est.rank {
        Some(rank) if row.loads_whole_model => rank.whole_model_load,
        _ => 0,
    };
    let levels = [
        est.peak_allocated_bytes.max(floor),
        est.peak_reserved_bytes.max(floor),
        est.peak_device_bytes.max(floor),
    ];
    let predicted = row.metric.pick(levels);
    #[allow(clippy::cast_precision_loss)]
    let err = |p: u64| (p as f64 - row.measured_bytes as f64) / row.measured_bytes.max(1) as f64;
    out.predicted_bytes = Some(predicted);
    out.predicted_levels = Some(levels);
    out.predicted_upper_bytes = Some(Table::builtin().upper_at(row.metric, class, levels));
    out.error = Some(err(predicted));
    let naive = naive_formula(&spec, &job) / job.parallel.gpus().max(1);
    out.naive_bytes = Some(naive);
    out.naive_error = Some(err(naive));
    out.status = Status::Ok;
    out
}

fn summarize(rows: &[RowResult]) -> Summary {
    use std::collections::BTreeMap;
    let ok: Vec<&RowResult> = rows.iter().filter(|r| r.status == Status::Ok).collect();
    let errors: Vec<f64> = ok.iter().filter_map(|r| r.error).collect();
    let naive: Vec<f64> = ok.iter().filter_map(|r| r.naive_error).collect();
    let group = |key: &dyn Fn(&RowResult) -> String| {
        let mut m: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for r in &ok {
            if let Some(e) = r.error {
                m.entry(key(r)).or_default().push(e);
            }
        }
        m.into_iter()
            .map(|(k, v)| (k, stats(&v)))
            .collect::<BTreeMap<_, _>>()
    };
    let oom_ok = rows.iter().filter(|r| r.status == Status::OomOk).count();
    let oom_missed = rows
        .iter()
        .filter(|r| r.status == Status::OomMissed)
        .count();
    let covered = ok.len() + oom_ok + oom_missed;
    let pts = points(rows);
    let upper_by_regime = crate::bound::evaluation(&pts, Table::builtin());
    let overall = crate::bound::evaluate::overall(&pts, Table::builtin());
    let considered = rows
        .iter()
        .filter(|r| r.reason.as_deref() != Some("confidence: low"))
        .count();
    #[allow(clippy::cast_precision_loss)]
    let coverage = if considered == 0 {
        0.0
    } else {
        covered as f64 / considered as f64
    };
    Summary {
        rows: considered,
        covered,
        skipped: considered - covered,
        coverage,
        oom_ok,
        oom_missed,
        overall: stats(&errors),
        naive: stats(&naive),
        by_method: group(&|r| r.method.unwrap_or("?").to_owned()),
        by_source: group(&|r| r.source.clone()),
        by_stack: group(&|r| r.stack.unwrap_or("?").to_owned()),
        upper_coverage: overall.as_ref().map_or(0.0, |o| o.coverage),
        upper_ratio_median: overall.map_or(0.0, |o| o.ratio_median),
        upper_by_regime,
    }
}

/// The compared rows as points of the error model ([`crate::bound`]).
#[must_use]
pub fn points(rows: &[RowResult]) -> Vec<Point> {
    rows.iter()
        .filter(|r| r.status == Status::Ok)
        .filter_map(|r| {
            Some(Point {
                source: r.source.clone(),
                class: r.class?,
                level: r.metric?,
                measured: r.measured_bytes?,
                predicted: r.predicted_bytes?,
                levels: r.predicted_levels?,
            })
        })
        .collect()
}
