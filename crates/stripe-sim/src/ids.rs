//! Object and request ids in Stripe's form: a type prefix, an underscore, random letters and
//! digits (`pi_…`, `ch_…`, `req_…`). Clients treat them as opaque strings.

use rand::distr::{Alphanumeric, SampleString};

/// A fresh id with this prefix, e.g. `new("pi")` → `pi_3Pq…`.
pub(crate) fn new(prefix: &str) -> String {
    format!("{prefix}_{}", random(24))
}

/// `len` random letters and digits.
pub(crate) fn random(len: usize) -> String {
    Alphanumeric.sample_string(&mut rand::rng(), len)
}

/// A random version-4 UUID in its usual text form (for the 3-D Secure server transaction id).
pub(crate) fn uuid() -> String {
    let hex: String = hex::encode(rand::random::<[u8; 16]>());
    format!("{}-{}-4{}-a{}-{}", &hex[0..8], &hex[8..12], &hex[13..16], &hex[17..20], &hex[20..32])
}

/// Now, in whole seconds since the Unix epoch, as Stripe dates its objects.
pub(crate) fn unix_now() -> i64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX)
}
