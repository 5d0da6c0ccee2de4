-- A buyer reads a code, never the payment provider's words (issue 19): a refused capture's
-- `failure_reason` is `capture_failed`, and Stripe's message moves to the operators' column,
-- which now holds the provider's words for any failure, declines and refused captures alike.
COMMENT ON COLUMN orders.decline_detail IS
    'What the payment provider said of a decline or a refused capture: for operators only (logs and this column); buyers read failure_reason, a code';

UPDATE orders
   SET decline_detail = COALESCE(decline_detail, failure_reason), failure_reason = 'capture_failed'
 WHERE status = 'capture_failed' AND failure_reason IS DISTINCT FROM 'capture_failed';

-- The same words in the order.rejected messages not yet sent (pending, failed, dead and
-- waiting for an operator's retry): those would carry them to SNS. (Messages already on a queue or a DLQ keep
-- theirs: a migration cannot reach SQS.)
UPDATE outbox
   SET payload = jsonb_set(payload, '{reason}', '"capture_failed"')
 WHERE event_type = 'order.rejected' AND status <> 'sent'
   AND payload ->> 'status' = 'capture_failed'
   AND payload ->> 'reason' IS DISTINCT FROM 'capture_failed';
