//! The command line's shape: every subcommand and its arguments, checked by clap before a
//! command runs, so a handler only ever sees values already parsed into their domain types.

use clap::{Args, Parser, Subcommand};
use orderfleet::domain::records::product;
use orderfleet::domain::recovery::resolution::{Evidence, PaymentIntentId};
use orderfleet_words::OrderId;
use orderfleet_words::UserId;
use orderfleet_words::{Currency, Sku};

use crate::dlq;

#[derive(Debug, Parser)]
#[command(name = "fleetctl", version, about = "Operate an orderfleet deployment")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Apply the database migrations (safe to repeat). Reads DATABASE_URL.
    Migrate,
    /// A drop as its operator watches it. Reads DATABASE_URL, and STOCK_QUEUE_URL,
    /// NOTIFICATION_QUEUE_URL and the AWS variables for the queues (left out when unset).
    #[command(subcommand)]
    Drop(DropCommand),
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
    /// One order, by hand. Reads DATABASE_URL, STRIPE_SECRET_KEY, STRIPE_API_BASE.
    #[command(subcommand)]
    Order(OrderCommand),
}

#[derive(Debug, Subcommand)]
pub(crate) enum OrderCommand {
    /// Settle a pending_authorization order the sweeper reports stuck (Stripe refuses to list
    /// its PaymentIntents), from what Stripe's Dashboard shows for its order_id metadata: the
    /// intent named is read from Stripe and recorded as the sweeper would (authorized,
    /// requires_action or payment_declined); with --none the order is declined and its units
    /// go back. The order's lease is taken first; bad input changes nothing.
    Resolve(ResolveArgs),
}

#[derive(Debug, Args)]
pub(crate) struct ResolveArgs {
    /// The order's id (a UUID, as `fleetctl sweep` prints it).
    #[arg(long)]
    pub(crate) id: OrderId,
    /// The order's PaymentIntent (pi_…), as Stripe's Dashboard shows it.
    #[arg(long, value_parser = PaymentIntentId::parse, conflicts_with = "none", required_unless_present = "none")]
    pub(crate) payment_intent: Option<PaymentIntentId>,
    /// Stripe's Dashboard shows no PaymentIntent for the order: decline it, its units back.
    #[arg(long)]
    pub(crate) none: bool,
}

