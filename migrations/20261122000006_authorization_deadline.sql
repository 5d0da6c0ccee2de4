-- The deadline Stripe gives an authorization (latest_charge.payment_method_details.card
-- .capture_before, about 7 days for most cards): after it, the hold is gone and a capture is
-- refused. NULL for an order authorized before this column existed, or when Stripe gave none.
-- `fleetctl dlq stats` warns about a dead-lettered stock check whose hold ends within a day.
ALTER TABLE orders ADD COLUMN authorization_expires_at timestamptz;
