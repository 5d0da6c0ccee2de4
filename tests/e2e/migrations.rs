//! The schema: applied on an empty database, and again without change.

use orderfleet_runtime::db;
use orderfleet_tests::TestDatabase;

async fn schema_fingerprint(pool: &orderfleet_runtime::db::Pool) -> Vec<(String, String, String)> {
    sqlx::query_as(
        "SELECT table_name::text, column_name::text, data_type::text
           FROM information_schema.columns WHERE table_schema = 'public'
          ORDER BY table_name, ordinal_position",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn migrations_apply_to_an_empty_database_and_again_without_change() {
    // Arrange
    let database = TestDatabase::empty().await.unwrap();

    // Act
    db::migrate(&database.pool).await.unwrap();
    let first = schema_fingerprint(&database.pool).await;
    db::migrate(&database.pool).await.unwrap();
    let second = schema_fingerprint(&database.pool).await;

    // Assert
    let tables: std::collections::BTreeSet<_> = first.iter().map(|(t, _, _)| t.as_str()).collect();
    for table in ["products", "orders", "outbox", "outbox_archive", "inbox"] {
        assert!(tables.contains(table), "missing table {table}: {tables:?}");
    }
    assert_eq!(first, second, "a second migrate changed the schema");
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .fetch_one(&database.pool)
        .await
        .unwrap();
    assert_eq!(applied as usize, db::MIGRATOR.iter().count());
    database.drop().await.unwrap();
}

#[tokio::test]
async fn fleetctl_migrate_is_safe_to_repeat() {
    let database = TestDatabase::empty().await.unwrap();
    for _ in 0..2 {
        let out = std::process::Command::new(orderfleet_tests::binary("fleetctl"))
            .arg("migrate")
            .env("DATABASE_URL", &database.url)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    database.drop().await.unwrap();
}

/// An idempotency key holds one order per user.
#[tokio::test]
async fn stock_cannot_go_negative() {
    let database = TestDatabase::migrated().await.unwrap();
    let pool = &database.pool;
    sqlx::query(
        "INSERT INTO products (id, name, price_minor, currency, units_total, stock) VALUES ('sku-1', 'Drop', 500, 'usd', 1, 1)",
    )
        .execute(pool)
        .await
        .unwrap();
    let oversell =
        sqlx::query("UPDATE products SET stock = stock - 2 WHERE id = 'sku-1'").execute(pool).await;
    assert!(oversell.is_err(), "the CHECK on stock let it go below zero");
    let beyond_total = sqlx::query("UPDATE products SET stock = 2 WHERE id = 'sku-1'").execute(pool).await;
    assert!(beyond_total.is_err(), "the CHECK let the units not yet taken exceed the total");

    let insert = "INSERT INTO orders (id, user_id, idempotency_key, request_hash, product_id, quantity,
                                      amount_minor, currency, payment_method, position)
                  VALUES ($1, 'alice', $2, '\\x00', 'sku-1', 1, 500, 'usd', 'pm_card_visa', $3)";
    let place = |key: &'static str, position: i64| {
        sqlx::query(insert).bind(uuid::Uuid::new_v4()).bind(key).bind(position).execute(pool)
    };
    place("key-1", 1).await.unwrap();
    let constraint_broken = |result: Result<sqlx::postgres::PgQueryResult, sqlx::Error>| {
        result.unwrap_err().into_database_error().unwrap().constraint().map(str::to_owned)
    };
    let same_key = constraint_broken(place("key-1", 2).await);
    assert_eq!(same_key.as_deref(), Some("orders_one_per_idempotency_key"));
    let same_place = constraint_broken(place("key-2", 1).await);
    assert_eq!(same_place.as_deref(), Some("orders_one_per_position"), "two orders shared a place in line");
    database.drop().await.unwrap();
}

