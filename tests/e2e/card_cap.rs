//! One card's fair share (SPEC §2 `--max-per-card`, §4, §8.13): no card holds more units of a
//! product than its cap, however many buyers type it in and at however many intakes; an order
//! over it ends `card_limit_reached` with its units back and no PaymentIntent; with no cap, no
//! payment method is read.

use std::time::Duration;

use fleet_harness::eventually;
use orderfleet_tests::Fleet;
use orderfleet_tests::drops::{at, upsert};
use serde_json::Value;

/// Stripe's operation the card is read with.
const READ: &str = "GET /v1/payment_methods/{id}";

/// An order of one unit, as a well-behaved client sends it, to the intake at `url`: its status,
/// body, and whether it was a replay.
async fn ask(fleet: &Fleet, url: &str, user: &str, product: &str, method: &str) -> (u16, Value, bool) {
    let (answer, _) = fleet.post_order(user, "k", product, 1, method).at(url).retrying().await.unwrap();
    (answer.status, answer.body, answer.replayed)
}

/// The product's orders that ended over the cap: (those, those of them with a PaymentIntent).
async fn over_the_cap(fleet: &Fleet, product: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*), count(payment_intent_id) FROM orders
          WHERE product_id = $1 AND status = 'payment_declined' AND failure_reason = 'card_limit_reached'",
    )
    .bind(product)
    .fetch_one(&fleet.pool)
    .await
    .unwrap()
}

/// Ten cards, each typed in by two buyers at once, one at each of two intakes, for a product
/// whose cap lets one card hold one unit: each card gets one order through; the other is told
/// `409 purchase_limit_reached`, again on a retry of its key, and holds nothing.
#[tokio::test(flavor = "multi_thread")]
async fn one_card_at_two_intakes_at_once_passes_its_cap_once() {
    // Arrange: two intakes; twenty payment methods, two of each of ten cards; a card-testing
    // limit of one decline an hour, so that a cap's refusal counted as a decline would show.
    let mut fleet = Fleet::builder("card-cap-race").prepare().await.unwrap();
    fleet.set_env("INTAKE_DECLINES_PER_HOUR", "1");
    fleet.spawn_all(1).await.unwrap();
    let second = fleet.spawn_intake("order-intake-2", &[]).unwrap();
    let urls = [fleet.intake_url.clone(), second];
    for url in &urls {
        fleet.wait_intake_at(url).await.unwrap();
    }
    let said = upsert(&fleet, "sku-c", 40, &["--max-per-card", "1"]).await.unwrap();
    assert!(said.contains("at most 1 per card"), "{said}");
    let mut cards = Vec::new();
    for card in 0..10 {
        let fingerprint = format!("fpCard{card:02}");
        cards.push([
            fleet.card("pm_card_visa", &fingerprint).await.unwrap(),
            fleet.card("pm_card_visa", &fingerprint).await.unwrap(),
        ]);
    }

    // Act: the twenty orders at once, each card's two at the two intakes.
    let asks = cards.iter().enumerate().flat_map(|(card, methods)| {
        let urls = &urls;
        let fleet = &fleet;
        methods.iter().enumerate().map(move |(side, method)| async move {
            (card, side, ask(fleet, &urls[side], &format!("buyer-{card}-{side}"), "sku-c", method).await)
        })
    });
    let answers = futures::future::join_all(asks).await;
    let statuses = fleet.wait_settled(Duration::from_secs(120)).await.unwrap();

    // Assert: per card, one accepted and one refused by the cap.
    for card in 0..10 {
        let mut of_card: Vec<(u16, Option<&str>)> = answers
            .iter()
            .filter(|(c, _, _)| *c == card)
            .map(|(_, _, (status, body, _))| (*status, body["error"]["code"].as_str()))
            .collect();
        of_card.sort_unstable();
        assert_eq!(of_card, [(202, None), (409, Some("purchase_limit_reached"))], "card {card}: {answers:?}");
    }
    assert_eq!(statuses.get("paid"), Some(&10), "{statuses:?}");
    assert_eq!(over_the_cap(&fleet, "sku-c").await, (10, 0), "ten over the cap, none with a PaymentIntent");
    assert_eq!(fleet.intents().await.unwrap().len(), 10, "a PaymentIntent for each order within the cap");
    assert_eq!(fleet.units("sku-c").await.unwrap(), (40, 30, 10), "the refused orders' units back");
    assert_eq!(fleet.stripe_requests_on(READ).await.unwrap(), 20, "one read of the card per promised order");
    // A retry of a refused order's key answers the same, and reads nothing more.
    let (card, side, _) =
        answers.iter().find(|(_, _, (status, _, _))| *status == 409).map(|(c, s, a)| (*c, *s, a)).unwrap();
    let (status, body, replayed) =
        ask(&fleet, &urls[side], &format!("buyer-{card}-{side}"), "sku-c", &cards[card][side]).await;
    assert_eq!(
        (status, body["error"]["code"].as_str(), replayed),
        (409, Some("purchase_limit_reached"), true)
    );
    assert_eq!(fleet.stripe_requests_on(READ).await.unwrap(), 20);
    // Not counted as a card decline: the buyer's next order, with a card of their own, goes through.
    let buyer = format!("buyer-{card}-{side}");
    let (status, body, _) = {
        let answer = fleet.post_order(&buyer, "k2", "sku-c", 1, "pm_card_mastercard").await.unwrap();
        (answer.status, answer.body, answer.replayed)
    };
    assert_eq!(status, 202, "{body}");
    fleet.stop().await.unwrap();
}

