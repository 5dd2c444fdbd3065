//! Gates: holds, dependencies, begin times and arrays, through `Allocator::apply`.

use super::tests::{allocator, batch};
use super::*;
use allot_fairshare::{LeaseEnd, Time, WorkloadState};

/// A one-GPU batch submission to demo-a with these gates, array and name.
fn submit(gates: Gates, array: Option<ArraySpec>, name: &str) -> Input {
    let mut input = batch("demo-a");
    if let Input::Submit {
        gates: g,
        array: a,
        name: n,
        output,
        ..
    } = &mut input
    {
        (*g, *a, *n) = (gates, array, name.into());
        *output = "%A_%a.out".into();
    }
    input
}

/// Applies a submission; its (first) workload id.
fn submitted(a: &mut Allocator, at: Time, input: &Input) -> u64 {
    a.apply(at, input).expect("submit").id.expect("an id")
}

fn end(a: &mut Allocator, at: Time, id: u64, how: LeaseEnd) {
    let lease = *a.workloads()[&id].leases.last().expect("ran");
    a.apply(
        at,
        &Input::LeaseEnded {
            lease,
            end: how,
            reason: "exited".into(),
            node: String::new(),
            exit_code: Some(i32::from(how != LeaseEnd::Completed)),
            signal: None,
            part: false,
            leaving: false,
        },
    )
    .expect("ended");
}

fn running(a: &Allocator) -> Vec<u64> {
    a.workloads()
        .values()
        .filter(|w| w.state == WorkloadState::Running)
        .map(|w| w.id)
        .collect()
}

fn state(a: &Allocator, id: u64) -> WorkloadState {
    a.workloads()[&id].state
}

#[test]
fn an_array_never_runs_more_than_its_limit_and_every_element_completes() {
    // 4 nodes of 2 GPUs: room for 8, the array may run 3.
    let mut a = allocator(4);
    let arr = ArraySpec {
        indices: (0..20).collect(),
        limit: 3,
    };
    let first = a
        .apply(0, &submit(Gates::default(), Some(arr), "sweep"))
        .expect("submit")
        .id
        .expect("id");
    let mut most = 0;
    let mut sent = Vec::new();
    for t in 1..100 {
        let ap = a.apply(t, &Input::Schedule).expect("pass");
        sent.extend(ap.outs);
        let now = running(&a);
        most = most.max(now.len());
        assert!(now.len() <= 3, "at {t}: {now:?} run");
        for id in now {
            end(&mut a, t, id, LeaseEnd::Completed);
        }
        if a.workloads()
            .values()
            .all(|w| w.state == WorkloadState::Completed)
        {
            break;
        }
    }
    assert_eq!(most, 3, "the limit is used, not just kept");
    let done: Vec<u32> = a
        .workloads()
        .values()
        .filter(|w| w.state == WorkloadState::Completed)
        .map(|w| w.array.expect("element").index)
        .collect();
    assert_eq!(done, (0..20).collect::<Vec<_>>());
    // Each element knows its array and index, in its environment and file names.
    let starts: Vec<&StartLease> = sent
        .iter()
        .filter_map(|o| match o {
            Out::Send {
                cmd: Command::Start(s),
                ..
            } => Some(&**s),
            _ => None,
        })
        .collect();
    assert_eq!(starts.len(), 20);
    let last = starts.last().expect("a start");
    let env = last.allot_env();
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(get("ALLOT_ARRAY_ID"), Some(first.to_string()));
    assert_eq!(get("ALLOT_ARRAY_INDEX"), Some("19".into()));
    assert_eq!(last.output, format!("{first}_19.out"));
}

