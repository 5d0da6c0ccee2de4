//! What the guarantees are about: the product's counters, the orders, Stripe's intents and
//! saved answers, the messages, and what each process is in the middle of. Small integers and
//! flat vectors, so that a state hashes fast: the checker visits millions.

// The state's fields and variants are named after the columns, flags and answers they model,
// which each type's doc names; a line for each would repeat its name.
#![allow(missing_docs)]

/// A buyer, by index. Each buyer has one idempotency key, so a buyer's index is also the
/// index of the one order that key can make.
pub type Buyer = u8;

/// An intent, by its index in [`Stripe::intents`].
pub type IntentId = u8;

/// SPEC §5's statuses: the code's own enum, so that a status added there must be handled here;
/// and its sets (holds units, sold, failed), the code's own too.
pub use orderfleet::domain::words::status::OrderStatus as Status;
pub use orderfleet::domain::words::status::StatusSet;

/// What the properties ask of a status.
pub trait Lifecycle {
    fn is_terminal(&self) -> bool;
    /// Whether an order in this status holds units promised at the door (sold ones included).
    fn holds_a_promise(&self) -> bool;
    /// Whether an order in this status has taken its units out of the stock.
    fn has_taken(&self) -> bool;
    fn has_failed(&self) -> bool;
}

impl Lifecycle for Status {
    fn is_terminal(&self) -> bool {
        self.set() != StatusSet::HoldsUnits
    }

    fn holds_a_promise(&self) -> bool {
        self.set() != StatusSet::Failed
    }

    fn has_taken(&self) -> bool {
        *self == Status::StockReserved || self.set() == StatusSet::Sold
    }

    fn has_failed(&self) -> bool {
        self.set() == StatusSet::Failed
    }
}

/// A card: authorizes, is declined, or needs 3-D Secure (`pm_card_visa`,
/// `pm_card_chargeDeclined`, `pm_card_threeDSecure2Required`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Card {
    Good,
    Declines,
    ThreeDSecure,
}

/// Who holds an order's lease (`intake_lease_until`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Holder {
    Request(Buyer),
    Sweeper,
    Webhook,
}

/// The product row: `units_total`, `units_promised`, `stock` (units not yet taken) and
/// `last_position`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Product {
    pub total: u8,
    pub promised: u8,
    /// Signed, so that a defect that takes a unit that is not there shows as a negative
    /// number rather than wrapping.
    pub stock: i8,
    pub last_position: u8,
}

/// The stock-check row of an order in the outbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutboxRow {
    None,
    Pending,
    Sent,
}

/// What the line looked like when an order was rejected out of stock: judged at the end,
/// once every order ahead of it has gone one way or the other (§8.7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rejection {
    /// The product's total when the order was rejected.
    pub total: u8,
    /// Units that orders ahead of it had taken and already given back (a failed capture).
    pub ahead_given_back: u8,
    /// The orders ahead of it (one bit each) that were `authorized` on a hold past the deadline
    /// the fleet recorded for it ([`Order::lapsed`]): they could never be captured, so a unit
    /// one of them took after is not one that went to an order ahead.
    pub ahead_lapsed: u8,
    /// The orders ahead of it (one bit each) that were `authorized` on a hold still within its
    /// deadline: each counts as taking its units even if its hold lapses after, before it is
    /// reserved (time's work, as a capture refused after the rejection is).
    pub ahead_within_deadline: u8,
}

