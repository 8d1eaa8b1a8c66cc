//! The named choices of moro.yaml: the engine's one vocabulary ([`moro_core::vocabulary`]),
//! which the file, the command line and the schema share.

pub use moro_core::vocabulary::*;
