//! `allot run` (what `srun` is to Slurm users) and `allot attach`: submit, say
//! on one live line why the work waits, then either attach this terminal to the
//! session's (`--pty`) or stream its output, and exit with its status.

use super::{ended, follow_logs, view, Server};
use crate::connect::Conn;
use crate::failure::Failure;
use crate::terminal::{Escape, Keys, Raw, ESCAPES};
use allot_proto::v1::workloads_client::WorkloadsClient;
use allot_proto::v1::{
    AttachInput, CancelRequest, GetRequest, LogStream, LogsRequest, WatchRequest, Workload,
    WorkloadState,
};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// `allot attach`.
#[derive(clap::Args, Debug)]
pub struct AttachArgs {
    #[command(flatten)]
    pub(super) conn: Server,
    /// The session's workload (`allot run --pty` printed it; `allot queue` lists it).
    pub id: String,
}

/// Clears the status line (when there is one) and moves to a new one.
struct StatusLine {
    tty: bool,
    shown: String,
}

impl StatusLine {
    fn new() -> StatusLine {
        StatusLine {
            tty: std::io::stderr().is_terminal(),
            shown: String::new(),
        }
    }

    /// Shows `line`: rewritten in place on a terminal; elsewhere once per change.
    fn show(&mut self, line: String, changed: bool) {
        let mut err = std::io::stderr().lock();
        if self.tty {
            let width = crate::terminal::size_of(std::os::fd::AsFd::as_fd(&std::io::stderr()))
                .map_or(100, |(_, c)| usize::from(c).saturating_sub(1));
            let cut: String = line.chars().take(width).collect();
            let _ = write!(err, "\r\x1b[K{cut}");
            let _ = err.flush();
        } else if changed {
            let _ = writeln!(err, "{line}");
        }
        self.shown = line;
    }

    fn done(&mut self) {
        if self.tty && !self.shown.is_empty() {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[K");
        }
        self.shown.clear();
    }
}

/// Why a pending workload waits, in one line: how long, the first reason, and
/// when it may start.
fn waiting_line(w: &Workload, since: Instant) -> String {
    let waited = allot_units::format_duration(since.elapsed().as_secs());
    let why = w
        .explanation
        .trim()
        .lines()
        .next()
        .unwrap_or("in the queue")
        .trim()
        .to_string();
    match view::forecast_words(w, super::now()) {
        Some(f) => format!("workload {} waiting {waited}: {why}; may start {f}", w.id),
        None => format!("workload {} waiting {waited}: {why}", w.id),
    }
}

/// Waits until workload `id` runs or ends, with a live line on stderr; Ctrl-C
/// cancels it (as srun's does before the job starts).
async fn wait_start(ch: &Conn, id: &str) -> Result<Workload, Failure> {
    let mut s = WorkloadsClient::new(ch.clone())
        .watch(WatchRequest { id: id.into() })
        .await?
        .into_inner();
    let since = Instant::now();
    let mut line = StatusLine::new();
    let mut last: Option<Workload> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            m = s.message() => {
                let Some(w) = m? else {
                    line.done();
                    // allotd restarted: ask where it stands.
                    return Ok(WorkloadsClient::new(ch.clone())
                        .get(GetRequest { id: id.into() })
                        .await?
                        .into_inner());
                };
                if w.state() != WorkloadState::Pending {
                    line.done();
                    return Ok(w);
                }
                let changed = last.as_ref().is_none_or(|l| l.explanation != w.explanation);
                line.show(waiting_line(&w, since), changed);
                last = Some(w);
            }
            _ = tick.tick() => {
                if let Some(w) = &last {
                    line.show(waiting_line(w, since), false);
                }
            }
            _ = tokio::signal::ctrl_c() => {
                line.done();
                WorkloadsClient::new(ch.clone())
                    .cancel(CancelRequest { id: id.into() })
                    .await?;
                eprintln!("allot: cancelled workload {id} before it started");
                return Err(Failure::JobEnded(130));
            }
        }
    }
}

/// `allot run` once submitted: waits for workload `id` to start, then attaches
/// (`pty`) or streams its output to its end; exits with its status.
pub async fn run(ch: Conn, id: &str, pty: bool) -> Result<(), Failure> {
    let w = wait_start(&ch, id).await?;
    if view::is_final(w.state()) && w.runs.is_empty() {
        eprintln!("{}", view::watch_line(&w));
        return ended(&w);
    }
    // Ended before it was seen running: what it printed is shown all the same.
    if pty && !view::is_final(w.state()) {
        return attach(ch, id).await;
    }
    let req = LogsRequest {
        id: id.into(),
        follow: true,
        run: 0,
        rank: 0,
        stream: LogStream::Stdout as i32,
    };
    tokio::select! {
        r = follow_logs(ch.clone(), req) => r?,
        _ = tokio::signal::ctrl_c() => {
            WorkloadsClient::new(ch.clone())
                .cancel(CancelRequest { id: id.into() })
                .await?;
            eprintln!("allot: cancelled workload {id}");
            return Err(Failure::JobEnded(130));
        }
    }
    let w = WorkloadsClient::new(ch)
        .get(GetRequest { id: id.into() })
        .await?
        .into_inner();
    ended(&w)
}

