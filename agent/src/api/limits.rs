//! Limits on the API's connections, so that no client can hold the server: a connection
//! that makes no progress for `idle` (connects and never sends, or stops reading its
//! answer) is closed, any connection is closed after `lifetime` (one that trickles a byte a
//! second), and at most `max_connections` are served at once (the next wait in the
//! listen queue). The CLI makes one short request per connection, far inside all three.
//! While the server itself works on an answer (a slow store read on a loaded host), the
//! idle limit does not run: that wait is not the client's.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use axum::response::Response;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tower_service::Service;

/// The limits of one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest time without a byte read or written before the connection is closed.
    pub idle: Duration,
    /// Longest time a connection lives.
    pub lifetime: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            idle: Duration::from_secs(10),
            lifetime: Duration::from_secs(60),
            max_connections: 256,
        }
    }
}

/// A unix listener whose connections carry [`Limits`].
pub struct LimitedListener {
    inner: UnixListener,
    limits: Limits,
    slots: Arc<Semaphore>,
}

impl LimitedListener {
    /// Wrap `inner`.
    pub fn new(inner: UnixListener, limits: Limits) -> Self {
        LimitedListener {
            inner,
            limits,
            slots: Arc::new(Semaphore::new(limits.max_connections.max(1))),
        }
    }
}

impl Listener for LimitedListener {
    type Io = LimitedStream;
    type Addr = tokio::net::unix::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // The semaphore is never closed, so this only waits for a free slot.
        let slot = self.slots.clone().acquire_owned().await.ok();
        let (io, addr) = Listener::accept(&mut self.inner).await;
        (LimitedStream::new(io, slot, self.limits), addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// A connection under [`Limits`]; its slot is freed when it is dropped.
pub struct LimitedStream {
    io: UnixStream,
    _slot: Option<OwnedSemaphorePermit>,
    idle_for: Duration,
    idle: Pin<Box<Sleep>>,
    end: Pin<Box<Sleep>>,
    /// Requests of this connection being answered (see [`CountAnswers`]).
    answering: Arc<AtomicUsize>,
}

impl LimitedStream {
    fn new(io: UnixStream, slot: Option<OwnedSemaphorePermit>, limits: Limits) -> Self {
        LimitedStream {
            io,
            _slot: slot,
            idle_for: limits.idle,
            idle: Box::pin(tokio::time::sleep(limits.idle)),
            end: Box::pin(tokio::time::sleep(limits.lifetime)),
            answering: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Before any I/O: past the lifetime is an error whatever the client does.
    fn check_lifetime(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.end.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "API connection lifetime exceeded",
            )),
            Poll::Pending => Ok(()),
        }
    }

    /// After an I/O attempt: progress restarts the idle clock; waiting past it is an error.
    fn after<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(v) => {
                let at = Instant::now() + self.idle_for;
                self.idle.as_mut().reset(at);
                Poll::Ready(v)
            }
            // hyper keeps reading while a request is answered (to see the client go):
            // that wait is the server's, so the idle clock starts once the answer is ready.
            Poll::Pending if self.answering.load(Ordering::Acquire) > 0 => {
                let at = Instant::now() + self.idle_for;
                self.idle.as_mut().reset(at);
                Poll::Pending
            }
            Poll::Pending => match self.idle.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "API connection idle too long",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncRead for LimitedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Err(e) = self.check_lifetime(cx) {
            return Poll::Ready(Err(e));
        }
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        self.after(cx, r)
    }
}

impl AsyncWrite for LimitedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Err(e) = self.check_lifetime(cx) {
            return Poll::Ready(Err(e));
        }
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        self.after(cx, r)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Err(e) = self.check_lifetime(cx) {
            return Poll::Ready(Err(e));
        }
        let r = Pin::new(&mut self.io).poll_flush(cx);
        self.after(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Makes each connection's service: `app`, counting the connection's requests being
/// answered on its [`LimitedStream`].
#[derive(Clone)]
pub struct CountAnswers<S> {
    app: S,
}

impl<S> CountAnswers<S> {
    /// Wrap the app served on every connection.
    pub fn new(app: S) -> Self {
        CountAnswers { app }
    }
}

impl<S: Clone> Service<IncomingStream<'_, LimitedListener>> for CountAnswers<S> {
    type Response = Counted<S>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Counted<S>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, incoming: IncomingStream<'_, LimitedListener>) -> Self::Future {
        std::future::ready(Ok(Counted {
            app: self.app.clone(),
            answering: incoming.io().answering.clone(),
        }))
    }
}

/// One connection's service: counts each request from its arrival until its response
/// (headers and body ready to be written) is produced.
#[derive(Clone)]
pub struct Counted<S> {
    app: S,
    answering: Arc<AtomicUsize>,
}

