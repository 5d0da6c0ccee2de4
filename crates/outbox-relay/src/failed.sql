-- The rows SQS did not take (`record` in crates/outbox-relay/src/rows.rs), in one statement:
-- one array per column, named by the `u(...)` alias; a row is updated only while it is still
-- this relay's claim (`processing`, claimed until `claimed_until`).
UPDATE outbox o
      SET status = u.status::outbox_status, retry_count = u.retry_count,
          last_error_code = u.code, last_error_reason = u.reason,
          next_attempt_at = now() + u.delay_ms * interval '1 ms', updated_at = now()
     FROM UNNEST($1::uuid[], $2::text[], $3::int[], $4::text[], $5::text[], $6::bigint[], $7::timestamptz[])
       AS u(id, status, retry_count, code, reason, delay_ms, claimed_until)
    WHERE o.id = u.id AND o.status = 'processing' AND o.next_attempt_at = u.claimed_until
