//! Commands against the allocator service allotd, over gRPC on TCP: the users'
//! `submit`, `queue`, `status`, `logs`, `cancel`, `hold`, `release`, `requeue`,
//! `update` and `share`, the managers' `budget set`, and
//! the operators' cluster-wide `nodes [drain|undrain]`.
//!
//! What can be checked without allotd is checked here first and reported like clap's
//! own usage errors, each naming the flag and the fix; allotd still checks everything
//! (other clients exist) and answers in the same `field: fix` form.

mod reports;
mod session;
mod view;

use crate::connect::Conn;
use crate::duration;
use crate::failure::{block_on, Failure};
use crate::usage::{check_contract, parse_hook, Usage};
use allot_fairshare::cluster::MAX_GPUS_PER_NODE;
use allot_proto::v1::nodes_client::NodesClient;
use allot_proto::v1::org_client::OrgClient;
use allot_proto::v1::workloads_client::WorkloadsClient;
use allot_proto::v1::{
    CancelRequest, ControlRequest, ControlResponse, GetRequest, GetTreeRequest, GetTreeResponse,
    HistoryRequest, ListNodesRequest, ListRequest, LogStream, LogsRequest, NodeDrainRequest,
    SetWeightRequest, SubmitRequest, UpdateRequest, UsageRequest, WatchRequest, Workload,
    WorkloadSpec, WorkloadState,
};
use serde_json::{json, Value};
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Duration;
use tonic::transport::Endpoint;

/// Where allotd listens unless `--server` or `$ALLOT_SERVER` says otherwise.
pub const DEFAULT_SERVER: &str = "https://127.0.0.1:7070";

/// Where allotd listens, when given after the subcommand.
#[derive(clap::Args, Debug)]
pub struct Server {
    /// allotd's address: HOST:PORT or https://HOST:PORT [env: ALLOT_SERVER] [default: https://127.0.0.1:7070].
    // No env or default here: those live on the root flag (`allot --server X queue`),
    // so that this one, typed after the subcommand, is the only thing that beats it.
    // Global so that `allot nodes --server X drain N` works as well as after `drain`.
    #[arg(long, global = true, value_name = "ADDR", value_parser = parse_server)]
    server: Option<String>,
}

/// `allot submit`.
#[derive(clap::Args, Debug)]
pub struct SubmitArgs {
    #[command(flatten)]
    conn: Server,
    /// The project charged for the GPU time [default: $ALLOT_PROJECT, else project = in ~/.config/allot/config.toml, else the only project you are a member of].
    #[arg(long, value_name = "P", env = "ALLOT_PROJECT")]
    project: Option<String>,
    /// GPUs on each node: 1 to 64 (allotd says which node sizes this cluster has).
    #[arg(long, value_name = "N", default_value_t = 1)]
    gpus: u32,
    /// Nodes; N > 1 is a gang that takes N whole nodes, all started together or none.
    #[arg(long, value_name = "N", default_value_t = 1)]
    nodes: u32,
    /// CPUs reserved on each node, and its cgroup's CPU limit [absent: none reserved,
    /// no limit].
    #[arg(long, value_name = "N")]
    cpus: Option<u32>,
    /// Memory reserved on each node, and its cgroup's limit, with a unit: 64G, 512M
    /// (rounded up to whole GB), 1T [absent: none reserved, no limit].
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_gb)]
    memory: Option<u32>,
    /// Protected runtime: not preempted before it lapses (0: preemptible at any time). 8h, 1.5h, 90min, or as Slurm: HH:MM:SS, D-HH:MM:SS [default: the class's, from allotd.toml; else 0].
    #[arg(long, value_name = "DURATION", value_parser = duration::parse_job)]
    min_runtime: Option<u64>,
    /// Hard limit: ended when it is reached. 8h, 1.5h, 90min, or as Slurm: HH:MM:SS, D-HH:MM:SS [default: the class's; else none].
    #[arg(long, value_name = "DURATION", value_parser = duration::parse_job)]
    time_limit: Option<u64>,
    /// It can resume from a checkpoint, so preempting it loses little.
    #[arg(long)]
    resumable: bool,
    /// When preempted or its node is lost, end (`preempted` / `failed`) instead of waiting in the queue again [default: requeue; the work starts over unless --resumable].
    #[arg(long)]
    no_requeue: bool,
    /// Order inside the project (higher first); never ahead of other projects.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    priority: i32,
    /// Workload class: batch, debug, interactive or training [absent: allotd's
    /// default, batch].
    #[arg(long, value_name = "NAME")]
    class: Option<String>,
    /// How to ask for a checkpoint before preemption: signal:USR1, exec:CMD or http:URL.
    #[arg(long, value_name = "HOOK", value_parser = parse_hook)]
    checkpoint: Option<String>,
    /// Warn the job with this signal DURATION before its time limit (as Slurm's --signal; DURATION absent: 60s) [absent: no warning; no signal is ever sent unasked].
    #[arg(long, value_name = "SIG[@DURATION]", value_parser = crate::usage::parse_signal)]
    signal: Option<(String, u64)>,
    /// Submit as this user; must be who your token proves [absent: that user].
    #[arg(long, value_name = "NAME")]
    user: Option<String>,
    /// Which of your environment variables the job gets: ALL, NONE, or VAR[,VAR…]. allotd stores the environment with the workload and sends it to the hosts that run it (ALLOT_TOKEN is never sent): keep secrets out of it.
    #[arg(long, value_name = "ALL|NONE|VARS", default_value = "ALL")]
    export: String,
    /// Set one variable for the job (repeatable; wins over --export).
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Where the job starts on every host [default: this directory]; must exist there.
    #[arg(long, value_name = "DIR")]
    chdir: Option<std::path::PathBuf>,
    /// Stdout file: a name in your directory of the host's log directory (capped, `allot logs` reads it), or absolute or ./… (under --chdir): a file of your own, opened as you on the host, as sbatch -o. %j workload, %r run, %n node rank, %u user, %x job name, %% a % [default: WORKLOAD/RUN.RANK.out in the log directory].
    #[arg(long, value_name = "PATTERN")]
    output: Option<String>,
    /// Stderr file name, as --output [default: the agent's].
    #[arg(long, value_name = "PATTERN")]
    error: Option<String>,
    /// A name for the job (as sbatch's -J): shown by queue and status, `queue --name` finds it, %x in --output puts it in a file name; the job sees it as ALLOT_JOB_NAME.
    #[arg(long, short = 'J', value_name = "NAME")]
    name: Option<String>,
    /// An array, as sbatch --array: one workload per index (0-99, 1,3,5-7, 0-15:4), %N to run at most N at once; each sees ALLOT_ARRAY_ID and ALLOT_ARRAY_INDEX, and %A/%a in --output.
    #[arg(long, value_name = "SPEC", value_parser = parse_array)]
    array: Option<String>,
    /// Start once these have started (or ended): ID[,ID…]; an array's id stands for all its elements.
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    after: Vec<String>,
    /// Start once these have completed; ended with the reason if one fails.
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    afterok: Vec<String>,
    /// Start once these have failed (or been stopped); ended with the reason if one completes.
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    afternotok: Vec<String>,
    /// Start once these have ended, however.
    #[arg(long, value_name = "IDS", value_delimiter = ',')]
    afterany: Vec<String>,
    /// Dependencies as sbatch writes them: afterok:12:13,afterany:14, singleton.
    #[arg(long, short = 'd', value_name = "DEPS")]
    dependency: Option<String>,
    /// Start only once no earlier workload of yours with this --name is left.
    #[arg(long)]
    singleton: bool,
    /// Not before this time (UTC): now+1h, 16:00, 2026-12-24, 2026-12-24T16:00.
    #[arg(long, value_name = "TIME", value_parser = duration::parse_begin)]
    begin: Option<i64>,
    /// Only nodes with one of these GPU types: h100, b200, ... (`allot nodes` shows each node's) [default: any].
    #[arg(long, value_name = "TYPES", value_delimiter = ',')]
    gpu_type: Vec<String>,
    /// Only nodes with every one of these features (the agents' features = [...]): nvlink,ib or nvlink&ib.
    #[arg(long, short = 'C', value_name = "FEATURES", value_parser = check_constraint)]
    constraint: Option<String>,
    /// Only this cluster's nodes.
    #[arg(long, short = 'M', value_name = "NAME")]
    cluster: Option<String>,
    /// Only these nodes, as Slurm writes them: gpu[01-04],gpu07 (a job of fewer nodes runs on some of them).
    #[arg(long, short = 'w', value_name = "HOSTS", value_parser = check_hostlist)]
    nodelist: Option<String>,
    /// Never these nodes: gpu[01-04],gpu07.
    #[arg(long, short = 'x', value_name = "HOSTS", value_parser = check_hostlist)]
    exclude: Option<String>,
    /// Tell you (the site's webhooks or mail, allotd.toml [notify]) when it: end, fail, preempt, time-limit, idle (its GPUs unused for the host's idle_after), or all.
    #[arg(long, value_name = "EVENTS", value_delimiter = ',')]
    notify: Vec<String>,
    /// Submit it held: it waits until `allot release`.
    #[arg(long, short = 'H')]
    hold: bool,
    /// Print `{"id": ...}` (with --wait, then the ended workload as `status --json` prints it).
    #[arg(long)]
    json: bool,
    /// Wait for the workload to end, saying on stderr when it starts, is requeued and ends; exit with its exit status, as srun does (see `allot status`).
    #[arg(long)]
    wait: bool,
    /// A batch script to run instead of a command (as sbatch): its #ALLOT and #SBATCH lines are read as flags (the command line wins); the words after `--` are its arguments.
    #[arg(value_name = "SCRIPT")]
    script: Option<std::path::PathBuf>,
    /// The command to run, after `--`.
    #[arg(last = true, value_name = "CMD")]
    argv: Vec<String>,
}

