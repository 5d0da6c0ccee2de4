//! One vocabulary for every failure in the fleet, decided where the failure happens.
//!
//! Whatever failed — a database statement, a Stripe call, an SQS or SNS call, a message that
//! cannot be read — the code next to it says which of three kinds it is, and from where:
//!
//! | kind | what it means | what the loops do with it |
//! |---|---|---|
//! | [`Kind::Transient`] | this piece of work failed for a passing reason (a deadlock, a throttled entry, another worker's claim) | try it again after a backoff (or after [`Failure::retry_in`] when that is known); the relay charges the row's budget |
//! | [`Kind::Outage`] | a dependency is down (the database unreachable, Stripe or SQS not answering) | not the work's fault: a consumer stops receiving until its probe passes, the relay holds every row and charges none |
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
//! | Stripe | `classify` in `orderfleet::domain::payments`, into a `PaymentError`; `orderfleet::domain::fulfilment` makes that a [`Failure`] | a decline or a refusal is final; a 429, a timeout, a dropped connection or a bad key is unavailable (an outage to the workers); a 429 `lock_timeout` (Stripe holds that one intent) is a wait for that one message, kept in hand; a 5xx ends the attempt |
//! | SQS | `classify_call` and `classify_entry` in `outbox_relay::send` | a missing queue, a denial or an entry SQS blames is permanent; an entry that failed for a passing reason is transient; a whole call that says "not now" is an outage |
//! | SNS | `classify` in `notification_worker` | a `PublishBatch` SNS refuses as malformed is permanent; anything else is an outage of Publish |
//!
//! The last two live in the binaries' crates, which depend on this one, so they are named here,
//! not linked.

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
    /// Stripe's API.
    Stripe,
    /// Amazon SQS.
    Sqs,
    /// Amazon SNS.
    Sns,
    /// The notification inbox: another worker holds the message's claim.
    Inbox,
}

impl Source {
    /// A service the fleet calls, which can be down: the database, Stripe, SQS, SNS. A
    /// failure from one of them may be the service's, not the work's.
    pub(crate) fn is_dependency(self) -> bool {
        matches!(self, Source::Database | Source::Stripe | Source::Sqs | Source::Sns)
    }

    /// Its name in logs, metrics and `message_failures`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Message => "message",
            Source::Order => "order",
            Source::Database => "database",
            Source::Stripe => "stripe",
            Source::Sqs => "sqs",
            Source::Sns => "sns",
            Source::Inbox => "inbox",
        }
    }
}

/// What became of one piece of work (a message, a fulfilment step, an outbox row's send):
/// done, or the failure that stopped it. The one result every loop settles.
pub type Outcome = Result<(), Failure>;

/// A classified failure: its kind, where it happened, a short code and the reason a person
/// reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What it means for the work.
    pub kind: Kind,
    /// Where it happened.
    pub source: Source,
    /// Short and machine-readable: an SQLSTATE, an AWS error code, `timeout`, `unknown_order`…
    pub code: String,
    /// What a person reads: what failed and why, in words.
    pub reason: String,
    /// How long until trying again can succeed, when the failure says (another worker's claim
    /// ends then); otherwise the loop's own backoff decides.
    pub retry_in: Option<Duration>,
    /// The message waits on someone else's work, not on a failure of its own: kept in hand
    /// ([`Failure::kept_in_hand`]) rather than handed back.
    pub in_hand: bool,
    /// The message's own work is done and only its record is left: at a stop, the consumer
    /// keeps trying it within the grace period before handing it back
    /// ([`Failure::kept_through_stop`]).
    pub through_stop: bool,
}

impl Failure {
    /// A failure of `kind` from `source`.
    pub fn new(kind: Kind, source: Source, code: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            kind,
            source,
            code: code.into(),
            reason: reason.into(),
            retry_in: None,
            in_hand: false,
            through_stop: false,
        }
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

    /// The same failure, to be tried again after `delay`.
    pub fn retry_in(mut self, delay: Duration) -> Self {
        self.retry_in = Some(delay);
        self
    }

    /// The message waits on someone else's work (another worker's claim on it), not on a
    /// failure of its own: the consumer keeps it in hand, invisible under the heartbeat, and
    /// handles it again after [`Failure::retry_in`], while the worker goes on receiving. Handed
    /// back, it would spend a receive per wait and reach the DLQ through no fault of its own
    /// (SPEC §8.10). Only a stop hands it back.
    pub fn kept_in_hand(mut self) -> Self {
        self.in_hand = true;
        self
    }

    /// Kept in hand ([`Failure::kept_in_hand`]), and through a stop too: the message's effect
    /// has happened (SNS took the notification) and only its record failed, so handed back it
    /// would be done again by the next worker. At the stop signal the consumer goes on handling
    /// it, every [`Failure::retry_in`], until it is settled or the grace period ends; only then
    /// is it handed back.
    pub fn kept_through_stop(mut self) -> Self {
        self.in_hand = true;
        self.through_stop = true;
        self
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} failure ({}): {}", self.kind.as_str(), self.source.as_str(), self.code, self.reason)
    }
}

impl std::error::Error for Failure {}
