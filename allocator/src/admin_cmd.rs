//! `allotd tokens …` and `allotd nodes …`: admin commands that talk to the running
//! allotd through its admin socket (root or allotd's user on its host), so the
//! database has one writer and every change is journaled.

use allot_fairshare::time::parse_duration;
use allot_proto::v1 as pb;
use pb::admin_client::AdminClient;
use std::path::PathBuf;

/// Where to find the running allotd.
#[derive(clap::Args, Debug)]
pub struct Target {
    /// allotd's config (its state dir holds the admin socket); `allotd dev`'s env file sets $ALLOTD_CONFIG.
    #[arg(long, env = "ALLOTD_CONFIG", default_value = "/etc/allot/allotd.toml")]
    pub config: PathBuf,
    /// The admin socket itself (overrides --config).
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

/// `allotd tokens`.
#[derive(clap::Subcommand, Debug)]
pub enum Tokens {
    /// Make a token for a user; it is printed once.
    Create {
        /// The user it proves.
        #[arg(long)]
        user: String,
        /// How long it lives (90d unless given; at most 730d).
        #[arg(long, value_parser = lifetime)]
        expires: Option<u64>,
        /// A note kept with it (who asked, what for).
        #[arg(long, default_value = "")]
        note: String,
        /// Where allotd is.
        #[command(flatten)]
        target: Target,
    },
    /// List tokens (never their secrets).
    List {
        /// Where allotd is.
        #[command(flatten)]
        target: Target,
    },
    /// Revoke a token at once.
    Revoke {
        /// Its id, as `allotd tokens list` shows it.
        id: String,
        /// Where allotd is.
        #[command(flatten)]
        target: Target,
    },
}

/// `allotd nodes`.
#[derive(clap::Subcommand, Debug)]
pub enum Nodes {
    /// Print a one-time token that enrolls host NAME.
    Enroll {
        /// The host's name: what its certificate and sessions will carry.
        name: String,
        /// How long the token may wait to be used (1h unless given; at most 7d).
        #[arg(long, value_parser = lifetime)]
        ttl: Option<u64>,
        /// Where allotd is.
        #[command(flatten)]
        target: Target,
    },
    /// Revoke a node: its sessions end now and it is refused until enrolled again.
    Revoke {
        /// The node.
        name: String,
        /// Where allotd is.
        #[command(flatten)]
        target: Target,
    },
    /// Remove a node for good (decommissioned, or lost for good): it stops counting in
    /// capacity and is revoked. Refused while work runs there; drain it first.
    Remove {
        /// The node.
        name: String,
        /// Where allotd is.
        #[command(flatten)]
        target: Target,
    },
    /// List enrolled, pending, revoked and removed nodes.
    List {
        /// Where allotd is.
        #[command(flatten)]
        target: Target,
    },
}

async fn client(t: &Target) -> anyhow::Result<AdminClient<tonic::transport::Channel>> {
    let path = match &t.socket {
        Some(p) => p.clone(),
        None => {
            let cfg = crate::config::ServerConfig::load(&t.config)?;
            crate::daemon::admin_socket_path(&cfg.server.state_dir)
        }
    };
    client_at(&path).await
}

/// An admin client on the socket at `path`.
pub async fn client_at(
    path: &std::path::Path,
) -> anyhow::Result<AdminClient<tonic::transport::Channel>> {
    let ch = allot_proto::uds::connect(path).await.map_err(|e| {
        anyhow::anyhow!(
            "{}: cannot reach allotd's admin socket ({e}); is allotd running, and are you root or its user?",
            path.display()
        )
    })?;
    Ok(AdminClient::new(ch))
}

/// A status as an error: its message says it all.
pub fn status(e: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}", e.message())
}

/// A lifetime asked for: a duration above zero (on the wire 0 means "the default",
/// so `0s` would quietly become 90 days).
fn lifetime(s: &str) -> Result<u64, String> {
    match parse_duration(s).map_err(|e| e.to_string())? {
        0 => Err(format!(
            "{s:?} is no time at all; give a lifetime such as 1h or 30d (leave the flag out for the default)"
        )),
        t => Ok(t),
    }
}

