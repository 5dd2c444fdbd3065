//! What the local commands print: lease tables, GPU lists, drain states, as text for
//! people and JSON for scripts.

use crate::duration::{age, ms_to_secs_ceil};
use crate::health_view::{drain_info_json, drain_line, gpu_json, gpu_state, verdict};
use crate::table::{self, or_dash};
use allot_proto::v1::{DrainInfo, DrainResponse, Gpu, Lease, LeaseState, ListGpusResponse};
use serde_json::{json, Value};

pub(super) fn gpu_list(uuids: &[String]) -> String {
    if uuids.is_empty() {
        "(none)".into()
    } else {
        uuids.join(", ")
    }
}

/// How many GPUs an events cell names in full before it counts the rest.
const GPUS_SHOWN: usize = 2;

/// An event's GPUs for a table cell: UUIDs cut to their first group and at most
/// [`GPUS_SHOWN`] of them, `GPU-1a2b3c4d…,GPU-5e6f7a8b…,+6`; `--json` has them whole.
///
/// A lease's event lists every GPU UUID (41 characters each), and one such cell
/// would otherwise widen every row of the table to hundreds of columns.
pub(super) fn gpu_cell(gpus: &str) -> String {
    let items: Vec<&str> = gpus
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .collect();
    if items.is_empty() {
        return "-".into();
    }
    let short = |g: &str| -> String {
        // `GPU-` and the UUID's first group of 8 hex digits tell a host's GPUs apart.
        const KEEP: usize = "GPU-".len() + 8;
        if g.starts_with("GPU-") && g.chars().count() > KEEP + 1 {
            format!("{}…", g.chars().take(KEEP).collect::<String>())
        } else {
            g.to_string()
        }
    };
    let mut cell: Vec<String> = items.iter().take(GPUS_SHOWN).map(|g| short(g)).collect();
    if items.len() > GPUS_SHOWN {
        cell.push(format!("+{}", items.len() - GPUS_SHOWN));
    }
    cell.join(",")
}

pub(super) fn lease_state(s: LeaseState) -> &'static str {
    match s {
        LeaseState::Starting => "starting",
        LeaseState::Running => "running",
        LeaseState::Revoking => "revoking",
        LeaseState::Checkpointing => "checkpointing",
        LeaseState::Ended => "ended",
        LeaseState::Unspecified => "unknown",
    }
}

/// A lease as JSON; the generated types do not derive `Serialize`.
pub(super) fn lease_json(l: &Lease) -> Value {
    json!({
        "id": l.id,
        "workload_id": l.workload_id,
        "gpu_uuids": l.gpu_uuids,
        "pid": l.pid,
        "user": l.user,
        "state": lease_state(l.state()),
        "adopted": l.adopted,
        "start_unix_ms": l.start_unix_ms,
        "min_runtime_s": l.min_runtime_s,
        "time_limit_s": l.time_limit_s,
        "checkpoint_hook": l.checkpoint_hook,
        "grace_s": l.grace_s,
        "not_before_unix": l.not_before_unix,
        "revoke_why": l.revoke_why,
        "ended_by": l.ended_by,
        "end_reason": l.end_reason,
        "exit_code": l.exit_code,
        "end_detail": l.end_detail,
        "cgroup": l.cgroup,
        "ended_unix": l.ended_unix,
        "steps": l.steps.iter().map(|s| json!({
            "rung": s.rung,
            "took_ms": s.took_ms,
            "note": s.note,
        })).collect::<Vec<_>>(),
        "cpu_pct": l.cpu_pct,
        "rss_bytes": l.rss_bytes,
        "idle_since_unix": (l.idle_since_unix > 0).then_some(l.idle_since_unix),
        "gpu_util_pct": l.gpu_util_pct,
    })
}

/// Start in milliseconds; an agent that only filled in seconds still gets ages.
pub(super) fn start_ms(l: &Lease) -> i64 {
    if l.start_unix_ms != 0 {
        l.start_unix_ms
    } else {
        l.start_unix.saturating_mul(1_000)
    }
}

