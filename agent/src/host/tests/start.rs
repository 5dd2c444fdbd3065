//! Starting leases: GPU choice, the request's checks, users, the lease on disk.

use super::*;
use crate::os::fake::Call;
use allot_checkpoint_hooks::{Identity, RunAs};

/// Alice as the fake knows her: uid 1000, group 100, also in group 44.
fn alice() -> RunAs {
    RunAs::User(Identity {
        uid: 1000,
        gid: 100,
        groups: vec![100, 44],
    })
}

#[test]
fn start_launches_on_the_lowest_free_gpus_with_the_lease_on_disk() {
    let mut t = T::new();
    let (l, reaper) = t.try_start(spec(2, 60)).expect("starts");
    assert_eq!(l.id, "L-1");
    assert_eq!(l.workload_id, "L-1");
    assert_eq!(l.gpus, vec![uuid(0), uuid(1)]);
    assert_eq!(l.state, LeaseState::Running);
    assert_eq!(l.start_ms, t.now());
    assert_eq!(l.user, "root");
    assert_eq!(l.grace_s, 30, "the default grace");
    assert!(reaper.is_some(), "the agent reaps what it started");
    let p = t.os.process(l.pid).expect("the fake started it");
    assert_eq!(l.start_ticks, p.start_ticks);
    assert_eq!(p.pgrp, l.pid);

    let launches = t.os.launches();
    assert_eq!(launches.len(), 1);
    let dir = t.dir.0.join("leases").join("L-1");
    assert_eq!(launches[0].lease, "L-1");
    assert_eq!(launches[0].argv, vec!["train", "--fast"]);
    assert_eq!(launches[0].gpus, l.gpus);
    assert_eq!(launches[0].checkpoint_dir, dir.join("checkpoint"));
    assert_eq!(launches[0].lease_dir, dir);
    assert_eq!(launches[0].run_as, RunAs::Agent);
    // Output under the log dir by user, workload, run and rank; capped; in a cgroup named
    // after the lease under the agent's own; supervised.
    let logs = t.dir.0.join("logs");
    assert_eq!(launches[0].out_log, logs.join("root/L-1/0.0.out"));
    assert_eq!(launches[0].err_log, logs.join("root/L-1/0.0.err"));
    assert_eq!(
        l.out_log,
        logs.join("root/L-1/0.0.out").display().to_string()
    );
    assert_eq!(launches[0].cap_bytes, 1 << 20);
    assert_eq!(
        launches[0].cgroup,
        Some(PathBuf::from("/cg/allot-test/L-1"))
    );
    assert_eq!(l.cgroup, "/cg/allot-test/L-1");
    assert_eq!(
        l.supervisor_pid,
        t.os.supervisor_of(l.pid).expect("supervised")
    );

    let stored = t.stored("L-1").expect("on disk");
    assert_eq!((stored.pid, stored.state), (l.pid, LeaseState::Running));
    assert_eq!(
        t.h.take_changes().iter().map(|c| &c.id).collect::<Vec<_>>(),
        ["L-1"]
    );

    let l2 = t.start(spec(2, 0));
    assert_eq!(
        (l2.id.as_str(), l2.gpus.clone()),
        ("L-2", vec![uuid(2), uuid(3)])
    );
    assert_ne!(l2.pid, l.pid);
    let m = refusal(t.try_start(spec(1, 0)));
    assert!(m.contains("1 GPUs asked, 0 free and healthy of 4"), "{m}");
    // The agent reaps its own: nothing to poll, no timers.
    assert_eq!(t.h.next_wakeup(t.now()), None);
}

#[test]
fn the_requested_cpus_and_memory_become_the_cgroups_limits() {
    let mut t = T::new();
    t.start(StartSpec {
        cpus: 4,
        memory_gb: 16,
        ..spec(1, 0)
    });
    t.start(spec(1, 0));
    let l = t.os.launches();
    assert_eq!(
        l[0].limits,
        allot_checkpoint_hooks::cgroup::Limits {
            cpu_millis: Some(4_000),
            memory_bytes: Some(16 << 30),
        }
    );
    assert_eq!(l[1].limits, Default::default(), "none asked, none set");
}

