#![warn(missing_docs)]
//! `fleetctl`: the operator's command line for an orderfleet deployment (SPEC §2).
//!
//! Every subcommand reads only the SPEC §3 variables it needs, so `fleetctl token` works on a
//! laptop with nothing but `AUTH_JWT_SECRET` set. A library with one entry, [`main`], so that
//! the image's one binary (`orderfleet-box`) runs it too.

use std::process::ExitCode;
use std::time::Duration;

mod dlq;
mod outbox;

use clap::{Args, Parser, Subcommand};
use orderfleet::domain::payments::{Payments, RetryPolicy};
use orderfleet::domain::product::{self, Currency, ProductUpsert, Sku};
use orderfleet::domain::sweeper::{SweepPolicy, Sweeper};
use orderfleet::domain::tokens::{self, UserId};
use orderfleet::runtime::aws::Aws;
use orderfleet::runtime::config::{AuthConfig, ConfigError, DatabaseConfig, Env, QueueConfig, StripeConfig};
use orderfleet::runtime::db::{self, PoolSize};

#[derive(Debug, Parser)]
#[command(name = "fleetctl", version, about = "Operate an orderfleet deployment")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Apply the database migrations (safe to repeat). Reads DATABASE_URL.
    Migrate,
    /// Manage products. Reads DATABASE_URL.
    #[command(subcommand)]
    Product(ProductCommand),
    /// Print a bearer token for a user. Reads AUTH_JWT_SECRET, AUTH_JWT_ISSUER, AUTH_JWT_AUDIENCE.
    Token(TokenArgs),
    /// Dead-letter queues: depth, the messages and why they failed, redrive. Reads
    /// STOCK_QUEUE_URL, NOTIFICATION_QUEUE_URL, the AWS variables, and DATABASE_URL (peek).
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Outbox rows the relay gave up on. Reads DATABASE_URL.
    #[command(subcommand)]
    Outbox(OutboxCommand),
    /// Resolve stuck orders once: pending authorizations (looked up at Stripe), and orders
    /// whose fulfilment stalled. Reads DATABASE_URL, STRIPE_SECRET_KEY, STRIPE_API_BASE.
    Sweep(SweepArgs),
}

#[derive(Debug, Subcommand)]
enum DlqCommand {
    /// Depth and oldest message of each DLQ.
    Stats,
    /// Show dead letters with their receive count and the last error the workers recorded,
    /// without consuming them.
    Peek {
        #[arg(long, value_enum)]
        queue: Option<dlq::QueueName>,
        #[arg(long, default_value_t = 10)]
        max: usize,
    },
    /// Move dead letters back to their source queue (StartMessageMoveTask, as the console
    /// does), and report the task's progress.
    Redrive {
        #[arg(long, value_enum)]
        queue: Option<dlq::QueueName>,
        /// Throttle the move (messages per second); as fast as SQS goes when unset.
        #[arg(long, value_parser = clap::value_parser!(i32).range(1..=500))]
        max_per_second: Option<i32>,
    },
}

#[derive(Debug, Subcommand)]
enum OutboxCommand {
    /// List dead rows with their last error code and reason.
    Dead,
    /// Re-queue a dead row, or all of them, with a fresh retry budget.
    Retry {
        #[arg(long, conflicts_with = "all", required_unless_present = "all")]
        id: Option<uuid::Uuid>,
        #[arg(long)]
        all: bool,
    },
}

#[derive(Debug, Args)]
struct SweepArgs {
    /// Sweep pending orders idle (no live intake lease) for at least this long.
    #[arg(long, default_value_t = 90)]
    pending_after_seconds: u64,
    /// Advance orders whose fulfilment has not moved for at least this long.
    #[arg(long, default_value_t = 300)]
    fulfilment_after_seconds: u64,
}

#[derive(Debug, Subcommand)]
enum ProductCommand {
    /// Create a product, or set its name, price, currency and total units for sale.
    Upsert(UpsertArgs),
}

#[derive(Debug, Args)]
struct UpsertArgs {
    /// Product id (SKU), e.g. sku-1.
    #[arg(long, value_parser = Sku::parse)]
    id: Sku,
    /// Display name.
    #[arg(long)]
    name: String,
    /// Unit price in the currency's minor units (cents).
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    price: i64,
    /// ISO 4217 code, e.g. usd.
    #[arg(long, value_parser = Currency::parse)]
    currency: Currency,
    /// The product's total units for sale, sold ones included (0 to 100000000): repeating an
    /// upsert sells nothing twice; fewer than already sold or reserved is refused; fewer than
    /// promised rejects the orders last in line.
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(0..=i64::from(product::MAX_UNITS)))]
    stock: i32,
    /// "Limit N per customer": the most units one buyer may hold in this product's orders
    /// that have not failed. Without it, no cap (an earlier cap is removed).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=i64::from(product::MAX_PER_BUYER)))]
    max_per_buyer: Option<i32>,
}

