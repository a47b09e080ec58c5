//! The write path's integration tests, in one crate so that `cargo test` links them once:
//! `WritePool` and `WriteTransaction` on real SQLite files, group commit, checkpoints, crash
//! (SIGKILL) and power-loss tests (the read limit's tests are a crate of their own: they
//! assert what happens while no writer of the process waits). The crash and power-loss tests run this
//! same binary as their child server (`current_exe`, one test by its full name).

#[path = "../common/mod.rs"]
mod common;

mod operation_write;
mod power_loss;
mod processes;
mod write_crash;
mod write_group;
mod write_observability;
mod write_path;
mod write_stress;
mod write_thread;
mod write_thread_contract;
mod write_trust;
