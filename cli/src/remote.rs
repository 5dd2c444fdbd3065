//! Commands against the allocator service allotd, over gRPC on TCP: the users'
//! `submit`, `queue`, `status`, `cancel` and `share`, the managers' `budget set`, and
//! the operators' cluster-wide `nodes [drain|undrain]`.

mod view;

use crate::duration;
use crate::failure::{block_on, Failure};
use crate::local::{parse_hook, Usage};
use allot_proto::v1::nodes_client::NodesClient;
use allot_proto::v1::org_client::OrgClient;
use allot_proto::v1::workloads_client::WorkloadsClient;
use allot_proto::v1::{
    CancelRequest, GetRequest, GetTreeRequest, ListNodesRequest, ListRequest, NodeDrainRequest,
    SetWeightRequest, SubmitRequest, Workload, WorkloadSpec, WorkloadState,
};
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// Where allotd listens.
#[derive(clap::Args, Debug)]
pub struct Server {
    /// allotd's address: http://HOST:PORT or HOST:PORT.
    // Global so that `allot nodes --server X drain N` works as well as after `drain`.
    #[arg(
        long,
        global = true,
        value_name = "ADDR",
        env = "ALLOT_SERVER",
        default_value = "http://127.0.0.1:7070",
        value_parser = parse_server
    )]
    server: String,
}

/// `allot submit`.
#[derive(clap::Args, Debug)]
pub struct SubmitArgs {
    #[command(flatten)]
    conn: Server,
    /// The project charged for the GPU time.
    #[arg(long, value_name = "P")]
    project: String,
    /// GPUs on each node.
    #[arg(long, value_name = "N", default_value_t = 1)]
    gpus: u32,
    /// Nodes (a gang: all start together or none does).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    nodes: u32,
    /// CPUs on each node [absent: allotd's default].
    #[arg(long, value_name = "N")]
    cpus: Option<u32>,
    /// Memory on each node: 64G, 512M, 1T or GB [absent: allotd's default].
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_gb)]
    memory: Option<u32>,
    /// Protected runtime: not preempted before it lapses (0: preemptible at any time).
    #[arg(long, value_name = "DURATION", default_value = "0", value_parser = duration::parse)]
    min_runtime: u64,
    /// Hard limit: ended when it is reached.
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    time_limit: Option<u64>,
    /// It can resume from a checkpoint, so preempting it loses little.
    #[arg(long)]
    resumable: bool,
    /// Order inside the project (higher first); never ahead of other projects.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    priority: i32,
    /// Workload class.
    #[arg(long, value_name = "NAME", default_value = "batch")]
    class: String,
    /// How to ask for a checkpoint before preemption: signal:USR1, exec:CMD or http:URL.
    #[arg(long, value_name = "HOOK", value_parser = parse_hook)]
    checkpoint: Option<String>,
    /// Submit as this user [absent: $USER, else the caller's account].
    #[arg(long, value_name = "NAME")]
    user: Option<String>,
    /// Print `{"id": ...}`.
    #[arg(long)]
    json: bool,
    /// The command to run, after `--`.
    #[arg(last = true, value_name = "CMD")]
    argv: Vec<String>,
}

/// A workload state as `--state` takes it.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum StateArg {
    /// Waiting for GPUs.
    Pending,
    /// Holding GPUs.
    Running,
    /// Exited 0.
    Completed,
    /// Exited non-zero or lost.
    Failed,
    /// Cancelled by its user or a manager.
    Cancelled,
    /// Preempted and not resumed.
    Preempted,
    /// Ended at its time limit.
    TimedOut,
}

impl From<StateArg> for WorkloadState {
    fn from(s: StateArg) -> Self {
        match s {
            StateArg::Pending => WorkloadState::Pending,
            StateArg::Running => WorkloadState::Running,
            StateArg::Completed => WorkloadState::Completed,
            StateArg::Failed => WorkloadState::Failed,
            StateArg::Cancelled => WorkloadState::Cancelled,
            StateArg::Preempted => WorkloadState::Preempted,
            StateArg::TimedOut => WorkloadState::TimedOut,
        }
    }
}

