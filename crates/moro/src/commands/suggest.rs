//! What would make a job that does not fit (or is uncertain) fit: the recipe search run for
//! the same method, context, effective batch, stack and layout on the same hardware, and
//! when nothing like it fits, the smaller model, larger GPU or more GPUs that would.

use moro_core::job::{Job, Method};
use moro_core::model::ModelSpec;
use moro_core::search::{Candidate, MethodChoice, Request};
use serde::Serialize;

use crate::commands::recipe::{
    Alternatives, alternatives, alternatives_text, caps_of, describe, run_search,
};
use crate::hw::Target;
use crate::output::gib;

/// Configurations that fit, best first.
#[derive(Debug, Serialize)]
pub(crate) struct Suggestions {
    /// The same job's method, context and effective batch with other settings, best first
    /// (at most three).
    pub(crate) same_job: Vec<Suggestion>,
    /// When nothing like the job fits this hardware: what would.
    pub(crate) alternatives: Option<Alternatives>,
}

/// One configuration that fits.
#[derive(Debug, Serialize)]
pub(crate) struct Suggestion {
    pub(crate) configuration: String,
    pub(crate) job: Job,
    pub(crate) peak_device_bytes: u64,
    pub(crate) peak_upper_bytes: u64,
}

impl Suggestion {
    fn of(c: &Candidate) -> Self {
        Self {
            configuration: describe(&c.job),
            job: c.job.clone(),
            peak_device_bytes: c.estimate.peak_device_bytes,
            peak_upper_bytes: c.upper_bytes(),
        }
    }
}

/// Searches for what fits `target` in place of `job` (`None`: the search cannot take the
/// job, e.g. inference, or the target names no GPU).
pub(crate) fn suggest(
    model_id: &str,
    spec: &ModelSpec,
    job: &Job,
    target: &Target,
) -> Option<Suggestions> {
    if job.method == Method::Inference {
        return None;
    }
    let caps = caps_of(target)?;
    let request = Request {
        method: MethodChoice::Only(job.method),
        seq_len: Some(job.seq_len),
        effective_batch: Some(job.micro_batch_size * job.grad_accum * job.parallel.data_parallel),
        stack: job.stack,
        parallel: job.parallel.clone(),
        cluster: None,
        workers: super::workers(),
        ..Request::default()
    };
    let outcome = run_search(spec, &request, &caps)?;
    // A candidate that only adds checkpointing to one already listed, for no lower bound,
    // is that one made slower: it is left out.
    let mut listed: Vec<&Candidate> = Vec::new();
    for c in outcome.best.iter().chain(outcome.runners_up.iter()) {
        let slower_copy = listed.iter().any(|l| {
            c.job.gradient_checkpointing
                && !l.job.gradient_checkpointing
                && c.upper_bytes() >= l.upper_bytes()
                && Job {
                    gradient_checkpointing: true,
                    ..l.job.clone()
                } == c.job
        });
        if !slower_copy {
            listed.push(c);
        }
        if listed.len() == 3 {
            break;
        }
    }
    let same_job: Vec<Suggestion> = listed.into_iter().map(Suggestion::of).collect();
    let alternatives = same_job
        .is_empty()
        .then(|| alternatives(model_id, spec, &request, target, &caps));
    Some(Suggestions {
        same_job,
        alternatives,
    })
}

/// The suggestions in words.
pub(crate) fn text(s: &Suggestions) -> String {
    let mut out = String::new();
    if !s.same_job.is_empty() {
        out.push_str("what fits here with the same method, context and effective batch:\n");
        for c in &s.same_job {
            out.push_str(&format!(
                "  {} (predicted {} GiB, bound {} GiB)\n",
                c.configuration,
                gib(c.peak_device_bytes),
                gib(c.peak_upper_bytes)
            ));
        }
        out.push_str("  (`moro recipe generate` writes it as moro.yaml)\n");
    }
    if let Some(a) = &s.alternatives {
        out.push_str(&alternatives_text(a));
    }
    out
}
