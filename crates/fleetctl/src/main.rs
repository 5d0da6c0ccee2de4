//! `fleetctl`: the operator's command line ([`fleetctl::main`]).

#[tokio::main]
async fn main() -> std::process::ExitCode {
    fleetctl::main(std::env::args_os()).await
}
