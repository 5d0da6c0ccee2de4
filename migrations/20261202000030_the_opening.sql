-- The opening (SPEC §1.8): a product may open at a set time, with a pre-queue before it.
--   opens_at        when the sale opens (NULL: open now, as before)
--   queue_opens_at  when its pre-queue opens, before opens_at (NULL: no pre-queue)
--   opened_at       when the fleet opened it: drew its queue and promised units down it
--   draw_seed       the draw's seed, from the operating system's CSPRNG, kept for the audit
--   queue_waiting   queued orders wait for a unit: the door promises no one else anything
ALTER TABLE products
    ADD COLUMN opens_at       timestamptz,
    ADD COLUMN queue_opens_at timestamptz,
    ADD COLUMN opened_at      timestamptz,
    ADD COLUMN draw_seed      bytea,
    ADD COLUMN queue_waiting  boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT products_queue_opens_before_the_sale
        CHECK (queue_opens_at IS NULL OR (opens_at IS NOT NULL AND queue_opens_at < opens_at));

-- The products the opener looks at: scheduled, not yet opened.
CREATE INDEX products_to_open ON products (opens_at) WHERE opened_at IS NULL AND opens_at IS NOT NULL;

-- A queued order has no place until the draw; every other order has one.
--   queued_for  the opening a queued order was taken for (its 202 answered `queued`, and a
--               retry of its key answers that again, whatever it became since)
ALTER TABLE orders
    ALTER COLUMN position DROP NOT NULL,
    ADD COLUMN queued_for timestamptz,
    ADD CONSTRAINT orders_placed_unless_queued CHECK (position IS NOT NULL OR status = 'queued');

-- One queued order per buyer and product (`409 already_queued`).
CREATE UNIQUE INDEX orders_one_queued_per_buyer ON orders (user_id, product_id) WHERE status = 'queued';
-- The queue in line order, for the promotion.
CREATE INDEX orders_queued_in_line ON orders (product_id, position) WHERE status = 'queued';

-- Promises units down a product's drawn queue, in line order, in the caller's transaction:
-- each queued order whose units are left moves to `pending_authorization` with an
-- `order.promoted` message (the stock worker authorizes it, without its buyer); the first
-- that does not fit stops the line while an order holding units may still give them back,
-- and otherwise ends `sold_out` (with `order.rejected`), its units going on down the line.
-- Runs at the opening and whenever units may have come back (the triggers below), so every
-- path that gives units back or sells the last ones serves the queue in the same
-- transaction. SECURITY DEFINER: a service's give-back needs no rights on the queue.
CREATE OR REPLACE FUNCTION promote_queued(product text) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    p        products%ROWTYPE;
    q        record;
    promised integer := 0;
BEGIN
    SELECT * INTO p FROM products WHERE id = product FOR UPDATE;
    IF NOT FOUND OR p.opened_at IS NULL OR NOT p.queue_waiting THEN
        RETURN 0;
    END IF;
    FOR q IN SELECT o.id, o.user_id, o.quantity, o.amount_minor, o.currency, o.traceparent
               FROM orders o
              WHERE o.product_id = product AND o.status = 'queued'
              ORDER BY o.position
    LOOP
        IF p.units_total - p.units_promised >= q.quantity THEN
            BEGIN
                UPDATE orders SET status = 'pending_authorization', updated_at = now()
                 WHERE id = q.id AND status = 'queued';
                INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, destination, payload, traceparent)
                VALUES (gen_random_uuid(), 'order', q.id, 'order.promoted', 'stock-check',
                        jsonb_build_object('order_id', q.id, 'product_id', product, 'quantity', q.quantity),
                        q.traceparent)
                ON CONFLICT ON CONSTRAINT outbox_one_per_event DO NOTHING;
                p.units_promised := p.units_promised + q.quantity;
                promised := promised + 1;
            EXCEPTION WHEN OTHERS THEN
                -- The database refuses this order's promise for good (a constraint, a
                -- trigger): it ends `sold_out` with `order_refused`, for a person, and the
                -- line goes on (SPEC §8.5). Refused that too, it stays queued, logged.
                BEGIN
                    UPDATE orders SET status = 'sold_out', failure_reason = 'order_refused', updated_at = now()
                     WHERE id = q.id AND status = 'queued';
                EXCEPTION WHEN OTHERS THEN
                    RAISE WARNING 'the queued order % is refused by the database: %', q.id, SQLERRM;
                END;
            END;
        ELSIF EXISTS (SELECT 1 FROM orders o WHERE o.product_id = product AND holds_units(o.status)) THEN
            EXIT;
        ELSE
            UPDATE orders SET status = 'sold_out', failure_reason = 'sold_out', updated_at = now()
             WHERE id = q.id AND status = 'queued';
            INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, destination, payload, traceparent)
            VALUES (gen_random_uuid(), 'order', q.id, 'order.rejected', 'notification',
                    jsonb_build_object('order_id', q.id, 'user_id', q.user_id, 'product_id', product,
                                       'quantity', q.quantity, 'amount', q.amount_minor, 'currency', q.currency,
                                       'status', 'sold_out', 'reason', 'sold_out'),
                    q.traceparent)
            ON CONFLICT ON CONSTRAINT outbox_one_per_event DO NOTHING;
        END IF;
    END LOOP;
    UPDATE products
       SET units_promised = p.units_promised,
           queue_waiting = EXISTS (SELECT 1 FROM orders o WHERE o.product_id = product AND o.status = 'queued'),
           updated_at = now()
     WHERE id = product;
    RETURN promised;
