//! A small TCP rendezvous: the process of rank 0 hands a payload (the NCCL unique
//! id) to every other process before the communicators are created, as torchrun's
//! `MASTER_ADDR` / `MASTER_PORT` store does for PyTorch.
//!
//! Plain `std::net`, no CUDA: it compiles and is tested in the default build.
//!
//! Protocol (version 1). A peer connects to `MASTER_ADDR:MASTER_PORT` (retrying
//! until the deadline: rank 0 may start later) and sends
//! `MAGIC, rank: u32, world_size: u32` (big endian). Rank 0 checks each hello (rank
//! in range, same world size, no duplicate), waits until every peer has arrived,
//! then answers each one `0u8, len: u32, payload`. If the deadline passes first it
//! answers the peers that did arrive `1u8, len: u32, message` and returns
//! [`RendezvousError::Timeout`] naming the ranks that never came.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::error::RendezvousError;

const MAGIC: &[u8; 8] = b"ADBRDZV1";
const STATUS_OK: u8 = 0;
const STATUS_FAILED: u8 = 1;
/// Largest payload accepted (the NCCL id is 128 bytes).
const MAX_PAYLOAD: u32 = 1 << 16;
/// How long a peer waits for rank 0's answer beyond its own deadline (rank 0
/// answers within its deadline, which started at about the same time).
const ANSWER_GRACE: Duration = Duration::from_secs(10);

/// Where and how a process meets the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    /// Host of rank 0 (`MASTER_ADDR`).
    pub master_addr: String,
    /// Port rank 0 listens on (`MASTER_PORT`).
    pub master_port: u16,
    /// This participant (0 = the one that listens and owns the payload).
    pub rank: usize,
    /// Number of participants.
    pub world_size: usize,
    /// How long to wait for everyone.
    pub timeout: Duration,
}

impl Rendezvous {
    /// The address string `host:port`.
    pub fn addr(&self) -> String {
        if self.master_addr.contains(':') && !self.master_addr.starts_with('[') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }

