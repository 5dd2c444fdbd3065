//! The daemons' logging: `tracing` to stderr, filtered by `$ALLOT_LOG`, as text
//! or JSON lines; under systemd, levels as syslog prefixes so that `journalctl -p
//! err` filters, and no timestamp beside journald's own.

use std::fmt;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{FmtSpan, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// One line of text per event (the default).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields`.
    Json,
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            other => Err(format!("{other:?} is not a log format; use text or json")),
        }
    }
}

/// The syslog priority journald reads from a `<N>` line prefix.
fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// Text for journald: `<6>target: message fields`, no time and no level word (the
/// journal keeps both).
struct Journald;

impl<S, N> FormatEvent<S, N> for Journald
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        write!(w, "<{}>{}: ", priority(meta.level()), meta.target())?;
        ctx.format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

/// Whether stderr is the journal stream systemd connected (`$JOURNAL_STREAM` names
/// its device and inode), as systemd documents for choosing the journal's format.
pub fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    match std::fs::metadata("/proc/self/fd/2") {
        Ok(m) => dev.parse() == Ok(m.dev()) && ino.parse() == Ok(m.ino()),
        Err(_) => false,
    }
}

/// The filter: `$ALLOT_LOG` (an `EnvFilter` directive such as
/// `info,allot_agent=debug`), else `default_filter` with the network stack's chatter
/// kept to warnings.
fn filter(default_filter: &str) -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_env("ALLOT_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "{default_filter},h2=warn,hyper=warn,hyper_util=warn,tower=warn,rustls=warn,tonic=warn"
        ))
    })
}

/// Installs the global subscriber writing to stderr in `format`. Colours only on
/// a terminal; journal prefixes only when stderr is the journal.
pub fn init(default_filter: &str, format: Format) {
    install(
        default_filter,
        format,
        stderr_is_journal(),
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        std::io::stderr,
    );
}

fn install<W>(default_filter: &str, format: Format, journal: bool, ansi: bool, writer: W)
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let _ = tracing::subscriber::set_global_default(subscriber(
        default_filter,
        format,
        journal,
        ansi,
        writer,
    ));
}

/// The subscriber [`init`] installs, writing to `writer`.
fn subscriber<W>(
    default_filter: &str,
    format: Format,
    journal: bool,
    ansi: bool,
    writer: W,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter(default_filter))
        .with_writer(writer)
        .with_span_events(FmtSpan::NONE);
    match (format, journal) {
        (Format::Json, _) => Box::new(b.json().with_current_span(false).finish()),
        (Format::Text, true) => Box::new(b.with_ansi(false).event_format(Journald).finish()),
        (Format::Text, false) => Box::new(b.with_ansi(ansi).finish()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("buf").extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Buf {
        type Writer = Buf;
        fn make_writer(&'w self) -> Buf {
            self.clone()
        }
    }

    fn lines(format: Format, journal: bool) -> String {
        let buf = Buf::default();
        let s = subscriber("info", format, journal, false, buf.clone());
        tracing::subscriber::with_default(s, || {
            tracing::info!(workload = 7u64, "start A-7 on n0");
            tracing::error!(node = "n1", "xid 79");
            tracing::debug!("not shown at info");
        });
        let out = String::from_utf8(buf.0.lock().expect("buf").clone()).expect("utf-8");
        out
    }

    #[test]
    fn the_journal_gets_priorities_and_no_second_timestamp() {
        let out = lines(Format::Text, true);
        let l: Vec<&str> = out.lines().collect();
        assert_eq!(l.len(), 2, "{out}");
        // The priority, then the target at once: journald stamps each line itself.
        assert_eq!(
            l[0], "<6>allot_common::logging::tests: start A-7 on n0 workload=7",
            "{out}"
        );
        assert_eq!(
            l[1], "<3>allot_common::logging::tests: xid 79 node=\"n1\"",
            "{out}"
        );
    }

    #[test]
    fn text_and_json_lines() {
        let out = lines(Format::Text, false);
        assert!(
            out.lines()
                .next()
                .is_some_and(|l| l.contains(" INFO ") && l.contains("start A-7 on n0")),
            "{out}"
        );
        let out = lines(Format::Json, false);
        for l in out.lines() {
            let v: serde_json::Value = serde_json::from_str(l).expect("one JSON object per line");
            assert!(v["timestamp"].is_string(), "{l}");
            assert!(v["fields"]["message"].is_string(), "{l}");
        }
        assert!(out.contains("\"level\":\"ERROR\""), "{out}");
        assert!(out.contains("\"workload\":7"), "{out}");
    }

    #[test]
    fn formats_parse_by_name() {
        assert_eq!("json".parse(), Ok(Format::Json));
        assert!("xml"
            .parse::<Format>()
            .unwrap_err()
            .contains("text or json"));
    }
}
