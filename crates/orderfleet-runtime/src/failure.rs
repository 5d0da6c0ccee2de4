//! One vocabulary for every failure in the fleet, decided where the failure happens.
//!
//! Whatever failed — a database statement, a payment call, an SQS or SNS call, a message that
//! cannot be read — the code next to it says which of three kinds it is, and from where:
//!
//! | kind | what it means | what the loops do with it |
//! |---|---|---|
//! | [`Kind::Transient`] | this piece of work failed for a passing reason (a deadlock, a throttled entry, another worker's claim) | try it again after a backoff (or after [`Failure::retry_in`] when that is known); the relay charges the row's budget |
//! | [`Kind::Outage`] | a dependency is down (the database unreachable, the payment service or SQS not answering) | not the work's fault: a consumer stops receiving until its probe passes, the relay holds every row and charges none |
//! | [`Kind::Permanent`] | it fails the same way every time (unreadable, refused as invalid, an integrity error) | set aside for a person with its reason: the DLQ for a message, `dead` for an outbox row |
//!
//! The consumer ([`crate::consumer`]), the relay and the fulfilment steps all speak it, so no
//! layer translates one set of words into another.
//!
//! The four classifiers, one per dependency, each next to the calls it judges:
//!
//! | dependency | classifier | how it decides |
//! |---|---|---|
//! | PostgreSQL | [`crate::db::failure`] | by SQLSTATE class, and by what the error is not: an error about the connection, whatever its variant, is an outage |
//! | payments | `classify` in the `orderfleet-payments` crate, into a `PaymentError` (its failures' [`Source::Service`] is its own); `orderfleet::domain::steps::fulfilment` makes that a [`Failure`] | a decline or a refusal is final; a 429, a timeout, a dropped connection or a bad key is unavailable (an outage to the workers); a 429 `lock_timeout` (the service holds that one intent) is a wait for that one message, kept in hand; a 5xx ends the attempt |
//! | SQS | `classify_call` and `classify_entry` in `outbox_relay::send` | a missing queue, a denial or an entry SQS blames is permanent; an entry that failed for a passing reason is transient; a whole call that says "not now" is an outage |
//! | SNS | `classify` in `notification_worker` | a `PublishBatch` SNS refuses as malformed is permanent; anything else is an outage of Publish |
//!
//! The last three live in crates that depend on this one, so they are named here, not linked.

use std::fmt;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// What a failure means for the work, and so what the loops do with it (the table above).
pub enum Kind {
    /// This piece of work failed for a passing reason: try it again after a backoff.
    Transient,
    /// A dependency is down: not the work's fault; stop taking work until it answers.
    Outage,
    /// It fails the same way every time: set aside for a person, with its reason.
    Permanent,
}

impl Kind {
    /// Its name in metrics (`messages_handled_total{outcome}`) and in `message_failures`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Transient => "transient",
            Kind::Outage => "outage",
            Kind::Permanent => "permanent",
        }
    }
}

/// Where a failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The message itself (not an envelope, an unknown event type or order).
    Message,
    /// An order's own data (a state no step can go on from).
    Order,
    /// PostgreSQL.
    Database,
    /// Amazon SQS.
    Sqs,
    /// Amazon SNS.
    Sns,
    /// The notification inbox: another worker holds the message's claim.
    Inbox,
    /// A service the fleet calls through a client of another crate, by the name its failures
    /// are counted and stored under: the payments crate's is its own.
    Service(&'static str),
}

impl Source {
    /// A service the fleet calls, which can be down: the database, SQS, SNS, and each
    /// [`Source::Service`]. A failure from one of them may be the service's, not the work's.
    pub(crate) fn is_dependency(self) -> bool {
        matches!(self, Source::Database | Source::Sqs | Source::Sns | Source::Service(_))
    }

    /// Its name in logs, metrics and `message_failures`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Message => "message",
            Source::Order => "order",
            Source::Database => "database",
            Source::Sqs => "sqs",
            Source::Sns => "sns",
            Source::Inbox => "inbox",
            Source::Service(name) => name,
        }
    }
}

