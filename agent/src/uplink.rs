//! The agent's side of the allocator stream (`AgentStream.Session`): register the
//! host (with its running allocator leases, for reconciliation), then report health
//! and lease changes; carry out the allocator's starts, revocations and drains.
//! Reconnects with exponential backoff; the agent works on alone meanwhile.

use crate::credentials::Credentials;
use crate::host::{now_ms, Caller, HostCommand, Outcome, StartSpec};
use crate::lease::{LeaseEnd, LeaseRecord};
use crate::shared::Shared;
use crate::wire::{drains_pb, end_pb, gpu_pb, lease_pb, reason_pb, verdict_pb};
use allot_proto::v1 as pb;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// First and longest wait between connection attempts.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(10));

/// Leases the allocator gave (local leases are the operator's business).
fn from_allocator(l: &LeaseRecord) -> bool {
    crate::lease::from_allocator_id(&l.id)
}

fn status(l: &LeaseRecord) -> pb::AgentMessage {
    pb::AgentMessage {
        body: Some(pb::agent_message::Body::LeaseStatus(pb::LeaseStatus {
            lease: Some(lease_pb(l)),
        })),
    }
}

/// The health report for the stream.
pub fn health(sh: &Shared) -> pb::AgentMessage {
    let h = sh.host();
    pb::AgentMessage {
        body: Some(pb::agent_message::Body::Health(pb::HealthReport {
            verdict: verdict_pb(h.host_verdict()) as i32,
            only_gpus: Vec::new(),
            gpus: h.gpus().iter().map(gpu_pb).collect(),
            drains: drains_pb(&h),
            host_reasons: h.host_reasons().iter().map(reason_pb).collect(),
        })),
    }
}

/// What the host says of itself when it registers, from `[agent]`.
#[derive(Debug, Clone, Default)]
pub struct HostFacts {
    /// `cluster`.
    pub cluster: String,
    /// `gpu_type` (empty: allotd reads it from the GPUs' model).
    pub gpu_type: String,
    /// `features`.
    pub features: Vec<String>,
    /// `advertise_addr` (empty: found per session, see `local_ip_towards`).
    pub advertise: String,
}

fn register(sh: &Shared, facts: &HostFacts, advertise_addr: &str) -> pb::AgentMessage {
    let (cpu, mem) = (sh.host_size.0, sh.host_size.1 / (1 << 30));
    let h = sh.host();
    let highest = h.highest_allotd_ids().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot read the highest ids allotd gave this host");
        (0, 0)
    });
    pb::AgentMessage {
        body: Some(pb::agent_message::Body::Register(pb::Register {
            host: sh.host_name.clone(),
            cluster: facts.cluster.clone(),
            gpu_type: facts.gpu_type.clone(),
            features: facts.features.clone(),
            labels: Default::default(),
            cpu,
            memory_gb: mem,
            gpus: h.gpus().iter().map(gpu_pb).collect(),
            running: h
                .leases()
                .iter()
                .filter(|l| l.live() && from_allocator(l))
                .map(lease_pb)
                .collect(),
            drains: drains_pb(&h),
            protocol: PROTOCOL,
            advertise_addr: advertise_addr.to_string(),
            highest_workload: highest.0,
            highest_lease: highest.1,
            fence_s: fence_s(&h),
        })),
    }
}

/// What this agent understands of allotd's messages (see `Register.protocol`): 3
/// reads its leases' output for allotd, 4 runs a start's batch script, 5 gives a
/// session a terminal and relays it, 6 heartbeats and fences.
const PROTOCOL: u32 = 6;

/// The heartbeats of one stream not answered yet: (seq, boot ms sent), oldest first.
#[derive(Default)]
struct Beats {
    next: u64,
    unanswered: std::collections::VecDeque<(u64, u64)>,
}

impl Beats {
    /// At most this many kept: an allotd that answers none has the host fence anyway.
    const KEPT: usize = 64;

    fn sent(&mut self, at: u64) -> u64 {
        self.next += 1;
        if self.unanswered.len() == Self::KEPT {
            self.unanswered.pop_front();
        }
        self.unanswered.push_back((self.next, at));
        self.next
    }

    /// When heartbeat `seq` was sent, once: it and every earlier one are answered.
    fn answered(&mut self, seq: u64) -> Option<u64> {
        let mut at = None;
        while let Some(&(s, t)) = self.unanswered.front().filter(|(s, _)| *s <= seq) {
            self.unanswered.pop_front();
            if s == seq {
                at = Some(t);
            }
        }
        at
    }
}

/// What the host tells allotd of its fence: 0 until an allotd has answered a
/// heartbeat, for until then no supervisor fences.
fn fence_s(h: &crate::host::Host) -> u64 {
    if crate::fence::answered_before(&h.settings().state_dir) {
        h.fence_s()
    } else {
        0
    }
}

