//! What the CLI's integration tests share: running the real binary, and fake gRPC
//! servers (an agent on a unix socket, allotd on a loopback port) that serve for the
//! rest of the test process.

#![allow(dead_code)] // Each test file uses its own part.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use tonic::transport::server::Router;

/// Runs `allot` with `env` (and neither `$ALLOT_SOCKET` nor `$ALLOT_SERVER` from the
/// test's own environment): exit code, stdout, stderr.
pub fn allot_env(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_allot"));
    cmd.args(args)
        .env_remove("ALLOT_SOCKET")
        .env_remove("ALLOT_SERVER")
        .env_remove("ALLOT_TOKEN")
        .env_remove("ALLOT_CA");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("allot runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `allot` with a clean connection environment.
pub fn allot(args: &[&str]) -> (i32, String, String) {
    allot_env(args, &[])
}

/// Parses a command's `--json` output, showing it when it is not JSON.
pub fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// Unix seconds, now.
pub fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64
}

/// A fake agent's socket; its directory goes when the test ends.
pub struct Socket(pub PathBuf);

impl Socket {
    /// The path as `--socket` takes it.
    pub fn arg(&self) -> &str {
        self.0.to_str().expect("utf-8 path")
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Runs `serve` on a thread of its own with a current-thread runtime, and returns
/// once it has bound (what `serve` sends).
fn on_thread<T: Send + 'static, F>(
    serve: impl FnOnce(std::sync::mpsc::Sender<T>) -> F + Send + 'static,
) -> T
where
    F: std::future::Future<Output = ()>,
{
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(serve(tx));
    });
    rx.recv().expect("server ready")
}

/// Serves `router` on a fresh unix socket (a fake agent).
pub fn serve_unix(router: Router) -> Socket {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "allot-cli-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("agent.sock");
    let p = path.clone();
    on_thread(move |ready| async move {
        let listener = tokio::net::UnixListener::bind(&p).expect("bind");
        ready.send(()).expect("ready");
        router
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await
            .expect("serve");
    });
    Socket(path)
}

/// Serves `router` on a free loopback port (a fake allotd, plain HTTP/2, which the
/// CLI accepts on loopback only); its `http://` address.
pub fn serve_tcp(router: Router) -> String {
    let addr = on_thread(move |ready| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        ready
            .send(listener.local_addr().expect("addr"))
            .expect("ready");
        router
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .expect("serve");
    });
    format!("http://{addr}")
}
