//! `/etc/allot/agent.toml`: the `[agent]` section here, `[health]` in allot-health.
//! Errors name the file, line and field; flags given to `allot-agent` override the
//! file; `SIGHUP` or an edit reloads the settings marked reloadable.

use allot_checkpoint_hooks::{host_allowed, Hook};
use allot_common::config_error::{from_toml, ConfigError, Positions};
use allot_health::config::HealthConfig;
use allot_units::de_duration;
use serde::Deserialize;
use std::path::PathBuf;

/// Where the agent looks for its config when `--config` is not given.
pub const DEFAULT_PATH: &str = "/etc/allot/agent.toml";

/// The `[agent]` section.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentSection {
    /// The local API's unix socket (restart to change).
    pub socket: PathBuf,
    /// Its mode, octal (restart to change).
    pub socket_mode: String,
    /// Its group: members may read and change (restart to change).
    pub socket_group: String,
    /// Lease table, event log, kernel-log memory (restart to change).
    pub state_dir: PathBuf,
    /// Checkpoint grace for leases that name none (reloadable).
    #[serde(deserialize_with = "de_duration")]
    pub default_grace: u64,
    /// How long SIGTERM may take before SIGKILL (reloadable).
    #[serde(deserialize_with = "de_duration")]
    pub term_grace: u64,
    /// Without word from allotd this long, the host stops allotd's leases by their
    /// ladders (it fences), so that allotd may run a lost node's work elsewhere and
    /// never twice at once; 0: never, and allotd holds a lost node's leases until
    /// the host reports. Longer than any allotd restart (reloadable: for leases
    /// started after).
    #[serde(deserialize_with = "de_duration")]
    pub fence_after: u64,
    /// The host's default time-limit warning for leases that ask for none, this long
    /// before the limit; 0 (the default): none, since a program is never sent a
    /// signal it did not ask for. A submission's `--signal` wins (reloadable).
    #[serde(deserialize_with = "de_duration")]
    pub time_limit_warning: u64,
    /// The default warning's signal, to the workload's process group (reloadable).
    pub time_limit_signal: String,
    /// Checkpoint hook for local leases (`allot lease start`) that name none;
    /// empty: straight to SIGTERM (reloadable). Work from allotd uses exactly the
    /// hook it was submitted with: a program without a handler must not be killed
    /// by a signal it never asked for.
    pub default_checkpoint: String,
    /// The allocator (allotd) this agent reports to; empty: run alone (reloadable).
    pub allocator: String,
    /// This host's name for the allocator; empty: the system hostname.
    pub host: String,
    /// The cluster it belongs to.
    pub cluster: String,
    /// Its GPUs' type for `--gpu-type` (`h100`); empty: read from the first GPU's
    /// model (`NVIDIA H100 80GB HBM3` is `h100`) (restart to change).
    pub gpu_type: String,
    /// Its features for `--constraint` (`["nvlink", "ib"]`) (restart to change).
    pub features: Vec<String>,
    /// No work (a local lease, one from allotd, or an `exec:` hook) runs as a uid
    /// below this: system accounts own the host (reloadable).
    pub min_uid: u32,
    /// Work may run as root (uid 0), whatever `min_uid` says; off: a lease as root
    /// is refused (reloadable).
    pub allow_root: bool,
    /// Hosts an `http:` checkpoint hook may reach besides loopback (127.0.0.0/8,
    /// ::1, localhost); a lease whose hook points elsewhere is refused, so that a
    /// submission cannot make the agent call into the network (reloadable).
    pub hook_hosts: Vec<String>,
    /// Where the cluster reaches this host (an IP address or a host name), sent to
    /// allotd at registration: a gang's `MASTER_ADDR` when this host is its rank 0.
    /// Empty: the local IP address of the agent's connection to allotd (restart to
    /// change).
    pub advertise_addr: String,
    /// Below this many free bytes on the state dir's or the lease logs' file system
    /// the host drains as on a health fault, and clears once 10 % more is free; 0:
    /// never (reloadable).
    pub min_free_bytes: u64,
    /// How often free space is measured (reloadable).
    #[serde(deserialize_with = "de_duration")]
    pub disk_check_interval: u64,
    /// Where workloads' output goes (`<workload>/<run>.<rank>.out|err`, or the
    /// submission's `--output`/`--error` pattern under it); empty: `STATE_DIR/logs`
    /// (restart to change).
    pub log_dir: PathBuf,
    /// A directory on storage every host mounts at the same path (reloadable: for
    /// leases started after): each workload's `$ALLOT_CHECKPOINT_DIR` is
    /// `<root>/<user>/<workload>`, the same for every run on every host, so a
    /// requeued job finds its checkpoint. Empty: a new host-local directory per
    /// lease (`STATE_DIR/leases/<lease>/checkpoint`), good for the marker only.
    pub checkpoint_root: PathBuf,
    /// Bytes of output kept per run, stdout and stderr together; the rest is cut with
    /// a note at the end of the file (reloadable: for runs started after).
    pub max_output_bytes: u64,
    /// Where lease cgroups go: `auto` (the agent's delegated cgroup v2 subtree, or a
    /// writable cgroup v2 mount), `off` (process groups only), or a cgroup v2
    /// directory (restart to change).
    pub cgroup: String,
    /// Where `/metrics` is served in Prometheus text, plain HTTP (`127.0.0.1:9471`;
    /// `0.0.0.0:9471` for a Prometheus on another host): every GPU under
    /// dcgm-exporter's names, labelled with the lease and workload holding it.
    /// Empty: not served (restart to change).
    pub metrics_listen: String,
    /// A lease whose GPUs stay under this utilisation, %, for `idle_after` is idle:
    /// allotd hears it and flags it to its owner and operators (reloadable).
    pub idle_below: u32,
    /// How long under `idle_below` makes a lease idle; 0: never (reloadable).
    #[serde(deserialize_with = "de_duration")]
    pub idle_after: u64,
}