/// `allot queue`.
#[derive(clap::Args, Debug)]
pub struct QueueArgs {
    #[command(flatten)]
    conn: Server,
    /// Only this project's workloads.
    #[arg(long, value_name = "P")]
    project: Option<String>,
    /// Only this user's workloads.
    #[arg(long, value_name = "U")]
    user: Option<String>,
    /// Only workloads in this state [absent: pending and running].
    #[arg(long, value_enum, conflicts_with = "all")]
    state: Option<StateArg>,
    /// Finished workloads too.
    #[arg(long)]
    all: bool,
    /// Print one JSON array of workloads.
    #[arg(long)]
    json: bool,
}

/// `allot status` and `allot cancel`.
#[derive(clap::Args, Debug)]
pub struct IdArgs {
    #[command(flatten)]
    conn: Server,
    /// The workload id.
    id: String,
    /// Print the workload as one JSON object.
    #[arg(long)]
    json: bool,
}

/// `allot share`.
#[derive(clap::Args, Debug)]
pub struct ShareArgs {
    #[command(flatten)]
    conn: Server,
    /// Print one JSON object: window_hours, capacity_gpus, groups.
    #[arg(long)]
    json: bool,
}

/// The `budget` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum BudgetCommand {
    /// Set a group's weight: its share of its parent is weight ÷ the siblings' sum.
    Set(BudgetSetArgs),
}

/// `allot budget set`.
#[derive(clap::Args, Debug)]
pub struct BudgetSetArgs {
    #[command(flatten)]
    conn: Server,
    /// The group (org, team or project) in the fair-share tree.
    name: String,
    /// The new weight, a positive number.
    #[arg(long, value_name = "W", allow_negative_numbers = true, value_parser = parse_weight)]
    share: f64,
    /// Print the updated group as one JSON object.
    #[arg(long)]
    json: bool,
}

/// `allot nodes`: the list, or a drain.
#[derive(clap::Args, Debug)]
pub struct NodesArgs {
    #[command(subcommand)]
    command: Option<NodesCommand>,
    #[command(flatten)]
    conn: Server,
    /// Print JSON: an array of nodes, or the one node changed.
    #[arg(long, global = true)]
    json: bool,
}

/// The `nodes` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum NodesCommand {
    /// Give a node no new work; revoke its leases at min-runtime lapse (or --now).
    Drain {
        /// The node.
        name: String,
        /// Why: shown to everyone who asks why the node takes no work.
        #[arg(long, value_name = "TEXT")]
        reason: String,
        /// Revoke its leases at once, protected or not.
        #[arg(long)]
        now: bool,
    },
    /// Give a node work again.
    Undrain {
        /// The node.
        name: String,
    },
}

/// The commands that talk to allotd.
#[derive(clap::Subcommand, Debug)]
pub enum Remote {
    /// Queue a workload: the command after `--`, on --nodes × --gpus GPUs.
    Submit(SubmitArgs),
    /// Pending and running workloads, and why each pending one waits.
    Queue(QueueArgs),
    /// One workload in full: its contract, where it runs, why it waits.
    Status(IdArgs),
    /// Cancel a workload.
    Cancel(IdArgs),
    /// The fair-share tree: each group's share, budget, usage and served ratio.
    Share(ShareArgs),
    /// Managers: change the fair-share tree.
    #[command(subcommand)]
    Budget(BudgetCommand),
    /// The cluster's nodes: state, free GPUs, health and drains; drain or undrain one.
    Nodes(NodesArgs),
}

/// Clap value parser for `--server`: `HOST:PORT` gets `http://` in front.
fn parse_server(s: &str) -> Result<String, String> {
    let s = s.trim();
    let uri = if s.contains("://") {
        s.to_string()
    } else {
        format!("http://{s}")
    };
    // allotd speaks plain HTTP/2 and the CLI is built without TLS, so an https://
    // address would only fail later with a vaguer message.
    let ok = uri.len() > "http://".len()
        && uri.starts_with("http://")
        && Endpoint::from_shared(uri.clone()).is_ok();
    if ok {
        Ok(uri)
    } else {
        Err("expected HOST:PORT or http://HOST:PORT (e.g. allotd.example.org:7070)".into())
    }
}

/// Clap value parser for `--share`: weights are relative, so only > 0 means anything.
fn parse_weight(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(w) if w.is_finite() && w > 0.0 => Ok(w),
        _ => Err("expected a positive number (e.g. 2 or 0.5): the group's weight relative to its siblings".into()),
    }
}

