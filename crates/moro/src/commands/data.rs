//! `moro data stats`: the token lengths of a dataset, tokenized as training will tokenize it,
//! and what they mean for `max_seq_length`.

use std::fs::File;
use std::io::{BufReader, IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, Subcommand};
use moro_data::stats::{Bucket, histogram, packing, percentile, truncation};
use moro_data::{
    Date, FileFormat, LengthSummary, Malformed, Packing, Permille, Scan, ScanOptions, Shape,
    Truncation,
};
use serde::Serialize;

use crate::error::{user, user_hint};
use crate::output::thousands;
use crate::output::{Table, bar, json, note, stdout};
use crate::resolve::HubArgs;

/// `moro data ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum DataCommand {
    /// Token lengths of a dataset with the model's tokenizer and chat template: percentiles,
    /// a histogram, what a `--max-seq-length` truncates and how the data packs.
    Stats(StatsArgs),
}

impl DataCommand {
    pub(crate) const fn json(&self) -> bool {
        match self {
            Self::Stats(a) => a.json,
        }
    }
}

/// How to read a dataset and with which tokenizer (shared by `data stats`, `estimate
/// --dataset`, `recipe generate --dataset`).
#[derive(Debug, Clone, Args)]
pub(crate) struct DatasetArgs {
    /// The row layout: text, alpaca, sharegpt, messages, prompt-completion or preference
    /// (default: recognised from the first row).
    #[arg(long, value_name = "SHAPE")]
    pub(crate) format: Option<String>,
    /// The field holding the text or the conversation.
    #[arg(long, value_name = "NAME")]
    pub(crate) field: Option<String>,
    /// A chat template file that replaces the tokenizer's.
    #[arg(long, value_name = "FILE")]
    pub(crate) chat_template: Option<PathBuf>,
    /// A malformed row is an error (exit 2) rather than counted and listed.
    #[arg(long)]
    pub(crate) strict: bool,
    /// Read only the first N rows.
    #[arg(long, value_name = "N")]
    pub(crate) limit: Option<u64>,
}

/// Arguments of `moro data stats`.
#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  moro data stats train.jsonl --model Qwen/Qwen2.5-7B-Instruct --max-seq-length 4096 \
    --packing\n\nExit codes: 0 read (malformed rows are listed and counted), 2 invalid input: not a \
    dataset, an unknown shape, a tokenizer that does not load, a malformed row under --strict."
)]
pub(crate) struct StatsArgs {
    /// The dataset: a .jsonl, .json (an array of records), .csv, .tsv, .parquet or .arrow
    /// file, or a dataset id (`org/name`) in the Hugging Face Hub cache or the `datasets` cache.
    pub(crate) dataset: PathBuf,
    /// Whose tokenizer: a Hub id, a model directory or a tokenizer.json.
    #[arg(long, short = 'm')]
    pub(crate) model: String,
    #[command(flatten)]
    pub(crate) data: DatasetArgs,
    /// Report what this length truncates (and, with --packing, how the data packs into it).
    #[arg(long, value_name = "TOKENS")]
    pub(crate) max_seq_length: Option<u32>,
    /// How many sequences of --max-seq-length (else the percentile's length) the data packs
    /// into.
    #[arg(long)]
    pub(crate) packing: bool,
    /// The percentile `max_seq_length` is sized from.
    #[arg(long, default_value = "99", value_name = "P")]
    pub(crate) percentile: f64,
    #[command(flatten)]
    pub(crate) hub: HubArgs,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

/// A dataset's lengths with where they came from.
pub(crate) struct Measured {
    pub(crate) path: PathBuf,
    pub(crate) format: FileFormat,
    pub(crate) tokenizer_source: String,
    pub(crate) chat_template: bool,
    pub(crate) scan: Scan,
    /// The lengths, sorted.
    pub(crate) sorted: Vec<u32>,
}

impl Measured {
    /// The length the percentile asks for.
    pub(crate) fn at(&self, p: Permille) -> u32 {
        percentile(&self.sorted, p).unwrap_or(0)
    }

