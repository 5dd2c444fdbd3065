//! What the state machine hands the service shell: commands for agents (domain
//! types; the API layer writes them as protobuf), audit lines, and notices for the
//! operator's log.

use allot_fairshare::Time;

/// Something for the service shell to carry out.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    /// Send to a node's agent.
    Send {
        /// Node name.
        node: String,
        /// What to tell it.
        cmd: Command,
    },
    /// Record in the audit log.
    Audit {
        /// Workload, 0 if none.
        workload: u64,
        /// Lease, 0 if none.
        lease: u64,
        /// Why.
        text: String,
    },
    /// A run ended (or a workload ended without one): kept for `allot history`,
    /// in the same transaction as the journal entry.
    Run(Box<crate::history::RunRow>),
    /// Tell a workload's user what happened to it (`--notify`), off the commit.
    Notify(Box<crate::notify::Notice>),
    /// Tell the operator's log (neither journaled nor audited).
    Notice {
        /// How loud.
        level: Level,
        /// The node it concerns.
        node: String,
        /// What happened.
        text: String,
    },
}

/// How loud a [`Out::Notice`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Something looks wrong; allotd carries on.
    Warn,
    /// A person should look now.
    Error,
}

/// A command for one host's agent.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Start a lease there (boxed: large beside the others).
    Start(Box<StartLease>),
    /// Revoke a lease, not before a time.
    Revoke {
        /// Lease.
        lease: u64,
        /// Not before, Unix s.
        not_before: Time,
        /// Why, for people.
        why: String,
    },
    /// Take back a drain revocation of a lease: the drain that asked for it ended.
    Withdraw {
        /// Lease.
        lease: u64,
        /// Why, for people.
        why: String,
    },
    /// Put a drain of one author kind in force on the host, or lift it.
    Drain {
        /// In force (true) or lifted.
        drain: bool,
        /// Revoke at once rather than at the min-runtime lapse.
        now: bool,
        /// Why.
        reason: String,
        /// Author kind: `cluster-operator`, or `health` for a drain the breaker let
        /// through.
        by: String,
    },
    /// Hold the host's health drain: allotd's circuit breaker did not let it through.
    Hold {
        /// The held drain asked for drain-now.
        now: bool,
        /// The health reasons.
        reasons: String,
    },
    /// Write a line on a session's terminal (protocol 5).
    Notice {
        /// The session's lease.
        lease: u64,
        /// The line.
        text: String,
    },
}

/// A lease to start on one host.
#[derive(Debug, Clone, PartialEq)]
pub struct StartLease {
    /// Lease.
    pub lease: u64,
    /// Its workload.
    pub workload: u64,
    /// The workload's project.
    pub project: String,
    /// Runs as.
    pub user: String,
    /// The GPUs on this host.
    pub gpu_uuids: Vec<String>,
    /// Start, Unix s.
    pub start: Time,
    /// Protected this long, seconds.
    pub min_runtime: u64,
    /// Stopped after, seconds.
    pub time_limit: Option<u64>,
    /// Checkpoint hook spec.
    pub hook: String,
    /// The warning it asked for before its time limit.
    pub warn: Option<super::TimeWarning>,
    /// The command.
    pub argv: Vec<String>,
    /// Where it starts (absolute; empty: the agent's own directory).
    pub cwd: String,
    /// The submitted environment, in order.
    pub env: Vec<(String, String)>,
    /// Stdout file pattern; empty: the agent's default.
    pub output: String,
    /// Stderr file pattern; empty: the agent's default.
    pub error: String,
    /// The job's name (`ALLOT_JOB_NAME`); empty: none given.
    pub name: String,
    /// Which run of the workload (1-based: its leases in order).
    pub run: u32,
    /// This host's rank in the gang (0-based, the order of `nodes`).
    pub rank: u32,
    /// Every host of the lease in rank order.
    pub nodes: Vec<String>,
    /// GPUs on each host.
    pub gpus_per_node: u32,
    /// Rank 0's address as its agent registered it (its name when none was).
    pub master_addr: String,
    /// The rendezvous port on rank 0's host; 0: none was free (not sent).
    pub master_port: u16,
    /// CPUs asked for on each host (the lease cgroup's limit); 0: none.
    pub cpu_per_node: u32,
    /// Memory asked for on each host, GiB (the lease cgroup's limit); 0: none.
    pub mem_per_node_gb: u32,
    /// Its array's id and its index there, for an element of one.
    pub array: Option<(u64, u32)>,
    /// Its batch script; empty: `argv` is the command.
    pub script: String,
    /// A session: on a terminal (protocol 5).
    pub pty: bool,
}

