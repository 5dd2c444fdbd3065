//! How a networked command fails, and the one place that turns a failure into a
//! line on stderr and exit status 1 (usage errors are clap's, status 2).

use std::future::Future;
use std::process::ExitCode;

/// Why a command failed.
pub enum Failure {
    /// The agent or allotd could not be reached; the text names where and the fix.
    Connect(String),
    /// The server refused; its message names the field and the fix.
    Status(tonic::Status),
    /// A check against the server's answer failed; the text names the flag and the fix.
    Refused(String),
    /// Anything local (printing).
    Other(anyhow::Error),
    /// Already said on stderr, one line per part that failed: exit status 1.
    Quiet,
    /// Not a failure of allot's: the job ended with this status (`--wait`, `logs -f`,
    /// `watch`), passed on as `srun` passes its job's.
    JobEnded(u8),
}

impl From<allot_proto::uds::ConnectError> for Failure {
    fn from(e: allot_proto::uds::ConnectError) -> Self {
        Failure::Connect(e.to_string())
    }
}

impl From<tonic::Status> for Failure {
    fn from(e: tonic::Status) -> Self {
        Failure::Status(e)
    }
}

impl From<serde_json::Error> for Failure {
    fn from(e: serde_json::Error) -> Self {
        Failure::Other(e.into())
    }
}

/// Runs one command's future to completion and says how the process should exit.
pub fn block_on(f: impl Future<Output = Result<(), Failure>>) -> ExitCode {
    // Built per command, not in main: `version` and `xid` need no runtime, and one
    // thread is plenty for one request.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(f) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::JobEnded(code)) => ExitCode::from(code),
        Err(f) => {
            match f {
                Failure::Connect(m) | Failure::Refused(m) => eprintln!("error: {m}"),
                // A status from the transport can carry no message; the code still helps.
                Failure::Status(s) if s.message().is_empty() => {
                    eprintln!("error: {}", s.code().description())
                }
                Failure::Status(s) => eprintln!("error: {}", s.message()),
                Failure::Other(e) => eprintln!("error: {e:#}"),
                Failure::JobEnded(_) | Failure::Quiet => {}
            }
            ExitCode::from(1)
        }
    }
}