/// `allot run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    submit: SubmitArgs,
    /// A session: the command runs on a terminal, and this one is attached to it (keys, window size, Ctrl-C and Ctrl-Z go to it); ~. detaches, `allot attach ID` comes back [class default: interactive].
    #[arg(long)]
    pty: bool,
}

/// `allot submit` parsed again with a script's directives before the command line's
/// flags: the later of two wins.
#[derive(clap::Parser, Debug)]
#[command(name = "allot submit", args_override_self = true)]
struct SubmitAgain {
    #[command(flatten)]
    a: SubmitArgs,
}

/// The submission with its script's directives, and the script's text.
fn with_script(a: SubmitArgs) -> Result<(SubmitArgs, String), Failure> {
    let Some(path) = a.script.clone() else {
        return Ok((a, String::new()));
    };
    let s = crate::script::read(&path).map_err(Failure::Refused)?;
    // The command line as typed, after the subcommand: it comes last, so it wins.
    let typed: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|w| w.to_string_lossy().into_owned())
        .skip_while(|w| w != "submit")
        .skip(1)
        .collect();
    let words = std::iter::once("allot submit".to_string())
        .chain(s.flags.iter().cloned())
        .chain(typed);
    let again = <SubmitAgain as clap::Parser>::try_parse_from(words).map_err(|e| {
        Failure::Refused(format!(
            "script {}: its directives do not read as flags: {}",
            path.display(),
            e.to_string().trim()
        ))
    })?;
    // Lists add up in clap; a list given on the command line replaces the script's.
    let mut b = again.a;
    let lists = [
        (&mut b.gpu_type, &a.gpu_type),
        (&mut b.notify, &a.notify),
        (&mut b.env, &a.env),
        (&mut b.after, &a.after),
        (&mut b.afterok, &a.afterok),
        (&mut b.afternotok, &a.afternotok),
        (&mut b.afterany, &a.afterany),
    ];
    for (merged, typed) in lists {
        if !typed.is_empty() {
            merged.clone_from(typed);
        }
    }
    Ok((b, s.text))
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
    /// Only workloads of this name (`submit --name`).
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
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

/// `allot cancel`: ids, or filters over live work (as `scancel -u -t`).
#[derive(clap::Args, Debug)]
pub struct CancelArgs {
    #[command(flatten)]
    conn: Server,
    /// Workload ids.
    ids: Vec<String>,
    /// Every live workload of this user.
    #[arg(long, value_name = "U")]
    user: Option<String>,
    /// Every live workload of this project.
    #[arg(long, value_name = "P")]
    project: Option<String>,
    /// Every live workload of this name.
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// With the filters: only pending, or only running, workloads.
    #[arg(long, value_enum)]
    state: Option<LiveState>,
    /// Print each cancelled workload as a JSON object, one a line.
    #[arg(long)]
    json: bool,
}

/// `allot hold`, `allot release`.
#[derive(clap::Args, Debug)]
pub struct ControlArgs {
    #[command(flatten)]
    conn: Server,
    /// Workload ids; an array's id stands for all its elements, ARRAY_INDEX for one.
    #[arg(required = true)]
    ids: Vec<String>,
    /// Print each workload as a JSON object, one a line.
    #[arg(long)]
    json: bool,
}

/// `allot history`.
#[derive(clap::Args, Debug)]
pub struct HistoryArgs {
    #[command(flatten)]
    conn: Server,
    /// Only this user's runs [default: yours, unless you manage or operate].
    #[arg(long, value_name = "U")]
    user: Option<String>,
    /// Only this project's runs.
    #[arg(long, value_name = "P")]
    project: Option<String>,
    /// Runs that ended since: a duration back (7d, 36h) or a time (2026-12-01, UTC).
    #[arg(long, value_name = "WHEN", default_value = "7d", value_parser = duration::parse_since)]
    since: i64,
    /// Runs that started before this time [default: now].
    #[arg(long, value_name = "WHEN", value_parser = duration::parse_since)]
    until: Option<i64>,
    /// Only runs that ended so: completed, failed, timed-out, cancelled, preempted, requeued, running.
    #[arg(long, value_name = "S")]
    state: Option<String>,
    /// At most this many runs, newest first.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    limit: u32,
    /// One JSON array of runs.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// CSV with a header line.
    #[arg(long)]
    csv: bool,
}

