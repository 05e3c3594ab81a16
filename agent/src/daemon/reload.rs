//! SIGHUP: re-read the configuration file and apply what can change while running.

use std::time::SystemTime;

use super::kernel::BpfKernel;
use super::{load_probes, lock, Daemon};
use crate::api::ReloadOutcome;
use crate::config::{self, Config};
use model::unix_ns;

/// Why a reload applied nothing.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReloadError {
    /// The file could not be read or is not a valid configuration. Its problems are put on
    /// one line, as the log has one line per event.
    #[error("{}", .0.lines().join("; "))]
    Config(config::ConfigError),
    /// The new `[probes]`/`[[services]]` settings did not load; the running probes stay.
    #[error("the new probe settings failed to load: {0:#}")]
    Probes(anyhow::Error),
}

impl Daemon {
    /// Apply services and detector settings, keeping baselines. The outcome is logged and
    /// shown by `tailtrap status`.
    pub(super) fn reload(&mut self) {
        let outcome = match self.try_reload() {
            Ok(needs_restart) => {
                if !needs_restart.is_empty() {
                    tracing::warn!(tables = ?needs_restart, "reload: changes to these tables take effect at the next start");
                }
                tracing::info!(
                    services = self.core.config().probes.services.len(),
                    "reloaded services and detector settings; baselines kept"
                );
                ReloadOutcome {
                    at_ns: unix_ns(SystemTime::now()),
                    applied: true,
                    message: "services and detector settings applied; baselines kept".into(),
                    restart_needed: needs_restart.into_iter().map(str::to_owned).collect(),
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "reload refused; the running configuration stays");
                ReloadOutcome {
                    at_ns: unix_ns(SystemTime::now()),
                    applied: false,
                    message: e.to_string(),
                    restart_needed: Vec::new(),
                }
            }
        };
        lock(&self.live).set_reload(outcome);
    }

    /// Apply the configuration file; returns the tables whose changes need a restart.
    fn try_reload(&mut self) -> Result<Vec<&'static str>, ReloadError> {
        let new = config::load(self.config_path.as_deref()).map_err(ReloadError::Config)?;
        let running = self.core.config();
        // Restart-only tables keep their running values, also for the capture that
        // starts with new probes.
        let kept = Config {
            storage: running.storage.clone(),
            capture: running.capture.clone(),
            pwru: running.pwru.clone(),
            daemon: running.daemon.clone(),
            api: running.api.clone(),
            metrics: running.metrics.clone(),
            otlp: running.otlp.clone(),
            ..new.clone()
        };
        let needs_restart: Vec<&'static str> = [
            ("storage", new.storage != running.storage),
            ("capture", new.capture != running.capture),
            ("pwru", new.pwru != running.pwru),
            ("daemon", new.daemon != running.daemon),
            ("api", new.api != running.api),
            ("metrics", new.metrics != running.metrics),
            ("otlp", new.otlp != running.otlp),
        ]
        .into_iter()
        .filter_map(|(t, changed)| changed.then_some(t))
        .collect();
        if new.probes != running.probes {
            let probes = load_probes(&new.probes).map_err(ReloadError::Probes)?;
            lock(&self.live).set_probes(&kept, &probes);
            self.core.replace_kernel(BpfKernel::new(probes), &kept);
        }
        self.core.reconfigure(kept);
        Ok(needs_restart)
    }
}