/// Records `at` as the host's last word from allotd, for the leases' fences.
fn heard(sh: &Shared, at: u64) {
    let dir = sh.host().settings().state_dir.clone();
    if let Err(e) = crate::fence::write(&dir, at) {
        tracing::warn!(error = %e, dir = %dir.display(), "cannot record allotd's last word: the leases will fence on the older one");
    }
}

/// Whether an allotd has answered this host's heartbeats before.
fn answered_before(sh: &Shared) -> bool {
    crate::fence::answered_before(&sh.host().settings().state_dir)
}

/// A heartbeat, recorded as sent now.
fn beat(sh: &Shared, beats: &std::sync::Mutex<Beats>) -> pb::AgentMessage {
    let seq = beats
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .sent(crate::fence::boot_ms());
    let fence_s = fence_s(&sh.host());
    pb::AgentMessage {
        body: Some(pb::agent_message::Body::Heartbeat(pb::Heartbeat {
            seq,
            fence_s,
        })),
    }
}

/// allotd answered heartbeat `seq`: its send time is the host's last word. The
/// first answer ever makes the host fence, and allotd hears so at once, not a
/// heartbeat later.
fn on_heard(sh: &Shared, beats: &std::sync::Mutex<Beats>, seq: u64) {
    let Some(at) = beats
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .answered(seq)
    else {
        return;
    };
    let first = !answered_before(sh);
    heard(sh, at);
    if first {
        send(sh, beat(sh, beats));
    }
}

/// Sends to the allocator if the stream is up (otherwise the next register
/// reconciles).
pub fn send(sh: &Shared, m: pb::AgentMessage) {
    if let Some(tx) = sh.uplink.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        let _ = tx.send(m);
    }
}

/// Forwards the lease changes the host recorded since the last call.
pub fn flush(sh: &Shared) {
    let changes = sh.host().take_changes();
    for l in changes.iter().filter(|l| from_allocator(l)) {
        send(sh, status(l));
    }
    // A local lease takes or frees GPUs allotd does not place: the GPU list tells it
    // (a host that refused work for want of GPUs may take it now).
    if changes.iter().any(|l| !from_allocator(l)) {
        send(sh, health(sh));
    }
}

fn failed_start(id: &str, how: LeaseEnd, why: &str) -> pb::AgentMessage {
    pb::AgentMessage {
        body: Some(pb::agent_message::Body::LeaseStatus(pb::LeaseStatus {
            lease: Some(pb::Lease {
                id: id.to_string(),
                state: pb::LeaseState::Ended as i32,
                end: end_pb(how) as i32,
                end_reason: how.name().into(),
                ended_by: why.to_string(),
                ..Default::default()
            }),
        })),
    }
}