/// `allot usage`.
#[derive(clap::Args, Debug)]
pub struct UsageArgs {
    #[command(flatten)]
    conn: Server,
    /// Group by user, project or team (a project's parent group).
    #[arg(long, value_name = "BY", default_value = "project", value_parser = ["user", "project", "team"])]
    by: String,
    /// From: a duration back (30d) or a time (2026-11-01, UTC).
    #[arg(long, value_name = "WHEN", default_value = "30d", value_parser = duration::parse_since)]
    since: i64,
    /// To [default: now].
    #[arg(long, value_name = "WHEN", value_parser = duration::parse_since)]
    until: Option<i64>,
    /// One line per day or week [default: the whole window].
    #[arg(long, value_name = "PERIOD", value_parser = ["day", "week"])]
    per: Option<String>,
    /// One JSON array of rows.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// CSV with a header line.
    #[arg(long)]
    csv: bool,
}

/// `allot requeue`.
#[derive(clap::Args, Debug)]
pub struct RequeueArgs {
    #[command(flatten)]
    control: ControlArgs,
    /// Hold it once it is back in the queue (as scontrol requeuehold).
    #[arg(long)]
    hold: bool,
}

/// `allot update`.
#[derive(clap::Args, Debug)]
pub struct UpdateArgs {
    #[command(flatten)]
    control: ControlArgs,
    /// A new time limit (a user may only shorten it).
    #[arg(long, value_name = "DURATION", value_parser = duration::parse_job)]
    time_limit: Option<u64>,
    /// A new priority within the project (a user may only lower it).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    priority: Option<i32>,
    /// A new begin time (UTC), as submit --begin; `now` lifts it.
    #[arg(long, value_name = "TIME", value_parser = duration::parse_begin)]
    begin: Option<i64>,
}

/// Clap value parser for `--constraint`: features joined by `,` or `&` (Slurm's AND);
/// `|` (OR) is refused rather than read as AND.
fn check_constraint(s: &str) -> Result<String, String> {
    if s.contains('|') || s.contains('[') {
        return Err(format!(
            "{s:?}: only features that must all be there (a,b or a&b); OR and brackets are not supported"
        ));
    }
    Ok(s.to_string())
}

/// The features of a checked `--constraint`.
fn features(s: &str) -> Vec<String> {
    s.split([',', '&'])
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(String::from)
        .collect()
}

/// Clap value parser for `--nodelist` and `--exclude`: checked here, expanded when
/// sent.
fn check_hostlist(s: &str) -> Result<String, String> {
    allot_common::hostlist::expand(s).map(|_| s.to_string())
}

/// The names a checked host list stands for.
fn hosts(s: Option<&str>) -> Vec<String> {
    s.map(|s| allot_common::hostlist::expand(s).unwrap_or_default())
        .unwrap_or_default()
}

/// Clap value parser for `--array`: checked here, read again by allotd.
fn parse_array(s: &str) -> Result<String, String> {
    allot_common::array::parse(s)
        .map(|_| s.trim().to_string())
        .map_err(|e| e.trim_start_matches("array: ").to_string())
}

/// The dependencies of a submission: `--after*` flags and sbatch's `--dependency`
/// (`afterok:12:13,afterany:14`, `singleton`); the second of the pair says whether
/// `singleton` was among them.
fn dependencies(a: &SubmitArgs) -> Result<(Vec<allot_proto::v1::Dependency>, bool), String> {
    let mut out = Vec::new();
    let mut add = |kind: &str, id: &str| -> Result<(), String> {
        let id = id.trim();
        let ok = id.split_once('_').map_or(id, |(a, _)| a);
        if ok.is_empty() || !ok.chars().all(|c| c.is_ascii_digit()) {
            return Err(format!(
                "--{kind}: {id:?} is not a workload id (a number, as `allot queue` shows)"
            ));
        }
        out.push(allot_proto::v1::Dependency {
            kind: kind.into(),
            id: id.into(),
        });
        Ok(())
    };
    for (kind, ids) in [
        ("after", &a.after),
        ("afterok", &a.afterok),
        ("afternotok", &a.afternotok),
        ("afterany", &a.afterany),
    ] {
        for id in ids {
            add(kind, id)?;
        }
    }
    let mut singleton = false;
    for part in a.dependency.iter().flat_map(|d| d.split(',')) {
        let mut words = part.split(':');
        match words.next().unwrap_or_default().trim() {
            "singleton" => singleton = true,
            kind @ ("after" | "afterok" | "afternotok" | "afterany") => {
                let mut any = false;
                for id in words {
                    // Slurm's +time on `after` is not kept: started is enough.
                    add(kind, id.split('+').next().unwrap_or(id))?;
                    any = true;
                }
                if !any {
                    return Err(format!("--dependency: {part:?} names no workload; write {kind}:ID[:ID]"));
                }
            }
            other => {
                return Err(format!(
                    "--dependency: {other:?} is not a dependency allot knows; use after, afterok, afternotok, afterany (each :ID[:ID]) or singleton"
                ))
            }
        }
    }
    Ok((out, singleton))
}

/// A live state, for `cancel --state`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum LiveState {
    /// Waiting for GPUs.
    Pending,
    /// Holding GPUs.
    Running,
}

/// `allot status` and `allot watch`.
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

/// `allot logs`.
#[derive(clap::Args, Debug)]
pub struct LogsArgs {
    #[command(flatten)]
    conn: Server,
    /// The workload id.
    id: String,
    /// Keep reading while the run lives (without --run: on into the next run when the workload is requeued); ends when it has ended and everything was read.
    #[arg(short, long)]
    follow: bool,
    /// Which run: 1 is the first [default: the latest].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    run: Option<u32>,
    /// Which node of a gang, by rank (0 is the first node).
    #[arg(long, value_name = "R", default_value_t = 0)]
    rank: u32,
    /// Standard error instead of standard output.
    #[arg(long)]
    stderr: bool,
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
    /// Set a group's weight among its siblings: its share of its parent is weight ÷ the siblings' sum.
    Set(BudgetSetArgs),
}

