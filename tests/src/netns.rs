use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::cmd::run;
use crate::error::Result;

/// A named network namespace (`ip netns add`) with `lo` up, deleted on drop.
///
/// Processes still running inside keep the namespace alive until they exit; its name is
/// freed at once.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates `<prefix>-<pid>-<n>`, unique within this host, and brings its loopback up.
    pub fn new(prefix: &str) -> Result<Netns> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{}-{n}", std::process::id());
        run("ip", &["netns", "add", &name])?;
        let ns = Netns { name };
        run("ip", &["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name, as `ip -n NAME` and `ip netns exec NAME` take it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's bind mount, for `setns(2)`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// A command that runs `program` inside this namespace (through `ip netns exec`, which
    /// execs it: the child's pid is the program's). Add arguments and spawn as usual.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = run("ip", &["netns", "del", &self.name]) {
            eprintln!("tailtrap-tests: cannot delete netns {}: {e}", self.name);
        }
    }
}
