//! The fault-injection suite (SPEC §8 under failure): crashes at the worst moments, Stripe
//! failing in every way stripe-sim can, SQS and PostgreSQL cut away behind a proxy, poison
//! messages and their redrive, SIGTERM in the middle of a burst, a permanent outbox failure.
//! Every case ends by auditing every guarantee from stripe-sim's ledger, the database and
//! SNS, and prints a `fault-suite:` line of figures (docs/failure-modes.md collects them).
//!
//! A module per thing that fails: [`processes`], [`stripe`], [`postgres`], [`sqs`], [`sns`],
//! and [`poison`] messages. Each imports this module's helpers and imports with `super::*`.

mod poison;
mod postgres;
mod processes;
mod sns;
mod sqs;
mod stripe;

use std::net::SocketAddr;
use std::time::Duration;

use fleet_harness::eventually;
use orderfleet_tests::Fleet;
use orderfleet_tests::audit::Audit;

/// Places an order, retrying while the intake is still starting (connection refused).
async fn place(fleet: &Fleet, user: &str, key: &str, product: &str) -> fleet_harness::Answer {
    let answered = || async { fleet.post_order(user, key, product, 1, "pm_card_visa").await.ok() };
    eventually("the intake answering", Duration::from_secs(20), answered).await.unwrap()
}

/// Places an order as a client in a burst does: as [`place`], and again with the same key after
/// a `503`, the Stripe budget's brief wait run out while the burst outruns the fleet's create
/// rate (SPEC §3).
async fn place_in_a_burst(fleet: &Fleet, user: &str, key: &str, product: &str) -> fleet_harness::Answer {
    let answered = || async {
        fleet.post_order(user, key, product, 1, "pm_card_visa").await.ok().filter(|a| a.status != 503)
    };
    eventually("the intake answering", Duration::from_secs(30), answered).await.unwrap()
}

/// An order of one unit awaiting 3-D Secure, so that it is still pending when the test cuts
/// the stock; returns its id. (An order authorized before any cut takes its unit in its
/// commit, and a cut cannot take that back.)
async fn place_awaiting_authentication(fleet: &Fleet, user: &str, key: &str, product: &str) -> String {
    let card = "pm_card_threeDSecure2Required";
    let answered = || async { fleet.post_order(user, key, product, 1, card).await.ok() };
    let answer = eventually("the intake answering", Duration::from_secs(20), answered).await.unwrap();
    assert_eq!((answer.status, answer.body["status"].as_str()), (202, Some("requires_action")), "{answer:?}");
    answer.body["order_id"].as_str().unwrap().to_owned()
}

/// A queue's messages: (visible, in flight).
pub(crate) async fn depth(fleet: &Fleet, queue_url: &str) -> (u64, u64) {
    fleet.queue_depth(queue_url).await.unwrap()
}

async fn dlqs_are_empty(fleet: &Fleet) -> bool {
    depth(fleet, &fleet.stock.dlq_url).await == (0, 0)
        && depth(fleet, &fleet.notification.dlq_url).await == (0, 0)
}

/// A trigger that refuses the buyer `refused`'s orders their move to `status` (a constant of
/// the test), as a constraint or a bad row would: a permanent database error (23514).
async fn refuse_the_move_to(fleet: &Fleet, status: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE FUNCTION refuse_{status}() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.user_id = 'refused' AND NEW.status = '{status}' THEN
                 RAISE EXCEPTION 'refused by a test trigger' USING ERRCODE = 'check_violation';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_{status} BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION refuse_{status}();"
    )))
    .execute(&fleet.pool)
    .await
    .unwrap();
}

/// The cause fixed: [`refuse_the_move_to`]'s trigger dropped.
async fn allow_the_move_to(fleet: &Fleet, status: &str) {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TRIGGER refuse_{status} ON orders")))
        .execute(&fleet.pool)
        .await
        .unwrap();
}

/// Audits, prints the figures, asserts every guarantee.
async fn audit(fleet: &Fleet, case: &str, product: &str, faults: usize, expected_notes: usize) -> Audit {
    // A bound, not a wait: it returns once they are all in. Generous, because a notification
    // a killed worker held comes back only after its claim (30 s) and its message's visibility
    // run out, and a loaded machine adds to both (60 s once fell 10 notifications short).
    let notes = fleet.notifications(expected_notes, Duration::from_secs(120)).await.unwrap();
    let audit = Audit::of(fleet, product, &notes).await.unwrap();
    println!("{}", audit.figures(case, faults));
    audit.assert_guarantees();
    audit
}

/// The AWS CLI that `make up` installed with LocalStack (its virtualenv), for what an operator
/// types or the console calls.
pub(crate) fn aws_cli() -> std::path::PathBuf {
    let host_sh = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../localstack/host.sh");
    let out = std::process::Command::new(host_sh).arg("venv").output().expect("localstack/host.sh venv");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("bin/aws")
}

fn localstack_addr() -> SocketAddr {
    let url = orderfleet_tests::stack_var("AWS_ENDPOINT_URL");
    let host = url.trim_start_matches("http://").trim_end_matches('/');
    host.replace("localhost", "127.0.0.1").parse().expect("AWS_ENDPOINT_URL is http://HOST:PORT")
}

/// An intake that aborts right after Stripe authorizes, before it commits. Its requests are cut
/// off at 3 s, so its lease is 8 s (the request timeout and the 5 s margin), and a retry or the
/// sweeper may take the order over soon ([`the_dead_intake_s_lease_lapsed`]).
fn spawn_intake_that_dies_after_authorizing(fleet: &mut Fleet) {
    let timeout = ("INTAKE_REQUEST_TIMEOUT_SECONDS", "3");
    fleet
        .spawn("doomed-intake", "order-intake", &[("ORDERFLEET_FAILPOINTS", "after_authorize"), timeout])
        .unwrap();
}

/// Waits until no order holds a lease any more: the dead intake's lapses by the clock.
async fn the_dead_intake_s_lease_lapsed(fleet: &Fleet) {
    eventually("the dead intake's lease lapsed", Duration::from_secs(30), || async {
        let held: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM orders WHERE intake_lease_until >= now())")
                .fetch_one(&fleet.pool)
                .await
                .unwrap();
        (!held).then_some(())
    })
    .await
    .unwrap();
}
