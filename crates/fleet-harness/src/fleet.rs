//! The whole fleet as processes: stripe-sim and the real binaries — order-intake,
//! outbox-relay, stock-worker(s), notification-worker — started against a [`Stack`] (a
//! database, two queues, a topic), with the topic observed through a subscribed queue. Each
//! process logs to `<log_dir>/<label>.log`; [`Fleet::stop`] sends SIGTERM and waits, and a
//! dropped fleet kills what is left.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use aws_sdk_sqs::types::QueueAttributeName;
use orderfleet::domain::tokens::{self, UserId};
use serde_json::Value;
use tokio::process::{Child, Command};

use orderfleet::runtime::aws::Aws;
use sqlx::PgPool;

use crate::binary;

/// Where the fleet runs: its database, queues and topic, and how to reach AWS (LocalStack).
#[derive(Debug, Clone)]
pub struct Stack {
    /// `DATABASE_URL`.
    pub database_url: String,
    /// `STOCK_QUEUE_URL`.
    pub stock_queue_url: String,
    /// `NOTIFICATION_QUEUE_URL`.
    pub notification_queue_url: String,
    /// `NOTIFICATION_TOPIC_ARN`.
    pub topic_arn: String,
    /// AWS_REGION, the credentials and AWS_ENDPOINT_URL, passed to every process as they are.
    pub aws_env: Vec<(String, String)>,
}

impl Stack {
    /// The AWS variables of this process (from `.run/stack.env`, through the Makefile).
    pub fn aws_env_from_process() -> Vec<(String, String)> {
        ["AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL"]
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
            .collect()
    }
}

/// The fleet as processes on this machine (or in its image), with stripe-sim, an observer
/// queue on the topic, and what a test needs to drive and inspect them.
pub struct Fleet {
    /// Its name: its logs' folder and its queues'.
    pub name: String,
    /// What it runs against.
    pub stack: Stack,
    /// A pool on its database, for the test's own reads and writes.
    pub pool: PgPool,
    /// The observer queue: the topic's notifications, as SNS delivered them.
    pub observer_url: String,
    observer_subscription: String,
    /// stripe-sim's base URL.
    pub stripe_url: String,
    /// The intake's base URL.
    pub intake_url: String,
    /// The secret its tokens are signed with.
    pub jwt_secret: String,
    /// An SQS client on LocalStack.
    pub sqs: aws_sdk_sqs::Client,
    /// An HTTP client for the intake and stripe-sim.
    pub http: reqwest::Client,
    env: Vec<(String, String)>,
    children: Vec<(String, Child)>,
    /// Each fleet process's `/metrics` URL, by label.
    metrics_urls: Vec<(String, String)>,
    log_dir: PathBuf,
    /// A `buildah` container of the fleet's image the binaries run in, or none (this machine).
    image_container: Option<String>,
}

/// A loopback port nobody listens on right now, for a child process to bind. Taken from below
/// the kernel's ephemeral range (32768 and up), where no outgoing connection or port-0 bind
/// can take it between our check and the child's bind. The test runner runs each test in a
/// process of its own, so a port is claimed across processes too: by an exclusive lock on a
/// file named after it, in a directory of this user's (`$TMPDIR/orderfleet-ports-<uid>`). The
/// kernel lets a lock go when its process ends, however it ends; a process keeps its latest
/// [`PORT_CLAIMS_KEPT`] claims (a test's fleet takes a few dozen ports), so a long run in one
/// process (`cargo test`) does not run out of file descriptors. Each call moves on to the next
/// port, from a start that differs per process.
pub fn free_port() -> u16 {
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    static CLAIMS: Mutex<VecDeque<std::fs::File>> = Mutex::new(VecDeque::new());
    // SAFETY: getuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    let uid = unsafe { libc::getuid() };
    let dir = std::env::temp_dir().join(format!("orderfleet-ports-{uid}"));
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("the port claims' directory {}: {e}", dir.display()));
    let start = 20_000 + (std::process::id() % 10_000) as u16;
    let _ = NEXT.compare_exchange(0, start, Ordering::Relaxed, Ordering::Relaxed);
    loop {
        let port = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = if port >= 32_000 { 20_000 + port % 12_000 } else { port };
        let path = dir.join(port.to_string());
        let claim = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("the port claim {}: {e}", path.display()));
        if claim.try_lock().is_ok() && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            let mut claims = CLAIMS.lock().expect("the port claims");
            claims.push_back(claim);
            if claims.len() > PORT_CLAIMS_KEPT {
                claims.pop_front();
            }
            return port;
        }
    }
}

/// How many port claims one process keeps ([`free_port`]).
pub const PORT_CLAIMS_KEPT: usize = 256;

/// One answer of the intake.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// Whether `Idempotent-Replayed: true` came back.
    pub replayed: bool,
    /// The `Retry-After` header, as sent.
    pub retry_after: Option<String>,
    /// The JSON body (`null` if none).
    pub body: Value,
    /// How long this one request took, from sending to the whole answer read.
    pub took: Duration,
}

