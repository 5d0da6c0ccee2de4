-- One card's fair share (SPEC §2 `--max-per-card`, §4, §8.13): no card holds more units of a
-- product than its cap, the card known by Stripe's `card.fingerprint` of the order's payment
-- method, however many accounts use it.
--   products.max_per_card  the cap (NULL: none).
--   orders.card_cap        the cap the order is held to: its product's when the order was
--                          promised its units (at the door, or for a queued order when the line
--                          reached it: the trigger below). NULL: no cap, and no payment method
--                          is read for it.
--   orders.card_fingerprint  the card's fingerprint, written once the order fits under the cap,
--                          before any PaymentIntent is made for it; the orders that carry it are
--                          the ones the cap counts.
ALTER TABLE products ADD COLUMN max_per_card integer
    CHECK (max_per_card IS NULL OR max_per_card >= 1);
ALTER TABLE orders ADD COLUMN card_cap integer, ADD COLUMN card_fingerprint text;

-- The cap's count: a card's orders of one product.
CREATE INDEX orders_by_card ON orders (product_id, card_fingerprint) WHERE card_fingerprint IS NOT NULL;

-- A queued order is held to the cap in force when it is promised its units, whoever promises it
-- (the opening, a unit come back, a resume), not the one when it queued.
CREATE FUNCTION card_cap_at_promotion() RETURNS trigger
    LANGUAGE plpgsql SET search_path = public, pg_temp
AS $$
BEGIN
    NEW.card_cap := (SELECT max_per_card FROM products WHERE id = NEW.product_id);
    RETURN NEW;
END
$$;
CREATE TRIGGER orders_card_cap_at_promotion BEFORE UPDATE OF status ON orders
    FOR EACH ROW WHEN (OLD.status = 'queued' AND NEW.status = 'pending_authorization')
    EXECUTE FUNCTION card_cap_at_promotion();
-- Run only as the trigger (which needs no EXECUTE right when it fires).
REVOKE ALL ON FUNCTION card_cap_at_promotion() FROM PUBLIC;
