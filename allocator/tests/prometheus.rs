//! A real Prometheus (the `prometheus` package's server and promtool) scrapes allotd
//! and two agents: every target is up, each exposition passes `promtool check
//! metrics`, the running GPUs Prometheus reads are what `allot queue` says, and the
//! GPU-to-workload join returns the workload's utilisation. Under `CI=true` a
//! missing Prometheus fails the test; elsewhere the test says so and passes. The
//! same metered cluster shows an idle lease flagged from the agent's samples.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;
use support::{wait_for, Cluster};

const LONG: Duration = Duration::from_secs(120);
const ORG: &str = "[[group]]\nname = \"demo-a\"\nweight = 1\n";

/// Prometheus' binaries, or why the test cannot run.
fn prometheus() -> Option<(String, String)> {
    let found = |b: &str| {
        Command::new(b)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    };
    if found("prometheus") && found("promtool") {
        return Some(("prometheus".into(), "promtool".into()));
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "prometheus and promtool are not installed; .ci/run installs Debian's prometheus"
    );
    eprintln!(
        "prometheus.rs: no prometheus on this machine; install Debian's prometheus to run it"
    );
    None
}

/// `GET http://addr/path`, the body.
fn get(url: &str) -> String {
    reqwest::blocking::get(url)
        .and_then(|r| r.text())
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// One instant query's answer; `None` while Prometheus does not answer yet.
fn try_query(prom: &str, q: &str) -> Option<serde_json::Value> {
    let url =
        reqwest::Url::parse_with_params(&format!("http://{prom}/api/v1/query"), &[("query", q)])
            .expect("a query URL");
    let text = reqwest::blocking::get(url).ok()?.text().ok()?;
    // Prometheus answers in plain text while it starts: not an answer yet.
    serde_json::from_str(&text).ok()
}

/// One instant query's result vector.
fn query(prom: &str, q: &str) -> Vec<serde_json::Value> {
    let v = try_query(prom, q).unwrap_or_else(|| panic!("{q}: Prometheus does not answer"));
    assert_eq!(v["status"], "success", "{q}: {v}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// Stops Prometheus when the test ends, however it ends.
struct Stop(std::process::Child);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_real_prometheus_scrapes_allotd_and_two_agents_and_joins_gpus_to_work() {
    let Some((prometheus, promtool)) = prometheus() else {
        return;
    };
    let c = Cluster::start_metered("prometheus", ORG, 2, 2);
    // Work on both nodes: one job of 2 GPUs (a whole node) and one of 1.
    let whole = c.submit(&["--project", "demo-a", "--gpus", "2"], "sleep 600");
    let one = c.submit(&["--project", "demo-a", "--gpus", "1"], "sleep 600");
    let whole_w = c.wait_state(&whole, "running", LONG);
    c.wait_state(&one, "running", LONG);
    // Each exposition is clean; the families they declare, for the dashboard below.
    let mut families = std::collections::BTreeSet::new();
    let mut check = |what: &str, url: String| {
        let body = get(&url);
        allot_test_support::promtool_check_metrics(what, &body);
        families.extend(
            body.lines()
                .filter_map(|l| l.strip_prefix("# TYPE "))
                .filter_map(|l| l.split(' ').next())
                .map(String::from),
        );
    };
    check("allotd", format!("http://{}/metrics", c.metrics));
    for (i, addr) in c.agent_metrics.iter().enumerate() {
        check(&format!("agent {i}"), format!("http://{addr}/metrics"));
    }
    // The shipped alert rules and dashboard.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let rules = root.join("packaging/prometheus/allot-alerts.yml");
    let out = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .expect("promtool runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("packaging/grafana/allot-dashboard.json"))
            .expect("dashboard"),
    )
    .expect("the dashboard is JSON");
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(String::from))
        .collect();
    assert!(exprs.len() >= 10, "{exprs:?}");
    // Every metric a panel reads is one allot serves (a renamed metric fails here).
    for e in &exprs {
        for name in e
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("allot_") || w.starts_with("DCGM_"))
        {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| families.contains(*f)))
                .unwrap_or(name);
            assert!(
                families.contains(family),
                "the dashboard reads {name}, which nothing serves: {e}"
            );
        }
    }
    // Prometheus, scraping every second.
    let dir = c.dir.join("prometheus");
    std::fs::create_dir_all(&dir).expect("dir");
    let targets: Vec<String> = std::iter::once(c.metrics.clone())
        .chain(c.agent_metrics.iter().cloned())
        .map(|t| format!("{t:?}"))
        .collect();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [{:?}]\nscrape_configs:\n  - job_name: allot\n    static_configs:\n      - targets: [{}]\n",
            rules.display().to_string(),
            targets.join(", ")
        ),
    )
    .expect("config");
    let out = Command::new(&promtool)
        .args(["check", "config"])
        .arg(&config)
        .output()
        .expect("promtool runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let web = format!("127.0.0.1:{}", allot_test_support::free_port());
    let log = std::fs::File::create(dir.join("prometheus.log")).expect("log");
    let _prom = Stop(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={web}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus starts"),
    );
    // Every target up.
    wait_for("every target up", LONG, || {
        let up = try_query(&web, "up")?["data"]["result"].as_array()?.clone();
        (up.len() == 3 && up.iter().all(|s| s["value"][1] == "1")).then_some(())
    });
    // Running GPUs: what `allot queue` says.
    let queue = c.json(&["queue", "--all", "--json"]);
    let running: u64 = queue
        .as_array()
        .expect("a list")
        .iter()
        .filter(|w| w["state"] == "running")
        .map(|w| w["gpus_per_node"].as_u64().unwrap_or(0) * w["nodes"].as_u64().unwrap_or(1))
        .sum();
    assert_eq!(running, 3, "{queue}");
    wait_for("Prometheus' running GPUs", LONG, || {
        let r = query(&web, "sum(allot_running_gpus)");
        (r.first().map(|s| s["value"][1].clone()) == Some(serde_json::json!("3"))).then_some(())
    });
    // The join: the whole-node job's GPUs are its node's GPUs 0 and 1, busy 40 and
    // 41 % by the fake source's script.
    let (node, _) = Cluster::node_of(&whole_w);
    let util = wait_for("the whole-node job's utilisation", LONG, || {
        let r = query(
            &web,
            &format!("avg by (workload) (DCGM_FI_DEV_GPU_UTIL{{workload={whole:?}}})"),
        );
        r.first()
            .map(|s| s["value"][1].as_str().unwrap_or("").to_string())
    });
    assert_eq!(util, "40.5", "the mean of 40 and 41 %");
    let per_gpu = query(&web, &format!("DCGM_FI_DEV_GPU_UTIL{{workload={whole:?}}}"));
    assert_eq!(per_gpu.len(), 2, "{per_gpu:?}");
    assert!(
        per_gpu
            .iter()
            .all(|s| s["metric"]["Hostname"] == node.as_str()),
        "{per_gpu:?}"
    );
    let lease = query(
        &web,
        &format!("allot_lease_gpu_utilization_ratio{{workload={whole:?}}}"),
    );
    assert_eq!(
        lease.first().map(|s| s["value"][1].clone()),
        Some(serde_json::json!("0.405"))
    );
    // Every panel's query runs; the alert rules are loaded and evaluate cleanly.
    for e in &exprs {
        query(&web, e);
    }
    let rules = wait_for("the alert rules evaluated", LONG, || {
        let v: serde_json::Value =
            serde_json::from_str(&get(&format!("http://{web}/api/v1/rules"))).ok()?;
        let rules = v["data"]["groups"][0]["rules"].as_array()?.clone();
        rules.iter().all(|r| r["health"] == "ok").then_some(rules)
    });
    assert_eq!(rules.len(), 6, "{rules:?}");
}

