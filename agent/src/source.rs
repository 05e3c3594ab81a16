//! Where the retrieval commands read from: the running daemon's API, or the database
//! directly when no daemon answers.

use std::path::PathBuf;

use anyhow::Context;
use storage::{IncidentVerdict, PwruRecord, Store};

use crate::api::client::Client;
use crate::api::query::{
    self, HistoryParams, IncidentsParams, MarkParams, PwruParams, SamplesAnswer, SamplesParams,
};
use crate::api::{HistoryAnswer, IncidentList, IncidentView, StatusReport};

/// How to find the daemon and its database: global options of every command line
/// (`crate::cli::Global`), taken by the retrieval commands.
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    /// Configuration file: the daemon's (`run`); where the read commands find the API
    /// socket and the database; `[probes]` for `hist`, `[detector]` for `replay`; the file
    /// `config check` checks (default: /etc/tailtrap/tailtrap.toml, or the built-in
    /// defaults when it does not exist; `hist` and `replay`: the built-in defaults).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The daemon's API socket, for the read commands (overrides the configuration).
    #[arg(long, global = true, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// The database directory, read when no daemon answers, and by `db check` (overrides
    /// the configuration).
    #[arg(long, global = true, value_name = "PATH")]
    db: Option<PathBuf>,
}

/// An open source of incidents.
pub enum Source {
    /// A daemon answers on its socket.
    Api(Client),
    /// No daemon: the database, opened directly (only `incidents mark` writes to it).
    Db(Box<Store>),
}

/// Tell that the database is read from a copy (see [`Store::open_existing_or_copy`]).
pub(crate) fn say_copy(db: &std::path::Path, copy: &std::path::Path) {
    eprintln!(
        "tailtrap: {} is on a file system that takes no writes; reading a copy of it in {} \
         (removed at exit)",
        db.display(),
        copy.display()
    );
}

impl Target {
    /// The configuration file given with `--config`, if any.
    pub fn config_path(&self) -> Option<&std::path::Path> {
        self.config.as_deref()
    }

    /// The database directory given with `--db`, if any.
    pub fn db_path(&self) -> Option<&std::path::Path> {
        self.db.as_deref()
    }

    /// Whether `--config`, `--socket` and `--db` were given.
    pub fn given(&self) -> (bool, bool, bool) {
        (
            self.config.is_some(),
            self.socket.is_some(),
            self.db.is_some(),
        )
    }
}

impl Source {
    /// The daemon's API if it answers, else the database. With `verbose`, says which on
    /// stderr.
    pub async fn open(target: &Target, verbose: bool) -> anyhow::Result<Source> {
        let config = crate::config::load(target.config.as_deref())?;
        let socket = target.socket.clone().unwrap_or(config.api.socket);
        let db = target.db.clone().unwrap_or(config.daemon.db);
        if let Some(client) = Client::connect(&socket).await? {
            if verbose {
                eprintln!(
                    "tailtrap: reading from the daemon's API at {}",
                    socket.display()
                );
            }
            return Ok(Source::Api(client));
        }
        let (store, copy) = Store::open_existing_or_copy(&db).with_context(|| {
            format!(
                "no daemon answers on {}, and the database could not be opened",
                socket.display()
            )
        })?;
        if let Some(copy) = copy {
            say_copy(&db, &copy);
        }
        if verbose {
            eprintln!(
                "tailtrap: no daemon on {}; reading the database {} directly",
                socket.display(),
                db.display()
            );
        }
        Ok(Source::Db(Box::new(store)))
    }

    /// The daemon's status; `None` when reading the database (no daemon runs).
    pub async fn status(&self) -> anyhow::Result<Option<StatusReport>> {
        match self {
            Source::Api(c) => Ok(Some(c.get("/v1/status", &()).await?)),
            Source::Db(_) => Ok(None),
        }
    }

    /// A page of incidents.
    pub async fn incidents(&self, p: &IncidentsParams) -> anyhow::Result<IncidentList> {
        match self {
            Source::Api(c) => c.get("/v1/incidents", p).await,
            Source::Db(s) => Ok(query::incidents(s, p)?),
        }
    }

    /// One incident and its sample summary.
    pub async fn incident(&self, id: u64) -> anyhow::Result<IncidentView> {
        match self {
            Source::Api(c) => c.get(&format!("/v1/incidents/{id}"), &()).await,
            Source::Db(s) => Ok(query::incident(s, id)?),
        }
    }

    /// A page of an incident's samples.
    pub async fn samples(&self, id: u64, p: &SamplesParams) -> anyhow::Result<SamplesAnswer> {
        match self {
            Source::Api(c) => c.get(&format!("/v1/incidents/{id}/samples"), p).await,
            Source::Db(s) => Ok(query::samples(s, id, p)?),
        }
    }

    /// A page of an incident's pwru lines.
    pub async fn pwru(&self, id: u64, p: &PwruParams) -> anyhow::Result<Vec<PwruRecord>> {
        match self {
            Source::Api(c) => c.get(&format!("/v1/incidents/{id}/pwru"), p).await,
            Source::Db(s) => Ok(query::pwru(s, id, p)?),
        }
    }

    /// One service's stored histogram history.
    pub async fn history(&self, p: &HistoryParams) -> anyhow::Result<HistoryAnswer> {
        match self {
            Source::Api(c) => c.get("/v1/history", p).await,
            Source::Db(s) => {
                let now = model::unix_ns(std::time::SystemTime::now());
                Ok(query::history(s, p, now)?)
            }
        }
    }

    /// Store the operator's verdict on incident `id`.
    pub async fn mark(&self, id: u64, p: &MarkParams) -> anyhow::Result<IncidentVerdict> {
        match self {
            Source::Api(c) => c.post(&format!("/v1/incidents/{id}/verdict"), p).await,
            Source::Db(s) => {
                let now = model::unix_ns(std::time::SystemTime::now());
                Ok(query::mark(s, id, p, now)?)
            }
        }
    }

    /// The incident export document (JSON).
    pub async fn export(&self, id: u64) -> anyhow::Result<Vec<u8>> {
        match self {
            Source::Api(c) => Ok(c
                .get_raw(&format!("/v1/incidents/{id}/export"), &())
                .await?
                .to_vec()),
            Source::Db(s) => Ok(query::export(s, id)?),
        }
    }
}

/// Run a retrieval command's async body on a small runtime.
pub fn block_on<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(f)
}
