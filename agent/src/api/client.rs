//! Reading the API from the CLI: one HTTP/1.1 request per connection over the unix socket.

use std::path::{Path, PathBuf};

use anyhow::Context;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::net::UnixStream;

use super::ApiError;

/// A client of the daemon's API.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
}

impl Client {
    /// A client for the daemon on `socket`, if one answers there; `Ok(None)` when no daemon
    /// listens (no socket file, or nobody accepting).
    pub async fn connect(socket: &Path) -> anyhow::Result<Option<Client>> {
        match UnixStream::connect(socket).await {
            Ok(_) => Ok(Some(Client {
                socket: socket.to_path_buf(),
            })),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e).with_context(|| format!("connecting to {}", socket.display())),
        }
    }

    /// GET `path` with `params` as its query string; the body of a 200 answer.
    pub async fn get_raw<P: Serialize>(&self, path: &str, params: &P) -> anyhow::Result<Bytes> {
        self.send(hyper::Method::GET, path, params).await
    }

    /// POST to `path` with `params` as its query string (no body) and decode the JSON
    /// answer.
    pub async fn post<T: DeserializeOwned, P: Serialize>(
        &self,
        path: &str,
        params: &P,
    ) -> anyhow::Result<T> {
        let body = self.send(hyper::Method::POST, path, params).await?;
        serde_json::from_slice(&body).with_context(|| format!("decoding the answer to {path}"))
    }

    async fn send<P: Serialize>(
        &self,
        method: hyper::Method,
        path: &str,
        params: &P,
    ) -> anyhow::Result<Bytes> {
        let query = serde_urlencoded::to_string(params).context("encoding the query")?;
        let uri = if query.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{query}")
        };
        let stream = UnixStream::connect(&self.socket)
            .await
            .with_context(|| format!("connecting to {}", self.socket.display()))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP handshake with the daemon")?;
        let driver = tokio::spawn(conn);
        let request = Request::builder()
            .method(method.clone())
            .uri(&uri)
            .header(hyper::header::HOST, "tailtrap")
            .body(Empty::<Bytes>::new())
            .context("building the request")?;
        let response = sender
            .send_request(request)
            .await
            .with_context(|| format!("{method} {uri} to the daemon"))?;
        let code = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .context("reading the daemon's answer")?
            .to_bytes();
        driver.abort();
        if code == StatusCode::OK {
            return Ok(body);
        }
        let why = serde_json::from_slice::<ApiError>(&body)
            .map(|e| e.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(&body).into_owned());
        anyhow::bail!("the daemon answered {code}: {why}")
    }

    /// GET `path` and decode the JSON answer.
    pub async fn get<T: DeserializeOwned, P: Serialize>(
        &self,
        path: &str,
        params: &P,
    ) -> anyhow::Result<T> {
        let body = self.get_raw(path, params).await?;
        serde_json::from_slice(&body).with_context(|| format!("decoding the answer to {path}"))
    }
}
