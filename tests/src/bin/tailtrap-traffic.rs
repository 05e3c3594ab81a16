//! tailtrap-traffic: TCP/UDP echo servers with a changeable read delay, and bounded clients,
//! for tailtrap's tests. Each mode can first move itself into a network namespace and a
//! cgroup, before it creates its socket, so the socket belongs to both.
//!
//! Servers print the bound address as their first stdout line. Clients print one JSON line
//! of statistics (`ClientStats`) and exit 0, or explain on stderr and exit 1.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use nix::sched::{setns, CloneFlags};
use tailtrap_tests::{ClientStats, Error, Result};

#[derive(Parser)]
#[command(about = "Test traffic for tailtrap: echo servers with a read delay, bounded clients")]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Accept TCP connections; per connection: sleep the read delay, read, echo, repeat.
    TcpServer(ServerArgs),
    /// Receive UDP datagrams: sleep the read delay, receive, echo to the sender, repeat.
    UdpServer(ServerArgs),
    /// Send messages over one TCP connection, each waiting for its echo.
    TcpClient(ClientArgs),
    /// Send datagrams, each waiting for its echo.
    UdpClient(ClientArgs),
}

#[derive(Args)]
struct Placement {
    /// Join this network namespace (a file such as /run/netns/NAME) first.
    #[arg(long)]
    netns: Option<PathBuf>,
    /// Join this cgroup (its directory under the cgroup2 mount) first.
    #[arg(long)]
    cgroup: Option<PathBuf>,
}

#[derive(Args)]
struct ServerArgs {
    /// Address to bind; port 0 picks one (printed on the first stdout line).
    #[arg(long)]
    bind: SocketAddr,
    /// Read and discard instead of echoing.
    #[arg(long)]
    sink: bool,
    /// Sleep before each read.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    read_delay: Duration,
    /// Re-read the delay (e.g. "20ms") from this file before each read; overrides --read-delay.
    /// "spin 2ms" busies the CPU for that long instead of sleeping (work a CPU quota limits).
    #[arg(long)]
    delay_file: Option<PathBuf>,
    /// Exit when stdin reaches end of file (the spawning process closed it or died).
    #[arg(long)]
    exit_on_stdin_eof: bool,
    #[command(flatten)]
    placement: Placement,
}

#[derive(Args)]
struct ClientArgs {
    /// Server address.
    #[arg(long)]
    target: SocketAddr,
    /// Number of messages.
    #[arg(long, default_value_t = 1)]
    messages: u32,
    /// Bytes per message.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Sleep after each message (after its echo unless --sink).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pause: Duration,
    /// Stop sending at this time after the start.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    deadline: Duration,
    /// Do not wait for echoes (for sink servers).
    #[arg(long)]
    sink: bool,
    #[command(flatten)]
    placement: Placement,
}

/// Without an echo within this time, a TCP client gives up.
const TCP_REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// Without an echo within this time, a UDP message counts as lost.
const UDP_REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest UDP payload over IPv4.
const MAX_DATAGRAM: usize = 65507;

