//! The pages' bodies, from what the API answers (the same views the CLI prints):
//! pure functions of wire messages to HTML, so what a page shows is what
//! `allot share`, `allot queue`, `allot status` and `allot nodes` say. Numbers a
//! test reads carry `data-k` (what) and their row `data-group`, `data-id` or
//! `data-node` (whose).

use super::html::{columns, csrf_field, duration, esc, hours, pct, received_bar, time, url_part};
use allot_proto::names::{forecast_words as forecast, workload_state};
use allot_proto::v1 as pb;
use std::collections::BTreeMap;
use std::fmt::Write;

/// The org tree: each group's share, budget, what it received, its ratio, running
/// and pending GPUs; who waits below their share and who runs on others' idle share.
pub fn tree(t: &pb::GetTreeResponse) -> String {
    let capacity = if t.weighted_capacity_gpus > 0.0 {
        t.weighted_capacity_gpus
    } else {
        f64::from(t.capacity_gpus)
    };
    let mut b = format!(
        r#"<p class="summary"><span data-k="capacity">{}</span> GPUs ({} weighted), a window of <span data-k="window">{}</span> h, ratios over the last {} h with history.</p>"#,
        t.capacity_gpus,
        hours(capacity),
        hours(t.window_hours),
        hours(t.covered_hours)
    );
    let max = t
        .groups
        .iter()
        .map(|g| g.entitled_gpu_hours.max(g.served_gpu_hours))
        .fold(0.0_f64, f64::max);
    b.push_str(r#"<table class="tree"><thead><tr><th>Group</th><th>Weight</th><th>Share</th><th>Budget GPU-h</th><th>Received GPU-h</th><th></th><th>Ratio</th><th>Running GPUs</th><th>GPU use</th><th>Pending GPUs</th></tr></thead><tbody>"#);
    for g in &t.groups {
        let name = if g.project {
            format!(
                r#"<a href="/project/{}">{}</a>"#,
                url_part(&g.name),
                esc(&g.name)
            )
        } else {
            format!("<b>{}</b>", esc(&g.name))
        };
        let _ = write!(
            b,
            r#"<tr data-group="{n}" class="d{depth}"><td class="name">{name}</td><td class="num">{w}</td><td class="num" data-k="share">{share}</td><td class="num" data-k="entitled">{ent}</td><td class="num" data-k="served">{srv}</td><td>{bar}</td><td class="num {rc}" data-k="ratio">{ratio:.2}</td><td class="num" data-k="running">{run}</td><td class="num" data-k="util">{util}</td><td class="num" data-k="pending">{pend}</td></tr>"#,
            n = esc(&g.name),
            depth = g.depth.min(6),
            w = g.weight,
            share = pct(g.share),
            ent = hours(g.entitled_gpu_hours),
            srv = hours(g.served_gpu_hours),
            bar = received_bar(g.served_gpu_hours, g.entitled_gpu_hours, max),
            rc = ratio_class(g.ratio),
            ratio = g.ratio,
            run = g.running_gpus,
            pend = g.pending_gpus,
            util = g.gpu_util.map_or_else(|| "-".into(), pct),
        );
    }
    b.push_str("</tbody></table>");
    let starved: Vec<&pb::Group> = t
        .groups
        .iter()
        .filter(|g| g.project && g.pending_gpus > 0 && g.ratio < 1.0)
        .collect();
    let borrowing: Vec<&pb::Group> = t
        .groups
        .iter()
        .filter(|g| g.project && g.running_gpus > 0 && g.ratio > 1.0)
        .collect();
    let list = |gs: &[&pb::Group], what: &str| {
        if gs.is_empty() {
            format!("<li>none {what}</li>")
        } else {
            gs.iter()
                .map(|g| {
                    format!(
                        r#"<li><a href="/project/{}">{}</a>: ratio {:.2}, {} running, {} pending</li>"#,
                        url_part(&g.name),
                        esc(&g.name),
                        g.ratio,
                        g.running_gpus,
                        g.pending_gpus
                    )
                })
                .collect()
        }
    };
    let _ = write!(
        b,
        r#"<div class="cols"><section><h2>Waiting below their share</h2><ul id="starved">{}</ul></section><section><h2>Running on others' idle share</h2><ul id="borrowing">{}</ul></section></div>"#,
        list(&starved, "waits below its share"),
        list(&borrowing, "runs above its share")
    );
    b
}

fn ratio_class(r: f64) -> &'static str {
    if r < 0.9 {
        "below"
    } else if r > 1.1 {
        "over"
    } else {
        "even"
    }
}

