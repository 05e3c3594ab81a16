//! Attach the probe-cost bench's reference programs on the hooks tailtrap's probes use here
//! and hold them until killed: what `tests/bench/overhead.sh --floors` runs to put the cost of
//! merely being called (`floor`) and of reading the stamp and the clock (`clock`) into the
//! nginx table beside tailtrap's own. Root.
//!
//! `cargo run --release -p bpf --example reference_programs -- floor|clock`

use std::mem::MaybeUninit;
use std::process::ExitCode;

use bpf::ProbeConfig;
use libbpf_rs::skel::Skel;

#[path = "../benches/support/reference.rs"]
mod reference;
use reference::Reference;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("reference_programs: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let kind = match std::env::args().nth(1).as_deref() {
        Some("floor") => Reference::Empty,
        Some("clock") => Reference::Clock,
        other => {
            return Err(format!(
                "say which reference programs: floor or clock (got {:?})",
                other.unwrap_or("nothing")
            )
            .into())
        }
    };
    let mut storage = MaybeUninit::uninit();
    let programs = reference::load(&mut storage, &ProbeConfig::default(), &[kind])?;
    let mut links = Vec::new();
    let mut names = Vec::new();
    for prog in programs.object().progs_mut() {
        if !prog.autoload() {
            continue;
        }
        links.push(prog.attach()?);
        names.push(prog.name().to_string_lossy().into_owned());
    }
    if links.is_empty() {
        return Err("no hook of tailtrap's probes can be attached on this kernel".into());
    }
    // One line, then nothing: the caller waits for it, and ends us with a signal (the links
    // go with the process).
    println!("attached {}", names.join(" "));
    loop {
        std::thread::park();
    }
}
