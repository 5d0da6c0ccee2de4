-- The sets of order statuses that SPEC §5 names, each spelled once (issue 32). Every statement
-- that asks "does this order hold units?" calls these instead of listing statuses, so a new
-- status is added to the sets here, in the migration that adds it, and nowhere else in SQL;
-- the test `migrations::the_status_sets_of_the_database_are_the_code_s` fails until the sets
-- here and `OrderStatus::set` in the code agree.
--
-- Plain SQL functions, IMMUTABLE: the planner inlines each call into the `status IN (…)` it
-- stands for, so a partial index on that list (`orders_unsettled_in_line`,
-- `orders_unfinished_by_age`) still serves a statement that calls them.

-- Promised and not yet sold or failed: the units may still come back.
CREATE FUNCTION holds_units(status order_status) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT status IN ('pending_authorization', 'authorized', 'stock_reserved') $$;

-- Captured: the units are the buyer's.
CREATE FUNCTION sold(status order_status) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT status IN ('paid') $$;

-- Ended without a sale: its units went back to the next buyer in line.
CREATE FUNCTION failed(status order_status) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT status IN ('payment_declined', 'rejected_out_of_stock', 'capture_failed') $$;

-- Holding units with no authorization recorded yet: "pending" for line order (SPEC §1.3).
CREATE FUNCTION awaiting_authorization(status order_status) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT status IN ('pending_authorization') $$;
