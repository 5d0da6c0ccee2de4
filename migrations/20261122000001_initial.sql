-- The schema of the order pipeline: products and their stock, orders under idempotency keys,
-- the transactional outbox (and its archive), and the consumers' inbox of processed messages.

-- SPEC §5. Every change of status is a compare-and-set on the expected status, so the type
-- only lists the states; the transitions live in the code that writes them.
CREATE TYPE order_status AS ENUM (
    'pending_authorization',
    'authorized',
    'stock_reserved',
    'paid',
    'rejected_out_of_stock',
    'payment_declined',
    'capture_failed'
);

CREATE TABLE products (
    id          text PRIMARY KEY CHECK (id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$'),
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    price_minor bigint NOT NULL CHECK (price_minor > 0),
    currency    text NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    -- Units still for sale. The stock worker reserves with
    -- `UPDATE … SET stock = stock - q WHERE stock >= q`; the CHECK is the last line of defence.
    stock       integer NOT NULL CHECK (stock >= 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE orders (
    id                uuid PRIMARY KEY,
    user_id           text NOT NULL CHECK (length(user_id) BETWEEN 1 AND 255),
    idempotency_key   text NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    -- SHA-256 of the canonical request body: the same key with another body is refused.
    request_hash      bytea NOT NULL,
    product_id        text NOT NULL REFERENCES products (id),
    quantity          integer NOT NULL CHECK (quantity BETWEEN 1 AND 10),
    amount_minor      bigint NOT NULL CHECK (amount_minor > 0),
    currency          text NOT NULL,
    payment_method    text NOT NULL,
    status            order_status NOT NULL DEFAULT 'pending_authorization',
    payment_intent_id text,
    failure_reason    text,
    -- While an intake request works on a `pending_authorization` order it holds this lease;
    -- a second request with the same key meanwhile answers 409. An expired or released lease
    -- lets a retry (or the sweeper) take the order over.
    intake_lease_until timestamptz,
    -- When the authorization hold was released (the PaymentIntent cancelled) for an order
    -- that will not be captured: a redelivered message finds it set and does nothing more.
    authorization_released_at timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT orders_one_per_idempotency_key UNIQUE (user_id, idempotency_key)
);

-- The sweeper looks for orders stuck in a non-terminal status.
CREATE INDEX orders_unfinished_by_age ON orders (updated_at)
    WHERE status IN ('pending_authorization', 'authorized', 'stock_reserved');

CREATE TYPE outbox_status AS ENUM ('pending', 'processing', 'sent', 'failed', 'dead');

CREATE TABLE outbox (
    id                uuid PRIMARY KEY,
    aggregate_type    text NOT NULL,
    aggregate_id      text NOT NULL,
    event_type        text NOT NULL,
    -- A logical destination ('stock-check' or 'notification'); the relay maps it to a queue
    -- URL from its configuration, so rows survive a change of environment.
    destination       text NOT NULL,
    payload           jsonb NOT NULL,
    status            outbox_status NOT NULL DEFAULT 'pending',
    retry_count       integer NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    last_error_code   text,
    last_error_reason text,
    -- When the row is next due: for `pending` and `failed` rows the earliest next send, for
    -- `processing` rows the end of the relay's claim (a crashed relay's rows come due again).
    next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    sent_at           timestamptz,
    -- One message per (order, event, destination): a replayed transition cannot enqueue twice.
    CONSTRAINT outbox_one_per_event UNIQUE (aggregate_type, aggregate_id, event_type, destination)
);

-- The relay's claim query: due rows in due order, among the few that are not finished.
CREATE INDEX outbox_due ON outbox (next_attempt_at)
    WHERE status IN ('pending', 'processing', 'failed');
-- Operators list dead rows; the retention job walks sent rows by age.
CREATE INDEX outbox_dead ON outbox (updated_at) WHERE status = 'dead';
CREATE INDEX outbox_sent_by_age ON outbox (sent_at) WHERE status = 'sent';

-- Wake the relay when rows commit: NOTIFY is delivered at commit, never for a rolled-back
-- insert, once per statement rather than once per row.
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox_inserted', '');
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_inserted AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- Sent rows past the retention age move here (or are deleted, by configuration).
CREATE TABLE outbox_archive (
    id                uuid PRIMARY KEY,
    aggregate_type    text NOT NULL,
    aggregate_id      text NOT NULL,
    event_type        text NOT NULL,
    destination       text NOT NULL,
    payload           jsonb NOT NULL,
    status            outbox_status NOT NULL,
    retry_count       integer NOT NULL,
    last_error_code   text,
    last_error_reason text,
    created_at        timestamptz NOT NULL,
    sent_at           timestamptz,
    archived_at       timestamptz NOT NULL DEFAULT now()
);

-- Message ids a consumer has taken on: with at-least-once delivery, the inbox turns a
-- redelivered or redriven message into a no-op. A consumer claims an id (a short lease) before
-- its side effect, so two copies handled at once cannot both act, and marks it processed after.
CREATE TABLE inbox (
    consumer      text NOT NULL,
    message_id    uuid NOT NULL,
    claimed_until timestamptz NOT NULL,
    processed_at  timestamptz,
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX inbox_processed_by_age ON inbox (processed_at) WHERE processed_at IS NOT NULL;

-- The last failure a worker saw for each SQS message it could not finish, so an operator
-- looking at a dead letter (`fleetctl dlq peek`) sees why it is there. Keyed by SQS's message
-- id, which a message keeps when it moves to its DLQ and back.
CREATE TABLE message_failures (
    queue          text NOT NULL,
    sqs_message_id text NOT NULL,
    receive_count  integer NOT NULL,
    outcome        text NOT NULL,
    reason         text NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, sqs_message_id)
);

CREATE INDEX message_failures_by_age ON message_failures (updated_at);