/// `allot budget set`.
#[derive(clap::Args, Debug)]
pub struct BudgetSetArgs {
    #[command(flatten)]
    conn: Server,
    /// The group (org, team or project) in the fair-share tree.
    name: String,
    /// The new weight among the group's siblings, a positive number (not a percentage): weights 1 and 3 give 25% and 75%.
    #[arg(
        long,
        value_name = "W",
        required_unless_present = "share",
        allow_negative_numbers = true,
        value_parser = parse_weight
    )]
    weight: Option<f64>,
    /// The old name of --weight, refused: it read as a percentage and set a weight.
    #[arg(long, value_name = "W", hide = true, allow_negative_numbers = true)]
    share: Option<String>,
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
// Parsed once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(clap::Subcommand, Debug)]
pub enum Remote {
    /// Queue a workload: the command after `--`, on --nodes × --gpus GPUs.
    Submit(SubmitArgs),
    /// Run a command and wait for it, as srun: a live line while it waits, then its output (or, with --pty, this terminal attached to it); exits with its status.
    Run(RunArgs),
    /// Attach this terminal to a running session (`allot run --pty`) again; ~. detaches.
    Attach(session::AttachArgs),
    /// Pending and running workloads, and why each pending one waits.
    Queue(QueueArgs),
    /// One workload in full: its contract, where it runs, why it waits.
    Status(IdArgs),
    /// Cancel workloads: by id (several at once), or every live one matching --user, --project, --name and --state.
    Cancel(CancelArgs),
    /// Follow a workload to its end: a line each time it starts, is requeued or ends; exits with its exit status.
    Watch(IdArgs),
    /// Keep pending workloads out of the queue until `allot release` (the owner or an operator).
    Hold(ControlArgs),
    /// Let held workloads back into the queue, at their old place.
    Release(ControlArgs),
    /// Send running workloads back to the queue now: asked to checkpoint, they wait again at their old place.
    Requeue(RequeueArgs),
    /// Change pending workloads: --time-limit, --priority, --begin (a user may only shorten and lower).
    Update(UpdateArgs),
    /// Every run that ended in a window, and those running (as sacct): nodes, GPUs, exit code, end reason, GPU-hours.
    History(HistoryArgs),
    /// GPU-hours received by user, project or team, per day or week (as sreport), beside what each was entitled to.
    Usage(UsageArgs),
    /// A workload's output, from the node that ran it: the latest run's unless --run; -f follows it.
    Logs(LogsArgs),
    /// The fair-share tree: each group's share, budget, usage and served ratio.
    Share(ShareArgs),
    /// Managers: change the fair-share tree.
    #[command(subcommand)]
    Budget(BudgetCommand),
    /// The cluster's nodes: state, free GPUs, health and drains; drain or undrain one.
    Nodes(NodesArgs),
}

/// Clap value parser for `--server`: `HOST:PORT` gets `https://` in front; plain
/// `http://` is for a loopback allotd only (a token must not cross a network in
/// the clear).
pub(crate) fn parse_server(s: &str) -> Result<String, String> {
    let s = s.trim();
    let uri = if s.contains("://") {
        s.to_string()
    } else {
        format!("https://{s}")
    };
    let parsed = uri.parse::<tonic::transport::Uri>().ok();
    let host = parsed.as_ref().and_then(|u| u.host()).unwrap_or("");
    let ok = !host.is_empty()
        && match parsed.as_ref().and_then(|u| u.scheme_str()) {
            Some("https") => true,
            Some("http") => allot_common::net::is_loopback_host(host),
            _ => false,
        }
        && Endpoint::from_shared(uri.clone()).is_ok();
    if ok {
        Ok(uri)
    } else if uri.starts_with("http://") {
        Err(
            "plain http:// is for a loopback allotd only; use HOST:PORT or https://HOST:PORT"
                .into(),
        )
    } else {
        Err("expected HOST:PORT or https://HOST:PORT (e.g. allotd.example.org:7070)".into())
    }
}

/// Clap value parser for `--weight`: weights are relative, within the core's range.
fn parse_weight(s: &str) -> Result<f64, String> {
    use allot_fairshare::tree::{weight_ok, MAX_WEIGHT, MIN_WEIGHT};
    match s.trim().parse::<f64>() {
        Ok(w) if weight_ok(w) => Ok(w),
        _ => Err(format!("expected a positive number from {MIN_WEIGHT} to {MAX_WEIGHT} (e.g. 2 or 0.5): the group's weight relative to its siblings")),
    }
}

