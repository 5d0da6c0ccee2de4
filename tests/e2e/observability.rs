//! What an operator sees of the fleet: one order's trace through every process's log, its
//! spans exported over OTLP when asked, and the outbox's state as CloudWatch metrics.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::Duration;

use orderfleet_tests::Fleet;
use serde_json::Value;

/// The processes an order passes through, by their log's label.
const PROCESSES: [&str; 4] = ["order-intake", "outbox-relay", "stock-worker-0", "notification-worker"];

/// A caller's trace context, as an upstream service would send it.
const CALLER_TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// Every JSON line of `label`'s log; a line that is not JSON, or that names `order_id` or
/// `trace_id` twice (a span's field and the event's), fails the test (LOG_FORMAT=json).
fn json_lines(log_dir: &Path, label: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(log_dir.join(format!("{label}.log"))).unwrap();
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            for key in ["\"order_id\":", "\"trace_id\":"] {
                assert!(l.matches(key).count() <= 1, "{label}: {key} twice: {l}");
            }
            serde_json::from_str(l).unwrap_or_else(|e| panic!("{label}: not a JSON line ({e}): {l}"))
        })
        .collect()
}

/// The trace ids on the lines of `label` about `order_id`; `None` for a line without one.
fn trace_ids_of(log_dir: &Path, label: &str, order_id: &str) -> Vec<Option<String>> {
    json_lines(log_dir, label)
        .into_iter()
        .filter(|line| line["order_id"].as_str() == Some(order_id))
        .map(|line| line["trace_id"].as_str().map(str::to_owned))
        .collect()
}

