//! Error reporting: `error: …`, optional `caused by: …` lines and a `hint: …`, on stderr.

use std::fmt;
use std::process::ExitCode;

/// An error the user can fix, with an optional hint and an exit code.
#[derive(Debug)]
pub(crate) struct UserError {
    pub(crate) message: String,
    pub(crate) hint: Option<String>,
    /// The setting the error is about, as the job names it (`lora_rank`), where known.
    pub(crate) field: Option<String>,
    /// What was named does not exist (a model): the names closest to it, best first.
    pub(crate) missing: Option<Vec<String>>,
    pub(crate) code: u8,
}

impl UserError {
    /// Invalid input (exit 2).
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            hint: None,
            field: None,
            missing: None,
            code: 2,
        }
    }

    /// Adds a hint.
    pub(crate) fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for UserError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for UserError {}

/// Shorthand for a [`UserError`] wrapped in anyhow.
pub(crate) fn user(message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UserError::new(message))
}

/// A job's error, naming its field.
pub(crate) fn job(e: &moro_core::job::JobError) -> anyhow::Error {
    job_at(e, e.to_string())
}

/// A job's error with its own words (a recipe's, with file, line and column), naming its
/// field.
pub(crate) fn job_at(e: &moro_core::job::JobError, message: impl Into<String>) -> anyhow::Error {
    let mut u = UserError::new(message);
    u.field = Some(e.field.to_owned());
    anyhow::Error::new(u)
}

/// A flag's value that cannot be used, naming the flag: `--memory: …`.
pub(crate) fn flag(name: &str, message: impl fmt::Display) -> UserError {
    let mut u = UserError::new(format!("{name}: {message}"));
    u.field = Some(name.to_owned());
    u
}

/// A recipe that cannot be read, at its file, line and column, naming its key.
pub(crate) fn recipe(e: moro_recipe::RecipeError, shown: &str) -> anyhow::Error {
    let field = e.field.clone();
    let mut u = UserError::new(e.with_source(shown).to_string());
    u.field = field;
    anyhow::Error::new(u)
}

/// The recipe search's refusal, naming its field.
pub(crate) fn search(e: &moro_core::search::SearchError) -> anyhow::Error {
    let moro_core::search::SearchError::Invalid { field, .. } = e;
    let mut u = UserError::new(e.to_string());
    u.field = Some((*field).to_owned());
    anyhow::Error::new(u)
}

/// Shorthand for a [`UserError`] with a hint.
pub(crate) fn user_hint(message: impl Into<String>, hint: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(UserError::new(message).hint(hint))
}

/// The error as `--json` prints it: `{"error": {"message", "field", "causes", "hint",
/// "exit_code"}}`, with `closest` (names near the one that does not exist) when known.
pub(crate) fn to_json(e: &anyhow::Error) -> serde_json::Value {
    let user = e.downcast_ref::<UserError>();
    let causes: Vec<String> = e.chain().skip(1).map(ToString::to_string).collect();
    let mut value = serde_json::json!({"error": {
        "message": e.to_string(),
        "field": user.and_then(|u| u.field.as_deref()),
        "causes": causes,
        "hint": user.and_then(|u| u.hint.as_deref()),
        "exit_code": user.map_or(2, |u| u.code),
    }});
    if let Some(closest) = user.and_then(|u| u.missing.as_ref()) {
        value["error"]["closest"] = serde_json::json!(closest);
    }
    value
}

/// Prints the error and returns its exit code (2 unless it says otherwise): as words on
/// stderr, or, for a command asked for `--json`, as
/// `{"error": {"message", "field", "causes", "hint", "exit_code"}}` on stdout, where the script
/// reads its data.
pub(crate) fn report(e: &anyhow::Error, json: bool) -> ExitCode {
    use std::io::Write;
    let user = e.downcast_ref::<UserError>();
    let code = user.map_or(2, |u| u.code);
    if json {
        let _ = writeln!(std::io::stdout(), "{}", to_json(e));
        return ExitCode::from(code);
    }
    let mut err = anstream::stderr();
    let red = anstyle::Style::new()
        .bold()
        .fg_color(Some(anstyle::AnsiColor::Red.into()));
    let cyan = anstyle::Style::new()
        .bold()
        .fg_color(Some(anstyle::AnsiColor::Cyan.into()));
    let _ = writeln!(err, "{red}error{red:#}: {e}");
    for cause in e.chain().skip(1) {
        let _ = writeln!(err, "  caused by: {cause}");
    }
    if let Some(h) = user.and_then(|u| u.hint.as_ref()) {
        let _ = writeln!(err, "\n{cyan}hint{cyan:#}: {h}");
    }
    ExitCode::from(code)
}

/// A command-line error clap found: help and version as clap prints them; otherwise, for a
/// command asked for `--json`, the error as [`to_json`] shapes it (the argument as `field`,
/// clap's tip as `hint`, exit 2), else clap's own words on stderr.
pub(crate) fn report_clap(e: &clap::Error, json: bool) -> ExitCode {
    use clap::error::ErrorKind;
    use std::io::Write;
    if !json
        || matches!(
            e.kind(),
            ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        )
    {
        e.exit();
    }
    let _ = writeln!(std::io::stdout(), "{}", clap_to_json(e));
    ExitCode::from(2)
}

/// The JSON body of a clap error: its first line as the message, the argument it names as
/// the field (`--seq-len <SEQ_LEN>` → `seq_len`), its tip as the hint.
pub(crate) fn clap_to_json(e: &clap::Error) -> serde_json::Value {
    use clap::error::{ContextKind, ContextValue};
    let text = e.render().to_string();
    let message = text
        .lines()
        .next()
        .unwrap_or_default()
        .trim_start_matches("error: ")
        .to_owned();
    let hint = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("tip: "))
        .map(str::to_owned);
    let field = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(s)) => Some(s.clone()),
        Some(ContextValue::Strings(v)) => v.first().cloned(),
        _ => None,
    }
    .map(|arg| {
        arg.split([' ', '='])
            .next()
            .unwrap_or_default()
            .trim_start_matches('-')
            .replace('-', "_")
    });
    serde_json::json!({"error": {
        "message": message,
        "field": field,
        "causes": [],
        "hint": hint,
        "exit_code": 2,
    }})
}
