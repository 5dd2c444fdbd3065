//! How long a run will last: predicted from its user's own last runs, as Tsafrir,
//! Etsion and Feitelson propose for backfilling ("Backfilling using system-generated
//! predictions rather than user runtime estimates", IEEE TPDS 18(6), 2007).
//!
//! The prediction of a run is the mean of the last two runs of the same user and
//! class that ended on their own (completed, failed or at their time limit: a revoked
//! run says nothing of how long it would have run), never past the run's time limit.
//! A run still going when its prediction comes is predicted anew: the first
//! prediction plus the next step of a ladder (1 min, 5 min, 15 min, 30 min, 1 h, 2 h,
//! 5 h, 10 h, 20 h, 50 h, 100 h, then doubling), the paper's correction. So a
//! prediction is never below what a run has already run, and it is a function of the
//! history and the elapsed time alone: a replay gives the same predictions.
//!
//! Without a run of its user and class to go by, a run is predicted by its time limit
//! when it has one, and not at all otherwise ("unknown": the callers keep their rules
//! for work of unknown length).

use crate::time::{Secs, HOUR, MINUTE};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The correction's steps: what is added to the first prediction once a run outlasts
/// it, then once it outlasts that, and so on (Tsafrir et al., §4.2).
const LADDER: [Secs; 11] = [
    MINUTE,
    5 * MINUTE,
    15 * MINUTE,
    30 * MINUTE,
    HOUR,
    2 * HOUR,
    5 * HOUR,
    10 * HOUR,
    20 * HOUR,
    50 * HOUR,
    100 * HOUR,
];

/// The most (user, class) pairs kept: a run of a pair beyond it is not learnt, so a
/// flood of made-up users cannot grow allotd's memory or its snapshots.
pub const MAX_PAIRS: usize = 100_000;

/// The last runs of every (user, class) that ran.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunLengths {
    /// By user, then class: looked up by `&str` without building a key.
    users: BTreeMap<String, BTreeMap<String, Last>>,
    pairs: usize,
}

/// The last two run lengths of one pair, the latest first (0 until there is one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Last {
    latest: Secs,
    before: Option<Secs>,
}

/// One pair's runs as a snapshot keeps them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunLengthFacts {
    /// Who ran them.
    pub user: String,
    /// Their class.
    pub class: String,
    /// The last run lengths, the latest first (one or two).
    pub last: Vec<Secs>,
}

impl RunLengths {
    /// A run of `user`'s of `class` ended on its own after `secs`.
    pub fn record(&mut self, user: &str, class: &str, secs: Secs) {
        if let Some(l) = self.users.get_mut(user).and_then(|c| c.get_mut(class)) {
            *l = Last {
                latest: secs,
                before: Some(l.latest),
            };
            return;
        }
        if self.pairs < MAX_PAIRS {
            self.insert(user, class, secs, None);
        }
    }

    fn insert(&mut self, user: &str, class: &str, latest: Secs, before: Option<Secs>) {
        let classes = match self.users.get_mut(user) {
            Some(c) => c,
            None => self.users.entry(user.to_string()).or_default(),
        };
        if classes
            .insert(class.to_string(), Last { latest, before })
            .is_none()
        {
            self.pairs += 1;
        }
    }

    /// How long a run of `user`'s of `class` with time limit `limit` lasts in all,
    /// seen when it has run `elapsed`: never below `elapsed`, never past `limit`
    /// (unless it has already run past it). `None`: nothing to go by.
    pub fn predict(
        &self,
        user: &str,
        class: &str,
        limit: Option<Secs>,
        elapsed: Secs,
    ) -> Option<Secs> {
        let base = self
            .users
            .get(user)
            .and_then(|c| c.get(class))
            .map(|l| match l.before {
                Some(b) => ((u128::from(l.latest) + u128::from(b)) / 2) as Secs,
                None => l.latest,
            });
        let p = match (base, limit) {
            (Some(b), Some(tl)) => b.min(tl),
            (Some(b), None) => b,
            (None, Some(tl)) => tl,
            (None, None) => return None,
        }
        .max(1);
        let corrected = if p > elapsed {
            p
        } else {
            corrected(p, elapsed)
        };
        Some(match limit {
            Some(tl) => corrected.min(tl.max(elapsed)),
            None => corrected,
        })
    }

    /// Pairs learnt.
    pub fn len(&self) -> usize {
        self.pairs
    }

    /// Whether no run is learnt.
    pub fn is_empty(&self) -> bool {
        self.pairs == 0
    }