impl Default for AgentSection {
    fn default() -> Self {
        AgentSection {
            socket: "/run/allot/agent.sock".into(),
            socket_mode: "0660".into(),
            socket_group: "allot".into(),
            state_dir: "/var/lib/allot/agent".into(),
            default_grace: 120,
            term_grace: 30,
            fence_after: 600,
            time_limit_warning: 0,
            time_limit_signal: "USR2".into(),
            default_checkpoint: String::new(),
            allocator: String::new(),
            host: String::new(),
            cluster: "default".into(),
            gpu_type: String::new(),
            features: Vec::new(),
            min_uid: 1000,
            allow_root: false,
            hook_hosts: Vec::new(),
            advertise_addr: String::new(),
            min_free_bytes: 1 << 30,
            disk_check_interval: 15,
            log_dir: PathBuf::new(),
            checkpoint_root: PathBuf::new(),
            max_output_bytes: 1 << 30,
            cgroup: "auto".into(),
            metrics_listen: String::new(),
            idle_below: 5,
            idle_after: 3_600,
        }
    }
}

/// The whole agent config.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AgentConfig {
    /// `[agent]`.
    pub agent: AgentSection,
    /// `[health]`.
    pub health: HealthConfig,
}

impl AgentSection {
    /// Where workloads' output goes: `log_dir`, or `STATE_DIR/logs`.
    pub fn logs(&self) -> PathBuf {
        if self.log_dir.as_os_str().is_empty() {
            self.state_dir.join("logs")
        } else {
            self.log_dir.clone()
        }
    }
}