    fn check(&self) -> Result<(), RendezvousError> {
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(RendezvousError::Protocol(format!(
                "rank {} is not in a world of {}",
                self.rank, self.world_size
            )));
        }
        if self.world_size > u32::MAX as usize {
            return Err(RendezvousError::Protocol(format!(
                "world size {} is too large",
                self.world_size
            )));
        }
        Ok(())
    }

    /// Binds rank 0's listener (before any payload exists, so peers can connect
    /// while rank 0 is still preparing). Tries `MASTER_ADDR` itself first, then
    /// every interface (the address may name this host by a public name).
    pub fn listen(&self) -> Result<TcpListener, RendezvousError> {
        self.check()?;
        let addr = self.addr();
        let resolved = resolve(&addr)?;
        let mut last = address_error(&addr, "no address".into(), None);
        for candidate in resolved
            .iter()
            .copied()
            .chain(std::iter::once(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                self.master_port,
            )))
        {
            match TcpListener::bind(candidate) {
                Ok(l) => return Ok(l),
                Err(e) => last = address_error(&addr, format!("cannot bind {candidate}"), Some(e)),
            }
        }
        Err(last)
    }

    /// Rank 0: waits for every peer on `listener`, then sends them `payload`.
    pub fn serve(&self, listener: &TcpListener, payload: &[u8]) -> Result<(), RendezvousError> {
        self.check()?;
        if self.rank != 0 {
            return Err(RendezvousError::Protocol(format!(
                "rank {} called serve; only rank 0 serves",
                self.rank
            )));
        }
        if payload.len() > MAX_PAYLOAD as usize {
            return Err(RendezvousError::Protocol(format!(
                "payload of {} bytes exceeds {MAX_PAYLOAD}",
                payload.len()
            )));
        }
        let started = Instant::now();
        let deadline = started + self.timeout;
        let mut peers: Vec<Option<TcpStream>> = (0..self.world_size).map(|_| None).collect();
        let mut arrived = 1; // rank 0 itself
        let set_nonblocking = |on: bool| {
            listener.set_nonblocking(on).map_err(|e| {
                address_error(&self.addr(), "cannot set up the listener".into(), Some(e))
            })
        };
        set_nonblocking(true)?;
        let result = loop {
            if arrived == self.world_size {
                break Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = (1..self.world_size)
                    .filter(|&r| peers[r].is_none())
                    .collect();
                break Err(RendezvousError::Timeout {
                    missing,
                    world_size: self.world_size,
                    addr: self.addr(),
                    waited: started.elapsed(),
                });
            }
            match listener.accept() {
                Ok((mut stream, from)) => {
                    // A hello that does not parse is a stray connection (a port
                    // scanner, a late peer of an older run): drop it and go on.
                    let hello = read_hello(&mut stream, deadline.min(now + Duration::from_secs(5)));
                    match self.admit(hello, &mut stream, from, &peers) {
                        Ok(Some(rank)) => {
                            peers[rank] = Some(stream);
                            arrived += 1;
                        }
                        Ok(None) => continue,
                        Err(e) => break Err(e),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    break Err(address_error(
                        &self.addr(),
                        "cannot accept a peer".into(),
                        Some(e),
                    ))
                }
            }
        };
        let _ = set_nonblocking(false);
        let failed_sends = answer_all(&mut peers, &result, payload);
        result?;
        if failed_sends.is_empty() {
            Ok(())
        } else {
            Err(RendezvousError::Protocol(format!(
                "could not send the id to rank(s) {failed_sends:?} (they hung up)"
            )))
        }
    }

    /// A peer's hello: the rank to admit, `None` for a stray connection (a port
    /// scanner, a late peer of an older run: a hello that does not parse), or the
    /// error that ends the rendezvous (also sent to that peer).
    fn admit<E>(
        &self,
        hello: Result<(usize, usize), E>,
        stream: &mut TcpStream,
        from: std::net::SocketAddr,
        peers: &[Option<TcpStream>],
    ) -> Result<Option<usize>, RendezvousError> {
        let msg = match hello {
            Err(_) => return Ok(None),
            Ok((rank, world)) if world != self.world_size => format!(
                "rank {rank} at {from} expects a world of {world}, rank 0 has {}",
                self.world_size
            ),
            Ok((rank, _)) if rank == 0 || rank >= self.world_size => format!(
                "a peer at {from} claims rank {rank} in a world of {}",
                self.world_size
            ),
            Ok((rank, _)) if peers[rank].is_some() => {
                format!("rank {rank} arrived twice (again from {from})")
            }
            Ok((rank, _)) => return Ok(Some(rank)),
        };
        let _ = send_answer(stream, STATUS_FAILED, msg.as_bytes());
        Err(RendezvousError::Protocol(msg))
    }

    /// A peer (rank > 0): connects to rank 0 (retrying until the deadline) and
    /// returns its payload.
    pub fn join(&self) -> Result<Vec<u8>, RendezvousError> {
        self.check()?;
        if self.rank == 0 {
            return Err(RendezvousError::Protocol(
                "rank 0 serves the rendezvous; it does not join it".into(),
            ));
        }
        let addr = self.addr();
        let started = Instant::now();
        let deadline = started + self.timeout;
        let unreachable =
            |doing: &str, error: Option<std::io::Error>| RendezvousError::MasterUnreachable {
                rank: self.rank,
                addr: addr.clone(),
                waited: started.elapsed(),
                doing: doing.into(),
                source: error.map(Arc::new),
            };
        let mut backoff = Duration::from_millis(20);
        let mut stream = loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(unreachable("connecting: refused or timed out", None));
            }
            let attempt = resolve(&addr).and_then(|addrs| {
                let mut last = address_error(&addr, "no address".into(), None);
                for a in addrs {
                    match TcpStream::connect_timeout(
                        &a,
                        (deadline - now).min(Duration::from_secs(2)),
                    ) {
                        Ok(s) => return Ok(s),
                        Err(e) => {
                            last = address_error(&addr, format!("cannot connect to {a}"), Some(e))
                        }
                    }
                }
                Err(last)
            });
            match attempt {
                Ok(s) => break s,
                Err(_) => {
                    std::thread::sleep(
                        backoff.min(deadline.saturating_duration_since(Instant::now())),
                    );
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let mut hello = Vec::with_capacity(16);
        hello.extend_from_slice(MAGIC);
        hello.extend_from_slice(&(self.rank as u32).to_be_bytes());
        hello.extend_from_slice(&(self.world_size as u32).to_be_bytes());
        stream
            .write_all(&hello)
            .map_err(|e| unreachable("sending hello", Some(e)))?;
        let answer_deadline = deadline + ANSWER_GRACE;
        let mut status = [0u8; 1];
        read_exact_by(&mut stream, &mut status, answer_deadline)
            .map_err(|e| unreachable("waiting for the id", Some(e)))?;
        let mut len = [0u8; 4];
        read_exact_by(&mut stream, &mut len, answer_deadline)
            .map_err(|e| unreachable("reading the id length", Some(e)))?;
        let len = u32::from_be_bytes(len);
        if len > MAX_PAYLOAD {
            return Err(RendezvousError::Protocol(format!(
                "rank 0 announced {len} bytes (more than {MAX_PAYLOAD})"
            )));
        }
        let mut body = vec![0u8; len as usize];
        read_exact_by(&mut stream, &mut body, answer_deadline)
            .map_err(|e| unreachable("reading the id", Some(e)))?;
        match status[0] {
            STATUS_OK => Ok(body),
            _ => Err(RendezvousError::Aborted {
                rank: self.rank,
                message: String::from_utf8_lossy(&body).into_owned(),
            }),
        }
    }
}

fn resolve(addr: &str) -> Result<Vec<SocketAddr>, RendezvousError> {
    addr.to_socket_addrs()
        .map(Iterator::collect)
        .map_err(|e| address_error(addr, "cannot resolve".into(), Some(e)))
}

/// The address `addr` could not be used: `detail` says for what.
fn address_error(addr: &str, detail: String, error: Option<std::io::Error>) -> RendezvousError {
    RendezvousError::Address {
        addr: addr.into(),
        detail,
        source: error.map(Arc::new),
    }
}

fn read_hello(stream: &mut TcpStream, deadline: Instant) -> std::io::Result<(usize, usize)> {
    stream.set_nonblocking(false)?;
    let mut hello = [0u8; 16];
    read_exact_by(stream, &mut hello, deadline)?;
    if &hello[..8] != MAGIC {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not an adabatch rendezvous hello",
        ));
    }
    let word = |i: usize| u32::from_be_bytes([hello[i], hello[i + 1], hello[i + 2], hello[i + 3]]);
    Ok((word(8) as usize, word(12) as usize))
}

