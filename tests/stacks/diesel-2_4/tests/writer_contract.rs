//! The writer thread's contract on Diesel 2.4: `../../diesel_writer.rs`, shared with the
//! Diesel stack (2.3) and the other pinned release.

#[path = "../../diesel_writer.rs"]
mod contract;
