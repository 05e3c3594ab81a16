//! The options every `tailtrap` command line takes, anywhere on it: before the command
//! (`tailtrap --config F incidents show 4`), between a command and its subcommand
//! (`tailtrap incidents --config F show 4`) or at the end (`tailtrap incidents show 4
//! --config F`). Each command says which of them mean something to it and refuses the
//! others by name ([`Global::allow`]) rather than ignoring them.

use crate::source::Target;

/// The global options (clap `global = true`: accepted at any position).
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct Global {
    /// `--config`, `--socket`, `--db`.
    #[command(flatten)]
    pub target: Target,
    /// JSON instead of tables (the read commands, `hist`, `replay`, `db check`; `history`:
    /// the summary as JSON, implying `--summary`; `export` prints JSON anyway).
    #[arg(long, global = true)]
    pub json: bool,
    /// More log output (-v: debug, -vv: trace). RUST_LOG overrides. The read commands also
    /// say on stderr whether they used the daemon's API or the database.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// One global option a command may take (`-v` is taken by all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opt {
    /// `--config FILE`.
    Config,
    /// `--socket PATH`.
    Socket,
    /// `--db PATH`.
    Db,
    /// `--json`.
    Json,
}

impl Opt {
    fn flag(self) -> &'static str {
        match self {
            Opt::Config => "--config",
            Opt::Socket => "--socket",
            Opt::Db => "--db",
            Opt::Json => "--json",
        }
    }
}

/// What the read commands (`status`, `incidents`, `samples`, `pwru`, `export`, `history`,
/// `tune`) take: where the daemon and its database are, and JSON.
pub const READ: &[Opt] = &[Opt::Config, Opt::Socket, Opt::Db, Opt::Json];

impl Global {
    /// The global options given on this command line.
    pub fn given(&self) -> Vec<Opt> {
        let (config, socket, db) = self.target.given();
        [
            (Opt::Config, config),
            (Opt::Socket, socket),
            (Opt::Db, db),
            (Opt::Json, self.json),
        ]
        .into_iter()
        .filter_map(|(o, on)| on.then_some(o))
        .collect()
    }

    /// Refuse the global options `command` (e.g. `tailtrap hist`) does not take, naming
    /// the first one given and what the command does take.
    pub fn allow(&self, command: &str, takes: &[Opt]) -> anyhow::Result<()> {
        let Some(refused) = self.given().into_iter().find(|o| !takes.contains(o)) else {
            return Ok(());
        };
        let takes: Vec<&str> = takes.iter().map(|o| o.flag()).collect();
        let takes = if takes.is_empty() {
            "none of the global options but -v".to_owned()
        } else {
            format!("only {} and -v of the global options", takes.join(", "))
        };
        anyhow::bail!(
            "{} means nothing to `{command}`, which takes {takes}",
            refused.flag()
        )
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        global: Global,
    }

    fn global(args: &[&str]) -> Global {
        Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied()))
            .map(|c| c.global)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    #[test]
    fn a_command_refuses_the_global_options_it_does_not_take_by_name() {
        let g = global(&["--socket", "/s", "--json"]);
        assert_eq!(g.given(), [Opt::Socket, Opt::Json]);
        assert!(g.allow("tailtrap status", READ).is_ok());
        let err = g
            .allow("tailtrap hist", &[Opt::Config, Opt::Json])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("--socket means nothing to `tailtrap hist`"),
            "{err}"
        );
        assert!(err.contains("--config, --json"), "{err}");
        let err = global(&["--json"])
            .allow("tailtrap simulate", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("none of the global options but -v"), "{err}");
        assert!(global(&["-vv"]).allow("tailtrap simulate", &[]).is_ok());
    }
}
