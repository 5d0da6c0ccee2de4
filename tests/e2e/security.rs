//! The intake's edges under attack (issue 11): one user's flood, a card tester, the per-user
//! limits, and what a decline tells the buyer. docs/security.md maps each threat to its test.

use std::time::{Duration, Instant};

use orderfleet_tests::Fleet;

#[tokio::test(flavor = "multi_thread")]
async fn one_user_firing_200_requests_a_second_gets_429s_while_another_users_order_goes_through() {
    // Arrange: the default limits (5 a second per user, bursts of 10).
    let fleet = Fleet::start_with_default_limits("user-rate-limit", 1).await.unwrap();
    fleet.product("drop", 1000, 500).await.unwrap();

    // Act: 200 requests from one user within a second, each under its own key; meanwhile
    // another user orders once.
    let started = Instant::now();
    let bot = futures::future::join_all((0..200).map(|i| {
        let fleet = &fleet;
        async move {
            tokio::time::sleep(Duration::from_millis(5 * i)).await;
            fleet.post_order("bot", &format!("k{i}"), "drop", 1, "pm_card_visa").await.unwrap()
        }
    }));
    let other = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        fleet.post_order("ola", "k1", "drop", 1, "pm_card_visa").await.unwrap()
    };
    let (bot, other) = tokio::join!(bot, other);
    let took = started.elapsed();

    // Assert: most of the flood refused with SPEC §4's answer, having written nothing.
    let limited: Vec<_> = bot.iter().filter(|a| a.status == 429).collect();
    let accepted = bot.iter().filter(|a| a.status == 202).count();
    println!(
        "security: user-rate-limit requests=200 in {took:?} accepted={accepted} limited={}",
        limited.len()
    );
    assert!(limited.len() >= 150, "only {} of 200 refused in {took:?}", limited.len());
    assert_eq!(accepted + limited.len(), 200, "{:?}", bot.iter().map(|a| a.status).collect::<Vec<_>>());
    for answer in &limited {
        assert_eq!(answer.body["error"]["code"], "rate_limited");
        assert!(answer.retry_after.as_deref().is_some_and(|s| s.parse::<u64>().is_ok_and(|n| n >= 1)));
    }
    assert_eq!(other.status, 202, "another user was refused: {:?}", other.body);
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders").fetch_one(&fleet.pool).await.unwrap();
    assert_eq!(orders, accepted as i64 + 1, "a refused request wrote an order");
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    fleet.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_decline_tells_the_buyer_only_payment_declined_and_a_card_tester_is_stopped_before_stripe() {
    // Arrange
    let fleet = Fleet::start_with_default_limits("card-testing", 1).await.unwrap();
    fleet.product("sku-1", 1000, 50).await.unwrap();
    let cards = [
        "pm_card_chargeDeclined",
        "pm_card_chargeDeclinedInsufficientFunds",
        "pm_card_chargeDeclinedExpiredCard",
        "pm_card_chargeDeclined",
        "pm_card_chargeDeclined",
    ];

    // Act: five declined cards, then a sixth try, then an honest buyer.
    let mut declined = Vec::new();
    for (i, card) in cards.iter().enumerate() {
        declined.push(fleet.post_order("tester", &format!("k{i}"), "sku-1", 1, card).await.unwrap());
    }
    let intents_before = fleet.intents().await.unwrap().len();
    let sixth = fleet.post_order("tester", "k6", "sku-1", 1, "pm_card_visa").await.unwrap();
    let honest = fleet.post_order("ola", "k1", "sku-1", 1, "pm_card_visa").await.unwrap();

    // Assert: every decline says the same, the order and GET included; the issuer's detail is
    // kept where only operators look.
    for answer in &declined {
        assert_eq!(answer.status, 402);
        assert_eq!(answer.body["error"]["code"], "payment_declined");
        let message = answer.body["error"]["message"].as_str().unwrap();
        for leak in ["generic_decline", "insufficient", "expired", "card_declined"] {
            assert!(!message.contains(leak), "the 402 says {leak}: {message}");
        }
    }
    let order_id: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM orders WHERE user_id = 'tester' AND idempotency_key = 'k1'")
            .fetch_one(&fleet.pool)
            .await
            .unwrap();
    let view: serde_json::Value =
        fleet.get_order("tester", &order_id.to_string()).await.unwrap().json().await.unwrap();
    assert_eq!(view["failure_reason"], "payment_declined", "{view}");
    assert!(view.get("decline_detail").is_none(), "{view}");
    let detail: String = sqlx::query_scalar("SELECT decline_detail FROM orders WHERE id = $1")
        .bind(order_id)
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
    assert!(detail.contains("insufficient_funds") || detail.contains("insufficient funds"), "{detail}");
    // The sixth order, even with a good card, is refused before Stripe, and writes nothing.
    assert_eq!(
        (sixth.status, sixth.body["error"]["code"].as_str()),
        (429, Some("rate_limited")),
        "{:?}",
        sixth.body
    );
    assert!(sixth.retry_after.is_some());
    assert_eq!(fleet.intents().await.unwrap().len(), intents_before + 1, "only the honest buyer's intent");
    assert_eq!(honest.status, 202);
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    fleet.stop().await.unwrap();
}
