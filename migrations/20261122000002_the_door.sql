-- The door (SPEC §1.1, §8.7–8): the intake promises an order its units before any payment
-- call, and gives it its place in line; the stock worker reserves in line order.
--
-- A product now counts its units three ways:
-- - `units_total`: what `fleetctl product upsert --stock` says is for sale, sold units included;
-- - `stock`: units not yet taken by an order (reserved or sold), `units_total` minus taken. The
--   stock worker takes from it with `stock >= q` (never below zero, the CHECK behind it), and
--   it stays the authoritative guard against overselling;
-- - `units_promised`: units promised at the door to orders that have not failed (pending,
--   authorized, reserved or paid). The door promises only while `units_promised + q <=
--   units_total`; a decline, a rejection or a failed capture gives the units back. It exceeds
--   `units_total` only after an operator cut the stock below it, until the orders last in line
--   are rejected.
-- `last_position` numbers the line: each promise takes the next position.

ALTER TABLE products
    ADD COLUMN units_total    integer,
    ADD COLUMN units_promised integer NOT NULL DEFAULT 0,
    ADD COLUMN last_position  bigint NOT NULL DEFAULT 0;

ALTER TABLE orders ADD COLUMN position bigint;

-- Existing rows: the line is the order of arrival, and every order that has not failed holds
-- its units.
UPDATE orders o SET position = line.n
  FROM (SELECT id, row_number() OVER (PARTITION BY product_id ORDER BY created_at, id) AS n FROM orders) line
 WHERE o.id = line.id;

UPDATE products p
   SET units_total = p.stock + COALESCE((SELECT sum(quantity) FROM orders o
                                          WHERE o.product_id = p.id AND o.status IN ('stock_reserved', 'paid')), 0),
       units_promised = COALESCE((SELECT sum(quantity) FROM orders o
                                   WHERE o.product_id = p.id
                                     AND o.status IN ('pending_authorization', 'authorized', 'stock_reserved', 'paid')), 0),
       last_position = COALESCE((SELECT max(position) FROM orders o WHERE o.product_id = p.id), 0);

ALTER TABLE products
    ALTER COLUMN units_total SET NOT NULL,
    ADD CONSTRAINT products_stock_within_total CHECK (units_total >= 0 AND stock <= units_total),
    ADD CONSTRAINT products_promised_not_negative CHECK (units_promised >= 0);

ALTER TABLE orders
    ALTER COLUMN position SET NOT NULL,
    ADD CONSTRAINT orders_position_positive CHECK (position >= 1),
    -- One place in line per order: two orders can never share a position.
    ADD CONSTRAINT orders_one_per_position UNIQUE (product_id, position);

-- The orders of a product still holding units that may come back: the stock worker sums the
-- ones ahead of an order in line, and a sold-out answer asks whether any exist (Retry-After).
CREATE INDEX orders_unsettled_in_line ON orders (product_id, position)
    WHERE status IN ('pending_authorization', 'authorized', 'stock_reserved');
