//! `allot logs`: a run's output, read from the node that ran it. allotd keeps no
//! output of its own: it finds the run's lease and the rank's node in
//! [`WorkRec::runs`], asks that node's agent over its session (`ReadLog`, protocol
//! 3) and relays the answers (`LogChunk`) to the caller, 1 MiB at most at a time.
//! Following (`-f`) reads on from the last offset while the lease lives, every
//! [`POLL`] once the end is reached; without `--run` it goes on into the next run
//! when the workload is requeued, and ends when the workload has ended and every
//! byte was read.

use crate::log_relay::CHUNK;
use crate::serve::Server;
use crate::state::{lease_wire, RunRec, WorkRec};
use allot_proto::v1 as pb;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::Status;

/// Agents that read their leases' output for allotd (see `Register.protocol`).
pub const PROTOCOL_LOGS: u32 = 3;
/// Longest an agent may take to answer one read.
const ANSWER_WAIT: Duration = Duration::from_secs(8);
/// How often a followed file at its end, or a workload between runs, is looked at
/// again.
pub const POLL: Duration = Duration::from_millis(250);

/// What a Logs call asks for, checked.
#[derive(Debug, Clone)]
pub struct Want {
    /// The workload.
    pub id: u64,
    /// Its user (whose directory of the log dir holds its output).
    pub user: String,
    /// Who reads, whose share of the stream cap it takes.
    pub owner: String,
    /// Keep reading while the run lives (and on into later runs when `run` is 0).
    pub follow: bool,
    /// 1-based; 0: the latest.
    pub run: u32,
    /// The node's rank in the run.
    pub rank: u32,
    /// stdout or stderr.
    pub stream: pb::LogStream,
}

fn ext(stream: pb::LogStream) -> &'static str {
    if stream == pb::LogStream::Stderr {
        "err"
    } else {
        "out"
    }
}

/// The file's name on the host before 0.6 (under the agent's state dir), for
/// messages that point there.
fn file_of(lease: &str, stream: pb::LogStream) -> String {
    format!("leases/{lease}/{lease}.{}", ext(stream))
}

/// Where a run's output is on its host, for messages that point there.
fn log_file_of(user: &str, workload: u64, run: u32, rank: u32, stream: pb::LogStream) -> String {
    format!(
        "{user}/{workload}/{run}.{rank}.{} under the agent's [agent] log_dir (STATE_DIR/logs unless set; the submission's --output/--error pattern under {user}/ instead when it gave one)",
        ext(stream)
    )
}

/// Which run and node `want` names in `w`: `Ok(None)` while there is none yet and
/// the caller follows a workload that may still run.
pub fn pick(w: &WorkRec, want: &Want) -> Result<Option<(u32, RunRec)>, Status> {
    let id = w.id;
    let n = w.runs.len();
    if n == 0 {
        if let Some(last) = w.leases.last() {
            // Ran under an allotd before 0.6, which kept no runs.
            return Err(Status::failed_precondition(format!(
                "id: workload {id} ran before this allotd recorded runs; its output is on the node that ran lease {} (`allot lease logs {}` there)",
                lease_wire(*last),
                lease_wire(*last)
            )));
        }
        if want.follow && !w.state.is_final() {
            return Ok(None);
        }
        return Err(Status::failed_precondition(if w.state.is_final() {
            format!("id: workload {id} ended without running; it has no output")
        } else {
            format!(
                "id: workload {id} has not started yet, so it has no output (`allot status {id}` says why it waits; `allot logs -f {id}` waits for it)"
            )
        }));
    }
    let k = if want.run == 0 { n } else { want.run as usize };
    if k > n {
        return Err(Status::invalid_argument(format!(
            "run: workload {id} has run {n} time(s); give --run 1 to {n}"
        )));
    }
    let run = w.runs[k - 1].clone();
    if want.rank as usize >= run.nodes.len() {
        return Err(Status::invalid_argument(format!(
            "rank: run {k} of workload {id} ran on {} node(s); give --rank 0 to {}",
            run.nodes.len(),
            run.nodes.len().saturating_sub(1)
        )));
    }
    Ok(Some((k as u32, run)))
}

type Tx = mpsc::Sender<Result<pb::LogsChunk, Status>>;

/// What a Logs call answers with.
pub type LogsStream = Pin<Box<dyn Stream<Item = Result<pb::LogsChunk, Status>> + Send>>;

/// How one run's reading ended.
enum Ended {
    /// Everything read (the lease ended, or not following).
    Done,
    /// The caller went away.
    Gone,
}

/// Waits `d`, or until the caller goes away (then `false`).
async fn pause(tx: &Tx, d: Duration) -> bool {
    tokio::select! {
        () = tx.closed() => false,
        () = tokio::time::sleep(d) => true,
    }
}

