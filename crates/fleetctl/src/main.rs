//! `fleetctl`: the operator's command line for an orderfleet deployment (SPEC §2).
//!
//! Every subcommand reads only the SPEC §3 variables it needs, so `fleetctl token` works on a
//! laptop with nothing but `AUTH_JWT_SECRET` set.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use orderfleet::auth::{self, UserId};
use orderfleet::config::{AuthConfig, ConfigError, DatabaseConfig, Env, StripeConfig};
use orderfleet::db::{self, PoolSize};
use orderfleet::payments::{Payments, RetryPolicy};
use orderfleet::product::{self, Currency, ProductUpsert, Sku};
use orderfleet::sweeper::{SweepPolicy, Sweeper};

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
    /// Print a bearer token for a user. Reads AUTH_JWT_SECRET.
    Token(TokenArgs),
    /// Resolve stuck orders once: pending authorizations (looked up at Stripe), and orders
    /// whose fulfilment stalled. Reads DATABASE_URL, STRIPE_SECRET_KEY, STRIPE_API_BASE.
    Sweep(SweepArgs),
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
    /// Create a product, or replace its name, price, currency and stock.
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
    /// Units for sale (sets the stock; does not add to it).
    #[arg(long, value_parser = clap::value_parser!(i32).range(0..))]
    stock: i32,
}

#[derive(Debug, Args)]
struct TokenArgs {
    /// The user the token acts for (its `sub`).
    #[arg(long, value_parser = UserId::parse)]
    user: UserId,
    /// How long the token is valid.
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..=31_536_000))]
    ttl_seconds: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    orderfleet::telemetry::init(Default::default());
    match run(cli.command, &Env::process()).await {
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

async fn run(command: Command, env: &Env) -> anyhow::Result<()> {
    match command {
        Command::Migrate => {
            let pool = db::connect(&DatabaseConfig::from_env(env)?, PoolSize::default()).await?;
            db::migrate(&pool).await?;
            println!("migrations applied");
        }
        Command::Product(ProductCommand::Upsert(args)) => {
            let pool = db::connect(&DatabaseConfig::from_env(env)?, PoolSize::default()).await?;
            let product = ProductUpsert {
                id: args.id,
                name: args.name,
                price_minor: args.price,
                currency: args.currency,
                stock: args.stock,
            };
            product::upsert(&pool, &product).await?;
            println!(
                "product {} upserted: price {} {}, stock {}",
                product.id.as_str(),
                product.price_minor,
                product.currency.as_str(),
                product.stock
            );
        }
        Command::Sweep(args) => {
            let pool = db::connect(&DatabaseConfig::from_env(env)?, PoolSize::default()).await?;
            let payments = Payments::new(&StripeConfig::from_env(env)?, RetryPolicy::default())?;
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
            let token =
                auth::issue_token(&auth.jwt_secret, &args.user, Duration::from_secs(args.ttl_seconds))?;
            println!("{token}");
        }
    }
    Ok(())
}
