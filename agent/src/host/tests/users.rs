//! Whom work runs as: never below `min_uid`, root only when allowed, with the user's
//! groups and login environment; exec hooks as the workload's user; http hooks only
//! to loopback and the named hosts. Local leases and allotd's starts alike.

use super::*;
use crate::os::fake::Call;
use allot_checkpoint_hooks::{Identity, RunAs};

/// A start as allotd's uplink makes it: its lease id, as root, for `user`.
fn from_allotd(id: &str, user: &str) -> StartSpec {
    StartSpec {
        lease_id: id.into(),
        user: user.into(),
        ..spec(1, 0)
    }
}

/// The invalid field's message.
fn invalid_message<T: std::fmt::Debug>(r: Result<T, HostError>, field: &str) -> String {
    match r {
        Err(HostError::Invalid { field: f, message }) if f == field => message,
        other => panic!("expected {field} to be invalid, got {other:?}"),
    }
}

#[test]
fn root_work_is_refused_unless_allowed_naming_the_key() {
    let mut t = T::with(|s| s.allow_root = false);
    let now = t.now();
    // A local lease by root for root, and allotd's start for root.
    for s in [spec(1, 0), from_allotd("a-1", "root")] {
        let m = invalid_message(t.h.start(s, ROOT, now), "user");
        assert_eq!(
            m,
            "\"root\" (uid 0) may not run work on this host; set [agent] allow_root = true in agent.toml to allow it"
        );
    }
    // An adopted process is held to the same rule: its hooks would run as root.
    let p = t.os.spawn();
    let adopt = StartSpec {
        argv: Vec::new(),
        adopt_pid: Some(p.pid),
        ..spec(1, 0)
    };
    assert_eq!(invalid(t.h.start(adopt, ROOT, now)), "user");
    assert!(t.os.launches().is_empty());
    assert!(t.h.leases().is_empty(), "nothing on disk either");
    // Root may still start work for a user.
    t.h.start(from_allotd("a-2", "alice"), ROOT, now)
        .expect("alice may run work");

    let mut t = T::new();
    assert_eq!(t.start(spec(1, 0)).user, "root", "allowed: it runs");
}

#[test]
fn uids_below_min_uid_are_refused_naming_the_key() {
    let mut t = T::new();
    let now = t.now();
    for s in [
        StartSpec {
            user: "daemon".into(),
            ..spec(1, 0)
        },
        from_allotd("a-1", "daemon"),
    ] {
        let m = invalid_message(t.h.start(s, ROOT, now), "user");
        assert_eq!(
            m,
            "\"daemon\" (uid 1) may not run work on this host: uids below [agent] min_uid = 1000 are the system's; lower min_uid in agent.toml to allow it"
        );
    }
    // A caller without a passwd entry is held to it by its uid.
    let m = invalid_message(
        t.h.start(spec(1, 0), Caller { uid: 999, gid: 7 }, now),
        "user",
    );
    assert!(m.starts_with("\"999\" (uid 999)"), "{m}");
    // The same user on the line: min_uid itself is allowed, and unknown users
    // are still refused as unknown.
    t.os.add_user("edge", 1000, 1000);
    t.h.start(from_allotd("a-2", "edge"), ROOT, now)
        .expect("uid 1000 is not below 1000");
    let m = invalid_message(t.h.start(from_allotd("a-3", "bob"), ROOT, now), "user");
    assert_eq!(m, "no user \"bob\" on this host");
    assert_eq!(t.os.launches().len(), 1);

    let mut t = T::with(|s| s.min_uid = 1);
    let l = t.start(StartSpec {
        user: "daemon".into(),
        ..spec(1, 0)
    });
    assert_eq!(l.user, "daemon");
}

