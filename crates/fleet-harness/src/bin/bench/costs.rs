//! What a run costs, counted where it is spent, in figures that do not depend on the machine's
//! speed: each fleet process's PostgreSQL round trips and transactions (through a counting
//! proxy of its own, [`fleet_harness::pgcount`]) and CPU seconds (`/proc/<pid>/stat`), and PostgreSQL's own CPU
//! seconds (every `postgres` process of this machine: the bench's server is local and the run
//! is alone on it).

use std::collections::BTreeMap;

use fleet_harness::Fleet;
use fleet_harness::pgcount::PgCounter;

/// The fleet's processes, each spawned with its `DATABASE_URL` through a counter of its own.
pub struct Meter {
    database_url: String,
    counters: Vec<(String, PgCounter)>,
}

/// One process's totals at a moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Reading {
    /// CPU seconds, user and system.
    pub cpu: f64,
    /// PostgreSQL connections opened.
    pub connections: u64,
    /// Round trips to PostgreSQL, pings included.
    pub round_trips: u64,
    /// Of those, pings.
    pub pings: u64,
    /// Transactions ended (each statement outside `BEGIN` is one).
    pub transactions: u64,
}

/// Every process's reading, and PostgreSQL's CPU seconds.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub processes: BTreeMap<String, Reading>,
    pub postgres_cpu: f64,
}

impl Meter {
    /// A meter for a fleet whose database is at `database_url` (a TCP address).
    pub async fn new(database_url: &str) -> anyhow::Result<Self> {
        // A URL naming no server is refused here, not at the first spawn.
        PgCounter::server_of(database_url)?;
        Ok(Self { database_url: database_url.to_owned(), counters: Vec::new() })
    }

    /// Spawns `bin` as `label` with `env`, its database connections through a new counter.
    pub async fn spawn(
        &mut self,
        fleet: &mut Fleet,
        label: &str,
        bin: &str,
        env: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        let (counter, url) = PgCounter::in_front_of(&self.database_url).await?;
        let env: Vec<(&str, &str)> = env.iter().copied().chain([("DATABASE_URL", url.as_str())]).collect();
        fleet.spawn(label, bin, &env)?;
        self.counters.push((label.to_owned(), counter));
        Ok(())
    }

    /// Every metered process's totals now.
    pub fn read(&self, fleet: &Fleet) -> Snapshot {
        let processes = self
            .counters
            .iter()
            .map(|(label, counter)| {
                let (connections, round_trips, pings) = counter.counts.read();
                let transactions = counter.counts.transactions();
                let cpu = fleet.pid(label).and_then(cpu_seconds).unwrap_or(f64::NAN);
                (label.clone(), Reading { cpu, connections, round_trips, pings, transactions })
            })
            .collect();
        Snapshot { processes, postgres_cpu: postgres_cpu_seconds() }
    }
}

impl Snapshot {
    /// What was spent from `before` to this one.
    pub fn since(&self, before: &Snapshot) -> Snapshot {
        let processes = self
            .processes
            .iter()
            .map(|(label, now)| {
                let then = before.processes.get(label).copied().unwrap_or_default();
                let spent = Reading {
                    cpu: now.cpu - then.cpu,
                    connections: now.connections - then.connections,
                    round_trips: now.round_trips - then.round_trips,
                    pings: now.pings - then.pings,
                    transactions: now.transactions - then.transactions,
                };
                (label.clone(), spent)
            })
            .collect();
        Snapshot { processes, postgres_cpu: self.postgres_cpu - before.postgres_cpu }
    }

    /// The processes' sum.
    pub fn total(&self) -> Reading {
        self.processes.values().fold(Reading::default(), |sum, r| Reading {
            cpu: sum.cpu + r.cpu,
            connections: sum.connections + r.connections,
            round_trips: sum.round_trips + r.round_trips,
            pings: sum.pings + r.pings,
            transactions: sum.transactions + r.transactions,
        })
    }

    /// Each process's share of `what` per `n` (orders, buyers), as `label a, label b`.
    pub fn each(&self, n: usize, what: impl Fn(&Reading) -> f64) -> String {
        self.processes
            .iter()
            .map(|(label, r)| format!("{label} {:.2}", what(r) / n.max(1) as f64))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// User plus system CPU seconds of process `pid` so far.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    ticks(pid, 11..=12)
}

/// The CPU seconds of process `pid` and of its children that ended and were waited for.
fn cpu_seconds_with_ended_children(pid: u32) -> Option<f64> {
    ticks(pid, 11..=14)
}

/// The sum of `/proc/<pid>/stat`'s fields `which`, counted after the command name (11, 12:
/// the process's user and system time; 13, 14: its waited-for children's), in seconds.
fn ticks(pid: u32, which: std::ops::RangeInclusive<usize>) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let mut ticks = 0u64;
    for field in which {
        ticks += fields.get(field)?.parse::<u64>().ok()?;
    }
    // /proc counts in USER_HZ, which Linux fixes at 100 for user space.
    Some(ticks as f64 / 100.0)
}

/// The CPU seconds of every `postgres` process of this machine: the server, its live
/// backends, and, through the server's count of its waited-for children, the backends that
/// ended. (Without the last, a run whose connections closed read less than it began with:
/// the drop once measured −1.71 ms per buyer.)
fn postgres_cpu_seconds() -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else { return f64::NAN };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "postgres")
        })
        .filter_map(cpu_seconds_with_ended_children)
        .sum()
}
