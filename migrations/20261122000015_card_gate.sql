-- The card-testing gate of the door (issue 19), in the door's one statement: the buyer's own
-- lock, then their count of the last hour's declines and of their orders still waiting for an
-- authorization (each may be one more decline). VOLATILE, so the count is a query of its own
-- with a snapshot taken after the lock was granted: it sees every order committed by the
-- buyer's requests before this one, whichever intake took them. The lock is a transaction
-- lock: it lasts until the door's statement commits, so the buyer's next request counts this
-- one. One round trip, the hot product row held by the one statement alone.
CREATE FUNCTION card_attempts(buyer text) RETURNS bigint
    LANGUAGE plpgsql VOLATILE STRICT COST 1000
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('cards/' || buyer, 0));
    RETURN (SELECT count(*) FROM orders
             WHERE user_id = buyer
               AND (status = 'pending_authorization'
                    OR (status = 'payment_declined' AND updated_at > now() - interval '1 hour')));
END
$$;

REVOKE EXECUTE ON FUNCTION card_attempts(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION card_attempts(text) TO orderfleet_intake;
