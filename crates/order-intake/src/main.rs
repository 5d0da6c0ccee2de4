//! `order-intake`: serves the API until SIGTERM/SIGINT ([`order_intake::IntakeConfig`]).

#[tokio::main]
async fn main() -> std::process::ExitCode {
    orderfleet_runtime::service::main::<order_intake::IntakeConfig>().await
}
