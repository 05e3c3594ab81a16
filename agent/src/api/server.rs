//! Serving the API on a unix socket (axum over tokio's `UnixListener`).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use storage::Store;
use tokio::net::UnixListener;

use super::limits::{CountAnswers, LimitedListener, Limits};
use super::query::{
    self, HistoryParams, IncidentsParams, MarkParams, PwruParams, QueryError, SamplesParams,
};
use super::{ApiError, StatusReport};

/// What the handlers need: the store, and a way to build the status report.
pub struct AppState {
    /// The daemon's store.
    pub store: Arc<Store>,
    /// Builds `GET /v1/status`.
    pub status: Box<dyn Fn() -> StatusReport + Send + Sync>,
}

/// The bound socket; removes its file when dropped, if the file is still the one it bound.
pub struct Socket {
    listener: Option<UnixListener>,
    path: PathBuf,
    /// Device and inode of the socket file as bound.
    file: Option<(u64, u64)>,
}

/// Device and inode of the file at `path`, if there is one.
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

impl Drop for Socket {
    fn drop(&mut self) {
        // Another daemon may have bound the same path since (after this one's file was
        // removed by hand): its file must stay, or its clients lose it.
        if self.file.is_some() && file_id(&self.path) == self.file {
            let _ = std::fs::remove_file(&self.path);
        } else {
            tracing::warn!(
                path = %self.path.display(),
                "the API socket path no longer holds the file this daemon bound; left in place"
            );
        }
    }
}

/// Bind the API socket at `path` (mode 0600; a missing parent is created 0700). A stale
/// socket file is replaced, but not one a running daemon answers on.
pub async fn bind(path: &Path) -> anyhow::Result<Socket> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating the API socket directory {}", dir.display()))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .with_context(|| format!("restricting {}", dir.display()))?;
        }
    }
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            anyhow::bail!(
                "another tailtrap daemon is serving its API on {}: stop it first",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale API socket {}", path.display()))?;
    }
    let listener = UnixListener::bind(path)
        .with_context(|| format!("binding the API socket {}", path.display()))?;
    let socket = Socket {
        listener: Some(listener),
        path: path.to_path_buf(),
        file: file_id(path),
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("restricting {} to mode 0600", path.display()))?;
    Ok(socket)
}

/// Serve the API on `socket` until the task is dropped or aborted, with the default
/// connection [`Limits`].
pub async fn serve(socket: Socket, state: Arc<AppState>) -> anyhow::Result<()> {
    serve_with(socket, state, Limits::default()).await
}

/// [`serve`] with chosen connection limits.
pub async fn serve_with(
    mut socket: Socket,
    state: Arc<AppState>,
    limits: Limits,
) -> anyhow::Result<()> {
    let listener = socket
        .listener
        .take()
        .context("the API socket was already served")?;
    // Re-registered with the runtime serving it, which may not be the one that bound it.
    let listener =
        UnixListener::from_std(listener.into_std().context("taking over the API socket")?)
            .context("taking over the API socket")?;
    let app = Router::new()
        .route("/v1/status", get(status))
        .route("/v1/incidents", get(incidents))
        .route("/v1/incidents/{id}", get(incident))
        .route("/v1/incidents/{id}/samples", get(samples))
        .route("/v1/incidents/{id}/pwru", get(pwru))
        .route("/v1/incidents/{id}/export", get(export))
        .route("/v1/incidents/{id}/verdict", post(mark))
        .route("/v1/history", get(history))
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                "no such endpoint (see docs/api.md)".into(),
            )
        })
        .with_state(state);
    // The socket file stays owned by `socket` while serving, so it is removed on the way out.
    let served = serve_app(listener, limits, app).await;
    drop(socket);
    served.context("serving the API")
}

/// Serve `app` on `listener` under `limits` until an error.
pub(crate) async fn serve_app(
    listener: UnixListener,
    limits: Limits,
    app: Router,
) -> std::io::Result<()> {
    axum::serve(
        LimitedListener::new(listener, limits),
        CountAnswers::new(app),
    )
    .await
}

/// The API served on a runtime of its own: one worker and at most [`API_QUERY_THREADS`]
/// threads for store queries. Busy clients then take at most that much of the machine and
/// never delay the daemon's runtime, whose workers drive the interval loop's timer (on a
/// shared runtime, 64 busy clients made intervals 170 ms late).
pub struct ApiRuntime {
    runtime: Option<tokio::runtime::Runtime>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

/// Nice value of the API's threads: below the interval loop's, which measures time.
const API_NICE: i32 = 10;

/// Lower the calling thread's priority (Linux applies nice per thread). Failure only
/// loses the preference, so it is logged, not fatal.
fn lower_priority() {
    // SAFETY: setpriority with who = 0 changes only the calling thread; no memory involved.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, API_NICE) };
    if r != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "lowering the API threads' priority");
    }
}

