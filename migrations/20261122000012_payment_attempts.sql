-- The Stripe attempt an order is on (SPEC §1.1, orderfleet::payments). Each attempt has its
-- own idempotency keys. Stripe saves the answer of a request that began executing, a 500
-- included, under its key for 24 hours, and replays it to every retry with that key: after a
-- 5xx the fleet asks Stripe what the attempt did and, only when it did nothing, moves the order
-- to its next attempt, with new keys. The number is kept on the order so that a crash never
-- loses it (a process that forgot it would reuse a spent key, or worse, start an attempt
-- twice), and when the attempt began, because Stripe's search lags its writes: a search that
-- finds no PaymentIntent for the order is trusted only for an attempt older than the lag.
--
-- Both columns have a non-volatile default: adding them rewrites nothing (PostgreSQL 11+). The
-- check is added NOT VALID: it holds for every row written from now on, and checking the
-- existing ones (all 1, the default) would scan the whole table under this migration's
-- exclusive lock, stopping the intake and the workers meanwhile.
-- Existing orders are on their first attempt, whose keys are the ones used before this
-- migration. The service roles' table-level grants on orders (0010) cover the new columns.
ALTER TABLE orders
    ADD COLUMN payment_attempt integer NOT NULL DEFAULT 1,
    ADD COLUMN payment_attempt_at timestamptz NOT NULL DEFAULT now();
ALTER TABLE orders ADD CONSTRAINT payment_attempt_from_one CHECK (payment_attempt >= 1) NOT VALID;
