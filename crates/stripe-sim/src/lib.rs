#![warn(missing_docs)]
//! `stripe-sim`: a local, stateful stand-in for the part of Stripe's API the fleet uses
//! (SPEC §6), so the same async-stripe code runs against it in demos and tests and against
//! Stripe in production, and so tests can make Stripe fail on purpose.
//!
//! It speaks Stripe's shapes: form-encoded requests, PaymentIntent, Charge, Refund and
//! Dispute JSON objects, Stripe's error JSON and status codes, `Request-Id` headers, Stripe's
//! rules for idempotency keys, manual capture, cancellation, 3-D Secure and refunds, and
//! Stripe's signed webhook events.
//!
//! A short tour:
//! - `api`: the Stripe routes, and the edge every write passes in order (the rate limit,
//!   authentication, injected faults, idempotency, the operation).
//! - `form` decodes form bodies; `parameters` refuses those an endpoint does not take (and the
//!   removed `payment_method_types`); `requests` parses them into typed requests, checking
//!   each value as Stripe does (`requests::checks`).
//! - `intent` is the PaymentIntent state machine, what each card does at a confirm
//!   (`intent::outcome`, 3-D Secure's `requires_action` and `next_action` included) and its
//!   JSON (`intent::json`); `charge` the charge it makes, its refunds and its dispute;
//!   `cards` the test payment methods (`pm_card_visa`, `pm_card_chargeDeclined`,
//!   `pm_card_threeDSecure2Required`, `pm_card_createDispute`, …); `ledger` the intents
//!   themselves, and the events each operation causes.
//! - `events` turns what happened into Stripe's Event objects and signs them
//!   ([`signature_header`]); `webhooks` delivers them, at least once, to the endpoint
//!   `STRIPE_SIM_WEBHOOK_URL` (or [`Simulator::with_webhook_endpoint`]) names, from a
//!   background task, retrying until a `2xx` or, after `STRIPE_SIM_WEBHOOK_ATTEMPTS` (3)
//!   attempts, giving the event up.
//! - `idempotency` saves and replays first answers; `faults` holds injected failures.
//! - `rate` is Stripe's request rate limits, the account's and each named operation's
//!   (sliding one-second windows; none unless `STRIPE_SIM_RATE_LIMIT`,
//!   `STRIPE_SIM_ENDPOINT_RATE_LIMIT` or `POST /_sim/rate_limit` sets them), and the
//!   [`RequestStats`] counting the API requests seen, limited ones included.
//! - [`Simulator`] keeps all of it behind one lock; `control` serves `/_sim/…` for tests.
//!
//! State lives in memory only: restarting the simulator is a fresh test-mode account.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Arc;

use axum::Router;
use orderfleet_runtime::config::{ConfigError, Env, HttpUrl, RuntimeConfig};
use secrecy::{ExposeSecret, SecretString};
use tokio::net::TcpListener;

mod api;
mod auth;
mod cards;
mod charge;
mod control;
mod error;
mod events;
mod faults;
mod form;
mod idempotency;
mod ids;
mod intent;
mod ledger;
mod parameters;
mod rate;
mod requests;
mod simulator;
mod webhooks;

pub use events::signature_header;
pub use rate::RequestStats;
pub use simulator::{SimState, Simulator};
pub use webhooks::{DEFAULT_ATTEMPTS, WebhookAttempt, WebhookEndpoint};

/// Where the simulator listens unless `STRIPE_SIM_LISTEN_ADDR` says otherwise.
pub(crate) const DEFAULT_LISTEN_ADDR: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 12111);

