//! Whom a child process runs as, and the one place it is switched: workloads (the
//! agent's launch) and `exec:` checkpoint hooks (the ladder) both go through
//! [`prepare`], so a hook can never run with more rights than its workload.
//!
//! Everything that needs memory (the group list, the environment) is worked out in
//! the parent; between fork and exec only async-signal-safe system calls run.

use nix::unistd::{Gid, Uid};
use std::process::Command;

/// A user identity for a child process, as the parent worked it out.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups (`getgrouplist`: the primary group included).
    pub groups: Vec<u32>,
}

/// Whom a child process runs as.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RunAs {
    /// The agent's own user: no switch (the lease's user is the agent's).
    #[default]
    Agent,
    /// Another user: its groups, gid and uid are taken before exec (needs root).
    User(Identity),
    /// No one: the lease's user cannot be run as now (unknown on this host, or not
    /// allowed); says why. A child is never started for it.
    Nobody(String),
}

/// Arranges `cmd` to start as `who`, in a session of its own if `new_session`. The
/// user's environment (HOME, USER …) is the caller's to set; this only switches
/// identity. An error (for [`RunAs::Nobody`]) says why nothing may be started.
pub fn prepare(cmd: &mut Command, who: &RunAs, new_session: bool) -> Result<(), String> {
    // std's own `uid`/`gid` are not used: std switches before running pre_exec
    // closures and drops every supplementary group, so the user's groups (a shared
    // dataset's group, `video` …) would be lost. The whole switch happens here.
    let switch = match who {
        RunAs::Agent => None,
        RunAs::User(id) => Some((
            Uid::from_raw(id.uid),
            Gid::from_raw(id.gid),
            id.groups
                .iter()
                .map(|g| Gid::from_raw(*g))
                .collect::<Vec<Gid>>(),
        )),
        RunAs::Nobody(why) => return Err(why.clone()),
    };
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed. It allocates nothing (the group list was
    // built above, in the parent) and makes only the sigaction, setsid, setgroups,
    // setgid and setuid system calls; errors become io::Errors from raw errno,
    // without allocation. Order matters: groups and gid while still root, uid last.
    #[allow(unsafe_code)]
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            default_signals();
            if new_session {
                nix::unistd::setsid()?;
            }
            if let Some((uid, gid, groups)) = &switch {
                nix::unistd::setgroups(groups)?;
                nix::unistd::setgid(*gid)?;
                nix::unistd::setuid(*uid)?;
            }
            Ok(())
        });
    }
    Ok(())
}

/// Every signal back to its default action. An ignored signal stays ignored across
/// exec, so a daemon started with SIGINT ignored (`cmd &` in a script, some
/// supervisors) would hand that on: Ctrl-C in a session, or torchrun's SIGINT to
/// its workers, would do nothing. The signal mask is std's to clear.
fn default_signals() {
    use nix::sys::signal::{SigHandler, Signal};
    for s in Signal::iterator() {
        if matches!(s, Signal::SIGKILL | Signal::SIGSTOP) {
            continue;
        }
        // SAFETY: sigaction(2) with SIG_DFL installs no handler; it is
        // async-signal-safe and its failure leaves the disposition as it was.
        #[allow(unsafe_code)]
        let _ = unsafe { nix::sys::signal::signal(s, SigHandler::SigDfl) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nobody_is_never_started_and_the_agent_runs_as_itself() {
        let mut c = Command::new("true");
        assert_eq!(
            prepare(&mut c, &RunAs::Nobody("no user \"x\"".into()), false),
            Err("no user \"x\"".to_string())
        );
        let mut c = Command::new("id");
        c.arg("-u");
        prepare(&mut c, &RunAs::Agent, true).expect("prepared");
        let out = c.output().expect("id runs");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            nix::unistd::geteuid().to_string()
        );
    }

    #[test]
    fn a_signal_the_parent_ignores_is_not_ignored_by_the_child() {
        use nix::sys::signal::{signal, SigHandler, Signal};
        // A child of its own, so ignoring SIGINT touches no other test.
        let me = std::env::current_exe().expect("the test binary");
        if std::env::var_os("ALLOT_IDENTITY_CHILD").is_some() {
            // SAFETY: this process is the test's child, doing nothing else.
            #[allow(unsafe_code)]
            unsafe { signal(Signal::SIGINT, SigHandler::SigIgn) }.expect("ignore SIGINT");
            let ignored = |c: &mut Command| {
                let out = c
                    .args(["-c", "grep ^SigIgn: /proc/self/status"])
                    .output()
                    .expect("sh runs");
                let mask = String::from_utf8_lossy(&out.stdout);
                let bits = u64::from_str_radix(mask.trim_start_matches("SigIgn:").trim(), 16)
                    .expect("a mask");
                bits & (1 << (Signal::SIGINT as u64 - 1)) != 0
            };
            assert!(ignored(&mut Command::new("sh")), "the control inherits it");
            let mut c = Command::new("sh");
            prepare(&mut c, &RunAs::Agent, false).expect("prepared");
            assert!(!ignored(&mut c), "a prepared child gets SIGINT back");
            return;
        }
        let out = Command::new(me)
            .args([
                "--exact",
                "identity::tests::a_signal_the_parent_ignores_is_not_ignored_by_the_child",
                "--nocapture",
            ])
            .env("ALLOT_IDENTITY_CHILD", "1")
            .output()
            .expect("the test binary runs");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.contains("1 passed"),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