pub(super) fn leases_table(leases: &[Lease], now_ms: i64) -> String {
    let rows: Vec<Vec<String>> = leases
        .iter()
        .map(|l| {
            let ended = l.state() == LeaseState::Ended;
            let start = start_ms(l);
            let started = if start == 0 {
                "-".into()
            } else {
                age(ms_to_secs_ceil(now_ms - start))
            };
            let protected_until = start.saturating_add(
                i64::try_from(l.min_runtime_s.saturating_mul(1_000)).unwrap_or(i64::MAX),
            );
            let protected = if ended {
                "-".into()
            } else if protected_until > now_ms {
                age(ms_to_secs_ceil(protected_until - now_ms))
            } else {
                "lapsed".into()
            };
            let (cpu, rss) = if ended {
                ("-".into(), "-".into())
            } else {
                (format!("{:.0}", l.cpu_pct), table::bytes(l.rss_bytes))
            };
            let end = if ended {
                let mut e = format!("{}/{}", or_dash(&l.ended_by), or_dash(&l.end_reason));
                if !l.end_detail.is_empty() {
                    e.push_str(&format!(" ({})", l.end_detail));
                } else if let Some(code) = l.exit_code {
                    e.push_str(&format!(" (exit {code})"));
                }
                e
            } else {
                "-".into()
            };
            vec![
                l.id.clone(),
                or_dash(&l.workload_id),
                lease_state(l.state()).into(),
                l.gpu_uuids.len().to_string(),
                if l.pid == 0 {
                    "-".into()
                } else {
                    l.pid.to_string()
                },
                or_dash(&l.user),
                started,
                protected,
                cpu,
                rss,
                end,
            ]
        })
        .collect();
    table::render(
        &[
            "ID",
            "WORKLOAD",
            "STATE",
            "GPUS",
            "PID",
            "USER",
            "STARTED",
            "PROTECTED",
            "CPU%",
            "RSS",
            "END",
        ],
        &rows,
    )
}

pub(super) fn drain_json(d: &DrainResponse) -> Value {
    json!({
        "draining": d.draining,
        "reason": d.reason,
        "now": d.now,
        "by": d.by,
        "drains": d.drains.iter().map(drain_info_json).collect::<Vec<_>>(),
    })
}

/// `operator: "rack maintenance", at min-runtime lapse`, for an agent that sends no
/// list of drains.
pub(super) fn legacy_drain_detail(d: &DrainResponse) -> String {
    let when = if d.now {
        "at once"
    } else {
        "at min-runtime lapse"
    };
    format!("{}: \"{}\", {when}", or_dash(&d.by), d.reason)
}

/// `allot drain` and `allot undrain`: the host's drain state, then each drain.
pub(super) fn drain_text(d: &DrainResponse, undrain: bool) -> String {
    if d.drains.is_empty() {
        return if d.draining {
            format!("host: draining ({})\n", legacy_drain_detail(d))
        } else {
            "host: not draining\n".into()
        };
    }
    let mut out = match (d.draining, undrain) {
        (true, true) => "host: still draining\n",
        (true, false) => "host: draining\n",
        (false, _) => "host: not draining\n",
    }
    .to_string();
    for x in &d.drains {
        out.push_str(&format!("  {}\n", drain_line(x)));
    }
    if d.draining && undrain {
        out.push_str(&format!("{}\n", undrain_hint(&d.drains)));
    }
    out
}

/// What lifts the drains an `allot undrain` left in place.
pub(super) fn undrain_hint(drains: &[DrainInfo]) -> String {
    use allot_common::drain::DrainAuthor;
    let kinds = |k: DrainAuthor| drains.iter().any(|d| d.by == k.as_str() && !d.held);
    let mut how = vec!["undrain lifts only this host's operator drain".to_string()];
    if kinds(DrainAuthor::ClusterOperator) {
        how.push("a cluster operator's lifts with `allot nodes undrain HOST`".into());
    }
    if kinds(DrainAuthor::Health) {
        how.push("a health drain lifts when the GPUs are healthy again (`allot gpus clear INDEX --reason TEXT` after a reset)".into());
    }
    how.join("; ")
}

