//! The fleet as processes: stripe-sim and the real binaries — order-intake,
//! outbox-relay, stock-worker(s), notification-worker — started against a [`Stack`] (a
//! database, two queues, a topic), with the topic observed through a subscribed queue. Each
//! process logs to `<log_dir>/<label>.log`; [`Fleet::stop`] sends SIGTERM and waits, and a
//! dropped fleet kills what is left. This file is the processes' view: starting, spawning,
//! signalling, killing and stopping them (with `os`: ports and signals). The other views are
//! `impl Fleet` blocks of their own: `api` (what a client does), `stripe` (stripe-sim's
//! controls, ledger and webhooks) and `observe` (metrics, logs, notifications, the database's
//! counts, the audits' inputs).

mod api;
mod observe;
mod os;
mod stripe;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::process::{Child, Command};

use orderfleet_runtime::aws::Aws;
use sqlx::PgPool;

use crate::binary;
use observe::observer;
use os::signal_binary;

pub use api::{Answer, OrderPost};
pub use os::{PORT_CLAIMS_KEPT, free_port};
pub use stripe::{create_at_stripe, hold_at_stripe};

/// How long a fleet's start waits for its intake's first PostgreSQL connection.
const CONNECTED_WITHIN: Duration = Duration::from_secs(20);
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
        self.wait_intake_connected().await;
        Ok(())
    }

    /// Waits, for [`CONNECTED_WITHIN`] at most, until each of the intake's pools (its steps', its
    /// Stripe budget's) holds a PostgreSQL connection:
    /// it opens its pool in the background, and on a machine running several fleets at once
    /// its first connections can take seconds (PostgreSQL forking and authenticating backends
    /// for every process starting), so a test's first order would meet a cold pool and answer
    /// `503`. A fleet started while the database is away goes on after the wait.
    async fn wait_intake_connected(&self) {
        // The intake started last under the label: one restarted leaves its old address behind.
        let url = self.metrics_urls.iter().rev().find(|(label, _)| label == "order-intake");
        let Some(url) = url.map(|(_, url)| url.clone()) else { return };
        let deadline = Instant::now() + CONNECTED_WITHIN;
        while Instant::now() < deadline {
            if let Ok(response) = self.http.get(&url).timeout(Duration::from_secs(2)).send().await
                && let Ok(text) = response.text().await
                && let pools = crate::metrics::sum_by_label(&[text], "db_pool_connections", "pool")
                && !pools.is_empty()
                && pools.values().all(|n| *n >= 1.0)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!("the intake holds no PostgreSQL connection {CONNECTED_WITHIN:?} after its start; going on");
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

    /// The base URL of an intake started as another process (its `INTAKE_LISTEN_ADDR` given
    /// in `extra`), for a test that runs several.
    pub fn spawn_intake(&mut self, label: &str, extra: &[(&str, &str)]) -> anyhow::Result<String> {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut env: Vec<(&str, &str)> = vec![("INTAKE_LISTEN_ADDR", addr.as_str())];
        env.extend_from_slice(extra);
        self.spawn(label, "order-intake", &env)?;
        Ok(format!("http://{addr}"))
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

    /// The environment `fleetctl` runs with ([`Fleet::fleetctl`]), as the operator's role: for
    /// a test that runs it where a person would, in a terminal.
    pub fn operator_env(&self) -> Vec<(String, String)> {
        let mut env = self.env.clone();
        if let Some((key, url)) = self.database_url_as("fleetctl", &[]) {
            env.retain(|(k, _)| k != key);
            env.push((key.to_owned(), url));
        }
        env
    }

    /// The process id of the fleet process `label`, while it runs.
    pub fn pid(&self, label: &str) -> Option<u32> {
        self.children.iter().find(|(l, _)| l == label).and_then(|(_, child)| child.id())
    }

    /// Waits until the intake answers (after spawning it by hand).
    pub async fn wait_intake(&self) -> anyhow::Result<()> {
        self.wait_http(&format!("{}/healthz", self.intake_url)).await?;
        self.wait_intake_connected().await;
        Ok(())
    }

    /// Waits until the intake at `url` (one [`Self::spawn_intake`] started) answers.
    pub async fn wait_intake_at(&self, url: &str) -> anyhow::Result<()> {
        self.wait_http(&format!("{url}/healthz")).await
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
