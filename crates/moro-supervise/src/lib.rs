//! moro-supervise: runs a training command and heals it when it runs out of memory.
//!
//! - [`classify`] (pure): exit status + output tail → [`classify::Outcome`].
//! - [`ladder`] (pure): the five-level heal ladder over [`moro_core::job::Job`].
//! - [`run`](mod@run) (I/O): the supervisor: spawns the command in its own process group,
//!   streams its output, forwards signals, heals, journals.

pub mod classify;
pub mod ladder;
