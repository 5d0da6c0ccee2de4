-- A member's tick, written (`write` in crates/orderfleet-runtime/src/budget/ledger.rs), in the
-- tick's transaction under the budget's advisory lock:
--   args    the statement's arguments, by name
--   me      this member's row: its demand, its share and lease, and, when its share went down
--           (`lowered`), the larger share it gave up, held a window from now, at this tick
--   cut     the endpoints whose limit a 429 halved, with their new factors
--   ledger  the ledger's next tick and round
-- Then the rows of members gone (past their lease and window) are deleted.
WITH args AS (
    SELECT $1::uuid        AS member,
           $2::text        AS process,
           $3::jsonb       AS demand,
           $4::jsonb       AS share,
           $5::jsonb       AS held,
           $6::bool        AS lowered,
           $7::int8        AS window_ms,
           $8::int8        AS tick,
           $9::int8        AS lease_ms,
           $10::text[]     AS cut_endpoints,
           $11::float8[]   AS cut_factors,
           $12::int8       AS round,
           $13::int8       AS round_ms,
           $14::uuid[]     AS gone
), me AS (
    INSERT INTO stripe_budget_members AS m
           (member, process, demand, share, held, held_until, held_tick, expires_at, renewed_tick)
    SELECT member, process, demand, share, held,
           clock_timestamp() + CASE WHEN lowered THEN window_ms ELSE 0 END * interval '1 ms', tick,
           clock_timestamp() + lease_ms * interval '1 ms', tick
      FROM args
    ON CONFLICT (member) DO UPDATE
        SET demand = excluded.demand, share = excluded.share, held = excluded.held,
            held_until = CASE WHEN (SELECT lowered FROM args) THEN excluded.held_until ELSE m.held_until END,
            held_tick = CASE WHEN (SELECT lowered FROM args) THEN excluded.held_tick ELSE m.held_tick END,
            expires_at = excluded.expires_at, renewed_tick = excluded.renewed_tick,
            updated_at = clock_timestamp()
    RETURNING 1
), cut AS (
    INSERT INTO stripe_budget_slowdowns (endpoint, factor, cut_at)
    SELECT c.endpoint, c.factor, clock_timestamp()
      FROM args, unnest(args.cut_endpoints, args.cut_factors) AS c(endpoint, factor)
    ON CONFLICT (endpoint) DO UPDATE SET factor = excluded.factor, cut_at = excluded.cut_at
    RETURNING 1
), ledger AS (
    INSERT INTO stripe_budget_ledger AS l (tick, round, round_ms)
    SELECT tick, round, round_ms FROM args
    ON CONFLICT (singleton) DO UPDATE
        SET tick = excluded.tick, round = excluded.round, round_ms = excluded.round_ms
    RETURNING 1
)
DELETE FROM stripe_budget_members gone USING args WHERE gone.member = ANY(args.gone)
