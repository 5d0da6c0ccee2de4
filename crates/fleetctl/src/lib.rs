#![warn(missing_docs)]
//! `fleetctl`: the operator's command line for an orderfleet deployment (SPEC §2).
//!
//! Every subcommand reads only the SPEC §3 variables it needs, so `fleetctl token` works on a
//! laptop with nothing but `AUTH_JWT_SECRET` set. A library with one entry, [`main`], so that
//! the image's one binary (`orderfleet-box`) runs it too.

use std::process::ExitCode;
use std::time::Duration;

mod cli;
mod dlq;
mod drop_status;
mod outbox;
mod output;

use anyhow::Context;
use clap::Parser;
use cli::{
    Cli, Command, DlqCommand, DropCommand, DropStatusArgs, OrderCommand, OutboxCommand, ProductCommand,
    ResolveArgs, SweepArgs, TokenArgs, UpsertArgs,
};
use orderfleet::domain::records::product::{self, ProductUpsert};
use orderfleet::domain::records::{order, pause};
use orderfleet::domain::recovery::resolution;
use orderfleet::domain::recovery::sweeper::{SweepPolicy, Sweeper};
use orderfleet::domain::tokens;
use orderfleet_payments::StripeConfig;
use orderfleet_payments::{Payments, RetryPolicy};
use orderfleet_runtime::aws::Aws;
use orderfleet_runtime::config::{AuthConfig, DatabaseConfig, Env, QueueConfig};
use orderfleet_runtime::db::{self, PoolSize};

/// Runs the command line `args` (the program's name first, as `std::env::args_os` gives it).
pub async fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    let cli = Cli::parse_from(args);
    let telemetry = orderfleet_runtime::telemetry::init(Default::default(), "fleetctl");
    let outcome = run(cli.command, &Env::process()).await;
    // At debug: a command's output stays its own (RUST_LOG=aws_operations=debug shows it).
    orderfleet_runtime::aws::log_operations_called("fleetctl", tracing::Level::DEBUG);
    telemetry.shutdown().await;
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{}", output::failure(&error));
            ExitCode::FAILURE
        }
    }
}

/// The database from `DATABASE_URL`, as every command that reads or writes it connects.
async fn pool(env: &Env) -> anyhow::Result<orderfleet_runtime::db::Pool> {
    db::connect(
        &DatabaseConfig::from_env(env)?,
        PoolSize { application_name: "fleetctl", ..PoolSize::default() },
    )
    .await
}

async fn run(command: Command, env: &Env) -> anyhow::Result<()> {
    match command {
        Command::Migrate => {
            db::migrate(&pool(env).await?).await?;
            println!("migrations applied");
        }
        Command::Drop(DropCommand::Status(args)) => drop_status(args, env).await?,
        Command::Product(ProductCommand::Upsert(args)) => upsert_product(args, env).await?,
        Command::Product(ProductCommand::Pause(args)) => {
            let switched = pause::pause(&pool(env).await?, &args.id).await?;
            println!("{}", output::switched(&args.id, switched)?);
        }
        Command::Product(ProductCommand::Resume(args)) => {
            let switched = pause::resume(&pool(env).await?, &args.id).await?;
            println!("{}", output::switched(&args.id, switched)?);
        }
        Command::Dlq(DlqCommand::Stats) => dlq_stats(env).await?,
        Command::Dlq(DlqCommand::Peek { queue, max }) => dlq_peek(queue, max, env).await?,
        Command::Dlq(DlqCommand::Redrive { queue, max_per_second }) => {
            let queues = Queues::connect(env).await?;
            for name in dlq::QueueName::chosen(queue) {
                dlq::redrive(&queues.sqs, &queues.pair(name).await?, max_per_second).await?;
            }
        }
        Command::Outbox(OutboxCommand::Dead) => {
            let rows = outbox::dead(&pool(env).await?).await?;
            println!("{}", output::dead_rows(&rows));
        }
        Command::Outbox(OutboxCommand::Retry { id, .. }) => {
            let retried = outbox::retry(&pool(env).await?, id).await?;
            println!("{}", output::retried(id, retried)?);
        }
        Command::Sweep(args) => sweep(args, env).await?,
        Command::Order(OrderCommand::Resolve(args)) => resolve_order(args, env).await?,
        Command::Token(args) => println!("{}", token(args, env)?),
    }
    Ok(())
}

async fn upsert_product(args: UpsertArgs, env: &Env) -> anyhow::Result<()> {
    let pool = pool(env).await?;
    let product = ProductUpsert {
        id: args.id,
        name: args.name,
        price_minor: args.price,
        currency: args.currency,
        units_total: args.stock,
        max_per_buyer: args.max_per_buyer,
        max_per_card: args.max_per_card,
        opens_at: args.opens_at,
        queue_opens_at: args.queue_opens_at,
    };
    let units = product::upsert(&pool, &product).await?;
    println!("{}", output::upserted(&product, &units));
    Ok(())
}

async fn sweep(args: SweepArgs, env: &Env) -> anyhow::Result<()> {
    let pool = pool(env).await?;
    let payments = Payments::new(&StripeConfig::from_env(env)?, RetryPolicy::background(), pool.clone())?;
    let policy = SweepPolicy {
        pending_after: Duration::from_secs(args.pending_after_seconds),
        fulfilment_after: Duration::from_secs(args.fulfilment_after_seconds),
        strays_after: Duration::from_secs(args.strays_after_seconds),
        ..SweepPolicy::default()
    };
    let report = Sweeper { pool, payments, policy }.sweep_once().await?;
    println!("{}", output::swept(&report));
    Ok(())
}

