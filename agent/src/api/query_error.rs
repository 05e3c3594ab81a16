//! The one error of every query the API and the offline source answer, below both the
//! queries and the timeline join they use.

use storage::StoreError;

/// Why a query failed: the caller's fault (bad parameter, unknown id) or the store's.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// A parameter is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// No such incident.
    #[error("no incident {0}")]
    NotFound(u64),
    /// Nothing stored for what was asked (a service without history).
    #[error("{0}")]
    Missing(String),
    /// The store failed.
    #[error("{0}")]
    Store(StoreError),
}

impl From<StoreError> for QueryError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NoSuchIncident(id) => QueryError::NotFound(id),
            other => QueryError::Store(other),
        }
    }
}
