-- The statuses and the notification that payments as Stripe takes them need (issue 33, SPEC §5):
-- `requires_action` (the buyer's card needs 3-D Secure), `authorization_canceled` (the hold
-- expired or was cancelled outside the fleet before capture), `refunded` (refunded in full
-- outside the fleet), and the notification `order.refunded`.
--
-- A migration of their own: a value added to an enum cannot be used in the transaction that
-- adds it, and the next migration (`stripe_payments`) puts them in the named sets. Adding an
-- enum value takes no table lock and rewrites nothing; old code never meets the new values
-- until the new code writes them.

ALTER TYPE order_status ADD VALUE 'requires_action' AFTER 'pending_authorization';
ALTER TYPE order_status ADD VALUE 'authorization_canceled';
ALTER TYPE order_status ADD VALUE 'refunded';

ALTER TYPE outbox_event_type ADD VALUE 'order.refunded';
