//! Config errors that name the file, the line and the field, with the line taken
//! from the TOML parser's own spans rather than by searching the text (a search
//! names the first line that looks alike, which may be another table's).

use std::ops::Range;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// A config that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {field}: {message}")]
pub struct ConfigError {
    /// The file.
    pub file: String,
    /// 1-based line (0 when unknown).
    pub line: usize,
    /// The field (dotted: `section.key`).
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl ConfigError {
    /// The keys a table accepts, read from serde's refusal of one it does not
    /// (`unknown field `x`, expected one of `a`, `b``); empty for other errors.
    pub fn accepted_keys(&self) -> Vec<&str> {
        let list = self.message.split(", expected").nth(1).unwrap_or("");
        list.split('`').skip(1).step_by(2).collect()
    }
}

/// The keys of `table` that a config reference (`## `[table]`` followed by rows
/// `| `key` | …`) has no row for; `refusal` is the parser's refusal of an unknown key
/// in that table. Err when the reference has no such table or the refusal names
/// no keys. What keeps `docs/reference/` in step with the config types.
pub fn keys_missing_from_reference(
    reference: &str,
    table: &str,
    refusal: &ConfigError,
) -> Result<Vec<String>, String> {
    let keys = refusal.accepted_keys();
    if keys.is_empty() {
        return Err(format!("[{table}]: the refusal names no keys: {refusal}"));
    }
    let rows = reference
        .split(&format!("## `[{table}]`"))
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .ok_or_else(|| format!("the reference has no [{table}] table"))?;
    Ok(keys
        .into_iter()
        .filter(|k| !rows.contains(&format!("| `{k}` |")))
        .map(str::to_string)
        .collect())
}

/// A TOML text and the positions its parser reported for every key; semantic checks
/// made after deserializing use it to point at the line to edit.
pub struct Positions<'a> {
    text: &'a str,
    file: &'a str,
    root: Option<Spanned<DeTable<'a>>>,
}

impl<'a> Positions<'a> {
    /// Parses `text` (read from `file`) for positions only. A text that does not parse
    /// has none: every line is 0 (the deserializer's own error names the line then).
    pub fn new(text: &'a str, file: &'a str) -> Positions<'a> {
        Positions {
            text,
            file,
            root: DeTable::parse(text).ok(),
        }
    }

    /// The 1-based line of the key at dotted `path` (`health.thresholds.sbe_per_hour`;
    /// a number indexes an array, `group.2.weight`). Where the path stops short, the
    /// line of the deepest key that exists (its section); 0 when none does.
    pub fn line(&self, path: &str) -> usize {
        let Some(root) = &self.root else { return 0 };
        let mut table = root.get_ref();
        let mut array: Option<&[Spanned<DeValue<'a>>]> = None;
        let mut found: Option<Range<usize>> = None;
        for seg in path.split('.') {
            let value = match array.take() {
                Some(items) => match seg.parse::<usize>().ok().and_then(|i| items.get(i)) {
                    Some(v) => v,
                    None => break,
                },
                None => match table.iter().find(|(k, _)| k.get_ref() == seg) {
                    Some((k, v)) => {
                        found = Some(k.span());
                        v
                    }
                    None => break,
                },
            };
            match value.get_ref() {
                DeValue::Table(t) => table = t,
                DeValue::Array(a) => array = Some(a),
                _ => break,
            }
        }
        found.map_or(0, |s| self.line_at(s.start))
    }

    /// The 1-based line of `key = "value"` inside the array of tables `array`
    /// (`[[group]]` with `name = "physics"`); 0 when no such table exists.
    pub fn line_in_array(&self, array: &str, key: &str, value: &str) -> usize {
        let Some(root) = &self.root else { return 0 };
        let Some((_, v)) = root.get_ref().iter().find(|(k, _)| k.get_ref() == array) else {
            return 0;
        };
        let DeValue::Array(items) = v.get_ref() else {
            return 0;
        };
        items
            .iter()
            .filter_map(|item| match item.get_ref() {
                DeValue::Table(t) => t.iter().find(|(k, v)| {
                    k.get_ref() == key
                        && matches!(v.get_ref(), DeValue::String(s) if s.as_ref() == value)
                }),
                _ => None,
            })
            .map(|(k, _)| self.line_at(k.span().start))
            .next()
            .unwrap_or(0)
    }

    /// An error about `field`, at the line where it is set.
    pub fn error(&self, field: &str, message: impl Into<String>) -> ConfigError {
        self.error_at(field, self.line(field), message)
    }

    /// An error about `field` at a line found otherwise (see [`Positions::line_in_array`]).
    pub fn error_at(&self, field: &str, line: usize, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.into(),
            line,
            field: field.into(),
            message: message.into(),
        }
    }

    /// A deserializer error as a [`ConfigError`]: the line from the error's span; the
    /// field from the message (`unknown field `x``), else the key whose value holds
    /// the error, else `default_field`.
    pub fn toml_error(&self, e: &toml::de::Error, default_field: &str) -> ConfigError {
        let span = e.span();
        let line = span.as_ref().map_or(0, |s| self.line_at(s.start));
        // Only serde's field messages quote a field; syntax errors quote the token.
        let names_field = ["unknown field", "missing field", "duplicate field"]
            .iter()
            .any(|p| e.message().starts_with(p));
        let field = names_field
            .then(|| e.message().split('`').nth(1).map(str::to_string))
            .flatten()
            .or_else(|| span.and_then(|s| self.path_at(s.start)))
            .unwrap_or_else(|| default_field.to_string());
        self.error_at(&field, line, e.message().trim_end())
    }

    /// The dotted path of the innermost key whose value spans byte `offset` (array
    /// indices left out: `group.weight`).
    fn path_at(&self, offset: usize) -> Option<String> {
        let mut path = Vec::new();
        path_in_table(self.root.as_ref()?.get_ref(), offset, &mut path);
        (!path.is_empty()).then(|| path.join("."))
    }

    /// The 1-based line holding byte `offset`.
    fn line_at(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }
}

