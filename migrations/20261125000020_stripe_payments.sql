-- 3-D Secure, Stripe's webhooks, refunds and disputes (issue 33, SPEC §1.1, §4, §5).

-- SPEC §5's sets with the new statuses. An order in `requires_action` holds its units and,
-- for line order, is pending like one in `pending_authorization`; a refunded order's unit
-- stays sold (money back, not goods); a hold cancelled outside the fleet is a failed order.
CREATE OR REPLACE FUNCTION holds_units(status order_status) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT status IN ('pending_authorization', 'requires_action', 'authorized', 'stock_reserved') $$;

CREATE OR REPLACE FUNCTION sold(status order_status) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT status IN ('paid', 'refunded') $$;

CREATE OR REPLACE FUNCTION failed(status order_status) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT status IN ('payment_declined', 'rejected_out_of_stock', 'capture_failed', 'authorization_canceled') $$;

CREATE OR REPLACE FUNCTION awaiting_authorization(status order_status) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT status IN ('pending_authorization', 'requires_action') $$;

-- The partial indexes on "holds units" follow the set: a query's inlined list must imply the
-- index's predicate for the planner to use it.
DROP INDEX orders_unsettled_in_line;
CREATE INDEX orders_unsettled_in_line ON orders (product_id, position)
    WHERE status IN ('pending_authorization', 'requires_action', 'authorized', 'stock_reserved');
DROP INDEX orders_unfinished_by_age;
CREATE INDEX orders_unfinished_by_age ON orders (updated_at)
    WHERE status IN ('pending_authorization', 'requires_action', 'authorized', 'stock_reserved');

-- What counts toward the card-testing limit as a decline: a declined card or a failed
-- authentication. An order that needed 3-D Secure and ended by its deadline, or by a cancel
-- outside the fleet, counts as nothing: needing authentication is not a decline.
CREATE FUNCTION counts_as_decline(status order_status, failure_reason text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT status = 'payment_declined'
             AND failure_reason IS DISTINCT FROM 'authentication_timed_out'
             AND failure_reason IS DISTINCT FROM 'payment_canceled' $$;

-- The card gate counts the buyer's orders still being authorized, those awaiting 3-D Secure
-- included (each may yet be one more decline), and the last hour's declines.
CREATE OR REPLACE FUNCTION card_attempts(buyer text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE STRICT COST 1000
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('cards/' || buyer, 0));
    RETURN (SELECT count(*) FROM orders
             WHERE user_id = buyer
               AND (awaiting_authorization(status)
                    OR (counts_as_decline(status, failure_reason)
                        AND updated_at > now() - interval '1 hour')));
END
$$;

-- 3-D Secure: what the buyer's page needs while the order is `requires_action` (the
-- PaymentIntent's client secret and next action), and until when it waits.
-- Refunds and disputes, recorded on the order.
ALTER TABLE orders
    ADD COLUMN client_secret text,
    ADD COLUMN next_action jsonb,
    ADD COLUMN action_expires_at timestamptz,
    ADD COLUMN amount_refunded bigint NOT NULL DEFAULT 0,
    ADD COLUMN disputed_at timestamptz,
    ADD COLUMN dispute_id text;

-- A charge's webhook names its PaymentIntent, not the order: the order is found by the intent.
CREATE INDEX orders_by_payment_intent ON orders (payment_intent_id) WHERE payment_intent_id IS NOT NULL;

-- The sweeper's `requires_action` orders, by deadline.
CREATE INDEX orders_awaiting_action ON orders (action_expires_at) WHERE status = 'requires_action';

-- Stripe's webhook events applied, by id: an event and its effect commit together, so a
-- redelivery (Stripe delivers at least once, retrying for up to three days) is recognised.
CREATE TABLE webhook_events (
    id text PRIMARY KEY,
    type text NOT NULL,
    order_id uuid,
    -- What applying it did: a word for operators (`authorized`, `ignored`, `no_change`, …).
    effect text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_events_by_age ON webhook_events (received_at);

-- The intake applies the webhooks and records them; the relay's retention job purges the old
-- ones (Stripe retries an event for up to three days); operators read them. The intake still
-- never changes a product's stock: a reserved order's hold that is gone is the stock worker's.
GRANT SELECT, INSERT ON webhook_events TO orderfleet_intake;
GRANT SELECT, DELETE ON webhook_events TO orderfleet_relay;
GRANT SELECT ON webhook_events TO orderfleet_operator;
-- The relay's gauges: an order past its 3-D Secure deadline counts as stuck; disputes page.
GRANT SELECT (action_expires_at, disputed_at) ON orders TO orderfleet_relay;
