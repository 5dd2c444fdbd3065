//! Batch scripts (`allot submit job.sh`), as sbatch reads them: the directive lines
//! at the top (`#ALLOT` with allot's flags, `#SBATCH` with Slurm's), up to the first
//! line that is neither a comment nor blank, become flags placed *before* the
//! command line's, so the command line wins. `#SBATCH` flags allot shares with Slurm
//! are translated; any other is named in the refusal rather than ignored.

use allot_common::fields::MAX_SCRIPT;

/// A script read from disk: its text and the flags its directives stand for.
#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    /// The whole text, sent with the submission.
    pub text: String,
    /// allot flags from its `#ALLOT` and `#SBATCH` lines, in order.
    pub flags: Vec<String>,
}

/// Reads `path`: capped, text, with a `#!` line, and its directives.
pub fn read(path: &std::path::Path) -> Result<Script, String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("script {shown}: {e}"))?;
    if meta.len() > MAX_SCRIPT as u64 {
        return Err(format!(
            "script {shown}: {} bytes; a batch script is at most {MAX_SCRIPT} bytes",
            meta.len()
        ));
    }
    let bytes = std::fs::read(path).map_err(|e| format!("script {shown}: {e}"))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("script {shown}: not UTF-8 text; a batch script is text"))?;
    parse(&text).map_err(|e| format!("script {shown}: {e}"))
}

/// The directives of `text`.
pub fn parse(text: &str) -> Result<Script, String> {
    if !text.starts_with("#!") {
        return Err(
            "the first line is not #!INTERPRETER (#!/bin/bash); sbatch asks for one too".into(),
        );
    }
    let mut flags = Vec::new();
    let mut unknown = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        if !t.starts_with('#') {
            break;
        }
        let (slurm, rest) = if let Some(r) = t.strip_prefix("#ALLOT") {
            (false, r)
        } else if let Some(r) = t.strip_prefix("#SBATCH") {
            (true, r)
        } else {
            continue;
        };
        if !rest.is_empty() && !rest.starts_with(char::is_whitespace) {
            continue;
        }
        let words = shlex::split(rest)
            .ok_or_else(|| format!("line {}: unbalanced quotes in {t:?}", n + 1))?;
        if slurm {
            sbatch(&words, &mut flags, &mut unknown);
        } else {
            flags.extend(words);
        }
    }
    if !unknown.is_empty() {
        return Err(format!(
            "#SBATCH flags allot does not understand: {}; remove them, or write what you mean as #ALLOT lines (allot submit --help)",
            unknown.join(", ")
        ));
    }
    Ok(Script {
        text: text.to_string(),
        flags,
    })
}

/// Splits `--flag=value` and `-xVALUE`: (flag, value if attached).
fn split_flag(w: &str) -> (String, Option<String>) {
    if let Some(long) = w.strip_prefix("--") {
        return match long.split_once('=') {
            Some((f, v)) => (format!("--{f}"), Some(v.to_string())),
            None => (w.to_string(), None),
        };
    }
    if w.len() > 2 && w.starts_with('-') {
        let (f, v) = w.split_at(2);
        return (f.to_string(), Some(v.trim_start_matches('=').to_string()));
    }
    (w.to_string(), None)
}