#[test]
fn output_patterns_name_the_files_and_no_cgroup_means_none() {
    let mut t = T::with(|s| s.cgroups = crate::cgroup::Placement::Off("none here".into()));
    let l = t.start(StartSpec {
        workload_id: "w-7".into(),
        run: 2,
        rank: 1,
        output: "train-%j-%r.%n.log".into(),
        ..spec(1, 0)
    });
    let logs = t.h.settings().log_dir.clone();
    assert_eq!(
        l.out_log,
        logs.join("root/train-w-7-2.1.log").display().to_string()
    );
    assert_eq!(
        l.err_log,
        logs.join("root/w-7/2.1.err").display().to_string()
    );
    assert_eq!(t.os.launches()[0].cgroup, None);
    assert_eq!(l.cgroup, "");
}

#[test]
fn an_ended_leases_gpus_are_free_again() {
    let mut t = T::new();
    let l = t.start(spec(4, 0));
    let now = t.os.advance(5);
    t.h.on_exit(&l.id, &exited(Some(0)), now);
    assert_eq!(t.start(spec(4, 0)).gpus.len(), 4);
}

#[test]
fn start_checks_the_request() {
    let mut t = T::new();
    assert_eq!(invalid(t.try_start(spec(0, 0))), "gpus");
    let no_command = StartSpec {
        argv: Vec::new(),
        ..spec(1, 0)
    };
    assert_eq!(invalid(t.try_start(no_command)), "argv");
    let both = StartSpec {
        adopt_pid: Some(t.os.spawn().pid),
        ..spec(1, 0)
    };
    assert_eq!(invalid(t.try_start(both)), "adopt_pid");
    let bad_hook = StartSpec {
        hook: "signal:KILL".into(),
        ..spec(1, 0)
    };
    assert_eq!(invalid(t.try_start(bad_hook)), "checkpoint");
    assert!(t.os.launches().is_empty());
    assert!(t.h.leases().is_empty());
}

#[test]
fn the_allocators_gpus_and_lease_id_are_taken_as_given() {
    let mut t = T::new();
    let given = |id: &str, g: u32| StartSpec {
        lease_id: id.into(),
        workload_id: "W-9".into(),
        gpu_uuids: vec![uuid(g)],
        ..spec(1, 0)
    };
    let l = t.start(given("A-7", 3));
    assert_eq!((l.id.as_str(), l.workload_id.as_str()), ("A-7", "W-9"));
    assert_eq!(l.gpus, vec![uuid(3)]);
    let m = refusal(t.try_start(given("A-8", 3)));
    assert!(m.contains("GPU GPU-3 is not free"), "{m}");
    let m = refusal(t.try_start(given("A-7", 2)));
    assert!(m.contains("lease A-7 exists already"), "{m}");
    assert_eq!(t.os.launches().len(), 1);
}

#[test]
fn the_default_hook_is_for_local_leases_only() {
    let mut t = T::with(|s| s.default_hook = "signal:USR1".into());
    assert_eq!(t.start(spec(1, 0)).hook, "signal:USR1");
    let allocators = t.start(StartSpec {
        lease_id: "A-1".into(),
        ..spec(1, 0)
    });
    assert_eq!(
        allocators.hook, "",
        "allotd's work carries its own hook or none"
    );
    let own = t.start(StartSpec {
        hook: "signal:TERM".into(),
        grace_s: 5,
        ..spec(1, 0)
    });
    assert_eq!((own.hook.as_str(), own.grace_s), ("signal:TERM", 5));
}

#[test]
fn a_failed_launch_ends_the_lease_and_frees_its_gpus() {
    let mut t = T::new();
    t.os.fail_next_launch("no such program");
    match t.try_start(spec(4, 0)) {
        Err(HostError::Launch(e)) => assert!(e.to_string().contains("no such program")),
        other => panic!("expected a launch error, got {other:?}"),
    }
    let l = t.lease("L-1");
    assert_eq!(
        (l.state, l.end_reason.as_str()),
        (LeaseState::Ended, "failed-to-start")
    );
    assert_eq!(t.stored("L-1").map(|l| l.state), Some(LeaseState::Ended));
    assert_eq!(t.start(spec(4, 0)).id, "L-2");
}

#[test]
fn failed_gpus_are_not_offered() {
    let mut t = T::new();
    t.verdict(verdict(
        HostVerdict::Ok,
        &[],
        &[(&pci(0), GpuState::Failed, reason("xid:79", None, true))],
    ));
    let m = refusal(t.try_start(spec(4, 0)));
    assert!(m.contains("3 free and healthy of 4"), "{m}");
    assert_eq!(t.start(spec(1, 0)).gpus, vec![uuid(1)]);
}

