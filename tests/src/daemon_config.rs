//! A test daemon's configuration file, written the same way by every end-to-end test: the
//! database, API socket and pwru runtime directory in the test's scratch directory, and
//! only what a test is about spelled out by that test.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// `tailtrap.toml` in a test's scratch directory. By default: a 200 ms interval, the
/// database (`db`), API socket (`api.sock`) and pwru runtime directory (`run`) in that
/// directory, `/metrics` on a free loopback port, pwru off, no service. Built as
/// `DaemonConfig::new(dir).service("web", port).table(DETECTOR).write()`.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    dir: PathBuf,
    interval: String,
    daemon_keys: String,
    metrics_keys: String,
    pwru_keys: String,
    services: String,
    tables: String,
}

impl DaemonConfig {
    /// The defaults, for a daemon whose files are in `dir`.
    pub fn new(dir: &Path) -> DaemonConfig {
        DaemonConfig {
            dir: dir.to_owned(),
            interval: "200ms".into(),
            daemon_keys: String::new(),
            metrics_keys: "listen = \"127.0.0.1:0\"\n".into(),
            pwru_keys: "enabled = false\n".into(),
            services: String::new(),
            tables: String::new(),
        }
    }

    /// The daemon's interval (`"1s"`).
    pub fn interval(mut self, interval: &str) -> DaemonConfig {
        self.interval = interval.into();
        self
    }

    /// More `[daemon]` keys, as written (`baseline_save_every = "1s"`).
    pub fn daemon_keys(mut self, keys: &str) -> DaemonConfig {
        push_lines(&mut self.daemon_keys, keys);
        self
    }

    /// `/metrics` off.
    pub fn without_metrics(self) -> DaemonConfig {
        self.metrics_keys("enabled = false")
    }

    /// The `[metrics]` table's keys instead of a free loopback port (`listen = "..."`).
    pub fn metrics_keys(mut self, keys: &str) -> DaemonConfig {
        self.metrics_keys.clear();
        push_lines(&mut self.metrics_keys, keys);
        self
    }

    /// The `[pwru]` table's keys instead of `enabled = false` (`runtime_dir` is added).
    pub fn pwru_keys(mut self, keys: &str) -> DaemonConfig {
        self.pwru_keys.clear();
        push_lines(&mut self.pwru_keys, keys);
        self
    }

    /// A service by its port.
    pub fn service(mut self, name: &str, port: u16) -> DaemonConfig {
        let _ = write!(
            self.services,
            "\n[[services]]\nname = \"{name}\"\nports = [{port}]\n"
        );
        self
    }

    /// Tables appended as written: `[detector]`, `[capture]`, `[storage]`, `[otlp]`,
    /// `[probes]`, services of other kinds.
    pub fn table(mut self, toml: &str) -> DaemonConfig {
        self.tables.push('\n');
        push_lines(&mut self.tables, toml);
        self
    }

    /// The file's text.
    pub fn text(&self) -> String {
        let dir = self.dir.display();
        format!(
            "[daemon]\ninterval = \"{interval}\"\ndb = \"{dir}/db\"\n{daemon}\n\
             [api]\nsocket = \"{dir}/api.sock\"\n\n\
             [metrics]\n{metrics}\n\
             [pwru]\n{pwru}runtime_dir = \"{dir}/run\"\n{services}{tables}",
            interval = self.interval,
            daemon = self.daemon_keys,
            metrics = self.metrics_keys,
            pwru = self.pwru_keys,
            services = self.services,
            tables = self.tables,
        )
    }

    /// Write it as `tailtrap.toml` in the directory; the file's path.
    pub fn write(&self) -> Result<PathBuf> {
        let path = self.dir.join("tailtrap.toml");
        std::fs::write(&path, self.text())
            .map_err(Error::io(format!("cannot write {}", path.display())))?;
        Ok(path)
    }
}

/// `text` with a final newline.
fn push_lines(out: &mut String, text: &str) {
    out.push_str(text.trim_start_matches('\n'));
    if !out.ends_with('\n') {
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text is a configuration the daemon's own parser would read: every table once,
    /// the keys a test gave in theirs.
    #[test]
    fn a_config_holds_the_defaults_and_what_the_test_added() {
        let text = DaemonConfig::new(Path::new("/tmp/x"))
            .interval("1s")
            .daemon_keys("baseline_save_every = \"1s\"")
            .without_metrics()
            .service("web", 8080)
            .table("[detector]\nmin_delta = \"5ms\"")
            .text();
        let value: toml::Table = text.parse().unwrap();
        assert_eq!(value["daemon"]["interval"].as_str(), Some("1s"));
        assert_eq!(value["daemon"]["db"].as_str(), Some("/tmp/x/db"));
        assert_eq!(value["daemon"]["baseline_save_every"].as_str(), Some("1s"));
        assert_eq!(value["api"]["socket"].as_str(), Some("/tmp/x/api.sock"));
        assert_eq!(value["metrics"]["enabled"].as_bool(), Some(false));
        assert_eq!(value["pwru"]["enabled"].as_bool(), Some(false));
        assert_eq!(value["pwru"]["runtime_dir"].as_str(), Some("/tmp/x/run"));
        assert_eq!(value["services"][0]["ports"][0].as_integer(), Some(8080));
        assert_eq!(value["detector"]["min_delta"].as_str(), Some("5ms"));
    }
}
