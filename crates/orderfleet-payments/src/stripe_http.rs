//! The HTTP client the fleet's Stripe requests go through: async-stripe's request types, sent
//! over a pool of kept-alive connections.
//!
//! async-stripe's own hyper client is built with `pool_max_idle_per_host(0)`: it keeps no idle
//! connection, so every request opens a new one — on real Stripe a TCP and a TLS handshake
//! (tens to ~150 ms, and about a millisecond of CPU) per authorization, capture or search. The
//! crate sends its requests through any [`StripeClient`], so this one is the crate's client
//! with the pool left on: the same connector (rustls with the webpki roots), the
//! same headers (the secret, the pinned `Stripe-Version`, the user agent), the same errors,
//! over HTTP/1.1 only (see [`PooledStripe::new`]).
//!
//! It sends each request once: the fleet retries itself, under its own idempotency key per
//! attempt (`orderfleet::domain::payments`), so a request strategy other than sending once (with
//! or without a key) is refused as a configuration error rather than silently followed.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderName, HeaderValue, USER_AGENT};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use stripe::StripeError;
use stripe_client_core::{CustomizedStripeRequest, RequestStrategy, StripeClient, StripeMethod};

/// How long an idle connection is kept: under the 60 s after which load balancers commonly
/// drop an idle flow, so the pool does not hand out one the far side has forgotten.
const IDLE_FOR: Duration = Duration::from_secs(50);

const STRIPE_VERSION: HeaderName = HeaderName::from_static("stripe-version");
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// How a 5xx to a request with a key begins when it is not a replay of the key's saved answer
/// ([`PooledStripe`]'s `execute`): the payments code takes it as a timeout, not as a saved
/// answer (`orderfleet::domain::payments`).
pub const UNSAVED_5XX: &str = "unsaved 5xx";

/// A Stripe client that keeps its connections.
#[derive(Clone, Debug)]
pub struct PooledStripe {
    http: Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>,
    /// `https://api.stripe.com/` or stripe-sim's, ending in `/`.
    api_base: String,
    secret: HeaderValue,
    version: HeaderValue,
    user_agent: HeaderValue,
    /// Stripe's clock, as the `Date` of its answers shows it; shared by every clone.
    clock: Arc<StripeClock>,
}

/// How far Stripe's clock is from this machine's, learnt from the `Date` header of every answer
/// (a second's resolution). A PaymentIntent's `created` is Stripe's time, so a window of
/// `created` for a moment of this machine's is shifted by it ([`PooledStripe::stripe_time`]).
#[derive(Debug, Default)]
struct StripeClock {
    /// Stripe's time minus ours, in milliseconds; [`StripeClock::UNKNOWN`] until an answer came.
    offset_ms: AtomicI64,
}

impl StripeClock {
    const UNKNOWN: i64 = i64::MIN;

    fn new() -> Self {
        Self { offset_ms: AtomicI64::new(Self::UNKNOWN) }
    }

    /// Learns the offset from an answer's `Date`, received now.
    fn observe(&self, date: Option<&HeaderValue>) {
        let Some(stripe) =
            date.and_then(|d| d.to_str().ok()).and_then(|d| chrono::DateTime::parse_from_rfc2822(d).ok())
        else {
            return;
        };
        let offset = stripe.timestamp_millis() - chrono::Utc::now().timestamp_millis();
        self.offset_ms.store(offset, Ordering::Relaxed);
    }

    fn offset(&self) -> Option<chrono::TimeDelta> {
        match self.offset_ms.load(Ordering::Relaxed) {
            Self::UNKNOWN => None,
            ms => Some(chrono::TimeDelta::milliseconds(ms)),
        }
    }
}

impl PooledStripe {
    /// A client for the account of `secret_key`, at `api_base` (ending in `/`).
    pub fn new(secret_key: &str, api_base: &str) -> Result<Self, StripeError> {
        orderfleet_runtime::install_crypto_provider();
        // HTTP/1.1 only. Under HTTP/2 the pool shares one connection across every request and
        // each use keeps it fresh, so one that a network fault left silently dead (no reset)
        // would take every request until the kernel gives up on it, minutes later; a request
        // that times out on an HTTP/1.1 connection closes that connection, so a dead one costs
        // one timeout and is never handed out again. (stripe-sim speaks HTTP/1.1 only, so this
        // is also the protocol the suite proves.)
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .build();
        let http = Client::builder(TokioExecutor::new()).pool_idle_timeout(IDLE_FOR).build(connector);
        let mut secret = HeaderValue::try_from(format!("Bearer {secret_key}"))
            .map_err(|_| StripeError::ConfigError("the secret key is not a valid header value".into()))?;
        secret.set_sensitive(true);
        let base = if api_base.ends_with('/') { api_base.to_owned() } else { format!("{api_base}/") };
        Ok(Self {
            http,
            api_base: base,
            secret,
            version: HeaderValue::from_static(stripe_shared::version::VERSION.as_str()),
            // What async-stripe 1.0.0-rc.10 (pinned) sends.
            user_agent: HeaderValue::from_static("Stripe/v1 RustBindings/1.0.0-rc.10"),
            clock: Arc::new(StripeClock::new()),
        })
    }

