//! GPU use: idle and busy spells, and the level written between them.

use super::*;
use crate::host::usage::{USE_EVERY_MS, USE_STEP};

/// Every GPU of the 4-GPU fake at `pct` %.
fn at(pct: u32) -> Vec<GpuSample> {
    (0..4)
        .map(|i| GpuSample {
            utilization_pct: Some(pct),
            ..gpu(i)
        })
        .collect()
}

#[test]
fn a_leases_level_is_written_when_it_moves_by_a_step_at_most_every_five_minutes() {
    let mut t = T::new();
    let a = t.start(spec(4, 0));
    let now = t.os.advance(1_000);
    t.h.on_samples(at(40), now);
    assert_eq!(
        t.stored(&a.id).map(|l| l.gpu_util_pct),
        Some(40),
        "the first level"
    );
    let now = t.os.advance(60_000);
    t.h.on_samples(at(90), now);
    assert_eq!(
        t.lease(&a.id).gpu_util_pct,
        40,
        "not again within five minutes"
    );
    let now = t.os.advance(USE_EVERY_MS);
    t.h.on_samples(at(95), now);
    assert_eq!(t.stored(&a.id).map(|l| l.gpu_util_pct), Some(95));
    let now = t.os.advance(USE_EVERY_MS);
    t.h.on_samples(at(95 - USE_STEP + 1), now);
    assert_eq!(
        t.lease(&a.id).gpu_util_pct,
        95,
        "a move under the step is no news"
    );
    assert_eq!(t.lease(&a.id).idle_since_ms, 0, "busy all along");
}

#[test]
fn an_idle_spell_is_written_at_once_whatever_was_written_just_before() {
    let mut t = T::new();
    let a = t.start(spec(4, 0));
    let t0 = t.os.advance(1_000);
    t.h.on_samples(at(0), t0);
    let now = t.os.advance(3_600_000);
    t.h.on_samples(at(0), now);
    assert_eq!(t.lease(&a.id).idle_since_ms, t0, "idle after idle_after");
    let now = t.os.advance(1_000);
    t.h.on_samples(at(80), now);
    let l = t.lease(&a.id);
    assert_eq!(
        (l.idle_since_ms, l.gpu_util_pct),
        (0, 80),
        "busy again at once"
    );
}
