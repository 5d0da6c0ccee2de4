//! The fleet's image (Dockerfile, `make image`): its binaries, run from the image with
//! `buildah run` against PostgreSQL, LocalStack and stripe-sim on this machine, pay an order.
//!
//! Ignored in a plain test run, since it needs the image built: `scripts/image-test.sh` runs it
//! with `ORDERFLEET_IMAGE` naming one, on the dev profile's image in `make test` and on the
//! shipped (fat LTO) one in `make image`.

use std::process::Command;
use std::time::Duration;

use orderfleet_tests::Fleet;

/// A `buildah` working container over the image, removed when dropped.
struct Container(String);

impl Container {
    fn from(image: &str) -> Self {
        Self(buildah(&["from", "--pull=never", "--quiet", image]))
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("buildah").args(["rm", &self.0]).output();
    }
}

impl Container {
    /// Whether `command` run inside, with `env` set, succeeds. (The image has no shell and
    /// no `env`: the variables go through `buildah run --env`.)
    fn status(&self, env: &str, command: &[&str]) -> bool {
        Command::new("buildah")
            .args([&["run", "--isolation", "chroot", "--env", env, &self.0, "--"], command].concat())
            .output()
            .expect("buildah")
            .status
            .success()
    }

    /// The image's /usr/local/bin: each entry's name, and where it links to (itself if it is
    /// a file), read from the container's root filesystem.
    fn commands(&self) -> Vec<(String, String)> {
        let root = buildah(&["mount", &self.0]);
        let bin = std::path::Path::new(&root).join("usr/local/bin");
        let mut entries: Vec<(String, String)> = std::fs::read_dir(&bin)
            .expect("the image's /usr/local/bin")
            .map(|entry| {
                let path = entry.unwrap().path();
                let name = path.file_name().unwrap().to_string_lossy().into_owned();
                let target = std::fs::read_link(&path)
                    .map(|to| to.to_string_lossy().into_owned())
                    .unwrap_or_else(|_| name.clone());
                (name, target)
            })
            .collect();
        buildah(&["umount", &self.0]);
        entries.sort();
        entries
    }
}

/// The user ids of the running processes called `name`.
fn uids_of(name: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| {
            let status = std::fs::read_to_string(entry.ok()?.path().join("status")).ok()?;
            let field = |key: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(key))
                    .map(|v| v.split_whitespace().next().unwrap_or("").to_owned())
            };
            (field("Name:")? == name).then(|| field("Uid:")).flatten()
        })
        .collect()
}

fn buildah(args: &[&str]) -> String {
    let out = Command::new("buildah").args(args).output().expect("buildah (make image installs it)");
    assert!(out.status.success(), "buildah {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the image: `make image` builds it and runs this (scripts/image-test.sh)"]
async fn the_fleet_pays_an_order_as_a_user_that_is_not_root() {
    // Arrange: a container of the image, and the fleet's binaries started inside it.
    let image = std::env::var("ORDERFLEET_IMAGE").expect("ORDERFLEET_IMAGE names the image to test");
    let container = Container::from(&image);
    let mut fleet = Fleet::prepare("image").await.unwrap();
    fleet.run_in_image(&container.0);
    fleet.spawn_all(1).await.unwrap();
    fleet.product("sku-1", 2500, 3).await.unwrap();

    // Act
    let answer = fleet.post_order("alice", "key-1", "sku-1", 1, "pm_card_visa").await.unwrap();

    // Assert: paid, captured once, both notifications out; the image runs as its own user
    // and carries every binary and its health check.
    assert_eq!(answer.status, 202, "{:?}", answer.body);
    let statuses = fleet.wait_settled(Duration::from_secs(90)).await.unwrap();
    assert_eq!(statuses.get("paid"), Some(&1), "{statuses:?}");
    let intents = fleet.intents().await.unwrap();
    assert_eq!((intents.len(), intents[0]["capture_count"].as_i64()), (1, Some(1)));
    let mut events: Vec<String> =
        fleet.notifications(2, Duration::from_secs(30)).await.unwrap().into_iter().map(|(e, _)| e).collect();
    events.sort();
    assert_eq!(events, ["order.accepted", "order.paid"]);
    assert_eq!(uids_of("order-intake"), ["10001"], "the intake runs as the image's user");
    assert_eq!(buildah(&["inspect", "--format", "{{.Docker.Config.User}}", &image]), "10001:10001");
    let box_ = "orderfleet-box".to_owned();
    let commands: Vec<(String, String)> = [
        "fleetctl",
        "healthcheck",
        "notification-worker",
        "order-intake",
        "orderfleet-box",
        "outbox-relay",
        "stock-worker",
    ]
    .iter()
    .map(|name| (name.to_string(), box_.clone()))
    .collect();
    assert_eq!(container.commands(), commands, "one binary, and each command a link to it");
    let intake_metrics = fleet.metrics_url("order-intake").unwrap().trim_start_matches("http://");
    let addr = intake_metrics.trim_end_matches("/metrics");
    let healthy = container.status(&format!("METRICS_LISTEN_ADDR={addr}"), &["/usr/local/bin/healthcheck"]);
    let nobody = format!("METRICS_LISTEN_ADDR=127.0.0.1:{}", fleet_harness::free_port());
    let unhealthy = container.status(&nobody, &["/usr/local/bin/healthcheck"]);
    assert_eq!((healthy, unhealthy), (true, false), "the health check against a live intake, then nothing");
    // Every binary stops cleanly on SIGTERM through `buildah run`, as under `docker stop`.
    fleet.stop().await.unwrap();
}
