//! The model configs compiled into the binary (`data/models/*.json`).
