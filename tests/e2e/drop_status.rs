//! `fleetctl drop status` (SPEC §2), read as its operator reads it: `--json` and `--watch`
//! (in tmux, its screen read with `capture-pane`) show the figures the database holds.

use std::time::Duration;

use fleet_harness::{binary, eventually};
use orderfleet_tests::Fleet;
use serde_json::Value;

/// A drop of five units: eight buyers, five paid, three told `sold_out`.
async fn a_sold_out_drop(fleet: &Fleet, product: &str) {
    fleet
        .fleetctl(
            &[
                "product",
                "upsert",
                "--id",
                product,
                "--name",
                product,
                "--price",
                "1500",
                "--currency",
                "usd",
            ]
            .into_iter()
            .chain(["--stock", "5"])
            .collect::<Vec<_>>(),
            &[],
        )
        .await
        .unwrap();
    for i in 0..8 {
        fleet.post_order(&format!("buyer-{i}"), "k", product, 1, "pm_card_visa").retrying().await.unwrap();
    }
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
}

/// The product's units as the database has them: total, promised, sold, left.
async fn units(fleet: &Fleet, product: &str) -> (i64, i64, i64, i64) {
    sqlx::query_as(
        "SELECT p.units_total::int8, p.units_promised::int8,
                (SELECT COALESCE(sum(quantity), 0) FROM orders o WHERE o.product_id = p.id AND sold(o.status))::int8,
                (p.units_total - p.units_promised)::int8
           FROM products p WHERE p.id = $1",
    )
    .bind(product)
    .fetch_one(&fleet.pool)
    .await
    .unwrap()
}

/// `--json` prints the figures the database holds, and the sold-out answers the intake gave.
#[tokio::test(flavor = "multi_thread")]
async fn drop_status_json_gives_the_database_s_figures() {
    // Arrange
    let fleet = Fleet::start("drop-status-json", 1).await.unwrap();
    a_sold_out_drop(&fleet, "sku-s").await;

    // Act: three more buyers told sold_out, and the screen read within the ten seconds the
    // answers a second are counted over (the intake adds its count once a second).
    for i in 8..11 {
        let answer = fleet.post_order(&format!("buyer-{i}"), "k", "sku-s", 1, "pm_card_visa").await.unwrap();
        assert_eq!(answer.body["error"]["code"], "sold_out", "{answer:?}");
    }
    let status: Value = eventually("the sold-out answers counted", Duration::from_secs(8), || async {
        let printed = fleet.fleetctl(&["drop", "status", "--id", "sku-s", "--json"], &[]).await.unwrap();
        let status: Value = serde_json::from_str(&printed).unwrap();
        (status["sold_out_answers_per_second"].as_f64() > Some(0.0)).then_some(status)
    })
    .await
    .unwrap();

    // Assert
    let (total, promised, sold, left) = units(&fleet, "sku-s").await;
    let u = &status["units"];
    assert_eq!(
        (u["total"].as_i64(), u["promised"].as_i64(), u["sold"].as_i64(), u["left"].as_i64()),
        (Some(total), Some(promised), Some(sold), Some(left)),
        "{status:#}"
    );
    assert_eq!((total, sold, left), (5, 5, 0));
    assert_eq!(status["state"], "sold_out", "{status:#}");
    assert_eq!(status["orders_by_status"], serde_json::json!({ "paid": 5 }), "{status:#}");
    assert_eq!(status["queues"].as_array().map(Vec::len), Some(2), "both queues: {status:#}");
    assert_eq!((status["stuck_orders"].as_i64(), status["dead_outbox_rows"].as_i64()), (Some(0), Some(0)));
    let create = &status["stripe"][0];
    assert_eq!(create["operation"], "POST /v1/payment_intents", "{status:#}");
    assert_eq!(create["rate_limited_last_minute"], 0, "{status:#}");
    fleet.stop().await.unwrap();
}

/// `--watch` in tmux, as a person runs it: the screen shows the database's units, follows a
/// raise of the stock within its redraw, and Ctrl-C ends it.
#[tokio::test(flavor = "multi_thread")]
async fn drop_status_watch_in_tmux_shows_the_database_s_figures_and_stops_on_ctrl_c() {
    // Arrange: the drop, and the screen in a tmux session of the test's own server.
    let fleet = Fleet::start("drop-status-watch", 1).await.unwrap();
    a_sold_out_drop(&fleet, "sku-w").await;
    let socket = format!("orderfleet-{}", uuid::Uuid::new_v4().simple());
    let env: Vec<String> = fleet.operator_env().into_iter().map(|(k, v)| format!("{k}='{v}'")).collect();
    let command =
        format!("env -i {} {} drop status --id sku-w --watch", env.join(" "), binary("fleetctl").display());
    let tmux = |args: &[&str]| {
        std::process::Command::new("tmux").args(["-L", &socket]).args(args).output().expect("tmux runs")
    };
    let started = tmux(&["new-session", "-d", "-s", "drop", "-x", "160", "-y", "40", &command]);
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
    let screen = || String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", "drop"]).stdout).into_owned();
    let units_line =
        |screen: &str| screen.lines().find(|l| l.trim_start().starts_with("units")).map(str::to_owned);

    // Act and assert: the screen's units are the database's.
    let shown = eventually("the screen drawn", Duration::from_secs(20), || async { units_line(&screen()) })
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", screen()));
    let (total, promised, sold, left) = units(&fleet, "sku-w").await;
    assert_eq!(
        shown.split_whitespace().collect::<Vec<_>>(),
        [
            "units",
            "total",
            &total.to_string(),
            "promised",
            &promised.to_string(),
            "sold",
            &sold.to_string(),
            "left",
            &left.to_string()
        ],
        "{}",
        screen()
    );
    assert!(screen().contains("SOLD OUT"), "{}", screen());
    assert!(screen().contains("paid 5"), "{}", screen());

    // A raise of the stock shows within a redraw or two.
    fleet
        .fleetctl(
            &[
                "product",
                "upsert",
                "--id",
                "sku-w",
                "--name",
                "sku-w",
                "--price",
                "1500",
                "--currency",
                "usd",
            ]
            .into_iter()
            .chain(["--stock", "7"])
            .collect::<Vec<_>>(),
            &[],
        )
        .await
        .unwrap();
    let raised = eventually("the raise shown", Duration::from_secs(5), || async {
        units_line(&screen()).filter(|l| l.contains("total 7"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", screen()));
    let (total, promised, sold, left) = units(&fleet, "sku-w").await;
    assert_eq!(
        raised.trim(),
        format!("units        total {total}  promised {promised}  sold {sold}  left {left}")
    );
    assert!(screen().contains("OPEN"), "{}", screen());

    // Ctrl-C ends it, and the pane with it.
    tmux(&["send-keys", "-t", "drop", "C-c"]);
    let ended = eventually("the screen stopped", Duration::from_secs(5), || async {
        (!tmux(&["has-session", "-t", "drop"]).status.success()).then_some(())
    })
    .await;
    tmux(&["kill-server"]);
    ended.unwrap();
    fleet.stop().await.unwrap();
}
