-- Issue 35, point 6: the reconciliation of stray PaymentIntents (crate::domain::strays). Stripe's
-- list is read once per window of creation times, not once per order; this row says up to when
-- it has been read, and which sweeper reads it now (claimed_until), so replicas share it. It
-- starts a day back: the first pass after a deploy reads that day once.
CREATE TABLE stripe_reconciliation (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    reconciled_until timestamptz NOT NULL,
    claimed_until timestamptz NOT NULL DEFAULT '-infinity'
);
INSERT INTO stripe_reconciliation (reconciled_until) VALUES (now() - interval '1 day');

-- The stock worker's sweeper and `fleetctl sweep` run it.
GRANT SELECT, UPDATE ON stripe_reconciliation TO orderfleet_stock_worker, orderfleet_operator;
