//! The simulator's whole state (intents, idempotency keys, armed faults, the rate limits and
//! their counts) behind one `std::sync::Mutex`.
//!
//! One lock keeps the rules simple: an idempotency lookup, the operation and the saving of
//! its answer are one atomic step, so two requests with one key cannot both execute, and a
//! request finds a key in use only where a fault keeps its first request executing
//! ([`Pace`], [`Simulator::hold_key`]); and the
//! rate limits read the clock under it, so arrivals reach their windows in time order. Nothing
//! awaits while holding it; every operation is a few map lookups.
//!
//! The events an operation causes are queued for the webhook endpoint under the same lock, so
//! they are queued in the order the operations ran; the delivery itself happens outside it
//! ([`crate::webhooks`]).

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::error::StripeError;
use crate::events::{Cause, Event};
use crate::faults::{Faults, Mode, Operation, SLOW_CONFIRM};
use crate::idempotency::{Held, IdempotencyStore, Lookup, Saved, Scope};
use crate::ids::unix_now;
use crate::ledger::{Ledger, Reply};
use crate::rate::{Limits, RequestStats, Traffic, Verdict};
use crate::requests::Expand;
use crate::webhooks::{DeliveryMode, WebhookAttempt, WebhookEndpoint, Webhooks};

/// What [`crate::router`] serves from. Cheap to clone.
pub type SimState = Arc<Simulator>;

/// An in-memory Stripe account in test mode.
#[derive(Debug)]
pub struct Simulator {
    state: Mutex<State>,
    hang: Duration,
    /// How long a request struck by `slow_confirm` goes on executing after its operation ran.
    slow: Duration,
    stopping: CancellationToken,
    webhooks: Arc<Webhooks>,
}

#[derive(Debug, Default)]
struct State {
    ledger: Ledger,
    keys: IdempotencyStore,
    faults: Faults,
    traffic: Traffic,
    /// Seconds before a new intent shows in search: Stripe's search "may lag" its writes, and
    /// objects are "usually" searchable within a minute (docs.stripe.com/search). 0: none.
    search_lag_seconds: u32,
}

/// How an idempotent operation went.
#[derive(Debug)]
pub(crate) enum Executed {
    /// It ran; this is its answer.
    Ran(Reply),
    /// The key had an answer for this very request already.
    Replayed(Saved),
    /// It did not run: bad parameters, a key used for something else, or one in use.
    Refused(StripeError),
}

/// How long a request goes on executing once its operation has run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pace {
    /// It ends with its operation: no other request ever sees it executing.
    AtOnce,
    /// It goes on for [`SLOW_CONFIRM`] (the `slow_confirm` fault; see
    /// [`Simulator::with_slow_requests`]): its key is in use
    /// meanwhile, and, for a create (`mid_confirm`), its intent reads as mid-confirm.
    Slow { mid_confirm: bool },
}

impl Pace {
    fn executing_until(self, ran_at: Instant, slow: Duration) -> Option<Instant> {
        match self {
            Pace::AtOnce => None,
            Pace::Slow { .. } => Some(ran_at + slow),
        }
    }
}

/// A key held by a request the simulator holds ([`Simulator::hold_key`]); dropping it ends
/// the hold, with nothing saved.
pub(crate) struct KeyHeld {
    sim: SimState,
    held: Held,
}

impl Drop for KeyHeld {
    fn drop(&mut self) {
        self.sim.lock().keys.release(&self.held);
    }
}

/// The refusal a request under `scope` meets at `now` from its key (used for another request,
/// or in use), or its first answer to replay; `None` when the key is unused.
fn refused_by_key(keys: &IdempotencyStore, scope: &Scope, now: Instant) -> Option<Executed> {
    match keys.lookup(scope, now) {
        Lookup::Unused => None,
        Lookup::Replay(saved) => Some(Executed::Replayed(saved.clone())),
        Lookup::Conflict(error) => Some(Executed::Refused(error)),
    }
}

/// The id of the PaymentIntent an answer carries, if it carries one.
fn intent_id(reply: &Reply) -> Option<String> {
    let answered: Value = serde_json::from_str(&reply.body).ok()?;
    answered["id"].as_str().filter(|id| id.starts_with("pi_")).map(str::to_owned)
}