/// One `#SBATCH` line's words as allot flags.
fn sbatch(words: &[String], flags: &mut Vec<String>, unknown: &mut Vec<String>) {
    let mut i = 0;
    while i < words.len() {
        let (flag, attached) = split_flag(&words[i]);
        i += 1;
        // Flags without a value.
        let bare = match flag.as_str() {
            "-H" | "--hold" => Some("--hold"),
            "--no-requeue" => Some("--no-requeue"),
            _ => None,
        };
        if let Some(b) = bare {
            flags.push(b.into());
            continue;
        }
        let mut value = || -> Option<String> {
            attached.clone().or_else(|| {
                let v = words.get(i).cloned();
                i += 1;
                v
            })
        };
        let to = match flag.as_str() {
            "-J" | "--job-name" => "--name",
            "-N" | "--nodes" => "--nodes",
            "-o" | "--output" => "--output",
            "-e" | "--error" => "--error",
            "-D" | "--chdir" => "--chdir",
            "-a" | "--array" => "--array",
            "-d" | "--dependency" => "--dependency",
            "-b" | "--begin" => "--begin",
            "-C" | "--constraint" => "--constraint",
            "-M" | "--clusters" => "--cluster",
            "-w" | "--nodelist" => "--nodelist",
            "-x" | "--exclude" => "--exclude",
            "-A" | "--account" => "--project",
            "-c" | "--cpus-per-task" => "--cpus",
            "--export" => "--export",
            "--mail-type" => {
                if let Some(v) = value() {
                    // END, FAIL, REQUEUE, TIME_LIMIT, ALL; BEGIN and the rest have
                    // no allot event and are named.
                    for t in v.split(',') {
                        let e = match t.trim().to_uppercase().as_str() {
                            "END" => "end",
                            "FAIL" => "fail",
                            "REQUEUE" => "preempt",
                            "TIME_LIMIT" => "time-limit",
                            "ALL" => "all",
                            "NONE" => continue,
                            other => {
                                unknown.push(format!("--mail-type={other}"));
                                continue;
                            }
                        };
                        flags.extend(["--notify".into(), e.to_string()]);
                    }
                }
                continue;
            }
            "--mail-user" => {
                // allotd mails the workload's user at the site's domain, no other.
                let _ = value();
                unknown.push("--mail-user (allot mails USER@the site's mail_domain)".into());
                continue;
            }
            "--signal" => "--signal",
            "-t" | "--time" => {
                if let Some(v) = value() {
                    flags.push("--time-limit".into());
                    // Slurm reads a bare number as minutes.
                    flags.push(if v.chars().all(|c| c.is_ascii_digit()) && v != "0" {
                        format!("{v}m")
                    } else {
                        v
                    });
                }
                continue;
            }
            "--mem" => {
                if let Some(v) = value() {
                    flags.push("--memory".into());
                    // Slurm reads a bare number as megabytes.
                    flags.push(if v.chars().all(|c| c.is_ascii_digit()) {
                        format!("{v}M")
                    } else {
                        v
                    });
                }
                continue;
            }
            "--gpus-per-node" | "--gres" => {
                if let Some(v) = value() {
                    // gpu:N, gpu:TYPE:N (--gres) or N, TYPE:N (--gpus-per-node).
                    let v = v.strip_prefix("gpu:").unwrap_or(&v).to_string();
                    match v.rsplit_once(':') {
                        Some((t, n)) => {
                            flags.extend(["--gpu-type".into(), t.to_string()]);
                            flags.extend(["--gpus".into(), n.to_string()]);
                        }
                        None => flags.extend(["--gpus".into(), v]),
                    }
                }
                continue;
            }
            _ => {
                unknown.push(flag.clone());
                if attached.is_none() && words.get(i).is_some_and(|w| !w.starts_with('-')) {
                    i += 1;
                }
                continue;
            }
        };
        if let Some(v) = value() {
            flags.push(to.into());
            flags.push(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_become_flags_until_the_first_command() {
        let s = parse(
            "#!/bin/bash\n#ALLOT --gpus 2 --name \"my job\"\n\n#SBATCH -t 90 --mem=4096\n#SBATCH --gres=gpu:h100:8 -N 2 -o out-%j.txt\n#SBATCH -w gpu[01-02] --exclude=gpu03\n# a comment\necho hi\n#ALLOT --nodes 9\n",
        )
        .expect("parses");
        assert_eq!(
            s.flags,
            [
                "--gpus",
                "2",
                "--name",
                "my job",
                "--time-limit",
                "90m",
                "--memory",
                "4096M",
                "--gpu-type",
                "h100",
                "--gpus",
                "8",
                "--nodes",
                "2",
                "--output",
                "out-%j.txt",
                "--nodelist",
                "gpu[01-02]",
                "--exclude",
                "gpu03"
            ]
        );
    }

    #[test]
    fn what_allot_does_not_understand_is_named() {
        let e = parse("#!/bin/sh\n#SBATCH --partition=gpu --qos high\n#SBATCH -J x\n")
            .expect_err("refused");
        assert!(e.contains("--partition, --qos"), "{e}");
        let e = parse("echo no shebang\n").expect_err("refused");
        assert!(e.contains("#!"), "{e}");
        let e = parse("#!/bin/sh\n#ALLOT --name \"open\n").expect_err("refused");
        assert!(e.contains("line 2"), "{e}");
    }
}