/// An order row, with what the properties need to remember about its past.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Order {
    pub status: Status,
    pub position: u8,
    /// `payment_attempt`: its Stripe keys are the attempt's.
    pub attempt: u8,
    /// `payment_intent_id`.
    pub intent: Option<IntentId>,
    pub lease: Option<Holder>,
    /// `authorization_released_at` is set.
    pub released: bool,
    /// `payment_attempt_at`, as the number of times it was set: a list "began after" it when
    /// this is unchanged between the list and the move to the next attempt.
    pub dated: u8,
    /// `payment_attempt_failed`: the attempt's key answered a 5xx.
    pub attempt_failed: bool,
    /// Older than the fleet's `KEY_KEPT` (23 h): Stripe may have forgotten its keys. Stripe
    /// forgets a key no sooner than 24 h after it first ran, and an order's keys first run
    /// after it is made, so an order one of whose keys the model's `KeysExpire` forgot is old;
    /// until then it is young, its keys surely kept.
    pub old: bool,
    /// It went `requires_action`: its first answer was `202 requires_action` with what the
    /// buyer's page needs (`client_secret`, kept), whatever it became since.
    pub action: bool,
    /// Its `action_expires_at` has passed.
    pub past_deadline: bool,
    /// Its `authorization_expires_at` has passed: its hold is past the deadline Stripe gave
    /// (`capture_before`), which the fleet recorded with it, and Stripe cancelled it.
    pub lapsed: bool,
    /// A permanent failure was recorded for a person (the DLQ's reason, `fleetctl sweep`).
    pub stuck: bool,
    /// History: the database refused one of its moves for good (the scenario's trigger), so
    /// its hold must be released whatever else becomes of it (§8.5).
    pub refused: bool,
    /// A release of its intent is owed to the reconciliation of strays
    /// (`intent_releases_owed`, found `order_refused`): its cancel went unanswered. Made
    /// whatever the order's status.
    pub release_owed: bool,
    pub outbox: OutboxRow,
    /// What its stock-check message says (one row, so every copy says the same): `Some` of the
    /// attempt at the commit when the commit took its units (the merged commit), and the stock
    /// worker captures under that attempt's key without reading the order; `None` when it says
    /// `authorized`, and the worker reads the order and reserves it as before.
    pub reserved_at_commit: Option<u8>,
    /// History: the order was accepted (`authorized`), and so owed an end (§8.4).
    pub accepted: bool,
    /// History: the order took its units at some point.
    pub took: bool,
    /// History: the line when it was rejected out of stock.
    pub rejection: Option<Rejection>,
}

/// A PaymentIntent at Stripe.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Intent {
    pub order: Buyer,
    pub attempt: u8,
    pub status: IntentStatus,
    /// Captures and cancels that took effect (replays are not counted).
    pub captures: u8,
    pub cancels: u8,
    /// History: it held funds at some point: an authorization.
    pub held: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IntentStatus {
    RequiresCapture,
    Succeeded,
    Canceled,
    /// Declined, or 3-D Secure failed: no hold.
    RequiresPaymentMethod,
    /// Waiting for its buyer's 3-D Secure: no hold yet.
    RequiresAction,
    /// Made, its confirm still executing at Stripe (Stripe's list shows it
    /// `requires_payment_method` with no error): it may hold funds a moment later.
    Confirming,
}

/// The requests that carry an idempotency key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Create,
    Capture,
    Cancel,
}

/// What a Stripe request answered, as the client sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reply {
    /// The intent, as it was when the request ran (a replay answers the same snapshot).
    Intent(IntentId, IntentStatus),
    /// A card error on create.
    Declined(IntentId),
    /// An invalid request: capturing what is not held, cancelling what is captured.
    Refused,
    /// A 5xx, which Stripe saves under the key like any other answer.
    Error500,
    /// `idempotency_error`: the key ran before with other parameters (a deploy changed the
    /// request while one was in flight); the fleet reads it as a saved 5xx.
    IdempotencyError,
    /// `409 idempotency_key_in_use`: the key's first request is still executing at Stripe;
    /// nothing is saved for this one.
    InUse,
    /// No answer: a timeout, a reset, a 429 after the client's retries.
    Unanswered,
}

/// Stripe: its intents, and the answers it saved under idempotency keys (24 hours).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Stripe {
    pub intents: Vec<Intent>,
    /// `(operation, order, attempt)` → the answer replayed to every request with that key.
    pub saved: Vec<((Op, Buyer, u8), Reply)>,
    /// Creates, by `(order, attempt)`, whose request Stripe is executing and has made nothing
    /// for yet: each key is in use, and no list shows an intent for it (kept sorted).
    pub running: Vec<(Buyer, u8)>,
}

impl Stripe {
    /// Saves `reply` under `key`, as Stripe does once a request under it has run; kept sorted,
    /// so that states differing only in the order of saving are one state.
    pub fn save(&mut self, key: (Op, Buyer, u8), reply: Reply) {
        self.saved.push((key, reply));
        self.saved.sort_unstable_by_key(|(k, _)| *k);
    }

    pub fn saved(&self, key: (Op, Buyer, u8)) -> Option<Reply> {
        self.saved.iter().find(|(k, _)| *k == key).map(|(_, reply)| *reply)
    }