/// What the `stripe-sim` binary reads from the environment.
#[derive(Debug, Clone)]
pub struct Config {
    /// `STRIPE_SIM_LISTEN_ADDR`.
    pub listen_addr: SocketAddr,
    /// `STRIPE_SIM_RATE_LIMIT`: API requests admitted in any one second; 0 (the default) for
    /// no limit.
    pub rate_limit: u32,
    /// `STRIPE_SIM_ENDPOINT_RATE_LIMIT`: API requests admitted in any one second on each named
    /// operation (`POST /v1/payment_intents`, …); 0 (the default) for no limit.
    pub endpoint_rate_limit: u32,
    /// `STRIPE_SIM_WEBHOOK_URL` and `STRIPE_SIM_WEBHOOK_SECRET` (both or neither): where to
    /// send Stripe's events, signed with that secret. None: no webhooks.
    pub webhook: Option<WebhookEndpoint>,
    /// `STRIPE_SIM_WEBHOOK_ATTEMPTS`: the delivery attempts of one event before it is given up;
    /// 3 (a sandbox's) unless set, at least 1.
    pub webhook_attempts: NonZeroU32,
}

impl Config {
    /// Reads `STRIPE_SIM_LISTEN_ADDR`, `STRIPE_SIM_RATE_LIMIT`,
    /// `STRIPE_SIM_ENDPOINT_RATE_LIMIT`, `STRIPE_SIM_WEBHOOK_URL`, `STRIPE_SIM_WEBHOOK_SECRET`
    /// and `STRIPE_SIM_WEBHOOK_ATTEMPTS`.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let url: Option<HttpUrl> = env.optional("STRIPE_SIM_WEBHOOK_URL")?;
        let secret: Option<SecretString> = env.optional("STRIPE_SIM_WEBHOOK_SECRET")?;
        let webhook = match (url, secret) {
            (Some(url), Some(secret)) => Some(WebhookEndpoint::new(url.as_str(), secret.expose_secret())),
            (None, None) => None,
            // One without the other is a half-made setting: say which half is missing.
            (Some(_), None) => return Err(ConfigError::Missing { name: "STRIPE_SIM_WEBHOOK_SECRET" }),
            (None, Some(_)) => return Err(ConfigError::Missing { name: "STRIPE_SIM_WEBHOOK_URL" }),
        };
        let attempts: u32 = env.or_default("STRIPE_SIM_WEBHOOK_ATTEMPTS", DEFAULT_ATTEMPTS.get())?;
        let webhook_attempts = NonZeroU32::new(attempts).ok_or_else(|| ConfigError::Malformed {
            name: "STRIPE_SIM_WEBHOOK_ATTEMPTS",
            reason: "an event needs at least 1 attempt".to_owned(),
        })?;
        Ok(Self {
            listen_addr: env.or_default("STRIPE_SIM_LISTEN_ADDR", DEFAULT_LISTEN_ADDR)?,
            rate_limit: env.or_default("STRIPE_SIM_RATE_LIMIT", 0)?,
            endpoint_rate_limit: env.or_default("STRIPE_SIM_ENDPOINT_RATE_LIMIT", 0)?,
            webhook,
            webhook_attempts,
        })
    }
}

/// The simulator as a binary: serves on `STRIPE_SIM_LISTEN_ADDR` until the stop signal, then
/// lets in-flight requests finish (they take microseconds; those held by a `timeout` fault are
/// let go) for up to `SHUTDOWN_GRACE_SECONDS`.
impl orderfleet_runtime::service::Service for Config {
    const NAME: &'static str = "stripe-sim";
    const METRICS: &'static [&'static [orderfleet_runtime::metrics::Metric]] = &[];

    async fn load(env: &Env) -> Result<Self, ConfigError> {
        Self::from_env(env)
    }

    async fn start(
        self,
        runtime: &RuntimeConfig,
        tasks: &mut orderfleet_runtime::tasks::Tasks,
    ) -> anyhow::Result<()> {
        use anyhow::Context;
        let config = self;
        let listener = orderfleet_runtime::ops::bind(config.listen_addr, "STRIPE_SIM_LISTEN_ADDR").await?;
        let addr = listener.local_addr().context("failed to read the listening address")?;
        let webhook_url = config.webhook.as_ref().map(|endpoint| endpoint.url().to_owned());
        tracing::info!(
            %addr,
            rate_limit_per_second = config.rate_limit,
            rate_limit_per_endpoint = config.endpoint_rate_limit,
            ?webhook_url,
            "stripe-sim listening"
        );
        let mut simulator = Simulator::new()
            .with_rate_limit(config.rate_limit)
            .with_endpoint_rate_limit(config.endpoint_rate_limit)
            .with_webhook_attempts(config.webhook_attempts);
        if let Some(endpoint) = config.webhook {
            simulator = simulator.with_webhook_endpoint(endpoint);
        }
        let simulator = Arc::new(simulator);
        let stop = tasks.stop_signal().cancelled_owned();
        tasks.spawn_server("server", runtime.shutdown_grace, async move {
            serve_with(simulator, listener, stop).await.context("the HTTP server failed")
        });
        Ok(())
    }
}