    /// Samples longer than `tokens` (truncated at that length).
    pub(crate) fn longer_than(&self, tokens: u32) -> u64 {
        (self.sorted.len() - self.sorted.partition_point(|&l| l <= tokens)) as u64
    }
}

/// A `--percentile` as the stats take it.
pub(crate) fn parse_percentile(p: f64) -> Result<Permille> {
    Permille::from_percent(p).ok_or_else(|| {
        user_hint(
            format!(
                "--percentile {p} is not a percentage above 0 and at most 100 (one decimal at most)"
            ),
            "99 sizes for all but the longest 1 % of samples",
        )
    })
}

/// Reads and tokenizes the dataset with `model`'s tokenizer: one file, or the data files of a
/// dataset repository in the Hugging Face cache (`org/name`).
pub(crate) fn measure(
    path: &Path,
    model: &str,
    args: &DatasetArgs,
    hub: &HubArgs,
) -> Result<Measured> {
    let mut shape = match &args.format {
        Some(name) => Some(
            Shape::from_name(name, args.field.as_deref()).ok_or_else(|| {
                user_hint(
                    format!("--format `{name}` is not a dataset shape"),
                    format!("one of {}", Shape::NAMES.join(", ")),
                )
            })?,
        ),
        None => None,
    };
    let files = dataset_files(path)?;
    let (tokenizer, source) =
        crate::tokenizer::load(model, args.chat_template.as_deref(), hub, today())?;
    let show = std::io::stderr().is_terminal();
    let mut merged: Option<Scan> = None;
    let mut format = FileFormat::Jsonl;
    let mut left = args.limit;
    for file in &files {
        if left == Some(0) {
            break;
        }
        let options = ScanOptions {
            shape: shape.clone(),
            field: args.field.clone(),
            strict: args.strict,
            limit: left,
        };
        let progress = |rows: u64| {
            if show {
                eprint!("\rtokenizing {}: {rows} rows", file.display());
            }
        };
        let (f, opened) = open(file)?;
        format = f;
        let scan = match opened {
            Opened::Stream(reader) => moro_data::scan(reader, f, &tokenizer, &options, progress),
            Opened::Parquet(file) => moro_data::scan_rows(
                |each| moro_data::rows::read_parquet(file, each),
                &tokenizer,
                &options,
                progress,
            ),
        };
        if show {
            eprint!("\r\x1b[2K");
        }
        let mut scan = scan.map_err(|e| {
            let message = format!("{}: {e}", file.display());
            match e.hint {
                Some(h) => user_hint(message, h),
                None => user(message),
            }
        })?;
        shape = Some(scan.shape.clone());
        left = left.map(|l| l.saturating_sub(scan.tokens.len() as u64 + scan.malformed_count));
        if files.len() > 1 {
            for m in &mut scan.malformed {
                m.message = format!("{}: {}", file.display(), m.message);
            }
        }
        merged = Some(match merged {
            None => scan,
            Some(mut all) => {
                all.prompt = match (all.prompt, scan.prompt) {
                    (Some(mut a), Some(b)) => {
                        a.extend(b);
                        Some(a)
                    }
                    _ => None,
                };
                all.tokens.extend(scan.tokens);
                all.malformed_count += scan.malformed_count;
                all.malformed.extend(scan.malformed);
                all
            }
        });
    }
    let scan = merged.ok_or_else(|| user(format!("{}: no data files", path.display())))?;
    let mut sorted = scan.tokens.clone();
    sorted.sort_unstable();
    Ok(Measured {
        path: path.to_path_buf(),
        format,
        tokenizer_source: source,
        chat_template: tokenizer.has_chat_template(),
        scan,
        sorted,
    })
}

/// The files of a dataset argument: the file itself, or a dataset repository in the Hugging
/// Face cache (`org/name`: `datasets--org--name/snapshots/<refs/main>/`), whose train split
/// files (named `train…` or under `train/`) are read when it has them, else all its data files.
fn dataset_files(path: &Path) -> Result<Vec<PathBuf>> {
    if path.exists() {
        return Ok(vec![path.to_path_buf()]);
    }
    let id = path.to_string_lossy();
    let looks_like_repo = id.split('/').count() == 2 && !id.starts_with('.') && !id.ends_with('/');
    if !looks_like_repo {
        return Err(user(format!("{}: no such file", path.display())));
    }
    let cache = moro_hub::HubSettings::from_process_env().hub_cache;
    let Some(snapshot) = moro_hub::find_cached_dataset(&cache, &id) else {
        if let Some(files) = datasets_cache_files(&id) {
            return Ok(files);
        }
        return Err(user_hint(
            format!(
                "{}: no such file, and no dataset `{id}` in the Hugging Face cache ({}) or the \
                 `datasets` cache ({})",
                path.display(),
                cache.display(),
                datasets_cache().display()
            ),
            "give a local .jsonl/.json/.csv/.parquet file, or download the dataset first \
             (`hf download --repo-type dataset ID`)",
        ));
    };
    let mut files = Vec::new();
    collect_data_files(&snapshot, &mut files);
    files.sort();
    let train: Vec<PathBuf> = files
        .iter()
        .filter(|f| {
            f.strip_prefix(&snapshot)
                .map(|rel| {
                    rel.components()
                        .any(|c| c.as_os_str().to_string_lossy().starts_with("train"))
                })
                .unwrap_or(false)
        })
        .cloned()
        .collect();
    let chosen = if train.is_empty() { files } else { train };
    if chosen.is_empty() {
        return Err(user(format!(
            "dataset `{id}` in the Hugging Face cache has no .parquet, .jsonl, .json or .csv files ({})",
            snapshot.display()
        )));
    }
    Ok(chosen)
}

/// Where the `datasets` library caches what `load_dataset` prepared: `HF_DATASETS_CACHE`, else
/// `$HF_HOME/datasets`, else `$XDG_CACHE_HOME/huggingface/datasets` or
/// `~/.cache/huggingface/datasets` (`datasets/config.py`).
fn datasets_cache() -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("HF_DATASETS_CACHE")
        .or_else(|| env("HF_HOME").map(|h| h.join("datasets")))
        .or_else(|| env("XDG_CACHE_HOME").map(|c| c.join("huggingface/datasets")))
        .or_else(|| env("HOME").map(|h| h.join(".cache/huggingface/datasets")))
        .unwrap_or_else(|| PathBuf::from(".cache/huggingface/datasets"))
}

