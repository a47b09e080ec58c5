//! Nothing: this package is its test, `tests/writer_contract.rs` (the writer thread's contract
//! on Diesel 2.4).