#[test]
fn an_idle_lease_is_flagged_on_its_host_and_in_allotd_and_one_in_use_is_not() {
    // GPU 0 idle (under 5 %) until 25 s after the agent starts, then busy; GPU 1
    // busy throughout. Idle means under 5 % for 2 s here.
    let c = Cluster::start_metered_with(
        "idle",
        ORG,
        1,
        2,
        "idle_after = \"2s\"\n",
        Some("at 0s gpu 0 util 1\nat 0s gpu 1 util 85\nat 25s gpu 0 util 90\n"),
    );
    let a = c.submit(&["--project", "demo-a", "--gpus", "1"], "sleep 600");
    let b = c.submit(&["--project", "demo-a", "--gpus", "1"], "sleep 600");
    c.wait_state(&a, "running", LONG);
    c.wait_state(&b, "running", LONG);
    // The one on GPU 0 is flagged: in its history, in `allot status`, as a notice.
    let (idle, busy) = wait_for("one lease flagged idle", LONG, || {
        let flagged = |id: &str| c.status(id)["history"].to_string().contains(" idle for ");
        match (flagged(&a), flagged(&b)) {
            (true, false) => Some((a.to_string(), b.to_string())),
            (false, true) => Some((b.to_string(), a.to_string())),
            _ => None,
        }
    });
    let w = c.status(&idle);
    let run = &w["runs"][0];
    assert!(
        run["idle_since_unix"].as_i64().is_some_and(|t| t > 0),
        "{w}"
    );
    assert_eq!(run["gpu_util_pct"], 1, "{w}");
    let text = String::from_utf8_lossy(&c.allot(&["status", &idle]).stdout).to_string();
    assert!(
        text.contains("gpus:") && text.contains("GPUs at 1%"),
        "{text}"
    );
    // The same pass of samples would have flagged the busy one: it is not.
    let other = c.status(&busy);
    assert!(
        !other["history"].to_string().contains(" idle for "),
        "{other}"
    );
    assert!(other["runs"][0]["idle_since_unix"].is_null(), "{other}");
    // GPU 0 gets busy: the lease is in use again.
    let back = wait_for("busy again", LONG, || {
        let w = c.status(&idle);
        w["history"].to_string().contains("busy again").then_some(w)
    });
    assert!(back["runs"][0]["idle_since_unix"].is_null(), "{back}");
    assert_eq!(back["runs"][0]["gpu_util_pct"], 90, "{back}");
}
