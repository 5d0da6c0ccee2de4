-- The door's ONE statement (`door` in crates/orderfleet/src/domain/door/mod.rs): it promises an
-- order its units and its place in line, or admits nobody and says why from the same snapshot.
--   args      the statement's arguments, by name
--   used      whether the buyer's idempotency key made an order already
--   seen      the product's units left (none while a drawn queue waits for them) and its cap
--             per buyer, as the snapshot shows them, and its opening: the seconds until it
--             (or its pre-queue) opens, when it is not open, and whether its pre-queue is
--             open now (`queueing`), and whether an operator paused it (`paused`)
--   promised  the product row, its units promised and its last place in line raised, if the
--             product is open and not paused, no drawn queue waits, the units fit, the rule lets the product through (`any_product`: capped or not),
--             the buyer is under the card gate (`gate` > 0: `card_attempts`, which takes the
--             buyer's lock until the statement commits), and the key is unused
--   admitted  the order, `pending_authorization`, at the product's new last place, held to the
--             product's cap per card (`card_cap`: a queued order is held to the one in force
--             when the line reaches it, the trigger `orders_card_cap_at_promotion`)
--   queued    in the pre-queue window instead: the order, `queued`, with no unit promised and
--             no place (the draw gives it one); one per buyer and product (the index
--             `orders_one_queued_per_buyer` refuses a second, `already_queued`)
-- Then one row: the order admitted (every column NULL if none), what was seen, and, when the
-- units did not fit, whether any may come back (an order that holds units may fail).
WITH args AS (
    SELECT $1::uuid       AS order_id,
           $2::text       AS user_id,
           $3::text       AS idempotency_key,
           $4::bytea      AS request_hash,
           $5::text       AS product_id,
           $6::int4       AS quantity,
           $7::text       AS payment_method,
           $8::int8       AS lease_ms,
           $9::text       AS traceparent,
           $10::bool      AS any_product,
           $11::int8      AS gate
), used AS (
    SELECT EXISTS (SELECT 1 FROM orders o, args
                    WHERE o.user_id = args.user_id AND o.idempotency_key = args.idempotency_key) AS used
), seen AS (
    SELECT CASE WHEN queue_waiting THEN 0 ELSE units_total - units_promised END AS units_left, max_per_buyer,
           CASE WHEN opens_at IS NULL OR opened_at IS NOT NULL THEN NULL
                WHEN now() < queue_opens_at THEN EXTRACT(EPOCH FROM queue_opens_at - now())::float8
                WHEN queue_opens_at IS NULL AND now() < opens_at THEN EXTRACT(EPOCH FROM opens_at - now())::float8
                WHEN now() >= opens_at THEN 0::float8 END AS opens_in,
           (opened_at IS NULL AND now() >= queue_opens_at AND now() < opens_at) IS TRUE AS queueing,
           paused_at IS NOT NULL AS paused
      FROM products, args WHERE id = args.product_id
), promised AS (
    UPDATE products SET units_promised = units_promised + args.quantity, last_position = last_position + 1
      FROM args
     WHERE id = args.product_id AND units_promised + args.quantity <= units_total
       AND (opens_at IS NULL OR opened_at IS NOT NULL) AND NOT queue_waiting AND paused_at IS NULL
       AND (max_per_buyer IS NULL OR args.any_product)
       AND CASE WHEN args.gate > 0 THEN card_attempts(args.user_id) < args.gate ELSE true END
       AND NOT (SELECT used FROM used)
 RETURNING id, price_minor, currency, last_position, max_per_card
), admitted AS (
    INSERT INTO orders (id, user_id, idempotency_key, request_hash, product_id, quantity,
                        amount_minor, currency, payment_method, intake_lease_until, position, traceparent,
                        card_cap)
    SELECT args.order_id, args.user_id, args.idempotency_key, args.request_hash, p.id, args.quantity,
           p.price_minor * args.quantity, p.currency, args.payment_method,
           now() + args.lease_ms * interval '1 ms', p.last_position, args.traceparent, p.max_per_card
      FROM promised p, args
    RETURNING *
), queued AS (
    INSERT INTO orders (id, user_id, idempotency_key, request_hash, product_id, quantity,
                        amount_minor, currency, payment_method, status, position, queued_for, traceparent)
    SELECT args.order_id, args.user_id, args.idempotency_key, args.request_hash, p.id, args.quantity,
           p.price_minor * args.quantity, p.currency, args.payment_method, 'queued', NULL, p.opens_at,
           args.traceparent
      FROM products p, args, seen
     WHERE p.id = args.product_id AND seen.queueing AND p.opened_at IS NULL AND p.paused_at IS NULL
       AND (p.max_per_buyer IS NULL OR args.any_product)
       AND NOT (SELECT used FROM used)
       -- The entry waits for an opening under way and re-reads the row after it: an entry
       -- made once the draw's snapshot was taken would be left out of the line.
       FOR SHARE OF p
    RETURNING *
)
SELECT a.id AS "id?: OrderId", a.user_id AS "user_id?: UserId", a.request_hash AS "request_hash?",
       a.product_id AS "product_id?: Sku", a.quantity AS "quantity?: Quantity",
       a.amount_minor AS "amount_minor?", a.currency AS "currency?: Currency",
       a.payment_method AS "payment_method?", a.status AS "status?: OrderStatus", a.position,
       a.payment_intent_id, a.failure_reason AS "failure_reason: crate::domain::words::status::FailureReason",
       a.authorization_released_at, a.traceparent,
       a.payment_attempt AS "payment_attempt?", a.payment_attempt_failed AS "payment_attempt_failed?",
       a.payment_attempt_at AS "payment_attempt_at?",
       a.client_secret, a.next_action, a.action_expires_at, a.intake_lease_until,
       a.created_at AS "created_at?", a.updated_at AS "updated_at?", a.queued_for,
       a.card_cap, a.card_fingerprint,
       (SELECT used FROM used) AS "key_used!",
       seen.units_left AS "units_left?", seen.max_per_buyer AS "max_per_buyer?",
       seen.opens_in, seen.queueing AS "queueing?", seen.paused AS "paused?",
       CASE WHEN a.id IS NULL AND seen.units_left < (SELECT quantity FROM args) THEN
           EXISTS (SELECT 1 FROM orders o, args
                    WHERE o.product_id = args.product_id AND holds_units(o.status)) END AS units_may_return
  FROM (SELECT) AS one LEFT JOIN seen ON true
  LEFT JOIN (SELECT * FROM admitted UNION ALL SELECT * FROM queued) a ON true
