-- `Transition::apply` (crates/orderfleet/src/domain/order.rs): ONE statement moves an order
-- from $2 to $3 if, and only if, it is still in $2, with the outbox messages the move causes.
--   claim       the order row, locked (always before its product row)
--   taken       a move to `authorized` ($17) takes the order's units when nothing was cut:
--               no more units promised than the total, and the units in stock
--   moved       the order, to `stock_reserved` ($18) if `taken`, else to $3
--   given_back  a move that ends the order gives its units back to the door, and from
--               `stock_reserved` to the stock too
--   enqueued    the messages; a stock check whose units were `taken` ($19) says what to capture
WITH claim AS (
    SELECT id, product_id, quantity FROM orders WHERE id = $1 AND status = $2 FOR UPDATE
), taken AS (
    UPDATE products p SET stock = p.stock - c.quantity, updated_at = now()
      FROM claim c
     WHERE $3::order_status = $17::order_status AND p.id = c.product_id
       AND p.units_promised <= p.units_total AND p.stock >= c.quantity
 RETURNING p.id
), moved AS (
    UPDATE orders SET status = CASE WHEN EXISTS (SELECT 1 FROM taken) THEN $18::order_status
                                    ELSE $3::order_status END,
                      failure_reason = COALESCE($4, failure_reason),
                      payment_intent_id = COALESCE($5, payment_intent_id),
                      authorization_expires_at = COALESCE($10, authorization_expires_at),
                      client_secret = COALESCE($11, client_secret),
                      next_action = COALESCE($12, next_action),
                      action_expires_at = COALESCE($13, action_expires_at),
                      decline_detail = COALESCE($15, decline_detail),
                      authorization_released_at = CASE WHEN $16 THEN now()
                                                       ELSE authorization_released_at END,
                      intake_lease_until = NULL, updated_at = now()
     WHERE id IN (SELECT id FROM claim)
 RETURNING id, traceparent, product_id, quantity, payment_attempt, payment_intent_id
), given_back AS (
    UPDATE products p SET units_promised = p.units_promised - moved.quantity,
                          stock = p.stock + CASE WHEN $2::order_status = $18::order_status
                                                 THEN moved.quantity ELSE 0 END,
                          updated_at = now()
      FROM moved WHERE $14 AND p.id = moved.product_id
), enqueued AS (
    INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, destination, payload, traceparent)
    SELECT m.message_id, 'order', moved.id, m.event_type, m.destination,
           CASE WHEN m.event_type = $19 AND EXISTS (SELECT 1 FROM taken)
                THEN m.payload || jsonb_build_object('reserved', jsonb_build_object(
                         'attempt', moved.payment_attempt, 'payment_intent_id', moved.payment_intent_id))
                ELSE m.payload END,
           moved.traceparent
      FROM moved, UNNEST($6::uuid[], $7::outbox_event_type[], $8::outbox_destination[], $9::jsonb[])
           AS m(message_id, event_type, destination, payload)
    ON CONFLICT ON CONSTRAINT outbox_one_per_event DO NOTHING
)
SELECT count(*) AS "moved!" FROM moved
