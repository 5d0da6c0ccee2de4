//! Checks SPEC §8's guarantees at the end of a run, from the three places that know:
//! stripe-sim's ledger (authorizations, captures, cancels, holds), the database (orders,
//! stock, outbox) and SNS (through the observer queue). The one audit: every fault-injection
//! case ends here (and prints its figures for docs/failure-modes.md), `make demo` prints its
//! [`Audit::guarantees`] as its checks, and `make bench` audits each run it measures.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::Fleet;

/// An order's status as the audit reads it: a declined order whose buyer was sent to 3-D
/// Secure is told apart ([`DECLINED_AFTER_ACTION`]): it was answered `202`, and is owed
/// `order.rejected`.
const STATUS: &str = "CASE WHEN status = 'payment_declined' AND client_secret IS NOT NULL
                           THEN 'payment_declined (3-D Secure)' ELSE status::text END";

/// See [`STATUS`].
pub const DECLINED_AFTER_ACTION: &str = "payment_declined (3-D Secure)";

/// An order of the product as the audit reads it: its id, status and units.
type OrderRow = (uuid::Uuid, String, i32);

/// Orders rejected out of stock (or sold out of a queue) although the orders behind them in `line` (position, status,
/// units; by position) took at least as many units as they asked for (SPEC §8.7).
fn line_violations(line: &[(i64, String, i32)]) -> usize {
    let mut violations = 0;
    for (i, (_, status, quantity)) in line.iter().enumerate() {
        if status == "rejected_out_of_stock" || status == "sold_out" {
            let taken_behind: i64 = line[i + 1..]
                .iter()
                .filter(|(_, s, _)| matches!(s.as_str(), "stock_reserved" | "paid"))
                .map(|(_, _, q)| *q as i64)
                .sum();
            if taken_behind >= *quantity as i64 {
                violations += 1;
            }
        }
    }
    violations
}

#[derive(Debug, Default)]
/// What one audit found: each figure a guarantee is judged by ([`Audit::guarantees`]).
pub struct Audit {
    /// Orders of the product.
    pub orders: i64,
    /// Those orders by status.
    pub by_status: HashMap<String, i64>,
    /// Orders with more than one PaymentIntent (a second authorization).
    pub double_authorizations: usize,
    /// Intents captured by more than one non-replayed capture request.
    pub double_captures: usize,
    /// Captured intents whose order is not paid (a capture without a reservation).
    pub captures_not_paid: usize,
    /// Units sold beyond the stock, and whether the stock went negative or mis-counted.
    pub oversold: i64,
    /// How far the stock is from the total less the units taken.
    pub stock_mismatch: i64,
    /// How far the door's count of promised units is from the orders that hold them.
    pub promised_mismatch: i64,
    /// Orders rejected out of stock although orders behind them in line took at least as
    /// many units as they asked for (SPEC §8.7).
    pub line_violations: usize,
    /// The queue out of its place (SPEC §8.7, §8.12): a queued order placed behind an order
    /// made after the opening, or a PaymentIntent for an order still queued.
    pub queue_violations: usize,
    /// PaymentIntents made for no order of this database (SPEC §8.8: no hold without a unit).
    pub intents_without_order: usize,
    /// Authorizations cancelled: in a drop with no cut, there are none (SPEC §8.8).
    pub cancelled_authorizations: usize,
    /// Orders not terminal at the end, and not visible to an operator either.
    pub lost: i64,
    /// Authorizations still holding funds for an order that will not be captured.
    pub holds_left: usize,
    /// (order, event) notifications seen more than once.
    pub duplicate_notifications: usize,
    /// (order, event) notifications owed and never seen.
    pub missing_notifications: usize,
    /// Whether the notifications were observed on the topic (§8.6 checked); not in the bench,
    /// which runs with no observer ([`Audit::without_notifications`]).
    pub notifications_observed: bool,
}

