//! Injected faults, so tests and demos can show the fleet surviving Stripe outages.
//!
//! A fault is armed per operation (`create`, `capture`, `cancel`, or `any` of them) with a
//! mode and a count; each matching request consumes one, the operation's own fault before
//! `any`. Arming an operation again replaces its fault; a count of 0 disarms it. Retrieval
//! and the `/_sim` routes are never faulted: they are how a test looks at the outcome.

use std::collections::BTreeMap;

use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Operation {
    Create,
    Capture,
    Cancel,
    /// Matches create, capture and cancel.
    Any,
}

impl Operation {
    const ALL: [Operation; 4] = [Operation::Create, Operation::Capture, Operation::Cancel, Operation::Any];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "create",
            Operation::Capture => "capture",
            Operation::Cancel => "cancel",
            Operation::Any => "any",
        }
    }

    pub(crate) fn parse(raw: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|op| op.as_str() == raw).ok_or_else(|| {
            format!("unknown operation {raw:?}: expected one of \"create\", \"capture\", \"cancel\", \"any\"")
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Answer 500 `api_error`; the operation does not run.
    Error500,
    /// Answer 429 `rate_limit`; the operation does not run.
    Error429,
    /// Answer nothing until long after any client has given up; the operation does not run.
    Timeout,
    /// Run the operation (saving its idempotent answer), then close the connection unanswered.
    DropAfterSuccess,
    /// Run the operation, then answer 500 `api_error`, and save that 500 under the key: Stripe
    /// calls a 500's result indeterminate (docs.stripe.com/error-low-level, server errors),
    /// so the request may have taken effect, and its key replays the 500.
    Error500AfterSuccess,
}

impl Mode {
    const ALL: [Mode; 5] =
        [Mode::Error500, Mode::Error429, Mode::Timeout, Mode::DropAfterSuccess, Mode::Error500AfterSuccess];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Mode::Error500 => "error_500",
            Mode::Error429 => "error_429",
            Mode::Timeout => "timeout",
            Mode::DropAfterSuccess => "drop_after_success",
            Mode::Error500AfterSuccess => "error_500_after_success",
        }
    }

    pub(crate) fn parse(raw: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|mode| mode.as_str() == raw).ok_or_else(|| {
            format!(
                "unknown mode {raw:?}: expected one of \"error_500\", \"error_429\", \"timeout\", \
                 \"drop_after_success\", \"error_500_after_success\""
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
        let matched = [operation, Operation::Any].into_iter().find(|op| self.armed.contains_key(op))?;
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
