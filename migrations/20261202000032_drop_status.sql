-- What `fleetctl drop status` shows that no row kept until now (SPEC §2).
--
-- The sold-out answers each intake gave, by product and second: an intake counts them in
-- memory and adds its counts once a second (one statement, only while it answers any), and
-- drops seconds older than ten minutes as it writes.
CREATE TABLE door_answers (
    product_id  text NOT NULL,
    second      timestamptz NOT NULL,
    sold_out    bigint NOT NULL CHECK (sold_out >= 0),
    PRIMARY KEY (product_id, second)
);
CREATE INDEX door_answers_by_second ON door_answers (second);

-- Each 429 a process of the fleet got from Stripe, by operation: `rate_limit` (the fleet
-- slows down) or `lock_timeout` (one intent busy). Written as it happens (the fleet keeps
-- within Stripe's limits, so they are few), kept ten minutes.
CREATE TABLE stripe_429s (
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    endpoint  text NOT NULL,
    code      text NOT NULL CHECK (code IN ('rate_limit', 'lock_timeout'))
);
CREATE INDEX stripe_429s_by_time ON stripe_429s (at);

REVOKE ALL ON door_answers, stripe_429s FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON door_answers TO orderfleet_intake;
GRANT SELECT, INSERT, DELETE ON stripe_429s TO orderfleet_intake, orderfleet_stock_worker, orderfleet_operator;
GRANT SELECT ON door_answers TO orderfleet_operator;
