-- Issue 34: the commit that authorizes an order also takes its units when nothing was cut
-- (`Transition::apply`), so the roles that commit authorizations may move a product's stock.
-- The intake commits them (a request, a resumed one, a 3-D Secure webhook); the stock worker's
-- sweeper already may. Still no right to reprice a product or change its total.
GRANT UPDATE (stock, updated_at) ON products TO orderfleet_intake;
