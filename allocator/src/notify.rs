//! Notifications (`--notify end,fail,preempt,time-limit,idle`, Slurm's `--mail-type`):
//! the state machine says what happened ([`Notice`], in `Out::Notify`); this shell
//! delivers it off the scheduling path. A queue capped by `[notify] queue` (a full
//! one drops and counts), one dispatcher thread, and a thread per delivery (at most
//! [`MAX_DELIVERIES`] at once) with its own retries and backoff, so a dead receiver
//! delays nothing else: not a pass, not a commit, not another receiver.

use crate::config::NotifySection;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

/// What a workload may ask to be told about.
/// `idle`: its GPUs stayed under the agent's `idle_below` for `idle_after`.
pub const EVENTS: [&str; 5] = ["end", "fail", "preempt", "time-limit", "idle"];

/// Deliveries in flight at most.
pub const MAX_DELIVERIES: usize = 16;

/// One notice: what happened to whose workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Notice {
    /// The workload.
    pub workload: u64,
    /// Its name.
    pub name: String,
    /// Its user.
    pub user: String,
    /// Its project.
    pub project: String,
    /// What happened, among those it asked for (`end`, `fail`, ...).
    pub events: Vec<String>,
    /// Its state now.
    pub state: String,
    /// How its last run ended, in words.
    pub reason: String,
    /// Its last run's exit status.
    pub exit_code: Option<i32>,
    /// When, Unix s.
    pub at: u64,
}

/// Delivery counts for `/metrics`.
#[derive(Debug, Default)]
pub struct Counts {
    /// Delivered.
    pub sent: AtomicU64,
    /// Given up after every attempt.
    pub failed: AtomicU64,
    /// Dropped: the queue was full.
    pub dropped: AtomicU64,
}

/// The delivery side.
pub struct Notifier {
    tx: Option<SyncSender<Notice>>,
    /// Delivery counts.
    pub counts: Arc<Counts>,
}

