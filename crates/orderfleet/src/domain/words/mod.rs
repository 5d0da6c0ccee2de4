//! The words every layer above shares, and nothing else: an order's statuses and failure
//! reasons ([`status`]). The checked values an order is made of (`OrderId`, `Sku`, `Money`, …)
//! and a payment hold as the order sees it are the `orderfleet-words` crate, below this one and
//! the payments crate alike. It imports no other part of the domain.

pub mod status;