    /// Whether a request under `key` is still executing: a create not yet made, or made and
    /// its confirm not ended. Another request under the key meanwhile answers `409
    /// idempotency_key_in_use`.
    pub fn in_use(&self, key: (Op, Buyer, u8)) -> bool {
        let (op, order, attempt) = key;
        op == Op::Create
            && (self.running.contains(&(order, attempt))
                || self.intents.iter().any(|i| {
                    (i.order, i.attempt) == (order, attempt) && i.status == IntentStatus::Confirming
                }))
    }

    /// A create under `(order, attempt)` goes on executing at Stripe, nothing made yet.
    pub fn run_later(&mut self, order: Buyer, attempt: u8) {
        self.running.push((order, attempt));
        self.running.sort_unstable();
    }

    /// Makes an intent for `(order, attempt)` in `status`.
    pub fn make(&mut self, order: Buyer, attempt: u8, status: IntentStatus) -> IntentId {
        let id = self.intents.len() as IntentId;
        let held = status == IntentStatus::RequiresCapture;
        self.intents.push(Intent { order, attempt, status, captures: 0, cancels: 0, held });
        id
    }
}

/// How a Stripe request can go wrong (docs.stripe.com/api/idempotent_requests and
/// docs.stripe.com/error-handling: a 500's result is indeterminate and is saved under its key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// 500, nothing done, saved under the key.
    Error500,
    /// 500 after the request took effect, saved under the key.
    Error500AfterEffect,
    /// It took effect (and its answer was saved), and the answer never arrived.
    AnswerLost,
    /// It never reached Stripe: nothing done, nothing saved.
    Unreachable,
    /// A create re-sent under a key that already ran, with other parameters (a deploy in
    /// between): `idempotency_error`, nothing done.
    OtherParameters,
    /// A create that Stripe goes on executing past the time its answer is due: no answer, its
    /// key in use; Stripe makes its intent later (`Action::CreateRuns`), `Confirming` until its
    /// confirm ends (`Action::ConfirmEnds`), and saves its answer then (stripe-sim's
    /// `slow_confirm` makes the intent at once).
    SlowConfirm,
}

/// How a network step goes: as asked, or with a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Net {
    Ok,
    Fault(Fault),
}

/// What a buyer was told.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    /// `202` with the order's position.
    Accepted(u8),
    /// `202 requires_action` with the order's position and what the buyer's page needs.
    ActionRequired(u8),
    /// `402 payment_declined`.
    Declined,
    /// `409 sold_out`.
    SoldOut,
    /// `409 idempotency_key_in_use`.
    InUse,
    /// `503 payment_unavailable`.
    Unavailable,
    /// The connection dropped: the intake died.
    Dropped,
}

/// Authorizing a pending order ([`orderfleet::domain::steps::authorization`]): a request's, or the sweeper's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Auth {
    /// A create under the attempt's key. `resumed`: the order was taken over, its list found
    /// nothing, and this is the attempt's own key again; with the attempt's date
    /// ([`Order::dated`]) when the list ran. A taken-over order that sends its key again
    /// without a list has `None`: nothing was listed.
    Create { attempt: u8, resumed: Option<u8> },
    /// A taken-over order: Stripe's list of intents by `metadata[order_id]` first; with the
    /// attempt and whether its key had answered a 5xx, as read when the order was taken over.
    List { attempt: u8, failed: bool },
    /// After the attempt's own key answered a saved 5xx: on to the next attempt, if the list
    /// that found nothing began after the attempt was last dated (`listed`: its date then).
    NextAttempt { attempt: u8, listed: u8 },
    /// The one statement that records what Stripe said.
    Record(Found),
}

/// What an authorization found, to record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Found {
    Holding(IntentId),
    /// 3-D Secure: the order goes `requires_action` with its intent.
    RequiresAction(IntentId),
    Declined(Option<IntentId>),
    /// Unanswered, or a saved 5xx under the attempt's key (`Some(attempt)`): release the
    /// lease, answer 503.
    Failed(Option<u8>),
}

/// Why a capture's or a cancel's intent is being looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum After {
    Error500,
    Refused,
}

/// Fulfilling an authorized order ([`orderfleet::domain::steps::fulfilment::Fulfilment::advance`]): a stock
/// worker's, for a message, or the sweeper's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Advance {
    Load,
    Reserve,
    Capture {
        attempt: u8,
        intent: IntentId,
    },
    Retrieve {
        op: Op,
        attempt: u8,
        intent: IntentId,
        after: After,
    },
    NextAttempt {
        status: Status,
        attempt: u8,
    },
    RecordPaid,
    /// `canceled`: the intent was read cancelled (the hold is gone): `authorization_canceled`.
    FailCapture {
        attempt: u8,
        intent: IntentId,
        canceled: bool,
    },
    Cancel {
        attempt: u8,
        intent: IntentId,
    },
    MarkReleased,
}

