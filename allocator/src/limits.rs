//! What one request may carry into allotd: each field from outside is checked for
//! its cap and, for names, the safe set (`allot_common::fields`) before it reaches
//! the state, the journal or a log line. Pure; `api.rs` calls these first and
//! answers `INVALID_ARGUMENT` in the usual `field: why; fix` form.

use allot_common::fields::{
    check_argv, check_count, check_cwd, check_env, check_len, check_name, check_name_with,
    check_optional_name, check_pattern, check_text, FieldError, MAX_HOOK, MAX_NAME, MAX_REASON,
};
use allot_proto::v1 as pb;
use tonic::Status;

/// Most GPUs a host registers or reports: beyond any host.
pub const MAX_HOST_GPUS: usize = 64;
/// Most nodes one gang may ask for: beyond any cluster allot is built for.
pub const MAX_NODES: u32 = 4096;
/// Most leases a host reports running at registration: 64 GPUs shared by fractional
/// and local leases stay far below it.
pub const MAX_RUNNING: usize = 4096;
/// Most drains a host reports at once (one per author kind in practice).
pub const MAX_DRAINS: usize = 16;
/// Most labels a host registers.
pub const MAX_LABELS: usize = 64;
/// Most health reasons reported for one GPU.
pub const MAX_GPU_REASONS: usize = 64;
/// Most bytes of a workload id as typed (a u64 has 20 digits; room for spaces).
pub const MAX_ID: usize = 32;

