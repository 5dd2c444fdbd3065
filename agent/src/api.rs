//! The local gRPC API (`allot.v1.AgentLocal`) over the agent's unix socket. Reads are
//! open to whoever can open the socket (its mode and group decide); changes need
//! root, the agent's own user, or the socket's group, checked on the peer's
//! credentials.

use crate::host::{Caller, Effect, HostCommand, HostError, Outcome, StartSpec};
use crate::shared::Shared;
use crate::wire::{drain_pb, drain_response, event_pb, gpu_pb, lease_pb, stream_of, verdict_pb};
use allot_common::fields::{
    check_argv, check_len, check_optional_name, check_text, FieldError, MAX_HOOK, MAX_NAME,
    MAX_REASON,
};
use allot_proto::v1 as pb;
use allot_proto::v1::agent_local_server::AgentLocal;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The service.
pub struct LocalApi(pub Arc<Shared>);

/// Who is calling on the unix socket (its peer credentials).
pub fn caller<T>(req: &Request<T>) -> Result<Caller, Status> {
    req.extensions()
        .get::<tonic::transport::server::UdsConnectInfo>()
        .and_then(|i| i.peer_cred)
        .map(|c| Caller {
            uid: c.uid(),
            gid: c.gid(),
        })
        .ok_or_else(|| Status::unauthenticated("the local API only answers on its unix socket"))
}

/// Supplementary groups of a process, from /proc (peer credentials carry only the
/// primary group).
fn groups_of(pid: i32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Groups:")).map(|g| {
                g.split_whitespace()
                    .filter_map(|n| n.parse().ok())
                    .collect()
            })
        })
        .unwrap_or_default()
}

impl LocalApi {
    /// The host's drains or GPUs changed: allotd hears of it at once, and the
    /// contract loop looks again.
    fn host_changed(&self) {
        self.0.carry_out(vec![Effect::ReportHealth]);
    }

    fn may_change<T>(&self, req: &Request<T>, what: &str) -> Result<Caller, Status> {
        let c = caller(req)?;
        let me = nix::unistd::geteuid().as_raw();
        let pid = req
            .extensions()
            .get::<tonic::transport::server::UdsConnectInfo>()
            .and_then(|i| i.peer_cred)
            .and_then(|c| c.pid());
        let in_group = self
            .0
            .admin_gid
            .is_some_and(|g| c.gid == g || pid.is_some_and(|p| groups_of(p).contains(&g)));
        if c.uid == 0 || c.uid == me || in_group {
            Ok(c)
        } else {
            Err(Status::permission_denied(format!(
                "{what} needs root or membership of the agent's group (uid {} is neither); reading (`allot leases`, `allot gpus`, `allot events`) is allowed",
                c.uid
            )))
        }
    }
}

fn status(e: HostError) -> Status {
    match e {
        HostError::Invalid { .. } => Status::invalid_argument(e.to_string()),
        HostError::Refused(_) => Status::failed_precondition(e.to_string()),
        HostError::NoLease(_) => Status::not_found(e.to_string()),
        HostError::Launch(_) => Status::invalid_argument(e.to_string()),
        HostError::Store(_) => Status::internal(e.to_string()),
    }
}

