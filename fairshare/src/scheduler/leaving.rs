//! Parts of a lease that ended while their hosts still run them: a gang whose first
//! part ended (the others are being revoked and climb their own ladders), or a lease
//! of a node declared lost that came back running it. Their GPUs and host share stay
//! held until each host reports its part gone, so nothing is placed on GPUs a host
//! would refuse; and the lease's workload does not start again before the last part
//! has left, so two runs of one workload never overlap (a requeued gang resumes from
//! the checkpoint its old ranks finished writing).

use super::*;
use crate::cluster::GpuMask;
use serde::{Deserialize, Serialize};

/// An ended lease's parts still running on their hosts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leaving {
    /// The workload the lease ran.
    pub workload: WorkloadId,
    /// What each part still holds.
    pub parts: Vec<LeavingPart>,
}

/// One host's part of a [`Leaving`] lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeavingPart {
    /// The node.
    pub node: NodeId,
    /// The GPUs it still holds there.
    pub gpus: GpuMask,
    /// CPU cores it still holds there.
    pub cpu: u32,
    /// Memory it still holds there, GB.
    pub mem: u32,
}

impl State {
    /// Marks `p`'s GPUs and host share held (a part that stays).
    pub(super) fn hold_part(&mut self, p: &LeavingPart) {
        self.cluster.update(p.node, |n| {
            n.used |= p.gpus;
            n.soft &= !p.gpus;
            n.cpu_used += p.cpu;
            n.mem_used += p.mem;
        });
    }

    /// Whether workload `id` waits for a part of an earlier run to leave.
    pub(super) fn held_back(&self, id: WorkloadId) -> bool {
        self.leaving.values().any(|l| l.workload == id)
    }

