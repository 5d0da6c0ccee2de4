//! A move of one order from one status to the next ([`Transition`]): what it records and the
//! outbox messages it causes, applied in ONE statement (`transition.sql`), and the webhook
//! event that caused it, recorded with it.

use serde::Serialize;
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::domain::records::outbox::{Destination, EventType};
use orderfleet_words::OrderId;

use super::{BuyerAction, FailureReason, Hold, OrderStatus};

/// A move of one order from one status to the next, with what the move records and the
/// outbox messages it causes: a value, built by the constructors of `moves.rs`, one per arrow of SPEC §5,
/// then applied (`Transition::apply`) in one statement.
#[derive(Debug, Clone)]
pub struct Transition<'a> {
    /// The order it moves.
    pub(super) order_id: OrderId,
    /// The status it must still be in; if it is not, the move writes nothing.
    pub(super) from: OrderStatus,
    /// The status it moves to.
    pub(super) to: OrderStatus,
    /// What the buyer is told of a failure (`failure_reason`).
    pub(super) failure_reason: Option<FailureReason>,
    /// The authorization hold, recorded with the move.
    pub(super) hold: Option<Hold<'a>>,
    /// The outbox messages the move causes, committed with it.
    pub(super) messages: Vec<crate::domain::records::outbox::NewMessage>,
    /// For a move to `requires_action`: what the buyer's page needs, and until when.
    pub(super) action: Option<BuyerAction<'a>>,
    /// The move ends the order without a sale: its promised units go back to the door, and
    /// from `stock_reserved`, its units to the stock too, in the same statement.
    pub(super) gives_units_back: bool,
    /// What operators are told of the failure (`decline_detail`), beside the buyer's code.
    pub(super) detail: Option<&'a str>,
    /// The Stripe webhook event that caused the move, recorded with it ([`Transition::commit`]).
    pub(super) event: Option<StripeEvent<'a>>,
    /// The order's hold is gone (cancelled, or lapsed): `authorization_released_at` is set.
    pub(super) hold_released: bool,
}

/// A Stripe webhook event, by its id and type: recorded in `webhook_events` with its effect,
/// so a redelivery is recognised.
#[derive(Debug, Clone, Copy)]
pub struct StripeEvent<'a> {
    /// `evt_…`.
    pub id: &'a str,
    /// `payment_intent.canceled`, ….
    pub kind: &'a str,
}

/// Records that `event` was applied, with what it did (`effect`), unless it already was.
pub async fn record_event<'e>(
    executor: impl PgExecutor<'e>,
    event: StripeEvent<'_>,
    order_id: Option<OrderId>,
    effect: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO webhook_events (id, type, order_id, effect) VALUES ($1, $2, $3, $4)
         ON CONFLICT (id) DO NOTHING",
        event.id,
        event.kind,
        order_id as _,
        effect,
    )
    .execute(executor)
    .await?;
    Ok(())
}

impl<'a> Transition<'a> {
    /// Records that the order's hold is gone with the move.
    pub(crate) fn with_hold_released(self) -> Self {
        Self { hold_released: true, ..self }
    }

    /// Records the webhook event that caused the move with it, when there is one.
    pub(crate) fn with_event(self, event: Option<StripeEvent<'a>>) -> Self {
        Self { event, ..self }
    }

    /// Applies the move ([`Transition::apply`]), and, when a webhook event caused it, records
    /// the event in the same transaction: the effect and the event's id commit together.
    pub(crate) async fn commit(self, pool: &orderfleet_runtime::db::Pool) -> sqlx::Result<bool> {
        let Some(event) = self.event else { return self.apply(pool).await };
        let (order_id, to) = (self.order_id, self.to);
        let mut tx = pool.begin().await?;
        let moved = self.apply(&mut *tx).await?;
        if moved {
            record_event(&mut *tx, event, Some(order_id), to.as_str()).await?;
        }
        tx.commit().await?;
        Ok(moved)
    }