impl Default for Simulator {
    fn default() -> Self {
        Self::new()
    }
}

impl Simulator {
    /// How long a `timeout` fault holds a request: longer than any sensible client timeout.
    pub(crate) const DEFAULT_HANG: Duration = Duration::from_secs(120);

    /// An empty account: no intents, no saved keys, no faults, no rate limit, no webhook
    /// endpoint.
    pub fn new() -> Self {
        Self {
            state: Mutex::default(),
            hang: Self::DEFAULT_HANG,
            slow: SLOW_CONFIRM,
            stopping: CancellationToken::new(),
            webhooks: Arc::new(Webhooks::new(None)),
        }
    }

    /// Sends this account's events to `endpoint`, signed with its secret, as
    /// `STRIPE_SIM_WEBHOOK_URL` and `STRIPE_SIM_WEBHOOK_SECRET` do for the binary. Delivery
    /// starts when [`crate::serve_with`] serves the simulator and stops when it stops; events
    /// from before are kept until then.
    pub fn with_webhook_endpoint(self, endpoint: WebhookEndpoint) -> Self {
        let webhooks = Webhooks::new(Some(endpoint));
        webhooks.set_attempts(self.webhooks.max_attempts());
        Self { webhooks: Arc::new(webhooks), ..self }
    }

    /// Makes a request struck by the `slow_confirm` fault go on executing for `slow` after its
    /// operation ran (10 s unless set): its key in use, a create's intent read as mid-confirm.
    /// A test of what happens once it ends need not wait the whole default.
    pub fn with_slow_requests(self, slow: Duration) -> Self {
        Self { slow, ..self }
    }

    /// Gives up an event after `attempts` failed delivery attempts (3 unless set, as a
    /// sandbox does), as `STRIPE_SIM_WEBHOOK_ATTEMPTS` does for the binary.
    pub fn with_webhook_attempts(self, attempts: NonZeroU32) -> Self {
        self.webhooks.set_attempts(attempts);
        self
    }

    /// Every webhook delivery attempt so far (since the start or the last reset), in the
    /// order the endpoint's answers came (`GET /_sim/webhooks`).
    pub fn webhook_attempts(&self) -> Vec<WebhookAttempt> {
        self.webhooks.attempts()
    }

    pub(crate) fn webhooks(&self) -> &Arc<Webhooks> {
        &self.webhooks
    }

    /// From now on, each event is sent `duplicate`ly (twice) and each copy held a random
    /// 0..`max_delay_ms` ms first (`POST /_sim/webhooks`).
    pub(crate) fn set_delivery_mode(&self, mode: DeliveryMode) {
        self.webhooks.set_mode(mode);
    }

    /// Limits the API to `per_second` requests in any one second (0: no limit), as
    /// `STRIPE_SIM_RATE_LIMIT` does for the binary.
    pub fn with_rate_limit(self, per_second: u32) -> Self {
        self.set_rate_limit(per_second);
        self
    }

    /// Limits each named operation (`POST /v1/payment_intents`, `GET
    /// /v1/payment_intents/{id}`, …) to `per_endpoint` requests in any one second (0: no
    /// limit), as `STRIPE_SIM_ENDPOINT_RATE_LIMIT` does for the binary.
    pub fn with_endpoint_rate_limit(self, per_endpoint: u32) -> Self {
        self.set_endpoint_rate_limit(per_endpoint);
        self
    }

    /// Changes the account's rate limit (0 clears it), as `POST /_sim/rate_limit`
    /// `{"per_second": N}` does. Requests admitted in the last second count against the new
    /// limit.
    pub fn set_rate_limit(&self, per_second: u32) {
        let mut state = self.lock();
        let limits = Limits { per_second: NonZeroU32::new(per_second), ..state.traffic.limits() };
        state.traffic.set_limits(limits);
    }

    /// Changes each operation's rate limit (0 clears it), as `POST /_sim/rate_limit`
    /// `{"per_endpoint": M}` does.
    pub fn set_endpoint_rate_limit(&self, per_endpoint: u32) {
        let mut state = self.lock();
        let limits = Limits { per_endpoint: NonZeroU32::new(per_endpoint), ..state.traffic.limits() };
        state.traffic.set_limits(limits);
    }

