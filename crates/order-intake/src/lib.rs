#![warn(missing_docs)]
//! `order-intake`: the HTTP API of SPEC §4.
//!
//! A tour, in the order a request meets them:
//! - [`server`]: the accept loop, each connection under hyper with its two clocks
//!   ([`connection`]);
//! - `edge`: the bearer token first, then the user's rate and everyone's, and the body under
//!   its limit ([`limits`] holds the rates);
//! - [`routes`]: each route a short handler; [`request`] parses what arrives into types;
//! - [`orders`]: placing an order — the door ([`orderfleet::domain::door`]), the authorization
//!   outside any transaction, the one statement that records it — and answering a used key;
//! - [`views`]: what the buyer is shown; [`error`]: every refusal with its status and code;
//!   [`openapi`]: all of it as a document; [`metrics`]: every metric the intake exports.
//!
//! This module is the service: its configuration, its shared state, and its start. The
//! intake never calls SQS: an SQS outage cannot block it.

// Proving the order handler's future `Send` goes through async-stripe's deeply nested types
// (an authorization resumed after a saved 5xx nests one more level): more than the default
// recursion limit.
#![recursion_limit = "256"]

pub mod connection;
mod edge;
pub mod error;
pub mod limits;
pub mod metrics;
pub mod openapi;
pub mod orders;
pub mod request;
pub mod routes;
pub mod server;
pub mod views;
pub mod webhook;

pub use routes::router;
pub use server::run;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use orderfleet::domain::door::SoldOutReads;
use orderfleet::domain::tokens::TokenVerifier;
use orderfleet_payments::StripeConfig;
use orderfleet_payments::{Payments, RetryPolicy};
use orderfleet_runtime::config::{AuthConfig, ConfigError, DatabaseConfig, Env, RuntimeConfig};
use orderfleet_runtime::db::Pool;
use orderfleet_runtime::db::{self, PoolSize};
use orderfleet_runtime::ops;
use orderfleet_runtime::service::Service;
use orderfleet_runtime::tasks::Tasks;
use orderfleet_runtime::trace::CallerTrace;
use tokio_util::sync::CancellationToken;

use crate::limits::{Limits, LimitsConfig};

/// Everything the intake reads at start.
#[derive(Debug, Clone)]
pub struct IntakeConfig {
    /// `INTAKE_LISTEN_ADDR`: where the API listens.
    pub listen_addr: SocketAddr,
    /// `DATABASE_URL` and its pool.
    pub database: DatabaseConfig,
    /// The Stripe key, API base and request budget.
    pub stripe: StripeConfig,
    /// How bearer tokens are checked.
    pub auth: AuthConfig,
    /// How long a request holds an order's lease (its key) before a retry or the sweeper may
    /// take over: the request timeout, past which the placement is dropped, and the margin
    /// ([`orderfleet::domain::records::order::lease_for`]).
    pub lease: Duration,
    /// The rate limits, slow-client timeouts and the card-testing gate.
    pub limits: LimitsConfig,
    /// Whose trace a request with a `traceparent` joins (`INTAKE_CALLER_TRACE`).
    pub caller_trace: CallerTrace,
    /// `STRIPE_WEBHOOK_SECRET`: the webhook endpoint's signing secrets.
    pub webhook_secrets: webhook::WebhookSecrets,
}

/// The intake binary: the HTTP API, and the job that forgets quiet users' rate buckets.
impl Service for IntakeConfig {
    const NAME: &'static str = "order-intake";
    const METRICS: &'static [&'static [orderfleet_runtime::metrics::Metric]] =
        &[crate::metrics::ALL, orderfleet::metrics::ALL, orderfleet_payments::metrics::ALL];

    async fn load(env: &Env) -> Result<Self, ConfigError> {
        let limits = LimitsConfig::from_env(env)?;
        Ok(Self {
            listen_addr: env.or_default("INTAKE_LISTEN_ADDR", SocketAddr::from(([127, 0, 0, 1], 8080)))?,
            database: DatabaseConfig::from_env(env)?,
            stripe: StripeConfig::from_env(env)?,
            auth: AuthConfig::from_env(env)?,
            // A placement, the take of its lease included, is cut off at the request timeout
            // (`routes`), so a live request never loses the order's key to a retry: 60 s + 5 s.
            // The placement's own Stripe calls (27.6 s each at their longest) may need longer
            // than the timeout only when it resumes an order: then it is cut off, and the order
            // waits for its lease.
            lease: orderfleet::domain::records::order::lease_for(limits.request_timeout),
            limits,
            caller_trace: env.or_default("INTAKE_CALLER_TRACE", CallerTrace::Link)?,
            webhook_secrets: webhook::WebhookSecrets::from_env(env)?,
        })
    }

    async fn start(self, runtime: &RuntimeConfig, tasks: &mut Tasks) -> anyhow::Result<()> {
        let state = AppState::new(&self)?;
        let listener = ops::bind(self.listen_addr, "INTAKE_LISTEN_ADDR").await?;
        tracing::info!(addr = %self.listen_addr, "order-intake listening");
        let stop = tasks.stop_signal();
        tasks.spawn_loop(
            "forget-quiet-users",
            forget_quiet_users_every_minute(state.limits.clone(), stop.clone()),
        );
        // A request still running at the end of the grace is cut off: its order keeps its
        // lease, and a retry or the sweeper takes over.
        tasks.spawn_server("server", runtime.shutdown_grace, run(listener, state, stop));
        Ok(())
    }
}