END
$$;

-- Opens a product whose opening has come, once: the compare-and-set on `opened_at` lets one
-- caller in, whatever the number of processes; the draw puts its queued orders in line
-- ahead of every later order, by a keyed hash of each order's id under `seed` (a uniform
-- random order, as the seed is), and the units are promised down the line. All in the
-- caller's transaction: a caller killed midway leaves the opening not begun. Returns the
-- number of queued orders drawn, NULL when the product is not to be opened now.
CREATE OR REPLACE FUNCTION open_product(product text, seed bytea) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    drawn integer;
BEGIN
    UPDATE products SET opened_at = now(), draw_seed = seed, updated_at = now()
     WHERE id = product AND opened_at IS NULL AND opens_at <= now();
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    WITH line AS (
        SELECT o.id, row_number() OVER (ORDER BY sha256(seed || uuid_send(o.id)), o.id) AS place
          FROM orders o WHERE o.product_id = product AND o.status = 'queued'
    ), placed AS (
        UPDATE orders o SET position = p.last_position + line.place, updated_at = now()
          FROM line, products p
         WHERE o.id = line.id AND p.id = product
     RETURNING 1
    )
    SELECT count(*) INTO drawn FROM placed;
    UPDATE products SET last_position = last_position + drawn, queue_waiting = drawn > 0 WHERE id = product;
    PERFORM promote_queued(product);
    RETURN drawn;
END
$$;

-- Units came back to a product (a failed order's, a raise of the stock), or its last holder
-- was paid (no unit can come back): its queue is served in the same transaction.
CREATE OR REPLACE FUNCTION serve_the_queue() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM products WHERE id = NEW.product_id AND queue_waiting) THEN
        PERFORM promote_queued(NEW.product_id);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION serve_the_queue_of_product() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
BEGIN
    PERFORM promote_queued(NEW.id);
    RETURN NULL;
END
$$;

CREATE TRIGGER orders_units_freed AFTER UPDATE OF status ON orders
    FOR EACH ROW WHEN (holds_units(OLD.status) AND NOT holds_units(NEW.status))
    EXECUTE FUNCTION serve_the_queue();

CREATE TRIGGER products_units_back AFTER UPDATE OF units_promised, units_total ON products
    FOR EACH ROW WHEN (NEW.queue_waiting
                       AND NEW.units_total - NEW.units_promised > OLD.units_total - OLD.units_promised)
    EXECUTE FUNCTION serve_the_queue_of_product();

REVOKE ALL ON FUNCTION promote_queued(text), open_product(text, bytea) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION open_product(text, bytea) TO orderfleet_stock_worker;
-- The relay's stuck-order gauge counts a promoted order's wait from its opening, not from its
-- queue entry.
GRANT SELECT (queued_for) ON orders TO orderfleet_relay;