    /// API requests admitted per second; 0 when there is no limit.
    pub fn rate_limit(&self) -> u32 {
        self.lock().traffic.limits().per_second.map_or(0, NonZeroU32::get)
    }

    /// API requests admitted per second on each named operation; 0 when there is no limit.
    pub fn endpoint_rate_limit(&self) -> u32 {
        self.lock().traffic.limits().per_endpoint.map_or(0, NonZeroU32::get)
    }

    /// The API requests seen since start or the last [`reset`](Self::reset).
    pub fn stats(&self) -> RequestStats {
        self.lock().traffic.stats()
    }

    /// Forgets every intent, idempotency key and fault, and zeroes the request counts. The
    /// rate limits stay: they are how the simulator was set up (`STRIPE_SIM_RATE_LIMIT`,
    /// `STRIPE_SIM_ENDPOINT_RATE_LIMIT`), not something the account did, so a test resetting
    /// between cases keeps the limits it runs under. Their windows start empty again.
    pub fn reset(&self) {
        let mut state = self.lock();
        let limits = state.traffic.limits();
        *state = State { traffic: Traffic::with_limits(limits), ..State::default() };
        self.webhooks.forget_attempts();
    }
    /// Forgets every saved idempotency key, keeping the intents: what Stripe does to a key 24
    /// hours after its first use. A request with an old key then runs again as a new one. A
    /// key whose request is still executing stays in use.
    pub(crate) fn expire_idempotency_keys(&self) -> usize {
        self.lock().keys.expire(Instant::now())
    }

    /// Ends every request a `timeout` fault is holding, so a graceful shutdown is not kept
    /// waiting on them, and stops the webhook deliveries. [`crate::serve_with`] calls this when
    /// its shutdown signal fires.
    pub(crate) fn stop_hanging(&self) {
        self.stopping.cancel();
    }

    /// What [`stop_hanging`](Self::stop_hanging) fires.
    pub(crate) fn stopping(&self) -> CancellationToken {
        self.stopping.clone()
    }

    /// A poisoned lock means an operation panicked half-way; the state is still the best
    /// record there is, and a test double must keep answering.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a TCP connection accepted.
    pub(crate) fn connected(&self) {
        self.lock().traffic.connected();
    }

    /// TCP connections accepted since the start or the last reset (`GET /_sim/connections`).
    pub fn connections(&self) -> u64 {
        self.lock().traffic.connections()
    }

    /// Counts one API request for `operation` (`None`: a path the simulator does not serve)
    /// and judges it against the rate limits.
    pub(crate) fn admit(&self, operation: Option<&'static str>) -> Verdict {
        let mut state = self.lock();
        // Read under the lock, so concurrent arrivals join the windows in time order.
        state.traffic.arrive(Instant::now(), operation)
    }

    pub(crate) fn take_fault(&self, operation: Operation) -> Option<Mode> {
        let mode = self.lock().faults.take(operation);
        if let Some(mode) = mode {
            tracing::warn!(operation = operation.as_str(), mode = mode.as_str(), "injecting a fault");
        }
        mode
    }

    /// Holds a request for the `timeout` fault: until the hang is over or the server stops.
    pub(crate) async fn hang(&self) {
        tokio::select! {
            () = tokio::time::sleep(self.hang) => {}
            () = self.stopping.cancelled() => {}
        }
    }

    /// Runs one state-changing operation under Stripe's idempotency rules, at `pace`.
    /// `operation` answers `Err` when it refuses the request before executing it (nothing is
    /// saved then) and `Ok` with the answer otherwise, error answers included.
    pub(crate) fn execute(
        &self,
        scope: Option<&Scope>,
        request_id: &str,
        pace: Pace,
        operation: impl FnOnce(&mut Ledger, i64) -> Result<Reply, StripeError>,
    ) -> Executed {
        let mut state = self.lock();
        let instant = Instant::now();
        if let Some(refused) = scope.and_then(|scope| refused_by_key(&state.keys, scope, instant)) {
            return refused;
        }
        let now = unix_now();
        let executed = match operation(&mut state.ledger, now) {
            Ok(reply) => {
                let until = pace.executing_until(instant, self.slow);
                if let Some(scope) = scope {
                    state.keys.save(scope, reply.clone(), request_id, until);
                }
                if let (Pace::Slow { mid_confirm: true }, Some(until), Some(id)) =
                    (pace, until, intent_id(&reply))
                {
                    state.ledger.confirming(&id, until);
                }
                Executed::Ran(reply)
            }
            Err(error) => Executed::Refused(error),
        };
        let cause = Cause {
            request_id: Some(request_id.to_owned()),
            idempotency_key: scope.map(|scope| scope.key.clone()),
        };
        self.announce(&mut state, &cause, now);
        executed
    }