#[test]
fn work_gets_its_users_groups_and_login_environment() {
    let mut t = T::new();
    let l = t.start(StartSpec {
        user: "alice".into(),
        job_env: vec![
            ("HOME".into(), "/scratch/alice".into()),
            ("WANDB_MODE".into(), "offline".into()),
        ],
        env: vec![("ALLOT_WORKLOAD_ID".into(), "7".into())],
        ..spec(1, 0)
    });
    let launch = t.os.launches().pop().expect("launched");
    assert_eq!(
        launch.run_as,
        RunAs::User(Identity {
            uid: 1000,
            gid: 100,
            groups: vec![100, 44],
        })
    );
    // The whole environment: the submitted variables, the login's over them (HOME
    // is the user's on this host), the default PATH, allot's last.
    assert_eq!(
        launch.env,
        [
            ("HOME", "/home/alice"),
            ("WANDB_MODE", "offline"),
            ("USER", "alice"),
            ("LOGNAME", "alice"),
            ("SHELL", "/bin/sh"),
            ("PATH", crate::host::DEFAULT_PATH),
            ("ALLOT_WORKLOAD_ID", "7"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
    );
    assert_eq!(l.user, "alice");
    // An adopted lease's checkpoint dir is its user's, as a started one's is.
    let p = t.os.spawn_owned_by(1000);
    let adopted = t.start(StartSpec {
        argv: Vec::new(),
        adopt_pid: Some(p.pid),
        user: "alice".into(),
        ..spec(1, 0)
    });
    let ckpt = t.dir.0.join("leases").join(&adopted.id).join("checkpoint");
    assert!(
        t.os.calls()
            .iter()
            .any(|c| matches!(c, Call::CreateDir(d, Some((1000, 100))) if *d == ckpt)),
        "{:?}",
        t.os.calls()
    );
}

#[test]
fn exec_hooks_run_as_the_workloads_user_and_under_the_same_rules() {
    let mut t = T::with(|s| s.hook_hosts = vec!["ckpt.example".into()]);
    let hook = StartSpec {
        hook: "exec:/opt/ckpt --now".into(),
        ..spec(1, 0)
    };
    let alice = t.start(StartSpec {
        user: "alice".into(),
        ..hook.clone()
    });
    let root = t.start(hook.clone());
    let nameless =
        t.h.start(hook.clone(), Caller { uid: 2000, gid: 7 }, t.now())
            .expect("a uid without a passwd entry runs")
            .0;
    let now = t.now();
    for l in [&alice, &root, &nameless] {
        t.h.revoke(&l.id, true, "cancel", now).expect("revokes");
    }
    // Root is no longer allowed by the time the ladders run (a reload).
    let mut s = t.h.settings.clone();
    s.allow_root = false;
    t.h.set_settings(s);
    let jobs = t.tick();
    let job = |id: &str| {
        jobs.iter()
            .find(|j| j.lease == id)
            .unwrap_or_else(|| panic!("a ladder for {id}: {jobs:?}"))
    };
    let a = job(&alice.id);
    assert_eq!(
        a.target.run_as,
        RunAs::User(Identity {
            uid: 1000,
            gid: 100,
            groups: vec![100, 44],
        })
    );
    let env: BTreeMap<_, _> = a.target.env.iter().cloned().collect();
    assert_eq!(
        (
            env["HOME"].as_str(),
            env["USER"].as_str(),
            env["LOGNAME"].as_str()
        ),
        ("/home/alice", "alice", "alice")
    );
    assert_eq!(env["ALLOT_LEASE_ID"], alice.id);
    assert_eq!(a.ladder.hook_hosts, ["ckpt.example"]);
    assert_eq!(
        job(&root.id).target.run_as,
        RunAs::Nobody(
            "\"root\" (uid 0) may not run work on this host; set [agent] allow_root = true in agent.toml to allow it".into()
        )
    );
    assert_eq!(
        job(&nameless.id).target.run_as,
        RunAs::Nobody("user \"2000\" is not known on this host".into())
    );

    // The agent's own user needs no switch.
    let mut t = T::new();
    t.os.set_euid(1000);
    let l =
        t.h.start(hook, ALICE, t.now())
            .expect("alice, as the agent")
            .0;
    let now = t.now();
    t.h.revoke(&l.id, true, "cancel", now).expect("revokes");
    assert_eq!(t.tick()[0].target.run_as, RunAs::Agent);
}

#[test]
fn http_hooks_reach_only_loopback_and_the_named_hosts() {
    let mut t = T::with(|s| s.hook_hosts = vec!["ckpt.example".into(), "10.0.0.5".into()]);
    for ok in [
        "http://127.0.0.1:8080/ckpt",
        "http://127.1.2.3/ckpt",
        "http://localhost:9/x",
        "http://[::1]:9/x",
        "http:https://CKPT.example/x",
        "http://10.0.0.5:80/x",
    ] {
        t.start(StartSpec {
            hook: ok.into(),
            ..spec(1, 0)
        });
        let now = t.now();
        let id = t.h.leases()[0].id.clone();
        t.h.on_exit(&id, &exited(Some(0)), now);
    }
    let now = t.now();
    for (far, host) in [
        ("http://10.0.0.6/x", "10.0.0.6"),
        ("http://127.0.0.1@evil.example/x", "evil.example"),
        ("http://evil.example\\@127.0.0.1/x", "evil.example"),
        ("http://ev%69l.example/x", ""),
    ] {
        let s = StartSpec {
            hook: far.into(),
            ..from_allotd("a-1", "alice")
        };
        let m = invalid_message(t.h.start(s, ROOT, now), "checkpoint");
        assert_eq!(
            m,
            format!("hook {far:?} reaches {host:?}, which is neither loopback nor in [agent] hook_hosts; add it to hook_hosts in agent.toml to allow it")
        );
    }
    // The host's default hook for local leases is held to it as well.
    let mut t = T::with(|s| s.default_hook = "http://ckpt.example/x".into());
    assert_eq!(invalid(t.try_start(spec(1, 0))), "checkpoint");
    assert_eq!(t.os.launches().len(), 0);
}
