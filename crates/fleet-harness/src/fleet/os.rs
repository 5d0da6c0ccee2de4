//! The processes' view's dealings with the machine: the loopback ports its processes bind,
//! claimed across the test runner's processes, and the signals it sends the binaries a child
//! runs.

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

/// Sends `signal` to the binary a child of ours runs: the child itself, or, inside the image
/// (`in_image`), the binary `buildah run` started, as Docker or ECS would (buildah, signalled
/// itself, kills its child instead of passing SIGTERM on).
pub(super) fn signal_binary(pid: u32, signal: i32, in_image: bool) {
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