/// Settling a `requires_action` order whose lease is held ([`orderfleet::domain::steps::three_d_secure::settle`]):
/// the webhook's or the sweeper's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Settle {
    /// The intent read fresh, and the deadline: what the order becomes.
    Read,
    /// The intent cancelled first (it may hold funds, or its buyer may still complete it).
    Release { timed_out: bool },
    /// `payment_declined`, the units back.
    Decline,
    /// `authorized`, its stock check to send.
    Authorize,
    /// The database refused the settle's move for good: the order's hold cancelled, and the
    /// answer read (`refusal::end_refused`).
    ReleaseRefused,
    /// Then ONE statement: `payment_declined` with `order_refused`, the units back, where the
    /// database allows it; else the order left for a person. `released`: Stripe shows the
    /// hold cancelled.
    EndRefused { released: bool },
}

/// A webhook's `payment_intent.canceled` for an `authorized` or `stock_reserved` order ([`orderfleet::domain::steps::webhook`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hook {
    /// The order's intent read fresh.
    Read,
    /// `authorization_canceled`, the units back (and the stock, if the order had taken it).
    LoseHold,
}

/// A process's work on one order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Job {
    Authorize(Buyer, Auth),
    Advance(Buyer, Advance),
    Settle(Buyer, Settle),
    Hook(Buyer, Hook),
}

impl Job {
    pub fn order(self) -> Buyer {
        match self {
            Job::Authorize(order, _)
            | Job::Advance(order, _)
            | Job::Settle(order, _)
            | Job::Hook(order, _) => order,
        }
    }
}

/// A Stripe event not yet applied: about which intent, and whether it is
/// `payment_intent.canceled` (the others the fleet handles, `amount_capturable_updated` and
/// `payment_failed`, act alike).
pub type Event = (IntentId, bool);

/// A buyer's HTTP request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Request {
    Idle,
    /// Sent, at an intake that answers `sold_out` from a read of the product: waiting for a
    /// read that starts after it arrived ([`IntakeReads`]).
    Waiting,
    /// Sent; the intake's first statements (the key, then the door) come next.
    Sent,
    Working(Auth),
}

/// What a buyer has sent and heard.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BuyerState {
    pub request: Request,
    pub sent: u8,
    /// The last answer.
    pub answer: Option<Answer>,
    /// History: the first final answer (`202` or `402`), which every retry must replay.
    pub first: Option<Answer>,
    /// History: the buyers who had heard `202` when this buyer last sent (§8.7: positions
    /// follow arrival), one bit each.
    pub accepted_before: u8,
    /// History, while waiting for a read: whether the product has been sold out for this
    /// buyer (every unit promised to orders holding them) at some moment since it sent, which
    /// is what lets a `sold_out` answer be true at a moment between the request and the
    /// answer (§8.7).
    pub sold_out_since_sent: bool,
}

/// One intake's reads of the product for the requests waiting on it (the fleet's
/// `domain::door::sold_out`): one read in flight at most, covering the requests that arrived
/// before it began.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct IntakeReads {
    /// The read in flight, as its snapshot saw the product: the requests it covers (one bit
    /// each), the units left, and which of those requests' keys had an order.
    pub in_flight: Option<ProductRead>,
    /// The units left as the last read that ended saw them (what a cache would keep).
    pub last: Option<u8>,
    /// The fast path (`units_left` in `SoldOutReads`): a read saw units beyond its batch's,
    /// so requests go straight to the door, without a read, until the door answers one
    /// `sold_out`.
    pub fast: bool,
}

/// A read of the product, for a batch of waiting requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProductRead {
    /// The requests it answers, one bit each.
    pub batch: u8,
    /// `units_total - units_promised` in its snapshot.
    pub units_left: u8,
    /// The requests of the batch whose key had made an order, one bit each.
    pub ordered: u8,
}

/// Visible copies of an order's stock-check message, by their receive counts, and how many
/// are in the DLQ.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Messages {
    pub visible: Vec<u8>,
    pub dead: u8,
}