fn on_command(sh: &Arc<Shared>, m: pb::AllocatorMessage) {
    match m.body {
        Some(pb::allocator_message::Body::ReadLog(r)) => {
            // File reads stay off the stream's task and out of the host's lock; the
            // answer names its request, so answers may pass each other.
            let sh = sh.clone();
            tokio::task::spawn_blocking(move || {
                let stream = crate::wire::stream_of(r.stream);
                let locate = || {
                    sh.host()
                        .log_source(&r.lease_id, stream)
                        .map_err(|e| e.to_string())
                };
                let read =
                    crate::logs::for_allotd(&r.lease_id, stream, locate, r.offset, r.max_bytes);
                let chunk = crate::wire::log_chunk(r.request_id, read);
                send(
                    &sh,
                    pb::AgentMessage {
                        body: Some(pb::agent_message::Body::LogChunk(chunk)),
                    },
                );
            });
            return;
        }
        Some(pb::allocator_message::Body::Tty(t)) => crate::tty_relay::on_input(sh, t),
        Some(pb::allocator_message::Body::Start(c)) => {
            let Some(l) = c.lease else { return };
            if let Some(existing) = sh.host().lease(&l.id).cloned() {
                let reused = existing.workload_id != l.workload_id
                    || (existing.allotd_start_s != 0 && existing.allotd_start_s != l.start_unix);
                if reused {
                    // Not a re-sent start: allotd gives an id it gave before (its state
                    // is older than this host's). Never answered with the old lease's end.
                    let why = format!(
                        "lease {} is already on this host, for workload {} started at {}: allotd gives lease ids again (its state older than this host's, restored from a backup?); refused",
                        l.id, existing.workload_id, existing.allotd_start_s
                    );
                    tracing::warn!(lease = %l.id, "{why}");
                    send(sh, failed_start(&l.id, LeaseEnd::Refused, &why));
                    return;
                }
                // Re-sent after a reconnect: answer with what this host knows.
                send(sh, status(&existing));
                return;
            }
            let spec = StartSpec {
                gpus: l.gpu_uuids.len() as u32,
                min_runtime_s: l.min_runtime_s,
                time_limit_s: l.time_limit_s,
                hook: l.checkpoint_hook.clone(),
                grace_s: l.grace_s,
                argv: c.argv,
                script: c.script,
                adopt_pid: None,
                user: c.user,
                workload_id: l.workload_id.clone(),
                env: c.env.into_iter().collect(),
                job_env: c.job_env.into_iter().map(|e| (e.name, e.value)).collect(),
                cwd: c.cwd,
                run: c.run,
                rank: c.rank,
                output: c.output,
                error: c.error,
                warn_signal: l.warn_signal.clone(),
                warn_before_s: l.warn_before_s,
                allotd_start_s: l.start_unix,
                lease_id: l.id.clone(),
                gpu_uuids: l.gpu_uuids.clone(),
                cpus: c.cpu_per_node,
                memory_gb: c.mem_per_node_gb,
                pty: c.pty,
            };
            // The allocator speaks for root on this host; the host still refuses a
            // user it cannot become.
            let started = sh.command(HostCommand::Start {
                spec: Box::new(spec),
                caller: Caller { uid: 0, gid: 0 },
            });
            match started {
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(lease = %l.id, error = %e, "allocator start refused");
                    // A host that cannot take the lease now (drained, GPU taken) is not
                    // the workload's fault: allotd requeues it; a command that cannot
                    // start at all fails the workload.
                    let reason = match e {
                        crate::host::HostError::Refused(_) => LeaseEnd::Refused,
                        _ => LeaseEnd::FailedToStart,
                    };
                    send(sh, failed_start(&l.id, reason, &e.to_string()));
                }
            }
        }
        Some(pb::allocator_message::Body::Revoke(r)) if r.withdraw => {
            let _ = sh.command(HostCommand::Withdraw {
                lease: r.lease_id,
                why: format!("allocator: {}", r.why),
            });
        }
        Some(pb::allocator_message::Body::Revoke(r)) => {
            let revoked = sh.command(HostCommand::RevokeUntil {
                lease: r.lease_id.clone(),
                not_before_ms: r.not_before_unix.saturating_mul(1000),
                why: format!("allocator: {}", r.why),
            });
            if let Ok(Outcome::Lease(l)) = &revoked {
                if !l.live() {
                    // Over already: allotd asks again because it has not heard the end.
                    send(sh, status(l));
                }
            }
            if let Err(e) = revoked {
                tracing::info!(lease = %r.lease_id, error = %e, "revocation for a lease this host does not hold");
                // allotd may be holding its GPUs here until this host says it is gone.
                send(
                    sh,
                    failed_start(
                        &r.lease_id,
                        LeaseEnd::Vanished,
                        "revoked, and this host does not hold it",
                    ),
                );
            }
        }
        Some(pb::allocator_message::Body::Drain(d)) => {
            // allotd before 0.2 sent operator drains without a kind.
            let kind = if d.by.is_empty() {
                crate::host::CLUSTER
            } else {
                d.by.as_str()
            };
            let r = sh.command(HostCommand::AllocatorDrain {
                kind: kind.to_string(),
                drain: d.drain,
                now: d.now,
                reason: d.reason,
            });
            if let Err(e) = r {
                tracing::warn!(error = %e, "allocator drain not applied");
            }
        }
        Some(pb::allocator_message::Body::Heard(_)) | None => {}
    }
    flush(sh);
    sh.wake.notify_one();
}

/// A channel to allotd that proves this host, its certificate renewed first when
/// two thirds of its life have passed.
async fn channel(
    sh: &Shared,
    addr: &str,
    state_dir: &Path,
) -> Result<tonic::transport::Channel, String> {
    // Read each time: `allot-agent enroll` may have run since, or a renewal.
    let mut me = Credentials::load(state_dir).map_err(|e| e.to_string())?;
    if me.info.common_name != sh.host_name {
        return Err(format!(
            "the host's certificate is for {:?} but agent.host is {:?}; set agent.host to the enrolled name, or enroll this name",
            me.info.common_name, sh.host_name
        ));
    }
    let connect = |me: &Credentials| {
        let e = me.endpoint(addr).map_err(|e| e.to_string());
        async move {
            e?.connect().await.map_err(|e| {
                format!(
                    "cannot reach {addr}: {}",
                    crate::credentials::root_cause(&e)
                )
            })
        }
    };
    let mut ch = connect(&me).await?;
    if me.renewal_due(now_ms() as u64 / 1000) {
        match crate::credentials::renew(ch.clone(), state_dir, &me).await {
            Ok(new) => {
                tracing::info!(not_after = new.info.not_after, "certificate renewed");
                me = new;
                ch = connect(&me).await?;
            }
            Err(e) => tracing::warn!(error = %e, "certificate renewal failed; will retry"),
        }
    }
    Ok(ch)
}

