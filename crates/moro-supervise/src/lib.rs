//! moro-supervise: runs a training command and heals it when it runs out of memory.
//!
//! - [`classify`] (pure): exit status + output tail → [`classify::Outcome`].
//! - [`ladder`] (pure): the five-level heal ladder over [`moro_core::job::Job`].
//! - [`run`](mod@run) (I/O): the supervisor loop and its public API, [`run()`].
//! - `process` (I/O): one attempt: own process group, live output, signal forwarding.
//! - [`journal`] (I/O): `.moro/heal.jsonl`, the per-machine correction file, atomic writes.

#![warn(missing_docs)]

pub mod classify;
pub mod journal;
pub mod ladder;
mod process;
pub mod run;
mod tail;

pub use run::{End, Error, HookError, Hooks, ResumeFlag, RunOptions, RunReport, run};
