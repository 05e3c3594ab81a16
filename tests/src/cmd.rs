//! Running the iproute2 tools.

use std::process::Command;

use crate::error::{Error, Result};

/// Runs `program args...`, returning its stdout; a non-zero exit becomes [`Error::Command`]
/// carrying stderr, since that is where `ip` and `tc` explain themselves.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<String> {
    let command = format!("{program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(Error::io(format!("cannot run `{command}`")))?;
    if !out.status.success() {
        return Err(Error::Command {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
