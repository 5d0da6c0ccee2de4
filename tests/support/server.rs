//! A PostgreSQL server of the test's own, for the faults that act on the server itself (a
//! restart mid-burst): restarting the shared cluster would cut every test running beside it.
//!
//! The server is the machine's PostgreSQL binaries (`pg_config --bindir`) over a data
//! directory in a fresh temporary directory, listening on a free loopback port. PostgreSQL
//! refuses to run as root, so under root every `pg_ctl`/`initdb` runs as the `postgres` user,
//! as Debian's `pg_ctlcluster` does. Dropping the server stops it (immediately) and removes
//! its directory.

use std::path::PathBuf;
use std::process::Command;

use anyhow::Context;

pub struct PostgresServer {
    bindir: PathBuf,
    dir: PathBuf,
    pub port: u16,
    /// The server's options (port, socket directory, …), given to every start.
    options: String,
    as_postgres: bool,
}

/// The superuser and database a [`PostgresServer`] is made with (loopback, trust: throwaway).
const USER: &str = "orderfleet";

impl PostgresServer {
    /// initdb, then start; answers once the server accepts connections.
    pub fn start() -> anyhow::Result<Self> {
        let bindir = bindir()?;
        let as_postgres = is_root();
        let dir = PathBuf::from(output(
            as_postgres,
            Command::new("mktemp").args(["-d", "-t", "orderfleet-pg-XXXXXX"]),
        )?);
        let port = fleet_harness::free_port();
        // Sockets in the temporary directory, so none collides with the machine's cluster.
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=150",
            dir.display()
        );
        let server = Self { bindir, dir, port, options, as_postgres };
        server.pg(
            "initdb",
            &["-D", &server.data(), "-U", USER, "-A", "trust", "--no-sync", "--no-instructions"],
        )?;
        server.start_again()?;
        Ok(server)
    }

    /// The URL of `database` on this server.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{database}", self.port)
    }

    /// What `pg_ctlcluster restart` does: a fast shutdown (every session terminated, open
    /// transactions rolled back), then a start with the same options; returns once the server
    /// accepts connections again.
    pub fn restart(&self) -> anyhow::Result<()> {
        // The log again: without it the new server would write to (and hold open) our pipe.
        self.pg("pg_ctl", &["-D", &self.data(), "-l", &self.log(), "-m", "fast", "-w", "restart"])
    }

    /// A restart that takes `down` (a big checkpoint, a host reboot): a fast shutdown, then
    /// nothing listening for that long, then a start.
    pub fn restart_slowly(&self, down: std::time::Duration) -> anyhow::Result<()> {
        self.pg("pg_ctl", &["-D", &self.data(), "-m", "fast", "-w", "stop"])?;
        std::thread::sleep(down);
        self.start_again()
    }

    fn start_again(&self) -> anyhow::Result<()> {
        self.pg("pg_ctl", &["-D", &self.data(), "-l", &self.log(), "-o", &self.options, "-w", "start"])
    }

    fn log(&self) -> String {
        self.dir.join("server.log").to_string_lossy().into_owned()
    }

    fn data(&self) -> String {
        self.dir.join("data").to_string_lossy().into_owned()
    }

    fn pg(&self, tool: &str, args: &[&str]) -> anyhow::Result<()> {
        let mut command = Command::new(self.bindir.join(tool));
        command.args(args);
        output(self.as_postgres, &mut command).map(|_| ())
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        let _ = self.pg("pg_ctl", &["-D", &self.data(), "-m", "immediate", "-w", "stop"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn bindir() -> anyhow::Result<PathBuf> {
    let out = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .context("pg_config not found: this test runs a PostgreSQL server of its own and needs the PostgreSQL server binaries (`make up` installs them)")?;
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}

/// Runs `command` (as `postgres` under root); its trimmed stdout, or an error carrying stderr.
fn output(as_postgres: bool, command: &mut Command) -> anyhow::Result<String> {
    let program = command.get_program().to_owned();
    let mut command = if as_postgres {
        let mut wrapped = Command::new("runuser");
        wrapped.args(["-u", "postgres", "--"]).arg(&program).args(command.get_args());
        wrapped
    } else {
        let mut same = Command::new(&program);
        same.args(command.get_args());
        same
    };
    let out = command.output().with_context(|| format!("failed to run {}", program.to_string_lossy()))?;
    anyhow::ensure!(
        out.status.success(),
        "{} failed ({}): {}",
        program.to_string_lossy(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}
