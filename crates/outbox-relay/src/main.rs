//! `outbox-relay`: relays outbox rows to SQS and retires old ones, until SIGTERM/SIGINT
//! ([`outbox_relay::OutboxRelay`]).

#[tokio::main]
async fn main() -> std::process::ExitCode {
    orderfleet_runtime::service::main::<outbox_relay::OutboxRelay>().await
}