fn main() -> ExitCode {
    let result = match Cli::parse().mode {
        Mode::TcpServer(a) => tcp_server(a),
        Mode::UdpServer(a) => udp_server(a),
        Mode::TcpClient(a) => tcp_client(&a).and_then(print_stats),
        Mode::UdpClient(a) => udp_client(&a).and_then(print_stats),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tailtrap-traffic: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Moves this (still single-threaded) process into the cgroup and namespace; threads
/// started later inherit both.
fn place(p: &Placement) -> Result<()> {
    if let Some(cg) = &p.cgroup {
        let procs = cg.join("cgroup.procs");
        std::fs::write(&procs, std::process::id().to_string())
            .map_err(io_err(format!("cannot join cgroup {}", cg.display())))?;
    }
    if let Some(ns) = &p.netns {
        let file = File::open(ns).map_err(io_err(format!("cannot open netns {}", ns.display())))?;
        setns(&file, CloneFlags::CLONE_NEWNET)
            .map_err(|e| io_err(format!("cannot enter netns {}", ns.display()))(e.into()))?;
    }
    Ok(())
}

/// Keep this thread on its CPU until it has used `d` of CPU time (wall time where the
/// thread's CPU clock cannot be read): a throttled or preempted reader spins on later.
fn spin(d: Duration) {
    let cpu = || nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).ok();
    let (start, wall) = (cpu(), std::time::Instant::now());
    loop {
        let used = match (start, cpu()) {
            (Some(s), Some(now)) => Duration::from(now).saturating_sub(Duration::from(s)),
            _ => wall.elapsed(),
        };
        if used >= d {
            return;
        }
        std::hint::spin_loop();
    }
}

/// What a reader does before each read.
enum Pause {
    /// Sleep (off CPU).
    Sleep(Duration),
    /// Busy the CPU: work that a CPU quota holds back.
    Spin(Duration),
}

/// The current read delay: fixed, or re-read from the delay file each time.
struct Delay {
    fixed: Duration,
    file: Option<PathBuf>,
}

impl Delay {
    fn current(&self) -> Result<Pause> {
        let Some(file) = &self.file else {
            return Ok(Pause::Sleep(self.fixed));
        };
        let text = std::fs::read_to_string(file)
            .map_err(io_err(format!("cannot read delay file {}", file.display())))?;
        let (spin, duration) = match text.trim().strip_prefix("spin ") {
            Some(d) => (true, d),
            None => (false, text.trim()),
        };
        let d = humantime::parse_duration(duration).map_err(|e| {
            Error::Traffic(format!(
                "delay file {}: {:?} is not a duration (or \"spin\" and one): {e}",
                file.display(),
                text
            ))
        })?;
        Ok(if spin {
            Pause::Spin(d)
        } else {
            Pause::Sleep(d)
        })
    }

    fn sleep(&self) -> Result<()> {
        match self.current()? {
            Pause::Sleep(d) if !d.is_zero() => std::thread::sleep(d),
            Pause::Spin(d) => spin(d),
            Pause::Sleep(_) => {}
        }
        Ok(())
    }
}

fn start_server(a: &ServerArgs) -> Result<Arc<Delay>> {
    place(&a.placement)?;
    let delay = Arc::new(Delay {
        fixed: a.read_delay,
        file: a.delay_file.clone(),
    });
    delay.current()?; // a bad delay file fails at start, not at the first read
    if a.exit_on_stdin_eof {
        std::thread::spawn(|| {
            let mut byte = [0u8; 1];
            while matches!(std::io::stdin().read(&mut byte), Ok(n) if n > 0) {}
            std::process::exit(0);
        });
    }
    Ok(delay)
}

fn announce(addr: SocketAddr) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{addr}")
        .and_then(|()| out.flush())
        .map_err(io_err("cannot write to stdout"))
}

fn tcp_server(a: ServerArgs) -> Result<()> {
    let delay = start_server(&a)?;
    let listener = TcpListener::bind(a.bind).map_err(io_err(format!("cannot bind {}", a.bind)))?;
    announce(listener.local_addr().map_err(io_err("getsockname"))?)?;
    loop {
        let (stream, peer) = listener.accept().map_err(io_err("accept failed"))?;
        let delay = Arc::clone(&delay);
        let sink = a.sink;
        std::thread::spawn(move || {
            if let Err(e) = serve_tcp(stream, &delay, sink) {
                eprintln!("tailtrap-traffic: connection from {peer}: {e}");
            }
        });
    }
}

fn serve_tcp(mut stream: TcpStream, delay: &Delay, sink: bool) -> Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        delay.sleep()?;
        let n = stream.read(&mut buf).map_err(io_err("read failed"))?;
        if n == 0 {
            return Ok(());
        }
        if !sink {
            stream.write_all(&buf[..n]).map_err(io_err("echo failed"))?;
        }
    }
}

fn udp_server(a: ServerArgs) -> Result<()> {
    let delay = start_server(&a)?;
    let socket = UdpSocket::bind(a.bind).map_err(io_err(format!("cannot bind {}", a.bind)))?;
    announce(socket.local_addr().map_err(io_err("getsockname"))?)?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        delay.sleep()?;
        let (n, from) = socket.recv_from(&mut buf).map_err(io_err("recv failed"))?;
        if !a.sink {
            // A sender that went away is no reason to stop serving others.
            if let Err(e) = socket.send_to(&buf[..n], from) {
                eprintln!("tailtrap-traffic: echo to {from}: {e}");
            }
        }
    }
}

/// Message `seq`: the sequence number in the first 8 bytes (when it fits), so that a late
/// UDP echo is not taken for the answer to a later message.
fn message(seq: u64, size: usize) -> Vec<u8> {
    let mut msg = vec![0x5a; size];
    if size >= 8 {
        msg[..8].copy_from_slice(&seq.to_le_bytes());
    }
    msg
}

/// Round-trip times collected during a run, and the counters reported at the end.
struct Run {
    start: Instant,
    deadline: Duration,
    stats: ClientStats,
    rtts: Vec<Duration>,
}

impl Run {
    fn new(a: &ClientArgs) -> Run {
        Run {
            start: Instant::now(),
            deadline: a.deadline,
            stats: ClientStats {
                sent: 0,
                replies: 0,
                lost: 0,
                elapsed: Duration::ZERO,
                rtt_p50: Duration::ZERO,
                rtt_max: Duration::ZERO,
                deadline_hit: false,
            },
            rtts: Vec::new(),
        }
    }