/// Checks what clap cannot express, each message in the form `--flag value: fix`.
pub fn validate(cmd: &Remote) -> Result<(), Usage> {
    match cmd {
        Remote::Submit(a) => validate_submit(&["submit"], a),
        Remote::Run(a) => validate_run(a),
        Remote::Cancel(a) if a.ids.is_empty() && a.user.is_none() && a.project.is_none() && a.name.is_none() => Err(Usage {
            path: &["cancel"],
            message: "say what to cancel: workload ids (allot cancel 12 13), or --user, --project or --name (with --state pending|running) for every live workload that matches".into(),
        }),
        Remote::Cancel(a) if a.state.is_some() && a.user.is_none() && a.project.is_none() && a.name.is_none() => Err(Usage {
            path: &["cancel"],
            message: "--state narrows --user, --project or --name; give one of them too".into(),
        }),
        Remote::Budget(BudgetCommand::Set(a)) => match &a.share {
            // Refused rather than taken with a warning: `--share 30` meant 30% to whoever
            // typed it, and setting weight 30 changes every sibling's share at once.
            Some(share) => Err(Usage {
                path: &["budget", "set"],
                message: format!(
                    "--share was renamed --weight: the value is a weight among the group's siblings (its share is weight ÷ the siblings' sum), not a percentage; `allot share` shows the weights, then: allot budget set {} --weight {share}",
                    a.name
                ),
            }),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

/// `allot run` takes `submit`'s flags but those that make no sense for work one
/// waits for at the terminal.
fn validate_run(a: &RunArgs) -> Result<(), Usage> {
    let s = &a.submit;
    let refuse = |flag: &str, why: &str| {
        Err(Usage {
            path: &["run"],
            message: format!("{flag}: {why}"),
        })
    };
    if let Some(script) = &s.script {
        return refuse(
            &script.display().to_string(),
            "allot run takes the command after `--` (allot run --pty -- bash); a batch script is for allot submit",
        );
    }
    for (given, flag) in [
        (s.array.is_some(), "--array"),
        (s.hold, "--hold"),
        (s.wait, "--wait"),
        (s.json, "--json"),
    ] {
        if given {
            return refuse(
                flag,
                "not for allot run, which waits for one workload at the terminal; use allot submit",
            );
        }
    }
    if a.pty && s.nodes > 1 {
        return refuse(
            "--nodes",
            "a session's terminal is on one node; give --pty with --nodes 1",
        );
    }
    validate_submit(&["run"], s)
}

fn validate_submit(path: &'static [&'static str], a: &SubmitArgs) -> Result<(), Usage> {
    let usage = |message: String| Err(Usage { path, message });
    if !(1..=MAX_GPUS_PER_NODE).contains(&a.gpus) {
        return usage(format!(
            "--gpus {}: ask for 1 to {MAX_GPUS_PER_NODE} GPUs per node",
            a.gpus
        ));
    }
    if a.nodes == 0 {
        return usage("--nodes 0: ask for 1 node, or N > 1 for a gang of N whole nodes".into());
    }
    check_contract(&["submit"], a.min_runtime.unwrap_or(0), a.time_limit)?;
    // `--signal` without `--time-limit` is allotd's to judge: the class may give one.
    if a.argv.is_empty() && a.script.is_none() {
        return usage("say what the workload runs: a command after `--` (allot submit --project P --gpus 8 -- python train.py), or a batch script (allot submit job.sh)".into());
    }
    if let Err(m) = crate::jobenv::resolve(&a.export, &a.env, crate::jobenv::own_vars()) {
        return usage(m);
    }
    for (flag, p) in [("--output", &a.output), ("--error", &a.error)] {
        if let Some(Err(e)) = p
            .as_deref()
            .map(|p| allot_common::fields::check_pattern(flag, p))
        {
            return usage(format!(
                "{flag} {}: {}",
                p.as_deref().unwrap_or(""),
                e.message
            ));
        }
    }
    Ok(())
}

impl Remote {
    /// The connection flags of whichever command this is.
    fn conn(&self) -> &Server {
        match self {
            Remote::Submit(a) => &a.conn,
            Remote::Run(a) => &a.submit.conn,
            Remote::Attach(a) => &a.conn,
            Remote::Queue(a) => &a.conn,
            Remote::Status(a) | Remote::Watch(a) => &a.conn,
            Remote::Cancel(a) => &a.conn,
            Remote::Hold(a) | Remote::Release(a) => &a.conn,
            Remote::Requeue(a) => &a.control.conn,
            Remote::Update(a) => &a.control.conn,
            Remote::History(a) => &a.conn,
            Remote::Usage(a) => &a.conn,
            Remote::Logs(a) => &a.conn,
            Remote::Share(a) => &a.conn,
            Remote::Budget(BudgetCommand::Set(a)) => &a.conn,
            Remote::Nodes(a) => &a.conn,
        }
    }
}

/// Runs one allotd command to completion and says how the process should exit;
/// `server` is the one given before the subcommand, or from the environment.
pub fn run(cmd: Remote, server: String) -> ExitCode {
    let raw = cmd.conn().server.clone().unwrap_or(server);
    // Checked here, not when the flags are parsed: a bad ALLOT_SERVER must not
    // break the commands that never talk to allotd.
    let server = match parse_server(&raw) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("allot: --server / ALLOT_SERVER {raw:?}: {e}");
            return ExitCode::from(2);
        }
    };
    block_on(dispatch(cmd, server))
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

/// A connection to allotd with the caller's token, connected at once so that an
/// unreachable server is reported by address before anything else happens.
async fn channel(server: &str) -> Result<Conn, Failure> {
    // Without a token, the local agent vouches for the caller (as MUNGE does).
    if crate::connect::token().map_err(Failure::Connect)?.is_none() {
        let socket = std::env::var_os("ALLOT_SOCKET")
            .filter(|s| !s.is_empty())
            .map_or_else(
                || std::path::PathBuf::from(crate::local::DEFAULT_SOCKET),
                std::path::PathBuf::from,
            );
        if socket.exists() {
            let ch = allot_proto::uds::connect(&socket)
                .await
                .map_err(|e| Failure::Connect(e.to_string()))?;
            return crate::connect::authed(ch).map_err(Failure::Connect);
        }
    }
    let fail = |why: String| {
        Failure::Connect(format!(
            "cannot reach allotd at {server}: {why}; is it running? (set --server or ALLOT_SERVER)"
        ))
    };
    let endpoint = crate::connect::endpoint(server)
        .map_err(fail)?
        // Without these a black-holed address or a wedged server hangs the terminal.
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(60));
    let ch = endpoint.connect().await.map_err(|e| fail(root_cause(&e)))?;
    crate::connect::authed(ch).map_err(Failure::Connect)
}

