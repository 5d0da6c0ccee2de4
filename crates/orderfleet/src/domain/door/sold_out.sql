WITH args AS (
    SELECT $1::text AS product_id, $2::text[] AS users, $3::text[] AS keys
), product AS (
    SELECT CASE WHEN p.queue_waiting THEN 0 ELSE p.units_total - p.units_promised END AS units_left,
           EXISTS (SELECT 1 FROM orders o WHERE o.product_id = p.id AND holds_units(o.status)) AS units_may_return,
           -- As the door's `seen` reads the opening: the seconds until the queue or the sale
           -- opens while the product is not open (NULL once it is), and whether its pre-queue
           -- is open now.
           CASE WHEN p.opens_at IS NULL OR p.opened_at IS NOT NULL THEN NULL
                WHEN now() < p.queue_opens_at THEN EXTRACT(EPOCH FROM p.queue_opens_at - now())::float8
                WHEN p.queue_opens_at IS NULL AND now() < p.opens_at THEN EXTRACT(EPOCH FROM p.opens_at - now())::float8
                WHEN now() >= p.opens_at THEN 0::float8 END AS opens_in,
           (p.opened_at IS NULL AND now() >= p.queue_opens_at AND now() < p.opens_at) IS TRUE AS queueing,
           p.paused_at IS NOT NULL AS paused
      FROM products p, args WHERE p.id = args.product_id
), asked AS (
    SELECT a.user_id, a.key, a.n
      FROM args, unnest(args.users, args.keys) WITH ORDINALITY AS a(user_id, key, n)
)
SELECT asked.n AS "n!",
       EXISTS (SELECT 1 FROM orders o WHERE o.user_id = asked.user_id AND o.idempotency_key = asked.key) AS "key_used!",
       product.units_left AS "units_left?",
       product.units_may_return AS "units_may_return?",
       product.opens_in,
       product.queueing AS "queueing?",
       product.paused AS "paused?"
  FROM asked LEFT JOIN product ON true
