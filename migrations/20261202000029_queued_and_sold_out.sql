-- The opening's statuses and messages, in a file of their own: PostgreSQL lets a new enum
-- value be used only once the transaction that added it has committed.
--   queued           an order taken in a product's pre-queue: no unit, no PaymentIntent yet
--   sold_out         a queued order for which no unit was left (terminal; it never held any)
--   order.promoted   a queued order promised its units: the stock worker authorizes it
--   order.action_required  a promoted order whose card needs its buyer's 3-D Secure
ALTER TYPE order_status ADD VALUE IF NOT EXISTS 'queued';
ALTER TYPE order_status ADD VALUE IF NOT EXISTS 'sold_out';
ALTER TYPE outbox_event_type ADD VALUE IF NOT EXISTS 'order.promoted';
ALTER TYPE outbox_event_type ADD VALUE IF NOT EXISTS 'order.action_required';