/// The train split's Arrow files of `org/name` in the `datasets` cache
/// (`org___name/<config>/<version>/<hash>/name-train[-00000-of-0000N].arrow`), from the most
/// recently prepared version.
fn datasets_cache_files(id: &str) -> Option<Vec<PathBuf>> {
    let root = datasets_cache().join(id.replace('/', "___"));
    let mut arrows = Vec::new();
    collect_data_files(&root, &mut arrows);
    arrows.retain(|p| p.extension().is_some_and(|e| e == "arrow"));
    let train = |p: &PathBuf| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().contains("-train"))
    };
    let newest = arrows
        .iter()
        .filter(|p| train(p))
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())?
        .parent()?
        .to_path_buf();
    let mut files: Vec<PathBuf> = arrows
        .into_iter()
        .filter(|p| train(p) && p.parent() == Some(newest.as_path()))
        .collect();
    files.sort();
    Some(files)
}

fn collect_data_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(|e| e.ok()) {
        let p = e.path();
        if p.is_dir() {
            collect_data_files(&p, out);
        } else if p
            .file_name()
            .and_then(|n| FileFormat::from_name(&n.to_string_lossy()))
            .is_some()
            && !p
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            && p.file_name()
                .is_some_and(|n| n != "dataset_info.json" && n != "dataset_infos.json")
        {
            out.push(p);
        }
    }
}

/// An opened dataset file: a stream, or a Parquet file (read by row groups, so seekable).
enum Opened {
    Stream(BufReader<File>),
    Parquet(File),
}