/// Store query threads of the API's runtime.
pub const API_QUERY_THREADS: usize = 4;

impl ApiRuntime {
    /// Start serving `socket` on a new runtime.
    pub fn start(socket: Socket, state: Arc<AppState>) -> anyhow::Result<ApiRuntime> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(API_QUERY_THREADS)
            .thread_name("tailtrap-api")
            .on_thread_start(lower_priority)
            .enable_all()
            .build()
            .context("starting the API's runtime")?;
        let task = runtime.spawn(serve(socket, state));
        Ok(ApiRuntime {
            runtime: Some(runtime),
            task,
        })
    }

    /// Stop serving; the socket file is removed once the task has ended.
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
    }
}

impl Drop for ApiRuntime {
    fn drop(&mut self) {
        self.task.abort();
        // Dropping a runtime may block, which is not allowed inside the daemon's runtime.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

fn error(code: StatusCode, error: String) -> Response {
    (code, Json(ApiError { error })).into_response()
}

impl IntoResponse for QueryError {
    fn into_response(self) -> Response {
        let code = match &self {
            QueryError::BadRequest(_) => StatusCode::BAD_REQUEST,
            QueryError::NotFound(_) | QueryError::Missing(_) => StatusCode::NOT_FOUND,
            QueryError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        error(code, self.to_string())
    }
}

/// Run a store query off the async workers (sled reads block).
async fn blocking<T, F>(state: &Arc<AppState>, f: F) -> Result<T, QueryError>
where
    T: Send + 'static,
    F: FnOnce(&Store) -> Result<T, QueryError> + Send + 'static,
{
    let store = state.store.clone();
    tokio::task::spawn_blocking(move || {
        store.readable()?;
        f(&store)
    })
    .await
    .map_err(|e| QueryError::Store(storage::StoreError::Engine(format!("query task: {e}"))))?
}

fn json<T: Serialize>(r: Result<T, QueryError>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn status(State(state): State<Arc<AppState>>) -> Response {
    Json((state.status)()).into_response()
}

/// Path and query extraction errors answer in JSON like every other error.
fn bad_request(e: impl std::fmt::Display) -> Response {
    error(StatusCode::BAD_REQUEST, e.to_string())
}

type IdParam = Result<UrlPath<u64>, PathRejection>;

async fn incidents(
    State(state): State<Arc<AppState>>,
    p: Result<Query<IncidentsParams>, QueryRejection>,
) -> Response {
    let Query(p) = match p {
        Ok(p) => p,
        Err(e) => return bad_request(e),
    };
    json(blocking(&state, move |s| query::incidents(s, &p)).await)
}

async fn incident(State(state): State<Arc<AppState>>, id: IdParam) -> Response {
    let UrlPath(id) = match id {
        Ok(id) => id,
        Err(e) => return bad_request(e),
    };
    json(blocking(&state, move |s| query::incident(s, id)).await)
}

async fn samples(
    State(state): State<Arc<AppState>>,
    id: IdParam,
    p: Result<Query<SamplesParams>, QueryRejection>,
) -> Response {
    let (UrlPath(id), Query(p)) = match (id, p) {
        (Ok(id), Ok(p)) => (id, p),
        (Err(e), _) => return bad_request(e),
        (_, Err(e)) => return bad_request(e),
    };
    json(blocking(&state, move |s| query::samples(s, id, &p)).await)
}

async fn pwru(
    State(state): State<Arc<AppState>>,
    id: IdParam,
    p: Result<Query<PwruParams>, QueryRejection>,
) -> Response {
    let (UrlPath(id), Query(p)) = match (id, p) {
        (Ok(id), Ok(p)) => (id, p),
        (Err(e), _) => return bad_request(e),
        (_, Err(e)) => return bad_request(e),
    };
    json(blocking(&state, move |s| query::pwru(s, id, &p)).await)
}

async fn export(State(state): State<Arc<AppState>>, id: IdParam) -> Response {
    let UrlPath(id) = match id {
        Ok(id) => id,
        Err(e) => return bad_request(e),
    };
    match blocking(&state, move |s| query::export(s, id)).await {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn history(
    State(state): State<Arc<AppState>>,
    p: Result<Query<HistoryParams>, QueryRejection>,
) -> Response {
    let Query(p) = match p {
        Ok(p) => p,
        Err(e) => return bad_request(e),
    };
    let now = model::unix_ns(std::time::SystemTime::now());
    json(blocking(&state, move |s| query::history(s, &p, now)).await)
}

async fn mark(
    State(state): State<Arc<AppState>>,
    id: IdParam,
    p: Result<Query<MarkParams>, QueryRejection>,
) -> Response {
    let (UrlPath(id), Query(p)) = match (id, p) {
        (Ok(id), Ok(p)) => (id, p),
        (Err(e), _) => return bad_request(e),
        (_, Err(e)) => return bad_request(e),
    };
    let now = model::unix_ns(std::time::SystemTime::now());
    json(blocking(&state, move |s| query::mark(s, id, &p, now)).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::client::Client;
    use crate::api::query::IncidentsParams;
    use crate::api::{IncidentAnswer, IncidentList};
    use storage::{NewIncident, StoreConfig};

    #[tokio::test]
    async fn answers_queries_and_json_errors_over_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path().join("db"), StoreConfig::default()).unwrap());
        let opened = store
            .open_incident(&NewIncident {
                service: "web".into(),
                probes: vec![model::Probe::TcpSocketRead],
                opened_ns: 1_700_000_000_000_000_000,
                evidence_json: r#"{"headline":{"ratio":3.5}}"#.into(),
                stages_json: r#"{"verdict":"softirq"}"#.into(),
            })
            .unwrap();
        let path = dir.path().join("run/api.sock");
        let socket = bind(&path).await.unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(
            bind(&path).await.is_err(),
            "a second daemon must not take the socket"
        );
        let state = Arc::new(AppState {
            store,
            // This test does not ask for the status.
            status: Box::new(|| unreachable!("status is not queried here")),
        });
        let server = tokio::spawn(serve(socket, state));

        let client = Client::connect(&path).await.unwrap().unwrap();
        let page: IncidentList = client
            .get("/v1/incidents", &IncidentsParams::default())
            .await
            .unwrap();
        assert_eq!(page.incidents, vec![IncidentAnswer::from(opened.clone())]);
        let view: crate::api::IncidentView = client
            .get(&format!("/v1/incidents/{}", opened.id), &())
            .await
            .unwrap();
        assert_eq!(view.summary.count, 0);
        // JSON all the way down: the stored JSON texts are JSON in every answer.
        let list: serde_json::Value = client.get("/v1/incidents", &()).await.unwrap();
        let one: serde_json::Value = client
            .get(&format!("/v1/incidents/{}", opened.id), &())
            .await
            .unwrap();
        let export: serde_json::Value = serde_json::from_slice(
            &client
                .get_raw(&format!("/v1/incidents/{}/export", opened.id), &())
                .await
                .unwrap(),
        )
        .unwrap();
        assert_eq!(export["format"], "tailtrap-incident/2");
        for incident in [&list["incidents"][0], &one["incident"], &export["incident"]] {
            assert_eq!(incident["evidence"]["headline"]["ratio"], 3.5, "{incident}");
            assert_eq!(incident["stages"]["verdict"], "softirq", "{incident}");
            assert!(incident.get("evidence_json").is_none(), "{incident}");
            assert!(incident.get("stages_json").is_none(), "{incident}");
        }

        let err = |r: anyhow::Result<serde_json::Value>| r.unwrap_err().to_string();
        let e = err(client.get("/v1/incidents/99", &()).await);
        assert!(e.contains("404") && e.contains("no incident 99"), "{e}");
        let e = err(client.get("/v1/incidents", &[("servce", "web")]).await);
        assert!(e.contains("400") && e.contains("servce"), "{e}");
        let e = err(client.get("/v1/incidents/x", &()).await);
        assert!(e.contains("400"), "{e}");
        let e = err(client
            .get(
                &format!("/v1/incidents/{}/samples", opened.id),
                &[("flow", "port=1")],
            )
            .await);
        assert!(e.contains("400") && e.contains("flow"), "{e}");
        let e = err(client.get("/v2/anything", &()).await);
        assert!(e.contains("404") && e.contains("no such endpoint"), "{e}");

        server.abort();
        let _ = server.await;
        assert!(!path.exists(), "the socket file is removed with the server");
        assert!(Client::connect(&path).await.unwrap().is_none());
    }

    /// Issue 31: the samples answer carries each sample's pwru timeline, joined by the API,
    /// and what the CLI prints for `samples --json` is that answer: deserialized by the
    /// client and serialized again, it is the same bytes.
    #[tokio::test]
    async fn samples_come_joined_with_their_pwru_timelines_and_round_trip_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path().join("db"), StoreConfig::default()).unwrap());
        let now = model::unix_ns(std::time::SystemTime::now());
        let opened = store
            .open_incident(&NewIncident {
                service: "web".into(),
                probes: vec![model::Probe::TcpSocketRead],
                opened_ns: now - 10_000_000_000,
                evidence_json: "{}".into(),
                stages_json: "null".into(),
            })
            .unwrap();
        let id = opened.id;
        // Two slow reads of 20 ms; pwru traced the first one's packet, twice in its window.
        let samples: Vec<model::Sample> = (0..2)
            .map(|i| model::Sample {
                latency_ns: 20_000_000,
                ..model::fixtures::sample(id, 10 + i, now - 1_000_000_000 + i * 1_000_000)
            })
            .collect();
        store.put_samples(&samples).unwrap();
        let wall_minus_mono = capture::pwru::wall_minus_mono_ns().unwrap();
        let traced = &samples[0];
        let lines: Vec<storage::PwruRecord> =
            [("tcp_v4_rcv", 15_000_000), ("tcp_queue_rcv", 5_000_000)]
                .into_iter()
                .enumerate()
                .map(|(seq, (func, before_read))| {
                    let wall = traced.time_ns - before_read;
                    storage::PwruRecord {
                        incident: id,
                        seq: seq as u64,
                        received_ns: wall + 2_000_000,
                        pwru_time_ns: Some((i128::from(wall) - i128::from(wall_minus_mono)) as u64),
                        func: func.into(),
                        skb: traced.skb.unwrap(),
                        flow: Some(traced.flow),
                        raw: format!("{{\"func\":\"{func}\"}}"),
                    }
                })
                .collect();
        store.put_pwru(&lines).unwrap();
        let path = dir.path().join("api.sock");
        let socket = bind(&path).await.unwrap();
        let state = Arc::new(AppState {
            store,
            status: Box::new(|| unreachable!("status is not queried here")),
        });
        let server = tokio::spawn(serve(socket, state));
        let client = Client::connect(&path).await.unwrap().unwrap();
        let url = format!("/v1/incidents/{id}/samples");

        let body = client.get_raw(&url, &()).await.unwrap();
        let answer: crate::api::query::SamplesAnswer = serde_json::from_slice(&body).unwrap();
        assert_eq!(serde_json::to_vec(&answer).unwrap(), body);
        assert_eq!(answer.samples.len(), 2);
        assert_eq!(
            (
                answer.pwru_timelines.samples,
                answer.pwru_timelines.with_timeline
            ),
            (2, 1),
            "{}",
            answer.pwru_timelines.note
        );
        let timeline = answer.samples[0].pwru_timeline.as_ref().expect("joined");
        let funcs: Vec<&str> = timeline.steps.iter().map(|s| s.func.as_str()).collect();
        assert_eq!(funcs, ["tcp_v4_rcv", "tcp_queue_rcv"]);
        assert_eq!(answer.samples[0].sample, samples[0]);
        assert_eq!(answer.samples[1].pwru_timeline, None);
        // The sample's own fields at the top level, as before the join moved here.
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["samples"][0]["latency_ns"], 20_000_000);
        assert_eq!(
            v["samples"][0]["pwru_timeline"]["skb"],
            format!("{:#x}", timeline.skb)
        );

        let only: crate::api::query::SamplesAnswer = client
            .get(&url, &[("with_timeline", "true")])
            .await
            .unwrap();
        assert_eq!(only.samples.len(), 1);
        assert_eq!(only.samples[0].sample, samples[0]);
        assert_eq!(only.pwru_timelines.samples, 2, "counted before the filter");

        server.abort();
        let _ = server.await;
    }

    #[tokio::test]
    async fn a_socket_leaves_a_later_daemons_socket_file_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.sock");
        let first = bind(&path).await.unwrap();
        // The first daemon's file removed by hand, and a second daemon started on the path.
        std::fs::remove_file(&path).unwrap();
        let second = bind(&path).await.unwrap();
        drop(first);
        assert!(
            path.exists(),
            "the first daemon's exit removed the second's socket"
        );
        let _client = tokio::net::UnixStream::connect(&path).await.unwrap();
        drop(second);
        assert!(!path.exists(), "the second daemon's own socket is removed");
    }
}
