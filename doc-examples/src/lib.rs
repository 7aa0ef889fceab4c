//! Nothing to use: this crate's test compiles the Rust examples of Baton's README and `docs/`
//! (see `build.rs` and `tests/doc_examples.rs`).
