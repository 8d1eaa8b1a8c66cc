//! One module per subcommand; each owns its clap `Args` and a `run` function.

pub(crate) mod calibrate;
pub(crate) mod data;
pub(crate) mod estimate;
pub(crate) mod export;
pub(crate) mod fit;
pub(crate) mod fit_inference;
pub(crate) mod gguf;
pub(crate) mod hardware;
pub(crate) mod models;
pub(crate) mod recipe;
pub(crate) mod run;
pub(crate) mod suggest;
pub(crate) mod tiers;
pub(crate) mod validate;

/// Threads a search may estimate on: this machine's cores, at most 16.
pub(crate) fn workers() -> usize {
    std::thread::available_parallelism()
        .map_or(4, std::num::NonZeroUsize::get)
        .clamp(1, 16)
}
