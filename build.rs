//! One name for a condition the source would otherwise spell out at every use: `driver`, set
//! when any feature that classifies a database library's errors is on (without one, the
//! constraint tables and `DbError`'s driver variant have no caller).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(driver)");
    let driver = ["SQLX", "SQLX_0_8", "RUSQLITE", "LIBSQL"]
        .iter()
        .any(|f| std::env::var_os(format!("CARGO_FEATURE_{f}")).is_some());
    if driver {
        println!("cargo::rustc-cfg=driver");
    }
}