fn when(unix: i64) -> String {
    let now = crate::serve::now() as i64;
    if unix <= now {
        "expired".into()
    } else {
        format!(
            "in {}",
            allot_fairshare::time::format_duration(u64::try_from(unix - now).unwrap_or(0))
        )
    }
}

/// Runs `allotd tokens …`.
pub async fn tokens(cmd: Tokens) -> anyhow::Result<()> {
    match cmd {
        Tokens::Create {
            user,
            expires,
            note,
            target,
        } => {
            let r = client(&target)
                .await?
                .create_token(pb::CreateTokenRequest {
                    user: user.clone(),
                    ttl_s: expires.unwrap_or(0),
                    note,
                })
                .await
                .map_err(status)?
                .into_inner();
            eprintln!(
                "token {} for {user}, expires {}; give it to them (it is not shown again):",
                r.id,
                when(r.expires_unix)
            );
            println!("{}", r.token);
        }
        Tokens::List { target } => {
            let r = client(&target)
                .await?
                .list_tokens(pb::ListTokensRequest {})
                .await
                .map_err(status)?
                .into_inner();
            println!(
                "{:<14} {:<16} {:<12} {:<16} NOTE",
                "ID", "USER", "STATE", "BY"
            );
            for t in r.tokens {
                let state = if t.revoked {
                    "revoked".to_string()
                } else {
                    when(t.expires_unix)
                };
                println!(
                    "{:<14} {:<16} {:<12} {:<16} {}",
                    t.id, t.user, state, t.created_by, t.note
                );
            }
        }
        Tokens::Revoke { id, target } => {
            let t = client(&target)
                .await?
                .revoke_token(pb::RevokeTokenRequest { id })
                .await
                .map_err(status)?
                .into_inner();
            println!("token {} of {} revoked", t.id, t.user);
        }
    }
    Ok(())
}

/// Runs `allotd nodes …`.
pub async fn nodes(cmd: Nodes) -> anyhow::Result<()> {
    match cmd {
        Nodes::Enroll { name, ttl, target } => {
            let r = client(&target)
                .await?
                .enroll_node(pb::EnrollNodeRequest {
                    node: name.clone(),
                    ttl_s: ttl.unwrap_or(0),
                })
                .await
                .map_err(status)?
                .into_inner();
            eprintln!(
                "enrollment token for {name}, one use, expires {}. On {name}: copy the cluster CA (allotd's pki/ca.pem, public) to /etc/allot/ca.pem, then run\n  allot-agent enroll --server https://ALLOTD:7070 --token TOKEN",
                when(r.expires_unix)
            );
            println!("{}", r.token);
        }
        Nodes::Revoke { name, target } => {
            let n = client(&target)
                .await?
                .revoke_node(pb::RevokeNodeRequest { node: name })
                .await
                .map_err(status)?
                .into_inner();
            println!("node {} revoked; its sessions are cut", n.node);
        }
        Nodes::Remove { name, target } => {
            let n = client(&target)
                .await?
                .remove_node(pb::RemoveNodeRequest { node: name })
                .await
                .map_err(status)?
                .into_inner();
            println!(
                "node {} removed: it no longer counts in capacity, and only a new enrollment brings it back",
                n.node
            );
        }
        Nodes::List { target } => {
            let r = client(&target)
                .await?
                .list_node_credentials(pb::ListNodeCredentialsRequest {})
                .await
                .map_err(status)?
                .into_inner();
            println!("{:<24} {:<10} {:<16} BY", "NODE", "STATE", "CERTIFICATE");
            for n in r.nodes {
                let cert = if n.not_after_unix == 0 {
                    "-".to_string()
                } else {
                    when(n.not_after_unix)
                };
                println!("{:<24} {:<10} {:<16} {}", n.node, n.state, cert, n.by);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lifetime_of_no_time_is_refused() {
        assert_eq!(lifetime("90d"), Ok(90 * 86_400));
        let e = lifetime("0s").expect_err("refused");
        assert!(e.contains("no time at all"), "{e}");
        assert!(lifetime("0").is_err());
    }
}
