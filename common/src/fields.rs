//! Caps on what one request may carry and the characters a name may hold: the
//! checks allotd and the agent run on every field from outside before it reaches
//! their state, a journal, a log line or an `exec`. A name with a newline forges log
//! lines; a megabyte argv is kept, journaled and sent to a host for every start.
//! Pure: each service picks which field gets which check (allotd's `limits.rs`,
//! the agent's API); the caps both services share are here so they cannot drift.

/// Most bytes of a name: user, project, group, node, cluster, class, label, GPU
/// UUID or PCI address.
pub const MAX_NAME: usize = 128;
/// Most bytes of a reason or other one-line text a person or an agent writes.
pub const MAX_REASON: usize = 1024;
/// Most bytes of a checkpoint hook spec.
pub const MAX_HOOK: usize = 4096;
/// Most arguments in one command line.
pub const MAX_ARGS: usize = 1024;
/// Most bytes of one argument.
pub const MAX_ARG: usize = 4096;
/// Most bytes of a whole command line (its arguments together).
pub const MAX_ARGV: usize = 64 * 1024;
/// Most bytes of one gRPC message a service decodes (tonic's default, made explicit:
/// a bigger one is refused with `OUT_OF_RANGE` before it is buffered whole).
pub const MAX_MESSAGE: usize = 4 * 1024 * 1024;

/// A field refused: which one, why, and the fix. Shown as `field: why; fix`, the
/// form every refusal of allotd and the agent takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// The field, as the wire names it (`argv[3]`, `register.host`).
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

fn refuse(field: &str, message: String) -> Result<(), FieldError> {
    Err(FieldError {
        field: field.to_string(),
        message,
    })
}

/// The value as an error message shows it: quoted and escaped, cut at 32
/// characters (the field may be megabytes; the message goes back in a header).
fn shown(value: &str) -> String {
    let mut cut: String = value.chars().take(32).collect();
    if cut.len() < value.len() {
        cut.push('…');
    }
    format!("{cut:?}")
}

/// What the character at fault is, in words.
fn what(c: char) -> String {
    match c {
        '\0' => "a NUL".into(),
        c if c.is_control() => format!("a control character (U+{:04X})", u32::from(c)),
        c => format!("{c:?}"),
    }
}

/// Whether `c` may appear in a name: ASCII letters and digits and `. _ @ -` (user
/// names as `useradd` and SSSD make them, host names, the org tree's groups).
pub fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '@' | '-')
}

/// A required name: 1 to `max` bytes of [`is_name_char`] characters.
pub fn check_name(field: &str, value: &str, max: usize) -> Result<(), FieldError> {
    check_name_with(field, value, max, "")
}

/// A required name that may also hold the characters of `extra` (`:` in a PCI
/// address, `/` in a MIG UUID or a label key).
pub fn check_name_with(
    field: &str,
    value: &str,
    max: usize,
    extra: &str,
) -> Result<(), FieldError> {
    let set = || {
        let mut s = String::from("letters, digits and . _ @ -");
        for c in extra.chars() {
            s.push(' ');
            s.push(c);
        }
        s
    };
    if value.is_empty() {
        return refuse(field, format!("empty; give a name of {}", set()));
    }
    if value.len() > max {
        return refuse(
            field,
            format!(
                "{} is {} bytes; the most is {max}: use a shorter name",
                shown(value),
                value.len()
            ),
        );
    }
    if let Some((i, c)) = value
        .char_indices()
        .find(|&(_, c)| !is_name_char(c) && !extra.contains(c))
    {
        return refuse(
            field,
            format!(
                "{} holds {} at byte {i}; a name is {} (at most {max} bytes)",
                shown(value),
                what(c),
                set()
            ),
        );
    }
    Ok(())
}

/// An optional name: empty, or as [`check_name`].
pub fn check_optional_name(field: &str, value: &str, max: usize) -> Result<(), FieldError> {
    if value.is_empty() {
        return Ok(());
    }
    check_name(field, value, max)
}

/// One line of text (a reason, an author, a model name): at most `max` bytes and no
/// control characters, NUL, newline and tab included (each would forge or break a
/// log line). May be empty.
pub fn check_text(field: &str, value: &str, max: usize) -> Result<(), FieldError> {
    check_len(field, value, max)?;
    if let Some((i, c)) = value.char_indices().find(|&(_, c)| c.is_control()) {
        return refuse(
            field,
            format!(
                "{} holds {} at byte {i}; write it on one line without control characters",
                shown(value),
                what(c)
            ),
        );
    }
    Ok(())
}

