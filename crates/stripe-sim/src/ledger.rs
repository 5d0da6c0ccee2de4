//! Every PaymentIntent the simulator has created, in creation order, with how many capture
//! and cancel requests each one received.
//!
//! Each operation turns a parsed request into a [`Reply`]: the status and body to answer,
//! errors included, because the idempotency layer stores and replays the answer as a whole.
//! What an operation changed is also kept, as [`Happened`] events, until the simulator takes
//! them ([`Ledger::take_happened`]) to send them to the webhook endpoint.

use std::collections::HashMap;

use axum::http::StatusCode;
use serde_json::Value;

use crate::error::StripeError;
use crate::events::{self, Before, EventType, Happened};
use crate::intent::{Authentication, PaymentIntent};
use crate::requests::Expand;
use crate::requests::{
    CancelRequest, CaptureRequest, ConfirmRequest, CreateRequest, ListRequest, RefundRequest, RefundTarget,
};

/// An answer to a Stripe API request: what the idempotency layer stores and replays.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) body: String,
}

impl Reply {
    pub(crate) fn ok(body: &Value) -> Self {
        Self { status: StatusCode::OK, body: body.to_string() }
    }

    pub(crate) fn error(error: &StripeError) -> Self {
        Self { status: error.status, body: error.body_json().to_string() }
    }

    fn from_result(result: Result<Value, StripeError>) -> Self {
        match result {
            Ok(body) => Self::ok(&body),
            Err(error) => Self::error(&error),
        }
    }
}

#[derive(Debug)]
struct Entry {
    intent: PaymentIntent,
    /// Capture and cancel requests that reached this intent and were not idempotent replays,
    /// refused ones included: that is how a test sees a double capture being attempted.
    capture_count: u64,
    cancel_count: u64,
}

/// The requests an [`Entry`] counts.
#[derive(Debug, Clone, Copy)]
enum Attempt {
    Capture,
    Cancel,
}

impl Attempt {
    fn as_str(self) -> &'static str {
        match self {
            Attempt::Capture => "capture",
            Attempt::Cancel => "cancel",
        }
    }
}

impl Entry {
    /// Counts one more `attempt`; returns how many there have been.
    fn count(&mut self, attempt: Attempt) -> u64 {
        let count = match attempt {
            Attempt::Capture => &mut self.capture_count,
            Attempt::Cancel => &mut self.cancel_count,
        };
        *count += 1;
        *count
    }
}

#[derive(Debug, Default)]
pub(crate) struct Ledger {
    entries: Vec<Entry>,
    by_id: HashMap<String, usize>,
    /// Events not yet taken for delivery.
    happened: Vec<Happened>,
}

impl Ledger {
    /// Creates the intent and, with `confirm=true`, confirms it. A declined intent is kept
    /// (and answered with 402), as Stripe keeps it.
    pub(crate) fn create(&mut self, request: CreateRequest, now: i64) -> Reply {
        let (confirm, expand) = (request.confirm, request.expand);
        let mut intent = PaymentIntent::new(request, now);
        let confirmed = if confirm { intent.confirm(now) } else { Ok(()) };
        tracing::info!(
            payment_intent = %intent.id,
            status = intent.status.as_str(),
            amount = intent.amount,
            currency = %intent.currency,
            order_id = intent.details.metadata.get("order_id").map(String::as_str),
            "payment intent created"
        );
        let reply = Reply::from_result(confirmed.map(|()| intent.to_json_expanded(expand)));
        self.happened.extend(events::changes(Before::NOTHING, &intent));
        self.by_id.insert(intent.id.clone(), self.entries.len());
        self.entries.push(Entry { intent, capture_count: 0, cancel_count: 0 });
        reply
    }

    /// Lets intent `id` read as mid-request (its confirm not ended) until `until`.
    pub(crate) fn confirming(&mut self, id: &str, until: std::time::Instant) {
        if let Some(&at) = self.by_id.get(id) {
            self.entries[at].intent.confirming_until = Some(until);
        }
    }

    pub(crate) fn retrieve(&self, id: &str, expand: Expand) -> Reply {
        Reply::from_result(self.entry(id).map(|entry| entry.intent.to_json_expanded(expand)))
    }

    /// The events the operations so far caused, oldest first; taken once.
    pub(crate) fn take_happened(&mut self) -> Vec<Happened> {
        std::mem::take(&mut self.happened)
    }