impl Messages {
    /// A copy visible (again) with its receive count; kept sorted, so that states differing
    /// only in the order copies came back in are one state.
    pub fn put_back(&mut self, receives: u8) {
        self.visible.push(receives);
        self.visible.sort_unstable();
    }
}

/// What may still go wrong, and what operators and buyers may still do: each bound keeps the
/// state space finite.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Budget {
    /// Stripe requests that fail ([`Fault`]).
    pub faults: u8,
    /// Intakes, workers or the sweeper dying mid-step.
    pub crashes: u8,
    /// Retries by buyers, with the same key.
    pub retries: u8,
    /// The relay sending a row a second time (it died before marking it sent).
    pub duplicates: u8,
    /// Operator redrives of the DLQ.
    pub redrives: u8,
    /// A live process outliving its lease (a pause longer than the lease).
    pub stalls: u8,
    /// Stripe cancelling a hold where the fleet's row does not say so: in the Dashboard, or
    /// past a deadline the fleet did not record.
    pub expiries: u8,
    /// Stripe cancelling a hold past the deadline it gave (about 7 days), which the fleet
    /// recorded (`authorization_expires_at`), so its own row says so ([`Order::lapsed`]).
    pub lapses: u8,
    /// Stripe forgetting its saved answers (24 hours).
    pub key_expiries: u8,
    /// Stripe giving up delivering an event (or the webhook's secret unset).
    pub lost_events: u8,
    /// Creates whose confirm is still executing when their answer is due ([`Fault::SlowConfirm`]).
    pub slow_confirms: u8,
}

/// Defects seen at the moment they happen (judged by the properties).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Seen {
    /// A PaymentIntent created for an order not holding promised units (§8.8).
    pub intent_without_a_unit: bool,
    /// A capture took effect on an order whose stock was not reserved (§8.2).
    pub capture_without_stock: bool,
    /// `sold_out` while a unit was neither promised nor sold (§8.7).
    pub sold_out_with_a_unit_left: bool,
    /// An order's position not after that of an order already answered `202` (§8.7).
    pub position_out_of_arrival: bool,
    /// A retried key answered other than its first answer (§8.1).
    pub answer_changed: bool,
    /// A request sent to the door while an earlier arrival at its intake, asking no more
    /// units, still waited for a read (§8.7's line inside one intake).
    pub passed_in_line: bool,
}

impl State {
    /// Records a Stripe event, to be delivered, when webhooks are on.
    pub fn emit(&mut self, webhooks: bool, intent: IntentId, canceled: bool) {
        let order = self.stripe.intents[usize::from(intent)].order;
        // An order that ended changes for no event: its events are not worth a state.
        let live = self.orders[usize::from(order)].as_ref().is_some_and(|o| !o.status.is_terminal());
        if webhooks && live {
            self.events.push((intent, canceled));
            self.events.sort_unstable();
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub product: Product,
    /// By intake: its reads of the product (none in a scenario without intakes, whose
    /// requests go straight to the door).
    pub reads: Vec<IntakeReads>,
    /// By buyer: the order its key made, if any.
    pub orders: Vec<Option<Order>>,
    pub buyers: Vec<BuyerState>,
    pub messages: Vec<Messages>,
    /// By worker: the receive count of the message it holds, and its job.
    pub workers: Vec<Option<(u8, Job)>>,
    pub sweeper: Option<Job>,
    /// The sweeper's passes end at an error: each meets the same refused order first, so it
    /// takes up nothing after it (a pending order, swept before it, aside).
    pub sweeps_halted: bool,
    /// The webhook's handler: the event it is applying, and its job.
    pub webhook: Option<(Event, Job)>,
    /// Stripe's events not yet applied (kept sorted), each delivered until it is.
    pub events: Vec<Event>,
    pub stripe: Stripe,
    pub budget: Budget,
    /// Which of the scenario's upserts the operator has run, one bit each.
    pub upserts_done: u8,
    pub seen: Seen,
}

impl State {
    pub fn order(&self, id: Buyer) -> &Order {
        self.orders[usize::from(id)].as_ref().expect("a job's order exists")
    }

    pub fn order_mut(&mut self, id: Buyer) -> &mut Order {
        self.orders[usize::from(id)].as_mut().expect("a job's order exists")
    }

    /// The orders that exist, with their ids.
    pub fn existing(&self) -> impl Iterator<Item = (Buyer, &Order)> {
        self.orders.iter().enumerate().filter_map(|(i, o)| o.as_ref().map(|o| (i as Buyer, o)))
    }
}
