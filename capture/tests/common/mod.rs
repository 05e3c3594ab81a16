//! What the tests that drive sessions against the pwru stand-in share.
#![allow(clippy::unwrap_used)] // tests: a failed setup step should panic right there

use std::path::{Path, PathBuf};

use capture::pwru::{PwruLine, SessionManager, SessionRequest, SessionStatus};
use tokio::sync::mpsc;

/// The pwru stand-in (tests/fake-pwru/pwru).
pub fn fake_pwru() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-pwru/pwru")
}

/// Run a session and collect the lines it delivered.
pub async fn run_collecting(
    mgr: &SessionManager,
    req: SessionRequest,
) -> (SessionStatus, Vec<PwruLine>) {
    let (tx, mut rx) = mpsc::channel(16);
    let collector = tokio::spawn(async move {
        let mut got = Vec::new();
        while let Some(l) = rx.recv().await {
            got.push(l);
        }
        got
    });
    let status = mgr.run(req, tx).await;
    (status, collector.await.unwrap())
}