/// Text of at most `max` bytes, whatever it holds.
pub fn check_len(field: &str, value: &str, max: usize) -> Result<(), FieldError> {
    if value.len() > max {
        return refuse(
            field,
            format!(
                "{} is {} bytes; the most is {max}: shorten it",
                shown(value),
                value.len()
            ),
        );
    }
    Ok(())
}

/// A list of at most `max` entries; `what` names an entry in the message.
pub fn check_count(field: &str, n: usize, max: usize, what: &str) -> Result<(), FieldError> {
    if n > max {
        return refuse(field, format!("{n} {what}; the most is {max}"));
    }
    Ok(())
}

/// A command line: at most [`MAX_ARGS`] arguments of at most [`MAX_ARG`] bytes each
/// and [`MAX_ARGV`] in all; an argument may hold anything but NUL (which `execve`
/// cannot pass: the argument would be cut there).
pub fn check_argv(field: &str, argv: &[String]) -> Result<(), FieldError> {
    const FIX: &str = "pass long data in a file or a script and give its path";
    if argv.len() > MAX_ARGS {
        return refuse(
            field,
            format!("{} arguments; the most is {MAX_ARGS}: {FIX}", argv.len()),
        );
    }
    let mut total = 0usize;
    for (i, a) in argv.iter().enumerate() {
        let f = format!("{field}[{i}]");
        if a.len() > MAX_ARG {
            return refuse(
                &f,
                format!(
                    "{} is {} bytes; the most for one argument is {MAX_ARG}: {FIX}",
                    shown(a),
                    a.len()
                ),
            );
        }
        if let Some(at) = a.find('\0') {
            return refuse(
                &f,
                format!(
                    "{} holds a NUL at byte {at}, which no command line can pass; remove it",
                    shown(a)
                ),
            );
        }
        total += a.len();
    }
    if total > MAX_ARGV {
        return refuse(
            field,
            format!("{total} bytes in all; the most is {MAX_ARGV}: {FIX}"),
        );
    }
    Ok(())
}

/// Most variables in a submitted environment (`--export ALL` of a login shell holds
/// 30 to 100).
pub const MAX_ENV_VARS: usize = 1024;
/// Most bytes of a submitted environment, names and values together: allotd keeps
/// it with every pending workload and sends it with every start.
pub const MAX_ENV: usize = 64 * 1024;
/// Most bytes of a path (a working directory): Linux's `PATH_MAX`.
pub const MAX_PATH: usize = 4096;
/// Most bytes of a batch script (`allot submit job.sh`; sbatch's own default is 4 MB:
/// a script that large is data, not a script).
pub const MAX_SCRIPT: usize = 256 * 1024;

/// Most bytes of an output file pattern (`--output`, `--error`).
pub const MAX_PATTERN: usize = 1024;

/// Whether `name` is a portable environment variable name: a letter or `_`, then
/// letters, digits and `_` (what a shell can set and read back).
pub fn is_env_name(name: &str) -> bool {
    let mut c = name.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A submitted environment: at most [`MAX_ENV_VARS`] variables and [`MAX_ENV`] bytes
/// in all, each name portable ([`is_env_name`]) and given once, no value holding a
/// NUL (which `execve` cannot pass).
pub fn check_env<'a>(
    field: &str,
    vars: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<(), FieldError> {
    const FIX: &str =
        "export fewer variables (--export VAR,… or --export NONE with --env KEY=VALUE)";
    let mut seen = std::collections::BTreeSet::new();
    let mut total = 0usize;
    for (i, (name, value)) in vars.into_iter().enumerate() {
        let f = format!("{field}[{i}]");
        if i >= MAX_ENV_VARS {
            return refuse(field, format!("more than {MAX_ENV_VARS} variables: {FIX}"));
        }
        if !is_env_name(name) {
            return refuse(
                &format!("{f}.name"),
                format!(
                    "{} is not a variable name: use letters, digits and _, not starting with a digit",
                    shown(name)
                ),
            );
        }
        if !seen.insert(name) {
            return refuse(
                &format!("{f}.name"),
                format!("{name} is given twice; give each variable once"),
            );
        }
        if let Some(at) = value.find('\0') {
            return refuse(
                &format!("{f}.value"),
                format!("{name}'s value holds a NUL at byte {at}, which no environment can pass; remove it"),
            );
        }
        total += name.len() + value.len() + 2;
    }
    if total > MAX_ENV {
        return refuse(
            field,
            format!("{total} bytes in all; the most is {MAX_ENV}: {FIX}"),
        );
    }
    Ok(())
}

/// A working directory: empty (not given) or an absolute path of at most
/// [`MAX_PATH`] bytes on one line.
pub fn check_cwd(field: &str, value: &str) -> Result<(), FieldError> {
    if value.is_empty() {
        return Ok(());
    }
    check_text(field, value, MAX_PATH)?;
    if !value.starts_with('/') {
        return refuse(
            field,
            format!(
                "{} is not absolute; give the directory from / (the CLI makes --chdir absolute)",
                shown(value)
            ),
        );
    }
    Ok(())
}

/// An output pattern with the `%` escapes `fill` knows replaced; any other escape,
/// and a `%` at the end, kept as written (allotd fills `%x`, the agent the rest).
pub fn expand_pattern(pattern: &str, fill: impl Fn(char) -> Option<String>) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some(e) => match fill(e) {
                Some(v) => out.push_str(&v),
                None => {
                    out.push('%');
                    out.push(e);
                }
            },
            None => out.push('%'),
        }
    }
    out
}

