//! `allot`: one CLI for users, managers and operators.
//!
//! `version`; the users' and managers' commands against allotd (`submit`, `queue`,
//! `status`, `cancel`, `share`, `budget set`) and the cluster operators' `nodes`, in
//! `remote`; the operators' `xid explain|scan`; and the per-host operator commands
//! that talk to the local allot-agent (`leases`, `gpus [clear]`, `drain`, `undrain`,
//! `events`, `lease start|revoke`), in `local`.
//!
//! This file holds what every command shares: `--server` and `--socket` before the
//! subcommand, the grouped `--help`, usage errors in clap's layout, and a quiet exit
//! when the reader of stdout goes away (`allot queue | head -1`).

mod connect;
mod duration;
mod failure;
mod health_view;
mod jobenv;
mod local;
mod remote;
mod script;
mod size;
mod table;
mod terminal;
mod usage;
mod xid;

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "allot",
    version,
    about = "allot: GPU fair-share allocator CLI",
    after_help = "`allot drain` drains this host through its agent; `allot nodes drain NAME` \
        drains any node through allotd. --server and --socket go before or after the command."
)]
struct Cli {
    #[command(flatten)]
    conn: Connection,
    #[command(subcommand)]
    command: Command,
}

/// The connection flags as given before the subcommand (`allot --server X queue`);
/// the same flag after the subcommand wins.
#[derive(clap::Args)]
struct Connection {
    /// allotd's address, for the workload, fair-share and `nodes` commands: HOST:PORT or http://HOST:PORT.
    #[arg(
        long,
        value_name = "ADDR",
        env = "ALLOT_SERVER",
        default_value = remote::DEFAULT_SERVER
    )]
    server: String,
    /// The local agent's unix socket, for the host commands.
    #[arg(
        long,
        value_name = "PATH",
        env = "ALLOT_SOCKET",
        default_value = local::DEFAULT_SOCKET
    )]
    socket: PathBuf,
}

// Parsed once per process: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Print the version.
    Version,
    #[command(flatten)]
    Remote(remote::Remote),
    /// NVIDIA XID errors: what they mean and what allot does about them.
    #[command(subcommand)]
    Xid(xid::XidCommand),
    #[command(flatten)]
    Local(local::Local),
}

/// The top-level commands under headings, in this order.
///
/// Clap 4 puts every subcommand under one heading, and `allot drain` (this host) next
/// to `allot nodes` (`nodes drain`, the cluster) reads as two ways to do one thing;
/// the headings say which service each command talks to.
const GROUPS: &[(&str, &[&str])] = &[
    (
        "Workloads (allotd, --server)",
        &[
            "submit", "run", "attach", "queue", "status", "watch", "logs", "cancel", "hold",
            "release", "requeue", "update", "history",
        ],
    ),
    (
        "Fair share (allotd, --server)",
        &["share", "usage", "budget"],
    ),
    ("Cluster operators (allotd, --server)", &["nodes"]),
    (
        "This host (the local allot-agent, --socket)",
        &["leases", "gpus", "drain", "undrain", "events", "lease"],
    ),
    ("GPU errors", &["xid"]),
    ("Other", &["version", "help"]),
];

/// The heading for commands missing from [`GROUPS`], so that none is left out of help.
const UNGROUPED: &str = "Other";

/// The root command with the grouped command list in its help.
fn command() -> clap::Command {
    let cmd = Cli::command();
    let list = grouped_commands(&cmd);
    let header = cmd.get_styles().get_header();
    let (h, r) = (header.render(), header.render_reset());
    cmd.help_template(format!(
        "{{before-help}}{{about-with-newline}}\n{{usage-heading}} {{usage}}\n\n{list}\
         {h}Options:{r}\n{{options}}{{after-help}}"
    ))
}

/// The visible top-level commands (`help` included) under their [`GROUPS`] headings.
fn grouped_commands(cmd: &clap::Command) -> String {
    // Building adds the `help` subcommand; the clone keeps `cmd` unbuilt for clap.
    let mut built = cmd.clone();
    built.build();
    let subs: Vec<(String, String)> = built
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(|s| {
            let about = s.get_about().map(|a| a.to_string()).unwrap_or_default();
            (s.get_name().to_string(), about)
        })
        .collect();
    let width = subs.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let header = cmd.get_styles().get_header();
    let literal = cmd.get_styles().get_literal();
    let grouped = |name: &str| GROUPS.iter().any(|(_, names)| names.contains(&name));
    let mut out = String::new();
    for (heading, names) in GROUPS {
        // In GROUPS order, not clap's, so that each group reads as a workflow; a
        // command no group names goes under UNGROUPED, so none is left out.
        let members: Vec<&(String, String)> = names
            .iter()
            .filter_map(|n| subs.iter().find(|(s, _)| s == n))
            .chain(
                subs.iter()
                    .filter(|(s, _)| *heading == UNGROUPED && !grouped(s)),
            )
            .collect();
        if members.is_empty() {
            continue;
        }
        out.push_str(&format!(
            "{}{heading}:{}\n",
            header.render(),
            header.render_reset()
        ));
        for (name, about) in members {
            let pad = " ".repeat(width - name.len());
            out.push_str(&format!(
                "  {}{name}{}{pad}  {about}\n",
                literal.render(),
                literal.render_reset()
            ));
        }
        out.push('\n');
    }
    out
}

