//! Injected faults, so tests and demos can show the fleet surviving Stripe outages.
//!
//! A fault is armed per operation (`create`, `capture`, `cancel`, or `any` of them, and
//! `list`) with a mode and a count; each matching request consumes one, the operation's own
//! fault before `any`. Arming an operation again replaces its fault; a count of 0 disarms it.
//! `any` is the fleet's writes only: a list is faulted only when armed by name, so a test that
//! fails every write still lets the fleet look an order up. Retrieval and the `/_sim` routes
//! are never faulted: they are how a test, or an operator, looks at the outcome.

use std::collections::BTreeMap;

use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Operation {
    Create,
    Capture,
    Cancel,
    /// Matches create, capture and cancel.
    Any,
    /// `GET /v1/payment_intents`, Stripe's list: how the fleet finds an order's intents.
    List,
}

impl Operation {
    const ALL: [Operation; 5] =
        [Operation::Create, Operation::Capture, Operation::Cancel, Operation::Any, Operation::List];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "create",
            Operation::Capture => "capture",
            Operation::Cancel => "cancel",
            Operation::Any => "any",
            Operation::List => "list",
        }
    }

    pub(crate) fn parse(raw: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|op| op.as_str() == raw).ok_or_else(|| {
            format!("unknown operation {raw:?}: expected one of \"create\", \"capture\", \"cancel\", \"any\", \"list\"")
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Answer 500 `api_error`; the operation does not run.
    Error500,
    /// Answer 429 `rate_limit`; the operation does not run.
    Error429,
    /// Answer nothing until long after any client has given up; the operation does not run,
    /// and nothing is saved under its key. While the simulator holds it, its key is in use: a
    /// request with the same key meanwhile is answered `409 idempotency_key_in_use`. The hold
    /// ends when the hang does, or when its client gives up and closes the connection (the
    /// server then drops the request); so a client's own retry after its timeout runs, and a
    /// concurrent one (another process with the key) meets the 409.
    Timeout,
    /// Run the operation (saving its idempotent answer), then close the connection unanswered.
    DropAfterSuccess,
    /// Run the operation, then answer 500 `api_error`, and save that 500 under the key: Stripe
    /// calls a 500's result indeterminate (docs.stripe.com/error-low-level, server errors),
    /// so the request may have taken effect, and its key replays the 500.
    Error500AfterSuccess,
    /// Answer 400 `invalid_request_error`; the operation does not run, and nothing is saved
    /// under its key. It stands for Stripe refusing a request as invalid, which no retry
    /// mends (docs.stripe.com/api/errors: "Invalid request errors arise when your request has
    /// invalid parameters"), e.g. a list with a parameter the account's API version no longer
    /// takes (`parameter_unknown`). Stripe saves no answer for a request that failed
    /// validation (docs.stripe.com/api/idempotent_requests).
    Error400,
    /// Run the operation, but let its request go on executing for [`SLOW_CONFIRM`]: its key is
    /// in use meanwhile (a retry with it is answered `409 idempotency_key_in_use`, nothing
    /// saved for the retry), and a create's intent reads as mid-request,
    /// `requires_payment_method` with no error (what a list may show while a
    /// create-and-confirm is still executing). Its answer, saved under the key, is replayed
    /// once it ends; the request itself is answered nothing until long after any client has
    /// given up. A retry with the same key after it ended is struck the same way while the
    /// count lasts (its saved answer replayed into a hang).
    SlowConfirm,
    /// Answer 500 `api_error` from in front of the idempotency layer: the operation does not
    /// run and nothing is saved under its key, so a retry with the key runs it ("rate limiters
    /// run before the API's idempotency layer", docs.stripe.com/error-low-level; "We save
    /// results only after the execution of an endpoint begins",
    /// docs.stripe.com/api/idempotent_requests).
    Error500Unsaved,
    /// Answer 429 `lock_timeout`: another request, or Stripe's own processing, holds the
    /// object the request changes, and the request waited for it in vain
    /// (docs.stripe.com/rate-limits#object-lock-timeouts; docs.stripe.com/error-codes#lock-timeout).
    /// The operation does not run and nothing is saved under its key, so the retry Stripe
    /// advises, with the same key, runs it (Stripe's own libraries retry a lock timeout that
    /// way).
    LockTimeout,
}

/// How long a request struck by `slow_confirm` goes on executing (unless
/// [`crate::Simulator::with_slow_requests`] says otherwise).
pub(crate) const SLOW_CONFIRM: std::time::Duration = std::time::Duration::from_secs(10);

impl Mode {
    const ALL: [Mode; 9] = [
        Mode::Error500,
        Mode::Error429,
        Mode::Timeout,
        Mode::DropAfterSuccess,
        Mode::Error500AfterSuccess,
        Mode::Error400,
        Mode::SlowConfirm,
        Mode::Error500Unsaved,
        Mode::LockTimeout,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Mode::Error500 => "error_500",
            Mode::Error429 => "error_429",
            Mode::Timeout => "timeout",
            Mode::DropAfterSuccess => "drop_after_success",
            Mode::Error500AfterSuccess => "error_500_after_success",
            Mode::Error400 => "error_400",
            Mode::SlowConfirm => "slow_confirm",
            Mode::Error500Unsaved => "error_500_unsaved",
            Mode::LockTimeout => "lock_timeout",
        }
    }

    pub(crate) fn parse(raw: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|mode| mode.as_str() == raw).ok_or_else(|| {
            format!(
                "unknown mode {raw:?}: expected one of \"error_500\", \"error_429\", \"timeout\", \
                 \"drop_after_success\", \"error_500_after_success\", \"error_400\", \"slow_confirm\", \"error_500_unsaved\", \
                 \"lock_timeout\""
            )
        })
    }
}