fn send_answer(stream: &mut TcpStream, status: u8, body: &[u8]) -> std::io::Result<()> {
    let mut msg = Vec::with_capacity(5 + body.len());
    msg.push(status);
    msg.extend_from_slice(&(body.len() as u32).to_be_bytes());
    msg.extend_from_slice(body);
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(&msg)?;
    stream.flush()
}

/// `read_exact` that gives up at `deadline`.
fn read_exact_by(stream: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "deadline passed",
            ));
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "connection closed",
                ))
            }
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The variables torchrun sets for each process it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TorchrunEnv {
    /// `RANK`: this process among all processes.
    pub rank: usize,
    /// `WORLD_SIZE`: number of processes.
    pub world_size: usize,
    /// `LOCAL_RANK`: this process among the processes of its node.
    pub local_rank: usize,
    /// `LOCAL_WORLD_SIZE`: processes on this node.
    pub local_world_size: usize,
    /// `MASTER_ADDR`.
    pub master_addr: String,
    /// `MASTER_PORT`.
    pub master_port: u16,
    /// The port of adabatch's own rendezvous: `ADABATCH_RENDEZVOUS_PORT`, default
    /// `MASTER_PORT + 1` (torchrun's agent already listens on `MASTER_PORT`).
    pub rendezvous_port: u16,
}

