//! The fleet's rules: one switch for each decision the model can take more than one way (the
//! stock worker's line after a cut, which cuts an upsert accepts, a resumed authorization, a
//! 3-D Secure settle past its deadline, a create's `idempotency_error` and `409`, the commit of
//! an authorization, a capture from a message, a hold past its deadline, a lookup that finds an
//! intent mid-confirm, the safety net, the `sold_out` answer and the fast path at an intake, a
//! settle the database refuses). [`Rules::NOW`] is the code as it is; the other
//! constants are the code before a fix, and some variants are defects planted so that the
//! checker shows it finds them. Each variant names the fleet's function that decides its way.

use crate::state::{Order, Product};

/// The fleet's rules, as they are and as they were before earlier defects were fixed, and
/// defects planted on purpose, so that the checker can show it finds those.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    /// How the stock worker decides an order fits in line.
    pub line: LineRule,
    /// How a cut of the total is judged.
    pub cut: CutRule,
    /// How a resumed authorization treats its attempt's key.
    pub resume: ResumeRule,
    /// How a `requires_action` order past its deadline is settled.
    pub settle: SettleRule,
    /// What a create's `idempotency_error` means.
    pub idempotency_error: IdempotencyRule,
    /// What an authorization's commit does with the order's units, and so what its stock-check
    /// message says.
    pub commit: CommitRule,
    /// Which key a capture from a message that names its attempt goes on with.
    pub message: MessageRule,
    /// Whether fulfilment reads the deadline of an `authorized` order's hold.
    pub lapse: LapseRule,
    /// What a lookup that finds the order's intent before its confirm ends does.
    pub lookup: LookupRule,
    /// Whether the reconciliation (and a webhook) cancels a live intent of a failed order.
    pub safety_net: bool,
    /// When a taken-over pending order lists Stripe's intents before anything else.
    pub resume_lookup: ResumeLookup,
    /// What `409 idempotency_key_in_use` means.
    pub in_use: InUseRule,
    /// Which read of the product a `sold_out` answer may come from, at an intake that reads
    /// it (a scenario with intakes).
    pub sold_out: SoldOutRule,
    /// What a read that turns an intake's fast path on does with the requests still waiting.
    pub fast_path: FastPathRule,
    /// What a 3-D Secure settle does when the database refuses its move for good.
    pub settle_refusal: RefusalRule,
}

/// What a read that sees units beyond its batch's does, at an intake whose requests then go
/// straight to the door (`SoldOutReads`'s `units_left`, the fast path), with the requests that
/// arrived while it was in flight and still wait for the next read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FastPathRule {
    /// The code (`SoldOutReads::answer_batch`): they go to the door with it, under the lock
    /// that turns the fast path on, before any request that arrives after.
    WaitersFirst,
    /// The code before, planted to show the checker finds it: they wait for the next read
    /// while later arrivals go straight to the door ahead of them.
    LaterArrivalsFirst,
}

/// What a 3-D Secure settle (the webhook's or the sweeper's) does when the database refuses
/// its move out of `requires_action` for good (a trigger, a constraint).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RefusalRule {
    /// The code (`action::authorize`, `action::decline`, then `refusal::end_refused`): the
    /// order's hold cancelled and the answer read (one Stripe does not answer owed to the
    /// reconciliation, which releases it whatever the order's status); the order ended
    /// `payment_declined` with `order_refused`, its units back, where the database allows it,
    /// else left for a person; and the settler goes on with the other orders.
    EndTheOrder,
    /// The code before, planted to show the checker finds it: the settle answers the
    /// database's error. Its hold stays live; the webhook answers 503 (Stripe delivers again
    /// until it gives up); the sweeper's pass ends there, and every pass after, which meets
    /// the same order first.
    AnError,
}

/// Which read of the product an intake may answer `sold_out` from
/// (`orderfleet::domain::door::sold_out`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SoldOutRule {
    /// Only a read that began after the request arrived: one in flight per intake, shared by
    /// every request that arrived before it began (the code).
    ReadAfterArrival,
    /// A defect planted on purpose: `sold_out` from the last read that ended, however old, as a
    /// cache with a time to live answers (the end-to-end suite's `sold_out_cache`); a request
    /// it does not answer waits for a read. A unit that came back since (a decline, a lapsed
    /// hold, a raise) is missed.
    LastRead,
}

