//! An incident's pwru session as rows (`incidents show`, `pwru`).

use storage::{PwruState, PwruStatus};

use crate::api::IncidentAnswer as Incident;
use crate::output::{fmt_span, fmt_time, table};

/// The session's state in a word (`waiting` while it waits for the slot).
pub fn pwru_state(p: &PwruStatus) -> &'static str {
    if p.is_waiting() {
        return "waiting";
    }
    match p.state {
        PwruState::NotRun => "not run",
        PwruState::Running => "running",
        PwruState::Done => "done",
        PwruState::Failed => "failed",
    }
}

/// The incident's pwru status as rows (also used by `tailtrap pwru`).
pub fn print_pwru_status(i: &Incident) {
    println!("\npwru");
    let p = &i.pwru;
    let mut t = table(["item", "value"]);
    t.add_row(["state".to_owned(), pwru_state(p).to_owned()]);
    let exit = match (p.exit_status, p.signal) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("signal {s}"),
        (None, None) => "-".into(),
    };
    t.add_row(["exit".to_owned(), exit]);
    t.add_row([
        "started".to_owned(),
        p.started_ns.map_or_else(|| "-".into(), fmt_time),
    ]);
    let ended = match (p.started_ns, p.ended_ns) {
        (Some(a), Some(b)) => format!("{} (after {})", fmt_time(b), fmt_span(b.saturating_sub(a))),
        (None, Some(b)) => fmt_time(b),
        _ => "-".into(),
    };
    t.add_row(["ended".to_owned(), ended]);
    t.add_row(["lines stored".to_owned(), p.lines_stored.to_string()]);
    if !p.message.is_empty() {
        // The daemon appends the exact command; it reads better on its own row.
        // The daemon appends the kernel check's functions the same way.
        let (message, functions) = match p.message.split_once("; functions: ") {
            Some((m, f)) => (m, Some(f)),
            None => (p.message.as_str(), None),
        };
        let (message, command) = match message.split_once("; command: ") {
            Some((m, c)) => (m, Some(c)),
            None => (message, None),
        };
        t.add_row(["message".to_owned(), message.to_owned()]);
        if let Some(f) = functions {
            // Without tracefs's list only BTF was checked: a row of its own, not the tail
            // of the last dropped function.
            let (f, unlisted) = match f.split_once("; available_filter_functions unreadable: ") {
                Some((f, why)) => (f, Some(why)),
                None => (f, None),
            };
            let (chosen, dropped) = match f.split_once("; dropped: ") {
                Some((c, d)) => (c, Some(d)),
                None => (f, None),
            };
            t.add_row(["functions".to_owned(), chosen.replace(',', ", ")]);
            if let Some(d) = dropped {
                t.add_row(["dropped functions".to_owned(), d.replace("), ", ")\n")]);
            }
            if let Some(why) = unlisted {
                t.add_row([
                    "function list".to_owned(),
                    format!("unreadable, only BTF checked:\n{}", why.replace("; ", "\n")),
                ]);
            }
        }
        if let Some(c) = command {
            t.add_row(["command".to_owned(), c.to_owned()]);
        }
    }
    let tail: Vec<&str> = p.stderr_tail.lines().collect();
    if !tail.is_empty() {
        let last = &tail[tail.len().saturating_sub(5)..];
        t.add_row(["stderr (last lines)".to_owned(), last.join("\n")]);
    }
    if i.counters.store_errors > 0 {
        t.add_row([
            "store errors".to_owned(),
            i.counters.store_errors.to_string(),
        ]);
    }
    println!("{t}");
}