/// A refused field on the wire, in the `field: why; fix` form.
fn invalid(e: FieldError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// The caps allotd puts on a submission, on a local start: the same functions, so
/// the host takes nothing allotd would refuse.
fn check_start(r: &pb::StartLeaseRequest) -> Result<(), FieldError> {
    check_argv("argv", &r.argv)?;
    check_optional_name("user", &r.user, MAX_NAME)?;
    check_optional_name("workload_id", &r.workload_id, MAX_NAME)?;
    check_text("checkpoint_hook", &r.checkpoint_hook, MAX_HOOK)?;
    check_optional_name("warn_signal", &r.warn_signal, MAX_NAME)?;
    if let Some(tl) = r.time_limit_s.filter(|&tl| r.min_runtime_s > tl) {
        // As allotd refuses it: the limit would end the work inside its protection.
        return Err(FieldError {
            field: "min_runtime_s".into(),
            message: format!(
                "{} s is longer than time_limit_s ({tl} s): the work would be stopped before its protection ends; ask for a min runtime no longer than the time limit",
                r.min_runtime_s
            ),
        });
    }
    allot_common::fields::check_cwd("cwd", &r.cwd)
}

/// The lease a start or a revocation answers with.
fn lease_of(o: Outcome) -> Result<crate::lease::LeaseRecord, Status> {
    match o {
        Outcome::Lease(l) => Ok(*l),
        other => Err(Status::internal(format!(
            "the host answered {other:?}, not a lease"
        ))),
    }
}

/// The drains a drain or an undrain answers with.
fn drains_of(o: Outcome) -> Result<pb::DrainResponse, Status> {
    match o {
        Outcome::Drains(d) => Ok(drain_response(&d)),
        other => Err(Status::internal(format!(
            "the host answered {other:?}, not its drains"
        ))),
    }
}

/// The user name of a uid, or the number.
fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(uid.into())
        .ok()
        .flatten()
        .map_or_else(|| format!("uid {uid}"), |u| u.name)
}

#[tonic::async_trait]
impl AgentLocal for LocalApi {
    async fn list_leases(
        &self,
        req: Request<pb::ListLeasesRequest>,
    ) -> Result<Response<pb::ListLeasesResponse>, Status> {
        caller(&req)?;
        let leases = self.0.host().leases();
        let pids: Vec<sysinfo::Pid> = leases
            .iter()
            .filter(|l| l.live() && l.pid > 0)
            .map(|l| sysinfo::Pid::from_u32(l.pid.unsigned_abs()))
            .collect();
        let mut sys = self.0.sys.lock().unwrap_or_else(|e| e.into_inner());
        sys.refresh_processes(sysinfo::ProcessesToUpdate::Some(&pids), true);
        let mut cpu = self.0.cpu.lock().unwrap_or_else(|e| e.into_inner());
        let now = std::time::Instant::now();
        let live: std::collections::BTreeSet<std::path::PathBuf> = leases
            .iter()
            .filter(|l| l.live() && !l.cgroup.is_empty())
            .map(|l| l.cgroup.clone().into())
            .collect();
        cpu.keep_only(&live);
        let leases = leases
            .iter()
            .map(|l| {
                let mut p = lease_pb(l);
                if !l.live() {
                    return p;
                }
                // The main process's figures, then the whole tree's where its cgroup
                // tells them.
                if let Some(proc_) = sys.process(sysinfo::Pid::from_u32(l.pid.unsigned_abs())) {
                    p.cpu_pct = f64::from(proc_.cpu_usage());
                    p.rss_bytes = proc_.memory();
                }
                if !l.cgroup.is_empty() {
                    let (pct, mem) = cpu.sample(std::path::Path::new(&l.cgroup), now);
                    p.cpu_pct = pct.unwrap_or(p.cpu_pct);
                    p.rss_bytes = mem.unwrap_or(p.rss_bytes);
                }
                p
            })
            .collect();
        Ok(Response::new(pb::ListLeasesResponse { leases }))
    }

    async fn list_gpus(
        &self,
        req: Request<pb::ListGpusRequest>,
    ) -> Result<Response<pb::ListGpusResponse>, Status> {
        caller(&req)?;
        let (cpus, memory_bytes) = self.0.host_size;
        let h = self.0.host();
        Ok(Response::new(pb::ListGpusResponse {
            verdict: verdict_pb(h.host_verdict()) as i32,
            gpus: h.gpus().iter().map(gpu_pb).collect(),
            drain: Some(drain_pb(&h)),
            host: self.0.host_name.clone(),
            cpus,
            memory_bytes,
            no_cgroups: h.settings().cgroups.why_off().unwrap_or_default().into(),
        }))
    }