/// Pending then running, one List call each: the proto takes one state per call, and
/// asking for all states would fetch the whole history to show the live part.
async fn list_active(
    c: &mut WorkloadsClient<Conn>,
    filter: &ListRequest,
) -> Result<Vec<Workload>, Failure> {
    let mut lists = Vec::with_capacity(2);
    // Pending first: a workload that starts between the calls then shows once, as
    // running, instead of falling between them.
    for state in [WorkloadState::Pending, WorkloadState::Running] {
        let r = c
            .list(ListRequest {
                state: state as i32,
                ..filter.clone()
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

/// Refuses `--project P` when P is not a project of the fair-share tree: allotd would
/// list nothing, which reads as "nothing queued".
fn check_project(tree: &GetTreeResponse, project: &str) -> Result<(), Failure> {
    let group = tree.groups.iter().find(|g| g.name == project);
    if group.is_some_and(|g| g.project) {
        return Ok(());
    }
    // Groups come parents first, so one pass finds every project under `project`.
    let mut under: std::collections::HashSet<&str> = std::collections::HashSet::new();
    under.insert(project);
    let mut inside = Vec::new();
    for g in &tree.groups {
        if under.contains(g.parent.as_str()) {
            under.insert(&g.name);
            if g.project {
                inside.push(g.name.as_str());
            }
        }
    }
    let all: Vec<&str> = tree
        .groups
        .iter()
        .filter(|g| g.project)
        .map(|g| g.name.as_str())
        .collect();
    let known = if all.is_empty() {
        "allotd has no projects yet".to_string()
    } else {
        format!("the projects are {}", names(&all))
    };
    let why = match group {
        Some(_) if !inside.is_empty() => format!(
            "{project} is a group of the fair-share tree, not a project; its projects: {}",
            names(&inside)
        ),
        Some(_) => format!("{project} is a group of the fair-share tree, not a project; {known}"),
        None => format!("no project {project}; {known}"),
    };
    Err(Failure::Refused(format!(
        "--project {project}: {why} (`allot share` shows the tree)"
    )))
}

/// A list of names for a message, the first few of a long one.
fn names(all: &[&str]) -> String {
    const SHOWN: usize = 12;
    let mut s = all
        .iter()
        .take(SHOWN)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if all.len() > SHOWN {
        s.push_str(&format!(" and {} more", all.len() - SHOWN));
    }
    s
}

/// After `cancel`: a running workload is only revoked by the call, so its state
/// still reads `running`, which looked as if the cancel had been ignored.
fn cancel_line(w: &Workload) -> String {
    match w.state() {
        WorkloadState::Running => format!(
            "cancel requested: workload {} is revoked now and ends after its checkpoint ladder",
            w.id
        ),
        s if view::is_final(s) => format!("workload {}: {}", w.id, view::state_name(s)),
        s => format!(
            "cancel requested: workload {} is {}; `allot status {}` shows when it ends",
            w.id,
            view::state_name(s),
            w.id
        ),
    }
}

/// The workload's bytes, as they came, on stdout at once (a follower reads them
/// live); a reader that went away ends `allot` as it would `cat`.
type Control<'a> = Pin<
    Box<
        dyn std::future::Future<Output = Result<tonic::Response<ControlResponse>, tonic::Status>>
            + Send
            + 'a,
    >,
>;

/// Hold, release, requeue or update each id on its own: one refusal does not stop
/// the others; a line (or a JSON object) for each workload changed.
async fn control<F>(server: &str, a: &ControlArgs, done: &str, call: F) -> Result<(), Failure>
where
    F: for<'c> Fn(&'c mut WorkloadsClient<Conn>, String) -> Control<'c>,
{
    let mut c = WorkloadsClient::new(channel(server).await?);
    let mut refused = 0;
    for id in &a.ids {
        match call(&mut c, id.clone()).await {
            Ok(r) => {
                for w in &r.get_ref().workloads {
                    if a.json {
                        println!("{}", view::workload_json(w));
                    } else {
                        println!("workload {} {done}: {}", w.id, view::state_name(w.state()));
                    }
                }
            }
            Err(e) => {
                refused += 1;
                eprintln!("error: workload {id}: {}", e.message());
            }
        }
    }
    if refused > 0 {
        return Err(Failure::Quiet);
    }
    Ok(())
}

fn write_out(data: &[u8]) -> Result<(), Failure> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(data).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(141),
        Err(e) => Err(Failure::Other(
            anyhow::Error::new(e).context("writing to stdout"),
        )),
    }
}

/// Follows workload `id` through `Workloads.Watch` until it ends, saying each change
/// of state, run or place through `say`; returns it as it ended.
async fn follow(ch: Conn, id: &str, say: impl Fn(String)) -> Result<Workload, Failure> {
    let mut s = WorkloadsClient::new(ch.clone())
        .watch(WatchRequest { id: id.into() })
        .await?
        .into_inner();
    let mut said = String::new();
    let mut last = None;
    while let Some(w) = s.message().await? {
        // A pending workload's explanation changes with the queue: said once per state.
        let key = format!("{:?} {} {:?}", w.state(), w.runs.len(), w.nodes);
        if key != said {
            say(view::watch_line(&w));
            said = key;
        }
        let done = view::is_final(w.state());
        last = Some(w);
        if done {
            break;
        }
    }
    match last.filter(|w| view::is_final(w.state())) {
        Some(w) => Ok(w),
        // The stream ended early (allotd restarted): ask once more.
        None => {
            let w = WorkloadsClient::new(ch)
                .get(GetRequest { id: id.into() })
                .await?
                .into_inner();
            if view::is_final(w.state()) {
                say(view::watch_line(&w));
                Ok(w)
            } else {
                Err(Failure::Refused(format!(
                    "the watch of workload {id} ended before the workload did (allotd restarted?); run `allot watch {id}` again"
                )))
            }
        }
    }
}

/// Prints what `req` reads of a workload's output to stdout, saying on stderr
/// where a later run's output begins.
async fn follow_logs(ch: Conn, req: LogsRequest) -> Result<(), Failure> {
    let mut s = WorkloadsClient::new(ch).logs(req).await?.into_inner();
    let mut shown = 0;
    while let Some(c) = s.message().await? {
        // Following into a later run: say where the output now comes from, on
        // stderr so that stdout stays the workload's own.
        if shown != 0 && c.run != shown {
            eprintln!("==> run {} on {} (lease {}) <==", c.run, c.node, c.lease_id);
        }
        shown = c.run;
        write_out(&c.data)?;
    }
    Ok(())
}

/// How a command that waited for a workload exits: with the job's status.
fn ended(w: &Workload) -> Result<(), Failure> {
    match view::exit_status(w) {
        0 => Ok(()),
        code => Err(Failure::JobEnded(code)),
    }
}

/// The submission `a` asks for, `script` being its batch script's text (empty:
/// none): its environment resolved, its directory and project found.
fn spec_of(a: &SubmitArgs, script: String) -> Result<WorkloadSpec, Failure> {
    let env = crate::jobenv::resolve(&a.export, &a.env, crate::jobenv::own_vars())
        .map_err(Failure::Refused)?;
    let here = std::env::current_dir().map_err(|e| {
        Failure::Refused(format!(
            "the current directory cannot be read ({e}); give --chdir DIR"
        ))
    })?;
    let cwd = crate::jobenv::workdir(a.chdir.as_deref(), &here);
    let (dependencies, singleton) = dependencies(a).map_err(Failure::Refused)?;
    let project = match a.project.clone() {
        Some(p) => p,
        None => crate::connect::default_project()
            .map_err(Failure::Refused)?
            .unwrap_or_default(),
    };
    let spec = WorkloadSpec {
        project,
        // allotd runs the work as whoever the token or the agent proves.
        user: a.user.clone().unwrap_or_default(),
        class: a.class.clone().unwrap_or_default(),
        gpus_per_node: a.gpus,
        nodes: a.nodes,
        cpu_per_node: a.cpus.unwrap_or(0),
        mem_per_node_gb: a.memory.unwrap_or(0),
        min_runtime_s: a.min_runtime,
        time_limit_s: a.time_limit,
        resumable: a.resumable,
        priority: a.priority,
        argv: a.argv.clone(),
        checkpoint_hook: a.checkpoint.clone().unwrap_or_default(),
        no_requeue: a.no_requeue,
        cwd: cwd.to_string_lossy().into_owned(),
        env: env
            .into_iter()
            .map(|(name, value)| allot_proto::v1::EnvVar { name, value })
            .collect(),
        output: a.output.clone().unwrap_or_default(),
        error: a.error.clone().unwrap_or_default(),
        warn_signal: a.signal.as_ref().map(|s| s.0.clone()).unwrap_or_default(),
        warn_before_s: a.signal.as_ref().map_or(0, |s| s.1),
        name: a.name.clone().unwrap_or_default(),
        dependencies,
        singleton: singleton || a.singleton,
        begin_unix: a.begin.unwrap_or(0),
        hold: a.hold,
        array: a.array.clone().unwrap_or_default(),
        // `any` (or nothing) asks for no type.
        gpu_types: a
            .gpu_type
            .iter()
            .filter(|t| !t.trim().is_empty() && t.trim() != "any")
            .map(|t| t.trim().to_lowercase())
            .collect(),
        constraint: a.constraint.as_deref().map(features).unwrap_or_default(),
        cluster: a.cluster.clone().unwrap_or_default(),
        nodelist: hosts(a.nodelist.as_deref()),
        exclude: hosts(a.exclude.as_deref()),
        script,
        has_script: false,
        notify: a.notify.clone(),
        pty: false,
    };
    Ok(spec)
}

async fn dispatch(cmd: Remote, server: String) -> Result<(), Failure> {
    match cmd {
        Remote::Submit(a) => {
            let (a, script) = with_script(a)?;
            let spec = spec_of(&a, script)?;
            let (project, gpus, nodes) = (spec.project.clone(), spec.gpus_per_node, spec.nodes);
            let ch = channel(&server).await?;
            let r = WorkloadsClient::new(ch.clone())
                .submit(SubmitRequest { spec: Some(spec) })
                .await?
                .into_inner();
            let id = r.id;
            if a.json {
                let mut v = json!({ "id": id });
                if let Some(w) = &r.workload {
                    v["contract"] = json!(view::contract_text(w));
                    v["workload"] = view::workload_json(w);
                }
                println!("{v}");
            } else {
                // allotd may have picked the project (the user's only one).
                let project = r
                    .workload
                    .as_ref()
                    .and_then(|w| w.spec.as_ref())
                    .map_or(project, |s| s.project.clone());
                match a.array.as_deref().map(allot_common::array::parse) {
                    Some(Ok(arr)) => println!(
                        "submitted array {id}: {} workloads (project {project}, {} each{})",
                        arr.indices.len(),
                        view::gpu_count(gpus, nodes),
                        if arr.limit > 0 {
                            format!(", at most {} at once", arr.limit)
                        } else {
                            String::new()
                        }
                    ),
                    _ => println!(
                        "submitted workload {id} (project {project}, {})",
                        view::gpu_count(gpus, nodes)
                    ),
                }
                // Said aloud: a job with no flags is free occupancy, and people
                // should know before it is preempted.
                if let Some(w) = &r.workload {
                    println!("contract: {}", view::contract_text(w));
                }
            }
            if a.wait {
                let w = follow(ch, &id, |l| eprintln!("{l}")).await?;
                if a.json {
                    println!("{}", view::workload_json(&w));
                }
                return ended(&w);
            }
        }
        Remote::Run(a) => {
            let RunArgs { submit: a, pty } = a;
            let mut spec = spec_of(&a, String::new())?;
            spec.pty = pty;
            if pty && spec.class.is_empty() {
                spec.class = "interactive".into();
            }
            let ch = channel(&server).await?;
            let r = WorkloadsClient::new(ch.clone())
                .submit(SubmitRequest { spec: Some(spec) })
                .await?
                .into_inner();
            // On stderr: stdout is the work's own.
            eprintln!(
                "allot: submitted workload {} ({})",
                r.id,
                r.workload
                    .as_ref()
                    .map_or_else(String::new, view::contract_text)
            );
            return session::run(ch, &r.id, pty).await;
        }
        Remote::Attach(a) => return session::attach(channel(&server).await?, &a.id).await,
        Remote::Watch(a) => {
            let w = follow(channel(&server).await?, &a.id, |l| println!("{l}")).await?;
            if a.json {
                println!("{}", view::workload_json(&w));
            }
            return ended(&w);
        }
        Remote::Queue(a) => {
            let ch = channel(&server).await?;
            if let Some(p) = &a.project {
                let tree = OrgClient::new(ch.clone())
                    .get_tree(GetTreeRequest {})
                    .await?
                    .into_inner();
                check_project(&tree, p)?;
            }
            let mut c = WorkloadsClient::new(ch);
            let filter = ListRequest {
                project: a.project.unwrap_or_default(),
                user: a.user.unwrap_or_default(),
                name: a.name.unwrap_or_default(),
                state: 0,
            };
            let workloads = match (a.state, a.all) {
                (None, false) => list_active(&mut c, &filter).await?,
                (state, _) => {
                    let state = state.map_or(WorkloadState::Unspecified, WorkloadState::from);
                    c.list(ListRequest {
                        state: state as i32,
                        ..filter
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
            let w = WorkloadsClient::new(channel(&server).await?)
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
            let mut c = WorkloadsClient::new(channel(&server).await?);
            let mut ids = a.ids.clone();
            let filtered = a.user.is_some() || a.project.is_some() || a.name.is_some();
            if filtered {
                let filter = ListRequest {
                    project: a.project.clone().unwrap_or_default(),
                    user: a.user.clone().unwrap_or_default(),
                    name: a.name.clone().unwrap_or_default(),
                    state: 0,
                };
                let live = list_active(&mut c, &filter).await?;
                ids.extend(
                    live.iter()
                        .filter(|w| match a.state {
                            Some(LiveState::Pending) => w.state() == WorkloadState::Pending,
                            Some(LiveState::Running) => w.state() == WorkloadState::Running,
                            None => true,
                        })
                        .map(|w| w.id.clone()),
                );
                if ids.is_empty() {
                    eprintln!("no live workload matches; nothing cancelled");
                }
            }
            // Each one on its own: one refusal does not keep the others running.
            let mut refused = 0;
            for id in ids {
                match c.cancel(CancelRequest { id: id.clone() }).await {
                    Ok(w) if a.json => println!("{}", view::workload_json(w.get_ref())),
                    Ok(w) => println!("{}", cancel_line(w.get_ref())),
                    Err(e) => {
                        refused += 1;
                        eprintln!("error: workload {id}: {}", e.message());
                    }
                }
            }
            if refused > 0 {
                return Err(Failure::Quiet);
            }
        }
        Remote::Hold(a) => {
            control(&server, &a, "held", |c, id| {
                Box::pin(async move { c.hold(ControlRequest { id, hold: false }).await })
            })
            .await?
        }
        Remote::Release(a) => {
            control(&server, &a, "released", |c, id| {
                Box::pin(async move { c.release(ControlRequest { id, hold: false }).await })
            })
            .await?
        }
        Remote::Requeue(r) => {
            let hold = r.hold;
            control(&server, &r.control, "requeued", move |c, id| {
                Box::pin(async move { c.requeue(ControlRequest { id, hold }).await })
            })
            .await?
        }
        Remote::Update(u) => {
            let (time_limit_s, priority, begin_unix) = (u.time_limit, u.priority, u.begin);
            if time_limit_s.is_none() && priority.is_none() && begin_unix.is_none() {
                return Err(Failure::Refused(
                    "nothing to change: give --time-limit, --priority or --begin".into(),
                ));
            }
            control(&server, &u.control, "updated", move |c, id| {
                Box::pin(async move {
                    c.update(UpdateRequest {
                        id,
                        time_limit_s,
                        priority,
                        begin_unix,
                    })
                    .await
                })
            })
            .await?
        }
        Remote::Logs(a) => {
            let req = LogsRequest {
                id: a.id.clone(),
                follow: a.follow,
                run: a.run.unwrap_or(0),
                rank: a.rank,
                stream: if a.stderr {
                    LogStream::Stderr
                } else {
                    LogStream::Stdout
                } as i32,
            };
            follow_logs(channel(&server).await?, req).await?;
            // Followed to its end: the job's own status, as `--wait` gives it.
            if a.follow {
                let w = WorkloadsClient::new(channel(&server).await?)
                    .get(GetRequest { id: a.id })
                    .await?
                    .into_inner();
                if view::is_final(w.state()) {
                    return ended(&w);
                }
            }
        }
        Remote::History(a) => {
            let r = WorkloadsClient::new(channel(&server).await?)
                .history(HistoryRequest {
                    user: a.user.unwrap_or_default(),
                    project: a.project.unwrap_or_default(),
                    since_unix: a.since,
                    until_unix: a.until.unwrap_or(0),
                    state: a.state.unwrap_or_default(),
                    limit: a.limit,
                })
                .await?
                .into_inner();
            if a.json {
                let v: Vec<Value> = r.runs.iter().map(reports::run_json).collect();
                println!("{}", serde_json::to_string(&v)?);
            } else if a.csv {
                print!("{}", reports::runs_csv(&r.runs));
            } else {
                print!("{}", reports::runs_table(&r.runs));
            }
            if r.truncated {
                eprintln!("more runs matched: narrow the window or raise --limit");
            }
        }
        Remote::Usage(a) => {
            let r = OrgClient::new(channel(&server).await?)
                .usage(UsageRequest {
                    by: a.by.clone(),
                    since_unix: a.since,
                    until_unix: a.until.unwrap_or(0),
                    per: a.per.unwrap_or_default(),
                })
                .await?
                .into_inner();
            if a.json {
                let v: Vec<Value> = r.rows.iter().map(reports::usage_json).collect();
                println!("{}", serde_json::to_string(&v)?);
            } else if a.csv {
                print!("{}", reports::usage_csv(&r.rows, &a.by));
            } else {
                print!("{}", reports::usage_table(&r, &a.by));
            }
        }
        Remote::Share(a) => {
            let t = OrgClient::new(channel(&server).await?)
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
            // Clap requires --weight unless --share is there, and validate() refused that.
            let Some(weight) = a.weight else {
                return Err(Failure::Refused(
                    "--weight W: say the group's new weight".into(),
                ));
            };
            let g = OrgClient::new(channel(&server).await?)
                .set_weight(SetWeightRequest {
                    name: a.name,
                    weight,
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
            let mut c = NodesClient::new(channel(&server).await?);
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
            Ok("https://127.0.0.1:7070")
        );
        assert_eq!(
            parse_server("http://127.0.0.1:7070").as_deref(),
            Ok("http://127.0.0.1:7070")
        );
        assert_eq!(
            parse_server(" allotd.example.org:7070 ").as_deref(),
            Ok("https://allotd.example.org:7070")
        );
        // A token must not cross a network in the clear.
        assert!(parse_server("http://allotd:7070")
            .unwrap_err()
            .contains("loopback"));
        for bad in [
            "",
            "http://allotd:7070",
            "unix:///run/x.sock",
            "a b:7070",
            "http://",
            "https://",
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

    /// `allot` with the allotd commands only, to parse arguments as the binary does.
    #[derive(clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        remote: Remote,
    }

    fn parse(args: &[&str]) -> Remote {
        use clap::Parser;
        let argv = std::iter::once("allot").chain(args.iter().copied());
        match Cli::try_parse_from(argv) {
            Ok(c) => c.remote,
            Err(e) => panic!("{args:?}: {e}"),
        }
    }

    fn refusal(args: &[&str]) -> String {
        match validate(&parse(args)) {
            Ok(()) => panic!("{args:?} accepted"),
            Err(u) => u.message,
        }
    }

    #[test]
    fn submit_checks_name_the_flag_and_the_fix() {
        fn with<'a>(extra: &[&'a str]) -> Vec<&'a str> {
            let mut v = vec!["submit", "--project", "p"];
            v.extend_from_slice(extra);
            v.extend_from_slice(&["--", "true"]);
            v
        }
        assert_eq!(
            refusal(&with(&["--gpus", "0"])),
            "--gpus 0: ask for 1 to 64 GPUs per node"
        );
        assert_eq!(
            refusal(&with(&["--gpus", "65"])),
            "--gpus 65: ask for 1 to 64 GPUs per node"
        );
        assert!(refusal(&with(&["--nodes", "0"])).starts_with("--nodes 0: ask for 1 node"));
        assert_eq!(
            refusal(&with(&["--min-runtime", "2h", "--time-limit", "1h"])),
            "--min-runtime 2h is longer than --time-limit 1h: the work would be killed before its protection ends"
        );
        assert!(validate(&parse(&with(&["--gpus", "64", "--nodes", "2"]))).is_ok());
        assert!(refusal(&["submit", "--project", "p"]).contains("`--`"));
    }

    #[test]
    fn share_is_refused_in_favour_of_weight() {
        let m = refusal(&["budget", "set", "vision", "--share", "30"]);
        assert!(m.starts_with("--share was renamed --weight"), "{m}");
        assert!(m.contains("not a percentage"), "{m}");
        assert!(m.ends_with("allot budget set vision --weight 30"), "{m}");
        assert!(validate(&parse(&["budget", "set", "vision", "--weight", "2"])).is_ok());
    }

    fn tree() -> GetTreeResponse {
        let g = |name: &str, parent: &str, project: bool| allot_proto::v1::Group {
            name: name.into(),
            parent: parent.into(),
            project,
            ..Default::default()
        };
        GetTreeResponse {
            groups: vec![
                g("ml", "", false),
                g("vision", "ml", true),
                g("nlp", "ml", true),
                g("infra", "", true),
            ],
            ..Default::default()
        }
    }

    fn refused(r: Result<(), Failure>) -> String {
        match r {
            Err(Failure::Refused(m)) => m,
            Err(_) => panic!("another failure"),
            Ok(()) => panic!("accepted"),
        }
    }

    #[test]
    fn unknown_projects_are_named_with_the_known_ones() {
        assert!(check_project(&tree(), "vision").is_ok());
        assert_eq!(
            refused(check_project(&tree(), "nope")),
            "--project nope: no project nope; the projects are vision, nlp, infra (`allot share` shows the tree)"
        );
        assert_eq!(
            refused(check_project(&tree(), "ml")),
            "--project ml: ml is a group of the fair-share tree, not a project; its projects: vision, nlp (`allot share` shows the tree)"
        );
        let many: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(names(&refs).ends_with("p11 and 8 more"), "{}", names(&refs));
    }

    #[test]
    fn cancel_says_whether_the_workload_has_ended() {
        let w = |state: WorkloadState| Workload {
            id: "3".into(),
            state: state as i32,
            ..Default::default()
        };
        assert_eq!(
            cancel_line(&w(WorkloadState::Running)),
            "cancel requested: workload 3 is revoked now and ends after its checkpoint ladder"
        );
        assert_eq!(
            cancel_line(&w(WorkloadState::Cancelled)),
            "workload 3: cancelled"
        );
        assert_eq!(
            cancel_line(&w(WorkloadState::Completed)),
            "workload 3: completed"
        );
    }

    #[test]
    fn the_root_cause_is_the_innermost_error() {
        let e = anyhow::anyhow!("connection refused").context("transport error");
        let boxed: Box<dyn std::error::Error + 'static> = e.into();
        assert_eq!(root_cause(boxed.as_ref()), "connection refused");
    }
}