fn open(path: &Path) -> Result<(FileFormat, Opened)> {
    if path.is_dir() {
        return Err(user_hint(
            format!("{}: a directory, not a dataset file", path.display()),
            "give one .jsonl, .json, .csv, .tsv or .parquet file, or a dataset id in the Hugging Face cache",
        ));
    }
    let mut file = File::open(path).map_err(|e| user(format!("{}: {e}", path.display())))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let format = match FileFormat::from_name(&name) {
        Some(f) => f,
        None => {
            let mut head = [0u8; 64];
            let n = file
                .read(&mut head)
                .map_err(|e| user(format!("{}: {e}", path.display())))?;
            let f = FileFormat::sniff(&head[..n]).ok_or_else(|| {
                user_hint(
                    format!(
                        "{}: not a dataset moro reads (neither JSON Lines, JSON, CSV nor Parquet)",
                        path.display()
                    ),
                    "name it .jsonl, .json, .csv, .tsv, .parquet or .arrow",
                )
            })?;
            file = File::open(path).map_err(|e| user(format!("{}: {e}", path.display())))?;
            f
        }
    };
    Ok(match format {
        FileFormat::Parquet => (format, Opened::Parquet(file)),
        // The `datasets` cache keeps each shard as one Arrow stream.
        _ => (
            format,
            Opened::Stream(BufReader::with_capacity(1 << 20, file)),
        ),
    })
}

/// Today in UTC, for templates that print the date.
fn today() -> Date {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (year, month, day) =
        moro_supervise::journal::civil_from_days(i64::try_from(secs / 86_400).unwrap_or(0));
    Date {
        year: i32::try_from(year).unwrap_or(1970),
        month: u8::try_from(month).unwrap_or(1),
        day: u8::try_from(day).unwrap_or(1),
    }
}

#[derive(Serialize)]
struct Report<'a> {
    dataset: String,
    file_format: &'static str,
    shape: &'static str,
    shape_description: String,
    tokenizer: &'a str,
    chat_template: bool,
    samples: u64,
    sequence: LengthSummary,
    prompt: Option<LengthSummary>,
    completion: Option<LengthSummary>,
    percentile: Sized,
    histogram: Vec<Bucket>,
    truncation: Option<Truncation>,
    packing: Option<Packing>,
    malformed_count: u64,
    malformed: &'a [Malformed],
}

#[derive(Serialize)]
struct Sized {
    percent: f64,
    max_seq_length: u32,
    truncated_samples: u64,
}

pub(crate) fn run(cmd: &DataCommand) -> Result<ExitCode> {
    match cmd {
        DataCommand::Stats(a) => run_stats(a),
    }
}

fn run_stats(args: &StatsArgs) -> Result<ExitCode> {
    if args.hub.exact_weights {
        return Err(user(
            "--exact-weights applies to estimates; `moro data stats` reads only the tokenizer",
        ));
    }
    let p = parse_percentile(args.percentile)?;
    if args.max_seq_length == Some(0) {
        return Err(user("--max-seq-length must be at least 1"));
    }
    let m = measure(&args.dataset, &args.model, &args.data, &args.hub)?;
    let s = &m.scan;
    let sequence = LengthSummary::of_sorted(&m.sorted).ok_or_else(|| user("no samples"))?;
    let (prompt, completion) = match &s.prompt {
        Some(p) => {
            let completion: Vec<u32> = s
                .tokens
                .iter()
                .zip(p)
                .map(|(t, p)| t.saturating_sub(*p))
                .collect();
            (LengthSummary::of(p), LengthSummary::of(&completion))
        }
        None => (None, None),
    };
    let sized = m.at(p);
    let trunc = args
        .max_seq_length
        .map(|l| truncation(&s.tokens, s.prompt.as_deref(), l));
    let pack = args
        .packing
        .then(|| packing(&s.tokens, args.max_seq_length.unwrap_or(sized)));
    let report = Report {
        dataset: m.path.display().to_string(),
        file_format: m.format.name(),
        shape: s.shape.name(),
        shape_description: s.shape.describe(),
        tokenizer: &m.tokenizer_source,
        chat_template: m.chat_template,
        samples: sequence.count,
        sequence,
        prompt,
        completion,
        percentile: Sized {
            percent: f64::from(p.tenths()) / 10.0,
            max_seq_length: sized,
            truncated_samples: m.longer_than(sized),
        },
        histogram: histogram(&m.sorted),
        truncation: trunc,
        packing: pack,
        malformed_count: s.malformed_count,
        malformed: &s.malformed,
    };
    if args.json {
        stdout(&json(&report)?)?;
    } else {
        stdout(&render(&report, p))?;
    }
    if s.malformed_count > 0 && !args.json {
        note(&format!(
            "warning: {} malformed row{} not counted (listed above; --strict makes them an error)",
            s.malformed_count,
            if s.malformed_count == 1 { "" } else { "s" }
        ));
    }
    Ok(ExitCode::SUCCESS)
}