/// The rule sets the code followed, newest first. Each after [`Rules::NOW`] is the one above it
/// with one more of the code's fixes undone, and is named by what that leaves.
impl Rules {
    /// The code's rules: a taken-over order whose attempt answered no 5xx and whose keys are
    /// surely kept sends the create again under its attempt's key, with no list first
    /// ([`ResumeLookup::ListOnlyAfterAFailureOrAnExpiredKey`]).
    pub const NOW: Rules = Rules {
        resume_lookup: ResumeLookup::ListOnlyAfterAFailureOrAnExpiredKey,
        ..Rules::ALWAYS_LIST_FIRST
    };

    /// [`Rules::NOW`], but a resumed authorization always lists first
    /// ([`ResumeLookup::ListAlways`]). A lookup that finds the order's intent before its confirm
    /// ends leaves the order pending ([`LookupRule::LeavePending`]), and the safety net cancels
    /// a live intent of a failed order.
    pub const ALWAYS_LIST_FIRST: Rules =
        Rules { lookup: LookupRule::LeavePending, safety_net: true, ..Rules::DECLINE_MID_CONFIRM };

    /// [`Rules::ALWAYS_LIST_FIRST`], but a lookup that finds the order's intent before its
    /// confirm ends declines the order ([`LookupRule::Decline`]), and nothing cancels a live
    /// intent of a failed order (no safety net).
    pub const DECLINE_MID_CONFIRM: Rules =
        Rules { lapse: LapseRule::KnownDeadline, ..Rules::HOLD_DEADLINE_UNREAD };

    /// [`Rules::DECLINE_MID_CONFIRM`], but fulfilment never reads the deadline of a hold
    /// ([`LapseRule::TakesItsUnits`]). The commit of an authorization takes the order's units
    /// when nothing was cut ([`CommitRule::ReserveWhenNothingCut`]).
    pub const HOLD_DEADLINE_UNREAD: Rules = Rules {
        commit: CommitRule::ReserveWhenNothingCut,
        message: MessageRule::OnToTheOrdersAttempt,
        ..Rules::COMMIT_WITHOUT_RESERVING
    };

    /// [`Rules::HOLD_DEADLINE_UNREAD`], but the commit of an authorization only moves the order
    /// to `authorized` ([`CommitRule::Authorize`]), and the stock worker reads it and reserves
    /// it.
    pub const COMMIT_WITHOUT_RESERVING: Rules = Rules {
        line: LineRule::WaitForPendingAhead,
        cut: CutRule::KeepTheLineServed,
        resume: ResumeRule::NOW,
        settle: SettleRule::CancelFirst,
        idempotency_error: IdempotencyRule::LikeASaved5xx,
        commit: CommitRule::Authorize,
        message: MessageRule::TheMessagesAttempt,
        lapse: LapseRule::TakesItsUnits,
        lookup: LookupRule::Decline,
        safety_net: false,
        resume_lookup: ResumeLookup::ListAlways,
        in_use: InUseRule::AWait,
        // No scenario of the code these rules stand for has intakes that read the product, or
        // a settle the database refuses: for the `sold_out` read, the herd's fast path and a
        // refused settle, they take the code's rules.
        sold_out: SoldOutRule::ReadAfterArrival,
        fast_path: FastPathRule::WaitersFirst,
        settle_refusal: RefusalRule::EndTheOrder,
    };
}

/// When a taken-over pending order (a buyer's retry, the sweeper) asks Stripe's list what its
/// attempt did, and when it sends the create again under the attempt's key at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeLookup {
    /// The list first, always ([`Rules::ALWAYS_LIST_FIRST`]); the create again only if it
    /// finds nothing.
    ListAlways,
    /// Now (`authorization::resume`, `key_kept`): while no 5xx is known for the attempt and the
    /// order is younger than `KEY_KEPT` (23 h, [`Order::old`]), the create again under the
    /// attempt's key, which Stripe answers as the key's first request did, or `409
    /// idempotency_key_in_use` while that request still runs, or runs now; the list first
    /// only after a 5xx, or once Stripe may have forgotten the key.
    ListOnlyAfterAFailureOrAnExpiredKey,
    /// A defect planted to show the age matters: the create again whenever no 5xx is known,
    /// however old the order. A key Stripe forgot runs again, and makes a second intent.
    ListOnlyAfterAFailure,
}

