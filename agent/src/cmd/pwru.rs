//! `tailtrap pwru ID`: an incident's pwru session status and the lines it stored.

use std::process::ExitCode;

use capture::pwru::PwruEvent;
use storage::PwruRecord;

use crate::api::query::PwruParams;
use crate::output::{print_json, table};
use crate::source::{block_on, Source, Target};

/// Arguments of `tailtrap pwru`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The incident id.
    id: u64,
    /// At most this many lines, in output order.
    #[arg(long, default_value_t = 1000)]
    limit: usize,
}

/// Run `tailtrap pwru`.
pub fn run(args: Args, target: &Target, json: bool, verbose: bool) -> anyhow::Result<ExitCode> {
    block_on(async move {
        let source = Source::open(target, verbose).await?;
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
        if json {
            let lines: Vec<serde_json::Value> = lines.iter().map(line_json).collect();
            print_json(&serde_json::json!({
                "status": view.incident.pwru,
                "lines": lines,
            }))?;
            return Ok(ExitCode::SUCCESS);
        }
        crate::cmd::shared::pwru_status::print_pwru_status(&view.incident);
        if lines.is_empty() {
            println!("no pwru lines stored");
            return Ok(ExitCode::SUCCESS);
        }
        let mut t = table([
            "#",
            "time (since boot)",
            "function",
            "drop reason",
            "caller",
            "skb",
            "cpu",
            "process",
            "netns",
            "iface",
            "len",
            "mark",
            "flow",
        ]);
        for r in &lines {
            let event = PwruEvent::parse(&r.raw).ok();
            let e = event.as_ref();
            let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
            t.add_row([
                r.seq.to_string(),
                r.pwru_time_ns
                    .map_or_else(|| "-".into(), |ns| format!("{:.6}s", ns as f64 / 1e9)),
                if r.func.is_empty() {
                    "(unparsed)".to_owned()
                } else {
                    r.func.clone()
                },
                or_dash(e.and_then(|e| e.drop_reason.clone())),
                or_dash(e.and_then(|e| e.caller.clone())),
                format!("{:#x}", r.skb),
                or_dash(e.map(|e| e.cpu.to_string())),
                or_dash(
                    e.and_then(|e| e.process.as_ref().map(|p| format!("{}:{}", p.name, p.pid))),
                ),
                or_dash(e.map(|e| e.netns.to_string())),
                or_dash(e.and_then(|e| {
                    e.iface
                        .as_ref()
                        .map(|i| format!("{}:{}", i.name, i.ifindex))
                })),
                or_dash(e.map(|e| e.len.to_string())),
                or_dash(e.map(|e| e.mark.to_string())),
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

/// A stored line in JSON: the record's fields with the skb address as a hex string (a
/// 64-bit kernel address loses digits as a JSON number in most readers), and every field
/// pwru printed, parsed from the raw line.
fn line_json(r: &PwruRecord) -> serde_json::Value {
    serde_json::json!({
        "seq": r.seq,
        "received_ns": r.received_ns,
        "pwru_time_ns": r.pwru_time_ns,
        "func": r.func,
        "skb": format!("{:#x}", r.skb),
        "flow": r.flow,
        "event": PwruEvent::parse(&r.raw).ok(),
        "raw": r.raw,
    })
}