#[allow(clippy::cast_precision_loss)]
fn percent(part: u64, whole: u64) -> String {
    format!("{:.1} %", 100.0 * part as f64 / whole.max(1) as f64)
}

fn render(r: &Report<'_>, p: Permille) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "dataset    {} ({}, {} samples)",
        r.dataset,
        r.file_format,
        thousands(r.samples)
    );
    let _ = writeln!(out, "shape      {}", r.shape_description);
    let template = if r.chat_template {
        "with its chat template"
    } else {
        "no chat template"
    };
    let _ = writeln!(out, "tokenizer  {} ({template})", r.tokenizer);
    let _ = writeln!(out);
    let mut t = Table::new(
        &["tokens", "mean", "p50", "p90", "p95", "p99", "max"],
        &[false, true, true, true, true, true, true],
    );
    let mut row = |name: &str, s: &LengthSummary| {
        t.row(vec![
            name.to_owned(),
            format!("{:.1}", s.mean),
            thousands(u64::from(s.p50)),
            thousands(u64::from(s.p90)),
            thousands(u64::from(s.p95)),
            thousands(u64::from(s.p99)),
            thousands(u64::from(s.max)),
        ]);
    };
    row("sequence", &r.sequence);
    if let Some(s) = &r.prompt {
        row("prompt", s);
    }
    if let Some(s) = &r.completion {
        row("completion", s);
    }
    out.push_str(&t.render());
    let _ = writeln!(out);
    let most = r.histogram.iter().map(|b| b.samples).max().unwrap_or(1);
    #[allow(clippy::cast_precision_loss)]
    for b in &r.histogram {
        let _ = writeln!(
            out,
            "  ≤ {:>7}  {}  {}",
            thousands(u64::from(b.upto)),
            bar(b.samples as f64 / most.max(1) as f64, 30),
            thousands(b.samples)
        );
    }
    let _ = writeln!(out);
    let longer = match r.percentile.truncated_samples {
        0 => "no sample is longer".to_owned(),
        1 => format!(
            "1 sample ({}) is longer and is truncated",
            percent(1, r.samples)
        ),
        n => format!(
            "{} samples ({}) are longer and are truncated",
            thousands(n),
            percent(n, r.samples)
        ),
    };
    let _ = writeln!(
        out,
        "max_seq_length {} (p{}): {longer}",
        thousands(u64::from(r.percentile.max_seq_length)),
        p.percent_label(),
    );
    if let Some(t) = &r.truncation {
        let _ = writeln!(
            out,
            "at {} tokens: {} samples ({}) truncated, {} tokens cut ({} of them with loss)",
            thousands(u64::from(t.max_seq_length)),
            thousands(t.samples),
            percent(t.samples, r.samples),
            thousands(t.tokens_cut),
            thousands(t.loss_tokens_cut),
        );
    }
    if let Some(pk) = &r.packing {
        let _ = writeln!(
            out,
            "packed into {} tokens: {} sequences best-fit ({:.1} % full), {} wrapped",
            thousands(u64::from(pk.max_seq_length)),
            thousands(pk.best_fit),
            100.0 * pk.best_fit_fill,
            thousands(pk.wrapped),
        );
    }
    if r.malformed_count > 0 {
        let _ = writeln!(out);
        let _ = writeln!(out, "malformed rows: {}", thousands(r.malformed_count));
        for m in r.malformed.iter().take(10) {
            let _ = writeln!(out, "  {}: {}", m.at, m.message);
        }
        if r.malformed_count > 10 {
            let _ = writeln!(
                out,
                "  … and {} more (--json lists {})",
                r.malformed_count - 10,
                r.malformed.len()
            );
        }
    }
    out
}
