-- Orders declined before `decline_detail` existed kept the issuer's reason in failure_reason,
-- which GET /v1/orders/{id} returns: move it where only operators look.
UPDATE orders SET decline_detail = failure_reason, failure_reason = 'payment_declined'
 WHERE status = 'payment_declined' AND decline_detail IS NULL
   AND failure_reason IS DISTINCT FROM 'payment_declined';
