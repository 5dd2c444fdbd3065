//! `allotd.toml`: where allotd listens and keeps state, the org tree, the policy,
//! and the automatic-drain circuit breaker. Errors name file, line and field.

use allot_common::config_error::{from_toml, ConfigError, Positions};
use allot_fairshare::time::de_duration;
use allot_fairshare::{GroupSpec, OrgTree, PolicyConfig};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The `[server]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    /// gRPC address (agents, CLI).
    pub listen: String,
    /// allotd's HTTP address: `/metrics`, `/healthz`, `/readyz` and the web pages
    /// (unless `web = false`); empty to disable. Plain HTTP on a loopback address,
    /// TLS with allotd's certificate on any other.
    pub metrics_listen: String,
    /// A file holding the bearer token `/metrics` asks of a scraper (Prometheus'
    /// `authorization: credentials_file`); empty: `/metrics` is open to whoever
    /// reaches the port. Readable by its owner and group only.
    pub metrics_token_file: PathBuf,
    /// Serve the web pages (org tree, queues, workloads, nodes, usage) on
    /// `metrics_listen`; a login there exchanges a token for a session cookie.
    pub web: bool,
    /// A web session ends this long after its login.
    #[serde(deserialize_with = "de_duration")]
    pub web_session: u64,
    /// Pending work's start is forecast this often (a clone of the scheduler run
    /// forward, off the state's lock); 0: never.
    #[serde(deserialize_with = "de_duration")]
    pub forecast_every: u64,
    /// SQLite state directory.
    pub state_dir: PathBuf,
    /// A node whose agent is silent this long is lost; its leases are requeued then.
    #[serde(deserialize_with = "de_duration")]
    pub lost_grace: u64,
    /// The scheduling pass also runs this often when nothing happens.
    #[serde(deserialize_with = "de_duration")]
    pub schedule_interval: u64,
    /// Passes that changes ask for come at most this often (0: 20 ms after each
    /// change). A large fleet batches its changes so; `allot-sim` models it
    /// with a scenario's `pass_interval`. At most `schedule_interval`.
    #[serde(deserialize_with = "de_duration")]
    pub min_pass_interval: u64,
    /// Most open gRPC connections in all; one more is closed at once. Lowered to the
    /// descriptor limit less a reserve for the journal and agents' files.
    pub max_connections: usize,
    /// Most open gRPC connections from one IP address; below `max_connections`, so
    /// one peer that fills its share leaves room for every other (the CLI on the
    /// allotd host shares 127.0.0.1 with anything local).
    pub max_connections_per_peer: usize,
    /// Most gRPC connections not yet authenticated from one address prefix (a /24
    /// of IPv4, a /64 of IPv6: one host may hold a whole /64); authenticated ones
    /// are not counted, so a rack's hosts never lock each other out. Unset: four
    /// peers' shares, below `max_connections`.
    pub max_connections_per_prefix: Option<usize>,
    /// Most authenticated gRPC connections of one identity: a user's tokens, or a
    /// node's certificate (with the users it vouches for). Unset: one peer's share.
    pub max_connections_per_user: Option<usize>,
    /// A connection with no request open and none begun this long is closed (as
    /// gRPC's MAX_CONNECTION_IDLE). Open streams (an agent's session, a Watch) keep
    /// it; pings and other bytes do not.
    #[serde(deserialize_with = "de_duration")]
    pub idle_timeout: u64,
    /// A TLS handshake not done this long after the connection is closed.
    #[serde(deserialize_with = "de_duration")]
    pub handshake_timeout: u64,
    /// A connection that has begun no request this long after its handshake
    /// deadline is closed; and one that no request has authenticated (a valid
    /// token or node certificate) by then, whatever it has open.
    #[serde(deserialize_with = "de_duration")]
    pub first_request_timeout: u64,
    /// Most concurrent requests (HTTP/2 streams) on one connection.
    pub max_streams_per_connection: u32,
    /// Most open `Watch` and `Logs --follow` streams in all; one more is refused
    /// with RESOURCE_EXHAUSTED.
    pub max_watch_streams: usize,
    /// Most of those one user (or node) holds. Unset: a tenth of
    /// `max_watch_streams`.
    pub max_watch_streams_per_user: Option<usize>,
    /// A snapshot of the state is taken after this many journal entries (and at
    /// start-up and stop); the journal below it is compacted away, so start-up
    /// reads one snapshot and at most this many entries.
    pub snapshot_every: u64,
    /// Finished workloads stay in memory (`allot queue --all`) this long after
    /// their end; then the next snapshot moves them to the state file's retired
    /// records, where `allot status ID` still finds them.
    #[serde(deserialize_with = "de_duration")]
    pub keep_finished: u64,
    /// Ended runs stay in the state file's history (`allot history`, `allot usage`)
    /// this long after their end; snapshots forget older ones.
    #[serde(deserialize_with = "de_duration")]
    pub history_retention: u64,
    /// Where a lease's rendezvous port (`MASTER_PORT`) is chosen: `"LOW-HIGH"`,
    /// inclusive, unprivileged ports. Each lease gets one no other live lease with
    /// rank 0 on the same host holds.
    #[serde(deserialize_with = "de_port_range")]
    pub master_ports: PortRange,
}

/// An inclusive range of TCP ports (`[server] master_ports`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    /// First port.
    pub low: u16,
    /// Last port (at least `low`).
    pub high: u16,
}

impl Default for PortRange {
    /// torchrun's default port (29500) and the 499 after it.
    fn default() -> Self {
        PortRange {
            low: 29_500,
            high: 29_999,
        }
    }
}

impl std::str::FromStr for PortRange {
    type Err = String;

    /// `"LOW-HIGH"` (or one port), within 1024–65535, LOW ≤ HIGH.
    fn from_str(s: &str) -> Result<Self, String> {
        let fix = "give a range of unprivileged ports as \"LOW-HIGH\", e.g. \"29500-29999\"";
        let (lo, hi) = s.split_once('-').unwrap_or((s, s));
        let port = |p: &str| p.trim().parse::<u16>().ok().filter(|p| *p >= 1024);
        match (port(lo), port(hi)) {
            (Some(low), Some(high)) if low <= high => Ok(PortRange { low, high }),
            (Some(low), Some(high)) => Err(format!("{s:?}: {low} is above {high}; {fix}")),
            _ => Err(format!("{s:?} is not a port range of 1024 to 65535; {fix}")),
        }
    }
}

fn de_port_range<'de, D: serde::Deserializer<'de>>(d: D) -> Result<PortRange, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(serde::de::Error::custom)
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            listen: "127.0.0.1:7070".into(),
            metrics_listen: "127.0.0.1:9470".into(),
            metrics_token_file: PathBuf::new(),
            web: true,
            web_session: 12 * 3600,
            forecast_every: 30,
            state_dir: "/var/lib/allot/allotd".into(),
            lost_grace: 120,
            schedule_interval: 10,
            min_pass_interval: 0,
            max_connections: 4096,
            max_connections_per_peer: 256,
            max_connections_per_prefix: None,
            max_connections_per_user: None,
            idle_timeout: 300,
            handshake_timeout: 10,
            first_request_timeout: 10,
            max_streams_per_connection: 128,
            max_watch_streams: 10_000,
            max_watch_streams_per_user: None,
            snapshot_every: 10_000,
            keep_finished: 86_400,
            history_retention: 400 * 86_400,
            master_ports: PortRange::default(),
        }
    }
}

/// The `[breaker]` table: automatic drains are held when too many nodes drained
/// recently (a bad driver push or a parser bug must not empty the cluster).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerSection {
    /// Share of nodes that may go to drain automatically within the window.
    pub max_share: f64,
    /// The window.
    #[serde(deserialize_with = "de_duration")]
    pub window: u64,
}

/// `[notify]`: where workloads that ask (`--notify end,fail,preempt,time-limit`)
/// are told about their ends: a webhook per user or project, and mail through a
/// command as Slurm's `MailProg`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotifySection {
    /// Webhooks: each `{ user = "ana", url = "http://…" }` or `{ project = "vision",
    /// url = "…" }`; a workload's notices go to its user's and its project's.
    pub webhooks: Vec<Webhook>,
    /// A program that sends mail, the message (headers, a blank line, the text) on
    /// its stdin, as `/usr/sbin/sendmail -t`; empty: no mail.
    pub mail_command: String,
    /// Mail goes to USER@mail_domain.
    pub mail_domain: String,
    /// Tries for each delivery, with backoff from 1 s doubling.
    pub attempts: u32,
    /// Each try's deadline.
    #[serde(deserialize_with = "de_duration")]
    pub timeout: u64,
    /// Notices waiting at most; past it the oldest are dropped and counted.
    pub queue: usize,
}

