//! `notification-worker`: long-polls the notification queue until SIGTERM/SIGINT
//! ([`notification_worker::service`]).

#[tokio::main]
async fn main() -> std::process::ExitCode {
    orderfleet_runtime::service::main::<notification_worker::service::NotificationWorker>().await
}
