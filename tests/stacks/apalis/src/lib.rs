//! A test-only package: see `tests/stack.rs`.