/// What [`Allocator::apply`](super::Allocator::apply) produced.
#[derive(Debug, Default)]
pub struct Applied {
    /// Commands, audit lines and notices.
    pub outs: Vec<Out>,
    /// A new workload's id (for `Submit`).
    pub id: Option<u64>,
    /// Whether the state changed in a way the journal must keep (passes that decide
    /// nothing, health reports that change nothing need not be journaled; see
    /// `serve.rs`).
    pub changed: bool,
    /// After a pass: when the core next needs one.
    pub next_wakeup: Option<Time>,
    /// What the journal keeps instead of the input, when `changed`: a pass keeps
    /// the decisions it made ([`Input::Decided`](super::Input::Decided)), so replay
    /// never runs the policy again.
    pub record: Option<super::Input>,
}

impl Applied {
    pub(super) fn send(&mut self, node: &str, cmd: Command) {
        self.outs.push(Out::Send {
            node: node.to_string(),
            cmd,
        });
    }

    pub(super) fn audit(&mut self, workload: u64, lease: u64, text: String) {
        self.outs.push(Out::Audit {
            workload,
            lease,
            text,
        });
    }

    pub(super) fn notice(&mut self, level: Level, node: &str, text: String) {
        self.outs.push(Out::Notice {
            level,
            node: node.to_string(),
            text,
        });
    }
}

/// The wire id of a lease.
pub fn lease_wire(id: u64) -> String {
    format!("A-{id}")
}

/// A wire lease id back to the core's (None for local agent leases).
pub fn lease_from_wire(id: &str) -> Option<u64> {
    id.strip_prefix("A-")?.parse().ok()
}

impl StartLease {
    /// allot's variables for one part of a lease (they win over the submitted
    /// environment and the user's login variables on the host): who the work is, where
    /// the gang's parts are, and the names `torchrun` reads, so a bare `torchrun
    /// train.py` finds its rendezvous. `WORLD_SIZE` counts GPU processes (nodes × GPUs
    /// per node), `ALLOT_NNODES` nodes.
    pub fn allot_env(&self) -> Vec<(String, String)> {
        let nnodes = self.nodes.len().max(1).to_string();
        let rank = self.rank.to_string();
        let per_node = self.gpus_per_node.to_string();
        let world = (self.nodes.len().max(1) as u64 * u64::from(self.gpus_per_node)).to_string();
        let mut v: Vec<(&str, String)> = vec![
            ("ALLOT_WORKLOAD_ID", self.workload.to_string()),
            ("ALLOT_PROJECT", self.project.clone()),
            ("ALLOT_JOB_NAME", self.name.clone()),
            ("ALLOT_RUN", self.run.to_string()),
            ("ALLOT_NODE_RANK", rank.clone()),
            ("ALLOT_NNODES", nnodes.clone()),
            ("ALLOT_NODELIST", self.nodes.join(",")),
            ("ALLOT_GPUS_PER_NODE", per_node.clone()),
            ("MASTER_ADDR", self.master_addr.clone()),
            ("WORLD_SIZE", world),
            ("NODE_RANK", rank.clone()),
            ("PET_NNODES", nnodes),
            ("PET_NODE_RANK", rank),
            ("PET_NPROC_PER_NODE", per_node),
            ("PET_MASTER_ADDR", self.master_addr.clone()),
        ];
        if self.master_port != 0 {
            v.push(("MASTER_PORT", self.master_port.to_string()));
            v.push(("PET_MASTER_PORT", self.master_port.to_string()));
        }
        if let Some((array, index)) = self.array {
            v.push(("ALLOT_ARRAY_ID", array.to_string()));
            v.push(("ALLOT_ARRAY_INDEX", index.to_string()));
        }
        v.push(("PET_SIGNALS_TO_HANDLE", self.torchrun_signals()));
        v.into_iter().map(|(k, val)| (k.to_string(), val)).collect()
    }

    /// The signals torchrun is to catch and forward to its workers (it starts each in a
    /// session of its own, so a signal to its group never reaches them): its own
    /// default and the checkpoint hook's, which end the run. Not the time-limit
    /// warning's: torchrun shuts the gang down on a signal it handles, and a warning is
    /// for the ranks to act on while the gang goes on (the agent sends it to them).
    fn torchrun_signals(&self) -> String {
        let mut sigs: Vec<String> = ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"]
            .into_iter()
            .map(String::from)
            .collect();
        if let Ok(allot_checkpoint_hooks::Hook::Signal(name)) =
            self.hook.parse::<allot_checkpoint_hooks::Hook>()
        {
            if let Some(sig) = allot_checkpoint_hooks::signal_named(&name) {
                let n = sig.as_str().to_string();
                if !sigs.contains(&n) {
                    sigs.push(n);
                }
            }
        }
        sigs.join(",")
    }
}