impl ResumeLookup {
    /// Whether a taken-over order sends its attempt's create again without a list first.
    pub(super) fn resends(self, o: &Order) -> bool {
        match self {
            ResumeLookup::ListAlways => false,
            ResumeLookup::ListOnlyAfterAFailureOrAnExpiredKey => !o.attempt_failed && !o.old,
            ResumeLookup::ListOnlyAfterAFailure => !o.attempt_failed,
        }
    }
}

/// What the fleet makes of `409 idempotency_key_in_use`: a request under a key whose first
/// request Stripe is still executing, saved nothing for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InUseRule {
    /// Now (`payments::classify`): a wait, whatever Stripe types it; the order stays pending,
    /// its lease given back, and the same key later gets the first request's answer. The older
    /// rule sets ([`Rules::ALWAYS_LIST_FIRST`] and those below it) keep it too: the models they
    /// stand for did not tell a 409 from no answer.
    AWait,
    /// The code until 247134b, planted to show the checker finds it: a 409 Stripe types
    /// `idempotency_error` is read by its type, as a key that ran and failed (a saved 5xx);
    /// the attempt is marked, and a list that misses the first request, which has made
    /// nothing yet, moves the order to a new attempt with a new key.
    AsAFailedAttempt,
}

/// What a resumed authorization does when Stripe's list shows the order's intent made, its
/// confirm not ended (`requires_payment_method` with no error, for a moment while a create and
/// confirm is still executing at Stripe).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LookupRule {
    /// The code before ([`Rules::DECLINE_MID_CONFIRM`]): declined on it, its units back; the
    /// confirm may then place a hold on the card of a buyer told no, which nothing looks at
    /// again.
    Decline,
    /// Now (`authorization::record`'s `left_pending`): the order stays pending, its lease given
    /// back; a retry or the sweeper looks again.
    LeavePending,
}

impl Default for Rules {
    fn default() -> Self {
        Rules::NOW
    }
}

/// What the commit that moves an order to `authorized` (the intake's, a resumed request's, the
/// sweeper's, a 3-D Secure settle's, the webhook's) does with its units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitRule {
    /// The code before ([`Rules::COMMIT_WITHOUT_RESERVING`]): `authorized`, with its
    /// stock-check message; the stock worker reads the order and reserves it
    /// ([`orderfleet::domain::steps::fulfilment`]'s `arrive`), then captures.
    Authorize,
    /// Now, the merged commit: in the same statement, when nothing was cut (`units_promised <=
    /// units_total`) and `stock >= quantity` (`arrive`'s own condition), the units are taken and
    /// the order goes straight to `stock_reserved`; its message says so, with the attempt, and
    /// the stock worker captures under that attempt's key without reading the order first,
    /// then compare-and-sets `stock_reserved → paid` (or goes the refused capture's way).
    /// When the condition fails, as [`CommitRule::Authorize`].
    ReserveWhenNothingCut,
    /// A wrong merge, planted to show the checker finds it: the commit takes the units on
    /// `stock >= quantity` alone, blind to an operator's cut below what the door promised.
    ReserveOnStockAlone,
}

/// What a capture does after Stripe answered a 5xx it saved under the attempt's key and the
/// intent still holds funds (nothing was done), when the order is already on a later attempt:
/// another handling moved it there after that same 5xx. A stock worker that reads the order on
/// every handling (under [`CommitRule::Authorize`]) always captures under the order's attempt;
/// a capture from a message that says reserved uses the attempt the message names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageRule {
    /// The merged commit's capture as first designed (`Fulfilment::after_a_failed_capture`):
    /// the handling ends, for later.
    /// With a capture from the message, the next handling uses the message's attempt again and
    /// meets the same saved 5xx, for as long as Stripe keeps the key (24 h): only a handling
    /// that reads the order (the sweeper's) goes on.
    TheMessagesAttempt,
    /// Now, the fix the model found: the capture goes on from the order as read, under the
    /// attempt the order is on.
    OnToTheOrdersAttempt,
}