/// Counts one request as being answered while it lives.
struct Answering(Arc<AtomicUsize>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<S> Service<Request> for Counted<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.app.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        self.answering.fetch_add(1, Ordering::AcqRel);
        let answering = Answering(self.answering.clone());
        let answer = self.app.call(req);
        Box::pin(async move {
            let response = answer.await;
            drop(answering);
            response
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may unwrap

    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    use std::path::Path;

    use storage::{Store, StoreConfig};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::api::server::{bind, serve_with, AppState};

    const SHORT: Limits = Limits {
        idle: Duration::from_millis(500),
        lifetime: Duration::from_secs(3),
        max_connections: 4,
    };

    /// A server with `limits` on a scratch store; the socket's path.
    async fn server(dir: &Path, limits: Limits) -> std::path::PathBuf {
        let store = Arc::new(Store::open(dir.join("db"), StoreConfig::default()).unwrap());
        let path = dir.join("api.sock");
        let socket = bind(&path).await.unwrap();
        let state = Arc::new(AppState {
            store,
            status: Box::new(|| panic!("no daemon here")),
        });
        tokio::spawn(serve_with(socket, state, limits));
        path
    }

    /// How long until the server closes `s` (reads until EOF or an error).
    async fn closed_after(mut s: UnixStream) -> Duration {
        let start = Instant::now();
        let mut buf = [0u8; 1024];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return start.elapsed(),
                Ok(_) => {}
            }
        }
    }

    async fn list(path: &Path) -> String {
        let mut s = UnixStream::connect(path).await.unwrap();
        s.write_all(b"GET /v1/incidents HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    /// A query that takes longer than the idle limit is the server's own slowness, not
    /// the client's: its answer still arrives (a loaded guest once had a store read cut
    /// off this way, "connection closed before message completed").
    #[tokio::test]
    async fn an_answer_slower_than_the_idle_limit_still_arrives() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let slow = SHORT.idle * 3;
        let app = axum::Router::new().route(
            "/v1/incidents",
            axum::routing::get(move || async move {
                tokio::time::sleep(slow).await;
                "done"
            }),
        );
        tokio::spawn(crate::api::server::serve_app(listener, SHORT, app));
        let start = Instant::now();
        let answer = list(&path).await;
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("done"),
            "{answer:?}"
        );
        assert!(start.elapsed() >= slow);
    }

    #[tokio::test]
    async fn silent_and_trickling_clients_are_dropped_and_never_block_others() {
        let dir = tempfile::tempdir().unwrap();
        let path = server(dir.path(), SHORT).await;
        // As many silent clients as there are slots: they connect and never send.
        let mut silent = Vec::new();
        for _ in 0..SHORT.max_connections {
            silent.push(UnixStream::connect(&path).await.unwrap());
        }
        // A real client still gets its answer once the idle limit frees a slot.
        let start = Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(5), list(&path))
            .await
            .expect("a client was kept out by silent ones");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(start.elapsed() < SHORT.idle + Duration::from_secs(1));
        for s in silent {
            let after = closed_after(s).await;
            assert!(after < SHORT.idle + Duration::from_secs(1), "{after:?}");
        }

        // One byte of an endless header every 100 ms: progress, but the lifetime ends it.
        let s = UnixStream::connect(&path).await.unwrap();
        let (mut r, mut w) = s.into_split();
        let trickle = tokio::spawn(async move {
            w.write_all(b"GET /v1/incidents HTTP/1.1\r\nX-Slow: ")
                .await
                .ok()?;
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                w.write_all(b"a").await.ok()?;
            }
            #[allow(unreachable_code)]
            Some(())
        });
        let start = Instant::now();
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf).await;
        let after = start.elapsed();
        trickle.abort();
        eprintln!("trickling client closed after {after:?}");
        assert!(
            after >= SHORT.lifetime - Duration::from_millis(200),
            "{after:?}"
        );
        assert!(after < SHORT.lifetime + Duration::from_secs(1), "{after:?}");
    }

    #[tokio::test]
    async fn default_limits_close_a_silent_client() {
        let dir = tempfile::tempdir().unwrap();
        let path = server(dir.path(), Limits::default()).await;
        let s = UnixStream::connect(&path).await.unwrap();
        let after = closed_after(s).await;
        eprintln!(
            "silent client closed after {after:?} (idle limit {:?})",
            Limits::default().idle
        );
        assert!(after >= Limits::default().idle - Duration::from_millis(100));
        assert!(after < Limits::default().idle + Duration::from_secs(2));
    }

    const NOBODY_ENV: &str = "TAILTRAP_API_TEST_NOBODY_SOCKET";

    #[test]
    #[ignore = "needs root (runs a child as nobody): run as root with --include-ignored"]
    fn a_non_root_client_is_refused_by_the_socket_mode() {
        if let Ok(path) = std::env::var(NOBODY_ENV) {
            // The child, as nobody: connecting must fail with a permission error.
            let e = std::os::unix::net::UnixStream::connect(&path).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
            println!("tailtrap-child: refused: {e}");
            return;
        }
        let rt = tokio::runtime::Runtime::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        // Only the socket's own mode may stop the child, not its directory's.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = rt.block_on(server(dir.path(), Limits::default()));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "api::limits::tests::a_non_root_client_is_refused_by_the_socket_mode",
                "--include-ignored",
                "--nocapture",
            ])
            .env(NOBODY_ENV, &path)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("tailtrap-child: refused"),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Root still gets in.
        assert!(rt.block_on(list(&path)).starts_with("HTTP/1.1 200"));
    }
}
