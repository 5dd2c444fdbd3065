//! What the local API and allotd's stream ask of the host, as one enum both map
//! into ([`HostCommand`]), and what carrying one out leaves for the daemon to do
//! ([`Effect`]): the rules never reach the uplink, the waiter threads or the loop.

use super::{Caller, Drain, Host, HostError, StartSpec};
use crate::lease::LeaseRecord;
use crate::os::Reaper;

/// One change asked of the host.
pub enum HostCommand {
    /// Start a lease: a local one, or one allotd placed.
    Start {
        /// What to run, on which GPUs, under which contract.
        spec: Box<StartSpec>,
        /// Who asks (allotd speaks for root).
        caller: Caller,
    },
    /// A host operator's revocation: at once, or at the lease's lapse.
    Revoke {
        /// The lease.
        lease: String,
        /// At once rather than at the lapse.
        now: bool,
        /// Who, for the lease's history.
        by: String,
    },
    /// allotd's revocation: acting no sooner than `not_before_ms`.
    RevokeUntil {
        /// The lease.
        lease: String,
        /// Unix ms.
        not_before_ms: i64,
        /// allotd's reason.
        why: String,
    },
    /// allotd takes back a revocation whose ladder has not begun.
    Withdraw {
        /// The lease.
        lease: String,
        /// allotd's reason.
        why: String,
    },
    /// A host operator drains the host.
    Drain {
        /// Why.
        reason: String,
        /// Revoke at once rather than at the lapses.
        now: bool,
        /// Who.
        author: String,
    },
    /// A host operator lifts their drain.
    Undrain,
    /// allotd drains (or undrains) the host for an author kind.
    AllocatorDrain {
        /// `cluster-operator` or `health`.
        kind: String,
        /// Drain, or lift.
        drain: bool,
        /// Revoke at once.
        now: bool,
        /// Why.
        reason: String,
    },
}

/// What a command answers.
#[derive(Debug)]
pub enum Outcome {
    /// The lease it started or revoked, as it is now.
    Lease(Box<LeaseRecord>),
    /// The host's drains after it, in force or held.
    Drains(Vec<Drain>),
    /// Done; nothing to show.
    Done,
}

/// What the daemon carries out after a command (never the rules themselves).
pub enum Effect {
    /// Reap this lease's supervisor when it exits.
    Reap(String, Reaper),
    /// Run the contract loop now: leases or drains changed.
    Wake,
    /// Tell allotd the host's health and drains.
    ReportHealth,
}

impl Host {
    /// Carries out `cmd`: what it answers and what the daemon is left to do.
    pub fn command(
        &mut self,
        cmd: HostCommand,
        now_ms: i64,
    ) -> Result<(Outcome, Vec<Effect>), HostError> {
        let drains = |h: &Host| Outcome::Drains(h.drains().into_iter().cloned().collect());
        match cmd {
            HostCommand::Start { spec, caller } => {
                let (l, reaper) = self.start(*spec, caller, now_ms)?;
                let mut effects = vec![Effect::Wake];
                if let Some(r) = reaper {
                    effects.push(Effect::Reap(l.id.clone(), r));
                }
                Ok((Outcome::Lease(Box::new(l)), effects))
            }
            HostCommand::Revoke { lease, now, by } => {
                let l = self.revoke(&lease, now, &by, now_ms)?;
                Ok((Outcome::Lease(Box::new(l)), vec![Effect::Wake]))
            }
            HostCommand::RevokeUntil {
                lease,
                not_before_ms,
                why,
            } => {
                let l = self.revoke_until(&lease, not_before_ms, &why, now_ms)?;
                Ok((Outcome::Lease(Box::new(l)), vec![Effect::Wake]))
            }
            HostCommand::Withdraw { lease, why } => {
                self.withdraw(&lease, &why);
                Ok((Outcome::Done, vec![Effect::Wake]))
            }
            HostCommand::Drain {
                reason,
                now,
                author,
            } => {
                self.drain(&reason, now, &author, now_ms)?;
                // allotd learns of the drain at once and sends no more work here.
                Ok((drains(self), vec![Effect::ReportHealth, Effect::Wake]))
            }
            HostCommand::Undrain => {
                self.undrain()?;
                Ok((drains(self), vec![Effect::ReportHealth, Effect::Wake]))
            }
            HostCommand::AllocatorDrain {
                kind,
                drain,
                now,
                reason,
            } => {
                self.allocator_drain(&kind, drain, now, &reason, now_ms)?;
                Ok((Outcome::Done, vec![Effect::Wake]))
            }
        }
    }
}
