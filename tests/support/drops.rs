//! A drop as an operator sets it up: `fleetctl product upsert` with its flags, and times given
//! as `--opens-at` takes them.

use crate::Fleet;

/// RFC 3339 of now and `seconds` (negative: before now).
pub fn at(seconds: i64) -> String {
    (chrono::Utc::now() + chrono::TimeDelta::seconds(seconds)).to_rfc3339()
}

/// `fleetctl product upsert` of `id` at 15.00 USD with `stock` units and the given flags
/// (`--opens-at`, `--max-per-card`, …); what the command printed.
pub async fn upsert(fleet: &Fleet, id: &str, stock: i32, flags: &[&str]) -> anyhow::Result<String> {
    let stock = stock.to_string();
    let mut args = vec![
        "product",
        "upsert",
        "--id",
        id,
        "--name",
        id,
        "--price",
        "1500",
        "--currency",
        "usd",
        "--stock",
        &stock,
    ];
    args.extend_from_slice(flags);
    fleet.fleetctl(&args, &[]).await
}
