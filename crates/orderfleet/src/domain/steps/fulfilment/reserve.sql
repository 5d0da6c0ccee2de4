-- The reservation's decision (`record_reservation` in crates/orderfleet/src/domain/steps/fulfilment/reserve.rs),
-- ONE statement in the reservation's transaction, the order and product rows locked already:
--   args       the statement's arguments, by name
--   product    when the order `fits`, its units leave the stock; when it does not, its promised
--              units go back to the door
--   moved      the order, `stock_reserved` or `rejected_out_of_stock` with its failure reason
--   rejection  for a rejected order, its `order.rejected` message
-- Returns the status the order moved to.
WITH args AS (
    SELECT $1::uuid   AS order_id,
           $2::text   AS product_id,
           $3::bool   AS fits,
           $4::int4   AS quantity,
           $5::uuid   AS message_id,
           $6::jsonb  AS rejected,
           $7::text   AS failure_reason
), product AS (
    UPDATE products
       SET stock = stock - CASE WHEN args.fits THEN args.quantity ELSE 0 END,
           units_promised = units_promised - CASE WHEN args.fits THEN 0 ELSE args.quantity END,
           updated_at = now()
      FROM args
     WHERE id = args.product_id
), moved AS (
    UPDATE orders
       SET status = CASE WHEN args.fits THEN 'stock_reserved'::order_status
                         ELSE 'rejected_out_of_stock'::order_status END,
           failure_reason = CASE WHEN args.fits THEN orders.failure_reason ELSE args.failure_reason END,
           updated_at = now()
      FROM args
     WHERE id = args.order_id
 RETURNING orders.id, orders.status, orders.traceparent
), rejection AS (
    INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, destination, payload, traceparent)
    SELECT args.message_id, 'order', moved.id, 'order.rejected'::outbox_event_type,
           'notification'::outbox_destination, args.rejected, moved.traceparent
      FROM moved, args
     WHERE moved.status = 'rejected_out_of_stock'
    ON CONFLICT ON CONSTRAINT outbox_one_per_event DO NOTHING
)
SELECT status AS "status: OrderStatus" FROM moved
