//! What makes a commit durable, shared by both front ends (the sqlx path's group commit and
//! the writer thread's fsync thread): the WAL's descriptor and its sync (`wal.rs`: the file
//! it is, its writeback errors heard), and what a shared fsync reports and bounds
//! (`report.rs`).

pub(crate) mod report;
pub(crate) mod wal;