impl Default for NotifySection {
    fn default() -> Self {
        NotifySection {
            webhooks: Vec::new(),
            mail_command: String::new(),
            mail_domain: String::new(),
            attempts: 5,
            timeout: 5,
            queue: 10_000,
        }
    }
}

/// One webhook of `[notify]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Webhook {
    /// For this user's work.
    #[serde(default)]
    pub user: String,
    /// For this project's work.
    #[serde(default)]
    pub project: String,
    /// Where to POST (`http://HOST:PORT/PATH`).
    pub url: String,
}

impl Default for BreakerSection {
    fn default() -> Self {
        BreakerSection {
            max_share: 0.5,
            window: 300,
        }
    }
}

/// The `[roles]` table: who may do more than their own work. Names are user names
/// as tokens and agents prove them; roles are never taken from a request.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolesSection {
    /// Drain and undrain nodes; see all work.
    pub operators: Vec<String>,
    /// Tokens, enrollment, everything.
    pub admins: Vec<String>,
}

pub use allot_fairshare::CLASSES;

/// One `[classes.NAME]` table: the contract a job of that class gets when its
/// submission leaves a term out.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassDefaults {
    /// Protected runtime when `--min-runtime` is not given.
    #[serde(default, deserialize_with = "allot_fairshare::time::de_opt_duration")]
    pub min_runtime: Option<u64>,
    /// Time limit when `--time-limit` is not given.
    #[serde(default, deserialize_with = "allot_fairshare::time::de_opt_duration")]
    pub time_limit: Option<u64>,
}