/// POSTs an order paid with `card`, with the caller's `traceparent` when given; the answer.
async fn order_with(fleet: &Fleet, user: &str, key: &str, card: &str, traceparent: Option<&str>) -> Value {
    let mut request = reqwest::Client::new()
        .post(format!("{}/v1/orders", fleet.intake_url))
        .bearer_auth(fleet.token(user))
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(format!(r#"{{"product_id":"sku-1","quantity":1,"payment_method":"{card}"}}"#));
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    request.send().await.unwrap().json().await.unwrap()
}

/// POSTs an order the card pays; its order id.
async fn order(fleet: &Fleet, user: &str, key: &str, traceparent: Option<&str>) -> String {
    let body = order_with(fleet, user, key, "pm_card_visa", traceparent).await;
    body["order_id"].as_str().unwrap_or_else(|| panic!("not accepted: {body}")).to_owned()
}

/// It is on the order's notifications too.
#[tokio::test(flavor = "multi_thread")]
async fn one_order_s_trace_id_is_on_every_line_about_it_in_every_process() {
    // Arrange: the fleet logging JSON, its intake trusting callers' traces (behind a gateway of
    // the operator's own); one order continues a caller's trace, one starts its own.
    let mut fleet = Fleet::prepare("trace-context").await.unwrap();
    fleet.set_env("LOG_FORMAT", "json");
    fleet.set_env("INTAKE_CALLER_TRACE", "continue");
    fleet.spawn_all(1).await.unwrap();
    fleet.product("sku-1", 1500, 10).await.unwrap();

    // Act: the second order's request is retried with its key (it must log under the order's
    // trace, not a new one), and a third order is declined (its lines in the intake only).
    let continued = order(&fleet, "alice", "k-1", Some(CALLER_TRACEPARENT)).await;
    let started = order(&fleet, "bob", "k-2", None).await;
    assert_eq!(order(&fleet, "bob", "k-2", None).await, started);
    let declined = order_with(&fleet, "carol", "k-3", "pm_card_chargeDeclined", None).await;
    assert_eq!(declined["error"]["code"], "payment_declined", "{declined}");
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    let notifications = fleet.notification_messages(4, Duration::from_secs(30)).await.unwrap();
    let log_dir = fleet.log_dir().to_owned();
    fleet.stop().await.unwrap();

    // Assert: the new trace's id, as the intake logged it.
    let intake_ids: BTreeSet<Option<String>> =
        trace_ids_of(&log_dir, "order-intake", &started).into_iter().collect();
    assert_eq!(intake_ids.len(), 1, "one trace per request: {intake_ids:?}");
    let new_trace = intake_ids.into_iter().next().flatten().expect("the intake's lines carry a trace_id");
    assert!(new_trace.len() == 32 && new_trace.chars().all(|c| c.is_ascii_hexdigit()), "{new_trace}");
    assert_ne!(new_trace, CALLER_TRACE_ID);
    // Every process logged each order, and every line about it carries the order's trace id.
    for (order_id, trace_id) in [(&continued, CALLER_TRACE_ID), (&started, new_trace.as_str())] {
        for label in PROCESSES {
            let ids = trace_ids_of(&log_dir, label, order_id);
            assert!(!ids.is_empty(), "{label} logged nothing about order {order_id}");
            assert!(
                ids.iter().all(|id| id.as_deref() == Some(trace_id)),
                "{label}: order {order_id}'s lines carry {ids:?}, not only {trace_id}"
            );
        }
    }
    // SNS got each notification with its order's traceparent.
    let mut by_order: HashMap<String, Vec<String>> = HashMap::new();
    for outer in &notifications {
        let inner: Value = serde_json::from_str(outer["Message"].as_str().unwrap()).unwrap();
        let traceparent = outer["MessageAttributes"]["traceparent"]["Value"].as_str().unwrap_or("none");
        by_order
            .entry(inner["order_id"].as_str().unwrap().to_owned())
            .or_default()
            .push(traceparent.to_owned());
    }
    for (order_id, trace_id) in [(&continued, CALLER_TRACE_ID), (&started, new_trace.as_str())] {
        let traceparents = &by_order[order_id.as_str()];
        assert_eq!(traceparents.len(), 2, "accepted and paid: {traceparents:?}");
        assert!(
            traceparents.iter().all(|t| t.split('-').nth(1) == Some(trace_id)),
            "{order_id}: {traceparents:?}"
        );
    }
    // No process wrote a line with a key twice (checked while reading every log).
    for label in PROCESSES {
        json_lines(&log_dir, label);
    }
}

/// It is kept as a link.
#[tokio::test(flavor = "multi_thread")]
async fn by_default_a_caller_s_traceparent_starts_no_trace_of_ours() {
    // Arrange: the intake at its default: a client's trace context is not trusted.
    let mut fleet = Fleet::prepare("trace-untrusted").await.unwrap();
    fleet.set_env("LOG_FORMAT", "json");
    fleet.spawn_all(1).await.unwrap();
    fleet.product("sku-1", 1500, 10).await.unwrap();

    // Act: a client sends its own traceparent, sampled flag set.
    let order_id = order(&fleet, "alice", "k-1", Some(CALLER_TRACEPARENT)).await;
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    let stored: String = sqlx::query_scalar("SELECT traceparent FROM orders WHERE id = $1::uuid")
        .bind(&order_id)
        .fetch_one(&fleet.pool)
        .await
        .unwrap();
    let log_dir = fleet.log_dir().to_owned();
    fleet.stop().await.unwrap();

    // Assert: the order's trace is the intake's own, and the caller's id is on the request's
    // line as a link, for whoever wants to join the two.
    assert_ne!(stored.split('-').nth(1), Some(CALLER_TRACE_ID), "the caller chose the trace: {stored}");
    let answered: Vec<Value> = json_lines(&log_dir, "order-intake")
        .into_iter()
        .filter(|l| l["order_id"].as_str() == Some(order_id.as_str()) && l["caller_trace_id"].is_string())
        .collect();
    assert!(!answered.is_empty(), "no intake line about the order names the caller's trace");
    for line in answered {
        assert_eq!(line["caller_trace_id"], CALLER_TRACE_ID, "{line}");
        assert_ne!(line["trace_id"], CALLER_TRACE_ID, "{line}");
    }
}

/// A stand-in OpenTelemetry collector: takes every OTLP/HTTP request, answers 200, and keeps
/// its path and body.
async fn collector() -> (String, tokio::sync::mpsc::UnboundedReceiver<(String, Vec<u8>)>) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut stream = BufReader::new(stream);
                loop {
                    let mut request_line = String::new();
                    if stream.read_line(&mut request_line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let path = request_line.split_whitespace().nth(1).unwrap_or("").to_owned();
                    let mut length = 0usize;
                    loop {
                        let mut header = String::new();
                        stream.read_line(&mut header).await.unwrap();
                        if header.trim().is_empty() {
                            break;
                        }
                        if let Some((name, value)) = header.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; length];
                    stream.read_exact(&mut body).await.unwrap();
                    let _ = tx.send((path, body));
                    let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    stream.get_mut().write_all(answer.as_bytes()).await.unwrap();
                }
            });
        }
    });
    (url, rx)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// With an OTLP endpoint set, under the caller's trace.
#[tokio::test(flavor = "multi_thread")]
async fn every_process_exports_the_order_s_spans_over_otlp() {
    // Arrange: every binary exporting to a collector of the test's own.
    let (endpoint, mut exported) = collector().await;
    let mut fleet = Fleet::prepare("otlp-export").await.unwrap();
    fleet.set_env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint);
    // The caller is trusted here (the default starts a trace of our own, tested above).
    fleet.set_env("INTAKE_CALLER_TRACE", "continue");
    fleet.spawn_all(1).await.unwrap();
    fleet.product("sku-1", 1500, 10).await.unwrap();

    // Act: one order, paid; the stop flushes every process's spans.
    order(&fleet, "alice", "k-1", Some(CALLER_TRACEPARENT)).await;
    fleet.wait_settled(Duration::from_secs(60)).await.unwrap();
    assert_eq!(fleet.notifications(2, Duration::from_secs(30)).await.unwrap().len(), 2);
    fleet.stop().await.unwrap();

    // Assert: each process sent spans in the caller's trace (the id travels as raw bytes in
    // the protobuf body, beside the process's service name).
    let trace_id: Vec<u8> =
        (0..16).map(|i| u8::from_str_radix(&CALLER_TRACE_ID[2 * i..2 * i + 2], 16).unwrap()).collect();
    let mut bodies = Vec::new();
    while let Ok((path, body)) = exported.try_recv() {
        assert_eq!(path, "/v1/traces");
        bodies.push(body);
    }
    for service in ["order-intake", "outbox-relay", "stock-worker", "notification-worker"] {
        assert!(
            bodies.iter().any(|b| contains(b, service.as_bytes()) && contains(b, &trace_id)),
            "{service} exported no span of the caller's trace ({} requests in all)",
            bodies.len()
        );
    }
}

