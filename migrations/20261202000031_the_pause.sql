-- The pause (SPEC §1.8; `fleetctl product pause|resume`): an operator's stop of one product's
-- sale, at once, with the fleet running.
--   paused_at   when the running pause began (NULL: not paused). While it is set the door
--               promises nothing and takes no queue entry (`sale_paused`), the queue is not
--               served, and an opening that falls due waits; orders holding units go on.
ALTER TABLE products ADD COLUMN paused_at timestamptz;

-- Each pause and its resume, with their times, for `drop status` and the audit.
CREATE TABLE product_pauses (
    product_id  text NOT NULL REFERENCES products (id),
    paused_at   timestamptz NOT NULL,
    resumed_at  timestamptz,
    PRIMARY KEY (product_id, paused_at),
    CONSTRAINT product_pauses_resumed_after CHECK (resumed_at IS NULL OR resumed_at >= paused_at)
);
-- One running pause a product.
CREATE UNIQUE INDEX product_pauses_one_running ON product_pauses (product_id) WHERE resumed_at IS NULL;

REVOKE ALL ON product_pauses FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE ON product_pauses TO orderfleet_operator;

-- When a queued order was promised its units (at the opening, at a resume, or when a unit came
-- back): its wait for its authorization counts from then, for the relay's stuck-orders gauge and
-- `drop status`, however long it queued or the product stayed paused.
ALTER TABLE orders ADD COLUMN promoted_at timestamptz;
REVOKE SELECT (queued_for) ON orders FROM orderfleet_relay;
GRANT SELECT (promoted_at) ON orders TO orderfleet_relay;

-- The queue is not served while the product is paused: the units that come back wait for the
-- resume, which serves it (the trigger below).
CREATE OR REPLACE FUNCTION promote_queued(product text) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    p        products%ROWTYPE;
    q        record;
    promised integer := 0;
    ended    integer := 0;
BEGIN
    SELECT * INTO p FROM products WHERE id = product FOR UPDATE;
    IF NOT FOUND OR p.opened_at IS NULL OR NOT p.queue_waiting OR p.paused_at IS NOT NULL THEN
        RETURN 0;
    END IF;
    FOR q IN SELECT o.id, o.user_id, o.quantity, o.amount_minor, o.currency, o.traceparent
               FROM orders o
              WHERE o.product_id = product AND o.status = 'queued'
              ORDER BY o.position
    LOOP
        IF p.units_total - p.units_promised >= q.quantity THEN
            BEGIN
                UPDATE orders SET status = 'pending_authorization', promoted_at = now(), updated_at = now()
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
        ELSIF ended >= 500 THEN
            -- Ending a long queue is work of its own, never the transaction's that sold the
            -- last unit: 500 at a time, and the openers, woken, end the rest (`open_due`), each
            -- 500 in a transaction of its own.
            PERFORM pg_notify('orderfleet_openings', product);
            EXIT;
        ELSE
            ended := ended + 1;
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

-- The stock workers' openers end what is left of a queue no unit can reach any more, 500 at a
-- time (`end_the_queues` in crates/orderfleet/src/domain/records/product.rs).
GRANT EXECUTE ON FUNCTION promote_queued(text) TO orderfleet_stock_worker;

-- A paused product does not open: its opening waits for the resume (SPEC §8.12).
CREATE OR REPLACE FUNCTION open_product(product text, seed bytea) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    drawn integer;
BEGIN
    UPDATE products SET opened_at = now(), draw_seed = seed, updated_at = now()
     WHERE id = product AND opened_at IS NULL AND opens_at <= now() AND paused_at IS NULL;
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

-- The resume serves the queue in its own transaction: the units that came back while the
-- product was paused go down the line.
CREATE TRIGGER products_resumed AFTER UPDATE OF paused_at ON products
    FOR EACH ROW WHEN (OLD.paused_at IS NOT NULL AND NEW.paused_at IS NULL AND NEW.queue_waiting)
    EXECUTE FUNCTION serve_the_queue_of_product();