    /// The names of the nodes where workload `id`'s earlier run still ends.
    fn leaving_nodes(&self, id: WorkloadId) -> Vec<String> {
        let mut names: Vec<String> = self
            .leaving
            .values()
            .filter(|l| l.workload == id)
            .flat_map(|l| l.parts.iter())
            .map(|p| self.cluster.node(p.node).spec.name.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

impl Scheduler {
    /// The shell reports that a lease is over while its parts on `still_running`
    /// nodes have not stopped yet (they are told to): as [`Scheduler::lease_ended`],
    /// but those parts' GPUs stay held until [`Scheduler::part_left`], and a workload
    /// that waits again does not start before then. `refusing`: the node that refused
    /// the start, when the end is a refusal.
    pub fn lease_ended_leaving(
        &mut self,
        now: Time,
        lease: LeaseId,
        end: LeaseEnd,
        refusing: Option<NodeId>,
        still_running: &[NodeId],
    ) -> Result<WorkloadState, CoreError> {
        let l = self
            .st
            .leases
            .get(&lease)
            .ok_or(CoreError::UnknownLease(lease.0))?;
        let workload = l.workload;
        let parts: Vec<LeavingPart> = l
            .placement
            .iter()
            .filter(|p| still_running.contains(&p.node) && refusing != Some(p.node))
            .map(|p| LeavingPart {
                node: p.node,
                gpus: p.gpus,
                cpu: l.cpu_per_node,
                mem: l.mem_per_node,
            })
            .collect();
        let next = self.end_lease(now, lease, end, refusing)?;
        if parts.is_empty() {
            return Ok(next);
        }
        for p in &parts {
            self.st.hold_part(p);
        }
        self.st.leaving.insert(lease, Leaving { workload, parts });
        if next == WorkloadState::Pending {
            self.hold_back(workload);
        }
        Ok(next)
    }

    /// A host reports its part of an ended lease gone: its GPUs and host share are
    /// free, and once the lease's last part has left, its workload may start again.
    /// `UnknownLease` when no part of `lease` is held on `node`.
    pub fn part_left(&mut self, now: Time, lease: LeaseId, node: NodeId) -> Result<(), CoreError> {
        self.clock(now);
        let l = self
            .st
            .leaving
            .get_mut(&lease)
            .ok_or(CoreError::UnknownLease(lease.0))?;
        let i = l
            .parts
            .iter()
            .position(|p| p.node == node)
            .ok_or(CoreError::UnknownLease(lease.0))?;
        let p = l.parts.swap_remove(i);
        let (workload, gone) = (l.workload, l.parts.is_empty());
        if gone {
            self.st.leaving.remove(&lease);
        }
        self.st.cluster.update(p.node, |n| {
            n.used &= !p.gpus;
            n.cpu_used -= p.cpu.min(n.cpu_used);
            n.mem_used -= p.mem.min(n.mem_used);
            n.forget_refusals();
        });
        if gone && !self.st.held_back(workload) {
            self.let_go(workload);
        }
        Ok(())
    }

    /// A node came back running a lease the core had ended (its node was declared
    /// lost): the GPUs of `gpus` that nothing else holds stay held as that lease's
    /// leaving part until the host reports it gone ([`Scheduler::part_left`]; the
    /// shell tells the host to end it), and its workload, if it waits to run again,
    /// waits for that. Returns the GPUs held (`None`: a part of it was held there
    /// already); `UnknownLease` for a lease still live.
    pub fn hold_stray(
        &mut self,
        now: Time,
        lease: LeaseId,
        workload: WorkloadId,
        node: NodeId,
        gpus: GpuMask,
    ) -> Result<Option<GpuMask>, CoreError> {
        self.clock(now);
        if self.st.leases.contains_key(&lease) {
            return Err(CoreError::UnknownLease(lease.0));
        }
        if node.idx() >= self.st.cluster.len() {
            return Err(CoreError::UnknownNode(node.0));
        }
        let w = self
            .st
            .workloads
            .get(&workload)
            .ok_or(CoreError::UnknownWorkload(workload.0))?;
        let (cpu, mem, waits) = (
            w.spec.cpu_per_node,
            w.spec.mem_per_node_gb,
            w.state == WorkloadState::Pending,
        );
        let n = self.st.cluster.node(node);
        // GPUs something else holds stay its; the part is held anyway (its host
        // share, and its workload waiting for it), even with no GPU named.
        let free = gpus & n.all() & !n.used;
        if self
            .st
            .leaving
            .get(&lease)
            .is_some_and(|l| l.parts.iter().any(|p| p.node == node))
        {
            return Ok(None);
        }
        self.st.drop_claims_holding(node, free);
        let part = LeavingPart {
            node,
            gpus: free,
            cpu,
            mem,
        };
        self.st.hold_part(&part);
        self.st
            .leaving
            .entry(lease)
            .or_insert(Leaving {
                workload,
                parts: Vec::new(),
            })
            .parts
            .push(part);
        if waits {
            self.hold_back(workload);
        }
        Ok(Some(free))
    }

    /// Ended leases' parts still running, by lease.
    pub fn leaving(&self) -> &BTreeMap<LeaseId, Leaving> {
        &self.st.leaving
    }

    /// Keeps pending workload `id` out of its queue while an earlier run's part
    /// still runs, and says why.
    pub(super) fn hold_back(&mut self, id: WorkloadId) {
        self.dequeue(id);
        self.st.drop_claim(id);
        let nodes = self.st.leaving_nodes(id);
        if let Some(w) = self.st.workloads.get_mut(&id) {
            w.blocked = Some(Blocked::PreviousRunEnding { nodes });
        }
    }

    /// Puts pending workload `id` back in its queue: its earlier run has left.
    fn let_go(&mut self, id: WorkloadId) {
        let Some(w) = self
            .st
            .workloads
            .get_mut(&id)
            .filter(|w| w.state == WorkloadState::Pending && !w.held)
        else {
            return;
        };
        w.blocked = None;
        let key = QueueKey::of(w);
        self.enqueue(key);
    }
}