impl AgentConfig {
    /// Parses and checks a config file's text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<AgentConfig, ConfigError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Wrapper {
            #[serde(default)]
            agent: AgentSection,
            // Checked by HealthConfig::parse below.
            #[serde(default)]
            #[allow(dead_code)]
            health: Option<toml::Value>,
        }
        let w: Wrapper = from_toml(text, file, "agent")?;
        let health = HealthConfig::parse(text, file)?;
        let a = w.agent;
        let at = Positions::new(text, file);
        let err = |field: &str, message: String| at.error(field, message);
        socket_mode(&a.socket_mode).map_err(|m| err("agent.socket_mode", m))?;
        if a.socket.as_os_str().is_empty() {
            return Err(err(
                "agent.socket",
                "empty; give a path such as /run/allot/agent.sock".into(),
            ));
        }
        if a.state_dir.as_os_str().is_empty() {
            return Err(err(
                "agent.state_dir",
                "empty; give a directory such as /var/lib/allot/agent".into(),
            ));
        }
        if !a.log_dir.as_os_str().is_empty() && a.state_dir.starts_with(&a.log_dir) {
            return Err(err(
                "agent.log_dir",
                format!(
                    "{} holds the state dir {}: job output would sit beside agent.db; give a directory of its own, e.g. /var/log/allot/jobs (or leave it empty for STATE_DIR/logs)",
                    a.log_dir.display(),
                    a.state_dir.display()
                ),
            ));
        }
        if !a.allocator.is_empty() {
            let addr = crate::credentials::with_scheme(&a.allocator);
            crate::credentials::check_allocator(&addr)
                .map_err(|why| err("agent.allocator", format!("{:?}: {why}", a.allocator)))?;
        }
        if !a.checkpoint_root.as_os_str().is_empty() && !a.checkpoint_root.is_absolute() {
            return Err(err(
                "agent.checkpoint_root",
                format!(
                    "{}: give an absolute directory that every host mounts at the same path, e.g. /shared/allot/checkpoints (or leave it empty for host-local ones)",
                    a.checkpoint_root.display()
                ),
            ));
        }
        if a.max_output_bytes == 0 {
            return Err(err(
                "agent.max_output_bytes",
                "0 would keep no output at all; give a size in bytes, e.g. 1073741824 (1 GiB)"
                    .into(),
            ));
        }
        if !matches!(a.cgroup.as_str(), "auto" | "off") && !a.cgroup.starts_with('/') {
            return Err(err(
                "agent.cgroup",
                format!(
                    "{:?}; give \"auto\", \"off\" or an absolute cgroup v2 directory",
                    a.cgroup
                ),
            ));
        }
        format!("signal:{}", a.time_limit_signal)
            .parse::<Hook>()
            .map_err(|e| {
                err(
                    "agent.time_limit_signal",
                    format!(
                        "{:?} is not a signal that can be caught ({}); use e.g. USR2",
                        a.time_limit_signal, e.why
                    ),
                )
            })?;
        if let Some(h) = a.hook_hosts.iter().find(|h| {
            let bare = h.trim_start_matches('[').trim_end_matches(']');
            bare.is_empty()
                || !bare
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'))
        }) {
            return Err(err(
                "agent.hook_hosts",
                format!("{h:?} is not a host name or address; give e.g. \"ckpt.example.com\" or \"10.0.0.5\", without scheme or port"),
            ));
        }
        if !a.advertise_addr.is_empty()
            && (a.advertise_addr.len() > allot_common::fields::MAX_NAME
                || !a
                    .advertise_addr
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_')))
        {
            return Err(err(
                "agent.advertise_addr",
                format!("{:?} is not an address or host name; give e.g. \"10.0.0.5\" or \"node-1.cluster.example\", without scheme or port, or leave it empty", a.advertise_addr),
            ));
        }
        if !a.metrics_listen.is_empty() && a.metrics_listen.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(err(
                "agent.metrics_listen",
                format!("{:?} is not an address and port; give e.g. \"127.0.0.1:9471\", or leave it empty to serve no metrics", a.metrics_listen),
            ));
        }
        if a.idle_below > 100 {
            return Err(err(
                "agent.idle_below",
                format!("{}: a utilisation in %, 0 to 100 (default 5)", a.idle_below),
            ));
        }
        if a.disk_check_interval == 0 {
            return Err(err(
                "agent.disk_check_interval",
                "0s; give how often free space is measured, e.g. \"15s\" (min_free_bytes = 0 turns the check off)".into(),
            ));
        }
        if !a.default_checkpoint.is_empty() {
            let hook = a
                .default_checkpoint
                .parse::<Hook>()
                .map_err(|e| err("agent.default_checkpoint", e.to_string()))?;
            if let Some(host) = hook.http_host().filter(|h| !host_allowed(h, &a.hook_hosts)) {
                return Err(err(
                    "agent.default_checkpoint",
                    format!("{:?} reaches {host:?}, which is neither loopback nor in hook_hosts; add it to agent.hook_hosts", a.default_checkpoint),
                ));
            }
        }
        Ok(AgentConfig { agent: a, health })
    }

    /// Reads and parses `path`.
    pub fn load(path: &std::path::Path) -> Result<AgentConfig, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: 0,
            field: "(file)".into(),
            message: format!("cannot read: {e}"),
        })?;
        Self::parse(&text, &file)
    }

    /// The settings that differ from `new` but only take effect after a restart.
    pub fn needs_restart(&self, new: &AgentConfig) -> Vec<&'static str> {
        let (a, b) = (&self.agent, &new.agent);
        let mut v = Vec::new();
        if a.socket != b.socket {
            v.push("agent.socket");
        }
        if a.socket_mode != b.socket_mode {
            v.push("agent.socket_mode");
        }
        if a.socket_group != b.socket_group {
            v.push("agent.socket_group");
        }
        if a.state_dir != b.state_dir {
            v.push("agent.state_dir");
        }
        if a.log_dir != b.log_dir {
            v.push("agent.log_dir");
        }
        if a.cgroup != b.cgroup {
            v.push("agent.cgroup");
        }
        if a.metrics_listen != b.metrics_listen {
            v.push("agent.metrics_listen");
        }
        if a.host != b.host || a.cluster != b.cluster || a.advertise_addr != b.advertise_addr {
            v.push("agent.host/cluster");
        }
        if self.health != new.health {
            v.push("health");
        }
        v
    }
}