/// The `[auth]` table: what allotd takes from whom besides tokens.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthSection {
    /// Enrolled hosts whose agents may vouch for any of their local users (names,
    /// `*` for any run of characters: `login-*`): the login hosts. `[]` (the
    /// default): none; `["*"]`: every enrolled node, so that any node's key speaks
    /// for every non-root user. A vouched user never carries a role (operator,
    /// manager, admin): those need a token.
    pub vouching_hosts: Vec<String>,
    /// Any enrolled node may also vouch for a user who has work running on it (a
    /// lease placed there), for that user's own work: a job's `allot` calls from
    /// its own nodes need no token, and a node's key speaks for no one whose work
    /// root on that host could not already reach. `false`: only `vouching_hosts`.
    pub vouch_for_running_work: bool,
}

impl Default for AuthSection {
    fn default() -> Self {
        AuthSection {
            vouching_hosts: Vec::new(),
            vouch_for_running_work: true,
        }
    }
}

impl AuthSection {
    /// Whether node `name`'s agent may vouch for its users.
    pub fn may_vouch(&self, name: &str) -> bool {
        self.vouching_hosts.iter().any(|p| glob(p, name))
    }
}

/// `*` matches any run of characters; anything else itself.
fn glob(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            let Some(tail) = name.strip_prefix(head) else {
                return false;
            };
            // The rest may start anywhere after the head.
            (0..=tail.len()).any(|i| tail.is_char_boundary(i) && glob(rest, &tail[i..]))
        }
    }
}

/// The `[tls]` table: the cluster CA and allotd's certificate.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSection {
    /// Where the CA and allotd's certificate live; empty: `STATE_DIR/pki`.
    pub dir: PathBuf,
    /// Names clients reach allotd by, for its certificate (beside `localhost`,
    /// `127.0.0.1` and this host's name).
    pub names: Vec<String>,
    /// Serve plain HTTP/2 instead of TLS: refused unless `listen` is a loopback
    /// address (a local benchmark's baseline); never for a real cluster.
    pub plaintext_loopback: bool,
}

