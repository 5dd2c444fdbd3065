//! allotd's pages in headless Chromium, against a dev cluster with real work: the
//! login (a bad token refused, a good one exchanged for a session cookie), every
//! page loading with no error of the page's own, showing what the API and `allot`
//! report (read from the DOM), a cancel through the page, a form without its CSRF
//! secret changing nothing, and another user refused a workload that is not theirs
//! and a drain they have no right to, in the API's words. A screenshot of each
//! page at 1280×800 is left under `target/web-screenshots/`. Under `CI=true` a
//! missing Chromium fails the test.

mod support;

use allot_test_support::chromium::Browser;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;
use support::{wait_for, Cluster};

const LONG: Duration = Duration::from_secs(120);
const ORG: &str = "[[group]]\nname = \"lab\"\nweight = 1\n[[group]]\nname = \"vision\"\nparent = \"lab\"\nweight = 2\n[[group]]\nname = \"nlp\"\nparent = \"lab\"\nweight = 1\nmembers = [\"bob\"]\n";

fn shots() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/web-screenshots")
}

/// Logs in with `token` from the login page; true when a session came of it.
fn log_in(b: &mut Browser, base: &str, token: &str) {
    b.goto(&format!("{base}/login"));
    b.navigate_by(&format!(
        "document.querySelector('input[name=token]').value = {}; document.querySelector('form.login').submit()",
        serde_json::json!(token)
    ));
}

/// The page's errors, less the browser's own line about a status the test asked for.
fn page_errors(b: &mut Browser, expected_status: Option<u16>) -> Vec<String> {
    b.take_errors()
        .into_iter()
        .filter(|e| expected_status.is_none_or(|s| !e.contains(&format!("status of {s}"))))
        .collect()
}

fn group<'a>(tree: &'a Value, name: &str) -> &'a Value {
    tree["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .find(|g| g["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {tree}"))
}