/// Two buyers queue with one card for a product whose cap, set after they queued and before the
/// opening, lets a card hold one unit: at the opening both are promised a unit, the first of them
/// checked is paid, the other ends `card_limit_reached` without a PaymentIntent, and its unit
/// goes back on sale, where the next buyer gets it.
#[tokio::test(flavor = "multi_thread")]
async fn a_queued_order_over_its_card_s_cap_ends_without_a_hold() {
    // Arrange: the pre-queue open, the sale in an hour, two units and no cap yet.
    let fleet = Fleet::start("card-cap-queue", 1).await.unwrap();
    upsert(&fleet, "sku-q", 2, &["--opens-at", &at(3600), "--queue-opens-at", &at(-60)]).await.unwrap();
    let one_card = [
        fleet.card("pm_card_visa", "fpShared").await.unwrap(),
        fleet.card("pm_card_visa", "fpShared").await.unwrap(),
    ];
    for (buyer, method) in [("ann", one_card[0].as_str()), ("bob", one_card[1].as_str())] {
        let (status, body, _) = ask(&fleet, &fleet.intake_url, buyer, "sku-q", method).await;
        assert_eq!((status, body["status"].as_str()), (202, Some("queued")), "{body}");
    }
    // The cap, set while they wait.
    upsert(&fleet, "sku-q", 2, &["--max-per-card", "1"]).await.unwrap();

    // Act: the opening, brought forward to 2 s from now (allowed before it happens).
    upsert(&fleet, "sku-q", 2, &["--max-per-card", "1", "--opens-at", &at(2)]).await.unwrap();
    let served = eventually("the queue served", Duration::from_secs(120), || async {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM orders WHERE product_id = 'sku-q'
               AND status IN ('queued', 'pending_authorization', 'requires_action', 'authorized', 'stock_reserved')",
        )
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
        (open == 0).then_some(())
    });
    served.await.unwrap();

    // Assert: one of the card's two paid, the other over the cap with no PaymentIntent.
    let paid: Vec<String> =
        sqlx::query_scalar("SELECT user_id FROM orders WHERE product_id = 'sku-q' AND status = 'paid'")
            .fetch_all(&fleet.pool)
            .await
            .unwrap();
    assert_eq!(paid.len(), 1, "{paid:?}");
    assert_eq!(over_the_cap(&fleet, "sku-q").await, (1, 0));
    assert_eq!(fleet.intents().await.unwrap().len(), 1, "no PaymentIntent for the order over the cap");
    assert_eq!(fleet.holds_without_a_unit().await.unwrap(), 0);
    // The unit it gave back is on sale: the next buyer, with a card of their own, is paid.
    let (status, body, _) = ask(&fleet, &fleet.intake_url, "cid", "sku-q", "pm_card_mastercard").await;
    assert_eq!(status, 202, "{body}");
    let statuses = fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    assert_eq!(statuses.get("paid"), Some(&2), "{statuses:?}");
    fleet.stop().await.unwrap();
}