impl ResolveArgs {
    /// What the operator found, as clap guarantees it: an intent, or none.
    pub(crate) fn evidence(&self) -> Evidence {
        match &self.payment_intent {
            Some(intent) => Evidence::Intent(intent.clone()),
            None => Evidence::NoIntent,
        }
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
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
pub(crate) enum OutboxCommand {
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
pub(crate) struct SweepArgs {
    /// Sweep pending orders idle (no live intake lease) for at least this long.
    #[arg(long, default_value_t = 90)]
    pub(crate) pending_after_seconds: u64,
    /// Advance orders whose fulfilment has not moved for at least this long.
    #[arg(long, default_value_t = 300)]
    pub(crate) fulfilment_after_seconds: u64,
    /// Release stray PaymentIntents (live, and not their order's) made at least this long ago.
    #[arg(long, default_value_t = 600)]
    pub(crate) strays_after_seconds: u64,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ProductCommand {
    /// Create a product, or set its name, price, currency, total units for sale and opening.
    Upsert(UpsertArgs),
    /// Stop the product's sale at once: no unit promised to anyone and no queue entry taken
    /// (409 sale_paused) from every intake once this returns; an opening that falls due waits
    /// for the resume; orders that already hold units go on.
    Pause(SkuArgs),
    /// Go on with a paused sale: the units that came back go down the queue, and an opening
    /// that fell due meanwhile happens now.
    Resume(SkuArgs),
}

#[derive(Debug, Subcommand)]
pub(crate) enum DropCommand {
    /// One screen for the operator of a drop: the sale's state and its opening, the draw's
    /// seed, units total, promised, sold and left, queued orders waiting, orders by status and
    /// 3-D Secure in progress, sold-out answers a second, the fleet's Stripe budget and 429s in
    /// the last minute, queue depths, dead letters and stuck orders.
    Status(DropStatusArgs),
}

#[derive(Debug, Args)]
pub(crate) struct DropStatusArgs {
    /// Product id (SKU), e.g. sku-1.
    #[arg(long, value_parser = Sku::parse)]
    pub(crate) id: Sku,
    /// Redraw the screen in place every second until Ctrl-C.
    #[arg(long, conflicts_with = "json")]
    pub(crate) watch: bool,
    /// Print the same figures once, as one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct SkuArgs {
    /// Product id (SKU), e.g. sku-1.
    #[arg(long, value_parser = Sku::parse)]
    pub(crate) id: Sku,
}

#[derive(Debug, Args)]
pub(crate) struct UpsertArgs {
    /// Product id (SKU), e.g. sku-1.
    #[arg(long, value_parser = Sku::parse)]
    pub(crate) id: Sku,
    /// Display name.
    #[arg(long)]
    pub(crate) name: String,
    /// Unit price in the currency's minor units (cents).
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    pub(crate) price: i64,
    /// ISO 4217 code, e.g. usd.
    #[arg(long, value_parser = Currency::parse)]
    pub(crate) currency: Currency,
    /// The product's total units for sale, sold ones included (0 to 100000000): repeating an
    /// upsert sells nothing twice; fewer than already sold or reserved is refused; fewer than
    /// promised rejects the orders last in line.
    #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(0..=i64::from(product::MAX_UNITS)))]
    pub(crate) stock: i32,
    /// "Limit N per customer": the most units one buyer may hold in this product's orders
    /// that have not failed. Without it, no cap (an earlier cap is removed).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=i64::from(product::MAX_PER_BUYER)))]
    pub(crate) max_per_buyer: Option<i32>,
    /// The most units one card may hold in this product's orders that have not failed, the
    /// card known by Stripe's `card.fingerprint` of the order's payment method, however many
    /// accounts use it. Read from Stripe once per promised order, before its PaymentIntent.
    /// Without it, no cap (an earlier cap is removed) and no such read.
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=i64::from(product::MAX_PER_BUYER)))]
    pub(crate) max_per_card: Option<i32>,
    /// When the sale opens (RFC 3339, e.g. 2026-12-24T18:00:00Z): no unit is promised before
    /// it. Without it, as it is (a new product opens at once). Refused once the product opened.
    #[arg(long, value_parser = rfc3339)]
    pub(crate) opens_at: Option<chrono::DateTime<chrono::Utc>>,
    /// When its pre-queue opens (RFC 3339), before --opens-at: buyers who come meanwhile are
    /// queued, and their order is drawn at random at the opening. Without it, as it is.
    #[arg(long, value_parser = rfc3339)]
    pub(crate) queue_opens_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// An RFC 3339 instant (with its offset), as UTC.
fn rfc3339(raw: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(raw)
        .map(|at| at.with_timezone(&chrono::Utc))
        .map_err(|e| format!("not an RFC 3339 time (e.g. 2026-12-24T18:00:00Z): {e}"))
}

#[derive(Debug, Args)]
pub(crate) struct TokenArgs {
    /// The user the token acts for (its `sub`).
    #[arg(long, value_parser = UserId::parse)]
    pub(crate) user: UserId,
    /// How long the token is valid, in seconds: at most a day (86400).
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) ttl_seconds: u64,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use clap::error::ErrorKind;

    use super::*;

    /// The command line `fleetctl <args>` as clap parses it.
    fn parse(args: &str) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("fleetctl").chain(args.split_whitespace())).map(|cli| cli.command)
    }

    /// How clap refuses `fleetctl <args>`: the kind, and the exit code `main` would end with.
    fn refused(args: &str) -> (ErrorKind, i32, String) {
        let error = parse(args).expect_err(args);
        (error.kind(), error.exit_code(), error.to_string())
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_token_lasts_an_hour_unless_told() {
        let Command::Token(args) = parse("token --user u-1").unwrap() else { panic!("not token") };
        assert_eq!((args.user.as_str(), args.ttl_seconds), ("u-1", 3600));
        let Command::Token(args) = parse("token --user u-1 --ttl-seconds 86400").unwrap() else {
            panic!("not token")
        };
        assert_eq!(args.ttl_seconds, 86_400);
    }

    #[test]
    fn a_token_for_more_than_a_day_is_refused_with_exit_code_2() {
        let (kind, code, message) = refused("token --user u-1 --ttl-seconds 86401");
        assert_eq!((kind, code), (ErrorKind::ValueValidation, 2));
        assert!(message.contains("86401 is not in 1..=86400"), "{message}");
    }

    #[test]
    fn a_token_needs_a_user() {
        let (kind, code, message) = refused("token");
        assert_eq!((kind, code), (ErrorKind::MissingRequiredArgument, 2));
        assert!(message.contains("--user <USER>"), "{message}");
    }

    #[test]
    fn a_product_upsert_parses_into_domain_values() {
        let Command::Product(ProductCommand::Upsert(args)) =
            parse("product upsert --id sku-1 --name Kettle --price 2500 --currency USD --stock 0").unwrap()
        else {
            panic!("not product upsert")
        };
        assert_eq!(args.id.as_str(), "sku-1");
        assert_eq!(args.name, "Kettle");
        assert_eq!(args.price, 2500);
        // Lower-cased, as Stripe writes it.
        assert_eq!(args.currency.as_str(), "usd");
        assert_eq!((args.stock, args.max_per_buyer), (0, None));
    }

    #[test]
    fn a_product_upsert_refuses_each_malformed_value_with_the_domains_reason() {
        let valid = "--name Kettle --price 2500 --currency usd --stock 5";
        let bad_sku = refused(&format!("product upsert --id sku/1 {valid}"));
        assert_eq!(bad_sku.0, ErrorKind::ValueValidation);
        assert!(bad_sku.2.contains("a product id is 1 to 64 letters"), "{}", bad_sku.2);

        let bad_currency =
            refused("product upsert --id sku-1 --name K --price 1 --currency dollars --stock 5");
        assert_eq!(bad_currency.0, ErrorKind::ValueValidation);
        assert!(bad_currency.2.contains("a currency is a three-letter ISO 4217 code"), "{}", bad_currency.2);

        for (args, reason) in [
            ("--price 0 --stock 5", "0 is not in 1.."),
            ("--price 1 --stock -1", "-1 is not in 0..=100000000"),
            ("--price 1 --stock 100000001", "100000001 is not in 0..=100000000"),
            ("--price 1 --stock 5 --max-per-buyer 0", "0 is not in 1..="),
        ] {
            let (kind, code, message) =
                refused(&format!("product upsert --id sku-1 --name K --currency usd {args}"));
            assert_eq!((kind, code), (ErrorKind::ValueValidation, 2), "{args}");
            assert!(message.contains(reason), "{args}: {message}");
        }
    }

    #[test]
    fn an_outbox_retry_names_one_row_or_all_of_them_but_not_both() {
        let id = "0191e5b2-7c1a-7000-8000-000000000001";
        let Command::Outbox(OutboxCommand::Retry { id: Some(parsed), all: false }) =
            parse(&format!("outbox retry --id {id}")).unwrap()
        else {
            panic!("not outbox retry --id")
        };
        assert_eq!(parsed.to_string(), id);
        assert!(matches!(
            parse("outbox retry --all").unwrap(),
            Command::Outbox(OutboxCommand::Retry { id: None, all: true })
        ));

        assert_eq!(refused("outbox retry").0, ErrorKind::MissingRequiredArgument);
        assert_eq!(refused(&format!("outbox retry --id {id} --all")).0, ErrorKind::ArgumentConflict);
        assert_eq!(refused("outbox retry --id 42").0, ErrorKind::ValueValidation);
    }

    #[test]
    fn the_dlq_commands_take_a_known_queue_and_a_bounded_rate() {
        let Command::Dlq(DlqCommand::Peek { queue, max }) = parse("dlq peek").unwrap() else {
            panic!("not peek")
        };
        assert_eq!((queue, max), (None, 10));
        let Command::Dlq(DlqCommand::Peek { queue, max }) =
            parse("dlq peek --queue notification --max 3").unwrap()
        else {
            panic!("not peek")
        };
        assert_eq!((queue, max), (Some(dlq::QueueName::Notification), 3));
        let Command::Dlq(DlqCommand::Redrive { queue, max_per_second }) =
            parse("dlq redrive --queue stock --max-per-second 500").unwrap()
        else {
            panic!("not redrive")
        };
        assert_eq!((queue, max_per_second), (Some(dlq::QueueName::Stock), Some(500)));

        let (kind, _, message) = refused("dlq peek --queue orders");
        assert_eq!(kind, ErrorKind::InvalidValue);
        assert!(message.contains("[possible values: stock, notification]"), "{message}");
        assert_eq!(refused("dlq redrive --max-per-second 0").0, ErrorKind::ValueValidation);
        assert_eq!(refused("dlq redrive --max-per-second 501").0, ErrorKind::ValueValidation);
    }

    #[test]
    fn a_sweep_waits_90_seconds_for_authorizations_and_300_for_fulfilment_unless_told() {
        let Command::Sweep(args) = parse("sweep").unwrap() else { panic!("not sweep") };
        assert_eq!((args.pending_after_seconds, args.fulfilment_after_seconds), (90, 300));
        let Command::Sweep(args) =
            parse("sweep --pending-after-seconds 5 --fulfilment-after-seconds 6").unwrap()
        else {
            panic!("not sweep")
        };
        assert_eq!((args.pending_after_seconds, args.fulfilment_after_seconds), (5, 6));
    }

    #[test]
    fn an_order_resolve_names_the_order_and_either_its_payment_intent_or_none() {
        let id = "0191e5b2-7c1a-7000-8000-000000000001";
        let Command::Order(OrderCommand::Resolve(args)) =
            parse(&format!("order resolve --id {id} --payment-intent pi_3MtwBwLkdIwHu7ix28a3tqPa")).unwrap()
        else {
            panic!("not order resolve")
        };
        assert_eq!(args.id.to_string(), id);
        assert_eq!(
            args.evidence(),
            Evidence::Intent(PaymentIntentId::parse("pi_3MtwBwLkdIwHu7ix28a3tqPa").unwrap())
        );
        let Command::Order(OrderCommand::Resolve(args)) =
            parse(&format!("order resolve --id {id} --none")).unwrap()
        else {
            panic!("not order resolve --none")
        };
        assert_eq!(args.evidence(), Evidence::NoIntent);
    }

    #[test]
    fn an_order_resolve_refuses_no_evidence_both_kinds_and_malformed_ids_with_exit_code_2() {
        let id = "0191e5b2-7c1a-7000-8000-000000000001";
        assert_eq!(refused(&format!("order resolve --id {id}")).0, ErrorKind::MissingRequiredArgument);
        assert_eq!(refused("order resolve --none").0, ErrorKind::MissingRequiredArgument);
        let both = refused(&format!("order resolve --id {id} --none --payment-intent pi_1"));
        assert_eq!((both.0, both.1), (ErrorKind::ArgumentConflict, 2));
        assert_eq!(refused("order resolve --id 42 --none").0, ErrorKind::ValueValidation);
        // A charge, a client secret (which carries the intent's id), or nothing after the prefix.
        for intent in ["ch_3MtwBwLkdIwHu7ix", "pi_3Mtw_secret_YrKJUKribcBjcG8HVhfZluoGH", "pi_"] {
            let (kind, code, message) =
                refused(&format!("order resolve --id {id} --payment-intent {intent}"));
            assert_eq!((kind, code), (ErrorKind::ValueValidation, 2), "{intent}");
            assert!(message.contains("a PaymentIntent id is pi_ and letters and digits"), "{message}");
        }
    }

    #[test]
    fn no_command_or_an_unknown_one_is_a_usage_error_and_help_and_version_are_not() {
        assert_eq!(refused("").0, ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand);
        assert_eq!(refused("").1, 2);
        let (kind, code, message) = refused("migrations");
        assert_eq!((kind, code), (ErrorKind::InvalidSubcommand, 2));
        assert!(message.contains("similar subcommand exists: 'migrate'"), "{message}");
        assert!(matches!(parse("migrate").unwrap(), Command::Migrate));

        assert_eq!(refused("--version").0, ErrorKind::DisplayVersion);
        assert_eq!(refused("--version").1, 0);
        let (kind, code, help) = refused("dlq --help");
        assert_eq!((kind, code), (ErrorKind::DisplayHelp, 0));
        for command in ["stats", "peek", "redrive"] {
            assert!(help.contains(command), "{help}");
        }
    }
}
