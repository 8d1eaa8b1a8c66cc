//! The peak-memory model.
