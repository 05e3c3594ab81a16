//! The reference programs of `floor.bpf.c` (built by the `bpf-reference` crate, a
//! dev-dependency), loaded on the hooks tailtrap's probes use on this kernel (fentry or
//! tp_btf, as the probes' own attach choice decides), or on given hooks (the probe-cost
//! bench's floors beside the scheduler hooks armed capture adds). Shared by the probe-cost
//! bench and the `reference_programs` example that nginx's overhead bench runs.

use std::collections::HashSet;
use std::mem::MaybeUninit;

use bpf::{ProbeConfig, ProbeSet};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::OpenObject;

pub use bpf_reference::FloorSkel;
use bpf_reference::FloorSkelBuilder;

/// Which reference program of the floor object.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Reference {
    /// Empty: the floor, what being called at all costs.
    Empty,
    /// Reads the stamp and its clock: the clock floor, what any latency probe must pay.
    Clock,
}

impl Reference {
    /// Which reference a program of the floor object is, by its name.
    pub fn of(program_name: &str) -> Reference {
        if program_name.starts_with("clock_") {
            Reference::Clock
        } else {
            Reference::Empty
        }
    }
}

/// Load (not attach) the reference programs of `kinds` on the hooks `config`'s probes
/// attach to here. The probes are loaded once to learn those hooks, then dropped.
pub fn load<'obj>(
    storage: &'obj mut MaybeUninit<OpenObject>,
    config: &ProbeConfig,
    kinds: &[Reference],
) -> Result<FloorSkel<'obj>, Box<dyn std::error::Error>> {
    let attach_points: HashSet<String> = ProbeSet::load(config, &mut |_| {})?
        .prog_stats()
        .into_iter()
        .map(|s| s.attach_point)
        .collect();
    load_on(storage, &attach_points, kinds)
}

/// Load (not attach) the reference programs of `kinds` on `attach_points` (ELF section
/// names, as `ProbeSet::prog_stats` reports them): the probes' hooks and, for the probe-cost
/// bench, the scheduler hooks armed capture adds.
pub fn load_on<'obj>(
    storage: &'obj mut MaybeUninit<OpenObject>,
    attach_points: &HashSet<String>,
    kinds: &[Reference],
) -> Result<FloorSkel<'obj>, Box<dyn std::error::Error>> {
    let mut open = FloorSkelBuilder::default().open(storage)?;
    for mut prog in open.open_object_mut().progs_mut() {
        let hook = attach_points.contains(prog.section().to_string_lossy().as_ref());
        let kind = kinds.contains(&Reference::of(&prog.name().to_string_lossy()));
        prog.set_autoload(hook && kind);
    }
    Ok(open.load()?)
}