/// The HTTP application: Stripe's routes, the `/_sim` routes, and Stripe's 404 for anything
/// else.
pub fn router(state: SimState) -> Router {
    Router::new()
        .merge(api::routes())
        .merge(control::routes())
        .fallback(api::unrecognized)
        // After the merges: it applies to the routes registered so far.
        .method_not_allowed_fallback(api::unrecognized)
        // Around the routing, so unknown /v1 paths are limited and counted too; inside the
        // request id, so a 429 carries a `Request-Id` like every other answer.
        .layer(axum::middleware::from_fn_with_state(state.clone(), api::limit_rate))
        .layer(axum::middleware::from_fn(api::assign_request_id))
        .with_state(state)
}

/// Serves a fresh simulator, with no rate limit, on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(Arc::new(Simulator::new()), listener, shutdown).await
}

/// Serves `state` on `listener` until `shutdown` completes, then finishes the requests in
/// flight. Requests held by a `timeout` fault are let go at once rather than waited for.
///
/// With a webhook endpoint ([`Simulator::with_webhook_endpoint`]), it also delivers the
/// account's events there, from a background task, until `shutdown` completes. A test in
/// another crate starts one so:
///
/// ```no_run
/// # async fn example(listener: tokio::net::TcpListener, hook_url: String) {
/// use std::sync::Arc;
/// use stripe_sim::{Simulator, WebhookEndpoint};
///
/// let simulator = Simulator::new().with_webhook_endpoint(WebhookEndpoint::new(hook_url, "whsec_test"));
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// tokio::spawn(stripe_sim::serve_with(Arc::new(simulator), listener, async {
///     let _ = stopped.await;
/// }));
/// # drop(stop);
/// # }
/// ```
pub async fn serve_with(
    state: SimState,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    webhooks::start(state.webhooks(), state.stopping());
    let app = router(state.clone());
    let counted = state.clone();
    let listener = axum::serve::ListenerExt::tap_io(listener, move |_| counted.connected());
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            state.stop_hanging();
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listen_address_defaults_to_the_documented_port() {
        let config = Config::from_env(&Env::from_pairs([])).unwrap();
        assert_eq!(config.listen_addr.to_string(), "127.0.0.1:12111");
    }

    #[test]
    fn the_rate_limit_is_off_unless_set() {
        let unset = Config::from_env(&Env::from_pairs([])).unwrap();
        let set = Config::from_env(&Env::from_pairs([("STRIPE_SIM_RATE_LIMIT", "7")])).unwrap();
        let zero = Config::from_env(&Env::from_pairs([("STRIPE_SIM_RATE_LIMIT", "0")])).unwrap();
        assert_eq!((unset.rate_limit, set.rate_limit, zero.rate_limit), (0, 7, 0));
        assert_eq!(Simulator::new().with_rate_limit(set.rate_limit).rate_limit(), 7);
    }

    #[test]
    fn the_endpoint_rate_limit_is_off_unless_set() {
        let unset = Config::from_env(&Env::from_pairs([])).unwrap();
        let set = Config::from_env(&Env::from_pairs([("STRIPE_SIM_ENDPOINT_RATE_LIMIT", "25")])).unwrap();
        assert_eq!((unset.endpoint_rate_limit, set.endpoint_rate_limit), (0, 25));
        let simulator = Simulator::new().with_endpoint_rate_limit(set.endpoint_rate_limit);
        assert_eq!((simulator.rate_limit(), simulator.endpoint_rate_limit()), (0, 25));
    }

    #[test]
    fn a_malformed_rate_limit_is_named_in_one_line() {
        for name in ["STRIPE_SIM_RATE_LIMIT", "STRIPE_SIM_ENDPOINT_RATE_LIMIT"] {
            for raw in ["-1", "abc", "2.5"] {
                let error = Config::from_env(&Env::from_pairs([(name, raw)])).unwrap_err();
                let message = error.to_string();
                assert!(
                    message.starts_with(&format!("configuration error: {name} is malformed: ")),
                    "{message}"
                );
                assert!(!message.contains('\n'), "{message}");
            }
        }
    }

    #[test]
    fn webhooks_are_sent_only_with_both_the_url_and_the_secret() {
        let url = ("STRIPE_SIM_WEBHOOK_URL", "http://127.0.0.1:8080/webhooks/stripe");
        let secret = ("STRIPE_SIM_WEBHOOK_SECRET", "whsec_configured");

        let none = Config::from_env(&Env::from_pairs([])).unwrap();
        let both = Config::from_env(&Env::from_pairs([url, secret])).unwrap();
        let no_secret = Config::from_env(&Env::from_pairs([url])).unwrap_err();
        let no_url = Config::from_env(&Env::from_pairs([secret])).unwrap_err();
        let not_a_url =
            Config::from_env(&Env::from_pairs([("STRIPE_SIM_WEBHOOK_URL", "localhost:8080"), secret]))
                .unwrap_err();

        assert!(none.webhook.is_none());
        let endpoint = both.webhook.expect("an endpoint");
        assert_eq!(endpoint.url(), "http://127.0.0.1:8080/webhooks/stripe");
        assert!(!format!("{:?}", Config { webhook: Some(endpoint), ..none }).contains("whsec_configured"));
        assert_eq!(no_secret.variable(), "STRIPE_SIM_WEBHOOK_SECRET");
        assert_eq!(no_url.variable(), "STRIPE_SIM_WEBHOOK_URL");
        assert_eq!(not_a_url.variable(), "STRIPE_SIM_WEBHOOK_URL");
    }

    #[test]
    fn an_event_is_given_up_after_three_attempts_unless_set_and_never_before_the_first() {
        let unset = Config::from_env(&Env::from_pairs([])).unwrap();
        let set = Config::from_env(&Env::from_pairs([("STRIPE_SIM_WEBHOOK_ATTEMPTS", "8")])).unwrap();
        let zero = Config::from_env(&Env::from_pairs([("STRIPE_SIM_WEBHOOK_ATTEMPTS", "0")])).unwrap_err();
        let text = Config::from_env(&Env::from_pairs([("STRIPE_SIM_WEBHOOK_ATTEMPTS", "many")])).unwrap_err();

        assert_eq!((unset.webhook_attempts.get(), set.webhook_attempts.get()), (3, 8));
        assert_eq!(
            (zero.variable(), text.variable()),
            ("STRIPE_SIM_WEBHOOK_ATTEMPTS", "STRIPE_SIM_WEBHOOK_ATTEMPTS")
        );
        assert!(zero.to_string().contains("at least 1"), "{zero}");
    }

    #[test]
    fn a_malformed_listen_address_is_named_in_one_line() {
        let error =
            Config::from_env(&Env::from_pairs([("STRIPE_SIM_LISTEN_ADDR", "localhost")])).unwrap_err();
        assert!(
            error.to_string().starts_with("configuration error: STRIPE_SIM_LISTEN_ADDR is malformed: "),
            "{error}"
        );
    }
}