    /// A hold outlives its window: Stripe cancels it (see [`PaymentIntent::expire_authorization`]).
    pub(crate) fn expire_authorization(&mut self, id: &str, now: i64) -> Reply {
        let result = self.transition(id, |intent| intent.expire_authorization(now));
        if result.is_ok() {
            tracing::info!(payment_intent = %id, "authorization expired; the intent is canceled");
        }
        Reply::from_result(result)
    }

    /// The buyer's browser completed or failed the 3-D Secure challenge.
    pub(crate) fn authenticate(&mut self, id: &str, outcome: Authentication, now: i64) -> Reply {
        let result = self.transition(id, |intent| intent.authenticate(outcome, now));
        tracing::info!(payment_intent = %id, ?outcome, refused = result.is_err(), "3-D Secure authentication");
        Reply::from_result(result)
    }

    /// `POST /v1/refunds`: refunds the charge of the intent the request names (by itself or by
    /// its charge) and answers the Refund; `charge.refunded` follows.
    pub(crate) fn refund(&mut self, request: &RefundRequest, now: i64) -> Reply {
        let result = self.refund_target(&request.target).and_then(|at| {
            let intent = &mut self.entries[at].intent;
            let refund = intent.refund(request, now)?;
            tracing::info!(payment_intent = %intent.id, amount = refund["amount"].as_i64(), "refunded");
            if let Some(charge) = intent.charge_json() {
                self.happened.push(Happened { kind: EventType::ChargeRefunded, object: charge });
            }
            Ok(refund)
        });
        Reply::from_result(result)
    }

    /// The entry a refund names: an unknown id is a missing resource, named by its parameter.
    fn refund_target(&self, target: &RefundTarget) -> Result<usize, StripeError> {
        let by_charge = |charge: &str| {
            let at = self.entries.iter().position(|entry| {
                entry.intent.latest_charge.as_ref().is_some_and(|latest| latest.id == charge)
            });
            at.ok_or_else(|| StripeError::no_such(StatusCode::BAD_REQUEST, "charge", charge, "charge"))
        };
        let by_intent = |id: &str| {
            self.by_id.get(id).copied().ok_or_else(|| {
                StripeError::no_such(StatusCode::BAD_REQUEST, "payment_intent", id, "payment_intent")
            })
        };
        match target {
            RefundTarget::PaymentIntent(id) => by_intent(id),
            RefundTarget::Charge(charge) => by_charge(charge),
            RefundTarget::Both { payment_intent, charge } => {
                let at = by_intent(payment_intent)?;
                match by_charge(charge)? == at {
                    true => Ok(at),
                    false => Err(StripeError::invalid_param(
                        "charge",
                        format!("Charge {charge} does not belong to PaymentIntent {payment_intent}."),
                    )),
                }
            }
        }
    }

    pub(crate) fn capture(&mut self, id: &str, request: &CaptureRequest, now: i64) -> Reply {
        self.attempt(id, Attempt::Capture, |intent| intent.capture(request, now))
    }

    /// `POST /v1/payment_intents/{id}/confirm`: the intent confirmed (again), answered as it
    /// now is, or the refusal (a decline's 402 carries the intent, as Stripe's does).
    pub(crate) fn confirm(&mut self, id: &str, request: ConfirmRequest, now: i64) -> Reply {
        let happened = &mut self.happened;
        let expand = request.expand;
        let result = Self::entry_in(&mut self.entries, &self.by_id, id).and_then(|entry| {
            let before = Before::of(&entry.intent);
            let outcome = entry.intent.confirm_again(request, now);
            happened.extend(events::changes(before, &entry.intent));
            tracing::info!(
                payment_intent = %id,
                status = entry.intent.status.as_str(),
                refused = outcome.is_err(),
                "confirm requested"
            );
            outcome.map(|()| entry.intent.to_json_expanded(expand))
        });
        Reply::from_result(result)
    }

    pub(crate) fn cancel(&mut self, id: &str, request: &CancelRequest, now: i64) -> Reply {
        self.attempt(id, Attempt::Cancel, |intent| intent.cancel(request, now))
    }

