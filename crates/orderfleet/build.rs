//! Rebuilds this crate when a migration changes: `sqlx::migrate!` embeds `migrations/` at
//! compile time, and cargo does not know it reads that directory. Without this, an edited
//! migration leaves binaries with the old text, and the next `fleetctl migrate` refuses the
//! database ("previously applied but has been modified"). What sqlx's docs advise.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
