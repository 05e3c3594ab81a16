//! `tailtrap export ID > incident.json`: one incident with all its samples and pwru lines.

use std::io::Write;
use std::process::ExitCode;

use crate::source::{block_on, Source, Target};

/// Arguments of `tailtrap export`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The incident id.
    id: u64,
}

/// Run `tailtrap export`: the JSON document goes to stdout.
pub fn run(args: Args, target: &Target, verbose: bool) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let source = Source::open(target, verbose).await?;
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
