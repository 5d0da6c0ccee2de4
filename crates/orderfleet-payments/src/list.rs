//! Finding PaymentIntents through Stripe's list, by the window they were created in: the
//! intent an order's attempt made ([`Payments::find_by_order`], for an authorization resumed
//! after its answer was lost) and every intent of a window ([`Payments::list_created`], for the
//! reconciliation of strays). The list is read here page by page, and the window is placed on
//! Stripe's clock here.

use stripe::StripeRequest;
use stripe_core::PaymentIntent;
use stripe_core::payment_intent::ListPaymentIntent;
use stripe_types::{RangeBoundsTs, RangeQueryTs};

use crate::classify::{Operation, PaymentError};
use crate::client::Payments;
use crate::intent::{EXPAND, Intent, IntentStatus};
use crate::stripe_http::PooledStripe;
use orderfleet_words::OrderId;

/// How much earlier than the order's creation, on Stripe's clock, a lookup's window opens: the
/// database's clock (which dates the order) and this machine's may differ a little (both keep
/// NTP time), and `Date` and `created` count whole seconds. A wider window costs intents read
/// in vain: a page per 100 the account made meanwhile (BENCHMARKS.md, "Finding an attempt").
const WINDOW_MARGIN: chrono::TimeDelta = chrono::TimeDelta::seconds(10);

/// Intents per page of a lookup: the most Stripe's list gives.
const LIST_PAGE: i64 = 100;

impl Payments {
    /// The PaymentIntent made for an order, found by its `metadata[order_id]` among the intents
    /// Stripe's list API shows created since the order was (`since`, this machine's clock). This
    /// is how a resumed authorization learns what an attempt whose answer was lost, or whose
    /// key answered a 5xx or an `idempotency_error`, really did, without trusting an idempotency
    /// key that Stripe may have pruned (24 h).
    ///
    /// The list, not the search: Stripe's search lags its writes (under a minute normally, up to
    /// an hour in its incidents, which is when 5xx answers come), and its docs say not to use it
    /// to read after a write; the list does not lag (docs.stripe.com/search#data-freshness). It
    /// filters by `created`, on Stripe's clock, so the window is shifted by Stripe's clock as
    /// the `Date` of its answers shows it, and opened [`WINDOW_MARGIN`] early. Metadata is
    /// matched here, page by page (100 intents a page, newest first).
    ///
    /// `until`, when known, closes the window: an attempt whose key answered a 5xx made its
    /// intent, if any, before that answer came back, so intents made after it need not be read
    /// (after an incident on a busy account, the many made since).
    pub async fn find_by_order(
        &self,
        order_id: OrderId,
        since: chrono::DateTime<chrono::Utc>,
        until: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<Option<Intent>, PaymentError> {
        let window = |client: &PooledStripe| {
            let on_stripe = |ours| client.stripe_time(ours).unwrap_or(ours);
            (on_stripe(since) - WINDOW_MARGIN, until.map(|until| on_stripe(until) + WINDOW_MARGIN))
        };
        let knew_the_clock = self.client.stripe_time(since).is_some();
        let first = window(&self.client);
        let mut intents = self.list_within(order_id, first).await?;
        // The first answer of this process taught the clock: the window was placed on ours,
        // and is read again where it lies on Stripe's if that differs.
        if !knew_the_clock && window(&self.client) != first {
            intents = self.list_within(order_id, window(&self.client)).await?;
        }
        // Several intents would mean a second authorization was made; the live one (holding
        // funds) is the one that matters.
        let live = intents.iter().find(|i| i.status == IntentStatus::RequiresCapture).cloned();
        Ok(live.or_else(|| intents.into_iter().next()))
    }

    /// The order's intents among those created within `(from, until)` (Stripe's clock; no end
    /// when `until` is `None`): every page.
    async fn list_within(
        &self,
        order_id: OrderId,
        window: (chrono::DateTime<chrono::Utc>, Option<chrono::DateTime<chrono::Utc>>),
    ) -> Result<Vec<Intent>, PaymentError> {
        let order = order_id.to_string();
        self.list_pages(window, |pi| pi.metadata.get("order_id") == Some(&order)).await
    }

    /// Every PaymentIntent Stripe's list shows created from `since` to `until` (this machine's
    /// clock, placed on Stripe's, and opened [`WINDOW_MARGIN`] early): every page. For the
    /// reconciliation of strays (`orderfleet::domain::recovery::strays`).
    pub async fn list_created(
        &self,
        since: chrono::DateTime<chrono::Utc>,
        until: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<Intent>, PaymentError> {
        let on_stripe = |ours| self.client.stripe_time(ours).unwrap_or(ours);
        self.list_pages((on_stripe(since) - WINDOW_MARGIN, Some(on_stripe(until))), |_| true).await
    }

    /// The intents that `keep` keeps among those created within `(from, until)` (Stripe's
    /// clock; no end when `until` is `None`), page by page, 100 a page, newest first.
    async fn list_pages(
        &self,
        (from, until): (chrono::DateTime<chrono::Utc>, Option<chrono::DateTime<chrono::Utc>>),
        keep: impl Fn(&PaymentIntent) -> bool,
    ) -> Result<Vec<Intent>, PaymentError> {
        let created = RangeQueryTs::Bounds(RangeBoundsTs {
            gte: Some(from.timestamp()),
            lte: until.map(|until| until.timestamp()),
            ..RangeBoundsTs::default()
        });
        let mut kept = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut request =
                ListPaymentIntent::new().created(created).limit(LIST_PAGE).expand([format!("data.{EXPAND}")]);
            if let Some(last) = &after {
                request = request.starting_after(last.clone());
            }
            let page = self
                .with_retries(Operation::List, || {
                    request.customize().timeout(self.retry.timeout).send(&self.client)
                })
                .await?;
            kept.extend(page.data.iter().filter(|pi| keep(pi)).map(Intent::from));
            match page.data.last() {
                Some(last) if page.has_more => after = Some(last.id.as_str().to_owned()),
                _ => return Ok(kept),
            }
        }
    }
}