fn write_out(data: &[u8]) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(data);
    let _ = out.flush();
}

/// Attaches this terminal to session `id` until its program ends (its status
/// becomes this command's) or `~.` detaches it (the session runs on).
pub async fn attach(ch: Conn, id: &str) -> Result<(), Failure> {
    let (tx, rx) = tokio::sync::mpsc::channel::<AttachInput>(64);
    let (rows, cols) = crate::terminal::size().unwrap_or((0, 0));
    let _ = tx
        .send(AttachInput {
            id: id.into(),
            rows: rows.into(),
            cols: cols.into(),
            data: Vec::new(),
        })
        .await;
    let mut out = WorkloadsClient::new(ch.clone())
        .attach(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let raw = Raw::enter();
    // Keystrokes are read on a thread of their own: stdin blocks.
    let (keys_tx, mut keys) = tokio::sync::mpsc::unbounded_channel::<Keys>();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut esc = Escape::default();
        let mut buf = [0u8; 4096];
        let mut stdin = std::io::stdin().lock();
        loop {
            let n = match stdin.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            for k in esc.feed(&buf[..n]) {
                if keys_tx.send(k).is_err() {
                    return;
                }
            }
        }
    });
    let mut winch =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
            .map_err(|e| Failure::Other(anyhow::Error::new(e).context("watching the window")))?;
    let mut typing = true;
    let said = |raw: Option<Raw>, text: String| {
        drop(raw);
        eprintln!("\r\n{text}");
    };
    loop {
        tokio::select! {
            m = out.message() => {
                let o = match m {
                    Ok(Some(o)) => o,
                    Ok(None) => {
                        said(raw, format!("allot: the attach to workload {id} ended (allotd restarted?); the session runs on: `allot attach {id}`"));
                        return Err(Failure::Quiet);
                    }
                    Err(s) => {
                        drop(raw);
                        eprintln!();
                        return Err(Failure::Status(s));
                    }
                };
                if !o.node.is_empty() && raw.is_some() {
                    eprint!("[allot] attached to workload {id} on {} (lease {}); ~. detaches\r\n", o.node, o.lease_id);
                }
                write_out(&o.data);
                if o.ended {
                    drop(raw);
                    return session_ended(&ch, id, o.exit_code, o.signal).await;
                }
            }
            k = keys.recv(), if typing => match k {
                Some(Keys::Send(data)) => {
                    let _ = tx.send(AttachInput { data, ..Default::default() }).await;
                }
                Some(Keys::Detach) => {
                    // What was typed before the escape goes first: the request's
                    // end reaches allotd after it, and allotd then ends the answer.
                    drop(tx);
                    let drained = tokio::time::timeout(Duration::from_secs(5), async {
                        while let Ok(Some(o)) = out.message().await {
                            write_out(&o.data);
                        }
                    });
                    let _ = drained.await;
                    said(raw, format!("allot: detached; workload {id} runs on: `allot attach {id}`"));
                    return Ok(());
                }
                Some(Keys::Help) => write_out(ESCAPES.as_bytes()),
                // Input ended (a pipe): the session is still watched to its end.
                None => typing = false,
            },
            _ = winch.recv() => {
                if let Some((rows, cols)) = crate::terminal::size() {
                    let _ = tx.send(AttachInput { rows: rows.into(), cols: cols.into(), ..Default::default() }).await;
                }
            }
        }
    }
}

/// The session's program ended: its status is this command's; a session that
/// was reclaimed rather than ended says so, and where it stands now.
async fn session_ended(
    ch: &Conn,
    id: &str,
    code: Option<i32>,
    signal: Option<i32>,
) -> Result<(), Failure> {
    if let Some(sig) = signal {
        if let Ok(w) = WorkloadsClient::new(ch.clone())
            .get(GetRequest { id: id.into() })
            .await
        {
            eprintln!("{}", view::watch_line(&w.into_inner()));
        }
        return Err(Failure::JobEnded(128u8.saturating_add(sig as u8)));
    }
    match code {
        Some(0) | None => Ok(()),
        Some(c) => Err(Failure::JobEnded(c as u8)),
    }
}
