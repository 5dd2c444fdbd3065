//! The standard `process_*` metrics of a Prometheus client, for this process, read
//! from `/proc/self`: CPU seconds, resident and virtual memory, open and allowed
//! descriptors, start time. What a dashboard's "is the daemon healthy" row reads.

use crate::exposition::{Exposition, Kind};

/// What `/proc/self` says now; `None` where it could not be read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Process {
    /// User and system CPU time, seconds.
    pub cpu_seconds: Option<f64>,
    /// Resident memory, bytes.
    pub resident_bytes: Option<u64>,
    /// Virtual memory, bytes.
    pub virtual_bytes: Option<u64>,
    /// Open file descriptors.
    pub open_fds: Option<u64>,
    /// The soft limit on them.
    pub max_fds: Option<u64>,
    /// When the process started, Unix seconds.
    pub start_time: Option<f64>,
}

impl Process {
    /// Reads this process's figures.
    pub fn read() -> Process {
        use nix::unistd::{sysconf, SysconfVar};
        let tick = sysconf(SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
        let page = sysconf(SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .unwrap_or(4096) as u64;
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command, which may hold spaces: state is field 3.
        let rest: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, r)| r.split_whitespace().collect())
            .unwrap_or_default();
        let field = |n: usize| rest.get(n - 3).and_then(|v| v.parse::<u64>().ok());
        let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        });
        Process {
            cpu_seconds: field(14).zip(field(15)).map(|(u, s)| (u + s) as f64 / tick),
            virtual_bytes: field(23),
            resident_bytes: field(24).map(|p| p * page),
            start_time: field(22).zip(boot).map(|(t, b)| b as f64 + t as f64 / tick),
            open_fds: std::fs::read_dir("/proc/self/fd")
                .ok()
                .map(|d| d.count() as u64),
            max_fds: nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .ok()
                .map(|(soft, _)| soft),
        }
    }

    /// Adds the `process_*` families to `e` (those that could be read).
    pub fn write(&self, e: &mut Exposition) {
        let mut one = |name: &str, help: &str, kind: Kind, v: Option<String>| {
            if let Some(v) = v {
                e.single(name, help, kind, v);
            }
        };
        one(
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
            Kind::Counter,
            self.cpu_seconds.map(|v| format!("{v:.2}")),
        );
        one(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            Kind::Gauge,
            self.resident_bytes.map(|v| v.to_string()),
        );
        one(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            Kind::Gauge,
            self.virtual_bytes.map(|v| v.to_string()),
        );
        one(
            "process_open_fds",
            "Number of open file descriptors.",
            Kind::Gauge,
            self.open_fds.map(|v| v.to_string()),
        );
        one(
            "process_max_fds",
            "Maximum number of open file descriptors.",
            Kind::Gauge,
            self.max_fds.map(|v| v.to_string()),
        );
        one(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            Kind::Gauge,
            self.start_time.map(|v| format!("{v:.2}")),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_descriptors_and_a_start_in_the_past() {
        let p = Process::read();
        assert!(p.resident_bytes.is_some_and(|b| b > 0), "{p:?}");
        assert!(p.open_fds.is_some_and(|n| n >= 3), "{p:?}");
        assert!(
            p.max_fds.is_some_and(|n| n >= p.open_fds.unwrap_or(0)),
            "{p:?}"
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        assert!(
            p.start_time.is_some_and(|t| t > 1.0e9 && t <= now + 1.0),
            "{p:?}"
        );
        let mut e = Exposition::new();
        p.write(&mut e);
        let text = e.finish();
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter"),
            "{text}"
        );
        assert!(text.contains("\nprocess_open_fds "), "{text}");
    }
}
