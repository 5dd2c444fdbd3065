//! Prometheus text exposition (format 0.0.4): the one writer every `/metrics` body
//! goes through, so names, HELP lines and label values are escaped one way.

use std::fmt::{Display, Write};

/// The kind of a metric family (`# TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A value that goes up and down.
    Gauge,
    /// A value that only goes up.
    Counter,
    /// Buckets, sum and count.
    Histogram,
    /// Sum and count.
    Summary,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
            Kind::Summary => "summary",
        }
    }
}

/// The content type of what [`Exposition::finish`] returns.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A body being written: families, each a HELP and TYPE line and its samples.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// An empty body.
    pub fn new() -> Exposition {
        Exposition::default()
    }

    /// Starts family `name`: its HELP (escaped) and TYPE lines.
    pub fn family(&mut self, name: &str, help: &str, kind: Kind) -> &mut Self {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(
            self.out,
            "# HELP {name} {help}\n# TYPE {name} {}",
            kind.as_str()
        );
        self
    }

    /// One sample of `name` (a family's name, or its `_bucket`, `_sum`, `_count`)
    /// with its labels, values escaped.
    pub fn sample(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        value: impl Display,
    ) -> &mut Self {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(k);
                self.out.push_str("=\"");
                for c in v.chars() {
                    match c {
                        '\\' => self.out.push_str("\\\\"),
                        '"' => self.out.push_str("\\\""),
                        '\n' => self.out.push_str("\\n"),
                        c => self.out.push(c),
                    }
                }
                self.out.push('"');
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
        self
    }

    /// A family whose samples differ by one label: `(label value, value)` rows.
    pub fn labelled<'a, V: Display>(
        &mut self,
        name: &str,
        help: &str,
        kind: Kind,
        label: &str,
        rows: impl IntoIterator<Item = (&'a str, V)>,
    ) -> &mut Self {
        self.family(name, help, kind);
        for (l, v) in rows {
            self.sample(name, &[(label, l)], v);
        }
        self
    }

    /// A family with one unlabelled sample.
    pub fn single(&mut self, name: &str, help: &str, kind: Kind, value: impl Display) -> &mut Self {
        self.family(name, help, kind).sample(name, &[], value)
    }

    /// The body.
    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut e = Exposition::new();
        e.family("x_total", "a \\ help\nline", Kind::Counter)
            .sample("x_total", &[("a", "q\"b\\s\nn"), ("b", "plain")], 3)
            .sample("x_total", &[], 1.5);
        assert_eq!(
            e.finish(),
            "# HELP x_total a \\\\ help\\nline\n# TYPE x_total counter\n\
             x_total{a=\"q\\\"b\\\\s\\nn\",b=\"plain\"} 3\nx_total 1.5\n"
        );
        let mut e = Exposition::new();
        e.labelled("up", "Up.", Kind::Gauge, "node", [("n1", 1), ("n2", 0)]);
        assert_eq!(
            e.finish(),
            "# HELP up Up.\n# TYPE up gauge\nup{node=\"n1\"} 1\nup{node=\"n2\"} 0\n"
        );
    }
}