#[derive(Debug, Args)]
struct TokenArgs {
    /// The user the token acts for (its `sub`).
    #[arg(long, value_parser = UserId::parse)]
    user: UserId,
    /// How long the token is valid, in seconds: at most a day (86400).
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    ttl_seconds: u64,
}

/// Runs the command line `args` (the program's name first, as `std::env::args_os` gives it).
pub async fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    let cli = Cli::parse_from(args);
    let telemetry = orderfleet::runtime::telemetry::init(Default::default(), "fleetctl");
    let outcome = run(cli.command, &Env::process()).await;
    // At debug: a command's output stays its own (RUST_LOG=aws_operations=debug shows it).
    orderfleet::runtime::aws::log_operations_called("fleetctl", tracing::Level::DEBUG);
    telemetry.shutdown().await;
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // A configuration error is one line naming the variable; anything else prints its
            // whole cause chain on one line.
            match error.downcast_ref::<ConfigError>() {
                Some(config) => eprintln!("fleetctl: {config}"),
                None => eprintln!("fleetctl: error: {error:#}"),
            }
            ExitCode::FAILURE
        }
    }
}

/// The database from `DATABASE_URL`, as every command that reads or writes it connects.
async fn pool(env: &Env) -> anyhow::Result<sqlx::PgPool> {
    db::connect(&DatabaseConfig::from_env(env)?, PoolSize::default()).await
}

async fn run_dlq(command: DlqCommand, env: &Env) -> anyhow::Result<()> {
    let queues = QueueConfig::from_env(env)?;
    let aws = Aws::load().await?;
    let sqs = aws.sqs();
    let url = |name: dlq::QueueName| match name {
        dlq::QueueName::Stock => queues.stock_queue_url.as_str().to_owned(),
        dlq::QueueName::Notification => queues.notification_queue_url.as_str().to_owned(),
    };
    let chosen = |queue: Option<dlq::QueueName>| {
        queue.map(|q| vec![q]).unwrap_or_else(|| dlq::QueueName::all().to_vec())
    };
    match command {
        DlqCommand::Stats => {
            for name in dlq::QueueName::all() {
                let pair = dlq::Pair::resolve(&sqs, name, &url(name)).await?;
                let (visible, in_flight) = dlq::depth(&sqs, &pair.dlq_url).await?;
                let sample = dlq::peek(&sqs, &pair.dlq_url, 100).await?;
                let oldest = sample.iter().filter_map(|p| p.sent_at_ms).min();
                let oldest = if visible + in_flight == 0 { "-".to_owned() } else { dlq::age(oldest) };
                println!(
                    "{name:?} DLQ: {visible} messages ({in_flight} in flight), oldest {oldest}  {}",
                    pair.dlq_url
                );
                if name == dlq::QueueName::Stock && !sample.is_empty() {
                    warn_of_holds_ending(env, &sample).await;
                }
            }
        }
        DlqCommand::Peek { queue, max } => {
            let pool = pool(env).await?;
            for name in chosen(queue) {
                let pair = dlq::Pair::resolve(&sqs, name, &url(name)).await?;
                let peeked = dlq::peek(&sqs, &pair.dlq_url, max).await?;
                let key =
                    |p: &dlq::Peeked| orderfleet::runtime::consumer::failure_key(&p.body, &p.message_id);
                let keys: Vec<String> = peeked.iter().map(key).collect();
                let failures = dlq::recorded_failures(&pool, &keys).await?;
                println!("{name:?} DLQ: {} messages shown", peeked.len());
                for p in peeked {
                    let failure = failures
                        .get(&key(&p))
                        .map(|r| {
                            format!(
                                "last error (receive {}, {}): {} ({} failures recorded in all, across redrives)",
                                r.receive_count, r.outcome, r.reason, r.failures
                            )
                        })
                        .unwrap_or_else(|| "no error recorded by the workers".into());
                    let body: String = p.body.chars().take(300).collect();
                    println!(
                        "- {}  received {} times  age {}",
                        p.message_id,
                        p.receive_count,
                        dlq::age(p.sent_at_ms)
                    );
                    println!("  {failure}");
                    println!("  body: {body}");
                }
            }
        }
        DlqCommand::Redrive { queue, max_per_second } => {
            for name in chosen(queue) {
                let pair = dlq::Pair::resolve(&sqs, name, &url(name)).await?;
                dlq::redrive(&sqs, &pair, max_per_second).await?;
            }
        }
    }
    Ok(())
}

