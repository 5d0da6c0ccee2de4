-- The fleet's Stripe budget (orderfleet::runtime::budget): Stripe's limits are the account's,
-- so every process that calls Stripe holds a row here with what it asks for and what it may
-- send, and renews it while it has work; a row past its lease and one window
-- is deleted by the next member that sees it.
CREATE TABLE stripe_budget_members (
    member uuid PRIMARY KEY,
    -- Which binary, for an operator reading the table.
    process text NOT NULL,
    -- Requests per window, by endpoint: {"POST /v1/payment_intents": 8, …}.
    demand jsonb NOT NULL,
    share jsonb NOT NULL,
    -- A larger share given up less than a window ago, which its requests may still fill.
    held jsonb NOT NULL,
    held_until timestamptz NOT NULL,
    -- The lease: the member sends nothing past it unless it renews.
    expires_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- After a 429 from Stripe, an endpoint's limit is cut for the whole fleet, and grows back.
CREATE TABLE stripe_budget_slowdowns (
    endpoint text PRIMARY KEY,
    factor double precision NOT NULL CHECK (factor > 0 AND factor <= 1),
    cut_at timestamptz NOT NULL
);

GRANT SELECT, INSERT, UPDATE, DELETE ON stripe_budget_members, stripe_budget_slowdowns
    TO orderfleet_intake, orderfleet_stock_worker, orderfleet_operator;
-- The relay's gauges count the operations a 429 cut in the last minutes, for the alarm.
GRANT SELECT ON stripe_budget_slowdowns TO orderfleet_relay;
