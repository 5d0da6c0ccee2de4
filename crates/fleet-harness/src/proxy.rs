//! A TCP proxy a test can cut and restore: put it between the fleet and LocalStack (an SQS
//! outage) or PostgreSQL (a database outage). Cut, it drops every open connection and every
//! new one at once, as a dead host behind a firewall that rejects would.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Proxy {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    // Bumped on every cut, so open connections notice and close.
    generation: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let task = tokio::spawn({
            let cut = cut.clone();
            let generation = generation.clone();
            async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    if cut.load(Ordering::Acquire) {
                        drop(inbound);
                        continue;
                    }
                    let mut changed = generation.subscribe();
                    tokio::spawn(async move {
                        let Ok(mut outbound) = TcpStream::connect(target).await else { return };
                        let mut inbound = inbound;
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = changed.changed() => {}
                        }
                    });
                }
            }
        });
        Ok(Self { addr, cut, generation, task })
    }

    /// Drops every connection, and refuses new ones until [`Proxy::restore`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Release);
        self.generation.send_modify(|g| *g += 1);
    }

    pub fn restore(&self) {
        self.cut.store(false, Ordering::Release);
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
