//! The BPF bucket function (bpf/src/bpf/bucket.h, compiled for the host by build.rs) must
//! put every value in the same bucket as `model::hist::bucket_index`.

use model::hist::{bucket_index, bucket_lower, NUM_BUCKETS};

#[link(name = "tailtrap_bucket_shim", kind = "static")]
extern "C" {
    fn tailtrap_bucket_index(v: u64) -> u32;
}

fn bpf_bucket(v: u64) -> usize {
    // SAFETY: a pure C function of one integer.
    unsafe { tailtrap_bucket_index(v) as usize }
}

#[test]
fn agrees_at_every_bucket_boundary() {
    let mut checked = 0;
    for i in 0..NUM_BUCKETS {
        let lo = bucket_lower(i);
        for v in [lo.saturating_sub(1), lo, lo + 1] {
            assert_eq!(
                bpf_bucket(v),
                bucket_index(v),
                "value {v} (bucket {i} boundary)"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, NUM_BUCKETS * 3);
}

#[test]
fn agrees_on_clamping_and_every_power_of_two() {
    for k in 0..64 {
        let p = 1u64 << k;
        for v in [p - 1, p, p + 1, p | (p >> 1), p | (p - 1)] {
            assert_eq!(bpf_bucket(v), bucket_index(v), "value {v}");
        }
    }
    assert_eq!(bpf_bucket(u64::MAX), NUM_BUCKETS - 1);
}
