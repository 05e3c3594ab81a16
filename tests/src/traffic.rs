//! Spawning the `tailtrap-traffic` helper: servers that stay up for a test, clients that run
//! a bounded exchange and report what happened.

use std::io::{BufRead, BufReader, Read};
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::bins::traffic_bin;
use crate::cgroup::Cgroup;
use crate::error::{Error, Result};
use crate::netns::Netns;

/// How long a server may take to report its bound address (generous: guests under software
/// emulation start processes slowly).
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// Transport protocol of a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// One TCP connection carrying every message.
    Tcp,
    /// One datagram per message.
    Udp,
}

/// Where and how a server runs.
#[derive(Debug, Clone)]
pub struct ServerOpts<'a> {
    /// Address to bind, IPv4 or IPv6; port 0 picks a free port (see `addr()`).
    pub bind: SocketAddr,
    /// Namespace to run in (the host's when `None`).
    pub netns: Option<&'a Netns>,
    /// Cgroup to run in; joined before the socket is created, so the socket belongs to it.
    pub cgroup: Option<&'a Cgroup>,
    /// Sleep before each read (before each `recv` for UDP); changeable while running.
    pub read_delay: Duration,
}

impl<'a> ServerOpts<'a> {
    /// On `bind` (port 0: a free one), in the host's namespace and the caller's cgroup,
    /// answering at once.
    pub fn at(bind: SocketAddr) -> ServerOpts<'a> {
        ServerOpts {
            bind,
            netns: None,
            cgroup: None,
            read_delay: Duration::ZERO,
        }
    }

    /// [`ServerOpts::at`] 127.0.0.1 with a free port.
    pub fn loopback() -> ServerOpts<'a> {
        ServerOpts::at(SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// In `netns` instead of the host's namespace.
    pub fn in_netns(self, netns: &'a Netns) -> ServerOpts<'a> {
        ServerOpts {
            netns: Some(netns),
            ..self
        }
    }
}

/// Which of the helper's echo servers a [`ServerProcess`] runs: [`TcpKind`] or [`UdpKind`].
pub trait ServerKind {
    /// The helper's subcommand.
    const MODE: &'static str;
}

/// The kind of a [`TcpServer`].
#[derive(Debug)]
pub enum TcpKind {}

/// The kind of a [`UdpServer`].
#[derive(Debug)]
pub enum UdpKind {}

impl ServerKind for TcpKind {
    const MODE: &'static str = "tcp-server";
}

impl ServerKind for UdpKind {
    const MODE: &'static str = "udp-server";
}

/// An echo server process of the helper, of kind `K`: [`TcpServer`] or [`UdpServer`]. Both
/// run the same way, so one implementation serves both. Killed on drop.
#[derive(Debug)]
pub struct ServerProcess<K: ServerKind>(Server, PhantomData<K>);

/// A TCP echo server process: each connection is served by its own thread, which sleeps the
/// current read delay before every read and writes back what it read. Killed on drop.
pub type TcpServer = ServerProcess<TcpKind>;

/// A UDP echo server process: sleeps the current read delay before every `recv` and sends
/// each datagram back to its sender. Killed on drop.
pub type UdpServer = ServerProcess<UdpKind>;

impl<K: ServerKind> ServerProcess<K> {
    /// Starts the server and waits until its socket is bound (a TCP one: listening).
    pub fn spawn(opts: ServerOpts<'_>) -> Result<Self> {
        Server::spawn(K::MODE, &opts, false).map(|s| ServerProcess(s, PhantomData))
    }
    /// Starts a server that reads and discards what it gets (no echo), for senders that do
    /// not wait for one ([`SinkStream`]).
    pub fn spawn_sink(opts: ServerOpts<'_>) -> Result<Self> {
        Server::spawn(K::MODE, &opts, true).map(|s| ServerProcess(s, PhantomData))
    }
    /// The address it is bound to.
    pub fn addr(&self) -> SocketAddr {
        self.0.addr
    }
    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.0.child.id()
    }
    /// Changes the sleep before each read (each `recv` for UDP); takes effect from the next
    /// one on.
    pub fn set_read_delay(&self, delay: Duration) -> Result<()> {
        self.0.set_read_delay(delay)
    }
}

