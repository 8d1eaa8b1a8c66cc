//! Finding the tokenizer of `--model` for `moro data`: a model directory or its
//! `tokenizer.json`, else the Hugging Face cache, else the Hub (stored in the cache as
//! `huggingface_hub` stores it), with `tokenizer_config.json` and `chat_template.jinja` beside it;
//! or the vocabulary and chat template a `.gguf` file carries.

use std::path::{Path, PathBuf};

use anyhow::Result;
use moro_data::{Date, ModelTokenizer};
use moro_hub::{HubError, RepoRef};

use crate::error::{user, user_hint};
use crate::resolve::HubArgs;

/// The files a tokenizer is made of.
struct Files {
    tokenizer: Vec<u8>,
    config: Option<Vec<u8>>,
    template: Option<String>,
    /// Where they came from, for the report.
    source: String,
}

/// The tokenizer of `model` with its chat template (`chat_template`, a file, replaces it).
pub(crate) fn load(
    model: &str,
    chat_template: Option<&Path>,
    hub: &HubArgs,
    today: Date,
) -> Result<(ModelTokenizer, String)> {
    let template = chat_template
        .map(|p| {
            std::fs::read_to_string(p)
                .map_err(|e| user(format!("--chat-template {}: {e}", p.display())))
        })
        .transpose()?;
    let path = Path::new(model);
    if path.is_file()
        && path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return gguf(path, template.as_deref(), today);
    }
    let files = if path.exists() {
        local(path)?
    } else {
        let files = hub_files(model, hub);
        crate::resolve::clear_progress();
        files?
    };
    let template = template.or(files.template);
    let tok = ModelTokenizer::from_bytes(
        &files.tokenizer,
        files.config.as_deref(),
        template.as_deref(),
        today,
    )
    .map_err(|e| data_error(&format!("tokenizer of `{model}` ({})", files.source), e))?;
    Ok((tok, files.source))
}

fn data_error(context: &str, e: moro_data::DataError) -> anyhow::Error {
    let message = format!("{context}: {}", e.message);
    match e.hint {
        Some(h) => user_hint(message, h),
        None => user(message),
    }
}

/// The vocabulary of a GGUF file: only its header is read.
fn gguf(path: &Path, template: Option<&str>, today: Date) -> Result<(ModelTokenizer, String)> {
    let header =
        moro_hub::local::read_gguf_header_keeping(path, &moro_data::gguf_vocab::WHOLE_ARRAYS)
            .map_err(|e| user(e.to_string()))?;
    let source = format!("{} (its own vocabulary)", path.display());
    let tok = ModelTokenizer::from_gguf(&header, template, today)
        .map_err(|e| data_error(&path.display().to_string(), e))?;
    Ok((tok, source))
}

fn read_optional(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(user(format!("{}: {e}", path.display()))),
    }
}

fn local(path: &Path) -> Result<Files> {
    let (dir, tokenizer) = if path.is_dir() {
        (path.to_path_buf(), path.join("tokenizer.json"))
    } else {
        (
            path.parent()
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf),
            path.to_path_buf(),
        )
    };
    let bytes = std::fs::read(&tokenizer).map_err(|e| {
        user_hint(
            format!("{}: {e}", tokenizer.display()),
            "--model is a model directory with a tokenizer.json, the tokenizer.json itself, or a Hub id",
        )
    })?;
    let template = read_optional(&dir.join("chat_template.jinja"))?
        .map(|b| String::from_utf8_lossy(&b).into_owned());
    Ok(Files {
        tokenizer: bytes,
        config: read_optional(&dir.join("tokenizer_config.json"))?,
        template,
        source: tokenizer.display().to_string(),
    })
}

fn hub_files(model: &str, hub: &HubArgs) -> Result<Files> {
    let id = match &hub.revision {
        Some(rev) => format!("{model}@{rev}"),
        None => model.to_owned(),
    };
    let repo = RepoRef::parse(&id).map_err(|e| {
        user_hint(
            format!("--model `{model}`: {e}"),
            "give a Hub id (`org/name`), a model directory or a tokenizer.json",
        )
    })?;
    let settings = crate::resolve::settings(hub);
    let cached = moro_hub::find_cached_lenient(&settings.hub_cache, &repo, "tokenizer.json");
    if let Some(path) = cached {
        let mut f = local(&path)?;
        f.source = "Hugging Face cache".to_owned();
        return Ok(f);
    }
    let offline = settings.offline;
    let client = crate::resolve::client(settings);
    let tokenizer = client.fetch_file(&repo, "tokenizer.json").map_err(|e| {
        let hint = match (&e, offline) {
            (HubError::Offline { .. }, _) | (_, true) => {
                "the tokenizer is not in the Hugging Face cache; run without --offline (or \
                 HF_HUB_OFFLINE) once, or give a local tokenizer.json"
            }
            (HubError::FileNotFound { .. }, _) => {
                "the repository has no tokenizer.json (a slow-only tokenizer); give one made with \
                 `AutoTokenizer.from_pretrained(...).save_pretrained(dir)`"
            }
            _ => "give a local model directory or tokenizer.json instead",
        };
        user_hint(format!("tokenizer of `{model}`: {e}"), hint)
    })?;
    let optional = |file: &str| match client.fetch_file(&repo, file) {
        Ok(b) => Ok(Some(b)),
        Err(HubError::FileNotFound { .. }) => Ok(None),
        Err(e) => Err(user(format!("{file} of `{model}`: {e}"))),
    };
    let config = optional("tokenizer_config.json")?;
    let template =
        optional("chat_template.jinja")?.map(|b| String::from_utf8_lossy(&b).into_owned());
    Ok(Files {
        tokenizer,
        config,
        template,
        source: "Hugging Face Hub".to_owned(),
    })
}
