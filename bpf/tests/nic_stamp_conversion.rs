//! nic-to-stack's conversion of a NIC's hardware stamp (bpf/src/bpf/nic_stamp.bpf.h), run
//! in the kernel with `BPF_PROG_RUN` on stamps and offsets as devices give them: no NIC on
//! the test machines stamps received packets (docs/probes.md, "NIC hardware stamps"), so
//! the packet path cannot bring one, but the code the probes run can be run here as is.
//! Needs root (loading BPF).

use std::mem::MaybeUninit;

use bpf_reference::nic_stamp_check::types::{nic_stamp_case, tt_nic_clock};
use bpf_reference::nic_stamp_check::NicStampCheckSkelBuilder;
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::ProgramInput;

const SEC: u64 = 1_000_000_000;
/// A CLOCK_REALTIME software stamp: 2026-12-07, in ns.
const SW: u64 = 1_796_601_600 * SEC;
/// CLOCK_TAI − CLOCK_REALTIME: a PHC that ptp4l keeps in TAI runs this far ahead.
const TAI: i64 = 37 * SEC as i64;

#[derive(Debug, PartialEq)]
enum Verdict {
    Timed(u64),
    OutOfBounds,
}

/// The kernel's verdict on a hardware stamp `hw` against the software stamp `sw`, with the
/// device's offset (REALTIME − PHC) and its uncertainty.
fn convert(hw: u64, sw: u64, offset_ns: i64, uncertainty_ns: u64) -> Verdict {
    let mut storage = MaybeUninit::uninit();
    let open = NicStampCheckSkelBuilder::default()
        .open(&mut storage)
        .expect("opening the test object");
    let skel = open.load().expect("loading the test program (needs root)");
    let case = nic_stamp_case {
        hw_ns: hw,
        sw_ns: sw,
        clock: tt_nic_clock {
            offset_ns,
            uncertainty_ns,
            usable: 1,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut bytes = bytes_of(&case);
    let input = ProgramInput {
        context_in: Some(&mut bytes),
        ..Default::default()
    };
    let out = skel
        .progs
        .nic_stamp_check
        .test_run(input)
        .expect("BPF_PROG_RUN of the test program");
    assert_eq!(out.return_value, 0);
    // A syscall program's context is the caller's buffer, written back after the run.
    let back = from_bytes(&bytes);
    match back.verdict {
        0 => Verdict::Timed(back.latency_ns),
        1 => Verdict::OutOfBounds,
        v => panic!("unknown verdict {v}"),
    }
}

fn bytes_of(case: &nic_stamp_case) -> Vec<u8> {
    // SAFETY: nic_stamp_case is plain data of 8-byte and 4-byte integers, no padding.
    unsafe {
        std::slice::from_raw_parts(
            (case as *const nic_stamp_case).cast::<u8>(),
            std::mem::size_of::<nic_stamp_case>(),
        )
    }
    .to_vec()
}

fn from_bytes(bytes: &[u8]) -> nic_stamp_case {
    assert_eq!(bytes.len(), std::mem::size_of::<nic_stamp_case>());
    // SAFETY: the length matches and every bit pattern is a valid nic_stamp_case.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<nic_stamp_case>()) }
}

#[test]
fn a_phc_in_tai_converts_to_the_time_before_the_software_stamp() {
    // The NIC stamped 7.5 µs before the kernel did; the PHC reads TAI, 37 s ahead.
    let hw = SW + TAI as u64 - 7_500;
    assert_eq!(convert(hw, SW, -TAI, 800), Verdict::Timed(7_500));
    // The offset read is 300 ns off (within its uncertainty): so is the latency.
    assert_eq!(convert(hw, SW, -TAI + 300, 800), Verdict::Timed(7_200));
}

#[test]
fn a_phc_counting_from_boot_converts_through_a_large_offset() {
    // QEMU's e1000e and many drivers start their clock near zero: a stamp of 42 s of PHC
    // time, and an offset that is nearly the whole wall-clock time.
    let phc_now = 42 * SEC;
    let offset = (SW - phc_now) as i64;
    assert_eq!(
        convert(phc_now - 2_000_000, SW, offset, 1_500),
        Verdict::Timed(2_000_000)
    );
}

#[test]
fn a_stamp_after_the_software_stamp_is_zero_within_the_uncertainty_and_refused_beyond() {
    let hw = SW + TAI as u64;
    assert_eq!(convert(hw + 500, SW, -TAI, 500), Verdict::Timed(0));
    assert_eq!(convert(hw + 501, SW, -TAI, 500), Verdict::OutOfBounds);
    // A wrong offset by a second (a PHC stepped since its offset was read).
    assert_eq!(convert(hw + SEC, SW, -TAI, 500), Verdict::OutOfBounds);
}

#[test]
fn more_than_ten_seconds_before_the_software_stamp_is_refused() {
    let hw = SW + TAI as u64;
    assert_eq!(
        convert(hw - 10 * SEC, SW, -TAI, 500),
        Verdict::Timed(10 * SEC)
    );
    assert_eq!(
        convert(hw - 10 * SEC - 1, SW, -TAI, 500),
        Verdict::OutOfBounds
    );
}

#[test]
fn mixed_clocks_never_become_latencies() {
    // A PHC stamp taken as if it were in the system clock (offset 0): the 56-year gap
    // other tools have reported as a latency is refused.
    assert_eq!(convert(42 * SEC, SW, 0, 500), Verdict::OutOfBounds);
    // A REALTIME-like stamp with a counter-from-boot offset: far in the future, refused.
    assert_eq!(
        convert(SW, SW, (SW - 42 * SEC) as i64, 500),
        Verdict::OutOfBounds
    );
}