    /// Records what the buyer's page needs to complete 3-D Secure, and its deadline.
    pub(super) fn with_action(self, action: BuyerAction<'a>) -> Self {
        Self { action: Some(action), ..self }
    }

    /// Gives the order's promised units back, keeping `detail` for operators.
    pub(super) fn giving_units_back(self, detail: &'a str) -> Self {
        Self { gives_units_back: true, detail: Some(detail), ..self }
    }

    /// Records what the buyer is told of the failure.
    pub(super) fn with_reason(self, failure_reason: FailureReason) -> Self {
        Self { failure_reason: Some(failure_reason), ..self }
    }

    /// Records the authorization hold (its PaymentIntent and deadline).
    pub(crate) fn with_hold(self, hold: Hold<'a>) -> Self {
        Self { hold: Some(hold), ..self }
    }

    /// A message the move causes, for its event type's queue.
    pub(super) fn with_message(mut self, event_type: EventType, payload: impl Serialize) -> Self {
        self.messages.push(crate::domain::records::outbox::NewMessage::new(
            event_type,
            self.order_id,
            payload,
        ));
        self
    }

    /// ONE statement (`transition.sql`: one round trip and the shortest possible lock): moves
    /// the order from `from` to `to` if, and only if, it is still in `from`, and in the same statement
    /// enqueues the outbox messages the move causes, each carrying the order's trace context,
    /// and gives its units back when the move ends it (the order row is locked before the
    /// product row, as everywhere). Returns whether this call made the move; if not, nothing
    /// was written. The intake's lease is cleared, and the hold recorded when given.
    ///
    /// **A move to `authorized` also takes the order's units** when nothing was cut — the
    /// condition of the stock worker's own reservation ([`crate::domain::steps::fulfilment`]'s
    /// `arrive`): no more units promised than the total, and the units in stock — and then
    /// the order goes on to `stock_reserved` in the same statement (SPEC §5's two moves,
    /// committed as one). Its stock-check message then says so (`reserved`: the attempt and
    /// the PaymentIntent to capture), and the stock worker captures without reading the order
    /// first. After a cut the order stays `authorized`, and the worker reserves it in line.
    /// `crates/order-model` checks this merge (`CommitRule::ReserveWhenNothingCut`), and finds
    /// the defect of one that looks at the stock alone.
    pub(crate) async fn apply<'e>(self, executor: impl PgExecutor<'e>) -> sqlx::Result<bool> {
        let (ids, event_types, destinations, payloads) = columns(&self.messages);
        let moved = sqlx::query_file_scalar!(
            "src/domain/records/order/transition.sql",
            self.order_id as _,
            self.from as _,
            self.to as _,
            self.failure_reason.map(FailureReason::as_str),
            self.hold.map(|h| h.intent_id),
            &ids,
            &event_types as _,
            &destinations as _,
            &payloads as _,
            self.hold.and_then(|h| h.capture_before),
            self.action.map(|a| a.client_secret),
            self.action.map(|a| a.next_action),
            self.action.map(|a| a.until),
            self.gives_units_back,
            self.detail,
            self.hold_released,
        )
        .fetch_one(executor)
        .await?;
        Ok(moved == 1)
    }
}

/// The outbox messages of a move as the columns `Transition::apply` unnests: a new id for
/// each, its event type, its destination, its payload.
fn columns(
    messages: &[crate::domain::records::outbox::NewMessage],
) -> (Vec<Uuid>, Vec<EventType>, Vec<Destination>, Vec<&serde_json::Value>) {
    let ids = messages.iter().map(|_| Uuid::now_v7()).collect();
    let event_types = messages.iter().map(|m| m.event_type).collect();
    let destinations = messages.iter().map(|m| m.event_type.destination()).collect();
    (ids, event_types, destinations, messages.iter().map(|m| &m.payload).collect())
}
