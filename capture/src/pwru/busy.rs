//! Starting pwru while its file is briefly open for writing somewhere.
//!
//! `execve` fails with ETXTBSY while any process holds the binary open for writing. That
//! happens when an operator copies a new pwru over the old one (`cp`, not `install`), and
//! in any multi-threaded program that writes a script and runs it: a child forked by
//! another thread in that moment inherits the write descriptor until its own exec. Both
//! pass within milliseconds, so the start is tried again rather than failed.

use std::time::Duration;

use tokio::process::{Child, Command};

/// Tries after the first; together about half a second.
const RETRIES: u32 = 20;
const PAUSE: Duration = Duration::from_millis(25);

/// `cmd.spawn()`, tried again while the binary is busy; any other error is returned at once.
pub(crate) async fn spawn(cmd: &mut Command) -> std::io::Result<Child> {
    let mut tries = 0;
    loop {
        match cmd.spawn() {
            Err(e) if is_text_busy(&e) && tries < RETRIES => {
                tries += 1;
                tokio::time::sleep(PAUSE).await;
            }
            other => return other,
        }
    }
}

fn is_text_busy(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(nix::libc::ETXTBSY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etxtbsy_is_recognised_and_other_errors_are_not() {
        assert!(is_text_busy(&std::io::Error::from_raw_os_error(
            nix::libc::ETXTBSY
        )));
        assert!(!is_text_busy(&std::io::Error::from_raw_os_error(
            nix::libc::ENOENT
        )));
    }
}