fn spec(w: &pb::Workload) -> pb::WorkloadSpec {
    w.spec.clone().unwrap_or_default()
}

fn gpus(s: &pb::WorkloadSpec) -> u32 {
    s.gpus_per_node * s.nodes.max(1)
}

/// The first line of why a workload waits (the ranked reason).
fn first_reason(w: &pb::Workload) -> String {
    let why = if w.gate.is_empty() {
        w.explanation.lines().next().unwrap_or("").to_string()
    } else {
        format!("{}: {}", w.gate, w.explanation.lines().next().unwrap_or(""))
    };
    why
}

/// A project's queue: what waits (and why, and when it may start) and what runs.
pub fn queue(project: &str, ws: &[pb::Workload], now: i64) -> String {
    let mut live: Vec<&pb::Workload> = ws
        .iter()
        .filter(|w| {
            matches!(
                w.state(),
                pb::WorkloadState::Pending | pb::WorkloadState::Running
            )
        })
        .collect();
    live.sort_by_key(|w| (w.state() != pb::WorkloadState::Running, w.submit_unix));
    let pending = live
        .iter()
        .filter(|w| w.state() == pb::WorkloadState::Pending)
        .count();
    let running: u32 = live
        .iter()
        .filter(|w| w.state() == pb::WorkloadState::Running)
        .map(|w| gpus(&spec(w)))
        .sum();
    let mut b = format!(
        r#"<p class="summary">Project <b>{}</b>: <span data-k="running-gpus">{running}</span> GPUs running, <span data-k="pending">{pending}</span> workloads pending (those you may see).</p>"#,
        esc(project)
    );
    b.push_str(r#"<table class="queue"><thead><tr><th>ID</th><th>Name</th><th>User</th><th>State</th><th>GPUs</th><th>Submitted</th><th>For</th><th>Min runtime</th><th>May start</th><th>Why it waits / where it runs</th></tr></thead><tbody>"#);
    for w in &live {
        let s = spec(w);
        let since = if w.state() == pb::WorkloadState::Running {
            w.start_unix
        } else {
            w.submit_unix
        };
        let what = if w.state() == pb::WorkloadState::Running {
            format!("on {}", esc(&w.nodes.join(", ")))
        } else {
            esc(&first_reason(w))
        };
        let _ = write!(
            b,
            r#"<tr data-id="{id}"><td><a href="/workload/{uid}">{id}</a></td><td>{name}</td><td>{user}</td><td data-k="state" class="st-{st}">{st}</td><td class="num" data-k="gpus">{g}</td><td>{sub}</td><td>{for_}</td><td>{min}</td><td data-k="forecast">{fc}</td><td class="why">{what}</td></tr>"#,
            id = esc(&w.id),
            uid = url_part(&w.id),
            name = esc(&s.name),
            user = esc(&s.user),
            st = workload_state(w.state()),
            g = gpus(&s),
            sub = time(w.submit_unix),
            for_ = duration((now - since).max(0) as u64),
            min = duration(s.min_runtime_s.unwrap_or(0)),
            fc = forecast(w, now).unwrap_or_else(|| "-".into()),
        );
    }
    if live.is_empty() {
        b.push_str(
            r#"<tr><td colspan="10">Nothing pending or running that you may see.</td></tr>"#,
        );
    }
    b.push_str("</tbody></table>");
    b
}

/// One workload: its contract, state, why it waits, its runs (nodes, exit,
/// utilisation), the audit's lines about it, its output, and a cancel button for
/// those who may cancel it.
pub fn workload(w: &pb::Workload, may_cancel: Option<&str>, now: i64) -> String {
    let s = spec(w);
    let state = workload_state(w.state());
    let mut b = String::new();
    let _ = write!(
        b,
        r#"<dl class="facts" data-id="{id}"><dt>State</dt><dd data-k="state" class="st-{state}">{state}</dd><dt>Project</dt><dd><a href="/project/{up}">{p}</a></dd><dt>User</dt><dd data-k="user">{u}</dd><dt>Name</dt><dd>{n}</dd><dt>GPUs</dt><dd data-k="gpus">{g} ({gpn} × {nodes} nodes)</dd><dt>Min runtime</dt><dd>{min}</dd><dt>Time limit</dt><dd>{tl}</dd><dt>Submitted</dt><dd>{sub}</dd><dt>Preemptions</dt><dd>{pre}</dd>"#,
        id = esc(&w.id),
        up = url_part(&s.project),
        p = esc(&s.project),
        u = esc(&s.user),
        n = esc(&s.name),
        g = gpus(&s),
        gpn = s.gpus_per_node,
        nodes = s.nodes.max(1),
        min = duration(s.min_runtime_s.unwrap_or(0)),
        tl = s.time_limit_s.map_or("none".to_string(), duration),
        sub = time(w.submit_unix),
        pre = w.preemptions,
    );
    if w.state() == pb::WorkloadState::Running {
        let _ = write!(
            b,
            r#"<dt>Running on</dt><dd data-k="nodes">{}</dd><dt>For</dt><dd>{}</dd>"#,
            esc(&w.nodes.join(", ")),
            duration((now - w.start_unix).max(0) as u64)
        );
    }
    if !w.end_reason.is_empty() {
        let exit = match (w.exit_code, w.signal) {
            (Some(c), _) => format!(", exit {c}"),
            (None, Some(sig)) => format!(", signal {sig}"),
            _ => String::new(),
        };
        let _ = write!(
            b,
            r#"<dt>Last end</dt><dd data-k="end">{}{exit}</dd>"#,
            esc(&w.end_reason)
        );
    }
    b.push_str("</dl>");
    if let Some(f) = forecast(w, now) {
        let _ = write!(
            b,
            r#"<p class="forecast">May start: <b data-k="forecast">{}</b> (forecast at {})</p>"#,
            esc(&f),
            time(w.forecast_at_unix)
        );
    }
    if w.state() == pb::WorkloadState::Pending {
        let _ = write!(
            b,
            r#"<h2>Why it waits</h2><pre class="why" data-k="why">{}</pre>"#,
            esc(&w.explanation)
        );
    }
    if let Some(csrf) = may_cancel {
        let _ = write!(
            b,
            r#"<form method="post" action="/workload/{}/cancel" class="action">{}<button type="submit" id="cancel">Cancel this workload</button></form>"#,
            url_part(&w.id),
            csrf_field(csrf)
        );
    }
    b.push_str(r#"<h2>Runs</h2><table class="runs"><thead><tr><th>Run</th><th>Lease</th><th>Nodes</th><th>GPUs</th><th>Start</th><th>End</th><th>How it ended</th><th>GPU use</th></tr></thead><tbody>"#);
    for r in &w.runs {
        let ended = if r.end_unix == 0 {
            "running".to_string()
        } else {
            let exit = match (r.exit_code, r.signal) {
                (Some(c), _) => format!(" (exit {c})"),
                (None, Some(sig)) => format!(" (signal {sig})"),
                _ => String::new(),
            };
            format!("{}{exit} {}", esc(&r.end_reason), esc(&r.detail))
        };
        let _ = write!(
            b,
            r#"<tr data-run="{n}"><td>{n}</td><td>{l}</td><td>{nodes}</td><td class="num">{g}</td><td>{st}</td><td>{en}</td><td>{ended}</td><td data-k="util">{u}</td></tr>"#,
            n = r.number,
            l = esc(&r.lease_id),
            nodes = esc(&r.nodes.join(", ")),
            g = r.gpus,
            st = time(r.start_unix),
            en = time(r.end_unix),
            u = use_word(r, now),
        );
    }
    if w.runs.is_empty() {
        b.push_str(r#"<tr><td colspan="8">Not run yet.</td></tr>"#);
    }
    b.push_str("</tbody></table>");
    b.push_str(r#"<h2>History</h2><ol class="history">"#);
    for h in &w.history {
        let _ = write!(b, "<li>{}</li>", esc(h));
    }
    b.push_str("</ol>");
    let _ = write!(
        b,
        r#"<h2>Output</h2><pre id="log" class="log" data-log="/workload/{}/log" data-live="{}">(loading)</pre>"#,
        url_part(&w.id),
        u8::from(w.state() == pb::WorkloadState::Running)
    );
    b
}

/// A run's GPU use as its host last said it.
pub(super) fn use_word(r: &pb::Run, now: i64) -> String {
    match (r.gpu_util_pct, r.idle_since_unix) {
        (_, since) if since > 0 && r.end_unix == 0 => {
            format!(
                "idle for {} at {}%",
                duration((now - since).max(0) as u64),
                r.gpu_util_pct.unwrap_or(0)
            )
        }
        (Some(u), _) => format!("{u}%"),
        (None, _) => "-".into(),
    }
}

/// What the nodes page knows of a lease: its workload and its GPUs' use.
#[derive(Debug, Clone, Default)]
pub struct LeaseUse {
    /// The workload.
    pub workload: String,
    /// Its run's last use word.
    pub util: String,
}

/// Nodes and GPUs: state, agent, free GPUs, drains with their authors (and the
/// breaker's holds), each GPU's health and lease, and recent health events.
pub fn nodes(
    ns: &[pb::Node],
    leases: &BTreeMap<String, LeaseUse>,
    operator: Option<&str>,
) -> String {
    let mut by_state: BTreeMap<&str, u32> = BTreeMap::new();
    for n in ns {
        *by_state.entry(n.state.as_str()).or_default() += 1;
    }
    let mut b = String::from(r#"<p class="summary">"#);
    for s in ["ready", "draining", "drain-now", "down"] {
        let _ = write!(
            b,
            r#"<span class="st-{s}"><span data-k="{s}">{}</span> {s}</span> "#,
            by_state.get(s).copied().unwrap_or(0)
        );
    }
    let _ = write!(
        b,
        r#"· <span data-k="connected">{}</span> of {} agents connected · <span data-k="free-gpus">{}</span> of {} GPUs free</p>"#,
        ns.iter().filter(|n| n.connected).count(),
        ns.len(),
        ns.iter().map(|n| n.free_gpus).sum::<u32>(),
        ns.iter().map(|n| n.gpus).sum::<u32>()
    );
    b.push_str(r#"<table class="nodes"><thead><tr><th>Node</th><th>State</th><th>Agent</th><th>Type</th><th>Free</th><th>GPUs</th><th>Drains</th><th></th></tr></thead><tbody>"#);
    let mut events: Vec<(i64, String, u32, &pb::HealthReason)> = Vec::new();
    for n in ns {
        let mut cells = String::new();
        for g in &n.gpu_list {
            let st = match g.state() {
                pb::GpuState::Healthy => "healthy",
                pb::GpuState::Degraded => "degraded",
                pb::GpuState::Failed => "failed",
                pb::GpuState::Unspecified => "unknown",
            };
            let lease = leases.get(&g.lease_id);
            let title = format!(
                "GPU {} {} {} {st}{}{}",
                g.index,
                g.uuid,
                g.pci,
                lease.map_or(String::new(), |l| format!(
                    " · workload {} · {}",
                    l.workload, l.util
                )),
                g.reasons
                    .iter()
                    .map(|r| format!(" · {}: {}", r.signal, r.detail))
                    .collect::<String>()
            );
            let _ = write!(
                cells,
                r#"<span class="gpu {st}{busy}" data-gpu="{i}" title="{t}">{i}</span>"#,
                busy = if g.lease_id.is_empty() { "" } else { " leased" },
                i = g.index,
                t = esc(&title)
            );
            for r in &g.reasons {
                events.push((r.since_unix, n.name.clone(), g.index, r));
            }
        }
        let drains: String = n
            .drains
            .iter()
            .map(|d| {
                format!(
                    "<li>{}{} by {} ({}){}: {}</li>",
                    if d.now { "now " } else { "" },
                    esc(&d.by),
                    esc(&d.author),
                    time(d.since_unix),
                    if d.held {
                        r#" <b class="held">held by the breaker</b>"#
                    } else {
                        ""
                    },
                    esc(&d.reason)
                )
            })
            .collect();
        let action = match operator {
            Some(csrf) if n.drains.iter().any(|d| d.by == "cluster-operator") => format!(
                r#"<form method="post" action="/nodes/{}/undrain" class="inline">{}<button type="submit">Undrain</button></form>"#,
                url_part(&n.name),
                csrf_field(csrf)
            ),
            Some(csrf) => format!(
                r#"<form method="post" action="/nodes/{}/drain" class="inline">{}<input name="reason" placeholder="reason" required maxlength="200"><button type="submit">Drain</button></form>"#,
                url_part(&n.name),
                csrf_field(csrf)
            ),
            None => String::new(),
        };
        let _ = write!(
            b,
            r#"<tr data-node="{name}"><td>{name}</td><td data-k="state" class="st-{st}">{st}</td><td data-k="agent">{agent}</td><td>{ty}</td><td class="num" data-k="free">{free}/{all}</td><td class="gpus">{cells}</td><td><ul class="drains">{drains}</ul></td><td>{action}</td></tr>"#,
            name = esc(&n.name),
            st = esc(&n.state),
            agent = if n.connected {
                "connected".to_string()
            } else {
                format!("silent since {}", time(n.last_seen_unix))
            },
            ty = esc(&n.gpu_type),
            free = n.free_gpus,
            all = n.gpus,
        );
    }
    b.push_str("</tbody></table>");
    events.sort_by_key(|e| std::cmp::Reverse(e.0));
    b.push_str(r#"<h2>Health events</h2><table class="events"><thead><tr><th>Since</th><th>Node</th><th>GPU</th><th>Signal</th><th>What it means</th><th>Action</th></tr></thead><tbody>"#);
    for (since, node, gpu, r) in events.iter().take(200) {
        let _ = write!(
            b,
            r#"<tr><td>{}</td><td>{}</td><td>{gpu}</td><td data-k="signal">{}</td><td>{}</td><td>{}</td></tr>"#,
            time(*since),
            esc(node),
            esc(&r.signal),
            esc(&r.detail),
            esc(if r.action.is_empty() { "-" } else { &r.action })
        );
    }
    if events.is_empty() {
        b.push_str(r#"<tr><td colspan="6">No GPU reports a health condition.</td></tr>"#);
    }
    b.push_str("</tbody></table>");
    b
}

/// Usage over time: GPU-hours a day per team, and each team's totals against
/// what it was entitled to.
pub fn usage(u: &pb::UsageResponse, by: &str) -> String {
    let mut keys: Vec<(String, f64)> = Vec::new();
    for r in &u.rows {
        match keys.iter_mut().find(|(k, _)| *k == r.key) {
            Some(k) => k.1 += r.gpu_hours,
            None => keys.push((r.key.clone(), r.gpu_hours)),
        }
    }
    keys.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    // Eight colours: the biggest seven by name, the rest as "other".
    let named: Vec<String> = keys.iter().take(7).map(|(k, _)| k.clone()).collect();
    let mut legend = named.clone();
    if keys.len() > 7 {
        legend.push("other".into());
    }
    let mut periods: BTreeMap<i64, BTreeMap<usize, f64>> = BTreeMap::new();
    let mut day = u.since_unix.div_euclid(86_400) * 86_400;
    while day < u.until_unix {
        periods.entry(day).or_default();
        day += 86_400;
    }
    for r in &u.rows {
        let k = named.iter().position(|n| *n == r.key).unwrap_or(7);
        *periods
            .entry(r.period_unix)
            .or_default()
            .entry(k)
            .or_default() += r.gpu_hours;
    }
    let cols: Vec<(String, Vec<(usize, f64)>)> = periods
        .into_iter()
        .map(|(p, parts)| (super::html::date(p), parts.into_iter().collect()))
        .collect();
    let mut b = format!(
        r#"<p class="summary">GPU-hours received a day by {} from {} to {} (UTC).</p>{}"#,
        esc(by),
        time(u.since_unix),
        time(u.until_unix),
        columns(&cols, &legend)
    );
    let mut totals: BTreeMap<&str, (f64, f64, f64, u32)> = BTreeMap::new();
    for r in &u.rows {
        let t = totals.entry(r.key.as_str()).or_default();
        t.0 += r.gpu_hours;
        t.1 += r.entitled_gpu_hours;
        t.2 += r.preempted_gpu_hours + r.lost_gpu_hours;
        t.3 += r.runs;
    }
    b.push_str(r#"<table class="usage"><thead><tr><th>Team</th><th>Received GPU-h</th><th>Entitled GPU-h</th><th>Received / entitled</th><th>Lost to preemption or failure</th><th>Runs</th></tr></thead><tbody>"#);
    for (k, (got, ent, lost, runs)) in &totals {
        let _ = write!(
            b,
            r#"<tr data-group="{k}"><td>{k}</td><td class="num" data-k="received">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{runs}</td></tr>"#,
            hours(*got),
            hours(*ent),
            if *ent > 0.0 {
                pct(got / ent)
            } else {
                "-".into()
            },
            hours(*lost),
            k = esc(k),
        );
    }
    if totals.is_empty() {
        b.push_str(r#"<tr><td colspan="6">No runs in this window that you may see.</td></tr>"#);
    }
    b.push_str("</tbody></table>");
    b
}

/// The login form, with the login's own CSRF secret and the last error.
pub fn login(csrf: &str, error: Option<&str>) -> String {
    format!(
        r#"{}<form method="post" action="/login" class="login">{}<label>Token <input type="password" name="token" autocomplete="off" required maxlength="200" autofocus></label><button type="submit" id="login">Log in</button></form><p class="hint">A token from <code>allotd tokens create --user NAME</code> (what <code>allot</code> uses as <code>ALLOT_TOKEN</code>). The browser keeps a session cookie, never the token.</p>"#,
        error.map_or(String::new(), |e| format!(
            r#"<p class="error" id="error">{}</p>"#,
            esc(e)
        )),
        csrf_field(csrf)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(name: &str, project: bool, ratio: f64, running: u32, pending: u32) -> pb::Group {
        pb::Group {
            name: name.into(),
            project,
            ratio,
            running_gpus: running,
            pending_gpus: pending,
            depth: 1,
            entitled_gpu_hours: 100.0,
            served_gpu_hours: 100.0 * ratio,
            ..Default::default()
        }
    }

    #[test]
    fn the_tree_names_who_waits_below_its_share_and_who_borrows() {
        let t = pb::GetTreeResponse {
            groups: vec![
                group("<vision>", true, 0.4, 1, 3),
                group("nlp", true, 1.8, 6, 0),
                group("idle", true, 0.1, 0, 0),
            ],
            capacity_gpus: 8,
            ..Default::default()
        };
        let html = tree(&t);
        let starved = &html[html.find(r#"id="starved""#).expect("list")..];
        assert!(starved.contains("&lt;vision&gt;"), "{html}");
        assert!(!html.contains("<vision>"), "escaped: {html}");
        let borrowing = &html[html.find(r#"id="borrowing""#).expect("list")..];
        assert!(borrowing.contains(">nlp</a>"), "{html}");
        assert!(!borrowing.contains("idle"), "{html}");
        assert!(
            html.contains(r#"data-k="running">6</td>"#),
            "running GPUs shown: {html}"
        );
    }

    #[test]
    fn a_pending_workload_shows_why_and_a_cancel_button_only_when_allowed() {
        let w = pb::Workload {
            id: "12".into(),
            state: pb::WorkloadState::Pending as i32,
            explanation: "quota: <b>vision</b> is over its budget\nmore".into(),
            spec: Some(pb::WorkloadSpec {
                project: "vision".into(),
                user: "ana".into(),
                gpus_per_node: 2,
                nodes: 2,
                ..Default::default()
            }),
            ..Default::default()
        };
        let with = workload(&w, Some("csrf_1"), 0);
        assert!(with.contains(r#"action="/workload/12/cancel""#), "{with}");
        assert!(with.contains(r#"value="csrf_1""#), "{with}");
        assert!(with.contains("&lt;b&gt;vision&lt;/b&gt;"), "{with}");
        assert!(with.contains(r#"data-k="gpus">4 "#), "{with}");
        let without = workload(&w, None, 0);
        assert!(!without.contains("/cancel"), "{without}");
        let q = queue("vision", &[w], 100);
        assert!(q.contains(r#"data-k="pending">1<"#), "{q}");
        assert!(q.contains("quota: &lt;b&gt;vision"), "{q}");
    }

    #[test]
    fn usage_columns_cover_every_day_of_the_window() {
        let u = pb::UsageResponse {
            rows: vec![pb::UsageRow {
                period_unix: 86_400,
                key: "lab".into(),
                gpu_hours: 10.0,
                entitled_gpu_hours: 20.0,
                runs: 2,
                ..Default::default()
            }],
            since_unix: 0,
            until_unix: 3 * 86_400,
        };
        let html = usage(&u, "team");
        assert_eq!(html.matches("<rect").count(), 1, "{html}");
        assert!(html.contains(r#"data-k="received">10.0"#), "{html}");
        assert!(html.contains("50.0%"), "{html}");
    }
}
