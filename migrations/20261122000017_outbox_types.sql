-- The outbox's event types and destinations are the database's own enums, like order_status,
-- and an outbox row names its order by the order's id (a uuid), not by text. A row the relay
-- could never send (an unknown event type or destination, an aggregate id that is not an id)
-- can no longer be written: the insert fails in the transaction that would have written it,
-- beside the order change it was part of, instead of going dead in the relay later. (A uuid
-- that names no order is still accepted: there is no foreign key to orders. A consumer
-- dead-letters such a message as unknown_order.)
--
-- The values are those of orderfleet::domain::outbox::EventType and Destination. Adding an event
-- type is `ALTER TYPE outbox_event_type ADD VALUE …` in a migration of its own, before the
-- code that writes it is deployed.
--
-- Changing a column's type rewrites the table under an ACCESS EXCLUSIVE lock, for a time
-- proportional to its rows: the outbox keeps sent rows for OUTBOX_RETENTION_HOURS (a week by
-- default), so on a busy deployment run this migration between drops, when intake can wait
-- for it (docs/operations.md). Column-level grants (0010) stay with their columns.

CREATE TYPE outbox_event_type AS ENUM (
    'order.stock_check_requested', 'order.accepted', 'order.paid', 'order.rejected'
);
CREATE TYPE outbox_destination AS ENUM ('stock-check', 'notification');

ALTER TABLE outbox
    ALTER COLUMN aggregate_id TYPE uuid USING aggregate_id::uuid,
    ALTER COLUMN event_type TYPE outbox_event_type USING event_type::outbox_event_type,
    ALTER COLUMN destination TYPE outbox_destination USING destination::outbox_destination;

ALTER TABLE outbox_archive
    ALTER COLUMN aggregate_id TYPE uuid USING aggregate_id::uuid,
    ALTER COLUMN event_type TYPE outbox_event_type USING event_type::outbox_event_type,
    ALTER COLUMN destination TYPE outbox_destination USING destination::outbox_destination;