/// The maximum of `metric` in `namespace` over the last ten minutes, as the alarms read it.
fn cloudwatch_maximum(namespace: &str, metric: &str) -> Option<f64> {
    let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into());
    let endpoint = orderfleet_tests::stack_var("AWS_ENDPOINT_URL");
    let now = chrono::Utc::now();
    let out = std::process::Command::new(crate::faults::aws_cli())
        .args(["--endpoint-url", &endpoint, "--region", &region, "--output", "json"])
        .args(["cloudwatch", "get-metric-statistics", "--namespace", namespace, "--metric-name", metric])
        .args(["--statistics", "Maximum", "--period", "60"])
        .args(["--start-time", &(now - chrono::TimeDelta::minutes(10)).to_rfc3339()])
        .args(["--end-time", &(now + chrono::TimeDelta::minutes(1)).to_rfc3339()])
        .output()
        .unwrap();
    assert!(out.status.success(), "get-metric-statistics: {}", String::from_utf8_lossy(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    answer["Datapoints"].as_array()?.iter().filter_map(|d| d["Maximum"].as_f64()).reduce(f64::max)
}

/// Its dead rows, and the age of its oldest pending row.
#[tokio::test(flavor = "multi_thread")]
async fn the_relay_puts_the_outbox_s_state_to_cloudwatch_for_the_alarms() {
    // Arrange: a row the relay gave up on (dead) and a row written an hour ago and not yet
    // due (it waits, pending); the relay publishing every second to a namespace of its own.
    let namespace = format!("orderfleet/test-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let mut fleet = Fleet::prepare("outbox-gauges").await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, destination, payload,
                             status, retry_count, last_error_code, last_error_reason)
         VALUES (gen_random_uuid(), 'order', gen_random_uuid(), 'order.paid', 'notification', '{}',
                 'dead', 1, 'message_too_large', 'the message is too large for SQS');
         INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, destination, payload,
                             created_at, next_attempt_at)
         VALUES (gen_random_uuid(), 'order', gen_random_uuid(), 'order.paid', 'notification', '{}',
                 now() - interval '1 hour', now() + interval '1 hour');
         INSERT INTO products (id, name, price_minor, currency, units_total, stock)
         VALUES ('sku-1', 'sku-1', 1000, 'usd', 10, 10);
         INSERT INTO orders (id, user_id, idempotency_key, request_hash, product_id, quantity, amount_minor,
                             currency, payment_method, position, created_at)
         VALUES (gen_random_uuid(), 'ann', 'k-stuck', '\\x00', 'sku-1', 1, 1000, 'usd', 'pm_card_visa', 1,
                 now() - interval '5 minutes'),
                (gen_random_uuid(), 'bob', 'k-fresh', '\\x00', 'sku-1', 1, 1000, 'usd', 'pm_card_visa', 2, now());",
    )
    .execute(&fleet.pool)
    .await
    .unwrap();

    // Act
    let gauges = [("CLOUDWATCH_NAMESPACE", namespace.as_str()), ("OUTBOX_METRICS_INTERVAL_SECONDS", "1")];
    fleet.spawn("outbox-relay", "outbox-relay", &gauges).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let (dead, age, stuck) = loop {
        let dead = cloudwatch_maximum(&namespace, "OutboxDeadRows");
        let age = cloudwatch_maximum(&namespace, "OutboxOldestPendingAgeSeconds");
        let stuck = cloudwatch_maximum(&namespace, "OrdersPendingAuthorizationStuck");
        if dead.is_some_and(|d| d >= 1.0) && stuck.is_some() || std::time::Instant::now() > deadline {
            break (dead, age, stuck);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    fleet.stop().await.unwrap();

    // Assert
    assert_eq!(dead, Some(1.0), "OutboxDeadRows");
    let age = age.expect("OutboxOldestPendingAgeSeconds was published");
    assert!((3500.0..3700.0).contains(&age), "the oldest pending row is an hour old: {age}");
    // One order pending five minutes with no lease is stuck; one pending a moment is not.
    assert_eq!(stuck, Some(1.0), "OrdersPendingAuthorizationStuck");
}
