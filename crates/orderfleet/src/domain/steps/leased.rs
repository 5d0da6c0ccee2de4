//! Work on an order under its lease (a pending order's authorization, a 3-D Secure settle):
//! run within its deadline, and why it stopped without recording an answer. Below both the
//! authorization and the settle, which share them.

use std::time::Duration;

/// Why authorizing did not record an answer.
#[derive(Debug, thiserror::Error)]
pub enum AuthorizationError {
    /// Stripe could not be reached (or kept failing) after the bounded retries. The order stays
    /// `pending_authorization` with its lease released: a retry or the sweeper finishes it.
    #[error("payment provider unavailable: {0}")]
    ProviderUnavailable(String),
    /// Stripe refused to say whether the order already has a PaymentIntent (its list
    /// failed for good): authorizing again could place a second hold, so the order stays
    /// pending for a person (`fleetctl sweep` lists it as stuck).
    #[error("cannot look the order up at Stripe: {0}")]
    LookupRefused(String),
    /// The database refuses the order's move for good, and its end as failed too
    /// ([`crate::domain::steps::refusal`]): the order is for a person, with why; its hold is released
    /// (or its release owed) all the same.
    #[error("the database refuses the order: {0}")]
    OrderRefused(String),
    /// The database failed; the order keeps its lease until it expires.
    #[error("database error")]
    Database(#[from] sqlx::Error),
}

/// Runs a leased order's `work` within `deadline`; past it the work is dropped (a Stripe call in
/// flight is abandoned as a timeout is, a statement's connection is closed) and the order keeps
/// its lease until the lease lapses: Stripe answered too slowly to finish now.
pub(crate) async fn within<T>(
    deadline: Duration,
    work: impl Future<Output = Result<T, AuthorizationError>>,
) -> Result<T, AuthorizationError> {
    tokio::time::timeout(deadline, work).await.unwrap_or_else(|_| {
        Err(AuthorizationError::ProviderUnavailable(format!(
            "the work on the order did not finish within {deadline:?}; its lease lapses"
        )))
    })
}