    /// A capture or cancel request that reached intent `id`: counted whether or not the
    /// intent allows it (a refused attempt is what a test looks for), then answered with the
    /// intent as it now is, or with the refusal.
    fn attempt(
        &mut self,
        id: &str,
        attempt: Attempt,
        transition: impl FnOnce(&mut PaymentIntent) -> Result<(), StripeError>,
    ) -> Reply {
        let happened = &mut self.happened;
        let result = Self::entry_in(&mut self.entries, &self.by_id, id).and_then(|entry| {
            let attempts = entry.count(attempt);
            let before = Before::of(&entry.intent);
            let outcome = transition(&mut entry.intent);
            happened.extend(events::changes(before, &entry.intent));
            tracing::info!(
                payment_intent = %id,
                status = entry.intent.status.as_str(),
                attempt = attempts,
                refused = outcome.is_err(),
                "{} requested",
                attempt.as_str()
            );
            outcome.map(|()| entry.intent.to_json())
        });
        Reply::from_result(result)
    }

    /// Intents whose metadata has `key` = `value`, oldest first, as Stripe shows them: only
    /// those created by `indexed_by` (search lags writes).
    pub(crate) fn with_metadata(
        &self,
        key: &str,
        value: &str,
        expand: Expand,
        indexed_by: i64,
    ) -> Vec<Value> {
        self.entries
            .iter()
            .filter(|entry| entry.intent.created <= indexed_by)
            .filter(|entry| entry.intent.details.metadata.get(key).is_some_and(|v| v == value))
            .map(|entry| entry.intent.to_json_expanded(expand))
            .collect()
    }

    /// `GET /v1/payment_intents`: the intents created in the request's range, newest first
    /// (the later of two created in one second first), a page of `limit` after
    /// `starting_after`; with whether more follow.
    pub(crate) fn list(&self, request: &ListRequest) -> Result<(Vec<Value>, bool), StripeError> {
        let newest_first = self.entries.iter().rev();
        let after = match &request.starting_after {
            None => None,
            Some(id) => Some(self.by_id.get(id.as_str()).copied().ok_or_else(|| {
                StripeError::no_such(StatusCode::BAD_REQUEST, "payment_intent", id, "starting_after")
            })?),
        };
        let mut page: Vec<&Entry> = newest_first
            .enumerate()
            .filter(|(from_newest, _)| after.is_none_or(|at| self.entries.len() - 1 - from_newest < at))
            .map(|(_, entry)| entry)
            .filter(|entry| request.created.contains(&entry.intent.created))
            .take(request.limit + 1)
            .collect();
        let has_more = page.len() > request.limit;
        page.truncate(request.limit);
        Ok((page.into_iter().map(|entry| entry.intent.to_json_expanded(request.expand)).collect(), has_more))
    }

    /// `GET /_sim/payment_intents`: every intent, oldest first, with its request counts.
    pub(crate) fn listing(&self) -> Vec<Value> {
        self.entries
            .iter()
            .map(|entry| {
                let mut json = entry.intent.to_json();
                json["capture_count"] = entry.capture_count.into();
                json["cancel_count"] = entry.cancel_count.into();
                json
            })
            .collect()
    }

    fn entry(&self, id: &str) -> Result<&Entry, StripeError> {
        self.by_id.get(id).map(|&at| &self.entries[at]).ok_or_else(|| no_such_intent(id))
    }

    /// Runs `transition` on intent `id`, keeps the events it caused, and answers the intent as
    /// it now is, or the refusal.
    fn transition(
        &mut self,
        id: &str,
        transition: impl FnOnce(&mut PaymentIntent) -> Result<(), StripeError>,
    ) -> Result<Value, StripeError> {
        let entry = Self::entry_in(&mut self.entries, &self.by_id, id)?;
        let before = Before::of(&entry.intent);
        let outcome = transition(&mut entry.intent);
        self.happened.extend(events::changes(before, &entry.intent));
        outcome.map(|()| entry.intent.to_json())
    }

    /// The entry for `id`, borrowed apart from the rest of the ledger.
    fn entry_in<'a>(
        entries: &'a mut [Entry],
        by_id: &HashMap<String, usize>,
        id: &str,
    ) -> Result<&'a mut Entry, StripeError> {
        match by_id.get(id) {
            Some(&at) => Ok(&mut entries[at]),
            None => Err(no_such_intent(id)),
        }
    }
}

fn no_such_intent(id: &str) -> StripeError {
    StripeError::no_such(StatusCode::NOT_FOUND, "payment_intent", id, "intent")
}
