//! `sqlx::migrate!` embeds the migrations when this crate compiles; Cargo does not know a new
//! or changed file in `migrations/` is an input, so this says so (sqlx's advice for the macro).
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