#[test]
fn afterok_runs_after_success_and_ends_with_the_reason_after_a_failure() {
    let mut a = allocator(2);
    let first = submitted(&mut a, 0, &submit(Gates::default(), None, ""));
    let after = |id| Gates {
        deps: vec![Dep {
            kind: DepKind::Afterok,
            id,
        }],
        ..Gates::default()
    };
    let second = submitted(&mut a, 0, &submit(after(first), None, ""));
    let third = submitted(&mut a, 0, &submit(after(second), None, ""));
    a.apply(1, &Input::Schedule).unwrap();
    assert_eq!(running(&a), vec![first], "the dependents wait");
    assert!(a.why(1, second).0.contains("to complete (afterok)"));
    assert_eq!(a.why(1, second).1, "dependency");
    end(&mut a, 2, first, LeaseEnd::Completed);
    a.apply(3, &Input::Schedule).unwrap();
    assert_eq!(running(&a), vec![second]);
    // The second fails: the third can never run, and says why.
    end(&mut a, 4, second, LeaseEnd::Failed);
    assert_eq!(state(&a, third), WorkloadState::Cancelled);
    let w = &a.workloads()[&third];
    assert_eq!(w.end_reason, "dependency-never-satisfied");
    // An afternotok on a completed workload is never met either.
    let notok = Gates {
        deps: vec![Dep {
            kind: DepKind::Afternotok,
            id: first,
        }],
        ..Gates::default()
    };
    let fourth = submitted(&mut a, 5, &submit(notok, None, ""));
    assert_eq!(state(&a, fourth), WorkloadState::Cancelled);
}