#[derive(Debug, Clone, Copy)]
struct Armed {
    mode: Mode,
    remaining: u32,
}

#[derive(Debug, Default)]
pub(crate) struct Faults {
    armed: BTreeMap<Operation, Armed>,
}

impl Faults {
    pub(crate) fn arm(&mut self, operation: Operation, mode: Mode, count: u32) {
        if count == 0 {
            self.armed.remove(&operation);
        } else {
            self.armed.insert(operation, Armed { mode, remaining: count });
        }
    }

    pub(crate) fn clear(&mut self) {
        self.armed.clear();
    }

    /// The fault a request for `operation` meets, consuming one of its count.
    pub(crate) fn take(&mut self, operation: Operation) -> Option<Mode> {
        let any = (operation != Operation::List).then_some(Operation::Any);
        let matched = [Some(operation), any].into_iter().flatten().find(|op| self.armed.contains_key(op))?;
        let armed = self.armed.get_mut(&matched)?;
        let mode = armed.mode;
        armed.remaining -= 1;
        if armed.remaining == 0 {
            self.armed.remove(&matched);
        }
        Some(mode)
    }

    /// `{"data": [{"operation", "mode", "count"}]}`, `count` being what is left.
    pub(crate) fn to_json(&self) -> Value {
        let data: Vec<Value> = self
            .armed
            .iter()
            .map(|(op, armed)| {
                json!({"operation": op.as_str(), "mode": armed.mode.as_str(), "count": armed.remaining})
            })
            .collect();
        json!({ "data": data })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fault each of `requests` meets, one after the other.
    fn met_by(faults: &mut Faults, requests: &[Operation]) -> Vec<Option<Mode>> {
        requests.iter().map(|&operation| faults.take(operation)).collect()
    }

    #[test]
    fn a_fault_is_consumed_one_request_at_a_time() {
        let mut faults = Faults::default();
        faults.arm(Operation::Capture, Mode::Error500, 2);
        let met = met_by(
            &mut faults,
            &[Operation::Create, Operation::Capture, Operation::Capture, Operation::Capture],
        );
        assert_eq!(met, [None, Some(Mode::Error500), Some(Mode::Error500), None]);
    }

    #[test]
    fn the_operations_own_fault_comes_before_any() {
        let mut faults = Faults::default();
        faults.arm(Operation::Any, Mode::Error429, 1);
        faults.arm(Operation::Cancel, Mode::Timeout, 1);
        let met = met_by(&mut faults, &[Operation::Cancel, Operation::Cancel, Operation::Create]);
        assert_eq!(met, [Some(Mode::Timeout), Some(Mode::Error429), None]);
    }

    #[test]
    fn a_list_is_faulted_only_by_its_own_fault_never_by_any() {
        let mut faults = Faults::default();
        faults.arm(Operation::Any, Mode::Error500, 2);
        assert_eq!(met_by(&mut faults, &[Operation::List]), [None]);
        faults.arm(Operation::List, Mode::Error400, 1);
        let met = met_by(&mut faults, &[Operation::List, Operation::List, Operation::Create]);
        assert_eq!(met, [Some(Mode::Error400), None, Some(Mode::Error500)]);
        assert_eq!(Operation::parse("list"), Ok(Operation::List));
        assert_eq!(Mode::parse("error_400"), Ok(Mode::Error400));
    }

    #[test]
    fn arming_again_replaces_and_zero_disarms() {
        let mut faults = Faults::default();
        faults.arm(Operation::Create, Mode::Error500, 5);
        faults.arm(Operation::Create, Mode::DropAfterSuccess, 1);
        assert_eq!(faults.to_json()["data"][0]["mode"], "drop_after_success");
        faults.arm(Operation::Create, Mode::Error500, 0);
        assert_eq!(faults.take(Operation::Create), None);
        assert_eq!(faults.to_json(), json!({"data": []}));
    }
}