fn main() -> std::process::ExitCode {
    if let Some(code) = allot_common::clidocs::write_if_asked(command) {
        return code;
    }
    quiet_on_broken_pipe();
    let matches = command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let Err(u) = check_connection_flags(&cli.command, &matches) {
        usage_error(u);
    }
    let result = match cli.command {
        Command::Version => {
            println!("allot {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Xid(c) => xid::run(c),
        Command::Remote(c) => {
            if let Err(u) = remote::validate(&c) {
                usage_error(u);
            }
            return remote::run(c, cli.conn.server);
        }
        Command::Local(c) => {
            if let Err(u) = local::validate(&c) {
                usage_error(u);
            }
            return local::run(c, cli.conn.socket);
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allot: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// Refuses `--server` or `--socket` typed before a command that does not use it:
/// `allot --socket S submit` would otherwise ignore the socket without a word.
fn check_connection_flags(cmd: &Command, m: &ArgMatches) -> Result<(), usage::Usage> {
    let typed = |id: &str| m.value_source(id) == Some(ValueSource::CommandLine);
    let (uses_server, uses_socket) = match cmd {
        Command::Remote(_) => (true, false),
        Command::Local(_) => (false, true),
        Command::Version | Command::Xid(_) => (false, false),
    };
    let name = m.subcommand_name().unwrap_or("");
    let wrong = if typed("server") && !uses_server {
        Some("--server is allotd's address, for the workload, fair-share and `nodes` commands")
    } else if typed("socket") && !uses_socket {
        Some("--socket is the local agent's socket, for leases, gpus, drain, undrain, events and lease")
    } else {
        None
    };
    match wrong {
        Some(what) => Err(usage::Usage {
            path: &[],
            message: format!("{what}; `allot {name}` does not use it"),
        }),
        None => Ok(()),
    }
}

/// Exits quietly with status 141 when stdout's reader has gone (`allot queue | head`).
///
/// Rust ignores SIGPIPE, so printing to a closed pipe fails with EPIPE and `print!`
/// panics with a backtrace hint; restoring the signal's default needs `unsafe`, which
/// the workspace denies. A panic hook covers every command's printing in one place
/// and runs before the abort of a `panic = "abort"` build. 141 (128 + SIGPIPE) is what
/// a shell reports for `cat` or `grep` in the same spot, so `set -o pipefail` scripts
/// see allot as they see them.
fn quiet_on_broken_pipe() {
    let epipe = std::io::Error::from_raw_os_error(nix::errno::Errno::EPIPE as i32).to_string();
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        // `print!`'s own message: "failed printing to stdout: Broken pipe (os error 32)".
        if message.starts_with("failed printing to stdout") && message.ends_with(&epipe) {
            std::process::exit(141);
        }
        default(info);
    }));
}

/// Exits 2 with clap's layout and the usage line of the subcommand at fault.
fn usage_error(u: usage::Usage) -> ! {
    let mut root = command();
    // Building fills in each subcommand's full name (`allot lease start`) for its usage.
    root.build();
    let mut cmd = root;
    for name in u.path {
        match cmd.find_subcommand(name).cloned() {
            Some(sub) => cmd = sub,
            None => break,
        }
    }
    cmd.error(clap::error::ErrorKind::MissingRequiredArgument, u.message)
        .exit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_is_under_exactly_one_heading() {
        let mut built = Cli::command();
        built.build();
        for sub in built.get_subcommands().filter(|s| !s.is_hide_set()) {
            let n = GROUPS
                .iter()
                .filter(|(_, names)| names.contains(&sub.get_name()))
                .count();
            assert_eq!(n, 1, "{} is under {n} headings", sub.get_name());
        }
        for (_, names) in GROUPS {
            for name in *names {
                assert!(
                    built.find_subcommand(name).is_some(),
                    "{name} is in GROUPS but not a command"
                );
            }
        }
    }

    #[test]
    fn the_command_list_is_grouped() {
        // Without the styles' escapes, as clap prints it when stdout is not a terminal.
        let styled = grouped_commands(&Cli::command());
        let mut list = String::new();
        let mut rest = styled.as_str();
        while let Some(at) = rest.find('\x1b') {
            list.push_str(&rest[..at]);
            rest = rest[at..].split_once('m').map_or("", |(_, r)| r);
        }
        list.push_str(rest);
        let drain = list.find("  drain ").expect("drain");
        let host = list.find("This host").expect("host heading");
        let nodes = list.find("  nodes ").expect("nodes");
        let cluster = list.find("Cluster operators").expect("cluster heading");
        assert!(cluster < nodes && nodes < host && host < drain, "{list}");
        command().debug_assert();
    }
}