/// A cap set mid-sale counts the orders bought before it: a buyer whose card already bought a
/// unit is refused the next, though no card was read when the first was sold.
#[tokio::test(flavor = "multi_thread")]
async fn a_cap_set_mid_sale_counts_the_card_s_earlier_orders() {
    // Arrange: ann buys a unit with no cap in force.
    let fleet = Fleet::start("card-cap-later", 1).await.unwrap();
    upsert(&fleet, "sku-l", 5, &[]).await.unwrap();
    let one_card = [
        fleet.card("pm_card_visa", "fpLater").await.unwrap(),
        fleet.card("pm_card_visa", "fpLater").await.unwrap(),
    ];
    let (status, body, _) = ask(&fleet, &fleet.intake_url, "ann", "sku-l", &one_card[0]).await;
    assert_eq!(status, 202, "{body}");
    let statuses = fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    assert_eq!(statuses.get("paid"), Some(&1), "{statuses:?}");
    assert_eq!(fleet.stripe_requests_on(READ).await.unwrap(), 0);

    // Act: the cap, then bob with the same card, and cid with another.
    upsert(&fleet, "sku-l", 5, &["--max-per-card", "1"]).await.unwrap();
    let (bob, bob_body, _) = ask(&fleet, &fleet.intake_url, "bob", "sku-l", &one_card[1]).await;
    let (cid, cid_body, _) = ask(&fleet, &fleet.intake_url, "cid", "sku-l", "pm_card_mastercard").await;

    // Assert: bob is over the cap (ann's unit counted), cid is not.
    assert_eq!(
        (bob, bob_body["error"]["code"].as_str()),
        (409, Some("purchase_limit_reached")),
        "{bob_body}"
    );
    assert_eq!(cid, 202, "{cid_body}");
    assert_eq!(over_the_cap(&fleet, "sku-l").await, (1, 0));
    assert_eq!(fleet.stripe_requests_on(READ).await.unwrap(), 3, "bob's card, ann's once, cid's");
    fleet.stop().await.unwrap();
}

/// With no cap per card, an order costs no read of its payment method.
#[tokio::test(flavor = "multi_thread")]
async fn with_no_card_cap_no_payment_method_is_read() {
    // Arrange
    let fleet = Fleet::start("card-cap-none", 1).await.unwrap();
    upsert(&fleet, "sku-n", 5, &["--max-per-buyer", "1"]).await.unwrap();

    // Act: three buyers, one card.
    let card = [
        fleet.card("pm_card_visa", "fpOne").await.unwrap(),
        fleet.card("pm_card_visa", "fpOne").await.unwrap(),
        fleet.card("pm_card_visa", "fpOne").await.unwrap(),
    ];
    for (i, method) in card.iter().enumerate() {
        let (status, body, _) = ask(&fleet, &fleet.intake_url, &format!("buyer-{i}"), "sku-n", method).await;
        assert_eq!(status, 202, "{body}");
    }
    let statuses = fleet.wait_settled(Duration::from_secs(60)).await.unwrap();

    // Assert
    assert_eq!(statuses.get("paid"), Some(&3), "{statuses:?}");
    assert_eq!(fleet.stripe_requests_on(READ).await.unwrap(), 0, "no payment method read");
    fleet.stop().await.unwrap();
}
