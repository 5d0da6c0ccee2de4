-- Trace context (orderfleet::trace): the W3C traceparent of the request that made an order,
-- kept on the order and on every outbox row it causes, so that the relay can send it as an
-- SQS message attribute and every process's log lines about the order carry its trace id.
-- NULL for rows written before this migration: their log lines carry their order_id, no trace_id.
-- Adding a nullable column with no default rewrites nothing; the service roles' table-level
-- grants (0010) cover the new columns.
ALTER TABLE orders ADD COLUMN traceparent text;
ALTER TABLE outbox ADD COLUMN traceparent text;
ALTER TABLE outbox_archive ADD COLUMN traceparent text;