impl TcpServer {
    /// Busies the reading thread's CPU for `work` (its own CPU time) before each read
    /// instead of sleeping: work that a CPU quota holds back. Zero: no pause.
    pub fn set_read_work(&self, work: Duration) -> Result<()> {
        self.0.set_read_work(work)
    }
}

/// An echo server of either protocol on loopback, for tests that run the same scenario
/// over TCP and UDP. Killed on drop.
#[derive(Debug)]
pub enum EchoServer {
    /// A [`TcpServer`].
    Tcp(TcpServer),
    /// A [`UdpServer`].
    Udp(UdpServer),
}

impl EchoServer {
    /// Starts a server of `proto` on 127.0.0.1 (a free port), reading without delay.
    pub fn spawn(proto: Proto) -> Result<EchoServer> {
        let opts = ServerOpts::loopback();
        Ok(match proto {
            Proto::Tcp => EchoServer::Tcp(TcpServer::spawn(opts)?),
            Proto::Udp => EchoServer::Udp(UdpServer::spawn(opts)?),
        })
    }
    /// The address it is bound to.
    pub fn addr(&self) -> SocketAddr {
        match self {
            EchoServer::Tcp(s) => s.addr(),
            EchoServer::Udp(s) => s.addr(),
        }
    }
    /// The server's process id.
    pub fn pid(&self) -> u32 {
        match self {
            EchoServer::Tcp(s) => s.pid(),
            EchoServer::Udp(s) => s.pid(),
        }
    }
    /// Changes the sleep before each read; takes effect from the next read on.
    pub fn set_read_delay(&self, delay: Duration) -> Result<()> {
        match self {
            EchoServer::Tcp(s) => s.set_read_delay(delay),
            EchoServer::Udp(s) => s.set_read_delay(delay),
        }
    }
    /// CPU work before each read instead of a sleep ([`TcpServer::set_read_work`]).
    pub fn set_read_work(&self, work: Duration) -> Result<()> {
        match self {
            EchoServer::Tcp(s) => s.0.set_read_work(work),
            EchoServer::Udp(s) => s.0.set_read_work(work),
        }
    }
}

#[derive(Debug)]
struct Server {
    child: Child,
    addr: SocketAddr,
    /// The helper re-reads the delay from this file before each read.
    delay_file: PathBuf,
    /// Held open only so that the helper sees EOF, and exits, if this process dies.
    _stdin: Option<ChildStdin>,
}

impl Server {
    fn spawn(mode: &str, opts: &ServerOpts<'_>, sink: bool) -> Result<Server> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let delay_file =
            std::env::temp_dir().join(format!("tailtrap-traffic-{}-{n}.delay", std::process::id()));
        write_delay(&delay_file, opts.read_delay)?;
        let mut cmd = Command::new(traffic_bin());
        cmd.arg(mode).arg("--bind").arg(opts.bind.to_string());
        if sink {
            cmd.arg("--sink");
        }
        cmd.arg("--delay-file")
            .arg(&delay_file)
            .arg("--exit-on-stdin-eof");
        add_placement(&mut cmd, opts.netns, opts.cgroup);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .map_err(Error::io(format!("cannot start {mode}")))?;
        let stdin = child.stdin.take();
        let first_line = first_line(&mut child, STARTUP_TIMEOUT);
        let started = first_line.and_then(|line| {
            line.trim()
                .parse()
                .map_err(|_| Error::Traffic(format!("{mode} printed {line:?}, not its address")))
        });
        match started {
            Ok(addr) => Ok(Server {
                child,
                addr,
                delay_file,
                _stdin: stdin,
            }),
            Err(e) => {
                let _ = child.kill();
                let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
                let _ = std::fs::remove_file(&delay_file);
                Err(Error::Traffic(format!(
                    "{mode} did not start ({status}): {e}"
                )))
            }
        }
    }

