//! Every PaymentIntent the simulator has created, in creation order, with how many capture
//! and cancel requests each one received.
//!
//! Each operation turns a parsed request into a [`Reply`]: the status and body to answer,
//! errors included, because the idempotency layer stores and replays the answer as a whole.

use std::collections::HashMap;

use axum::http::StatusCode;
use serde_json::Value;

use crate::error::StripeError;
use crate::intent::PaymentIntent;
use crate::requests::Expand;
use crate::requests::{CancelRequest, CaptureRequest, CreateRequest, ListRequest};

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
        self.by_id.insert(intent.id.clone(), self.entries.len());
        self.entries.push(Entry { intent, capture_count: 0, cancel_count: 0 });
        reply
    }

    pub(crate) fn retrieve(&self, id: &str, expand: Expand) -> Reply {
        Reply::from_result(self.entry(id).map(|entry| entry.intent.to_json_expanded(expand)))
    }

    /// A hold outlives its window: Stripe cancels it (see [`PaymentIntent::expire_authorization`]).
    pub(crate) fn expire_authorization(&mut self, id: &str, now: i64) -> Reply {
        let result = self.entry_mut(id).and_then(|entry| {
            entry.intent.expire_authorization(now)?;
            tracing::info!(payment_intent = %id, "authorization expired; the intent is canceled");
            Ok(entry.intent.to_json())
        });
        Reply::from_result(result)
    }

    pub(crate) fn capture(&mut self, id: &str, request: &CaptureRequest) -> Reply {
        self.attempt(id, Attempt::Capture, |intent| intent.capture(request))
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
        let result = self.entry_mut(id).and_then(|entry| {
            let attempts = entry.count(attempt);
            let outcome = transition(&mut entry.intent);
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

    fn entry_mut(&mut self, id: &str) -> Result<&mut Entry, StripeError> {
        match self.by_id.get(id) {
            Some(&at) => Ok(&mut self.entries[at]),
            None => Err(no_such_intent(id)),
        }
    }
}

fn no_such_intent(id: &str) -> StripeError {
    StripeError::no_such(StatusCode::NOT_FOUND, "payment_intent", id, "intent")
}