#[test]
fn every_page_loads_clean_shows_what_the_api_says_and_refuses_what_the_role_does_not_allow() {
    let dir = std::env::temp_dir().join(format!("allot-web-{}", std::process::id()));
    let Some(mut b) = Browser::start(&dir) else {
        return;
    };
    let c = Cluster::start_metered("web", ORG, 2, 2);
    let base = format!("http://{}", c.metrics);
    let out = c.allotd(&["tokens", "create", "--user", "bob"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bob = String::from_utf8_lossy(&out.stdout).trim().to_string();
    // Real work: two runs in vision (3 of 4 GPUs) and a gang that must wait.
    let talker = c.submit(
        &["--project", "vision", "--gpus", "2", "--name", "talker"],
        "echo hello-from-the-web-test; sleep 600",
    );
    let quiet = c.submit(&["--project", "vision", "--gpus", "1"], "sleep 600");
    c.wait_state(&talker, "running", LONG);
    c.wait_state(&quiet, "running", LONG);
    let gang = c.submit(
        &["--project", "vision", "--gpus", "2", "--nodes", "2"],
        "sleep 600",
    );
    wait_for("the gang explained and forecast", LONG, || {
        let s = c.status(&gang);
        (s["state"] == "pending"
            && !s["explanation"].as_str().unwrap_or("").is_empty()
            && !s["forecast"].is_null())
        .then_some(())
    });
    // Behind two runs without a time limit: about hours away, at most days.
    let f = c.status(&gang)["forecast"].clone();
    let (p50, p90) = (
        f["p50_unix"].as_i64().unwrap_or(0),
        f["p90_unix"].as_i64().unwrap_or(0),
    );
    assert!(
        p50 > f["at_unix"].as_i64().unwrap_or(0) && p90 >= p50,
        "{f}"
    );

    // Not logged in: the login page; a bad token is refused in the API's words.
    b.goto(&format!("{base}/"));
    assert_eq!(b.eval("location.pathname"), "/login");
    assert!(page_errors(&mut b, None).is_empty());
    b.screenshot(&shots().join("login.png"));
    log_in(&mut b, &base, "allot_not-a-token");
    let error = b.text("#error").expect("an error");
    assert!(error.contains("not a token of this allotd"), "{error}");
    assert_eq!(b.eval("location.pathname"), "/login");
    assert!(page_errors(&mut b, Some(401)).is_empty());

    // The hosts have said how busy vision's GPUs are (the fake's 40 + i %).
    let util = wait_for("vision's GPU use in allot share", LONG, || {
        group(&c.json(&["share", "--json"]), "vision")["gpu_util"].as_f64()
    });
    assert!((0.39..0.45).contains(&util), "{util}");

    // The admin: every page, clean, with the API's numbers.
    log_in(&mut b, &base, &c.token);
    assert_eq!(b.eval("location.pathname"), "/", "logged in, at the tree");
    assert_eq!(
        b.eval("document.cookie"),
        "",
        "the session cookie is HttpOnly: no script reads it"
    );
    let tree = c.json(&["share", "--json"]);
    for name in ["lab", "vision", "nlp"] {
        let g = group(&tree, name);
        for k in ["running", "pending"] {
            assert_eq!(
                b.text(&format!("tr[data-group='{name}'] [data-k='{k}']")),
                Some(g[format!("{k}_gpus")].to_string()),
                "{name} {k}"
            );
        }
    }
    assert_eq!(b.text("[data-k='capacity']").as_deref(), Some("4"));
    assert_eq!(
        b.text("tr[data-group='vision'] [data-k='util']"),
        Some(format!("{:.1}%", util * 100.0))
    );
    let starved = b.text("#starved").unwrap_or_default();
    assert!(
        starved.contains("none") || starved.contains("vision"),
        "{starved}"
    );
    assert!(page_errors(&mut b, None).is_empty(), "tree");
    b.screenshot(&shots().join("tree.png"));

    b.goto(&format!("{base}/project/vision"));
    let queue = c.json(&["queue", "--project", "vision", "--json"]);
    let running: u64 = queue
        .as_array()
        .expect("a list")
        .iter()
        .filter(|w| w["state"] == "running")
        .map(|w| w["gpus_per_node"].as_u64().unwrap_or(0) * w["nodes"].as_u64().unwrap_or(1))
        .sum();
    assert_eq!(running, 3);
    assert_eq!(b.text("[data-k='running-gpus']"), Some(running.to_string()));
    assert_eq!(
        b.text(&format!("tr[data-id='{gang}'] [data-k='state']"))
            .as_deref(),
        Some("pending")
    );
    let why = b
        .text(&format!("tr[data-id='{gang}'] .why"))
        .unwrap_or_default();
    let cli_why = c.status(&gang)["explanation"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        !why.is_empty() && cli_why.contains(why.trim()),
        "the page's reason {why:?} is the CLI's {cli_why:?}"
    );
    let start = b
        .text(&format!("tr[data-id='{gang}'] [data-k='forecast']"))
        .unwrap_or_default();
    assert!(
        start.starts_with("about "),
        "the forecast on the page: {start}"
    );
    assert!(page_errors(&mut b, None).is_empty(), "queue");
    b.screenshot(&shots().join("queue.png"));

    b.goto(&format!("{base}/workload/{talker}"));
    assert_eq!(b.text("[data-k='state']").as_deref(), Some("running"));
    let on = c.status(&talker)["node_names"].as_array().map(|n| {
        n.iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    });
    assert_eq!(b.text("[data-k='nodes']"), on);
    wait_for("the run's output on the page", LONG, || {
        b.text("#log")
            .filter(|t| t.contains("hello-from-the-web-test"))
    });
    assert!(
        b.eval("document.querySelectorAll('ol.history li').length")
            .as_u64()
            .unwrap_or(0)
            >= 1,
        "the audit's lines"
    );
    assert!(page_errors(&mut b, None).is_empty(), "workload");
    b.screenshot(&shots().join("workload.png"));

    b.goto(&format!("{base}/nodes"));
    let nodes = c.json(&["nodes", "--json"]);
    let free: u64 = nodes
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["free_gpus"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(b.text("[data-k='free-gpus']"), Some(free.to_string()));
    assert_eq!(b.text("[data-k='ready']").as_deref(), Some("2"));
    assert_eq!(b.text("[data-k='connected']").as_deref(), Some("2"));
    assert!(
        b.eval("document.querySelectorAll('.gpu.leased').length")
            .as_u64()
            == Some(3),
        "three GPUs leased"
    );
    assert!(page_errors(&mut b, None).is_empty(), "nodes");
    b.screenshot(&shots().join("nodes.png"));

    b.goto(&format!("{base}/usage"));
    assert!(b.text("table.usage").is_some());
    assert!(b.eval("document.querySelectorAll('svg.columns').length") == 1);
    assert!(page_errors(&mut b, None).is_empty(), "usage");
    b.screenshot(&shots().join("usage.png"));

    // A form without the session's CSRF secret changes nothing.
    let status = b.eval(&format!(
        "fetch('/workload/{gang}/cancel', {{method: 'POST', body: new URLSearchParams({{csrf: 'forged'}})}}).then(r => r.status)"
    ));
    assert_eq!(status, 403);
    assert_eq!(
        c.status(&gang)["state"],
        "pending",
        "a forged form cancels nothing"
    );
    let _ = b.take_errors();
    // The cancel button does what `allot cancel` does.
    b.goto(&format!("{base}/workload/{quiet}"));
    b.navigate_by("document.getElementById('cancel').click()");
    wait_for("cancelled through the page", LONG, || {
        (c.status(&quiet)["state"] == "cancelled").then_some(())
    });
    assert!(page_errors(&mut b, None).is_empty(), "after cancel");
    b.navigate_by("document.querySelector('nav form button').click()");
    assert_eq!(b.eval("location.pathname"), "/login", "logged out");

    // bob, a member of nlp only: the tree, but not vision's work, and no drain.
    log_in(&mut b, &base, &bob);
    assert_eq!(b.eval("location.pathname"), "/");
    assert!(page_errors(&mut b, None).is_empty());
    b.goto(&format!("{base}/workload/{talker}"));
    let refusal = b.text("#error").expect("refused");
    assert!(
        refusal.contains(&format!("workload {talker}")) && refusal.contains("bob"),
        "the refusal names the right: {refusal}"
    );
    assert!(page_errors(&mut b, Some(403)).is_empty());
    b.screenshot(&shots().join("refused.png"));
    b.goto(&format!("{base}/project/vision"));
    assert_eq!(
        b.text("[data-k='pending']").as_deref(),
        Some("0"),
        "none of it is bob's"
    );
    assert!(b.text(&format!("tr[data-id='{gang}']")).is_none());
    b.goto(&format!("{base}/nodes"));
    assert_eq!(
        b.eval("document.querySelectorAll('form[action$=\"/drain\"]').length"),
        0,
        "no drain button for a user"
    );
    let node = Cluster::node_name(0);
    let answer = b.eval(&format!(
        "fetch('/nodes/{node}/drain', {{method: 'POST', body: new URLSearchParams({{csrf: document.querySelector('input[name=csrf]').value, reason: 'bob'}})}}).then(async r => r.status + ' ' + await r.text())"
    ));
    let answer = answer.as_str().unwrap_or("").to_string();
    assert!(
        answer.starts_with("403 ") && answer.contains("operator"),
        "a drain without the right is refused naming it: {answer}"
    );
    let n0 = c.json(&["nodes", "--json"]);
    assert!(
        n0.as_array()
            .expect("nodes")
            .iter()
            .all(|n| n["state"] == "ready"),
        "{n0}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