/// An output file pattern (`--output`, `--error`): empty (the agent's default); a
/// file of the user's own, absolute or `./…` under the job's directory (the agent
/// opens it as the user); or a relative name of at most [`MAX_PATTERN`] bytes on one
/// line, with no `..` component (it names a file under the agent's log directory,
/// never elsewhere); `%` only in `%j` (workload), `%r` (run), `%n` (node rank), `%u` (user), `%x`
/// (job name), `%A`/`%a` (array id and index; allotd puts these three in before the
/// agent sees the pattern) and `%%`.
pub fn check_pattern(field: &str, value: &str) -> Result<(), FieldError> {
    if value.is_empty() {
        return Ok(());
    }
    check_text(field, value, MAX_PATTERN)?;
    // Absolute or `./…`: a file of the user's own, opened as the user on the host.
    let users_own = value.starts_with('/') || value.starts_with("./");
    if !users_own && value.split('/').any(|c| c == "..") {
        return refuse(
            field,
            format!(
                "{} climbs out with \"..\"; give a name under the node's log directory",
                shown(value)
            ),
        );
    }
    let mut chars = value.char_indices();
    while let Some((i, c)) = chars.next() {
        if c == '%'
            && !matches!(
                chars.next(),
                Some((_, 'j' | 'r' | 'n' | 'u' | 'x' | 'A' | 'a' | '%'))
            )
        {
            return refuse(
                field,
                format!(
                    "{} has an unknown % at byte {i}; use %j (workload), %r (run), %n (node rank), %u (user), %x (job name), %A (array id), %a (array index) or %% (a %)",
                    shown(value)
                ),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(r: Result<(), FieldError>) -> String {
        r.expect_err("refused").to_string()
    }

    #[test]
    fn names_of_today_pass() {
        for n in [
            "alice",
            "demo-a",
            "golf-speech",
            "node-12.cluster.example",
            "svc_train",
            "ana@corp.example",
            "ee9e8c",
        ] {
            assert_eq!(check_name("user", n, MAX_NAME), Ok(()), "{n}");
        }
        assert_eq!(
            check_name_with("pci", "00000000:3B:00.0", MAX_NAME, ":"),
            Ok(())
        );
        assert_eq!(
            check_name_with("uuid", "MIG-GPU-5c89852c/1/0", MAX_NAME, ":/"),
            Ok(())
        );
    }

    #[test]
    fn unsafe_names_are_refused_naming_the_field_and_the_character() {
        let m = message(check_name("user", "bob\nforged line", MAX_NAME));
        assert!(
            m.starts_with("user: ") && m.contains("U+000A") && m.contains("byte 3"),
            "{m}"
        );
        let m = message(check_name("project", "a\0b", MAX_NAME));
        assert!(m.starts_with("project: ") && m.contains("NUL"), "{m}");
        let m = message(check_name("user", "a b", MAX_NAME));
        assert!(m.contains("' '") && m.contains("letters, digits"), "{m}");
        let m = message(check_name("user", "", MAX_NAME));
        assert!(m.contains("empty"), "{m}");
        let m = message(check_name("pci", "0000:3b", MAX_NAME));
        assert!(m.contains("':'"), "{m}");
        assert_eq!(check_optional_name("class", "", MAX_NAME), Ok(()));
        assert!(check_optional_name("class", "a\tb", MAX_NAME).is_err());
    }

    #[test]
    fn lengths_are_capped_in_bytes_and_the_value_is_not_echoed_whole() {
        assert_eq!(check_name("user", &"a".repeat(128), MAX_NAME), Ok(()));
        let m = message(check_name("user", &"a".repeat(129), MAX_NAME));
        assert!(m.contains("129 bytes") && m.contains("128"), "{m}");
        // Multi-byte characters count as bytes: 43 × 3 = 129.
        let m = message(check_text("reason", &"€".repeat(43), 128));
        assert!(m.contains("129 bytes"), "{m}");
        let big = "x".repeat(1 << 20);
        let m = message(check_len("reason", &big, MAX_REASON));
        assert!(m.len() < 200, "{} bytes: {m}", m.len());
    }

    #[test]
    fn text_may_be_anything_on_one_line() {
        assert_eq!(
            check_text("reason", "reseat GPU 3 — ticket #42 (\"hot\")", MAX_REASON),
            Ok(())
        );
        assert_eq!(check_text("reason", "", MAX_REASON), Ok(()));
        let m = message(check_text("reason", "a\r\nb", MAX_REASON));
        assert!(m.contains("U+000D") && m.contains("one line"), "{m}");
    }

    #[test]
    fn argv_is_capped_per_argument_and_in_all() {
        let ok: Vec<String> = vec!["sh".into(), "-c".into(), "echo 'a\tb\n' | wc".into()];
        assert_eq!(check_argv("argv", &ok), Ok(()));
        let many = vec!["a".to_string(); MAX_ARGS + 1];
        let m = message(check_argv("argv", &many));
        assert!(
            m.starts_with("argv: 1025 arguments") && m.contains("1024"),
            "{m}"
        );
        assert_eq!(check_argv("argv", &many[..MAX_ARGS]), Ok(()));
        let long = vec!["a".to_string(), "b".repeat(MAX_ARG + 1)];
        let m = message(check_argv("argv", &long));
        assert!(
            m.starts_with("argv[1]: ") && m.contains("4097 bytes"),
            "{m}"
        );
        let nul = vec!["a".to_string(), "b\0c".into()];
        let m = message(check_argv("argv", &nul));
        assert!(m.starts_with("argv[1]: ") && m.contains("NUL"), "{m}");
        // 17 arguments of 4 KiB: each fits, together they do not.
        let total = vec!["c".repeat(MAX_ARG); 17];
        let m = message(check_argv("argv", &total));
        assert!(m.starts_with("argv: ") && m.contains("in all"), "{m}");
        assert_eq!(check_argv("argv", &total[..16]), Ok(()));
    }

    #[test]
    fn counts_are_capped() {
        assert_eq!(check_count("register.drains", 16, 16, "drains"), Ok(()));
        let m = message(check_count("register.drains", 17, 16, "drains"));
        assert_eq!(m, "register.drains: 17 drains; the most is 16");
    }

    #[test]
    fn environments_are_names_once_without_nul_and_capped() {
        let ok = [("PATH", "/usr/bin"), ("_X1", ""), ("LANG", "C.UTF-8")];
        assert_eq!(check_env("env", ok), Ok(()));
        for bad in ["1X", "A-B", "", "A=B", "BASH_FUNC_f%%"] {
            let m = message(check_env("env", [("A", "1"), (bad, "v")]));
            assert!(m.starts_with("env[1].name: "), "{m}");
        }
        let m = message(check_env("env", [("A", "1"), ("A", "2")]));
        assert!(m.contains("twice"), "{m}");
        let m = message(check_env("env", [("A", "x\0y")]));
        assert!(m.starts_with("env[0].value: ") && m.contains("NUL"), "{m}");
        let big = "v".repeat(MAX_ENV);
        let m = message(check_env("env", [("A", big.as_str())]));
        assert!(m.starts_with("env: ") && m.contains("--export NONE"), "{m}");
        let names: Vec<String> = (0..=MAX_ENV_VARS).map(|i| format!("V{i}")).collect();
        let m = message(check_env("env", names.iter().map(|n| (n.as_str(), ""))));
        assert!(m.contains("more than 1024"), "{m}");
    }

    #[test]
    fn working_directories_are_absolute_and_patterns_known() {
        assert_eq!(check_cwd("cwd", ""), Ok(()));
        assert_eq!(check_cwd("cwd", "/home/ana/run 1"), Ok(()));
        assert!(message(check_cwd("cwd", "home/ana")).contains("not absolute"));
        assert!(message(check_cwd("cwd", "/a\nb")).starts_with("cwd: "));
        assert!(check_cwd("cwd", &format!("/{}", "a".repeat(MAX_PATH))).is_err());
        for ok in [
            "",
            "out-%j-%r-%n.log",
            "logs/%j.err",
            "100%%.txt",
            "%u-%j.log",
            "%x-%j.out",
            "%A_%a.out",
            "/home/ana/logs/%x-%j.out",
            "./out/%j.log",
            "/shared/ana/../ana/x",
        ] {
            assert_eq!(check_pattern("output", ok), Ok(()), "{ok}");
        }
        assert!(message(check_pattern("output", "a/../../etc")).contains(".."));
        assert!(message(check_pattern("error", "x-%q")).starts_with("error: "));
        assert!(message(check_pattern("error", "x-%")).contains("unknown %"));
        assert!(check_pattern("output", &"a".repeat(MAX_PATTERN + 1)).is_err());
    }
}
