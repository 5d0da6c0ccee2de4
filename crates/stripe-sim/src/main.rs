//! `stripe-sim`: serves the simulator on `STRIPE_SIM_LISTEN_ADDR` (default
//! `127.0.0.1:12111`) until SIGTERM or SIGINT, limiting the API to `STRIPE_SIM_RATE_LIMIT`
//! requests a second if that is set (0 or unset: no limit), and sending Stripe's signed events
//! to `STRIPE_SIM_WEBHOOK_URL` with `STRIPE_SIM_WEBHOOK_SECRET` if both are set
//! ([`stripe_sim::Config`]).

#[tokio::main]
async fn main() -> std::process::ExitCode {
    orderfleet_runtime::service::main::<stripe_sim::Config>().await
}
