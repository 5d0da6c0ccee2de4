-- The Stripe budget's own count (orderfleet::runtime::budget::ledger), so that no lease and no
-- division of the budget hangs on the database's clock.
--
-- One row. `tick`: every member's tick advances it (under the budget's advisory lock) and
-- records it in its own row as its renewal. `round`: a limit too small to give one unit to each
-- member wanting it goes round by it. `round_ms`: the time counted in this round, each tick
-- adding the time since its member's last tick on that member's own clock; the round moves on
-- at two seconds a live member.
CREATE TABLE stripe_budget_ledger (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    tick bigint NOT NULL CHECK (tick >= 0),
    round bigint NOT NULL CHECK (round >= 0),
    round_ms bigint NOT NULL CHECK (round_ms >= 0)
);
INSERT INTO stripe_budget_ledger (tick, round, round_ms) VALUES (0, 0, 0);

-- A member's last renewal and last cut, as ledger ticks: the others count its lease, and the
-- share it gave up, from when they first see each, on their own monotonic clocks. A row written
-- by a binary from before the ledger keeps 0 here; its expires_at and held_until still change
-- at every renewal and cut.
ALTER TABLE stripe_budget_members
    ADD COLUMN renewed_tick bigint NOT NULL DEFAULT 0,
    ADD COLUMN held_tick bigint NOT NULL DEFAULT 0;

GRANT SELECT, INSERT, UPDATE ON stripe_budget_ledger
    TO orderfleet_intake, orderfleet_stock_worker, orderfleet_operator;