impl Default for TlsSection {
    fn default() -> Self {
        TlsSection {
            dir: PathBuf::new(),
            names: Vec::new(),
            plaintext_loopback: false,
        }
    }
}

/// Who may do what in a group of the org tree (`managers`, `members` and `open` on
/// a `[[group]]`): rights hold for the whole subtree below it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GroupAccess {
    /// Set weights inside the subtree; see and cancel its work.
    pub managers: Vec<String>,
    /// Charge its projects.
    pub members: Vec<String>,
    /// Anyone authenticated may charge its projects.
    pub open: bool,
}

/// The whole config.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// `[server]`.
    pub server: ServerSection,
    /// `[[group]]`, parents first after sorting.
    pub groups: Vec<GroupSpec>,
    /// `[policy]`.
    pub policy: PolicyConfig,
    /// `[breaker]`.
    pub breaker: BreakerSection,
    /// `[notify]`.
    pub notify: NotifySection,
    /// `[roles]`.
    pub roles: RolesSection,
    /// `[auth]`.
    pub auth: AuthSection,
    /// `[tls]`.
    pub tls: TlsSection,
    /// `[classes.NAME]`: each class's default contract.
    pub classes: BTreeMap<String, ClassDefaults>,
    /// Access per group name (groups without any are absent).
    pub access: BTreeMap<String, GroupAccess>,
}

/// One `[[group]]` table: the core's spec and who may use it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupEntry {
    /// The group's name, unique in the tree; a group with no children is a project.
    name: String,
    /// The group above it; absent: a top-level group.
    #[serde(default)]
    parent: Option<String>,
    /// Its weight among its siblings (its share is weight ÷ the siblings' sum).
    weight: f64,
    /// Users who may set weights below it and see and cancel its work.
    #[serde(default)]
    managers: Vec<String>,
    /// Users who may charge its projects.
    #[serde(default)]
    members: Vec<String>,
    /// Every user may charge its projects.
    #[serde(default)]
    open: bool,
}

/// The example `allotd init` writes and `allotd dev` uses.
pub const EXAMPLE: &str = include_str!("../../packaging/etc/allotd.toml");

