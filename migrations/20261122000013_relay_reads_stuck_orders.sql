-- The relay's gauges (outbox-relay/src/gauges.rs) count the orders stuck in
-- pending_authorization: nobody holds their lease and they are more than a minute old (an
-- intake died between authorizing and committing, or Stripe failed and the buyer never came
-- back). The sweeper resolves them within about two and a half minutes; the alarm on
-- OrdersPendingAuthorizationStuck pages when they stay. The relay reads only the columns the
-- count needs: nothing about the buyer, the amount or the card.
GRANT SELECT (status, intake_lease_until, created_at) ON orders TO orderfleet_relay;
