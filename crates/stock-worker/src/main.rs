//! `stock-worker`: long-polls the stock-check queue until SIGTERM/SIGINT ([`stock_worker::service`]).

#[tokio::main]
async fn main() -> std::process::ExitCode {
    orderfleet_runtime::service::main::<stock_worker::service::StockWorker>().await
}