/// Reads run `run` (lease `lease`) on `node` from the start to its end, relaying
/// each chunk; following, on while the lease lives.
async fn read_run(
    server: &Server,
    tx: &Tx,
    want: &Want,
    run: u32,
    lease: u64,
    node: &str,
) -> Result<Ended, Status> {
    let lease_id = lease_wire(lease);
    let mut offset = 0u64;
    loop {
        let session = server
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(node)
            .cloned();
        let Some((session, out, protocol)) = session else {
            return Err(Status::unavailable(format!(
                "{node} is not connected; its logs are on that host (`allot lease logs {lease_id}` there reads them): {}",
                log_file_of(&want.user, want.id, run, want.rank, want.stream)
            )));
        };
        if protocol < PROTOCOL_LOGS {
            return Err(Status::failed_precondition(format!(
                "{node}'s agent is older than `allot logs` (protocol {protocol}, {PROTOCOL_LOGS} needed); upgrade allot-agent there, or read {} under its state dir on that host",
                file_of(&lease_id, want.stream)
            )));
        }
        let (rid, answer) = server.logs.ask(node, session);
        let sent = out.send(Ok(pb::AllocatorMessage {
            body: Some(pb::allocator_message::Body::ReadLog(pb::ReadLogRequest {
                request_id: rid,
                lease_id: lease_id.clone(),
                stream: want.stream as i32,
                offset,
                max_bytes: CHUNK,
            })),
        }));
        if sent.is_err() {
            server.logs.forget(rid);
            // The session is ending; the next look finds it gone or replaced.
            if !pause(tx, POLL).await {
                return Ok(Ended::Gone);
            }
            continue;
        }
        let chunk = tokio::select! {
            () = tx.closed() => {
                server.logs.forget(rid);
                return Ok(Ended::Gone);
            }
            r = tokio::time::timeout(ANSWER_WAIT, answer) => r,
        };
        let chunk = match chunk {
            Err(_) => {
                server.logs.forget(rid);
                return Err(Status::deadline_exceeded(format!(
                    "{node} did not answer a read of lease {lease_id}'s output within {} s; try again",
                    ANSWER_WAIT.as_secs()
                )));
            }
            Ok(Err(_)) => {
                return Err(Status::unavailable(format!(
                    "{node} disconnected while its logs were read; try again when it is back (`allot nodes`)"
                )))
            }
            Ok(Ok(c)) => c,
        };
        if !chunk.error.is_empty() {
            return Err(Status::failed_precondition(format!(
                "{node}: {}",
                chunk.error
            )));
        }
        let got = chunk.data.len() as u64;
        offset += got;
        if got > 0 {
            let piece = pb::LogsChunk {
                data: chunk.data,
                run,
                node: node.to_string(),
                lease_id: lease_id.clone(),
            };
            if tx.send(Ok(piece)).await.is_err() {
                return Ok(Ended::Gone);
            }
        }
        // An empty read is the end whatever it says: never ask again at once.
        if chunk.eof || got == 0 {
            if !want.follow || !chunk.lease_live {
                return Ok(Ended::Done);
            }
            if !pause(tx, POLL).await {
                return Ok(Ended::Gone);
            }
        }
    }
}

/// The workload now: in memory, or its retired record.
fn record(server: &Server, id: u64) -> Result<WorkRec, Status> {
    let c = server.core();
    if let Some(w) = c.alloc.workloads().get(&id) {
        return Ok(w.clone());
    }
    c.retired(id)
        .map_err(|e| Status::internal(format!("{e:#}")))?
        .ok_or_else(|| {
            Status::not_found(format!("no workload {id}; `allot queue --all` lists them"))
        })
}

/// The whole of one Logs call, sending into `tx` until the end (or an error,
/// sent last).
async fn relay(server: Arc<Server>, tx: Tx, want: Want) {
    let mut done = 0u32;
    loop {
        let w = match record(&server, want.id) {
            Ok(w) => w,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        // Following the latest run: the next one once the last was read.
        let target = if want.run == 0 && done > 0 {
            if (w.runs.len() as u32) <= done {
                // Ended for good: every run was read.
                if w.state.is_final() {
                    return;
                }
                if !pause(&tx, POLL).await {
                    return;
                }
                continue;
            }
            pick(
                &w,
                &Want {
                    run: done + 1,
                    ..want.clone()
                },
            )
        } else {
            pick(&w, &want)
        };
        let (run, rec) = match target {
            Ok(Some(t)) => t,
            Ok(None) => {
                if !pause(&tx, POLL).await {
                    return;
                }
                continue;
            }
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        let node = rec.nodes[want.rank as usize].clone();
        match read_run(&server, &tx, &want, run, rec.lease, &node).await {
            Ok(Ended::Gone) => return,
            Ok(Ended::Done) => {}
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        }
        if !want.follow || want.run != 0 {
            return;
        }
        done = run;
    }
}

/// The stream a Logs call answers with (the caller's right already checked).
pub fn stream(server: Arc<Server>, want: Want) -> Result<LogsStream, Status> {
    // What can be told at once is told as the call's status, before any stream.
    let w = record(&server, want.id)?;
    pick(&w, &want)?;
    let slot = server.conns.watch_slot(&want.owner).map_err(|why| {
        Status::resource_exhausted(format!(
            "logs: {why} (watch and logs together); end some, or read without -f"
        ))
    })?;
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        // Held while the task runs: the count is of streams still served.
        let _slot = slot;
        relay(server, tx, want).await;
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}
