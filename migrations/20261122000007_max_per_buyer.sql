-- "Limit N per customer": the most units one buyer may hold in a product's orders that have
-- not failed (pending, authorized, reserved or paid). NULL: no cap. `fleetctl product upsert
-- --max-per-buyer N` sets it; the door refuses an order that would go over it
-- (409 purchase_limit_reached), counting the buyer's orders under a per-buyer lock.
ALTER TABLE products ADD COLUMN max_per_buyer integer CHECK (max_per_buyer IS NULL OR max_per_buyer >= 1);

-- The door counts one buyer's units in one product.
CREATE INDEX orders_by_buyer ON orders (user_id, product_id);
