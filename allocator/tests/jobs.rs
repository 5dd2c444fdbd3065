//! What a job's start carries, end to end: allotd and real agents on fake GPUs, real
//! processes, driven through the `allot` CLI. The environment and working directory
//! as submitted (`--export`, `--env`, `--chdir`), a missing directory failing the
//! workload with its reason, and a two-node gang that finds itself: a real TCP
//! rendezvous on MASTER_ADDR:MASTER_PORT, and one part's death ending the other.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use support::{sibling, wait_for, Cluster};

const LONG: Duration = Duration::from_secs(90);

const PROJECTS: &str =
    "[[group]]\nname = \"demo-a\"\nweight = 1\n[[group]]\nname = \"demo-b\"\nweight = 1\n";

/// A cluster whose MASTER_PORT range is one port free now: tests of this file and
/// others run at once on this host, and each gang listens on its port.
fn cluster(tag: &str, nodes: usize, gpus: u32) -> Cluster {
    let port = allot_test_support::free_port();
    Cluster::start_with(
        tag,
        &format!("lost_grace = \"30s\"\nmaster_ports = \"{port}-{port}\""),
        PROJECTS,
        nodes,
        gpus,
    )
}

/// `allot submit --json FLAGS -- ARGV` with `env` added to the CLI's environment;
/// returns the workload id.
fn submit(c: &Cluster, env: &[(&str, &str)], flags: &[&str], argv: &[&str]) -> String {
    let mut cmd = Command::new(sibling("allot", "allot-cli"));
    cmd.args(["submit", "--json", "--project", "demo-a"])
        .args(flags)
        .arg("--")
        .args(argv)
        .env("ALLOT_SERVER", format!("https://{}", c.addr))
        .env("ALLOT_TOKEN", &c.token)
        .env("ALLOT_CA", c.ca());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("allot runs");
    let v = allot_test_support::json_of(&["submit"], &out);
    v["id"].as_str().expect("id").to_string()
}

