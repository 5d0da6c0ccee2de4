-- When the sweeper last tried an order it could not settle (blocked on a dependency, or stuck
-- for a person). It takes the orders it has not tried yet first, then the ones it tried
-- longest ago, so a few hundred orders blocked for good cannot starve a newer one.
ALTER TABLE orders ADD COLUMN swept_at timestamptz;
