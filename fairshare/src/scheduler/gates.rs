//! What the shell asks of pending and running work besides submit and cancel: keep it
//! out of its queue ([`Scheduler::hold`]) and let it back ([`Scheduler::release`]),
//! run it again from the queue ([`Scheduler::requeue`]), change its time limit or
//! priority while it waits ([`Scheduler::update`]). Why a workload is held (a user,
//! a dependency, an array's limit, a begin time) is the shell's; the core only keeps
//! held work out of every pass and out of its project's demand.

use super::*;
use crate::time::Secs;

impl Scheduler {
    /// Keeps pending workload `id` out of its queue: no pass considers it and its
    /// GPUs leave its project's demand. Returns false when it was held already.
    pub fn hold(&mut self, now: Time, id: WorkloadId) -> Result<bool, CoreError> {
        self.clock(now);
        let w = self.pending(id)?;
        if w.held {
            return Ok(false);
        }
        let (project, gpus) = (w.project, u64::from(w.spec.total_gpus()));
        self.dequeue(id);
        self.st.drop_claim(id);
        if let Some(w) = self.st.workloads.get_mut(&id) {
            w.held = true;
            w.blocked = None;
        }
        let d = &mut self.st.demand[project.idx()];
        *d -= gpus.min(*d);
        Ok(true)
    }

    /// Lets held workload `id` back into its queue at its old place (its submit time
    /// counts). Returns false when it was not held.
    pub fn release(&mut self, now: Time, id: WorkloadId) -> Result<bool, CoreError> {
        self.clock(now);
        let w = self.pending(id)?;
        if !w.held {
            return Ok(false);
        }
        let (project, gpus) = (w.project, u64::from(w.spec.total_gpus()));
        if let Some(w) = self.st.workloads.get_mut(&id) {
            w.held = false;
        }
        self.st.demand[project.idx()] += gpus;
        if self.st.held_back(id) {
            self.hold_back(id);
        } else if let Some(w) = self.st.workloads.get(&id) {
            let key = QueueKey::of(w);
            self.enqueue(key);
        }
        Ok(true)
    }

    /// Revokes running workload `id`'s lease now, at its owner's or an operator's
    /// word: it is asked to checkpoint and waits again (even with `no_requeue`), at
    /// its old place. Its contract does not protect it from its own owner.
    pub fn requeue(&mut self, now: Time, id: WorkloadId) -> Result<(), CoreError> {
        let now = self.clock(now);
        let w = self
            .st
            .workloads
            .get(&id)
            .ok_or(CoreError::UnknownWorkload(id.0))?;
        match (w.state, w.lease) {
            (WorkloadState::Running, Some(lease)) => {
                let cancelled = self
                    .st
                    .leases
                    .get(&lease)
                    .and_then(|l| l.revoke.as_ref())
                    .is_some_and(|r| r.why == RevokeWhy::Cancelled);
                if cancelled {
                    // Cancelled already: it ends, whatever is asked after.
                    return Err(CoreError::AlreadyEnded(id.0));
                }
                self.st.revoke_at(lease, now, RevokeWhy::Requeued);
                Ok(())
            }
            (WorkloadState::Pending, _) => Err(CoreError::NotRunning(id.0)),
            _ => Err(CoreError::AlreadyEnded(id.0)),
        }
    }

    /// Changes pending workload `id`'s time limit and priority (each when given);
    /// it keeps its place in time. A time limit under its min runtime is refused.
    pub fn update(
        &mut self,
        now: Time,
        id: WorkloadId,
        time_limit: Option<Secs>,
        priority: Option<i32>,
    ) -> Result<(), CoreError> {
        self.clock(now);
        let w = self.pending(id)?;
        let mut spec = w.spec.clone();
        if let Some(t) = time_limit {
            spec.time_limit = Some(t);
        }
        if let Some(p) = priority {
            spec.priority = p;
        }
        spec.check()?;
        let queued = !w.held && !self.st.held_back(id);
        if queued {
            self.dequeue(id);
        }
        self.st.drop_claim(id);
        if let Some(w) = self.st.workloads.get_mut(&id) {
            w.spec = spec;
            w.blocked = None;
        }
        if queued {
            if let Some(w) = self.st.workloads.get(&id) {
                let key = QueueKey::of(w);
                self.enqueue(key);
            }
        }
        Ok(())
    }

    /// Workload `id`, which must be pending.
    fn pending(&self, id: WorkloadId) -> Result<&Workload, CoreError> {
        let w = self
            .st
            .workloads
            .get(&id)
            .ok_or(CoreError::UnknownWorkload(id.0))?;
        match w.state {
            WorkloadState::Pending => Ok(w),
            WorkloadState::Running => Err(CoreError::Running(id.0)),
            _ => Err(CoreError::AlreadyEnded(id.0)),
        }
    }
}