impl TorchrunEnv {
    /// Reads the process environment.
    #[cfg(any(feature = "internals", feature = "nccl"))]
    pub fn from_env() -> Result<Self, RendezvousError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads the variables through `lookup` (tests pass a map).
    /// `LOCAL_RANK` defaults to 0 and `LOCAL_WORLD_SIZE` to 1 (one process per
    /// node); the others are required.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, RendezvousError> {
        fn number<T: std::str::FromStr>(
            lookup: &impl Fn(&str) -> Option<String>,
            var: &'static str,
            default: Option<T>,
        ) -> Result<T, RendezvousError>
        where
            T::Err: std::error::Error + Send + Sync + 'static,
        {
            match lookup(var) {
                Some(v) => v.trim().parse().map_err(|e| RendezvousError::Env {
                    var,
                    detail: format!("`{v}` is not a valid number"),
                    source: Some(Arc::new(e)),
                }),
                None => default.ok_or(RendezvousError::Env {
                    var,
                    detail: "not set (launch with torchrun, or set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)".into(),
                    source: None,
                }),
            }
        }
        let env = TorchrunEnv {
            rank: number(&lookup, "RANK", None)?,
            world_size: number(&lookup, "WORLD_SIZE", None)?,
            local_rank: number(&lookup, "LOCAL_RANK", Some(0))?,
            local_world_size: number(&lookup, "LOCAL_WORLD_SIZE", Some(1))?,
            master_addr: lookup("MASTER_ADDR").ok_or(RendezvousError::Env {
                var: "MASTER_ADDR",
                detail: "not set".into(),
                source: None,
            })?,
            master_port: number(&lookup, "MASTER_PORT", None)?,
            rendezvous_port: 0,
        };
        let mut env = env;
        env.rendezvous_port = match lookup("ADABATCH_RENDEZVOUS_PORT") {
            Some(_) => number(&lookup, "ADABATCH_RENDEZVOUS_PORT", None)?,
            None => env.master_port.checked_add(1).ok_or(RendezvousError::Env {
                var: "MASTER_PORT",
                detail: "65535 leaves no port for the rendezvous: set ADABATCH_RENDEZVOUS_PORT"
                    .into(),
                source: None,
            })?,
        };
        if env.world_size == 0 || env.rank >= env.world_size {
            return Err(RendezvousError::Env {
                var: "RANK",
                detail: format!("{} is not below WORLD_SIZE = {}", env.rank, env.world_size),
                source: None,
            });
        }
        if env.local_world_size == 0 || env.local_rank >= env.local_world_size {
            return Err(RendezvousError::Env {
                var: "LOCAL_RANK",
                detail: format!(
                    "{} is not below LOCAL_WORLD_SIZE = {}",
                    env.local_rank, env.local_world_size
                ),
                source: None,
            });
        }
        Ok(env)
    }

    /// The rendezvous of these processes.
    pub fn rendezvous(&self, timeout: Duration) -> Rendezvous {
        Rendezvous {
            master_addr: self.master_addr.clone(),
            master_port: self.rendezvous_port,
            rank: self.rank,
            world_size: self.world_size,
            timeout,
        }
    }
}

/// Exchanges a payload: rank 0 calls `make_payload` (after its listener is up) and
/// sends the result to everyone; every rank returns it.
pub fn exchange(
    rdzv: &Rendezvous,
    make_payload: impl FnOnce() -> Result<Vec<u8>, RendezvousError>,
) -> Result<Vec<u8>, RendezvousError> {
    if rdzv.rank == 0 {
        let listener = rdzv.listen()?;
        let payload = make_payload()?;
        if rdzv.world_size > 1 {
            rdzv.serve(&listener, &payload)?;
        }
        Ok(payload)
    } else {
        rdzv.join()
    }
}

/// Rank 0's answer to every peer that arrived: the payload, or why the
/// rendezvous failed. Returns the ranks it could not reach.
fn answer_all(
    peers: &mut [Option<TcpStream>],
    result: &Result<(), RendezvousError>,
    payload: &[u8],
) -> Vec<usize> {
    let (status, body) = match result {
        Ok(()) => (STATUS_OK, payload.to_vec()),
        Err(e) => (STATUS_FAILED, e.to_string().into_bytes()),
    };
    let mut failed_sends = Vec::new();
    for (rank, stream) in peers.iter_mut().enumerate() {
        if let Some(stream) = stream {
            if send_answer(stream, status, &body).is_err() {
                failed_sends.push(rank);
            }
        }
    }
    failed_sends
}

#[cfg(test)]
mod tests {
    //! No sleeps and no port races: rank 0's listener is bound to port 0 before
    //! anyone connects and handed to `serve`, so a peer's connection waits in the
    //! listener's backlog whatever the threads' timing. Timeouts only bound a
    //! failure, except where the timeout is what is tested; there the other side's
    //! part is done first, by hand.
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// Long enough never to fire on a loaded machine: it only bounds a failure.
    const GENEROUS_MS: u64 = 30_000;