/// What fulfilment makes of an `authorized` order whose hold is past the deadline Stripe gave
/// for it (`capture_before`), which the fleet recorded (`authorization_expires_at`): Stripe
/// has cancelled that hold, so the order can never be captured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LapseRule {
    /// The code before ([`Rules::HOLD_DEADLINE_UNREAD`]): the deadline is never read in
    /// fulfilment. The order takes its units like any other, its capture is refused and the
    /// units come back; reading the line after a cut, it counts as taking its units.
    TakesItsUnits,
    /// Now (`Fulfilment::arrive`, `Fulfilment::reserve_in_line`, `Fulfilment::lapse`): the
    /// reservation takes none of its units and ends it `authorization_canceled`, its promised
    /// units back, then releases its hold under the order's key; reading the line, an order
    /// ahead past its deadline counts for nothing (`fits_after_the_line`).
    KnownDeadline,
}

impl CommitRule {
    /// Whether the commit reserves, on the product row as it is.
    pub(super) fn reserves(self, p: &Product, quantity: u8) -> bool {
        let stock_left = p.stock >= quantity as i8;
        match self {
            CommitRule::Authorize => false,
            CommitRule::ReserveWhenNothingCut => p.promised <= p.total && stock_left,
            CommitRule::ReserveOnStockAlone => stock_left,
        }
    }
}

/// How the stock worker decides, after a cut, whether an order's units are left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineRule {
    /// Before e5dc31d: an order ahead still pending authorization counts as taking its units.
    PendingAheadTakes,
    /// Now: when the answer depends on a pending order ahead, wait for it
    /// ([`fits_whatever_the_pending_do`](orderfleet::domain::steps::fulfilment::fits_whatever_the_pending_do)).
    WaitForPendingAhead,
}

/// Which totals `fleetctl product upsert` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CutRule {
    /// Before e5dc31d: any total not below the units taken.
    AboveTaken,
    /// Now: also not below the units the line holds up to its last order served.
    KeepTheLineServed,
}

/// When a taken-over order whose attempt answered a saved 5xx moves to a new attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeRule {
    /// Before bbf9d45, restated for a list that does not lag: after the attempt's own key,
    /// re-sent, answers a 5xx, move on trusting the list made before that send.
    ListBeforeTheResend,
    /// Now (bbf9d45, 6376119): a 5xx marks the attempt and ends its sends, dated when it comes
    /// back; a marked attempt moves on only when a list begun after that date finds nothing.
    DatedByTheFailure,
}

impl ResumeRule {
    /// The code as it is.
    pub const NOW: ResumeRule = ResumeRule::DatedByTheFailure;

    /// Whether a 5xx marks the attempt and ends its sends.
    pub(super) fn marks_failures(self) -> bool {
        self != ResumeRule::ListBeforeTheResend
    }
}

/// What settling a `requires_action` order does when its intent still waits for its buyer
/// past the deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettleRule {
    /// Now ([`orderfleet::domain::steps::three_d_secure`]): cancel the intent first, then record
    /// `authentication_timed_out` with the units back; a cancel answered a saved 5xx reads the
    /// intent, and moves the order to its next attempt unless the intent is released.
    CancelFirst,
    /// Before the fix this model found: the same, but a cancel answered a saved 5xx is sent
    /// again under the same key at the next settle, and gets the 5xx again for 24 hours.
    CancelFirstSameKeyAfterA5xx,
    /// A defect planted to show the checker finds it: record `authentication_timed_out` and
    /// give the units back without cancelling the intent, which its buyer may still complete.
    TimeOutWithoutCancel,
}

/// What a create's `idempotency_error` (the key ran before, with other parameters) means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdempotencyRule {
    /// Now (`PaymentError::AttemptFailed`): the key ran, and may hold funds; found out as after
    /// a saved 5xx.
    LikeASaved5xx,
    /// A defect planted to show the checker finds it: a `400` read as a refusal of the card.
    AsADecline,
}
