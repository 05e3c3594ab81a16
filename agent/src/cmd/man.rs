//! `tailtrap man [--dir DIR]` (hidden): manual pages generated from the CLI's definition.
//! Without `--dir`, tailtrap(1) in roff on stdout; with it, tailtrap.1 and one page per
//! subcommand (tailtrap-status.1, tailtrap-incidents-show.1, ...) written into DIR, which
//! is what the Debian package ships (`scripts/package`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::CommandFactory;

/// Arguments of `tailtrap man`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Write every page into this directory instead of tailtrap(1) to stdout.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Print or write the manual pages.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    // `help` is clap's own: no page, and no reference to one.
    let cmd = crate::Cli::command().disable_help_subcommand(true);
    match args.dir {
        None => {
            let mut out = std::io::stdout().lock();
            render(cmd, &mut out).context("cannot write the page")?;
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            write_pages(cmd, &dir)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `cmd`'s page and those of its visible subcommands, recursively; hidden commands (this
/// one) get none.
fn write_pages(cmd: clap::Command, dir: &std::path::Path) -> anyhow::Result<()> {
    // Building gives subcommands their display names (`tailtrap-incidents-show`), which
    // name the pages and the cross references of the SUBCOMMANDS sections.
    let mut cmd = cmd;
    cmd.build();
    let mut todo = vec![cmd];
    while let Some(cmd) = todo.pop() {
        todo.extend(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
        let name = clap_mangen::Man::new(cmd.clone()).get_filename();
        let path = dir.join(name);
        let mut file = std::fs::File::create(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        render(cmd, &mut file).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// Where the packaged daemon keeps things; only tailtrap(1) lists them.
const FILES: &str = r#".SH FILES
.TP
\fI/etc/tailtrap/tailtrap.toml\fR
The configuration (every key optional; \fBtailtrap config defaults\fR prints them all).
.TP
\fI/var/lib/tailtrap/db\fR
The database of incidents, samples, pwru traces, histogram history and baselines.
.TP
\fI/run/tailtrap/api.sock\fR
The running daemon's local API, which the read commands use.
.SH SEE ALSO
\fBsystemctl\fR(1) \fBstatus tailtrap\fR, \fBjournalctl\fR(1) \fB\-u tailtrap\fR;
the operator's guide, \fI/usr/share/doc/tailtrap/operations.md\fR.
"#;

/// One page in roff; the top one gets the FILES and SEE ALSO sections.
fn render(cmd: clap::Command, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let top = cmd.get_display_name().is_none_or(|n| n == "tailtrap");
    clap_mangen::Man::new(cmd)
        .manual("tailtrap manual")
        .render(out)?;
    if top {
        out.write_all(FILES.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One page per visible command, each a roff document with its NAME section.
    #[test]
    fn every_visible_command_gets_a_page() {
        let dir = tempfile::tempdir().unwrap();
        let cmd = crate::Cli::command().disable_help_subcommand(true);
        write_pages(cmd, dir.path()).unwrap();
        for name in [
            "tailtrap.1",
            "tailtrap-status.1",
            "tailtrap-incidents.1",
            "tailtrap-config-defaults.1",
            "tailtrap-completions.1",
        ] {
            let page = std::fs::read_to_string(dir.path().join(name))
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(
                page.starts_with(".ie \\n(.g .ds Aq") || page.contains(".TH"),
                "{name}: {page}"
            );
            assert!(page.contains(".SH NAME"), "{name}: {page}");
            assert_eq!(page.contains(".SH FILES"), name == "tailtrap.1", "{name}");
        }
        assert!(!dir.path().join("tailtrap-man.1").exists());
        assert!(!dir.path().join("tailtrap-help.1").exists());
    }
}
