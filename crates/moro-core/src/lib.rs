//! moro-core: the pure heart of moro.
//!
//! Everything here is a function over plain data. No files, environment, network,
//! processes or clock: callers at the edge read bytes and hand them in. CI checks that
//! this crate's dependency tree has no I/O crates (`.ci/check-core-purity`).
//!
//! - [`model`]: the architecture description ([`model::ModelSpec`]) and exact parameter counts.
//! - [`arch`]: HF `config.json` bytes → [`model::ModelSpec`], per `model_type`.
//! - [`catalog`]: the configs compiled into the binary.
//! - [`job`]: what is being run (method, quantization, LoRA, optimizer, shape, stack).
//! - [`estimate`]: the peak-memory model.
//! - [`formats`]: safetensors and GGUF header parsers over bytes.
//! - [`hardware`]: the GPU catalog, [`hardware::Device`] and the `--hardware` parser.
//! - [`units`]: byte constants and formatting helpers.
//! - [`vision`]: a vision-language model's tower, projector and image tokens.
//! - [`search`]: the recipe search (best configuration that fits a GPU).

pub mod arch;
pub mod bound;
pub mod caching_allocator;
pub mod catalog;
pub mod estimate;
pub mod formats;
pub mod hardware;
pub mod job;
pub mod model;
pub mod mps_allocator;
pub mod search;
pub mod stack;
pub mod targets;
pub mod units;
pub mod validation;
pub mod vision;
pub mod vocabulary;
