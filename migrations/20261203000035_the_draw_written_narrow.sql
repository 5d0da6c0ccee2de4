-- The opening's draw, written narrow (SPEC §1.8, §8.12). The draw used to write every queued
-- order's place on the order itself: an UPDATE of 100,000 wide rows, each a new row version
-- with an entry in seven of the orders' indexes, 3.3 s on an idle 2-core machine (5-6 s on a
-- busy one; BENCHMARKS.md, the opening). It now writes each queued order's place here, one narrow
-- row with two index entries (0.6 s for 100,000), in the same one transaction. A queued order's
-- place moves onto the order when it leaves the queue (promised its units, or ended
-- `sold_out`), and its row here is deleted then: what is here is the queue still waiting, in
-- line.
CREATE TABLE queue_places (
    order_id   uuid PRIMARY KEY,
    product_id text NOT NULL,
    position   bigint NOT NULL,
    CONSTRAINT queue_places_one_per_position UNIQUE (product_id, position)
);
REVOKE ALL ON queue_places FROM PUBLIC;
-- The intake reads a queued order's place (`GET /v1/orders/{id}`); the draw and the promotions
-- write here as the functions' owner.
GRANT SELECT ON queue_places TO orderfleet_intake;

-- First, the lock: the index's drop holds the orders table until this migration commits, so an
-- opening the version before this one is drawing (its places on the orders) ends before the
-- copy below, and none begins until the functions below replace its own.
DROP INDEX orders_queued_in_line;

-- A queue drawn by the version before this one: its places are on its orders, and stay there;
-- each is copied here, where the promotions now read the line.
INSERT INTO queue_places (order_id, product_id, position)
SELECT id, product_id, position FROM orders WHERE status = 'queued' AND position IS NOT NULL;

CREATE OR REPLACE FUNCTION promote_queued(product text) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
AS $$
DECLARE
    p        products%ROWTYPE;
    place    record;
    q        record;
    promised integer := 0;
    ended    integer := 0;
BEGIN
    -- Nothing to do, read without the product's lock: no unit left while an order still holds
    -- some (a capture's move runs this, as every move that ends a hold does). A unit given back
    -- meanwhile is served by the move that gives it back, which runs this after it.
    IF EXISTS (SELECT 1 FROM products pr
                WHERE pr.id = product AND pr.units_total - pr.units_promised <= 0)
       AND EXISTS (SELECT 1 FROM orders o WHERE o.product_id = product AND holds_units(o.status)) THEN
        RETURN 0;
    END IF;
    SELECT * INTO p FROM products WHERE id = product FOR UPDATE;
    IF NOT FOUND OR p.opened_at IS NULL OR NOT p.queue_waiting OR p.paused_at IS NOT NULL THEN
        RETURN 0;
    END IF;
    -- The line: the places in order, through their index, each order read by its key.
    FOR place IN SELECT qp.order_id, qp.position FROM queue_places qp
                  WHERE qp.product_id = product ORDER BY qp.position
    LOOP
        SELECT o.id, o.user_id, o.quantity, o.amount_minor, o.currency, o.traceparent, place.position AS position
          INTO q FROM orders o WHERE o.id = place.order_id AND o.status = 'queued';
        CONTINUE WHEN NOT FOUND;
        IF p.units_total - p.units_promised >= q.quantity THEN
            BEGIN
                UPDATE orders SET status = 'pending_authorization', position = q.position,
                                  promoted_at = now(), updated_at = now()
                 WHERE id = q.id AND status = 'queued';
                DELETE FROM queue_places WHERE order_id = q.id;
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
                    UPDATE orders SET status = 'sold_out', failure_reason = 'order_refused', position = q.position,
                                      updated_at = now()
                     WHERE id = q.id AND status = 'queued';
                    DELETE FROM queue_places WHERE order_id = q.id;
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
            UPDATE orders SET status = 'sold_out', failure_reason = 'sold_out', position = q.position,
                              updated_at = now()
             WHERE id = q.id AND status = 'queued';
            DELETE FROM queue_places WHERE order_id = q.id;
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
           queue_waiting = EXISTS (SELECT 1 FROM queue_places qp WHERE qp.product_id = product),
           updated_at = now()
     WHERE id = product;
    RETURN promised;
END
$$;

-- The draw: each queued order's place, in the order of the keyed hash of its id under the
-- seed, written here after every place the product gave before (`last_position`), which moves
-- past them: every order made after the opening comes after the queue.
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
    INSERT INTO queue_places (order_id, product_id, position)
    SELECT o.id, product,
           p.last_position + row_number() OVER (ORDER BY sha256(seed || uuid_send(o.id)), o.id)
      FROM orders o, products p
     WHERE o.product_id = product AND o.status = 'queued' AND p.id = product;
    GET DIAGNOSTICS drawn = ROW_COUNT;
    UPDATE products SET last_position = last_position + drawn, queue_waiting = drawn > 0 WHERE id = product;
    PERFORM promote_queued(product);
    RETURN drawn;
END
$$;
