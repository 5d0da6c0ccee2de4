-- The card cap (SPEC §8.13) counts "every order that holds or has bought units", those promised
-- before the cap was set too. orders.card_cap now says whether an order is checked (its
-- product had a cap when it was promised its units); the check counts against the product's
-- cap as it stands then. The first check after a cap is set reads the cards of the product's
-- orders that have none (card_cap and card_fingerprint NULL) and hold or bought units, once
-- each: this index finds them, and finds nothing for a product capped from the start.
CREATE INDEX orders_uncounted_by_card ON orders (product_id) WHERE card_cap IS NULL AND card_fingerprint IS NULL;