    /// Rank 0's listener on a loopback port chosen by the OS, and its port.
    fn bound() -> (TcpListener, u16) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        (listener, port)
    }

    fn rdzv(port: u16, rank: usize, world_size: usize, timeout_ms: u64) -> Rendezvous {
        Rendezvous {
            master_addr: "127.0.0.1".into(),
            master_port: port,
            rank,
            world_size,
            timeout: Duration::from_millis(timeout_ms),
        }
    }

    /// A peer's hello, written by hand.
    fn hello(rank: u32, world_size: u32) -> Vec<u8> {
        let mut h = MAGIC.to_vec();
        h.extend_from_slice(&rank.to_be_bytes());
        h.extend_from_slice(&world_size.to_be_bytes());
        h
    }

    /// Reads rank 0's answer on a hand-made peer connection.
    fn read_answer(stream: &mut TcpStream) -> (u8, Vec<u8>) {
        let deadline = Instant::now() + Duration::from_millis(GENEROUS_MS);
        let mut head = [0u8; 5];
        read_exact_by(stream, &mut head, deadline).unwrap();
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut body = vec![0u8; len];
        read_exact_by(stream, &mut body, deadline).unwrap();
        (head[0], body)
    }

    #[test]
    fn every_rank_gets_rank_zeros_payload() {
        let (listener, port) = bound();
        let id: Vec<u8> = (0..128u8).collect();
        let (served, joined) = std::thread::scope(|s| {
            // Peers start before rank 0 serves: their connections wait in the backlog.
            let peers: Vec<_> = (1..4)
                .map(|rank| s.spawn(move || rdzv(port, rank, 4, GENEROUS_MS).join()))
                .collect();
            let served = rdzv(port, 0, 4, GENEROUS_MS).serve(&listener, &id);
            let joined: Vec<_> = peers.into_iter().map(|h| h.join().unwrap()).collect();
            (served, joined)
        });
        served.unwrap();
        for r in joined {
            assert_eq!(r.unwrap(), id);
        }
    }

    #[test]
    fn world_of_one_needs_no_peer() {
        // Port 0: the OS picks one; nobody connects.
        let got = exchange(&rdzv(0, 0, 1, GENEROUS_MS), || Ok(vec![7])).unwrap();
        assert_eq!(got, vec![7]);
    }

    #[test]
    fn missing_peers_time_out_with_their_ranks() {
        let (listener, port) = bound();
        // Rank 2 arrives (by hand, before rank 0 serves, so it is in time whatever
        // the scheduling); ranks 1 and 3 never do. The timeout is what is tested.
        let mut rank2 = TcpStream::connect(("127.0.0.1", port)).unwrap();
        rank2.write_all(&hello(2, 4)).unwrap();
        let started = Instant::now();
        let r0 = rdzv(port, 0, 4, 300).serve(&listener, &[1, 2, 3]);
        match r0 {
            Err(RendezvousError::Timeout {
                missing,
                world_size: 4,
                addr,
                waited,
            }) => {
                assert_eq!(missing, vec![1, 3]);
                assert_eq!(addr, format!("127.0.0.1:{port}"));
                assert!(waited >= Duration::from_millis(300), "{waited:?}");
            }
            other => panic!("expected a timeout naming ranks 1 and 3, got {other:?}"),
        }
        assert!(started.elapsed() >= Duration::from_millis(300));
        // Rank 2 hears rank 0 give up, with the missing ranks.
        let (status, body) = read_answer(&mut rank2);
        assert_eq!(status, STATUS_FAILED);
        let message = String::from_utf8(body).unwrap();
        assert!(message.contains("[1, 3]"), "{message}");
        // The run's error keeps the rendezvous error's type.
        let err = crate::Error::from(RendezvousError::Timeout {
            missing: vec![1, 3],
            world_size: 4,
            addr: "127.0.0.1:1".into(),
            waited: Duration::from_millis(300),
        });
        assert!(
            matches!(&err, crate::Error::Distributed(crate::DistributedError::Rendezvous(RendezvousError::Timeout { missing, .. })) if missing == &[1, 3]),
            "{err}"
        );
    }

    #[test]
    fn a_peer_hears_rank_zero_abort() {
        // The peer side of the same failure, through `join`: rank 0 (by hand)
        // reads the hello and answers with a failure.
        let (listener, port) = bound();
        let (joined, ()) = std::thread::scope(|s| {
            let peer = s.spawn(|| rdzv(port, 2, 4, GENEROUS_MS).join());
            let (mut stream, _) = listener.accept().unwrap();
            let deadline = Instant::now() + Duration::from_millis(GENEROUS_MS);
            assert_eq!(read_hello(&mut stream, deadline).unwrap(), (2, 4));
            send_answer(&mut stream, STATUS_FAILED, b"rank(s) [1, 3] did not arrive").unwrap();
            (peer.join().unwrap(), ())
        });
        match joined {
            Err(RendezvousError::Aborted { rank: 2, message }) => {
                assert!(message.contains("[1, 3]"), "{message}")
            }
            other => panic!("rank 2 should hear rank 0 give up, got {other:?}"),
        }
    }

    #[test]
    fn rank_zero_hanging_up_is_reported_by_the_peer() {
        // Rank 0 accepts and closes without answering: the peer reports it at once
        // (the event), not after its deadline.
        let (listener, port) = bound();
        let joined = std::thread::scope(|s| {
            let peer = s.spawn(|| rdzv(port, 1, 2, GENEROUS_MS).join());
            let (stream, _) = listener.accept().unwrap();
            let mut stream = stream;
            let deadline = Instant::now() + Duration::from_millis(GENEROUS_MS);
            assert_eq!(read_hello(&mut stream, deadline).unwrap(), (1, 2));
            drop(stream);
            peer.join().unwrap()
        });
        match joined {
            Err(RendezvousError::MasterUnreachable {
                rank: 1,
                addr,
                waited,
                doing,
                source,
            }) => {
                assert_eq!(addr, format!("127.0.0.1:{port}"));
                assert_eq!(doing, "waiting for the id");
                assert!(source.is_some());
                assert!(waited < Duration::from_millis(GENEROUS_MS));
            }
            other => panic!("expected MasterUnreachable, got {other:?}"),
        }
    }

    #[test]
    fn mismatched_world_sizes_are_refused() {
        let (listener, port) = bound();
        let (r0, r1) = std::thread::scope(|s| {
            let r1 = s.spawn(|| rdzv(port, 1, 3, GENEROUS_MS).join());
            let r0 = rdzv(port, 0, 2, GENEROUS_MS).serve(&listener, &[9]);
            (r0, r1.join().unwrap())
        });
        assert!(matches!(r0, Err(RendezvousError::Protocol(m)) if m.contains("world of 3")));
        assert!(matches!(r1, Err(RendezvousError::Aborted { rank: 1, .. })));
    }

    #[test]
    fn duplicate_and_out_of_range_ranks_are_refused() {
        for (first, second, expected) in [
            (hello(1, 3), hello(1, 3), "arrived twice"),
            (hello(5, 3), hello(1, 3), "claims rank 5"),
            (hello(0, 3), hello(1, 3), "claims rank 0"),
        ] {
            let (listener, port) = bound();
            let mut a = TcpStream::connect(("127.0.0.1", port)).unwrap();
            a.write_all(&first).unwrap();
            let mut b = TcpStream::connect(("127.0.0.1", port)).unwrap();
            b.write_all(&second).unwrap();
            let r0 = rdzv(port, 0, 3, GENEROUS_MS).serve(&listener, &[1]);
            assert!(
                matches!(&r0, Err(RendezvousError::Protocol(m)) if m.contains(expected)),
                "{expected}: {r0:?}"
            );
        }
    }

    #[test]
    fn stray_connections_are_ignored() {
        let (listener, port) = bound();
        // The stray connection is queued first, then the real peer.
        let mut stray = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stray.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        drop(stray);
        let (r0, r1) = std::thread::scope(|s| {
            let r1 = s.spawn(|| rdzv(port, 1, 2, GENEROUS_MS).join());
            let r0 = rdzv(port, 0, 2, GENEROUS_MS).serve(&listener, &[5, 6]);
            (r0, r1.join().unwrap())
        });
        r0.unwrap();
        assert_eq!(r1.unwrap(), vec![5, 6]);
    }

    /// Cases of the hello properties: a few here, thousands from
    /// `scripts/fuzz-readers.sh` (`ADABATCH_FUZZ_CASES`).
    fn fuzz_cases() -> u32 {
        std::env::var("ADABATCH_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(16)
    }

    /// What a stray connection sends before it hangs up: arbitrary bytes, the
    /// magic and arbitrary bytes, or a hello of a small rank and world (a late
    /// peer of another run) with arbitrary bytes after it.
    fn stray_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..40),
            prop::collection::vec(any::<u8>(), 0..32).prop_map(|tail| [&MAGIC[..], &tail].concat()),
            (0..4u32, 0..4u32, prop::collection::vec(any::<u8>(), 0..8))
                .prop_map(|(rank, world, tail)| [hello(rank, world), tail].concat()),
        ]
    }

    /// An answer's bytes: `status`, the length `len` (which `body` may not match).
    fn answer(status: u8, len: u32, body: &[u8]) -> Vec<u8> {
        [&[status][..], &len.to_be_bytes(), body].concat()
    }

    /// What a fake rank 0 answers before it hangs up: arbitrary bytes, or an
    /// answer's shape (a status, a length that may not match, arbitrary bytes;
    /// or any length, with nothing after it).
    fn answer_bytes() -> impl Strategy<Value = Vec<u8>> {
        let body = prop::collection::vec(any::<u8>(), 0..40);
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..40),
            (any::<u8>(), 0..48u32, body).prop_map(|(s, len, body)| answer(s, len, &body)),
            (any::<u8>(), any::<u32>()).prop_map(|(s, len)| answer(s, len, &[])),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: fuzz_cases(),
            // Each case is fresh sockets; nothing to persist but the inputs.
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Rank 0 of a world of 2 first meets a stray connection that sends
        /// `stray` and hangs up, then the real rank 1. A stray that is not a
        /// hello is ignored and the rendezvous completes; one that parses as a
        /// hello is refused as the protocol says (or, claiming rank 1, taken for
        /// it); nothing panics or hangs.
        #[test]
        fn rank_zero_survives_a_stray_hello(stray in stray_bytes()) {
            let (listener, port) = bound();
            // Queued before the real peer exists: rank 0 accepts it first.
            let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
            conn.write_all(&stray).unwrap();
            drop(conn);
            let (r0, r1) = std::thread::scope(|s| {
                let r1 = s.spawn(|| rdzv(port, 1, 2, 2_000).join());
                let r0 = rdzv(port, 0, 2, 10_000).serve(&listener, &[5, 6]);
                // A peer rank 0 did not answer is hung up on, so that it reports
                // it at once rather than at its deadline.
                listener.set_nonblocking(true).unwrap();
                while !r1.is_finished() {
                    if let Ok((late, _)) = listener.accept() {
                        drop(late);
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                (r0, r1.join().unwrap())
            });
            let parsed = (stray.len() >= 16 && stray[..8] == MAGIC[..]).then(|| {
                let word = |i: usize| u32::from_be_bytes(stray[i..i + 4].try_into().unwrap());
                (word(8), word(12))
            });
            match parsed {
                None => {
                    prop_assert!(r0.is_ok(), "{r0:?}");
                    prop_assert!(matches!(&r1, Ok(id) if id == &[5, 6]), "{r1:?}");
                }
                // Taken for rank 1: its answer goes to the stray; the real rank 1
                // is never answered.
                Some((1, 2)) => {
                    prop_assert!(
                        matches!(&r0, Ok(()) | Err(RendezvousError::Protocol(_))),
                        "{r0:?}"
                    );
                    prop_assert!(r1.is_err(), "{r1:?}");
                }
                Some((rank, world)) => {
                    let expected = if world != 2 { "expects a world of" } else { "claims rank" };
                    prop_assert!(
                        matches!(&r0, Err(RendezvousError::Protocol(m)) if m.contains(expected)),
                        "({rank}, {world}): {r0:?}"
                    );
                    prop_assert!(r1.is_err(), "{r1:?}");
                }
            }
        }

        /// A peer joins a fake rank 0 that reads its hello, answers `answer` and
        /// hangs up: the payload or rank 0's message when the answer is whole,
        /// a refused length when it is too long, else a typed error; no panic.
        #[test]
        fn a_peer_survives_any_answer(answer in answer_bytes()) {
            let (listener, port) = bound();
            let joined = std::thread::scope(|s| {
                let peer = s.spawn(|| rdzv(port, 1, 2, 2_000).join());
                let (mut stream, _) = listener.accept().unwrap();
                let deadline = Instant::now() + Duration::from_millis(GENEROUS_MS);
                assert_eq!(read_hello(&mut stream, deadline).unwrap(), (1, 2));
                stream.write_all(&answer).unwrap();
                drop(stream);
                peer.join().unwrap()
            });
            let len = (answer.len() >= 5)
                .then(|| u32::from_be_bytes(answer[1..5].try_into().unwrap()));
            match len {
                Some(len) if len > MAX_PAYLOAD => prop_assert!(
                    matches!(&joined, Err(RendezvousError::Protocol(m)) if m.contains("announced")),
                    "{joined:?}"
                ),
                Some(len) if answer.len() - 5 >= len as usize => {
                    let body = &answer[5..5 + len as usize];
                    match answer[0] {
                        STATUS_OK => prop_assert!(
                            matches!(&joined, Ok(got) if got == body),
                            "{joined:?}"
                        ),
                        _ => prop_assert!(
                            matches!(&joined, Err(RendezvousError::Aborted { rank: 1, message })
                                if *message == String::from_utf8_lossy(body)),
                            "{joined:?}"
                        ),
                    }
                }
                // Cut short: rank 0 hung up mid-answer.
                _ => prop_assert!(
                    matches!(&joined, Err(RendezvousError::MasterUnreachable { rank: 1, .. })),
                    "{joined:?}"
                ),
            }
        }
    }

    #[test]
    fn serve_and_join_check_their_roles() {
        let (listener, port) = bound();
        assert!(matches!(
            rdzv(port, 1, 2, GENEROUS_MS).serve(&listener, &[1]),
            Err(RendezvousError::Protocol(m)) if m.contains("only rank 0 serves")
        ));
        assert!(matches!(
            rdzv(port, 0, 2, GENEROUS_MS).join(),
            Err(RendezvousError::Protocol(_))
        ));
        assert!(matches!(
            rdzv(port, 2, 2, GENEROUS_MS).join(),
            Err(RendezvousError::Protocol(m)) if m.contains("not in a world of 2")
        ));
        let too_big = vec![0u8; MAX_PAYLOAD as usize + 1];
        assert!(matches!(
            rdzv(port, 0, 2, GENEROUS_MS).serve(&listener, &too_big),
            Err(RendezvousError::Protocol(m)) if m.contains("exceeds")
        ));
    }

    #[test]
    fn torchrun_variables_are_parsed_and_checked() {
        let vars = |pairs: &[(&str, &str)]| {
            let map: HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            move |k: &str| map.get(k).cloned()
        };
        let env = TorchrunEnv::from_lookup(vars(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "16"),
            ("LOCAL_RANK", "5"),
            ("LOCAL_WORLD_SIZE", "8"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap();
        assert_eq!((env.rank, env.world_size, env.local_rank), (5, 16, 5));
        // torchrun's agent holds MASTER_PORT: the rendezvous takes the next port,
        // or ADABATCH_RENDEZVOUS_PORT.
        assert_eq!(env.rendezvous(Duration::from_secs(1)).addr(), "node0:29501");
        let own = TorchrunEnv::from_lookup(vars(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
            ("ADABATCH_RENDEZVOUS_PORT", "31000"),
        ]))
        .unwrap();
        assert_eq!(own.rendezvous(Duration::from_secs(1)).addr(), "node0:31000");
        let missing = TorchrunEnv::from_lookup(vars(&[("RANK", "0")])).unwrap_err();
        assert!(matches!(
            missing,
            RendezvousError::Env {
                var: "WORLD_SIZE",
                source: None,
                ..
            }
        ));
        let bad = TorchrunEnv::from_lookup(vars(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ]))
        .unwrap_err();
        assert!(matches!(bad, RendezvousError::Env { var: "RANK", .. }));
        let port = TorchrunEnv::from_lookup(vars(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "http"),
        ]))
        .unwrap_err();
        assert!(matches!(
            port,
            RendezvousError::Env {
                var: "MASTER_PORT",
                source: Some(_),
                ..
            }
        ));
        let v6 = Rendezvous {
            master_addr: "::1".into(),
            master_port: 7,
            rank: 0,
            world_size: 1,
            timeout: Duration::ZERO,
        };
        assert_eq!(v6.addr(), "[::1]:7");
    }
}