    /// As a snapshot keeps them.
    pub fn facts(&self) -> Vec<RunLengthFacts> {
        self.users
            .iter()
            .flat_map(|(user, classes)| {
                classes.iter().map(move |(class, l)| RunLengthFacts {
                    user: user.clone(),
                    class: class.clone(),
                    last: std::iter::once(l.latest).chain(l.before).collect(),
                })
            })
            .collect()
    }

    /// From a snapshot's facts (pairs with no run, and those past [`MAX_PAIRS`], are
    /// left out).
    pub fn from_facts(facts: &[RunLengthFacts]) -> Self {
        let mut r = RunLengths::default();
        for f in facts {
            let Some(&latest) = f.last.first() else {
                continue;
            };
            if r.pairs >= MAX_PAIRS {
                break;
            }
            r.insert(&f.user, &f.class, latest, f.last.get(1).copied());
        }
        r
    }
}

/// `first` plus the first of the ladder's sums that `elapsed` has not reached.
fn corrected(first: Secs, elapsed: Secs) -> Secs {
    let mut step = 0;
    for s in LADDER {
        step = s;
        let p = first.saturating_add(s);
        if p > elapsed {
            return p;
        }
    }
    loop {
        step = step.saturating_mul(2);
        let p = first.saturating_add(step);
        if p > elapsed || p == Secs::MAX {
            return p;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_mean_of_the_last_two_runs_bounded_by_the_limit() {
        let mut r = RunLengths::default();
        assert_eq!(
            r.predict("ada", "training", None, 0),
            None,
            "nothing to go by"
        );
        assert_eq!(r.predict("ada", "training", Some(600), 0), Some(600));
        r.record("ada", "training", 3_600);
        assert_eq!(r.predict("ada", "training", None, 0), Some(3_600));
        r.record("ada", "training", 1_800);
        assert_eq!(r.predict("ada", "training", None, 0), Some(2_700));
        r.record("ada", "training", 600);
        assert_eq!(
            r.predict("ada", "training", None, 0),
            Some(1_200),
            "the last two"
        );
        assert_eq!(r.predict("ada", "training", Some(900), 0), Some(900));
        assert_eq!(r.predict("ada", "batch", None, 0), None, "its own class");
        assert_eq!(r.predict("bob", "training", None, 0), None, "its own user");
    }

    #[test]
    fn a_run_past_its_prediction_is_extended_by_the_ladder() {
        let mut r = RunLengths::default();
        r.record("ada", "batch", 600);
        assert_eq!(r.predict("ada", "batch", None, 599), Some(600));
        assert_eq!(r.predict("ada", "batch", None, 600), Some(660), "+1 min");
        assert_eq!(r.predict("ada", "batch", None, 700), Some(900), "+5 min");
        assert_eq!(
            r.predict("ada", "batch", None, 600 + 100 * HOUR),
            Some(600 + 200 * HOUR)
        );
        assert_eq!(
            r.predict("ada", "batch", Some(800), 700),
            Some(800),
            "the limit holds"
        );
    }

    #[test]
    fn a_snapshot_keeps_the_last_two_runs() {
        let mut r = RunLengths::default();
        r.record("ada", "batch", 10);
        r.record("ada", "batch", 30);
        r.record("bob", "debug", 5);
        let back = RunLengths::from_facts(&r.facts());
        assert_eq!(back, r);
        assert_eq!(back.predict("ada", "batch", None, 0), Some(20));
    }

    proptest! {
        #[test]
        fn a_prediction_is_never_below_the_time_a_run_has_run(
            runs in proptest::collection::vec(1u64..10_000_000, 0..4),
            limit in proptest::option::of(1u64..20_000_000),
            elapsed in 0u64..20_000_000,
        ) {
            let mut r = RunLengths::default();
            for s in &runs {
                r.record("u", "c", *s);
            }
            if let Some(p) = r.predict("u", "c", limit, elapsed) {
                prop_assert!(p >= elapsed);
                // Below it only where the limit ends the run first.
                prop_assert!(p > elapsed || limit.is_some_and(|tl| p == tl.max(elapsed)));
                if let Some(tl) = limit {
                    prop_assert!(p <= tl.max(elapsed));
                }
                // Seen later, a run is predicted to last no less.
                let later = r.predict("u", "c", limit, elapsed + 1).unwrap_or(0);
                prop_assert!(later >= p);
            } else {
                prop_assert!(runs.is_empty() && limit.is_none());
            }
        }
    }
}
