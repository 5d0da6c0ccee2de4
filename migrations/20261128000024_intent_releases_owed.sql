-- Releases owed: PaymentIntents the fleet must cancel and could not yet (crate::domain::strays).
-- A stray, or a live intent of a failed order, whose cancel Stripe did not answer is written here
-- and passed over, so that the reconciliation's window moves on; each later pass tries these
-- again first, until Stripe cancels them (the row goes) or refuses for good (logged for a
-- person, and the row goes).
CREATE TABLE intent_releases_owed (
    payment_intent_id text PRIMARY KEY,
    order_id uuid NOT NULL,
    found text NOT NULL,
    owed_since timestamptz NOT NULL DEFAULT now(),
    tries integer NOT NULL DEFAULT 1,
    last_tried_at timestamptz NOT NULL DEFAULT now(),
    last_error text NOT NULL
);

-- The stock worker's sweeper and `fleetctl sweep` run the reconciliation; the intake owes a
-- release when the database refuses an order's commit and Stripe does not answer its cancel.
GRANT SELECT, INSERT, UPDATE, DELETE ON intent_releases_owed TO orderfleet_stock_worker, orderfleet_operator;
GRANT SELECT, INSERT, UPDATE ON intent_releases_owed TO orderfleet_intake;