/// `order resolve`: the order settled from what the operator found, with the sweeper's Stripe
/// client (the same retries and budget).
async fn resolve_order(args: ResolveArgs, env: &Env) -> anyhow::Result<()> {
    let pool = pool(env).await?;
    let payments = Payments::new(&StripeConfig::from_env(env)?, RetryPolicy::background(), pool.clone())?;
    let evidence = args.evidence();
    let recorded = resolution::resolve(&pool, &payments, args.id, &evidence).await?;
    let order = order::load(&pool, args.id).await?.context("the order is gone")?;
    println!("{}", output::resolved(&order, &evidence, &recorded)?);
    Ok(())
}

/// A bearer token for the user; needs nothing but the token settings.
fn token(args: TokenArgs, env: &Env) -> anyhow::Result<String> {
    let auth = AuthConfig::from_env(env)?;
    tokens::issue_token(&auth, &args.user, Duration::from_secs(args.ttl_seconds))
}

/// `drop status`: the screen once, as text or JSON, or redrawn every second (`--watch`) until
/// Ctrl-C. The queues come from SQS when the queue variables are set.
async fn drop_status(args: DropStatusArgs, env: &Env) -> anyhow::Result<()> {
    let pool = pool(env).await?;
    let limit = env.or_default("STRIPE_ENDPOINT_REQUESTS_PER_SECOND", 25u32)?;
    let queues = match Queues::connect(env).await {
        Ok(queues) => {
            let mut pairs = Vec::new();
            for name in dlq::QueueName::all() {
                pairs.push(queues.pair(name).await?);
            }
            Some((queues, pairs))
        }
        Err(_) => None,
    };
    let read = || async {
        let mut status = drop_status::read(&pool, &args.id, limit)
            .await?
            .with_context(|| format!("no product {}", args.id.as_str()))?;
        if let Some((queues, pairs)) = &queues {
            status.queues = drop_status::queues(&queues.sqs, pairs).await?;
        }
        anyhow::Ok(status)
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&read().await?)?);
    } else if args.watch {
        drop_status::watch(read).await?;
    } else {
        println!("{}", drop_status::screen(&read().await?));
    }
    Ok(())
}

/// The fleet's queue pairs, as the `dlq` commands reach them.
struct Queues {
    sqs: aws_sdk_sqs::Client,
    config: QueueConfig,
}

impl Queues {
    async fn connect(env: &Env) -> anyhow::Result<Self> {
        let config = QueueConfig::from_env(env)?;
        Ok(Self { sqs: Aws::load().await?.sqs(), config })
    }

    /// The pair, its DLQ found from the source queue's redrive policy.
    async fn pair(&self, name: dlq::QueueName) -> anyhow::Result<dlq::Pair> {
        let source = match name {
            dlq::QueueName::Stock => self.config.stock_queue_url.as_str(),
            dlq::QueueName::Notification => self.config.notification_queue_url.as_str(),
        };
        dlq::Pair::resolve(&self.sqs, name, source).await
    }
}

async fn dlq_stats(env: &Env) -> anyhow::Result<()> {
    let queues = Queues::connect(env).await?;
    for name in dlq::QueueName::all() {
        let pair = queues.pair(name).await?;
        let depth = dlq::depth(&queues.sqs, &pair.dlq_url).await?;
        let sample = dlq::peek(&queues.sqs, &pair.dlq_url, 100).await?;
        println!("{}", output::dlq_stats(&pair, depth, &sample, dlq::now_ms()));
        if name == dlq::QueueName::Stock && !sample.is_empty() {
            warn_of_holds_ending(env, &sample).await;
        }
    }
    Ok(())
}

async fn dlq_peek(queue: Option<dlq::QueueName>, max: usize, env: &Env) -> anyhow::Result<()> {
    let queues = Queues::connect(env).await?;
    let pool = pool(env).await?;
    for name in dlq::QueueName::chosen(queue) {
        let pair = queues.pair(name).await?;
        let peeked = dlq::peek(&queues.sqs, &pair.dlq_url, max).await?;
        let keys: Vec<String> = peeked.iter().map(dlq::Peeked::failure_key).collect();
        let failures = dlq::recorded_failures(&pool, &keys).await?;
        println!("{name:?} DLQ: {} messages shown", peeked.len());
        for p in peeked {
            println!("{}", output::peeked(&p, failures.get(&p.failure_key()), dlq::now_ms()));
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
        Ok(ending) => println!("{}", output::holds_ending(&ending, chrono::Utc::now())),
        Err(e) => println!("hold deadlines not checked (the database could not be read): {e:#}"),
    }
}

#[cfg(test)]
mod tests {
    use orderfleet::domain::tokens::TokenVerifier;
    use orderfleet_words::UserId;

    use super::*;

    const SECRET: &str = "a-secret-of-at-least-thirty-two-bytes";

    fn token_for(user: &str, env: &Env) -> anyhow::Result<String> {
        token(TokenArgs { user: UserId::parse(user).unwrap(), ttl_seconds: 60 }, env)
    }

    #[tokio::test]
    async fn a_token_is_for_the_user_named_and_verifies_under_the_same_settings() {
        let env = Env::from_pairs([("AUTH_JWT_SECRET", SECRET)]);
        let token = token_for("u-1", &env).unwrap();
        let verifier = TokenVerifier::new(&AuthConfig::from_env(&env).unwrap());
        assert_eq!(verifier.verify(&token).await.unwrap().as_str(), "u-1");
    }

    #[test]
    fn a_token_without_its_secret_fails_naming_the_variable() {
        let error = token_for("u-1", &Env::from_pairs([])).unwrap_err();
        assert_eq!(output::failure(&error), "fleetctl: configuration error: AUTH_JWT_SECRET is not set");
    }
}