pub(super) fn gpus_json(r: &ListGpusResponse) -> Value {
    let drain = r.drain.clone().unwrap_or_default();
    json!({
        "verdict": verdict(r.verdict()),
        "host": r.host,
        "cpus": r.cpus,
        "memory_bytes": r.memory_bytes,
        "no_cgroups": r.no_cgroups,
        "drain": drain_json(&drain),
        "gpus": r.gpus.iter().map(gpu_json).collect::<Vec<_>>(),
    })
}

/// A GPU's health reasons for one cell: `xid:94: contained ECC error; row-remap-pending`.
pub(super) fn reasons_text(g: &Gpu) -> String {
    let reasons: Vec<String> = g
        .reasons
        .iter()
        .map(|x| {
            if x.detail.is_empty() {
                x.signal.clone()
            } else {
                format!("{}: {}", x.signal, x.detail)
            }
        })
        .collect();
    reasons.join("; ")
}

pub(super) fn gpus_text(r: &ListGpusResponse) -> String {
    let drain = r.drain.clone().unwrap_or_default();
    let mut out = format!("host: {}", verdict(r.verdict()));
    if drain.drains.is_empty() && drain.draining {
        out.push_str(&format!(" ({})", legacy_drain_detail(&drain)));
    }
    for d in &drain.drains {
        out.push_str(&format!("\n  {}", drain_line(d)));
    }
    if !r.host.is_empty() {
        out.push_str(&format!(
            "\n{}: {} CPUs, {} memory",
            r.host,
            r.cpus,
            table::bytes(r.memory_bytes)
        ));
    }
    if !r.no_cgroups.is_empty() {
        out.push_str(&format!(
            "\nno cgroups for leases ({}): a workload is its process group, and a process that leaves it outlives the lease",
            r.no_cgroups
        ));
    }
    out.push('\n');
    let rows: Vec<Vec<String>> = r
        .gpus
        .iter()
        .map(|g| {
            vec![
                g.index.to_string(),
                g.uuid.clone(),
                or_dash(&g.pci),
                or_dash(&g.model),
                gpu_state(g.state()).into(),
                or_dash(&g.lease_id),
                or_dash(&reasons_text(g)),
            ]
        })
        .collect();
    out.push_str(&table::render(
        &["INDEX", "UUID", "PCI", "MODEL", "STATE", "LEASE", "REASONS"],
        &rows,
    ));
    out
}

