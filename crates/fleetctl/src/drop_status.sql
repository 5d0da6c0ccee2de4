-- `fleetctl drop status` (`read` in crates/fleetctl/src/drop_status.rs): ONE statement for the
-- product's figures, reading nothing it locks: its row (units, opening, seed, pause), its orders
-- in one pass by status (how many, their units, the stuck among them, as the relay's gauge
-- counts them: the units sold and the stuck orders are sums of it), its pauses, the sold-out
-- answers of the last ten whole seconds (`door_answers`), the 429s of the last minute by
-- operation and code (`stripe_429s`), the shares the fleet's live budget members hold on each
-- operation, and its dead outbox rows.
WITH by_status AS (
    SELECT o.status, count(*) AS n, sum(o.quantity) AS units,
           count(*) FILTER (
               WHERE ((o.status = 'pending_authorization'
                       AND GREATEST(o.created_at, o.promoted_at) < now() - interval '1 minute')
                      OR (o.status = 'requires_action' AND o.action_expires_at < now() - interval '1 minute'))
                 AND (o.intake_lease_until IS NULL OR o.intake_lease_until < now())) AS stuck
      FROM orders o WHERE o.product_id = $1 GROUP BY o.status
)
SELECT p.units_total::int8 AS "total!", p.units_promised::int8 AS "promised!",
          p.opens_at, p.queue_opens_at, p.opened_at, p.draw_seed, p.paused_at, now() AS "now!",
          COALESCE((SELECT sum(b.units) FROM by_status b WHERE sold(b.status)), 0)::int8 AS "sold!",
          COALESCE((SELECT jsonb_object_agg(b.status::text, b.n) FROM by_status b), '{}')
              AS "by_status!: Json<BTreeMap<String, i64>>",
          COALESCE((SELECT jsonb_agg(jsonb_build_object('paused_at', x.paused_at, 'resumed_at', x.resumed_at)
                                     ORDER BY x.paused_at)
                      FROM product_pauses x WHERE x.product_id = p.id), '[]')
              AS "pauses!: Json<Vec<PauseRecord>>",
          COALESCE((SELECT sum(a.sold_out) FROM door_answers a
                     WHERE a.product_id = p.id AND a.second < date_trunc('second', now())
                       AND a.second >= date_trunc('second', now()) - interval '10 seconds'), 0)::int8
              AS "sold_out_10s!",
          COALESCE((SELECT jsonb_object_agg(e.key, e.n)
                      FROM (SELECT r.endpoint || ' ' || r.code AS key, count(*) AS n FROM stripe_429s r
                             WHERE r.at > now() - interval '1 minute' GROUP BY 1) e), '{}')
              AS "rate_limited!: Json<BTreeMap<String, i64>>",
          COALESCE((SELECT jsonb_object_agg(u.key, u.n)
                      FROM (SELECT s.key, sum(s.value::int8) AS n
                              FROM stripe_budget_members m, jsonb_each_text(m.share) s
                             WHERE m.expires_at > clock_timestamp() GROUP BY s.key) u), '{}')
              AS "in_use!: Json<BTreeMap<String, i64>>",
          COALESCE((SELECT sum(b.stuck) FROM by_status b), 0)::int8 AS "stuck!",
          (SELECT count(*) FROM outbox b JOIN orders o ON o.id = b.aggregate_id
            WHERE b.status = 'dead' AND o.product_id = p.id) AS "dead_rows!"
     FROM products p WHERE p.id = $1
