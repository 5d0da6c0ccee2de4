// Tests, the harness and the model: scenarios are read top to bottom, and statements are
// built at run time to look at the fleet from outside (clippy.toml, Cargo.toml's lints).
#![allow(clippy::too_many_lines, clippy::disallowed_methods)]
//! End-to-end tests against the real PostgreSQL and LocalStack that `make up` started.
//! One test binary (one link) for the whole suite; a module per subject.

mod card_cap;
mod configuration;
mod contract;
mod door;
mod drop_status;
mod edge;
mod faults;
mod herd;
mod image;
mod infrastructure;
mod intake;
mod leases;
mod migrations;
mod observability;
mod opening;
mod outages;
mod pause;
mod payments;
mod pipeline;
mod pool;
mod redelivery;
mod security;
mod steps;
mod stripe_budget;
mod stripe_today;
