-- The failures of a batch's messages (`record_failures` in crates/orderfleet-runtime/src/consumer/settle.rs),
-- one row per message key, counted: the queue ($1), then one array per column, named by the
-- `f(...)` alias: the key, the SQS message id, its receive count, the outcome, the reason, and
-- how many times this batch saw it fail.
INSERT INTO message_failures (queue, message_key, sqs_message_id, receive_count, outcome, reason, failures)
    SELECT $1, k, id, n, o, r, t
      FROM UNNEST($2::text[], $3::text[], $4::int[], $5::text[], $6::text[], $7::int[]) AS f(k, id, n, o, r, t)
    ON CONFLICT (queue, message_key) DO UPDATE
       SET sqs_message_id = EXCLUDED.sqs_message_id, receive_count = EXCLUDED.receive_count,
           outcome = EXCLUDED.outcome, reason = EXCLUDED.reason,
           failures = message_failures.failures + EXCLUDED.failures, updated_at = now()
