//! `orderfleet-box`: the image's one binary. The five commands each link the same AWS SDK,
//! sqlx, OpenTelemetry and Tokio; one binary holds them once, where five executables would hold
//! five copies. The image and the EC2 release carry it with each command's name as a link to it
//! (`/usr/local/bin/order-intake` → `orderfleet-box`), so every command, unit and task
//! definition calls a command by its own name: the name it is called by chooses the command.
//! `orderfleet-box <command> [arguments]` works too.
//!
//! `healthcheck` is the container's health check: `GET /healthz` on `METRICS_LISTEN_ADDR`'s
//! port answered `200`. It is a command of the binary because the image has no shell.

// The services' futures are deep (async-stripe's types): proving them `Send` needs more than
// the default recursion limit, as in stock-worker.
#![recursion_limit = "256"]

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

/// The commands, by the names they are called by.
const COMMANDS: [&str; 6] =
    ["order-intake", "outbox-relay", "stock-worker", "notification-worker", "fleetctl", "healthcheck"];

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    let called = args
        .first()
        .and_then(|arg| Path::new(arg).file_name())
        .and_then(|name| name.to_str())
        .unwrap_or_default()
        .to_owned();
    let first = args.get(1).and_then(|arg| arg.to_str()).unwrap_or_default();
    if !COMMANDS.contains(&called.as_str()) && matches!(first, "--help" | "-h" | "--version" | "-V") {
        println!(
            "orderfleet-box {}: run as one of its commands' names (a link), or `orderfleet-box <command> [arguments]`; the commands: {}",
            env!("CARGO_PKG_VERSION"),
            COMMANDS.join(", ")
        );
        return ExitCode::SUCCESS;
    }
    let command = if COMMANDS.contains(&called.as_str()) {
        called
    } else if args.len() >= 2 {
        // `orderfleet-box <command> …`: the command's own arguments start with its name.
        args.remove(0);
        args[0].to_string_lossy().into_owned()
    } else {
        eprintln!("orderfleet-box: name a command: {}", COMMANDS.join(", "));
        return ExitCode::from(2);
    };
    match command.as_str() {
        "order-intake" => run(orderfleet_runtime::service::main::<order_intake::IntakeConfig>()),
        "outbox-relay" => run(orderfleet_runtime::service::main::<outbox_relay::OutboxRelay>()),
        "stock-worker" => run(orderfleet_runtime::service::main::<stock_worker::service::StockWorker>()),
        "notification-worker" => {
            run(orderfleet_runtime::service::main::<notification_worker::service::NotificationWorker>())
        }
        "fleetctl" => run(fleetctl::main(args)),
        "healthcheck" => healthcheck(),
        other => {
            eprintln!("orderfleet-box: no command {other:?}; the commands: {}", COMMANDS.join(", "));
            ExitCode::from(2)
        }
    }
}

/// Runs a command's `main` on the runtime `#[tokio::main]` makes.
fn run(main: impl Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime.block_on(main),
        Err(error) => {
            eprintln!("orderfleet-box: cannot start the Tokio runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

/// How long the health check waits to connect, and then for the answer.
const HEALTHCHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// `GET /healthz` on 127.0.0.1 at `METRICS_LISTEN_ADDR`'s port (9090 if unset): success only
/// for a `200`.
fn healthcheck() -> ExitCode {
    let addr = std::env::var("METRICS_LISTEN_ADDR").unwrap_or_default();
    let port = match addr.rsplit_once(':').map_or(addr.as_str(), |(_, port)| port) {
        "" => "9090",
        port => port,
    };
    match healthz_status(port) {
        Ok(200) => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("healthcheck: /healthz answered {status}");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("healthcheck: {error}");
            ExitCode::FAILURE
        }
    }
}

fn healthz_status(port: &str) -> std::io::Result<u16> {
    let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let addr: SocketAddr = format!("127.0.0.1:{port}")
        .parse()
        .map_err(|_| invalid(format!("no port in METRICS_LISTEN_ADDR: {port:?}")))?;
    let mut stream = TcpStream::connect_timeout(&addr, HEALTHCHECK_TIMEOUT)?;
    stream.set_read_timeout(Some(HEALTHCHECK_TIMEOUT))?;
    stream.set_write_timeout(Some(HEALTHCHECK_TIMEOUT))?;
    stream.write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    // "HTTP/1.1 200 OK"
    line.split_whitespace()
        .nth(1)
        .and_then(|status| status.parse().ok())
        .ok_or_else(|| invalid(format!("not an HTTP answer: {line:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    /// A one-request server on a free port answering `answer`; its port.
    fn answering(answer: &'static str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port().to_string();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = [0u8; 256];
            let _ = stream.read(&mut request);
            stream.write_all(answer.as_bytes()).unwrap();
        });
        port
    }

    #[test]
    fn the_health_check_reads_the_status_of_healthz_and_fails_where_nothing_listens() {
        assert_eq!(healthz_status(&answering("HTTP/1.1 200 OK\r\n\r\nok")).unwrap(), 200);
        assert_eq!(healthz_status(&answering("HTTP/1.1 503 Service Unavailable\r\n\r\n")).unwrap(), 503);
        assert!(healthz_status(&answering("garbage\r\n")).is_err());
        let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
        assert!(healthz_status(&closed).is_err(), "nothing listens there once the listener is dropped");
        assert!(healthz_status("not-a-port").is_err());
    }
}
