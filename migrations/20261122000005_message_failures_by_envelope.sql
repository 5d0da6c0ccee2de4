-- A message's recorded failures are keyed by its envelope's message_id, which it keeps through
-- a DLQ and a redrive: SQS gives a message moved back by StartMessageMoveTask a new message id,
-- and keyed by that id a message's history was lost after a second dead-lettering. A body that
-- is not an envelope keeps its SQS id as its key. `failures` counts every failure recorded for
-- the message, across redrives.
ALTER TABLE message_failures ADD COLUMN message_key text;
UPDATE message_failures SET message_key = sqs_message_id;
ALTER TABLE message_failures
    ALTER COLUMN message_key SET NOT NULL,
    ADD COLUMN failures integer NOT NULL DEFAULT 1 CHECK (failures >= 1),
    DROP CONSTRAINT message_failures_pkey,
    ADD PRIMARY KEY (queue, message_key);