/// A queue of the fleet's own for the topic's notifications, subscribed to the topic when
/// `observe`: its URL and the subscription's ARN (empty when not subscribed).
async fn observer(
    sqs: &aws_sdk_sqs::Client,
    sns: &aws_sdk_sns::Client,
    topic_arn: &str,
    observe: bool,
) -> anyhow::Result<(String, String)> {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let observer = sqs.create_queue().queue_name(format!("observer-{}", &suffix[..12])).send().await?;
    let observer_url = observer.queue_url.context("an observer queue URL")?;
    let observer_arn = sqs
        .get_queue_attributes()
        .queue_url(&observer_url)
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await?
        .attributes
        .and_then(|mut a| a.remove(&QueueAttributeName::QueueArn))
        .context("the observer's ARN")?;
    if !observe {
        return Ok((observer_url, String::new()));
    }
    let subscription = sns
        .subscribe()
        .topic_arn(topic_arn)
        .protocol("sqs")
        .endpoint(&observer_arn)
        .return_subscription_arn(true)
        .send()
        .await?
        .subscription_arn
        .unwrap_or_default();
    Ok((observer_url, subscription))
}

/// The webhook signing secret of every test fleet: a placeholder, like its `sk_test_` key.
pub const WEBHOOK_SECRET: &str = "whsec_stripe_sim_placeholder";

