//! Pure parsers for weight-file headers: safetensors (single files and sharded indexes) and
//! GGUF.
//!
//! Every parser here takes bytes (`&[u8]`) that the caller read from a file or fetched with an
//! HTTP `Range` request; none opens files or sockets. Hostile input (a header length of 2^63,
//! a truncated file, JSON nested a million deep, a GGUF array of 2^60 elements, a wrong magic)
//! is a one-line error: lengths and counts are checked against the bytes actually present
//! before anything is allocated, so memory stays bounded by the input size.

pub mod gguf;
pub mod safetensors;