/// The local IP address this host uses to reach `uri` (allotd): what the cluster can
/// reach it by, when `[agent] advertise_addr` does not say. A UDP socket "connected"
/// to allotd's address makes the kernel pick the route and source address; nothing
/// is sent.
async fn local_ip_towards(uri: &str) -> Option<String> {
    let parsed = uri.parse::<tonic::transport::Uri>().ok()?;
    let host = parsed.host()?.trim_start_matches('[').trim_end_matches(']');
    let port = parsed.port_u16().unwrap_or(7070);
    let peer = tokio::net::lookup_host((host, port)).await.ok()?.next()?;
    let bind = if peer.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let sock = tokio::net::UdpSocket::bind(bind).await.ok()?;
    sock.connect(peer).await.ok()?;
    Some(sock.local_addr().ok()?.ip().to_string())
}

async fn session(
    sh: &Arc<Shared>,
    addr: &str,
    facts: &HostFacts,
    state_dir: &Path,
) -> Result<(), String> {
    let advertise = if facts.advertise.is_empty() {
        local_ip_towards(addr).await.unwrap_or_default()
    } else {
        facts.advertise.clone()
    };
    let mut client =
        pb::agent_stream_client::AgentStreamClient::new(channel(sh, addr, state_dir).await?);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    // Up before the snapshot: a change made meanwhile is queued behind it rather than
    // dropped by the daemon's flush.
    *sh.uplink.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx.clone());
    // Older changes are in the snapshot that follows.
    sh.host().take_changes();
    // Whatever allotd sends on this stream comes after it took the register: its
    // send time is the first word from allotd of this session.
    let registered = crate::fence::boot_ms();
    let _ = tx.send(register(sh, facts, &advertise));
    let _ = tx.send(health(sh));
    // Ended leases the allocator may not have heard of while the stream was down.
    let ended: Vec<LeaseRecord> = sh
        .host()
        .leases()
        .into_iter()
        .filter(|l| !l.live() && from_allocator(l))
        .collect();
    for l in &ended {
        let _ = tx.send(status(l));
    }
    let inbound = client
        .session(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await;
    let mut inbound = match inbound {
        Ok(r) => r.into_inner(),
        Err(e) => {
            *sh.uplink.lock().unwrap_or_else(|e| e.into_inner()) = None;
            return Err(format!("allocator refused the session: {}", e.message()));
        }
    };
    let beats = std::sync::Arc::new(std::sync::Mutex::new(Beats::default()));
    let heartbeat = {
        let (sh, beats) = (sh.clone(), beats.clone());
        let every = Duration::from_millis(crate::fence::heartbeat_ms(
            sh.host().settings().fence_after_s,
        ));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let m = beat(&sh, &beats);
                if tx.send(m).is_err() {
                    break;
                }
            }
        })
    };
    sh.host().set_defer_health(true, now_ms());
    tracing::info!(allocator = %addr, "connected to the allocator");
    let mut first = true;
    let r = loop {
        match inbound.message().await {
            Ok(Some(m)) => {
                // Only where an allotd answered heartbeats before: an allotd too old
                // to answer them never makes the file, and the host never fences
                // (that allotd ends a lost node's leases at its grace, as always).
                if std::mem::take(&mut first) && answered_before(sh) {
                    heard(sh, registered);
                }
                match m.body {
                    Some(pb::allocator_message::Body::Heard(h)) => on_heard(sh, &beats, h.seq),
                    _ => on_command(sh, m),
                }
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(format!("stream broke: {}", e.message())),
        }
    };
    heartbeat.abort();
    *sh.uplink.lock().unwrap_or_else(|e| e.into_inner()) = None;
    sh.ttys.close_all();
    sh.host().set_defer_health(false, now_ms());
    r
}

/// Keeps a session to the allocator up for as long as the agent runs.
pub async fn run(sh: Arc<Shared>, addr: String, facts: HostFacts, state_dir: PathBuf) {
    let addr = crate::credentials::with_scheme(&addr);
    let mut wait = BACKOFF.0;
    loop {
        let t0 = std::time::Instant::now();
        match session(&sh, &addr, &facts, &state_dir).await {
            Ok(()) => {
                tracing::warn!(allocator = %addr, "allocator closed the stream; reconnecting")
            }
            Err(e) => {
                tracing::warn!(allocator = %addr, error = %e, "allocator stream down; retrying")
            }
        }
        // A session that lasted resets the backoff; failing fast doubles it.
        wait = if t0.elapsed() > BACKOFF.1 {
            BACKOFF.0
        } else {
            (wait * 2).min(BACKOFF.1)
        };
        tokio::time::sleep(wait).await;
    }
}