    async fn start_lease(
        &self,
        req: Request<pb::StartLeaseRequest>,
    ) -> Result<Response<pb::Lease>, Status> {
        let c = self.may_change(&req, "starting a lease")?;
        let r = req.into_inner();
        check_start(&r).map_err(invalid)?;
        let spec = StartSpec {
            gpus: r.gpus,
            min_runtime_s: r.min_runtime_s,
            time_limit_s: r.time_limit_s,
            hook: r.checkpoint_hook,
            grace_s: r.grace_s,
            argv: r.argv,
            adopt_pid: (r.adopt_pid > 0).then(|| i32::try_from(r.adopt_pid).unwrap_or(i32::MAX)),
            user: r.user,
            workload_id: r.workload_id,
            // A local lease starts where its caller is (`allot lease start` sends
            // its directory) with a clean environment: the login variables and
            // the default PATH, no variables of the agent's.
            cwd: r.cwd,
            warn_signal: r.warn_signal,
            warn_before_s: r.warn_before_s,
            ..StartSpec::default()
        };
        let l = lease_of(
            self.0
                .command(HostCommand::Start {
                    spec: Box::new(spec),
                    caller: c,
                })
                .map_err(status)?,
        )?;
        Ok(Response::new(lease_pb(&l)))
    }

    async fn revoke_lease(
        &self,
        req: Request<pb::RevokeLeaseRequest>,
    ) -> Result<Response<pb::Lease>, Status> {
        let c = self.may_change(&req, "revoking a lease")?;
        let r = req.into_inner();
        check_len("lease_id", &r.lease_id, MAX_NAME).map_err(invalid)?;
        let l = lease_of(
            self.0
                .command(HostCommand::Revoke {
                    lease: r.lease_id,
                    now: r.now,
                    by: format!("operator (uid {})", c.uid),
                })
                .map_err(status)?,
        )?;
        Ok(Response::new(lease_pb(&l)))
    }

    async fn drain(
        &self,
        req: Request<pb::DrainRequest>,
    ) -> Result<Response<pb::DrainResponse>, Status> {
        let c = self.may_change(&req, "draining")?;
        let r = req.into_inner();
        check_text("reason", &r.reason, MAX_REASON).map_err(invalid)?;
        let done = self
            .0
            .command(HostCommand::Drain {
                reason: r.reason,
                now: r.now,
                author: user_name(c.uid),
            })
            .map_err(status)?;
        Ok(Response::new(drains_of(done)?))
    }

    async fn undrain(
        &self,
        req: Request<pb::UndrainRequest>,
    ) -> Result<Response<pb::DrainResponse>, Status> {
        self.may_change(&req, "undraining")?;
        let done = self.0.command(HostCommand::Undrain).map_err(status)?;
        Ok(Response::new(drains_of(done)?))
    }

    async fn clear_gpu(
        &self,
        req: Request<pb::ClearGpuRequest>,
    ) -> Result<Response<pb::Gpu>, Status> {
        let c = self.may_change(&req, "clearing a GPU")?;
        let r = req.into_inner();
        check_text("reason", &r.reason, MAX_REASON).map_err(invalid)?;
        if r.reason.trim().is_empty() {
            return Err(Status::invalid_argument(
                "reason: say what was done (reset, repair), e.g. --reason \"nvidia-smi -r after XID 79\"",
            ));
        }
        let Some(monitor) = self.0.monitor.as_ref() else {
            return Err(Status::failed_precondition(
                "the health monitor is not running on this host (see `allot events`); nothing to clear",
            ));
        };
        let pci = {
            let h = self.0.host();
            let g = h
                .gpus()
                .into_iter()
                .find(|g| g.sample.index == Some(r.index))
                .ok_or_else(|| {
                    Status::not_found(format!(
                        "index: no GPU {} on this host; `allot gpus` lists them",
                        r.index
                    ))
                })?;
            h.gpu_cleared(&g.sample.pci, r.index, &user_name(c.uid), &r.reason);
            g.sample.pci
        };
        // The new verdict is applied now, so the answer shows it (the daemon loop
        // gets the same verdict again and finds nothing changed).
        let (v, inv) = {
            let m = monitor.lock().unwrap_or_else(|e| e.into_inner());
            m.gpu_reset(&pci);
            (m.verdict(), m.inventory())
        };
        let mut h = self.0.host();
        h.on_verdict(v, inv, crate::host::now_ms());
        let g = h
            .gpus()
            .iter()
            .find(|g| g.sample.index == Some(r.index))
            .map(gpu_pb)
            .unwrap_or_default();
        drop(h);
        self.host_changed();
        Ok(Response::new(g))
    }

