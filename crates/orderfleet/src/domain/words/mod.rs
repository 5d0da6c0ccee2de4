//! The words every layer above shares, and nothing else: the checked values an order is made
//! of (`OrderId`, `Sku`, `Money`, …, exported from [`crate::domain`]), its statuses and failure
//! reasons ([`status`]), and a payment hold as the order sees it ([`hold`]). It imports no
//! other part of the domain.

pub(crate) mod ids;

pub mod hold;
pub mod status;