impl Notifier {
    /// Starts the dispatcher for `cfg` (nothing when there is nowhere to deliver).
    pub fn start(cfg: &NotifySection) -> Notifier {
        let counts = Arc::new(Counts::default());
        if cfg.webhooks.is_empty() && cfg.mail_command.is_empty() {
            return Notifier { tx: None, counts };
        }
        let (tx, rx) = sync_channel(cfg.queue.max(1));
        let (cfg, c) = (cfg.clone(), counts.clone());
        let spawned = std::thread::Builder::new()
            .name("allotd-notify".into())
            .spawn(move || dispatch(&cfg, &rx, &c));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the notification thread; notices are dropped");
            return Notifier { tx: None, counts };
        }
        Notifier {
            tx: Some(tx),
            counts,
        }
    }

    /// Queues a notice; never waits.
    pub fn send(&self, n: Notice) {
        let Some(tx) = &self.tx else {
            return;
        };
        match tx.try_send(n) {
            Ok(()) => {}
            Err(TrySendError::Full(n)) => {
                self.counts.dropped.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    workload = n.workload,
                    "notification queue full ([notify] queue); notice dropped"
                );
            }
            Err(TrySendError::Disconnected(_)) => {
                self.counts.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Where one notice goes.
enum Target {
    Webhook(String),
    Mail(String),
}

fn dispatch(cfg: &NotifySection, rx: &Receiver<Notice>, counts: &Arc<Counts>) {
    let busy = Arc::new(AtomicUsize::new(0));
    let client = match reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(cfg.timeout.max(1)))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot make the webhook client; notices are dropped");
            return;
        }
    };
    while let Ok(n) = rx.recv() {
        let mut targets: Vec<Target> = cfg
            .webhooks
            .iter()
            .filter(|w| w.user == n.user || w.project == n.project)
            .filter(|w| !(w.user.is_empty() && w.project.is_empty()))
            .map(|w| Target::Webhook(w.url.clone()))
            .collect();
        if !cfg.mail_command.is_empty() {
            targets.push(Target::Mail(format!("{}@{}", n.user, cfg.mail_domain)));
        }
        for t in targets {
            // Backpressure on the dispatcher only: the scheduling path never waits.
            while busy.load(Ordering::Acquire) >= MAX_DELIVERIES {
                std::thread::sleep(Duration::from_millis(50));
            }
            busy.fetch_add(1, Ordering::AcqRel);
            let (n, cfg, client, in_flight, done) = (
                n.clone(),
                cfg.clone(),
                client.clone(),
                busy.clone(),
                counts.clone(),
            );
            let spawned = std::thread::Builder::new()
                .name("allotd-deliver".into())
                .spawn(move || {
                    let ok = deliver(&cfg, &client, &t, &n);
                    let c = if ok { &done.sent } else { &done.failed };
                    c.fetch_add(1, Ordering::Relaxed);
                    in_flight.fetch_sub(1, Ordering::AcqRel);
                });
            if spawned.is_err() {
                busy.fetch_sub(1, Ordering::AcqRel);
                counts.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// One delivery with its retries: true once delivered.
fn deliver(
    cfg: &NotifySection,
    client: &reqwest::blocking::Client,
    t: &Target,
    n: &Notice,
) -> bool {
    let mut wait = Duration::from_secs(1);
    for attempt in 1..=cfg.attempts.max(1) {
        let r = match t {
            Target::Webhook(url) => post(client, url, n),
            Target::Mail(to) => mail(cfg, to, n),
        };
        match r {
            Ok(()) => return true,
            Err(e) => {
                let to = match t {
                    Target::Webhook(u) => u.as_str(),
                    Target::Mail(m) => m.as_str(),
                };
                tracing::warn!(workload = n.workload, to, attempt, error = %e, "notice not delivered");
            }
        }
        if attempt < cfg.attempts {
            std::thread::sleep(wait);
            wait = (wait * 2).min(Duration::from_secs(60));
        }
    }
    false
}

fn post(client: &reqwest::blocking::Client, url: &str, n: &Notice) -> Result<(), String> {
    let body = serde_json::to_vec(n).map_err(|e| e.to_string())?;
    let r = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .map_err(|e| e.to_string())?;
    if r.status().is_success() {
        Ok(())
    } else {
        Err(format!("the receiver answered {}", r.status()))
    }
}

/// The subject and text a person reads.
pub fn words(n: &Notice) -> (String, String) {
    let name = if n.name.is_empty() {
        String::new()
    } else {
        format!(" ({})", n.name)
    };
    let subject = format!(
        "allot workload {}{name}: {} [{}]",
        n.workload,
        n.state,
        n.events.join(",")
    );
    let exit = n.exit_code.map_or(String::new(), |c| format!(", exit {c}"));
    let text = format!(
        "Workload {}{name} of {} in project {} is {}{exit}.\n{}\n\nallot status {} says more.\n",
        n.workload, n.user, n.project, n.state, n.reason, n.workload
    );
    (subject, text)
}

fn mail(cfg: &NotifySection, to: &str, n: &Notice) -> Result<(), String> {
    use std::io::Write;
    let (subject, text) = words(n);
    let msg = format!("To: {to}\nSubject: {subject}\n\n{text}");
    let mut child = std::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(&cfg.mail_command)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", cfg.mail_command))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(msg.as_bytes())
            .map_err(|e| format!("writing to {}: {e}", cfg.mail_command))?;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(cfg.timeout.max(1) * 6);
    loop {
        match child.try_wait() {
            Ok(Some(s)) if s.success() => return Ok(()),
            Ok(Some(s)) => return Err(format!("{} exited {s}", cfg.mail_command)),
            Ok(None) if std::time::Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{} took too long; killed", cfg.mail_command));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notice_reads_for_people() {
        let n = Notice {
            workload: 12,
            name: "train".into(),
            user: "ana".into(),
            project: "vision".into(),
            events: vec!["end".into(), "fail".into()],
            state: "failed".into(),
            reason: "exited with status 3".into(),
            exit_code: Some(3),
            at: 0,
        };
        let (subject, text) = words(&n);
        assert_eq!(subject, "allot workload 12 (train): failed [end,fail]");
        assert!(text.starts_with("Workload 12 (train) of ana in project vision is failed, exit 3."));
    }
}
