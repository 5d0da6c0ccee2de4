-- What the card issuer said of a decline (Stripe's decline code and message), for operators
-- only: logs and this column. The buyer's answer and `GET /v1/orders/{id}` say only
-- `payment_declined`, so the intake is no oracle for a card tester.
ALTER TABLE orders ADD COLUMN decline_detail text;