/// Checks what clap cannot express.
pub fn validate(cmd: &Remote) -> Result<(), Usage> {
    if let Remote::Submit(a) = cmd {
        if a.argv.is_empty() {
            return Err(Usage {
                path: &["submit"],
                message: "say what the workload runs: a command after `--` (allot submit --project P --gpus 8 -- python train.py)".into(),
            });
        }
    }
    Ok(())
}

/// Runs one allotd command to completion and says how the process should exit.
pub fn run(cmd: Remote) -> ExitCode {
    block_on(dispatch(cmd))
}

/// The innermost cause: tonic's own message for a failed connect is only
/// "transport error", while the io::Error underneath says what happened.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// A channel to allotd, connected at once so that an unreachable server is reported
/// by address before anything else happens.
async fn channel(conn: &Server) -> Result<Channel, Failure> {
    let fail = |why: String| {
        Failure::Connect(format!(
            "cannot reach allotd at {}: {why}; is it running? (set --server or ALLOT_SERVER)",
            conn.server
        ))
    };
    let endpoint = Endpoint::from_shared(conn.server.clone())
        .map_err(|e| fail(root_cause(&e)))?
        // Without these a black-holed address or a wedged server hangs the terminal.
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(60));
    endpoint.connect().await.map_err(|e| fail(root_cause(&e)))
}

/// The user to submit as: $USER, else the account's name, else the uid.
fn default_user() -> String {
    if let Some(u) = std::env::var("USER").ok().filter(|u| !u.is_empty()) {
        return u;
    }
    // $USER is often unset under cron, systemd and `docker exec`.
    let uid = nix::unistd::getuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(u)) => u.name,
        _ => uid.to_string(),
    }
}

/// Pending then running, one List call each: the proto takes one state per call, and
/// asking for all states would fetch the whole history to show the live part.
async fn list_active(
    c: &mut WorkloadsClient<Channel>,
    project: &str,
    user: &str,
) -> Result<Vec<Workload>, Failure> {
    let mut lists = Vec::with_capacity(2);
    // Pending first: a workload that starts between the calls then shows once, as
    // running, instead of falling between them.
    for state in [WorkloadState::Pending, WorkloadState::Running] {
        let r = c
            .list(ListRequest {
                project: project.into(),
                user: user.into(),
                state: state as i32,
            })
            .await?;
        lists.push(r.into_inner().workloads);
    }
    let running = lists.pop().unwrap_or_default();
    let pending = lists.pop().unwrap_or_default();
    // A set, not a scan: thousands of pending against thousands of running.
    let started: std::collections::HashSet<String> = running.iter().map(|r| r.id.clone()).collect();
    let pending = pending.into_iter().filter(|p| !started.contains(&p.id));
    Ok(running.into_iter().chain(pending).collect())
}

