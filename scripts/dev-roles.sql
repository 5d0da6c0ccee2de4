-- Development and test clusters only: the service roles (migration 0010 grants their rights)
-- made able to log in, each with its own name as its password — throwaway credentials, like
-- the `orderfleet` owner's, for a cluster that listens on loopback alone. Safe to repeat.
-- scripts/postgres.sh runs this; the test harness connects each binary as its role.
-- Production gives these roles real logins instead: docs/security.md.
DO $$
DECLARE
    service text;
BEGIN
    FOREACH service IN ARRAY ARRAY['orderfleet_intake', 'orderfleet_relay', 'orderfleet_stock_worker',
                                   'orderfleet_notification_worker', 'orderfleet_operator'] LOOP
        IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = service) THEN
            EXECUTE format('CREATE ROLE %I', service);
        END IF;
        EXECUTE format('ALTER ROLE %I LOGIN PASSWORD %L', service, service);
    END LOOP;
END
$$;
