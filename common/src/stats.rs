//! Percentiles, one definition for the simulator's report, the benchmarks and the
//! load test.

/// The nearest-rank `p`-quantile (`p` in 0..=1) of `sorted` (ascending): the smallest
/// value with at least `p` of the values at or below it; `None` when empty.
///
/// Nearest-rank returns a value that occurred, never an interpolation, so a p99 of
/// waits in whole seconds stays whole.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    // `as` saturates: a NaN or negative p reads as rank 1, a p above 1 as the last.
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// Sorts `v` (floats by total order) and returns its nearest-rank `p`-quantile.
pub fn percentile_of(v: &mut [f64], p: f64) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    percentile(v, p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nearest_rank_known_answers() {
        let v = [15, 20, 35, 40, 50];
        assert_eq!(percentile(&v, 0.05), Some(15));
        assert_eq!(percentile(&v, 0.30), Some(20));
        assert_eq!(percentile(&v, 0.40), Some(20));
        assert_eq!(percentile(&v, 0.50), Some(35));
        assert_eq!(percentile(&v, 1.0), Some(50));
        assert_eq!(percentile::<u64>(&[], 0.5), None);
        assert_eq!(percentile_of(&mut [3.0, 1.0, 2.0], 0.5), Some(2.0));
    }

    proptest! {
        #[test]
        fn a_percentile_is_a_value_with_enough_below(mut v in prop::collection::vec(0u32..1000, 1..50), p in 0.0f64..=1.0) {
            v.sort_unstable();
            let x = percentile(&v, p).expect("non-empty");
            prop_assert!(v.contains(&x));
            let at_or_below = v.iter().filter(|&&y| y <= x).count() as f64;
            prop_assert!(at_or_below >= p * v.len() as f64);
            let below = v.iter().filter(|&&y| y < x).count() as f64;
            prop_assert!(below < (p * v.len() as f64).max(1.0));
        }
    }
}
