//! gRPC over a unix socket: the agent's local API is reached this way (the socket's
//! mode and group are the first permission check; the agent checks peer credentials
//! for changes).

use std::path::{Path, PathBuf};
use tonic::transport::{Channel, Endpoint};

/// Why a socket could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The socket file is not there: no agent, or another path.
    #[error(
        "{path}: no agent socket here; is allot-agent running? (select another with --socket PATH)"
    )]
    Missing {
        /// The socket.
        path: String,
    },
    /// The caller may not open the socket.
    #[error("{path}: permission denied; the agent's socket is for root and the `allot` group (add yourself with `usermod -aG allot $USER`, then log in again)")]
    Denied {
        /// The socket.
        path: String,
    },
    /// Anything else.
    #[error("{path}: cannot connect: {source}")]
    Other {
        /// The socket.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

fn classify(path: &Path, e: std::io::Error) -> ConnectError {
    let path = path.display().to_string();
    match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            ConnectError::Missing { path }
        }
        std::io::ErrorKind::PermissionDenied => ConnectError::Denied { path },
        _ => ConnectError::Other { path, source: e },
    }
}

/// A channel to the gRPC server listening on `path`; connects at once so that a
/// missing socket or a permission problem is reported here, by name.
pub async fn connect(path: &Path) -> Result<Channel, ConnectError> {
    // Probe first: tonic's own error for a failed connector hides the io::Error kind.
    tokio::net::UnixStream::connect(path)
        .await
        .map_err(|e| classify(path, e))?;
    let p: PathBuf = path.to_path_buf();
    // The URI is required by the API and ignored by the connector.
    Endpoint::from_static("http://agent.local")
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let p = p.clone();
            async move {
                let s = tokio::net::UnixStream::connect(&p).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(s))
            }
        }))
        .await
        .map_err(|e| ConnectError::Other {
            path: path.display().to_string(),
            source: std::io::Error::other(e.to_string()),
        })
}