#[test]
fn root_starts_work_as_another_user() {
    let mut t = T::new();
    let l = t.start(StartSpec {
        user: "alice".into(),
        ..spec(1, 0)
    });
    assert_eq!(l.user, "alice");
    let launch = &t.os.launches()[0];
    assert_eq!(launch.run_as, alice());
}

#[test]
fn a_user_runs_as_themself_and_only_root_as_another() {
    let mut t = T::new();
    let now = t.now();
    let (l, _) = t.h.start(spec(1, 0), ALICE, now).expect("starts");
    assert_eq!(l.user, "alice");
    assert_eq!(
        t.os.launches().last().map(|l| l.run_as.clone()),
        Some(alice())
    );
    let as_root = StartSpec {
        user: "root".into(),
        ..spec(1, 0)
    };
    let m = refusal(t.h.start(as_root, ALICE, now));
    assert!(
        m.contains("only root may start a lease as another user"),
        "{m}"
    );
    let nobody = StartSpec {
        user: "bob".into(),
        ..spec(1, 0)
    };
    assert_eq!(invalid(t.h.start(nobody, ROOT, now)), "user");
    // A caller without a passwd entry runs as its uid and gid, with no login
    // environment to give it.
    let (l, _) =
        t.h.start(spec(1, 0), Caller { uid: 2000, gid: 7 }, now)
            .expect("starts");
    assert_eq!(l.user, "2000");
    let last = t.os.launches().pop().expect("launched");
    assert_eq!(
        last.run_as,
        RunAs::User(Identity {
            uid: 2000,
            gid: 7,
            groups: vec![7]
        })
    );
    assert!(last.env.iter().all(|(k, _)| k != "HOME"), "{:?}", last.env);
}

#[test]
fn an_agent_that_is_not_root_runs_work_only_as_itself() {
    let mut t = T::new();
    t.os.set_euid(1000);
    let now = t.now();
    t.h.start(spec(1, 0), ALICE, now).expect("its own user");
    assert_eq!(
        t.os.launches().last().map(|l| l.run_as.clone()),
        Some(RunAs::Agent),
        "no identity switch"
    );
    let m = refusal(t.h.start(spec(1, 0), ROOT, now));
    assert!(m.contains("the agent runs as uid 1000"), "{m}");
    assert!(t.os.calls().iter().any(|c| matches!(c, Call::Euid)));
}

#[test]
fn durations_longer_than_a_year_are_refused_naming_the_field() {
    let mut t = T::new();
    let year = allot_units::MAX_CONTRACT;
    for (field, s) in [
        (
            "grace_s",
            StartSpec {
                grace_s: u64::MAX,
                ..spec(1, 0)
            },
        ),
        ("min_runtime_s", spec(1, year + 1)),
        (
            "time_limit_s",
            StartSpec {
                time_limit_s: Some(u64::MAX),
                ..spec(1, 0)
            },
        ),
    ] {
        assert_eq!(invalid(t.try_start(s)), field);
    }
    assert!(t.os.launches().is_empty());
    // A year exactly is a contract the core accepts too.
    t.start(StartSpec {
        grace_s: year,
        ..spec(1, year)
    });
}

mod arbitrary_requests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Whatever a caller asks, the host answers (no panic), and whatever it
        /// starts has durations no clock can overflow.
        #[test]
        fn any_start_request_is_answered_and_starts_only_what_it_can_keep(
            gpus in 0u32..12,
            min_runtime_s in prop_oneof![0u64..10_000, any::<u64>()],
            time_limit_s in proptest::option::of(prop_oneof![0u64..10_000, any::<u64>()]),
            grace_s in prop_oneof![0u64..10_000, any::<u64>()],
            argv in proptest::collection::vec("[a-z\\-]{0,8}", 0..3),
            adopt in proptest::option::of(-2i32..200),
            user in prop_oneof![Just(String::new()), Just("alice".to_string()), "[a-z]{1,6}"],
            hook in prop_oneof![Just(String::new()), Just("signal:USR1".to_string()), "[a-z:]{0,12}"],
            as_alice in any::<bool>(),
        ) {
            let mut t = T::new();
            let caller = if as_alice { ALICE } else { ROOT };
            let now = t.now();
            let r = t.h.start(
                StartSpec { gpus, min_runtime_s, time_limit_s, grace_s, argv, adopt_pid: adopt, user, hook, ..Default::default() },
                caller,
                now,
            );
            if let Ok((l, _)) = r {
                let year = allot_units::MAX_CONTRACT;
                prop_assert!(l.grace_s <= year && l.min_runtime_s <= year);
                prop_assert!(l.time_limit_s.is_none_or(|s| s <= year));
                prop_assert!(l.gpus.len() == gpus as usize);
                prop_assert!(adopt.is_none_or(|p| p != crate::os::fake::AGENT_PID && p != 1));
            }
        }
    }
}

