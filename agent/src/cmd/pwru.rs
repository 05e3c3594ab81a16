//! `tailtrap pwru ID`: an incident's pwru session status and the lines it stored.

use std::process::ExitCode;

use crate::api::query::PwruParams;
use crate::output::{print_json, table};
use crate::source::{block_on, Source, Target};

/// Arguments of `tailtrap pwru`.
#[derive(clap::Args)]
pub struct Args {
    /// The incident id.
    id: u64,
    /// At most this many lines, in output order.
    #[arg(long, default_value_t = 1000)]
    limit: usize,
    /// JSON (the stored records, each with pwru's raw line) instead of tables.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    target: Target,
}

/// Run `tailtrap pwru`.
pub fn run(args: Args, verbose: bool) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let source = Source::open(&args.target, verbose).await?;
        let view = source.incident(args.id).await?;
        let lines = source
            .pwru(
                args.id,
                &PwruParams {
                    after_seq: None,
                    limit: args.limit,
                },
            )
            .await?;
        if args.json {
            print_json(&serde_json::json!({
                "status": view.incident.pwru,
                "lines": lines,
            }))?;
            return Ok(ExitCode::SUCCESS);
        }
        crate::cmd::incidents::print_pwru_status(&view.incident);
        if lines.is_empty() {
            println!("no pwru lines stored");
            return Ok(ExitCode::SUCCESS);
        }
        let mut t = table(["#", "time (since boot)", "function", "skb", "flow"]);
        for r in &lines {
            t.add_row([
                r.seq.to_string(),
                r.pwru_time_ns
                    .map_or_else(|| "-".into(), |ns| format!("{:.6}s", ns as f64 / 1e9)),
                if r.func.is_empty() {
                    "(unparsed)".to_owned()
                } else {
                    r.func.clone()
                },
                format!("{:#x}", r.skb),
                r.flow.map_or_else(|| "-".into(), |f| f.to_string()),
            ]);
        }
        println!("{t}");
        if lines.len() == args.limit {
            println!("(more lines may be stored: raise --limit)");
        }
        Ok(ExitCode::SUCCESS)
    })
}