    fn set_read_delay(&self, delay: Duration) -> Result<()> {
        write_delay(&self.delay_file, delay)
    }
    fn set_read_work(&self, work: Duration) -> Result<()> {
        write_pause(
            &self.delay_file,
            &format!("spin {}", humantime::format_duration(work)),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.delay_file);
    }
}

/// Writes the delay so that a concurrent reader sees the old or the new value, never a
/// partial one.
fn write_delay(path: &std::path::Path, delay: Duration) -> Result<()> {
    write_pause(path, &humantime::format_duration(delay).to_string())
}

fn write_pause(path: &std::path::Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(Error::io(format!("cannot write {}", path.display())))
}

fn add_placement(cmd: &mut Command, netns: Option<&Netns>, cgroup: Option<&Cgroup>) {
    if let Some(ns) = netns {
        cmd.arg("--netns").arg(ns.path());
    }
    if let Some(cg) = cgroup {
        cmd.arg("--cgroup").arg(cg.path());
    }
}

/// Reads the child's first stdout line, giving up after `timeout`.
fn first_line(child: &mut Child, timeout: Duration) -> Result<String> {
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| Error::Traffic("stdout not captured".into()))?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = tx.send(BufReader::new(stdout).read_line(&mut line).map(|_| line));
    });
    match rx.recv_timeout(timeout) {
        Ok(Ok(line)) if !line.is_empty() => Ok(line),
        Ok(Ok(_)) => Err(Error::Traffic("exited before printing its address".into())),
        Ok(Err(e)) => Err(Error::io("cannot read the helper's output")(e)),
        Err(_) => Err(Error::Traffic(format!("no address within {timeout:?}"))),
    }
}

/// A bounded client run: `messages` messages of `size` bytes, each followed by waiting for
/// its echo and then sleeping `pause`.
///
/// With a server read delay `d` and `pause < d`, each message waits about `d - pause` in the
/// server's receive queue, so a small `pause` makes the application-read latency ≈ `d`.
#[derive(Debug, Clone)]
pub struct ClientOpts<'a> {
    /// Server address.
    pub target: SocketAddr,
    /// Namespace to run in (the host's when `None`).
    pub netns: Option<&'a Netns>,
    /// TCP or UDP.
    pub proto: Proto,
    /// Number of messages.
    pub messages: u32,
    /// Bytes per message (UDP: at most 65507; at least 8 to match echoes to messages).
    pub size: usize,
    /// Sleep after each echo.
    pub pause: Duration,
}

impl<'a> ClientOpts<'a> {
    /// `messages` messages of 100 bytes over `proto` to `target`, from the host's namespace,
    /// back to back (each right after the last one's echo).
    pub fn new(target: SocketAddr, proto: Proto, messages: u32) -> ClientOpts<'a> {
        ClientOpts {
            target,
            netns: None,
            proto,
            messages,
            size: 100,
            pause: Duration::ZERO,
        }
    }

    /// From `netns` instead of the host's namespace.
    pub fn in_netns(self, netns: &'a Netns) -> ClientOpts<'a> {
        ClientOpts {
            netns: Some(netns),
            ..self
        }
    }
}

/// What a client run did, as the helper reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientStats {
    /// Messages sent.
    pub sent: u64,
    /// Echoes received.
    pub replies: u64,
    /// UDP messages whose echo did not come within the reply timeout.
    pub lost: u64,
    /// Wall time of the exchange.
    pub elapsed: Duration,
    /// Median round-trip time (zero without replies).
    pub rtt_p50: Duration,
    /// Largest round-trip time (zero without replies).
    pub rtt_max: Duration,
    /// Whether the run stopped at its deadline before sending every message.
    pub deadline_hit: bool,
}

