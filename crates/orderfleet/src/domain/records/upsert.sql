-- A product's upsert (`upsert` in crates/orderfleet/src/domain/records/product.rs), in the upsert's
-- transaction, the product row locked and the line read already:
--   args  the statement's arguments, by name; `least` is the fewest units the total may be:
--         those of every order up to the last place in line that took its units
-- A new product starts with its whole total in stock. An existing one takes the new name,
-- price, currency, caps and total, and its opening's times when given (kept when not), its stock moved by the total's change, unless the total
-- falls below the units taken (reserved or sold) or below `least`: then nothing is written and
-- no row comes back.
WITH args AS (
    SELECT $1::text  AS id,
           $2::text  AS name,
           $3::int8  AS price_minor,
           $4::text  AS currency,
           $5::int4  AS units_total,
           $6::int4  AS max_per_buyer,
           $7::int4  AS least,
           $8::timestamptz AS opens_at,
           $9::timestamptz AS queue_opens_at,
           $10::int4 AS max_per_card
)
INSERT INTO products (id, name, price_minor, currency, units_total, stock, max_per_buyer, opens_at, queue_opens_at,
                      max_per_card)
SELECT id, name, price_minor, currency, units_total, units_total, max_per_buyer, opens_at, queue_opens_at,
       max_per_card FROM args
ON CONFLICT (id) DO UPDATE
   SET name = EXCLUDED.name, price_minor = EXCLUDED.price_minor, currency = EXCLUDED.currency,
       stock = products.stock + (EXCLUDED.units_total - products.units_total),
       units_total = EXCLUDED.units_total, max_per_buyer = EXCLUDED.max_per_buyer,
       max_per_card = EXCLUDED.max_per_card,
       opens_at = COALESCE(EXCLUDED.opens_at, products.opens_at),
       queue_opens_at = COALESCE(EXCLUDED.queue_opens_at, products.queue_opens_at),
       updated_at = now()
 WHERE products.units_total - products.stock <= EXCLUDED.units_total
   AND (SELECT least FROM args) <= EXCLUDED.units_total
RETURNING units_total AS total, units_total - stock AS "taken!", units_promised AS promised
