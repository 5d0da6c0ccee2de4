//! The schema: applied on an empty database, and again without change.

use orderfleet::db;
use orderfleet_tests::TestDatabase;

async fn schema_fingerprint(pool: &sqlx::PgPool) -> Vec<(String, String, String)> {
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

#[tokio::test]
async fn stock_cannot_go_negative_and_an_idempotency_key_holds_one_order_per_user() {
    let database = TestDatabase::migrated().await.unwrap();
    let pool = &database.pool;
    sqlx::query("INSERT INTO products (id, name, price_minor, currency, stock) VALUES ('sku-1', 'Drop', 500, 'usd', 1)")
        .execute(pool)
        .await
        .unwrap();
    let oversell =
        sqlx::query("UPDATE products SET stock = stock - 2 WHERE id = 'sku-1'").execute(pool).await;
    assert!(oversell.is_err(), "the CHECK on stock let it go below zero");

    let insert = "INSERT INTO orders (id, user_id, idempotency_key, request_hash, product_id, quantity,
                                      amount_minor, currency, payment_method)
                  VALUES ($1, 'alice', 'key-1', '\\x00', 'sku-1', 1, 500, 'usd', 'pm_card_visa')";
    sqlx::query(insert).bind(uuid::Uuid::new_v4()).execute(pool).await.unwrap();
    let second = sqlx::query(insert).bind(uuid::Uuid::new_v4()).execute(pool).await;
    let code = second.unwrap_err().into_database_error().unwrap().code().unwrap().into_owned();
    assert_eq!(code, "23505", "a second order under the same key was not a unique violation");
    database.drop().await.unwrap();
}