    /// The moment `ours` (this machine's time) on Stripe's clock, as far as its answers have
    /// shown it; `None` before the first answer with a `Date`.
    pub fn stripe_time(&self, ours: chrono::DateTime<chrono::Utc>) -> Option<chrono::DateTime<chrono::Utc>> {
        self.clock.offset().map(|offset| ours + offset)
    }

    async fn send(
        &self,
        request: hyper::Request<Full<Bytes>>,
    ) -> Result<(hyper::StatusCode, bool, Bytes), StripeError> {
        let response =
            self.http.request(request).await.map_err(|e| StripeError::ClientError(e.to_string()))?;
        let status = response.status();
        self.clock.observe(response.headers().get(hyper::header::DATE));
        let replayed = response.headers().get(IDEMPOTENT_REPLAYED).is_some_and(|v| v.as_bytes() == b"true");
        let body =
            response.into_body().collect().await.map_err(|e| StripeError::ClientError(e.to_string()))?;
        Ok((status, replayed, body.to_bytes()))
    }
}

impl StripeClient for PooledStripe {
    type Err = StripeError;

    async fn execute(&self, request: CustomizedStripeRequest) -> Result<Bytes, StripeError> {
        let (request, config) = request.into_pieces();
        let key = match config.request_strategy.unwrap_or(RequestStrategy::Once) {
            RequestStrategy::Once => None,
            RequestStrategy::Idempotent(key) => Some(key),
            other => {
                return Err(StripeError::ConfigError(format!(
                    "{other:?}: the fleet retries itself, each attempt under its own key"
                )));
            }
        };
        let mut uri = format!("{}v1{}", self.api_base, request.path);
        if let Some(query) = &request.query {
            uri = format!("{uri}?{query}");
        }
        let method = match request.method {
            StripeMethod::Get => hyper::Method::GET,
            StripeMethod::Post => hyper::Method::POST,
            StripeMethod::Delete => hyper::Method::DELETE,
        };
        let mut builder = hyper::Request::builder()
            .method(method)
            .uri(uri)
            .header(AUTHORIZATION, self.secret.clone())
            .header(USER_AGENT, self.user_agent.clone())
            .header(STRIPE_VERSION, self.version.clone());
        if let Some(key) = &key {
            builder = builder.header(IDEMPOTENCY_KEY, key.as_str());
        }
        if request.body.is_some() {
            builder =
                builder.header(CONTENT_TYPE, HeaderValue::from_static("application/x-www-form-urlencoded"));
        }
        let body = Full::new(request.body.map(Bytes::from).unwrap_or_default());
        let http_request = builder.body(body).map_err(|e| StripeError::ClientError(e.to_string()))?;
        let sent = self.send(http_request);
        let (status, replayed, bytes) = match config.timeout {
            Some(limit) => tokio::time::timeout(limit, sent).await.map_err(|_| StripeError::Timeout)??,
            None => sent.await?,
        };
        answer(status, replayed, key.is_some(), bytes)
    }
}

/// What an answer means: its body on success, else the error. `replayed`: Stripe said it
/// replays the key's saved answer (`Idempotent-Replayed: true`); `keyed`: the request had a key.
fn answer(
    status: hyper::StatusCode,
    replayed: bool,
    keyed: bool,
    bytes: Bytes,
) -> Result<Bytes, StripeError> {
    if status.is_success() {
        return Ok(bytes);
    }
    // A 5xx is the key's saved answer only when Stripe says it replays one: that proves the
    // key's one execution has ended. Any other 5xx may come from a layer in front of the
    // idempotency store ("rate limiters run before the API's idempotency layer",
    // docs.stripe.com/error-low-level) while an earlier try under the key is still executing,
    // so it is taken as a timeout is: the same key again, whose replay (or result) tells what
    // the key did.
    if status.is_server_error() && keyed && !replayed {
        return Err(StripeError::ClientError(format!(
            "{UNSAVED_5XX}: HTTP {} not replayed from the key's saved answer",
            status.as_u16()
        )));
    }
    // Stripe's error body, as async-stripe's own client reads it.
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| StripeError::JSONDeserialize("the error answer is not UTF-8".into()))?;
    Err(miniserde::json::from_str::<stripe_shared::Error>(text)
        .map(|e| StripeError::Stripe(e.error, status.as_u16()))
        .unwrap_or_else(|_| StripeError::JSONDeserialize("error deserializing Stripe error".into())))
}
