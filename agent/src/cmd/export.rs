//! `tailtrap export ID > incident.json`: one incident with all its samples and pwru lines.

use std::io::Write;
use std::process::ExitCode;

use crate::source::{block_on, Source, Target};

/// Arguments of `tailtrap export`.
#[derive(clap::Args)]
pub struct Args {
    /// The incident id.
    id: u64,
    #[command(flatten)]
    target: Target,
}

/// Run `tailtrap export`: the JSON document goes to stdout.
pub fn run(args: Args, verbose: bool) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let source = Source::open(&args.target, verbose).await?;
        let doc = source.export(args.id).await?;
        let mut out = std::io::stdout().lock();
        out.write_all(&doc)?;
        if !doc.ends_with(b"\n") {
            out.write_all(b"\n")?;
        }
        out.flush()?;
        Ok(ExitCode::SUCCESS)
    })
}