/// The variables every process of the fleet starts with: the stack's, stripe-sim's and the
/// intake's addresses, the token secret, and the AWS settings.
fn process_env(stack: &Stack, stripe_port: u16, intake_port: u16, jwt_secret: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("DATABASE_URL", stack.database_url.clone()),
        ("STOCK_QUEUE_URL", stack.stock_queue_url.clone()),
        ("NOTIFICATION_QUEUE_URL", stack.notification_queue_url.clone()),
        ("NOTIFICATION_TOPIC_ARN", stack.topic_arn.clone()),
        ("STRIPE_SECRET_KEY", "sk_test_stripe_sim_placeholder".to_owned()),
        ("STRIPE_API_BASE", format!("http://127.0.0.1:{stripe_port}")),
        ("STRIPE_SIM_LISTEN_ADDR", format!("127.0.0.1:{stripe_port}")),
        ("INTAKE_LISTEN_ADDR", format!("127.0.0.1:{intake_port}")),
        // stripe-sim signs its webhooks to the intake's endpoint with the secret the intake
        // checks (a test placeholder, as the `sk_test_` key is).
        ("STRIPE_SIM_WEBHOOK_URL", format!("http://127.0.0.1:{intake_port}/webhooks/stripe")),
        ("STRIPE_SIM_WEBHOOK_SECRET", WEBHOOK_SECRET.to_owned()),
        // Stripe gives an event up after three days of retries in live mode (a sandbox after
        // three attempts over a few hours): far longer than anything a fleet refuses an event
        // for (a lease, a restart). stripe-sim's schedule is compressed (its default three
        // attempts take 0.3 s), so a test fleet gets 20 attempts, about 30 s, standing for
        // live mode's days; a test of an event given up sets 3.
        ("STRIPE_SIM_WEBHOOK_ATTEMPTS", "20".to_owned()),
        ("STRIPE_WEBHOOK_SECRET", WEBHOOK_SECRET.to_owned()),
        // A buyer has seconds, not ten minutes, to complete 3-D Secure in a test.
        ("PAYMENT_ACTION_TIMEOUT_SECONDS", "6".to_owned()),
        ("AUTH_JWT_SECRET", jwt_secret.to_owned()),
        ("RUST_LOG", "info".to_owned()),
        // Short, so a stop does not wait out an idle long poll (20 s) in every test.
        ("SHUTDOWN_GRACE_SECONDS", "5".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    env.extend(stack.aws_env.iter().cloned());
    env
}

impl Fleet {
    /// stripe-sim and an observer of the topic; no fleet binaries yet.
    pub async fn prepare(name: &str, stack: Stack, log_dir: PathBuf) -> anyhow::Result<Self> {
        Self::prepare_observed(name, stack, log_dir, true).await
    }

    /// The same, with the topic observed through a subscribed queue or not (a benchmark
    /// should not pay for SNS delivering every notification to one more queue).
    pub async fn prepare_observed(
        name: &str,
        stack: Stack,
        log_dir: PathBuf,
        observe: bool,
    ) -> anyhow::Result<Self> {
        let sdk = Aws::load().await?;
        let sqs = sdk.sqs();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(10)
            .connect(&stack.database_url)
            .await
            .context("failed to connect to the stack's database")?;
        let (observer_url, subscription) = observer(&sqs, &sdk.sns(), &stack.topic_arn, observe).await?;
        let jwt_secret =
            uuid::Uuid::new_v4().simple().to_string() + &uuid::Uuid::new_v4().simple().to_string();
        let stripe_port = free_port();
        let intake_port = free_port();
        let env = process_env(&stack, stripe_port, intake_port, &jwt_secret);

        std::fs::create_dir_all(&log_dir)?;
        let mut fleet = Self {
            name: name.to_owned(),
            stack,
            pool,
            observer_url,
            observer_subscription: subscription,
            stripe_url: format!("http://127.0.0.1:{stripe_port}"),
            intake_url: format!("http://127.0.0.1:{intake_port}"),
            jwt_secret,
            sqs,
            http: reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?,
            env,
            children: Vec::new(),
            metrics_urls: Vec::new(),
            log_dir,
            image_container: None,
        };
        fleet.spawn("stripe-sim", "stripe-sim", &[])?;
        fleet.wait_http(&format!("{}/_sim/payment_intents", fleet.stripe_url)).await?;
        Ok(fleet)
    }

    /// The whole fleet with `stock_workers` stock-worker processes.
    pub async fn start(
        name: &str,
        stack: Stack,
        log_dir: PathBuf,
        stock_workers: usize,
    ) -> anyhow::Result<Self> {
        let mut fleet = Self::prepare(name, stack, log_dir).await?;
        fleet.spawn_all(stock_workers).await?;
        Ok(fleet)
    }

    /// Starts every fleet binary (after [`Fleet::prepare`]), `stock_workers` stock workers.
    pub async fn spawn_all(&mut self, stock_workers: usize) -> anyhow::Result<()> {
        self.spawn("order-intake", "order-intake", &[])?;
        self.started_in_image().await?;
        self.spawn("outbox-relay", "outbox-relay", &[])?;
        self.started_in_image().await?;
        for i in 0..stock_workers {
            self.spawn(&format!("stock-worker-{i}"), "stock-worker", &[])?;
            self.started_in_image().await?;
        }
        self.spawn("notification-worker", "notification-worker", &[])?;
        self.wait_http(&format!("{}/healthz", self.intake_url)).await?;
        // Every process answers /healthz once its SIGTERM handler is in place: a test that
        // stops the fleet a moment after starting it would otherwise kill a process still
        // starting, which dies of the signal (exit code none) instead of stopping cleanly.
        let health: Vec<String> =
            self.metrics_urls.iter().map(|(_, url)| url.replace("/metrics", "/healthz")).collect();
        for url in health {
            self.wait_http(&url).await?;
        }
        Ok(())
    }

    /// In the image, waits until the process last spawned answers `/healthz`: two `buildah run`
    /// starting at once on one container race to make its root's mount points, and one fails
    /// ("mkdir …/rootfs/sys: file exists", seen from a fresh clone's `make test`). Here, a no-op.
    async fn started_in_image(&self) -> anyhow::Result<()> {
        if self.image_container.is_none() {
            return Ok(());
        }
        match self.metrics_urls.last() {
            Some((_, url)) => self.wait_http(&url.replace("/metrics", "/healthz")).await,
            None => Ok(()),
        }
    }

    /// The `/metrics` URL of the process `label`.
    pub fn metrics_url(&self, label: &str) -> Option<&str> {
        self.metrics_urls.iter().find(|(l, _)| l == label).map(|(_, url)| url.as_str())
    }

    /// Runs every fleet binary spawned from now on inside `container` (made with `buildah
    /// from` over the fleet's image), as the image has it; stripe-sim stays on this machine.
    pub fn run_in_image(&mut self, container: &str) {
        self.image_container = Some(container.to_owned());
    }

    /// Sets a variable of the environment every process spawned from now on gets.
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
    }

    /// Starts one of the binaries as `label`, with the fleet's environment plus `extra`,
    /// connected to the database as its own role (whichever `DATABASE_URL` it is given).
    pub fn spawn(&mut self, label: &str, bin: &str, extra: &[(&str, &str)]) -> anyhow::Result<()> {
        let log = std::fs::File::create(self.log_dir.join(format!("{label}.log")))?;
        let metrics_addr = format!("127.0.0.1:{}", free_port());
        if bin != "stripe-sim" {
            self.metrics_urls.push((label.to_owned(), format!("http://{metrics_addr}/metrics")));
        }
        let mut env: Vec<(String, String)> = self.env.clone();
        env.push(("METRICS_LISTEN_ADDR".into(), metrics_addr));
        env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        env.extend(self.database_url_as(bin, extra).map(|(k, v)| (k.to_owned(), v)));
        let mut command = match (&self.image_container, bin) {
            (Some(container), bin) if bin != "stripe-sim" => {
                // Inside the image: its root filesystem, its user, only these variables on
                // top of its own; the network is this machine's.
                let mut command = Command::new("buildah");
                command.args(["run", "--isolation", "chroot"]);
                for (k, v) in &env {
                    command.arg("--env").arg(format!("{k}={v}"));
                }
                command.args([container.as_str(), "--", &format!("/usr/local/bin/{bin}")]);
                command
            }
            _ => {
                let mut command = Command::new(binary(bin));
                command.env_clear().envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                command
            }
        };
        let child = command
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("failed to start {bin}"))?;
        self.children.push((label.to_owned(), child));
        Ok(())
    }

    /// `DATABASE_URL` (from `extra`, else the fleet's) logging in as `bin`'s service role;
    /// none for a binary that has no role.
    fn database_url_as(&self, bin: &str, extra: &[(&str, &str)]) -> Option<(&'static str, String)> {
        let role = crate::service_role(bin)?;
        let url = extra
            .iter()
            .rev()
            .find(|(k, _)| *k == "DATABASE_URL")
            .map(|(_, v)| *v)
            .or_else(|| self.env.iter().find(|(k, _)| k == "DATABASE_URL").map(|(_, v)| v.as_str()))?;
        Some(("DATABASE_URL", crate::as_role(url, role)))
    }

    /// Seeds a product with `units` for sale in all (or sets its total, as `fleetctl product
    /// upsert --stock` does).
    pub async fn product(&self, id: &str, price_minor: i64, units: i32) -> anyhow::Result<()> {
        let product = orderfleet::domain::product::ProductUpsert {
            id: orderfleet::domain::product::Sku::parse(id).map_err(anyhow::Error::msg)?,
            name: id.to_owned(),
            price_minor,
            currency: orderfleet::domain::product::Currency::parse("usd").map_err(anyhow::Error::msg)?,
            units_total: units,
            max_per_buyer: None,
        };
        let pool = crate::fleet_pool(&self.stack.database_url, 1).await?;
        orderfleet::domain::product::upsert(&pool, &product).await?;
        Ok(())
    }

    /// A token for `user` as `fleetctl token` makes it (the default issuer and audience).
    pub fn token(&self, user: &str) -> String {
        let config = orderfleet::runtime::config::AuthConfig {
            jwt_secret: secrecy::SecretString::from(self.jwt_secret.clone()),
            issuer: orderfleet::runtime::config::AuthConfig::DEFAULT_ISSUER.into(),
            audience: orderfleet::runtime::config::AuthConfig::DEFAULT_AUDIENCE.into(),
        };
        tokens::issue_token(&config, &UserId::parse(user).unwrap(), Duration::from_secs(600)).unwrap()
    }

    /// `POST /v1/orders` with a raw body.
    pub async fn post_raw(
        &self,
        user: Option<&str>,
        key: Option<&str>,
        body: &str,
    ) -> anyhow::Result<Answer> {
        let mut request = self
            .http
            .post(format!("{}/v1/orders", self.intake_url))
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(user) = user {
            request = request.bearer_auth(self.token(user));
        }
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let sent = Instant::now();
        let response = request.send().await?;
        let status = response.status().as_u16();
        let replayed = response.headers().get("idempotent-replayed").is_some_and(|v| v == "true");
        let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap_or("").to_owned());
        let body = response.json::<Value>().await.unwrap_or(Value::Null);
        Ok(Answer { status, replayed, retry_after, body, took: sent.elapsed() })
    }

    /// `POST /v1/orders` of `quantity` units of `product`, paid with `method`: `.await` sends it
    /// once; [`OrderPost::retrying`] sends it as a well-behaved client does. It owns its
    /// arguments, so it may outlive the loop that made it.
    pub fn post_order(
        &self,
        user: &str,
        key: &str,
        product: &str,
        quantity: i64,
        method: &str,
    ) -> OrderPost<'_> {
        let body =
            serde_json::json!({ "product_id": product, "quantity": quantity, "payment_method": method });
        OrderPost {
            fleet: self,
            user: user.to_owned(),
            key: key.to_owned(),
            body: body.to_string(),
            sending: None,
        }
    }

    /// stripe-sim's ledger: every PaymentIntent with its capture and cancel counts.
    pub async fn intents(&self) -> anyhow::Result<Vec<Value>> {
        let ledger: Value =
            self.http.get(format!("{}/_sim/payment_intents", self.stripe_url)).send().await?.json().await?;
        Ok(ledger["data"].as_array().cloned().unwrap_or_default())
    }

    /// Arms a stripe-sim fault: the next `count` requests of `operation` fail in `mode` (SPEC §6).
    pub async fn fault(&self, operation: &str, mode: &str, count: u32) -> anyhow::Result<()> {
        let body = serde_json::json!({ "operation": operation, "mode": mode, "count": count });
        self.sim_control("faults", &body).await
    }

    /// Makes stripe-sim's search lag its writes by `seconds`, as Stripe's does.
    pub async fn search_lag(&self, seconds: u32) -> anyhow::Result<()> {
        self.sim_control("search_lag", &serde_json::json!({ "seconds": seconds })).await
    }

    /// Posts `body` to stripe-sim's `/_sim/{route}`, which must accept it.
    async fn sim_control(&self, route: &str, body: &Value) -> anyhow::Result<()> {
        let response = self.http.post(format!("{}/_sim/{route}", self.stripe_url)).json(body).send().await?;
        anyhow::ensure!(response.status().is_success(), "{route} not accepted: {}", response.status());
        Ok(())
    }

    /// PaymentIntents that hold or held funds (authorized, or cancelled after authorizing) for
    /// an order that was not paid: holds on buyers who got nothing (SPEC §8.8).
    pub async fn holds_without_a_unit(&self) -> anyhow::Result<usize> {
        let paid: std::collections::HashSet<String> =
            sqlx::query_scalar::<_, uuid::Uuid>("SELECT id FROM orders WHERE sold(status)")
                .fetch_all(&self.pool)
                .await?
                .into_iter()
                .map(|id| id.to_string())
                .collect();
        Ok(self
            .intents()
            .await?
            .iter()
            .filter(|i| {
                // A cancelled intent held funds only if it was authorized (it has a charge, and
                // no payment error): one cancelled while its buyer was at 3-D Secure never held
                // anything, nor one whose charge the issuer declined (after 3-D Secure, say).
                let held = i["status"] == "requires_capture"
                    || (i["status"] == "canceled"
                        && !i["latest_charge"].is_null()
                        && i["last_payment_error"].is_null());
                !paid.contains(i["metadata"]["order_id"].as_str().unwrap_or("")) && held
            })
            .count())
    }

    /// Authorizes 10.00 usd for `order_id` at stripe-sim directly, as the intake would have:
    /// the PaymentIntent, holding funds ([`hold_at_stripe`]).
    pub async fn hold_at_stripe(&self, order_id: uuid::Uuid) -> anyhow::Result<Value> {
        hold_at_stripe(&self.http, &self.stripe_url, order_id).await
    }

    /// `POST /v1/payment_intents` at stripe-sim with `form`, under `idempotency_key` if given
    /// ([`create_at_stripe`]).
    pub async fn create_at_stripe(
        &self,
        idempotency_key: Option<&str>,
        form: &[(&str, &str)],
    ) -> anyhow::Result<reqwest::Response> {
        create_at_stripe(&self.http, &self.stripe_url, idempotency_key, form).await
    }

    /// The product's units for sale in all, in stock, and promised.
    pub async fn units(&self, product: &str) -> anyhow::Result<(i32, i32, i32)> {
        Ok(sqlx::query_as("SELECT units_total, stock, units_promised FROM products WHERE id = $1")
            .bind(product)
            .fetch_one(&self.pool)
            .await?)
    }

    /// `GET /v1/orders/{order_id}` as `user`.
    pub async fn get_order(&self, user: &str, order_id: &str) -> anyhow::Result<reqwest::Response> {
        Ok(self
            .http
            .get(format!("{}/v1/orders/{order_id}", self.intake_url))
            .bearer_auth(self.token(user))
            .send()
            .await?)
    }

    /// The buyer's browser completing (or failing) 3-D Secure for `payment_intent`, as
    /// stripe-sim stands in for it (`POST /_sim/payment_intents/{id}/authenticate`).
    pub async fn authenticate(&self, payment_intent: &str, succeed: bool) -> anyhow::Result<()> {
        let outcome = if succeed { "succeed" } else { "fail" };
        let route = format!("payment_intents/{payment_intent}/authenticate");
        self.sim_control(&route, &serde_json::json!({ "outcome": outcome })).await
    }

    /// The buyer of `order_id` (awaiting 3-D Secure) completing it: its PaymentIntent read
    /// from the order, then [`Fleet::authenticate`].
    pub async fn authenticate_order(&self, order_id: &str) -> anyhow::Result<()> {
        let intent: String = sqlx::query_scalar("SELECT payment_intent_id FROM orders WHERE id = $1::uuid")
            .bind(order_id)
            .fetch_one(&self.pool)
            .await?;
        self.authenticate(&intent, true).await
    }

    /// Time passing for `payment_intent`'s hold: it lapses, as Stripe cancels it
    /// (`POST /_sim/payment_intents/{id}/expire`).
    pub async fn expire_hold(&self, payment_intent: &str) -> anyhow::Result<()> {
        self.sim_control(&format!("payment_intents/{payment_intent}/expire"), &serde_json::json!({})).await
    }

    /// Refunds `amount` (everything when `None`) of `payment_intent` at stripe-sim, as an
    /// operator does in Stripe's Dashboard.
    pub async fn refund_at_stripe(&self, payment_intent: &str, amount: Option<i64>) -> anyhow::Result<Value> {
        let mut form = vec![("payment_intent", payment_intent.to_owned())];
        form.extend(amount.map(|a| ("amount", a.to_string())));
        let response = self
            .http
            .post(format!("{}/v1/refunds", self.stripe_url))
            .bearer_auth("sk_test_stripe_sim_placeholder")
            .form(&form)
            .send()
            .await?;
        anyhow::ensure!(response.status().is_success(), "refund refused: {}", response.text().await?);
        Ok(response.json().await?)
    }

    /// stripe-sim's webhook deliveries (`GET /_sim/webhooks`): `{event_id, type, status}` each.
    pub async fn webhook_deliveries(&self) -> anyhow::Result<Vec<Value>> {
        let answer: Value =
            self.http.get(format!("{}/_sim/webhooks", self.stripe_url)).send().await?.json().await?;
        Ok(answer["data"].as_array().cloned().unwrap_or_default())
    }

    /// Makes stripe-sim hold each webhook event `delay_ms` before sending it once: as Stripe,
    /// after the answer of the request that caused it.
    pub async fn delay_webhooks(&self, delay_ms: u64) -> anyhow::Result<()> {
        let mode =
            serde_json::json!({ "duplicate": false, "min_delay_ms": delay_ms, "max_delay_ms": delay_ms });
        self.sim_control("webhooks", &mode).await
    }

    /// Makes stripe-sim send each webhook event twice, each copy held 0..`max_delay_ms`.
    pub async fn duplicate_webhooks(&self, max_delay_ms: u64) -> anyhow::Result<()> {
        self.sim_control("webhooks", &serde_json::json!({ "duplicate": true, "max_delay_ms": max_delay_ms }))
            .await
    }

    /// Posts `body` to the intake's `/webhooks/stripe` with `signature` as `Stripe-Signature`.
    pub async fn post_webhook(&self, body: &str, signature: Option<&str>) -> anyhow::Result<(u16, Value)> {
        let mut request = self
            .http
            .post(format!("{}/webhooks/stripe", self.intake_url))
            .header("content-type", "application/json")
            .body(body.to_owned());
        if let Some(signature) = signature {
            request = request.header("stripe-signature", signature);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }

    /// Limits stripe-sim's request rate (0 clears it), as Stripe limits an account's.
    pub async fn stripe_rate_limit(&self, per_second: u32) -> anyhow::Result<()> {
        self.sim_control("rate_limit", &serde_json::json!({ "per_second": per_second })).await
    }

    /// Limits stripe-sim's request rate per account and on each named operation, as Stripe
    /// does (0 clears either).
    pub async fn stripe_rate_limits(&self, per_second: u32, per_endpoint: u32) -> anyhow::Result<()> {
        let limits = serde_json::json!({ "per_second": per_second, "per_endpoint": per_endpoint });
        self.sim_control("rate_limit", &limits).await
    }

    /// The base URL of an intake started as another process (its `INTAKE_LISTEN_ADDR` given
    /// in `extra`), for a test that runs several.
    pub fn spawn_intake(&mut self, label: &str, extra: &[(&str, &str)]) -> anyhow::Result<String> {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut env: Vec<(&str, &str)> = vec![("INTAKE_LISTEN_ADDR", addr.as_str())];
        env.extend_from_slice(extra);
        self.spawn(label, "order-intake", &env)?;
        Ok(format!("http://{addr}"))
    }

    /// stripe-sim's counts: `requests`, `rate_limited`, `max_requests_in_one_second`.
    pub async fn stripe_stats(&self) -> anyhow::Result<Value> {
        Ok(self.http.get(format!("{}/_sim/stats", self.stripe_url)).send().await?.json().await?)
    }

    /// The TCP connections stripe-sim accepted (`GET /_sim/connections`).
    pub async fn stripe_connections(&self) -> anyhow::Result<u64> {
        let answer: Value =
            self.http.get(format!("{}/_sim/connections", self.stripe_url)).send().await?.json().await?;
        answer["connections"].as_u64().context("no connections in stripe-sim's answer")
    }

    /// Orders by status.
    pub async fn statuses(&self) -> anyhow::Result<HashMap<String, i64>> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT status::text, count(*) FROM orders GROUP BY status")
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().collect())
    }

    /// A queue's messages: (visible, in flight).
    pub async fn queue_depth(&self, queue_url: &str) -> anyhow::Result<(u64, u64)> {
        let out = self
            .sqs
            .get_queue_attributes()
            .queue_url(queue_url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .context("failed to read the queue's depth")?;
        let attributes = out.attributes.unwrap_or_default();
        let get = |a: QueueAttributeName| attributes.get(&a).and_then(|v| v.parse().ok()).unwrap_or(0);
        Ok((
            get(QueueAttributeName::ApproximateNumberOfMessages),
            get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
        ))
    }

    /// Waits until both work queues hold no message, visible or in flight: every message
    /// handled and deleted. A message whose delete was lost is in flight until its visibility
    /// timeout ends and it is handled again (found done), so this can take that long.
    pub async fn wait_drained(&self, within: Duration) -> anyhow::Result<()> {
        let queues = [self.stack.stock_queue_url.clone(), self.stack.notification_queue_url.clone()];
        crate::eventually("the work queues drained", within, || async {
            for queue in &queues {
                if self.queue_depth(queue).await.ok()? != (0, 0) {
                    return None;
                }
            }
            Some(())
        })
        .await
    }

    /// Waits until every order is terminal (and its hold released where it needs to be).
    pub async fn wait_settled(&self, timeout: Duration) -> anyhow::Result<HashMap<String, i64>> {
        let deadline = Instant::now() + timeout;
        loop {
            let unsettled: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM orders
                  WHERE holds_units(status)
                     OR (status IN ('rejected_out_of_stock', 'capture_failed') AND authorization_released_at IS NULL)",
            )
            .fetch_one(&self.pool)
            .await?;
            if unsettled == 0 {
                return self.statuses().await;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{unsettled} orders unsettled after {timeout:?}: {:?}",
                self.statuses().await?
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Notifications seen on the topic: (event_type, order_id) for each, after waiting until
    /// `expected` arrived and a quiet second passed (to catch duplicates).
    pub async fn notifications(
        &self,
        expected: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<(String, String)>> {
        let mut seen = Vec::new();
        for outer in self.notification_messages(expected, timeout).await? {
            let event_type =
                outer["MessageAttributes"]["event_type"]["Value"].as_str().unwrap_or("?").to_owned();
            let inner: Value = serde_json::from_str(outer["Message"].as_str().unwrap_or("{}"))?;
            seen.push((event_type, inner["order_id"].as_str().unwrap_or("?").to_owned()));
        }
        Ok(seen)
    }

    /// The notifications seen on the topic as SNS delivered them (its JSON, with the message
    /// attributes), waiting as [`Fleet::notifications`] does.
    pub async fn notification_messages(
        &self,
        expected: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<Value>> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let wait = if seen.len() >= expected { 1 } else { 2 };
            let out = self
                .sqs
                .receive_message()
                .queue_url(&self.observer_url)
                .max_number_of_messages(10)
                .wait_time_seconds(wait)
                .send()
                .await?;
            let messages = out.messages.unwrap_or_default();
            if messages.is_empty() && (seen.len() >= expected || Instant::now() > deadline) {
                return Ok(seen);
            }
            for m in messages {
                seen.push(serde_json::from_str(m.body().unwrap_or("{}"))?);
                self.sqs
                    .delete_message()
                    .queue_url(&self.observer_url)
                    .receipt_handle(m.receipt_handle().unwrap())
                    .send()
                    .await?;
            }
        }
    }

    /// Kills the process `label` at once (SIGKILL): a crash, with no chance to clean up.
    pub async fn kill(&mut self, label: &str) -> anyhow::Result<()> {
        let index = self.children.iter().position(|(l, _)| l == label).context("no such process")?;
        let (_, mut child) = self.children.remove(index);
        if let Some(pid) = child.id() {
            signal_binary(pid, libc::SIGKILL, self.image_container.is_some());
        }
        child.kill().await?;
        Ok(())
    }

    /// Sends SIGTERM to the process `label` without waiting (a deploy in progress).
    pub fn sigterm(&self, label: &str) -> anyhow::Result<()> {
        let (_, child) = self.children.iter().find(|(l, _)| l == label).context("no such process")?;
        signal_binary(child.id().context("it has exited")?, libc::SIGTERM, self.image_container.is_some());
        Ok(())
    }

    /// Sends SIGTERM to the process `label` and waits for it; its exit status.
    pub async fn terminate(&mut self, label: &str) -> anyhow::Result<std::process::ExitStatus> {
        let in_image = self.image_container.is_some();
        let (_, child) = self.children.iter_mut().find(|(l, _)| l == label).context("no such process")?;
        if let Some(pid) = child.id() {
            signal_binary(pid, libc::SIGTERM, in_image);
        }
        let status = tokio::time::timeout(Duration::from_secs(60), child.wait()).await??;
        self.children.retain(|(l, _)| l != label);
        Ok(status)
    }

    /// Waits for the process `label` to exit by itself (a failpoint); its exit status.
    pub async fn wait_exit(
        &mut self,
        label: &str,
        timeout: Duration,
    ) -> anyhow::Result<std::process::ExitStatus> {
        let (_, child) = self.children.iter_mut().find(|(l, _)| l == label).context("no such process")?;
        let status = tokio::time::timeout(timeout, child.wait()).await.context("it did not exit")??;
        self.children.retain(|(l, _)| l != label);
        Ok(status)
    }

    /// Runs `fleetctl` with the fleet's environment (plus `extra`), as the operator's role
    /// (`migrate` as the owner's); its stdout.
    pub async fn fleetctl(&self, args: &[&str], extra: &[(&str, &str)]) -> anyhow::Result<String> {
        let as_operator = args.first() != Some(&"migrate");
        let out = Command::new(binary("fleetctl"))
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .envs(extra.iter().copied())
            .envs(if as_operator { self.database_url_as("fleetctl", extra) } else { None })
            // Its stderr goes to fleetctl.log, with the AWS operations it called (what the
            // test command's least-privilege check reads).
            .env("RUST_LOG", "warn,aws_operations=debug")
            .args(args)
            .output()
            .await?;
        if let Ok(mut log) =
            std::fs::OpenOptions::new().create(true).append(true).open(self.log_dir.join("fleetctl.log"))
        {
            use std::io::Write;
            let _ = writeln!(log, "$ fleetctl {}", args.join(" "));
            let _ = log.write_all(&out.stderr);
        }
        anyhow::ensure!(
            out.status.success(),
            "fleetctl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The `/metrics` text of every fleet process that answers.
    pub async fn scrape_metrics(&self) -> Vec<String> {
        let mut texts = Vec::new();
        for (_, url) in &self.metrics_urls {
            if let Ok(response) = self.http.get(url).timeout(Duration::from_secs(2)).send().await
                && let Ok(text) = response.text().await
            {
                texts.push(text);
            }
        }
        texts
    }

    /// Where the processes' logs are.
    pub fn log_dir(&self) -> &std::path::Path {
        &self.log_dir
    }

    /// Takes `n` messages off a queue (waiting up to 30 s for them to arrive) and deletes
    /// them; their bodies, in the order received.
    pub async fn take_messages(&self, queue_url: &str, n: usize) -> anyhow::Result<Vec<String>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut bodies = Vec::new();
        while bodies.len() < n {
            anyhow::ensure!(Instant::now() < deadline, "only {} of {n} messages arrived", bodies.len());
            let received = self
                .sqs
                .receive_message()
                .queue_url(queue_url)
                .max_number_of_messages((n - bodies.len()).min(10) as i32)
                .wait_time_seconds(1)
                .send()
                .await?;
            for message in received.messages.unwrap_or_default() {
                bodies.push(message.body.unwrap_or_default());
                if let Some(receipt) = message.receipt_handle {
                    self.sqs.delete_message().queue_url(queue_url).receipt_handle(receipt).send().await?;
                }
            }
        }
        Ok(bodies)
    }

    /// The process id of the fleet process `label`, while it runs.
    pub fn pid(&self, label: &str) -> Option<u32> {
        self.children.iter().find(|(l, _)| l == label).and_then(|(_, child)| child.id())
    }

    /// Waits until the intake answers (after spawning it by hand).
    pub async fn wait_intake(&self) -> anyhow::Result<()> {
        self.wait_http(&format!("{}/healthz", self.intake_url)).await
    }

    async fn wait_http(&self, url: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = self.http.get(url).timeout(Duration::from_secs(1)).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{url} did not answer; see {}",
                self.log_dir.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops every process with SIGTERM (as a deploy does), waits for them, and removes the
    /// observer. Returns the labels of processes that did not exit 0.
    pub async fn stop(mut self) -> anyhow::Result<Vec<String>> {
        let in_image = self.image_container.is_some();
        for (_, child) in &self.children {
            if let Some(pid) = child.id() {
                signal_binary(pid, libc::SIGTERM, in_image);
            }
        }
        let mut failed = Vec::new();
        for (label, child) in &mut self.children {
            match tokio::time::timeout(Duration::from_secs(30), child.wait()).await {
                Ok(Ok(status)) if status.success() => {}
                _ => {
                    if let Some(pid) = child.id() {
                        signal_binary(pid, libc::SIGKILL, in_image);
                    }
                    let _ = child.kill().await;
                    failed.push(label.clone());
                }
            }
        }
        let sdk = Aws::load().await?;
        if !self.observer_subscription.is_empty() {
            let _ = sdk.sns().unsubscribe().subscription_arn(&self.observer_subscription).send().await;
        }
        let _ = self.sqs.delete_queue().queue_url(&self.observer_url).send().await;
        self.pool.close().await;
        Ok(failed)
    }
}

impl Drop for Fleet {
    /// A fleet dropped before its stop (a failed test): `kill_on_drop` reaches each child, and
    /// inside the image the child is `buildah run`, so the binaries it started are killed here.
    fn drop(&mut self) {
        if self.image_container.is_some() {
            for (_, child) in &self.children {
                if let Some(pid) = child.id() {
                    signal_binary(pid, libc::SIGKILL, true);
                }
            }
        }
    }
}

/// An order request ([`Fleet::post_order`]): a future that sends it once, or, with
/// [`OrderPost::retrying`], as a well-behaved client does.
pub struct OrderPost<'a> {
    fleet: &'a Fleet,
    user: String,
    key: String,
    body: String,
    /// The one send, once polled.
    sending: Option<futures::future::BoxFuture<'a, anyhow::Result<Answer>>>,
}

impl<'a> OrderPost<'a> {
    async fn send(&self) -> anyhow::Result<Answer> {
        self.fleet.post_raw(Some(&self.user), Some(&self.key), &self.body).await
    }

    /// What a well-behaved client does: on `409 idempotency_key_in_use` (the same key in
    /// flight) or `503` (try again), wait as `Retry-After` says (at most a second here) and send
    /// the same request again. A `409 sold_out` is a final answer here.
    /// Returns the final answer and the statuses of the attempts before it.
    pub async fn retrying(self) -> anyhow::Result<(Answer, Vec<u16>)> {
        let mut earlier = Vec::new();
        loop {
            let answer = self.send().await?;
            let in_use = answer.status == 409 && answer.body["error"]["code"] == "idempotency_key_in_use";
            if !(in_use || answer.status == 503) || earlier.len() >= 30 {
                return Ok((answer, earlier));
            }
            let wait = answer.retry_after.as_deref().and_then(|s| s.parse::<u64>().ok()).unwrap_or(1).min(1);
            earlier.push(answer.status);
            tokio::time::sleep(Duration::from_secs(wait)).await;
        }
    }
}

impl Future for OrderPost<'_> {
    type Output = anyhow::Result<Answer>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = self.get_mut();
        let sending = this.sending.get_or_insert_with(|| {
            let (fleet, user, key, body) =
                (this.fleet, this.user.clone(), this.key.clone(), this.body.clone());
            Box::pin(async move { fleet.post_raw(Some(&user), Some(&key), &body).await })
        });
        sending.as_mut().poll(cx)
    }
}

/// Sends `signal` to the binary a child of ours runs: the child itself, or, inside the image
/// (`in_image`), the binary `buildah run` started, as Docker or ECS would (buildah, signalled
/// itself, kills its child instead of passing SIGTERM on).
fn signal_binary(pid: u32, signal: i32, in_image: bool) {
    let targets = if in_image { leaf_descendants(pid) } else { vec![pid] };
    for target in targets {
        // SAFETY: kill(2) on a process we started (or one it started); no memory is touched.
        #[allow(unsafe_code)]
        unsafe {
            libc::kill(target as i32, signal)
        };
    }
}

/// The processes under `pid` that have none of their own (`/proc`, Linux), or `pid` itself.
fn leaf_descendants(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let id: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // "pid (comm) state ppid …": comm may hold spaces and parentheses.
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            Some((id, ppid))
        })
        .collect();
    let mut leaves = Vec::new();
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        let children: Vec<u32> = parents.iter().filter(|(_, pp)| *pp == p).map(|(id, _)| *id).collect();
        if children.is_empty() {
            leaves.push(p);
        }
        stack.extend(children);
    }
    leaves
}