fn within(s: Range<usize>, offset: usize) -> bool {
    s.start <= offset && offset < s.end.max(s.start + 1)
}

/// Pushes onto `path` the keys down to the innermost one holding `offset`.
// Spans of array-of-tables items do not always cover their keys, so every item is
// searched by its keys rather than by its own span.
fn path_in_table<'a>(table: &'a DeTable<'_>, offset: usize, path: &mut Vec<&'a str>) -> bool {
    for (k, v) in table.iter() {
        let before = path.len();
        path.push(k.get_ref());
        if path_in_value(v, offset, path) || within(k.span(), offset) || within(v.span(), offset) {
            return true;
        }
        path.truncate(before);
    }
    false
}

fn path_in_value<'a>(v: &'a Spanned<DeValue<'_>>, offset: usize, path: &mut Vec<&'a str>) -> bool {
    match v.get_ref() {
        DeValue::Table(t) => path_in_table(t, offset, path),
        DeValue::Array(items) => items.iter().any(|i| path_in_value(i, offset, path)),
        _ => false,
    }
}

/// Deserializes `text` (read from `file`) into `T`, a failure as a [`ConfigError`]
/// naming the line and field (`default_field` when neither the message nor the
/// position names one).
pub fn from_toml<T: serde::de::DeserializeOwned>(
    text: &str,
    file: &str,
    default_field: &str,
) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| Positions::new(text, file).toml_error(&e, default_field))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
[server]
listen = \"x\"

[[group]]
name = \"a\"
weight = 1

[[group]]
name = \"b\"
weight = \"heavy\"

[health.thresholds]
# listen = \"a comment that a text search would have matched\"
sbe_per_hour = -1
";

    #[test]
    fn lines_come_from_the_parser() {
        let p = Positions::new(TEXT, "a.toml");
        assert_eq!(p.line("server.listen"), 2);
        assert_eq!(p.line("health.thresholds.sbe_per_hour"), 14);
        assert_eq!(p.line("group.1.weight"), 10);
        assert_eq!(p.line("group.0.name"), 5);
        // A missing key points at its section; nothing known is 0.
        assert_eq!(p.line("health.thresholds.nvlink_errors_per_hour"), 12);
        assert_eq!(p.line("policy.cooldown"), 0);
        assert_eq!(p.line_in_array("group", "name", "b"), 9);
        assert_eq!(p.line_in_array("group", "name", "c"), 0);
        let e = p.error("server.listen", "bad");
        assert_eq!(e.to_string(), "a.toml:2: server.listen: bad");
    }

    #[test]
    fn deserializer_errors_name_line_and_field() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct G {
            name: String,
            weight: f64,
        }
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Doc {
            group: Vec<G>,
        }
        let text =
            "[[group]]\nname = \"a\"\nweight = 1\n\n[[group]]\nname = \"b\"\nweight = \"heavy\"\n";
        let e = from_toml::<Doc>(text, "a.toml", "group").expect_err("type error");
        assert_eq!((e.line, e.field.as_str()), (7, "group.weight"), "{e}");
        let e = from_toml::<Doc>("[[group]]\nname = \"a\"\nwieght = 1\n", "a.toml", "group")
            .expect_err("unknown or missing field");
        assert!(e.line > 0, "{e}");
        let e = from_toml::<Doc>("[[group]\n", "a.toml", "group").expect_err("syntax");
        assert_eq!((e.line, e.field.as_str()), (1, "group"), "{e}");
    }

    #[test]
    fn an_unparsable_text_has_no_positions() {
        let p = Positions::new("a = [", "a.toml");
        assert_eq!(p.line("a"), 0);
        assert_eq!(p.line_in_array("a", "name", "x"), 0);
    }
}

#[cfg(test)]
mod reference_tests {
    use super::*;

    #[test]
    fn a_reference_misses_the_keys_it_has_no_row_for() {
        let refusal = ConfigError {
            file: "a.toml".into(),
            line: 2,
            field: "zz".into(),
            message: "unknown field `zz`, expected one of `listen`, `state_dir`".into(),
        };
        assert_eq!(refusal.accepted_keys(), ["listen", "state_dir"]);
        let doc =
            "## `[server]`\n\n| `listen` | string |\n\n## `[tls]`\n\n| `state_dir` | path |\n";
        assert_eq!(
            keys_missing_from_reference(doc, "server", &refusal),
            Ok(vec!["state_dir".to_string()])
        );
        assert!(keys_missing_from_reference(doc, "policy", &refusal).is_err());
    }
}