/// One GPU after `allot gpus clear`: `GPU 3 (GPU-…, 0000:3b:00): healthy`, then what
/// is still wrong with it, if anything.
pub(super) fn gpu_text(g: &Gpu) -> String {
    let mut out = format!(
        "GPU {} ({}, {}): {}\n",
        g.index,
        or_dash(&g.uuid),
        or_dash(&g.pci),
        gpu_state(g.state())
    );
    if !g.reasons.is_empty() {
        out.push_str(&format!("  still: {}\n", reasons_text(g)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use allot_proto::v1::{GpuState, HealthReason, HostVerdict, LeaseStep};

    fn lease() -> Lease {
        Lease {
            id: "L-7".into(),
            workload_id: "W-7".into(),
            gpu_uuids: vec!["GPU-a".into(), "GPU-b".into()],
            start_unix_ms: 1_000_000,
            min_runtime_s: 600,
            state: LeaseState::Running as i32,
            pid: 4242,
            cpu_pct: 187.4,
            rss_bytes: 1_288_490_189,
            user: "ana".into(),
            checkpoint_hook: "signal:USR1".into(),
            grace_s: 120,
            ..Default::default()
        }
    }

    #[test]
    fn lease_table_shows_workload_age_protection_and_usage() {
        let t = leases_table(&[lease()], 1_000_000 + 192_000);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].starts_with("ID   WORKLOAD  STATE    GPUS  PID   USER"),
            "{t}"
        );
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            cells,
            ["L-7", "W-7", "running", "2", "4242", "ana", "3m12s", "6m48s", "187", "1.2G", "-"]
        );
        let lapsed = leases_table(&[lease()], 1_000_000 + 601_000);
        assert!(lapsed.contains("lapsed"), "{lapsed}");
    }

    #[test]
    fn ended_leases_say_how_they_ended() {
        let mut l = lease();
        l.state = LeaseState::Ended as i32;
        l.ended_by = "term".into();
        l.end_reason = "revoked".into();
        l.exit_code = Some(143);
        let t = leases_table(&[l], 2_000_000);
        assert!(t.contains("term/revoked (exit 143)"), "{t}");
        assert!(!t.contains("lapsed"), "{t}");
    }

    #[test]
    fn lease_json_has_the_documented_fields() {
        let mut l = lease();
        l.steps = vec![LeaseStep {
            rung: "checkpoint".into(),
            took_ms: 1_500,
            note: "marker".into(),
        }];
        let v = lease_json(&l);
        assert_eq!(v["id"], "L-7");
        assert_eq!(v["state"], "running");
        assert_eq!(v["time_limit_s"], Value::Null);
        assert_eq!(v["exit_code"], Value::Null);
        assert_eq!(v["steps"][0]["rung"], "checkpoint");
        assert_eq!(v["rss_bytes"], 1_288_490_189_u64);
        for k in [
            "workload_id",
            "gpu_uuids",
            "pid",
            "user",
            "adopted",
            "start_unix_ms",
            "min_runtime_s",
            "checkpoint_hook",
            "grace_s",
            "not_before_unix",
            "revoke_why",
            "ended_by",
            "end_reason",
            "end_detail",
            "cgroup",
            "ended_unix",
            "cpu_pct",
            "idle_since_unix",
            "gpu_util_pct",
        ] {
            assert!(v.get(k).is_some(), "missing {k}");
        }
    }

    fn gpus() -> ListGpusResponse {
        ListGpusResponse {
            verdict: HostVerdict::Drain as i32,
            drain: Some(DrainResponse {
                draining: true,
                reason: "rack maintenance".into(),
                now: false,
                by: "operator".into(),
                drains: vec![],
            }),
            gpus: vec![Gpu {
                uuid: "GPU-a".into(),
                index: 0,
                pci: "0000:3b:00".into(),
                model: "H100".into(),
                state: GpuState::Degraded as i32,
                reasons: vec![
                    HealthReason {
                        signal: "xid:94".into(),
                        detail: "contained ECC error".into(),
                        action: "drain-now".into(),
                        ..Default::default()
                    },
                    HealthReason {
                        signal: "row-remap-pending".into(),
                        ..Default::default()
                    },
                ],
                lease_id: "L-7".into(),
            }],
            ..Default::default()
        }
    }

    fn drains() -> Vec<DrainInfo> {
        vec![
            DrainInfo {
                by: "health".into(),
                author: "health monitor".into(),
                reason: "xid:79 on 0000:3b:00".into(),
                now: true,
                since_unix: 1_795_980_000,
                held: false,
            },
            DrainInfo {
                by: "local-operator".into(),
                author: "alice".into(),
                reason: "rack work".into(),
                now: false,
                since_unix: 0,
                held: false,
            },
        ]
    }

    #[test]
    fn gpus_text_starts_with_the_host_line() {
        let t = gpus_text(&gpus());
        let mut lines = t.lines();
        assert_eq!(
            lines.next(),
            Some("host: drain (operator: \"rack maintenance\", at min-runtime lapse)")
        );
        assert!(lines.next().unwrap_or("").starts_with("INDEX"));
        let row = lines.next().unwrap_or("");
        assert!(row.contains("degraded"), "{row}");
        assert!(
            row.ends_with("xid:94: contained ECC error; row-remap-pending"),
            "{row}"
        );
    }

    #[test]
    fn a_host_without_lease_cgroups_says_so_and_why() {
        assert!(!gpus_text(&gpus()).contains("no cgroups"));
        let r = ListGpusResponse {
            no_cgroups: "[agent] cgroup = \"off\"".into(),
            ..gpus()
        };
        let t = gpus_text(&r);
        assert!(
            t.lines().nth(1).is_some_and(|l| l.starts_with(
                "no cgroups for leases ([agent] cgroup = \"off\"): a workload is its process group"
            )),
            "{t}"
        );
        assert_eq!(gpus_json(&r)["no_cgroups"], "[agent] cgroup = \"off\"");
    }

    #[test]
    fn every_drain_is_listed_with_its_author() {
        let mut r = gpus();
        if let Some(d) = r.drain.as_mut() {
            d.drains = drains();
        }
        let t = gpus_text(&r);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "host: drain");
        assert_eq!(
            lines[1],
            "  drained by health (xid:79 on 0000:3b:00) since 2026-11-29T19:20:00Z, at once"
        );
        assert_eq!(
            lines[2],
            "  drained by local-operator alice: rack work, at min-runtime lapse"
        );
        assert!(lines[3].starts_with("INDEX"), "{t}");
        let v = gpus_json(&r);
        assert_eq!(v["drain"]["drains"][0]["by"], "health");
        assert_eq!(v["drain"]["drains"][1]["author"], "alice");
        assert_eq!(v["drain"]["drains"][1]["held"], false);
        assert_eq!(v["drain"]["drains"][0]["since_unix"], 1_795_980_000_i64);

        let mut held = drains()[0].clone();
        held.held = true;
        assert!(
            drain_line(&held).starts_with("held by allotd's circuit breaker, not in force: health"),
            "{}",
            drain_line(&held)
        );
    }

    #[test]
    fn undrain_says_what_is_left_and_who_lifts_it() {
        let left = DrainResponse {
            draining: true,
            reason: "xid:79 on 0000:3b:00".into(),
            now: true,
            by: "health".into(),
            drains: drains()[..1].to_vec(),
        };
        let t = drain_text(&left, true);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "host: still draining");
        assert!(lines[1].starts_with("  drained by health"), "{t}");
        assert!(lines[2].contains("allot gpus clear INDEX"), "{t}");
        assert!(!t.contains("nodes undrain"), "{t}");
        assert_eq!(
            drain_text(&DrainResponse::default(), true),
            "host: not draining\n"
        );
        let v = drain_json(&left);
        assert_eq!(v["drains"][0]["reason"], "xid:79 on 0000:3b:00");
    }

    #[test]
    fn gpus_json_is_one_object() {
        let v = gpus_json(&gpus());
        assert_eq!(v["verdict"], "drain");
        assert_eq!(v["drain"]["by"], "operator");
        assert_eq!(v["gpus"][0]["state"], "degraded");
        assert_eq!(v["gpus"][0]["reasons"][0]["signal"], "xid:94");
        assert_eq!(v["gpus"][0]["reasons"][0]["action"], "drain-now");
        let ok = gpus_json(&ListGpusResponse {
            verdict: HostVerdict::Ok as i32,
            ..Default::default()
        });
        assert_eq!(ok["verdict"], "ok");
        assert_eq!(ok["drain"]["draining"], false);
        assert_eq!(ok["drain"]["drains"], json!([]));
    }

    #[test]
    fn verdict_names_are_hyphenated() {
        assert_eq!(verdict(HostVerdict::DrainNow), "drain-now");
    }

    #[test]
    fn a_cleared_gpu_reads_on_one_line_then_what_is_left() {
        let g = gpus().gpus.remove(0);
        assert_eq!(
            gpu_text(&g),
            "GPU 0 (GPU-a, 0000:3b:00): degraded\n  still: xid:94: contained ECC error; row-remap-pending\n"
        );
        let healthy = Gpu {
            index: 3,
            uuid: "GPU-c".into(),
            state: GpuState::Healthy as i32,
            ..Default::default()
        };
        assert_eq!(gpu_text(&healthy), "GPU 3 (GPU-c, -): healthy\n");
    }

    #[test]
    fn long_gpu_lists_are_shortened() {
        let uuid = |n: u32| format!("GPU-{n:08x}-1111-2222-3333-444455556666");
        let eight: Vec<String> = (0..8).map(uuid).collect();
        assert_eq!(gpu_cell(&eight.join(",")), "GPU-00000000…,GPU-00000001…,+6");
        assert_eq!(gpu_cell(&uuid(10)), "GPU-0000000a…");
        assert_eq!(gpu_cell("0000:3b:00"), "0000:3b:00");
        assert_eq!(gpu_cell("GPU-aaaa"), "GPU-aaaa");
        assert_eq!(gpu_cell(""), "-");
    }
}
