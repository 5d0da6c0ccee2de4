-- `Transition::apply` (crates/orderfleet/src/domain/records/order/transition.rs): ONE statement moves an order
-- from `from_status` to `to_status` if, and only if, it is still in `from_status`, with the
-- outbox messages the move causes.
--   args        the statement's arguments, by name
--   claim       the order row, locked (always before its product row)
--   taken       a move to `authorized` takes the order's units when nothing was cut: no more
--               units promised than the total, and the units in stock
--   moved       the order, to `stock_reserved` if `taken`, else to `to_status`
--   given_back  a move that ends the order gives its units back to the door, and from
--               `stock_reserved` to the stock too
--   enqueued    the messages; a stock check whose units were `taken` says what to capture
WITH args AS (
    SELECT $1::uuid                    AS order_id,
           $2::order_status            AS from_status,
           $3::order_status            AS to_status,
           $4::text                    AS failure_reason,
           $5::text                    AS payment_intent_id,
           $6::uuid[]                  AS message_ids,
           $7::outbox_event_type[]     AS event_types,
           $8::outbox_destination[]    AS destinations,
           $9::jsonb[]                 AS payloads,
           $10::timestamptz            AS capture_before,
           $11::text                   AS client_secret,
           $12::jsonb                  AS next_action,
           $13::timestamptz            AS action_expires_at,
           $14::boolean                AS gives_units_back,
           $15::text                   AS decline_detail,
           $16::boolean                AS hold_released
), claim AS (
    SELECT o.id, o.product_id, o.quantity
      FROM orders o, args a
     WHERE o.id = a.order_id AND o.status = a.from_status
       FOR UPDATE OF o
), taken AS (
    UPDATE products p SET stock = p.stock - c.quantity, updated_at = now()
      FROM claim c, args a
     WHERE a.to_status = 'authorized' AND p.id = c.product_id
       AND p.units_promised <= p.units_total AND p.stock >= c.quantity
 RETURNING p.id
), moved AS (
    UPDATE orders o
       SET status = CASE WHEN EXISTS (SELECT 1 FROM taken) THEN 'stock_reserved' ELSE a.to_status END,
           failure_reason = COALESCE(a.failure_reason, o.failure_reason),
           payment_intent_id = COALESCE(a.payment_intent_id, o.payment_intent_id),
           authorization_expires_at = COALESCE(a.capture_before, o.authorization_expires_at),
           client_secret = COALESCE(a.client_secret, o.client_secret),
           next_action = COALESCE(a.next_action, o.next_action),
           action_expires_at = COALESCE(a.action_expires_at, o.action_expires_at),
           decline_detail = COALESCE(a.decline_detail, o.decline_detail),
           authorization_released_at = CASE WHEN a.hold_released THEN now()
                                            ELSE o.authorization_released_at END,
           intake_lease_until = NULL, updated_at = now()
      FROM args a
     WHERE o.id IN (SELECT id FROM claim)
 RETURNING o.id, o.traceparent, o.product_id, o.quantity, o.payment_attempt, o.payment_intent_id
), given_back AS (
    UPDATE products p SET units_promised = p.units_promised - moved.quantity,
                          stock = p.stock + CASE WHEN a.from_status = 'stock_reserved'
                                                 THEN moved.quantity ELSE 0 END,
                          updated_at = now()
      FROM moved, args a
     WHERE a.gives_units_back AND p.id = moved.product_id
), enqueued AS (
    INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, destination, payload, traceparent)
    SELECT m.message_id, 'order', moved.id, m.event_type, m.destination,
           CASE WHEN m.event_type = 'order.stock_check_requested' AND EXISTS (SELECT 1 FROM taken)
                THEN m.payload || jsonb_build_object('reserved', jsonb_build_object(
                         'attempt', moved.payment_attempt, 'payment_intent_id', moved.payment_intent_id))
                ELSE m.payload END,
           moved.traceparent
      FROM moved, args a,
           UNNEST(a.message_ids, a.event_types, a.destinations, a.payloads)
           AS m(message_id, event_type, destination, payload)
    ON CONFLICT ON CONSTRAINT outbox_one_per_event DO NOTHING
)
SELECT count(*) AS "moved!" FROM moved