/// A refusal on the wire.
fn status(e: FieldError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// Most dependencies one submission names (an array's id counts once).
pub const MAX_DEPENDENCIES: usize = 1_000;

/// A submission's names, command line and hook (the other numbers are checked
/// against the cluster in `api.rs`).
pub fn spec(s: &pb::WorkloadSpec) -> Result<(), Status> {
    check_name("project", &s.project, MAX_NAME).map_err(status)?;
    check_name("user", &s.user, MAX_NAME).map_err(status)?;
    check_optional_name("class", &s.class, MAX_NAME).map_err(status)?;
    check_optional_name("name", &s.name, MAX_NAME).map_err(status)?;
    check_argv("argv", &s.argv).map_err(status)?;
    check_text("checkpoint_hook", &s.checkpoint_hook, MAX_HOOK).map_err(status)?;
    check_optional_name("warn_signal", &s.warn_signal, MAX_NAME).map_err(status)?;
    check_cwd("cwd", &s.cwd).map_err(status)?;
    check_env(
        "env",
        s.env.iter().map(|e| (e.name.as_str(), e.value.as_str())),
    )
    .map_err(status)?;
    check_pattern("output", &s.output).map_err(status)?;
    check_pattern("error", &s.error).map_err(status)?;
    check_optional_name("cluster", &s.cluster, MAX_NAME).map_err(status)?;
    use allot_common::fields::MAX_SCRIPT;
    if s.script.len() > MAX_SCRIPT {
        return Err(Status::invalid_argument(format!(
            "script: {} bytes; a batch script is at most {MAX_SCRIPT} bytes (keep data in files it reads)",
            s.script.len()
        )));
    }
    if s.script.contains('\0') {
        return Err(Status::invalid_argument(
            "script: it holds a NUL byte; a batch script is text",
        ));
    }
    use allot_common::hostlist::MAX_HOSTS;
    let select = [
        ("gpu_types", &s.gpu_types, MAX_LABELS),
        ("constraint", &s.constraint, MAX_LABELS),
        ("nodelist", &s.nodelist, MAX_HOSTS),
        ("exclude", &s.exclude, MAX_HOSTS),
    ];
    for (field, names, most) in select {
        check_count(field, names.len(), most, "names").map_err(status)?;
        for (i, n) in names.iter().enumerate() {
            check_name(&format!("{field}[{i}]"), n, MAX_NAME).map_err(status)?;
        }
    }
    check_count(
        "dependencies",
        s.dependencies.len(),
        MAX_DEPENDENCIES,
        "dependencies",
    )
    .map_err(status)?;
    check_count("notify", s.notify.len(), 8, "events").map_err(status)?;
    // Sizes beyond any host or cluster; the core names what this cluster can hold,
    // in the same "field = value: fix" form.
    if s.gpus_per_node as usize > MAX_HOST_GPUS {
        return Err(Status::invalid_argument(format!(
            "gpus_per_node = {}: ask for 1 to {MAX_HOST_GPUS} GPUs per node",
            s.gpus_per_node
        )));
    }
    if s.nodes > MAX_NODES {
        return Err(Status::invalid_argument(format!(
            "nodes = {}: ask for 1 to {MAX_NODES} nodes",
            s.nodes
        )));
    }
    Ok(())
}

/// A List's filters: names when given (a filter nobody could match is refused
/// rather than searched for).
pub fn list(r: &pb::ListRequest) -> Result<(), Status> {
    check_optional_name("project", &r.project, MAX_NAME).map_err(status)?;
    check_optional_name("user", &r.user, MAX_NAME).map_err(status)?;
    check_optional_name("name", &r.name, MAX_NAME).map_err(status)?;
    if pb::WorkloadState::try_from(r.state).is_err() {
        return Err(Status::invalid_argument(format!(
            "state: {} is not a workload state; give 0 (any) or one of 1 (pending) to 7 (timed out)",
            r.state
        )));
    }
    Ok(())
}

/// The filters of a history request.
pub fn history(r: &pb::HistoryRequest) -> Result<(), Status> {
    check_optional_name("project", &r.project, MAX_NAME).map_err(status)?;
    check_optional_name("user", &r.user, MAX_NAME).map_err(status)
}

/// A group of the org tree, as SetWeight names it.
pub fn group(field: &str, name: &str) -> Result<(), Status> {
    check_name(field, name, MAX_NAME).map_err(status)
}

/// A node, as Drain names it.
pub fn node(field: &str, name: &str) -> Result<(), Status> {
    check_name(field, name, MAX_NAME).map_err(status)
}

/// An operator's reason: one line of at most [`MAX_REASON`] bytes.
pub fn reason(field: &str, text: &str) -> Result<(), Status> {
    check_text(field, text, MAX_REASON).map_err(status)
}

/// A workload id as typed, before it is parsed (the parse error echoes it).
pub fn id(field: &str, text: &str) -> Result<(), Status> {
    check_text(field, text, MAX_ID).map_err(status)
}

/// A host's drains (in a registration or a health report). The text is the agent's
/// own and only capped: a host refused here could not register at all.
pub fn drains(field: &str, d: &[pb::DrainInfo]) -> Result<(), FieldError> {
    check_count(field, d.len(), MAX_DRAINS, "drains")?;
    for (i, d) in d.iter().enumerate() {
        check_name(&format!("{field}[{i}].by"), &d.by, MAX_NAME)?;
        check_len(&format!("{field}[{i}].author"), &d.author, MAX_NAME)?;
        check_len(&format!("{field}[{i}].reason"), &d.reason, MAX_REASON)?;
    }
    Ok(())
}

/// A host's GPUs (in a registration or a health report).
pub fn gpus(field: &str, gpus: &[pb::Gpu]) -> Result<(), FieldError> {
    check_count(field, gpus.len(), MAX_HOST_GPUS, "GPUs")?;
    for (i, g) in gpus.iter().enumerate() {
        let f = |name: &str| format!("{field}[{i}].{name}");
        // MIG UUIDs hold '/', PCI addresses ':'.
        check_name_with(&f("uuid"), &g.uuid, MAX_NAME, ":/")?;
        if !g.pci.is_empty() {
            check_name_with(&f("pci"), &g.pci, MAX_NAME, ":")?;
        }
        check_len(&f("model"), &g.model, MAX_NAME)?;
        check_len(&f("lease_id"), &g.lease_id, MAX_NAME)?;
        check_count(&f("reasons"), g.reasons.len(), MAX_GPU_REASONS, "reasons")?;
        for (j, r) in g.reasons.iter().enumerate() {
            check_len(&f(&format!("reasons[{j}].signal")), &r.signal, MAX_NAME)?;
            check_len(&f(&format!("reasons[{j}].detail")), &r.detail, MAX_REASON)?;
            check_len(&f(&format!("reasons[{j}].action")), &r.action, MAX_NAME)?;
        }
    }
    Ok(())
}

/// A registration's names and lists (the GPU count's lower bound and the rest are
/// `api.rs`'s `check_register`).
pub fn register(r: &pb::Register) -> Result<(), Status> {
    let check = || -> Result<(), FieldError> {
        check_name("register.host", &r.host, MAX_NAME)?;
        check_optional_name("register.cluster", &r.cluster, MAX_NAME)?;
        // An IP address (v4 or v6) or a host name: what MASTER_ADDR is set to.
        if !r.advertise_addr.is_empty() {
            check_name_with("register.advertise_addr", &r.advertise_addr, MAX_NAME, ":")?;
        }
        check_optional_name("register.gpu_type", &r.gpu_type, MAX_NAME)?;
        check_count(
            "register.features",
            r.features.len(),
            MAX_LABELS,
            "features",
        )?;
        for (i, f) in r.features.iter().enumerate() {
            check_name(&format!("register.features[{i}]"), f, MAX_NAME)?;
        }
        check_count("register.labels", r.labels.len(), MAX_LABELS, "labels")?;
        for (k, v) in &r.labels {
            check_name_with("register.labels (key)", k, MAX_NAME, "/:")?;
            check_text(&format!("register.labels[{k}]"), v, MAX_NAME)?;
        }
        gpus("register.gpus", &r.gpus)?;
        check_count("register.running", r.running.len(), MAX_RUNNING, "leases")?;
        for (i, l) in r.running.iter().enumerate() {
            check_len(&format!("register.running[{i}].id"), &l.id, MAX_NAME)?;
        }
        drains("register.drains", &r.drains)
    };
    check().map_err(status)
}

/// A health report from a connected host: refused ones are logged and dropped.
pub fn health(h: &pb::HealthReport) -> Result<(), FieldError> {
    gpus("health.gpus", &h.gpus)?;
    check_count(
        "health.host_reasons",
        h.host_reasons.len(),
        MAX_GPU_REASONS,
        "reasons",
    )?;
    for (j, r) in h.host_reasons.iter().enumerate() {
        check_len(
            &format!("health.host_reasons[{j}].signal"),
            &r.signal,
            MAX_NAME,
        )?;
        check_len(
            &format!("health.host_reasons[{j}].detail"),
            &r.detail,
            MAX_REASON,
        )?;
        check_len(
            &format!("health.host_reasons[{j}].action"),
            &r.action,
            MAX_NAME,
        )?;
    }
    check_count("health.only_gpus", h.only_gpus.len(), MAX_HOST_GPUS, "GPUs")?;
    drains("health.drains", &h.drains)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_ok() -> pb::WorkloadSpec {
        pb::WorkloadSpec {
            project: "demo-a".into(),
            user: "ana".into(),
            argv: vec!["sh".into(), "-c".into(), "sleep 1".into()],
            ..Default::default()
        }
    }

    fn refused(r: Result<(), Status>) -> String {
        let s = r.expect_err("refused");
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
        s.message().to_string()
    }

    #[test]
    fn a_list_of_a_state_that_is_none_is_refused_naming_the_field() {
        for bad in [99, -1, 8] {
            let r = pb::ListRequest {
                state: bad,
                ..Default::default()
            };
            let m = refused(list(&r));
            assert!(
                m.starts_with(&format!("state: {bad} is not a workload state")),
                "{m}"
            );
        }
        for good in 0..=7 {
            let r = pb::ListRequest {
                state: good,
                ..Default::default()
            };
            assert!(list(&r).is_ok(), "{good}");
        }
    }

    #[test]
    fn a_plain_submission_passes() {
        assert!(spec(&spec_ok()).is_ok());
        let mut s = spec_ok();
        s.class = "training".into();
        s.checkpoint_hook = "signal:USR1".into();
        assert!(spec(&s).is_ok());
    }

    #[test]
    fn unsafe_submissions_name_the_field() {
        let mut s = spec_ok();
        s.user = "ana\nallotd: forged".into();
        assert!(refused(spec(&s)).starts_with("user: "));
        let mut s = spec_ok();
        s.project = "demo\0a".into();
        assert!(refused(spec(&s)).starts_with("project: "));
        let mut s = spec_ok();
        s.argv = vec!["x".into(); 5000];
        let m = refused(spec(&s));
        assert!(m.starts_with("argv: 5000 arguments"), "{m}");
        let mut s = spec_ok();
        s.checkpoint_hook = format!("exec:{}", "a".repeat(MAX_HOOK));
        assert!(refused(spec(&s)).starts_with("checkpoint_hook: "));
        let mut s = spec_ok();
        s.class = "x".repeat(200);
        assert!(refused(spec(&s)).starts_with("class: "));
    }

    #[test]
    fn a_submission_s_place_environment_and_patterns_are_checked() {
        let var = |n: &str, v: &str| pb::EnvVar {
            name: n.into(),
            value: v.into(),
        };
        let mut s = spec_ok();
        s.cwd = "/home/ana/run".into();
        s.env = vec![var("PATH", "/usr/bin"), var("LANG", "C")];
        s.output = "train-%j-%n.out".into();
        assert!(spec(&s).is_ok());
        let mut b = s.clone();
        b.cwd = "run".into();
        assert!(refused(spec(&b)).starts_with("cwd: "));
        let mut b = s.clone();
        b.env.push(var("1BAD", "x"));
        assert!(refused(spec(&b)).starts_with("env[2].name: "));
        let mut b = s.clone();
        b.env.push(var("X", "a\0b"));
        assert!(refused(spec(&b)).starts_with("env[2].value: "));
        let mut b = s.clone();
        b.error = "../../etc/cron.d/x".into();
        assert!(refused(spec(&b)).starts_with("error: "));
        // A path of the user's own is theirs (opened as them on the host)...
        let mut b = s.clone();
        b.output = "/home/ana/logs/%x-%j.out".into();
        assert!(spec(&b).is_ok());
        // ... and still only with the % it knows.
        let mut b = s;
        b.output = "/var/log/%q".into();
        assert!(refused(spec(&b)).starts_with("output: "));
    }

    #[test]
    fn ids_reasons_and_names_are_capped() {
        assert!(id("id", "17").is_ok());
        let m = refused(id("id", &"9".repeat(1 << 20)));
        assert!(m.starts_with("id: ") && m.len() < 200, "{m}");
        assert!(reason("reason", "reseat after XID 79").is_ok());
        assert!(refused(reason("reason", "a\nb")).starts_with("reason: "));
        assert!(refused(node("name", "node 1")).starts_with("name: "));
        assert!(refused(group("name", "")).starts_with("name: "));
        let r = pb::ListRequest {
            user: "a\u{7f}".into(),
            ..Default::default()
        };
        assert!(refused(list(&r)).starts_with("user: "));
        assert!(list(&pb::ListRequest::default()).is_ok());
    }

    fn register_ok() -> pb::Register {
        pb::Register {
            host: "node-0".into(),
            cluster: "test".into(),
            gpus: (0..8)
                .map(|i| pb::Gpu {
                    uuid: format!("GPU-fake{i:04}-0000-0000-0000-000000000000"),
                    index: i,
                    pci: format!("00000000:{:02X}:00.0", 0x18 + i),
                    model: "NVIDIA H100 80GB HBM3".into(),
                    ..Default::default()
                })
                .collect(),
            drains: vec![pb::DrainInfo {
                by: "health".into(),
                author: "health monitor".into(),
                reason: "xid:79 on 0000:18:00.0".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_registration_is_capped_field_by_field() {
        assert!(register(&register_ok()).is_ok());
        let mut r = register_ok();
        r.advertise_addr = "fe80::1".into();
        assert!(register(&r).is_ok());
        r.advertise_addr = "10.0.0.1; rm -rf".into();
        assert!(refused(register(&r)).starts_with("register.advertise_addr: "));
        let mut r = register_ok();
        r.host = "node\n0".into();
        assert!(refused(register(&r)).starts_with("register.host: "));
        let mut r = register_ok();
        r.gpus[3].uuid = "u".repeat(129);
        assert!(refused(register(&r)).starts_with("register.gpus[3].uuid: "));
        let mut r = register_ok();
        r.gpus = vec![r.gpus[0].clone(); 65];
        assert!(refused(register(&r)).starts_with("register.gpus: 65 GPUs"));
        let mut r = register_ok();
        r.running = vec![pb::Lease::default(); MAX_RUNNING + 1];
        assert!(refused(register(&r)).starts_with("register.running: "));
        let mut r = register_ok();
        r.drains = vec![r.drains[0].clone(); MAX_DRAINS + 1];
        assert!(refused(register(&r)).starts_with("register.drains: 17 drains"));
        let mut r = register_ok();
        r.drains[0].reason = "r".repeat(MAX_REASON + 1);
        assert!(refused(register(&r)).starts_with("register.drains[0].reason: "));
        let mut r = register_ok();
        r.labels.insert("rack".into(), "b\x1b[31m".into());
        assert!(refused(register(&r)).starts_with("register.labels[rack]: "));
        let h = pb::HealthReport {
            drains: vec![pb::DrainInfo::default(); 20],
            ..Default::default()
        };
        assert!(health(&h)
            .expect_err("refused")
            .to_string()
            .starts_with("health.drains: 20"));
        let h = pb::HealthReport {
            host_reasons: vec![pb::HealthReason {
                signal: "disk-low".into(),
                detail: "x".repeat(2000),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(health(&h)
            .expect_err("refused")
            .to_string()
            .starts_with("health.host_reasons[0].detail: "));
    }
}