#[test]
fn the_work_s_environment_is_submitted_then_login_then_path_then_allot() {
    let kv = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let submitted = kv(&[
        ("HOME", "/home/submitter"),
        ("LANG", "C.UTF-8"),
        ("ALLOT_NODE_RANK", "7"),
    ]);
    let login = kv(&[("HOME", "/home/alice"), ("USER", "alice")]);
    let allot = kv(&[("ALLOT_NODE_RANK", "1"), ("MASTER_PORT", "29501")]);
    let env = crate::host::job_env(&submitted, &login, &allot);
    assert_eq!(
        env,
        kv(&[
            ("HOME", "/home/alice"),
            ("LANG", "C.UTF-8"),
            ("ALLOT_NODE_RANK", "1"),
            ("USER", "alice"),
            ("PATH", crate::host::DEFAULT_PATH),
            ("MASTER_PORT", "29501"),
        ])
    );
    // A submitted PATH is kept.
    let env = crate::host::job_env(&kv(&[("PATH", "/opt/bin")]), &login, &[]);
    assert!(env.contains(&("PATH".into(), "/opt/bin".into())), "{env:?}");
}

#[test]
fn a_start_carries_its_place_run_rank_and_patterns_to_the_launch_and_the_lease() {
    let mut t = T::new();
    let s = StartSpec {
        user: "alice".into(),
        cwd: "/home/alice/golf".into(),
        job_env: vec![("WANDB_PROJECT".into(), "golf".into())],
        env: vec![("ALLOT_RUN".into(), "2".into())],
        run: 2,
        rank: 1,
        output: "out-%j-%n".into(),
        error: "err-%j".into(),
        ..spec(1, 0)
    };
    let l = t.start(s);
    assert_eq!(
        (
            l.cwd.as_str(),
            l.run,
            l.rank,
            l.output.as_str(),
            l.error.as_str()
        ),
        ("/home/alice/golf", 2, 1, "out-%j-%n", "err-%j")
    );
    let stored = t.stored(&l.id).expect("on disk");
    assert_eq!((stored.run, stored.rank, stored.cwd), (2, 1, l.cwd.clone()));
    let launch = &t.os.launches()[0];
    assert_eq!(launch.cwd.as_deref(), Some(Path::new("/home/alice/golf")));
    let get = |k: &str| {
        launch
            .env
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(get("WANDB_PROJECT"), Some("golf"));
    assert_eq!(get("HOME"), Some("/home/alice"));
    assert_eq!(get("USER"), Some("alice"));
    assert_eq!(get("PATH"), Some(crate::host::DEFAULT_PATH));
    assert_eq!(get("ALLOT_RUN"), Some("2"));
    assert!(t
        .os
        .calls()
        .iter()
        .any(|c| matches!(c, Call::WorkDir(d) if d == Path::new("/home/alice/golf"))));
}

#[test]
fn a_missing_working_directory_fails_the_start_naming_it_and_starts_nothing() {
    let mut t = T::new();
    t.os.remove_dir("/scratch/gone");
    let s = StartSpec {
        cwd: "/scratch/gone".into(),
        lease_id: "A-9".into(),
        ..spec(1, 0)
    };
    let e = t.try_start(s).expect_err("refused");
    // Invalid (a fact about the work: FailedToStart upstream), not Refused (the node).
    match &e {
        HostError::Invalid { field, message } => {
            assert_eq!(*field, "cwd");
            assert!(
                message.contains("/scratch/gone does not exist on this host"),
                "{message}"
            );
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert!(t.os.launches().is_empty());
    assert!(
        t.stored("A-9").is_none(),
        "nothing on disk for a start that never was"
    );
}