impl ServerConfig {
    /// Parses and checks a config's text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<ServerConfig, ConfigError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            #[serde(default)]
            server: ServerSection,
            #[serde(default)]
            group: Vec<GroupEntry>,
            #[serde(default)]
            policy: PolicyConfig,
            #[serde(default)]
            breaker: BreakerSection,
            #[serde(default)]
            notify: NotifySection,
            #[serde(default)]
            roles: RolesSection,
            #[serde(default)]
            auth: AuthSection,
            #[serde(default)]
            tls: TlsSection,
            #[serde(default)]
            classes: BTreeMap<String, ClassDefaults>,
        }
        let r: Raw = from_toml(text, file, "server")?;
        let access: BTreeMap<String, GroupAccess> = r
            .group
            .iter()
            .filter(|g| g.open || !g.managers.is_empty() || !g.members.is_empty())
            .map(|g| {
                (
                    g.name.clone(),
                    GroupAccess {
                        managers: g.managers.clone(),
                        members: g.members.clone(),
                        open: g.open,
                    },
                )
            })
            .collect();
        let group: Vec<GroupSpec> = r
            .group
            .into_iter()
            .map(|g| GroupSpec {
                name: g.name,
                parent: g.parent,
                weight: g.weight,
            })
            .collect();
        let at = Positions::new(text, file);
        let err = |field: &str, message: String| at.error(field, message);
        if !(r.breaker.max_share > 0.0 && r.breaker.max_share <= 1.0) {
            return Err(err(
                "breaker.max_share",
                format!(
                    "{}: use a share of nodes in (0, 1], e.g. 0.5",
                    r.breaker.max_share
                ),
            ));
        }
        for (i, w) in r.notify.webhooks.iter().enumerate() {
            if !w.url.starts_with("http://") {
                return Err(err(
                    "notify.webhooks",
                    format!(
                        "[{i}] url {:?}: give http://HOST:PORT/PATH (allotd posts plain HTTP; put a relay on this host in front of an https receiver)",
                        w.url
                    ),
                ));
            }
            if w.user.is_empty() == w.project.is_empty() {
                return Err(err(
                    "notify.webhooks",
                    format!("[{i}]: give either user = \"NAME\" or project = \"NAME\""),
                ));
            }
        }
        if !r.notify.mail_command.is_empty() && r.notify.mail_domain.is_empty() {
            return Err(err(
                "notify.mail_domain",
                "mail_command is set but not the domain users' mail goes to (USER@mail_domain)"
                    .into(),
            ));
        }
        if r.server.min_pass_interval > r.server.schedule_interval.max(1) {
            return Err(err(
                "server.min_pass_interval",
                format!(
                    "{} s is longer than server.schedule_interval ({} s), which runs a pass anyway; use at most that, or 0s for a pass after each change",
                    r.server.min_pass_interval, r.server.schedule_interval
                ),
            ));
        }
        if r.server.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(err(
                "server.listen",
                format!(
                    "{:?} is not an address; use e.g. \"0.0.0.0:7070\"",
                    r.server.listen
                ),
            ));
        }
        if !r.server.metrics_listen.is_empty()
            && r.server
                .metrics_listen
                .parse::<std::net::SocketAddr>()
                .is_err()
        {
            return Err(err(
                "server.metrics_listen",
                format!(
                    "{:?} is not an address; use e.g. \"127.0.0.1:9470\" (plain HTTP) or \"0.0.0.0:9470\" (TLS), or \"\" to serve no HTTP",
                    r.server.metrics_listen
                ),
            ));
        }
        if !(60..=30 * 86_400).contains(&r.server.web_session) {
            return Err(err(
                "server.web_session",
                format!(
                    "{} s: give from 1m to 30d (e.g. \"12h\")",
                    r.server.web_session
                ),
            ));
        }
        if r.tls.plaintext_loopback
            && !r
                .server
                .listen
                .parse::<std::net::SocketAddr>()
                .is_ok_and(|a| a.ip().is_loopback())
        {
            return Err(err(
                "tls.plaintext_loopback",
                format!(
                    "plain HTTP/2 is allowed on a loopback address only, and server.listen is {:?}; remove plaintext_loopback (clients then use TLS with the cluster CA)",
                    r.server.listen
                ),
            ));
        }
        let sv = &r.server;
        if sv.max_connections_per_peer == 0 || sv.max_connections_per_peer >= sv.max_connections {
            return Err(err(
                "server.max_connections_per_peer",
                format!(
                    "{} with max_connections = {}: give at least 1 and less than max_connections, so one peer cannot take every connection (e.g. 256 of 4096)",
                    sv.max_connections_per_peer, sv.max_connections
                ),
            ));
        }
        if let Some(p) = sv.max_connections_per_prefix {
            if p < sv.max_connections_per_peer {
                return Err(err(
                    "server.max_connections_per_prefix",
                    format!(
                        "{p} is below max_connections_per_peer = {}: a prefix holds at least one peer; give {} or more, or leave it out (four peers' shares)",
                        sv.max_connections_per_peer, sv.max_connections_per_peer
                    ),
                ));
            }
        }
        if sv.max_connections_per_user == Some(0) {
            return Err(err(
                "server.max_connections_per_user",
                "0: give at least 1, or leave it out (one peer's share)".into(),
            ));
        }
        if let Some(u) = sv.max_watch_streams_per_user {
            if u == 0 || u > sv.max_watch_streams {
                return Err(err(
                    "server.max_watch_streams_per_user",
                    format!(
                        "{u} with max_watch_streams = {}: give from 1 to max_watch_streams, or leave it out (a tenth)",
                        sv.max_watch_streams
                    ),
                ));
            }
        }
        for (field, v) in [
            ("server.handshake_timeout", sv.handshake_timeout),
            ("server.first_request_timeout", sv.first_request_timeout),
        ] {
            if v == 0 {
                return Err(err(field, "0s: give at least 1s, e.g. \"10s\"".into()));
            }
        }
        if sv.idle_timeout < 10 {
            return Err(err(
                "server.idle_timeout",
                format!(
                    "{}s: too short for a client to answer allotd's pings; give 10s or more, e.g. \"5m\"",
                    sv.idle_timeout
                ),
            ));
        }
        for (field, v) in [
            (
                "server.max_streams_per_connection",
                sv.max_streams_per_connection as usize,
            ),
            ("server.max_watch_streams", sv.max_watch_streams),
        ] {
            if v == 0 {
                return Err(err(field, "0: give at least 1".into()));
            }
        }
        for (name, c) in &r.classes {
            let field = format!("classes.{name}");
            if !CLASSES.contains(&name.as_str()) {
                return Err(err(
                    &field,
                    format!(
                        "{name:?} is not a workload class; the classes are {}",
                        CLASSES.join(", ")
                    ),
                ));
            }
            if let (Some(m), Some(t)) = (c.min_runtime, c.time_limit) {
                if m > t {
                    return Err(err(
                        &format!("{field}.min_runtime"),
                        format!("{m} s is longer than its time_limit ({t} s): the work would be stopped inside its protection"),
                    ));
                }
            }
            if c.time_limit == Some(0) {
                return Err(err(
                    &format!("{field}.time_limit"),
                    "0s would end the work at once; give a limit such as \"1h\", or leave it out"
                        .into(),
                ));
            }
        }
        // The policy's ranges, checked here so `allotd check` names them too; the
        // message begins with the key (`policy.hysteresis = ...`).
        if let Err(m) = r.policy.validate() {
            let key = m.split([' ', '.']).nth(1).unwrap_or_default();
            return Err(err(&format!("policy.{key}"), m));
        }
        if group.is_empty() {
            return Err(err(
                "group",
                "no org tree: add [[group]] tables (name, parent, weight); `allotd init` writes an example".into(),
            ));
        }
        let group_line = |name: &str| at.line_in_array("group", "name", name);
        let groups = parents_first(&group)
            .map_err(|(name, m)| at.error_at("group", group_line(&name), m))?;
        OrgTree::new(&groups).map_err(|e| {
            let name = match &e {
                allot_fairshare::tree::TreeError::BadWeight { name, .. }
                | allot_fairshare::tree::TreeError::UnknownParent { name, .. } => name.clone(),
                allot_fairshare::tree::TreeError::Duplicate(n)
                | allot_fairshare::tree::TreeError::BadName(n) => n.clone(),
                _ => String::new(),
            };
            at.error_at("group", group_line(&name), e.to_string())
        })?;
        Ok(ServerConfig {
            server: r.server,
            groups,
            policy: r.policy,
            breaker: r.breaker,
            notify: r.notify,
            roles: r.roles,
            auth: r.auth,
            tls: r.tls,
            classes: r.classes,
            access,
        })
    }

    /// Where the CA and allotd's certificate live.
    pub fn pki_dir(&self) -> PathBuf {
        if self.tls.dir.as_os_str().is_empty() {
            self.server.state_dir.join("pki")
        } else {
            self.tls.dir.clone()
        }
    }

    /// Reads and parses a file.
    pub fn load(path: &std::path::Path) -> Result<ServerConfig, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: 0,
            field: "(file)".into(),
            message: format!("cannot read: {e}; `allotd init` writes an example"),
        })?;
        Self::parse(&text, &file)
    }
}