impl Audit {
    /// Audits `product`, given the notifications the observer saw.
    pub async fn of(
        fleet: &Fleet,
        product: &str,
        notifications: &[(String, String)],
    ) -> anyhow::Result<Self> {
        let mut audit = Audit { notifications_observed: true, ..Audit::default() };
        let orders: Vec<OrderRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT id, {STATUS}, quantity FROM orders WHERE product_id = $1"
        )))
        .bind(product)
        .fetch_all(&fleet.pool)
        .await?;
        let line: Vec<(i64, String, i32)> = sqlx::query_as(
            "SELECT position, status::text, quantity FROM orders
              WHERE product_id = $1 AND position IS NOT NULL ORDER BY position",
        )
        .bind(product)
        .fetch_all(&fleet.pool)
        .await?;
        audit.line_violations = line_violations(&line);
        let (queue_last, later_first): (Option<i64>, Option<i64>) = sqlx::query_as(
            "SELECT max(position) FILTER (WHERE queued_for IS NOT NULL),
                    min(position) FILTER (WHERE queued_for IS NULL)
               FROM orders WHERE product_id = $1",
        )
        .bind(product)
        .fetch_one(&fleet.pool)
        .await?;
        audit.queue_violations = usize::from(queue_last.zip(later_first).is_some_and(|(q, l)| q > l));
        let counters: (i32, i32, i32) =
            sqlx::query_as("SELECT units_total, stock, units_promised FROM products WHERE id = $1")
                .bind(product)
                .fetch_one(&fleet.pool)
                .await?;
        audit.count_orders(&orders, counters);

        let intents = fleet.intents().await?;
        let known: HashSet<String> = sqlx::query_scalar::<_, uuid::Uuid>("SELECT id FROM orders")
            .fetch_all(&fleet.pool)
            .await?
            .into_iter()
            .map(|id| id.to_string())
            .collect();
        let status_of: HashMap<String, String> =
            orders.iter().map(|(id, s, _)| (id.to_string(), s.clone())).collect();
        audit.check_intents(&intents, &known, &status_of);
        audit.check_notifications(notifications, &status_of);
        Ok(audit)
    }

    /// The orders by status, and the units they hold against the product's counters
    /// (`units_total`, `stock`, `units_promised`).
    fn count_orders(&mut self, orders: &[OrderRow], (total, stock, promised): (i32, i32, i32)) {
        self.orders = orders.len() as i64;
        for (_, status, _) in orders {
            *self.by_status.entry(status.clone()).or_default() += 1;
        }
        let units = |statuses: &[&str]| -> i64 {
            orders.iter().filter(|(_, s, _)| statuses.contains(&s.as_str())).map(|(_, _, q)| *q as i64).sum()
        };
        let sold = units(&["paid", "refunded"]);
        let held = units(&["stock_reserved", "paid", "refunded"]);
        self.oversold = (sold - total as i64).max(0);
        self.stock_mismatch = (total as i64 - held - stock as i64).abs() + if stock < 0 { 1 } else { 0 };
        let holding = units(&[
            "pending_authorization",
            "requires_action",
            "authorized",
            "stock_reserved",
            "paid",
            "refunded",
        ]);
        self.promised_mismatch = (promised as i64 - holding).abs();
        self.lost = orders
            .iter()
            .filter(|(_, s, _)| {
                matches!(
                    s.as_str(),
                    "pending_authorization" | "requires_action" | "authorized" | "stock_reserved" | "queued"
                )
            })
            .count() as i64;
    }

    /// stripe-sim's ledger against the orders: `known` is every order of the database,
    /// `status_of` the product's orders by id.
    fn check_intents(
        &mut self,
        intents: &[Value],
        known: &HashSet<String>,
        status_of: &HashMap<String, String>,
    ) {
        self.intents_without_order = intents.iter().filter(|i| !known.contains(order_of(i))).count();
        self.cancelled_authorizations = intents
            .iter()
            .filter(|i| status_of.contains_key(order_of(i)) && i["cancel_count"].as_i64().unwrap_or(0) > 0)
            .count();
        let mut per_order: HashMap<String, usize> = HashMap::new();
        for intent in intents.iter().filter(|i| status_of.contains_key(order_of(i))) {
            let order = order_of(intent).to_owned();
            *per_order.entry(order.clone()).or_default() += 1;
            if intent["capture_count"].as_i64().unwrap_or(0) > 1 {
                self.double_captures += 1;
            }
            let order_status = status_of[&order].as_str();
            if intent["status"] == "succeeded" && !matches!(order_status, "paid" | "refunded") {
                self.captures_not_paid += 1;
            }
            let terminal_without_capture = matches!(
                order_status,
                "rejected_out_of_stock"
                    | "payment_declined"
                    | "capture_failed"
                    | "authorization_canceled"
                    | DECLINED_AFTER_ACTION
            );
            if intent["status"] == "requires_capture" && terminal_without_capture {
                self.holds_left += 1;
            }
        }
        self.double_authorizations = per_order.values().filter(|n| **n > 1).count();
        self.queue_violations += per_order.keys().filter(|order| status_of[*order] == "queued").count();
    }

    /// The (event, order) notifications seen against those the product's orders are owed.
    fn check_notifications(
        &mut self,
        notifications: &[(String, String)],
        status_of: &HashMap<String, String>,
    ) {
        let mut seen: HashSet<(String, String)> = HashSet::new();
        for note in notifications {
            if status_of.contains_key(&note.1) && !seen.insert(note.clone()) {
                self.duplicate_notifications += 1;
            }
        }
        for (id, status) in status_of {
            let mut expected = Vec::new();
            let never_accepted = [
                "pending_authorization",
                "requires_action",
                "payment_declined",
                DECLINED_AFTER_ACTION,
                "queued",
                "sold_out",
            ];
            if !never_accepted.contains(&status.as_str()) {
                expected.push("order.accepted");
            }
            match status.as_str() {
                "paid" => expected.push("order.paid"),
                "refunded" => expected.extend(["order.paid", "order.refunded"]),
                "rejected_out_of_stock"
                | "capture_failed"
                | "authorization_canceled"
                | "sold_out"
                | DECLINED_AFTER_ACTION => expected.push("order.rejected"),
                _ => {}
            }
            self.missing_notifications +=
                expected.iter().filter(|e| !seen.contains(&(e.to_string(), id.clone()))).count();
        }
    }

    /// Audits `product` from stripe-sim's ledger and the database alone, for a run with no
    /// observer on the topic: the bench, where a subscription would add SNS deliveries to what
    /// it measures. §8.6 is then not judged, and [`Audit::guarantees`] leaves it out.
    pub async fn without_notifications(fleet: &Fleet, product: &str) -> anyhow::Result<Self> {
        let audit = Self::of(fleet, product, &[]).await?;
        Ok(Self { notifications_observed: false, missing_notifications: 0, ..audit })
    }

    /// Each guarantee of SPEC §8 this audit checks, in words, and whether it held.
    pub fn guarantees(&self) -> Vec<(&'static str, bool)> {
        let notifications = "each (order, event) notification once (§8.6)";
        let all = [
            ("one authorization per order (§8.1)", self.double_authorizations == 0),
            (
                "at most one capture per order, only for reserved stock (§8.2)",
                self.double_captures == 0 && self.captures_not_paid == 0,
            ),
            (
                "units sold never exceed stock; stock and promised units add up (§8.3)",
                self.oversold == 0 && self.stock_mismatch == 0 && self.promised_mismatch == 0,
            ),
            ("every accepted order is terminal or visible to an operator (§8.4)", self.lost == 0),
            ("no authorization hold left behind (§8.5)", self.holds_left == 0),
            (notifications, self.duplicate_notifications == 0 && self.missing_notifications == 0),
            (
                "positions follow arrival: no order rejected for one behind it (§8.7)",
                self.line_violations == 0,
            ),
            ("a PaymentIntent only for an order (§8.8)", self.intents_without_order == 0),
            (
                "a pre-queue ahead of every later order, no PaymentIntent while queued (§8.12)",
                self.queue_violations == 0,
            ),
        ];
        all.into_iter().filter(|(name, _)| self.notifications_observed || *name != notifications).collect()
    }

    /// The guarantees that did not hold, by name; empty when all did.
    pub fn broken(&self) -> Vec<&'static str> {
        self.guarantees().into_iter().filter(|(_, held)| !held).map(|(name, _)| name).collect()
    }

    /// One line for the bench: how many guarantees held, and which did not.
    pub fn summary(&self) -> String {
        let (checked, broken) = (self.guarantees().len(), self.broken());
        if broken.is_empty() {
            format!("all {checked} hold (SPEC §8, the suite's audit)")
        } else {
            format!("{} of {checked} BROKEN: {}", broken.len(), broken.join("; "))
        }
    }

    /// Whether every guarantee held.
    pub fn holds(&self) -> bool {
        self.guarantees().iter().all(|(_, held)| *held)
    }

    /// Panics with the figures unless every guarantee holds.
    pub fn assert_guarantees(&self) {
        assert!(self.holds(), "a guarantee does not hold: {self:#?}");
    }

    /// One line for docs/failure-modes.md.
    pub fn figures(&self, case: &str, faults: usize) -> String {
        format!(
            "fault-suite: case={case} orders={} faults={faults} statuses={:?} double_authorizations={} double_captures={} \
             oversold={} line_violations={} lost={} holds_left={} duplicate_notifications={} missing_notifications={}",
            self.orders,
            sorted(&self.by_status),
            self.double_authorizations,
            self.double_captures,
            self.oversold,
            self.line_violations,
            self.lost,
            self.holds_left,
            self.duplicate_notifications,
            self.missing_notifications
        )
    }
}

fn order_of(intent: &Value) -> &str {
    intent["metadata"]["order_id"].as_str().unwrap_or("")
}

fn sorted(map: &HashMap<String, i64>) -> Vec<(String, i64)> {
    let mut v: Vec<_> = map.iter().map(|(k, n)| (k.clone(), *n)).collect();
    v.sort();
    v
}
