//! The writer thread's contract on this package's Diesel (2.3): `../../diesel_writer.rs`,
//! shared with the packages that pin Diesel 2.2 and 2.4.

#[path = "../../diesel_writer.rs"]
mod contract;
