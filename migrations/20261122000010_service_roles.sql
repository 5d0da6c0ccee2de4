-- One database role per service, each with only the table rights its code uses (issue 11):
-- a compromised or buggy process can do no more than its job. The tables belong to the role
-- that runs the migrations (the owner); no service connects as it. docs/security.md says how
-- each role gets a login in production (a password or RDS IAM authentication).
--
-- Roles belong to the whole server, grants to one database. The roles are made here when
-- missing (NOLOGIN: a login is an operator's decision); a migrating role without CREATEROLE
-- needs them made beforehand. Two databases of one server migrated at once may both try to
-- make a role; the loser finds it made.
DO $$
DECLARE
    service text;
BEGIN
    FOREACH service IN ARRAY ARRAY['orderfleet_intake', 'orderfleet_relay', 'orderfleet_stock_worker',
                                   'orderfleet_notification_worker', 'orderfleet_operator'] LOOP
        CONTINUE WHEN EXISTS (SELECT FROM pg_roles WHERE rolname = service);
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', service);
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN
                NULL;
            WHEN insufficient_privilege THEN
                RAISE EXCEPTION 'role % does not exist, and the migrating role may not create it', service
                    USING HINT = 'create the service roles first (docs/security.md), or migrate as a role with CREATEROLE';
        END;
    END LOOP;
END
$$;

-- Nothing for anyone but what follows: not PUBLIC (tables grant it nothing; this says so), and
-- not a service role that held more before (this file is the whole of their rights).
REVOKE ALL ON products, orders, outbox, outbox_archive, inbox, message_failures
    FROM PUBLIC, orderfleet_intake, orderfleet_relay, orderfleet_stock_worker,
         orderfleet_notification_worker, orderfleet_operator;
-- No one creates in the schema (PostgreSQL 15 and later already refuse PUBLIC; before 15 this
-- takes effect only when the migrating role owns the schema, and otherwise warns).
REVOKE CREATE ON SCHEMA public FROM PUBLIC;

-- `INSERT … ON CONFLICT` reads the conflict target's columns, so a role that only writes a
-- table still needs SELECT on those columns: granted on them alone.

-- order-intake: the door promises units (products), writes and reads orders under their
-- idempotency keys, and writes each order's outbox rows in the same transaction.
-- On products only the door's counters: a compromised intake cannot reprice or restock.
GRANT SELECT, UPDATE (units_promised, last_position) ON products TO orderfleet_intake;
GRANT SELECT, INSERT, UPDATE ON orders TO orderfleet_intake;
GRANT INSERT, SELECT (aggregate_type, aggregate_id, event_type, destination) ON outbox TO orderfleet_intake;

-- outbox-relay: claims and marks outbox rows, and its retention job archives or deletes them
-- and purges old inbox records and message failures.
GRANT SELECT, UPDATE, DELETE ON outbox TO orderfleet_relay;
GRANT INSERT, SELECT (id) ON outbox_archive TO orderfleet_relay;
GRANT SELECT, DELETE ON inbox, message_failures TO orderfleet_relay;

-- stock-worker (and its sweeper): reserves stock in line order, moves orders on, writes the
-- messages a move causes, and records why a message did not finish.
GRANT SELECT, UPDATE (stock, units_promised, updated_at) ON products TO orderfleet_stock_worker;
GRANT SELECT, UPDATE ON orders TO orderfleet_stock_worker;
GRANT INSERT, SELECT (aggregate_type, aggregate_id, event_type, destination) ON outbox TO orderfleet_stock_worker;
GRANT SELECT, INSERT, UPDATE ON message_failures TO orderfleet_stock_worker;

-- notification-worker: its inbox of published notifications and its failure records; it
-- never touches an order, a product or the outbox.
GRANT SELECT, INSERT, UPDATE ON inbox, message_failures TO orderfleet_notification_worker;

-- fleetctl (everything but `migrate`, which runs as the owner): product upsert, sweep,
-- `outbox dead|retry`, `dlq stats|peek`.
GRANT SELECT, INSERT, UPDATE ON products, outbox TO orderfleet_operator;
GRANT SELECT, UPDATE ON orders TO orderfleet_operator;
GRANT SELECT ON message_failures TO orderfleet_operator;