async fn dispatch(cmd: Remote) -> Result<(), Failure> {
    match cmd {
        Remote::Submit(a) => {
            let spec = WorkloadSpec {
                project: a.project,
                user: a.user.unwrap_or_else(default_user),
                class: a.class,
                gpus_per_node: a.gpus,
                nodes: a.nodes,
                cpu_per_node: a.cpus.unwrap_or(0),
                mem_per_node_gb: a.memory.unwrap_or(0),
                min_runtime_s: a.min_runtime,
                time_limit_s: a.time_limit,
                resumable: a.resumable,
                priority: a.priority,
                argv: a.argv,
                checkpoint_hook: a.checkpoint.unwrap_or_default(),
            };
            let (project, gpus, nodes) = (spec.project.clone(), spec.gpus_per_node, spec.nodes);
            let id = WorkloadsClient::new(channel(&a.conn).await?)
                .submit(SubmitRequest { spec: Some(spec) })
                .await?
                .into_inner()
                .id;
            if a.json {
                println!("{}", json!({ "id": id }));
            } else {
                println!(
                    "submitted workload {id} (project {project}, {})",
                    view::gpu_count(gpus, nodes)
                );
            }
        }
        Remote::Queue(a) => {
            let mut c = WorkloadsClient::new(channel(&a.conn).await?);
            let project = a.project.unwrap_or_default();
            let user = a.user.unwrap_or_default();
            let workloads = match (a.state, a.all) {
                (None, false) => list_active(&mut c, &project, &user).await?,
                (state, _) => {
                    let state = state.map_or(WorkloadState::Unspecified, WorkloadState::from);
                    c.list(ListRequest {
                        project,
                        user,
                        state: state as i32,
                    })
                    .await?
                    .into_inner()
                    .workloads
                }
            };
            if a.json {
                let v: Vec<Value> = workloads.iter().map(view::workload_json).collect();
                println!("{}", serde_json::to_string(&v)?);
            } else {
                print!("{}", view::queue_table(&workloads, now()));
            }
        }
        Remote::Status(a) => {
            let w = WorkloadsClient::new(channel(&a.conn).await?)
                .get(GetRequest { id: a.id })
                .await?
                .into_inner();
            if a.json {
                println!("{}", view::workload_json(&w));
            } else {
                print!("{}", view::status_text(&w, now()));
            }
        }
        Remote::Cancel(a) => {
            let w = WorkloadsClient::new(channel(&a.conn).await?)
                .cancel(CancelRequest { id: a.id })
                .await?
                .into_inner();
            if a.json {
                println!("{}", view::workload_json(&w));
            } else {
                println!("workload {}: {}", w.id, view::state_name(w.state()));
            }
        }
        Remote::Share(a) => {
            let t = OrgClient::new(channel(&a.conn).await?)
                .get_tree(GetTreeRequest {})
                .await?
                .into_inner();
            if a.json {
                println!("{}", view::tree_json(&t));
            } else {
                print!("{}", view::share_text(&t));
            }
        }
        Remote::Budget(BudgetCommand::Set(a)) => {
            let g = OrgClient::new(channel(&a.conn).await?)
                .set_weight(SetWeightRequest {
                    name: a.name,
                    weight: a.share,
                })
                .await?
                .into_inner();
            if a.json {
                println!("{}", view::group_json(&g));
            } else {
                println!("{}", view::group_line(&g));
            }
        }
        Remote::Nodes(a) => {
            let mut c = NodesClient::new(channel(&a.conn).await?);
            let req = match a.command {
                None => {
                    let nodes = c.list(ListNodesRequest {}).await?.into_inner().nodes;
                    if a.json {
                        let v: Vec<Value> = nodes.iter().map(view::node_json).collect();
                        println!("{}", serde_json::to_string(&v)?);
                    } else {
                        print!("{}", view::nodes_table(&nodes));
                    }
                    return Ok(());
                }
                Some(NodesCommand::Drain { name, reason, now }) => NodeDrainRequest {
                    name,
                    reason,
                    now,
                    undrain: false,
                },
                Some(NodesCommand::Undrain { name }) => NodeDrainRequest {
                    name,
                    undrain: true,
                    ..Default::default()
                },
            };
            let n = c.drain(req).await?.into_inner();
            if a.json {
                println!("{}", view::node_json(&n));
            } else {
                println!("{}", view::node_line(&n));
            }
        }
    }
    Ok(())
}

fn now() -> i64 {
    duration::now_ms() / 1_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_addresses_get_a_scheme() {
        assert_eq!(
            parse_server("127.0.0.1:7070").as_deref(),
            Ok("http://127.0.0.1:7070")
        );
        assert_eq!(
            parse_server("http://allotd:7070").as_deref(),
            Ok("http://allotd:7070")
        );
        assert_eq!(
            parse_server(" allotd.example.org:7070 ").as_deref(),
            Ok("http://allotd.example.org:7070")
        );
        for bad in [
            "",
            "https://allotd:7070",
            "unix:///run/x.sock",
            "a b:7070",
            "http://",
        ] {
            assert!(parse_server(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn weights_are_positive_numbers() {
        assert_eq!(parse_weight("2"), Ok(2.0));
        assert_eq!(parse_weight("0.5"), Ok(0.5));
        for bad in ["0", "-1", "NaN", "inf", "two", ""] {
            assert!(parse_weight(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_root_cause_is_the_innermost_error() {
        let e = anyhow::anyhow!("connection refused").context("transport error");
        let boxed: Box<dyn std::error::Error + 'static> = e.into();
        assert_eq!(root_cause(boxed.as_ref()), "connection refused");
    }
}