/// The helper's client command line for `opts`, stopping at `deadline`.
fn client_command(mode: &str, opts: &ClientOpts<'_>, deadline: Duration) -> Command {
    let mut cmd = Command::new(traffic_bin());
    cmd.arg(mode).arg("--target").arg(opts.target.to_string());
    cmd.arg("--messages").arg(opts.messages.to_string());
    cmd.arg("--size").arg(opts.size.to_string());
    cmd.arg("--pause")
        .arg(humantime::format_duration(opts.pause).to_string());
    cmd.arg("--deadline")
        .arg(humantime::format_duration(deadline).to_string());
    add_placement(&mut cmd, opts.netns, None);
    cmd
}

/// Runs a client to completion. It always stops by itself: after `messages`, or at a
/// deadline of 60 s + `messages` × (`pause` + 100 ms), with TCP reads timing out after 10 s
/// and UDP echoes counted lost after 5 s; the process is killed if it overstays even that.
pub fn run_client(opts: ClientOpts<'_>) -> Result<ClientStats> {
    let deadline =
        Duration::from_secs(60) + (opts.pause + Duration::from_millis(100)) * opts.messages;
    let mode = match opts.proto {
        Proto::Tcp => "tcp-client",
        Proto::Udp => "udp-client",
    };
    let mut cmd = client_command(mode, &opts, deadline);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(Error::io(format!("cannot start {mode}")))?;
    // Drained on their own threads so that a full pipe cannot stall the child.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let limit = Instant::now() + deadline + Duration::from_secs(15);
    let status = loop {
        match child
            .try_wait()
            .map_err(Error::io(format!("cannot wait for {mode}")))?
        {
            Some(status) => break status,
            None if Instant::now() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Traffic(format!(
                    "{mode} overran its deadline and was killed"
                )));
            }
            None => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    if !status.success() {
        return Err(Error::Traffic(format!(
            "{mode} failed ({status}): {}",
            stderr.trim()
        )));
    }
    serde_json::from_str(stdout.trim())
        .map_err(|e| Error::Traffic(format!("{mode} printed unreadable stats {stdout:?}: {e}")))
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_string(&mut text);
        }
        text
    })
}

/// A client looping fast exchanges (100 messages of 100 bytes, 2 ms apart) against `target`
/// on a thread until dropped: steady background traffic for daemon tests. Errors (a server
/// killed at the end) just end a round.
pub struct LoopingClient {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LoopingClient {
    /// Start looping against `target` over `proto`.
    pub fn start(target: SocketAddr, proto: Proto) -> LoopingClient {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                let _ = run_client(ClientOpts {
                    pause: Duration::from_millis(2),
                    ..ClientOpts::new(target, proto, 100)
                });
            }
        });
        LoopingClient {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for LoopingClient {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A sender that does not wait for echoes, in its own process until its deadline or until
/// dropped (killed then): steady traffic into a sink ([`UdpServer::spawn_sink`],
/// [`TcpServer::spawn`] with no echo read), or with no pause a flood (UDP) or a bulk stream
/// (TCP) as fast as its CPU and the path allow.
#[derive(Debug)]
pub struct SinkStream {
    child: Child,
}

impl SinkStream {
    /// Start sending messages of `size` bytes over `proto` to `target` from `netns` (the
    /// host's when `None`), sleeping `pause` after each (none: as fast as it can), for at
    /// most `deadline`.
    pub fn start(
        proto: Proto,
        target: SocketAddr,
        netns: Option<&Netns>,
        size: usize,
        pause: Duration,
        deadline: Duration,
    ) -> Result<SinkStream> {
        let opts = ClientOpts {
            target,
            netns,
            proto,
            messages: u32::MAX,
            size,
            pause,
        };
        let mode = match proto {
            Proto::Tcp => "tcp-client",
            Proto::Udp => "udp-client",
        };
        let mut cmd = client_command(mode, &opts, deadline);
        cmd.arg("--sink");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = cmd
            .spawn()
            .map_err(Error::io(format!("cannot start a stream ({mode} --sink)")))?;
        Ok(SinkStream { child })
    }

    /// The sender's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for SinkStream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