#[test]
fn holds_keep_work_out_until_released_and_requeue_sends_it_back() {
    let mut a = allocator(1);
    let held = Gates {
        hold: Some(HoldRec {
            by: "u".into(),
            operator: false,
        }),
        ..Gates::default()
    };
    let id = submitted(&mut a, 0, &submit(held, None, ""));
    a.apply(1, &Input::Schedule).unwrap();
    assert!(running(&a).is_empty(), "held work does not start");
    assert_eq!(a.why(1, id).1, "held");
    assert!(
        a.core
            .workload(allot_fairshare::WorkloadId(id))
            .unwrap()
            .held
    );
    a.apply(2, &Input::Release { id, by: "u".into() }).unwrap();
    a.apply(3, &Input::Schedule).unwrap();
    assert_eq!(running(&a), vec![id]);
    // Holding running work is refused: requeue it first.
    let e = a
        .apply(
            4,
            &Input::Hold {
                id,
                by: "u".into(),
                operator: false,
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("is running"), "{e}");
    // Requeue with a hold: revoked now, back in the queue held.
    let ap = a
        .apply(
            4,
            &Input::Requeue {
                id,
                by: "u".into(),
                hold: true,
                operator: false,
            },
        )
        .unwrap();
    assert!(ap
        .outs
        .iter()
        .any(|o| matches!(o, Out::Audit { text, .. } if text.contains("requeue asked by u"))));
    let ap = a.apply(5, &Input::Schedule).unwrap();
    assert!(
        ap.outs.iter().any(|o| matches!(o, Out::Send { cmd: Command::Revoke { why, .. }, .. } if why.contains("requeued"))),
        "the host is told to stop it"
    );
    end(&mut a, 6, id, LeaseEnd::Revoked);
    assert_eq!(state(&a, id), WorkloadState::Pending);
    a.apply(7, &Input::Schedule).unwrap();
    assert!(running(&a).is_empty(), "back in the queue, held");
    assert_eq!(a.why(7, id).1, "held");
    // Updating a pending workload: a shorter limit.
    a.apply(
        8,
        &Input::Update {
            id,
            by: "u".into(),
            time_limit: Some(600),
            priority: Some(-1),
            begin: None,
        },
    )
    .unwrap();
    let w = &a.workloads()[&id];
    assert_eq!((w.spec.time_limit, w.spec.priority), (Some(600), -1));
}

#[test]
fn begin_times_and_singletons_wait_their_turn_and_survive_a_snapshot() {
    let mut a = allocator(2);
    let later = Gates {
        begin: 1_000,
        ..Gates::default()
    };
    let b = submitted(&mut a, 0, &submit(later, None, ""));
    let s1 = submitted(&mut a, 0, &submit(Gates::default(), None, "nightly"));
    let single = Gates {
        singleton: true,
        ..Gates::default()
    };
    let s2 = submitted(&mut a, 0, &submit(single, None, "nightly"));
    let ap = a.apply(1, &Input::Schedule).unwrap();
    assert_eq!(running(&a), vec![s1]);
    assert_eq!(ap.next_wakeup.map(|t| t.min(1_000)), Some(1_000));
    assert_eq!(a.why(1, b).1, "begin-time");
    assert_eq!(a.why(1, s2).1, "singleton");
    // Through a snapshot: the gates and what they wait for come back.
    let cfg = ServerConfig::parse(crate::config::EXAMPLE, "example").unwrap();
    let mut a = Allocator::restore(&cfg, &a.snapshot(), 2).expect("restore");
    assert_eq!(a.why(2, s2).1, "singleton");
    end(&mut a, 3, s1, LeaseEnd::Completed);
    a.apply(4, &Input::Schedule).unwrap();
    assert_eq!(running(&a), vec![s2]);
    a.apply(1_000, &Input::Schedule).unwrap();
    assert!(running(&a).contains(&b), "its begin time came");
}

#[test]
fn a_met_dependency_outlives_the_others_retiring_and_a_held_element_blocks_no_other() {
    let mut a = allocator(2);
    let first = submitted(&mut a, 0, &submit(Gates::default(), None, ""));
    let waits = Gates {
        deps: vec![Dep {
            kind: DepKind::Afterok,
            id: first,
        }],
        hold: Some(HoldRec {
            by: "u".into(),
            operator: false,
        }),
        ..Gates::default()
    };
    let second = submitted(&mut a, 0, &submit(waits, None, ""));
    a.apply(1, &Input::Schedule).unwrap();
    end(&mut a, 2, first, LeaseEnd::Completed);
    // The first leaves memory long before the second is released.
    assert_eq!(a.retire(10).len(), 1);
    a.apply(
        20,
        &Input::Release {
            id: second,
            by: "u".into(),
        },
    )
    .unwrap();
    a.apply(21, &Input::Schedule).unwrap();
    assert_eq!(
        state(&a, second),
        WorkloadState::Running,
        "{:?}",
        a.why(21, second)
    );

    // An array of 6 with %2 whose next two elements are held by their user: the
    // elements after them take the room.
    let mut a = allocator(4);
    let arr = ArraySpec {
        indices: (0..6).collect(),
        limit: 2,
    };
    let first = submitted(&mut a, 0, &submit(Gates::default(), Some(arr), "sweep"));
    for id in [first + 2, first + 3] {
        a.apply(
            1,
            &Input::Hold {
                id,
                by: "u".into(),
                operator: false,
            },
        )
        .unwrap();
    }
    a.apply(2, &Input::Schedule).unwrap();
    assert_eq!(running(&a), vec![first, first + 1]);
    for id in [first, first + 1] {
        end(&mut a, 3, id, LeaseEnd::Completed);
    }
    a.apply(4, &Input::Schedule).unwrap();
    assert_eq!(running(&a), vec![first + 4, first + 5]);
    assert_eq!(a.why(4, first + 2).1, "held");
}

#[test]
fn an_operators_hold_stays_an_operators() {
    let mut a = allocator(1);
    let id = submitted(&mut a, 0, &submit(Gates::default(), None, ""));
    let hold = |by: &str, operator| Input::Hold {
        id,
        by: by.into(),
        operator,
    };
    a.apply(1, &hold("olga", true)).unwrap();
    // The owner's own hold on top changes nothing: it stays olga's.
    assert!(!a.apply(2, &hold("u", false)).unwrap().changed);
    let h = a.workloads()[&id].gates.hold.clone().expect("held");
    assert!(h.operator && h.by == "olga", "{h:?}");
}