    /// Holds `scope`'s key for a request the simulator holds without running it (the
    /// `timeout` fault): a request with the key meanwhile is answered `409
    /// idempotency_key_in_use`. The key is released, with nothing saved, when the returned
    /// guard is dropped: when the request ends, its hang over or its client gone. `None` when
    /// the key is in use or answered already.
    pub(crate) fn hold_key(self: &Arc<Self>, scope: &Scope) -> Option<KeyHeld> {
        let held = self.lock().keys.hold(scope, Instant::now())?;
        Some(KeyHeld { sim: Arc::clone(self), held })
    }

    /// Queues the events the last operation caused for the webhook endpoint.
    fn announce(&self, state: &mut State, cause: &Cause, now: i64) {
        let events =
            state.ledger.take_happened().into_iter().map(|happened| Event::new(happened, cause, now));
        self.webhooks.send(events.collect());
    }

    pub(crate) fn retrieve(&self, id: &str, expand: Expand) -> Reply {
        self.lock().ledger.retrieve(id, expand)
    }

    /// Ends a hold's window now (a test's way to let seven days pass). Stripe cancels it by
    /// itself, so its event names no request.
    pub(crate) fn expire_authorization(&self, id: &str) -> Reply {
        let now = unix_now();
        let mut state = self.lock();
        let reply = state.ledger.expire_authorization(id, now);
        self.announce(&mut state, &Cause::default(), now);
        reply
    }

    /// The buyer's browser completes (or fails) the 3-D Secure challenge; its events name no
    /// API request.
    pub(crate) fn authenticate(&self, id: &str, outcome: crate::intent::Authentication) -> Reply {
        let now = unix_now();
        let mut state = self.lock();
        let reply = state.ledger.authenticate(id, outcome, now);
        self.announce(&mut state, &Cause::default(), now);
        reply
    }

    /// Makes a new intent wait `seconds` before search shows it (0: at once).
    pub(crate) fn set_search_lag(&self, seconds: u32) {
        self.lock().search_lag_seconds = seconds;
    }

    /// How long a new intent waits before search shows it, in seconds.
    pub fn search_lag(&self) -> u32 {
        self.lock().search_lag_seconds
    }

    pub(crate) fn search_metadata(&self, key: &str, value: &str, expand: Expand) -> Reply {
        let state = self.lock();
        let indexed_by = unix_now() - i64::from(state.search_lag_seconds);
        let data = state.ledger.with_metadata(key, value, expand, indexed_by);
        Reply::ok(&json!({
            "object": "search_result",
            "url": "/v1/payment_intents/search",
            "has_more": false,
            "next_page": null,
            "total_count": data.len(),
            "data": data,
        }))
    }

    /// `GET /v1/payment_intents`: consistent, as Stripe's list APIs are (no search lag).
    pub(crate) fn list(&self, request: &crate::requests::ListRequest) -> Reply {
        match self.lock().ledger.list(request) {
            Ok((data, has_more)) => Reply::ok(&json!({
                "object": "list",
                "url": "/v1/payment_intents",
                "has_more": has_more,
                "data": data,
            })),
            Err(error) => Reply::error(&error),
        }
    }

    pub(crate) fn listing(&self) -> Value {
        json!({ "object": "list", "data": self.lock().ledger.listing() })
    }

    pub(crate) fn arm_fault(&self, operation: Operation, mode: Mode, count: u32) -> Value {
        let mut state = self.lock();
        state.faults.arm(operation, mode, count);
        state.faults.to_json()
    }

    pub(crate) fn faults(&self) -> Value {
        self.lock().faults.to_json()
    }

    pub(crate) fn clear_faults(&self) -> Value {
        let mut state = self.lock();
        state.faults.clear();
        state.faults.to_json()
    }
}