    /// Whether the deadline has come (and records that it stopped the run).
    fn past_deadline(&mut self) -> bool {
        self.stats.deadline_hit = self.start.elapsed() >= self.deadline;
        self.stats.deadline_hit
    }

    fn finish(mut self) -> ClientStats {
        self.stats.elapsed = self.start.elapsed();
        self.rtts.sort_unstable();
        self.stats.rtt_p50 = self
            .rtts
            .get(self.rtts.len() / 2)
            .copied()
            .unwrap_or_default();
        self.stats.rtt_max = self.rtts.last().copied().unwrap_or_default();
        self.stats
    }
}

fn tcp_client(a: &ClientArgs) -> Result<ClientStats> {
    place(&a.placement)?;
    let mut stream = TcpStream::connect_timeout(&a.target, TCP_REPLY_TIMEOUT)
        .map_err(io_err(format!("cannot connect to {}", a.target)))?;
    // Each message goes out at once, not coalesced with the next by Nagle.
    stream.set_nodelay(true).map_err(io_err("TCP_NODELAY"))?;
    stream
        .set_read_timeout(Some(TCP_REPLY_TIMEOUT))
        .map_err(io_err("SO_RCVTIMEO"))?;
    let mut run = Run::new(a);
    let mut echo = vec![0u8; a.size];
    for seq in 0..u64::from(a.messages) {
        if run.past_deadline() {
            break;
        }
        let sent_at = Instant::now();
        stream
            .write_all(&message(seq, a.size))
            .map_err(io_err("send failed"))?;
        run.stats.sent += 1;
        if !a.sink {
            stream
                .read_exact(&mut echo)
                .map_err(io_err(format!("no echo of message {seq}")))?;
            run.stats.replies += 1;
            run.rtts.push(sent_at.elapsed());
        }
        std::thread::sleep(a.pause);
    }
    Ok(run.finish())
}

fn udp_client(a: &ClientArgs) -> Result<ClientStats> {
    if a.size > MAX_DATAGRAM {
        return Err(Error::Traffic(format!(
            "--size {} exceeds a datagram ({MAX_DATAGRAM})",
            a.size
        )));
    }
    place(&a.placement)?;
    let local: SocketAddr = match a.target {
        SocketAddr::V4(_) => ([0, 0, 0, 0], 0).into(),
        SocketAddr::V6(_) => ([0u16; 8], 0).into(),
    };
    let socket = UdpSocket::bind(local).map_err(io_err(format!("cannot bind {local}")))?;
    socket
        .connect(a.target)
        .map_err(io_err(format!("cannot connect to {}", a.target)))?;
    let mut run = Run::new(a);
    let mut buf = vec![0u8; 64 * 1024];
    for seq in 0..u64::from(a.messages) {
        if run.past_deadline() {
            break;
        }
        let sent_at = Instant::now();
        socket
            .send(&message(seq, a.size))
            .map_err(io_err("send failed"))?;
        run.stats.sent += 1;
        if !a.sink {
            if await_echo(&socket, &mut buf, seq, a.size, sent_at)? {
                run.stats.replies += 1;
                run.rtts.push(sent_at.elapsed());
            } else {
                run.stats.lost += 1;
            }
        }
        std::thread::sleep(a.pause);
    }
    Ok(run.finish())
}

/// Waits for the echo of message `seq`, skipping late echoes of earlier ones; false when it
/// did not come within the reply timeout.
fn await_echo(
    socket: &UdpSocket,
    buf: &mut [u8],
    seq: u64,
    size: usize,
    sent_at: Instant,
) -> Result<bool> {
    loop {
        let Some(left) = UDP_REPLY_TIMEOUT
            .checked_sub(sent_at.elapsed())
            .filter(|d| !d.is_zero())
        else {
            return Ok(false);
        };
        socket
            .set_read_timeout(Some(left))
            .map_err(io_err("SO_RCVTIMEO"))?;
        match socket.recv(buf) {
            Ok(n) if size < 8 || (n >= 8 && buf[..8] == seq.to_le_bytes()) => return Ok(true),
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Ok(false)
            }
            // An ICMP port unreachable from an earlier send surfaces here.
            Err(e) => return Err(io_err("recv failed")(e)),
        }
    }
}

fn print_stats(stats: ClientStats) -> Result<()> {
    let line = serde_json::to_string(&stats)
        .map_err(|e| Error::Traffic(format!("cannot encode stats: {e}")))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(io_err("cannot write to stdout"))
}

/// Wraps an I/O error with what was being done.
fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let context = context.into();
    move |source| Error::Io { context, source }
}
