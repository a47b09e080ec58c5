//! The layer's integration tests, in one crate so that `cargo test` links them once: the
//! replay over real HTTP and real SQLite files, the classification of real driver errors
//! (PostgreSQL's and MySQL's with their features and servers), admission, the edge contract,
//! tracing and metrics, and the API's shape. Each module is one former test file; the model
//! checks (`tests/*_model.rs`), the operator's kit and the hyper-only test are crates of
//! their own (they need their own crate root, features or a global recorder).

// `common` and the stack harness (`stack_sqlx`) each include `tests/common/server.rs`: the
// harness is also the stack packages' own (tests/stacks/), which have no `common`.
#![allow(clippy::duplicate_mod)]

#[path = "../common/mod.rs"]
mod common;

// The example app's exporter setup, as `metrics` checks it.
#[allow(dead_code)]
#[path = "../../examples/common/prometheus.rs"]
mod prometheus;

mod admission;
mod admission_stress;
mod api;
mod body;
mod classify;
mod contention;
mod edge;
mod http2;
mod layering;
mod metrics;
mod mysql;
mod operation;
mod operation_scope;
mod postgres;
mod reliability;
mod replay;
mod request_state;
mod routing;
mod service;
mod stack;
mod stack_sqlx;
mod state_machine;
mod tracing;
mod waiting_out;