/// Orders groups parents first (any order is accepted in the file); a cycle or an
/// unknown parent is named.
fn parents_first(groups: &[GroupSpec]) -> Result<Vec<GroupSpec>, (String, String)> {
    let by_name: BTreeMap<&str, &GroupSpec> = groups.iter().map(|g| (g.name.as_str(), g)).collect();
    let mut out: Vec<GroupSpec> = Vec::with_capacity(groups.len());
    let mut placed = std::collections::BTreeSet::new();
    for g in groups {
        let mut chain = Vec::new();
        let mut cur = Some(g);
        while let Some(c) = cur {
            if placed.contains(c.name.as_str()) {
                break;
            }
            if chain.iter().any(|x: &&GroupSpec| x.name == c.name) {
                let names: Vec<&str> = chain.iter().map(|x| x.name.as_str()).collect();
                return Err((
                    c.name.clone(),
                    format!(
                        "org tree: cycle {} → {}; every chain of parents must end at the top",
                        names.join(" → "),
                        c.name
                    ),
                ));
            }
            chain.push(c);
            cur = match &c.parent {
                None => None,
                Some(p) => Some(*by_name.get(p.as_str()).ok_or_else(|| {
                    (
                        c.name.clone(),
                        format!("org tree: group {:?} names parent {p:?}, which is not defined; add a [[group]] named {p:?} or fix the name", c.name),
                    )
                })?),
            };
        }
        for c in chain.into_iter().rev() {
            if placed.insert(c.name.clone()) {
                out.push(c.clone());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_parses() {
        let c = ServerConfig::parse(EXAMPLE, "allotd.toml").expect("example is valid");
        assert_eq!(c.groups.len(), 4);
        assert_eq!(c.server.lost_grace, 120);
        assert_eq!(c.breaker.window, 300);
        assert_eq!(
            (c.server.max_connections, c.server.max_connections_per_peer),
            (4096, 256)
        );
        assert_eq!(c.server.idle_timeout, 300);
        assert_eq!(
            c.server.master_ports,
            PortRange {
                low: 29_500,
                high: 29_999
            }
        );
    }

    #[test]
    fn master_ports_are_a_range_of_unprivileged_ports() {
        let c = ServerConfig::parse(
            "[server]\nmaster_ports = \"40000-40009\"\n[[group]]\nname = \"p\"\nweight = 1\n",
            "a.toml",
        )
        .expect("valid");
        assert_eq!(
            (c.server.master_ports.low, c.server.master_ports.high),
            (40_000, 40_009)
        );
        for bad in ["80-90", "30000-29000", "x", "29500-70000"] {
            let e = ServerConfig::parse(
                &format!("[server]\nmaster_ports = {bad:?}\n[[group]]\nname = \"p\"\nweight = 1\n"),
                "a.toml",
            )
            .expect_err(bad);
            assert_eq!(e.field, "server.master_ports", "{e}");
            assert!(e.to_string().contains("29500-29999"), "{e}");
        }
    }

    #[test]
    fn min_pass_interval_is_at_most_the_schedule_interval() {
        let cfg = |v: &str| {
            ServerConfig::parse(
                &format!("[server]\nschedule_interval = \"10s\"\nmin_pass_interval = \"{v}\"\n[[group]]\nname = \"p\"\nweight = 1\n"),
                "a.toml",
            )
        };
        assert_eq!(cfg("5s").expect("valid").server.min_pass_interval, 5);
        let e = cfg("1m").unwrap_err();
        assert!(e.to_string().contains("server.min_pass_interval"), "{e}");
        assert!(e.to_string().contains("schedule_interval (10 s)"), "{e}");
    }

    #[test]
    fn every_key_has_its_entry_in_the_reference() {
        let doc = include_str!("../../docs/reference/allotd.toml.md");
        let group = "[[group]]\nname = \"p\"\nweight = 1\n";
        for (table, text) in [
            ("server", format!("[server]\nzz_unknown = 1\n{group}")),
            ("policy", format!("[policy]\nzz_unknown = 1\n{group}")),
            ("breaker", format!("[breaker]\nzz_unknown = 1\n{group}")),
            ("notify", format!("[notify]\nzz_unknown = 1\n{group}")),
            ("roles", format!("[roles]\nzz_unknown = 1\n{group}")),
            ("auth", format!("[auth]\nzz_unknown = 1\n{group}")),
            ("tls", format!("[tls]\nzz_unknown = 1\n{group}")),
            (
                "classes.NAME",
                format!("[classes.debug]\nzz_unknown = 1\n{group}"),
            ),
            ("group", format!("{group}zz_unknown = 1\n")),
        ] {
            let e = ServerConfig::parse(&text, "a.toml").expect_err(table);
            let heading = if table == "group" { "[group]" } else { table };
            let missing = allot_common::config_error::keys_missing_from_reference(doc, heading, &e)
                .unwrap_or_else(|why| panic!("docs/reference/allotd.toml.md: {why}"));
            assert!(
                missing.is_empty(),
                "[{table}] {missing:?} not in docs/reference/allotd.toml.md: add their rows"
            );
        }
    }

    #[test]
    fn each_class_may_have_a_default_contract() {
        let c = ServerConfig::parse(EXAMPLE, "allotd.toml").expect("example");
        assert_eq!(c.classes["training"].min_runtime, Some(8 * 3_600));
        assert_eq!(c.classes["debug"].time_limit, Some(3_600));
        assert!(
            !c.classes.contains_key("batch"),
            "batch stays free occupancy"
        );
        let cfg = |t: &str| {
            ServerConfig::parse(
                &format!("{t}\n[[group]]\nname = \"p\"\nweight = 1\n"),
                "a.toml",
            )
        };
        let e = cfg("[classes.gpu]\nmin_runtime = \"1h\"").unwrap_err();
        assert_eq!(e.field, "classes.gpu", "{e}");
        assert!(
            e.message.contains("batch, debug, interactive, training"),
            "{e}"
        );
        let e = cfg("[classes.debug]\nmin_runtime = \"2h\"\ntime_limit = \"1h\"").unwrap_err();
        assert_eq!(e.field, "classes.debug.min_runtime", "{e}");
        let e = cfg("[classes.debug]\nmin_runtim = \"2h\"").unwrap_err();
        assert!(e.to_string().contains("min_runtim"), "{e}");
    }

    #[test]
    fn gpu_hour_weights_are_read_and_a_bad_one_is_named() {
        let cfg = |w: &str| {
            ServerConfig::parse(
                &format!(
                    "[policy]\ngpu_hour_weight = {{ {w} }}\n[[group]]\nname = \"p\"\nweight = 1\n"
                ),
                "a.toml",
            )
        };
        let c = cfg("b300 = 2.0, h100 = 1").expect("valid");
        assert_eq!(c.policy.gpu_weights_milli()["b300"], 2000);
        for bad in ["b300 = 0", "B300 = 1.5", "b300 = 500"] {
            let e = cfg(bad).unwrap_err();
            assert!(
                e.to_string().contains("policy.gpu_hour_weight"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn groups_may_come_in_any_order() {
        let c = ServerConfig::parse(
            "[[group]]\nname = \"p\"\nparent = \"t\"\nweight = 1\n[[group]]\nname = \"t\"\nweight = 1\n",
            "a.toml",
        )
        .expect("valid");
        assert_eq!(c.groups[0].name, "t");
    }

    #[test]
    fn tree_errors_name_the_group_and_line() {
        let e = ServerConfig::parse(
            "[[group]]\nname = \"a\"\nparent = \"b\"\nweight = 1\n[[group]]\nname = \"b\"\nparent = \"a\"\nweight = 1\n",
            "a.toml",
        )
        .unwrap_err();
        assert!(e.message.contains("cycle"), "{e}");
        let e = ServerConfig::parse(
            "[[group]]\nname = \"a\"\nparent = \"zz\"\nweight = 1\n",
            "a.toml",
        )
        .unwrap_err();
        assert!(e.message.contains("\"zz\"") && e.line == 2, "{e}");
        let e =
            ServerConfig::parse("[[group]]\nname = \"a\"\nweight = -2\n", "a.toml").unwrap_err();
        assert!(e.message.contains("from 1e-6 to 1e6"), "{e}");
        let e = ServerConfig::parse(
            "[server]\nlisten = \"nowhere\"\n[[group]]\nname = \"a\"\nweight = 1\n",
            "a.toml",
        )
        .unwrap_err();
        assert_eq!((e.field.as_str(), e.line), ("server.listen", 2), "{e}");
        let e = ServerConfig::parse("[server]\nlost_grace = \"soon\"\n", "a.toml").unwrap_err();
        assert_eq!(e.field, "server.lost_grace", "{e}");
        let e = ServerConfig::parse(
            "[server]\nmax_connections = 100\nmax_connections_per_peer = 100\n",
            "a.toml",
        )
        .unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.line),
            ("server.max_connections_per_peer", 3),
            "{e}"
        );
        let e = ServerConfig::parse("[server]\nidle_timeout = \"1s\"\n", "a.toml").unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.line),
            ("server.idle_timeout", 2),
            "{e}"
        );
        let e = ServerConfig::parse("", "a.toml").unwrap_err();
        assert!(e.message.contains("allotd init"), "{e}");
    }
}