/// Authorizes 10.00 usd for `order_id` at the stripe-sim at `stripe_url` directly, outside any
/// fleet key, as the intake would have: the PaymentIntent, holding funds. For a test with no
/// [`Fleet`] too (an in-process stripe-sim).
pub async fn hold_at_stripe(
    http: &reqwest::Client,
    stripe_url: &str,
    order_id: uuid::Uuid,
) -> anyhow::Result<Value> {
    let order_id = order_id.to_string();
    let form = [
        ("amount", "1000"),
        ("currency", "usd"),
        ("capture_method", "manual"),
        ("confirm", "true"),
        ("payment_method", "pm_card_visa"),
        ("automatic_payment_methods[enabled]", "true"),
        ("automatic_payment_methods[allow_redirects]", "never"),
        ("use_stripe_sdk", "true"),
        ("metadata[order_id]", order_id.as_str()),
    ];
    Ok(create_at_stripe(http, stripe_url, None, &form).await?.json().await?)
}

/// `POST /v1/payment_intents` at the stripe-sim at `stripe_url` with `form`, under
/// `idempotency_key` if given: a create as some client (the intake, or a release of it) sent it.
pub async fn create_at_stripe(
    http: &reqwest::Client,
    stripe_url: &str,
    idempotency_key: Option<&str>,
    form: &[(&str, &str)],
) -> anyhow::Result<reqwest::Response> {
    let mut request = http
        .post(format!("{stripe_url}/v1/payment_intents"))
        .bearer_auth("sk_test_stripe_sim_placeholder")
        .form(form);
    if let Some(key) = idempotency_key {
        request = request.header("Idempotency-Key", key);
    }
    Ok(request.send().await?)
}