/// Old ones go whether processed or abandoned; recent ones of either kind stay.
#[tokio::test]
async fn retention_deletes_only_old_inbox_records() {
    // Arrange: four inbox rows, by age and by whether they were processed.
    let database = TestDatabase::migrated().await.unwrap();
    let pool = &database.pool;
    let rows = [
        ("old-processed", "now() - interval '16 days'", "now() - interval '16 days'"),
        ("old-abandoned", "now() - interval '16 days'", "NULL"),
        ("recent-abandoned", "now() - interval '1 day'", "NULL"),
        ("recent-processed", "now() - interval '1 day'", "now() - interval '1 day'"),
    ];
    let mut ids = std::collections::HashMap::new();
    for (name, claimed, processed) in rows {
        let id = uuid::Uuid::new_v4();
        ids.insert(id, name);
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO inbox (consumer, message_id, claimed_until, processed_at) VALUES ('test', $1, {claimed}, {processed})"
        )))
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    }

    // Act
    outbox_relay::retention::sweep_consumer_records(pool, 100).await.unwrap();

    // Assert
    let left: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT message_id FROM inbox").fetch_all(pool).await.unwrap();
    let mut left: Vec<&str> = left.iter().map(|id| ids[id]).collect();
    left.sort();
    assert_eq!(left, ["recent-abandoned", "recent-processed"]);
    database.drop().await.unwrap();
}

#[tokio::test]
async fn the_status_sets_of_the_database_are_the_code_s() {
    use orderfleet::domain::words::status::{OrderStatus, StatusSet};
    let database = TestDatabase::migrated().await.unwrap();

    // The database's enum has the code's statuses, in the code's order.
    let statuses: Vec<OrderStatus> = sqlx::query_scalar("SELECT unnest(enum_range(NULL::order_status))")
        .fetch_all(&database.pool)
        .await
        .unwrap();
    assert_eq!(statuses, OrderStatus::ALL);

    // Each status is in the set the code puts it in, and in no other.
    for status in OrderStatus::ALL {
        let (holds_units, sold, failed, awaiting): (bool, bool, bool, bool) =
            sqlx::query_as("SELECT holds_units($1), sold($1), failed($1), awaiting_authorization($1)")
                .bind(status)
                .fetch_one(&database.pool)
                .await
                .unwrap();
        let set = status.set();
        assert_eq!(
            (holds_units, sold, failed),
            (set == StatusSet::HoldsUnits, set == StatusSet::Sold, set == StatusSet::Failed),
            "{status}"
        );
        assert_eq!(awaiting, status.awaits_authorization(), "{status}");
    }
    database.drop().await.unwrap();
}

/// A status written out in a statement is checked when the statement is prepared, as the
/// query macros prepare every statement at build time (scripts/sqlx-data.sh): the column is the
/// `order_status` enum, so a misspelt status is refused before anything runs, and `make test`
/// fails at its clippy step.
#[tokio::test]
async fn a_misspelt_status_is_refused_when_the_statement_is_prepared() {
    use orderfleet::domain::words::status::OrderStatus;
    use sqlx::{Connection, Executor};
    let database = TestDatabase::migrated().await.unwrap();
    let mut conn = sqlx::PgConnection::connect(&database.url).await.unwrap();
    for status in OrderStatus::ALL {
        let statement = format!("SELECT count(*) FROM orders WHERE status = '{status}'");
        let prepared =
            conn.prepare(sqlx::SqlSafeStr::into_sql_str(sqlx::AssertSqlSafe(statement.clone()))).await;
        assert!(prepared.is_ok(), "{statement}");
    }

    // Act
    let misspelt = conn
        .prepare(sqlx::SqlSafeStr::into_sql_str("SELECT count(*) FROM orders WHERE status = 'payed'"))
        .await;

    // Assert: invalid_text_representation, at prepare time.
    let error = misspelt.expect_err("a status the enum does not have");
    let code = error.as_database_error().and_then(|e| e.code()).map(|c| c.into_owned());
    assert_eq!(code.as_deref(), Some("22P02"), "{error}");
    conn.close().await.unwrap();
    database.drop().await.unwrap();
}
