//! The daemons' logging: `tracing` to stderr, filtered by `$ALLOT_LOG`.

/// Installs the global subscriber: the filter from `$ALLOT_LOG` (an `EnvFilter`
/// directive such as `info,allot_agent=debug`), else `default_filter`.
///
/// Colours only on a terminal: journald and log files want plain text.
pub fn init(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ALLOT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