/// What became of one piece of work (a message, a fulfilment step, an outbox row's send):
/// done, or the failure that stopped it. The one result every loop settles.
pub type Outcome = Result<(), Failure>;

/// What the loop does with the work after a failure, beyond what the failure's kind says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Then {
    /// Hand it back; the loop's own backoff (by the message's receive count, the row's retry
    /// budget) says when it comes again.
    #[default]
    Backoff,
    /// Hand it back, to come again after this long: the failure says when trying again can
    /// succeed (another worker's claim ends then).
    RetryAfter(Duration),
    /// The message waits on someone else's work, not on a failure of its own: the consumer
    /// keeps it in hand, invisible under the heartbeat, and handles it again after this long,
    /// while the worker goes on receiving. Handed back, it would spend a receive per wait and
    /// reach the DLQ through no fault of its own (SPEC §8.10). Only a stop hands it back.
    HoldInHand(Duration),
    /// Held in hand, and through a stop too: the message's effect has happened (SNS took the
    /// notification) and only its record failed, so handed back it would be done again by
    /// the next worker. At the stop signal the consumer goes on handling it, every this long,
    /// until it is settled or the grace period ends; only then is it handed back.
    HoldThroughStop(Duration),
}

/// A classified failure: its kind, where it happened, a short code, the reason a person
/// reads, and what the loop does with the work next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What it means for the work.
    pub kind: Kind,
    /// Where it happened.
    pub source: Source,
    /// Short and machine-readable: an SQLSTATE, an AWS error code, `timeout`, `unknown_order`…
    /// For people and metrics only: no loop decides by it.
    pub code: String,
    /// What a person reads: what failed and why, in words.
    pub reason: String,
    /// What the loop does with the work next.
    pub then: Then,
}

impl Failure {
    /// A failure of `kind` from `source`.
    pub fn new(kind: Kind, source: Source, code: impl Into<String>, reason: impl Into<String>) -> Self {
        Self { kind, source, code: code.into(), reason: reason.into(), then: Then::Backoff }
    }

    /// A passing failure of this piece of work ([`Kind::Transient`]).
    pub fn transient(source: Source, code: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::new(Kind::Transient, source, code, reason)
    }

    /// A dependency down ([`Kind::Outage`]).
    pub fn outage(source: Source, code: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::new(Kind::Outage, source, code, reason)
    }

    /// A failure that will not pass by retrying ([`Kind::Permanent`]).
    pub fn permanent(source: Source, code: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::new(Kind::Permanent, source, code, reason)
    }

    /// The same failure, to be tried again after `delay` ([`Then::RetryAfter`]).
    pub fn retry_after(self, delay: Duration) -> Self {
        Self { then: Then::RetryAfter(delay), ..self }
    }

    /// The same failure, its message kept in hand and tried again after `delay`
    /// ([`Then::HoldInHand`]).
    pub fn hold_in_hand(self, delay: Duration) -> Self {
        Self { then: Then::HoldInHand(delay), ..self }
    }

    /// The same failure, its message kept in hand through a stop, tried again every `delay`
    /// ([`Then::HoldThroughStop`]).
    pub fn hold_through_stop(self, delay: Duration) -> Self {
        Self { then: Then::HoldThroughStop(delay), ..self }
    }

    /// When trying again can succeed, if the failure says.
    pub fn retry_in(&self) -> Option<Duration> {
        match self.then {
            Then::Backoff => None,
            Then::RetryAfter(d) | Then::HoldInHand(d) | Then::HoldThroughStop(d) => Some(d),
        }
    }

    /// Whether its message is kept in hand ([`Then::HoldInHand`], [`Then::HoldThroughStop`]).
    pub fn in_hand(&self) -> bool {
        matches!(self.then, Then::HoldInHand(_) | Then::HoldThroughStop(_))
    }

    /// Whether its message is kept through a stop ([`Then::HoldThroughStop`]).
    pub fn through_stop(&self) -> bool {
        matches!(self.then, Then::HoldThroughStop(_))
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} failure ({}): {}", self.kind.as_str(), self.source.as_str(), self.code, self.reason)
    }
}

impl std::error::Error for Failure {}