    async fn read_log(
        &self,
        req: Request<pb::ReadLogRequest>,
    ) -> Result<Response<pb::LogChunk>, Status> {
        let c = caller(&req)?;
        let r = req.get_ref().clone();
        check_len("lease_id", &r.lease_id, MAX_NAME).map_err(invalid)?;
        let stream = stream_of(r.stream);
        let src = self
            .0
            .host()
            .log_source(&r.lease_id, stream)
            .map_err(status)?;
        let Some(src) = src else {
            return Err(Status::not_found(format!(
                "lease_id: no lease {:?} on this host; `allot leases` lists them",
                r.lease_id
            )));
        };
        // Output is its user's: the socket's readers see leases, not what they wrote.
        let owner = nix::unistd::User::from_name(&src.user)
            .ok()
            .flatten()
            .map(|u| u.uid.as_raw())
            .or_else(|| src.user.parse().ok());
        if owner != Some(c.uid) {
            self.may_change(&req, "reading another user's output")?;
        }
        let (data, eof, lease_live) =
            crate::logs::read_source(&r.lease_id, stream, Some(src), r.offset, r.max_bytes)
                .map_err(Status::failed_precondition)?;
        Ok(Response::new(pb::LogChunk {
            request_id: r.request_id,
            data,
            eof,
            lease_live,
            error: String::new(),
        }))
    }

    async fn events(
        &self,
        req: Request<pb::EventsRequest>,
    ) -> Result<Response<pb::EventsResponse>, Status> {
        caller(&req)?;
        let since = req.into_inner().since_unix.saturating_mul(1000);
        let events = self
            .0
            .host()
            .events(since)
            .map_err(status)?
            .into_iter()
            .map(event_pb)
            .collect();
        Ok(Response::new(pb::EventsResponse { events }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_start_takes_allotds_caps() {
        let ok = pb::StartLeaseRequest {
            argv: vec!["sh".into(), "-c".into(), "sleep 1".into()],
            user: "ana".into(),
            workload_id: "W-1".into(),
            checkpoint_hook: "signal:USR1".into(),
            ..Default::default()
        };
        assert_eq!(check_start(&ok), Ok(()));
        assert_eq!(check_start(&pb::StartLeaseRequest::default()), Ok(()));
        let refused = |r: pb::StartLeaseRequest| check_start(&r).expect_err("refused").to_string();
        let m = refused(pb::StartLeaseRequest {
            user: "ana\nroot".into(),
            ..ok.clone()
        });
        assert!(m.starts_with("user: ") && m.contains("U+000A"), "{m}");
        let m = refused(pb::StartLeaseRequest {
            argv: vec!["x".into(); 2000],
            ..ok.clone()
        });
        assert!(m.starts_with("argv: 2000 arguments"), "{m}");
        let m = refused(pb::StartLeaseRequest {
            argv: vec!["a\0b".into()],
            ..ok.clone()
        });
        assert!(m.starts_with("argv[0]: ") && m.contains("NUL"), "{m}");
        let m = refused(pb::StartLeaseRequest {
            checkpoint_hook: "h".repeat(MAX_HOOK + 1),
            ..ok.clone()
        });
        assert!(m.starts_with("checkpoint_hook: "), "{m}");
        // A protection longer than the limit, as allotd refuses it; equal is fine.
        let m = refused(pb::StartLeaseRequest {
            min_runtime_s: 600,
            time_limit_s: Some(300),
            ..ok.clone()
        });
        assert!(
            m.starts_with("min_runtime_s: 600 s is longer than time_limit_s (300 s)"),
            "{m}"
        );
        let even = pb::StartLeaseRequest {
            min_runtime_s: 300,
            time_limit_s: Some(300),
            ..ok
        };
        assert_eq!(check_start(&even), Ok(()));
    }
}