/// Warns of dead-lettered stock checks whose authorization ends within a day: after that
/// Stripe cancels the hold and the order cannot be paid. The counts above stand even when the
/// database cannot be read, so a failure here is a line, not an error.
async fn warn_of_holds_ending(env: &Env, sample: &[dlq::Peeked]) {
    let bodies: Vec<&str> = sample.iter().map(|p| p.body.as_str()).collect();
    let ending = async {
        let pool = pool(env).await?;
        dlq::holds_ending_soon(&pool, &bodies).await
    };
    match ending.await {
        Ok(ending) if ending.is_empty() => {}
        Ok(ending) => {
            let (n, checks, hold) = match ending.len() {
                1 => (1, "stock check", "holds an authorization that ends"),
                n => (n, "stock checks", "hold authorizations that end"),
            };
            println!(
                "WARNING: {n} dead-lettered {checks} {hold} within a day; after that Stripe cancels the hold and \
                 the order ends capture_failed. Fix the cause and redrive (fleetctl dlq redrive --queue stock) before then:"
            );
            for hold in ending {
                println!(
                    "  order {}: hold ends {} ({})",
                    hold.order_id,
                    dlq::until(hold.expires_at),
                    hold.expires_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                );
            }
        }
        Err(e) => println!("hold deadlines not checked (the database could not be read): {e:#}"),
    }
}

async fn run(command: Command, env: &Env) -> anyhow::Result<()> {
    match command {
        Command::Migrate => {
            let pool = pool(env).await?;
            db::migrate(&pool).await?;
            println!("migrations applied");
        }
        Command::Product(ProductCommand::Upsert(args)) => {
            let pool = pool(env).await?;
            let product = ProductUpsert {
                id: args.id,
                name: args.name,
                price_minor: args.price,
                currency: args.currency,
                units_total: args.stock,
                max_per_buyer: args.max_per_buyer,
            };
            let units = product::upsert(&pool, &product).await?;
            println!(
                "product {} upserted: price {} {}, {} units for sale in all, {} sold or reserved, {} promised, {}",
                product.id.as_str(),
                product.price_minor,
                product.currency.as_str(),
                units.total,
                units.taken,
                units.promised,
                match product.max_per_buyer {
                    Some(n) => format!("at most {n} per buyer"),
                    None => "no cap per buyer".to_owned(),
                },
            );
            if units.overpromised() > 0 {
                println!(
                    "{} units are promised beyond the new total: the stock workers reject the orders last in line \
                     for them and release their holds",
                    units.overpromised()
                );
            }
        }
        Command::Dlq(command) => run_dlq(command, env).await?,
        Command::Outbox(OutboxCommand::Dead) => {
            let pool = pool(env).await?;
            let rows = outbox::dead(&pool).await?;
            println!("{} dead outbox rows", rows.len());
            for row in rows {
                println!(
                    "{}  {}  to {}  order {}  after {} attempts  {}: {}  (since {})",
                    row.id,
                    row.event_type,
                    row.destination.as_str(),
                    row.aggregate_id,
                    row.retry_count,
                    row.last_error_code.as_deref().unwrap_or("-"),
                    row.last_error_reason.as_deref().unwrap_or("-"),
                    row.updated_at.format("%Y-%m-%d %H:%M:%S UTC")
                );
            }
        }
        Command::Outbox(OutboxCommand::Retry { id, .. }) => {
            let pool = pool(env).await?;
            let retried = outbox::retry(&pool, id).await?;
            if id.is_some() && retried == 0 {
                anyhow::bail!("no dead outbox row with that id");
            }
            println!("{retried} outbox rows re-queued");
        }
        Command::Sweep(args) => {
            let pool = pool(env).await?;
            let payments = Payments::new(&StripeConfig::from_env(env)?, RetryPolicy::background())?;
            let policy = SweepPolicy {
                pending_after: Duration::from_secs(args.pending_after_seconds),
                fulfilment_after: Duration::from_secs(args.fulfilment_after_seconds),
                ..SweepPolicy::default()
            };
            let report = Sweeper { pool, payments, policy }.sweep_once().await?;
            println!(
                "authorizations resolved {}, provider unavailable {}; fulfilments settled {}, blocked {}; stuck {}",
                report.authorizations_resolved,
                report.authorizations_unavailable,
                report.fulfilments_settled,
                report.fulfilments_blocked,
                report.stuck.len()
            );
            for (order_id, reason) in &report.stuck {
                println!("stuck {order_id}: {reason}");
            }
        }
        Command::Token(args) => {
            let auth = AuthConfig::from_env(env)?;
            let token = tokens::issue_token(&auth, &args.user, Duration::from_secs(args.ttl_seconds))?;
            println!("{token}");
        }
    }
    Ok(())
}
