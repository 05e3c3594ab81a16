//! `tailtrap completions SHELL`: a completion script for the shell, from the CLI's own
//! definition, so it cannot fall behind a new command or option.

use std::process::ExitCode;

use clap::CommandFactory;
use clap_complete::Shell;

/// Arguments of `tailtrap completions`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Installed by the Debian package for bash, zsh and fish. By hand, e.g.:
  tailtrap completions bash > /etc/bash_completion.d/tailtrap
  tailtrap completions zsh > /usr/local/share/zsh/site-functions/_tailtrap
  tailtrap completions fish > ~/.config/fish/completions/tailtrap.fish"
)]
pub struct Args {
    /// The shell.
    shell: Shell,
}

/// Print the completion script for `args.shell` to stdout.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut cmd = crate::Cli::command();
    clap_complete::generate(args.shell, &mut cmd, "tailtrap", &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shell gets a script that names every visible command.
    #[test]
    fn scripts_name_every_command() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut crate::Cli::command(), "tailtrap", &mut out);
            let text = String::from_utf8(out).unwrap_or_default();
            for sub in crate::Cli::command().get_subcommands() {
                if sub.is_hide_set() {
                    continue;
                }
                assert!(
                    text.contains(sub.get_name()),
                    "{shell}: no `{}` in the script",
                    sub.get_name()
                );
            }
        }
    }
}
