-- What counts toward the card-testing limit as a decline: the card declined, or its buyer
-- failing 3-D Secure; nothing else. The fleet's own faults are not the buyer's card: an order
-- the database refused (`order_refused`), an attempt that never confirmed after a Stripe 5xx
-- (`authorization_incomplete`), a card over the product's cap; nor is needing authentication
-- (`authentication_timed_out`, `payment_canceled`). Named as a list of what counts, so a reason
-- a later version adds counts as nothing until it is named here.
CREATE OR REPLACE FUNCTION counts_as_decline(status order_status, failure_reason text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT status = 'payment_declined'
             AND (failure_reason IS NULL OR failure_reason IN ('payment_declined', 'authentication_failed')) $$;