/// Parses an octal mode such as `0660`.
pub fn socket_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal file mode; use e.g. \"0660\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_has_its_entry_in_the_reference() {
        let doc = include_str!("../../docs/reference/agent.toml.md");
        for table in ["agent", "health"] {
            let e = AgentConfig::parse(&format!("[{table}]\nzz_unknown = 1\n"), "a.toml")
                .expect_err(table);
            let missing = allot_common::config_error::keys_missing_from_reference(doc, table, &e)
                .unwrap_or_else(|why| panic!("docs/reference/agent.toml.md: {why}"));
            assert!(
                missing.is_empty(),
                "[{table}] {missing:?} not in docs/reference/agent.toml.md: add their rows"
            );
        }
    }

    #[test]
    fn defaults_need_no_file() {
        let c = AgentConfig::parse("", "agent.toml").expect("empty is fine");
        assert_eq!(c, AgentConfig::default());
        assert_eq!(socket_mode(&c.agent.socket_mode), Ok(0o660));
    }

    #[test]
    fn values_and_durations() {
        let c = AgentConfig::parse(
            "[agent]\nsocket = \"/tmp/a.sock\"\ndefault_grace = \"5m\"\nterm_grace = 10\n[health]\nsource = \"fake:8\"\n",
            "a.toml",
        )
        .expect("valid");
        assert_eq!(c.agent.default_grace, 300);
        assert_eq!(c.agent.term_grace, 10);
        assert_eq!(c.health.source, "fake:8");
        assert_eq!(c.agent.min_free_bytes, 1 << 30, "the default: 1 GiB");
        assert_eq!(c.agent.disk_check_interval, 15);
        let c = AgentConfig::parse(
            "[agent]\nmin_free_bytes = 5000000000\ndisk_check_interval = \"1m\"\n",
            "a.toml",
        )
        .expect("valid");
        assert_eq!(c.agent.min_free_bytes, 5_000_000_000);
        assert_eq!(c.agent.disk_check_interval, 60);
        let e = AgentConfig::parse("[agent]\ndisk_check_interval = 0\n", "a.toml").unwrap_err();
        assert_eq!(
            (e.line, e.field.as_str()),
            (2, "agent.disk_check_interval"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_line_and_field() {
        let e = AgentConfig::parse("[agent]\n\ndefault_grace = \"soon\"\n", "a.toml").unwrap_err();
        assert_eq!(
            (e.line, e.field.as_str()),
            (3, "agent.default_grace"),
            "{e}"
        );
        assert!(e.to_string().contains("a.toml:3"), "{e}");
        let e = AgentConfig::parse("[agent]\nsokcet = \"/x\"\n", "a.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (2, "sokcet"), "{e}");
        let e = AgentConfig::parse("[agent]\nsocket_mode = \"rw\"\n", "a.toml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (2, "agent.socket_mode"), "{e}");
        let e =
            AgentConfig::parse("[agent]\ntime_limit_signal = \"KILL\"\n", "a.toml").unwrap_err();
        assert_eq!(e.field, "agent.time_limit_signal", "{e}");
        let e =
            AgentConfig::parse("[agent]\ndefault_checkpoint = \"smoke\"\n", "a.toml").unwrap_err();
        assert!(e.message.contains("signal:USR1"), "{e}");
        let e = AgentConfig::parse("[health]\nsource = \"gpu\"\n", "a.toml").unwrap_err();
        assert_eq!(e.field, "health.source", "{e}");
        let e = AgentConfig::parse("[agnet]\n", "a.toml").unwrap_err();
        assert_eq!(e.field, "agnet", "{e}");
    }

    #[test]
    fn output_settings_are_checked() {
        let c = AgentConfig::parse("[agent]\nstate_dir = \"/s\"\n", "a.toml").expect("ok");
        assert_eq!(
            c.agent.logs(),
            std::path::Path::new("/s/logs"),
            "the default log dir"
        );
        assert_eq!(c.agent.max_output_bytes, 1 << 30);
        assert_eq!(c.agent.cgroup, "auto");
        let c = AgentConfig::parse(
            "[agent]\nlog_dir = \"/var/log/jobs\"\nmax_output_bytes = 1048576\ncgroup = \"off\"\n",
            "a.toml",
        )
        .expect("ok");
        assert_eq!(c.agent.logs(), std::path::Path::new("/var/log/jobs"));
        for (text, field, says) in [
            (
                "state_dir = \"/s/a\"\nlog_dir = \"/s\"",
                "agent.log_dir",
                "beside agent.db",
            ),
            ("max_output_bytes = 0", "agent.max_output_bytes", "1 GiB"),
            ("cgroup = \"yes\"", "agent.cgroup", "\"auto\", \"off\""),
        ] {
            let e = AgentConfig::parse(&format!("[agent]\n{text}\n"), "a.toml").unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.message.contains(says), "{e}");
        }
    }

    #[test]
    fn who_may_run_work_and_where_hooks_may_go() {
        let d = AgentConfig::default().agent;
        assert_eq!((d.min_uid, d.allow_root), (1000, false));
        assert!(d.hook_hosts.is_empty());
        let c = AgentConfig::parse(
            "[agent]\nmin_uid = 500\nallow_root = true\nhook_hosts = [\"ckpt.example\", \"[fd00::5]\"]\ndefault_checkpoint = \"http://ckpt.example:80/x\"\n",
            "a.toml",
        )
        .expect("valid");
        assert_eq!((c.agent.min_uid, c.agent.allow_root), (500, true));
        assert_eq!(c.agent.hook_hosts, ["ckpt.example", "[fd00::5]"]);
        let e = AgentConfig::parse(
            "[agent]\nhook_hosts = [\"http://ckpt.example/\"]\n",
            "a.toml",
        )
        .unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (2, "agent.hook_hosts"), "{e}");
        assert!(e.message.contains("without scheme or port"), "{e}");
        // allotd over plain http only on this host; a check fails as the start would.
        for ok in [
            "allotd.example:7070",
            "https://10.0.0.1:7070",
            "http://127.0.0.1:7070",
            "http://[::1]:7070",
        ] {
            AgentConfig::parse(&format!("[agent]\nallocator = \"{ok}\"\n"), "a.toml").expect(ok);
        }
        let e = AgentConfig::parse("[agent]\nallocator = \"http://10.0.0.1:7070\"\n", "a.toml")
            .unwrap_err();
        assert_eq!(e.field, "agent.allocator", "{e}");
        assert!(
            e.message
                .contains("plain http is for a loopback allotd only"),
            "{e}"
        );
        let e = AgentConfig::parse(
            "[agent]\ndefault_checkpoint = \"http://10.0.0.1/x\"\n",
            "a.toml",
        )
        .unwrap_err();
        assert_eq!(e.field, "agent.default_checkpoint", "{e}");
        assert!(
            e.message
                .contains("reaches \"10.0.0.1\", which is neither loopback nor in hook_hosts"),
            "{e}"
        );
        let e = AgentConfig::parse("[agent]\nmin_uid = -1\n", "a.toml").unwrap_err();
        assert_eq!(e.line, 2, "{e}");
    }

    #[test]
    fn restart_only_settings_are_named() {
        let a = AgentConfig::default();
        let mut b = a.clone();
        b.agent.default_grace = 1;
        assert!(a.needs_restart(&b).is_empty());
        b.agent.socket = "/elsewhere".into();
        assert_eq!(a.needs_restart(&b), vec!["agent.socket"]);
    }
}