/// What every request handler shares, in one allocation: axum hands each request (and each
/// layer) a copy, and the placement task takes one more, so a copy is a reference count, not a
/// clone of the pool, the Stripe client and the limits (in a herd of sold-out answers, cloning
/// and dropping those fields was 3 % of the intake's CPU).
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// The state itself ([`AppState`]).
pub struct Shared {
    /// The intake's pool (16 connections).
    pub pool: Pool,
    /// The Stripe client, with the intake's retries and budget.
    pub payments: Payments,
    /// Checks each request's bearer token.
    pub verifier: Arc<TokenVerifier>,
    /// How long a request holds an order's lease ([`IntakeConfig::lease`]).
    pub lease: Duration,
    /// The rate limits' state.
    pub limits: Arc<Limits>,
    /// Whose trace a request with a `traceparent` joins.
    pub caller_trace: CallerTrace,
    /// The webhook endpoint's signing secrets.
    pub webhook_secrets: webhook::WebhookSecrets,
    /// Placements running as tasks of their own ([`routes`]), at most `INTAKE_MAX_IN_FLIGHT`:
    /// a buyer who hangs up leaves the request's bound, not the placement's.
    pub placements: Arc<tokio::sync::Semaphore>,
    /// The same tasks, so a stop waits for them ([`server::run`]).
    pub placing: tokio_util::task::TaskTracker,
    /// The reads of a product that this intake's waiting requests share, for `sold_out`.
    pub sold_out_reads: Arc<SoldOutReads>,
}

impl AppState {
    /// Builds the shared state; the pool connects lazily, so a database down at start is an
    /// unready `/healthz`, not a crash.
    pub fn new(config: &IntakeConfig) -> anyhow::Result<Self> {
        let pool = db::connect_lazy(
            &config.database,
            PoolSize {
                max_connections: 16,
                min_connections: 4,
                application_name: "order-intake",
                ..PoolSize::default()
            },
        )?;
        let payments = Payments::new(&config.stripe, RetryPolicy::default(), pool.clone())?;
        Ok(Self(Arc::new(Shared {
            pool,
            payments,
            verifier: Arc::new(verifier(&config.auth)?),
            lease: config.lease,
            limits: Arc::new(Limits::new(config.limits)),
            caller_trace: config.caller_trace,
            webhook_secrets: config.webhook_secrets.clone(),
            placements: Arc::new(tokio::sync::Semaphore::new(config.limits.max_in_flight)),
            placing: tokio_util::task::TaskTracker::new(),
            sold_out_reads: Arc::default(),
        })))
    }
}

/// The bearer tokens' verifier: HS256 under the secret, and, with `AUTH_JWKS_URL`, the identity
/// provider's keys, whose set is fetched now, in the background (a provider unreachable at start
/// refuses its tokens until a token's `kid` fetches the set again; HS256 ones are unaffected).
fn verifier(auth: &orderfleet_runtime::config::AuthConfig) -> anyhow::Result<TokenVerifier> {
    use orderfleet::domain::tokens::jwks::KeySet;
    let verifier = TokenVerifier::new(auth);
    let Some(url) = auth.jwks_url.as_deref() else { return Ok(verifier) };
    let keys = Arc::new(KeySet::new(url)?);
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        let fetching = keys.clone();
        runtime.spawn(async move {
            match fetching.fetch().await {
                Ok(count) => tracing::info!(keys = count, "fetched the identity provider's keys"),
                Err(e) => tracing::warn!(
                    error = format!("{e:#}"),
                    "could not fetch the identity provider's keys at start"
                ),
            }
        });
    }
    Ok(verifier.with_provider(keys))
}

/// The per-user buckets of quiet users are dropped every minute, so memory follows the users
/// of the last minute, not every user ever seen.
async fn forget_quiet_users_every_minute(limits: Arc<Limits>, stop: CancellationToken) {
    let mut every = tokio::time::interval(Duration::from_secs(60));
    while tokio::select! { _ = every.tick() => true, () = stop.cancelled() => false } {
        limits.forget_quiet_users();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(extra: &[(&'a str, &'a str)]) -> Env {
        let base = [
            ("DATABASE_URL", "postgres://orderfleet:orderfleet@127.0.0.1:5432/orderfleet"),
            ("STRIPE_SECRET_KEY", "sk_test_lease"),
            ("AUTH_JWT_SECRET", "a-secret-of-thirty-two-bytes-or-more-for-hs256"),
        ];
        Env::from_pairs(base.into_iter().chain(extra.iter().copied()))
    }

    #[tokio::test]
    async fn the_intake_s_lease_outlasts_a_placement_cut_off_at_the_request_timeout() {
        for extra in [&[][..], &[("INTAKE_REQUEST_TIMEOUT_SECONDS", "120")][..]] {
            // Arrange
            let config = IntakeConfig::load(&env(extra)).await.unwrap();

            // Assert: a placement runs until the request timeout at most (`routes`), and a
            // statement it sent just before may run on for the server's statement timeout.
            let longest = config.limits.request_timeout + orderfleet_runtime::db::STATEMENT_TIMEOUT;
            assert!(
                config.lease >= longest,
                "a lease of {:?} for a placement of up to {longest:?}",
                config.lease
            );
        }
    }
}
