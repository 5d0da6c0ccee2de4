//! A missing or malformed setting stops a binary at start with one line naming it.

use std::process::Command;

use orderfleet_tests::binary;

fn run_without_environment(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let out =
        Command::new(binary("fleetctl")).args(args).env_clear().envs(env.iter().copied()).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_missing_database_url_is_named() {
    let (ok, stderr) = run_without_environment(&["migrate"], &[]);
    assert!(!ok);
    assert_eq!(stderr.trim(), "fleetctl: configuration error: DATABASE_URL is not set");
}

#[test]
fn a_malformed_database_url_is_named() {
    let (ok, stderr) = run_without_environment(&["migrate"], &[("DATABASE_URL", "mysql://x")]);
    assert!(!ok);
    assert!(stderr.contains("DATABASE_URL is malformed"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

#[test]
fn a_missing_jwt_secret_is_named() {
    let (ok, stderr) = run_without_environment(&["token", "--user", "alice"], &[]);
    assert!(!ok);
    assert_eq!(stderr.trim(), "fleetctl: configuration error: AUTH_JWT_SECRET is not set");
}

#[test]
fn a_token_is_printed_when_the_secret_is_set() {
    let secret = "0123456789abcdef0123456789abcdef";
    let out = Command::new(binary("fleetctl"))
        .args(["token", "--user", "alice"])
        .env_clear()
        .env("AUTH_JWT_SECRET", secret)
        .output()
        .unwrap();
    assert!(out.status.success());
    let token = String::from_utf8(out.stdout).unwrap();
    assert_eq!(token.trim().split('.').count(), 3, "not a JWT: {token}");
}

/// `bin` started with every setting it needs (none of whose services answers) and `name` set
/// to `value`, until it exits.
fn started_with(bin: &str, name: &str, value: &str) -> std::process::Output {
    Command::new(binary(bin))
        .env_clear()
        .env("DATABASE_URL", "postgres://orderfleet@127.0.0.1:1/orderfleet")
        .env("STRIPE_SECRET_KEY", "sk_test_placeholder")
        .env("AUTH_JWT_SECRET", "0123456789abcdef0123456789abcdef")
        .env("STOCK_QUEUE_URL", "http://127.0.0.1:1/000000000000/stock")
        .env("NOTIFICATION_QUEUE_URL", "http://127.0.0.1:1/000000000000/notification")
        .env(name, value)
        .output()
        .unwrap()
}

/// A budget of zero, a negative one or a word.
#[test]
fn a_bad_stripe_budget_stops_each_stripe_caller_with_one_line() {
    for bin in ["order-intake", "stock-worker"] {
        for bad in ["0", "-3", "fast"] {
            let out = started_with(bin, "STRIPE_MAX_REQUESTS_PER_SECOND", bad);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{bin} started with {bad}");
            assert_eq!(stderr.trim().lines().count(), 1, "{bin}: {stderr}");
            assert!(
                stderr.starts_with(&format!(
                    "{bin}: configuration error: STRIPE_MAX_REQUESTS_PER_SECOND is malformed"
                )),
                "{bin} {bad}: {stderr}"
            );
        }
    }
}

/// So does a 3-D Secure deadline that is not a number of seconds.
#[test]
fn a_webhook_secret_not_stripe_s_stops_the_binary_with_one_line() {
    for (bin, name, bad) in [
        ("order-intake", "STRIPE_WEBHOOK_SECRET", "sk_test_not_a_signing_secret"),
        ("order-intake", "STRIPE_WEBHOOK_SECRET", "whsec_new,whsec_"),
        ("order-intake", "PAYMENT_ACTION_TIMEOUT_SECONDS", "ten minutes"),
        ("stock-worker", "PAYMENT_ACTION_TIMEOUT_SECONDS", "-1"),
    ] {
        let out = started_with(bin, name, bad);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bin} started with {name}={bad}");
        assert_eq!(stderr.trim().lines().count(), 1, "{bin}: {stderr}");
        assert!(stderr.starts_with(&format!("{bin}: configuration error: {name} is malformed")), "{stderr}");
        if name == "STRIPE_WEBHOOK_SECRET" {
            assert!(!stderr.contains(bad), "a secret is never printed: {stderr}");
        }
    }
}

#[test]
fn a_token_lives_a_day_at_most() {
    let secret = "0123456789abcdef0123456789abcdef";
    let ttl = |seconds: &str| {
        run_without_environment(
            &["token", "--user", "alice", "--ttl-seconds", seconds],
            &[("AUTH_JWT_SECRET", secret)],
        )
    };
    assert!(ttl("86400").0);
    let (ok, stderr) = ttl("86401");
    assert!(!ok);
    assert!(stderr.contains("--ttl-seconds"), "{stderr}");
}

/// So does Stripe over plain HTTP.
#[test]
fn a_remote_database_without_verified_tls_stops_the_binary_in_one_line() {
    let (ok, stderr) =
        run_without_environment(&["migrate"], &[("DATABASE_URL", "postgres://u:pw@db.example.com/orders")]);
    assert!(!ok);
    assert!(stderr.contains("DATABASE_URL") && stderr.contains("sslmode=verify-full"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    for bin in ["order-intake", "stock-worker"] {
        let out = Command::new(binary(bin))
            .env_clear()
            .env("DATABASE_URL", "postgres://orderfleet@127.0.0.1:1/orderfleet")
            .env("STRIPE_SECRET_KEY", "sk_test_placeholder")
            .env("STRIPE_API_BASE", "http://api.stripe.com")
            .env("AUTH_JWT_SECRET", "0123456789abcdef0123456789abcdef")
            .env("STOCK_QUEUE_URL", "http://127.0.0.1:1/000000000000/stock")
            .env("NOTIFICATION_QUEUE_URL", "http://127.0.0.1:1/000000000000/notification")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bin} started with Stripe over http");
        assert!(stderr.contains("STRIPE_API_BASE") && stderr.contains("https"), "{bin}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{bin}: {stderr}");
    }
}