/// `NAME=VALUE` lines (as `env` writes them) as a map.
fn env_file(path: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A fresh directory under the cluster's, for one job to start in.
fn workdir(c: &Cluster, name: &str) -> PathBuf {
    let d = c.dir.join(name);
    std::fs::create_dir_all(&d).expect("work dir");
    d
}

/// The test user's home, as the hosts' passwd has it.
fn my_home() -> String {
    let me = allot_test_support::current_user();
    nix::unistd::User::from_name(&me)
        .ok()
        .flatten()
        .map(|u| u.dir.display().to_string())
        .expect("the test user is in passwd")
}

fn history(w: &serde_json::Value) -> Vec<String> {
    w["history"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h.as_str().map(str::to_string))
        .collect()
}

#[test]
fn the_environment_and_the_working_directory_arrive_as_submitted() {
    let c = cluster("jobs-env", 1, 1);
    let dir = workdir(&c, "work dir");
    let id = submit(
        &c,
        &[
            ("JOBS_MARK", "from the submitter"),
            ("JOBS_OVERRIDE", "from the environment"),
            ("HOME", "/nonexistent/submitter-home"),
        ],
        &[
            "--env",
            "JOBS_OVERRIDE=set by --env",
            "--chdir",
            dir.to_str().expect("utf-8"),
        ],
        &["sh", "-c", "env > env.txt; pwd > pwd.txt"],
    );
    c.wait_state(&id, "completed", LONG);
    let env = env_file(&dir.join("env.txt"));
    let get = |k: &str| env.get(k).map(String::as_str);
    assert_eq!(get("JOBS_MARK"), Some("from the submitter"), "{env:?}");
    assert_eq!(get("JOBS_OVERRIDE"), Some("set by --env"));
    // The user's login variables win over the submitted ones.
    assert_eq!(get("HOME"), Some(my_home().as_str()));
    assert_eq!(
        get("USER"),
        Some(allot_test_support::current_user().as_str())
    );
    assert_eq!(get("LOGNAME"), get("USER"));
    assert!(get("SHELL").is_some_and(|s| s.starts_with('/')), "{env:?}");
    // The submitter's credential never travels; allot's own variables are there.
    assert_eq!(get("ALLOT_TOKEN"), None);
    assert_eq!(get("ALLOT_WORKLOAD_ID"), Some(id.as_str()));
    assert_eq!(get("ALLOT_RUN"), Some("1"));
    assert_eq!(
        (
            get("ALLOT_NODE_RANK"),
            get("ALLOT_NNODES"),
            get("WORLD_SIZE")
        ),
        (Some("0"), Some("1"), Some("1"))
    );
    let pwd = std::fs::read_to_string(dir.join("pwd.txt")).expect("pwd written");
    assert_eq!(pwd.trim(), dir.to_str().expect("utf-8"));
    let w = c.status(&id);
    assert_eq!(w["cwd"], dir.to_str().expect("utf-8"), "{w}");
    // Stored by allotd, shown to no one (it may hold secrets).
    assert!(w.get("env").is_none(), "{w}");
}

#[test]
fn export_none_gives_a_clean_environment() {
    let c = cluster("jobs-none", 1, 1);
    let dir = workdir(&c, "none");
    let id = submit(
        &c,
        &[
            ("JOBS_MARK", "must not arrive"),
            ("PATH", "/opt/submitter/bin:/usr/bin:/bin"),
        ],
        &[
            "--export",
            "NONE",
            "--env",
            "ONLY=this",
            "--chdir",
            dir.to_str().expect("utf-8"),
        ],
        &["sh", "-c", "env > env.txt"],
    );
    c.wait_state(&id, "completed", LONG);
    let env = env_file(&dir.join("env.txt"));
    assert_eq!(env.get("JOBS_MARK"), None, "{env:?}");
    assert_eq!(env.get("ONLY").map(String::as_str), Some("this"));
    assert_eq!(
        env.get("PATH").map(String::as_str),
        Some("/usr/local/bin:/usr/bin:/bin"),
        "the default PATH"
    );
    assert_eq!(env.get("ALLOT_WORKLOAD_ID"), Some(&id));
    assert!(env.contains_key("HOME") && env.contains_key("CUDA_VISIBLE_DEVICES"));
    // Nothing of the agent's own environment (it runs with ALLOT_LOG set) leaks in,
    // nor of the CLI's (ALLOT_SERVER, ALLOT_CA).
    for k in [
        "ALLOT_LOG",
        "ALLOT_SERVER",
        "ALLOT_CA",
        "ALLOT_TOKEN",
        "CARGO_MANIFEST_DIR",
    ] {
        assert!(!env.contains_key(k), "{k} leaked: {env:?}");
    }
    let allowed = [
        "ONLY",
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "PWD",
        "SHLVL",
        "_",
        "OLDPWD",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "WORLD_SIZE",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    ];
    for k in env.keys() {
        assert!(
            allowed.contains(&k.as_str()) || k.starts_with("ALLOT_") || k.starts_with("PET_"),
            "{k} is not allot's, the login's or submitted: {env:?}"
        );
    }
}

#[test]
fn a_missing_working_directory_fails_the_workload_with_the_reason() {
    let c = cluster("jobs-nodir", 1, 1);
    let gone = c.dir.join("never made");
    let id = submit(
        &c,
        &[],
        &["--chdir", gone.to_str().expect("utf-8")],
        &["sh", "-c", "echo ran > /dev/null"],
    );
    let w = c.wait_state(&id, "failed", LONG);
    let h = history(&w).join("\n");
    assert!(
        h.contains(&format!("{} does not exist on this host", gone.display()))
            && h.contains("node-0"),
        "the reason names the directory and the host: {h}"
    );
    // A fact about the work, not the node: it still takes work.
    assert_eq!(c.node_view(0)["state"], "ready");
    let ok = c.submit(&["--project", "demo-a", "--gpus", "1"], "true");
    c.wait_state(&ok, "completed", LONG);
}

/// Rank 0 listens on MASTER_ADDR:MASTER_PORT; every rank (0 too) connects and says
/// its NODE_RANK; rank 0 answers all once every one of ALLOT_NNODES ranks has met,
/// and exits 0 only then; the others exit 0 once answered. Each writes its view of
/// the gang's variables to `rank-N.env` first.
const RENDEZVOUS: &str = r#"
import os, socket, sys, threading, time
e = os.environ
rank, n = int(e["NODE_RANK"]), int(e["ALLOT_NNODES"])
addr, port = e["MASTER_ADDR"], int(e["MASTER_PORT"])
with open(f"rank-{rank}.env", "w") as f:
    for k in sorted(e):
        f.write(f"{k}={e[k]}\n")
deadline = time.time() + 60

def report():
    while True:
        try:
            s = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                sys.exit("rank %d: no rendezvous at %s:%d" % (rank, addr, port))
            time.sleep(0.2)
    s.sendall(b"%d\n" % rank)
    s.settimeout(60)
    if s.recv(16) != b"ok":
        sys.exit("rank %d: not acknowledged" % rank)

if rank == 0:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(n)
    srv.settimeout(60)
    me = threading.Thread(target=report)
    me.start()
    met, conns = set(), []
    while len(met) < n:
        c, _ = srv.accept()
        met.add(int(c.makefile().readline()))
        conns.append(c)
    for c in conns:
        c.sendall(b"ok")
    me.join()
    with open("met.txt", "w") as f:
        f.write(",".join(str(r) for r in sorted(met)))
    sys.exit(0 if met == set(range(n)) else 1)
else:
    report()
"#;

#[test]
fn a_two_node_gang_finds_itself_and_rendezvous_over_tcp() {
    let c = cluster("jobs-gang", 2, 2);
    let dir = workdir(&c, "gang");
    std::fs::write(dir.join("rendezvous.py"), RENDEZVOUS).expect("script");
    let id = submit(
        &c,
        &[],
        &[
            "--nodes",
            "2",
            "--gpus",
            "2",
            "--chdir",
            dir.to_str().expect("utf-8"),
        ],
        &["python3", "rendezvous.py"],
    );
    let w = c.wait_state(&id, "completed", LONG);
    assert_eq!(w["lease_ids"].as_array().map(Vec::len), Some(1), "{w}");
    assert_eq!(
        std::fs::read_to_string(dir.join("met.txt")).expect("rank 0 wrote who met"),
        "0,1"
    );
    let port = c.dir.join("allotd.toml");
    let conf = std::fs::read_to_string(port).expect("config");
    let range = conf
        .lines()
        .find_map(|l| l.strip_prefix("master_ports = "))
        .expect("range")
        .trim_matches('"')
        .split('-')
        .next()
        .expect("low")
        .to_string();
    let mut hosts = Vec::new();
    for rank in 0..2 {
        let e = env_file(&dir.join(format!("rank-{rank}.env")));
        let get = |k: &str| e.get(k).map(String::as_str).unwrap_or("");
        let r = rank.to_string();
        assert_eq!(get("NODE_RANK"), r);
        assert_eq!(get("ALLOT_NODE_RANK"), r);
        assert_eq!(get("PET_NODE_RANK"), r);
        assert_eq!((get("ALLOT_NNODES"), get("PET_NNODES")), ("2", "2"));
        assert_eq!(
            (get("ALLOT_GPUS_PER_NODE"), get("PET_NPROC_PER_NODE")),
            ("2", "2")
        );
        assert_eq!(get("WORLD_SIZE"), "4", "nodes × GPUs per node");
        assert_eq!(get("ALLOT_RUN"), "1");
        assert_eq!(get("ALLOT_WORKLOAD_ID"), id);
        // The agents reach allotd over loopback: that is their address.
        assert_eq!(
            (get("MASTER_ADDR"), get("PET_MASTER_ADDR")),
            ("127.0.0.1", "127.0.0.1")
        );
        assert_eq!(
            (get("MASTER_PORT"), get("PET_MASTER_PORT")),
            (range.as_str(), range.as_str())
        );
        // The list is in rank order: this rank's host is at its place in it.
        let list: Vec<&str> = get("ALLOT_NODELIST").split(',').collect();
        assert_eq!(list.len(), 2, "{list:?}");
        let ckpt = get("ALLOT_CHECKPOINT_DIR");
        assert!(
            ckpt.contains(&format!("/{}/state/", list[rank])),
            "rank {rank} ran on {ckpt}, not on {}",
            list[rank]
        );
        hosts.push(list[rank].to_string());
        assert_eq!(get("CUDA_VISIBLE_DEVICES").split(',').count(), 2);
    }
    hosts.sort();
    assert_eq!(hosts, ["node-0", "node-1"], "one part on each node");
}

/// The live lease of node `i` (agent view), once it runs.
fn live_lease(c: &Cluster, i: usize) -> serde_json::Value {
    wait_for(&format!("a running lease on node-{i}"), LONG, || {
        let v = c.agent_json(i, &["leases", "--all", "--json"]);
        v.as_array()?
            .iter()
            .find(|l| l["state"] == "running" && l["pid"].as_i64().unwrap_or(0) > 0)
            .cloned()
    })
}

fn alive(pid: i64) -> bool {
    // A zombie has exited: only a process that still runs counts.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().to_string()))
        .is_some_and(|r| !r.starts_with('Z'))
}

#[test]
fn when_one_part_of_a_gang_dies_the_other_ends_with_the_reason() {
    let c = cluster("jobs-kill", 2, 1);
    let id = submit(
        &c,
        &[],
        &["--nodes", "2", "--gpus", "1"],
        &["sh", "-c", "exec sleep 600"],
    );
    c.wait_state(&id, "running", LONG);
    let (victim, other) = (live_lease(&c, 1), live_lease(&c, 0));
    let other_pid = other["pid"].as_i64().expect("pid");
    assert!(alive(other_pid));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim["pid"].as_i64().expect("pid") as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("killed");
    let w = c.wait_state(&id, "failed", LONG);
    let h = history(&w).join("\n");
    assert!(
        h.contains("part on node-1 (rank ") && h.contains(") ended: failed"),
        "the history names the part that ended and how: {h}"
    );
    assert!(h.contains("(killed by SIGKILL)"), "{h}");
    // The other part is revoked with that reason and its process is gone.
    let lease = other["id"].as_str().expect("lease id").to_string();
    let ended = wait_for("the other part to end", LONG, || {
        let v = c.agent_json(0, &["leases", "--all", "--json"]);
        v.as_array()?
            .iter()
            .find(|l| l["id"] == lease.as_str() && l["state"] == "ended")
            .cloned()
    });
    assert!(
        ended["revoke_why"]
            .as_str()
            .is_some_and(|r| r.contains("part on node-1 (rank ")),
        "{ended}"
    );
    wait_for("the other part's process to go", LONG, || {
        (!alive(other_pid)).then_some(())
    });
}
