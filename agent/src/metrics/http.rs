//! The `/metrics` listener: plain HTTP/1.1 on its own task, each connection bounded in
//! time and in number, so a scraper that hangs or floods costs the listener a few
//! connection slots and never the interval loop.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, ACCEPT, ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::{Format, Shared};

/// Connections served at once; more are closed as soon as they are accepted. Far more than
/// any scraping setup needs, far below the daemon's file descriptor limit.
const MAX_CONNECTIONS: usize = 256;
/// A client must send its request headers within this.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Whatever a connection does, it is closed after this (a scrape takes milliseconds).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause after a failed accept (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serve `GET /metrics` on `listener` until the task is aborted.
pub async fn serve(listener: std::net::TcpListener, shared: Arc<Shared>) -> anyhow::Result<()> {
    let listener = TcpListener::from_std(listener)?;
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut accept_warned = false;
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                if !accept_warned {
                    tracing::warn!(error = %e, "metrics: accepting a connection failed");
                    accept_warned = true;
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            // Over the limit: closing at once keeps the slow or idle ones from piling up.
            drop(stream);
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(answer(&req, &shared).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            // Errors are the client's business (a reset, a timeout): nothing to report.
            let _ = tokio::time::timeout(CONNECTION_TIMEOUT, conn).await;
        });
    }
}

/// The format a scraper asks for: OpenMetrics when its Accept header lists it.
pub(super) fn negotiate(accept: Option<&HeaderValue>) -> Format {
    let wants_openmetrics = accept.and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.split(',').any(|part| {
            let mut params = part.split(';').map(str::trim);
            let media = params.next().unwrap_or_default();
            let refused = params.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f64>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
        })
    });
    if wants_openmetrics {
        Format::OpenMetrics
    } else {
        Format::Text
    }
}

async fn answer(req: &Request<Incoming>, shared: &Arc<Shared>) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let format = negotiate(req.headers().get(ACCEPT));
    // Rendering (once per interval and format) is CPU work: off the async workers.
    let shared = shared.clone();
    let body = match tokio::task::spawn_blocking(move || shared.render(format)).await {
        Ok(Some(body)) => body,
        Ok(None) => {
            return plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "the daemon is starting: no interval yet\n",
            )
        }
        Err(_) => return plain(StatusCode::INTERNAL_SERVER_ERROR, "rendering failed\n"),
    };
    let mut r = Response::new(Full::new(body));
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    r
}

fn plain(code: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = code;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openmetrics_only_when_asked_for() {
        let f = |s: &'static str| negotiate(Some(&HeaderValue::from_static(s)));
        assert_eq!(negotiate(None), Format::Text);
        assert_eq!(f("*/*"), Format::Text);
        assert_eq!(f("text/plain;version=0.0.4"), Format::Text);
        // What Prometheus 2.x sends.
        assert_eq!(
            f("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"),
            Format::OpenMetrics
        );
        assert_eq!(f("application/openmetrics-text;q=0"), Format::Text);
    }
}
